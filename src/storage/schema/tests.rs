//! The schemas held to their promises: shipped migrations never change, a table has one shape in
//! every SQLite file that holds it, and the registry's SQLite and PostgreSQL tables agree except
//! where [`DIALECT_DIFFERENCES`] says why. Every schema is created the way callid creates it, in
//! a real SQLite file ([`open_connection`]) and a real PostgreSQL database ([`migrate`]).

use super::layers::{AUTHORIZATION, EXECUTION};
use super::registry::{REGISTRY, REGISTRY_PG};
use super::{DIALECT_DIFFERENCES, KEY_POOL, LEDGER};
use crate::storage::postgres::{PgUrl, migrate};
use crate::storage::sqlite::{Create, StoreSpec, open_connection};
use std::collections::{BTreeMap, BTreeSet};

/// The first 16 hex digits of `sha256` of every shipped migration, per kind of schema.
const SHIPPED: &[(&str, &[&str])] = &[
    (
        "registry",
        &[
            "b1fe86e05e6e4297",
            "5d0e0e102dab2de7",
            "b1dedf97d3063638",
            "5855f5af46a5d09a",
            "40288bd15f7f8f68",
            "27181cb983b5410d",
            "6a71d55681b1c4ee",
            "c1712e31fd767986",
            "c58a1c4c1cbab349",
        ],
    ),
    (
        "registry (PostgreSQL)",
        &[
            "fc7119dfb466ebb9",
            "f60ffafa3e5bbaad",
            "07f560a6582a7dc0",
            "ca368712ba997f9d",
            "73b9a9bf68afa866",
            "9c0721e7a25837a4",
        ],
    ),
    (
        "authorization store",
        &[
            "547bc58eea5a1eb1",
            "6bfb3e7432f88d8f",
            "5855f5af46a5d09a",
            "6a71d55681b1c4ee",
            "c58a1c4c1cbab349",
        ],
    ),
    ("execution store", &["62de246c362db575"]),
    ("provider ledger", &["28fcf23234a05c01", "58244a7bd06e3d21"]),
    (
        "preallocated key database",
        &["2c594ac707255b3b", "87bd6d4bf2bf9d02"],
    ),
];

/// Every kind of SQLite file.
const SQLITE: [&StoreSpec; 5] = [&REGISTRY, &AUTHORIZATION, &EXECUTION, &LEDGER, &KEY_POOL];

fn digest(sql: &str) -> String {
    use sha2::Digest as _;
    crate::canonical::hex(&sha2::Sha256::digest(sql.as_bytes()))[..16].to_owned()
}

