//! Reads the ID stability findings out of a probe shape log.
//!
//! The scripted endpoint chose the model's tool-call ids, so their digests are known: the
//! probe's digest of each `tools/call`'s per-call ID says whether the client copied the model's
//! id, made its own, repeated one, or sent a call again. Only digests are compared; the log holds
//! no value to compare. When no call carries a per-call ID, the findings count calls instead: a
//! second call, or a call sent again, is then one that no server can tell from a new call.

use crate::identity;
use crate::matrix::data::{DistinctIds, DuplicateModelId, IdOrigin, OnFailure, OneAnswer};
use crate::probe::record::{Kind, Record};
use crate::shape::Digester;
use serde_json::Value;

/// One `tools/call` as the probe recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSeen {
    /// The `_meta` key of the per-call ID, if the call had exactly one identity source.
    pub source_key: Option<String>,
    /// Digest of the per-call ID's value.
    pub id_digest: Option<String>,
    /// The probe's digest of the tool name and arguments (tells which call this was).
    pub request_digest: Option<String>,
}

/// Every `tools/call` request in `records`, in log order.
pub fn tool_calls(records: &[Record]) -> Vec<CallSeen> {
    records
        .iter()
        .filter(|r| r.kind == Kind::Request && r.method.as_deref() == Some("tools/call"))
        .map(|r| {
            let entry = r.meta.as_ref().and_then(|m| m.shape()).and_then(|shape| {
                let mut sources = shape.entries.iter().filter(|e| e.identity_source.is_some());
                match (sources.next(), sources.next()) {
                    (Some(one), None) => Some(one),
                    _ => None,
                }
            });
            CallSeen {
                source_key: entry.and_then(|e| {
                    e.identity_source
                        .map(identity::Source::key)
                        .map(str::to_owned)
                }),
                id_digest: entry.map(|e| e.value.digest.to_string()),
                request_digest: r.request_digest.clone(),
            }
        })
        .collect()
}

/// The probe's (unsalted) digest of a per-call ID value.
pub fn digest_of_id(id: &str) -> String {
    Digester::Plain.value(&Value::String(id.to_owned()))
}

/// The digests of the per-call IDs the calls carried, in call order (a call without one left
/// out).
fn id_digests(calls: &[CallSeen]) -> Vec<&str> {
    calls
        .iter()
        .filter_map(|c| c.id_digest.as_deref())
        .collect()
}

/// Whether the per-call IDs are the model's own tool-call ids (`model_ids`, in call order).
pub fn id_origin(calls: &[CallSeen], model_ids: &[String]) -> IdOrigin {
    let digests = id_digests(calls);
    if digests.is_empty() {
        return if calls.is_empty() {
            IdOrigin::NotMeasured
        } else {
            IdOrigin::NoId
        };
    }
    let model: Vec<String> = model_ids.iter().map(|id| digest_of_id(id)).collect();
    if digests.iter().all(|d| model.iter().any(|m| m == d)) {
        IdOrigin::CopiedFromModel
    } else {
        IdOrigin::ClientGenerated
    }
}

/// (a) from a run with two distinct model tool calls.
pub fn distinct_ids(calls: &[CallSeen]) -> DistinctIds {
    let digests = id_digests(calls);
    match digests.as_slice() {
        [a, b, ..] if a != b => DistinctIds::Distinct,
        [_, _, ..] => DistinctIds::Repeated,
        [] if calls.len() >= 2 => DistinctIds::NoId,
        _ => DistinctIds::NotMeasured,
    }
}

/// (b) from a run where the model returned the same tool-call id twice.
pub fn duplicate_model_id(calls: &[CallSeen]) -> DuplicateModelId {
    let digests = id_digests(calls);
    match digests.as_slice() {
        [] => match calls.len() {
            0 => DuplicateModelId::NotMeasured,
            1 => DuplicateModelId::Dropped,
            _ => DuplicateModelId::SentWithoutId,
        },
        [_] => DuplicateModelId::Dropped,
        [a, b, ..] if a == b => DuplicateModelId::PassedThrough,
        _ => DuplicateModelId::MadeDistinct,
    }
}

/// The probe's (unsalted) request digest of a call to its tool with `arguments`.
pub fn digest_of_arguments(arguments: &Value) -> String {
    let hash = crate::canonical::request_hash(crate::probe::server::CAPABILITIES_TOOL, arguments)
        .expect("scripted arguments are canonical JSON");
    Digester::Plain.bytes(hash.as_str().as_bytes())
}

/// (d) and (e) from a run whose one model answer held two tool calls, with `arguments` (the
/// first's, then the second's).
pub fn one_answer(calls: &[CallSeen], arguments: &[Value]) -> OneAnswer {
    // Which scripted call a call was, by its arguments.
    let which = |call: &CallSeen| {
        arguments
            .iter()
            .position(|a| call.request_digest.as_deref() == Some(&digest_of_arguments(a)))
    };
    let both = |a: &CallSeen, b: &CallSeen| match (a.id_digest.as_deref(), b.id_digest.as_deref()) {
        (Some(x), Some(y)) if x == y => OneAnswer::BothSharedId,
        (Some(_), Some(_)) => OneAnswer::BothOwnIds,
        _ => OneAnswer::BothWithoutId,
    };
    match calls {
        [] => OneAnswer::Neither,
        [one] => match which(one) {
            Some(0) => OneAnswer::OnlyFirst,
            Some(1) => OneAnswer::OnlySecond,
            _ => OneAnswer::OnlyOne,
        },
        [a, b] if a.request_digest.is_some() && a.request_digest == b.request_digest => {
            match which(a) {
                Some(0) => OneAnswer::FirstTwice,
                Some(1) => OneAnswer::SecondTwice,
                _ => both(a, b),
            }
        }
        [a, b] => both(a, b),
        [_, _, _] => OneAnswer::BothThenAThird,
        _ => OneAnswer::BothThenMore,
    }
}

