//! Integration tests of `callid gateway` in front of `callid provider --mcp`: the real binary as
//! both processes, real SQLite files, the hand-written JSON-RPC client on the agent side. Every
//! response is scanned for the private key prefix.

use crate::common::bin;
use callid::jsonrpc::{Child, Connection, Response, RpcError};
use callid::provider::Ledger;
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const KEY_PREFIX: &str = "hubu:operation:v1:";
const HANDLE_PREFIX: &str = "hubu:public-operation:v1:";

static RPC_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> Value {
    json!(RPC_ID.fetch_add(1, Ordering::Relaxed))
}

struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        World {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn registry(&self) -> PathBuf {
        self.path("gateway.sqlite3")
    }

    fn ledger(&self) -> PathBuf {
        self.path("ledger.sqlite3")
    }

    fn charges(&self) -> Vec<callid::provider::ChargeRecord> {
        if !self.ledger().exists() {
            return vec![];
        }
        Ledger::open(&self.ledger()).unwrap().charges().unwrap()
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "gateway".into(),
            "--registry".into(),
            self.registry().display().to_string(),
            "--spend".into(),
            "generate_image".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([
            "--".into(),
            bin().display().to_string(),
            "provider".into(),
            "--mcp".into(),
            "--ledger".into(),
            self.ledger().display().to_string(),
        ]);
        args
    }

    /// Starts a gateway in front of `callid provider --mcp` and initializes it.
    async fn gateway(&self, extra: &[&str], envs: &[(&str, &str)]) -> Gw {
        let mut env: Vec<(String, String)> = vec![("CALLID_LOG".into(), "debug".into())];
        env.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let (conn, child) = Connection::spawn_stdio(&bin(), &self.args(extra), &env)
            .await
            .unwrap();
        let init = conn
            .initialize(json!(0), "2025-06-18", "callid-tests", "1")
            .await
            .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
        assert!(init.result.is_some(), "initialize failed: {}", init.raw);
        Gw { conn, child }
    }
}

struct Gw {
    conn: Connection,
    child: Child,
}

impl Gw {
    async fn call(&self, tool: &str, args: Value, meta: Option<Value>) -> Response {
        let r = self
            .conn
            .call_tool(next_id(), tool, args, meta)
            .await
            .unwrap_or_else(|e| panic!("{tool} failed: {e}\n{}", self.child.stderr_text()));
        assert_clean(&r);
        r
    }

    async fn spend(&self, args: Value, meta: Value) -> Response {
        self.call("generate_image", args, Some(meta)).await
    }

    async fn stop(mut self) -> String {
        let _ = self.child.kill9().await;
        let stderr = self.child.stderr_text();
        assert!(
            !stderr.contains(KEY_PREFIX),
            "the gateway's log shows a private key:\n{stderr}"
        );
        stderr
    }
}

fn assert_clean(r: &Response) {
    assert!(
        !r.raw.contains(KEY_PREFIX),
        "a response leaked a private key: {}",
        r.raw
    );
}

fn codex(id: &str) -> Value {
    json!({"callId": id, "progressToken": 7})
}

fn fox() -> Value {
    json!({"prompt": "an origami fox"})
}

fn meta(r: &Response) -> &Value {
    &r.tool_result().unwrap()["_meta"]
}

fn replayed(r: &Response) -> bool {
    meta(r)["callid/replayed"]
        .as_bool()
        .unwrap_or_else(|| panic!("no callid/replayed in {}", r.raw))
}

fn handle(r: &Response) -> String {
    let h = meta(r)["callid/handle"]
        .as_str()
        .or_else(|| r.structured().and_then(|s| s["handle"].as_str()))
        .unwrap_or_else(|| panic!("no handle in {}", r.raw))
        .to_string();
    assert!(h.starts_with(HANDLE_PREFIX), "{h}");
    h
}

fn code(r: &Response) -> &str {
    assert!(r.is_tool_error(), "expected a tool error, got {}", r.raw);
    r.structured().unwrap()["error"].as_str().unwrap()
}

/// The upstream's receipt in a successful spend reply.
fn receipt(r: &Response) -> Value {
    assert!(!r.is_tool_error(), "expected success, got {}", r.raw);
    let s = r.structured().unwrap().clone();
    assert!(s["charge_id"].as_str().is_some(), "{}", r.raw);
    s
}

