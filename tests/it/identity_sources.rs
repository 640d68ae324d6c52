//! Integration tests of identity sources as data (`--identity-sources FILE`): the real binary,
//! the shipped presets, a router with its in-process provider, the probe and `classify`.

use crate::common::{bin, repo};
use callid::jsonrpc::{Connection, Response};
use callid::provider::Ledger;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

const GOOSE_KEY: &str = "agent-tool-call-request-id";

fn goose_preset() -> String {
    repo()
        .join("identity-sources/goose.yaml")
        .display()
        .to_string()
}

fn callid(args: &[&str]) -> Output {
    std::process::Command::new(bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn goose_meta(id: &str) -> Value {
    json!({GOOSE_KEY: id, "agent-session-id": "sess-1", "agent-working-dir": "/w"})
}

async fn router(registry: &Path, extra: &[&str]) -> (Connection, callid::jsonrpc::Child) {
    let mut args = vec![
        "router".to_string(),
        "--registry".into(),
        registry.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let (mut conn, child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    conn.set_timeout(Duration::from_secs(30));
    let init = conn
        .initialize(json!(0), "2025-06-18", "goose", "1.0")
        .await
        .unwrap();
    assert!(init.result.is_some(), "initialize failed: {}", init.raw);
    (conn, child)
}

async fn spend(conn: &Connection, id: u64, meta: Value) -> Response {
    conn.call_tool(
        json!(id),
        "generate_image",
        json!({"prompt": "an origami fox"}),
        Some(meta),
    )
    .await
    .unwrap()
}

fn charges(registry: &Path) -> u64 {
    let ledger = registry.with_file_name(callid::backend::PROVIDER_LEDGER_FILE);
    if !ledger.exists() {
        return 0;
    }
    Ledger::open(&ledger).unwrap().charge_count().unwrap()
}

fn registry(dir: &Path, sub: &str) -> PathBuf {
    let d = dir.join(sub);
    std::fs::create_dir_all(&d).unwrap();
    d.join("registry.sqlite3")
}

#[tokio::test]
async fn router_with_the_goose_preset_accepts_its_key_and_dedupes_a_redelivery() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path(), "with");
    let preset = goose_preset();
    let (conn, mut child) = router(&reg, &["--identity-sources", &preset]).await;
    let first = spend(&conn, 1, goose_meta("toolu_goose_1")).await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    let s1 = first.structured().unwrap().clone();
    assert_eq!(s1["status"], "completed", "{}", first.raw);
    assert_eq!(
        first.tool_result().unwrap()["_meta"]["callid/replayed"],
        false
    );
    // The same call redelivered (new JSON-RPC id): the recorded result, no second charge.
    let again = spend(&conn, 2, goose_meta("toolu_goose_1")).await;
    assert_eq!(again.structured().unwrap(), &s1, "{}", again.raw);
    assert_eq!(
        again.tool_result().unwrap()["_meta"]["callid/replayed"],
        true
    );
    assert_eq!(charges(&reg), 1);
    // A new goose call is a new operation.
    let other = spend(&conn, 3, goose_meta("toolu_goose_2")).await;
    assert_ne!(other.structured().unwrap()["handle"], s1["handle"]);
    assert_eq!(charges(&reg), 2);
    // goose's key beside a built-in source is ambiguous; as an argument name it is refused.
    let mut both = goose_meta("toolu_goose_3");
    both["callId"] = json!("call_3");
    let amb = spend(&conn, 4, both).await;
    assert_eq!(
        amb.structured().unwrap()["error"],
        "ambiguous_identity",
        "{}",
        amb.raw
    );
    let smuggled = conn
        .call_tool(
            json!(5),
            "generate_image",
            json!({"prompt": "fox", "agent_tool_call_request_id": "x"}),
            Some(goose_meta("toolu_goose_4")),
        )
        .await
        .unwrap();
    assert_eq!(
        smuggled.structured().unwrap()["error"],
        "identity_in_arguments",
        "{}",
        smuggled.raw
    );
    let caps = conn
        .call_tool(json!(6), "capabilities", json!({}), None)
        .await
        .unwrap();
    let sources = &caps.structured().unwrap()["identity_sources"];
    assert_eq!(sources[3]["meta_key"], GOOSE_KEY, "{}", caps.raw);
    assert_eq!(sources[3]["platform"], "goose");
    assert_eq!(charges(&reg), 2);
    conn.close().await;
    let _ = child.kill9().await;

    // Without the preset the same key is no identity at all: refused before any charge.
    let reg = registry(dir.path(), "without");
    let (conn, mut child) = router(&reg, &[]).await;
    let refused = spend(&conn, 1, goose_meta("toolu_goose_1")).await;
    assert!(refused.is_tool_error(), "{}", refused.raw);
    assert_eq!(refused.structured().unwrap()["error"], "missing_identity");
    assert_eq!(charges(&reg), 0);
    conn.close().await;
    let _ = child.kill9().await;
}

/// A probe log of a goose-like client: two distinct calls, then one redelivered.
async fn goose_log(dir: &Path, extra: &[&str]) -> PathBuf {
    let log = dir.join(format!("probe-{}.log", extra.len()));
    let mut args = vec![
        "probe".to_string(),
        "--log".into(),
        log.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let (mut conn, mut child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    conn.set_timeout(Duration::from_secs(20));
    conn.initialize(json!(0), "2025-06-18", "goose", "1.9.0")
        .await
        .unwrap();
    for (rpc, id) in [(1, "toolu_a"), (2, "toolu_b"), (3, "toolu_b")] {
        let r = conn
            .call_tool(json!(rpc), "capabilities", json!({}), Some(goose_meta(id)))
            .await
            .unwrap();
        assert!(r.result.is_some(), "{}", r.raw);
    }
    conn.close().await;
    assert_eq!(
        child.wait().await.unwrap().code(),
        Some(0),
        "{}",
        child.stderr_text()
    );
    log
}

fn classify_json(log: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["classify", "--format", "json", log.to_str().unwrap()];
    args.extend(extra);
    let out = callid(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0].clone()
}

#[tokio::test]
async fn classify_with_the_goose_preset_accepts_a_goose_log() {
    let dir = tempfile::tempdir().unwrap();
    let preset = goose_preset();
    // Recorded by a probe that knows only the built-in table.
    let log = goose_log(dir.path(), &[]).await;
    let plain = classify_json(&log, &[]);
    assert_eq!(plain["verdict"], "rejected", "{plain}");
    assert_eq!(plain["reason"], "missing_identity");
    let judged = classify_json(&log, &["--identity-sources", &preset]);
    assert_eq!(judged["verdict"], "accepted", "{judged}");
    assert_eq!(judged["source"], "goose");
    assert_eq!(judged["source_key"], GOOSE_KEY);
    assert_eq!(judged["calls_accepted"], 3);
    assert_eq!(judged["per_call_ids"]["distinct"], 2, "{judged}");
    assert_eq!(judged["per_call_ids"]["redelivered"], 1, "{judged}");
    // A probe that runs with the preset records the verdict itself.
    let log = goose_log(dir.path(), &["--identity-sources", &preset]).await;
    let recorded = classify_json(&log, &[]);
    assert_eq!(recorded["verdict"], "accepted", "{recorded}");
    assert_eq!(recorded["source_key"], GOOSE_KEY);
}

#[test]
fn a_bad_table_is_a_clear_exit_2_error_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "sources:\n  - key: agent-tool-call-request-id\n    platform: codex\n    trust: t\n",
    )
    .unwrap();
    let log = dir.path().join("empty.log");
    std::fs::write(&log, "").unwrap();
    let registry = dir.path().join("registry.sqlite3");
    let bad_arg = bad.to_str().unwrap();
    for args in [
        vec!["identity-sources", "--identity-sources", bad_arg],
        vec![
            "classify",
            "--identity-sources",
            bad_arg,
            log.to_str().unwrap(),
        ],
        vec![
            "router",
            "--registry",
            registry.to_str().unwrap(),
            "--identity-sources",
            bad_arg,
        ],
        vec!["probe", "--identity-sources", bad_arg],
    ] {
        let out = callid(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim_end(),
            format!(
                "error: identity-source table `{bad_arg}`: `sources[0]` \
                 (`agent-tool-call-request-id`): `platform` is `codex`, the platform of a \
                 built-in source, which a table cannot claim; name the harness that sets this \
                 key (not `codex`): its calls must not land on the rows of real `codex` calls"
            ),
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(
        !registry.exists(),
        "a refused table must not create a registry"
    );
    let missing = callid(&[
        "identity-sources",
        "--identity-sources",
        "/nonexistent/t.yaml",
    ]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .starts_with("error: failed to read the identity-source table `/nonexistent/t.yaml`"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

#[test]
fn identity_sources_prints_the_table_in_force() {
    let out = callid(&["identity-sources"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for key in [
        "callId",
        "claudecode/toolUseId",
        "hubu.dev/platform-invocation",
    ] {
        assert!(text.contains(&format!("{key}\n")), "{text}");
    }
    assert!(!text.contains(GOOSE_KEY));
    let preset = goose_preset();
    let out = callid(&[
        "identity-sources",
        "--format",
        "json",
        "--identity-sources",
        &preset,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[3]["key"], GOOSE_KEY);
    assert_eq!(v[3]["platform"], "goose");
    assert_eq!(v[3]["origin"], preset);
    assert_eq!(v[3]["value"]["kind"], "identifier");
    assert!(
        v[3]["trust"]
            .as_str()
            .unwrap()
            .contains("trusted only where")
    );
}
