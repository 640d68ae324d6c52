//! The probe's log record: one JSON line per client message, shapes only.
//!
//! [`Record`] is the one format the probe, the router's `--diagnose-meta`, `classify`, and the
//! matrix tools share. [`record_for_request`] builds it from a parsed JSON-RPC message, and
//! [`ShapeLog`] appends it as one JSON line.
//!
//! # What a record holds
//! - `version` ([`RECORD_VERSION`]), `time` (RFC 3339 UTC), `transport`, a random `connection`
//!   id (not the HTTP session id), the message `kind`, its byte length.
//! - `client` `{name, version, from}` (from `initialize`'s `clientInfo` or the per-request
//!   `io.modelcontextprotocol/clientInfo`), the `protocol_version`, the `method`.
//! - `id`: the JSON-RPC id's shape ([`shape::value_shape`]), so a counter such as `0` is
//!   recognisable by its digest without being copied.
//! - `meta`: `absent`, `not_object` (with the value's type, length and digest), or `object` with
//!   the full [`shape::meta_shape`].
//! - For `tools/call`: the `tool` name, the `arguments` type and key count, `request_digest` (the
//!   first 12 hex characters of the keyed or plain digest of the request hash
//!   `sha256(tool, 0, canonical arguments)`), and the `identity` verdict of
//!   [`identity::from_meta`] (platform and source, or the error code and message).
//!
//! # Guarantees
//! - Never a raw `_meta` value and never an argument value. Names that are recorded on purpose
//!   (method, tool, client name and version, protocol version, platform of an accepted
//!   identity) are copied only when they are short printable text; anything else is replaced by
//!   its length and digest ([`label`]).
//! - One record is one `write` of one line to a file opened for appending, so records from
//!   several probe processes sharing a log do not interleave.
//!
//! # Compatibility
//! Readers accept any record whose `version` is at most [`RECORD_VERSION`] and ignore unknown
//! fields; new fields are added as optional, and a breaking change bumps the version.

