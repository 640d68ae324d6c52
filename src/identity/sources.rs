//! The identity-source table ([`IdentitySources`]): the built-in sources, the operator's YAML
//! files that extend them (strict loading, every refusal naming the file, the entry and the fix:
//! [`SourcesError`]), and the table rendered as text and as capabilities. The rules every entry
//! obeys are the module's ([`super`]).

use super::IdentityError;
use super::{
    BUILT_IN_PLATFORMS, CLAUDE_CODE_KEY, CODEX_KEY, ENVELOPE_FIELDS, ENVELOPE_KEY, MAX_ID_BYTES,
    Source, normalize_name, platform_name,
};
use serde_json::Value;

/// The identity-source tables that ship with callid, off by default: (name, YAML text of
/// `identity-sources/NAME.yaml`). `callid identity-sources --print-preset NAME` prints one, so an
/// installed user has the file to pass to `--identity-sources`.
pub const PRESETS: &[(&str, &str)] = &[
    ("goose", include_str!("../../identity-sources/goose.yaml")),
    ("gsd-pi", include_str!("../../identity-sources/gsd-pi.yaml")),
];

/// How a source's value is read and bounded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ValueRule {
    /// A bare identifier: a JSON string of 1 to `max_bytes` bytes, no surrounding white space,
    /// no control characters. The platform is the source's.
    Identifier {
        /// Longest value accepted, in UTF-8 bytes (at most [`MAX_ID_BYTES`]).
        max_bytes: usize,
    },
    /// The typed envelope: `{platform, invocation_id, installation_id?, task_id?}`, the platform
    /// named in it (never a built-in's or a table source's).
    Envelope,
}

/// One row of an identity-source table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SourceEntry {
    /// The top-level `_meta` key.
    pub key: String,
    /// The platform its calls are recorded under (`None` for the envelope, which names its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// How the value is read.
    pub value: ValueRule,
    /// Who sets the key, and why the model cannot: a key is only as trustworthy as the harness
    /// that sets it.
    pub trust: String,
    /// `built-in`, or the file the entry was loaded from.
    pub origin: String,
    /// The [`Source`] its identities carry.
    #[serde(skip)]
    pub source: Source,
}

/// The identity sources a probe, `classify` or router accepts: the built-in table, extended by
/// operator files (`--identity-sources FILE`). Every rule of this module applies to every entry:
/// exactly one source per call, the value bounds, ambiguity, identity in the arguments (an
/// entry's key joins the deny list), and the envelope's platform rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySources {
    pub(super) entries: Vec<SourceEntry>,
    /// Keys of the extended entries, normalized as argument names are.
    pub(super) extended_names: Vec<String>,
}

impl Default for IdentitySources {
    fn default() -> Self {
        IdentitySources::built_in()
    }
}

static BUILT_IN: std::sync::LazyLock<std::sync::Arc<IdentitySources>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(IdentitySources::built_in()));

/// Longest `_meta` key an identity-source file may name.
pub const MAX_SOURCE_KEY_BYTES: usize = 128;

/// `_meta` keys no table may use, with why: values that are per attempt or belong to the
/// protocol or to callid itself.
pub const RESERVED_KEYS: &[(&str, &str)] = &[
    (
        "progressToken",
        "is the MCP progress token, which a client picks per request (Gemini CLI sends a fresh \
         UUID on every attempt), so a redelivery carries a new one and it can never deduplicate",
    ),
    (
        "io.modelcontextprotocol/",
        "is the MCP protocol's own namespace (protocol version, client capabilities and info), \
         sent on every request and never per call",
    ),
    (
        "callid/",
        "is callid's own namespace (`callid/replayed` marks replayed results)",
    ),
    (
        super::signature::SIGNATURE_KEY,
        "is the signature beside the `hubu.dev/platform-invocation` envelope: it is verified \
         with `--trust-keys`, and a platform may sign each delivery afresh, so a redelivery can \
         carry another one",
    ),
];

