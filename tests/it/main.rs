//! Integration tests: every test here runs the real `callid` binary (or real child processes and
//! real SQLite files) the way a user would.

#[cfg(feature = "bench")]
mod bench;
mod cli;
mod common;
mod conform;
mod conform_contract;
mod gateway;
mod hardening_money;
mod hardening_transport;
mod identity_sources;
mod matrix;
mod measure_clients;
mod probe;
mod probe_protocol;
mod provider;
mod replicas;
mod router;
mod router_perf;
mod store;
