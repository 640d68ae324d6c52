//! Integration tests of `callid router`: the real binary, real SQLite files, a real provider on
//! 127.0.0.1 (the provider module served in this test process, with its own ledger), and the
//! hand-written JSON-RPC client. Every response any test receives is scanned for the private key
//! prefix.

use crate::common::mcp::{
    HANDLE_PREFIX, KEY_PREFIX, Served, assert_clean, code, codex_in_session as codex,
    concurrent_spends, env_of, fox, next_id, owned, replayed, spawn_http,
    structured_handle as handle,
};
use crate::common::provider;
use crate::common::{bin, registry_handle};
use callid::jsonrpc::{Connection, Response};
use callid::provider::ProviderHandle;
use callid::testing::crashpoint::Boundary;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A temp directory, a provider with its ledger, and one or more router registries.
struct World {
    dir: tempfile::TempDir,
    provider: Option<ProviderHandle>,
    provider_addr: std::net::SocketAddr,
    ledger: PathBuf,
    /// Routers run the provider in-process (no `--provider-url`), its ledger beside the default
    /// registry.
    in_process: bool,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("provider-ledger.sqlite3");
        let provider = provider::spawn(&ledger, None).await;
        World {
            dir,
            provider_addr: provider.addr(),
            provider: Some(provider),
            ledger,
            in_process: false,
        }
    }

    async fn in_process() -> World {
        let mut w = World::new().await;
        w.in_process = true;
        w.ledger = w
            .registry()
            .with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
        w
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The default registry of this world: `<dir>/r1/registry.sqlite3`.
    fn registry(&self) -> PathBuf {
        self.registry_in("r1")
    }

    fn registry_in(&self, sub: &str) -> PathBuf {
        let d = self.path(sub);
        std::fs::create_dir_all(&d).unwrap();
        d.join("registry.sqlite3")
    }

    fn provider_url(&self) -> String {
        format!("http://{}", self.provider_addr)
    }

    fn charges(&self) -> u64 {
        provider::charge_count_or_zero(&self.ledger)
    }

    fn charge_ids(&self) -> Vec<String> {
        provider::charge_ids(&self.ledger)
    }

    async fn stop_provider(&mut self) {
        if let Some(p) = self.provider.take() {
            p.shutdown().await.unwrap();
        }
    }

    async fn restart_provider(&mut self) {
        self.provider = Some(provider::respawn(self.provider_addr, &self.ledger).await);
    }

    /// Starts a router on `registry` with `extra` flags and `envs`, and initializes it.
    async fn router_on(&self, registry: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Served {
        let mut args = vec![
            "router".to_string(),
            "--registry".into(),
            registry.display().to_string(),
        ];
        if !self.in_process {
            args.extend(["--provider-url".into(), self.provider_url()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let env = env_of(&[("CALLID_LOG", "debug")], envs);
        Served::start("the router", &bin(), &args, &env, None).await
    }

    async fn router(&self, extra: &[&str]) -> Served {
        self.router_on(&self.registry(), extra, &[]).await
    }
}

/// A completed spend's structured reply, which names a public handle.
fn completed(r: &Response) -> &Value {
    let s = crate::common::mcp::completed(r);
    assert!(s["handle"].as_str().unwrap().starts_with(HANDLE_PREFIX));
    s
}

#[tokio::test]
async fn new_call_then_redelivery_is_replayed_without_a_second_charge() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let first = r.spend(fox(), codex("call_1")).await;
    let s1 = completed(&first).clone();
    assert!(!replayed(&first));
    assert_eq!(s1["result"]["amount_cents"], 3);
    assert_eq!(s1["result"]["model"], "flux-schnell");
    assert_eq!(w.charges(), 1);
    assert_eq!(s1["result"]["charge_id"], json!(w.charge_ids()[0]));
    // The same call delivered again with a new JSON-RPC id, on the same connection.
    let again = r.spend(fox(), codex("call_1")).await;
    assert_eq!(completed(&again), &s1);
    assert!(replayed(&again));
    r.stop().await;
    // ... and after a restart, on a new connection.
    let r = w.router(&[]).await;
    let later = r.spend(fox(), codex("call_1")).await;
    assert_eq!(completed(&later), &s1);
    assert!(replayed(&later));
    let status = r
        .call("operation_status", json!({"handle": s1["handle"]}), None)
        .await;
    assert_eq!(status.structured().unwrap()["status"], "completed");
    assert_eq!(status.structured().unwrap()["result"], s1["result"]);
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

#[tokio::test]
async fn same_arguments_with_a_new_call_id_is_a_second_operation() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let a = r.spend(fox(), codex("call_a")).await;
    let b = r.spend(fox(), codex("call_b")).await;
    assert!(!replayed(&a) && !replayed(&b));
    assert_ne!(handle(&a), handle(&b));
    assert_ne!(
        completed(&a)["result"]["charge_id"],
        completed(&b)["result"]["charge_id"]
    );
    assert_eq!(w.charges(), 2);
    r.stop().await;
}

#[tokio::test]
async fn reused_call_id_with_other_arguments_is_refused_before_the_backend() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let a = r.spend(fox(), codex("call_r")).await;
    let h = handle(&a);
    for other in [
        json!({"prompt": "a paper crane"}),
        json!({"prompt": "an origami fox", "width": 512}),
        json!({"prompt": "an origami fox", "model": "flux-pro"}),
    ] {
        let m = r.spend(other, codex("call_r")).await;
        assert_eq!(code(&m), "request_mismatch");
        assert_eq!(m.structured().unwrap()["handle"], json!(h));
    }
    assert_eq!(w.charges(), 1);
    // Same value, other spelling: the canonical hash is the same, so this is a redelivery.
    let same = r
        .spend(json!({"prompt": "an origami fox"}), codex("call_r"))
        .await;
    assert!(replayed(&same));
    r.stop().await;
}

#[tokio::test]
async fn identity_is_required_exactly_once_and_well_formed() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let long = "x".repeat(513);
    let cases: Vec<(&str, Option<Value>, &str)> = vec![
        ("no _meta", None, "missing_identity"),
        (
            "only session context (ChatGPT chat)",
            Some(json!({"openai/session": "s", "openai/subject": "u", "progressToken": 0})),
            "missing_identity",
        ),
        (
            "callId and toolUseId",
            Some(json!({"callId": "c1", "claudecode/toolUseId": "t1"})),
            "ambiguous_identity",
        ),
        (
            "callId and envelope",
            Some(
                json!({"callId": "c1", "hubu.dev/platform-invocation": {"platform": "p", "invocation_id": "i"}}),
            ),
            "ambiguous_identity",
        ),
        (
            "empty callId",
            Some(json!({"callId": ""})),
            "invalid_identity",
        ),
        (
            "numeric callId",
            Some(json!({"callId": 7})),
            "invalid_identity",
        ),
        (
            "513-byte callId",
            Some(json!({"callId": long})),
            "invalid_identity",
        ),
        (
            "padded toolUseId",
            Some(json!({"claudecode/toolUseId": " t1"})),
            "invalid_identity",
        ),
        (
            "envelope without invocation_id",
            Some(json!({"hubu.dev/platform-invocation": {"platform": "hubu"}})),
            "invalid_identity",
        ),
        (
            "envelope with a bad platform",
            Some(
                json!({"hubu.dev/platform-invocation": {"platform": "a b", "invocation_id": "i"}}),
            ),
            "invalid_identity",
        ),
    ];
    let mut report = String::new();
    for (name, meta, want) in cases {
        let resp = r.call("generate_image", fox(), meta).await;
        assert_eq!(code(&resp), want, "{name}");
        assert!(resp.structured().unwrap().get("handle").is_none(), "{name}");
        report.push_str(&format!(
            "{name}: {}\n  {}\n",
            code(&resp),
            resp.structured().unwrap()["message"].as_str().unwrap()
        ));
    }
    insta::assert_snapshot!("identity_errors", report);
    assert_eq!(w.charges(), 0);
    r.stop().await;
}

#[tokio::test]
async fn identity_in_arguments_is_refused_for_every_name_at_any_depth() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let mut names: Vec<String> = callid::identity::FORBIDDEN_ARGUMENT_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.extend(
        [
            "operation_key",
            "callId",
            "tool_use_id",
            "claudecode/toolUseId",
            "hubu.dev/platform-invocation",
            "_meta",
            "Idempotency-Key",
            "task_id",
        ]
        .map(String::from),
    );
    for name in &names {
        let mut flat = fox();
        flat[name.as_str()] = json!("k-1");
        let nested =
            json!({"prompt": "fox", "style": {"layers": [{"ok": 1}, {name.as_str(): "k-1"}]}});
        for args in [flat, nested] {
            let resp = r.spend(args.clone(), codex(&format!("arg-{name}"))).await;
            assert_eq!(code(&resp), "identity_in_arguments", "{name}: {args}");
        }
    }
    // Refused before anything is recorded: the call id is still free for a proper call.
    let ok = r.spend(fox(), codex("arg-callId")).await;
    assert!(!replayed(&ok));
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

#[tokio::test]
async fn the_same_id_on_two_platforms_is_two_operations() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let a = r.spend(fox(), json!({"callId": "X"})).await;
    let b = r.spend(fox(), json!({"claudecode/toolUseId": "X"})).await;
    let c = r
        .spend(
            fox(),
            json!({"hubu.dev/platform-invocation": {"platform": "hubu", "invocation_id": "X"}}),
        )
        .await;
    let handles = [handle(&a), handle(&b), handle(&c)];
    assert!(handles[0] != handles[1] && handles[1] != handles[2] && handles[0] != handles[2]);
    assert!(!replayed(&a) && !replayed(&b) && !replayed(&c));
    assert_eq!(w.charges(), 3);
    r.stop().await;
}

