//! The registry's schema in both dialects, side by side: the SQLite file ([`MIGRATIONS`],
//! identified by [`APPLICATION_ID`]) and the PostgreSQL database router replicas share
//! ([`PG_MIGRATIONS`], marked in `callid_schema`).
//!
//! The two hold the same tables (PostgreSQL's named with a `callid_` prefix) and differ only
//! where `DIALECT_DIFFERENCES` ([`super`]) says why; the tests create both and compare them. The
//! layers' tables come from [`super::layers`] in SQLite and are written out here for
//! PostgreSQL.

use super::layers::{
    DECISIONS_BY_ACCOUNT_DROPPED, DECISIONS_STATE_COMPARED, LAYER_TABLES, LAYER_TOTALS,
};
use crate::storage::postgres::PgSchema;
use crate::storage::sqlite::StoreSpec;

/// `PRAGMA application_id` of a callid registry (`"cLiD"` in ASCII); on PostgreSQL, the
/// advisory-lock namespace of callid's registry.
pub const APPLICATION_ID: i32 = 0x634c_6944;

/// What a registry file is, for [`crate::storage::sqlite`].
pub static REGISTRY: StoreSpec = StoreSpec {
    kind: "registry",
    application_id: APPLICATION_ID,
    migrations: MIGRATIONS,
};

/// What a registry database is, for [`crate::storage::postgres::migrate`].
pub static REGISTRY_PG: PgSchema = PgSchema {
    kind: "registry",
    application: "callid-registry",
    marker: "callid_schema",
    lock_namespace: APPLICATION_ID,
    owned_tables: &["callid_operations", "callid_settings"],
    migrations: PG_MIGRATIONS,
};