impl IdentitySources {
    /// The built-in table: Codex `callId`, Claude Code `claudecode/toolUseId`, the envelope.
    pub fn built_in() -> Self {
        let entry = |key: &str, platform: Option<&str>, value, source, trust: &str| SourceEntry {
            key: key.into(),
            platform: platform.map(Into::into),
            value,
            trust: trust.into(),
            origin: "built-in".into(),
            source,
        };
        let id = ValueRule::Identifier {
            max_bytes: MAX_ID_BYTES,
        };
        IdentitySources {
            entries: vec![
                entry(
                    CODEX_KEY,
                    Some("codex"),
                    id.clone(),
                    Source::CodexCallId,
                    "set by Codex CLI on each tool call from the model's call id; the model \
                     writes arguments, never `_meta`",
                ),
                entry(
                    CLAUDE_CODE_KEY,
                    Some("claude-code"),
                    id,
                    Source::ClaudeCodeToolUseId,
                    "set by Claude Code on each tool call from the model's `tool_use` id; the \
                     model writes arguments, never `_meta` (pi sets this key too, to its own \
                     tool call id)",
                ),
                entry(
                    ENVELOPE_KEY,
                    None,
                    ValueRule::Envelope,
                    Source::PlatformInvocation,
                    "set by a platform that runs the agent loop; its `platform` may not be a \
                     built-in's or a table source's, and its identities are keyed by \
                     `installation_id` too",
                ),
            ],
            extended_names: Vec::new(),
        }
    }

