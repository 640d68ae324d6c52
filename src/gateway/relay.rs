//! [`Relay`]: what the upstream sends on its own, carried back to the agents, without any agent
//! slowing down the upstream or another agent.
//!
//! The gateway's MCP client of the upstream runs with a [`Relay`] as its handler and, for each
//! connection it opens, an [`Ordered`] transport. They guarantee:
//! - **Progress** of a request passed through unchanged reaches the agent that sent it, under the
//!   agent's own `progressToken`, and before the request's answer. rmcp's client replaces the
//!   token on the way up, so the request carries a [`ProgressSink`] in its extensions (never sent
//!   upstream): when the connection's [`Ordered`] transport sends the request it maps the token
//!   rmcp wrote to that sink, and relays progress into it in stream order, so all of it is queued
//!   before the answer is read. The mapping belongs to that connection and that request: it ends
//!   with the request's answer, when the request's task drops its end (answered, cancelled, timed
//!   out), and with the connection. Progress under any other token is dropped, never kept for
//!   later: a spend tool's (the upstream receives the same request on every continuation of an
//!   operation, without the agent's token), one that comes after its answer, and one that a new
//!   connection's tokens, which start again, would otherwise give to an unrelated request.
//! - **Logging messages**, `resources/updated` and the `list_changed` notifications of an
//!   upstream connection go to its agent connection only, while it is open (one over stdio; one
//!   per session over streamable HTTP); the gateway's own connection (start-up checks) has none.
//! - **No agent delays the upstream or another agent.** The reader of the upstream's stream never
//!   waits for an agent: it puts what it relays into bounded queues, one per forwarded request
//!   (its progress, [`PROGRESS_QUEUE`]) and one per agent connection (logs and resource updates,
//!   [`AGENT_QUEUE`]), each emptied by that request's or that agent's own task. Answers never
//!   pass through these queues: each is written by its own request's task.
//! - **A full queue drops what does not fit**, for that request or that agent only: an agent
//!   that does not read its stream loses its own progress and log messages, nobody else's, and
//!   gets what comes after once it reads again. Why drop and not end the agent's notifications:
//!   what is dropped is advisory (progress, a log line, a resource that changed and can be read
//!   again), while ending would also cut the list changes that tell the agent what it may call.
//!   Those are never dropped: a list change is a flag per agent and list, sent once however often
//!   the list changed meanwhile.
//! - **`tools/list_changed`** marks the gateway's merged tool list stale: the next `tools/list`
//!   lists and checks the upstream's tools again (the start-up checks; a failing check is
//!   answered as an error naming the tool and field, never served).
//!
//! - **Requests the upstream makes of its client** (`sampling/createMessage`,
//!   `elicitation/create`, `roots/list`) go to the agent of the connection they came on, and its
//!   answer (or its JSON-RPC error) goes back as it came: every agent connection has its own
//!   upstream connection ([`Relay::for_agent`]), so the agent asked is the one whose request is
//!   in flight. When exactly one of its requests is in flight the request is sent on that
//!   request's stream (streamable HTTP). The upstream is told the agent's sampling, elicitation
//!   and roots capabilities and `clientInfo`. Where no agent can answer (the gateway's own
//!   connection, a closed agent, or one that did not announce the capability) the upstream gets
//!   a JSON-RPC error saying so, never an answer nobody gave.

