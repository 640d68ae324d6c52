//! Trusted per-call identity: where it may come from, what it must look like, where it must not be.
//!
//! A spend call is identified by an ID that the harness (the client program running the agent
//! loop) writes into the request's `_meta`, never by anything the model wrote into the arguments.
//! This module is the single home of those rules; the probe, `classify`, the router and the
//! conformance runner all call it, so a verdict means the same thing everywhere.
//!
//! # Sources
//! The sources are data, an [`IdentitySources`] table; the built-in one is:
//!
//! | `_meta` key | platform | identifier |
//! |---|---|---|
//! | `callId` | `codex` | the string itself |
//! | `claudecode/toolUseId` | `claude-code` | the string itself |
//! | `hubu.dev/platform-invocation` | the envelope's `platform` | the envelope's `invocation_id` |
//!
//! An operator extends it without code ([`IdentitySources::load`], `--identity-sources FILE`;
//! the [`PRESETS`] ship in the binary, printed by `callid identity-sources --print-preset NAME`):
//! each entry is a `_meta` key, a platform, a length bound and a
//! trust note (a key is only as trustworthy as the harness that sets it). Loading refuses unknown
//! fields, a key or platform listed twice, bad key names, reserved keys ([`RESERVED_KEYS`]:
//! `progressToken`, which is per attempt; `io.modelcontextprotocol/*`; `callid/*`; the
//! envelope's signature key) and a built-in platform name, naming
//! the file, the entry and the fix ([`SourcesError`]). The rules below apply to every entry.
//! The table, its loading and its rendering are one file (`sources`); this file holds the rules.
//!
//! # Guarantees
//! - Exactly one source must be present ([`from_meta`]): none fails closed
//!   ([`IdentityError::Missing`]), two or more are refused ([`IdentityError::Ambiguous`]).
//! - Every identifier is a JSON string of 1 to [`MAX_ID_BYTES`] bytes with no surrounding white
//!   space and no control characters; a platform name is 1 to [`MAX_PLATFORM_BYTES`] characters of
//!   `[A-Za-z0-9._-]`. The envelope's unknown fields are refused.
//! - [`check_arguments`] refuses any identity-like key at any depth of the model-written
//!   arguments, naming its JSON pointer; [`IdentitySources::check_arguments`] adds the table's
//!   keys to the deny list.
//! - A table source may not claim a built-in platform, and an envelope may not claim a built-in
//!   platform or a table source's.
//! - The envelope cannot speak for a built-in source: its `platform` may not be one of
//!   [`BUILT_IN_PLATFORMS`] (`codex`, `claude-code`, in any letter case), so an envelope can never
//!   land on the rows of a real Codex `callId` or Claude Code `toolUseId` (it is refused with
//!   `invalid_identity`, rather than namespaced, so that a platform name means one thing everywhere).
//! - An envelope identity is keyed by platform, `installation_id` (when sent) and
//!   `invocation_id` ([`Identity::key_installation`]): two installations of one platform that send
//!   the same `invocation_id` are two calls.
//!
//! # Signatures
//! A platform may sign its envelope ([`signature`]: a detached JWS beside it in `_meta`); a router
//! given trust keys ([`trust`], `--trust-keys FILE`) then accepts an envelope only with a valid
//! signature by a key allowed for its platform, and harness identities only when the operator
//! accepts them unsigned. Without trust keys nothing here changes: the signature is ignored.

use serde_json::{Map, Value};

pub mod signature;
mod sources;
pub mod tools;
pub mod trust;

pub use sources::{
    IdentitySources, MAX_SOURCE_KEY_BYTES, PRESETS, RESERVED_KEYS, SourceEntry, SourcesError,
    ValueRule,
};

/// `_meta` key of Codex's per-call ID.
pub const CODEX_KEY: &str = "callId";
/// `_meta` key of Claude Code's per-call ID.
pub const CLAUDE_CODE_KEY: &str = "claudecode/toolUseId";
/// `_meta` key of the typed platform-invocation envelope.
pub const ENVELOPE_KEY: &str = "hubu.dev/platform-invocation";
/// Every accepted source key, in the order they are named in messages.
pub const SOURCE_KEYS: [&str; 3] = [CODEX_KEY, CLAUDE_CODE_KEY, ENVELOPE_KEY];
/// Longest identifier accepted, in UTF-8 bytes.
pub const MAX_ID_BYTES: usize = 512;
/// Longest platform name accepted.
pub const MAX_PLATFORM_BYTES: usize = 64;
/// Platform names of the built-in sources, which an envelope may not claim.
pub const BUILT_IN_PLATFORMS: [&str; 2] = ["codex", "claude-code"];

