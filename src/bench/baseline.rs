//! The floor the probe and the router are measured against: a bare rmcp server over stdio with
//! the probe's tool and an echo tool, doing no work of its own.
//!
//! `callid bench --serve-baseline` (hidden) runs it as a real process, so the baseline pays the
//! same process, pipe and rmcp costs as the probe and the router, and nothing else:
//! - `capabilities` `{}` answers the top-level `_meta` keys it saw (what the probe's tool of the
//!   same name answers at the least), with no identity rules, no shapes and no log;
//! - `echo` answers its arguments back as `structuredContent`: the bare round trip a router's
//!   replayed result is compared to.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, object,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// The bare rmcp server.
#[derive(Debug, Clone, Default)]
pub struct BaselineServer;

impl ServerHandler for BaselineServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("callid-bench-baseline", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "capabilities",
                "The `_meta` keys this call carried.",
                object(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "echo",
                "Answers its arguments back.",
                object(json!({"type": "object"})),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            "capabilities" => {
                let keys: Vec<&String> = context.meta.keys().collect();
                CallToolResult::structured(json!({ "keys": keys }))
            }
            "echo" => {
                CallToolResult::structured(Value::Object(request.arguments.unwrap_or_default()))
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool `{other}`"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

/// Serves the baseline on stdin/stdout until the client closes stdin.
pub async fn serve_stdio() -> anyhow::Result<()> {
    let running = BaselineServer
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("failed to start the baseline server: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("the baseline server stopped: {e}"))?;
    Ok(())
}
