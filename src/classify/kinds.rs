//! Call IDs, per-attempt values and context told apart: [`key_kinds`] judges each top-level
//! `_meta` key of one client from the runs it was recorded in, and says which evidence each
//! verdict rests on ([`KeyKind`]).
//!
//! # Which records are the same call
//! A log alone cannot show a redelivery: two `tools/call` records with the same
//! `request_digest` are either one call sent twice or a new call with the same arguments (the
//! measured two-calls run sends `capabilities {}` twice: two calls, one request digest). So what
//! is the same call comes from what the run knows ([`RunKind`]):
//! - a [`RunKind::OneCall`] run is one where the scripted model asked for exactly one tool call
//!   and the server then failed it: the measured timeout and server-dies runs (evidence files
//!   ending in `.timeout.jsonl` and `.server-dies.jsonl`, which is how `classify` and the matrix
//!   recognise them). Every `tools/call` there with the same tool and request digest is a
//!   delivery of that one call; each after the first is the client's redelivery.
//! - a [`RunKind::DistinctCalls`] run is any other log: each `tools/call` is taken as a distinct
//!   call (the assumption the call-level / context split makes), and no redelivery is known.
//! - the duplicate-id run and the two one-answer runs are left out ([`RunKind::of_file`] gives
//!   `None`): their calls share the model's tool-call id on purpose, or may be dropped or
//!   repeated by a client that mishandles two calls in one answer.
//!
//! Calls are compared only within a run: runs are separate conversations against a scripted
//! endpoint that replays the same values, so equality across runs proves nothing.
//!
//! # The kinds, in the order they are decided
//! | kind | rests on |
//! |---|---|
//! | `per_attempt` | its value changed on at least one redelivery: a retry carries a new value, so it can never deduplicate (Gemini CLI's `progressToken`, a fresh UUID per attempt, or a counter) |
//! | `context` | the same value on two distinct calls of one run: shared by the conversation |
//! | `call_id` | distinct on every pair of distinct calls and the same on every redelivery, with at least one of each |
//! | `unknown` | too little evidence: distinct across calls but the client never retried (a call ID cannot be told from a per-attempt value without a redelivery), or fewer than two calls |

use super::runs::Scenario;
use crate::probe::record::{Kind, Record};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// What a run knows about which of its calls are the same call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// Each `tools/call` is a distinct call.
    DistinctCalls,
    /// The model asked for one tool call: records with the same tool and request digest are its
    /// deliveries.
    OneCall,
}

impl RunKind {
    /// The kind of a log from its file name (the names `callid measure` writes); `None` for a
    /// duplicate-id run, which is left out.
    pub fn of_file(path: &std::path::Path) -> Option<RunKind> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match Scenario::of_file(name) {
            Scenario::DuplicateModelId | Scenario::OneAnswerTwoIds | Scenario::OneAnswerSameId => {
                None
            }
            Scenario::Timeout | Scenario::ServerDies => Some(RunKind::OneCall),
            Scenario::TwoCalls => Some(RunKind::DistinctCalls),
        }
    }
}

/// The kind of a `_meta` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// Stable across a redelivery and distinct across calls.
    CallId,
    /// Changed on a redelivery.
    PerAttempt,
    /// Shared by distinct calls of one conversation.
    Context,
    /// Not enough evidence.
    Unknown,
}

impl ValueKind {
    /// Name as shown.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::CallId => "call ID",
            ValueKind::PerAttempt => "per-attempt value",
            ValueKind::Context => "context",
            ValueKind::Unknown => "unknown",
        }
    }
}

/// One top-level key's kind and the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyKind {
    /// The `_meta` key.
    pub key: String,
    /// Its kind.
    pub kind: ValueKind,
    /// Redeliveries (pairs of deliveries of one call) that carried it.
    pub redeliveries: usize,
    /// Of those, how many changed its value.
    pub changed_on_redelivery: usize,
    /// Pairs of distinct calls of one run that carried it.
    pub distinct_call_pairs: usize,
    /// Of those, how many carried the same value.
    pub same_on_distinct_calls: usize,
    /// The evidence, in words.
    pub evidence: String,
}

