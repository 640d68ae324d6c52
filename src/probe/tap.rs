//! The tap: raw client messages in, records out, with per-connection state.
//!
//! Every transport (stdio, HTTP, `--wrap`) hands the tap each raw message a client sent, before
//! any MCP library sees it, so `initialize`, `server/discover`, notifications, responses and
//! malformed input are all recorded the same way. [`Tap`] holds what every connection shares
//! (the digester, the log, the mode); [`TapConnection`] holds one connection's state (the client
//! name and version, the protocol version requested and agreed).
//!
//! # Bounds
//! - A message longer than [`MAX_MESSAGE_BYTES`] is never buffered whole: [`Accumulator`] keeps
//!   counting its bytes and a [`Skimmer`] picks its top-level `id` and `method` out of the stream,
//!   so the record (kind `oversize`) and the error answer carry them.
//! - JSON nested deeper than serde_json's limit of 128 levels is refused by the parser; the
//!   skimmer still finds the id, so the client gets an error it can match.
//!
//! # Serving mode ([`Mode::Serve`])
//! The tap decides what the MCP server behind it sees:
//! - `server/discover` is answered here with `-32601` (method not found), whatever its `_meta`,
//!   so a client such as Claude Code 2.1 falls back to `initialize`.
//! - A request whose `params` or `params._meta` is not an object, or a `tools/call` whose
//!   `arguments` is not an object, gets `-32602` (rmcp could not parse it, and would answer
//!   without the request's id).
//! - A JSON-RPC batch (an array) gets `-32600`; each element is still recorded.
//! - Malformed JSON gets `-32700`, an oversize or too-deep message or a non-object `-32600`,
//!   each with the message's id when it could be found; none reach the server.
//! - Notifications and responses sent before the client's first request are recorded and
//!   dropped: rmcp ends a session whose first message is not a request.
//!
//! In [`Mode::Observe`] (`--wrap`) the tap never answers and never drops anything.

use super::record::{
    self, ClientInfoFrom, Kind, Record, RecordContext, RecordError, ShapeLog, Transport,
};
use crate::shape::{self, Digester};
use serde_json::{Value, json};
use std::sync::Arc;

/// Longest message recorded in full, in bytes (1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Longest id or method token the skimmer keeps.
const MAX_SKIM_TOKEN: usize = 1024;

/// JSON-RPC error codes the tap answers with.
pub mod codes {
    /// Parse error.
    pub const PARSE_ERROR: i64 = -32700;
    /// Invalid request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// Method not found.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid params.
    pub const INVALID_PARAMS: i64 = -32602;
}

/// Whether the tap fronts the probe's own server or only watches a wrapped one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In front of the probe's MCP server: may answer and drop (see the module docs).
    Serve,
    /// In front of another server (`--wrap`): records only, forwards everything.
    Observe,
}

/// What the transport must do with one client message.
#[derive(Debug, Default)]
pub struct Observation {
    /// The records written for it (one, or one per element of a batch).
    pub records: Vec<Record>,
    /// A JSON-RPC response to send back instead of forwarding.
    pub answer: Option<Value>,
    /// Whether to pass the message on to the server.
    pub forward: bool,
}

