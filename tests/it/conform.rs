//! Integration tests of `callid conform`: the real binary against the real reference router, the
//! independent Python router and each of its deliberate flaws (the suite has teeth), every report
//! format, the expected-failures baseline, and every setup error.

use crate::common::conform::{code, conform, stderr, stdout};
use crate::common::{bin, repo};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `{check id: (verdict, reason)}` of a `--format json` run.
fn verdicts(output: &Output) -> BTreeMap<String, (String, String)> {
    crate::common::conform::verdicts(output)
        .into_iter()
        .map(|(id, (verdict, reason, _))| (id, (verdict, reason)))
        .collect()
}

fn scenario_ids() -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(repo().join("scenarios"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("id: "))
                .expect("id line")
                .trim()
                .to_string()
        })
        .collect();
    ids.sort();
    ids
}

fn python_router() -> PathBuf {
    repo().join("tests/fixtures/broken_routers/router.py")
}

fn python_command(flaw: Option<&str>) -> String {
    let mut command = format!("python3 '{}'", python_router().display());
    if let Some(flaw) = flaw {
        command.push_str(&format!(" --flaw {flaw}"));
    }
    command
}

/// Every check passes but the `at-most-once.*` ones, skipped: these profiles leave
/// `idempotent_backend` out, and the reason says which key turns them on (and the `signature.*`
/// ones, for a profile without `signed_envelopes`).
fn assert_all_pass(output: &Output) {
    let verdicts = verdicts(output);
    let not_passed: Vec<_> = verdicts
        .iter()
        .filter(|(id, (v, r))| {
            v != "pass"
                && !crate::common::conform::skipped_for_its_backend(id, v, r, true)
                && !crate::common::conform::skipped_unsigned(id, v, r)
        })
        .collect();
    assert_eq!(
        verdicts
            .keys()
            .filter(|id| id.starts_with("at-most-once."))
            .count(),
        4
    );
    assert!(
        not_passed.is_empty(),
        "checks that did not pass: {not_passed:#?}"
    );
    assert_eq!(
        verdicts.keys().cloned().collect::<Vec<_>>(),
        scenario_ids(),
        "every scenario ran once"
    );
    assert_eq!(code(output), 0, "stderr:\n{}", stderr(output));
}

#[test]
fn reference_router_passes_every_check() {
    let output = conform(&["--format", "json"]);
    assert_all_pass(&output);
}

#[test]
fn independent_python_router_passes_every_check() {
    let output = conform(&[
        "--target",
        "tests/fixtures/broken_routers/profile.yaml",
        "--format",
        "json",
    ]);
    assert_all_pass(&output);
}

#[test]
fn reference_router_over_streamable_http_passes_every_check() {
    let output = conform(&[
        "--target",
        "scenarios/targets/reference-http.yaml",
        "--format",
        "json",
    ]);
    assert_all_pass(&output);
}

