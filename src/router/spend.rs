//! The per-call pipeline: what the router does with each tool call, in the article's order.
//!
//! [`Router::call_tool`] answers one `tools/call`. For the spend tool `generate_image`:
//! 1. identity in the arguments is refused ([`identity::check_arguments`]);
//! 2. the trusted identity is read from `_meta` ([`identity::from_meta_map`]), failing closed;
//! 3. the request is hashed ([`canonical::request_hash`]) and its arguments checked;
//! 4. the registry is looked up by (platform, installation, the envelope's installation, harness
//!    call id);
//! 5. resolved: a new call gets a fresh private key and public handle, and its row is committed
//!    before anything is dispatched; the same id with the same hash returns the recorded result
//!    (marked replayed) or, with none recorded yet, continues the same operation under the same
//!    key; the same id with another hash is refused (`request_mismatch`) before the backend;
//! 6. the backend is called with the private key, the result recorded, then the reply sent.
//!
//! Every reply, success or error, passes through the [`Scrubber`] before it leaves.
//!
//! # Honest errors
//! An error says "nothing was dispatched" only where that is true of the call being answered.
//! Once the backend has been called, an error carries the operation's handle; if its answer
//! cannot be recorded, the code is `outcome_unknown`: the provider may have charged, and
//! redelivering *the same call* settles it (it continues the operation under the same key, which
//! every layer behind the router answers with the original charge), whereas a new call would be
//! charged again.
//!
//! # Concurrency
//! Single flight per call identity within a process: deliveries of the same call wait on one
//! async lock, so the first dispatches and the later ones find its recorded result and return it
//! marked replayed. Across processes sharing a registry, the row's dispatch lease decides: a
//! delivery that finds another live process dispatching gets `operation_in_progress`, which is
//! safe to retry (see `registry.rs`).

use super::diagnose::{CallInfo, Diagnostics};
use super::policy::Policy;
use super::preallocated::{KeyPool, KeyPoolError};
use super::registry::{
    Lease, NewOperation, Operation, Registry, RegistryError, RegistryLocation, Status,
    process_owner, retire_owner,
};
use super::scrub::Scrubber;
use crate::backend::{Backend, BackendConfig, BackendError, ProviderTarget, SpendReceipt};
use crate::canonical::{self, RequestHash};
use crate::crashpoint::{self, Boundary};
use crate::identity::{self, Identity, Source};
use crate::keys::{OperationKey, PublicHandle};
use crate::provider::ImageRequest;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The spend tool.
pub const GENERATE_IMAGE: &str = "generate_image";
/// Status of an operation by handle.
pub const OPERATION_STATUS: &str = "operation_status";
/// Runs an approved operation.
pub const RESUME_OPERATION: &str = "resume_operation";
/// What this router accepts (read-only).
pub const CAPABILITIES: &str = "capabilities";
/// `_meta` key of a result that says whether it was replayed.
pub const REPLAYED_META: &str = "callid/replayed";
/// How long a dispatch lease holds off other processes (longer than any backend call).
pub const LEASE_TTL: Duration = Duration::from_secs(120);

/// Every error code a tool call of this router can answer.
pub const ERROR_CODES: &[&str] = &[
    "missing_identity",
    "ambiguous_identity",
    "invalid_identity",
    "identity_in_arguments",
    "non_canonical_arguments",
    "invalid_arguments",
    "request_mismatch",
    "operation_in_progress",
    "awaiting_approval",
    "operation_denied",
    "unknown_operation",
    "registry_unavailable",
    "outcome_unknown",
    "backend_state_corrupt",
    "budget_exceeded",
    "create_new_operation",
    "unknown_model",
    "provider_unavailable",
    "provider_error",
];

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// The registry: a SQLite file, or a PostgreSQL database shared by replicas.
    pub registry: RegistryLocation,
    /// The provider over HTTP (URL and token, redacted when shown); `None` runs it in-process
    /// beside the registry.
    pub provider: Option<crate::provider::Endpoint>,
    /// Approval and budget.
    pub policy: Policy,
    /// A preallocated-key database to claim keys from.
    pub preallocated_keys: Option<PathBuf>,
    /// Prefix of private keys.
    pub key_prefix: String,
    /// Prefix of public handles.
    pub handle_prefix: String,
    /// Append the shape of each call's `_meta` to this file.
    pub diagnose_meta: Option<PathBuf>,
    /// The identity sources spend calls are identified by: the built-in table, or one extended
    /// by `--identity-sources` ([`identity::IdentitySources::load`]).
    pub identity_sources: Arc<identity::IdentitySources>,
}

