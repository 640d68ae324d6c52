//! [`Upstream`]: the gateway's MCP client connection to the paid server behind it.
//!
//! The upstream is a child process spoken to over stdio (`-- CMD ARGS...`) or a streamable HTTP
//! endpoint (`--upstream-url`). The connection is opened at start-up; when it breaks (the child
//! died, the HTTP session dropped) the next request opens a new one, so a redelivery after an
//! upstream crash reaches a fresh upstream. A child is spoken to through
//! [`super::child::ChildTransport`], whose too-long answer fails its request at once as
//! [`UpstreamError::TooLarge`] (the upstream ran it), not at the timeout.
//!
//! An `--upstream-url` is a [`crate::secret::SecretUrl`] from the command line on: shown
//! redacted, and every error text of the HTTP client or rmcp (which quote the URL) is redacted
//! ([`shown`]) before it goes into an [`UpstreamError`].

use super::relay::{Ordered, Relay};
use rmcp::model::{CallToolRequestParams, CallToolResponse, ServerCapabilities, ServerConfig};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceError, ServiceExt};
use std::sync::Arc;
use std::time::Duration;

/// The `_meta` key of the `initialize` answer that names the gateway in front of the upstream
/// (`{"name": "callid-gateway", "version": ...}`); the upstream's own `serverInfo` is kept.
pub const GATEWAY_META: &str = "callid/gateway";

/// Where the upstream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamSpec {
    /// A command started as a child process, spoken to over its stdin/stdout.
    Command(Vec<String>),
    /// A streamable HTTP endpoint (its secrets redacted wherever it is shown).
    Url(crate::secret::SecretUrl),
}

impl std::fmt::Display for UpstreamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamSpec::Command(argv) => write!(f, "`{}`", argv.join(" ")),
            UpstreamSpec::Url(url) => write!(f, "`{url}`"),
        }
    }
}

/// Why the upstream could not be reached or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The connection could not be opened: nothing was sent.
    #[error("cannot {} the upstream MCP server {spec}: {detail}", opening(spec))]
    Connect {
        /// The upstream.
        spec: String,
        /// What failed.
        detail: String,
    },
    /// The connection broke while a request was in flight, or the upstream did not answer in
    /// time: it may have acted on the request.
    #[error("the upstream MCP server {spec} did not answer: {detail}")]
    NoAnswer {
        /// The upstream.
        spec: String,
        /// What happened.
        detail: String,
    },
    /// The request could not be sent: the connection was refused or the pipe to the upstream
    /// was already broken, so nothing reached it ([`never_sent`]).
    #[error("the request could not be sent to the upstream MCP server {spec}: {detail}")]
    NotSent {
        /// The upstream.
        spec: String,
        /// What failed.
        detail: String,
    },
    /// The upstream answered with a JSON-RPC error.
    #[error("the upstream MCP server answered with an error: {0}")]
    Refused(rmcp::ErrorData),
    /// The upstream answered, but with a message longer than the gateway reads: it ran the
    /// request (and may have charged for it), and its answer is lost.
    #[error(
        "the upstream MCP server {spec} answered with a message of {bytes} bytes, longer than \
         the {limit} bytes the gateway reads in one message (`--upstream-max-message-bytes`), \
         and the answer was dropped"
    )]
    TooLarge {
        /// The upstream.
        spec: String,
        /// The answer's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

/// Why `e` proves that a request never reached the upstream, in words for a person: sending it
/// failed because the connection was refused (the HTTP client could not connect) or the pipe to
/// the upstream child was already broken. `None` for any other failure: a send error after the
/// connection was made (an HTTP 500, a stream cut mid-answer) may follow the upstream acting on
/// the request.
pub(super) fn never_sent(e: &ServiceError) -> Option<&'static str> {
    const REFUSED: &str = "connection refused (nothing listens on that port now)";
    let ServiceError::TransportSend(sent) = e else {
        return None;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(sent.error.as_ref());
    while let Some(c) = cause {
        // rmcp's HTTP transport error wraps the client's without naming it as its source.
        use rmcp::transport::streamable_http_client::StreamableHttpError;
        let http = match c.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(e)) => Some(e),
            _ => c.downcast_ref::<reqwest::Error>(),
        };
        if http.is_some_and(reqwest::Error::is_connect) {
            return Some(REFUSED);
        }
        match c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
            Some(std::io::ErrorKind::ConnectionRefused) => return Some(REFUSED),
            Some(std::io::ErrorKind::BrokenPipe) => {
                return Some("the upstream process no longer reads its input (it exited)");
            }
            _ => {}
        }
        cause = c.source();
    }
    None
}

