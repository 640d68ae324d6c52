//! The SQLite backend of the registry: one file on this machine (see the module docs of
//! [`super`] for its Durability, Concurrency, Compatibility and Retention).

use super::{
    InTransaction, Insert, InsertDone, Lease, NewOperation, Operation, RawRow, RegistryError,
    Status, Write, now_ms, owner_alive,
};
use crate::backend::LayerTx;
use crate::keys::PublicHandle;
use crate::storage::schema::registry::REGISTRY;
use crate::storage::sqlite::{Cached as _, Create, Savepoint};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::oneshot;

/// An open registry.
pub struct SqliteRegistry {
    conn: Connection,
    path: PathBuf,
    installation_id: String,
}

impl std::fmt::Debug for SqliteRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteRegistry")
            .field("path", &self.path)
            .field("installation_id", &self.installation_id)
            .finish()
    }
}

impl SqliteRegistry {
    /// Opens the registry at `path`, creating it (mode 0600, and its directory) if absent, and
    /// migrating it to the newest schema. A foreign, newer, corrupt or world-readable file is
    /// refused untouched (see [`crate::storage::sqlite`]).
    pub fn open(path: &Path) -> Result<SqliteRegistry, RegistryError> {
        let conn = crate::storage::sqlite::open_connection(path, &REGISTRY, Create::IfMissing)?;
        Self::init(conn, path.to_path_buf())
    }

    /// Opens an existing registry (operator commands): never creates one.
    pub fn open_existing(path: &Path) -> Result<SqliteRegistry, RegistryError> {
        if !path.exists() {
            return Err(RegistryError::Missing {
                path: path.to_path_buf(),
            });
        }
        let conn = crate::storage::sqlite::open_connection(path, &REGISTRY, Create::Never)?;
        Self::init(conn, path.to_path_buf())
    }

    /// Opens an in-memory registry (unit tests).
    #[cfg(test)]
    pub fn open_in_memory() -> Result<SqliteRegistry, RegistryError> {
        let conn = crate::storage::sqlite::open_in_memory(&REGISTRY)?;
        Self::init(conn, PathBuf::from(":memory:"))
    }

    pub(super) fn init(conn: Connection, path: PathBuf) -> Result<SqliteRegistry, RegistryError> {
        let mut registry = SqliteRegistry {
            conn,
            path,
            installation_id: String::new(),
        };
        registry.installation_id = registry.ensure_installation_id()?;
        Ok(registry)
    }

    /// Applies every migration above the file's `user_version` in one exclusive transaction.
    /// Running it again is a no-op.
    #[cfg(test)]
    pub fn migrate(&mut self) -> Result<(), RegistryError> {
        crate::storage::sqlite::migrate(&mut self.conn, &REGISTRY)
            .map_err(sqlite(&self.path, "migrating its schema"))
    }

