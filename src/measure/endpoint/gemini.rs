//! The Gemini API wire format (Gemini CLI): one step as a `generateContent` answer.

use super::script::{FINAL_TEXT, SCRIPTED_MODEL, ScriptedCall, ToolName};
use super::wire::flat_name;
use serde_json::{Value, json};

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
