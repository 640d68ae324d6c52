//! The shape of a JSON value: key paths, JSON types, lengths and short digests, never a value.
//!
//! [`meta_shape`] turns a request's `_meta` into one [`ShapeEntry`] per key path (objects are
//! recursed, arrays are summarized as one entry) and [`value_shape`] summarizes a single value,
//! such as a JSON-RPC id. The probe's log, `classify`, and the router's `--diagnose-meta` all
//! record shapes through this module.
//!
//! # Guarantees
//! - No raw value is ever copied into a shape: strings appear only as their byte length and a
//!   digest of 12 hex characters (48 bits of SHA-256 over the value's canonical JSON, or of
//!   HMAC-SHA-256 keyed with a salt when one is given, so low-entropy values cannot be looked up).
//!   Key names are recorded, since they are the structure being diagnosed.
//! - Bounded work and output: at most [`MAX_DEPTH`] levels and [`MAX_ENTRIES`] entries; past
//!   either bound the shape says `truncated` and stops. Key names longer than [`MAX_KEY_BYTES`]
//!   are cut (and the shape marked truncated).

use crate::canonical;
use crate::identity;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Deepest nesting recorded (the `_meta` object itself is depth 0).
pub const MAX_DEPTH: usize = 16;
/// Most entries recorded for one value.
pub const MAX_ENTRIES: usize = 1024;
/// Longest key name recorded, in bytes; longer names are cut at a character boundary.
pub const MAX_KEY_BYTES: usize = 256;
/// Hex characters kept of each digest.
pub const DIGEST_HEX_CHARS: usize = 12;

/// How values are digested.
#[derive(Clone)]
pub enum Digester {
    /// Plain SHA-256 over the canonical JSON of the value.
    Plain,
    /// HMAC-SHA-256 keyed with a secret salt (`--digest-salt`).
    Keyed(Vec<u8>),
}

impl Digester {
    /// A digester from an optional salt.
    pub fn new(salt: Option<&str>) -> Self {
        match salt {
            Some(s) if !s.is_empty() => Digester::Keyed(s.as_bytes().to_vec()),
            _ => Digester::Plain,
        }
    }

    /// Name of the scheme, as written in records: `sha256` or `hmac-sha256`.
    pub fn scheme(&self) -> &'static str {
        match self {
            Digester::Plain => "sha256",
            Digester::Keyed(_) => "hmac-sha256",
        }
    }

    /// The short digest of a value.
    pub fn value(&self, value: &Value) -> String {
        // A value without a canonical form (an unsafe number) is digested over its plain
        // serialization: still deterministic, still distinct per value.
        let bytes = match canonical::canonical_json(value) {
            Ok(text) => text.into_bytes(),
            Err(_) => serde_json::to_vec(value).unwrap_or_default(),
        };
        self.bytes(&bytes)
    }

    /// The short digest of raw bytes.
    pub fn bytes(&self, bytes: &[u8]) -> String {
        let full = match self {
            Digester::Plain => Sha256::digest(bytes),
            Digester::Keyed(key) => {
                let mut mac =
                    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any size");
                mac.update(bytes);
                mac.finalize().into_bytes()
            }
        };
        canonical::hex(&full[..DIGEST_HEX_CHARS / 2])
    }
}

/// The JSON type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonType {
    /// `null`
    Null,
    /// `true` or `false`
    Boolean,
    /// any number
    Number,
    /// a string
    String,
    /// an array
    Array,
    /// an object
    Object,
}

impl JsonType {
    /// The type of `value`.
    pub fn of(value: &Value) -> Self {
        match value {
            Value::Null => JsonType::Null,
            Value::Bool(_) => JsonType::Boolean,
            Value::Number(_) => JsonType::Number,
            Value::String(_) => JsonType::String,
            Value::Array(_) => JsonType::Array,
            Value::Object(_) => JsonType::Object,
        }
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            JsonType::Null => "null",
            JsonType::Boolean => "boolean",
            JsonType::Number => "number",
            JsonType::String => "string",
            JsonType::Array => "array",
            JsonType::Object => "object",
        }
    }
}

/// The shape of one value: type, length and digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueShape {
    /// JSON type.
    #[serde(rename = "type")]
    pub kind: JsonType,
    /// Bytes of a string, items of an array, keys of an object; absent for other types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<usize>,
    /// Short digest of the value's canonical JSON.
    pub digest: String,
}

/// One key path of a `_meta` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeEntry {
    /// RFC 6901 JSON pointer from the `_meta` object, e.g. `/x-codex-turn-metadata/turn_id`.
    pub path: String,
    /// Type, length and digest of the value at that path.
    #[serde(flatten)]
    pub value: ValueShape,
    /// Top-level keys only: whether the name is a valid MCP `_meta` key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_key: Option<bool>,
    /// Top-level keys only: whether the prefix is reserved for MCP (second label
    /// `modelcontextprotocol` or `mcp`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub reserved_prefix: bool,
    /// Top-level keys only: the identity source this key is, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_source: Option<identity::Source>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The shape of a whole `_meta` value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaShape {
    /// Type, length and digest of the `_meta` value itself.
    pub root: ValueShape,
    /// One entry per key path, in document order (empty when `_meta` is not an object).
    pub entries: Vec<ShapeEntry>,
    /// True when a bound was reached and entries were left out or cut.
    #[serde(default, skip_serializing_if = "is_false")]
    pub truncated: bool,
}

