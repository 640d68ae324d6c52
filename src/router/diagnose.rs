//! `--diagnose-meta FILE`: one shape record per tool call, opt-in, never a value.
//!
//! Each line is JSON: the tool name, the identity verdict (the source key used, or the error
//! code), and the shape of `_meta` from [`crate::shape::meta_shape`] (key paths, JSON types,
//! lengths, short digests). Recording never changes whether a call is allowed: a failure to write
//! is logged and the call goes on.

use crate::shape::{Digester, meta_shape};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::Path;

/// Appends the shape record of one call to `path`.
pub fn record(path: &Path, tool: &str, meta: &Map<String, Value>) -> std::io::Result<()> {
    let verdict = match crate::identity::from_meta_map(meta) {
        Ok(id) => json!({"accepted": true, "source": id.source.key()}),
        Err(e) => json!({"accepted": false, "code": e.code()}),
    };
    let line = json!({
        "ts_ms": super::registry::now_ms(),
        "tool": tool,
        "identity": verdict,
        "digest": Digester::Plain.scheme(),
        "meta": meta_shape(&Value::Object(meta.clone()), &Digester::Plain),
    });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(file, "{line}")
}
