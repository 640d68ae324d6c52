//! The rows that start real processes: the probe beside the rmcp baseline and the Python SDK
//! probe, the router beside raw SQLite, itself with one client, and the rmcp echo, the
//! conformance suite's wall time, and peak memory under load.
//!
//! Each pair of servers runs at the same time, warmed up, and is driven in alternating rounds
//! (figure batch, then baseline batch) from this one process through [`crate::jsonrpc`].

use super::drive::{
    self, BenchError, BenchResult, Server, check_completed, check_replayed, check_success,
};
use super::fixtures::{capabilities_call, echo_call, new_spend_call};
use super::paired::{self, Batch, Calls, every, failed};
use super::report::{Measurement, Outcome, RowId};
use super::stats::{Pairs, median};
use super::{Plan, python};
use std::path::{Path, PathBuf};
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

fn absolute(value: f64, runs: usize, note: String) -> Outcome {
    Outcome::Measured(Measurement {
        value,
        figure_median: None,
        baseline_median: None,
        rounds: runs,
        note: Some(note),
    })
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

pub(super) async fn baseline_server(ctx: &Context) -> BenchResult<Server> {
    Server::stdio(
        "the rmcp baseline (`callid bench --serve-baseline`)",
        &ctx.program,
        &args(&["bench", "--serve-baseline"]),
        &[],
    )
    .await
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
            rows.extend(every(wanted, &failed(&err)));
            return rows;
        }
    };
    let plan = ctx.plan;
    let on_probe = Calls::on(&probe, &capabilities_call, check_success);
    if let Err(err) = on_probe.sequential(plan.warm_up).await {
        probe.stop().await;
        rows.extend(every(wanted, &failed(&err)));
        return rows;
    }

    if ctx.wants(RowId::ProbeRoundTrip) {
        let outcome = paired::outcome(
            &probe_round_trip(ctx, on_probe).await,
            "one call in flight; Codex-sized `_meta`; the probe checks identity, extracts \
             the shape and appends a log line per request, the baseline only lists the keys",
        );
        rows.push((RowId::ProbeRoundTrip, outcome));
    }

    let mut loaded = false;
    if let Some(python) = python {
        let result = probe_throughput(ctx, on_probe, &python).await;
        loaded = result.is_ok();
        let outcome = paired::outcome(
            &result,
            &format!(
                "{} calls per round, {} in flight on one stdio connection; \
                     baseline `benches/python_probe.py` on `{}`",
                plan.throughput_calls,
                plan.in_flight,
                python.display()
            ),
        );
        rows.push((RowId::ProbeThroughput, outcome));
    }

    if ctx.wants(RowId::ProbeRss) {
        let load = if loaded {
            Ok(())
        } else {
            on_probe
                .concurrent(plan.throughput_calls * plan.rounds, plan.in_flight)
                .await
                .map(|_| ())
        };
        let measured = load.and_then(|()| Ok((probe.peak_rss_mb()?, probe.resident_split()?)));
        let outcome = match measured {
            Ok((mb, split)) => absolute(
                mb,
                1,
                format!(
                    "peak RSS (VmHWM) of the probe process after {} calls with {} in flight{}",
                    plan.throughput_calls * plan.rounds + plan.warm_up,
                    plan.in_flight,
                    split.note()
                ),
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::ProbeRss, outcome));
    }
    probe.stop().await;
    rows
}

async fn probe_round_trip(ctx: &Context, probe: Calls<'_>) -> BenchResult<Pairs> {
    let baseline = baseline_server(ctx).await?;
    let plan = ctx.plan;
    let result = async {
        let on_baseline = Calls::on(&baseline, &capabilities_call, check_success);
        on_baseline.sequential(plan.warm_up).await?;
        paired::rounds(
            plan.rounds,
            plan.sequential_calls,
            &mut Batch::Sequential(probe),
            &mut Batch::Sequential(on_baseline),
        )
        .await
    }
    .await;
    baseline.stop().await;
    result
}

