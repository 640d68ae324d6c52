//! A throwaway PostgreSQL cluster for the integration tests that need a database server (moved
//! here from `replicas.rs`, unchanged, so that `conform_replicas.rs` uses it too).
//!
//! Without PostgreSQL binaries, [`PgCluster::start`] prints a SKIP outside CI and panics in CI
//! (`CI=true`), where `.ci/run` installs them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb`, or `CALLID_PG_BINDIR` (if it
/// holds `initdb`).
fn pg_bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CALLID_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").exists().then_some(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

/// A throwaway PostgreSQL cluster, stopped (`-m immediate`) and deleted when dropped.
pub struct PgCluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PgCluster {
    /// Starts a cluster, or returns `None` after printing a SKIP (outside CI only: in CI a
    /// missing PostgreSQL fails the test).
    pub fn start(test: &str) -> Option<PgCluster> {
        let Some(bindir) = pg_bindir() else {
            let reason = "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); \
                          install them with `apt-get install -y postgresql`";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: {reason} (CI=true: this test never skips)");
            }
            eprintln!("SKIP {test}: {reason}");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        // initdb and postgres refuse to run as root: run them as the `postgres` user, which
        // must be able to reach the cluster's directory.
        let as_postgres = {
            use std::os::unix::fs::MetadataExt as _;
            // `/proc/self` belongs to this process's effective user.
            std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
        };
        if as_postgres {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let cluster = PgCluster {
            dir,
            bindir,
            port,
            as_postgres,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "callid",
                "--auth=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let sock = cluster.dir.path().join("sock");
        std::fs::create_dir_all(&sock).unwrap();
        if as_postgres {
            cluster.run_plain("chown", &["postgres", sock.to_str().unwrap()]);
        }
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             max_connections = 200\nfsync = on\n",
            sock.display()
        );
        let conf_path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();
        cluster.start_server();
        cluster.sql("postgres", "CREATE DATABASE callid");
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &Path, args: &[&str]) -> Command {
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program).args(args);
            c
        } else {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(&self.bindir.join(tool), args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn run_plain(&self, program: &str, args: &[&str]) {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    }

    /// `pg_ctl start`, waiting until the server accepts connections.
    pub fn start_server(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// `pg_ctl -m immediate stop`: the server dies as in a crash (its clients' connections
    /// drop). It waits for the postmaster's PID file, not for the process entry, so a server
    /// left as an unreaped zombie does not hang it.
    pub fn stop_server(&self) {
        let data = self.data();
        let _ = self
            .command(
                &self.bindir.join("pg_ctl"),
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
            )
            .output();
    }

    /// Runs one SQL statement with `psql`.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let port = self.port.to_string();
        let out = Command::new(self.bindir.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", &port])
            .args(["-U", "callid", "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql `{sql}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Copies `files` into the data directory (readable by the server only, as it demands of a
    /// key), appends `conf` to `postgresql.conf`, puts `hba` first in `pg_hba.conf`, and reloads,
    /// returning once new sessions see the new settings.
    pub fn reconfigure(&self, files: &[&Path], conf: &str, hba: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        let data = self.data();
        for file in files {
            let to = data.join(file.file_name().unwrap());
            std::fs::copy(file, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
            if self.as_postgres {
                self.run_plain("chown", &["postgres", to.to_str().unwrap()]);
            }
        }
        let conf_path = data.join("postgresql.conf");
        let text = std::fs::read_to_string(&conf_path).unwrap();
        std::fs::write(&conf_path, format!("{text}\n{conf}\n")).unwrap();
        let hba_path = data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba_path).unwrap();
        std::fs::write(&hba_path, format!("{hba}\n{text}")).unwrap();
        let loaded = "SELECT pg_conf_load_time()";
        let before = self.sql("postgres", loaded);
        self.run("pg_ctl", &["-D", data.to_str().unwrap(), "reload"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.sql("postgres", loaded) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "the server never reloaded"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The directory of the server's programs (`initdb`, `createdb`, `psql`, ...).
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The server's URL without a database name: `postgres://callid@127.0.0.1:PORT`.
    pub fn server_url(&self) -> String {
        format!("postgres://callid@127.0.0.1:{}", self.port)
    }

    /// The URL of database `callid`.
    pub fn url(&self) -> String {
        format!("postgres://callid@127.0.0.1:{}/callid", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop_server();
    }
}