use crate::canonical;
use crate::identity;
use crate::shape::{self, Digester, MetaShape, ValueShape};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Version of the record format written by this build.
pub const RECORD_VERSION: u32 = 1;
/// Longest name copied verbatim into a record (method, tool, client name and version).
pub const MAX_LABEL_BYTES: usize = 128;
/// The `_meta` key of the per-request client info (protocol 2026-07-28).
pub const CLIENT_INFO_META_KEY: &str = "io.modelcontextprotocol/clientInfo";
/// The `_meta` key of the per-request protocol version (protocol 2026-07-28).
pub const PROTOCOL_VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` key of the per-request client capabilities (protocol 2026-07-28).
pub(crate) const INLINE_CAPABILITIES_META_KEY: &str = "io.modelcontextprotocol/clientCapabilities";

/// How the message reached the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// The probe's own stdio server.
    Stdio,
    /// The probe's streamable HTTP server.
    Http,
    /// `callid probe --wrap`: a client talking to another server through the probe.
    Wrap,
    /// Recorded by another part of callid (the router's `--diagnose-meta`).
    Router,
}

/// What kind of message a record describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A JSON-RPC request (has an `id`).
    Request,
    /// A JSON-RPC notification (no `id`).
    Notification,
    /// A response from the client to a server request.
    Response,
    /// A message that is not valid JSON-RPC; see [`Record::error`].
    Malformed,
    /// A message longer than the probe's bound; only its length (and id, if found) is known.
    Oversize,
}

/// Where the client name and version were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientInfoFrom {
    /// `initialize` params `clientInfo`.
    Initialize,
    /// The request's `_meta["io.modelcontextprotocol/clientInfo"]`.
    Meta,
}

/// The client program, as it names itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClientInfo {
    /// `clientInfo.name`.
    pub name: String,
    /// `clientInfo.version`.
    pub version: String,
    /// Where it was read from.
    pub from: ClientInfoFrom,
}

impl ClientInfo {
    /// Reads `{name, version}` from a `clientInfo` object (`None` when it has no name).
    pub fn from_value(value: &Value, from: ClientInfoFrom, digester: &Digester) -> Option<Self> {
        let name = value.get("name")?.as_str()?;
        let version = value.get("version").and_then(Value::as_str).unwrap_or("");
        Some(ClientInfo {
            name: label(name, digester),
            version: label(version, digester),
            from,
        })
    }
}

/// What `_meta` looked like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum MetaRecord {
    /// No `_meta` (or no `params` object to carry one).
    Absent,
    /// `_meta` was present but not an object: only its own shape.
    NotObject {
        /// Type, length and digest of the value.
        root: ValueShape,
    },
    /// `_meta` was an object: one entry per key path.
    Object(MetaShape),
}

impl MetaRecord {
    /// The record of an optional `_meta` value.
    pub fn of(meta: Option<&Value>, digester: &Digester) -> Self {
        match meta {
            None => MetaRecord::Absent,
            Some(v @ Value::Object(_)) => MetaRecord::Object(shape::meta_shape(v, digester)),
            Some(v) => MetaRecord::NotObject {
                root: shape::value_shape(v, digester),
            },
        }
    }

    /// The object shape, when `_meta` was an object.
    pub fn shape(&self) -> Option<&MetaShape> {
        match self {
            MetaRecord::Object(shape) => Some(shape),
            _ => None,
        }
    }
}

/// The arguments of a `tools/call`: type and key count only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentsShape {
    /// JSON type (`object` normally; `null` when absent).
    #[serde(rename = "type")]
    pub kind: shape::JsonType,
    /// Keys of an object, items of an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<usize>,
    /// The code of [`identity::check_arguments`] when the arguments carry an identity-like key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_error: Option<String>,
}

/// The identity verdict of one `tools/call`, as [`identity::from_meta`] gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum IdentityVerdict {
    /// A trusted per-call identity was found.
    Accepted {
        /// Platform (`codex`, `claude-code`, or the envelope's).
        platform: String,
        /// The `_meta` key it came from.
        source: String,
    },
    /// No usable identity: the same code and message the router gives.
    Rejected {
        /// Stable code (`missing_identity`, ...).
        code: String,
        /// The message a person can act on.
        message: String,
    },
}

impl IdentityVerdict {
    /// The verdict for a request's `_meta`, by `sources`.
    pub fn of_with(
        sources: &identity::IdentitySources,
        meta: Option<&Value>,
        digester: &Digester,
    ) -> Self {
        match sources.from_meta(meta) {
            Ok(id) => IdentityVerdict::Accepted {
                platform: label(&id.platform, digester),
                source: id.source_key,
            },
            Err(e) => IdentityVerdict::Rejected {
                code: e.code().to_string(),
                message: e.to_string(),
            },
        }
    }
}

/// Why a message could not be recorded in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordError {
    /// Stable code: `malformed_json`, `too_deep`, `not_jsonrpc`, `oversize`.
    pub code: String,
    /// What was wrong, without any of the message's content.
    pub message: String,
}

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Record format version ([`RECORD_VERSION`]).
    pub version: u32,
    /// When the message arrived, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// How it arrived.
    pub transport: Transport,
    /// A random id of the connection (or HTTP session) it arrived on.
    pub connection: String,
    /// What kind of message it is.
    pub kind: Kind,
    /// Length of the message in bytes.
    pub bytes: usize,
    /// Digest scheme of every digest in the record: `sha256` or `hmac-sha256`.
    pub digest: String,
    /// The client, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientInfo>,
    /// The protocol version in force for this message, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The JSON-RPC method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Shape of the JSON-RPC id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<ValueShape>,
    /// Shape of `params._meta` (absent for malformed and oversize messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<MetaRecord>,
    /// `tools/call`: the tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// `tools/call`: type and size of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentsShape>,
    /// `tools/call`: short digest of the request hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_digest: Option<String>,
    /// `tools/call`: the canonical-JSON error code when the arguments have no request hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash_error: Option<String>,
    /// `tools/call`: the identity verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityVerdict>,
    /// Set for malformed and oversize messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordError>,
}

/// What a record knows about the connection a message came from.
#[derive(Debug, Clone)]
pub struct RecordContext {
    /// How it arrived.
    pub transport: Transport,
    /// The connection id.
    pub connection: String,
    /// The client, if it introduced itself earlier on this connection.
    pub client: Option<ClientInfo>,
    /// The protocol version in force, if known.
    pub protocol_version: Option<String>,
    /// The identity sources the verdicts are given by (`--identity-sources`).
    pub sources: std::sync::Arc<identity::IdentitySources>,
}

impl RecordContext {
    /// A context with a fresh random connection id.
    pub fn new(transport: Transport) -> Self {
        RecordContext {
            transport,
            connection: new_connection_id(),
            client: None,
            protocol_version: None,
            sources: identity::IdentitySources::built_in_shared(),
        }
    }
}

/// A random 12-hex-character connection id.
pub fn new_connection_id() -> String {
    let mut id = uuid::Uuid::new_v4().simple().to_string();
    id.truncate(12);
    id
}

impl Record {
    /// An empty record of `kind` for a message of `bytes` bytes, stamped now.
    pub fn new(kind: Kind, bytes: usize, ctx: &RecordContext, digester: &Digester) -> Self {
        Record {
            version: RECORD_VERSION,
            time: crate::clock::now_rfc3339(),
            transport: ctx.transport,
            connection: ctx.connection.clone(),
            kind,
            bytes,
            digest: digester.scheme().to_string(),
            client: ctx.client.clone(),
            protocol_version: ctx.protocol_version.clone(),
            method: None,
            id: None,
            meta: None,
            tool: None,
            arguments: None,
            request_digest: None,
            request_hash_error: None,
            identity: None,
            error: None,
        }
    }

    /// The `_meta` object shape, if the message had one.
    pub fn meta_shape(&self) -> Option<&MetaShape> {
        self.meta.as_ref().and_then(MetaRecord::shape)
    }
}

/// The record of one parsed JSON-RPC request or notification (`id` is `None` for a
/// notification). `params` is the whole `params` value; `bytes` the message length.
///
/// The client and protocol version come from `ctx`, overridden by what this message itself
/// carries (`initialize`'s `clientInfo` and `protocolVersion`, or the per-request `_meta` keys).
pub fn record_for_request(
    method: &str,
    id: Option<&Value>,
    params: Option<&Value>,
    bytes: usize,
    ctx: &RecordContext,
    digester: &Digester,
) -> Record {
    let kind = if id.is_some() {
        Kind::Request
    } else {
        Kind::Notification
    };
    let mut record = Record::new(kind, bytes, ctx, digester);
    record.method = Some(label(method, digester));
    record.id = id.map(|id| shape::value_shape(id, digester));
    let params_obj = params.and_then(Value::as_object);
    let meta = params_obj.and_then(|p| p.get("_meta"));
    record.meta = Some(MetaRecord::of(meta, digester));

    if method == "initialize"
        && let Some(p) = params_obj
    {
        if let Some(info) = p
            .get("clientInfo")
            .and_then(|v| ClientInfo::from_value(v, ClientInfoFrom::Initialize, digester))
        {
            record.client = Some(info);
        }
        if let Some(v) = p.get("protocolVersion").and_then(Value::as_str) {
            record.protocol_version = Some(label(v, digester));
        }
    }
    if let Some(meta) = meta.and_then(Value::as_object) {
        if let Some(info) = meta
            .get(CLIENT_INFO_META_KEY)
            .and_then(|v| ClientInfo::from_value(v, ClientInfoFrom::Meta, digester))
        {
            record.client = Some(info);
        }
        if let Some(v) = meta.get(PROTOCOL_VERSION_META_KEY).and_then(Value::as_str) {
            record.protocol_version = Some(label(v, digester));
        }
    }

    if method == "tools/call" {
        let tool = params_obj
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let arguments = params_obj
            .and_then(|p| p.get("arguments"))
            .unwrap_or(&Value::Null);
        record.tool = Some(label(tool, digester));
        record.arguments = Some(ArgumentsShape {
            kind: shape::JsonType::of(arguments),
            len: match arguments {
                Value::Object(o) => Some(o.len()),
                Value::Array(a) => Some(a.len()),
                _ => None,
            },
            identity_error: ctx
                .sources
                .check_arguments(arguments)
                .err()
                .map(|e| e.code().to_string()),
        });
        // Absent arguments hash as `{}`: that is what an MCP server dispatches.
        let hashed = if arguments.is_null() {
            &Value::Object(Default::default())
        } else {
            arguments
        };
        match canonical::request_hash(tool, hashed) {
            Ok(hash) => record.request_digest = Some(digester.bytes(hash.as_str().as_bytes())),
            Err(e) => record.request_hash_error = Some(e.code().to_string()),
        }
        record.identity = Some(IdentityVerdict::of_with(&ctx.sources, meta, digester));
    }
    record
}

/// The record of one `tools/call` known by its parts (for callers that have already parsed the
/// request, such as the router's `--diagnose-meta`): the same record [`record_for_request`]
/// writes for the message `{"method": "tools/call", "id": id, "params": {"name": tool,
/// "arguments": arguments, "_meta": meta}}`.
pub fn record_for_tool_call(
    tool: &str,
    arguments: &Value,
    meta: Option<&Value>,
    id: Option<&Value>,
    ctx: &RecordContext,
    digester: &Digester,
) -> Record {
    let mut params = serde_json::Map::new();
    params.insert("name".into(), Value::String(tool.to_string()));
    params.insert("arguments".into(), arguments.clone());
    if let Some(meta) = meta {
        params.insert("_meta".into(), meta.clone());
    }
    let params = Value::Object(params);
    let bytes = serde_json::to_vec(&params).map(|v| v.len()).unwrap_or(0);
    record_for_request(
        "tools/call",
        Some(id.unwrap_or(&Value::Null)),
        Some(&params),
        bytes,
        ctx,
        digester,
    )
}

/// A name copied into a record: itself when it is at most [`MAX_LABEL_BYTES`] of printable text,
/// otherwise `<N bytes, digest D>` so no long or binary value is ever copied.
pub fn label(text: &str, digester: &Digester) -> String {
    let printable = text.chars().all(|c| !c.is_control());
    if text.len() <= MAX_LABEL_BYTES && printable {
        text.to_string()
    } else {
        format!(
            "<{} bytes, digest {}>",
            text.len(),
            digester.bytes(text.as_bytes())
        )
    }
}

/// Why a log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file could not be opened for appending.
    #[error(
        "failed to open the probe log `{path}` for appending; check the directory exists and is writable"
    )]
    Open {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be written.
    #[error("failed to write a record to the probe log")]
    Write(#[source] std::io::Error),
}

/// A JSON-lines sink of records: a file opened for appending (created `0600`), standard error,
/// or any writer (tests).
pub struct ShapeLog {
    sink: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for ShapeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShapeLog")
    }
}

