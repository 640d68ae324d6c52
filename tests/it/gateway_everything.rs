//! `callid gateway` in front of an MCP server callid did not write: the real
//! `@modelcontextprotocol/server-everything` (pinned in `matrices/clients`), which ignores every
//! idempotency key, as real paid servers do. The gateway starts it behind
//! `callid probe --wrap --log FILE`, so what reached the server is counted on the server's side,
//! from the probe's log, never from the gateway's word. Each test starts the gateway leading a
//! process group of its own and ends with no process of that group left (the gateway, the probe,
//! node).
//!
//! Without the server installed the tests say so and pass, unless `CALLID_REQUIRE_CLIENTS` is set
//! (CI sets it once its install of the pinned packages succeeded): then they fail.

use crate::common::mcp::{Served, code, codex, handle, next_id, owned, replayed};
use crate::common::probe::read_records;
use crate::common::{bin, installed_or_skip, repo};
use callid::jsonrpc::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a process of a stopped tree, or a record of the probe, may take to appear or go.
const SETTLE: Duration = Duration::from_secs(20);

/// The pinned server's entry point when it is installed (see [`installed_or_skip`]).
fn server_js() -> Option<PathBuf> {
    let js = repo().join(
        "matrices/clients/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    installed_or_skip(
        "@modelcontextprotocol/server-everything",
        &js,
        "run `npm install --no-save --prefix matrices/clients`",
        "CALLID_REQUIRE_CLIENTS",
    )
    .then_some(js)
}

/// The server on stdio: `node dist/index.js stdio`.
fn server_args(js: &Path) -> Vec<String> {
    vec![js.display().to_string(), "stdio".into()]
}

