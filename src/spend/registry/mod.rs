//! The router's durable registry: one row per (platform, installation, source installation,
//! harness call id).
//!
//! Two backends behind one API ([`Registry`], chosen by [`RegistryLocation`]): a SQLite file
//! ([`sqlite`], the embedded default, nothing to install) and a PostgreSQL database shared by
//! router replicas ([`postgres`], `--registry postgres://USER@HOST:PORT/DB`). Each contract
//! section below says what holds for both and where PostgreSQL differs.
//!
//! The rules are written once, in `machine.rs` (the operation state machine: a new row's budget,
//! insert-if-absent, lease and layer stage; the fenced record of a result or failure; group
//! commit; a claim's answer; approval, denial and resolution, with their errors), over a small
//! set of storage primitives each backend implements as statements (find a row, insert if
//! absent, one conditional change of a row, the claim, a savepoint, a layer's step). A backend
//! owns statements only; a test runs one scenario through both and compares the transcripts.
//!
//! The registry maps each trusted call identity
//! to its private operation key, its public handle, the hash of what it asked for, and, once the
//! backend answered, its recorded result. The router consults it before any money moves: a call
//! it has seen is answered from here, never dispatched twice. The consultation is the new row's
//! insert ([`Write::Insert`]): it either records the call or answers the row the call has
//! already (a redelivery), so a new operation makes no look-up of its own.
//!
//! A row's key is the platform, this router's installation id, the *source installation* (the
//! envelope's `installation_id`, empty for the built-in sources) and the harness call id: two
//! installations of one platform that send the same invocation id are two operations, so neither
//! can replay, continue or block the other's.
//!
//! ## Durability
//! - WAL journal with `synchronous=FULL`: a committed row survives a power cut, not only a crash.
//! - A new operation's row (keys, request hash, state) is committed before anything is dispatched
//!   ([`Write::Insert`]); the result is recorded after the backend answered and
//!   before the reply is sent ([`Write::Result`]). A crash between the two leaves a `pending`
//!   row, and redelivery continues that operation under the same private key, which every layer
//!   behind the router treats as the same operation.
//! - The file is opened, identified, protected and migrated by [`crate::storage::sqlite`], like every state
//!   file of callid: it and its `-wal`/`-shm` are 0600 (the rows hold private operation keys), a
//!   file open to other users is refused with the `chmod` to run, and `--registry` is a plain
//!   path (never a SQLite URI such as `file:x?mode=memory`).
//!
//! - PostgreSQL: every session sets `synchronous_commit = on` (a role default of `off` would
//!   acknowledge a row a crash then loses, and a lost row is a second charge) and a server with
//!   `fsync` off is refused. With a standby, only synchronous replication keeps an acknowledged
//!   row across a failover.
//!
//! ## Concurrency
//! - Every write runs in an `IMMEDIATE` transaction (the write lock is taken first, so two writers
//!   never both read "absent" and both insert). Readers and writers from other processes wait up
//!   to [`BUSY_TIMEOUT`](crate::storage::sqlite::BUSY_TIMEOUT) for a lock before the call fails closed.
//!   A router's rows and results go through [`Registry::write_batch`]: the writes queued while
//!   one commits share the next transaction, each in a savepoint of its own (a lone write in
//!   none), and each is answered only once that transaction's commit returned (group commit).
//! - Dispatch is guarded by a lease on the row ([`Registry::claim_lease`]): a process that is about
//!   to call the backend writes its owner id and an expiry (a new row is written with its lease,
//!   one commit: [`Write::Insert`]); another process that finds a live lease answers
//!   `operation_in_progress` (safe to retry). The owner id is unique per router instance and
//!   process life ([`process_owner`]: PID, process start time, random instance id), so a crashed
//!   predecessor's lease is recognized as gone even when the new router has its PID (PID 1 in a
//!   container) or its PID was reused. Within one process the router runs one flight per call
//!   identity (see `spend.rs`), so the lease only arbitrates between processes.
//! - **Takeover rule** (both backends; each backend's claim statement is its only copy of it): a
//!   lease held by another owner is taken over when its expiry passed, or when its owner is
//!   certainly dead, or when its owner looks gone and the row carries no dispatch mark (a lease
//!   written by a callid older than this rule). A lease taken for dispatch writes the row's
//!   dispatch mark (`dispatch_generation`) in the same commit. SQLite sees its owner's process on
//!   this machine, so "gone" is certain. PostgreSQL sees only that the owner's liveness lock is no
//!   longer granted, which also happens to a live replica whose session the server dropped
//!   (database restart, `pg_terminate_backend`, a network cut): a dispatched row of such a replica
//!   is taken over only once its lease expired. Its dispatcher renews the lease every third of its
//!   lifetime while its request is open (after reconnecting, under its new liveness key), and when
//!   it cannot renew it stops waiting for the backend before its lease would expire and answers
//!   `outcome_unknown` (or `in_doubt`, at most once), so no two replicas ever wait on one
//!   operation's dispatch at once.
//!
//! - PostgreSQL, across replicas: a new operation is `INSERT ... ON CONFLICT DO NOTHING`, whose
//!   answer carries the row the call had when it began, or a fresh `SELECT` of the winner's row
//!   when that row committed meanwhile (never check-then-insert); a new row takes its lease in
//!   that insert, an existing one in one conditional `UPDATE`, both on the server's clock
//!   (`clock_timestamp()`, no clock skew between machines); each write is its own transaction, run
//!   by one of a replica's writer threads, each on a connection of its own (a write with nothing
//!   to commit beside it, no budget and no layer step, is one statement in its own implicit
//!   transaction: one round trip); a replica's liveness is
//!   a session-level advisory lock held on its own idle connection (shared by all of the replica's
//!   connections, so a lease taken on one is fenced on all), which the server releases when the
//!   replica's connection drops; every session sets the server's TCP keepalives and
//!   `tcp_user_timeout` (about 8 s), so a cut-off replica's half-open session and lock go within 8
//!   s (measured 7.7 s; without them, not within 30 s). A dispatched row is taken over once its
//!   lease expired (`--lease-ttl`, 10 s by default, counted from the last renewal); a redelivery
//!   that finds its holder's lock gone waits for that expiry rather than answering
//!   `operation_in_progress`. Measured with `--lease-ttl 3` and a 1-2 s dispatch
//!   (`tests/it/replicas_faults.rs`, loaded 2-core machine), redeliveries settle 2.7-4.9 s after
//!   `kill -9`, SIGSTOP or a network cut of the dispatcher; after a database restart or
//!   `pg_terminate_backend` the dispatcher reconnects and renews, so nobody takes over and
//!   redeliveries get its result when it finishes. A result is recorded only by the lease holder
//!   (fencing). It does not work behind a transaction-mode pooler. A budgeted insert (the gateway's
//!   policy budget) runs its lookup, sum and insert in one transaction under an advisory lock on
//!   the installation, so replicas never overspend.
//!
//! ## Compatibility
//! - The file is identified by `PRAGMA application_id` and versioned by `PRAGMA user_version`.
//!   Its schema ([`crate::storage::schema::registry`]) is append-only and migrated in one
//!   exclusive transaction; a registry written by an older callid is upgraded in place.
//! - A file with another application id, a non-empty file without one, a file that is not a
//!   SQLite database, or a registry newer than this build knows is refused and never modified:
//!   it is inspected through a read-only connection, so not even its `-wal` is checkpointed.
//! - Schema 2 adds the source installation to the key and the charged amount. Rows recorded by
//!   schema 1 keep an empty source installation: an envelope call recorded before the upgrade is
//!   found again only when it is redelivered without an `installation_id`.
//! - Schema 4 and 5 (PostgreSQL: 4) add running totals of settled money, kept by triggers and
//!   filled from the rows already there on upgrade: a budget check reads an installation's
//!   total of completed operations (or an account's total of charges) and its open rows, so its
//!   cost does not grow with the history. Rows are never deleted, so a total never needs
//!   rebuilding.
//!
//! - PostgreSQL: table `callid_schema` holds the application marker (`callid-registry`) and the
//!   version; migrations ([`crate::storage::schema::registry::PG_MIGRATIONS`]) are append-only
//!   and run in one transaction under an advisory lock ([`crate::storage::postgres::migrate`]),
//!   so replicas starting at once apply them once. A foreign marker, callid's tables without a
//!   marker, or a newer version are refused and nothing is changed.
//!
//! ## Retention
//! Rows are never deleted by the router: a row is what lets a redelivery, even days later, get
//! the original result instead of a second charge. Deleting the registry loses that recovery
//! (and the installation id, so a new registry is a new installation). The operator may archive
//! or delete old rows by hand once no client can redeliver them.