/// Fields the envelope may carry; any other is refused.
pub const ENVELOPE_FIELDS: [&str; 4] = ["platform", "invocation_id", "installation_id", "task_id"];

/// Identity-like argument names, normalized (lowercase, with `_`, `-`, `.` and `/` removed).
/// A key in the arguments whose normalized name, or whose last `/`-separated segment's, is in
/// this list is refused.
pub const FORBIDDEN_ARGUMENT_NAMES: &[&str] = &[
    "operationkey",
    "operationid",
    "privatekey",
    "callid",
    "toolcallid",
    "tooluseid",
    "harnesscallid",
    "platform",
    "platforminvocation",
    "taskid",
    "invocationid",
    "installationid",
    "idempotencykey",
    "idempotencyid",
    "requestid",
    "meta",
];

/// Which `_meta` key an identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Codex's `callId`.
    CodexCallId,
    /// Claude Code's `claudecode/toolUseId`.
    ClaudeCodeToolUseId,
    /// The `hubu.dev/platform-invocation` envelope.
    PlatformInvocation,
    /// A source of an operator's table (`--identity-sources FILE`); its key is
    /// [`Identity::source_key`].
    Extended,
}

impl Source {
    /// The `_meta` key a built-in source is read from; for [`Source::Extended`], whose key is
    /// data, the word `extended` (read the key from [`Identity::source_key`]).
    pub fn key(self) -> &'static str {
        match self {
            Source::CodexCallId => CODEX_KEY,
            Source::ClaudeCodeToolUseId => CLAUDE_CODE_KEY,
            Source::PlatformInvocation => ENVELOPE_KEY,
            Source::Extended => "extended",
        }
    }

    /// The built-in source read from `key`, if `key` is a built-in source key.
    pub fn from_key(key: &str) -> Option<Source> {
        match key {
            CODEX_KEY => Some(Source::CodexCallId),
            CLAUDE_CODE_KEY => Some(Source::ClaudeCodeToolUseId),
            ENVELOPE_KEY => Some(Source::PlatformInvocation),
            _ => None,
        }
    }
}

/// A normalized trusted identity: which platform's call this is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    /// Platform name (`codex`, `claude-code`, or the envelope's).
    pub platform: String,
    /// The harness's ID for this call.
    pub harness_call_id: String,
    /// Where it was read from.
    pub source: Source,
    /// The `_meta` key it was read from.
    #[serde(skip)]
    pub source_key: String,
    /// The envelope's `installation_id`, if sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<String>,
    /// The envelope's `task_id`, if sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

impl Identity {
    /// The installation part of this identity's registry key: the envelope's `installation_id`,
    /// or the empty string when none was sent (the built-in sources have none).
    pub fn key_installation(&self) -> &str {
        self.installation_id.as_deref().unwrap_or("")
    }
}

/// Why a call has no trusted identity. Each variant has a stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// No source key in `_meta` (or no `_meta` at all).
    #[error(
        "spend tools require a trusted per-call identity in `_meta` from Codex (`callId`), Claude \
         Code (`claudecode/toolUseId`), or the `hubu.dev/platform-invocation` envelope, and this \
         request has none; retrying will not help: use a client that sends a per-call ID"
    )]
    Missing,
    /// No source key in `_meta`, under a table with extra sources (`--identity-sources`).
    #[error(
        "spend tools require a trusted per-call identity in `_meta` from Codex (`callId`), Claude \
         Code (`claudecode/toolUseId`), the `hubu.dev/platform-invocation` envelope, or a source \
         of the `--identity-sources` table ({}), and this request has none; retrying will not \
         help: use a client that sends a per-call ID",
        .sources.join(", ")
    )]
    MissingExtended {
        /// The extra sources, as `` `key` (platform) ``.
        sources: Vec<String>,
    },
    /// More than one source key in `_meta`.
    #[error(
        "ambiguous identity: `_meta` carries {} at once; exactly one per-call identity source \
         is accepted",
        .keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" and ")
    )]
    Ambiguous {
        /// The source keys found.
        keys: Vec<String>,
    },
    /// A source is present but breaks a rule.
    #[error("invalid identity: `{field}` {rule}")]
    Invalid {
        /// Where: `_meta.callId`, `_meta["hubu.dev/platform-invocation"].platform`, ...
        field: String,
        /// The rule broken, as a fragment that reads after the field name.
        rule: String,
    },
    /// An identity-like key in the model-written arguments.
    #[error(
        "identity in arguments: `{path}` is an identity field, and identity is taken only from \
         the harness's `_meta`, never from model-written arguments; remove it and call again"
    )]
    InArguments {
        /// JSON pointer of the key inside the arguments.
        path: String,
    },
}

