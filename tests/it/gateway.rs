//! Integration tests of `callid gateway` in front of `callid provider --mcp`: the real binary as
//! both processes, real SQLite files, the hand-written JSON-RPC client on the agent side. Every
//! response is scanned for the private key prefix.

use crate::common::mcp::{
    Gate, HANDLE_PREFIX, KEY_PREFIX, Served, assert_clean, code, codex, concurrent_spends, env_of,
    fox, gateway_args, meta, next_id, paid_within_budget, receipt, replayed, spawn_http,
    spend_in_background,
};
use crate::common::provider;
use crate::common::{bin, callid_ok, registry_handle};
use callid::jsonrpc::{Connection, Response};
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
        provider::charges(&self.ledger())
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        gateway_args(Some(&self.registry()), extra, &self.ledger())
    }

    /// A policy file at `policy.yaml`: `text` as YAML.
    fn policy(&self, text: &str) -> PathBuf {
        let policy = self.path("policy.yaml");
        std::fs::write(&policy, text).unwrap();
        policy
    }

    /// Starts a gateway in front of `callid provider --mcp` and initializes it.
    async fn gateway(&self, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let env = env_of(&[("CALLID_LOG", "debug")], envs);
        Served::start("the gateway", &bin(), &self.args(extra), &env, None).await
    }
}

/// The handle `r` names, a public one.
fn handle(r: &Response) -> String {
    let h = crate::common::mcp::handle(r);
    assert!(h.starts_with(HANDLE_PREFIX), "{h}");
    h
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
    let gate = Gate::new(w.path("gate"), Boundary::AfterProviderCharge.name());
    let g = w.gateway(&["--upstream-timeout", "1"], &[gate.env()]).await;
    let first = g.spend(fox(), codex("call_t")).await;
    assert_eq!(code(&first), "outcome_unknown", "{}", first.raw);
    assert!(first.raw.contains("within 1 seconds"), "{}", first.raw);
    gate.open();
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
        g.spend_and_die(codex("crash"), label).await;
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
    let gate = Gate::new(w.path("gate"), Boundary::AfterProviderCharge.name());
    let mut g = w.gateway(&[], &[gate.env()]).await;
    let call = spend_in_background(&g.conn, codex("busy"));
    gate.reached().await;
    g.child.kill9().await.unwrap();
    g.child.wait().await.unwrap();
    assert!(call.await.unwrap().is_err());
    gate.open();
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
    let g = Served::start("the gateway", &bin(), &gw_args, &[], None).await;
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
    let policy = w.policy("budget_cents: 8\ntools:\n  generate_image:\n    price_cents: 3\n");
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

/// A call recorded while its tool could be priced, redelivered after the policy changed so that
/// its arguments can no longer be priced (the price moved to an argument it lacks), gets its
/// recorded result; a new call the policy cannot price gets the policy's error, and nothing is
/// recorded or charged.
#[tokio::test]
async fn a_redelivery_the_policy_can_no_longer_price_replays_its_recorded_result() {
    let w = World::new();
    let policy = w.policy("tools:\n  generate_image:\n    price_cents: 3\n");
    let flags = ["--policy", policy.to_str().unwrap()];
    let g = w.gateway(&flags, &[]).await;
    let first = g.spend(fox(), codex("p1")).await;
    let r1 = receipt(&first);
    let h = handle(&first);
    g.stop().await;

    w.policy("tools:\n  generate_image:\n    price_pointer: /cents\n");
    let g = w.gateway(&flags, &[]).await;
    let again = g.spend(fox(), codex("p1")).await;
    assert_eq!(receipt(&again), r1, "{}", again.raw);
    assert!(replayed(&again));
    assert_eq!(handle(&again), h);
    let new = g.spend(fox(), codex("p2")).await;
    assert_eq!(code(&new), "invalid_arguments", "{}", new.raw);
    assert!(new.raw.contains("`/cents`"), "{}", new.raw);
    assert_eq!(registry_handle(&w.registry(), "p2"), None);
    assert_eq!(w.charges().len(), 1);
    g.stop().await;
}

#[tokio::test]
async fn a_policy_price_from_the_arguments_and_approvals() {
    let w = World::new();
    let policy = w.policy(
        "approval_above_cents: 1000\ntools:\n  generate_image:\n    price_pointer: /width\n",
    );
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
    let reg = w.registry();
    callid_ok(
        &["router", "approve", "--registry", reg.to_str().unwrap(), &h],
        &[],
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
    callid_ok(
        &["router", "deny", "--registry", reg.to_str().unwrap(), &h4],
        &[],
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
    let w = World::new();
    let args = w.args(&["--http", "127.0.0.1:0"]);
    let (url, mut child) = spawn_http(&args, "callid gateway", Duration::from_secs(30)).await;
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
pub(crate) fn guarded_server() -> PathBuf {
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
    let g = Served::start("the guarded server", &exe, &args, &[], None).await;
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
    let g = Served::start("the gateway", &bin(), &args, &[], None).await;
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
    let replies = concurrent_spends(std::slice::from_ref(&g.conn), 8, |_| codex("burst")).await;
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
    let reg = w.registry();
    let out = callid_ok(
        &["router", "status", "--registry", reg.to_str().unwrap(), &h],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("completed") && text.contains(&h), "{text}");
    assert!(!text.contains(KEY_PREFIX), "{text}");
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_registry_never_overspend_the_budget() {
    let w = World::new();
    let policy = w.policy("budget_cents: 9\ntools:\n  generate_image:\n    price_cents: 3\n");
    let flags = ["--policy", policy.to_str().unwrap()];
    let a = w.gateway(&flags, &[]).await;
    let b = w.gateway(&flags, &[]).await;
    let conns = [a.conn.clone(), b.conn.clone()];
    let replies = concurrent_spends(&conns, 8, |i| codex(&format!("budget-{i}"))).await;
    let ok = paid_within_budget(&replies);
    assert_eq!(ok, 3, "a 9-cent budget pays for three 3-cent calls");
    assert_eq!(w.charges().len(), 3);
    a.stop().await;
    b.stop().await;
}