use crate::canonical::RequestHash;
use crate::clock::now_ms;
use crate::keys::{OperationKey, PublicHandle};
use crate::storage::sqlite::StoreError;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The statuses whose price a budget counts before a charge is recorded (open money), for both
/// backends' budget checks (`concat!`): an SQL list (PostgreSQL's), or, given a column, that
/// column compared with each status, joined by `OR` (SQLite's: its partial index of open rows is
/// declared so, since SQLite evaluates an `IN` list of more than two constants through a
/// temporary table on every insert and update of a row; a query reads through that index only
/// with the same condition).
macro_rules! open_statuses {
    () => {
        "('pending', 'awaiting_approval', 'in_doubt')"
    };
    ($column:literal) => {
        concat!(
            "(",
            $column,
            " = 'pending' OR ",
            $column,
            " = 'awaiting_approval' OR ",
            $column,
            " = 'in_doubt')"
        )
    };
}
pub(crate) use open_statuses;

/// Why a claim found an at-most-once operation in doubt: it had been dispatched and its
/// dispatcher is gone (crashed, killed, paused past its lease, or cut off) with no outcome
/// recorded.
pub const TAKEN_OVER_IN_DOUBT: &str = "it was dispatched by a router process that stopped (crashed, was killed, \
     paused past its lease, or lost the registry) before its outcome was recorded";

