//! The backend layers on the registry's PostgreSQL database, for router replicas: every replica
//! reads and writes one set of authorization decisions and executions, so one operation has one
//! decision, an account's budget holds across replicas under concurrent spends, and a replica's
//! crash leaves no layer state on its own disk.
//!
//! Same guarantees as the SQLite store of [`super::authorization`] (same decision rules, same
//! budget arithmetic), with PostgreSQL's means: each decision is one transaction committed with
//! `synchronous_commit = on`; budget check and record run under a transaction-level advisory
//! lock on the account, so two replicas cannot both see the same remaining budget. The table,
//! `callid_decisions`, is created by the registry's migrations (the router opens the registry
//! before its backend). Concurrent spends of one replica use a bounded pool of up to
//! [`POOL_SIZE`] connections, each set up as above; a lost connection is dropped and a fresh one
//! opened on the next call; until the database answers, every spend fails closed.

use super::error::BackendError;
use super::rules::{
    AuthorizationRequest, Begin, Decision, Executed, decision_id, lapsed, provider_key,
};
use crate::provider::Receipt;
use crate::storage::postgres::{PgStatements, PgUrl, drop_off_runtime};
use crate::storage::sqlite::Store;
use postgres::Client;
use postgres::types::{ToSql, Type};
use std::sync::{Arc, Condvar, Mutex};

/// A statement's parameters with their PostgreSQL types: a statement sent with them takes one
/// round trip (parse, bind and execute in one message), where an untyped one takes two (the
/// server describes it first). A new operation's layers run one statement before its dispatch
/// and one after it when no budget is checked ([`FIRST_DISPATCH`], [`FIRST_RECEIPT`]).
macro_rules! typed {
    ($($value:expr => $ty:ident),* $(,)?) => {
        &[$((&$value as &(dyn ToSql + Sync), Type::$ty)),*]
    };
}

/// The advisory-lock namespace of budget checks (`"cLAB"`), apart from the registry's.
const BUDGET_LOCK: i32 = 0x634c_4142;
/// The advisory-lock namespace of executions (`"cLEX"`): one `begin` per decision at a time
/// (a first `begin` needs none: [`FIRST_DISPATCH`] writes the record only if it has no row).
const EXECUTION_LOCK: i32 = 0x634c_4558;

/// How many connections one replica's layers open at most (opened on demand, kept for reuse).
pub const POOL_SIZE: usize = 8;

/// How long a layer call waits for a free connection before it fails closed.
const CHECKOUT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The shared decisions and executions, through a bounded pool of connections.
pub struct SharedState {
    url: PgUrl,
    pool: Pool,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("url", &self.url)
            .finish()
    }
}

/// A bounded pool: up to [`POOL_SIZE`] connections, each opened on first need with the
/// session settings the guarantees rest on, reused while healthy; a connection that failed
/// without a server error code (network, server gone) or is closed is dropped, so the next
/// checkout opens a fresh one once the database is back. An idle connection is checked before it
/// is handed out ([`crate::storage::postgres::session_gone`]): one the server ended meanwhile (a restart) is
/// replaced, so a restart fails no call that comes after it. A caller finding every connection
/// busy waits up to [`CHECKOUT_WAIT`].
struct Pool {
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Default)]
struct PoolState {
    /// Each idle connection with when it was returned (see [`crate::storage::postgres::session_gone`]).
    idle: Vec<(Client, std::time::Instant)>,
    open: usize,
}

/// A connection checked out of the pool; returned (or dropped, when broken) on drop.
struct Checkout<'a> {
    pool: &'a Pool,
    client: Option<Client>,
    broken: bool,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.broken || client.is_closed() || std::thread::panicking() {
            state.open -= 1;
            drop(state);
            drop_off_runtime(client);
        } else {
            state.idle.push((client, std::time::Instant::now()));
            drop(state);
        }
        self.pool.freed.notify_one();
    }
}

impl Drop for SharedState {
    fn drop(&mut self) {
        let idle = std::mem::take(
            &mut self
                .pool
                .state
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .idle,
        );
        drop_off_runtime(idle);
    }
}

