//! Storage: how callid opens, protects and migrates every database it owns.
//!
//! - [`sqlite`]: every SQLite file of callid (the registry, the preallocated key pool, the
//!   backend's two state files, the provider ledger): opened, inspected, protected and migrated
//!   by one discipline, with group commit for writes.
//! - [`postgres`]: PostgreSQL connection URLs (redacted wherever shown), TLS, and the session
//!   settings every connection gets.
//! - `cluster` (`test-hooks` feature): a throwaway PostgreSQL cluster for the integration tests
//!   and `bench`.

#[cfg(any(test, feature = "test-hooks"))]
pub mod cluster;
pub mod postgres;
pub mod sqlite;
