//! The tool-agnostic spend pipeline: the article's rules, in its order, for any paid tool.
//!
//! [`Core::spend`] answers one spend call; what is spent, and how, is a [`Spender`]'s business:
//! the built-in router's spender is its image backend ([`crate::router::image::Router`]), the gateway's
//! is an upstream MCP server ([`crate::gateway`]). For every spend call the core:
//! 1. refuses identity in the arguments ([`identity::IdentitySources::check_arguments`]);
//! 2. reads the trusted identity from `_meta` ([`identity::IdentitySources::from_meta_map`]),
//!    failing closed, and, with trust keys, verifies its signature
//!    ([`identity::trust::TrustKeys::verify`]) before anything below is consulted or recorded;
//! 3. hashes the request ([`canonical::request_hash`], once) and lets the spender check the
//!    arguments, turning them into its typed request once ([`Spender::check`]), which the
//!    quote, the spender's staged steps and its execution of a new operation all take;
//! 4. writes the call as a new operation, and the registry's insert is the look-up by
//!    (platform, installation, the envelope's installation, harness call id): the spender
//!    prices it and says whether it needs approval, it gets a fresh private key and public
//!    handle, and the insert either commits its row before anything is dispatched or answers
//!    the row the call has already (`INSERT ... ON CONFLICT DO NOTHING`, never
//!    check-then-insert). The registry is looked up before that only with a preallocated key
//!    pool (no key is ever claimed for a redelivery), and when the arguments fail the check of
//!    step 3 or the price cannot be quoted (a recorded call still gets its recorded outcome, a
//!    call not recorded the error, and nothing is written): `Core::deliver`, `Core::spend_inner`;
//! 5. resolves a call recorded already: the same hash returns the recorded result (marked
//!    replayed) or, with none recorded yet, continues the same operation under the same key;
//!    another hash is refused (`request_mismatch`) before the spender; a completed operation's
//!    reply is kept ready in the [`ReplayCache`] once its result is committed, so a redelivery
//!    with the same hash is answered from there after steps 1 to 3;
//! 6. takes the row's dispatch lease (a new row is committed with it), lets the spender execute
//!    it with the private key, records the outcome, then replies.
//!
//! Every reply, success or error, passes through the [`Scrubber`] ([`Core::finish`]).
//!
//! # Honest errors
//! An error says "nothing was dispatched" only where that is true of the call being answered.
//! Once the spender has been called, an error carries the operation's handle; if its answer
//! cannot be recorded, the code is `outcome_unknown`: redelivering *the same call* settles it
//! (it continues the operation under the same key), whereas a new call would be charged again.
//!
//! # Concurrency
//! Single flight per call identity within a process: deliveries of the same call wait on one
//! async lock, so the first dispatches and the later ones find its recorded result and return it
//! marked replayed. Across processes sharing a registry, the row's dispatch lease decides: a
//! delivery that finds another live process dispatching gets `operation_in_progress`, which is
//! safe to retry (see `registry.rs`); one that finds a dispatch whose process may be gone
//! ([`Lease::Orphaned`]) waits for its lease to expire and takes it over. A dispatcher renews
//! its lease while the backend works and stops waiting for the backend ([`ABANDON_AFTER`])
//! before the lease could expire when it cannot renew it. A lease whose claim came back later
//! than that share of its lifetime after it was asked for (its statement waited in the registry,
//! for a row lock of a replica cut off mid-transaction, say) is given back without dispatching:
//! the server counts such a lease from before the wait, so it may have lapsed already and
//! another process taken the operation over.

use super::preallocated::{KeyPool, KeyPoolError};
use super::registry::{
    FIRST_GENERATION, InTransaction, Insert, Lease, NewOperation, Operation, Registry,
    RegistryError, RegistryLocation, Status, Write, process_owner, retire_owner,
};
use super::replay::{self, Cached, ReplayCache};
pub use super::reply::{
    HANDLE_META, Reply, ToolCode, ToolError, identity_error, overcharge_json, overcharge_text,
};
use super::scrub::Scrubber;
use crate::canonical::{self, RequestHash};
use crate::crashpoint::{self, Boundary};
use crate::identity::{self, Identity, Source};
use crate::keys::{OperationKey, PublicHandle};
use rmcp::model::CallToolResult;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a dispatch lease holds off other processes unless renewed, by default
/// (`--lease-ttl`). The dispatcher renews it every third of that while the backend works, so a
/// call may take any time; it lapses only when the dispatcher stops renewing (hung, paused,
/// killed, or cut off from the registry, when it stops waiting first: [`ABANDON_AFTER`]). It is
/// how long a dispatched operation of a replica that died waits before another takes it over
/// (the takeover rule of the registry), so it is short.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// The share of a lease's lifetime after its last successful renewal (or its claim) at which a
/// dispatcher that could not renew stops waiting for the backend: well before the lease can
/// expire on the server, so no other process takes the operation over while this one waits.
pub const ABANDON_AFTER: f64 = 0.8;

/// How long after an orphaned lease's expiry ([`Lease::Orphaned`]) a delivery claims it again.
const ORPHAN_MARGIN: Duration = Duration::from_millis(50);

/// What a new operation costs, and whether a person must approve it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quote {
    /// The price in cents, recorded with the operation.
    pub amount_cents: u64,
    /// Whether the policy wants a person before it runs (decided once, stored with the row).
    pub needs_approval: bool,
    /// A budget the registry enforces when it records the operation (`None`: none, or one
    /// enforced elsewhere, as the built-in router's authorization layer does).
    pub budget_cents: Option<u64>,
}

/// What a spender's execution of an operation came to.
#[derive(Debug)]
pub enum Outcome {
    /// The spend is done: `result` is recorded as the operation's result (by convention
    /// `{"handle", "status", "result"}`) and replayed on redelivery.
    Done {
        /// The value to record.
        result: Value,
        /// What was charged, in cents.
        charged_cents: u64,
        /// What the spender answered, for a message when it cannot be recorded (e.g. "the
        /// provider charged 3 cents").
        answer: String,
    },
    /// A final refusal: recorded, answered again on every redelivery.
    Refused {
        /// Stable code (one of [`Spender::ERROR_CODES`]).
        code: ToolCode,
        /// What happened.
        message: String,
    },
    /// [`Outcome::Done`], with the spender's own layers' record of it, which the core commits in
    /// the same registry transaction as the result (one commit for every layer's record).
    Settling {
        /// The value to record.
        result: Value,
        /// What was charged, in cents.
        charged_cents: u64,
        /// What the spender answered, for a message when it cannot be recorded.
        answer: String,
        /// The layers' record of the outcome.
        settle: Settle,
    },
    /// The outcome is unknown: the request may have reached the backend (timeout, backend or
    /// connection lost, an answer that cannot be read). With an idempotent backend the
    /// operation stays pending and a redelivery continues it under the same key; otherwise it
    /// becomes [`Status::InDoubt`] and is never sent again until a person resolves it. The
    /// error is answered as it is (idempotent) or inside the in-doubt answer.
    Open(ToolError),
    /// Nothing reached the backend (it could not be connected to): the operation stays
    /// pending, its dispatch mark is cleared, and a redelivery dispatches it.
    NotSent(ToolError),
}