/// The lease generation of a new row's first lease (each lease taken counts it up by one).
pub const FIRST_GENERATION: i64 = 1;

/// A step of another layer that commits in the same SQLite transaction as a registry write:
/// the built-in router's authorization and execution layers, whose tables live in the
/// registry's file ([`crate::backend::Backend::open_in`]). It runs after the registry's own
/// statements and before the commit.
pub type InTransaction<T, E> =
    Box<dyn for<'a, 'b> FnOnce(crate::storage::LayerTx<'a, 'b>) -> Result<T, E> + Send>;

/// Why the registry cannot be used. Every spend fails closed with `registry_unavailable` on any
/// of these, naming the file and the cause.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file cannot be created, opened, identified or migrated (see [`crate::storage::sqlite`]).
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
    /// `--registry` looks like a PostgreSQL URL but is not one this build can use.
    #[error(transparent)]
    BadUrl(#[from] crate::storage::postgres::BadPgUrl),
    /// PostgreSQL cannot be reached or refused an operation. Every spend fails closed until it
    /// answers again; the router reconnects on the next call.
    #[error("registry `{url}` failed while {doing}: {}", url.explain(cause))]
    Postgres {
        /// The database URL, password redacted.
        url: PgUrl,
        /// What the router was doing, as a fragment.
        doing: &'static str,
        /// The cause (shown through [`PgUrl::explain`], which carries its causes, the server's
        /// message and a TLS failure's fix, so it is not also chained as a source).
        cause: ::postgres::Error,
    },
    /// The database holds a schema this build must not touch (another application's, or a
    /// newer callid's), or a server setting that would lose committed rows.
    #[error("registry `{url}` refused: {detail}; nothing was changed")]
    Refused {
        /// The database URL, password redacted.
        url: PgUrl,
        /// What is wrong and what to do.
        detail: String,
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
    /// A dispatcher's write whose lease was taken over meanwhile (its fencing token is stale):
    /// nothing of the write was recorded.
    #[error(
        "operation `{handle}` was taken over by another dispatcher (its lease lapsed or its \
         owner was seen as gone) before {doing} could be recorded; nothing was recorded"
    )]
    Fenced {
        /// The handle.
        handle: String,
        /// What was being recorded, as a fragment.
        doing: &'static str,
    },
    /// A resolution of an operation that is not in doubt.
    #[error(
        "operation `{handle}` is `{status}`, not `in_doubt`; only an operation whose outcome is \
         unknown can be resolved, and nothing changed"
    )]
    NotInDoubt {
        /// The handle.
        handle: String,
        /// Its current status.
        status: &'static str,
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
    /// A layer's step that commits with a registry write failed ([`InTransaction`]); the
    /// whole write was rolled back.
    #[error("registry `{path}` did not record {doing}: {detail}")]
    Layer {
        /// The registry file.
        path: PathBuf,
        /// What the router was doing, as a fragment.
        doing: &'static str,
        /// The layer's error.
        detail: String,
    },
    /// The error of a group commit ([`Registry::write_batch`]), as told to each of its writes.
    #[error("{message}")]
    Batch {
        /// The error, as its `Display` showed it.
        message: String,
    },
}

