//! Every string literal the binary can print reads as one line of prose: no line break or
//! indentation crept in from a broken `\` continuation (issue #22, defect 4: a
//! `budget_exceeded` message held two runs of 26 spaces).
//!
//! Read from the source text of every `.rs` file under `src/` ([`rust_source`]). A normal
//! (non-raw) string literal is refused when it
//! - spans a line break of the source that no `\` continuation ends: the break and the next
//!   line's indentation enter the text;
//! - holds a run of three or more spaces after a line break (`\n` or a source one): indentation;
//! - holds a run of three or more spaces after other text on its line: what is left of a broken
//!   continuation whose line break went missing.
//!
//! What is not judged, and how it is told apart:
//! - raw literals (`r"…"`, `r#"…"#`): written raw to mean their line breaks;
//! - SQL: a literal whose text starts with an upper-case SQL statement word ([`SQL`]); messages
//!   are lower-case fragments, so none starts that way, and SQL's layout is never printed;
//! - `#[cfg(test)] mod … { … }` blocks: test fixtures, not part of the binary;
//! - comments, `--help` text included (clap re-wraps doc comments);
//! - a run of spaces that starts a literal (`"      <testcase"`): indentation by intent, which a
//!   broken continuation cannot produce.
//!
//! A literal meant that way anyway is listed in [`ALIGNED`] with its reason; the list is strict
//! both ways (an entry that no longer matches fails as stale).

use crate::common::rust_source::{Piece, rust_files, scan};
use std::path::Path;

/// The words an SQL literal starts with.
const SQL: &[&str] = &[
    "ALTER", "BEGIN", "CREATE", "DELETE", "DROP", "INSERT", "PRAGMA", "SELECT", "SET", "UPDATE",
    "WITH",
];

/// Literals whose runs of spaces are meant: (file under `src/`, a part of the literal's text, why).
const ALIGNED: &[(&str, &str, &str)] = &[(
    "identity/sources.rs",
    "\n  value:    {value}\n  origin:   {}\n",
    "`callid identity-sources` aligns the values of each source's fields in one column",
)];

#[test]
fn no_message_holds_a_line_break_or_a_run_of_spaces_from_a_broken_continuation() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(files.len() > 50, "too few files read: {}", files.len());
    let mut found = Vec::new();
    let mut allowed = vec![false; ALIGNED.len()];
    for file in files {
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, value, problem) in flawed_literals(&text) {
            let listed = ALIGNED
                .iter()
                .position(|(f, part, _)| *f == rel && value.contains(part));
            match listed {
                Some(k) => allowed[k] = true,
                None => found.push(format!("src/{rel}:{line}: {problem}: {value:?}")),
            }
        }
    }
    let stale: Vec<_> = ALIGNED
        .iter()
        .zip(&allowed)
        .filter(|(_, used)| !**used)
        .map(|((f, part, _), _)| format!("src/{f}: {part:?}"))
        .collect();
    assert!(
        found.is_empty(),
        "string literals that print a line break or a run of spaces (end each line with `\\`; \
         use a raw literal if the layout is meant):\n{}",
        found.join("\n")
    );
    assert!(
        stale.is_empty(),
        "`ALIGNED` entries that match no literal any more (remove them):\n{}",
        stale.join("\n")
    );
}

