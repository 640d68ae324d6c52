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
}

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
}
