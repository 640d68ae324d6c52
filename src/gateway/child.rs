//! [`ChildTransport`]: the gateway's stdio transport to an upstream it starts as a child
//! process (`-- CMD ARGS...`), with a message size limit that says what it dropped.
//!
//! rmcp's own child-process transport drops a line longer than its limit (16 MiB, not
//! settable there) with a log line only: the request it answered waits for the gateway's
//! timeout, and a paid answer never arrives. This transport reads the child's stdout itself.
//!
//! # Guarantees
//! - A line of at most `limit` bytes (the newline not counted) is one JSON-RPC message; a line
//!   that is not one is skipped, as rmcp skips it.
//! - A longer line is never held whole: at most `limit` bytes of it while it is read and its
//!   first [`HEAD`] bytes once it is known to be too long. When its newline arrives, the request
//!   it answers gets a JSON-RPC error at once, naming the line's size and the limit, which
//!   [`Oversized::of`] recognises (the caller turns it into
//!   [`super::upstream::UpstreamError::TooLarge`]). The request is the one whose `"id"` the line's
//!   head names (every MCP SDK writes `id` before `result`), or else the only request in flight.
//! - A long line that answers no request in flight (a notification, a request of the upstream,
//!   an answer that came after its timeout) is dropped and logged with its size and the limit.
//! - A long answer whose request cannot be told ends the connection: every request in flight
//!   fails at once instead of at its timeout, and the gateway opens a new connection for the
//!   next one.
//! - After a dropped line the connection reads on from the next line: later requests work.
//! - The child is killed when the transport is dropped; [`Transport::close`] closes its stdin
//!   and gives it [`EXIT_GRACE`] to exit first.

use rmcp::RoleClient;
use rmcp::model::{
    ClientNotification, ErrorCode, ErrorData, JsonRpcError, JsonRpcMessage, JsonRpcNotification,
    RequestId,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The default longest message read from an upstream child: rmcp's own stdio limit and its
/// streamable HTTP client's event limit (16 MiB), so a default gateway reads what rmcp reads.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// The smallest limit accepted: an `initialize` answer must fit.
pub const MIN_MAX_MESSAGE_BYTES: usize = 1024;
/// How much of a too-long line is kept to find the request it answers.
const HEAD: usize = 64 * 1024;
/// How long a closed child has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);
/// `error.data` key of the error that stands for a too-long answer.
const OVERSIZED_DATA: &str = "callid/oversized";

/// A message of the upstream that was longer than the limit and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversized {
    /// Its size, the newline not counted.
    pub bytes: usize,
    /// The limit.
    pub limit: usize,
}

impl Oversized {
    /// The too-long answer that `error` stands for, if it is one this transport made.
    pub fn of(error: &ErrorData) -> Option<Oversized> {
        let data = error.data.as_ref()?.get(OVERSIZED_DATA)?;
        Some(Oversized {
            bytes: usize::try_from(data.get("bytes")?.as_u64()?).ok()?,
            limit: usize::try_from(data.get("limit")?.as_u64()?).ok()?,
        })
    }

    fn error(self) -> ErrorData {
        ErrorData::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "the upstream's answer is {} bytes, longer than the {} bytes the gateway reads \
                 in one message; it was dropped: raise `--upstream-max-message-bytes` to \
                 receive it",
                self.bytes, self.limit
            ),
            Some(json!({OVERSIZED_DATA: {"bytes": self.bytes, "limit": self.limit}})),
        )
    }
}

/// The upstream child's stdin/stdout as an rmcp transport: see the module's guarantees.
pub struct ChildTransport {
    child: Child,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    stdout: BufReader<ChildStdout>,
    limit: usize,
    /// The line being read (at most `limit` bytes).
    line: Vec<u8>,
    /// The too-long line being skipped: its head and its size so far. On the struct, not in
    /// `receive`, because rmcp drops `receive` mid-read when another branch of its loop is ready.
    skipping: Option<(Vec<u8>, usize)>,
    /// The requests sent and not yet answered.
    in_flight: Arc<Mutex<HashSet<RequestId>>>,
}

