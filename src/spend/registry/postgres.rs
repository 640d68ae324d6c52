//! The PostgreSQL backend of the registry: one database shared by every replica of a router
//! (see the module docs of [`super`] for what it guarantees).
//!
//! Two connections per open registry: one runs the statements (each write one transaction,
//! committed with `synchronous_commit = on`), the other sits idle holding this replica's
//! session-level advisory lock, which the server releases the moment the replica's connection
//! drops (process killed, machine gone once TCP notices, or its session lost while it lives).
//! A lease whose owner's lock is no longer granted is taken over at once only while its row
//! carries no dispatch mark; a dispatched row waits for its lease to expire ([`CLAIM`], the
//! takeover rule of [`super`]). A [sibling](PgRegistry::sibling) (another thread of the
//! replica) has a statement connection of its own and shares the liveness lock, so the leases of
//! every connection of a replica carry one key and live or die together. A failed connection is
//! dropped and opened again (the liveness lock retaken) on the next call, so the router fails
//! closed while the database is down and recovers when it returns.
//!
//! It holds the statements of the storage primitives ([`RegistryStore`], [`StoreTx`]); the rules
//! that use them are `machine.rs`'s. Every primitive is one prepared statement, and so is every
//! statement a layer runs in the registry's transaction (prepared once per connection, then only
//! bound and executed: the server does not parse or plan it again); a step that needs no
//! transaction runs without `BEGIN`/`COMMIT`. The statement connection pipelines
//! ([`PgSession`]): an explicit transaction's `BEGIN` leaves with its first statement, and the
//! row's insert (the result's record) leaves with the first statement of the layer step sent
//! beside it ([`StoreTx::insert_then`], [`StoreTx::apply_then`]); the machine rolls back what
//! that step wrote when the row was not created (the result was fenced). `COMMIT` waits for the
//! answers, so the rule in Rust decides it. Round trips of a new operation, counted at the
//! socket (`callid bench --only postgres_new_operation`): the row 1 (its insert with its lease,
//! which is the look-up too: [`INSERT`]) and the result 1 when nothing commits beside them;
//! with the built-in router's layers (one statement each way when no budget is checked), the
//! row 2 (`BEGIN`, insert and the layers' rows in one flight, then `COMMIT`) and the result 2
//! (`BEGIN`, record and the layers' receipt and charge, then `COMMIT`): 4 in all. A redelivery
//! the reply cache did not answer: 1 (the insert answers the recorded row), 2 with the layers
//! (their rows rolled back); counted by `tests/it/replicas.rs`.

use super::machine::{CallKey, Claimed, Inserted, RegistryStore, Step, StoreTx};
use super::{
    Approval, InTransaction, NewOperation, Operation, RawRow, RegistryError, Status, now_ms,
};
use crate::storage::LayerTx;
use crate::storage::postgres::{PgSession, PgStatements, PgUrl, drop_off_runtime};
use postgres::types::{ToSql, Type};
use postgres::{Client, Statement};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The advisory-lock namespace of callid (the registry's SQLite application id, `"cLiD"`):
/// `(NAMESPACE, 0)` serializes migrations, `(NAMESPACE, k)` with `k > 0` is a replica's life.
const NAMESPACE: i32 = crate::storage::schema::registry::APPLICATION_ID;

/// The advisory-lock namespace of budgeted inserts (`"cLGB"`): `(BUDGET_NAMESPACE,
/// hashtext(installation id))` serializes the budget check and insert of one installation.
const BUDGET_NAMESPACE: i32 = 0x634c_4742;

/// An open PostgreSQL registry: a statement connection, and this replica's liveness lock, which
/// it shares with its [siblings](PgRegistry::sibling).
pub struct PgRegistry {
    url: PgUrl,
    conn: Option<PgSession>,
    /// When `conn` last answered ([`crate::storage::postgres::session_gone`]).
    answered: Instant,
    liveness: Arc<Liveness>,
    /// Prepared statements of `conn` by their text: the registry's own and the layers' (see
    /// [`Prepared`]).
    statements: HashMap<Box<str>, Statement>,
    /// The liveness lock's key as of the last statement: the leases this registry takes and
    /// fences carry it.
    lock_key: i32,
    installation_id: String,
}

/// A replica's liveness: one idle connection holding a session-level advisory lock on `key`,
/// shared by every statement connection of the replica's registry, so a lease taken on one
/// connection can be fenced on another. Reconnected (the same key when still free) by the first
/// statement that finds it gone.
#[derive(Default)]
struct Liveness {
    state: Mutex<LiveState>,
}

#[derive(Default)]
struct LiveState {
    client: Option<Client>,
    /// When `client` was last found alive ([`crate::storage::postgres::session_gone`]).
    checked: Option<Instant>,
    key: i32,
}

impl Drop for Liveness {
    fn drop(&mut self) {
        let client = self
            .state
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .client
            .take();
        drop_off_runtime(client);
    }
}

impl std::fmt::Debug for PgRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRegistry")
            .field("url", &self.url)
            .field("installation_id", &self.installation_id)
            .finish()
    }
}

impl Drop for PgRegistry {
    fn drop(&mut self) {
        // The sync client runs its own runtime, which must not be dropped inside an async task.
        let client = self.conn.take();
        drop_off_runtime(client);
    }
}

/// The server's side of a session's TCP keepalives, as the client's ([`PgUrl`]): a peer that
/// vanished without a FIN (machine gone, network cut) is noticed in about 8 s, so its half-open
/// session, and the liveness lock it holds, do not outlive it on the server by minutes.
/// Ignored on a Unix socket.
macro_rules! server_keepalives {
    () => {
        "SET tcp_keepalives_idle = 5;
         SET tcp_keepalives_interval = 1;
         SET tcp_keepalives_count = 3;
         SET tcp_user_timeout = 8000;"
    };
}