/// State shared by every connection: how to digest, where to write, how to behave.
pub struct Tap {
    digester: Digester,
    sources: Arc<crate::identity::IdentitySources>,
    log: Arc<ShapeLog>,
    transport: Transport,
    mode: Mode,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digester holds the salt: never printed.
        f.debug_struct("Tap")
            .field("digest", &self.digester.scheme())
            .field("transport", &self.transport)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Tap {
    /// A tap writing to `log`.
    pub fn new(digester: Digester, log: Arc<ShapeLog>, transport: Transport, mode: Mode) -> Self {
        Tap {
            digester,
            sources: crate::identity::IdentitySources::built_in_shared(),
            log,
            transport,
            mode,
        }
    }

    /// The same tap, giving identity verdicts by `sources` (`--identity-sources`).
    pub fn with_identity_sources(mut self, sources: Arc<crate::identity::IdentitySources>) -> Self {
        self.sources = sources;
        self
    }

    /// The digester (the `capabilities` tool uses the same one).
    pub fn digester(&self) -> &Digester {
        &self.digester
    }

    /// A new connection with a fresh random id.
    pub fn connection(self: &Arc<Self>) -> TapConnection {
        TapConnection {
            tap: self.clone(),
            ctx: RecordContext {
                sources: self.sources.clone(),
                ..RecordContext::new(self.transport)
            },
            requested_protocol: None,
            negotiated_protocol: None,
            header_protocol: None,
            pending_initialize: Vec::new(),
            started: false,
        }
    }

    fn write(&self, record: &Record) {
        if let Err(e) = self.log.write(record) {
            tracing::error!("{e:#}");
        }
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct TapConnection {
    tap: Arc<Tap>,
    ctx: RecordContext,
    requested_protocol: Option<String>,
    negotiated_protocol: Option<String>,
    header_protocol: Option<String>,
    pending_initialize: Vec<String>,
    started: bool,
}

/// One complete client message, or the facts about one too long to keep.
#[derive(Debug)]
pub enum Frame {
    /// A message of at most [`MAX_MESSAGE_BYTES`].
    Message(Vec<u8>),
    /// A longer message: its length and what the skimmer found.
    Oversize {
        /// Total bytes.
        len: usize,
        /// Top-level `id` and `method`, if found.
        skim: Skim,
    },
}

impl TapConnection {
    /// The connection id written in its records.
    pub fn id(&self) -> &str {
        &self.ctx.connection
    }

    /// The protocol version the transport reports for the next message (HTTP's
    /// `mcp-protocol-version` header), used when nothing better is known.
    pub fn set_header_protocol(&mut self, version: Option<&str>) {
        self.header_protocol = version.map(|v| record::label(v, &self.tap.digester));
    }

    /// Records one client message and says what to do with it.
    pub fn client_frame(&mut self, frame: &Frame) -> Observation {
        let obs = match frame {
            Frame::Message(bytes) => self.client_message(bytes),
            Frame::Oversize { len, skim } => {
                let len = *len;
                let message = format!(
                    "message of {len} bytes exceeds the probe's limit of {MAX_MESSAGE_BYTES} bytes"
                );
                self.refused(
                    Kind::Oversize,
                    len,
                    skim,
                    "oversize",
                    message,
                    codes::INVALID_REQUEST,
                )
            }
        };
        for r in &obs.records {
            self.tap.write(r);
        }
        obs
    }

    /// Learns from one message the server sent (the agreed protocol version).
    pub fn server_message(&mut self, bytes: &[u8]) {
        if self.pending_initialize.is_empty() || bytes.len() > MAX_MESSAGE_BYTES {
            return;
        }
        let Ok(msg) = serde_json::from_slice::<Value>(bytes) else {
            return;
        };
        let Some(id) = msg.get("id") else { return };
        let key = id.to_string();
        if let Some(pos) = self.pending_initialize.iter().position(|k| *k == key) {
            self.pending_initialize.remove(pos);
            if let Some(v) = msg
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
            {
                self.negotiated_protocol = Some(record::label(v, &self.tap.digester));
            }
        }
    }

    fn context(&self) -> RecordContext {
        let mut ctx = self.ctx.clone();
        ctx.protocol_version = self
            .negotiated_protocol
            .clone()
            .or_else(|| self.requested_protocol.clone())
            .or_else(|| self.header_protocol.clone());
        ctx
    }

    fn client_message(&mut self, bytes: &[u8]) -> Observation {
        let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let value: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => {
                let skim = Skimmer::skim(text);
                let (code, message, rpc) = if e.to_string().contains("recursion limit") {
                    (
                        "too_deep",
                        "JSON nested deeper than 128 levels; the probe parses up to 128"
                            .to_string(),
                        codes::INVALID_REQUEST,
                    )
                } else {
                    (
                        "malformed_json",
                        format!("not valid JSON: {e}"),
                        codes::PARSE_ERROR,
                    )
                };
                return self.refused(Kind::Malformed, bytes.len(), &skim, code, message, rpc);
            }
        };
        match value {
            Value::Object(_) => self.one_message(&value, bytes.len()),
            Value::Array(items) => {
                let mut obs = Observation {
                    forward: true,
                    ..Default::default()
                };
                for item in &items {
                    let size = serde_json::to_vec(item).map(|v| v.len()).unwrap_or(0);
                    obs.records.extend(self.one_message(item, size).records);
                }
                if self.tap.mode == Mode::Serve {
                    // MCP dropped JSON-RPC batches in 2025-06-18; rmcp cannot answer one by id.
                    obs.forward = false;
                    obs.answer = Some(error_response(
                        &Value::Null,
                        codes::INVALID_REQUEST,
                        "invalid request: JSON-RPC batches are not supported; send one message \
                         per line",
                    ));
                }
                obs
            }
            other => {
                let message = format!(
                    "a JSON {} is not a JSON-RPC message; expected an object with `jsonrpc`, \
                     `method` and `id`",
                    shape::JsonType::of(&other).name()
                );
                self.refused(
                    Kind::Malformed,
                    bytes.len(),
                    &Skim::default(),
                    "not_jsonrpc",
                    message,
                    codes::INVALID_REQUEST,
                )
            }
        }
    }

    fn one_message(&mut self, msg: &Value, bytes: usize) -> Observation {
        let digester = self.tap.digester.clone();
        let id = msg.get("id");
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            if id.is_some() && (msg.get("result").is_some() || msg.get("error").is_some()) {
                let mut r = Record::new(Kind::Response, bytes, &self.context(), &digester);
                r.id = id.map(|id| shape::value_shape(id, &digester));
                let forward = self.tap.mode == Mode::Observe || self.started;
                return Observation {
                    records: vec![r],
                    answer: None,
                    forward,
                };
            }
            let skim = Skim {
                id: id.cloned(),
                method: None,
            };
            return self.refused(
                Kind::Malformed,
                bytes,
                &skim,
                "not_jsonrpc",
                "a JSON object with no string `method` and no `result` or `error` is not a \
                 JSON-RPC message"
                    .into(),
                codes::INVALID_REQUEST,
            );
        };
        let record = record::record_for_request(
            method,
            id,
            msg.get("params"),
            bytes,
            &self.context(),
            &digester,
        );
        if let Some(client) = &record.client
            && (client.from == ClientInfoFrom::Initialize || self.ctx.client.is_none())
        {
            self.ctx.client = Some(client.clone());
        }
        if method == "initialize"
            && let Some(id) = id
        {
            self.requested_protocol = record.protocol_version.clone();
            self.pending_initialize.push(id.to_string());
        }
        let mut obs = Observation {
            records: vec![record],
            answer: None,
            forward: true,
        };
        if self.tap.mode == Mode::Observe {
            return obs;
        }
        let params = msg.get("params");
        let meta = params.and_then(|p| p.get("_meta"));
        match id {
            Some(id) if params.is_some_and(|p| !p.is_object() && !p.is_null()) => {
                obs.forward = false;
                obs.answer = Some(error_response(
                    id,
                    codes::INVALID_PARAMS,
                    &format!(
                        "invalid params: `params` must be a JSON object; got {}",
                        shape::JsonType::of(params.unwrap_or(&Value::Null)).name()
                    ),
                ));
            }
            Some(id) if meta.is_some_and(|m| !m.is_object()) => {
                obs.forward = false;
                obs.answer = Some(error_response(
                    id,
                    codes::INVALID_PARAMS,
                    &format!(
                        "invalid params: `_meta` must be a JSON object; got {}",
                        shape::JsonType::of(meta.unwrap_or(&Value::Null)).name()
                    ),
                ));
            }
            Some(id)
                if method == "tools/call"
                    && params
                        .and_then(|p| p.get("arguments"))
                        .is_some_and(|a| !a.is_object() && !a.is_null()) =>
            {
                obs.forward = false;
                obs.answer = Some(error_response(
                    id,
                    codes::INVALID_PARAMS,
                    &format!(
                        "invalid params: `arguments` must be a JSON object; got {}",
                        shape::JsonType::of(&params.unwrap_or(&Value::Null)["arguments"]).name()
                    ),
                ));
            }
            Some(id) if method == "server/discover" => {
                obs.forward = false;
                obs.answer = Some(error_response(
                    id,
                    codes::METHOD_NOT_FOUND,
                    "Method not found: `server/discover`; this server uses the `initialize` \
                     lifecycle (protocol 2025-11-25 and earlier)",
                ));
            }
            Some(_) => self.started = true,
            None => obs.forward = self.started,
        }
        obs
    }

    fn refused(
        &mut self,
        kind: Kind,
        bytes: usize,
        skim: &Skim,
        code: &str,
        message: String,
        rpc_code: i64,
    ) -> Observation {
        let digester = &self.tap.digester;
        let mut r = Record::new(kind, bytes, &self.context(), digester);
        r.method = skim.method.as_deref().map(|m| record::label(m, digester));
        r.id = skim.id.as_ref().map(|id| shape::value_shape(id, digester));
        r.error = Some(RecordError {
            code: code.to_string(),
            message: message.clone(),
        });
        let answer = match self.tap.mode {
            Mode::Observe => None,
            // A notification gets no answer; an unknown id is answered with `null`.
            Mode::Serve if skim.method.is_some() && skim.id.is_none() => None,
            Mode::Serve => Some(error_response(
                skim.id.as_ref().unwrap_or(&Value::Null),
                rpc_code,
                &message,
            )),
        };
        Observation {
            records: vec![r],
            answer,
            forward: self.tap.mode == Mode::Observe,
        }
    }
}

/// A JSON-RPC error response.
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The top-level `id` and `method` of a message, found without parsing it whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Skim {
    /// The `id`, when it is a string, number or null of at most 1 KiB.
    pub id: Option<Value>,
    /// The `method`, when it is a string of at most 1 KiB.
    pub method: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Id,
    Method,
    Other,
}

/// An incremental scanner that finds the top-level `id` and `method` of a JSON object in a byte
/// stream, with constant memory and no recursion, whatever the message's size or depth.
#[derive(Debug, Default)]
pub struct Skimmer {
    depth: usize,
    in_string: bool,
    escape: bool,
    expect_key: bool,
    key: Vec<u8>,
    in_key: bool,
    field: Option<Field>,
    value: Vec<u8>,
    in_value: bool,
    value_is_string: bool,
    value_overflow: bool,
    found: Skim,
}

impl Skimmer {
    /// Skims one whole message.
    pub fn skim(bytes: &[u8]) -> Skim {
        let mut s = Skimmer::default();
        s.feed(bytes);
        s.finish()
    }

