//! Integration tests of what a newcomer meets first: the client guide's configs
//! (docs/src/client.md), `--version`, shell completions, `classify -`, per-command `--format`
//! values, error messages that say their cause once, a closed standard output, the stdio servers'
//! terminal banner, and `matrix add` on a single call.

use crate::common::{bin, copy_matrix, repo};
use callid::testing::client_configs::{
    SERVER_NAME, claude_code_mcp_json, claude_mcp_add, codex_mcp_add, codex_server_toml,
};
use clap::Parser as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Output, Stdio};

/// The example paths the client guide's configs use.
const README_CALLID: &str = "/home/you/.cargo/bin/callid";
const README_LOG: &str = "/home/you/callid-probe.jsonl";
const README_URL: &str = "http://127.0.0.1:8765/mcp";

fn callid(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The stdio server command line of every client guide config (program first).
fn readme_server() -> Vec<String> {
    [README_CALLID, "probe", "--log", README_LOG]
        .map(String::from)
        .to_vec()
}

/// Every `<!-- client-config: NAME -->` block of the client guide (docs/src/client.md): name ->
/// (fence language: the first word of the fence's info string, body).
fn readme_configs() -> BTreeMap<String, (String, String)> {
    let readme = std::fs::read_to_string(repo().join("docs/src/client.md")).unwrap();
    let mut out = BTreeMap::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("<!-- client-config: ")
            .and_then(|r| r.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        let lang = fence
            .strip_prefix("```")
            .unwrap_or_else(|| panic!("`{name}`: the marker must be followed by a code fence"))
            .split_whitespace()
            .next()
            .unwrap_or_default();
        let mut body = String::new();
        for l in lines.by_ref() {
            if l == "```" {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        let previous = out.insert(name.to_owned(), (lang.to_owned(), body));
        assert!(previous.is_none(), "two client guide blocks named `{name}`");
    }
    out
}

fn json_block(configs: &BTreeMap<String, (String, String)>, name: &str) -> Value {
    let (lang, body) = &configs[name];
    assert_eq!(lang, "json", "`{name}` is fenced as {lang}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("`{name}` is not JSON: {e}\n{body}"))
}

fn toml_block(configs: &BTreeMap<String, (String, String)>, name: &str) -> toml::Table {
    let (lang, body) = &configs[name];
    assert_eq!(lang, "toml", "`{name}` is fenced as {lang}");
    body.parse()
        .unwrap_or_else(|e| panic!("`{name}` is not TOML: {e}\n{body}"))
}

fn sh_block(configs: &BTreeMap<String, (String, String)>, name: &str) -> String {
    let (lang, body) = &configs[name];
    assert_eq!(lang, "sh", "`{name}` is fenced as {lang}");
    assert_eq!(body.lines().count(), 1, "`{name}` is one command");
    body.trim_end().to_owned()
}

/// The only top-level key of a config, and its `probe` entry.
fn probe_entry<'a>(name: &str, config: &'a Value, top: &str) -> &'a Value {
    let keys: Vec<&String> = config.as_object().unwrap().keys().collect();
    assert_eq!(keys, [top], "`{name}`: top-level keys");
    let servers = config[top].as_object().unwrap();
    assert_eq!(
        servers.keys().collect::<Vec<_>>(),
        [SERVER_NAME],
        "`{name}`: server names"
    );
    &config[top][SERVER_NAME]
}

#[test]
fn readme_client_configs_parse_in_their_format_with_the_right_keys() {
    let configs = readme_configs();
    let names: Vec<&str> = configs.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "claude-code-add",
            "claude-code-add-http",
            "claude-code-mcp-json",
            "claude-code-mcp-json-http",
            "claude-desktop",
            "codex-add",
            "codex-add-http",
            "codex-config-toml",
            "codex-config-toml-http",
            "cursor",
            "cursor-http",
            "gemini",
            "gemini-http",
            "probe-http",
            "vscode",
            "vscode-http",
        ]
    );
    let server = readme_server();
    let stdio = json!({"command": server[0], "args": &server[1..]});
    let typed_stdio = json!({"type": "stdio", "command": server[0], "args": &server[1..]});

    // Clients whose config file is JSON: (block, top-level key, expected `probe` entry).
    let json_configs = [
        (
            "claude-code-mcp-json",
            "mcpServers",
            json!({"type": "stdio", "command": server[0], "args": &server[1..], "env": {}}),
        ),
        (
            "claude-code-mcp-json-http",
            "mcpServers",
            json!({"type": "http", "url": README_URL}),
        ),
        ("claude-desktop", "mcpServers", stdio.clone()),
        ("vscode", "servers", typed_stdio),
        (
            "vscode-http",
            "servers",
            json!({"type": "http", "url": README_URL}),
        ),
        ("cursor", "mcpServers", stdio.clone()),
        ("cursor-http", "mcpServers", json!({"url": README_URL})),
        ("gemini", "mcpServers", stdio),
        ("gemini-http", "mcpServers", json!({"httpUrl": README_URL})),
    ];
    for (name, top, expected) in json_configs {
        let config = json_block(&configs, name);
        assert_eq!(probe_entry(name, &config, top), &expected, "`{name}`");
    }

    for (name, expected) in [
        ("codex-config-toml", {
            let mut t = toml::Table::new();
            t.insert("command".into(), README_CALLID.into());
            t.insert(
                "args".into(),
                toml::Value::Array(server[1..].iter().map(|a| a.as_str().into()).collect()),
            );
            t
        }),
        ("codex-config-toml-http", {
            let mut t = toml::Table::new();
            t.insert("url".into(), README_URL.into());
            t
        }),
    ] {
        let config = toml_block(&configs, name);
        assert_eq!(
            config.keys().collect::<Vec<_>>(),
            ["mcp_servers"],
            "`{name}`"
        );
        let servers = config["mcp_servers"].as_table().unwrap();
        assert_eq!(
            servers.keys().collect::<Vec<_>>(),
            [SERVER_NAME],
            "`{name}`"
        );
        assert_eq!(
            servers[SERVER_NAME].as_table().unwrap(),
            &expected,
            "`{name}`"
        );
    }

    assert_eq!(
        sh_block(&configs, "claude-code-add-http"),
        format!("claude mcp add --transport http {SERVER_NAME} {README_URL}")
    );
    assert_eq!(
        sh_block(&configs, "codex-add-http"),
        format!("codex mcp add {SERVER_NAME} --url {README_URL}")
    );
}