/// A spender's own layers' record of an outcome, run inside the registry's transaction that
/// records the result ([`Outcome::Settling`]); its error message rolls the whole record back.
pub struct Settle(pub InTransaction<(), String>);

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Settle(..)")
    }
}

/// What a spender's [`Spender::stage`] committed with a new row, handed to
/// [`Spender::execute_staged`] (the spender knows its type).
pub struct Staged(pub Box<dyn std::any::Any + Send>);

/// A spender's own steps for a new operation, committed with its row and lease.
pub type Stage = InTransaction<Staged, String>;

/// What is spent for a spend call: the part of the pipeline that differs between the built-in
/// router and the gateway.
///
/// # One request, one form
/// A spend call's arguments are turned into the spender's [`Spender::Request`] once, by
/// [`Spender::check`], before the registry is consulted; a new operation's quote, staged steps
/// and execution all take that one value, and the registry records the arguments as received.
/// A recorded operation continued later (a redelivery, `resume_operation`) is executed with
/// the request rebuilt from its record ([`Spender::recorded`]): what runs is always what was
/// recorded.
///
/// # Guarantee the core gives
/// [`Spender::execute`] is called only for an operation whose registry row is committed and
/// whose dispatch lease this process holds; every continuation of one operation carries the
/// same private key.
pub trait Spender: Sync {
    /// What a spend call's arguments become once checked: what the spender prices and runs.
    type Request: Send + Sync;

    /// Every error code a tool call can answer (recorded codes are mapped onto these).
    const ERROR_CODES: &'static [ToolCode];
    /// The command an operator runs to approve (e.g. `callid router`).
    const OPERATOR: &'static str;

    /// Checks a spend call's arguments and turns them into the request. A call that fails it
    /// is never recorded; one recorded already gets its recorded outcome all the same.
    fn check(&self, tool: &str, args: &Value) -> Result<Self::Request, ToolError>;

    /// The request of a recorded operation, rebuilt from its record (to continue it).
    fn recorded(&self, op: &Operation) -> Result<Self::Request, ToolError>;

    /// Whether `tool`'s backend honours the idempotency key, so that an operation whose outcome
    /// is unknown may be sent again under the same key. `false` (what most real paid backends
    /// are) makes every operation of `tool` at most once: dispatched once, and
    /// [`Status::InDoubt`] whenever its outcome is unknown. Decided when the operation is
    /// recorded, and stored with it.
    fn idempotent(&self, tool: &str) -> bool;

    /// Prices a new operation. Every delivery the reply cache did not answer is priced, a
    /// redelivery of a recorded call too (its insert then answers the recorded row, whose
    /// price stands), so a quote has no side effect; a failed quote answers a recorded call
    /// from its record.
    fn quote(
        &self,
        tool: &str,
        request: &Self::Request,
    ) -> impl Future<Output = Result<Quote, ToolError>> + Send;

    /// Runs a recorded, pending operation under its private key.
    fn execute(
        &self,
        op: &Operation,
        request: &Self::Request,
    ) -> impl Future<Output = Outcome> + Send;

    /// The spender's own steps before dispatching the new operation `new`, to run inside the
    /// registry's transaction that records its row and lease (one commit for both; SQLite
    /// registries only). When they fail they are rolled back alone, the row and lease are
    /// committed, and [`Spender::execute`] runs instead. Default: none.
    fn stage(
        &self,
        _new: &NewOperation,
        _request: &Self::Request,
    ) -> impl Future<Output = Option<Stage>> + Send {
        std::future::ready(None)
    }

    /// Runs a new operation whose [`Spender::stage`] committed with its row. Default:
    /// [`Spender::execute`].
    fn execute_staged(
        &self,
        op: &Operation,
        request: &Self::Request,
        _staged: Staged,
    ) -> impl Future<Output = Outcome> + Send {
        self.execute(op, request)
    }

    /// The reply of a completed operation (`replayed`: answered from the record).
    fn completed(&self, op: &Operation, replayed: bool) -> Reply;
}

type Flight = Arc<tokio::sync::Mutex<()>>;

/// A spend call that passed the checks: its arguments as received (recorded with a new
/// operation), the spender's request made of them, and their request hash.
struct Checked<R> {
    args: Value,
    request: R,
    hash: RequestHash,
}

/// Where the core keeps its state and how it names keys.
#[derive(Debug, Clone)]
pub struct CoreOptions {
    /// The registry: a SQLite file, or a PostgreSQL database shared by replicas.
    pub registry: RegistryLocation,
    /// A preallocated-key database to claim keys from.
    pub preallocated_keys: Option<PathBuf>,
    /// Prefix of private keys.
    pub key_prefix: String,
    /// Prefix of public handles.
    pub handle_prefix: String,
    /// The identity sources spend calls are identified by: the built-in table, or one extended
    /// by `--identity-sources` ([`identity::IdentitySources::load`]).
    pub identity_sources: Arc<identity::IdentitySources>,
    /// How long a dispatch lease lasts unless renewed ([`LEASE_TTL`] by default).
    pub lease_ttl: Duration,
    /// The keys envelopes must be signed with (`--trust-keys`); `None` verifies nothing.
    pub trust: Option<Arc<identity::trust::TrustKeys>>,
}

/// The pipeline's state: registry, key pool, single-flight locks, lease owner, scrubber.
pub struct Core {
    opts: CoreOptions,
    registry: Arc<Mutex<Option<Registry>>>,
    /// The registry's writer threads ([`write_batches`]): new rows and results.
    writes: std::sync::mpsc::Sender<Write<Staged>>,
    pool: Option<Arc<Mutex<Option<KeyPool>>>>,
    flights: Mutex<HashMap<(String, String, String), Flight>>,
    owner: String,
    scrubber: Scrubber,
    replies: ReplayCache,
}

