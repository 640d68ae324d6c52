//! Integration tests of identity sources as data (`--identity-sources FILE`): the real binary,
//! the shipped presets, a router with its in-process provider, the probe and `classify`.

use crate::common::probe::record_calls;
use crate::common::{bin, repo};
use callid::jsonrpc::{Connection, Response};
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
    crate::common::provider::charge_count_or_zero(&ledger)
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
    let none = spend(&conn, 7, json!({"agent-session-id": "sess-1"})).await;
    assert_eq!(none.structured().unwrap()["error"], "missing_identity");
    assert!(
        none.raw.contains("`agent-tool-call-request-id` (goose)"),
        "{}",
        none.raw
    );
    assert_eq!(charges(&reg), 2);
    conn.close().await;
    let _ = child.kill9().await;

    // Without the preset the same key is no identity at all: refused before any charge.
    let reg = registry(dir.path(), "without");
    let (conn, mut child) = router(&reg, &[]).await;
    let refused = spend(&conn, 1, goose_meta("toolu_goose_1")).await;
    assert!(refused.is_tool_error(), "{}", refused.raw);
    assert_eq!(refused.structured().unwrap()["error"], "missing_identity");
    assert!(
        !refused.raw.contains("--identity-sources"),
        "without a table the message names only the built-in sources: {}",
        refused.raw
    );
    assert_eq!(charges(&reg), 0);
    conn.close().await;
    let _ = child.kill9().await;
}

