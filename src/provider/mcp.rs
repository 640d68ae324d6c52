//! `callid provider --mcp`: the paid provider as an MCP server over stdio, the upstream of
//! `callid gateway` in demos, tests and the README.
//!
//! [`McpProvider`] has one paid tool, `generate_image` (arguments as the HTTP body:
//! `prompt`, `width`, `height`, `model`, `max_amount_cents`), and one free tool,
//! `list_charges`. A `generate_image` call must carry `_meta["callid/idempotency-key"]`; it is
//! charged once per key in the same durable [`Ledger`] and by the same rules as the HTTP
//! provider: the first use of a key charges and answers the receipt, the same key with the same request answers the original receipt
//! (`_meta["callid-provider/replayed"] = true`) without a new charge, the same key with another
//! request is refused. Every refusal is a tool result with `isError: true` and
//! `structuredContent: {"error": code, "message": ...}`: the tool's own answer.
//!
//! The resource `callid-provider://charges` holds the same list as `list_charges`.

use super::ledger::Ledger;
use super::types::{ChargeOutcome, ChargesPage, ImageRequest};
use crate::crashpoint::{self, Boundary};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

/// `_meta` key of a result that repeats an earlier charge.
pub const REPLAYED_META: &str = "callid-provider/replayed";
/// The paid tool.
pub const GENERATE_IMAGE: &str = "generate_image";
/// The free tool.
pub const LIST_CHARGES: &str = "list_charges";
/// The resource listing the charges.
pub const CHARGES_URI: &str = "callid-provider://charges";

/// The provider as an MCP server; cheap to clone.
#[derive(Debug, Clone)]
pub struct McpProvider {
    ledger: Ledger,
}

impl McpProvider {
    /// A provider charging into `ledger`.
    pub fn new(ledger: Ledger) -> Self {
        McpProvider { ledger }
    }

    async fn generate_image(&self, args: Map<String, Value>, meta: &Map<String, Value>) -> Value {
        let key = match meta.get(crate::keys::IDEMPOTENCY_META) {
            Some(Value::String(k)) => k.clone(),
            Some(_) => {
                return refusal(
                    "invalid_idempotency_key",
                    "`_meta[\"callid/idempotency-key\"]` must be a string; nothing was charged",
                );
            }
            None => {
                return refusal(
                    "missing_idempotency_key",
                    "this paid tool needs `_meta[\"callid/idempotency-key\"]` (put callid gateway \
                     in front of it); nothing was charged",
                );
            }
        };
        let request: ImageRequest = match serde_json::from_value(Value::Object(args)) {
            Ok(r) => r,
            Err(e) => {
                return refusal(
                    "invalid_request",
                    &format!("invalid arguments: {e}; nothing was charged"),
                );
            }
        };
        let ledger = self.ledger.clone();
        let charged =
            tokio::task::spawn_blocking(move || ledger.charge(&key, &request).map(|o| (o, key)))
                .await;
        match charged {
            Ok(Ok((outcome, _))) => {
                if !outcome.replayed {
                    // Test-only: a new charge is committed and its answer not yet sent.
                    crashpoint::hit(Boundary::AfterProviderCharge);
                }
                charge_result(&outcome)
            }
            Ok(Err(e)) => refusal(e.code(), &format!("{e}; nothing was charged")),
            Err(e) => refusal("internal_error", &format!("charge task failed: {e}")),
        }
    }