impl Drop for Core {
    fn drop(&mut self) {
        // Leases this instance still holds are free for any other instance at once.
        retire_owner(&self.owner);
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("opts", &self.opts).finish()
    }
}

impl Core {
    /// A core; opens the registry now if it can (a failure is logged, and every spend then
    /// fails closed with `registry_unavailable` until it opens).
    pub fn new(opts: CoreOptions) -> Core {
        // On a thread of its own: the PostgreSQL client runs a runtime that must not start
        // inside the caller's async task.
        let opened = std::thread::scope(|s| {
            s.spawn(|| Registry::open(&opts.registry))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        let registry = match opened {
            Ok(r) => {
                tracing::info!(
                    registry = %opts.registry,
                    installation = r.installation_id(),
                    "registry open"
                );
                Some(r)
            }
            Err(e) => {
                tracing::error!("{e}; every spend will fail closed until it opens");
                None
            }
        };
        let registry = Arc::new(Mutex::new(registry));
        let (writes, queue) = std::sync::mpsc::channel();
        let (writers, batch) = match &opts.registry {
            RegistryLocation::File(_) => (1, MAX_BATCH),
            RegistryLocation::Postgres(_) => (PG_WRITERS, 1),
        };
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..writers {
            let writer = match &opts.registry {
                RegistryLocation::File(_) => Writer::Own(None),
                RegistryLocation::Postgres(_) => Writer::Sibling {
                    core: registry.clone(),
                    own: None,
                },
            };
            let (location, queue) = (opts.registry.clone(), queue.clone());
            std::thread::Builder::new()
                .name("callid-registry-writer".into())
                .spawn(move || write_batches(writer, &location, &queue, batch))
                .expect("a thread starts");
        }
        Core {
            writes,
            pool: opts
                .preallocated_keys
                .as_ref()
                .map(|_| Arc::new(Mutex::new(None))),
            scrubber: Scrubber::new(&opts.key_prefix),
            registry,
            flights: Mutex::new(HashMap::new()),
            owner: process_owner(),
            replies: ReplayCache::default(),
            opts,
        }
    }

    /// Whether new keys come from a preallocated pool.
    pub fn preallocated(&self) -> bool {
        self.pool.is_some()
    }

    /// The `CallToolResult` of `reply` to a call of `tool`, scrubbed and built once; `keys` are
    /// the private keys the call touched.
    pub fn finish(&self, tool: &str, mut reply: Reply, keys: &[OperationKey]) -> CallToolResult {
        if let Reply::Err(e) = &reply {
            tracing::info!(tool, code = e.code.code(), handle = ?e.handle.as_ref().map(|h| h.as_str()), "tool error");
        }
        let refs: Vec<&OperationKey> = keys.iter().collect();
        let n = reply.scrub(&self.scrubber, &refs);
        if n > 0 {
            tracing::warn!(tool, strings = n, "scrubbed private keys from a reply");
        }
        reply.into_result()
    }

    /// Scrubs any value (used for JSON-RPC error messages too).
    pub fn scrub(&self, value: &mut Value) {
        self.scrubber.scrub(value, &[]);
    }

    /// Answers one spend call of `tool` through the whole pipeline; also returns the private
    /// keys it touched, for [`Core::finish`].
    pub async fn spend<S: Spender>(
        &self,
        spender: &S,
        tool: &str,
        args: Value,
        meta: &Map<String, Value>,
    ) -> (Reply, Vec<OperationKey>) {
        let mut keys = vec![];
        // Boxed: this future holds every step's state (about 10 KB), and each future awaiting it
        // inline would carry all of it, and tokio moves a spawned task's future by value (rmcp
        // spawns one per request): about 100,000 instructions of copying per call.
        let reply = match Box::pin(self.spend_inner(spender, tool, args, meta, &mut keys)).await {
            Ok(r) => r,
            Err(e) => e.into(),
        };
        (reply, keys)
    }

    async fn spend_inner<S: Spender>(
        &self,
        spender: &S,
        tool: &str,
        args: Value,
        meta: &Map<String, Value>,
        keys: &mut Vec<OperationKey>,
    ) -> Result<Reply, ToolError> {
        let sources = &self.opts.identity_sources;
        sources.check_arguments(&args).map_err(identity_error)?;
        let id = sources.from_meta_map(meta).map_err(identity_error)?;
        if let Some(trust) = &self.opts.trust {
            trust
                .verify(meta, &id, identity::trust::now_secs())
                .map_err(super::reply::signature_error)?;
        }
        let hash = canonical::request_hash(tool, &args).map_err(|e| {
            ToolError::new(
                ToolCode::NonCanonicalArguments,
                format!("{e}; nothing was dispatched"),
            )
        })?;
        let cache_key = replay::key(&id.platform, id.key_installation(), &id.harness_call_id);
        if let Some(hit) = self.replies.get(&cache_key) {
            // A completed operation: identity, arguments and hash are checked above; the
            // recorded reply is immutable. Another hash goes on to be refused by the registry.
            if hit.request_hash == hash {
                return Ok(Reply::Ready(hit));
            }
        }
        let checked = spender.check(tool, &args);

        let flight = self.flight(&id.platform, id.key_installation(), &id.harness_call_id);
        let guard = flight.lock().await;
        let result = match checked {
            Ok(request) => {
                let call = Checked {
                    args,
                    request,
                    hash,
                };
                self.deliver(spender, &id, tool, call, keys).await
            }
            // As in `deliver` when the quote fails: a call recorded while it could be checked
            // gets its recorded outcome; one not recorded gets the check's error.
            Err(refused) => match self.recorded(&id).await {
                Ok(Some(op)) => {
                    keys.push(op.key.clone());
                    self.resolve_existing(spender, op, &hash).await
                }
                Ok(None) => Err(refused),
                Err(e) => Err(e),
            },
        };
        drop(guard);
        self.forget_flight(
            &id.platform,
            id.key_installation(),
            &id.harness_call_id,
            flight,
        );
        result
    }

    /// A delivery the reply cache did not answer. The insert is the look-up: a new row's
    /// `INSERT ... ON CONFLICT DO NOTHING` ([`Core::start`]) answers whether the call is new,
    /// and a call recorded already is answered from the row it conflicted with. The registry is
    /// looked up before it only where skipping that would cost or change something:
    /// - with a preallocated key pool, first: a key must never be claimed for a redelivery;
    /// - when the quote fails: a recorded call gets its recorded outcome even when it could no
    ///   longer be quoted today (a model or price removed since, its backend's state broken),
    ///   and a call not recorded gets the quote's error.
    async fn deliver<S: Spender>(
        &self,
        spender: &S,
        id: &Identity,
        tool: &str,
        call: Checked<S::Request>,
        keys: &mut Vec<OperationKey>,
    ) -> Result<Reply, ToolError> {
        let looked_up = self.pool.is_some();
        let first = if looked_up {
            self.recorded(id).await?
        } else {
            None
        };
        let op = match first {
            Some(op) => op,
            None => match spender.quote(tool, &call.request).await {
                Ok(quote) => return self.start(spender, id, tool, call, quote, keys).await,
                Err(refused) if looked_up => return Err(refused),
                Err(refused) => self.recorded(id).await?.ok_or(refused)?,
            },
        };
        keys.push(op.key.clone());
        self.resolve_existing(spender, op, &call.hash).await
    }

    /// The operation recorded for `id`'s call, read by a statement of its own.
    async fn recorded(&self, id: &Identity) -> Result<Option<Operation>, ToolError> {
        let (platform, installation, call_id) = (
            id.platform.clone(),
            id.key_installation().to_string(),
            id.harness_call_id.clone(),
        );
        self.registry(move |r| r.find(&platform, &installation, &call_id))
            .await
    }

    async fn start<S: Spender>(
        &self,
        spender: &S,
        id: &Identity,
        tool: &str,
        call: Checked<S::Request>,
        quote: Quote,
        keys: &mut Vec<OperationKey>,
    ) -> Result<Reply, ToolError> {
        let Checked {
            args,
            request,
            hash,
        } = call;
        let handle = PublicHandle::generate(&self.opts.handle_prefix);
        let key = match &self.pool {
            None => OperationKey::generate(&self.opts.key_prefix, &id.platform),
            Some(_) if id.source != Source::CodexCallId => {
                return Err(ToolError::new(
                    ToolCode::InvalidIdentity,
                    format!(
                        "this router runs with preallocated operation keys, and in that mode only \
                         Codex `callId` identities may start new operations; `{}` identities may \
                         only redeliver operations already recorded",
                        id.source_key
                    ),
                ));
            }
            Some(_) => self.claim_key(&handle).await?,
        };
        keys.push(key.clone());
        let new = NewOperation {
            platform: id.platform.clone(),
            source_installation: id.key_installation().to_string(),
            harness_call_id: id.harness_call_id.clone(),
            handle,
            key,
            tool: tool.into(),
            request_hash: hash.clone(),
            arguments: args,
            amount_cents: quote.amount_cents,
            needs_approval: quote.needs_approval,
            at_most_once: !spender.idempotent(tool),
        };
        let amount = quote.amount_cents;
        let budget = quote.budget_cents;
        let stage = spender.stage(&new, &request).await;
        let leased_at = tokio::time::Instant::now();
        // The row, its dispatch lease and the spender's own steps: one commit, shared with the
        // other writes waiting at that moment (group commit).
        let (insert, leased, staged) = self
            .write(|reply| Write::Insert {
                new: Box::new(new),
                budget_cents: budget,
                owner: self.owner.clone(),
                ttl: self.opts.lease_ttl,
                stage,
                reply,
            })
            .await?;
        let (op, created) = match insert {
            Insert::Stored(op, created) => (*op, created),
            Insert::OverBudget { committed_cents } => {
                let budget = budget.unwrap_or_default();
                return Err(ToolError::new(
                    ToolCode::BudgetExceeded,
                    format!(
                        "this spend costs {amount} cents but only {} of the {budget}-cent budget \
                         remain; nothing was recorded or dispatched: ask the operator to raise \
                         the budget",
                        budget.saturating_sub(committed_cents)
                    ),
                ));
            }
        };
        if !created {
            // The call was recorded already: a redelivery the reply cache did not answer, or
            // another delivery's row (another process's) committed first.
            keys.push(op.key.clone());
            return self.resolve_existing(spender, op, &hash).await;
        }
        crashpoint::hit(Boundary::AfterRowCommit);
        tracing::info!(handle = %op.handle, platform = %op.platform, tool, amount = quote.amount_cents, needs_approval = quote.needs_approval, "operation recorded");
        if op.status == Status::AwaitingApproval {
            return Err(awaiting_approval::<S>(&op, &self.opts.registry));
        }
        if leased {
            let staged = match staged {
                Some(Ok(staged)) => Some(staged),
                Some(Err(e)) => {
                    // Rolled back alone: `execute` runs those steps again and answers for them.
                    tracing::debug!(handle = %op.handle, "staged steps did not commit: {e}");
                    None
                }
                None => None,
            };
            return self
                .run(
                    spender,
                    op,
                    FIRST_GENERATION,
                    leased_at,
                    staged,
                    Some(request),
                )
                .await;
        }
        self.dispatch(spender, op, Some(request)).await
    }

    async fn resolve_existing<S: Spender>(
        &self,
        spender: &S,
        op: Operation,
        hash: &RequestHash,
    ) -> Result<Reply, ToolError> {
        if &op.request_hash != hash {
            return Err(ToolError::new(
                ToolCode::RequestMismatch,
                format!(
                    "this call id was already used for a different request (operation `{}`); one \
                     call cannot be reused for different work: make a new tool call for the new \
                     request; nothing was dispatched",
                    op.handle
                ),
            )
            .of(&op));
        }
        self.continue_operation(spender, op).await
    }

    /// Answers a recorded operation: replays what is recorded, or runs what is pending.
    async fn continue_operation<S: Spender>(
        &self,
        spender: &S,
        op: Operation,
    ) -> Result<Reply, ToolError> {
        match op.status {
            Status::Completed => Ok(Reply::Ready(self.remember(spender, &op))),
            Status::Failed => Err(recorded_failure::<S>(&op)),
            Status::Denied => Err(denied(&op)),
            Status::AwaitingApproval => Err(awaiting_approval::<S>(&op, &self.opts.registry)),
            Status::InDoubt => Err(in_doubt::<S>(&op, &self.opts.registry)),
            Status::Pending => self.dispatch(spender, op, None).await,
        }
    }

    /// Claims a pending operation's dispatch lease and runs it: with `request` when this
    /// delivery recorded it, else with the one rebuilt from its record ([`Spender::recorded`]).
    async fn dispatch<S: Spender>(
        &self,
        spender: &S,
        op: Operation,
        request: Option<S::Request>,
    ) -> Result<Reply, ToolError> {
        let ttl = self.opts.lease_ttl;
        let claim = || {
            let (owner, handle) = (self.owner.clone(), op.handle.clone());
            self.registry(move |r| r.claim_lease(&handle, &owner, ttl))
        };
        let mut leased_at = tokio::time::Instant::now();
        let mut lease = claim().await.map_err(|e| e.of(&op))?;
        if let Lease::Orphaned { expires_in } = lease {
            // Its holder may be alive and cut off from the registry: the lease is taken over
            // once it expires, which this delivery waits for (at most one lease lifetime)
            // rather than answering `operation_in_progress` to every redelivery until then.
            tokio::time::sleep(expires_in.min(ttl) + ORPHAN_MARGIN).await;
            leased_at = tokio::time::Instant::now();
            lease = claim().await.map_err(|e| e.of(&op))?;
        }
        let generation = match lease {
            Lease::Granted { generation } => generation,
            Lease::HeldElsewhere | Lease::Orphaned { .. } => {
                return Err(ToolError::new(
                    ToolCode::OperationInProgress,
                    format!(
                        "operation `{}` is being dispatched by another router process sharing \
                         this registry; retry the same call shortly: it is safe and will return \
                         that operation's result",
                        op.handle
                    ),
                )
                .of(&op));
            }
            Lease::NotPending(_) => {
                // Finished (or sent for approval) by another process meanwhile: answer that.
                let handle = op.handle.clone();
                let now = self
                    .registry(move |r| r.find_by_handle(handle.as_str()))
                    .await
                    .map_err(|e| e.of(&op))?
                    .ok_or_else(|| unknown_operation(op.handle.as_str()))?;
                return Box::pin(self.continue_operation(spender, now)).await;
            }
        };
        self.run(spender, op, generation, leased_at, None, request)
            .await
    }

    /// Executes a pending operation whose dispatch lease this process holds (under
    /// `generation`, the fencing token every write below carries, asked for at `leased_at`),
    /// records the outcome, and answers it.
    async fn run<S: Spender>(
        &self,
        spender: &S,
        op: Operation,
        generation: i64,
        leased_at: tokio::time::Instant,
        staged: Option<Staged>,
        request: Option<S::Request>,
    ) -> Result<Reply, ToolError> {
        if leased_at.elapsed() >= self.opts.lease_ttl.mul_f64(ABANDON_AFTER) {
            // The server computed the lease's expiry when its statement began, before any wait
            // for the row, so it may have expired before the claim returned: another process
            // may hold it by now. Nothing was sent; the next delivery claims it afresh.
            tracing::warn!(handle = %op.handle, "the dispatch lease came back too late to be trusted; not dispatched");
            self.give_up_lease(&op, generation).await;
            return Err(lease_came_late(&op, leased_at.elapsed()));
        }
        let Some(outcome) = self
            .execute_renewing(spender, &op, generation, leased_at, staged, request)
            .await
        else {
            let err = abandoned(&op, self.opts.lease_ttl);
            if op.at_most_once {
                return Err(self.in_doubt::<S>(op, generation, err).await);
            }
            // The lease is left to expire: the request may still be at the backend.
            return Err(err);
        };
        let (result, charged_cents, answer, settle) = match outcome {
            Outcome::Done {
                result,
                charged_cents,
                answer,
            } => (result, charged_cents, answer, None),
            Outcome::Settling {
                result,
                charged_cents,
                answer,
                settle,
            } => (result, charged_cents, answer, Some(settle.0)),
            Outcome::Refused { code, message } => {
                return self.refused(op, generation, code, message).await;
            }
            Outcome::Open(err) if op.at_most_once => {
                return Err(self.in_doubt::<S>(op, generation, err).await);
            }
            Outcome::Open(err) | Outcome::NotSent(err) => {
                self.give_up_lease(&op, generation).await;
                return Err(err.of(&op));
            }
        };
        let mut done = op.clone();
        done.status = Status::Completed;
        done.charged_cents = Some(charged_cents);
        done.result = Some(result.clone());
        crashpoint::hit(Boundary::BeforeResultRecorded);
        let handle = op.handle.clone();
        // The result and the spender's layers' record of it: one commit (group commit).
        self.write(|reply| Write::Result {
            handle,
            result,
            charged_cents,
            generation,
            settle,
            reply,
        })
        .await
        .map_err(|e| ToolError::unrecorded(&op, &answer, &e))?;
        self.remember(spender, &done);
        crashpoint::hit(Boundary::BeforeReply);
        tracing::info!(handle = %op.handle, "operation completed");
        Ok(spender.completed(&done, false))
    }

    /// Records a final refusal and answers it.
    async fn refused(
        &self,
        op: Operation,
        generation: i64,
        code: ToolCode,
        message: String,
    ) -> Result<Reply, ToolError> {
        let handle = op.handle.clone();
        let (c, m) = (code.to_string(), message.clone());
        self.registry(move |r| r.record_failure(&handle, generation, &c, &m))
            .await
            .map_err(|e| {
                ToolError::unrecorded(&op, &format!("refused with `{code}`, nothing charged"), &e)
            })?;
        let mut failed = op.clone();
        failed.status = Status::Failed;
        Err(ToolError::new(
            code,
            format!("{message}; this operation is final, redelivering it returns this error again"),
        )
        .of(&failed))
    }

    /// Renders the replay of a completed, durably recorded operation once (marked replayed,
    /// scrubbed of its key) and keeps it in the [`ReplayCache`] for the next redelivery.
    fn remember<S: Spender>(&self, spender: &S, op: &Operation) -> Arc<Cached> {
        let mut reply = spender.completed(op, true);
        let n = reply.scrub(&self.scrubber, &[&op.key]);
        if n > 0 {
            tracing::warn!(handle = %op.handle, strings = n, "scrubbed private keys from a reply");
        }
        let cached = Arc::new(Cached::new(op.request_hash.clone(), reply.into_result()));
        self.replies.insert(
            replay::key(&op.platform, &op.source_installation, &op.harness_call_id),
            cached.clone(),
        );
        cached
    }

    /// Lets another delivery (or process) dispatch a pending operation this one gave up on:
    /// its backend is idempotent, or nothing reached it.
    async fn give_up_lease(&self, op: &Operation, generation: i64) {
        let handle = op.handle.clone();
        if let Err(e) = self
            .registry(move |r| r.release_lease(&handle, generation))
            .await
        {
            tracing::warn!("cannot release the dispatch lease: {}", e.message);
        }
    }

    /// An at-most-once operation dispatched under `generation` whose outcome is unknown
    /// (`err`): recorded as [`Status::InDoubt`] and answered so. When the mark cannot be
    /// written, the row keeps its dispatch mark, so the next claim marks it instead: either
    /// way it is never sent again.
    async fn in_doubt<S: Spender>(
        &self,
        op: Operation,
        generation: i64,
        err: ToolError,
    ) -> ToolError {
        let reason = err.cause.clone().unwrap_or_else(|| err.message.clone());
        let (handle, why) = (op.handle.clone(), reason.clone());
        match self
            .registry(move |r| r.mark_in_doubt(&handle, generation, &why))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(handle = %op.handle, "the lease was taken over before the operation could be marked in doubt")
            }
            Err(e) => {
                tracing::warn!(handle = %op.handle, "cannot mark the operation in doubt now ({}); the next delivery will", e.message)
            }
        }
        tracing::warn!(handle = %op.handle, reason = %reason, "operation in doubt");
        let mut doubtful = op;
        doubtful.status = Status::InDoubt;
        doubtful.error = Some((ToolCode::OutcomeInDoubt.code().into(), reason));
        in_doubt::<S>(&doubtful, &self.opts.registry)
    }

