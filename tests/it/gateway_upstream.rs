//! `callid gateway`'s connection to its upstream, with real processes: the secrets of an
//! `--upstream-url` reach neither the agent nor standard error when the upstream is down, and an
//! upstream answer longer than the stdio line limit is reported (size and limit) at once, not
//! after the timeout.

use crate::common::bin;
use crate::common::mcp::{Served, code, codex, meta};
use callid::jsonrpc::{Connection, Response};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The secrets of [`secret_url`], each of which must never be shown.
const SECRETS: [&str; 4] = ["user7Qx", "pw7Qx", "SECRET9Zk", "frag3Vb"];

/// `base` (`http://HOST:PORT/mcp`) with a user and password, an API key and a fragment.
fn secret_url(base: &str) -> String {
    let rest = base.strip_prefix("http://").unwrap();
    format!("http://user7Qx:pw7Qx@{rest}?api_key=SECRET9Zk#frag3Vb")
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn assert_hidden(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows `{secret}`:\n{text}");
    }
}

#[test]
fn the_start_up_refusal_shows_no_secret_of_the_upstream_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let url = secret_url(&format!("http://127.0.0.1:{port}/mcp"));
    let out = std::process::Command::new(bin())
        .arg("gateway")
        .arg("--registry")
        .arg(dir.path().join("r.sqlite3"))
        .args(["--upstream-url", &url, "--spend", "x"])
        .env("CALLID_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_hidden("stdout", &stdout);
    assert_hidden("stderr", &stderr);
    let refusal = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(refusal.contains(&format!("127.0.0.1:{port}")), "{refusal}");
    insta::assert_snapshot!(
        "start_up_refusal_redacted",
        refusal.replace(&port.to_string(), "PORT")
    );

    let out = std::process::Command::new(bin())
        .arg("gateway")
        .arg("--registry")
        .arg(dir.path().join("r.sqlite3"))
        .args(["--upstream-url", "127.0.0.1:1/mcp?api_key=SECRET9Zk"])
        .args(["--spend", "x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: invalid `--upstream-url`: the URL does not parse"),
        "{stderr}"
    );
    assert_hidden("stderr", &stderr);
}

/// The message of a tool error (its operation's handle replaced by `HANDLE`) or of a JSON-RPC
/// error.
fn message(r: &Response) -> String {
    match &r.error {
        Some(e) => format!(
            "JSON-RPC error {}: {}",
            e["code"],
            e["message"].as_str().unwrap()
        ),
        None => {
            let text = format!(
                "tool error {}: {}",
                code(r),
                r.structured().unwrap()["message"].as_str().unwrap()
            );
            let text = match meta(r)["callid/handle"].as_str() {
                Some(h) => text.replace(h, "HANDLE"),
                None => text,
            };
            // The registry is a temporary file: `--registry PATH` becomes `--registry REGISTRY`.
            match text.split_once("`--registry ") {
                Some((before, after)) => match after.split_once('`') {
                    Some((_, rest)) => format!("{before}`--registry REGISTRY`{rest}"),
                    None => text,
                },
                None => text,
            }
        }
    }
}

#[tokio::test]
async fn an_upstream_that_died_shows_no_secret_of_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let probe_args: Vec<String> = ["probe", "--http", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (_probe_stdin, mut probe) = Connection::spawn_stdio(&bin(), &probe_args, &[])
        .await
        .unwrap();
    let base = callid::testing::http_url(&probe).await.unwrap();
    let host_port = base
        .strip_prefix("http://")
        .and_then(|r| r.strip_suffix("/mcp"))
        .unwrap()
        .to_string();
    let args: Vec<String> = vec![
        "gateway".into(),
        "--registry".into(),
        dir.path().join("r.sqlite3").display().to_string(),
        "--spend".into(),
        "capabilities".into(),
        "--upstream-url".into(),
        secret_url(&base),
        "--upstream-timeout".into(),
        "5".into(),
    ];
    let env = [("CALLID_LOG".to_string(), "debug".to_string())];
    let g = Served::start("the gateway", &bin(), &args, &env, None).await;
    let up = g.call("capabilities", json!({}), Some(codex("u1"))).await;
    assert!(!up.is_tool_error(), "{}", up.raw);
    probe.kill9().await.unwrap();
    probe.wait().await.unwrap();

    let mut replies = vec![];
    for id in ["u2", "u3"] {
        replies.push(g.call("capabilities", json!({}), Some(codex(id))).await);
    }
    replies.push(g.call("not_a_spend_tool", json!({}), None).await);
    replies.push(
        g.conn
            .request(json!("r1"), "resources/list", json!({}))
            .await
            .unwrap(),
    );
    let unmatched = g.conn.take_unmatched().join("\n");
    let stderr = g.stop().await;
    for r in &replies {
        assert_hidden("a reply", &r.raw);
        assert!(r.raw.contains(&host_port), "{}", r.raw);
    }
    assert_hidden("stdout", &unmatched);
    assert_hidden("stderr", &stderr);
    assert!(stderr.contains(&host_port), "{stderr}");
    let shown: Vec<String> = replies
        .iter()
        .map(|r| message(r).replace(&host_port, "HOST:PORT"))
        .collect();
    insta::assert_snapshot!("upstream_down_redacted", shown.join("\n"));
}

