//! Measures real agent clients offline: the real client program, a scripted model endpoint on
//! loopback instead of the vendor's API, and `callid probe` as its MCP server.
//!
//! - [`endpoint`]: the scripted model (Responses API SSE for Codex, Messages API SSE for Claude
//!   Code).
//! - [`client`]: how to run each client non-interactively with a temporary home and config.
//! - [`run`]: one bounded scenario run, leaving the probe's shape log.

pub mod analyze;
pub mod client;
pub mod endpoint;
pub mod run;
