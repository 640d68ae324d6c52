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
//! - `server/discover` goes to the server, which answers it per MCP 2026-07-28; only with
//!   [`Tap::legacy_handshake`] (`--legacy-handshake`) is it answered here with `-32601` (method
//!   not found), whatever its `_meta`, so a client such as Claude Code 2.1 falls back to
//!   `initialize`.
//! - A request whose `params` or `params._meta` is not an object, or a `tools/call` whose
//!   `arguments` is not an object, gets `-32602` (rmcp could not parse it, and would answer
//!   without the request's id).
//! - A JSON-RPC batch (an array) gets `-32600`; each element is still recorded.
//! - Malformed JSON gets `-32700`, an oversize or too-deep message or a non-object `-32600`,
//!   each with the message's id when it could be found; none reach the server.
//! - Notifications and responses sent before the client's lifecycle began are recorded and
//!   dropped: rmcp ends a session whose first message after its requests is not a request. The
//!   lifecycle begins with `initialize`, or with the first request other than `server/discover`
//!   and `ping` whose `_meta` carries the 2026-07-28 keys rmcp requires
//!   (`io.modelcontextprotocol/protocolVersion`, a version the server supports, and
//!   `io.modelcontextprotocol/clientCapabilities`).
//!
//! # Protocol version in records
//! A record's `protocol_version` is the one its own message declares (`initialize`'s
//! `protocolVersion`, or the per-request `_meta["io.modelcontextprotocol/protocolVersion"]` of
//! 2026-07-28); otherwise the connection's: the version the server agreed in its `initialize`
//! reply, the one the client asked for, the last per-request one, or HTTP's
//! `mcp-protocol-version` header, in that order.
//!
//! In [`Mode::Observe`] (`--wrap`) the tap never answers and never drops anything.

pub use super::frame::{Accumulator, Frame, LineFramer, MAX_MESSAGE_BYTES, Skim, Skimmer};
use super::record::{
    self, ClientInfo, ClientInfoFrom, INLINE_CAPABILITIES_META_KEY, Kind, Record, RecordContext,
    RecordError, ShapeLog, Transport,
};
use super::writer::{Job, RecordWriter, WriterSummary};
use crate::shape::{self, Digester};
use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Value, json};
use std::sync::Arc;

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

/// What the transport must do with one client message. Its record (one, or one per element of
/// a batch) has been handed to the tap's [`RecordWriter`].
#[derive(Debug, Default)]
pub struct Observation {
    /// A JSON-RPC response to send back instead of forwarding.
    pub answer: Option<Value>,
    /// Whether to pass the message on to the server.
    pub forward: bool,
    /// With [`TapConnection::feeding_server`]: the message to forward, as the server's typed message, made
    /// from the tap's own parse (so the server does not parse it again).
    pub message: Option<ClientJsonRpcMessage>,
}

/// The record of one message: built already, or to be built by the writer from the message.
enum Pending {
    Built(Box<Record>),
    Deferred(RecordContext),
}

/// State shared by every connection: how to digest, where to write, how to behave.
pub struct Tap {
    digester: Digester,
    sources: Arc<crate::identity::IdentitySources>,
    writer: RecordWriter,
    transport: Transport,
    mode: Mode,
    legacy_handshake: bool,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digester holds the salt: never printed.
        f.debug_struct("Tap")
            .field("digest", &self.digester.scheme())
            .field("transport", &self.transport)
            .field("mode", &self.mode)
            .field("legacy_handshake", &self.legacy_handshake)
            .finish()
    }
}

impl Tap {
    /// A tap writing to `log` through a [`RecordWriter`] (records are written off the reply
    /// path; [`Tap::flush`] waits for them, [`Tap::finish`] ends the writer).
    pub fn new(digester: Digester, log: Arc<ShapeLog>, transport: Transport, mode: Mode) -> Self {
        Tap {
            writer: RecordWriter::start(log, digester.clone()),
            digester,
            sources: crate::identity::IdentitySources::built_in_shared(),
            transport,
            mode,
            legacy_handshake: false,
        }
    }

    /// The same tap, giving identity verdicts by `sources` (`--identity-sources`).
    pub fn with_identity_sources(mut self, sources: Arc<crate::identity::IdentitySources>) -> Self {
        self.sources = sources;
        self
    }

    /// Waits until every record handed over so far is written.
    pub fn flush(&self) {
        self.writer.flush();
    }

    /// Writes what is queued and stops the writer (see [`RecordWriter::finish`]).
    pub fn finish(&self) -> WriterSummary {
        self.writer.finish()
    }

