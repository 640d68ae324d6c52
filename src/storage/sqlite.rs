//! How callid opens every SQLite file it owns: [`open_connection`] and the pooled [`Store`].
//!
//! One discipline for all five files: the router's registry, its preallocated key pool, the
//! backend's `authorization.sqlite3` and `execution.sqlite3`, and the provider ledger. Each kind is
//! described by a [`StoreSpec`] (its name, `application_id` and migrations), declared in
//! [`super::schema`]; everything else (how the file is created, identified, protected, migrated
//! and configured) is decided here, once. A file's rows are copied into another only here too
//! ([`Store::import`]).
//!
//! ## Durability
//! WAL journal with `synchronous=FULL`: a transaction that returned from `COMMIT` survives a
//! `kill -9` of the process and a power cut. Callers commit before they reply or act on a result.
//! Checkpoints (the WAL copied back into the file) run on a thread of their own, one per file
//! ([`checkpoint`]): a commit does not wait for one while the WAL is under its bound.
//! Read-write connections go through callid's own VFS ([`vfs`]): SQLite's `unix` VFS, except
//! that the WAL frames of a commit reach the kernel in one write at its sync, not in two writes
//! per frame; what a commit guarantees does not change.
//! A path is always a plain file path: SQLite's URI syntax is never interpreted, so
//! `file:x?mode=memory` is a file literally named so in the current directory, not an in-memory
//! database that would lose every row.
//!
//! ## Concurrency
//! Every write runs in an `IMMEDIATE` transaction, so two writers (threads of this process or other
//! processes on the same file) never both read "absent" and both insert. Each connection waits up to
//! [`BUSY_TIMEOUT`] for a lock before it gives up with an error. The first-open steps (inspection,
//! the switch to WAL, the migration) also run where SQLite's busy handler does not reach (a
//! journal-mode change racing another opener answers `SQLITE_BUSY` at once): they are retried on
//! `SQLITE_BUSY`/`SQLITE_LOCKED` until the same deadline, so any number of processes may create one
//! fresh file at once. A [`Store`] pools connections for reads; its writes go through one write
//! connection with group commit ([`group`]): the writes of this process queue in order on a mutex
//! (never in SQLite's sleeping busy handler), those queued while one runs share its transaction,
//! each in a savepoint of its own, and every one returns only once that transaction committed.
//!
//! ## Compatibility
//! Each kind of file has its own `application_id`; its schema version is `user_version`, and
//! migrations are append-only and run in one `EXCLUSIVE` transaction. A file whose
//! `application_id` belongs to someone else, a non-empty database without one, a file that is not
//! SQLite, or a file from a newer callid is refused and never modified: it is inspected through a
//! read-only connection (which cannot checkpoint a `-wal` into it) before any statement runs on a
//! connection that could write (the writability check below opens one and runs nothing on it).
//!
//! ## Permissions
//! These files hold private operation keys and idempotency keys. A file callid creates is `0600`
//! (missing parent directories `0700`), and SQLite gives its `-wal` and `-shm` the same mode. An
//! existing file (an empty one included) or a leftover `-wal`, `-shm` or `-journal` that other users
//! may read or write is refused before SQLite opens it (so no `-wal` or `-shm` is created with its
//! mode), with the `chmod 600` to run; only a file that already has its `-wal` is inspected first,
//! so that a file that is not ours says so.
//!
//! A file opened to be written ([`Create::IfMissing`]) that this process cannot write, or whose
//! directory it cannot write, is refused too, before SQLite runs anything on it, with the fix
//! (`chmod u+w`); once open, a real write (rolled back) proves it: SQLite opens a file it may
//! only read without an error and grants it `BEGIN IMMEDIATE`, and fails only at the first
//! write. Nothing is created or changed beside a refused file.

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a connection waits for another connection's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many prepared statements each connection keeps ([`Cached`]): more than any file's
/// writers run, so a write never parses its SQL again.
const STATEMENT_CACHE: usize = 64;

/// How many idle connections a store keeps for reuse.
const MAX_IDLE: usize = 8;