/// The README's stdio server and HTTP probe command lines are ones `callid` accepts.
#[test]
fn readme_probe_command_lines_parse() {
    let configs = readme_configs();
    let server = readme_server();
    let mut argv = vec!["callid"];
    argv.extend(server[1..].iter().map(String::as_str));
    callid::cli::Cli::try_parse_from(&argv).unwrap();

    let http = sh_block(&configs, "probe-http");
    let words: Vec<&str> = http.split_whitespace().collect();
    assert_eq!(words[0], README_CALLID);
    let parsed = callid::cli::Cli::try_parse_from(
        std::iter::once("callid").chain(words[1..].iter().copied()),
    )
    .unwrap();
    let callid::cli::Command::Probe(probe) = parsed.command else {
        panic!("`probe-http` is not `callid probe`");
    };
    assert_eq!(
        format!("http://{}/mcp", probe.http.unwrap()),
        README_URL,
        "the HTTP configs point at the probe the README starts"
    );
}

/// The Codex and Claude Code snippets are the configs `callid measure` runs those clients with.
#[test]
fn readme_codex_and_claude_code_configs_are_the_ones_measure_uses() {
    let configs = readme_configs();
    let server = readme_server();

    let measured: toml::Table = codex_server_toml(SERVER_NAME, &server).parse().unwrap();
    assert_eq!(toml_block(&configs, "codex-config-toml"), measured);
    assert_eq!(
        sh_block(&configs, "codex-add"),
        codex_mcp_add(SERVER_NAME, &server)
    );

    assert_eq!(
        json_block(&configs, "claude-code-mcp-json"),
        claude_code_mcp_json(SERVER_NAME, &server)
    );
    assert_eq!(
        sh_block(&configs, "claude-code-add"),
        claude_mcp_add(SERVER_NAME, &server)
    );
}

