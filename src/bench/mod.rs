//! End-to-end benchmarks, each figure run beside its baseline: `callid bench`.
//!
//! [`run`] measures the rows of issue 6 ([`RowId::ALL`]) and returns a [`Report`] that
//! [`render_table`], [`render_markdown`] and [`render_json`] print.
//!
//! # Method
//! - Every ratio comes from runs made side by side in this one process: the figure and its
//!   baseline alternate batch after batch (A B A B ...), and the figure reported is the median of
//!   the per-round ratios, with the median of each side beside it. No row rests on a single
//!   absolute time, except the conformance suite's wall time and peak memory, which are absolute
//!   by definition.
//! - The end-to-end rows start real processes: this same binary as `callid probe`,
//!   `callid router`, `callid conform`, and the bare rmcp baseline (`callid bench
//!   --serve-baseline`, hidden), plus `benches/python_probe.py` on a Python with the `mcp` SDK.
//!   They are driven through [`crate::jsonrpc`]; every answer is checked, so a server answering
//!   errors fails its row rather than looking fast.
//! - The in-process rows ([`micro`]) time the rule core against plain serde_json work.
//! - A row that cannot run for a reason outside the thing measured (no Python with `mcp`, and
//!   the pinned venv cannot be made: see [`python`]) is `skipped` with the reason and the command; a row whose servers fail is `error`. Neither counts as met.
//!
//! # Layout
//! - [`stats`]: paired rounds, medians, units.
//! - [`fixtures`]: the Codex-sized `_meta` and `generate_image` arguments every row uses.
//! - [`micro`]: shape extraction and request hash, in process.
//! - [`drive`]: starting servers and sending checked calls, sequentially or concurrently.
//! - [`paired`]: the one driver of every paired end-to-end row (A B A B rounds) and its outcome.
//! - [`endtoend`]: the rows that start processes.
//! - [`baseline`]: the bare rmcp server.
//! - [`python`]: finding a Python with the `mcp` SDK, or making the pinned venv that has it.
//! - [`postgres`]: the PostgreSQL rows and their throwaway cluster.
//! - [`relay`]: the TCP relay that counts round trips to PostgreSQL and delays them.
//! - [`report`]: rows, verdicts, and the three renderings.

pub mod baseline;
pub mod drive;
pub mod endtoend;
pub mod fixtures;
pub mod micro;
pub mod paired;
pub mod postgres;
pub mod python;
pub mod relay;
pub mod report;
pub mod stats;

pub use report::{
    Machine, Measurement, Outcome, Report, Row, RowId, render_json, render_markdown, render_table,
};

use std::path::PathBuf;
use std::time::Duration;

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Rounds of each pair.
    pub rounds: usize,
    /// Calls per batch in the sequential (one in flight) rows.
    pub sequential_calls: usize,
    /// Calls per batch in the probe throughput row.
    pub throughput_calls: usize,
    /// Calls in flight (and HTTP clients) in the concurrent rows.
    pub in_flight: usize,
    /// New operations per batch in the durable router row.
    pub router_sequential_ops: usize,
    /// New operations per batch in the concurrent router row.
    pub concurrent_ops: usize,
    /// Runs of the conformance suite.
    pub conform_runs: usize,
    /// Calls sent to each server before measuring.
    pub warm_up: usize,
    /// Target time of one in-process batch.
    pub micro_batch: Duration,
    /// Rounds of the in-process pairs.
    pub micro_rounds: usize,
}

impl Plan {
    /// The full run (about two to four minutes on a 2-core machine).
    pub const FULL: Plan = Plan {
        rounds: 15,
        sequential_calls: 200,
        throughput_calls: 400,
        in_flight: 16,
        router_sequential_ops: 40,
        concurrent_ops: 128,
        conform_runs: 3,
        warm_up: 50,
        micro_batch: Duration::from_millis(20),
        micro_rounds: 41,
    };