#[tokio::test]
async fn two_installations_record_the_same_call_id_separately() {
    let w = World::new().await;
    let (r1, r2) = (w.registry_in("inst1"), w.registry_in("inst2"));
    let a = w.router_on(&r1, &[], &[]).await;
    let b = w.router_on(&r2, &[], &[]).await;
    let ra = a.spend(fox(), codex("shared")).await;
    let rb = b.spend(fox(), codex("shared")).await;
    assert!(!replayed(&ra) && !replayed(&rb));
    assert_ne!(handle(&ra), handle(&rb));
    assert_eq!(w.charges(), 2);
    a.stop().await;
    b.stop().await;
    let id = |p: &Path| -> String {
        rusqlite::Connection::open(p)
            .unwrap()
            .query_row(
                "SELECT value FROM settings WHERE name = 'installation_id'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_ne!(id(&r1), id(&r2));
}

fn walk_keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, item) in m {
                out.push(k.clone());
                walk_keys(item, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| walk_keys(i, out)),
        _ => {}
    }
}

#[tokio::test]
async fn tool_schemas_expose_no_identity_field() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let list = r
        .conn
        .request(next_id(), "tools/list", json!({}))
        .await
        .unwrap();
    assert_clean(&list);
    let tools = list.result.as_ref().unwrap()["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "generate_image",
            "operation_status",
            "resume_operation",
            "capabilities"
        ]
    );
    for tool in tools {
        let props = tool["inputSchema"]["properties"].as_object().unwrap();
        let mut keys = vec![];
        walk_keys(&tool["inputSchema"], &mut keys);
        for k in props.keys().chain(keys.iter()) {
            assert!(
                !callid::identity::is_identity_like(k),
                "`{}` exposes identity field `{k}`",
                tool["name"]
            );
        }
    }
    insta::assert_json_snapshot!("tools_list", list.result.unwrap()["tools"]);
    r.stop().await;
}

