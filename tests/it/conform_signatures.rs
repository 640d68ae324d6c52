//! `callid conform`'s signed-envelope checks (`signature.*`): callid's stdio targets pass them
//! with the key the runner makes for each check; a router that is handed the key and ignores it
//! fails every refusal; a profile that does not declare `signed_envelopes` skips them, saying
//! which key turns them on.

use crate::common::conform::{code, conform, conform_in, stderr, verdicts};
use crate::common::repo;

/// The checks this file is about.
const SIGNATURE_CHECKS: [&str; 7] = [
    "signature.expired-refused",
    "signature.forged-refused",
    "signature.key-not-allowed-for-platform",
    "signature.missing-refused",
    "signature.not-yet-valid-refused",
    "signature.unknown-key-refused",
    "signature.valid-replays",
];

/// `--only` for every signature check, then `extra`.
fn only<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args: Vec<&str> = extra.to_vec();
    for id in SIGNATURE_CHECKS {
        args.extend(["--only", id]);
    }
    args.extend(["--format", "json"]);
    args
}

/// The reference profile up to its `signed_envelopes` key.
fn reference_without_signing() -> String {
    let reference = std::fs::read_to_string(repo().join("scenarios/targets/reference.yaml"))
        .expect("the reference profile");
    let (head, _) = reference
        .split_once("\n# The router verifies signed")
        .expect("the reference profile declares signed_envelopes last");
    format!("{head}\n")
}

/// Every signature check is a built-in scenario.
#[test]
fn the_signature_checks_are_built_in() {
    let ids: Vec<String> = callid::conform::load_scenarios(None)
        .unwrap()
        .into_iter()
        .filter(|s| s.signed_envelopes)
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, SIGNATURE_CHECKS);
}

/// The reference router and both gateway targets verify the check's key: every refusal is
/// refused with its code and charges nothing, and a valid signature replays.
#[test]
fn callid_targets_pass_every_signature_check() {
    for profile in [
        "scenarios/targets/reference.yaml",
        "scenarios/targets/gateway.yaml",
        "scenarios/targets/gateway-at-most-once.yaml",
    ] {
        let output = conform(&only(&["--target", profile]));
        let verdicts = verdicts(&output);
        assert_eq!(verdicts.len(), SIGNATURE_CHECKS.len(), "{profile}");
        for (id, (verdict, reason, level)) in &verdicts {
            assert_eq!(
                (verdict.as_str(), level.as_str()),
                ("pass", "required"),
                "{profile}: {id}: {reason}"
            );
        }
        assert_eq!(code(&output), 0, "{profile}: {}", stderr(&output));
    }
}

/// A router handed the key that verifies nothing (the key only reaches its environment): every
/// refusal check fails on the charge it let through, the valid signature still replays, and the
/// run exits 1.
#[test]
fn a_router_that_ignores_the_key_fails_every_refusal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ignores.yaml"),
        format!(
            "{}\nsigned_envelopes:\n  env: {{IGNORED_TRUST_KEYS: \"{{trust_keys}}\"}}\n",
            reference_without_signing()
        ),
    )
    .unwrap();
    let output = conform_in(dir.path(), &only(&["--target", "ignores.yaml"]), &[]);
    let verdicts = verdicts(&output);
    for (id, (verdict, reason, _)) in &verdicts {
        if id == "signature.valid-replays" {
            assert_eq!(verdict, "pass", "{id}: {reason}");
        } else {
            assert_eq!(verdict, "fail", "{id}: {reason}");
            assert!(
                reason.starts_with("steps[0] (call): the provider saw 1 dispatch, 1 charge"),
                "{id}: {reason}"
            );
        }
    }
    assert_eq!(code(&output), 1, "{}", stderr(&output));
}

/// Without `signed_envelopes` the checks are skipped, never passed, and the reason names the key;
/// the run still exits 0 (a router that does not verify signatures is not judged on them).
#[test]
fn without_signed_envelopes_the_checks_are_skipped_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("unsigned.yaml"),
        reference_without_signing(),
    )
    .unwrap();
    let output = conform_in(dir.path(), &only(&["--target", "unsigned.yaml"]), &[]);
    let verdicts = verdicts(&output);
    assert_eq!(verdicts.len(), SIGNATURE_CHECKS.len());
    for (id, (verdict, reason, _)) in &verdicts {
        assert_eq!(verdict, "skipped", "{id}: {reason}");
        assert!(
            reason.contains("the profile does not declare `signed_envelopes`"),
            "{id}: {reason}"
        );
    }
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}
