//! The MCP front of the router: an rmcp `ServerHandler` written by hand, over stdio or
//! streamable HTTP.
//!
//! [`RouterServer`] lists the four tools with hand-written JSON schemas (none has an identity
//! field) and hands each `tools/call` to [`Router::call_tool`] with the raw arguments and the
//! whole request `_meta` (rmcp moves `params._meta` into `RequestContext::meta`). Every tool
//! outcome is a `CallToolResult`; only an unknown tool is a JSON-RPC error. stdout carries the
//! protocol only; logs go to stderr.

use super::image::{CAPABILITIES, GENERATE_IMAGE, OPERATION_STATUS, RESUME_OPERATION, Router};
use crate::spend::diagnose::CallInfo;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use std::sync::Arc;

/// The router as an MCP server; cheap to clone (one shared [`Router`]).
#[derive(Clone, Debug)]
pub struct RouterServer {
    router: Arc<Router>,
}

impl RouterServer {
    /// Wraps a router.
    pub fn new(router: Arc<Router>) -> Self {
        RouterServer { router }
    }
}

/// The four tools with their input schemas. No schema exposes an identity field.
pub fn tools() -> Vec<Tool> {
    let [status, resume] = crate::spend::tools::operation_tools();
    vec![
        Tool::new(
            GENERATE_IMAGE,
            "Generate an image (a paid spend: the price comes from the provider's price table, \
             3 cents for the default model). Each call is charged once, however often it is \
             delivered; the result carries a public handle for `operation_status`.",
            rmcp::model::object(json!({
                "type": "object",
                "properties": crate::provider::mcp::image_request_properties(),
                "required": ["prompt"],
                "additionalProperties": false
            })),
        ),
        status,
        resume,
        Tool::new(
            CAPABILITIES,
            "What this router accepts: identity sources, limits, approval policy, retention. \
             Spends nothing.",
            rmcp::model::object(
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        ),
    ]
}

impl ServerHandler for RouterServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "callid-router",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Spend tools need a trusted per-call id in `_meta` from the harness (Codex \
                 `callId`, Claude Code `claudecode/toolUseId`, or the \
                 `hubu.dev/platform-invocation` envelope); never put identity in arguments.",
            )
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
        let name = request.name.to_string();
        let call = CallInfo {
            request_id: serde_json::to_value(&context.id).ok(),
            initialize: context
                .peer
                .peer_info()
                .and_then(|info| serde_json::to_value(&*info).ok()),
        };
        match self
            .router
            .call_tool(&call, &name, request.arguments, &meta)
            .await
        {
            Some(value) => serde_json::from_value::<CallToolResult>(value)
                .map(CallToolResponse::from)
                .map_err(|e| {
                    McpError::internal_error(format!("cannot encode a result: {e}"), None)
                }),
            None => {
                let mut message = Value::String(format!(
                    "unknown tool `{name}`; this router has {GENERATE_IMAGE}, {OPERATION_STATUS}, \
                     {RESUME_OPERATION} and {CAPABILITIES}"
                ));
                self.router.scrub(&mut message);
                Err(McpError::invalid_params(
                    message.as_str().unwrap_or_default().to_string(),
                    None,
                ))
            }
        }
    }
}

/// Serves MCP over stdin/stdout until the client closes it and every call read is answered.
pub async fn serve_stdio(router: Arc<Router>) -> anyhow::Result<()> {
    crate::serve::stdio(
        RouterServer::new(router),
        rmcp::transport::stdio(),
        "router",
    )
    .await?;
    Ok(())
}

/// Serves streamable HTTP at `http://ADDR/mcp` on `bound` until Ctrl-C; prints the address on
/// stderr. Every request passes the bound address's [`crate::http_guard::Guard`] first.
pub async fn serve_http(
    router: Arc<Router>,
    bound: crate::http_guard::Bound,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    crate::serve::http(RouterServer::new(router), bound, "router", |app| app)
        .await
        .context("serving streamable HTTP")
}
