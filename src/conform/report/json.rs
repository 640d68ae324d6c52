//! JSON: `{version, target, duration_ms, success, allow_incomplete, interrupted, summary, checks:
//! [{id, title, rule, article, level, verdict, reason, baseline, duration_ms}]}`, pretty-printed.
//! `interrupted` is `null`, or the signal that ended the run (`SIGINT`, `SIGTERM`, `SIGHUP`:
//! every check it did not let finish is `not-run`; a field added within version 1). `verdict` is
//! one of `pass`, `fail`, `skipped` (the profile declares the capability absent), `not-run`,
//! `error`; `level` is `required` or `recommended`. The required checks come first, each level in
//! id order.

use super::Report;
use std::io::Write;

/// The `version` of the JSON report (schema: `schemas/conform.json`). It goes up when a field is
/// removed or changes meaning; new fields may appear within a version.
pub const VERSION: u32 = 1;

/// Renders `report` as JSON.
pub fn render(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    // The required checks first: when a rule and a convention both fail, the rule leads.
    let checks: Vec<serde_json::Value> = report
        .level(super::Level::Required)
        .chain(report.level(super::Level::Recommended))
        .map(|c| {
            serde_json::json!({
                "id": c.id,
                "title": c.title,
                "rule": c.rule,
                "article": c.article,
                "level": c.level,
                "verdict": c.verdict,
                "reason": c.reason,
                "baseline": c.baseline,
                "duration_ms": c.duration.as_millis() as u64,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "version": VERSION,
        "target": report.target,
        "duration_ms": report.duration.as_millis() as u64,
        "success": report.success(),
        "allow_incomplete": report.allow_incomplete,
        "interrupted": report.interrupted,
        "summary": report.summary(),
        "checks": checks,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
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