impl IdentityError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::Missing | IdentityError::MissingExtended { .. } => "missing_identity",
            IdentityError::Ambiguous { .. } => "ambiguous_identity",
            IdentityError::Invalid { .. } => "invalid_identity",
            IdentityError::InArguments { .. } => "identity_in_arguments",
        }
    }

    /// Every code this module can return, for documentation and tests.
    pub const CODES: [&'static str; 4] = [
        "missing_identity",
        "ambiguous_identity",
        "invalid_identity",
        "identity_in_arguments",
    ];
}

/// Reads the trusted identity from a request's `_meta` (`None` when the request has none), by
/// the built-in table ([`IdentitySources::built_in`]).
pub fn from_meta(meta: Option<&Value>) -> Result<Identity, IdentityError> {
    IdentitySources::built_in_ref().from_meta(meta)
}

impl IdentitySources {
    /// Refuses identity smuggled into model-written arguments: [`check_arguments`], with this
    /// table's keys added to the deny list.
    pub fn check_arguments(&self, arguments: &Value) -> Result<(), IdentityError> {
        let mut path = String::new();
        walk_arguments(arguments, &mut path, &|k| self.is_identity_like(k))
    }

    /// [`is_identity_like`], with this table's keys added to the deny list.
    pub fn is_identity_like(&self, key: &str) -> bool {
        is_identity_like(key) || {
            let whole = normalize_name(key);
            self.extended_names.contains(&whole)
        }
    }

    /// Reads the trusted identity from a request's `_meta` (`None` when the request has none).
    pub fn from_meta(&self, meta: Option<&Value>) -> Result<Identity, IdentityError> {
        match meta {
            None | Some(Value::Null) => Err(self.missing()),
            Some(Value::Object(map)) => self.from_meta_map(map),
            Some(other) => Err(IdentityError::Invalid {
                field: "_meta".into(),
                rule: format!("must be a JSON object; got {}", type_name(other)),
            }),
        }
    }

    /// Reads the trusted identity from a `_meta` object: exactly one of this table's keys.
    pub fn from_meta_map(&self, meta: &Map<String, Value>) -> Result<Identity, IdentityError> {
        let present: Vec<&SourceEntry> = self
            .entries
            .iter()
            .filter(|e| meta.contains_key(&e.key))
            .collect();
        match present.as_slice() {
            [] => Err(self.missing()),
            [entry] => {
                let value = &meta[&entry.key];
                let field = field_name(&entry.key);
                match (&entry.value, entry.platform.as_deref()) {
                    (ValueRule::Envelope, _) => self.envelope(value),
                    (ValueRule::Identifier { max_bytes }, Some(platform)) => Ok(Identity {
                        platform: platform.to_string(),
                        harness_call_id: identifier_within(value, &field, *max_bytes)?,
                        source: entry.source,
                        source_key: entry.key.clone(),
                        installation_id: None,
                        task_id: None,
                    }),
                    (ValueRule::Identifier { .. }, None) => {
                        unreachable!("a loaded identifier source names its platform")
                    }
                }
            }
            many => Err(IdentityError::Ambiguous {
                keys: many.iter().map(|e| e.key.clone()).collect(),
            }),
        }
    }

    /// The `missing_identity` error of this table, naming its extra sources.
    fn missing(&self) -> IdentityError {
        let sources: Vec<String> = self
            .extended()
            .map(|e| format!("`{}` ({})", e.key, e.platform.as_deref().unwrap_or("")))
            .collect();
        if sources.is_empty() {
            IdentityError::Missing
        } else {
            IdentityError::MissingExtended { sources }
        }
    }