async fn probe_throughput(ctx: &Context, probe: Calls<'_>, python: &Path) -> BenchResult<Pairs> {
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
        let on_py = Calls::on(&py, &capabilities_call, check_success);
        on_py.sequential(plan.warm_up).await?;
        paired::rounds(
            plan.rounds,
            plan.throughput_calls,
            &mut Batch::Concurrent(probe, plan.in_flight),
            &mut Batch::Concurrent(on_py, plan.in_flight),
        )
        .await
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
        Err(err) => return every(wanted, &failed(&err)),
    };
    let on_router = Calls::on(&router, &new_spend_call, check_completed);
    if let Err(err) = on_router.sequential(plan.warm_up.min(10)).await {
        router.stop().await;
        return every(wanted, &failed(&err));
    }
    let mut rows = Vec::new();
    let mut peak_note = format!("after {} sequential new operations", plan.warm_up.min(10));

    if ctx.wants(RowId::RouterNewOperation) {
        let result = router_new_operation(ctx, on_router, router.pid()).await;
        let ceiling = match &result {
            Ok((_, ceiling)) => {
                peak_note = "after the new-operation rounds".into();
                format!(
                    "; {}",
                    ceiling_note(
                        ceiling,
                        "three of the baseline's commits and one bare rmcp \
                     round trip (`callid bench --serve-baseline`)"
                    )
                )
            }
            Err(_) => String::new(),
        };
        let outcome = paired::outcome(
            &result.map(|(pairs, _)| pairs),
            &format!(
                "{} sequential `generate_image` calls with new call ids per round \
                 (three commits with synchronous=FULL each: the row with its lease, decision \
                 and dispatch; the provider's charge; the result with its receipt and \
                 charge) against {} single-row \
                 insert+commit transactions (WAL, synchronous=FULL) in the same directory{}",
                plan.router_sequential_ops, plan.router_sequential_ops, ceiling
            ),
        );
        rows.push((RowId::RouterNewOperation, outcome));
    }

    let mut http_peak = None;
    if ctx.wants(RowId::RouterConcurrent) || ctx.wants(RowId::RouterRss) {
        let mut cpu = None;
        let result = router_concurrent(ctx).await.map(|((pairs, busy), peak)| {
            http_peak = Some(peak);
            cpu = busy.cores;
            pairs
        });
        let outcome = paired::outcome(
            &result,
            &format!(
                "{} new operations per round over streamable HTTP: {} sessions with one \
                 call in flight each, against one session with one call in flight; one \
                 router process and registry{}",
                plan.concurrent_ops,
                plan.in_flight,
                paired::cpu_note(cpu, "the 16-client batches", "the 1-client batches")
            ),
        );
        if ctx.wants(RowId::RouterConcurrent) {
            rows.push((RowId::RouterConcurrent, outcome));
        } else if let Outcome::Failed { error } = outcome {
            http_peak = Some(Err(error));
        }
    }

    if ctx.wants(RowId::RouterReplay) {
        let outcome = paired::outcome(
            &router_replay(ctx, &router).await,
            "redeliveries of one completed `generate_image` call (same `_meta`, new JSON-RPC \
             id) against `echo` of the same arguments on the rmcp baseline; one call in flight",
        );
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
pub(super) struct SqliteBaseline {
    conn: rusqlite::Connection,
    path: PathBuf,
    next: u64,
}

impl SqliteBaseline {
    pub(super) fn open(path: &Path) -> BenchResult<SqliteBaseline> {
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
    pub(super) fn insert_batch(&mut self, n: usize) -> BenchResult<f64> {
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

/// The new-operation rounds, and the row's ceiling on this machine: a new operation needs three
/// commits (the baseline's) and one round trip to a bare rmcp server, whatever else it does. The
/// router's CPU time is metered during its batches (process `pid`).
async fn router_new_operation(
    ctx: &Context,
    router: Calls<'_>,
    pid: Option<u32>,
) -> BenchResult<(Pairs, paired::Ceiling)> {
    let plan = ctx.plan;
    let mut sqlite = SqliteBaseline::open(&ctx.dir.join("baseline.sqlite3"))?;
    let mut inserts = Batch::Blocking(Box::new(move |n| sqlite.insert_batch(n)));
    inserts.run(plan.warm_up.min(10)).await?;
    let echo = baseline_server(ctx).await?;
    let result = async {
        let on_echo = Calls::on(&echo, &capabilities_call, check_success);
        on_echo.sequential(plan.warm_up.min(10)).await?;
        paired::rounds_with_ceiling(
            plan.rounds,
            plan.router_sequential_ops,
            &mut Batch::SequentialRate(router),
            &mut inserts,
            &mut paired::Floor {
                baseline: 3.0,
                others: vec![(Batch::Sequential(on_echo), 1.0)],
            },
            &metered_router(pid),
        )
        .await
    }
    .await;
    echo.stop().await;
    result
}

/// The router of a new-operation row, metered for CPU time (its in-process provider included).
pub(super) fn metered_router(pid: Option<u32>) -> Vec<paired::Metered> {
    pid.map(|pid| paired::Metered {
        name: "the router".into(),
        pid,
        children: false,
    })
    .into_iter()
    .collect()
}

/// What a row's note says of its ceiling, of the floor's time, and of the CPU time the metered
/// processes spent per operation of the figure (the figure's work against the floor's time).
pub(super) fn ceiling_note(ceiling: &paired::Ceiling, floor: &str) -> String {
    let cpu: Vec<String> = ceiling
        .cpu
        .iter()
        .map(|(name, seconds)| format!("{name} {:.2} ms", seconds * 1e3))
        .collect();
    format!(
        "ceiling on this machine {:.2}x: {floor} back to back, with no other work, \
         measured after each round ({:.2} ms per operation){}",
        ceiling.ratio,
        ceiling.floor * 1e3,
        if cpu.is_empty() {
            String::new()
        } else {
            format!(
                "; CPU time per new operation (/proc/PID/stat, during the figure's batches): {}",
                cpu.join(", ")
            )
        }
    )
}

/// Runs the 16-client rounds on an HTTP router; also returns its peak RSS afterwards.
async fn router_concurrent(
    ctx: &Context,
) -> BenchResult<((Pairs, paired::Cpu), Result<f64, String>)> {
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
        let many = Calls {
            conns: &sessions,
            ..Calls::on(&router, &new_spend_call, check_completed)
        };
        let one = Calls::on(&router, &new_spend_call, check_completed);
        let pairs = many_against_one(plan, many, one, &[]).await?;
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
        let on_baseline = Calls::on(&baseline, &echo_call, check_success);
        on_baseline.sequential(plan.warm_up).await?;
        let redeliver = || original.clone();
        let replays = Calls::on(router, &redeliver, check_replayed);
        replays.sequential(plan.warm_up).await?;
        paired::rounds(
            plan.rounds,
            plan.sequential_calls,
            &mut Batch::Sequential(replays),
            &mut Batch::Sequential(on_baseline),
        )
        .await
    }
    .await;
    baseline.stop().await;
    result
}

/// New operations from `plan.in_flight` calls at a time over `many` sessions against one at a
/// time over `one` (the same router or router group): both warmed up, then paired rounds of
/// `plan.concurrent_ops`.
/// Also returns the machine's busy cores during each side and the CPU time per operation of
/// `processes` ([`paired::rounds_with_cpu`]).
pub async fn many_against_one(
    plan: Plan,
    many: Calls<'_>,
    one: Calls<'_>,
    processes: &[paired::Metered],
) -> BenchResult<(Pairs, paired::Cpu)> {
    many.concurrent(plan.in_flight * 2, plan.in_flight).await?;
    one.concurrent(plan.warm_up.min(10), 1).await?;
    paired::rounds_with_cpu(
        plan.rounds,
        plan.concurrent_ops,
        &mut Batch::Concurrent(many, plan.in_flight),
        &mut Batch::Concurrent(one, 1),
        processes,
    )
    .await
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
                        crate::text::last_lines(&String::from_utf8_lossy(&output.stderr), 5)
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
