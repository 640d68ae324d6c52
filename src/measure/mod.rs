//! Measures real agent clients offline: the real client program, a scripted model endpoint on
//! loopback instead of the vendor's API, and `callid probe` as its MCP server.
//!
//! [`measure`] runs every [`Scenario`] in a fresh temporary home (two tool calls in
//! two turns, one id repeated in two turns, the server frozen or killed mid-call, two tool calls
//! in one answer, two calls sharing one id in one answer), classifies the main probe log with
//! [`crate::classify`], reads the ID stability findings from every run, and returns the matrix
//! row with the exact client version and the evidence logs. It says which run starts, and every
//! [`run::HEARTBEAT`] that a run is still going; [`answer`] words the row in one line.
//!
//! - [`endpoint`]: the scripted model, in four wire formats (Responses API, Messages API, Chat
//!   Completions, Gemini API), one tool call per answer or several in one.
//! - [`client`]: how to run each client non-interactively with a temporary home and config.
//! - [`run`]: one bounded scenario run, leaving the probe's shape log.
//! - [`sdk`]: MCP client libraries and tools without a model (Inspector CLI, TypeScript and
//!   Python SDKs, rmcp), measured with two plain calls.
//!
//! # Guarantees
//! - Nothing leaves the machine: the only model endpoint is on 127.0.0.1, and each client runs
//!   with a cleared environment and a temporary home.
//! - Bounded: at most `MAX_MODEL_REQUESTS` scripted answers (see [`endpoint`]) per run and
//!   [`run::SCENARIO_TIMEOUT`] per scenario, after which the client's process group is killed.

pub mod client;
pub mod endpoint;
pub mod run;
pub mod sdk;

use crate::clock::today;
use crate::matrix::analyze;
use crate::matrix::data::{ClientRow, How, Stability};
use crate::matrix::evidence::{self, EvidenceError};
use client::{Client, ClientError};
use run::{RunError, Scenario, ScenarioRun};
use std::path::{Path, PathBuf};

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The client could not be found or prepared.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A scenario could not run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A scenario ran but the client never called the probe.
    #[error(
        "{client} {version} made no `tools/call` to the probe in the run with {scenario} (exit \
         code {exit}, {timed_out}); its last output:\n{tail}"
    )]
    NoCall {
        /// The client.
        client: &'static str,
        /// Its version.
        version: String,
        /// The scenario.
        scenario: &'static str,
        /// Exit code or `killed`.
        exit: String,
        /// Whether the scenario timed out.
        timed_out: &'static str,
        /// The end of its output.
        tail: String,
    },
    /// A scenario whose findings need the whole scripted conversation ran out of time.
    #[error(
        "{client} {version} did not finish the run with {scenario} within {secs} s, so its \
         findings would be partial; run it again on a less loaded machine. Its last output:\n{tail}"
    )]
    TimedOut {
        /// The client.
        client: &'static str,
        /// Its version.
        version: String,
        /// The scenario.
        scenario: &'static str,
        /// The scenario time limit.
        secs: u64,
        /// The end of its output.
        tail: String,
    },
    /// The probe log could not be classified.
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// A client driver failed.
    #[error("failed to run {what}: {detail}")]
    Driver {
        /// Which driver.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The client's `--version` and the version it gave the probe differ.
    #[error(
        "`{bin}` says it is version {cli} but told the probe {mcp}; measure one binary at a time"
    )]
    VersionMismatch {
        /// The binary.
        bin: PathBuf,
        /// From `--version`.
        cli: String,
        /// From MCP `clientInfo`.
        mcp: String,
    },
}

/// A finished measurement: the row and its evidence.
#[derive(Debug)]
pub struct Measurement {
    /// The matrix row, ready for `clients.yaml`.
    pub row: ClientRow,
    /// Evidence files: name relative to the matrix directory, and the probe log's bytes.
    pub evidence: Vec<(String, Vec<u8>)>,
}

/// The one-line answer to "does this client send a per-call ID?" for a measured row, e.g.
/// "Claude Code 2.1.332 sends a per-call ID: `claudecode/toolUseId`".
pub fn answer(row: &ClientRow) -> String {
    let who = match &row.version {
        Some(v) => format!("{} {v}", row.client),
        None => row.client.clone(),
    };
    match (&row.per_call_id, &row.reason) {
        (Some(key), _) => format!("{who} sends a per-call ID: `{key}`"),
        (None, Some(reason)) => {
            format!("{who} sends no per-call ID that callid accepts (`{reason}`)")
        }
        (None, None) => format!("{who} sends no per-call ID that callid accepts"),
    }
}

/// The package of the client that `callid measure --client SLUG` measures.
pub fn package_of(slug: &str) -> Option<crate::matrix::outdated::Package> {
    client::Client::ALL
        .iter()
        .find(|c| c.slug() == slug)
        .map(|c| c.package())
        .or_else(|| {
            sdk::SdkClient::ALL
                .iter()
                .find(|c| c.slug() == slug)
                .map(|c| c.package())
        })
}

/// The row id of a measured client.
pub fn row_id(client: Client) -> String {
    client.row_id()
}

