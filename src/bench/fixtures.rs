//! The inputs every benchmark uses: a Codex-sized `_meta` and `generate_image` arguments.
//!
//! The `_meta` has the keys and value sizes Codex CLI 0.171.0 was observed to send with a
//! `tools/call` (values made up, lengths kept), so the micro-benchmarks and the end-to-end rows
//! measure the work a real call causes. The micro-benchmarks under `benches/` use the same
//! functions.

use super::drive::{Call, next_call};
use serde_json::{Value, json};

/// The `_meta` of a Codex `tools/call`, with `call` numbering the per-call values (`callId`,
/// `itemId`, `progressToken`) so that every call is a new call.
pub fn codex_meta(call: u64) -> Value {
    let session = "0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44";
    json!({
        "callId": format!("call_{call:024}"),
        "itemId": format!("fc_{call:048x}"),
        "threadId": session,
        "sessionId": session,
        "windowId": format!("{session}:0"),
        "progressToken": call,
        "x-codex-turn-metadata": {
            "session_id": session,
            "thread_id": session,
            "model": "gpt-5.3-codex",
            "turn_id": "0199a3f4-1b2c-7e3d-8f40-5a6b7c8d9e0f",
            "turn_started_at_unix_ms": 1_795_990_000_000_u64 + call,
            "thread_source": "cli",
            "turn_trigger": "user_message",
            "sandbox": "workspace-write",
            "sandbox_mode": "workspace-write",
            "auto_review_enabled": false,
            "node_repl_auto_review_required": false,
            "node_repl_disabled": true,
            "codex_version": "0.171.0"
        }
    })
}

/// The `_meta` above as the bytes a server reads off the wire.
pub fn codex_meta_text(call: u64) -> String {
    serde_json::to_string(&codex_meta(call)).expect("a Value serializes")
}

/// Arguments of a `generate_image` call of a typical size.
pub fn generate_image_arguments() -> Value {
    json!({
        "prompt": "An origami fox folded from a single sheet of washi paper, sitting on a walnut \
                   desk beside a brass lamp, soft window light from the left, shallow depth of \
                   field, muted autumn palette, studio product photograph",
        "width": 1024,
        "height": 768,
        "model": "flux-schnell"
    })
}

/// A `capabilities` call (no side effect), with a new call id.
pub fn capabilities_call() -> Call {
    Call {
        tool: "capabilities",
        arguments: json!({}),
        meta: codex_meta(next_call()),
    }
}

/// A new spend: `generate_image` with a new call id.
pub fn new_spend_call() -> Call {
    Call {
        tool: "generate_image",
        arguments: generate_image_arguments(),
        meta: codex_meta(next_call()),
    }
}

/// `echo` of the `generate_image` arguments, with a new call id.
pub fn echo_call() -> Call {
    Call {
        tool: "echo",
        arguments: generate_image_arguments(),
        meta: codex_meta(next_call()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_meta_is_an_accepted_codex_identity_and_distinct_per_call() {
        let first = crate::identity::from_meta(Some(&codex_meta(1))).expect("codex identity");
        let second = crate::identity::from_meta(Some(&codex_meta(2))).expect("codex identity");
        assert_ne!(first, second);
        let text = codex_meta_text(1);
        assert!(
            (700..1_200).contains(&text.len()),
            "a Codex-sized _meta, got {} bytes",
            text.len()
        );
    }

    #[test]
    fn generate_image_arguments_pass_the_identity_rules_and_hash() {
        let arguments = generate_image_arguments();
        crate::identity::check_arguments(&arguments).expect("no identity in arguments");
        crate::canonical::request_hash("generate_image", &arguments).expect("hashable");
    }
}
