//! The layers behind the router: authorization and execution, each idempotent on its own, in
//! front of the provider. [`Backend`] is the facade the router calls.
//!
//! A retried spend has to pass three independent checks that all agree it is the same call:
//! 1. [`authorization`] (the article's Hubu) keeps one decision per (agent, operation key) and
//!    refuses the same key for other work with `create_new_operation`; it holds the budgets.
//! 2. [`execution`] (Gongbu) keys the provider call to the decision id, with a provider
//!    idempotency key derived from it, so one decision leads to at most one charge.
//! 3. The [`crate::provider`] charges once per idempotency key.
//!
//! One bug in one layer does not become a double charge: each layer dedupes on its own key, in
//! durable tables of its own. Where they live:
//! - [`Backend::open`]: each layer in its own file in the state directory,
//!   `authorization.sqlite3` and `execution.sqlite3` (the library default, used by
//!   [`Backend::spend`]); with [`BackendConfig::shared_state`], in the replicas' PostgreSQL
//!   database instead, with no local file.
//! - [`Backend::open_in`]: both layers' tables in a host SQLite file (the router's registry,
//!   whose migrations include them: [`crate::storage::schema::layers`]); with
//!   [`BackendConfig::shared_state`], in the replicas' PostgreSQL database. Their steps then join the caller's transactions
//!   ([`LayerTx`]): [`Backend::prepare_in`] commits the decision and the `dispatched`
//!   execution with the registry's new row, [`Backend::dispatch`] calls the provider, and
//!   [`Backend::settle_in`] commits the receipt and the charge with the registry's result.
//!   The layers stay separate steps, each on its own key; only the commit is shared.
//!
//! The in-process provider's ledger is always its own file, `provider-ledger.sqlite3`. Every
//! schema of these files (and of the PostgreSQL tables) is declared in
//! [`crate::storage::schema`]. The records and rules both storages of a layer apply (the SQLite
//! files and the replicas' PostgreSQL state in [`shared`]) are one file, `rules`, below both.
//!
//! # Guarantee
//! [`Backend::spend`], and [`Backend::prepare_in`] (or [`Backend::prepare`]) then
//! [`Backend::dispatch`] then [`Backend::settle_in`], under one operation key charge at most
//! once, whatever the number of retries, concurrent calls, crashes and restarts, and every
//! successful answer for that key carries the same receipt: nothing is sent to the provider
//! before the decision and the `dispatched` execution are committed, and a crash before the
//! settlement's commit leaves a `dispatched` execution that the next attempt sends again under
//! the same provider key. Nothing it returns (receipts, errors, messages) contains the
//! operation key.
//!
//! # Money
//! The provider is sent the authorized amount as `max_amount_cents` (a compliant provider refuses
//! to charge more). Whatever the receipt says was charged is what the budget is debited by, even
//! above the authorization (the receipt then carries [`SpendReceipt::authorized_cents`] below
//! its `amount_cents`, and the router marks the operation). A provider refusal releases the
//! decision's reservation; see [`authorization`] for reservations that are never settled.

pub(crate) mod authorization;
mod error;
mod execution;
mod rules;
pub(crate) mod shared;

pub(crate) use authorization::Authorization;
pub use error::BackendError;
pub(crate) use execution::Execution;
pub use rules::provider_key;
pub(crate) use rules::{AuthorizationRequest, Decision};

use rules::Begin;

use crate::canonical::RequestHash;
use crate::crashpoint::{self, Boundary};
use crate::keys::OperationKey;
use crate::provider::{self, Image, ImageRequest, Ledger, ProviderApi, Receipt};
use crate::storage::schema::layers;
use crate::storage::sqlite::{Store, StoreSpec};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the authorization store in the state directory.
pub const AUTHORIZATION_FILE: &str = "authorization.sqlite3";
/// File name of the execution store in the state directory.
pub const EXECUTION_FILE: &str = "execution.sqlite3";
/// File name of the in-process provider's ledger in the state directory.
pub const PROVIDER_LEDGER_FILE: &str = "provider-ledger.sqlite3";

pub use crate::storage::LayerTx;

/// Suffix given to a layer's own file once its rows were copied into the file that hosts the
/// layers now (kept as a backup, never read again).
pub const IMPORTED_SUFFIX: &str = ".imported";

