//! Test-only crash points: stop the process dead at a named boundary of a spend.
//!
//! Setting `CALLID_CRASH_AT=<boundary>` in a router's environment makes it kill itself with
//! SIGKILL the first time it reaches that boundary, exactly as `kill -9` would: no destructor,
//! no flush, no reply. Crash-safety tests restart the router on the same registry and redeliver,
//! to prove that no boundary can yield a second charge. Without the variable, [`hit`] is one
//! relaxed atomic load.

use std::sync::OnceLock;

/// The boundaries of one spend, in the order a new operation passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The registry row (keys, request hash) is committed; nothing dispatched yet.
    AfterRowCommit,
    /// The authorization layer has committed its decision.
    AfterAuthorization,
    /// The provider has charged and answered; the execution layer has not recorded it.
    AfterProviderCharge,
    /// The backend answered; the router has not recorded the result in its registry.
    BeforeResultRecorded,
    /// The result is recorded; the reply has not been sent.
    BeforeReply,
}

impl Boundary {
    /// Every boundary, in order.
    pub const ALL: [Boundary; 5] = [
        Boundary::AfterRowCommit,
        Boundary::AfterAuthorization,
        Boundary::AfterProviderCharge,
        Boundary::BeforeResultRecorded,
        Boundary::BeforeReply,
    ];

    /// The name used in `CALLID_CRASH_AT`.
    pub fn name(self) -> &'static str {
        match self {
            Boundary::AfterRowCommit => "after_row_commit",
            Boundary::AfterAuthorization => "after_authorization",
            Boundary::AfterProviderCharge => "after_provider_charge",
            Boundary::BeforeResultRecorded => "before_result_recorded",
            Boundary::BeforeReply => "before_reply",
        }
    }
}

/// Environment variable that arms a crash point.
pub const ENV: &str = "CALLID_CRASH_AT";

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Kills this process with SIGKILL if `CALLID_CRASH_AT` names `boundary`.
pub fn hit(boundary: Boundary) {
    if armed() == Some(boundary.name()) {
        crate::logging::line(format_args!(
            "callid: crash point `{}` reached, killing myself",
            boundary.name()
        ));
        // SIGKILL rather than abort(): no signal handler, no core dump, same as `kill -9`.
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
}