impl RegistryError {
    /// A layer's step failed inside the registry's write at `path`, which was rolled back.
    pub(super) fn layer(path: PathBuf, detail: impl std::fmt::Display) -> RegistryError {
        RegistryError::Layer {
            path,
            doing: "the result",
            detail: detail.to_string(),
        }
    }

    /// This error, for another caller of the same failed group commit.
    pub fn again(&self) -> RegistryError {
        RegistryError::Batch {
            message: self.to_string(),
        }
    }
}

/// What a new operation's write answers: the row now stored, whether this process holds its
/// lease, and the outcome of its stage (`None`: it did not run).
pub type InsertDone<T> = (Insert, bool, Option<Result<T, String>>);

/// One write of a group commit ([`Registry::write_batch`]), with the channel its answer goes to
/// once the commit returned.
pub enum Write<T> {
    /// Records a new operation unless its call identity already has a row (answering the
    /// row now stored and whether this write created it), refusing one that would take the
    /// cents committed by this installation's operations above `budget_cents` (the gateway's
    /// policy budget; on PostgreSQL under an advisory lock, so it holds across replicas). A
    /// created, pending row gets its dispatch lease for `owner`, and `stage`, another layer's
    /// steps for it, runs in the same transaction: one commit for all. When the stage fails,
    /// its writes are rolled back alone (its savepoint in a group; a lone write's transaction is
    /// rolled back and its row written again alone), the row and its lease stay, and its error
    /// is answered beside the row (the caller then runs those steps on their own).
    Insert {
        /// The new operation.
        new: Box<NewOperation>,
        /// The installation's budget, when the registry enforces one.
        budget_cents: Option<u64>,
        /// The lease owner (this process).
        owner: String,
        /// The lease's time to live.
        ttl: Duration,
        /// Another layer's steps for the new row.
        stage: Option<InTransaction<T, String>>,
        /// Where the answer goes.
        reply: tokio::sync::oneshot::Sender<Result<InsertDone<T>, RegistryError>>,
    },
    /// Records the result of a completed operation, with what the provider charged, and
    /// drops its lease; `settle`, another layer's record of the same outcome, runs in the same
    /// transaction. When it fails nothing is recorded ([`RegistryError::Layer`]).
    Result {
        /// The operation.
        handle: PublicHandle,
        /// Its result.
        result: Value,
        /// What was charged.
        charged_cents: u64,
        /// The lease generation the dispatcher holds (its fencing token): the result is
        /// recorded only while the row is still pending under it, or in doubt after a dispatch
        /// under it; otherwise the write fails ([`RegistryError::Fenced`]) and nothing is
        /// recorded.
        generation: i64,
        /// Another layer's record of the outcome.
        settle: Option<InTransaction<(), String>>,
        /// Where the answer goes.
        reply: tokio::sync::oneshot::Sender<Result<(), RegistryError>>,
    },
}

