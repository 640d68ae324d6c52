//! The model's side of a measurement: the [`Script`] of steps the endpoint plays, the tool calls
//! it hands out, the hooks around the first call, and the fixed values every wire format
//! answers with.

use serde_json::Value;
use std::time::Duration;

/// Most model requests answered with a scripted step; later ones always get final text.
pub const MAX_MODEL_REQUESTS: usize = 12;
/// Final text the scripted model ends with.
pub const FINAL_TEXT: &str = "Done: the probe answered.";
/// The model name the endpoint answers as when the request names none, and lists.
pub const SCRIPTED_MODEL: &str = "scripted-model";
/// The fixed `created` time of every Chat Completions answer (answers do not depend on the clock).
pub const CREATED: u64 = 1_767_225_600;

/// One answer of the scripted model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Call the probe's tool with this tool-call id and empty arguments.
    ToolCall {
        /// The model's tool-call id (`call_...` for Responses, `toolu_...` for Messages).
        id: String,
    },
    /// Call the probe's tool several times in one answer, in this order.
    ToolCalls(Vec<ScriptedCall>),
    /// End the turn with text.
    Text,
}

/// One tool call of a [`Step::ToolCalls`] answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedCall {
    /// The model's tool-call id.
    pub id: String,
    /// The arguments, exactly as the model passes them to the tool the client offers.
    pub arguments: Value,
}

impl Step {
    /// The tool calls this answer hands out (none for text); a [`Step::ToolCall`] carries the
    /// script's `arguments`.
    pub fn calls(&self, arguments: &Value) -> Vec<ScriptedCall> {
        match self {
            Step::ToolCall { id } => vec![ScriptedCall {
                id: id.clone(),
                arguments: arguments.clone(),
            }],
            Step::ToolCalls(calls) => calls.clone(),
            Step::Text => Vec::new(),
        }
    }
}

/// What the endpoint does besides answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Nothing.
    None,
    /// Freeze the MCP server (SIGSTOP) just before handing out the first tool call, so the call
    /// cannot be answered; thaw it (SIGCONT) when the client comes back to the model, or after
    /// [`FREEZE_LIMIT`] if it never does.
    FreezeServerDuringFirstCall,
    /// Freeze the MCP server just before handing out the first tool call, then kill it
    /// (SIGKILL) [`KILL_AFTER`] later, while the call is in flight.
    KillServerDuringFirstCall,
}

/// How long after handing out the first tool call the frozen server is killed.
pub const KILL_AFTER: Duration = Duration::from_millis(2500);

/// Longest the MCP server is kept frozen.
pub const FREEZE_LIMIT: Duration = Duration::from_secs(40);

/// The model's side of one measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// Answers, by number of tool results in the request; the last repeats.
    pub steps: Vec<Step>,
    /// The probe tool's name as the client presents it to the model.
    pub tool: ToolName,
    /// The arguments of each scripted tool call (`{}` for the probe's tool itself; a client that
    /// reaches MCP tools through a tool of its own needs the probe's tool named here).
    pub arguments: Value,
    /// Side effect around the first tool call.
    pub hook: Hook,
}

/// How the client names the probe's tool to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolName {
    /// Codex: a function inside a namespace (`mcp__probe` / `capabilities`).
    Namespaced {
        /// The namespace.
        namespace: String,
        /// The function.
        name: String,
    },
    /// Claude Code: one flat name (`mcp__probe__capabilities`).
    Flat(String),
}
