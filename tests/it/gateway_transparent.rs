//! `callid gateway --http` is as transparent as no gateway for what is not a spend: each agent
//! session has its own upstream connection, so the upstream's requests (elicitation, sampling,
//! roots) are answered by the agent whose call made them, and one session's log lines never
//! reach another; an agent that cannot answer makes the upstream get an error, never an invented
//! answer; a request passed through has `--passthrough-timeout`; the upstream's `serverInfo` is
//! kept. The upstream is `tests/fixtures/chatty_upstream.py` (real processes throughout).

use super::gateway_relay::{start_http, upstream_log};
use serde_json::{Value, json};
use std::time::Duration;

/// An agent session over streamable HTTP, by hand: it announces `capabilities` and answers the
/// requests the gateway relays to it.
struct Agent {
    client: reqwest::Client,
    url: String,
    id: String,
}

/// The JSON messages of one SSE response, read as they come.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// The next message, waiting at most 10 s.
    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                while let Some(newline) = self.buffer.find('\n') {
                    let line: String = self.buffer.drain(..=newline).collect();
                    if let Some(data) = line.trim_end().strip_prefix("data:")
                        && let Ok(message) = serde_json::from_str(data.trim())
                    {
                        return message;
                    }
                }
                let chunk = self.response.chunk().await.unwrap().expect("stream ended");
                self.buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("no message within 10 s")
    }
}

impl Agent {
    async fn open(url: &str, name: &str, capabilities: Value) -> Agent {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut agent = Agent {
            client,
            url: url.to_string(),
            id: String::new(),
        };
        let init = agent
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": capabilities,
                "clientInfo": {"name": name, "version": "1"}}}),
            )
            .await;
        agent.id = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        init.text().await.unwrap();
        let initialized = agent
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(initialized.status().is_success());
        agent
    }

    async fn post(&self, message: Value) -> reqwest::Response {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18");
        if !self.id.is_empty() {
            request = request.header("mcp-session-id", &self.id);
        }
        request.body(message.to_string()).send().await.unwrap()
    }

    /// Calls `tool` and returns the stream that carries the relayed requests and the answer.
    async fn call(&self, id: u64, tool: &str, arguments: Value) -> Events {
        let response = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}))
            .await;
        assert!(response.status().is_success(), "{}", response.status());
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// The session's GET stream.
    async fn listen(&self) -> Events {
        let response = self
            .client
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// Reads `events` up to the answer of call `id`, answering each relayed request with
    /// `answer(request)`; returns the requests it saw and the call's structured result.
    async fn serve_until_answer(
        &self,
        events: &mut Events,
        id: u64,
        answer: impl Fn(&Value) -> Value,
    ) -> (Vec<Value>, Value) {
        let mut asked = Vec::new();
        loop {
            let message = events.next().await;
            if message.get("method").is_some() && message.get("id").is_some() {
                let reply = self
                    .post(
                        json!({"jsonrpc": "2.0", "id": message["id"], "result": answer(&message)}),
                    )
                    .await;
                assert!(reply.status().is_success(), "{}", reply.status());
                asked.push(message);
            } else if message["id"] == json!(id) {
                return (asked, message["result"]["structuredContent"].clone());
            }
        }
    }
}

/// What an agent named `name` answers to an elicitation: its own name.
fn accept_as(name: &str) -> impl Fn(&Value) -> Value {
    let name = name.to_string();
    move |_| json!({"action": "accept", "content": {"name": name}})
}

fn elicit() -> Value {
    json!({"method": "elicitation/create", "params": {
        "message": "who are you?", "requestedSchema": {"type": "object",
        "properties": {"name": {"type": "string"}}, "required": ["name"]}}})
}

