//! The PostgreSQL rows: the router on a PostgreSQL registry beside a raw single-row
//! INSERT+COMMIT on the same server, and 16 clients spread over two router replicas on one
//! database beside one client on one replica.
//!
//! The database is `CALLID_BENCH_POSTGRES_URL` when set (a throwaway database: the bench creates
//! callid's tables and a `callid_bench_baseline` table in it and leaves its rows behind);
//! otherwise the bench starts its own throwaway cluster from the newest
//! `/usr/lib/postgresql/*/bin` (or `CALLID_PG_BINDIR`): `initdb` on a temp directory
//! (as the `postgres` user when the bench runs as root, since the server refuses root), a
//! free loopback port, `fsync` on, stopped with `pg_ctl -m immediate` and deleted afterwards.
//! Without either, both rows are `skipped`, saying PostgreSQL is absent.
//!
//! What the rows guarantee: every router answer is checked (a completed new operation), the
//! raw baseline commits each row with `synchronous_commit = on` through a prepared statement
//! (one round trip, as the registry's own statements), and the pairs alternate batch after
//! batch like every other row ([`super::stats`]).

use super::drive::{self, BenchError, BenchResult, Call, Server, check_completed};
use super::endtoend::Context;
use super::fixtures;
use super::report::{Measurement, Outcome, RowId};
use super::stats::{Pairs, Quantity};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A database URL given to the bench instead of a throwaway cluster.
pub const URL_ENV: &str = "CALLID_BENCH_POSTGRES_URL";

/// The PostgreSQL rows asked for in `ctx`.
pub async fn rows(ctx: &Context) -> Vec<(RowId, Outcome)> {
    let wanted: Vec<RowId> = [RowId::PostgresNewOperation, RowId::PostgresReplicas]
        .into_iter()
        .filter(|id| ctx.want.contains(id))
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let database = match Database::get(&ctx.dir) {
        Ok(Some(db)) => db,
        Ok(None) => {
            let reason = format!(
                "PostgreSQL is absent: no server binaries (/usr/lib/postgresql/*/bin/initdb; \
                 `apt-get install -y postgresql`) and no `{URL_ENV}`"
            );
            return wanted
                .into_iter()
                .map(|id| {
                    (
                        id,
                        Outcome::Skipped {
                            reason: reason.clone(),
                        },
                    )
                })
                .collect();
        }
        Err(error) => {
            return wanted
                .into_iter()
                .map(|id| {
                    (
                        id,
                        Outcome::Failed {
                            error: error.clone(),
                        },
                    )
                })
                .collect();
        }
    };
    let mut rows = Vec::new();
    if wanted.contains(&RowId::PostgresNewOperation) {
        let outcome = match new_operation(ctx, &database).await {
            Ok(pairs) => ratio(
                &pairs,
                &format!(
                    "{} sequential `generate_image` calls with new call ids per round on one stdio \
                     router whose registry (and authorization and execution records) is the \
                     database (each write committed with synchronous_commit=on), against {} \
                     prepared single-row INSERTs, each its own commit, on one connection to the \
                     same server; {}",
                    ctx.plan.router_sequential_ops,
                    ctx.plan.router_sequential_ops,
                    database.describe()
                ),
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::PostgresNewOperation, outcome));
    }
    if wanted.contains(&RowId::PostgresReplicas) {
        let outcome = match replicas(ctx, &database).await {
            Ok(pairs) => ratio(
                &pairs,
                &format!(
                    "{} new operations per round over streamable HTTP: {} sessions spread over two \
                     `callid router --http` replicas on one database, against one session on one \
                     replica; both replicas call one `callid provider` process; {}",
                    ctx.plan.concurrent_ops,
                    ctx.plan.in_flight,
                    database.describe()
                ),
            ),
            Err(err) => failed(&err),
        };
        rows.push((RowId::PostgresReplicas, outcome));
    }
    drop(database);
    rows
}

fn failed(err: &BenchError) -> Outcome {
    Outcome::Failed {
        error: drive::chain(err),
    }
}

fn ratio(pairs: &Pairs, note: &str) -> Outcome {
    match pairs.summary() {
        Some(s) => Outcome::Measured(Measurement {
            value: s.ratio,
            figure_median: Some(s.figure),
            baseline_median: Some(s.baseline),
            rounds: s.rounds,
            note: Some(note.to_string()),
        }),
        None => Outcome::Failed {
            error: "no round completed".into(),
        },
    }
}