impl RouterOptions {
    /// Options with defaults for everything but the registry.
    pub fn new(registry: impl Into<RegistryLocation>) -> Self {
        RouterOptions {
            registry: registry.into(),
            provider: None,
            policy: Policy::default(),
            preallocated_keys: None,
            key_prefix: crate::keys::DEFAULT_KEY_PREFIX.into(),
            handle_prefix: crate::keys::DEFAULT_HANDLE_PREFIX.into(),
            diagnose_meta: None,
            identity_sources: identity::IdentitySources::built_in_shared(),
        }
    }
}

/// A tool error: a stable code, a message that says what to do, and the operation if one exists.
#[derive(Debug, Clone)]
pub struct ToolError {
    /// Stable machine code (one of [`ERROR_CODES`]).
    pub code: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// The operation's public handle, if one exists.
    pub handle: Option<PublicHandle>,
    /// The operation's state, if one exists.
    pub status: Option<Status>,
    /// The underlying failure alone, without the advice of `message` (when it differs).
    pub cause: Option<String>,
}

impl ToolError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
            handle: None,
            status: None,
            cause: None,
        }
    }

    fn of(mut self, op: &Operation) -> Self {
        self.handle = Some(op.handle.clone());
        self.status = Some(op.status);
        self
    }

    fn registry(err: RegistryError) -> Self {
        let mut e = ToolError::new(
            "registry_unavailable",
            format!(
                "{err}; nothing was dispatched for this delivery, and retrying with the same call is safe once the registry is fixed"
            ),
        );
        e.cause = Some(err.to_string());
        e
    }

    /// The backend was called for `op` and answered (`answer`, saying whether money moved),
    /// but its answer could not be recorded.
    fn unrecorded(op: &Operation, answer: &str, cause: &ToolError) -> Self {
        ToolError::new(
            "outcome_unknown",
            format!(
                "operation `{}` was dispatched and the backend answered ({answer}), but the answer \
                 could not be recorded: {}; redeliver this same call (same call id, same \
                 arguments) to get the recorded outcome without a second charge, and do not make \
                 a new call for it",
                op.handle,
                cause.cause.as_deref().unwrap_or(&cause.message)
            ),
        )
        .of(op)
    }

    /// The `structuredContent` of this error.
    pub fn structured(&self) -> Value {
        let mut v = json!({"error": self.code, "message": self.message});
        if let Some(h) = &self.handle {
            v["handle"] = json!(h.as_str());
        }
        if let Some(s) = self.status {
            v["status"] = json!(s.name());
        }
        v
    }
}

/// A tool's answer before it is scrubbed and put on the wire.
#[derive(Debug)]
pub enum Reply {
    /// A result.
    Ok {
        /// `structuredContent`.
        structured: Value,
        /// The human summary.
        text: String,
        /// `Some` for spend results (`_meta["callid/replayed"]`).
        replayed: Option<bool>,
    },
    /// A tool error.
    Err(ToolError),
}

impl From<ToolError> for Reply {
    fn from(e: ToolError) -> Self {
        Reply::Err(e)
    }
}

impl Reply {
    /// The `CallToolResult` JSON of this reply.
    pub fn to_value(&self) -> Value {
        match self {
            Reply::Ok {
                structured,
                text,
                replayed,
            } => {
                let mut v = json!({
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": structured,
                });
                if let Some(r) = replayed {
                    v["_meta"] = json!({ REPLAYED_META: r });
                }
                v
            }
            Reply::Err(e) => json!({
                "isError": true,
                "content": [{"type": "text", "text": e.message}],
                "structuredContent": e.structured(),
            }),
        }
    }
}

type Flight = Arc<tokio::sync::Mutex<()>>;

/// The reference router's state: registry, backend, key pool, flights.
pub struct Router {
    opts: RouterOptions,
    registry: Arc<Mutex<Option<Registry>>>,
    pool: Option<Arc<Mutex<Option<KeyPool>>>>,
    backend: tokio::sync::Mutex<Option<Arc<Backend>>>,
    flights: Mutex<HashMap<(String, String, String), Flight>>,
    owner: String,
    scrubber: Scrubber,
    diagnostics: Option<Diagnostics>,
}

