//! Scripted model endpoints on loopback: the OpenAI Responses API (Codex), the Anthropic
//! Messages API (Claude Code), OpenAI Chat Completions (streamed or not: most other clients) and
//! the Gemini API's `streamGenerateContent` (Gemini CLI).
//!
//! The endpoint plays the model. It answers the first main-loop request with the first step of
//! its [`Script`] and each request that comes back from a tool with the next one. A step hands
//! out one tool call, or several in one answer ([`Step::ToolCalls`]), in every wire format. A request that does not offer the probe's tool (a title or quota side request) gets a
//! short text answer. After [`MAX_MODEL_REQUESTS`] requests every answer is final text, so a
//! client that loops still stops.
//!
//! # Guarantees
//! - Binds 127.0.0.1 only, port chosen by the OS.
//! - Records, per request, only what the measurement needs: path, whether it was a main-loop
//!   request, how many tool results it carried, and which scripted tool-call id it answered with.
//!   Prompt text and tool output are not kept.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most model requests answered with a scripted step; later ones always get final text.
pub const MAX_MODEL_REQUESTS: usize = 12;
/// Final text the scripted model ends with.
pub const FINAL_TEXT: &str = "Done: the probe answered.";
/// The model name the endpoint answers as when the request names none, and lists.
pub const SCRIPTED_MODEL: &str = "scripted-model";
/// The fixed `created` time of every Chat Completions answer (answers do not depend on the clock).
pub const CREATED: u64 = 1_767_225_600;

/// Which wire format the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `POST /v1/responses`, OpenAI Responses API (Codex).
    Responses,
    /// `POST /v1/messages`, Anthropic Messages API (Claude Code).
    Messages,
    /// `POST .../chat/completions`, OpenAI Chat Completions, as server-sent events when the
    /// request says `"stream": true` and as one JSON object otherwise; `GET .../models` lists
    /// the requested model.
    ChatCompletions,
    /// `POST .../models/MODEL:streamGenerateContent?alt=sse` (and the unstreamed
    /// `:generateContent` and `:countTokens`), the Gemini API.
    Gemini,
}

/// One answer of the scripted model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Call the probe's tool with this tool-call id and empty arguments.
    ToolCall {
        /// The model's tool-call id (`call_...` for Responses, `toolu_...` for Messages).
        id: String,
    },
    /// Call the probe's tool several times in one answer, in this order.
    ToolCalls(Vec<ScriptedCall>),
    /// End the turn with text.
    Text,
}

/// One tool call of a [`Step::ToolCalls`] answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedCall {
    /// The model's tool-call id.
    pub id: String,
    /// The arguments, exactly as the model passes them to the tool the client offers.
    pub arguments: Value,
}

impl Step {
    /// The tool calls this answer hands out (none for text); a [`Step::ToolCall`] carries the
    /// script's `arguments`.
    pub fn calls(&self, arguments: &Value) -> Vec<ScriptedCall> {
        match self {
            Step::ToolCall { id } => vec![ScriptedCall {
                id: id.clone(),
                arguments: arguments.clone(),
            }],
            Step::ToolCalls(calls) => calls.clone(),
            Step::Text => Vec::new(),
        }
    }
}

/// What the endpoint does besides answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Nothing.
    None,
    /// Freeze the MCP server (SIGSTOP) just before handing out the first tool call, so the call
    /// cannot be answered; thaw it (SIGCONT) when the client comes back to the model, or after
    /// [`FREEZE_LIMIT`] if it never does.
    FreezeServerDuringFirstCall,
    /// Freeze the MCP server just before handing out the first tool call, then kill it
    /// (SIGKILL) [`KILL_AFTER`] later, while the call is in flight.
    KillServerDuringFirstCall,
}

/// How long after handing out the first tool call the frozen server is killed.
pub const KILL_AFTER: Duration = Duration::from_millis(2500);

/// Longest the MCP server is kept frozen.
pub const FREEZE_LIMIT: Duration = Duration::from_secs(40);

