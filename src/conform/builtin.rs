//! The scenarios built into the binary, so `callid conform` runs from any directory.
//!
//! [`SCENARIOS`] lists every file of `scenarios/*.yaml` by name with its text (`include_str!`);
//! a unit test keeps the list equal to the directory, so a new scenario file cannot be forgotten.
//! `--scenarios DIR` adds files to these, or replaces the built-in scenario with the same id.

/// `(file name, text)` of every built-in scenario, in file-name order.
pub const SCENARIOS: &[(&str, &str)] = &[
    (
        "approval-deny.yaml",
        include_str!("../../scenarios/approval-deny.yaml"),
    ),
    (
        "approval-resume.yaml",
        include_str!("../../scenarios/approval-resume.yaml"),
    ),
    (
        "approval-skip.yaml",
        include_str!("../../scenarios/approval-skip.yaml"),
    ),
    (
        "arguments-nested.yaml",
        include_str!("../../scenarios/arguments-nested.yaml"),
    ),
    (
        "arguments-top-level.yaml",
        include_str!("../../scenarios/arguments-top-level.yaml"),
    ),
    (
        "at-most-once-crash-after-charge.yaml",
        include_str!("../../scenarios/at-most-once-crash-after-charge.yaml"),
    ),
    (
        "at-most-once-crash-before-charge.yaml",
        include_str!("../../scenarios/at-most-once-crash-before-charge.yaml"),
    ),
    (
        "at-most-once-provider-failure.yaml",
        include_str!("../../scenarios/at-most-once-provider-failure.yaml"),
    ),
    (
        "at-most-once-timeout.yaml",
        include_str!("../../scenarios/at-most-once-timeout.yaml"),
    ),
    (
        "bounds-bytes.yaml",
        include_str!("../../scenarios/bounds-bytes.yaml"),
    ),
    (
        "bounds-control.yaml",
        include_str!("../../scenarios/bounds-control.yaml"),
    ),
    (
        "bounds-empty.yaml",
        include_str!("../../scenarios/bounds-empty.yaml"),
    ),
    (
        "bounds-too-long.yaml",
        include_str!("../../scenarios/bounds-too-long.yaml"),
    ),
    (
        "bounds-type.yaml",
        include_str!("../../scenarios/bounds-type.yaml"),
    ),
    (
        "bounds-whitespace.yaml",
        include_str!("../../scenarios/bounds-whitespace.yaml"),
    ),
    (
        "call-id-reused-other-arguments.yaml",
        include_str!("../../scenarios/call-id-reused-other-arguments.yaml"),
    ),
    (
        "concurrency-two-processes.yaml",
        include_str!("../../scenarios/concurrency-two-processes.yaml"),
    ),
    (
        "concurrency.yaml",
        include_str!("../../scenarios/concurrency.yaml"),
    ),
    (
        "convention-error-codes.yaml",
        include_str!("../../scenarios/convention-error-codes.yaml"),
    ),
    (
        "convention-replay-marker.yaml",
        include_str!("../../scenarios/convention-replay-marker.yaml"),
    ),
    (
        "convention-status-result.yaml",
        include_str!("../../scenarios/convention-status-result.yaml"),
    ),
    (
        "crash-after-charge.yaml",
        include_str!("../../scenarios/crash-after-charge.yaml"),
    ),
    (
        "crash-before-charge.yaml",
        include_str!("../../scenarios/crash-before-charge.yaml"),
    ),
    (
        "identity-ambiguous.yaml",
        include_str!("../../scenarios/identity-ambiguous.yaml"),
    ),
    (
        "identity-claude-code.yaml",
        include_str!("../../scenarios/identity-claude-code.yaml"),
    ),
    (
        "identity-envelope-installations.yaml",
        include_str!("../../scenarios/identity-envelope-installations.yaml"),
    ),
    (
        "identity-envelope-malformed.yaml",
        include_str!("../../scenarios/identity-envelope-malformed.yaml"),
    ),
    (
        "identity-envelope.yaml",
        include_str!("../../scenarios/identity-envelope.yaml"),
    ),
    (
        "identity-jsonrpc-id.yaml",
        include_str!("../../scenarios/identity-jsonrpc-id.yaml"),
    ),
    (
        "identity-missing.yaml",
        include_str!("../../scenarios/identity-missing.yaml"),
    ),
    (
        "identity-session-id.yaml",
        include_str!("../../scenarios/identity-session-id.yaml"),
    ),
    (
        "identity-two-platforms.yaml",
        include_str!("../../scenarios/identity-two-platforms.yaml"),
    ),
    (
        "new-call-same-arguments.yaml",
        include_str!("../../scenarios/new-call-same-arguments.yaml"),
    ),
    (
        "privacy-provider-key.yaml",
        include_str!("../../scenarios/privacy-provider-key.yaml"),
    ),
    ("privacy.yaml", include_str!("../../scenarios/privacy.yaml")),
    (
        "redelivery-after-provider-failure.yaml",
        include_str!("../../scenarios/redelivery-after-provider-failure.yaml"),
    ),
    (
        "redelivery-after-reconnect.yaml",
        include_str!("../../scenarios/redelivery-after-reconnect.yaml"),
    ),
    (
        "redelivery-after-restart.yaml",
        include_str!("../../scenarios/redelivery-after-restart.yaml"),
    ),
    (
        "redelivery-other-process.yaml",
        include_str!("../../scenarios/redelivery-other-process.yaml"),
    ),
    (
        "redelivery-same-connection.yaml",
        include_str!("../../scenarios/redelivery-same-connection.yaml"),
    ),
    (
        "request-hash-canonical.yaml",
        include_str!("../../scenarios/request-hash-canonical.yaml"),
    ),
    ("schema.yaml", include_str!("../../scenarios/schema.yaml")),
    (
        "signature-expired.yaml",
        include_str!("../../scenarios/signature-expired.yaml"),
    ),
    (
        "signature-forged.yaml",
        include_str!("../../scenarios/signature-forged.yaml"),
    ),
    (
        "signature-key-not-allowed.yaml",
        include_str!("../../scenarios/signature-key-not-allowed.yaml"),
    ),
    (
        "signature-missing.yaml",
        include_str!("../../scenarios/signature-missing.yaml"),
    ),
    (
        "signature-not-yet-valid.yaml",
        include_str!("../../scenarios/signature-not-yet-valid.yaml"),
    ),
    (
        "signature-unknown-key.yaml",
        include_str!("../../scenarios/signature-unknown-key.yaml"),
    ),
    (
        "signature-valid-replays.yaml",
        include_str!("../../scenarios/signature-valid-replays.yaml"),
    ),
    ("status.yaml", include_str!("../../scenarios/status.yaml")),
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_holds_every_scenario_file_and_nothing_else() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let listed: Vec<String> = super::SCENARIOS
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(
            listed, on_disk,
            "src/conform/builtin.rs must list every file of scenarios/ (add the new file's line)"
        );
        for (name, text) in super::SCENARIOS {
            assert_eq!(
                *text,
                std::fs::read_to_string(dir.join(name)).unwrap(),
                "{name}"
            );
        }
    }
}
