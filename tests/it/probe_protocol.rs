//! `callid probe` and MCP 2026-07-28: a stateless client (hand-written JSON-RPC, no
//! `initialize`) discovers the probe with `server/discover` and calls its tool, over stdio and
//! streamable HTTP; `--legacy-handshake` forces the `initialize` fallback; every record carries
//! the protocol version the message was sent under.

use crate::common::probe::{
    capabilities, close_expecting_exit_0, logged_probe, read_records, spawn_probe, wait_for_records,
};
use callid::probe::record::{ClientInfoFrom, Record, Transport};
use serde_json::{Value, json};
use std::time::Duration;

const V2026: &str = "2026-07-28";

/// The per-request `_meta` keys of a 2026-07-28 client, plus `extra`.
fn inline_meta(extra: Value) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientInfo": {"name": "stateless-client", "version": "9.1.0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if let (Some(m), Value::Object(extra)) = (meta.as_object_mut(), extra) {
        m.extend(extra);
    }
    meta
}

fn methods(records: &[Record]) -> Vec<&str> {
    records.iter().filter_map(|r| r.method.as_deref()).collect()
}

/// A `server/discover` result per 2026-07-28 naming the probe.
fn assert_discover_result(result: &Value) {
    let versions: Vec<&str> = result["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions: {result}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(versions.contains(&V2026), "{result}");
    assert!(versions.contains(&"2025-11-25"), "{result}");
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        json!("callid-probe"),
        "{result}"
    );
    assert!(
        result["ttlMs"].is_u64() && result["cacheScope"].is_string(),
        "{result}"
    );
}

#[tokio::test]
async fn stdio_stateless_client_discovers_then_calls_without_initialize() {
    let (_dir, log, conn, mut child) = logged_probe("probe.log", &[]).await;
    let discover = conn
        .request(
            json!("discover-1"),
            "server/discover",
            json!({"_meta": inline_meta(json!({}))}),
        )
        .await
        .unwrap();
    assert_discover_result(
        discover
            .result
            .as_ref()
            .unwrap_or_else(|| panic!("{}", discover.raw)),
    );
    let tools = conn
        .request(
            json!(1),
            "tools/list",
            json!({"_meta": inline_meta(json!({}))}),
        )
        .await
        .unwrap();
    assert_eq!(
        tools.result.as_ref().unwrap()["tools"][0]["name"],
        json!("capabilities"),
        "{}",
        tools.raw
    );
    // The same call sent twice, the retry with a new JSON-RPC id as 2026-07-28 requires.
    let tool_use = json!({"claudecode/toolUseId": "toolu_01STATELESSSTATELESSSTAT"});
    for id in [2, 3] {
        let call = capabilities(&conn, json!(id), inline_meta(tool_use.clone())).await;
        assert_eq!(
            call.structured().unwrap()["identity"]["source"],
            json!("claudecode/toolUseId"),
            "{}",
            call.raw
        );
    }
    close_expecting_exit_0(&conn, &mut child).await;

    let records = read_records(&log);
    assert_eq!(
        methods(&records),
        ["server/discover", "tools/list", "tools/call", "tools/call"]
    );
    for r in &records {
        assert_eq!(r.protocol_version.as_deref(), Some(V2026), "{r:?}");
        let client = r.client.as_ref().unwrap();
        assert_eq!(
            (client.name.as_str(), client.from),
            ("stateless-client", ClientInfoFrom::Meta)
        );
        let keys: Vec<&str> = r.meta_shape().unwrap().top_level_keys().collect();
        assert!(
            keys.contains(&"/io.modelcontextprotocol~1protocolVersion"),
            "{keys:?}"
        );
        assert!(
            keys.contains(&"/io.modelcontextprotocol~1clientCapabilities"),
            "{keys:?}"
        );
    }
    // The retry: a new JSON-RPC id, the same call ID.
    let (first, retry) = (&records[2], &records[3]);
    assert_ne!(first.id, retry.id);
    let digest = |r: &Record| {
        r.meta_shape()
            .unwrap()
            .entries
            .iter()
            .find(|e| e.path == "/claudecode~1toolUseId")
            .map(|e| e.value.digest.clone())
    };
    assert!(digest(first).is_some());
    assert_eq!(digest(first), digest(retry));
}

