//! `callid demo`: three scripted clients against real probe processes, then the verdict table.
//!
//! The demo starts this same binary (`callid probe`) as child processes and drives each with the
//! hand-written client [`crate::jsonrpc`], sending the `_meta` shapes observed on real clients
//! (values are freshly generated, never real ones):
//! - a Codex-like client (stdio): `initialize` with `codex-mcp-client` 0.171.0 and protocol
//!   2025-06-18, then two calls in two turns with `callId`, `itemId`, `threadId`, `sessionId`,
//!   `windowId`, `progressToken` and `x-codex-turn-metadata`;
//! - a Claude-Code-like client (stdio): `server/discover` with a string id and protocol
//!   2026-07-28 (the probe, run with `--legacy-handshake`, answers `-32601`), then `initialize` with `claude-code` 2.1.332 and
//!   two calls with `claudecode/toolUseId` and `progressToken` equal to the JSON-RPC id;
//! - a chat-like client (streamable HTTP): a new connection per call, JSON-RPC id `0` every
//!   time, and only context keys in `_meta`.
//!
//! It then classifies the three logs with [`crate::classify::classify`]. The expected verdicts
//! are Codex accepted via `callId`, Claude Code accepted via `claudecode/toolUseId`, and the
//! chat-like client rejected with `missing_identity`; any difference is reported as a mismatch.

use crate::classify::{ClientVerdict, Verdict};
use crate::jsonrpc::{Child, Connection};
use crate::probe::server::CAPABILITIES_TOOL;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// What the demo found.
#[derive(Debug)]
pub struct DemoOutcome {
    /// One verdict per scripted client.
    pub verdicts: Vec<ClientVerdict>,
    /// Every way the run differed from the expected verdicts (empty when all is well).
    pub mismatches: Vec<String>,
}

/// The demo's failures.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The probe could not be driven.
    #[error("the {client} client failed against `callid probe`")]
    Client {
        /// Which scripted client.
        client: &'static str,
        /// The cause.
        #[source]
        source: crate::jsonrpc::RpcError,
    },
    /// The HTTP probe never said where it listens.
    #[error(
        "`callid probe --http 127.0.0.1:0` did not print its address within 10 s; its stderr: {0}"
    )]
    NoAddress(String),
    /// A temporary directory or log could not be used.
    #[error("failed to prepare the demo's temporary directory")]
    Io(#[source] std::io::Error),
    /// The logs could not be classified.
    #[error(transparent)]
    Classify(#[from] crate::classify::ClassifyError),
}

impl DemoError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            DemoError::Client { .. } => "demo_client",
            DemoError::NoAddress(_) => "demo_no_address",
            DemoError::Io(_) => "demo_io",
            DemoError::Classify(e) => e.code(),
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the three clients and classifies their logs.
pub async fn run() -> Result<DemoOutcome, DemoError> {
    let exe = std::env::current_exe().map_err(DemoError::Io)?;
    let dir = tempfile::tempdir().map_err(DemoError::Io)?;
    let logs = [
        dir.path().join("codex.log"),
        dir.path().join("claude-code.log"),
        dir.path().join("chat.log"),
    ];
    let mut mismatches = Vec::new();
    let (codex, claude, chat) = tokio::join!(
        codex_like(&exe, &logs[0]),
        claude_like(&exe, &logs[1]),
        chat_like(&exe, &logs[2]),
    );
    for answers in [codex?, claude?, chat?] {
        mismatches.extend(answers);
    }
    let (records, _bad) = crate::classify::read_logs(&logs)?;
    let verdicts = crate::classify::classify(&records);
    let expected: [(&str, Verdict, Option<&str>, Option<&str>); 3] = [
        ("codex-mcp-client", Verdict::Accepted, Some("callId"), None),
        (
            "claude-code",
            Verdict::Accepted,
            Some("claudecode/toolUseId"),
            None,
        ),
        (
            "chat-like-client",
            Verdict::Rejected,
            None,
            Some("missing_identity"),
        ),
    ];
    for (name, verdict, key, reason) in expected {
        match verdicts
            .iter()
            .find(|v| v.client.name.as_deref() == Some(name))
        {
            None => mismatches.push(format!("no verdict for `{name}`")),
            Some(v) => {
                if v.verdict != verdict
                    || v.source_key.as_deref() != key
                    || v.reason.as_deref() != reason
                {
                    mismatches.push(format!(
                        "`{name}`: expected {} ({}), got {} ({})",
                        verdict.name(),
                        key.or(reason).unwrap_or("-"),
                        v.verdict.name(),
                        v.source_key
                            .as_deref()
                            .or(v.reason.as_deref())
                            .unwrap_or("-")
                    ));
                }
            }
        }
    }
    Ok(DemoOutcome {
        verdicts,
        mismatches,
    })
}

fn rpc(client: &'static str) -> impl Fn(crate::jsonrpc::RpcError) -> DemoError {
    move |source| DemoError::Client { client, source }
}

async fn spawn_probe(exe: &Path, args: &[&str]) -> Result<(Connection, Child), DemoError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut conn, child) = Connection::spawn_stdio(exe, &args, &[])
        .await
        .map_err(rpc("probe"))?;
    conn.set_timeout(TIMEOUT);
    Ok((conn, child))
}

