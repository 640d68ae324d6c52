//! Serving an rmcp server, written once for every MCP server of callid (the router, the gateway,
//! the probe and the paid provider): [`stdio`] over a line transport, [`standard_io`] over the
//! process's own standard input and output ([`crate::pipes`]), [`http`] over streamable HTTP.
//!
//! # Guarantees
//! - **stdio: every request read is answered.** When the client closes its side (end of input,
//!   as `printf '...' | callid router` does right after writing its calls), serving goes on until
//!   every request read so far has been answered, however long its handler takes: a spend that
//!   was dispatched is never left without its answer because stdin closed. rmcp on its own waits
//!   5 seconds for running handlers and then drops their answers; [`stdio`] hides the end of input
//!   from rmcp until nothing is left to answer ([`Answering`]). Not waited for: a request the
//!   client cancelled (rmcp sends no answer to it) and `subscriptions/listen`, which stays open
//!   by design. A request the server sent the client and that the client had not answered gets
//!   a JSON-RPC error at once, since the client can no longer answer it.
//! - **HTTP: one policy.** Every request passes the bound address's [`crate::http_guard::Guard`]
//!   first (loopback, `Host`, `Origin`), every connection has `TCP_NODELAY`, sessions are rmcp's
//!   local session manager, the address is said once on standard error, and Ctrl-C ends serving.

use crate::http_guard::{Bound, nodelay};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorCode, ErrorData, JsonRpcMessage,
    RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::{IntoTransport, Transport};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Why serving on stdio failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP session could not begin (the client's first messages were not a handshake).
    #[error("starting the {who} on stdio: {detail}")]
    Start {
        /// The server (`router`, `gateway`, ...).
        who: &'static str,
        /// rmcp's reason.
        detail: String,
    },
    /// The serving task ended abnormally.
    #[error("serving the {who} on stdio: {detail}")]
    Serve {
        /// The server.
        who: &'static str,
        /// What ended it.
        detail: String,
    },
}

/// Serves `server` on `transport` (stdin/stdout, or any line transport) until the client closes
/// its side and every request read has been answered (see the module's guarantees). `who` names
/// the server in errors.
pub async fn stdio<S, T, E, A>(server: S, transport: T, who: &'static str) -> Result<(), ServeError>
where
    S: ServerHandler,
    T: IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let transport = Answering::new(transport.into_transport());
    let running = server
        .serve(transport)
        .await
        .map_err(|e| ServeError::Start {
            who,
            detail: e.to_string(),
        })?;
    running.waiting().await.map_err(|e| ServeError::Serve {
        who,
        detail: e.to_string(),
    })?;
    Ok(())
}

/// Serves `server` on the process's standard input and output with [`stdio`]'s guarantees;
/// pipes and sockets are read and written by the reactor ([`crate::pipes`]), not by tokio's
/// blocking thread pool, and left in blocking mode again when serving ends.
pub async fn standard_io<S>(server: S, who: &'static str) -> Result<(), ServeError>
where
    S: ServerHandler,
{
    let (input, output, restore) = crate::pipes::open();
    let served = stdio(server, (input, output), who).await;
    restore.restore();
    served
}

/// Serves `server` as streamable HTTP at `http://ADDR/mcp` on `bound` until Ctrl-C, after
/// saying `callid {who}: listening on http://ADDR/mcp` on standard error. `layer` adds the
/// caller's own middleware around the MCP route (the probe's tap); the guard is outermost.
pub async fn http<S>(
    server: S,
    bound: Bound,
    who: &str,
    layer: impl FnOnce(axum::Router) -> axum::Router,
) -> std::io::Result<()>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    use rmcp::transport::StreamableHttpService;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        bound.guard.rmcp_config(),
    );
    let app = bound
        .guard
        .protect(layer(axum::Router::new().nest_service(MCP_PATH, service)));
    crate::logging::line(format_args!(
        "callid {who}: listening on http://{}{MCP_PATH}",
        bound.addr
    ));
    axum::serve(nodelay(bound.listener), app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}

/// The path every HTTP server of callid serves MCP on.
pub const MCP_PATH: &str = "/mcp";

/// What is still owed on one connection.
#[derive(Default)]
struct Owed {
    /// Requests read from the client and not answered yet.
    answers: HashSet<RequestId>,
    /// Requests sent to the client that it has not answered.
    asked: HashSet<RequestId>,
}

/// A transport that reports the end of its input only once every request it read has been
/// answered; meanwhile it answers the server's own requests to the client with an error.
struct Answering<T> {
    inner: T,
    owed: Arc<Mutex<Owed>>,
    changed: Arc<Notify>,
    input_ended: bool,
}

impl<T> Answering<T> {
    fn new(inner: T) -> Self {
        Answering {
            inner,
            owed: Arc::default(),
            changed: Arc::default(),
            input_ended: false,
        }
    }

    fn owed(&self) -> std::sync::MutexGuard<'_, Owed> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes what `message`, just read from the client, asks for or answers.
    fn read(&self, message: &ClientJsonRpcMessage) {
        let mut owed = self.owed();
        match message {
            JsonRpcMessage::Request(r) => {
                if !matches!(r.request, ClientRequest::SubscriptionsListenRequest(_)) {
                    owed.answers.insert(r.id.clone());
                }
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(id) = &c.params.request_id
                {
                    owed.answers.remove(id);
                }
            }
            JsonRpcMessage::Response(r) => {
                owed.asked.remove(&r.id);
            }
            JsonRpcMessage::Error(e) => {
                if let Some(id) = &e.id {
                    owed.asked.remove(id);
                }
            }
        }
    }
}

