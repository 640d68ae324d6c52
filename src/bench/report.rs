//! The result of one `callid bench` run, [`Report`], and its three renderings (terminal table,
//! Markdown, JSON), all from the same rows.

use super::stats::{PairSummary, Quantity, format_seconds};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write;

/// The figures `callid bench` measures, in the order of issue 6's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowId {
    /// Probe `tools/call` round trip over stdio against a bare rmcp echo server.
    ProbeRoundTrip,
    /// Probe throughput against a probe written with the Python `mcp` SDK.
    ProbeThroughput,
    /// Shape extraction of a Codex-sized `_meta` against parsing it.
    ShapeExtraction,
    /// Request hash against `serde_json::to_vec` + SHA-256.
    RequestHash,
    /// Router new durable operations against raw SQLite insert + commit.
    RouterNewOperation,
    /// Router new operations from 16 concurrent clients against 1 client.
    RouterConcurrent,
    /// Router replayed result against a bare echo round trip.
    RouterReplay,
    /// The whole conformance suite against the reference router (wall time).
    ConformSuite,
    /// Probe peak resident memory under load.
    ProbeRss,
    /// Router peak resident memory under load.
    RouterRss,
    /// Router new durable operations on a PostgreSQL registry against a raw INSERT+COMMIT.
    PostgresNewOperation,
    /// 16 clients across two replicas on one PostgreSQL database against 1 client on 1.
    PostgresReplicas,
    /// Router new operations with PostgreSQL 0.5 ms away each way against the same at no delay.
    PostgresNetwork,
}

impl RowId {
    /// The rows that time durable commits, so their figures depend on the file system of the
    /// run's scratch directory ([`Scratch`]).
    pub const DURABLE: [RowId; 5] = [
        RowId::RouterNewOperation,
        RowId::RouterConcurrent,
        RowId::PostgresNewOperation,
        RowId::PostgresReplicas,
        RowId::PostgresNetwork,
    ];

    /// Every row, in report order.
    pub const ALL: [RowId; 13] = [
        RowId::ProbeRoundTrip,
        RowId::ProbeThroughput,
        RowId::ShapeExtraction,
        RowId::RequestHash,
        RowId::RouterNewOperation,
        RowId::RouterConcurrent,
        RowId::RouterReplay,
        RowId::ConformSuite,
        RowId::ProbeRss,
        RowId::RouterRss,
        RowId::PostgresNewOperation,
        RowId::PostgresReplicas,
        RowId::PostgresNetwork,
    ];

