//! Scripted model endpoints on loopback: the OpenAI Responses API (Codex) and the Anthropic
//! Messages API (Claude Code), both streamed as server-sent events.
//!
//! The endpoint plays the model. It answers the first main-loop request with the first step of
//! its [`Script`] and each request that comes back from a tool with the next one. A request that does not offer the probe's tool (a title or quota side request) gets a
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

/// Which wire format the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `POST /v1/responses`, OpenAI Responses API (Codex).
    Responses,
    /// `POST /v1/messages`, Anthropic Messages API (Claude Code).
    Messages,
}

/// One answer of the scripted model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Call the probe's tool with this tool-call id and empty arguments.
    ToolCall {
        /// The model's tool-call id (`call_...` for Responses, `toolu_...` for Messages).
        id: String,
    },
    /// End the turn with text.
    Text,
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
    /// The tool-call id handed out in the answer, if any.
    pub answered_call: Option<String>,
}

#[derive(Default)]
struct Inner {
    seen: Vec<Seen>,
    frozen: Option<Vec<u32>>,
    froze_once: bool,
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
            let _ = axum::serve(listener, app).await;
        });
        Ok(Endpoint { base, shared, task })
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .clone()
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
    let expected = match shared.wire {
        Wire::Responses => "/v1/responses",
        Wire::Messages => "/v1/messages",
    };
    if method != axum::http::Method::POST || uri.path() != expected {
        tracing::info!(%route, "scripted endpoint: not a model request, 404");
        shared
            .inner
            .lock()
            .expect("endpoint state")
            .seen
            .push(Seen {
                route,
                main_loop: false,
                tool_results: 0,
                answered_call: None,
            });
        return (StatusCode::NOT_FOUND, "not scripted").into_response();
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let main_loop = offers_tool(shared.wire, &request, &shared.script.tool);
    let tool_results = count_tool_results(shared.wire, &request);
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
            && matches!(step, Step::ToolCall { .. })
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
        thaw(&shared);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let answered_call = match &step {
        Step::ToolCall { id } => Some(id.clone()),
        Step::Text => None,
    };
    let n = {
        let mut inner = shared.inner.lock().expect("endpoint state");
        inner.seen.push(Seen {
            route,
            main_loop,
            tool_results,
            answered_call,
        });
        inner.seen.len()
    };
    let body = match shared.wire {
        Wire::Responses => responses_sse(n, &step, &shared.script.tool),
        Wire::Messages => messages_sse(n, &step, &shared.script.tool, &request),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(axum::body::Body::from(body))
        .expect("static response parts")
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
        (_, ToolName::Flat(name)) => t.get("name").and_then(Value::as_str) == Some(name),
        (Wire::Messages, ToolName::Namespaced { .. }) => false,
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
    }
}

fn sse(out: &mut String, event: &str, data: Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// The Responses API stream for one step.
pub fn responses_sse(n: usize, step: &Step, tool: &ToolName) -> String {
    let response_id = format!("resp_scripted{n:04}");
    let mut out = String::new();
    sse(
        &mut out,
        "response.created",
        json!({"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}}),
    );
    let item = match step {
        Step::ToolCall { id } => {
            let (namespace, name) = match tool {
                ToolName::Namespaced { namespace, name } => {
                    (Some(namespace.as_str()), name.as_str())
                }
                ToolName::Flat(name) => (None, name.as_str()),
            };
            let mut item = json!({
                "type": "function_call",
                "id": format!("fc_scripted{n:04}"),
                "call_id": id,
                "name": name,
                "arguments": "{}",
                "status": "completed",
            });
            if let Some(ns) = namespace {
                item["namespace"] = json!(ns);
            }
            item
        }
        Step::Text => json!({
            "type": "message",
            "id": format!("msg_scripted{n:04}"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
        }),
    };
    sse(
        &mut out,
        "response.output_item.added",
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
    );
    sse(
        &mut out,
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    );
    sse(
        &mut out,
        "response.completed",
        json!({"type": "response.completed", "response": {
            "id": response_id, "status": "completed", "output": [item],
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 15}}}),
    );
    out
}

/// The Messages API stream for one step.
pub fn messages_sse(n: usize, step: &Step, tool: &ToolName, request: &Value) -> String {
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
    let stop_reason = match step {
        Step::ToolCall { id } => {
            let name = match tool {
                ToolName::Flat(name) => name.clone(),
                ToolName::Namespaced { namespace, name } => format!("{namespace}__{name}"),
            };
            sse(
                &mut out,
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            );
            sse(
                &mut out,
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
            );
            "tool_use"
        }
        Step::Text => {
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
            "end_turn"
        }
    };
    sse(
        &mut out,
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    sse(
        &mut out,
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    );
    sse(&mut out, "message_stop", json!({"type": "message_stop"}));
    out
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
        assert_eq!(seen[0].answered_call.as_deref(), Some("call_a"));
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

    #[test]
    fn counts_tool_results_in_both_wires() {
        let r = json!({"input": [{"type": "function_call_output"}, {"type": "message"}, {"type": "function_call_output"}]});
        assert_eq!(count_tool_results(Wire::Responses, &r), 2);
        let m = json!({"messages": [{"role": "user", "content": "x"},
            {"role": "user", "content": [{"type": "tool_result"}, {"type": "text"}]}]});
        assert_eq!(count_tool_results(Wire::Messages, &m), 1);
        assert_eq!(count_tool_results(Wire::Messages, &json!({})), 0);
    }
}
