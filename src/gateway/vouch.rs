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
//!
//! # What the receiving end checks
//! [`check_vouched_for`]: a request that carries [`VOUCHED_FOR_META`] must carry the envelope
//! whose `task_id` is its digest; otherwise the vouched-for identity was altered or detached from
//! the signature that covers it, and the [`Guard`](super::guard::Guard) refuses the call
//! (`vouched_for_mismatch`) before anything is recorded. A request without it is not checked.

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

/// A request whose [`VOUCHED_FOR_META`] is not bound by the envelope beside it. No message
/// carries the identity itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "vouched-for mismatch: `_meta[\"{VOUCHED_FOR_META}\"]` {problem}, so the signature does not \
     cover the identity it names; forward the `_meta` the vouching gateway wrote unchanged (its \
     envelope, signature and `{VOUCHED_FOR_META}` together)"
)]
pub struct VouchedForMismatch {
    /// What does not match, as a fragment.
    pub problem: String,
}

impl VouchedForMismatch {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        "vouched_for_mismatch"
    }
}

/// Checks that `meta`'s [`VOUCHED_FOR_META`], when present, is the one the envelope beside it
/// vouches for: the envelope's `task_id` is its [`vouched_for_digest`].
pub fn check_vouched_for(meta: &Map<String, Value>) -> Result<(), VouchedForMismatch> {
    let Some(vouched_for) = meta.get(VOUCHED_FOR_META) else {
        return Ok(());
    };
    let mismatch = |problem: &str| VouchedForMismatch {
        problem: problem.into(),
    };
    let task_id = match meta.get(crate::identity::ENVELOPE_KEY) {
        None => {
            return Err(mismatch(&format!(
                "comes without the `{}` envelope that vouches for it",
                crate::identity::ENVELOPE_KEY
            )));
        }
        Some(envelope) => envelope.get("task_id").and_then(Value::as_str),
    };
    let Some(task_id) = task_id else {
        return Err(mismatch(
            "comes with an envelope that has no `task_id` string to bind it",
        ));
    };
    let Value::Object(_) = vouched_for else {
        return Err(mismatch("is not an object"));
    };
    match vouched_for_digest(vouched_for) {
        Some(digest) if digest == task_id => Ok(()),
        Some(_) => Err(mismatch(
            "has a digest that is not the envelope's `task_id` (it was altered, or moved from \
             another call)",
        )),
        None => Err(mismatch("has no canonical JSON form")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a vouching gateway writes passes; any change to the vouched-for identity, or the
    /// identity without its envelope, is a mismatch; a request without one is not checked.
    #[test]
    fn the_vouched_for_identity_must_be_the_one_the_envelope_binds() {
        let vouched_for = json!({"platform": "codex", "call_id": "call_1"});
        let digest = vouched_for_digest(&vouched_for).unwrap();
        let meta = |envelope: Option<Value>, vouched_for: Value| {
            let mut m = Map::new();
            if let Some(e) = envelope {
                m.insert(crate::identity::ENVELOPE_KEY.into(), e);
            }
            m.insert(VOUCHED_FOR_META.into(), vouched_for);
            m
        };
        let envelope = json!({"platform": "gw", "invocation_id": "k", "task_id": digest});
        assert_eq!(
            check_vouched_for(&meta(Some(envelope.clone()), vouched_for.clone())),
            Ok(())
        );
        assert_eq!(check_vouched_for(&Map::new()), Ok(()));
        let cases = [
            meta(
                Some(envelope.clone()),
                json!({"platform": "codex", "call_id": "call_2"}),
            ),
            meta(
                Some(envelope.clone()),
                json!({"platform": "codex", "call_id": "call_1", "installation_id": "i"}),
            ),
            meta(None, vouched_for.clone()),
            meta(
                Some(json!({"platform": "gw", "invocation_id": "k"})),
                vouched_for.clone(),
            ),
            meta(Some(envelope), json!("call_1")),
        ];
        let mut text = String::new();
        for m in cases {
            let err = check_vouched_for(&m).unwrap_err();
            assert_eq!(err.code(), "vouched_for_mismatch");
            text.push_str(&format!("{err}\n"));
        }
        insta::assert_snapshot!(text);
    }
}
