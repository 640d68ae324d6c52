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
//!   by one discipline, with group commit for writes, through a VFS that hands a commit's WAL
//!   frames to the kernel in one write (`sqlite::vfs`).
//! - [`postgres`]: PostgreSQL connection URLs (redacted wherever shown), TLS, the session
//!   settings every connection gets, and the schema migration.
//! - [`LayerTx`]: a transaction on either dialect that the registry and the layers write in.
//! - `cluster` (`test-hooks` feature): a throwaway PostgreSQL cluster for the integration tests
//!   and `bench`.

#[cfg(any(test, feature = "test-hooks"))]
pub mod cluster;
pub mod postgres;
pub mod schema;
pub mod sqlite;

/// An open transaction that the registry's writes and the backend layers' steps share
/// ([`crate::backend::Backend::prepare_in`], [`crate::backend::Backend::settle_in`]): on the
/// SQLite file hosting the layers' tables, or on the PostgreSQL database that router replicas
/// share (where the layers' tables live beside the registry's).
pub enum LayerTx<'a, 'b> {
    /// A transaction (or savepoint) on the host SQLite file.
    Sqlite(&'a rusqlite::Connection),
    /// A transaction (or savepoint) on the shared PostgreSQL database.
    Postgres(&'a mut (dyn postgres::PgStatements + 'b)),
}
