//! Preallocated operation keys: an operator-filled SQLite pool the router claims keys from.
//!
//! [`KeyPool`] is a small SQLite file (`callid router keys FILE --count N` creates or fills it)
//! with one row per key. With `--preallocated-keys FILE`, a new operation claims one unclaimed key
//! instead of generating one, and only Codex `callId` identities may start new operations (the
//! article's rule); redeliveries of recorded operations need no key and work for every platform.
//!
//! # Guarantees
//! - A key is claimed in an IMMEDIATE transaction and marked with the claiming handle before the
//!   router records the operation, so no key is ever given to two operations. A crash between
//!   the claim and the registry row wastes one key, never reuses it.
//! - An empty pool fails closed: no key, no operation.
//! - Keys are claimed oldest first, each claim through the index of unclaimed keys
//!   (`keys_unclaimed`, migration 2): its cost does not grow with the keys claimed before (a
//!   pool with 190,000 of 200,000 keys claimed: 6 ms per claim without it, 2 µs with it).
//! - The file is opened, identified, protected (0600) and migrated by [`crate::storage::sqlite`],
//!   like the registry: it holds private keys. A newer pool is refused untouched, never
//!   downgraded. Its schema is [`KEY_POOL`].

use crate::keys::OperationKey;
use crate::storage::schema::KEY_POOL;
use crate::storage::sqlite::{self, Cached as _, Create, StoreError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::path::{Path, PathBuf};

/// The next key to claim: the oldest unclaimed one, through `keys_unclaimed`.
const NEXT_UNCLAIMED: &str =
    "SELECT operation_key FROM keys WHERE claimed_by IS NULL ORDER BY rowid LIMIT 1";

/// Why the pool cannot give a key.
#[derive(Debug, thiserror::Error)]
pub enum KeyPoolError {
    /// The file cannot be created, opened, identified or migrated (see [`crate::storage::sqlite`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// SQLite refused.
    #[error("preallocated key database `{path}` failed while {doing}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What was being done.
        doing: &'static str,
        /// The cause.
        #[source]
        source: rusqlite::Error,
    },
    /// No unclaimed key left.
    #[error(
        "preallocated key database `{path}` has no unclaimed key left; nothing was dispatched: an \
         operator adds keys with `callid router keys {path} --count N`"
    )]
    Exhausted {
        /// The file.
        path: PathBuf,
    },
}

/// An open key pool.
#[derive(Debug)]
pub struct KeyPool {
    conn: Connection,
    path: PathBuf,
}

impl KeyPool {
    /// Opens (creating if absent, mode 0600) the pool at `path`; see [`crate::storage::sqlite`].
    pub fn open(path: &Path) -> Result<KeyPool, KeyPoolError> {
        Ok(KeyPool {
            conn: sqlite::open_connection(path, &KEY_POOL, Create::IfMissing)?,
            path: path.to_path_buf(),
        })
    }

    /// Adds `count` fresh random keys `<prefix>codex:<uuid>`; returns how many are unclaimed now.
    pub fn fill(&mut self, count: u32, prefix: &str) -> Result<u64, KeyPoolError> {
        let path = self.path.clone();
        let err = |doing| {
            let path = path.clone();
            move |source| KeyPoolError::Sqlite {
                path,
                doing,
                source,
            }
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err("adding keys"))?;
        for _ in 0..count {
            let key = OperationKey::generate(prefix, "codex");
            tx.exec(
                "INSERT INTO keys (operation_key) VALUES (?1)",
                [key.expose()],
            )
            .map_err(err("adding keys"))?;
        }
        tx.commit().map_err(err("adding keys"))?;
        self.unclaimed()
    }

    /// How many keys are still unclaimed.
    pub fn unclaimed(&self) -> Result<u64, KeyPoolError> {
        self.conn
            .query_row(
                "SELECT count(*) FROM keys WHERE claimed_by IS NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(|source| KeyPoolError::Sqlite {
                path: self.path.clone(),
                doing: "counting keys",
                source,
            })
    }

    /// Claims one unclaimed key for the operation with public handle `handle`.
    pub fn claim(&mut self, handle: &str) -> Result<OperationKey, KeyPoolError> {
        let path = self.path.clone();
        let err = |source| KeyPoolError::Sqlite {
            path: path.clone(),
            doing: "claiming a key",
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let key: Option<String> = tx
            .row(NEXT_UNCLAIMED, [], |r| r.get(0))
            .optional()
            .map_err(err)?;
        let Some(key) = key else {
            return Err(KeyPoolError::Exhausted { path });
        };
        tx.exec(
            "UPDATE keys SET claimed_by = ?2, claimed_ms = ?3 WHERE operation_key = ?1",
            params![key, handle, crate::clock::now_ms()],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(OperationKey::from_stored(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_the_next_unclaimed_key_from_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = KeyPool::open(&dir.path().join("keys.sqlite3")).unwrap();
        pool.fill(5, "hubu:operation:v1:").unwrap();
        let order: Vec<String> = pool
            .conn
            .prepare("SELECT operation_key FROM keys ORDER BY rowid")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        // Oldest first, whatever was claimed before.
        for (i, expected) in order.iter().enumerate() {
            assert_eq!(pool.claim(&format!("h{i}")).unwrap().expose(), expected);
        }
        let plan = sqlite::query_plan(&pool.conn, NEXT_UNCLAIMED, []);
        assert!(plan.contains("keys_unclaimed"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }

    #[test]
    fn claims_each_key_once_then_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.sqlite3");
        let mut pool = KeyPool::open(&path).unwrap();
        let journal: String = pool
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal", "the pool is opened like every store");
        assert_eq!(pool.fill(2, "hubu:operation:v1:").unwrap(), 2);
        let a = pool.claim("h1").unwrap();
        let b = pool.claim("h2").unwrap();
        assert_ne!(a, b);
        assert!(a.expose().starts_with("hubu:operation:v1:codex:"));
        assert!(matches!(
            pool.claim("h3"),
            Err(KeyPoolError::Exhausted { .. })
        ));
        drop(pool);
        let pool = KeyPool::open(&path).unwrap();
        assert_eq!(pool.unclaimed().unwrap(), 0);
    }
}
