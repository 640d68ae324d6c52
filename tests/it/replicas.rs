//! Router replicas on one PostgreSQL registry: real `callid router` processes, a real throwaway
//! PostgreSQL cluster on a temp directory and a free loopback port, a real provider with its
//! ledger. Each replica has its own data directory (as on its own machine); only the database
//! is shared.
//!
//! Without PostgreSQL binaries these tests print a SKIP outside CI and fail in CI (`CI=true`),
//! where `.ci/run` installs them.

use crate::common::bin;
use crate::pg::PgCluster;
use callid::jsonrpc::{Child, Connection, Response, RpcError};
use callid::provider::{Ledger, ProviderHandle};
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const KEY_PREFIX: &str = "hubu:operation:v1:";

static RPC_ID: AtomicU64 = AtomicU64::new(50_000);

fn next_id() -> Value {
    json!(RPC_ID.fetch_add(1, Ordering::Relaxed))
}

/// A provider with its ledger, a PostgreSQL cluster, and replicas' data directories.
struct World {
    dir: tempfile::TempDir,
    _provider: ProviderHandle,
    provider_addr: std::net::SocketAddr,
    ledger: PathBuf,
    pg: PgCluster,
}

impl World {
    async fn new(test: &str) -> Option<World> {
        let pg = PgCluster::start(test)?;
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("provider-ledger.sqlite3");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let provider_addr = listener.local_addr().unwrap();
        let provider =
            callid::provider::spawn(listener, Ledger::open(&ledger).unwrap(), None).unwrap();
        Some(World {
            dir,
            _provider: provider,
            provider_addr,
            ledger,
            pg,
        })
    }

    fn charges(&self) -> u64 {
        Ledger::open(&self.ledger).unwrap().charge_count().unwrap()
    }

    fn charge_ids(&self) -> Vec<String> {
        Ledger::open(&self.ledger)
            .unwrap()
            .charges()
            .unwrap()
            .into_iter()
            .map(|c| c.charge_id)
            .collect()
    }

    /// Starts replica `name` (its own data directory) on the shared database.
    async fn replica(&self, name: &str, envs: &[(&str, &str)]) -> Replica {
        self.replica_with(name, &[], envs).await
    }

    /// Replica `name` with `extra` router flags.
    async fn replica_with(&self, name: &str, extra: &[&str], envs: &[(&str, &str)]) -> Replica {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let mut args: Vec<String> = vec![
            "router".into(),
            "--provider-url".into(),
            format!("http://{}", self.provider_addr),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut env: Vec<(String, String)> = vec![
            ("CALLID_LOG".into(), "debug".into()),
            ("CALLID_REGISTRY".into(), self.pg.url()),
            ("XDG_DATA_HOME".into(), data.display().to_string()),
        ];
        env.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let (conn, child) = Connection::spawn_stdio(&bin(), &args, &env).await.unwrap();
        let init = conn
            .initialize(json!(0), "2025-06-18", "callid-tests", "1")
            .await
            .unwrap();
        assert!(init.result.is_some(), "initialize failed: {}", init.raw);
        Replica { conn, child }
    }
}

struct Replica {
    conn: Connection,
    child: Child,
}

impl Replica {
    async fn spend(&self, call_id: &str) -> Response {
        let r = self
            .conn
            .call_tool(next_id(), "generate_image", fox(), Some(codex(call_id)))
            .await
            .unwrap_or_else(|e| panic!("spend failed: {e}\n{}", self.child.stderr_text()));
        assert!(!r.raw.contains(KEY_PREFIX), "leaked a key: {}", r.raw);
        r
    }