/// Checks the `capabilities` answer's verdict; returns a mismatch, if any.
fn check_answer(client: &str, response: &crate::jsonrpc::Response, want: &str) -> Option<String> {
    let got = response
        .structured()
        .and_then(|s| s.pointer("/identity/verdict"))
        .and_then(Value::as_str);
    (got != Some(want)).then(|| {
        format!(
            "`{client}`: the `capabilities` tool answered {got:?}, expected `{want}`: {}",
            response.raw
        )
    })
}

fn alnum(n: usize) -> String {
    let mut out = String::new();
    while out.len() < n {
        out.extend(uuid::Uuid::new_v4().simple().to_string().chars().map(|c| {
            if c.is_ascii_digit() {
                c
            } else {
                c.to_ascii_uppercase()
            }
        }));
    }
    out.truncate(n);
    out
}

async fn codex_like(exe: &Path, log: &Path) -> Result<Vec<String>, DemoError> {
    let e = rpc("Codex-like");
    let (conn, mut child) = spawn_probe(exe, &["probe", "--log", &log.to_string_lossy()]).await?;
    conn.initialize(json!(0), "2025-06-18", "codex-mcp-client", "0.171.0")
        .await
        .map_err(&e)?;
    conn.request(json!(1), "tools/list", json!({}))
        .await
        .map_err(&e)?;
    let thread = uuid::Uuid::new_v4().to_string();
    let mut mismatches = Vec::new();
    for (i, id) in [2, 3].into_iter().enumerate() {
        let turn = uuid::Uuid::new_v4().to_string();
        let meta = json!({
            "callId": format!("call_{}", alnum(24)),
            "itemId": format!("item_{}", alnum(24)),
            "threadId": thread,
            "sessionId": thread,
            "windowId": format!("{thread}:0"),
            "progressToken": i,
            "x-codex-turn-metadata": {
                "session_id": thread,
                "thread_id": thread,
                "model": "gpt-5.5-codex",
                "turn_id": turn,
                "turn_started_at_unix_ms": 1_796_000_000_000u64 + 60_000 * i as u64,
                "thread_source": "cli",
                "turn_trigger": "user",
                "sandbox": "workspace-write",
                "sandbox_mode": "workspace-write",
                "auto_review_enabled": false,
                "node_repl_auto_review_required": false,
                "node_repl_disabled": true,
                "codex_version": "0.171.0",
            },
        });
        let r = conn
            .call_tool(json!(id), CAPABILITIES_TOOL, json!({}), Some(meta))
            .await
            .map_err(&e)?;
        mismatches.extend(check_answer("codex-mcp-client", &r, "accepted"));
    }
    conn.close().await;
    let _ = tokio::time::timeout(TIMEOUT, child.wait()).await;
    Ok(mismatches)
}