    /// The shared built-in table.
    pub fn built_in_ref() -> &'static IdentitySources {
        &BUILT_IN
    }

    /// The shared built-in table, to hold beside extended ones.
    pub fn built_in_shared() -> std::sync::Arc<IdentitySources> {
        BUILT_IN.clone()
    }

    /// The built-in table extended by each file, in order.
    pub fn load(paths: &[std::path::PathBuf]) -> Result<Self, SourcesError> {
        let mut table = IdentitySources::built_in();
        for path in paths {
            let text = std::fs::read_to_string(path).map_err(|source| SourcesError::Read {
                path: path.clone(),
                hint: read_hint(path, &source),
                cause: source.to_string(),
            })?;
            table.extend_from_yaml(&text, &path.display().to_string())?;
        }
        Ok(table)
    }

    /// Adds the entries of one YAML table (`origin` names it in errors).
    pub fn extend_from_yaml(&mut self, text: &str, origin: &str) -> Result<(), SourcesError> {
        let file: SourcesFile = crate::yaml::from_str(text).map_err(|e| SourcesError::Parse {
            path: origin.into(),
            at: e.path,
            message: e.message,
        })?;
        if file.sources.is_empty() {
            return Err(SourcesError::Parse {
                path: origin.into(),
                at: "sources".into(),
                message: "is empty; list at least one source, or do not pass this file".into(),
            });
        }
        for (index, raw) in file.sources.into_iter().enumerate() {
            let bad = |problem: String, fix: &str| SourcesError::Entry {
                path: origin.into(),
                index,
                key: raw.key.clone(),
                problem,
                fix: fix.into(),
            };
            check_source_key(&raw.key).map_err(|p| {
                bad(
                    p,
                    "name the top-level `_meta` key exactly as the harness sends it, e.g. \
                     `agent-tool-call-request-id`",
                )
            })?;
            if let Some((_, why)) = RESERVED_KEYS
                .iter()
                .find(|(k, _)| raw.key == *k || (k.ends_with('/') && raw.key.starts_with(k)))
            {
                return Err(bad(
                    format!("`{}` {why}", raw.key),
                    "remove this entry: only a value that the harness keeps for every delivery \
                     of one call is a call ID",
                ));
            }
            if let Some(other) = self
                .entries
                .iter()
                .find(|e| e.key.eq_ignore_ascii_case(&raw.key))
            {
                return Err(bad(
                    if other.origin == "built-in" {
                        format!("`{}` is already a built-in source", other.key)
                    } else if other.key != raw.key {
                        format!(
                            "`{}` differs only in letter case from `{}`, already listed in `{}`",
                            raw.key, other.key, other.origin
                        )
                    } else {
                        format!("`{}` is already listed in `{}`", other.key, other.origin)
                    },
                    "list each key once; a built-in source needs no entry",
                ));
            }
            let platform = platform_name(&Value::String(raw.platform.clone()), "platform")
                .map_err(|e| match e {
                    IdentityError::Invalid { rule, .. } => bad(
                        format!("`platform` {rule}"),
                        "name the harness that sets the key, e.g. `goose`",
                    ),
                    other => bad(other.to_string(), "name the harness that sets the key"),
                })?;
            if let Some(b) = BUILT_IN_PLATFORMS
                .iter()
                .find(|b| b.eq_ignore_ascii_case(&platform))
            {
                return Err(bad(
                    format!(
                        "`platform` is `{platform}`, the platform of a built-in source, which a \
                         table cannot claim"
                    ),
                    &format!(
                        "name the harness that sets this key (not `{b}`): its calls must not land \
                         on the rows of real `{b}` calls"
                    ),
                ));
            }
            if let Some(other) = self.entries.iter().find(|e| {
                e.platform
                    .as_deref()
                    .is_some_and(|p| p.eq_ignore_ascii_case(&platform))
            }) {
                return Err(bad(
                    format!(
                        "`platform` `{platform}` is already the platform of `{}` ({})",
                        other.key, other.origin
                    ),
                    "give each key its own platform, so one call cannot be recorded under two IDs",
                ));
            }
            let max_bytes = raw.max_bytes.unwrap_or(MAX_ID_BYTES);
            if !(1..=MAX_ID_BYTES).contains(&max_bytes) {
                return Err(bad(
                    format!("`max_bytes` is {max_bytes}"),
                    &format!("use 1 to {MAX_ID_BYTES}, or leave it out for {MAX_ID_BYTES}"),
                ));
            }
            if raw.trust.trim().is_empty() {
                return Err(bad(
                    "`trust` is empty".into(),
                    "say who sets this key and why the model cannot: a key is only as \
                     trustworthy as the harness that sets it",
                ));
            }
            self.extended_names.push(normalize_name(&raw.key));
            self.entries.push(SourceEntry {
                key: raw.key,
                platform: Some(platform),
                value: ValueRule::Identifier { max_bytes },
                trust: raw.trust.trim().to_string(),
                origin: origin.into(),
                source: Source::Extended,
            });
        }
        Ok(())
    }

    /// Every entry, built-in first.
    pub fn entries(&self) -> &[SourceEntry] {
        &self.entries
    }

    /// The entries an operator added.
    pub fn extended(&self) -> impl Iterator<Item = &SourceEntry> {
        self.entries.iter().filter(|e| e.source == Source::Extended)
    }

    /// The entry read from `key`, if `key` is a source key of this table.
    pub fn entry(&self, key: &str) -> Option<&SourceEntry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// The table as a person reads it (`callid identity-sources`).
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let platform = e.platform.as_deref().unwrap_or("(named in the envelope)");
            let value = match &e.value {
                ValueRule::Identifier { max_bytes } => {
                    format!(
                        "string, 1 to {max_bytes} bytes, no surrounding space or control characters"
                    )
                }
                ValueRule::Envelope => format!("object {{{}}}", ENVELOPE_FIELDS.join(", ")),
            };
            out.push_str(&format!(
                "{}\n  platform: {platform}\n  value:    {value}\n  origin:   {}\n  trust:    {}\n",
                e.key, e.origin, e.trust
            ));
        }
        out.push_str(
            "\nrules: exactly one source per call (none: missing_identity; two or more: \
             ambiguous_identity); a source's key may not appear as an argument name \
             (identity_in_arguments); extend with --identity-sources FILE\n",
        );
        out
    }

    /// The `identity_sources` list of the router's `capabilities` answer.
    pub fn capabilities(&self) -> Value {
        Value::Array(
            self.entries
                .iter()
                .map(|e| match (&e.value, e.source) {
                    (ValueRule::Envelope, _) => serde_json::json!({
                        "meta_key": e.key, "platform": "<envelope platform>",
                        "fields": ENVELOPE_FIELDS,
                    }),
                    (ValueRule::Identifier { max_bytes }, Source::Extended) => serde_json::json!({
                        "meta_key": e.key, "platform": e.platform, "max_bytes": max_bytes,
                        "trust": e.trust,
                    }),
                    (ValueRule::Identifier { .. }, _) => {
                        serde_json::json!({"meta_key": e.key, "platform": e.platform})
                    }
                })
                .collect(),
        )
    }
}

