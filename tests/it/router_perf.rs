//! The router's fast paths keep its rules: a redelivery answered from the replay cache is the
//! durable record's answer and still passes every per-delivery check, and a new operation's
//! registry row is committed together with its dispatch lease. Real router processes, real
//! SQLite files, the in-process provider.

use crate::common::bin;
use callid::jsonrpc::{Child, Connection, Response, RpcError};
use callid::provider::Ledger;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const KEY_PREFIX: &str = "hubu:operation:v1:";

static RPC_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> Value {
    json!(RPC_ID.fetch_add(1, Ordering::Relaxed))
}

struct Router {
    conn: Connection,
    child: Child,
}

async fn router(registry: &Path, envs: &[(&str, &str)]) -> Router {
    let args = vec![
        "router".to_string(),
        "--registry".into(),
        registry.display().to_string(),
    ];
    let env: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (conn, child) = Connection::spawn_stdio(&bin(), &args, &env).await.unwrap();
    let init = conn
        .initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap();
    assert!(init.result.is_some(), "initialize failed: {}", init.raw);
    Router { conn, child }
}

impl Router {
    async fn spend(&self, args: Value, meta: Value) -> Response {
        let r = self
            .conn
            .call_tool(next_id(), "generate_image", args, Some(meta))
            .await
            .unwrap_or_else(|e| panic!("spend failed: {e}\n{}", self.child.stderr_text()));
        assert!(
            !r.raw.contains(KEY_PREFIX),
            "a reply leaked a key: {}",
            r.raw
        );
        r
    }

    async fn stop(mut self) {
        let _ = self.child.kill9().await;
        let stderr = self.child.stderr_text();
        assert!(
            !stderr.contains(KEY_PREFIX),
            "the log shows a key:\n{stderr}"
        );
    }
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

fn code(r: &Response) -> String {
    assert!(r.is_tool_error(), "expected a tool error, got {}", r.raw);
    r.structured().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string()
}

fn charges(registry: &Path) -> u64 {
    let ledger = registry.with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
    Ledger::open(&ledger).unwrap().charge_count().unwrap()
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
