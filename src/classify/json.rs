//! The JSON renderer: an array of verdict objects, one per client.
//!
//! Each object has at least `client: {name, version}`, `verdict`, `source` (platform or null),
//! `reason` (code or null), `call_level_keys`, `context_keys` and `calls`; see
//! [`ClientVerdict`] for every field.

use super::ClientVerdict;
use std::io::Write;

/// Writes `verdicts` as pretty JSON followed by a newline.
pub fn render(verdicts: &[ClientVerdict], out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, verdicts)?;
    writeln!(out)
}
