//! The backend layers' SQLite tables, each declared once and used by every file that holds it:
//! `decisions` and its running total `account_totals` (the authorization layer) in
//! `authorization.sqlite3` and the registry, `executions` (the execution layer) in
//! `execution.sqlite3` and the registry.
//!
//! The registry creates them at their latest shape in one step ([`LAYER_TABLES`], its migration
//! 3); `authorization.sqlite3` reached that shape in steps ([`AUTHORIZATION`]), so `decisions` is
//! assembled from fragments: its first columns, its key and its index are one text in both files,
//! and the three columns added later are written once as columns (in [`LAYER_TABLES`]) and once
//! as the `ALTER TABLE` that added them ([`AUTHORIZATION`]'s migration 2). Every text is
//! byte-for-byte what existing files were migrated with; the tests hold each table to one shape
//! in every file that has it, and to its PostgreSQL copy (`callid_decisions`,
//! `callid_executions`, declared with the registry's in [`super::registry`]).

use crate::storage::sqlite::StoreSpec;

/// `decisions` up to its first eight columns, as `authorization.sqlite3` first created it.
macro_rules! decisions_opening {
    () => {
        r"CREATE TABLE decisions (
        agent_id TEXT NOT NULL,
        operation_key TEXT NOT NULL,
        decision_id TEXT NOT NULL UNIQUE,
        account TEXT NOT NULL,
        amount_cents INTEGER NOT NULL CHECK (amount_cents >= 0),
        scope TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        created_at TEXT NOT NULL,
"
    };
}

/// The columns `decisions` gained later (a reservation's state, when it was taken, the charge).
macro_rules! decisions_later_columns {
    () => {
        r"        state TEXT NOT NULL DEFAULT 'dispatched'
            CHECK (state IN ('reserved', 'dispatched', 'charged', 'released')),
        reserved_ms INTEGER NOT NULL DEFAULT 0,
        charged_cents INTEGER,
"
    };
}

/// The rest of `decisions`: its key, and its index by account.
macro_rules! decisions_closing {
    () => {
        r"        PRIMARY KEY (agent_id, operation_key)
    ) STRICT;
    CREATE INDEX decisions_by_account ON decisions (account);"
    };
}

/// `executions`, as both files that hold it create it.
macro_rules! executions {
    () => {
        r"CREATE TABLE executions (
        decision_id TEXT PRIMARY KEY,
        provider_key TEXT NOT NULL UNIQUE,
        request TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('dispatched', 'completed')),
        attempts INTEGER NOT NULL,
        receipt TEXT,
        provider_replayed INTEGER,
        dispatched_at TEXT NOT NULL,
        completed_at TEXT,
        CHECK ((state = 'completed') = (receipt IS NOT NULL))
    ) STRICT;"
    };
}

/// The layers' tables at their latest shape, for a file that hosts them beside its own (the
/// registry's migration 3): the same columns, in the same order, as the latest schema of
/// `authorization.sqlite3` and `execution.sqlite3`, so that rows copy across as they are
/// ([`crate::storage::sqlite::Store::import`]).
pub const LAYER_TABLES: &str = concat!(
    decisions_opening!(),
    decisions_later_columns!(),
    decisions_closing!(),
    r"
    ",
    executions!()
);

/// The decisions' running total, the last migration so far of every SQLite file that holds
/// `decisions` (`authorization.sqlite3` and the registry): the charges of an account's `charged`
/// decisions, kept by triggers on every insert, update and delete of a decision (and filled from
/// the decisions already there), and an index of the decisions still open (`reserved`,
/// `dispatched`). A budget check reads that total and the open decisions (the authorization
/// layer's `spent_in`), so its cost stays flat however many decisions the account has settled.
pub const LAYER_TOTALS: &str = "CREATE TABLE account_totals (
        account       TEXT PRIMARY KEY NOT NULL,
        charged_cents INTEGER NOT NULL
    ) STRICT;
    INSERT INTO account_totals (account, charged_cents)
        SELECT account, SUM(COALESCE(charged_cents, 0)) FROM decisions
        WHERE state = 'charged' GROUP BY account;
    CREATE INDEX decisions_open ON decisions (account) WHERE state IN ('reserved', 'dispatched');
    CREATE TRIGGER decisions_total_insert AFTER INSERT ON decisions
        WHEN NEW.state = 'charged' BEGIN
        INSERT INTO account_totals (account, charged_cents)
            VALUES (NEW.account, COALESCE(NEW.charged_cents, 0))
            ON CONFLICT (account) DO UPDATE
            SET charged_cents = charged_cents + excluded.charged_cents;
    END;
    CREATE TRIGGER decisions_total_update_old AFTER UPDATE OF state, charged_cents, account
        ON decisions WHEN OLD.state = 'charged' BEGIN
        INSERT INTO account_totals (account, charged_cents)
            VALUES (OLD.account, -COALESCE(OLD.charged_cents, 0))
            ON CONFLICT (account) DO UPDATE
            SET charged_cents = charged_cents + excluded.charged_cents;
    END;
    CREATE TRIGGER decisions_total_update_new AFTER UPDATE OF state, charged_cents, account
        ON decisions WHEN NEW.state = 'charged' BEGIN
        INSERT INTO account_totals (account, charged_cents)
            VALUES (NEW.account, COALESCE(NEW.charged_cents, 0))
            ON CONFLICT (account) DO UPDATE
            SET charged_cents = charged_cents + excluded.charged_cents;
    END;
    CREATE TRIGGER decisions_total_delete AFTER DELETE ON decisions
        WHEN OLD.state = 'charged' BEGIN
        INSERT INTO account_totals (account, charged_cents)
            VALUES (OLD.account, -COALESCE(OLD.charged_cents, 0))
            ON CONFLICT (account) DO UPDATE
            SET charged_cents = charged_cents + excluded.charged_cents;
    END;";

/// The index of every decision by account goes, in every file that holds `decisions`: no
/// statement reads through it since the running total ([`LAYER_TOTALS`]) and the index of open
/// decisions answer a budget check, and each new decision wrote one more B-tree page to the WAL
/// for it (13 pages to 12 in the registry's commit of a new operation's row).
pub const DECISIONS_BY_ACCOUNT_DROPPED: &str = r"DROP INDEX decisions_by_account;";

/// The authorization layer's own file, `authorization.sqlite3` (`"CLAU"`): its decisions.
/// Version 2 adds a reservation's state (decisions recorded by version 1 are `dispatched`),
/// version 3 the running total of charges ([`LAYER_TOTALS`]), version 4 drops the index no
/// statement uses ([`DECISIONS_BY_ACCOUNT_DROPPED`]).
pub static AUTHORIZATION: StoreSpec = StoreSpec {
    kind: "authorization store",
    application_id: 0x434c_4155,
    migrations: &[
        concat!(decisions_opening!(), decisions_closing!()),
        "ALTER TABLE decisions ADD COLUMN state TEXT NOT NULL DEFAULT 'dispatched'
             CHECK (state IN ('reserved', 'dispatched', 'charged', 'released'));
         ALTER TABLE decisions ADD COLUMN reserved_ms INTEGER NOT NULL DEFAULT 0;
         ALTER TABLE decisions ADD COLUMN charged_cents INTEGER;",
        LAYER_TOTALS,
        DECISIONS_BY_ACCOUNT_DROPPED,
    ],
};

/// The execution layer's own file, `execution.sqlite3` (`"CLEX"`): its executions.
pub static EXECUTION: StoreSpec = StoreSpec {
    kind: "execution store",
    application_id: 0x434c_4558,
    migrations: &[executions!()],
};
