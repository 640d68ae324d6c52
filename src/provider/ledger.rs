//! [`Ledger`]: the provider's durable record of charges, one per idempotency key.
//!
//! ## Durability
//! A charge is committed (WAL, `synchronous=FULL`) before its receipt is returned, so a receipt
//! that anyone has seen is on disk. The exact response body is stored with the charge, so a replay
//! is byte-identical to the first answer, across restarts.
//!
//! ## Concurrency
//! The look-up and the insert of one key run in one `IMMEDIATE` transaction, and
//! `idempotency_key` is `UNIQUE`: any number of concurrent requests with one key, from threads of
//! one process or from several processes on the same file, make exactly one charge.
//!
//! ## Compatibility
//! `application_id` `0x434c504c` ("CLPL"), `user_version` 1; its schema is [`LEDGER`], opened and
//! migrated by [`crate::storage::sqlite`].

use super::error::ProviderError;
use super::types::{ChargeOutcome, ChargeRecord, Image, ImageRequest, Receipt, validate_key};
use crate::storage::schema::LEDGER;
use crate::storage::sqlite::{Cached as _, Store};
use rusqlite::{OptionalExtension as _, params};
use sha2::{Digest as _, Sha256};
use std::path::Path;
use std::sync::Arc;

/// The provider's durable ledger. Cheap to clone; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Arc<Store>,
}

