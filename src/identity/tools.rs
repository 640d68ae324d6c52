//! `callid envelope`: the tools for platform authors and operators around signed envelopes
//! ([`keygen`], [`sign`], [`verify`]). Each returns the text to print; none prints or returns a
//! private key or secret.

use super::signature::{self, Alg, KeyFileError, SIGNATURE_KEY};
use super::trust::{HarnessIds, TrustError, TrustKeys};
use super::{ENVELOPE_KEY, IdentitySources};
use serde_json::{Map, Value, json};
use std::path::Path;

/// Why an envelope tool could not run (a refused signature is a verdict, not an error).
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeToolError {
    /// A key file could not be written or read.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// The trust file did not load.
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// A JSON argument did not parse or has the wrong shape.
    #[error("`{flag}` {problem}")]
    Json {
        /// The flag.
        flag: &'static str,
        /// What is wrong, with the fix.
        problem: String,
    },
}

/// Generates a key into `out` and returns the trust-file entry that verifies it.
pub fn keygen(
    kid: &str,
    out: &Path,
    alg: Alg,
    platforms: &[String],
) -> Result<String, EnvelopeToolError> {
    let key = signature::write_new_key(out, alg)?;
    let verifier = match key.public_key() {
        Some(public) => format!(r"    public_key: {public}"),
        None => format!(
            r"    secret_file: {}   # the same file, on the router's host (mode 0600)",
            out.display()
        ),
    };
    Ok(format!(
        r"# wrote the {alg} private key `{out}` (mode 0600); keep it with the signer.
# trust-file entry for `--trust-keys`:
keys:
  - kid: {kid}
    alg: {alg}
{verifier}
    platforms: [{platforms}]
",
        alg = alg.name(),
        out = out.display(),
        platforms = platforms.join(", ")
    ))
}

/// Signs `envelope` (JSON text) with the key in `key_file` under `kid`, valid from `now` for
/// `ttl` seconds; returns the `_meta` object to send, as pretty JSON.
pub fn sign(
    key_file: &Path,
    kid: &str,
    envelope: &str,
    ttl: u32,
    now: i64,
) -> Result<String, EnvelopeToolError> {
    let bad = |problem: String| EnvelopeToolError::Json {
        flag: "--envelope",
        problem,
    };
    let envelope: Value = serde_json::from_str(envelope)
        .map_err(|e| bad(format!("is not JSON ({e}); give the envelope object")))?;
    let meta = json!({ ENVELOPE_KEY: envelope });
    IdentitySources::built_in_ref()
        .from_meta(Some(&meta))
        .map_err(|e| bad(format!("is not a valid envelope: {e}")))?;
    let key = signature::read_signing_key(key_file)?;
    let jws = signature::sign(&meta[ENVELOPE_KEY], &key, kid, now, now + i64::from(ttl))
        .map_err(|e| bad(format!("has no canonical form: {e}")))?;
    let mut out = Map::new();
    out.insert(ENVELOPE_KEY.into(), meta[ENVELOPE_KEY].clone());
    out.insert(SIGNATURE_KEY.into(), Value::String(jws));
    Ok(serde_json::to_string_pretty(&Value::Object(out)).expect("JSON serializes") + "\n")
}

/// The verdict of [`verify`]: the text to print, and whether the call would be accepted.
#[derive(Debug)]
pub struct Verdict {
    /// `valid: ...` or `refused (CODE): ...`.
    pub text: String,
    /// Accepted.
    pub valid: bool,
}

/// Checks a `_meta` object (JSON text) as a router with `trust_file` would at `now`.
pub fn verify(
    trust_file: &Path,
    meta: &str,
    harness: HarnessIds,
    now: i64,
) -> Result<Verdict, EnvelopeToolError> {
    let trust = TrustKeys::load(trust_file, harness)?;
    let meta: Value = serde_json::from_str(meta).map_err(|e| EnvelopeToolError::Json {
        flag: "--meta",
        problem: format!("is not JSON ({e}); give the request's `_meta` object"),
    })?;
    let refused = |code: &str, message: String| Verdict {
        text: format!("refused ({code}): {message}\n"),
        valid: false,
    };
    let identity = match IdentitySources::built_in_ref().from_meta(Some(&meta)) {
        Ok(identity) => identity,
        Err(e) => return Ok(refused(e.code(), e.to_string())),
    };
    let map = meta
        .as_object()
        .expect("an identity was read from an object");
    Ok(match trust.verify(map, &identity, now) {
        Ok(()) => Verdict {
            text: format!(
                "valid: platform `{}`, call `{}`{}, from `{}`\n",
                identity.platform,
                identity.harness_call_id,
                identity
                    .installation_id
                    .as_deref()
                    .map(|i| format!(", installation `{i}`"))
                    .unwrap_or_default(),
                identity.source_key
            ),
            valid: true,
        },
        Err(e) => refused(e.code(), e.to_string()),
    })
}