/// Whether the replica holding row `o`'s lease still holds its liveness lock: an advisory lock
/// in callid's namespace (the parameter named) on the row's `lease_lock`, granted on this
/// database. A row with no `lease_lock` has no live holder.
macro_rules! holder_alive {
    ($namespace:literal) => {
        concat!(
            r"(o.lease_lock IS NOT NULL AND EXISTS (
               SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND l.classid = ",
            $namespace,
            r"::integer::oid AND l.objid = o.lease_lock::oid AND l.objsubid = 2))"
        )
    };
}

/// The columns of a row, as [`row_to_raw`] reads them.
macro_rules! column_list {
    () => {
        r"platform, harness_call_id, handle, operation_key, tool, request_hash,
            arguments, amount_cents, status, approval, result, error_code, error_message,
            source_installation, charged_cents, at_most_once, dispatched_ms, resolution,
            resolved_by, resolved_ms"
    };
}

/// `column_list!` of `callid_operations`.
macro_rules! columns {
    () => {
        concat!("SELECT ", column_list!(), " FROM callid_operations ")
    };
}

const FIND: &str = concat!(
    columns!(),
    r"WHERE platform = $1 AND installation_id = $2 AND harness_call_id = $3
      AND source_installation = $4"
);

const FIND_BY_HANDLE: &str = concat!(columns!(), "WHERE handle = $1 AND installation_id = $2");

/// The new row, with its dispatch lease when `$14` (the owner) is not null: a row that did not
/// exist has no lease to take over, so the insert takes it ([`CLAIM`]'s round trip saved).
/// A row leased now is dispatched next: its dispatch mark (`dispatch_generation`; and
/// `dispatched_ms` for an at-most-once row, `$17`) commits with it.
///
/// The insert is the look-up: it answers one row, the columns of the row its call identity had
/// when the statement began ([`row_to_raw`]; all null when there was none, and when the row it
/// conflicted with was committed after that, which a fresh statement then reads), and last
/// ([`CREATED`]) whether it created the row. So a redelivery that misses the reply cache costs
/// no round trip of its own.
const INSERT: &str = concat!(
    r"WITH inserted AS (
    INSERT INTO callid_operations (platform, installation_id, harness_call_id,
        handle, operation_key, tool, request_hash, arguments, amount_cents, status, approval,
        created_ms, updated_ms, source_installation, lease_owner, lease_lock, lease_expires,
        at_most_once, lease_generation, dispatch_generation, dispatched_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13, $14, $15,
        CASE WHEN $14::text IS NULL THEN NULL
             ELSE clock_timestamp() + ($16::bigint * interval '1 millisecond') END,
        $17,
        CASE WHEN $14::text IS NULL THEN 0 ELSE 1 END,
        CASE WHEN $14::text IS NOT NULL THEN 1 END,
        CASE WHEN $14::text IS NOT NULL AND $17 THEN $12::bigint END)
    ON CONFLICT (platform, installation_id, source_installation, harness_call_id) DO NOTHING
    RETURNING 1)
    SELECT ",
    column_list!(),
    r", EXISTS (SELECT 1 FROM inserted)
    FROM (SELECT 1) AS one LEFT JOIN callid_operations
        ON platform = $1 AND installation_id = $2 AND harness_call_id = $3
        AND source_installation = $13"
);

/// The column of [`INSERT`]'s answer that says whether it created the row.
const CREATED: usize = 20;