    /// The stable id (`--only` takes it).
    pub fn id(self) -> &'static str {
        match self {
            RowId::ProbeRoundTrip => "probe_round_trip",
            RowId::ProbeThroughput => "probe_throughput",
            RowId::ShapeExtraction => "shape_extraction",
            RowId::RequestHash => "request_hash",
            RowId::RouterNewOperation => "router_new_operation",
            RowId::RouterConcurrent => "router_concurrent",
            RowId::RouterReplay => "router_replay",
            RowId::ConformSuite => "conform_suite",
            RowId::ProbeRss => "probe_rss",
            RowId::RouterRss => "router_rss",
            RowId::PostgresNewOperation => "postgres_new_operation",
            RowId::PostgresReplicas => "postgres_replicas",
            RowId::PostgresNetwork => "postgres_network",
        }
    }

    /// The row with this id.
    pub fn from_id(id: &str) -> Option<RowId> {
        RowId::ALL.into_iter().find(|row| row.id() == id)
    }

    /// What is measured.
    pub fn figure(self) -> &'static str {
        match self {
            RowId::ProbeRoundTrip => "probe tools/call round trip over stdio",
            RowId::ProbeThroughput => "probe throughput (16 calls in flight)",
            RowId::ShapeExtraction => "shape extraction of a Codex-sized _meta",
            RowId::RequestHash => "request hash (canonical JSON + SHA-256)",
            RowId::RouterNewOperation => "router: new operation, durable",
            RowId::RouterConcurrent => "router: new operations from 16 concurrent clients",
            RowId::RouterReplay => "router: replayed result",
            RowId::ConformSuite => "whole conformance suite against the reference router",
            RowId::ProbeRss => "probe resident memory under load",
            RowId::RouterRss => "router resident memory under load",
            RowId::PostgresNewOperation => "router: new operation, durable, PostgreSQL registry",
            RowId::PostgresReplicas => "2 router replicas on one PostgreSQL: 16 clients",
            RowId::PostgresNetwork => {
                "router: new operation, PostgreSQL 0.5 ms away each way (latency added)"
            }
        }
    }

    /// What it runs beside.
    pub fn baseline(self) -> &'static str {
        match self {
            RowId::ProbeRoundTrip => "bare rmcp echo server, same tool",
            RowId::ProbeThroughput => "probe written with the Python mcp SDK",
            RowId::ShapeExtraction => "serde_json parsing the same _meta",
            RowId::RequestHash => "serde_json::to_vec + SHA-256 of the same arguments",
            RowId::RouterNewOperation => "raw SQLite insert + commit, same pragmas",
            RowId::RouterConcurrent => "the same router with 1 client",
            RowId::RouterReplay => "bare rmcp echo round trip",
            RowId::ConformSuite => "(absolute, this machine)",
            RowId::ProbeRss | RowId::RouterRss => "(absolute)",
            RowId::PostgresNewOperation => "raw PostgreSQL INSERT + COMMIT, same server",
            RowId::PostgresReplicas => "1 client on 1 replica",
            RowId::PostgresNetwork => "the same router, PostgreSQL with no delay",
        }
    }

    /// The target of issue 6.
    pub fn target(self) -> Target {
        match self {
            RowId::ProbeRoundTrip => Target::RatioAtMost(1.1),
            RowId::ProbeThroughput => Target::RatioAtLeast(10.0),
            RowId::ShapeExtraction => Target::RatioAtMost(2.0),
            RowId::RequestHash => Target::RatioAtMost(3.0),
            RowId::RouterNewOperation => Target::RatioAtLeast(0.3),
            RowId::RouterConcurrent => Target::RatioAtLeast(3.0),
            RowId::RouterReplay => Target::RatioAtMost(1.3),
            RowId::ConformSuite => Target::SecondsAtMost(20.0),
            RowId::ProbeRss => Target::MegabytesAtMost(20.0),
            RowId::RouterRss => Target::MegabytesAtMost(40.0),
            RowId::PostgresNewOperation => Target::RatioAtLeast(0.3),
            RowId::PostgresReplicas => Target::Reported,
            RowId::PostgresNetwork => Target::RoundTripsAtMost(6.0),
        }
    }
}

/// A row's target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", content = "limit", rename_all = "snake_case")]
pub enum Target {
    /// figure / baseline must be at most this.
    RatioAtMost(f64),
    /// figure / baseline must be at least this.
    RatioAtLeast(f64),
    /// Wall time in seconds, at most.
    SecondsAtMost(f64),
    /// Resident memory in MB (10^6 bytes), at most.
    MegabytesAtMost(f64),
    /// Latency added per operation, in round trips of the delayed link, at most.
    RoundTripsAtMost(f64),
    /// No target: the ratio is reported with what explains it in the note, never judged. The
    /// 2-replica row is bound by the cores the replicas, the database and every client share on
    /// one machine, so it reports CPU time per operation for 1 and 16 clients instead of a
    /// speed-up target (issue 27).
    Reported,
}

impl Target {
    /// Whether `value` meets the target; `None` for [`Target::Reported`], which has none.
    pub fn is_met(self, value: f64) -> Option<bool> {
        match self {
            Target::RatioAtMost(limit)
            | Target::SecondsAtMost(limit)
            | Target::MegabytesAtMost(limit)
            | Target::RoundTripsAtMost(limit) => Some(value <= limit),
            Target::RatioAtLeast(limit) => Some(value >= limit),
            Target::Reported => None,
        }
    }

