//! `callid measure --check` against a real, pinned client, when it is installed.

use super::{bin, repo};
use std::path::Path;
use std::process::Command;

/// Runs `callid measure --client CLIENT --check` on the repository's `matrices/` when `needs`
/// exists, and says why not (`install_hint`) otherwise; with the variable `required_by` set, a
/// missing client fails. The measured row must match the committed one and stdout must hold
/// `stdout_has`.
pub fn measure_check(
    client: &str,
    needs: &Path,
    install_hint: &str,
    required_by: &str,
    stdout_has: &str,
) {
    if !super::installed_or_skip(client, needs, install_hint, required_by) {
        return;
    }
    let out = Command::new(bin())
        .args(["measure", "--client", client, "--check", "--dir"])
        .arg(repo().join("matrices"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains(stdout_has), "{stdout}");
    assert!(stderr.contains("matches the committed row"), "{stderr}");
}