fn registry_handle(registry: &Path, call_id: &str) -> Option<String> {
    use rusqlite::OptionalExtension as _;
    rusqlite::Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT handle FROM operations WHERE harness_call_id = ?1",
            [call_id],
            |r| r.get(0),
        )
        .optional()
        .unwrap()
}

#[tokio::test]
async fn tools_list_is_the_upstreams_plus_status_and_resume() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    let list = g
        .conn
        .request(next_id(), "tools/list", json!({}))
        .await
        .unwrap();
    let tools = list.result.as_ref().unwrap()["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "generate_image",
            "list_charges",
            "operation_status",
            "resume_operation"
        ]
    );
    let upstream: Vec<Value> = callid::provider::mcp::tools()
        .into_iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    assert_eq!(tools[0]["inputSchema"], upstream[0]["inputSchema"]);
    assert_eq!(tools[0]["description"], upstream[0]["description"]);
    g.stop().await;
}

#[tokio::test]
async fn a_spend_is_charged_once_and_redelivery_replays_without_the_upstream() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    let first = g.spend(fox(), codex("call_1")).await;
    let r1 = receipt(&first);
    assert!(!replayed(&first));
    let h = handle(&first);
    assert_eq!(w.charges().len(), 1);
    assert_eq!(r1["charge_id"], json!(w.charges()[0].charge_id));
    let key = w.charges()[0].idempotency_key.clone();
    assert!(key.starts_with("callid-idem-v1-"), "{key}");

    // Redelivered with a new JSON-RPC id: the recorded result, not an upstream replay.
    let again = g.spend(fox(), codex("call_1")).await;
    assert_eq!(receipt(&again), r1);
    assert!(replayed(&again));
    assert_eq!(handle(&again), h);
    assert!(
        meta(&again).get("callid-provider/replayed").is_none(),
        "the upstream was called again: {}",
        again.raw
    );
    assert_eq!(w.charges().len(), 1);

    // Same arguments, new call id: a second operation with a different idempotency key.
    let second = g.spend(fox(), codex("call_2")).await;
    assert_ne!(receipt(&second)["charge_id"], r1["charge_id"]);
    assert_ne!(handle(&second), h);
    let charges = w.charges();
    assert_eq!(charges.len(), 2);
    assert_ne!(charges[1].idempotency_key, key);

    // The status tool knows the operation and its recorded result.
    let status = g.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(status.structured().unwrap()["status"], "completed");
    assert_eq!(
        status.structured().unwrap()["result"]["structuredContent"],
        r1
    );
    g.stop().await;

    // After a restart on the same registry, still the recorded result.
    let g = w.gateway(&[], &[]).await;
    let later = g.spend(fox(), codex("call_1")).await;
    assert_eq!(receipt(&later), r1);
    assert!(replayed(&later));
    assert_eq!(w.charges().len(), 2);
    g.stop().await;
}

#[tokio::test]
async fn the_pipeline_refuses_before_the_upstream() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    let first = g.spend(fox(), codex("call_r")).await;
    let h = handle(&first);
    let other = g
        .spend(json!({"prompt": "a paper crane"}), codex("call_r"))
        .await;
    assert_eq!(code(&other), "request_mismatch");
    assert_eq!(other.structured().unwrap()["handle"], json!(h));
    let none = g.call("generate_image", fox(), None).await;
    assert_eq!(code(&none), "missing_identity");
    let session_only = g
        .call(
            "generate_image",
            fox(),
            Some(json!({"openai/session": "s"})),
        )
        .await;
    assert_eq!(code(&session_only), "missing_identity");
    let in_args = g
        .spend(json!({"prompt": "fox", "call_id": "mine"}), codex("call_x"))
        .await;
    assert_eq!(code(&in_args), "identity_in_arguments");
    let two = g
        .call(
            "generate_image",
            fox(),
            Some(json!({"callId": "a", "claudecode/toolUseId": "b"})),
        )
        .await;
    assert_eq!(code(&two), "ambiguous_identity");
    assert_eq!(w.charges().len(), 1);
    assert_eq!(registry_handle(&w.registry(), "call_x"), None);
    g.stop().await;
}