    /// Redelivers until the answer is not `operation_in_progress` (which means: another
    /// replica's dispatch is live, retry shortly); returns the answer and how long it took.
    async fn spend_until_settled(&self, call_id: &str) -> (Response, Duration) {
        let start = Instant::now();
        loop {
            let r = self.spend(call_id).await;
            if r.is_tool_error() && error_code(&r) == "operation_in_progress" {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "still in progress after 120 s: {}",
                    r.raw
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            return (r, start.elapsed());
        }
    }

    async fn stop(mut self) -> String {
        let _ = self.child.kill9().await;
        let stderr = self.child.stderr_text();
        assert!(!stderr.contains(KEY_PREFIX), "log shows a key:\n{stderr}");
        stderr
    }
}

fn codex(id: &str) -> Value {
    json!({"callId": id, "openai/session": "sess-1", "progressToken": 7})
}

fn fox() -> Value {
    json!({"prompt": "an origami fox"})
}

fn error_code(r: &Response) -> String {
    r.structured().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string()
}

fn completed(r: &Response) -> &Value {
    assert!(!r.is_tool_error(), "expected success, got {}", r.raw);
    let s = r.structured().unwrap();
    assert_eq!(s["status"], "completed", "{}", r.raw);
    s
}

fn replayed(r: &Response) -> bool {
    r.tool_result().unwrap()["_meta"]["callid/replayed"]
        .as_bool()
        .unwrap_or(false)
}

#[tokio::test]
async fn three_replicas_32_deliveries_of_one_call_charge_once() {
    let Some(w) = World::new("three_replicas_32_deliveries_of_one_call_charge_once").await else {
        return;
    };
    let replicas = [
        w.replica("a", &[]).await,
        w.replica("b", &[]).await,
        w.replica("c", &[]).await,
    ];
    let mut tasks = vec![];
    for i in 0..32 {
        let conn = replicas[i % 3].conn.clone();
        tasks.push(tokio::spawn(async move {
            conn.call_tool(next_id(), "generate_image", fox(), Some(codex("burst")))
                .await
                .unwrap()
        }));
    }
    let mut done = vec![];
    for t in tasks {
        let r = t.await.unwrap();
        assert!(!r.raw.contains(KEY_PREFIX), "{}", r.raw);
        if r.is_tool_error() {
            // Another replica held the dispatch: safe to retry.
            assert_eq!(error_code(&r), "operation_in_progress", "{}", r.raw);
        } else {
            done.push(completed(&r).clone());
        }
    }
    assert!(!done.is_empty());
    assert_eq!(w.charges(), 1, "one charge across three replicas");
    // Every replica now replays the one recorded result.
    let first = done[0].clone();
    for d in &done {
        assert_eq!(d, &first);
    }
    for r in &replicas {
        let (again, _) = r.spend_until_settled("burst").await;
        assert_eq!(completed(&again), &first);
        assert!(replayed(&again));
    }
    assert_eq!(w.charges(), 1);
    assert_eq!(first["result"]["charge_id"], json!(w.charge_ids()[0]));
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test]
async fn a_replica_killed_at_any_boundary_is_taken_over_by_another_with_one_charge() {
    let Some(w) = World::new("a_replica_killed_at_any_boundary").await else {
        return;
    };
    let survivor = w.replica("survivor", &[]).await;
    let mut takeovers = vec![];
    for boundary in Boundary::ALL {
        let name = boundary.name();
        let call = format!("crash-{name}");
        let before_charges = w.charges();
        let mut doomed = w
            .replica(
                &format!("doomed-{name}"),
                &[(callid::testing::crashpoint::ENV, name)],
            )
            .await;
        let err = doomed
            .conn
            .call_tool(next_id(), "generate_image", fox(), Some(codex(&call)))
            .await;
        assert!(
            matches!(err, Err(RpcError::Closed { .. })),
            "{name}: the replica should have died, got {err:?}"
        );
        assert!(!doomed.child.wait().await.unwrap().success(), "{name}");
        let handle = w.pg.sql(
            "callid",
            &format!("SELECT handle FROM callid_operations WHERE harness_call_id = '{call}'"),
        );
        assert!(!handle.is_empty(), "{name}: the row is committed first");
        let (again, took) = survivor.spend_until_settled(&call).await;
        takeovers.push(took);
        let s = completed(&again).clone();
        assert_eq!(s["handle"], json!(handle), "{name}: same handle");
        assert_eq!(w.charges(), before_charges + 1, "{name}: one charge");
        assert_eq!(
            s["result"]["charge_id"],
            json!(w.charge_ids().last().unwrap()),
            "{name}: the original charge"
        );
        assert_eq!(
            replayed(&again),
            boundary == Boundary::BeforeReply,
            "{name}"
        );
        let (third, _) = survivor.spend_until_settled(&call).await;
        assert_eq!(completed(&third), &s, "{name}");
        assert_eq!(w.charges(), before_charges + 1, "{name}");
    }
    // The layers' state is in the shared database, not on the dead replicas' disks: one
    // decision and one completed execution per operation, whichever replica wrote them.
    let n = Boundary::ALL.len().to_string();
    assert_eq!(
        w.pg.sql("callid", "SELECT count(*) FROM callid_decisions"),
        n
    );
    assert_eq!(
        w.pg.sql(
            "callid",
            "SELECT count(*) FROM callid_executions WHERE state = 'completed'"
        ),
        n
    );
    eprintln!("takeover after kill -9 (first settled redelivery): {takeovers:?}");
    survivor.stop().await;
}

#[tokio::test]
async fn a_database_restart_fails_spends_closed_then_recovers() {
    let Some(w) = World::new("a_database_restart_fails_spends_closed_then_recovers").await else {
        return;
    };
    let a = w.replica("a", &[]).await;
    let b = w.replica("b", &[]).await;
    let first = a.spend("before").await;
    completed(&first);
    assert_eq!(w.charges(), 1);

    w.pg.stop_server();
    for r in [&a, &b] {
        let down = r.spend("while-down").await;
        assert!(down.is_tool_error(), "{}", down.raw);
        assert_eq!(error_code(&down), "registry_unavailable", "{}", down.raw);
        let message = down.structured().unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains(&w.pg.url()), "names the URL: {message}");
        assert!(
            message.contains("retrying with the same call is safe"),
            "{message}"
        );
    }
    assert_eq!(
        w.charges(),
        1,
        "nothing dispatched while the database is down"
    );

