//! The spend core: the design article's rules for one paid tool call, shared by its two users,
//! the built-in router ([`crate::router`]) and the gateway in front of anyone's MCP server
//! ([`crate::gateway`], and its embeddable [`crate::gateway::guard::Guard`]).
//!
//! The core reads the trusted identity, hashes the request, consults and writes the durable
//! registry, mints private keys and public handles, lets its [`pipeline::Spender`] dispatch,
//! records the outcome, scrubs every reply and keeps completed replies ready for redelivery.
//! What is spent, and how, is the spender's business; nothing here knows images or upstreams
//! (the module graph test keeps the core from depending on the image [`crate::backend`] and
//! [`crate::provider`] as on its users).
//!
//! # Layout
//! - [`pipeline`]: [`pipeline::Core`], the article's rules in its order, and the
//!   [`pipeline::Spender`] trait its users implement.
//! - [`reply`]: the reply and tool error catalogue (codes, wire shapes, error mapping).
//! - [`registry`]: the registry (a SQLite file, or PostgreSQL shared by replicas), with its
//!   Durability, Concurrency, Compatibility and Retention contract.
//! - [`replay`]: recent completed replies, ready to send again on redelivery.
//! - [`scrub`]: removes private keys from every reply.
//! - [`policy`]: reading a policy file (`--policy`), whose contents are each user's own.
//! - [`preallocated`]: the operator-filled key pool of preallocated mode.
//! - [`diagnose`]: `--diagnose-meta`, the shape of each call's `_meta`, never values.
//! - [`tools`]: `operation_status` and `resume_operation`, the tools every user lists.
//! - [`operator`]: `approve`, `deny`, `resolve`, `status`, `keys`: what a person does with a
//!   registry, whichever user wrote it.
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
//! - A log line that cannot be written is dropped and counted, never a lost reply
//!   ([`crate::logging`]).
//! - After a dispatch, no error claims that nothing was dispatched: an answer that cannot be
//!   recorded is `outcome_unknown`, with the handle, settled by redelivering the same call.
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
pub(crate) mod tools;

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
/// is new), proves it can be written (see [`crate::storage::sqlite`]; on PostgreSQL the installation id is
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
        return crate::storage::sqlite::creatable(
            path,
            &crate::storage::schema::registry::REGISTRY,
        )
        .map_err(|e| RegistryRefused {
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