#[tokio::test]
async fn other_requests_pass_through_without_identity() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    receipt(&g.spend(fox(), codex("call_p")).await);
    let list = g.call("list_charges", json!({}), None).await;
    assert!(!list.is_tool_error(), "{}", list.raw);
    assert_eq!(list.structured().unwrap()["count"], 1);
    assert!(
        meta(&list).is_null(),
        "a pass-through is not marked: {}",
        list.raw
    );
    let resources = g
        .conn
        .request(next_id(), "resources/list", json!({}))
        .await
        .unwrap();
    assert_eq!(
        resources.result.as_ref().unwrap()["resources"][0]["uri"],
        "callid-provider://charges",
        "{}",
        resources.raw
    );
    let read = g
        .conn
        .request(
            next_id(),
            "resources/read",
            json!({"uri": "callid-provider://charges"}),
        )
        .await
        .unwrap();
    let text = read.result.as_ref().unwrap()["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", read.raw));
    assert_eq!(serde_json::from_str::<Value>(text).unwrap()["count"], 1);
    // An upstream JSON-RPC error comes back as it is.
    let missing = g
        .conn
        .request(next_id(), "resources/read", json!({"uri": "nope://x"}))
        .await
        .unwrap();
    assert!(
        missing.raw.contains("callid-provider://charges"),
        "{}",
        missing.raw
    );
    // A tool neither side has is the upstream's error.
    let unknown = g
        .conn
        .call_tool(next_id(), "nope", json!({}), None)
        .await
        .unwrap();
    assert!(
        unknown.raw.contains("unknown tool `nope`"),
        "{}",
        unknown.raw
    );
    assert_eq!(w.charges().len(), 1);
    g.stop().await;
}

#[tokio::test]
async fn an_upstream_tool_error_is_recorded_and_replayed() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    let args = json!({"prompt": "fox", "model": "no-such-model"});
    let first = g.spend(args.clone(), codex("call_e")).await;
    assert_eq!(code(&first), "unknown_model");
    assert!(!replayed(&first));
    let again = g.spend(args, codex("call_e")).await;
    assert_eq!(again.structured(), first.structured());
    assert!(replayed(&again));
    assert_eq!(handle(&again), handle(&first));
    assert_eq!(w.charges().len(), 0);
    g.stop().await;
}

#[tokio::test]
async fn start_up_refuses_an_unknown_spend_tool_and_a_name_clash() {
    let w = World::new();
    let out = std::process::Command::new(bin())
        .args(["gateway", "--registry"])
        .arg(w.registry())
        .args(["--spend", "buy_car", "--", &bin().display().to_string()])
        .args(["provider", "--mcp", "--ledger"])
        .arg(w.ledger())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`--spend buy_car`") && stderr.contains("`generate_image`"),
        "{stderr}"
    );
    // The built-in router already has `operation_status`.
    let out = std::process::Command::new(bin())
        .args(["gateway", "--registry"])
        .arg(w.registry())
        .args([
            "--spend",
            "generate_image",
            "--",
            &bin().display().to_string(),
        ])
        .args(["router", "--registry"])
        .arg(w.path("router.sqlite3"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("already has a tool named `operation_status`"),
        "{stderr}"
    );
    assert!(w.charges().is_empty());
}

#[tokio::test]
async fn an_upstream_that_dies_mid_call_leaves_the_operation_open() {
    let w = World::new();
    // The upstream (the gateway's child inherits the variable) kills itself right after it
    // committed a new charge, before it answers.
    let g = w
        .gateway(
            &[],
            &[(
                callid::testing::crashpoint::ENV,
                Boundary::AfterProviderCharge.name(),
            )],
        )
        .await;
    let first = g.spend(fox(), codex("call_d")).await;
    assert_eq!(code(&first), "outcome_unknown", "{}", first.raw);
    let text = first.structured().unwrap()["message"].as_str().unwrap();
    assert!(text.contains("Redeliver this same call"), "{text}");
    let h = handle(&first);
    assert_eq!(w.charges().len(), 1);
    let status = g.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(status.structured().unwrap()["status"], "pending");
    // Redelivery reaches a new upstream with the same key: the original charge.
    let again = g.spend(fox(), codex("call_d")).await;
    let r = receipt(&again);
    assert_eq!(handle(&again), h);
    assert_eq!(w.charges().len(), 1);
    assert_eq!(r["charge_id"], json!(w.charges()[0].charge_id));
    assert_eq!(meta(&again)["callid-provider/replayed"], true);
    g.stop().await;
}

