//! The OpenAI Chat Completions wire format (most other clients): one step as one JSON object or
//! as server-sent events.

use super::script::CREATED;
use super::script::{FINAL_TEXT, ScriptedCall, ToolName};
use super::wire::{flat_name, request_model};
use serde_json::{Value, json};

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