/// Cents of an account's budget held (see `super::authorization`'s Budget): the running total
/// of its charges and its open decisions (the registry's migration 4), in one statement (one
/// snapshot: a charge committed meanwhile is counted once, in one or the other).
/// A layer's local SQLite file, for the steps that run on it; `None` for a layer kept in the
/// replicas' database (`shared`), which answers every call from there before it would need one.
/// The error is then never seen in use: it fails closed rather than panicking if a SQLite step
/// were ever routed to such a layer.
pub(super) fn local<'a>(
    store: &'a Option<Arc<Store>>,
    shared: &Option<Arc<SharedState>>,
    layer: &'static str,
) -> Result<&'a Arc<Store>, BackendError> {
    store.as_ref().ok_or_else(|| no_local_file(shared, layer))
}

/// SQLite's `cause`, named by the layer's local file (see [`local`]).
pub(super) fn sql_error(
    store: &Option<Arc<Store>>,
    shared: &Option<Arc<SharedState>>,
    layer: &'static str,
    cause: rusqlite::Error,
) -> BackendError {
    match store {
        Some(store) => BackendError::from(store.error(cause)),
        None => no_local_file(shared, layer),
    }
}

fn no_local_file(shared: &Option<Arc<SharedState>>, layer: &'static str) -> BackendError {
    BackendError::SharedStateUnavailable {
        url: shared
            .as_ref()
            .map_or_else(String::new, |s| s.url_redacted()),
        doing: "a step on a local file, which a layer kept in the shared database has not",
        cause: format!("no local {layer} file"),
    }
}

const SPENT: &str = "SELECT ((SELECT COALESCE(SUM(charged_cents), 0)
            FROM callid_account_totals WHERE account = $1)
        + (SELECT COALESCE(SUM(CASE
                WHEN state = 'reserved' AND reserved_ms + $3 <= $2 THEN 0
                ELSE amount_cents END), 0)
            FROM callid_decisions
            WHERE account = $1 AND state IN ('reserved', 'dispatched')))::bigint";

/// A new operation's layer rows in one statement (one round trip), when no budget is checked:
/// the execution's `dispatched` record (`$1`: decision id, `$2`: provider key, `$3`: request)
/// and the decision, written `dispatched` at once (`$4`-`$10`), each only if its key has no row
/// yet. Answers whether the execution was written and the new decision's `created_at` (null
/// when one existed: [`SharedState::prepare_in`] then applies its layer's rules to it).
const FIRST_DISPATCH: &str = r#"WITH e AS (
        INSERT INTO callid_executions (decision_id, provider_key, request, state, attempts,
            dispatched_at)
        VALUES ($1, $2, $3, 'dispatched', 1, clock_timestamp())
        ON CONFLICT DO NOTHING RETURNING 1),
    d AS (
        INSERT INTO callid_decisions (agent_id, operation_key, decision_id, account,
            amount_cents, scope, request_hash, created_at, state, reserved_ms)
        VALUES ($4, $5, $1, $6, $7, $8, $9,
            to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
            'dispatched', $10)
        ON CONFLICT DO NOTHING RETURNING created_at)
    SELECT EXISTS (SELECT 1 FROM e), (SELECT created_at FROM d)"#;

/// A receipt's record in one statement (one round trip) when it is the first: the execution
/// `completed` with it (`$2`, `$3`) and, only then, the decision `charged` its amount (`$4`).
/// Answers whether it was the first; when it was not, nothing was written.
const FIRST_RECEIPT: &str = r"WITH e AS (
        UPDATE callid_executions SET state = 'completed', receipt = $2,
            provider_replayed = $3, completed_at = clock_timestamp()
        WHERE decision_id = $1 AND state = 'dispatched' RETURNING 1),
    d AS (
        UPDATE callid_decisions SET state = 'charged', charged_cents = $4
        WHERE decision_id = $1 AND EXISTS (SELECT 1 FROM e))
    SELECT EXISTS (SELECT 1 FROM e)";

impl SharedState {
    /// The database's URL, password redacted.
    pub fn url_redacted(&self) -> String {
        self.url.to_string()
    }

