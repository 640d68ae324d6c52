//! How every durable file of the backend layers and the provider ledger is opened: [`Store`].
//!
//! One discipline for three SQLite files (`authorization.sqlite3`, `execution.sqlite3`,
//! `provider-ledger.sqlite3`), so that each keeps the same promises.
//!
//! ## Durability
//! WAL journal with `synchronous=FULL`: a transaction that returned from `COMMIT` survives a
//! `kill -9` of the process and a power cut. Callers commit before they reply or act on a result.
//!
//! ## Concurrency
//! Every write runs in an `IMMEDIATE` transaction, so two writers (threads of this process or other
//! processes on the same file) never both read "absent" and both insert. Each connection waits up to
//! [`BUSY_TIMEOUT`] for the write lock before it gives up with an error. Connections are pooled:
//! concurrent callers in one process get separate connections and are serialized by SQLite, not by
//! a lock of ours.
//!
//! ## Compatibility
//! Each kind of file has its own `application_id`; its schema version is `user_version`, and
//! migrations are append-only and run in one `EXCLUSIVE` transaction. A file whose
//! `application_id` belongs to someone else, a non-empty database without one, a file that is not
//! SQLite, or a file from a newer callid is refused and never modified: it is inspected through a
//! read-only connection before anything is written. New files are created `0600` (and missing
//! parent directories `0700`).

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How long a connection waits for another writer before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many idle connections a store keeps for reuse.
const MAX_IDLE: usize = 8;

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

/// Why a store file cannot be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file or its directory could not be created or opened.
    #[error(
        "cannot create or open {kind} `{path}`; check that the directory exists and is writable"
    )]
    Io {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
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
    /// SQLite failed while opening, migrating, reading or writing the file.
    #[error("{kind} `{path}` cannot be read or written")]
    Sqlite {
        /// File kind.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rusqlite::Error,
    },
}

/// An open store file: a pool of connections that all follow the discipline above.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    spec: &'static StoreSpec,
    idle: Mutex<Vec<Connection>>,
}

impl Store {
    /// Opens (creating and migrating when needed) the store file at `path`.
    pub fn open(path: &Path, spec: &'static StoreSpec) -> Result<Store, StoreError> {
        let first = open_connection(path, spec)?;
        Ok(Store {
            path: path.to_path_buf(),
            spec,
            idle: Mutex::new(vec![first]),
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wraps a SQLite error that happened on this store.
    pub fn error(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            kind: self.spec.kind,
            path: self.path.clone(),
            source,
        }
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

    /// Runs `f` inside one `IMMEDIATE` transaction and commits when it returns `Ok`.
    pub fn write<R, E>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        self.with(|conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| E::from(self.error(e)))?;
            let value = f(&tx)?;
            tx.commit().map_err(|e| E::from(self.error(e)))?;
            Ok(value)
        })
    }

    /// Runs `f` on a connection outside any explicit transaction (single consistent reads).
    pub fn read<R, E>(&self, f: impl FnOnce(&Connection) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        self.with(|conn| f(conn))
    }
}

/// Creates the file if needed (0600), checks it through a read-only connection, then migrates it.
fn open_connection(path: &Path, spec: &'static StoreSpec) -> Result<Connection, StoreError> {
    let io = |source| StoreError::Io {
        kind: spec.kind,
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent).map_err(io)?;
    }
    create_private_file(path).map_err(io)?;
    inspect(path, spec)?;
    let mut conn = connect(path, spec)?;
    migrate(&mut conn, spec).map_err(|e| sqlite(spec, path, e))?;
    Ok(conn)
}

fn sqlite(spec: &StoreSpec, path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Sqlite {
        kind: spec.kind,
        path: path.to_path_buf(),
        source,
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
/// file look like "tables but no application id", that is, foreign. Every store, the router's
/// registry and the key pool identify their files through this function.
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
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sqlite(spec, path, e))?;
    let _ = conn.busy_timeout(BUSY_TIMEOUT);
    let (app, version, objects) = match read_header(&conn) {
        Ok(h) => (h.application_id, h.user_version, h.objects),
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::NotADatabase =>
        {
            return Err(foreign("not a SQLite database".into()));
        }
        Err(e) => return Err(sqlite(spec, path, e)),
    };
    if app == 0 && version == 0 && objects == 0 {
        return Ok(());
    }
    if app != spec.application_id {
        return Err(foreign(if app == 0 {
            "a SQLite database of another program: it has tables but no application id".to_owned()
        } else {
            format!("a SQLite database with application id {app:#010x}")
        }));
    }
    if version > spec.latest_version() {
        return Err(StoreError::TooNew {
            kind: spec.kind,
            path: path.to_path_buf(),
            found: version,
            supported: spec.latest_version(),
        });
    }
    Ok(())
}

