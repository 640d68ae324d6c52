//! The metadata-shape probe: an MCP server (stdio or streamable HTTP) and a transparent stdio
//! proxy that record the shape of every request's `_meta`, never a value, never the arguments.
//!
//! Point any MCP client at `callid probe` (or put `callid probe --wrap --` in front of a real
//! server), make a tool call, and the log says what the client sent: which `_meta` keys, their
//! types, lengths and short digests, the client's name and version, and the identity verdict the
//! router would give. `callid classify` turns logs into one verdict per client.
//!
//! # Layout
//! - [`record`]: the log record ([`Record`], [`record_for_request`]) and its JSON-lines writer
//!   ([`ShapeLog`]); shared with the router's `--diagnose-meta` and the matrix tools.
//! - [`tap`]: raw client message in, record out, per connection; decides what the server sees.
//! - [`server`]: the rmcp server with the read-only `capabilities` tool.
//! - [`stdio`], [`http`], [`wrap`]: the three transports, each feeding raw messages to the tap.
//! - [`demo`]: `callid demo`, three scripted clients against real probe processes.
//! - [`error`]: the transports' error type, [`ProbeError`].
//!
//! # Design
//! Recording happens at the message level, before rmcp parses anything, so every message is
//! recorded the same way, including those rmcp would reject or never show a handler
//! (`server/discover`, notifications, malformed lines). See [`tap`] for the bounds and for what
//! the tap answers itself.

pub mod demo;
pub mod error;
pub mod http;
pub mod record;
pub mod server;
pub mod stdio;
pub mod tap;
pub mod wrap;

pub use error::ProbeError;
pub use record::{Record, RecordContext, ShapeLog, record_for_request, record_for_tool_call};
pub use server::ProbeServer;
pub use tap::{Mode, Tap};

use crate::shape::Digester;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// What `callid probe` was asked to do.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Serve streamable HTTP here instead of stdio (loopback only).
    pub http: Option<SocketAddr>,
    /// Browser origins to answer besides the probe's own (see [`crate::http_guard`]).
    pub allow_origins: Vec<String>,
    /// Append records here (standard error otherwise).
    pub log: Option<PathBuf>,
    /// Key digests with this salt.
    pub digest_salt: Option<String>,
    /// Wrap this server command instead of serving.
    pub wrap: Vec<String>,
    /// The identity sources verdicts are given by (the built-in table, or one extended by
    /// `--identity-sources`).
    pub identity_sources: Arc<crate::identity::IdentitySources>,
}

/// Runs the probe until its input ends (stdio, `--wrap`) or forever (HTTP). Returns the exit
/// code: the wrapped server's under `--wrap`, 0 otherwise.
pub async fn run(options: ProbeOptions) -> Result<i32, ProbeError> {
    let bound = match options.http {
        Some(addr) if options.wrap.is_empty() => Some(
            crate::http_guard::bind(
                crate::http_guard::Server::Probe,
                addr,
                &options.allow_origins,
            )
            .await?,
        ),
        _ => None,
    };
    let digester = Digester::new(options.digest_salt.as_deref());
    let log = Arc::new(match &options.log {
        Some(path) => ShapeLog::open(path)?,
        None => ShapeLog::stderr(),
    });
    let server =
        ProbeServer::new(digester.clone()).with_identity_sources(options.identity_sources.clone());
    if !options.wrap.is_empty() {
        let tap = Arc::new(
            Tap::new(digester, log, record::Transport::Wrap, Mode::Observe)
                .with_identity_sources(options.identity_sources.clone()),
        );
        return wrap::run_wrap(&options.wrap, tokio::io::stdin(), tokio::io::stdout(), tap).await;
    }
    if let Some(bound) = bound {
        let tap = Arc::new(
            Tap::new(digester, log, record::Transport::Http, Mode::Serve)
                .with_identity_sources(options.identity_sources.clone()),
        );
        crate::logging::line(format_args!(
            "callid probe: serving MCP over streamable HTTP at http://{}{}",
            bound.addr,
            http::MCP_PATH
        ));
        http::serve_http(bound, tap, server).await?;
        return Ok(0);
    }
    let tap = Arc::new(
        Tap::new(digester, log, record::Transport::Stdio, Mode::Serve)
            .with_identity_sources(options.identity_sources.clone()),
    );
    stdio::serve_stdio(tokio::io::stdin(), tokio::io::stdout(), tap, server).await?;
    Ok(0)
}
