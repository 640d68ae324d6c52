//! The terminal renderer: one row per client, then each rejection's reason in full and the
//! notes (per-call ID behaviour, JSON-RPC ids, bad messages) one per line.

use super::{ClientVerdict, notes, other_call_level, per_call_id_cell};
use comfy_table::{ContentArrangement, Table, presets};
use std::io::Write;

/// Width the table is laid out to.
pub const TABLE_WIDTH: u16 = 132;

/// Writes the verdict table.
pub fn render(verdicts: &[ClientVerdict], out: &mut dyn Write) -> std::io::Result<()> {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(TABLE_WIDTH)
        .set_header(vec![
            "Client",
            "Verdict",
            "Per-call ID",
            "Other call-level keys",
            "Context keys",
            "Calls",
        ]);
    for v in verdicts {
        let verdict = match &v.reason {
            Some(code) => format!("{}:\n{code}", v.verdict.name()),
            None => v.verdict.name().to_string(),
        };
        let keys = |k: &[&str]| {
            if k.is_empty() {
                "none".to_string()
            } else {
                k.join("\n")
            }
        };
        let (call_level, context) = match v.key_split {
            super::KeySplit::Inferred => (
                keys(&other_call_level(v)),
                keys(
                    &v.context_keys
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>(),
                ),
            ),
            super::KeySplit::Unknown => ("unknown".to_string(), "unknown".to_string()),
        };
        table.add_row(vec![
            v.client.to_string().replacen(' ', "\n", 1),
            verdict,
            per_call_id_cell(v).replacen(" (", "\n(", 1),
            call_level,
            context,
            v.calls.to_string(),
        ]);
    }
    writeln!(out, "{table}")?;
    for v in verdicts {
        if let (Some(code), Some(message)) = (&v.reason, &v.reason_message) {
            writeln!(out, "{}: {code}: {message}", v.client)?;
        }
        for note in notes(v) {
            writeln!(out, "{}: {note}", v.client)?;
        }
    }
    Ok(())
}
