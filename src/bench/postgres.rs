//! The PostgreSQL rows: the router on a PostgreSQL registry beside a raw single-row
//! INSERT+COMMIT on the same server, 16 clients spread over two router replicas on one
//! database beside one client on one replica, and the router with the server 0.5 ms away each
//! way beside the same router with no delay.
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
//!
//! # Round trips and distance
//! Both need the bench's own cluster (with `CALLID_BENCH_POSTGRES_URL` the count is left out
//! and the network row is skipped), and both put a [`Relay`] between a router and the server:
//! - The new-operation row's note gives the round trips one new operation makes to the server,
//!   counted on the wire by the relay ([`super::relay`]) during [`COUNTED_OPERATIONS`]
//!   sequential new operations of a second router (the measured router talks to the server
//!   directly, so the relay's hops never weigh on the row's ratio). One call is in flight, so
//!   every round trip counted lies on some operation's path, unless the router talks to the
//!   server in the background meanwhile.
//! - The network row holds every chunk [`ONE_WAY`] each way in the relay, batch after batch
//!   against the same router through the same relay with no delay; its figure is the latency
//!   added per operation in round trips of the delayed link (added time / (2 x [`ONE_WAY`])).
//!   The delay is the relay's, not the kernel's (`tc qdisc … netem`): a kernel without the
//!   netem queue (this machine's has `CONFIG_NET_SCH_NETEM` unset) could not run the row, and
//!   the relay runs without privileges. The note gives the mean time the relay actually held
//!   each chunk, which on a busy machine is longer than asked.

use super::drive::{self, BenchError, BenchResult, Server, check_completed, check_success};
use super::endtoend::{
    Context, SqliteBaseline, baseline_server, ceiling_note, many_against_one, metered_router,
};
use super::fixtures::{capabilities_call, new_spend_call};
use super::paired::{self, Batch, Calls, Metered, every};
use super::relay::{Counts, Relay};
use super::report::{Measurement, Outcome, RowId};
use super::stats::{Pairs, Quantity, median};
use crate::storage::cluster::{self, Cluster};
use std::time::{Duration, Instant};

/// The one-way delay of the network row.
pub const ONE_WAY: Duration = Duration::from_micros(500);

/// Sequential new operations whose round trips the new-operation row counts.
pub const COUNTED_OPERATIONS: usize = 20;

/// A database URL given to the bench instead of a throwaway cluster.
pub const URL_ENV: &str = "CALLID_BENCH_POSTGRES_URL";

