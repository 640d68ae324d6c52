//! [`BackendError`]: why a spend was refused or failed, with a stable code the router reports.

use crate::provider::ProviderError;
use crate::storage::sqlite::StoreError;

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
    /// The replicas' shared backend state (the registry's PostgreSQL database) cannot be
    /// reached or refused a statement; nothing new was dispatched.
    #[error("backend state `{url}` failed while {doing}: {cause}")]
    SharedStateUnavailable {
        /// The database URL, password redacted.
        url: String,
        /// What was being done, as a fragment.
        doing: &'static str,
        /// The server's or the connection's message.
        cause: String,
    },
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
            BackendError::StateUnavailable(_) | BackendError::SharedStateUnavailable { .. } => {
                "backend_state_unavailable"
            }
        }
    }

    /// Whether the same spend may succeed if retried later unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BackendError::ProviderUnavailable(_)
                | BackendError::StateUnavailable(_)
                | BackendError::SharedStateUnavailable { .. }
        )
    }

    /// Whether the provider answered with a refusal: nothing was charged, and retrying the same
    /// request will be refused again.
    pub fn is_provider_refusal(&self) -> bool {
        matches!(
            self,
            BackendError::ProviderError(e) if !matches!(e, ProviderError::KeyReused)
        ) || matches!(
            self,
            BackendError::UnknownModel(_) | BackendError::InvalidRequest(_)
        )
    }

    /// Whether the provider call surely never reached the provider (it could not connect), so
    /// nothing can have been charged by it.
    pub fn never_reached_provider(&self) -> bool {
        matches!(
            self,
            BackendError::ProviderUnavailable(ProviderError::Unavailable { source, .. })
                if source.is_connect()
        )
    }

    /// Whether this is a state file that is corrupt, foreign or from a newer callid: retrying
    /// will not help until an operator repairs or replaces the file.
    pub fn is_state_corrupt(&self) -> bool {
        match self {
            BackendError::StateUnavailable(e) => store_corrupt(e),
            _ => false,
        }
    }

    /// The state file this error is about, if any.
    pub fn state_file(&self) -> Option<&std::path::Path> {
        match self {
            BackendError::StateUnavailable(
                StoreError::Io { path, .. }
                | StoreError::Foreign { path, .. }
                | StoreError::TooNew { path, .. }
                | StoreError::Sqlite { path, .. },
            ) => Some(path),
            _ => None,
        }
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

/// Whether a store error needs an operator (a bad, foreign, newer, exposed or unwritable file),
/// not a retry.
fn store_corrupt(err: &StoreError) -> bool {
    match err {
        StoreError::Foreign { .. }
        | StoreError::TooNew { .. }
        | StoreError::Permissions { .. }
        | StoreError::ReadOnly { .. } => true,
        StoreError::Sqlite { cause, .. } => matches!(
            cause.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
        ),
        StoreError::Io { .. } => false,
    }
}
