//! The probe on stdio: every client line goes through the tap, then into an rmcp server.
//!
//! [`serve_stdio`] works on any byte streams, so the binary runs it on stdin/stdout and tests run
//! it in-process on a `tokio::io::duplex`. The tap is the rmcp server's transport
//! ([`TapTransport`]): rmcp asks it for the next message, and it reads the client's bytes,
//! frames them, and hands each line to the tap, which parses it once, decides (see
//! [`super::tap`]), and gives rmcp the message already typed from its own parse; the record is
//! built and written by the tap's writer thread, off the reply path. rmcp's replies are
//! serialized once and written straight to the output; the tap's own answers (refused input) are
//! written there too, whole lines under one lock, so nothing interleaves within a line.
//!
//! # Shutdown
//! End of input ends rmcp's session once every request read is answered
//! ([`crate::serve::stdio`]); the last replies and answers are written and [`serve_stdio`]
//! returns. Should rmcp's session end first, the rest of the input is still read
//! and recorded (the tap still answers what it answers itself).

use super::error::ProbeError;
use super::server::ProbeServer;
use super::tap::{Frame, LineFramer, Tap, TapConnection};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage, ServerResult};
use rmcp::service::RoleServer;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

type Output = Arc<tokio::sync::Mutex<Box<dyn AsyncWrite + Unpin + Send>>>;

/// Writes one line (already ending in a newline) and flushes.
async fn write_line(out: &Output, line: &[u8]) -> std::io::Result<()> {
    let mut w = out.lock().await;
    w.write_all(line).await?;
    w.flush().await
}

/// The client side of the connection, shared by the transport and [`serve_stdio`].
struct Input<R> {
    input: R,
    buf: Vec<u8>,
    framer: LineFramer,
    frames: VecDeque<Frame>,
    scratch: Vec<Frame>,
    eof: bool,
    answers: Vec<tokio::task::JoinHandle<()>>,
}

/// rmcp's transport for the probe: messages come from the tap, replies go to the output.
pub struct TapTransport<R> {
    input: Arc<tokio::sync::Mutex<Input<R>>>,
    conn: Arc<Mutex<TapConnection>>,
    out: Output,
}

