//! The authorization layer (the article's Hubu): [`Authorization`] records one decision per
//! (agent, operation key) and checks the account's budget.
//!
//! ## Guarantee
//! An identical retry under an operation key returns the same decision (same `decision_id`) and
//! reserves nothing more. The same key with a different amount, account, scope or request hash is
//! refused with `create_new_operation`: one key can never be pointed at other work. A decision is
//! only recorded when the account's budget covers it; budget check and record are one `IMMEDIATE`
//! transaction, so concurrent spends cannot overdraw it.
//!
//! ## Budget
//! Each decision holds part of its account's budget, by its state:
//! - `reserved` (authorized, the provider not called yet): its amount, until the reservation
//!   expires ([`Authorization::with_reservation_expiry`], the policy's
//!   `reservation_expiry_seconds`); an expired reservation holds nothing.
//! - `dispatched` (the provider was called, or may have been): its amount, for good, until the
//!   outcome is known, since the provider may have charged; a redelivery of the operation settles it.
//! - `charged`: what the provider's receipt says it charged, even above the authorized amount, so
//!   the budget never undercounts a real charge (and refuses further spends once it is used up).
//! - `released` (the provider refused): nothing.
//!
//! An identical retry of a released or expired decision reserves it again, checking the budget
//! again first.
//!
//! ## Replicas
//! Router replicas on a PostgreSQL registry keep their decisions there instead
//! ([`Authorization::shared`], [`super::shared`]), and open no local file: same rules, one set
//! of decisions and one budget for every replica, the check and record serialized per account
//! by an advisory lock.
//!
//! ## Durability
//! A decision and its `dispatched` mark are committed before the provider is called: the backend
//! records a new decision and marks it in one transaction
//! ([`Authorization::authorize_for_dispatch`], one commit), and the crash point
//! [`Boundary::AfterAuthorization`](crate::crashpoint::Boundary::AfterAuthorization) sits right
//! after that commit.
//!
//! ## Compatibility
//! `application_id` `0x434c4155` ("CLAU"), `user_version` 3 (3 adds the running total of charges);
//! its schema is [`AUTHORIZATION`], opened and migrated by [`crate::storage::sqlite`]. Decisions
//! recorded by version 1 are `dispatched`.

use super::error::BackendError;
use super::rules::{AuthorizationRequest, Decision, decision_id, lapsed};
use crate::storage::schema::layers::AUTHORIZATION;
use crate::storage::sqlite::{Cached as _, Store, StoreError};
use rusqlite::{OptionalExtension as _, params};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a reservation whose provider call never started holds its budget by default.
pub const DEFAULT_RESERVATION_EXPIRY: Duration = Duration::from_secs(3600);

/// The authorization store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Authorization {
    /// The SQLite file of the decisions; `None` when they live in `shared`.
    store: Option<Arc<Store>>,
    expiry_ms: i64,
    /// When set (router replicas on PostgreSQL), every decision lives there instead, and no
    /// local file is opened.
    shared: Option<Arc<super::shared::SharedState>>,
}

fn now_ms() -> i64 {
    crate::clock::now_ms()
}

impl Authorization {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Authorization, StoreError> {
        Ok(Authorization {
            store: Some(Arc::new(Store::open(path, &AUTHORIZATION)?)),
            expiry_ms: DEFAULT_RESERVATION_EXPIRY.as_millis() as i64,
            shared: None,
        })
    }

    /// The layer with its `decisions` table in another file's `store` (the router's SQLite
    /// registry, whose migrations create the table: see [`crate::storage::schema::layers`]), so that its
    /// steps can share that file's transactions.
    pub fn in_store(store: Arc<Store>) -> Authorization {
        Authorization {
            store: Some(store),
            expiry_ms: DEFAULT_RESERVATION_EXPIRY.as_millis() as i64,
            shared: None,
        }
    }

    /// The layer with its decisions in the registry's PostgreSQL database, shared by every
    /// router replica (see [`super::shared`]): no local file is opened, so a replica needs no
    /// writable disk for it.
    pub fn shared(shared: Arc<super::shared::SharedState>) -> Authorization {
        Authorization {
            store: None,
            expiry_ms: DEFAULT_RESERVATION_EXPIRY.as_millis() as i64,
            shared: Some(shared),
        }
    }

