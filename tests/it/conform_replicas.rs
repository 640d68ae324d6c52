//! `callid conform` with two router processes on one registry: the replicated reference target
//! (two replicas on one PostgreSQL database, redeliveries to the other replica) through the real
//! binary, the checks that need a second process or installation scoping against the broken
//! routers that break them, the `shared_registry` capability, and the profile's `setup`,
//! `registry`, `{check_slug}` and `{env:NAME}`.
//!
//! The replicated run needs PostgreSQL: without its binaries it prints a SKIP outside CI and
//! fails in CI (`CI=true`), like `replicas.rs`.

use crate::common::conform::{code, conform_in, flaws_that_did_not_fail, stderr, verdicts};
use crate::common::repo;
use crate::pg::PgCluster;
use std::time::Instant;

/// The checks this file is about.
const NEW_CHECKS: [&str; 3] = [
    "concurrency.two-processes-one-registry",
    "redelivery.other-process",
    "identity.envelope-installation-scoped",
];

/// Every check of the suite, run against two reference-router replicas on one PostgreSQL
/// database (each check in a database of its own, redeliveries to the other replica): every
/// required check passes.
#[test]
fn the_replicated_reference_target_passes_every_required_check() {
    let test = "the_replicated_reference_target_passes_every_required_check";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let path = format!(
        "{}:{}",
        pg.bindir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    let output = conform_in(
        &repo(),
        &[
            "--target",
            "scenarios/targets/reference-replicated.yaml",
            "--format",
            "json",
        ],
        &[("CALLID_CONFORM_POSTGRES", pg.server_url()), ("PATH", path)],
    );
    let took = started.elapsed();
    let verdicts = verdicts(&output);
    let ids: Vec<String> = callid::conform::load_scenarios(None)
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        verdicts.keys().cloned().collect::<Vec<_>>(),
        ids,
        "every check ran once"
    );
    let not_passed: Vec<_> = verdicts
        .iter()
        .filter(|(id, (v, r, level))| {
            level == "required"
                && v != "pass"
                && !crate::common::conform::skipped_for_its_backend(id, v, r, true)
        })
        .collect();
    let skipped = verdicts.values().filter(|(v, ..)| v == "skipped").count();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    eprintln!("replicated conform run: {} checks in {took:?}", ids.len());

    // Each check had a database of its own, created by the profile's `setup`; the registry of the
    // cross-process check is in its database, with both of its calls.
    let databases = pg.sql(
        "postgres",
        "SELECT count(*) FROM pg_database WHERE datname ~ '_[0-9a-f]{12}$'",
    );
    assert_eq!(databases, (ids.len() - skipped).to_string());
    let db = pg.sql(
        "postgres",
        "SELECT datname FROM pg_database WHERE datname LIKE 'redelivery_other_process_%'",
    );
    assert_eq!(pg.sql(&db, "SELECT count(*) FROM callid_operations"), "2");
}

/// Each new check fails on the broken router that breaks its rule, with the money as the reason;
/// the same router without the flaw passes them (stdio and the fixture's own profile).
#[test]
fn each_cross_process_and_installation_check_fails_on_its_broken_router() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "process-cache",
            "concurrency.two-processes-one-registry",
            "steps[1] (concurrent `burst`): 16 deliveries of one call answered ",
        ),
        (
            "process-cache",
            "redelivery.other-process",
            "steps[2] (redeliver `again`): the provider saw 2 dispatches, 2 charges in this scenario; expected 1 charge",
        ),
        (
            "ignore-installation",
            "identity.envelope-installation-scoped",
            "steps[1] (call `other`): the provider saw 1 dispatch, 1 charge in this scenario; expected 2 charges",
        ),
        (
            "ignore-lease",
            "concurrency.two-processes-one-registry",
            "steps[1] (concurrent `burst`): the provider saw 2 dispatches (2 at once), 1 charge in this scenario: 2 dispatches of one operation were in flight at once",
        ),
        // Its second process dispatches 1 s late, after a fixed hold would have ended: the hold
        // lasts until that dispatch arrives.
        (
            "slow-ignore-lease",
            "concurrency.two-processes-one-registry",
            "steps[1] (concurrent `burst`): the provider saw 2 dispatches (2 at once), 1 charge in this scenario: 2 dispatches of one operation were in flight at once",
        ),
    ];
    let problems = flaws_that_did_not_fail(dir.path(), cases);
    assert!(problems.is_empty(), "{problems:#?}");

    let profile = repo().join("tests/fixtures/broken_routers/profile.yaml");
    let mut args = vec![
        "--target",
        profile.to_str().unwrap(),
        "--format",
        "json",
        "--only",
    ];
    args.extend(NEW_CHECKS);
    let output = conform_in(dir.path(), &args, &[]);
    let verdicts = verdicts(&output);
    for id in NEW_CHECKS {
        assert_eq!(verdicts[id].0, "pass", "{id}: {}", verdicts[id].1);
    }
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

