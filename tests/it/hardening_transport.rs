//! The transport promises of every callid server, through the real binary: a log that cannot be
//! written never costs a reply (closed pipe, full disk), no colour in a log file, no secret of
//! `--provider-url` in a reply or a log, the provider's bearer token, and one loopback, `Host`
//! and `Origin` policy for the router, the probe and the provider.

use crate::common::bin;
use callid::jsonrpc::{Connection, Response};
use callid::provider::ProviderHandle;
use serde_json::{Value, json};
use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static RPC_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> Value {
    json!(RPC_ID.fetch_add(1, Ordering::Relaxed))
}

fn codex(id: &str) -> Value {
    json!({"callId": id, "openai/session": "sess-h1"})
}

fn fox() -> Value {
    json!({"prompt": "an origami fox"})
}

/// A temp directory with a provider served by this test process, and its ledger.
struct World {
    dir: tempfile::TempDir,
    provider: ProviderHandle,
    ledger: PathBuf,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("provider-ledger.sqlite3");
        let provider = crate::common::provider::spawn(&ledger, None).await;
        World {
            dir,
            provider,
            ledger,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn charges(&self) -> u64 {
        crate::common::provider::charge_count(&self.ledger)
    }

    /// `callid router` on stdio with the provider, `CALLID_LOG=debug` so that every step
    /// writes log lines.
    fn router_command(&self, extra: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(bin());
        command
            .arg("router")
            .arg("--registry")
            .arg(self.path("registry.sqlite3"))
            .args(["--provider-url", &self.provider.base_url()])
            .args(extra)
            .env("CALLID_LOG", "debug")
            .env_remove("CALLID_PROVIDER_TOKEN");
        command
    }
}

/// An MCP session over stdio with a started server.
async fn session(command: tokio::process::Command) -> (Connection, callid::jsonrpc::Child) {
    let (mut conn, child) = Connection::spawn_command(command).await.unwrap();
    conn.set_timeout(Duration::from_secs(30));
    let init = conn
        .initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap_or_else(|e| panic!("initialize failed: {e}"));
    assert!(init.result.is_some(), "initialize failed: {}", init.raw);
    (conn, child)
}

async fn spend(conn: &Connection, id: &str) -> Response {
    conn.call_tool(next_id(), "generate_image", fox(), Some(codex(id)))
        .await
        .unwrap_or_else(|e| panic!("no answer to the spend: {e}"))
}

/// The child's stderr once it holds `needle` (its reader runs on its own task, so the last lines
/// may still be on their way), or what it holds after 20 s.
async fn stderr_with(child: &callid::jsonrpc::Child, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = child.stderr_text();
        if text.contains(needle) || tokio::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn replayed(r: &Response) -> bool {
    r.tool_result().unwrap()["_meta"]["callid/replayed"] == json!(true)
}

/// A paid call is answered, and so is its redelivery (a replay, no second charge).
async fn assert_spend_and_redelivery_answered(w: &World, conn: &Connection, id: &str) {
    let first = spend(conn, id).await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    assert_eq!(w.charges(), 1);
    let again = spend(conn, id).await;
    assert!(!again.is_tool_error(), "{}", again.raw);
    assert!(replayed(&again), "{}", again.raw);
    assert_eq!(w.charges(), 1);
}

/// The write end of a pipe whose read end is already closed: every write to it fails with
/// `EPIPE`.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

#[tokio::test]
async fn router_with_a_closed_stderr_answers_a_paid_call_and_its_redelivery() {
    let w = World::new().await;
    let mut command = w.router_command(&[]);
    command.stderr(Stdio::from(closed_pipe()));
    let (conn, mut child) = session(command).await;
    assert_spend_and_redelivery_answered(&w, &conn, "closed-stderr-1").await;
    assert!(child.try_wait().unwrap().is_none(), "the router died");
    let _ = child.kill9().await;
}

#[tokio::test]
async fn probe_with_a_closed_stderr_answers_and_records_nothing_lost_but_the_log() {
    let mut command = tokio::process::Command::new(bin());
    command
        .arg("probe")
        .env("CALLID_LOG", "debug")
        .env_remove("CALLID_PROBE_LOG")
        .stderr(Stdio::from(closed_pipe()));
    let (conn, mut child) = session(command).await;
    for _ in 0..3 {
        let r = conn
            .call_tool(next_id(), "capabilities", json!({}), Some(codex("p-1")))
            .await
            .unwrap_or_else(|e| panic!("no answer: {e}"));
        assert!(r.tool_result().is_some(), "{}", r.raw);
    }
    assert!(child.try_wait().unwrap().is_none(), "the probe died");
    let _ = child.kill9().await;
}

/// A 64 KiB tmpfs, filled up, unmounted when dropped.
struct FullDisk {
    dir: tempfile::TempDir,
}

impl FullDisk {
    /// `Err(reason)` when this machine does not let the test mount one.
    fn mount() -> Result<FullDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "callid-test-full"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run `mount`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`mount -t tmpfs` refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let disk = FullDisk { dir };
        // The log file exists before the disk is full, so the router can open it.
        std::fs::File::create(disk.log()).unwrap();
        let mut filler = std::fs::File::create(disk.dir.path().join("filler")).unwrap();
        let block = vec![b'x'; 4096];
        while filler
            .write_all(&block)
            .and_then(|()| filler.sync_all())
            .is_ok()
        {}
        while filler
            .write_all(b"x")
            .and_then(|()| filler.sync_all())
            .is_ok()
        {}
        let err = std::fs::OpenOptions::new()
            .append(true)
            .open(disk.log())
            .unwrap()
            .write_all(b"x")
            .err();
        assert_eq!(
            err.map(|e| e.kind()),
            Some(std::io::ErrorKind::StorageFull),
            "the disk is not full"
        );
        Ok(disk)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    fn stderr(&self) -> Stdio {
        Stdio::from(
            std::fs::OpenOptions::new()
                .append(true)
                .open(self.log())
                .unwrap(),
        )
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test]
async fn router_probe_and_provider_with_stderr_on_a_full_disk_answer() {
    let disk = match FullDisk::mount() {
        Ok(disk) => disk,
        Err(reason) => {
            println!("SKIP: {reason}");
            return;
        }
    };
    let w = World::new().await;
    let mut command = w.router_command(&[]);
    command.stderr(disk.stderr());
    let (conn, mut child) = session(command).await;
    assert_spend_and_redelivery_answered(&w, &conn, "full-disk-1").await;
    assert!(child.try_wait().unwrap().is_none(), "the router died");
    let _ = child.kill9().await;

    let mut command = tokio::process::Command::new(bin());
    command
        .arg("probe")
        .env("CALLID_LOG", "debug")
        .env_remove("CALLID_PROBE_LOG")
        .stderr(disk.stderr());
    let (conn, mut child) = session(command).await;
    let r = conn
        .call_tool(next_id(), "capabilities", json!({}), Some(codex("p-2")))
        .await
        .unwrap_or_else(|e| panic!("no answer: {e}"));
    assert!(r.tool_result().is_some(), "{}", r.raw);
    let _ = child.kill9().await;

    provider_answers_whatever_its_stderr(disk.stderr()).await;
    assert_eq!(std::fs::metadata(disk.log()).unwrap().len(), 0);
}

/// A refused request (its warning cannot be written), then a paid one: both answered.
async fn provider_answers_whatever_its_stderr(stderr: Stdio) {
    let dir = tempfile::tempdir().unwrap();
    let mut provider = Provider::start(&dir.path().join("ledger.sqlite3"), &[], |c| {
        c.env("CALLID_LOG", "debug").stderr(stderr);
    });
    let client = http_client();
    let refused = client
        .get(format!("{}/v1/charges", provider.url))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let paid = client
        .post(format!("{}/v1/images", provider.url))
        .header("idempotency-key", "k-broken-stderr")
        .json(&fox())
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status().as_u16(), 200);
    assert!(provider.child.try_wait().unwrap().is_none(), "it died");
}

#[tokio::test]
async fn provider_with_a_closed_stderr_answers_after_logging_a_refusal() {
    provider_answers_whatever_its_stderr(Stdio::from(closed_pipe())).await;
}

/// The stderr of `callid router` whose `--diagnose-meta` file cannot be opened (a warning),
/// written to a file, with `envs` set and the colour variables otherwise unset.
fn warning_in_a_file(envs: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut command = std::process::Command::new(bin());
    command
        .arg("router")
        .arg("--registry")
        .arg(dir.path().join("registry.sqlite3"))
        // Under a plain file: the directory can be neither found nor created.
        .arg("--diagnose-meta")
        .arg(dir.path().join("stderr.log/meta.jsonl"))
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .env_remove("CALLID_LOG")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // With standard input closed at once it ends (exit status of no interest here).
    command.status().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("--diagnose-meta is off"), "{text}");
    text
}

#[test]
fn a_warning_written_to_a_file_carries_no_escape_codes() {
    let plain = warning_in_a_file(&[]);
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    assert!(plain.contains(" WARN "), "{plain:?}");
    let forced = warning_in_a_file(&[("CLICOLOR_FORCE", "1")]);
    assert!(forced.contains("\u{1b}["), "{forced:?}");
    let both = warning_in_a_file(&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]);
    assert!(!both.contains('\u{1b}'), "{both:?}");
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn secrets_in_the_provider_url_reach_neither_the_model_nor_the_log() {
    let w = World::new().await;
    let port = closed_port();
    let url =
        format!("http://opsuser-q7:hunter2@127.0.0.1:{port}/?api_key=sk-live-123&mode=zq9-fast");
    let mut command = tokio::process::Command::new(bin());
    command
        .arg("router")
        .arg("--registry")
        .arg(w.path("registry.sqlite3"))
        .args(["--provider-url", &url])
        .env("CALLID_LOG", "debug")
        .env_remove("CALLID_PROVIDER_TOKEN")
        .stderr(Stdio::piped());
    let (conn, mut child) = session(command).await;
    let r = spend(&conn, "secret-url-1").await;
    assert!(r.is_tool_error(), "{}", r.raw);
    assert_eq!(
        r.structured().unwrap()["error"],
        "provider_unavailable",
        "{}",
        r.raw
    );
    let shown = format!("http://REDACTED@127.0.0.1:{port}?api_key=REDACTED&mode=REDACTED");
    assert!(r.raw.contains(&shown), "{}", r.raw);
    let _ = child.kill9().await;
    let stderr = stderr_with(&child, "tool error").await;
    assert!(stderr.contains("tool error"), "{stderr}");
    for secret in ["hunter2", "sk-live-123", "opsuser-q7", "zq9-fast"] {
        assert!(
            !r.raw.contains(secret),
            "the reply shows `{secret}`: {}",
            r.raw
        );
        assert!(
            !stderr.contains(secret),
            "the log shows `{secret}`: {stderr}"
        );
    }

    let out = std::process::Command::new(bin())
        .args([
            "router",
            "--provider-url",
            "127.0.0.1:1/?api_key=sk-live-123",
        ])
        .arg("--registry")
        .arg(w.path("r2.sqlite3"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: invalid `--provider-url`: the URL does not parse"),
        "{stderr}"
    );
    assert!(!stderr.contains("sk-live-123"), "{stderr}");
}

/// A running `callid provider`; killed when dropped.
struct Provider {
    child: std::process::Child,
    url: String,
}

impl Provider {
    fn start(
        ledger: &Path,
        args: &[&str],
        configure: impl FnOnce(&mut std::process::Command),
    ) -> Provider {
        let mut command = std::process::Command::new(bin());
        command
            .args(["provider", "--ledger"])
            .arg(ledger)
            .args(args)
            .env_remove("CALLID_PROVIDER_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        configure(&mut command);
        let mut child = command.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim()
            .to_string();
        Provider { child, url }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn the_provider_token_is_required_sent_as_bearer_and_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let token = "tok-7f3a9c-secret";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let provider = Provider::start(
        &ledger,
        &["--token-file", token_file.to_str().unwrap()],
        |_| {},
    );
    let client = http_client();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some(token),
        Some("Basic dG9rOng="),
    ] {
        let mut request = client.get(format!("{}/v1/charges", provider.url));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{auth:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        assert!(!body.to_string().contains(token));
    }
    let ok = client
        .get(format!("{}/v1/charges", provider.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);

    let router = |envs: &[(&str, &str)], extra: &[&str]| {
        let mut command = tokio::process::Command::new(bin());
        command
            .arg("router")
            .arg("--registry")
            .arg(dir.path().join("registry.sqlite3"))
            .args(["--provider-url", &provider.url])
            .args(extra)
            .env("CALLID_LOG", "debug")
            .env_remove("CALLID_PROVIDER_TOKEN")
            .envs(envs.iter().copied())
            .stderr(Stdio::piped());
        command
    };
    let charges = || crate::common::provider::charge_count(&ledger);

    let (conn, mut child) = session(router(&[], &[])).await;
    let refused = spend(&conn, "tok-0").await;
    assert_eq!(
        refused.structured().unwrap()["error"],
        "provider_error",
        "{}",
        refused.raw
    );
    assert!(refused.raw.contains("unauthorized"), "{}", refused.raw);
    assert_eq!(charges(), 0);
    let _ = child.kill9().await;

    let file_flag = ["--provider-token-file", token_file.to_str().unwrap()];
    let (conn, mut child) = session(router(&[], &file_flag)).await;
    let paid = spend(&conn, "tok-1").await;
    assert!(!paid.is_tool_error(), "{}", paid.raw);
    assert_eq!(charges(), 1);
    let _ = child.kill9().await;
    let mut logs = stderr_with(&child, "operation completed").await;

    let (conn, mut child) = session(router(&[("CALLID_PROVIDER_TOKEN", token)], &[])).await;
    let paid = spend(&conn, "tok-2").await;
    assert!(!paid.is_tool_error(), "{}", paid.raw);
    assert_eq!(charges(), 2);
    let _ = child.kill9().await;
    let more = stderr_with(&child, "operation completed").await;
    assert!(
        logs.contains("operation completed") && more.contains("operation completed"),
        "{logs}\n{more}"
    );
    logs.push_str(&more);
    assert!(!logs.contains(token), "the log shows the token: {logs}");

    let out = std::process::Command::new(bin())
        .arg("router")
        .arg("--registry")
        .arg(dir.path().join("registry.sqlite3"))
        .args(["--provider-url", &provider.url])
        .args(file_flag)
        .env("CALLID_PROVIDER_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        "error: a token is given both in `--provider-token-file` and in \
         `CALLID_PROVIDER_TOKEN`; give it in one place\n"
    );
}

/// Starts a callid HTTP server (`router --http`, `probe --http`) and returns the URL it prints on
/// stderr, and the child.
fn start_http(args: &[&str], registry_dir: &Path) -> (String, Killed) {
    let mut command = std::process::Command::new(bin());
    command
        .args(args)
        .current_dir(registry_dir)
        .env_remove("CALLID_PROBE_LOG")
        .env_remove("CALLID_REGISTRY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Killed(command.spawn().unwrap());
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("`callid {}` exited before listening", args.join(" "));
        }
        if let Some(at) = line.find("http://") {
            let url = line[at..].trim().to_string();
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = stderr.read_to_end(&mut sink);
            });
            return (url, child);
        }
    }
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One raw HTTP/1.1 request with exactly these headers; returns the status and the body.
fn raw_http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `host:port` of an `http://host:port/path` URL.
fn authority(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn mcp_headers<'a>(host: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        ("host", host),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    h.extend_from_slice(extra);
    h
}

/// An MCP POST with reqwest: the status, the session id returned, and the body.
async fn mcp_post(
    url: &str,
    session: Option<&str>,
    origin: Option<&str>,
    body: Value,
) -> (u16, Option<String>, String) {
    let mut request = http_client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(body.to_string());
    if let Some(s) = session {
        request = request.header("mcp-session-id", s);
    }
    if let Some(o) = origin {
        request = request.header("origin", o);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (status, session, response.text().await.unwrap())
}

#[tokio::test]
async fn the_router_refuses_a_foreign_origin_before_it_charges_and_a_foreign_host() {
    let w = World::new().await;
    let (url, child) = start_http(
        &[
            "router",
            "--http",
            "127.0.0.1:0",
            "--registry",
            w.path("registry.sqlite3").to_str().unwrap(),
            "--provider-url",
            &w.provider.base_url(),
            "--allow-origin",
            "https://app.example.com",
        ],
        w.dir.path(),
    );
    let _child = child;
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let (status, session, _) = mcp_post(&url, None, None, init).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let (status, _, _) = mcp_post(
        &url,
        Some(&session),
        None,
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    )
    .await;
    assert_eq!(status, 202);
    let call = |id: &str| {
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
            "name":"generate_image","arguments":fox(),"_meta":codex(id)}})
    };
    let (status, _, body) = mcp_post(
        &url,
        Some(&session),
        Some("https://evil.example"),
        call("origin-1"),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("`Origin: https://evil.example` is not allowed"),
        "{body}"
    );
    assert_eq!(w.charges(), 0, "a refused request charged");
    let (status, _, body) = mcp_post(
        &url,
        Some(&session),
        Some("https://app.example.com"),
        call("origin-1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(w.charges(), 1);
    let (status, _, body) = mcp_post(&url, Some(&session), None, call("origin-2")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(w.charges(), 2);

    let addr = authority(&url);
    let (status, body) = raw_http(
        &addr,
        "POST",
        "/mcp",
        &mcp_headers("evil.example", &[]),
        INITIALIZE,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("DNS rebinding"), "{body}");
}

#[tokio::test]
async fn the_probe_refuses_foreign_origins_and_hosts_and_records_nothing_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("probe.log");
    let (url, child) = start_http(
        &[
            "probe",
            "--http",
            "127.0.0.2:0",
            "--log",
            log.to_str().unwrap(),
        ],
        dir.path(),
    );
    let _child = child;
    assert!(url.starts_with("http://127.0.0.2:"), "{url}");
    let addr = authority(&url);
    let evil = mcp_headers(&addr, &[("origin", "https://evil.example")]);
    let (status, body) = raw_http(&addr, "POST", "/mcp", &evil, INITIALIZE);
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw_http(
        &addr,
        "POST",
        "/mcp",
        &mcp_headers("rebound.example", &[]),
        INITIALIZE,
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "");
    // The probe's own origin, and no origin, are served on the 127.0.0.2 alias.
    let own = format!("http://{addr}");
    let (status, body) = raw_http(
        &addr,
        "POST",
        "/mcp",
        &mcp_headers(&addr, &[("origin", own.as_str())]),
        INITIALIZE,
    );
    assert_eq!(status, 200, "{body}");
    let conn = Connection::http(&url).await.unwrap();
    let init = conn
        .initialize(json!(0), "2025-06-18", "alias-client", "1")
        .await
        .unwrap();
    assert!(init.result.is_some(), "{}", init.raw);
    // Records are written off the reply path (the probe's writer thread): wait for this one,
    // 10 s at most.
    let mut recorded = String::new();
    for _ in 0..400 {
        recorded = std::fs::read_to_string(&log).unwrap_or_default();
        if recorded.contains("alias-client") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(recorded.contains("alias-client"), "{recorded}");
}

#[tokio::test]
async fn the_provider_checks_host_and_origin_like_the_router() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(
        &dir.path().join("ledger.sqlite3"),
        &[
            "--listen",
            "localhost:0",
            "--allow-origin",
            "http://localhost:3000",
        ],
        |_| {},
    );
    assert!(
        provider.url.starts_with("http://127.0.0.1:"),
        "{}",
        provider.url
    );
    let addr = authority(&provider.url);
    let get = |host: &str, origin: Option<&str>| {
        let mut headers = vec![("host", host)];
        if let Some(origin) = origin {
            headers.push(("origin", origin));
        }
        raw_http(&addr, "GET", "/v1/charges", &headers, "").0
    };
    let port = addr.rsplit(':').next().unwrap();
    let localhost = format!("localhost:{port}");
    assert_eq!(get(&addr, None), 200);
    assert_eq!(get(&localhost, None), 200);
    assert_eq!(get(&format!("attacker.example:{port}"), None), 403);
    assert_eq!(get(&addr, Some("https://evil.example")), 403);
    assert_eq!(get(&addr, Some("http://localhost:3000")), 200);
    assert_eq!(get(&addr, Some("null")), 403);
}

#[tokio::test]
async fn loopback_aliases_and_localhost_serve_the_router() {
    let dir = tempfile::tempdir().unwrap();
    for (listen, prefix) in [
        ("127.0.0.2:0", "http://127.0.0.2:"),
        ("localhost:0", "http://127.0.0.1:"),
    ] {
        let registry = dir.path().join(format!("{}.sqlite3", &listen[..9]));
        let (url, child) = start_http(
            &[
                "router",
                "--http",
                listen,
                "--registry",
                registry.to_str().unwrap(),
            ],
            dir.path(),
        );
        let _child = child;
        assert!(url.starts_with(prefix), "{url}");
        let conn = Connection::http(&url).await.unwrap();
        let init = conn
            .initialize(json!(0), "2025-06-18", "alias", "1")
            .await
            .unwrap();
        assert!(init.result.is_some(), "{listen}: {}", init.raw);
        let caps = conn
            .call_tool(next_id(), "capabilities", json!({}), None)
            .await
            .unwrap();
        assert!(!caps.is_tool_error(), "{listen}: {}", caps.raw);
    }
}

/// `callid ARGS` in `dir` with stdin closed, which must refuse to start (exit 2): its stderr.
fn refused_at_start(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

#[test]
fn every_server_refuses_a_non_loopback_address_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    for (args, flag) in [
        (vec!["probe", "--http", "0.0.0.0:0"], "--http"),
        (
            vec!["router", "--http", "0.0.0.0:0", "--registry", "r.sqlite3"],
            "--http",
        ),
        (
            vec!["provider", "--listen", "0.0.0.0:0", "--ledger", "l.sqlite3"],
            "--listen",
        ),
    ] {
        let stderr = refused_at_start(dir.path(), &args);
        assert!(
            stderr.starts_with("error: refusing to serve on `0.0.0.0:0`")
                && stderr.contains("listens on loopback only")
                && stderr.contains(&format!("use `{flag} 127.0.0.1:PORT`")),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a file was created"
    );
}

#[test]
fn a_port_in_use_is_refused_naming_the_fix_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    for (args, flag) in [
        (
            vec!["router", "--http", &addr, "--registry", "r.sqlite3"],
            "--http",
        ),
        (
            vec!["provider", "--listen", &addr, "--ledger", "l.sqlite3"],
            "--listen",
        ),
        (vec!["probe", "--http", &addr], "--http"),
    ] {
        let stderr = refused_at_start(dir.path(), &args);
        assert!(
            stderr.starts_with(&format!(
                "error: failed to listen on `{addr}`: another program listens there; stop it, \
                 or pick another port (`{flag} 127.0.0.1:0` picks a free one): "
            )),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?} created a file"
        );
    }
    drop(busy);
}