impl Drop for Router {
    fn drop(&mut self) {
        // Leases this instance still holds are free for any other instance at once.
        retire_owner(&self.owner);
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("opts", &self.opts).finish()
    }
}

impl Router {
    /// A router; opens the registry now if it can (a failure is logged, and every spend then
    /// fails closed with `registry_unavailable` until it opens).
    pub fn new(opts: RouterOptions) -> Router {
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
        let diagnostics = opts.diagnose_meta.as_ref().and_then(|path| {
            Diagnostics::open(path, opts.identity_sources.clone())
                .map_err(|e| tracing::warn!("--diagnose-meta is off: {e}"))
                .ok()
        });
        Router {
            diagnostics,
            pool: opts
                .preallocated_keys
                .as_ref()
                .map(|_| Arc::new(Mutex::new(None))),
            scrubber: Scrubber::new(&opts.key_prefix),
            registry: Arc::new(Mutex::new(registry)),
            backend: tokio::sync::Mutex::new(None),
            flights: Mutex::new(HashMap::new()),
            owner: process_owner(),
            opts,
        }
    }

    /// The options this router runs with.
    pub fn options(&self) -> &RouterOptions {
        &self.opts
    }

    /// Answers one `tools/call`: the scrubbed `CallToolResult` JSON, or `None` for an unknown
    /// tool (a JSON-RPC error, since no tool ran).
    pub async fn call_tool(
        &self,
        call: &CallInfo,
        name: &str,
        arguments: Option<Map<String, Value>>,
        meta: &Map<String, Value>,
    ) -> Option<Value> {
        if let Some(d) = &self.diagnostics {
            d.record(call, name, arguments.as_ref(), meta);
        }
        let args = Value::Object(arguments.unwrap_or_default());
        let (reply, keys) = match name {
            GENERATE_IMAGE => self.generate_image(args, meta).await,
            OPERATION_STATUS => (self.operation_status(args).await, vec![]),
            RESUME_OPERATION => self.resume_operation(args).await,
            CAPABILITIES => (self.capabilities(args), vec![]),
            _ => return None,
        };
        if let Reply::Err(e) = &reply {
            tracing::info!(tool = name, code = e.code, handle = ?e.handle.as_ref().map(|h| h.as_str()), "tool error");
        }
        let mut value = reply.to_value();
        let refs: Vec<&OperationKey> = keys.iter().collect();
        let n = self.scrubber.scrub(&mut value, &refs);
        if n > 0 {
            tracing::warn!(
                tool = name,
                strings = n,
                "scrubbed private keys from a reply"
            );
        }
        Some(value)
    }

    /// Scrubs any value (used for JSON-RPC error messages too).
    pub fn scrub(&self, value: &mut Value) {
        self.scrubber.scrub(value, &[]);
    }

    async fn generate_image(
        &self,
        args: Value,
        meta: &Map<String, Value>,
    ) -> (Reply, Vec<OperationKey>) {
        let mut keys = vec![];
        let reply = match self.spend(args, meta, &mut keys).await {
            Ok(r) => r,
            Err(e) => e.into(),
        };
        (reply, keys)
    }