    pub(super) fn ensure_installation_id(&mut self) -> Result<String, RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, "reading the installation id"))?;
        tx.execute(
            "INSERT OR IGNORE INTO settings (name, value) VALUES ('installation_id', ?1)",
            [uuid::Uuid::new_v4().to_string()],
        )
        .map_err(sqlite(&path, "recording the installation id"))?;
        let id: String = tx
            .query_row(
                "SELECT value FROM settings WHERE name = 'installation_id'",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite(&path, "reading the installation id"))?;
        tx.commit()
            .map_err(sqlite(&path, "recording the installation id"))?;
        Ok(id)
    }

    /// This router installation's id, generated on first open and kept.
    pub fn installation_id(&self) -> &str {
        &self.installation_id
    }

    /// The schema version of the open file.
    #[cfg(test)]
    pub fn schema_version(&self) -> Result<i64, RegistryError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sqlite(&self.path, "reading its schema version"))
    }

    /// The operation recorded for a call identity of this installation.
    pub fn find(
        &self,
        platform: &str,
        source_installation: &str,
        harness_call_id: &str,
    ) -> Result<Option<Operation>, RegistryError> {
        // Cached: every spend call (and every redelivery) looks its call up first, and preparing
        // the statement each time cost more than running it (`callid bench --only router_replay`).
        self.conn
            .prepare_cached(&format!(
                "{SELECT} WHERE platform = ?1 AND installation_id = ?2 AND harness_call_id = ?3 \
                 AND source_installation = ?4"
            ))
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![
                            platform,
                            self.installation_id,
                            harness_call_id,
                            source_installation
                        ],
                        row_to_raw,
                    )
                    .optional()
            })
            .map_err(sqlite(&self.path, "looking up a call"))?
            .map(|raw| raw.into_operation(&self.path))
            .transpose()
    }

    /// The operation with this public handle.
    pub fn find_by_handle(&self, handle: &str) -> Result<Option<Operation>, RegistryError> {
        self.conn
            .prepare_cached(&format!(
                "{SELECT} WHERE handle = ?1 AND installation_id = ?2"
            ))
            .and_then(|mut statement| {
                statement
                    .query_row(params![handle, self.installation_id], row_to_raw)
                    .optional()
            })
            .map_err(sqlite(&self.path, "looking up a handle"))?
            .map(|raw| raw.into_operation(&self.path))
            .transpose()
    }

    /// Records `new` unless its call identity already has a row, in one IMMEDIATE transaction;
    /// returns the row now stored and whether it was created by this call. The row is committed
    /// (durably, `synchronous=FULL`) when this returns.
    #[cfg(test)]
    pub fn insert_or_get(&mut self, new: NewOperation) -> Result<(Operation, bool), RegistryError> {
        match self.insert_within_budget(new, None)? {
            Insert::Stored(op, created) => Ok((*op, created)),
            Insert::OverBudget { .. } => unreachable!("no budget was given"),
        }
    }

    #[cfg(test)]
    /// Records `new` unless its call identity already has a row, and answers the row now stored
    /// and whether this call created it; refuses a new operation whose amount would take the cents
    /// committed by this installation's operations (completed ones by what they charged, pending
    /// and awaiting ones by their amount) above `budget_cents`. The sum and the insert run in
    /// one IMMEDIATE transaction, so concurrent operations, from any process sharing the file,
    /// never overspend together.
    pub fn insert_within_budget(
        &mut self,
        new: NewOperation,
        budget_cents: Option<u64>,
    ) -> Result<Insert, RegistryError> {
        self.insert_leased::<(), ()>(new, budget_cents, None, None)
            .map(|(insert, _)| insert)
    }

    #[cfg(test)]
    /// [`SqliteRegistry::insert_within_budget`] that also gives a new, pending row its dispatch
    /// lease for `lease` (owner, time to live) in the same transaction: the row and the lease are
    /// one commit. An existing row is returned untouched (its lease is claimed separately).
    ///
    /// `stage` (another layer's steps, see [`super::Write::Insert`]) runs for a
    /// created, leased row inside a savepoint of the same transaction; its outcome is returned
    /// beside the row (`None`: it did not run).
    #[allow(clippy::type_complexity)]
    pub fn insert_leased<T, E>(
        &mut self,
        new: NewOperation,
        budget_cents: Option<u64>,
        lease: Option<(&str, Duration)>,
        stage: Option<InTransaction<T, E>>,
    ) -> Result<(Insert, Option<Result<T, E>>), RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, "recording a new operation"))?;
        let done = insert_in(
            &tx,
            &self.installation_id,
            &path,
            new,
            budget_cents,
            lease,
            stage,
        )?;
        tx.commit()
            .map_err(sqlite(&path, "committing a new operation"))?;
        Ok(done)
    }

    /// Takes the dispatch lease of a pending operation for `owner` until `now + ttl`. A lease
    /// held by another owner is taken over only if it expired or its process is gone.
    pub fn claim_lease(
        &mut self,
        handle: &PublicHandle,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, "taking a dispatch lease"))?;
        type Claimed = (String, Option<String>, Option<i64>, i64, Option<i64>, i64);
        let (status, lease_owner, expires, at_most_once, dispatched, generation): Claimed = tx
            .row(
                "SELECT status, lease_owner, lease_expires_ms, at_most_once, dispatch_generation,
                     lease_generation FROM operations WHERE handle = ?1",
                [handle.as_str()],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .map_err(sqlite(&path, "taking a dispatch lease"))?;
        let status = Status::parse(&status).ok_or_else(|| RegistryError::Corrupt {
            path: path.clone(),
            detail: format!("unknown status `{status}`"),
        })?;
        if status != Status::Pending {
            return Ok(Lease::NotPending(status));
        }
        let now = now_ms();
        if let Some(other) = lease_owner.filter(|o| o != owner) {
            let expired = expires.is_none_or(|e| e <= now);
            if !expired && owner_alive(&other) {
                return Ok(Lease::HeldElsewhere);
            }
        }
        let at_most_once = at_most_once != 0;
        if at_most_once && dispatched.is_some() {
            // Dispatched before and never settled: its outcome is unknown, so it is never sent
            // again; a person resolves it.
            tx.exec(
                "UPDATE operations SET status = 'in_doubt', error_code = 'outcome_in_doubt',
                     error_message = ?2, lease_owner = NULL, lease_expires_ms = NULL,
                     updated_ms = ?3
                 WHERE handle = ?1",
                params![handle.as_str(), super::TAKEN_OVER_IN_DOUBT, now],
            )
            .map_err(sqlite(&path, "marking an operation in doubt"))?;
            tx.commit()
                .map_err(sqlite(&path, "marking an operation in doubt"))?;
            return Ok(Lease::NotPending(Status::InDoubt));
        }
        let generation = generation + 1;
        tx.exec(
            "UPDATE operations SET lease_owner = ?2, lease_expires_ms = ?3, lease_generation = ?4,
                 dispatch_generation = CASE WHEN at_most_once = 1 THEN ?4 ELSE NULL END,
                 dispatched_ms = CASE WHEN at_most_once = 1 THEN ?5 ELSE NULL END
             WHERE handle = ?1",
            params![
                handle.as_str(),
                owner,
                now + ttl.as_millis() as i64,
                generation,
                now
            ],
        )
        .map_err(sqlite(&path, "taking a dispatch lease"))?;
        tx.commit()
            .map_err(sqlite(&path, "taking a dispatch lease"))?;
        Ok(Lease::Granted { generation })
    }

    /// Extends a held lease; see [`super::Registry::renew_lease`].
    pub fn renew_lease(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        ttl: Duration,
    ) -> Result<bool, RegistryError> {
        self.write(
            "renewing a dispatch lease",
            "UPDATE operations SET lease_expires_ms = ?3
             WHERE handle = ?1 AND lease_generation = ?2 AND status = 'pending'
               AND lease_owner IS NOT NULL",
            params![
                handle.as_str(),
                generation,
                now_ms() + ttl.as_millis() as i64
            ],
        )
        .map(|n| n == 1)
    }

    /// See [`super::Registry::mark_in_doubt`].
    pub fn mark_in_doubt(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        reason: &str,
    ) -> Result<bool, RegistryError> {
        self.write(
            "marking an operation in doubt",
            "UPDATE operations SET status = 'in_doubt', error_code = 'outcome_in_doubt',
                 error_message = ?3, lease_owner = NULL, lease_expires_ms = NULL, updated_ms = ?4
             WHERE handle = ?1 AND status = 'pending' AND lease_generation = ?2",
            params![handle.as_str(), generation, reason, now_ms()],
        )
        .map(|n| n == 1)
    }

    /// The row write of [`super::Registry::resolve`]: `true` when an `in_doubt` row changed.
    pub(super) fn resolve_row(
        &mut self,
        handle: &str,
        charged: bool,
        result: Option<&Value>,
        by: &str,
    ) -> Result<bool, RegistryError> {
        let changed = if charged {
            self.write(
                "recording a resolution",
                "UPDATE operations SET status = 'completed', result = ?2,
                     charged_cents = amount_cents, error_code = NULL, error_message = NULL,
                     resolution = 'charged', resolved_by = ?3, resolved_ms = ?4, updated_ms = ?4
                 WHERE handle = ?1 AND status = 'in_doubt'",
                params![
                    handle,
                    result.unwrap_or(&Value::Null).to_string(),
                    by,
                    now_ms()
                ],
            )?
        } else {
            self.write(
                "recording a resolution",
                "UPDATE operations SET status = 'pending', dispatch_generation = NULL,
                     dispatched_ms = NULL, error_code = NULL, error_message = NULL,
                     resolution = 'not_charged', resolved_by = ?2, resolved_ms = ?3,
                     updated_ms = ?3
                 WHERE handle = ?1 AND status = 'in_doubt'",
                params![handle, by, now_ms()],
            )?
        };
        Ok(changed == 1)
    }

    /// The file, as messages name it.
    pub(super) fn location(&self) -> PathBuf {
        self.path.clone()
    }

    /// See [`super::Registry::release_lease`].
    pub fn release_lease(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
    ) -> Result<(), RegistryError> {
        self.write(
            "releasing a dispatch lease",
            "UPDATE operations SET lease_owner = NULL, lease_expires_ms = NULL,
                 dispatch_generation = NULL, dispatched_ms = NULL
             WHERE handle = ?1 AND lease_generation = ?2 AND status = 'pending'",
            params![handle.as_str(), generation],
        )
        .map(|_| ())
    }

    #[cfg(test)]
    /// Records the result of a completed operation, with what the provider charged, and drops
    /// its lease.
    pub fn record_result(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        result: &Value,
        charged_cents: u64,
    ) -> Result<(), RegistryError> {
        self.record_settled::<String>(handle, generation, result, charged_cents, None)
    }

    #[cfg(test)]
    /// [`SqliteRegistry::record_result`] with `settle`, another layer's record of the same
    /// outcome (see [`super::Write::Result`]), in the same transaction; when it fails
    /// nothing is recorded.
    pub fn record_settled<E: std::fmt::Display>(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        result: &Value,
        charged_cents: u64,
        settle: Option<InTransaction<(), E>>,
    ) -> Result<(), RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, RECORDING_RESULT))?;
        record_in(
            &tx,
            &path,
            handle,
            generation,
            result,
            charged_cents,
            settle,
        )?;
        tx.commit().map_err(sqlite(&path, RECORDING_RESULT))
    }

    /// Runs `writes` in one transaction, one commit for all (group commit), each in a savepoint
    /// of its own: a write that fails is rolled back alone and answered its error; the others
    /// are answered once the commit returned (if it fails, every write is answered that error
    /// and nothing of them is recorded). Nothing is answered before the commit, so no caller
    /// acts on a row that is not durable.
    pub fn write_batch<T>(&mut self, writes: Vec<Write<T>>) {
        let path = self.path.clone();
        let tx = match self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
        {
            Ok(tx) => tx,
            Err(e) => {
                let e = sqlite(&path, "starting a group commit")(e);
                for w in writes {
                    w.fail(&e);
                }
                return;
            }
        };
        let mut answers = Vec::with_capacity(writes.len());
        for write in writes {
            let mark = match Savepoint::begin(&tx, "write") {
                Ok(mark) => mark,
                Err(e) => {
                    write.fail(&sqlite(&path, "starting a group commit")(e));
                    continue;
                }
            };
            let answer = match write {
                Write::Insert {
                    new,
                    budget_cents,
                    owner,
                    ttl,
                    stage,
                    reply,
                } => {
                    let done = insert_in(
                        &tx,
                        &self.installation_id,
                        &path,
                        *new,
                        budget_cents,
                        Some((&owner, ttl)),
                        stage,
                    )
                    .map(|(insert, staged)| {
                        let leased = matches!(&insert, Insert::Stored(op, true) if op.status == Status::Pending);
                        (insert, leased, staged)
                    });
                    Answer::Insert(done, reply)
                }
                Write::Result {
                    handle,
                    result,
                    charged_cents,
                    generation,
                    settle,
                    reply,
                } => Answer::Result(
                    record_in(
                        &tx,
                        &path,
                        &handle,
                        generation,
                        &result,
                        charged_cents,
                        settle,
                    ),
                    reply,
                ),
            };
            if let Err(e) = mark.end(answer.is_ok()) {
                // A savepoint that cannot be closed leaves the transaction unusable.
                let e = sqlite(&path, "closing a group commit's write")(e);
                answer.fail(&e);
                for a in answers {
                    Answer::fail(a, &e);
                }
                return;
            }
            answers.push(answer);
        }
        match tx.commit() {
            Ok(()) => answers.into_iter().for_each(Answer::send),
            Err(e) => {
                let e = sqlite(&path, "committing a group of writes")(e);
                for a in answers {
                    a.fail(&e);
                }
            }
        }
    }

    /// Records a final error of an operation (it will be answered again on redelivery).
    pub fn record_failure(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        code: &str,
        message: &str,
    ) -> Result<(), RegistryError> {
        let n = self.write(
            "recording a failure",
            RECORD_FAILURE,
            params![handle.as_str(), code, message, now_ms(), generation],
        )?;
        fenced(n, handle, "a failure")
    }

    /// A person's decision on an operation waiting for approval. Approving makes it `pending`
    /// (it runs on `resume_operation` or redelivery); denying makes it `denied` for good.
    pub fn decide(
        &mut self,
        handle: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<Operation, RegistryError> {
        let path = self.path.clone();
        let op = self
            .find_by_handle(handle)?
            .ok_or_else(|| RegistryError::UnknownHandle {
                handle: handle.to_string(),
                path: path.clone(),
            })?;
        if op.status != Status::AwaitingApproval {
            return Err(RegistryError::NotAwaitingApproval {
                handle: handle.to_string(),
                status: op.status.name(),
            });
        }
        let changed = if approve {
            self.write(
                "recording an approval",
                "UPDATE operations SET status = 'pending', approval = 'approved', updated_ms = ?2
                 WHERE handle = ?1 AND status = 'awaiting_approval'",
                params![handle, now_ms()],
            )?
        } else {
            let message = match reason {
                Some(r) => format!("a person denied this operation: {r}"),
                None => "a person denied this operation".to_string(),
            };
            self.write(
                "recording a denial",
                "UPDATE operations SET status = 'denied', approval = 'denied',
                     error_code = 'operation_denied', error_message = ?2, updated_ms = ?3
                 WHERE handle = ?1 AND status = 'awaiting_approval'",
                params![handle, message, now_ms()],
            )?
        };
        if changed == 0 {
            return Err(RegistryError::NotAwaitingApproval {
                handle: handle.to_string(),
                status: "changed meanwhile",
            });
        }
        self.find_by_handle(handle)?
            .ok_or_else(|| RegistryError::UnknownHandle {
                handle: handle.to_string(),
                path,
            })
    }

    fn write(
        &mut self,
        doing: &'static str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<usize, RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, doing))?;
        let n = tx.exec(sql, params).map_err(sqlite(&path, doing))?;
        tx.commit().map_err(sqlite(&path, doing))?;
        Ok(n)
    }
}

