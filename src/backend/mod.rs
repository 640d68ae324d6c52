//! The layers behind the router: authorization and execution, each idempotent on its own, in
//! front of the provider. [`Backend`] is the facade the router calls.
//!
//! A retried spend has to pass three independent checks that all agree it is the same call:
//! 1. [`authorization`] (the article's Hubu) keeps one decision per (agent, operation key) and
//!    refuses the same key for other work with `create_new_operation`; it holds the budgets.
//! 2. [`execution`] (Gongbu) keys the provider call to the decision id, with a provider
//!    idempotency key derived from it, so one decision leads to at most one charge.
//! 3. The [`provider`](crate::provider) charges once per idempotency key.
//!
//! One bug in one layer does not become a double charge: each layer dedupes on its own key, in its
//! own durable file in the state directory the router gives [`Backend::open`]:
//! `authorization.sqlite3`, `execution.sqlite3` and, for the in-process provider,
//! `provider-ledger.sqlite3`.
//!
//! # Guarantee
//! [`Backend::spend`] under one operation key charges at most once, whatever the number of
//! retries, concurrent calls, crashes and restarts, and every successful answer for that key
//! carries the same receipt. Nothing it returns (receipts, errors, messages) contains the
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
pub(crate) mod shared;

pub(crate) use authorization::{Authorization, AuthorizationRequest};
pub use error::BackendError;
pub(crate) use execution::Execution;
pub use execution::provider_key;

use crate::canonical::RequestHash;
use crate::crashpoint::{self, Boundary};
use crate::keys::OperationKey;
use crate::provider::{self, Image, ImageRequest, Ledger, ProviderApi};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the authorization store in the state directory.
pub const AUTHORIZATION_FILE: &str = "authorization.sqlite3";
/// File name of the execution store in the state directory.
pub const EXECUTION_FILE: &str = "execution.sqlite3";
/// File name of the in-process provider's ledger in the state directory.
pub const PROVIDER_LEDGER_FILE: &str = "provider-ledger.sqlite3";

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
    /// every replica.
    pub shared_state: Option<crate::pg::PgUrl>,
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
        match provider {
            ProviderTarget::InProcess => {
                let ledger = Ledger::open(&state_dir.join(PROVIDER_LEDGER_FILE))
                    .map_err(BackendError::from_provider)?;
                let description = format!("in-process ledger `{}`", ledger.path().display());
                Self::assemble(
                    state_dir,
                    Arc::new(ledger.clone()),
                    Some(ledger),
                    description,
                    config,
                )
            }
            ProviderTarget::Http { endpoint } => {
                let client =
                    provider::Client::connect(endpoint).map_err(BackendError::from_provider)?;
                let description = format!("`{}`", client.base_url());
                Self::assemble(state_dir, Arc::new(client), None, description, config)
            }
        }
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
        let mut authorization = Authorization::open(&state_dir.join(AUTHORIZATION_FILE))?
            .with_reservation_expiry(config.reservation_expiry);
        let mut execution = Execution::open(&state_dir.join(EXECUTION_FILE))?;
        if let Some(url) = &config.shared_state {
            let shared = Arc::new(shared::SharedState::new(url.clone()));
            authorization = authorization.shared_in(shared.clone());
            execution = execution.shared_in(shared);
        }
        Ok(Backend {
            inner: Arc::new(Inner {
                state_dir: state_dir.to_path_buf(),
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
                let id = decision.decision_id.clone();
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
                return Err(err);
            }
        };
        let charged = executed.receipt.amount_cents;
        {
            let id = decision.decision_id.clone();
            self.authorization(move |a| a.record_charge(&id, charged))
                .await?;
        }
        if charged > decision.amount_cents {
            tracing::error!(
                authorized = decision.amount_cents,
                charged,
                provider = %self.inner.provider_description,
                "the provider charged more than was authorized; the budget is debited by the charge"
            );
        }
        tracing::debug!(
            decision_id = %decision.decision_id,
            from_record = executed.from_record,
            provider_replayed = executed.provider_replayed,
            attempts = executed.attempts,
            "spend completed"
        );
        let receipt = executed.receipt;
        Ok(SpendReceipt {
            decision_id: decision.decision_id,
            charge_id: receipt.charge_id,
            amount_cents: receipt.amount_cents,
            authorized_cents: decision.amount_cents,
            model: receipt.model,
            image: receipt.image,
            charged_at: receipt.created_at,
            provider_replayed: executed.provider_replayed,
        })
    }
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
    BackendError::StateUnavailable(crate::store::StoreError::Sqlite {
        kind: "backend state",
        path: PathBuf::new(),
        cause: crate::store::other_error(format!("backend task failed: {join}")),
    })
}

#[cfg(test)]
mod tests;