#[tokio::test]
async fn stdio_legacy_handshake_forces_the_initialize_fallback() {
    let (_dir, log, conn, mut child) = logged_probe("probe.log", &["--legacy-handshake"]).await;
    let discover = conn
        .request(
            json!("d"),
            "server/discover",
            json!({"_meta": inline_meta(json!({}))}),
        )
        .await
        .unwrap();
    assert_eq!(
        discover.error.as_ref().unwrap()["code"],
        json!(-32601),
        "{}",
        discover.raw
    );
    // A request that declares 2026-07-28 is refused: the legacy probe does not speak it.
    let stateless = capabilities(&conn, json!(1), inline_meta(json!({}))).await;
    assert!(stateless.error.is_some(), "{}", stateless.raw);
    assert!(stateless.raw.contains(V2026), "{}", stateless.raw);
    let init = conn
        .initialize(json!(2), "2025-11-25", "legacy-client", "1.0.0")
        .await
        .unwrap();
    assert_eq!(
        init.result.as_ref().unwrap()["protocolVersion"],
        json!("2025-11-25")
    );
    let call = capabilities(&conn, json!(3), json!({"callId": "call_legacy"})).await;
    assert_eq!(
        call.structured().unwrap()["identity"]["verdict"],
        json!("accepted")
    );
    close_expecting_exit_0(&conn, &mut child).await;

    let records = read_records(&log);
    assert_eq!(
        methods(&records),
        [
            "server/discover",
            "tools/call",
            "initialize",
            "notifications/initialized",
            "tools/call"
        ]
    );
    let versions: Vec<Option<&str>> = records
        .iter()
        .map(|r| r.protocol_version.as_deref())
        .collect();
    assert_eq!(
        versions,
        [
            Some(V2026),
            Some(V2026),
            Some("2025-11-25"),
            Some("2025-11-25"),
            Some("2025-11-25")
        ]
    );
}

/// POSTs one 2026-07-28 request (no session, the standard headers) and returns the JSON-RPC
/// reply, read from a JSON or an SSE body.
async fn post_stateless(url: &str, method: &str, id: Value, params: Value) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V2026)
        .header("mcp-method", method);
    if method == "tools/call" {
        request = request.header("mcp-name", params["name"].as_str().unwrap());
    }
    let reply = request.body(body.to_string()).send().await.unwrap();
    let status = reply.status().as_u16();
    assert!(
        reply.headers().get("mcp-session-id").is_none(),
        "stateless: no session"
    );
    let text = reply.text().await.unwrap();
    let message = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .chain(std::iter::once(text.trim()))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|m| m.get("id") == Some(&id))
        .unwrap_or_else(|| panic!("no reply to {method} in {status}: {text}"));
    (status, message)
}

#[tokio::test]
async fn http_stateless_client_discovers_then_calls_and_legacy_refuses_discover() {
    let (_dir, log, _stdin, mut child) = logged_probe("http.log", &["--http", "127.0.0.1:0"]).await;
    let url = callid::testing::http_url(&child).await.unwrap();
    let (status, discover) = post_stateless(
        &url,
        "server/discover",
        json!("d-1"),
        json!({"_meta": inline_meta(json!({}))}),
    )
    .await;
    assert_eq!(status, 200, "{discover}");
    assert_discover_result(&discover["result"]);
    let (_, call) = post_stateless(
        &url,
        "tools/call",
        json!(7),
        json!({"name": "capabilities", "arguments": {},
               "_meta": inline_meta(json!({"callId": "call_httpstateless"}))}),
    )
    .await;
    assert_eq!(
        call["result"]["structuredContent"]["identity"]["source"],
        json!("callId"),
        "{call}"
    );
    let records = wait_for_records(&log, 2).await;
    child.kill9().await.unwrap();
    assert_eq!(methods(&records), ["server/discover", "tools/call"]);
    for r in &records {
        assert_eq!(r.transport, Transport::Http);
        assert_eq!(r.protocol_version.as_deref(), Some(V2026), "{r:?}");
        assert_eq!(r.client.as_ref().unwrap().name, "stateless-client");
    }

    let (_stdin, mut legacy) =
        spawn_probe(&["probe", "--legacy-handshake", "--http", "127.0.0.1:0"]).await;
    let url = callid::testing::http_url(&legacy).await.unwrap();
    let (_, refused) = post_stateless(
        &url,
        "server/discover",
        json!("d-2"),
        json!({"_meta": inline_meta(json!({}))}),
    )
    .await;
    assert_eq!(refused["error"]["code"], json!(-32601), "{refused}");
    legacy.kill9().await.unwrap();
}

