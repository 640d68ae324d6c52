//! The one driver every paired end-to-end row calls: a figure and its baseline, each a [`Batch`],
//! run in alternating rounds (A B A B ...), and the [`Outcome`] a row reports from them.
//!
//! # Guarantees
//! - Each round runs the figure's batch, then the baseline's right after it, with the same number
//!   of calls (or rows); the pairs go to [`Pairs`], whose median of per-round ratios is the figure.
//! - The first failing batch ends the measurement with its error: a row never reports a ratio
//!   made from fewer rounds than it asked for.
//! - A blocking batch (a raw store baseline) runs through [`tokio::task::block_in_place`], so it
//!   never stalls the runtime's other tasks.

use super::drive::{self, BenchError, BenchResult, Call, Check, Server};
use super::report::{Measurement, Outcome, RowId};
use super::stats::{Pairs, Quantity};
use crate::jsonrpc::Connection;

/// Checked calls to one server: the side of a pair that talks MCP.
#[derive(Clone, Copy)]
pub struct Calls<'a> {
    /// The server's name, for errors.
    pub name: &'a str,
    /// Its connections (one-in-flight batches use the first).
    pub conns: &'a [Connection],
    /// Makes each call of a batch (all made before the batch is timed).
    pub make: &'a (dyn Fn() -> Call + Send + Sync),
    /// What every answer must be.
    pub check: Check,
}

impl<'a> Calls<'a> {
    /// Calls made by `make` on `server`'s connection.
    pub fn on(
        server: &'a Server,
        make: &'a (dyn Fn() -> Call + Send + Sync),
        check: Check,
    ) -> Calls<'a> {
        Calls {
            name: &server.name,
            conns: std::slice::from_ref(&server.conn),
            make,
            check,
        }
    }

    /// Sends `n` calls one after another; seconds per call.
    pub async fn sequential(&self, n: usize) -> BenchResult<f64> {
        drive::sequential(self.name, &self.conns[0], n, self.make, self.check).await
    }

    /// Sends `n` calls with `in_flight` at a time over the connections; calls per second.
    pub async fn concurrent(&self, n: usize, in_flight: usize) -> BenchResult<f64> {
        drive::concurrent(self.name, self.conns, n, in_flight, self.make, self.check).await
    }
}

/// One side of a pair: how it runs a batch of `n`, and what the batch measures.
pub enum Batch<'a> {
    /// One call in flight: seconds per call.
    Sequential(Calls<'a>),
    /// One call in flight, counted as operations per second (beside a store's commits per
    /// second).
    SequentialRate(Calls<'a>),
    /// The given number of calls in flight: calls per second.
    Concurrent(Calls<'a>, usize),
    /// A blocking batch on this thread that returns operations per second.
    Blocking(Box<dyn FnMut(usize) -> BenchResult<f64> + Send + 'a>),
}

impl Batch<'_> {
    /// Runs one batch of `n` calls (or rows).
    pub async fn run(&mut self, n: usize) -> BenchResult<Quantity> {
        Ok(match self {
            Batch::Sequential(calls) => Quantity::SecondsPerOp(calls.sequential(n).await?),
            Batch::SequentialRate(calls) => {
                Quantity::OpsPerSecond(1.0 / calls.sequential(n).await?)
            }
            Batch::Concurrent(calls, in_flight) => {
                Quantity::OpsPerSecond(calls.concurrent(n, *in_flight).await?)
            }
            Batch::Blocking(batch) => {
                Quantity::OpsPerSecond(tokio::task::block_in_place(|| batch(n))?)
            }
        })
    }
}

/// `rounds` rounds of `n` calls a side: the figure's batch, then the baseline's.
pub async fn rounds(
    rounds: usize,
    n: usize,
    figure: &mut Batch<'_>,
    baseline: &mut Batch<'_>,
) -> BenchResult<Pairs> {
    let mut pairs = Pairs::new();
    for _ in 0..rounds {
        let a = figure.run(n).await?;
        let b = baseline.run(n).await?;
        pairs.push(a, b);
    }
    Ok(pairs)
}

/// What a figure cannot do without, per operation, whatever its code: `baseline` operations of
/// its own baseline (a durable commit), and each of `others` (a bare round trip, another store's
/// commit) as many times as its count says.
pub struct Floor<'a> {
    /// How many of the baseline's operations one operation of the figure needs.
    pub baseline: f64,
    /// The other primitives it needs, each with its count per operation.
    pub others: Vec<(Batch<'a>, f64)>,
}

/// [`rounds`], each round followed by one batch of each of `floor`'s other primitives: the pairs,
/// and the median of the per-round ceilings, the ratio no implementation could beat on this
/// machine (the baseline's time per operation over the floor's: its own primitives back to back,
/// with no other work at all).
pub async fn rounds_with_ceiling(
    rounds: usize,
    n: usize,
    figure: &mut Batch<'_>,
    baseline: &mut Batch<'_>,
    floor: &mut Floor<'_>,
) -> BenchResult<(Pairs, f64)> {
    let mut pairs = Pairs::new();
    let mut ceilings = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let a = figure.run(n).await?;
        let b = baseline.run(n).await?;
        pairs.push(a, b);
        let base = b.seconds_per_op();
        let mut least = floor.baseline * base;
        for (batch, count) in &mut floor.others {
            least += *count * batch.run(n).await?.seconds_per_op();
        }
        ceilings.push(base / least);
    }
    let ceiling = super::stats::median(&ceilings).unwrap_or(f64::NAN);
    Ok((pairs, ceiling))
}

/// The whole machine's CPU time so far (`/proc/stat`'s first line, in clock ticks): busy and
/// total. `None` where there is no `/proc/stat`.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = ticks.iter().sum();
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((total - idle, total))
}

