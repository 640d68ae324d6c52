//! Integration tests of `callid matrix` and `callid measure`: each runs the real binary on a copy
//! of fixture data (or on the repository's own `matrices/`).

use crate::common::{bin, copy_matrix, repo};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temporary copy of `tests/fixtures/matrix`.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("matrices");
    copy_matrix(&repo().join("tests/fixtures/matrix"), &dir);
    (tmp, dir)
}

fn callid(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env_remove("CALLID_LOG")
        .output()
        .unwrap()
}

/// Exit code, stdout and stderr, with the temporary directory replaced.
fn transcript(out: &Output, tmp: &Path) -> String {
    let redact = |s: &[u8]| String::from_utf8_lossy(s).replace(&tmp.display().to_string(), "[TMP]");
    format!(
        "exit_code: {:?}\n----- stdout -----\n{}----- stderr -----\n{}",
        out.status.code(),
        redact(&out.stdout),
        redact(&out.stderr)
    )
}

/// `callid ARGS`, which must exit with `code`; the transcript (`tmp` redacted) says why not.
fn callid_exits(args: &[&str], code: i32, tmp: &Path) -> Output {
    let out = callid(args);
    assert_eq!(out.status.code(), Some(code), "{}", transcript(&out, tmp));
    out
}

/// `callid matrix add SOURCE --dir DIR`, which must exit with `code`.
fn matrix_add(source: &Path, dir: &Path, code: i32, tmp: &Path) -> Output {
    let (s, d) = (source.to_str().unwrap(), dir.to_str().unwrap());
    callid_exits(&["matrix", "add", s, "--dir", d], code, tmp)
}

/// `callid matrix render --check --dir DIR`.
fn render_check(dir: &Path) -> Output {
    callid(&[
        "matrix",
        "render",
        "--check",
        "--dir",
        dir.to_str().unwrap(),
    ])
}

/// [`render_check`], which must pass.
fn render_check_passes(dir: &Path, tmp: &Path) {
    let out = render_check(dir);
    assert_eq!(out.status.code(), Some(0), "{}", transcript(&out, tmp));
}

/// A temporary matrix directory `m` with no client rows.
fn empty_matrix() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("clients.yaml"), "version: 1\nclients: []\n").unwrap();
    (tmp, dir)
}

