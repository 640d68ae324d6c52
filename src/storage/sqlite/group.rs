//! Group commit for a [`Store`](super::Store)'s writers: the writes of this process that queue
//! while one runs share its transaction and its commit (one `fsync` for all of them).
//!
//! ## Guarantees
//! - A write returns `Ok` only once the `COMMIT` holding it returned: what it wrote is durable
//!   before its caller acts on it, exactly as with a transaction of its own.
//! - Each write runs in a savepoint of the shared transaction: a write whose closure fails is
//!   rolled back alone and answers its own error; the others still commit.
//! - A failed `COMMIT` answers every write of that transaction with the error, none of them
//!   recorded.
//! - With nobody queued, a write commits at once: one writer pays no latency for batching.
//! - Other processes on the same file meet SQLite's lock (`BEGIN IMMEDIATE` and the busy
//!   timeout), as before.
//!
//! ## How
//! One write connection under a mutex. A writer takes the mutex, opens the transaction if none
//! is open, runs its closure in a savepoint, and then commits, unless another writer is queued
//! on the mutex and the transaction holds fewer than [`MAX_WRITES`]: then it leaves the
//! transaction open for that writer and waits on a condition variable for the commit that will
//! hold its write. The last writer of a batch always commits, so every open transaction is
//! committed by a writer that is running.

use super::Savepoint;
use rusqlite::Connection;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The most writes one transaction takes before its writer commits regardless.
const MAX_WRITES: usize = 64;

/// The write side of a store: its connection, the open transaction, the outcomes waited for.
#[derive(Debug, Default)]
pub(super) struct GroupCommit {
    side: Mutex<Side>,
    committed: Condvar,
    /// Writers waiting for the mutex (a writer seeing one leaves its transaction open).
    queued: AtomicUsize,
}

#[derive(Debug, Default)]
struct Side {
    conn: Option<Connection>,
    /// The open transaction: its number and how many writes it holds.
    open: Option<(u64, usize)>,
    next: u64,
    /// Transactions with writers waiting: how many, and the commit's outcome once known.
    waiting: HashMap<u64, (usize, Option<Result<(), String>>)>,
}

/// Why a write did not commit.
pub(super) enum Failed<E> {
    /// Its closure's error (its savepoint was rolled back).
    Write(E),
    /// The write connection could not be opened.
    Open(super::StoreError),
    /// SQLite's error on the write connection.
    Sql(rusqlite::Error),
    /// The shared commit failed (the message of SQLite's error).
    Commit(String),
}

