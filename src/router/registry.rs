//! The router's durable registry: one row per (platform, installation, source installation,
//! harness call id).
//!
//! [`Registry`] is a SQLite file (rusqlite, bundled SQLite) that maps each trusted call identity
//! to its private operation key, its public handle, the hash of what it asked for, and, once the
//! backend answered, its recorded result. The router consults it before any money moves: a call
//! it has seen is answered from here, never dispatched twice.
//!
//! A row's key is the platform, this router's installation id, the *source installation* (the
//! envelope's `installation_id`, empty for the built-in sources) and the harness call id: two
//! installations of one platform that send the same invocation id are two operations, so neither
//! can replay, continue or block the other's.
//!
//! ## Durability
//! - WAL journal with `synchronous=FULL`: a committed row survives a power cut, not only a crash.
//! - A new operation's row (keys, request hash, state) is committed before anything is dispatched
//!   ([`Registry::insert_or_get`]); the result is recorded after the backend answered and before
//!   the reply is sent ([`Registry::record_result`]). A crash between the two leaves a `pending`
//!   row, and redelivery continues that operation under the same private key, which every layer
//!   behind the router treats as the same operation.
//! - The file is opened, identified, protected and migrated by [`crate::store`], like every state
//!   file of callid: it and its `-wal`/`-shm` are 0600 (the rows hold private operation keys), a
//!   file open to other users is refused with the `chmod` to run, and `--registry` is a plain
//!   path (never a SQLite URI such as `file:x?mode=memory`).
//!
//! ## Concurrency
//! - Every write runs in an `IMMEDIATE` transaction (the write lock is taken first, so two writers
//!   never both read "absent" and both insert). Readers and writers from other processes wait up
//!   to [`BUSY_TIMEOUT`] for a lock before the call fails closed.
//! - Dispatch is guarded by a lease on the row ([`Registry::claim_lease`]): a process that is about
//!   to call the backend writes its owner id and an expiry; another process that finds a live
//!   lease answers `operation_in_progress` (safe to retry). A lease whose owner is gone or whose
//!   expiry passed is taken over at once. The owner id is unique per router instance and process
//!   life ([`process_owner`]: PID, process start time, random instance id), so a crashed
//!   predecessor's lease is recognized as gone even when the new router has its PID (PID 1 in a
//!   container) or its PID was reused. Within one process the router runs one flight
//!   per call identity (see `spend.rs`), so the lease only arbitrates between processes.
//!
//! ## Compatibility
//! - The file is identified by `PRAGMA application_id` ([`APPLICATION_ID`]) and versioned by
//!   `PRAGMA user_version`. Migrations ([`MIGRATIONS`]) are append-only and run in one exclusive
//!   transaction; a registry written by an older callid is upgraded in place.
//! - A file with another application id, a non-empty file without one, a file that is not a
//!   SQLite database, or a registry newer than this build knows is refused and never modified:
//!   it is inspected through a read-only connection, so not even its `-wal` is checkpointed.
//! - Schema 2 adds the source installation to the key and the charged amount. Rows recorded by
//!   schema 1 keep an empty source installation: an envelope call recorded before the upgrade is
//!   found again only when it is redelivered without an `installation_id`.
//!
//! ## Retention
//! Rows are never deleted by the router: a row is what lets a redelivery, even days later, get
//! the original result instead of a second charge. Deleting the registry loses that recovery
//! (and the installation id, so a new registry is a new installation). The operator may archive
//! or delete old rows by hand once no client can redeliver them.

use crate::canonical::RequestHash;
use crate::keys::{OperationKey, PublicHandle};
use crate::store::{self, Create, StoreError, StoreSpec};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `PRAGMA application_id` of a callid registry (`"cLiD"` in ASCII).
pub const APPLICATION_ID: i32 = 0x634c_6944;
pub use crate::store::BUSY_TIMEOUT;

/// What a registry file is, for [`crate::store`].
static SPEC: StoreSpec = StoreSpec {
    kind: "registry",
    application_id: APPLICATION_ID,
    migrations: MIGRATIONS,
};