#[tokio::test]
async fn an_upstream_timeout_leaves_the_operation_open() {
    let w = World::new();
    let gate = w.path("gate");
    let pause = format!(
        "{}:{}",
        Boundary::AfterProviderCharge.name(),
        gate.display()
    );
    let g = w
        .gateway(
            &["--upstream-timeout", "1"],
            &[(callid::testing::crashpoint::PAUSE_ENV, &pause)],
        )
        .await;
    let first = g.spend(fox(), codex("call_t")).await;
    assert_eq!(code(&first), "outcome_unknown", "{}", first.raw);
    assert!(first.raw.contains("within 1 seconds"), "{}", first.raw);
    std::fs::write(&gate, b"").unwrap();
    let again = g.spend(fox(), codex("call_t")).await;
    assert_eq!(
        receipt(&again)["charge_id"],
        json!(w.charges()[0].charge_id)
    );
    assert_eq!(handle(&again), handle(&first));
    assert_eq!(w.charges().len(), 1);
    g.stop().await;
}

#[tokio::test]
async fn a_crash_at_any_boundary_never_charges_twice() {
    for boundary in [
        Boundary::AfterRowCommit,
        Boundary::BeforeResultRecorded,
        Boundary::BeforeReply,
    ] {
        let label = boundary.name();
        let w = World::new();
        let mut g = w
            .gateway(&[], &[(callid::testing::crashpoint::ENV, boundary.name())])
            .await;
        let err = g
            .conn
            .call_tool(next_id(), "generate_image", fox(), Some(codex("crash")))
            .await;
        assert!(
            matches!(err, Err(RpcError::Closed { .. })),
            "{label}: the gateway should have died, got {err:?}"
        );
        let status = g.child.wait().await.unwrap();
        assert!(!status.success(), "{label}: {status:?}");
        let before = registry_handle(&w.registry(), "crash");
        assert!(before.is_some(), "{label}: the row is committed first");
        assert!(w.charges().len() <= 1, "{label}");

        let g = w.gateway(&[], &[]).await;
        let again = g.spend(fox(), codex("crash")).await;
        let r = receipt(&again);
        assert_eq!(Some(handle(&again)), before, "{label}: same handle");
        assert_eq!(w.charges().len(), 1, "{label}: one charge");
        assert_eq!(r["charge_id"], json!(w.charges()[0].charge_id), "{label}");
        assert_eq!(
            replayed(&again),
            boundary == Boundary::BeforeReply,
            "{label}"
        );
        let third = g.spend(fox(), codex("crash")).await;
        assert_eq!(receipt(&third), r, "{label}");
        assert!(replayed(&third), "{label}");
        g.stop().await;
    }
}

#[tokio::test]
async fn a_gateway_killed_while_the_upstream_works_charges_once() {
    let w = World::new();
    let gate = w.path("gate");
    let mut reached = gate.clone().into_os_string();
    reached.push(".reached");
    let pause = format!(
        "{}:{}",
        Boundary::AfterProviderCharge.name(),
        gate.display()
    );
    let mut g = w
        .gateway(&[], &[(callid::testing::crashpoint::PAUSE_ENV, &pause)])
        .await;
    let conn = g.conn.clone();
    let call = tokio::spawn(async move {
        conn.call_tool(next_id(), "generate_image", fox(), Some(codex("busy")))
            .await
    });
    while !Path::new(&reached).exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    g.child.kill9().await.unwrap();
    g.child.wait().await.unwrap();
    assert!(call.await.unwrap().is_err());
    std::fs::write(&gate, b"").unwrap();
    let before = registry_handle(&w.registry(), "busy");
    assert!(before.is_some());
    assert_eq!(w.charges().len(), 1);

    let g = w.gateway(&[], &[]).await;
    let again = g.spend(fox(), codex("busy")).await;
    assert_eq!(Some(handle(&again)), before);
    assert_eq!(
        receipt(&again)["charge_id"],
        json!(w.charges()[0].charge_id)
    );
    assert_eq!(w.charges().len(), 1);
    g.stop().await;
}