    /// The smoke run (`--quick`, under a minute).
    pub const QUICK: Plan = Plan {
        rounds: 5,
        sequential_calls: 40,
        throughput_calls: 160,
        in_flight: 16,
        router_sequential_ops: 12,
        concurrent_ops: 48,
        conform_runs: 1,
        warm_up: 20,
        micro_batch: Duration::from_millis(5),
        micro_rounds: 11,
    };
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--quick`: the smoke plan.
    pub quick: bool,
    /// Rows to run (all when empty).
    pub only: Vec<RowId>,
    /// The Python to run the SDK probe with (`--python`).
    pub python: Option<PathBuf>,
}

/// Runs the rows asked for and returns the report. Never fails as a whole: a row that cannot be
/// measured says why in its outcome.
pub async fn run(options: &Options) -> Report {
    let plan = if options.quick {
        Plan::QUICK
    } else {
        Plan::FULL
    };
    let want: Vec<RowId> = if options.only.is_empty() {
        RowId::ALL.to_vec()
    } else {
        options.only.clone()
    };
    let mut machine = Machine::current();
    let command = |id: RowId| {
        let mut text = format!("callid bench --only {}", id.id());
        if options.quick {
            text.push_str(" --quick");
        }
        text
    };
    let mut outcomes: Vec<(RowId, Outcome)> = Vec::new();

    let micro_plan = micro::MicroPlan {
        rounds: plan.micro_rounds,
        batch: plan.micro_batch,
    };
    if want.contains(&RowId::ShapeExtraction) {
        let s = tokio::task::block_in_place(|| micro::shape_extraction(micro_plan));
        outcomes.push((
            RowId::ShapeExtraction,
            micro_outcome(
                s,
                "in process: `shape::meta_shape` on the parsed `_meta` (digests included) against \
                 `serde_json::from_str::<Value>` of its text",
            ),
        ));
    }
    if want.contains(&RowId::RequestHash) {
        let s = tokio::task::block_in_place(|| micro::request_hash(micro_plan));
        outcomes.push((
            RowId::RequestHash,
            micro_outcome(
                s,
                "in process: `canonical::request_hash` of `generate_image` arguments against \
                 `Sha256::digest(serde_json::to_vec(..))`",
            ),
        ));
    }

    let needs_processes = want
        .iter()
        .any(|id| !matches!(id, RowId::ShapeExtraction | RowId::RequestHash));
    if needs_processes {
        match prepare_context(options, plan, &want) {
            Ok((ctx, _dir)) => {
                outcomes.extend(endtoend::probe_rows(&ctx).await);
                outcomes.extend(endtoend::router_rows(&ctx).await);
                if want.contains(&RowId::ConformSuite) {
                    outcomes.push((RowId::ConformSuite, endtoend::conform_row(&ctx).await));
                }
                outcomes.extend(postgres::rows(&ctx).await);
            }
            Err(error) => {
                for id in want.iter().copied() {
                    if !matches!(id, RowId::ShapeExtraction | RowId::RequestHash) {
                        outcomes.push((
                            id,
                            Outcome::Failed {
                                error: error.clone(),
                            },
                        ));
                    }
                }
            }
        }
    }

    machine.load_at_end = report::load_average();
    let rows = RowId::ALL
        .into_iter()
        .filter_map(|id| {
            let outcome = outcomes.iter().find(|(o, _)| *o == id)?.1.clone();
            Some(Row::new(id, outcome, command(id)))
        })
        .collect();
    Report {
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        quick: options.quick,
        machine,
        rows,
    }
}

fn micro_outcome(summary: stats::PairSummary, note: &str) -> Outcome {
    Outcome::Measured(Measurement::paired(&summary, note))
}

fn prepare_context(
    options: &Options,
    plan: Plan,
    want: &[RowId],
) -> Result<(endtoend::Context, tempfile::TempDir), String> {
    let program = drive::own_program().map_err(|e| drive::chain(&e))?;
    let dir = tempfile::Builder::new()
        .prefix("callid-bench-")
        .tempdir()
        .map_err(|e| format!("failed to create a scratch directory: {e}"))?;
    Ok((
        endtoend::Context {
            program,
            dir: dir.path().to_path_buf(),
            plan,
            python: options.python.clone(),
            want: want.to_vec(),
        },
        dir,
    ))
}
