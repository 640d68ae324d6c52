//! Private operation keys and public operation handles, as distinct types.
//!
//! The private key (`hubu:operation:v1:<platform>:<uuid>`) is what the backend layers use as their
//! idempotency key; it must never reach the agent, a log or a transcript. The public handle
//! (`hubu:public-operation:v1:<uuid>`) is what the agent gets to ask for status or resume an
//! approval. They are separate random values: one cannot be derived from the other.
//!
//! # Guarantee
//! [`OperationKey`] has no `Display` and a redacting `Debug`, so `format!("{key}")` does not
//! compile and `{key:?}` prints `OperationKey(<redacted>)`. Reading the text takes an explicit
//! [`OperationKey::expose`].

use uuid::Uuid;

/// Default prefix of private operation keys (the platform and a UUID follow).
pub const DEFAULT_KEY_PREFIX: &str = "hubu:operation:v1:";
/// Default prefix of public handles (a UUID follows).
pub const DEFAULT_HANDLE_PREFIX: &str = "hubu:public-operation:v1:";

/// A private operation key. Never shown to the agent.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

impl OperationKey {
    /// A fresh random key: `<prefix><platform>:<uuid v4>`.
    pub fn generate(prefix: &str, platform: &str) -> Self {
        OperationKey(format!("{prefix}{platform}:{}", Uuid::new_v4()))
    }

    /// Wraps a key read back from storage or claimed from a preallocated pool.
    pub fn from_stored(text: String) -> Self {
        OperationKey(text)
    }

    /// The key's text, for the backend request and the scrubber only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The idempotency key an upstream server receives for this operation (`callid gateway`'s
    /// `_meta["callid/idempotency-key"]`): `callid-idem-v1-` and the hex HMAC-SHA-256 of a
    /// domain tag keyed by this private key. The same on every continuation of one operation,
    /// different for every operation, and the private key cannot be read back from it.
    pub fn idempotency_key(&self) -> String {
        use hmac::{Hmac, KeyInit as _, Mac as _};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(self.0.as_bytes())
            .expect("HMAC takes a key of any size");
        mac.update(IDEMPOTENCY_DOMAIN);
        format!(
            "{IDEMPOTENCY_KEY_PREFIX}{}",
            crate::canonical::hex(&mac.finalize().into_bytes())
        )
    }
}

/// `_meta` key of the idempotency key ([`OperationKey::idempotency_key`]) a spend is sent
/// upstream under, over stdio and HTTP alike: what `callid gateway` writes, and what the
/// provider's MCP face ([`crate::provider::mcp`]) charges by.
pub const IDEMPOTENCY_META: &str = "callid/idempotency-key";

/// The HTTP header carrying an idempotency key: the provider's HTTP API, and a streamable HTTP
/// upstream, which gets [`IDEMPOTENCY_META`]'s key in it too.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Prefix of the idempotency keys derived for upstream servers.
pub const IDEMPOTENCY_KEY_PREFIX: &str = "callid-idem-v1-";
const IDEMPOTENCY_DOMAIN: &[u8] = b"callid/idempotency-key/v1";

impl std::fmt::Debug for OperationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperationKey(<redacted>)")
    }
}

/// A public operation handle: safe to show to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PublicHandle(String);

impl PublicHandle {
    /// A fresh random handle: `<prefix><uuid v4>`.
    pub fn generate(prefix: &str) -> Self {
        PublicHandle(format!("{prefix}{}", Uuid::new_v4()))
    }

    /// Wraps a handle read back from storage or received from the agent.
    pub fn from_stored(text: String) -> Self {
        PublicHandle(text)
    }

    /// The handle's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PublicHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a pair of key and handle prefixes cannot be used together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PrefixError {
    /// The key prefix is empty: the scrubber could not recognize a key it was not handed.
    #[error(
        "`--key-prefix` is empty, so a private key in a reply could not be recognized and \
         redacted; pass a non-empty prefix such as the default `{DEFAULT_KEY_PREFIX}`"
    )]
    EmptyKeyPrefix,
    /// One prefix contains the other: keys and handles could not be told apart.
    #[error(
        "`--key-prefix` `{key}` and `--handle-prefix` `{handle}` overlap (one contains the \
         other), so private keys and public handles could not be told apart: replies would have \
         their handles redacted, or a key would pass for a handle; pick two prefixes where \
         neither contains the other, like the defaults `{DEFAULT_KEY_PREFIX}` and \
         `{DEFAULT_HANDLE_PREFIX}`"
    )]
    Overlap {
        /// The key prefix.
        key: String,
        /// The handle prefix.
        handle: String,
    },
}

/// Refuses a key prefix and a handle prefix that could be mistaken for each other (checked at
/// start-up): the scrubber redacts every string that contains the key prefix, and a handle is
/// looked up by its text.
pub fn check_prefixes(key: &str, handle: &str) -> Result<(), PrefixError> {
    if key.is_empty() {
        return Err(PrefixError::EmptyKeyPrefix);
    }
    if handle.is_empty() || handle.contains(key) || key.contains(handle) {
        return Err(PrefixError::Overlap {
            key: key.to_owned(),
            handle: handle.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_handle_are_distinct_and_redacted() {
        let key = OperationKey::generate(DEFAULT_KEY_PREFIX, "codex");
        let handle = PublicHandle::generate(DEFAULT_HANDLE_PREFIX);
        assert!(key.expose().starts_with("hubu:operation:v1:codex:"));
        assert!(handle.as_str().starts_with("hubu:public-operation:v1:"));
        assert_eq!(key.expose().len(), "hubu:operation:v1:codex:".len() + 36);
        assert_eq!(format!("{key:?}"), "OperationKey(<redacted>)");
        let key_uuid = key.expose().rsplit(':').next().unwrap();
        assert!(!handle.as_str().contains(key_uuid));
        assert_ne!(key, OperationKey::generate(DEFAULT_KEY_PREFIX, "codex"));
    }

    #[test]
    fn prefixes_that_overlap_are_refused() {
        let overlap = |k: &str, h: &str| {
            Err(PrefixError::Overlap {
                key: k.into(),
                handle: h.into(),
            })
        };
        let cases = [
            (DEFAULT_KEY_PREFIX, DEFAULT_HANDLE_PREFIX, Ok(())),
            ("acme:k:", "acme:h:", Ok(())),
            ("", "h:", Err(PrefixError::EmptyKeyPrefix)),
            (
                "hubu:",
                DEFAULT_HANDLE_PREFIX,
                overlap("hubu:", DEFAULT_HANDLE_PREFIX),
            ),
            ("k:", "k:", overlap("k:", "k:")),
            ("acme:key:", "key:", overlap("acme:key:", "key:")),
            ("k:", "", overlap("k:", "")),
        ];
        for (key, handle, want) in cases {
            assert_eq!(check_prefixes(key, handle), want, "{key} / {handle}");
        }
    }

    #[test]
    fn idempotency_key_is_derived_stable_and_distinct() {
        let key = OperationKey::from_stored("hubu:operation:v1:codex:k1".into());
        let derived = key.idempotency_key();
        assert_eq!(derived, key.clone().idempotency_key());
        assert!(derived.starts_with(IDEMPOTENCY_KEY_PREFIX));
        assert_eq!(derived.len(), IDEMPOTENCY_KEY_PREFIX.len() + 64);
        assert!(!derived.contains("hubu:operation"));
        assert_ne!(
            derived,
            OperationKey::from_stored("hubu:operation:v1:codex:k2".into()).idempotency_key()
        );
    }
}
