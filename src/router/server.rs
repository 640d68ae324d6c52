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
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
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
        let meta = &context.meta.0.0;
        let name = request.name.to_string();
        match self
            .router
            .call_tool(|| call_info(&context), &name, request.arguments, meta)
            .await
        {
            Some(result) => Ok(CallToolResponse::from(result)),
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

/// What the transport knows about a call for `--diagnose-meta`: its JSON-RPC id and the
/// connection's `initialize` params, each serialised only when a record is written.
fn call_info(context: &RequestContext<RoleServer>) -> CallInfo {
    #[cfg(test)]
    tests::CALL_INFOS.with(|n| n.set(n.get() + 1));
    CallInfo {
        request_id: serde_json::to_value(&context.id).ok(),
        initialize: context
            .peer
            .peer_info()
            .and_then(|info| serde_json::to_value(&*info).ok()),
    }
}

/// Serves MCP over stdin/stdout until the client closes it and every call read is answered.
pub async fn serve_stdio(router: Arc<Router>) -> anyhow::Result<()> {
    crate::serve::standard_io(RouterServer::new(router), "router").await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::RouterOptions;
    use rmcp::ServiceExt as _;
    use rmcp::model::CallToolRequestParams;
    use std::cell::Cell;

    thread_local! {
        /// How many [`call_info`]s this thread built.
        pub(super) static CALL_INFOS: Cell<usize> = const { Cell::new(0) };
    }

    /// A router with the built-in defaults, its registry in `dir`.
    fn router_in(dir: &std::path::Path, diagnose_meta: Option<std::path::PathBuf>) -> Router {
        Router::new(RouterOptions {
            registry: crate::spend::registry::RegistryLocation::File(dir.join("registry.sqlite3")),
            provider: None,
            policy: crate::router::policy::Policy::default(),
            preallocated_keys: None,
            key_prefix: crate::keys::DEFAULT_KEY_PREFIX.into(),
            handle_prefix: crate::keys::DEFAULT_HANDLE_PREFIX.into(),
            diagnose_meta,
            identity_sources: crate::identity::IdentitySources::built_in_shared(),
            lease_ttl: crate::spend::pipeline::LEASE_TTL,
            trust: None,
        })
    }

    /// Serves a router over an in-memory pipe, calls `capabilities` once from an rmcp client,
    /// and answers how many call infos were built for it (the runtime has one thread, so every
    /// task counts on this one).
    async fn call_infos_for_one_call(diagnose_meta: Option<std::path::PathBuf>) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let router = Arc::new(router_in(dir.path(), diagnose_meta));
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let running = RouterServer::new(router).serve(server_io).await.unwrap();
            running.waiting().await.unwrap();
        });
        let client = ().serve(client_io).await.unwrap();
        let before = CALL_INFOS.with(Cell::get);
        let result = client
            .call_tool(CallToolRequestParams::new(CAPABILITIES))
            .await
            .unwrap();
        assert_ne!(result.is_error, Some(true), "{result:?}");
        let built = CALL_INFOS.with(Cell::get) - before;
        client.cancel().await.unwrap();
        server.await.unwrap();
        built
    }

    /// A call's future stays small: rmcp spawns one task per request holding it, and tokio
    /// copies a task's future when it spawns it and again when it ends. The spend's own steps are
    /// boxed (`Core::spend`); held inline they made it 10 KB, about 100,000 instructions of
    /// copying per new operation.
    #[tokio::test(flavor = "current_thread")]
    async fn a_calls_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let router = router_in(dir.path(), None);
        let meta = serde_json::Map::new();
        let call = router.call_tool(|| unreachable!(), GENERATE_IMAGE, None, &meta);
        let size = std::mem::size_of_val(&call);
        assert!(size <= 4096, "Router::call_tool's future is {size} bytes");
    }

    /// `--diagnose-meta` off costs nothing: no call info is serialised for a call; on, one per
    /// call.
    #[tokio::test(flavor = "current_thread")]
    async fn diagnostics_off_build_nothing() {
        assert_eq!(call_infos_for_one_call(None).await, 0);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("meta.jsonl");
        assert_eq!(call_infos_for_one_call(Some(log.clone())).await, 1);
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    }
}
