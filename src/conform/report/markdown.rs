//! Markdown: a heading, a summary line and one table row per check (for the support matrix and CI
//! job summaries).

use super::{CheckResult, Level, Report, verdict_label};
use crate::text::markdown_cell as cell;
use std::io::Write;

/// Renders `report` as GitHub-flavoured Markdown.
pub fn render(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "## callid conform: {}", cell(&report.target))?;
    writeln!(out)?;
    writeln!(out, "{}", report.summary_line())?;
    writeln!(out)?;
    rows(report.level(Level::Required), out)?;
    if report.level(Level::Recommended).next().is_some() {
        writeln!(out)?;
        writeln!(
            out,
            "### Recommended (callid's conventions, not the article's rules: they never fail the run)"
        )?;
        writeln!(out)?;
        rows(report.level(Level::Recommended), out)?;
    }
    Ok(())
}

fn rows<'a>(
    checks: impl Iterator<Item = &'a CheckResult>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(out, "| check id | rule | verdict | reason |")?;
    writeln!(out, "|---|---|---|---|")?;
    for check in checks {
        writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            check.id,
            cell(&check.rule),
            verdict_label(check),
            cell(&check.reason)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn snapshot() {
        let mut out = Vec::new();
        super::render(&crate::conform::report::tests::sample(), &mut out).unwrap();
        insta::assert_snapshot!(String::from_utf8(out).unwrap());
    }
}
