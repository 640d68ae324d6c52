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
//! - [`read`]: the logs read back into records ([`read::read_logs`]), for `classify`, `demo` and
//!   the matrix tools.
//! - [`tap`]: raw client message in, record out, per connection; decides what the server sees
//!   ([`head`]: the members it decides on, parsed without the rest).
//! - [`frame`]: byte framing: whole, bounded messages out of a byte stream ([`frame::Skimmer`]
//!   finds the `id` of one too long to keep).
//! - [`writer`]: the bounded queue and thread that build and write records off the reply path.
//! - [`server`]: the rmcp server with the read-only `capabilities` tool.
//! - [`stdio`], [`http`], [`wrap`]: the three transports, each feeding raw messages to the tap;
//!   stdin and stdout are [`crate::pipes`], on the reactor when they are pipes.
//! - [`error`]: the transports' error type, [`ProbeError`].
//!
//! # Design
//! Recording happens at the message level, before rmcp parses anything, so every message is
//! recorded the same way, including those rmcp would reject or never show a handler
//! (notifications, malformed lines). See [`tap`] for the bounds and for what the tap answers
//! itself. On stdio the tap is rmcp's transport: it reads rmcp's typed message from the text,
//! decides on the few members it needs ([`head`]), and hands the text to the [`writer`] thread,
//! which parses it whole, builds the record and appends it; the reply never waits for the record.
//! Standard input and output are the reactor's own pipes ([`crate::pipes`]). The HTTP probe
//! writes what is queued before exiting on SIGINT or SIGTERM.

mod error;
mod frame;
mod head;
mod http;
pub(crate) mod read;
pub mod record;
pub(crate) mod server;
mod stdio;
pub(crate) mod tap;
mod wrap;
mod writer;

pub use error::ProbeError;
pub use frame::{Frame, LineFramer};
pub(crate) use record::record_for_request;
pub use record::{Record, ShapeLog};
pub(crate) use server::ProbeServer;
pub use tap::{Mode, Tap};

use crate::shape::Digester;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// What `callid probe` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct ProbeOptions {
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
    /// Speak only the `initialize` lifecycle: answer `server/discover` with `-32601`.
    pub legacy_handshake: bool,
}

/// The async runtime `callid probe` runs on.
///
/// The stdio probe serves one connection and its records are built on the writer's own thread
/// ([`writer`]): its reply path runs on one thread (tokio's current-thread runtime; rmcp's
/// handlers still run concurrently, as tasks on it). With a multi-thread runtime the reply path spread over both
/// cores of a 2-core machine and outran the single writer thread at 16 calls in flight
/// (measured over 6,000 calls: up to 4,096 records queued, the queue's bound, 3.7 MB of text);
/// on one thread it leaves the writer a core, the queue stays short, and
/// the process has two threads instead of four. The HTTP probe (many sessions) and `--wrap`
/// (two pumps and a child) keep the multi-thread runtime.
pub(crate) fn runtime(options: &ProbeOptions) -> std::io::Result<tokio::runtime::Runtime> {
    if options.http.is_none() && options.wrap.is_empty() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    }
}

/// Runs the probe until its input ends (stdio, `--wrap`) or forever (HTTP). Returns the exit
/// code: the wrapped server's under `--wrap`, 0 otherwise.
pub(crate) async fn run(options: ProbeOptions) -> Result<i32, ProbeError> {
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
    let server = ProbeServer::new(digester.clone())
        .with_identity_sources(options.identity_sources.clone())
        .legacy_handshake(options.legacy_handshake);
    if !options.wrap.is_empty() {
        let tap = Arc::new(
            Tap::new(digester, log, record::Transport::Wrap, Mode::Observe)
                .with_identity_sources(options.identity_sources.clone()),
        );
        let code = wrap::run_wrap(
            &options.wrap,
            tokio::io::stdin(),
            tokio::io::stdout(),
            tap.clone(),
        )
        .await;
        tap.finish();
        return code;
    }
    if let Some(bound) = bound {
        let tap = Arc::new(
            Tap::new(digester, log, record::Transport::Http, Mode::Serve)
                .with_identity_sources(options.identity_sources.clone())
                .legacy_handshake(options.legacy_handshake),
        );
        // Ended by SIGINT or SIGTERM: the records still queued are written before exiting.
        let served = tokio::select! {
            served = http::serve_http(bound, tap.clone(), server) => served,
            () = shutdown_signal() => Ok(()),
        };
        tap.finish();
        served?;
        return Ok(0);
    }
    let tap = Arc::new(
        Tap::new(digester, log, record::Transport::Stdio, Mode::Serve)
            .with_identity_sources(options.identity_sources.clone())
            .legacy_handshake(options.legacy_handshake),
    );
    let (input, output, restore) = crate::pipes::open();
    let served = stdio::serve_stdio(input, output, tap.clone(), server).await;
    restore.restore();
    tap.finish();
    served?;
    Ok(0)
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
