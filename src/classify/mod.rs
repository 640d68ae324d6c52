//! Turns probe logs into one identity verdict per client.
//!
//! [`classify`] is the analysis (also called by `callid demo` and the matrix tools); each output
//! format is a plain `render(&[ClientVerdict], &mut dyn Write)` in its own file: [`table`] for
//! people, [`markdown`] for documents, [`json`] for machines.
//!
//! # Layout
//! - [`analysis`]: grouping, verdicts, the call-level / context key split, per-call ID checks.
//! - [`kinds`]: call IDs, per-attempt values and context told apart from measured runs.
//! - `pointer`: the `_meta` key a record's JSON pointer names (used by both of the above).
//! - [`runs`]: the runs a measurement records, their log names and scripted tool-call ids.
//! - [`table`], [`markdown`], [`json`]: the renderers.

mod analysis;
mod json;
pub(crate) mod kinds;
mod markdown;
mod pointer;
pub(crate) mod runs;
mod table;

pub(crate) use analysis::{ClassifyError, classify_runs, read_logs, read_runs};
pub use analysis::{ClientVerdict, KeyClass, KeySplit, Verdict, classify};

use std::io::Write;

/// Output format of `classify` and `demo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// A terminal table.
    Table,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// A JSON array of verdict objects.
    Json,
}

/// Renders verdicts in `format`.
pub(crate) fn render(
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
    for k in &v.key_kinds {
        notes.push(format!("`{}`: {}: {}", k.key, k.kind.name(), k.evidence));
    }
    if v.bad_messages > 0 {
        notes.push(format!(
            "{} malformed or oversize message(s)",
            v.bad_messages
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{RecordContext, Transport, record_for_request};
    use crate::shape::Digester;
    use serde_json::json;

    /// Every verdict and every rejection code, rendered in every format, in one snapshot.
    #[test]
    fn every_verdict_in_every_format() {
        let d = Digester::Plain;
        let clients: [(&str, &[serde_json::Value]); 6] = [
            (
                "accepted-codex",
                &[json!({"callId": "call_1"}), json!({"callId": "call_2"})],
            ),
            (
                "accepted-envelope",
                &[
                    json!({"hubu.dev/platform-invocation": {"platform": "hubu", "invocation_id": "i1"}}),
                ],
            ),
            (
                "rejected-missing",
                &[
                    json!({"openai/session": "s"}),
                    json!({"openai/session": "s"}),
                ],
            ),
            (
                "rejected-ambiguous",
                &[json!({"callId": "a", "claudecode/toolUseId": "b"})],
            ),
            ("rejected-invalid", &[json!({"callId": " padded "})]),
            ("unknown-no-calls", &[]),
        ];
        let mut records = Vec::new();
        for (name, metas) in clients {
            let ctx = RecordContext::new(Transport::Stdio);
            let init = json!({"protocolVersion": "2025-11-25", "clientInfo": {"name": name, "version": "1.0"}});
            let r = record_for_request("initialize", Some(&json!(0)), Some(&init), 0, &ctx, &d);
            let ctx = RecordContext {
                client: r.client.clone(),
                ..ctx
            };
            records.push(r);
            for (i, meta) in metas.iter().enumerate() {
                let params = json!({"name": "buy", "arguments": {"n": i}, "_meta": meta});
                records.push(record_for_request(
                    "tools/call",
                    Some(&json!(i + 1)),
                    Some(&params),
                    0,
                    &ctx,
                    &d,
                ));
            }
        }
        let verdicts = classify(&records);
        let mut text = String::new();
        for format in [Format::Table, Format::Markdown, Format::Json] {
            let mut out = Vec::new();
            render(&verdicts, format, &mut out).unwrap();
            text.push_str(&format!(
                "===== {format:?}\n{}\n",
                String::from_utf8(out).unwrap()
            ));
        }
        insta::assert_snapshot!(text);
    }
}