/// The model's side of one measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// Answers, by number of tool results in the request; the last repeats.
    pub steps: Vec<Step>,
    /// The probe tool's name as the client presents it to the model.
    pub tool: ToolName,
    /// The arguments of each scripted tool call (`{}` for the probe's tool itself; a client that
    /// reaches MCP tools through a tool of its own needs the probe's tool named here).
    pub arguments: Value,
    /// Side effect around the first tool call.
    pub hook: Hook,
}

/// How the client names the probe's tool to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolName {
    /// Codex: a function inside a namespace (`mcp__probe` / `capabilities`).
    Namespaced {
        /// The namespace.
        namespace: String,
        /// The function.
        name: String,
    },
    /// Claude Code: one flat name (`mcp__probe__capabilities`).
    Flat(String),
}

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
    frozen: Option<Vec<u32>>,
    froze_once: bool,
    gave_up_while_frozen: bool,
}

#[derive(Clone)]
struct Shared {
    wire: Wire,
    script: Arc<Script>,
    pid_file: Option<std::path::PathBuf>,
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
            pid_file,
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
    /// gave up on the call instead of waiting until [`FREEZE_LIMIT`] thawed the server.
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
        self.shared
            .inner
            .lock()
            .expect("endpoint state")
            .frozen
            .is_some()
    }

    /// Thaws a frozen MCP server, if any (also done on drop).
    pub fn thaw(&self) {
        thaw(&self.shared);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        thaw(&self.shared);
        self.task.abort();
    }
}

