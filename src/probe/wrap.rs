//! `callid probe --wrap -- CMD ARGS...`: a transparent stdio proxy that records shapes.
//!
//! # Guarantees
//! - Every byte the client writes reaches the wrapped server unchanged and in order, and every
//!   byte the server writes reaches the client unchanged: each chunk is forwarded as it was read
//!   (parsing only looks at a copy, and never holds a chunk back waiting for a whole line), so
//!   neither side can tell the proxy is there.
//! - The client's messages are recorded through the tap in [`super::tap::Mode::Observe`]: it
//!   never answers and never drops. The server's replies are read only to learn the agreed
//!   protocol version.
//! - The server's stderr is the proxy's stderr. When the server exits, the proxy forwards what
//!   is left of its output and exits with the server's exit code.

use super::error::ProbeError;
use super::tap::{LineFramer, Tap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Runs `command` behind the proxy on `input`/`output`; returns the server's exit code.
pub async fn run_wrap<R, W>(
    command: &[String],
    input: R,
    output: W,
    tap: Arc<Tap>,
) -> Result<i32, ProbeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (program, args) = command.split_first().ok_or(ProbeError::NoCommand)?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ProbeError::Spawn {
            program: program.clone(),
            source,
        })?;
    let child_in = child.stdin.take().expect("piped stdin");
    let child_out = child.stdout.take().expect("piped stdout");
    let conn = Arc::new(Mutex::new(tap.connection()));

    let upstream = {
        let conn = conn.clone();
        tokio::spawn(pump(input, child_in, move |chunk, framer, frames| {
            framer.push(chunk, frames);
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            for frame in frames.drain(..) {
                conn.client_frame(&frame);
            }
        }))
    };
    let downstream = {
        let conn = conn.clone();
        tokio::spawn(pump(child_out, output, move |chunk, framer, frames| {
            framer.push(chunk, frames);
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            for frame in frames.drain(..) {
                if let super::tap::Frame::Message(m) = frame {
                    conn.server_message(&m);
                }
            }
        }))
    };
    let status = child.wait().await.map_err(|source| ProbeError::Io {
        doing: "waiting for the wrapped server",
        source,
    })?;
    let _ = downstream.await;
    upstream.abort();
    Ok(status.code().unwrap_or(1))
}

/// Copies `from` to `to` chunk by chunk, showing each chunk to `observe` just before forwarding it.
/// At the end of `from`, flushes the framer and closes `to`.
async fn pump<R, W, F>(mut from: R, mut to: W, mut observe: F)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    F: FnMut(&[u8], &mut LineFramer, &mut Vec<super::tap::Frame>),
{
    let mut framer = LineFramer::default();
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = true;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Observed first, so what a reply teaches (the agreed protocol) is known before the
        // client can send its next message; the bytes forwarded are the bytes read either way.
        observe(&buf[..n], &mut framer, &mut frames);
        if open && (to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err()) {
            // Keep reading (and recording) even when the other side went away.
            open = false;
        }
    }
    framer.finish(&mut frames);
    observe(&[], &mut framer, &mut frames);
    let _ = to.shutdown().await;
}
