//! The runner's upstream MCP role (`backend: upstream`): a paid MCP server the router calls, which
//! counts side effects, for gateways and MCP-native routers that spend through an MCP server
//! rather than the runner's HTTP provider.
//!
//! [`UpstreamServer`] serves streamable HTTP on `http://127.0.0.1:PORT/mcp` (`{upstream_url}`)
//! inside the runner's process, so counting and the crash hooks live beside the provider's. It
//! answers every request with plain JSON (no SSE stream; `GET /mcp` is 405, as the transport
//! allows) and has the tools of `callid provider --mcp` ([`crate::provider::mcp::tools`]): the
//! paid `generate_image` and the free `list_charges`, charged into the same kind of
//! [`crate::provider::Ledger`] with the same receipts ([`crate::provider::mcp::charge_result`]).
//!
//! A stdio upstream (`{upstream_command}`, `{upstream_argv}`) is this binary's hidden
//! `conform-upstream-relay URL` subcommand ([`relay`]): it bridges its stdin/stdout to the HTTP
//! endpoint, one JSON-RPC message per line, the bodies passed on unchanged, so a router that
//! starts its upstream as a child reaches the same server, ledger and hooks.
//!
//! # Charge rule (the ground truth of every `charges:` expectation in this role)
//! - The idempotency key of a `generate_image` call is `_meta["callid/idempotency-key"]`, else
//!   the HTTP `Idempotency-Key` header of the POST that carried it. Every key received is
//!   recorded (both when both are sent and differ; the call is charged under `_meta`'s).
//! - A key not seen before: one charge. A seen key with the same request: the original receipt
//!   (`_meta["callid-provider/replayed"] = true`), no charge. A seen key with another request:
//!   refused (`idempotency_key_reused`), nothing charged.
//! - No key at all: charged every time, as a non-idempotent upstream would (this is how a proxy
//!   that forwards a redelivery twice shows a double charge). Recorded as [`NO_KEY`].
//! - Playing a non-idempotent upstream ([`RunnerHooks::ignore_keys`], for a profile with
//!   `idempotent_backend: false`): every call is charged, whatever its key.
//! - Every `generate_image` call is logged as a dispatch from its arrival to its answer
//!   ([`RunnerHooks::dispatch_started`]).
//!
//! # Crash points and failures ([`super::hooks::RunnerHooks`], the same triggers as the
//! provider's)
//! - `before_charge`: the router is killed when its paid call arrives, before anything is
//!   charged; the POST is answered 503.
//! - `after_charge`: the charge is committed, the router is killed, then the answer is sent to
//!   nobody.
//! - `provider_fails: STATUS`: the paid call's POST is answered with that HTTP status and nothing
//!   is charged (an upstream outage). Over stdio the relay exits on it: the router sees its
//!   upstream die mid-call.

use super::hooks::RunnerHooks;
use crate::keys::{IDEMPOTENCY_HEADER, IDEMPOTENCY_META};
use crate::provider::mcp::{GENERATE_IMAGE, LIST_CHARGES};
use crate::provider::{ChargesPage, HookAction, ImageRequest, Ledger, ProviderHooks};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// How a paid call without any idempotency key is recorded among the keys received (it holds a
/// space, so no valid key can look like it): the provider's own name for it.
pub use crate::provider::NO_KEY;
/// The hidden subcommand that bridges stdio to the upstream's HTTP endpoint.
pub const RELAY_SUBCOMMAND: &str = "conform-upstream-relay";
/// The protocol version answered when the client asks for one this server does not know.
const PROTOCOL: &str = "2025-11-25";
const KNOWN_PROTOCOLS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The argv of a stdio upstream reaching `url`: this binary (`callid`), the relay subcommand,
/// the URL.
pub fn relay_argv(callid: &str, url: &str) -> Vec<String> {
    vec![
        callid.to_string(),
        RELAY_SUBCOMMAND.to_string(),
        url.to_string(),
    ]
}

#[derive(Clone)]
struct AppState {
    ledger: Ledger,
    hooks: Arc<RunnerHooks>,
}