/// The schema, one migration per `user_version` step. Append only: never edit a shipped entry.
pub const MIGRATIONS: &[&str] = &[
    // 1: the installation id and the operations.
    "CREATE TABLE settings (
         name  TEXT PRIMARY KEY NOT NULL,
         value TEXT NOT NULL
     ) STRICT;
     CREATE TABLE operations (
         platform         TEXT NOT NULL,
         installation_id  TEXT NOT NULL,
         harness_call_id  TEXT NOT NULL,
         handle           TEXT NOT NULL UNIQUE,
         operation_key    TEXT NOT NULL UNIQUE,
         tool             TEXT NOT NULL,
         request_hash     TEXT NOT NULL,
         arguments        TEXT NOT NULL,
         amount_cents     INTEGER NOT NULL,
         status           TEXT NOT NULL,
         approval         TEXT NOT NULL,
         result           TEXT,
         error_code       TEXT,
         error_message    TEXT,
         lease_owner      TEXT,
         lease_expires_ms INTEGER,
         created_ms       INTEGER NOT NULL,
         updated_ms       INTEGER NOT NULL,
         PRIMARY KEY (platform, installation_id, harness_call_id)
     ) STRICT;",
    // 2: the envelope's installation id joins the key (tenants kept apart); the amount the
    // provider actually charged is recorded beside the quote.
    "CREATE TABLE operations_v2 (
         platform            TEXT NOT NULL,
         installation_id     TEXT NOT NULL,
         source_installation TEXT NOT NULL,
         harness_call_id     TEXT NOT NULL,
         handle              TEXT NOT NULL UNIQUE,
         operation_key       TEXT NOT NULL UNIQUE,
         tool                TEXT NOT NULL,
         request_hash        TEXT NOT NULL,
         arguments           TEXT NOT NULL,
         amount_cents        INTEGER NOT NULL,
         status              TEXT NOT NULL,
         approval            TEXT NOT NULL,
         result              TEXT,
         error_code          TEXT,
         error_message       TEXT,
         lease_owner         TEXT,
         lease_expires_ms    INTEGER,
         created_ms          INTEGER NOT NULL,
         updated_ms          INTEGER NOT NULL,
         charged_cents       INTEGER,
         PRIMARY KEY (platform, installation_id, source_installation, harness_call_id)
     ) STRICT;
     INSERT INTO operations_v2 (platform, installation_id, source_installation, harness_call_id,
         handle, operation_key, tool, request_hash, arguments, amount_cents, status, approval,
         result, error_code, error_message, lease_owner, lease_expires_ms, created_ms, updated_ms)
     SELECT platform, installation_id, '', harness_call_id, handle, operation_key, tool,
         request_hash, arguments, amount_cents, status, approval, result, error_code,
         error_message, lease_owner, lease_expires_ms, created_ms, updated_ms FROM operations;
     DROP TABLE operations;
     ALTER TABLE operations_v2 RENAME TO operations;",
];

