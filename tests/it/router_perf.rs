//! The router's fast paths keep its rules: a redelivery answered from the replay cache is the
//! durable record's answer and still passes every per-delivery check, and a new operation's
//! registry row is committed together with its dispatch lease. Real router processes, real
//! SQLite files, the in-process provider.

use crate::common::bin;
use crate::common::mcp::{KEY_PREFIX, Served, code, env_of, next_id};
use crate::common::provider;
use callid::jsonrpc::{Response, RpcError};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// A router on `registry` with the provider in-process, `envs` added.
async fn router(registry: &Path, envs: &[(&str, &str)]) -> Served {
    let args = vec![
        "router".to_string(),
        "--registry".into(),
        registry.display().to_string(),
    ];
    Served::start("the router", &bin(), &args, &env_of(&[], envs), None).await
}

/// A router on `registry` with the provider in-process and `flags` added.
async fn router_with(registry: &Path, flags: &[&str]) -> Served {
    let mut args = vec![
        "router".to_string(),
        "--registry".into(),
        registry.display().to_string(),
    ];
    args.extend(flags.iter().map(|f| f.to_string()));
    Served::start("the router", &bin(), &args, &env_of(&[], &[]), None).await
}

fn codex(id: &str) -> Value {
    json!({"callId": id, "openai/session": "sess-1"})
}

fn fox() -> Value {
    json!({"prompt": "an origami fox", "width": 512})
}

fn result(r: &Response) -> &Value {
    assert!(!r.is_tool_error(), "expected success, got {}", r.raw);
    r.tool_result().unwrap()
}

fn charges(registry: &Path) -> u64 {
    let ledger = registry.with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
    provider::charge_count(&ledger)
}

fn registry_in(dir: &tempfile::TempDir) -> PathBuf {
    let d = dir.path().join("r");
    std::fs::create_dir_all(&d).unwrap();
    d.join("registry.sqlite3")
}

#[tokio::test]
async fn a_replay_from_the_cache_equals_the_durable_record_and_keeps_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry_in(&dir);
    let first = router(&registry, &[]).await;
    let original = first.spend(fox(), codex("cached")).await;
    let original = result(&original).clone();
    assert_eq!(original["_meta"]["callid/replayed"], json!(false));

    // Answered by the process that recorded the result: from its replay cache.
    let cached = first.spend(fox(), codex("cached")).await;
    let cached = result(&cached).clone();
    assert_eq!(cached["_meta"]["callid/replayed"], json!(true));
    assert_eq!(cached["structuredContent"], original["structuredContent"]);
    let again = first.spend(fox(), codex("cached")).await;
    assert_eq!(result(&again), &cached);

    // The per-delivery checks still run on a cached call: the hash, identity in the arguments,
    // the identity itself.
    let other = first
        .spend(json!({"prompt": "a paper crane"}), codex("cached"))
        .await;
    assert_eq!(code(&other), "request_mismatch", "{}", other.raw);
    let mut smuggled = fox();
    smuggled["callId"] = json!("cached");
    let smuggled = first.spend(smuggled, codex("cached")).await;
    assert_eq!(code(&smuggled), "identity_in_arguments", "{}", smuggled.raw);
    let anonymous = first
        .spend(fox(), json!({"openai/session": "sess-1"}))
        .await;
    assert_eq!(code(&anonymous), "missing_identity", "{}", anonymous.raw);
    // Another platform's call with the same id is another operation, not this cached one.
    let claude = first
        .spend(fox(), json!({"claudecode/toolUseId": "cached"}))
        .await;
    let claude = result(&claude);
    assert_eq!(claude["_meta"]["callid/replayed"], json!(false));
    assert_ne!(
        claude["structuredContent"]["handle"],
        original["structuredContent"]["handle"]
    );
    first.stop().await;

    // A fresh process has an empty cache: it answers from the registry file, byte for byte the
    // same reply the cache gave.
    let second = router(&registry, &[]).await;
    let durable = second.spend(fox(), codex("cached")).await;
    assert_eq!(result(&durable), &cached);
    let durable_again = second.spend(fox(), codex("cached")).await;
    assert_eq!(result(&durable_again), &cached);
    second.stop().await;
    assert_eq!(charges(&registry), 2, "one charge per operation");
}

#[tokio::test]
async fn a_new_row_is_committed_with_its_dispatch_lease() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry_in(&dir);
    let mut crashing = router(
        &registry,
        &[(callid::testing::crashpoint::ENV, "after_row_commit")],
    )
    .await;
    let pid = crashing.child.pid().expect("running");
    let died = crashing
        .conn
        .call_tool(next_id(), "generate_image", fox(), Some(codex("leased")))
        .await;
    assert!(
        matches!(died, Err(RpcError::Closed { .. })),
        "the router should have died: {died:?}"
    );
    crashing.child.wait().await.unwrap();
    let (status, owner, expires): (String, Option<String>, Option<i64>) =
        rusqlite::Connection::open(&registry)
            .unwrap()
            .query_row(
                "SELECT status, lease_owner, lease_expires_ms FROM operations \
                 WHERE harness_call_id = 'leased'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
    assert_eq!(status, "pending");
    assert!(
        owner
            .as_deref()
            .is_some_and(|o| o.starts_with(&format!("{pid}:"))),
        "the row's first commit holds the lease of the process that wrote it: {owner:?}"
    );
    assert!(expires.is_some_and(|e| e > callid::testing::now_ms()));
    assert_eq!(charges(&registry), 0);

    // The crashed owner is gone, so the redelivery takes the lease over at once and charges once.
    let r = router(&registry, &[]).await;
    let done = r.spend(fox(), codex("leased")).await;
    assert_eq!(result(&done)["_meta"]["callid/replayed"], json!(false));
    assert_eq!(charges(&registry), 1);
    r.stop().await;
}

