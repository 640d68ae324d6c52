//! [`TrustKeys`]: which keys may sign envelopes for which platforms (`--trust-keys FILE`), and the
//! check a router, a gateway or a [`Guard`](crate::gateway::guard::Guard) runs on every spend call.
//!
//! # The file
//! ```yaml
//! clock_skew_secs: 60          # optional, default 60
//! keys:
//!   - kid: acme-2026-11
//!     alg: ed25519
//!     public_key: 3q2-7w...    # base64url, from `callid envelope keygen`
//!     platforms: [acme]
//!   - kid: ops-hmac
//!     alg: hs256
//!     secret_file: ops.key     # relative to this file; mode 0600
//!     platforms: [acme, billing-bot]
//! ```
//! Unknown fields are refused, as are a key id listed twice, an Ed25519 key without a valid
//! `public_key` (or with a `secret_file`), an HMAC key without a readable 0600 `secret_file` (or
//! with a `public_key`), an empty `platforms`, and a built-in platform (`codex`, `claude-code`),
//! which no envelope may claim. Two keys may speak for one platform (rotation).
//!
//! # Guarantees ([`TrustKeys::verify`])
//! With trust keys, a spend call's identity is accepted only when:
//! - it is an envelope whose signature ([`SIGNATURE_KEY`]) is a well-formed detached JWS, by a
//!   listed key (`unknown_signing_key`), with the key's algorithm, that verifies over the
//!   envelope's canonical JSON (`invalid_signature`), from a key allowed for the envelope's
//!   platform (`signing_key_not_allowed`), issued no later than now + skew
//!   (`signature_not_yet_valid`) and expiring after now - skew (`signature_expired`); an envelope
//!   without one is `missing_signature`;
//! - or it is a harness identity (`callId`, `claudecode/toolUseId`, a table source), which cannot
//!   be signed, and the operator accepts unsigned harness identities ([`HarnessIds::Accept`]);
//!   otherwise `unsigned_identity`. A signature beside a harness identity signs nothing and is
//!   `invalid_signature`.
//!
//! The pipeline runs this check right after reading the identity, before the replay cache, the
//! registry or the spender: a refused call records nothing.

use super::signature::{self, Alg, KeyMaterial, SIGNATURE_KEY, SignatureError};
use super::{ENVELOPE_KEY, Identity, Source};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Clock skew allowed when the file does not say, in seconds.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// Largest clock skew a trust file may allow, in seconds.
pub const MAX_CLOCK_SKEW_SECS: u64 = 3600;

/// Whether harness identities, which carry no signature, are accepted under trust keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HarnessIds {
    /// Accepted unsigned: the stdio default, where the harness started the server itself.
    Accept,
    /// Refused with `unsigned_identity`: the HTTP default, where anyone who can reach the
    /// listener could write `_meta`.
    Refuse,
}

/// A verifying key.
enum Verifier {
    Ed25519(ring::signature::UnparsedPublicKey<Vec<u8>>),
    Hs256(ring::hmac::Key),
}

/// One trusted key.
struct TrustedKey {
    kid: String,
    alg: Alg,
    verifier: Verifier,
    platforms: Vec<String>,
}

/// The keys a router trusts, the allowed clock skew and the harness policy. `Debug` names the
/// keys and their platforms, never key material.
pub struct TrustKeys {
    keys: Vec<TrustedKey>,
    skew: u64,
    harness: HarnessIds,
    origin: String,
}

impl std::fmt::Debug for TrustKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustKeys")
            .field("origin", &self.origin)
            .field(
                "keys",
                &self
                    .keys
                    .iter()
                    .map(|k| (k.kid.as_str(), k.alg.name(), &k.platforms))
                    .collect::<Vec<_>>(),
            )
            .field("skew", &self.skew)
            .field("harness", &self.harness)
            .finish()
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    #[serde(default)]
    clock_skew_secs: Option<u64>,
    keys: Vec<KeyEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    kid: String,
    alg: Alg,
    #[serde(default)]
    public_key: Option<String>,
    #[serde(default)]
    secret_file: Option<PathBuf>,
    platforms: Vec<String>,
}