    /// The decisions in the database at `url` (connections opened on first use).
    pub fn new(url: PgUrl) -> SharedState {
        SharedState {
            url,
            pool: Pool {
                state: Mutex::new(PoolState::default()),
                freed: Condvar::new(),
            },
        }
    }

    fn connect(&self) -> Result<Client, postgres::Error> {
        let mut client = self.url.connect()?;
        client.batch_execute(
            "SET synchronous_commit = on; SET lock_timeout = '10s';
             SET statement_timeout = '30s';",
        )?;
        Ok(client)
    }

    /// A healthy connection: an idle one, a new one while fewer than [`POOL_SIZE`] are open,
    /// or the next one freed within [`CHECKOUT_WAIT`].
    fn checkout(&self, doing: &'static str) -> Result<Checkout<'_>, BackendError> {
        let deadline = std::time::Instant::now() + CHECKOUT_WAIT;
        let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some((mut client, returned)) = state.idle.pop() {
                // Checked outside the lock: the check may take a round trip.
                drop(state);
                let gone = crate::storage::postgres::session_gone(&mut client, returned.elapsed());
                state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
                if gone {
                    state.open -= 1;
                    drop(state);
                    drop_off_runtime(client);
                    self.pool.freed.notify_one();
                    state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                drop(state);
                return Ok(Checkout {
                    pool: &self.pool,
                    client: Some(client),
                    broken: false,
                });
            }
            if state.open < POOL_SIZE {
                state.open += 1;
                drop(state);
                return match self.connect() {
                    Ok(client) => Ok(Checkout {
                        pool: &self.pool,
                        client: Some(client),
                        broken: false,
                    }),
                    Err(e) => {
                        let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
                        state.open -= 1;
                        drop(state);
                        self.pool.freed.notify_one();
                        Err(self.unavailable(doing, &e))
                    }
                };
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(BackendError::SharedStateUnavailable {
                    url: self.url.to_string(),
                    doing,
                    cause: format!(
                        "all {POOL_SIZE} connections stayed busy for {} s",
                        CHECKOUT_WAIT.as_secs()
                    ),
                });
            }
            state = self
                .pool
                .freed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn with<T>(
        &self,
        doing: &'static str,
        f: impl FnOnce(&mut Client) -> Result<T, Failure>,
    ) -> Result<T, BackendError> {
        let mut checkout = self.checkout(doing)?;
        let client = checkout.client.as_mut().expect("checked out");
        match f(client) {
            Ok(v) => Ok(v),
            Err(Failure::Backend(e)) => Err(e),
            Err(Failure::Db(e)) => {
                let broken = e.code().is_none() || client.is_closed();
                checkout.broken = broken;
                Err(self.unavailable(doing, &e))
            }
        }
    }

    fn unavailable(&self, doing: &'static str, cause: &postgres::Error) -> BackendError {
        BackendError::SharedStateUnavailable {
            url: self.url.to_string(),
            doing,
            cause: self.url.explain(cause),
        }
    }

    /// Returns the decision for `req.operation_key`, recording it first if there is none.
    pub fn authorize(
        &self,
        req: &AuthorizationRequest<'_>,
        now_ms: i64,
        expiry_ms: i64,
    ) -> Result<Decision, BackendError> {
        self.with("recording an authorization", |c| {
            authorize_on(c, req, now_ms, expiry_ms)
        })
    }

    /// Moves a decision to state `to` if it is in one of `from`; how many rows changed.
    pub fn set_state(
        &self,
        decision_id: &str,
        to: &str,
        from: &[&str],
    ) -> Result<u64, BackendError> {
        let from: Vec<String> = from.iter().map(|s| s.to_string()).collect();
        self.with("recording a decision's state", |c| {
            set_state_on(c, decision_id, to, &from)
        })
    }

    /// See [`super::Authorization::record_charge`].
    pub fn record_charge(&self, decision_id: &str, charged_cents: u64) -> Result<(), BackendError> {
        self.with("recording a charge", |c| {
            record_charge_on(c, decision_id, charged_cents)
        })
    }

    /// See [`super::Authorization::state`].
    #[cfg(test)]
    pub fn state(&self, decision_id: &str) -> Result<Option<String>, BackendError> {
        self.with("reading a decision", |c| {
            Ok(c.query_opt(
                "SELECT state FROM callid_decisions WHERE decision_id = $1",
                &[&decision_id],
            )?
            .map(|r| r.try_get(0))
            .transpose()?)
        })
    }

    /// See [`super::Authorization::spent_cents`].
    pub fn spent_cents(
        &self,
        account: &str,
        now_ms: i64,
        expiry_ms: i64,
    ) -> Result<u64, BackendError> {
        self.with("reading a budget", |c| {
            let spent: i64 = c
                .query_one(SPENT, &[&account, &now_ms, &expiry_ms])?
                .try_get(0)?;
            Ok(spent.max(0) as u64)
        })
    }

    /// See [`super::Authorization::decision_count`].
    #[cfg(test)]
    pub fn decision_count(&self) -> Result<u64, BackendError> {
        self.with("counting decisions", |c| {
            let n: i64 = c
                .query_one("SELECT count(*) FROM callid_decisions", &[])?
                .try_get(0)?;
            Ok(n.max(0) as u64)
        })
    }
    /// The layers' steps before a dispatch inside the caller's transaction `tx` on the shared
    /// database (the registry's, joined by the new row's insert): the decision marked
    /// `dispatched` and the execution's `dispatched` record, committed with it.
    pub(super) fn prepare_in(
        &self,
        tx: &mut dyn PgStatements,
        req: &AuthorizationRequest<'_>,
        request: &str,
        now_ms: i64,
        expiry_ms: i64,
    ) -> Result<(Decision, bool, Begin), BackendError> {
        let doing = "recording an authorization";
        let id = decision_id(req.agent_id, req.operation_key);
        // Without a budget there is nothing to check first: both rows, when new, are written by
        // one statement ([`FIRST_DISPATCH`]); a row that exists already goes through its
        // layer's rules below, as every row does when there is a budget to check.
        let (mut begin, mut fresh) = (None, None);
        if req.budget_cents.is_none() {
            let key = provider_key(&id);
            let amount = req.amount_cents as i64;
            let row = tx
                .query_typed_one(
                    FIRST_DISPATCH,
                    typed![
                        id => TEXT,
                        key => TEXT,
                        request => TEXT,
                        req.agent_id => TEXT,
                        req.operation_key => TEXT,
                        req.account => TEXT,
                        amount => INT8,
                        req.scope => TEXT,
                        req.request_hash => TEXT,
                        now_ms => INT8,
                    ],
                )
                .map_err(|e| self.unavailable(doing, &e))?;
            let executed: bool = row.try_get(0).map_err(|e| self.unavailable(doing, &e))?;
            let created_at: Option<String> =
                row.try_get(1).map_err(|e| self.unavailable(doing, &e))?;
            if executed {
                begin = Some(Begin::Dispatch { key });
            }
            fresh = created_at.map(|created_at| Decision {
                decision_id: id.clone(),
                account: req.account.to_owned(),
                amount_cents: req.amount_cents,
                scope: req.scope.to_owned(),
                request_hash: req.request_hash.to_owned(),
                created_at,
                newly_recorded: true,
            });
        }
        // The execution's record first: the decision takes the account's budget lock, held to
        // the commit and shared by every replica, so it comes last, as short as it can be. The
        // order is not seen outside: both commit together or not at all.
        let begin = match begin {
            Some(begin) => begin,
            None => begin_execution_in(tx, &id, request)
                .map_err(|f| self.failed("recording an execution", f))?,
        };
        if let Some(decision) = fresh {
            return Ok((decision, true, begin));
        }
        let decision =
            authorize_in(tx, req, now_ms, expiry_ms).map_err(|f| self.failed(doing, f))?;
        let first = set_state_on(
            tx,
            &decision.decision_id,
            "dispatched",
            &["reserved".to_string()],
        )
        .map_err(|f| self.failed(doing, f))?
            == 1;
        Ok((decision, first, begin))
    }

    /// The record of a provider's answer inside the caller's transaction `tx` on the shared
    /// database (the registry's, joined by the result's record): the execution `completed`
    /// (the first receipt wins) and the decision `charged` with the receipt's amount.
    pub(super) fn settle_in(
        &self,
        tx: &mut dyn PgStatements,
        decision_id: &str,
        receipt: &Receipt,
        replayed: bool,
    ) -> Result<(), BackendError> {
        let doing = "recording an execution's receipt";
        let text = serde_json::to_string(receipt).expect("a receipt always serializes");
        let charged = receipt.amount_cents as i64;
        let first: bool = tx
            .query_typed_one(
                FIRST_RECEIPT,
                typed![decision_id => TEXT, text => TEXT, replayed => BOOL, charged => INT8],
            )
            .and_then(|r| r.try_get(0))
            .map_err(|e| self.unavailable(doing, &e))?;
        if first {
            return Ok(());
        }
        // Another receipt was recorded first: it wins, and the charge is its amount.
        let executed = complete_execution_on(tx, decision_id, &text, replayed)
            .map_err(|f| self.failed(doing, f))?;
        record_charge_on(tx, decision_id, executed.receipt.amount_cents)
            .map_err(|f| self.failed("recording a charge", f))
    }

    /// Runs `f` in a transaction of its own on a pooled connection, committed when it returns
    /// `Ok`.
    pub(super) fn in_transaction<T>(
        &self,
        doing: &'static str,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.with(doing, |c| {
            let mut tx = c.transaction()?;
            let value = f(&mut tx).map_err(Failure::Backend)?;
            tx.commit()?;
            Ok(value)
        })
    }

    fn failed(&self, doing: &'static str, failure: Failure) -> BackendError {
        match failure {
            Failure::Backend(e) => e,
            Failure::Db(e) => self.unavailable(doing, &e),
        }
    }

    /// See the execution layer's `begin`: the execution of `decision_id` for `request` (the
    /// serialized request as asked), recorded `dispatched` before the provider is called, or
    /// its recorded receipt.
    pub(super) fn begin_execution(
        &self,
        decision_id: &str,
        request: &str,
    ) -> Result<Begin, BackendError> {
        self.with("recording an execution", |c| {
            begin_execution_on(c, decision_id, request)
        })
    }
    /// See the execution layer's `complete`: the first recorded receipt wins.
    pub(super) fn complete_execution(
        &self,
        decision_id: &str,
        receipt: &Receipt,
        replayed: bool,
    ) -> Result<Executed, BackendError> {
        let text = serde_json::to_string(receipt).expect("a receipt always serializes");
        self.with("recording an execution's receipt", |c| {
            complete_execution_on(c, decision_id, &text, replayed)
        })
    }
}

fn authorize_on(
    c: &mut Client,
    req: &AuthorizationRequest<'_>,
    now_ms: i64,
    expiry_ms: i64,
) -> Result<Decision, Failure> {
    let mut tx = c.transaction()?;
    let decision = authorize_in(&mut tx as &mut dyn PgStatements, req, now_ms, expiry_ms)?;
    tx.commit()?;
    Ok(decision)
}

/// The decision for `req`, inside the caller's transaction `tx` (which commits it).
fn authorize_in(
    tx: &mut dyn PgStatements,
    req: &AuthorizationRequest<'_>,
    now_ms: i64,
    expiry_ms: i64,
) -> Result<Decision, Failure> {
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        typed![BUDGET_LOCK => INT4, req.account => TEXT],
    )?;
    let existing = tx.query_typed_opt(
        "SELECT decision_id, account, amount_cents, scope, request_hash, created_at,
                 state, reserved_ms
             FROM callid_decisions WHERE agent_id = $1 AND operation_key = $2 FOR UPDATE",
        typed![req.agent_id => TEXT, req.operation_key => TEXT],
    )?;
    let check_budget = |tx: &mut dyn PgStatements| -> Result<(), Failure> {
        let Some(budget) = req.budget_cents else {
            return Ok(());
        };
        let spent: i64 = tx
            .query_typed_one(
                SPENT,
                typed![req.account => TEXT, now_ms => INT8, expiry_ms => INT8],
            )?
            .try_get(0)?;
        let remaining = budget.saturating_sub(spent.max(0) as u64);
        if req.amount_cents > remaining {
            return Err(Failure::Backend(BackendError::BudgetExceeded {
                account: req.account.to_owned(),
                amount_cents: req.amount_cents,
                budget_cents: budget,
                remaining_cents: remaining,
            }));
        }
        Ok(())
    };
    if let Some(row) = existing {
        let decision = Decision {
            decision_id: row.try_get(0)?,
            account: row.try_get(1)?,
            amount_cents: row.try_get::<_, i64>(2)?.max(0) as u64,
            scope: row.try_get(3)?,
            request_hash: row.try_get(4)?,
            created_at: row.try_get(5)?,
            newly_recorded: false,
        };
        let state: String = row.try_get(6)?;
        let reserved_ms: i64 = row.try_get(7)?;
        let differs = decision.differs_from(req);
        if !differs.is_empty() {
            return Err(Failure::Backend(BackendError::CreateNewOperation {
                differs: differs.join(", "),
            }));
        }
        if lapsed(&state, reserved_ms, expiry_ms, now_ms) {
            check_budget(tx)?;
            tx.execute_typed(
                "UPDATE callid_decisions SET state = 'reserved', reserved_ms = $2
                     WHERE decision_id = $1",
                typed![decision.decision_id => TEXT, now_ms => INT8],
            )?;
        }
        return Ok(decision);
    }
    check_budget(tx)?;
    let id = decision_id(req.agent_id, req.operation_key);
    let amount = req.amount_cents as i64;
    let created_at: String = tx
        .query_typed_one(
            "INSERT INTO callid_decisions (agent_id, operation_key, decision_id, account,
                     amount_cents, scope, request_hash, created_at, state, reserved_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7,
                     to_char(clock_timestamp() AT TIME ZONE 'UTC',
                             'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                     'reserved', $8)
                 RETURNING created_at",
            typed![
                req.agent_id => TEXT,
                req.operation_key => TEXT,
                id => TEXT,
                req.account => TEXT,
                amount => INT8,
                req.scope => TEXT,
                req.request_hash => TEXT,
                now_ms => INT8,
            ],
        )?
        .try_get(0)?;
    Ok(Decision {
        decision_id: id,
        account: req.account.to_owned(),
        amount_cents: req.amount_cents,
        scope: req.scope.to_owned(),
        request_hash: req.request_hash.to_owned(),
        created_at,
        newly_recorded: true,
    })
}

fn set_state_on(
    c: &mut dyn PgStatements,
    decision_id: &str,
    to: &str,
    from: &[String],
) -> Result<u64, Failure> {
    Ok(c.execute_typed(
        "UPDATE callid_decisions SET state = $2 WHERE decision_id = $1 AND state = ANY($3)",
        typed![decision_id => TEXT, to => TEXT, from => TEXT_ARRAY],
    )?)
}

fn record_charge_on(
    c: &mut dyn PgStatements,
    decision_id: &str,
    charged_cents: u64,
) -> Result<(), Failure> {
    let charged = charged_cents as i64;
    c.execute_typed(
        "UPDATE callid_decisions SET state = 'charged', charged_cents = $2
             WHERE decision_id = $1",
        typed![decision_id => TEXT, charged => INT8],
    )?;
    Ok(())
}

fn begin_execution_on(c: &mut Client, decision_id: &str, request: &str) -> Result<Begin, Failure> {
    let mut tx = c.transaction()?;
    let begin = begin_execution_in(&mut tx as &mut dyn PgStatements, decision_id, request)?;
    tx.commit()?;
    Ok(begin)
}

/// The execution's `begin` inside the caller's transaction `tx` (which commits it).
fn begin_execution_in(
    tx: &mut dyn PgStatements,
    decision_id: &str,
    request: &str,
) -> Result<Begin, Failure> {
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        typed![EXECUTION_LOCK => INT4, decision_id => TEXT],
    )?;
    let row = tx.query_typed_opt(
        "SELECT request, state, attempts, receipt, provider_replayed
             FROM callid_executions WHERE decision_id = $1",
        typed![decision_id => TEXT],
    )?;
    let key = provider_key(decision_id);
    let Some(row) = row else {
        tx.execute_typed(
            "INSERT INTO callid_executions (decision_id, provider_key, request, state,
                     attempts, dispatched_at)
                 VALUES ($1, $2, $3, 'dispatched', 1, clock_timestamp())",
            typed![decision_id => TEXT, key => TEXT, request => TEXT],
        )?;
        return Ok(Begin::Dispatch { key });
    };
    let stored: String = row.try_get(0)?;
    if stored != request {
        return Err(Failure::Backend(BackendError::CreateNewOperation {
            differs: "request".into(),
        }));
    }
    let state: String = row.try_get(1)?;
    let attempts: i64 = row.try_get(2)?;
    let receipt: Option<String> = row.try_get(3)?;
    let replayed: Option<bool> = row.try_get(4)?;
    if let (true, Some(receipt)) = (state == "completed", receipt) {
        return Ok(Begin::Done(Executed {
            receipt: parse_receipt(&receipt)?,
            provider_replayed: replayed == Some(true),
            from_record: true,
            attempts: attempts.max(0) as u64,
        }));
    }
    tx.execute_typed(
        "UPDATE callid_executions SET attempts = attempts + 1 WHERE decision_id = $1",
        typed![decision_id => TEXT],
    )?;
    Ok(Begin::Dispatch { key })
}

