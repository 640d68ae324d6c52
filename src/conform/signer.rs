//! [`Signer`]: the runner's own signing key for the signed-envelope checks (`signature.*`), and
//! the signatures a scenario step asks for ([`SignAs`]).
//!
//! # Why the runner makes the key
//! A check that declares `signed_envelopes: true` gets a fresh Ed25519 key pair, generated in
//! memory for that check and never written anywhere; the router is handed only its public half,
//! through the profile's `signed_envelopes` command (`{trust_keys}`, a trust file in callid's
//! format, or `{signing_public_key}`, the raw key in base64url). So a router author's CI needs
//! no key of its own: no secret in the repository, no file whose mode git would not keep at
//! 0600, nothing to rotate, and a key that outlives no check.
//!
//! # Guarantees
//! - The key id is [`SIGNING_KID`] and the only platform it may sign for is
//!   [`SIGNING_PLATFORM`]; an envelope of another platform signed by it is one the router must
//!   refuse (`signing_key_not_allowed`).
//! - An expired signature expired [`OUT_OF_WINDOW_SECS`] ago and a not-yet-valid one is issued
//!   that far ahead: beyond any clock skew a router may allow (callid's at most 3600 s).
//! - No private key leaves this module; the trust file holds the public key only.

use crate::identity::signature::{self, SigningKey};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The key id of the runner's key, as `{trust_keys}` lists it.
pub const SIGNING_KID: &str = "conform-signer";
/// The one platform the runner's key may sign for.
pub const SIGNING_PLATFORM: &str = "conform-signed";
/// A key id that no trust file of the run lists (`sign: unknown_key`).
pub const UNKNOWN_KID: &str = "conform-unknown";
/// Seconds a valid signature stays valid.
pub const VALID_FOR_SECS: i64 = 300;
/// How far outside its window an expired or not-yet-valid signature is, in seconds.
pub const OUT_OF_WINDOW_SECS: i64 = 7200;

const _: () = assert!(OUT_OF_WINDOW_SECS > crate::identity::trust::MAX_CLOCK_SKEW_SECS as i64);

/// The signature a step sends beside its envelope (`sign:` in a scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignAs {
    /// By the runner's key, valid now.
    Valid,
    /// Under the runner's key id, by another key: a forgery of the right shape.
    Forged,
    /// By the runner's key under a key id the router was not given ([`UNKNOWN_KID`]).
    UnknownKey,
    /// By the runner's key, expired [`OUT_OF_WINDOW_SECS`] ago.
    Expired,
    /// By the runner's key, issued [`OUT_OF_WINDOW_SECS`] from now.
    NotYetValid,
}

/// The runner's key for one check, and the trust file that lists its public half.
pub struct Signer {
    key: SigningKey,
    forger: SigningKey,
    public_key: String,
    trust_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &SIGNING_KID)
            .field("trust_file", &self.trust_file)
            .finish()
    }
}

impl Signer {
    /// A fresh key pair, and its trust file in a new temporary directory.
    pub fn new() -> std::io::Result<Signer> {
        let key = SigningKey::generate_ed25519();
        let public_key = key.public_key().expect("an Ed25519 key has a public key");
        let dir = tempfile::Builder::new()
            .prefix("callid-conform-trust-")
            .tempdir()?;
        let trust_file = dir.path().join("trust-keys.yaml");
        std::fs::write(&trust_file, trust_file_text(&public_key))?;
        Ok(Signer {
            key,
            forger: SigningKey::generate_ed25519(),
            public_key,
            trust_file,
            _dir: dir,
        })
    }

    /// `{trust_keys}`: the trust file (callid's format) listing the runner's public key.
    pub fn trust_file(&self) -> &Path {
        &self.trust_file
    }

    /// `{signing_public_key}`: the raw Ed25519 public key, base64url without padding.
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// The detached JWS to send beside `envelope` at `now` (seconds since the Unix epoch).
    /// `None` when the envelope has no canonical form (a scenario that sends such an envelope
    /// expects it refused before any signature is read).
    pub fn sign(&self, envelope: &Value, how: SignAs, now: i64) -> Option<String> {
        let (key, kid, iat) = match how {
            SignAs::Valid => (&self.key, SIGNING_KID, now),
            SignAs::Forged => (&self.forger, SIGNING_KID, now),
            SignAs::UnknownKey => (&self.key, UNKNOWN_KID, now),
            SignAs::Expired => (
                &self.key,
                SIGNING_KID,
                now - OUT_OF_WINDOW_SECS - VALID_FOR_SECS,
            ),
            SignAs::NotYetValid => (&self.key, SIGNING_KID, now + OUT_OF_WINDOW_SECS),
        };
        signature::sign(envelope, key, kid, iat, iat + VALID_FOR_SECS).ok()
    }
}

/// The trust file handed to the router: one Ed25519 key for [`SIGNING_PLATFORM`].
fn trust_file_text(public_key: &str) -> String {
    format!(
        r"# The conformance runner's key for one check (callid conform, signed_envelopes).
keys:
  - kid: {SIGNING_KID}
    alg: ed25519
    public_key: {public_key}
    platforms: [{SIGNING_PLATFORM}]
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::trust::{HarnessIds, TrustKeys};
    use serde_json::json;

    /// callid's own trust keys, loaded from the file the runner hands out, judge every
    /// signature a step can ask for as the scenarios expect.
    #[test]
    fn every_signature_a_step_asks_for_is_judged_as_the_scenarios_expect() {
        let signer = Signer::new().unwrap();
        let trust = TrustKeys::load(signer.trust_file(), HarnessIds::Accept).unwrap();
        let text = std::fs::read_to_string(signer.trust_file()).unwrap();
        assert!(text.contains(signer.public_key()), "{text}");
        let now = crate::identity::trust::now_secs();
        let verdict = |platform: &str, how: SignAs| {
            let envelope = json!({"platform": platform, "invocation_id": "inv-1"});
            let jws = signer.sign(&envelope, how, now).unwrap();
            let meta = json!({crate::identity::ENVELOPE_KEY: envelope,
                              signature::SIGNATURE_KEY: jws});
            let meta = meta.as_object().unwrap();
            let id = crate::identity::IdentitySources::built_in_ref()
                .from_meta_map(meta)
                .unwrap();
            trust.verify(meta, &id, now).err().map(|e| e.code())
        };
        assert_eq!(verdict(SIGNING_PLATFORM, SignAs::Valid), None);
        assert_eq!(
            verdict(SIGNING_PLATFORM, SignAs::Forged),
            Some("invalid_signature")
        );
        assert_eq!(
            verdict(SIGNING_PLATFORM, SignAs::UnknownKey),
            Some("unknown_signing_key")
        );
        assert_eq!(
            verdict(SIGNING_PLATFORM, SignAs::Expired),
            Some("signature_expired")
        );
        assert_eq!(
            verdict(SIGNING_PLATFORM, SignAs::NotYetValid),
            Some("signature_not_yet_valid")
        );
        assert_eq!(
            verdict("conform-other", SignAs::Valid),
            Some("signing_key_not_allowed")
        );
        assert!(!format!("{signer:?}").contains(signer.public_key()));
    }
}