/// rmcp's stdio line limit, the gateway's default `--upstream-max-message-bytes`.
const DEFAULT_LIMIT: usize = 16 * 1024 * 1024;
/// An answer's text just over the default limit.
const HUGE: usize = DEFAULT_LIMIT + 1024;

/// A gateway (`--spend pay`, `extra` flags) in front of `tests/fixtures/big_answer_upstream.py`.
async fn big_answer_gateway(dir: &std::path::Path, extra: &[&str]) -> Served {
    let mut args: Vec<String> = vec![
        "gateway".into(),
        "--registry".into(),
        dir.join("r.sqlite3").display().to_string(),
        "--spend".into(),
        "pay".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend([
        "--".into(),
        "python3".into(),
        crate::common::repo()
            .join("tests/fixtures/big_answer_upstream.py")
            .display()
            .to_string(),
    ]);
    Served::start(
        "the gateway",
        &bin(),
        &args,
        &[],
        Some(Duration::from_secs(120)),
    )
    .await
}

/// The upstream's process id, from its `whoami` tool.
async fn upstream_pid(g: &Served) -> String {
    let r = g.call("whoami", json!({}), None).await;
    r.tool_result().unwrap()["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.raw))
        .to_string()
}

/// The number after `before` in `text`.
fn number_after(text: &str, before: &str) -> usize {
    let rest = &text[text.find(before).unwrap_or_else(|| panic!("{text}")) + before.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("{text}"))
}

#[tokio::test]
async fn an_answer_over_the_line_limit_fails_at_once_naming_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let g = big_answer_gateway(dir.path(), &["--upstream-timeout", "60"]).await;
    let pid = upstream_pid(&g).await;

    let started = Instant::now();
    let paid = g
        .call("pay", json!({"size": HUGE}), Some(codex("big1")))
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "took {took:?}: {}",
        paid.raw
    );
    let text = message(&paid);
    assert!(text.starts_with("tool error outcome_"), "{text}");
    let bytes = number_after(&text, "a message of ");
    assert!(bytes > HUGE && bytes < HUGE + 200, "{text}");
    assert_eq!(
        number_after(&text, "longer than the "),
        DEFAULT_LIMIT,
        "{text}"
    );
    assert!(text.contains("--upstream-max-message-bytes"), "{text}");
    let repo = crate::common::repo().display().to_string();
    insta::assert_snapshot!(
        "oversized_spend",
        text.replace(&bytes.to_string(), "BYTES")
            .replace(&repo, "REPO")
    );

    let passed = g.call("dump", json!({"size": HUGE}), None).await;
    let text = message(&passed);
    assert!(text.starts_with("JSON-RPC error -32603: "), "{text}");
    assert_eq!(number_after(&text, "answer is "), bytes, "{text}");
    insta::assert_snapshot!(
        "oversized_pass_through",
        text.replace(&bytes.to_string(), "BYTES")
    );

    // The connection reads on: the same upstream process answers the next calls.
    assert_eq!(upstream_pid(&g).await, pid);
    let small = g
        .call("pay", json!({"size": 10}), Some(codex("big2")))
        .await;
    assert!(!small.is_tool_error(), "{}", small.raw);
    assert_eq!(upstream_pid(&g).await, pid);
    g.stop().await;
}

#[tokio::test]
async fn a_raised_limit_receives_the_same_answer_whole() {
    let dir = tempfile::tempdir().unwrap();
    let limit = (2 * DEFAULT_LIMIT).to_string();
    let g = big_answer_gateway(
        dir.path(),
        &[
            "--upstream-max-message-bytes",
            &limit,
            "--upstream-timeout",
            "60",
        ],
    )
    .await;
    let paid = g
        .call("pay", json!({"size": HUGE}), Some(codex("big1")))
        .await;
    assert!(!paid.is_tool_error(), "{}", crate::common::mcp::code(&paid));
    let text = paid.tool_result().unwrap()["content"][0]["text"]
        .as_str()
        .unwrap();
    assert_eq!(text.len(), HUGE);
    let passed = g.call("dump", json!({"size": HUGE}), None).await;
    assert_eq!(
        passed.tool_result().unwrap()["content"][0]["text"]
            .as_str()
            .map(str::len),
        Some(HUGE)
    );
    g.stop().await;
}

#[test]
fn a_limit_too_small_for_initialize_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .arg("gateway")
        .arg("--registry")
        .arg(dir.path().join("r.sqlite3"))
        .args(["--spend", "pay", "--upstream-max-message-bytes", "100"])
        .args(["--", "python3", "-c", "pass"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    insta::assert_snapshot!(
        String::from_utf8_lossy(&out.stderr),
        @"error: `--upstream-max-message-bytes` must be at least 1024 (an `initialize` answer must fit)"
    );
}