impl<T> Write<T> {
    /// Answers this write `e` (its batch failed before it ran).
    pub fn fail(self, e: &RegistryError) {
        // A caller that went away has nothing to be told.
        match self {
            Write::Insert { reply, .. } => drop(reply.send(Err(e.again()))),
            Write::Result { reply, .. } => drop(reply.send(Err(e.again()))),
        }
    }
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
    /// Dispatched at most once to a backend that ignores idempotency keys, and its outcome is
    /// unknown (timeout, backend or connection lost, a crash after the dispatch mark): never
    /// sent again until a person resolves it (`callid router resolve`).
    InDoubt,
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 6] = [
        Status::Pending,
        Status::AwaitingApproval,
        Status::Completed,
        Status::Denied,
        Status::Failed,
        Status::InDoubt,
    ];

    /// The name on the wire and in the file.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::AwaitingApproval => "awaiting_approval",
            Status::Completed => "completed",
            Status::Denied => "denied",
            Status::Failed => "failed",
            Status::InDoubt => "in_doubt",
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
    /// Dispatched at most once: its backend does not honour the idempotency key, so an unknown
    /// outcome makes it [`Status::InDoubt`] instead of a continuation under the same key.
    pub at_most_once: bool,
    /// When it was last dispatched (ms since the epoch), for an at-most-once row.
    pub dispatched_ms: Option<i64>,
    /// A person's resolution of its unknown outcome, if one was recorded.
    pub resolution: Option<Resolution>,
}

/// A person's answer for an operation whose outcome was unknown ([`Status::InDoubt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// Whether the backend charged it (`false`: the next redelivery dispatches it once more).
    pub charged: bool,
    /// Who said so.
    pub by: String,
    /// When (ms since the epoch).
    pub at_ms: i64,
}

impl Resolution {
    /// The name in the file and in status answers.
    pub fn name(&self) -> &'static str {
        if self.charged {
            "charged"
        } else {
            "not_charged"
        }
    }
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
    /// Whether it is dispatched at most once (its backend ignores idempotency keys).
    pub at_most_once: bool,
}

impl NewOperation {
    /// The status and approval a new row starts with: waiting for a person, or pending.
    pub fn initial_state(&self) -> (Status, Approval) {
        if self.needs_approval {
            (Status::AwaitingApproval, Approval::Required)
        } else {
            (Status::Pending, Approval::NotRequired)
        }
    }

    /// The operation this row is once stored with `status` and `approval` (no result yet): what
    /// every backend answers for the row it just created.
    pub fn operation(&self, status: Status, approval: Approval) -> Operation {
        Operation {
            platform: self.platform.clone(),
            source_installation: self.source_installation.clone(),
            harness_call_id: self.harness_call_id.clone(),
            handle: self.handle.clone(),
            key: self.key.clone(),
            tool: self.tool.clone(),
            request_hash: self.request_hash.clone(),
            arguments: self.arguments.clone(),
            amount_cents: self.amount_cents,
            status,
            approval,
            result: None,
            error: None,
            charged_cents: None,
            at_most_once: self.at_most_once,
            dispatched_ms: None,
            resolution: None,
        }
    }
}

/// What [`Write::Insert`] did.
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
    /// This process may dispatch, under this lease generation (its fencing token). For an
    /// at-most-once row the dispatch mark is committed with the lease.
    Granted {
        /// The lease generation every write of this dispatcher carries.
        generation: i64,
    },
    /// Another live process is dispatching this operation.
    HeldElsewhere,
    /// Another process dispatched this operation and its liveness is no longer visible
    /// (PostgreSQL: its lock is gone), yet it may still be waiting for the backend: the lease
    /// is taken over once it expires, in `expires_in`, unless its holder renews it meanwhile
    /// (the takeover rule in `## Concurrency`).
    Orphaned {
        /// How long until the lease expires, on the registry's clock.
        expires_in: Duration,
    },
    /// The row is no longer pending (finished meanwhile, or waiting for a person), or this claim
    /// found an at-most-once row dispatched before with no recorded outcome and marked it
    /// [`Status::InDoubt`] instead of taking the lease.
    NotPending(Status),
}

mod machine;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
mod tests;

pub use crate::storage::postgres::PgUrl;
pub use sqlite::SqliteRegistry;

/// Where the registry lives: a SQLite file on this machine, or a PostgreSQL database shared by
/// replicas. Parsed from `--registry` / `CALLID_REGISTRY` by the rule of
/// [`crate::storage::postgres::database_url`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryLocation {
    /// A SQLite file.
    File(PathBuf),
    /// A PostgreSQL database (the password is redacted wherever it is shown).
    Postgres(PgUrl),
}