    /// Runs the spender on a leased operation (asked for at `leased_at`), renewing the lease
    /// every third of its lifetime (counted from `leased_at`) until the spender answers, so a live dispatcher's lease never
    /// lapses however long the backend takes. A renewal that finds the lease gone is logged:
    /// this dispatcher's writes will then be fenced. When no renewal succeeded for
    /// [`ABANDON_AFTER`] of the lifetime (the registry is unreachable), it stops waiting for the
    /// spender (`None`), before the lease can expire and another process take the operation
    /// over: a lease on the server runs from the moment its statement ran, after the moment the
    /// statement was sent, which is what this process counts from. A process woken after its
    /// lease could have expired (paused) waits for the spender's answer instead.
    async fn execute_renewing<S: Spender>(
        &self,
        spender: &S,
        op: &Operation,
        generation: i64,
        leased_at: tokio::time::Instant,
        staged: Option<Staged>,
        request: Option<S::Request>,
    ) -> Option<Outcome> {
        let ttl = self.opts.lease_ttl;
        let period = (ttl / 3).max(Duration::from_millis(10));
        let (registry, location, handle) = (
            self.registry.clone(),
            self.opts.registry.clone(),
            op.handle.clone(),
        );
        let (renewed_tx, mut renewed) = tokio::sync::watch::channel(leased_at);
        let renewer = tokio::spawn(async move {
            // Counted from when the lease was asked for, as the abandon deadline below is: a
            // claim (or a new row's insert) that waited in the registry renews at once.
            let mut tick = tokio::time::interval_at(leased_at + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let h = handle.clone();
                let sent = tokio::time::Instant::now();
                let renewed = on_registry(registry.clone(), location.clone(), move |r| {
                    r.renew_lease(&h, generation, ttl)
                })
                .await;
                match renewed {
                    Ok(true) => {
                        renewed_tx.send_replace(sent);
                    }
                    Ok(false) => {
                        tracing::warn!(handle = %handle, "the dispatch lease was taken over while the backend was working; this process will not record its outcome");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(handle = %handle, "cannot renew the dispatch lease: {}", e.message)
                    }
                }
            }
        });
        let work = async {
            let request = match request.map_or_else(|| spender.recorded(op), Ok) {
                Ok(request) => request,
                Err(e) => return Outcome::Open(e),
            };
            match staged {
                Some(staged) => spender.execute_staged(op, &request, staged).await,
                None => spender.execute(op, &request).await,
            }
        };
        tokio::pin!(work);
        // Whether the renewer still runs (it stops once the lease is no longer this process's).
        let mut renewing = true;
        // Whether giving up can still keep the lease from lapsing under a waiting dispatcher.
        let mut watching = true;
        let outcome = loop {
            let last = *renewed.borrow_and_update();
            let deadline = last + ttl.mul_f64(ABANDON_AFTER);
            tokio::select! {
                biased;
                outcome = &mut work => break Some(outcome),
                changed = renewed.changed(), if renewing => renewing = changed.is_ok(),
                _ = tokio::time::sleep_until(deadline), if watching => {
                    if renewed.has_changed().unwrap_or(false) {
                        continue;
                    }
                    if tokio::time::Instant::now() >= last + ttl {
                        // Woken past the lease (the process was paused): another process may
                        // hold it already, so giving up keeps no one out. The answer, if it
                        // comes, is recorded only under this lease (fencing), or settles the
                        // doubt of an at-most-once operation.
                        watching = false;
                        continue;
                    }
                    tracing::warn!(handle = %op.handle, "the dispatch lease could not be renewed; stopped waiting for the backend before the lease expires");
                    break None;
                }
            }
        };
        renewer.abort();
        outcome
    }

