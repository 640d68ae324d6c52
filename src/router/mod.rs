//! The reference router: trusted identity, request hash, durable registry, private keys and
//! public handles, scrubbing and approvals, in front of the backend layers.
//!
//! `callid router` is an MCP server (stdio, or streamable HTTP with `--http`) with one spend tool,
//! `generate_image`, and three that spend nothing: `operation_status`, `resume_operation`,
//! `capabilities`. It implements every rule of the design article, in its order, for every spend
//! call (see [`spend`]): identity in the arguments refused, the trusted identity read from
//! `_meta` (fail closed), the request hashed, the durable [`registry`] consulted, the call
//! resolved (new, redelivery, or mismatch), then forwarded to the [`crate::backend`] layers with a
//! private operation key that never leaves the router ([`scrub`]).
//!
//! # Layout
//! - [`spend`]: [`Router`], the image spender behind the [`pipeline`].
//! - [`pipeline`]: the tool-agnostic spend pipeline, in the article's order.
//! - [`reply`]: the reply and tool error catalogue (codes, wire shapes, error mapping).
//! - [`registry`]: the registry (a SQLite file, or PostgreSQL shared by replicas), with its
//!   Durability, Concurrency, Compatibility and Retention contract.
//! - [`replay`]: recent completed replies, ready to send again on redelivery.
//! - [`scrub`]: removes private keys from every reply.
//! - [`policy`]: when a person must approve, and the budget.
//! - [`preallocated`]: the operator-filled key pool of preallocated mode.
//! - [`diagnose`]: `--diagnose-meta`, the shape of each call's `_meta`, never values.
//! - [`server`]: the rmcp `ServerHandler`, stdio and streamable HTTP.
//! - [`operator`]: `approve`, `deny`, `status`, `keys`.
//!
//! # Guarantees
//! - No spend is dispatched before its registry row is committed.
//! - `callid router` and `callid gateway` open their registry before they serve anything
//!   ([`check_registry`]) and refuse to start (exit 2, naming the registry, the problem and the
//!   fix, the file left as it was) when it cannot be used: a file that cannot be written (it, or
//!   its directory), is open to other users, or is not a registry of this callid (not SQLite,
//!   another application's, a newer schema), and a PostgreSQL database that cannot be reached
//!   (a registry must be reachable at start-up: a router that served while it was down could
//!   only refuse every spend). A registry that fails later makes every spend fail closed with
//!   `registry_unavailable` until it answers again.
//! - A call id answers one operation: redelivery returns the recorded result (marked
//!   `_meta["callid/replayed"] = true`) or continues the same operation under the same key, so a
//!   crash at any boundary never yields a second charge.
//! - No reply contains a private operation key.
//! - No reply or log line contains the provider's token or the password or query values of
//!   `--provider-url` ([`crate::secret`]).
//! - A log line that cannot be written is dropped and counted, never a lost reply
//!   ([`crate::logging`]).
//! - Over HTTP: loopback only, `Host` and `Origin` checked before any tool runs
//!   ([`crate::http_guard`]).
//! - After a dispatch, no error claims that nothing was dispatched: an answer that cannot be
//!   recorded is `outcome_unknown`, with the handle, settled by redelivering the same call.
//! - A corrupt backend state file is `backend_state_corrupt` (not retryable), naming the file.
//! - The budget is debited by what the provider actually charged; refusals release their
//!   reservation (see [`policy`]).
//! - Envelope identities are keyed by their `installation_id` too, and may not claim a built-in
//!   platform (see [`crate::identity`]).

pub(crate) mod diagnose;
pub(crate) mod operator;
pub(crate) mod pipeline;
pub(crate) mod policy;
pub(crate) mod preallocated;
pub(crate) mod registry;
pub(crate) mod replay;
pub(crate) mod reply;
pub(crate) mod scrub;
pub(crate) mod server;
pub(crate) mod spend;

pub use spend::{Router, RouterOptions};

use std::net::SocketAddr;
use std::sync::Arc;

/// Runs the router until its client goes away (stdio) or Ctrl-C (`http`). Over HTTP it binds
/// (loopback only, see [`crate::http_guard`]) before it opens anything, so a refused address or a
/// port in use leaves no registry behind. A registry that cannot be used stops it before it
/// serves ([`check_registry`]).
pub async fn run(
    options: RouterOptions,
    http: Option<SocketAddr>,
    allow_origins: &[String],
) -> anyhow::Result<()> {
    match http {
        Some(addr) => {
            let bound =
                crate::http_guard::bind(crate::http_guard::Server::Router, addr, allow_origins)
                    .await?;
            check_registry("router", &options.registry).await?;
            server::serve_http(Arc::new(Router::new(options)), bound).await
        }
        None => {
            check_registry("router", &options.registry).await?;
            server::serve_stdio(Arc::new(Router::new(options))).await
        }
    }
}

/// A registry that `callid router` or `callid gateway` cannot start on.
#[derive(Debug, thiserror::Error)]
#[error("callid {server} did not start: {cause}{}", fix(cause))]
pub(crate) struct RegistryRefused {
    /// `router` or `gateway`.
    server: &'static str,
    /// Why the registry cannot be used (its message names the registry; it is written into this
    /// message, not chained).
    cause: registry::RegistryError,
}

/// What to do about a registry that could not be opened, when its own message does not say.
fn fix(cause: &registry::RegistryError) -> &'static str {
    match cause {
        registry::RegistryError::Postgres { .. } => {
            "; the registry must answer when callid starts: start the database (or correct \
             `--registry`), then start callid again"
        }
        _ => "",
    }
}

/// Opens `location` as the registry would be opened to serve (creating and migrating it when it
/// is new), proves it can be written (see [`crate::store`]; on PostgreSQL the installation id is
/// written), and closes it again; the first thing `callid router` and `callid gateway` do, so a
/// registry that cannot be used stops them before anything is served or started.
pub(crate) async fn check_registry(
    server: &'static str,
    location: &registry::RegistryLocation,
) -> Result<(), RegistryRefused> {
    if let registry::RegistryLocation::File(path) = location
        && !path.exists()
    {
        // A new registry: checked without creating it, so a start refused later (an unknown
        // spend tool, say) leaves nothing behind.
        return crate::store::creatable(path, &registry::SPEC).map_err(|e| RegistryRefused {
            server,
            cause: e.into(),
        });
    }
    let location = location.clone();
    // Off the async threads: the PostgreSQL client runs a runtime of its own.
    let opened =
        tokio::task::spawn_blocking(move || registry::Registry::open(&location).map(drop)).await;
    match opened {
        Ok(result) => result.map_err(|cause| RegistryRefused { server, cause }),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}