fn connect(path: &Path, spec: &StoreSpec) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sqlite(spec, path, e))?;
    configure(&conn).map_err(|e| sqlite(spec, path, e))?;
    Ok(conn)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(other_error(format!(
            "journal mode stayed `{mode}` instead of `wal`"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

/// A SQLite-shaped error for conditions SQLite itself does not report.
pub(crate) fn other_error(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(message),
    )
}

/// Applies the missing migrations in one exclusive transaction; re-checks the header inside it so
/// two processes creating the same file at once cannot both migrate.
pub(crate) fn migrate(conn: &mut Connection, spec: &StoreSpec) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
    let app: i32 = tx.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if app != 0 && app != spec.application_id || version > spec.latest_version() {
        return Err(other_error(format!(
            "the file changed while it was opened (application id {app:#010x}, version {version})"
        )));
    }
    for migration in &spec.migrations[version as usize..] {
        tx.execute_batch(migration)?;
    }
    tx.pragma_update(None, "application_id", spec.application_id)?;
    tx.pragma_update(None, "user_version", spec.latest_version())?;
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    static SPEC: StoreSpec = StoreSpec {
        kind: "test store",
        application_id: 0x7465_7374,
        migrations: &[
            "CREATE TABLE a (x INTEGER PRIMARY KEY);",
            "CREATE TABLE b (y TEXT NOT NULL);",
        ],
    };

    #[test]
    fn migrate_twice_in_memory_is_a_no_op_the_second_time() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, &SPEC).unwrap();
        migrate(&mut conn, &SPEC).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 2);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type='table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 2);
    }

    #[test]
    fn new_file_is_private_wal_and_versioned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/s.sqlite3");
        let store = Store::open(&path, &SPEC).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        let (journal, sync, app): (String, i64, i32) = store
            .read(|c| {
                Ok::<_, StoreError>((
                    c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                        .unwrap(),
                    c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap(),
                    c.query_row("PRAGMA application_id", [], |r| r.get(0))
                        .unwrap(),
                ))
            })
            .unwrap();
        assert_eq!(journal, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
        assert_eq!(app, SPEC.application_id);
        drop(store);
        Store::open(&path, &SPEC).expect("reopening our own file works");
    }

    #[test]
    fn many_processes_creating_one_file_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fresh.sqlite3");
        let barrier = std::sync::Barrier::new(16);
        std::thread::scope(|s| {
            for _ in 0..16 {
                let (path, barrier) = (&path, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let store = Store::open(path, &SPEC).unwrap();
                    store
                        .write(|tx| {
                            tx.execute("INSERT INTO b (y) VALUES ('x')", [])
                                .map_err(|e| store.error(e))
                        })
                        .unwrap();
                });
            }
        });
        let store = Store::open(&path, &SPEC).unwrap();
        let rows: i64 = store
            .read(|c| {
                c.query_row("SELECT count(*) FROM b", [], |r| r.get(0))
                    .map_err(|e| store.error(e))
            })
            .unwrap();
        assert_eq!(rows, 16);
    }

    fn refused_unmodified(prepare: impl FnOnce(&Path)) -> StoreError {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.sqlite3");
        prepare(&path);
        let before = std::fs::read(&path).unwrap();
        let err = Store::open(&path, &SPEC).unwrap_err();
        assert_eq!(std::fs::read(&path).unwrap(), before, "file was modified");
        err
    }

    #[test]
    fn foreign_newer_and_non_sqlite_files_are_refused_unmodified() {
        let err = refused_unmodified(|p| {
            let c = Connection::open(p).unwrap();
            c.execute_batch("CREATE TABLE people (name TEXT); INSERT INTO people VALUES ('x');")
                .unwrap();
        });
        assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");
        assert!(err.to_string().contains("no application id"), "{err}");

        let err = refused_unmodified(|p| {
            let c = Connection::open(p).unwrap();
            c.execute_batch("PRAGMA application_id = 1234; CREATE TABLE t (x);")
                .unwrap();
        });
        assert!(
            err.to_string().contains("application id 0x000004d2"),
            "{err}"
        );

        let err = refused_unmodified(|p| {
            let c = Connection::open(p).unwrap();
            c.pragma_update(None, "application_id", SPEC.application_id)
                .unwrap();
            c.pragma_update(None, "user_version", 3).unwrap();
        });
        assert!(
            matches!(
                err,
                StoreError::TooNew {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{err:?}"
        );

        let err = refused_unmodified(|p| std::fs::write(p, vec![b'x'; 4096]).unwrap());
        assert!(err.to_string().contains("not a SQLite database"), "{err}");
    }
}