/// Why a trust file did not load. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The file could not be read.
    #[error("failed to read the trust file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not fit the schema.
    #[error("the trust file `{}` is invalid at `{at}`: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where in the document.
        at: String,
        /// What is wrong.
        message: String,
    },
    /// An entry breaks a rule.
    #[error("the trust file `{}`, key `{kid}` (keys[{index}]): {problem}; {fix}", path.display())]
    Entry {
        /// The file.
        path: PathBuf,
        /// The entry's index.
        index: usize,
        /// The entry's key id.
        kid: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// An HMAC key's secret file could not be used.
    #[error("the trust file `{}`, key `{kid}`", path.display())]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// The entry's key id.
        kid: String,
        /// Why.
        #[source]
        source: signature::KeyFileError,
    },
}

impl TrustError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            TrustError::Read { .. } => "trust_file_unreadable",
            TrustError::Parse { .. } | TrustError::Entry { .. } => "trust_file_invalid",
            TrustError::SecretFile { source, .. } => source.code(),
        }
    }
}

impl TrustKeys {
    /// Loads a trust file; `harness` says whether unsigned harness identities are accepted.
    pub fn load(path: &Path, harness: HarnessIds) -> Result<TrustKeys, TrustError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrustError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file: TrustFile = crate::yaml::from_str(&text).map_err(|e| TrustError::Parse {
            path: path.to_path_buf(),
            at: e.path,
            message: e.message,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let skew = file.clock_skew_secs.unwrap_or(DEFAULT_CLOCK_SKEW_SECS);
        if skew > MAX_CLOCK_SKEW_SECS {
            return Err(TrustError::Parse {
                path: path.to_path_buf(),
                at: "clock_skew_secs".into(),
                message: format!(
                    "is {skew}; allow at most {MAX_CLOCK_SKEW_SECS} seconds, and fix the clocks \
                     rather than widen it"
                ),
            });
        }
        if file.keys.is_empty() {
            return Err(TrustError::Parse {
                path: path.to_path_buf(),
                at: "keys".into(),
                message: "is empty; list at least one key, or do not pass `--trust-keys`".into(),
            });
        }
        let mut keys: Vec<TrustedKey> = Vec::new();
        for (index, entry) in file.keys.into_iter().enumerate() {
            let bad = |problem: &str, fix: &str| TrustError::Entry {
                path: path.to_path_buf(),
                index,
                kid: entry.kid.clone(),
                problem: problem.into(),
                fix: fix.into(),
            };
            if entry.kid.is_empty()
                || entry.kid.len() > 128
                || !entry.kid.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(bad(
                    "`kid` must be 1 to 128 visible ASCII characters",
                    "name the key as its signer's header does, e.g. `acme-2026-11`",
                ));
            }
            if keys.iter().any(|k| k.kid == entry.kid) {
                return Err(bad(
                    "the key id is listed twice",
                    "give every key its own `kid` (rotate by adding a key under a new id)",
                ));
            }
            if entry.platforms.is_empty() {
                return Err(bad(
                    "`platforms` is empty",
                    "list the platforms whose envelopes this key may sign",
                ));
            }
            for platform in &entry.platforms {
                super::platform_name(&Value::String(platform.clone()), "platforms").map_err(
                    |_| {
                        bad(
                            &format!(
                                "platform `{platform}` is not 1 to 64 characters of [A-Za-z0-9._-]"
                            ),
                            "name the platform exactly as its envelopes do",
                        )
                    },
                )?;
                if super::BUILT_IN_PLATFORMS
                    .iter()
                    .any(|b| b.eq_ignore_ascii_case(platform))
                {
                    return Err(bad(
                        &format!(
                            "platform `{platform}` is a built-in source's, which no envelope may claim"
                        ),
                        "remove it: harness identities are governed by `--unsigned-harness-ids`",
                    ));
                }
            }
            let verifier = match (entry.alg, &entry.public_key, &entry.secret_file) {
                (Alg::Ed25519, Some(public), None) => {
                    let bytes = B64
                        .decode(public)
                        .ok()
                        .filter(|b| b.len() == 32)
                        .ok_or_else(|| {
                            bad(
                                "`public_key` is not 32 bytes of base64url (no padding)",
                                "paste the public key `callid envelope keygen` printed",
                            )
                        })?;
                    Verifier::Ed25519(ring::signature::UnparsedPublicKey::new(
                        &ring::signature::ED25519,
                        bytes,
                    ))
                }
                (Alg::Hs256, None, Some(secret)) => {
                    let secret_path = base.join(secret);
                    match signature::read_key_file(&secret_path).map_err(|source| {
                        TrustError::SecretFile {
                            path: path.to_path_buf(),
                            kid: entry.kid.clone(),
                            source,
                        }
                    })? {
                        KeyMaterial::Hs256(bytes) => {
                            Verifier::Hs256(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes))
                        }
                        KeyMaterial::Ed25519(_) => {
                            return Err(bad(
                                "`secret_file` holds an Ed25519 private key, not an HMAC secret",
                                "give an Ed25519 key as `public_key` (never its private key), or \
                                 point `secret_file` at an `hs256` key",
                            ));
                        }
                    }
                }
                (Alg::Ed25519, _, _) => {
                    return Err(bad(
                        "an `ed25519` key needs `public_key` and no `secret_file`",
                        "give the base64url public key `callid envelope keygen` printed",
                    ));
                }
                (Alg::Hs256, _, _) => {
                    return Err(bad(
                        "an `hs256` key needs `secret_file` and no `public_key`",
                        "point `secret_file` at the 0600 file `callid envelope keygen --alg \
                         hs256` wrote",
                    ));
                }
            };
            keys.push(TrustedKey {
                kid: entry.kid,
                alg: entry.alg,
                verifier,
                platforms: entry.platforms,
            });
        }
        Ok(TrustKeys {
            keys,
            skew,
            harness,
            origin: path.display().to_string(),
        })
    }

    /// Whether unsigned harness identities are accepted.
    pub fn harness_ids(&self) -> HarnessIds {
        self.harness
    }

    /// Checks the signature of `identity`, read from `meta`, at `now` (seconds since the Unix
    /// epoch); see the module doc for the rules, in the order they are checked.
    pub fn verify(
        &self,
        meta: &Map<String, Value>,
        identity: &Identity,
        now: i64,
    ) -> Result<(), SignatureError> {
        let signed = meta.get(SIGNATURE_KEY);
        if identity.source != Source::PlatformInvocation {
            if signed.is_some() {
                return Err(SignatureError::Malformed {
                    problem: format!(
                        "signs no envelope: this call's identity is `{}`, a harness identity, \
                         which a signature does not cover",
                        identity.source_key
                    ),
                });
            }
            return match self.harness {
                HarnessIds::Accept => Ok(()),
                HarnessIds::Refuse => Err(SignatureError::Unsigned {
                    key: identity.source_key.clone(),
                }),
            };
        }
        let Some(signed) = signed else {
            return Err(SignatureError::Missing);
        };
        let detached = signature::parse(signed)?;
        let header = &detached.header;
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == header.kid)
            .ok_or_else(|| SignatureError::UnknownKey {
                kid: header.kid.clone(),
            })?;
        if header.alg != key.alg.jws() {
            return Err(SignatureError::Malformed {
                problem: format!(
                    "names `alg` `{}`, and key `{}` is `{}`",
                    header.alg,
                    key.kid,
                    key.alg.jws()
                ),
            });
        }
        let envelope = &meta[ENVELOPE_KEY];
        let input = signature::signing_input(&detached.protected, envelope).map_err(|e| {
            SignatureError::Malformed {
                problem: format!("signs an envelope that has no canonical form ({e})"),
            }
        })?;
        let verified = match &key.verifier {
            Verifier::Ed25519(public) => public.verify(input.as_bytes(), &detached.signature),
            Verifier::Hs256(secret) => {
                ring::hmac::verify(secret, input.as_bytes(), &detached.signature)
            }
        };
        if verified.is_err() {
            return Err(SignatureError::Forged {
                kid: key.kid.clone(),
            });
        }
        if !key.platforms.contains(&identity.platform) {
            return Err(SignatureError::PlatformNotAllowed {
                kid: key.kid.clone(),
                platform: identity.platform.clone(),
                allowed: key.platforms.clone(),
            });
        }
        let skew = self.skew as i64;
        if header.iat > now.saturating_add(skew) {
            return Err(SignatureError::NotYetValid {
                iat: header.iat,
                now,
                skew: self.skew,
            });
        }
        if header.exp <= now.saturating_sub(skew) {
            return Err(SignatureError::Expired {
                exp: header.exp,
                now,
                skew: self.skew,
            });
        }
        Ok(())
    }
}

