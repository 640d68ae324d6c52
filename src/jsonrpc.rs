//! A hand-written MCP client over stdio lines and streamable HTTP, with exact control of JSON-RPC
//! ids and of every `_meta` key.
//!
//! rmcp's client numbers ids itself, rewrites `progressToken` and cannot resend a request, which is
//! exactly what redelivery tests need to do. [`Connection`] sends what it is given, byte for byte:
//! the caller picks every id (a redelivery is the same `tools/call` again with a new id), every
//! `_meta` key, and may send raw malformed lines.
//!
//! # Guarantees
//! - Requests may be in flight concurrently on one connection; responses are matched to requests
//!   by id (the canonical JSON of the id, so `1` and `"1"` differ). Two requests in flight with the
//!   same id are answered in the order the responses arrive.
//! - [`Response::raw`] holds the exact text received for that response (one stdio line, or one
//!   HTTP body / SSE `data` payload), so tests can scan every byte an agent would see.
//! - Every request has a timeout (default 30 s); a connection whose server exits fails every
//!   pending and later request with [`RpcError::Closed`] and the tail of the server's stderr.
//! - Messages that match no pending request (errors with id `null`, server notifications) are kept
//!   and can be read with [`Connection::take_unmatched`].

use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

/// Default time a request waits for its response.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Most stderr bytes kept from a child (the tail is kept).
const STDERR_KEEP: usize = 64 * 1024;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The server program could not be started.
    #[error("failed to start `{program}`")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing to or reading from the server failed (the cause is in the message, not a
    /// `source()`).
    #[error("i/o with the server failed: {0}")]
    Io(std::io::Error),
    /// The HTTP exchange failed.
    #[error("http request to `{url}` failed: {message}")]
    Http {
        /// The endpoint.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The server closed the connection (exited, or the HTTP session ended).
    #[error("the server closed the connection{}", stderr_suffix(.stderr_tail))]
    Closed {
        /// The last lines the server wrote to stderr, if it is a child.
        stderr_tail: String,
    },
    /// No response within the timeout.
    #[error("no response to `{method}` (id {id}) within {timeout:?}")]
    Timeout {
        /// The method.
        method: String,
        /// The request id, as JSON.
        id: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The server sent something that is not JSON-RPC.
    #[error("the server sent a message that is not JSON-RPC: {0}")]
    Protocol(String),
}

impl From<std::io::Error> for RpcError {
    fn from(e: std::io::Error) -> Self {
        RpcError::Io(e)
    }
}

fn stderr_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("; its stderr ends with:\n{}", tail.trim_end())
    }
}

/// One JSON-RPC response.
#[derive(Debug, Clone)]
pub struct Response {
    /// The id, as sent back.
    pub id: Value,
    /// `result`, when the request succeeded at the JSON-RPC level.
    pub result: Option<Value>,
    /// `error`, when it failed at the JSON-RPC level.
    pub error: Option<Value>,
    /// The exact text received for this response.
    pub raw: String,
}

impl Response {
    fn parse(raw: String) -> Result<Self, RpcError> {
        let message: Value = serde_json::from_str(&raw)
            .map_err(|e| RpcError::Protocol(format!("{e} in {}", preview(&raw))))?;
        Ok(Response {
            id: message.get("id").cloned().unwrap_or(Value::Null),
            result: message.get("result").cloned(),
            error: message.get("error").cloned(),
            raw,
        })
    }

    /// The `CallToolResult` of a `tools/call` (the JSON-RPC `result`).
    pub fn tool_result(&self) -> Option<&Value> {
        self.result.as_ref()
    }

