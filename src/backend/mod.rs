//! The layers behind the router: authorization and execution, each idempotent on its own.

pub mod store;
