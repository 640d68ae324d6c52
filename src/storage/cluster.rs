//! A throwaway PostgreSQL cluster, [`Cluster`], for the integration tests and `callid bench`:
//! development tooling, not part of what the library promises (hidden from its docs).
//!
//! # Guarantees
//! - The server programs are the newest `/usr/lib/postgresql/*/bin` holding `initdb`, or
//!   `CALLID_PG_BINDIR` ([`bindir`]); without them there is no cluster, and the caller decides
//!   whether that is a skip.
//! - [`Cluster::start`] runs `initdb` on a fresh temporary directory (superuser `callid`, `trust`
//!   authentication, UTF-8), listens on loopback only at a port that was free a moment before,
//!   with `fsync = on` and `max_connections = 200`, and returns once the server accepts
//!   connections. A port taken in that moment (by another cluster, or by any outgoing
//!   connection, which draws from the same range) is no failure: the server is started again on
//!   another free port, up to [`PORT_ATTEMPTS`] times. A server that fails to start for any other
//!   reason fails at once, with the tail of its log in the error. As root it runs the server programs as the `postgres` user (they refuse root),
//!   which must reach the directory, so the directory is opened to it.
//! - Dropping a [`Cluster`] stops its server as in a crash (`pg_ctl -m immediate`) and deletes
//!   its directory.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a cluster could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A file, directory or process operation failed.
    #[error("failed {what}")]
    Io {
        /// What was being done (`creating the cluster's directory`).
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A server program ran but failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and the tail of its standard error.
        detail: String,
    },
}