    /// Feeds the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// What was found.
    pub fn finish(mut self) -> Skim {
        if self.in_value && !self.value_is_string {
            self.end_value();
        }
        self.found
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.in_key {
                if self.key.len() < 16 {
                    self.key.push(b);
                }
            } else if self.in_value {
                self.push_value(b);
            }
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    self.key.pop();
                } else if self.in_value {
                    self.end_value();
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.in_key = true;
                    self.key.clear();
                } else if self.depth == 1 && self.field.is_some() && !self.in_value {
                    self.start_value(true);
                    self.push_value(b);
                }
            }
            b'{' | b'[' => {
                if self.depth == 1 {
                    // A compound id is not skimmed.
                    self.field = None;
                }
                self.depth += 1;
                self.expect_key = self.depth == 1 && b == b'{';
            }
            b'}' | b']' => {
                if self.depth == 1 && self.in_value {
                    self.end_value();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => {
                self.expect_key = false;
                self.field = Some(match self.key.as_slice() {
                    b"id" => Field::Id,
                    b"method" => Field::Method,
                    _ => Field::Other,
                });
            }
            b',' if self.depth == 1 => {
                if self.in_value {
                    self.end_value();
                }
                self.field = None;
                self.expect_key = true;
            }
            b' ' | b'\t' | b'\n' | b'\r' => {
                if self.depth == 1 && self.in_value && !self.value_is_string {
                    self.end_value();
                }
            }
            _ => {
                if self.depth == 1 && self.field.is_some() {
                    if !self.in_value {
                        self.start_value(false);
                    }
                    self.push_value(b);
                }
            }
        }
    }

