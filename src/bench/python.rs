//! Finding a Python that has the `mcp` SDK, for the probe-throughput baseline.
//!
//! The baseline is the probe a user would write instead of running `callid probe`:
//! `benches/python_probe.py`, compiled into this binary and written to the run's temporary
//! directory. It needs the `mcp` SDK 2.x (`mcp.server.mcpserver`). When no candidate Python has
//! it, the row is skipped with the reason and the command that installs it: never a silent pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Python probe's source.
pub const SCRIPT: &str = include_str!("../../benches/python_probe.py");

/// The venv `callid bench` looks in when run from the repository root (created by the install
/// command that a skip prints).
pub const REPO_VENV_PYTHON: &str = "target/bench-venv/bin/python3";

/// The command that installs the SDK where [`find`] looks.
pub const INSTALL_HINT: &str = "python3 -m venv target/bench-venv && \
     target/bench-venv/bin/pip install mcp (then run from the repository root, or pass \
     `--python target/bench-venv/bin/python3`)";

/// The first Python that can import `mcp.server.mcpserver`: `explicit` (from `--python` or
/// `CALLID_BENCH_PYTHON`) if given, else the repository's `target/bench-venv`, else `python3` on
/// `PATH`. Otherwise the reason, naming what each candidate said.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match explicit {
        Some(path) => vec![path.to_path_buf()],
        None => {
            let mut list = Vec::new();
            if Path::new(REPO_VENV_PYTHON).exists() {
                list.push(PathBuf::from(REPO_VENV_PYTHON));
            }
            list.push(PathBuf::from("python3"));
            list
        }
    };
    let mut reasons = Vec::new();
    for python in candidates {
        match can_import_mcp(&python) {
            Ok(()) => return Ok(python),
            Err(why) => reasons.push(format!("`{}` {why}", python.display())),
        }
    }
    Err(format!(
        "no Python with the `mcp` SDK 2.x: {}; install it with `{INSTALL_HINT}`",
        reasons.join("; ")
    ))
}

fn can_import_mcp(python: &Path) -> Result<(), String> {
    let output = Command::new(python)
        .args(["-c", "import mcp.server.mcpserver"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot be started ({e})"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!(
        "cannot import `mcp.server.mcpserver` ({})",
        last.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interpreter_is_a_reason_not_a_pass() {
        let reason = find(Some(Path::new("/nonexistent/python3"))).expect_err("no such python");
        assert!(
            reason.contains("`/nonexistent/python3` cannot be started"),
            "{reason}"
        );
        assert!(reason.contains("pip install mcp"), "{reason}");
    }
}
