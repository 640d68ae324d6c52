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

/// What [`rounds_with_ceiling`] measured besides the pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    /// The median of the per-round ceilings: the ratio no implementation could beat on this
    /// machine (the baseline's time per operation over the floor's).
    pub ratio: f64,
    /// The median of the per-round floors: seconds per operation of the floor's primitives back
    /// to back, with no other work at all.
    pub floor: f64,
    /// CPU seconds per operation of each named group of the metered processes during the
    /// figure's batches, in the order first named (empty where `/proc` cannot be read).
    pub cpu: Vec<(String, f64)>,
}

/// [`rounds`], each round followed by one batch of each of `floor`'s other primitives: the pairs
/// and the [`Ceiling`], with the CPU time `processes` spent per operation of the figure.
pub async fn rounds_with_ceiling(
    rounds: usize,
    n: usize,
    figure: &mut Batch<'_>,
    baseline: &mut Batch<'_>,
    floor: &mut Floor<'_>,
    processes: &[Metered],
) -> BenchResult<(Pairs, Ceiling)> {
    let mut pairs = Pairs::new();
    let mut ceilings = Vec::with_capacity(rounds);
    let mut floors = Vec::with_capacity(rounds);
    let mut spent = Some(vec![0u64; processes.len()]);
    for _ in 0..rounds {
        let before = metered_ticks(processes);
        let a = figure.run(n).await?;
        spent = match (spent, before, metered_ticks(processes)) {
            (Some(mut spent), Some(before), Some(after)) => {
                for (k, (b, a)) in before.iter().zip(&after).enumerate() {
                    spent[k] += a.saturating_sub(*b);
                }
                Some(spent)
            }
            _ => None,
        };
        let b = baseline.run(n).await?;
        pairs.push(a, b);
        let base = b.seconds_per_op();
        let mut least = floor.baseline * base;
        for (batch, count) in &mut floor.others {
            least += *count * batch.run(n).await?.seconds_per_op();
        }
        ceilings.push(base / least);
        floors.push(least);
    }
    let cpu = match spent {
        Some(spent) if rounds > 0 && n > 0 => {
            let ops = (rounds * n) as f64;
            by_name(processes, |k| {
                spent[k] as f64 / clock_ticks_per_second() / ops
            })
        }
        _ => Vec::new(),
    };
    Ok((
        pairs,
        Ceiling {
            ratio: super::stats::median(&ceilings).unwrap_or(f64::NAN),
            floor: super::stats::median(&floors).unwrap_or(f64::NAN),
            cpu,
        },
    ))
}

/// `value(k)` of each of `processes`, summed per name, in the order each name first appears.
fn by_name(processes: &[Metered], value: impl Fn(usize) -> f64) -> Vec<(String, f64)> {
    let mut groups: Vec<(String, f64)> = Vec::new();
    for (k, process) in processes.iter().enumerate() {
        match groups.iter_mut().find(|(name, _)| *name == process.name) {
            Some((_, sum)) => *sum += value(k),
            None => groups.push((process.name.clone(), value(k))),
        }
    }
    groups
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

/// A process whose CPU time a row charges to its operations, with the children it reaps if
/// asked (a PostgreSQL server's backends): see [`process_ticks`].
#[derive(Debug, Clone)]
pub struct Metered {
    /// What it is, in the row's note (`the replicas`, `PostgreSQL`): processes with one name are
    /// summed.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Whether its children count too (a server's backends); never for a process whose
    /// children are metered on their own (this bench, which starts the servers).
    pub children: bool,
}

/// CPU time per operation of one named group of processes, in seconds: during the figure's
/// batches and during the baseline's.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessCpu {
    /// The group's name.
    pub name: String,
    /// Seconds of CPU per operation of the figure's batches.
    pub figure: f64,
    /// Seconds of CPU per operation of the baseline's batches.
    pub baseline: f64,
}