/// Why the registry cannot be used. Every spend fails closed with `registry_unavailable` on any
/// of these, naming the file and the cause.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file cannot be created, opened, identified or migrated (see [`crate::store`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// SQLite refused an operation (not a database, locked too long, disk full, read-only...).
    #[error("registry `{path}` failed while {doing}: {source}")]
    Sqlite {
        /// The registry file.
        path: PathBuf,
        /// What the router was doing, as a fragment.
        doing: &'static str,
        /// The cause.
        #[source]
        source: rusqlite::Error,
    },
    /// The operator named a file that does not exist.
    #[error("registry `{path}` does not exist; pass the `--registry` the router runs with")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// No operation has this handle.
    #[error("no operation has handle `{handle}` in registry `{path}`")]
    UnknownHandle {
        /// The handle.
        handle: String,
        /// The registry file.
        path: PathBuf,
    },
    /// An approval decision on an operation that is not waiting for one.
    #[error("operation `{handle}` is `{status}`, not waiting for approval; nothing changed")]
    NotAwaitingApproval {
        /// The handle.
        handle: String,
        /// Its current status.
        status: &'static str,
    },
    /// A stored row that this build cannot read back.
    #[error("registry `{path}` holds an unreadable row: {detail}")]
    Corrupt {
        /// The registry file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

/// The state of an operation, as shown to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Recorded; not finished (never dispatched, in flight, or interrupted).
    Pending,
    /// Waiting for a person's decision; nothing dispatched.
    AwaitingApproval,
    /// Finished with a recorded result.
    Completed,
    /// A person denied it; nothing dispatched.
    Denied,
    /// Finished with a recorded, final error.
    Failed,
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::AwaitingApproval,
        Status::Completed,
        Status::Denied,
        Status::Failed,
    ];

    /// The name on the wire and in the file.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::AwaitingApproval => "awaiting_approval",
            Status::Completed => "completed",
            Status::Denied => "denied",
            Status::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == text)
    }
}

/// Whether a person had to decide, and what they decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// The policy did not ask for a person.
    NotRequired,
    /// Waiting for a person.
    Required,
    /// A person approved.
    Approved,
    /// A person denied.
    Denied,
}

impl Approval {
    /// The name in the file and in status answers.
    pub fn name(self) -> &'static str {
        match self {
            Approval::NotRequired => "not_required",
            Approval::Required => "required",
            Approval::Approved => "approved",
            Approval::Denied => "denied",
        }
    }

    fn parse(text: &str) -> Option<Approval> {
        [
            Approval::NotRequired,
            Approval::Required,
            Approval::Approved,
            Approval::Denied,
        ]
        .into_iter()
        .find(|a| a.name() == text)
    }
}

/// One operation as stored.
#[derive(Debug, Clone)]
pub struct Operation {
    /// Platform of the identity (`codex`, `claude-code`, an envelope's platform).
    pub platform: String,
    /// The envelope's installation id (empty for the built-in sources).
    pub source_installation: String,
    /// The harness's call id.
    pub harness_call_id: String,
    /// The public handle given to the agent.
    pub handle: PublicHandle,
    /// The private key the backend layers use; never shown.
    pub key: OperationKey,
    /// The tool called.
    pub tool: String,
    /// Hash of the tool name and arguments.
    pub request_hash: RequestHash,
    /// The model-written arguments, as received (to resume the original request).
    pub arguments: Value,
    /// The quoted price.
    pub amount_cents: u64,
    /// Current state.
    pub status: Status,
    /// Approval state.
    pub approval: Approval,
    /// The recorded `structuredContent` of a completed operation.
    pub result: Option<Value>,
    /// The recorded final error (code, message) of a failed or denied operation.
    pub error: Option<(String, String)>,
    /// What the provider's receipt says it charged, once completed.
    pub charged_cents: Option<u64>,
}

impl Operation {
    /// The charge above the quote, when the provider charged more than was authorized.
    pub fn overcharge(&self) -> Option<(u64, u64)> {
        self.charged_cents
            .filter(|c| *c > self.amount_cents)
            .map(|c| (self.amount_cents, c))
    }
}

/// A new operation to record.
#[derive(Debug)]
pub struct NewOperation {
    /// Platform of the identity.
    pub platform: String,
    /// The envelope's installation id (empty for the built-in sources).
    pub source_installation: String,
    /// The harness's call id.
    pub harness_call_id: String,
    /// A fresh public handle.
    pub handle: PublicHandle,
    /// A fresh (or claimed) private key.
    pub key: OperationKey,
    /// Tool name.
    pub tool: String,
    /// Request hash.
    pub request_hash: RequestHash,
    /// The arguments as received.
    pub arguments: Value,
    /// Quoted price.
    pub amount_cents: u64,
    /// Whether a person must approve first.
    pub needs_approval: bool,
}

