//! The rows that start real processes: the probe beside the rmcp baseline and the Python SDK
//! probe, the router beside raw SQLite, itself with one client, and the rmcp echo, the
//! conformance suite's wall time, and peak memory under load.
//!
//! Each pair of servers runs at the same time, warmed up, and is driven in alternating rounds
//! (figure batch, then baseline batch) from this one process through [`crate::jsonrpc`].

use super::drive::{
    self, BenchError, BenchResult, Call, Server, check_completed, check_replayed, check_success,
};
use super::fixtures;
use super::report::{Measurement, Outcome, RowId};
use super::stats::{Pairs, Quantity, median};
use super::{Plan, python};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What the end-to-end rows need.
pub struct Context {
    /// The `callid` program to start (this one).
    pub program: PathBuf,
    /// A scratch directory for registries, ledgers and logs.
    pub dir: PathBuf,
    /// Sizes of the run.
    pub plan: Plan,
    /// `--python`, if given.
    pub python: Option<PathBuf>,
    /// Rows asked for.
    pub want: Vec<RowId>,
}

impl Context {
    fn wants(&self, id: RowId) -> bool {
        self.want.contains(&id)
    }
}

fn failed(err: &BenchError) -> Outcome {
    Outcome::Failed {
        error: drive::chain(err),
    }
}

fn ratio_outcome(pairs: &Pairs, note: &str) -> Outcome {
    match pairs.summary() {
        Some(s) => Outcome::Measured(Measurement {
            value: s.ratio,
            figure_median: Some(s.figure),
            baseline_median: Some(s.baseline),
            rounds: s.rounds,
            note: Some(note.to_string()),
        }),
        None => Outcome::Failed {
            error: "no round completed".into(),
        },
    }
}

fn absolute(value: f64, runs: usize, note: String) -> Outcome {
    Outcome::Measured(Measurement {
        value,
        figure_median: None,
        baseline_median: None,
        rounds: runs,
        note: Some(note),
    })
}

fn capabilities_call() -> Call {
    Call {
        tool: "capabilities",
        arguments: json!({}),
        meta: fixtures::codex_meta(drive::next_call()),
    }
}

fn new_spend_call() -> Call {
    Call {
        tool: "generate_image",
        arguments: fixtures::generate_image_arguments(),
        meta: fixtures::codex_meta(drive::next_call()),
    }
}