    async fn spend(
        &self,
        args: Value,
        meta: &Map<String, Value>,
        keys: &mut Vec<OperationKey>,
    ) -> Result<Reply, ToolError> {
        let sources = &self.opts.identity_sources;
        sources.check_arguments(&args).map_err(identity_error)?;
        let id = sources.from_meta_map(meta).map_err(identity_error)?;
        let hash = canonical::request_hash(GENERATE_IMAGE, &args)
            .map_err(|e| ToolError::new(e.code(), format!("{e}; nothing was dispatched")))?;
        let request = image_request(&args)?;

        let flight = self.flight(&id.platform, id.key_installation(), &id.harness_call_id);
        let guard = flight.lock().await;
        let (platform, installation, call_id) = (
            id.platform.clone(),
            id.key_installation().to_string(),
            id.harness_call_id.clone(),
        );
        let existing = self
            .registry(move |r| r.find(&platform, &installation, &call_id))
            .await;
        let result = match existing {
            Ok(Some(op)) => {
                keys.push(op.key.clone());
                self.resolve_existing(op, &hash).await
            }
            Ok(None) => self.start(&id, args, hash, request, keys).await,
            Err(e) => Err(e),
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

    async fn start(
        &self,
        id: &Identity,
        args: Value,
        hash: RequestHash,
        request: ImageRequest,
        keys: &mut Vec<OperationKey>,
    ) -> Result<Reply, ToolError> {
        let backend = self.backend().await?;
        let amount = backend.quote(&request).map_err(backend_error)?;
        let needs_approval = self.opts.policy.needs_approval(amount, &request.model);
        let handle = PublicHandle::generate(&self.opts.handle_prefix);
        let key = match &self.pool {
            None => OperationKey::generate(&self.opts.key_prefix, &id.platform),
            Some(_) if id.source != Source::CodexCallId => {
                return Err(ToolError::new(
                    "invalid_identity",
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
            tool: GENERATE_IMAGE.into(),
            request_hash: hash.clone(),
            arguments: args,
            amount_cents: amount,
            needs_approval,
        };
        let (op, created) = self.registry(move |r| r.insert_or_get(new)).await?;
        if !created {
            // Another process recorded this call between our lookup and our insert.
            keys.push(op.key.clone());
            return self.resolve_existing(op, &hash).await;
        }
        crashpoint::hit(Boundary::AfterRowCommit);
        tracing::info!(handle = %op.handle, platform = %op.platform, amount, needs_approval, "operation recorded");
        if op.status == Status::AwaitingApproval {
            return Err(awaiting_approval(&op, &self.opts.registry));
        }
        self.dispatch(op).await
    }

    async fn resolve_existing(
        &self,
        op: Operation,
        hash: &RequestHash,
    ) -> Result<Reply, ToolError> {
        if &op.request_hash != hash {
            return Err(ToolError::new(
                "request_mismatch",
                format!(
                    "this call id was already used for a different request (operation `{}`); one \
                     call cannot be reused for different work: make a new tool call for the new \
                     request; nothing was dispatched",
                    op.handle
                ),
            )
            .of(&op));
        }
        self.continue_operation(op).await
    }

    /// Answers a recorded operation: replays what is recorded, or runs what is pending.
    async fn continue_operation(&self, op: Operation) -> Result<Reply, ToolError> {
        match op.status {
            Status::Completed => Ok(completed(&op, true)),
            Status::Failed => Err(recorded_failure(&op)),
            Status::Denied => Err(denied(&op)),
            Status::AwaitingApproval => Err(awaiting_approval(&op, &self.opts.registry)),
            Status::Pending => self.dispatch(op).await,
        }
    }

    async fn dispatch(&self, op: Operation) -> Result<Reply, ToolError> {
        let owner = self.owner.clone();
        let handle = op.handle.clone();
        let lease = self
            .registry(move |r| r.claim_lease(&handle, &owner, LEASE_TTL))
            .await
            .map_err(|e| e.of(&op))?;
        match lease {
            Lease::Granted => {}
            Lease::HeldElsewhere => {
                return Err(ToolError::new(
                    "operation_in_progress",
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
                return Box::pin(self.continue_operation(now)).await;
            }
        }
        let request = image_request(&op.arguments).map_err(|e| e.of(&op))?;
        let backend = match self.backend().await {
            Ok(b) => b,
            Err(e) => {
                self.give_up_lease(&op).await;
                return Err(e.of(&op));
            }
        };
        match backend.spend(&op.key, &request, &op.request_hash).await {
            Ok(receipt) => {
                let mut done = op.clone();
                done.status = Status::Completed;
                done.charged_cents = Some(receipt.amount_cents);
                done.result = Some(json!({
                    "handle": op.handle.as_str(),
                    "status": Status::Completed.name(),
                    "result": receipt_json(&receipt),
                }));
                crashpoint::hit(Boundary::BeforeResultRecorded);
                let handle = op.handle.clone();
                let result = done.result.clone().expect("set above");
                let charged = receipt.amount_cents;
                self.registry(move |r| r.record_result(&handle, &result, charged))
                    .await
                    .map_err(|e| {
                        ToolError::unrecorded(
                            &op,
                            &format!("the provider charged {} cents", receipt.amount_cents),
                            &e,
                        )
                    })?;
                crashpoint::hit(Boundary::BeforeReply);
                tracing::info!(handle = %op.handle, "operation completed");
                Ok(completed(&done, false))
            }
            Err(err) => {
                let code = backend_code(&err);
                let message = chain(&err);
                if is_final(&err) {
                    let handle = op.handle.clone();
                    let (c, m) = (code.to_string(), message.clone());
                    self.registry(move |r| r.record_failure(&handle, &c, &m))
                        .await
                        .map_err(|e| {
                            ToolError::unrecorded(
                                &op,
                                &format!("refused with `{code}`, nothing charged"),
                                &e,
                            )
                        })?;
                    let mut failed = op.clone();
                    failed.status = Status::Failed;
                    Err(ToolError::new(code, format!("{message}; this operation is final, redelivering it returns this error again")).of(&failed))
                } else {
                    self.give_up_lease(&op).await;
                    let advice = if err.is_state_corrupt() {
                        "an operator must repair or restore that file; until then every spend \
                         fails closed: do not retry, and do not make a new call"
                    } else {
                        "nothing more was charged than once: retry the same call, it continues \
                         this operation under the same key"
                    };
                    if err.is_state_corrupt() {
                        tracing::error!(handle = %op.handle, "backend state is corrupt: {message}");
                    }
                    Err(ToolError::new(code, format!("{message}; {advice}")).of(&op))
                }
            }
        }
    }

    /// Lets another delivery (or process) dispatch a pending operation this one gave up on.
    async fn give_up_lease(&self, op: &Operation) {
        let handle = op.handle.clone();
        let owner = self.owner.clone();
        if let Err(e) = self
            .registry(move |r| r.release_lease(&handle, &owner))
            .await
        {
            tracing::warn!("cannot release the dispatch lease: {}", e.message);
        }
    }

    async fn operation_status(&self, args: Value) -> Reply {
        match self.handle_argument(&args).await {
            Ok(op) => {
                let mut structured =
                    json!({"handle": op.handle.as_str(), "status": op.status.name()});
                if let Some(r) = op.result.as_ref().and_then(|r| r.get("result")) {
                    structured["result"] = r.clone();
                }
                if let Some((code, message)) = &op.error {
                    structured["failure"] = json!({"code": code, "message": message});
                }
                let mut text = format!("operation `{}` is {}", op.handle, op.status.name());
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

    async fn resume_operation(&self, args: Value) -> (Reply, Vec<OperationKey>) {
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
            Ok(Some(now)) => self.continue_operation(now).await,
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
                "invalid_arguments",
                format!("unknown argument `{extra}`; this tool takes only `handle`"),
            ));
        }
        let handle = match map.get("handle") {
            Some(Value::String(h)) if !h.is_empty() => h.clone(),
            _ => {
                return Err(ToolError::new(
                    "invalid_arguments",
                    "`handle` is required: the public operation handle (`hubu:public-operation:v1:...`) a spend returned",
                ));
            }
        };
        let lookup = handle.clone();
        self.registry(move |r| r.find_by_handle(&lookup))
            .await?
            .ok_or_else(|| unknown_operation(&handle))
    }

    fn capabilities(&self, args: Value) -> Reply {
        if let Err(e) = self.opts.identity_sources.check_arguments(&args) {
            return identity_error(e).into();
        }
        if let Some(extra) = args.as_object().and_then(|m| m.keys().next()) {
            return ToolError::new(
                "invalid_arguments",
                format!("unknown argument `{extra}`; `capabilities` takes no arguments"),
            )
            .into();
        }
        let policy = &self.opts.policy;
        let structured = json!({
            "router": "callid reference router",
            "version": env!("CARGO_PKG_VERSION"),
            "spend_tools": [GENERATE_IMAGE],
            "identity_sources": self.opts.identity_sources.capabilities(),
            "identity_rule": "exactly one source in `_meta`; none fails closed; identity-like argument names are refused",
            "limits": {
                "max_id_bytes": identity::MAX_ID_BYTES,
                "max_platform_bytes": identity::MAX_PLATFORM_BYTES,
            },
            "forbidden_argument_names": identity::FORBIDDEN_ARGUMENT_NAMES,
            "request_hash": "sha256(tool, 0x00, RFC 8785 canonical JSON of the arguments)",
            "approval": {
                "above_cents": policy.approval_above_cents,
                "models": policy.approval_models,
                "how": format!("an operator runs `callid router approve HANDLE --registry {}` or `deny`; then call `resume_operation` or redeliver the original call", self.opts.registry.display()),
            },
            "budget_cents": policy.budget_cents,
            "preallocated_keys": self.pool.is_some(),
            "new_operations_from": if self.pool.is_some() { json!(["codex"]) } else { json!("any accepted source") },
            "concurrency": "single flight per call within a router process; `operation_in_progress` (safe to retry) while another process sharing the registry dispatches",
            "retention": "operations are kept in the registry indefinitely; redelivery of any recorded call returns its recorded result",
            "models": crate::provider::prices::PRICES.iter().map(|(m, c)| json!({"model": m, "price_cents": c})).collect::<Vec<_>>(),
        });
        Reply::Ok {
            structured,
            text: "callid reference router: spends need exactly one trusted per-call id in `_meta` (`callId`, `claudecode/toolUseId` or `hubu.dev/platform-invocation`)".into(),
            replayed: None,
        }
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

    async fn registry<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Registry) -> Result<R, RegistryError> + Send + 'static,
    ) -> Result<R, ToolError> {
        let registry = self.registry.clone();
        let path = self.opts.registry.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = registry.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                *guard = Some(Registry::open(&path)?);
            }
            f(guard.as_mut().expect("opened above"))
        })
        .await
        .map_err(|e| ToolError::new("registry_unavailable", format!("registry task failed: {e}")))?
        .map_err(ToolError::registry)
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
        .map_err(|e| ToolError::new("registry_unavailable", format!("key pool task failed: {e}")))?
        .map_err(|e: KeyPoolError| ToolError::new("registry_unavailable", e.to_string()))
    }

    async fn backend(&self) -> Result<Arc<Backend>, ToolError> {
        let mut guard = self.backend.lock().await;
        if let Some(b) = guard.as_ref() {
            return Ok(b.clone());
        }
        let installation = self
            .registry(|r| Ok(r.installation_id().to_string()))
            .await?;
        let state_dir = self.opts.registry.local_state_dir(None);
        let target = match &self.opts.provider {
            Some(endpoint) => ProviderTarget::Http {
                endpoint: endpoint.clone(),
            },
            None => ProviderTarget::InProcess,
        };
        let config = BackendConfig {
            agent_id: format!("callid-router:{installation}"),
            account: "default".into(),
            budget_cents: self.opts.policy.budget_cents,
            reservation_expiry: self.opts.policy.reservation_expiry(),
            shared_state: match &self.opts.registry {
                RegistryLocation::Postgres(url) => Some(url.clone()),
                RegistryLocation::File(_) => None,
            },
        };
        let backend = Backend::open(&state_dir, target, config).map_err(|e| {
            let cause = chain(&e);
            if e.is_state_corrupt() {
                tracing::error!(
                    file = ?e.state_file(),
                    "backend state is corrupt, every spend fails closed until an operator \
                     repairs or restores it: {cause}"
                );
                ToolError::new(
                    "backend_state_corrupt",
                    format!(
                        "{cause}; nothing was dispatched for this delivery, and none will be \
                         until an operator repairs or restores that file: do not retry, and do \
                         not make a new call"
                    ),
                )
            } else {
                ToolError::new(
                    backend_code(&e),
                    format!(
                        "cannot open the backend state in `{}`: {cause}; nothing was dispatched \
                         for this delivery: retry the same call later",
                        state_dir.display()
                    ),
                )
            }
        })?;
        let backend = Arc::new(backend);
        *guard = Some(backend.clone());
        Ok(backend)
    }
}

fn identity_error(e: identity::IdentityError) -> ToolError {
    ToolError::new(e.code(), format!("{e}; nothing was dispatched"))
}

fn unknown_operation(handle: &str) -> ToolError {
    ToolError::new(
        "unknown_operation",
        format!(
            "no operation has handle `{handle}` in this router's registry; use the handle a spend \
             result or error returned"
        ),
    )
}

fn awaiting_approval(op: &Operation, registry: &RegistryLocation) -> ToolError {
    ToolError::new(
        "awaiting_approval",
        format!(
            "operation `{}` ({} cents) needs a person's approval and nothing was spent; ask the \
             operator to run `callid router approve {} --registry {}`, then call \
             `resume_operation` with this handle (redelivering this call never skips the \
             approval)",
            op.handle,
            op.amount_cents,
            op.handle,
            registry.display()
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
        "operation_denied",
        format!(
            "operation `{}` was denied ({reason}); nothing was spent, and redelivering it will not \
             run it",
            op.handle
        ),
    )
    .of(op)
}

fn recorded_failure(op: &Operation) -> ToolError {
    let (code, message) = op
        .error
        .clone()
        .unwrap_or_else(|| ("provider_error".into(), "the operation failed".into()));
    let code = ERROR_CODES
        .iter()
        .copied()
        .find(|c| *c == code)
        .unwrap_or("provider_error");
    ToolError::new(
        code,
        format!("{message}; this operation is final, redelivering it returns this error again"),
    )
    .of(op)
}

fn completed(op: &Operation, replayed: bool) -> Reply {
    let structured = op.result.clone().unwrap_or(Value::Null);
    let r = &structured["result"];
    let mut text = format!(
        "Generated image `{}` ({}x{}, {}) for {} cents. Operation `{}` is completed{}",
        r["image"]["id"].as_str().unwrap_or("?"),
        r["image"]["width"],
        r["image"]["height"],
        r["model"].as_str().unwrap_or("?"),
        r["amount_cents"],
        op.handle,
        if replayed {
            "; this call was already completed, so this is the recorded result and nothing new was charged"
        } else {
            ""
        }
    );
    if let Some((authorized, charged)) = op.overcharge() {
        text.push_str(&overcharge_text(authorized, charged));
    }
    text.push('.');
    Reply::Ok {
        structured,
        text,
        replayed: Some(replayed),
    }
}

/// Checks `generate_image` arguments against its schema and builds the provider request.
fn image_request(args: &Value) -> Result<ImageRequest, ToolError> {
    let invalid =
        |m: String| ToolError::new("invalid_arguments", format!("{m}; nothing was dispatched"));
    let map = args
        .as_object()
        .ok_or_else(|| invalid("arguments must be an object".into()))?;
    if let Some(extra) = map
        .keys()
        .find(|k| !["prompt", "width", "height", "model"].contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "unknown argument `{extra}`; `generate_image` takes `prompt`, `width`, `height` and `model`"
        )));
    }
    let prompt = match map.get("prompt") {
        Some(Value::String(p)) => p.clone(),
        Some(_) => return Err(invalid("`prompt` must be a string".into())),
        None => return Err(invalid("`prompt` is required: describe the image".into())),
    };
    let size = |name: &str| -> Result<u32, ToolError> {
        match map.get(name) {
            None => Ok(crate::provider::types::DEFAULT_SIZE),
            // `512.0` is the number 512 (the request hash agrees), so it is accepted.
            Some(v) => v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                })
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "`{name}` must be a positive integer number of pixels"
                    ))
                }),
        }
    };
    let model = match map.get("model") {
        None => crate::provider::prices::DEFAULT_MODEL.to_string(),
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(invalid("`model` must be a string".into())),
    };
    Ok(ImageRequest {
        prompt,
        width: size("width")?,
        height: size("height")?,
        model,
        max_amount_cents: None,
    })
}