impl<R: AsyncRead + Unpin + Send> Input<R> {
    /// The next frame, reading more input when none is buffered; `None` at the end of input.
    async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.frames.pop_front() {
                return Some(frame);
            }
            if self.eof {
                return None;
            }
            // Cancel-safe: bytes are consumed only when the read completes.
            let n = match self.input.read(&mut self.buf).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("reading from the client failed: {e}");
                    0
                }
            };
            if n == 0 {
                self.framer.finish(&mut self.scratch);
                self.eof = true;
            } else {
                self.framer.push(&self.buf[..n], &mut self.scratch);
            }
            self.frames.extend(self.scratch.drain(..));
        }
    }

    /// Sends the tap's answer without waiting (the write is awaited before the end).
    fn answer(&mut self, out: &Output, answer: &serde_json::Value) {
        let mut line = serde_json::to_vec(answer).expect("a Value serializes");
        line.push(b'\n');
        let out = out.clone();
        self.answers.retain(|h| !h.is_finished());
        self.answers.push(tokio::spawn(async move {
            if let Err(e) = write_line(&out, &line).await {
                tracing::debug!("writing to the client failed: {e}");
            }
        }));
    }

    /// Waits for the answers sent so far to be written.
    async fn answers_written(&mut self) {
        while let Some(handle) = self.answers.last_mut() {
            let _ = handle.await;
            self.answers.pop();
        }
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> rmcp::transport::Transport<RoleServer>
    for TapTransport<R>
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Response(r) = &item
            && let ServerResult::InitializeResult(init) = &r.result
        {
            self.conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .server_initialized(&r.id, init.protocol_version.as_str());
        }
        let line = serde_json::to_vec(&item).map(|mut line| {
            line.push(b'\n');
            line
        });
        let out = self.out.clone();
        async move {
            let line = line.map_err(std::io::Error::other)?;
            write_line(&out, &line).await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        let mut input = self.input.lock().await;
        loop {
            let Some(frame) = input.next_frame().await else {
                input.answers_written().await;
                return None;
            };
            let obs = self
                .conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .client_frame(&frame);
            if let Some(answer) = &obs.answer {
                input.answer(&self.out, answer);
            }
            if let Some(message) = obs.message {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.input.lock().await.answers_written().await;
        self.out.lock().await.flush().await
    }
}

/// Serves one MCP connection on `input`/`output` until `input` ends.
pub async fn serve_stdio<R, W>(
    input: R,
    output: W,
    tap: Arc<Tap>,
    server: ProbeServer,
) -> Result<(), ProbeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Mutex::new(tap.connection().feeding_server()));
    let out: Output = Arc::new(tokio::sync::Mutex::new(Box::new(output)));
    let input = Arc::new(tokio::sync::Mutex::new(Input {
        input,
        buf: vec![0u8; 64 * 1024],
        framer: LineFramer::default(),
        frames: VecDeque::new(),
        scratch: Vec::new(),
        eof: false,
        answers: Vec::new(),
    }));
    let transport = TapTransport {
        input: input.clone(),
        conn: conn.clone(),
        out: out.clone(),
    };
    if let Err(e) = crate::serve::stdio(server, transport, "probe").await {
        tracing::debug!("the probe's MCP session ended: {e}");
    }
    // Whatever rmcp left unread is still recorded (and answered where the tap answers).
    let mut input = input.lock().await;
    while let Some(frame) = input.next_frame().await {
        let obs = conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .client_frame(&frame);
        if let Some(answer) = &obs.answer {
            input.answer(&out, answer);
        }
        if obs.message.is_some() {
            tracing::error!(
                "the probe's MCP session has ended; a message was recorded, not served"
            );
        }
    }
    input.answers_written().await;
    let mut w = out.lock().await;
    w.flush().await.map_err(|source| ProbeError::Io {
        doing: "writing to the client",
        source,
    })?;
    let _ = w.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{Kind, Record, ShapeLog, Transport};
    use crate::probe::tap::Mode;
    use crate::shape::Digester;
    use rmcp::ServiceExt as _;
    use rmcp::model::{CallToolRequestParams, MetaObject, RequestMetaObject};
    use serde_json::{Value, json};
    use std::io::Write;

    /// A log sink the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A real rmcp client talks to the probe over an in-memory duplex: whatever lifecycle it
    /// opens with (`server/discover` or `initialize`), it ends up calling the tool, and every
    /// message it sent is in the log.
    #[tokio::test]
    async fn rmcp_client_over_duplex() {
        let log = Shared::default();
        let tap = Arc::new(Tap::new(
            Digester::Plain,
            Arc::new(ShapeLog::from_writer(Box::new(log.clone()))),
            Transport::Stdio,
            Mode::Serve,
        ));
        let (client_side, probe_side) = tokio::io::duplex(64 * 1024);
        let (probe_in, probe_out) = tokio::io::split(probe_side);
        let server = tokio::spawn(serve_stdio(
            probe_in,
            probe_out,
            tap.clone(),
            ProbeServer::new(Digester::Plain),
        ));
        let client = ().serve(tokio::io::split(client_side)).await.expect("initialized");
        let tools = client.list_all_tools().await.unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "capabilities");
        let meta: serde_json::Map<String, Value> =
            serde_json::from_value(json!({"callId": "call_inprocess-secret-1"})).unwrap();
        let mut params = CallToolRequestParams::new("capabilities");
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let result = client.call_tool(params).await.unwrap();
        let answer = result.structured_content.unwrap();
        assert_eq!(answer["identity"]["verdict"], json!("accepted"));
        assert_eq!(answer["identity"]["source"], json!("callId"));
        let no_meta = client
            .call_tool(CallToolRequestParams::new("capabilities"))
            .await
            .unwrap()
            .structured_content
            .unwrap();
        // rmcp always adds its own progressToken, so `_meta` is present but has no source.
        assert_eq!(no_meta["identity"]["code"], json!("missing_identity"));
        client.cancel().await.unwrap();
        server.await.unwrap().unwrap();
        assert_eq!(tap.finish().dropped, 0);

        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("inprocess-secret"), "{text}");
        let records: Vec<Record> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let methods: Vec<&str> = records.iter().filter_map(|r| r.method.as_deref()).collect();
        assert!(methods.contains(&"tools/list"), "{methods:?}");
        assert_eq!(
            methods.iter().filter(|m| **m == "tools/call").count(),
            2,
            "{methods:?}"
        );
        let call = records
            .iter()
            .find(|r| r.method.as_deref() == Some("tools/call"))
            .unwrap();
        assert_eq!(call.kind, Kind::Request);
        assert!(call.request_digest.is_some());
        assert!(call.client.is_some(), "the client named itself: {call:?}");
    }
}
