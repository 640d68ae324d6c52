//! `callid router` and `callid gateway` refuse, at start-up, a registry they cannot use: the real
//! binary on real files in a temp directory (run as an unprivileged user when the tests run as
//! root, since root writes read-only files), and a real PostgreSQL server that is down. Each
//! refusal exits 2 with a message naming the registry, the problem and the fix, and leaves the
//! file as it was (bytes and mode) with nothing created beside it; the gateway starts no upstream.

use crate::common::bin;
use crate::pg::PgCluster;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `nobody`: who runs the binary when the tests run as root.
const UNPRIVILEGED: u32 = 65534;

/// Whether this process runs as root (`/proc/self` belongs to the effective user).
fn root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Hands `path` to the user the binary runs as (a no-op unless the tests run as root).
fn own(path: &Path) {
    if root() {
        std::os::unix::fs::chown(path, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A registry of this callid's newest schema, closed cleanly (no `-wal` or `-shm` left).
fn registry(path: &Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    for migration in callid::testing::registry::MIGRATIONS {
        c.execute_batch(migration).unwrap();
    }
    c.pragma_update(
        None,
        "application_id",
        callid::testing::registry::APPLICATION_ID,
    )
    .unwrap();
    c.pragma_update(
        None,
        "user_version",
        callid::testing::registry::MIGRATIONS.len() as i64,
    )
    .unwrap();
}

/// What a test checks stays as it was: each entry of the directory with its mode and a digest of
/// its bytes.
fn snapshot(dir: &Path) -> Vec<(String, u32, String)> {
    use sha2::Digest as _;
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            let digest = if meta.is_file() {
                callid::canonical::hex(&sha2::Sha256::digest(std::fs::read(&path).unwrap()))
            } else {
                String::new()
            };
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                meta.permissions().mode() & 0o777,
                digest,
            )
        })
        .collect();
    entries.sort();
    entries
}

/// One kind of unusable registry: the directory `dir/name` holding `registry.sqlite3`.
struct Case {
    name: &'static str,
    /// Makes the registry file.
    make: fn(&Path),
    file_mode: u32,
    dir_mode: u32,
    /// A fragment the message must hold.
    wanted: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "a read-only file",
        make: registry,
        file_mode: 0o400,
        dir_mode: 0o700,
        wanted: "chmod u+w",
    },
    Case {
        name: "a read-only directory",
        make: registry,
        file_mode: 0o600,
        dir_mode: 0o500,
        wanted: "is not writable",
    },
    Case {
        name: "a file open to other users",
        make: registry,
        file_mode: 0o644,
        dir_mode: 0o700,
        wanted: "chmod 600",
    },
    Case {
        name: "a file that is not SQLite",
        make: |p| std::fs::write(p, b"not a database, but somebody's file\n".repeat(64)).unwrap(),
        file_mode: 0o600,
        dir_mode: 0o700,
        wanted: "not a SQLite database",
    },
    Case {
        name: "another application's database",
        make: |p| {
            rusqlite::Connection::open(p)
                .unwrap()
                .execute_batch("PRAGMA application_id = 305419896; CREATE TABLE notes (body);")
                .unwrap()
        },
        file_mode: 0o600,
        dir_mode: 0o700,
        wanted: "application id 0x12345678",
    },
    Case {
        name: "a newer callid's registry",
        make: |p| {
            rusqlite::Connection::open(p)
                .unwrap()
                .execute_batch(&format!(
                    "PRAGMA application_id = {}; PRAGMA user_version = 99; CREATE TABLE future (x);",
                    callid::testing::registry::APPLICATION_ID
                ))
                .unwrap()
        },
        file_mode: 0o600,
        dir_mode: 0o700,
        wanted: "schema version 99",
    },
];

/// Runs `command` with its stdin open (a server that started would wait on it for a client) and
/// returns its output once it exits; panics when it is still running after a minute.
fn exits(mut command: Command) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still serving after a minute: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// `callid router` or `callid gateway` (its upstream a command that leaves `marker` when it
/// starts) on `registry`, as the unprivileged user when the tests run as root.
fn start(server: &str, registry: &str, marker: &Path) -> Output {
    let mut command = Command::new(bin());
    command.arg(server).args(["--registry", registry]);
    if server == "gateway" {
        command
            .args(["--spend", "pay", "--", "/bin/sh", "-c"])
            .arg(format!("touch '{}'; exec sleep 30", marker.display()));
    }
    if root() {
        command.uid(UNPRIVILEGED).gid(UNPRIVILEGED);
    }
    exits(command)
}

#[test]
fn unusable_registry_files_are_refused_at_start_up_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    own(tmp.path());
    let marker = tmp.path().join("upstream-started");
    for server in ["router", "gateway"] {
        let mut report = String::new();
        for case in CASES {
            let dir = tmp
                .path()
                .join(format!("{server}-{}", case.name.replace(' ', "-")));
            std::fs::create_dir(&dir).unwrap();
            let file = dir.join("registry.sqlite3");
            (case.make)(&file);
            own(&dir);
            own(&file);
            set_mode(&file, case.file_mode);
            set_mode(&dir, case.dir_mode);
            let before = snapshot(&dir);

            let out = start(server, file.to_str().unwrap(), &marker);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let what = format!("{server}, {}: {stderr}", case.name);
            assert_eq!(out.status.code(), Some(2), "{what}");
            assert!(out.stdout.is_empty(), "{what}");
            assert!(
                stderr.starts_with(&format!("error: callid {server} did not start: registry `")),
                "{what}"
            );
            assert!(stderr.contains(&file.display().to_string()), "{what}");
            assert!(stderr.contains(case.wanted), "{what}");
            assert_eq!(snapshot(&dir), before, "{what}: the directory changed");
            assert!(!marker.exists(), "{what}: the upstream was started");
            set_mode(&dir, 0o700);
            report.push_str(&format!("{}:\n{stderr}", case.name));
        }
        insta::assert_snapshot!(
            format!("registry_refused_at_start_up_{server}"),
            report.replace(&tmp.path().display().to_string(), "[TMP]")
        );
    }
}

#[test]
fn a_registry_database_that_is_down_is_refused_at_start_up() {
    let Some(pg) = PgCluster::start("a_registry_database_that_is_down_is_refused_at_start_up")
    else {
        return;
    };
    pg.stop_server();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("upstream-started");
    let url = pg.url();
    let mut report = String::new();
    for server in ["router", "gateway"] {
        let mut command = Command::new(bin());
        command
            .arg(server)
            .args(["--registry", &url])
            // The in-process provider's ledger would live here; nothing may be created.
            .env("XDG_DATA_HOME", tmp.path());
        if server == "gateway" {
            command
                .args(["--spend", "pay", "--", "/bin/sh", "-c"])
                .arg(format!("touch '{}'; exec sleep 30", marker.display()));
        }
        let out = exits(command);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{server}: {stderr}");
        assert!(stderr.contains(&url), "{server}: {stderr}");
        assert!(stderr.contains("start the database"), "{server}: {stderr}");
        assert!(!marker.exists(), "{server}: the upstream was started");
        report.push_str(&format!("{server}:\n{stderr}"));
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing created"
    );
    let port = url.rsplit(':').next().unwrap().split('/').next().unwrap();
    insta::assert_snapshot!(
        "registry_database_down_at_start_up",
        report.replace(port, "[PORT]")
    );
}
