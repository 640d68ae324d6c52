//! The agent's side of the gateway: an rmcp `ServerHandler` over stdio (or streamable HTTP).
//!
//! `tools/list` answers the upstream's tools unchanged plus `operation_status` and
//! `resume_operation`. A `tools/call` of a spend tool or of those two goes to [`Gateway`];
//! every other tool call, and `resources/*`, `prompts/*` and `completion/complete`, is passed to
//! the upstream as it came (with its `_meta`) and its answer returned as it came; so are
//! `logging/setLevel` and `resources/(un)subscribe`. What the upstream sends on its own comes
//! back through [`super::relay`].

use super::spend::Gateway;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest,
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressToken,
    ReadResourceRequestParams, ReadResourceResponse, ServerConfig, ServerResult,
    SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceError, ServiceExt};
use std::sync::Arc;

/// The gateway as an MCP server; cheap to clone (clones share the tool list).
#[derive(Clone, Debug)]
pub struct GatewayServer {
    gateway: Arc<Gateway>,
    info: ServerConfig,
    /// The merged tool list, listed again after the upstream's `tools/list_changed`.
    tools: Arc<tokio::sync::RwLock<Vec<rmcp::model::Tool>>>,
}

impl GatewayServer {
    /// Serves `gateway`, advertising `info` (see [`super::Upstream::info`]).
    pub fn new(gateway: Arc<Gateway>, info: ServerConfig) -> Self {
        let tools = Arc::new(tokio::sync::RwLock::new(gateway.tools().to_vec()));
        GatewayServer {
            gateway,
            info,
            tools,
        }
    }

    /// Passes a call of a tool that does not spend to the upstream as it came: the upstream's
    /// progress goes back under the agent's token, and the agent's cancellation goes up.
    async fn forward_call(
        &self,
        request: CallToolRequestParams,
        agent_token: Option<ProgressToken>,
        agent: rmcp::Peer<RoleServer>,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<CallToolResponse, McpError> {
        let peer = self.upstream_peer().await?;
        let (sink, progress) = super::relay::progress_queue();
        let mut call = CallToolRequest::new(request);
        if agent_token.is_some() {
            call.extensions.insert(sink);
        }
        let mut handle = peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(call),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(forwarded)?;
        let answer = match &agent_token {
            Some(token) => {
                super::relay::with_progress(progress, &agent, token, &mut handle.rx, cancelled)
                    .await
            }
            None => tokio::select! {
                answer = &mut handle.rx => Some(answer),
                _ = cancelled => None,
            },
        };
        let Some(answer) = answer else {
            let _ = handle
                .cancel(Some("the agent cancelled the request".into()))
                .await;
            return Err(McpError::internal_error(
                "the agent cancelled the request",
                None,
            ));
        };
        let result = answer
            .map_err(|_| forwarded(ServiceError::TransportClosed))?
            .map_err(forwarded)?;
        match result {
            ServerResult::CallToolResult(r) => Ok(CallToolResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            ServerResult::CreateTaskResult(r) => Ok(CallToolResponse::Task(r)),
            other => serde_json::to_value(&other)
                .ok()
                .and_then(|v| serde_json::from_value::<CallToolResult>(v).ok())
                .map(CallToolResponse::Complete)
                .ok_or_else(|| {
                    McpError::internal_error(
                        "the upstream answered tools/call with something else than a tool result",
                        None,
                    )
                }),
        }
    }

    /// The upstream's peer to forward a request to, or the error the agent gets when the
    /// upstream cannot be reached.
    async fn upstream_peer(&self) -> Result<rmcp::Peer<rmcp::RoleClient>, McpError> {
        self.gateway
            .upstream()
            .peer()
            .await
            .map_err(unreachable_upstream)
    }
}

/// The agent's error for a request passed through that failed; the URLs it quotes redacted.
fn forwarded(e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(e) => super::upstream::shown_error(e),
        other => McpError::internal_error(
            super::upstream::shown(&format!("the upstream did not answer: {other}")),
            None,
        ),
    }
}

fn unreachable_upstream(e: super::upstream::UpstreamError) -> McpError {
    McpError::internal_error(super::upstream::shown(&e.to_string()), None)
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let relay = self.gateway.upstream().relay();
        if relay.take_tools_stale() {
            match self.gateway.relist_tools().await {
                Ok(tools) => *self.tools.write().await = tools,
                Err(e) => {
                    // Listed again at the next request, and refused until the upstream is fixed.
                    relay.mark_tools_stale();
                    crate::logging::line(format_args!("callid gateway: {e}"));
                    return Err(McpError::internal_error(e.to_string(), None));
                }
            }
        }
        Ok(ListToolsResult::with_all_items(
            self.tools.read().await.clone(),
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        // Known before its first request, not at `notifications/initialized`: rmcp handles that
        // notification and the agent's next request concurrently, so the upstream's log line for
        // that request could come before the agent is known, and be lost.
        context.peer.set_peer_info(request.clone());
        self.gateway.upstream().relay().add_agent(context.peer);
        self.negotiate_initialize(&request)
    }

    // Logging is deprecated from MCP 2026-07-28 on; relayed for the clients of older versions.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer().await?;
        peer.set_level(request).await.map_err(forwarded)
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer().await?;
        peer.subscribe(request).await.map_err(forwarded)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer().await?;
        peer.unsubscribe(request).await.map_err(forwarded)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let meta = context.meta.0.0;
        let name = request.name.to_string();
        let arguments = request.arguments.take();
        match self
            .gateway
            .call_tool(&name, arguments.clone(), &meta)
            .await
        {
            Some(value) => serde_json::from_value::<CallToolResult>(value)
                .map(CallToolResponse::from)
                .map_err(|e| {
                    McpError::internal_error(format!("cannot encode a result: {e}"), None)
                }),
            None => {
                let agent_token =
                    rmcp::model::RequestMetaObject::from(meta.clone()).get_progress_token();
                request.arguments = arguments;
                request.meta = Some(rmcp::model::RequestMetaObject::from(meta));
                self.forward_call(
                    request,
                    agent_token,
                    context.peer,
                    context.ct.cancelled_owned(),
                )
                .await
            }
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let peer = self.upstream_peer().await?;
        peer.list_resources(request).await.map_err(forwarded)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let peer = self.upstream_peer().await?;
        peer.list_resource_templates(request)
            .await
            .map_err(forwarded)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let peer = self.upstream_peer().await?;
        peer.read_resource_once(request).await.map_err(forwarded)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let peer = self.upstream_peer().await?;
        peer.list_prompts(request).await.map_err(forwarded)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let peer = self.upstream_peer().await?;
        peer.get_prompt_once(request).await.map_err(forwarded)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let peer = self.upstream_peer().await?;
        peer.complete(request).await.map_err(forwarded)
    }
}

/// Serves MCP over stdin/stdout until the client closes it.
pub async fn serve_stdio(server: GatewayServer) -> anyhow::Result<()> {
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("starting the gateway on stdio: {e}"))?;
    service
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("serving the gateway on stdio: {e}"))?;
    Ok(())
}

/// Serves streamable HTTP at `http://ADDR/mcp` on `bound` until Ctrl-C; prints the address on
/// stderr. Every request passes the bound address's [`crate::http_guard::Guard`] first.
pub async fn serve_http(
    server: GatewayServer,
    bound: crate::http_guard::Bound,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    crate::http_guard::serve_mcp(server, bound, "gateway")
        .await
        .context("serving streamable HTTP")
}