/// The router's code for a backend error: the contract's codes, with the backend's own
/// `invalid_request` and `backend_state_unavailable` mapped onto `invalid_arguments` and
/// `registry_unavailable` (the backend's state files live beside the registry).
fn backend_code(err: &BackendError) -> &'static str {
    if err.is_state_corrupt() {
        return "backend_state_corrupt";
    }
    match err.code() {
        "invalid_request" => "invalid_arguments",
        "backend_state_unavailable" => "registry_unavailable",
        code => ERROR_CODES
            .iter()
            .copied()
            .find(|c| *c == code)
            .unwrap_or("provider_error"),
    }
}

/// A backend refusal is recorded and answered again on redelivery; a retryable failure leaves
/// the operation pending so that redelivery continues it under the same key.
fn is_final(err: &BackendError) -> bool {
    !err.is_retryable()
}

/// The error and its causes, as one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

fn backend_error(err: BackendError) -> ToolError {
    ToolError::new(
        backend_code(&err),
        format!("{}; nothing was dispatched", chain(&err)),
    )
}

/// The `result` member of a completed spend; a charge above the authorization is marked.
fn receipt_json(receipt: &SpendReceipt) -> Value {
    let mut v = json!({
        "charge_id": receipt.charge_id,
        "amount_cents": receipt.amount_cents,
        "model": receipt.model,
        "image": receipt.image,
    });
    if receipt.amount_cents > receipt.authorized_cents {
        v["overcharge"] = overcharge_json(receipt.authorized_cents, receipt.amount_cents);
    }
    v
}