fn complete_execution_on(
    c: &mut dyn PgStatements,
    decision_id: &str,
    text: &str,
    replayed: bool,
) -> Result<Executed, Failure> {
    c.execute_typed(
        "UPDATE callid_executions SET state = 'completed', receipt = $2,
                 provider_replayed = $3, completed_at = clock_timestamp()
             WHERE decision_id = $1 AND state = 'dispatched'",
        typed![decision_id => TEXT, text => TEXT, replayed => BOOL],
    )?;
    let row = c.query_typed_one(
        "SELECT receipt, provider_replayed, attempts FROM callid_executions
             WHERE decision_id = $1",
        typed![decision_id => TEXT],
    )?;
    let stored: String = row.try_get(0)?;
    let stored_replayed: Option<bool> = row.try_get(1)?;
    let attempts: i64 = row.try_get(2)?;
    Ok(Executed {
        receipt: parse_receipt(&stored)?,
        provider_replayed: stored_replayed == Some(true),
        from_record: false,
        attempts: attempts.max(0) as u64,
    })
}

fn parse_receipt(text: &str) -> Result<Receipt, Failure> {
    serde_json::from_str(text).map_err(|e| {
        Failure::Backend(BackendError::SharedStateUnavailable {
            url: String::new(),
            doing: "reading an execution's receipt",
            cause: format!("the stored receipt does not parse: {e}"),
        })
    })
}