// Logging is deprecated from MCP 2026-07-28 on; relayed for the clients of older versions.
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
#[allow(deprecated)]
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequest,
    CreateMessageRequestParams, CreateMessageResult, CustomRequest, CustomResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ErrorCode, GetExtensions, GetMeta, JsonRpcMessage,
    JsonRpcNotification, JsonRpcRequest, ListRootsRequest, ListRootsResult,
    ProgressNotificationParam, ProgressToken, RequestId, ResourceUpdatedNotificationParam,
    ServerNotification, ServerRequest,
};
use rmcp::service::{
    NotificationContext, OriginatingRequestId, Peer, PeerRequestOptions, RequestContext,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServiceError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{self, error::TrySendError};

/// Progress notifications of one forwarded request waiting for its agent.
pub const PROGRESS_QUEUE: usize = 64;
/// Log messages and resource updates waiting for one agent connection.
pub const AGENT_QUEUE: usize = 256;

/// The upstream client's handler; cheap to clone (the clones share their state).
#[derive(Clone, Default)]
pub struct Relay {
    state: Arc<State>,
    /// The upstream said its tool list changed since the gateway last listed it; shared by the
    /// relays of every connection to the upstream ([`Relay::for_agent`]).
    tools_stale: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    /// The agent connection this upstream connection serves, once answered `initialize`.
    agents: Mutex<Vec<Agent>>,
    /// What the agent said of itself at `initialize`; its sampling, elicitation and roots
    /// capabilities and its `clientInfo` are what the upstream is told.
    client: Option<ClientConfig>,
    /// The agent's requests passed through on this connection and not yet answered.
    in_flight: Mutex<Vec<RequestId>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

/// One agent connection, fed by its own task ([`deliver`]).
struct Agent {
    peer: Peer<RoleServer>,
    queue: mpsc::Sender<Notice>,
    changed: Arc<Changed>,
}

/// A notification of the upstream on its way to one agent.
#[allow(deprecated)] // logging: see the import
#[derive(Clone)]
enum Notice {
    Log(LoggingMessageNotificationParam),
    ResourceUpdated(ResourceUpdatedNotificationParam),
}

/// The lists whose change one agent has not been told yet (bits of [`List`]).
#[derive(Default)]
struct Changed {
    lists: AtomicU8,
    wake: tokio::sync::Notify,
}

/// A list the upstream can say changed.
#[derive(Clone, Copy)]
enum List {
    Tools = 1,
    Resources = 2,
    Prompts = 4,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Relay {
    /// The relay of one agent connection's own upstream connection: what that upstream
    /// connection sends goes to `peer` only, and it is announced to the upstream as the agent
    /// announced itself (`client`: its `initialize`, if it sent one). Its tool list changes
    /// mark the gateway's one merged list stale, as this relay's do.
    pub fn for_agent(&self, peer: Peer<RoleServer>, client: Option<ClientConfig>) -> Relay {
        let (queue, rx) = mpsc::channel(AGENT_QUEUE);
        let changed = Arc::new(Changed::default());
        tokio::spawn(deliver(peer.clone(), rx, changed.clone()));
        Relay {
            state: Arc::new(State {
                agents: Mutex::new(vec![Agent {
                    peer,
                    queue,
                    changed,
                }]),
                client,
                in_flight: Mutex::default(),
            }),
            tools_stale: self.tools_stale.clone(),
        }
    }

    /// Whether the upstream's tools changed since the last call (and clears the mark).
    pub fn take_tools_stale(&self) -> bool {
        self.tools_stale.swap(false, Ordering::AcqRel)
    }

    /// Marks the upstream's tools as changed (listed again at the next `tools/list`).
    pub fn mark_tools_stale(&self) {
        self.tools_stale.store(true, Ordering::Release);
    }

    /// Notes the agent's request `id` as passed through and in flight until the returned guard
    /// drops: a request the upstream makes meanwhile is sent to the agent on that request's
    /// stream when it is the only one in flight.
    pub fn in_flight(&self, id: RequestId) -> InFlight {
        lock(&self.state.in_flight).push(id.clone());
        InFlight {
            state: self.state.clone(),
            id,
        }
    }

    /// The agent that answers the upstream's requests on this connection, if it announced
    /// `capability`; else the error the upstream gets, saying why nobody can answer.
    fn answerer(
        &self,
        method: &str,
        capability: Option<Capability>,
    ) -> Result<Peer<RoleServer>, McpError> {
        let agent = lock(&self.state.agents)
            .iter()
            .find(|a| !a.peer.is_transport_closed())
            .map(|a| a.peer.clone());
        let Some(agent) = agent else {
            return Err(McpError::internal_error(
                format!(
                    "no agent is connected to answer `{method}`: the gateway relays the \
                     upstream's requests only to the agent whose session made them, and this \
                     upstream connection has none"
                ),
                None,
            ));
        };
        let Some(capability) = capability else {
            return Ok(agent);
        };
        let caps = self.state.client.as_ref().map(|c| &c.capabilities);
        if !caps.is_some_and(|c| capability.announced(c)) {
            return Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!(
                    "the agent behind the gateway did not announce the `{}` capability, so it \
                     cannot answer `{method}`",
                    capability.name()
                ),
                None,
            ));
        }
        Ok(agent)
    }

    /// Sends the upstream's `request` to the agent that can answer it and returns that agent's
    /// answer; the upstream's cancellation (`ct`) cancels it at the agent too.
    async fn ask(
        &self,
        mut request: ServerRequest,
        method: &str,
        capability: impl Into<Option<Capability>>,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<ClientResult, McpError> {
        let agent = self.answerer(method, capability.into())?;
        let originating = match lock(&self.state.in_flight).as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        };
        if let Some(id) = originating {
            request.extensions_mut().insert(OriginatingRequestId(id));
        }
        // Sent from a task of its own: rmcp marks a request sent from within a handler as
        // caused by the request being handled (the upstream's, unknown to the agent's session),
        // which would replace the agent's request named above.
        let sender = agent.clone();
        let mut handle = tokio::spawn(async move {
            sender
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await
        })
        .await
        .unwrap_or(Err(ServiceError::TransportClosed))
        .map_err(|e| agent_failed(method, e))?;
        tokio::select! {
            answer = &mut handle.rx => match answer {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(e)) => Err(agent_failed(method, e)),
                Err(_) => Err(agent_failed(method, ServiceError::TransportClosed)),
            },
            () = cancelled => {
                let _ = handle
                    .cancel(Some("the upstream cancelled its request".into()))
                    .await;
                Err(McpError::internal_error("the upstream cancelled its request", None))
            }
        }
    }

    /// Queues `notice` for every open agent; an agent whose queue is full does not get it.
    fn broadcast(&self, notice: Notice) {
        let mut agents = lock(&self.state.agents);
        agents.retain(|a| !a.peer.is_transport_closed());
        for agent in agents.iter() {
            if let Err(TrySendError::Full(_)) = agent.queue.try_send(notice.clone()) {
                tracing::debug!("an agent does not read its stream: a notification was dropped");
            }
        }
    }

    /// Tells every open agent that `list` changed.
    fn list_changed(&self, list: List) {
        let mut agents = lock(&self.state.agents);
        agents.retain(|a| !a.peer.is_transport_closed());
        for agent in agents.iter() {
            agent.changed.lists.fetch_or(list as u8, Ordering::AcqRel);
            agent.changed.wake.notify_one();
        }
    }
}