/// The files SQLite keeps beside a database, by suffix.
const SIDE_FILES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// `execute` and `query_row` through the connection's prepared-statement cache. Every statement
/// on a write path goes through here: parsing its SQL again cost a group commit more than running
/// it (`callid bench --only router_concurrent`, profiled with `perf record`).
pub trait Cached {
    /// [`Connection::execute`], with the statement prepared once per connection.
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// [`Connection::query_row`], with the statement prepared once per connection.
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// A named SQL savepoint inside an open transaction: released by `end(true)`, rolled back then
/// released by `end(false)`. Its statements are prepared once per connection ([`Cached`]). The
/// one savepoint of every transaction callid shares between writes (the registry's group
/// commit and a spender's stage, [`Store::write`]'s group commit).
pub struct Savepoint<'c> {
    conn: &'c Connection,
    name: &'static str,
}

impl<'c> Savepoint<'c> {
    /// `SAVEPOINT name` on `conn`.
    pub fn begin(conn: &'c Connection, name: &'static str) -> rusqlite::Result<Savepoint<'c>> {
        conn.exec(&format!("SAVEPOINT {name}"), [])?;
        Ok(Savepoint { conn, name })
    }

    /// Keeps what was written since [`Savepoint::begin`] (`keep`), or rolls it back.
    pub fn end(self, keep: bool) -> rusqlite::Result<()> {
        if !keep {
            self.conn.exec(&format!("ROLLBACK TO {}", self.name), [])?;
        }
        self.conn
            .exec(&format!("RELEASE {}", self.name), [])
            .map(|_| ())
    }
}

/// An `IMMEDIATE` transaction on a connection whose `BEGIN IMMEDIATE`, `COMMIT` and `ROLLBACK`
/// are prepared once per connection ([`Cached`]); rusqlite's `Transaction` and `execute_batch`
/// parse each again on every use (about 8,000 instructions per new operation, 1%, callgrind).
/// Rolled back when dropped without a successful [`Immediate::commit`], like
/// rusqlite's; the open transaction's statements run on it through `Deref`.
pub struct Immediate<'c> {
    conn: &'c Connection,
}

impl<'c> Immediate<'c> {
    /// `BEGIN IMMEDIATE` on `conn`.
    pub fn begin(conn: &'c Connection) -> rusqlite::Result<Immediate<'c>> {
        begin_immediate(conn)?;
        Ok(Immediate { conn })
    }

    /// `COMMIT`; on an error the transaction is rolled back (when dropped).
    pub fn commit(self) -> rusqlite::Result<()> {
        commit(self.conn)
    }
}

impl std::ops::Deref for Immediate<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = rollback(self.conn);
        }
    }
}

/// `BEGIN IMMEDIATE` through the statement cache (a transaction that stays open across calls,
/// as [`group`]'s, uses these three; one within a call, [`Immediate`]).
pub fn begin_immediate(conn: &Connection) -> rusqlite::Result<()> {
    conn.exec("BEGIN IMMEDIATE", []).map(drop)
}

/// `COMMIT` through the statement cache.
pub fn commit(conn: &Connection) -> rusqlite::Result<()> {
    conn.exec("COMMIT", []).map(drop)
}

/// `ROLLBACK` through the statement cache.
pub fn rollback(conn: &Connection) -> rusqlite::Result<()> {
    conn.exec("ROLLBACK", []).map(drop)
}

/// What a kind of store file is: its name in messages, its `application_id`, its migrations.
#[derive(Debug)]
pub struct StoreSpec {
    /// Human name of the file kind, used in messages (e.g. `provider ledger`).
    pub kind: &'static str,
    /// The `PRAGMA application_id` that marks a file of this kind.
    pub application_id: i32,
    /// Append-only schema migrations; migration `i` takes `user_version` from `i` to `i + 1`.
    pub migrations: &'static [&'static str],
}

impl StoreSpec {
    /// The schema version this build writes.
    pub fn latest_version(&self) -> i64 {
        self.migrations.len() as i64
    }
}

/// Why a store file cannot be opened or used. Each message names the file and its cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file or its directory could not be created or opened.
    #[error(
        "cannot create or open {kind} `{path}`: {cause}; check that the directory exists and is \
         writable"
    )]
    Io {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The file is not a database of this kind; it was left untouched.
    #[error(
        "{kind} `{path}` is not a callid {kind} ({detail}); it was left unmodified: point at a \
         new file instead"
    )]
    Foreign {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The file was written by a newer callid; it was left untouched.
    #[error(
        "{kind} `{path}` has schema version {found}, newer than the {supported} this callid \
         understands; it was left unmodified: upgrade callid"
    )]
    TooNew {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The file (or a journal beside it) is readable or writable by other users.
    #[error(
        "{kind} `{path}` is open to other users ({}); a {kind} holds private keys, so callid \
         does not use it (nor reads it): if it is callid's, run `chmod 600 {}`, then try again; \
         if it belongs to another program, leave it as it is and point callid at a new file",
        modes(.files), shell_words(.files)
    )]
    Permissions {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// Each offending file with its mode.
        files: Vec<(PathBuf, u32)>,
    },
    /// The file, or the directory SQLite keeps its journals in, cannot be written by this
    /// process; it was left untouched.
    #[error(
        "{kind} `{path}` cannot be written: {problem}; it was left unmodified: {fix}, then try \
         again"
    )]
    ReadOnly {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// What cannot be written, and the operating system's reason.
        problem: String,
        /// What to run or change.
        fix: String,
    },
    /// SQLite failed while opening, migrating, reading or writing the file.
    #[error("{kind} `{path}` cannot be read or written: {cause}")]
    Sqlite {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: rusqlite::Error,
    },
}

