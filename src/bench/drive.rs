//! Driving real server processes: start one over stdio or streamable HTTP, send calls
//! sequentially or with many in flight, check each answer, and read the process's peak memory.
//!
//! Every call is checked (a benchmark of a server that answers errors measures nothing), and
//! every failure names the server and carries the answer it gave.

use crate::jsonrpc::{Child, Connection, Response, RpcError};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why a measurement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A server process could not be started or did not initialize.
    #[error("failed to start {what}")]
    Start {
        /// Which server.
        what: String,
        /// The cause.
        #[source]
        source: RpcError,
    },
    /// A request got no answer.
    #[error("{what} did not answer")]
    Rpc {
        /// Which server and request.
        what: String,
        /// The cause.
        #[source]
        source: RpcError,
    },
    /// A server answered, but not what the benchmark needs (an error, a missing field).
    #[error("{what} answered unexpectedly: {detail}")]
    Unexpected {
        /// Which server and request.
        what: String,
        /// What was wrong, with the start of the answer.
        detail: String,
    },
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The SQLite baseline failed.
    #[error("the SQLite baseline on `{path}` failed")]
    Sqlite {
        /// The database file.
        path: String,
        /// The cause.
        #[source]
        source: rusqlite::Error,
    },
    /// The throwaway PostgreSQL cluster failed.
    #[error(transparent)]
    Cluster(#[from] crate::storage::cluster::ClusterError),
    /// A command ran but failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and the tail of its stderr.
        detail: String,
    },
}

/// Result of a benchmark step.
pub type BenchResult<T> = Result<T, BenchError>;

/// The error with its cause chain, on one line.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let text = crate::error_chain::format(err);
    // Causes such as a server's stderr tail span lines; a report row holds one line.
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// JSON-RPC ids: unique across the run, so no two requests in flight ever share one.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Per-call ids for `_meta` (`callId`): unique across the run, so every call is a new call.
static NEXT_CALL: AtomicU64 = AtomicU64::new(1);

