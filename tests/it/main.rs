//! Integration tests: every test here runs the real `callid` binary (or real child processes and
//! real SQLite files) the way a user would.

#[cfg(feature = "bench")]
mod bench;
mod cli;
mod common;
mod conform;
mod conform_contract;
mod conform_contract_gaps;
mod conform_replicas;
mod conform_signals;
mod conform_signatures;
mod conform_upstream;
mod gateway;
mod gateway_at_most_once;
mod gateway_conformance;
mod gateway_everything;
mod gateway_relay;
mod gateway_transparent;
mod gateway_upstream;
mod hardening_money;
mod hardening_transport;
mod identity_sources;
mod matrix;
mod measure_clients;
mod measure_installed;
mod message_text;
mod module_graph;
mod newcomer;
mod pg;
mod pg_tls;
mod probe;
mod probe_protocol;
mod provider;
mod registry_startup;
mod replicas;
mod replicas_faults;
mod replicas_gateway;
mod router;
mod router_perf;
mod signed_envelopes;
mod snippets;
mod stdio_eof;
mod stdio_pipes;
mod storage_home;
mod store;