/// `measure` writes Codex's config from [`codex_server_toml`]: the table in the file it writes is
/// that table plus the timeouts.
#[test]
fn measure_writes_the_shared_codex_and_claude_code_configs() {
    use callid::testing::client_configs::Client;
    let home = tempfile::tempdir().unwrap();
    let server = vec!["/bin/sh".to_owned(), "/tmp/probe wrapper.sh".to_owned()];
    Client::Codex
        .prepare(
            std::path::Path::new("/bin/true"),
            home.path(),
            "http://127.0.0.1:1",
            &server,
        )
        .unwrap();
    let written: toml::Table = std::fs::read_to_string(home.path().join("codex/config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let mut probe = written["mcp_servers"][SERVER_NAME]
        .as_table()
        .unwrap()
        .clone();
    assert!(probe.remove("startup_timeout_sec").is_some());
    assert!(probe.remove("tool_timeout_sec").is_some());
    let shared: toml::Table = codex_server_toml(SERVER_NAME, &server).parse().unwrap();
    assert_eq!(
        &probe,
        shared["mcp_servers"][SERVER_NAME].as_table().unwrap()
    );

    let home = tempfile::tempdir().unwrap();
    Client::ClaudeCode
        .prepare(
            std::path::Path::new("/bin/true"),
            home.path(),
            "http://127.0.0.1:1",
            &server,
        )
        .unwrap();
    let written: Value =
        serde_json::from_slice(&std::fs::read(home.path().join("mcp.json")).unwrap()).unwrap();
    assert_eq!(written, claude_code_mcp_json(SERVER_NAME, &server));
}

#[test]
fn completions_for_every_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef callid"),
        ("fish", "complete -c callid"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = callid(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: no `{marker}`");
        for subcommand in ["probe", "classify", "conform", "matrix", "completions"] {
            assert!(script.contains(subcommand), "{shell}: no `{subcommand}`");
        }
    }
    let out = callid(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("[possible values: bash, zsh, fish, powershell]"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = callid(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let version = text(&out.stdout);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_owned());
    match head {
        Some(head) => assert_eq!(
            version,
            format!("callid {} (commit {head})\n", env!("CARGO_PKG_VERSION"))
        ),
        None => assert_eq!(version, format!("callid {}\n", env!("CARGO_PKG_VERSION"))),
    }
    // Subcommands say the same version.
    assert_eq!(
        text(&callid(&["classify", "--version"]).stdout),
        version.replacen("callid", "callid-classify", 1)
    );
}

#[test]
fn classify_dash_reads_standard_input() {
    let log = repo().join("tests/fixtures/probe/codex-0.171.0.jsonl");
    let from_file = callid(&["classify", "--format", "json", log.to_str().unwrap()]);
    assert_eq!(from_file.status.code(), Some(0));

    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(b"not a record\n");
    let mut child = Command::new(bin())
        .args(["classify", "--format", "json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let from_stdin = child.wait_with_output().unwrap();
    assert_eq!(from_stdin.status.code(), Some(0));
    assert_eq!(text(&from_stdin.stdout), text(&from_file.stdout));
    let lines = bytes.iter().filter(|b| **b == b'\n').count();
    assert_eq!(
        text(&from_stdin.stderr),
        format!("warning: skipped <stdin>:{lines}: not JSON (column 2)\n")
    );

    let out = Command::new(bin())
        .args(["classify", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: no probe records in `<stdin>`; pass the file written by `callid probe --log FILE`\n"
    );
}

/// `--format` offers what each command renders: clap refuses `junit` where there is no JUnit
/// renderer, and the help lists only the real formats.
#[test]
fn format_lists_only_the_formats_each_command_has() {
    let mut commands = vec![&["classify", "x.jsonl"][..], &["demo"][..]];
    if cfg!(feature = "bench") {
        commands.push(&["bench", "--quick"][..]);
    }
    for args in commands {
        let mut argv = args.to_vec();
        argv.extend(["--format", "junit"]);
        let out = callid(&argv);
        assert_eq!(out.status.code(), Some(2), "{argv:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with("error: invalid value 'junit' for '--format <FORMAT>'")
                && stderr.contains("[possible values: table, markdown, json]"),
            "{argv:?}: {stderr}"
        );
        let help = text(&callid(&[args[0], "--help"]).stdout);
        assert!(
            help.contains("Possible values:") && !help.contains("junit"),
            "{}: {help}",
            args[0]
        );
    }
    let help = text(&callid(&["conform", "--help"]).stdout);
    assert!(
        help.contains("- junit:    JUnit XML for CI systems"),
        "{help}"
    );
}

/// An error that wraps an OS error says it once (it used to read `...(os error 2): ...(os error
/// 2)`), with one `error:` line and exit 2.
#[test]
fn a_missing_file_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let missing = missing.to_str().unwrap();
    // A key pool under a plain file: its directory can be neither found nor created.
    let plain_file = dir.path().join("plain-file");
    std::fs::write(&plain_file, "").unwrap();
    let keys = plain_file.join("keys.sqlite3");
    let keys = keys.to_str().unwrap();
    let mut transcript = String::new();
    for args in [
        vec!["classify", missing],
        vec!["router", "--registry", missing, "--policy", missing],
        vec!["conform", "--target", missing],
        vec!["conform", "--scenarios", missing],
        vec!["matrix", "render", "--dir", missing],
        vec!["router", "keys", keys, "--count", "1"],
    ] {
        let out = callid(&args);
        let stderr = text(&out.stderr)
            .replace(missing, "[MISSING]")
            .replace(keys, "[PLAIN-FILE]/keys.sqlite3");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for cause in [
            "No such file or directory",
            "os error",
            "unable to open database file",
        ] {
            assert!(
                stderr.matches(cause).count() <= 1,
                "{args:?} says `{cause}` twice: {stderr}"
            );
        }
        assert_eq!(stderr.matches("error:").count(), 1, "{args:?}: {stderr}");
        transcript.push_str(&format!(
            "$ callid {}\n{stderr}",
            args.join(" ")
                .replace(missing, "[MISSING]")
                .replace(keys, "[PLAIN-FILE]/keys.sqlite3")
        ));
    }
    insta::assert_snapshot!(transcript);
}

/// A reader that goes away (`callid conform ... | head -1`) stops the output but not the exit
/// code: a failing check still exits 1, a passing run 0, and nothing is said about the pipe.
#[test]
fn a_closed_stdout_keeps_the_exit_code_of_the_checks() {
    let router = repo().join("tests/fixtures/broken_routers/router.py");
    for (flaw, code) in [(Some("ignore-hash"), 1), (None, 0)] {
        let mut stdio = format!("python3 '{}'", router.display());
        if let Some(flaw) = flaw {
            stdio.push_str(&format!(" --flaw {flaw}"));
        }
        let args = [
            "conform",
            "--stdio",
            &stdio,
            "--only",
            "call-id.reused-other-arguments",
        ];
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(bin())
            .args(args)
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{flaw:?}: {stderr}");
        assert!(!stderr.contains("error"), "{flaw:?}: {stderr}");

        let full = callid(&args);
        assert_eq!(full.status.code(), Some(code), "{flaw:?} with a reader");
    }
}

/// Runs `args` with a pseudo-terminal as standard input, ends that input with Ctrl-D, and returns
/// what the process wrote to stderr.
fn stderr_with_terminal_stdin(args: &[&str]) -> String {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let (mut master, slave) = unsafe {
        let (mut master, mut slave) = (-1, -1);
        let rc = libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        (
            std::fs::File::from(OwnedFd::from_raw_fd(master)),
            OwnedFd::from_raw_fd(slave),
        )
    };
    let child = Command::new(bin())
        .args(args)
        .stdin(Stdio::from(slave))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ctrl-D at the start of a line: end of input for the reader of the terminal.
    master.write_all(&[4]).unwrap();
    let out = child.wait_with_output().unwrap();
    drop(master);
    text(&out.stderr)
}

/// Started from a terminal, a stdio server says in one line, first, that it waits for an MCP
/// client and where its records or registry are; started by a client (stdin not a terminal), it
/// says nothing of the kind.
#[test]
fn stdio_servers_say_they_wait_only_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("probe.jsonl");
    let registry = dir.path().join("registry.sqlite3");
    for (args, state) in [
        (
            vec!["probe", "--log", log.to_str().unwrap()],
            format!("shape records go to `{}`", log.display()),
        ),
        (
            vec!["router", "--registry", registry.to_str().unwrap()],
            format!("registry `{}`", registry.display()),
        ),
    ] {
        let program = format!("callid {}", args[0]);
        let stderr = stderr_with_terminal_stdin(&args);
        let banner = format!(
            "{program}: waiting for an MCP client on stdin (this is an MCP server: start it from a \
             client's config, or type JSON-RPC lines); {state}; Ctrl-D ends it"
        );
        assert_eq!(stderr.lines().next(), Some(banner.as_str()), "{stderr}");
        assert_eq!(stderr.matches("waiting for an MCP client").count(), 1);

        let out = callid(&args);
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains("waiting for an MCP client"),
            "{args:?} without a terminal: {stderr}"
        );
    }
}

/// `matrix add` on a log with one call writes a row whose key split is unknown, and the matrix
/// says `unknown` where `classify` says `unknown` for the same log.
#[test]
fn matrix_add_on_one_call_agrees_with_classify() {
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("matrix");
    copy_matrix(&repo().join("tests/fixtures/matrix"), &matrix);
    // The Claude Code fixture, cut after its first `tools/call`.
    let full =
        std::fs::read_to_string(repo().join("tests/fixtures/probe/claude-code-2.1.332.jsonl"))
            .unwrap();
    let mut one_call = String::new();
    for line in full.lines() {
        one_call.push_str(line);
        one_call.push('\n');
        if line.contains(r#""method":"tools/call""#) {
            break;
        }
    }
    assert_eq!(one_call.matches(r#""method":"tools/call""#).count(), 1);
    let log = dir.path().join("one-call.jsonl");
    std::fs::write(&log, one_call).unwrap();

    let classify = callid(&["classify", "--format", "json", log.to_str().unwrap()]);
    assert_eq!(classify.status.code(), Some(0));
    let verdicts: Value = serde_json::from_slice(&classify.stdout).unwrap();
    let verdicts = verdicts
        .get("clients")
        .unwrap_or(&verdicts)
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(verdicts[0]["key_split"], "unknown", "{verdicts:?}");
    let table = text(&callid(&["classify", log.to_str().unwrap()]).stdout);
    assert!(table.contains("unknown"), "{table}");

    let out = callid(&[
        "matrix",
        "add",
        log.to_str().unwrap(),
        "--dir",
        matrix.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let clients: Value = serde_yaml::from_str::<Value>(
        &std::fs::read_to_string(matrix.join("clients.yaml")).unwrap(),
    )
    .unwrap();
    let row = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "claude-code-2.1.332")
        .unwrap_or_else(|| panic!("no new row in {clients:#}"));
    assert_eq!(row.get("call_level_keys"), None, "{row:#}");
    assert_eq!(row.get("context_keys"), None, "{row:#}");

    let out = callid(&["matrix", "render", "--dir", matrix.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let support = std::fs::read_to_string(matrix.join("SUPPORT.md")).unwrap();
    let line = support
        .lines()
        .find(|l| l.starts_with("| claude-code | MCP client (probe log) |"))
        .unwrap_or_else(|| panic!("no row in {support}"));
    assert!(line.contains("| unknown | unknown |"), "{line}");
    assert!(!line.contains("| none | none |"), "{line}");
    let out = callid(&[
        "matrix",
        "render",
        "--check",
        "--dir",
        matrix.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// The approval hint a spend returns names the router's registry, so the operator can run it as
/// given; running it approves the operation.
#[test]
fn the_approval_hint_is_a_command_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite3");
    let lines = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "sh", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "generate_image", "arguments": {"prompt": "an origami fox"},
            "_meta": {"callId": "call_approval_hint"}}}),
    ];
    let mut child = Command::new(bin())
        .args(["router", "--approval-above-cents", "1", "--registry"])
        .arg(&registry)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in &lines {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let reply: Value = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["id"] == 1)
        .unwrap_or_else(|| panic!("no reply: {}", text(&out.stderr)));
    let message = reply["result"]["content"][0]["text"].as_str().unwrap();
    let hint = message
        .split('`')
        .find(|part| part.starts_with("callid router approve "))
        .unwrap_or_else(|| panic!("no approval command in {message}"));
    let words: Vec<&str> = hint.split_whitespace().collect();
    assert_eq!(
        words[words.len() - 2..],
        ["--registry", registry.to_str().unwrap()],
        "{hint}"
    );
    let approve = callid(&words[1..]);
    assert_eq!(approve.status.code(), Some(0), "{}", text(&approve.stderr));
    let handle = words[3];
    let status = callid(&[
        "router",
        "status",
        handle,
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    assert!(
        !text(&status.stdout).contains("awaiting_approval"),
        "{}",
        text(&status.stdout)
    );
}

/// What `cargo install` and `cargo package` ship: what the binary needs to build and run (its
/// sources, the scenarios it embeds and reads, the script `bench` embeds), the licences and the
/// README; no tests, fixtures, matrices data or client installs.
#[test]
fn the_package_holds_what_the_binary_needs_and_nothing_else() {
    let out = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "--offline"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let files = text(&out.stdout);
    let files: Vec<&str> = files.lines().collect();
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "build.rs",
        "src/main.rs",
        "src/lib.rs",
        "scenarios/targets/reference.yaml",
        "scenarios/identity-missing.yaml",
        "identity-sources/goose.yaml",
        "benches/python_probe.py",
    ] {
        assert!(
            files.contains(&needed),
            "`{needed}` is not packaged: {files:?}"
        );
    }
    for file in &files {
        let allowed = [
            "src/",
            "scenarios/",
            "identity-sources/",
            "benches/python_probe.py",
        ]
        .iter()
        .any(|p| file.starts_with(p))
            || !file.contains('/');
        assert!(
            allowed,
            "`{file}` is packaged but the binary does not need it"
        );
        assert!(!file.contains("node_modules"), "`{file}`");
    }
    // Every Rust source under src/ is packaged (a new module must not be left out).
    let mut sources = Vec::new();
    let mut dirs = vec![repo().join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path.strip_prefix(repo()).unwrap().display().to_string());
            }
        }
    }
    for source in sources {
        assert!(
            files.contains(&source.as_str()),
            "`{source}` is not packaged"
        );
    }
}

/// The JSON Schemas in `schemas/`, compiled by a real validator (boon).
struct Schemas {
    schemas: boon::Schemas,
    index: BTreeMap<&'static str, boon::SchemaIndex>,
}

impl Schemas {
    fn load() -> Schemas {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let mut index = BTreeMap::new();
        for name in ["probe-record", "classify", "conform", "bench"] {
            let path = repo().join(format!("schemas/{name}.json"));
            let i = compiler
                .compile(path.to_str().unwrap(), &mut schemas)
                .unwrap_or_else(|e| panic!("schemas/{name}.json: {e:#}"));
            index.insert(name, i);
        }
        Schemas { schemas, index }
    }

    fn check(&self, name: &str, what: &str, value: &Value) {
        if let Err(e) = self.schemas.validate(value, self.index[name]) {
            panic!("{what} does not match schemas/{name}.json: {e:#}");
        }
    }

    fn is_valid(&self, name: &str, value: &Value) -> bool {
        self.schemas.validate(value, self.index[name]).is_ok()
    }
}

fn json_stdout(args: &[&str]) -> Value {
    let out = callid(args);
    assert!(
        out.status.code().is_some_and(|c| c < 2),
        "{args:?}: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON: {e}: {}", text(&out.stdout)))
}

/// Every JSON output carries `version` and matches its schema in `schemas/`: probe records (the
/// committed fixtures and evidence, and a fresh log with malformed input), `classify`, `conform`
/// (passing and failing checks) and `bench`.
#[test]
fn json_outputs_match_their_schemas() {
    let schemas = Schemas::load();
    let dir = tempfile::tempdir().unwrap();

    let log = dir.path().join("fresh.jsonl");
    let mut child = Command::new(bin())
        .args(["probe", "--log", log.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "schema-client", "version": "1"}}})
        .to_string(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "capabilities", "arguments": {},
            "_meta": {"callId": "call_schema", "nested": {"a": [1, 2]}}}})
        .to_string(),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "capabilities", "arguments": {}, "_meta": "not an object"}})
        .to_string(),
        "{not json".to_owned(),
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let mut logs = vec![log.clone()];
    for folder in ["tests/fixtures/probe", "matrices/evidence"] {
        for entry in std::fs::read_dir(repo().join(folder)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                logs.push(path);
            }
        }
    }
    let mut kinds = std::collections::BTreeSet::new();
    for path in &logs {
        for (n, line) in std::fs::read_to_string(path).unwrap().lines().enumerate() {
            let record: Value = serde_json::from_str(line).unwrap();
            kinds.insert(record["kind"].as_str().unwrap_or_default().to_owned());
            schemas.check(
                "probe-record",
                &format!("{}:{}", path.display(), n + 1),
                &record,
            );
        }
    }
    assert!(
        kinds.contains("malformed") && kinds.contains("request"),
        "{kinds:?}"
    );

    let mut args = vec!["classify", "--format", "json"];
    args.extend(logs.iter().map(|p| p.to_str().unwrap()));
    let verdicts = json_stdout(&args);
    schemas.check("classify", "classify", &verdicts);
    assert!(
        verdicts
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["version"] == 1)
    );

    let broken = format!(
        "python3 '{}' --flaw ignore-hash",
        repo()
            .join("tests/fixtures/broken_routers/router.py")
            .display()
    );
    let failing = json_stdout(&[
        "conform",
        "--stdio",
        &broken,
        "--only",
        "call-id.reused-other-arguments",
        "status.public-handle",
        "--format",
        "json",
    ]);
    schemas.check("conform", "conform (failing)", &failing);
    assert_eq!(failing["version"], 1);
    assert_eq!(failing["success"], false);
    let passing = json_stdout(&[
        "conform",
        "--only",
        "status.public-handle",
        "--format",
        "json",
    ]);
    schemas.check("conform", "conform (passing)", &passing);

    #[cfg(feature = "bench")]
    let bench = json_stdout(&[
        "bench",
        "--quick",
        "--only",
        "request_hash",
        "shape_extraction",
        "--format",
        "json",
    ]);
    #[cfg(feature = "bench")]
    {
        schemas.check("bench", "bench", &bench);
        assert_eq!(bench["version"], 1);
        let mut bad = bench.clone();
        bad["rows"][0]["verdict"] = json!("great");
        assert!(!schemas.is_valid("bench", &bad));
    }
    // Every verdict and every kind of target, as the report's own snapshot renders them (a row
    // of each: met, missed, reported, skipped, error), matches the schema too.
    let snapshot = std::fs::read_to_string(
        repo().join("src/bench/snapshots/callid__bench__report__tests__json.snap"),
    )
    .unwrap();
    let every_verdict: Value = serde_json::from_str(
        snapshot
            .splitn(3, "---\n")
            .nth(2)
            .expect("an insta snapshot: a header between two `---` lines, then the JSON"),
    )
    .unwrap();
    let verdicts_seen: std::collections::BTreeSet<&str> = every_verdict["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(
        verdicts_seen,
        ["error", "met", "missed", "reported", "skipped"].into()
    );
    schemas.check("bench", "the report's JSON snapshot", &every_verdict);

    // The schemas have teeth: a missing `version`, an unknown field or a wrong enum value fails.
    let mut no_version = verdicts.clone();
    no_version[0].as_object_mut().unwrap().remove("version");
    assert!(!schemas.is_valid("classify", &no_version));
    let mut extra = failing.clone();
    extra["surprise"] = json!(true);
    assert!(!schemas.is_valid("conform", &extra));
    let mut bad_record: Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    bad_record["meta"] = json!({"status": "absent", "value": "leaked"});
    assert!(!schemas.is_valid("probe-record", &bad_record));
}