/// One conditional UPDATE, on the server's clock, of the takeover rule of [`super`]
/// (`## Concurrency`): the lease is free, already ours, or expired; or the row carries no
/// dispatch mark and its holder's advisory lock is no longer granted (its connection is gone). A
/// lost lock alone never takes over a dispatched row: its holder may be alive with its request
/// open, and renews the lease once it reconnects. The lease counts the generation up and sets
/// the row's dispatch mark; an at-most-once row that carries a dispatch mark already
/// (dispatched, never settled) is marked `in_doubt` with reason `$6` instead, and no lease is
/// taken. Answers the row's status and generation after.
const CLAIM: &str = concat!(
    "UPDATE callid_operations o
    SET status = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                      THEN 'in_doubt' ELSE o.status END,
        error_code = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                          THEN 'outcome_in_doubt' ELSE o.error_code END,
        error_message = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                             THEN $6::text ELSE o.error_message END,
        lease_owner = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                           THEN NULL ELSE $2::text END,
        lease_lock = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                          THEN NULL ELSE $3::integer END,
        lease_expires = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                             THEN NULL
                             ELSE clock_timestamp() + ($4::bigint * interval '1 millisecond') END,
        lease_generation = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                                THEN o.lease_generation ELSE o.lease_generation + 1 END,
        dispatch_generation = CASE WHEN o.at_most_once AND o.dispatch_generation IS NOT NULL
                                   THEN o.dispatch_generation
                                   ELSE o.lease_generation + 1 END,
        dispatched_ms = CASE WHEN o.dispatch_generation IS NOT NULL THEN o.dispatched_ms
                             WHEN o.at_most_once THEN $7::bigint END,
        updated_ms = $7::bigint
    WHERE o.handle = $1 AND o.status = 'pending'
      AND (o.lease_owner IS NULL OR o.lease_owner = $2
           OR o.lease_expires IS NULL OR o.lease_expires <= clock_timestamp()
           OR (o.dispatch_generation IS NULL AND NOT ",
    holder_alive!("$5"),
    r"))
    RETURNING o.status, o.lease_generation"
);

/// The cents committed by an installation's operations, as the SQLite backend counts them: the
/// running total of its completed operations and its open rows (migration 4), in one statement
/// (one snapshot: a result committed meanwhile is counted once, in one or the other).
const COMMITTED: &str = concat!(
    "SELECT ((SELECT COALESCE(SUM(completed_cents), 0)
            FROM callid_installation_totals WHERE installation_id = $1)
        + (SELECT COALESCE(SUM(amount_cents), 0) FROM callid_operations
            WHERE installation_id = $1 AND status IN ",
    super::open_statuses!(),
    "))::bigint"
);

/// The budget lock of an installation ([`StoreTx::lock_budget`]).
const BUDGET_LOCK: &str = "SELECT pg_advisory_xact_lock($1, hashtext($2))";

/// A row's status after a claim that took nothing, and, when its lease is held by another
/// replica whose liveness lock is gone on a dispatched row ([`CLAIM`] waits for its expiry),
/// the milliseconds until it expires.
const STATUS_OF: &str = concat!(
    r"SELECT o.status,
        CASE WHEN o.status = 'pending' AND o.dispatch_generation IS NOT NULL
                  AND o.lease_owner IS DISTINCT FROM $2 AND NOT ",
    holder_alive!("$3"),
    r"
             THEN GREATEST(0, (EXTRACT(EPOCH FROM (o.lease_expires - clock_timestamp()))
                               * 1000)::bigint)
        END
    FROM callid_operations o WHERE o.handle = $1"
);

const RELEASE: &str = "UPDATE callid_operations SET lease_owner = NULL, lease_lock = NULL,
        lease_expires = NULL, dispatch_generation = NULL, dispatched_ms = NULL
    WHERE handle = $1 AND lease_generation = $2 AND status = 'pending'";

/// Extends a lease under its generation, and moves it to the replica's liveness key as of now
/// (`$4`): after a reconnection the lock may be held under a new key.
const RENEW: &str = "UPDATE callid_operations
    SET lease_expires = clock_timestamp() + ($3::bigint * interval '1 millisecond'),
        lease_lock = $4
    WHERE handle = $1 AND lease_generation = $2 AND status = 'pending'
      AND lease_owner IS NOT NULL";

const MARK_IN_DOUBT: &str = "UPDATE callid_operations SET status = 'in_doubt',
        error_code = 'outcome_in_doubt', error_message = $3, lease_owner = NULL,
        lease_lock = NULL, lease_expires = NULL, updated_ms = $4
    WHERE handle = $1 AND status = 'pending' AND lease_generation = $2";

/// The fence of a dispatcher's write (`$5`: its lease generation), as on SQLite: the row is
/// still pending under its lease, or in doubt after a dispatch under it.
macro_rules! fence {
    () => {
        r"((status = 'pending' AND lease_generation = $5)
          OR (status = 'in_doubt' AND dispatch_generation = $5))"
    };
}

/// Fenced ([`fence`]): only the dispatcher holding the row's lease generation records.
const RECORD_RESULT: &str = concat!(
    "UPDATE callid_operations SET status = 'completed', result = $2,
        lease_owner = NULL, lease_lock = NULL, lease_expires = NULL, updated_ms = $3,
        charged_cents = $4, error_code = NULL, error_message = NULL
    WHERE handle = $1 AND ",
    fence!()
);

const RECORD_FAILURE: &str = concat!(
    "UPDATE callid_operations SET status = 'failed', error_code = $2,
        error_message = $3, lease_owner = NULL, lease_lock = NULL, lease_expires = NULL,
        updated_ms = $4
    WHERE handle = $1 AND ",
    fence!()
);

const RESOLVE_CHARGED: &str = "UPDATE callid_operations SET status = 'completed', result = $3,
        charged_cents = amount_cents, error_code = NULL, error_message = NULL,
        resolution = 'charged', resolved_by = $4, resolved_ms = $5, updated_ms = $5
    WHERE handle = $1 AND installation_id = $2 AND status = 'in_doubt'";

const RESOLVE_NOT_CHARGED: &str = "UPDATE callid_operations SET status = 'pending',
        dispatch_generation = NULL, dispatched_ms = NULL, error_code = NULL,
        error_message = NULL, resolution = 'not_charged', resolved_by = $3, resolved_ms = $4,
        updated_ms = $4
    WHERE handle = $1 AND installation_id = $2 AND status = 'in_doubt'";

const APPROVE: &str = "UPDATE callid_operations SET status = 'pending', approval = 'approved',
        updated_ms = $3
    WHERE handle = $1 AND installation_id = $2 AND status = 'awaiting_approval'";

const DENY: &str = "UPDATE callid_operations SET status = 'denied', approval = 'denied',
        error_code = 'operation_denied', error_message = $3, updated_ms = $4
    WHERE handle = $1 AND installation_id = $2 AND status = 'awaiting_approval'";

fn row_to_raw(r: &postgres::Row) -> Result<RawRow, postgres::Error> {
    Ok(RawRow {
        platform: r.try_get(0)?,
        harness_call_id: r.try_get(1)?,
        handle: r.try_get(2)?,
        key: r.try_get(3)?,
        tool: r.try_get(4)?,
        request_hash: r.try_get(5)?,
        arguments: r.try_get(6)?,
        amount_cents: r.try_get(7)?,
        status: r.try_get(8)?,
        approval: r.try_get(9)?,
        result: r.try_get(10)?,
        error_code: r.try_get(11)?,
        error_message: r.try_get(12)?,
        source_installation: r.try_get(13)?,
        charged_cents: r.try_get(14)?,
        at_most_once: r.try_get(15)?,
        dispatched_ms: r.try_get(16)?,
        resolution: r.try_get(17)?,
        resolved_by: r.try_get(18)?,
        resolved_ms: r.try_get(19)?,
    })
}

impl PgRegistry {
    /// Connects, checks the server keeps commits (`fsync`), migrates the schema under an
    /// advisory lock (one replica applies it), takes this replica's liveness lock and reads the
    /// shared installation id.
    pub fn open(url: &PgUrl) -> Result<PgRegistry, RegistryError> {
        let mut registry = PgRegistry {
            url: url.clone(),
            conn: None,
            answered: Instant::now(),
            liveness: Arc::new(Liveness::default()),
            statements: HashMap::new(),
            lock_key: 0,
            installation_id: String::new(),
        };
        registry.connect()?;
        let id = uuid::Uuid::new_v4().to_string();
        registry.installation_id = registry.run("recording the installation id", |c, _| {
            c.block_on(async {
                c.client()
                    .execute(
                        "INSERT INTO callid_settings (name, value) VALUES ('installation_id', $1)
                         ON CONFLICT (name) DO NOTHING",
                        &[&id],
                    )
                    .await?;
                c.client()
                    .query_one(
                        "SELECT value FROM callid_settings WHERE name = 'installation_id'",
                        &[],
                    )
                    .await?
                    .try_get(0)
            })
        })?;
        Ok(registry)
    }

    fn err(&self, doing: &'static str) -> impl Fn(postgres::Error) -> RegistryError + '_ {
        move |cause| RegistryError::Postgres {
            url: self.url.clone(),
            doing,
            cause,
        }
    }

    fn refused(&self, detail: String) -> RegistryError {
        RegistryError::Refused {
            url: self.url.clone(),
            detail,
        }
    }

    /// Another registry on the same database for another thread of this replica: a statement
    /// connection of its own (opened on first use), the same liveness lock and installation.
    pub fn sibling(&self) -> PgRegistry {
        PgRegistry {
            url: self.url.clone(),
            conn: None,
            answered: Instant::now(),
            liveness: self.liveness.clone(),
            statements: HashMap::new(),
            lock_key: self.lock_key,
            installation_id: self.installation_id.clone(),
        }
    }

    /// Opens the statement connection (again), sets the session up and migrates; then makes
    /// sure the liveness lock is held.
    fn connect(&mut self) -> Result<(), RegistryError> {
        self.conn = None;
        self.statements.clear();
        // The schema and the server's settings are checked on a session of the sync client,
        // which `migrate` takes; the statements run on one that can pipeline.
        let mut setup = self.url.connect().map_err(self.err("connecting"))?;
        let conn = self.url.session().map_err(self.err("connecting"))?;
        conn.block_on(conn.client().batch_execute(concat!(
            "SET synchronous_commit = on;
             SET lock_timeout = '5s';
             SET statement_timeout = '30s';
             SET idle_in_transaction_session_timeout = '60s';",
            server_keepalives!()
        )))
        .map_err(self.err("setting up its session"))?;
        let fsync: String = setup
            .query_one("SHOW fsync", &[])
            .and_then(|r| r.try_get(0))
            .map_err(self.err("reading its settings"))?;
        if fsync != "on" {
            return Err(self.refused(format!(
                "the server runs with `fsync = {fsync}`, so a committed operation can be lost \
                 in a crash and charged twice; set `fsync = on`"
            )));
        }
        self.migrate(&mut setup)?;
        drop_off_runtime(setup);
        self.conn = Some(conn);
        self.answered = Instant::now();
        self.lock_key = self.live()?;
        Ok(())
    }

    /// The liveness lock's key, after (re)taking the lock if its connection is gone.
    fn live(&self) -> Result<i32, RegistryError> {
        let mut state = self
            .liveness
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let idle = state.checked.map_or(Duration::MAX, |at| at.elapsed());
        if state
            .client
            .as_mut()
            .is_some_and(|c| !crate::storage::postgres::session_gone(c, idle))
        {
            state.checked = Some(Instant::now());
            return Ok(state.key);
        }
        if let Some(gone) = state.client.take() {
            drop_off_runtime(gone);
        }
        let mut liveness = self.url.connect().map_err(self.err("connecting"))?;
        liveness
            .batch_execute(server_keepalives!())
            .map_err(self.err("setting up its session"))?;
        if state.key == 0 {
            state.key = fresh_key();
        }
        let mut tries = 0;
        loop {
            let got: bool = liveness
                .query_one(
                    "SELECT pg_try_advisory_lock($1, $2)",
                    &[&NAMESPACE, &state.key],
                )
                .and_then(|r| r.try_get(0))
                .map_err(self.err("taking its liveness lock"))?;
            if got {
                break;
            }
            tries += 1;
            if tries > 16 {
                return Err(self.refused(
                    "no free liveness lock key after 16 tries; too many replicas".into(),
                ));
            }
            state.key = fresh_key();
        }
        state.client = Some(liveness);
        state.checked = Some(Instant::now());
        Ok(state.key)
    }

    /// Drops the liveness connection after a connection-level failure, so the next statement
    /// takes the lock again on a fresh one.
    fn lose_liveness(&self) {
        let gone = self
            .liveness
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .client
            .take();
        drop_off_runtime(gone);
    }

    fn migrate(&self, conn: &mut Client) -> Result<(), RegistryError> {
        use crate::storage::postgres::{MigrateError, migrate};
        migrate(conn, &crate::storage::schema::registry::REGISTRY_PG).map_err(|e| match e {
            MigrateError::Refused(detail) => self.refused(detail),
            MigrateError::Postgres(cause) => self.err("migrating its schema")(cause),
        })
    }

    /// Runs `f` on the statement connection, reconnecting first if a connection was lost; a
    /// connection that failed under `f` is dropped, so the next call opens a fresh one.
    fn run<T>(
        &mut self,
        doing: &'static str,
        f: impl FnOnce(&PgSession, &mut Prepared<'_>) -> Result<T, postgres::Error>,
    ) -> Result<T, RegistryError> {
        let url = self.url.clone();
        self.run_step(|c, p| f(c, p).map_err(|cause| pg_error(&url, doing)(cause)))
    }

    /// [`PgRegistry::run`] for a step whose own errors are registry errors: a database error
    /// among them ([`RegistryError::Postgres`]) that ended the connection drops it too.
    fn run_step<T>(
        &mut self,
        f: impl FnOnce(&PgSession, &mut Prepared<'_>) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let idle = self.answered.elapsed();
        if self.conn.as_ref().is_none_or(|c| c.gone(idle)) {
            self.connect()?;
        } else {
            self.lock_key = self.live()?;
        }
        let conn = self.conn.as_ref().expect("connected above");
        let mut prepared = Prepared {
            cache: &mut self.statements,
            key: self.lock_key,
        };
        let outcome = f(conn, &mut prepared);
        self.answered = Instant::now();
        if let Err(e) = &outcome {
            let lost = match e {
                RegistryError::Postgres { cause, .. } => cause.code().is_none(),
                _ => false,
            };
            if lost || conn.is_closed() {
                self.conn = None;
                self.statements.clear();
                self.lose_liveness();
            }
        }
        outcome
    }

    pub(super) fn location(&self) -> PathBuf {
        PathBuf::from(self.url.to_string())
    }

    /// This router installation's id, shared by every replica of the database.
    pub fn installation_id(&self) -> &str {
        &self.installation_id
    }

    /// The operation recorded for a call identity of this installation.
    pub fn find(
        &mut self,
        platform: &str,
        source_installation: &str,
        harness_call_id: &str,
    ) -> Result<Option<Operation>, RegistryError> {
        let installation = self.installation_id.clone();
        let raw = self.run("looking up a call", |c, p| {
            let s = p.get(c, FIND)?;
            c.block_on(c.client().query_opt(
                &s,
                &[
                    &platform,
                    &installation,
                    &harness_call_id,
                    &source_installation,
                ],
            ))?
            .as_ref()
            .map(row_to_raw)
            .transpose()
        })?;
        let at = self.location();
        raw.map(|r| r.into_operation(&at)).transpose()
    }

    /// The operation with this public handle.
    pub fn find_by_handle(&mut self, handle: &str) -> Result<Option<Operation>, RegistryError> {
        let installation = self.installation_id.clone();
        let raw = self.run("looking up a handle", |c, p| {
            let s = p.get(c, FIND_BY_HANDLE)?;
            c.block_on(c.client().query_opt(&s, &[&handle, &installation]))?
                .as_ref()
                .map(row_to_raw)
                .transpose()
        })?;
        let at = self.location();
        raw.map(|r| r.into_operation(&at)).transpose()
    }
}

/// A database error of the registry at `url` while `doing`.
fn pg_error<'a>(
    url: &'a PgUrl,
    doing: &'static str,
) -> impl Fn(postgres::Error) -> RegistryError + 'a {
    move |cause| RegistryError::Postgres {
        url: url.clone(),
        doing,
        cause,
    }
}

/// Prepared statements of the current statement connection, and the liveness key its leases
/// carry. Every statement of a new operation, the registry's and the layers' (which ask for
/// `*_typed`), is prepared once per connection and then only bound and executed: the server
/// neither parses nor plans it again (an unnamed statement was parsed, analysed and planned on
/// every execution, most of the server's time on a layer's statement). The cache lives as long
/// as the connection and is cleared with it; the layers' texts are constants, so it holds a few
/// dozen statements at most.
struct Prepared<'a> {
    cache: &'a mut HashMap<Box<str>, Statement>,
    key: i32,
}

impl Prepared<'_> {
    fn get(&mut self, c: &PgSession, sql: &str) -> Result<Statement, postgres::Error> {
        self.typed(c, sql, &[])
    }

    /// `sql` prepared with its parameters' `types` (none: the server infers them), from the
    /// cache when it was prepared with these types before.
    fn typed(
        &mut self,
        c: &PgSession,
        sql: &str,
        types: &[Type],
    ) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.cache.get(sql)
            && (types.is_empty() || s.params() == types)
        {
            return Ok(s.clone());
        }
        let s = c.block_on(c.client().prepare_typed(sql, types))?;
        self.cache.insert(sql.into(), s.clone());
        Ok(s)
    }
}