fn signal(pids: &[u32], sig: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args(["-s", sig, "--", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn freeze(shared: &Shared) {
    let Some(pid_file) = &shared.pid_file else {
        return;
    };
    let pids: Vec<u32> = std::fs::read_to_string(pid_file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    signal(&pids, "STOP");
    tracing::info!(?pids, "froze the MCP server");
    let mut inner = shared.inner.lock().expect("endpoint state");
    inner.frozen = Some(pids);
    inner.froze_once = true;
    drop(inner);
    let again = shared.clone();
    std::thread::spawn(move || {
        std::thread::sleep(FREEZE_LIMIT);
        thaw(&again);
    });
}

fn thaw(shared: &Shared) {
    let pids = shared.inner.lock().expect("endpoint state").frozen.take();
    if let Some(pids) = pids {
        signal(&pids, "CONT");
        tracing::info!(?pids, "thawed the MCP server");
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
            && !inner.froze_once;
        (step, hook_now)
    };
    if hook_now {
        freeze(&shared);
        if shared.script.hook == Hook::KillServerDuringFirstCall {
            let again = shared.clone();
            std::thread::spawn(move || {
                std::thread::sleep(KILL_AFTER);
                let pids = again.inner.lock().expect("endpoint state").frozen.take();
                if let Some(pids) = pids {
                    signal(&pids, "KILL");
                    tracing::info!(?pids, "killed the MCP server mid-call");
                }
            });
        }
    } else if main_loop && tool_results > 0 && shared.inner.lock().expect("state").frozen.is_some()
    {
        // The client came back to the model without the server's answer: it gave up on the
        // call. Let the server read what is queued on its stdin, then end the turn.
        shared
            .inner
            .lock()
            .expect("endpoint state")
            .gave_up_while_frozen = true;
        thaw(&shared);
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

/// The answer to a request that is not a model turn, if the wire has one: the model list of
/// Chat Completions and the Gemini API, and Gemini's token count. Anything else is a 404.
fn side_answer(wire: Wire, method: &axum::http::Method, path: &str, _body: &[u8]) -> Option<Value> {
    let get = method == axum::http::Method::GET;
    match wire {
        Wire::ChatCompletions if get && path.ends_with("/models") => Some(json!({
            "object": "list",
            "data": [{"id": SCRIPTED_MODEL, "object": "model", "created": CREATED, "owned_by": "callid"}],
        })),
        Wire::Gemini if method == axum::http::Method::POST && path.ends_with(":countTokens") => {
            Some(json!({"totalTokens": 10}))
        }
        Wire::Gemini if get && path.ends_with("/models") => Some(json!({
            "models": [{"name": format!("models/{SCRIPTED_MODEL}"), "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"]}],
        })),
        _ => None,
    }
}

/// Whether a model request offers the probe's tool.
pub fn offers_tool(wire: Wire, request: &Value, tool: &ToolName) -> bool {
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    tools.iter().any(|t| match (wire, tool) {
        (Wire::Responses, ToolName::Namespaced { namespace, name }) => {
            t.get("name").and_then(Value::as_str) == Some(namespace)
                && t.get("tools")
                    .and_then(Value::as_array)
                    .is_some_and(|inner| {
                        inner
                            .iter()
                            .any(|f| f.get("name").and_then(Value::as_str) == Some(name))
                    })
        }
        (Wire::ChatCompletions, ToolName::Flat(name)) => {
            t.pointer("/function/name").and_then(Value::as_str) == Some(name)
        }
        (Wire::Gemini, ToolName::Flat(name)) => t
            .get("functionDeclarations")
            .and_then(Value::as_array)
            .is_some_and(|decls| {
                decls
                    .iter()
                    .any(|f| f.get("name").and_then(Value::as_str) == Some(name))
            }),
        (_, ToolName::Flat(name)) => t.get("name").and_then(Value::as_str) == Some(name),
        (_, ToolName::Namespaced { .. }) => false,
    })
}

/// How many tool results a model request carries.
pub fn count_tool_results(wire: Wire, request: &Value) -> usize {
    match wire {
        Wire::Responses => request
            .get("input")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter(|i| {
                        i.get("type").and_then(Value::as_str) == Some("function_call_output")
                    })
                    .count()
            })
            .unwrap_or(0),
        Wire::Messages => request
            .get("messages")
            .and_then(Value::as_array)
            .map(|messages| {
                messages
                    .iter()
                    .filter_map(|m| m.get("content").and_then(Value::as_array))
                    .flatten()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                    .count()
            })
            .unwrap_or(0),
        Wire::ChatCompletions => request
            .get("messages")
            .and_then(Value::as_array)
            .map(|messages| {
                messages
                    .iter()
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
                    .count()
            })
            .unwrap_or(0),
        Wire::Gemini => request
            .get("contents")
            .and_then(Value::as_array)
            .map(|contents| {
                contents
                    .iter()
                    .filter_map(|c| c.get("parts").and_then(Value::as_array))
                    .flatten()
                    .filter(|p| p.get("functionResponse").is_some())
                    .count()
            })
            .unwrap_or(0),
    }
}

fn sse(out: &mut String, event: &str, data: Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// The Responses API stream for one answer: one output item per tool call, or a message when
/// `calls` is empty.
pub fn responses_sse(n: usize, calls: &[ScriptedCall], tool: &ToolName) -> String {
    let response_id = format!("resp_scripted{n:04}");
    let mut out = String::new();
    sse(
        &mut out,
        "response.created",
        json!({"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}}),
    );
    let (namespace, name) = match tool {
        ToolName::Namespaced { namespace, name } => (Some(namespace.as_str()), name.as_str()),
        ToolName::Flat(name) => (None, name.as_str()),
    };
    let items: Vec<Value> = if calls.is_empty() {
        vec![json!({
            "type": "message",
            "id": format!("msg_scripted{n:04}"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
        })]
    } else {
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut item = json!({
                    "type": "function_call",
                    "id": format!("fc_scripted{n:04}{i}"),
                    "call_id": call.id,
                    "name": name,
                    "arguments": call.arguments.to_string(),
                    "status": "completed",
                });
                if let Some(ns) = namespace {
                    item["namespace"] = json!(ns);
                }
                item
            })
            .collect()
    };
    for (i, item) in items.iter().enumerate() {
        sse(
            &mut out,
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": i, "item": item}),
        );
        sse(
            &mut out,
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": i, "item": item}),
        );
    }
    sse(
        &mut out,
        "response.completed",
        json!({"type": "response.completed", "response": {
            "id": response_id, "status": "completed", "output": items,
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 15}}}),
    );
    out
}

/// The Messages API stream for one answer: one `tool_use` block per tool call, or a text block
/// when `calls` is empty.
pub fn messages_sse(n: usize, calls: &[ScriptedCall], tool: &ToolName, request: &Value) -> String {
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("scripted-model");
    let mut out = String::new();
    sse(
        &mut out,
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_scripted{n:04}"), "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    );
    let stop_reason = if calls.is_empty() {
        sse(
            &mut out,
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
        );
        sse(
            &mut out,
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": FINAL_TEXT}}),
        );
        sse(
            &mut out,
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        );
        "end_turn"
    } else {
        let name = flat_name(tool);
        for (i, call) in calls.iter().enumerate() {
            sse(
                &mut out,
                "content_block_start",
                json!({"type": "content_block_start", "index": i,
                       "content_block": {"type": "tool_use", "id": call.id, "name": name, "input": {}}}),
            );
            sse(
                &mut out,
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i,
                       "delta": {"type": "input_json_delta", "partial_json": call.arguments.to_string()}}),
            );
            sse(
                &mut out,
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
        "tool_use"
    };
    sse(
        &mut out,
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    );
    sse(&mut out, "message_stop", json!({"type": "message_stop"}));
    out
}

/// The tool's name as one flat string.
fn flat_name(tool: &ToolName) -> String {
    match tool {
        ToolName::Flat(name) => name.clone(),
        ToolName::Namespaced { namespace, name } => format!("{namespace}__{name}"),
    }
}

fn request_model(request: &Value) -> &str {
    request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(SCRIPTED_MODEL)
}

const CHAT_USAGE: fn() -> Value =
    || json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15});

/// The Chat Completions answer for one step as one JSON object (`"stream": false`).
pub fn chat_completion_json(
    n: usize,
    calls: &[ScriptedCall],
    tool: &ToolName,
    request: &Value,
) -> Value {
    let (message, finish) = if calls.is_empty() {
        (json!({"role": "assistant", "content": FINAL_TEXT}), "stop")
    } else {
        let tool_calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                json!({"id": call.id, "type": "function",
                       "function": {"name": flat_name(tool), "arguments": call.arguments.to_string()}})
            })
            .collect();
        (
            json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
            "tool_calls",
        )
    };
    json!({
        "id": format!("chatcmpl-scripted{n:04}"),
        "object": "chat.completion",
        "created": CREATED,
        "model": request_model(request),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": CHAT_USAGE(),
    })
}

