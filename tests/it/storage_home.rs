//! Storage has one home (issue #24, item 4): outside `src/storage/`, no product code opens a
//! database, connects to PostgreSQL by itself, or declares or migrates a schema; all of that is
//! `callid::storage`'s (its `schema`, `sqlite` and `postgres` modules).
//!
//! Read from the source of every `.rs` file under `src/` but `src/storage/` and `src/bench/`
//! (the benchmarks' raw baselines measure SQLite and PostgreSQL without callid), each up to its
//! test module (`#[cfg(test)] mod …`, last in a file by the house's habit), `tests.rs` files
//! left out: a test builds an old file by hand on purpose. Code is judged without comments and
//! literals ([`code_only`]); SQL is judged in string literals only.

use crate::common::rust_source::{Piece, code_only, rust_files, scan};
use std::path::Path;

const OPEN_SQLITE: &str =
    "opens a SQLite file: go through `storage::sqlite` (`Store::open`, `open_connection`)";
const CONNECT: &str = "connects to PostgreSQL: go through `storage::postgres::PgUrl::connect`";
const SCHEMA: &str = "declares or changes a schema: declare it in `storage::schema`";
const MIGRATES: &str =
    "migrates a file: `storage::sqlite::migrate` and `storage::postgres::migrate` do";

/// What code outside storage must not hold, and what to do instead.
const IN_CODE: &[(&str, &str)] = &[
    ("Connection::open", OPEN_SQLITE),
    ("postgres::Config", CONNECT),
    ("NoTls", CONNECT),
    ("tokio_postgres::connect", CONNECT),
];

/// What SQL outside storage must not hold, and what to do instead.
const IN_SQL: &[(&str, &str)] = &[
    ("CREATE TABLE", SCHEMA),
    ("ALTER TABLE", SCHEMA),
    ("DROP TABLE", SCHEMA),
    ("CREATE INDEX", SCHEMA),
    ("DROP INDEX", SCHEMA),
    ("CREATE TRIGGER", SCHEMA),
    ("CREATE FUNCTION", SCHEMA),
    ("ATTACH DATABASE", OPEN_SQLITE),
    ("user_version =", MIGRATES),
    ("application_id =", MIGRATES),
];

/// `source` up to its test module.
fn product_part(source: &str) -> &str {
    let mut at = 0;
    let mut lines = source.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with("mod "))
        {
            return &source[..at];
        }
        at += line.len();
    }
    source
}

#[test]
fn nothing_outside_storage_opens_a_database_or_declares_a_schema() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(files.len() > 50, "too few files read: {}", files.len());
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        if rel.starts_with("storage") || rel.starts_with("bench") || rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let product = product_part(&text);
        let code = code_only(product);
        for (needle, fix) in IN_CODE {
            if code.contains(needle) {
                found.push(format!("src/{}: `{needle}` {fix}", rel.display()));
            }
        }
        for piece in scan(product) {
            if let Piece::Str(lit) = piece {
                let sql = lit.body.to_ascii_uppercase();
                for (needle, fix) in IN_SQL {
                    if sql.contains(&needle.to_ascii_uppercase()) {
                        found.push(format!(
                            "src/{}:{}: `{needle}` {fix}",
                            rel.display(),
                            lit.line
                        ));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "storage outside `src/storage/`:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_what_it_refuses_and_skips_the_test_module() {
    let source = "fn open() { let c = rusqlite::Connection::open(p); c.execute(\"ALTER TABLE x\") }\n\
                  #[cfg(test)]\nmod tests {\n    fn t() { Connection::open(\"CREATE TABLE t\") }\n}\n";
    let product = product_part(source);
    assert!(code_only(product).contains("Connection::open"));
    assert!(product.contains("ALTER TABLE"));
    assert!(!product.contains("CREATE TABLE"));
}
