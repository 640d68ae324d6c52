//! Reads the ID stability findings out of a probe shape log.
//!
//! The scripted endpoint chose the model's tool-call ids, so their digests are known: the
//! probe's digest of each `tools/call`'s per-call ID says whether the client copied the model's
//! id, made its own, repeated one, or sent a call again. Only digests are compared; the log holds
//! no value to compare. When no call carries a per-call ID, the findings count calls instead: a
//! second call, or a call sent again, is then one that no server can tell from a new call.

use crate::identity;
use crate::matrix::data::{DistinctIds, DuplicateModelId, IdOrigin, OnFailure};
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
                id_digest: entry.map(|e| e.value.digest.clone()),
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
}