    w.pg.start_server();
    let (up, _) = b.spend_until_settled("while-down").await;
    let s = completed(&up).clone();
    assert_eq!(w.charges(), 2);
    let (replay, _) = a.spend_until_settled("while-down").await;
    assert_eq!(completed(&replay), &s);
    assert!(replayed(&replay));
    let (old, _) = b.spend_until_settled("before").await;
    assert_eq!(completed(&old), completed(&first));
    assert_eq!(w.charges(), 2);
    a.stop().await;
    b.stop().await;
}

#[test]
fn operator_commands_and_refusals_on_a_database() {
    let Some(pg) = PgCluster::start("operator_commands_and_refusals_on_a_database") else {
        return;
    };
    let callid = |args: &[&str], registry: &str| {
        Command::new(bin())
            .args(args)
            .env("CALLID_REGISTRY", registry)
            .output()
            .unwrap()
    };
    // An unknown handle on a fresh database: the schema is created, the handle is unknown.
    let out = callid(&["router", "status", "nope"], &pg.url());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no operation has handle `nope`"),
        "{stderr}"
    );
    assert_eq!(
        pg.sql(
            "callid",
            "SELECT application || ' ' || version FROM callid_schema"
        ),
        format!(
            "callid-registry {}",
            callid::testing::registry::postgres::MIGRATIONS.len()
        )
    );

