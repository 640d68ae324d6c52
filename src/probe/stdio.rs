//! The probe on stdio: every client line goes through the tap, then into an rmcp server.
//!
//! [`serve_stdio`] works on any byte streams, so the binary runs it on stdin/stdout and tests run
//! it in-process on a `tokio::io::duplex`. The rmcp server sits behind an in-memory duplex pipe:
//! the tap sees each raw line first and either forwards it unchanged or answers it itself
//! (see [`super::tap`]). One writer task owns the output, so the server's replies and the tap's
//! answers never interleave within a line.
//!
//! # Shutdown
//! End of input closes the server's input; the server finishes, its output drains, and
//! [`serve_stdio`] returns.

use super::error::ProbeError;
use super::server::ProbeServer;
use super::tap::{Frame, LineFramer, Tap};
use rmcp::ServiceExt as _;
use std::sync::{Arc, Mutex};
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _,
};
use tokio::sync::mpsc;

fn io(doing: &'static str) -> impl FnOnce(std::io::Error) -> ProbeError {
    move |source| ProbeError::Io { doing, source }
}

/// Serves one MCP connection on `input`/`output` until `input` ends.
pub async fn serve_stdio<R, W>(
    mut input: R,
    mut output: W,
    tap: Arc<Tap>,
    server: ProbeServer,
) -> Result<(), ProbeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Mutex::new(tap.connection()));
    let (probe_side, rmcp_side) = tokio::io::duplex(256 * 1024);
    let rmcp_task = tokio::spawn(async move {
        match server.serve(tokio::io::split(rmcp_side)).await {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(e) => tracing::debug!("the probe's MCP session ended before it began: {e}"),
        }
    });
    let (probe_read, mut probe_write) = tokio::io::split(probe_side);

    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(line) = out_rx.recv().await {
            output
                .write_all(&line)
                .await
                .map_err(io("writing to the client"))?;
            output.flush().await.map_err(io("writing to the client"))?;
        }
        Ok::<(), ProbeError>(())
    });

    let server_out = {
        let conn = conn.clone();
        let out_tx = out_tx.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(probe_read);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        conn.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .server_message(line.strip_suffix(b"\n").unwrap_or(&line));
                        if out_tx.send(line.clone()).is_err() {
                            break;
                        }
                    }
                }
            }
        })
    };

    let mut framer = LineFramer::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut frames = Vec::new();
    let mut server_alive = true;
    loop {
        let n = input
            .read(&mut buf)
            .await
            .map_err(io("reading from the client"))?;
        if n == 0 {
            framer.finish(&mut frames);
        } else {
            framer.push(&buf[..n], &mut frames);
        }
        for frame in frames.drain(..) {
            let obs = conn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .client_frame(&frame);
            if let Some(answer) = &obs.answer {
                let mut line = serde_json::to_vec(answer).expect("a Value serializes");
                line.push(b'\n');
                let _ = out_tx.send(line);
            }
            if let (true, true, Frame::Message(bytes)) = (obs.forward, server_alive, &frame) {
                let sent = async {
                    probe_write.write_all(bytes).await?;
                    probe_write.write_all(b"\n").await?;
                    probe_write.flush().await
                }
                .await;
                if let Err(e) = sent {
                    tracing::error!("the probe's MCP server stopped reading: {e}");
                    server_alive = false;
                }
            }
        }
        if n == 0 {
            break;
        }
    }
    drop(out_tx);
    let _ = probe_write.shutdown().await;
    drop(probe_write);
    let _ = rmcp_task.await;
    let _ = server_out.await;
    writer.await.unwrap_or(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{Kind, Record, ShapeLog, Transport};
    use crate::probe::tap::Mode;
    use crate::shape::Digester;
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
            tap,
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