/// How busy the whole machine was, in cores, during the figure's batches and during the
/// baseline's: `(figure, baseline)`.
pub type CoresBusy = Option<(f64, f64)>;

/// [`rounds`], also measuring the machine's busy cores during each side's batches (every
/// process counts: the servers, the database, the clients, and anything else running).
pub async fn rounds_with_cpu(
    rounds: usize,
    n: usize,
    figure: &mut Batch<'_>,
    baseline: &mut Batch<'_>,
) -> BenchResult<(Pairs, CoresBusy)> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let mut pairs = Pairs::new();
    let mut busy = [(0u64, 0u64); 2];
    let mut known = true;
    for _ in 0..rounds {
        let mut metered = |side: usize, before: Option<(u64, u64)>| match (before, cpu_ticks()) {
            (Some((b0, t0)), Some((b1, t1))) => {
                busy[side].0 += b1.saturating_sub(b0);
                busy[side].1 += t1.saturating_sub(t0);
            }
            _ => known = false,
        };
        let before = cpu_ticks();
        let a = figure.run(n).await?;
        metered(0, before);
        let before = cpu_ticks();
        let b = baseline.run(n).await?;
        metered(1, before);
        pairs.push(a, b);
    }
    let share = |(b, t): (u64, u64)| (t > 0).then(|| cores * b as f64 / t as f64);
    let cpu = match (known, share(busy[0]), share(busy[1])) {
        (true, Some(f), Some(b)) => Some((f, b)),
        _ => None,
    };
    Ok((pairs, cpu))
}

/// What a row's note says of the busy cores measured by [`rounds_with_cpu`].
pub fn cpu_note(cpu: CoresBusy, figure: &str, baseline: &str) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    match cpu {
        Some((f, b)) => format!(
            "; the whole machine's CPU busy: {f:.2} of {cores} cores during {figure}, {b:.2} \
             during {baseline}"
        ),
        None => String::new(),
    }
}

/// The row of a paired measurement: its median ratio with both medians and `note`, or why it
/// failed.
pub fn outcome(result: &BenchResult<Pairs>, note: &str) -> Outcome {
    match result {
        Ok(pairs) => match pairs.summary() {
            Some(s) => Outcome::Measured(Measurement::paired(&s, note)),
            None => Outcome::Failed {
                error: "no round completed".into(),
            },
        },
        Err(err) => failed(err),
    }
}

/// The row of a measurement that failed with `err`.
pub fn failed(err: &BenchError) -> Outcome {
    Outcome::Failed {
        error: drive::chain(err),
    }
}

