//! The endpoint over real sockets in every wire format, and the request readers of each.

use super::chat::*;
use super::gemini::*;
use super::messages::*;
use super::responses::*;
use super::script::*;
use super::server::*;
use super::wire::*;
use serde_json::{Value, json};

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
    let (status, body) = post(&ep.base, path, json!({"contents": [user], "tools": tools})).await;
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
    let tools =
        json!([{"type": "function", "function": {"name": "probe_capabilities", "parameters": {}}}]);
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
