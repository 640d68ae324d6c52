//! JUnit XML: one `<testsuite>` for the required checks (named after the target) and one for the
//! recommended ones, one `<testcase>` per check. A failure is `<failure>`, an error `<error>`, a
//! check skipped by the profile `<skipped>`, and a check not run `<error type="not-run">` (or
//! `<skipped>` under `--allow-incomplete`). An expected failure is reported as passed with a
//! `<system-out>` note, a stale one as a failure, and a recommended check that failed as
//! `<skipped>` with its reason, so CI agrees with the exit code.

use super::{Baseline, CheckResult, Level, Report, Verdict};
use std::io::Write;

/// What a check counts as in JUnit terms.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Passed,
    Failure,
    Error,
    Skipped,
}

fn kind(c: &CheckResult, allow_incomplete: bool) -> Kind {
    match (c.level, c.baseline, c.verdict) {
        (_, _, Verdict::Skipped) => Kind::Skipped,
        (_, _, Verdict::NotRun) if allow_incomplete => Kind::Skipped,
        (_, _, Verdict::NotRun) => Kind::Error,
        (Level::Recommended, _, Verdict::Fail | Verdict::Error) => Kind::Skipped,
        (_, Baseline::Stale, _) => Kind::Failure,
        (_, Baseline::Expected, _) | (_, _, Verdict::Pass) => Kind::Passed,
        (_, _, Verdict::Fail) => Kind::Failure,
        (_, _, Verdict::Error) => Kind::Error,
    }
}

/// Renders `report` as JUnit XML.
pub fn render(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let count = |checks: &[&CheckResult], k: Kind| {
        checks
            .iter()
            .filter(|c| kind(c, report.allow_incomplete) == k)
            .count()
    };
    let all: Vec<&CheckResult> = report.checks.iter().collect();
    writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
    writeln!(
        out,
        r#"<testsuites name="callid conform" tests="{}" failures="{}" errors="{}" skipped="{}" time="{:.3}">"#,
        all.len(),
        count(&all, Kind::Failure),
        count(&all, Kind::Error),
        count(&all, Kind::Skipped),
        report.duration.as_secs_f64()
    )?;
    for (level, suffix) in [
        (Level::Required, ""),
        (Level::Recommended, " (recommended)"),
    ] {
        let checks: Vec<&CheckResult> = report.level(level).collect();
        if checks.is_empty() {
            continue;
        }
        let time: f64 = checks.iter().map(|c| c.duration.as_secs_f64()).sum();
        writeln!(
            out,
            r#"  <testsuite name="{}{suffix}" tests="{}" failures="{}" errors="{}" skipped="{}" time="{time:.3}">"#,
            xml(&report.target),
            checks.len(),
            count(&checks, Kind::Failure),
            count(&checks, Kind::Error),
            count(&checks, Kind::Skipped),
        )?;
        for c in checks {
            testcase(c, report.allow_incomplete, out)?;
        }
        writeln!(out, "  </testsuite>")?;
    }
    writeln!(out, "</testsuites>")
}

fn testcase(c: &CheckResult, allow_incomplete: bool, out: &mut dyn Write) -> std::io::Result<()> {
    write!(
        out,
        r#"    <testcase classname="conform" name="{}" time="{:.3}""#,
        xml(&c.id),
        c.duration.as_secs_f64()
    )?;
    let body = match (kind(c, allow_incomplete), c.verdict, c.baseline) {
        (Kind::Passed, Verdict::Pass, _) => None,
        (Kind::Passed, v, _) => Some(format!(
            "<system-out>{}</system-out>",
            xml(&format!("expected {}: {}", v.word(), c.reason))
        )),
        (Kind::Failure, _, Baseline::Stale) => Some(format!(
            r#"<failure message="{}" type="stale-expected-failure"/>"#,
            xml(
                "listed as an expected failure but passed: remove it from the expected-failures file"
            )
        )),
        (Kind::Failure, _, _) => Some(format!(
            r#"<failure message="{}" type="fail"/>"#,
            xml(&c.reason)
        )),
        (Kind::Error, Verdict::NotRun, _) => Some(format!(
            r#"<error message="{}" type="not-run"/>"#,
            xml(&format!("not run: {}", c.reason))
        )),
        (Kind::Error, _, _) => Some(format!(
            r#"<error message="{}" type="error"/>"#,
            xml(&c.reason)
        )),
        (Kind::Skipped, v, _) => {
            let what = match v {
                Verdict::Skipped => "skipped by profile",
                Verdict::NotRun => "not run (allowed by --allow-incomplete)",
                _ => "recommended convention not followed",
            };
            Some(format!(
                r#"<skipped message="{}"/>"#,
                xml(&format!("{what}: {}", c.reason))
            ))
        }
    };
    match body {
        None => writeln!(out, "/>"),
        Some(body) => {
            writeln!(out, ">")?;
            writeln!(
                out,
                "      <properties><property name=\"rule\" value=\"{}\"/></properties>",
                xml(&c.rule)
            )?;
            writeln!(out, "      {body}")?;
            writeln!(out, "    </testcase>")
        }
    }
}

/// Escapes text for an XML attribute or element, dropping characters XML 1.0 cannot carry.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push_str(&format!("&#{};", c as u32)),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn snapshot() {
        let mut out = Vec::new();
        super::render(&crate::conform::report::tests::sample(), &mut out).unwrap();
        insta::assert_snapshot!(String::from_utf8(out).unwrap());
    }

    #[test]
    fn xml_escapes_markup_and_control_characters() {
        assert_eq!(
            super::xml("a<b>&\"'\n\u{1}"),
            "a&lt;b&gt;&amp;&quot;&apos;&#10;\u{FFFD}"
        );
    }
}
