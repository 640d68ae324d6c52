//! The Anthropic Messages API wire format (Claude Code): one step as server-sent events.

use super::script::{FINAL_TEXT, ScriptedCall, ToolName};
use super::wire::{flat_name, sse};
use serde_json::{Value, json};

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