/// What [`Registry::insert_within_budget`] did.
#[derive(Debug)]
pub enum Insert {
    /// The row now stored for the call, and whether this call created it.
    Stored(Box<Operation>, bool),
    /// Nothing was recorded: the new operation would exceed the budget.
    OverBudget {
        /// Cents already committed by this installation's operations.
        committed_cents: u64,
    },
}

/// What [`Registry::claim_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This process may dispatch.
    Granted,
    /// Another live process is dispatching this operation.
    HeldElsewhere,
    /// The row is no longer pending (finished meanwhile, or waiting for a person).
    NotPending(Status),
}

/// An open registry.
pub struct Registry {
    conn: Connection,
    path: PathBuf,
    installation_id: String,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("path", &self.path)
            .field("installation_id", &self.installation_id)
            .finish()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The default registry file: `$XDG_DATA_HOME/callid/registry.sqlite3`, else
/// `~/.local/share/callid/registry.sqlite3`.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/share"))
        })?;
    Some(base.join("callid").join("registry.sqlite3"))
}

impl Registry {
    /// Opens the registry at `path`, creating it (mode 0600, and its directory) if absent, and
    /// migrating it to the newest schema. A foreign, newer, corrupt or world-readable file is
    /// refused untouched (see [`crate::store`]).
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let conn = store::open_connection(path, &SPEC, Create::IfMissing)?;
        Self::init(conn, path.to_path_buf())
    }

    /// Opens an existing registry (operator commands): never creates one.
    pub fn open_existing(path: &Path) -> Result<Registry, RegistryError> {
        if !path.exists() {
            return Err(RegistryError::Missing {
                path: path.to_path_buf(),
            });
        }
        let conn = store::open_connection(path, &SPEC, Create::Never)?;
        Self::init(conn, path.to_path_buf())
    }

    /// Opens an in-memory registry (unit tests).
    pub fn open_in_memory() -> Result<Registry, RegistryError> {
        let conn = store::open_in_memory(&SPEC)?;
        Self::init(conn, PathBuf::from(":memory:"))
    }

    fn init(conn: Connection, path: PathBuf) -> Result<Registry, RegistryError> {
        let mut registry = Registry {
            conn,
            path,
            installation_id: String::new(),
        };
        registry.installation_id = registry.ensure_installation_id()?;
        Ok(registry)
    }

    /// Applies every migration above the file's `user_version` in one exclusive transaction.
    /// Running it again is a no-op.
    pub fn migrate(&mut self) -> Result<(), RegistryError> {
        store::migrate(&mut self.conn, &SPEC).map_err(sqlite(&self.path, "migrating its schema"))
    }

    fn ensure_installation_id(&mut self) -> Result<String, RegistryError> {
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

    /// The registry file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the open file.
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
    pub fn insert_or_get(&mut self, new: NewOperation) -> Result<(Operation, bool), RegistryError> {
        match self.insert_within_budget(new, None)? {
            Insert::Stored(op, created) => Ok((*op, created)),
            Insert::OverBudget { .. } => unreachable!("no budget was given"),
        }
    }

    /// [`Registry::insert_or_get`], refusing a new operation whose amount would take the cents
    /// committed by this installation's operations (completed ones by what they charged, pending
    /// and awaiting ones by their amount) above `budget_cents`. The sum and the insert run in
    /// one IMMEDIATE transaction, so concurrent operations, from any process sharing the file,
    /// never overspend together.
    pub fn insert_within_budget(
        &mut self,
        new: NewOperation,
        budget_cents: Option<u64>,
    ) -> Result<Insert, RegistryError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite(&path, "recording a new operation"))?;
        let existing = tx
            .query_row(
                &format!(
                    "{SELECT} WHERE platform = ?1 AND installation_id = ?2 AND harness_call_id = ?3 \
                     AND source_installation = ?4"
                ),
                params![
                    new.platform,
                    self.installation_id,
                    new.harness_call_id,
                    new.source_installation
                ],
                row_to_raw,
            )
            .optional()
            .map_err(sqlite(&path, "looking up a call"))?;
        if let Some(raw) = existing {
            drop(tx);
            return Ok(Insert::Stored(Box::new(raw.into_operation(&path)?), false));
        }
        if let Some(budget) = budget_cents {
            let committed: i64 = tx
                .query_row(
                    "SELECT COALESCE(SUM(CASE
                         WHEN status = 'completed' THEN COALESCE(charged_cents, amount_cents)
                         WHEN status IN ('pending', 'awaiting_approval') THEN amount_cents
                         ELSE 0 END), 0)
                     FROM operations WHERE installation_id = ?1",
                    [&self.installation_id],
                    |r| r.get(0),
                )
                .map_err(sqlite(&path, "summing the budget"))?;
            let committed = committed.max(0) as u64;
            if committed.saturating_add(new.amount_cents) > budget {
                drop(tx);
                return Ok(Insert::OverBudget {
                    committed_cents: committed,
                });
            }
        }
        let now = now_ms();
        let (status, approval) = if new.needs_approval {
            (Status::AwaitingApproval, Approval::Required)
        } else {
            (Status::Pending, Approval::NotRequired)
        };
        tx.execute(
            "INSERT INTO operations (platform, installation_id, harness_call_id, handle,
                 operation_key, tool, request_hash, arguments, amount_cents, status, approval,
                 created_ms, updated_ms, source_installation)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13)",
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
            ],
        )
        .map_err(sqlite(&path, "recording a new operation"))?;
        tx.commit()
            .map_err(sqlite(&path, "committing a new operation"))?;
        Ok(Insert::Stored(
            Box::new(Operation {
                platform: new.platform,
                source_installation: new.source_installation,
                harness_call_id: new.harness_call_id,
                handle: new.handle,
                key: new.key,
                tool: new.tool,
                request_hash: new.request_hash,
                arguments: new.arguments,
                amount_cents: new.amount_cents,
                status,
                approval,
                result: None,
                error: None,
                charged_cents: None,
            }),
            true,
        ))
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
        let (status, lease_owner, expires): (String, Option<String>, Option<i64>) = tx
            .query_row(
                "SELECT status, lease_owner, lease_expires_ms FROM operations WHERE handle = ?1",
                [handle.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
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
        tx.execute(
            "UPDATE operations SET lease_owner = ?2, lease_expires_ms = ?3 WHERE handle = ?1",
            params![handle.as_str(), owner, now + ttl.as_millis() as i64],
        )
        .map_err(sqlite(&path, "taking a dispatch lease"))?;
        tx.commit()
            .map_err(sqlite(&path, "taking a dispatch lease"))?;
        Ok(Lease::Granted)
    }

    /// Gives up a dispatch lease without recording a result (a retryable failure).
    pub fn release_lease(
        &mut self,
        handle: &PublicHandle,
        owner: &str,
    ) -> Result<(), RegistryError> {
        self.write(
            "releasing a dispatch lease",
            "UPDATE operations SET lease_owner = NULL, lease_expires_ms = NULL
             WHERE handle = ?1 AND lease_owner = ?2",
            params![handle.as_str(), owner],
        )
        .map(|_| ())
    }

    /// Records the result of a completed operation, with what the provider charged, and drops
    /// its lease.
    pub fn record_result(
        &mut self,
        handle: &PublicHandle,
        result: &Value,
        charged_cents: u64,
    ) -> Result<(), RegistryError> {
        self.write(
            "recording a result",
            "UPDATE operations SET status = 'completed', result = ?2, lease_owner = NULL,
                 lease_expires_ms = NULL, updated_ms = ?3, charged_cents = ?4
             WHERE handle = ?1 AND status = 'pending'",
            params![
                handle.as_str(),
                result.to_string(),
                now_ms(),
                charged_cents as i64
            ],
        )
        .map(|_| ())
    }

    /// Records a final error of an operation (it will be answered again on redelivery).
    pub fn record_failure(
        &mut self,
        handle: &PublicHandle,
        code: &str,
        message: &str,
    ) -> Result<(), RegistryError> {
        self.write(
            "recording a failure",
            "UPDATE operations SET status = 'failed', error_code = ?2, error_message = ?3,
                 lease_owner = NULL, lease_expires_ms = NULL, updated_ms = ?4
             WHERE handle = ?1 AND status = 'pending'",
            params![handle.as_str(), code, message, now_ms()],
        )
        .map(|_| ())
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

    /// Every operation, oldest first (operator listing).
    pub fn all(&self) -> Result<Vec<Operation>, RegistryError> {
        let mut stmt = self
            .conn
            .prepare(&format!("{SELECT} ORDER BY created_ms, handle"))
            .map_err(sqlite(&self.path, "listing operations"))?;
        let raws = stmt
            .query_map([], row_to_raw)
            .map_err(sqlite(&self.path, "listing operations"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sqlite(&self.path, "listing operations"))?;
        raws.into_iter()
            .map(|r| r.into_operation(&self.path))
            .collect()
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
        let n = tx.execute(sql, params).map_err(sqlite(&path, doing))?;
        tx.commit().map_err(sqlite(&path, doing))?;
        Ok(n)
    }
}

const SELECT: &str = "SELECT platform, harness_call_id, handle, operation_key, tool, request_hash,
    arguments, amount_cents, status, approval, result, error_code, error_message,
    source_installation, charged_cents FROM operations";

struct RawRow {
    platform: String,
    harness_call_id: String,
    handle: String,
    key: String,
    tool: String,
    request_hash: String,
    arguments: String,
    amount_cents: i64,
    status: String,
    approval: String,
    result: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
    source_installation: String,
    charged_cents: Option<i64>,
}

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
        charged_cents: r.get(14)?,
    })
}

