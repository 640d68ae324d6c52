//! Signed platform-invocation envelopes through the real binary: `callid envelope keygen|sign|
//! verify`, and `callid router --trust-keys` over stdio and HTTP (a valid signed call charges once
//! and replays; a forged, unsigned or harness call is refused and records nothing).

use crate::common::mcp::{Served, fox, next_id, spawn_http};
use crate::common::{bin, registry_handle};
use callid::jsonrpc::{Connection, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

fn callid(args: &[&str]) -> Output {
    std::process::Command::new(bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A platform `acme` with key `acme-1` (Ed25519), a trust file that lists it, and a key
/// `intruder` that nobody trusts.
struct Platform {
    dir: tempfile::TempDir,
    trust: PathBuf,
}

impl Platform {
    fn new() -> Platform {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("acme-1.key");
        let out = callid(&[
            "envelope",
            "keygen",
            "--kid",
            "acme-1",
            "--out",
            key.to_str().unwrap(),
            "--platform",
            "acme",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let printed = String::from_utf8(out.stdout).unwrap();
        let private = std::fs::read_to_string(&key).unwrap();
        let secret = private.trim().split_once(':').unwrap().1;
        assert!(!printed.contains(secret), "keygen printed the private key");
        // What keygen prints is a trust file as it is.
        let trust = dir.path().join("trust.yaml");
        std::fs::write(&trust, &printed).unwrap();
        let intruder = callid(&[
            "envelope",
            "keygen",
            "--kid",
            "acme-1",
            "--out",
            dir.path().join("intruder.key").to_str().unwrap(),
            "--platform",
            "acme",
        ]);
        assert!(intruder.status.success(), "{}", text(&intruder));
        Platform { dir, trust }
    }

    /// `_meta` for `envelope` signed by `key` (a file in the directory) under `kid`.
    fn sign(&self, key: &str, kid: &str, envelope: &Value) -> Value {
        let out = callid(&[
            "envelope",
            "sign",
            "--key",
            self.dir.path().join(key).to_str().unwrap(),
            "--kid",
            kid,
            "--envelope",
            &envelope.to_string(),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn registry(&self) -> PathBuf {
        self.dir.path().join("registry.sqlite3")
    }

    fn router_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "router",
            "--registry",
            self.registry().to_str().unwrap(),
            "--trust-keys",
            self.trust.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }
}

fn envelope(invocation: &str) -> Value {
    json!({"platform": "acme", "invocation_id": invocation, "installation_id": "inst-1"})
}

fn charges(registry: &Path) -> u64 {
    let ledger = registry.with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
    crate::common::provider::charge_count_or_zero(&ledger)
}

fn code(r: &Response) -> String {
    r.structured()
        .and_then(|s| s["error"].as_str())
        .unwrap_or("")
        .to_string()
}

fn replayed(r: &Response) -> bool {
    r.tool_result().unwrap()["_meta"]["callid/replayed"] == json!(true)
}

#[tokio::test]
async fn router_on_stdio_charges_a_signed_call_once_and_refuses_a_forged_one() {
    let p = Platform::new();
    let router = Served::start(
        "the router",
        &bin(),
        &p.router_args(&[]),
        &[],
        Some(Duration::from_secs(30)),
    )
    .await;

    let signed = p.sign("acme-1.key", "acme-1", &envelope("inv-1"));
    let first = router.spend(fox(), signed.clone()).await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    assert!(!replayed(&first), "{}", first.raw);
    let again = router.spend(fox(), signed).await;
    assert!(replayed(&again), "a redelivery replays: {}", again.raw);
    // The platform signs its redelivery afresh: the same envelope is the same call.
    let resigned = p.sign("acme-1.key", "acme-1", &envelope("inv-1"));
    let third = router.spend(fox(), resigned).await;
    assert!(
        replayed(&third),
        "a re-signed redelivery replays: {}",
        third.raw
    );
    assert_eq!(charges(&p.registry()), 1);

    // Forged: a valid shape, the key id of the trusted key, signed by another key.
    let forged = p.sign("intruder.key", "acme-1", &envelope("inv-forged"));
    let refused = router.spend(fox(), forged).await;
    assert_eq!(code(&refused), "invalid_signature", "{}", refused.raw);
    // A trusted signature moved onto another envelope.
    let mut moved = p.sign("acme-1.key", "acme-1", &envelope("inv-1"));
    moved["hubu.dev/platform-invocation"] = envelope("inv-moved");
    let refused = router.spend(fox(), moved).await;
    assert_eq!(code(&refused), "invalid_signature", "{}", refused.raw);
    // No signature at all.
    let unsigned = json!({"hubu.dev/platform-invocation": envelope("inv-unsigned")});
    let refused = router.spend(fox(), unsigned).await;
    assert_eq!(code(&refused), "missing_signature", "{}", refused.raw);
    for id in ["inv-forged", "inv-moved", "inv-unsigned"] {
        assert_eq!(
            registry_handle(&p.registry(), id),
            None,
            "{id} recorded nothing"
        );
    }
    assert_eq!(charges(&p.registry()), 1);

    // On stdio, harness identities are accepted unsigned by default.
    let codex = router.spend(fox(), json!({"callId": "call-1"})).await;
    assert!(!codex.is_tool_error(), "{}", codex.raw);
    assert_eq!(charges(&p.registry()), 2);
    router.stop().await;
}

#[tokio::test]
async fn router_over_http_refuses_unsigned_harness_ids_by_default() {
    let p = Platform::new();
    let args = p.router_args(&["--http", "127.0.0.1:0"]);
    let (url, _child) = spawn_http(&args, "callid router", Duration::from_secs(30)).await;
    let mut conn = Connection::http(&url).await.unwrap();
    conn.set_timeout(Duration::from_secs(30));
    let init = conn
        .initialize(json!(0), "2025-06-18", "signed-tests", "1")
        .await
        .unwrap();
    assert!(init.result.is_some(), "{}", init.raw);
    let spend = |meta: Value| {
        let conn = &conn;
        async move {
            conn.call_tool(next_id(), "generate_image", fox(), Some(meta))
                .await
                .unwrap()
        }
    };
    let codex = spend(json!({"callId": "call-http"})).await;
    assert_eq!(code(&codex), "unsigned_identity", "{}", codex.raw);
    assert_eq!(registry_handle(&p.registry(), "call-http"), None);
    let signed = spend(p.sign("acme-1.key", "acme-1", &envelope("inv-http"))).await;
    assert!(!signed.is_tool_error(), "{}", signed.raw);
    assert!(registry_handle(&p.registry(), "inv-http").is_some());
    assert_eq!(charges(&p.registry()), 1);
}

#[test]
fn envelope_verify_says_which_rule_failed_and_keygen_never_overwrites() {
    let p = Platform::new();
    let trust = p.trust.to_str().unwrap();
    let verify = |meta: &Value| {
        callid(&[
            "envelope",
            "verify",
            "--trust-keys",
            trust,
            "--meta",
            &meta.to_string(),
        ])
    };
    let valid = verify(&p.sign("acme-1.key", "acme-1", &envelope("inv-1")));
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid));
    assert!(
        String::from_utf8_lossy(&valid.stdout).starts_with("valid: platform `acme`, call `inv-1`")
    );
    let forged = verify(&p.sign("intruder.key", "acme-1", &envelope("inv-1")));
    assert_eq!(forged.status.code(), Some(1), "{}", text(&forged));
    assert!(
        String::from_utf8_lossy(&forged.stdout).starts_with("refused (invalid_signature): "),
        "{}",
        text(&forged)
    );
    let harness = callid(&[
        "envelope",
        "verify",
        "--trust-keys",
        trust,
        "--meta",
        r#"{"callId": "c"}"#,
        "--unsigned-harness-ids",
        "refuse",
    ]);
    assert_eq!(harness.status.code(), Some(1), "{}", text(&harness));
    assert!(String::from_utf8_lossy(&harness.stdout).starts_with("refused (unsigned_identity): "));

    let key = p.dir.path().join("acme-1.key");
    let before = std::fs::read(&key).unwrap();
    let again = callid(&[
        "envelope",
        "keygen",
        "--kid",
        "acme-2",
        "--out",
        key.to_str().unwrap(),
        "--platform",
        "acme",
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already exists"),
        "{}",
        text(&again)
    );
    assert_eq!(
        std::fs::read(&key).unwrap(),
        before,
        "the key file is untouched"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// A gateway that vouches (`--vouch-key`) in front of a Guard-based upstream that accepts only
/// signed envelopes: the agent's unsigned Codex call is verified by the gateway, signed for the
/// upstream, charged once and replayed; the same upstream refuses an unsigned call, and the
/// same gateway without `--vouch-key` gets nothing through.
#[tokio::test]
async fn a_vouching_gateway_gets_its_calls_through_an_upstream_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let out = callid(&[
        "envelope",
        "keygen",
        "--kid",
        "gw-1",
        "--out",
        &path("gw.key"),
        "--platform",
        "my-gateway",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(path("upstream-trust.yaml"), &out.stdout).unwrap();
    let upstream = crate::gateway::guarded_server().display().to_string();
    let gateway = |registry: &str, vouch: bool| {
        let mut args: Vec<String> = [
            "gateway",
            "--registry",
            &path(registry),
            "--spend",
            "generate_image",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if vouch {
            for a in [
                "--vouch-key",
                &path("gw.key"),
                "--vouch-kid",
                "gw-1",
                "--vouch-platform",
                "my-gateway",
            ] {
                args.push(a.to_string());
            }
        }
        for a in [
            "--",
            &upstream,
            &path("upstream.sqlite3"),
            &path("ledger.sqlite3"),
            &path("upstream-trust.yaml"),
        ] {
            args.push(a.to_string());
        }
        args
    };
    let ledger = dir.path().join("ledger.sqlite3");
    let charges = || crate::common::provider::charge_count_or_zero(&ledger);

    let g = Served::start(
        "the gateway",
        &bin(),
        &gateway("gw.sqlite3", true),
        &[],
        Some(Duration::from_secs(60)),
    )
    .await;
    let first = g.spend(fox(), json!({"callId": "call-v1"})).await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    let again = g.spend(fox(), json!({"callId": "call-v1"})).await;
    assert!(replayed(&again), "{}", again.raw);
    assert_eq!(charges(), 1);
    let upstream_row: (String, String) =
        rusqlite::Connection::open(dir.path().join("upstream.sqlite3"))
            .unwrap()
            .query_row(
                "SELECT platform, harness_call_id FROM operations",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
    assert_eq!(
        upstream_row.0, "my-gateway",
        "the upstream recorded the gateway's envelope"
    );
    assert!(
        upstream_row.1.starts_with("callid-idem-v1-"),
        "{upstream_row:?}"
    );
    g.stop().await;

    // The same gateway without `--vouch-key`: the upstream sees no identity and refuses.
    let g = Served::start(
        "the gateway",
        &bin(),
        &gateway("gw2.sqlite3", false),
        &[],
        Some(Duration::from_secs(60)),
    )
    .await;
    let refused = g.spend(fox(), json!({"callId": "call-v2"})).await;
    assert!(refused.is_tool_error(), "{}", refused.raw);
    assert_eq!(charges(), 1);
    g.stop().await;
}
