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
//!   are cut (and the shape marked truncated). Between calls a thread keeps at most 64 KiB of
//!   scratch text and room for [`MAX_ENTRIES`] entries.

use crate::canonical;
use crate::identity;
use crate::text::cut;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

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
    Keyed(KeyedDigest),
}

/// HMAC-SHA-256 with its key already absorbed: each digest starts from a copy of this state
/// instead of hashing the key again (two SHA-256 blocks saved per digest).
#[derive(Clone)]
pub struct KeyedDigest(Hmac<Sha256>);

impl Digester {
    /// A digester from an optional salt.
    pub fn new(salt: Option<&str>) -> Self {
        match salt {
            Some(s) if !s.is_empty() => Digester::Keyed(KeyedDigest(
                Hmac::<Sha256>::new_from_slice(s.as_bytes()).expect("HMAC takes a key of any size"),
            )),
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
        self.short_value(value).as_str().to_string()
    }

    /// The short digest of raw bytes.
    pub fn bytes(&self, bytes: &[u8]) -> String {
        self.short(bytes).as_str().to_string()
    }

    /// The short digest of a value, as a shape holds it.
    fn short_value(&self, value: &Value) -> ShortDigest {
        // A value without a canonical form (an unsafe number) is digested over its plain
        // serialization: still deterministic, still distinct per value.
        match canonical::canonical_json(value) {
            Ok(text) => self.short(text.as_bytes()),
            Err(_) => self.short(&serde_json::to_vec(value).unwrap_or_default()),
        }
    }

    /// The short digest of raw bytes, as a shape holds it.
    fn short(&self, bytes: &[u8]) -> ShortDigest {
        let head: [u8; DIGEST_HEX_CHARS / 2] = match self {
            Digester::Plain => sha256_head(bytes)[..DIGEST_HEX_CHARS / 2]
                .try_into()
                .expect("a SHA-256 head is longer than a short digest"),
            Digester::Keyed(KeyedDigest(keyed)) => {
                let mut mac = keyed.clone();
                mac.update(bytes);
                mac.finalize().into_bytes()[..DIGEST_HEX_CHARS / 2]
                    .try_into()
                    .expect("an HMAC-SHA-256 is longer than a short digest")
            }
        };
        ShortDigest::from_head(head)
    }
}

/// A short digest: [`DIGEST_HEX_CHARS`] lowercase hex characters, held inline.
///
/// A shape holds one per value (about 20 for a Codex `_meta`); inline, they cost no allocation
/// of their own (as 21 `String`s they were half of a shape's allocations). It reads, compares
/// and serializes as the text it is; a record read back whose digest is any other text keeps
/// that text as it is.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShortDigest(DigestRepr);

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum DigestRepr {
    /// [`DIGEST_HEX_CHARS`] ASCII hex characters, as this build writes them.
    Hex([u8; DIGEST_HEX_CHARS]),
    /// Any other text, as read from a record.
    Other(Box<str>),
}

impl ShortDigest {
    /// The lowercase hex of the first [`DIGEST_HEX_CHARS`] / 2 bytes of a digest.
    fn from_head(head: [u8; DIGEST_HEX_CHARS / 2]) -> Self {
        /// The two hex digits of every byte: one lookup per byte, not one per digit.
        static PAIRS: [[u8; 2]; 256] = {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            let mut pairs = [[0u8; 2]; 256];
            let mut b = 0;
            while b < 256 {
                pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0x0f]];
                b += 1;
            }
            pairs
        };
        let mut hex = [0u8; DIGEST_HEX_CHARS];
        for (pair, b) in hex.as_chunks_mut::<2>().0.iter_mut().zip(head) {
            *pair = PAIRS[usize::from(b)];
        }
        ShortDigest(DigestRepr::Hex(hex))
    }

    /// The digest's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            DigestRepr::Hex(hex) => std::str::from_utf8(hex).expect("hex digits are ASCII"),
            DigestRepr::Other(text) => text,
        }
    }
}