/// An error text of the HTTP client or of rmcp as an agent or a log may see it: the URLs it
/// quotes redacted ([`crate::secret::redact_urls`]).
pub(super) fn shown(detail: &str) -> String {
    crate::secret::redact_urls(detail).into_owned()
}

/// A JSON-RPC error of the upstream (or one rmcp made of an HTTP failure) with its message
/// [`shown`].
pub(super) fn shown_error(mut e: rmcp::ErrorData) -> rmcp::ErrorData {
    if let std::borrow::Cow::Owned(redacted) = crate::secret::redact_urls(&e.message) {
        e.message = redacted.into();
    }
    e
}

type Service = RunningService<RoleClient, Relay>;

tokio::task_local! {
    /// The upstream connection of the agent connection whose request this task serves
    /// ([`Upstream::within`]).
    static SESSION: Arc<Upstream>;
}

/// A (re)connecting client of the upstream.
pub struct Upstream {
    spec: UpstreamSpec,
    timeout: Duration,
    max_message_bytes: usize,
    conn: tokio::sync::Mutex<Option<Arc<Service>>>,
    relay: Relay,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("spec", &self.spec)
            .finish()
    }
}

impl Upstream {
    /// Connects to the upstream now (a failure is returned, nothing is kept). A child's message
    /// longer than `max_message_bytes` is dropped and its request answered
    /// [`UpstreamError::TooLarge`] ([`super::child`]).
    pub async fn connect(
        spec: UpstreamSpec,
        timeout: Duration,
        max_message_bytes: usize,
    ) -> Result<Upstream, UpstreamError> {
        let up = Upstream {
            spec,
            timeout,
            max_message_bytes,
            conn: tokio::sync::Mutex::new(None),
            relay: Relay::default(),
        };
        up.service().await?;
        Ok(up)
    }

    /// The upstream connection of one agent connection: the same upstream, opened at its first
    /// request, whose notifications and requests go to `peer` only ([`Relay::for_agent`]).
    pub fn for_agent(
        &self,
        peer: rmcp::Peer<rmcp::RoleServer>,
        client: Option<rmcp::model::ClientConfig>,
    ) -> Upstream {
        Upstream {
            spec: self.spec.clone(),
            timeout: self.timeout,
            max_message_bytes: self.max_message_bytes,
            conn: tokio::sync::Mutex::new(None),
            relay: self.relay.for_agent(peer, client),
        }
    }

    /// Runs `work` with `session` as the connection that [`Upstream::call_tool`] and
    /// [`Upstream::list_tools`] use, whichever `Upstream` they are called on: a spend tool's
    /// call (made by the shared pipeline) then goes on the connection of the agent that made it.
    pub async fn within<F: std::future::Future>(session: Arc<Upstream>, work: F) -> F::Output {
        SESSION.scope(session, work).await
    }

    /// Closes the connection now (a child is stopped); the next request opens a new one.
    pub async fn disconnect(&self) {
        let service = self.conn.lock().await.take();
        if let Some(service) = service.and_then(Arc::into_inner) {
            let _ = service.cancel().await;
        }
    }