impl RegistryLocation {
    /// Reads `--registry`: a PostgreSQL URL or a file path ([`crate::storage::postgres::database_url`]); a URL
    /// of another scheme is refused.
    pub fn parse(text: &std::ffi::OsStr) -> Result<RegistryLocation, RegistryError> {
        Ok(match crate::storage::postgres::database_url(text)? {
            Some(url) => RegistryLocation::Postgres(url),
            None => RegistryLocation::File(PathBuf::from(text)),
        })
    }

    /// The location as shown to people and in messages (a database URL's password redacted).
    pub fn display(&self) -> &Self {
        self
    }

    /// The directory of this machine where the in-process backend layers keep their state:
    /// beside a registry file; for a database, `state_dir` (the router's data directory).
    pub fn local_state_dir(&self, state_dir: Option<&Path>) -> PathBuf {
        match self {
            RegistryLocation::File(path) => path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".")),
            RegistryLocation::Postgres(_) => state_dir
                .map(Path::to_path_buf)
                .or_else(|| default_path().and_then(|p| p.parent().map(Path::to_path_buf)))
                .unwrap_or_else(|| PathBuf::from(".")),
        }
    }
}

impl From<PathBuf> for RegistryLocation {
    fn from(path: PathBuf) -> Self {
        RegistryLocation::File(path)
    }
}

impl std::fmt::Display for RegistryLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryLocation::File(path) => write!(f, "{}", path.display()),
            RegistryLocation::Postgres(url) => write!(f, "{url}"),
        }
    }
}

/// An open registry, on either backend. Every method has the same contract on both; where
/// they differ (liveness of a lease owner, durability) the module docs say so.
#[derive(Debug)]
// One per router, opened once: the SQLite connection's size (its hooks) costs nothing here.
#[allow(clippy::large_enum_variant)]
pub enum Registry {
    /// A SQLite file.
    Sqlite(SqliteRegistry),
    /// A PostgreSQL database.
    Postgres(Box<postgres::PgRegistry>),
}

macro_rules! each {
    ($self:ident, $r:ident => $e:expr) => {
        match $self {
            Registry::Sqlite($r) => $e,
            Registry::Postgres($r) => $e,
        }
    };
}

/// `$e` with `$r` the open backend as a [`machine::RegistryStore`].
macro_rules! each_store {
    ($self:ident, $r:ident => $e:expr) => {
        match $self {
            Registry::Sqlite(open) => {
                let $r: &mut SqliteRegistry = open;
                $e
            }
            Registry::Postgres(open) => {
                let $r: &mut postgres::PgRegistry = open;
                $e
            }
        }
    };
}

impl Registry {
    /// Opens the registry at `location`, creating it if absent and migrating it to the newest
    /// schema. A foreign or newer registry is refused untouched.
    pub fn open(location: &RegistryLocation) -> Result<Registry, RegistryError> {
        match location {
            RegistryLocation::File(path) => SqliteRegistry::open(path).map(Registry::Sqlite),
            RegistryLocation::Postgres(url) => {
                postgres::PgRegistry::open(url).map(|r| Registry::Postgres(Box::new(r)))
            }
        }
    }

    /// Opens an existing registry (operator commands): never creates a file. A database is
    /// migrated like [`Registry::open`] would (it holds no rows until a router used it).
    pub fn open_existing(location: &RegistryLocation) -> Result<Registry, RegistryError> {
        match location {
            RegistryLocation::File(path) => {
                SqliteRegistry::open_existing(path).map(Registry::Sqlite)
            }
            RegistryLocation::Postgres(url) => {
                postgres::PgRegistry::open(url).map(|r| Registry::Postgres(Box::new(r)))
            }
        }
    }

    /// Another handle on the same PostgreSQL registry for another thread of this process (its
    /// own connection, the same liveness lock, so its leases are this replica's); `None` for a
    /// SQLite file, which is opened again instead.
    pub fn sibling(&self) -> Option<Registry> {
        match self {
            Registry::Sqlite(_) => None,
            Registry::Postgres(r) => Some(Registry::Postgres(Box::new(r.sibling()))),
        }
    }

    /// This router installation's id, generated on first open and kept (shared by every
    /// replica of one database).
    pub fn installation_id(&self) -> &str {
        each!(self, r => r.installation_id())
    }

