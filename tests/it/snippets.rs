//! The README and the book (docs/src) as a user meets them (issue #26, items 1, 2 and 4).
//!
//! - Every shell block (fence `sh`, `bash` or `shell`) of README.md and docs/src runs as written,
//!   with the built binary on `PATH` as `callid`, in an empty temporary directory that is also
//!   `HOME`: no clone of callid, no network, no API key. A block that needs more says why in its
//!   fence, after `not-run:` (```` ```sh not-run: needs a PostgreSQL server ````), and is not
//!   run. `console` and `text` blocks are transcripts and never run.
//! - Every relative link of README.md, BENCHMARKS.md, ROUTER-CONTRACT.md and docs/src resolves to
//!   a file or folder of the repository, and its `#anchor` to a heading of that file (as GitHub
//!   and mdBook name them); every page of docs/src is in the book's SUMMARY.md.
//! - No page, schema or manifest names an address nobody can verify.

use crate::common::{bin, repo};
use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one snippet may run before it is killed (with every process it started).
const SNIPPET_TIMEOUT: Duration = Duration::from_secs(120);

/// What some snippets must print, beyond exiting 0: (the start of a line of the snippet, after
/// its indentation; a text its standard output must contain). A snippet named here that no page
/// holds any more fails the test.
const EXPECTED_OUTPUT: &[(&str, &str)] = &[
    // The gateway demo: two charges for three calls, the third a replay of the first.
    (
        "} | callid gateway --registry gateway.sqlite3",
        r#""callid/replayed":true"#,
    ),
    (
        "} | callid provider --mcp --ledger ledger.sqlite3",
        r#""count":2"#,
    ),
    // The reference router's demo is held to its exit code only: under heavy load its answers can
    // be dropped when standard input closes ("timed out draining in-flight responses").
    // The conformance runner on the profile it prints.
    (
        "callid conform --target router.yaml --only",
        "2 checks: 2 pass",
    ),
    ("callid demo", "missing_identity"),
];

/// The Markdown files a reader opens: README.md, BENCHMARKS.md, ROUTER-CONTRACT.md and every page
/// of docs/src, as (path relative to the repository, text with `{{#include}}` lines expanded).
fn pages() -> Vec<(PathBuf, String)> {
    let root = repo();
    let mut paths: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "ROUTER-CONTRACT.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut book: Vec<PathBuf> = std::fs::read_dir(root.join("docs/src"))
        .expect("docs/src, the book")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    book.sort();
    paths.extend(book);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path)).unwrap();
            let dir = root.join(&path).parent().unwrap().to_path_buf();
            let expanded: String = text
                .lines()
                .map(|line| {
                    match line
                        .strip_prefix("{{#include ")
                        .and_then(|r| r.strip_suffix("}}"))
                    {
                        Some(included) => std::fs::read_to_string(dir.join(included.trim()))
                            .unwrap_or_else(|e| {
                                panic!("{}: {{{{#include {included}}}}}: {e}", path.display())
                            }),
                        None => format!("{line}\n"),
                    }
                })
                .collect();
            (path, expanded)
        })
        .collect()
}

/// A fenced code block: its info string (after the backticks), body, and 1-based line.
struct Block {
    info: String,
    body: String,
    line: usize,
}

/// Every fenced block of `text`, and the text outside them (fenced lines blanked, so line
/// numbers and links outside code stay where they were).
fn blocks(text: &str) -> (Vec<Block>, String) {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```") {
                    open = Some(Block {
                        info: info.trim().to_owned(),
                        body: String::new(),
                        line: i + 1,
                    });
                    prose.push('\n');
                } else {
                    prose.push_str(line);
                    prose.push('\n');
                }
            }
            Some(block) => {
                if line.trim_start() == "```" {
                    out.push(open.take().unwrap());
                } else {
                    block.body.push_str(line);
                    block.body.push('\n');
                }
                prose.push('\n');
            }
        }
    }
    assert!(open.is_none(), "a code fence is never closed");
    (out, prose)
}

/// The reason a shell block is not run, from `not-run: REASON` in its info string.
fn not_run_reason(info: &str) -> Option<&str> {
    info.split_once("not-run:").map(|(_, reason)| reason.trim())
}

fn is_shell(info: &str) -> bool {
    matches!(
        info.split_whitespace().next(),
        Some("sh" | "bash" | "shell")
    )
}

/// Runs `script` with bash in `dir` (also `HOME`), `callid` on `PATH`; kills its process group
/// after [`SNIPPET_TIMEOUT`]. Returns (exit code, stdout, stderr).
fn run_snippet(script: &str, dir: &Path, path_dir: &Path) -> (Option<i32>, String, String) {
    let path = format!(
        "{}:{}",
        path_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-eu", "-o", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir.join(".local/share"))
        .env("NO_COLOR", "1")
        .env_remove("CALLID_LOG")
        .env_remove("CALLID_REGISTRY")
        .env_remove("CALLID_PROVIDER_TOKEN")
        .env_remove("CALLID_DIGEST_SALT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).ok();
        s
    });
    let deadline = Instant::now() + SNIPPET_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            // SAFETY: a plain kill(2) of the process group this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the snippet left running in its group (a server started with `&`) ends with it.
    // SAFETY: as above; the group may already be gone (ESRCH), which is fine.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    (
        status.and_then(|s| s.code()),
        out.join().unwrap(),
        err.join().unwrap(),
    )
}

