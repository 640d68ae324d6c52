//! The one result stream of a run ([`Report`]) and its renderings.
//!
//! Every format renders the same [`Report`]: [`table`] for a terminal (comfy-table), [`markdown`]
//! for the support matrix and CI job summaries, [`json`] for machines, [`junit`] for CI systems.
//! Each is a plain `render(&Report, &mut dyn Write)`, chosen by the closed enum [`Format`].

pub mod json;
pub mod junit;
pub mod markdown;
pub mod table;

use std::io::Write;
use std::time::Duration;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every expectation held.
    Pass,
    /// An expectation did not hold: the router broke the rule.
    Fail,
    /// The profile declares absent what the check needs (`capabilities: {approval: false}`).
    Skipped,
    /// The check was not run for another reason (the runner cannot count charges, restart or
    /// kill this target): never a pass, and it makes the run incomplete.
    NotRun,
    /// The check could not be completed (the router died unexpectedly, a command failed).
    Error,
}

impl Verdict {
    /// The word shown in reports.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Skipped => "skipped",
            Verdict::NotRun => "not run",
            Verdict::Error => "error",
        }
    }
}

/// Whether a check decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// A rule of the design article: a failure fails the run.
    #[default]
    Required,
    /// One of callid's conventions (error-code names, replay marker, status returning the
    /// result): reported in its own section, never fails the run.
    Recommended,
}

/// How a verdict compares with the expected-failures baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// Not listed, and passed or not applicable.
    Ok,
    /// Not listed, and failed or errored: fails the run.
    Unexpected,
    /// Listed, and failed or errored: tolerated.
    Expected,
    /// Listed, but passed: fails the run, the list must be updated.
    Stale,
}

/// The result of one check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    /// Stable check id.
    pub id: String,
    /// What it checks.
    pub title: String,
    /// Short citation of the article rule.
    pub rule: String,
    /// The article's words.
    pub article: String,
    /// Required (decides the exit code) or recommended.
    pub level: Level,
    /// The verdict.
    pub verdict: Verdict,
    /// Why (empty on pass).
    pub reason: String,
    /// Against the expected-failures list.
    pub baseline: Baseline,
    /// Wall time of the check.
    #[serde(serialize_with = "millis")]
    pub duration: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// One run: the target and every check's result, in id order. Every format renders the required
/// checks (the article's rules, where a double charge shows) before the recommended ones
/// (callid's conventions), so when both fail the report leads with the money.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The target's name.
    pub target: String,
    /// The results.
    pub checks: Vec<CheckResult>,
    /// Wall time of the run.
    #[serde(serialize_with = "millis")]
    pub duration: Duration,
    /// `--allow-incomplete`: checks not run do not fail the run.
    pub allow_incomplete: bool,
    /// The signal that interrupted the run, if one did: the checks it did not let finish are
    /// `not run`, and the run does not succeed.
    pub interrupted: Option<crate::signals::Signal>,
}

/// Counts by verdict and baseline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Passed.
    pub pass: usize,
    /// Failed.
    pub fail: usize,
    /// Skipped because the profile declares the capability absent.
    pub skipped: usize,
    /// Not run for another reason (the run is incomplete).
    pub not_run: usize,
    /// Errored.
    pub error: usize,
    /// Failed or errored as the baseline expects.
    pub expected: usize,
    /// Required checks that failed or errored but are not listed.
    pub unexpected: usize,
    /// Listed but passed.
    pub stale: usize,
    /// Recommended checks that failed or errored (never fail the run).
    pub recommended_failed: usize,
}

impl Report {
    /// Counts by verdict.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for c in &self.checks {
            match c.verdict {
                Verdict::Pass => s.pass += 1,
                Verdict::Fail => s.fail += 1,
                Verdict::Skipped => s.skipped += 1,
                Verdict::NotRun => s.not_run += 1,
                Verdict::Error => s.error += 1,
            }
            if c.level == Level::Recommended {
                if matches!(c.verdict, Verdict::Fail | Verdict::Error) {
                    s.recommended_failed += 1;
                }
                continue;
            }
            match c.baseline {
                Baseline::Ok => {}
                Baseline::Unexpected => s.unexpected += 1,
                Baseline::Expected => s.expected += 1,
                Baseline::Stale => s.stale += 1,
            }
        }
        s
    }

    /// Whether the run succeeds: not interrupted, no unexpected failure of a required check, no
    /// stale expected failure, and every check run (or skipped by the profile) unless
    /// `--allow-incomplete`.
    pub fn success(&self) -> bool {
        let s = self.summary();
        self.interrupted.is_none()
            && s.unexpected == 0
            && s.stale == 0
            && (s.not_run == 0 || self.allow_incomplete)
    }

    /// The checks of one level, in id order.
    pub fn level(&self, level: Level) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(move |c| c.level == level)
    }

    /// One line: `29 checks: 27 pass, 1 fail, 1 skipped by profile, 0 not run, 0 error (…)`.
    pub fn summary_line(&self) -> String {
        let s = self.summary();
        let mut line = format!(
            "{} checks: {} pass, {} fail, {} skipped by profile, {} not run, {} error",
            self.checks.len(),
            s.pass,
            s.fail,
            s.skipped,
            s.not_run,
            s.error
        );
        // The rules come first: a broken rule (money) leads, a convention comes last.
        let mut notes = Vec::new();
        if let Some(signal) = self.interrupted {
            notes.push(format!("interrupted by {}", signal.name()));
        }
        if s.unexpected > 0 {
            notes.push(format!("{} unexpected", s.unexpected));
        }
        if s.stale > 0 {
            notes.push(format!("{} stale expected failure(s) now pass", s.stale));
        }
        if s.not_run > 0 {
            notes.push(if self.allow_incomplete {
                format!("{} not run allowed by --allow-incomplete", s.not_run)
            } else {
                format!("incomplete: {} check(s) not run", s.not_run)
            });
        }
        if s.expected > 0 {
            notes.push(format!("{} expected failure(s)", s.expected));
        }
        if s.recommended_failed > 0 {
            notes.push(format!(
                "{} recommended check(s) failed",
                s.recommended_failed
            ));
        }
        if !notes.is_empty() {
            line.push_str(&format!(" ({})", notes.join(", ")));
        }
        line
    }
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A terminal table.
    Table,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// JSON.
    Json,
    /// JUnit XML.
    Junit,
}