    fn start_value(&mut self, is_string: bool) {
        self.in_value = true;
        self.value_is_string = is_string;
        self.value_overflow = false;
        self.value.clear();
    }

    fn push_value(&mut self, b: u8) {
        if self.value.len() < MAX_SKIM_TOKEN {
            self.value.push(b);
        } else {
            self.value_overflow = true;
        }
    }

    fn end_value(&mut self) {
        self.in_value = false;
        let field = self.field.take();
        if self.value_overflow {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(&self.value) else {
            return;
        };
        match (field, value) {
            (Some(Field::Id), v @ (Value::String(_) | Value::Number(_) | Value::Null)) => {
                self.found.id = Some(v)
            }
            (Some(Field::Method), Value::String(m)) => self.found.method = Some(m),
            _ => {}
        }
    }
}

/// Collects one message up to [`MAX_MESSAGE_BYTES`]; past that, counts and skims instead.
#[derive(Debug, Default)]
pub struct Accumulator {
    buf: Vec<u8>,
    len: usize,
    skimmer: Option<Skimmer>,
}

impl Accumulator {
    /// Adds the next bytes of the message.
    pub fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        if let Some(s) = &mut self.skimmer {
            s.feed(bytes);
        } else if self.buf.len() + bytes.len() > MAX_MESSAGE_BYTES {
            let mut s = Skimmer::default();
            s.feed(&self.buf);
            s.feed(bytes);
            self.buf = Vec::new();
            self.skimmer = Some(s);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Bytes pushed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message, and a fresh accumulator in place of this one.
    pub fn take(&mut self) -> Frame {
        let done = std::mem::take(self);
        match done.skimmer {
            None => Frame::Message(done.buf),
            Some(s) => Frame::Oversize {
                len: done.len,
                skim: s.finish(),
            },
        }
    }
}

/// Splits a byte stream into newline-delimited messages, each bounded by an [`Accumulator`].
/// Blank lines are skipped.
#[derive(Debug, Default)]
pub struct LineFramer {
    current: Accumulator,
}

impl LineFramer {
    /// Feeds bytes; every completed line is appended to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) {
        while let Some(nl) = bytes.iter().position(|b| *b == b'\n') {
            self.current.push(&bytes[..nl]);
            self.finish_line(out);
            bytes = &bytes[nl + 1..];
        }
        self.current.push(bytes);
    }

