//! A throwaway PostgreSQL cluster for the integration tests that need a database server: the
//! library's [`callid::pg_cluster::Cluster`] (the one `callid bench` uses too) with database
//! `callid` made, and every failure a panic.
//!
//! Without PostgreSQL binaries, [`PgCluster::start`] prints a SKIP outside CI and panics in CI
//! (`CI=true`), where `.ci/run` installs them.
#![allow(dead_code)]

use callid::pg_cluster::{self, Cluster};
use std::path::Path;

/// A throwaway PostgreSQL cluster, stopped (`-m immediate`) and deleted when dropped.
pub struct PgCluster(Cluster);

impl PgCluster {
    /// Starts a cluster with database `callid`, or returns `None` after printing a SKIP
    /// (outside CI only: in CI a missing PostgreSQL fails the test).
    pub fn start(test: &str) -> Option<PgCluster> {
        let Some(bindir) = pg_cluster::bindir() else {
            let reason = "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); \
                          install them with `apt-get install -y postgresql`";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: {reason} (CI=true: this test never skips)");
            }
            eprintln!("SKIP {test}: {reason}");
            return None;
        };
        let cluster = PgCluster(
            Cluster::start(bindir).unwrap_or_else(|e| panic!("{test}: starting PostgreSQL: {e:?}")),
        );
        cluster.sql("postgres", "CREATE DATABASE callid");
        Some(cluster)
    }

    /// `pg_ctl start`, waiting until the server accepts connections.
    pub fn start_server(&self) {
        self.0
            .start_server()
            .unwrap_or_else(|e| panic!("restarting PostgreSQL: {e:?}"));
    }

    /// `pg_ctl -m fast restart`, waiting until the new server accepts connections.
    pub fn restart_server(&self) {
        self.0
            .restart_server()
            .unwrap_or_else(|e| panic!("restarting PostgreSQL: {e:?}"));
    }

    /// `pg_ctl -m immediate stop`: the server dies as in a crash (see
    /// [`Cluster::stop_server`]).
    pub fn stop_server(&self) {
        self.0.stop_server();
    }

    /// Runs one SQL statement with `psql`; its output, trimmed.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        self.0
            .sql(db, sql)
            .unwrap_or_else(|e| panic!("psql `{sql}`: {e:?}"))
    }

    /// Copies `files` into the data directory (readable by the server only, as it demands of a
    /// key), appends `conf` to `postgresql.conf`, puts `hba` first in `pg_hba.conf`, and reloads,
    /// returning once new sessions see the new settings.
    pub fn reconfigure(&self, files: &[&Path], conf: &str, hba: &str) {
        self.0
            .reconfigure(files, conf, hba)
            .unwrap_or_else(|e| panic!("reconfiguring PostgreSQL: {e:?}"));
    }

    /// The directory of the server's programs (`initdb`, `createdb`, `psql`, ...).
    pub fn bindir(&self) -> &Path {
        self.0.bindir()
    }

    /// The server's URL without a database name: `postgres://callid@127.0.0.1:PORT`.
    pub fn server_url(&self) -> String {
        self.0.server_url()
    }

    /// The URL of database `callid`.
    pub fn url(&self) -> String {
        self.0.url("callid")
    }
}