/// Renders `report` as `format`.
pub fn render(report: &Report, format: Format, out: &mut dyn Write) -> std::io::Result<()> {
    match format {
        Format::Table => table::render(report, out),
        Format::Markdown => markdown::render(report, out),
        Format::Json => json::render(report, out),
        Format::Junit => junit::render(report, out),
    }
}

/// The verdict word with the baseline note (`fail (expected)`, `pass (stale)`).
pub fn verdict_label(check: &CheckResult) -> String {
    match check.baseline {
        Baseline::Expected => format!("{} (expected)", check.verdict.word()),
        Baseline::Stale => format!("{} (stale)", check.verdict.word()),
        Baseline::Ok | Baseline::Unexpected => check.verdict.word().to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A double charge (a required rule) and a missing replay marker (a convention) fail in one
    /// run: every format, and the summary line, name the rule first, although the convention's
    /// id sorts first.
    #[test]
    fn when_a_rule_and_a_convention_both_fail_every_format_leads_with_the_rule() {
        let mut report = sample();
        report
            .checks
            .retain(|c| c.id == "convention.replay-marker" || c.id == "new-call.same-arguments");
        report.checks.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(report.checks[0].id, "convention.replay-marker");
        report.checks[1].reason = "steps[1] (redeliver `first`): the provider recorded 2 charge(s) in this scenario, expected 1".into();
        assert!(
            report
                .summary_line()
                .ends_with("(1 unexpected, 1 recommended check(s) failed)"),
            "{}",
            report.summary_line()
        );
        for format in [Format::Table, Format::Markdown, Format::Json, Format::Junit] {
            let mut out = Vec::new();
            render(&report, format, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            let rule = text
                .find("new-call.same-arguments")
                .expect("the rule is reported");
            let convention = text
                .find("convention.replay-marker")
                .expect("the convention is reported");
            assert!(
                rule < convention,
                "{format:?} leads with the convention:\n{text}"
            );
        }
    }

    #[test]
    fn an_interrupted_run_never_succeeds_and_says_by_what() {
        let mut report = sample();
        report
            .checks
            .retain(|c| c.verdict == Verdict::Pass && c.baseline == Baseline::Ok);
        assert!(report.success());
        report.interrupted = Some(crate::signals::Signal::Terminate);
        assert!(!report.success());
        assert_eq!(
            report.summary_line(),
            "1 checks: 1 pass, 0 fail, 0 skipped by profile, 0 not run, 0 error (interrupted by SIGTERM)"
        );
    }

    /// A report with every verdict and every baseline outcome, for the snapshot tests.
    pub fn sample() -> Report {
        let check = |id: &str, verdict, reason: &str, baseline, ms| CheckResult {
            level: if id.starts_with("convention.") {
                Level::Recommended
            } else {
                Level::Required
            },
            id: id.to_string(),
            title: format!("title of {id}"),
            rule: "step 5: same call ID + same request hash is redelivery".to_string(),
            article: "Same call ID, same request hash: this is redelivery.".to_string(),
            verdict,
            reason: reason.to_string(),
            baseline,
            duration: Duration::from_millis(ms),
        };
        Report {
            interrupted: None,
            target: "callid reference router".to_string(),
            checks: vec![
                check(
                    "redelivery.same-connection",
                    Verdict::Pass,
                    "",
                    Baseline::Ok,
                    41,
                ),
                check(
                    "new-call.same-arguments",
                    Verdict::Fail,
                    "steps[1] (call `second`): expected a handle different from `first`'s, got the same `hubu:public-operation:v1:1f0c` <&>",
                    Baseline::Unexpected,
                    12,
                ),
                check(
                    "redelivery.after-restart",
                    Verdict::NotRun,
                    "restarting the router on the same state: the runner does not start this router (`--url`)",
                    Baseline::Ok,
                    0,
                ),
                check(
                    "approval.deny-refuses",
                    Verdict::Skipped,
                    "the profile declares `capabilities.approval: false`",
                    Baseline::Ok,
                    0,
                ),
                check(
                    "convention.replay-marker",
                    Verdict::Fail,
                    "steps[1] (redeliver `first`): expected the replay flag at `/_meta/callid~1replayed` to be true, got none",
                    Baseline::Unexpected,
                    7,
                ),
                check(
                    "crash.after-charge-before-reply",
                    Verdict::Error,
                    "steps[2] (redeliver): the router exited: the server closed the connection",
                    Baseline::Expected,
                    230,
                ),
                check(
                    "status.public-handle",
                    Verdict::Pass,
                    "",
                    Baseline::Stale,
                    9,
                ),
            ],
            duration: Duration::from_millis(1234),
            allow_incomplete: false,
        }
    }
}