impl RawRow {
    fn into_operation(self, path: &Path) -> Result<Operation, RegistryError> {
        let corrupt = |detail: String| RegistryError::Corrupt {
            path: path.to_path_buf(),
            detail,
        };
        let json = |text: &str, what: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| corrupt(format!("{what} of `{}` is not JSON: {e}", self.handle)))
        };
        Ok(Operation {
            arguments: json(&self.arguments, "arguments")?,
            result: self
                .result
                .as_deref()
                .map(|r| json(r, "result"))
                .transpose()?,
            status: Status::parse(&self.status)
                .ok_or_else(|| corrupt(format!("unknown status `{}`", self.status)))?,
            approval: Approval::parse(&self.approval)
                .ok_or_else(|| corrupt(format!("unknown approval `{}`", self.approval)))?,
            error: self
                .error_code
                .map(|c| (c, self.error_message.unwrap_or_default())),
            platform: self.platform,
            source_installation: self.source_installation,
            harness_call_id: self.harness_call_id,
            handle: PublicHandle::from_stored(self.handle),
            key: OperationKey::from_stored(self.key),
            tool: self.tool,
            request_hash: RequestHash::from_stored(self.request_hash),
            amount_cents: self.amount_cents.max(0) as u64,
            charged_cents: self.charged_cents.map(|c| c.max(0) as u64),
        })
    }
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

