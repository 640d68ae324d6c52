//! Integration tests of `callid conform` as a router author outside this repository uses it: the
//! binary run from an empty directory (built-in scenarios and profile), `--list`,
//! `--print-profile`, `--scenarios` overrides, honest coverage (skipped by profile vs not run),
//! unknown placeholders, wrapper scripts and SIGKILL, a router with other names, the new checks
//! against their broken routers, money-first reasons, and `--write-expected-failures`.

use crate::common::conform::{code, flaws_that_did_not_fail, router_py, stderr, stdout, verdicts};
use crate::common::{bin, repo};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `callid conform ARGS` run from `dir`.
fn conform_in(dir: &Path, args: &[&str]) -> Output {
    crate::common::conform::conform_in(dir, args, &[])
}

/// `(id, rule, level)` of every scenario file of the repository.
fn scenario_files() -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = std::fs::read_dir(repo().join("scenarios"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let doc: serde_yaml::Value =
                serde_yaml::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let s = |k: &str| doc[k].as_str().map(str::to_string);
            (
                s("id").unwrap(),
                s("rule").unwrap(),
                s("level").unwrap_or_else(|| "required".into()),
            )
        })
        .collect();
    out.sort();
    out
}

fn empty_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn the_binary_runs_the_full_suite_from_an_empty_directory() {
    let dir = empty_dir();
    let output = conform_in(dir.path(), &["--format", "json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    let ids: Vec<String> = scenario_files().into_iter().map(|(id, ..)| id).collect();
    assert_eq!(verdicts.keys().cloned().collect::<Vec<_>>(), ids);
    let not_passed: Vec<_> = verdicts
        .iter()
        .filter(|(id, v)| {
            v.0 != "pass" && !crate::common::conform::skipped_for_its_backend(id, &v.0, &v.1, true)
        })
        .collect();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the run left files in the working directory"
    );
}

#[test]
fn list_prints_every_check_id_with_the_rule_it_cites() {
    let dir = empty_dir();
    let output = conform_in(dir.path(), &["--list"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let text = stdout(&output);
    let recommended_at = text.find("\nrecommended").expect("a recommended section");
    for (id, rule, level) in scenario_files() {
        let line = format!("  {id}  {rule}\n");
        let at = text
            .find(&line)
            .unwrap_or_else(|| panic!("{line:?} missing from:\n{text}"));
        assert_eq!(at > recommended_at, level == "recommended", "{id}");
    }
}

#[test]
fn print_profile_writes_a_commented_template_that_runs_as_is() {
    let dir = empty_dir();
    let output = conform_in(dir.path(), &["--print-profile"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let template = stdout(&output);
    for want in [
        "# Placeholders",
        "{provider_url}",
        "error_codes:",
        "capabilities:",
        "#   statuses: pending, awaiting_approval, completed, denied, failed, in_doubt\n",
        " outcome_in_doubt,",
    ] {
        assert!(template.contains(want), "{want} missing:\n{template}");
    }
    let file = dir.path().join("router.yaml");
    std::fs::write(&file, &template).unwrap();
    let output = conform_in(
        dir.path(),
        &[
            "--target",
            "router.yaml",
            "--only",
            "identity.missing-fails-closed",
            "redelivery.same-connection",
        ],
    );
    assert_eq!(code(&output), 0, "{}{}", stdout(&output), stderr(&output));
    assert!(
        stdout(&output).contains("2 checks: 2 pass, 0 fail, 0 skipped by profile, 0 not run"),
        "{}",
        stdout(&output)
    );
}

/// `--print-profile gateway` prints the shipped gateway profile, and that profile, with the
/// shipped policy beside it, runs as is from a directory outside the repository.
#[test]
fn print_profile_gateway_writes_the_gateway_profile_that_runs_as_is() {
    let dir = empty_dir();
    let output = conform_in(dir.path(), &["--print-profile", "gateway"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let profile = stdout(&output);
    insta::assert_snapshot!("print_profile_gateway", profile);
    let targets = repo().join("scenarios/targets");
    assert_eq!(
        profile,
        std::fs::read_to_string(targets.join("gateway.yaml")).unwrap()
    );
    std::fs::write(dir.path().join("gateway.yaml"), &profile).unwrap();
    std::fs::copy(
        targets.join("gateway-policy.yaml"),
        dir.path().join("gateway-policy.yaml"),
    )
    .unwrap();
    let output = conform_in(
        dir.path(),
        &[
            "--target",
            "gateway.yaml",
            "--only",
            "identity.missing-fails-closed",
            "redelivery.same-connection",
        ],
    );
    assert_eq!(code(&output), 0, "{}{}", stdout(&output), stderr(&output));
    assert!(
        stdout(&output).contains("2 checks: 2 pass, 0 fail, 0 skipped by profile, 0 not run"),
        "{}",
        stdout(&output)
    );
    let router = conform_in(dir.path(), &["--print-profile", "router"]);
    assert_eq!(
        stdout(&router),
        stdout(&conform_in(dir.path(), &["--print-profile"]))
    );
    let unknown = conform_in(dir.path(), &["--print-profile", "proxy"]);
    assert_eq!(code(&unknown), 2);
    assert!(
        stderr(&unknown).contains("[possible values: router, gateway]"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn contract_is_printed_and_linked_from_help() {
    let dir = empty_dir();
    let contract = conform_in(dir.path(), &["--contract"]);
    assert_eq!(code(&contract), 0);
    assert_eq!(
        stdout(&contract),
        std::fs::read_to_string(repo().join("ROUTER-CONTRACT.md")).unwrap()
    );
    let help = conform_in(dir.path(), &["--help"]);
    let text = stdout(&help);
    assert!(text.contains("ROUTER-CONTRACT.md"), "{text}");
    assert!(
        text.contains("--registry FILE --provider-url URL --approval-above-cents 10"),
        "`--stdio` must say what it appends:\n{text}"
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.contains("ROUTER-CONTRACT.md"));
}

#[test]
fn scenarios_dir_adds_checks_and_replaces_built_in_ones() {
    let dir = empty_dir();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::write(
        own.join("extra.yaml"),
        "id: extra.two-calls\ntitle: t\nrule: my extra rule\narticle: q\nsteps:\n  - {do: call, meta: {callId: \"{call:a}\"}, expect: {ok: true, charges: 1}}\n",
    )
    .unwrap();
    // Same id as a built-in check, with an expectation the reference router does not meet.
    std::fs::write(
        own.join("replaced.yaml"),
        "id: identity.missing-fails-closed\ntitle: t\nrule: replaced rule\narticle: q\nsteps:\n  - {do: call, expect: {ok: true}}\n",
    )
    .unwrap();
    let list = conform_in(dir.path(), &["--scenarios", "own", "--list"]);
    let text = stdout(&list);
    assert!(
        text.contains("  extra.two-calls  my extra rule\n"),
        "{text}"
    );
    assert!(
        text.contains("  identity.missing-fails-closed  replaced rule\n"),
        "{text}"
    );
    assert!(text.contains("  redelivery.same-connection  "), "{text}");
    let output = conform_in(
        dir.path(),
        &[
            "--scenarios",
            "own",
            "--format",
            "json",
            "--only",
            "extra.two-calls",
            "identity.missing-fails-closed",
        ],
    );
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    assert_eq!(verdicts["extra.two-calls"].0, "pass");
    assert_eq!(verdicts["identity.missing-fails-closed"].0, "fail");
}

#[test]
fn a_declared_absent_capability_is_skipped_and_an_undeclared_one_is_not_run() {
    let dir = empty_dir();
    let reference = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace("{profile_dir}", &repo().display().to_string());
    let declared = reference.replace(
        "capabilities: {restart: true, kill: true, approval: true, shared_registry: true}",
        "capabilities: {restart: true, kill: true, approval: false, shared_registry: true}",
    );
    let undeclared = reference.replace(
        "capabilities: {restart: true, kill: true, approval: true, shared_registry: true}",
        "capabilities: {restart: true, kill: true, shared_registry: true}",
    );
    assert_ne!(declared, reference);
    std::fs::write(dir.path().join("declared.yaml"), declared).unwrap();
    std::fs::write(dir.path().join("undeclared.yaml"), undeclared).unwrap();
    let only = [
        "--only",
        "approval.deny-refuses",
        "identity.missing-fails-closed",
    ];
    let run = |profile: &str, extra: &[&str]| {
        let mut args = vec!["--target", profile, "--format", "json"];
        args.extend(only);
        args.extend(extra);
        conform_in(dir.path(), &args)
    };
    let skipped = run("declared.yaml", &[]);
    assert_eq!(code(&skipped), 0, "{}", stderr(&skipped));
    let (verdict, reason, _) = &verdicts(&skipped)["approval.deny-refuses"];
    assert_eq!(verdict, "skipped");
    assert!(
        reason.contains("the profile declares `capabilities.approval: false`"),
        "{reason}"
    );

    let not_run = run("undeclared.yaml", &[]);
    assert_eq!(code(&not_run), 1, "{}", stderr(&not_run));
    let (verdict, reason, _) = &verdicts(&not_run)["approval.deny-refuses"];
    assert_eq!(verdict, "not-run");
    assert!(
        reason.contains("does not declare `capabilities.approval`"),
        "{reason}"
    );
    let doc: Value = serde_json::from_slice(&not_run.stdout).unwrap();
    assert_eq!(doc["success"], false);
    assert_eq!(doc["summary"]["not_run"], 1);

    let allowed = run("undeclared.yaml", &["--allow-incomplete"]);
    assert_eq!(code(&allowed), 0, "{}", stderr(&allowed));
    let table = conform_in(
        dir.path(),
        &[
            "--target",
            "undeclared.yaml",
            "--only",
            "approval.deny-refuses",
        ],
    );
    assert_eq!(code(&table), 1);
    assert!(
        stdout(&table).contains(
            "1 checks: 0 pass, 0 fail, 0 skipped by profile, 1 not run, 0 error (incomplete: 1 check(s) not run)"
        ),
        "{}",
        stdout(&table)
    );
}

#[test]
fn a_typo_in_a_placeholder_is_an_error_naming_it_and_the_known_ones() {
    let dir = empty_dir();
    let text = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace(
            "\"{registry}\", --provider-url",
            "\"{regsitry}\", --provider-url",
        );
    std::fs::write(dir.path().join("typo.yaml"), text).unwrap();
    let output = conform_in(dir.path(), &["--target", "typo.yaml"]);
    assert_eq!(code(&output), 2, "{}", stdout(&output));
    assert_eq!(
        stderr(&output).trim(),
        "error: typo.yaml: args[2]: unknown placeholder `{regsitry}`; the known ones are `{callid}`, `{state_dir}`, `{registry}`, `{provider_url}`, `{port}`, `{profile_dir}`, `{upstream_url}`, `{upstream_command}`, `{upstream_argv}`, `{check_slug}`, `{env:NAME}`"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing was started"
    );
}

#[test]
fn a_misspelt_status_is_an_error_naming_the_nearest_before_anything_starts() {
    let dir = empty_dir();
    let text = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace("statuses: {}", "statuses: {complete: done}");
    std::fs::write(dir.path().join("typo.yaml"), text).unwrap();
    let output = conform_in(dir.path(), &["--target", "typo.yaml"]);
    assert_eq!(code(&output), 2, "{}", stdout(&output));
    assert_eq!(
        stderr(&output).trim(),
        "error: typo.yaml: statuses.complete: unknown status `complete` (did you mean `completed`?); the valid ones are `pending`, `awaiting_approval`, `completed`, `denied`, `failed`, `in_doubt`"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing was started"
    );
}

#[test]
fn url_to_a_closed_port_says_connection_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = empty_dir();
    let output = conform_in(
        dir.path(),
        &["--url", &format!("http://127.0.0.1:{port}/mcp")],
    );
    assert_eq!(code(&output), 2, "{}", stdout(&output));
    let err = stderr(&output);
    assert!(
        err.starts_with(&format!(
            "error: failed to reach the router at `http://127.0.0.1:{port}/mcp`: connection refused"
        )),
        "{err}"
    );
    assert!(!err.contains("check the target's command"), "{err}");
}

#[test]
fn a_stdio_router_that_fails_to_start_shows_the_stderr_lines_that_name_the_problem() {
    let dir = empty_dir();
    let script = dir.path().join("fails.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'fatal: cannot open the registry /nope/r.sqlite3: permission denied' >&2\necho 'run with --verbose for details' >&2\nexit 1\n",
    )
    .unwrap();
    let output = conform_in(
        dir.path(),
        &[
            "--stdio",
            &format!("sh {}", script.display()),
            "--only",
            "identity.missing-fails-closed",
        ],
    );
    assert_eq!(code(&output), 2);
    let err = stderr(&output);
    assert!(
        err.contains("fatal: cannot open the registry /nope/r.sqlite3: permission denied | run with --verbose for details"),
        "{err}"
    );
}

/// Writes the shell script `name` in `dir` that starts the Python router as
/// `{launch}python3 router.py "$@"`: the `--stdio` command that runs it.
fn python_wrapper(dir: &Path, name: &str, launch: &str) -> String {
    let wrapper = dir.join(name);
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\n{launch}python3 '{}' \"$@\"\n", router_py()),
    )
    .unwrap();
    format!("sh {}", wrapper.display())
}

/// A wrapper that runs the Python router without `exec`: the runner kills the whole process
/// group, so the crash checks judge the router, not the wrapper.
#[test]
fn a_wrapper_script_without_exec_is_killed_with_its_router() {
    let dir = empty_dir();
    let wrapper = python_wrapper(dir.path(), "wrapper.sh", "");
    let output = conform_in(
        dir.path(),
        &[
            "--stdio",
            &wrapper,
            "--format",
            "json",
            "--only",
            "crash.after-charge-before-reply",
            "crash.after-dispatch-before-charge",
        ],
    );
    assert_eq!(code(&output), 0, "{}{}", stdout(&output), stderr(&output));
    for (id, (verdict, reason, _)) in verdicts(&output) {
        assert_eq!(verdict, "pass", "{id}: {reason}");
    }
}

/// A wrapper that starts the router in a new session: SIGKILL to the group cannot reach it, it
/// keeps answering, and that is a setup error, not a verdict on the router.
#[test]
fn a_router_that_survives_sigkill_is_a_setup_error() {
    let dir = empty_dir();
    let wrapper = python_wrapper(dir.path(), "escapes.sh", "setsid ");
    let output = conform_in(
        dir.path(),
        &[
            "--stdio",
            &wrapper,
            "--only",
            "crash.after-charge-before-reply",
        ],
    );
    assert_eq!(code(&output), 2, "{}", stdout(&output));
    let err = stderr(&output);
    assert!(
        err.starts_with("error: check `crash.after-charge-before-reply` cannot judge this target: steps[0] (call `first`): the runner killed the router's process group with SIGKILL at `after_charge`, yet the process that answers survived and replied"),
        "{err}"
    );
    assert!(err.contains("`exec`"), "{err}");
}

#[test]
fn a_router_with_other_names_passes_every_required_check() {
    let dir = empty_dir();
    let profile = repo().join("tests/fixtures/broken_routers/profile-other-names.yaml");
    let output = conform_in(
        dir.path(),
        &["--target", profile.to_str().unwrap(), "--format", "json"],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    assert_eq!(verdicts.len(), scenario_files().len());
    for (id, (verdict, reason, level)) in &verdicts {
        match level.as_str() {
            "required" if id.starts_with("at-most-once.") => assert!(
                crate::common::conform::skipped_for_its_backend(id, verdict, reason, true),
                "{id}: {verdict}: {reason}"
            ),
            "required" if id.starts_with("signature.") => assert!(
                crate::common::conform::skipped_unsigned(id, verdict, reason),
                "{id}: {verdict}: {reason}"
            ),
            "required" => assert_eq!(verdict, "pass", "{id}: {reason}"),
            _ => assert_eq!(verdict, "fail", "{id}: the dialect breaks every convention"),
        }
    }
}

/// Each new check (issue 10, item 5) fails on the broken router that breaks its rule.
const NEW_CHECK_FLAWS: &[(&str, &str, &str)] = &[
    (
        "naive-hash",
        "request-hash.canonical-form",
        "steps[1] (call `reordered`): expected success, got the tool error `request_mismatch`",
    ),
    (
        "char-bounds",
        "identity-bounds.counted-in-bytes",
        "steps[0] (call): the provider saw 1 dispatch, 1 charge in this scenario; expected 0 charges",
    ),
    (
        "private-provider-key",
        "privacy.provider-key-not-private",
        "steps[0] (call `first`): the provider received the private operation key as its idempotency key",
    ),
    (
        "rekey-after-failure",
        "redelivery.after-provider-failure",
        "steps[1] (redeliver `again`): the provider received 2 different idempotency keys for one operation",
    ),
];

#[test]
fn each_new_check_fails_on_its_broken_router() {
    let dir = empty_dir();
    let problems = flaws_that_did_not_fail(dir.path(), NEW_CHECK_FLAWS);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A router that dispatches a redelivery again breaks a money rule and the replay-marker
/// convention at once: the reason is the second charge, and the convention comes after it.
#[test]
fn when_money_and_a_convention_both_fail_the_money_leads() {
    let dir = empty_dir();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::write(
        own.join("both.yaml"),
        "id: both.marker-then-money\ntitle: t\nrule: r\narticle: q\nsteps:\n  - {do: call, name: first, meta: {callId: \"{call:a}\"}, expect: {ok: true, replayed: true, charges: 1}}\n  - {do: redeliver, of: first, expect: {ok: true, charges: 1}}\n",
    )
    .unwrap();
    let command = format!("python3 '{}' --flaw redispatch", router_py());
    let output = conform_in(
        dir.path(),
        &[
            "--stdio",
            &command,
            "--scenarios",
            "own",
            "--format",
            "json",
            "--only",
            "both.marker-then-money",
            "convention.replay-marker",
        ],
    );
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let verdicts = verdicts(&output);
    let (verdict, reason, _) = &verdicts["both.marker-then-money"];
    assert_eq!(verdict, "fail");
    assert_eq!(
        reason,
        "steps[1] (redeliver `first`): the provider saw 2 dispatches, 2 charges in this scenario; expected 1 charge (also steps[0] (call `first`): expected the replay flag at `/_meta/callid~1replayed` to be true, got `false`)"
    );
    let (verdict, reason, level) = &verdicts["convention.replay-marker"];
    assert_eq!((verdict.as_str(), level.as_str()), ("fail", "recommended"));
    assert!(
        reason.starts_with(
            "steps[1] (redeliver `first`): the provider saw 2 dispatches, 2 charges in this scenario"
        ),
        "{reason}"
    );
}

#[test]
fn write_expected_failures_creates_a_baseline_the_next_run_accepts() {
    let dir = empty_dir();
    let command = format!("python3 '{}' --flaw ignore-hash", router_py());
    let baseline = dir.path().join("expected.txt");
    let only = [
        "--only",
        "call-id.reused-other-arguments",
        "identity.missing-fails-closed",
    ];
    let mut args = vec![
        "--stdio",
        command.as_str(),
        "--write-expected-failures",
        baseline.to_str().unwrap(),
    ];
    args.extend(only);
    let first = conform_in(dir.path(), &args);
    assert_eq!(code(&first), 1, "{}", stderr(&first));
    let text = std::fs::read_to_string(&baseline).unwrap();
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split('#').next())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(ids, ["call-id.reused-other-arguments"], "{text}");

    let mut args = vec![
        "--stdio",
        command.as_str(),
        "--expected-failures",
        baseline.to_str().unwrap(),
    ];
    args.extend(only);
    let second = conform_in(dir.path(), &args);
    assert_eq!(code(&second), 0, "{}", stdout(&second));
    assert!(stdout(&second).contains("fail (expected)"));
}

/// The CI recipe of the guide *Check your router* is a GitHub Actions workflow that runs the
/// command it documents, and installs callid from a pinned copy, never from a made-up address.
#[test]
fn the_readme_ci_recipe_is_a_workflow_running_conform_with_junit() {
    let readme = std::fs::read_to_string(repo().join("docs/src/conform.md")).unwrap();
    let start = readme
        .find("```yaml\n# .github/workflows/router-conformance.yml")
        .expect("the CI recipe block");
    let body = &readme[start + "```yaml\n".len()..];
    let body = &body[..body.find("```").unwrap()];
    let doc: serde_yaml::Value = serde_yaml::from_str(body).expect("the recipe is YAML");
    let steps = doc["jobs"]["conform"]["steps"]
        .as_sequence()
        .expect("jobs.conform.steps");
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    assert!(
        runs.iter()
            .any(|r| r.contains("cargo install --locked --path third_party/callid")),
        "{runs:?}"
    );
    assert!(!body.contains("://"), "no address in the recipe:\n{body}");
    assert!(
        runs.iter()
            .any(|r| r
                .contains("callid conform --target router.yaml --format junit --out conform.xml")),
        "{runs:?}"
    );
    assert!(
        steps
            .iter()
            .any(|s| s["uses"].as_str().is_some_and(|u| u.contains("junit"))),
        "a step publishes the report"
    );
}

/// A report with every new verdict word still turns into a matrix row: `skipped` is the
/// matrix's `not-applicable` and `not-run` its `error` (could not run).
#[test]
fn matrix_add_reads_skipped_and_not_run_verdicts() {
    let dir = empty_dir();
    let text = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace(
            "capabilities: {restart: true, kill: true, approval: true, shared_registry: true}",
            "capabilities: {restart: true, approval: false, shared_registry: true}",
        );
    std::fs::write(dir.path().join("p.yaml"), text).unwrap();
    let report = conform_in(
        dir.path(),
        &[
            "--target",
            "p.yaml",
            "--format",
            "json",
            "--out",
            "report.json",
            "--only",
            "approval.deny-refuses",
            "crash.after-dispatch-before-charge",
            "identity.missing-fails-closed",
        ],
    );
    assert_eq!(code(&report), 1, "{}", stderr(&report));
    let matrices = dir.path().join("matrices");
    std::fs::create_dir(&matrices).unwrap();
    std::fs::copy(
        repo().join("matrices/clients.yaml"),
        matrices.join("clients.yaml"),
    )
    .unwrap();
    let add = Command::new(bin())
        .args(["matrix", "add", "report.json", "--dir", "matrices"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(code(&add), 0, "{}", stderr(&add));
    let routers = std::fs::read_to_string(matrices.join("routers.yaml")).unwrap();
    for want in [
        "  - id: approval.deny-refuses\n    verdict: not-applicable",
        "  - id: crash.after-dispatch-before-charge\n    verdict: error",
        "  - id: identity.missing-fails-closed\n    verdict: pass",
    ] {
        assert!(routers.contains(want), "{want:?} missing:\n{routers}");
    }
}