    async fn charges(&self) -> Result<ChargesPage, McpError> {
        let ledger = self.ledger.clone();
        tokio::task::spawn_blocking(move || ledger.charges())
            .await
            .map_err(|e| McpError::internal_error(format!("ledger task failed: {e}"), None))?
            .map(ChargesPage::new)
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}

/// The `CallToolResult` JSON of a charge: the receipt as `structuredContent`, a one-line text,
/// and `_meta["callid-provider/replayed"] = true` on a replay.
pub fn charge_result(outcome: &ChargeOutcome) -> Value {
    let r = &outcome.receipt;
    let text = format!(
        "Generated image `{}` ({}x{}, {}) for {} cents, charge `{}`.",
        r.image.id, r.image.width, r.image.height, r.model, r.amount_cents, r.charge_id
    );
    let mut v = json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": serde_json::to_value(r).expect("a receipt serializes"),
    });
    if outcome.replayed {
        v["_meta"] = json!({ REPLAYED_META: true });
    }
    v
}

/// The `CallToolResult` JSON of a refusal: `isError: true`, `structuredContent: {error, message}`.
pub fn refusal(code: &str, message: &str) -> Value {
    json!({
        "isError": true,
        "content": [{"type": "text", "text": message}],
        "structuredContent": {"error": code, "message": message},
    })
}

/// The properties of an image request's arguments (`prompt`, `width`, `height`, `model`): what
/// the provider's `generate_image` and the router's, which forwards them, both take.
pub fn image_request_properties() -> Map<String, Value> {
    rmcp::model::object(json!({
        "prompt": {"type": "string", "description": "What the image shows."},
        "width": {"type": "integer", "description": "Width in pixels (default 1024)."},
        "height": {"type": "integer", "description": "Height in pixels (default 1024)."},
        "model": {"type": "string", "description": "Model name (default `flux-schnell`)."}
    }))
}

/// The two tools, with their input schemas.
pub fn tools() -> Vec<Tool> {
    let mut properties = image_request_properties();
    properties.insert(
        "max_amount_cents".into(),
        json!({"type": "integer", "description": "Refuse to charge more than this many cents (optional)."}),
    );
    vec![
        Tool::new(
            GENERATE_IMAGE,
            "Generate an image (paid: 3 cents for the default model). Charged once per \
             `_meta[\"callid/idempotency-key\"]`.",
            rmcp::model::object(json!({
                "type": "object",
                "properties": properties,
                "required": ["prompt"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            LIST_CHARGES,
            "Every charge in the ledger, oldest first. Free.",
            rmcp::model::object(
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        ),
    ]
}

impl ServerHandler for McpProvider {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            "callid-provider",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let meta = context.meta.0.0;
        let value = match request.name.as_ref() {
            GENERATE_IMAGE => {
                self.generate_image(request.arguments.unwrap_or_default(), &meta)
                    .await
            }
            LIST_CHARGES => {
                let page = self.charges().await?;
                json!({
                    "content": [{"type": "text", "text": format!("{} charges, {} cents", page.count, page.total_cents)}],
                    "structuredContent": page,
                })
            }
            other => {
                return Err(McpError::invalid_params(
                    format!(
                        "unknown tool `{other}`; this provider has {GENERATE_IMAGE} and {LIST_CHARGES}"
                    ),
                    None,
                ));
            }
        };
        serde_json::from_value::<CallToolResult>(value)
            .map(CallToolResponse::from)
            .map_err(|e| McpError::internal_error(format!("cannot encode a result: {e}"), None))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut resource = Resource::new(CHARGES_URI, "charges");
        resource.mime_type = Some("application/json".into());
        Ok(ListResourcesResult::with_all_items(vec![resource]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri != CHARGES_URI {
            return Err(McpError::resource_not_found(
                format!(
                    "no resource `{}`; this provider has `{CHARGES_URI}`",
                    request.uri
                ),
                None,
            ));
        }
        let page = self.charges().await?;
        let text = serde_json::to_string(&page).expect("a page serializes");
        Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
            vec![ResourceContents::text(text, CHARGES_URI)],
        )))
    }
}

/// Serves the provider over stdin/stdout until the client closes it and every call read is
/// answered.
pub async fn serve_stdio(ledger: Ledger) -> anyhow::Result<()> {
    crate::serve::standard_io(McpProvider::new(ledger), "MCP provider").await?;
    Ok(())
}
