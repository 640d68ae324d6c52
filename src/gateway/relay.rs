//! [`Relay`]: what the upstream sends on its own, carried back to the agent.
//!
//! The gateway's MCP client of the upstream runs with a [`Relay`] as its handler. It guarantees:
//! - **Progress** of a request passed through unchanged reaches the agent that sent it, under the
//!   agent's own `progressToken` (rmcp's client replaces the token on the way up, so the relay
//!   maps the upstream's token back; a request without an agent token gets no progress), and
//!   before the request's answer: [`Ordered`] relays it as it reads the upstream's stream, where
//!   rmcp would hand notifications to tasks that can run after the answer. Progress of a spend
//!   tool is not relayed: the upstream receives the same request on every continuation of an
//!   operation, without the agent's token.
//! - **Logging messages**, `resources/updated` and the `list_changed` notifications go to every
//!   agent connection that completed `initialize` and is still open (one over stdio; one per
//!   session over streamable HTTP).
//! - **`tools/list_changed`** marks the gateway's merged tool list stale: the next `tools/list`
//!   lists and checks the upstream's tools again (the start-up checks; a failing check is
//!   answered as an error naming the tool and field, never served).
//!
//! Requests the upstream sends to its client (sampling, roots, elicitation) are not relayed:
//! the gateway answers them itself with rmcp's defaults.

use rmcp::model::{
    JsonRpcMessage, JsonRpcNotification, ProgressNotificationParam, ProgressToken,
    ResourceUpdatedNotificationParam, ServerNotification,
};
use rmcp::service::{NotificationContext, Peer};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, RoleClient, RoleServer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How many progress notifications without a route yet are kept (oldest dropped first).
const EARLY_PROGRESS: usize = 64;

/// The upstream client's handler; cheap to clone (the clones share their state).
#[derive(Clone, Default)]
pub struct Relay {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    /// Agent connections that completed `initialize`.
    agents: Mutex<Vec<Peer<RoleServer>>>,
    /// Where the upstream's progress goes.
    progress: Mutex<Routes>,
    /// The upstream said its tool list changed since the gateway last listed it.
    tools_stale: AtomicBool,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Routes {
    /// Upstream progress token -> the agent and the agent's token.
    to: HashMap<ProgressToken, (Peer<RoleServer>, ProgressToken)>,
    /// Progress that arrived before its route (the token is known only once the request is
    /// sent): kept for the route, at most [`EARLY_PROGRESS`] notifications.
    early: Vec<ProgressNotificationParam>,
}

/// Routes the upstream's progress for one request to its agent while alive.
#[must_use = "progress is routed only while the route is alive"]
pub struct ProgressRoute {
    state: Arc<State>,
    upstream: ProgressToken,
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        lock(&self.state.progress).to.remove(&self.upstream);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Relay {
    /// Remembers an agent connection (on `notifications/initialized`).
    pub fn add_agent(&self, peer: Peer<RoleServer>) {
        let mut agents = lock(&self.state.agents);
        agents.retain(|p| !p.is_transport_closed());
        agents.push(peer);
    }

    /// The open agent connections.
    fn agents(&self) -> Vec<Peer<RoleServer>> {
        let mut agents = lock(&self.state.agents);
        agents.retain(|p| !p.is_transport_closed());
        agents.clone()
    }

    /// Sends the upstream's progress under `upstream` to `agent` as `agent_token` (and any that
    /// came before this call), until the returned route is dropped.
    pub async fn route_progress(
        &self,
        upstream: ProgressToken,
        agent: Peer<RoleServer>,
        agent_token: ProgressToken,
    ) -> ProgressRoute {
        let early: Vec<ProgressNotificationParam> = {
            let mut routes = lock(&self.state.progress);
            routes
                .to
                .insert(upstream.clone(), (agent.clone(), agent_token.clone()));
            let (mine, others) = routes
                .early
                .drain(..)
                .partition(|p| p.progress_token == upstream);
            routes.early = others;
            mine
        };
        for mut params in early {
            params.progress_token = agent_token.clone();
            if let Err(e) = agent.notify_progress(params).await {
                tracing::debug!(error = %e, "could not relay progress to the agent");
            }
        }
        ProgressRoute {
            state: self.state.clone(),
            upstream,
        }
    }

    /// Whether the upstream's tools changed since the last call (and clears the mark).
    pub fn take_tools_stale(&self) -> bool {
        self.state.tools_stale.swap(false, Ordering::AcqRel)
    }

    /// Marks the upstream's tools as changed (listed again at the next `tools/list`).
    pub fn mark_tools_stale(&self) {
        self.state.tools_stale.store(true, Ordering::Release);
    }

    async fn broadcast<F, Fut>(&self, what: &str, send: F)
    where
        F: Fn(Peer<RoleServer>) -> Fut,
        Fut: std::future::Future<Output = Result<(), rmcp::ServiceError>>,
    {
        for agent in self.agents() {
            if let Err(e) = send(agent).await {
                tracing::debug!(error = %e, "could not relay {what} to an agent");
            }
        }
    }
}

impl Relay {
    /// Sends one progress notification of the upstream to its agent now, or keeps it for the
    /// route that is about to be made.
    async fn progress(&self, params: ProgressNotificationParam) {
        let (agent, token) = {
            let mut routes = lock(&self.state.progress);
            match routes.to.get(&params.progress_token) {
                Some(route) => route.clone(),
                None => {
                    if routes.early.len() >= EARLY_PROGRESS {
                        routes.early.remove(0);
                    }
                    routes.early.push(params);
                    return;
                }
            }
        };
        let mut relayed = params;
        relayed.progress_token = token;
        if let Err(e) = agent.notify_progress(relayed).await {
            tracing::debug!(error = %e, "could not relay progress to the agent");
        }
    }
}

/// The upstream's transport, with its progress notifications relayed in stream order.
pub struct Ordered<T> {
    inner: T,
    relay: Relay,
}

impl<T> Ordered<T> {
    /// Wraps `inner`; progress read from it goes through `relay`.
    pub fn new(inner: T, relay: Relay) -> Self {
        Ordered { inner, relay }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            match message {
                JsonRpcMessage::Notification(JsonRpcNotification {
                    notification: ServerNotification::ProgressNotification(n),
                    ..
                }) => self.relay.progress(n.params).await,
                other => return Some(other),
            }
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl ClientHandler for Relay {
    // Logging is deprecated from MCP 2026-07-28 on; relayed for the clients of older versions.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.broadcast("a log message", |agent| {
            let params = params.clone();
            async move { agent.notify_logging_message(params).await }
        })
        .await;
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.broadcast("resources/updated", |agent| {
            let params = params.clone();
            async move { agent.notify_resource_updated(params).await }
        })
        .await;
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.broadcast("resources/list_changed", |agent| async move {
            agent.notify_resource_list_changed().await
        })
        .await;
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.broadcast("prompts/list_changed", |agent| async move {
            agent.notify_prompt_list_changed().await
        })
        .await;
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.state.tools_stale.store(true, Ordering::Release);
        self.broadcast("tools/list_changed", |agent| async move {
            agent.notify_tool_list_changed().await
        })
        .await;
    }
}