#[tokio::test]
async fn an_elicitation_is_answered_by_the_agent_whose_call_made_it() {
    let (url, _gateway, log, _dir) = start_http(&[]).await;
    let caps = json!({"elicitation": {}});
    let a = Agent::open(&url, "agent-a", caps.clone()).await;
    let b = Agent::open(&url, "agent-b", caps).await;
    // Both calls are in flight before either is answered.
    let mut a_events = a.call(1, "ask", elicit()).await;
    let mut b_events = b.call(1, "ask", elicit()).await;
    let ((a_asked, a_result), (b_asked, b_result)) = tokio::join!(
        a.serve_until_answer(&mut a_events, 1, accept_as("a")),
        b.serve_until_answer(&mut b_events, 1, accept_as("b")),
    );
    for (asked, result, name) in [(a_asked, a_result, "a"), (b_asked, b_result, "b")] {
        assert_eq!(asked.len(), 1, "agent {name} was asked once: {asked:?}");
        assert_eq!(asked[0]["method"], "elicitation/create");
        assert_eq!(asked[0]["params"]["message"], "who are you?");
        assert_eq!(
            result,
            json!({"answer": {"action": "accept", "content": {"name": name}}}),
            "agent {name}'s call got its own agent's answer"
        );
    }
    // The upstream was told each agent as it announced itself.
    let announced: Vec<Value> = upstream_log(&log)
        .into_iter()
        .filter_map(|e| e.get("initialize").cloned())
        .filter(|i| {
            i["clientInfo"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("agent-"))
        })
        .collect();
    let mut names: Vec<&str> = announced
        .iter()
        .map(|i| i["clientInfo"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["agent-a", "agent-b"], "{announced:?}");
    for i in &announced {
        assert_eq!(i["capabilities"]["elicitation"], json!({}), "{i}");
        assert!(i["capabilities"].get("sampling").is_none(), "{i}");
    }
}

#[tokio::test]
async fn sampling_and_roots_reach_the_agent_and_an_agent_without_the_capability_is_an_error() {
    let (url, _gateway, _log, _dir) = start_http(&[]).await;
    let able = Agent::open(&url, "able", json!({"sampling": {}, "roots": {}})).await;
    let sample = json!({"method": "sampling/createMessage", "params": {"maxTokens": 10,
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}});
    let mut events = able.call(1, "ask", sample.clone()).await;
    let (asked, result) = able
        .serve_until_answer(&mut events, 1, |_| {
            json!({"role": "assistant", "model": "m", "content": {"type": "text", "text": "hello"}})
        })
        .await;
    assert_eq!(asked[0]["method"], "sampling/createMessage");
    assert_eq!(result["answer"]["content"]["text"], "hello", "{result}");
    let mut events = able.call(2, "ask", json!({"method": "roots/list"})).await;
    let (asked, result) = able
        .serve_until_answer(
            &mut events,
            2,
            |_| json!({"roots": [{"uri": "file:///work", "name": "work"}]}),
        )
        .await;
    assert_eq!(asked[0]["method"], "roots/list");
    assert_eq!(
        result["answer"]["roots"][0]["uri"], "file:///work",
        "{result}"
    );

    // An agent that announced none of them is never asked, and the upstream hears why.
    let unable = Agent::open(&url, "unable", json!({})).await;
    for (id, (method, ask)) in [
        ("elicitation", elicit()),
        ("sampling", sample),
        ("roots", json!({"method": "roots/list"})),
    ]
    .into_iter()
    .enumerate()
    {
        let mut events = unable.call(id as u64 + 1, "ask", ask).await;
        let (asked, result) = unable
            .serve_until_answer(&mut events, id as u64 + 1, |_| json!({}))
            .await;
        assert!(asked.is_empty(), "{asked:?}");
        assert_eq!(result["error"]["code"], -32601, "{result}");
        let message = result["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("did not announce the `{method}` capability")),
            "{message}"
        );
    }
}

#[tokio::test]
async fn no_log_line_of_one_session_reaches_another() {
    let (url, _gateway, _log, _dir) = start_http(&[]).await;
    let a = Agent::open(&url, "agent-a", json!({})).await;
    let b = Agent::open(&url, "agent-b", json!({})).await;
    let mut a_stream = a.listen().await;
    let mut b_stream = b.listen().await;
    // Each whispers on its call's stream or its GET stream; then the last one, "end".
    for (agent, text) in [(&a, "from-a"), (&b, "from-b")] {
        let mut events = agent.call(1, "whisper", json!({"text": text})).await;
        agent
            .serve_until_answer(&mut events, 1, |_| json!({}))
            .await;
        let mut events = agent.call(2, "whisper", json!({"text": "end"})).await;
        agent
            .serve_until_answer(&mut events, 2, |_| json!({}))
            .await;
    }
    for (stream, own, other) in [
        (&mut a_stream, "from-a", "from-b"),
        (&mut b_stream, "from-b", "from-a"),
    ] {
        let mut seen = Vec::new();
        loop {
            let m = stream.next().await;
            if m["method"] == "notifications/message" {
                let data = m["params"]["data"].as_str().unwrap().to_string();
                if data == "end" {
                    break;
                }
                seen.push(data);
            }
        }
        assert!(!seen.iter().any(|d| d == other), "{seen:?} holds {other}");
        assert!(seen.iter().all(|d| d == own), "{seen:?}");
    }
}

#[tokio::test]
async fn a_passed_through_call_without_an_answer_gets_an_error_at_the_passthrough_timeout() {
    let (url, _gateway, log, _dir) = start_http(&["--passthrough-timeout", "1"]).await;
    let agent = Agent::open(&url, "agent-a", json!({})).await;
    let started = std::time::Instant::now();
    let mut events = agent.call(1, "slow", json!({})).await;
    let answer = loop {
        let m = events.next().await;
        if m["id"] == 1 {
            break m;
        }
    };
    assert!(started.elapsed() < Duration::from_secs(8), "{answer}");
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    insta::assert_snapshot!(answer["error"]["message"].as_str().unwrap(), @"the upstream did not answer `tools/call` within 1 seconds (`--passthrough-timeout`); raise `--passthrough-timeout` if it takes longer");
    // The upstream is told to stop.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !upstream_log(&log)
        .iter()
        .any(|e| e.get("cancelled").is_some())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            upstream_log(&log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_upstreams_server_info_is_kept_and_the_gateway_named_in_meta() {
    let (url, _gateway, _log, _dir) = start_http(&[]).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let init = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "agent", "version": "1"}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let mut events = Events {
        response: init,
        buffer: String::new(),
    };
    let result = events.next().await["result"].clone();
    assert_eq!(
        result["serverInfo"],
        json!({"name": "chatty-upstream", "version": "1"}),
        "{result}"
    );
    assert_eq!(
        result["_meta"]["callid/gateway"]["name"], "callid-gateway",
        "{result}"
    );
}
