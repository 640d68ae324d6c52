//! Gateway replicas on one PostgreSQL registry: real `callid gateway` processes, each in front of
//! its own `callid provider --mcp` upstream, the upstreams sharing one ledger file (so the ledger
//! counts every charge whichever replica's upstream made it), and a real throwaway PostgreSQL
//! cluster ([`PgCluster`]). Only the database and the ledger are shared.
//!
//! Without PostgreSQL binaries these tests print a SKIP outside CI and fail in CI (`CI=true`).

use crate::common::bin;
use crate::common::mcp::{
    Gate, KEY_PREFIX, Served, answered_or_in_progress, code, codex, concurrent_spends, env_of, fox,
    gateway_args, handle, paid_within_budget, receipt, replayed_or_not as replayed,
    spend_in_background,
};
use crate::common::provider;
use crate::pg::PgCluster;
use callid::jsonrpc::Response;
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A PostgreSQL cluster, the shared ledger, and the replicas' files.
struct World {
    dir: tempfile::TempDir,
    pg: PgCluster,
}

impl World {
    fn new(test: &str) -> Option<World> {
        Some(World {
            pg: PgCluster::start(test)?,
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ledger(&self) -> PathBuf {
        self.path("ledger.sqlite3")
    }

    fn charges(&self) -> Vec<callid::provider::ChargeRecord> {
        provider::charges(&self.ledger())
    }

    /// A policy file: `text` as YAML.
    fn policy(&self, text: &str) -> String {
        let path = self.path("policy.yaml");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Starts a gateway replica on the shared database (`CALLID_REGISTRY`) in front of its own
    /// `callid provider --mcp` on the shared ledger.
    async fn gateway(&self, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let args = gateway_args(None, extra, &self.ledger());
        let url = self.pg.url();
        let env = env_of(&[("CALLID_LOG", "debug"), ("CALLID_REGISTRY", &url)], envs);
        Served::start("the gateway replica", &bin(), &args, &env, None).await
    }

    /// `callid router SUBCOMMAND ... --registry URL`.
    fn operator(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin())
            .arg("router")
            .args(args)
            .args(["--registry", &self.pg.url()])
            .output()
            .unwrap()
    }

    fn handle_of(&self, call_id: &str) -> String {
        self.pg.sql(
            "callid",
            &format!("SELECT handle FROM callid_operations WHERE harness_call_id = '{call_id}'"),
        )
    }
}

/// Replica `g` spends the fox as call `call_id`.
async fn spend(g: &Served, call_id: &str) -> Response {
    g.spend(fox(), codex(call_id)).await
}

/// [`spend`] until no other replica's dispatch of the call is live.
async fn spend_until_settled(g: &Served, call_id: &str) -> (Response, Duration) {
    g.spend_until_settled(codex(call_id), Duration::from_secs(60))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateway_replicas_32_deliveries_of_one_call_charge_once() {
    let Some(w) = World::new("three_gateway_replicas_32_deliveries_of_one_call_charge_once") else {
        return;
    };
    let replicas = [
        w.gateway(&[], &[]).await,
        w.gateway(&[], &[]).await,
        w.gateway(&[], &[]).await,
    ];
    let conns = replicas.each_ref().map(|r| r.conn.clone());
    let replies = concurrent_spends(&conns, 32, |_| codex("burst")).await;
    let done: Vec<Value> = answered_or_in_progress(replies)
        .iter()
        .map(receipt)
        .collect();
    assert!(!done.is_empty());
    let charges = w.charges();
    assert_eq!(charges.len(), 1, "one charge across three gateway replicas");
    assert!(done.iter().all(|d| d == &done[0]));
    assert_eq!(done[0]["charge_id"], json!(charges[0].charge_id));
    for r in &replicas {
        let (again, _) = spend_until_settled(r, "burst").await;
        assert_eq!(receipt(&again), done[0]);
        assert!(replayed(&again));
    }
    assert_eq!(w.charges().len(), 1);
    assert_eq!(
        w.pg.sql("callid", "SELECT count(*) FROM callid_operations"),
        "1"
    );
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test]
async fn a_gateway_replica_killed_holding_a_dispatch_is_taken_over_with_one_charge() {
    let Some(w) = World::new("a_gateway_replica_killed_holding_a_dispatch") else {
        return;
    };
    let survivor = w.gateway(&[], &[]).await;
    let mut takeovers = vec![];
    // Killed by the crash point at each boundary the gateway passes.
    for boundary in [
        Boundary::AfterRowCommit,
        Boundary::BeforeResultRecorded,
        Boundary::BeforeReply,
    ] {
        let name = boundary.name();
        let call = format!("crash-{name}");
        let before = w.charges().len();
        let mut doomed = w
            .gateway(&[], &[(callid::testing::crashpoint::ENV, name)])
            .await;
        doomed.spend_and_die(codex(&call), name).await;
        let row = w.handle_of(&call);
        assert!(!row.is_empty(), "{name}: the row is committed first");
        let (again, took) = spend_until_settled(&survivor, &call).await;
        takeovers.push(took);
        let r = receipt(&again);
        assert_eq!(handle(&again), row, "{name}: same handle");
        assert_eq!(w.charges().len(), before + 1, "{name}: one charge");
        assert_eq!(
            r["charge_id"],
            json!(w.charges().last().unwrap().charge_id),
            "{name}: the original charge"
        );
        assert_eq!(
            replayed(&again),
            boundary == Boundary::BeforeReply,
            "{name}"
        );
        let (third, _) = spend_until_settled(&survivor, &call).await;
        assert_eq!(receipt(&third), r, "{name}");
        assert!(replayed(&third), "{name}");
    }

    // kill -9 while the replica holds the dispatch lease (paused after the upstream charged,
    // before the result is recorded): another replica takes the lease over once the server
    // sees the dead replica's connection drop, and re-sends under the same key.
    let gate = Gate::new(w.path("gate"), Boundary::AfterProviderCharge.name());
    let mut holder = w.gateway(&[], &[gate.env()]).await;
    let call = spend_in_background(&holder.conn, codex("held"));
    gate.reached().await;
    let before = w.charges().len();
    assert_eq!(
        w.pg.sql(
            "callid",
            "SELECT count(*) FROM callid_operations
             WHERE harness_call_id = 'held' AND lease_owner IS NOT NULL"
        ),
        "1",
        "the paused replica holds the lease"
    );
    let busy = spend(&survivor, "held").await;
    assert_eq!(code(&busy), "operation_in_progress", "{}", busy.raw);
    holder.child.kill9().await.unwrap();
    holder.child.wait().await.unwrap();
    assert!(call.await.unwrap().is_err());
    gate.open();
    let (again, took) = spend_until_settled(&survivor, "held").await;
    takeovers.push(took);
    assert_eq!(handle(&again), w.handle_of("held"), "same handle");
    assert_eq!(
        w.charges().len(),
        before,
        "the upstream's one charge, replayed"
    );
    assert_eq!(
        receipt(&again)["charge_id"],
        json!(w.charges().last().unwrap().charge_id)
    );
    eprintln!("gateway takeover after kill -9 (first settled redelivery): {takeovers:?}");
    survivor.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_race_across_gateway_replicas_never_overspends() {
    let Some(w) = World::new("a_budget_race_across_gateway_replicas_never_overspends") else {
        return;
    };
    let policy = w.policy("budget_cents: 9\ntools:\n  generate_image:\n    price_cents: 3\n");
    let flags = ["--policy", policy.as_str()];
    let replicas = [
        w.gateway(&flags, &[]).await,
        w.gateway(&flags, &[]).await,
        w.gateway(&flags, &[]).await,
    ];
    let conns = replicas.each_ref().map(|r| r.conn.clone());
    let replies = concurrent_spends(&conns, 12, |i| codex(&format!("budget-{i}"))).await;
    let ok = paid_within_budget(&replies);
    assert_eq!(ok, 3, "a 9-cent budget pays for three 3-cent calls");
    assert_eq!(w.charges().len(), 3);
    assert_eq!(
        w.pg.sql("callid", "SELECT count(*) FROM callid_operations"),
        "3",
        "a refused spend records nothing"
    );
    // A spend already recorded is replayed, never refused by the spent budget.
    let recorded = w.pg.sql(
        "callid",
        "SELECT harness_call_id FROM callid_operations ORDER BY harness_call_id LIMIT 1",
    );
    for r in &replicas {
        let again = spend(r, &recorded).await;
        receipt(&again);
        assert!(replayed(&again));
    }
    assert_eq!(w.charges().len(), 3);
    // The running total the budgeted insert reads (kept by triggers, in stripes) agrees with a
    // sum over every completed operation.
    assert_eq!(
        w.pg.sql(
            "callid",
            "SELECT (SELECT SUM(completed_cents) FROM callid_installation_totals)
                 || ' ' || (SELECT SUM(COALESCE(charged_cents, amount_cents))
                     FROM callid_operations WHERE status = 'completed')"
        ),
        "9 9"
    );
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test]
async fn approvals_on_a_gateway_database_hold_on_every_replica() {
    let Some(w) = World::new("approvals_on_a_gateway_database_hold_on_every_replica") else {
        return;
    };
    let policy =
        w.policy("approval_above_cents: 2\ntools:\n  generate_image:\n    price_cents: 5\n");
    let flags = ["--policy", policy.as_str()];
    let a = w.gateway(&flags, &[]).await;
    let b = w.gateway(&flags, &[]).await;

    let waiting = spend(&a, "needs-ok").await;
    assert_eq!(code(&waiting), "awaiting_approval");
    let h = handle(&waiting);
    let hint = format!("callid router approve {h} --registry {}", w.pg.url());
    assert!(waiting.raw.contains(&hint), "{}", waiting.raw);
    assert_eq!(code(&spend(&b, "needs-ok").await), "awaiting_approval");
    let status = w.operator(&["status", &h]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(text.contains("awaiting_approval"), "{text}");
    assert!(!text.contains(KEY_PREFIX), "{text}");

    let out = w.operator(&["approve", &h]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        w.charges().is_empty(),
        "an approval alone dispatches nothing"
    );
    let resumed = b.call("resume_operation", json!({"handle": h}), None).await;
    let r = receipt(&resumed);
    assert_eq!(w.charges().len(), 1);
    let again = spend(&a, "needs-ok").await;
    assert_eq!(receipt(&again), r);
    assert!(replayed(&again));
    let status = w.operator(&["status", &h]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("completed"));

    let refused = spend(&b, "not-ok").await;
    let h2 = handle(&refused);
    let out = w.operator(&["deny", &h2, "--reason", "too dear"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for g in [&a, &b] {
        let after = spend(g, "not-ok").await;
        assert_eq!(code(&after), "operation_denied", "{}", after.raw);
        assert!(after.raw.contains("too dear"), "{}", after.raw);
    }
    let twice = w.operator(&["approve", &h2]);
    assert!(!twice.status.success());
    assert_eq!(w.charges().len(), 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_database_restart_fails_gateway_spends_closed_then_recovers() {
    let Some(w) = World::new("a_database_restart_fails_gateway_spends_closed_then_recovers") else {
        return;
    };
    let policy = w.policy("budget_cents: 100\ntools:\n  generate_image:\n    price_cents: 3\n");
    let flags = ["--policy", policy.as_str()];
    let a = w.gateway(&flags, &[]).await;
    let b = w.gateway(&flags, &[]).await;
    let first = spend(&a, "before").await;
    let first = receipt(&first);
    assert_eq!(w.charges().len(), 1);

    w.pg.stop_server();
    // The replica that completed "before" answers its redelivery from its cache of completed
    // replies (results are immutable; the per-delivery checks still run): the original result,
    // no charge. Everything that needs the database fails closed.
    let cached = spend(&a, "before").await;
    assert_eq!(receipt(&cached), first);
    assert!(replayed(&cached), "{}", cached.raw);
    for (g, calls) in [
        (&a, &["while-down"][..]),
        (&b, &["while-down", "before"][..]),
    ] {
        for &call in calls {
            let down = spend(g, call).await;
            assert_eq!(code(&down), "registry_unavailable", "{}", down.raw);
            let message = down.structured().unwrap()["message"].as_str().unwrap();
            assert!(message.contains(&w.pg.url()), "names the URL: {message}");
            assert!(
                message.contains("retrying with the same call is safe"),
                "{message}"
            );
        }
    }
    assert_eq!(
        w.charges().len(),
        1,
        "nothing dispatched while the database is down"
    );

    w.pg.start_server();
    let (up, _) = spend_until_settled(&b, "while-down").await;
    let up = receipt(&up);
    assert_eq!(w.charges().len(), 2);
    let (replay, _) = spend_until_settled(&a, "while-down").await;
    assert_eq!(receipt(&replay), up);
    assert!(replayed(&replay));
    let (old, _) = spend_until_settled(&b, "before").await;
    assert_eq!(receipt(&old), first);
    assert_eq!(w.charges().len(), 2);
    a.stop().await;
    b.stop().await;
}

/// A URL whose TLS cannot be honoured (`verify-full` without the CA to verify against) is
/// refused before anything connects, never downgraded. Needs no server (`tests/it/pg_tls.rs`
/// has the TLS tests that do).
#[test]
fn a_registry_url_asking_for_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let url = "postgres://callid:hunter2@127.0.0.1:9/callid?sslmode=verify-full";
    let gateway = Command::new(bin())
        .args([
            "gateway",
            "--registry",
            url,
            "--spend",
            "generate_image",
            "--",
        ])
        .arg(bin())
        .args(["provider", "--mcp", "--ledger"])
        .arg(&ledger)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let router = Command::new(bin())
        .args(["router", "status", "h", "--registry", url])
        .output()
        .unwrap();
    for out in [gateway, router] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("`sslmode=verify-full` checks"), "{stderr}");
        assert!(stderr.contains("`sslrootcert=PATH`"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    assert!(!ledger.exists(), "refused before the upstream started");
}