/// The literal of the first `budget_exceeded` fix (4fe2914) as it was before it, and the forms
/// each rule catches or lets through.
#[test]
fn the_rules_catch_the_broken_continuation_and_only_it() {
    let before_4fe2914 = r#"
                    format!(
                        "this spend costs {amount} cents but only {} of the {budget}-cent budget                          remain; nothing was recorded or dispatched: ask the operator to raise                          the budget",
                        budget.saturating_sub(committed_cents)
                    ),
"#;
    let flawed = |text: &str| -> Vec<(usize, &'static str)> {
        flawed_literals(text)
            .into_iter()
            .map(|(line, _, problem)| (line, problem))
            .collect()
    };
    assert_eq!(flawed(before_4fe2914), [(3, INLINE_RUN)]);
    let broken = "let m = \"only {} of the budget\n                 remain\";\n";
    assert_eq!(flawed(broken), [(1, LINE_BREAK)]);
    assert_eq!(flawed("let m = \"items:\\n    - a\";"), [(1, INDENTED)]);
    let fine = r#####"
let m = "only {} of the budget \
         remain";
let t = "a\n  b: {x}\n";
let r = r#"two
lines"#;
let q = "SELECT a,
       b   FROM t";
let i = "      <testcase>";
let c = '"'; let l: &'static str = "x"; // "not   a literal"
#[cfg(test)]
mod tests {
    const Y: &str = "key: k
    platform:    p";
}
let after = "still   checked";
"#####;
    assert_eq!(flawed(fine), [(16, INLINE_RUN)]);
}

const LINE_BREAK: &str = "a line break without a `\\` continuation";
const INDENTED: &str = "a run of spaces after a line break";
const INLINE_RUN: &str = "a run of spaces inside a line";

/// The literals of `source` the module doc's rules refuse: line, text as printed, problem.
fn flawed_literals(source: &str) -> Vec<(usize, String, &'static str)> {
    let mut out = Vec::new();
    // Code since the last `;`, `{` or `}`: the head of the item a `{` opens.
    let mut head = String::new();
    let mut depth = 0usize;
    let mut skip_to: Option<usize> = None;
    for piece in scan(source) {
        match piece {
            Piece::Code('{') => {
                if skip_to.is_none() && is_test_module(&head) {
                    skip_to = Some(depth);
                }
                depth += 1;
                head.clear();
            }
            Piece::Code('}') => {
                depth = depth.saturating_sub(1);
                if skip_to == Some(depth) {
                    skip_to = None;
                }
                head.clear();
            }
            Piece::Code(';') => head.clear(),
            Piece::Code(c) => head.push(c),
            Piece::Str(lit) if !lit.raw && skip_to.is_none() => {
                let (text, broke) = printed(&lit.body);
                if let Some(problem) = problem(&text, broke) {
                    out.push((lit.line, text, problem));
                }
            }
            Piece::Str(_) | Piece::Char | Piece::Comment { .. } => {}
        }
    }
    out
}

/// Whether an item head (`#[cfg(test)] mod tests `) opens a test-only module.
fn is_test_module(head: &str) -> bool {
    let words: Vec<&str> = head.split_whitespace().collect();
    words.contains(&"#[cfg(test)]") && words.iter().rev().nth(1) == Some(&"mod")
}

/// A normal literal's text as the program sees it (escapes resolved, each `\` continuation
/// removed with the white space after it), and whether a source line break is left in it.
fn printed(body: &str) -> (String, bool) {
    let mut out = String::new();
    let mut broke = false;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | Some('\r') => while chars.next_if(|c| c.is_whitespace()).is_some() {},
                Some('n') => out.push('\n'),
                Some('u') => {
                    for c in chars.by_ref() {
                        if c == '}' {
                            break;
                        }
                    }
                    out.push('?');
                }
                Some('x') => {
                    chars.next();
                    chars.next();
                    out.push('?');
                }
                _ => out.push('?'),
            },
            '\n' => {
                broke = true;
                out.push('\n');
            }
            c => out.push(c),
        }
    }
    (out, broke)
}

/// What the module doc's rules say of a literal's `text`: `None` if it is fine.
fn problem(text: &str, broke: bool) -> Option<&'static str> {
    let first_word = text.split_whitespace().next().unwrap_or("");
    if SQL.contains(&first_word) {
        return None;
    }
    if broke {
        return Some(LINE_BREAK);
    }
    for (k, line) in text.split('\n').enumerate() {
        let lead = line.len() - line.trim_start_matches(' ').len();
        if k > 0 && lead >= 3 {
            return Some(INDENTED);
        }
        if line[lead..].contains("   ") {
            return Some(INLINE_RUN);
        }
    }
    None
}
