//! Scripted model endpoints on loopback: the OpenAI Responses API (Codex), the Anthropic
//! Messages API (Claude Code), OpenAI Chat Completions (streamed or not: most other clients) and
//! the Gemini API's `streamGenerateContent` (Gemini CLI).
//!
//! The endpoint plays the model. It answers the first main-loop request with the first step of
//! its [`Script`] and each request that comes back from a tool with the next one. A step hands
//! out one tool call, or several in one answer ([`Step::ToolCalls`]), in every wire format. A
//! request that does not offer the probe's tool (a title or quota side request) gets a short
//! text answer. After [`MAX_MODEL_REQUESTS`](script::MAX_MODEL_REQUESTS) requests every answer
//! is final text, so a client that loops still stops.
//!
//! # Guarantees
//! - Binds 127.0.0.1 only, port chosen by the OS.
//! - Records, per request, only what the measurement needs: path, whether it was a main-loop
//!   request, how many tool results it carried, and which scripted tool-call id it answered with.
//!   Prompt text and tool output are not kept.
//!
//! # Files
//! - `script`: the [`Script`] the endpoint plays and the values every answer uses.
//! - `server`: the scripted model server ([`Endpoint`]).
//! - `process`: stopping, resuming and killing the MCP server for the script's [`Hook`]s.
//! - `wire`: what the wire formats share ([`Wire`], reading a request); one file per format:
//!   `responses`, `messages`, `chat`, `gemini`.

mod chat;
mod gemini;
mod messages;
mod process;
mod responses;
mod script;
mod server;
#[cfg(test)]
mod tests;
mod wire;

pub use script::{FREEZE_LIMIT, Hook, SCRIPTED_MODEL, Script, ScriptedCall, Step, ToolName};
pub use server::Endpoint;
pub use wire::Wire;