    /// Whether this is a tool error (`result.isError == true`).
    pub fn is_tool_error(&self) -> bool {
        self.result
            .as_ref()
            .and_then(|r| r.get("isError"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// `result.structuredContent`, if any.
    pub fn structured(&self) -> Option<&Value> {
        self.result.as_ref()?.get("structuredContent")
    }
}

fn preview(text: &str) -> String {
    format!("`{}`", crate::text::cut(text, 200))
}

type Waiters = Arc<Mutex<HashMap<String, VecDeque<oneshot::Sender<Response>>>>>;

fn id_key(id: &Value) -> String {
    crate::canonical::canonical_json(id).unwrap_or_else(|_| id.to_string())
}

/// One MCP connection. Clones share it.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
    timeout: Duration,
}

struct Inner {
    transport: Transport,
    waiters: Waiters,
    unmatched: Arc<Mutex<Vec<String>>>,
}

enum Transport {
    Stdio {
        stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
        closed: Arc<Mutex<Option<String>>>,
    },
    Http {
        client: reqwest::Client,
        url: String,
        session: Mutex<Option<String>>,
        protocol: Mutex<Option<String>>,
    },
}

/// A server started as a child process.
pub struct Child {
    child: tokio::process::Child,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_closed: tokio::sync::watch::Receiver<bool>,
}

impl Child {
    /// The child's process id (None once it has been waited for).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the child with SIGKILL, as `kill -9` would, and waits for it.
    pub async fn kill9(&mut self) -> std::io::Result<()> {
        self.child.kill().await
    }

    /// Stops the child as an operator would: SIGTERM, then at most `grace` for it to exit (a
    /// server finishes its work, as the HTTP probe writes its queued records), SIGKILL after
    /// that. Its exit status, or `None` when it had to be killed.
    pub async fn terminate(
        &mut self,
        grace: Duration,
    ) -> std::io::Result<Option<std::process::ExitStatus>> {
        if let Some(pid) = self.child.id() {
            // SAFETY: `kill` takes no pointers; the pid is this child's, not yet waited for.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.map(Some),
            Err(_) => self.child.kill().await.map(|()| None),
        }
    }

    /// Waits for the child to exit.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Whether the child has exited, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits (at most `timeout`) until the child's stderr is closed, so that
    /// [`stderr_text`](Self::stderr_text) holds its last words; `false` on timeout.
    pub async fn stderr_closed(&self, timeout: Duration) -> bool {
        let mut closed = self.stderr_closed.clone();
        tokio::time::timeout(timeout, closed.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// What the child wrote to stderr so far (the last 64 KiB).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr lock")).into_owned()
    }
}

impl Connection {
    /// Starts `program args` with `envs` added to the environment and connects to its stdio.
    pub async fn spawn_stdio(
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> Result<(Connection, Child), RpcError> {
        Self::spawn_stdio_in(program, args, envs, false).await
    }

    /// [`spawn_stdio`](Self::spawn_stdio), with the child leading a new process group when
    /// `own_group` (its id is the group's id), so the whole group can be killed at once: a
    /// wrapper script and the router it started without `exec`.
    pub async fn spawn_stdio_in(
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        own_group: bool,
    ) -> Result<(Connection, Child), RpcError> {
        let mut command = tokio::process::Command::new(program);
        if own_group {
            command.process_group(0);
        }
        command
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::piped());
        Connection::spawn_command(command).await
    }

    /// Starts `command` and connects to its stdin and stdout. Its stderr is kept (see
    /// [`Child::stderr_text`]) when the command pipes it, and left as the command says otherwise
    /// (a file, a closed pipe).
    pub async fn spawn_command(
        mut command: tokio::process::Command,
    ) -> Result<(Connection, Child), RpcError> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| RpcError::Spawn {
            program: command
                .as_std()
                .get_program()
                .to_string_lossy()
                .into_owned(),
            source,
        })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");

        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, stderr_closed) = tokio::sync::watch::channel(false);
        if let Some(mut stderr_pipe) = child.stderr.take() {
            let stderr_sink = stderr.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = stderr_pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut kept = stderr_sink.lock().expect("stderr lock");
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > STDERR_KEEP {
                        let cut = kept.len() - STDERR_KEEP;
                        kept.drain(..cut);
                    }
                }
                let _ = closed_tx.send(true);
            });
        } else {
            let _ = closed_tx.send(true);
        }

        let waiters: Waiters = Arc::default();
        let unmatched: Arc<Mutex<Vec<String>>> = Arc::default();
        let closed: Arc<Mutex<Option<String>>> = Arc::default();
        {
            let waiters = waiters.clone();
            let unmatched = unmatched.clone();
            let closed = closed.clone();
            let stderr = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim().is_empty() {
                        continue;
                    }
                    dispatch(line, &waiters, &unmatched);
                }
                // Give the stderr reader a moment to collect the server's last words.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let tail = tail_lines(&String::from_utf8_lossy(&stderr.lock().expect("lock")), 20);
                *closed.lock().expect("closed lock") = Some(tail);
                waiters.lock().expect("waiters lock").clear();
            });
        }
        let connection = Connection {
            inner: Arc::new(Inner {
                transport: Transport::Stdio {
                    stdin: tokio::sync::Mutex::new(Some(stdin)),
                    closed,
                },
                waiters,
                unmatched,
            }),
            timeout: DEFAULT_TIMEOUT,
        };
        Ok((
            connection,
            Child {
                child,
                stderr,
                stderr_closed,
            },
        ))
    }

    /// A streamable HTTP connection to `url` (the MCP endpoint). No request is sent yet.
    pub async fn http(url: &str) -> Result<Connection, RpcError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| RpcError::Http {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        Ok(Connection {
            inner: Arc::new(Inner {
                transport: Transport::Http {
                    client,
                    url: url.to_string(),
                    session: Mutex::new(None),
                    protocol: Mutex::new(None),
                },
                waiters: Arc::default(),
                unmatched: Arc::default(),
            }),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sets the per-request timeout of this handle (clones made afterwards inherit it).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends `initialize` with `protocol` and `clientInfo`, then `notifications/initialized`.
    pub async fn initialize(
        &self,
        id: Value,
        protocol: &str,
        client_name: &str,
        client_version: &str,
    ) -> Result<Response, RpcError> {
        let response = self
            .request(
                id,
                "initialize",
                json!({
                    "protocolVersion": protocol,
                    "capabilities": {},
                    "clientInfo": {"name": client_name, "version": client_version},
                }),
            )
            .await?;
        if let Transport::Http { protocol: p, .. } = &self.inner.transport {
            let agreed = response
                .result
                .as_ref()
                .and_then(|r| r.get("protocolVersion"))
                .and_then(Value::as_str)
                .unwrap_or(protocol);
            *p.lock().expect("protocol lock") = Some(agreed.to_string());
        }
        self.notify("notifications/initialized", json!({})).await?;
        Ok(response)
    }

    /// Sends `tools/call` for `tool` with `arguments` and, when given, `_meta`.
    pub async fn call_tool(
        &self,
        id: Value,
        tool: &str,
        arguments: Value,
        meta: Option<Value>,
    ) -> Result<Response, RpcError> {
        let mut params = json!({"name": tool, "arguments": arguments});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        self.request(id, "tools/call", params).await
    }

    /// Sends one request and waits for the response with the same id.
    pub async fn request(
        &self,
        id: Value,
        method: &str,
        params: Value,
    ) -> Result<Response, RpcError> {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let text = serde_json::to_string(&message).expect("a Value serializes");
        self.request_text(id, method, &text).await
    }

    /// Sends `text`, a request with id `id` written exactly as the caller wants its bytes (other
    /// escapes or number forms than serde_json's), and waits for the response with that id.
    pub async fn request_text(
        &self,
        id: Value,
        method: &str,
        text: &str,
    ) -> Result<Response, RpcError> {
        let timed_out = || RpcError::Timeout {
            method: method.to_string(),
            id: id.to_string(),
            timeout: self.timeout,
        };
        match &self.inner.transport {
            Transport::Stdio { .. } => {
                let (tx, rx) = oneshot::channel();
                self.inner
                    .waiters
                    .lock()
                    .expect("waiters lock")
                    .entry(id_key(&id))
                    .or_default()
                    .push_back(tx);
                self.write_line(text).await?;
                if let Transport::Stdio { closed, .. } = &self.inner.transport
                    && closed.lock().expect("closed lock").is_some()
                {
                    return Err(self.closed_error());
                }
                match tokio::time::timeout(self.timeout, rx).await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(_)) => Err(self.closed_error()),
                    Err(_) => Err(timed_out()),
                }
            }
            Transport::Http { .. } => {
                match tokio::time::timeout(self.timeout, self.post(text, Some(&id))).await {
                    Ok(result) => result?.ok_or_else(|| {
                        RpcError::Protocol(format!("no response to `{method}` in the HTTP reply"))
                    }),
                    Err(_) => Err(timed_out()),
                }
            }
        }
    }

    /// Sends one notification (no id, no response).
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.send_raw(&serde_json::to_string(&message).expect("a Value serializes"))
            .await
    }

    /// Sends `text` exactly as given: one line over stdio (a newline is added), or one HTTP body.
    /// Any reply is kept for [`take_unmatched`](Self::take_unmatched).
    pub async fn send_raw(&self, text: &str) -> Result<(), RpcError> {
        match &self.inner.transport {
            Transport::Stdio { .. } => self.write_line(text).await,
            Transport::Http { .. } => {
                if let Some(response) = self.post(text, None).await? {
                    self.inner
                        .unmatched
                        .lock()
                        .expect("unmatched lock")
                        .push(response.raw);
                }
                Ok(())
            }
        }
    }

    /// Messages received that answered no pending request, oldest first; the list is emptied.
    pub fn take_unmatched(&self) -> Vec<String> {
        std::mem::take(&mut *self.inner.unmatched.lock().expect("unmatched lock"))
    }

    /// Closes the connection: stdin is closed for a child (most servers then exit); an HTTP
    /// session is deleted.
    pub async fn close(&self) {
        match &self.inner.transport {
            Transport::Stdio { stdin, .. } => {
                stdin.lock().await.take();
            }
            Transport::Http {
                client,
                url,
                session,
                ..
            } => {
                let id = session.lock().expect("session lock").take();
                if let Some(id) = id {
                    let _ = client.delete(url).header("mcp-session-id", id).send().await;
                }
            }
        }
    }

    async fn write_line(&self, text: &str) -> Result<(), RpcError> {
        let Transport::Stdio { stdin, .. } = &self.inner.transport else {
            unreachable!("write_line is only called on stdio connections");
        };
        let mut guard = stdin.lock().await;
        let Some(pipe) = guard.as_mut() else {
            return Err(self.closed_error());
        };
        let mut bytes = Vec::with_capacity(text.len() + 1);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(b'\n');
        let written = async {
            pipe.write_all(&bytes).await?;
            pipe.flush().await
        }
        .await;
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(self.closed_error()),
            Err(e) => Err(RpcError::Io(e)),
        }
    }

    fn closed_error(&self) -> RpcError {
        let stderr_tail = match &self.inner.transport {
            Transport::Stdio { closed, .. } => closed.lock().expect("lock").clone(),
            Transport::Http { .. } => None,
        };
        RpcError::Closed {
            stderr_tail: stderr_tail.unwrap_or_default(),
        }
    }

    /// POSTs one message; returns the response whose id is `want` (or, for `None`, the first
    /// message in the reply, if any).
    async fn post(&self, body: &str, want: Option<&Value>) -> Result<Option<Response>, RpcError> {
        let Transport::Http {
            client,
            url,
            session,
            protocol,
        } = &self.inner.transport
        else {
            unreachable!("post is only called on HTTP connections");
        };
        let http_error = |message: String| RpcError::Http {
            url: url.clone(),
            message,
        };
        let mut request = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(id) = session.lock().expect("session lock").clone() {
            request = request.header("mcp-session-id", id);
        }
        if let Some(version) = protocol.lock().expect("protocol lock").clone() {
            request = request.header("mcp-protocol-version", version);
        }
        let reply = request
            .send()
            .await
            .map_err(|e| http_error(e.to_string()))?;
        if let Some(id) = reply
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            *session.lock().expect("session lock") = Some(id.to_string());
        }
        let status = reply.status();
        let is_sse = reply
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if status == reqwest::StatusCode::NOT_FOUND && session.lock().expect("lock").is_some() {
            return Err(RpcError::Closed {
                stderr_tail: String::new(),
            });
        }
        if status == reqwest::StatusCode::ACCEPTED {
            return Ok(None);
        }
        if !is_sse {
            let text = reply.text().await.map_err(|e| http_error(e.to_string()))?;
            if text.trim().is_empty() {
                if status.is_success() {
                    return Ok(None);
                }
                return Err(http_error(format!("status {status} with an empty body")));
            }
            if !status.is_success() && serde_json::from_str::<Value>(&text).is_err() {
                return Err(http_error(format!("status {status}: {}", preview(&text))));
            }
            return Response::parse(text).map(Some);
        }
        // SSE: read events until the response we want arrives; keep the others.
        let mut stream = reply;
        let mut buffer = String::new();
        let mut data = String::new();
        loop {
            let chunk = stream
                .chunk()
                .await
                .map_err(|e| http_error(e.to_string()))?;
            let Some(chunk) = chunk else {
                return Ok(None);
            };
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(newline) = buffer.find('\n') {
                let line = buffer[..newline].trim_end_matches('\r').to_string();
                buffer.drain(..=newline);
                if let Some(rest) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                } else if line.is_empty() && !data.is_empty() {
                    let event = std::mem::take(&mut data);
                    let is_wanted = serde_json::from_str::<Value>(&event)
                        .ok()
                        .filter(|m| m.get("result").is_some() || m.get("error").is_some())
                        .and_then(|m| m.get("id").cloned())
                        .is_some_and(|id| want.is_none_or(|w| id_key(w) == id_key(&id)));
                    if is_wanted {
                        return Response::parse(event).map(Some);
                    }
                    self.inner
                        .unmatched
                        .lock()
                        .expect("unmatched lock")
                        .push(event);
                }
            }
        }
    }
}

