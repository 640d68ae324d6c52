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

/// The columns `decisions` gained later (a reservation's state, when it was taken, the charge),
/// the state checked as first shipped (an `IN` list) or with the `CHECK` given.
macro_rules! decisions_later_columns {
    () => {
        decisions_later_columns!(
            "CHECK (state IN ('reserved', 'dispatched', 'charged', 'released'))"
        )
    };
    ($check:literal) => {
        concat!(
            r"        state TEXT NOT NULL DEFAULT 'dispatched'
            ",
            $check,
            r",
        reserved_ms INTEGER NOT NULL DEFAULT 0,
        charged_cents INTEGER,
"
        )
    };
}

/// The end of `decisions`: its key.
macro_rules! decisions_key {
    () => {
        r"        PRIMARY KEY (agent_id, operation_key)
    ) STRICT;"
    };
}

/// The rest of `decisions` as first shipped: its key, and its index by account.
macro_rules! decisions_closing {
    () => {
        concat!(
            decisions_key!(),
            r"
    CREATE INDEX decisions_by_account ON decisions (account);"
        )
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

/// The index of the open decisions and the triggers that keep `account_totals`, on `decisions`
/// ([`LAYER_TOTALS`]; again after `decisions` is rebuilt, [`DECISIONS_STATE_COMPARED`]).
macro_rules! decisions_open_and_totals {
    () => {
        r"CREATE INDEX decisions_open ON decisions (account) WHERE state IN ('reserved', 'dispatched');
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
    END;"
    };
}

/// The decisions' running total, the last migration so far of every SQLite file that holds
/// `decisions` (`authorization.sqlite3` and the registry): the charges of an account's `charged`
/// decisions, kept by triggers on every insert, update and delete of a decision (and filled from
/// the decisions already there), and an index of the decisions still open (`reserved`,
/// `dispatched`). A budget check reads that total and the open decisions (the authorization
/// layer's `spent_in`), so its cost stays flat however many decisions the account has settled.
pub const LAYER_TOTALS: &str = concat!(
    "CREATE TABLE account_totals (
        account       TEXT PRIMARY KEY NOT NULL,
        charged_cents INTEGER NOT NULL
    ) STRICT;
    INSERT INTO account_totals (account, charged_cents)
        SELECT account, SUM(COALESCE(charged_cents, 0)) FROM decisions
        WHERE state = 'charged' GROUP BY account;
    ",
    decisions_open_and_totals!()
);

/// The index of every decision by account goes, in every file that holds `decisions`: no
/// statement reads through it since the running total ([`LAYER_TOTALS`]) and the index of open
/// decisions answer a budget check, and each new decision wrote one more B-tree page to the WAL
/// for it (13 pages to 12 in the registry's commit of a new operation's row).
pub const DECISIONS_BY_ACCOUNT_DROPPED: &str = r"DROP INDEX decisions_by_account;";

/// `decisions` is rebuilt, in every file that holds it, with its state checked by comparisons
/// joined by `OR` instead of an `IN` list: SQLite evaluates an `IN` list of more than two
/// constants through a temporary table built on every insert and every update of the state
/// (three per new operation in the registry), and a `CHECK` cannot be altered in place. The
/// rows are copied as they are (the same columns in the same order in both files), then the
/// index of open decisions and the totals' triggers are made again on the new table; the
/// totals themselves do not change. Like every migration, it runs in the file's one exclusive
/// migrating transaction: a file is rebuilt whole or not at all.
pub const DECISIONS_STATE_COMPARED: &str = concat!(
    r"ALTER TABLE decisions RENAME TO decisions_before;
    ",
    decisions_opening!(),
    decisions_later_columns!(
        r"CHECK (state = 'reserved' OR state = 'dispatched' OR state = 'charged'
                OR state = 'released')"
    ),
    decisions_key!(),
    r"
    INSERT INTO decisions SELECT * FROM decisions_before;
    DROP TABLE decisions_before;
    ",
    decisions_open_and_totals!()
);

/// The authorization layer's own file, `authorization.sqlite3` (`"CLAU"`): its decisions.
/// Version 2 adds a reservation's state (decisions recorded by version 1 are `dispatched`),
/// version 3 the running total of charges ([`LAYER_TOTALS`]), version 4 drops the index no
/// statement uses ([`DECISIONS_BY_ACCOUNT_DROPPED`]), version 5 rebuilds `decisions` with its
/// state compared, not listed ([`DECISIONS_STATE_COMPARED`]).
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
        DECISIONS_STATE_COMPARED,
    ],
};

/// The execution layer's own file, `execution.sqlite3` (`"CLEX"`): its executions.
pub static EXECUTION: StoreSpec = StoreSpec {
    kind: "execution store",
    application_id: 0x434c_4558,
    migrations: &[executions!()],
};
