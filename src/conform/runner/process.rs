//! The router process lifecycle of a scenario run: starting the router (a stdio child, or an HTTP
//! process the runner launches or only connects to), `initialize`, restarting it on the same
//! state, killing it, the `{port}` lease, and the stderr tail that explains a death.
//!
//! # Guarantees
//! - A process the runner starts is in its own process group, and a kill is SIGKILL to the whole
//!   group and then to the process itself, which is reaped: nothing the router spawned outlives
//!   the scenario (a wrapper that leaves the group is reported as a setup error by the caller).
//! - A connection is usable only after `initialize` with the scenario's protocol succeeded; an
//!   HTTP router the runner started gets [`HTTP_START_TIMEOUT`] to answer it, every request then
//!   [`REQUEST_TIMEOUT`].
//! - A graceful stop closes stdin and waits [`GRACEFUL_EXIT`] (3 s) for the router to exit, then
//!   sends SIGKILL to its process group (what it left behind, or the router itself when it did not
//!   exit); [`ScenarioRun::stop`] never leaves a process the runner started running. No other
//!   signal is sent: no SIGTERM, no SIGINT.
//! - Every router process is registered with [`signals`] from its spawn until it is reaped, and
//!   asks the kernel for SIGKILL when the runner dies; a router dropped unreaped (its check
//!   cancelled by a signal) sends SIGKILL to its group.
//! - Every transport error names what happened (exited, timed out) and, when the router is a
//!   stdio child, ends with the last lines of its stderr ([`tail`]).
//! - A `{port}` is held by a [`PortLease`] for the whole scenario, against every other conform
//!   process on the machine.

use super::{ScenarioRun, StepError, StepResult, fail};
use crate::conform::target::{Profile, Transport, Vars};
use crate::jsonrpc::{Child, Connection, RpcError};
use crate::signals;
use crate::text::clip;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// How long one request may take before the scenario errors.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an HTTP router started by the runner may take to answer.
const HTTP_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a router may take to exit after its stdin closes.
const GRACEFUL_EXIT: Duration = Duration::from_secs(3);

/// The router the runner drives: its connection and (when the runner owns it) its process.
pub(super) struct Router {
    pub(super) conn: Connection,
    pub(super) process: Option<Process>,
}

/// A router process the runner started.
pub(super) enum Process {
    Stdio(Child),
    Http(tokio::process::Child),
}

impl Process {
    pub(super) fn pid(&self) -> Option<u32> {
        match self {
            Process::Stdio(c) => c.pid(),
            Process::Http(c) => c.id(),
        }
    }

    /// SIGKILL to its whole process group, then to it (and reaped).
    pub(super) async fn kill9(&mut self) {
        let pid = self.pid();
        if let Some(pid) = pid {
            crate::conform::hooks::sigkill(pid);
        }
        let reaped = match self {
            Process::Stdio(c) => c.kill9().await,
            Process::Http(c) => c.kill().await,
        };
        if let (Some(pid), Ok(())) = (pid, reaped) {
            signals::reaped(pid);
        }
    }

    fn stderr_tail(&self) -> String {
        match self {
            Process::Stdio(c) => tail(&c.stderr_text()),
            Process::Http(_) => String::new(),
        }
    }
}

impl Drop for Process {
    /// A router not reaped yet (its check was cancelled by a signal) dies with its whole group
    /// before the check's state directory is removed.
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            signals::kill_group(pid);
        }
    }
}

/// The last lines of a program's stderr (up to 8 non-empty lines, 800 bytes), on one line each
/// joined by ` | `: a traceback or a panic names its problem a few lines above its last line.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let mut kept: Vec<&str> = Vec::new();
    let mut size = 0;
    for line in lines.iter().rev().take(8) {
        size += line.len() + 3;
        if size > 800 && !kept.is_empty() {
            break;
        }
        kept.push(line);
    }
    kept.reverse();
    clip(&kept.join(" | "), 800)
}

/// The last non-empty line of a program's stderr, clipped, for a one-line reason.
pub(super) fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| clip(l.trim(), 200))
        .unwrap_or_default()
}

