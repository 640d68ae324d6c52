//! Router replicas on one PostgreSQL registry: real `callid router` processes, a real throwaway
//! PostgreSQL cluster on a temp directory and a free loopback port, a real provider with its
//! ledger. Each replica has its own data directory (as on its own machine); only the database
//! is shared.
//!
//! Without PostgreSQL binaries these tests print a SKIP outside CI and fail in CI (`CI=true`),
//! where `.ci/run` installs them.

use crate::common::mcp::{
    Served, answered_or_in_progress, code as error_code, codex_in_session as codex, completed,
    concurrent_spends, env_of, fox, paid_within_budget, replayed_or_not as replayed,
};
use crate::common::provider;
use crate::common::{bin, callid_ok};
use crate::pg::PgCluster;
use callid::jsonrpc::Response;
use callid::provider::ProviderHandle;
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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
        let provider = provider::spawn(&ledger, None).await;
        Some(World {
            dir,
            provider_addr: provider.addr(),
            _provider: provider,
            ledger,
            pg,
        })
    }

    fn charges(&self) -> u64 {
        provider::charge_count(&self.ledger)
    }

    fn charge_ids(&self) -> Vec<String> {
        provider::charge_ids(&self.ledger)
    }

    /// Starts replica `name` (its own data directory) on the shared database.
    async fn replica(&self, name: &str, envs: &[(&str, &str)]) -> Served {
        self.replica_with(name, &[], envs).await
    }

    /// Replica `name` with `extra` router flags.
    async fn replica_with(&self, name: &str, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let mut args: Vec<String> = vec![
            "router".into(),
            "--provider-url".into(),
            format!("http://{}", self.provider_addr),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let (url, data) = (self.pg.url(), data.display().to_string());
        let base = [
            ("CALLID_LOG", "debug"),
            ("CALLID_REGISTRY", url.as_str()),
            ("XDG_DATA_HOME", data.as_str()),
        ];
        Served::start("the replica", &bin(), &args, &env_of(&base, envs), None).await
    }
}

/// Replica `r` spends the fox as call `call_id`.
async fn spend(r: &Served, call_id: &str) -> Response {
    r.spend(fox(), codex(call_id)).await
}