/// The cents committed by an installation's operations (completed ones by what was charged, or
/// their amount; pending and awaiting ones by their amount): the running total of completed
/// operations and the open rows (migration 5), so the cost does not grow with the operations
/// completed before.
const COMMITTED: &str = concat!(
    "SELECT COALESCE((SELECT completed_cents FROM installation_totals
        WHERE installation_id = ?1), 0)
    + COALESCE((SELECT SUM(amount_cents) FROM operations
        WHERE installation_id = ?1 AND status IN ",
    super::open_statuses!(),
    "), 0)"
);

/// Records `new` (with its lease and `stage`) inside the open transaction `tx`; see
/// [`SqliteRegistry::insert_leased`]. The caller commits.
#[allow(clippy::type_complexity)]
fn insert_in<T, E>(
    tx: &Connection,
    installation_id: &str,
    path: &Path,
    new: NewOperation,
    budget_cents: Option<u64>,
    lease: Option<(&str, Duration)>,
    stage: Option<InTransaction<T, E>>,
) -> Result<(Insert, Option<Result<T, E>>), RegistryError> {
    let existing = tx
        .row(
            &format!(
                "{SELECT} WHERE platform = ?1 AND installation_id = ?2 AND harness_call_id = ?3 \
                 AND source_installation = ?4"
            ),
            params![
                new.platform,
                installation_id,
                new.harness_call_id,
                new.source_installation
            ],
            row_to_raw,
        )
        .optional()
        .map_err(sqlite(path, "looking up a call"))?;
    if let Some(raw) = existing {
        return Ok((
            Insert::Stored(Box::new(raw.into_operation(path)?), false),
            None,
        ));
    }
    if let Some(budget) = budget_cents {
        let committed: i64 = tx
            .row(COMMITTED, [installation_id], |r| r.get(0))
            .map_err(sqlite(path, "summing the budget"))?;
        let committed = committed.max(0) as u64;
        if committed.saturating_add(new.amount_cents) > budget {
            return Ok((
                Insert::OverBudget {
                    committed_cents: committed,
                },
                None,
            ));
        }
    }
    let now = now_ms();
    let (status, approval) = new.initial_state();
    // Only a pending row is dispatched; one waiting for a person gets no lease.
    let lease = lease.filter(|_| status == Status::Pending);
    let (lease_owner, lease_expires) = match lease {
        Some((owner, ttl)) => (Some(owner), Some(now + ttl.as_millis() as i64)),
        None => (None, None),
    };
    let generation = if lease.is_some() {
        super::FIRST_GENERATION
    } else {
        0
    };
    // An at-most-once row leased now is dispatched next: its dispatch mark commits with it.
    let dispatched = (lease.is_some() && new.at_most_once).then_some(generation);
    tx.exec(
        "INSERT INTO operations (platform, installation_id, harness_call_id, handle,
             operation_key, tool, request_hash, arguments, amount_cents, status, approval,
             created_ms, updated_ms, source_installation, lease_owner, lease_expires_ms,
             at_most_once, lease_generation, dispatch_generation, dispatched_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13, ?14, ?15, ?16, ?17,
             ?18, CASE WHEN ?18 IS NULL THEN NULL ELSE ?12 END)",
        params![
            new.platform,
            installation_id,
            new.harness_call_id,
            new.handle.as_str(),
            new.key.expose(),
            new.tool,
            new.request_hash.as_str(),
            new.arguments.to_string(),
            new.amount_cents as i64,
            status.name(),
            approval.name(),
            now,
            new.source_installation,
            lease_owner,
            lease_expires,
            new.at_most_once as i64,
            generation,
            dispatched,
        ],
    )
    .map_err(sqlite(path, "recording a new operation"))?;
    let staged = match stage.filter(|_| lease.is_some()) {
        None => None,
        Some(stage) => {
            let mark =
                Savepoint::begin(tx, "stage").map_err(sqlite(path, "recording a new operation"))?;
            let outcome = stage(LayerTx::Sqlite(tx));
            // Rolled back alone when it failed: the row and lease stay.
            mark.end(outcome.is_ok())
                .map_err(sqlite(path, "recording a new operation"))?;
            Some(outcome)
        }
    };
    Ok((
        Insert::Stored(Box::new(new.into_operation(status, approval)), true),
        staged,
    ))
}