    /// `≤ 1.1x`, `≥ 10x`, `≤ 20 s`, `≤ 40 MB`, `none (see the note)`.
    pub fn display(self) -> String {
        match self {
            Target::RatioAtMost(l) => format!("≤ {l}x"),
            Target::RatioAtLeast(l) => format!("≥ {l}x"),
            Target::SecondsAtMost(l) => format!("≤ {l} s"),
            Target::MegabytesAtMost(l) => format!("≤ {l} MB"),
            Target::RoundTripsAtMost(l) => format!("≤ {l} round trips"),
            Target::Reported => "none (see the note)".into(),
        }
    }

    /// How a measured value of this target reads: `1.04x`, `7.9 s`, `12.3 MB`, `4.2 round trips`.
    pub fn display_value(self, value: f64) -> String {
        match self {
            Target::RatioAtMost(_) | Target::RatioAtLeast(_) | Target::Reported => {
                format!("{value:.2}x")
            }
            Target::SecondsAtMost(_) => format_seconds(value),
            Target::MegabytesAtMost(_) => format!("{value:.1} MB"),
            Target::RoundTripsAtMost(_) => format!("{value:.1} round trips"),
        }
    }
}

/// What one row measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    /// The ratio figure / baseline, the absolute value (seconds, MB), or the latency added in
    /// round trips.
    pub value: f64,
    /// Median of the figure's rounds (ratio rows).
    pub figure_median: Option<Quantity>,
    /// Median of the baseline's rounds (ratio rows).
    pub baseline_median: Option<Quantity>,
    /// Rounds per side (runs, for absolute rows).
    pub rounds: usize,
    /// What a reader needs to interpret the figure (e.g. how a miss is explained).
    pub note: Option<String>,
}

impl Measurement {
    /// A paired measurement: the median of the per-round ratios, both sides' medians, and `note`.
    pub fn paired(summary: &PairSummary, note: &str) -> Measurement {
        Measurement {
            value: summary.ratio,
            figure_median: Some(summary.figure),
            baseline_median: Some(summary.baseline),
            rounds: summary.rounds,
            note: Some(note.to_string()),
        }
    }
}

/// How a row ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Measured.
    Measured(Measurement),
    /// Not measured, for a reason that is not a fault of the thing measured (e.g. no Python
    /// with `mcp`): never counted as a pass.
    Skipped {
        /// Why, and how to make it run.
        reason: String,
    },
    /// The measurement failed: the thing measured or its baseline did not work.
    Failed {
        /// The error, with its cause chain.
        error: String,
    },
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Which figure.
    pub id: RowId,
    /// What is measured.
    pub figure: &'static str,
    /// What it runs beside.
    pub baseline: &'static str,
    /// The target.
    pub target: Target,
    /// The verdict word: `met`, `missed`, `reported` (measured, no target), `skipped` or
    /// `error`.
    pub verdict: &'static str,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The command that reproduces this row alone.
    pub command: String,
}

impl Row {
    /// A row for `id` with `outcome`, its verdict derived from the target.
    pub fn new(id: RowId, outcome: Outcome, command: String) -> Row {
        let target = id.target();
        let verdict = match &outcome {
            Outcome::Measured(m) => match target.is_met(m.value) {
                Some(true) => "met",
                Some(false) => "missed",
                None => "reported",
            },
            Outcome::Skipped { .. } => "skipped",
            Outcome::Failed { .. } => "error",
        };
        Row {
            id,
            figure: id.figure(),
            baseline: id.baseline(),
            target,
            verdict,
            outcome,
            command,
        }
    }
}

/// The machine a run was made on, so a reader can judge the figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// CPU model (from `/proc/cpuinfo`).
    pub cpu: String,
    /// Logical cores available.
    pub cores: usize,
    /// Kernel (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// One-minute load average when the run started.
    pub load_at_start: Option<f64>,
    /// One-minute load average when the run ended.
    pub load_at_end: Option<f64>,
    /// Where the run's registries, ledgers, logs and PostgreSQL cluster live.
    pub scratch: Scratch,
}

/// The directory the run's files go under (`$TMPDIR`, else `/tmp`: each run makes a directory of
/// its own there and removes it) and the file system it is on. The durable rows time commits,
/// and a commit costs what that file system makes it cost: on `tmpfs` or `ramfs` nothing is
/// written to a disk, so those rows measure the router without one ([`Scratch::in_memory`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scratch {
    /// The directory, as the run resolved it.
    pub dir: String,
    /// Its file system's type as the kernel names it (`ext4`, `xfs`, `tmpfs`, ...), from
    /// `/proc/self/mountinfo`; `unknown` where that cannot be read.
    pub filesystem: String,
}