/// The SQLite schema, one migration per `user_version` step. Append only: never edit a shipped
/// entry.
pub const MIGRATIONS: &[&str] = &[
    // 1: the installation id and the operations.
    "CREATE TABLE settings (
         name  TEXT PRIMARY KEY NOT NULL,
         value TEXT NOT NULL
     ) STRICT;
     CREATE TABLE operations (
         platform         TEXT NOT NULL,
         installation_id  TEXT NOT NULL,
         harness_call_id  TEXT NOT NULL,
         handle           TEXT NOT NULL UNIQUE,
         operation_key    TEXT NOT NULL UNIQUE,
         tool             TEXT NOT NULL,
         request_hash     TEXT NOT NULL,
         arguments        TEXT NOT NULL,
         amount_cents     INTEGER NOT NULL,
         status           TEXT NOT NULL,
         approval         TEXT NOT NULL,
         result           TEXT,
         error_code       TEXT,
         error_message    TEXT,
         lease_owner      TEXT,
         lease_expires_ms INTEGER,
         created_ms       INTEGER NOT NULL,
         updated_ms       INTEGER NOT NULL,
         PRIMARY KEY (platform, installation_id, harness_call_id)
     ) STRICT;",
    // 2: the envelope's installation id joins the key (tenants kept apart); the amount the
    // provider actually charged is recorded beside the quote.
    "CREATE TABLE operations_v2 (
         platform            TEXT NOT NULL,
         installation_id     TEXT NOT NULL,
         source_installation TEXT NOT NULL,
         harness_call_id     TEXT NOT NULL,
         handle              TEXT NOT NULL UNIQUE,
         operation_key       TEXT NOT NULL UNIQUE,
         tool                TEXT NOT NULL,
         request_hash        TEXT NOT NULL,
         arguments           TEXT NOT NULL,
         amount_cents        INTEGER NOT NULL,
         status              TEXT NOT NULL,
         approval            TEXT NOT NULL,
         result              TEXT,
         error_code          TEXT,
         error_message       TEXT,
         lease_owner         TEXT,
         lease_expires_ms    INTEGER,
         created_ms          INTEGER NOT NULL,
         updated_ms          INTEGER NOT NULL,
         charged_cents       INTEGER,
         PRIMARY KEY (platform, installation_id, source_installation, harness_call_id)
     ) STRICT;
     INSERT INTO operations_v2 (platform, installation_id, source_installation, harness_call_id,
         handle, operation_key, tool, request_hash, arguments, amount_cents, status, approval,
         result, error_code, error_message, lease_owner, lease_expires_ms, created_ms, updated_ms)
     SELECT platform, installation_id, '', harness_call_id, handle, operation_key, tool,
         request_hash, arguments, amount_cents, status, approval, result, error_code,
         error_message, lease_owner, lease_expires_ms, created_ms, updated_ms FROM operations;
     DROP TABLE operations;
     ALTER TABLE operations_v2 RENAME TO operations;",
    // 3: the built-in router's authorization and execution layers keep their tables here, so
    // that a new operation's row, decision and dispatch are one commit, and its result, receipt
    // and charge another (see `crate::backend::Backend::open_in`).
    LAYER_TABLES,
    // 4: the decisions' running total of charges (see [`LAYER_TOTALS`]).
    LAYER_TOTALS,
    // 5: the operations' running total: the cents of each installation's completed operations,
    // kept by triggers (and filled from the rows already there), and an index of the operations
    // still open, so a budgeted insert reads one total and the open rows, whatever the number of
    // operations completed before.
    "CREATE TABLE installation_totals (
         installation_id TEXT PRIMARY KEY NOT NULL,
         completed_cents INTEGER NOT NULL
     ) STRICT;
     INSERT INTO installation_totals (installation_id, completed_cents)
         SELECT installation_id, SUM(COALESCE(charged_cents, amount_cents)) FROM operations
         WHERE status = 'completed' GROUP BY installation_id;
     CREATE INDEX operations_open ON operations (installation_id)
         WHERE status IN ('pending', 'awaiting_approval');
     CREATE TRIGGER operations_total_insert AFTER INSERT ON operations
         WHEN NEW.status = 'completed' BEGIN
         INSERT INTO installation_totals (installation_id, completed_cents)
             VALUES (NEW.installation_id, COALESCE(NEW.charged_cents, NEW.amount_cents))
             ON CONFLICT (installation_id) DO UPDATE
             SET completed_cents = completed_cents + excluded.completed_cents;
     END;
     CREATE TRIGGER operations_total_update_old
         AFTER UPDATE OF status, charged_cents, amount_cents, installation_id ON operations
         WHEN OLD.status = 'completed' BEGIN
         INSERT INTO installation_totals (installation_id, completed_cents)
             VALUES (OLD.installation_id, -COALESCE(OLD.charged_cents, OLD.amount_cents))
             ON CONFLICT (installation_id) DO UPDATE
             SET completed_cents = completed_cents + excluded.completed_cents;
     END;
     CREATE TRIGGER operations_total_update_new
         AFTER UPDATE OF status, charged_cents, amount_cents, installation_id ON operations
         WHEN NEW.status = 'completed' BEGIN
         INSERT INTO installation_totals (installation_id, completed_cents)
             VALUES (NEW.installation_id, COALESCE(NEW.charged_cents, NEW.amount_cents))
             ON CONFLICT (installation_id) DO UPDATE
             SET completed_cents = completed_cents + excluded.completed_cents;
     END;
     CREATE TRIGGER operations_total_delete AFTER DELETE ON operations
         WHEN OLD.status = 'completed' BEGIN
         INSERT INTO installation_totals (installation_id, completed_cents)
             VALUES (OLD.installation_id, -COALESCE(OLD.charged_cents, OLD.amount_cents))
             ON CONFLICT (installation_id) DO UPDATE
             SET completed_cents = completed_cents + excluded.completed_cents;
     END;",
    // 6: at-most-once dispatch for backends that ignore idempotency keys: whether the row is
    // dispatched at most once, a fencing token counted up by every lease taken (a dispatcher's
    // writes carry it), the lease under which the row was last dispatched (NULL: never, or a
    // person said nothing was charged), and a person's resolution of an `in_doubt` row. An
    // in-doubt row is open money: the open-row index now covers it.
    "ALTER TABLE operations ADD COLUMN at_most_once INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE operations ADD COLUMN lease_generation INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE operations ADD COLUMN dispatch_generation INTEGER;
     ALTER TABLE operations ADD COLUMN dispatched_ms INTEGER;
     ALTER TABLE operations ADD COLUMN resolution TEXT;
     ALTER TABLE operations ADD COLUMN resolved_by TEXT;
     ALTER TABLE operations ADD COLUMN resolved_ms INTEGER;
     DROP INDEX operations_open;
     CREATE INDEX operations_open ON operations (installation_id)
         WHERE status IN ('pending', 'awaiting_approval', 'in_doubt');",
    // 7: the decisions' index by account goes: no statement uses it (see
    // [`DECISIONS_BY_ACCOUNT_DROPPED`]).
    DECISIONS_BY_ACCOUNT_DROPPED,
    // 8: the open-row index covers the same rows, its condition written as comparisons joined
    // by `OR`: SQLite evaluated the `IN` list of three statuses through a temporary table on
    // every insert and update of a row (three per new operation). `open_statuses!("status")`
    // is the condition a query must repeat to read through it.
    "DROP INDEX operations_open;
     CREATE INDEX operations_open ON operations (installation_id)
         WHERE (status = 'pending' OR status = 'awaiting_approval' OR status = 'in_doubt');",
    // 9: `decisions` rebuilt with its state compared, not listed, as in `authorization.sqlite3`
    // (see [`DECISIONS_STATE_COMPARED`]).
    DECISIONS_STATE_COMPARED,
];