const RECORDING_RESULT: &str = "recording a result";

/// The fence of a dispatcher's write (`?5`: its lease generation): the row is still pending
/// under its lease, or in doubt after a dispatch under it (its answer, late, settles the doubt:
/// nobody else dispatched since).
macro_rules! fence {
    () => {
        r"((status = 'pending' AND lease_generation = ?5)
          OR (status = 'in_doubt' AND dispatch_generation = ?5))"
    };
}

/// Records a completed operation's result, fenced ([`fence`]).
const RECORD_RESULT: &str = concat!(
    "UPDATE operations SET status = 'completed', result = ?2,
        lease_owner = NULL, lease_expires_ms = NULL, updated_ms = ?3, charged_cents = ?4,
        error_code = NULL, error_message = NULL
    WHERE handle = ?1 AND ",
    fence!()
);

/// Records a final error, fenced ([`fence`]).
const RECORD_FAILURE: &str = concat!(
    "UPDATE operations SET status = 'failed', error_code = ?2, error_message = ?3,
        lease_owner = NULL, lease_expires_ms = NULL, updated_ms = ?4
    WHERE handle = ?1 AND ",
    fence!()
);

/// `Ok` when a fenced write changed its row; [`RegistryError::Fenced`] when it matched none.
fn fenced(changed: usize, handle: &PublicHandle, doing: &'static str) -> Result<(), RegistryError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(RegistryError::Fenced {
            handle: handle.as_str().to_string(),
            doing,
        })
    }
}