impl From<&str> for ShortDigest {
    fn from(text: &str) -> Self {
        match <[u8; DIGEST_HEX_CHARS]>::try_from(text.as_bytes()) {
            Ok(hex) if hex.iter().all(u8::is_ascii_hexdigit) => ShortDigest(DigestRepr::Hex(hex)),
            _ => ShortDigest(DigestRepr::Other(text.into())),
        }
    }
}

impl std::ops::Deref for ShortDigest {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for ShortDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for ShortDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for ShortDigest {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ShortDigest {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ShortDigest {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl Serialize for ShortDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ShortDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(ShortDigest::from(&*text))
    }
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The first 8 bytes of `SHA-256(bytes)`: whole blocks straight from `bytes`, then the padded
/// tail (FIPS 180-4, 5.1.1), through the same block function (`compress256`, SHA-NI where the
/// CPU has it) as `Sha256::digest`, without the hasher's buffering and 32-byte output per call;
/// a shape takes about 20 digests of short texts, where that bookkeeping cost as much as the
/// one block each hashes. Equal to `Sha256::digest` (`sha256_head_is_sha256`).
fn sha256_head(bytes: &[u8]) -> [u8; 8] {
    let mut state = SHA256_IV;
    let (blocks, rest) = bytes.as_chunks::<64>();
    if !blocks.is_empty() {
        sha2::block_api::compress256(&mut state, blocks);
    }
    let mut tail = [[0u8; 64]; 2];
    let flat = tail.as_flattened_mut();
    flat[..rest.len()].copy_from_slice(rest);
    flat[rest.len()] = 0x80;
    let used = if rest.len() < 56 { 1 } else { 2 };
    let bits = (bytes.len() as u64).wrapping_mul(8);
    flat[used * 64 - 8..used * 64].copy_from_slice(&bits.to_be_bytes());
    sha2::block_api::compress256(&mut state, &tail[..used]);
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&state[0].to_be_bytes());
    head[4..].copy_from_slice(&state[1].to_be_bytes());
    head
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
    pub digest: ShortDigest,
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
        digest: digester.short_value(value),
        ..value_shape_without_digest(value)
    }
}

/// The shape of a request's `_meta`.
///
/// One pass over the value: each value's canonical text is written once into one buffer (an
/// object's text is assembled from its members' texts, RFC 8785 being compositional), and each
/// digest hashes its value's span of it, so every digest is the one [`Digester::value`] gives
/// the value on its own. A value without a canonical form (an unsafe number inside) is digested
/// as [`Digester::value`] digests it. The text buffer, the path being walked and the entries
/// being collected are the calling thread's, kept between calls (up to 64 KiB of text), so a
/// typical call allocates only the shape it returns.
pub fn meta_shape(meta: &Value, digester: &Digester) -> MetaShape {
    let Scratch {
        text,
        path,
        entries,
    } = SCRATCH.with(|scratch| std::mem::take(&mut *scratch.borrow_mut()));
    let mut pass = Pass {
        digester,
        text,
        path,
        entries,
        truncated: false,
        stopped: false,
    };
    let span = pass.canon(meta, Some(1));
    let root = pass.shape(meta, span);
    // The shape's own vector is allocated last, once its small strings took back the memory
    // the previous shape freed: allocated first, it made the allocator sort all of that memory
    // before each call (a request of more than 1 KiB consolidates the freed small chunks).
    let shape = MetaShape {
        root,
        entries: pass.entries.drain(..).collect(),
        truncated: pass.truncated,
    };
    if pass.text.capacity() <= MAX_KEPT_SCRATCH && pass.entries.capacity() <= MAX_ENTRIES {
        pass.text.clear();
        pass.path.clear();
        let kept = Scratch {
            text: pass.text,
            path: pass.path,
            entries: pass.entries,
        };
        SCRATCH.with(|scratch| *scratch.borrow_mut() = kept);
    }
    shape
}

/// Most bytes of canonical text a thread keeps between [`meta_shape`] calls.
const MAX_KEPT_SCRATCH: usize = 64 * 1024;

/// The buffers of a [`meta_shape`] call, kept empty by each thread between calls.
#[derive(Default)]
struct Scratch {
    text: String,
    path: String,
    entries: Vec<ShapeEntry>,
}

thread_local! {
    /// The buffers of the thread's last [`meta_shape`] call: a typical call then allocates
    /// only what it returns.
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            text: String::new(),
            path: String::new(),
            entries: Vec::new(),
        })
    };
}