fn overcharge_json(authorized: u64, charged: u64) -> Value {
    json!({"authorized_cents": authorized, "charged_cents": charged})
}

fn overcharge_text(authorized: u64, charged: u64) -> String {
    format!(
        "; WARNING: the provider charged {charged} cents although {authorized} were authorized; \
         the budget was debited by the full charge"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_request_table() {
        let ok = |args: Value, want: (&str, u32, u32, &str)| {
            let r = image_request(&args).unwrap();
            assert_eq!(
                (r.prompt.as_str(), r.width, r.height, r.model.as_str()),
                want,
                "{args}"
            );
        };
        ok(
            json!({"prompt": "fox"}),
            ("fox", 1024, 1024, "flux-schnell"),
        );
        ok(
            json!({"prompt": "fox", "width": 512.0, "height": 256, "model": "flux-pro"}),
            ("fox", 512, 256, "flux-pro"),
        );
        for bad in [
            json!({}),
            json!({"prompt": 3}),
            json!({"prompt": "fox", "width": -1}),
            json!({"prompt": "fox", "width": 1.5}),
            json!({"prompt": "fox", "height": "tall"}),
            json!({"prompt": "fox", "model": 1}),
            json!({"prompt": "fox", "seed": 1}),
            json!([1]),
        ] {
            assert_eq!(
                image_request(&bad).unwrap_err().code,
                "invalid_arguments",
                "{bad}"
            );
        }
    }

    #[test]
    fn replies_render_the_contract_shapes() {
        let handle = PublicHandle::from_stored(
            "hubu:public-operation:v1:00000000-0000-4000-8000-000000000000".into(),
        );
        let ok = Reply::Ok {
            structured: json!({"handle": handle.as_str(), "status": "completed", "result": {"charge_id": "ch_1", "amount_cents": 3}}),
            text: "Generated image".into(),
            replayed: Some(true),
        };
        let mut err = ToolError::new("awaiting_approval", "needs a person");
        err.handle = Some(handle);
        err.status = Some(Status::AwaitingApproval);
        let bare = ToolError::new("missing_identity", "no identity");
        insta::assert_json_snapshot!(
            "reply_shapes",
            json!({
                "success": ok.to_value(),
                "error_with_operation": Reply::Err(err).to_value(),
                "error_without_operation": Reply::Err(bare).to_value(),
            })
        );
    }

    #[test]
    fn backend_errors_map_onto_contract_codes_and_finality() {
        use crate::provider::ProviderError;
        let cases: Vec<(BackendError, &str, bool)> = vec![
            (
                BackendError::CreateNewOperation {
                    differs: "amount".into(),
                },
                "create_new_operation",
                true,
            ),
            (
                BackendError::BudgetExceeded {
                    account: "default".into(),
                    amount_cents: 3,
                    budget_cents: 4,
                    remaining_cents: 1,
                },
                "budget_exceeded",
                true,
            ),
            (
                BackendError::UnknownModel(ProviderError::UnknownModel { model: "x".into() }),
                "unknown_model",
                true,
            ),
            (
                BackendError::InvalidRequest(ProviderError::InvalidRequest { reason: "r".into() }),
                "invalid_arguments",
                true,
            ),
            (
                BackendError::ProviderError(ProviderError::KeyReused),
                "provider_error",
                true,
            ),
        ];
        for (err, code, last) in cases {
            assert_eq!(backend_code(&err), code, "{err}");
            assert_eq!(is_final(&err), last, "{err}");
            assert!(ERROR_CODES.contains(&backend_code(&err)));
        }
    }
}
