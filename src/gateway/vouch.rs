//! [`Vouch`]: a gateway that signs, for its upstream, the call it checked (`--vouch-key FILE
//! --vouch-kid ID --vouch-platform NAME`).
//!
//! # What the upstream receives
//! Beside `callid/idempotency-key`, a spend sent upstream carries in `_meta`:
//! - `hubu.dev/platform-invocation`: `{"platform": <vouch platform>, "invocation_id": <the
//!   derived idempotency key>, "task_id": <digest>}`, signed ([`crate::identity::signature`]) by
//!   the gateway's key: an upstream built on the Guard API with the same kind of trust file
//!   (`kid` → the gateway's public key, `platforms: [<vouch platform>]`) accepts it as a verified
//!   identity, keyed by the gateway's operation, so a re-send of one operation is one call
//!   upstream too;
//! - [`VOUCHED_FOR_META`]: `{"platform", "call_id", "installation_id"?}`, the agent's identity the
//!   gateway verified; `task_id` is the hex SHA-256 of its RFC 8785 canonical JSON, so the
//!   signature covers it ([`vouched_for_digest`] recomputes it).
//!
//! The signature is fresh on every send (valid for [`VOUCH_TTL_SECS`]); the envelope is the same
//! for every continuation of one operation.

use crate::identity::signature::{self, SIGNATURE_KEY, SigningKey};
use crate::spend::registry::Operation;
use serde_json::{Map, Value, json};

/// `_meta` key of the agent identity the gateway verified.
pub const VOUCHED_FOR_META: &str = "callid/vouched-for";
/// Seconds a vouching signature stays valid.
pub const VOUCH_TTL_SECS: i64 = 300;

/// The gateway's signing key and the platform it speaks as. `Debug` never shows the key.
#[derive(Debug)]
pub struct Vouch {
    /// The private key (`callid envelope keygen`).
    pub key: SigningKey,
    /// Its key id in the upstream's trust file.
    pub kid: String,
    /// The platform the gateway's envelopes name.
    pub platform: String,
}

/// The hex SHA-256 of the canonical JSON of a `callid/vouched-for` object: the `task_id` of the
/// envelope that vouches for it.
pub fn vouched_for_digest(vouched_for: &Value) -> Option<String> {
    use sha2::Digest as _;
    let canonical = crate::canonical::canonical_json(vouched_for).ok()?;
    Some(crate::canonical::hex(&sha2::Sha256::digest(canonical)))
}

impl Vouch {
    /// Adds the signed envelope and the vouched-for identity of `op` to `meta` (at `now`,
    /// seconds since the Unix epoch).
    pub fn add(&self, op: &Operation, meta: &mut Map<String, Value>, now: i64) {
        let mut vouched_for = json!({"platform": op.platform, "call_id": op.harness_call_id});
        if !op.source_installation.is_empty() {
            vouched_for["installation_id"] = json!(op.source_installation);
        }
        let digest = vouched_for_digest(&vouched_for).expect("strings are canonical");
        let envelope = json!({
            "platform": self.platform,
            "invocation_id": op.key.idempotency_key(),
            "task_id": digest,
        });
        let jws = signature::sign(&envelope, &self.key, &self.kid, now, now + VOUCH_TTL_SECS)
            .expect("strings are canonical");
        meta.insert(crate::identity::ENVELOPE_KEY.into(), envelope);
        meta.insert(SIGNATURE_KEY.into(), Value::String(jws));
        meta.insert(VOUCHED_FOR_META.into(), vouched_for);
    }
}
