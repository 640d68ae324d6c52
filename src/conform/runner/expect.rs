//! The expectation checks of a step: what a response, the runner's ledger and a `tools/list` must
//! show, each turned into a reason a person can act on.
//!
//! # Guarantees
//! - The checks only read: the response, the profile's pointers and names, what earlier steps
//!   left behind, and the runner's ledger and hooks; nothing here sends a request.
//! - Dispatches are judged beside charges, in their own file (`runner/dispatches.rs`).
//! - Within a response, the rule's core (success or refusal, the error code, the replayed
//!   result) is checked first and a broken one is a failure at once; then a status or a handle,
//!   whose breach is a [`StepError::Presentation`], and is not checked when the profile declares
//!   the field absent (`pointers.status: null`, `pointers.handle: null`); a convention not
//!   followed (callid's name for an error code, the replay marker) is a
//!   [`StepError::Cosmetic`]. The step interpreter reports those two only when nothing core
//!   breaks later. The ledger checks are separate ([`ScenarioRun::check_ledger_with`]) so the
//!   interpreter can run them first: money leads.
//! - A reason names the value it saw: [`describe`] renders a tool error with its code and text,
//!   [`first_difference`] the first JSON path where two results differ.
//! - [`ScenarioRun::scan`] fails a step when any byte the router sent, including messages no
//!   request matched, contains the private key prefix.
//! - [`check_schemas`] fails when a tool's input schema names an identity-like property at any
//!   depth (`properties`, `patternProperties`, `required`, `$defs`, `items`, ...).

use super::{ScenarioRun, StepError, StepResult, fail};
use crate::conform::provider::LedgerReadError;
use crate::conform::scenario::Expect;
use crate::jsonrpc::Response;
use crate::text::{clip, cut};
use serde_json::Value;

/// The value at `at` in a tool result.
pub(super) fn pointer<'r>(r: &'r Response, at: &str) -> Option<&'r Value> {
    r.tool_result()?.pointer(at)
}

/// The string at `at` in a tool result.
pub(super) fn pointer_str(r: &Response, at: &str) -> Option<String> {
    pointer(r, at).and_then(Value::as_str).map(str::to_string)
}

/// `the tool error `code` ("message")`, `success`, or the JSON-RPC error, for reasons.
pub(super) fn describe(r: &Response, error_pointer: &str) -> String {
    if let Some(e) = &r.error {
        return format!("the JSON-RPC error {}", clip(&e.to_string(), 160));
    }
    if r.is_tool_error() {
        let code = pointer_str(r, error_pointer).unwrap_or_else(|| "(no code)".into());
        let text = r
            .tool_result()
            .and_then(|t| t.pointer("/content/0/text"))
            .and_then(Value::as_str)
            .map(|t| format!(" ({})", clip(t, 120)))
            .unwrap_or_default();
        return format!("the tool error `{code}`{text}");
    }
    "success".to_string()
}

/// The first place two JSON values differ, as `at /path: `a` vs `b``.
pub(super) fn first_difference(want: &Value, got: &Value, at: &str) -> String {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let path = format!("{at}/{k}");
                match b.get(k) {
                    Some(w) if w == v => {}
                    Some(w) => return first_difference(v, w, &path),
                    None => return format!("at `{path}`: missing"),
                }
            }
            if let Some(k) = b.keys().find(|k| !a.contains_key(*k)) {
                return format!("at `{at}/{k}`: unexpected");
            }
            format!("at `{at}`")
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                if v != w {
                    return first_difference(v, w, &format!("{at}/{i}"));
                }
            }
            format!("at `{at}`")
        }
        _ => format!(
            "at `{}`: `{}` became `{}`",
            if at.is_empty() { "/" } else { at },
            clip(&want.to_string(), 60),
            clip(&got.to_string(), 60)
        ),
    }
}

