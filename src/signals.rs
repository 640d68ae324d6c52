//! The signals that interrupt a long command (`callid conform`, `callid bench`), and the
//! processes such a command ends before it exits.
//!
//! # Guarantees
//! - [`Signals::install`] takes SIGINT, SIGTERM and SIGHUP over from their default action (which
//!   ends the process at once) for the rest of the process: each is delivered to
//!   [`Signals::recv`]. A command a signal interrupted exits 128 + the signal's number
//!   ([`Signal::exit_code`]), as a shell reports a process the signal killed.
//! - Process groups (`callid conform`'s routers): every router process the runner starts leads a
//!   new process group ([`own_group`]) and is registered here from its spawn ([`started`]) until
//!   it is reaped ([`reaped`]); a router process dropped before that (a check cancelled by a
//!   signal) sends SIGKILL to its group ([`kill_group`]). [`end_all`] kills every group still
//!   registered and returns once none of them has a living member (a zombie whose threads have
//!   all exited holds nothing, and does not count), or after [`END_TIMEOUT`].
//! - A router the runner starts also dies when conform is killed with SIGKILL, as far as Linux
//!   allows: its group leader asks for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`, set
//!   between fork and exec). Linux ties that to the *thread* that forked: routers are spawned by
//!   the tasks of the run's multi-thread runtime, whose worker threads live until the runtime
//!   shuts down, after the run. The signal reaches the leader only: a process it started (a
//!   wrapper's router) is ended by the group kill of a run that could still act, not by a
//!   SIGKILL of conform itself.
//! - A client's process group (`callid measure`): [`stop_group`] sends SIGTERM first and SIGKILL
//!   only to what is still living after a grace period, so an MCP server left running (the
//!   probe, writing its queued records) ends as it would under an operator.
//! - Descendants (`callid bench`, built with the `bench` feature): a command that adopts its
//!   orphans (`adopt_orphans`) becomes the parent of every process below it whose own parent
//!   dies (a daemon such as PostgreSQL's server, a router whose `callid conform` was killed), so
//!   `end_children` ends them all: it kills every living child until none is left, or
//!   [`END_TIMEOUT`] passed.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

/// How long [`end_all`] waits for the killed groups to be gone.
pub const END_TIMEOUT: Duration = Duration::from_secs(5);

/// Process groups started and not yet reaped, by leader pid.
static GROUPS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn groups() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    GROUPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes `command` start a router: the leader of a new process group, killed by the kernel when
/// the thread that spawns it dies (see the module's guarantees).
pub fn own_group(command: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    command.process_group(0);
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions (prctl,
    // getppid, _exit) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the request was in place: nobody would ever end this one.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Registers the group led by `pid`, just spawned with [`own_group`].
pub fn started(pid: Option<u32>) {
    if let Some(pid) = pid {
        groups().insert(pid);
    }
}

/// Forgets the group led by `pid`: its leader was reaped after its group was killed.
pub fn reaped(pid: u32) {
    groups().remove(&pid);
}

/// SIGKILL to the group `pid` leads, then to `pid` itself (a leader that left its group).
pub fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory effects; a group or process that is gone answers ESRCH.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Kills every registered group and waits (at most [`END_TIMEOUT`]) until none has a living
/// member; the registry is empty afterwards.
pub async fn end_all() {
    let ended: Vec<u32> = std::mem::take(&mut *groups()).into_iter().collect();
    let deadline = tokio::time::Instant::now() + END_TIMEOUT;
    loop {
        for pid in &ended {
            kill_group(*pid);
        }
        if living_where(|p| ended.contains(&p.pgrp)).is_empty()
            || tokio::time::Instant::now() >= deadline
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Stops the process group `pgid` as an operator would: SIGTERM to the group, at most `grace`
/// for its members to exit (a server finishes its work, as `callid probe` writes the records
/// still queued), then SIGKILL to whatever lives on, waiting at most [`END_TIMEOUT`] more for it
/// to be gone.
pub async fn stop_group(pgid: u32, grace: Duration) {
    let Ok(group) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill has no memory effects; a group that is gone answers ESRCH.
    unsafe {
        libc::kill(-group, libc::SIGTERM);
    }
    let gone = |within: Duration| async move {
        let deadline = tokio::time::Instant::now() + within;
        while !living_where(|p| p.pgrp == pgid).is_empty() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    };
    if !gone(grace).await {
        // SAFETY: as above.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        gone(END_TIMEOUT).await;
    }
}

/// The living processes whose `/proc/PID/stat` fields satisfy `wanted`.
fn living_where(wanted: impl Fn(&Stat) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat_fields(&stat))
                .is_some_and(|fields| wanted(&fields))
                && living(*pid)
        })
        .collect()
}

/// Whether a thread of process `pid` still runs. Its main thread alone says too little: killed
/// with its threads, a router's main thread can be a zombie while another thread is still
/// exiting and holds the process's files (its listening socket) open.
fn living(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| stat_fields(&stat))
            .is_some_and(|fields| !matches!(fields.state, 'Z' | 'X'))
    })
}

/// The fields of a `/proc/PID/stat` line this module reads.
#[derive(Debug, PartialEq)]
struct Stat {
    state: char,
    ppid: u32,
    pgrp: u32,
}