/// What one bounded read of the child's stdout gave.
enum Read {
    Line,
    Oversized(Vec<u8>, usize),
    Eof,
}

impl ChildTransport {
    /// Starts `command` with piped stdin and stdout (stderr inherited), reading lines of at
    /// most `limit` bytes.
    pub fn spawn(mut command: tokio::process::Command, limit: usize) -> std::io::Result<Self> {
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other(
                "the child's stdin or stdout is not piped",
            ));
        };
        Ok(ChildTransport {
            child,
            stdin: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            stdout: BufReader::with_capacity(HEAD, stdout),
            limit,
            line: Vec::new(),
            skipping: None,
            in_flight: Arc::default(),
        })
    }

    /// Reads into `self.line` up to a newline, never holding more than `limit` bytes of a line;
    /// cancel-safe (every step's state is on `self`, and no await sits between a copy and its
    /// `consume`).
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            let available = self.stdout.fill_buf().await?;
            if available.is_empty() {
                return Ok(Read::Eof);
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let body = &available[..newline.unwrap_or(available.len())];
            let consumed = newline.map_or(available.len(), |i| i + 1);
            if let Some((head, bytes)) = &mut self.skipping {
                keep_head(head, body);
                *bytes += body.len();
            } else if self.line.len() + body.len() > self.limit {
                let bytes = self.line.len() + body.len();
                let mut head = std::mem::take(&mut self.line);
                head.truncate(HEAD);
                head.shrink_to(HEAD);
                keep_head(&mut head, body);
                self.skipping = Some((head, bytes));
            } else {
                self.line.extend_from_slice(body);
            }
            self.stdout.consume(consumed);
            if newline.is_some() {
                return Ok(match self.skipping.take() {
                    Some((head, bytes)) => Read::Oversized(head, bytes),
                    None => Read::Line,
                });
            }
        }
    }
}

/// Appends to `head` what of `more` fits in [`HEAD`] bytes.
fn keep_head(head: &mut Vec<u8>, more: &[u8]) {
    let room = HEAD.saturating_sub(head.len());
    head.extend_from_slice(&more[..room.min(more.len())]);
}

/// What the head of a JSON-RPC message says about it: its `id`, and whether a `method` key (a
/// request or notification of the upstream) came before its end or the head's.
#[derive(Debug, Default, PartialEq)]
struct Head {
    id: Option<RequestId>,
    method: bool,
}

impl Head {
    /// Reads `bytes` (a message's start, maybe cut in the middle) as far as it goes.
    fn read(bytes: &[u8]) -> Head {
        use serde::Deserializer as _;
        let mut head = Head::default();
        let mut de = serde_json::Deserializer::from_slice(bytes);
        // A cut message ends in an EOF error; what was read before it stays in `head`.
        let _ = de.deserialize_map(HeadVisitor(&mut head));
        head
    }
}

struct HeadVisitor<'a>(&'a mut Head);

