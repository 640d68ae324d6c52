//! Integration tests of `callid probe`, `callid classify` and `callid demo`: the real binary over
//! stdio and streamable HTTP, the `--wrap` proxy against a direct connection, bad input, and the
//! no-leak property of the log.

use crate::common::probe::{capabilities, close_expecting_exit_0, logged_probe, read_records};
use crate::common::{bin, repo};
use callid::jsonrpc::Connection;
use callid::probe::record::{Record, ShapeLog, Transport};
use callid::probe::{Frame, LineFramer, Mode, Tap};
use callid::shape::Digester;
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

fn fixtures() -> Vec<PathBuf> {
    let dir = repo().join("tests/fixtures/probe");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    logs.sort();
    logs
}

fn callid(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

fn classify_fixtures(format: &str) -> Output {
    let mut args = vec!["classify".to_string(), "--format".into(), format.into()];
    args.extend(
        fixtures()
            .iter()
            .map(|p| p.strip_prefix(repo()).unwrap().display().to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    callid(&args)
}

fn methods(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            r.method
                .clone()
                .unwrap_or_else(|| format!("<{:?}>", r.kind))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// classify

#[test]
fn classify_table_snapshot() {
    let out = classify_fixtures("table");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!(String::from_utf8(out.stdout).unwrap());
}

#[test]
fn classify_markdown_snapshot() {
    let out = classify_fixtures("markdown");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    insta::assert_snapshot!(String::from_utf8(out.stdout).unwrap());
}

#[test]
fn classify_json_snapshot_and_fields() {
    let out = classify_fixtures("json");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let verdicts: Vec<Value> = serde_json::from_str(&text).unwrap();
    let summary: Vec<Value> = verdicts
        .iter()
        .map(|v| {
            json!([
                v["client"]["name"],
                v["client"]["version"],
                v["verdict"],
                v["source"],
                v["reason"],
                v["calls"]
            ])
        })
        .collect();
    assert_eq!(
        summary,
        [
            json!([
                "ambiguous-client",
                "0.1.0",
                "rejected",
                null,
                "ambiguous_identity",
                1
            ]),
            json!([
                "chat-like-client",
                "1.0.0",
                "rejected",
                null,
                "missing_identity",
                2
            ]),
            json!(["claude-code", "2.1.332", "accepted", "claude-code", null, 2]),
            json!(["codex-mcp-client", "0.171.0", "accepted", "codex", null, 4]),
        ]
    );
    for v in &verdicts {
        assert!(
            v["call_level_keys"].is_array() && v["context_keys"].is_array(),
            "{v}"
        );
    }
    insta::assert_snapshot!(text);
}

#[test]
fn classify_reports_bad_lines_and_unreadable_input() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mixed.log");
    let good =
        std::fs::read_to_string(repo().join("tests/fixtures/probe/ambiguous-0.1.0.jsonl")).unwrap();
    std::fs::write(&log, format!("{{broken\n{good}[1,2]\n")).unwrap();
    let out = callid(&["classify", log.to_str().unwrap(), "--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a verdict is data, not a failure: {out:?}"
    );
    let stderr = String::from_utf8(out.stderr)
        .unwrap()
        .replace(dir.path().to_str().unwrap(), "[TMP]");
    insta::assert_snapshot!("classify_bad_lines_stderr", stderr);

    let missing = dir.path().join("missing.log");
    let out = callid(&["classify", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr)
        .unwrap()
        .replace(dir.path().to_str().unwrap(), "[TMP]");
    assert!(
        stderr.starts_with("error: failed to read the probe log `[TMP]/missing.log`"),
        "{stderr}"
    );

    let empty = dir.path().join("empty.log");
    std::fs::write(&empty, "not a record\n").unwrap();
    let out = callid(&["classify", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no probe records in"),
        "{out:?}"
    );
}

#[test]
fn demo_prints_the_three_verdicts() {
    let out = callid(&["demo", "--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<(String, String)> = verdicts
        .iter()
        .map(|v| {
            (
                v["client"]["name"].as_str().unwrap().to_string(),
                v["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("codex-mcp-client".to_string(), "accepted".to_string()),
            ("claude-code".to_string(), "accepted".to_string()),
            ("chat-like-client".to_string(), "rejected".to_string()),
        ]
    );
    let table = callid(&["demo"]);
    assert_eq!(
        table.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    insta::assert_snapshot!("demo_table", String::from_utf8(table.stdout).unwrap());
}

// ---------------------------------------------------------------------------------------------
// the probe over stdio and HTTP

#[tokio::test]
async fn stdio_probe_records_every_request() {
    let (_dir, log, conn, mut child) = logged_probe("probe.log", &["--legacy-handshake"]).await;
    let discover = conn
        .request(
            json!("discover-1"),
            "server/discover",
            json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
            }}),
        )
        .await
        .unwrap();
    assert_eq!(discover.id, json!("discover-1"));
    assert_eq!(
        discover.error.as_ref().unwrap()["code"],
        json!(-32601),
        "{}",
        discover.raw
    );
    let init = conn
        .initialize(json!(0), "2025-11-25", "claude-code", "2.1.332")
        .await
        .unwrap();
    assert_eq!(
        init.result.as_ref().unwrap()["serverInfo"]["name"],
        json!("callid-probe")
    );
    let tools = conn
        .request(json!(1), "tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(
        tools.result.unwrap()["tools"][0]["annotations"]["readOnlyHint"],
        json!(true)
    );
    let call = capabilities(
        &conn,
        json!(2),
        json!({"claudecode/toolUseId": "toolu_01SECRETSECRETSECRETSEC", "progressToken": 2}),
    )
    .await;
    let answer = call.structured().unwrap();
    assert_eq!(
        answer["identity"],
        json!({"verdict": "accepted", "platform": "claude-code", "source": "claudecode/toolUseId"})
    );
    assert_eq!(
        answer["meta_keys"][0],
        json!({"key": "claudecode/toolUseId", "type": "string", "len": 29, "identity_source": true})
    );
    assert!(
        !call.raw.contains("SECRET"),
        "the answer echoes no value: {}",
        call.raw
    );
    let smuggled = conn
        .call_tool(
            json!(3),
            "capabilities",
            json!({"idempotency_key": "k"}),
            Some(json!({"callId": "call_x"})),
        )
        .await
        .unwrap();
    // The schema has no such argument; the answer still names the smuggled identity.
    assert_eq!(
        smuggled
            .structured()
            .map(|s| s["arguments_identity_error"].clone()),
        Some(json!("identity_in_arguments")),
        "{}",
        smuggled.raw
    );
    close_expecting_exit_0(&conn, &mut child).await;

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("SECRET"), "{text}");
    let records = read_records(&log);
    assert_eq!(
        methods(&records),
        [
            "server/discover",
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/call",
            "tools/call"
        ]
    );
    for r in &records {
        assert_eq!(r.transport, Transport::Stdio);
        assert_eq!(r.client.as_ref().unwrap().name, "claude-code");
        assert_eq!(r.connection, records[0].connection);
    }
    assert_eq!(records[0].protocol_version.as_deref(), Some("2026-07-28"));
    assert_eq!(records[4].protocol_version.as_deref(), Some("2025-11-25"));
    assert_eq!(
        records[4].id.as_ref().unwrap().digest,
        Digester::Plain.value(&json!(2))
    );
    assert_eq!(
        records[5]
            .arguments
            .as_ref()
            .unwrap()
            .identity_error
            .as_deref(),
        Some("identity_in_arguments")
    );
    assert!(records[4].request_digest.is_some());
}

#[tokio::test]
async fn http_probe_records_sessions_and_answers_discover() {
    let (_dir, log, _stdin, mut child) = logged_probe(
        "http.log",
        &[
            "--legacy-handshake",
            "--http",
            "127.0.0.1:0",
            "--digest-salt",
            "pepper",
        ],
    )
    .await;
    let url = callid::testing::http_url(&child).await.unwrap();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );

    let discover = Connection::http(&url).await.unwrap();
    let r = discover
        .request(
            json!("d-0"),
            "server/discover",
            json!({"_meta": {"io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"}}}),
        )
        .await
        .unwrap();
    assert_eq!(r.error.unwrap()["code"], json!(-32601));

    for (n, call_id) in ["call_one", "call_two"].iter().enumerate() {
        let conn = Connection::http(&url).await.unwrap();
        conn.initialize(json!(0), "2025-06-18", "codex-mcp-client", "0.171.0")
            .await
            .unwrap();
        let r = capabilities(
            &conn,
            json!(n + 1),
            json!({"callId": call_id, "threadId": "t"}),
        )
        .await;
        assert_eq!(
            r.structured().unwrap()["identity"]["verdict"],
            json!("accepted"),
            "{}",
            r.raw
        );
        conn.close().await;
    }
    let bad = Connection::http(&url).await.unwrap();
    bad.send_raw("{not json").await.unwrap();
    let unmatched = bad.take_unmatched();
    assert_eq!(unmatched.len(), 1, "{unmatched:?}");
    assert!(unmatched[0].contains("-32700"), "{unmatched:?}");
    // Records are written off the reply path: stop the probe the way a person does (SIGTERM,
    // which writes what is queued), not with kill -9.
    #[cfg(unix)]
    {
        // SAFETY: sending a signal to our own child process.
        assert_eq!(
            unsafe { libc::kill(child.pid().unwrap() as i32, libc::SIGTERM) },
            0
        );
        assert_eq!(child.wait().await.unwrap().code(), Some(0));
    }
    #[cfg(not(unix))]
    child.kill9().await.unwrap();

    let records = read_records(&log);
    assert_eq!(
        methods(&records),
        [
            "server/discover",
            "initialize",
            "notifications/initialized",
            "tools/call",
            "initialize",
            "notifications/initialized",
            "tools/call",
            "<Malformed>"
        ]
    );
    assert!(
        records
            .iter()
            .all(|r| r.transport == Transport::Http && r.digest == "hmac-sha256")
    );
    // One connection per session, and the session's client labels every request in it.
    assert_eq!(records[1].connection, records[3].connection);
    assert_ne!(records[3].connection, records[6].connection);
    assert_eq!(records[3].client.as_ref().unwrap().name, "codex-mcp-client");
    assert_eq!(records[3].protocol_version.as_deref(), Some("2025-06-18"));
    // Salted: the id digest of `1` is not the plain one.
    assert_ne!(
        records[3].id.as_ref().unwrap().digest,
        Digester::Plain.value(&json!(1))
    );
    let verdicts = callid::classify::classify(&records);
    let codex = verdicts
        .iter()
        .find(|v| v.client.name.as_deref() == Some("codex-mcp-client"))
        .unwrap();
    assert_eq!(codex.call_level_keys, ["callId"]);
    assert_eq!(codex.context_keys, ["threadId"]);
}

#[tokio::test]
async fn bad_input_gets_an_error_and_a_record_never_a_crash() {
    let (_dir, log, conn, mut child) = logged_probe("bad.log", &[]).await;
    conn.initialize(json!(0), "2025-11-25", "bad-input-client", "1")
        .await
        .unwrap();

    conn.send_raw(
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"x\":\"CANARY-trunc",
    )
    .await
    .unwrap();

    let big = json!({"blob": format!("CANARY-big-{}", "x".repeat(10 * 1024 * 1024))});
    let r = conn
        .call_tool(json!(2), "capabilities", json!({}), Some(big))
        .await
        .unwrap();
    let e = r.error.expect("an error for 10 MB");
    assert_eq!((r.id, e["code"].clone()), (json!(2), json!(-32600)));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the probe's limit of 1048576 bytes"),
        "{e}"
    );

    let mut deep = json!("CANARY-deep");
    for _ in 0..1000 {
        deep = json!([deep]);
    }
    let r = capabilities(&conn, json!(3), json!({"d": deep})).await;
    assert_eq!(
        (r.id, r.error.unwrap()["code"].clone()),
        (json!(3), json!(-32600))
    );

    let r = capabilities(&conn, json!(4), json!("CANARY-string-meta")).await;
    let e = r.error.unwrap();
    assert_eq!((r.id, e["code"].clone()), (json!(4), json!(-32602)));
    assert_eq!(
        e["message"],
        json!("invalid params: `_meta` must be a JSON object; got string")
    );

    let r = capabilities(&conn, json!(5), json!({"callId": "call_ok"})).await;
    assert_eq!(
        r.structured().unwrap()["identity"]["verdict"],
        json!("accepted"),
        "still serving"
    );
    let unmatched = conn.take_unmatched();
    assert!(
        unmatched.iter().any(|m| m.contains("-32700")),
        "{unmatched:?}"
    );
    close_expecting_exit_0(&conn, &mut child).await;

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("CANARY"), "no raw value in the log");
    assert!(
        text.len() < 64 * 1024,
        "the log stays small: {} bytes",
        text.len()
    );
    let records = read_records(&log);
    let errors: Vec<(Option<String>, Option<String>)> = records
        .iter()
        .filter(|r| {
            r.error.is_some()
                || r.meta.as_ref().is_some_and(|m| {
                    matches!(m, callid::probe::record::MetaRecord::NotObject { .. })
                })
        })
        .map(|r| (r.method.clone(), r.error.as_ref().map(|e| e.code.clone())))
        .collect();
    assert_eq!(
        errors,
        [
            (Some("tools/call".into()), Some("malformed_json".into())),
            (Some("tools/call".into()), Some("oversize".into())),
            (Some("tools/call".into()), Some("too_deep".into())),
            (Some("tools/call".into()), None),
        ]
    );
    let oversize = records
        .iter()
        .find(|r| r.error.as_ref().is_some_and(|e| e.code == "oversize"))
        .unwrap();
    assert!(oversize.bytes > 10 * 1024 * 1024);
    assert_eq!(
        oversize.id.as_ref().unwrap().digest,
        Digester::Plain.value(&json!(2))
    );
}

// ---------------------------------------------------------------------------------------------
// --wrap

/// Sends `lines` one at a time to a child, reading one reply line after each request, and
/// returns every byte the child wrote to stdout, and its exit code.
async fn transcript(
    program: &Path,
    args: &[String],
    lines: &[(&str, bool)],
) -> (Vec<u8>, Option<i32>) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    for (line, expects_reply) in lines {
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
        if *expects_reply {
            tokio::time::timeout(Duration::from_secs(20), stdout.read_until(b'\n', &mut seen))
                .await
                .expect("a reply")
                .unwrap();
        }
    }
    drop(stdin);
    stdout.read_to_end(&mut seen).await.unwrap();
    (seen, child.wait().await.unwrap().code())
}

#[tokio::test]
async fn wrap_is_byte_for_byte_transparent() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<(&str, bool)> = vec![
        (
            r#"{"jsonrpc":"2.0","id":"discover-0","method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/clientInfo":{"name":"codex-mcp-client","version":"0.171.0"}}}}"#,
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"codex-mcp-client","version":"0.171.0"}}}"#,
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            false,
        ),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, true),
        (
            r#"{ "jsonrpc" : "2.0", "id" : 2, "method" : "tools/call", "params" : { "name" : "capabilities", "arguments" : {}, "_meta" : { "callId" : "call_é\u00e9", "progressToken" : 0 } } }"#,
            true,
        ),
        ("{oops", true),
        (
            r#"{"jsonrpc":"2.0","id":"three","method":"tools/call","params":{"name":"capabilities","_meta":{"callId":"call_3"}}}"#,
            true,
        ),
    ];
    let direct_log = dir.path().join("direct.log");
    let (direct, direct_code) = transcript(
        &bin(),
        &[
            "probe".into(),
            "--log".into(),
            direct_log.display().to_string(),
        ],
        &lines,
    )
    .await;

    let wrap_log = dir.path().join("wrap.log");
    let inner_log = dir.path().join("inner.log");
    let server_saw = dir.path().join("server-saw.bin");
    let args: Vec<String> = vec![
        "probe".into(),
        "--log".into(),
        wrap_log.display().to_string(),
        "--wrap".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        r#"tee "$0" | "$1" probe --log "$2""#.into(),
        server_saw.display().to_string(),
        bin().display().to_string(),
        inner_log.display().to_string(),
    ];
    let (wrapped, wrapped_code) = transcript(&bin(), &args, &lines).await;

    assert_eq!(
        String::from_utf8_lossy(&wrapped),
        String::from_utf8_lossy(&direct)
    );
    assert_eq!(wrapped, direct, "the client sees the same bytes");
    assert_eq!((direct_code, wrapped_code), (Some(0), Some(0)));
    let sent: Vec<u8> = lines
        .iter()
        .flat_map(|(l, _)| format!("{l}\n").into_bytes())
        .collect();
    assert_eq!(
        std::fs::read(&server_saw).unwrap(),
        sent,
        "the server sees the same bytes"
    );

    let direct_records = read_records(&direct_log);
    let wrap_records = read_records(&wrap_log);
    assert_eq!(methods(&wrap_records), methods(&direct_records));
    assert!(wrap_records.iter().all(|r| r.transport == Transport::Wrap));
    let digests = |rs: &[Record]| {
        rs.iter()
            .map(|r| (r.request_digest.clone(), r.id.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(digests(&wrap_records), digests(&direct_records));
    // The wrap learned the agreed protocol from the server's reply.
    assert_eq!(
        wrap_records[3].protocol_version.as_deref(),
        Some("2025-06-18")
    );
}

#[test]
fn wrap_exits_with_the_servers_code_and_needs_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("w.log");
    let mut child = Command::new(bin())
        .args([
            "probe",
            "--log",
            log.to_str().unwrap(),
            "--wrap",
            "--",
            "sh",
            "-c",
            "cat >/dev/null; exit 7",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n")
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(7));
    assert_eq!(methods(&read_records(&log)), ["x"]);

    let out = callid(&["probe", "--wrap"]);
    assert_eq!(out.status.code(), Some(2));
    let out = callid(&["probe", "--wrap", "--", "/nonexistent/server"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("failed to start the wrapped server `/nonexistent/server`"),
        "{out:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// no leak

/// SplitMix64: a small seeded PRNG, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn canary(&mut self, tag: &str) -> String {
        let pad = "x".repeat(self.below(40) as usize);
        format!("{tag}{:016x}{pad}", self.next())
    }
    fn value(&mut self, depth: u32, tag: &str) -> Value {
        match (self.below(if depth > 3 { 4 } else { 7 }), depth) {
            (0, _) => json!(self.below(2) == 0),
            (1, _) => Value::Null,
            (2, _) => json!(self.below(1000)),
            (3, _) => json!(self.canary(tag)),
            (4 | 5, _) => {
                let n = self.below(4);
                Value::Object(
                    (0..n)
                        .map(|i| (format!("k{i}"), self.value(depth + 1, tag)))
                        .collect(),
                )
            }
            _ => {
                let n = self.below(4);
                Value::Array((0..n).map(|_| self.value(depth + 1, tag)).collect())
            }
        }
    }
}

const META_KEYS: [&str; 10] = [
    "callId",
    "claudecode/toolUseId",
    "progressToken",
    "openai/session",
    "x-codex-turn-metadata",
    "itemId",
    "io.modelcontextprotocol/related",
    "bad key!",
    "threadId",
    "traceparent",
];

fn random_meta(rng: &mut Rng) -> Option<Value> {
    match rng.below(10) {
        0 => None,
        1 => Some(json!(rng.canary("CANARY"))),
        _ => {
            let mut meta = serde_json::Map::new();
            for _ in 0..rng.below(8) {
                let key = META_KEYS[rng.below(META_KEYS.len() as u64) as usize];
                let value = if matches!(key, "callId" | "claudecode/toolUseId") && rng.below(2) == 0
                {
                    json!(rng.canary("CANARY"))
                } else {
                    rng.value(0, "CANARY")
                };
                meta.insert(key.to_string(), value);
            }
            if rng.below(8) == 0 {
                meta.insert(
                    "hubu.dev/platform-invocation".into(),
                    json!({"platform": "hubu", "invocation_id": rng.canary("CANARY"), "task_id": rng.canary("CANARY")}),
                );
            }
            Some(Value::Object(meta))
        }
    }
}

#[derive(Clone, Default)]
struct SharedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedLog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// 10,000 random `_meta` objects and argument sets, seeded with canary strings, go through the
/// tap exactly as the transports feed it (raw bytes, split at random, some truncated or with the
/// id last); the log's bytes hold no canary and no argument value.
#[test]
fn no_leak_property() {
    let log = SharedLog::default();
    let mut calls = 0;
    for mode in [Mode::Serve, Mode::Observe] {
        let tap = Arc::new(Tap::new(
            Digester::Plain,
            Arc::new(ShapeLog::from_writer(Box::new(log.clone()))),
            Transport::Stdio,
            mode,
        ));
        let mut rng = Rng(0x0C0F_FEE0 + mode as u64);
        let mut conn = tap.connection();
        let mut framer = LineFramer::default();
        let mut frames: Vec<Frame> = Vec::new();
        for i in 0..5_000u64 {
            let mut params = serde_json::Map::new();
            params.insert("name".into(), json!("capabilities"));
            let args = rng.value(0, "ARGVAL");
            params.insert(
                "arguments".into(),
                if rng.below(3) == 0 {
                    args
                } else {
                    json!({"prompt": rng.canary("ARGVAL"), "more": args})
                },
            );
            if let Some(meta) = random_meta(&mut rng) {
                params.insert("_meta".into(), meta);
            }
            let method = [
                "tools/call",
                "tools/call",
                "initialize",
                "notifications/progress",
            ][rng.below(4) as usize];
            let message = if method.starts_with("notifications/") {
                json!({"jsonrpc": "2.0", "method": method, "params": params})
            } else {
                json!({"jsonrpc": "2.0", "method": method, "params": params, "id": i})
            };
            let mut bytes = serde_json::to_vec(&message).unwrap();
            if rng.below(10) == 0 {
                let cut = 1 + rng.below(bytes.len() as u64 - 1) as usize;
                bytes.truncate(cut);
            }
            bytes.push(b'\n');
            let split = rng.below(bytes.len() as u64) as usize;
            framer.push(&bytes[..split], &mut frames);
            framer.push(&bytes[split..], &mut frames);
            for f in frames.drain(..) {
                conn.client_frame(&f);
            }
            calls += 1;
            if i % 1_000 == 999 {
                // Records are written off the caller's path, by a bounded queue: let it drain.
                tap.flush();
            }
        }
        assert_eq!(tap.finish().dropped, 0);
    }
    assert_eq!(calls, 10_000);
    let bytes = log.0.lock().unwrap().clone();
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.lines().count() >= 10_000, "every message is recorded");
    for needle in ["CANARY", "ARGVAL"] {
        if let Some(at) = text.find(needle) {
            let line = text[..at].lines().count();
            panic!("`{needle}` leaked into log line {line}");
        }
    }
    // The records are well-formed and some of each kind were exercised.
    let records: Vec<Record> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(records.iter().any(|r| r.error.is_some()));
    assert!(records.iter().any(|r| r.request_digest.is_some()));
    assert!(records.iter().any(|r| matches!(
        r.identity,
        Some(callid::probe::record::IdentityVerdict::Accepted { .. })
    )));
}

#[test]
fn probe_setup_errors_exit_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("missing-dir/probe.log");
    let log = log.to_str().unwrap();
    let out = callid(&["probe", "--log", log]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: failed to open the probe log `{log}` for appending"
        )),
        "{stderr}"
    );

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = callid(&["probe", "--http", &addr]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("error: failed to listen on `{addr}`")),
        "{stderr}"
    );

    let out = callid(&["classify", "--format", "junit", "x.log"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("error: invalid value 'junit' for '--format <FORMAT>'")
    );
}
