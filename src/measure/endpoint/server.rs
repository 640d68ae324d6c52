//! The scripted model server: one axum app on 127.0.0.1 that plays the [`Script`], records what
//! it saw ([`Seen`]), answers in its [`Wire`] format, and fires the script's [`Hook`] through
//! [`ServerControl`].

use super::chat::{chat_completion_json, chat_completion_sse};
use super::gemini::gemini_response;
use super::messages::messages_sse;
use super::process::ServerControl;
use super::responses::responses_sse;
use super::script::{Hook, KILL_AFTER, MAX_MODEL_REQUESTS, Script, Step};
use super::wire::{Wire, count_tool_results, offers_tool, side_answer};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the endpoint saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `METHOD /path`.
    pub route: String,
    /// Whether the request offered the probe's tool (a main-loop request).
    pub main_loop: bool,
    /// Tool results the request carried.
    pub tool_results: usize,
    /// The tool-call ids handed out in the answer, in order.
    pub answered_calls: Vec<String>,
}

#[derive(Default)]
struct Inner {
    seen: Vec<Seen>,
    gave_up_while_frozen: bool,
}

#[derive(Clone)]
struct Shared {
    wire: Wire,
    script: Arc<Script>,
    control: ServerControl,
    inner: Arc<Mutex<Inner>>,
}

/// A running scripted endpoint.
pub struct Endpoint {
    /// Base address, `http://127.0.0.1:PORT`.
    pub base: String,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// Starts an endpoint on 127.0.0.1. `pid_file` lists the MCP server's process ids (one per
    /// line) for [`Hook::FreezeServerDuringFirstCall`].
    pub async fn start(
        wire: Wire,
        script: Script,
        pid_file: Option<std::path::PathBuf>,
    ) -> std::io::Result<Endpoint> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let shared = Shared {
            wire,
            script: Arc::new(script),
            control: ServerControl::new(pid_file),
            inner: Arc::new(Mutex::new(Inner::default())),
        };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(crate::http_guard::nodelay(listener), app).await;
        });
        Ok(Endpoint { base, shared, task })
    }

    /// Every request seen so far (what the unit tests check).
    #[cfg(test)]
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .clone()
    }

    /// Whether the client came back to the model while the MCP server was frozen, that is,
    /// gave up on the call instead of waiting until [`FREEZE_LIMIT`](super::script::FREEZE_LIMIT) thawed the server.
    pub fn client_gave_up(&self) -> bool {
        self.shared
            .inner
            .lock()
            .expect("endpoint state")
            .gave_up_while_frozen
    }

    /// Whether any answer so far handed out a tool call.
    pub fn handed_out_tool_calls(&self) -> bool {
        self.shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .iter()
            .any(|s| !s.answered_calls.is_empty())
    }

    /// Whether the MCP server is frozen right now.
    pub fn is_frozen(&self) -> bool {
        self.shared.control.is_frozen()
    }

    /// Thaws a frozen MCP server, if any (also done on drop).
    pub fn thaw(&self) {
        self.shared.control.thaw();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.control.thaw();
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Shared>,
    method: axum::http::Method,
    uri: Uri,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = format!("{method} {}", uri.path());
    let path = uri.path();
    let post = method == axum::http::Method::POST;
    let is_model_request = match shared.wire {
        Wire::Responses => post && path == "/v1/responses",
        Wire::Messages => post && path == "/v1/messages",
        Wire::ChatCompletions => post && path.ends_with("/chat/completions"),
        Wire::Gemini => {
            post && (path.ends_with(":streamGenerateContent") || path.ends_with(":generateContent"))
        }
    };
    if !is_model_request {
        let answer = side_answer(shared.wire, &method, path, &body);
        tracing::info!(%route, answered = answer.is_some(), "scripted endpoint: not a model request");
        shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .push(Seen {
                route,
                main_loop: false,
                tool_results: 0,
                answered_calls: Vec::new(),
            });
        return match answer {
            Some(json) => (StatusCode::OK, axum::Json(json)).into_response(),
            None => (StatusCode::NOT_FOUND, "not scripted").into_response(),
        };
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let main_loop = offers_tool(shared.wire, &request, &shared.script.tool);
    let tool_results = count_tool_results(shared.wire, &request);
    if shared.wire == Wire::Gemini && !main_loop {
        // Gemini CLI's side requests (model routing, next-speaker checks) want JSON of their own
        // schema and retry with backoff on anything else; a 404 makes it fall back at once.
        tracing::info!(%route, "scripted endpoint: Gemini side request, 404");
        shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .push(Seen {
                route,
                main_loop: false,
                tool_results,
                answered_calls: Vec::new(),
            });
        return (StatusCode::NOT_FOUND, "not scripted").into_response();
    }
    let (step, hook_now) = {
        let inner = shared.inner.lock().expect("endpoint state");
        let main_requests = inner.seen.iter().filter(|s| s.main_loop).count();
        // Each return from a tool advances the script by one step. Counting the returns rather
        // than the tool results in the request matters: a client may merge results that share
        // a tool-call id (the duplicate-id scenario), and its request would then never show the
        // script's progress.
        let returns = inner
            .seen
            .iter()
            .filter(|s| s.main_loop && s.tool_results > 0)
            .count();
        let step = if !main_loop || main_requests >= MAX_MODEL_REQUESTS {
            Step::Text
        } else {
            let i = if tool_results == 0 { 0 } else { returns + 1 };
            let i = i.min(shared.script.steps.len().saturating_sub(1));
            shared.script.steps.get(i).cloned().unwrap_or(Step::Text)
        };
        let hook_now = shared.script.hook != Hook::None
            && main_loop
            && step != Step::Text
            && !shared.control.froze_once();
        (step, hook_now)
    };
    if hook_now {
        shared.control.freeze();
        if shared.script.hook == Hook::KillServerDuringFirstCall {
            shared.control.kill_after(KILL_AFTER);
        }
    } else if main_loop && tool_results > 0 && shared.control.is_frozen() {
        // The client came back to the model without the server's answer: it gave up on the
        // call. Let the server read what is queued on its stdin, then end the turn.
        shared
            .inner
            .lock()
            .expect("endpoint state")
            .gave_up_while_frozen = true;
        shared.control.thaw();
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let script = &shared.script;
    let calls = step.calls(&script.arguments);
    let answered_calls: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
    let n = {
        let mut inner = shared.inner.lock().expect("endpoint state");
        inner.seen.push(Seen {
            route,
            main_loop,
            tool_results,
            answered_calls,
        });
        inner.seen.len()
    };
    let (content_type, body) = match shared.wire {
        Wire::Responses => ("text/event-stream", responses_sse(n, &calls, &script.tool)),
        Wire::Messages => (
            "text/event-stream",
            messages_sse(n, &calls, &script.tool, &request),
        ),
        Wire::ChatCompletions => {
            let streamed = request.get("stream").and_then(Value::as_bool) == Some(true);
            if streamed {
                (
                    "text/event-stream",
                    chat_completion_sse(n, &calls, &script.tool, &request),
                )
            } else {
                (
                    "application/json",
                    chat_completion_json(n, &calls, &script.tool, &request).to_string(),
                )
            }
        }
        Wire::Gemini => {
            let answer = gemini_response(n, &calls, &script.tool, path);
            if path.ends_with(":streamGenerateContent") {
                ("text/event-stream", format!("data: {answer}\r\n\r\n"))
            } else {
                ("application/json", answer.to_string())
            }
        }
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(axum::body::Body::from(body))
        .expect("static response parts")
}
