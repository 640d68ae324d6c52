//! The agent's side of the gateway: an rmcp `ServerHandler` over stdio (or streamable HTTP).
//!
//! `tools/list` answers the upstream's tools unchanged plus `operation_status` and
//! `resume_operation`. A `tools/call` of a spend tool or of those two goes to [`Gateway`];
//! every other tool call, and `resources/*`, `prompts/*` and `completion/complete`, is passed to
//! the upstream as it came (with its `_meta`) and its answer returned as it came; so are
//! `logging/setLevel` and `resources/(un)subscribe`. What the upstream sends on its own comes
//! back through [`super::relay`].
//!
//! # Guarantees
//! - **One upstream connection per agent connection** (one over stdio; one per session over
//!   streamable HTTP), opened at the agent's first request that needs it and closed when the
//!   agent's connection ends: an agent's `logging/setLevel`, subscriptions, log messages,
//!   resource updates and the upstream's requests (sampling, elicitation, roots) stay in its own
//!   world. Spend tools are called on it too ([`super::Upstream::within`]).
//! - A request passed through that the upstream does not answer within `--passthrough-timeout`
//!   is answered with JSON-RPC error [`PASSTHROUGH_TIMEOUT_CODE`] naming the method and the
//!   flag; a `tools/call` is also cancelled at the upstream. Spend tools keep
//!   `--upstream-timeout` and its at-most-once rules.

use super::spend::Gateway;
use super::upstream::Upstream;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest,
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressToken,
    ReadResourceRequestParams, ReadResourceResponse, ServerConfig, ServerResult,
    SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The JSON-RPC error code of a request passed through that the upstream did not answer within
/// `--passthrough-timeout` (the request timeout code of the MCP SDKs).
pub const PASSTHROUGH_TIMEOUT_CODE: i32 = -32001;

/// The gateway as an MCP server for one agent connection. Clones share the gateway and the
/// tool list, but each clone is a new agent connection with its own upstream connection
/// (rmcp's streamable HTTP server clones the handler once per session).
#[derive(Debug)]
pub struct GatewayServer {
    gateway: Arc<Gateway>,
    info: ServerConfig,
    /// The merged tool list, listed again after the upstream's `tools/list_changed`.
    tools: Arc<tokio::sync::RwLock<Vec<rmcp::model::Tool>>>,
    passthrough_timeout: Duration,
    /// This agent connection's upstream connection ([`Upstream::for_agent`]).
    session: OnceLock<Arc<Upstream>>,
}

impl Clone for GatewayServer {
    fn clone(&self) -> Self {
        GatewayServer {
            gateway: self.gateway.clone(),
            info: self.info.clone(),
            tools: self.tools.clone(),
            passthrough_timeout: self.passthrough_timeout,
            session: OnceLock::new(),
        }
    }
}

impl GatewayServer {
    /// Serves `gateway`, advertising `info` (see [`super::Upstream::info`]); a request passed
    /// through waits `passthrough_timeout` at most.
    pub fn new(gateway: Arc<Gateway>, info: ServerConfig, passthrough_timeout: Duration) -> Self {
        let tools = Arc::new(tokio::sync::RwLock::new(gateway.tools().to_vec()));
        GatewayServer {
            gateway,
            info,
            tools,
            passthrough_timeout,
            session: OnceLock::new(),
        }
    }

    /// This agent connection's upstream connection, made (not yet opened) at the first call,
    /// announced to the upstream as the agent announced itself.
    fn session(&self, agent: &rmcp::Peer<RoleServer>) -> Arc<Upstream> {
        self.session
            .get_or_init(|| {
                let client = agent.peer_info().map(|info| (*info).clone());
                Arc::new(self.gateway.upstream().for_agent(agent.clone(), client))
            })
            .clone()
    }