/// A step of the machine on the statement session ([`RegistryStore::transact`]): each
/// statement its own implicit transaction (one round trip each), or one explicit transaction
/// whose `BEGIN` leaves in the flight of its first statement.
pub(super) struct PgTx<'t> {
    session: &'t PgSession,
    prepared: Prepared<'t>,
    url: &'t PgUrl,
    installation_id: &'t str,
    doing: &'static str,
    /// An explicit transaction whose `BEGIN` is still to be sent (with the next statement).
    begin_due: bool,
    /// An explicit transaction whose `BEGIN` was sent: `COMMIT` or `ROLLBACK` ends it.
    open: bool,
}

/// `statement`, after `BEGIN` when `begin`: both sent in one flight, answered in order.
async fn flight<'f, T>(
    client: &'f tokio_postgres::Client,
    begin: bool,
    statement: impl Future<Output = Result<T, postgres::Error>> + 'f,
) -> Result<T, postgres::Error> {
    if !begin {
        return statement.await;
    }
    let mut begun = pin!(client.batch_execute("BEGIN"));
    let sent = std::future::poll_fn(|cx| std::task::Poll::Ready(begun.as_mut().poll(cx))).await;
    let answer = statement.await;
    match sent {
        std::task::Poll::Ready(done) => done?,
        std::task::Poll::Pending => begun.await?,
    }
    answer
}

