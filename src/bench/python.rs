//! Finding (or making) a Python that has the `mcp` SDK, for the probe-throughput baseline.
//!
//! The baseline is the probe a user would write instead of running `callid probe`:
//! `benches/python_probe.py`, compiled into this binary and written to the run's temporary
//! directory. It needs the `mcp` SDK 2.x (`mcp.server.mcpserver`).
//!
//! # Guarantees
//! - The SDK is the one the repository pins: the venv is `matrices/clients/.venv`, made as
//!   `.ci/run` makes it (a Python >= 3.12, `pip install -r matrices/clients/requirements.txt`),
//!   so the bench and the client tests measure the same `mcp` version.
//! - When no candidate Python has the SDK and `--python` was not given, [`find`] sets that venv up
//!   itself, showing pip's progress on standard error, provided PyPI answers (checked first, with
//!   a 60 s bound). When it cannot (no repository checkout, no Python >= 3.12, PyPI unreachable,
//!   pip failing) the row is skipped with the reason and the one command that installs it: never
//!   a silent pass.

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The Python probe's source.
pub const SCRIPT: &str = include_str!("../../benches/python_probe.py");

/// The venv `.ci/run` makes, relative to the repository root; [`find`] looks in it first and
/// makes it when missing.
pub const CLIENTS_VENV: &str = "matrices/clients/.venv";

/// The pinned requirements the venv is made from, relative to the repository root.
pub const REQUIREMENTS: &str = "matrices/clients/requirements.txt";

/// An older venv location `callid bench` also accepts (made by hand with `pip install mcp`).
pub const REPO_VENV_PYTHON: &str = "target/bench-venv/bin/python3";

/// The one command that makes the venv by hand, run from the repository root.
pub const INSTALL_HINT: &str = "python3.12 -m venv matrices/clients/.venv && \
     matrices/clients/.venv/bin/python -m pip install -r matrices/clients/requirements.txt \
     (any Python >= 3.12; run from the repository root, or pass \
     `--python matrices/clients/.venv/bin/python`)";

/// The first Python that can import `mcp.server.mcpserver`: `explicit` (from `--python` or
/// `CALLID_BENCH_PYTHON`) if given, else the repository's `matrices/clients/.venv`, else
/// `target/bench-venv`, else `python3` on `PATH`; else the venv made now (see the module docs).
/// Otherwise the reason, naming what each candidate said.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let root = repository_root();
    let candidates: Vec<PathBuf> = match explicit {
        Some(path) => vec![path.to_path_buf()],
        None => {
            let mut list = Vec::new();
            if let Some(root) = &root {
                list.push(venv_python(root));
            }
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
    let setup = match (explicit, &root) {
        (Some(_), _) => return Err(no_python(&reasons, None)),
        (None, None) => Err(format!(
            "no checkout of the repository here (no `{REQUIREMENTS}` in the current directory \
             or in the one callid was built from) to make the venv in"
        )),
        (None, Some(root)) => set_up(root),
    };
    match setup {
        Ok(python) => Ok(python),
        Err(why) => Err(no_python(&reasons, Some(&why))),
    }
}

fn no_python(reasons: &[String], setup: Option<&str>) -> String {
    let setup = setup
        .map(|why| format!("; setting the venv up failed: {why}"))
        .unwrap_or_default();
    format!(
        "no Python with the `mcp` SDK 2.x: {}{setup}; install it with `{INSTALL_HINT}`",
        reasons.join("; ")
    )
}

/// The repository checkout: the current directory when it holds [`REQUIREMENTS`], else the
/// directory this binary was built from.
fn repository_root() -> Option<PathBuf> {
    [
        PathBuf::from("."),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    ]
    .into_iter()
    .find(|dir| dir.join(REQUIREMENTS).is_file())
}

fn venv_python(root: &Path) -> PathBuf {
    root.join(CLIENTS_VENV).join("bin/python")
}

/// A Python >= 3.12, looked for as `.ci/run` does: `python3.13`, `python3.12`, `python3`, then
/// pyenv's `~/.pyenv/versions/3.1[2-9]*`.
pub fn python_312() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = ["python3.13", "python3.12", "python3"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        let versions = Path::new(&home).join(".pyenv/versions");
        let mut found: Vec<PathBuf> = std::fs::read_dir(&versions)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|dir| {
                dir.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("3.1") && n.len() > 3)
            })
            .map(|dir| dir.join("bin/python3"))
            .collect();
        found.sort();
        candidates.extend(found);
    }
    candidates.into_iter().find(|python| {
        quiet(Command::new(python).args(["-c", "import sys; sys.exit(sys.version_info < (3, 12))"]))
            .is_ok_and(|status| status.success())
    })
}