    async fn open(&self) -> Result<Service, UpstreamError> {
        let err = |detail: String| UpstreamError::Connect {
            spec: self.spec.to_string(),
            detail: shown(&detail),
        };
        match &self.spec {
            UpstreamSpec::Command(argv) => {
                let (program, args) = argv
                    .split_first()
                    .ok_or_else(|| err("no command given after `--`".into()))?;
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                let transport = Ordered::new(
                    super::child::ChildTransport::spawn(command, self.max_message_bytes)
                        .map_err(|e| err(e.to_string()))?,
                );
                self.relay
                    .clone()
                    .serve(transport)
                    .await
                    .map_err(|e| err(e.to_string()))
            }
            UpstreamSpec::Url(url) => {
                let client =
                    super::keyed_http::KeyedClient::new().map_err(|e| err(e.to_string()))?;
                let transport = Ordered::new(
                    rmcp::transport::StreamableHttpClientTransport::with_client(
                        client,
                        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                            url.expose().as_str(),
                        ),
                    ),
                );
                self.relay
                    .clone()
                    .serve(transport)
                    .await
                    .map_err(|e| err(url_failure(&e)))
            }
        }
    }

    async fn service(&self) -> Result<Arc<Service>, UpstreamError> {
        let mut guard = self.conn.lock().await;
        // rmcp's `is_closed` stays false when the upstream ended the connection (EOF, a dead
        // child): the closed transport says so.
        if let Some(s) = guard
            .as_ref()
            .filter(|s| !s.is_closed() && !s.peer().is_transport_closed())
        {
            return Ok(s.clone());
        }
        let service = Arc::new(self.open().await?);
        tracing::info!(upstream = %self.spec, "upstream connected");
        *guard = Some(service.clone());
        Ok(service)
    }

    /// Forgets a connection that failed, so the next request opens a new one.
    async fn drop_connection(&self, failed: &Arc<Service>) {
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|s| Arc::ptr_eq(s, failed)) {
            *guard = None;
        }
    }

    /// Carries what the upstream sends on its own back to the agents.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// The peer to forward a request to.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        Ok(self.service().await?.peer().clone())
    }

    /// What the upstream said about itself at initialization: its `serverInfo` and
    /// `instructions` as it said them, and its `_meta` plus [`GATEWAY_META`] naming the gateway.
    /// Of its capabilities, only what the gateway relays is kept: tools (always), logging,
    /// resources, prompts, completions.
    pub async fn info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder().enable_tools().build();
        let Ok(service) = self.service().await else {
            return ServerConfig::new(caps);
        };
        let Some(peer) = service.peer().peer_info() else {
            return ServerConfig::new(caps);
        };
        caps.tools = peer.capabilities.tools.clone().or(caps.tools);
        caps.logging = peer.capabilities.logging.clone();
        caps.resources = peer.capabilities.resources.clone();
        caps.prompts = peer.capabilities.prompts.clone();
        caps.completions = peer.capabilities.completions.clone();
        let mut info = ServerConfig::new(caps);
        if let Some(server) = &peer.server_info {
            info = info.with_server_info(server.clone());
        }
        if let Some(text) = &peer.instructions {
            info = info.with_instructions(text.clone());
        }
        let mut meta = peer.meta.clone().unwrap_or_default();
        meta.0.insert(
            GATEWAY_META.into(),
            serde_json::json!({"name": "callid-gateway", "version": env!("CARGO_PKG_VERSION")}),
        );
        info.meta = Some(meta);
        info
    }

    /// The error for a JSON-RPC error answer: [`UpstreamError::TooLarge`] when it stands for an
    /// answer that was too long, else [`UpstreamError::Refused`].
    fn refused(&self, e: rmcp::ErrorData) -> UpstreamError {
        match super::child::Oversized::of(&e) {
            Some(over) => UpstreamError::TooLarge {
                spec: self.spec.to_string(),
                bytes: over.bytes,
                limit: over.limit,
            },
            None => UpstreamError::Refused(shown_error(e)),
        }
    }

    /// Sends one `tools/call` and waits for its answer (at most the configured timeout), on the
    /// task's agent connection's upstream connection if there is one ([`Upstream::within`]).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResponse, UpstreamError> {
        match SESSION.try_with(Arc::clone) {
            Ok(session) => session.call_tool_here(params).await,
            Err(_) => self.call_tool_here(params).await,
        }
    }

    async fn call_tool_here(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResponse, UpstreamError> {
        let service = self.service().await?;
        let answer =
            tokio::time::timeout(self.timeout, service.peer().call_tool_once(params)).await;
        let no_answer = |detail: String| UpstreamError::NoAnswer {
            spec: self.spec.to_string(),
            detail: shown(&detail),
        };
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(ServiceError::McpError(e))) => Err(self.refused(e)),
            Ok(Err(e)) if let Some(why) = never_sent(&e) => {
                self.drop_connection(&service).await;
                Err(UpstreamError::NotSent {
                    spec: self.spec.to_string(),
                    detail: why.to_owned(),
                })
            }
            Ok(Err(e)) => {
                self.drop_connection(&service).await;
                Err(no_answer(e.to_string()))
            }
            Err(_) => Err(no_answer(format!(
                "no answer within {} seconds",
                self.timeout.as_secs()
            ))),
        }
    }

    /// Every tool of the upstream (all pages), on the task's agent connection's upstream
    /// connection if there is one ([`Upstream::within`]).
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, UpstreamError> {
        match SESSION.try_with(Arc::clone) {
            Ok(session) => session.list_tools_here().await,
            Err(_) => self.list_tools_here().await,
        }
    }

    async fn list_tools_here(&self) -> Result<Vec<rmcp::model::Tool>, UpstreamError> {
        let service = self.service().await?;
        match tokio::time::timeout(self.timeout, service.peer().list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(ServiceError::McpError(e))) => Err(self.refused(e)),
            Ok(Err(e)) => {
                self.drop_connection(&service).await;
                Err(UpstreamError::NoAnswer {
                    spec: self.spec.to_string(),
                    detail: shown(&e.to_string()),
                })
            }
            Err(_) => Err(UpstreamError::NoAnswer {
                spec: self.spec.to_string(),
                detail: format!("no answer within {} seconds", self.timeout.as_secs()),
            }),
        }
    }
}

