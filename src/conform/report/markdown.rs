//! Markdown: a heading, a summary line and one table row per check (for the support matrix and CI
//! job summaries).

use super::{CheckResult, Level, Report, verdict_label};
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

/// Escapes what would break a table cell or be read as markup.
fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' => out.push(' '),
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
    fn cells_escape_pipes_and_markup() {
        assert_eq!(super::cell("a|b <c>\nd&"), "a\\|b &lt;c&gt; d&amp;");
    }
}
