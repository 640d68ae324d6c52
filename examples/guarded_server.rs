//! An rmcp MCP server with one paid tool guarded by [`callid::gateway::guard::Guard`]: the
//! protection of `callid gateway`, embedded, without a second process.
//!
//! ```sh
//! cargo run --example guarded_server -- REGISTRY LEDGER [TRUST_KEYS]
//! ```
//!
//! `generate_image` charges the provider's durable ledger under the guard's derived idempotency
//! key; a redelivered call (same `_meta` call id, same arguments) gets the recorded result,
//! marked `_meta["callid/replayed"] = true`, and charges nothing. `list_charges` is free and
//! unguarded.

use callid::gateway::guard::{Decision, Guard};
use callid::identity::trust::{HarnessIds, TrustKeys};
use callid::provider::{ImageRequest, Ledger};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use std::sync::Arc;

#[derive(Clone)]
struct Paid {
    guard: Arc<Guard>,
    ledger: Ledger,
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(v.as_object().expect("an object").clone())
}

impl Paid {
    /// The paid work itself: one charge per idempotency key.
    async fn charge(&self, key: String, args: Map<String, Value>) -> Value {
        let request: ImageRequest = match serde_json::from_value(Value::Object(args)) {
            Ok(r) => r,
            Err(e) => {
                return json!({"isError": true, "content": [{"type": "text", "text": e.to_string()}]});
            }
        };
        let ledger = self.ledger.clone();
        match tokio::task::spawn_blocking(move || ledger.charge(&key, &request)).await {
            Ok(Ok(outcome)) => json!({
                "content": [{"type": "text", "text": format!("charged {} cents", outcome.receipt.amount_cents)}],
                "structuredContent": outcome.receipt,
            }),
            Ok(Err(e)) => {
                json!({"isError": true, "content": [{"type": "text", "text": e.to_string()}],
                                 "structuredContent": {"error": e.code()}})
            }
            Err(e) => {
                json!({"isError": true, "content": [{"type": "text", "text": e.to_string()}]})
            }
        }
    }
}

impl ServerHandler for Paid {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "generate_image",
                "Generate an image (paid, charged once per call).",
                schema(
                    json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
                ),
            ),
            Tool::new(
                "list_charges",
                "The ledger's charges (free).",
                schema(json!({"type": "object", "properties": {}})),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let meta = context.meta.0.0;
        let args = request.arguments.unwrap_or_default();
        let value = match request.name.as_ref() {
            "generate_image" => match self.guard.begin("generate_image", &args, &meta).await {
                Decision::Run(ticket) => {
                    let result = self
                        .charge(ticket.idempotency_key().to_string(), args)
                        .await;
                    ticket.finish(result).await
                }
                Decision::Answer(reply) => reply,
            },
            "list_charges" => {
                let ledger = self.ledger.clone();
                let charges = tokio::task::spawn_blocking(move || ledger.charges())
                    .await
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                json!({"content": [{"type": "text", "text": format!("{} charges", charges.len())}],
                       "structuredContent": {"count": charges.len()}})
            }
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool `{other}`"),
                    None,
                ));
            }
        };
        serde_json::from_value::<CallToolResult>(value)
            .map(CallToolResponse::from)
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(registry), Some(ledger)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: guarded_server REGISTRY LEDGER [TRUST_KEYS]");
    };
    // With a trust file, only signed envelopes are accepted (a vouching gateway's, for one).
    let guard = match args.next() {
        Some(trust) => Guard::builder(registry)
            .trust_keys(TrustKeys::load(trust.as_ref(), HarnessIds::Refuse)?)
            .build(),
        None => Guard::open(registry),
    };
    let server = Paid {
        guard: Arc::new(guard),
        ledger: Ledger::open(ledger.as_ref())?,
    };
    server
        .serve(rmcp::transport::stdio())
        .await?
        .waiting()
        .await?;
    Ok(())
}
