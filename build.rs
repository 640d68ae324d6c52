//! Puts the git commit into `callid --version` when built from a git checkout.
//!
//! `CALLID_VERSION` is the crate version followed by the short hash of `HEAD`
//! (`0.1.0 (commit 0123456789ab)`), or the crate version alone when this is not a git checkout or
//! git is not installed (a `cargo install` from a packaged crate). The script reruns when `HEAD` or the branch it points to moves, wherever the
//! git directory is (a worktree's `.git` is a file, not a directory).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = if is_own_checkout() {
        git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default()
    } else {
        String::new()
    };
    if !commit.is_empty() {
        if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            println!("cargo:rerun-if-changed={git_dir}/HEAD");
        }
        if let (Some(common), Some(head_ref)) = (
            git(&["rev-parse", "--git-common-dir"]),
            git(&["symbolic-ref", "-q", "HEAD"]),
        ) {
            let common = std::path::absolute(PathBuf::from(common)).unwrap_or_default();
            for file in [common.join(&head_ref), common.join("packed-refs")] {
                if file.exists() {
                    println!("cargo:rerun-if-changed={}", file.display());
                }
            }
        }
    }
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let long = if commit.is_empty() {
        version
    } else {
        format!("{version} (commit {commit})")
    };
    println!("cargo:rustc-env=CALLID_VERSION={long}");
}

/// Whether the package root is the top of a git work tree (not a packaged crate unpacked inside
/// some other repository).
fn is_own_checkout() -> bool {
    let Some(top) = git(&["rev-parse", "--show-toplevel"]) else {
        return false;
    };
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    match (
        std::fs::canonicalize(top),
        manifest.map(std::fs::canonicalize),
    ) {
        (Ok(top), Some(Ok(manifest))) => top == manifest,
        _ => false,
    }
}

/// The trimmed output of `git ARGS`, or `None` when git is missing or fails (not a checkout).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