impl Scratch {
    /// `$TMPDIR` (or the platform's temporary directory) and its file system.
    pub fn current() -> Scratch {
        let dir = std::env::temp_dir();
        let resolved = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        let filesystem = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|table| filesystem_of(&table, &resolved))
            .unwrap_or_else(|| "unknown".to_string());
        Scratch {
            dir: resolved.display().to_string(),
            filesystem,
        }
    }

    /// Whether the file system keeps its files in memory only, so that a commit's sync reaches
    /// no disk.
    pub fn in_memory(&self) -> bool {
        matches!(self.filesystem.as_str(), "tmpfs" | "ramfs")
    }
}

/// The type of the file system `path` is on, from the text of `/proc/self/mountinfo`: the mount
/// whose mount point is the longest leading part of `path` (the last one listed where mounts
/// stack on one point). `path` must be absolute and resolved (no links, no `..`).
fn filesystem_of(mountinfo: &str, path: &std::path::Path) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for line in mountinfo.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(point), Some(kind)) = (
            left.split(' ').nth(4),
            right.split(' ').next().filter(|k| !k.is_empty()),
        ) else {
            continue;
        };
        let point = unescape_mount_point(point);
        let point = std::path::Path::new(&point);
        if path.starts_with(point) {
            let depth = point.components().count();
            if best.is_none_or(|(d, _)| depth >= d) {
                best = Some((depth, kind));
            }
        }
    }
    best.map(|(_, kind)| kind.to_string())
}

/// A mount point as `mountinfo` writes it: space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_point(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Machine {
    /// Reads what this machine says about itself (fields it cannot read are left `unknown`).
    pub fn current() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel,
            load_at_start: load_average(),
            load_at_end: None,
            scratch: Scratch::current(),
        }
    }
}

/// The one-minute load average, where `/proc/loadavg` exists.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `release` or `debug`: figures from a debug build say little about a release build.
    pub profile: &'static str,
    /// Whether this was a `--quick` smoke run (fewer rounds).
    pub quick: bool,
    /// The machine.
    pub machine: Machine,
    /// The rows, in [`RowId::ALL`] order.
    pub rows: Vec<Row>,
}

impl Report {
    /// Whether any row failed to measure.
    pub fn has_errors(&self) -> bool {
        self.rows.iter().any(|r| r.verdict == "error")
    }
}

fn cells(row: &Row) -> [String; 4] {
    match &row.outcome {
        Outcome::Measured(m) => [
            m.figure_median.map_or("-".into(), Quantity::display),
            m.baseline_median.map_or("-".into(), Quantity::display),
            row.target.display_value(m.value),
            row.verdict.to_string(),
        ],
        Outcome::Skipped { .. } => ["-".into(), "-".into(), "-".into(), "skipped".into()],
        Outcome::Failed { .. } => ["-".into(), "-".into(), "-".into(), "error".into()],
    }
}

fn explanation(row: &Row) -> Option<String> {
    match &row.outcome {
        Outcome::Measured(m) => m.note.clone(),
        Outcome::Skipped { reason } => Some(format!("skipped: {reason}")),
        Outcome::Failed { error } => Some(format!("error: {error}")),
    }
}

fn header_line(report: &Report) -> String {
    let load = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
    let scratch = &report.machine.scratch;
    format!(
        "{} build{}, {} ({} cores, Linux {}), load {} -> {}, files under {} ({})",
        report.profile,
        if report.quick { ", --quick" } else { "" },
        report.machine.cpu,
        report.machine.cores,
        report.machine.kernel,
        load(report.machine.load_at_start),
        load(report.machine.load_at_end),
        scratch.dir,
        scratch.filesystem,
    )
}