/// Where the provider is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderTarget {
    /// In this process, with its ledger at `<state_dir>/provider-ledger.sqlite3`.
    InProcess,
    /// Over HTTP (a `callid provider` or anything that keeps its contract).
    Http {
        /// Its URL (e.g. `http://127.0.0.1:8080`) and token, redacted when shown.
        endpoint: provider::Endpoint,
    },
}

/// Who spends, from which account, within which budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// The agent the authorization layer records decisions for (the router installation).
    pub agent_id: String,
    /// The account that pays.
    pub account: String,
    /// The account's budget in cents; `None` is unlimited.
    pub budget_cents: Option<u64>,
    /// How long a reservation whose provider call never started holds budget.
    pub reservation_expiry: std::time::Duration,
    /// The registry's PostgreSQL database, when the router runs as replicas on one: the
    /// authorization decisions (and so the budget) and the executions live there, shared by
    /// every replica, and the layers open no local file (only an in-process provider's ledger
    /// is local).
    pub shared_state: Option<crate::storage::postgres::PgUrl>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            agent_id: "callid-router".into(),
            account: "default".into(),
            budget_cents: None,
            reservation_expiry: authorization::DEFAULT_RESERVATION_EXPIRY,
            shared_state: None,
        }
    }
}

/// What a completed spend returns. Contains no operation key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendReceipt {
    /// The authorization decision.
    pub decision_id: String,
    /// The provider's charge.
    pub charge_id: String,
    /// What was charged, in cents (the provider's receipt).
    pub amount_cents: u64,
    /// What was authorized (and sent to the provider as the maximum), in cents.
    pub authorized_cents: u64,
    /// The model charged for.
    pub model: String,
    /// The image.
    pub image: Image,
    /// When the provider recorded the charge (RFC 3339, UTC).
    pub charged_at: String,
    /// Whether the provider's recorded answer was a replay of an earlier charge (a retry after a
    /// crash between the charge and its record).
    pub provider_replayed: bool,
}

/// An account's budget and what is reserved of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetStatus {
    /// The account.
    pub account: String,
    /// The budget, `None` when unlimited.
    pub budget_cents: Option<u64>,
    /// Cents reserved by authorized decisions.
    pub spent_cents: u64,
}

/// The backend facade: quote, then spend under a private operation key. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

struct Inner {
    state_dir: PathBuf,
    /// The file hosting both layers' tables, when it is shared ([`Backend::open_in`]).
    host: Option<Arc<Store>>,
    /// The PostgreSQL database of router replicas, where both layers' tables live.
    shared: Option<Arc<shared::SharedState>>,
    config: BackendConfig,
    authorization: Authorization,
    execution: Execution,
    provider: Arc<dyn ProviderApi>,
    ledger: Option<Ledger>,
    provider_description: String,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("state_dir", &self.inner.state_dir)
            .field("config", &self.inner.config)
            .field("provider", &self.inner.provider_description)
            .finish()
    }
}

impl Backend {
    /// Opens (creating when needed) the backend state in `state_dir`, and the provider.
    pub fn open(
        state_dir: &Path,
        provider: ProviderTarget,
        config: BackendConfig,
    ) -> Result<Backend, BackendError> {
        let (provider, ledger, description) = Self::provider(state_dir, provider)?;
        Self::assemble(state_dir, provider, ledger, description, config)
    }

    /// Opens the backend state in `state_dir` in front of any provider implementation (the unit
    /// tests' scripted providers).
    #[cfg(test)]
    pub(crate) fn with_provider(
        state_dir: &Path,
        provider: Arc<dyn ProviderApi>,
        config: BackendConfig,
    ) -> Result<Backend, BackendError> {
        Self::assemble(state_dir, provider, None, "custom provider".into(), config)
    }

    fn assemble(
        state_dir: &Path,
        provider: Arc<dyn ProviderApi>,
        ledger: Option<Ledger>,
        provider_description: String,
        config: BackendConfig,
    ) -> Result<Backend, BackendError> {
        // Replicas keep the layers' records in their shared database: no local file at all.
        let (authorization, execution) = match &config.shared_state {
            Some(url) => {
                let shared = Arc::new(shared::SharedState::new(url.clone()));
                (
                    Authorization::shared(shared.clone()),
                    Execution::shared(shared),
                )
            }
            None => (
                Authorization::open(&state_dir.join(AUTHORIZATION_FILE))?,
                Execution::open(&state_dir.join(EXECUTION_FILE))?,
            ),
        };
        Self::assemble_layers(
            state_dir,
            (authorization, execution, None),
            provider,
            ledger,
            provider_description,
            config,
        )
    }