impl MetaShape {
    /// The top-level keys, in order.
    pub fn top_level_keys(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|e| e.valid_key.is_some())
            .map(|e| e.path.as_str())
    }
}

/// The shape of one value.
pub fn value_shape(value: &Value, digester: &Digester) -> ValueShape {
    ValueShape {
        digest: digester.value(value),
        ..value_shape_without_digest(value)
    }
}

/// The shape of a request's `_meta`.
pub fn meta_shape(meta: &Value, digester: &Digester) -> MetaShape {
    // One canonical serialization of the whole `_meta` serves every digest: each sub-value's
    // canonical text is a span of it. Without a canonical form (an unsafe number somewhere),
    // each value is digested on its own, as `Digester::value` does.
    let digests = match canonical::canonical_json_with_spans(meta) {
        Ok((text, spans)) => Digests::Spans {
            spans: spans.into_iter().collect(),
            text,
        },
        Err(_) => Digests::PerValue,
    };
    let mut shape = MetaShape {
        root: digests.shape(meta, digester),
        entries: Vec::new(),
        truncated: false,
    };
    if let Value::Object(map) = meta {
        let mut path = String::new();
        for (key, value) in map {
            if !walk(
                key, value, 1, true, &mut path, &digests, digester, &mut shape,
            ) {
                break;
            }
        }
    }
    shape
}

/// How [`meta_shape`] finds each value's digest.
enum Digests {
    /// Spans of one canonical text, by value address.
    Spans {
        text: String,
        spans: std::collections::HashMap<*const Value, std::ops::Range<usize>>,
    },
    /// Each value serialized on its own.
    PerValue,
}

impl Digests {
    fn shape(&self, value: &Value, digester: &Digester) -> ValueShape {
        let span = match self {
            Digests::Spans { text, spans } => spans
                .get(&(value as *const Value))
                .map(|range| &text.as_bytes()[range.clone()]),
            Digests::PerValue => None,
        };
        match span {
            Some(bytes) => ValueShape {
                digest: digester.bytes(bytes),
                ..value_shape_without_digest(value)
            },
            None => value_shape(value, digester),
        }
    }
}

fn value_shape_without_digest(value: &Value) -> ValueShape {
    let len = match value {
        Value::String(s) => Some(s.len()),
        Value::Array(a) => Some(a.len()),
        Value::Object(o) => Some(o.len()),
        _ => None,
    };
    ValueShape {
        kind: JsonType::of(value),
        len,
        digest: String::new(),
    }
}