    /// Answers `server/discover` with `-32601` when `legacy` is true, so clients fall back to
    /// `initialize` (pair it with [`super::ProbeServer::legacy_handshake`]).
    pub fn legacy_handshake(mut self, legacy: bool) -> Self {
        self.legacy_handshake = legacy;
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
            inline_protocol: None,
            feeds_server: false,
            pending_initialize: Vec::new(),
            started: false,
        }
    }

    fn submit(&self, record: Record) {
        self.writer.submit(Job::Record(Box::new(record)));
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
    inline_protocol: Option<String>,
    feeds_server: bool,
    pending_initialize: Vec<String>,
    started: bool,
}

impl TapConnection {
    /// This connection feeds the server directly: [`Observation::message`] carries each
    /// forwarded message as the server's typed message, made from the tap's own parse (stdio).
    pub fn feeding_server(mut self) -> Self {
        self.feeds_server = true;
        self
    }

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
        match frame {
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
        }
    }

    /// Learns from the server's typed reply to `initialize` the agreed protocol version.
    pub fn server_initialized(&mut self, id: &rmcp::model::RequestId, version: &str) {
        if self.pending_initialize.is_empty() {
            return;
        }
        let key = serde_json::to_string(id).unwrap_or_default();
        if let Some(pos) = self.pending_initialize.iter().position(|k| *k == key) {
            self.pending_initialize.remove(pos);
            self.negotiated_protocol = Some(record::label(version, &self.tap.digester));
        }
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
            .or_else(|| self.inline_protocol.clone())
            .or_else(|| self.header_protocol.clone());
        ctx
    }

    fn client_message(&mut self, bytes: &[u8]) -> Observation {
        let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if self.feeds_server
            && let Some(obs) = self.served_message(text, bytes.len())
        {
            return obs;
        }
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
            Value::Object(_) => {
                let (mut obs, pending) = self.one_message(&value, bytes.len());
                if obs.forward && self.feeds_server {
                    // The server's typed message straight from the text, as rmcp would read it
                    // (converting the tap's `Value` costs more: rmcp's message type buffers its
                    // input first); the `Value` goes to the writer for the record.
                    match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
                        Ok(message) => obs.message = Some(message),
                        Err(e) => {
                            // rmcp would answer this without the request's id.
                            obs.forward = false;
                            obs.answer = value.get("id").map(|id| {
                                error_response(
                                    id,
                                    codes::INVALID_PARAMS,
                                    &format!("invalid request: {e}"),
                                )
                            });
                        }
                    }
                }
                match pending {
                    Pending::Built(record) => self.tap.submit(*record),
                    Pending::Deferred(ctx) => self.tap.writer.submit(Job::Message {
                        message: value,
                        bytes: bytes.len(),
                        ctx,
                    }),
                }
                obs
            }
            Value::Array(items) => {
                let mut obs = Observation {
                    forward: true,
                    ..Default::default()
                };
                for item in &items {
                    let size = serde_json::to_vec(item).map(|v| v.len()).unwrap_or(0);
                    match self.one_message(item, size).1 {
                        Pending::Built(record) => self.tap.submit(*record),
                        Pending::Deferred(ctx) => self.tap.writer.submit(Job::Message {
                            message: item.clone(),
                            bytes: size,
                            ctx,
                        }),
                    }
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

    /// The reply path of a connection feeding the server: when the message is an object rmcp
    /// reads, the tap decides on its [`super::head`] (the members it reads, nothing else built)
    /// and hands the text to the writer, which parses the whole message for the record off the
    /// reply path. `None` for anything else (malformed, not an object, not rmcp's): the caller
    /// then takes the whole-`Value` path, which answers exactly as before. Nothing about the
    /// connection changes before this returns `Some`.
    fn served_message(&mut self, text: &[u8], bytes: usize) -> Option<Observation> {
        let text = std::str::from_utf8(text).ok()?;
        let head = super::head::head(text)?;
        let message = serde_json::from_str::<ClientJsonRpcMessage>(text).ok()?;
        let (mut obs, pending) = self.one_message(&head, bytes);
        if obs.forward {
            obs.message = Some(message);
        }
        match pending {
            Pending::Built(record) => self.tap.submit(*record),
            Pending::Deferred(ctx) => self.tap.writer.submit(Job::Text {
                text: text.as_bytes().to_vec(),
                bytes,
                ctx,
            }),
        }
        Some(obs)
    }

    /// Decides what to do with one message and updates the connection's state; the record is
    /// built by the caller's writer from the message and the returned context.
    fn one_message(&mut self, msg: &Value, bytes: usize) -> (Observation, Pending) {
        let digester = self.tap.digester.clone();
        let id = msg.get("id");
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            if id.is_some() && (msg.get("result").is_some() || msg.get("error").is_some()) {
                let mut r = Record::new(Kind::Response, bytes, &self.context(), &digester);
                r.id = id.map(|id| shape::value_shape(id, &digester));
                let forward = self.tap.mode == Mode::Observe || self.started;
                let obs = Observation {
                    forward,
                    ..Default::default()
                };
                return (obs, Pending::Built(Box::new(r)));
            }
            let skim = Skim {
                id: id.cloned(),
                method: None,
            };
            let (obs, record) = self.refused_record(
                Kind::Malformed,
                bytes,
                &skim,
                "not_jsonrpc",
                "a JSON object with no string `method` and no `result` or `error` is not a \
                 JSON-RPC message"
                    .into(),
                codes::INVALID_REQUEST,
            );
            return (obs, Pending::Built(Box::new(record)));
        };
        // The record is built later from the message and this context; what the message teaches
        // the connection (its client, its protocol version) is read here, as the record will.
        let pending = Pending::Deferred(self.context());
        let params = msg.get("params");
        let params_obj = params.and_then(Value::as_object);
        let meta = params_obj.and_then(|p| p.get("_meta"));
        let meta_obj = meta.and_then(Value::as_object);
        let inline_version = meta_obj
            .and_then(|m| m.get(record::PROTOCOL_VERSION_META_KEY))
            .and_then(Value::as_str);
        let client = meta_obj
            .and_then(|m| m.get(record::CLIENT_INFO_META_KEY))
            .and_then(|v| ClientInfo::from_value(v, ClientInfoFrom::Meta, &digester))
            .or_else(|| {
                (method == "initialize")
                    .then(|| params_obj.and_then(|p| p.get("clientInfo")))
                    .flatten()
                    .and_then(|v| ClientInfo::from_value(v, ClientInfoFrom::Initialize, &digester))
            });
        if let Some(client) = client
            && (client.from == ClientInfoFrom::Initialize || self.ctx.client.is_none())
        {
            self.ctx.client = Some(client);
        }
        if method == "initialize"
            && let Some(id) = id
        {
            let version = inline_version.or_else(|| {
                params_obj
                    .and_then(|p| p.get("protocolVersion"))
                    .and_then(Value::as_str)
            });
            if let Some(v) = version {
                self.requested_protocol = Some(record::label(v, &digester));
            }
            self.pending_initialize.push(id.to_string());
        }
        if let Some(v) = inline_version {
            self.inline_protocol = Some(record::label(v, &digester));
        }
        let mut obs = Observation {
            forward: true,
            ..Default::default()
        };
        if self.tap.mode == Mode::Observe {
            return (obs, pending);
        }
        // `params` and a call's `arguments` may be null; `_meta`, when there, must be an object.
        let arguments = params
            .and_then(|p| p.get("arguments"))
            .filter(|_| method == "tools/call");
        let not_object = [
            ("params", params, true),
            ("_meta", meta, false),
            ("arguments", arguments, true),
        ]
        .into_iter()
        .find_map(|(field, value, null_ok)| {
            let allowed = |v: &&Value| v.is_object() || (null_ok && v.is_null());
            value.filter(|v| !allowed(v)).map(|v| (field, v))
        });
        if let (Some(id), Some((field, value))) = (id, not_object) {
            obs.forward = false;
            obs.answer = Some(not_an_object(id, field, value));
            return (obs, pending);
        }
        match id {
            Some(id) if method == "server/discover" && self.tap.legacy_handshake => {
                obs.forward = false;
                obs.answer = Some(error_response(
                    id,
                    codes::METHOD_NOT_FOUND,
                    "Method not found: `server/discover`; this server uses the `initialize` \
                     lifecycle (protocol 2025-11-25 and earlier)",
                ));
            }
            Some(_) => {
                self.started |= method == "initialize"
                    || (method != "server/discover"
                        && method != "ping"
                        && inline_version.is_some_and(|v| self.supports(v))
                        && meta
                            .and_then(|m| m.get(INLINE_CAPABILITIES_META_KEY))
                            .is_some_and(Value::is_object));
            }
            None => obs.forward = self.started,
        }
        (obs, pending)
    }

    /// Whether the server behind the tap serves `version` without `initialize`.
    fn supports(&self, version: &str) -> bool {
        let versions = if self.tap.legacy_handshake {
            rmcp::model::ProtocolVersion::known_up_to(
                &rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
            )
        } else {
            rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        };
        versions.iter().any(|v| v.as_str() == version)
    }

    #[allow(clippy::too_many_arguments)]
    fn refused(
        &mut self,
        kind: Kind,
        bytes: usize,
        skim: &Skim,
        code: &str,
        message: String,
        rpc_code: i64,
    ) -> Observation {
        let (obs, record) = self.refused_record(kind, bytes, skim, code, message, rpc_code);
        self.tap.submit(record);
        obs
    }

    fn refused_record(
        &mut self,
        kind: Kind,
        bytes: usize,
        skim: &Skim,
        code: &str,
        message: String,
        rpc_code: i64,
    ) -> (Observation, Record) {
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
        let obs = Observation {
            answer,
            forward: self.tap.mode == Mode::Observe,
            message: None,
        };
        (obs, r)
    }
}

