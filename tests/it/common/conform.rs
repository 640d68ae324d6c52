//! `callid conform` run as a router author runs it, and its JSON report read back.

use super::{bin, repo};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

/// `callid conform ARGS` run from `dir` with `env` added (and no `CALLID_CONFORM_JOBS` of the
/// caller's).
pub fn conform_in(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    Command::new(bin())
        .arg("conform")
        .args(args)
        .current_dir(dir)
        .env_remove("CALLID_CONFORM_JOBS")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run callid conform")
}

/// `callid conform ARGS` run from the repository root.
pub fn conform(args: &[&str]) -> Output {
    conform_in(&repo(), args, &[])
}

/// The exit code (the run must have exited, not been killed).
pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exited")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `{check id: (verdict, reason, level)}` of a `--format json` run.
pub fn verdicts(output: &Output) -> BTreeMap<String, (String, String, String)> {
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\nstderr:\n{}",
            stdout(output),
            stderr(output)
        )
    });
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (s("id"), (s("verdict"), s("reason"), s("level")))
        })
        .collect()
}

/// The independent Python router with its deliberate flaws.
pub fn router_py() -> String {
    repo()
        .join("tests/fixtures/broken_routers/router.py")
        .display()
        .to_string()
}

/// Runs each `(flaw, check id, reason prefix)` at once, from `dir`: the Python router with that
/// flaw must fail that check with a reason starting so, and the run must exit 1. What did not.
pub fn flaws_that_did_not_fail(dir: &Path, cases: &[(&str, &str, &str)]) -> Vec<String> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(flaw, id, reason)| {
                scope.spawn(move || {
                    let command = format!("python3 '{}' --flaw {flaw}", router_py());
                    let output = conform_in(
                        dir,
                        &["--stdio", &command, "--format", "json", "--only", id],
                        &[],
                    );
                    match verdicts(&output).get(*id) {
                        Some((v, r, _))
                            if v == "fail" && r.starts_with(reason) && code(&output) == 1 =>
                        {
                            None
                        }
                        other => Some(format!(
                            "--flaw {flaw}: `{id}` should fail with {reason:?}, got {other:?} (exit {})",
                            code(&output)
                        )),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    })
}