    /// Waits for `answer` of the upstream to the request `method` passed through, at most
    /// `--passthrough-timeout`.
    async fn limited<T>(
        &self,
        method: &str,
        answer: impl std::future::Future<Output = Result<T, McpError>>,
    ) -> Result<T, McpError> {
        tokio::time::timeout(self.passthrough_timeout, answer)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(method)))
    }

    fn timed_out(&self, method: &str) -> McpError {
        McpError::new(
            rmcp::model::ErrorCode(PASSTHROUGH_TIMEOUT_CODE),
            format!(
                "the upstream did not answer `{method}` within {} seconds \
                 (`--passthrough-timeout`); raise `--passthrough-timeout` if it takes longer",
                self.passthrough_timeout.as_secs()
            ),
            None,
        )
    }

    /// Passes a call of a tool that does not spend to the upstream as it came: the upstream's
    /// progress goes back under the agent's token, and the agent's cancellation goes up.
    async fn forward_call(
        &self,
        request: CallToolRequestParams,
        agent_token: Option<ProgressToken>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let agent = context.peer;
        let session = self.session(&agent);
        let _in_flight = session.relay().in_flight(context.id);
        let peer = upstream_peer(&session).await?;
        let deadline = tokio::time::sleep(self.passthrough_timeout);
        let mut timed_out = false;
        let cancelled = async {
            tokio::select! {
                () = context.ct.cancelled() => {}
                () = deadline => timed_out = true,
            }
        };
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
            if timed_out {
                let _ = handle
                    .cancel(Some(
                        "no answer within the gateway's `--passthrough-timeout`".into(),
                    ))
                    .await;
                return Err(self.timed_out("tools/call"));
            }
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

    /// The upstream's peer of this agent connection to forward a request to, or the error the
    /// agent gets when the upstream cannot be reached.
    async fn upstream_peer(
        &self,
        agent: &rmcp::Peer<RoleServer>,
    ) -> Result<rmcp::Peer<rmcp::RoleClient>, McpError> {
        upstream_peer(&self.session(agent)).await
    }
}

async fn upstream_peer(session: &Upstream) -> Result<rmcp::Peer<rmcp::RoleClient>, McpError> {
    session.peer().await.map_err(unreachable_upstream)
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let relay = self.gateway.upstream().relay();
        if relay.take_tools_stale() {
            let session = self.session(&context.peer);
            match Upstream::within(session, self.gateway.relist_tools()).await {
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
        self.session(&context.peer);
        self.negotiate_initialize(&request)
    }

    /// Told to this agent's upstream connection (opened if need be).
    async fn on_roots_list_changed(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        if let Ok(peer) = self.session(&context.peer).peer().await
            && let Err(e) = peer.notify_roots_list_changed().await
        {
            tracing::debug!(error = %e, "could not relay roots/list_changed to the upstream");
        }
    }

    // Logging is deprecated from MCP 2026-07-28 on; relayed for the clients of older versions.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("logging/setLevel", async {
            peer.set_level(request).await.map_err(forwarded)
        })
        .await
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("resources/subscribe", async {
            peer.subscribe(request).await.map_err(forwarded)
        })
        .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("resources/unsubscribe", async {
            peer.unsubscribe(request).await.map_err(forwarded)
        })
        .await
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(tool) = self.gateway.own_tool(&request.name) else {
            // Passed through as it came: its arguments and `_meta` (moved back from the
            // context, where rmcp put it) untouched.
            let meta = std::mem::take(&mut context.meta);
            let agent_token = meta.get_progress_token();
            request.meta = Some(meta);
            return self.forward_call(request, agent_token, context).await;
        };
        let session = self.session(&context.peer);
        let result = Upstream::within(
            session,
            self.gateway
                .call_tool(tool, &request.name, request.arguments, &context.meta.0.0),
        )
        .await;
        Ok(CallToolResponse::from(result))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("resources/list", async {
            peer.list_resources(request).await.map_err(forwarded)
        })
        .await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("resources/templates/list", async {
            peer.list_resource_templates(request)
                .await
                .map_err(forwarded)
        })
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("resources/read", async {
            peer.read_resource_once(request).await.map_err(forwarded)
        })
        .await
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("prompts/list", async {
            peer.list_prompts(request).await.map_err(forwarded)
        })
        .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("prompts/get", async {
            peer.get_prompt_once(request).await.map_err(forwarded)
        })
        .await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let peer = self.upstream_peer(&context.peer).await?;
        self.limited("completion/complete", async {
            peer.complete(request).await.map_err(forwarded)
        })
        .await
    }
}

/// Serves MCP over stdin/stdout until the client closes it and every call read is answered.
pub async fn serve_stdio(server: GatewayServer) -> anyhow::Result<()> {
    crate::serve::standard_io(server, "gateway").await?;
    Ok(())
}

/// Serves streamable HTTP at `http://ADDR/mcp` on `bound` until Ctrl-C; prints the address on
/// stderr. Every request passes the bound address's [`crate::http_guard::Guard`] first.
pub async fn serve_http(
    server: GatewayServer,
    bound: crate::http_guard::Bound,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    crate::serve::http(server, bound, "gateway", |app| app)
        .await
        .context("serving streamable HTTP")
}