/// The running upstream; stops when dropped.
pub struct UpstreamServer {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl UpstreamServer {
    /// Serves the upstream on `listener`, charging into `ledger` through `hooks`.
    pub fn spawn(
        listener: tokio::net::TcpListener,
        ledger: Ledger,
        hooks: Arc<RunnerHooks>,
    ) -> std::io::Result<UpstreamServer> {
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route(
                "/mcp",
                axum::routing::post(post)
                    .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                    .delete(|| async { StatusCode::OK }),
            )
            .with_state(AppState { ledger, hooks });
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(UpstreamServer { addr, task })
    }

    /// `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for UpstreamServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// One POSTed JSON-RPC message.
async fn post(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &rpc_error(
                    &Value::Null,
                    -32600,
                    "this upstream takes one JSON-RPC object per POST (no batches)",
                ),
            );
        }
        Err(e) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &rpc_error(&Value::Null, -32700, &format!("not JSON: {e}")),
            );
        }
    };
    let Some(id) = message.get("id").cloned() else {
        // A notification or a response: nothing to answer.
        return StatusCode::ACCEPTED.into_response();
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let params = message.get("params").cloned().unwrap_or(json!({}));
    let result = match method {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = asked
                .filter(|v| KNOWN_PROTOCOLS.contains(v))
                .unwrap_or(PROTOCOL);
            let mut response = json_response(
                StatusCode::OK,
                &json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": version,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "callid-conform-upstream", "version": env!("CARGO_PKG_VERSION")},
                }}),
            );
            let session = uuid::Uuid::new_v4().simple().to_string();
            if let Ok(value) = HeaderValue::from_str(&session) {
                response.headers_mut().insert("mcp-session-id", value);
            }
            return response;
        }
        "ping" => json!({}),
        "tools/list" => json!({"tools": crate::provider::mcp::tools()}),
        "tools/call" => match call_tool(&state, &headers, &params).await {
            Ok(result) => result,
            Err(status) => {
                // An outage of the server, not an answer: no JSON-RPC body a client could take
                // for the tool's final word.
                return (
                    status,
                    format!(
                        "injected upstream failure: HTTP {}; nothing was charged",
                        status.as_u16()
                    ),
                )
                    .into_response();
            }
        },
        other => {
            return json_response(
                StatusCode::OK,
                &rpc_error(
                    &id,
                    -32601,
                    &format!("method `{other}` is not served by the conformance upstream"),
                ),
            );
        }
    };
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
}

/// A `tools/call`: its `CallToolResult` JSON, or the HTTP status of an injected failure.
async fn call_tool(
    state: &AppState,
    headers: &HeaderMap,
    params: &Value,
) -> Result<Value, StatusCode> {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    match name {
        GENERATE_IMAGE => generate_image(state, headers, params).await,
        LIST_CHARGES => {
            let ledger = state.ledger.clone();
            let page = tokio::task::spawn_blocking(move || ledger.charges())
                .await
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?
                .map(ChargesPage::new)
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
            Ok(json!({
                "content": [{"type": "text", "text": format!("{} charges, {} cents", page.count, page.total_cents)}],
                "structuredContent": page,
            }))
        }
        other => Ok(crate::provider::mcp::refusal(
            "unknown_tool",
            &format!(
                "unknown tool `{other}`; this upstream has {GENERATE_IMAGE} and {LIST_CHARGES}"
            ),
        )),
    }
}

async fn run_hook(action: HookAction) -> Result<(), StatusCode> {
    action
        .run()
        .await
        .map_err(|status| StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE))
}