/// The kinds of every top-level key in `runs` (one client's records per run), in order of first
/// appearance.
pub fn key_kinds(runs: &[(RunKind, Vec<&Record>)]) -> Vec<KeyKind> {
    let mut order: Vec<String> = Vec::new();
    let mut tallies: HashMap<String, [usize; 4]> = HashMap::new();
    for (kind, records) in runs {
        let calls: Vec<(&Record, Vec<(String, &str)>)> = records
            .iter()
            .copied()
            .filter(|r| r.kind == Kind::Request && r.method.as_deref() == Some("tools/call"))
            .map(|r| (r, top_level(r)))
            .collect();
        for (_, keys) in &calls {
            for (k, _) in keys {
                if !order.iter().any(|o| o == k) {
                    order.push(k.clone());
                }
            }
        }
        let calls: Vec<(&Record, HashMap<String, &str>)> = calls
            .into_iter()
            .map(|(r, keys)| (r, keys.into_iter().collect()))
            .collect();
        for (i, (a, ka)) in calls.iter().enumerate() {
            for (b, kb) in &calls[i + 1..] {
                let same_call = *kind == RunKind::OneCall
                    && a.tool == b.tool
                    && a.request_digest.is_some()
                    && a.request_digest == b.request_digest;
                // Redeliveries are compared delivery to the next one only, so n deliveries are
                // n - 1 redeliveries.
                if same_call && !is_next_delivery(&calls, i, b) {
                    continue;
                }
                let keys: BTreeSet<&String> = ka.keys().chain(kb.keys()).collect();
                for key in keys {
                    let t = tallies.entry(key.clone()).or_default();
                    let differs = ka.get(key) != kb.get(key);
                    if same_call {
                        t[0] += 1;
                        t[1] += usize::from(differs);
                    } else {
                        t[2] += 1;
                        t[3] += usize::from(!differs);
                    }
                }
            }
        }
    }
    order
        .into_iter()
        .map(|key| {
            let [redeliveries, changed, pairs, same] =
                tallies.get(&key).copied().unwrap_or_default();
            let (kind, evidence) = judge(redeliveries, changed, pairs, same);
            KeyKind {
                key,
                kind,
                redeliveries,
                changed_on_redelivery: changed,
                distinct_call_pairs: pairs,
                same_on_distinct_calls: same,
                evidence,
            }
        })
        .collect()
}

/// Whether `b` is the delivery right after `calls[i]` among the deliveries of the same call.
fn is_next_delivery(calls: &[(&Record, HashMap<String, &str>)], i: usize, b: &Record) -> bool {
    let a = calls[i].0;
    calls[i + 1..]
        .iter()
        .map(|(r, _)| *r)
        .find(|r| r.tool == a.tool && r.request_digest == a.request_digest)
        .is_some_and(|next| std::ptr::eq(next, b))
}

fn judge(redeliveries: usize, changed: usize, pairs: usize, same: usize) -> (ValueKind, String) {
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let redel = plural(redeliveries, "redelivery", "redeliveries");
    let calls = plural(pairs, "pair of distinct calls", "pairs of distinct calls");
    if changed > 0 {
        return (
            ValueKind::PerAttempt,
            format!(
                "changed on {changed} of {redel}: a retry carries a new value, so it can never \
                 deduplicate"
            ),
        );
    }
    if same > 0 {
        return (
            ValueKind::Context,
            format!("the same on {same} of {calls}: shared by the conversation"),
        );
    }
    match (pairs, redeliveries) {
        (0, 0) => (
            ValueKind::Unknown,
            "seen on fewer than two calls, and never redelivered".into(),
        ),
        (0, _) => (
            ValueKind::Unknown,
            format!("the same on {redel}, but never compared across distinct calls"),
        ),
        (_, 0) => (
            ValueKind::Unknown,
            format!(
                "distinct on {calls}, but no redelivery was recorded (the client did not retry), \
                 so a call ID cannot be told from a per-attempt value"
            ),
        ),
        _ => (
            ValueKind::CallId,
            format!("distinct on {calls} and the same on {redel}"),
        ),
    }
}