/// Makes `matrices/clients/.venv` under `root` from the pinned requirements, pip's progress on
/// standard error, and returns its Python.
fn set_up(root: &Path) -> Result<PathBuf, String> {
    let requirements = root.join(REQUIREMENTS);
    let pin = std::fs::read_to_string(&requirements)
        .map_err(|e| format!("cannot read `{}`: {e}", requirements.display()))?
        .lines()
        .find(|l| l.starts_with("mcp=="))
        .map(str::to_string)
        .ok_or_else(|| format!("`{}` pins no `mcp==` version", requirements.display()))?;
    let venv = root.join(CLIENTS_VENV);
    refuse_dangling_link(&venv)?;
    let python = python_312().ok_or(
        "no Python >= 3.12 found (python3.13, python3.12, python3, ~/.pyenv/versions/3.12+)",
    )?;
    let ping = tempfile::tempdir().map_err(|e| format!("no scratch directory: {e}"))?;
    let mut download = Command::new(&python);
    download
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .args(["--disable-pip-version-check", "--dest"])
        .arg(ping.path())
        .arg(&pin);
    match run_bounded(download, Duration::from_secs(60), false) {
        Ok(()) => {}
        Err(why) => return Err(format!("PyPI cannot be reached ({why})")),
    }
    crate::logging::line(format_args!(
        "callid bench: making `{}` with {} from `{}` for the Python SDK row (once; pip's \
         progress follows)",
        venv.display(),
        python.display(),
        requirements.display()
    ));
    let mut make = Command::new(&python);
    make.args(["-m", "venv", "--clear"]).arg(&venv);
    run_bounded(make, Duration::from_secs(120), true)?;
    let venv_python = venv_python(root);
    let mut install = Command::new(&venv_python);
    install
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
        ])
        .arg("-r")
        .arg(&requirements);
    if let Err(why) = run_bounded(install, Duration::from_secs(900), true) {
        // A half-made venv would be found next time and fail there: leave none behind.
        let _ = std::fs::remove_dir_all(&venv);
        return Err(format!(
            "pip install -r `{}` failed: {why}",
            requirements.display()
        ));
    }
    can_import_mcp(&venv_python).map_err(|why| format!("the new venv {why}"))?;
    crate::logging::line(format_args!("callid bench: `{}` is ready", venv.display()));
    Ok(venv_python)
}

/// A `.venv` that is a symbolic link to nothing: `python -m venv` would fail on it with a bare
/// "File exists"; it is someone's link, so it is named with the command that removes it rather
/// than replaced.
fn refuse_dangling_link(venv: &Path) -> Result<(), String> {
    let is_link = std::fs::symlink_metadata(venv).is_ok_and(|m| m.file_type().is_symlink());
    if is_link && !venv.exists() {
        let target = std::fs::read_link(venv)
            .map(|t| t.display().to_string())
            .unwrap_or_default();
        return Err(format!(
            "`{}` is a symbolic link to `{target}`, which does not exist; remove it (`rm {}`) \
             and run again to have the venv made there",
            venv.display(),
            venv.display()
        ));
    }
    Ok(())
}

fn quiet(command: &mut Command) -> std::io::Result<std::process::ExitStatus> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// Runs `command` to completion within `limit` (killed past it). With `show`, its output goes
/// to standard error as it comes; without, it is kept for the error message.
fn run_bounded(mut command: Command, limit: Duration, show: bool) -> Result<(), String> {
    command.stdin(Stdio::null());
    if show {
        // Standard output too goes to standard error: `callid bench` prints its report on stdout.
        let stderr = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("cannot share standard error: {e}"))?;
        command.stdout(Stdio::from(stderr)).stderr(Stdio::inherit());
    } else {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("`{:?}` cannot be started ({e})", command.get_program()))?;
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut said = String::new();
                if let Some(mut err) = child.stderr.take() {
                    use std::io::Read as _;
                    let _ = err.read_to_string(&mut said);
                }
                let last = said.lines().rev().find(|l| !l.trim().is_empty());
                return Err(match last {
                    Some(line) => format!("{status}: {}", line.trim()),
                    None => status.to_string(),
                });
            }
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("waiting for it failed: {e}")),
        }
    }
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
        assert!(
            reason.contains("pip install -r matrices/clients/requirements.txt"),
            "{reason}"
        );
    }

    #[test]
    fn the_venv_is_made_from_the_pinned_requirements() {
        let root = repository_root().expect("tests run in the checkout");
        let pins = std::fs::read_to_string(root.join(REQUIREMENTS)).unwrap();
        assert!(pins.lines().any(|l| l.starts_with("mcp==2.")), "{pins}");
    }

    #[test]
    fn a_venv_that_is_a_dangling_link_is_named_with_the_command_that_removes_it() {
        let root = tempfile::tempdir().unwrap();
        let venv = root.path().join(CLIENTS_VENV);
        std::fs::create_dir_all(venv.parent().unwrap()).unwrap();
        std::fs::write(root.path().join(REQUIREMENTS), "mcp==2.3.0\n").unwrap();
        std::os::unix::fs::symlink(root.path().join("gone/.venv"), &venv).unwrap();
        let why = set_up(root.path()).unwrap_err();
        assert!(why.contains("is a symbolic link to"), "{why}");
        assert!(why.contains(&format!("rm {}", venv.display())), "{why}");
        assert!(
            std::fs::symlink_metadata(&venv).is_ok(),
            "the link is left as it was"
        );
        std::fs::remove_file(&venv).unwrap();
        std::fs::create_dir_all(root.path().join("gone/.venv")).unwrap();
        std::os::unix::fs::symlink(root.path().join("gone/.venv"), &venv).unwrap();
        assert_eq!(
            refuse_dangling_link(&venv),
            Ok(()),
            "a link to a directory is kept"
        );
    }

    #[test]
    fn a_failing_command_says_its_last_line() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo first >&2; echo 'the last word' >&2; exit 3"]);
        let why = run_bounded(command, Duration::from_secs(10), false).unwrap_err();
        assert!(why.contains("the last word"), "{why}");
        let mut command = Command::new("sleep");
        command.arg("5");
        let why = run_bounded(command, Duration::from_millis(200), false).unwrap_err();
        assert!(why.contains("no answer within"), "{why}");
    }
}
