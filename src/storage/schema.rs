//! Every schema callid creates, in one place: each kind of SQLite file and the PostgreSQL
//! database router replicas share, declared as the append-only migrations that
//! [`crate::storage::sqlite`] and [`crate::storage::postgres::migrate`] apply.
//!
//! | what | SQLite | PostgreSQL |
//! |---|---|---|
//! | the registry (with the layers' tables when the router hosts them) | [`registry::REGISTRY`] | [`registry::REGISTRY_PG`] |
//! | `authorization.sqlite3` | [`layers::AUTHORIZATION`] | in the registry's database |
//! | `execution.sqlite3` | [`layers::EXECUTION`] | in the registry's database |
//! | the preallocated key pool | [`KEY_POOL`] | - |
//! | the in-process provider's ledger | [`LEDGER`] | - |
//!
//! # Guarantees
//! - Append only: a shipped migration is never edited, so a file or database an older callid
//!   migrated opens unchanged and a newer build only adds steps. The tests pin each shipped
//!   migration's digest.
//! - A table held by several SQLite files (the layers' `decisions`, `account_totals` and
//!   `executions`, in their own files and in the registry) is declared once
//!   ([`layers`]), and the tests hold it to one shape (columns, types, nullability, defaults,
//!   keys, indexes) in every file that has it.
//! - The registry's tables exist in both dialects (PostgreSQL's named with a `callid_` prefix,
//!   its marker table `callid_schema` standing for SQLite's `PRAGMA`s). The tests create both, a
//!   real SQLite file and a real PostgreSQL database, and compare every table's columns (names,
//!   order, nullability, type), primary key, unique constraints and indexes; where they differ
//!   on purpose, `DIALECT_DIFFERENCES` (in this file) says why, strict both ways.
//! - Nothing outside [`crate::storage`] opens a database or migrates one (the benchmarks' raw
//!   baselines aside, which measure SQLite and PostgreSQL without callid).

pub mod layers;
pub mod registry;

use crate::storage::sqlite::StoreSpec;

/// `PRAGMA application_id` of a preallocated key pool (`"cKey"`).
pub const KEY_POOL_APPLICATION_ID: i32 = 0x634b_6579;

/// What a preallocated key pool file is (`callid router keys`).
pub static KEY_POOL: StoreSpec = StoreSpec {
    kind: "preallocated key database",
    application_id: KEY_POOL_APPLICATION_ID,
    migrations: &[
        "CREATE TABLE keys (
         operation_key TEXT PRIMARY KEY NOT NULL,
         claimed_by    TEXT,
         claimed_ms    INTEGER
     ) STRICT;",
        // 2: the unclaimed keys in claim order, so a claim reads one index entry instead of
        // stepping over every key claimed before it.
        "CREATE INDEX keys_unclaimed ON keys (claimed_by) WHERE claimed_by IS NULL;",
    ],
};

/// The columns of the ledger's `charges` after its key, as both of its shapes declare them.
macro_rules! charges_after_key {
    () => {
        r"        charge_id TEXT NOT NULL UNIQUE,
        idempotency_key TEXT NOT NULL UNIQUE,
        request_fingerprint TEXT NOT NULL,
        amount_cents INTEGER NOT NULL CHECK (amount_cents >= 0),
        model TEXT NOT NULL,
        response TEXT NOT NULL,
        created_at TEXT NOT NULL
    ) STRICT;"
    };
}

/// What the in-process provider's ledger is (`"CLPL"`): one charge per idempotency key.
pub static LEDGER: StoreSpec = StoreSpec {
    kind: "provider ledger",
    application_id: 0x434c_504c,
    migrations: &[
        concat!(
            r"CREATE TABLE charges (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
",
            charges_after_key!()
        ),
        // 2: `charges` without AUTOINCREMENT, its rows carried over: each charge wrote the
        // `sqlite_sequence` page too (4 pages per commit, now 3). Rows are never deleted, so a new
        // `seq` is still one above the largest, as AUTOINCREMENT gave it.
        concat!(
            r"CREATE TABLE charges_v2 (
        seq INTEGER PRIMARY KEY,
",
            charges_after_key!(),
            r"
    INSERT INTO charges_v2 SELECT * FROM charges;
    DROP TABLE charges;
    ALTER TABLE charges_v2 RENAME TO charges;"
        ),
    ],
};

/// Where the registry's SQLite and PostgreSQL schemas differ on purpose: (table, without
/// PostgreSQL's `callid_` prefix; the difference, as the comparison words it; why). Strict both
/// ways: a difference not listed fails the tests, and so does a listed one that is gone.
#[cfg(test)]
pub const DIALECT_DIFFERENCES: &[(&str, &str, &str)] = &[
    (
        "schema",
        "table only in PostgreSQL",
        "PostgreSQL has no `PRAGMA application_id` and `user_version`: `callid_schema` holds the \
         marker and the version",
    ),
    (
        "operations",
        "column `lease_expires_ms` only in SQLite",
        LEASE_CLOCK,
    ),
    (
        "operations",
        "column `lease_lock` only in PostgreSQL",
        LEASE_CLOCK,
    ),
    (
        "operations",
        "column `lease_expires` only in PostgreSQL",
        LEASE_CLOCK,
    ),
    (
        "operations",
        "column `charged_cents` in another place (SQLite: after `updated_ms`, PostgreSQL: after \
         `error_message`)",
        "SQLite's migration 2 rebuilt the table with it last; PostgreSQL's first schema had it \
         already; every statement names its columns, so their order is never relied on",
    ),
    (
        "operations",
        "column `at_most_once` is integer in SQLite, boolean in PostgreSQL",
        NO_BOOLEAN,
    ),
    (
        "executions",
        "column `provider_replayed` is integer in SQLite, boolean in PostgreSQL",
        NO_BOOLEAN,
    ),
    (
        "executions",
        "column `dispatched_at` is text in SQLite, timestamp in PostgreSQL",
        NO_TIME,
    ),
    (
        "executions",
        "column `completed_at` is text in SQLite, timestamp in PostgreSQL",
        NO_TIME,
    ),
    (
        "installation_totals",
        "column `stripe` only in PostgreSQL",
        STRIPES,
    ),
    (
        "installation_totals",
        "primary key (installation_id) in SQLite, (installation_id, stripe) in PostgreSQL",
        STRIPES,
    ),
    (
        "account_totals",
        "column `stripe` only in PostgreSQL",
        STRIPES,
    ),
    (
        "account_totals",
        "primary key (account) in SQLite, (account, stripe) in PostgreSQL",
        STRIPES,
    ),
];

#[cfg(test)]
const LEASE_CLOCK: &str = "a SQLite lease expires by this machine's clock and its owner is a \
    process here; a PostgreSQL lease expires by the server's clock (`clock_timestamp()`, no skew \
    between replicas) and names its owner's liveness lock";
#[cfg(test)]
const NO_BOOLEAN: &str = "SQLite has no boolean type: 0 or 1";
#[cfg(test)]
const NO_TIME: &str =
    "SQLite has no time type: RFC 3339 text from `strftime`; PostgreSQL keeps `timestamptz`";
#[cfg(test)]
const STRIPES: &str = "PostgreSQL splits a total in 16 stripes (server process modulo 16), so \
    replicas settling for one installation or account at once do not queue on one row's lock; \
    SQLite has one writer at a time";

#[cfg(test)]
mod tests;
