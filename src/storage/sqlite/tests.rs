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

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn side(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

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
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    let (journal, sync, app): (String, i64, i32) = store
        .write(|c| {
            c.execute("INSERT INTO b (y) VALUES ('x')", []).unwrap();
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
    for suffix in ["-wal", "-shm"] {
        assert_eq!(mode(&side(&path, suffix)), 0o600, "{suffix}");
    }
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

/// The file and, when present, its `-wal`, read as bytes.
fn snapshot(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    (
        std::fs::read(path).unwrap(),
        std::fs::read(side(path, "-wal")).ok(),
    )
}

fn refused_unmodified(prepare: impl FnOnce(&Path)) -> StoreError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.sqlite3");
    prepare(&path);
    // Private, so that what is refused is the content (a file open to others is refused first).
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let before = snapshot(&path);
    let err = open_connection(&path, &SPEC, Create::IfMissing).unwrap_err();
    assert_eq!(snapshot(&path), before, "file or -wal was modified");
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

/// Leaves a WAL-mode database whose last commits are still in its `-wal` (as a process that was
/// killed leaves it), `setup` run on it.
fn with_live_wal(path: &Path, setup: &str) {
    let c = Connection::open(path).unwrap();
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    c.execute_batch(setup).unwrap();
    drop(c);
    let wal = std::fs::metadata(side(path, "-wal")).unwrap();
    assert!(wal.len() > 0, "the -wal holds the commits");
}

#[test]
fn foreign_and_newer_files_with_a_wal_are_refused_with_file_and_wal_unchanged() {
    let err = refused_unmodified(|p| {
        with_live_wal(
            p,
            "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');",
        )
    });
    assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");

    let err = refused_unmodified(|p| {
        with_live_wal(
            p,
            &format!(
                "PRAGMA application_id = {}; PRAGMA user_version = 7; CREATE TABLE future (x);",
                SPEC.application_id
            ),
        )
    });
    assert!(
        matches!(err, StoreError::TooNew { found: 7, .. }),
        "{err:?}"
    );
}

#[test]
fn files_open_to_other_users_are_refused_with_the_chmod_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.sqlite3");
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = open_connection(&path, &SPEC, Create::IfMissing).unwrap_err();
    assert!(matches!(err, StoreError::Permissions { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("has mode 0644"), "{text}");
    assert!(
        text.contains(&format!("run `chmod 600 {}`", path.display())),
        "{text}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "still empty");
    assert!(!side(&path, "-wal").exists(), "no journal was created");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(
        open_connection(&path, &SPEC, Create::IfMissing).expect("a private empty file is adopted"),
    );

    // A leftover journal that others may read is refused as well, and named in the fix.
    let conn = open_connection(&path, &SPEC, Create::IfMissing).unwrap();
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .unwrap();
    conn.execute("INSERT INTO b (y) VALUES ('secret')", [])
        .unwrap();
    drop(conn);
    let wal = side(&path, "-wal");
    assert!(
        std::fs::metadata(&wal).unwrap().len() > 0,
        "the row is in the -wal"
    );
    std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = open_connection(&path, &SPEC, Create::IfMissing).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("`{}` has mode 0640", wal.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("chmod 600 {}", wal.display())),
        "{text}"
    );
}

#[test]
fn shell_words_are_quoted_only_when_needed() {
    for (text, word) in [
        ("/tmp/a.sqlite3", "/tmp/a.sqlite3"),
        ("/tmp/my state/a", "'/tmp/my state/a'"),
        ("it's", r"'it'\''s'"),
        ("file:x?mode=memory", "'file:x?mode=memory'"),
    ] {
        assert_eq!(shell_word(text), word, "{text}");
    }
}

#[test]
fn a_name_that_looks_like_a_uri_is_a_plain_file() {
    assert_eq!(
        plain(Path::new("file:x?mode=memory")),
        Path::new("./file:x?mode=memory")
    );
    assert_eq!(plain(Path::new("/d/file:x")), Path::new("/d/file:x"));
    assert_eq!(plain(Path::new("a/b")), Path::new("a/b"));
}

#[test]
fn a_missing_file_is_not_created_when_creation_is_not_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sqlite3");
    assert!(open_connection(&path, &SPEC, Create::Never).is_err());
    assert!(!path.exists());
}

/// SQLite's busy handler does not cover the switch to WAL of a fresh file while another
/// connection holds the write lock (the switch upgrades a read transaction, which answers
/// `SQLITE_BUSY` at once to avoid a deadlock): the race behind a flaky fresh-file open.
#[test]
fn a_fresh_file_opens_while_another_connection_holds_its_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.sqlite3");
    create_private_file(&path).unwrap();
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            // Released once the opener had time to reach the switch (or when it returned).
            let _ = released.recv_timeout(Duration::from_millis(500));
            holder.execute_batch("ROLLBACK").unwrap();
        });
        let opened = open_connection(&path, &SPEC, Create::IfMissing);
        let _ = release.send(());
        let conn = opened.expect("the opener waits for the write lock instead of failing");
        assert_eq!(read_header(&conn).unwrap().user_version, 2);
    });
}

