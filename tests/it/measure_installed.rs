//! `callid measure` for someone who installed callid: the binary is copied out of the build tree
//! and run with a fresh, empty working directory, no matrix and no checkout around it.

use crate::common::{bin, repo};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// An installed `callid` (a copy of the built binary in `tmp/bin`) and an empty working
/// directory `tmp/work`.
fn installed() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let bin_dir = tmp.path().join("bin");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let callid = bin_dir.join("callid");
    std::fs::copy(bin(), &callid).unwrap();
    (tmp, callid, work)
}

/// `callid ARGS` from `work`, with `path` as PATH.
fn run(callid: &Path, work: &Path, path: &str, args: &[&str]) -> Output {
    Command::new(callid)
        .args(args)
        .current_dir(work)
        .env_clear()
        .env("PATH", path)
        .env("HOME", work)
        .output()
        .unwrap()
}

/// Every entry under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn measure_outside_a_checkout_says_what_is_missing_before_measuring() {
    let (tmp, callid, work) = installed();
    // A PATH with no client on it.
    let empty_path = tmp.path().join("empty-path");
    std::fs::create_dir_all(&empty_path).unwrap();
    let path = empty_path.to_str().unwrap();
    // A matrix directory whose clients.yaml is broken.
    std::fs::create_dir_all(work.join("broken")).unwrap();
    std::fs::write(work.join("broken/clients.yaml"), "version: 2\nclients: [\n").unwrap();
    // A checkout's matrix directory, without its clients installed.
    let checkout = tmp.path().join("checkout");
    std::fs::create_dir_all(checkout.join("clients")).unwrap();
    std::fs::copy(
        repo().join("matrices/clients/package.json"),
        checkout.join("clients/package.json"),
    )
    .unwrap();
    let checkout_arg = checkout.to_str().unwrap();
    let cases: [(&str, Vec<&str>); 6] = [
        ("not on PATH", vec!["--client", "codex"]),
        (
            "--bin that does not exist",
            vec!["--client", "codex", "--bin", "no/such/codex"],
        ),
        (
            "--update without a matrix",
            vec!["--client", "codex", "--update"],
        ),
        (
            "--check without a matrix",
            vec!["--client", "claude-code", "--check"],
        ),
        (
            "--update with a broken matrix",
            vec!["--client", "codex", "--update", "--dir", "broken"],
        ),
        (
            "in a checkout",
            vec!["--client", "gemini-cli", "--dir", checkout_arg],
        ),
    ];
    let mut report = String::new();
    for (label, args) in cases {
        let mut all = vec!["measure"];
        all.extend(args);
        let out = run(&callid, &work, path, &all);
        let stderr = String::from_utf8_lossy(&out.stderr)
            .replace(&tmp.path().display().to_string(), "[TMP]");
        report.push_str(&format!(
            "## {label}: callid {}\nexit_code: {:?}\n{stderr}\n",
            all.join(" ")
                .replace(&tmp.path().display().to_string(), "[TMP]"),
            out.status.code()
        ));
        assert_eq!(out.status.code(), Some(2), "{report}");
        assert!(out.stdout.is_empty(), "{report}");
    }
    // Nothing was measured, so nothing was written: the working directory holds only what the
    // test put there.
    assert_eq!(
        listing(&work),
        ["broken", "broken/clients.yaml"],
        "{report}"
    );
    // The npm command that installs the pinned clients is named only inside a checkout.
    let sections: Vec<&str> = report.split("## ").collect();
    for section in sections.iter().filter(|s| !s.is_empty()) {
        assert_eq!(
            section.contains("npm install"),
            section.starts_with("in a checkout"),
            "{section}"
        );
    }
    insta::assert_snapshot!("measure_installed_errors", report);
}

/// The pinned Codex CLI, when installed.
fn codex() -> Option<PathBuf> {
    let program = repo().join("matrices/clients/node_modules/.bin/codex");
    crate::common::installed_or_skip(
        "codex",
        &program,
        "run `npm install --no-save --prefix matrices/clients`",
        "CALLID_REQUIRE_CLIENTS",
    )
    .then_some(program)
}

