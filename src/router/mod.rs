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
//! - No spend is dispatched before its registry row is committed; a registry that cannot be
//!   opened or written makes every spend fail closed with `registry_unavailable`.
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
/// port in use leaves no registry behind.
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
            server::serve_http(Arc::new(Router::new(options)), bound).await
        }
        None => server::serve_stdio(Arc::new(Router::new(options))).await,
    }
}