/// A router at a bare URL: the runner neither starts it nor sees its provider, so every check that
/// counts charges, restarts or kills is not run: the run exits 1 saying why (never a pass), and
/// `--allow-incomplete` accepts it.
#[test]
fn bare_url_target_reports_what_it_cannot_check_as_not_run_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut router = Command::new(bin())
        .args([
            "router",
            "--http",
            &format!("127.0.0.1:{port}"),
            "--registry",
        ])
        .arg(dir.path().join("registry.sqlite3"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the router did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let url = format!("http://127.0.0.1:{port}/mcp");
    let output = conform(&["--url", &url, "--format", "json"]);
    let table = conform(&["--url", &url, "--only", "redelivery.same-connection"]);
    let allowed = conform(&[
        "--url",
        &url,
        "--allow-incomplete",
        "--only",
        "redelivery.same-connection",
        "schema.no-identity-field",
    ]);
    router.kill().unwrap();
    router.wait().unwrap();
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(doc["success"], false);
    let verdicts = verdicts(&output);
    assert_eq!(verdicts.len(), scenario_ids().len());
    let (verdict, reason) = &verdicts["schema.no-identity-field"];
    assert_eq!(verdict, "pass", "{reason}");
    let (verdict, reason) = &verdicts["redelivery.same-connection"];
    assert_eq!(verdict, "not-run");
    assert!(
        reason.starts_with(
            "charges cannot be counted: the router does not use the runner's provider"
        ),
        "{reason}"
    );
    let (verdict, reason) = &verdicts["crash.after-charge-before-reply"];
    assert_eq!(verdict, "not-run");
    assert!(
        reason.contains("killing the router (kill -9): the runner does not start this router"),
        "{reason}"
    );
    assert!(verdicts.iter().all(|(id, (v, r))| v == "pass"
        || v == "not-run"
        || crate::common::conform::skipped_for_its_backend(id, v, r, true)
        || crate::common::conform::skipped_unsigned(id, v, r)));

    assert_eq!(code(&table), 1);
    assert!(
        stdout(&table).contains("1 checks: 0 pass, 0 fail, 0 skipped by profile, 1 not run, 0 error (incomplete: 1 check(s) not run)"),
        "{}",
        stdout(&table)
    );
    assert_eq!(code(&allowed), 0, "{}", stdout(&allowed));
    assert!(
        stdout(&allowed).contains("(1 not run allowed by --allow-incomplete)"),
        "{}",
        stdout(&allowed)
    );
}

/// Each flaw of the Python router breaks one rule; conform must fail it on these checks.
const FLAWS: &[(&str, &[&str])] = &[
    ("session-key", &["identity.session-id-not-identity"]),
    (
        "args-identity",
        &[
            "arguments.identity-field-top-level",
            "arguments.identity-field-nested",
        ],
    ),
    (
        "memory-registry",
        &[
            "redelivery.after-restart",
            "crash.after-charge-before-reply",
        ],
    ),
    ("ignore-hash", &["call-id.reused-other-arguments"]),
    (
        "no-scrub",
        &["privacy.no-private-key", "redelivery.same-connection"],
    ),
    (
        "dispatch-before-commit",
        &["crash.after-charge-before-reply"],
    ),
    ("approval-skip", &["approval.redelivery-cannot-skip"]),
    ("cross-platform", &["identity.same-id-two-platforms"]),
    ("missing-ok", &["identity.missing-fails-closed"]),
    ("no-ambiguity-check", &["identity.ambiguous-refused"]),
];

#[test]
fn suite_has_teeth_every_flaw_fails_its_checks() {
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = FLAWS
            .iter()
            .map(|(flaw, expected)| {
                scope.spawn(move || {
                    let command = python_command(Some(flaw));
                    let mut args = vec!["--stdio", command.as_str(), "--format", "json", "--only"];
                    args.extend(expected.iter().copied());
                    let output = conform(&args);
                    let verdicts = verdicts(&output);
                    let mut problems = Vec::new();
                    for id in *expected {
                        match verdicts.get(*id) {
                            Some((v, _)) if v == "fail" => {}
                            other => problems
                                .push(format!("--flaw {flaw}: `{id}` should fail, got {other:?}")),
                        }
                    }
                    if code(&output) != 1 {
                        problems.push(format!(
                            "--flaw {flaw}: exit {} instead of 1",
                            code(&output)
                        ));
                    }
                    problems
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Replaces what changes from run to run: durations and the repository path.
fn redact(text: &str) -> String {
    let mut out = text.replace(&repo().display().to_string(), "[repo]");
    for (prefix, suffix, placeholder) in [
        ("\"duration_ms\": ", "", "[ms]"),
        ("time=\"", "\"", "[s]"),
        (" in ", " s", "[s]"),
    ] {
        out = replace_number(&out, prefix, suffix, placeholder);
    }
    out
}

/// Replaces every `<prefix><digits and dots><suffix>` with `<prefix><placeholder><suffix>`.
fn replace_number(text: &str, prefix: &str, suffix: &str, placeholder: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at + prefix.len()..];
        let digits = tail
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(tail.len());
        out.push_str(&rest[..at + prefix.len()]);
        if digits > 0 && tail[digits..].starts_with(suffix) {
            out.push_str(placeholder);
            rest = &tail[digits..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// The Python router's profile with `--flaw dispatch-before-commit` and no approval capability.
fn flawed_profile(dir: &Path) -> PathBuf {
    let fixture = repo().join("tests/fixtures/broken_routers");
    let text = std::fs::read_to_string(fixture.join("profile.yaml"))
        .unwrap()
        .replace("{profile_dir}", &fixture.display().to_string())
        .replace(
            "name: broken-router fixture (python, no flaw)",
            "name: python router, --flaw dispatch-before-commit, no approval",
        )
        .replace(
            "/router.py\", --registry",
            "/router.py\", --flaw, dispatch-before-commit, --registry",
        )
        .replace("approval: true}", "approval: false}");
    assert!(
        text.contains("dispatch-before-commit, --registry"),
        "{text}"
    );
    let file = dir.join("profile.yaml");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn every_format_renders_one_result_stream() {
    let dir = tempfile::tempdir().unwrap();
    let profile = flawed_profile(dir.path());
    for format in ["table", "markdown", "json", "junit"] {
        let output = conform(&[
            "--target",
            profile.to_str().unwrap(),
            "--format",
            format,
            "--only",
            "crash.after-charge-before-reply",
            "identity.missing-fails-closed",
            "approval.deny-refuses",
        ]);
        assert_eq!(code(&output), 1, "{format}: {}", stderr(&output));
        insta::assert_snapshot!(format!("format_{format}"), redact(&stdout(&output)));
    }
}

#[test]
fn out_writes_the_report_to_a_file_and_the_summary_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.xml");
    let command = python_command(None);
    let output = conform(&[
        "--stdio",
        &command,
        "--format",
        "junit",
        "--out",
        file.to_str().unwrap(),
        "--only",
        "identity.ambiguous-refused",
    ]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(stdout(&output).is_empty());
    assert_eq!(
        stderr(&output).trim(),
        "1 checks: 1 pass, 0 fail, 0 skipped by profile, 0 not run, 0 error"
    );
    let xml = std::fs::read_to_string(&file).unwrap();
    assert!(
        xml.contains(r#"<testcase classname="conform" name="identity.ambiguous-refused""#),
        "{xml}"
    );
}

#[test]
fn expected_failures_are_strict_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let command = python_command(Some("ignore-hash"));
    let run = |listed: &str| {
        let file = dir.path().join("expected.txt");
        std::fs::write(&file, listed).unwrap();
        conform(&[
            "--stdio",
            &command,
            "--expected-failures",
            file.to_str().unwrap(),
            "--only",
            "call-id.reused-other-arguments",
            "identity.missing-fails-closed",
        ])
    };
    let tolerated = run("# ignore-hash is a known flaw\ncall-id.reused-other-arguments\n");
    assert_eq!(code(&tolerated), 0, "{}", stdout(&tolerated));
    assert!(
        stdout(&tolerated).contains("fail (expected)"),
        "{}",
        stdout(&tolerated)
    );

    let stale = run("call-id.reused-other-arguments\nidentity.missing-fails-closed\n");
    assert_eq!(code(&stale), 1, "{}", stdout(&stale));
    assert!(
        stdout(&stale).contains("pass (stale)"),
        "{}",
        stdout(&stale)
    );

    let unlisted = run("");
    assert_eq!(code(&unlisted), 1);

    let typo = run("call-id.reused-other-argument\n");
    assert_eq!(code(&typo), 2);
    assert!(
        stderr(&typo).contains(
            "expected.txt:1: no scenario has the check id `call-id.reused-other-argument`"
        ),
        "{}",
        stderr(&typo)
    );
}

/// A router that proxies the Python router and exits when it sees the `other` argument set.
fn dying_router(dir: &Path) -> PathBuf {
    let script = dir.join("dies_on_crane.py");
    std::fs::write(
        &script,
        format!(
            r#"import subprocess, sys
child = subprocess.Popen([sys.executable, {router:?}] + sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for line in sys.stdin:
    if "origami crane" in line:
        child.kill()
        sys.exit(3)
    child.stdin.write(line)
    child.stdin.flush()
    if '"id"' in line:
        sys.stdout.write(child.stdout.readline())
        sys.stdout.flush()
"#,
            router = python_router().display().to_string()
        ),
    )
    .unwrap();
    script
}

#[test]
fn a_router_that_dies_mid_scenario_is_an_error_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("python3 '{}'", dying_router(dir.path()).display());
    let output = conform(&[
        "--stdio",
        &command,
        "--format",
        "json",
        "--only",
        "call-id.reused-other-arguments",
        "identity.missing-fails-closed",
    ]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    let (verdict, reason) = &verdicts["call-id.reused-other-arguments"];
    assert_eq!(verdict, "error");
    assert!(
        reason.starts_with("steps[1] (call): the router exited unexpectedly"),
        "{reason}"
    );
    assert_eq!(verdicts["identity.missing-fails-closed"].0, "pass");
}

#[test]
fn usage_and_setup_errors_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(
        bad.join("x.yaml"),
        "id: a.b\ntitle: t\nrule: r\narticle: q\nsteps:\n  - do: call\n  - do: call\n    expect: {charges: many}\n",
    )
    .unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--scenarios".into(), bad.display().to_string()],
            format!(
                "error: {}: steps[1].expect.charges: invalid type: string \"many\", expected u64",
                bad.join("x.yaml").display()
            ),
        ),
        (
            vec!["--only".into(), "no.such-check".into()],
            "error: no scenario has the check id `no.such-check` (the nearest is \
             `status.public-handle`); `callid conform --list` prints every id"
                .into(),
        ),
        (
            vec!["--scenarios".into(), dir.path().join("missing").display().to_string()],
            format!(
                "error: failed to read the scenario directory `{}`",
                dir.path().join("missing").display()
            ),
        ),
        (
            vec!["--stdio".into(), "no-such-router-program-xyz".into()],
            "error: failed to start the router `no-such-router-program-xyz`".into(),
        ),
        (
            vec!["--stdio".into(), "true".into(), "--only".into(), "identity.missing-fails-closed".into()],
            "error: the router never started: starting the router: the router exited before answering `initialize`".into(),
        ),
        (
            vec!["--stdio".into(), "python3 'unbalanced".into()],
            "error: failed to split `--stdio python3 'unbalanced` into words: unbalanced quote".into(),
        ),
        (
            vec!["--target".into(), "scenarios/targets/nope.yaml".into()],
            "error: failed to read the target profile `scenarios/targets/nope.yaml`".into(),
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = conform(&args);
        assert_eq!(code(&output), 2, "{args:?}: {}", stderr(&output));
        assert!(
            stderr(&output).starts_with(&want),
            "{args:?}\n got: {}\nwant: {want}",
            stderr(&output)
        );
    }
    let clash = conform(&["--target", "x.yaml", "--stdio", "router"]);
    assert_eq!(code(&clash), 2);
}

/// The Python router (built for a backend that honours idempotency keys: it sends an operation
/// again after a failure) with a 1 s provider timeout, judged as a router for a backend that
/// charges every request (`idempotent_backend: false`).
fn re_dispatching_profile(dir: &Path) -> PathBuf {
    let fixture = repo().join("tests/fixtures/broken_routers");
    let text = std::fs::read_to_string(fixture.join("profile.yaml"))
        .unwrap()
        .replace("{profile_dir}", &fixture.display().to_string())
        .replace(
            "name: broken-router fixture (python, no flaw)",
            "name: python router, 1 s timeout, backend charges every request",
        )
        .replace(
            "/router.py\", --registry",
            "/router.py\", --provider-timeout, \"1\", --registry",
        );
    assert!(text.contains("--provider-timeout"), "{text}");
    let file = dir.join("profile.yaml");
    std::fs::write(&file, format!("{text}idempotent_backend: false\n")).unwrap();
    file
}

/// A router that sends an operation again after its request to a backend that charges every
/// request timed out fails `at-most-once.after-timeout`, the count naming dispatches and charges
/// apart; the checks written for an idempotent backend are skipped saying why, and those that
/// need `resolve` are not run.
#[test]
fn a_router_that_re_dispatches_after_a_timeout_to_a_backend_that_charges_every_request_fails() {
    let dir = tempfile::tempdir().unwrap();
    let profile = re_dispatching_profile(dir.path());
    let args = [
        "--target",
        profile.to_str().unwrap(),
        "--only",
        "at-most-once.after-timeout",
        "--only",
        "crash.after-charge-before-reply",
        "--only",
        "at-most-once.crash-after-charge",
    ];
    let mut json = args.to_vec();
    json.extend(["--format", "json"]);
    let output = conform(&json);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    assert_eq!(
        verdicts["at-most-once.after-timeout"],
        (
            "fail".to_string(),
            "steps[1] (redeliver `first`): the provider saw 2 dispatches, 1 charge in this scenario; expected 1 dispatch (the profile declares `idempotent_backend: false`: an operation whose outcome is unknown is sent again only after `resolve`)".to_string()
        )
    );
    assert_eq!(verdicts["crash.after-charge-before-reply"].0, "skipped");
    assert_eq!(verdicts["at-most-once.crash-after-charge"].0, "not-run");
    let table = conform(&args);
    insta::assert_snapshot!("at_most_once_re_dispatch", redact(&stdout(&table)));
}

/// A profile written before `idempotent_backend` keeps its exit code: the `at-most-once.*`
/// checks are skipped, and the report names the key that turns them on.
#[test]
fn a_profile_without_the_backend_key_skips_the_at_most_once_checks_and_names_the_key() {
    let output = conform(&[
        "--only",
        "at-most-once.provider-failure",
        "--only",
        "redelivery.after-provider-failure",
    ]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    insta::assert_snapshot!("at_most_once_off", redact(&stdout(&output)));
}