/// [`spend`] until no other replica's dispatch of the call is live.
async fn spend_until_settled(r: &Served, call_id: &str) -> (Response, Duration) {
    r.spend_until_settled(codex(call_id), Duration::from_secs(120))
        .await
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
    let conns = replicas.each_ref().map(|r| r.conn.clone());
    let replies = concurrent_spends(&conns, 32, |_| codex("burst")).await;
    let done: Vec<Value> = answered_or_in_progress(replies)
        .iter()
        .map(|r| completed(r).clone())
        .collect();
    assert!(!done.is_empty());
    assert_eq!(w.charges(), 1, "one charge across three replicas");
    // Every replica now replays the one recorded result.
    let first = done[0].clone();
    for d in &done {
        assert_eq!(d, &first);
    }
    for r in &replicas {
        let (again, _) = spend_until_settled(r, "burst").await;
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
async fn a_replica_with_a_remote_provider_needs_no_local_disk() {
    let Some(w) = World::new("a_replica_with_a_remote_provider_needs_no_local_disk").await else {
        return;
    };
    // Its data directory cannot even be created (a file stands where it would be): every layer
    // record lives in the database, and the provider is across the network.
    let home = w.dir.path().join("no-disk");
    std::fs::write(&home, "not a directory").unwrap();
    let home = home.display().to_string();
    let r = w.replica("a", &[("XDG_DATA_HOME", home.as_str())]).await;
    let first = spend(&r, "diskless").await;
    let receipt = completed(&first).clone();
    let (again, _) = spend_until_settled(&r, "diskless").await;
    assert_eq!(completed(&again), &receipt);
    assert!(replayed(&again));
    assert_eq!(w.charges(), 1);
    assert_eq!(std::fs::read_to_string(&home).unwrap(), "not a directory");
    r.stop().await;
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
        doomed.spend_and_die(codex(&call), name).await;
        let handle = w.pg.sql(
            "callid",
            &format!("SELECT handle FROM callid_operations WHERE harness_call_id = '{call}'"),
        );
        assert!(!handle.is_empty(), "{name}: the row is committed first");
        let (again, took) = spend_until_settled(&survivor, &call).await;
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
        let (third, _) = spend_until_settled(&survivor, &call).await;
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
    let first = spend(&a, "before").await;
    completed(&first);
    assert_eq!(w.charges(), 1);

    w.pg.stop_server();
    for r in [&a, &b] {
        let down = spend(r, "while-down").await;
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
    let (up, _) = spend_until_settled(&b, "while-down").await;
    let s = completed(&up).clone();
    assert_eq!(w.charges(), 2);
    let (replay, _) = spend_until_settled(&a, "while-down").await;
    assert_eq!(completed(&replay), &s);
    assert!(replayed(&replay));
    let (old, _) = spend_until_settled(&b, "before").await;
    assert_eq!(completed(&old), completed(&first));
    assert_eq!(w.charges(), 2);
    a.stop().await;
    b.stop().await;
}

/// Defect 11 of the gateway money issue: after a restart every session of a replica (its
/// registry's writers, its liveness lock, its layers' pool) is dead while it looks open; each
/// must be replaced before it is used, so the first spends after the restart already succeed.
#[tokio::test]
async fn the_first_spends_after_a_database_restart_succeed() {
    let Some(w) = World::new("the_first_spends_after_a_database_restart_succeed").await else {
        return;
    };
    let a = w.replica("a", &[]).await;
    let b = w.replica("b", &[]).await;
    completed(&spend(&a, "before").await);
    completed(&spend(&b, "before-b").await);
    let conns = [a.conn.clone(), b.conn.clone()];
    // More distinct calls than a replica has sessions, spread over both replicas.
    let calls = 6;
    for round in 0..10 {
        w.pg.restart_server();
        let replies = concurrent_spends(&conns, calls, |i| codex(&format!("r{round}-{i}"))).await;
        for r in &replies {
            assert!(!r.is_tool_error(), "round {round}: {}", r.raw);
            completed(r);
        }
        assert_eq!(
            w.charges(),
            2 + (round + 1) * calls as u64,
            "round {round}: one charge per call"
        );
    }
    // Each replica took its liveness lock again on a fresh session.
    assert_eq!(
        w.pg.sql(
            "callid",
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ),
        "2"
    );
    let again = spend(&a, "before").await;
    assert!(replayed(&again), "{}", again.raw);
    assert_eq!(w.charges(), 2 + 10 * calls as u64);
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
         INSERT INTO callid_settings VALUES ('installation_id', 'inst-old');
         INSERT INTO callid_operations (platform, installation_id, source_installation,
             harness_call_id, handle, operation_key, tool, request_hash, arguments, amount_cents,
             status, approval, charged_cents, created_ms, updated_ms)
         VALUES ('codex', 'inst-old', '', 'c1', 'h1', 'k1', 'generate_image', 'sha256:00', '{}',
                 3, 'completed', 'not_required', 5, 1, 1),
                ('codex', 'inst-old', '', 'c2', 'h2', 'k2', 'generate_image', 'sha256:01', '{}',
                 4, 'completed', 'not_required', NULL, 1, 1),
                ('codex', 'inst-old', '', 'c3', 'h3', 'k3', 'generate_image', 'sha256:02', '{}',
                 6, 'pending', 'not_required', NULL, 1, 1);",
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
    // The running total of completed operations starts from the rows already there (5 charged,
    // 4 quoted); the pending row stays out of it.
    assert_eq!(
        pg.sql(
            "older",
            "SELECT SUM(completed_cents) FROM callid_installation_totals
             WHERE installation_id = 'inst-old'"
        ),
        "9"
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
    let url = w.pg.url();
    let operator = |args: &[&str]| {
        let out = callid_ok(args, &[("CALLID_REGISTRY", &url)]);
        String::from_utf8_lossy(&out.stdout).to_string()
    };

    let first = spend(&a, "ap").await;
    assert_eq!(error_code(&first), "awaiting_approval", "{}", first.raw);
    let h = first.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(error_code(&spend(&b, "ap").await), "awaiting_approval");
    assert!(operator(&["router", "approve", &h]).contains("approved"));
    let status: Value = serde_json::from_str(&operator(&["router", "status", &h])).unwrap();
    assert_eq!(status["status"], "pending");
    let (done, _) = spend_until_settled(&b, "ap").await;
    assert_eq!(completed(&done)["handle"], json!(h));
    let (again, _) = spend_until_settled(&a, "ap").await;
    assert_eq!(completed(&again), completed(&done));
    assert!(replayed(&again));
    assert_eq!(w.charges(), 1);

    let second = spend(&b, "dn").await;
    assert_eq!(error_code(&second), "awaiting_approval");
    let h2 = second.structured().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_string();
    operator(&["router", "deny", &h2, "--reason", "too dear"]);
    let denied = spend(&a, "dn").await;
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
    let conns = replicas.each_ref().map(|r| r.conn.clone());
    let replies = concurrent_spends(&conns, 12, |i| codex(&format!("budget-{i}"))).await;
    let ok = paid_within_budget(&replies);
    for r in replies.iter().filter(|r| !r.is_tool_error()) {
        completed(r);
    }
    assert_eq!(ok, 3, "three spends fit the budget");
    assert_eq!(w.charges(), 3, "never more than the budget across replicas");
    let spent: u64 = provider::charges(&w.ledger)
        .iter()
        .map(|c| c.amount_cents)
        .sum();
    assert!(spent <= 10, "spent {spent} of a 10-cent budget");
    // The running totals the budget check reads (kept by triggers, in stripes) agree with a sum
    // over every decision.
    assert_eq!(
        w.pg.sql(
            "callid",
            "SELECT (SELECT COALESCE(SUM(charged_cents), 0) FROM callid_account_totals)
                 || ' ' || (SELECT COALESCE(SUM(charged_cents), 0) FROM callid_decisions
                     WHERE state = 'charged')"
        ),
        format!("{spent} {spent}")
    );
    for r in replicas {
        r.stop().await;
    }
}

/// Round trips to the server, counted at a relay in front of it (the bench's): a new
/// operation's, and a redelivery's that misses the reply cache (a replica that restarted, or
/// never answered the call), which the new row's insert answers with the recorded row. The
/// median of each call's count: a session idle for 100 ms, which a loaded machine leaves now and
/// then, is checked with a round trip of its own before it is used.
#[cfg(feature = "bench")]
#[tokio::test]
async fn round_trips_of_a_new_operation_and_of_a_redelivery_missing_the_reply_cache() {
    use callid::testing::relay::Relay;
    const CALLS: usize = 20;
    let Some(w) = World::new("round_trips_of_a_new_operation_and_of_a_redelivery").await else {
        return;
    };
    let server = w.pg.server_url();
    let server = server.rsplit('@').next().unwrap().parse().unwrap();
    let relay = Relay::start(server).unwrap();
    let url = format!("postgres://callid@{}/callid", relay.addr());
    let envs = [("CALLID_REGISTRY", url.as_str())];
    let median = |mut counts: Vec<u64>| {
        counts.sort_unstable();
        (counts[counts.len() / 2], counts)
    };
    // Warmed up first: connections made, the statements of both writers prepared.
    let a = w.replica("a", &envs).await;
    for warm in ["warm-1", "warm-2", "warm-3"] {
        completed(&spend(&a, warm).await);
    }
    let (mut recorded, mut counts) = (vec![], vec![]);
    for i in 0..CALLS {
        let before = relay.counts();
        recorded.push(completed(&spend(&a, &format!("rt-{i}")).await).clone());
        counts.push(relay.counts().since(before).round_trips);
    }
    let new_operation = median(counts);
    a.stop().await;
    let b = w.replica("b", &envs).await;
    for warm in ["warm-1", "warm-2", "warm-3"] {
        assert!(replayed(&spend(&b, warm).await));
    }
    let mut counts = vec![];
    for (i, first) in recorded.iter().enumerate() {
        let before = relay.counts();
        let again = spend(&b, &format!("rt-{i}")).await;
        counts.push(relay.counts().since(before).round_trips);
        assert_eq!(completed(&again), first);
        assert!(replayed(&again));
    }
    let redelivery = median(counts);
    b.stop().await;
    assert_eq!(w.charges(), CALLS as u64 + 3);
    // 4: `BEGIN` with the insert and the layers' rows, `COMMIT`; the same for the result.
    assert_eq!(
        new_operation.0, 4,
        "per new operation: {:?}",
        new_operation.1
    );
    // 2: `BEGIN` with the insert, which answers the recorded row, and the layers' rows; then
    // `ROLLBACK` of those rows. Nothing is written again.
    assert_eq!(redelivery.0, 2, "per redelivery: {:?}", redelivery.1);
}