impl<'de> serde::de::Visitor<'de> for HeadVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "id" => self.0.id = map.next_value::<Option<RequestId>>()?,
                "method" => {
                    self.0.method = true;
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ChildTransport {
    /// What to do with a too-long line: the error for the request it answers, `None` to read
    /// on, or `Err(())` to end the connection.
    fn oversized(
        &mut self,
        head: &[u8],
        bytes: usize,
    ) -> Result<Option<RxJsonRpcMessage<RoleClient>>, ()> {
        let over = Oversized {
            bytes,
            limit: self.limit,
        };
        let told = Head::read(head);
        let mut in_flight = lock(&self.in_flight);
        let request = match told.id {
            _ if told.method => None,
            Some(id) => in_flight.take(&id),
            None if in_flight.len() == 1 => in_flight.drain().next(),
            None if in_flight.is_empty() => None,
            None => {
                crate::logging::line(format_args!(
                    "callid gateway: the upstream sent a message of {bytes} bytes, longer than \
                     the {} bytes the gateway reads in one message, and it cannot be told which \
                     of the {} requests in flight it answers: the connection is closed and \
                     those requests fail",
                    self.limit,
                    in_flight.len()
                ));
                return Err(());
            }
        };
        match request {
            Some(id) => Ok(Some(JsonRpcMessage::Error(JsonRpcError::new(
                Some(id),
                over.error(),
            )))),
            None => {
                crate::logging::line(format_args!(
                    "callid gateway: dropped a message of the upstream of {bytes} bytes that \
                     answers no request in flight: longer than the {} bytes the gateway reads \
                     in one message (`--upstream-max-message-bytes`)",
                    self.limit
                ));
                Ok(None)
            }
        }
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let stdin = self.stdin.clone();
        let in_flight = self.in_flight.clone();
        async move {
            let mut text = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            text.push(b'\n');
            match &item {
                JsonRpcMessage::Request(request) => {
                    lock(&in_flight).insert(request.id.clone());
                }
                JsonRpcMessage::Notification(JsonRpcNotification {
                    notification: ClientNotification::CancelledNotification(n),
                    ..
                }) => {
                    if let Some(id) = &n.params.request_id {
                        lock(&in_flight).remove(id);
                    }
                }
                _ => {}
            }
            let mut stdin = stdin.lock().await;
            let Some(stdin) = stdin.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the upstream's stdin is closed",
                ));
            };
            stdin.write_all(&text).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.read_line().await {
                Ok(Read::Line) => {}
                Ok(Read::Oversized(head, bytes)) => match self.oversized(&head, bytes) {
                    Ok(Some(message)) => return Some(message),
                    Ok(None) => continue,
                    Err(()) => return None,
                },
                Ok(Read::Eof) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the upstream's stdout");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            let parsed = if text.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                match serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(text) {
                    Ok(message) => Some(message),
                    Err(e) => {
                        tracing::debug!(error = %e, "skipped a line of the upstream that is not a JSON-RPC message");
                        None
                    }
                }
            };
            self.line = line;
            self.line.clear();
            if let Some(message) = parsed {
                if let JsonRpcMessage::Response(r) = &message {
                    lock(&self.in_flight).remove(&r.id);
                } else if let JsonRpcMessage::Error(JsonRpcError { id: Some(id), .. }) = &message {
                    lock(&self.in_flight).remove(id);
                }
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.stdin.lock().await.take());
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_of_a_message_names_its_request() {
        let big = "x".repeat(100);
        let table = [
            (
                format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"text":"{big}"#),
                Head {
                    id: Some(RequestId::Number(7)),
                    method: false,
                },
            ),
            (
                format!(r#"{{"jsonrpc":"2.0","id":"a\"b","result":"{big}"}}"#),
                Head {
                    id: Some(RequestId::String("a\"b".into())),
                    method: false,
                },
            ),
            (format!(r#"{{"result":{{"text":"{big}"#), Head::default()),
            (
                format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":"{big}"#),
                Head {
                    id: None,
                    method: true,
                },
            ),
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":"{big}"#
                ),
                Head {
                    id: Some(RequestId::Number(3)),
                    method: true,
                },
            ),
            ("not json".to_string(), Head::default()),
        ];
        for (text, head) in table {
            assert_eq!(Head::read(text.as_bytes()), head, "{text}");
        }
    }

    #[test]
    fn a_too_long_answer_is_recognised_and_reads_well() {
        let over = Oversized {
            bytes: 70_000,
            limit: 65_536,
        };
        let e = over.error();
        assert_eq!(Oversized::of(&e), Some(over));
        assert_eq!(Oversized::of(&ErrorData::internal_error("x", None)), None);
        insta::assert_snapshot!("oversized_answer", e.message);
    }
}