    /// Opens the backend with the authorization and execution tables in the SQLite file at
    /// `host` (of kind `spec`, whose migrations include the layers' tables,
    /// [`crate::storage::schema::layers::LAYER_TABLES`]): the router's registry, so that a new
    /// operation's row, its decision and its `dispatched` execution are one commit
    /// ([`Backend::prepare_in`]) and its result, receipt and charge another
    /// ([`Backend::settle_in`]). The layers stay separate steps, each idempotent on its own key;
    /// only their file is shared. The ledger of an in-process provider keeps its own file in
    /// `state_dir`.
    ///
    /// A state directory that still holds the layers' own files (`authorization.sqlite3`,
    /// `execution.sqlite3`, from an earlier callid) has their rows copied into `host` first,
    /// in one transaction (rows already there win), then each file is renamed with
    /// [`IMPORTED_SUFFIX`]: nothing a decision reserved is forgotten. A corrupt, foreign or newer
    /// file there is refused like any backend state file.
    pub fn open_in(
        host: &Path,
        spec: &'static StoreSpec,
        state_dir: &Path,
        provider: ProviderTarget,
        config: BackendConfig,
    ) -> Result<Backend, BackendError> {
        let store = Arc::new(Store::open(host, spec)?);
        import_own_files(&store, state_dir)?;
        let layers = (
            Authorization::in_store(store.clone()),
            Execution::in_store(store.clone()),
            Some(store),
        );
        let (provider, ledger, description) = Self::provider(state_dir, provider)?;
        Self::assemble_layers(state_dir, layers, provider, ledger, description, config)
    }

    #[allow(clippy::type_complexity)]
    fn provider(
        state_dir: &Path,
        target: ProviderTarget,
    ) -> Result<(Arc<dyn ProviderApi>, Option<Ledger>, String), BackendError> {
        Ok(match target {
            ProviderTarget::InProcess => {
                let ledger = Ledger::open(&state_dir.join(PROVIDER_LEDGER_FILE))
                    .map_err(BackendError::from_provider)?;
                let description = format!("in-process ledger `{}`", ledger.path().display());
                (Arc::new(ledger.clone()), Some(ledger), description)
            }
            ProviderTarget::Http { endpoint } => {
                let client =
                    provider::Client::connect(endpoint).map_err(BackendError::from_provider)?;
                let description = format!("`{}`", client.base_url());
                (Arc::new(client), None, description)
            }
        })
    }

    fn assemble_layers(
        state_dir: &Path,
        (mut authorization, mut execution, host): (Authorization, Execution, Option<Arc<Store>>),
        provider: Arc<dyn ProviderApi>,
        ledger: Option<Ledger>,
        provider_description: String,
        config: BackendConfig,
    ) -> Result<Backend, BackendError> {
        // One connection pool for both layers and the backend's own transactions.
        let mut shared = authorization.shared_state().cloned();
        if shared.is_none()
            && let Some(url) = &config.shared_state
        {
            let state = Arc::new(shared::SharedState::new(url.clone()));
            authorization = Authorization::shared(state.clone());
            execution = Execution::shared(state.clone());
            shared = Some(state);
        }
        let authorization = authorization.with_reservation_expiry(config.reservation_expiry);
        Ok(Backend {
            inner: Arc::new(Inner {
                state_dir: state_dir.to_path_buf(),
                host,
                shared,
                authorization,
                execution,
                config,
                provider,
                ledger,
                provider_description,
            }),
        })
    }

