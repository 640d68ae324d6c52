//! callid: the trusted per-call ID that makes paid AI tool calls safe to retry.
//!
//! An agent that spends money through an MCP server must tell "the same call delivered again"
//! (answer: the original result, no new charge) from "a new call with the same arguments"
//! (answer: a second operation). Only an ID that the harness puts in the request's `_meta`, never
//! one the model writes into the arguments, can tell them apart. This crate measures which
//! clients send one, routes paid calls by it, and checks that routers do so correctly.
//!
//! # Layout
//! The rooms of the house, each a top-level module; a module uses only the rooms listed before it
//! or beside it, never a user of itself.
//!
//! **Foundations**
//! - [`cli`]: the command line (clap types only), converted into domain options by [`app`].
//! - [`app`]: runs one command and maps every error to a message and an exit code.
//! - [`exit_codes`]: the exit codes every command uses.
//! - [`error_chain`]: an error and its causes as one line of text, each cause said once.
//! - [`clock`]: the wall clock, and the one UTC date algorithm behind every timestamp and date.
//! - [`text`]: cutting text at a character boundary, and GitHub-flavoured Markdown table cells.
//! - [`yaml`]: the one strict YAML loader; its errors say the path once.
//! - [`logging`]: best-effort standard error and the log set-up: a failed write never costs a
//!   reply.
//! - [`http_guard`]: the loopback, `Host` and `Origin` policy of every HTTP server of callid.
//! - [`serve`]: serving an rmcp server, once for all of callid's: stdio (every request read is
//!   answered, however late the client closed its side) and streamable HTTP behind [`http_guard`].
//! - [`pipes`]: standard input and output on the reactor when they are pipes or sockets, for
//!   every stdio server of callid (no thread-pool hand-offs per message).
//! - [`secret`]: credentials (tokens, URLs with passwords or API keys) that never show.
//! - [`signals`]: SIGINT, SIGTERM and SIGHUP taken over by the long commands (`conform`,
//!   `bench`), which end what they started before exiting 128 + the signal's number.
//! - [`crashpoint`]: test-only crash points that kill the process at a named spend boundary
//!   (armed only with the `test-hooks` feature; empty in an installed binary).
//!
//! **The field's rules**
//! - [`identity`]: the trusted-identity rules: sources in `_meta`, bounds, identity in arguments,
//!   signed envelopes.
//! - [`canonical`]: RFC 8785 canonical JSON and the request hash `sha256(tool, 0, canonical args)`.
//! - [`shape`]: the shape of `_meta` (paths, types, lengths, short digests), never its values.
//! - [`keys`]: private operation keys and public handles as distinct, leak-resistant types.
//!
//! **Storage**
//! - [`storage`]: the one home for opening, protecting and migrating every database, and for
//!   every schema ([`storage::schema`]): SQLite files ([`storage::sqlite`]), PostgreSQL
//!   connections and migrations ([`storage::postgres`]) and, with the `test-hooks` feature, a
//!   throwaway PostgreSQL cluster (re-exported as `pg_cluster`).
//!
//! **The spend core and its two users**
//! - [`spend`]: the spend core: identity, request hash, registry, keys, dispatch, record, reply,
//!   scrub, replay cache, approvals; tool-agnostic, driven by a `Spender`.
//! - [`router`]: the built-in reference router: the core in front of the image [`backend`],
//!   with its own approval and budget policy.
//! - [`gateway`]: the core in front of anyone's paid MCP server (`callid gateway`), and the
//!   embeddable `Guard`.
//! - [`backend`]: the authorization and execution layers behind the router, each idempotent on
//!   its own, in front of the [`provider`].
//! - [`provider`]: the paid image provider with a durable ledger that charges once per key.
//!
//! **Diagnostic tools**
//! - [`jsonrpc`]: a hand-written MCP client over stdio lines and streamable HTTP with exact
//!   control of ids and `_meta`, used by the conformance runner, `measure` and `bench`.
//! - [`probe`]: an MCP server (and a transparent proxy) that records the shape of every request.
//! - [`classify`]: turns probe logs into one identity verdict per client.
//! - [`demo`]: `callid demo`, three scripted clients against real probe processes, then
//!   [`classify`]'s verdicts.
//! - [`conform`]: the conformance runner that replays the built-in `scenarios/*.yaml` against any
//!   router.
//! - [`matrix`]: the support matrix data in `matrices/` and its Markdown rendering.
//! - [`measure`]: drives real agent clients offline against the probe to measure a matrix row.
//! - `bench` (with the `bench` feature): end-to-end benchmarks that run each figure beside its
//!   baseline; developer tooling, not in the installed binary.
//! - `testing` (hidden): what the integration tests, examples and benchmarks reach beyond the
//!   library's promise (crash points, fixtures, the registry's schema); not a stable interface.
//!
//! # What the library promises
//! The public modules are the library: the identity rules ([`identity`]), the request hash
//! ([`canonical`]), `_meta` shapes ([`shape`]), operation keys ([`keys`]), the MCP client
//! ([`jsonrpc`]), the probe's record format and the classifier ([`probe::record`],
//! [`classify()`](classify::classify)), the embeddable [`gateway::guard::Guard`], the provider and
//! backend behind the reference router ([`provider`], [`backend`]), the conformance runner's
//! scenarios and profiles ([`conform`]), and the command line the binary runs ([`cli`], [`app`]).
//! Every other module is private, so the compiler reports what nothing uses.
#![warn(missing_docs)]
// The module docs are written for whoever changes the code, and name the private modules that
// keep each promise; `cargo doc --document-private-items` renders those links.
#![allow(rustdoc::private_intra_doc_links)]

