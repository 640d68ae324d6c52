//! [`ProviderError`]: every way a charge can be refused or fail, with a stable code and an HTTP
//! status.

use crate::storage::sqlite::StoreError;

/// Why the provider did not (or could not say whether it did) charge.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// No `Idempotency-Key` header.
    #[error("missing `Idempotency-Key` header; send one unique key per charge you intend")]
    MissingKey,
    /// The `Idempotency-Key` is malformed.
    #[error("invalid `Idempotency-Key`: {reason}; use 1 to 255 visible ASCII characters")]
    InvalidKey {
        /// What is wrong with it.
        reason: String,
    },
    /// The body is not JSON.
    #[error("request body is not valid JSON: {reason}")]
    InvalidJson {
        /// The parser's complaint.
        reason: String,
    },
    /// The body is JSON but not a valid image request.
    #[error("invalid image request: {reason}")]
    InvalidRequest {
        /// What is wrong with it.
        reason: String,
    },
    /// The model is not in the price table.
    #[error("unknown model `{model}`; choose one of {}", super::prices::models().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "))]
    UnknownModel {
        /// The model asked for.
        model: String,
    },
    /// The price is above the most the caller authorized; nothing was charged.
    #[error(
        "`{model}` costs {price_cents} cents, above the {max_cents} cents the caller authorized; \
         nothing was charged"
    )]
    AboveMaximum {
        /// The model asked for.
        model: String,
        /// Its price.
        price_cents: u64,
        /// The `max_amount_cents` sent.
        max_cents: u64,
    },
    /// The key was already charged for a different request.
    #[error(
        "this `Idempotency-Key` was already used for a different request; use a new key for a \
         new image"
    )]
    KeyReused,
    /// The provider requires a bearer token and the request did not carry it.
    #[error(
        "missing or wrong `Authorization: Bearer` token; send the token this provider was \
         started with (`--token-file` or `CALLID_PROVIDER_TOKEN`)"
    )]
    Unauthorized,
    /// The ledger could not be opened, read or written; nothing was charged by this request.
    #[error(transparent)]
    Ledger(#[from] StoreError),
    /// The provider failed inside (a task panicked); whether it charged is unknown, so retry
    /// with the same key.
    #[error("provider internal error: {reason}; retry with the same key")]
    Internal {
        /// What failed.
        reason: String,
    },
    /// A test hook of the provider failed the request on purpose.
    #[error("the provider failed this request on purpose with HTTP {status} ({when})")]
    Injected {
        /// The HTTP status it answered.
        status: u16,
        /// `nothing was charged` or `the charge was recorded`.
        when: &'static str,
    },
    /// The provider could not be reached, or did not answer in time (client side). `url` is
    /// redacted and `source` carries no URL.
    #[error(
        "provider at `{url}` unreachable or did not answer; retrying with the same key is safe"
    )]
    Unavailable {
        /// The provider's base URL, its secrets redacted.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The provider's URL or credentials are unusable (client side); the message never shows a
    /// secret.
    #[error("invalid provider URL: {reason}")]
    InvalidUrl {
        /// What is wrong, with the URL redacted.
        reason: String,
    },
    /// The provider answered with an error this client does not map to a variant (client side).
    #[error("provider answered HTTP {status} `{code}`: {message}")]
    Http {
        /// HTTP status.
        status: u16,
        /// The provider's error code.
        code: String,
        /// The provider's message.
        message: String,
    },
    /// The provider answered something that is not its documented contract (client side).
    #[error("provider answered HTTP {status} with a body that breaks its contract: {reason}")]
    InvalidResponse {
        /// HTTP status.
        status: u16,
        /// What is wrong.
        reason: String,
    },
}

impl ProviderError {
    /// Stable machine code (the `error.code` of the HTTP error body).
    pub fn code(&self) -> &'static str {
        match self {
            ProviderError::MissingKey => "missing_idempotency_key",
            ProviderError::InvalidKey { .. } => "invalid_idempotency_key",
            ProviderError::InvalidJson { .. } => "invalid_json",
            ProviderError::InvalidRequest { .. } => "invalid_request",
            ProviderError::UnknownModel { .. } => "unknown_model",
            ProviderError::AboveMaximum { .. } => "amount_above_maximum",
            ProviderError::KeyReused => "idempotency_key_reused",
            ProviderError::Unauthorized => "unauthorized",
            ProviderError::Ledger(_) => "ledger_unavailable",
            ProviderError::Internal { .. } => "internal_error",
            ProviderError::Injected { .. } => "injected_failure",
            ProviderError::Unavailable { .. } => "provider_unavailable",
            ProviderError::InvalidUrl { .. } => "invalid_provider_url",
            ProviderError::Http { .. } => "provider_error",
            ProviderError::InvalidResponse { .. } => "invalid_response",
        }
    }

    /// The HTTP status the server answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            ProviderError::MissingKey
            | ProviderError::InvalidKey { .. }
            | ProviderError::InvalidJson { .. } => 400,
            ProviderError::KeyReused => 409,
            ProviderError::Unauthorized => 401,
            ProviderError::InvalidRequest { .. }
            | ProviderError::UnknownModel { .. }
            | ProviderError::AboveMaximum { .. } => 422,
            ProviderError::Ledger(_) | ProviderError::Internal { .. } => 500,
            ProviderError::Injected { status, .. } | ProviderError::Http { status, .. } => *status,
            ProviderError::Unavailable { .. } => 503,
            ProviderError::InvalidResponse { .. } => 502,
            ProviderError::InvalidUrl { .. } => 400,
        }
    }

    /// Whether retrying the same key later may succeed (transient failures), as opposed to a
    /// refusal that will repeat.
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::Ledger(_)
            | ProviderError::Internal { .. }
            | ProviderError::Unavailable { .. }
            | ProviderError::InvalidResponse { .. } => true,
            ProviderError::Injected { status, .. } | ProviderError::Http { status, .. } => {
                *status >= 500 || *status == 429 || *status == 408
            }
            _ => false,
        }
    }
}
