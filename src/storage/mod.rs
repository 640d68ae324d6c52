//! Storage: how callid opens, protects and migrates every database it owns, and every schema.
//! Nothing outside this module opens a database file, connects to PostgreSQL other than
//! through [`postgres::PgUrl::connect`], or runs a migration (the benchmarks' raw baselines
//! aside, which measure SQLite and PostgreSQL without callid).
//!
//! - [`schema`]: every schema, each kind of file and the PostgreSQL database, as append-only
//!   migrations; a table held by several files is declared once, and the tests hold the
//!   registry's SQLite and PostgreSQL tables to agree.
//! - [`sqlite`]: every SQLite file of callid (the registry, the preallocated key pool, the
//!   backend's two state files, the provider ledger): opened, inspected, protected and migrated
//!   by one discipline, with group commit for writes.
//! - [`postgres`]: PostgreSQL connection URLs (redacted wherever shown), TLS, the session
//!   settings every connection gets, and the schema migration.
//! - `cluster` (`test-hooks` feature): a throwaway PostgreSQL cluster for the integration tests
//!   and `bench`.

#[cfg(any(test, feature = "test-hooks"))]
pub mod cluster;
pub mod postgres;
pub mod schema;
pub mod sqlite;