/// The paid tool, by the charge rule of the module docs.
async fn generate_image(
    state: &AppState,
    headers: &HeaderMap,
    params: &Value,
) -> Result<Value, StatusCode> {
    let refusal = crate::provider::mcp::refusal;
    let meta_key = match params.get("_meta").and_then(|m| m.get(IDEMPOTENCY_META)) {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => {
            return Ok(refusal(
                "invalid_idempotency_key",
                "`_meta[\"callid/idempotency-key\"]` must be a string; nothing was charged",
            ));
        }
    };
    let header_key = match headers.get(IDEMPOTENCY_HEADER).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(k)) => Some(k.to_string()),
        Some(Err(_)) => {
            return Ok(refusal(
                "invalid_idempotency_key",
                "the `Idempotency-Key` header must be visible ASCII; nothing was charged",
            ));
        }
    };
    let arguments = params
        .get("arguments")
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let request: ImageRequest = match serde_json::from_value(arguments) {
        Ok(r) => r,
        Err(e) => {
            return Ok(refusal(
                "invalid_request",
                &format!("invalid arguments: {e}; nothing was charged"),
            ));
        }
    };
    let key = meta_key.clone().or_else(|| header_key.clone());
    if let (Some(m), Some(h)) = (&meta_key, &header_key)
        && m != h
    {
        state.hooks.record_key(h);
    }
    let _dispatch = state
        .hooks
        .dispatch_started(key.as_deref().unwrap_or(NO_KEY), &request);
    run_hook(state.hooks.before_charge(key.as_deref().unwrap_or(NO_KEY))).await?;
    // Without a key (or when the upstream plays one that ignores keys) every call is a new
    // charge: a fresh key nobody else can send.
    let charged_key = match &key {
        Some(k) if !state.hooks.ignores_keys() => k.clone(),
        _ => format!("unkeyed-{}", uuid::Uuid::new_v4().simple()),
    };
    let ledger = state.ledger.clone();
    let charged = tokio::task::spawn_blocking(move || ledger.charge(&charged_key, &request)).await;
    let outcome = match charged {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => return Ok(refusal(e.code(), &format!("{e}; nothing was charged"))),
        Err(e) => {
            return Ok(refusal(
                "internal_error",
                &format!("charge task failed: {e}"),
            ));
        }
    };
    run_hook(
        state
            .hooks
            .after_charge(key.as_deref().unwrap_or(NO_KEY), outcome.replayed),
    )
    .await?;
    Ok(crate::provider::mcp::charge_result(&outcome))
}

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The endpoint could not be reached or answered an HTTP error.
    #[error("the conformance upstream at `{url}` {detail}")]
    Upstream {
        /// The endpoint.
        url: String,
        /// What happened.
        detail: String,
    },
    /// Standard input or output failed.
    #[error("relay stdio failed: {0}")]
    Io(#[from] std::io::Error),
}

/// `callid conform-upstream-relay URL`: reads JSON-RPC messages from stdin, one per line, POSTs
/// each to `url` (keeping the `Mcp-Session-Id` the `initialize` answer set), and writes every
/// JSON-RPC message of each answer (plain JSON or SSE events) to stdout, one per line, unchanged.
/// Requests are relayed concurrently (answers in the order they come), `initialize` alone first.
/// An HTTP error status or a broken connection ends the relay with an error: to the router, its
/// stdio upstream died mid-call.
pub async fn relay(url: &str) -> Result<(), RelayError> {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let client = reqwest::Client::new();
    let session: Arc<tokio::sync::Mutex<Option<String>>> = Arc::default();
    let out = Arc::new(tokio::sync::Mutex::new(tokio::io::stdout()));
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::channel::<RelayError>(1);
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            Some(e) = failed_rx.recv() => return Err(e),
        };
        let Some(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let initialize = serde_json::from_str::<Value>(&line)
            .ok()
            .is_some_and(|m| m.get("method").and_then(Value::as_str) == Some("initialize"));
        let job = relay_one(
            client.clone(),
            url.to_string(),
            session.clone(),
            out.clone(),
            line,
        );
        if initialize {
            job.await?;
        } else {
            let failed = failed_tx.clone();
            tasks.spawn(async move {
                if let Err(e) = job.await {
                    let _ = failed.send(e).await;
                }
            });
        }
    }
    drop(failed_tx);
    while tasks.join_next().await.is_some() {}
    if let Some(e) = failed_rx.recv().await {
        return Err(e);
    }
    out.lock().await.flush().await?;
    Ok(())
}

