//! The built-in router's spender: `generate_image` in front of the backend layers.
//!
//! [`Router::call_tool`] answers one `tools/call`. The spend tool `generate_image` goes through
//! the tool-agnostic [`pipeline`](crate::spend::pipeline) (identity, request hash, registry, keys,
//! approvals, scrubbing, in the article's order); [`Router`] is its [`Spender`]: it checks the
//! arguments against the tool's schema, turning them into the provider's [`ImageRequest`] once,
//! prices that request, and spends it through the [`crate::backend`] layers with the private
//! key. `operation_status`, `resume_operation` and
//! `capabilities` spend nothing.
//!
//! # Honest errors
//! See [`crate::spend::pipeline`]. A backend refusal is recorded and answered again on redelivery; a
//! retryable failure leaves the operation pending so that redelivery continues it under the
//! same key, which every layer behind the router answers with the original charge.

use super::policy::Policy;
use super::reply::{ERROR_CODES, backend_code, backend_error, completed, is_final, receipt_json};
use crate::backend::{
    Backend, BackendConfig, BackendError, Prepared, ProviderTarget, SpendReceipt,
};
use crate::identity;
use crate::provider::ImageRequest;
use crate::spend::diagnose::{CallInfo, Diagnostics};
use crate::spend::pipeline::{Core, CoreOptions, Outcome, Quote, Settle, Spender, Stage, Staged};
use crate::spend::registry::{NewOperation, Operation, RegistryLocation, Status};
pub use crate::spend::reply::{Reply, ToolCode, ToolError};
use crate::spend::reply::{chain, identity_error};
use rmcp::model::CallToolResult;
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::sync::Arc;

/// The spend tool.
pub const GENERATE_IMAGE: &str = "generate_image";
pub use crate::spend::tools::OPERATION_STATUS;
pub use crate::spend::tools::RESUME_OPERATION;
/// What this router accepts (read-only).
pub const CAPABILITIES: &str = "capabilities";

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
    /// How long a dispatch lease lasts unless renewed.
    pub lease_ttl: std::time::Duration,
    /// The keys envelopes must be signed with (`--trust-keys`).
    pub trust: Option<Arc<identity::trust::TrustKeys>>,
}

