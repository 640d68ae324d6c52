//! Signed platform-invocation envelopes: the signature's wire shape, the key files, signing, and
//! why a signature is refused ([`SignatureError`]). What a router trusts is [`super::trust`].
//!
//! # Shape
//! A platform signs its `hubu.dev/platform-invocation` envelope with a detached compact JWS
//! (RFC 7515, appendix F) under its own `_meta` key, [`SIGNATURE_KEY`]:
//!
//! ```text
//! _meta["hubu.dev/platform-invocation"]           = {"platform": "acme", "invocation_id": "inv-1"}
//! _meta["hubu.dev/platform-invocation-signature"] = "<b64url(protected)>..<b64url(signature)>"
//! ```
//!
//! The protected header is `{"alg": "EdDSA" | "HS256", "kid", "iat", "exp"}` (times in seconds
//! since the Unix epoch), and the payload left out of the middle is the envelope's RFC 8785
//! canonical JSON ([`crate::canonical::canonical_json`]): the signature covers the envelope, the
//! key id, the issue time and the expiry. Why this shape: the envelope stays byte for byte what a
//! router without trust keys reads, so signing is additive; the signature cannot drift from the
//! envelope (it is computed over its canonical form, not over a second copy); and a detached JWS
//! can be produced and checked with a JOSE library on every platform.
//!
//! # Key files
//! One line, `ALG:KEY`: `ed25519:` followed by the base64url (no padding) PKCS#8 document of an
//! Ed25519 key pair, or `hs256:` followed by 32 or more base64url bytes of an HMAC secret. Both are
//! written mode 0600 by [`write_new_key`], which never overwrites a file, and read only when their
//! mode grants nothing to group or others ([`read_key_file`]). Keys have no `Display` and a
//! redacting `Debug`.
//!
//! Primitives are `ring`'s (`ring::signature::Ed25519KeyPair`, `ring::hmac`); nothing here is
//! hand-written cryptography.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `_meta` key of the detached JWS over the envelope.
pub const SIGNATURE_KEY: &str = "hubu.dev/platform-invocation-signature";
/// Shortest HMAC secret accepted, in bytes.
pub const MIN_HMAC_SECRET_BYTES: usize = 32;
/// Longest signature string read from `_meta`, in bytes.
pub const MAX_SIGNATURE_BYTES: usize = 2048;

/// A signing algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Alg {
    /// Ed25519 (JWS `EdDSA`): the platform keeps the private key, routers hold the public one.
    Ed25519,
    /// HMAC-SHA-256 (JWS `HS256`): one shared secret, for a single operator who runs both ends.
    Hs256,
}

impl Alg {
    /// The JWS `alg` header value.
    pub fn jws(self) -> &'static str {
        match self {
            Alg::Ed25519 => "EdDSA",
            Alg::Hs256 => "HS256",
        }
    }

    /// The key-file and trust-file name (`ed25519`, `hs256`).
    pub fn name(self) -> &'static str {
        match self {
            Alg::Ed25519 => "ed25519",
            Alg::Hs256 => "hs256",
        }
    }
}

/// The protected header of a signature.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// `EdDSA` or `HS256`.
    pub alg: String,
    /// The key id, as listed in the trust file.
    pub kid: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: i64,
    /// Expires at, seconds since the Unix epoch.
    pub exp: i64,
}

/// A private key: an Ed25519 key pair or an HMAC secret. No `Display`; `Debug` shows the
/// algorithm only.
pub enum SigningKey {
    /// Ed25519 key pair.
    Ed25519(ring::signature::Ed25519KeyPair),
    /// HMAC-SHA-256 secret.
    Hs256(ring::hmac::Key),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, <redacted>)", self.alg().name())
    }
}

impl SigningKey {
    /// The key's algorithm.
    pub fn alg(&self) -> Alg {
        match self {
            SigningKey::Ed25519(_) => Alg::Ed25519,
            SigningKey::Hs256(_) => Alg::Hs256,
        }
    }

    /// The public key (base64url) of an Ed25519 key; `None` for an HMAC secret, which has none.
    pub fn public_key(&self) -> Option<String> {
        use ring::signature::KeyPair as _;
        match self {
            SigningKey::Ed25519(pair) => Some(B64.encode(pair.public_key().as_ref())),
            SigningKey::Hs256(_) => None,
        }
    }