#[tokio::test]
async fn an_http_upstream_gets_the_derived_key_and_not_the_identity() {
    let w = World::new();
    let args: Vec<String> = ["probe", "--http", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (_probe_stdin, mut probe) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    let url = callid::testing::http_url(&probe).await.unwrap();
    let gw_args: Vec<String> = vec![
        "gateway".into(),
        "--registry".into(),
        w.registry().display().to_string(),
        "--spend".into(),
        "capabilities".into(),
        "--upstream-url".into(),
        url,
    ];
    let (conn, child) = Connection::spawn_stdio(&bin(), &gw_args, &[])
        .await
        .unwrap();
    conn.initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
    let g = Gw { conn, child };
    let first = g
        .call("capabilities", json!({}), Some(codex("call_h")))
        .await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    let keys: Vec<&str> = first.structured().unwrap()["meta_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"callid/idempotency-key"), "{keys:?}");
    assert!(!keys.contains(&"callId"), "{keys:?}");
    // The upstream saw no identity: the probe's verdict on its own `_meta`.
    assert_eq!(
        first.structured().unwrap()["identity"]["verdict"],
        "rejected",
        "{}",
        first.raw
    );
    let again = g
        .call("capabilities", json!({}), Some(codex("call_h")))
        .await;
    assert!(replayed(&again));
    assert_eq!(again.structured(), first.structured());
    g.stop().await;
    probe.kill9().await.unwrap();
}

#[tokio::test]
async fn a_policy_prices_calls_and_enforces_its_budget() {
    let w = World::new();
    let policy = w.path("policy.yaml");
    std::fs::write(
        &policy,
        "budget_cents: 8\ntools:\n  generate_image:\n    price_cents: 3\n",
    )
    .unwrap();
    let g = w
        .gateway(&["--policy", policy.to_str().unwrap()], &[])
        .await;
    let first = g.spend(fox(), codex("b1")).await;
    receipt(&first);
    // An upstream tool error charged nothing, and so holds none of the budget: without that,
    // `b2` would take the total to 9 cents.
    let refused = g
        .spend(json!({"prompt": "fox", "model": "nope"}), codex("e1"))
        .await;
    assert_eq!(code(&refused), "unknown_model");
    receipt(&g.spend(fox(), codex("b2")).await);
    let third = g.spend(fox(), codex("b3")).await;
    assert_eq!(code(&third), "budget_exceeded");
    assert!(
        third.raw.contains("only 2 of the 8-cent budget"),
        "{}",
        third.raw
    );
    assert_eq!(registry_handle(&w.registry(), "b3"), None);
    // A redelivery of a recorded call is not a new spend.
    assert!(replayed(&g.spend(fox(), codex("b1")).await));
    assert_eq!(w.charges().len(), 2);
    g.stop().await;
}

#[tokio::test]
async fn a_policy_price_from_the_arguments_and_approvals() {
    let w = World::new();
    let policy = w.path("policy.yaml");
    std::fs::write(
        &policy,
        "approval_above_cents: 1000\ntools:\n  generate_image:\n    price_pointer: /width\n",
    )
    .unwrap();
    let g = w
        .gateway(&["--policy", policy.to_str().unwrap()], &[])
        .await;
    let cheap = g
        .spend(json!({"prompt": "fox", "width": 512}), codex("a1"))
        .await;
    receipt(&cheap);
    let bad = g
        .spend(json!({"prompt": "fox", "width": "wide"}), codex("a2"))
        .await;
    assert_eq!(code(&bad), "invalid_arguments");
    assert!(bad.raw.contains("`/width`"), "{}", bad.raw);

    let big = json!({"prompt": "fox", "width": 2048});
    let waiting = g.spend(big.clone(), codex("a3")).await;
    assert_eq!(code(&waiting), "awaiting_approval");
    assert!(waiting.raw.contains("(2048 cents)"), "{}", waiting.raw);
    let h = waiting.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    let hint = format!(
        "callid router approve {h} --registry {}",
        w.registry().display()
    );
    assert!(waiting.raw.contains(&hint), "{}", waiting.raw);
    assert_eq!(w.charges().len(), 1);
    // Redelivery never skips the approval.
    assert_eq!(
        code(&g.spend(big.clone(), codex("a3")).await),
        "awaiting_approval"
    );
    let out = std::process::Command::new(bin())
        .args(["router", "approve", "--registry"])
        .arg(w.registry())
        .arg(&h)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed = g.call("resume_operation", json!({"handle": h}), None).await;
    let r = receipt(&resumed);
    assert_eq!(w.charges().len(), 2);
    let again = g.spend(big, codex("a3")).await;
    assert_eq!(receipt(&again), r);
    assert!(replayed(&again));

    let denied = g
        .spend(json!({"prompt": "wolf", "width": 4096}), codex("a4"))
        .await;
    let h4 = denied.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    let out = std::process::Command::new(bin())
        .args(["router", "deny", "--registry"])
        .arg(w.registry())
        .arg(&h4)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = g
        .spend(json!({"prompt": "wolf", "width": 4096}), codex("a4"))
        .await;
    assert_eq!(code(&after), "operation_denied");
    assert_eq!(w.charges().len(), 2);
    g.stop().await;
}

#[tokio::test]
async fn the_agent_side_over_streamable_http_keeps_the_rules() {
    use tokio::io::AsyncBufReadExt;
    let w = World::new();
    let args = w.args(&["--http", "127.0.0.1:0"]);
    let mut child = tokio::process::Command::new(bin())
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("callid gateway: listening on ") {
                return rest.trim().to_string();
            }
        }
        panic!("the gateway exited before listening");
    })
    .await
    .unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let connect = || async {
        let c = Connection::http(&url).await.unwrap();
        c.initialize(json!(0), "2025-06-18", "callid-tests", "1")
            .await
            .unwrap();
        c
    };
    let a = connect().await;
    let first = a
        .call_tool(next_id(), "generate_image", fox(), Some(codex("h1")))
        .await
        .unwrap();
    assert_clean(&first);
    let r1 = receipt(&first);
    assert!(!replayed(&first));
    // A reconnecting client redelivers on a new session.
    let b = connect().await;
    let again = b
        .call_tool(next_id(), "generate_image", fox(), Some(codex("h1")))
        .await
        .unwrap();
    assert_eq!(receipt(&again), r1);
    assert!(replayed(&again));
    let none = b
        .call_tool(next_id(), "generate_image", fox(), None)
        .await
        .unwrap();
    assert_eq!(code(&none), "missing_identity");
    assert_eq!(w.charges().len(), 1);
    child.kill().await.unwrap();
}

