//! The expected-failures baseline: check ids a target is known to fail, strict both ways.
//!
//! File format: one check id per line; `#` starts a comment; blank lines are ignored. A listed
//! check that fails (or errors) is tolerated; a listed check that passes is *stale* and fails the
//! run, so the list only ever shrinks by an explicit edit. A listed id that no scenario declares is
//! a setup error (a typo would otherwise tolerate nothing and go unnoticed).

use super::report::{Baseline, Verdict};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Why the expected-failures file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExpectedError {
    /// The file could not be read.
    #[error("failed to read the expected-failures file `{file}`: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a single check id.
    #[error("{file}:{line}: `{text}` is not a check id (one id per line, `#` for comments)")]
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A listed id is not a scenario.
    #[error("{file}:{line}: no scenario has the check id `{id}`; fix or remove the line")]
    Unknown {
        /// The file.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The id.
        id: String,
    },
}

impl ExpectedError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ExpectedError::Read { .. } => "expected_failures_unreadable",
            ExpectedError::Syntax { .. } => "expected_failures_invalid",
            ExpectedError::Unknown { .. } => "expected_failures_unknown_id",
        }
    }
}

/// The set of check ids expected to fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedFailures(BTreeSet<String>);

impl ExpectedFailures {
    /// Reads `file`, checking every id against `known`.
    pub fn load(file: &Path, known: &[&str]) -> Result<Self, ExpectedError> {
        let text = std::fs::read_to_string(file).map_err(|source| ExpectedError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Self::parse(&text, file, known)
    }

    /// Parses the file's text; `file` names it in errors.
    pub fn parse(text: &str, file: &Path, known: &[&str]) -> Result<Self, ExpectedError> {
        let mut ids = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let content = line.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            if content.split_whitespace().count() != 1 {
                return Err(ExpectedError::Syntax {
                    file: file.to_path_buf(),
                    line: i + 1,
                    text: content.to_string(),
                });
            }
            if !known.contains(&content) {
                return Err(ExpectedError::Unknown {
                    file: file.to_path_buf(),
                    line: i + 1,
                    id: content.to_string(),
                });
            }
            ids.insert(content.to_string());
        }
        Ok(ExpectedFailures(ids))
    }

    /// How `verdict` of check `id` stands against the list.
    pub fn classify(&self, id: &str, verdict: Verdict) -> Baseline {
        let listed = self.0.contains(id);
        match (listed, verdict) {
            (false, Verdict::Pass | Verdict::Skipped | Verdict::NotRun) => Baseline::Ok,
            (false, Verdict::Fail | Verdict::Error) => Baseline::Unexpected,
            (true, Verdict::Fail | Verdict::Error) => Baseline::Expected,
            (true, Verdict::Pass) => Baseline::Stale,
            // A check not run proves nothing either way: the entry is neither used nor stale.
            (true, Verdict::Skipped | Verdict::NotRun) => Baseline::Ok,
        }
    }
}

/// The text of an expected-failures file listing every required check of `report` that failed
/// or errored (`--write-expected-failures`), with its reason as a comment; recommended checks
/// never fail a run, so they are not listed.
pub fn baseline_text(report: &super::report::Report) -> String {
    use super::report::Level;
    let mut out = format!(
        "# Expected failures of `{}`, written by `callid conform --write-expected-failures`.\n\
         # One check id per line. A listed check that passes fails the run as stale: remove it then.\n",
        report.target.replace('\n', " ")
    );
    for check in report.level(Level::Required) {
        if matches!(check.verdict, Verdict::Fail | Verdict::Error) {
            let reason: String = check.reason.replace(['\n', '\r'], " ");
            out.push_str(&format!(
                "{}  # {}: {}\n",
                check.id,
                check.verdict.word(),
                reason
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_is_strict_both_ways() {
        let list =
            ExpectedFailures::parse("# known\na.b  # flaky\n\n", Path::new("f"), &["a.b", "c.d"])
                .unwrap();
        let cases = [
            ("c.d", Verdict::Pass, Baseline::Ok),
            ("c.d", Verdict::Skipped, Baseline::Ok),
            ("c.d", Verdict::NotRun, Baseline::Ok),
            ("c.d", Verdict::Fail, Baseline::Unexpected),
            ("c.d", Verdict::Error, Baseline::Unexpected),
            ("a.b", Verdict::Fail, Baseline::Expected),
            ("a.b", Verdict::Error, Baseline::Expected),
            ("a.b", Verdict::Pass, Baseline::Stale),
            ("a.b", Verdict::Skipped, Baseline::Ok),
            ("a.b", Verdict::NotRun, Baseline::Ok),
        ];
        for (id, verdict, want) in cases {
            assert_eq!(list.classify(id, verdict), want, "{id} {verdict:?}");
        }
    }

    #[test]
    fn a_written_baseline_lists_required_failures_and_reads_back() {
        let report = crate::conform::report::tests::sample();
        let text = baseline_text(&report);
        let known: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
        let list = ExpectedFailures::parse(&text, Path::new("f"), &known).unwrap();
        let listed: Vec<&str> = list.0.iter().map(String::as_str).collect();
        assert_eq!(
            listed,
            ["crash.after-charge-before-reply", "new-call.same-arguments"]
        );
        for check in report.level(crate::conform::report::Level::Required) {
            let again = list.classify(&check.id, check.verdict);
            assert_ne!(again, Baseline::Unexpected, "{}", check.id);
        }
    }

    #[test]
    fn refuses_unknown_ids_and_junk() {
        let e = ExpectedFailures::parse("a.b\nz.z\n", Path::new("f"), &["a.b"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f:2: no scenario has the check id `z.z`; fix or remove the line"
        );
        let e = ExpectedFailures::parse("a.b c.d\n", Path::new("f"), &["a.b"]).unwrap_err();
        assert_eq!(e.code(), "expected_failures_invalid");
    }
}