/// Group commit: 16 threads writing at once. Every write that returned `Ok` is visible to a
/// fresh connection the moment it returns (it was committed, not merely queued), and a write
/// whose closure failed, or panicked, left nothing while the writes sharing its transaction
/// were kept.
#[test]
fn concurrent_writes_share_commits_and_a_failed_or_panicking_write_rolls_back_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.sqlite3");
    let store = Store::open(&path, &SPEC).unwrap();
    let barrier = std::sync::Barrier::new(16);
    std::thread::scope(|s| {
        for t in 0..16i64 {
            let (store, barrier, path) = (&store, &barrier, &path);
            s.spawn(move || {
                let fresh = connect(path, &SPEC).unwrap();
                barrier.wait();
                for i in 0..60i64 {
                    let x = t * 1000 + i;
                    let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        store.write(|c| {
                            c.execute("INSERT INTO a (x) VALUES (?1)", [x])
                                .map_err(|e| store.error(e))?;
                            match x % 7 {
                                3 => Err(store.error(other_error("refused".into()))),
                                5 if i % 2 == 1 => panic!("a write panicked"),
                                _ => Ok(()),
                            }
                        })
                    }));
                    let seen: i64 = fresh
                        .query_row("SELECT count(*) FROM a WHERE x = ?1", [x], |r| r.get(0))
                        .unwrap();
                    match wrote {
                        Ok(Ok(())) => assert_eq!(seen, 1, "write {x} returned before its commit"),
                        Ok(Err(_)) | Err(_) => assert_eq!(seen, 0, "failed write {x} was kept"),
                    }
                }
            });
        }
    });
    let expected = (0..16i64)
        .flat_map(|t| (0..60i64).map(move |i| (t * 1000 + i, i)))
        .filter(|(x, i)| x % 7 != 3 && !(x % 7 == 5 && i % 2 == 1))
        .count() as i64;
    let rows: i64 = store
        .read(|c| {
            c.query_row("SELECT count(*) FROM a", [], |r| r.get(0))
                .map_err(|e| store.error(e))
        })
        .unwrap();
    assert_eq!(rows, expected);
    store
        .write(|c| {
            c.execute("INSERT INTO b (y) VALUES ('after')", [])
                .map_err(|e| store.error(e))
        })
        .expect("the store still writes after a panic");
}

