//! [`BackendError`]: why a spend was refused or failed, with a stable code the router reports.

use crate::provider::ProviderError;
use crate::store::StoreError;

/// Why the backend did not complete a spend. No variant carries the operation key.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The operation key was already authorized for other work.
    #[error(
        "this operation was already authorized for a different request ({differs}); make a new \
         call for new work instead of reusing this one"
    )]
    CreateNewOperation {
        /// Which recorded fields differ (e.g. `amount, scope`).
        differs: String,
    },
    /// The account's budget cannot cover the price; nothing was recorded or charged.
    #[error(
        "spending {amount_cents} cents would exceed the budget of account `{account}` \
         ({remaining_cents} of {budget_cents} cents left); nothing was charged: ask the operator \
         to raise the budget, or pick a cheaper model"
    )]
    BudgetExceeded {
        /// The account.
        account: String,
        /// The price of this spend.
        amount_cents: u64,
        /// The budget.
        budget_cents: u64,
        /// What is left of it.
        remaining_cents: u64,
    },
    /// The provider does not sell this model.
    #[error(transparent)]
    UnknownModel(ProviderError),
    /// The request is out of the provider's bounds.
    #[error(transparent)]
    InvalidRequest(ProviderError),
    /// The provider could not be reached or failed transiently; retrying the same call is safe.
    #[error(
        "the image provider is unavailable; retry the same call later (it will not be charged twice)"
    )]
    ProviderUnavailable(#[source] ProviderError),
    /// The provider refused the charge.
    #[error("the image provider refused the request")]
    ProviderError(#[source] ProviderError),
    /// A backend state file cannot be opened, read or written; nothing new was dispatched.
    #[error("backend state unavailable")]
    StateUnavailable(#[from] StoreError),
}

impl BackendError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            BackendError::CreateNewOperation { .. } => "create_new_operation",
            BackendError::BudgetExceeded { .. } => "budget_exceeded",
            BackendError::UnknownModel(_) => "unknown_model",
            BackendError::InvalidRequest(_) => "invalid_request",
            BackendError::ProviderUnavailable(_) => "provider_unavailable",
            BackendError::ProviderError(_) => "provider_error",
            BackendError::StateUnavailable(_) => "backend_state_unavailable",
        }
    }

    /// Whether the same spend may succeed if retried later unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BackendError::ProviderUnavailable(_) | BackendError::StateUnavailable(_)
        )
    }

    /// Sorts a provider error into "bad request", "try again" and "refused".
    pub(crate) fn from_provider(err: ProviderError) -> Self {
        match err {
            ProviderError::UnknownModel { .. } => BackendError::UnknownModel(err),
            ProviderError::InvalidRequest { .. } => BackendError::InvalidRequest(err),
            other if other.is_transient() => BackendError::ProviderUnavailable(other),
            other => BackendError::ProviderError(other),
        }
    }
}