impl ClusterError {
    /// A stable machine code for the error.
    pub fn code(&self) -> &'static str {
        match self {
            ClusterError::Io { .. } => "io_failed",
            ClusterError::Command { .. } => "command_failed",
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb`, or `CALLID_PG_BINDIR` (if it holds
/// `initdb`).
pub fn bindir() -> Option<PathBuf> {
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

/// How many ports [`Cluster::start`] tries when each is taken before its server binds it.
pub const PORT_ATTEMPTS: u32 = 5;

/// A loopback port free at this moment (the kernel's choice).
fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()
        .map(|a| a.port())
}

/// A throwaway PostgreSQL cluster, stopped (`-m immediate`) and deleted when dropped.
pub struct Cluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// A throwaway cluster with an empty database `callid`, for a unit test: `None` (the test skips,
/// saying so) where no PostgreSQL server binaries are installed, and a panic under `CI=true`,
/// where a PostgreSQL test never skips.
#[cfg(test)]
pub(crate) fn for_unit_test() -> Option<Cluster> {
    let cluster = Cluster::start(unit_test_bindir()?).expect("a throwaway cluster");
    cluster
        .sql("postgres", "CREATE DATABASE callid")
        .expect("a database");
    Some(cluster)
}

/// [`bindir`] for a unit test: `None` (the test skips, saying so) without server binaries, and a
/// panic under `CI=true`.
#[cfg(test)]
fn unit_test_bindir() -> Option<PathBuf> {
    let found = bindir();
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: this test never skips; install PostgreSQL"
        );
        eprintln!("SKIP: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb)");
    }
    found
}

impl Cluster {
    /// Makes a cluster with the programs in `bindir` and starts its server.
    pub fn start(bindir: PathBuf) -> Result<Cluster, ClusterError> {
        Cluster::fresh(bindir)?.init(free_port)
    }

    /// A cluster's empty directory, before `initdb`.
    fn fresh(bindir: PathBuf) -> Result<Cluster, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix("callid-pg-")
            .tempdir()
            .map_err(io("creating the cluster's directory"))?;
        // `/proc/self` belongs to this process's effective user.
        let as_postgres = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if as_postgres {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
                .map_err(io("opening the cluster's directory to `postgres`"))?;
        }
        Ok(Cluster {
            dir,
            bindir,
            port: 0,
            as_postgres,
        })
    }

    /// The rest of [`Cluster::start`]: `initdb`, the settings, and the server started on a port
    /// from `pick`, another one each time the last was taken before the server could bind it.
    fn init(
        mut self,
        mut pick: impl FnMut() -> std::io::Result<u16>,
    ) -> Result<Cluster, ClusterError> {
        let data = self.data();
        self.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "callid",
                "--auth=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let sock = self.dir.path().join("sock");
        std::fs::create_dir_all(&sock).map_err(io("creating the socket directory"))?;
        if self.as_postgres {
            let status = Command::new("chown")
                .arg("postgres")
                .arg(&sock)
                .status()
                .map_err(io("starting `chown`"))?;
            if !status.success() {
                return Err(ClusterError::Command {
                    command: format!("chown postgres {}", sock.display()),
                    detail: status.to_string(),
                });
            }
        }
        let conf_path = Path::new(&data).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)
            .map_err(io(format!("reading `{}`", conf_path.display())))?;
        text.push_str(&format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             max_connections = 200\nfsync = on\n",
            sock.display()
        ));
        let mut attempt = 1;
        loop {
            self.port = pick().map_err(io("finding a free loopback port"))?;
            // The last `port` line of the file is the one the server reads.
            text.push_str(&format!("port = {}\n", self.port));
            std::fs::write(&conf_path, &text)
                .map_err(io(format!("writing `{}`", conf_path.display())))?;
            let logged = self.log_len();
            match self.start_server() {
                Ok(()) => return Ok(self),
                Err(_) if attempt < PORT_ATTEMPTS && self.port_was_taken(logged) => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let program = self.bindir.join(tool);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        c.args(args);
        c
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), ClusterError> {
        let out = self
            .command(tool, args)
            .output()
            .map_err(io(format!("starting `{tool}`")))?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                command: format!("{tool} {}", args.join(" ")),
                detail: format!("{}; {}", out.status, tail(&out.stderr)),
            });
        }
        Ok(())
    }

    /// `pg_ctl start`, returning once the server accepts connections (60 s at most); on a
    /// failure the error ends with the tail of what the server logged.
    pub fn start_server(&self) -> Result<(), ClusterError> {
        let log = self.log_path().display().to_string();
        let logged = self.log_len();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-l", &log, "-w", "-t", "60", "start"],
        )
        .map_err(|e| self.with_log(e, logged))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// How long the server's log is: where an attempt's own lines begin.
    fn log_len(&self) -> u64 {
        std::fs::metadata(self.log_path()).map_or(0, |m| m.len())
    }

    /// What the server logged from byte `from` on.
    fn log_since(&self, from: u64) -> String {
        let text = std::fs::read(self.log_path()).unwrap_or_default();
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// Whether the server, since byte `from` of its log, failed because its port was taken.
    fn port_was_taken(&self, from: u64) -> bool {
        self.log_since(from).contains("Address already in use")
    }

    fn with_log(&self, e: ClusterError, from: u64) -> ClusterError {
        match e {
            ClusterError::Command { command, detail } => ClusterError::Command {
                command,
                detail: format!(
                    "{detail}; the server logged: {}",
                    crate::text::last_lines(&self.log_since(from), 5)
                ),
            },
            other => other,
        }
    }

    /// `pg_ctl -m fast restart`, returning once the new server accepts connections (60 s at
    /// most): every session is ended by the server (it tells each client so) and must reconnect.
    pub fn restart_server(&self) -> Result<(), ClusterError> {
        let log = self.log_path().display().to_string();
        let logged = self.log_len();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "restart",
            ],
        )
        .map_err(|e| self.with_log(e, logged))
    }

    /// `pg_ctl -m immediate stop`: the server dies as in a crash (its clients' connections
    /// drop). It waits for the postmaster's PID file, not for the process entry, so a server
    /// left as an unreaped zombie does not hang it. A server already stopped is no error.
    pub fn stop_server(&self) {
        let _ = self
            .command(
                "pg_ctl",
                &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
            )
            .output();
    }

    /// Runs `sql` with `psql` on database `db`; its output unaligned, without headers, trimmed.
    pub fn sql(&self, db: &str, sql: &str) -> Result<String, ClusterError> {
        let port = self.port.to_string();
        let out = Command::new(self.bindir.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", &port])
            .args(["-U", "callid", "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .map_err(io("starting `psql`"))?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                command: format!("psql -c {sql:?}"),
                detail: tail(&out.stderr),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Copies `files` into the data directory (readable by the server only, as it demands of a
    /// key), appends `conf` to `postgresql.conf`, puts `hba` first in `pg_hba.conf`, and reloads,
    /// returning once new sessions see the new settings (60 s at most).
    pub fn reconfigure(&self, files: &[&Path], conf: &str, hba: &str) -> Result<(), ClusterError> {
        let data = PathBuf::from(self.data());
        for file in files {
            let to = data.join(file.file_name().unwrap_or_default());
            std::fs::copy(file, &to).map_err(io(format!("copying `{}`", file.display())))?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                .map_err(io(format!("protecting `{}`", to.display())))?;
            if self.as_postgres {
                let status = Command::new("chown")
                    .arg("postgres")
                    .arg(&to)
                    .status()
                    .map_err(io("starting `chown`"))?;
                if !status.success() {
                    return Err(ClusterError::Command {
                        command: format!("chown postgres {}", to.display()),
                        detail: status.to_string(),
                    });
                }
            }
        }
        let edit = |name: &str, edit: &dyn Fn(String) -> String| {
            let path = data.join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(io(format!("reading `{}`", path.display())))?;
            std::fs::write(&path, edit(text)).map_err(io(format!("writing `{}`", path.display())))
        };
        edit("postgresql.conf", &|text| format!("{text}\n{conf}\n"))?;
        edit("pg_hba.conf", &|text| format!("{hba}\n{text}"))?;
        let loaded = "SELECT pg_conf_load_time()";
        let before = self.sql("postgres", loaded)?;
        self.run("pg_ctl", &["-D", &self.data(), "reload"])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.sql("postgres", loaded)? == before {
            if std::time::Instant::now() >= deadline {
                return Err(ClusterError::Command {
                    command: "pg_ctl reload".into(),
                    detail: "the server did not reload its settings within 60 s".into(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }

    /// The directory of the server's programs (`initdb`, `createdb`, `psql`, ...).
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The server's major version: the name of the directory above [`Cluster::bindir`] (`17`).
    pub fn version(&self) -> String {
        self.bindir
            .parent()
            .and_then(|p| p.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's main process (`postmaster.pid`'s first line), while it runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid_file = self.dir.path().join("data").join("postmaster.pid");
        std::fs::read_to_string(pid_file)
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The server's URL without a database name: `postgres://callid@127.0.0.1:PORT`.
    pub fn server_url(&self) -> String {
        format!("postgres://callid@127.0.0.1:{}", self.port)
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.server_url())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_server();
    }
}

fn tail(stderr: &[u8]) -> String {
    crate::text::last_lines(&String::from_utf8_lossy(stderr), 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_taken_before_the_server_binds_it_is_replaced_by_another() {
        let Some(bindir) = unit_test_bindir() else {
            return;
        };
        // Another program holds the first port the cluster is given.
        let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let taken = holder.local_addr().expect("its address").port();
        let mut picks = vec![taken];
        let cluster = Cluster::fresh(bindir)
            .expect("a directory")
            .init(|| picks.pop().map_or_else(free_port, Ok))
            .expect("the server starts on another port");
        assert_ne!(cluster.port(), taken);
        assert_eq!(cluster.sql("postgres", "SELECT 1").expect("a session"), "1");
        drop(holder);
    }

    #[test]
    fn a_server_that_cannot_start_says_what_it_logged() {
        let Some(cluster) = for_unit_test() else {
            return;
        };
        // A second server on the same data directory is refused by the first one's lock file.
        let e = cluster.start_server().expect_err("a second postmaster");
        let text = e.to_string();
        assert!(text.contains("the server logged:"), "{text}");
        assert_eq!(e.code(), "command_failed");
    }
}
