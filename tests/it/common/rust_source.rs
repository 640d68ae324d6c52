//! A lexer of Rust source just deep enough for the tests that read `src/`: it tells code from
//! comments, character literals and string literals (raw or not), so a test looks at only the
//! part it judges. [`rust_files`] lists them; [`scan`] splits a file into [`Piece`]s;
//! [`code_only`] keeps the code.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, in sorted order.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable directory")
        .map(|e| e.expect("readable entry").path())
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// A piece of a Rust source file, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// One character of code (white space and line breaks included).
    Code(char),
    /// A `//` comment, up to its line break (which is code), or a `/* */` one (they nest).
    Comment {
        /// `/* */`.
        block: bool,
    },
    /// A character literal (`'x'`, `'\''`, `'\u{1F600}'`); a lifetime is code.
    Char,
    /// A string literal: `"…"` (a `b` or `c` prefix stays code) or raw (`r#"…"#`, `br"…"`).
    Str(Literal),
}

/// A string literal as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Literal {
    /// The line (1-based) of its opening quote.
    pub line: usize,
    /// `r"…"`, `br#"…"#`: its backslashes and line breaks are meant literally.
    pub raw: bool,
    /// The text between the quotes, escapes and line breaks as written.
    pub body: String,
}

/// `source` split into pieces.
pub fn scan(source: &str) -> Vec<Piece> {
    let s: Vec<char> = source.chars().collect();
    let at = |i: usize, text: &str| {
        text.chars()
            .enumerate()
            .all(|(k, c)| s.get(i + k) == Some(&c))
    };
    let (mut line, mut counted) = (1, 0);
    let mut line_of = |i: usize| {
        line += s[counted..i].iter().filter(|&&c| c == '\n').count();
        counted = i;
        line
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let prev_is_word = i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_');
        if at(i, "//") {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
            out.push(Piece::Comment { block: false });
        } else if at(i, "/*") {
            let mut depth = 0;
            while i < s.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(Piece::Comment { block: true });
        } else if !prev_is_word && (at(i, "r\"") || at(i, "r#") || at(i, "br\"") || at(i, "br#")) {
            let mut j = i + if s[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while s.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if s.get(j) != Some(&'"') {
                // `r#ident`, a raw identifier.
                out.push(Piece::Code(s[i]));
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            j += 1;
            let start = j;
            while j < s.len() && !at(j, &close) {
                j += 1;
            }
            out.push(Piece::Str(Literal {
                line: line_of(i),
                raw: true,
                body: s[start..j.min(s.len())].iter().collect(),
            }));
            i = j + close.len();
        } else if s[i] == '"' {
            let start = i + 1;
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            out.push(Piece::Str(Literal {
                line: line_of(start - 1),
                raw: false,
                body: s[start..i.min(s.len())].iter().collect(),
            }));
            i += 1;
        } else if s[i] == '\'' {
            // A character literal ('x', '\n', '\'', '\u{1F600}'); a lifetime has no closing quote.
            let end = if s.get(i + 1) == Some(&'\\') {
                (i + 2..s.len().min(i + 12)).find(|&k| s[k] == '\'' && k > i + 2)
            } else {
                (s.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match end {
                Some(end) => {
                    out.push(Piece::Char);
                    i = end + 1;
                }
                None => {
                    out.push(Piece::Code('\''));
                    i += 1;
                }
            }
        } else {
            out.push(Piece::Code(s[i]));
            i += 1;
        }
    }
    out
}

/// `source` with comments, string literals and character literals blanked out (a `/* */`
/// comment becomes a space, a string `""`, a character `' '`).
pub fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for piece in scan(source) {
        match piece {
            Piece::Code(c) => out.push(c),
            Piece::Comment { block: false } => {}
            Piece::Comment { block: true } => out.push(' '),
            Piece::Char => out.push_str("' '"),
            Piece::Str(_) => out.push_str("\"\""),
        }
    }
    out
}