/// The verb of [`UpstreamError::Connect`] for an upstream as shown ([`UpstreamSpec`]'s
/// `Display`): a URL is connected to, a command is started.
fn opening(spec: &str) -> &'static str {
    if spec.starts_with("`http://") || spec.starts_with("`https://") {
        "connect to"
    } else {
        "start"
    }
}

/// Why an `--upstream-url` could not be connected to, in words and with the fix. rmcp's own text
/// names its transport's Rust types and the HTTP client's quotes the URL unredacted, so neither
/// is shown: the operating system's reason is, when the error chain holds one, else the causes
/// that quote no URL.
fn url_failure(e: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    use std::io::ErrorKind as K;
    const FIX: &str = "check that the upstream server is running and that `--upstream-url` is its \
                       MCP endpoint";
    let error = match e {
        E::TransportError { error, .. } => error,
        E::JsonRpcError(refusal) => {
            return format!(
                "it refused the MCP initialization: {}; {FIX}",
                refusal.message
            );
        }
        E::ConnectionClosed(_) => {
            return format!("the connection closed during the MCP initialization; {FIX}");
        }
        _ => return format!("its answer to the MCP initialization was not one; {FIX}"),
    };
    // The HTTP client's error is not the `source` of rmcp's, whose chain would end there.
    type HttpError = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;
    let mut next: Option<&(dyn std::error::Error + 'static)> =
        match error.error.downcast_ref::<HttpError>() {
            Some(HttpError::Client(client)) => Some(client),
            _ => Some(error.error.as_ref()),
        };
    let mut causes = Vec::new();
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                K::ConnectionRefused => "connection refused (nothing listens on that port); start \
                                         the upstream server, or point `--upstream-url` at the \
                                         address it listens on"
                    .into(),
                K::TimedOut => format!("the connection timed out; {FIX}"),
                _ => format!("{io}; {FIX}"),
            };
        }
        let text = cause.to_string();
        if !text.contains("://") {
            causes.push(text);
        }
        next = cause.source();
    }
    if causes.is_empty() {
        causes.push("the HTTP request failed".into());
    }
    format!("{}; {FIX}", causes.join(": "))
}