/// The error for an agent's answer of the wrong kind.
fn unexpected(method: &str) -> McpError {
    McpError::internal_error(
        format!("the agent answered `{method}` with something else than its result"),
        None,
    )
}

/// The agent's error answer passed back as it came; any other failure said in words.
fn agent_failed(method: &str, e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(e) => e,
        other => McpError::internal_error(
            format!("the agent did not answer `{method}` relayed by the gateway: {other}"),
            None,
        ),
    }
}

/// An agent's request passed through and in flight ([`Relay::in_flight`]), until dropped.
pub struct InFlight {
    state: Arc<State>,
    id: RequestId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.state.in_flight);
        if let Some(at) = in_flight.iter().position(|id| *id == self.id) {
            in_flight.swap_remove(at);
        }
    }
}

/// A client capability the upstream's requests need.
#[derive(Clone, Copy)]
enum Capability {
    Sampling,
    Elicitation,
    Roots,
}

impl Capability {
    fn name(self) -> &'static str {
        match self {
            Capability::Sampling => "sampling",
            Capability::Elicitation => "elicitation",
            Capability::Roots => "roots",
        }
    }

    #[allow(deprecated)] // sampling and roots: deprecated from MCP 2026-07-28 on, still relayed
    fn announced(self, caps: &ClientCapabilities) -> bool {
        match self {
            Capability::Sampling => caps.sampling.is_some(),
            Capability::Elicitation => caps.elicitation.is_some(),
            Capability::Roots => caps.roots.is_some(),
        }
    }
}