    /// Ends the stream: a last line without a newline is still a message.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        self.finish_line(out);
    }

    fn finish_line(&mut self, out: &mut Vec<Frame>) {
        let frame = self.current.take();
        if let Frame::Message(m) = &frame
            && m.iter().all(|b| b.is_ascii_whitespace())
        {
            return;
        }
        out.push(frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn skimmer_table() {
        let cases: Vec<(&str, Option<Value>, Option<&str>)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
                Some(json!(7)),
                Some("tools/call"),
            ),
            (
                r#"{"method":"x","params":{"id":1,"method":"inner"},"id":"a\"b"}"#,
                Some(json!("a\"b")),
                Some("x"),
            ),
            (
                r#"{ "id" : -1.5 , "method" : "m" }"#,
                Some(json!(-1.5)),
                Some("m"),
            ),
            (r#"{"id":null}"#, Some(Value::Null), None),
            (r#"{"id":{"x":1},"method":"m"}"#, None, Some("m")),
            (
                r#"{"params":{"_meta":[[[[[[]]]]]]},"id":3"#,
                Some(json!(3)),
                None,
            ),
            (r#"[{"id":1}]"#, None, None),
            (r#"not json"#, None, None),
        ];
        for (input, id, method) in cases {
            let skim = Skimmer::skim(input.as_bytes());
            assert_eq!(skim.id, id, "{input}");
            assert_eq!(skim.method.as_deref(), method, "{input}");
        }
    }

    #[test]
    fn skimmer_is_incremental() {
        let msg = r#"{"jsonrpc":"2.0","method":"tools/call","params":{"a":"xxxx"},"id":"req-9"}"#;
        for split in 0..msg.len() {
            let mut s = Skimmer::default();
            s.feed(&msg.as_bytes()[..split]);
            s.feed(&msg.as_bytes()[split..]);
            let skim = s.finish();
            assert_eq!(skim.id, Some(json!("req-9")));
            assert_eq!(skim.method.as_deref(), Some("tools/call"));
        }
    }

    #[test]
    fn framer_bounds_lines() {
        let mut f = LineFramer::default();
        let mut out = Vec::new();
        let big = format!(
            r#"{{"id":5,"method":"m","params":{{"x":"{}"}}}}"#,
            "a".repeat(MAX_MESSAGE_BYTES)
        );
        f.push(b"{\"id\":1}\n\n  \n", &mut out);
        for chunk in big.as_bytes().chunks(8192) {
            f.push(chunk, &mut out);
        }
        f.push(b"\n{\"id\":2}", &mut out);
        f.finish(&mut out);
        assert_eq!(out.len(), 3);
        assert!(matches!(&out[0], Frame::Message(m) if m == b"{\"id\":1}"));
        match &out[1] {
            Frame::Oversize { len, skim } => {
                assert_eq!(*len, big.len());
                assert_eq!(skim.id, Some(json!(5)));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&out[2], Frame::Message(m) if m == b"{\"id\":2}"));
    }

    fn serve_tap() -> (Arc<Tap>, TapConnection) {
        let tap = Arc::new(Tap::new(
            Digester::Plain,
            Arc::new(ShapeLog::from_writer(Box::new(std::io::sink()))),
            Transport::Stdio,
            Mode::Serve,
        ));
        let conn = tap.connection();
        (tap, conn)
    }

    fn msg(v: Value) -> Frame {
        Frame::Message(serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn discover_is_answered_and_initialize_is_forwarded() {
        let (_tap, mut c) = serve_tap();
        let o = c.client_frame(&msg(
            json!({"jsonrpc":"2.0","id":"d-1","method":"server/discover","params":{}}),
        ));
        assert!(!o.forward);
        let a = o.answer.unwrap();
        assert_eq!(a["id"], json!("d-1"));
        assert_eq!(a["error"]["code"], json!(-32601));
        let o = c.client_frame(&msg(
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        ));
        assert!(
            !o.forward,
            "a notification before the first request is not forwarded"
        );
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","clientInfo":{"name":"claude-code","version":"2.1.332"}}})));
        assert!(o.forward && o.answer.is_none());
        c.server_message(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18"}}"#);
        let o = c.client_frame(&msg(
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        ));
        assert!(o.forward);
        let r = &o.records[0];
        assert_eq!(r.client.as_ref().unwrap().name, "claude-code");
        assert_eq!(r.protocol_version.as_deref(), Some("2025-06-18"));
    }

    #[test]
    fn bad_input_is_recorded_and_answered() {
        let (_tap, mut c) = serve_tap();
        let o = c.client_frame(&Frame::Message(b"{not json".to_vec()));
        assert_eq!(o.records[0].error.as_ref().unwrap().code, "malformed_json");
        assert_eq!(o.answer.unwrap()["error"]["code"], json!(-32700));
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"_meta":{}{}}}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        );
        let o = c.client_frame(&Frame::Message(deep.into_bytes()));
        assert_eq!(o.records[0].error.as_ref().unwrap().code, "too_deep");
        assert_eq!(o.records[0].method.as_deref(), Some("tools/call"));
        let a = o.answer.unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!(11), json!(-32600))
        );
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"t","arguments":[1]}})));
        let a = o.answer.unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!("a"), json!(-32602))
        );
        let o = c.client_frame(&msg(
            json!([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]),
        ));
        assert_eq!(o.records.len(), 2);
        assert!(!o.forward);
        assert_eq!(o.answer.unwrap()["error"]["code"], json!(-32600));
        let o = c.client_frame(&Frame::Message(b"42".to_vec()));
        assert_eq!(o.records[0].error.as_ref().unwrap().code, "not_jsonrpc");
        assert!(!o.forward);
    }

    #[test]
    fn observe_mode_forwards_everything() {
        let tap = Arc::new(Tap::new(
            Digester::Plain,
            Arc::new(ShapeLog::from_writer(Box::new(std::io::sink()))),
            Transport::Wrap,
            Mode::Observe,
        ));
        let mut c = tap.connection();
        for frame in [
            msg(json!({"jsonrpc":"2.0","id":"d","method":"server/discover"})),
            Frame::Message(b"garbage".to_vec()),
            msg(json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
        ] {
            let o = c.client_frame(&frame);
            assert!(o.forward && o.answer.is_none());
        }
    }
}