/// The reference router's state: the pipeline core, the backend, the diagnostics.
pub struct Router {
    opts: RouterOptions,
    core: Core,
    backend: tokio::sync::Mutex<Option<Arc<Backend>>>,
    diagnostics: Option<Diagnostics>,
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
        let core = Core::new(CoreOptions {
            registry: opts.registry.clone(),
            preallocated_keys: opts.preallocated_keys.clone(),
            key_prefix: opts.key_prefix.clone(),
            handle_prefix: opts.handle_prefix.clone(),
            identity_sources: opts.identity_sources.clone(),
            lease_ttl: opts.lease_ttl,
            trust: opts.trust.clone(),
        });
        let diagnostics = opts.diagnose_meta.as_ref().and_then(|path| {
            Diagnostics::open(path, opts.identity_sources.clone())
                .map_err(|e| tracing::warn!("--diagnose-meta is off: {e}"))
                .ok()
        });
        Router {
            diagnostics,
            core,
            backend: tokio::sync::Mutex::new(None),
            opts,
        }
    }

    /// Answers one `tools/call`: the scrubbed `CallToolResult`, or `None` for an unknown
    /// tool (a JSON-RPC error, since no tool ran). `call` says what the transport knows about
    /// the call; it is asked only when `--diagnose-meta` records it, so diagnostics that are off
    /// cost nothing.
    pub async fn call_tool(
        &self,
        call: impl FnOnce() -> CallInfo,
        name: &str,
        arguments: Option<Map<String, Value>>,
        meta: &Map<String, Value>,
    ) -> Option<CallToolResult> {
        if let Some(d) = &self.diagnostics {
            d.record(&call(), name, arguments.as_ref(), meta);
        }
        let args = Value::Object(arguments.unwrap_or_default());
        let (reply, keys) = match name {
            GENERATE_IMAGE => self.core.spend(self, GENERATE_IMAGE, args, meta).await,
            OPERATION_STATUS => (self.core.operation_status(args).await, vec![]),
            RESUME_OPERATION => self.core.resume_operation(self, args).await,
            CAPABILITIES => (self.capabilities(args), vec![]),
            _ => return None,
        };
        Some(self.core.finish(name, reply, &keys))
    }

    /// Scrubs any value (used for JSON-RPC error messages too).
    pub fn scrub(&self, value: &mut Value) {
        self.core.scrub(value);
    }

    fn capabilities(&self, args: Value) -> Reply {
        if let Err(e) = self.opts.identity_sources.check_arguments(&args) {
            return identity_error(e).into();
        }
        if let Some(extra) = args.as_object().and_then(|m| m.keys().next()) {
            return ToolError::new(
                ToolCode::InvalidArguments,
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
            "preallocated_keys": self.core.preallocated(),
            "new_operations_from": if self.core.preallocated() { json!(["codex"]) } else { json!("any accepted source") },
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

    async fn backend(&self) -> Result<Arc<Backend>, ToolError> {
        let mut guard = self.backend.lock().await;
        if let Some(b) = guard.as_ref() {
            return Ok(b.clone());
        }
        let installation = self
            .core
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
        // On a SQLite registry the layers keep their tables in its file, so that their steps
        // commit with the registry's (see `Backend::open_in`).
        let opened = match &self.opts.registry {
            RegistryLocation::File(path) => Backend::open_in(
                path,
                &crate::storage::schema::registry::REGISTRY,
                &state_dir,
                target,
                config,
            ),
            RegistryLocation::Postgres(_) => Backend::open(&state_dir, target, config),
        };
        let backend = opened.map_err(|e| {
            let cause = chain(&e);
            if e.is_state_corrupt() {
                tracing::error!(
                    file = ?e.state_file(),
                    "backend state is corrupt, every spend fails closed until an operator \
                     repairs or restores it: {cause}"
                );
                ToolError::new(
                    ToolCode::BackendStateCorrupt,
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

impl Spender for Router {
    /// The provider request the arguments ask for.
    type Request = ImageRequest;

    const ERROR_CODES: &'static [ToolCode] = ERROR_CODES;
    const OPERATOR: &'static str = "callid router";

    fn check(&self, _tool: &str, args: &Value) -> Result<ImageRequest, ToolError> {
        image_request(args)
    }

    fn recorded(&self, op: &Operation) -> Result<ImageRequest, ToolError> {
        image_request(&op.arguments)
    }

    /// The router's backend is idempotent by construction: its authorization and execution
    /// layers key every record to the operation key, and its provider (in-process, or `callid
    /// provider` over HTTP or MCP, whose contract is the same) charges once per derived key. So
    /// an unknown outcome is continued under the same key, never marked in doubt.
    fn idempotent(&self, _tool: &str) -> bool {
        true
    }

    async fn quote(&self, _tool: &str, request: &ImageRequest) -> Result<Quote, ToolError> {
        let backend = self.backend().await?;
        let amount = backend.quote(request).map_err(backend_error)?;
        Ok(Quote {
            amount_cents: amount,
            needs_approval: self.opts.policy.needs_approval(amount, &request.model),
            // The authorization layer enforces the router's budget.
            budget_cents: None,
        })
    }

    async fn stage(&self, new: &NewOperation, request: &ImageRequest) -> Option<Stage> {
        let backend = self.backend().await.ok().filter(|b| b.hosted())?;
        // The writer thread runs the steps: they own their copy.
        let (key, hash, request) = (new.key.clone(), new.request_hash.clone(), request.clone());
        Some(Box::new(move |conn| {
            backend
                .prepare_in(conn, &key, &request, &hash)
                .map(|prepared| Staged(Box::new(prepared)))
                .map_err(|e| chain(&e))
        }))
    }

    async fn execute_staged(
        &self,
        op: &Operation,
        request: &ImageRequest,
        staged: Staged,
    ) -> Outcome {
        let (backend, prepared) = match (self.backend().await, staged.0.downcast::<Prepared>()) {
            (Ok(backend), Ok(prepared)) => (backend, *prepared),
            _ => return self.execute(op, request).await,
        };
        dispatch(op, &backend, prepared).await
    }

    async fn execute(&self, op: &Operation, request: &ImageRequest) -> Outcome {
        let backend = match self.backend().await {
            Ok(b) => b,
            Err(e) => return Outcome::Open(e),
        };
        if backend.hosted() {
            // A continuation: the layers' steps in a transaction of their own, the record of
            // the outcome with the result.
            return match backend.prepare(&op.key, request, &op.request_hash).await {
                Ok(prepared) => dispatch(op, &backend, prepared).await,
                Err(err) => failed(op, err),
            };
        }
        match backend.spend(&op.key, request, &op.request_hash).await {
            Ok(receipt) => done(op, &receipt, None),
            Err(err) => failed(op, err),
        }
    }

    fn completed(&self, op: &Operation, replayed: bool) -> Reply {
        completed(op, replayed)
    }
}

/// Sends a prepared spend and answers its outcome, with the layers' record of it to commit
/// with the result.
async fn dispatch(op: &Operation, backend: &Arc<Backend>, prepared: Prepared) -> Outcome {
    match backend.dispatch(prepared).await {
        Ok((receipt, settlement)) => {
            let backend = backend.clone();
            let settle = Settle(Box::new(move |conn| {
                backend.settle_in(conn, &settlement).map_err(|e| chain(&e))
            }));
            done(op, &receipt, Some(settle))
        }
        Err(err) => failed(op, err),
    }
}

/// A completed spend's outcome.
fn done(op: &Operation, receipt: &SpendReceipt, settle: Option<Settle>) -> Outcome {
    let result = json!({
        "handle": op.handle.as_str(),
        "status": Status::Completed.name(),
        "result": receipt_json(receipt),
    });
    let charged_cents = receipt.amount_cents;
    let answer = format!("the provider charged {} cents", receipt.amount_cents);
    match settle {
        None => Outcome::Done {
            result,
            charged_cents,
            answer,
        },
        Some(settle) => Outcome::Settling {
            result,
            charged_cents,
            answer,
            settle,
        },
    }
}

/// A failed spend's outcome: final refusals are recorded, the rest leaves the operation open.
fn failed(op: &Operation, err: BackendError) -> Outcome {
    let code = backend_code(&err);
    let message = chain(&err);
    if is_final(&err) {
        return Outcome::Refused { code, message };
    }
    let advice = if err.is_state_corrupt() {
        "an operator must repair or restore that file; until then every spend fails closed: do \
         not retry, and do not make a new call"
    } else {
        "nothing more was charged than once: retry the same call, it continues this operation \
         under the same key"
    };
    if err.is_state_corrupt() {
        tracing::error!(handle = %op.handle, "backend state is corrupt: {message}");
    }
    Outcome::Open(ToolError::new(code, format!("{message}; {advice}")))
}

/// Checks `generate_image` arguments against its schema and builds the provider request.
fn image_request(args: &Value) -> Result<ImageRequest, ToolError> {
    let invalid = |m: String| {
        ToolError::new(
            ToolCode::InvalidArguments,
            format!("{m}; nothing was dispatched"),
        )
    };
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
            Some(v) => crate::canonical::whole_number(v)
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
                ToolCode::InvalidArguments,
                "{bad}"
            );
        }
    }
}
