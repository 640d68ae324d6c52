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

/// Whether a check is skipped only because it is written for the other kind of backend: an
/// `at-most-once.*` check against a profile without `idempotent_backend: false` (the reason
/// names the key that turns it on), or a check that re-sends under the key against a profile
/// with it.
pub fn skipped_for_its_backend(id: &str, verdict: &str, reason: &str, idempotent: bool) -> bool {
    verdict == "skipped"
        && if idempotent {
            id.starts_with("at-most-once.")
                && reason.contains("set `idempotent_backend: false` (with `resolve`)")
        } else {
            ID_KEYED_RESEND.contains(&id)
                && reason.contains("the profile declares `idempotent_backend: false`")
        }
}

/// Whether a check is skipped only because it signs envelopes and the profile does not declare
/// `signed_envelopes` (the reason names the key).
pub fn skipped_unsigned(id: &str, verdict: &str, reason: &str) -> bool {
    verdict == "skipped"
        && id.starts_with("signature.")
        && reason.contains("the profile does not declare `signed_envelopes`")
}

/// The checks that continue an operation under its key after an unknown outcome: written for a
/// backend that honours the key.
pub const ID_KEYED_RESEND: &[&str] = &[
    "crash.after-charge-before-reply",
    "crash.after-dispatch-before-charge",
    "redelivery.after-provider-failure",
];

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