/// Records a completed operation's result (and `settle`) inside the open transaction `tx`; see
/// [`SqliteRegistry::record_settled`]. The caller commits.
fn record_in<E: std::fmt::Display>(
    tx: &Connection,
    path: &Path,
    handle: &PublicHandle,
    generation: i64,
    result: &Value,
    charged_cents: u64,
    settle: Option<InTransaction<(), E>>,
) -> Result<(), RegistryError> {
    let n = tx
        .exec(
            RECORD_RESULT,
            params![
                handle.as_str(),
                result.to_string(),
                now_ms(),
                charged_cents as i64,
                generation
            ],
        )
        .map_err(sqlite(path, RECORDING_RESULT))?;
    // A stale fencing token: nothing may be recorded, the layers' record included (the
    // caller's savepoint or transaction is rolled back on this error).
    fenced(n, handle, "the result")?;
    if let Some(settle) = settle {
        settle(LayerTx::Sqlite(tx)).map_err(|e| RegistryError::layer(path.to_path_buf(), e))?;
    }
    Ok(())
}

/// A write of a batch, done, waiting for the commit to be answered.
enum Answer<T> {
    Insert(
        Result<InsertDone<T>, RegistryError>,
        oneshot::Sender<Result<InsertDone<T>, RegistryError>>,
    ),
    Result(
        Result<(), RegistryError>,
        oneshot::Sender<Result<(), RegistryError>>,
    ),
}

impl<T> Answer<T> {
    fn is_ok(&self) -> bool {
        match self {
            Answer::Insert(done, _) => done.is_ok(),
            Answer::Result(done, _) => done.is_ok(),
        }
    }

    fn send(self) {
        // A caller that went away has nothing to be told.
        match self {
            Answer::Insert(done, reply) => drop(reply.send(done)),
            Answer::Result(done, reply) => drop(reply.send(done)),
        }
    }

    fn fail(self, e: &RegistryError) {
        match self {
            Answer::Insert(_, reply) => drop(reply.send(Err(e.again()))),
            Answer::Result(_, reply) => drop(reply.send(Err(e.again()))),
        }
    }
}

const SELECT: &str = "SELECT platform, harness_call_id, handle, operation_key, tool, request_hash,
    arguments, amount_cents, status, approval, result, error_code, error_message,
    source_installation, charged_cents, at_most_once, dispatched_ms, resolution, resolved_by,
    resolved_ms FROM operations";

fn row_to_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        platform: r.get(0)?,
        harness_call_id: r.get(1)?,
        handle: r.get(2)?,
        key: r.get(3)?,
        tool: r.get(4)?,
        request_hash: r.get(5)?,
        arguments: r.get(6)?,
        amount_cents: r.get(7)?,
        status: r.get(8)?,
        approval: r.get(9)?,
        result: r.get(10)?,
        error_code: r.get(11)?,
        error_message: r.get(12)?,
        source_installation: r.get(13)?,
        at_most_once: r.get::<_, i64>(15)? != 0,
        dispatched_ms: r.get(16)?,
        resolution: r.get(17)?,
        resolved_by: r.get(18)?,
        resolved_ms: r.get(19)?,
        charged_cents: r.get(14)?,
    })
}

