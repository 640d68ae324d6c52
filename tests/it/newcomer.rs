//! Messages a newcomer met (issue #26, item 5): each run as a user would, the installed binary in
//! an empty directory, and its words snapshotted. A mistyped subcommand or flag is never offered a
//! hidden one; a near-miss flag is offered the flag; a closed `--upstream-url` is named (its
//! secrets redacted) with its cause and fix, in words; a refused gateway start creates nothing;
//! an unknown `--only` check id names the nearest and `--list`; a missing identity-source preset
//! says how to write it from the binary.

use crate::common::bin;
use clap::CommandFactory as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// `callid ARGS` run in `dir` with colour off: its exit code and standard error.
fn callid_in(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("CALLID_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The transcript of `args`, each run in a fresh empty directory: `$ callid ARGS`, then the exit
/// code and standard error.
fn transcript(runs: &[&[&str]]) -> String {
    let mut text = String::new();
    for args in runs {
        let dir = tempfile::tempdir().unwrap();
        let (code, stderr) = callid_in(dir.path(), args);
        text.push_str(&format!(
            "$ callid {}\n[exit {}]\n{stderr}\n",
            args.join(" "),
            code.unwrap_or(-1)
        ));
    }
    text
}

/// Near misses of `name`: the last character dropped, one added, and the first two swapped.
fn typos(name: &str) -> Vec<String> {
    let mut chars: Vec<char> = name.chars().collect();
    let mut out = vec![name[..name.len() - 1].to_string(), format!("{name}x")];
    chars.swap(0, 1);
    out.push(chars.into_iter().collect());
    out
}

#[test]
fn no_hidden_subcommand_or_flag_is_ever_suggested() {
    let mut root = callid::cli::Cli::command();
    root.build();
    // (path of subcommands, hidden name as typed)
    let mut hidden: Vec<(Vec<String>, String)> = Vec::new();
    let mut stack = vec![(Vec::<String>::new(), &root)];
    while let Some((path, cmd)) = stack.pop() {
        for arg in cmd.get_arguments().filter(|a| a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                hidden.push((path.clone(), format!("--{long}")));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() {
                hidden.push((path.clone(), sub.get_name().to_string()));
            }
            let mut below = path.clone();
            below.push(sub.get_name().to_string());
            stack.push((below, sub));
        }
    }
    assert!(
        hidden.iter().any(|(_, n)| n == "conform-upstream-relay"),
        "{hidden:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    for (path, name) in &hidden {
        let mut tried = typos(name);
        if name == "conform-upstream-relay" {
            tried.extend(["conform-upstream".into(), "conform-up".into()]);
        }
        for typo in tried {
            let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
            args.push(&typo);
            let (code, stderr) = callid_in(dir.path(), &args);
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            // The typo itself holds the name: a tip quotes it ('NAME', 'SUB NAME').
            assert!(
                !stderr.contains(&format!("'{name}'")) && !stderr.contains(&format!(" {name}'")),
                "`callid {}` offers the hidden `{name}`: {stderr}",
                args.join(" ")
            );
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    insta::assert_snapshot!(transcript(&[
        &["conform-upstream"],
        &["conform-up"],
        &["router", "resolv"],
    ]));
}

#[test]
fn a_near_miss_of_a_known_flag_is_offered_the_flag() {
    let text = transcript(&[
        &["probe", "--lgo"],
        &["probe", "--lgo=probe.jsonl"],
        &["conform", "--onyl", "approval.deny-refuses"],
        &["gateway", "--registyr", "r.sqlite3"],
    ]);
    assert!(!text.contains("use '-- --lgo'"), "{text}");
    insta::assert_snapshot!(text);
}

/// A loopback port that nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_closed_upstream_url_is_named_redacted_with_its_cause_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let url = format!("http://user:hunter2@127.0.0.1:{port}/mcp?api_key=sk-123");
    let registry = dir.path().join("registry.sqlite3");
    let (code, stderr) = callid_in(
        dir.path(),
        &[
            "gateway",
            "--registry",
            registry.to_str().unwrap(),
            "--spend",
            "generate_image",
            "--upstream-url",
            &url,
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    for secret in ["hunter2", "sk-123"] {
        assert!(!stderr.contains(secret), "{stderr}");
    }
    // No Rust path (`rmcp::transport::…`, `reqwest::Error`), no "start" for a URL.
    assert!(!stderr.contains("::"), "{stderr}");
    assert!(!stderr.contains("start the upstream MCP"), "{stderr}");
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    insta::assert_snapshot!(stderr.replace(&port.to_string(), "PORT"));
}

#[test]
fn an_unknown_spend_tool_refuses_the_start_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = tempfile::tempdir().unwrap();
    let ledger = upstream.path().join("ledger");
    let callid = bin();
    let (code, stderr) = callid_in(
        dir.path(),
        &[
            "gateway",
            "--registry",
            "registry.sqlite3",
            "--spend",
            "no-such-tool",
            "--",
            callid.to_str().unwrap(),
            "provider",
            "--mcp",
            "--ledger",
            ledger.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "a refused start created {left:?}");
    insta::assert_snapshot!(stderr);
}

#[test]
fn an_unknown_check_id_names_the_nearest_and_the_list() {
    insta::assert_snapshot!(transcript(&[
        &["conform", "--only", "no.such-check"],
        &["conform", "--only", "approval.deny-refuse"],
    ]));
}

#[test]
fn a_missing_identity_source_preset_says_how_to_write_it() {
    let first = transcript(&[
        &["identity-sources", "--identity-sources", "goose.yaml"],
        &["probe", "--identity-sources", "sources/mine.yaml"],
    ]);
    // The command the message gives works from an empty directory, and its file loads.
    let dir = tempfile::tempdir().unwrap();
    let written = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} identity-sources --print-preset goose > goose.yaml",
            bin().display()
        ))
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(written.success());
    let (code, stderr) = callid_in(
        dir.path(),
        &["identity-sources", "--identity-sources", "goose.yaml"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    insta::assert_snapshot!(first);
}
