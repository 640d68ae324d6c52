//! The tool reply and error catalogue: what every answer of a tool call looks like on the wire.
//!
//! The [`pipeline`](super::pipeline) decides *what* to answer; this module says *how*: a result
//! ([`Reply`]), a tool error with its stable code ([`ToolError`]), the router's catalogue of codes
//! ([`ERROR_CODES`]), how backend and identity errors map onto it, and the result a completed
//! image spend answers.
//!
//! # Guarantees
//! - A tool error's `structuredContent` is `{"error": code, "message", "handle"?, "status"?}`
//!   and its text content is the message; the code is one of the spender's catalogue.
//! - A spend result carries `_meta["callid/replayed"]`; a result relayed from an upstream keeps
//!   its own content and gets `callid/replayed` (and `callid/handle` when known) in `_meta`.
//! - A backend error maps onto the router's catalogue: the backend's `invalid_request` and
//!   `backend_state_unavailable` become `invalid_arguments` and `registry_unavailable`, a code
//!   outside the catalogue becomes `provider_error`, a corrupt state file `backend_state_corrupt`.
//! - A charge above its authorization is never hidden: the result gets an `overcharge` member
//!   and the text a warning.

use super::registry::{Operation, RegistryError, Status};
use super::replay::Cached;
use crate::backend::{BackendError, SpendReceipt};
use crate::identity;
use crate::keys::PublicHandle;
use serde_json::{Value, json};
use std::sync::Arc;

/// `_meta` key of a result that says whether it was replayed.
pub const REPLAYED_META: &str = "callid/replayed";

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

/// A tool error: a stable code, a message that says what to do, and the operation if one exists.
#[derive(Debug, Clone)]
pub struct ToolError {
    /// Stable machine code (one of the spender's [`super::pipeline::Spender::ERROR_CODES`]).
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
    /// An error with no operation.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
            handle: None,
            status: None,
            cause: None,
        }
    }

    /// This error, about operation `op`.
    pub fn of(mut self, op: &Operation) -> Self {
        self.handle = Some(op.handle.clone());
        self.status = Some(op.status);
        self
    }

    pub(crate) fn registry(err: RegistryError) -> Self {
        let mut e = ToolError::new(
            "registry_unavailable",
            format!(
                "{err}; nothing was dispatched for this delivery, and retrying with the same call is safe once the registry is fixed"
            ),
        );
        e.cause = Some(err.to_string());
        e
    }

    /// The spender was called for `op` and answered (`answer`, saying whether money moved),
    /// but its answer could not be recorded.
    pub(crate) fn unrecorded(op: &Operation, answer: &str, cause: &ToolError) -> Self {
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
    /// A whole `CallToolResult` someone else wrote (an upstream's), sent as it is but for
    /// `_meta`, which gets `callid/replayed` and, when given, `callid/handle`.
    Raw {
        /// The `CallToolResult` JSON.
        result: Value,
        /// `_meta["callid/replayed"]`.
        replayed: bool,
        /// `_meta["callid/handle"]`.
        handle: Option<PublicHandle>,
    },
    /// A tool error.
    Err(ToolError),
    /// A reply already rendered and scrubbed (a completed operation's replay from the
    /// [`super::replay::ReplayCache`]): sent as it is.
    Ready(Arc<Cached>),
}

impl From<ToolError> for Reply {
    fn from(e: ToolError) -> Self {
        Reply::Err(e)
    }
}

/// `_meta` key of a gateway result that names its operation's public handle.
pub const HANDLE_META: &str = "callid/handle";

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
            Reply::Raw {
                result,
                replayed,
                handle,
            } => {
                let mut v = match result {
                    Value::Object(_) => result.clone(),
                    other => json!({"content": [], "structuredContent": other}),
                };
                if !v["_meta"].is_object() {
                    v["_meta"] = json!({});
                }
                v["_meta"][REPLAYED_META] = json!(replayed);
                if let Some(h) = handle {
                    v["_meta"][HANDLE_META] = json!(h.as_str());
                }
                v
            }
            Reply::Ready(cached) => cached.reply.clone(),
            Reply::Err(e) => json!({
                "isError": true,
                "content": [{"type": "text", "text": e.message}],
                "structuredContent": e.structured(),
            }),
        }
    }
}

/// An identity refusal: nothing was dispatched.
pub fn identity_error(e: identity::IdentityError) -> ToolError {
    ToolError::new(e.code(), format!("{e}; nothing was dispatched"))
}

/// The `overcharge` member: what was authorized and what was charged.
pub fn overcharge_json(authorized: u64, charged: u64) -> Value {
    json!({"authorized_cents": authorized, "charged_cents": charged})
}

/// The warning appended to a reply whose charge exceeded its authorization.
pub fn overcharge_text(authorized: u64, charged: u64) -> String {
    format!(
        "; WARNING: the provider charged {charged} cents although {authorized} were authorized; \
         the budget was debited by the full charge"
    )
}

/// The error and its causes, as one line.
pub fn chain(err: &dyn std::error::Error) -> String {
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

pub(super) fn completed(op: &Operation, replayed: bool) -> Reply {
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

/// The router's code for a backend error: the contract's codes, with the backend's own
/// `invalid_request` and `backend_state_unavailable` mapped onto `invalid_arguments` and
/// `registry_unavailable` (the backend's state files live beside the registry).
pub(super) fn backend_code(err: &BackendError) -> &'static str {
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
pub(super) fn is_final(err: &BackendError) -> bool {
    !err.is_retryable()
}

pub(super) fn backend_error(err: BackendError) -> ToolError {
    ToolError::new(
        backend_code(&err),
        format!("{}; nothing was dispatched", chain(&err)),
    )
}

/// The `result` member of a completed spend; a charge above the authorization is marked.
pub(super) fn receipt_json(receipt: &SpendReceipt) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

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