/// A statement's parameters, owned, so that its request can stay in flight while other
/// statements are sent ([`PgTx::insert_then`], [`PgTx::apply_then`]).
type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// What a statement sent ahead ([`PgTx::sent_then`]) answered.
enum Answer {
    /// Its row, if any (a statement that answers rows).
    Row(Option<postgres::Row>),
    /// How many rows it changed.
    Changed(u64),
}

impl Answer {
    /// Whether the statement matched its row: it answered a row or changed one.
    fn matched(&self) -> bool {
        match self {
            Answer::Row(row) => row.is_some(),
            Answer::Changed(n) => *n == 1,
        }
    }
}

/// What a prepared statement answered: its row (`rows`), or how many rows it changed.
async fn answer(
    client: &tokio_postgres::Client,
    statement: Statement,
    params: Params,
    rows: bool,
) -> Result<Answer, postgres::Error> {
    let refs: Vec<&(dyn ToSql + Sync)> =
        params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect();
    if rows {
        Ok(Answer::Row(client.query_opt(&statement, &refs).await?))
    } else {
        Ok(Answer::Changed(client.execute(&statement, &refs).await?))
    }
}

impl<'t> PgTx<'t> {
    /// A layer's statement prepared with its parameters' types, and their values.
    fn typed<'p>(
        &mut self,
        sql: &str,
        params: &'p [(&'p (dyn ToSql + Sync), Type)],
    ) -> Result<(Statement, Vec<&'p (dyn ToSql + Sync)>), postgres::Error> {
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = self.prepared.typed(self.session, sql, &types)?;
        Ok((statement, params.iter().map(|(v, _)| *v).collect()))
    }

    /// Runs `statement` (sending a due `BEGIN` with it) and waits for its answer.
    fn run<'f, T>(
        &mut self,
        statement: impl Future<Output = Result<T, postgres::Error>> + 'f,
    ) -> Result<T, postgres::Error>
    where
        't: 'f,
    {
        let begin = std::mem::take(&mut self.begin_due);
        self.open |= begin;
        self.session
            .block_on(flight(self.session.client(), begin, statement))
    }

    fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<postgres::Row>, RegistryError> {
        let session = self.session;
        let rows = self
            .prepared
            .get(session, sql)
            .and_then(|s| self.run(async move { session.client().query_opt(&s, params).await }));
        rows.map_err(pg_error(self.url, self.doing))
    }

    fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, RegistryError> {
        let session = self.session;
        let n = self
            .prepared
            .get(session, sql)
            .and_then(|s| self.run(async move { session.client().execute(&s, params).await }));
        n.map_err(pg_error(self.url, self.doing))
    }

    fn batch(&mut self, sql: &str) -> Result<(), RegistryError> {
        let client = self.session.client();
        self.run(client.batch_execute(sql))
            .map_err(pg_error(self.url, self.doing))
    }

    /// Sends `sql` with `params` (and a due `BEGIN`), runs `then` while its answer is on its
    /// way, so that `then`'s first statement leaves in the same flight, and answers what `sql`
    /// answered (an error of `sql` first: it explains `then`'s) with `then`'s answer.
    fn sent_then<R>(
        &mut self,
        sql: &'static str,
        params: Params,
        rows: bool,
        then: impl FnOnce(&mut Self) -> Result<R, RegistryError>,
    ) -> Result<(Answer, Option<R>), RegistryError> {
        let session = self.session;
        let statement = self
            .prepared
            .get(session, sql)
            .map_err(pg_error(self.url, self.doing))?;
        let begin = std::mem::take(&mut self.begin_due);
        self.open |= begin;
        let mut pending = pin!(flight(
            session.client(),
            begin,
            answer(session.client(), statement, params, rows)
        ));
        let sent = session.send(pending.as_mut());
        let then = then(self);
        let answered = match sent {
            Some(answer) => answer,
            None => session.block_on(pending),
        }
        .map_err(pg_error(self.url, self.doing))?;
        Ok((answered, Some(then?)))
    }

    /// What [`INSERT`]'s answer says.
    fn inserted(&self, answer: Answer) -> Result<Inserted, RegistryError> {
        let Answer::Row(Some(row)) = answer else {
            return Err(RegistryError::Corrupt {
                path: self.location(),
                detail: "recording a new operation answered no row".into(),
            });
        };
        let read = |row: &postgres::Row| -> Result<_, postgres::Error> {
            if row.try_get(CREATED)? {
                return Ok(None);
            }
            let seen: Option<String> = row.try_get(0)?;
            seen.map(|_| row_to_raw(row)).transpose().map(Some)
        };
        match read(&row).map_err(pg_error(self.url, self.doing))? {
            None => Ok(Inserted::Created),
            Some(None) => Ok(Inserted::Recorded(None)),
            Some(Some(raw)) => Ok(Inserted::Recorded(Some(Box::new(
                raw.into_operation(&self.location())?,
            )))),
        }
    }

    /// The parameters of [`INSERT`].
    fn insert_params(
        &self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
    ) -> Params {
        let lease_owner = lease.map(|(owner, _)| owner.to_string());
        let lease_lock = lease.map(|_| self.prepared.key);
        let ttl_ms = lease.map_or(0, |(_, ttl)| ttl.as_millis() as i64);
        vec![
            Box::new(new.platform.clone()),
            Box::new(self.installation_id.to_string()),
            Box::new(new.harness_call_id.clone()),
            Box::new(new.handle.as_str().to_string()),
            Box::new(new.key.expose().to_string()),
            Box::new(new.tool.clone()),
            Box::new(new.request_hash.as_str().to_string()),
            Box::new(new.arguments.to_string()),
            Box::new(new.amount_cents as i64),
            Box::new(status.name()),
            Box::new(approval.name()),
            Box::new(now_ms()),
            Box::new(new.source_installation.clone()),
            Box::new(lease_owner),
            Box::new(lease_lock),
            Box::new(ttl_ms),
            Box::new(new.at_most_once),
        ]
    }

    /// The statement of `step` and its parameters.
    fn step_request(&self, step: &Step<'_>) -> (&'static str, Params) {
        fn own<T: ToSql + Sync + Send + 'static>(value: T) -> Box<dyn ToSql + Sync + Send> {
            Box::new(value)
        }
        let now = now_ms();
        let installation = self.installation_id.to_string();
        match *step {
            Step::Renew {
                handle,
                generation,
                ttl,
            } => (
                RENEW,
                vec![
                    own(handle.to_string()),
                    own(generation),
                    own(ttl.as_millis() as i64),
                    own(self.prepared.key),
                ],
            ),
            Step::Release { handle, generation } => {
                (RELEASE, vec![own(handle.to_string()), own(generation)])
            }
            Step::MarkInDoubt {
                handle,
                generation,
                reason,
            } => (
                MARK_IN_DOUBT,
                vec![
                    own(handle.to_string()),
                    own(generation),
                    own(reason.to_string()),
                    own(now),
                ],
            ),
            Step::RecordResult {
                handle,
                generation,
                result,
                charged_cents,
            } => (
                RECORD_RESULT,
                vec![
                    own(handle.to_string()),
                    own(result.to_string()),
                    own(now),
                    own(charged_cents),
                    own(generation),
                ],
            ),
            Step::RecordFailure {
                handle,
                generation,
                code,
                message,
            } => (
                RECORD_FAILURE,
                vec![
                    own(handle.to_string()),
                    own(code.to_string()),
                    own(message.to_string()),
                    own(now),
                    own(generation),
                ],
            ),
            Step::Approve { handle } => (
                APPROVE,
                vec![own(handle.to_string()), own(installation), own(now)],
            ),
            Step::Deny { handle, message } => (
                DENY,
                vec![
                    own(handle.to_string()),
                    own(installation),
                    own(message.to_string()),
                    own(now),
                ],
            ),
            Step::ResolveCharged { handle, result, by } => (
                RESOLVE_CHARGED,
                vec![
                    own(handle.to_string()),
                    own(installation),
                    own(result.to_string()),
                    own(by.to_string()),
                    own(now),
                ],
            ),
            Step::ResolveNotCharged { handle, by } => (
                RESOLVE_NOT_CHARGED,
                vec![
                    own(handle.to_string()),
                    own(installation),
                    own(by.to_string()),
                    own(now),
                ],
            ),
        }
    }
}