    /// A fresh Ed25519 key held in memory only, never written anywhere (the conformance
    /// runner's key for one check).
    pub fn generate_ed25519() -> SigningKey {
        let rng = ring::rand::SystemRandom::new();
        let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .expect("the system random generator works");
        SigningKey::Ed25519(
            ring::signature::Ed25519KeyPair::from_pkcs8(doc.as_ref())
                .expect("a generated key parses"),
        )
    }

    fn sign_bytes(&self, input: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::Ed25519(pair) => pair.sign(input).as_ref().to_vec(),
            SigningKey::Hs256(key) => ring::hmac::sign(key, input).as_ref().to_vec(),
        }
    }
}

/// A key file's content, decoded.
pub(crate) enum KeyMaterial {
    /// An Ed25519 key pair (PKCS#8).
    Ed25519(ring::signature::Ed25519KeyPair),
    /// An HMAC secret.
    Hs256(Vec<u8>),
}

/// Why a key file could not be written or read. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file exists already.
    #[error(
        "`{}` already exists; a key file is never overwritten: choose another path, or remove \
         the old key once nothing signs or verifies with it",
        path.display()
    )]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// Reading or writing failed.
    #[error("failed to {action} the key file `{}`", path.display())]
    Io {
        /// `read`, `write`, ...
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file grants permissions to group or others.
    #[error(
        "the key file `{}` has mode {mode:o}, readable by others than its owner; run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The content is not a key.
    #[error(
        "the key file `{}` {problem}; it must be one line `ed25519:KEY` or `hs256:KEY` as \
         written by `callid envelope keygen`",
        path.display()
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, as a fragment.
        problem: &'static str,
    },
}

impl KeyFileError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            KeyFileError::Exists { .. } => "key_file_exists",
            KeyFileError::Io { .. } => "key_file_unreadable",
            KeyFileError::Mode { .. } => "key_file_mode",
            KeyFileError::Invalid { .. } => "key_file_invalid",
        }
    }
}

/// Generates a key of `alg` and writes it to `path` (mode 0600, created new: an existing file
/// is an error); returns the key.
pub fn write_new_key(path: &Path, alg: Alg) -> Result<SigningKey, KeyFileError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let rng = ring::rand::SystemRandom::new();
    let (line, key) = match alg {
        Alg::Ed25519 => {
            let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
                .expect("the system random generator works");
            let pair = ring::signature::Ed25519KeyPair::from_pkcs8(doc.as_ref())
                .expect("a generated key parses");
            (
                format!("ed25519:{}\n", B64.encode(doc.as_ref())),
                SigningKey::Ed25519(pair),
            )
        }
        Alg::Hs256 => {
            let mut secret = [0u8; MIN_HMAC_SECRET_BYTES];
            ring::rand::SecureRandom::fill(&rng, &mut secret)
                .expect("the system random generator works");
            (
                format!("hs256:{}\n", B64.encode(secret)),
                SigningKey::Hs256(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret)),
            )
        }
    };
    let io = |source| KeyFileError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyFileError::Exists {
                path: path.to_path_buf(),
            },
            _ => io(e),
        })?;
    file.write_all(line.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(key)
}

/// Reads a key file: refused when its mode grants anything to group or others (checked before
/// the content is read), or when it is not one line `ed25519:KEY` / `hs256:KEY`.
pub(crate) fn read_key_file(path: &Path) -> Result<KeyMaterial, KeyFileError> {
    use std::os::unix::fs::PermissionsExt as _;
    let io = |source| KeyFileError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Mode {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let invalid = |problem| KeyFileError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let (alg, encoded) = text
        .trim()
        .split_once(':')
        .ok_or_else(|| invalid("has no `ALG:` prefix"))?;
    let bytes = B64
        .decode(encoded)
        .map_err(|_| invalid("is not base64url (without padding) after its prefix"))?;
    match alg {
        "ed25519" => ring::signature::Ed25519KeyPair::from_pkcs8(&bytes)
            .map(KeyMaterial::Ed25519)
            .map_err(|_| invalid("does not hold an Ed25519 PKCS#8 key pair")),
        "hs256" if bytes.len() >= MIN_HMAC_SECRET_BYTES => Ok(KeyMaterial::Hs256(bytes)),
        "hs256" => Err(invalid("holds an HMAC secret shorter than 32 bytes")),
        _ => Err(invalid(
            "names an algorithm other than `ed25519` or `hs256`",
        )),
    }
}

/// Reads a private key to sign with ([`read_key_file`]).
pub fn read_signing_key(path: &Path) -> Result<SigningKey, KeyFileError> {
    Ok(match read_key_file(path)? {
        KeyMaterial::Ed25519(pair) => SigningKey::Ed25519(pair),
        KeyMaterial::Hs256(secret) => {
            SigningKey::Hs256(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret))
        }
    })
}

