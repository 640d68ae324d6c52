//! Integration tests of `callid bench`: the real binary, its real baseline server, and a smoke
//! run of every row. Timing targets are not asserted here (a debug build on a shared machine says
//! nothing about them); that every row measures, skips with a reason, or fails loudly is.

use crate::common;
use crate::common::procs::{self, Proc, descendants, processes};
use callid::jsonrpc::Connection;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bench(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(common::bin())
        .arg("bench")
        .args(args)
        .current_dir(common::repo())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("callid runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn rows(stdout: &str) -> Vec<Value> {
    let report: Value = serde_json::from_str(stdout).expect("the json format is JSON");
    report["rows"].as_array().expect("rows").clone()
}

/// The JSON rows of `callid bench --quick --only ROWS`, which must succeed with one row each, in
/// that order.
fn quick_rows(only: &[&str]) -> Vec<Value> {
    let mut args = vec!["--quick", "--only"];
    args.extend(only);
    args.extend(["--format", "json"]);
    let (code, stdout, stderr) = bench(&args);
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    let rows = rows(&stdout);
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, only);
    rows
}

#[test]
fn bench_in_process_rows_measure_paired_ratios() {
    let rows = quick_rows(&["shape_extraction", "request_hash"]);
    for row in &rows {
        assert_eq!(row["outcome"], "measured", "{row}");
        assert!(
            matches!(row["verdict"].as_str(), Some("met" | "missed")),
            "{row}"
        );
        assert_eq!(row["rounds"], 11, "{row}");
        let ratio = row["value"].as_f64().expect("a ratio");
        let figure = row["figure_median"]["seconds_per_op"].as_f64().unwrap();
        let baseline = row["baseline_median"]["seconds_per_op"].as_f64().unwrap();
        assert!(ratio > 0.0 && figure > 0.0 && baseline > 0.0, "{row}");
        assert_eq!(
            row["command"],
            format!(
                "callid bench --only {} --quick",
                row["id"].as_str().unwrap()
            )
        );
    }
}

/// The report names where the run's files went and their file system, and warns when that is
/// memory: `/dev/shm` (tmpfs on Linux) as `TMPDIR`, against the test's own scratch directory.
#[cfg(target_os = "linux")]
#[test]
fn bench_names_its_scratch_file_system_and_warns_on_memory() {
    let run = |tmpdir: &std::path::Path, format: &str| {
        let output = Command::new(common::bin())
            .args([
                "bench",
                "--quick",
                "--only",
                "request_hash",
                "--format",
                format,
            ])
            .env("TMPDIR", tmpdir)
            .output()
            .expect("callid runs");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let shm = tempfile::Builder::new()
        .prefix("callid-bench-scratch-")
        .tempdir_in("/dev/shm")
        .expect("/dev/shm is there on Linux");
    let report: Value = serde_json::from_str(&run(shm.path(), "json")).unwrap();
    let scratch = &report["machine"]["scratch"];
    assert_eq!(scratch["dir"], shm.path().to_str().unwrap(), "{report}");
    assert_eq!(scratch["filesystem"], "tmpfs", "{report}");
    let table = run(shm.path(), "table");
    let mut lines = table.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .ends_with(&format!(", files under {} (tmpfs)", shm.path().display())),
        "{table}"
    );
    assert!(
        lines.next().unwrap().starts_with(&format!(
            "warning: {} is on tmpfs, so no commit reaches a disk",
            shm.path().display()
        )),
        "{table}"
    );

    // Wherever the tests' own scratch directory is, the report says which file system it is,
    // and warns only if that is memory.
    let own = tempfile::tempdir().unwrap();
    let own_dir = std::fs::canonicalize(own.path()).unwrap();
    let report: Value = serde_json::from_str(&run(&own_dir, "json")).unwrap();
    let scratch = callid::testing::Scratch {
        dir: report["machine"]["scratch"]["dir"].as_str().unwrap().into(),
        filesystem: report["machine"]["scratch"]["filesystem"]
            .as_str()
            .unwrap()
            .into(),
    };
    assert_eq!(scratch.dir, own_dir.to_str().unwrap(), "{report}");
    assert_ne!(scratch.filesystem, "unknown", "{report}");
    let table = run(&own_dir, "table");
    assert_eq!(
        table.contains("so no commit reaches a disk"),
        scratch.in_memory(),
        "{table}"
    );
}

