//! Integration tests: every test here runs the real `callid` binary (or real child processes and
//! real SQLite files) the way a user would.

mod bench;
mod common;
mod conform;
mod matrix;
mod measure_clients;
mod probe;
mod provider;
mod router;
