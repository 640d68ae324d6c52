//! The stdio servers on the reactor (`src/pipes.rs`): a real `callid probe` process served
//! through pipes and through a UNIX socket pair (as Node-based clients connect a stdio server),
//! answering and recording every message, and a real `callid router` answering every new
//! operation through pipes, each with its inherited descriptions in non-blocking mode while it
//! runs and back in blocking mode once it has exited.

use crate::common::bin;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn nonblocking(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GETFL on a descriptor this test holds open.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0, "fcntl failed");
    flags & libc::O_NONBLOCK != 0
}

fn request(id: u64, method: &str, params: Value) -> String {
    format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    )
}

/// Which server a conversation is with: its name in `initialize`, the tool it calls and what
/// every answer must say.
#[derive(Clone, Copy)]
enum Server {
    Probe,
    Router,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Probe => "callid-probe",
            Server::Router => "callid-router",
        }
    }

    fn call_params(self, n: u64) -> Value {
        let meta = json!({"callId": format!("call_{n:024}"), "progressToken": n});
        match self {
            Server::Probe => json!({"name": "capabilities", "arguments": {}, "_meta": meta}),
            Server::Router => json!({"name": "generate_image",
                                     "arguments": {"prompt": format!("fox {n}")}, "_meta": meta}),
        }
    }

    fn check(self, answer: &Value, line: &str) {
        match self {
            Server::Probe => assert_eq!(
                answer["result"]["structuredContent"]["identity"]["verdict"],
                json!("accepted"),
                "{line}"
            ),
            Server::Router => {
                let result = &answer["result"];
                assert_eq!(
                    result["structuredContent"]["status"],
                    json!("completed"),
                    "{line}"
                );
                assert_eq!(result["_meta"]["callid/replayed"], json!(false), "{line}");
            }
        }
    }
}

/// Sends initialize, the initialized notification and `calls` tool calls one at a time on
/// `input`, reading each answer from `output`; checks every answer.
fn converse(server: Server, input: &mut impl Write, output: &mut impl BufRead, calls: u64) {
    let mut line = String::new();
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                      "clientInfo": {"name": "perf-client", "version": "1.0.0"}});
    input
        .write_all(request(0, "initialize", init).as_bytes())
        .unwrap();
    output.read_line(&mut line).unwrap();
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        answer["result"]["serverInfo"]["name"],
        json!(server.name()),
        "{line}"
    );
    input
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .unwrap();
    for n in 1..=calls {
        input
            .write_all(request(n, "tools/call", server.call_params(n)).as_bytes())
            .unwrap();
        line.clear();
        output.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["id"], json!(n), "{line}");
        server.check(&answer, &line);
    }
}

fn wait_for_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not exit after its input ended");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn calls_recorded(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["method"] == json!("tools/call"))
        .count()
}

/// `callid ARGS` on the given stdin and stdout, its stderr piped.
fn spawn(args: &[&str], stdin: impl Into<Stdio>, stdout: impl Into<Stdio>) -> std::process::Child {
    Command::new(bin())
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the server to exit: its status and all it wrote to stderr.
fn finish(child: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    let status = wait_for_exit(child);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

/// Runs `callid ARGS` on two pipes through `calls` tool calls and its input's end: both
/// descriptions are non-blocking while it runs and blocking again once it exited with success.
/// Answers what it wrote to stderr.
fn over_pipes(server: Server, args: &[&str], calls: u64) -> String {
    let (child_in, mut to_child) = std::io::pipe().unwrap();
    let (from_child, child_out) = std::io::pipe().unwrap();
    // Kept here: they share the child's descriptions, whose mode the test reads.
    let in_description: OwnedFd = child_in.as_fd().try_clone_to_owned().unwrap();
    let out_description: OwnedFd = child_out.as_fd().try_clone_to_owned().unwrap();
    let mut child = spawn(args, child_in, child_out);
    let mut from_child = BufReader::new(from_child);
    converse(server, &mut to_child, &mut from_child, calls);
    assert!(
        nonblocking(in_description.as_fd()) && nonblocking(out_description.as_fd()),
        "stdin and stdout are the reactor's while the server runs"
    );
    drop(to_child);
    let (status, stderr) = finish(&mut child);
    assert!(status.success(), "{stderr}");
    assert!(
        !nonblocking(in_description.as_fd()) && !nonblocking(out_description.as_fd()),
        "blocking mode is restored at exit"
    );
    stderr
}

#[test]
fn probe_over_pipes_runs_on_the_reactor_and_restores_blocking_mode() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("probe.jsonl");
    let stderr = over_pipes(
        Server::Probe,
        &["probe", "--log", log.to_str().unwrap()],
        50,
    );
    assert_eq!(calls_recorded(&log), 50, "{stderr}");
}

#[test]
fn probe_over_a_socket_pair_runs_on_the_reactor_and_restores_blocking_mode() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("probe.jsonl");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let child_in: OwnedFd = theirs.try_clone().unwrap().into();
    let child_out: OwnedFd = theirs.try_clone().unwrap().into();
    let mut child = spawn(
        &["probe", "--log", log.to_str().unwrap()],
        child_in,
        child_out,
    );
    let mut input = ours.try_clone().unwrap();
    let mut output = BufReader::new(ours.try_clone().unwrap());
    converse(Server::Probe, &mut input, &mut output, 50);
    assert!(
        nonblocking(theirs.as_fd()),
        "the socket is the reactor's while the probe runs"
    );
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    let (status, stderr) = finish(&mut child);
    assert!(status.success(), "{stderr}");
    assert!(
        !nonblocking(theirs.as_fd()),
        "blocking mode is restored at exit"
    );
    assert_eq!(calls_recorded(&log), 50, "{stderr}");
}

#[test]
fn router_over_pipes_runs_on_the_reactor_and_restores_blocking_mode() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite3");
    over_pipes(
        Server::Router,
        &["router", "--registry", registry.to_str().unwrap()],
        20,
    );
}