#[test]
fn bench_unknown_row_is_a_usage_error_naming_the_known_rows() {
    let (code, stdout, stderr) = bench(&["--only", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(stdout, "");
    insta::assert_snapshot!(stderr, @"error: unknown bench row `nope` (known: probe_round_trip, probe_throughput, shape_extraction, request_hash, router_new_operation, router_concurrent, router_replay, conform_suite, probe_rss, router_rss, postgres_new_operation, postgres_replicas, postgres_network)");
}

#[test]
fn bench_without_python_mcp_skips_the_throughput_row_with_the_reason() {
    let (code, stdout, stderr) = bench(&[
        "--quick",
        "--only",
        "probe_throughput",
        "--python",
        "/nonexistent/python3",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "a skip is not an error; stderr: {stderr}");
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["verdict"], "skipped");
    let reason = rows[0]["reason"].as_str().expect("a reason");
    assert!(
        reason.contains("`/nonexistent/python3` cannot be started"),
        "{reason}"
    );
    assert!(
        reason.contains("pip install -r matrices/clients/requirements.txt"),
        "{reason}"
    );
}

#[tokio::test]
async fn bench_baseline_is_a_bare_mcp_server_with_the_probe_tool_and_echo() {
    let (conn, mut child) = Connection::spawn_stdio(
        &common::bin(),
        &["bench".to_string(), "--serve-baseline".to_string()],
        &[],
    )
    .await
    .expect("starts");
    let init = conn
        .initialize(json!(0), "2025-06-18", "test", "1")
        .await
        .expect("initializes");
    assert_eq!(
        init.result.as_ref().unwrap()["serverInfo"]["name"],
        "callid-bench-baseline"
    );
    let tools = conn
        .request(json!(1), "tools/list", json!({}))
        .await
        .expect("lists");
    let names: Vec<&str> = tools.result.as_ref().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["capabilities", "echo"]);

    let meta = callid::testing::fixtures::codex_meta(1);
    let caps = conn
        .call_tool(json!(2), "capabilities", json!({}), Some(meta.clone()))
        .await
        .expect("answers");
    let keys = caps.structured().expect("structured")["keys"].clone();
    let expected: Vec<&String> = meta.as_object().unwrap().keys().collect();
    assert_eq!(keys, json!(expected));

    let arguments = callid::testing::fixtures::generate_image_arguments();
    let echo = conn
        .call_tool(json!(3), "echo", arguments.clone(), Some(meta))
        .await
        .expect("answers");
    assert_eq!(echo.structured(), Some(&arguments));
    conn.close().await;
    let status = child.wait().await.expect("exits");
    assert!(status.success(), "{status}");
}

#[test]
fn bench_end_to_end_rows_measure_the_real_probe_and_router() {
    let rows = quick_rows(&[
        "probe_round_trip",
        "router_new_operation",
        "router_replay",
        "probe_rss",
    ]);
    for row in &rows {
        assert_eq!(row["outcome"], "measured", "{row}");
        assert!(row["value"].as_f64().unwrap() > 0.0, "{row}");
    }
    let mb = rows[3]["value"].as_f64().unwrap();
    assert!((1.0..500.0).contains(&mb), "a plausible peak RSS: {mb} MB");
    // The new-operation row says what this machine allows: three commits and a round trip take
    // longer than three commits, so its ceiling is above 0 and below 1/3.
    let note = rows[1]["note"].as_str().unwrap();
    let ceiling: f64 = note
        .split("ceiling on this machine ")
        .nth(1)
        .and_then(|rest| rest.split('x').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ceiling in the note: {note}"));
    assert!(ceiling > 0.0 && ceiling < 1.0 / 3.0, "{note}");
    // Beside it, the floor's time per operation and the router's CPU time per new operation: a
    // plausible figure for a debug build, zero included (a quick run's batches may take less
    // than one clock tick of the router's CPU).
    assert!(number_before(note, " ms per operation)") > 0.0, "{note}");
    let cpu = note
        .split("CPU time per new operation (/proc/PID/stat, during the figure's batches): ")
        .nth(1)
        .unwrap_or_else(|| panic!("no CPU time per new operation in: {note}"));
    assert!(cpu.starts_with("the router "), "{note}");
    let router_ms = number_before(cpu, " ms");
    assert!((0.0..1000.0).contains(&router_ms), "{note}");
}

/// The number before `marker` in `note` (`18.9 round trips to the server` -> 18.9).
fn number_before(note: &str, marker: &str) -> f64 {
    note.split(marker)
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .map(|n| n.trim_start_matches('('))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before `{marker}` in: {note}"))
}

#[test]
fn bench_postgres_rows_count_round_trips_delay_the_link_and_charge_cpu_per_operation() {
    let test = "bench_postgres_rows_count_round_trips_delay_the_link_and_charge_cpu_per_operation";
    if callid::pg_cluster::bindir().is_none() {
        // The rows skip themselves then; `tests/it/pg.rs` says why (and fails in CI).
        assert!(crate::pg::PgCluster::start(test).is_none());
        return;
    }
    let rows = quick_rows(&[
        "postgres_new_operation",
        "postgres_replicas",
        "postgres_network",
    ]);
    for row in &rows {
        assert_eq!(row["outcome"], "measured", "{row}");
    }
    // Counted on the wire, not estimated: a new operation needs at least the row's commit and
    // the result's, so two round trips or more, in both rows and on both sides of the network
    // row. (How many more varied with the load, 21 against 19 in a run at load 20, so the rows
    // are not compared with each other; nor is the latency added, which such a load drowns in
    // noise in a debug build.)
    let note = |i: usize| rows[i]["note"].as_str().unwrap().to_string();
    let counted = number_before(&note(0), " round trips to the server per new operation");
    assert!(counted >= 2.0, "{}", note(0));
    // 4 on the path: the row's two flights (its insert is the look-up) and the result's two.
    // Below 5 here: a session idle for 100 ms, which a loaded machine's debug build may leave
    // now and then, is checked with a round trip of its own before it is used.
    assert!(counted < 5.0, "{}", note(0));
    // The router's and the server's CPU time per new operation, beside the floor's time.
    let cpu = note(0)
        .split("CPU time per new operation (/proc/PID/stat, during the figure's batches): ")
        .nth(1)
        .unwrap_or_else(|| panic!("no CPU time per new operation in: {}", note(0)))
        .to_string();
    assert!(
        cpu.starts_with("the router ") && cpu.contains(", PostgreSQL "),
        "{cpu}"
    );
    assert!(
        number_before(&note(0), " ms per operation)") > 0.0,
        "{}",
        note(0)
    );
    let far = number_before(
        &note(2),
        " round trips to the server per new operation counted",
    );
    let near = number_before(&note(2), " at no delay");
    assert!(far >= 2.0 && near >= 2.0, "{}", note(2));
    assert!(
        rows[2]["value"].as_f64().unwrap().is_finite(),
        "{}",
        rows[2]
    );
    // The delay is there: the relay never forwards a chunk before its 0.5 ms are up.
    assert!(number_before(&note(2), " ms on average each way") >= 0.5);
    // CPU time per operation of every process, for 16 clients and for 1.
    let replicas = note(1);
    let cpu = replicas
        .split("CPU time per operation")
        .nth(1)
        .and_then(|rest| rest.split("; the whole machine").next())
        .unwrap_or_else(|| panic!("no CPU time per operation in: {replicas}"));
    for part in [
        "(replicas ",
        ", provider ",
        ", PostgreSQL ",
        ", clients (this bench) ",
    ] {
        assert_eq!(cpu.matches(part).count(), 2, "{part} in {cpu}");
    }
    assert!(number_before(cpu, " ms (replicas ") > 0.0, "{cpu}");
}

/// `callid bench --only ROW` in a fresh `TMPDIR`, interrupted by `signal` once `ready` holds of
/// the processes it started and the other processes naming that directory: afterwards none of
/// them lives, the directory is empty, nothing was written to standard output, and the exit code
/// is 128 + the signal's number.
fn interrupted_bench_leaves_nothing(
    row: &str,
    signal: i32,
    name: &str,
    ready: impl Fn(&[Proc]) -> bool,
) {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(common::bin())
        .args(["bench", "--only", row, "--format", "json"])
        .current_dir(common::repo())
        .env("TMPDIR", tmp.path())
        .env_remove("CALLID_BENCH_POSTGRES_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let dir = tmp.path().display().to_string();
    let related = |below: &BTreeMap<u32, Proc>| -> Vec<(u32, Proc)> {
        processes()
            .into_iter()
            .filter(|(pid, p)| !p.zombie && (below.contains_key(pid) || p.cmdline.contains(&dir)))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the bench ended before it was interrupted"
        );
        let below = descendants(child.id());
        let seen = related(&below);
        if ready(&seen.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>()) {
            break below;
        }
        assert!(
            Instant::now() < deadline,
            "the bench did not get going in 120 s: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    procs::signal(&child, signal);
    let status = procs::ended_after(&mut child, "the bench");
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(status.code(), Some(128 + signal), "{status:?}\n{stderr}");
    assert_eq!(related(&seen), vec![], "processes of the bench survived it");
    assert_eq!(
        procs::contents(tmp.path()),
        Vec::<String>::new(),
        "TMPDIR still holds them"
    );
    assert_eq!(stdout, "", "an interrupted bench writes no report");
    assert!(
        stderr.contains(&format!("callid bench: interrupted by {name}; ")),
        "{stderr}"
    );
}

/// A process of the bench runs `callid router`.
fn a_router(procs: &[Proc]) -> bool {
    procs
        .iter()
        .any(|p| p.cmdline.contains(" router --registry "))
}

#[test]
fn sigint_ends_the_bench_and_the_routers_it_started() {
    interrupted_bench_leaves_nothing("router_new_operation", libc::SIGINT, "SIGINT", a_router);
}

#[test]
fn sigterm_ends_the_bench_its_routers_and_its_postgres_cluster() {
    let test = "sigterm_ends_the_bench_its_routers_and_its_postgres_cluster";
    if callid::pg_cluster::bindir().is_none() {
        // The rows skip themselves then; `tests/it/pg.rs` says why (and fails in CI).
        assert!(crate::pg::PgCluster::start(test).is_none());
        return;
    }
    // The cluster's server (`postgres -D TMPDIR/callid-pg-...`) is up beside a router.
    interrupted_bench_leaves_nothing(
        "postgres_new_operation",
        libc::SIGTERM,
        "SIGTERM",
        |procs| a_router(procs) && procs.iter().any(|p| p.cmdline.contains("postgres -D ")),
    );
}