fn dispatch(line: String, waiters: &Waiters, unmatched: &Mutex<Vec<String>>) {
    let parsed: Option<Value> = serde_json::from_str(&line).ok();
    let id = parsed
        .as_ref()
        .filter(|m| m.get("result").is_some() || m.get("error").is_some())
        .and_then(|m| m.get("id"))
        .filter(|id| !id.is_null())
        .map(id_key);
    if let Some(key) = id {
        let waiter = waiters
            .lock()
            .expect("waiters lock")
            .get_mut(&key)
            .and_then(VecDeque::pop_front);
        if let Some(waiter) = waiter {
            if let Ok(response) = Response::parse(line) {
                let _ = waiter.send(response);
            }
            return;
        }
    }
    unmatched.lock().expect("unmatched lock").push(line);
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_by_canonical_json() {
        assert_eq!(id_key(&json!(1)), id_key(&json!(1.0)));
        assert_ne!(id_key(&json!(1)), id_key(&json!("1")));
    }

    #[tokio::test]
    async fn concurrent_requests_match_by_id_and_closed_is_reported() {
        // A line-echo server in sh: answers each request line with a result carrying its id.
        let script = r#"while IFS= read -r line; do
            id=$(printf '%s' "$line" | sed -n 's/.*"id":\([^,}]*\).*/\1/p')
            case "$line" in *'"method":"quit"'*) echo "bye" >&2; exit 3;; esac
            printf '{"jsonrpc":"2.0","id":%s,"result":{"echo":%s}}\n' "$id" "$id"
        done"#;
        let (conn, mut child) =
            Connection::spawn_stdio(Path::new("sh"), &["-c".into(), script.into()], &[])
                .await
                .unwrap();
        let calls = (0..16).map(|i| {
            let conn = conn.clone();
            async move { conn.request(json!(i), "echo", json!({})).await.unwrap() }
        });
        let responses = futures_join_all(calls).await;
        for (i, r) in responses.iter().enumerate() {
            assert_eq!(r.id, json!(i));
            assert_eq!(r.result.as_ref().unwrap()["echo"], json!(i));
            assert!(r.raw.contains(&format!("\"id\":{i}")));
        }
        let err = conn
            .request(json!(99), "quit", json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, RpcError::Closed { .. }), "{err}");
        assert!(err.to_string().contains("bye"), "{err}");
        assert_eq!(child.wait().await.unwrap().code(), Some(3));
    }

    async fn futures_join_all<F: std::future::Future<Output = Response> + Send + 'static>(
        futures: impl Iterator<Item = F>,
    ) -> Vec<Response> {
        let handles: Vec<_> = futures.map(tokio::spawn).collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    }
}