    /// The in-process provider's ledger, when the provider runs in this process.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.inner.ledger.as_ref()
    }

    /// The price of `req` in cents, from the provider's price table; refuses requests the
    /// provider would refuse (`unknown_model`, `invalid_request`).
    pub(crate) fn quote(&self, req: &ImageRequest) -> Result<u64, BackendError> {
        req.validate().map_err(BackendError::from_provider)
    }

    /// The authorization scope of `req`: `generate_image:<model>:<width>x<height>`.
    pub(crate) fn scope(req: &ImageRequest) -> String {
        format!("generate_image:{}:{}x{}", req.model, req.width, req.height)
    }

    /// The configured account's budget and what is reserved of it.
    pub async fn budget(&self) -> Result<BudgetStatus, BackendError> {
        let this = self.clone();
        let spent = tokio::task::spawn_blocking(move || {
            this.inner
                .authorization
                .spent_cents(&this.inner.config.account)
        })
        .await
        .map_err(join_error)??;
        Ok(BudgetStatus {
            account: self.inner.config.account.clone(),
            budget_cents: self.inner.config.budget_cents,
            spent_cents: spent,
        })
    }

    /// Authorizes, then executes, the spend `req` under the private operation key `key`.
    ///
    /// Call it again with the same key, request and hash after any failure or crash: it answers
    /// with the same decision and, once charged, the same receipt, and never charges twice.
    pub async fn spend(
        &self,
        key: &OperationKey,
        req: &ImageRequest,
        hash: &RequestHash,
    ) -> Result<SpendReceipt, BackendError> {
        let amount = self.quote(req)?;
        let decision = {
            let this = self.clone();
            let key = key.expose().to_owned();
            let scope = Self::scope(req);
            let hash = hash.as_str().to_owned();
            tokio::task::spawn_blocking(move || {
                let config = &this.inner.config;
                this.inner
                    .authorization
                    .authorize_for_dispatch(&AuthorizationRequest {
                        agent_id: &config.agent_id,
                        operation_key: &key,
                        account: &config.account,
                        amount_cents: amount,
                        scope: &scope,
                        request_hash: &hash,
                        budget_cents: config.budget_cents,
                    })
            })
            .await
            .map_err(join_error)??
        };
        // The decision and its `dispatched` mark are one commit.
        let (decision, first_call) = decision;
        if decision.newly_recorded {
            crashpoint::hit(Boundary::AfterAuthorization);
        }
        let mut sent = req.clone();
        sent.max_amount_cents = Some(decision.amount_cents);
        let executed = match self
            .inner
            .execution
            .execute(&decision.decision_id, &sent, self.inner.provider.as_ref())
            .await
        {
            Ok(executed) => executed,
            Err(err) => {
                self.settle_failure(&decision.decision_id, first_call, &err)
                    .await;
                return Err(err);
            }
        };
        let charged = executed.receipt.amount_cents;
        {
            let id = decision.decision_id.clone();
            self.authorization(move |a| a.record_charge(&id, charged))
                .await?;
        }
        tracing::debug!(
            decision_id = %decision.decision_id,
            from_record = executed.from_record,
            provider_replayed = executed.provider_replayed,
            attempts = executed.attempts,
            "spend completed"
        );
        Ok(self.receipt(decision, executed.receipt, executed.provider_replayed))
    }
}

/// What the layers committed before a dispatch: the decision (with its `dispatched` mark) and
/// the execution's `dispatched` record. From [`Backend::prepare_in`] or [`Backend::prepare`];
/// [`Backend::dispatch`] takes it to the provider.
#[derive(Debug)]
pub struct Prepared {
    decision: Decision,
    first_call: bool,
    begin: Begin,
    sent: ImageRequest,
}

impl Prepared {
    /// The decision this dispatch spends under.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

/// What the layers record once the provider answered: the execution's receipt and the charge
/// the budget counts. [`Backend::settle_in`] writes it in the caller's transaction.
#[derive(Debug, Clone)]
pub struct Settlement {
    decision_id: String,
    receipt: Receipt,
    replayed: bool,
}

impl Backend {
    /// Whether both layers' tables live in the caller's database (a host SQLite file,
    /// [`Backend::open_in`], or the replicas' PostgreSQL database), so that their steps can
    /// join the caller's transactions ([`LayerTx`]).
    pub fn hosted(&self) -> bool {
        self.inner.host.is_some() || self.inner.shared.is_some()
    }

