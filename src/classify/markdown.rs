//! The Markdown renderer: a summary table, then one section per client with every key.

use super::{ClientVerdict, KeyClass, KeySplit, notes, other_call_level, per_call_id_cell};
use crate::text::{markdown_cell, markdown_code};
use std::io::Write;

/// Writes the verdicts as GitHub-flavoured Markdown.
pub fn render(verdicts: &[ClientVerdict], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "| Client | Verdict | Per-call ID | Other call-level keys | Context keys | Calls |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    let keys = |k: Vec<&str>| {
        if k.is_empty() {
            "none".to_string()
        } else {
            k.iter()
                .map(|k| markdown_code(k))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    for v in verdicts {
        let (call_level, context) = match v.key_split {
            KeySplit::Inferred => (
                keys(other_call_level(v)),
                keys(v.context_keys.iter().map(String::as_str).collect()),
            ),
            KeySplit::Unknown => ("unknown".to_string(), "unknown".to_string()),
        };
        let verdict = match &v.reason {
            Some(code) => format!("{} (`{code}`)", v.verdict.name()),
            None => v.verdict.name().to_string(),
        };
        let id = match &v.source_key {
            Some(_) => markdown_code(&per_call_id_cell(v)),
            None => "none".to_string(),
        };
        writeln!(
            out,
            "| {} | {verdict} | {id} | {call_level} | {context} | {} |",
            markdown_cell(&v.client.to_string()),
            v.calls
        )?;
    }
    for v in verdicts {
        writeln!(out)?;
        writeln!(out, "## {}", v.client)?;
        writeln!(out)?;
        match (&v.reason, &v.reason_message) {
            (Some(code), Some(message)) => {
                writeln!(out, "**{}** (`{code}`): {message}", v.verdict.name())?
            }
            _ => writeln!(
                out,
                "**{}** via `{}`.",
                v.verdict.name(),
                per_call_id_cell(v)
            )?,
        }
        for note in notes(v) {
            writeln!(out, "- {note}")?;
        }
        if !v.protocol_versions.is_empty() {
            writeln!(out, "- protocol: {}", v.protocol_versions.join(", "))?;
        }
        let methods: Vec<String> = v
            .methods
            .iter()
            .map(|m| format!("{} ×{}", markdown_code(&m.method), m.count))
            .collect();
        if !methods.is_empty() {
            writeln!(out, "- methods: {}", methods.join(", "))?;
        }
        if v.keys.is_empty() {
            writeln!(out)?;
            writeln!(out, "No `_meta` keys were seen.")?;
            continue;
        }
        writeln!(out)?;
        writeln!(
            out,
            "| `_meta` path | Type | Length | In calls | Distinct | Class |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|")?;
        for k in &v.keys {
            let types: Vec<&str> = k.types.iter().map(|t| t.name()).collect();
            let len = match (k.len_min, k.len_max) {
                (Some(a), Some(b)) if a == b => a.to_string(),
                (Some(a), Some(b)) => format!("{a}–{b}"),
                _ => "".to_string(),
            };
            let class = match k.class {
                KeyClass::CallLevel => "call-level",
                KeyClass::Context => "context",
                KeyClass::Unknown => "unknown",
            };
            writeln!(
                out,
                "| {} | {} | {len} | {} | {} | {class} |",
                markdown_code(&k.path),
                types.join(", "),
                k.calls,
                k.distinct_values
            )?;
        }
    }
    Ok(())
}