#[test]
fn shipped_migrations_are_never_edited() {
    let kinds: Vec<(&str, &[&str])> = SQLITE
        .iter()
        .map(|spec| (spec.kind, spec.migrations))
        .chain([("registry (PostgreSQL)", REGISTRY_PG.migrations)])
        .collect();
    let mut problems = Vec::new();
    for (kind, migrations) in &kinds {
        let pinned = SHIPPED
            .iter()
            .find(|(k, _)| k == kind)
            .map_or(&[][..], |(_, d)| *d);
        for (i, sql) in migrations.iter().enumerate() {
            let found = digest(sql);
            match pinned.get(i) {
                Some(want) if *want == found => {}
                Some(want) => problems.push(format!(
                    "{kind} migration {}: shipped as {want}, now {found}: restore its text \
                     and append a new migration instead",
                    i + 1
                )),
                None => problems.push(format!(
                    "{kind} migration {} ({found}) is not pinned: add it to `SHIPPED` once it \
                     ships",
                    i + 1
                )),
            }
        }
        if pinned.len() > migrations.len() {
            problems.push(format!(
                "{kind}: {} shipped migrations, {} now: a shipped migration was removed",
                pinned.len(),
                migrations.len()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A column as both dialects can describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    /// `text`, `integer`, `real`, `blob`, `boolean`, `timestamp`, or the declared type.
    kind: String,
    not_null: bool,
    /// SQLite only (compared between SQLite files).
    default: Option<String>,
}

/// A non-constraint index.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Index {
    columns: Vec<String>,
    unique: bool,
    /// A partial index's predicate as the names and literals it holds, in order.
    predicate: Option<Vec<String>>,
}

impl Index {
    /// `unique on (a, b) where a 'x'`.
    fn describe(&self) -> String {
        let unique = if self.unique { "unique " } else { "" };
        let predicate = self
            .predicate
            .as_ref()
            .map_or(String::new(), |words| format!(" where {}", words.join(" ")));
        format!("{unique}on {}{predicate}", list(&self.columns))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Table {
    columns: Vec<Column>,
    primary_key: Vec<String>,
    uniques: BTreeSet<Vec<String>>,
    indexes: BTreeMap<String, Index>,
}

/// The names and literals of an index predicate, without SQL's words and PostgreSQL's casts,
/// each name once: SQLite's `state IN ('a', 'b')` or `(state = 'a' OR state = 'b')` and
/// PostgreSQL's `(state = ANY (ARRAY['a'::text, 'b'::text]))` all give `state 'a' 'b'`.
fn predicate_words(sql: &str) -> Vec<String> {
    const NOISE: &[&str] = &["in", "any", "array", "text", "and", "or", "not", "is"];
    let mut words = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            let mut literal = String::from("'");
            for d in chars.by_ref() {
                literal.push(d);
                if d == '\'' {
                    break;
                }
            }
            words.push(literal);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut word = String::from(c);
            while let Some(&d) = chars
                .peek()
                .filter(|d| d.is_ascii_alphanumeric() || **d == '_')
            {
                word.push(d);
                chars.next();
            }
            let word = word.to_ascii_lowercase();
            if !NOISE.contains(&word.as_str()) && !words.contains(&word) {
                words.push(word);
            }
        }
    }
    words
}

fn sqlite_kind(declared: &str) -> String {
    match declared.to_ascii_uppercase().as_str() {
        "TEXT" => "text".into(),
        "INTEGER" | "INT" => "integer".into(),
        "REAL" => "real".into(),
        "BLOB" => "blob".into(),
        other => other.to_ascii_lowercase(),
    }
}

fn pg_kind(declared: &str) -> String {
    match declared {
        "text" | "character varying" => "text".into(),
        "bigint" | "integer" | "smallint" => "integer".into(),
        "double precision" | "real" => "real".into(),
        "bytea" => "blob".into(),
        "boolean" => "boolean".into(),
        "timestamp with time zone" | "timestamp without time zone" => "timestamp".into(),
        other => other.into(),
    }
}

/// Every table of a SQLite file.
fn sqlite_tables(conn: &rusqlite::Connection) -> BTreeMap<String, Table> {
    let strings = |sql: &str, param: &str| -> Vec<Vec<Option<String>>> {
        let mut stmt = conn.prepare(sql).unwrap();
        let width = stmt.column_count();
        stmt.query_map([param], |r| {
            (0..width)
                .map(|i| {
                    use rusqlite::types::Value;
                    Ok(match r.get::<_, Value>(i)? {
                        Value::Null => None,
                        Value::Integer(n) => Some(n.to_string()),
                        Value::Text(t) => Some(t),
                        other => Some(format!("{other:?}")),
                    })
                })
                .collect()
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    };
    let one = |row: &[Option<String>], i: usize| row[i].clone().unwrap_or_default();
    let names = strings(
        "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' \
         AND name NOT LIKE 'sqlite_%' AND name <> ?1",
        "",
    );
    let mut tables = BTreeMap::new();
    for name in names.iter().map(|r| one(r, 0)) {
        let mut table = Table::default();
        let mut key = Vec::new();
        for row in strings(
            r#"SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?1) ORDER BY cid"#,
            &name,
        ) {
            table.columns.push(Column {
                name: one(&row, 0),
                kind: sqlite_kind(&one(&row, 1)),
                not_null: one(&row, 2) == "1",
                default: row[3].clone(),
            });
            let pk: i64 = one(&row, 4).parse().unwrap();
            if pk > 0 {
                key.push((pk, one(&row, 0)));
            }
        }
        key.sort();
        table.primary_key = key.into_iter().map(|(_, c)| c).collect();
        for row in strings(
            r#"SELECT name, "unique", origin, partial FROM pragma_index_list(?1)"#,
            &name,
        ) {
            let index = one(&row, 0);
            let columns: Vec<String> = strings(
                "SELECT name FROM pragma_index_info(?1) ORDER BY seqno",
                &index,
            )
            .iter()
            .map(|r| one(r, 0))
            .collect();
            match one(&row, 2).as_str() {
                "pk" => {}
                "u" => {
                    table.uniques.insert(columns);
                }
                _ => {
                    let sql = strings("SELECT sql FROM sqlite_schema WHERE name = ?1", &index);
                    let sql = one(&sql[0], 0);
                    let predicate = (one(&row, 3) == "1").then(|| {
                        let at = sql.find(" WHERE ").expect("a partial index's WHERE");
                        predicate_words(&sql[at + 7..])
                    });
                    table.indexes.insert(
                        index,
                        Index {
                            columns,
                            unique: one(&row, 1) == "1",
                            predicate,
                        },
                    );
                }
            }
        }
        tables.insert(name, table);
    }
    tables
}

/// Every table of a PostgreSQL database's `public` schema, named without the `callid_` prefix;
/// an index is named so too.
fn pg_tables(client: &mut postgres::Client) -> BTreeMap<String, Table> {
    let bare = |name: &str| name.strip_prefix("callid_").unwrap_or(name).to_owned();
    let names: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relkind = 'r'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut tables = BTreeMap::new();
    for name in names {
        let mut table = Table::default();
        for row in client
            .query(
                "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull \
                 FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 \
                 AND NOT attisdropped ORDER BY attnum",
                &[&name],
            )
            .unwrap()
        {
            table.columns.push(Column {
                name: row.get(0),
                kind: pg_kind(row.get::<_, &str>(1)),
                not_null: row.get(2),
                default: None,
            });
        }
        for row in client
            .query(
                "SELECT con.contype::text, ARRAY(SELECT a.attname::text \
                     FROM unnest(con.conkey) WITH ORDINALITY k(n, ord) \
                     JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n \
                     ORDER BY k.ord) \
                 FROM pg_constraint con \
                 WHERE con.conrelid = $1::text::regclass AND con.contype IN ('p', 'u')",
                &[&name],
            )
            .unwrap()
        {
            let columns: Vec<String> = row.get(1);
            if row.get::<_, String>(0) == "p" {
                table.primary_key = columns;
            } else {
                table.uniques.insert(columns);
            }
        }
        for row in client
            .query(
                "SELECT ic.relname::text, i.indisunique, pg_get_expr(i.indpred, i.indrelid), \
                     ARRAY(SELECT a.attname::text \
                         FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, ord) \
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n \
                         ORDER BY k.ord) \
                 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid \
                 WHERE i.indrelid = $1::text::regclass \
                 AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
                &[&name],
            )
            .unwrap()
        {
            let predicate: Option<String> = row.get(2);
            table.indexes.insert(
                bare(row.get::<_, &str>(0)),
                Index {
                    columns: row.get(3),
                    unique: row.get(1),
                    predicate: predicate.as_deref().map(predicate_words),
                },
            );
        }
        tables.insert(bare(&name), table);
    }
    tables
}

fn list(columns: &[String]) -> String {
    format!("({})", columns.join(", "))
}

/// The longest common subsequence of `a` and `b` (the columns that kept their order).
fn in_order(a: &[&str], b: &[&str]) -> BTreeSet<String> {
    let mut best = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            best[i][j] = if a[i] == b[j] {
                best[i + 1][j + 1] + 1
            } else {
                best[i + 1][j].max(best[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut kept) = (0, 0, BTreeSet::new());
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            kept.insert(a[i].to_owned());
            (i, j) = (i + 1, j + 1);
        } else if best[i + 1][j] >= best[i][j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    kept
}

/// How table `l` (of dialect `ln`) differs from `r` (of `rn`), one sentence each. Defaults are
/// compared only when `defaults` (both are SQLite).
fn differences(l: &Table, ln: &str, r: &Table, rn: &str, defaults: bool) -> Vec<String> {
    let mut out = Vec::new();
    let names = |t: &Table| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let (lnames, rnames) = (names(l), names(r));
    for c in &lnames {
        if !rnames.contains(c) {
            out.push(format!("column `{c}` only in {ln}"));
        }
    }
    for c in &rnames {
        if !lnames.contains(c) {
            out.push(format!("column `{c}` only in {rn}"));
        }
    }
    let shared = |of: &[String], other: &[String]| -> Vec<String> {
        of.iter().filter(|c| other.contains(c)).cloned().collect()
    };
    let (lshared, rshared) = (shared(&lnames, &rnames), shared(&rnames, &lnames));
    let kept = in_order(
        &lshared.iter().map(String::as_str).collect::<Vec<_>>(),
        &rshared.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let after = |order: &[String], c: &String| {
        let at = order.iter().position(|x| x == c).unwrap();
        at.checked_sub(1)
            .map_or("first".to_owned(), |p| format!("after `{}`", order[p]))
    };
    for c in lshared.iter().filter(|c| !kept.contains(*c)) {
        out.push(format!(
            "column `{c}` in another place ({ln}: {}, {rn}: {})",
            after(&lshared, c),
            after(&rshared, c)
        ));
    }
    for lc in &l.columns {
        let Some(rc) = r.columns.iter().find(|c| c.name == lc.name) else {
            continue;
        };
        if lc.kind != rc.kind {
            out.push(format!(
                "column `{}` is {} in {ln}, {} in {rn}",
                lc.name, lc.kind, rc.kind
            ));
        }
        if lc.not_null != rc.not_null {
            let (yes, no) = if lc.not_null { (ln, rn) } else { (rn, ln) };
            out.push(format!(
                "column `{}` is NOT NULL in {yes}, nullable in {no}",
                lc.name
            ));
        }
        if defaults && lc.default != rc.default {
            out.push(format!(
                "column `{}` defaults to {:?} in {ln}, {:?} in {rn}",
                lc.name, lc.default, rc.default
            ));
        }
    }
    if l.primary_key != r.primary_key {
        out.push(format!(
            "primary key {} in {ln}, {} in {rn}",
            list(&l.primary_key),
            list(&r.primary_key)
        ));
    }
    for u in l.uniques.difference(&r.uniques) {
        out.push(format!("unique {} only in {ln}", list(u)));
    }
    for u in r.uniques.difference(&l.uniques) {
        out.push(format!("unique {} only in {rn}", list(u)));
    }
    for (name, li) in &l.indexes {
        match r.indexes.get(name) {
            None => out.push(format!("index `{name}` only in {ln}")),
            Some(ri) if ri != li => out.push(format!(
                "index `{name}` is {} in {ln}, {} in {rn}",
                li.describe(),
                ri.describe()
            )),
            Some(_) => {}
        }
    }
    for name in r.indexes.keys().filter(|n| !l.indexes.contains_key(*n)) {
        out.push(format!("index `{name}` only in {rn}"));
    }
    out
}

/// A fresh file of each kind, created and migrated the way callid creates it.
fn sqlite_files(dir: &std::path::Path) -> Vec<(&'static str, BTreeMap<String, Table>)> {
    SQLITE
        .iter()
        .map(|spec| {
            let path = file_of(dir, spec);
            let conn = open_connection(&path, spec, Create::IfMissing)
                .unwrap_or_else(|e| panic!("creating a {}: {e}", spec.kind));
            (spec.kind, sqlite_tables(&conn))
        })
        .collect()
}

#[test]
fn a_table_has_one_shape_in_every_sqlite_file_that_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = sqlite_files(dir.path());
    let mut problems = Vec::new();
    let mut shared = 0;
    for (i, (kind, tables)) in files.iter().enumerate() {
        for (other, other_tables) in &files[i + 1..] {
            for (name, table) in tables {
                if let Some(theirs) = other_tables.get(name) {
                    shared += 1;
                    for d in differences(table, kind, theirs, other, true) {
                        problems.push(format!("`{name}`: {d}"));
                    }
                }
            }
        }
    }
    // decisions, account_totals (authorization store), executions (execution store).
    assert_eq!(shared, 3, "tables held by two kinds of file");
    assert!(
        problems.is_empty(),
        "a table differs between the SQLite files that hold it (declare it once, in \
         `storage::schema::layers`):\n{}",
        problems.join("\n")
    );
}

/// The registry's tables in SQLite and PostgreSQL, each dialect created by callid's own
/// migrations, compared: every difference must be listed in [`DIALECT_DIFFERENCES`], and every
/// listed one must still be there.
#[test]
fn the_registrys_sqlite_and_postgresql_schemas_agree() {
    let Some(cluster) = crate::storage::cluster::for_unit_test() else {
        return;
    };
    let url = PgUrl::parse(&cluster.url("callid")).expect("the cluster's URL");
    let mut client = url.connect().expect("a session");
    migrate(&mut client, &REGISTRY_PG).expect("the registry's PostgreSQL schema");
    let pg = pg_tables(&mut client);
    crate::storage::postgres::drop_off_runtime(client);

    let dir = tempfile::tempdir().unwrap();
    let conn = open_connection(
        &dir.path().join("registry.sqlite3"),
        &REGISTRY,
        Create::IfMissing,
    )
    .expect("the registry's SQLite schema");
    let sqlite = sqlite_tables(&conn);

    let mut found = Vec::new();
    for (name, table) in &sqlite {
        match pg.get(name) {
            Some(theirs) => found.extend(
                differences(table, "SQLite", theirs, "PostgreSQL", false)
                    .into_iter()
                    .map(|d| (name.clone(), d)),
            ),
            None => found.push((name.clone(), "table only in SQLite".to_owned())),
        }
    }
    for name in pg.keys().filter(|n| !sqlite.contains_key(*n)) {
        found.push((name.clone(), "table only in PostgreSQL".to_owned()));
    }
    let unlisted: Vec<String> = found
        .iter()
        .filter(|(t, d)| {
            !DIALECT_DIFFERENCES
                .iter()
                .any(|(lt, ld, _)| lt == t && ld == d)
        })
        .map(|(t, d)| format!("`{t}`: {d}"))
        .collect();
    let stale: Vec<String> = DIALECT_DIFFERENCES
        .iter()
        .filter(|(lt, ld, _)| !found.iter().any(|(t, d)| lt == t && ld == d))
        .map(|(t, d, _)| format!("`{t}`: {d}"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "the registry's SQLite and PostgreSQL schemas disagree (make them agree with a new \
         migration, or list the difference and why in `storage::schema::DIALECT_DIFFERENCES`):\n{}",
        unlisted.join("\n")
    );
    assert!(
        stale.is_empty(),
        "`DIALECT_DIFFERENCES` entries the schemas no longer show (remove them):\n{}",
        stale.join("\n")
    );
}

#[test]
fn predicates_read_alike_in_both_dialects() {
    assert_eq!(
        predicate_words("status IN ('pending', 'awaiting_approval')"),
        predicate_words("(status = ANY (ARRAY['pending'::text, 'awaiting_approval'::text]))")
    );
    assert_eq!(
        predicate_words("(status = 'pending' OR status = 'awaiting_approval')"),
        predicate_words("(status = ANY (ARRAY['pending'::text, 'awaiting_approval'::text]))")
    );
    assert_ne!(
        predicate_words("status IN ('pending')"),
        predicate_words("(status = ANY (ARRAY['pending'::text, 'in_doubt'::text]))")
    );
}

/// Where a test keeps its file of kind `spec` in `dir` (one per kind).
fn file_of(dir: &std::path::Path, spec: &StoreSpec) -> std::path::PathBuf {
    dir.join(format!("{}.sqlite3", spec.kind.replace(' ', "-")))
}

/// A file of kind `spec` as a build that knew only its first `version` migrations left it
/// (private, as callid makes its files).
fn file_at_version(
    path: &std::path::Path,
    spec: &StoreSpec,
    version: usize,
) -> rusqlite::Connection {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .unwrap();
    for sql in &spec.migrations[..version] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "application_id", spec.application_id)
        .unwrap();
    conn.pragma_update(None, "user_version", version as i64)
        .unwrap();
    conn
}

#[test]
fn a_ledger_of_the_build_before_keeps_its_charges_in_order_and_numbers_new_ones_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("provider-ledger.sqlite3");
    let old = file_at_version(&path, &LEDGER, 1);
    for key in ["k1", "k2", "k3"] {
        old.execute(
            r"INSERT INTO charges (charge_id, idempotency_key, request_fingerprint, amount_cents,
                model, response, created_at) VALUES (?1, ?2, 'f', 5, 'm', '{}', 't')",
            [format!("ch_{key}"), key.to_owned()],
        )
        .unwrap();
    }
    drop(old);
    let conn = open_connection(&path, &LEDGER, Create::Never).unwrap();
    conn.execute(
        r"INSERT INTO charges (charge_id, idempotency_key, request_fingerprint, amount_cents,
            model, response, created_at) VALUES ('ch_k4', 'k4', 'f', 5, 'm', '{}', 't')",
        [],
    )
    .unwrap();
    let rows: Vec<(i64, String)> = conn
        .prepare(r"SELECT seq, idempotency_key FROM charges ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<(i64, String)> = (1..=4).map(|i| (i, format!("k{i}"))).collect();
    assert_eq!(rows, want);
    // No counter of its own any more: a charge writes its row and its two unique keys.
    let counters: i64 = conn
        .query_row(
            r"SELECT count(*) FROM sqlite_sequence WHERE name = 'charges'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(counters, 0);
    let duplicate = conn.execute(
        r"INSERT INTO charges (charge_id, idempotency_key, request_fingerprint, amount_cents,
            model, response, created_at) VALUES ('ch_k5', 'k1', 'f', 5, 'm', '{}', 't')",
        [],
    );
    assert!(duplicate.is_err(), "an idempotency key is still unique");
}

#[test]
fn files_of_the_build_before_keep_their_decisions_and_lose_the_index_no_statement_uses() {
    let dir = tempfile::tempdir().unwrap();
    for (spec, version) in [(&REGISTRY, 6), (&AUTHORIZATION, 3)] {
        let path = file_of(dir.path(), spec);
        let old = file_at_version(&path, spec, version);
        old.execute(
            r"INSERT INTO decisions (agent_id, operation_key, decision_id, account, amount_cents,
                scope, request_hash, created_at, state, reserved_ms)
              VALUES ('a', 'op', 'd1', 'acct', 7, 's', 'h', 't', 'reserved', 1)",
            [],
        )
        .unwrap();
        drop(old);
        let conn = open_connection(&path, spec, Create::Never).unwrap();
        let indexes: Vec<String> = conn
            .prepare(r"SELECT name FROM pragma_index_list('decisions') ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !indexes.iter().any(|i| i == "decisions_by_account"),
            "{}: {indexes:?}",
            spec.kind
        );
        let kept: (String, i64) = conn
            .query_row(
                r"SELECT decision_id, amount_cents FROM decisions WHERE account = 'acct'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kept, ("d1".to_owned(), 7), "{}", spec.kind);
    }
}

/// Fails unless `sql`'s program decides everything with comparisons: SQLite builds a temporary
/// table (`OpenEphemeral`) for an `IN` list of more than two constants on every run of the
/// statement.
fn assert_no_temporary_table(conn: &rusqlite::Connection, sql: &str, file: &str) {
    let opcodes: Vec<String> = conn
        .prepare(&format!("EXPLAIN {sql}"))
        .unwrap()
        .query_map([], |r| r.get(1))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        !opcodes.iter().any(|op| op == "OpenEphemeral"),
        "{file}: {sql}: {opcodes:?}"
    );
}

#[test]
fn registries_of_the_build_before_keep_their_open_rows_indexed_without_a_temporary_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite3");
    let old = file_at_version(&path, &REGISTRY, 7);
    old.execute_batch(
        r"INSERT INTO operations (platform, installation_id, source_installation,
            harness_call_id, handle, operation_key, tool, request_hash, arguments, amount_cents,
            status, approval, created_ms, updated_ms)
          VALUES ('p', 'i', 's', 'c1', 'h1', 'k1', 't', 'r', '{}', 3, 'pending', 'none', 1, 1),
                 ('p', 'i', 's', 'c2', 'h2', 'k2', 't', 'r', '{}', 5, 'completed', 'none', 1, 1);",
    )
    .unwrap();
    drop(old);
    let conn = open_connection(&path, &REGISTRY, Create::Never).unwrap();
    // `INDEXED BY` fails unless the query's condition lets it read through the index (the
    // budget check's own condition is held to it in `spend::registry::sqlite`'s tests).
    let open: i64 = conn
        .query_row(
            "SELECT SUM(amount_cents) FROM operations INDEXED BY operations_open
             WHERE installation_id = 'i'
               AND (status = 'pending' OR status = 'awaiting_approval' OR status = 'in_doubt')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(open, 3);
    // A row's insert and its result's update decide its index entry with comparisons, not
    // through a temporary table built on every run of the statement.
    for sql in [
        r"INSERT INTO operations (platform, installation_id, source_installation,
            harness_call_id, handle, operation_key, tool, request_hash, arguments, amount_cents,
            status, approval, created_ms, updated_ms)
          VALUES ('p', 'i', 's', 'c3', 'h3', 'k3', 't', 'r', '{}', 3, 'pending', 'none', 1, 1)",
        "UPDATE operations SET status = 'completed', result = '{}' WHERE handle = 'h1'",
    ] {
        assert_no_temporary_table(&conn, sql, "registry");
    }
}

#[test]
fn decisions_rebuilt_with_their_state_compared_keep_every_row_total_and_trigger() {
    let dir = tempfile::tempdir().unwrap();
    for (spec, version) in [(&REGISTRY, 8), (&AUTHORIZATION, 4)] {
        let path = file_of(dir.path(), spec);
        let old = file_at_version(&path, spec, version);
        old.execute_batch(
            r"INSERT INTO decisions (agent_id, operation_key, decision_id, account, amount_cents,
                scope, request_hash, created_at, state, reserved_ms, charged_cents)
              VALUES ('a', 'k1', 'd1', 'acct', 7, 's', 'h', 't1', 'reserved', 1, NULL),
                     ('a', 'k2', 'd2', 'acct', 5, 's', 'h', 't2', 'dispatched', 2, NULL),
                     ('a', 'k3', 'd3', 'acct', 4, 's', 'h', 't3', 'charged', 3, 4),
                     ('a', 'k4', 'd4', 'acct', 9, 's', 'h', 't4', 'released', 4, NULL);",
        )
        .unwrap();
        let rows = |conn: &rusqlite::Connection| -> Vec<String> {
            conn.prepare(
                r"SELECT agent_id || operation_key || decision_id || account || amount_cents
                    || scope || request_hash || created_at || state || reserved_ms
                    || COALESCE(charged_cents, '-') FROM decisions ORDER BY decision_id",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        };
        let total = |conn: &rusqlite::Connection| -> i64 {
            conn.query_row(
                "SELECT charged_cents FROM account_totals WHERE account = 'acct'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let before = rows(&old);
        assert_eq!(total(&old), 4, "{}", spec.kind);
        drop(old);

        let conn = open_connection(&path, spec, Create::Never).unwrap();
        assert_eq!(rows(&conn), before, "{}", spec.kind);
        assert_eq!(total(&conn), 4, "{}", spec.kind);
        let leftovers: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_schema WHERE name LIKE '%decisions_before%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(leftovers, 0, "{}", spec.kind);
        // The totals' triggers live on the new table.
        conn.execute(
            "UPDATE decisions SET state = 'charged', charged_cents = 5 WHERE decision_id = 'd2'",
            [],
        )
        .unwrap();
        assert_eq!(total(&conn), 9, "{}", spec.kind);
        // The state is still checked, by comparisons rather than a temporary table.
        let refused = conn.execute(
            "UPDATE decisions SET state = 'lost' WHERE decision_id = 'd1'",
            [],
        );
        assert!(refused.is_err(), "{}", spec.kind);
        for sql in [
            r"INSERT INTO decisions (agent_id, operation_key, decision_id, account, amount_cents,
                scope, request_hash, created_at, state, reserved_ms)
              VALUES ('a', 'k5', 'd5', 'acct', 1, 's', 'h', 't5', 'reserved', 5)",
            "UPDATE decisions SET state = 'dispatched' WHERE decision_id = 'd1'",
        ] {
            assert_no_temporary_table(&conn, sql, spec.kind);
        }
        // A budget check still reads the open decisions through their index.
        let plan = crate::storage::sqlite::query_plan(
            &conn,
            "SELECT SUM(amount_cents) FROM decisions
             WHERE account = ?1 AND state IN ('reserved', 'dispatched')",
            ["acct"],
        );
        assert!(plan.contains("decisions_open"), "{}: {plan}", spec.kind);
    }
}