/// One agent's task: sends it what was queued for it, until its connection or its queue closes.
#[allow(deprecated)] // logging: see the import
async fn deliver(peer: Peer<RoleServer>, mut queue: mpsc::Receiver<Notice>, changed: Arc<Changed>) {
    loop {
        let notice = tokio::select! {
            biased;
            () = changed.wake.notified() => None,
            notice = queue.recv() => match notice {
                Some(notice) => Some(notice),
                None => return,
            },
        };
        let mut sent = match notice {
            Some(Notice::Log(params)) => peer.notify_logging_message(params).await,
            Some(Notice::ResourceUpdated(params)) => peer.notify_resource_updated(params).await,
            None => Ok(()),
        };
        let lists = changed.lists.swap(0, Ordering::AcqRel);
        for list in [List::Tools, List::Resources, List::Prompts] {
            if lists & list as u8 != 0 && sent.is_ok() {
                sent = match list {
                    List::Tools => peer.notify_tool_list_changed().await,
                    List::Resources => peer.notify_resource_list_changed().await,
                    List::Prompts => peer.notify_prompt_list_changed().await,
                };
            }
        }
        if let Err(e) = sent {
            tracing::debug!(error = %e, "could not relay a notification to an agent");
            if peer.is_transport_closed() {
                return;
            }
        }
    }
}

/// Where one forwarded request's progress goes: put in the request's extensions before it is
/// sent; the connection's [`Ordered`] transport takes it when it sends the request.
#[derive(Clone, Debug)]
pub struct ProgressSink(mpsc::Sender<ProgressNotificationParam>);

/// A request's [`ProgressSink`] and the end its own task reads ([`with_progress`]).
pub fn progress_queue() -> (ProgressSink, mpsc::Receiver<ProgressNotificationParam>) {
    let (tx, rx) = mpsc::channel(PROGRESS_QUEUE);
    (ProgressSink(tx), rx)
}

/// Waits for `answer` while sending the request's `progress` to `agent` under `agent_token`;
/// the progress queued before the answer is sent before the answer is returned. `None` when
/// `cancelled` resolves first. An agent that does not read its stream holds only this request
/// (its answer would wait on the same stream anyway).
pub async fn with_progress<T>(
    mut progress: mpsc::Receiver<ProgressNotificationParam>,
    agent: &Peer<RoleServer>,
    agent_token: &ProgressToken,
    answer: impl std::future::Future<Output = T>,
    cancelled: impl std::future::Future<Output = ()>,
) -> Option<T> {
    let relay = |mut params: ProgressNotificationParam| {
        params.progress_token = agent_token.clone();
        agent.notify_progress(params)
    };
    let mut answer = std::pin::pin!(answer);
    let mut cancelled = std::pin::pin!(cancelled);
    let mut out = None;
    loop {
        let params = match out {
            None => tokio::select! {
                biased;
                () = &mut cancelled => return None,
                Some(params) = progress.recv() => params,
                answered = &mut answer => {
                    out = Some(answered);
                    continue;
                }
            },
            Some(_) => match progress.try_recv() {
                Ok(params) => params,
                Err(_) => return out,
            },
        };
        tokio::select! {
            biased;
            () = &mut cancelled => return None,
            sent = relay(params) => if let Err(e) = sent {
                tracing::debug!(error = %e, "could not relay progress to the agent");
            },
        }
    }
}

/// One connection's transport to the upstream: relays each forwarded request's progress into its
/// [`ProgressSink`] in stream order, without waiting.
pub struct Ordered<T> {
    inner: T,
    /// This connection's requests in flight that want their progress: the token rmcp wrote ->
    /// the request and its sink.
    routes: HashMap<ProgressToken, (RequestId, ProgressSink)>,
}

impl<T> Ordered<T> {
    /// Wraps `inner`, one connection to the upstream.
    pub fn new(inner: T) -> Self {
        Ordered {
            inner,
            routes: HashMap::new(),
        }
    }