/// The PostgreSQL schema, one migration per version step (the version in `callid_schema`).
/// Append only: never edit a shipped entry.
pub const PG_MIGRATIONS: &[&str] = &[
    // 1: the schema marker, the installation id and the operations.
    "CREATE TABLE callid_schema (
         application text NOT NULL,
         version     integer NOT NULL
     );
     CREATE TABLE callid_settings (
         name  text PRIMARY KEY,
         value text NOT NULL
     );
     CREATE TABLE callid_operations (
         platform            text NOT NULL,
         installation_id     text NOT NULL,
         source_installation text NOT NULL,
         harness_call_id     text NOT NULL,
         handle              text NOT NULL UNIQUE,
         operation_key       text NOT NULL UNIQUE,
         tool                text NOT NULL,
         request_hash        text NOT NULL,
         arguments           text NOT NULL,
         amount_cents        bigint NOT NULL,
         status              text NOT NULL,
         approval            text NOT NULL,
         result              text,
         error_code          text,
         error_message       text,
         charged_cents       bigint,
         lease_owner         text,
         lease_lock          integer,
         lease_expires       timestamptz,
         created_ms          bigint NOT NULL,
         updated_ms          bigint NOT NULL,
         PRIMARY KEY (platform, installation_id, source_installation, harness_call_id)
     );",
    // 2: the authorization layer's decisions, shared by replicas (`crate::backend::shared`).
    "CREATE TABLE callid_decisions (
         agent_id      text NOT NULL,
         operation_key text NOT NULL,
         decision_id   text NOT NULL UNIQUE,
         account       text NOT NULL,
         amount_cents  bigint NOT NULL CHECK (amount_cents >= 0),
         scope         text NOT NULL,
         request_hash  text NOT NULL,
         created_at    text NOT NULL,
         state         text NOT NULL
             CHECK (state IN ('reserved', 'dispatched', 'charged', 'released')),
         reserved_ms   bigint NOT NULL,
         charged_cents bigint,
         PRIMARY KEY (agent_id, operation_key)
     );
     CREATE INDEX callid_decisions_by_account ON callid_decisions (account);",
    // 3: the execution layer's records, shared by replicas (`crate::backend::shared`).
    "CREATE TABLE callid_executions (
         decision_id       text PRIMARY KEY,
         provider_key      text NOT NULL UNIQUE,
         request           text NOT NULL,
         state             text NOT NULL CHECK (state IN ('dispatched', 'completed')),
         attempts          bigint NOT NULL,
         receipt           text,
         provider_replayed boolean,
         dispatched_at     timestamptz NOT NULL,
         completed_at      timestamptz,
         CHECK ((state = 'completed') = (receipt IS NOT NULL))
     );",
    // 4: running totals of settled money, kept by triggers (and filled from the rows already
    // there), and indexes of the rows still open, so a budget check reads a few total rows and
    // the open rows, whatever the number settled before (`COMMITTED`, `shared::SPENT`). A total
    // is split in 16 stripes, one per server process modulo 16, so that replicas settling for
    // one installation or account at once do not queue on one row's lock until their commits.
    // Each trigger's WHEN skips the function call for the rows that do not touch a total (a new
    // pending row, a decision marked `dispatched`), the common case on a new operation's path.
    // The triggers are created before the totals are filled: they lock the tables against
    // writers of an older build still running, so no row changes between the fill and them.
    "CREATE TABLE callid_installation_totals (
         installation_id text NOT NULL,
         stripe          integer NOT NULL,
         completed_cents bigint NOT NULL,
         PRIMARY KEY (installation_id, stripe)
     );
     CREATE TABLE callid_account_totals (
         account       text NOT NULL,
         stripe        integer NOT NULL,
         charged_cents bigint NOT NULL,
         PRIMARY KEY (account, stripe)
     );
     CREATE FUNCTION callid_operations_total() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         IF TG_OP <> 'INSERT' AND OLD.status = 'completed' THEN
             INSERT INTO callid_installation_totals AS t VALUES
                 (OLD.installation_id, pg_backend_pid() % 16,
                  -COALESCE(OLD.charged_cents, OLD.amount_cents))
             ON CONFLICT (installation_id, stripe) DO UPDATE
                 SET completed_cents = t.completed_cents + EXCLUDED.completed_cents;
         END IF;
         IF TG_OP <> 'DELETE' AND NEW.status = 'completed' THEN
             INSERT INTO callid_installation_totals AS t VALUES
                 (NEW.installation_id, pg_backend_pid() % 16,
                  COALESCE(NEW.charged_cents, NEW.amount_cents))
             ON CONFLICT (installation_id, stripe) DO UPDATE
                 SET completed_cents = t.completed_cents + EXCLUDED.completed_cents;
         END IF;
         RETURN NULL;
     END $$;
     CREATE TRIGGER callid_operations_total_insert AFTER INSERT ON callid_operations
         FOR EACH ROW WHEN (NEW.status = 'completed')
         EXECUTE FUNCTION callid_operations_total();
     CREATE TRIGGER callid_operations_total_update
         AFTER UPDATE OF status, charged_cents, amount_cents, installation_id
         ON callid_operations
         FOR EACH ROW WHEN (OLD.status = 'completed' OR NEW.status = 'completed')
         EXECUTE FUNCTION callid_operations_total();
     CREATE TRIGGER callid_operations_total_delete AFTER DELETE ON callid_operations
         FOR EACH ROW WHEN (OLD.status = 'completed')
         EXECUTE FUNCTION callid_operations_total();
     CREATE FUNCTION callid_decisions_total() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
         IF TG_OP <> 'INSERT' AND OLD.state = 'charged' THEN
             INSERT INTO callid_account_totals AS t VALUES
                 (OLD.account, pg_backend_pid() % 16, -COALESCE(OLD.charged_cents, 0))
             ON CONFLICT (account, stripe) DO UPDATE
                 SET charged_cents = t.charged_cents + EXCLUDED.charged_cents;
         END IF;
         IF TG_OP <> 'DELETE' AND NEW.state = 'charged' THEN
             INSERT INTO callid_account_totals AS t VALUES
                 (NEW.account, pg_backend_pid() % 16, COALESCE(NEW.charged_cents, 0))
             ON CONFLICT (account, stripe) DO UPDATE
                 SET charged_cents = t.charged_cents + EXCLUDED.charged_cents;
         END IF;
         RETURN NULL;
     END $$;
     CREATE TRIGGER callid_decisions_total_insert AFTER INSERT ON callid_decisions
         FOR EACH ROW WHEN (NEW.state = 'charged')
         EXECUTE FUNCTION callid_decisions_total();
     CREATE TRIGGER callid_decisions_total_update
         AFTER UPDATE OF state, charged_cents, account ON callid_decisions
         FOR EACH ROW WHEN (OLD.state = 'charged' OR NEW.state = 'charged')
         EXECUTE FUNCTION callid_decisions_total();
     CREATE TRIGGER callid_decisions_total_delete AFTER DELETE ON callid_decisions
         FOR EACH ROW WHEN (OLD.state = 'charged')
         EXECUTE FUNCTION callid_decisions_total();
     INSERT INTO callid_installation_totals
         SELECT installation_id, 0, SUM(COALESCE(charged_cents, amount_cents))
         FROM callid_operations WHERE status = 'completed' GROUP BY installation_id;
     INSERT INTO callid_account_totals
         SELECT account, 0, SUM(COALESCE(charged_cents, 0))
         FROM callid_decisions WHERE state = 'charged' GROUP BY account;
     CREATE INDEX callid_operations_open ON callid_operations (installation_id)
         WHERE status IN ('pending', 'awaiting_approval');
     CREATE INDEX callid_decisions_open ON callid_decisions (account)
         WHERE state IN ('reserved', 'dispatched');",
    // 5: at-most-once dispatch, fencing tokens and resolutions, as SQLite's migration 6 (see
    // there); the open-row index covers in-doubt rows.
    "ALTER TABLE callid_operations ADD COLUMN at_most_once boolean NOT NULL DEFAULT false;
     ALTER TABLE callid_operations ADD COLUMN lease_generation bigint NOT NULL DEFAULT 0;
     ALTER TABLE callid_operations ADD COLUMN dispatch_generation bigint;
     ALTER TABLE callid_operations ADD COLUMN dispatched_ms bigint;
     ALTER TABLE callid_operations ADD COLUMN resolution text;
     ALTER TABLE callid_operations ADD COLUMN resolved_by text;
     ALTER TABLE callid_operations ADD COLUMN resolved_ms bigint;
     DROP INDEX callid_operations_open;
     CREATE INDEX callid_operations_open ON callid_operations (installation_id)
         WHERE status IN ('pending', 'awaiting_approval', 'in_doubt');",
    // 6: the decisions' index by account goes, as SQLite's migration 7: no statement uses it
    // (a budget check reads the totals and `callid_decisions_open`).
    r"DROP INDEX callid_decisions_by_account;",
];