/// The same `outcome` for each of `ids`.
pub fn every(ids: Vec<RowId>, outcome: &Outcome) -> Vec<(RowId, Outcome)> {
    ids.into_iter().map(|id| (id, outcome.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A blocking batch that logs `name` and the batch size, answering `rate(round)`.
    fn logged<'a>(
        log: &'a Arc<Mutex<Vec<(&'static str, usize)>>>,
        name: &'static str,
        rate: impl Fn(usize) -> BenchResult<f64> + Send + 'a,
    ) -> Batch<'a> {
        let mut round = 0;
        Batch::Blocking(Box::new(move |n| {
            log.lock().unwrap().push((name, n));
            round += 1;
            rate(round)
        }))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn rounds_alternate_figure_then_baseline_and_pair_them() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut figure = logged(&log, "figure", |round| Ok(2.0 * round as f64));
        let mut baseline = logged(&log, "baseline", |round| Ok(round as f64));
        let pairs = rounds(3, 40, &mut figure, &mut baseline).await.unwrap();
        drop((figure, baseline));
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            [
                ("figure", 40),
                ("baseline", 40),
                ("figure", 40),
                ("baseline", 40),
                ("figure", 40),
                ("baseline", 40)
            ]
        );
        let summary = pairs.summary().expect("three rounds");
        assert_eq!((summary.rounds, summary.ratio), (3, 2.0));
        assert_eq!(summary.figure, Quantity::OpsPerSecond(4.0));
        let outcome = outcome(&Ok(pairs), "note");
        assert!(
            matches!(&outcome, Outcome::Measured(m) if m.value == 2.0 && m.note.as_deref() == Some("note")),
            "{outcome:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_ceiling_is_the_baseline_over_the_floor_of_each_round() {
        let log = Arc::new(Mutex::new(Vec::new()));
        // Baseline: 100 then 200 commits/s; a round trip takes 5 ms: three commits and a round
        // trip give ceilings of 10/35 and 5/20.
        let mut figure = logged(&log, "figure", |_| Ok(10.0));
        let mut baseline = logged(&log, "baseline", |round| Ok(100.0 * round as f64));
        let mut floor = Floor {
            baseline: 3.0,
            others: vec![(logged(&log, "round trip", |_| Ok(1.0 / 0.005)), 1.0)],
        };
        let (pairs, ceiling) = rounds_with_ceiling(2, 7, &mut figure, &mut baseline, &mut floor)
            .await
            .unwrap();
        drop((figure, baseline, floor));
        assert_eq!(
            log.lock().unwrap().clone(),
            [
                ("figure", 7),
                ("baseline", 7),
                ("round trip", 7),
                ("figure", 7),
                ("baseline", 7),
                ("round trip", 7)
            ]
        );
        assert_eq!(pairs.summary().expect("two rounds").rounds, 2);
        let expected = (10.0 / 35.0 + 5.0 / 20.0) / 2.0;
        assert!(
            (ceiling - expected).abs() < 1e-12,
            "{ceiling} != {expected}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn busy_cores_are_measured_per_side_within_the_machine() {
        let mut spin = Batch::Blocking(Box::new(|_| {
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(30) {
                std::hint::spin_loop();
            }
            Ok(1.0)
        }));
        let mut sleep = Batch::Blocking(Box::new(|_| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            Ok(1.0)
        }));
        let (pairs, cpu) = rounds_with_cpu(3, 1, &mut spin, &mut sleep).await.unwrap();
        assert_eq!(pairs.summary().expect("three rounds").rounds, 3);
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        let (f, b) = cpu.expect("Linux has /proc/stat");
        for busy in [f, b] {
            assert!((0.0..=cores).contains(&busy), "{busy} of {cores} cores");
        }
        let note = cpu_note(Some((1.5, 0.25)), "the spins", "the sleeps");
        let wanted = format!("1.50 of {cores} cores during the spins, 0.25 during the sleeps");
        assert!(note.ends_with(&wanted), "{note}");
        assert_eq!(cpu_note(None, "a", "b"), "");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_first_failing_batch_ends_the_measurement() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut figure = logged(&log, "figure", |_| Ok(1.0));
        let mut baseline = logged(&log, "baseline", |round| {
            if round == 2 {
                Err(BenchError::Unexpected {
                    what: "the baseline".into(),
                    detail: "round two".into(),
                })
            } else {
                Ok(1.0)
            }
        });
        let result = rounds(5, 1, &mut figure, &mut baseline).await;
        drop((figure, baseline));
        assert_eq!(log.lock().unwrap().len(), 4, "stopped at round two");
        assert_eq!(
            outcome(&result, "note"),
            Outcome::Failed {
                error: "the baseline answered unexpectedly: round two".into()
            }
        );
        assert_eq!(
            outcome(&Ok(Pairs::new()), "note"),
            Outcome::Failed {
                error: "no round completed".into()
            }
        );
    }
}