#[test]
fn every_shell_snippet_runs_for_an_installed_user() {
    let path_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin(), path_dir.path().join("callid")).unwrap();
    let mut expected: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (line, text) in EXPECTED_OUTPUT {
        expected.entry(line).or_default().push(text);
    }
    let mut met: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut ran = 0;
    let guides = pages()
        .into_iter()
        .filter(|(page, _)| page == Path::new("README.md") || page.starts_with("docs/src"));
    for (page, text) in guides {
        let (blocks, _) = blocks(&text);
        for block in blocks.iter().filter(|b| is_shell(&b.info)) {
            let at = format!("{}:{}", page.display(), block.line);
            assert!(
                !block.body.contains("target/debug") && !block.body.contains("$PWD"),
                "{at}: an installed user has no build tree: use `callid`\n{}",
                block.body
            );
            if let Some(reason) = not_run_reason(&block.info) {
                assert!(!reason.is_empty(), "{at}: `not-run:` must say why");
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let (code, stdout, stderr) = run_snippet(&block.body, dir.path(), path_dir.path());
            ran += 1;
            if code != Some(0) {
                failures.push(format!(
                    "{at}: exit {code:?}\n--- snippet\n{}--- stdout\n{stdout}--- stderr\n{stderr}",
                    block.body
                ));
                continue;
            }
            for line in block.body.lines() {
                let line = line.trim();
                for (&key, wants) in expected.iter().filter(|(k, _)| line.starts_with(**k)) {
                    *met.entry(key).or_default() += 1;
                    for want in wants {
                        if !stdout.contains(want) {
                            failures.push(format!(
                            "{at}: the output lacks `{want}`\n--- snippet\n{}--- stdout\n{stdout}--- stderr\n{stderr}",
                            block.body
                        ));
                        }
                    }
                }
            }
        }
    }
    for line in expected.keys() {
        assert!(
            met.contains_key(line),
            "no runnable snippet has the line `{line}` any more: update EXPECTED_OUTPUT"
        );
    }
    assert!(ran >= 5, "only {ran} snippets ran");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The anchor GitHub and mdBook give a heading: lowercase; letters, digits, `-` and `_` kept;
/// spaces to `-`; everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a page's headings (a repeated heading gets `-1`, `-2`, ... as on GitHub).
fn anchors(text: &str) -> Vec<String> {
    let (_, prose) = blocks(text);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for line in prose.lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let n = seen.entry(base.clone()).or_default();
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of every inline link `[text](target)` of `prose`, with their 1-based lines
/// (inline code spans skipped).
fn links(prose: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in prose.lines().enumerate() {
        let mut in_code = false;
        let bytes: Vec<char> = line.chars().collect();
        let mut j = 0;
        while j < bytes.len() {
            match bytes[j] {
                '`' => in_code = !in_code,
                ']' if !in_code && bytes.get(j + 1) == Some(&'(') => {
                    let rest: String = bytes[j + 2..].iter().collect();
                    if let Some(end) = rest.find(')') {
                        out.push((i + 1, rest[..end].to_owned()));
                    }
                }
                _ => {}
            }
            j += 1;
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = repo();
    let pages = pages();
    let texts: BTreeMap<PathBuf, String> = pages.iter().cloned().collect();
    let mut broken = Vec::new();
    for (page, text) in &pages {
        let (_, prose) = blocks(text);
        for (line, target) in links(&prose) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                page.clone()
            } else {
                normalize(&page.parent().unwrap().join(path))
            };
            if !root.join(&resolved).exists() {
                broken.push(format!(
                    "{}:{line}: `{target}`: no file `{}`",
                    page.display(),
                    resolved.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                let text = texts.get(&resolved).cloned().unwrap_or_else(|| {
                    std::fs::read_to_string(root.join(&resolved)).unwrap_or_default()
                });
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{}:{line}: `{target}`: `{}` has no heading `#{anchor}`",
                        page.display(),
                        resolved.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let summary = std::fs::read_to_string(repo().join("docs/src/SUMMARY.md")).unwrap();
    let (_, prose) = blocks(&summary);
    let listed: Vec<String> = links(&prose).into_iter().map(|(_, t)| t).collect();
    for (page, _) in pages() {
        let Ok(in_book) = page.strip_prefix("docs/src") else {
            continue;
        };
        let name = in_book.to_string_lossy().into_owned();
        if name == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&name),
            "docs/src/{name} is not in docs/src/SUMMARY.md: mdbook would not build it"
        );
    }
}

#[test]
fn the_readme_fits_two_screens_and_starts_with_the_two_commands() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move depth into docs/src"
    );
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let (blocks, _) = blocks(&readme);
    let first = blocks.first().expect("a first code block");
    let commands: Vec<&str> = first
        .body
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -- conform",
            "cargo test --features bench"
        ],
        "the README's first block is the main job and the tests"
    );
    for command in commands {
        assert!(
            ci.lines().any(|l| l.trim() == command),
            "CI (.ci/run) runs `{command}` as the README says"
        );
    }
}

/// No address that nobody can verify (issue #26, item 2): callid has no public home these files
/// could name, so none names one. Each schema is identified by a URN instead.
#[test]
fn no_made_up_address_in_what_a_user_reads() {
    let root = repo();
    let mut files = vec![
        PathBuf::from("Cargo.toml"),
        PathBuf::from(".github/workflows/release.yml"),
    ];
    files.extend(pages().into_iter().map(|(p, _)| p));
    for schema in std::fs::read_dir(root.join("schemas")).unwrap() {
        let path = schema.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            doc["$id"],
            format!("urn:callid:schema:{name}"),
            "{}",
            path.display()
        );
        files.push(path.strip_prefix(&root).unwrap().to_path_buf());
    }
    for file in files {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        for made_up in ["github.com/callid", "example.invalid"] {
            assert!(
                !text.contains(made_up),
                "{}: names `{made_up}`, an address nobody can verify",
                file.display()
            );
        }
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        !manifest.lines().any(|l| l.starts_with("repository")),
        "Cargo.toml names a repository: only once the project has a public address"
    );
}