    /// The replicas' shared database this layer keeps its decisions in, if it does.
    pub(super) fn shared_state(&self) -> Option<&Arc<super::shared::SharedState>> {
        self.shared.as_ref()
    }

    /// The local file (see `shared::local`).
    fn local(&self) -> Result<&Arc<Store>, BackendError> {
        super::shared::local(&self.store, &self.shared, "authorization")
    }

    /// SQLite's `cause`, named by the local file.
    fn sql_error(&self, cause: rusqlite::Error) -> BackendError {
        super::shared::sql_error(&self.store, &self.shared, "authorization", cause)
    }

    /// This store with reservations that expire after `expiry` (see the module's Budget).
    pub fn with_reservation_expiry(mut self, expiry: Duration) -> Authorization {
        self.expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// How long a reservation whose provider call never started holds budget, in ms.
    pub(super) fn expiry_ms(&self) -> i64 {
        self.expiry_ms
    }

    fn check_budget(
        &self,
        tx: &rusqlite::Connection,
        req: &AuthorizationRequest<'_>,
    ) -> Result<(), BackendError> {
        let Some(budget) = req.budget_cents else {
            return Ok(());
        };
        let spent =
            spent_in(tx, req.account, now_ms(), self.expiry_ms).map_err(|e| self.sql_error(e))?;
        let remaining = budget.saturating_sub(spent);
        if req.amount_cents > remaining {
            return Err(BackendError::BudgetExceeded {
                account: req.account.to_owned(),
                amount_cents: req.amount_cents,
                budget_cents: budget,
                remaining_cents: remaining,
            });
        }
        Ok(())
    }

    /// Marks a decision `dispatched` before its provider call; `true` when it was `reserved`
    /// (no provider call had started for it before).
    #[cfg(test)]
    pub fn mark_dispatched(&self, decision_id: &str) -> Result<bool, BackendError> {
        self.set_state(decision_id, "dispatched", &["reserved"])
            .map(|n| n == 1)
    }

    /// Undoes the `dispatched` mark ([`Self::authorize_for_dispatch`]) after a provider call that
    /// surely never reached the provider (it could not connect): the decision is `reserved`
    /// again, and expires.
    pub fn mark_not_sent(&self, decision_id: &str) -> Result<(), BackendError> {
        self.set_state(decision_id, "reserved", &["dispatched"])
            .map(|_| ())
    }

    /// Releases a decision the provider refused: it holds no budget any more.
    pub fn release(&self, decision_id: &str) -> Result<(), BackendError> {
        self.set_state(decision_id, "released", &["reserved", "dispatched"])
            .map(|_| ())
    }

    /// Records what the provider charged for a decision; the budget counts this amount from now.
    pub fn record_charge(&self, decision_id: &str, charged_cents: u64) -> Result<(), BackendError> {
        if let Some(shared) = &self.shared {
            return shared.record_charge(decision_id, charged_cents);
        }
        self.local()?
            .write(|tx| self.record_charge_in(tx, decision_id, charged_cents))
    }

    /// [`Authorization::record_charge`] inside the caller's transaction `conn` (on the file this
    /// layer's table lives in), committed with it.
    pub(super) fn record_charge_in(
        &self,
        conn: &rusqlite::Connection,
        decision_id: &str,
        charged_cents: u64,
    ) -> Result<(), BackendError> {
        conn.exec(
            "UPDATE decisions SET state = 'charged', charged_cents = ?2 WHERE decision_id = ?1",
            params![decision_id, charged_cents as i64],
        )
        .map(|_| ())
        .map_err(|e| self.sql_error(e))
    }

    fn set_state(&self, decision_id: &str, to: &str, from: &[&str]) -> Result<usize, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.set_state(decision_id, to, from).map(|n| n as usize);
        }
        let sql = |e| self.sql_error(e);
        let from = from
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ");
        self.local()?.write(|tx| {
            tx.exec(
                &format!(
                    "UPDATE decisions SET state = ?2 WHERE decision_id = ?1 AND state IN ({from})"
                ),
                params![decision_id, to],
            )
            .map_err(sql)
        })
    }

    /// The state of a decision (`reserved`, `dispatched`, `charged`, `released`), if recorded.
    #[cfg(test)]
    pub fn state(&self, decision_id: &str) -> Result<Option<String>, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.state(decision_id);
        }
        self.local()?.read(|conn| {
            conn.query_row(
                "SELECT state FROM decisions WHERE decision_id = ?1",
                [decision_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.sql_error(e))
        })
    }

    /// Returns the decision for `req.operation_key`, recording it first if there is none
    /// (blocking). See the module's guarantee.
    #[cfg(test)]
    pub fn authorize(&self, req: &AuthorizationRequest<'_>) -> Result<Decision, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.authorize(req, now_ms(), self.expiry_ms);
        }
        self.local()?.write(|tx| self.authorize_in(tx, req))
    }

    /// Returns the decision for `req.operation_key`, recording it first if there is none, and
    /// marks it `dispatched`, in one transaction (one commit): the decision, and whether it was
    /// `reserved` (no provider call had started for it before). The crash point after the authorization sits after this commit.
    pub fn authorize_for_dispatch(
        &self,
        req: &AuthorizationRequest<'_>,
    ) -> Result<(Decision, bool), BackendError> {
        if let Some(shared) = &self.shared {
            let decision = shared.authorize(req, now_ms(), self.expiry_ms)?;
            let first = shared.set_state(&decision.decision_id, "dispatched", &["reserved"])? == 1;
            return Ok((decision, first));
        }
        self.local()?.write(|tx| self.dispatch_in(tx, req))
    }

    /// [`Authorization::authorize_for_dispatch`] inside the caller's transaction `conn` (on the
    /// file this layer's table lives in), committed with it.
    pub(super) fn dispatch_in(
        &self,
        conn: &rusqlite::Connection,
        req: &AuthorizationRequest<'_>,
    ) -> Result<(Decision, bool), BackendError> {
        let decision = self.authorize_in(conn, req)?;
        let first = conn
            .exec(
                "UPDATE decisions SET state = 'dispatched' \
                 WHERE decision_id = ?1 AND state = 'reserved'",
                [&decision.decision_id],
            )
            .map_err(|e| self.sql_error(e))?
            == 1;
        Ok((decision, first))
    }

    fn authorize_in(
        &self,
        tx: &rusqlite::Connection,
        req: &AuthorizationRequest<'_>,
    ) -> Result<Decision, BackendError> {
        let sql = |e| self.sql_error(e);
        {
            let existing = tx
                .row(
                    "SELECT decision_id, account, amount_cents, scope, request_hash, created_at, \
                     state, reserved_ms FROM decisions WHERE agent_id = ?1 AND operation_key = ?2",
                    [req.agent_id, req.operation_key],
                    |r| {
                        Ok((
                            Decision {
                                decision_id: r.get(0)?,
                                account: r.get(1)?,
                                amount_cents: r.get::<_, i64>(2)? as u64,
                                scope: r.get(3)?,
                                request_hash: r.get(4)?,
                                created_at: r.get(5)?,
                                newly_recorded: false,
                            },
                            r.get::<_, String>(6)?,
                            r.get::<_, i64>(7)?,
                        ))
                    },
                )
                .optional()
                .map_err(sql)?;
            if let Some((decision, state, reserved_ms)) = existing {
                let differs = decision.differs_from(req);
                return if differs.is_empty() {
                    let now = now_ms();
                    if lapsed(&state, reserved_ms, self.expiry_ms, now) {
                        self.check_budget(tx, req)?;
                        tx.exec(
                            "UPDATE decisions SET state = 'reserved', reserved_ms = ?2 \
                             WHERE decision_id = ?1",
                            params![decision.decision_id, now],
                        )
                        .map_err(sql)?;
                    }
                    Ok(decision)
                } else {
                    Err(BackendError::CreateNewOperation {
                        differs: differs.join(", "),
                    })
                };
            }
            self.check_budget(tx, req)?;
            let decision = Decision {
                decision_id: decision_id(req.agent_id, req.operation_key),
                account: req.account.to_owned(),
                amount_cents: req.amount_cents,
                scope: req.scope.to_owned(),
                request_hash: req.request_hash.to_owned(),
                created_at: tx
                    .row("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')", [], |r| {
                        r.get(0)
                    })
                    .map_err(sql)?,
                newly_recorded: true,
            };
            tx.exec(
                "INSERT INTO decisions (agent_id, operation_key, decision_id, account, \
                 amount_cents, scope, request_hash, created_at, state, reserved_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'reserved', ?9)",
                params![
                    req.agent_id,
                    req.operation_key,
                    decision.decision_id,
                    decision.account,
                    decision.amount_cents as i64,
                    decision.scope,
                    decision.request_hash,
                    decision.created_at,
                    now_ms(),
                ],
            )
            .map_err(sql)?;
            Ok(decision)
        }
    }

    /// Cents of `account`'s budget held by its decisions (charged, dispatched, or reserved and
    /// not expired), blocking.
    pub fn spent_cents(&self, account: &str) -> Result<u64, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.spent_cents(account, now_ms(), self.expiry_ms);
        }
        self.local()?.read(|conn| {
            spent_in(conn, account, now_ms(), self.expiry_ms).map_err(|e| self.sql_error(e))
        })
    }

    /// How many decisions are recorded (blocking).
    #[cfg(test)]
    pub fn decision_count(&self) -> Result<u64, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.decision_count();
        }
        self.local()?.read(|conn| {
            conn.query_row("SELECT count(*) FROM decisions", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(|e| self.sql_error(e))
        })
    }
}

