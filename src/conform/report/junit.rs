//! JUnit XML: one `<testsuite>` for the required checks (named after the target) and one for the
//! recommended ones, one `<testcase>` per check. A failure is `<failure>`, an error `<error>`, a
//! check skipped by the profile `<skipped>`, and a check not run `<error type="not-run">` (or
//! `<skipped>` under `--allow-incomplete`). A stale expected failure is a failure.
//!
//! # Agreement with the exit code and the summary
//! A check that was run and does not fail the run is a passed `<testcase>`, with a `<system-out>`
//! note when it did not pass: an expected failure, and a recommended check that failed, errored or
//! is a stale expected failure (recommended checks never fail the run). JUnit has no "passed with
//! a warning"; `<skipped>` tells every reader the check was not run, and `<failure>` turns a CI
//! check red although the run exits 0. So the counts are the summary's
//! ([`super::Summary`]): `failures + errors` = `unexpected + stale` (+ `not_run` unless
//! `--allow-incomplete`), and `skipped` = `skipped` (+ `not_run` under `--allow-incomplete`).

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
        (Level::Recommended, _, _) => Kind::Passed,
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
        (Kind::Passed, Verdict::Pass, Baseline::Ok) => None,
        (Kind::Passed, Verdict::Pass, _) => Some(format!(
            "<system-out>{}</system-out>",
            xml(
                "recommended check listed as an expected failure but passed: remove it from the expected-failures file (it does not fail the run)"
            )
        )),
        (Kind::Passed, v, _) if c.level == Level::Recommended => Some(format!(
            "<system-out>{}</system-out>",
            xml(&format!(
                "recommended convention not followed (verdict {}, which does not fail the run): {}",
                v.word(),
                c.reason
            ))
        )),
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
                _ => "not run (allowed by --allow-incomplete)",
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

    /// The counts of `<testsuites>` and of each `<testsuite>` are the summary's, with and
    /// without `--allow-incomplete`: a failed recommended check is neither skipped nor a failure.
    #[test]
    fn the_counts_agree_with_the_summary() {
        use crate::conform::report::{Baseline, Level, Verdict};
        let mut report = crate::conform::report::tests::sample();
        let mut stale = report.checks[4].clone();
        stale.id = "convention.status-returns-result".into();
        stale.verdict = Verdict::Pass;
        stale.baseline = Baseline::Stale;
        report.checks.push(stale);
        let mut errored = report.checks[4].clone();
        errored.id = "convention.error-code-names".into();
        errored.verdict = Verdict::Error;
        report.checks.push(errored);
        assert_eq!(report.level(Level::Recommended).count(), 3);
        for allow_incomplete in [false, true] {
            report.allow_incomplete = allow_incomplete;
            let mut out = Vec::new();
            super::render(&report, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            let attr = |tag: &str, name: &str| -> usize {
                let at = text.find(&format!("<{tag} ")).unwrap();
                let rest = &text[at..];
                let value = rest.split(&format!(" {name}=\"")).nth(1).unwrap();
                value[..value.find('"').unwrap()].parse().unwrap()
            };
            let s = report.summary();
            let not_run = if allow_incomplete { 0 } else { s.not_run };
            assert_eq!(attr("testsuites", "tests"), report.checks.len());
            assert_eq!(
                attr("testsuites", "failures") + attr("testsuites", "errors"),
                s.unexpected + s.stale + not_run,
                "{text}"
            );
            let skipped = s.skipped + if allow_incomplete { s.not_run } else { 0 };
            assert_eq!(attr("testsuites", "skipped"), skipped, "{text}");
            assert_eq!(s.recommended_failed, 2);
            let recommended = &text[text.find("(recommended)").unwrap()..];
            assert!(
                recommended.contains(r#"tests="3" failures="0" errors="0" skipped="0""#),
                "{recommended}"
            );
            assert!(!recommended.contains("<skipped"), "{recommended}");
            assert_eq!(
                recommended.matches("<system-out>").count(),
                3,
                "{recommended}"
            );
        }
    }

    #[test]
    fn xml_escapes_markup_and_control_characters() {
        assert_eq!(
            super::xml("a<b>&\"'\n\u{1}"),
            "a&lt;b&gt;&amp;&quot;&apos;&#10;\u{FFFD}"
        );
    }
}
