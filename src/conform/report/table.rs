//! The terminal table: check id, rule, verdict, reason, then a summary line.

use super::{CheckResult, Level, Report, verdict_label};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use std::io::Write;

/// Width the table wraps to when standard output is not a terminal (stable for logs and tests).
const DEFAULT_WIDTH: u16 = 140;

/// Renders the table of `report`.
pub fn render(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "callid conform: {}", report.target)?;
    writeln!(out, "{}", table(report.level(Level::Required)))?;
    if report.level(Level::Recommended).next().is_some() {
        writeln!(
            out,
            "recommended (callid's conventions, not the article's rules: they never fail the run)"
        )?;
        writeln!(out, "{}", table(report.level(Level::Recommended)))?;
    }
    writeln!(
        out,
        "{} in {:.1} s",
        report.summary_line(),
        report.duration.as_secs_f64()
    )
}

fn table<'a>(checks: impl Iterator<Item = &'a CheckResult>) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(DEFAULT_WIDTH)
        .set_header(["check id", "rule", "verdict", "reason"]);
    for check in checks {
        table.add_row([
            check.id.as_str(),
            check.rule.as_str(),
            verdict_label(check).as_str(),
            check.reason.as_str(),
        ]);
    }
    table
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