fn new_spend_call() -> Call {
    Call {
        tool: "generate_image",
        arguments: fixtures::generate_image_arguments(),
        meta: fixtures::codex_meta(drive::next_call()),
    }
}

fn unexpected(what: &str, detail: impl std::fmt::Display) -> BenchError {
    BenchError::Unexpected {
        what: what.to_string(),
        detail: detail.to_string(),
    }
}

/// Where the rows' databases live.
enum Database {
    /// `CALLID_BENCH_POSTGRES_URL`: both rows use this one database.
    Given(String),
    /// A throwaway cluster: each row gets a fresh database.
    Cluster(Cluster),
}

impl Database {
    fn get(scratch: &Path) -> Result<Option<Database>, String> {
        if let Some(url) = std::env::var(URL_ENV).ok().filter(|u| !u.is_empty()) {
            crate::router::registry::PgUrl::parse(&url).map_err(|e| format!("`{URL_ENV}`: {e}"))?;
            return Ok(Some(Database::Given(url)));
        }
        let Some(bindir) = bindir() else {
            return Ok(None);
        };
        Cluster::start(bindir, scratch).map(|c| Some(Database::Cluster(c)))
    }

    /// A database for one row (created fresh on a throwaway cluster).
    fn for_row(&self, name: &str) -> BenchResult<String> {
        match self {
            Database::Given(url) => Ok(url.clone()),
            Database::Cluster(c) => {
                c.psql("postgres", &format!("CREATE DATABASE {name}"))?;
                Ok(c.url(name))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Database::Given(_) => format!("the database of `{URL_ENV}`"),
            Database::Cluster(c) => format!(
                "a throwaway PostgreSQL {} cluster on loopback started by the bench (fsync on)",
                c.version
            ),
        }
    }
}

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb`, or `CALLID_PG_BINDIR`.
fn bindir() -> Option<PathBuf> {
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

/// A throwaway cluster: stopped (`-m immediate`) and deleted when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
    version: String,
}

impl Cluster {
    fn start(bindir: PathBuf, _scratch: &Path) -> Result<Cluster, String> {
        // Not under the bench's scratch directory: the `postgres` user must reach it.
        let dir = tempfile::Builder::new()
            .prefix("callid-bench-pg-")
            .tempdir()
            .map_err(|e| format!("creating the cluster's directory: {e}"))?;
        let as_postgres = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
        };
        if as_postgres {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
                .map_err(|e| format!("opening the cluster's directory to `postgres`: {e}"))?;
        }
        let port = drive::free_loopback_addr()
            .map_err(|e| drive::chain(&e))?
            .port();
        let version = bindir
            .parent()
            .and_then(|p| p.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cluster = Cluster {
            dir,
            bindir,
            port,
            as_postgres,
            version,
        };
        let data = cluster.dir.path().join("data");
        let sock = cluster.dir.path().join("sock");
        let data_arg = data.display().to_string();
        cluster
            .tool(
                "initdb",
                &[
                    "-D",
                    &data_arg,
                    "-U",
                    "callid",
                    "--auth=trust",
                    "--no-locale",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
            )
            .map_err(|e| drive::chain(&e))?;
        std::fs::create_dir_all(&sock).map_err(|e| format!("creating the socket dir: {e}"))?;
        if as_postgres {
            let ok = Command::new("chown")
                .arg("postgres")
                .arg(&sock)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err("`chown postgres` of the cluster's socket directory failed".into());
            }
        }
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             max_connections = 100\nfsync = on\n",
            sock.display()
        );
        let conf_path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)
            .map_err(|e| format!("reading `{}`: {e}", conf_path.display()))?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text)
            .map_err(|e| format!("writing `{}`: {e}", conf_path.display()))?;
        let log = cluster.dir.path().join("server.log").display().to_string();
        cluster
            .tool(
                "pg_ctl",
                &["-D", &data_arg, "-l", &log, "-w", "-t", "60", "start"],
            )
            .map_err(|e| drive::chain(&e))?;
        Ok(cluster)
    }

    fn command(&self, program: &Path, args: &[&str]) -> Command {
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

    fn tool(&self, tool: &str, args: &[&str]) -> BenchResult<()> {
        let out = self
            .command(&self.bindir.join(tool), args)
            .output()
            .map_err(|source| BenchError::Io {
                what: format!("starting `{tool}`"),
                source,
            })?;
        if !out.status.success() {
            return Err(BenchError::Command {
                command: format!("{tool} {}", args.join(" ")),
                detail: format!(
                    "{}; {}",
                    out.status,
                    drive::tail_lines(&String::from_utf8_lossy(&out.stderr), 5)
                ),
            });
        }
        Ok(())
    }

    fn psql(&self, db: &str, sql: &str) -> BenchResult<()> {
        let port = self.port.to_string();
        let out = Command::new(self.bindir.join("psql"))
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "callid",
                "-d",
                db,
            ])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .map_err(|source| BenchError::Io {
                what: "starting `psql`".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(BenchError::Command {
                command: format!("psql -c {sql:?}"),
                detail: drive::tail_lines(&String::from_utf8_lossy(&out.stderr), 5),
            });
        }
        Ok(())
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://callid@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.path().join("data").display().to_string();
        let _ = self
            .command(
                &self.bindir.join("pg_ctl"),
                &["-D", &data, "-m", "immediate", "-w", "stop"],
            )
            .output();
    }
}

/// Prepared single-row inserts, each its own commit, with the registry's session settings.
struct RawInserts {
    client: Option<postgres::Client>,
    insert: postgres::Statement,
    next: u64,
}

impl Drop for RawInserts {
    fn drop(&mut self) {
        // The sync client owns a runtime, which must not be dropped on an async thread.
        let client = self.client.take();
        let _ = std::thread::spawn(move || drop(client)).join();
    }
}

impl RawInserts {
    const WHAT: &str = "the raw PostgreSQL INSERT baseline";

    fn open(url: &str) -> BenchResult<RawInserts> {
        let fail = |e: postgres::Error| unexpected(Self::WHAT, e);
        let url = crate::pg::PgUrl::parse(url).map_err(|e| unexpected(Self::WHAT, e))?;
        let mut client = url
            .connect()
            .map_err(|e| unexpected(Self::WHAT, url.explain(&e)))?;
        client
            .batch_execute(
                "SET synchronous_commit = on;
                 CREATE TABLE IF NOT EXISTS callid_bench_baseline (
                     platform        text NOT NULL,
                     installation_id text NOT NULL,
                     harness_call_id text NOT NULL,
                     operation_key   text NOT NULL,
                     public_handle   text NOT NULL UNIQUE,
                     request_hash    text NOT NULL,
                     status          text NOT NULL,
                     created_at_ms   bigint NOT NULL,
                     PRIMARY KEY (platform, installation_id, harness_call_id)
                 );",
            )
            .map_err(fail)?;
        let insert = client
            .prepare(
                "INSERT INTO callid_bench_baseline
                 VALUES ('codex', 'inst-0001', $1, $2, $3, $4, 'pending', $5)",
            )
            .map_err(fail)?;
        Ok(RawInserts {
            client: Some(client),
            insert,
            next: 0,
        })
    }

    /// Inserts `n` rows, each its own commit; returns rows per second.
    fn batch(&mut self, n: usize) -> BenchResult<f64> {
        let client = self.client.as_mut().expect("open until dropped");
        let start = Instant::now();
        for _ in 0..n {
            self.next += 1;
            let i = self.next;
            client
                .execute(
                    &self.insert,
                    &[
                        &format!("call_{}_{i:024}", uuid::Uuid::new_v4().simple()),
                        &format!("hubu:operation:v1:codex:{}", uuid::Uuid::new_v4()),
                        &format!("hubu:public-operation:v1:{}", uuid::Uuid::new_v4()),
                        &format!("sha256:{i:064x}"),
                        &(i as i64),
                    ],
                )
                .map_err(|e| unexpected(Self::WHAT, e))?;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }
}

async fn new_operation(ctx: &Context, db: &Database) -> BenchResult<Pairs> {
    let url = db.for_row("bench_new_operation")?;
    let data = ctx.dir.join("pg-router-stdio");
    let _ = std::fs::create_dir_all(&data);
    let router = Server::stdio(
        "`callid router --registry postgres://…`",
        &ctx.program,
        &["router".to_string(), "--registry".to_string(), url.clone()],
        &[("XDG_DATA_HOME".to_string(), data.display().to_string())],
    )
    .await?;
    let plan = ctx.plan;
    let result = async {
        let mut raw = tokio::task::block_in_place(|| RawInserts::open(&url))?;
        drive::sequential(
            &router.name,
            &router.conn,
            plan.warm_up.min(10),
            &new_spend_call,
            check_completed,
        )
        .await?;
        tokio::task::block_in_place(|| raw.batch(plan.warm_up.min(10)))?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let per_op = drive::sequential(
                &router.name,
                &router.conn,
                plan.router_sequential_ops,
                &new_spend_call,
                check_completed,
            )
            .await?;
            let b = tokio::task::block_in_place(|| raw.batch(plan.router_sequential_ops))?;
            pairs.push(
                Quantity::OpsPerSecond(1.0 / per_op),
                Quantity::OpsPerSecond(b),
            );
        }
        Ok(pairs)
    }
    .await;
    router.stop().await;
    result
}