/// A fresh JSON-RPC id.
pub fn next_id() -> Value {
    json!(NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// A fresh call number for [`super::fixtures::codex_meta`].
pub fn next_call() -> u64 {
    NEXT_CALL.fetch_add(1, Ordering::Relaxed)
}

/// The protocol version the benchmark client speaks (what Codex sends).
pub const PROTOCOL: &str = "2025-06-18";

/// A server process and a connection to it.
pub struct Server {
    /// Name used in errors (`callid probe`, `the rmcp baseline`).
    pub name: String,
    /// The connection (stdio), or the first connection (HTTP).
    pub conn: Connection,
    /// The process, when the connection is its stdio.
    pub child: Option<Child>,
    /// The process, when started for HTTP.
    pub http_child: Option<tokio::process::Child>,
    /// The MCP endpoint, for HTTP servers.
    pub url: Option<String>,
}

impl Server {
    /// Starts `program args` with `envs` and initializes an MCP session over its stdio.
    pub async fn stdio(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> BenchResult<Server> {
        let start = |source| BenchError::Start {
            what: name.to_string(),
            source,
        };
        let (conn, child) = Connection::spawn_stdio(program, args, envs)
            .await
            .map_err(start)?;
        initialize(name, &conn).await?;
        Ok(Server {
            name: name.to_string(),
            conn,
            child: Some(child),
            http_child: None,
            url: None,
        })
    }

    /// Starts `program args` (which must serve streamable HTTP on `addr`), waits until it
    /// accepts connections, and initializes one session at `url`.
    pub async fn http(
        name: &str,
        program: &Path,
        args: &[String],
        addr: std::net::SocketAddr,
        url: &str,
        stderr_file: &Path,
    ) -> BenchResult<Server> {
        let stderr = std::fs::File::create(stderr_file).map_err(|source| BenchError::Io {
            what: format!("creating `{}`", stderr_file.display()),
            source,
        })?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::Io {
                what: format!("starting {name}"),
                source,
            })?;
        if let Err(exited) = wait_listening(&mut child, addr).await {
            let tail = std::fs::read_to_string(stderr_file).unwrap_or_default();
            return Err(BenchError::Unexpected {
                what: name.to_string(),
                detail: format!(
                    "it did not listen on {addr} ({}); stderr: {}",
                    exited.map_or("timed out".to_string(), |s| s.to_string()),
                    crate::text::last_lines(&tail, 5)
                ),
            });
        }
        let conn = http_session(name, url).await?;
        Ok(Server {
            name: name.to_string(),
            conn,
            child: None,
            http_child: Some(child),
            url: Some(url.to_string()),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        match (&self.child, &self.http_child) {
            (Some(child), _) => child.pid(),
            (None, Some(child)) => child.id(),
            (None, None) => None,
        }
    }

    /// Peak resident memory of the process so far, in MB (10^6 bytes).
    pub fn peak_rss_mb(&self) -> BenchResult<f64> {
        let pid = self.pid().ok_or_else(|| BenchError::Unexpected {
            what: self.name.clone(),
            detail: "the process has exited".into(),
        })?;
        peak_rss_mb(pid)
    }

    /// Resident memory of the process now, split into anonymous and file-backed pages.
    pub fn resident_split(&self) -> BenchResult<ResidentSplit> {
        let pid = self.pid().ok_or_else(|| BenchError::Unexpected {
            what: self.name.clone(),
            detail: "the process has exited".into(),
        })?;
        resident_split(pid)
    }

    /// Stops the server: closes its stdin (or kills an HTTP server) and waits for it.
    pub async fn stop(mut self) {
        self.conn.close().await;
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(Duration::from_secs(3), child.wait())
                .await
                .is_err()
        {
            let _ = child.kill9().await;
        }
        if let Some(mut child) = self.http_child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A new initialized streamable HTTP session at `url`.
pub async fn http_session(name: &str, url: &str) -> BenchResult<Connection> {
    let conn = Connection::http(url)
        .await
        .map_err(|source| BenchError::Start {
            what: name.to_string(),
            source,
        })?;
    initialize(name, &conn).await?;
    Ok(conn)
}

/// The MCP `initialize` handshake as the benchmark client, answered without error.
async fn initialize(name: &str, conn: &Connection) -> BenchResult<()> {
    let response = conn
        .initialize(
            next_id(),
            PROTOCOL,
            "callid-bench",
            env!("CARGO_PKG_VERSION"),
        )
        .await
        .map_err(|source| BenchError::Start {
            what: name.to_string(),
            source,
        })?;
    expect_no_error(name, "initialize", &response)
}

/// Waits (20 s at most) until `child` accepts connections on `addr`; otherwise how it exited, or
/// `None` when it is still running.
pub async fn wait_listening(
    child: &mut tokio::process::Child,
    addr: std::net::SocketAddr,
) -> Result<(), Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() > deadline {
            return Err(exited);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A loopback address with a port that was free a moment ago.
pub fn free_loopback_addr() -> BenchResult<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| BenchError::Io {
        what: "finding a free loopback port".into(),
        source,
    })?;
    listener.local_addr().map_err(|source| BenchError::Io {
        what: "finding a free loopback port".into(),
        source,
    })
}

/// Peak resident memory (`VmHWM`) of process `pid`, in MB (10^6 bytes).
pub fn peak_rss_mb(pid: u32) -> BenchResult<f64> {
    let status = ProcStatus::read(pid)?;
    status.mb("VmHWM")
}

/// A process's resident memory split the way the kernel counts it, in MB (10^6 bytes).
///
/// A peak RSS is mostly `file`: pages of the binary's code and read-only data (and of its
/// libraries) that the kernel mapped into the process around the code that ran, shared and
/// reclaimable. How many depends on how the binary's file entered the page cache and on where
/// the code that ran lies in the binary, not on what the process allocated. Measured for the
/// probe (one build, 6,050 calls, 16 in flight): 15.4 MB peak run as the linker wrote it,
/// 16.3-16.7 MB read back from disk, 19.7-20.5 MB copied with `cp` (whole large folios mapped
/// per fault), and 6.8-7.2 MB in all three when the functions it runs were linked first; the
/// anonymous part was 1.2-1.4 MB in every case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidentSplit {
    /// Anonymous and shared-memory pages (`RssAnon` + `RssShmem`): heap, stacks, written data.
    pub anonymous: f64,
    /// File-backed pages (`RssFile`): the binary's and the libraries' code and read-only data.
    pub file: f64,
}

impl ResidentSplit {
    /// The split as a row note's tail.
    pub fn note(&self) -> String {
        format!(
            "; at the end {:.1} MB anonymous (heap, stacks), {:.1} MB file-backed (pages of \
             the binary and its libraries mapped around the code that ran: more when the binary \
             was copied with large writes, as `cp` does)",
            self.anonymous, self.file
        )
    }
}

/// Resident memory of process `pid` now, split into anonymous and file-backed pages.
pub fn resident_split(pid: u32) -> BenchResult<ResidentSplit> {
    let status = ProcStatus::read(pid)?;
    Ok(ResidentSplit {
        anonymous: status.mb("RssAnon")? + status.mb("RssShmem")?,
        file: status.mb("RssFile")?,
    })
}

/// The text of `/proc/PID/status`, read once so that its figures agree with each other.
struct ProcStatus {
    path: String,
    text: String,
}

impl ProcStatus {
    fn read(pid: u32) -> BenchResult<Self> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
            what: format!("reading `{path}`"),
            source,
        })?;
        Ok(ProcStatus { path, text })
    }

    /// The `key:` line's figure (in kB), in MB (10^6 bytes).
    fn mb(&self, key: &str) -> BenchResult<f64> {
        let kb = self
            .text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .ok_or_else(|| BenchError::Unexpected {
                what: format!("`{}`", self.path),
                detail: format!("no `{key}` line"),
            })?;
        Ok(kb * 1024.0 / 1e6)
    }
}

/// One `tools/call` to send.
#[derive(Debug, Clone)]
pub struct Call {
    /// Tool name.
    pub tool: &'static str,
    /// Arguments.
    pub arguments: Value,
    /// `_meta`.
    pub meta: Value,
}

/// Checks an answer; returns a description of what is wrong with it.
pub type Check = fn(&Response) -> Result<(), String>;

/// A tool answer that is neither a JSON-RPC error nor a tool error.
pub fn check_success(response: &Response) -> Result<(), String> {
    if response.error.is_some() {
        return Err("a JSON-RPC error".into());
    }
    if response.tool_result().is_none() {
        return Err("no result".into());
    }
    if response.is_tool_error() {
        return Err("a tool error".into());
    }
    Ok(())
}

/// A spend that completed: `structuredContent.status == "completed"`.
pub fn check_completed(response: &Response) -> Result<(), String> {
    check_success(response)?;
    match response
        .structured()
        .and_then(|s| s.get("status"))
        .and_then(Value::as_str)
    {
        Some("completed") => Ok(()),
        other => Err(format!("status {other:?}, not \"completed\"")),
    }
}

/// A replayed spend: completed, and `_meta["callid/replayed"] == true`.
pub fn check_replayed(response: &Response) -> Result<(), String> {
    check_completed(response)?;
    let replayed = response
        .tool_result()
        .and_then(|r| r.get("_meta"))
        .and_then(|m| m.get("callid/replayed"));
    if replayed == Some(&Value::Bool(true)) {
        Ok(())
    } else {
        Err(format!(
            "`_meta[\"callid/replayed\"]` is {replayed:?}, not true"
        ))
    }
}

fn expect_no_error(name: &str, method: &str, response: &Response) -> BenchResult<()> {
    if response.error.is_some() || response.result.is_none() {
        return Err(BenchError::Unexpected {
            what: format!("{name} `{method}`"),
            detail: snippet(&response.raw),
        });
    }
    Ok(())
}

/// Sends one call and checks the answer.
pub async fn call(name: &str, conn: &Connection, call: &Call, check: Check) -> BenchResult<()> {
    let response = conn
        .call_tool(
            next_id(),
            call.tool,
            call.arguments.clone(),
            Some(call.meta.clone()),
        )
        .await
        .map_err(|source| BenchError::Rpc {
            what: format!("{name} `{}`", call.tool),
            source,
        })?;
    check(&response).map_err(|why| BenchError::Unexpected {
        what: format!("{name} `{}`", call.tool),
        detail: format!("{why}: {}", snippet(&response.raw)),
    })
}

/// Sends `total` calls made by `make`, sequentially, and returns the time per call.
pub async fn sequential(
    name: &str,
    conn: &Connection,
    total: usize,
    make: &(dyn Fn() -> Call + Send + Sync),
    check: Check,
) -> BenchResult<f64> {
    let calls: Vec<Call> = (0..total).map(|_| make()).collect();
    let start = Instant::now();
    for c in &calls {
        call(name, conn, c, check).await?;
    }
    Ok(start.elapsed().as_secs_f64() / total.max(1) as f64)
}

/// Sends `total` calls made by `make` with `in_flight` workers, worker `k` using connection
/// `k % conns.len()`, and returns the rate in calls per second.
pub async fn concurrent(
    name: &str,
    conns: &[Connection],
    total: usize,
    in_flight: usize,
    make: &(dyn Fn() -> Call + Send + Sync),
    check: Check,
) -> BenchResult<f64> {
    let calls: Arc<Vec<Call>> = Arc::new((0..total).map(|_| make()).collect());
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for k in 0..in_flight.max(1) {
        let conn = conns[k % conns.len()].clone();
        let calls = calls.clone();
        let next = next.clone();
        let name = name.to_string();
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(c) = calls.get(i) else {
                    return Ok::<(), BenchError>(());
                };
                call(&name, &conn, c, check).await?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.map_err(|e| BenchError::Unexpected {
            what: name.to_string(),
            detail: format!("a client task panicked: {e}"),
        })??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The first 300 bytes of an answer (whole characters), for errors.
pub fn snippet(text: &str) -> String {
    crate::text::clip(text, 300)
}

/// The `callid` binary to start: this very program.
pub fn own_program() -> BenchResult<PathBuf> {
    std::env::current_exe().map_err(|source| BenchError::Io {
        what: "finding this program's path".into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_split_adds_up_to_the_resident_set() {
        let pid = std::process::id();
        let status = ProcStatus::read(pid).expect("own status");
        let total = status.mb("VmRSS").expect("VmRSS");
        let parts = status.mb("RssAnon").unwrap()
            + status.mb("RssFile").unwrap()
            + status.mb("RssShmem").unwrap();
        assert!(
            (total - parts).abs() < 1e-9,
            "{total} MB against {parts} MB"
        );
        let split = resident_split(pid).expect("own split");
        assert!(split.anonymous > 0.0 && split.file > 0.0, "{split:?}");
    }

    #[test]
    fn a_line_is_found_by_its_whole_key_and_a_missing_one_is_named() {
        let status = ProcStatus {
            path: "/proc/1/status".into(),
            text: "VmRSSx:\t  7 kB\nVmRSS:\t  100 kB\n".into(),
        };
        assert!((status.mb("VmRSS").unwrap() - 0.1024).abs() < 1e-12);
        let err = status.mb("VmHWM").unwrap_err().to_string();
        assert!(err.contains("no `VmHWM` line"), "{err}");
    }
}