/// A member's name and the span of its value's canonical text (`None`: it has none).
type Member<'a> = (&'a str, Option<std::ops::Range<usize>>);

/// Members of an object kept on the stack while its canonical text is assembled.
const INLINE_MEMBERS: usize = 16;

/// The state of one [`meta_shape`] pass.
struct Pass<'a> {
    digester: &'a Digester,
    /// Canonical texts written so far; spans index into it.
    text: String,
    /// JSON pointer of the member being walked.
    path: String,
    entries: Vec<ShapeEntry>,
    truncated: bool,
    /// The entry bound was reached: no more entries.
    stopped: bool,
}

impl Pass<'_> {
    fn shape(&self, value: &Value, span: Option<std::ops::Range<usize>>) -> ValueShape {
        ValueShape {
            digest: self.digest(value, span),
            ..value_shape_without_digest(value)
        }
    }

    /// The digest of `value`: of its canonical span, or as [`Digester::value`] gives it when it
    /// has none.
    fn digest(&self, value: &Value, span: Option<std::ops::Range<usize>>) -> ShortDigest {
        match span {
            Some(range) => self.digester.short(&self.text.as_bytes()[range]),
            None => self.digester.short_value(value),
        }
    }

    /// Appends `value`'s canonical text and returns its range (`None` without a canonical form).
    /// With `members = Some(depth)` and an object, records one entry per member at `depth`.
    fn canon(&mut self, value: &Value, members: Option<usize>) -> Option<std::ops::Range<usize>> {
        let start = self.text.len();
        match (value, members) {
            (Value::Object(map), Some(depth)) => {
                // On the stack for the objects a `_meta` has (a heap copy for larger ones).
                let mut inline: [Member<'_>; INLINE_MEMBERS] = Default::default();
                let mut inline_order = [0usize; INLINE_MEMBERS];
                let mut heap: Vec<Member<'_>>;
                let mut heap_order: Vec<usize>;
                let (spans, order): (&mut [Member<'_>], &mut [usize]) =
                    if map.len() <= INLINE_MEMBERS {
                        (&mut inline[..map.len()], &mut inline_order[..map.len()])
                    } else {
                        heap = vec![Member::default(); map.len()];
                        heap_order = vec![0; map.len()];
                        (&mut heap, &mut heap_order)
                    };
                for (slot, (key, child)) in spans.iter_mut().zip(map) {
                    *slot = (key.as_str(), self.member(key, child, depth));
                }
                if spans.iter().any(|(_, span)| span.is_none()) {
                    return None;
                }
                canonical_order(spans, order);
                let start = self.text.len();
                self.text.push('{');
                for (i, &at) in order.iter().enumerate() {
                    let (key, span) = &spans[at];
                    if i > 0 {
                        self.text.push(',');
                    }
                    canonical::push_string(key, &mut self.text);
                    self.text.push(':');
                    self.text.extend_from_within(
                        span.clone().expect("checked: every member has a span"),
                    );
                }
                self.text.push('}');
                return Some(start..self.text.len());
            }
            (Value::Object(map), None) => {
                let mut sorted: Vec<(&str, &Value)> =
                    map.iter().map(|(k, v)| (k.as_str(), v)).collect();
                sorted.sort_unstable_by(|a, b| canonical::member_order(a.0, b.0));
                self.text.push('{');
                for (i, (key, child)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        self.text.push(',');
                    }
                    canonical::push_string(key, &mut self.text);
                    self.text.push(':');
                    self.canon(child, None)?;
                }
                self.text.push('}');
            }
            (Value::Array(items), _) => {
                self.text.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.text.push(',');
                    }
                    self.canon(item, None)?;
                }
                self.text.push(']');
            }
            (Value::String(s), _) => canonical::push_string(s, &mut self.text),
            (Value::Number(n), _) => canonical::push_number(n, &mut self.text).ok()?,
            (Value::Bool(true), _) => self.text.push_str("true"),
            (Value::Bool(false), _) => self.text.push_str("false"),
            (Value::Null, _) => self.text.push_str("null"),
        }
        Some(start..self.text.len())
    }

    /// Records the entry of `key: value` at `depth` (while the entry bound allows), walks its
    /// members, and returns the value's canonical span.
    fn member(&mut self, key: &str, value: &Value, depth: usize) -> Option<std::ops::Range<usize>> {
        if self.stopped {
            return self.canon(value, None);
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.truncated = true;
            self.stopped = true;
            return self.canon(value, None);
        }
        let len = self.path.len();
        self.path.push('/');
        let key_cut = cut(key, MAX_KEY_BYTES);
        if key_cut.len() < key.len() {
            self.truncated = true;
        }
        canonical::push_pointer_token(&mut self.path, key_cut);
        let top = depth == 1;
        let index = self.entries.len();
        self.entries.push(ShapeEntry {
            path: self.path.clone(),
            value: value_shape_without_digest(value),
            valid_key: top.then(|| is_valid_meta_key(key)),
            reserved_prefix: top && is_reserved_prefix(key),
            identity_source: if top {
                identity::Source::from_key(key)
            } else {
                None
            },
        });
        let members = match value {
            Value::Object(map) if depth >= MAX_DEPTH => {
                self.truncated |= !map.is_empty();
                None
            }
            Value::Object(_) => Some(depth + 1),
            _ => None,
        };
        let span = self.canon(value, members);
        self.path.truncate(len);
        self.entries[index].value.digest = self.digest(value, span.clone());
        span
    }
}