    /// Maps the token of a request that carries a [`ProgressSink`] to the sink.
    fn route(&mut self, item: &mut TxJsonRpcMessage<RoleClient>) {
        let JsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) = item else {
            return;
        };
        let Some(sink) = request.extensions_mut().remove::<ProgressSink>() else {
            return;
        };
        let Some(token) = request.get_meta().get_progress_token() else {
            return;
        };
        self.routes.retain(|_, (_, sink)| !sink.0.is_closed());
        self.routes.insert(token, (id.clone(), sink));
    }

    fn progress(&mut self, params: ProgressNotificationParam) {
        let Some((_, sink)) = self.routes.get(&params.progress_token) else {
            return;
        };
        match sink.0.try_send(params) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::debug!("an agent does not read its stream: progress was dropped");
            }
            Err(TrySendError::Closed(params)) => {
                self.routes.remove(&params.progress_token);
            }
        }
    }

    fn answered(&mut self, id: &RequestId) {
        self.routes.retain(|_, (request, _)| request != id);
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.route(&mut item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let Some(message) = self.inner.receive().await else {
                self.routes.clear();
                return None;
            };
            match message {
                JsonRpcMessage::Notification(JsonRpcNotification {
                    notification: ServerNotification::ProgressNotification(n),
                    ..
                }) => self.progress(n.params),
                JsonRpcMessage::Response(ref r) => {
                    self.answered(&r.id);
                    return Some(message);
                }
                JsonRpcMessage::Error(ref e) => {
                    if let Some(id) = &e.id {
                        self.answered(id);
                    }
                    return Some(message);
                }
                other => return Some(other),
            }
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.routes.clear();
        self.inner.close()
    }
}

impl ClientHandler for Relay {
    /// The agent's sampling, elicitation and roots capabilities and its `clientInfo`; nothing
    /// for the gateway's own connection (no agent answers its requests).
    #[allow(deprecated)] // sampling and roots: see `Capability::announced`
    fn get_info(&self) -> ClientConfig {
        let Some(agent) = &self.state.client else {
            return ClientConfig::default();
        };
        let mut caps = ClientCapabilities::default();
        caps.sampling = agent.capabilities.sampling.clone();
        caps.elicitation = agent.capabilities.elicitation.clone();
        caps.roots = agent.capabilities.roots.clone();
        ClientConfig::new(caps, agent.client_info.clone())
    }

    /// A request rmcp does not parse as one of its own (an SDK's newer or laxer form of
    /// `sampling/createMessage` or `elicitation/create`, or a method rmcp does not know) goes to
    /// the agent as it came, under the same capability rule; its answer comes back as it came.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, McpError> {
        let method = request.method.clone();
        let capability = match method.as_str() {
            "sampling/createMessage" => Some(Capability::Sampling),
            "elicitation/create" => Some(Capability::Elicitation),
            "roots/list" => Some(Capability::Roots),
            _ => None,
        };
        let request = ServerRequest::CustomRequest(request);
        let answer = self
            .ask(request, &method, capability, context.ct.cancelled_owned())
            .await?;
        serde_json::to_value(answer)
            .map(CustomResult)
            .map_err(|_| unexpected(&method))
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, McpError> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self
            .ask(
                request,
                "sampling/createMessage",
                Capability::Sampling,
                context.ct.cancelled_owned(),
            )
            .await?
        {
            ClientResult::CreateMessageResult(r) => Ok(*r),
            _ => Err(unexpected("sampling/createMessage")),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self
            .ask(
                request,
                "elicitation/create",
                Capability::Elicitation,
                context.ct.cancelled_owned(),
            )
            .await?
        {
            ClientResult::ElicitResult(r) => Ok(r),
            _ => Err(unexpected("elicitation/create")),
        }
    }

    #[allow(deprecated)]
    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        match self
            .ask(
                request,
                "roots/list",
                Capability::Roots,
                context.ct.cancelled_owned(),
            )
            .await?
        {
            ClientResult::ListRootsResult(r) => Ok(r),
            _ => Err(unexpected("roots/list")),
        }
    }

    // Logging is deprecated from MCP 2026-07-28 on; relayed for the clients of older versions.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.broadcast(Notice::Log(params));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.broadcast(Notice::ResourceUpdated(params));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(List::Resources);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(List::Prompts);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_stale.store(true, Ordering::Release);
        self.list_changed(List::Tools);
    }
}
