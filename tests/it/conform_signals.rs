//! `callid conform` interrupted by real signals while its routers run: afterwards no process of
//! the run is left (checked in `/proc`, by process group and by the run's temporary paths in a
//! command line), an HTTP router's port no longer listens, `TMPDIR` holds nothing of the run,
//! the exit code is 128 + the signal's number, and `--out` holds the partial report. A SIGKILL of
//! conform itself still takes its routers along (`PR_SET_PDEATHSIG`).

use crate::common::procs::{self, Proc, contents, descendants, processes};
use crate::common::{bin, copy_matrix, repo};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A conform run in its own fresh `TMPDIR`, writing its JSON report to `--out`.
struct Run {
    child: Child,
    tmp: tempfile::TempDir,
    out: PathBuf,
    _out_dir: tempfile::TempDir,
}

impl Run {
    fn start(target: &Path) -> Run {
        let tmp = tempfile::tempdir().unwrap();
        let out_dir = tempfile::tempdir().unwrap();
        let out = out_dir.path().join("report.json");
        let child = Command::new(bin())
            .args(["conform", "--target"])
            .arg(target)
            .args(["--format", "json", "--out"])
            .arg(&out)
            .current_dir(repo())
            .env("TMPDIR", tmp.path())
            .env_remove("CALLID_CONFORM_JOBS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Run {
            child,
            tmp,
            out,
            _out_dir: out_dir,
        }
    }

    /// Waits until a router the run started (a group leader running `callid router` or `callid
    /// gateway`) is up, listening when it serves HTTP: its processes then, and the router's port.
    fn routers_up(&mut self) -> (BTreeMap<u32, Proc>, Option<u16>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "conform ended before any router started"
            );
            let below = descendants(self.child.id());
            let leader = below.iter().find(|(pid, p)| {
                p.pgrp == **pid
                    && (p.cmdline.contains(" router ") || p.cmdline.contains(" gateway "))
            });
            if let Some((_, p)) = leader {
                let port = http_port(&p.cmdline);
                let serving = port
                    .is_none_or(|port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
                if serving {
                    return (below, port);
                }
            }
            assert!(Instant::now() < deadline, "no router came up in 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: i32) {
        procs::signal(&self.child, signal);
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        procs::ended_after(&mut self.child, "conform")
    }

    /// The living processes that belong to the run: in a process group seen below it, or naming
    /// its temporary directory on their command line.
    fn leftovers(&self, groups: &BTreeSet<u32>) -> Vec<(u32, Proc)> {
        let tmp = self.tmp.path().display().to_string();
        processes()
            .into_iter()
            .filter(|(_, p)| !p.zombie && (groups.contains(&p.pgrp) || p.cmdline.contains(&tmp)))
            .collect()
    }
}

/// A profile of `scenarios/targets/`.
fn shipped(name: &str) -> PathBuf {
    repo().join("scenarios/targets").join(name)
}

/// `127.0.0.1:PORT` after `--http` in a command line.
fn http_port(cmdline: &str) -> Option<u16> {
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "--http")?;
    words.get(at + 1)?.rsplit(':').next()?.parse().ok()
}

