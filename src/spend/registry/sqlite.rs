//! The SQLite backend of the registry: one file on this machine (see the module docs of
//! [`super`] for its Durability, Concurrency, Compatibility and Retention). It holds the
//! statements of the storage primitives ([`RegistryStore`], [`StoreTx`]); the rules that use
//! them are [`super::machine`]'s.

use super::machine::{CallKey, Claimed, Inserted, RegistryStore, Step, StoreTx};
use super::{
    Approval, InTransaction, NewOperation, Operation, RawRow, RegistryError, Status, now_ms,
    owner_alive,
};
use crate::storage::LayerTx;
use crate::storage::schema::registry::REGISTRY;
use crate::storage::sqlite::{Cached as _, Create, Immediate};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
        let tx =
            Immediate::begin(&self.conn).map_err(sqlite(&path, "reading the installation id"))?;
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
        let key = CallKey {
            platform,
            source_installation,
            harness_call_id,
        };
        find_in(&self.conn, &self.path, &self.installation_id, key)
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
}

/// The row of a call identity, by a statement prepared once per connection: every spend call
/// (and every redelivery) looks its call up first, and preparing the statement each time cost
/// more than running it (`callid bench --only router_replay`).
fn find_in(
    conn: &Connection,
    path: &Path,
    installation_id: &str,
    key: CallKey<'_>,
) -> Result<Option<Operation>, RegistryError> {
    conn.prepare_cached(&format!(
        "{SELECT} WHERE platform = ?1 AND installation_id = ?2 AND harness_call_id = ?3 \
         AND source_installation = ?4"
    ))
    .and_then(|mut statement| {
        statement
            .query_row(
                params![
                    key.platform,
                    installation_id,
                    key.harness_call_id,
                    key.source_installation
                ],
                row_to_raw,
            )
            .optional()
    })
    .map_err(sqlite(path, "looking up a call"))?
    .map(|raw| raw.into_operation(path))
    .transpose()
}

/// An open `IMMEDIATE` transaction on the registry file (every write takes the write lock
/// first, so two writers never both read "absent").
pub(super) struct SqliteTx<'t> {
    conn: &'t Connection,
    path: &'t Path,
    installation_id: &'t str,
}

impl RegistryStore for SqliteRegistry {
    type Tx<'t> = SqliteTx<'t>;

    fn location(&self) -> PathBuf {
        self.path.clone()
    }

