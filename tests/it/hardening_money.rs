//! Router hardening around the charge (issue 9, items 2 to 8): honest errors after a dispatch, a
//! corrupt backend state file, overcharges, refusals and reservations, tenants kept apart, the
//! built-in platforms, and dispatch leases of a predecessor with the same PID. Every test runs the
//! real `callid router` binary on real SQLite files, with a provider on 127.0.0.1.

use crate::common::mcp::{
    Gate, KEY_PREFIX, Served, code, completed, env_of, fox, next_id, replayed, spend_in_background,
    structured_handle as handle,
};
use crate::common::provider;
use crate::common::{bin, callid_ok};
use callid::jsonrpc::Response;
use callid::provider::{HookAction, ProviderHandle, ProviderHooks};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A temp directory with a registry directory and a provider (callid's, or a test double).
struct World {
    dir: tempfile::TempDir,
    provider_url: String,
    ledger: PathBuf,
    _provider: Option<ProviderHandle>,
}

impl World {
    async fn new(hooks: Option<Arc<dyn ProviderHooks>>) -> World {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("provider-ledger.sqlite3");
        let provider = provider::spawn(&ledger, hooks).await;
        World {
            dir,
            provider_url: provider.base_url(),
            ledger,
            _provider: Some(provider),
        }
    }

    fn registry(&self) -> PathBuf {
        let d = self.dir.path().join("state");
        std::fs::create_dir_all(&d).unwrap();
        d.join("registry.sqlite3")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn charges(&self) -> u64 {
        provider::charge_count(&self.ledger)
    }

    async fn router(&self, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        self.router_with(&self.provider_url, extra, envs).await
    }

    async fn router_with(&self, provider: &str, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let mut args = vec![
            "router".to_string(),
            "--registry".into(),
            self.registry().display().to_string(),
            "--provider-url".into(),
            provider.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let env = env_of(&[("CALLID_LOG", "debug")], envs);
        let timeout = Some(Duration::from_secs(120));
        Served::start("the router", &bin(), &args, &env, timeout).await
    }
}

fn codex(id: &str) -> Value {
    json!({"callId": id})
}

fn envelope(platform: &str, invocation: &str, installation: Option<&str>) -> Value {
    let mut e = json!({"platform": platform, "invocation_id": invocation});
    if let Some(i) = installation {
        e["installation_id"] = json!(i);
    }
    json!({"hubu.dev/platform-invocation": e})
}

fn message(r: &Response) -> &str {
    r.structured().unwrap()["message"].as_str().unwrap()
}

/// Item 2: the registry's write lock is held by another connection from the moment the
/// provider charged until after the router's busy timeout; the reply must carry the handle and
/// `outcome_unknown`, never "nothing was dispatched", and redelivering the same call settles it.
#[tokio::test]
async fn a_result_that_cannot_be_recorded_after_the_charge_says_so_and_redelivery_settles_it() {
    let w = World::new(None).await;
    let gate = Gate::new(w.path("gate"), "before_result_recorded");
    let r = w.router(&[], &[gate.env()]).await;
    let pending = spend_in_background(&r.conn, codex("locked"));
    gate.reached().await;
    assert_eq!(
        w.charges(),
        1,
        "the provider charged before the pause point"
    );
    let lock = rusqlite::Connection::open(w.registry()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    gate.open();
    let reply = pending.await.unwrap().unwrap();
    assert!(!reply.raw.contains(KEY_PREFIX));
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    assert_eq!(code(&reply), "outcome_unknown", "{}", reply.raw);
    let text = message(&reply);
    assert!(!text.contains("nothing was dispatched"), "{text}");
    assert!(text.contains("redeliver this same call"), "{text}");
    assert!(text.contains("charged 3 cents"), "{text}");
    assert_eq!(reply.structured().unwrap()["status"], "pending");
    let h = handle(&reply);
    let status = r.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(status.structured().unwrap()["status"], "pending");

    let again = r.spend(fox(), codex("locked")).await;
    let s = completed(&again);
    assert_eq!(s["handle"], json!(h));
    assert_eq!(s["result"]["amount_cents"], 3);
    let charge_ids = provider::charge_ids(&w.ledger);
    assert_eq!(s["result"]["charge_id"], json!(charge_ids[0]));
    assert_eq!(
        w.charges(),
        1,
        "redelivery settled it without a second charge"
    );
    assert!(replayed(&r.spend(fox(), codex("locked")).await));
    r.stop().await;
}

/// Item 3: a garbage `authorization.sqlite3` is a distinct, non-retryable code naming the file
/// and the cause; nothing is dispatched; once the operator restores the file the same call runs.
#[tokio::test]
async fn a_corrupt_backend_state_file_fails_closed_with_its_own_code() {
    let w = World::new(None).await;
    let auth = w.registry().with_file_name("authorization.sqlite3");
    std::fs::write(
        &auth,
        b"not a database at all, somebody overwrote it\n".repeat(200),
    )
    .unwrap();
    // Private, as callid leaves it: a file open to other users is refused for that first.
    std::fs::set_permissions(&auth, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = w.router(&[], &[]).await;
    for _ in 0..2 {
        let resp = r.spend(fox(), codex("corrupt-1")).await;
        assert_eq!(code(&resp), "backend_state_corrupt", "{}", resp.raw);
        let text = message(&resp);
        assert!(text.contains(&auth.display().to_string()), "{text}");
        assert!(text.contains("not a SQLite database"), "{text}");
        assert!(text.contains("do not retry"), "{text}");
        assert!(!text.contains("retry later"), "{text}");
    }
    assert_eq!(w.charges(), 0);
    // The operator moves the broken file away: the same call now runs, once.
    std::fs::rename(&auth, w.path("authorization.broken")).unwrap();
    let ok = r.spend(fox(), codex("corrupt-1")).await;
    completed(&ok);
    assert_eq!(w.charges(), 1);
    let log = r.stop().await;
    assert!(
        log.contains("backend state is corrupt") && log.contains("authorization"),
        "{log}"
    );
}

/// A recorded call is answered from its record even when it could no longer be quoted today:
/// a restarted router (its reply cache empty) whose backend state is broken answers the
/// completed call's redelivery with its recorded result, and only a new call with the error.
#[tokio::test]
async fn a_redelivery_that_can_no_longer_be_quoted_gets_its_recorded_result() {
    let w = World::new(None).await;
    let r = w.router(&[], &[]).await;
    let first = r.spend(fox(), codex("quoted-1")).await;
    let receipt = completed(&first).clone();
    r.stop().await;
    let auth = w.registry().with_file_name("authorization.sqlite3");
    std::fs::write(&auth, b"not a database at all\n".repeat(200)).unwrap();
    std::fs::set_permissions(&auth, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = w.router(&[], &[]).await;
    let again = r.spend(fox(), codex("quoted-1")).await;
    assert_eq!(completed(&again), &receipt, "{}", again.raw);
    assert!(replayed(&again));
    let new = r.spend(fox(), codex("quoted-2")).await;
    assert_eq!(code(&new), "backend_state_corrupt", "{}", new.raw);
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

/// A provider that ignores `max_amount_cents` and charges 500 cents per image; it records the
/// maximum each request carried.
async fn overcharging_provider() -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let seen: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
    let sink = seen.clone();
    let counter = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/v1/images",
        post(move |axum::Json(body): axum::Json<Value>| {
            let sink = sink.clone();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                sink.lock().unwrap().push(body.clone());
                axum::Json(json!({
                    "charge_id": format!("ch_{n:032x}"),
                    "amount_cents": 500,
                    "model": body["model"],
                    "image": {"id": format!("img_{n}"), "width": 1024, "height": 1024,
                              "sha256": "00"},
                    "created_at": "2026-01-01T00:00:00.000Z",
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// Item 4: the authorized maximum is sent; an overcharge is recorded at the receipt's amount,
/// marked on the operation, debited from the budget, and further spends are refused.
#[tokio::test]
async fn an_overcharge_is_recorded_marked_and_debited_and_stops_further_spends() {
    let w = World::new(None).await;
    let (url, seen) = overcharging_provider().await;
    let r = w.router_with(&url, &["--budget-cents", "10"], &[]).await;
    let first = r.spend(fox(), codex("over-1")).await;
    let s = completed(&first).clone();
    assert_eq!(s["result"]["amount_cents"], 500);
    assert_eq!(
        s["result"]["overcharge"],
        json!({"authorized_cents": 3, "charged_cents": 500})
    );
    let text = first.tool_result().unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("WARNING"), "{text}");
    assert_eq!(seen.lock().unwrap()[0]["max_amount_cents"], 3);
    let h = handle(&first);
    let status = r.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(
        status.structured().unwrap()["overcharge"],
        json!({"authorized_cents": 3, "charged_cents": 500})
    );
    // The budget is used up by the real charge: the next spend is refused before the provider.
    let next = r.spend(fox(), codex("over-2")).await;
    assert_eq!(code(&next), "budget_exceeded", "{}", next.raw);
    assert!(
        message(&next).contains("0 of 10 cents left"),
        "{}",
        message(&next)
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    // A redelivery replays the marked result.
    let again = r.spend(fox(), codex("over-1")).await;
    assert!(replayed(&again));
    assert_eq!(completed(&again), &s);
    r.stop().await;
    let reg = w.registry();
    let out = callid_ok(
        &["router", "status", &h, "--registry", reg.to_str().unwrap()],
        &[],
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["charged_cents"], 500);
    assert_eq!(
        shown["overcharge"],
        json!({"authorized_cents": 3, "charged_cents": 500})
    );
}

/// Item 4: callid's own provider refuses to charge above the maximum it is sent.
#[tokio::test]
async fn the_provider_refuses_a_charge_above_the_sent_maximum() {
    let w = World::new(None).await;
    let client = callid::provider::Client::new(w.provider_url.clone()).unwrap();
    let mut req = callid::provider::ImageRequest::new("fox");
    req.model = "flux-pro".into();
    req.max_amount_cents = Some(24);
    let err = client.post_image("k-1", &req).await.unwrap_err();
    assert_eq!(err.status(), 422, "{err}");
    assert!(err.to_string().contains("amount_above_maximum"), "{err}");
    assert_eq!(w.charges(), 0);
    req.max_amount_cents = Some(25);
    let ok = client.post_image("k-1", &req).await.unwrap();
    assert_eq!(ok.receipt.amount_cents, 25);
    assert_eq!(w.charges(), 1);
}

/// Refuses the first `n` charges with HTTP 422, as a provider's content filter would.
struct RefuseFirst {
    left: AtomicUsize,
}

impl ProviderHooks for RefuseFirst {
    fn before_charge(&self, _key: &str) -> HookAction {
        match self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        {
            Ok(_) => HookAction::Fail(422),
            Err(_) => HookAction::Proceed,
        }
    }
}

/// Item 5: refused spends give their reservation back; two refusals no longer block the next
/// ordinary spend.
#[tokio::test]
async fn provider_refusals_release_their_budget_reservation() {
    let hooks = Arc::new(RefuseFirst {
        left: AtomicUsize::new(2),
    });
    let w = World::new(Some(hooks)).await;
    let r = w.router(&["--budget-cents", "6"], &[]).await;
    for id in ["refused-1", "refused-2"] {
        let resp = r
            .spend(json!({"prompt": "something the filter refuses"}), codex(id))
            .await;
        assert_eq!(code(&resp), "provider_error", "{}", resp.raw);
        assert_eq!(resp.structured().unwrap()["status"], "failed");
    }
    for id in ["ok-1", "ok-2"] {
        let ok = r.spend(fox(), codex(id)).await;
        completed(&ok);
    }
    assert_eq!(w.charges(), 2);
    let over = r.spend(fox(), codex("ok-3")).await;
    assert_eq!(code(&over), "budget_exceeded");
    r.stop().await;
}

/// Item 5: a reservation whose provider call never started (the provider could not be reached)
/// holds its budget only until it expires (`reservation_expiry_seconds`); the operation's late
/// redelivery reserves again, within the budget.
#[tokio::test]
async fn reservations_of_unreachable_spends_expire() {
    let w = World::new(None).await;
    // A port nothing listens on: every provider call fails to connect.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let r = w.router_with(&dead, &["--budget-cents", "3"], &[]).await;
    let down = r.spend(fox(), codex("unreachable")).await;
    assert_eq!(code(&down), "provider_unavailable", "{}", down.raw);
    assert_eq!(down.structured().unwrap()["status"], "pending");
    // With the default expiry (an hour) the reservation holds the whole budget.
    let blocked = r.spend(fox(), codex("blocked")).await;
    assert_eq!(code(&blocked), "budget_exceeded");
    r.stop().await;

    let policy = w.path("policy.yaml");
    std::fs::write(&policy, "budget_cents: 3\nreservation_expiry_seconds: 1\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = w
        .router(&["--policy", &policy.display().to_string()], &[])
        .await;
    let ok = r.spend(fox(), codex("after-expiry")).await;
    completed(&ok);
    // The unreachable call, redelivered now, must fit in the budget again: it does not.
    let late = r.spend(fox(), codex("unreachable")).await;
    assert_eq!(code(&late), "budget_exceeded", "{}", late.raw);
    assert_eq!(handle(&late), handle(&down));
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

/// Item 6: two installations of one platform sending the same invocation id are two operations;
/// neither replays nor blocks the other.
#[tokio::test]
async fn two_envelope_installations_with_one_invocation_id_are_two_operations() {
    let w = World::new(None).await;
    let r = w.router(&[], &[]).await;
    let a = r
        .spend(fox(), envelope("hubu", "inv-1", Some("tenant-a")))
        .await;
    let b = r
        .spend(fox(), envelope("hubu", "inv-1", Some("tenant-b")))
        .await;
    let c = r
        .spend(
            json!({"prompt": "a paper crane"}),
            envelope("hubu", "inv-1", Some("tenant-c")),
        )
        .await;
    let none = r.spend(fox(), envelope("hubu", "inv-1", None)).await;
    for x in [&a, &b, &c, &none] {
        assert!(!replayed(x), "{}", x.raw);
    }
    let handles: std::collections::BTreeSet<String> =
        [&a, &b, &c, &none].iter().map(|x| handle(x)).collect();
    assert_eq!(handles.len(), 4);
    assert_ne!(
        completed(&a)["result"]["charge_id"],
        completed(&b)["result"]["charge_id"]
    );
    assert_eq!(w.charges(), 4);
    // Each tenant's redelivery gets its own result.
    let again = r
        .spend(fox(), envelope("hubu", "inv-1", Some("tenant-b")))
        .await;
    assert!(replayed(&again));
    assert_eq!(completed(&again), completed(&b));
    assert_eq!(w.charges(), 4);
    r.stop().await;
}

/// Item 7: an envelope cannot claim a built-in platform, so it can never reach the rows of a real
/// Codex `callId` or Claude Code `toolUseId`.
#[tokio::test]
async fn an_envelope_cannot_claim_a_built_in_platform() {
    let w = World::new(None).await;
    let r = w.router(&[], &[]).await;
    let real = r.spend(fox(), codex("call_X")).await;
    completed(&real);
    let claude = r
        .spend(fox(), json!({"claudecode/toolUseId": "toolu_X"}))
        .await;
    completed(&claude);
    for (platform, id) in [
        ("codex", "call_X"),
        ("claude-code", "toolu_X"),
        ("CODEX", "call_X"),
    ] {
        let forged = r.spend(fox(), envelope(platform, id, None)).await;
        assert_eq!(code(&forged), "invalid_identity", "{platform}");
        assert!(
            message(&forged).contains("built-in"),
            "{}",
            message(&forged)
        );
        assert!(forged.structured().unwrap().get("handle").is_none());
    }
    assert_eq!(w.charges(), 2);
    r.stop().await;
}

fn process_start(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// Item 8: a predecessor crashed while holding a dispatch lease, and the new router happens to
/// have its PID (PID 1 in a container): the lease belongs to another instance id, which is gone,
/// so the new router takes it over at once instead of answering `operation_in_progress`.
#[tokio::test]
async fn a_lease_left_by_a_crashed_predecessor_with_the_same_pid_is_taken_over() {
    let w = World::new(None).await;
    let mut crashing = w
        .router(
            &[],
            &[(callid::testing::crashpoint::ENV, "after_authorization")],
        )
        .await;
    let died = crashing
        .conn
        .call_tool(next_id(), "generate_image", fox(), Some(codex("lease")))
        .await;
    assert!(died.is_err(), "the router should have died: {died:?}");
    crashing.child.wait().await.unwrap();

    let r = w.router(&[], &[]).await;
    let pid = r.child.pid().unwrap();
    let owner = format!("{pid}:{}:predecessor-instance", process_start(pid));
    let far = callid::testing::now_ms() + 600_000;
    let changed = rusqlite::Connection::open(w.registry())
        .unwrap()
        .execute(
            "UPDATE operations SET lease_owner = ?1, lease_expires_ms = ?2 \
             WHERE harness_call_id = 'lease' AND status = 'pending'",
            rusqlite::params![owner, far],
        )
        .unwrap();
    assert_eq!(changed, 1, "the crash left a pending row with a lease");
    let again = r.spend(fox(), codex("lease")).await;
    completed(&again);
    assert!(!replayed(&again));
    assert_eq!(w.charges(), 1);
    r.stop().await;
}