    fn envelope(&self, value: &Value) -> Result<Identity, IdentityError> {
        let base = format!("_meta[\"{ENVELOPE_KEY}\"]");
        let Value::Object(map) = value else {
            return Err(IdentityError::Invalid {
                field: base,
                rule: format!(
                    "must be an object {{platform, invocation_id, installation_id?, task_id?}}; got {}",
                    type_name(value)
                ),
            });
        };
        if let Some(unknown) = map.keys().find(|k| !ENVELOPE_FIELDS.contains(&k.as_str())) {
            return Err(IdentityError::Invalid {
                field: format!("{base}.{unknown}"),
                rule: "is not an envelope field; accepted fields are platform, invocation_id, \
                       installation_id and task_id"
                    .into(),
            });
        }
        let required = |name: &str| {
            map.get(name).ok_or_else(|| IdentityError::Invalid {
                field: format!("{base}.{name}"),
                rule: "is required".into(),
            })
        };
        let optional = |name: &str| {
            map.get(name)
                .map(|v| identifier(v, &format!("{base}.{name}")))
                .transpose()
        };
        let platform_field = format!("{base}.platform");
        let platform = platform_name(required("platform")?, &platform_field)?;
        if let Some(built_in) = BUILT_IN_PLATFORMS
            .iter()
            .find(|b| b.eq_ignore_ascii_case(&platform))
        {
            return Err(IdentityError::Invalid {
                field: platform_field,
                rule: format!(
                    "is `{platform}`, the platform of a built-in source; an envelope cannot claim \
                     it: `{built_in}` calls are identified by their own `_meta` key, so send that key \
                     instead, or name the envelope's own platform"
                ),
            });
        }
        if let Some(entry) = self.extended().find(|e| {
            e.platform
                .as_deref()
                .is_some_and(|p| p.eq_ignore_ascii_case(&platform))
        }) {
            return Err(IdentityError::Invalid {
                field: platform_field,
                rule: format!(
                    "is `{platform}`, the platform of the source `{}` in this router's identity \
                     table; an envelope cannot claim it: send that key instead, or name the \
                     envelope's own platform",
                    entry.key
                ),
            });
        }
        Ok(Identity {
            platform,
            harness_call_id: identifier(
                required("invocation_id")?,
                &format!("{base}.invocation_id"),
            )?,
            source: Source::PlatformInvocation,
            source_key: ENVELOPE_KEY.to_string(),
            installation_id: optional("installation_id")?,
            task_id: optional("task_id")?,
        })
    }
}

/// How a `_meta` key is named in messages: `_meta.callId` for a plain name, `_meta["a/b"]`
/// otherwise.
pub fn field_name(key: &str) -> String {
    if key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        format!("_meta.{key}")
    } else {
        format!("_meta[\"{key}\"]")
    }
}

/// Checks one identifier against the bounds: a JSON string, 1 to 512 bytes, no surrounding white
/// space, no control characters.
pub fn identifier(value: &Value, field: &str) -> Result<String, IdentityError> {
    identifier_within(value, field, MAX_ID_BYTES)
}

/// [`identifier`] with a tighter length bound (`max_bytes` at most [`MAX_ID_BYTES`]).
fn identifier_within(
    value: &Value,
    field: &str,
    max_bytes: usize,
) -> Result<String, IdentityError> {
    let invalid = |rule: String| IdentityError::Invalid {
        field: field.to_string(),
        rule,
    };
    let Value::String(s) = value else {
        return Err(invalid(format!(
            "must be a JSON string; got {}",
            type_name(value)
        )));
    };
    if s.is_empty() {
        return Err(invalid("must not be empty".into()));
    }
    if s.len() > max_bytes {
        return Err(invalid(format!(
            "must be at most {max_bytes} bytes; got {} bytes",
            s.len()
        )));
    }
    if s.trim() != s {
        return Err(invalid(
            "must not have leading or trailing white space".into(),
        ));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "must not contain control characters; found U+{:04X}",
            c as u32
        )));
    }
    Ok(s.clone())
}