async fn claude_like(exe: &Path, log: &Path) -> Result<Vec<String>, DemoError> {
    let e = rpc("Claude-Code-like");
    // `--legacy-handshake`: the fallback Claude Code 2.1 was observed to take against a server
    // without `server/discover`.
    let (conn, mut child) = spawn_probe(
        exe,
        &[
            "probe",
            "--legacy-handshake",
            "--log",
            &log.to_string_lossy(),
        ],
    )
    .await?;
    let mut mismatches = Vec::new();
    let discover = conn
        .request(
            json!("discover-1"),
            "server/discover",
            json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }}),
        )
        .await
        .map_err(&e)?;
    if discover.error.as_ref().and_then(|e| e.get("code")) != Some(&json!(-32601)) {
        mismatches.push(format!(
            "`claude-code`: `server/discover` was not answered with -32601: {}",
            discover.raw
        ));
    }
    conn.initialize(json!(0), "2025-11-25", "claude-code", "2.1.332")
        .await
        .map_err(&e)?;
    conn.request(json!(1), "tools/list", json!({}))
        .await
        .map_err(&e)?;
    for id in [2, 3] {
        let meta = json!({
            "claudecode/toolUseId": format!("toolu_01{}", alnum(22)),
            "progressToken": id,
        });
        let r = conn
            .call_tool(json!(id), CAPABILITIES_TOOL, json!({}), Some(meta))
            .await
            .map_err(&e)?;
        mismatches.extend(check_answer("claude-code", &r, "accepted"));
    }
    conn.close().await;
    let _ = tokio::time::timeout(TIMEOUT, child.wait()).await;
    Ok(mismatches)
}

async fn chat_like(exe: &Path, log: &Path) -> Result<Vec<String>, DemoError> {
    let e = rpc("chat-like");
    let (_stdin, mut child) = spawn_probe(
        exe,
        &[
            "probe",
            "--http",
            "127.0.0.1:0",
            "--log",
            &log.to_string_lossy(),
        ],
    )
    .await?;
    let url = http_url(&child).await?;
    let session = uuid::Uuid::new_v4().to_string();
    let subject = format!("v1/{}", alnum(40));
    let organization = format!("org-{}", alnum(24));
    let mut mismatches = Vec::new();
    for _ in 0..2 {
        let mut conn = Connection::http(&url).await.map_err(&e)?;
        conn.set_timeout(TIMEOUT);
        conn.initialize(json!(0), "2025-06-18", "chat-like-client", "1.0.0")
            .await
            .map_err(&e)?;
        let meta = json!({
            "openai/session": session,
            "openai/subject": subject,
            "openai/organization": organization,
            "openai/userLocation": {"city": "Lisbon", "country": "PT", "timezone": "Europe/Lisbon"},
            "openai/locale": "en-US",
            "openai/userAgent": "Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X)",
            "timezone": "Europe/Lisbon",
        });
        let r = conn
            .call_tool(json!(0), CAPABILITIES_TOOL, json!({}), Some(meta))
            .await
            .map_err(&e)?;
        mismatches.extend(check_answer("chat-like-client", &r, "rejected"));
        conn.close().await;
    }
    // SIGTERM: the probe writes the records still queued before it exits (SIGKILL lost them
    // when its writer was behind on a busy machine).
    match child.terminate(TIMEOUT).await {
        Ok(Some(status)) if status.success() => {}
        outcome => mismatches.push(format!(
            "`chat-like-client`: the HTTP probe did not exit 0 on SIGTERM within {} s ({outcome:?}); \
             its stderr: {}",
            TIMEOUT.as_secs(),
            child.stderr_text()
        )),
    }
    Ok(mismatches)
}

/// Waits for the HTTP probe's `listening on URL` line on stderr ([`crate::serve::http`]).
pub async fn http_url(child: &Child) -> Result<String, DemoError> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let text = child.stderr_text();
        // Only whole lines: the line may still be arriving.
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        if let Some(url) = complete.lines().find_map(|l| {
            l.split(" listening on ")
                .nth(1)
                .filter(|u| u.starts_with("http://"))
        }) {
            return Ok(url.trim().to_string());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(DemoError::NoAddress(text));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