/// Threads that keep every core busy until dropped, as other programs do on a busy machine.
struct BusyMachine {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyMachine {
    /// `per_core` spinning threads for each core.
    fn start(per_core: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..cores * per_core)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyMachine { stop, threads }
    }
}

impl Drop for BusyMachine {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The log stays complete in normal operation, on a busy machine too: 10,000 calls (16 in
/// flight, so the writer has work queued while replies go out), beside three spinning threads
/// per core, make 10,000 `tools/call` records, and nothing is reported dropped. (A writer that
/// gave its core away after every record dropped 4,601 of them beside six busy loops.)
#[tokio::test]
async fn ten_thousand_calls_make_ten_thousand_records() {
    let (_dir, log, conn, mut child) = logged_probe("probe.log", &[]).await;
    let busy = BusyMachine::start(3);
    conn.initialize(json!(0), "2025-11-25", "bulk-client", "1.0.0")
        .await
        .unwrap();
    const CALLS: u64 = 10_000;
    const IN_FLIGHT: u64 = 16;
    let mut next = 1;
    while next <= CALLS {
        let batch: Vec<_> = (next..(next + IN_FLIGHT).min(CALLS + 1))
            .map(|id| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    conn.call_tool(
                        json!(id),
                        "capabilities",
                        json!({}),
                        Some(json!({"callId": format!("call_{id:024}"), "progressToken": id})),
                    )
                    .await
                })
            })
            .collect();
        for call in batch {
            let r = call.await.unwrap().unwrap();
            assert!(r.result.is_some(), "{}", r.raw);
        }
        next += IN_FLIGHT;
    }
    conn.close().await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    drop(busy);
    let stderr = child.stderr_text();
    assert!(!stderr.contains("dropped"), "{stderr}");
    let records = read_records(&log);
    let calls: Vec<&Record> = records
        .iter()
        .filter(|r| r.method.as_deref() == Some("tools/call"))
        .collect();
    assert_eq!(calls.len() as u64, CALLS);
    let ids: std::collections::HashSet<&str> = calls
        .iter()
        .map(|r| r.id.as_ref().unwrap().digest.as_str())
        .collect();
    assert_eq!(ids.len() as u64, CALLS, "one record per call, none twice");
    assert!(calls.iter().all(|r| r.request_digest.is_some()));
}

/// Over HTTP the probe runs until it is stopped: SIGTERM writes the queued records and exits 0.
#[cfg(unix)]
#[tokio::test]
async fn http_probe_writes_every_record_before_exiting_on_sigterm() {
    let (_dir, log, _stdin, mut child) = logged_probe("http.log", &["--http", "127.0.0.1:0"]).await;
    let url = callid::testing::http_url(&child).await.unwrap();
    for id in 1..=50 {
        let (_, call) = post_stateless(
            &url,
            "tools/call",
            json!(id),
            json!({"name": "capabilities", "arguments": {},
                   "_meta": inline_meta(json!({"callId": format!("call_{id}")}))}),
        )
        .await;
        assert!(call["result"].is_object(), "{call}");
    }
    let pid = child.pid().unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", child.stderr_text());
    let records = read_records(&log);
    assert_eq!(records.len(), 50);
}
