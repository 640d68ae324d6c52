//! Process control of the MCP server under measurement, for the script's [`Hook`]s: stopping
//! the processes its pid file lists (SIGSTOP) while a tool call is in flight, resuming them
//! (SIGCONT), and killing them (SIGKILL) mid-call.
//!
//! [`Hook`]: super::script::Hook

use super::script::FREEZE_LIMIT;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The MCP server's processes as the endpoint holds them. Cheap to clone; clones share the state.
#[derive(Clone)]
pub(super) struct ServerControl {
    /// Lists the MCP server's process ids, one per line; without it nothing is ever stopped.
    pid_file: Option<PathBuf>,
    state: Arc<Mutex<Frozen>>,
}

#[derive(Default)]
struct Frozen {
    /// The stopped processes, while they are stopped.
    pids: Option<Vec<u32>>,
    /// Whether the server was ever stopped (a hook fires once).
    once: bool,
}

impl ServerControl {
    /// Control of the processes `pid_file` lists.
    pub(super) fn new(pid_file: Option<PathBuf>) -> ServerControl {
        ServerControl {
            pid_file,
            state: Arc::new(Mutex::new(Frozen::default())),
        }
    }

    /// Stops the listed processes, and resumes them after [`FREEZE_LIMIT`] if nothing did
    /// sooner.
    pub(super) fn freeze(&self) {
        let Some(pid_file) = &self.pid_file else {
            return;
        };
        let pids: Vec<u32> = std::fs::read_to_string(pid_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        signal(&pids, "STOP");
        tracing::info!(?pids, "froze the MCP server");
        let mut state = self.state.lock().expect("server control state");
        state.pids = Some(pids);
        state.once = true;
        drop(state);
        let again = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(FREEZE_LIMIT);
            again.thaw();
        });
    }

    /// Resumes the stopped processes, if any.
    pub(super) fn thaw(&self) {
        let pids = self.state.lock().expect("server control state").pids.take();
        if let Some(pids) = pids {
            signal(&pids, "CONT");
            tracing::info!(?pids, "thawed the MCP server");
        }
    }

    /// Kills the stopped processes `delay` from now, if they are still stopped then.
    pub(super) fn kill_after(&self, delay: Duration) {
        let again = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let pids = again
                .state
                .lock()
                .expect("server control state")
                .pids
                .take();
            if let Some(pids) = pids {
                signal(&pids, "KILL");
                tracing::info!(?pids, "killed the MCP server mid-call");
            }
        });
    }

    /// Whether the server is stopped right now.
    pub(super) fn is_frozen(&self) -> bool {
        self.state
            .lock()
            .expect("server control state")
            .pids
            .is_some()
    }

    /// Whether the server was ever stopped.
    pub(super) fn froze_once(&self) -> bool {
        self.state.lock().expect("server control state").once
    }
}

/// Sends `sig` to each of `pids`, ignoring a process that is gone.
fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args(["-s", sig, "--", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;
    use std::time::Instant;

    /// The state letter of process `pid` (`T`: stopped), read from `/proc`.
    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (_, rest) = stat.rsplit_once(") ").unwrap();
        rest.chars().next().unwrap()
    }

    /// Waits until `pid` is stopped (`true`) or running (`false`); a signal is delivered
    /// asynchronously after `kill` returns.
    fn wait_until_stopped(pid: u32, stopped: bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while (state(pid) == 'T') != stopped {
            assert!(
                Instant::now() < deadline,
                "process {pid} state {}",
                state(pid)
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn stops_resumes_and_kills_the_listed_processes() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("server.pids");
        std::fs::write(&pid_file, format!("{pid}\n")).unwrap();
        let control = ServerControl::new(Some(pid_file));
        assert!(!control.froze_once() && !control.is_frozen());

        control.freeze();
        assert!(control.froze_once() && control.is_frozen());
        wait_until_stopped(pid, true);
        control.thaw();
        assert!(!control.is_frozen() && control.froze_once());
        wait_until_stopped(pid, false);

        control.freeze();
        wait_until_stopped(pid, true);
        control.kill_after(Duration::ZERO);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{status:?}");
        assert!(
            !control.is_frozen(),
            "the killed processes are no longer held"
        );
    }

    #[test]
    fn without_a_pid_file_nothing_is_stopped() {
        let control = ServerControl::new(None);
        control.freeze();
        assert!(!control.froze_once() && !control.is_frozen());
    }
}