/// The PostgreSQL rows asked for in `ctx`.
pub async fn rows(ctx: &Context) -> Vec<(RowId, Outcome)> {
    let wanted: Vec<RowId> = [
        RowId::PostgresNewOperation,
        RowId::PostgresReplicas,
        RowId::PostgresNetwork,
    ]
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
                    ceiling,
                    "two of the baseline's commits (the row before dispatch, the result), \
                     one SQLite commit (the in-process provider's ledger) and one bare rmcp \
                     round trip (`callid bench --serve-baseline`)"
                )
            ),
            Err(_) => String::new(),
        };
        let counted = match &result {
            Ok(_) => round_trips_note(ctx, &database).await,
            Err(_) => String::new(),
        };
        let outcome = paired::outcome(
            &result.map(|(pairs, _)| pairs),
            &format!(
                "{} sequential `generate_image` calls with new call ids per round on one stdio \
                     router whose registry (and authorization and execution records) is the \
                     database (each write committed with synchronous_commit=on), against {} \
                     prepared single-row INSERTs, each its own commit, on one connection to the \
                     same server; {}{}{}",
                ctx.plan.router_sequential_ops,
                ctx.plan.router_sequential_ops,
                database.describe(),
                counted,
                ceiling
            ),
        );
        rows.push((RowId::PostgresNewOperation, outcome));
    }
    if wanted.contains(&RowId::PostgresReplicas) {
        let result = replicas(ctx, &database).await;
        let cpu = result.as_ref().ok().map(|(_, cpu)| cpu.clone());
        let (figure, baseline) = ("16 clients", "1 client");
        let outcome = paired::outcome(
            &result.map(|(pairs, _)| pairs),
            &format!(
                "{} new operations per round over streamable HTTP: {} sessions spread over two \
                     `callid router --http` replicas on one database, against one session on one \
                     replica; both replicas call one `callid provider` process; {}{}{}",
                ctx.plan.concurrent_ops,
                ctx.plan.in_flight,
                database.describe(),
                cpu.as_ref()
                    .map_or(String::new(), |cpu| paired::cpu_per_op_note(
                        &cpu.per_op,
                        figure,
                        baseline
                    )),
                paired::cpu_note(
                    cpu.and_then(|cpu| cpu.cores),
                    "the 16-client batches",
                    "the 1-client batches"
                )
            ),
        );
        rows.push((RowId::PostgresReplicas, outcome));
    }
    if wanted.contains(&RowId::PostgresNetwork) {
        rows.push((RowId::PostgresNetwork, network_row(ctx, &database).await));
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

    /// The server's address, for a relay in front of it (the bench's own cluster only).
    fn server_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Database::Given(_) => None,
            Database::Cluster(c) => Some(std::net::SocketAddr::from(([127, 0, 0, 1], c.port()))),
        }
    }

    /// The PostgreSQL server's processes, for CPU time (the bench's own cluster only).
    fn metered(&self) -> Option<Metered> {
        match self {
            Database::Given(_) => None,
            Database::Cluster(c) => c.postmaster_pid().map(|pid| Metered {
                name: "PostgreSQL".into(),
                pid,
                children: true,
            }),
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

/// The new-operation rounds, and the row's ceiling on this machine (see [`rows`]' note), with the
/// CPU time of the router and of the bench's own PostgreSQL server during the router's batches.
async fn new_operation(ctx: &Context, db: &Database) -> BenchResult<(Pairs, paired::Ceiling)> {
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
    let mut metered = metered_router(router.pid());
    metered.extend(db.metered());
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
            &metered,
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

async fn replicas(ctx: &Context, db: &Database) -> BenchResult<(Pairs, paired::Cpu)> {
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
        let metered = |name: &str, pid: Option<u32>, children| {
            pid.map(|pid| Metered {
                name: name.into(),
                pid,
                children,
            })
        };
        let processes: Vec<Metered> = [
            metered("replicas", a.pid(), false),
            metered("replicas", b.pid(), false),
            metered("provider", provider.child.id(), false),
            db.metered(),
            metered("clients (this bench)", Some(std::process::id()), false),
        ]
        .into_iter()
        .flatten()
        .collect();
        let pairs = many_against_one(plan, many, one, &processes).await?;
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

/// A stdio router whose registry reaches the server through `relay`, on database `name`.
async fn relayed_router(ctx: &Context, relay: &Relay, name: &str) -> BenchResult<Server> {
    let data = ctx.dir.join(format!("pg-relayed-{name}"));
    let _ = std::fs::create_dir_all(&data);
    let url = format!("postgres://callid@{}/{name}", relay.addr());
    Server::stdio(
        "`callid router --registry postgres://…` (through the bench's relay)",
        &ctx.program,
        &["router".to_string(), "--registry".to_string(), url],
        &[("XDG_DATA_HOME".to_string(), data.display().to_string())],
    )
    .await
}

fn relay_error(error: std::io::Error) -> BenchError {
    BenchError::Io {
        what: "starting the bench's relay in front of PostgreSQL".into(),
        source: error,
    }
}

/// Round trips per new operation: [`COUNTED_OPERATIONS`] sequential new operations of a router
/// whose registry connections go through a relay, after a warm-up.
async fn count_round_trips(ctx: &Context, db: &Database) -> BenchResult<Option<f64>> {
    let Some(server) = db.server_addr() else {
        return Ok(None);
    };
    db.for_row("bench_round_trips")?;
    let relay = Relay::start(server).map_err(relay_error)?;
    let router = relayed_router(ctx, &relay, "bench_round_trips").await?;
    let calls = Calls::on(&router, &new_spend_call, check_completed);
    let result = async {
        calls.sequential(ctx.plan.warm_up.min(10)).await?;
        let before = relay.counts();
        calls.sequential(COUNTED_OPERATIONS).await?;
        let counted = relay.counts().since(before);
        Ok(Some(counted.round_trips as f64 / COUNTED_OPERATIONS as f64))
    }
    .await;
    router.stop().await;
    result
}

/// The new-operation row's note on its round trips (why not, when they cannot be counted).
async fn round_trips_note(ctx: &Context, db: &Database) -> String {
    match count_round_trips(ctx, db).await {
        Ok(Some(per_op)) => format!(
            "; {per_op:.1} round trips to the server per new operation (counted on the wire by \
             the bench's relay over {COUNTED_OPERATIONS} sequential new operations of a second \
             router)"
        ),
        Ok(None) => format!(
            "; round trips not counted: `{URL_ENV}` names the server (the count needs the \
             bench's own cluster)"
        ),
        Err(error) => format!("; round trips not counted: {}", drive::chain(&error)),
    }
}

/// What the network row measured: the pairs (delayed, then not), the per-round latency added,
/// and what the relay counted on each side.
struct Network {
    pairs: Pairs,
    added: Vec<f64>,
    far: Counts,
    near: Counts,
    operations: usize,
}

async fn network(
    ctx: &Context,
    db: &Database,
    server: std::net::SocketAddr,
) -> BenchResult<Network> {
    db.for_row("bench_network")?;
    let relay = Relay::start(server).map_err(relay_error)?;
    let router = relayed_router(ctx, &relay, "bench_network").await?;
    let plan = ctx.plan;
    let calls = Calls::on(&router, &new_spend_call, check_completed);
    let result = async {
        calls.sequential(plan.warm_up.min(10)).await?;
        let mut measured = Network {
            pairs: Pairs::new(),
            added: Vec::with_capacity(plan.rounds),
            far: Counts::default(),
            near: Counts::default(),
            operations: 0,
        };
        let n = plan.router_sequential_ops;
        for _ in 0..plan.rounds {
            let side = async |delay: Duration| -> BenchResult<(f64, Counts)> {
                relay.set_delay(delay);
                let before = relay.counts();
                let seconds = calls.sequential(n).await?;
                Ok((seconds, relay.counts().since(before)))
            };
            let (far, far_counts) = side(ONE_WAY).await?;
            let (near, near_counts) = side(Duration::ZERO).await?;
            measured.far = add(measured.far, far_counts);
            measured.near = add(measured.near, near_counts);
            measured.operations += n;
            measured
                .pairs
                .push(Quantity::SecondsPerOp(far), Quantity::SecondsPerOp(near));
            measured.added.push(far - near);
        }
        Ok(measured)
    }
    .await;
    relay.set_delay(Duration::ZERO);
    router.stop().await;
    result
}

fn add(a: Counts, b: Counts) -> Counts {
    Counts {
        round_trips: a.round_trips + b.round_trips,
        chunks: a.chunks + b.chunks,
        held: a.held + b.held,
    }
}

/// The network row: latency added per new operation, in round trips of the delayed link.
async fn network_row(ctx: &Context, db: &Database) -> Outcome {
    let Some(server) = db.server_addr() else {
        return Outcome::Skipped {
            reason: format!(
                "`{URL_ENV}` names the server: the delayed link is the bench's relay in front of \
                 its own cluster (unset `{URL_ENV}` to run this row)"
            ),
        };
    };
    let measured = match network(ctx, db, server).await {
        Ok(measured) => measured,
        Err(error) => return paired::failed(&error),
    };
    let (Some(summary), Some(added)) = (measured.pairs.summary(), median(&measured.added)) else {
        return Outcome::Failed {
            error: "no round completed".into(),
        };
    };
    let round_trip = 2.0 * ONE_WAY.as_secs_f64();
    let ops = measured.operations.max(1) as f64;
    let note = format!(
        "{} sequential `generate_image` calls with new call ids per round on one stdio router \
         whose registry reaches the server through the bench's relay, every chunk held {} ms \
         each way (a round trip of {} ms), against the same router through the same relay with \
         no delay; {}; median added latency {:.2} ms per new operation, {:.1} round trips to the \
         server per new operation counted by the relay ({:.1} at no delay), each chunk held \
         {:.3} ms on average each way",
        ctx.plan.router_sequential_ops,
        ONE_WAY.as_secs_f64() * 1e3,
        round_trip * 1e3,
        db.describe(),
        added * 1e3,
        measured.far.round_trips as f64 / ops,
        measured.near.round_trips as f64 / ops,
        measured.far.mean_hold().as_secs_f64() * 1e3,
    );
    Outcome::Measured(Measurement {
        value: added / round_trip,
        figure_median: Some(summary.figure),
        baseline_median: Some(summary.baseline),
        rounds: summary.rounds,
        note: Some(note),
    })
}