/// The warning a run on an in-memory file system carries under its header line.
fn scratch_warning(report: &Report) -> Option<String> {
    let scratch = &report.machine.scratch;
    scratch.in_memory().then(|| {
        let rows: Vec<String> = RowId::DURABLE
            .iter()
            .map(|id| format!("`{}`", id.id()))
            .collect();
        format!(
            "warning: {} is on {}, so no commit reaches a disk: the durable rows ({}) measure the \
             router without its disk's syncs; set TMPDIR to a directory on the disk a registry \
             would use",
            scratch.dir,
            scratch.filesystem,
            rows.join(", ")
        )
    })
}

/// The terminal table, then one line per note, skip or error.
pub fn render_table(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(140)
        .set_header([
            "id",
            "figure",
            "baseline",
            "figure median",
            "baseline median",
            "measured",
            "target",
            "verdict",
        ]);
    for row in &report.rows {
        let [f, b, measured, verdict] = cells(row);
        table.add_row([
            row.id.id().to_string(),
            row.figure.to_string(),
            row.baseline.to_string(),
            f,
            b,
            measured,
            row.target.display(),
            verdict,
        ]);
    }
    writeln!(out, "{}", header_line(report))?;
    if let Some(warning) = scratch_warning(report) {
        writeln!(out, "{warning}")?;
    }
    writeln!(out, "{table}")?;
    for row in &report.rows {
        if let Some(text) = explanation(row) {
            writeln!(out, "{}: {text}", row.id.id())?;
        }
    }
    Ok(())
}

/// GitHub-flavoured Markdown: the table with the command of each row, then the notes.
pub fn render_markdown(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let mut text = String::new();
    let _ = writeln!(text, "_{}_\n", header_line(report));
    if let Some(warning) = scratch_warning(report) {
        let _ = writeln!(text, "**{warning}**\n");
    }
    let _ = writeln!(
        text,
        "| figure | baseline run beside it | figure median | baseline median | measured | target | verdict | command |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|");
    for row in &report.rows {
        let [f, b, measured, verdict] = cells(row);
        let _ = writeln!(
            text,
            "| {} | {} | {f} | {b} | {measured} | {} | {verdict} | `{}` |",
            row.figure,
            row.baseline,
            row.target.display(),
            row.command
        );
    }
    let notes: Vec<String> = report
        .rows
        .iter()
        .filter_map(|row| explanation(row).map(|t| format!("- `{}`: {t}", row.id.id())))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(text, "\n{}", notes.join("\n"));
    }
    out.write_all(text.as_bytes())
}

/// The report as one JSON document.
pub fn render_json(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Versioned<'a> {
        version: u32,
        #[serde(flatten)]
        report: &'a Report,
    }
    let doc = Versioned {
        version: JSON_VERSION,
        report,
    };
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}