    /// Always one `IMMEDIATE` transaction (a local commit costs no round trip).
    fn transact<R>(
        &mut self,
        doing: &'static str,
        _atomic: bool,
        f: impl FnOnce(&mut SqliteTx<'_>) -> Result<R, RegistryError>,
    ) -> Result<R, RegistryError> {
        let tx = Immediate::begin(&self.conn).map_err(sqlite(&self.path, doing))?;
        let mut open = SqliteTx {
            conn: &tx,
            path: &self.path,
            installation_id: &self.installation_id,
        };
        // An error drops `tx`: rolled back.
        let done = f(&mut open)?;
        tx.commit().map_err(sqlite(&self.path, doing))?;
        Ok(done)
    }

    fn find_by_handle(&mut self, handle: &str) -> Result<Option<Operation>, RegistryError> {
        SqliteRegistry::find_by_handle(self, handle)
    }

    /// Reads the row and decides in one `IMMEDIATE` transaction: the owner's process is on this
    /// machine, so whether it is gone is certain ([`owner_alive`]), whatever the dispatch mark.
    fn claim(
        &mut self,
        handle: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Claimed, RegistryError> {
        let doing = "taking a dispatch lease";
        let path = self.path.clone();
        let tx = Immediate::begin(&self.conn).map_err(sqlite(&path, doing))?;
        type Row = (String, Option<String>, Option<i64>, i64, Option<i64>, i64);
        let (status, lease_owner, expires, at_most_once, dispatched, generation): Row = tx
            .row(
                "SELECT status, lease_owner, lease_expires_ms, at_most_once, dispatch_generation,
                     lease_generation FROM operations WHERE handle = ?1",
                [handle],
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
            .map_err(sqlite(&path, doing))?;
        let refused = |status: String| Claimed {
            status,
            granted: None,
            orphaned_ms: None,
        };
        if status != Status::Pending.name() {
            return Ok(refused(status));
        }
        let now = now_ms();
        if let Some(other) = lease_owner.filter(|o| o != owner) {
            let expired = expires.is_none_or(|e| e <= now);
            if !expired && owner_alive(&other) {
                return Ok(refused(status));
            }
        }
        if at_most_once != 0 && dispatched.is_some() {
            // Dispatched before and never settled: its outcome is unknown, so it is never sent
            // again; a person resolves it.
            tx.exec(
                "UPDATE operations SET status = 'in_doubt', error_code = 'outcome_in_doubt',
                     error_message = ?2, lease_owner = NULL, lease_expires_ms = NULL,
                     updated_ms = ?3
                 WHERE handle = ?1",
                params![handle, super::TAKEN_OVER_IN_DOUBT, now],
            )
            .map_err(sqlite(&path, "marking an operation in doubt"))?;
            tx.commit()
                .map_err(sqlite(&path, "marking an operation in doubt"))?;
            return Ok(refused(Status::InDoubt.name().to_string()));
        }
        let generation = generation + 1;
        tx.exec(
            "UPDATE operations SET lease_owner = ?2, lease_expires_ms = ?3, lease_generation = ?4,
                 dispatch_generation = CASE WHEN at_most_once = 1 THEN ?4 ELSE NULL END,
                 dispatched_ms = CASE WHEN at_most_once = 1 THEN ?5 ELSE NULL END
             WHERE handle = ?1",
            params![handle, owner, now + ttl.as_millis() as i64, generation, now],
        )
        .map_err(sqlite(&path, doing))?;
        tx.commit().map_err(sqlite(&path, doing))?;
        Ok(Claimed {
            status,
            granted: Some(generation),
            orphaned_ms: None,
        })
    }
}

impl StoreTx for SqliteTx<'_> {
    fn location(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn find(&mut self, key: CallKey<'_>) -> Result<Option<Operation>, RegistryError> {
        find_in(self.conn, self.path, self.installation_id, key)
    }

    fn lock_budget(&mut self) -> Result<(), RegistryError> {
        Ok(())
    }

    fn committed_cents(&mut self) -> Result<i64, RegistryError> {
        self.conn
            .row(COMMITTED, [self.installation_id], |r| r.get(0))
            .map_err(sqlite(self.path, "summing the budget"))
    }

    fn insert(
        &mut self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
    ) -> Result<Inserted, RegistryError> {
        let now = now_ms();
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
        self.conn
            .exec(
                r"INSERT INTO operations (platform, installation_id, harness_call_id, handle,
                     operation_key, tool, request_hash, arguments, amount_cents, status, approval,
                     created_ms, updated_ms, source_installation, lease_owner, lease_expires_ms,
                     at_most_once, lease_generation, dispatch_generation, dispatched_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13, ?14, ?15,
                     ?16, ?17, ?18, CASE WHEN ?18 IS NULL THEN NULL ELSE ?12 END)
                 ON CONFLICT (platform, installation_id, source_installation, harness_call_id)
                 DO NOTHING",
                params![
                    new.platform,
                    self.installation_id,
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
            // The conflicting row is read by a fresh statement of the machine (no round trip to
            // save here).
            .map(|n| match n {
                1 => Inserted::Created,
                _ => Inserted::Recorded(None),
            })
            .map_err(sqlite(self.path, "recording a new operation"))
    }

    fn apply(&mut self, step: &Step<'_>) -> Result<bool, RegistryError> {
        let now = now_ms();
        let n = match *step {
            Step::Renew {
                handle,
                generation,
                ttl,
            } => self.conn.exec(
                r"UPDATE operations SET lease_expires_ms = ?3
                 WHERE handle = ?1 AND lease_generation = ?2 AND status = 'pending'
                   AND lease_owner IS NOT NULL",
                params![handle, generation, now + ttl.as_millis() as i64],
            ),
            Step::Release { handle, generation } => self.conn.exec(
                r"UPDATE operations SET lease_owner = NULL, lease_expires_ms = NULL,
                     dispatch_generation = NULL, dispatched_ms = NULL
                 WHERE handle = ?1 AND lease_generation = ?2 AND status = 'pending'",
                params![handle, generation],
            ),
            Step::MarkInDoubt {
                handle,
                generation,
                reason,
            } => self.conn.exec(
                r"UPDATE operations SET status = 'in_doubt', error_code = 'outcome_in_doubt',
                     error_message = ?3, lease_owner = NULL, lease_expires_ms = NULL,
                     updated_ms = ?4
                 WHERE handle = ?1 AND status = 'pending' AND lease_generation = ?2",
                params![handle, generation, reason, now],
            ),
            Step::RecordResult {
                handle,
                generation,
                result,
                charged_cents,
            } => self.conn.exec(
                RECORD_RESULT,
                params![handle, result, now, charged_cents, generation],
            ),
            Step::RecordFailure {
                handle,
                generation,
                code,
                message,
            } => self.conn.exec(
                RECORD_FAILURE,
                params![handle, code, message, now, generation],
            ),
            Step::Approve { handle } => self.conn.exec(
                r"UPDATE operations SET status = 'pending', approval = 'approved', updated_ms = ?3
                 WHERE handle = ?1 AND installation_id = ?2 AND status = 'awaiting_approval'",
                params![handle, self.installation_id, now],
            ),
            Step::Deny { handle, message } => self.conn.exec(
                r"UPDATE operations SET status = 'denied', approval = 'denied',
                     error_code = 'operation_denied', error_message = ?3, updated_ms = ?4
                 WHERE handle = ?1 AND installation_id = ?2 AND status = 'awaiting_approval'",
                params![handle, self.installation_id, message, now],
            ),
            Step::ResolveCharged { handle, result, by } => self.conn.exec(
                r"UPDATE operations SET status = 'completed', result = ?3,
                     charged_cents = amount_cents, error_code = NULL, error_message = NULL,
                     resolution = 'charged', resolved_by = ?4, resolved_ms = ?5, updated_ms = ?5
                 WHERE handle = ?1 AND installation_id = ?2 AND status = 'in_doubt'",
                params![handle, self.installation_id, result, by, now],
            ),
            Step::ResolveNotCharged { handle, by } => self.conn.exec(
                r"UPDATE operations SET status = 'pending', dispatch_generation = NULL,
                     dispatched_ms = NULL, error_code = NULL, error_message = NULL,
                     resolution = 'not_charged', resolved_by = ?3, resolved_ms = ?4,
                     updated_ms = ?4
                 WHERE handle = ?1 AND installation_id = ?2 AND status = 'in_doubt'",
                params![handle, self.installation_id, by, now],
            ),
        };
        n.map(|n| n == 1).map_err(sqlite(self.path, step.doing()))
    }

    fn layer<T>(
        &mut self,
        step: InTransaction<T, String>,
    ) -> Result<Result<T, String>, RegistryError> {
        Ok(step(LayerTx::Sqlite(self.conn)))
    }

    fn savepoint(&mut self, name: &'static str) -> Result<(), RegistryError> {
        self.conn
            .exec(&format!("SAVEPOINT {name}"), [])
            .map(drop)
            .map_err(sqlite(self.path, "opening a savepoint"))
    }

    fn end_savepoint(&mut self, name: &'static str, keep: bool) -> Result<(), RegistryError> {
        let rollback = if keep {
            Ok(0)
        } else {
            self.conn.exec(&format!("ROLLBACK TO {name}"), [])
        };
        rollback
            .and_then(|_| self.conn.exec(&format!("RELEASE {name}"), []))
            .map(drop)
            .map_err(sqlite(self.path, "closing a savepoint"))
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
        WHERE installation_id = ?1 AND ",
    super::open_statuses!("status"),
    "), 0)"
);

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

/// The state machine's operations on a file, for the unit tests below (the router goes through
/// [`super::Registry`]).
#[cfg(test)]
impl SqliteRegistry {
    fn insert_or_get(&mut self, new: NewOperation) -> Result<(Operation, bool), RegistryError> {
        match self.insert_within_budget(new, None)? {
            super::Insert::Stored(op, created) => Ok((*op, created)),
            super::Insert::OverBudget { .. } => unreachable!("no budget was given"),
        }
    }

    fn insert_within_budget(
        &mut self,
        new: NewOperation,
        budget_cents: Option<u64>,
    ) -> Result<super::Insert, RegistryError> {
        self.transact("recording a new operation", true, |tx| {
            super::machine::insert_in::<_, ()>(tx, &new, budget_cents, None, None)
        })
        .map(|(insert, _, _)| insert)
    }

    fn claim_lease(
        &mut self,
        handle: &crate::keys::PublicHandle,
        owner: &str,
        ttl: Duration,
    ) -> Result<super::Lease, RegistryError> {
        super::machine::claim(self, handle, owner, ttl)
    }

    fn renew_lease(
        &mut self,
        handle: &crate::keys::PublicHandle,
        generation: i64,
        ttl: Duration,
    ) -> Result<bool, RegistryError> {
        let step = Step::Renew {
            handle: handle.as_str(),
            generation,
            ttl,
        };
        super::machine::apply(self, step)
    }

    fn mark_in_doubt(
        &mut self,
        handle: &crate::keys::PublicHandle,
        generation: i64,
        reason: &str,
    ) -> Result<bool, RegistryError> {
        let step = Step::MarkInDoubt {
            handle: handle.as_str(),
            generation,
            reason,
        };
        super::machine::apply(self, step)
    }

    fn record_result(
        &mut self,
        handle: &crate::keys::PublicHandle,
        generation: i64,
        result: &serde_json::Value,
        charged_cents: u64,
    ) -> Result<(), RegistryError> {
        self.record_settled(handle, generation, result, charged_cents, None)
    }

    fn record_settled(
        &mut self,
        handle: &crate::keys::PublicHandle,
        generation: i64,
        result: &serde_json::Value,
        charged_cents: u64,
        settle: Option<InTransaction<(), String>>,
    ) -> Result<(), RegistryError> {
        self.transact("recording a result", true, |tx| {
            super::machine::record_in(tx, handle, generation, result, charged_cents, settle)
        })
    }

    fn record_failure(
        &mut self,
        handle: &crate::keys::PublicHandle,
        generation: i64,
        code: &str,
        message: &str,
    ) -> Result<(), RegistryError> {
        super::machine::record_failure(self, handle, generation, code, message)
    }

    fn decide(
        &mut self,
        handle: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<Operation, RegistryError> {
        super::machine::decide(self, handle, approve, reason)
    }

    fn write_batch<T>(&mut self, writes: Vec<super::Write<T>>) {
        super::machine::write_batch(self, writes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Approval, Insert, Lease, process_owner, process_start, retire_owner};
    use super::*;
    use crate::keys::OperationKey;
    use crate::keys::PublicHandle;
    use crate::keys::{DEFAULT_HANDLE_PREFIX, DEFAULT_KEY_PREFIX};
    use crate::storage::schema::registry::{APPLICATION_ID, MIGRATIONS};
    use serde_json::Value;
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