    /// The layers' steps before a dispatch of `req` under `key`, inside the caller's
    /// transaction `conn` on the host file ([`Backend::open_in`]), committed with it: the
    /// decision (budget checked, or the existing one for this key) marked `dispatched`, and the
    /// execution's `dispatched` record under its provider key. Nothing is sent anywhere.
    ///
    /// # Panics
    /// Never; on a backend that is not hosted it answers a store error, and the caller falls
    /// back to [`Backend::prepare`].
    pub fn prepare_in(
        &self,
        tx: LayerTx<'_, '_>,
        key: &OperationKey,
        req: &ImageRequest,
        hash: &RequestHash,
    ) -> Result<Prepared, BackendError> {
        let amount = self.quote(req)?;
        let config = &self.inner.config;
        let scope = Self::scope(req);
        let ask = AuthorizationRequest {
            agent_id: &config.agent_id,
            operation_key: key.expose(),
            account: &config.account,
            amount_cents: amount,
            scope: &scope,
            request_hash: hash.as_str(),
            budget_cents: config.budget_cents,
        };
        let request = Execution::recorded_request(req);
        let (decision, first_call, begin) = match (tx, &self.inner.shared) {
            (LayerTx::Postgres(tx), Some(shared)) => {
                let expiry = self.inner.authorization.expiry_ms();
                shared.prepare_in(tx, &ask, &request, crate::clock::now_ms(), expiry)?
            }
            (LayerTx::Sqlite(conn), None) => {
                let (decision, first) = self.inner.authorization.dispatch_in(conn, &ask)?;
                let begin = self
                    .inner
                    .execution
                    .begin_in(conn, &decision.decision_id, &request)?;
                (decision, first, begin)
            }
            _ => return Err(self.no_host()),
        };
        let mut sent = req.clone();
        sent.max_amount_cents = Some(decision.amount_cents);
        Ok(Prepared {
            decision,
            first_call,
            begin,
            sent,
        })
    }

    /// [`Backend::prepare_in`] in a transaction of its own on the host file (a redelivery that
    /// continues a recorded operation: there is no registry write to join).
    pub async fn prepare(
        &self,
        key: &OperationKey,
        req: &ImageRequest,
        hash: &RequestHash,
    ) -> Result<Prepared, BackendError> {
        let this = self.clone();
        let (key, req, hash) = (key.clone(), req.clone(), hash.clone());
        tokio::task::spawn_blocking(move || match (&this.inner.host, &this.inner.shared) {
            (Some(host), _) => {
                host.write(|tx| this.prepare_in(LayerTx::Sqlite(tx), &key, &req, &hash))
            }
            (None, Some(shared)) => shared.in_transaction("recording an authorization", |tx| {
                this.prepare_in(LayerTx::Postgres(tx), &key, &req, &hash)
            }),
            (None, None) => Err(this.no_host()),
        })
        .await
        .map_err(join_error)?
    }

    /// Sends a prepared spend to the provider (or answers the execution's recorded receipt):
    /// the receipt, and the [`Settlement`] to commit with the caller's record of the result.
    /// A refusal releases the decision's reservation, and a call that surely never reached the
    /// provider makes it `reserved` again (each its own commit, as in [`Backend::spend`]).
    pub async fn dispatch(
        &self,
        prepared: Prepared,
    ) -> Result<(SpendReceipt, Settlement), BackendError> {
        let Prepared {
            decision,
            first_call,
            begin,
            sent,
        } = prepared;
        if decision.newly_recorded {
            crashpoint::hit(Boundary::AfterAuthorization);
        }
        let (receipt, replayed) = match begin {
            Begin::Done(executed) => (executed.receipt, executed.provider_replayed),
            Begin::Dispatch { key } => {
                match execution::call_provider(&key, &sent, self.inner.provider.as_ref()).await {
                    Ok(outcome) => (outcome.receipt, outcome.replayed),
                    Err(err) => {
                        self.settle_failure(&decision.decision_id, first_call, &err)
                            .await;
                        return Err(err);
                    }
                }
            }
        };
        let settlement = Settlement {
            decision_id: decision.decision_id.clone(),
            receipt: receipt.clone(),
            replayed,
        };
        Ok((self.receipt(decision, receipt, replayed), settlement))
    }

    /// Records a settlement inside the caller's transaction `conn` on the host file, committed
    /// with it: the execution `completed` with its receipt (the first record wins) and the
    /// decision `charged` with what the receipt says. Idempotent.
    pub fn settle_in(
        &self,
        tx: LayerTx<'_, '_>,
        settlement: &Settlement,
    ) -> Result<(), BackendError> {
        let Settlement {
            decision_id,
            receipt,
            replayed,
        } = settlement;
        match (tx, &self.inner.shared) {
            (LayerTx::Postgres(tx), Some(shared)) => {
                shared.settle_in(tx, decision_id, receipt, *replayed)
            }
            (LayerTx::Sqlite(conn), None) => {
                let executed =
                    self.inner
                        .execution
                        .complete_in(conn, decision_id, receipt, *replayed)?;
                self.inner.authorization.record_charge_in(
                    conn,
                    decision_id,
                    executed.receipt.amount_cents,
                )
            }
            _ => Err(self.no_host()),
        }
    }