fn sqlite<'a>(
    path: &'a Path,
    doing: &'static str,
) -> impl Fn(rusqlite::Error) -> RegistryError + 'a {
    move |source| RegistryError::Sqlite {
        path: path.to_path_buf(),
        doing,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Approval, process_owner, process_start, retire_owner};
    use super::*;
    use crate::keys::OperationKey;
    use crate::keys::{DEFAULT_HANDLE_PREFIX, DEFAULT_KEY_PREFIX};
    use crate::storage::schema::registry::{APPLICATION_ID, MIGRATIONS};
    use serde_json::json;

    fn new_op(call: &str) -> NewOperation {
        NewOperation {
            platform: "codex".into(),
            source_installation: String::new(),
            harness_call_id: call.into(),
            handle: PublicHandle::generate(DEFAULT_HANDLE_PREFIX),
            key: OperationKey::generate(DEFAULT_KEY_PREFIX, "codex"),
            tool: "generate_image".into(),
            request_hash: crate::canonical::request_hash("generate_image", &json!({"prompt": "x"}))
                .unwrap(),
            arguments: json!({"prompt": "x"}),
            amount_cents: 3,
            needs_approval: false,
            at_most_once: false,
        }
    }

    #[test]
    fn migrate_twice_is_a_no_op() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let id = reg.installation_id().to_string();
        reg.migrate().unwrap();
        reg.migrate().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        assert_eq!(reg.ensure_installation_id().unwrap(), id);
    }

    #[test]
    fn insert_is_once_per_identity_and_lease_is_exclusive() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let (a, created) = reg.insert_or_get(new_op("c1")).unwrap();
        assert!(created);
        let (b, created) = reg.insert_or_get(new_op("c1")).unwrap();
        assert!(!created);
        assert_eq!(a.handle, b.handle);
        assert_eq!(a.key, b.key);
        let me = process_owner();
        let other = process_owner();
        assert_eq!(
            reg.claim_lease(&a.handle, &me, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted { generation: 1 }
        );
        // Another live instance of this process is refused.
        assert_eq!(
            reg.claim_lease(&a.handle, &other, Duration::from_secs(60))
                .unwrap(),
            Lease::HeldElsewhere
        );
        reg.record_result(&a.handle, 1, &json!({"ok": 1}), 3)
            .unwrap();
        assert_eq!(
            reg.claim_lease(&a.handle, &me, Duration::from_secs(60))
                .unwrap(),
            Lease::NotPending(Status::Completed)
        );
        let got = reg.find("codex", "", "c1").unwrap().unwrap();
        assert_eq!(got.result, Some(json!({"ok": 1})));
        assert_eq!(got.charged_cents, Some(3));
        assert!(reg.find("claude-code", "", "c1").unwrap().is_none());
        assert!(reg.find("codex", "inst-b", "c1").unwrap().is_none());
        let mut other_tenant = new_op("c1");
        other_tenant.source_installation = "inst-b".into();
        let (b2, created) = reg.insert_or_get(other_tenant).unwrap();
        assert!(created);
        assert_ne!(b2.handle, a.handle);
    }

    /// A group commit answers every write after its one commit; a write whose layer step fails
    /// is rolled back alone, and a failed stage leaves its row and lease in place.
    #[test]
    fn a_batch_answers_each_write_and_rolls_back_only_the_failed_one() {
        use super::super::{InsertDone, Write};
        use tokio::sync::oneshot::{self, error::TryRecvError};
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let (done, _) = reg.insert_or_get(new_op("done")).unwrap();
        let me = process_owner();
        let insert = |call: &str, stage: Option<InTransaction<u8, String>>| {
            let (reply, answer) = oneshot::channel::<Result<InsertDone<u8>, RegistryError>>();
            let write = Write::Insert {
                new: Box::new(new_op(call)),
                budget_cents: None,
                owner: me.clone(),
                ttl: Duration::from_secs(60),
                stage,
                reply,
            };
            (write, answer)
        };
        let (w1, mut a1) = insert(
            "staged",
            Some(Box::new(|tx| match tx {
                LayerTx::Sqlite(c) => c
                    .execute_batch("CREATE TABLE layer (x); INSERT INTO layer VALUES (1);")
                    .map(|_| 7)
                    .map_err(|e| e.to_string()),
                LayerTx::Postgres(_) => Err("not here".into()),
            })),
        );
        let (w2, mut a2) = insert(
            "stage-fails",
            Some(Box::new(|tx| match tx {
                LayerTx::Sqlite(c) => {
                    c.execute_batch("INSERT INTO layer VALUES (2);").unwrap();
                    Err("the layer refused".to_string())
                }
                LayerTx::Postgres(_) => Err("not here".into()),
            })),
        );
        let (reply, mut a3) = oneshot::channel();
        let w3 = Write::Result {
            handle: done.handle.clone(),
            result: json!({"ok": 1}),
            charged_cents: 3,
            generation: 0,
            settle: Some(Box::new(|_| Err("the settlement failed".to_string()))),
            reply,
        };
        assert!(matches!(a1.try_recv(), Err(TryRecvError::Empty)));
        reg.write_batch(vec![w1, w2, w3]);
        let (insert1, leased1, staged1) = a1.try_recv().unwrap().unwrap();
        assert!(matches!(insert1, Insert::Stored(_, true)) && leased1);
        assert_eq!(staged1.unwrap().unwrap(), 7);
        let (insert2, leased2, staged2) = a2.try_recv().unwrap().unwrap();
        assert!(matches!(insert2, Insert::Stored(_, true)) && leased2);
        assert_eq!(staged2.unwrap().unwrap_err(), "the layer refused");
        let failed = a3.try_recv().unwrap().unwrap_err().to_string();
        assert!(failed.contains("the settlement failed"), "{failed}");
        // Both rows are there; only the first stage's write is; the result was not recorded.
        assert!(reg.find("codex", "", "staged").unwrap().is_some());
        let second = reg.find("codex", "", "stage-fails").unwrap().unwrap();
        assert_eq!(second.status, Status::Pending);
        let rows: i64 = reg
            .conn
            .query_row("SELECT count(*) FROM layer", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        assert_eq!(
            reg.find("codex", "", "done").unwrap().unwrap().status,
            Status::Pending
        );
    }

    #[test]
    fn dead_owner_lease_is_taken_over() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let (a, _) = reg.insert_or_get(new_op("c2")).unwrap();
        // pid 0x7fffffff is never a live process.
        let dead = "2147483647:gone";
        assert_eq!(
            reg.claim_lease(&a.handle, dead, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted { generation: 1 }
        );
        assert_eq!(
            reg.claim_lease(&a.handle, &process_owner(), Duration::from_secs(60))
                .unwrap(),
            Lease::Granted { generation: 2 }
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_lease_of_a_gone_instance_is_taken_over_at_once() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let (a, _) = reg.insert_or_get(new_op("c4")).unwrap();
        let pid = std::process::id();
        let start = process_start(pid).unwrap();
        // A crashed predecessor with this very PID (PID 1 in a container), another instance id.
        let predecessor = format!("{pid}:{start}:0b5f");
        assert!(!owner_alive(&predecessor));
        assert_eq!(
            reg.claim_lease(&a.handle, &predecessor, Duration::from_secs(600))
                .unwrap(),
            Lease::Granted { generation: 1 }
        );
        let me = process_owner();
        assert_eq!(
            reg.claim_lease(&a.handle, &me, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted { generation: 2 }
        );
        // A retired instance's lease is free at once too.
        let other = process_owner();
        assert_eq!(
            reg.claim_lease(&a.handle, &other, Duration::from_secs(60))
                .unwrap(),
            Lease::HeldElsewhere
        );
        retire_owner(&me);
        assert_eq!(
            reg.claim_lease(&a.handle, &other, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted { generation: 3 }
        );
        // Another PID's owner whose start time differs: the PID was reused, the owner is gone.
        let parent = std::os::unix::process::parent_id();
        let parent_start = process_start(parent).unwrap();
        assert!(owner_alive(&format!("{parent}:{parent_start}:x")));
        assert!(!owner_alive(&format!("{parent}:{}:x", parent_start + 1)));
        assert!(owner_alive(&format!("{parent}:x")));
    }

    #[test]
    fn a_schema_1_registry_keeps_its_rows_with_an_empty_source_installation() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA user_version = 1; PRAGMA application_id = {APPLICATION_ID};
             INSERT INTO settings VALUES ('installation_id', 'inst-1');
             INSERT INTO operations (platform, installation_id, harness_call_id, handle,
                 operation_key, tool, request_hash, arguments, amount_cents, status, approval,
                 created_ms, updated_ms)
             VALUES ('codex', 'inst-1', 'old', 'h-old', 'k-old', 'generate_image', 'sha256:00',
                 '{{}}', 3, 'pending', 'not_required', 1, 1),
                 ('codex', 'inst-1', 'done', 'h-done', 'k-done', 'generate_image', 'sha256:01',
                 '{{}}', 4, 'completed', 'not_required', 1, 1);"
        ))
        .unwrap();
        let mut reg = SqliteRegistry::init(conn, PathBuf::from(":memory:")).unwrap();
        reg.migrate().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let old = reg.find("codex", "", "old").unwrap().unwrap();
        assert_eq!(old.handle.as_str(), "h-old");
        assert_eq!(old.charged_cents, None);
        // The running total starts from the rows already completed: 4 completed + 3 pending.
        assert!(matches!(
            reg.insert_within_budget(new_op("new"), Some(9)).unwrap(),
            Insert::OverBudget { committed_cents: 7 }
        ));
    }

    #[test]
    fn a_budget_counts_completed_rows_by_their_running_total_and_open_rows_by_their_amount() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let insert = |reg: &mut SqliteRegistry, call: &str, budget: Option<u64>| {
            reg.insert_within_budget(new_op(call), budget).unwrap()
        };
        let Insert::Stored(charged, true) = insert(&mut reg, "charged", None) else {
            panic!("not inserted")
        };
        let Insert::Stored(failed, true) = insert(&mut reg, "failed", None) else {
            panic!("not inserted")
        };
        insert(&mut reg, "pending", None);
        reg.record_result(&charged.handle, 0, &json!({"ok": true}), 5)
            .unwrap();
        reg.record_failure(&failed.handle, 0, "provider_refused", "no")
            .unwrap();
        // 5 charged + 3 pending; the failed row holds nothing.
        assert!(matches!(
            insert(&mut reg, "over", Some(10)),
            Insert::OverBudget { committed_cents: 8 }
        ));
        assert!(matches!(
            insert(&mut reg, "within", Some(11)),
            Insert::Stored(_, true)
        ));
        // The total kept by the triggers is what a sum over every row gives.
        let brute: i64 = reg
            .conn
            .query_row(
                "SELECT SUM(CASE WHEN status = 'completed' THEN COALESCE(charged_cents, amount_cents)
                     WHEN status IN ('pending', 'awaiting_approval', 'in_doubt') THEN amount_cents
                     ELSE 0 END)
                 FROM operations WHERE installation_id = ?1",
                [reg.installation_id()],
                |r| r.get(0),
            )
            .unwrap();
        let kept: i64 = reg
            .conn
            .query_row(COMMITTED, [reg.installation_id()], |r| r.get(0))
            .unwrap();
        assert_eq!((kept, brute), (11, 11));
        // And it reads one total and the open rows, never every operation of the installation.
        let plan = crate::storage::sqlite::query_plan(&reg.conn, COMMITTED, ["x"]);
        assert!(plan.contains("operations_open"), "{plan}");
        assert!(!plan.contains("SCAN operations"), "{plan}");
    }

    #[test]
    fn approval_decisions() {
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let mut op = new_op("c3");
        op.needs_approval = true;
        let (a, _) = reg.insert_or_get(op).unwrap();
        assert_eq!(a.status, Status::AwaitingApproval);
        let approved = reg.decide(a.handle.as_str(), true, None).unwrap();
        assert_eq!(
            (approved.status, approved.approval),
            (Status::Pending, Approval::Approved)
        );
        let err = reg.decide(a.handle.as_str(), false, None).unwrap_err();
        assert!(matches!(err, RegistryError::NotAwaitingApproval { .. }));
        let err = reg
            .decide("hubu:public-operation:v1:nope", true, None)
            .unwrap_err();
        assert!(matches!(err, RegistryError::UnknownHandle { .. }));
    }

    /// [`super::super::Registry::resolve`] on a SQLite registry of a test.
    fn resolve(
        reg: &mut SqliteRegistry,
        handle: &str,
        charged: bool,
        result: Option<&Value>,
        by: &str,
    ) -> Result<Operation, RegistryError> {
        let open = std::mem::replace(reg, SqliteRegistry::open_in_memory().unwrap());
        let mut registry = super::super::Registry::Sqlite(open);
        let done = registry.resolve(handle, charged, result, by);
        let super::super::Registry::Sqlite(back) = registry else {
            unreachable!()
        };
        *reg = back;
        done
    }

    fn at_most_once(call: &str) -> NewOperation {
        NewOperation {
            at_most_once: true,
            ..new_op(call)
        }
    }

    /// A dispatched at-most-once row whose dispatcher is gone is marked in doubt by the next
    /// claim, never leased again; the gone dispatcher's late answer (its generation is the
    /// dispatch's) settles it; a resolution is recorded with who and when.
    #[test]
    fn an_at_most_once_row_is_dispatched_once_and_in_doubt_after() {
        let ttl = Duration::from_secs(60);
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        let (a, _) = reg.insert_or_get(at_most_once("m1")).unwrap();
        let dead = "2147483647:gone";
        assert_eq!(
            reg.claim_lease(&a.handle, dead, ttl).unwrap(),
            Lease::Granted { generation: 1 }
        );
        let row = reg.find_by_handle(a.handle.as_str()).unwrap().unwrap();
        assert!(row.at_most_once && row.dispatched_ms.is_some());
        // The dispatcher died: the next claim finds its dispatch mark.
        let me = process_owner();
        assert_eq!(
            reg.claim_lease(&a.handle, &me, ttl).unwrap(),
            Lease::NotPending(Status::InDoubt)
        );
        assert_eq!(
            reg.claim_lease(&a.handle, &me, ttl).unwrap(),
            Lease::NotPending(Status::InDoubt)
        );
        let row = reg.find_by_handle(a.handle.as_str()).unwrap().unwrap();
        assert_eq!(row.status, Status::InDoubt);
        assert_eq!(row.error.as_ref().unwrap().0, "outcome_in_doubt");
        // The only dispatcher's late answer is recorded; any other generation is fenced.
        let fenced = reg.record_result(&a.handle, 2, &json!({"late": 1}), 3);
        assert!(
            matches!(fenced, Err(RegistryError::Fenced { .. })),
            "{fenced:?}"
        );
        reg.record_result(&a.handle, 1, &json!({"late": 1}), 3)
            .unwrap();
        let row = reg.find_by_handle(a.handle.as_str()).unwrap().unwrap();
        assert_eq!((row.status, row.error), (Status::Completed, None));

        // Resolutions: only of an in-doubt row; not charged clears the mark for one more send.
        let (b, _) = reg.insert_or_get(at_most_once("m2")).unwrap();
        let Lease::Granted { generation } = reg.claim_lease(&b.handle, &me, ttl).unwrap() else {
            panic!("leased")
        };
        assert!(
            reg.mark_in_doubt(&b.handle, generation, "no answer")
                .unwrap()
        );
        assert!(!reg.mark_in_doubt(&b.handle, generation, "again").unwrap());
        let err = resolve(&mut reg, a.handle.as_str(), true, None, "x").unwrap_err();
        assert!(matches!(
            err,
            RegistryError::NotInDoubt {
                status: "completed",
                ..
            }
        ));
        let op = resolve(&mut reg, b.handle.as_str(), false, None, "bob").unwrap();
        assert_eq!(op.status, Status::Pending);
        assert_eq!(op.dispatched_ms, None);
        let resolution = op.resolution.unwrap();
        assert_eq!(
            (resolution.name(), resolution.by.as_str()),
            ("not_charged", "bob")
        );
        assert!(resolution.at_ms > 0);
        assert!(matches!(
            reg.claim_lease(&b.handle, &me, ttl).unwrap(),
            Lease::Granted { generation: 2 }
        ));
        assert!(reg.mark_in_doubt(&b.handle, 2, "no answer").unwrap());
        let result = json!({"result": {"content": []}});
        let op = resolve(&mut reg, b.handle.as_str(), true, Some(&result), "alice").unwrap();
        assert_eq!(op.status, Status::Completed);
        assert_eq!(op.result, Some(result));
        assert_eq!(op.charged_cents, Some(op.amount_cents));
        assert!(op.resolution.unwrap().charged);
    }

    /// A dispatcher whose lease was taken over (a later generation) can neither renew it nor
    /// record a result or failure, and its layers' record is rolled back with the refused write.
    #[test]
    fn a_stale_generation_is_fenced_and_its_layer_record_rolled_back() {
        let ttl = Duration::from_secs(60);
        let mut reg = SqliteRegistry::open_in_memory().unwrap();
        reg.conn.execute_batch("CREATE TABLE layer (x)").unwrap();
        let (a, _) = reg.insert_or_get(new_op("f1")).unwrap();
        let (one, two) = (process_owner(), process_owner());
        assert!(matches!(
            reg.claim_lease(&a.handle, &one, ttl).unwrap(),
            Lease::Granted { generation: 1 }
        ));
        assert!(reg.renew_lease(&a.handle, 1, ttl).unwrap());
        retire_owner(&one);
        assert!(matches!(
            reg.claim_lease(&a.handle, &two, ttl).unwrap(),
            Lease::Granted { generation: 2 }
        ));
        assert!(!reg.renew_lease(&a.handle, 1, ttl).unwrap());
        let settle: InTransaction<(), String> = Box::new(|tx| match tx {
            LayerTx::Sqlite(c) => c
                .execute_batch("INSERT INTO layer VALUES (1)")
                .map_err(|e| e.to_string()),
            LayerTx::Postgres(_) => Err("not here".into()),
        });
        let stale = reg.record_settled(&a.handle, 1, &json!({"stale": 1}), 3, Some(settle));
        assert!(
            matches!(stale, Err(RegistryError::Fenced { .. })),
            "{stale:?}"
        );
        let layer_rows: i64 = reg
            .conn
            .query_row("SELECT count(*) FROM layer", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            layer_rows, 0,
            "the layers' record went with the fenced write"
        );
        let failure = reg.record_failure(&a.handle, 1, "provider_error", "no");
        assert!(
            matches!(failure, Err(RegistryError::Fenced { .. })),
            "{failure:?}"
        );
        assert_eq!(
            reg.find_by_handle(a.handle.as_str())
                .unwrap()
                .unwrap()
                .status,
            Status::Pending
        );
        reg.record_result(&a.handle, 2, &json!({"ok": 1}), 3)
            .unwrap();
    }
}