/// The layers' statements, in the registry's transaction and its flights, each prepared once
/// per connection ([`Prepared`]).
impl PgStatements for PgTx<'_> {
    fn query_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        let (s, values) = self.typed(sql, params)?;
        let client = self.session.client();
        self.run(async move { client.query(&s, &values).await })
    }

    fn query_typed_one(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<postgres::Row, postgres::Error> {
        let (s, values) = self.typed(sql, params)?;
        let client = self.session.client();
        self.run(async move { client.query_one(&s, &values).await })
    }

    fn query_typed_opt(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<postgres::Row>, postgres::Error> {
        let (s, values) = self.typed(sql, params)?;
        let client = self.session.client();
        self.run(async move { client.query_opt(&s, &values).await })
    }

    fn execute_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, postgres::Error> {
        let (s, values) = self.typed(sql, params)?;
        let client = self.session.client();
        self.run(async move { client.execute(&s, &values).await })
    }

    fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
        let client = self.session.client();
        self.run(client.batch_execute(sql))
    }
}

impl RegistryStore for PgRegistry {
    type Tx<'t> = PgTx<'t>;

    fn location(&self) -> PathBuf {
        PgRegistry::location(self)
    }

    /// Not `atomic`: each statement runs in its own implicit transaction (one round trip, no
    /// `BEGIN` or `COMMIT`), committed with `synchronous_commit = on` like any other.
    fn transact<R>(
        &mut self,
        doing: &'static str,
        atomic: bool,
        f: impl FnOnce(&mut PgTx<'_>) -> Result<R, RegistryError>,
    ) -> Result<R, RegistryError> {
        let (url, installation_id) = (self.url.clone(), self.installation_id.clone());
        self.run_step(|c, p| {
            let mut tx = PgTx {
                session: c,
                prepared: Prepared {
                    cache: &mut *p.cache,
                    key: p.key,
                },
                url: &url,
                installation_id: &installation_id,
                doing,
                begin_due: atomic,
                open: false,
            };
            let done = f(&mut tx);
            if !tx.open {
                return done;
            }
            let end = if done.is_ok() { "COMMIT" } else { "ROLLBACK" };
            let ended = c.block_on(c.client().batch_execute(end));
            // The step's own error explains the rollback; a failed commit is the answer.
            let done = done?;
            ended.map_err(pg_error(&url, doing))?;
            Ok(done)
        })
    }

    fn find_by_handle(&mut self, handle: &str) -> Result<Option<Operation>, RegistryError> {
        PgRegistry::find_by_handle(self, handle)
    }

    /// [`CLAIM`], and when it took nothing a fresh statement for the row's status ([`STATUS_OF`]:
    /// it sees what the holder committed while the claim waited for the row).
    fn claim(
        &mut self,
        handle: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Claimed, RegistryError> {
        let ttl_ms = ttl.as_millis() as i64;
        let now = now_ms();
        self.run("taking a dispatch lease", |c, p| {
            let s = p.get(c, CLAIM)?;
            let row = c.block_on(c.client().query_opt(
                &s,
                &[
                    &handle,
                    &owner,
                    &p.key,
                    &ttl_ms,
                    &NAMESPACE,
                    &super::TAKEN_OVER_IN_DOUBT,
                    &now,
                ],
            ))?;
            if let Some(row) = row {
                return Ok(Claimed {
                    status: row.try_get(0)?,
                    granted: Some(row.try_get(1)?),
                    orphaned_ms: None,
                });
            }
            let s = p.get(c, STATUS_OF)?;
            let row = c.block_on(c.client().query_one(&s, &[&handle, &owner, &NAMESPACE]))?;
            Ok(Claimed {
                status: row.try_get(0)?,
                granted: None,
                orphaned_ms: row.try_get(1)?,
            })
        })
    }
}

impl StoreTx for PgTx<'_> {
    fn location(&self) -> PathBuf {
        PathBuf::from(self.url.to_string())
    }

    fn find(&mut self, key: CallKey<'_>) -> Result<Option<Operation>, RegistryError> {
        let installation = self.installation_id;
        let row = self.query_opt(
            FIND,
            &[
                &key.platform,
                &installation,
                &key.harness_call_id,
                &key.source_installation,
            ],
        )?;
        let raw = row
            .as_ref()
            .map(row_to_raw)
            .transpose()
            .map_err(pg_error(self.url, self.doing))?;
        raw.map(|r| r.into_operation(&self.location())).transpose()
    }

    /// A transaction-level advisory lock on the installation ([`BUDGET_NAMESPACE`]): every
    /// replica's budgeted insert for one installation takes it, and each statement after it
    /// sees every row the previous holder committed (READ COMMITTED takes a snapshot per
    /// statement), so concurrent spends across replicas never overspend together. Released at
    /// the commit; no connection is pinned across a dispatch.
    fn lock_budget(&mut self) -> Result<(), RegistryError> {
        let installation = self.installation_id;
        self.execute(BUDGET_LOCK, &[&BUDGET_NAMESPACE, &installation])
            .map(drop)
    }

    fn committed_cents(&mut self) -> Result<i64, RegistryError> {
        let installation = self.installation_id;
        let row = self.query_opt(COMMITTED, &[&installation])?;
        row.map_or(Ok(0), |r| r.try_get(0))
            .map_err(pg_error(self.url, self.doing))
    }

    fn insert(
        &mut self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
    ) -> Result<Inserted, RegistryError> {
        let params = self.insert_params(new, status, approval, lease);
        let (answer, _) = self.sent_then(INSERT, params, true, |_| Ok(()))?;
        self.inserted(answer)
    }

    /// [`INSERT`] sent, and `then` run while its answer is on its way: one flight.
    fn insert_then<R>(
        &mut self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
        then: impl FnOnce(&mut Self) -> Result<R, RegistryError>,
    ) -> Result<(Inserted, Option<R>), RegistryError> {
        let params = self.insert_params(new, status, approval, lease);
        let (answer, then) = self.sent_then(INSERT, params, true, then)?;
        Ok((self.inserted(answer)?, then))
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<bool, RegistryError> {
        let (sql, params) = self.step_request(step);
        self.sent_then(sql, params, false, |_| Ok(()))
            .map(|(answer, _)| answer.matched())
    }

    /// `step` sent, and `then` run while its answer is on its way: one flight.
    fn apply_then<R>(
        &mut self,
        step: &Step<'_>,
        then: impl FnOnce(&mut Self) -> Result<R, RegistryError>,
    ) -> Result<(bool, Option<R>), RegistryError> {
        let (sql, params) = self.step_request(step);
        self.sent_then(sql, params, false, then)
            .map(|(answer, then)| (answer.matched(), then))
    }

    fn layer<T>(
        &mut self,
        step: InTransaction<T, String>,
    ) -> Result<Result<T, String>, RegistryError> {
        if self.begin_due || self.open {
            Ok(step(LayerTx::Postgres(self)))
        } else {
            Err(RegistryError::layer(
                self.location(),
                "a layer's step runs only inside the registry's transaction",
            ))
        }
    }

    fn savepoint(&mut self, name: &'static str) -> Result<(), RegistryError> {
        self.batch(&format!("SAVEPOINT {name}"))
    }

    fn end_savepoint(&mut self, name: &'static str, keep: bool) -> Result<(), RegistryError> {
        if keep {
            self.batch(&format!("RELEASE SAVEPOINT {name}"))
        } else {
            self.batch(&format!(
                "ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}"
            ))
        }
    }
}

/// A random liveness-lock key in `1..i32::MAX` (0 is the migration lock).
fn fresh_key() -> i32 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let n = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & i32::MAX;
    n.max(1)
}

#[cfg(test)]
mod tests {
    use super::super::machine::RegistryStore as _;
    use super::{PgRegistry, PgStatements as _, Type};

