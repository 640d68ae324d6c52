//! `callid gateway`: the reference router's pipeline in front of anyone's paid MCP server.
//!
//! The agent connects to the gateway (stdio, or streamable HTTP on loopback with `--http`); the
//! gateway starts the upstream MCP server as a
//! child process (`-- CMD ARGS...`) or connects to it over streamable HTTP (`--upstream-url`).
//! Tools named with `--spend` go through the same pipeline as the built-in router's
//! `generate_image` ([`crate::spend::pipeline`]): identity in the arguments refused, trusted
//! identity from `_meta` (fail closed), request hash, durable registry row committed before the
//! upstream sees anything, redelivery answered from the record (marked replayed), the same call
//! id with other arguments refused, every reply scrubbed. Every other request passes through
//! unchanged and needs no identity.
//!
//! # Layout
//! - [`spend`]: [`Gateway`], the upstream as the pipeline's spender, and the start-up checks.
//! - [`upstream`]: [`Upstream`], the (re)connecting MCP client of the upstream.
//! - [`child`]: the stdio transport to an upstream child, whose too-long answer is reported.
//! - [`relay`]: [`relay::Relay`], the upstream's progress, logs and list changes back to the agent
//!   of its connection, in bounded queues no agent can stall, and the upstream's requests
//!   (sampling, elicitation, roots) to that agent.
//! - [`keyed_http`]: the HTTP client that also sends a spend's key as `Idempotency-Key`.
//! - [`server`]: the agent-facing rmcp `ServerHandler`, with one upstream connection per agent
//!   connection and `--passthrough-timeout` on what it passes through.
//! - [`guard`]: [`guard::Guard`], the same protection embedded in a Rust MCP server.
//! - [`policy`]: `--policy FILE`: per-tool prices (fixed or from the arguments), approvals, budget.
//!
//! # What the upstream receives for a spend tool
//! The call's arguments as recorded, and `_meta` holding only `callid/idempotency-key`: a key
//! derived from the operation's private key ([`crate::keys::OperationKey::idempotency_key`]),
//! the same on every continuation of the operation and different for every operation; an HTTP
//! upstream also gets it as the `Idempotency-Key` header ([`keyed_http`]). Nothing else of the
//! agent's `_meta` is forwarded for a spend tool (not its identity, not its progress
//! token; rmcp's client adds its own `progressToken`), so every continuation sends the upstream
//! the same request. Other tools receive the agent's `_meta` as it came.
//!
//! # The contract, by kind of upstream
//! - **Not idempotent (the default; most real paid servers):** each spend is sent to the
//!   upstream **at most once**. When its outcome is unknown after it may have reached the
//!   upstream (timeout, upstream died, connection dropped, an unreadable answer, the gateway
//!   killed after its dispatch mark), the operation is `in_doubt`: no redelivery,
//!   `resume_operation`, restart or other replica sends it again, and the agent is told
//!   `outcome_in_doubt`. A person checks the upstream and runs `callid router resolve HANDLE
//!   --charged [--result FILE]` (redeliveries then answer that) or `--not-charged` (the next
//!   redelivery sends it once more). Budgets count it at its price until then.
//! - **Declared idempotent** (`--idempotent TOOL` or `idempotent: true` in the policy: the
//!   upstream answers a repeated `callid/idempotency-key` with its first result): an unknown
//!   outcome leaves the operation open (`outcome_unknown`) and a redelivery re-sends it under
//!   the same key.
//! - Either way, a dispatcher renews its lease while the upstream works, so no other gateway on
//!   the registry takes a live operation over, and every write it makes carries its lease
//!   generation (a fencing token): one that lost its lease can neither record over the new
//!   owner nor dispatch again. A paused dispatcher's late answer still settles an in-doubt
//!   operation it alone dispatched.
//!
//! # Guarantees
//! - No spend reaches the upstream before its registry row (and, at most once, its dispatch
//!   mark) is committed.
//! - A call id answers one operation: redelivery returns the recorded upstream result, with
//!   `_meta["callid/replayed"] = true` and `_meta["callid/handle"]`, without calling the upstream.
//! - Every answer about an operation (an upstream result, a refusal naming one, `operation_status`)
//!   names its public handle and status in `_meta["callid/handle"]` and `_meta["callid/status"]`.
//! - An upstream result with `isError: true` is the tool's answer: recorded and replayed.
//! - Each agent connection has its own upstream connection ([`server`]): one agent's log level,
//!   subscriptions, log lines and the upstream's requests never reach or change another's.
//! - The agent sees the upstream's `serverInfo` and `instructions` as the upstream said them;
//!   the gateway names itself in the `initialize` answer's `_meta["callid/gateway"]`.
//! - An upstream that could not be reached at all leaves the operation open: nothing was sent.
//! - `callid/*` keys in an upstream result's own `_meta` are dropped: those names are the
//!   gateway's.
//! - An upstream child's answer longer than `--upstream-max-message-bytes` fails its call at
//!   once, naming its size and the limit, as an outcome that may have been charged ([`child`]):
//!   in doubt, unless the tool is declared idempotent.
//! - No secret of an `--upstream-url` (user info, query values, fragment) reaches the agent or
//!   standard error: the URL is shown redacted, and so is every URL in the HTTP client's and
//!   rmcp's error texts ([`crate::secret::redact_urls`]).
//! - The gateway refuses to start (exit 2) on a registry it cannot use, before the upstream is
//!   started or connected to (see [`crate::router`]'s guarantees for what is refused).
//! - The gateway refuses to start when the upstream has a tool named `operation_status` or
//!   `resume_operation`, lacks a `--spend` tool, or a spend tool's input schema has an
//!   identity-like field (naming the tool and the field), by the same rule as the calls: the
//!   built-in names and every `--identity-sources` key.

