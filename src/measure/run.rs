//! Runs one scenario: a scripted endpoint, the real client program with a temporary home, and
//! `callid probe --log` as its MCP server, all bounded in time.
//!
//! The MCP server is started through a two-line shell wrapper that records its process id and
//! then `exec`s the probe, so the probe is the very process the client talks to and the endpoint
//! can freeze it for the timeout scenario.
//!
//! The probe speaks both lifecycles (no `--legacy-handshake`): a client that opens with
//! `server/discover` is measured under MCP 2026-07-28, any other under the version it agrees in
//! `initialize`; the row's `protocol` records which (see [`crate::matrix::evidence::protocol_of`]).

use super::client::{Client, ClientError};
use super::endpoint::{Endpoint, Hook, Script, ScriptedCall, Step};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest one scenario may run before the client is killed. Kilo Code takes up to two minutes
/// to reach its model on a loaded 2-core machine, and never notices a dead server: the limit
/// leaves it room to start, and ends its server-dies run.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

/// How often a run still going says so.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How long the processes a client left running have after SIGTERM before SIGKILL.
pub const GROUP_GRACE: Duration = Duration::from_secs(3);

/// Where progress lines go (`measure` prints them on stderr).
pub type Progress<'a> = &'a (dyn Fn(String) + Sync);

pub use crate::classify::runs::Scenario;

/// What `measure` plays for each run (the names and ids are [`Scenario`]'s own).
impl Scenario {
    /// The script the endpoint plays.
    pub fn script(self, client: Client) -> Script {
        let calls: Vec<ScriptedCall> = self
            .model_ids(client.id_style())
            .into_iter()
            .zip(self.call_arguments())
            .map(|(id, arguments)| ScriptedCall {
                id,
                arguments: client.tool_arguments(arguments),
            })
            .collect();
        let mut steps: Vec<Step> = if self.one_answer() {
            vec![Step::ToolCalls(calls)]
        } else {
            calls
                .into_iter()
                .map(|call| Step::ToolCall { id: call.id })
                .collect()
        };
        steps.push(Step::Text);
        Script {
            steps,
            tool: client.tool_name(),
            arguments: client.tool_arguments(serde_json::json!({})),
            hook: match self {
                Scenario::Timeout => Hook::FreezeServerDuringFirstCall,
                Scenario::ServerDies => Hook::KillServerDuringFirstCall,
                _ => Hook::None,
            },
        }
    }
}

/// What one scenario run left behind.
#[derive(Debug)]
pub struct ScenarioRun {
    /// Which scenario.
    pub scenario: Scenario,
    /// The probe's shape log (inside `home`).
    pub log: PathBuf,
    /// The client's exit code (`None` when killed).
    pub exit_code: Option<i32>,
    /// Whether the scenario hit [`SCENARIO_TIMEOUT`].
    pub timed_out: bool,
    /// Whether the client came back to the model while its MCP server was frozen (it gave up
    /// on the call rather than waiting for the server to be thawed).
    pub gave_up_while_frozen: bool,
    /// Whether the scripted model handed out at least one tool call.
    pub handed_out_tool_calls: bool,
    /// The end of the client's stderr and stdout, for error messages.
    pub output_tail: String,
    /// The temporary home, held so that it is removed only when the run is dropped.
    _home: tempfile::TempDir,
}

/// Why a scenario could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Preparing the client failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A process or socket could not be set up.
    #[error("failed to {what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// Runs `scenario` for `client` (binary `bin`) with `callid` as the probe binary, telling