// The library's promise (see "What the library promises" above).
pub mod app;
pub mod backend;
pub mod canonical;
pub mod classify;
pub mod cli;
pub mod conform;
pub mod gateway;
pub mod identity;
pub mod jsonrpc;
pub mod keys;
#[doc(hidden)]
#[cfg(any(test, feature = "test-hooks"))]
pub use storage::cluster as pg_cluster;
pub mod probe;
pub mod provider;
pub mod shape;

// Internals of the commands and servers.
#[cfg(feature = "bench")]
mod bench;
mod clock;
mod crashpoint;
mod demo;
mod error_chain;
mod exit_codes;
mod http_guard;
mod logging;
mod matrix;
mod measure;
mod pipes;
mod router;
mod secret;
mod serve;
mod signals;
mod spend;
mod storage;
mod text;
mod yaml;

/// What the integration tests, the examples and the benchmarks need beyond the library's
/// promise: crash points, fixtures, the clock and the client configs `measure` writes. Not a
/// stable interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::clock::now_ms;
    pub use crate::demo::http_url;

    /// The crash points a test arms in a child process.
    #[cfg(feature = "test-hooks")]
    pub mod crashpoint {
        pub use crate::crashpoint::{Boundary, ENV, PAUSE_ENV};
    }

    /// The MCP client configurations `measure` writes and the client guide (docs/src/client.md)
    /// shows.
    pub mod client_configs {
        pub use crate::measure::client::{
            Client, SERVER_NAME, claude_code_mcp_json, claude_mcp_add, codex_mcp_add,
            codex_server_toml,
        };
    }

    /// The registry's file format: what a test checks in the files the router leaves behind.
    pub mod registry {
        pub use crate::storage::schema::registry::{APPLICATION_ID, MIGRATIONS};

        /// The PostgreSQL registry's schema.
        pub mod postgres {
            pub use crate::storage::schema::registry::PG_MIGRATIONS as MIGRATIONS;
        }
    }

    /// The names of a support matrix directory's parts (`matrices/`): what a test copies of one.
    pub mod matrix {
        pub use crate::matrix::data::{CLIENTS_FILE, EVIDENCE_DIR, ROUTERS_FILE, SUPPORT_FILE};
    }

    /// The preallocated key pool's file format.
    pub mod preallocated {
        pub use crate::storage::schema::KEY_POOL_APPLICATION_ID as APPLICATION_ID;
    }

    #[cfg(feature = "bench")]
    pub use crate::bench::fixtures;
    /// The bench's relay, which counts round trips to PostgreSQL.
    #[cfg(feature = "bench")]
    pub use crate::bench::relay;
    /// Where a bench run's files go, and whether their file system keeps them in memory only.
    #[cfg(feature = "bench")]
    pub use crate::bench::report::Scratch;
}