#[test]
fn measure_from_an_installed_binary_keeps_the_evidence_and_answers_first() {
    let Some(codex) = codex() else {
        return;
    };
    let (tmp, callid, work) = installed();
    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        codex.parent().unwrap().display()
    );
    let out = run(
        &callid,
        &work,
        &path,
        &[
            "measure",
            "--client",
            "codex",
            "--bin",
            codex.to_str().unwrap(),
            "--out",
            "kept",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = tmp;
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The answer comes first, and agrees with the committed row of this Codex version.
    let committed: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("matrices/clients.yaml")).unwrap(),
    )
    .unwrap();
    let row = committed["clients"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "codex-cli")
        .unwrap();
    let version = row["version"].as_str().unwrap();
    let (first, rest) = stdout.split_once("\n\n").unwrap();
    assert_eq!(
        first,
        format!("Codex CLI {version} sends a per-call ID: `callId`")
    );
    // Then the YAML row, the same as the one kept.
    let rows: Vec<serde_yaml::Value> = serde_yaml::from_str(rest).unwrap();
    assert_eq!(rows[0]["id"], "codex-cli");
    assert_eq!(
        std::fs::read_to_string(work.join("kept/row.yaml")).unwrap(),
        rest
    );
    // Progress on stderr, one line per run.
    assert!(
        stderr.contains(&format!("measuring Codex CLI {version}")),
        "{stderr}"
    );
    for n in 1..=6 {
        assert!(stderr.contains(&format!("run {n} of 6: ")), "{stderr}");
    }
    // The evidence, one probe log per run, and nothing else in the working directory.
    let base = format!("evidence/codex-{version}");
    let mut want: Vec<String> = [
        "kept".to_owned(),
        "kept/evidence".to_owned(),
        "kept/row.yaml".to_owned(),
    ]
    .into_iter()
    .chain(
        [
            "",
            ".duplicate-id",
            ".timeout",
            ".server-dies",
            ".one-answer",
            ".one-answer-same-id",
        ]
        .iter()
        .map(|tag| format!("kept/{base}{tag}.jsonl")),
    )
    .collect();
    want.sort();
    assert_eq!(listing(&work), want, "{stderr}");
}

/// A stand-in for a client that starts, stays busy for `secs` seconds without ever calling a
/// tool, and exits: it says its version like Codex does.
fn slow_client(dir: &Path, secs: u32) -> PathBuf {
    let path = dir.join("codex");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'codex-cli 0.171.0'; exit 0; fi\n\
             echo 'thinking'; sleep {secs}; echo 'gave up'; exit 3\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_long_run_reports_progress_and_a_failed_measurement_keeps_nothing() {
    let (tmp, callid, work) = installed();
    let client = slow_client(tmp.path(), 14);
    let out = run(
        &callid,
        &work,
        "/usr/local/bin:/usr/bin:/bin",
        &[
            "measure",
            "--client",
            "codex",
            "--bin",
            client.to_str().unwrap(),
            "--out",
            "kept",
        ],
    );
    let stderr =
        String::from_utf8_lossy(&out.stderr).replace(&tmp.path().display().to_string(), "[TMP]");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "measuring Codex CLI 0.171.0 (`[TMP]/codex`): 6 runs of at most 180 s each",
            "run 1 of 6: two tool calls in two turns",
        ],
        "{stderr}"
    );
    // While the client runs (14 s), a line every 10 s says so.
    assert!(
        lines[2].starts_with("  still running (1") && lines[2].ends_with(" s of at most 180 s)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "codex 0.171.0 made no `tools/call` to the probe in the run with two tool calls in \
             two turns (exit code 3, in time); its last output:\nthinking\ngave up"
        ),
        "{stderr}"
    );
    // The measurement failed: no evidence directory, nothing in the working directory.
    assert_eq!(listing(&work), Vec::<String>::new(), "{stderr}");
}