fn echo_call() -> Call {
    Call {
        tool: "echo",
        arguments: fixtures::generate_image_arguments(),
        meta: fixtures::codex_meta(drive::next_call()),
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

async fn baseline_server(ctx: &Context) -> BenchResult<Server> {
    Server::stdio(
        "the rmcp baseline (`callid bench --serve-baseline`)",
        &ctx.program,
        &args(&["bench", "--serve-baseline"]),
        &[],
    )
    .await
}

async fn warm_up(
    server: &Server,
    make: fn() -> Call,
    check: drive::Check,
    n: usize,
) -> BenchResult<()> {
    drive::sequential(&server.name, &server.conn, n, &make, check).await?;
    Ok(())
}

/// The probe's rows: round trip, throughput, peak memory.
pub async fn probe_rows(ctx: &Context) -> Vec<(RowId, Outcome)> {
    let mine = [
        RowId::ProbeRoundTrip,
        RowId::ProbeThroughput,
        RowId::ProbeRss,
    ];
    let mut wanted: Vec<RowId> = mine.into_iter().filter(|id| ctx.wants(*id)).collect();
    let mut rows = Vec::new();
    // Looked for first, so a missing Python is reported as a skip whatever else fails.
    let python = if wanted.contains(&RowId::ProbeThroughput) {
        // May make the venv (minutes of pip, its progress on standard error): off the workers.
        match tokio::task::block_in_place(|| python::find(ctx.python.as_deref())) {
            Ok(python) => Some(python),
            Err(reason) => {
                rows.push((RowId::ProbeThroughput, Outcome::Skipped { reason }));
                wanted.retain(|id| *id != RowId::ProbeThroughput);
                None
            }
        }
    } else {
        None
    };
    if wanted.is_empty() {
        return rows;
    }
    let probe = match Server::stdio(
        "`callid probe`",
        &ctx.program,
        &[
            "probe".to_string(),
            "--log".to_string(),
            path_arg(&ctx.dir.join("probe.jsonl")),
        ],
        &[],
    )
    .await
    {
        Ok(server) => server,
        Err(err) => {
            rows.extend(wanted.into_iter().map(|id| (id, failed(&err))));
            return rows;
        }
    };
    let plan = ctx.plan;
    if let Err(err) = warm_up(&probe, capabilities_call, check_success, plan.warm_up).await {
        probe.stop().await;
        rows.extend(wanted.into_iter().map(|id| (id, failed(&err))));
        return rows;
    }

    if ctx.wants(RowId::ProbeRoundTrip) {
        let outcome = match probe_round_trip(ctx, &probe).await {
            Ok(pairs) => ratio_outcome(
                &pairs,
                "one call in flight; Codex-sized `_meta`; the probe checks identity, extracts \
                 the shape and appends a log line per request, the baseline only lists the keys",
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::ProbeRoundTrip, outcome));
    }

    let mut loaded = false;
    if let Some(python) = python {
        let outcome = match probe_throughput(ctx, &probe, &python).await {
            Ok(pairs) => {
                loaded = true;
                ratio_outcome(
                    &pairs,
                    &format!(
                        "{} calls per round, {} in flight on one stdio connection; \
                             baseline `benches/python_probe.py` on `{}`",
                        plan.throughput_calls,
                        plan.in_flight,
                        python.display()
                    ),
                )
            }
            Err(err) => failed(&err),
        };
        rows.push((RowId::ProbeThroughput, outcome));
    }

    if ctx.wants(RowId::ProbeRss) {
        let load = if loaded {
            Ok(())
        } else {
            drive::concurrent(
                &probe.name,
                std::slice::from_ref(&probe.conn),
                plan.throughput_calls * plan.rounds,
                plan.in_flight,
                Arc::new(capabilities_call),
                check_success,
            )
            .await
            .map(|_| ())
        };
        let outcome = match load.and_then(|()| probe.peak_rss_mb()) {
            Ok(mb) => absolute(
                mb,
                1,
                format!(
                    "peak RSS (VmHWM) of the probe process after {} calls with {} in flight",
                    plan.throughput_calls * plan.rounds + plan.warm_up,
                    plan.in_flight
                ),
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::ProbeRss, outcome));
    }
    probe.stop().await;
    rows
}

async fn probe_round_trip(ctx: &Context, probe: &Server) -> BenchResult<Pairs> {
    let baseline = baseline_server(ctx).await?;
    let plan = ctx.plan;
    let result = async {
        warm_up(&baseline, capabilities_call, check_success, plan.warm_up).await?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let make = capabilities_call;
            let a = drive::sequential(
                &probe.name,
                &probe.conn,
                plan.sequential_calls,
                &make,
                check_success,
            )
            .await?;
            let b = drive::sequential(
                &baseline.name,
                &baseline.conn,
                plan.sequential_calls,
                &make,
                check_success,
            )
            .await?;
            pairs.push(Quantity::SecondsPerOp(a), Quantity::SecondsPerOp(b));
        }
        Ok(pairs)
    }
    .await;
    baseline.stop().await;
    result
}

async fn probe_throughput(ctx: &Context, probe: &Server, python: &Path) -> BenchResult<Pairs> {
    let script = ctx.dir.join("python_probe.py");
    std::fs::write(&script, python::SCRIPT).map_err(|source| BenchError::Io {
        what: format!("writing `{}`", script.display()),
        source,
    })?;
    let py = Server::stdio(
        "the Python mcp SDK probe",
        python,
        &[path_arg(&script)],
        &[(
            "CALLID_PY_PROBE_LOG".to_string(),
            path_arg(&ctx.dir.join("python_probe.jsonl")),
        )],
    )
    .await?;
    let plan = ctx.plan;
    let result = async {
        warm_up(&py, capabilities_call, check_success, plan.warm_up).await?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let a = drive::concurrent(
                &probe.name,
                std::slice::from_ref(&probe.conn),
                plan.throughput_calls,
                plan.in_flight,
                Arc::new(capabilities_call),
                check_success,
            )
            .await?;
            let b = drive::concurrent(
                &py.name,
                std::slice::from_ref(&py.conn),
                plan.throughput_calls,
                plan.in_flight,
                Arc::new(capabilities_call),
                check_success,
            )
            .await?;
            pairs.push(Quantity::OpsPerSecond(a), Quantity::OpsPerSecond(b));
        }
        Ok(pairs)
    }
    .await;
    py.stop().await;
    result
}

