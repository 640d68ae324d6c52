//! One MCP server process under test (`callid router`, `callid gateway`, a wrapper script) seen
//! from the agent's side, and the readers of its replies. Every reply and the process's log are
//! scanned for the private key prefix: a test that goes through [`Served`] cannot forget it.

use callid::jsonrpc::{Child, Connection, Response, RpcError};
use serde_json::{Value, json};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The prefix of a private operation key: no reply and no log may contain it.
pub const KEY_PREFIX: &str = "hubu:operation:v1:";
/// The prefix of the public handle a spend reply names.
pub const HANDLE_PREFIX: &str = "hubu:public-operation:v1:";

static RPC_ID: AtomicU64 = AtomicU64::new(1000);

/// A JSON-RPC id no other request of this test binary uses (the tests' own literal ids are
/// below 1000).
pub fn next_id() -> Value {
    json!(RPC_ID.fetch_add(1, Ordering::Relaxed))
}

/// `strings` as owned arguments.
pub fn owned(strings: &[&str]) -> Vec<String> {
    strings.iter().map(|s| s.to_string()).collect()
}

/// `base` then `more` as an owned environment.
pub fn env_of(base: &[(&str, &str)], more: &[(&str, &str)]) -> Vec<(String, String)> {
    base.iter()
        .chain(more)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A started and initialized MCP server on stdio.
pub struct Served {
    pub conn: Connection,
    pub child: Child,
    /// What the server is, for failure messages ("the router", "the gateway").
    label: &'static str,
}

impl Served {
    /// Starts `program args` with `env`, sets the per-request `timeout` when given, and
    /// initializes the MCP session; panics with the server's stderr when it does not answer.
    pub async fn start(
        label: &'static str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        timeout: Option<Duration>,
    ) -> Served {
        Served::start_in(label, program, args, env, timeout, false).await
    }

    /// [`start`](Self::start), with the server leading a new process group (its pid is the
    /// group's id) when `own_group`, so that everything it starts can be found and ended.
    pub async fn start_in(
        label: &'static str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        timeout: Option<Duration>,
        own_group: bool,
    ) -> Served {
        let (mut conn, child) = Connection::spawn_stdio_in(program, args, env, own_group)
            .await
            .unwrap();
        if let Some(timeout) = timeout {
            conn.set_timeout(timeout);
        }
        let init = conn
            .initialize(json!(0), "2025-06-18", "callid-tests", "1")
            .await
            .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
        assert!(init.result.is_some(), "initialize failed: {}", init.raw);
        Served { conn, child, label }
    }

    /// Calls `tool`; panics with the server's stderr when there is no answer, and when the answer
    /// holds a private key.
    pub async fn call(&self, tool: &str, args: Value, meta: Option<Value>) -> Response {
        let r = self
            .conn
            .call_tool(next_id(), tool, args, meta)
            .await
            .unwrap_or_else(|e| panic!("{tool} failed: {e}\n{}", self.child.stderr_text()));
        assert_clean(&r);
        r
    }

    /// Calls the paid tool `generate_image`.
    pub async fn spend(&self, args: Value, meta: Value) -> Response {
        self.call("generate_image", args, Some(meta)).await
    }

    /// Delivers the paid call `fox()` with `meta` until it is settled (see [`until_settled`]).
    pub async fn spend_until_settled(&self, meta: Value, limit: Duration) -> (Response, Duration) {
        until_settled(limit, || self.spend(fox(), meta.clone())).await
    }

    /// Spends `fox()` with `meta` on a server set to crash before it answers: the connection
    /// must close without an answer and the server must exit unsuccessfully (`what` names the
    /// case in failure messages).
    pub async fn spend_and_die(&mut self, meta: Value, what: &str) {
        let err = self
            .conn
            .call_tool(next_id(), "generate_image", fox(), Some(meta))
            .await;
        assert!(
            matches!(err, Err(RpcError::Closed { .. })),
            "{what}: {} should have died, got {err:?}",
            self.label
        );
        let status = self.child.wait().await.unwrap();
        assert!(!status.success(), "{what}: {status:?}");
    }

    /// Kills the server (SIGKILL) and returns its log, which must not show a private key.
    pub async fn stop(mut self) -> String {
        let _ = self.child.kill9().await;
        let stderr = self.child.stderr_text();
        assert!(
            !stderr.contains(KEY_PREFIX),
            "{}'s log shows a private key:\n{stderr}",
            self.label
        );
        stderr
    }
}

/// No byte of any response may contain a private key.
pub fn assert_clean(r: &Response) {
    assert!(
        !r.raw.contains(KEY_PREFIX),
        "a response leaked a private key: {}",
        r.raw
    );
}

/// Redelivers (`deliver`) until the answer is not `operation_in_progress` (another replica's
/// dispatch is live: retry shortly), for at most `limit`; returns the answer and how long it took.
pub async fn until_settled<F, Fut>(limit: Duration, mut deliver: F) -> (Response, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Response>,
{
    let start = Instant::now();
    loop {
        let r = deliver().await;
        if r.is_tool_error() && code(&r) == "operation_in_progress" {
            assert!(
                start.elapsed() < limit,
                "still in progress after {} s: {}",
                limit.as_secs(),
                r.raw
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        return (r, start.elapsed());
    }
}

/// Sends `n` spends of `fox()` at once, the `i`-th on `conns[i % conns.len()]` with `meta(i)`;
/// the replies in the order sent.
pub async fn concurrent_spends(
    conns: &[Connection],
    n: usize,
    meta: impl Fn(usize) -> Value,
) -> Vec<Response> {
    let mut tasks = vec![];
    for i in 0..n {
        let conn = conns[i % conns.len()].clone();
        let meta = meta(i);
        tasks.push(tokio::spawn(async move {
            conn.call_tool(next_id(), "generate_image", fox(), Some(meta))
                .await
                .unwrap()
        }));
    }
    let mut replies = vec![];
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    replies
}

/// How many of `replies` succeeded; every other one must be refused with `budget_exceeded`.
pub fn paid_within_budget(replies: &[Response]) -> usize {
    let mut ok = 0;
    for r in replies {
        if r.is_tool_error() {
            assert_eq!(code(r), "budget_exceeded", "{}", r.raw);
        } else {
            ok += 1;
        }
    }
    ok
}

/// The arguments of the reference paid call.
pub fn fox() -> Value {
    json!({"prompt": "an origami fox"})
}

/// Codex's `_meta` on a tool call: its call id and a progress token.
pub fn codex(id: &str) -> Value {
    json!({"callId": id, "progressToken": 7})
}

/// Codex's `_meta` inside a ChatGPT session: [`codex`] plus `openai/session`.
pub fn codex_in_session(id: &str) -> Value {
    json!({"callId": id, "openai/session": "sess-1", "progressToken": 7})
}

/// The tool error code of `r`, which must be a tool error.
pub fn code(r: &Response) -> &str {
    assert!(r.is_tool_error(), "expected a tool error, got {}", r.raw);
    r.structured().unwrap()["error"].as_str().unwrap()
}

/// The `_meta` of a tool result.
pub fn meta(r: &Response) -> &Value {
    &r.tool_result().unwrap()["_meta"]
}

/// Whether the server marked `r` as a replay; panics when it says neither.
pub fn replayed(r: &Response) -> bool {
    meta(r)["callid/replayed"]
        .as_bool()
        .unwrap_or_else(|| panic!("no callid/replayed in {}", r.raw))
}

/// Whether the server marked `r` as a replay; unmarked counts as not.
pub fn replayed_or_not(r: &Response) -> bool {
    meta(r)["callid/replayed"].as_bool().unwrap_or(false)
}

/// The handle `r` names: in `_meta` (a gateway) or the structured reply (a router's error).
pub fn handle(r: &Response) -> String {
    meta(r)["callid/handle"]
        .as_str()
        .or_else(|| r.structured().and_then(|s| s["handle"].as_str()))
        .unwrap_or_else(|| panic!("no handle in {}", r.raw))
        .to_string()
}

/// The handle in the structured reply.
pub fn structured_handle(r: &Response) -> String {
    r.structured().unwrap()["handle"]
        .as_str()
        .unwrap_or_else(|| panic!("no handle in {}", r.raw))
        .to_string()
}

/// A router's completed spend: the structured reply, which must say `completed`.
pub fn completed(r: &Response) -> &Value {
    assert!(!r.is_tool_error(), "expected success, got {}", r.raw);
    let s = r.structured().unwrap();
    assert_eq!(s["status"], "completed", "{}", r.raw);
    s
}

/// The upstream's receipt in a gateway's successful spend reply.
pub fn receipt(r: &Response) -> Value {
    assert!(!r.is_tool_error(), "expected success, got {}", r.raw);
    let s = r.structured().unwrap().clone();
    assert!(s["charge_id"].as_str().is_some(), "{}", r.raw);
    s
}

/// The arguments of `callid gateway` (on `registry` when given, else on what the environment
/// names) with `generate_image` as its spend tool, declared idempotent, and `extra` flags, in
/// front of `callid provider --mcp` on the ledger at `ledger`.
pub fn gateway_args(registry: Option<&Path>, extra: &[&str], ledger: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec!["gateway".into()];
    if let Some(registry) = registry {
        args.extend(["--registry".into(), registry.display().to_string()]);
    }
    // `callid provider --mcp` answers a repeated idempotency key with the first receipt.
    args.extend(owned(&[
        "--spend",
        "generate_image",
        "--idempotent",
        "generate_image",
    ]));
    args.extend(owned(extra));
    args.extend([
        "--".into(),
        super::bin().display().to_string(),
        "provider".into(),
        "--mcp".into(),
        "--ledger".into(),
        ledger.display().to_string(),
    ]);
    args
}

/// Starts `callid ARGS` as a streamable HTTP server and waits (at most `timeout`) for its
/// `<name>: listening on URL` line on stderr: the URL and the process (killed when dropped; the
/// rest of its stderr is read and dropped).
pub async fn spawn_http(
    args: &[String],
    name: &str,
    timeout: Duration,
) -> (String, tokio::process::Child) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(super::bin())
        .args(args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let prefix = format!("{name}: listening on ");
    let url = tokio::time::timeout(timeout, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix(&prefix) {
                return rest.trim().to_string();
            }
        }
        panic!("{name} exited before listening");
    })
    .await
    .unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (url, child)
}

/// Of replies to deliveries of one call on several replicas: the answered ones. Each must be
/// free of private keys, and an unanswered one may only say another replica holds the dispatch.
pub fn answered_or_in_progress(replies: Vec<Response>) -> Vec<Response> {
    let mut answered = vec![];
    for r in replies {
        assert!(!r.raw.contains(KEY_PREFIX), "{}", r.raw);
        if r.is_tool_error() {
            // Another replica held the dispatch: safe to retry.
            assert_eq!(code(&r), "operation_in_progress", "{}", r.raw);
        } else {
            answered.push(r);
        }
    }
    answered
}

/// A pause point of a server under test ([`callid::testing::crashpoint::PAUSE_ENV`]): the server stops at
/// a boundary until the gate file exists, and creates `<gate>.reached` when it gets there.
pub struct Gate {
    path: PathBuf,
    /// The value of the pause variable.
    pub pause: String,
}

impl Gate {
    /// A gate at `path` for the boundary named `boundary`.
    pub fn new(path: PathBuf, boundary: &str) -> Gate {
        let pause = format!("{boundary}:{}", path.display());
        Gate { path, pause }
    }

    /// The environment variable that sets the pause point.
    pub fn env(&self) -> (&'static str, &str) {
        (callid::testing::crashpoint::PAUSE_ENV, &self.pause)
    }

    /// Waits (at most 60 s) until the server has reached the pause point.
    pub async fn reached(&self) {
        let mut reached = self.path.clone().into_os_string();
        reached.push(".reached");
        let reached = PathBuf::from(reached);
        tokio::time::timeout(Duration::from_secs(60), async {
            while !reached.exists() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("`{}` never appeared", reached.display()));
    }

    /// Lets the paused server go on.
    pub fn open(&self) {
        std::fs::write(&self.path, b"").unwrap();
    }
}

/// Sends the spend `fox()` with `meta` on `conn` from a task of its own (for a server that will
/// pause or die before it answers).
pub fn spend_in_background(
    conn: &Connection,
    meta: Value,
) -> tokio::task::JoinHandle<Result<Response, RpcError>> {
    let conn = conn.clone();
    tokio::spawn(async move {
        conn.call_tool(next_id(), "generate_image", fox(), Some(meta))
            .await
    })
}
