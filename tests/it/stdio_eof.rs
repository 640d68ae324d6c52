//! A stdio client that writes its calls and closes its side at once (`printf '...' | callid
//! router`) gets an answer to every call: a server still running calls when its stdin ends
//! answers each of them before it exits, however long they take. The real binary, a real
//! provider (held longer than rmcp's own 5-second drain on input end) and a real paid upstream.

use crate::common::mcp::codex;
use crate::common::{bin, provider, repo};
use callid::provider::{HookAction, ProviderHooks};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long every spend takes at the far end: past rmcp's 5-second wait for running handlers
/// once its input has ended, after which it used to drop their answers.
const SLOW: Duration = Duration::from_secs(7);

/// Calls written before stdin is closed.
const CALLS: usize = 6;

/// Holds every charge for [`SLOW`].
struct Slow;

impl ProviderHooks for Slow {
    fn before_charge(&self, _key: &str) -> HookAction {
        HookAction::Hold(SLOW)
    }
}

/// `initialize`, `notifications/initialized`, then `calls` as `tools/call` requests with ids
/// 1, 2, ..., one JSON-RPC message a line.
fn script(calls: &[(String, Value, Value)]) -> String {
    let mut lines = vec![
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "callid-tests", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for (i, (tool, args, meta)) in calls.iter().enumerate() {
        lines.push(
            json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args, "_meta": meta}}),
        );
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Runs `callid ARGS` in `dir` with `input` on stdin, closed once written, and returns every
/// JSON-RPC response on its stdout by id, its exit success and its stderr.
async fn pipe_through(dir: &Path, args: &[String], input: String) -> (Vec<Value>, bool, String) {
    let mut child = tokio::process::Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env("CALLID_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let ended = tokio::time::timeout(Duration::from_secs(120), async {
        let (a, b) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        a.unwrap();
        b.unwrap();
        child.wait().await.unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("the server did not end within 120 s"));
    let responses = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("id").is_some())
        .collect();
    (responses, ended.success(), err)
}

/// The id of every response, in order.
fn ids(responses: &[Value]) -> Vec<u64> {
    let mut ids: Vec<u64> = responses
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn the_router_answers_every_call_read_before_stdin_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("provider-ledger.sqlite3");
    let provider = provider::spawn(&ledger, Some(Arc::new(Slow))).await;
    let calls: Vec<_> = (1..=CALLS)
        .map(|i| {
            let args = json!({"prompt": format!("an origami fox {i}")});
            (
                "generate_image".to_string(),
                args,
                codex(&format!("call-{i}")),
            )
        })
        .collect();
    let args: Vec<String> = [
        "router",
        "--registry",
        &dir.path().join("registry.sqlite3").display().to_string(),
        "--provider-url",
        &format!("http://{}", provider.addr()),
    ]
    .map(String::from)
    .to_vec();
    let (responses, success, stderr) = pipe_through(dir.path(), &args, script(&calls)).await;
    assert_eq!(
        ids(&responses),
        (0..=CALLS as u64).collect::<Vec<_>>(),
        "a reply is missing:\n{stderr}"
    );
    for r in &responses[1..] {
        let result = &r["result"];
        assert_eq!(result["isError"], json!(null), "{r}");
        assert_eq!(result["structuredContent"]["status"], "completed", "{r}");
    }
    assert!(success, "{stderr}");
    assert_eq!(provider::charge_count(&ledger), CALLS as u64);
}

#[tokio::test]
async fn the_gateway_answers_every_call_read_before_stdin_closed() {
    let dir = tempfile::tempdir().unwrap();
    let charges = dir.path().join("charges.jsonl");
    let calls: Vec<_> = (1..=CALLS)
        .map(|i| {
            let args = json!({"amount_cents": 1, "seconds": SLOW.as_secs()});
            ("pay".to_string(), args, codex(&format!("call-{i}")))
        })
        .collect();
    let args: Vec<String> = [
        "gateway",
        "--registry",
        &dir.path().join("gateway.sqlite3").display().to_string(),
        "--spend",
        "pay",
        "--",
        "python3",
        &repo()
            .join("tests/fixtures/paid_upstream.py")
            .display()
            .to_string(),
        "--charges",
        &charges.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let (responses, success, stderr) = pipe_through(dir.path(), &args, script(&calls)).await;
    assert_eq!(
        ids(&responses),
        (0..=CALLS as u64).collect::<Vec<_>>(),
        "a reply is missing:\n{stderr}"
    );
    for r in &responses[1..] {
        assert_eq!(r["result"]["isError"], json!(null), "{r}");
        assert!(r["result"]["structuredContent"]["charge"].is_u64(), "{r}");
    }
    assert!(success, "{stderr}");
}