/// What [`rounds_with_cpu`] measured besides the pairs.
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    /// Busy cores of the whole machine.
    pub cores: CoresBusy,
    /// CPU time per operation of each group of [`Metered`] processes, in the order first named
    /// (empty where `/proc` cannot be read).
    pub per_op: Vec<ProcessCpu>,
}

/// CPU time of process `pid` in clock ticks (`/proc/PID/stat`): its own user and system time
/// (all its threads) and, `with_children`, that of the children it reaped and of its live
/// children, so a server's per-connection processes count whether or not they exited meanwhile.
pub fn process_ticks(pid: u32, with_children: bool) -> Option<u64> {
    let own = stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    if !with_children {
        return Some(own.0);
    }
    let mut children = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        if stat_parent(&stat) == Some(pid) {
            children += stat_ticks(&stat).map_or(0, |(_, with_reaped)| with_reaped);
        }
    }
    Some(own.1 + children)
}

/// The fields of a `/proc/PID/stat` line after the command name (which may hold spaces and
/// parentheses): field 3 (`state`) first.
fn stat_fields(stat: &str) -> impl Iterator<Item = &str> {
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
}

fn stat_parent(stat: &str) -> Option<u32> {
    stat_fields(stat).nth(1)?.parse().ok()
}

/// `(utime + stime, utime + stime + cutime + cstime)` of a `/proc/PID/stat` line.
fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // Fields 14-17 (utime stime cutime cstime) are the 12th to 15th after the name.
    let times: Vec<u64> = stat_fields(stat)
        .skip(11)
        .take(4)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let [utime, stime, cutime, cstime] = times[..] else {
        return None;
    };
    Some((utime + stime, utime + stime + cutime + cstime))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Ticks of each metered process; `None` if any cannot be read.
fn metered_ticks(processes: &[Metered]) -> Option<Vec<u64>> {
    processes
        .iter()
        .map(|p| process_ticks(p.pid, p.children))
        .collect()
}

/// [`rounds`], also measuring the machine's busy cores during each side's batches (every
/// process counts: the servers, the database, the clients, and anything else running), and the
/// CPU time per operation of each of `processes` on each side.
pub async fn rounds_with_cpu(
    rounds: usize,
    n: usize,
    figure: &mut Batch<'_>,
    baseline: &mut Batch<'_>,
    processes: &[Metered],
) -> BenchResult<(Pairs, Cpu)> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let mut pairs = Pairs::new();
    let mut busy = [(0u64, 0u64); 2];
    let mut known = true;
    let mut spent = [vec![0u64; processes.len()], vec![0u64; processes.len()]];
    let mut metered_known = true;
    for _ in 0..rounds {
        let mut got = [None, None];
        for side in 0..2 {
            let before = cpu_ticks();
            let before_processes = metered_ticks(processes);
            let quantity = if side == 0 {
                figure.run(n).await?
            } else {
                baseline.run(n).await?
            };
            match (before, cpu_ticks()) {
                (Some((b0, t0)), Some((b1, t1))) => {
                    busy[side].0 += b1.saturating_sub(b0);
                    busy[side].1 += t1.saturating_sub(t0);
                }
                _ => known = false,
            }
            match (before_processes, metered_ticks(processes)) {
                (Some(b), Some(a)) => {
                    for (k, (b, a)) in b.iter().zip(&a).enumerate() {
                        spent[side][k] += a.saturating_sub(*b);
                    }
                }
                _ => metered_known = false,
            }
            got[side] = Some(quantity);
        }
        if let [Some(a), Some(b)] = got {
            pairs.push(a, b);
        }
    }
    let share = |(b, t): (u64, u64)| (t > 0).then(|| cores * b as f64 / t as f64);
    let cores_busy = match (known, share(busy[0]), share(busy[1])) {
        (true, Some(f), Some(b)) => Some((f, b)),
        _ => None,
    };
    let mut per_op: Vec<ProcessCpu> = Vec::new();
    if metered_known && rounds > 0 && n > 0 {
        let ops = (rounds * n) as f64;
        let seconds = |ticks: u64| ticks as f64 / clock_ticks_per_second() / ops;
        let figure = by_name(processes, |k| seconds(spent[0][k]));
        let baseline = by_name(processes, |k| seconds(spent[1][k]));
        per_op = figure
            .into_iter()
            .zip(baseline)
            .map(|((name, figure), (_, baseline))| ProcessCpu {
                name,
                figure,
                baseline,
            })
            .collect();
    }
    Ok((
        pairs,
        Cpu {
            cores: cores_busy,
            per_op,
        },
    ))
}