/// The detached compact JWS over `envelope` by `key` under `kid`, valid from `iat` to `exp`
/// (seconds since the Unix epoch). Fails only when the envelope is not canonicalizable.
pub fn sign(
    envelope: &Value,
    key: &SigningKey,
    kid: &str,
    iat: i64,
    exp: i64,
) -> Result<String, crate::canonical::CanonicalError> {
    let header = Header {
        alg: key.alg().jws().into(),
        kid: kid.into(),
        iat,
        exp,
    };
    let protected = B64.encode(serde_json::to_vec(&header).expect("a header serializes"));
    let input = signing_input(&protected, envelope)?;
    let signature = key.sign_bytes(input.as_bytes());
    Ok(format!("{protected}..{}", B64.encode(signature)))
}

/// `b64url(protected) "." b64url(canonical envelope)`: the bytes a signature covers.
pub(crate) fn signing_input(
    protected: &str,
    envelope: &Value,
) -> Result<String, crate::canonical::CanonicalError> {
    let payload = crate::canonical::canonical_json(envelope)?;
    Ok(format!("{protected}.{}", B64.encode(payload)))
}

/// A signature split into its parts, not yet verified.
#[derive(Debug)]
pub(crate) struct Detached {
    /// The protected header, decoded.
    pub header: Header,
    /// The protected header as sent (base64url), which the signature covers.
    pub protected: String,
    /// The signature bytes.
    pub signature: Vec<u8>,
}

/// Splits a detached compact JWS: `<protected>..<signature>`.
pub(crate) fn parse(value: &Value) -> Result<Detached, SignatureError> {
    let malformed = |problem: &str| SignatureError::Malformed {
        problem: problem.into(),
    };
    let Value::String(text) = value else {
        return Err(malformed(&format!(
            "must be a JSON string; got {}",
            super::type_name(value)
        )));
    };
    if text.len() > MAX_SIGNATURE_BYTES {
        return Err(malformed(&format!(
            "must be at most {MAX_SIGNATURE_BYTES} bytes; got {}",
            text.len()
        )));
    }
    let mut parts = text.split('.');
    let (Some(protected), Some(""), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed(
            "must be a detached compact JWS `<protected>..<signature>` (empty payload)",
        ));
    };
    let header_bytes = B64
        .decode(protected)
        .map_err(|_| malformed("has a protected header that is not base64url"))?;
    let header: Header = serde_json::from_slice(&header_bytes).map_err(|_| {
        malformed("has a protected header that is not exactly {alg, kid, iat, exp}")
    })?;
    if header.exp <= header.iat {
        return Err(malformed("has an `exp` that is not after its `iat`"));
    }
    let signature = B64
        .decode(signature)
        .map_err(|_| malformed("has a signature that is not base64url"))?;
    Ok(Detached {
        header,
        protected: protected.to_string(),
        signature,
    })
}