/// Interrupts a run of `target` with `signal` once a router is up, and checks everything the
/// run started is gone and the partial report says so.
fn interrupted_run_leaves_nothing(target: &Path, signal: i32, name: &str, exit: i32) {
    let mut run = Run::start(target);
    let (seen, port) = run.routers_up();
    run.signal(signal);
    let status = run.wait();
    assert_eq!(status.code(), Some(exit), "{status:?}");
    // The groups the run's routers lead (a process caught between fork and `setpgid`, or a
    // setup command, is still in conform's group, which is the test's own).
    let groups: BTreeSet<u32> = seen
        .values()
        .map(|p| p.pgrp)
        .filter(|group| seen.contains_key(group))
        .collect();
    assert_eq!(
        run.leftovers(&groups),
        vec![],
        "processes of the run survived it"
    );
    if let Some(port) = port {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the HTTP router's port {port} still listens"
        );
    }
    // The claims directory is shared by every conform run using this TMPDIR; it is left empty.
    let left = contents(run.tmp.path());
    assert!(
        left.is_empty() || left == ["callid-conform-ports"],
        "TMPDIR still holds {left:?}"
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&run.out).unwrap()).unwrap();
    let mut schemas = boon::Schemas::new();
    let schema = boon::Compiler::new()
        .compile(
            repo().join("schemas/conform.json").to_str().unwrap(),
            &mut schemas,
        )
        .unwrap();
    if let Err(e) = schemas.validate(&report, schema) {
        panic!("the partial report does not match schemas/conform.json: {e:#}");
    }
    assert_eq!(report["interrupted"], name);
    assert_eq!(report["success"], false);
    assert_eq!(report["version"], 1);
    let checks = report["checks"].as_array().unwrap();
    let listed = Command::new(bin())
        .args(["conform", "--list"])
        .output()
        .unwrap();
    let ids = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .count();
    assert_eq!(checks.len(), ids, "every check is listed, run or not");
    let reason = format!("the run was interrupted by {name} before this check finished");
    let cut: Vec<&Value> = checks.iter().filter(|c| c["reason"] == reason).collect();
    assert!(!cut.is_empty(), "no check is marked as cut by the signal");
    assert!(cut.iter().all(|c| c["verdict"] == "not-run"), "{cut:?}");
    assert_eq!(
        report["summary"]["not_run"].as_u64().unwrap() as usize,
        checks.iter().filter(|c| c["verdict"] == "not-run").count()
    );
    // A partial report says nothing of the router's support: the matrix (a copy of the
    // repository's, which would take a finished report) refuses it and is left as it was.
    let matrix = tempfile::tempdir().unwrap();
    copy_matrix(&repo().join("matrices"), matrix.path());
    let before = std::fs::read(matrix.path().join("routers.yaml")).unwrap();
    let added = Command::new(bin())
        .args(["matrix", "add", "--dir"])
        .arg(matrix.path())
        .arg(&run.out)
        .output()
        .unwrap();
    assert_eq!(added.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&added.stderr).contains(&format!(
            "at `interrupted`: the run was interrupted by {name}"
        )),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert!(std::fs::read(matrix.path().join("routers.yaml")).unwrap() == before);
}

#[test]
fn sigint_ends_stdio_routers_and_writes_the_partial_report() {
    interrupted_run_leaves_nothing(&shipped("reference.yaml"), libc::SIGINT, "SIGINT", 130);
}

#[test]
fn sigterm_ends_http_routers_so_their_ports_close() {
    interrupted_run_leaves_nothing(
        &shipped("reference-http.yaml"),
        libc::SIGTERM,
        "SIGTERM",
        143,
    );
}

#[test]
fn sighup_ends_http_routers() {
    interrupted_run_leaves_nothing(&shipped("reference-http.yaml"), libc::SIGHUP, "SIGHUP", 129);
}

/// The gateway starts its upstream relay as its own child, in its process group.
#[test]
fn sigint_ends_a_gateway_and_the_upstream_relay_it_started() {
    interrupted_run_leaves_nothing(&shipped("gateway.yaml"), libc::SIGINT, "SIGINT", 130);
}

/// A wrapper script that starts the HTTP router as its child (no `exec`): the router is not the
/// process conform spawned, only a member of its group, and still goes.
#[test]
fn sigterm_ends_a_router_a_wrapper_started_in_its_group() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("wrap.sh");
    std::fs::write(&wrapper, "#!/bin/sh\n\"$@\"\nstatus=$?\nexit $status\n").unwrap();
    let profile = std::fs::read_to_string(shipped("reference-http.yaml"))
        .unwrap()
        .replace(
            "command: \"{callid}\"\nargs: [router,",
            "command: sh\nargs: [\"{profile_dir}/wrap.sh\", \"{callid}\", router,",
        );
    assert!(
        profile.contains("wrap.sh"),
        "the profile changed: {profile}"
    );
    let target = dir.path().join("wrapped.yaml");
    std::fs::write(&target, profile).unwrap();
    for file in [&wrapper, &target] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    interrupted_run_leaves_nothing(&target, libc::SIGTERM, "SIGTERM", 143);
}

/// Conform killed outright cannot clean up, but the kernel ends the routers it started.
#[test]
fn sigkill_of_conform_still_ends_its_http_routers() {
    let mut run = Run::start(&shipped("reference-http.yaml"));
    let (seen, port) = run.routers_up();
    run.signal(libc::SIGKILL);
    let status = run.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let leaders: BTreeSet<u32> = seen
        .iter()
        .filter(|(pid, p)| p.pgrp == **pid)
        .map(|(pid, _)| *pid)
        .collect();
    assert!(!leaders.is_empty());
    // The kernel sends SIGKILL as conform dies; the routers go as soon as they are scheduled.
    // Those started after the look (a restart on the same port) name the run's TMPDIR.
    let tmp = run.tmp.path().display().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<u32> = processes()
            .into_iter()
            .filter(|(pid, p)| !p.zombie && (leaders.contains(pid) || p.cmdline.contains(&tmp)))
            .map(|(pid, _)| pid)
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "routers {alive:?} outlived a SIGKILL of conform by 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = port.expect("an HTTP router");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the HTTP router's port {port} still listens"
    );
}