/// Fails when a tool's input schema names an identity-like property at any depth, or the spend
/// tool is not listed.
pub(super) fn check_schemas(response: &Response, spend: &str) -> StepResult {
    if let Some(error) = &response.error {
        return fail(format!("`tools/list` failed: {error}"));
    }
    let tools = response
        .result
        .as_ref()
        .and_then(|r| r.get("tools"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !tools
        .iter()
        .any(|t| t.get("name").and_then(Value::as_str) == Some(spend))
    {
        return fail(format!("the spend tool `{spend}` is not listed"));
    }
    for tool in &tools {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("?");
        let Some(schema) = tool.get("inputSchema") else {
            continue;
        };
        if let Some(path) = identity_property(schema, "") {
            return fail(format!(
                "tool `{name}` exposes the identity-like field `{path}` in its input schema: the model would write it"
            ));
        }
    }
    Ok(())
}

/// The path of the first identity-like property `schema` names, if any.
fn identity_property(schema: &Value, at: &str) -> Option<String> {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if matches!(key.as_str(), "properties" | "patternProperties")
                    && let Value::Object(props) = value
                {
                    for (prop, sub) in props {
                        let path = format!("{at}/{prop}");
                        if crate::identity::is_identity_like(prop) {
                            return Some(path);
                        }
                        if let Some(found) = identity_property(sub, &path) {
                            return Some(found);
                        }
                    }
                } else if key == "required"
                    && let Value::Array(names) = value
                    && let Some(n) = names
                        .iter()
                        .filter_map(Value::as_str)
                        .find(|n| crate::identity::is_identity_like(n))
                {
                    return Some(format!("{at}/{n}"));
                } else if let Some(found) = identity_property(value, at) {
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => items.iter().find_map(|v| identity_property(v, at)),
        _ => None,
    }
}

impl ScenarioRun<'_> {
    /// Checks `expect` against a response `r` whose handle and result were read already.
    pub(super) fn check_response(
        &self,
        r: &Response,
        expect: &Expect,
        handle: Option<&str>,
        result: Option<&Value>,
    ) -> StepResult {
        let pointers = &self.profile.pointers;
        let profile = self.profile;
        // Conventions (a code's name, the replay marker) are checked after the rules, so a
        // broken rule is the reason whenever both break.
        let mut cosmetic: Option<String> = None;
        if let Some(error) = &r.error {
            return fail(format!(
                "answered a JSON-RPC error ({}) where the contract requires a tool result",
                clip(&error.to_string(), 200)
            ));
        }
        if r.tool_result().is_none() {
            return fail("the response has neither `result` nor `error`");
        }
        let code = pointer_str(r, &pointers.error);
        if let Some(want) = expect.ok {
            if want && r.is_tool_error() {
                return fail(format!(
                    "expected success, got {}",
                    describe(r, &pointers.error)
                ));
            }
            if !want && !r.is_tool_error() {
                return fail("expected a tool error, got success");
            }
        }
        for (want, named) in [
            (
                expect.error.as_deref().map(|w| profile.error_code(w)),
                false,
            ),
            (expect.error_named.as_deref(), true),
        ] {
            let Some(want) = want else { continue };
            if !r.is_tool_error() {
                return fail(format!(
                    "expected the tool error `{want}`, got success{}",
                    handle
                        .map(|h| format!(" with handle `{h}`"))
                        .unwrap_or_default()
                ));
            }
            if code.as_deref() != Some(want) {
                let message = format!(
                    "expected the tool error `{want}`{}, got {}",
                    if named { " (callid's name for it)" } else { "" },
                    describe(r, &pointers.error)
                );
                if named {
                    cosmetic.get_or_insert(message);
                } else {
                    return fail(message);
                }
            }
        }
        if let Some(other) = &expect.result_equals {
            let theirs = self.done.get(other).and_then(|d| d.result.as_ref());
            match (result, theirs) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    return fail(format!(
                        "the result differs from `{other}`'s: {}",
                        first_difference(b, a, "")
                    ));
                }
                _ => {
                    return fail(format!(
                        "no result at `{}` to compare with `{other}`'s",
                        pointers.result
                    ));
                }
            }
        }
        // Not the rule's core (`judge.rs`): a broken status or handle lets the scenario go on,
        // and a field the profile declares absent is not checked at all.
        let presentation = |message: String| Err(StepError::Presentation(message));
        if let (Some(want), Some(at)) = (&expect.status, &pointers.status) {
            let want = profile.status_word(want);
            let got = pointer_str(r, at);
            if got.as_deref() != Some(want) {
                return presentation(format!(
                    "expected status `{want}`, got {}",
                    got.map(|g| format!("`{g}`"))
                        .unwrap_or_else(|| format!("none at `{at}`"))
                ));
            }
        }
        if let Some(want) = expect.replayed {
            match &pointers.replayed {
                None => {
                    cosmetic.get_or_insert(
                        "the profile names no replay marker (`pointers.replayed: null`)".into(),
                    );
                }
                Some(at) => {
                    let got = pointer(r, at);
                    if got.and_then(Value::as_bool) != Some(want) {
                        cosmetic.get_or_insert(format!(
                            "expected the replay flag at `{at}` to be {want}, got {}",
                            got.map(|g| format!("`{g}`"))
                                .unwrap_or_else(|| "none".into())
                        ));
                    }
                }
            }
        }
        let Some(handle_at) = &pointers.handle else {
            return cosmetic.map_or(Ok(()), |c| Err(StepError::Cosmetic(c)));
        };
        if let Some(want) = expect.has_handle
            && want != handle.is_some()
        {
            return presentation(if want {
                format!("expected a public handle at `{handle_at}`, found none")
            } else {
                format!("expected no handle, got `{}`", handle.unwrap_or_default())
            });
        }
        if let Some(other) = &expect.same_handle_as {
            let theirs = self.done.get(other).and_then(|d| d.handle.as_deref());
            match (handle, theirs) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    return presentation(format!(
                        "expected the handle of `{other}` (`{b}`), got `{a}`: a second operation"
                    ));
                }
                (None, _) => {
                    return presentation(format!(
                        "expected the handle of `{other}`, got no handle ({})",
                        describe(r, &pointers.error)
                    ));
                }
                (Some(_), None) => {
                    return presentation(format!("step `{other}` has no handle to compare with"));
                }
            }
        }
        for other in &expect.different_handle_from {
            let theirs = self.done.get(other).and_then(|d| d.handle.as_deref());
            match (handle, theirs) {
                (Some(a), Some(b)) if a == b => {
                    return presentation(format!(
                        "expected a new operation, got the handle of `{other}` (`{a}`): two calls collapsed into one"
                    ));
                }
                (Some(_), Some(_)) => {}
                (None, _) => {
                    return presentation(format!(
                        "expected a new operation with its own handle, got no handle ({})",
                        describe(r, &pointers.error)
                    ));
                }
                (Some(_), None) => {
                    return presentation(format!("step `{other}` has no handle to compare with"));
                }
            }
        }
        match cosmetic {
            Some(c) => Err(StepError::Cosmetic(c)),
            None => Ok(()),
        }
    }

    /// Checks the ledger expectations of a step without a response.
    pub(super) fn check_ledger(&self, expect: &Expect) -> StepResult {
        self.check_ledger_with(expect, None)
    }

    /// Checks the ledger expectations of `expect` (`charge_in_ledger` reads `response`).
    pub(super) fn check_ledger_with(
        &self,
        expect: &Expect,
        response: Option<&Response>,
    ) -> StepResult {
        if !expect.needs_ledger() {
            return Ok(());
        }
        let provider = self.provider.expect("checked by not_runnable");
        let ledger_error = |e: LedgerReadError| {
            StepError::Error(format!("reading the runner's ledger failed: {}", e.source))
        };
        let charges = provider.charge_count().map_err(ledger_error)? - self.baseline;
        let tally = self.tally(charges);
        self.check_charges(expect, tally)?;
        self.check_dispatches(expect, tally)?;
        if expect.charge_in_ledger == Some(true) {
            let pointer_at = &self.profile.pointers.charge_id;
            let Some(charge) = response.and_then(|r| pointer_str(r, pointer_at)) else {
                return fail(format!("no charge id at `{pointer_at}` in the result"));
            };
            let ids = provider.charge_ids().map_err(ledger_error)?;
            if !ids.contains(&charge) {
                return fail(format!(
                    "the result's charge id `{charge}` is not a charge the {} recorded",
                    provider.role().name()
                ));
            }
        }
        if expect.provider_keys_not_private == Some(true) {
            let prefix = &self.profile.private_key_prefix;
            if let Some(key) = provider
                .hooks()
                .keys_seen()
                .iter()
                .find(|k| k.contains(prefix.as_str()))
            {
                return fail(format!(
                    "the {} received the private operation key as its idempotency key (`{}`)",
                    provider.role().name(),
                    clip(key, 40)
                ));
            }
        }
        if expect.provider_one_key == Some(true) {
            let mut keys = provider.hooks().keys_seen();
            keys.sort();
            keys.dedup();
            if keys.len() > 1 {
                return fail(format!(
                    "the {} received {} different idempotency keys for one operation: a redelivery must continue the same operation under the same key",
                    provider.role().name(),
                    keys.len()
                ));
            }
        }
        Ok(())
    }

    /// No byte of any message the router sent may contain the private key prefix.
    pub(super) fn scan(&self, response: &Response) -> StepResult {
        let prefix = &self.profile.private_key_prefix;
        let unmatched = self
            .router
            .as_ref()
            .map(|r| r.conn.take_unmatched())
            .unwrap_or_default();
        for raw in std::iter::once(&response.raw).chain(unmatched.iter()) {
            if let Some(at) = raw.find(prefix.as_str()) {
                return fail(format!(
                    "a response contains the private key pattern `{prefix}` (`{}`…): the key must never reach the agent",
                    cut(&raw[at..], prefix.len() + 24)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identity_properties_are_found_at_any_depth() {
        let cases = [
            (
                json!({"type": "object", "properties": {"prompt": {"type": "string"}}}),
                None,
            ),
            (
                json!({"properties": {"prompt": {}, "callId": {}}}),
                Some("/callId"),
            ),
            (
                json!({"properties": {"options": {"properties": {"idempotency_key": {}}}}}),
                Some("/options/idempotency_key"),
            ),
            (
                json!({"properties": {"layers": {"items": {"properties": {"tool_use_id": {}}}}}}),
                Some("/layers/tool_use_id"),
            ),
            (
                json!({"$defs": {"x": {"properties": {"_meta": {}}}}}),
                Some("/_meta"),
            ),
            (
                json!({"required": ["operation_key"]}),
                Some("/operation_key"),
            ),
        ];
        for (schema, want) in cases {
            assert_eq!(identity_property(&schema, "").as_deref(), want, "{schema}");
        }
    }

    #[test]
    fn first_difference_names_the_path() {
        let a = json!({"handle": "h", "result": {"charge_id": "c1", "n": [1, 2]}});
        let b = json!({"handle": "h", "result": {"charge_id": "c2", "n": [1, 2]}});
        assert_eq!(
            first_difference(&a, &b, ""),
            "at `/result/charge_id`: `\"c1\"` became `\"c2\"`"
        );
        let c = json!({"handle": "h", "result": {"charge_id": "c1", "n": [1, 2]}, "x": 1});
        assert_eq!(first_difference(&a, &c, ""), "at `/x`: unexpected");
    }
}
