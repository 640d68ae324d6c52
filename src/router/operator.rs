//! Operator commands: `approve`, `deny`, `status`, `keys`. None of them is a tool: the model
//! cannot reach them, only a person with the registry file can.
//!
//! Each returns the text to print on stdout. No output ever contains a private operation key.

use super::preallocated::{KeyPool, KeyPoolError};
use super::registry::{Operation, Registry, RegistryError, RegistryLocation};
use serde_json::{Value, json};
use std::path::Path;

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
    if let Some((code, message)) = &op.error {
        v["failure"] = json!({"code": code, "message": message});
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