/// Measures `client` (binary `bin`) with `callid` as the probe, telling `progress` which run
/// starts and that a long one is still going.
pub async fn measure(
    client: Client,
    bin: &Path,
    callid: &Path,
    progress: run::Progress<'_>,
) -> Result<Measurement, MeasureError> {
    let version = client.version(bin)?;
    progress(format!(
        "measuring {} {version} (`{}`): {} runs of at most {} s each",
        client.display().0,
        bin.display(),
        Scenario::ALL.len(),
        run::SCENARIO_TIMEOUT.as_secs()
    ));
    let mut runs: Vec<ScenarioRun> = Vec::new();
    for (n, scenario) in Scenario::ALL.into_iter().enumerate() {
        tracing::info!(client = client.slug(), ?scenario, "running scenario");
        progress(format!(
            "run {} of {}: {}",
            n + 1,
            Scenario::ALL.len(),
            scenario.name()
        ));
        let run = run::run_scenario(client, bin, callid, scenario, progress).await?;
        // A run that recorded nothing at all (not even the handshake) leaves no log to read.
        let records = evidence::read_evidence(&row_id(client), &run.log).ok();
        let calls = records
            .as_deref()
            .map(analyze::tool_calls)
            .unwrap_or_default();
        // A client that was handed two calls in one answer and ran neither has a finding (it
        // cannot take them); any other run without a call measured nothing.
        let ran_neither = scenario.one_answer() && run.handed_out_tool_calls && !run.timed_out;
        if calls.is_empty() && !ran_neither {
            return Err(MeasureError::NoCall {
                client: client.slug(),
                version,
                scenario: scenario.name(),
                exit: run
                    .exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "killed".into()),
                timed_out: if run.timed_out {
                    "timed out"
                } else {
                    "in time"
                },
                tail: run.output_tail.clone(),
            });
        }
        // Every finding but (c) counts the calls of a whole conversation: one cut short by the
        // time limit would understate them.
        if run.timed_out && !matches!(scenario, Scenario::Timeout | Scenario::ServerDies) {
            return Err(MeasureError::TimedOut {
                client: client.slug(),
                version,
                scenario: scenario.name(),
                secs: run::SCENARIO_TIMEOUT.as_secs(),
                tail: run.output_tail.clone(),
            });
        }
        runs.push(run);
    }
    let base = format!("{}-{version}", client.slug());
    let mut files = Vec::new();
    let mut stability = Stability::default();
    let mut observed = None;
    let mut read = Vec::new();
    let mut waited_out_freeze = false;
    let mut still_waiting_on_dead_server = false;
    for run in &runs {
        if run.scenario == Scenario::ServerDies && run.timed_out {
            still_waiting_on_dead_server = true;
        }
        // A client that waited out the whole freeze never timed out: that run shows nothing
        // about timeouts, and is neither a finding nor evidence.
        if run.scenario == Scenario::Timeout && !run.gave_up_while_frozen {
            waited_out_freeze = true;
            continue;
        }
        let name = format!(
            "{}/{}",
            crate::matrix::data::EVIDENCE_DIR,
            run.scenario.log_name(&base)
        );
        let records = evidence::read_evidence(&row_id(client), &run.log)?;
        let calls = analyze::tool_calls(&records);
        match run.scenario {
            Scenario::TwoCalls => {
                stability.distinct_ids = analyze::distinct_ids(&calls);
                stability.id_origin =
                    analyze::id_origin(&calls, &run.scenario.model_ids(client.id_style()));
                observed = Some(evidence::single_client(&run.log, &records)?);
            }
            Scenario::DuplicateModelId => {
                stability.duplicate_model_id = analyze::duplicate_model_id(&calls);
            }
            Scenario::Timeout => stability.on_timeout = analyze::on_timeout(&calls),
            Scenario::ServerDies => stability.on_server_death = analyze::on_timeout(&calls),
            Scenario::OneAnswerTwoIds => {
                stability.one_answer_two_ids =
                    analyze::one_answer(&calls, &run.scenario.call_arguments());
            }
            Scenario::OneAnswerSameId => {
                stability.one_answer_same_id =
                    analyze::one_answer(&calls, &run.scenario.call_arguments());
            }
        }
        let bytes = std::fs::read(&run.log).map_err(|source| RunError::Io {
            what: format!("read the probe log `{}`", run.log.display()),
            source,
        })?;
        read.push((std::path::PathBuf::from(&name), records));
        files.push((name, bytes));
    }
    let observed = observed.expect("the two-calls scenario always runs");
    if observed.version != version && client.states_its_version() {
        return Err(MeasureError::VersionMismatch {
            bin: bin.to_owned(),
            cli: version,
            mcp: observed.version,
        });
    }
    let (name, surface) = client.display();
    let mut row = evidence::row_from_observed(
        &observed,
        row_id(client),
        surface.to_owned(),
        today(),
        How::Measured {
            command: format!("callid measure --client {}", client.slug()),
            evidence: files.iter().map(|(n, _)| n.clone()).collect(),
        },
    );
    row.client = name.to_owned();
    row.stability = stability;
    let read: Vec<(&Path, &[crate::probe::Record])> = read
        .iter()
        .map(|(p, r): &(std::path::PathBuf, Vec<crate::probe::Record>)| (p.as_path(), r.as_slice()))
        .collect();
    row.per_attempt_keys = evidence::per_attempt_keys(&read);
    if waited_out_freeze {
        let note = format!(
            "(c) timeout is not measured: the client was still waiting for the frozen server \
             after {} s, so it never timed out.",
            endpoint::FREEZE_LIMIT.as_secs()
        );
        row.notes = Some(match row.notes.take() {
            Some(more) => format!("{more} {note}"),
            None => note,
        });
    }
    if still_waiting_on_dead_server {
        let note = format!(
            "(c) server dies: the client never noticed; it was still waiting for the call's \
             answer when the run was stopped after {} s, and had not sent it again.",
            run::SCENARIO_TIMEOUT.as_secs()
        );
        row.notes = Some(match row.notes.take() {
            Some(more) => format!("{more} {note}"),
            None => note,
        });
    }
    if observed.version != version {
        // A fixed `clientInfo` placeholder: the row keeps the package version and says what
        // the evidence shows.
        row.version = Some(version.clone());
        row.client_info_version = Some(observed.version.clone());
    }
    Ok(Measurement {
        row,
        evidence: files,
    })
}