impl Ledger {
    /// Opens the ledger at `path`, creating it (`0600`) when it does not exist.
    ///
    /// A file that is not a callid provider ledger, or comes from a newer callid, is refused and
    /// left unmodified.
    pub fn open(path: &Path) -> Result<Ledger, ProviderError> {
        Ok(Ledger {
            store: Arc::new(Store::open(path, &LEDGER)?),
        })
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    /// Charges `req` once under `key` (blocking).
    ///
    /// First use of `key`: prices the request, records one charge and returns its receipt. The
    /// same key with the same request: the original receipt, `replayed: true`, no new charge. The
    /// same key with another request: [`ProviderError::KeyReused`], nothing charged.
    pub fn charge(&self, key: &str, req: &ImageRequest) -> Result<ChargeOutcome, ProviderError> {
        self.charge_with_body(key, req).map(|(outcome, _)| outcome)
    }

    /// [`Ledger::charge`], also returning the exact response body to send.
    pub(crate) fn charge_with_body(
        &self,
        key: &str,
        req: &ImageRequest,
    ) -> Result<(ChargeOutcome, String), ProviderError> {
        validate_key(key)?;
        let amount = req.validate()?;
        let fingerprint = req.fingerprint();
        let sql = |e| ProviderError::from(self.store.error(e));
        let (body, replayed) = self.store.write(|tx| {
            let existing: Option<(String, String)> = tx
                .row(
                    "SELECT request_fingerprint, response FROM charges WHERE idempotency_key = ?1",
                    [key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(sql)?;
            if let Some((stored, body)) = existing {
                return if stored == fingerprint {
                    Ok((body, true))
                } else {
                    Err(ProviderError::KeyReused)
                };
            }
            let created_at: String = tx
                .row("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')", [], |r| {
                    r.get(0)
                })
                .map_err(sql)?;
            let receipt = new_receipt(req, amount, &fingerprint, created_at);
            let body = serde_json::to_string(&receipt).expect("a receipt always serializes");
            tx.exec(
                "INSERT INTO charges (charge_id, idempotency_key, request_fingerprint, \
                 amount_cents, model, response, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    receipt.charge_id,
                    key,
                    fingerprint,
                    amount as i64,
                    receipt.model,
                    body,
                    receipt.created_at
                ],
            )
            .map_err(sql)?;
            Ok((body, false))
        })?;
        let receipt: Receipt = serde_json::from_str(&body).map_err(|e| {
            ProviderError::from(
                self.store
                    .error(crate::storage::sqlite::other_error(format!(
                        "stored receipt is not valid: {e}"
                    ))),
            )
        })?;
        Ok((ChargeOutcome { receipt, replayed }, body))
    }

    /// Every charge, oldest first (blocking).
    pub fn charges(&self) -> Result<Vec<ChargeRecord>, ProviderError> {
        self.store.read(|conn| {
            let sql = |e| ProviderError::from(self.store.error(e));
            let mut stmt = conn
                .prepare_cached(
                    "SELECT charge_id, idempotency_key, amount_cents, model, created_at \
                     FROM charges ORDER BY seq",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(ChargeRecord {
                        charge_id: r.get(0)?,
                        idempotency_key: r.get(1)?,
                        amount_cents: r.get::<_, i64>(2)? as u64,
                        model: r.get(3)?,
                        created_at: r.get(4)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql)
        })
    }

    /// How many charges the ledger holds (blocking).
    pub fn charge_count(&self) -> Result<u64, ProviderError> {
        self.store.read(|conn| {
            conn.query_row("SELECT count(*) FROM charges", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(|e| ProviderError::from(self.store.error(e)))
        })
    }
}

fn new_receipt(req: &ImageRequest, amount: u64, fingerprint: &str, created_at: String) -> Receipt {
    let image_id = format!("img_{}", uuid::Uuid::new_v4().simple());
    // The provider stands in for an image vendor and renders no pixels; the digest names the
    // image it would have rendered, bound to this request and this image id.
    let mut h = Sha256::new();
    h.update(b"callid-provider-image:v1\0");
    h.update(image_id.as_bytes());
    h.update([0]);
    h.update(fingerprint.as_bytes());
    Receipt {
        charge_id: format!("ch_{}", uuid::Uuid::new_v4().simple()),
        amount_cents: amount,
        model: req.model.clone(),
        image: Image {
            id: image_id,
            width: req.width,
            height: req.height,
            sha256: crate::canonical::hex(&h.finalize()),
        },
        created_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        (dir, ledger)
    }

    #[test]
    fn first_use_charges_replay_returns_original_other_request_is_refused() {
        let (_dir, ledger) = ledger();
        let req = ImageRequest::new("origami fox");
        let (first, body1) = ledger.charge_with_body("k1", &req).unwrap();
        assert!(!first.replayed);
        assert_eq!(first.receipt.amount_cents, 3);
        assert_eq!(first.receipt.model, "flux-schnell");
        assert!(first.receipt.charge_id.starts_with("ch_"));
        assert_eq!(first.receipt.image.sha256.len(), 64);
        let (again, body2) = ledger.charge_with_body("k1", &req).unwrap();
        assert!(again.replayed);
        assert_eq!(again.receipt, first.receipt);
        assert_eq!(body1, body2);

        let mut other = req.clone();
        other.prompt.push('!');
        assert!(matches!(
            ledger.charge("k1", &other),
            Err(ProviderError::KeyReused)
        ));
        let second = ledger.charge("k2", &req).unwrap();
        assert!(!second.replayed);
        assert_ne!(second.receipt.charge_id, first.receipt.charge_id);
        assert_eq!(ledger.charge_count().unwrap(), 2);
        let records = ledger.charges().unwrap();
        assert_eq!(
            records
                .iter()
                .map(|r| r.idempotency_key.as_str())
                .collect::<Vec<_>>(),
            ["k1", "k2"]
        );
    }

    #[test]
    fn refusals_charge_nothing() {
        let (_dir, ledger) = ledger();
        let mut bad_model = ImageRequest::new("x");
        bad_model.model = "nope".into();
        assert_eq!(
            ledger.charge("k", &bad_model).unwrap_err().code(),
            "unknown_model"
        );
        assert_eq!(
            ledger
                .charge("bad key", &ImageRequest::new("x"))
                .unwrap_err()
                .code(),
            "invalid_idempotency_key"
        );
        assert_eq!(ledger.charge_count().unwrap(), 0);
    }

    #[test]
    fn charges_survive_reopening() {
        let (dir, ledger) = ledger();
        let first = ledger.charge("k", &ImageRequest::new("x")).unwrap();
        drop(ledger);
        let reopened = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        let again = reopened.charge("k", &ImageRequest::new("x")).unwrap();
        assert!(again.replayed);
        assert_eq!(again.receipt, first.receipt);
        assert_eq!(reopened.charge_count().unwrap(), 1);
    }

    #[test]
    fn thirty_two_concurrent_charges_with_one_key_make_one_charge() {
        let (dir, ledger) = ledger();
        let req = ImageRequest::new("fox");
        let barrier = std::sync::Barrier::new(32);
        let outcomes: Vec<ChargeOutcome> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..32)
                .map(|i| {
                    // Half share the pool, half open their own handle on the file, as separate
                    // processes would.
                    let ledger = if i % 2 == 0 {
                        ledger.clone()
                    } else {
                        Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap()
                    };
                    let (req, barrier) = (&req, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        ledger.charge("same-key", req).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(ledger.charge_count().unwrap(), 1);
        assert_eq!(outcomes.iter().filter(|o| !o.replayed).count(), 1);
        assert!(outcomes.iter().all(|o| o.receipt == outcomes[0].receipt));
    }
}