/// A `callid provider` process both replicas call, killed when dropped.
struct Provider {
    child: tokio::process::Child,
    url: String,
}

impl Provider {
    async fn start(ctx: &Context) -> BenchResult<Provider> {
        let addr = drive::free_loopback_addr()?;
        let ledger = ctx.dir.join("pg-provider-ledger.sqlite3");
        let mut child = tokio::process::Command::new(&ctx.program)
            .arg("provider")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--ledger")
            .arg(&ledger)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::Io {
                what: "starting `callid provider`".into(),
                source,
            })?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                return Err(unexpected(
                    "`callid provider`",
                    format!("it did not listen on {addr}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Provider {
            child,
            url: format!("http://{addr}"),
        })
    }
}

async fn replica(ctx: &Context, name: &str, url: &str, provider: &str) -> BenchResult<Server> {
    let addr = drive::free_loopback_addr()?;
    let mcp = format!("http://{addr}/mcp");
    Server::http(
        &format!("`callid router --http` replica {name}"),
        &ctx.program,
        &[
            "router".to_string(),
            "--registry".to_string(),
            url.to_string(),
            "--provider-url".to_string(),
            provider.to_string(),
            "--http".to_string(),
            addr.to_string(),
        ],
        addr,
        &mcp,
        &ctx.dir.join(format!("pg-replica-{name}.log")),
    )
    .await
}

