//! [`Upstream`]: the gateway's MCP client connection to the paid server behind it.
//!
//! The upstream is a child process spoken to over stdio (`-- CMD ARGS...`) or a streamable HTTP
//! endpoint (`--upstream-url`). The connection is opened at start-up; when it breaks (the child
//! died, the HTTP session dropped) the next request opens a new one, so a redelivery after an
//! upstream crash reaches a fresh upstream.

use super::relay::{Ordered, Relay};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceError, ServiceExt};
use std::sync::Arc;
use std::time::Duration;

/// Where the upstream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamSpec {
    /// A command started as a child process, spoken to over its stdin/stdout.
    Command(Vec<String>),
    /// A streamable HTTP endpoint.
    Url(String),
}

impl std::fmt::Display for UpstreamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamSpec::Command(argv) => write!(f, "`{}`", argv.join(" ")),
            UpstreamSpec::Url(url) => write!(f, "`{}`", crate::secret::redact_url(url)),
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
    /// The upstream answered with a JSON-RPC error.
    #[error("the upstream MCP server answered with an error: {0}")]
    Refused(rmcp::ErrorData),
}

type Service = RunningService<RoleClient, Relay>;

/// A (re)connecting client of the upstream.
pub struct Upstream {
    spec: UpstreamSpec,
    timeout: Duration,
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
    /// Connects to the upstream now (a failure is returned, nothing is kept).
    pub async fn connect(spec: UpstreamSpec, timeout: Duration) -> Result<Upstream, UpstreamError> {
        let up = Upstream {
            spec,
            timeout,
            conn: tokio::sync::Mutex::new(None),
            relay: Relay::default(),
        };
        up.service().await?;
        Ok(up)
    }

    async fn open(&self) -> Result<Service, UpstreamError> {
        let err = |detail: String| UpstreamError::Connect {
            spec: self.spec.to_string(),
            detail,
        };
        match &self.spec {
            UpstreamSpec::Command(argv) => {
                let (program, args) = argv
                    .split_first()
                    .ok_or_else(|| err("no command given after `--`".into()))?;
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                let transport = Ordered::new(
                    rmcp::transport::TokioChildProcess::new(command)
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
                            url.as_str(),
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

    /// What the upstream said about itself at initialization.
    /// Only what the gateway relays is kept: tools (always), logging, resources, prompts,
    /// completions.
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
        let name = peer
            .server_info
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_else(|| "upstream".into());
        let mut info = ServerConfig::new(caps).with_server_info(Implementation::new(
            format!("callid-gateway ({name})"),
            env!("CARGO_PKG_VERSION"),
        ));
        if let Some(text) = &peer.instructions {
            info = info.with_instructions(text.clone());
        }
        info
    }

    /// Sends one `tools/call` and waits for its answer (at most the configured timeout).
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResponse, UpstreamError> {
        let service = self.service().await?;
        let answer =
            tokio::time::timeout(self.timeout, service.peer().call_tool_once(params)).await;
        let no_answer = |detail: String| UpstreamError::NoAnswer {
            spec: self.spec.to_string(),
            detail,
        };
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(ServiceError::McpError(e))) => Err(UpstreamError::Refused(e)),
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

    /// Every tool of the upstream (all pages).
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, UpstreamError> {
        let service = self.service().await?;
        match tokio::time::timeout(self.timeout, service.peer().list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(ServiceError::McpError(e))) => Err(UpstreamError::Refused(e)),
            Ok(Err(e)) => {
                self.drop_connection(&service).await;
                Err(UpstreamError::NoAnswer {
                    spec: self.spec.to_string(),
                    detail: e.to_string(),
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
