//! The JSON renderer: an array of verdict objects, one per client.
//!
//! Each object has at least `version` (of this format, [`VERSION`]), `client: {name, version}`, `verdict`, `source` (platform or null),
//! `reason` (code or null), `call_level_keys`, `context_keys` and `calls`; see
//! [`ClientVerdict`] for every field.

use super::ClientVerdict;
use std::io::Write;

/// The `version` every verdict object carries (schema: `schemas/classify.json`). It goes up when a
/// field is removed or changes meaning; new fields may appear within a version.
pub const VERSION: u32 = 1;

/// Writes `verdicts` as pretty JSON followed by a newline.
pub fn render(verdicts: &[ClientVerdict], out: &mut dyn Write) -> std::io::Result<()> {
    #[derive(serde::Serialize)]
    struct Versioned<'a> {
        version: u32,
        #[serde(flatten)]
        verdict: &'a ClientVerdict,
    }
    let doc: Vec<Versioned> = verdicts
        .iter()
        .map(|verdict| Versioned {
            version: VERSION,
            verdict,
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}
