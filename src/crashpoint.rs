//! Test-only crash points: stop the process dead at a named boundary of a spend.
//!
//! Compiled in only with the `test-hooks` feature (which `bench` and the integration tests turn
//! on): in a binary built without it, as `cargo install` builds it, [`hit`] is an empty inline
//! function and the variables below are never read, so no environment can make a production
//! router kill or pause itself.
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

#[cfg(feature = "test-hooks")]
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

#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
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
#[cfg(feature = "test-hooks")]
pub const ENV: &str = "CALLID_CRASH_AT";

#[cfg(feature = "test-hooks")]
fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Environment variable that arms a pause point: `<boundary>:<gate file>`.
#[cfg(feature = "test-hooks")]
pub const PAUSE_ENV: &str = "CALLID_PAUSE_AT";

#[cfg(feature = "test-hooks")]
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
#[cfg(feature = "test-hooks")]
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
#[cfg(feature = "test-hooks")]
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

/// Without the `test-hooks` feature a crash point is nothing at all.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn hit(_boundary: Boundary) {}
