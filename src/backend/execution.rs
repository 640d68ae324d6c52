//! The execution layer (the article's Gongbu): [`Execution`] makes the provider call for an
//! authorization decision, at most once.
//!
//! ## Guarantee
//! Each decision gets one provider idempotency key, derived from the decision id
//! ([`provider_key`]) and never from the operation key, so a decision can lead to at most one
//! charge. A decision goes `dispatched` (committed before the provider is called) then
//! `completed` (with the provider's receipt). A retry of a completed decision returns the stored
//! receipt without calling the provider; a retry of a dispatched one calls the provider again with
//! the same key, and the provider answers with the original charge. Within one process, concurrent
//! executions of one decision are single-flight: the later ones wait and read the result.
//!
//! ## Durability
//! Both states are committed before the layer moves on. The crash point
//! [`Boundary::AfterProviderCharge`] sits
//! between the provider's answer and the `completed` commit: the case the derived key exists for.
//!
//! ## Replicas
//! Router replicas on a PostgreSQL registry keep their executions there instead
//! ([`Execution::shared`], [`super::shared`]), so a replica that continues another's
//! operation finds its `dispatched` record (same provider key) or its receipt. The in-process
//! single flight still holds per replica; across replicas the registry's lease decides.
//!
//! ## Compatibility
//! `application_id` `0x434c4558` ("CLEX"), `user_version` 1; its schema is [`EXECUTION`], opened
//! and migrated by [`crate::storage::sqlite`].

use super::error::BackendError;
use super::rules::{Begin, Executed, provider_key};
use crate::crashpoint::{self, Boundary};
use crate::provider::{ChargeOutcome, ImageRequest, ProviderApi, Receipt};
use crate::storage::schema::layers::EXECUTION;
use crate::storage::sqlite::{Cached as _, Store, StoreError};
use rusqlite::{OptionalExtension as _, params};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One `executions` row as `begin` reads it.
struct Row {
    request: String,
    state: String,
    attempts: i64,
    receipt: Option<String>,
    provider_replayed: Option<i64>,
}

/// The execution store. Cheap to clone; clones share the single-flight map.
#[derive(Clone)]
pub struct Execution {
    /// The SQLite file of the executions; `None` when they live in `shared`.
    store: Option<Arc<Store>>,
    in_flight: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// When set (router replicas on PostgreSQL), executions live there instead, and no local
    /// file is opened.
    shared: Option<Arc<super::shared::SharedState>>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("store", &self.store.as_ref().map(|s| s.path()))
            .finish_non_exhaustive()
    }
}

impl Execution {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Execution, StoreError> {
        Ok(Execution {
            store: Some(Arc::new(Store::open(path, &EXECUTION)?)),
            in_flight: Arc::default(),
            shared: None,
        })
    }

    /// The layer with its `executions` table in another file's `store` (the router's SQLite
    /// registry, whose migrations create the table: see [`crate::storage::schema::layers`]), so that its
    /// steps can share that file's transactions.
    pub fn in_store(store: Arc<Store>) -> Execution {
        Execution {
            store: Some(store),
            in_flight: Arc::default(),
            shared: None,
        }
    }

    /// The layer with its executions in the registry's PostgreSQL database, shared by every
    /// router replica (see [`super::shared`]): no local file is opened, so a replica needs no
    /// writable disk for it.
    pub fn shared(shared: Arc<super::shared::SharedState>) -> Execution {
        Execution {
            store: None,
            in_flight: Arc::default(),
            shared: Some(shared),
        }
    }

    /// The local file (see `shared::local`).
    fn local(&self) -> Result<&Arc<Store>, BackendError> {
        super::shared::local(&self.store, &self.shared, "execution")
    }

    /// SQLite's `cause`, named by the local file.
    fn sql_error(&self, cause: rusqlite::Error) -> BackendError {
        super::shared::sql_error(&self.store, &self.shared, "execution", cause)
    }

    /// Runs the provider call of `decision_id` for `req`, at most once (see the module's
    /// guarantee).
    pub async fn execute(
        &self,
        decision_id: &str,
        req: &ImageRequest,
        provider: &dyn ProviderApi,
    ) -> Result<Executed, BackendError> {
        let gate = self.gate(decision_id);
        let result = {
            let _turn = gate.lock().await;
            self.execute_alone(decision_id, req, provider).await
        };
        drop(gate);
        self.release(decision_id);
        result
    }

    fn gate(&self, decision_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(decision_id.to_owned()).or_default().clone()
    }

    fn release(&self, decision_id: &str) {
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(decision_id)
            .is_some_and(|gate| Arc::strong_count(gate) == 1)
        {
            map.remove(decision_id);
        }
    }

