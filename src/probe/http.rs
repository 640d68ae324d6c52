//! The probe on streamable HTTP: an axum layer taps each POST body, then rmcp serves it.
//!
//! The layer reads the body itself (bounded: past [`super::tap::MAX_MESSAGE_BYTES`] it only
//! counts and skims), records it, and either answers it directly (malformed or oversize bodies,
//! `server/discover` under `--legacy-handshake`; see [`super::tap`]) or hands the same bytes to rmcp's
//! `StreamableHttpService` at `/mcp`.
//!
//! # Connections
//! Each MCP session (the `mcp-session-id` that rmcp returns for `initialize`) gets its own
//! [`TapConnection`], so the client name from `initialize` labels every later request of that
//! session. The session id itself is never recorded; records carry a random connection id. A
//! request without a session (a 2026-07-28 stateless request, or a client that skipped
//! `initialize`) is recorded on a fresh connection, labelled by its own `_meta` client info.
//! The `mcp-protocol-version` header is the protocol version when nothing better is known.
//!
//! The tap's answers (see [`super::tap`]) are sent as the HTTP reply: status 200 when the answer
//! carries the request's id, 400 when the id is unknown. Its other decision, to hold back
//! notifications sent before a first request, matters only on stdio, where rmcp would end the
//! session; over HTTP rmcp answers every POST it is given, so everything else is forwarded.

use super::error::ProbeError;
use super::server::ProbeServer;
use super::tap::{Accumulator, Frame, Tap, TapConnection};
use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

struct HttpTap {
    tap: Arc<Tap>,
    sessions: Mutex<HashMap<String, TapConnection>>,
}

/// Serves MCP at [`crate::serve::MCP_PATH`] on `bound` until the process ends. Every request
/// passes the bound address's [`crate::http_guard::Guard`] before the tap sees it: a refused
/// request is neither recorded nor answered by MCP.
pub async fn serve_http(
    bound: crate::http_guard::Bound,
    tap: Arc<Tap>,
    server: ProbeServer,
) -> Result<(), ProbeError> {
    let state = Arc::new(HttpTap {
        tap,
        sessions: Mutex::new(HashMap::new()),
    });
    crate::serve::http(server, bound, "probe", |app| {
        app.layer(axum::middleware::from_fn_with_state(state, tap_layer))
    })
    .await
    .map_err(|source| ProbeError::Io {
        doing: "serving HTTP",
        source,
    })
}

async fn tap_layer(State(st): State<Arc<HttpTap>>, req: Request, next: Next) -> Response {
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if req.method() == Method::DELETE {
        if let Some(s) = &session {
            st.sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(s);
        }
        return next.run(req).await;
    }
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let protocol = req
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (parts, mut body) = req.into_parts();
    let mut acc = Accumulator::default();
    loop {
        match std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    acc.push(data);
                }
            }
            Some(Err(e)) => {
                tracing::debug!("reading a request body failed: {e}");
                return (StatusCode::BAD_REQUEST, "failed to read the request body")
                    .into_response();
            }
        }
    }
    let frame = acc.take();
    let (obs, fresh) = {
        let mut sessions = st.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let mut fresh = None;
        let conn = match session.as_ref() {
            Some(s) => sessions
                .entry(s.clone())
                .or_insert_with(|| st.tap.connection()),
            None => fresh.insert(st.tap.connection()),
        };
        conn.set_header_protocol(protocol.as_deref());
        (conn.client_frame(&frame), fresh)
    };
    if let Some(answer) = obs.answer {
        let status = if answer["id"].is_null() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        return (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&answer).expect("a Value serializes"),
        )
            .into_response();
    }
    let bytes = match frame {
        Frame::Message(bytes) => bytes,
        // An oversize notification: recorded, refused, nothing to answer at the JSON-RPC level.
        Frame::Oversize { .. } => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "message exceeds 1 MiB").into_response();
        }
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(Bytes::from(bytes))))
        .await;
    if let (Some(conn), Some(new_session)) = (
        fresh,
        response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok()),
    ) {
        st.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(new_session.to_string(), conn);
    }
    response
}
