//! Reading probe logs back: the inverse of [`super::record::ShapeLog`].
//!
//! [`read_logs`] turns log files (or standard input, [`STDIN_PATH`]) into [`Record`]s; it is what
//! `callid classify`, `callid demo` and the matrix tools read logs with.
//!
//! # Guarantees
//! - A line that is not a record is skipped and reported as a [`BadLine`] with its file and
//!   1-based line number; the reason never quotes the line (it may hold anything).
//! - A record whose `version` is newer than [`RECORD_VERSION`] is skipped with a reason that says
//!   to upgrade; unknown fields are ignored (see [`super::record`]'s compatibility rules).
//! - Blank lines are ignored. Reading fails only when a file cannot be read
//!   ([`ReadError::Read`]) or no file holds a record ([`ReadError::NoRecords`]).

use super::record::{RECORD_VERSION, Record};
use std::path::{Path, PathBuf};

/// A line of a log that is not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// The file.
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// Why it was skipped.
    pub reason: String,
}

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.reason)
    }
}

/// Why probe logs could not be read (`callid classify` reports it as is).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A log could not be read.
    #[error("failed to read the probe log `{path}`")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Not one record in any log.
    #[error(
        "no probe records in {}; pass the file written by `callid probe --log FILE`",
        .paths.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ")
    )]
    NoRecords {
        /// The files.
        paths: Vec<PathBuf>,
    },
}

impl ReadError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ReadError::Read { .. } => "unreadable_log",
            ReadError::NoRecords { .. } => "no_records",
        }
    }
}

/// The path argument that means standard input (`callid classify -`).
pub const STDIN_PATH: &str = "-";
/// How standard input is named in warnings and errors (`<stdin>:3: not JSON`).
pub const STDIN_NAME: &str = "<stdin>";

/// `path` as warnings and errors name it: [`STDIN_NAME`] for [`STDIN_PATH`].
pub fn shown_path(path: &Path) -> PathBuf {
    match path.as_os_str() == STDIN_PATH {
        true => PathBuf::from(STDIN_NAME),
        false => path.to_path_buf(),
    }
}

/// Reads probe logs: every record, and every line that is not one (skipped, with its place).
/// A path of [`STDIN_PATH`] reads standard input.
pub fn read_logs(paths: &[PathBuf]) -> Result<(Vec<Record>, Vec<BadLine>), ReadError> {
    let mut records = Vec::new();
    let mut bad = Vec::new();
    for path in paths {
        if path.as_os_str() == STDIN_PATH {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut text).map_err(
                |source| ReadError::Read {
                    path: PathBuf::from(STDIN_NAME),
                    source,
                },
            )?;
            parse_log(Path::new(STDIN_NAME), &text, &mut records, &mut bad);
            continue;
        }
        let text = std::fs::read(path).map_err(|source| ReadError::Read {
            path: path.clone(),
            source,
        })?;
        parse_log(path, &text, &mut records, &mut bad);
    }
    if records.is_empty() {
        return Err(ReadError::NoRecords {
            paths: paths.iter().map(|p| shown_path(p)).collect(),
        });
    }
    Ok((records, bad))
}

/// Parses one log's bytes.
pub fn parse_log(path: &Path, text: &[u8], records: &mut Vec<Record>, bad: &mut Vec<BadLine>) {
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut skip = |reason: String| {
            bad.push(BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                reason,
            })
        };
        match serde_json::from_slice::<Record>(line) {
            Ok(r) if r.version > RECORD_VERSION => skip(format!(
                "record format version {} is newer than this callid reads ({RECORD_VERSION}); \
                 upgrade callid",
                r.version
            )),
            Ok(r) => records.push(r),
            Err(e) => skip(describe_parse_error(&e)),
        }
    }
}

/// Why a line is not a record, without quoting the line (it may hold anything).
fn describe_parse_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            format!("not JSON (column {})", e.column())
        }
        Category::Data => {
            let text = e.to_string();
            match text.strip_prefix("missing field ") {
                Some(rest) => format!(
                    "not a probe record: missing field {}",
                    rest.split(" at line").next().unwrap_or(rest)
                ),
                None => format!(
                    "not a probe record: a field has the wrong type or value (column {})",
                    e.column()
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{Kind, RecordContext, Transport};
    use crate::shape::Digester;

    #[test]
    fn bad_lines_are_reported_with_their_place() {
        let mut records = Vec::new();
        let mut bad = Vec::new();
        let record = Record::new(
            Kind::Malformed,
            3,
            &RecordContext::new(Transport::Stdio),
            &Digester::Plain,
        );
        let good = serde_json::to_string(&record).unwrap();
        let newer = good.replacen("\"version\":1", "\"version\":99", 1);
        assert_ne!(good, newer);
        let text = format!("{good}\n\nnot json secret-value\n{{\"a\":1}}\n{newer}\n");
        parse_log(Path::new("x.log"), text.as_bytes(), &mut records, &mut bad);
        assert_eq!(records.len(), 1);
        let shown: Vec<String> = bad.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "x.log:3: not JSON (column 2)",
                "x.log:4: not a probe record: missing field `version`",
                "x.log:5: record format version 99 is newer than this callid reads (1); upgrade callid",
            ]
        );
    }
}
