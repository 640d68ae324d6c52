//! The reference router: trusted identity, request hash, durable registry, private keys and
//! public handles, scrubbing and approvals, in front of the backend layers.
//!
//! `callid router` is an MCP server (stdio, or streamable HTTP with `--http`) with one spend tool,
//! `generate_image`, and three that spend nothing: `operation_status`, `resume_operation`,
//! `capabilities`. It implements every rule of the design article, in its order, for every spend
//! call (see [`crate::spend`]): identity in the arguments refused, the trusted identity read from
//! `_meta` (fail closed), the request hashed, the durable registry consulted, the call
//! resolved (new, redelivery, or mismatch), then forwarded to the [`crate::backend`] layers with a
//! private operation key that never leaves the router.
//!
//! # Layout
//! The router is one of the two users of the spend core ([`crate::spend`]); the other is
//! [`crate::gateway`].
//! - [`image`]: [`Router`], the image spender the core drives (the `generate_image` tool and the
//!   three that spend nothing).
//! - [`policy`]: when a person must approve an image, and the account's budget.
//! - [`reply`]: the router's error catalogue and its image result text.
//! - [`server`]: the rmcp `ServerHandler`, stdio and streamable HTTP.
//!
//! # Guarantees
//! The spend core's guarantees hold for every call ([`crate::spend`]); the router adds:
//! - No reply or log line contains the provider's token or the password or query values of
//!   `--provider-url` ([`crate::secret`]).
//! - The budget is debited by what the provider actually charged; refusals release their
//!   reservation (see [`policy`]).
//! - A corrupt backend state file is `backend_state_corrupt` (not retryable), naming the file.
//! - Over HTTP: loopback only, `Host` and `Origin` checked before any tool runs
//!   ([`crate::http_guard`]).

pub(crate) mod image;
pub(crate) mod policy;
pub(crate) mod reply;
pub(crate) mod server;

pub use image::{Router, RouterOptions};

use std::net::SocketAddr;
use std::sync::Arc;

/// Runs the router until its client goes away (stdio) or Ctrl-C (`http`). Over HTTP it binds
/// (loopback only, see [`crate::http_guard`]) before it opens anything, so a refused address or a
/// port in use leaves no registry behind. A registry that cannot be used stops it before it
/// serves ([`crate::spend::check_registry`]).
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
            crate::spend::check_registry("router", &options.registry).await?;
            server::serve_http(Arc::new(Router::new(options)), bound).await
        }
        None => {
            crate::spend::check_registry("router", &options.registry).await?;
            server::serve_stdio(Arc::new(Router::new(options))).await
        }
    }
}