/// The lease owners (router instances) alive in this process.
fn live_owners() -> &'static std::sync::Mutex<std::collections::HashSet<String>> {
    static LIVE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// A new lease owner id, unique per router instance and process life:
/// `<pid>:<process start time>:<random instance id>`. It counts as alive in this process until
/// [`retire_owner`].
pub fn process_owner() -> String {
    let pid = std::process::id();
    let start = process_start(pid).unwrap_or_default();
    let owner = format!("{pid}:{start}:{}", uuid::Uuid::new_v4());
    live_owners()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(owner.clone());
    owner
}

/// Marks an owner id from [`process_owner`] as gone: its leases are taken over at once.
pub fn retire_owner(owner: &str) {
    live_owners()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(owner);
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`, in clock ticks since boot),
/// which tells a reused PID from the process that held it.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the router instance named by a lease owner id may still be running.
///
/// - Same PID as this process: alive only if it is one of this process's own live instances
///   (a crashed predecessor that had the same PID, as PID 1 in a container, is gone).
/// - Another PID: gone if no such process exists, or if it started at another time than the
///   owner recorded (the PID was reused). Where liveness cannot be told (no `/proc`), the owner
///   is assumed alive and only the lease's expiry frees it.
///
/// Processes sharing a registry must share a PID namespace (one host or one container).
fn owner_alive(owner: &str) -> bool {
    let mut parts = owner.split(':');
    let Some(pid) = parts.next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    if pid == std::process::id() {
        return live_owners()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(owner);
    }
    let proc_root = Path::new("/proc");
    if !proc_root.join("self").exists() {
        return true;
    }
    if !proc_root.join(pid.to_string()).exists() {
        return false;
    }
    // `<pid>:<start>:<instance>`; an owner id without a start time (older callid) is trusted.
    let recorded = match (parts.next(), parts.next()) {
        (Some(start), Some(_)) => start.parse::<u64>().ok(),
        _ => None,
    };
    match (recorded, process_start(pid)) {
        (Some(recorded), Some(now)) => recorded == now,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{DEFAULT_HANDLE_PREFIX, DEFAULT_KEY_PREFIX};
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
        }
    }

    #[test]
    fn migrate_twice_is_a_no_op() {
        let mut reg = Registry::open_in_memory().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let id = reg.installation_id().to_string();
        reg.migrate().unwrap();
        reg.migrate().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        assert_eq!(reg.ensure_installation_id().unwrap(), id);
    }

    #[test]
    fn insert_is_once_per_identity_and_lease_is_exclusive() {
        let mut reg = Registry::open_in_memory().unwrap();
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
            Lease::Granted
        );
        // Another live instance of this process is refused.
        assert_eq!(
            reg.claim_lease(&a.handle, &other, Duration::from_secs(60))
                .unwrap(),
            Lease::HeldElsewhere
        );
        reg.record_result(&a.handle, &json!({"ok": 1}), 3).unwrap();
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

    #[test]
    fn dead_owner_lease_is_taken_over() {
        let mut reg = Registry::open_in_memory().unwrap();
        let (a, _) = reg.insert_or_get(new_op("c2")).unwrap();
        // pid 0x7fffffff is never a live process.
        let dead = "2147483647:gone";
        assert_eq!(
            reg.claim_lease(&a.handle, dead, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted
        );
        assert_eq!(
            reg.claim_lease(&a.handle, &process_owner(), Duration::from_secs(60))
                .unwrap(),
            Lease::Granted
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_lease_of_a_gone_instance_is_taken_over_at_once() {
        let mut reg = Registry::open_in_memory().unwrap();
        let (a, _) = reg.insert_or_get(new_op("c4")).unwrap();
        let pid = std::process::id();
        let start = process_start(pid).unwrap();
        // A crashed predecessor with this very PID (PID 1 in a container), another instance id.
        let predecessor = format!("{pid}:{start}:0b5f");
        assert!(!owner_alive(&predecessor));
        assert_eq!(
            reg.claim_lease(&a.handle, &predecessor, Duration::from_secs(600))
                .unwrap(),
            Lease::Granted
        );
        let me = process_owner();
        assert_eq!(
            reg.claim_lease(&a.handle, &me, Duration::from_secs(60))
                .unwrap(),
            Lease::Granted
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
            Lease::Granted
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
                 '{{}}', 3, 'pending', 'not_required', 1, 1);"
        ))
        .unwrap();
        let mut reg = Registry::init(conn, PathBuf::from(":memory:")).unwrap();
        reg.migrate().unwrap();
        assert_eq!(reg.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let old = reg.find("codex", "", "old").unwrap().unwrap();
        assert_eq!(old.handle.as_str(), "h-old");
        assert_eq!(old.charged_cents, None);
    }

    #[test]
    fn approval_decisions() {
        let mut reg = Registry::open_in_memory().unwrap();
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
}