impl GroupCommit {
    /// Runs `f` in a savepoint of the shared transaction on the write connection (opened with
    /// `connect` when there is none) and returns once its commit returned.
    pub(super) fn write<R, E>(
        &self,
        connect: impl FnOnce() -> Result<Connection, super::StoreError>,
        f: impl FnOnce(&Connection) -> Result<R, E>,
    ) -> Result<R, Failed<E>> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut side = self.side.lock().unwrap_or_else(|p| p.into_inner());
        self.queued.fetch_sub(1, Ordering::SeqCst);
        if side.conn.is_none() {
            side.conn = Some(connect().map_err(Failed::Open)?);
        }
        let epoch = match side.open {
            Some((epoch, _)) => epoch,
            None => {
                let conn = side.conn.as_ref().expect("connected above");
                if let Err(e) = super::begin_immediate(conn) {
                    drop_if_broken(&mut side);
                    return Err(Failed::Sql(e));
                }
                let epoch = side.next;
                side.next += 1;
                side.open = Some((epoch, 0));
                epoch
            }
        };
        let ran = {
            let conn = side.conn.as_ref().expect("connected above");
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_in_savepoint(conn, f)))
        };
        let ran = match ran {
            Ok(ran) => ran,
            Err(panic) => {
                // Its savepoint is rolled back; the writes before it still get their commit.
                let _ = self.finish(side, epoch, false);
                std::panic::resume_unwind(panic);
            }
        };
        let value = match ran {
            Ok(value) => value,
            Err(Failed::Write(e)) => {
                // Rolled back alone; the transaction stays usable for the writes it holds.
                let _ = self.finish(side, epoch, false);
                return Err(Failed::Write(e));
            }
            Err(other) => {
                // The savepoint could not be closed: the whole transaction is rolled back.
                self.abort(side, epoch, &other);
                return Err(other);
            }
        };
        match self.finish(side, epoch, true) {
            Ok(()) => Ok(value),
            Err(message) => Err(Failed::Commit(message)),
        }
    }

    /// After a write of transaction `epoch`: commits it (and answers its waiters), or, with
    /// another writer queued, leaves it open and, when `wait`, waits for its outcome.
    fn finish(&self, mut side: MutexGuard<'_, Side>, epoch: u64, wait: bool) -> Result<(), String> {
        let writes = {
            let open = side.open.as_mut().expect("a transaction is open");
            open.1 += 1;
            open.1
        };
        if self.queued.load(Ordering::SeqCst) > 0 && writes < MAX_WRITES {
            if !wait {
                return Ok(());
            }
            side.waiting.entry(epoch).or_insert((0, None)).0 += 1;
            loop {
                side = self.committed.wait(side).unwrap_or_else(|p| p.into_inner());
                let entry = side.waiting.get_mut(&epoch).expect("registered above");
                if let Some(outcome) = entry.1.clone() {
                    entry.0 -= 1;
                    if entry.0 == 0 {
                        side.waiting.remove(&epoch);
                    }
                    return outcome;
                }
            }
        }
        let conn = side.conn.as_ref().expect("connected");
        let outcome = super::commit(conn).map_err(|e| {
            let _ = super::rollback(conn);
            e.to_string()
        });
        side.open = None;
        if outcome.is_err() {
            drop_if_broken(&mut side);
        }
        if let Some(entry) = side.waiting.get_mut(&epoch) {
            entry.1 = Some(outcome.clone());
            self.committed.notify_all();
        }
        outcome
    }

    /// Rolls the open transaction back and answers its waiters with `why`.
    fn abort<E>(&self, mut side: MutexGuard<'_, Side>, epoch: u64, why: &Failed<E>) {
        let message = match why {
            Failed::Sql(e) => e.to_string(),
            Failed::Open(e) => e.to_string(),
            Failed::Commit(m) => m.clone(),
            Failed::Write(_) => "a write failed".to_string(),
        };
        if let Some(conn) = side.conn.as_ref() {
            let _ = super::rollback(conn);
        }
        side.open = None;
        drop_if_broken(&mut side);
        if let Some(entry) = side.waiting.get_mut(&epoch) {
            entry.1 = Some(Err(format!("rolled back with another write: {message}")));
            self.committed.notify_all();
        }
    }
}

/// Runs `f` in a savepoint: released when it returns `Ok`, rolled back when it returns `Err`.
/// A panic inside `f` rolls the savepoint back (the guard below) before it unwinds.
fn run_in_savepoint<R, E>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<R, E>,
) -> Result<R, Failed<E>> {
    struct Unwinding<'c>(Option<Savepoint<'c>>);
    impl Drop for Unwinding<'_> {
        fn drop(&mut self) {
            if let Some(mark) = self.0.take() {
                let _ = mark.end(false);
            }
        }
    }
    let mark = Savepoint::begin(conn, "store_write").map_err(Failed::Sql)?;
    let mut guard = Unwinding(Some(mark));
    let value = f(conn);
    let mark = guard.0.take().expect("taken once, here");
    mark.end(value.is_ok()).map_err(Failed::Sql)?;
    value.map_err(Failed::Write)
}

/// A connection left inside a transaction it could not end is dropped; the next write opens a
/// fresh one.
fn drop_if_broken(side: &mut Side) {
    if side.conn.as_ref().is_some_and(|c| !c.is_autocommit()) {
        side.conn = None;
    }
}
