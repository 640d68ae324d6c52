//! Turns probe logs into one identity verdict per client.
//!
//! [`classify`] is the analysis (also called by `callid demo` and the matrix tools); each output
//! format is a plain `render(&[ClientVerdict], &mut dyn Write)` in its own file: [`table`] for
//! people, [`markdown`] for documents, [`json`] for machines.
//!
//! # Layout
//! - [`analysis`]: grouping, verdicts, the call-level / context key split, per-call ID checks.
//! - [`table`], [`markdown`], [`json`]: the renderers.

pub mod analysis;
pub mod json;
pub mod markdown;
pub mod table;

pub use analysis::{
    BadLine, ClassifyError, ClientName, ClientVerdict, KeyClass, KeySplit, Verdict, classify,
    read_logs,
};

use std::io::Write;

/// Output format of `classify` and `demo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A terminal table.
    Table,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// A JSON array of verdict objects.
    Json,
}

/// Renders verdicts in `format`.
pub fn render(
    verdicts: &[ClientVerdict],
    format: Format,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    match format {
        Format::Table => table::render(verdicts, out),
        Format::Markdown => markdown::render(verdicts, out),
        Format::Json => json::render(verdicts, out),
    }
}

/// The "Per-call ID" cell: `callId (codex)` or `none`.
pub(crate) fn per_call_id_cell(v: &ClientVerdict) -> String {
    match (&v.source_key, &v.source) {
        (Some(key), Some(platform)) => format!("{key} ({platform})"),
        _ => "none".to_string(),
    }
}

/// The call-level keys other than the per-call ID itself.
pub(crate) fn other_call_level(v: &ClientVerdict) -> Vec<&str> {
    v.call_level_keys
        .iter()
        .map(String::as_str)
        .filter(|k| Some(*k) != v.source_key.as_deref())
        .collect()
}

/// Notes a person should read: key split, per-call ID behaviour, JSON-RPC ids, bad messages.
pub(crate) fn notes(v: &ClientVerdict) -> Vec<String> {
    let mut notes = Vec::new();
    if v.calls == 1 {
        notes.push("one call: call-level and context keys cannot be told apart".to_string());
    }
    if let Some(ids) = &v.per_call_ids
        && ids.calls > 1
    {
        if ids.all_distinct {
            notes.push(format!("per-call IDs distinct across {} calls", ids.calls));
        } else {
            notes.push(format!(
                "{} distinct per-call IDs across {} calls",
                ids.distinct, ids.calls
            ));
        }
        if ids.redelivered > 0 {
            notes.push(format!(
                "{} ID(s) redelivered with the same request",
                ids.redelivered
            ));
        }
        if ids.reused_with_different_request > 0 {
            notes.push(format!(
                "{} ID(s) reused with a different request (the router refuses these)",
                ids.reused_with_different_request
            ));
        }
    }
    if v.jsonrpc_ids.calls > 1 && v.jsonrpc_ids.distinct == 1 {
        notes.push(format!(
            "the same JSON-RPC id on all {} calls",
            v.jsonrpc_ids.calls
        ));
    }
    if v.calls_accepted > 0 && v.calls_accepted < v.calls {
        notes.push(format!(
            "{} of {} calls accepted",
            v.calls_accepted, v.calls
        ));
    }
    if v.bad_messages > 0 {
        notes.push(format!(
            "{} malformed or oversize message(s)",
            v.bad_messages
        ));
    }
    notes
}