/// `callid bench` is developer tooling: the default build (what `cargo install` ships) has no
/// such command; `--features bench` builds it.
#[cfg(not(feature = "bench"))]
#[test]
fn bench_is_not_in_the_default_build() {
    let out = callid(&["bench", "--quick"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("unrecognized subcommand 'bench'"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&callid(&["--help"]).stdout).contains("bench"));
}

/// A `--registry` that is a URL is never taken as a file name (issue #22, defect 2): a
/// `postgres` scheme in any letter case, with white space around it, is a database; any other
/// `SCHEME://` is refused, naming the forms callid accepts. Either way the command exits 2,
/// creates nothing in its working directory and never shows the password.
#[test]
fn a_registry_url_is_never_a_file_name_and_its_password_never_shows() {
    let elsewhere = tempfile::tempdir().unwrap();
    let callid = bin().to_str().unwrap().to_string();
    let mut transcript = String::new();
    for (i, (registry, refused)) in [
        ("Postgres://u:secret@127.0.0.1:1/db", false),
        (" POSTGRESQL://u:secret@127.0.0.1:1/db ", false),
        ("mysql://u:secret@127.0.0.1:1/db", true),
        (" Sqlite:///u:secret.sqlite3", true),
    ]
    .into_iter()
    .enumerate()
    {
        let ledger = elsewhere.path().join(format!("ledger-{i}.sqlite3"));
        let ledger = ledger.to_str().unwrap();
        for args in [
            vec!["router", "--registry", registry],
            vec!["router", "status", "h", "--registry", registry],
            vec![
                "gateway",
                "--registry",
                registry,
                "--spend",
                "generate_image",
                "--",
                &callid,
                "provider",
                "--mcp",
                "--ledger",
                ledger,
            ],
        ] {
            let cwd = tempfile::tempdir().unwrap();
            let out = Command::new(bin())
                .args(&args)
                .current_dir(cwd.path())
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(!stdout.contains("secret"), "{args:?}: {stdout}");
            assert!(!stderr.contains("secret"), "{args:?}: {stderr}");
            let created: Vec<_> = std::fs::read_dir(cwd.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert!(created.is_empty(), "{args:?} created {created:?}");
            let shown: Vec<String> = args[..args.len().min(6)]
                .iter()
                .map(|a| match a.contains(' ') {
                    true => format!("'{a}'"),
                    false => a.to_string(),
                })
                .collect();
            transcript.push_str(&format!("$ callid {}\n", shown.join(" ")));
            for line in stderr.lines() {
                let line = line
                    .replace(&callid, "[CALLID]")
                    .replace(ledger, "[LEDGER]");
                let line = match line.split_once(' ') {
                    Some((time, rest)) if time.starts_with("20") && time.ends_with('Z') => {
                        format!("[TIME] {rest}")
                    }
                    _ => line,
                };
                transcript.push_str(&format!("{line}\n"));
            }
        }
        if refused {
            let started = std::path::Path::new(ledger).exists();
            assert!(
                !started,
                "{registry:?} is refused before the upstream starts"
            );
        }
    }
    insta::assert_snapshot!(transcript);
}

/// A key given twice in one mapping of any YAML file callid reads is refused through that file's
/// own loader, naming the key, where it is and both lines (issue #22, defect 10). Each file is a
/// shipped one with one key repeated; a map (`tools:`, `env:`, `meta:`) used to keep the last
/// entry silently (a payment tool's `approval: true` and price dropped).
#[test]
fn every_yaml_reader_refuses_a_key_given_twice_naming_both_lines() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let shipped = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let edit = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    };
    std::fs::write(
        at("gateway-policy.yaml"),
        "approval_above_cents: 10\ntools:\n  send_payment:\n    price_pointer: /amount_cents\n    \
         approval: true\n  generate_image:\n    price_cents: 3\n  send_payment:\n    \
         price_cents: 1\n",
    )
    .unwrap();
    std::fs::write(
        at("router-policy.yaml"),
        "budget_cents: 500\napproval_above_cents: 10\nbudget_cents: 50000\n",
    )
    .unwrap();
    let profile = edit(
        shipped("scenarios/targets/gateway.yaml"),
        "env: {}\n",
        "env:\n  RUST_LOG: debug\n  RUST_LOG: trace\n",
    );
    std::fs::write(at("profile.yaml"), profile).unwrap();
    let goose = edit(
        shipped("identity-sources/goose.yaml"),
        "    platform: goose\n",
        "    platform: goose\n    platform: gooose\n",
    );
    std::fs::write(at("goose.yaml"), goose).unwrap();
    std::fs::create_dir(at("scenarios")).unwrap();
    let scenario = edit(
        shipped("scenarios/approval-deny.yaml"),
        "    meta: {callId: \"{call:big}\"}\n",
        "    meta:\n      callId: \"{call:big}\"\n      callId: \"{call:other}\"\n",
    );
    std::fs::write(at("scenarios/approval-deny.yaml"), scenario).unwrap();
    std::fs::create_dir(at("matrices")).unwrap();
    let clients = edit(
        shipped("matrices/clients.yaml"),
        "  surface: desktop app\n",
        "  surface: desktop app\n  surface: phone app\n",
    );
    std::fs::write(at("matrices/clients.yaml"), clients).unwrap();
    std::fs::write(
        at("matrices/routers.yaml"),
        shipped("matrices/routers.yaml"),
    )
    .unwrap();

    let registry = at("registry.sqlite3");
    let mut transcript = String::new();
    for args in [
        vec![
            "gateway",
            "--registry",
            &registry,
            "--policy",
            &at("gateway-policy.yaml"),
            "--",
            "true",
        ],
        vec![
            "router",
            "--registry",
            &registry,
            "--policy",
            &at("router-policy.yaml"),
        ],
        vec!["conform", "--target", &at("profile.yaml")],
        vec!["conform", "--list", "--scenarios", &at("scenarios")],
        vec!["identity-sources", "--identity-sources", &at("goose.yaml")],
        vec!["matrix", "render", "--dir", &at("matrices")],
    ] {
        let out = callid(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("duplicate key `"), "{args:?}: {stderr}");
        let dir = dir.path().to_str().unwrap();
        transcript
            .push_str(&format!("$ callid {}\n{stderr}", args.join(" ")).replace(dir, "[DIR]"));
    }
    assert!(
        !std::path::Path::new(&registry).exists(),
        "refused before the registry opened"
    );
    insta::assert_snapshot!(transcript);
}