/// A probe log of a goose-like client: two distinct calls, then one redelivered.
async fn goose_log(dir: &Path, extra: &[&str]) -> PathBuf {
    let log = dir.join(format!("probe-{}.log", extra.len()));
    let metas = ["toolu_a", "toolu_b", "toolu_b"].map(goose_meta);
    record_calls(&log, extra, ("goose", "1.9.0"), &metas).await;
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
    assert!(
        !plain["reason_message"]
            .as_str()
            .unwrap()
            .contains("--identity-sources")
    );
    // With a table that the log does not match, the message names the table's source.
    let pi = repo().join("identity-sources/gsd-pi.yaml");
    let other = classify_json(&log, &["--identity-sources", pi.to_str().unwrap()]);
    assert_eq!(other["reason"], "missing_identity", "{other}");
    assert!(
        other["reason_message"]
            .as_str()
            .unwrap()
            .contains("`io.opengsd/idempotency-key` (gsd-pi)"),
        "{other}"
    );
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

/// The envelope's signature key is verified, never read as a call ID: a table that declares it
/// stops the router and the gateway at start-up, before a registry exists.
#[test]
fn a_table_naming_the_signature_key_stops_router_and_gateway_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "sources:\n  - key: hubu.dev/platform-invocation-signature\n    platform: acme\n    trust: t\n",
    )
    .unwrap();
    let registry = dir.path().join("registry.sqlite3");
    let (bad_arg, registry_arg) = (bad.to_str().unwrap(), registry.to_str().unwrap());
    for args in [
        vec![
            "router",
            "--registry",
            registry_arg,
            "--identity-sources",
            bad_arg,
        ],
        vec![
            "gateway",
            "--registry",
            registry_arg,
            "--spend",
            "pay",
            "--identity-sources",
            bad_arg,
            "--",
            "true",
        ],
    ] {
        let out = callid(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with(&format!(
                "error: identity-source table `{bad_arg}`: `sources[0]` \
                 (`hubu.dev/platform-invocation-signature`): \
                 `hubu.dev/platform-invocation-signature` is the signature beside the \
                 `hubu.dev/platform-invocation` envelope"
            )),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("remove this entry"), "{stderr}");
    }
    assert!(
        !registry.exists(),
        "a refused table must not create a registry"
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

// ---------------------------------------------------------------------------------------------
// per-attempt values are not call IDs

/// A probe log at `log` of client `gem 1.0`: one `capabilities {}` call per `_meta`.
async fn probe_log(log: &Path, metas: &[Value]) {
    record_calls(log, &[], ("gem", "1.0"), metas).await;
}

/// A two-calls run and a timeout run in which the client redelivered its one call: the same
/// `callId`, a fresh `progressToken` (as Gemini CLI sends), the conversation's `sessionId`.
async fn measured_runs(evidence: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(evidence).unwrap();
    let two = evidence.join("gem-1.0.jsonl");
    let timeout = evidence.join("gem-1.0.timeout.jsonl");
    probe_log(
        &two,
        &[
            json!({"callId": "c1", "progressToken": "3f1c7d0e-1", "sessionId": "s1"}),
            json!({"callId": "c2", "progressToken": "9a0b2c4d-2", "sessionId": "s1"}),
        ],
    )
    .await;
    probe_log(
        &timeout,
        &[
            json!({"callId": "c9", "progressToken": "77aa01bc-3", "sessionId": "s2"}),
            json!({"callId": "c9", "progressToken": "e2d4f6a8-4", "sessionId": "s2"}),
        ],
    )
    .await;
    (two, timeout)
}

fn kinds_of(verdict: &Value) -> Vec<(String, String)> {
    verdict["key_kinds"]
        .as_array()
        .unwrap_or_else(|| panic!("no key_kinds in {verdict}"))
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_string(),
                k["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn classify_tells_call_ids_from_per_attempt_values_and_context() {
    let dir = tempfile::tempdir().unwrap();
    let (two, timeout) = measured_runs(&dir.path().join("evidence")).await;
    let v = classify_json(&two, &[timeout.to_str().unwrap()]);
    assert_eq!(
        kinds_of(&v),
        vec![
            ("callId".to_string(), "call_id".to_string()),
            ("progressToken".into(), "per_attempt".into()),
            ("sessionId".into(), "context".into()),
        ],
        "{v}"
    );
    let progress = &v["key_kinds"][1];
    assert_eq!(progress["redeliveries"], 1);
    assert_eq!(progress["changed_on_redelivery"], 1);
    assert!(
        progress["evidence"]
            .as_str()
            .unwrap()
            .starts_with("changed on 1 of 1 redelivery"),
        "{progress}"
    );
    let call_id = &v["key_kinds"][0];
    assert_eq!(call_id["distinct_call_pairs"], 1, "{call_id}");
    assert_eq!(call_id["redeliveries"], 1, "{call_id}");
    assert_eq!(call_id["same_on_distinct_calls"], 0);
    // The verdict itself does not change.
    assert_eq!(v["verdict"], "accepted");
    assert_eq!(v["source_key"], "callId");
    // The table says it too, one note per key.
    let out = callid(&["classify", two.to_str().unwrap(), timeout.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("gem 1.0: `progressToken`: per-attempt value: changed on 1 of 1 redelivery"),
        "{text}"
    );

    // Without the run that knows its redelivery, nothing tells a call ID from a per-attempt
    // value: no kinds are claimed.
    let alone = classify_json(&two, &[]);
    assert!(alone.get("key_kinds").is_none(), "{alone}");
    // The same records under a name that does not mark a redelivery are two distinct calls:
    // `callId` stayed the same across them, so it is context there, never a call ID.
    let renamed = dir.path().join("plain.jsonl");
    std::fs::copy(&timeout, &renamed).unwrap();
    let other = dir.path().join("evidence/gem-1.0.server-dies.jsonl");
    probe_log(
        &other,
        &[json!({"callId": "c7", "progressToken": "0000-5", "sessionId": "s3"})],
    )
    .await;
    let v = classify_json(&renamed, &[other.to_str().unwrap()]);
    assert_eq!(kinds_of(&v)[0], ("callId".into(), "context".into()), "{v}");
}

#[tokio::test]
async fn the_matrix_marks_per_attempt_keys_and_checks_them_against_the_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path();
    measured_runs(&matrix.join("evidence")).await;
    std::fs::copy(
        repo().join("tests/fixtures/matrix/routers.yaml"),
        matrix.join("routers.yaml"),
    )
    .unwrap();
    let row = |per_attempt: &str| {
        format!(
            "version: 1\nclients:\n- id: gem-cli\n  client: Gem CLI\n  surface: stdio\n  \
             version: '1.0'\n  date: 2026-11-30\n  verdict: accepted\n  per_call_id: callId\n  \
             call_level_keys:\n  - progressToken\n  context_keys:\n  - sessionId\n{per_attempt}  \
             stability:\n    on_timeout: retried-same-id\n  how:\n    kind: measured\n    command: callid measure --client gem\n    evidence:\n    \
             - evidence/gem-1.0.jsonl\n    - evidence/gem-1.0.timeout.jsonl\n"
        )
    };
    let d = matrix.to_str().unwrap();
    std::fs::write(
        matrix.join("clients.yaml"),
        row("  per_attempt_keys:\n  - progressToken\n"),
    )
    .unwrap();
    let out = callid(&["matrix", "render", "--dir", d]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let support = std::fs::read_to_string(matrix.join("SUPPORT.md")).unwrap();
    assert!(
        support.contains("| `callId` | `progressToken` (*per attempt*) | `sessionId` |"),
        "{support}"
    );
    assert!(support.contains("*per attempt*: the value changed when the client redelivered"));

    // A row that leaves the per-attempt key out says something its evidence does not.
    std::fs::write(matrix.join("clients.yaml"), row("")).unwrap();
    let out = callid(&["matrix", "render", "--check", "--dir", d]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "`per_attempt_keys` is [] in the row but [\"progressToken\"] in the evidence"
        ),
        "{stderr}"
    );
}