#[tokio::test]
async fn a_crash_at_any_boundary_never_charges_twice() {
    for (boundary, in_process) in Boundary::ALL
        .into_iter()
        .flat_map(|b| [(b, false), (b, true)])
    {
        let label = format!(
            "{} ({})",
            boundary.name(),
            if in_process {
                "in-process provider"
            } else {
                "provider over HTTP"
            }
        );
        let name = boundary.name();
        let w = if in_process {
            World::in_process().await
        } else {
            World::new().await
        };
        let mut r = w
            .router_on(
                &w.registry(),
                &[],
                &[(callid::testing::crashpoint::ENV, name)],
            )
            .await;
        r.spend_and_die(codex("crash"), &label).await;
        let stderr = r.child.stderr_text();
        assert!(stderr.contains(name), "{label}: {stderr}");
        assert!(!stderr.contains(KEY_PREFIX), "{label}: {stderr}");
        let before = registry_handle(&w.registry(), "crash");
        assert!(
            before.is_some(),
            "{label}: the row is committed before any dispatch"
        );
        assert!(w.charges() <= 1, "{label}");

        let r = w.router(&[]).await;
        let again = r.spend(fox(), codex("crash")).await;
        let s = completed(&again).clone();
        assert_eq!(Some(handle(&again)), before, "{label}: same handle");
        assert_eq!(w.charges(), 1, "{label}: one charge in the ledger");
        assert_eq!(
            s["result"]["charge_id"],
            json!(w.charge_ids()[0]),
            "{label}"
        );
        // The reply was lost only at `before_reply`, where the result was already recorded.
        assert_eq!(
            replayed(&again),
            boundary == Boundary::BeforeReply,
            "{label}: replayed flag"
        );
        let third = r.spend(fox(), codex("crash")).await;
        assert_eq!(completed(&third), &s, "{label}");
        assert!(replayed(&third));
        assert_eq!(w.charges(), 1, "{label}");
        r.stop().await;
    }
}