fn modes(files: &[(PathBuf, u32)]) -> String {
    files
        .iter()
        .map(|(f, mode)| format!("`{}` has mode {mode:04o}", f.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn shell_words(files: &[(PathBuf, u32)]) -> String {
    files
        .iter()
        .map(|(f, _)| shell_word(&f.display().to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` as one POSIX shell word: unchanged when it is plain, single-quoted otherwise.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,=@%:".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Whether [`open_connection`] may create a missing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Create the file (and its directory) when it does not exist.
    IfMissing,
    /// Only open an existing file (operator commands that read what a router wrote).
    Never,
}

/// An open store file: a pool of connections that all follow the discipline above.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    spec: &'static StoreSpec,
    idle: Mutex<Vec<Connection>>,
    /// [`Store::write`]'s connection and group commit: this process's writers queue on a mutex,
    /// not in SQLite's busy handler (which polls with growing sleeps, 1, 2, 5, 10, ... ms, and
    /// so let a file that commits in a fraction of a millisecond serve a few hundred writers a
    /// second), and the writes queued while one runs share its commit.
    writes: group::GroupCommit,
}

impl Store {
    /// Opens (creating and migrating when needed) the store file at `path`.
    pub fn open(path: &Path, spec: &'static StoreSpec) -> Result<Store, StoreError> {
        let first = open_connection(path, spec, Create::IfMissing)?;
        Ok(Store {
            path: path.to_path_buf(),
            spec,
            idle: Mutex::new(vec![first]),
            writes: group::GroupCommit::default(),
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wraps a SQLite error that happened on this store.
    pub fn error(&self, cause: rusqlite::Error) -> StoreError {
        sqlite(self.spec, &self.path, cause)
    }

    /// Runs `f` on a pooled connection (blocking; call it from a blocking thread in async code).
    pub fn with<R, E>(&self, f: impl FnOnce(&mut Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => connect(&self.path, self.spec)?,
        };
        let result = f(&mut conn);
        // A connection left inside a transaction (a panic is the only way) is dropped, not reused.
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        result
    }

    /// Runs `f` inside an `IMMEDIATE` transaction and returns once it is committed; when `f`
    /// returns `Err` nothing it wrote is kept. Writes of this process that queue meanwhile share
    /// one transaction and one commit, each in its own savepoint (see [`group`]).
    pub fn write<R, E>(&self, f: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        use group::Failed;
        self.writes
            .write(|| connect(&self.path, self.spec), f)
            .map_err(|failed| match failed {
                Failed::Write(e) => e,
                Failed::Open(e) => E::from(e),
                Failed::Sql(e) => E::from(self.error(e)),
                Failed::Commit(message) => {
                    E::from(self.error(other_error(format!("the commit failed: {message}"))))
                }
            })
    }

    /// Runs `f` on a connection outside any explicit transaction (single consistent reads).
    pub fn read<R, E>(&self, f: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        self.with(|conn| f(conn))
    }

    /// Copies the rows of `table` from the file at `path`, a file of kind `spec`, into this
    /// store's `table` in one transaction, the rows already here winning; returns how many were
    /// copied. The file is opened through its own kind's checks and migrations first (a corrupt,
    /// foreign or newer file is refused, untouched), so its columns are those of its latest
    /// schema, the order this store's copy of the table has too ([`super::schema::layers`]). Like
    /// every path here, `path` is a plain path, never a SQLite URI, whatever bytes its name holds.
    pub fn import(
        &self,
        path: &Path,
        spec: &'static StoreSpec,
        table: &str,
    ) -> Result<u64, StoreError> {
        drop(open_connection(path, spec, Create::Never)?);
        // The name goes to SQLite as the bytes of a plain path (bound as a blob, which SQLite
        // reads as text unchanged): never a URI, and a name that is not UTF-8 stays itself.
        use std::os::unix::ffi::OsStrExt as _;
        let name = plain(path);
        self.with(|conn| {
            conn.execute(
                "ATTACH DATABASE ?1 AS imported",
                [name.as_os_str().as_bytes()],
            )
            .map_err(|e| self.error(e))?;
            let result = conn
                .execute_batch(&format!(
                    "BEGIN IMMEDIATE; INSERT OR IGNORE INTO main.{table} SELECT * FROM imported.{table}; COMMIT;"
                ))
                .map_err(|e| self.error(e));
            if result.is_err() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let detached = conn.execute("DETACH DATABASE imported", []);
            result?;
            detached.map_err(|e| self.error(e))?;
            Ok(conn.changes())
        })
    }
}

/// Opens one connection to the store file at `path`: creates it when allowed (`0600`), refuses it
/// if it is foreign, newer or open to other users (inspected read-only, untouched), then switches
/// it to WAL and migrates it. The steps of the module's contract, in that order.
pub fn open_connection(
    path: &Path,
    spec: &'static StoreSpec,
    create: Create,
) -> Result<Connection, StoreError> {
    let io = |cause| StoreError::Io {
        kind: spec.kind,
        path: path.to_path_buf(),
        cause,
    };
    if create == Create::IfMissing {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            create_private_dir(parent).map_err(io)?;
        }
        create_private_file(path).map_err(io)?;
    }
    // Modes, then writability, are checked before SQLite opens the file: even a read-only
    // connection to a WAL file creates its `-shm` and `-wal` when the directory allows it (with the
    // file's mode), and the refusal must describe the files as the operator left them.
    let exposed = exposed_files(path);
    if !exposed.is_empty() {
        // With a `-wal` (and so a `-shm`) already there, the inspection creates nothing, and a
        // file that is not ours says so first: a `chmod` would not make it usable.
        if side_file(path, "-wal").exists() {
            inspect(path, spec)?;
        }
        return Err(StoreError::Permissions {
            kind: spec.kind,
            path: path.to_path_buf(),
            files: exposed,
        });
    }
    if create == Create::IfMissing {
        writable(path, spec)?;
    }
    inspect(path, spec)?;
    let mut conn = connect(path, spec)?;
    retry_busy(|| migrate(&mut conn, spec)).map_err(|e| sqlite(spec, path, e))?;
    if create == Create::IfMissing {
        retry_busy(|| probe_write(&mut conn)).map_err(|e| match e.sqlite_error_code() {
            Some(ErrorCode::ReadOnly) => {
                read_only(spec, path, format!("a write failed ({e})"), chmod_fix(path))
            }
            _ => sqlite(spec, path, e),
        })?;
    }
    Ok(conn)
}

/// Refuses a file this process cannot write, or one whose directory it cannot write (SQLite
/// creates the `-wal`, `-shm` and `-journal` beside the file), before any statement that could
/// create those runs. Both are asked of the operating system by doing it: SQLite opens the file
/// for writing (it falls back to reading when the system refuses, which it reports) and runs
/// nothing on it; a probe file is created in the directory and removed at once. The file itself
/// is never opened outside SQLite: closing such a descriptor would drop the POSIX locks of this
/// process's own connections to it.
fn writable(path: &Path, spec: &StoreSpec) -> Result<(), StoreError> {
    let conn = Connection::open_with_flags(
        plain(path),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sqlite(spec, path, e))?;
    let read_only_file = conn
        .is_readonly(rusqlite::MAIN_DB)
        .map_err(|e| sqlite(spec, path, e))?;
    drop(conn);
    if read_only_file {
        return Err(read_only(
            spec,
            path,
            "the file can only be opened for reading".to_owned(),
            chmod_fix(path),
        ));
    }
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    };
    directory_writable(&dir, path, spec)
}

/// Whether a store file that does not exist yet could be created at `path`, asked without
/// creating it: a probe file is created and removed in the nearest directory of `path` that
/// exists (the missing ones would be created under it). A start-up check, so that a refusal
/// leaves nothing behind.
pub(crate) fn creatable(path: &Path, spec: &StoreSpec) -> Result<(), StoreError> {
    let mut dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    };
    while !dir.is_dir() {
        match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(up) => dir = up.to_path_buf(),
            None => {
                dir = PathBuf::from(".");
                break;
            }
        }
    }
    directory_writable(&dir, path, spec)
}

/// A probe file created in `dir` and removed at once: the operating system's answer to whether
/// the store file `path` (or its journals) can be written there.
fn directory_writable(dir: &Path, path: &Path, spec: &StoreSpec) -> Result<(), StoreError> {
    if let Err(e) = tempfile::Builder::new()
        .prefix(".callid-write-probe-")
        .tempfile_in(dir)
    {
        let fix = match e.kind() {
            std::io::ErrorKind::ReadOnlyFilesystem => {
                "point at a file on a writable file system".to_owned()
            }
            _ => format!(
                "run `chmod u+w {}` (SQLite writes its journal beside the file)",
                shell_word(&dir.display().to_string())
            ),
        };
        // The operating system's reason, without the probe's random name.
        let reason = e.raw_os_error().map_or_else(
            || e.kind().to_string(),
            |code| std::io::Error::from_raw_os_error(code).to_string(),
        );
        return Err(read_only(
            spec,
            path,
            format!(
                "its directory `{}` is not writable ({reason})",
                dir.display()
            ),
            fix,
        ));
    }
    Ok(())
}

/// Writes one header field of `conn`'s file with the value it already has, then rolls back:
/// SQLite opens a file it may only read without an error, and even grants it `BEGIN
/// IMMEDIATE`; only a write fails.
fn probe_write(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    tx.pragma_update(None, "user_version", version)?;
    tx.rollback()
}

fn read_only(spec: &StoreSpec, path: &Path, problem: String, fix: String) -> StoreError {
    StoreError::ReadOnly {
        kind: spec.kind,
        path: path.to_path_buf(),
        problem,
        fix,
    }
}

/// The fix for a file this user may not write: its owner's write permission when it lacks it,
/// else the other causes.
fn chmod_fix(path: &Path) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let owner_writes = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o200 != 0);
    if owner_writes {
        "start callid as the user who owns the file, or move it off a read-only file system"
            .to_owned()
    } else {
        format!(
            "run `chmod u+w {}` as its owner",
            shell_word(&path.display().to_string())
        )
    }
}

/// A migrated in-memory database of kind `spec` (unit tests).
#[cfg(test)]
pub fn open_in_memory(spec: &'static StoreSpec) -> Result<Connection, StoreError> {
    let path = Path::new(":memory:");
    let mut conn = Connection::open_in_memory().map_err(|e| sqlite(spec, path, e))?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(|e| sqlite(spec, path, e))?;
    migrate(&mut conn, spec).map_err(|e| sqlite(spec, path, e))?;
    Ok(conn)
}

fn sqlite(spec: &StoreSpec, path: &Path, cause: rusqlite::Error) -> StoreError {
    StoreError::Sqlite {
        kind: spec.kind,
        path: path.to_path_buf(),
        cause,
    }
}

/// `path` as SQLite must be given it so that it is read as a plain path. The bundled SQLite is
/// built with `SQLITE_USE_URI`, so a name that starts with `file:` would be parsed as a URI even
/// without `SQLITE_OPEN_URI`; `./file:...` is the same file and is never a URI.
fn plain(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt as _;
    if path.as_os_str().as_bytes().starts_with(b"file:") {
        Path::new(".").join(path)
    } else {
        path.to_path_buf()
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The file SQLite keeps beside `path` with `suffix` (one of [`SIDE_FILES`]).
fn side_file(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The file and the journals beside it that grant any permission to group or others, with their
/// modes.
fn exposed_files(path: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut files = vec![path.to_path_buf()];
    files.extend(SIDE_FILES.iter().map(|suffix| side_file(path, suffix)));
    files
        .into_iter()
        .filter_map(|f| {
            let mode = std::fs::metadata(&f).ok()?.permissions().mode() & 0o777;
            (mode & 0o077 != 0).then_some((f, mode))
        })
        .collect()
}

/// What identifies a SQLite file: its `application_id`, its `user_version`, and how many schema
/// objects it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `PRAGMA application_id` (0 when unset).
    pub application_id: i32,
    /// `PRAGMA user_version` (0 when unset).
    pub user_version: i64,
    /// Rows of `sqlite_schema`: 0 for a fresh, empty file.
    pub objects: i64,
}

/// Reads a file's [`Header`] in ONE statement, so all three values come from the same snapshot.
/// Read separately, a migration committed by another process between the reads makes a fresh
/// file look like "tables but no application id", that is, foreign.
pub fn read_header(conn: &Connection) -> rusqlite::Result<Header> {
    conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id), \
                (SELECT user_version FROM pragma_user_version), \
                (SELECT count(*) FROM sqlite_schema)",
        [],
        |r| {
            Ok(Header {
                application_id: r.get(0)?,
                user_version: r.get(1)?,
                objects: r.get(2)?,
            })
        },
    )
}

/// Refuses foreign and newer files before any connection that could write to them is opened.
fn inspect(path: &Path, spec: &StoreSpec) -> Result<(), StoreError> {
    let foreign = |detail: String| StoreError::Foreign {
        kind: spec.kind,
        path: path.to_path_buf(),
        detail,
    };
    let header = retry_busy(|| {
        let conn = Connection::open_with_flags(
            plain(path),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // A read-only connection cannot checkpoint; this says so twice, for a file not ours.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        read_header(&conn)
    });
    let header = match header {
        Ok(h) => h,
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::NotADatabase) => {
            return Err(foreign("not a SQLite database".into()));
        }
        Err(e) => return Err(sqlite(spec, path, e)),
    };
    if header
        == (Header {
            application_id: 0,
            user_version: 0,
            objects: 0,
        })
    {
        return Ok(());
    }
    let app = header.application_id;
    if app != spec.application_id {
        return Err(foreign(if app == 0 {
            "a SQLite database of another program: it has tables but no application id".to_owned()
        } else {
            format!("a SQLite database with application id {app:#010x}")
        }));
    }
    if header.user_version > spec.latest_version() {
        return Err(StoreError::TooNew {
            kind: spec.kind,
            path: path.to_path_buf(),
            found: header.user_version,
            supported: spec.latest_version(),
        });
    }
    Ok(())
}

/// A read-write connection to a file already inspected: busy timeout, WAL, `synchronous=FULL`,
/// its checkpoints left to the file's [`checkpoint`] thread.
fn connect(path: &Path, spec: &StoreSpec) -> Result<Connection, StoreError> {
    let vfs = vfs::name().map_err(|code| {
        sqlite(
            spec,
            path,
            rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
        )
    })?;
    let conn = Connection::open_with_flags_and_vfs(
        plain(path),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        vfs,
    )
    .map_err(|e| sqlite(spec, path, e))?;
    configure(&conn).map_err(|e| sqlite(spec, path, e))?;
    checkpoint::attach(&conn, path).map_err(|e| sqlite(spec, path, e))?;
    Ok(conn)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let mode: String = retry_busy(|| conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(other_error(format!(
            "journal mode stayed `{mode}` instead of `wal`"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

/// Runs a first-open step again while SQLite answers `SQLITE_BUSY` or `SQLITE_LOCKED`, until
/// [`BUSY_TIMEOUT`] has passed. Only for steps that are safe to repeat (they read, or they run in
/// one transaction that a failure rolls back).
fn retry_busy<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match step() {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// The steps of SQLite's plan for `sql` (`EXPLAIN QUERY PLAN`), one per line: for tests that
/// hold a query to the index it must use.
#[cfg(test)]
pub fn query_plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("a query to plan");
    let steps = stmt
        .query_map(params, |r| r.get::<_, String>(3))
        .expect("a plan")
        .collect::<rusqlite::Result<Vec<_>>>()
        .expect("plan steps");
    steps.join("\n")
}

/// A SQLite-shaped error for conditions SQLite itself does not report.
pub fn other_error(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(message),
    )
}

/// Applies the missing migrations in one exclusive transaction; re-checks the header inside it so
/// two processes creating the same file at once cannot both migrate. Running it again is a no-op.
pub fn migrate(conn: &mut Connection, spec: &StoreSpec) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
    let header = read_header(&tx)?;
    let (app, version) = (header.application_id, header.user_version);
    if app != 0 && app != spec.application_id || version > spec.latest_version() {
        return Err(other_error(format!(
            "the file changed while it was opened (application id {app:#010x}, version {version})"
        )));
    }
    if version == spec.latest_version() && app == spec.application_id {
        return Ok(());
    }
    for migration in &spec.migrations[version as usize..] {
        tx.execute_batch(migration)?;
    }
    tx.pragma_update(None, "application_id", spec.application_id)?;
    tx.pragma_update(None, "user_version", spec.latest_version())?;
    tx.commit()
}

mod checkpoint;
mod group;
#[cfg(test)]
mod tests;
mod vfs;
