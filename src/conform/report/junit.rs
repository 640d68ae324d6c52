//! JUnit XML: one `<testsuite>` named after the target, one `<testcase>` per check; a failure is
//! `<failure>`, an error `<error>`, not applicable `<skipped>`. An expected failure is reported
//! as passed with a `<system-out>` note, and a stale one as a failure, so CI agrees with the exit
//! code.

use super::{Baseline, Report, Verdict};
use std::io::Write;

/// Renders `report` as JUnit XML.
pub fn render(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let mut failures = 0;
    let mut errors = 0;
    let mut skipped = 0;
    for c in &report.checks {
        match (c.baseline, c.verdict) {
            (Baseline::Stale, _) | (Baseline::Unexpected, Verdict::Fail) => failures += 1,
            (Baseline::Unexpected, _) => errors += 1,
            (_, Verdict::NotApplicable) => skipped += 1,
            _ => {}
        }
    }
    writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
    writeln!(
        out,
        r#"<testsuites name="callid conform" tests="{}" failures="{failures}" errors="{errors}" skipped="{skipped}" time="{:.3}">"#,
        report.checks.len(),
        report.duration.as_secs_f64()
    )?;
    writeln!(
        out,
        r#"  <testsuite name="{}" tests="{}" failures="{failures}" errors="{errors}" skipped="{skipped}" time="{:.3}">"#,
        xml(&report.target),
        report.checks.len(),
        report.duration.as_secs_f64()
    )?;
    for c in &report.checks {
        write!(
            out,
            r#"    <testcase classname="conform" name="{}" time="{:.3}""#,
            xml(&c.id),
            c.duration.as_secs_f64()
        )?;
        let body = match (c.baseline, c.verdict) {
            (Baseline::Stale, _) => Some(format!(
                r#"<failure message="{}" type="stale-expected-failure"/>"#,
                xml(
                    "listed as an expected failure but passed: remove it from the expected-failures file"
                )
            )),
            (Baseline::Expected, v) => Some(format!(
                "<system-out>{}</system-out>",
                xml(&format!("expected {}: {}", v.word(), c.reason))
            )),
            (_, Verdict::Pass) => None,
            (_, Verdict::Fail) => Some(format!(
                r#"<failure message="{}" type="fail"/>"#,
                xml(&c.reason)
            )),
            (_, Verdict::Error) => Some(format!(
                r#"<error message="{}" type="error"/>"#,
                xml(&c.reason)
            )),
            (_, Verdict::NotApplicable) => {
                Some(format!(r#"<skipped message="{}"/>"#, xml(&c.reason)))
            }
        };
        match body {
            None => writeln!(out, "/>")?,
            Some(body) => {
                writeln!(out, ">")?;
                writeln!(
                    out,
                    "      <properties><property name=\"rule\" value=\"{}\"/></properties>",
                    xml(&c.rule)
                )?;
                writeln!(out, "      {body}")?;
                writeln!(out, "    </testcase>")?;
            }
        }
    }
    writeln!(out, "  </testsuite>")?;
    writeln!(out, "</testsuites>")
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