async fn relay_one(
    client: reqwest::Client,
    url: String,
    session: Arc<tokio::sync::Mutex<Option<String>>>,
    out: Arc<tokio::sync::Mutex<tokio::io::Stdout>>,
    line: String,
) -> Result<(), RelayError> {
    use tokio::io::AsyncWriteExt as _;
    let failed = |detail: String| RelayError::Upstream {
        url: url.clone(),
        detail,
    };
    let mut request = client
        .post(&url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(line);
    if let Some(s) = session.lock().await.as_ref() {
        request = request.header("mcp-session-id", s);
    }
    let response = request
        .send()
        .await
        .map_err(|e| failed(format!("could not be reached: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        return Err(failed(format!("answered HTTP {status}")));
    }
    if let Some(s) = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        *session.lock().await = Some(s.to_string());
    }
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let body = response
        .text()
        .await
        .map_err(|e| failed(format!("broke off its answer: {e}")))?;
    let messages: Vec<String> = if sse {
        sse_data(&body)
    } else if body.trim().is_empty() {
        Vec::new()
    } else {
        vec![body]
    };
    let mut out = out.lock().await;
    for message in messages {
        let line = if message.contains('\n') {
            // One message per line on stdio: a pretty-printed body is written compactly.
            serde_json::from_str::<Value>(&message)
                .map(|v| v.to_string())
                .unwrap_or_else(|_| message.replace('\n', " "))
        } else {
            message
        };
        out.write_all(line.as_bytes()).await?;
        out.write_all(b"\n").await?;
    }
    out.flush().await?;
    Ok(())
}

/// The `data` of every event of an SSE body (multi-line data joined with `\n`), skipping events
/// without data (priming events, comments).
fn sse_data(body: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    for line in body.lines().chain(std::iter::once("")) {
        if line.is_empty() {
            if !data.is_empty() {
                let joined = data.join("\n");
                if !joined.trim().is_empty() {
                    events.push(joined);
                }
                data.clear();
            }
        } else if let Some(rest) = line.strip_prefix("data:") {
            data.push(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_split_and_priming_events_skipped() {
        let body = "id: 0\ndata:\n\nevent: message\ndata: {\"a\":1}\n\ndata: {\"b\":\ndata: 2}\n";
        assert_eq!(sse_data(body), ["{\"a\":1}", "{\"b\":\n2}"]);
    }

    async fn server() -> (tempfile::TempDir, UpstreamServer, Ledger, Arc<RunnerHooks>) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.sqlite3")).unwrap();
        let hooks = Arc::new(RunnerHooks::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = UpstreamServer::spawn(listener, ledger.clone(), hooks.clone()).unwrap();
        (dir, server, ledger, hooks)
    }

    async fn call(url: &str, meta: Value, header_key: Option<&str>) -> (u16, Value) {
        let mut request = reqwest::Client::new().post(url).json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "generate_image", "arguments": {"prompt": "fox"}, "_meta": meta},
        }));
        if let Some(k) = header_key {
            request = request.header("Idempotency-Key", k);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    #[tokio::test]
    async fn keys_charge_once_no_key_charges_every_time_and_every_key_is_recorded() {
        let (_dir, server, ledger, hooks) = server().await;
        let url = server.url();
        let (status, first) = call(&url, json!({"callid/idempotency-key": "k1"}), None).await;
        assert_eq!(status, 200);
        let charge = first["result"]["structuredContent"]["charge_id"].clone();
        assert!(charge.is_string(), "{first}");
        let (_, again) = call(&url, json!({"callid/idempotency-key": "k1"}), None).await;
        assert_eq!(again["result"]["structuredContent"]["charge_id"], charge);
        assert_eq!(again["result"]["_meta"]["callid-provider/replayed"], true);
        assert_eq!(ledger.charge_count().unwrap(), 1);
        // The header is a key too; `_meta` wins when both differ, and both are recorded.
        call(&url, json!({}), Some("k2")).await;
        call(&url, json!({}), Some("k2")).await;
        assert_eq!(ledger.charge_count().unwrap(), 2);
        call(&url, json!({"callid/idempotency-key": "k1"}), Some("k3")).await;
        assert_eq!(ledger.charge_count().unwrap(), 2);
        // No key: a new charge every time.
        call(&url, json!({}), None).await;
        call(&url, json!({}), None).await;
        assert_eq!(ledger.charge_count().unwrap(), 4);
        assert_eq!(
            hooks.keys_seen(),
            ["k1", "k1", "k2", "k2", "k3", "k1", NO_KEY, NO_KEY]
        );
        // An injected outage: the POST fails, nothing is charged.
        hooks.fail_next(503);
        let (status, _) = call(&url, json!({"callid/idempotency-key": "k9"}), None).await;
        assert_eq!(status, 503);
        assert_eq!(ledger.charge_count().unwrap(), 4);
    }
}