/// The current time in seconds since the Unix epoch, as [`TrustKeys::verify`] reads it.
pub fn now_secs() -> i64 {
    crate::clock::now_ms().div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::signature::{SigningKey, read_signing_key, sign, write_new_key};
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt as _;

    const NOW: i64 = 1_800_000_000;

    /// A directory with keys `a` and `b` (Ed25519, both for `acme`: rotation), `other`
    /// (Ed25519, for `billing`), `mac` (HMAC, for `acme`), and `stranger` (Ed25519, not listed).
    struct Fixture {
        dir: tempfile::TempDir,
        trust: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let mut entries = String::new();
            for (kid, platform) in [("a", "acme"), ("b", "acme"), ("other", "billing")] {
                let key = write_new_key(&dir.path().join(kid), Alg::Ed25519).unwrap();
                entries.push_str(&format!(
                    "  - {{kid: {kid}, alg: ed25519, public_key: {}, platforms: [{platform}]}}\n",
                    key.public_key().unwrap()
                ));
            }
            write_new_key(&dir.path().join("mac"), Alg::Hs256).unwrap();
            entries.push_str("  - {kid: mac, alg: hs256, secret_file: mac, platforms: [acme]}\n");
            write_new_key(&dir.path().join("stranger"), Alg::Ed25519).unwrap();
            let trust = dir.path().join("trust.yaml");
            std::fs::write(&trust, format!("clock_skew_secs: 60\nkeys:\n{entries}")).unwrap();
            Fixture { dir, trust }
        }

        fn key(&self, name: &str) -> SigningKey {
            read_signing_key(&self.dir.path().join(name)).unwrap()
        }

        fn keys(&self, harness: HarnessIds) -> TrustKeys {
            TrustKeys::load(&self.trust, harness).unwrap()
        }
    }

    fn envelope(platform: &str) -> Value {
        json!({"platform": platform, "invocation_id": "inv-1", "installation_id": "inst-1"})
    }

    fn meta(envelope: &Value, signature: Option<String>) -> Map<String, Value> {
        let mut meta = Map::new();
        meta.insert(ENVELOPE_KEY.into(), envelope.clone());
        if let Some(s) = signature {
            meta.insert(SIGNATURE_KEY.into(), Value::String(s));
        }
        meta
    }

    /// The verdict on `meta` under the fixture's keys: `ok` or the refusal's code.
    fn verdict(keys: &TrustKeys, meta: &Map<String, Value>) -> String {
        let identity = crate::identity::IdentitySources::built_in_ref()
            .from_meta_map(meta)
            .unwrap();
        match keys.verify(meta, &identity, NOW) {
            Ok(()) => "ok".into(),
            Err(e) => e.code().into(),
        }
    }

    #[test]
    fn every_rule_of_a_signed_envelope() {
        let f = Fixture::new();
        let keys = f.keys(HarnessIds::Accept);
        let acme = envelope("acme");
        let signed = |key: &str, kid: &str, env: &Value, iat: i64, exp: i64| {
            sign(env, &f.key(key), kid, iat, exp).unwrap()
        };
        let altered = {
            let mut m = meta(&acme, Some(signed("a", "a", &acme, NOW, NOW + 300)));
            m.insert(
                ENVELOPE_KEY.into(),
                json!({"platform": "acme", "invocation_id": "inv-2", "installation_id": "inst-1"}),
            );
            m
        };
        let cases: Vec<(&str, Map<String, Value>, &str)> = vec![
            (
                "ed25519",
                meta(&acme, Some(signed("a", "a", &acme, NOW, NOW + 300))),
                "ok",
            ),
            (
                "hmac",
                meta(&acme, Some(signed("mac", "mac", &acme, NOW, NOW + 300))),
                "ok",
            ),
            (
                "rotation: the second key of one platform",
                meta(&acme, Some(signed("b", "b", &acme, NOW, NOW + 300))),
                "ok",
            ),
            ("no signature", meta(&acme, None), "missing_signature"),
            (
                "forged: a valid shape, signed by an unlisted key under a listed id",
                meta(&acme, Some(signed("stranger", "a", &acme, NOW, NOW + 300))),
                "invalid_signature",
            ),
            (
                "forged: another listed key's signature under a listed id",
                meta(&acme, Some(signed("b", "a", &acme, NOW, NOW + 300))),
                "invalid_signature",
            ),
            ("altered after signing", altered, "invalid_signature"),
            (
                "an HMAC signature under an Ed25519 key id",
                meta(&acme, Some(signed("mac", "a", &acme, NOW, NOW + 300))),
                "invalid_signature",
            ),
            (
                "not a JWS",
                meta(&acme, Some("not-a-jws".into())),
                "invalid_signature",
            ),
            (
                "exp before iat",
                meta(&acme, Some(signed("a", "a", &acme, NOW, NOW - 1))),
                "invalid_signature",
            ),
            (
                "unknown key id",
                meta(
                    &acme,
                    Some(signed("stranger", "stranger", &acme, NOW, NOW + 300)),
                ),
                "unknown_signing_key",
            ),
            (
                "a key signing for a platform it does not own",
                meta(&acme, Some(signed("other", "other", &acme, NOW, NOW + 300))),
                "signing_key_not_allowed",
            ),
            (
                "expired beyond the skew",
                meta(&acme, Some(signed("a", "a", &acme, NOW - 400, NOW - 61))),
                "signature_expired",
            ),
            (
                "expired within the skew",
                meta(&acme, Some(signed("a", "a", &acme, NOW - 400, NOW - 59))),
                "ok",
            ),
            (
                "not yet valid beyond the skew",
                meta(&acme, Some(signed("a", "a", &acme, NOW + 61, NOW + 300))),
                "signature_not_yet_valid",
            ),
            (
                "not yet valid within the skew",
                meta(&acme, Some(signed("a", "a", &acme, NOW + 59, NOW + 300))),
                "ok",
            ),
        ];
        for (name, meta, expected) in cases {
            assert_eq!(verdict(&keys, &meta), expected, "{name}");
        }
    }

    #[test]
    fn harness_identities_follow_the_operator_policy() {
        let f = Fixture::new();
        let codex = json!({"callId": "call-1"}).as_object().unwrap().clone();
        assert_eq!(verdict(&f.keys(HarnessIds::Accept), &codex), "ok");
        assert_eq!(
            verdict(&f.keys(HarnessIds::Refuse), &codex),
            "unsigned_identity"
        );
        let mut signed_codex = codex.clone();
        let jws = sign(&envelope("acme"), &f.key("a"), "a", NOW, NOW + 300).unwrap();
        signed_codex.insert(SIGNATURE_KEY.into(), Value::String(jws));
        assert_eq!(
            verdict(&f.keys(HarnessIds::Accept), &signed_codex),
            "invalid_signature",
            "a signature beside a harness identity signs nothing"
        );
    }

    #[test]
    fn trust_files_that_are_refused() {
        let f = Fixture::new();
        let public = f.key("a").public_key().unwrap();
        let load = |text: &str| {
            let path = f.dir.path().join("bad.yaml");
            std::fs::write(&path, text).unwrap();
            crate::error_chain::format(&TrustKeys::load(&path, HarnessIds::Accept).unwrap_err())
                .replace(&f.dir.path().display().to_string(), "DIR")
        };
        let key = |extra: &str| {
            format!(
                "keys:\n  - {{kid: k, alg: ed25519, public_key: {public}, platforms: [acme]{extra}}}\n"
            )
        };
        std::fs::set_permissions(
            f.dir.path().join("mac"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let text = [
            load(&key(", comment: x")),
            load("keys: []\n"),
            load(&format!("{}{}", key(""), key("").replace("keys:\n", ""))),
            load("keys:\n  - {kid: k, alg: ed25519, public_key: AAAA, platforms: [acme]}\n"),
            load(&key(", secret_file: mac")),
            load("keys:\n  - {kid: k, alg: hs256, secret_file: mac, platforms: [acme]}\n"),
            load("keys:\n  - {kid: k, alg: hs256, secret_file: a, platforms: [acme]}\n"),
            load(&key("").replace("[acme]", "[codex]")),
            load(&key("").replace("[acme]", "[]")),
            load(&format!("clock_skew_secs: 86400\n{}", key(""))),
        ]
        .join("\n");
        assert!(!text.contains(&public), "no key material in errors");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn every_refusal_message() {
        let errors = [
            SignatureError::Missing,
            SignatureError::Malformed {
                problem: "must be a JSON string; got number".into(),
            },
            SignatureError::Forged { kid: "a".into() },
            SignatureError::UnknownKey { kid: "z".into() },
            SignatureError::PlatformNotAllowed {
                kid: "a".into(),
                platform: "billing".into(),
                allowed: vec!["acme".into(), "acme-eu".into()],
            },
            SignatureError::Expired {
                exp: NOW - 61,
                now: NOW,
                skew: 60,
            },
            SignatureError::NotYetValid {
                iat: NOW + 61,
                now: NOW,
                skew: 60,
            },
            SignatureError::Unsigned {
                key: "callId".into(),
            },
        ];
        let codes: std::collections::BTreeSet<&str> = errors.iter().map(|e| e.code()).collect();
        assert_eq!(codes, SignatureError::CODES.into_iter().collect());
        let text: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {e}", e.code()))
            .collect();
        insta::assert_snapshot!(text.join("\n"));
    }
}