/// A JSON-RPC error response.
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The `invalid params` answer to a request whose `field` (`params`, `_meta`, `arguments`) is
/// there but not a JSON object.
fn not_an_object(id: &Value, field: &str, value: &Value) -> Value {
    error_response(
        id,
        codes::INVALID_PARAMS,
        &format!(
            "invalid params: `{field}` must be a JSON object; got {}",
            shape::JsonType::of(value).name()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A log the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A tap, and its records so far (waiting for the writer).
    struct Harness {
        tap: Arc<Tap>,
        log: Shared,
    }

    impl Harness {
        fn new(mode: Mode, legacy: bool) -> Self {
            let log = Shared::default();
            let tap = Arc::new(
                Tap::new(
                    Digester::Plain,
                    Arc::new(ShapeLog::from_writer(Box::new(log.clone()))),
                    Transport::Stdio,
                    mode,
                )
                .legacy_handshake(legacy),
            );
            Harness { tap, log }
        }

        fn records(&self) -> Vec<Record> {
            self.tap.flush();
            let text = String::from_utf8(self.log.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }

        fn last(&self) -> Record {
            self.records().pop().expect("a record")
        }
    }

    fn serve_tap() -> (Harness, TapConnection) {
        let h = Harness::new(Mode::Serve, false);
        let conn = h.tap.connection();
        (h, conn)
    }

    fn msg(v: Value) -> Frame {
        Frame::Message(serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn discover_goes_to_the_server_and_a_stateless_request_begins_the_lifecycle() {
        let (h, mut c) = serve_tap();
        let inline = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.400"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let o = c.client_frame(&msg(
            json!({"jsonrpc":"2.0","id":"d-1","method":"server/discover","params":{"_meta": inline}}),
        ));
        assert!(o.forward && o.answer.is_none());
        assert_eq!(h.last().protocol_version.as_deref(), Some("2026-07-28"));
        // A notification after a discover is held back: rmcp has not begun a lifecycle yet.
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","method":"notifications/x"})));
        assert!(!o.forward);
        assert_eq!(h.last().protocol_version.as_deref(), Some("2026-07-28"));
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":"capabilities","_meta": inline}})));
        assert!(o.forward && o.answer.is_none());
        assert!(
            o.message.is_none(),
            "typed only for a connection feeding the server"
        );
        let r = &h.last();
        assert_eq!(r.protocol_version.as_deref(), Some("2026-07-28"));
        assert_eq!(r.client.as_ref().unwrap().from, ClientInfoFrom::Meta);
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","method":"notifications/x"})));
        assert!(o.forward, "the stateless request began the lifecycle");
    }

    #[test]
    fn legacy_handshake_answers_discover_and_initialize_is_forwarded() {
        let h = Harness::new(Mode::Serve, true);
        let mut c = h.tap.connection();
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
        let r = &h.last();
        assert_eq!(r.client.as_ref().unwrap().name, "claude-code");
        assert_eq!(r.protocol_version.as_deref(), Some("2025-06-18"));
    }

    #[test]
    fn params_meta_and_arguments_that_are_not_objects_are_refused_in_that_order() {
        let refused = |params: Value, method: &str| {
            let (_h, mut c) = serve_tap();
            let o = c.client_frame(&msg(
                json!({"jsonrpc":"2.0","id":7,"method": method,"params": params}),
            ));
            o.answer.map(|a| {
                assert!(!o.forward, "a refused request is not forwarded");
                assert_eq!(a["error"]["code"], json!(-32602));
                a["error"]["message"].as_str().unwrap().to_string()
            })
        };
        let got = |field: &str, kind: &str| {
            Some(format!(
                "invalid params: `{field}` must be a JSON object; got {kind}"
            ))
        };
        let call = "tools/call";
        for (params, method, want) in [
            (json!([1]), call, got("params", "array")),
            (json!(null), call, None),
            (json!({"_meta": "x"}), call, got("_meta", "string")),
            (json!({"_meta": null}), call, got("_meta", "null")),
            (
                json!({"_meta": 3, "arguments": 4}),
                call,
                got("_meta", "number"),
            ),
            (
                json!({"name": "t", "arguments": [1]}),
                call,
                got("arguments", "array"),
            ),
            (json!({"name": "t", "arguments": null}), call, None),
            (json!({"arguments": true}), "ping", None),
        ] {
            assert_eq!(refused(params.clone(), method), want, "{method} {params}");
        }
    }

    #[test]
    fn bad_input_is_recorded_and_answered() {
        let (h, mut c) = serve_tap();
        let o = c.client_frame(&Frame::Message(b"{not json".to_vec()));
        assert_eq!(h.last().error.as_ref().unwrap().code, "malformed_json");
        assert_eq!(o.answer.unwrap()["error"]["code"], json!(-32700));
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"_meta":{}{}}}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        );
        let o = c.client_frame(&Frame::Message(deep.into_bytes()));
        let r = h.last();
        assert_eq!(r.error.as_ref().unwrap().code, "too_deep");
        assert_eq!(r.method.as_deref(), Some("tools/call"));
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
        assert_eq!(h.records().len(), 5, "one record per batch element");
        assert!(!o.forward);
        assert_eq!(o.answer.unwrap()["error"]["code"], json!(-32600));
        let o = c.client_frame(&Frame::Message(b"42".to_vec()));
        assert_eq!(h.last().error.as_ref().unwrap().code, "not_jsonrpc");
        assert!(!o.forward);
    }

    #[test]
    fn observe_mode_forwards_everything() {
        let h = Harness::new(Mode::Observe, false);
        let mut c = h.tap.connection();
        for frame in [
            msg(json!({"jsonrpc":"2.0","id":"d","method":"server/discover"})),
            Frame::Message(b"garbage".to_vec()),
            msg(json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
        ] {
            let o = c.client_frame(&frame);
            assert!(o.forward && o.answer.is_none());
        }
        assert_eq!(h.records().len(), 3);
    }

    /// A connection feeding the server gets each forwarded message typed from the tap's parse;
    /// one rmcp cannot type is answered here with its id instead.
    #[test]
    fn feeding_the_server_types_each_forwarded_message() {
        let h = Harness::new(Mode::Serve, false);
        let mut c = h.tap.connection().feeding_server();
        let o = c.client_frame(&msg(
            json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},
            "clientInfo":{"name":"c","version":"1"}}}),
        ));
        assert!(matches!(
            o.message,
            Some(rmcp::model::JsonRpcMessage::Request(_))
        ));
        let o = c.client_frame(&msg(json!({"jsonrpc":"1.0","id":"x","method":"ping"})));
        assert!(o.message.is_none() && !o.forward);
        let a = o.answer.unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!("x"), json!(-32602))
        );
        assert_eq!(h.records().len(), 2);
        // Past serde_json's nesting limit: refused as too deep, as without a server behind.
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"name":"t","_meta":{{"k":{}{}}}}}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        );
        let o = c.client_frame(&Frame::Message(deep.into_bytes()));
        assert!(o.message.is_none() && !o.forward);
        assert_eq!(o.answer.unwrap()["error"]["code"], json!(-32600));
        assert_eq!(h.last().error.unwrap().code, "too_deep");
        // A tools/call is decided on its head and recorded whole.
        let meta = json!({"callId": "call_12", "threadId": "t", "progressToken": 12,
            "x-codex-turn-metadata": {"model": "m", "sandbox": "workspace-write"}});
        let o = c.client_frame(&msg(json!({"jsonrpc":"2.0","id":12,"method":"tools/call",
            "params":{"name":"capabilities","arguments":{}, "_meta": meta}})));
        assert!(o.forward && o.message.is_some());
        let r = h.last();
        assert_eq!(r.method.as_deref(), Some("tools/call"));
        let shape = r
            .meta
            .as_ref()
            .and_then(|m| m.shape())
            .expect("an object shape");
        assert_eq!(shape.root.digest, Digester::Plain.value(&meta));
        assert_eq!(shape.entries.len(), 6);
        assert_eq!(r.identity.as_ref().map(|_| ()), Some(()), "a verdict");
    }
}