    /// The error of a layer step offered a transaction on a database the layers do not live in.
    fn no_host(&self) -> BackendError {
        BackendError::StateUnavailable(crate::storage::sqlite::StoreError::Sqlite {
            kind: "backend state",
            path: self.inner.state_dir.clone(),
            cause: crate::storage::sqlite::other_error(
                "the layers' tables are not in the database of this transaction".into(),
            ),
        })
    }

    /// Settles the reservation of a decision whose provider call failed: released on a
    /// refusal, `reserved` again when the first call surely never reached the provider.
    async fn settle_failure(&self, decision_id: &str, first_call: bool, err: &BackendError) {
        let id = decision_id.to_owned();
        let settled = if err.is_provider_refusal() {
            self.authorization(move |a| a.release(&id)).await
        } else if first_call && err.never_reached_provider() {
            self.authorization(move |a| a.mark_not_sent(&id)).await
        } else {
            Ok(())
        };
        if let Err(e) = settled {
            tracing::warn!(
                "cannot settle the budget reservation of a failed spend: {}",
                e
            );
        }
    }

    /// The receipt a spend answers, logging a charge above the authorization.
    fn receipt(
        &self,
        decision: Decision,
        receipt: Receipt,
        provider_replayed: bool,
    ) -> SpendReceipt {
        if receipt.amount_cents > decision.amount_cents {
            tracing::error!(
                authorized = decision.amount_cents,
                charged = receipt.amount_cents,
                provider = %self.inner.provider_description,
                "the provider charged more than was authorized; the budget is debited by the charge"
            );
        }
        SpendReceipt {
            decision_id: decision.decision_id,
            charge_id: receipt.charge_id,
            amount_cents: receipt.amount_cents,
            authorized_cents: decision.amount_cents,
            model: receipt.model,
            image: receipt.image,
            charged_at: receipt.created_at,
            provider_replayed,
        }
    }
}

/// Copies the rows of the layers' own files in `state_dir` (an earlier callid's
/// `authorization.sqlite3` and `execution.sqlite3`) into `host`, rows already there winning,
/// then renames each file with [`IMPORTED_SUFFIX`]. Each file is opened through its own kind's
/// checks first (a corrupt, foreign or newer file is refused, untouched).
fn import_own_files(host: &Store, state_dir: &Path) -> Result<(), BackendError> {
    for (name, spec, table) in [
        (AUTHORIZATION_FILE, &layers::AUTHORIZATION, "decisions"),
        (EXECUTION_FILE, &layers::EXECUTION, "executions"),
    ] {
        let path = state_dir.join(name);
        if !path.exists() {
            continue;
        }
        import_file(host, &path, spec, table)?;
    }
    Ok(())
}

fn import_file(
    host: &Store,
    path: &Path,
    spec: &'static StoreSpec,
    table: &str,
) -> Result<(), BackendError> {
    let copied = host.import(path, spec, table)?;
    // Kept as a backup under a name no earlier import took (`.imported`, `.imported.1`, ...).
    let backup = (0..)
        .map(|n| {
            let mut name = path.as_os_str().to_owned();
            name.push(IMPORTED_SUFFIX);
            if n > 0 {
                name.push(format!(".{n}"));
            }
            PathBuf::from(name)
        })
        .find(|p| !p.exists())
        .expect("an unused name");
    // Its journal files go with it (closed cleanly, there are none).
    for suffix in ["-wal", "-shm", ""] {
        let mut from = path.as_os_str().to_owned();
        from.push(suffix);
        let mut to = backup.clone().into_os_string();
        to.push(suffix);
        if let Err(e) = std::fs::rename(&from, &to)
            && (suffix.is_empty() || e.kind() != std::io::ErrorKind::NotFound)
        {
            tracing::warn!(file = %path.display(), "imported, but cannot rename it: {e}");
        }
    }
    tracing::info!(file = %path.display(), table, copied, "imported a layer's own file into the registry");
    Ok(())
}

impl Backend {
    async fn authorization<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Authorization) -> Result<R, BackendError> + Send + 'static,
    ) -> Result<R, BackendError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this.inner.authorization))
            .await
            .map_err(join_error)?
    }
}

fn join_error(join: tokio::task::JoinError) -> BackendError {
    BackendError::StateUnavailable(crate::storage::sqlite::StoreError::Sqlite {
        kind: "backend state",
        path: PathBuf::new(),
        cause: crate::storage::sqlite::other_error(format!("backend task failed: {join}")),
    })
}

#[cfg(test)]
mod tests;
