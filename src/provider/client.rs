//! [`ProviderApi`]: one way to ask for an image, whether the provider is in this process
//! ([`Ledger`]) or across HTTP ([`Client`]).

use super::error::ProviderError;
use super::ledger::Ledger;
use super::types::{
    ChargeOutcome, ChargesPage, ImageRequest, KEY_HEADER, REPLAYED_HEADER, Receipt,
};
use crate::secret::{Secret, SecretUrl};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed, sendable future (keeps [`ProviderApi`] usable as `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The provider as the execution layer sees it.
///
/// # Guarantee
/// Implementations charge at most once per `key`: calling again with the same key and request
/// returns the original receipt with `replayed: true`; the same key with another request is
/// [`ProviderError::KeyReused`]. An `Err` other than a refusal means "unknown whether it charged":
/// retry with the same key.
pub trait ProviderApi: Send + Sync {
    /// Charges for and creates one image under the idempotency key `key`.
    fn create_image<'a>(
        &'a self,
        key: &'a str,
        req: &'a ImageRequest,
    ) -> BoxFuture<'a, Result<ChargeOutcome, ProviderError>>;
}

impl ProviderApi for Ledger {
    fn create_image<'a>(
        &'a self,
        key: &'a str,
        req: &'a ImageRequest,
    ) -> BoxFuture<'a, Result<ChargeOutcome, ProviderError>> {
        let (ledger, key, req) = (self.clone(), key.to_owned(), req.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || ledger.charge(&key, &req))
                .await
                .map_err(|join| ProviderError::Internal {
                    reason: format!("ledger task failed: {join}"),
                })?
        })
    }
}

/// How long the client waits to connect, and for a whole answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// See [`CONNECT_TIMEOUT`].
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a provider is and the token that proves who asks: checked once, secrets redacted in
/// every `Debug`, `Display` and error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    url: SecretUrl,
    token: Option<Secret>,
}

impl Endpoint {
    /// The provider at `url`, sending `token` as `Authorization: Bearer` when given. A URL with
    /// a user or password (sent as Basic authorization) and a token at once is refused.
    pub fn new(url: SecretUrl, token: Option<Secret>) -> Result<Endpoint, ProviderError> {
        if url.has_userinfo() && token.is_some() {
            return Err(ProviderError::InvalidUrl {
                reason: format!(
                    "`{url}` carries a user and password and a bearer token is also given; \
                     use one of them"
                ),
            });
        }
        Ok(Endpoint { url, token })
    }

    /// The URL, redacted when shown.
    pub fn url(&self) -> &SecretUrl {
        &self.url
    }
}

impl std::str::FromStr for Endpoint {
    type Err = ProviderError;

    /// A provider without a token.
    fn from_str(text: &str) -> Result<Endpoint, ProviderError> {
        let url = text
            .parse::<SecretUrl>()
            .map_err(|e| ProviderError::InvalidUrl {
                reason: format!("{:#}", anyhow::Error::from(e)),
            })?;
        Endpoint::new(url, None)
    }
}

/// An HTTP client of a provider that follows the contract in [`crate::provider`].
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    http: reqwest::Client,
}

impl Client {
    /// A client of the provider at `base_url` (e.g. `http://127.0.0.1:8080`), without a token.
    pub fn new(base_url: impl AsRef<str>) -> Result<Client, ProviderError> {
        Client::connect(base_url.as_ref().parse()?)
    }

    /// A client of `endpoint`.
    pub fn connect(endpoint: Endpoint) -> Result<Client, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            // Explicit (reqwest's default too): no Nagle delay on the request's small writes.
            .tcp_nodelay(true)
            .build()
            .map_err(|source| ProviderError::Unavailable {
                url: endpoint.url.redacted().to_string(),
                source: source.without_url(),
            })?;
        Ok(Client { endpoint, http })
    }

    /// The provider's base URL, its secrets redacted.
    pub fn base_url(&self) -> &str {
        self.endpoint.url.redacted()
    }

    /// The error for a failed exchange: the redacted URL, and reqwest's error without its URL
    /// (which would show the real one).
    fn unavailable(&self, source: reqwest::Error) -> ProviderError {
        ProviderError::Unavailable {
            url: self.base_url().to_string(),
            source: source.without_url(),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, self.endpoint.url.join(path));
        match &self.endpoint.token {
            Some(token) => request.bearer_auth(token.expose()),
            None => request,
        }
    }

    /// `POST /v1/images`.
    pub async fn post_image(
        &self,
        key: &str,
        req: &ImageRequest,
    ) -> Result<ChargeOutcome, ProviderError> {
        let response = self
            .request(reqwest::Method::POST, "/v1/images")
            .header(KEY_HEADER, key)
            .json(req)
            .send()
            .await
            .map_err(|e| self.unavailable(e))?;
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get(REPLAYED_HEADER)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let body = response.bytes().await.map_err(|e| self.unavailable(e))?;
        if status == 200 {
            let receipt: Receipt =
                serde_json::from_slice(&body).map_err(|e| ProviderError::InvalidResponse {
                    status,
                    reason: format!("the receipt does not parse: {e}"),
                })?;
            return Ok(ChargeOutcome { receipt, replayed });
        }
        Err(error_from(status, &body, req))
    }

    /// `GET /v1/charges`.
    pub async fn charges(&self) -> Result<ChargesPage, ProviderError> {
        let response = self
            .request(reqwest::Method::GET, "/v1/charges")
            .send()
            .await
            .map_err(|e| self.unavailable(e))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| self.unavailable(e))?;
        if status != 200 {
            return Err(error_from(status, &body, &ImageRequest::new("-")));
        }
        serde_json::from_slice(&body).map_err(|e| ProviderError::InvalidResponse {
            status,
            reason: format!("the charge list does not parse: {e}"),
        })
    }
}

impl ProviderApi for Client {
    fn create_image<'a>(
        &'a self,
        key: &'a str,
        req: &'a ImageRequest,
    ) -> BoxFuture<'a, Result<ChargeOutcome, ProviderError>> {
        Box::pin(self.post_image(key, req))
    }
}

fn error_from(status: u16, body: &[u8], req: &ImageRequest) -> ProviderError {
    #[derive(serde::Deserialize)]
    struct Envelope {
        error: Detail,
    }
    #[derive(serde::Deserialize)]
    struct Detail {
        code: String,
        message: String,
    }
    let Ok(Envelope { error }) = serde_json::from_slice::<Envelope>(body) else {
        return ProviderError::InvalidResponse {
            status,
            reason: format!(
                "expected an `{{\"error\":{{\"code\",\"message\"}}}}` body, got {} bytes",
                body.len()
            ),
        };
    };
    match error.code.as_str() {
        "idempotency_key_reused" => ProviderError::KeyReused,
        "unknown_model" => ProviderError::UnknownModel {
            model: req.model.clone(),
        },
        _ => ProviderError::Http {
            status,
            code: error.code,
            message: error.message,
        },
    }
}