#[test]
fn the_gateway_refuses_a_non_loopback_http_address() {
    let w = World::new();
    let out = std::process::Command::new(bin())
        .args(w.args(&["--http", "0.0.0.0:0"]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
    assert!(!w.registry().exists(), "nothing is opened before the bind");
    assert!(
        !w.ledger().exists(),
        "no upstream is started before the bind"
    );
}

/// Builds `examples/guarded_server.rs` (cargo compiles examples for `cargo test`, not for
/// `cargo test --test it`) and returns its path.
fn guarded_server() -> PathBuf {
    // `<target>/<profile>/deps/it-...`: build the example with the same profile.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo
        .args(["build", "--quiet", "--example", "guarded_server"])
        .current_dir(crate::common::repo());
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let status = cargo.status().unwrap();
    assert!(status.success(), "building the example failed");
    profile_dir.join("examples").join("guarded_server")
}

#[tokio::test]
async fn the_guarded_server_example_charges_once_per_call() {
    let w = World::new();
    let exe = guarded_server();
    let args = vec![
        w.registry().display().to_string(),
        w.ledger().display().to_string(),
    ];
    let (conn, child) = Connection::spawn_stdio(&exe, &args, &[]).await.unwrap();
    conn.initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
    let g = Gw { conn, child };
    let first = g.spend(fox(), codex("ex1")).await;
    let r1 = receipt(&first);
    assert!(!replayed(&first));
    let again = g.spend(fox(), codex("ex1")).await;
    assert_eq!(receipt(&again), r1);
    assert!(replayed(&again));
    assert_eq!(handle(&again), handle(&first));
    let second = g.spend(fox(), codex("ex2")).await;
    assert_ne!(receipt(&second)["charge_id"], r1["charge_id"]);
    let mismatch = g.spend(json!({"prompt": "wolf"}), codex("ex1")).await;
    assert_eq!(code(&mismatch), "request_mismatch");
    let none = g.call("generate_image", fox(), None).await;
    assert_eq!(code(&none), "missing_identity");
    let charges = w.charges();
    assert_eq!(charges.len(), 2);
    assert!(charges[0].idempotency_key.starts_with("callid-idem-v1-"));
    g.stop().await;
}

/// An HTTP upstream that answers each `pay` call with the `Idempotency-Key` header and the
/// `_meta` key it received, and counts its calls.
#[derive(Clone, Default)]
struct HeaderEcho {
    calls: std::sync::Arc<AtomicU64>,
}

impl rmcp::ServerHandler for HeaderEcho {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let schema = json!({"type": "object", "properties": {"amount": {"type": "integer"}}});
        Ok(rmcp::model::ListToolsResult::with_all_items(vec![
            rmcp::model::Tool::new(
                "pay",
                "Pay.",
                std::sync::Arc::new(schema.as_object().unwrap().clone()),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let header = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("idempotency-key"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let meta_key = context.meta.0.0.get("callid/idempotency-key").cloned();
        let result = rmcp::model::CallToolResult::structured(
            json!({"header": header, "meta_key": meta_key, "call": n}),
        );
        Ok(result.into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_upstream_gets_the_key_as_idempotency_key_header() {
    use rmcp::transport::StreamableHttpService;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    let echo = HeaderEcho::default();
    let served = echo.clone();
    let service = StreamableHttpService::new(
        move || Ok(served.clone()),
        std::sync::Arc::new(LocalSessionManager::default()),
        Default::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest_service("/mcp", service);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let w = World::new();
    let args: Vec<String> = vec![
        "gateway".into(),
        "--registry".into(),
        w.registry().display().to_string(),
        "--spend".into(),
        "pay".into(),
        "--upstream-url".into(),
        format!("http://localhost:{}/mcp", addr.port()),
    ];
    let (conn, child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    conn.initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap_or_else(|e| panic!("initialize: {e}\n{}", child.stderr_text()));
    let g = Gw { conn, child };
    let first = g.call("pay", json!({"amount": 5}), Some(codex("p1"))).await;
    let s = first
        .structured()
        .unwrap_or_else(|| panic!("{}", first.raw))
        .clone();
    let header = s["header"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", first.raw));
    assert!(header.starts_with("callid-idem-v1-"), "{header}");
    assert_eq!(s["meta_key"], json!(header));
    let again = g.call("pay", json!({"amount": 5}), Some(codex("p1"))).await;
    assert!(replayed(&again));
    assert_eq!(again.structured(), Some(&s));
    let other = g.call("pay", json!({"amount": 5}), Some(codex("p2"))).await;
    assert_ne!(other.structured().unwrap()["header"], json!(header));
    assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_of_one_call_reach_the_upstream_once() {
    let w = World::new();
    let g = w.gateway(&[], &[]).await;
    let mut tasks = vec![];
    for _ in 0..8 {
        let conn = g.conn.clone();
        tasks.push(tokio::spawn(async move {
            conn.call_tool(next_id(), "generate_image", fox(), Some(codex("burst")))
                .await
                .unwrap()
        }));
    }
    let mut replies = vec![];
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    let first = receipt(&replies[0]);
    for r in &replies {
        assert_clean(r);
        assert_eq!(receipt(r), first);
        assert!(
            meta(r).get("callid-provider/replayed").is_none(),
            "{}",
            r.raw
        );
    }
    assert_eq!(replies.iter().filter(|r| !replayed(r)).count(), 1);
    assert_eq!(w.charges().len(), 1);
    // The operator's view of a gateway registry.
    let h = handle(&replies[0]);
    let out = std::process::Command::new(bin())
        .args(["router", "status", "--registry"])
        .arg(w.registry())
        .arg(&h)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("completed") && text.contains(&h), "{text}");
    assert!(!text.contains(KEY_PREFIX), "{text}");
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_registry_never_overspend_the_budget() {
    let w = World::new();
    let policy = w.path("policy.yaml");
    std::fs::write(
        &policy,
        "budget_cents: 9\ntools:\n  generate_image:\n    price_cents: 3\n",
    )
    .unwrap();
    let flags = ["--policy", policy.to_str().unwrap()];
    let a = w.gateway(&flags, &[]).await;
    let b = w.gateway(&flags, &[]).await;
    let mut tasks = vec![];
    for i in 0..8 {
        let conn = if i % 2 == 0 {
            a.conn.clone()
        } else {
            b.conn.clone()
        };
        tasks.push(tokio::spawn(async move {
            conn.call_tool(
                next_id(),
                "generate_image",
                fox(),
                Some(codex(&format!("budget-{i}"))),
            )
            .await
            .unwrap()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r.is_tool_error() {
            assert_eq!(code(&r), "budget_exceeded", "{}", r.raw);
        } else {
            ok += 1;
        }
    }
    assert_eq!(ok, 3, "a 9-cent budget pays for three 3-cent calls");
    assert_eq!(w.charges().len(), 3);
    a.stop().await;
    b.stop().await;
}