/// The state of one call's operation row, its decision and its execution, read from the
/// registry file: (operation status, decision state, execution state, execution attempts).
fn layers_of(registry: &Path, call: &str) -> Option<(String, String, String, i64)> {
    use rusqlite::OptionalExtension as _;
    rusqlite::Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT o.status, d.state, e.state, e.attempts FROM operations o \
             JOIN decisions d ON d.operation_key = o.operation_key \
             JOIN executions e ON e.decision_id = d.decision_id \
             WHERE o.harness_call_id = ?1",
            [call],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .unwrap()
}

fn layer_state(op: &str, decision: &str, execution: &str) -> Option<(String, String, String, i64)> {
    Some((op.into(), decision.into(), execution.into(), 1))
}

/// The three-commit path: a new operation's row, lease, decision and `dispatched` execution are
/// one commit (a crash right after it finds all four), the provider's charge is its ledger's,
/// and the result, the execution's receipt and the decision's charge are one commit (a crash
/// before it finds none of them; the redelivery records all three, charging nothing more).
#[tokio::test]
async fn a_new_operation_commits_its_layers_with_its_row_and_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry_in(&dir);

    let mut crashing = router(
        &registry,
        &[(callid::testing::crashpoint::ENV, "after_row_commit")],
    )
    .await;
    crashing
        .spend_and_die(codex("row"), "after_row_commit")
        .await;
    assert_eq!(
        layers_of(&registry, "row"),
        layer_state("pending", "dispatched", "dispatched"),
        "the row's commit holds the decision and the dispatch"
    );
    assert_eq!(charges(&registry), 0);
    for own_file in [
        callid::backend::AUTHORIZATION_FILE,
        callid::backend::EXECUTION_FILE,
    ] {
        assert!(!registry.with_file_name(own_file).exists(), "{own_file}");
    }

    let mut crashing = router(
        &registry,
        &[(callid::testing::crashpoint::ENV, "before_result_recorded")],
    )
    .await;
    crashing
        .spend_and_die(codex("charged"), "before_result_recorded")
        .await;
    assert_eq!(charges(&registry), 1, "the provider charged");
    assert_eq!(
        layers_of(&registry, "charged"),
        layer_state("pending", "dispatched", "dispatched"),
        "nothing of the outcome is recorded before the result's commit"
    );

    let r = router(&registry, &[]).await;
    for call in ["row", "charged"] {
        // The arguments `spend_and_die` sent.
        let done = r.spend(crate::common::mcp::fox(), codex(call)).await;
        assert_eq!(result(&done)["_meta"]["callid/replayed"], json!(false));
    }
    r.stop().await;
    assert_eq!(charges(&registry), 2, "one charge per operation");
    for call in ["row", "charged"] {
        let (op, decision, execution, _) = layers_of(&registry, call).unwrap();
        assert_eq!(
            (op.as_str(), decision.as_str(), execution.as_str()),
            ("completed", "charged", "completed"),
            "{call}"
        );
    }
}

/// A state directory from before the layers moved into the registry: their own files' rows are
/// copied in (what a decision charged keeps counting against the budget), and the files are
/// kept, renamed.
#[tokio::test]
async fn the_layers_own_files_of_an_earlier_callid_are_imported_with_their_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry_in(&dir);
    {
        // An earlier callid's layout: the library's own-file backend, one 25-cent image.
        let backend = callid::backend::Backend::open(
            registry.parent().unwrap(),
            callid::backend::ProviderTarget::InProcess,
            callid::backend::BackendConfig {
                agent_id: "callid-router:earlier".into(),
                ..Default::default()
            },
        )
        .unwrap();
        let args = json!({"prompt": "an earlier fox", "model": "flux-pro"});
        let request: callid::provider::ImageRequest = serde_json::from_value(args.clone()).unwrap();
        let key = callid::keys::OperationKey::generate(KEY_PREFIX, "codex");
        let hash = callid::canonical::request_hash("generate_image", &args).unwrap();
        let receipt = backend.spend(&key, &request, &hash).await.unwrap();
        assert_eq!(receipt.amount_cents, 25);
    }
    // 25 of 30 cents were charged under the earlier layout: a 3-cent image fits, a second does
    // not.
    let r = router_with(&registry, &["--budget-cents", "30"]).await;
    let cheap = json!({"prompt": "an origami fox", "width": 512, "model": "flux-schnell"});
    result(&r.spend(cheap.clone(), codex("fits")).await);
    let refused = r.spend(cheap, codex("over")).await;
    assert_eq!(code(&refused), "budget_exceeded", "{}", refused.raw);
    r.stop().await;
    for name in [
        callid::backend::AUTHORIZATION_FILE,
        callid::backend::EXECUTION_FILE,
    ] {
        let file = registry.with_file_name(name);
        assert!(!file.exists(), "{name} was renamed");
        let mut kept = file.into_os_string();
        kept.push(callid::backend::IMPORTED_SUFFIX);
        assert!(std::path::PathBuf::from(kept).exists(), "{name} is kept");
    }
    let held: i64 = rusqlite::Connection::open(&registry)
        .unwrap()
        .query_row(
            "SELECT charged_cents FROM decisions WHERE agent_id = 'callid-router:earlier' \
             AND state = 'charged'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(held, 25);
}