impl ScenarioRun<'_> {
    /// A transport error as the scenario's error, with the router's stderr tail.
    pub(super) fn transport_error(&self, e: RpcError) -> StepError {
        let stderr = self
            .router
            .as_ref()
            .and_then(|r| r.process.as_ref())
            .map(Process::stderr_tail)
            .unwrap_or_default();
        let message = match &e {
            RpcError::Closed { .. } => "the router exited unexpectedly".to_string(),
            RpcError::Timeout {
                method, timeout, ..
            } => {
                format!("the router did not answer `{method}` within {timeout:?}")
            }
            other => clip(&other.to_string(), 200),
        };
        if stderr.is_empty() {
            StepError::Error(message)
        } else {
            StepError::Error(format!("{message} (its stderr ends with: {stderr})"))
        }
    }

    /// Starts (or restarts) the router on this scenario's state and initializes a connection.
    pub(super) async fn start(&mut self) -> StepResult {
        let profile = self.profile;
        let vars = &self.vars;
        let env: Vec<(String, String)> = profile
            .env
            .iter()
            .map(|(k, v)| (k.clone(), vars.apply(v)))
            .collect();
        let args: Vec<String> = vars.apply_args(&profile.args);
        let router = match (profile.transport, &profile.command) {
            (Transport::Stdio, Some(command)) => {
                let program = PathBuf::from(vars.apply(command));
                let mut command = tokio::process::Command::new(&program);
                signals::own_group(&mut command);
                command
                    .args(&args)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stderr(std::process::Stdio::piped());
                let (mut conn, child) =
                    Connection::spawn_command(command)
                        .await
                        .map_err(|e| match e {
                            RpcError::Spawn { program, source } => {
                                StepError::Error(format!("spawn: `{program}`: {source}"))
                            }
                            other => StepError::Error(other.to_string()),
                        })?;
                signals::started(child.pid());
                conn.set_timeout(REQUEST_TIMEOUT);
                Router {
                    conn,
                    process: Some(Process::Stdio(child)),
                }
            }
            (Transport::Http, command) => {
                let process = match command {
                    Some(command) => {
                        let program = vars.apply(command);
                        let mut command = tokio::process::Command::new(&program);
                        signals::own_group(&mut command);
                        let child = command
                            .args(&args)
                            .envs(env.iter().map(|(k, v)| (k, v)))
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .stderr(std::process::Stdio::null())
                            .kill_on_drop(true)
                            .spawn()
                            .map_err(|e| StepError::Error(format!("spawn: `{program}`: {e}")))?;
                        signals::started(child.id());
                        Some(Process::Http(child))
                    }
                    None => None,
                };
                let conn = self_connect_http(profile, vars).await?;
                Router { conn, process }
            }
            (Transport::Stdio, None) => unreachable!("validated on load"),
        };
        let id = self.id(None);
        let wait_for_http = profile.transport == Transport::Http && router.process.is_some();
        self.router = Some(router);
        let conn = self.conn()?.clone();
        if wait_for_http {
            let deadline = tokio::time::Instant::now() + HTTP_START_TIMEOUT;
            loop {
                match initialize(&conn, id.clone(), &self.scenario.protocol).await {
                    Ok(()) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            Ok(())
        } else {
            match initialize(&conn, id, &self.scenario.protocol).await {
                Err(StepError::Error(m)) => {
                    let mut tail = String::new();
                    if let Some(process) = self.router.as_ref().and_then(|r| r.process.as_ref()) {
                        if let Process::Stdio(child) = process {
                            child.stderr_closed(Duration::from_secs(2)).await;
                        }
                        tail = process.stderr_tail();
                    }
                    Err(StepError::Error(if tail.is_empty() {
                        m
                    } else {
                        format!("{m} (its stderr ends with: {tail})")
                    }))
                }
                other => other,
            }
        }
    }

    /// Stops the router: gracefully (stdin closed, then a wait) or with SIGKILL.
    pub(super) async fn stop_router(&mut self, graceful: bool) {
        let Some(mut router) = self.router.take() else {
            return;
        };
        if graceful {
            router.conn.close().await;
            if let Some(Process::Stdio(child)) = &mut router.process
                && let Some(pid) = child.pid()
                && tokio::time::timeout(GRACEFUL_EXIT, child.wait())
                    .await
                    .is_ok()
            {
                // What the router left behind in its group goes with it.
                signals::kill_group(pid);
                signals::reaped(pid);
                return;
            }
        }
        if let Some(p) = &mut router.process {
            p.kill9().await;
        }
    }

    /// Stops the router at the end of the scenario: killed if the runner started it, else only
    /// disconnected.
    pub(super) async fn stop(&mut self) {
        if self.profile.runner_starts() {
            self.stop_router(false).await;
        } else if let Some(router) = self.router.take() {
            router.conn.close().await;
        }
    }
}

/// Connects to the profile's `url` (placeholders applied).
pub(super) async fn self_connect_http(profile: &Profile, vars: &Vars) -> StepResult<Connection> {
    let url = vars.apply(profile.url.as_deref().expect("validated on load"));
    let mut conn = Connection::http(&url)
        .await
        .map_err(|e| StepError::Error(e.to_string()))?;
    conn.set_timeout(REQUEST_TIMEOUT);
    Ok(conn)
}

/// `initialize` with `protocol`; a refusal is a failure, a transport error an error.
pub(super) async fn initialize(conn: &Connection, id: Value, protocol: &str) -> StepResult {
    let response = conn
        .initialize(id, protocol, "callid-conform", env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| {
            StepError::Error(match e {
                RpcError::Closed { .. } => "the router exited before answering `initialize`".into(),
                other => format!("initialize failed: {}", clip(&other.to_string(), 300)),
            })
        })?;
    if let Some(error) = response.error {
        return fail(format!(
            "initialize with protocol {protocol} was refused: {error}"
        ));
    }
    Ok(())
}

/// A loopback port for `{port}`, held for one scenario against every other conform process.
///
/// A port found free and then released can be taken by another scenario (or another conform
/// run) before the router binds it, and the runner would then drive someone else's router. So the
/// port comes from outside the kernel's ephemeral range (where `bind(0)` never lands), and the
/// file `callid-conform-ports/PORT.claim` in the temporary directory, created exclusively, claims
/// it until the scenario ends. A claim older than [`STALE_CLAIM`] is left over from a killed run
/// and is taken over.
pub(super) struct PortLease {
    pub(super) port: u16,
    claim: Option<PathBuf>,
}

/// Age after which a port claim is considered abandoned (a scenario takes seconds).
const STALE_CLAIM: Duration = Duration::from_secs(600);

/// Ports handed out for `{port}`: below Linux's default ephemeral range (32768-60999).
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;

impl PortLease {
    /// Claims a free port (see the type's doc).
    pub(super) fn take() -> std::io::Result<PortLease> {
        let dir = std::env::temp_dir().join("callid-conform-ports");
        std::fs::create_dir_all(&dir)?;
        let span = PORT_RANGE.end - PORT_RANGE.start;
        let start = (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
        for i in 0..span {
            let port = PORT_RANGE.start + (start + i) % span;
            let path = dir.join(format!("{port}.claim"));
            let stale = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_CLAIM);
            if stale {
                let _ = std::fs::remove_file(&path);
            }
            let claimed = std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path)
                .is_ok();
            if !claimed {
                continue;
            }
            let lease = PortLease {
                port,
                claim: Some(path),
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(lease);
            }
        }
        Err(std::io::Error::other(format!(
            "no free loopback port in {}..{}",
            PORT_RANGE.start, PORT_RANGE.end
        )))
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        // Dropped after the scenario's router is stopped: the port is free again.
        if let Some(path) = self.claim.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_the_lines_that_name_the_problem() {
        let traceback = "Traceback (most recent call last):\n  File \"r.py\", line 3, in <module>\n    import nope\nModuleNotFoundError: No module named 'nope'\n\n";
        assert_eq!(
            tail(traceback),
            "Traceback (most recent call last): |   File \"r.py\", line 3, in <module> |     import nope | ModuleNotFoundError: No module named 'nope'"
        );
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let got = tail(&long);
        assert!(
            got.starts_with("line 92 | ") && got.ends_with("line 99"),
            "{got}"
        );
    }
}