/// The state, the parent and the process group of a `/proc/PID/stat` line: `PID (COMM) STATE
/// PPID PGRP ...`, where COMM may hold spaces and parentheses (so the fields start after the last
/// `)`).
fn stat_fields(stat: &str) -> Option<Stat> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    Some(Stat {
        state: fields.next()?.chars().next()?,
        ppid: fields.next()?.parse().ok()?,
        pgrp: fields.next()?.parse().ok()?,
    })
}

/// A signal that interrupts a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    #[serde(rename = "SIGINT")]
    Interrupt,
    /// SIGTERM.
    #[serde(rename = "SIGTERM")]
    Terminate,
    /// SIGHUP (the terminal went away).
    #[serde(rename = "SIGHUP")]
    Hangup,
}

impl Signal {
    /// Its name, as in reports: `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
            Signal::Hangup => "SIGHUP",
        }
    }

    /// The exit code of a run it interrupted: 128 + its number, as a shell reports it.
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => crate::exit_codes::INTERRUPTED_SIGINT,
            Signal::Terminate => crate::exit_codes::INTERRUPTED_SIGTERM,
            Signal::Hangup => crate::exit_codes::INTERRUPTED_SIGHUP,
        }
    }
}

/// The three signals, taken over from their default action (which ends the process at once).
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside a tokio runtime).
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal (one that arrived since [`Signals::install`] and was not returned yet
    /// comes at once).
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::Interrupt,
            _ = self.terminate.recv() => Signal::Terminate,
            _ = self.hangup.recv() => Signal::Hangup,
        }
    }
}

#[cfg(feature = "bench")]
/// Makes this process the parent of every orphan below it (`PR_SET_CHILD_SUBREAPER`), so that
/// `end_children` reaches the processes its children started and left behind.
pub fn adopt_orphans() -> std::io::Result<()> {
    // SAFETY: prctl with these arguments only sets a flag of the calling process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(feature = "bench")]
/// Kills every living child of this process (an orphan adopted by `adopt_orphans` included)
/// and waits, at most [`END_TIMEOUT`], until none is left; a child's own children, adopted as it
/// dies, are killed in turn.
pub async fn end_children() {
    let me = std::process::id();
    let deadline = tokio::time::Instant::now() + END_TIMEOUT;
    loop {
        let children = living_where(|p| p.ppid == me);
        if children.is_empty() || tokio::time::Instant::now() >= deadline {
            return;
        }
        for pid in children {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill has no memory effects; a process that is gone answers ESRCH.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_parent_and_group_even_with_odd_command_names() {
        let stat = |state, ppid, pgrp| Some(Stat { state, ppid, pgrp });
        let cases = [
            ("42 (callid) S 1 42 42 0 -1", stat('S', 1, 42)),
            ("7 (a) b) (c) R 3 99 1", stat('R', 3, 99)),
            ("9 (zombie) Z 1 9 9", stat('Z', 1, 9)),
            ("garbage", None),
        ];
        for (line, want) in cases {
            assert_eq!(stat_fields(line), want, "{line}");
        }
    }

    /// A group led by `sh -c script`, spawned in its own group; its pid (the group's id).
    fn group(script: &str) -> (tokio::process::Child, u32) {
        let child = tokio::process::Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        (child, pid)
    }

    /// Waits until `path` holds text (the script's trap is set before it writes it).
    async fn ready(path: &std::path::Path) {
        while std::fs::read_to_string(path).map_or(true, |t| t.is_empty()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn stop_group_lets_a_member_finish_on_sigterm_and_kills_one_that_ignores_it() {
        let dir = tempfile::tempdir().unwrap();
        let (ready_a, done) = (dir.path().join("a"), dir.path().join("done"));
        // A leader that finishes its work on SIGTERM, with a child in its group.
        let (mut polite, pgid) = group(&format!(
            "trap 'echo finished > {}; exit 0' TERM; sleep 600 & echo up > {}; wait",
            done.display(),
            ready_a.display()
        ));
        ready(&ready_a).await;
        stop_group(pgid, Duration::from_secs(30)).await;
        assert!(living_where(|p| p.pgrp == pgid).is_empty());
        assert_eq!(std::fs::read_to_string(&done).unwrap(), "finished\n");
        assert!(polite.wait().await.unwrap().success());

        // A leader that ignores SIGTERM is killed once the grace is over.
        let ready_b = dir.path().join("b");
        let (mut deaf, pgid) = group(&format!(
            "trap '' TERM; echo up > {}; while :; do sleep 1; done",
            ready_b.display()
        ));
        ready(&ready_b).await;
        let started = tokio::time::Instant::now();
        stop_group(pgid, Duration::from_millis(300)).await;
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "the grace was given"
        );
        assert!(living_where(|p| p.pgrp == pgid).is_empty());
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(deaf.wait().await.unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn exit_codes_are_128_plus_the_signal_number() {
        for (signal, number) in [
            (Signal::Interrupt, libc::SIGINT),
            (Signal::Terminate, libc::SIGTERM),
            (Signal::Hangup, libc::SIGHUP),
        ] {
            assert_eq!(i32::from(signal.exit_code()), 128 + number, "{signal:?}");
        }
    }
}
