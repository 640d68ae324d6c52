//! What the four wire formats share: the [`Wire`] enum, reading a model request (does it offer
//! the probe's tool, how many tool results it carries), the answers to requests that are not a
//! model turn, and the small helpers the per-vendor files build their answers with.

use super::script::{CREATED, SCRIPTED_MODEL, ToolName};
use serde_json::{Value, json};

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

/// The answer to a request that is not a model turn, if the wire has one: the model list of
/// Chat Completions and the Gemini API, and Gemini's token count. Anything else is a 404.
pub(super) fn side_answer(
    wire: Wire,
    method: &axum::http::Method,
    path: &str,
    _body: &[u8],
) -> Option<Value> {
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

pub(super) fn sse(out: &mut String, event: &str, data: Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// The tool's name as one flat string.
pub(super) fn flat_name(tool: &ToolName) -> String {
    match tool {
        ToolName::Flat(name) => name.clone(),
        ToolName::Namespaced { namespace, name } => format!("{namespace}__{name}"),
    }
}

pub(super) fn request_model(request: &Value) -> &str {
    request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(SCRIPTED_MODEL)
}