/// Fills `order` with the indices of `members` in canonical order (names are unique, so the
/// order is exact). When every name is ASCII, byte order (which then equals UTF-16 order), by
/// insertion on the names' first eight bytes ([`name_head`], computed once per name), whole
/// names compared only when those are equal: a `memcmp` call per comparison cost more than the
/// rest of the sort. Indices are moved, not members.
fn canonical_order(members: &[Member<'_>], order: &mut [usize]) {
    for (i, at) in order.iter_mut().enumerate() {
        *at = i;
    }
    if !members.iter().all(|(name, _)| name.is_ascii()) {
        order.sort_unstable_by(|&a, &b| canonical::member_order(members[a].0, members[b].0));
    } else if members.len() > INLINE_MEMBERS {
        order.sort_unstable_by(|&a, &b| members[a].0.cmp(members[b].0));
    } else {
        let mut heads = [0u64; INLINE_MEMBERS];
        for (head, (name, _)) in heads.iter_mut().zip(members) {
            *head = name_head(name);
        }
        for i in 1..order.len() {
            let (head, at) = (heads[i], order[i]);
            let mut j = i;
            while j > 0 && (heads[j - 1], members[order[j - 1]].0) > (head, members[at].0) {
                heads[j] = heads[j - 1];
                order[j] = order[j - 1];
                j -= 1;
            }
            heads[j] = head;
            order[j] = at;
        }
    }
}

/// The first eight bytes of `name` as a big-endian number, zero-padded: when two names' heads
/// differ, they are ordered as the names are (a zero byte pads, the least a byte can be).
fn name_head(name: &str) -> u64 {
    let bytes = name.as_bytes();
    match bytes.first_chunk::<8>() {
        Some(head) => u64::from_be_bytes(*head),
        None => bytes
            .iter()
            .enumerate()
            .fold(0, |word, (i, b)| word | u64::from(*b) << (56 - 8 * i)),
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
        digest: ShortDigest(DigestRepr::Hex([b'0'; DIGEST_HEX_CHARS])),
    }
}

/// Whether `key` is a valid MCP `_meta` key: an optional prefix of dot-separated labels ending in
/// `/` (each label starts with a letter, ends with a letter or digit, and has letters, digits or
/// hyphens between), then a name that is empty or begins and ends with an alphanumeric character
/// with alphanumerics, `-`, `_` and `.` between.
pub fn is_valid_meta_key(key: &str) -> bool {
    let (prefix, name) = match last_slash(key) {
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

/// Where the last `/` of a key is: a plain loop, as keys are short (`str::rfind` goes through
/// `memrchr`, whose set-up cost more than the scan).
fn last_slash(key: &str) -> Option<usize> {
    key.bytes().rposition(|b| b == b'/')
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
    last_slash(key)
        .and_then(|i| key[..i].split('.').nth(1))
        .is_some_and(|l| l == "modelcontextprotocol" || l == "mcp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sha2::Digest as _;

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
    fn sha256_head_is_sha256() {
        // Every tail length, one and two padding blocks, several whole blocks before them.
        let data: Vec<u8> = (0..400u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in 0..data.len() {
            let full = Sha256::digest(&data[..len]);
            assert_eq!(sha256_head(&data[..len]), full[..8], "length {len}");
        }
        assert_eq!(
            canonical::hex(&sha256_head(b"abc")),
            "ba7816bf8f01cfea",
            "FIPS 180-4's example"
        );
    }

    #[test]
    fn short_digests_read_write_and_compare_as_their_text() {
        let digest = Digester::Plain.short(b"\"0\"");
        assert_eq!(digest, Digester::Plain.bytes(b"\"0\""));
        assert_eq!(
            format!("{digest} {digest:?}"),
            format!("{0} {0:?}", digest.as_str())
        );
        assert_eq!(
            serde_json::to_string(&digest).unwrap(),
            format!("\"{digest}\"")
        );
        // A record read back keeps whatever text its digest had, this build's or not.
        for text in [
            "5feceb66ffc8",
            "",
            "not-a-digest",
            "5FECEB66FFC8",
            "5feceb66ffc8ab",
        ] {
            let read: ShortDigest = serde_json::from_str(&format!("\"{text}\"")).unwrap();
            assert_eq!(read, text);
            assert_eq!(serde_json::to_string(&read).unwrap(), format!("\"{text}\""));
        }
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
            json!({"i": [0, -1, 7, -9_007_199_254_740_991_i64, 9_007_199_254_740_991_u64, 10, -100],
                   "s": ["", "plain", "q\"uote", "back\\slash", "tab\t", "\u{7f}\u{80}é"]}),
            json!({"big": 9_007_199_254_740_993_u64, "ok": {"s": "v"}}),
            json!({"\u{10000}": 1, "\u{e000}": 2, "a/b~c": {"q": "r"}}),
            // An unsafe number deep in one member, canonical siblings beside it, arrays of
            // objects, and nesting past MAX_DEPTH (entries stop, digests still cover it all).
            json!({"a": {"b": {"n": 1e300, "ok": [{"y": 1, "x": 2}]}, "c": "d"}, "e": [[], {}]}),
            {
                let mut deep = json!({"leaf": [1, {"z": 0.5, "a": -0.0}]});
                for i in 0..(MAX_DEPTH + 4) {
                    deep = json!({ format!("k{i}"): deep, "s": i });
                }
                deep
            },
            // More members than an object keeps on the stack, nested in one that fits.
            json!({"wide": (0..20).map(|i| (format!("m{}", 19 - i), json!(i)))
                .collect::<serde_json::Map<String, Value>>(), "z": 0}),
            // Names that tie on their first eight bytes, shorter names, and zero bytes in
            // names (sorted by their heads first, then whole).
            json!({"o": {"abcdefghij": 1, "abcdefgh": 2, "abcdefgh\u{0}": 3, "a": 4, "a\u{0}": 5,
                   "": 6, "abcdefghi": 7, "b": 8, "abcdefgha": 9, "ab": 10, "abcdefgg~": 11}}),
            // A Codex-sized `_meta`, as the benchmark's fixture.
            json!({"callId": "call_000000000000000000000007", "itemId": "fc_0007",
                   "threadId": "0199a3f2", "progressToken": 7,
                   "x-codex-turn-metadata": {"model": "gpt-5.3-codex", "turn_started_at_unix_ms":
                       1_795_990_000_007_u64, "auto_review_enabled": false, "sandbox": "workspace-write"}}),
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