/// The router's rows: new durable operations, 16 clients, replay, peak memory.
pub async fn router_rows(ctx: &Context) -> Vec<(RowId, Outcome)> {
    let mine = [
        RowId::RouterNewOperation,
        RowId::RouterConcurrent,
        RowId::RouterReplay,
        RowId::RouterRss,
    ];
    let wanted: Vec<RowId> = mine.into_iter().filter(|id| ctx.wants(*id)).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let plan = ctx.plan;
    let registry = ctx.dir.join("router-stdio").join("registry.sqlite3");
    let _ = std::fs::create_dir_all(registry.parent().expect("has a parent"));
    let router = match Server::stdio(
        "`callid router`",
        &ctx.program,
        &[
            "router".to_string(),
            "--registry".to_string(),
            path_arg(&registry),
        ],
        &[],
    )
    .await
    {
        Ok(server) => server,
        Err(err) => return wanted.into_iter().map(|id| (id, failed(&err))).collect(),
    };
    if let Err(err) = warm_up(
        &router,
        new_spend_call,
        check_completed,
        plan.warm_up.min(10),
    )
    .await
    {
        router.stop().await;
        return wanted.into_iter().map(|id| (id, failed(&err))).collect();
    }
    let mut rows = Vec::new();
    let mut peak_note = format!("after {} sequential new operations", plan.warm_up.min(10));

    if ctx.wants(RowId::RouterNewOperation) {
        let outcome = match router_new_operation(ctx, &router).await {
            Ok(pairs) => {
                peak_note = "after the new-operation rounds".into();
                ratio_outcome(
                    &pairs,
                    &format!(
                        "{} sequential `generate_image` calls with new call ids per round \
                         (registry row, authorization, execution, provider charge, result: each \
                         committed with synchronous=FULL) against {} single-row \
                         insert+commit transactions (WAL, synchronous=FULL) in the same directory",
                        plan.router_sequential_ops, plan.router_sequential_ops
                    ),
                )
            }
            Err(err) => failed(&err),
        };
        rows.push((RowId::RouterNewOperation, outcome));
    }

    let mut http_peak = None;
    if ctx.wants(RowId::RouterConcurrent) || ctx.wants(RowId::RouterRss) {
        let result = router_concurrent(ctx).await;
        let outcome = match result {
            Ok((pairs, peak)) => {
                http_peak = Some(peak);
                ratio_outcome(
                    &pairs,
                    &format!(
                        "{} new operations per round over streamable HTTP: {} sessions with one \
                         call in flight each, against one session with one call in flight; one \
                         router process and registry",
                        plan.concurrent_ops, plan.in_flight
                    ),
                )
            }
            Err(err) => failed(&err),
        };
        if ctx.wants(RowId::RouterConcurrent) {
            rows.push((RowId::RouterConcurrent, outcome));
        } else if let Outcome::Failed { error } = outcome {
            http_peak = Some(Err(error));
        }
    }

    if ctx.wants(RowId::RouterReplay) {
        let outcome = match router_replay(ctx, &router).await {
            Ok(pairs) => ratio_outcome(
                &pairs,
                "redeliveries of one completed `generate_image` call (same `_meta`, new JSON-RPC \
                 id) against `echo` of the same arguments on the rmcp baseline; one call in flight",
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::RouterReplay, outcome));
    }

    if ctx.wants(RowId::RouterRss) {
        let outcome = match http_peak {
            Some(Ok(mb)) => absolute(
                mb,
                1,
                format!(
                    "peak RSS (VmHWM) of the router process (in-process provider included) after \
                     the {}-client rounds",
                    plan.in_flight
                ),
            ),
            Some(Err(error)) => Outcome::Failed { error },
            None => match router.peak_rss_mb() {
                Ok(mb) => absolute(
                    mb,
                    1,
                    format!("peak RSS (VmHWM) of the stdio router process {peak_note}"),
                ),
                Err(err) => failed(&err),
            },
        };
        rows.push((RowId::RouterRss, outcome));
    }
    router.stop().await;
    rows
}