/// A `_meta` key a table may name: 1 to [`MAX_SOURCE_KEY_BYTES`] characters of
/// `[A-Za-z0-9._/-]`, starting with a letter or digit.
fn check_source_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_SOURCE_KEY_BYTES {
        return Err(format!(
            "`key` must be 1 to {MAX_SOURCE_KEY_BYTES} characters; got {}",
            key.len()
        ));
    }
    if !key.as_bytes()[0].is_ascii_alphanumeric()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'))
    {
        return Err(format!(
            "`key` `{}` may contain only A-Z, a-z, 0-9, `.`, `_`, `/` and `-`, starting with a \
             letter or digit",
            key.escape_debug()
        ));
    }
    Ok(())
}

/// An identity-source file: `sources:` and a list of entries.
/// For a file that does not exist: how to write a preset's (named after the file when its name
/// is a preset's, `goose.yaml`), since the repository's `identity-sources/` is not installed.
fn read_hint(path: &std::path::Path, e: &std::io::Error) -> String {
    if e.kind() != std::io::ErrorKind::NotFound {
        return String::new();
    }
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    match PRESETS.iter().find(|(name, _)| *name == stem) {
        Some((name, _)) => format!(
            "; the preset `{name}` ships in the binary: write it with `callid identity-sources \
             --print-preset {name} > {}`",
            path.display()
        ),
        None => {
            let names: Vec<String> = PRESETS.iter().map(|(n, _)| format!("`{n}`")).collect();
            format!(
                "; the presets ({}) ship in the binary: write one with `callid identity-sources \
                 --print-preset NAME > FILE`",
                names.join(", ")
            )
        }
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SourcesFile {
    sources: Vec<SourceFileEntry>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `key`, `platform` and `trust`"
)]
struct SourceFileEntry {
    key: String,
    platform: String,
    #[serde(default)]
    max_bytes: Option<usize>,
    trust: String,
}

/// Why an identity-source file could not be loaded. Each variant has a stable
/// [`code`](Self::code).
#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    /// The file could not be read.
    #[error("failed to read the identity-source table `{}`: {cause}{hint}", .path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's reason.
        cause: String,
        /// How to get a preset's file when it does not exist (else empty).
        hint: String,
    },
    /// Not YAML of the expected shape.
    #[error(
        "identity-source table `{path}`: `{at}`: {message}; the format is \
         `sources: [{{key, platform, trust, max_bytes?}}]` (`callid identity-sources \
         --print-preset goose` prints an example)"
    )]
    Parse {
        /// The file.
        path: String,
        /// Where in it (`sources[1].trust`).
        at: String,
        /// What is wrong.
        message: String,
    },
    /// An entry breaks a rule.
    #[error("identity-source table `{path}`: `sources[{index}]` (`{key}`): {problem}; {fix}")]
    Entry {
        /// The file.
        path: String,
        /// The entry's index.
        index: usize,
        /// The entry's key, as written.
        key: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
}