/// Why a signed (or unsigned) identity is refused under trust keys. Each variant has a stable
/// [`code`](Self::code); no message carries a secret, a key or the signature itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// An envelope without a signature.
    #[error(
        "missing signature: this router verifies envelopes, and `_meta[\"{SIGNATURE_KEY}\"]` is \
         absent; the platform must sign its envelope (`callid envelope sign` shows the shape)"
    )]
    Missing,
    /// The signature is not a well-formed detached JWS, or signs no envelope.
    #[error(
        "invalid signature: `_meta[\"{SIGNATURE_KEY}\"]` {problem}; send the signature \
         `callid envelope sign` produces"
    )]
    Malformed {
        /// What is wrong, as a fragment.
        problem: String,
    },
    /// The signature does not verify: forged, altered, or made with another key.
    #[error(
        "invalid signature: the signature by key `{kid}` does not match this envelope (altered, \
         forged, or signed with another key); re-sign the envelope exactly as sent with the \
         private key of `{kid}`"
    )]
    Forged {
        /// The key id the header named.
        kid: String,
    },
    /// The key id is not in the trust file.
    #[error(
        "unknown signing key: `{kid}` is not in this router's trust file; add the platform's \
         public key under `kid: {kid}` to `--trust-keys`, or sign with a listed key"
    )]
    UnknownKey {
        /// The key id the header named.
        kid: String,
    },
    /// The key may not speak for the envelope's platform.
    #[error(
        "signing key not allowed: key `{kid}` may sign for {} and this envelope names platform \
         `{platform}`; add `{platform}` to the key's `platforms` in the trust file if it speaks \
         for it",
        .allowed.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
    )]
    PlatformNotAllowed {
        /// The key id.
        kid: String,
        /// The envelope's platform.
        platform: String,
        /// The platforms the key may sign for.
        allowed: Vec<String>,
    },
    /// `exp` has passed (beyond the allowed skew).
    #[error(
        "signature expired: it expired at {exp} and the router's clock reads {now} (allowed \
         skew {skew} s); the platform must sign this envelope again (a fresh signature for the \
         same envelope is the same call)"
    )]
    Expired {
        /// The expiry.
        exp: i64,
        /// The router's time.
        now: i64,
        /// The allowed skew, in seconds.
        skew: u64,
    },
    /// `iat` is in the future (beyond the allowed skew).
    #[error(
        "signature not yet valid: issued at {iat} and the router's clock reads {now} (allowed \
         skew {skew} s); synchronize the platform's and the router's clocks, or raise \
         `clock_skew_secs` in the trust file"
    )]
    NotYetValid {
        /// The issue time.
        iat: i64,
        /// The router's time.
        now: i64,
        /// The allowed skew, in seconds.
        skew: u64,
    },
    /// A harness identity, unsigned, where the operator refuses unsigned identities.
    #[error(
        "unsigned identity: `{key}` cannot be signed and this router refuses unsigned harness \
         identities (`--unsigned-harness-ids refuse`); send a signed \
         `hubu.dev/platform-invocation` envelope, or have the operator accept unsigned harness \
         identities"
    )]
    Unsigned {
        /// The `_meta` key the identity came from.
        key: String,
    },
}

impl SignatureError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::Missing => "missing_signature",
            SignatureError::Malformed { .. } | SignatureError::Forged { .. } => "invalid_signature",
            SignatureError::UnknownKey { .. } => "unknown_signing_key",
            SignatureError::PlatformNotAllowed { .. } => "signing_key_not_allowed",
            SignatureError::Expired { .. } => "signature_expired",
            SignatureError::NotYetValid { .. } => "signature_not_yet_valid",
            SignatureError::Unsigned { .. } => "unsigned_identity",
        }
    }

    /// Every code this module can return, for documentation and tests.
    pub const CODES: [&'static str; 7] = [
        "missing_signature",
        "invalid_signature",
        "unknown_signing_key",
        "signing_key_not_allowed",
        "signature_expired",
        "signature_not_yet_valid",
        "unsigned_identity",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn key_files_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        for alg in [Alg::Ed25519, Alg::Hs256] {
            let path = dir.path().join(alg.name());
            let key = write_new_key(&path, alg).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{alg:?}");
            let before = std::fs::read(&path).unwrap();
            let again = write_new_key(&path, alg).unwrap_err();
            assert_eq!(again.code(), "key_file_exists");
            assert_eq!(std::fs::read(&path).unwrap(), before, "not overwritten");
            assert_eq!(read_signing_key(&path).unwrap().alg(), alg);
            assert!(!format!("{key:?}").contains(&B64.encode(&before)));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            assert_eq!(read_signing_key(&path).unwrap_err().code(), "key_file_mode");
        }
    }

    /// The signature is the RFC 7515 appendix F shape over the canonical envelope: a JOSE library
    /// given the canonical JSON as the payload verifies it.
    #[test]
    fn the_signature_is_a_detached_jws_over_the_canonical_envelope() {
        let dir = tempfile::tempdir().unwrap();
        let key = write_new_key(&dir.path().join("k"), Alg::Ed25519).unwrap();
        let envelope = serde_json::json!({"invocation_id": "i", "platform": "acme"});
        let jws = sign(&envelope, &key, "k", 10, 20).unwrap();
        let (protected, rest) = jws.split_once("..").unwrap();
        let header: Value = serde_json::from_slice(&B64.decode(protected).unwrap()).unwrap();
        assert_eq!(
            header,
            serde_json::json!({"alg": "EdDSA", "kid": "k", "iat": 10, "exp": 20})
        );
        let payload = B64.encode(r#"{"invocation_id":"i","platform":"acme"}"#);
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ED25519,
            B64.decode(key.public_key().unwrap()).unwrap(),
        );
        public
            .verify(
                format!("{protected}.{payload}").as_bytes(),
                &B64.decode(rest).unwrap(),
            )
            .expect("verifies as an attached JWS with the canonical payload");
    }
}
