//! The records and rules that both storages of each layer share: what is asked to be
//! authorized ([`AuthorizationRequest`]), a recorded [`Decision`] and its derived id, when a
//! reservation lapses, the provider key of a decision and a recorded execution ([`Executed`]).
//! The SQLite stores ([`super::authorization`], [`super::execution`]) and the shared PostgreSQL
//! state of router replicas ([`super::shared`]) both build on this file, so neither depends on
//! the other.

use crate::provider::Receipt;
use sha2::{Digest as _, Sha256};

/// What is asked to be authorized.
#[derive(Debug, Clone)]
pub struct AuthorizationRequest<'a> {
    /// The agent (router installation) asking.
    pub agent_id: &'a str,
    /// The private operation key: the idempotency key of this layer.
    pub operation_key: &'a str,
    /// The account to charge.
    pub account: &'a str,
    /// The price in cents.
    pub amount_cents: u64,
    /// What the money may be spent on (`generate_image:<model>:<width>x<height>`).
    pub scope: &'a str,
    /// The router's request hash.
    pub request_hash: &'a str,
    /// The account's budget, when it has one.
    pub budget_cents: Option<u64>,
}

/// A recorded authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Random id of the decision; the execution layer keys on it.
    pub decision_id: String,
    /// The account.
    pub account: String,
    /// The amount in cents.
    pub amount_cents: u64,
    /// The scope.
    pub scope: String,
    /// The request hash.
    pub request_hash: String,
    /// When it was recorded (RFC 3339, UTC).
    pub created_at: String,
    /// `true` when this call recorded it, `false` when it already existed.
    pub newly_recorded: bool,
}

/// The decision id of (agent, operation key): derived, not random, so every replica of a router
/// (each with its own authorization file, sharing one registry and so one agent id) gives one
/// operation the same decision, hence the same provider idempotency key
/// ([`provider_key`]): a redelivery that lands on another replica after a
/// crash after the provider charged is answered from the provider's record instead of charged
/// again. A hash of the key (`sha256`, shaped as a UUID): the decision id never reveals the key.
pub fn decision_id(agent_id: &str, operation_key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"callid-decision:v1\0");
    hash.update(agent_id.as_bytes());
    hash.update(b"\0");
    hash.update(operation_key.as_bytes());
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

impl Decision {
    /// What of `req` differs from this recorded decision (`account`, `amount`, `scope`,
    /// `request`): anything makes the key's reuse `create_new_operation`.
    pub(super) fn differs_from(&self, req: &AuthorizationRequest<'_>) -> Vec<&'static str> {
        [
            ("account", self.account == req.account),
            ("amount", self.amount_cents == req.amount_cents),
            ("scope", self.scope == req.scope),
            ("request", self.request_hash == req.request_hash),
        ]
        .into_iter()
        .filter(|(_, same)| !same)
        .map(|(name, _)| name)
        .collect()
    }
}

/// Whether a decision in `state`, reserved at `reserved_ms`, holds no budget any more at `now_ms`
/// (released, or a reservation that expired): an identical retry reserves it again.
pub(super) fn lapsed(state: &str, reserved_ms: i64, expiry_ms: i64, now_ms: i64) -> bool {
    state == "released" || (state == "reserved" && reserved_ms.saturating_add(expiry_ms) <= now_ms)
}

/// The provider idempotency key of a decision: `gongbu:` and the first 32 hex digits of
/// `sha256(decision_id)`.
pub fn provider_key(decision_id: &str) -> String {
    let digest = crate::canonical::hex(&Sha256::digest(decision_id.as_bytes()));
    format!("gongbu:{}", &digest[..32])
}

/// The recorded result of an execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed {
    /// The provider's receipt.
    pub receipt: Receipt,
    /// Whether the provider said its answer was a replay when it was recorded.
    pub provider_replayed: bool,
    /// `true` when this call returned the stored result without calling the provider.
    pub from_record: bool,
    /// How many times the provider has been called for this decision.
    pub attempts: u64,
}

/// What the execution layer found for a decision: its recorded result, or the provider key to
/// dispatch with.
#[derive(Debug)]
pub(super) enum Begin {
    Done(Executed),
    Dispatch { key: String },
}