impl SourcesError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            SourcesError::Read { .. } => "unreadable_identity_sources",
            SourcesError::Parse { .. } | SourcesError::Entry { .. } => "invalid_identity_sources",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::from_meta;
    use serde_json::json;

    #[test]
    fn bad_tables_are_refused_naming_file_entry_and_fix() {
        let entry = |body: &str| format!("sources:\n  - {body}\n");
        let cases = [
            entry("key: k\n    platform: p\n    trust: t\n    priority: 1"),
            entry("key: k\n    platform: p"),
            "source:\n  - key: k\n".to_string(),
            "sources: []\n".to_string(),
            "sources: [1\n".to_string(),
            entry("key: callId\n    platform: p\n    trust: t"),
            format!(
                "{}  - key: K\n    platform: q\n    trust: t\n",
                entry("key: k\n    platform: p\n    trust: t")
            ),
            entry("key: \"has space\"\n    platform: p\n    trust: t"),
            entry("key: \"/leading\"\n    platform: p\n    trust: t"),
            entry("key: \"\"\n    platform: p\n    trust: t"),
            entry("key: progressToken\n    platform: p\n    trust: t"),
            entry("key: io.modelcontextprotocol/clientInfo\n    platform: p\n    trust: t"),
            entry("key: callid/replayed\n    platform: p\n    trust: t"),
            entry("key: hubu.dev/platform-invocation-signature\n    platform: p\n    trust: t"),
            entry("key: k\n    platform: Codex\n    trust: t"),
            entry("key: k\n    platform: claude-code\n    trust: t"),
            entry("key: k\n    platform: \"a b\"\n    trust: t"),
            format!(
                "{}  - key: k2\n    platform: P\n    trust: t\n",
                entry("key: k\n    platform: p\n    trust: t")
            ),
            entry("key: k\n    platform: p\n    trust: t\n    max_bytes: 0"),
            entry("key: k\n    platform: p\n    trust: t\n    max_bytes: 513"),
            entry("key: k\n    platform: p\n    trust: \"  \""),
        ];
        let mut text = String::new();
        for yaml in cases {
            let err = IdentitySources::built_in()
                .extend_from_yaml(&yaml, "t.yaml")
                .unwrap_err();
            assert_eq!(err.code(), "invalid_identity_sources", "{yaml}");
            text.push_str(&format!("{err}\n"));
        }
        insta::assert_snapshot!(text);
        let missing = IdentitySources::load(&["/nonexistent/sources.yaml".into()]).unwrap_err();
        assert_eq!(missing.code(), "unreadable_identity_sources");
    }

    #[test]
    fn every_preset_is_its_repository_file_and_loads() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("identity-sources");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        let names: Vec<String> = PRESETS.iter().map(|(n, _)| format!("{n}.yaml")).collect();
        assert_eq!(names, files);
        for (name, text) in PRESETS {
            let file = std::fs::read_to_string(dir.join(format!("{name}.yaml"))).unwrap();
            assert_eq!(*text, file, "{name}");
            IdentitySources::built_in()
                .extend_from_yaml(text, name)
                .unwrap();
        }
    }

    #[test]
    fn shipped_presets_load_and_pi_beside_the_built_in_table_is_ambiguous() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("identity-sources");
        let goose = dir.join("goose.yaml");
        let pi = dir.join("gsd-pi.yaml");
        let t = IdentitySources::load(&[goose.clone(), pi.clone()]).unwrap();
        assert_eq!(t.extended().count(), 2);
        for e in t.extended() {
            assert!(e.trust.contains("trusted only where"), "{}", e.key);
        }
        let pi_call = json!({"claudecode/toolUseId": "toolu_1",
                             "io.opengsd/idempotency-key": "pi:toolu_1"});
        assert_eq!(
            t.from_meta(Some(&pi_call)).unwrap_err().code(),
            "ambiguous_identity"
        );
        assert_eq!(from_meta(Some(&pi_call)).unwrap().platform, "claude-code");
        let alone = json!({"io.opengsd/idempotency-key": "pi:toolu_1"});
        assert_eq!(t.from_meta(Some(&alone)).unwrap().platform, "gsd-pi");
        // Loading one preset twice is a duplicate.
        let twice = IdentitySources::load(&[goose.clone(), goose]).unwrap_err();
        assert!(
            twice.to_string().contains("is already listed in"),
            "{twice}"
        );
        insta::assert_snapshot!(IdentitySources::built_in().render_text());
    }
}