/// Records `key: value` under `path`; false when the entry bound stops the walk.
#[allow(clippy::too_many_arguments)]
fn walk(
    key: &str,
    value: &Value,
    depth: usize,
    top: bool,
    path: &mut String,
    digests: &Digests,
    digester: &Digester,
    shape: &mut MetaShape,
) -> bool {
    if shape.entries.len() >= MAX_ENTRIES {
        shape.truncated = true;
        return false;
    }
    let len = path.len();
    path.push('/');
    let key_cut = cut(key, MAX_KEY_BYTES);
    if key_cut.len() < key.len() {
        shape.truncated = true;
    }
    canonical::push_pointer_token(path, key_cut);
    shape.entries.push(ShapeEntry {
        path: path.clone(),
        value: digests.shape(value, digester),
        valid_key: top.then(|| is_valid_meta_key(key)),
        reserved_prefix: top && is_reserved_prefix(key),
        identity_source: if top {
            identity::Source::from_key(key)
        } else {
            None
        },
    });
    let mut go_on = true;
    if let Value::Object(map) = value {
        if depth >= MAX_DEPTH {
            shape.truncated |= !map.is_empty();
        } else {
            for (k, v) in map {
                if !walk(k, v, depth + 1, false, path, digests, digester, shape) {
                    go_on = false;
                    break;
                }
            }
        }
    }
    path.truncate(len);
    go_on
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether `key` is a valid MCP `_meta` key: an optional prefix of dot-separated labels ending in
/// `/` (each label starts with a letter, ends with a letter or digit, and has letters, digits or
/// hyphens between), then a name that is empty or begins and ends with an alphanumeric character
/// with alphanumerics, `-`, `_` and `.` between.
pub fn is_valid_meta_key(key: &str) -> bool {
    let (prefix, name) = match key.rfind('/') {
        Some(i) => (Some(&key[..i]), &key[i + 1..]),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !prefix.split('.').all(valid_label)
    {
        return false;
    }
    valid_name(name)
}

fn valid_label(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.is_empty()
        || (b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// Whether `key`'s prefix is reserved for MCP: its second label is `modelcontextprotocol` or
/// `mcp` (e.g. `io.modelcontextprotocol/clientInfo`).
pub fn is_reserved_prefix(key: &str) -> bool {
    key.rfind('/')
        .and_then(|i| key[..i].split('.').nth(1))
        .is_some_and(|l| l == "modelcontextprotocol" || l == "mcp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn codex_meta_shape_snapshot() {
        let meta = json!({
            "callId": "call_AAAAAAAAAAAAAAAAAAAAAAAA",
            "itemId": "item-1",
            "progressToken": 0,
            "x-codex-turn-metadata": {"model": "m", "sandbox": {"mode": "x"}, "tags": [1, 2, 3]},
            "io.modelcontextprotocol/clientInfo": {"name": "n"},
            "bad key!": null,
        });
        let shape = meta_shape(&meta, &Digester::Plain);
        insta::assert_json_snapshot!(shape);
    }

    #[test]
    fn digests_are_short_and_salted() {
        let v = json!("0");
        let plain = Digester::Plain.value(&v);
        assert_eq!(plain.len(), DIGEST_HEX_CHARS);
        // The digest of the JSON-RPC id 0 sent as a string: sha256 of `"0"` (canonical JSON).
        assert_eq!(plain, &canonical::hex(&Sha256::digest(b"\"0\""))[..12]);
        let salted = Digester::new(Some("pepper")).value(&v);
        assert_ne!(plain, salted);
        assert_eq!(salted, Digester::new(Some("pepper")).value(&v));
        assert_eq!(
            Digester::Plain.value(&json!(1.0)),
            Digester::Plain.value(&json!(1))
        );
    }

    #[test]
    fn keys_are_classified() {
        for (key, valid, reserved) in [
            ("callId", true, false),
            ("claudecode/toolUseId", true, false),
            ("hubu.dev/platform-invocation", true, false),
            ("io.modelcontextprotocol/clientInfo", true, true),
            ("dev.mcp/thing", true, true),
            ("x-codex-turn-metadata", true, false),
            ("openai/request_id", true, false),
            ("", true, false),
            ("-a", false, false),
            ("a-", false, false),
            ("1abc/x", false, false),
            ("a..b/x", false, false),
            ("bad key", false, false),
        ] {
            assert_eq!(is_valid_meta_key(key), valid, "{key}");
            assert_eq!(is_reserved_prefix(key), reserved, "{key}");
        }
    }

    #[test]
    fn bounds_hold() {
        let mut deep = json!("leaf");
        for _ in 0..100 {
            deep = json!({ "d": deep });
        }
        let shape = meta_shape(&json!({ "deep": deep }), &Digester::Plain);
        assert!(shape.truncated);
        assert_eq!(shape.entries.len(), MAX_DEPTH);

        let wide: serde_json::Map<String, Value> =
            (0..5000).map(|i| (format!("k{i}"), json!(i))).collect();
        let shape = meta_shape(&Value::Object(wide), &Digester::Plain);
        assert!(shape.truncated);
        assert_eq!(shape.entries.len(), MAX_ENTRIES);

        let long_key = "k".repeat(10_000);
        let shape = meta_shape(&json!({ long_key: 1 }), &Digester::Plain);
        assert!(shape.truncated);
        assert_eq!(shape.entries[0].path.len(), 1 + MAX_KEY_BYTES);
    }

    #[test]
    fn span_digests_equal_per_value_digests() {
        // meta_shape digests every value from one canonical serialization; each digest must be
        // the one the value gets on its own, with and without a salt, and with an unsafe number
        // (no canonical form: every value is then digested on its own).
        let cases = [
            json!({"callId": "call_1", "x": {"b": [1, 2.0, {"z": null}], "a": "é\n\u{1}"}}),
            json!({"k": {"deep": {"deeper": {"n": -0.0, "t": true}}}, "e": {}, "l": []}),
            json!({"big": 9_007_199_254_740_993_u64, "ok": {"s": "v"}}),
            json!({"\u{10000}": 1, "\u{e000}": 2, "a/b~c": {"q": "r"}}),
        ];
        for digester in [Digester::Plain, Digester::new(Some("salt"))] {
            for meta in &cases {
                let shape = meta_shape(meta, &digester);
                assert_eq!(shape.root.digest, digester.value(meta), "root of {meta}");
                for entry in &shape.entries {
                    let pointer = &entry.path;
                    let value = meta
                        .pointer(pointer)
                        .expect("the path points into the meta");
                    assert_eq!(
                        entry.value.digest,
                        digester.value(value),
                        "{pointer} of {meta}"
                    );
                }
            }
        }
    }

    #[test]
    fn no_value_is_copied() {
        let meta = json!({"secret": "canary-value-123", "n": {"inner": "canary-inner-456"}});
        let text = serde_json::to_string(&meta_shape(&meta, &Digester::Plain)).unwrap();
        assert!(!text.contains("canary"));
    }
}