impl ShapeLog {
    /// Opens `path` for appending, creating it readable and writable by the owner only.
    pub fn open(path: &Path) -> Result<Self, LogError> {
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let file = options.open(path).map_err(|source| LogError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_writer(Box::new(file)))
    }

    /// Records go to standard error (the probe's default without `--log`), best effort: a record
    /// that cannot be written there is dropped and counted ([`crate::logging`]).
    pub fn stderr() -> Self {
        Self::from_writer(Box::new(crate::logging::Stderr))
    }

    /// Records go to `writer`.
    pub fn from_writer(writer: Box<dyn Write + Send>) -> Self {
        ShapeLog {
            sink: Mutex::new(writer),
        }
    }

    /// Appends one record as one line, in a single write.
    pub fn write(&self, record: &Record) -> Result<(), LogError> {
        let mut line = Vec::new();
        push_line(&mut line, record);
        self.write_lines(&line)
    }

    /// Appends `lines` (whole lines, each made by [`push_line`]) in a single write, so that
    /// another writer appending to the same file never lands inside one of them.
    pub fn write_lines(&self, lines: &[u8]) -> Result<(), LogError> {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        sink.write_all(lines).map_err(LogError::Write)?;
        sink.flush().map_err(LogError::Write)
    }
}

/// Appends `record` to `lines` as one line of the log: its JSON and a newline.
pub fn push_line(lines: &mut Vec<u8>, record: &Record) {
    serde_json::to_writer(&mut *lines, record).expect("a record serializes");
    lines.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_bounded() {
        let d = Digester::Plain;
        assert_eq!(label("tools/call", &d), "tools/call");
        let long = "x".repeat(200);
        assert!(label(&long, &d).starts_with("<200 bytes, digest "));
        assert!(label("a\nb", &d).starts_with("<3 bytes"));
    }

    #[test]
    fn tool_call_record() {
        let ctx = RecordContext::new(Transport::Stdio);
        let params = json!({
            "name": "capabilities",
            "arguments": {"prompt": "secret-arg"},
            "_meta": {"callId": "call_secret", "progressToken": 3},
        });
        let r = record_for_request(
            "tools/call",
            Some(&json!(7)),
            Some(&params),
            99,
            &ctx,
            &Digester::Plain,
        );
        assert_eq!(r.kind, Kind::Request);
        assert_eq!(r.tool.as_deref(), Some("capabilities"));
        assert_eq!(
            r.identity,
            Some(IdentityVerdict::Accepted {
                platform: "codex".into(),
                source: "callId".into()
            })
        );
        let hash =
            canonical::request_hash("capabilities", &json!({"prompt": "secret-arg"})).unwrap();
        assert_eq!(
            r.request_digest,
            Some(Digester::Plain.bytes(hash.as_str().as_bytes()))
        );
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("secret"), "{text}");
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn tool_call_parts_match_the_message() {
        let ctx = RecordContext::new(Transport::Router);
        let d = Digester::new(Some("salt"));
        let args = json!({"prompt": "fox"});
        let meta = json!({"callId": "call_1"});
        let a = record_for_tool_call("buy", &args, Some(&meta), Some(&json!(4)), &ctx, &d);
        let params = json!({"name": "buy", "arguments": args, "_meta": meta});
        let b = record_for_request("buy-ignored", Some(&json!(4)), Some(&params), 0, &ctx, &d);
        assert_eq!(
            a.request_digest,
            record_for_request("tools/call", Some(&json!(4)), Some(&params), 0, &ctx, &d)
                .request_digest
        );
        assert_eq!(a.meta, b.meta);
        assert_eq!(
            a.identity,
            Some(IdentityVerdict::Accepted {
                platform: "codex".into(),
                source: "callId".into()
            })
        );
        assert_eq!(a.transport, Transport::Router);
    }

    /// The exact line a Codex-sized `tools/call` is recorded as (the bench's `_meta`, with an
    /// escaped string, a non-ASCII key and a float beside it), plain and keyed: the record is a
    /// public contract, so every field, digest and their order stay byte-identical however the
    /// shape is computed.
    #[test]
    fn codex_sized_record_is_byte_identical() {
        let message: Value = serde_json::from_str(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"generate_image",
            "arguments":{"prompt":"fox","width":1024,"height":768,"model":"flux-schnell"},
            "_meta":{"callId":"call_000000000000000000000007",
            "itemId":"fc_000000000000000000000000000000000000000000000007",
            "threadId":"0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44",
            "sessionId":"0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44",
            "windowId":"0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44:0","progressToken":7,
            "x-codex-turn-metadata":{"session_id":"0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44",
            "thread_id":"0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44","model":"gpt-5.3-codex",
            "turn_id":"0199a3f4-1b2c-7e3d-8f40-5a6b7c8d9e0f",
            "turn_started_at_unix_ms":1795990000007,"thread_source":"cli",
            "turn_trigger":"user_message","sandbox":"workspace-write",
            "sandbox_mode":"workspace-write","auto_review_enabled":false,
            "node_repl_auto_review_required":false,"node_repl_disabled":true,
            "codex_version":"0.171.0","note":"tab\there \"q\" é","temperature":0.25,
            "größe":[1,{"b":null,"a":2.0}]},
            "io.modelcontextprotocol/clientInfo":{"name":"codex-mcp-client","version":"0.171.0"}}}}"#,
        )
        .expect("the message parses");
        let mut ctx = RecordContext::new(Transport::Stdio);
        ctx.connection = "000000000000".into();
        let mut lines = String::new();
        for digester in [Digester::Plain, Digester::new(Some("salt"))] {
            for _ in 0..2 {
                let mut record = record_for_request(
                    "tools/call",
                    message.get("id"),
                    message.get("params"),
                    1234,
                    &ctx,
                    &digester,
                );
                record.time = "2026-12-01T00:00:00.000Z".into();
                lines.push_str(&serde_json::to_string(&record).expect("a record serializes"));
                lines.push('\n');
            }
        }
        insta::assert_snapshot!(lines);
    }

    #[test]
    fn meta_variants() {
        let d = Digester::Plain;
        assert_eq!(MetaRecord::of(None, &d), MetaRecord::Absent);
        assert!(matches!(
            MetaRecord::of(Some(&json!("x")), &d),
            MetaRecord::NotObject { .. }
        ));
        let text = serde_json::to_string(&MetaRecord::of(Some(&json!({"a": 1})), &d)).unwrap();
        assert!(text.starts_with(r#"{"status":"object","root""#), "{text}");
    }

    #[test]
    fn client_info_from_initialize_and_meta() {
        let ctx = RecordContext::new(Transport::Http);
        let r = record_for_request(
            "initialize",
            Some(&json!(0)),
            Some(
                &json!({"protocolVersion": "2025-06-18", "clientInfo": {"name": "codex-mcp-client", "version": "0.171.0"}}),
            ),
            10,
            &ctx,
            &Digester::Plain,
        );
        let c = r.client.unwrap();
        assert_eq!(
            (c.name.as_str(), c.version.as_str(), c.from),
            ("codex-mcp-client", "0.171.0", ClientInfoFrom::Initialize)
        );
        assert_eq!(r.protocol_version.as_deref(), Some("2025-06-18"));
        let r = record_for_request(
            "server/discover",
            Some(&json!("d")),
            Some(
                &json!({"_meta": {CLIENT_INFO_META_KEY: {"name": "claude-code", "version": "2.1.332"}, PROTOCOL_VERSION_META_KEY: "2026-07-28"}}),
            ),
            10,
            &ctx,
            &Digester::Plain,
        );
        assert_eq!(r.client.unwrap().from, ClientInfoFrom::Meta);
        assert_eq!(r.protocol_version.as_deref(), Some("2026-07-28"));
    }
}