/// Checks a platform name: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn platform_name(value: &Value, field: &str) -> Result<String, IdentityError> {
    let invalid = |rule: String| IdentityError::Invalid {
        field: field.to_string(),
        rule,
    };
    let Value::String(s) = value else {
        return Err(invalid(format!(
            "must be a JSON string; got {}",
            type_name(value)
        )));
    };
    if s.is_empty() || s.len() > MAX_PLATFORM_BYTES {
        return Err(invalid(format!(
            "must be 1 to {MAX_PLATFORM_BYTES} characters; got {}",
            s.len()
        )));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(
            "may contain only A-Z, a-z, 0-9, `.`, `_` and `-`".into(),
        ));
    }
    Ok(s.clone())
}

/// Refuses identity smuggled into model-written arguments: any identity-like key at any depth.
pub fn check_arguments(arguments: &Value) -> Result<(), IdentityError> {
    let mut path = String::new();
    walk_arguments(arguments, &mut path, &is_identity_like)
}

fn walk_arguments(
    value: &Value,
    path: &mut String,
    is_identity_like: &dyn Fn(&str) -> bool,
) -> Result<(), IdentityError> {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                crate::canonical::push_pointer_token(path, key);
                if is_identity_like(key) {
                    return Err(IdentityError::InArguments { path: path.clone() });
                }
                walk_arguments(item, path, is_identity_like)?;
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk_arguments(item, path, is_identity_like)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether an argument name is identity-like (see [`FORBIDDEN_ARGUMENT_NAMES`]).
pub fn is_identity_like(key: &str) -> bool {
    let whole = normalize_name(key);
    let last = key
        .rsplit('/')
        .next()
        .map(normalize_name)
        .unwrap_or_default();
    FORBIDDEN_ARGUMENT_NAMES
        .iter()
        .chain(NORMALIZED_SOURCE_KEYS.iter())
        .any(|f| *f == whole || *f == last)
}

/// An argument name as it is compared: lowercase, with `_`, `-`, `.` and `/` removed.
pub(super) fn normalize_name(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '_' | '-' | '.' | '/'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// [`SOURCE_KEYS`] normalized as [`is_identity_like`] normalizes argument names (checked by a
/// test), so no argument can carry a source key under another spelling.
const NORMALIZED_SOURCE_KEYS: [&str; 3] =
    ["callid", "claudecodetooluseid", "hubudevplatforminvocation"];

/// The JSON type of a value, as named in messages and shape records.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    type Verdict = Result<(String, String), &'static str>;

    fn verdict(meta: Value) -> Verdict {
        from_meta(Some(&meta))
            .map(|i| (i.platform, i.harness_call_id))
            .map_err(|e| e.code())
    }

    #[test]
    fn sources_table() {
        let ok = |p: &str, id: &str| Ok((p.to_string(), id.to_string()));
        let long = "x".repeat(512);
        let too_long = "x".repeat(513);
        let cases: Vec<(Value, Verdict)> = vec![
            (json!({"callId": "call_abc"}), ok("codex", "call_abc")),
            (
                json!({"claudecode/toolUseId": "toolu_1"}),
                ok("claude-code", "toolu_1"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "hubu", "invocation_id": "inv-1"}}),
                ok("hubu", "inv-1"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "a.b_c-9", "invocation_id": "i",
                        "installation_id": "inst", "task_id": "t"}}),
                ok("a.b_c-9", "i"),
            ),
            (json!({"callId": long.clone()}), ok("codex", &long)),
            (json!({"callId": "é"}), ok("codex", "é")),
            (json!({}), Err("missing_identity")),
            (
                json!({"sessionId": "s", "openai/session": "x"}),
                Err("missing_identity"),
            ),
            (json!({"progressToken": 0}), Err("missing_identity")),
            (
                json!({"callid": "lowercase is not the key"}),
                Err("missing_identity"),
            ),
            (
                json!({"callId": "a", "claudecode/toolUseId": "b"}),
                Err("ambiguous_identity"),
            ),
            (
                json!({"callId": "a", "hubu.dev/platform-invocation": {"platform": "p", "invocation_id": "i"}}),
                Err("ambiguous_identity"),
            ),
            (json!({"callId": ""}), Err("invalid_identity")),
            (json!({"callId": too_long}), Err("invalid_identity")),
            (json!({"callId": " a"}), Err("invalid_identity")),
            (json!({"callId": "a\n"}), Err("invalid_identity")),
            (json!({"callId": "a\u{7}b"}), Err("invalid_identity")),
            (json!({"callId": "a\u{85}b"}), Err("invalid_identity")),
            (json!({"callId": 12}), Err("invalid_identity")),
            (json!({"callId": null}), Err("invalid_identity")),
            (json!({"callId": ["a"]}), Err("invalid_identity")),
            (
                json!({"claudecode/toolUseId": true}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": "inv"}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "p"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "p", "invocation_id": "i", "amount": 1}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "p q", "invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "p".repeat(65), "invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "", "invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "p", "invocation_id": "i", "task_id": 3}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "codex", "invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "Claude-Code", "invocation_id": "i"}}),
                Err("invalid_identity"),
            ),
            (
                json!({"hubu.dev/platform-invocation": {"platform": "codex-cloud", "invocation_id": "i"}}),
                ok("codex-cloud", "i"),
            ),
        ];
        for (meta, want) in cases {
            assert_eq!(verdict(meta.clone()), want, "_meta = {meta}");
        }
    }

    #[test]
    fn no_meta_and_non_object_meta() {
        assert_eq!(from_meta(None).unwrap_err().code(), "missing_identity");
        assert_eq!(
            from_meta(Some(&Value::Null)).unwrap_err().code(),
            "missing_identity"
        );
        assert_eq!(
            from_meta(Some(&json!([1]))).unwrap_err().code(),
            "invalid_identity"
        );
    }

    #[test]
    fn identity_like_arguments_are_refused_at_any_depth() {
        let names = [
            "operation_key",
            "operationKey",
            "callId",
            "call_id",
            "CALL-ID",
            "tool_use_id",
            "toolUseId",
            "platform",
            "Platform",
            "task_id",
            "invocation_id",
            "installation_id",
            "idempotency_key",
            "Idempotency-Key",
            "_meta",
            "meta",
            "request_id",
            "claudecode/toolUseId",
            "hubu.dev/platform-invocation",
            "x/callId",
            "tool_call_id",
        ];
        let token = |parent: &str, name: &str| {
            let mut path = parent.to_string();
            crate::canonical::push_pointer_token(&mut path, name);
            path
        };
        for name in names {
            for (args, path) in [
                (json!({name: "x"}), token("/", name)),
                (
                    json!({"prompt": "fox", "options": [{"a": 1}, {name: "x"}]}),
                    token("/options/1/", name),
                ),
            ] {
                let err = check_arguments(&args).unwrap_err();
                assert_eq!(err, IdentityError::InArguments { path }, "{name}");
            }
        }
        for fine in [
            "prompt",
            "width",
            "model",
            "call",
            "platforms_supported",
            "metadata",
            "id",
        ] {
            assert!(
                check_arguments(&json!({fine: {"nested": [1, "callId"]}})).is_ok(),
                "{fine}"
            );
        }
    }

    #[test]
    fn normalized_source_keys_match_the_source_keys() {
        let want: Vec<String> = SOURCE_KEYS.iter().map(|k| normalize_name(k)).collect();
        assert_eq!(NORMALIZED_SOURCE_KEYS.to_vec(), want);
    }

    #[test]
    fn messages_snapshot() {
        let errors = [
            from_meta(Some(&json!({}))).unwrap_err(),
            from_meta(Some(&json!({"callId": "a", "claudecode/toolUseId": "b"}))).unwrap_err(),
            from_meta(Some(&json!([]))).unwrap_err(),
            from_meta(Some(&json!({"callId": ""}))).unwrap_err(),
            from_meta(Some(&json!({"callId": "x".repeat(513)}))).unwrap_err(),
            from_meta(Some(&json!({"callId": " x"}))).unwrap_err(),
            from_meta(Some(&json!({"callId": "a\u{1}"}))).unwrap_err(),
            from_meta(Some(&json!({"claudecode/toolUseId": 7}))).unwrap_err(),
            from_meta(Some(
                &json!({"hubu.dev/platform-invocation": {"platform": "p"}}),
            ))
            .unwrap_err(),
            from_meta(Some(&json!({"hubu.dev/platform-invocation":
                {"platform": "p", "invocation_id": "i", "amount_cents": 1}})))
            .unwrap_err(),
            from_meta(Some(&json!({"hubu.dev/platform-invocation":
                {"platform": "bad name", "invocation_id": "i"}})))
            .unwrap_err(),
            from_meta(Some(&json!({"hubu.dev/platform-invocation":
                {"platform": "codex", "invocation_id": "i"}})))
            .unwrap_err(),
            check_arguments(&json!({"prompt": "fox", "extra": {"idempotency_key": "k"}}))
                .unwrap_err(),
        ];
        let text: String = errors
            .iter()
            .map(|e| format!("{}: {e}\n", e.code()))
            .collect();
        insta::assert_snapshot!(text);
    }

    fn goose() -> IdentitySources {
        let mut t = IdentitySources::built_in();
        t.extend_from_yaml(
            "sources:\n  - key: agent-tool-call-request-id\n    platform: goose\n    \
             max_bytes: 64\n    trust: set by goose\n",
            "goose.yaml",
        )
        .unwrap();
        t
    }

    #[test]
    fn extended_sources_obey_every_rule() {
        let t = goose();
        let v = |meta: Value| {
            t.from_meta(Some(&meta))
                .map(|i| (i.platform, i.harness_call_id, i.source, i.source_key))
                .map_err(|e| e.code())
        };
        let key = "agent-tool-call-request-id";
        assert_eq!(
            v(json!({key: "toolu_9", "agent-session-id": "s"})),
            Ok((
                "goose".into(),
                "toolu_9".into(),
                Source::Extended,
                key.into()
            ))
        );
        assert_eq!(
            v(json!({"callId": "c"})),
            Ok((
                "codex".into(),
                "c".into(),
                Source::CodexCallId,
                "callId".into()
            ))
        );
        for (meta, code) in [
            (json!({key: "a", "callId": "b"}), "ambiguous_identity"),
            (
                json!({key: "a", "claudecode/toolUseId": "b"}),
                "ambiguous_identity",
            ),
            (json!({key: ""}), "invalid_identity"),
            (json!({key: "x".repeat(65)}), "invalid_identity"),
            (json!({key: " x"}), "invalid_identity"),
            (json!({key: 3}), "invalid_identity"),
            (json!({"agent-session-id": "s"}), "missing_identity"),
            (
                json!({ENVELOPE_KEY: {"platform": "Goose", "invocation_id": "i"}}),
                "invalid_identity",
            ),
        ] {
            assert_eq!(v(meta.clone()), Err(code), "{meta}");
        }
        assert_eq!(v(json!({key: "x".repeat(64)})).unwrap().0, "goose");
        assert_eq!(
            t.from_meta(None).unwrap_err().to_string(),
            "spend tools require a trusted per-call identity in `_meta` from Codex (`callId`), \
             Claude Code (`claudecode/toolUseId`), the `hubu.dev/platform-invocation` envelope, \
             or a source of the `--identity-sources` table (`agent-tool-call-request-id` \
             (goose)), and this request has none; retrying will not help: use a client that \
             sends a per-call ID"
        );
        // Without the table the key is nobody's identity.
        assert_eq!(
            from_meta(Some(&json!({key: "a"}))).unwrap_err().code(),
            "missing_identity"
        );
        // An envelope may still name goose where no table claims it.
        assert!(
            from_meta(Some(
                &json!({ENVELOPE_KEY: {"platform": "goose", "invocation_id": "i"}})
            ))
            .is_ok()
        );
        // The key joins the identity-in-arguments deny list.
        for name in [
            "agent-tool-call-request-id",
            "agent_tool_call_request_id",
            "AgentToolCallRequestId",
        ] {
            assert_eq!(
                t.check_arguments(&json!({"opts": {name: "x"}}))
                    .unwrap_err(),
                IdentityError::InArguments {
                    path: format!("/opts/{name}")
                }
            );
            assert!(check_arguments(&json!({name: "x"})).is_ok(), "{name}");
        }
        assert!(
            t.check_arguments(&json!({"prompt": "fox", "agent": "x"}))
                .is_ok()
        );
        assert_eq!(t.capabilities()[3]["meta_key"], key);
        assert_eq!(
            IdentitySources::built_in().capabilities(),
            json!([
                {"meta_key": "callId", "platform": "codex"},
                {"meta_key": "claudecode/toolUseId", "platform": "claude-code"},
                {"meta_key": ENVELOPE_KEY, "platform": "<envelope platform>", "fields": ENVELOPE_FIELDS},
            ])
        );
    }
}