/// A database error, or a decision refused (budget, another operation's key).
enum Failure {
    Db(postgres::Error),
    Backend(BackendError),
}

impl From<postgres::Error> for Failure {
    fn from(e: postgres::Error) -> Self {
        Failure::Db(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pooled session dies in a server restart while it sits idle: each must be replaced
    /// when it is checked out, so the first calls after the restart succeed (defect 11 of the
    /// gateway money issue). All of the pool is checked out at once, so every stale session is
    /// reached, not only the one on top of the idle list.
    #[test]
    fn pooled_sessions_ended_by_a_restart_are_replaced_before_use() {
        let Some(cluster) = crate::storage::cluster::for_unit_test() else {
            return;
        };
        let url = PgUrl::parse(&cluster.url("callid")).expect("the cluster's URL");
        let state = SharedState::new(url);
        let all = |round: usize| {
            let mut held = vec![];
            for i in 0..POOL_SIZE {
                let mut checkout = state.checkout("checking a session").unwrap_or_else(|e| {
                    panic!("round {round}, session {i}: {e}");
                });
                let one: i32 = checkout
                    .client
                    .as_mut()
                    .expect("checked out")
                    .query_one("SELECT 1", &[])
                    .and_then(|r| r.try_get(0))
                    .unwrap_or_else(|e| panic!("round {round}, session {i}: {e}"));
                assert_eq!(one, 1);
                held.push(checkout);
            }
        };
        all(0);
        for round in 1..=10 {
            cluster.restart_server().expect("a restart");
            all(round);
        }
    }
}