/// (c) from a run where the server was frozen (or killed) during the first call.
pub fn on_timeout(calls: &[CallSeen]) -> OnFailure {
    let digests = id_digests(calls);
    match digests.as_slice() {
        [] => match calls.len() {
            0 => OnFailure::NotMeasured,
            1 => OnFailure::NoRetry,
            _ => OnFailure::RetriedWithoutId,
        },
        [_] => OnFailure::NoRetry,
        [first, rest @ ..] if rest.iter().all(|d| d == first) => OnFailure::RetriedSameId,
        _ => OnFailure::RetriedNewId,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(d: &str) -> CallSeen {
        CallSeen {
            source_key: Some("callId".into()),
            id_digest: Some(d.into()),
            request_digest: None,
        }
    }

    #[test]
    fn findings_table() {
        let a = || call("aaaaaaaaaaaa");
        let b = || call("bbbbbbbbbbbb");
        assert_eq!(distinct_ids(&[a(), b()]), DistinctIds::Distinct);
        assert_eq!(distinct_ids(&[a(), a()]), DistinctIds::Repeated);
        assert_eq!(distinct_ids(&[a()]), DistinctIds::NotMeasured);
        assert_eq!(
            duplicate_model_id(&[a(), a()]),
            DuplicateModelId::PassedThrough
        );
        assert_eq!(
            duplicate_model_id(&[a(), b()]),
            DuplicateModelId::MadeDistinct
        );
        assert_eq!(duplicate_model_id(&[a()]), DuplicateModelId::Dropped);
        assert_eq!(duplicate_model_id(&[]), DuplicateModelId::NotMeasured);
        assert_eq!(on_timeout(&[a()]), OnFailure::NoRetry);
        assert_eq!(on_timeout(&[a(), a()]), OnFailure::RetriedSameId);
        assert_eq!(on_timeout(&[a(), b()]), OnFailure::RetriedNewId);
        let model = vec!["call_x".to_string()];
        let copied = call(&digest_of_id("call_x"));
        assert_eq!(id_origin(&[copied], &model), IdOrigin::CopiedFromModel);
        assert_eq!(id_origin(&[a()], &model), IdOrigin::ClientGenerated);
        assert_eq!(id_origin(&[], &model), IdOrigin::NotMeasured);
    }

    #[test]
    fn calls_without_an_id_are_counted() {
        let none = || CallSeen {
            source_key: None,
            id_digest: None,
            request_digest: None,
        };
        let model = vec!["call_x".to_string()];
        assert_eq!(id_origin(&[none()], &model), IdOrigin::NoId);
        assert_eq!(distinct_ids(&[none(), none()]), DistinctIds::NoId);
        assert_eq!(distinct_ids(&[none()]), DistinctIds::NotMeasured);
        assert_eq!(duplicate_model_id(&[none()]), DuplicateModelId::Dropped);
        assert_eq!(
            duplicate_model_id(&[none(), none()]),
            DuplicateModelId::SentWithoutId
        );
        assert_eq!(on_timeout(&[none()]), OnFailure::NoRetry);
        assert_eq!(on_timeout(&[none(), none()]), OnFailure::RetriedWithoutId);
        assert_eq!(on_timeout(&[]), OnFailure::NotMeasured);
    }

    #[test]
    fn one_answer_findings_table() {
        let args = [
            serde_json::json!({"note": "first"}),
            serde_json::json!({"note": "second"}),
        ];
        let with = |id: Option<&str>, args: &Value| CallSeen {
            source_key: id.map(|_| "callId".into()),
            id_digest: id.map(str::to_owned),
            request_digest: Some(digest_of_arguments(args)),
        };
        let first = |id| with(id, &args[0]);
        let second = |id| with(id, &args[1]);
        let other = with(None, &serde_json::json!({}));
        let cases = [
            (vec![], OneAnswer::Neither),
            (vec![first(None)], OneAnswer::OnlyFirst),
            (vec![second(Some("a"))], OneAnswer::OnlySecond),
            (vec![other.clone()], OneAnswer::OnlyOne),
            (
                vec![first(Some("a")), second(Some("b"))],
                OneAnswer::BothOwnIds,
            ),
            (
                vec![first(Some("a")), second(Some("a"))],
                OneAnswer::BothSharedId,
            ),
            (vec![first(None), second(None)], OneAnswer::BothWithoutId),
            (vec![first(None), first(None)], OneAnswer::FirstTwice),
            (
                vec![second(Some("a")), second(Some("a"))],
                OneAnswer::SecondTwice,
            ),
            (
                vec![first(Some("a")), second(None)],
                OneAnswer::BothWithoutId,
            ),
            (
                vec![first(None), second(None), other.clone()],
                OneAnswer::BothThenAThird,
            ),
            (
                vec![first(None), second(None), other.clone(), other],
                OneAnswer::BothThenMore,
            ),
        ];
        for (calls, want) in cases {
            assert_eq!(one_answer(&calls, &args), want, "{calls:?}");
        }
    }
}