/// The `version` of `callid bench --format json` (schema: `schemas/bench.json`). It goes up when a
/// field is removed or changes meaning; new fields may appear within a version.
pub const JSON_VERSION: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let measured = |value: f64, f: Quantity, b: Quantity, note: Option<&str>| {
            Outcome::Measured(Measurement {
                value,
                figure_median: Some(f),
                baseline_median: Some(b),
                rounds: 21,
                note: note.map(str::to_string),
            })
        };
        let absolute = |value: f64| {
            Outcome::Measured(Measurement {
                value,
                figure_median: None,
                baseline_median: None,
                rounds: 3,
                note: None,
            })
        };
        let rows = RowId::ALL
            .into_iter()
            .map(|id| {
                let outcome = match id {
                    RowId::ProbeRoundTrip => measured(
                        1.04,
                        Quantity::SecondsPerOp(52e-6),
                        Quantity::SecondsPerOp(50e-6),
                        None,
                    ),
                    RowId::ProbeThroughput => Outcome::Skipped {
                        reason: "`python3` cannot `import mcp`".into(),
                    },
                    RowId::RouterNewOperation => measured(
                        0.25,
                        Quantity::OpsPerSecond(250.0),
                        Quantity::OpsPerSecond(1000.0),
                        Some("four commits per operation"),
                    ),
                    RowId::RouterConcurrent => Outcome::Failed {
                        error: "the server closed the connection".into(),
                    },
                    RowId::ConformSuite => absolute(7.25),
                    RowId::PostgresNetwork => measured(
                        4.2,
                        Quantity::SecondsPerOp(12.1e-3),
                        Quantity::SecondsPerOp(7.9e-3),
                        Some("4.2 ms added per operation"),
                    ),
                    RowId::ProbeRss | RowId::RouterRss => absolute(12.5),
                    _ => measured(
                        1.5,
                        Quantity::SecondsPerOp(3e-6),
                        Quantity::SecondsPerOp(2e-6),
                        None,
                    ),
                };
                Row::new(id, outcome, format!("callid bench --only {}", id.id()))
            })
            .collect();
        Report {
            profile: "release",
            quick: false,
            machine: Machine {
                cpu: "Test CPU".into(),
                cores: 2,
                kernel: "6.1.0".into(),
                load_at_start: Some(0.5),
                load_at_end: Some(0.75),
                scratch: Scratch {
                    dir: "/tmp".into(),
                    filesystem: "tmpfs".into(),
                },
            },
            rows,
        }
    }

    fn render(f: fn(&Report, &mut dyn Write) -> std::io::Result<()>) -> String {
        let mut out = Vec::new();
        f(&sample(), &mut out).expect("renders");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn every_verdict_in_every_format() {
        insta::assert_snapshot!("table", render(render_table));
        insta::assert_snapshot!("markdown", render(render_markdown));
        insta::assert_snapshot!("json", render(render_json));
    }

    #[test]
    fn targets_compare_in_the_right_direction() {
        let cases = [
            (Target::RatioAtMost(1.1), 1.1, true),
            (Target::RatioAtMost(1.1), 1.11, false),
            (Target::RatioAtLeast(10.0), 10.0, true),
            (Target::RatioAtLeast(10.0), 9.9, false),
            (Target::SecondsAtMost(20.0), 19.0, true),
            (Target::MegabytesAtMost(40.0), 41.0, false),
            (Target::RoundTripsAtMost(6.0), 6.0, true),
            (Target::RoundTripsAtMost(6.0), 6.1, false),
        ];
        for (target, value, met) in cases {
            assert_eq!(target.is_met(value), Some(met), "{target:?} with {value}");
        }
        assert_eq!(Target::Reported.is_met(0.1), None);
    }

    #[test]
    fn the_scratch_file_system_is_the_deepest_mount_above_it() {
        use std::path::Path;
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:22 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
25 22 0:23 / /tmp rw shared:4 - tmpfs tmpfs rw,size=1g
26 25 254:1 / /tmp/disk rw - xfs /dev/vdb rw
27 22 254:2 / /mnt/my\\040disk rw - btrfs /dev/vdc rw
28 25 0:24 / /tmp rw - ramfs none rw
";
        let of = |p: &str| filesystem_of(mountinfo, Path::new(p));
        assert_eq!(of("/home/me/work").as_deref(), Some("ext4"));
        assert_eq!(of("/dev/shm").as_deref(), Some("tmpfs"));
        assert_eq!(of("/tmp/disk/x").as_deref(), Some("xfs"));
        // A mount point is matched by whole components, and the last mount on a point wins.
        assert_eq!(of("/tmpfoo").as_deref(), Some("ext4"));
        assert_eq!(of("/tmp/x").as_deref(), Some("ramfs"));
        assert_eq!(of("/mnt/my disk/registry").as_deref(), Some("btrfs"));
        assert_eq!(filesystem_of("garbage\n", Path::new("/tmp")), None);
    }

    #[test]
    fn only_an_in_memory_scratch_warns() {
        let mut report = sample();
        assert!(scratch_warning(&report).is_some_and(|w| w.contains("/tmp is on tmpfs")));
        report.machine.scratch.filesystem = "ext4".into();
        assert_eq!(scratch_warning(&report), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machines_scratch_has_a_file_system() {
        let scratch = Scratch::current();
        assert_ne!(scratch.filesystem, "unknown", "{scratch:?}");
        assert!(std::path::Path::new(&scratch.dir).is_absolute());
    }

    #[test]
    fn ids_round_trip() {
        for id in RowId::ALL {
            assert_eq!(RowId::from_id(id.id()), Some(id));
        }
        assert_eq!(RowId::from_id("nope"), None);
    }
}