    /// `operation_status`: the state of an operation by handle, and its recorded result.
    pub async fn operation_status(&self, args: Value) -> Reply {
        match self.handle_argument(&args).await {
            Ok(op) => {
                let mut structured =
                    json!({"handle": op.handle.as_str(), "status": op.status.name()});
                if let Some(r) = op.result.as_ref().and_then(|r| r.get("result")) {
                    structured["result"] = r.clone();
                }
                let mut text = format!("operation `{}` is {}", op.handle, op.status.name());
                match (&op.error, op.status) {
                    (Some((_, message)), Status::InDoubt) => {
                        structured["in_doubt"] = json!({"reason": message});
                        text.push_str(&format!(
                            ": {message}; it will not be sent again until a person checks the \
                             backend and resolves it, and a new call would be a new charge"
                        ));
                    }
                    (Some((code, message)), _) => {
                        structured["failure"] = json!({"code": code, "message": message});
                    }
                    (None, _) => {}
                }
                if let Some((authorized, charged)) = op.overcharge() {
                    structured["overcharge"] = overcharge_json(authorized, charged);
                    text.push_str(&overcharge_text(authorized, charged));
                }
                Reply::Ok {
                    structured,
                    text,
                    replayed: None,
                }
            }
            Err(e) => e.into(),
        }
    }

