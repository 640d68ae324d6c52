//! The paid image provider: charges once per idempotency key, with a durable [`Ledger`].
//!
//! It plays the vendor at the end of a spend (the article's FLUX image API): the third layer that
//! must agree a retry is the same call. `callid provider` serves it over HTTP; without
//! `--provider-url` the router runs it in-process on a ledger beside its registry; the conformance
//! runner starts it in-process with [`ProviderHooks`] to count charges and to fail, hold or crash
//! around them.
//!
//! # HTTP contract (version 1)
//! All bodies are JSON. Errors are `{"error":{"code":"<stable code>","message":"<what to do>"}}`.
//!
//! `POST /v1/images`, header `Idempotency-Key: <1 to 255 visible ASCII characters>`, body
//! `{"prompt": str, "width": int, "height": int, "model": str, "max_amount_cents": int}` (`width`
//! and `height` default to 1024, between 64 and 4096; `model` defaults to
//! [`prices::DEFAULT_MODEL`]; `max_amount_cents` is optional; unknown fields are refused). The
//! provider prices the image from [`prices`], never from the request, and refuses to charge
//! more than `max_amount_cents` (`422 amount_above_maximum`, nothing charged); the maximum is a
//! condition, not part of the request: it does not change what "the same request" means.
//! - First use of the key: records one charge durably, then answers `200`
//!   `{"charge_id","amount_cents","model","image":{"id","width","height","sha256"},"created_at"}`.
//! - Same key, same request (after defaults): the original answer, byte for byte, with header
//!   `Idempotent-Replayed: true`; nothing new is charged.
//! - Same key, another request: `409 idempotency_key_reused`; nothing charged.
//! - Missing or malformed key: `400 missing_idempotency_key` / `400 invalid_idempotency_key`;
//!   body not JSON: `400 invalid_json`; out of bounds: `422 invalid_request`; model not sold:
//!   `422 unknown_model`; ledger failure: `500 ledger_unavailable` (retry with the same key).
//!
//! `GET /v1/charges`: `{"charges":[{"charge_id","idempotency_key","amount_cents","model",
//! "created_at"}],"count":N,"total_cents":N}`, oldest first.
//!
//! # MCP (`callid provider --mcp`)
//! The same ledger and rules behind an MCP server over stdio, the key in
//! `_meta["callid/idempotency-key"]`: see [`mcp`].
//!
//! `GET /healthz`: `{"status":"ok"}`.
//!
//! Every route: a provider started with a token ([`require_token`]) answers a request without
//! `Authorization: Bearer <token>` with `401 unauthorized`; `callid provider` refuses a foreign
//! `Host` or `Origin` with 403 (see [`crate::http_guard`]).
//!
//! # Guarantee
//! Any number of requests with one key, concurrent or not, across restarts, make at most one
//! charge, and every answer for that key carries the same receipt. The receipt is committed
//! before it is sent. See [`Ledger`] for the storage contract.

mod client;
mod error;
mod ledger;
pub mod mcp;
pub(crate) mod prices;
mod server;
#[cfg(test)]
mod tests;
pub(crate) mod types;

/// Environment variable holding the provider's bearer token (for `callid provider` and for the
/// router's `--provider-url`).
pub const TOKEN_ENV: &str = "CALLID_PROVIDER_TOKEN";

#[cfg(test)]
pub(crate) use client::BoxFuture;
pub use client::Client;
pub(crate) use client::{Endpoint, ProviderApi};
pub use error::ProviderError;
pub use ledger::Ledger;
pub use server::{HookAction, NO_KEY, ProviderHandle, ProviderHooks, spawn};
pub(crate) use server::{require_token, router, spawn_app};
pub use types::{ChargeOutcome, ChargeRecord, ImageRequest};
pub(crate) use types::{ChargesPage, Image, Receipt};
