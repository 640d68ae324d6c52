//! Helpers shared by the integration tests: one home for each piece of set-up, so that what a
//! test relies on is written once. [`mcp`]: a `callid` server process on stdio (router, gateway,
//! replica) seen from the agent's side, every reply and its log scanned for the private key
//! prefix; [`provider`]: the in-process provider and its ledger; [`probe`]: probe sessions and
//! their logs; [`conform`]: `callid conform` runs and their verdicts; [`measure`]: measuring a
//! real client against its committed row; [`rust_source`]: the lexer of the tests that read
//! `src/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `callid` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_callid"))
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `callid ARGS` with `envs` added, which must succeed (its stderr says why not): its output.
pub fn callid_ok(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let out = Command::new(bin())
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether `what` is installed (`needs` exists). When it is not, a test says why it skips
/// (`install_hint`), or fails when the variable `required_by` is set: CI sets it once its install
/// of the pinned programs succeeded, so a missing one fails there and never skips.
pub fn installed_or_skip(what: &str, needs: &Path, install_hint: &str, required_by: &str) -> bool {
    if needs.exists() {
        return true;
    }
    assert!(
        std::env::var_os(required_by).is_none(),
        "{what} is required ({required_by} is set) but {} is not installed",
        needs.display()
    );
    eprintln!(
        "SKIP: {what} is not installed at {}; {install_hint}",
        needs.display()
    );
    false
}

/// The handle of the operation of `call_id` in the SQLite registry at `registry`, if any.
pub fn registry_handle(registry: &Path, call_id: &str) -> Option<String> {
    use rusqlite::OptionalExtension as _;
    rusqlite::Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT handle FROM operations WHERE harness_call_id = ?1",
            [call_id],
            |r| r.get(0),
        )
        .optional()
        .unwrap()
}

pub mod conform;
pub mod mcp;
pub mod measure;
pub mod probe;
pub mod procs;
pub mod provider;
pub mod rust_source;