    /// `resume_operation`: runs an approved operation, or answers its recorded outcome.
    pub async fn resume_operation<S: Spender>(
        &self,
        spender: &S,
        args: Value,
    ) -> (Reply, Vec<OperationKey>) {
        let op = match self.handle_argument(&args).await {
            Ok(op) => op,
            Err(e) => return (e.into(), vec![]),
        };
        let keys = vec![op.key.clone()];
        let flight = self.flight(&op.platform, &op.source_installation, &op.harness_call_id);
        let guard = flight.lock().await;
        let handle = op.handle.clone();
        let result = match self
            .registry(move |r| r.find_by_handle(handle.as_str()))
            .await
        {
            // Boxed like a spend's steps (see `spend`).
            Ok(Some(now)) => Box::pin(self.continue_operation(spender, now)).await,
            Ok(None) => Err(unknown_operation(op.handle.as_str())),
            Err(e) => Err(e),
        };
        drop(guard);
        self.forget_flight(
            &op.platform,
            &op.source_installation,
            &op.harness_call_id,
            flight,
        );
        (result.unwrap_or_else(Reply::Err), keys)
    }

    async fn handle_argument(&self, args: &Value) -> Result<Operation, ToolError> {
        self.opts
            .identity_sources
            .check_arguments(args)
            .map_err(identity_error)?;
        let map = args.as_object().expect("arguments are an object");
        if let Some(extra) = map.keys().find(|k| *k != "handle") {
            return Err(ToolError::new(
                ToolCode::InvalidArguments,
                format!("unknown argument `{extra}`; this tool takes only `handle`"),
            ));
        }
        let handle = match map.get("handle") {
            Some(Value::String(h)) if !h.is_empty() => h.clone(),
            _ => {
                return Err(ToolError::new(
                    ToolCode::InvalidArguments,
                    "`handle` is required: the public operation handle (`hubu:public-operation:v1:...`) a spend returned",
                ));
            }
        };
        let lookup = handle.clone();
        self.registry(move |r| r.find_by_handle(&lookup))
            .await?
            .ok_or_else(|| unknown_operation(&handle))
    }

