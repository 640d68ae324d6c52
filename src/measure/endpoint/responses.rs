//! The OpenAI Responses API wire format (Codex): one step as server-sent events.

use super::script::{FINAL_TEXT, ScriptedCall, ToolName};
use super::wire::sse;
use serde_json::{Value, json};

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