/// Single-row durable inserts, with the pragmas the router's registry uses.
struct SqliteBaseline {
    conn: rusqlite::Connection,
    path: PathBuf,
    next: u64,
}

impl SqliteBaseline {
    fn open(path: &Path) -> BenchResult<SqliteBaseline> {
        let err = |source| BenchError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let conn = rusqlite::Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS operations (
                platform TEXT NOT NULL,
                installation_id TEXT NOT NULL,
                harness_call_id TEXT NOT NULL,
                operation_key TEXT NOT NULL,
                public_handle TEXT NOT NULL UNIQUE,
                request_hash TEXT NOT NULL,
                status TEXT NOT NULL,
                created_at_ms INTEGER NOT NULL,
                PRIMARY KEY (platform, installation_id, harness_call_id)
            )",
        )
        .map_err(err)?;
        Ok(SqliteBaseline {
            conn,
            path: path.to_path_buf(),
            next: 0,
        })
    }

    /// Inserts `n` rows, one IMMEDIATE transaction each; returns rows per second.
    fn insert_batch(&mut self, n: usize) -> BenchResult<f64> {
        let path = self.path.display().to_string();
        let err = |source| BenchError::Sqlite {
            path: path.clone(),
            source,
        };
        let start = Instant::now();
        for _ in 0..n {
            self.next += 1;
            let i = self.next;
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(err)?;
            tx.execute(
                "INSERT INTO operations VALUES ('codex', 'inst-0001', ?1, ?2, ?3, ?4, 'pending', ?5)",
                rusqlite::params![
                    format!("call_{i:024}"),
                    format!("hubu:operation:v1:codex:{}", uuid::Uuid::new_v4()),
                    format!("hubu:public-operation:v1:{}", uuid::Uuid::new_v4()),
                    format!("sha256:{:064x}", i),
                    i as i64,
                ],
            )
            .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }
}

async fn router_new_operation(ctx: &Context, router: &Server) -> BenchResult<Pairs> {
    let plan = ctx.plan;
    let mut sqlite = SqliteBaseline::open(&ctx.dir.join("baseline.sqlite3"))?;
    tokio::task::block_in_place(|| sqlite.insert_batch(plan.warm_up.min(10)))?;
    let mut pairs = Pairs::new();
    for _ in 0..plan.rounds {
        let make = new_spend_call;
        let per_op = drive::sequential(
            &router.name,
            &router.conn,
            plan.router_sequential_ops,
            &make,
            check_completed,
        )
        .await?;
        let b = tokio::task::block_in_place(|| sqlite.insert_batch(plan.router_sequential_ops))?;
        pairs.push(
            Quantity::OpsPerSecond(1.0 / per_op),
            Quantity::OpsPerSecond(b),
        );
    }
    Ok(pairs)
}

