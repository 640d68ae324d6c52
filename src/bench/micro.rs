//! In-process pairs: the rule core's per-call work beside the plain serde_json work it adds to.
//!
//! Each side runs in batches of many iterations (sized to take a few milliseconds each),
//! alternating figure and baseline batch after batch. Batches are timed in the thread's CPU time,
//! so time the scheduler gives to other processes on a shared machine is not counted.

use super::fixtures;
use super::stats::{PairSummary, Pairs, Quantity};
use crate::{canonical, shape};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::hint::black_box;
use std::time::Duration;

/// How long each batch should take, and how many rounds to run.
#[derive(Debug, Clone, Copy)]
pub struct MicroPlan {
    /// Rounds of figure-then-baseline batches.
    pub rounds: usize,
    /// Target wall time of one batch.
    pub batch: Duration,
}

/// Shape extraction of a Codex-sized `_meta` (already parsed, as a server holds it) beside
/// serde_json parsing the same `_meta` text.
pub fn shape_extraction(plan: MicroPlan) -> PairSummary {
    let text = fixtures::codex_meta_text(7);
    let meta: Value = serde_json::from_str(&text).expect("fixture parses");
    let digester = shape::Digester::Plain;
    paired(
        plan,
        || {
            black_box(shape::meta_shape(black_box(&meta), &digester));
        },
        || {
            black_box(serde_json::from_str::<Value>(black_box(&text)).expect("parses"));
        },
    )
}

/// The request hash (RFC 8785 canonical JSON + SHA-256) of `generate_image` arguments beside
/// `serde_json::to_vec` of the same arguments + SHA-256.
pub fn request_hash(plan: MicroPlan) -> PairSummary {
    let arguments = fixtures::generate_image_arguments();
    paired(
        plan,
        || {
            black_box(
                canonical::request_hash("generate_image", black_box(&arguments)).expect("hashes"),
            );
        },
        || {
            let bytes = serde_json::to_vec(black_box(&arguments)).expect("serializes");
            black_box(Sha256::digest(&bytes));
        },
    )
}

/// Runs `figure` and `baseline` in alternating batches and summarizes time per operation.
pub fn paired(
    plan: MicroPlan,
    mut figure: impl FnMut(),
    mut baseline: impl FnMut(),
) -> PairSummary {
    let figure_n = calibrate(&mut figure, plan.batch);
    let baseline_n = calibrate(&mut baseline, plan.batch);
    let mut pairs = Pairs::new();
    for _ in 0..plan.rounds.max(1) {
        let a = time_batch(&mut figure, figure_n);
        let b = time_batch(&mut baseline, baseline_n);
        pairs.push(Quantity::SecondsPerOp(a), Quantity::SecondsPerOp(b));
    }
    pairs.summary().expect("at least one round")
}

/// Iterations that take about `batch`, after a warm-up.
fn calibrate(op: &mut impl FnMut(), batch: Duration) -> u64 {
    let warm_up = (batch / 4).as_secs_f64();
    let start = thread_cpu_seconds();
    let mut n = 0u64;
    while thread_cpu_seconds() - start < warm_up || n < 8 {
        op();
        n += 1;
    }
    let per_op = ((thread_cpu_seconds() - start) / n as f64).max(1e-9);
    ((batch.as_secs_f64() / per_op) as u64).max(1)
}

/// Seconds per operation, in this thread's CPU time: a batch that the scheduler preempts on a
/// busy machine is not charged for the time other processes ran.
fn time_batch(op: &mut impl FnMut(), n: u64) -> f64 {
    let start = thread_cpu_seconds();
    for _ in 0..n {
        op();
    }
    (thread_cpu_seconds() - start) / n as f64
}

/// CPU time consumed by the calling thread (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant Linux defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is available on Linux");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_that_does_twice_the_work_measures_about_twice_the_time() {
        let plan = MicroPlan {
            rounds: 7,
            batch: Duration::from_millis(2),
        };
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let summary = paired(
            plan,
            || {
                black_box(Sha256::digest(black_box(&data)));
                black_box(Sha256::digest(black_box(&data)));
            },
            || {
                black_box(Sha256::digest(black_box(&data)));
            },
        );
        assert_eq!(summary.rounds, 7);
        assert!(
            (1.3..3.0).contains(&summary.ratio),
            "two hashes against one: ratio {}",
            summary.ratio
        );
    }
}
