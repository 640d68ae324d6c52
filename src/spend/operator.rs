//! Operator commands: `approve`, `deny`, `resolve`, `status`, `keys`. None of them is a tool:
//! the model cannot reach them, only a person with the registry file can.
//!
//! Each returns the text to print on stdout. No output ever contains a private operation key.

use super::preallocated::{KeyPool, KeyPoolError};
use super::registry::{Operation, Registry, RegistryError, RegistryLocation, Status};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Why `resolve --result FILE` cannot use the file.
#[derive(Debug, thiserror::Error)]
pub enum ResultFileError {
    /// It cannot be read.
    #[error("cannot read the result file `{path}`: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It is not a `CallToolResult`.
    #[error(
        "the result file `{path}` is not an MCP tool result ({detail}); give the JSON the \
         backend answered, e.g. `{{\"content\": [{{\"type\": \"text\", \"text\": \"...\"}}]}}`"
    )]
    NotAResult {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Reads the `CallToolResult` JSON a person found at the backend (`-`: standard input).
pub fn read_result(path: &Path) -> Result<Value, ResultFileError> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|source| ResultFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let not = |detail: String| ResultFileError::NotAResult {
        path: path.to_path_buf(),
        detail,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| not(format!("not JSON: {e}")))?;
    if !value.is_object() {
        return Err(not("not a JSON object".into()));
    }
    serde_json::from_value::<rmcp::model::CallToolResult>(value.clone())
        .map_err(|e| not(e.to_string()))?;
    Ok(value)
}

/// Records a person's resolution of an operation in doubt. `charged`: redeliveries answer
/// `result` (a `CallToolResult`), or without one a stated "charged, result unknown" result;
/// otherwise the next redelivery sends it once more.
pub fn resolve(
    registry: &RegistryLocation,
    handle: &str,
    charged: bool,
    result: Option<Value>,
    by: &str,
) -> Result<String, RegistryError> {
    let recorded = charged.then(|| {
        let result = result.unwrap_or_else(|| {
            json!({
                "content": [{"type": "text", "text": format!(
                    "operation `{handle}` was charged: {by} checked the backend after its outcome \
                     was unknown, and its result was not recorded; ask the operator for it, and \
                     do not call again for it (a new call is a new charge)"
                )}],
                "_meta": {"callid/result_unknown": true},
            })
        });
        json!({"handle": handle, "status": Status::Completed.name(), "result": result})
    });
    let op = Registry::open_existing(registry)?.resolve(handle, charged, recorded.as_ref(), by)?;
    Ok(if charged {
        format!(
            "resolved `{}` as charged ({} cents), by {by}: every redelivery of the call now \
             answers the recorded result, and nothing is sent again\n",
            op.handle, op.amount_cents
        )
    } else {
        format!(
            "resolved `{}` as not charged, by {by}: the next redelivery of the original call \
             sends it to the backend once more\n",
            op.handle
        )
    })
}

/// Approves an operation waiting for a person.
pub fn approve(registry: &RegistryLocation, handle: &str) -> Result<String, RegistryError> {
    let op = Registry::open_existing(registry)?.decide(handle, true, None)?;
    Ok(format!(
        "approved `{}` ({} cents): the agent's `resume_operation` or a redelivery of the original \
         call now runs it once\n",
        op.handle, op.amount_cents
    ))
}

/// Denies an operation waiting for a person.
pub fn deny(
    registry: &RegistryLocation,
    handle: &str,
    reason: Option<&str>,
) -> Result<String, RegistryError> {
    let op = Registry::open_existing(registry)?.decide(handle, false, reason)?;
    Ok(format!(
        "denied `{}`: nothing will be spent for it; the agent is told so on its next call\n",
        op.handle
    ))
}

/// The public view of an operation, as JSON (no private key).
pub fn describe(op: &Operation) -> Value {
    let mut v = json!({
        "handle": op.handle.as_str(),
        "status": op.status.name(),
        "approval": op.approval.name(),
        "platform": op.platform,
        "tool": op.tool,
        "amount_cents": op.amount_cents,
        "request_hash": op.request_hash.as_str(),
        "arguments": op.arguments,
    });
    if let Some(r) = op.result.as_ref().and_then(|r| r.get("result")) {
        v["result"] = r.clone();
    }
    match (&op.error, op.status) {
        (Some((_, message)), Status::InDoubt) => {
            v["in_doubt"] = json!({
                "reason": message,
                "next": "check the backend, then `callid router resolve HANDLE --charged` or `--not-charged`",
            });
        }
        (Some((code, message)), _) => v["failure"] = json!({"code": code, "message": message}),
        (None, _) => {}
    }
    v["dispatch"] = json!(if op.at_most_once {
        "at_most_once"
    } else {
        "idempotent"
    });
    if let Some(ms) = op.dispatched_ms {
        v["dispatched_at"] = json!(crate::clock::rfc3339(
            ms.div_euclid(1000),
            ms.rem_euclid(1000) as u32
        ));
    }
    if let Some(r) = &op.resolution {
        v["resolution"] = json!({
            "outcome": r.name(),
            "by": r.by,
            "at": crate::clock::rfc3339(r.at_ms.div_euclid(1000), r.at_ms.rem_euclid(1000) as u32),
        });
    }
    if let Some(charged) = op.charged_cents {
        v["charged_cents"] = json!(charged);
    }
    if let Some((authorized, charged)) = op.overcharge() {
        v["overcharge"] = json!({"authorized_cents": authorized, "charged_cents": charged});
    }
    v
}

/// Shows one operation by handle.
pub fn status(registry: &RegistryLocation, handle: &str) -> Result<String, RegistryError> {
    let mut reg = Registry::open_existing(registry)?;
    let op = reg
        .find_by_handle(handle)?
        .ok_or_else(|| RegistryError::UnknownHandle {
            handle: handle.to_string(),
            path: std::path::PathBuf::from(registry.to_string()),
        })?;
    let mut text = serde_json::to_string_pretty(&describe(&op)).expect("JSON serializes");
    text.push('\n');
    Ok(text)
}

/// Creates or fills a preallocated-key database.
pub fn keys(file: &Path, count: u32, prefix: &str) -> Result<String, KeyPoolError> {
    let mut pool = KeyPool::open(file)?;
    let unclaimed = pool.fill(count, prefix)?;
    Ok(format!(
        "added {count} keys to `{}`; {unclaimed} unclaimed\n",
        file.display()
    ))
}