/// A router whose second process waits for the first one's dispatch instead of answering
/// `operation_in_progress` breaks nothing: no delivery ends the hold, which reaches its ceiling
/// and ends, and the check passes (exit 0), later than with a router that answers at once.
#[test]
fn a_second_process_that_waits_out_the_hold_passes() {
    let dir = tempfile::tempdir().unwrap();
    let id = NEW_CHECKS[0];
    let command = format!(
        "python3 '{}' --flaw wait-for-lease",
        crate::common::conform::router_py()
    );
    let output = conform_in(
        dir.path(),
        &["--stdio", &command, "--format", "json", "--only", id],
        &[],
    );
    let (verdict, reason, _) = &verdicts(&output)[id];
    assert_eq!(verdict, "pass", "{reason}");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

/// `shared_registry: false` skips the checks that need a second process; left out, they are not
/// run (exit 1); a check that needs no second process runs either way.
#[test]
fn the_shared_registry_capability_decides_skipped_or_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let reference = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace("{profile_dir}", &repo().display().to_string());
    let line = "capabilities: {restart: true, kill: true, approval: true, shared_registry: true}";
    assert!(reference.contains(line));
    for (file, capabilities) in [
        (
            "declared.yaml",
            "capabilities: {restart: true, kill: true, approval: true, shared_registry: false}",
        ),
        (
            "undeclared.yaml",
            "capabilities: {restart: true, kill: true, approval: true}",
        ),
    ] {
        std::fs::write(dir.path().join(file), reference.replace(line, capabilities)).unwrap();
    }
    let run = |profile: &str| {
        let mut args = vec!["--target", profile, "--format", "json", "--only"];
        args.extend(NEW_CHECKS);
        conform_in(dir.path(), &args, &[])
    };
    let declared = run("declared.yaml");
    assert_eq!(code(&declared), 0, "{}", stderr(&declared));
    let verdicts_declared = verdicts(&declared);
    let undeclared = run("undeclared.yaml");
    assert_eq!(code(&undeclared), 1, "{}", stderr(&undeclared));
    let verdicts_undeclared = verdicts(&undeclared);
    for id in &NEW_CHECKS[..2] {
        let (verdict, reason, _) = &verdicts_declared[*id];
        assert_eq!(verdict, "skipped", "{id}");
        assert_eq!(
            reason,
            "a second router process on the same registry: the profile declares `capabilities.shared_registry: false`"
        );
        let (verdict, reason, _) = &verdicts_undeclared[*id];
        assert_eq!(verdict, "not-run", "{id}");
        assert!(
            reason.contains("does not declare `capabilities.shared_registry`"),
            "{reason}"
        );
    }
    assert_eq!(verdicts_declared[NEW_CHECKS[2]].0, "pass");
    assert_eq!(verdicts_undeclared[NEW_CHECKS[2]].0, "pass");
}

/// A profile's `setup` runs before each check with the check's placeholders; one that fails is a
/// setup error naming the check and the command; `{env:NAME}` of an unset variable, and
/// `redeliver_on_second` without a shared registry, are refused before anything starts.
#[test]
fn setup_commands_and_env_placeholders_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let reference = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .unwrap()
        .replace("{profile_dir}", &repo().display().to_string());
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let with = |extra: &str| format!("{reference}\n{extra}\n");
    std::fs::write(
        dir.path().join("setup.yaml"),
        with(&format!(
            "setup:\n  - {{command: touch, args: [\"{}/{{check_slug}}-{{env:CALLID_TEST_MARK}}\"]}}\nregistry: \"{{state_dir}}/{{check_slug}}.sqlite3\"",
            marks.display()
        )),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("failing.yaml"),
        with("setup:\n  - {command: sh, args: [-c, \"echo no database server >&2; exit 3\"]}"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("redeliver.yaml"),
        with("redeliver_on_second: true").replace(", shared_registry: true}", "}"),
    )
    .unwrap();

    let ok = conform_in(
        dir.path(),
        &[
            "--target",
            "setup.yaml",
            "--format",
            "json",
            "--only",
            "redelivery.after-restart",
            "identity.missing-fails-closed",
        ],
        &[("CALLID_TEST_MARK", "m1".into())],
    );
    assert_eq!(code(&ok), 0, "{}", stderr(&ok));
    let mut made: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    made.sort();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(
        made[0].starts_with("identity_missing_fails_closed_") && made[0].ends_with("-m1"),
        "{made:?}"
    );
    assert!(
        made[1].starts_with("redelivery_after_restart_") && made[1].ends_with("-m1"),
        "{made:?}"
    );

    let unset = conform_in(
        dir.path(),
        &["--target", "setup.yaml"],
        &[("CALLID_TEST_MARK_OTHER", "x".into())],
    );
    assert_eq!(code(&unset), 2);
    assert_eq!(
        stderr(&unset).trim(),
        "error: setup.yaml: setup[0].args[0]: the environment variable `CALLID_TEST_MARK` (placeholder `{env:CALLID_TEST_MARK}`) is not set; set it before running conform"
    );

    let failing = conform_in(
        dir.path(),
        &["--target", "failing.yaml", "--only", "status.public-handle"],
        &[],
    );
    assert_eq!(code(&failing), 2);
    assert_eq!(
        stderr(&failing).trim(),
        "error: check `status.public-handle` cannot judge this target: the profile's setup[0] `sh` exited with exit status: 3: no database server"
    );

    let redeliver = conform_in(dir.path(), &["--target", "redeliver.yaml"], &[]);
    assert_eq!(code(&redeliver), 2);
    assert_eq!(
        stderr(&redeliver).trim(),
        "error: redeliver.yaml: redeliver_on_second: sending redeliveries to a second router process needs `capabilities.shared_registry: true`"
    );
}