    async fn execute_alone(
        &self,
        decision_id: &str,
        req: &ImageRequest,
        provider: &dyn ProviderApi,
    ) -> Result<Executed, BackendError> {
        let key = match self
            .blocking({
                let (id, req) = (decision_id.to_owned(), req.clone());
                move |this| this.begin(&id, &req)
            })
            .await?
        {
            Begin::Done(executed) => return Ok(executed),
            Begin::Dispatch { key } => key,
        };
        let outcome = call_provider(&key, req, provider).await?;
        let id = decision_id.to_owned();
        self.blocking(move |this| this.complete(&id, &outcome.receipt, outcome.replayed))
            .await
    }

    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Execution) -> Result<R, BackendError> + Send + 'static,
    ) -> Result<R, BackendError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(|join| {
                let cause = format!("execution task failed: {join}");
                match (&self.store, &self.shared) {
                    (Some(store), _) => {
                        BackendError::from(store.error(crate::storage::sqlite::other_error(cause)))
                    }
                    (None, Some(shared)) => BackendError::SharedStateUnavailable {
                        url: shared.url_redacted(),
                        doing: "running an execution step",
                        cause,
                    },
                    (None, None) => {
                        self.sql_error(crate::storage::sqlite::other_error(String::new()))
                    }
                }
            })?
    }

    fn begin(&self, decision_id: &str, req: &ImageRequest) -> Result<Begin, BackendError> {
        let request = Self::recorded_request(req);
        if let Some(shared) = &self.shared {
            return shared.begin_execution(decision_id, &request);
        }
        self.local()?
            .write(|tx| self.begin_in(tx, decision_id, &request))
    }

    /// The recorded request of `req`: what was asked for, without the maximum (a condition on
    /// the charge, fixed by the decision; as version 1 recorded it).
    pub(super) fn recorded_request(req: &ImageRequest) -> String {
        let asked = ImageRequest {
            max_amount_cents: None,
            ..req.clone()
        };
        serde_json::to_string(&asked).expect("an ImageRequest always serializes")
    }

    /// [`Execution`]'s begin step inside the caller's transaction `tx` (on the file this
    /// layer's table lives in), committed with it: `dispatched` is recorded (or its attempt
    /// counted) before the caller calls the provider.
    pub(super) fn begin_in(
        &self,
        tx: &rusqlite::Connection,
        decision_id: &str,
        request: &str,
    ) -> Result<Begin, BackendError> {
        let sql = |e| self.sql_error(e);
        {
            let row: Option<Row> = tx
                .row(
                    "SELECT request, state, attempts, receipt, provider_replayed \
                     FROM executions WHERE decision_id = ?1",
                    [decision_id],
                    |r| {
                        Ok(Row {
                            request: r.get(0)?,
                            state: r.get(1)?,
                            attempts: r.get(2)?,
                            receipt: r.get(3)?,
                            provider_replayed: r.get(4)?,
                        })
                    },
                )
                .optional()
                .map_err(sql)?;
            let key = provider_key(decision_id);
            match row {
                None => {
                    tx.exec(
                        "INSERT INTO executions (decision_id, provider_key, request, state, \
                         attempts, dispatched_at) VALUES (?1, ?2, ?3, 'dispatched', 1, \
                         strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                        params![decision_id, key, request],
                    )
                    .map_err(sql)?;
                    Ok(Begin::Dispatch { key })
                }
                Some(row) if row.request != request => Err(BackendError::CreateNewOperation {
                    differs: "request".into(),
                }),
                Some(Row {
                    state,
                    attempts,
                    receipt: Some(receipt),
                    provider_replayed,
                    ..
                }) if state == "completed" => {
                    let receipt = serde_json::from_str(&receipt).map_err(|e| {
                        sql(crate::storage::sqlite::other_error(format!(
                            "stored receipt of a decision does not parse: {e}"
                        )))
                    })?;
                    Ok(Begin::Done(Executed {
                        receipt,
                        provider_replayed: provider_replayed == Some(1),
                        from_record: true,
                        attempts: attempts as u64,
                    }))
                }
                Some(_) => {
                    tx.exec(
                        "UPDATE executions SET attempts = attempts + 1 WHERE decision_id = ?1",
                        [decision_id],
                    )
                    .map_err(sql)?;
                    Ok(Begin::Dispatch { key })
                }
            }
        }
    }

    fn complete(
        &self,
        decision_id: &str,
        receipt: &Receipt,
        replayed: bool,
    ) -> Result<Executed, BackendError> {
        if let Some(shared) = &self.shared {
            return shared.complete_execution(decision_id, receipt, replayed);
        }
        self.local()?
            .write(|tx| self.complete_in(tx, decision_id, receipt, replayed))
    }

    /// The `completed` step inside the caller's transaction `tx` (on the file this layer's table
    /// lives in), committed with it.
    pub(super) fn complete_in(
        &self,
        tx: &rusqlite::Connection,
        decision_id: &str,
        receipt: &Receipt,
        replayed: bool,
    ) -> Result<Executed, BackendError> {
        let sql = |e| self.sql_error(e);
        let text = serde_json::to_string(receipt).expect("a receipt always serializes");
        {
            // Another process may have completed the same decision meanwhile: the first record
            // wins (the provider gave both the same receipt anyway).
            tx.exec(
                "UPDATE executions SET state = 'completed', receipt = ?2, provider_replayed = ?3, \
                 completed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') \
                 WHERE decision_id = ?1 AND state = 'dispatched'",
                params![decision_id, text, replayed as i64],
            )
            .map_err(sql)?;
            let (stored, stored_replayed, attempts): (String, i64, i64) = tx
                .row(
                    "SELECT receipt, provider_replayed, attempts FROM executions \
                     WHERE decision_id = ?1",
                    [decision_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .map_err(sql)?;
            let receipt = serde_json::from_str(&stored).map_err(|e| {
                sql(crate::storage::sqlite::other_error(format!(
                    "stored receipt of a decision does not parse: {e}"
                )))
            })?;
            Ok(Executed {
                receipt,
                provider_replayed: stored_replayed == 1,
                from_record: false,
                attempts: attempts as u64,
            })
        }
    }
}

/// The provider call of a begun execution (`dispatched` committed) under its provider key: what
/// the provider answered, not yet recorded. The crash point between the charge and its record
/// sits here, for every caller.
pub(super) async fn call_provider(
    key: &str,
    req: &ImageRequest,
    provider: &dyn ProviderApi,
) -> Result<ChargeOutcome, BackendError> {
    let outcome = provider
        .create_image(key, req)
        .await
        .map_err(BackendError::from_provider)?;
    crashpoint::hit(Boundary::AfterProviderCharge);
    Ok(outcome)
}
