//! The PostgreSQL rows: the router on a PostgreSQL registry beside a raw single-row
//! INSERT+COMMIT on the same server, and 16 clients spread over two router replicas on one
//! database beside one client on one replica.
//!
//! The database is `CALLID_BENCH_POSTGRES_URL` when set (a throwaway database: the bench creates
//! callid's tables and a `callid_bench_baseline` table in it and leaves its rows behind);
//! otherwise the bench starts its own throwaway cluster ([`crate::storage::cluster`], the one the
//! integration tests use) from the newest `/usr/lib/postgresql/*/bin` (or `CALLID_PG_BINDIR`):
//! `initdb` on a temp directory (as the `postgres` user when the bench runs as root, since the
//! server refuses root), a free loopback port, `fsync` on, stopped with `pg_ctl -m immediate`
//! and deleted afterwards.
//! Without either, both rows are `skipped`, saying PostgreSQL is absent.
//!
//! What the rows guarantee: every router answer is checked (a completed new operation), the
//! raw baseline commits each row with `synchronous_commit = on` through a prepared statement
//! (one round trip, as the registry's own statements), and the pairs alternate batch after
//! batch like every other row ([`super::stats`]).

use super::drive::{self, BenchError, BenchResult, Server, check_completed, check_success};
use super::endtoend::{Context, SqliteBaseline, baseline_server, ceiling_note, many_against_one};
use super::fixtures::{capabilities_call, new_spend_call};
use super::paired::{self, Batch, Calls, every};
use super::report::{Outcome, RowId};
use super::stats::Pairs;
use crate::storage::cluster::{self, Cluster};
use std::time::Instant;

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
    let database = match Database::get() {
        Ok(Some(db)) => db,
        Ok(None) => {
            let reason = format!(
                "PostgreSQL is absent: no server binaries (/usr/lib/postgresql/*/bin/initdb; \
                 `apt-get install -y postgresql`) and no `{URL_ENV}`"
            );
            return every(wanted, &Outcome::Skipped { reason });
        }
        Err(error) => return every(wanted, &Outcome::Failed { error }),
    };
    let mut rows = Vec::new();
    if wanted.contains(&RowId::PostgresNewOperation) {
        let result = new_operation(ctx, &database).await;
        let ceiling = match &result {
            Ok((_, ceiling)) => format!(
                "; {}",
                ceiling_note(
                    *ceiling,
                    "two of the baseline's commits (the row before dispatch, the result), \
                     one SQLite commit (the in-process provider's ledger) and one bare rmcp \
                     round trip (`callid bench --serve-baseline`)"
                )
            ),
            Err(_) => String::new(),
        };
        let outcome = paired::outcome(
            &result.map(|(pairs, _)| pairs),
            &format!(
                "{} sequential `generate_image` calls with new call ids per round on one stdio \
                     router whose registry (and authorization and execution records) is the \
                     database (each write committed with synchronous_commit=on), against {} \
                     prepared single-row INSERTs, each its own commit, on one connection to the \
                     same server; {}{}",
                ctx.plan.router_sequential_ops,
                ctx.plan.router_sequential_ops,
                database.describe(),
                ceiling
            ),
        );
        rows.push((RowId::PostgresNewOperation, outcome));
    }
    if wanted.contains(&RowId::PostgresReplicas) {
        let result = replicas(ctx, &database).await;
        let cpu = result.as_ref().ok().and_then(|(_, cpu)| *cpu);
        let outcome = paired::outcome(
            &result.map(|(pairs, _)| pairs),
            &format!(
                "{} new operations per round over streamable HTTP: {} sessions spread over two \
                     `callid router --http` replicas on one database, against one session on one \
                     replica; both replicas call one `callid provider` process; {}{}",
                ctx.plan.concurrent_ops,
                ctx.plan.in_flight,
                database.describe(),
                paired::cpu_note(cpu, "the 16-client batches", "the 1-client batches")
            ),
        );
        rows.push((RowId::PostgresReplicas, outcome));
    }
    drop(database);
    rows
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
    fn get() -> Result<Option<Database>, String> {
        if let Some(url) = std::env::var(URL_ENV).ok().filter(|u| !u.is_empty()) {
            crate::spend::registry::PgUrl::parse(&url).map_err(|e| format!("`{URL_ENV}`: {e}"))?;
            return Ok(Some(Database::Given(url)));
        }
        let Some(bindir) = cluster::bindir() else {
            return Ok(None);
        };
        Cluster::start(bindir)
            .map(|c| Some(Database::Cluster(c)))
            .map_err(|e| drive::chain(&e))
    }

    /// A database for one row (created fresh on a throwaway cluster).
    fn for_row(&self, name: &str) -> BenchResult<String> {
        match self {
            Database::Given(url) => Ok(url.clone()),
            Database::Cluster(c) => {
                c.sql("postgres", &format!("CREATE DATABASE {name}"))?;
                Ok(c.url(name))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Database::Given(_) => format!("the database of `{URL_ENV}`"),
            Database::Cluster(c) => format!(
                "a throwaway PostgreSQL {} cluster on loopback started by the bench (fsync on)",
                c.version()
            ),
        }
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
        crate::storage::postgres::drop_off_runtime(client);
    }
}

impl RawInserts {
    const WHAT: &str = "the raw PostgreSQL INSERT baseline";

    fn open(url: &str) -> BenchResult<RawInserts> {
        let fail = |e: postgres::Error| unexpected(Self::WHAT, e);
        let url =
            crate::storage::postgres::PgUrl::parse(url).map_err(|e| unexpected(Self::WHAT, e))?;
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

/// The new-operation rounds, and the row's ceiling on this machine (see [`rows`]' note).
async fn new_operation(ctx: &Context, db: &Database) -> BenchResult<(Pairs, f64)> {
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
    let echo = match baseline_server(ctx).await {
        Ok(echo) => echo,
        Err(err) => {
            router.stop().await;
            return Err(err);
        }
    };
    let result = async {
        let mut raw = tokio::task::block_in_place(|| RawInserts::open(&url))?;
        let calls = Calls::on(&router, &new_spend_call, check_completed);
        calls.sequential(plan.warm_up.min(10)).await?;
        let mut inserts = Batch::Blocking(Box::new(move |n| raw.batch(n)));
        inserts.run(plan.warm_up.min(10)).await?;
        let mut sqlite = SqliteBaseline::open(&data.join("baseline.sqlite3"))?;
        let on_echo = Calls::on(&echo, &capabilities_call, check_success);
        on_echo.sequential(plan.warm_up.min(10)).await?;
        paired::rounds_with_ceiling(
            plan.rounds,
            plan.router_sequential_ops,
            &mut Batch::SequentialRate(calls),
            &mut inserts,
            &mut paired::Floor {
                baseline: 2.0,
                others: vec![
                    (
                        Batch::Blocking(Box::new(move |n| sqlite.insert_batch(n))),
                        1.0,
                    ),
                    (Batch::Sequential(on_echo), 1.0),
                ],
            },
        )
        .await
    }
    .await;
    echo.stop().await;
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
        if drive::wait_listening(&mut child, addr).await.is_err() {
            return Err(unexpected(
                "`callid provider`",
                format!("it did not listen on {addr}"),
            ));
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

async fn replicas(ctx: &Context, db: &Database) -> BenchResult<(Pairs, paired::CoresBusy)> {
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
        let many = Calls {
            name: "two `callid router` replicas on one database",
            conns: &sessions,
            make: &new_spend_call,
            check: check_completed,
        };
        let one = Calls::on(&a, &new_spend_call, check_completed);
        let pairs = many_against_one(plan, many, one).await?;
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