    /// The single-flight lock of one call identity (this process's installation).
    fn flight(&self, platform: &str, installation: &str, call_id: &str) -> Flight {
        let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((
            platform.to_string(),
            installation.to_string(),
            call_id.to_string(),
        ))
        .or_default()
        .clone()
    }

    fn forget_flight(&self, platform: &str, installation: &str, call_id: &str, flight: Flight) {
        drop(flight);
        let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        let k = (
            platform.to_string(),
            installation.to_string(),
            call_id.to_string(),
        );
        if map.get(&k).is_some_and(|f| Arc::strong_count(f) == 1) {
            map.remove(&k);
        }
    }

    /// Hands a write to the registry's writer thread and waits for its answer, which comes
    /// only once its commit returned.
    async fn write<R>(
        &self,
        write: impl FnOnce(oneshot::Sender<Result<R, RegistryError>>) -> Write<Staged>,
    ) -> Result<R, ToolError> {
        let stopped = || {
            ToolError::new(
                ToolCode::RegistryUnavailable,
                "the registry's writer stopped; nothing more can be recorded until the router \
                 restarts",
            )
        };
        let (reply, answer) = oneshot::channel();
        self.writes.send(write(reply)).map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(ToolError::registry)
    }

    /// Runs `f` on the registry (opening it first if it is not open yet) off the async threads.
    pub async fn registry<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Registry) -> Result<R, RegistryError> + Send + 'static,
    ) -> Result<R, ToolError> {
        on_registry(self.registry.clone(), self.opts.registry.clone(), f).await
    }

    async fn claim_key(&self, handle: &PublicHandle) -> Result<OperationKey, ToolError> {
        let pool = self.pool.clone().expect("called in preallocated mode");
        let path = self
            .opts
            .preallocated_keys
            .clone()
            .expect("preallocated mode");
        let handle = handle.as_str().to_string();
        tokio::task::spawn_blocking(move || {
            let mut guard = pool.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                *guard = Some(KeyPool::open(&path)?);
            }
            guard.as_mut().expect("opened above").claim(&handle)
        })
        .await
        .map_err(|e| {
            ToolError::new(
                ToolCode::RegistryUnavailable,
                format!("key pool task failed: {e}"),
            )
        })?
        .map_err(|e: KeyPoolError| ToolError::new(ToolCode::RegistryUnavailable, e.to_string()))
    }
}

/// Runs `f` on `registry` (opening it at `location` first if it is not open yet) off the async
/// threads: [`Core::registry`], for tasks that outlive a borrow of the core.
async fn on_registry<R: Send + 'static>(
    registry: Arc<Mutex<Option<Registry>>>,
    location: RegistryLocation,
    f: impl FnOnce(&mut Registry) -> Result<R, RegistryError> + Send + 'static,
) -> Result<R, ToolError> {
    tokio::task::spawn_blocking(move || {
        let mut guard = registry.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Registry::open(&location)?);
        }
        f(guard.as_mut().expect("opened above"))
    })
    .await
    .map_err(|e| {
        ToolError::new(
            ToolCode::RegistryUnavailable,
            format!("registry task failed: {e}"),
        )
    })?
    .map_err(ToolError::registry)
}

/// The most writes one group commit takes.
const MAX_BATCH: usize = 64;

/// How many writer threads a PostgreSQL registry gets, each with a connection of its own: the
/// server runs their transactions side by side (rows, not writers, lock one another), where a
/// SQLite file has one writer and group commit.
const PG_WRITERS: usize = 2;