/// Top-level `_meta` keys of a record and their digests, in the record's order.
fn top_level(r: &Record) -> Vec<(String, &str)> {
    r.meta_shape()
        .map(|s| {
            s.entries
                .iter()
                .filter(|e| e.valid_key.is_some())
                .map(|e| {
                    (
                        super::pointer::pointer_key(&e.path),
                        e.value.digest.as_str(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{RecordContext, Transport, record_for_request};
    use crate::shape::Digester;
    use serde_json::{Value, json};

    /// A run of `capabilities {}` calls (one request digest for all), each with `meta`.
    fn run(metas: &[Value]) -> Vec<Record> {
        let ctx = RecordContext::new(Transport::Stdio);
        metas
            .iter()
            .enumerate()
            .map(|(i, meta)| {
                record_for_request(
                    "tools/call",
                    Some(&json!(i)),
                    Some(&json!({"name": "capabilities", "arguments": {}, "_meta": meta})),
                    1,
                    &ctx,
                    &Digester::Plain,
                )
            })
            .collect()
    }

    fn kinds(runs: &[(RunKind, Vec<Record>)]) -> Vec<(String, ValueKind)> {
        let runs: Vec<(RunKind, Vec<&Record>)> =
            runs.iter().map(|(k, r)| (*k, r.iter().collect())).collect();
        key_kinds(&runs)
            .into_iter()
            .map(|k| (k.key, k.kind))
            .collect()
    }

    fn kind_of(all: &[(String, ValueKind)], key: &str) -> ValueKind {
        all.iter().find(|(k, _)| k == key).unwrap().1
    }

    #[test]
    fn each_kind_from_the_runs_that_show_it() {
        // Two distinct calls, then a timeout run where the client retried its one call.
        let two_calls = run(&[
            json!({"callId": "c1", "progressToken": "u1", "sessionId": "s", "seq": 1}),
            json!({"callId": "c2", "progressToken": "u2", "sessionId": "s", "seq": 2}),
        ]);
        let timeout = run(&[
            json!({"callId": "c9", "progressToken": "u3", "sessionId": "t", "seq": 1}),
            json!({"callId": "c9", "progressToken": "u4", "sessionId": "t", "seq": 2}),
        ]);
        let all = kinds(&[
            (RunKind::DistinctCalls, two_calls.clone()),
            (RunKind::OneCall, timeout.clone()),
        ]);
        assert_eq!(kind_of(&all, "callId"), ValueKind::CallId);
        assert_eq!(kind_of(&all, "progressToken"), ValueKind::PerAttempt);
        assert_eq!(kind_of(&all, "seq"), ValueKind::PerAttempt, "a counter");
        assert_eq!(kind_of(&all, "sessionId"), ValueKind::Context);

        // Without a redelivery a call ID cannot be told from a per-attempt value.
        let no_retry = run(&[json!({"callId": "c9", "progressToken": "u3"})]);
        let all = kinds(&[
            (RunKind::DistinctCalls, two_calls.clone()),
            (RunKind::OneCall, no_retry),
        ]);
        assert_eq!(kind_of(&all, "callId"), ValueKind::Unknown);
        assert_eq!(kind_of(&all, "progressToken"), ValueKind::Unknown);

        // The same two records in a run that does not mark redeliveries are two calls: a key
        // that stayed the same is context, not a call ID.
        let all = kinds(&[(RunKind::DistinctCalls, timeout.clone())]);
        assert_eq!(kind_of(&all, "callId"), ValueKind::Context);

        // A call ID that changes on a retry is per attempt, whatever else it does.
        let new_id_on_retry = run(&[json!({"callId": "a"}), json!({"callId": "b"})]);
        let all = kinds(&[(RunKind::OneCall, new_id_on_retry)]);
        assert_eq!(kind_of(&all, "callId"), ValueKind::PerAttempt);

        // A key that appears only on the retry changed on it.
        let appears = run(&[json!({"x": 1}), json!({"x": 1, "retry": true})]);
        let all = kinds(&[(RunKind::OneCall, appears)]);
        assert_eq!(kind_of(&all, "retry"), ValueKind::PerAttempt);
        assert_eq!(kind_of(&all, "x"), ValueKind::Unknown);
    }

    #[test]
    fn protocol_keys_of_2026_07_28_are_context_and_the_json_rpc_id_never_counts() {
        // Under MCP 2026-07-28 every request carries the protocol keys, and a retry carries a new
        // JSON-RPC id (`run` gives each record its own): neither makes a key per attempt.
        let proto = |call: &str| {
            json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
                "callId": call,
            })
        };
        let two_calls = run(&[proto("c1"), proto("c2")]);
        let retried = run(&[proto("c9"), proto("c9")]);
        assert_ne!(
            retried[0].id, retried[1].id,
            "the retry has a new JSON-RPC id"
        );
        let all = kinds(&[
            (RunKind::DistinctCalls, two_calls),
            (RunKind::OneCall, retried),
        ]);
        assert_eq!(kind_of(&all, "callId"), ValueKind::CallId);
        for key in [
            "io.modelcontextprotocol/protocolVersion",
            "io.modelcontextprotocol/clientInfo",
            "io.modelcontextprotocol/clientCapabilities",
        ] {
            assert_eq!(kind_of(&all, key), ValueKind::Context, "{key}");
        }
    }

    #[test]
    fn deliveries_are_compared_in_sequence_and_runs_never_across() {
        // Three deliveries of one call: two redeliveries, not three pairs.
        let three = run(&[json!({"k": "a"}), json!({"k": "a"}), json!({"k": "a"})]);
        let runs = [(RunKind::OneCall, three.iter().collect::<Vec<_>>())];
        let k = &key_kinds(&runs)[0];
        assert_eq!((k.redeliveries, k.changed_on_redelivery), (2, 0));
        // Equal values in two separate runs prove nothing: no pair across runs.
        let a = run(&[json!({"k": "same"})]);
        let b = run(&[json!({"k": "same"})]);
        let runs = [
            (RunKind::DistinctCalls, a.iter().collect::<Vec<_>>()),
            (RunKind::DistinctCalls, b.iter().collect::<Vec<_>>()),
        ];
        let k = &key_kinds(&runs)[0];
        assert_eq!((k.distinct_call_pairs, k.kind), (0, ValueKind::Unknown));
    }

    #[test]
    fn run_kinds_from_file_names() {
        use std::path::Path;
        assert_eq!(
            RunKind::of_file(Path::new("m/gemini-0.1.timeout.jsonl")),
            Some(RunKind::OneCall)
        );
        assert_eq!(
            RunKind::of_file(Path::new("gemini-0.1.server-dies.jsonl")),
            Some(RunKind::OneCall)
        );
        assert_eq!(
            RunKind::of_file(Path::new("gemini-0.1.duplicate-id.jsonl")),
            None
        );
        assert_eq!(
            RunKind::of_file(Path::new("probe.log")),
            Some(RunKind::DistinctCalls)
        );
    }

    #[test]
    fn evidence_snapshot() {
        let cases = [
            (1, 1, 1, 0),
            (2, 1, 0, 0),
            (0, 0, 1, 1),
            (1, 0, 3, 2),
            (1, 0, 1, 0),
            (2, 0, 3, 0),
            (0, 0, 1, 0),
            (1, 0, 0, 0),
            (0, 0, 0, 0),
        ];
        let text: String = cases
            .iter()
            .map(|&(r, c, p, s)| {
                let (kind, evidence) = judge(r, c, p, s);
                format!("{r} {c} {p} {s}: {}: {evidence}\n", kind.name())
            })
            .collect();
        insta::assert_snapshot!(text);
    }
}