mod child;
pub mod guard;
mod keyed_http;
pub(crate) mod policy;
mod relay;
mod server;
pub(crate) mod spend;
mod upstream;
pub mod vouch;

pub(crate) use child::{DEFAULT_MAX_MESSAGE_BYTES, MIN_MAX_MESSAGE_BYTES};
pub(crate) use spend::{Gateway, StartError};
pub(crate) use upstream::{Upstream, UpstreamSpec};

use crate::spend::pipeline::{Core, CoreOptions};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How the gateway runs.
#[derive(Debug, Clone)]
pub(crate) struct GatewayOptions {
    /// The registry: a SQLite file, or a PostgreSQL database shared by gateway replicas.
    pub registry: crate::spend::registry::RegistryLocation,
    /// The tools that spend (the policy's tools spend too).
    pub spend: BTreeSet<String>,
    /// Prices, approvals and budget.
    pub policy: policy::GatewayPolicy,
    /// The upstream server.
    pub upstream: UpstreamSpec,
    /// How long to wait for an upstream answer.
    pub upstream_timeout: Duration,
    /// How long to wait for the upstream's answer to a request passed through.
    pub passthrough_timeout: Duration,
    /// The longest message read from an upstream child (`--upstream-max-message-bytes`).
    pub upstream_max_message_bytes: usize,
    /// Prefix of private keys.
    pub key_prefix: String,
    /// Prefix of public handles.
    pub handle_prefix: String,
    /// The identity sources spend calls are identified by (`--identity-sources`).
    pub identity_sources: std::sync::Arc<crate::identity::IdentitySources>,
    /// How long a dispatch lease lasts unless renewed (`--lease-ttl`).
    pub lease_ttl: Duration,
    /// The keys envelopes must be signed with (`--trust-keys`).
    pub trust: Option<std::sync::Arc<crate::identity::trust::TrustKeys>>,
    /// The key the gateway signs its upstream calls with (`--vouch-key`).
    pub vouch: Option<std::sync::Arc<vouch::Vouch>>,
}

/// Checks the registry ([`crate::spend::check_registry`]; a new registry file is checked
/// without being created), connects to the upstream and checks its tools, and only then opens
/// the registry for serving, so a refused start leaves no registry and no upstream process
/// behind; then serves the agent on stdio until it goes away, or over streamable HTTP (`http`,
/// loopback only) until Ctrl-C. Over HTTP it binds before it starts anything.
pub(crate) async fn run(
    options: GatewayOptions,
    http: Option<std::net::SocketAddr>,
    allow_origins: &[String],
) -> anyhow::Result<()> {
    let bound = match http {
        Some(addr) => Some(
            crate::http_guard::bind(crate::http_guard::Server::Gateway, addr, allow_origins)
                .await?,
        ),
        None => None,
    };
    crate::spend::check_registry("gateway", &options.registry).await?;
    let upstream = Upstream::connect(
        options.upstream.clone(),
        options.upstream_timeout,
        options.upstream_max_message_bytes,
    )
    .await
    .map_err(StartError::from)?;
    let info = upstream.info().await;
    let core = || {
        Core::new(CoreOptions {
            registry: options.registry.clone(),
            preallocated_keys: None,
            key_prefix: options.key_prefix.clone(),
            handle_prefix: options.handle_prefix.clone(),
            identity_sources: options.identity_sources.clone(),
            lease_ttl: options.lease_ttl,
            trust: options.trust.clone(),
        })
    };
    let gateway = Gateway::start(
        core,
        upstream,
        options.spend.clone(),
        options.policy,
        &options.identity_sources,
        options.vouch.clone(),
    )
    .await?;
    crate::logging::line(format_args!(
        "callid gateway: {} in front of {} (spend tools: {})",
        options.registry,
        options.upstream,
        gateway.describe_spend_tools()
    ));
    // Every agent connection opens its own upstream connection: the start-up one is not kept.
    gateway.upstream().disconnect().await;
    let server = server::GatewayServer::new(Arc::new(gateway), info, options.passthrough_timeout);
    match bound {
        Some(bound) => server::serve_http(server, bound).await,
        None => server::serve_stdio(server).await,
    }
}