#[test]
fn render_is_deterministic_and_snapshotted() {
    let (tmp, dir) = fixture();
    let d = dir.to_str().unwrap();
    let out = callid(&["matrix", "render", "--dir", d]);
    assert!(out.status.success(), "{}", transcript(&out, tmp.path()));
    let first = std::fs::read(dir.join("SUPPORT.md")).unwrap();
    // A second render of the same data, from a second copy, gives the same bytes.
    let (tmp2, dir2) = fixture();
    let out = callid(&["matrix", "render", "--dir", dir2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", transcript(&out, tmp2.path()));
    assert_eq!(first, std::fs::read(dir2.join("SUPPORT.md")).unwrap());
    let out = callid(&["matrix", "render", "--dir", d]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unchanged"));
    insta::assert_snapshot!("support_md", String::from_utf8(first).unwrap());
}

#[test]
fn check_detects_a_one_byte_difference() {
    let (tmp, dir) = fixture();
    let d = dir.to_str().unwrap();
    assert!(callid(&["matrix", "render", "--dir", d]).status.success());
    render_check_passes(&dir, tmp.path());
    let path = dir.join("SUPPORT.md");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.iter().position(|b| *b == b'|').unwrap();
    bytes[at + 2] ^= 0x20; // flip the case of one letter in the first table row
    std::fs::write(&path, &bytes).unwrap();
    let before = std::fs::read(&path).unwrap();
    let out = callid_exits(&["matrix", "render", "--check", "--dir", d], 1, tmp.path());
    assert_eq!(
        before,
        std::fs::read(&path).unwrap(),
        "--check writes nothing"
    );
    insta::assert_snapshot!("check_one_byte", transcript(&out, tmp.path()));
    // A missing final newline is a difference too.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at + 2] ^= 0x20;
    bytes.pop();
    std::fs::write(&path, &bytes).unwrap();
    callid_exits(&["matrix", "render", "--check", "--dir", d], 1, tmp.path());
}

#[test]
fn the_committed_matrix_matches_its_data_and_evidence() {
    let dir = repo().join("matrices");
    let out = render_check(&dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn strict_yaml_errors_name_the_path() {
    let cases = [
        (
            "verdict: accepted",
            "verdict: sometimes",
            "clients[1].verdict",
        ),
        (
            "per_call_id: callId",
            "per_call_id: callId\n  colour: red",
            "at `clients[1].colour`: unknown field `colour`",
        ),
        (
            "duplicate_model_id: passed-through",
            "duplicate_model_id: twice",
            "clients[1].stability.duplicate_model_id",
        ),
    ];
    for (from, to, want) in cases {
        let (tmp, dir) = fixture();
        let path = dir.join("clients.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "fixture lacks {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let out = render_check(&dir);
        let stderr = String::from_utf8_lossy(&out.stderr)
            .replace(&tmp.path().display().to_string(), "[TMP]");
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(want), "want {want:?} in {stderr}");
        assert!(stderr.contains("[TMP]/matrices/clients.yaml"), "{stderr}");
    }
}

#[test]
fn a_row_that_disagrees_with_its_evidence_fails_the_check() {
    let cases = [
        (
            "on_timeout: no-retry",
            "on_timeout: retried-same-id",
            "stability.on_timeout",
            "evidence_disagrees",
        ),
        ("  - itemId\n", "", "call_level_keys", "evidence_disagrees"),
        // Codex ran both calls of the one answer that shared an id, not only the first.
        (
            "one_answer_same_id: both-shared-id",
            "one_answer_same_id: only-first",
            "stability.one_answer_same_id",
            "evidence_disagrees",
        ),
        // A finding needs its run's evidence file.
        (
            "    - evidence/codex-0.171.0.one-answer.jsonl\n",
            "",
            "no such evidence file",
            "evidence_disagrees",
        ),
        (
            "version: 0.171.0",
            "version: 0.172.0",
            "`version`",
            "evidence_disagrees",
        ),
        // The row says 2026-07-28; its calls were made under the 2025-06-18 it agreed.
        (
            "protocol: 2025-06-18",
            "protocol: 2026-07-28",
            "`protocol`",
            "evidence_disagrees",
        ),
        // A version 2 file's measured row must give its protocol.
        (
            "  protocol: 2025-06-18\n",
            "",
            "must give the `protocol`",
            "invalid row `codex-cli`",
        ),
    ];
    for (from, to, want, code) in cases {
        // A disagreement with the evidence fails the check (1); a row that breaks a rule of the
        // file is invalid input (2).
        let exit = if code == "evidence_disagrees" { 1 } else { 2 };
        let (tmp, dir) = fixture();
        let path = dir.join("clients.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "fixture lacks {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let out = callid(&["matrix", "render", "--dir", dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(exit),
            "{}",
            transcript(&out, tmp.path())
        );
        assert!(
            stderr.contains(code) && stderr.contains(want),
            "{want}: {stderr}"
        );
        assert!(!dir.join("SUPPORT.md").exists(), "nothing is written");
    }
}

#[test]
fn add_turns_a_probe_log_into_a_row() {
    let (tmp, dir) = empty_matrix();
    let log = repo().join("tests/fixtures/matrix/evidence/codex-0.171.0.jsonl");
    let out = matrix_add(&log, &dir, 0, tmp.path());
    let today = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        today.contains("added `codex-mcp-client-0.171.0`"),
        "{today}"
    );
    let yaml = std::fs::read_to_string(dir.join("clients.yaml")).unwrap();
    let date_line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("date:"))
        .unwrap();
    let yaml = yaml.replace(date_line, "  date: '[DATE]'");
    insta::assert_snapshot!("add_codex_row", yaml);
    assert_eq!(
        std::fs::read(dir.join("evidence/codex-mcp-client-0.171.0.jsonl")).unwrap(),
        std::fs::read(&log).unwrap(),
        "one client's log is its evidence, unchanged"
    );
    render_check_passes(&dir, tmp.path());
}

#[test]
fn add_refuses_a_log_without_tool_calls() {
    let (tmp, dir) = empty_matrix();
    let src =
        std::fs::read_to_string(repo().join("tests/fixtures/matrix/evidence/codex-0.171.0.jsonl"))
            .unwrap();
    let log = tmp.path().join("no-calls.jsonl");
    let kept: String = src
        .lines()
        .filter(|l| !l.contains("\"tools/call\""))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&log, kept).unwrap();
    let out = matrix_add(&log, &dir, 2, tmp.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("made a `tools/call`"));
}

/// Runs `callid measure --check` against the real client when it is installed (`npm install
/// --no-save --prefix matrices/clients`), and says why not otherwise. With
/// `CALLID_REQUIRE_CLIENTS` set (CI sets it once the install succeeded), a missing client fails.
fn measure_real(client: &str, program: &str) {
    crate::common::measure::measure_check(
        client,
        &repo()
            .join("matrices/clients/node_modules/.bin")
            .join(program),
        "run `npm install --no-save --prefix matrices/clients`",
        "CALLID_REQUIRE_CLIENTS",
        "verdict: accepted",
    );
}

#[test]
fn measure_codex_matches_the_committed_row() {
    measure_real("codex", "codex");
}

#[test]
fn measure_claude_code_matches_the_committed_row() {
    measure_real("claude-code", "claude");
}

#[test]
fn add_turns_a_conformance_report_into_a_router_row() {
    let (tmp, dir) = fixture();
    let report = repo().join("tests/fixtures/matrix-conform-report.json");
    let out = matrix_add(&report, &dir, 0, tmp.path());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("added router `callid-reference-router` (29 checks)")
    );
    let routers = std::fs::read_to_string(dir.join("routers.yaml")).unwrap();
    assert!(
        routers.contains("- id: fixture-router"),
        "other rows are kept"
    );
    assert!(routers.contains("- id: callid-reference-router"));
    let md = std::fs::read_to_string(dir.join("SUPPORT.md")).unwrap();
    // Rows are the union of all routers' check ids (the fixture's five, of which three are real
    // checks the report has too, and the report's 29): 31 rows. Each router is one column, with
    // `absent` where its run had no such check.
    let column = |header: &str| router_column(&md, header);
    let reference = column("callid reference router 0.1.0 (");
    assert_eq!(reference.len(), 31, "{md}");
    assert_eq!(reference.iter().filter(|v| *v == "pass").count(), 29);
    assert_eq!(reference.iter().filter(|v| *v == "absent").count(), 2);
    let fixture = column("fixture router \\| with a pipe 0.1.0 (2026-11-29)");
    assert_eq!(fixture.iter().filter(|v| *v == "absent").count(), 26);
    render_check_passes(&dir, tmp.path());
}

/// Re-adding a router's report replaces its verdicts and keeps the command its row was measured
/// with (a report does not know how conform was invoked: `--target FILE`, an install step).
#[test]
fn re_adding_a_report_keeps_the_rows_command() {
    let (tmp, dir) = fixture();
    let report = repo().join("tests/fixtures/matrix-conform-report.json");
    matrix_add(&report, &dir, 0, tmp.path());
    let path = dir.join("routers.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let custom = "install.sh && callid conform --target my-router.yaml --format json";
    let at = text.find("- id: callid-reference-router").unwrap();
    let (before, row) = text.split_at(at);
    let edited = format!(
        "{before}{}",
        row.replacen(
            "command: callid conform --format json",
            &format!("command: {custom}"),
            1
        )
    );
    assert_ne!(edited, text, "the added row has the default command");
    std::fs::write(&path, edited).unwrap();
    matrix_add(&report, &dir, 0, tmp.path());
    let again = std::fs::read_to_string(&path).unwrap();
    assert!(again.contains(&format!("command: {custom}")), "{again}");
    assert_eq!(again.matches("- id: callid-reference-router").count(), 1);
}

/// The verdicts of the routers-table column whose header starts with `header`, one per check
/// row.
fn router_column(md: &str, header: &str) -> Vec<String> {
    let table = &md[md.find("## Routers").expect("a routers section")..];
    // Cells split on `|` not preceded by a backslash (an escaped pipe stays inside its cell).
    let cells = |line: &str| -> Vec<String> {
        let mut out = vec![String::new()];
        let mut prev = ' ';
        for c in line.chars() {
            if c == '|' && prev != '\\' {
                out.push(String::new());
            } else {
                out.last_mut().unwrap().push(c);
            }
            prev = c;
        }
        out.into_iter().map(|c| c.trim().to_string()).collect()
    };
    let head = table
        .lines()
        .find(|l| l.starts_with("| Check |"))
        .expect("a header row");
    let at = cells(head)
        .iter()
        .position(|c| c.starts_with(header))
        .unwrap_or_else(|| panic!("no column `{header}` in {head}"));
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| cells(l)[at].clone())
        .collect()
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `callid matrix outdated --dir DIR` with `envs`.
fn outdated(dir: &Path, envs: &[(&str, String)]) -> Output {
    Command::new(bin())
        .args(["matrix", "outdated", "--dir", dir.to_str().unwrap()])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("CALLID_LOG")
        .output()
        .unwrap()
}

#[test]
fn outdated_without_a_registry_says_so_and_exits_2() {
    let (tmp, dir) = fixture();
    let port = closed_port();
    let out = outdated(
        &dir,
        &[
            ("npm_config_registry", format!("http://127.0.0.1:{port}/")),
            ("CALLID_PYPI_URL", format!("http://127.0.0.1:{port}/pypi")),
        ],
    );
    let text = transcript(&out, tmp.path());
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("failed to ask npm for the latest version of `@openai/codex`")
            && text.contains("check the network connection"),
        "{text}"
    );
    // Nothing is called current or stale when the registry could not be asked.
    assert!(out.stdout.is_empty(), "{text}");
}

#[test]
fn outdated_lists_a_row_measured_on_an_older_version() {
    let (tmp, dir) = fixture();
    let clients = dir.join("clients.yaml");
    let text = std::fs::read_to_string(&clients).unwrap();
    assert!(text.contains("version: 0.171.0"));
    std::fs::write(&clients, text.replace("version: 0.171.0", "version: 0.1.0")).unwrap();
    let out = outdated(&dir, &[]);
    let text = transcript(&out, tmp.path());
    if out.status.code() == Some(2) && std::env::var_os("CALLID_REQUIRE_CLIENTS").is_none() {
        eprintln!("SKIP: the npm registry cannot be reached here:\n{text}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(
            "stale: Codex CLI (`codex-cli`) measured on 0.1.0, npm `@openai/codex` is at "
        ) && stdout.contains("run `callid measure --client codex --update`"),
        "{text}"
    );
    assert!(text.contains("1 of 1 measured rows are behind"), "{text}");
}