/// The live processes (zombies left out) of process group `pgid`: pid and name.
fn live_members(pgid: i32) -> Vec<(i32, String)> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`, where comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.get(2) == Some(&pgid.to_string().as_str()) && fields[0] != "Z" {
            found.push((pid, stat[open + 1..close].to_string()));
        }
    }
    found
}

/// A server under test leading its own process group, and everything it started. The group is
/// killed whole when this is dropped before [`stop`](Tree::stop) saw it empty, so a failing test
/// leaves no process behind either.
struct Tree {
    served: Served,
    pgid: i32,
    ended: bool,
}

impl Tree {
    async fn start(label: &'static str, program: &Path, args: &[String]) -> Tree {
        let served = Served::start_in(label, program, args, &[], None, true).await;
        let pgid = i32::try_from(served.child.pid().unwrap()).unwrap();
        Tree {
            served,
            pgid,
            ended: false,
        }
    }

    /// Ends the server the way a client does (its stdin closed): the programs in `expect` (a
    /// name listed twice, two processes of that name) must have been running in the group, and
    /// no process of the group may be left afterwards.
    async fn stop(mut self, expect: &[&str]) {
        let running = live_members(self.pgid);
        for program in expect {
            let want = expect.iter().filter(|p| *p == program).count();
            let have = running.iter().filter(|(_, name)| name == program).count();
            assert!(
                have >= want,
                "{want} `{program}` should run in the server's process group: {running:?}"
            );
        }
        self.served.conn.close().await;
        let status = tokio::time::timeout(SETTLE, self.served.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit once its stdin closed"))
            .unwrap();
        assert!(
            status.success(),
            "{status:?}\n{}",
            self.served.child.stderr_text()
        );
        let start = Instant::now();
        loop {
            let left = live_members(self.pgid);
            if left.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < SETTLE,
                "left running after the server exited: {left:?}\n{}",
                self.served.child.stderr_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.ended = true;
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if !self.ended {
            // SAFETY: kill(2) takes no pointer; a negative pid names the process group, which
            // still exists (its leader is not reaped until `served` drops, after this).
            unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        }
    }
}

/// The server's own answers (the JSON-RPC `result`) to `calls`, asked directly, with no gateway.
async fn direct_answers(js: &Path, calls: &[(&str, Value)]) -> Vec<Value> {
    let server = Tree::start("the server", Path::new("node"), &server_args(js)).await;
    let mut answers = vec![];
    for (tool, args) in calls {
        let r = server.served.call(tool, args.clone(), None).await;
        answers.push(r.result.unwrap_or_else(|| panic!("{tool}: {}", r.raw)));
    }
    server.stop(&["node"]).await;
    answers
}

/// `r`'s `result` without its `_meta`: what the agent reads of a tool's answer.
fn answer(r: &Response) -> Value {
    let mut result = r
        .tool_result()
        .unwrap_or_else(|| panic!("{}", r.raw))
        .clone();
    result.as_object_mut().unwrap().remove("_meta");
    result
}

/// Counts of `tools/call` by tool name.
fn counts(of: &[(&str, usize)]) -> BTreeMap<String, usize> {
    of.iter().map(|(t, n)| (t.to_string(), *n)).collect()
}

/// `callid gateway` in front of the server, wrapped in `callid probe --wrap`.
struct Everything {
    gateway: Tree,
    /// The probe's log: one record per message the gateway sent the server.
    log: PathBuf,
    /// `prompts/list` requests sent through to the server so far (see [`Everything::reached`]).
    barriers: usize,
    js: PathBuf,
    _dir: tempfile::TempDir,
}

impl Everything {
    /// `callid gateway --registry FRESH FLAGS -- callid probe --wrap --log LOG -- node ... stdio`,
    /// initialized; `None` when the server is not installed.
    async fn start(flags: &[&str]) -> Option<Everything> {
        let js = server_js()?;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("upstream.jsonl");
        let registry = dir.path().join("gateway.sqlite3");
        let mut args = owned(&["gateway", "--registry", registry.to_str().unwrap()]);
        args.extend(owned(flags));
        args.push("--".into());
        args.push(bin().display().to_string());
        args.extend(owned(&["probe", "--wrap", "--log", log.to_str().unwrap()]));
        args.extend(owned(&["--", "node"]));
        args.extend(server_args(&js));
        let gateway = Tree::start("the gateway", &bin(), &args).await;
        Some(Everything {
            gateway,
            log,
            barriers: 0,
            js,
            _dir: dir,
        })
    }

    async fn call(&self, tool: &str, args: Value, meta: Option<Value>) -> Response {
        self.gateway.served.call(tool, args, meta).await
    }

    /// How many `tools/call` of each tool reached the server so far, by the probe's log. A
    /// `prompts/list` passed through the gateway is the barrier: once its record is in the log,
    /// so is every record of what the gateway sent before it (one probe writes its records in
    /// the order it forwarded the messages).
    async fn reached(&mut self) -> BTreeMap<String, usize> {
        let r = self
            .gateway
            .served
            .conn
            .request(next_id(), "prompts/list", json!({}))
            .await
            .unwrap();
        assert!(r.result.is_some(), "{}", r.raw);
        self.barriers += 1;
        let start = Instant::now();
        loop {
            let records = if self.log.exists() {
                read_records(&self.log)
            } else {
                vec![]
            };
            let method =
                |r: &callid::probe::record::Record, m: &str| r.method.as_deref() == Some(m);
            if records.iter().filter(|r| method(r, "prompts/list")).count() >= self.barriers {
                let mut by_tool = BTreeMap::new();
                for r in records.iter().filter(|r| method(r, "tools/call")) {
                    *by_tool.entry(r.tool.clone().unwrap()).or_default() += 1;
                }
                return by_tool;
            }
            assert!(
                start.elapsed() < SETTLE,
                "the probe never logged barrier {}",
                self.barriers
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        // The gateway, the probe, node.
        self.gateway.stop(&["callid", "callid", "node"]).await;
    }
}

#[tokio::test]
async fn pass_through_tools_answer_as_the_server_does() {
    let Some(mut e) = Everything::start(&["--spend", "trigger-long-running-operation"]).await
    else {
        return;
    };
    let calls = [
        ("echo", json!({"message": "hello from the agent"})),
        ("get-sum", json!({"a": 2, "b": 3})),
    ];
    let direct = direct_answers(&e.js, &calls).await;
    for ((tool, args), want) in calls.iter().zip(&direct) {
        let plain = e.call(tool, args.clone(), None).await;
        assert_eq!(plain.result.as_ref(), Some(want), "{tool}: {}", plain.raw);
        // An agent's call id does not make a pass-through tool spend: it runs every time.
        let id = codex(&format!("pass-{tool}"));
        for _ in 0..2 {
            let with_id = e.call(tool, args.clone(), Some(id.clone())).await;
            assert_eq!(
                with_id.result.as_ref(),
                Some(want),
                "{tool}: {}",
                with_id.raw
            );
        }
    }
    assert_eq!(e.reached().await, counts(&[("echo", 3), ("get-sum", 3)]));
    e.stop().await;
}

#[tokio::test]
async fn a_spend_tool_reaches_the_server_once_per_call() {
    let Some(mut e) = Everything::start(&["--spend", "get-sum"]).await else {
        return;
    };
    let args = json!({"a": 19, "b": 23});
    let direct = direct_answers(&e.js, &[("get-sum", args.clone())])
        .await
        .remove(0);
    // One call delivered three times: new JSON-RPC ids, the same `_meta.callId`.
    let mut deliveries = vec![];
    for _ in 0..3 {
        deliveries.push(e.call("get-sum", args.clone(), Some(codex("sum-1"))).await);
    }
    let first = &deliveries[0];
    assert!(!first.is_tool_error(), "{}", first.raw);
    assert_eq!(answer(first), direct, "{}", first.raw);
    assert!(!replayed(first));
    for again in &deliveries[1..] {
        assert_eq!(answer(again), direct, "{}", again.raw);
        assert!(replayed(again), "{}", again.raw);
        assert_eq!(handle(again), handle(first));
    }
    assert_eq!(e.reached().await, counts(&[("get-sum", 1)]));

    // The same arguments under a new call id: a new call, run again.
    let second = e.call("get-sum", args, Some(codex("sum-2"))).await;
    assert_eq!(answer(&second), direct, "{}", second.raw);
    assert!(!replayed(&second));
    assert_ne!(handle(&second), handle(first));
    assert_eq!(e.reached().await, counts(&[("get-sum", 2)]));
    e.stop().await;
}

#[tokio::test]
async fn a_timed_out_spend_is_in_doubt_and_never_sent_again() {
    const TOOL: &str = "trigger-long-running-operation";
    const DURATION: u64 = 5;
    let Some(mut e) = Everything::start(&["--spend", TOOL, "--upstream-timeout", "2"]).await else {
        return;
    };
    let args = json!({"duration": DURATION, "steps": 5});
    let sent = Instant::now();
    let mut deliveries = vec![e.call(TOOL, args.clone(), Some(codex("slow-1"))).await];
    // Redelivered at once, while the server still works on the first delivery...
    deliveries.push(e.call(TOOL, args.clone(), Some(codex("slow-1"))).await);
    // ... and once more after the server finished it: it answers `DURATION` seconds after it
    // got the call, which was after `sent`.
    let finished = sent + Duration::from_secs(DURATION) + Duration::from_millis(1500);
    tokio::time::sleep_until(finished.into()).await;
    deliveries.push(e.call(TOOL, args, Some(codex("slow-1"))).await);

    let answers: Vec<String> = deliveries
        .iter()
        .map(|r| {
            if r.is_tool_error() {
                code(r).to_string()
            } else {
                r.raw.clone()
            }
        })
        .collect();
    // The count first: a second charge is the failure that matters, whatever the agent was told.
    assert_eq!(
        e.reached().await,
        counts(&[(TOOL, 1)]),
        "one call id reached the server more than once; the agent got: {answers:?}"
    );
    assert_eq!(answers, ["outcome_in_doubt"; 3]);
    for r in &deliveries[1..] {
        assert_eq!(handle(r), handle(&deliveries[0]), "{}", r.raw);
    }
    e.stop().await;
}