/// The Chat Completions answer for one step as server-sent events (`"stream": true`): the
/// role, each tool call's name and id then its arguments (`index` 0, 1, ...), the finish
/// reason, a usage chunk, `[DONE]`.
pub fn chat_completion_sse(
    n: usize,
    calls: &[ScriptedCall],
    tool: &ToolName,
    request: &Value,
) -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": format!("chatcmpl-scripted{n:04}"),
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": request_model(request),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        })
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let finish = if calls.is_empty() {
        chunks.push(chunk(json!({"content": FINAL_TEXT}), Value::Null));
        "stop"
    } else {
        for (i, call) in calls.iter().enumerate() {
            chunks.push(chunk(
                json!({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                    "function": {"name": flat_name(tool), "arguments": ""}}]}),
                Value::Null,
            ));
            chunks.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": call.arguments.to_string()}}]}),
                Value::Null,
            ));
        }
        "tool_calls"
    };
    chunks.push(chunk(json!({}), json!(finish)));
    let mut usage = chunk(json!({}), Value::Null);
    usage["choices"] = json!([]);
    usage["usage"] = CHAT_USAGE();
    chunks.push(usage);
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// The Gemini API answer for one step (`GenerateContentResponse`), streamed as one SSE event by
/// `:streamGenerateContent` and sent as is by `:generateContent`. The model name comes from the
/// path (`.../models/MODEL:method`).
pub fn gemini_response(n: usize, calls: &[ScriptedCall], tool: &ToolName, path: &str) -> Value {
    let model = path
        .rsplit('/')
        .next()
        .and_then(|last| last.split(':').next())
        .filter(|m| !m.is_empty())
        .unwrap_or(SCRIPTED_MODEL);
    let parts: Vec<Value> = if calls.is_empty() {
        vec![json!({"text": FINAL_TEXT})]
    } else {
        calls
            .iter()
            .map(|call| {
                json!({"functionCall": {"id": call.id, "name": flat_name(tool), "args": call.arguments}})
            })
            .collect()
    };
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": model,
        "responseId": format!("scripted{n:04}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `data:` payloads of an SSE body, with their event names.
    fn events(body: &str) -> Vec<(String, Value)> {
        body.split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .map(|block| {
                let event = block
                    .lines()
                    .find_map(|l| l.strip_prefix("event: "))
                    .unwrap()
                    .to_owned();
                let data = block
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap();
                (event, serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    async fn post(base: &str, path: &str, body: Value) -> (u16, String) {
        let r = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    #[tokio::test]
    async fn responses_endpoint_plays_the_script_over_a_real_socket() {
        let tool = ToolName::Namespaced {
            namespace: "mcp__probe".into(),
            name: "capabilities".into(),
        };
        let script = Script {
            steps: vec![
                Step::ToolCall {
                    id: "call_a".into(),
                },
                Step::Text,
            ],
            tool: tool.clone(),
            arguments: json!({}),
            hook: Hook::None,
        };
        let ep = Endpoint::start(Wire::Responses, script, None)
            .await
            .unwrap();
        // The shape Codex 0.171.0 sends: the MCP tools as a namespace among other tools.
        let tools = json!([
            {"type": "function", "name": "exec_command", "parameters": {}},
            {"type": "namespace", "name": "mcp__probe", "tools": [
                {"type": "function", "name": "capabilities", "parameters": {"type": "object"}}]}
        ]);
        let first = json!({"model": "gpt-5", "stream": true, "tools": tools,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
        let (status, body) = post(&ep.base, "/v1/responses", first).await;
        assert_eq!(status, 200);
        let ev = events(&body);
        let names: Vec<&str> = ev.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.output_item.added",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let item = &ev[2].1["item"];
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["call_id"], "call_a");
        assert_eq!(item["namespace"], "mcp__probe");
        assert_eq!(item["name"], "capabilities");
        assert!(ev[3].1["response"]["usage"]["total_tokens"].is_u64());
        let second = json!({"model": "gpt-5", "stream": true, "tools": tools, "input": [
            {"type": "function_call", "call_id": "call_a", "name": "capabilities"},
            {"type": "function_call_output", "call_id": "call_a", "output": "ok"}]});
        let (_, body) = post(&ep.base, "/v1/responses", second).await;
        let ev = events(&body);
        assert_eq!(ev[2].1["item"]["type"], "message");
        assert_eq!(ev[2].1["item"]["content"][0]["text"], FINAL_TEXT);
        // A side request without the probe's tool, and an unknown path.
        let (_, body) = post(&ep.base, "/v1/responses", json!({"input": []})).await;
        assert_eq!(events(&body)[2].1["item"]["type"], "message");
        let (status, _) = post(&ep.base, "/v1/models", json!({})).await;
        assert_eq!(status, 404);
        let seen = ep.seen();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[0].answered_calls, ["call_a"]);
        assert_eq!((seen[1].main_loop, seen[1].tool_results), (true, 1));
        assert!(!seen[2].main_loop);
    }

    #[tokio::test]
    async fn messages_endpoint_plays_the_script_over_a_real_socket() {
        let tool = ToolName::Flat("mcp__probe__capabilities".into());
        let script = Script {
            steps: vec![
                Step::ToolCall {
                    id: "toolu_x".into(),
                },
                Step::ToolCall {
                    id: "toolu_x".into(),
                },
                Step::Text,
            ],
            tool,
            arguments: json!({}),
            hook: Hook::None,
        };
        let ep = Endpoint::start(Wire::Messages, script, None).await.unwrap();
        let tools = json!([{"name": "Bash", "input_schema": {}},
                           {"name": "mcp__probe__capabilities", "input_schema": {"type": "object"}}]);
        let user = json!({"role": "user", "content": "hi"});
        let (status, body) = post(
            &ep.base,
            "/v1/messages",
            json!({"model": "claude-x", "stream": true, "tools": tools, "messages": [user]}),
        )
        .await;
        assert_eq!(status, 200);
        let ev = events(&body);
        let names: Vec<&str> = ev.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[0].1["message"]["model"], "claude-x");
        assert_eq!(ev[1].1["content_block"]["type"], "tool_use");
        assert_eq!(ev[1].1["content_block"]["id"], "toolu_x");
        assert_eq!(ev[1].1["content_block"]["name"], "mcp__probe__capabilities");
        assert_eq!(ev[2].1["delta"]["type"], "input_json_delta");
        assert_eq!(ev[4].1["delta"]["stop_reason"], "tool_use");
        // A client that merges results sharing one tool-call id still moves the script on.
        let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "ok"}]});
        for want in ["tool_use", "end_turn"] {
            let (_, body) = post(
                &ep.base,
                "/v1/messages",
                json!({"model": "claude-x", "tools": tools, "messages": [user, result]}),
            )
            .await;
            assert_eq!(events(&body)[4].1["delta"]["stop_reason"], want);
        }
    }

    /// The `data:` payloads of an SSE body without event names (Chat Completions, Gemini).
    fn data_lines(body: &str) -> Vec<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    fn flat_script(name: &str, ids: &[&str], arguments: Value) -> Script {
        let mut steps: Vec<Step> = ids
            .iter()
            .map(|id| Step::ToolCall { id: (*id).into() })
            .collect();
        steps.push(Step::Text);
        Script {
            steps,
            tool: ToolName::Flat(name.into()),
            arguments,
            hook: Hook::None,
        }
    }

    #[tokio::test]
    async fn chat_completions_endpoint_streams_and_answers_plain_json() {
        let script = flat_script("probe_capabilities", &["call_a", "call_b"], json!({"x": 1}));
        let ep = Endpoint::start(Wire::ChatCompletions, script, None)
            .await
            .unwrap();
        let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": {}}},
                           {"type": "function", "function": {"name": "probe_capabilities", "parameters": {}}}]);
        let user = json!({"role": "user", "content": "hi"});
        let (status, body) = post(
            &ep.base,
            "/v1/chat/completions",
            json!({"model": "m1", "stream": true, "tools": tools, "messages": [user]}),
        )
        .await;
        assert_eq!(status, 200);
        let data = data_lines(&body);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "m1")
        );
        let call = &chunks[1]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["id"], "call_a");
        assert_eq!(call["function"]["name"], "probe_capabilities");
        let args = &chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"];
        assert_eq!(args, "{\"x\":1}");
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[4]["usage"]["total_tokens"], 15);
        // The tool's answer comes back unstreamed: the next step, as one JSON object.
        let result = json!({"role": "tool", "tool_call_id": "call_a", "content": "ok"});
        let (_, body) = post(
            &ep.base,
            "/chat/completions",
            json!({"model": "m1", "tools": tools, "messages": [user, result]}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["id"], "call_b");
        let (_, body) = post(
            &ep.base,
            "/v1/chat/completions",
            json!({"model": "m1", "tools": tools, "messages": [user, result, result]}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], FINAL_TEXT);
        // A side request without the tool gets text; the model list is served.
        let (_, body) = post(
            &ep.base,
            "/v1/chat/completions",
            json!({"messages": [user]}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let models: Value = reqwest::get(format!("{}/v1/models", ep.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], SCRIPTED_MODEL);
        let seen = ep.seen();
        assert_eq!(seen.len(), 5);
        assert_eq!(seen[1].answered_calls, ["call_b"]);
        assert!(!seen[3].main_loop && !seen[4].main_loop);
    }

    #[tokio::test]
    async fn gemini_endpoint_streams_function_calls() {
        let script = flat_script("capabilities", &["gem_a"], json!({}));
        let ep = Endpoint::start(Wire::Gemini, script, None).await.unwrap();
        let tools =
            json!([{"functionDeclarations": [{"name": "read_file"}, {"name": "capabilities"}]}]);
        let user = json!({"role": "user", "parts": [{"text": "hi"}]});
        let path = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse";
        let (status, body) =
            post(&ep.base, path, json!({"contents": [user], "tools": tools})).await;
        assert_eq!(status, 200);
        let data = data_lines(&body);
        assert_eq!(data.len(), 1);
        let v: Value = serde_json::from_str(&data[0]).unwrap();
        let call = &v["candidates"][0]["content"]["parts"][0]["functionCall"];
        assert_eq!(
            (call["id"].as_str(), call["name"].as_str()),
            (Some("gem_a"), Some("capabilities"))
        );
        assert_eq!(v["modelVersion"], "gemini-x");
        let answer = json!({"role": "user", "parts": [{"functionResponse": {"id": "gem_a", "name": "capabilities", "response": {}}}]});
        let model = json!({"role": "model", "parts": [{"functionCall": {"name": "capabilities"}}]});
        let (_, body) = post(
            &ep.base,
            path,
            json!({"contents": [user, model, answer], "tools": tools}),
        )
        .await;
        let v: Value = serde_json::from_str(&data_lines(&body)[0]).unwrap();
        assert_eq!(
            v["candidates"][0]["content"]["parts"][0]["text"],
            FINAL_TEXT
        );
        // A side request without the tool is refused, so the client falls back at once; an
        // unstreamed main-loop request is answered as one JSON object; token counts are served.
        let (status, _) = post(
            &ep.base,
            "/v1beta/models/gemini-x:generateContent",
            json!({"contents": [user]}),
        )
        .await;
        assert_eq!(status, 404);
        let (_, body) = post(
            &ep.base,
            "/v1beta/models/gemini-x:generateContent",
            json!({"contents": [user, model, answer], "tools": tools}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["candidates"][0]["content"]["parts"][0]["text"],
            FINAL_TEXT
        );
        let (status, body) = post(&ep.base, "/v1beta/models/gemini-x:countTokens", json!({})).await;
        assert_eq!((status, body.contains("totalTokens")), (200, true));
        let seen = ep.seen();
        assert_eq!(seen[0].answered_calls, ["gem_a"]);
        assert_eq!((seen[1].main_loop, seen[1].tool_results), (true, 1));
    }

    fn two_calls() -> Vec<ScriptedCall> {
        vec![
            ScriptedCall {
                id: "call_a".into(),
                arguments: json!({"note": "first"}),
            },
            ScriptedCall {
                id: "call_b".into(),
                arguments: json!({"note": "second"}),
            },
        ]
    }

    /// (id, arguments) of every tool call in an answer, in order.
    fn handed_out(pairs: impl IntoIterator<Item = (Value, Value)>) -> Vec<(String, Value)> {
        pairs
            .into_iter()
            .map(|(id, args)| {
                let args = match args {
                    Value::String(text) => serde_json::from_str(&text).unwrap(),
                    other => other,
                };
                (id.as_str().unwrap().to_owned(), args)
            })
            .collect()
    }

    #[test]
    fn one_answer_hands_out_every_call_in_every_wire() {
        let calls = two_calls();
        let want: Vec<(String, Value)> = calls
            .iter()
            .map(|c| (c.id.clone(), c.arguments.clone()))
            .collect();
        let flat = ToolName::Flat("probe_capabilities".into());
        let namespaced = ToolName::Namespaced {
            namespace: "mcp__probe".into(),
            name: "capabilities".into(),
        };
        // Responses: one output item per call, each added and done at its own index.
        let ev = events(&responses_sse(1, &calls, &namespaced));
        let done: Vec<&Value> = ev
            .iter()
            .filter(|(e, _)| e == "response.output_item.done")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(
            done.iter()
                .map(|d| d["output_index"].clone())
                .collect::<Vec<_>>(),
            [json!(0), json!(1)]
        );
        let output = ev.last().unwrap().1["response"]["output"]
            .as_array()
            .unwrap();
        assert_eq!(
            handed_out(
                output
                    .iter()
                    .map(|i| (i["call_id"].clone(), i["arguments"].clone()))
            ),
            want
        );
        assert!(output.iter().all(|i| i["namespace"] == "mcp__probe"));
        // Messages: one tool_use block per call, its input streamed as JSON.
        let ev = events(&messages_sse(1, &calls, &flat, &json!({})));
        let ids = ev
            .iter()
            .filter(|(e, _)| e == "content_block_start")
            .map(|(_, d)| d["content_block"]["id"].clone());
        let inputs = ev
            .iter()
            .filter(|(e, _)| e == "content_block_delta")
            .map(|(_, d)| d["delta"]["partial_json"].clone());
        assert_eq!(handed_out(ids.zip(inputs)), want);
        assert_eq!(
            ev.iter().filter(|(e, _)| e == "content_block_stop").count(),
            2
        );
        // Chat Completions, unstreamed and streamed.
        let v = chat_completion_json(1, &calls, &flat, &json!({}));
        let tool_calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(
            handed_out(
                tool_calls
                    .iter()
                    .map(|c| (c["id"].clone(), c["function"]["arguments"].clone()))
            ),
            want
        );
        let body = chat_completion_sse(1, &calls, &flat, &json!({}));
        let deltas: Vec<Value> = data_lines(&body)
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<Value>(d).unwrap())
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]
                    .as_object()
                    .cloned()
            })
            .map(Value::Object)
            .collect();
        assert_eq!(
            deltas
                .iter()
                .map(|d| d["index"].clone())
                .collect::<Vec<_>>(),
            [json!(0), json!(0), json!(1), json!(1)]
        );
        let ids = deltas.iter().step_by(2).map(|d| d["id"].clone());
        let args = deltas
            .iter()
            .skip(1)
            .step_by(2)
            .map(|d| d["function"]["arguments"].clone());
        assert_eq!(handed_out(ids.zip(args)), want);
        // Gemini: one functionCall part per call.
        let v = gemini_response(1, &calls, &flat, "/v1beta/models/g:generateContent");
        let parts = v["candidates"][0]["content"]["parts"].as_array().unwrap();
        assert_eq!(
            handed_out(parts.iter().map(|p| (
                p["functionCall"]["id"].clone(),
                p["functionCall"]["args"].clone()
            ))),
            want
        );
    }

    #[tokio::test]
    async fn one_answer_then_text_once_both_results_come_back() {
        let mut script = flat_script("probe_capabilities", &[], json!({}));
        script.steps.insert(0, Step::ToolCalls(two_calls()));
        let ep = Endpoint::start(Wire::ChatCompletions, script, None)
            .await
            .unwrap();
        let tools = json!([{"type": "function", "function": {"name": "probe_capabilities", "parameters": {}}}]);
        let user = json!({"role": "user", "content": "hi"});
        let (_, body) = post(
            &ep.base,
            "/v1/chat/completions",
            json!({"tools": tools, "messages": [user]}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["tool_calls"][1]["id"], "call_b");
        let a = json!({"role": "tool", "tool_call_id": "call_a", "content": "ok"});
        let b = json!({"role": "tool", "tool_call_id": "call_b", "content": "ok"});
        let (_, body) = post(
            &ep.base,
            "/v1/chat/completions",
            json!({"tools": tools, "messages": [user, a, b]}),
        )
        .await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], FINAL_TEXT);
        let seen = ep.seen();
        assert_eq!(seen[0].answered_calls, ["call_a", "call_b"]);
        assert!(seen[1].answered_calls.is_empty());
    }

    #[test]
    fn counts_tool_results_in_every_wire() {
        let r = json!({"input": [{"type": "function_call_output"}, {"type": "message"}, {"type": "function_call_output"}]});
        assert_eq!(count_tool_results(Wire::Responses, &r), 2);
        let m = json!({"messages": [{"role": "user", "content": "x"},
            {"role": "user", "content": [{"type": "tool_result"}, {"type": "text"}]}]});
        assert_eq!(count_tool_results(Wire::Messages, &m), 1);
        assert_eq!(count_tool_results(Wire::Messages, &json!({})), 0);
        let c = json!({"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "tool"}]});
        assert_eq!(count_tool_results(Wire::ChatCompletions, &c), 2);
        let g = json!({"contents": [{"parts": [{"text": "x"}]}, {"parts": [{"functionResponse": {}}, {"functionResponse": {}}]}]});
        assert_eq!(count_tool_results(Wire::Gemini, &g), 2);
    }
}