const SPENT: &str =
    "SELECT COALESCE((SELECT charged_cents FROM account_totals WHERE account = ?1), 0)
    + COALESCE((SELECT SUM(CASE
        WHEN state = 'reserved' AND reserved_ms + ?3 <= ?2 THEN 0
        ELSE amount_cents END)
      FROM decisions WHERE account = ?1 AND state IN ('reserved', 'dispatched')), 0)";

/// Cents of `account`'s budget held at `now_ms` (see the module's Budget): its running total of
/// charges ([`crate::storage::schema::layers::LAYER_TOTALS`]) and its open decisions, read
/// through the index of open decisions, so the cost does not grow with the decisions settled
/// before.
fn spent_in(
    conn: &rusqlite::Connection,
    account: &str,
    now_ms: i64,
    expiry_ms: i64,
) -> rusqlite::Result<u64> {
    conn.row(SPENT, params![account, now_ms, expiry_ms], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(key: &'a str) -> AuthorizationRequest<'a> {
        AuthorizationRequest {
            agent_id: "agent",
            operation_key: key,
            account: "acct",
            amount_cents: 3,
            scope: "generate_image:flux-schnell:1024x1024",
            request_hash: "sha256:aa",
            budget_cents: None,
        }
    }

    fn store() -> (tempfile::TempDir, Authorization) {
        let dir = tempfile::tempdir().unwrap();
        let auth = Authorization::open(&dir.path().join("authorization.sqlite3")).unwrap();
        (dir, auth)
    }

    #[test]
    fn identical_retry_returns_the_same_decision() {
        let (dir, auth) = store();
        let first = auth.authorize(&request("k")).unwrap();
        assert!(first.newly_recorded);
        let again = auth.authorize(&request("k")).unwrap();
        assert!(!again.newly_recorded);
        assert_eq!(again.decision_id, first.decision_id);
        drop(auth);
        let reopened = Authorization::open(&dir.path().join("authorization.sqlite3")).unwrap();
        assert_eq!(
            reopened.authorize(&request("k")).unwrap().decision_id,
            first.decision_id
        );
        assert_eq!(reopened.decision_count().unwrap(), 1);
        assert_eq!(reopened.spent_cents("acct").unwrap(), 3);
    }

    #[test]
    fn same_key_with_other_work_is_create_new_operation() {
        let (_dir, auth) = store();
        let key = "hubu:operation:v1:codex:0b5f";
        auth.authorize(&request(key)).unwrap();
        type Edit = fn(&mut AuthorizationRequest<'static>);
        let cases: [(&str, Edit); 5] = [
            ("amount", |r| r.amount_cents = 5),
            ("account", |r| r.account = "other"),
            ("scope", |r| r.scope = "generate_image:flux-pro:1024x1024"),
            ("request", |r| r.request_hash = "sha256:bb"),
            ("account, amount", |r| {
                r.account = "other";
                r.amount_cents = 25;
            }),
        ];
        for (differs, edit) in cases {
            let mut r = request(key);
            edit(&mut r);
            let err = auth.authorize(&r).unwrap_err();
            assert_eq!(err.code(), "create_new_operation");
            assert!(
                matches!(&err, BackendError::CreateNewOperation { differs: d } if d == differs),
                "{err:?}"
            );
            assert!(!format!("{err} {err:?}").contains("hubu:operation"));
        }
        assert_eq!(auth.decision_count().unwrap(), 1);
        // A different agent's identical key is its own operation.
        let mut other_agent = request(key);
        other_agent.agent_id = "agent-2";
        assert!(auth.authorize(&other_agent).unwrap().newly_recorded);
    }

    #[test]
    fn budget_refuses_what_is_not_left_and_records_nothing() {
        let (_dir, auth) = store();
        let with_budget = |key: &'static str, amount: u64| AuthorizationRequest {
            amount_cents: amount,
            budget_cents: Some(10),
            ..request(key)
        };
        auth.authorize(&with_budget("a", 3)).unwrap();
        auth.authorize(&with_budget("b", 5)).unwrap();
        let err = auth.authorize(&with_budget("c", 3)).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::BudgetExceeded {
                    amount_cents: 3,
                    budget_cents: 10,
                    remaining_cents: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(auth.decision_count().unwrap(), 2);
        // A retry of an authorized decision is not charged against the budget again.
        assert!(!auth.authorize(&with_budget("b", 5)).unwrap().newly_recorded);
        auth.authorize(&with_budget("d", 2)).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 10);
    }

    #[test]
    fn budget_counts_each_decision_by_its_state() {
        let (_dir, auth) = store();
        let with_budget = |key: &'static str| AuthorizationRequest {
            budget_cents: Some(10),
            ..request(key)
        };
        let refused = auth.authorize(&with_budget("refused")).unwrap();
        assert!(auth.mark_dispatched(&refused.decision_id).unwrap());
        assert!(!auth.mark_dispatched(&refused.decision_id).unwrap());
        auth.release(&refused.decision_id).unwrap();
        let charged = auth.authorize(&with_budget("charged")).unwrap();
        auth.mark_dispatched(&charged.decision_id).unwrap();
        auth.record_charge(&charged.decision_id, 7).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 7);
        // The refused decision's retry reserves it again, through the budget check.
        assert_eq!(
            auth.authorize(&with_budget("refused")).unwrap().decision_id,
            refused.decision_id
        );
        assert_eq!(
            auth.state(&refused.decision_id).unwrap().unwrap(),
            "reserved"
        );
        assert_eq!(auth.spent_cents("acct").unwrap(), 10);
        assert_eq!(
            auth.authorize(&with_budget("more")).unwrap_err().code(),
            "budget_exceeded"
        );
        auth.release(&refused.decision_id).unwrap();
        // An overcharge is counted whole, and refuses every further spend.
        auth.record_charge(&charged.decision_id, 500).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 500);
        let err = auth.authorize(&with_budget("refused")).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::BudgetExceeded {
                    remaining_cents: 0,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// What a sum over every decision of `account` gives (the definition in the module's
    /// Budget), to hold the running total against.
    fn spent_by_every_decision(auth: &Authorization, account: &str) -> u64 {
        auth.local()
            .unwrap()
            .read(|conn| {
                conn.query_row(
                    "SELECT COALESCE(SUM(CASE state
                         WHEN 'charged' THEN charged_cents
                         WHEN 'released' THEN 0
                         WHEN 'reserved' THEN
                             CASE WHEN reserved_ms + ?3 <= ?2 THEN 0 ELSE amount_cents END
                         ELSE amount_cents END), 0)
                     FROM decisions WHERE account = ?1",
                    params![account, now_ms(), auth.expiry_ms],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(|e| auth.sql_error(e))
            })
            .unwrap() as u64
    }

    #[test]
    fn the_running_total_agrees_with_every_decision_and_is_all_a_check_reads() {
        let (_dir, auth) = store();
        for i in 0..40u64 {
            let key = format!("k{i}");
            let d = auth
                .authorize(&AuthorizationRequest {
                    amount_cents: i % 7,
                    ..request(&key)
                })
                .unwrap();
            if i % 4 != 0 {
                auth.mark_dispatched(&d.decision_id).unwrap();
            }
            match i % 4 {
                1 => auth.record_charge(&d.decision_id, i % 5).unwrap(),
                2 => auth.release(&d.decision_id).unwrap(),
                3 => {
                    // Charged twice (a redelivery settling again): the last amount counts.
                    auth.record_charge(&d.decision_id, 9).unwrap();
                    auth.record_charge(&d.decision_id, i % 3).unwrap();
                }
                _ => {}
            }
            assert_eq!(
                auth.spent_cents("acct").unwrap(),
                spent_by_every_decision(&auth, "acct"),
                "after decision {i}"
            );
        }
        assert_eq!(auth.spent_cents("other").unwrap(), 0);
        let plan = auth
            .local()
            .unwrap()
            .read(|conn| {
                Ok::<_, BackendError>(crate::storage::sqlite::query_plan(
                    conn,
                    SPENT,
                    params!["acct", 0, 0],
                ))
            })
            .unwrap();
        assert!(plan.contains("decisions_open"), "{plan}");
        assert!(!plan.contains("decisions_by_account"), "{plan}");
    }

    #[test]
    fn a_version_2_file_counts_its_charges_after_the_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authorization.sqlite3");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(AUTHORIZATION.migrations[0]).unwrap();
            conn.execute_batch(AUTHORIZATION.migrations[1]).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {}; PRAGMA user_version = 2;
                 INSERT INTO decisions (agent_id, operation_key, decision_id, account,
                     amount_cents, scope, request_hash, created_at, state, reserved_ms,
                     charged_cents)
                 VALUES ('a', 'k1', 'd1', 'acct', 3, 's', 'h', 't', 'charged', 0, 4),
                        ('a', 'k2', 'd2', 'acct', 3, 's', 'h', 't', 'dispatched', 0, NULL),
                        ('a', 'k3', 'd3', 'acct', 3, 's', 'h', 't', 'released', 0, NULL);",
                AUTHORIZATION.application_id
            ))
            .unwrap();
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let auth = Authorization::open(&path).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 7);
        auth.record_charge("d2", 1).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 5);
    }

    #[test]
    fn reservations_never_sent_expire_and_dispatched_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Authorization::open(&dir.path().join("authorization.sqlite3"))
            .unwrap()
            .with_reservation_expiry(Duration::ZERO);
        let never_sent = auth.authorize(&request("never-sent")).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 0);
        let sent = auth.authorize(&request("sent")).unwrap();
        auth.mark_dispatched(&sent.decision_id).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 3);
        let unreachable = auth.authorize(&request("unreachable")).unwrap();
        auth.mark_dispatched(&unreachable.decision_id).unwrap();
        auth.mark_not_sent(&unreachable.decision_id).unwrap();
        assert_eq!(auth.spent_cents("acct").unwrap(), 3);
        // A lapsed reservation is taken again only within the budget.
        let tight = AuthorizationRequest {
            budget_cents: Some(5),
            ..request("never-sent")
        };
        let err = auth.authorize(&tight).unwrap_err();
        assert_eq!(err.code(), "budget_exceeded");
        let roomy = AuthorizationRequest {
            budget_cents: Some(6),
            ..request("never-sent")
        };
        assert_eq!(
            auth.authorize(&roomy).unwrap().decision_id,
            never_sent.decision_id
        );
        assert_eq!(auth.decision_count().unwrap(), 3);
    }

    #[test]
    fn concurrent_budget_reservations_never_overdraw() {
        let (dir, auth) = store();
        let path = dir.path().join("authorization.sqlite3");
        let keys: Vec<String> = (0..32).map(|i| format!("key-{i}")).collect();
        let barrier = std::sync::Barrier::new(32);
        let granted = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .iter()
                .enumerate()
                .map(|(i, key)| {
                    let auth = if i % 2 == 0 {
                        auth.clone()
                    } else {
                        Authorization::open(&path).unwrap()
                    };
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        auth.authorize(&AuthorizationRequest {
                            budget_cents: Some(30),
                            ..request(key)
                        })
                        .is_ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|ok| *ok)
                .count()
        });
        assert_eq!(granted, 10);
        assert_eq!(auth.spent_cents("acct").unwrap(), 30);
    }
}