    /// The layers' statements (`*_typed`) are prepared once per statement connection and then
    /// run on a generic plan: the server neither parses nor plans them per execution, as it did
    /// for the unnamed statements of `query_typed`.
    #[test]
    fn a_layers_statement_is_prepared_once_per_connection() {
        let Some(cluster) = crate::storage::cluster::for_unit_test() else {
            return;
        };
        let url = crate::storage::postgres::PgUrl::parse(&cluster.url("callid")).unwrap();
        let mut store = PgRegistry::open(&url).unwrap();
        const SQL: &str = "SELECT $1::bigint + 1";
        let seen = store
            .transact("testing", true, |tx| {
                let pg = |e: postgres::Error| super::pg_error(tx.url, "testing")(e);
                let mut sums = vec![];
                for n in 0..2i64 {
                    let param = [(&n as &(dyn postgres::types::ToSql + Sync), Type::INT8)];
                    sums.push(tx.query_typed(SQL, &param).map_err(pg)?[0].get::<_, i64>(0));
                    sums.push(tx.query_typed_one(SQL, &param).map_err(pg)?.get(0));
                    let row = tx.query_typed_opt(SQL, &param).map_err(pg)?;
                    sums.push(row.expect("a row").get(0));
                    sums.push(tx.execute_typed(SQL, &param).map_err(pg)? as i64);
                }
                let row = tx
                    .query_typed_one(
                        "SELECT count(*), COALESCE(max(generic_plans), 0)
                         FROM pg_prepared_statements WHERE statement = $1",
                        &[(&SQL, Type::TEXT)],
                    )
                    .map_err(pg)?;
                Ok((sums, row.get::<_, i64>(0), row.get::<_, i64>(1)))
            })
            .unwrap();
        assert_eq!(seen, (vec![1, 1, 1, 1, 2, 2, 2, 1], 1, 3));
    }

    #[test]
    fn a_postgres_url_is_a_database_and_anything_else_a_file() {
        use super::super::RegistryLocation;
        let at = |s: &str| RegistryLocation::parse(std::ffi::OsStr::new(s)).unwrap();
        assert!(matches!(
            at("postgresql://u@h/db"),
            RegistryLocation::Postgres(_)
        ));
        assert_eq!(
            at("postgres-registry.sqlite3"),
            RegistryLocation::File("postgres-registry.sqlite3".into())
        );
        assert_eq!(
            at("/tmp/postgres:/x"),
            RegistryLocation::File("/tmp/postgres:/x".into())
        );
        let err = RegistryLocation::parse("postgres://bob:pw@db.example:5432/".as_ref());
        let text = err.unwrap_err().to_string();
        assert!(text.contains("names no database"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }
}
