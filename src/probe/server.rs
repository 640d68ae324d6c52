//! The probe's MCP server: one read-only tool, `capabilities`.
//!
//! [`ProbeServer`] is an rmcp [`ServerHandler`]. Its `capabilities` tool answers the calling
//! agent with this call's identity verdict (platform and source, or the identity error code and
//! message, exactly as the router would give them) and the `_meta` keys it saw, each with its
//! JSON type and length, never a value. So a person can ask their agent to call the tool and read
//! the verdict in the chat, while the tap writes the full shape record to the log.
//!
//! # Protocol versions
//! By default the probe speaks both lifecycles rmcp 3.11 knows: `server/discover` is answered
//! per MCP 2026-07-28 (supported versions, capabilities, instructions, and the server's identity
//! in `_meta["io.modelcontextprotocol/serverInfo"]`), requests that carry the per-request
//! `io.modelcontextprotocol/*` keys are served without `initialize`, and `initialize` is
//! answered for clients of 2025-11-25 and earlier. With [`ProbeServer::legacy_handshake`]
//! (`callid probe --legacy-handshake`) the probe is a 2025-11-25 server: `server/discover` gets
//! `-32601`, so a client that tries the new protocol first falls back to `initialize`, and a
//! request declaring 2026-07-28 in its `_meta` is refused as an unsupported version.

use crate::identity::IdentitySources;
use crate::shape::{self, Digester};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, DiscoverRequestMethod, DiscoverResult,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use std::borrow::Cow;
use std::sync::Arc;

/// Name of the probe's one tool.
pub const CAPABILITIES_TOOL: &str = "capabilities";

/// The probe's MCP server.
#[derive(Clone)]
pub struct ProbeServer {
    digester: Digester,
    sources: Arc<IdentitySources>,
    legacy_handshake: bool,
}

impl ProbeServer {
    /// A server whose answers use `digester` (the same one as the log), speaking 2026-07-28 and
    /// the `initialize` lifecycle.
    pub fn new(digester: Digester) -> Self {
        ProbeServer {
            digester,
            sources: IdentitySources::built_in_shared(),
            legacy_handshake: false,
        }
    }

    /// The same server, giving verdicts by `sources` (`--identity-sources`).
    pub fn with_identity_sources(mut self, sources: Arc<IdentitySources>) -> Self {
        self.sources = sources;
        self
    }

    /// The same server limited to the `initialize` lifecycle (protocol 2025-11-25 and earlier)
    /// when `legacy` is true: see the module docs.
    pub fn legacy_handshake(mut self, legacy: bool) -> Self {
        self.legacy_handshake = legacy;
        self
    }

    /// The `capabilities` tool's description, as listed.
    pub fn tool() -> Tool {
        let schema: Map<String, Value> = serde_json::from_value(json!({
            "type": "object",
            "properties": {"note": {
                "type": "string",
                "description": "Optional and ignored: lets a measurement tell two calls apart.",
            }},
            "additionalProperties": false,
        }))
        .expect("a schema object");
        Tool::new(
            CAPABILITIES_TOOL,
            "Report whether this MCP client sends a trusted per-call ID: the identity verdict \
             for this very call and the `_meta` keys it carried (names, types and lengths; never \
             values). Read-only; its one optional argument, `note`, is ignored.",
            Arc::new(schema),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true),
        )
    }
}

/// The structured answer of the `capabilities` tool for one call.
pub fn capabilities_answer(
    meta: Option<&Value>,
    arguments: &Value,
    digester: &Digester,
    sources: &IdentitySources,
) -> Value {
    // Built member by member (in the order the answer has always had): `json!` with expression
    // values serializes each one into a new `Value`, copying the key list and the verdict a
    // second time per call.
    let verdict = match sources.from_meta(meta) {
        Ok(id) => object([
            ("verdict", Value::from("accepted")),
            (
                "platform",
                Value::String(crate::probe::record::label(&id.platform, digester)),
            ),
            ("source", Value::String(id.source_key)),
        ]),
        Err(e) => object([
            ("verdict", Value::from("rejected")),
            ("code", Value::from(e.code())),
            ("message", Value::String(e.to_string())),
        ]),
    };
    // Top-level keys only, read straight from the map: the answer carries no digest, so a full
    // `meta_shape` here (the tap has already recorded one for the log) would hash every value
    // a second time per call for nothing (`callid bench --only probe_round_trip`, callgrind).
    let keys: Vec<Value> = match meta {
        Some(Value::Object(map)) => map
            .iter()
            .take(shape::MAX_ENTRIES)
            .map(|(key, value)| {
                object([
                    (
                        "key",
                        Value::String(crate::probe::record::label(cut_key(key), digester)),
                    ),
                    ("type", Value::from(shape::JsonType::of(value).name())),
                    (
                        "len",
                        value_shape_len(value).map_or(Value::Null, Value::from),
                    ),
                    ("identity_source", Value::Bool(sources.entry(key).is_some())),
                ])
            })
            .collect(),
        _ => Vec::new(),
    };
    let meta_status = match meta {
        None => "absent",
        Some(Value::Object(_)) => "object",
        Some(_) => "not_object",
    };
    object([
        ("identity", verdict),
        ("meta", Value::from(meta_status)),
        ("meta_keys", Value::Array(keys)),
        (
            "arguments_identity_error",
            sources
                .check_arguments(arguments)
                .err()
                .map_or(Value::Null, |e| Value::from(e.code())),
        ),
        (
            "note",
            Value::from("shapes only: no `_meta` value and no argument is recorded or echoed"),
        ),
    ])
}

/// A JSON object of these members, in this order.
fn object<const N: usize>(members: [(&str, Value); N]) -> Value {
    let mut map = Map::with_capacity(N);
    for (key, value) in members {
        map.insert(key.to_string(), value);
    }
    Value::Object(map)
}

/// A key name cut to [`shape::MAX_KEY_BYTES`] at a character boundary, as shapes record it.
fn cut_key(key: &str) -> &str {
    crate::text::cut(key, shape::MAX_KEY_BYTES)
}

/// The length a shape records: bytes of a string, items of an array, keys of an object.
fn value_shape_len(value: &Value) -> Option<usize> {
    match value {
        Value::String(s) => Some(s.len()),
        Value::Array(a) => Some(a.len()),
        Value::Object(o) => Some(o.len()),
        _ => None,
    }
}

impl ServerHandler for ProbeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "callid-probe",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "callid probe: call the `capabilities` tool to see whether this client sends a \
                 trusted per-call ID in `_meta`.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.legacy_handshake {
            Cow::Borrowed(ProtocolVersion::known_up_to(
                &ProtocolVersion::LATEST_WITH_INITIALIZE,
            ))
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        if self.legacy_handshake {
            return Err(McpError::method_not_found::<DiscoverRequestMethod>());
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![Self::tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != CAPABILITIES_TOOL {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{}`; the probe has one tool, `{CAPABILITIES_TOOL}`",
                    crate::probe::record::label(&request.name, &self.digester)
                ),
                None,
            ));
        }
        // rmcp moves the request's `_meta` into the context; an empty map means none was sent.
        // Taken, not cloned: the context is this call's own.
        let map = std::mem::take(&mut context.meta.0.0);
        let meta = (!map.is_empty()).then(|| Value::Object(map));
        let arguments = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let answer = capabilities_answer(meta.as_ref(), &arguments, &self.digester, &self.sources);
        Ok(CallToolResult::structured(answer).into())
    }
}