/// What a row's note says of the CPU time per operation measured by [`rounds_with_cpu`]: the
/// total of every metered group, then each group, for each side.
pub fn cpu_per_op_note(per_op: &[ProcessCpu], figure: &str, baseline: &str) -> String {
    if per_op.is_empty() {
        return String::new();
    }
    let side = |pick: fn(&ProcessCpu) -> f64| {
        let total: f64 = per_op.iter().map(pick).sum();
        let parts: Vec<String> = per_op
            .iter()
            .map(|p| format!("{} {:.2}", p.name, pick(p) * 1e3))
            .collect();
        format!("{:.2} ms ({})", total * 1e3, parts.join(", "))
    };
    format!(
        "; CPU time per operation (/proc/PID/stat of each process, in ms): {} with {figure}, \
         {} with {baseline}",
        side(|p| p.figure),
        side(|p| p.baseline)
    )
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
        let (pairs, ceiling) =
            rounds_with_ceiling(2, 7, &mut figure, &mut baseline, &mut floor, &[])
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
            (ceiling.ratio - expected).abs() < 1e-12,
            "{ceiling:?}: ratio {expected} wanted"
        );
        // The floors: 3 x 10 ms + 5 ms and 3 x 5 ms + 5 ms, per operation.
        let expected = (0.035 + 0.020) / 2.0;
        assert!(
            (ceiling.floor - expected).abs() < 1e-12,
            "{ceiling:?}: floor {expected} wanted"
        );
        assert_eq!(ceiling.cpu, [], "no process metered");
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
        let (pairs, cpu) = rounds_with_cpu(3, 1, &mut spin, &mut sleep, &[])
            .await
            .unwrap();
        assert_eq!(pairs.summary().expect("three rounds").rounds, 3);
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        let (f, b) = cpu.cores.expect("Linux has /proc/stat");
        assert_eq!(cpu.per_op, [], "no process metered");
        for busy in [f, b] {
            assert!((0.0..=cores).contains(&busy), "{busy} of {cores} cores");
        }
        let note = cpu_note(Some((1.5, 0.25)), "the spins", "the sleeps");
        let wanted = format!("1.50 of {cores} cores during the spins, 0.25 during the sleeps");
        assert!(note.ends_with(&wanted), "{note}");
        assert_eq!(cpu_note(None, "a", "b"), "");
    }

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        // pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ...
        let line = |comm: &str| {
            format!("4242 ({comm}) S 17 4242 4242 0 -1 4194560 100 0 0 0 30 12 5 2 20 0 1 0")
        };
        for comm in ["postgres", "a) S 9 9 (b", "two words", ")"] {
            let stat = line(comm);
            assert_eq!(stat_parent(&stat), Some(17), "{comm}");
            assert_eq!(stat_ticks(&stat), Some((42, 49)), "{comm}");
        }
        assert_eq!(stat_ticks("4242 (short) S 1 2 3"), None);
    }

    /// A shell whose child loops on the CPU: the shell is metered, the child's time counts.
    struct Spinner {
        shell: std::process::Child,
        child: u32,
    }

    impl Spinner {
        fn start() -> Spinner {
            let mut shell = std::process::Command::new("sh")
                .args(["-c", "sh -c 'while :; do :; done' & echo $!; wait"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(shell.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            let spinner = Spinner {
                shell,
                child: line.trim().parse().unwrap(),
            };
            spinner.signal(libc::SIGSTOP);
            spinner
        }

        fn signal(&self, signal: libc::c_int) {
            // SAFETY: kill takes a pid and a signal number; the child is ours.
            assert_eq!(unsafe { libc::kill(self.child as libc::pid_t, signal) }, 0);
        }
    }

    impl Drop for Spinner {
        fn drop(&mut self) {
            self.signal(libc::SIGKILL);
            let _ = self.shell.kill();
            let _ = self.shell.wait();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn cpu_per_operation_counts_a_metered_process_and_its_children() {
        let spinner = Spinner::start();
        let shell = spinner.shell.id();
        let (spinning, resting) = (&spinner, &spinner);
        let mut spin = Batch::Blocking(Box::new(move |_| {
            spinning.signal(libc::SIGCONT);
            std::thread::sleep(std::time::Duration::from_millis(150));
            spinning.signal(libc::SIGSTOP);
            Ok(1.0)
        }));
        let mut rest = Batch::Blocking(Box::new(move |_| {
            let _ = resting;
            std::thread::sleep(std::time::Duration::from_millis(150));
            Ok(1.0)
        }));
        let metered = |name: &str, children| Metered {
            name: name.into(),
            pid: shell,
            children,
        };
        let processes = [
            metered("spinner", true),
            metered("shell", false),
            metered("spinner", true),
        ];
        let (_, cpu) = rounds_with_cpu(2, 5, &mut spin, &mut rest, &processes)
            .await
            .unwrap();
        drop((spin, rest));
        let [spinner, shell] = &cpu.per_op[..] else {
            panic!("one group per name, in order: {:?}", cpu.per_op)
        };
        assert_eq!((&*spinner.name, &*shell.name), ("spinner", "shell"));
        // The spinning child counts twice (two entries of one name) over 10 operations, about
        // 2 x 300 ms / 10 (less on a busy machine); the shell alone only waits.
        assert!(spinner.figure > 0.0, "{spinner:?}");
        assert!(spinner.baseline < spinner.figure, "{spinner:?}");
        assert!(shell.figure < spinner.figure, "{shell:?} {spinner:?}");
        let note = cpu_per_op_note(&cpu.per_op, "spinning", "resting");
        assert!(note.contains(" ms (spinner "), "{note}");
        assert!(note.contains(", shell "), "{note}");
        assert_eq!(cpu_per_op_note(&[], "a", "b"), "");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_ceiling_meters_the_cpu_of_the_figures_batches() {
        let spinner = Spinner::start();
        let shell = spinner.shell.id();
        let spinning = &spinner;
        let mut spin = Batch::Blocking(Box::new(move |_| {
            spinning.signal(libc::SIGCONT);
            std::thread::sleep(std::time::Duration::from_millis(150));
            spinning.signal(libc::SIGSTOP);
            Ok(1.0)
        }));
        let rest = || {
            Batch::Blocking(Box::new(|_| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                Ok(100.0)
            }))
        };
        let mut baseline = rest();
        let mut floor = Floor {
            baseline: 3.0,
            others: vec![(rest(), 1.0)],
        };
        let metered = |name: &str, children| Metered {
            name: name.into(),
            pid: shell,
            children,
        };
        let processes = [metered("spinner", true), metered("shell", false)];
        let (_, ceiling) =
            rounds_with_ceiling(2, 5, &mut spin, &mut baseline, &mut floor, &processes)
                .await
                .unwrap();
        drop((spin, baseline, floor));
        let [(spinner, spun), (shell, waited)] = &ceiling.cpu[..] else {
            panic!("one group per name, in order: {:?}", ceiling.cpu)
        };
        assert_eq!((&**spinner, &**shell), ("spinner", "shell"));
        // The spinning child ran during the figure's batches (about 300 ms over 10 operations,
        // less on a busy machine); the shell only waits.
        assert!(*spun > 0.0 && waited < spun, "{:?}", ceiling.cpu);
        // Three of the baseline's 10 ms operations and one of the other's 10 ms.
        assert!((ceiling.floor - 0.04).abs() < 1e-9, "{ceiling:?}");
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