/// [`Store::import`] reads the file at the path it is given, whatever bytes its name holds (a
/// name that is not UTF-8 is not read as another one).
#[test]
fn import_reads_the_file_at_its_path_even_when_the_name_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let earlier = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"earlier-\xff.sqlite3"));
    let source = Store::open(&earlier, &SPEC).unwrap();
    source
        .write(|c| {
            c.execute("INSERT INTO b (y) VALUES ('earlier')", [])
                .map_err(|e| source.error(e))
        })
        .unwrap();
    drop(source);
    let host = Store::open(&dir.path().join("host.sqlite3"), &SPEC).unwrap();
    assert_eq!(host.import(&earlier, &SPEC, "b").unwrap(), 1);
    let rows: Vec<String> = host
        .read(|c| {
            let mut rows = c.prepare("SELECT y FROM b").map_err(|e| host.error(e))?;
            rows.query_map([], |r| r.get(0))
                .and_then(Iterator::collect)
                .map_err(|e| host.error(e))
        })
        .unwrap();
    assert_eq!(rows, ["earlier"]);
    let lossy = dir.path().join("earlier-\u{fffd}.sqlite3");
    assert!(!lossy.exists(), "nothing is created under another name");
}

/// Commits `n` single-row writes, one transaction each (one writer, so no group commit).
fn commit_rows(store: &Store, n: u64) {
    for i in 0..n {
        store
            .write(|c| {
                c.execute("INSERT INTO a (x) VALUES (?1)", [i as i64])
                    .map_err(|e| store.error(e))
            })
            .unwrap();
    }
}

#[test]
fn commits_are_checkpointed_by_a_thread_of_their_own_not_by_the_committing_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite3");
    let store = Store::open(&path, &SPEC).unwrap();
    let bound: i64 = store
        .write(|c| {
            c.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
                .map_err(|e| store.error(e))
        })
        .unwrap();
    assert_eq!(bound, checkpoint::WAL_BOUND);
    // The file holds its header page; the schema and the rows are in the WAL until a checkpoint
    // copies them into the file, which then grows.
    let header_only = std::fs::metadata(&path).unwrap().len();
    // Far fewer frames than SQLite's own checkpoint would wait for (1000, then WAL_BOUND).
    commit_rows(&store, 3 * checkpoint::CHECKPOINT_EVERY);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&path).unwrap().len() == header_only {
        assert!(
            Instant::now() < deadline,
            "no checkpoint copied the WAL into the file within 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn closing_the_last_connection_ends_the_checkpointer_and_leaves_no_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite3");
    let store = Store::open(&path, &SPEC).unwrap();
    commit_rows(&store, 2 * checkpoint::CHECKPOINT_EVERY + 1);
    drop(store);
    assert!(
        !side(&path, "-wal").exists(),
        "the checkpointer's connection outlived the store"
    );
    let reopened = Store::open(&path, &SPEC).unwrap();
    let rows: i64 = reopened
        .read(|c| {
            c.query_row("SELECT count(*) FROM a", [], |r| r.get(0))
                .map_err(|e| reopened.error(e))
        })
        .unwrap();
    assert_eq!(rows, 2 * checkpoint::CHECKPOINT_EVERY as i64 + 1);
}

/// Write system calls this thread has made so far (`syscw` of `/proc/thread-self/io`).
fn writes_of_this_thread() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A connection configured as `connect` configures one, through the VFS `vfs`.
fn connection_through(path: &Path, vfs: &std::ffi::CStr) -> Connection {
    let conn = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        vfs,
    )
    .unwrap();
    configure(&conn).unwrap();
    // No checkpoint on commit (its writes to the file would count too): the WAL only grows.
    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    conn
}

/// One transaction of `rows` rows of `size` bytes each into `b`; the write system calls it took.
fn commit_sized(conn: &Connection, rows: usize, size: usize) -> u64 {
    let before = writes_of_this_thread();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for i in 0..rows {
        let mut text = i.to_string();
        text.extend(std::iter::repeat_n('x', size - text.len()));
        conn.execute("INSERT INTO b (y) VALUES (?1)", [text])
            .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    writes_of_this_thread() - before
}

#[test]
fn a_commit_reaches_the_wal_in_one_write_through_callid_s_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite3");
    drop(Store::open(&path, &SPEC).unwrap());
    let ours = connection_through(&path, vfs::name().unwrap());
    let unix = connection_through(&path, c"unix");
    // Warm both up (the -shm's first pages, the WAL's header), then 20 rows of 1,000 bytes:
    // about six frames of a page and its header each.
    commit_sized(&ours, 1, 10);
    commit_sized(&unix, 1, 10);
    let plain = commit_sized(&unix, 20, 1000);
    let coalesced = commit_sized(&ours, 20, 1000);
    assert!(
        plain >= 10,
        "the unix VFS wrote each frame in two calls: {plain}"
    );
    assert_eq!(
        coalesced, 1,
        "one write for the whole commit (the unix VFS took {plain})"
    );
}