async fn burst(routers: &[&Served], n: usize, call_id: &str) -> Vec<Response> {
    let conns: Vec<Connection> = routers.iter().map(|r| r.conn.clone()).collect();
    let out = concurrent_spends(&conns, n, |_| codex(call_id)).await;
    for r in &out {
        assert_clean(r);
    }
    out
}

#[tokio::test]
async fn concurrent_deliveries_on_one_connection_dispatch_once() {
    let w = World::new().await;
    let r = w.router(&[]).await;
    let all = burst(&[&r], 32, "burst-1").await;
    let first = completed(&all[0]).clone();
    let fresh = all.iter().filter(|x| !replayed(x)).count();
    assert_eq!(fresh, 1, "exactly one delivery dispatched");
    for x in &all {
        assert_eq!(completed(x), &first);
    }
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

#[tokio::test]
async fn concurrent_deliveries_over_several_http_connections_dispatch_once() {
    let w = World::new().await;
    let (url, mut child) = http_router(&w, &w.registry()).await;
    let mut conns = vec![];
    for _ in 0..4 {
        let c = Connection::http(&url).await.unwrap();
        c.initialize(json!(0), "2025-11-25", "callid-tests", "1")
            .await
            .unwrap();
        conns.push(c);
    }
    let mut tasks = vec![];
    for i in 0..32 {
        let conn = conns[i % conns.len()].clone();
        tasks.push(tokio::spawn(async move {
            conn.call_tool(
                next_id(),
                "generate_image",
                fox(),
                Some(codex("burst-http")),
            )
            .await
            .unwrap()
        }));
    }
    let mut all = vec![];
    for t in tasks {
        let r = t.await.unwrap();
        assert_clean(&r);
        all.push(r);
    }
    let first = completed(&all[0]).clone();
    assert_eq!(all.iter().filter(|x| !replayed(x)).count(), 1);
    for x in &all {
        assert_eq!(completed(x), &first);
    }
    assert_eq!(w.charges(), 1);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn concurrent_deliveries_across_router_processes_dispatch_once() {
    let w = World::new().await;
    let a = w.router(&[]).await;
    let b = w.router(&[]).await;
    let all = burst(&[&a, &b], 32, "burst-proc").await;
    let mut handles = std::collections::BTreeSet::new();
    for x in &all {
        if x.is_tool_error() {
            // Another process holds the dispatch lease: safe to retry.
            assert_eq!(code(x), "operation_in_progress", "{}", x.raw);
        } else {
            handles.insert(handle(x));
        }
        if let Some(h) = x.structured().unwrap().get("handle") {
            handles.insert(h.as_str().unwrap().to_string());
        }
    }
    assert_eq!(handles.len(), 1, "{handles:?}");
    assert_eq!(
        all.iter()
            .filter(|x| !x.is_tool_error() && !replayed(x))
            .count(),
        1
    );
    let retry = b.spend(fox(), codex("burst-proc")).await;
    assert!(replayed(&retry));
    assert_eq!(w.charges(), 1);
    a.stop().await;
    b.stop().await;
}

async fn http_router(w: &World, registry: &Path) -> (String, tokio::process::Child) {
    let mut args = owned(&["router", "--http", "127.0.0.1:0", "--registry"]);
    args.extend([
        registry.display().to_string(),
        "--provider-url".into(),
        w.provider_url(),
    ]);
    spawn_http(&args, "callid router", Duration::from_secs(20)).await
}

fn operator(args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin())
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test]
async fn approval_makes_the_call_replay_only_until_a_person_decides() {
    let w = World::new().await;
    let reg = w.registry();
    let reg_s = reg.display().to_string();
    let r = w.router(&["--approval-above-cents", "2"]).await;
    let first = r.spend(fox(), codex("ap-1")).await;
    assert_eq!(code(&first), "awaiting_approval");
    let h = handle(&first);
    assert_eq!(first.structured().unwrap()["status"], "awaiting_approval");
    // Redelivery and resume cannot skip the approval.
    assert_eq!(
        code(&r.spend(fox(), codex("ap-1")).await),
        "awaiting_approval"
    );
    let resume = r.call("resume_operation", json!({"handle": h}), None).await;
    assert_eq!(code(&resume), "awaiting_approval");
    let status = r.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(status.structured().unwrap()["status"], "awaiting_approval");
    assert_eq!(w.charges(), 0);

    let out = operator(&["router", "approve", &h, "--registry", &reg_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).replace(&h, "<HANDLE>");
    insta::assert_snapshot!("approve_stdout", text);
    let again = operator(&["router", "approve", &h, "--registry", &reg_s]);
    assert_eq!(again.status.code(), Some(2));

    let ran = r.call("resume_operation", json!({"handle": h}), None).await;
    let s = completed(&ran).clone();
    assert!(!replayed(&ran));
    assert_eq!(s["handle"], json!(h));
    assert_eq!(w.charges(), 1);
    let redeliver = r.spend(fox(), codex("ap-1")).await;
    assert_eq!(completed(&redeliver), &s);
    assert!(replayed(&redeliver));
    let resume2 = r.call("resume_operation", json!({"handle": h}), None).await;
    assert_eq!(completed(&resume2), &s);
    assert!(replayed(&resume2));
    assert_eq!(w.charges(), 1);

    // Deny: nothing is ever spent, whatever is redelivered.
    let second = r.spend(json!({"prompt": "a crane"}), codex("ap-2")).await;
    let h2 = handle(&second);
    let out = operator(&[
        "router",
        "deny",
        &h2,
        "--registry",
        &reg_s,
        "--reason",
        "too dear",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for resp in [
        r.spend(json!({"prompt": "a crane"}), codex("ap-2")).await,
        r.call("resume_operation", json!({"handle": h2}), None)
            .await,
    ] {
        assert_eq!(code(&resp), "operation_denied");
        assert_eq!(resp.structured().unwrap()["status"], "denied");
        assert!(
            resp.structured().unwrap()["message"]
                .as_str()
                .unwrap()
                .contains("too dear")
        );
    }
    let status = operator(&["router", "status", &h2, "--registry", &reg_s]);
    assert!(status.status.success());
    let shown: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(shown["status"], "denied");
    assert!(!String::from_utf8_lossy(&status.stdout).contains(KEY_PREFIX));
    assert_eq!(w.charges(), 1);
    r.stop().await;

    // The approval policy by model.
    let r = w.router(&["--approval-model", "flux-pro"]).await;
    let cheap = r.spend(fox(), codex("ap-3")).await;
    assert!(!replayed(&cheap));
    let pro = r
        .spend(json!({"prompt": "fox", "model": "flux-pro"}), codex("ap-4"))
        .await;
    assert_eq!(code(&pro), "awaiting_approval");
    assert_eq!(w.charges(), 2);
    r.stop().await;
}

#[tokio::test]
async fn preallocated_mode_claims_keys_and_admits_only_codex_for_new_operations() {
    let w = World::new().await;
    let keys = w.path("keys.sqlite3");
    let keys_s = keys.display().to_string();
    // A Claude Code operation recorded before preallocated mode was switched on.
    let r = w.router(&[]).await;
    let claude = r
        .spend(fox(), json!({"claudecode/toolUseId": "toolu_1"}))
        .await;
    r.stop().await;

    let out = operator(&["router", "keys", &keys_s, "--count", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = w.router(&["--preallocated-keys", &keys_s]).await;
    let refused = r
        .spend(fox(), json!({"claudecode/toolUseId": "toolu_2"}))
        .await;
    assert_eq!(code(&refused), "invalid_identity");
    assert!(
        refused.structured().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("preallocated")
    );
    // Its redelivery of an existing operation still works.
    let redeliver = r
        .spend(fox(), json!({"claudecode/toolUseId": "toolu_1"}))
        .await;
    assert_eq!(completed(&redeliver), completed(&claude));
    assert!(replayed(&redeliver));

    let first = r.spend(fox(), codex("pre-1")).await;
    assert!(!replayed(&first));
    let stored_key: String = rusqlite::Connection::open(&keys)
        .unwrap()
        .query_row(
            "SELECT operation_key FROM keys WHERE claimed_by = ?1",
            [handle(&first)],
            |r| r.get(0),
        )
        .unwrap();
    let used_key: String = rusqlite::Connection::open(w.registry())
        .unwrap()
        .query_row(
            "SELECT operation_key FROM operations WHERE harness_call_id = 'pre-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        stored_key, used_key,
        "the operation runs under the claimed key"
    );
    assert!(replayed(&r.spend(fox(), codex("pre-1")).await));
    // Out of keys: fail closed.
    let out_of_keys = r.spend(fox(), codex("pre-2")).await;
    assert_eq!(code(&out_of_keys), "registry_unavailable");
    assert!(
        out_of_keys.structured().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("no unclaimed key")
    );
    assert_eq!(w.charges(), 2);
    r.stop().await;
    // Restarted (its reply cache empty), the router answers a redelivery from the registry and
    // claims no key for it: the pool is empty, so a claim would fail.
    let r = w.router(&["--preallocated-keys", &keys_s]).await;
    let again = r.spend(fox(), codex("pre-1")).await;
    assert_eq!(completed(&again), completed(&first));
    assert!(replayed(&again));
    assert_eq!(w.charges(), 2);
    r.stop().await;
}

#[tokio::test]
async fn the_registry_file_is_private_wal_and_identified() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new().await;
    let r = w.router(&[]).await;
    r.spend(fox(), codex("f1")).await;
    r.stop().await;
    let reg = w.registry();
    // The router was killed, so its journal files are still there: SQLite gives them the
    // database file's mode.
    for file in [
        reg.clone(),
        reg.with_extension("sqlite3-wal"),
        reg.with_extension("sqlite3-shm"),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    let c = rusqlite::Connection::open(&reg).unwrap();
    let get = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        get("PRAGMA application_id") as i32,
        callid::testing::registry::APPLICATION_ID
    );
    assert_eq!(
        get("PRAGMA user_version"),
        callid::testing::registry::MIGRATIONS.len() as i64
    );
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn provider_outage_leaves_the_operation_pending_and_redelivery_finishes_it() {
    let mut w = World::new().await;
    let r = w.router(&[]).await;
    w.stop_provider().await;
    let down = r.spend(fox(), codex("outage")).await;
    assert_eq!(code(&down), "provider_unavailable");
    assert_eq!(down.structured().unwrap()["status"], "pending");
    let h = handle(&down);
    let status = r.call("operation_status", json!({"handle": h}), None).await;
    assert_eq!(status.structured().unwrap()["status"], "pending");
    w.restart_provider().await;
    let up = r.spend(fox(), codex("outage")).await;
    assert_eq!(handle(&up), h);
    assert!(!replayed(&up));
    assert_eq!(w.charges(), 1);
    r.stop().await;
}

#[tokio::test]
async fn budget_model_and_argument_errors() {
    let w = World::new().await;
    let r = w.router(&["--budget-cents", "4"]).await;
    assert!(!replayed(&r.spend(fox(), codex("b1")).await));
    let over = r.spend(fox(), codex("b2")).await;
    assert_eq!(code(&over), "budget_exceeded");
    assert_eq!(over.structured().unwrap()["status"], "failed");
    // The refusal is the recorded answer of that call.
    let again = r.spend(fox(), codex("b2")).await;
    assert_eq!(code(&again), "budget_exceeded");
    assert_eq!(handle(&again), handle(&over));
    let cases = [
        (json!({"prompt": "fox", "model": "dall-e"}), "unknown_model"),
        (json!({"width": 512}), "invalid_arguments"),
        (
            json!({"prompt": "fox", "width": "wide"}),
            "invalid_arguments",
        ),
        (
            json!({"prompt": "fox", "colour": "red"}),
            "invalid_arguments",
        ),
        (
            json!({"prompt": "fox", "width": 1e17}),
            "non_canonical_arguments",
        ),
    ];
    for (i, (args, want)) in cases.into_iter().enumerate() {
        let resp = r.spend(args.clone(), codex(&format!("bad-{i}"))).await;
        assert_eq!(code(&resp), want, "{args}");
    }
    let unknown = r
        .call(
            "operation_status",
            json!({"handle": "hubu:public-operation:v1:nope"}),
            None,
        )
        .await;
    assert_eq!(code(&unknown), "unknown_operation");
    let unknown = r
        .call(
            "resume_operation",
            json!({"handle": "hubu:public-operation:v1:nope"}),
            None,
        )
        .await;
    assert_eq!(code(&unknown), "unknown_operation");
    // An unknown tool is a JSON-RPC error (no tool ran); malformed input gets no tool either.
    let unknown = r
        .call("generate_images", fox(), Some(codex("bad-tool")))
        .await;
    assert!(
        unknown.error.is_some() && unknown.result.is_none(),
        "{}",
        unknown.raw
    );
    r.conn
        .send_raw("{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"tools/call\",\"params\":7}")
        .await
        .unwrap();
    assert_eq!(w.charges(), 1);
    r.stop().await;
    let out = std::process::Command::new(bin())
        .args(["router", "--http", "0.0.0.0:0", "--registry"])
        .arg(w.registry())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback only"));
}

#[tokio::test]
async fn capabilities_and_diagnose_meta_record_shapes_never_values() {
    let w = World::new().await;
    let log = w.path("meta-shapes.jsonl");
    let r = w
        .router(&["--diagnose-meta", &log.display().to_string()])
        .await;
    let caps = r
        .call(
            "capabilities",
            json!({}),
            Some(json!({"openai/session": "secret-session-value"})),
        )
        .await;
    let s = caps.structured().unwrap();
    assert_eq!(s["identity_sources"][0]["meta_key"], "callId");
    // A call without identity is still refused with the diagnostic on.
    let refused = r
        .call(
            "generate_image",
            fox(),
            Some(json!({"openai/session": "secret-session-value"})),
        )
        .await;
    assert_eq!(code(&refused), "missing_identity");
    let ok = r
        .spend(fox(), json!({"callId": "call_secret_value_123"}))
        .await;
    assert!(!ok.is_tool_error());
    r.stop().await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert!(!text.contains("secret-session-value") && !text.contains("call_secret_value_123"));
    assert!(
        text.contains("/openai~1session") && text.contains("/callId"),
        "{text}"
    );
    // The probe's own record format (`callid classify` reads it like a probe log); the
    // capabilities call had no identity and was answered all the same.
    let verdicts: Vec<Value> = text
        .lines()
        .map(|line| {
            let r: callid::probe::Record = serde_json::from_str(line).unwrap();
            assert_eq!(r.transport, callid::probe::record::Transport::Router);
            assert_eq!(r.client.as_ref().unwrap().name, "callid-tests");
            serde_json::to_value(&r.identity).unwrap()["verdict"].clone()
        })
        .collect();
    assert_eq!(
        verdicts,
        ["rejected", "rejected", "accepted"].map(|v| json!(v))
    );
}

#[tokio::test]
async fn streamable_http_serves_the_same_rules() {
    let w = World::new().await;
    let (url, mut child) = http_router(&w, &w.registry()).await;
    let conn = Connection::http(&url).await.unwrap();
    let init = conn
        .initialize(json!(1), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap();
    assert_eq!(init.result.unwrap()["protocolVersion"], "2025-06-18");
    let a = conn
        .call_tool(json!(2), "generate_image", fox(), Some(codex("http-1")))
        .await
        .unwrap();
    assert_clean(&a);
    assert!(!replayed(&a));
    // Redelivery on a new connection (a reconnecting client).
    let conn2 = Connection::http(&url).await.unwrap();
    conn2
        .initialize(json!(1), "2025-11-25", "callid-tests", "1")
        .await
        .unwrap();
    let b = conn2
        .call_tool(json!(2), "generate_image", fox(), Some(codex("http-1")))
        .await
        .unwrap();
    assert_clean(&b);
    assert!(replayed(&b));
    assert_eq!(completed(&a), completed(&b));
    let missing = conn2
        .call_tool(json!(3), "generate_image", fox(), None)
        .await
        .unwrap();
    assert_eq!(code(&missing), "missing_identity");
    assert_eq!(w.charges(), 1);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn runs_on_its_own_with_the_provider_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("state").join("registry.sqlite3");
    let args = vec![
        "router".to_string(),
        "--registry".into(),
        registry.display().to_string(),
    ];
    for round in 0..2 {
        let (conn, mut child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
        conn.initialize(json!(0), "2025-11-25", "callid-tests", "1")
            .await
            .unwrap();
        let r = conn
            .call_tool(json!(1), "generate_image", fox(), Some(codex("solo")))
            .await
            .unwrap();
        assert_clean(&r);
        completed(&r);
        assert_eq!(replayed(&r), round == 1);
        child.kill9().await.unwrap();
    }
    let ledger = registry.with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
    assert_eq!(provider::charge_count_or_zero(&ledger), 1);
}

#[tokio::test]
async fn policy_file_and_operator_errors_say_what_to_fix() {
    let w = World::new().await;
    let policy = w.path("policy.yaml");
    std::fs::write(&policy, "approval_models: [flux-dev]\nbudget_cents: 100\n").unwrap();
    let r = w.router(&["--policy", &policy.display().to_string()]).await;
    let dev = r
        .spend(
            json!({"prompt": "fox", "model": "flux-dev"}),
            codex("pol-1"),
        )
        .await;
    assert_eq!(code(&dev), "awaiting_approval");
    let caps = r.call("capabilities", json!({}), None).await;
    assert_eq!(
        caps.structured().unwrap()["approval"]["models"],
        json!(["flux-dev"])
    );
    assert_eq!(caps.structured().unwrap()["budget_cents"], 100);
    r.stop().await;

    let tmp = w.dir.path().display().to_string();
    let redact = |out: &std::process::Output| {
        format!(
            "exit {:?}\nstdout: {}stderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace(&tmp, "<TMP>")
    };
    let bad_policy = w.path("bad.yaml");
    std::fs::write(&bad_policy, "approval_above_cents: lots\n").unwrap();
    let reg = w.registry().display().to_string();
    let missing = w.path("none/registry.sqlite3").display().to_string();
    let mut report = String::new();
    for (name, args) in [
        (
            "invalid policy file",
            vec![
                "router",
                "--registry",
                &reg,
                "--policy",
                bad_policy.to_str().unwrap(),
            ],
        ),
        (
            "approve an unknown handle",
            vec![
                "router",
                "approve",
                "hubu:public-operation:v1:nope",
                "--registry",
                &reg,
            ],
        ),
        (
            "approve against a registry that does not exist",
            vec![
                "router",
                "approve",
                "hubu:public-operation:v1:nope",
                "--registry",
                &missing,
            ],
        ),
        (
            "deny a completed operation",
            vec!["router", "deny", "HANDLE", "--registry", &reg],
        ),
    ] {
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        if name == "deny a completed operation" {
            let r = w.router(&[]).await;
            let done = r.spend(fox(), codex("pol-2")).await;
            r.stop().await;
            args[2] = handle(&done);
        }
        let out = std::process::Command::new(bin())
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let mut text = redact(&out);
        if name == "deny a completed operation" {
            text = text.replace(&args[2], "<HANDLE>");
        }
        report.push_str(&format!("## {name}\n{text}\n"));
    }
    insta::assert_snapshot!("operator_errors", report);
}