    /// The operation recorded for a call identity of this installation.
    pub fn find(
        &mut self,
        platform: &str,
        source_installation: &str,
        harness_call_id: &str,
    ) -> Result<Option<Operation>, RegistryError> {
        each!(self, r => r.find(platform, source_installation, harness_call_id))
    }

    /// The operation with this public handle.
    pub fn find_by_handle(&mut self, handle: &str) -> Result<Option<Operation>, RegistryError> {
        each!(self, r => r.find_by_handle(handle))
    }

    /// Runs `writes` with one commit for all (group commit: each in a savepoint of its own, a
    /// lone write in none; see [`machine`]). The router's SQLite writer batches what queued
    /// while its previous commit ran; its PostgreSQL writers take one write each, on a
    /// connection each (the server shares WAL flushes between concurrent commits itself), and a
    /// write with nothing to commit beside it (no budget, no layer step) is one statement.
    /// Every write is answered on its channel only after its commit returned.
    pub fn write_batch<T>(&mut self, writes: Vec<Write<T>>) {
        each_store!(self, r => machine::write_batch(r, writes))
    }

    /// Takes the dispatch lease of a pending operation for `owner` until `now + ttl`.
    pub fn claim_lease(
        &mut self,
        handle: &PublicHandle,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, RegistryError> {
        each_store!(self, r => machine::claim(r, handle, owner, ttl))
    }

    /// Gives up a dispatch lease without recording a result (a retryable failure): the row
    /// stays pending and the next delivery continues it. For an at-most-once row, `unsent`
    /// says nothing reached the backend, so its dispatch mark is cleared with the lease; a row
    /// whose dispatch may have reached the backend is never released this way but marked
    /// [`Registry::mark_in_doubt`].
    pub fn release_lease(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
    ) -> Result<(), RegistryError> {
        let step = machine::Step::Release {
            handle: handle.as_str(),
            generation,
        };
        each_store!(self, r => machine::apply(r, step)).map(drop)
    }

    /// Extends the dispatch lease of `generation` to `now + ttl` while its dispatcher waits for
    /// the backend; `false` when the lease is no longer this dispatcher's (taken over, or the
    /// row settled), so the dispatcher knows its writes will be fenced.
    pub fn renew_lease(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        ttl: Duration,
    ) -> Result<bool, RegistryError> {
        let step = machine::Step::Renew {
            handle: handle.as_str(),
            generation,
            ttl,
        };
        each_store!(self, r => machine::apply(r, step))
    }

    /// Marks a pending at-most-once row, dispatched under `generation`, as
    /// [`Status::InDoubt`] with `reason` (its outcome is unknown); `false` when the lease
    /// was taken over meanwhile (the new owner found the dispatch mark and did the same).
    pub fn mark_in_doubt(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        reason: &str,
    ) -> Result<bool, RegistryError> {
        let step = machine::Step::MarkInDoubt {
            handle: handle.as_str(),
            generation,
            reason,
        };
        each_store!(self, r => machine::apply(r, step))
    }

    /// Records a final error of an operation (answered again on redelivery), fenced by the
    /// dispatcher's lease `generation` like [`Write::Result`].
    pub fn record_failure(
        &mut self,
        handle: &PublicHandle,
        generation: i64,
        code: &str,
        message: &str,
    ) -> Result<(), RegistryError> {
        each_store!(self, r => machine::record_failure(r, handle, generation, code, message))
    }

    /// A person's resolution of an [`Status::InDoubt`] operation, recorded with who and when.
    /// `charged`: it becomes `completed`, charged at its price, answering `result` (the
    /// spender's recorded-result value) on every redelivery. Not charged: it becomes `pending`
    /// with its dispatch mark cleared, so the next redelivery dispatches it once more.
    pub fn resolve(
        &mut self,
        handle: &str,
        charged: bool,
        result: Option<&Value>,
        by: &str,
    ) -> Result<Operation, RegistryError> {
        each_store!(self, r => machine::resolve(r, handle, charged, result, by))
    }

    /// A person's decision on an operation waiting for approval.
    pub fn decide(
        &mut self,
        handle: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<Operation, RegistryError> {
        each_store!(self, r => machine::decide(r, handle, approve, reason))
    }
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

pub(super) struct RawRow {
    pub(super) platform: String,
    pub(super) harness_call_id: String,
    pub(super) handle: String,
    pub(super) key: String,
    pub(super) tool: String,
    pub(super) request_hash: String,
    pub(super) arguments: String,
    pub(super) amount_cents: i64,
    pub(super) status: String,
    pub(super) approval: String,
    pub(super) result: Option<String>,
    pub(super) error_code: Option<String>,
    pub(super) error_message: Option<String>,
    pub(super) source_installation: String,
    pub(super) charged_cents: Option<i64>,
    pub(super) at_most_once: bool,
    pub(super) dispatched_ms: Option<i64>,
    pub(super) resolution: Option<String>,
    pub(super) resolved_by: Option<String>,
    pub(super) resolved_ms: Option<i64>,
}

impl RawRow {
    pub(super) fn into_operation(self, path: &Path) -> Result<Operation, RegistryError> {
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
            at_most_once: self.at_most_once,
            dispatched_ms: self.dispatched_ms,
            resolution: match self.resolution.as_deref() {
                None => None,
                Some(r @ ("charged" | "not_charged")) => Some(Resolution {
                    charged: r == "charged",
                    by: self.resolved_by.unwrap_or_default(),
                    at_ms: self.resolved_ms.unwrap_or_default(),
                }),
                Some(other) => return Err(corrupt(format!("unknown resolution `{other}`"))),
            },
        })
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
pub(super) fn process_start(pid: u32) -> Option<u64> {
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
pub(super) fn owner_alive(owner: &str) -> bool {
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
mod location_tests {
    use super::RegistryLocation;

    fn parse(text: &str) -> Result<RegistryLocation, String> {
        RegistryLocation::parse(text.as_ref()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_postgres_scheme_in_any_case_is_a_database_another_scheme_is_refused_the_rest_a_file() {
        for db in [
            "postgres://u:secret@127.0.0.1:1/db",
            "postgresql://u:secret@127.0.0.1:1/db",
            "Postgres://u:secret@127.0.0.1:1/db",
            "POSTGRESQL://u:secret@127.0.0.1:1/db",
            "  pOsTgReS://u:secret@127.0.0.1:1/db \n",
        ] {
            let Ok(RegistryLocation::Postgres(url)) = parse(db) else {
                panic!("{db:?} is a database: {:?}", parse(db));
            };
            let shown = url.to_string();
            assert!(
                matches!(
                    shown.split_once("://"),
                    Some(("postgres" | "postgresql", "u:REDACTED@127.0.0.1:1/db"))
                ),
                "{db:?} shows as {shown}"
            );
        }
        for (refused, scheme) in [
            ("mysql://u:secret@h/db", "mysql"),
            ("sqlite:///tmp/r.sqlite3", "sqlite"),
            (" file:///tmp/r.sqlite3", "file"),
            ("HTTP://u:secret@h:1/x?token=secret", "HTTP"),
            ("postgres+tls://u:secret@h/db", "postgres+tls"),
            ("redis://:secret@h", "redis"),
        ] {
            let text = parse(refused).unwrap_err();
            assert_eq!(
                text,
                format!(
                    "registry `{scheme}://…` names a scheme callid does not serve; pass a \
                     SQLite file path (a relative one that holds `://` as `./PATH`) or \
                     `postgres://USER@HOST:PORT/DATABASE` (`postgresql://` too, in any letter \
                     case)"
                ),
                "{refused:?}"
            );
        }
        for file in [
            "registry.sqlite3",
            "postgres-registry.sqlite3",
            "/tmp/postgres:/x",
            "./mysql://x",
            "dir/postgres://x",
            "C://registry.sqlite3",
            "9p://x",
            " spaced name.sqlite3",
        ] {
            assert_eq!(
                parse(file),
                Ok(RegistryLocation::File(file.into())),
                "{file:?}"
            );
        }
        // Two replicas given the URL in two spellings share one database.
        assert_eq!(
            parse(" Postgres://u:secret@127.0.0.1:1/db"),
            parse("postgres://u:secret@127.0.0.1:1/db")
        );
        let text = parse("Postgres://bob:pw@db.example:5432/").unwrap_err();
        assert!(text.contains("names no database"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }
}