    // A database at schema 1 (written by an older callid) is upgraded in place, rows kept.
    pg.sql("postgres", "CREATE DATABASE older");
    pg.sql("older", callid::testing::registry::postgres::MIGRATIONS[0]);
    pg.sql(
        "older",
        "INSERT INTO callid_schema VALUES ('callid-registry', 1);
         INSERT INTO callid_settings VALUES ('installation_id', 'inst-old');",
    );
    let older = format!("{}older", pg.url().trim_end_matches("callid"));
    let out = callid(&["router", "status", "nope"], &older);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no operation has handle `nope`"),
        "{stderr}"
    );
    assert_eq!(
        pg.sql("older", "SELECT version FROM callid_schema"),
        callid::testing::registry::postgres::MIGRATIONS
            .len()
            .to_string()
    );
    assert_eq!(
        pg.sql("older", "SELECT value FROM callid_settings"),
        "inst-old"
    );
    assert_eq!(
        pg.sql(
            "older",
            "SELECT to_regclass('callid_decisions') IS NOT NULL"
        ),
        "t"
    );

    // A newer schema is refused untouched.
    pg.sql("callid", "UPDATE callid_schema SET version = 99");
    let out = callid(&["router", "status", "nope"], &pg.url());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("schema version 99 is newer"), "{stderr}");
    assert_eq!(pg.sql("callid", "SELECT version FROM callid_schema"), "99");

    // A foreign application's marker is refused untouched.
    pg.sql("postgres", "CREATE DATABASE other");
    pg.sql("other", "CREATE TABLE callid_schema (application text, version integer); INSERT INTO callid_schema VALUES ('someone-else', 1)");
    let other = format!("{}other", pg.url().trim_end_matches("callid"));
    let out = callid(&["router", "status", "nope"], &other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("belongs to `someone-else`"), "{stderr}");
    assert_eq!(
        pg.sql("other", "SELECT to_regclass('callid_operations') IS NULL"),
        "t"
    );

    // An unreachable database: a clear error naming the URL, password redacted.
    let dead = format!("postgres://callid:hunter2@127.0.0.1:{}/callid", {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    });
    let out = callid(&["router", "status", "nope"], &dead);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("callid:REDACTED@127.0.0.1"), "{stderr}");
    assert!(stderr.contains("failed while connecting"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test]
async fn an_approval_or_denial_given_once_holds_on_every_replica() {
    let Some(w) = World::new("an_approval_or_denial_given_once_holds_on_every_replica").await
    else {
        return;
    };
    let flags = ["--approval-above-cents", "2"];
    let a = w.replica_with("a", &flags, &[]).await;
    let b = w.replica_with("b", &flags, &[]).await;
    let operator = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .env("CALLID_REGISTRY", w.pg.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };

    let first = a.spend("ap").await;
    assert_eq!(error_code(&first), "awaiting_approval", "{}", first.raw);
    let h = first.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(error_code(&b.spend("ap").await), "awaiting_approval");
    assert!(operator(&["router", "approve", &h]).contains("approved"));
    let status: Value = serde_json::from_str(&operator(&["router", "status", &h])).unwrap();
    assert_eq!(status["status"], "pending");
    let (done, _) = b.spend_until_settled("ap").await;
    assert_eq!(completed(&done)["handle"], json!(h));
    let (again, _) = a.spend_until_settled("ap").await;
    assert_eq!(completed(&again), completed(&done));
    assert!(replayed(&again));
    assert_eq!(w.charges(), 1);

    let second = b.spend("dn").await;
    assert_eq!(error_code(&second), "awaiting_approval");
    let h2 = second.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    operator(&["router", "deny", &h2, "--reason", "too dear"]);
    let denied = a.spend("dn").await;
    assert_eq!(error_code(&denied), "operation_denied", "{}", denied.raw);
    assert_eq!(w.charges(), 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_budget_holds_across_replicas_under_concurrent_spends() {
    let Some(w) = World::new("a_budget_holds_across_replicas_under_concurrent_spends").await else {
        return;
    };
    // The fox costs 3 cents: a 10-cent budget covers three spends, whichever replicas take them.
    let flags = ["--budget-cents", "10"];
    let replicas = [
        w.replica_with("a", &flags, &[]).await,
        w.replica_with("b", &flags, &[]).await,
        w.replica_with("c", &flags, &[]).await,
    ];
    let mut tasks = vec![];
    for i in 0..12 {
        let conn = replicas[i % 3].conn.clone();
        tasks.push(tokio::spawn(async move {
            let call = format!("budget-{i}");
            conn.call_tool(next_id(), "generate_image", fox(), Some(codex(&call)))
                .await
                .unwrap()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r.is_tool_error() {
            assert_eq!(error_code(&r), "budget_exceeded", "{}", r.raw);
        } else {
            completed(&r);
            ok += 1;
        }
    }
    assert_eq!(ok, 3, "three spends fit the budget");
    assert_eq!(w.charges(), 3, "never more than the budget across replicas");
    let spent: u64 = Ledger::open(&w.ledger)
        .unwrap()
        .charges()
        .unwrap()
        .iter()
        .map(|c| c.amount_cents)
        .sum();
    assert!(spent <= 10, "spent {spent} of a 10-cent budget");
    for r in replicas {
        r.stop().await;
    }
}