/// A registry writer thread: takes the writes queued while its previous commit ran (up to
/// `batch`) and gives them one commit ([`Registry::write_batch`]), until every [`Core`] sender
/// is gone. A write is answered only once its commit returned, so nothing is dispatched before
/// its row is durable and nothing replies before its result is. A panic inside a batch answers
/// its writes with an error (their channels close) and the thread goes on.
///
/// Look-ups ([`Core::registry`]) never wait for a writer: on a SQLite file the writer has a
/// connection of its own (WAL lets the core read the last commit meanwhile); on PostgreSQL each
/// writer is a [sibling](Registry::sibling) of the core's registry. A failed open is tried
/// again at the next batch, whose writes get the error until it opens.
fn write_batches(
    mut writer: Writer,
    location: &RegistryLocation,
    queue: &Mutex<std::sync::mpsc::Receiver<Write<Staged>>>,
    batch: usize,
) {
    match &mut writer {
        Writer::Own(registry) => *registry = Registry::open(location).ok(),
        Writer::Sibling { core, own } => {
            // Connected now, not by the first write: that write's lease is counted from before
            // it was queued, and a connection's set-up (session, schema check, liveness) inside
            // it made a first spend's lease come back too late (4.2 s at a load of 18).
            *own = core
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(Registry::sibling);
            if let Some(registry) = own {
                let _ = registry.find_by_handle("");
            }
        }
    }
    loop {
        let writes = {
            let queue = queue.lock().unwrap_or_else(|p| p.into_inner());
            let Ok(first) = queue.recv() else {
                return;
            };
            let mut writes = vec![first];
            writes.extend(queue.try_iter().take(batch - 1));
            writes
        };
        let opened = match &mut writer {
            Writer::Own(registry) => match registry {
                Some(_) => Ok(()),
                None => Registry::open(location).map(|r| *registry = Some(r)),
            },
            Writer::Sibling { core, own } => match own {
                Some(_) => Ok(()),
                None => {
                    let mut core = core.lock().unwrap_or_else(|p| p.into_inner());
                    let opened = match core.as_ref() {
                        Some(_) => Ok(()),
                        None => Registry::open(location).map(|r| *core = Some(r)),
                    };
                    *own = core.as_ref().and_then(Registry::sibling);
                    opened
                }
            },
        };
        if let Err(e) = opened {
            for write in writes {
                write.fail(&e);
            }
            continue;
        }
        let open = match &mut writer {
            Writer::Own(registry) => registry.as_mut(),
            Writer::Sibling { own, .. } => own.as_mut(),
        }
        .expect("opened above");
        let done =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open.write_batch(writes)));
        if done.is_err() {
            tracing::error!("a group commit panicked; its writes were answered with an error");
        }
    }
}

/// The registry a writer thread commits through.
enum Writer {
    /// A connection of its own (a SQLite file).
    Own(Option<Registry>),
    /// A sibling of the core's registry (PostgreSQL): a replica's dispatch leases are fenced by
    /// its liveness lock, which siblings share, so a lease the writer takes can be fenced by the
    /// core and by the other writers.
    Sibling {
        core: Arc<Mutex<Option<Registry>>>,
        own: Option<Registry>,
    },
}

/// The answer of a dispatcher that stopped waiting for the backend because it could not renew
/// its lease ([`ABANDON_AFTER`]).
fn abandoned(op: &Operation, ttl: Duration) -> ToolError {
    ToolError::new(
        ToolCode::OutcomeUnknown,
        format!(
            "operation `{}` was dispatched, but its dispatch lease could not be renewed in the \
             registry for {:.1} s, so this router stopped waiting for the backend before the \
             lease could expire and another router process take the operation over; whether the \
             backend charged is unknown: redeliver this same call (same call id, same arguments) \
             to settle it without a second charge, and do not make a new call for it",
            op.handle,
            ttl.mul_f64(ABANDON_AFTER).as_secs_f64()
        ),
    )
    .of(op)
}

/// The answer of a delivery whose dispatch lease came back too late to be trusted
/// ([`ABANDON_AFTER`] of its lifetime after it was asked for, `took` in all): nothing was sent.
fn lease_came_late(op: &Operation, took: Duration) -> ToolError {
    ToolError::new(
        ToolCode::OperationInProgress,
        format!(
            "operation `{}` was not dispatched: taking its dispatch lease took {:.1} s in the \
             registry, long enough that another router process may have taken it over; retry \
             the same call shortly: it is safe and will return that operation's result",
            op.handle,
            took.as_secs_f64()
        ),
    )
    .of(op)
}

fn unknown_operation(handle: &str) -> ToolError {
    ToolError::new(
        ToolCode::UnknownOperation,
        format!(
            "no operation has handle `{handle}` in this router's registry; use the handle a spend \
             result or error returned"
        ),
    )
}

fn awaiting_approval<S: Spender>(op: &Operation, registry: &RegistryLocation) -> ToolError {
    ToolError::new(
        ToolCode::AwaitingApproval,
        format!(
            "operation `{}` ({} cents) needs a person's approval and nothing was spent; ask the \
             operator to run `{} approve {} --registry {}`, then call `resume_operation` with \
             this handle (redelivering this call never skips the approval)",
            op.handle,
            op.amount_cents,
            S::OPERATOR,
            op.handle,
            registry.display()
        ),
    )
    .of(op)
}

/// The answer for an operation whose outcome is unknown and that is never sent again
/// ([`Status::InDoubt`]): what happened, that a person must check the backend, the command that
/// records their answer, and that a new call would be a new charge.
fn in_doubt<S: Spender>(op: &Operation, registry: &RegistryLocation) -> ToolError {
    let reason = op
        .error
        .as_ref()
        .map(|(_, m)| m.as_str())
        .unwrap_or("its outcome was not recorded");
    ToolError::new(
        ToolCode::OutcomeInDoubt,
        format!(
            "operation `{handle}` ({cents} cents) was sent to a backend that does not honour \
             idempotency keys, and its outcome is unknown: {reason}. It may have been charged, so \
             it will not be sent again, on this or any redelivery. A person must check the \
             backend and record what happened: `{operator} resolve {handle} --charged` (or \
             `--not-charged`, after which a redelivery sends it once more) `--registry {registry}`. \
             Do not make a new call for it: that would be a new operation and a new charge",
            handle = op.handle,
            cents = op.amount_cents,
            operator = S::OPERATOR,
            registry = registry.display(),
        ),
    )
    .of(op)
}

fn denied(op: &Operation) -> ToolError {
    let reason = op
        .error
        .as_ref()
        .map(|(_, m)| m.clone())
        .unwrap_or_else(|| "a person denied this operation".into());
    ToolError::new(
        ToolCode::OperationDenied,
        format!(
            "operation `{}` was denied ({reason}); nothing was spent, and redelivering it will not \
             run it",
            op.handle
        ),
    )
    .of(op)
}

fn recorded_failure<S: Spender>(op: &Operation) -> ToolError {
    let (code, message) = op.error.clone().unwrap_or_else(|| {
        (
            ToolCode::ProviderError.code().into(),
            "the operation failed".into(),
        )
    });
    let code = S::ERROR_CODES
        .iter()
        .copied()
        .find(|c| c.code() == code)
        .unwrap_or(ToolCode::ProviderError);
    ToolError::new(
        code,
        format!("{message}; this operation is final, redelivering it returns this error again"),
    )
    .of(op)
}
