//! The provider's HTTP server ([`router`], [`spawn`]) and its test hooks ([`ProviderHooks`]).

use super::error::ProviderError;
use super::ledger::Ledger;
use super::types::{ChargesPage, ImageRequest, KEY_HEADER, REPLAYED_HEADER, validate_key};
use crate::secret::Secret;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How hooks see a request without any idempotency key (it holds a space, so no valid key can
/// look like it).
pub const NO_KEY: &str = "(no idempotency key)";

/// What a hook tells the server to do at its point of a request.
pub enum HookAction {
    /// Go on as normal.
    Proceed,
    /// Answer now with this HTTP status and an `injected_failure` error body. Before the charge,
    /// nothing is charged; after it, the charge stays recorded and the receipt is not sent.
    Fail(u16),
    /// Wait this long, then go on.
    Hold(Duration),
    /// Wait until this future is done (an event the hook's owner observes), then go on.
    HoldUntil(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
}

impl std::fmt::Debug for HookAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookAction::Proceed => f.write_str("Proceed"),
            HookAction::Fail(status) => f.debug_tuple("Fail").field(status).finish(),
            HookAction::Hold(d) => f.debug_tuple("Hold").field(d).finish(),
            HookAction::HoldUntil(_) => f.write_str("HoldUntil(..)"),
        }
    }
}

impl HookAction {
    /// Waits out a hold; `Err(status)` for [`HookAction::Fail`], `Ok` for every other action.
    pub async fn run(self) -> Result<(), u16> {
        match self {
            HookAction::Proceed => Ok(()),
            HookAction::Hold(duration) => {
                tokio::time::sleep(duration).await;
                Ok(())
            }
            HookAction::HoldUntil(until) => {
                until.await;
                Ok(())
            }
            HookAction::Fail(status) => Err(status),
        }
    }
}

/// Test hooks on `POST /v1/images`, used by the conformance runner to play a slow, failing or
/// crashing world around a router, or a provider that ignores idempotency keys. They run on the
/// request's task; keep them short or return [`HookAction::Hold`] rather than sleeping.
pub trait ProviderHooks: Send + Sync {
    /// Called for a valid request before [`ProviderHooks::before_charge`]; the value returned
    /// is dropped when the provider is done with the request (answered, failed, or abandoned by
    /// its client), so a test can tell which requests were in flight at once.
    fn dispatch(&self, key: &str, request: &ImageRequest) -> Option<Box<dyn Send>> {
        let _ = (key, request);
        None
    }

    /// Whether the provider ignores idempotency keys, as most real paid backends do: every
    /// request is charged under a fresh key, and a request without a key is served (the hooks
    /// see it as [`NO_KEY`]).
    fn ignores_keys(&self) -> bool {
        false
    }

    /// Called for a valid request, before the ledger is touched.
    fn before_charge(&self, key: &str) -> HookAction {
        let _ = key;
        HookAction::Proceed
    }

    /// Called after the ledger committed (or replayed) the charge and before the reply is sent.
    fn after_charge(&self, key: &str, replayed: bool) -> HookAction {
        let _ = (key, replayed);
        HookAction::Proceed
    }
}

#[derive(Clone)]
struct AppState {
    ledger: Ledger,
    hooks: Option<Arc<dyn ProviderHooks>>,
}

/// The provider's routes, for embedding in another axum server.
pub fn router(ledger: Ledger, hooks: Option<Arc<dyn ProviderHooks>>) -> Router {
    Router::new()
        .route("/v1/images", post(create_image))
        .route("/v1/charges", get(list_charges))
        .route("/healthz", get(health))
        .fallback(not_found)
        .with_state(AppState { ledger, hooks })
}

/// Requires `Authorization: Bearer <token>` on every route of `app` (a provider's [`router`]);
/// any other request is answered `401 unauthorized` with `WWW-Authenticate: Bearer`, before a
/// handler sees it. The token is compared in constant time and never logged or echoed.
pub fn require_token(app: Router, token: Secret) -> Router {
    app.layer(axum::middleware::from_fn_with_state(
        Arc::new(token),
        check_token,
    ))
}

async fn check_token(
    State(token): State<Arc<Secret>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = req.headers().get(header::AUTHORIZATION).and_then(|value| {
        let (scheme, rest) = value.to_str().ok()?.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
    });
    if given.is_some_and(|given| token.matches(given.as_bytes())) {
        return next.run(req).await;
    }
    let mut response = error_response(&ProviderError::Unauthorized);
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// A provider running on a background task; dropping it stops accepting connections.
#[derive(Debug)]
pub struct ProviderHandle {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ProviderHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, the base URL for [`super::Client::new`].
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets requests in flight finish, and waits for the server to end.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(std::io::Error::other(join)),
        }
    }
}

