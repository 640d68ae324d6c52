//! Test-only crash points: stop the process dead at a named boundary of a spend.
//!
//! Setting `CALLID_CRASH_AT=<boundary>` in a router's environment makes it kill itself with
//! SIGKILL the first time it reaches that boundary, exactly as `kill -9` would: no destructor,
//! no flush, no reply. Crash-safety tests restart the router on the same registry and redeliver,
//! to prove that no boundary can yield a second charge.
//!
//! `CALLID_PAUSE_AT=<boundary>:<gate file>` instead pauses the process the first time it reaches
//! that boundary: it creates `<gate file>.reached`, then waits until `<gate file>` exists. A test
//! uses the pause to change the world at an exact point of a spend (for example, hold the
//! registry's write lock after the provider charged) and then lets the spend go on. Without the
//! variables, [`hit`] is two relaxed atomic loads.

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

/// Environment variable that arms a pause point: `<boundary>:<gate file>`.
pub const PAUSE_ENV: &str = "CALLID_PAUSE_AT";

fn pause_armed() -> Option<&'static (String, std::path::PathBuf)> {
    static ARMED: OnceLock<Option<(String, std::path::PathBuf)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var(PAUSE_ENV).ok()?;
            let (name, gate) = value.split_once(':')?;
            Some((name.to_owned(), gate.into()))
        })
        .as_ref()
}

/// Pauses at `boundary` if `CALLID_PAUSE_AT` names it (the first time only).
fn pause(boundary: Boundary) {
    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some((name, gate)) = pause_armed() else {
        return;
    };
    if name != boundary.name() || PAUSED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut reached = gate.clone().into_os_string();
    reached.push(".reached");
    eprintln!(
        "callid: pause point `{name}` reached, waiting for `{}`",
        gate.display()
    );
    if let Err(e) = std::fs::write(&reached, b"") {
        eprintln!("callid: cannot signal the pause point: {e}");
        return;
    }
    while !gate.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Kills this process with SIGKILL if `CALLID_CRASH_AT` names `boundary`; pauses it there if
/// `CALLID_PAUSE_AT` does.
pub fn hit(boundary: Boundary) {
    pause(boundary);
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
