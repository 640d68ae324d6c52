//! `callid probe` under test: started on stdio with its log in a temp directory, ended the way a
//! client ends it (stdin closed, exit 0 expected), and its log read back as records.

use super::bin;
use callid::jsonrpc::{Child, Connection, Response};
use callid::probe::record::Record;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Starts `callid ARGS` on stdio with a 20 s per-request timeout (no `initialize` sent).
pub async fn spawn_probe(args: &[&str]) -> (Connection, Child) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut conn, child) = Connection::spawn_stdio(&bin(), &args, &[]).await.unwrap();
    conn.set_timeout(Duration::from_secs(20));
    (conn, child)
}

/// `callid probe FLAGS --log DIR/LOG_NAME` in a fresh temp directory: the directory (keep it
/// alive), the log's path, and the session.
pub async fn logged_probe(
    log_name: &str,
    flags: &[&str],
) -> (tempfile::TempDir, PathBuf, Connection, Child) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join(log_name);
    let mut args = vec!["probe"];
    args.extend(flags);
    args.extend(["--log", log.to_str().unwrap()]);
    let (conn, child) = spawn_probe(&args).await;
    (dir, log, conn, child)
}

/// Calls the probe's `capabilities` tool with JSON-RPC id `id` and `_meta` `meta`: its answer.
pub async fn capabilities(conn: &Connection, id: Value, meta: Value) -> Response {
    conn.call_tool(id, "capabilities", json!({}), Some(meta))
        .await
        .unwrap()
}

/// Closes the client's side (stdin) and expects the server to exit 0; its stderr otherwise.
pub async fn close_expecting_exit_0(conn: &Connection, child: &mut Child) {
    conn.close().await;
    assert_eq!(
        child.wait().await.unwrap().code(),
        Some(0),
        "{}",
        child.stderr_text()
    );
}

/// Writes a probe log at `log` (`extra` flags added) of client `name version`: one
/// `capabilities {}` call per `_meta` in `metas`, JSON-RPC ids 1, 2, ...
pub async fn record_calls(log: &Path, extra: &[&str], client: (&str, &str), metas: &[Value]) {
    let mut args = vec!["probe", "--log", log.to_str().unwrap()];
    args.extend(extra);
    let (conn, mut child) = spawn_probe(&args).await;
    conn.initialize(json!(0), "2025-06-18", client.0, client.1)
        .await
        .unwrap();
    for (i, meta) in metas.iter().enumerate() {
        let r = capabilities(&conn, json!(i + 1), meta.clone()).await;
        assert!(r.result.is_some(), "{}", r.raw);
    }
    close_expecting_exit_0(&conn, &mut child).await;
}

/// The records of the probe log at `path`, every line one record.
pub fn read_records(path: &Path) -> Vec<Record> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Waits until the log holds `n` records (the probe writes them off the reply path), for at most
/// 10 s; then reads it.
pub async fn wait_for_records(path: &Path, n: usize) -> Vec<Record> {
    for _ in 0..400 {
        if std::fs::read_to_string(path).is_ok_and(|t| t.lines().count() >= n) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    read_records(path)
}