impl Drop for ProviderHandle {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

/// Starts the provider on `listener` in a background task of the current tokio runtime.
pub fn spawn(
    listener: tokio::net::TcpListener,
    ledger: Ledger,
    hooks: Option<Arc<dyn ProviderHooks>>,
) -> std::io::Result<ProviderHandle> {
    spawn_app(listener, router(ledger, hooks))
}

/// Starts `app` (a provider's [`router`], with its guards) on `listener` in a background task of
/// the current tokio runtime.
pub fn spawn_app(
    listener: tokio::net::TcpListener,
    app: Router,
) -> std::io::Result<ProviderHandle> {
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(crate::http_guard::nodelay(listener), app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Ok(ProviderHandle {
        addr,
        stop: Some(stop),
        task,
    })
}

fn error_response(err: &ProviderError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // A failure a hook asked for is the test going to plan, not an incident.
    if matches!(err, ProviderError::Injected { .. }) {
        tracing::debug!("provider request failed: {}", message_chain(err));
    } else if err.status() >= 500 {
        tracing::error!("provider request failed: {}", message_chain(err));
    }
    let body = serde_json::json!({
        "error": { "code": err.code(), "message": message_chain(err) }
    });
    (status, axum::Json(body)).into_response()
}

/// The message with its causes, `: `-joined (what a client needs to act on).
fn message_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn key_from(headers: &HeaderMap) -> Result<String, ProviderError> {
    let mut values = headers.get_all(KEY_HEADER).iter();
    let value = values.next().ok_or(ProviderError::MissingKey)?;
    if values.next().is_some() {
        return Err(ProviderError::InvalidKey {
            reason: "the header is sent more than once".into(),
        });
    }
    let key = value.to_str().map_err(|_| ProviderError::InvalidKey {
        reason: "it is not visible ASCII".into(),
    })?;
    validate_key(key)?;
    Ok(key.to_owned())
}

fn request_from(body: &[u8]) -> Result<ImageRequest, ProviderError> {
    let req: ImageRequest = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ProviderError::InvalidRequest {
            reason: e.to_string(),
        },
        _ => ProviderError::InvalidJson {
            reason: e.to_string(),
        },
    })?;
    req.validate()?;
    Ok(req)
}

async fn run_hook(action: HookAction, when: &'static str) -> Result<(), ProviderError> {
    action
        .run()
        .await
        .map_err(|status| ProviderError::Injected { status, when })
}

async fn create_image(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    match charge(&state, &headers, &body).await {
        Ok((body, replayed)) => {
            let mut response = (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response();
            if replayed {
                response
                    .headers_mut()
                    .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
            }
            response
        }
        Err(err) => error_response(&err),
    }
}

async fn charge(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, bool), ProviderError> {
    let ignores_keys = state.hooks.as_ref().is_some_and(|h| h.ignores_keys());
    let key = match key_from(headers) {
        Err(ProviderError::MissingKey) if ignores_keys => NO_KEY.to_string(),
        other => other?,
    };
    let req = request_from(body)?;
    let _dispatch = state.hooks.as_ref().and_then(|h| h.dispatch(&key, &req));
    if let Some(hooks) = &state.hooks {
        run_hook(hooks.before_charge(&key), "nothing was charged").await?;
    }
    let ledger = state.ledger.clone();
    let blocking_key = if ignores_keys {
        format!("charge-{}", uuid::Uuid::new_v4().simple())
    } else {
        key.clone()
    };
    let (outcome, body) =
        tokio::task::spawn_blocking(move || ledger.charge_with_body(&blocking_key, &req))
            .await
            .map_err(|join| ProviderError::Internal {
                reason: format!("ledger task failed: {join}"),
            })??;
    if let Some(hooks) = &state.hooks {
        run_hook(
            hooks.after_charge(&key, outcome.replayed),
            "the charge was recorded; retry with the same key to get its receipt",
        )
        .await?;
    }
    Ok((body, outcome.replayed))
}

async fn list_charges(State(state): State<AppState>) -> Response {
    let ledger = state.ledger.clone();
    match tokio::task::spawn_blocking(move || ledger.charges()).await {
        Ok(Ok(charges)) => axum::Json(ChargesPage::new(charges)).into_response(),
        Ok(Err(err)) => error_response(&err),
        Err(join) => error_response(&ProviderError::Internal {
            reason: format!("ledger task failed: {join}"),
        }),
    }
}

async fn health() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

async fn not_found() -> Response {
    let body = serde_json::json!({
        "error": {
            "code": "not_found",
            "message": "no such endpoint; the provider serves `POST /v1/images`, \
                        `GET /v1/charges` and `GET /healthz`"
        }
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
