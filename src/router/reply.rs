//! The router's replies: its catalogue of error codes, how an image backend error maps onto it,
//! and the result a completed image spend answers. The wire shapes and the catalogue of every
//! code are the spend core's ([`crate::spend::reply`]).
//!
//! # Guarantees
//! - A backend error maps onto the router's catalogue: the backend's `invalid_request` and
//!   `backend_state_unavailable` become `invalid_arguments` and `registry_unavailable`, a code
//!   outside the catalogue becomes `provider_error`, a corrupt state file `backend_state_corrupt`.
//! - A charge above its authorization is never hidden: the result gets an `overcharge` member
//!   and the text a warning.

use crate::backend::{BackendError, SpendReceipt};
use crate::spend::registry::Operation;
use crate::spend::reply::{
    Catalogue, Reply, ToolCode, ToolError, chain, overcharge_json, overcharge_text,
};
use serde_json::{Value, json};

/// Every error code a tool call of this router can answer: the codes the table of
/// [`ToolCode`] gives to [`Catalogue::Router`], in its order.
pub const ERROR_CODES: &[ToolCode] = &Catalogue::Router.codes::<{ Catalogue::Router.size() }>();

pub(crate) fn completed(op: &Operation, replayed: bool) -> Reply {
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
pub(crate) fn backend_code(err: &BackendError) -> ToolCode {
    if err.is_state_corrupt() {
        return ToolCode::BackendStateCorrupt;
    }
    match err.code() {
        "invalid_request" => ToolCode::InvalidArguments,
        "backend_state_unavailable" => ToolCode::RegistryUnavailable,
        code => ToolCode::from_code(code)
            .filter(|c| ERROR_CODES.contains(c))
            .unwrap_or(ToolCode::ProviderError),
    }
}

/// A backend refusal is recorded and answered again on redelivery; a retryable failure leaves
/// the operation pending so that redelivery continues it under the same key.
pub(crate) fn is_final(err: &BackendError) -> bool {
    !err.is_retryable()
}

pub(crate) fn backend_error(err: BackendError) -> ToolError {
    ToolError::new(
        backend_code(&err),
        format!("{}; nothing was dispatched", chain(&err)),
    )
}

/// The `result` member of a completed spend; a charge above the authorization is marked.
pub(crate) fn receipt_json(receipt: &SpendReceipt) -> Value {
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
            assert_eq!(backend_code(&err).code(), code, "{err}");
            assert_eq!(is_final(&err), last, "{err}");
            assert!(ERROR_CODES.contains(&backend_code(&err)));
        }
    }
}