/// Runs the 16-client rounds on an HTTP router; also returns its peak RSS afterwards.
async fn router_concurrent(ctx: &Context) -> BenchResult<(Pairs, Result<f64, String>)> {
    let plan = ctx.plan;
    let dir = ctx.dir.join("router-http");
    let _ = std::fs::create_dir_all(&dir);
    let addr = drive::free_loopback_addr()?;
    let url = format!("http://{addr}/mcp");
    let router = Server::http(
        "`callid router --http`",
        &ctx.program,
        &[
            "router".to_string(),
            "--registry".to_string(),
            path_arg(&dir.join("registry.sqlite3")),
            "--http".to_string(),
            addr.to_string(),
        ],
        addr,
        &url,
        &dir.join("stderr.log"),
    )
    .await?;
    let result = async {
        let mut sessions = Vec::with_capacity(plan.in_flight);
        for _ in 0..plan.in_flight {
            sessions.push(drive::http_session(&router.name, &url).await?);
        }
        let single = std::slice::from_ref(&router.conn);
        drive::concurrent(
            &router.name,
            &sessions,
            plan.in_flight * 2,
            plan.in_flight,
            Arc::new(new_spend_call),
            check_completed,
        )
        .await?;
        drive::concurrent(
            &router.name,
            single,
            plan.warm_up.min(10),
            1,
            Arc::new(new_spend_call),
            check_completed,
        )
        .await?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let a = drive::concurrent(
                &router.name,
                &sessions,
                plan.concurrent_ops,
                plan.in_flight,
                Arc::new(new_spend_call),
                check_completed,
            )
            .await?;
            let b = drive::concurrent(
                &router.name,
                single,
                plan.concurrent_ops,
                1,
                Arc::new(new_spend_call),
                check_completed,
            )
            .await?;
            pairs.push(Quantity::OpsPerSecond(a), Quantity::OpsPerSecond(b));
        }
        let peak = router.peak_rss_mb().map_err(|e| drive::chain(&e));
        for session in &sessions {
            session.close().await;
        }
        Ok((pairs, peak))
    }
    .await;
    router.stop().await;
    result
}

async fn router_replay(ctx: &Context, router: &Server) -> BenchResult<Pairs> {
    let plan = ctx.plan;
    let original = new_spend_call();
    drive::call(&router.name, &router.conn, &original, check_completed).await?;
    let baseline = baseline_server(ctx).await?;
    let result = async {
        warm_up(&baseline, echo_call, check_success, plan.warm_up).await?;
        let redeliver = || original.clone();
        drive::sequential(
            &router.name,
            &router.conn,
            plan.warm_up,
            &redeliver,
            check_replayed,
        )
        .await?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let a = drive::sequential(
                &router.name,
                &router.conn,
                plan.sequential_calls,
                &redeliver,
                check_replayed,
            )
            .await?;
            let make = echo_call;
            let b = drive::sequential(
                &baseline.name,
                &baseline.conn,
                plan.sequential_calls,
                &make,
                check_success,
            )
            .await?;
            pairs.push(Quantity::SecondsPerOp(a), Quantity::SecondsPerOp(b));
        }
        Ok(pairs)
    }
    .await;
    baseline.stop().await;
    result
}

/// The conformance suite's wall time: `callid conform` against the built-in reference router.
pub async fn conform_row(ctx: &Context) -> Outcome {
    let mut times = Vec::new();
    let mut last_note = String::new();
    for _ in 0..ctx.plan.conform_runs {
        let start = Instant::now();
        let output = tokio::process::Command::new(&ctx.program)
            .args(["conform", "--format", "json"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await;
        let elapsed = start.elapsed().as_secs_f64();
        let output = match output {
            Ok(output) => output,
            Err(source) => {
                return failed(&BenchError::Io {
                    what: "starting `callid conform`".into(),
                    source,
                });
            }
        };
        match output.status.code() {
            Some(0) => last_note = "every check passed".into(),
            Some(1) => {
                last_note = "the suite ran, with failing checks (see `callid conform`)".into()
            }
            _ => {
                return failed(&BenchError::Command {
                    command: "callid conform --format json".into(),
                    detail: format!(
                        "{}; stderr: {}",
                        output.status,
                        drive::tail_lines(&String::from_utf8_lossy(&output.stderr), 5)
                    ),
                });
            }
        }
        times.push(elapsed);
    }
    let median_time = median(&times).unwrap_or(f64::NAN);
    absolute(
        median_time,
        times.len(),
        format!(
            "median wall time of {} run(s) of `callid conform --format json` (each starts its \
             own reference routers and provider); {last_note}",
            times.len()
        ),
    )
}
