//! `callid gateway` relays what its upstream sends on its own: progress under the agent's token,
//! log messages, list changes (and lists the tools again, checked), the agent's cancellation and
//! `logging/setLevel` going up. A dead upstream is replaced at the next request; progress never
//! reaches a request it does not belong to (after an upstream restart too), and no agent session
//! delays another's answers over `--http`. The upstream is `tests/fixtures/chatty_upstream.py`, a
//! plain JSON-RPC server (no MCP SDK) that logs what reached it.

use crate::common::mcp::{codex, next_id, spawn_http};
use crate::common::{bin, repo};
use callid::jsonrpc::{Child, Connection};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Relayed {
    conn: Connection,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// `callid gateway ... EXTRA --spend charge -- chatty_upstream.py --log LOG`, with its registry
/// and log in `dir`.
pub(super) fn gateway_args(dir: &Path, log: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "gateway".into(),
        "--registry".into(),
        dir.join("gateway.sqlite3").display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend([
        "--spend".into(),
        "charge".into(),
        "--".into(),
        "python3".into(),
        repo()
            .join("tests/fixtures/chatty_upstream.py")
            .display()
            .to_string(),
        "--log".into(),
        log.display().to_string(),
    ]);
    args
}

/// What the upstream logged in `log`, oldest first.
pub(super) fn upstream_log(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The values under `key` of the entries the upstream logged, oldest first.
fn logged(log: &Path, key: &str) -> Vec<Value> {
    upstream_log(log)
        .into_iter()
        .filter_map(|mut e| e.get_mut(key).map(Value::take))
        .collect()
}

async fn start() -> Relayed {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("upstream.jsonl");
    let args = gateway_args(dir.path(), &log, &[]);
    let (conn, child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    let init = conn
        .initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
    let caps = &init.result.as_ref().expect("initialize answered")["capabilities"];
    assert!(
        caps.get("logging").is_some(),
        "logging not advertised: {caps}"
    );
    assert_eq!(caps["tools"]["listChanged"], json!(true), "{caps}");
    Relayed {
        conn,
        child,
        log,
        _dir: dir,
    }
}

impl Relayed {
    /// Notifications the agent received so far, as JSON, oldest first.
    fn notifications(&self) -> Vec<Value> {
        self.conn
            .take_unmatched()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m.get("method").is_some() && m.get("id").is_none())
            .collect()
    }

    /// Waits (at most 10 s) until the agent received `n` notifications matching `pick`.
    async fn wait_for(&self, n: usize, pick: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            seen.extend(self.notifications().into_iter().filter(|m| pick(m)));
            if seen.len() >= n || Instant::now() > deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the upstream logged, oldest first.
    fn upstream_log(&self) -> Vec<Value> {
        upstream_log(&self.log)
    }

    /// Waits (at most 10 s) until the upstream logged an entry with key `key`.
    async fn wait_upstream(&self, key: &str) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(entry) = self
                .upstream_log()
                .into_iter()
                .find(|e| e.get(key).is_some())
            {
                return Some(entry[key].clone());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    async fn tools(&self) -> Value {
        self.conn
            .request(json!("tools"), "tools/list", json!({}))
            .await
            .unwrap()
            .raw
            .parse::<Value>()
            .unwrap()
    }

    async fn stop(mut self) {
        let _ = self.child.kill9().await;
    }
}

#[tokio::test]
async fn progress_comes_back_under_the_agents_token_and_log_messages_reach_the_agent() {
    let gw = start().await;
    let r = gw
        .conn
        .call_tool(
            json!(1),
            "count",
            json!({"n": 3}),
            Some(json!({"progressToken": "agent-token-7"})),
        )
        .await
        .unwrap();
    assert_eq!(r.structured(), Some(&json!({"counted": 3})), "{}", r.raw);
    // Already here when the answer is: progress after a request's answer is worth nothing.
    let before_answer = gw.notifications();
    let tokens: Vec<(&Value, &Value)> = before_answer
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| (&m["params"]["progressToken"], &m["params"]["progress"]))
        .collect();
    let agent = json!("agent-token-7");
    assert_eq!(
        tokens,
        vec![
            (&agent, &json!(1.0)),
            (&agent, &json!(2.0)),
            (&agent, &json!(3.0))
        ],
        "the agent must see the upstream's progress under its own token, before the answer: \
         {before_answer:?}"
    );
    let mut progress = before_answer.clone();
    if !progress
        .iter()
        .any(|m| m["method"] == "notifications/message")
    {
        progress.extend(
            gw.wait_for(1, |m| m["method"] == "notifications/message")
                .await,
        );
    }
    let logs: Vec<&Value> = progress
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| &m["params"]["data"])
        .collect();
    assert_eq!(logs, vec![&json!("counted")], "{progress:?}");
    // The upstream saw rmcp's own token, not the agent's: the mapping is what carried it back.
    let upstream_token = gw.wait_upstream("count").await.unwrap();
    assert_ne!(upstream_token["progressToken"], agent);
    gw.stop().await;
}

#[tokio::test]
async fn a_call_without_a_progress_token_gets_no_progress() {
    let gw = start().await;
    let r = gw
        .conn
        .call_tool(json!(1), "count", json!({"n": 2}), None)
        .await
        .unwrap();
    assert_eq!(r.structured(), Some(&json!({"counted": 2})), "{}", r.raw);
    // The log message comes after the progress in the upstream's stream: once it is here, any
    // progress would be too.
    let seen = gw
        .wait_for(1, |m| m["method"] == "notifications/message")
        .await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let progress: Vec<Value> = gw
        .notifications()
        .into_iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(progress.is_empty(), "{progress:?}");
    gw.stop().await;
}

#[tokio::test]
async fn the_agents_cancellation_and_log_level_reach_the_upstream() {
    let gw = start().await;
    let r = gw
        .conn
        .request(json!("lvl"), "logging/setLevel", json!({"level": "debug"}))
        .await
        .unwrap();
    assert!(r.result.is_some(), "{}", r.raw);
    assert_eq!(gw.wait_upstream("setLevel").await, Some(json!("debug")));

    let conn = gw.conn.clone();
    let slow = tokio::spawn(async move {
        conn.call_tool(json!("slow-1"), "slow", json!({}), None)
            .await
    });
    let upstream_id = gw
        .wait_upstream("slow")
        .await
        .expect("the slow call reached the upstream")["id"]
        .clone();
    gw.conn
        .notify(
            "notifications/cancelled",
            json!({"requestId": "slow-1", "reason": "the user pressed stop"}),
        )
        .await
        .unwrap();
    assert_eq!(
        gw.wait_upstream("cancelled").await,
        Some(upstream_id),
        "the upstream must be told to cancel its request: {:?}",
        gw.upstream_log()
    );
    slow.abort();
    gw.stop().await;
}

#[tokio::test]
async fn a_changed_tool_list_is_relayed_and_listed_again_with_the_start_up_checks() {
    let gw = start().await;
    let names = |list: &Value| -> Vec<String> {
        list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(!names(&gw.tools().await).contains(&"extra".to_string()));
    gw.conn
        .call_tool(json!(1), "grow", json!({}), None)
        .await
        .unwrap();
    let changed = gw
        .wait_for(1, |m| m["method"] == "notifications/tools/list_changed")
        .await;
    assert_eq!(changed.len(), 1);
    let listed = names(&gw.tools().await);
    assert!(listed.contains(&"extra".to_string()), "{listed:?}");
    assert!(
        listed.contains(&"operation_status".to_string()),
        "{listed:?}"
    );

    // The upstream now exposes an identity-like field on the spend tool: refused, named.
    gw.conn
        .call_tool(json!(2), "poison", json!({}), None)
        .await
        .unwrap();
    gw.wait_for(1, |m| m["method"] == "notifications/tools/list_changed")
        .await;
    let refused = gw.tools().await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("charge") && message.contains("call_id"),
        "the re-listed tools must be refused naming the tool and field: {refused}"
    );
    // Still refused on the next request: the check is not a one-off.
    assert!(gw.tools().await.get("error").is_some());
    gw.stop().await;
}

/// `callid gateway --http` in front of the chatty upstream: the MCP URL, the process (killed when
/// dropped), the upstream's log, and the directory holding both.
pub(super) async fn start_http(
    extra: &[&str],
) -> (String, tokio::process::Child, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("upstream.jsonl");
    let mut with_http = vec!["--http", "127.0.0.1:0"];
    with_http.extend_from_slice(extra);
    let args = gateway_args(dir.path(), &log, &with_http);
    let (url, child) = spawn_http(&args, "callid gateway", Duration::from_secs(30)).await;
    (url, child, log, dir)
}

/// A new agent session on the gateway at `url`, initialized.
async fn session(url: &str) -> Connection {
    let c = Connection::http(url).await.unwrap();
    c.initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap();
    c
}

/// The progress notifications `conn` received so far, as JSON.
fn progress_of(conn: &Connection) -> Vec<Value> {
    conn.take_unmatched()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["method"] == "notifications/progress")
        .collect()
}

#[tokio::test]
async fn progress_of_a_spend_call_reaches_no_later_request_after_the_upstream_restarts() {
    let (url, _gateway, log, _dir) = start_http(&[]).await;
    let a = session(&url).await;
    let paid = a
        .call_tool(
            next_id(),
            "charge",
            json!({"prompt": "fox"}),
            Some(codex("restart-1")),
        )
        .await
        .unwrap();
    assert!(!paid.is_tool_error(), "{}", paid.raw);
    // The upstream sent progress for the spend under its connection's token.
    let spend_token = logged(&log, "charge")[0]["progressToken"].clone();
    assert!(!spend_token.is_null(), "{:?}", upstream_log(&log));
    // The upstream dies; the next request starts a new one, whose progress tokens start again.
    let died = a
        .call_tool(next_id(), "exit", json!({}), None)
        .await
        .unwrap();
    assert!(died.error.is_some(), "{}", died.raw);

    // Another session's requests on the new connection, until one gets the spend's old token.
    let b = session(&url).await;
    let mut reused = false;
    let mut seen = Vec::new();
    for i in 0..8 {
        let token = format!("b-{i}");
        let r = b
            .call_tool(
                next_id(),
                "count",
                json!({"n": 1}),
                Some(json!({"progressToken": token})),
            )
            .await
            .unwrap();
        assert_eq!(r.structured(), Some(&json!({"counted": 1})), "{}", r.raw);
        let progress = progress_of(&b);
        seen.extend(progress.iter().cloned());
        let tokens: Vec<&Value> = progress
            .iter()
            .map(|m| &m["params"]["progressToken"])
            .collect();
        assert_eq!(
            tokens,
            vec![&json!(token)],
            "a request gets its own progress and nothing else: {progress:?}"
        );
        let upstream_token = logged(&log, "count").last().unwrap()["progressToken"].clone();
        if upstream_token == spend_token {
            reused = true;
            break;
        }
    }
    assert!(
        reused,
        "the new connection never reused the spend's token {spend_token}: {:?}",
        upstream_log(&log)
    );
    assert!(
        !seen.iter().any(|m| m["params"]["message"] == "charge"),
        "the spend's progress reached another session: {seen:?}"
    );
    assert!(progress_of(&a).is_empty());
}

/// An agent session made by hand over HTTP, for what [`Connection`] does not do: a stream left
/// unread, the session's own GET stream.
struct RawSession {
    client: reqwest::Client,
    url: String,
    id: String,
}

impl RawSession {
    /// Initializes a new session on the gateway at `url`.
    async fn open(url: &str) -> RawSession {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let init = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "by-hand", "version": "1"}}})
                .to_string(),
            )
            .send()
            .await
            .unwrap();
        let id = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        init.text().await.unwrap();
        let session = RawSession {
            client,
            url: url.to_string(),
            id,
        };
        let initialized = session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(initialized.status().is_success());
        session
    }

    async fn post(&self, message: Value) -> reqwest::Response {
        self.client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-06-18")
            .body(message.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Opens the session's GET stream and collects the `data` of its events, as they come.
    async fn listen(&self) -> std::sync::Arc<std::sync::Mutex<Vec<Value>>> {
        let mut stream = self
            .client
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .unwrap();
        assert!(stream.status().is_success(), "{}", stream.status());
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        tokio::spawn(async move {
            let mut buffer = String::new();
            while let Ok(Some(chunk)) = stream.chunk().await {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(newline) = buffer.find('\n') {
                    let line: String = buffer.drain(..=newline).collect();
                    if let Some(data) = line.trim_end().strip_prefix("data:")
                        && let Ok(message) = serde_json::from_str(data.trim())
                    {
                        seen.lock().unwrap().push(message);
                    }
                }
            }
        });
        events
    }

    /// Sends a raw HTTP request of this session (`GET`, or `POST` of `body`) on a new socket and
    /// reads no more of the answer than its head, if `head`: the open socket, never read again.
    async fn never_read(&self, body: Option<Value>, head: bool) -> tokio::net::TcpStream {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let host = self
            .url
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .unwrap();
        let (method, accept, body) = match body {
            Some(body) => (
                "POST",
                "application/json, text/event-stream",
                body.to_string(),
            ),
            None => ("GET", "text/event-stream", String::new()),
        };
        let mut socket = tokio::net::TcpStream::connect(host).await.unwrap();
        let request = format!(
            "{method} /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Accept: {accept}\r\nMcp-Session-Id: {}\r\nMcp-Protocol-Version: 2025-06-18\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.id,
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        while head && !received.ends_with(b"\r\n\r\n") {
            received.push(socket.read_u8().await.unwrap());
        }
        assert!(
            !head || received.starts_with(b"HTTP/1.1 200"),
            "{received:?}"
        );
        socket
    }
}

#[tokio::test]
async fn a_session_that_does_not_read_its_stream_delays_no_other_sessions_paid_answer() {
    let (url, _gateway, log, _dir) = start_http(&["--upstream-timeout", "30"]).await;
    // Session A asks for far more progress than the buffers between the gateway and A hold
    // (16 MB), and never reads it.
    let a = RawSession::open(&url).await;
    let _unread = a
        .never_read(
            Some(
                json!({"jsonrpc": "2.0", "id": "flood", "method": "tools/call", "params": {
                "name": "flood", "arguments": {"n": 4000, "size": 4096},
                "_meta": {"progressToken": "a-flood"}}}),
            ),
            false,
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while logged(&log, "flood").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the flood never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Session B's paid call is answered after the flood (the upstream answers in order), well
    // within the upstream timeout.
    let mut b = session(&url).await;
    b.set_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let paid = b
        .call_tool(
            next_id(),
            "charge",
            json!({"prompt": "fox"}),
            Some(codex("slow-a-1")),
        )
        .await
        .unwrap_or_else(|e| panic!("session B's paid call: {e}"));
    assert!(!paid.is_tool_error(), "{}", paid.raw);
    assert_eq!(
        paid.structured(),
        Some(&json!({"ok": true})),
        "{}",
        paid.raw
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        logged(&log, "charge").len(),
        1,
        "{:?}",
        logged(&log, "charge")
    );
}

#[tokio::test]
async fn after_the_upstream_dies_the_next_request_reaches_a_new_one_and_a_spend_is_sent_once() {
    let gw = start().await;
    let died = gw
        .conn
        .call_tool(json!("exit"), "exit", json!({}), None)
        .await
        .unwrap();
    assert!(died.error.is_some(), "{}", died.raw);
    // Nothing was sent on the dead connection: the spend reaches a new upstream and is answered.
    let paid = gw
        .conn
        .call_tool(
            json!(1),
            "charge",
            json!({"prompt": "fox"}),
            Some(codex("after-exit-1")),
        )
        .await
        .unwrap();
    assert_eq!(
        paid.structured(),
        Some(&json!({"ok": true})),
        "{}",
        paid.raw
    );
    assert_eq!(logged(&gw.log, "charge").len(), 1);
    let counted = gw
        .conn
        .call_tool(json!(2), "count", json!({"n": 1}), None)
        .await
        .unwrap();
    assert_eq!(
        counted.structured(),
        Some(&json!({"counted": 1})),
        "{}",
        counted.raw
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_session_that_does_not_read_its_stream_delays_no_other_sessions_log_messages() {
    let (url, _gateway, _log, _dir) = start_http(&[]).await;
    // Session A opens its stream of messages that answer no request, and never reads it.
    let a = RawSession::open(&url).await;
    let _unread = a.never_read(None, true).await;
    let b = RawSession::open(&url).await;
    let events = b.listen().await;
    // 200 log messages of 64 KiB, far more than the buffers between the gateway and A hold,
    // then "shouted".
    let shout = b
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "shout", "arguments": {"n": 200, "size": 65536}}}),
        )
        .await;
    let answer = shout.text().await.unwrap();
    assert!(answer.contains("shouted"), "{answer}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let is_last =
        |m: &Value| m["method"] == "notifications/message" && m["params"]["data"] == "shouted";
    while !events.lock().unwrap().iter().any(is_last) {
        assert!(
            Instant::now() < deadline,
            "session B got {} of the 201 log messages",
            events.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logs = events
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .count();
    assert_eq!(logs, 201, "a session that reads loses none");
}
