//! Checkpoints off the committing thread: one [`Checkpointer`] per file per process copies the
//! WAL back into the database file on a thread and a connection of its own.
//!
//! ## Guarantees
//! - A commit never waits for a checkpoint below [`WAL_BOUND`] frames: SQLite's own automatic
//!   checkpoint (run by the committing connection after its commit, with its `fsync`s) starts
//!   only at [`WAL_BOUND`], not at SQLite's default of 1000 frames. Every
//!   [`CHECKPOINT_EVERY`] commits of this process on the file, the checkpointer runs `PASSIVE`
//!   checkpoints instead, which never wait for a reader or a writer and never make one wait,
//!   then one `RESTART` that takes the write lock only when it is free: a write that begins
//!   during it waits in SQLite's busy handler (a millisecond, rarely), the one place a writer
//!   can meet the checkpointer.
//! - The WAL stays bounded: a checkpointer that falls behind or fails leaves the committing
//!   connections to SQLite's automatic checkpoint at [`WAL_BOUND`] frames (16 MiB of 4 KiB
//!   pages), the bound SQLite keeps by default at 1000. A reader that holds a snapshot open stops
//!   both, as it always did.
//! - Durability is SQLite's: a checkpoint copies committed frames only, and one cut short (the
//!   process killed) is finished by the next opener's recovery. When the last connection of the
//!   process closes, the checkpointer's thread has ended and closed its own connection first, so
//!   that close checkpoints the file and removes its `-wal`, as before.

use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

/// Commits of this process on one file between two background checkpoints. A new operation
/// commits twice in the registry (about 19 WAL frames) and once in the provider ledger (3): a
/// checkpoint copies back a few hundred frames, not one per commit.
pub(super) const CHECKPOINT_EVERY: u64 = 64;

/// Frames of WAL at which a committing connection checkpoints itself (`wal_autocheckpoint`):
/// reached only when the checkpointer falls behind.
pub(super) const WAL_BOUND: i64 = 4096;

/// The checkpointer of each file this process has open, by path.
static CHECKPOINTERS: Mutex<Option<HashMap<PathBuf, Weak<Checkpointer>>>> = Mutex::new(None);

/// One file's background checkpoints: a counter of commits, and a thread started at the first
/// checkpoint due, which ends when the last connection that counts commits is dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    path: PathBuf,
    commits: AtomicU64,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// A checkpoint is due.
    due: bool,
    /// The last connection is gone: the thread ends.
    stop: bool,
}

/// Sets `conn` (a read-write connection to the file at `path`) to checkpoint itself only at
/// [`WAL_BOUND`] and to count its commits towards the file's background checkpoint.
pub(super) fn attach(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", WAL_BOUND)?;
    let checkpointer = Checkpointer::of(path);
    conn.commit_hook(Some(move || {
        checkpointer.committed();
        false
    }));
    Ok(())
}

impl Checkpointer {
    /// The checkpointer of the file at `path`, shared by this process's connections to it.
    fn of(path: &Path) -> Arc<Checkpointer> {
        let mut all = CHECKPOINTERS.lock().unwrap_or_else(|p| p.into_inner());
        let all = all.get_or_insert_with(HashMap::new);
        all.retain(|_, c| c.strong_count() > 0);
        if let Some(existing) = all.get(path).and_then(Weak::upgrade) {
            return existing;
        }
        let fresh = Arc::new(Checkpointer {
            path: path.to_path_buf(),
            commits: AtomicU64::new(0),
            shared: Arc::default(),
            thread: Mutex::new(None),
        });
        all.insert(path.to_path_buf(), Arc::downgrade(&fresh));
        fresh
    }

    /// Called as a transaction commits: every [`CHECKPOINT_EVERY`]th wakes the thread.
    fn committed(&self) {
        if !(self.commits.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(CHECKPOINT_EVERY) {
            return;
        }
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let (path, shared) = (self.path.clone(), Arc::clone(&self.shared));
            // A thread that cannot start leaves the file to SQLite's checkpoint at WAL_BOUND.
            *thread = std::thread::Builder::new()
                .name("sqlite-checkpoint".into())
                .stack_size(256 * 1024)
                .spawn(move || run(&path, &shared))
                .ok();
        }
        drop(thread);
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.due = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            state.stop = true;
            self.shared.wake.notify_one();
        }
        let thread = self.thread.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = thread.take() {
            let _ = thread.join();
        }
    }
}

/// The checkpointer's thread: a `PASSIVE` checkpoint each time one is due, on a connection of
/// its own opened at the first. A failed one (the file gone, a checkpoint already running) is
/// left to the next, or to SQLite's at [`WAL_BOUND`].
fn run(path: &Path, shared: &Shared) {
    let mut conn: Option<Connection> = None;
    loop {
        {
            let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            while !state.due && !state.stop {
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.due = false;
        }
        if conn.is_none() {
            conn = Connection::open_with_flags(
                super::plain(path),
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .ok()
            .filter(|c| c.busy_timeout(std::time::Duration::ZERO).is_ok());
        }
        if let Some(conn) = &conn {
            catch_up(conn);
        }
    }
}

/// `PASSIVE` checkpoints until one finds no frame added since the one before, at most
/// [`PASSES`]; then one `RESTART` that waits for nobody. The commit that made a checkpoint due
/// is still being written when the first pass starts, and SQLite completes a checkpoint (syncs
/// the file) only when it copied every frame there is when it ends: the next pass copies what
/// came meanwhile. A pass with nothing to copy writes nothing. A completed checkpoint lets a
/// write that starts after it begin the WAL again from its start, but under steady load a write
/// has always begun before, so the WAL would grow to [`WAL_BOUND`] and be restarted by a
/// committing connection; the `RESTART`, when no writer holds the lock (this connection's busy
/// timeout is zero, so it never waits; it holds the lock while it copies what the passes left,
/// usually nothing) and no reader reads an old snapshot, starts it over at once.
fn catch_up(conn: &Connection) {
    let mut before = None;
    for _ in 0..PASSES {
        let logged = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1));
        match logged {
            Ok(logged) if before != Some(logged) => before = Some(logged),
            Ok(_) => {
                let _ = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()));
                return;
            }
            Err(_) => return,
        }
    }
}

/// How many `PASSIVE` checkpoints one due checkpoint runs at most: a reader that holds an old
/// snapshot keeps frames from being copied, and writers keep adding them.
const PASSES: usize = 4;