/// `progress` every [`HEARTBEAT`] while the client runs.
pub async fn run_scenario(
    client: Client,
    bin: &Path,
    callid: &Path,
    scenario: Scenario,
    progress: Progress<'_>,
) -> Result<ScenarioRun, RunError> {
    let home = tempfile::Builder::new()
        .prefix("callid-measure-")
        .tempdir()
        .map_err(io("create a temporary home"))?;
    let log = home.path().join("probe.jsonl");
    let pids = home.path().join("probe.pids");
    let wrapper = home.path().join("probe.sh");
    // Clients start MCP servers with a pruned environment, so the paths are baked in.
    let script = if scenario == Scenario::ServerDies {
        // The logging probe proxies (`--wrap`) to a second, silent probe; only that inner one
        // is frozen and killed, so the call is recorded before its server dies.
        let inner = home.path().join("inner.sh");
        std::fs::write(
            &inner,
            format!(
                "#!/bin/sh\necho $$ >> {}\nexec {} probe\n",
                sh_quote(&pids),
                sh_quote(callid)
            ),
        )
        .map_err(io("write the inner probe wrapper"))?;
        format!(
            "#!/bin/sh\nexec {} probe --log {} --wrap -- /bin/sh {}\n",
            sh_quote(callid),
            sh_quote(&log),
            sh_quote(&inner)
        )
    } else {
        format!(
            "#!/bin/sh\necho $$ >> {}\nexec {} probe --log {}\n",
            sh_quote(&pids),
            sh_quote(callid),
            sh_quote(&log)
        )
    };
    std::fs::write(&wrapper, script).map_err(io("write the probe wrapper"))?;
    let server = vec!["/bin/sh".to_owned(), wrapper.display().to_string()];
    let endpoint = Endpoint::start(client.wire(), scenario.script(client), Some(pids.clone()))
        .await
        .map_err(io("start the scripted model endpoint on 127.0.0.1"))?;
    let invocation = client.prepare(bin, home.path(), &endpoint.base, &server)?;
    let out_path = home.path().join("client.out");
    let out = std::fs::File::create(&out_path).map_err(io("create the client's output file"))?;
    let err = out
        .try_clone()
        .map_err(io("share the client's output file"))?;
    let mut cmd = tokio::process::Command::new(&invocation.program);
    cmd.args(&invocation.args)
        .env_clear()
        .envs(invocation.envs.iter().map(|(k, v)| (k, v)))
        .current_dir(&invocation.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(io(format!("start `{}`", invocation.program.display())))?;
    let pgid = child.id();
    let (exit_code, timed_out) = {
        let started = tokio::time::Instant::now();
        let deadline = tokio::time::sleep(SCENARIO_TIMEOUT);
        let mut heartbeat = tokio::time::interval_at(started + HEARTBEAT, HEARTBEAT);
        let wait = child.wait();
        tokio::pin!(deadline, wait);
        loop {
            tokio::select! {
                status = &mut wait => {
                    break (status.map_err(io("wait for the client"))?.code(), false);
                }
                _ = &mut deadline => break (None, true),
                _ = heartbeat.tick() => progress(format!(
                    "  still running ({} s of at most {} s)",
                    started.elapsed().as_secs(),
                    SCENARIO_TIMEOUT.as_secs()
                )),
            }
        }
    };
    // A client that exits while its server is still frozen gave up on the call as surely as one
    // that went back to the model; the thawed server then gets a moment to log what it was sent.
    let frozen_at_exit = !timed_out && endpoint.is_frozen();
    let gave_up_while_frozen = endpoint.client_gave_up() || frozen_at_exit;
    let handed_out_tool_calls = endpoint.handed_out_tool_calls();
    endpoint.thaw();
    if frozen_at_exit {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    // Whatever the client left running (its MCP servers, helpers) goes with its process group:
    // SIGTERM first, so a probe still writing its queued records finishes them (SIGKILL alone
    // loses them, as it did to `callid demo`'s probe on a busy machine), then SIGKILL to
    // whatever still lives.
    if let Some(pgid) = pgid {
        crate::signals::stop_group(pgid, GROUP_GRACE).await;
    }
    let _ = child.wait().await;
    // A probe still draining its queue gets a moment to finish its last line.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(15).collect();
    let output_tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    Ok(ScenarioRun {
        scenario,
        log,
        exit_code,
        timed_out,
        gave_up_while_frozen,
        handed_out_tool_calls,
        output_tail,
        _home: home,
    })
}

/// `path` quoted for a POSIX shell.
fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}