async fn replicas(ctx: &Context, db: &Database) -> BenchResult<Pairs> {
    let url = db.for_row("bench_replicas")?;
    let provider = Provider::start(ctx).await?;
    let a = replica(ctx, "a", &url, &provider.url).await?;
    let b = match replica(ctx, "b", &url, &provider.url).await {
        Ok(b) => b,
        Err(e) => {
            a.stop().await;
            return Err(e);
        }
    };
    let plan = ctx.plan;
    let result = async {
        let mut sessions = Vec::with_capacity(plan.in_flight);
        for k in 0..plan.in_flight {
            let (name, at) = if k % 2 == 0 {
                (&a.name, &a.url)
            } else {
                (&b.name, &b.url)
            };
            sessions.push(drive::http_session(name, at.as_deref().unwrap_or_default()).await?);
        }
        let single = std::slice::from_ref(&a.conn);
        let make: Arc<dyn Fn() -> Call + Send + Sync> = Arc::new(new_spend_call);
        let name = "two `callid router` replicas on one database";
        drive::concurrent(
            name,
            &sessions,
            plan.in_flight * 2,
            plan.in_flight,
            make.clone(),
            check_completed,
        )
        .await?;
        drive::concurrent(
            &a.name,
            single,
            plan.warm_up.min(10),
            1,
            make.clone(),
            check_completed,
        )
        .await?;
        let mut pairs = Pairs::new();
        for _ in 0..plan.rounds {
            let many = drive::concurrent(
                name,
                &sessions,
                plan.concurrent_ops,
                plan.in_flight,
                make.clone(),
                check_completed,
            )
            .await?;
            let one = drive::concurrent(
                &a.name,
                single,
                plan.concurrent_ops,
                1,
                make.clone(),
                check_completed,
            )
            .await?;
            pairs.push(Quantity::OpsPerSecond(many), Quantity::OpsPerSecond(one));
        }
        for s in &sessions {
            s.close().await;
        }
        Ok(pairs)
    }
    .await;
    a.stop().await;
    b.stop().await;
    drop(provider.child);
    result
}