impl<T> Transport<RoleServer> for Answering<T>
where
    T: Transport<RoleServer>,
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answers = match &item {
            JsonRpcMessage::Response(r) => Some(r.id.clone()),
            JsonRpcMessage::Error(e) => e.id.clone(),
            JsonRpcMessage::Request(r) => {
                self.owed().asked.insert(r.id.clone());
                self.changed.notify_one();
                None
            }
            JsonRpcMessage::Notification(_) => None,
        };
        let sent = self.inner.send(item);
        let (owed, changed) = (self.owed.clone(), self.changed.clone());
        async move {
            let result = sent.await;
            if let Some(id) = answers {
                // Written or not (stdout may be gone), nothing more can be done for it.
                owed.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .answers
                    .remove(&id);
                changed.notify_one();
            }
            result
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        if !self.input_ended {
            match self.inner.receive().await {
                Some(message) => {
                    self.read(&message);
                    return Some(message);
                }
                None => {
                    tracing::debug!("input ended; answering the requests still running");
                    self.input_ended = true;
                }
            }
        }
        loop {
            {
                let mut owed = self.owed();
                if let Some(id) = owed.asked.iter().next().cloned() {
                    owed.asked.remove(&id);
                    return Some(JsonRpcMessage::error(
                        ErrorData::new(
                            ErrorCode::INTERNAL_ERROR,
                            "the client closed its input and cannot answer",
                            None,
                        ),
                        Some(id),
                    ));
                }
                if owed.answers.is_empty() {
                    return None;
                }
            }
            self.changed.notified().await;
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ServerCapabilities, ServerConfig,
    };
    use rmcp::service::RequestContext;
    use serde_json::{Value, json};
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

    /// Tools that end only when cancelled (`until_cancelled`) or when the client answers a
    /// request of the server (`ask_roots`).
    #[derive(Clone)]
    struct Waiting;

    impl ServerHandler for Waiting {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, rmcp::ErrorData> {
            let text = match request.name.as_ref() {
                "until_cancelled" => {
                    context.ct.cancelled().await;
                    "cancelled".to_string()
                }
                // A request of the server to the client, as the gateway relays from its upstream
                // (deprecated after 2025-11-25, which this session speaks).
                #[allow(deprecated)]
                _ => match context.peer.list_roots().await {
                    Ok(_) => "roots".to_string(),
                    Err(e) => format!("no roots: {e}"),
                },
            };
            let result: CallToolResult =
                serde_json::from_value(json!({"content": [{"type": "text", "text": text}]}))
                    .unwrap();
            Ok(result.into())
        }
    }

    /// Writes `lines` to a [`Waiting`] server served by [`stdio`], closes the input, and returns
    /// what the server wrote once serving ended (it must end within 30 s).
    async fn serve_lines(lines: &[Value]) -> Vec<Value> {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server);
        let serving = tokio::spawn(stdio(Waiting, (server_in, server_out), "test server"));
        let (client_in, mut client_out) = tokio::io::split(client);
        for line in lines {
            client_out
                .write_all(format!("{line}\n").as_bytes())
                .await
                .unwrap();
        }
        client_out.shutdown().await.unwrap();
        drop(client_out);
        let mut written = Vec::new();
        let mut reader = BufReader::new(client_in).lines();
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = reader.next_line().await.unwrap() {
                written.push(serde_json::from_str(&line).unwrap());
            }
        })
        .await
        .expect("serving ends once nothing is owed");
        tokio::time::timeout(Duration::from_secs(30), serving)
            .await
            .expect("serving ends")
            .unwrap()
            .unwrap();
        written
    }

    fn handshake() -> Vec<Value> {
        vec![
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {"roots": {}},
                "clientInfo": {"name": "t", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ]
    }

    fn call(id: u64, tool: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {}}})
    }

    /// A call the client cancelled gets no answer from rmcp, so it is not waited for.
    #[tokio::test]
    async fn a_cancelled_call_is_not_waited_for() {
        let mut lines = handshake();
        lines.push(call(1, "until_cancelled"));
        lines.push(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 1, "reason": "the user gave up"}}),
        );
        let written = serve_lines(&lines).await;
        assert!(written.iter().all(|m| m["id"] != json!(1)), "{written:?}");
    }

    /// A call waiting for the client's answer to the server's own request gets an error for
    /// that request once the input has ended, and so ends and is answered.
    #[tokio::test]
    async fn a_request_to_a_client_that_closed_its_input_fails_and_its_call_is_answered() {
        let mut lines = handshake();
        lines.push(call(1, "ask_roots"));
        let written = serve_lines(&lines).await;
        assert!(
            written.iter().any(|m| m["method"] == "roots/list"),
            "{written:?}"
        );
        let answer = written
            .iter()
            .find(|m| m["id"] == json!(1))
            .expect("answered");
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with("no roots:") && text.contains("the client closed its input"),
            "{answer}"
        );
    }
}
