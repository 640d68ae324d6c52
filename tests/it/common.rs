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

/// A copy of the support matrix directory `from` in `to` (created): its rows, its `SUPPORT.md`
/// and its evidence, whichever it has. Nothing else: beside the rows, `matrices/clients/` holds
/// the installed clients (`node_modules`, `.venv`: hundreds of megabytes, and files that a client
/// another test runs may be writing while this copies).
pub fn copy_matrix(from: &Path, to: &Path) {
    use callid::testing::matrix::{CLIENTS_FILE, EVIDENCE_DIR, ROUTERS_FILE, SUPPORT_FILE};
    std::fs::create_dir_all(to).unwrap();
    for file in [CLIENTS_FILE, ROUTERS_FILE, SUPPORT_FILE] {
        if from.join(file).exists() {
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
    }
    if from.join(EVIDENCE_DIR).is_dir() {
        copy_tree(&from.join(EVIDENCE_DIR), &to.join(EVIDENCE_DIR));
    }
}

/// A copy of the directory tree `from` in `to` (created).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
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