#[test]
fn commits_larger_than_what_the_vfs_holds_are_whole_and_readable_at_once_by_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite3");
    drop(Store::open(&path, &SPEC).unwrap());
    let ours = connection_through(&path, vfs::name().unwrap());
    let reader = Connection::open(&path).unwrap();
    let mut expected = 0i64;
    // Commits from one frame to about 3 MB (many times `vfs::HOLD`), of rows of uneven sizes,
    // each read by a connection through the plain unix VFS as soon as it returned.
    let wal = side(&path, "-wal");
    for (rows, size) in [
        (1, 10),
        (7, 333),
        (40, 4000),
        (300, 2500),
        (1200, 2048),
        (3, 70_000),
    ] {
        let before = std::fs::metadata(&wal).map_or(0, |m| m.len());
        let writes = commit_sized(&ours, rows, size);
        let grown = std::fs::metadata(&wal).unwrap().len() - before;
        expected += i64::try_from(rows * size).unwrap();
        let pieces = grown.div_ceil(u64::try_from(vfs::HOLD).unwrap());
        assert!(
            writes <= pieces + 1,
            "{rows} rows of {size} bytes: {writes} writes for {grown} bytes of WAL"
        );
        let seen: i64 = reader
            .query_row("SELECT sum(length(y)) FROM b", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, expected, "after {rows} rows of {size} bytes");
    }
    drop(ours);
    let check: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// An [`Immediate`] transaction keeps its rows only once committed: dropped without a commit (a
/// step that failed with `?`), a failed commit included, nothing it wrote stays, and the
/// connection is out of the transaction for the next one. It takes the write lock at `BEGIN`,
/// so another connection cannot begin a write meanwhile.
#[test]
fn an_immediate_transaction_keeps_its_rows_only_when_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite3");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE a (x INTEGER PRIMARY KEY);")
        .unwrap();
    let count = |c: &Connection| -> i64 {
        c.query_row("SELECT count(*) FROM a", [], |r| r.get(0))
            .unwrap()
    };

    let tx = Immediate::begin(&conn).unwrap();
    tx.exec("INSERT INTO a (x) VALUES (1)", []).unwrap();
    let other = Connection::open(&path).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    let locked = other.execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(locked.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    drop(tx);
    assert!(conn.is_autocommit());
    assert_eq!(count(&conn), 0);

    let tx = Immediate::begin(&conn).unwrap();
    tx.exec("INSERT INTO a (x) VALUES (2)", []).unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&other), 1);

    // A commit that fails (a deferred foreign key, checked at `COMMIT`) leaves nothing behind
    // either.
    conn.execute_batch(
        "PRAGMA foreign_keys=ON; CREATE TABLE p (id INTEGER PRIMARY KEY);
         CREATE TABLE c (p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED);",
    )
    .unwrap();
    let tx = Immediate::begin(&conn).unwrap();
    tx.exec("INSERT INTO a (x) VALUES (3)", []).unwrap();
    tx.exec("INSERT INTO c (p) VALUES (99)", []).unwrap();
    assert!(tx.commit().is_err());
    assert!(conn.is_autocommit());
    assert_eq!(count(&conn), 1);
    let orphans: i64 = conn
        .query_row("SELECT count(*) FROM c", [], |r| r.get(0))
        .unwrap();
    assert_eq!(orphans, 0);
}
