//! From records to one [`ClientVerdict`] per client: the analysis behind `callid classify`.
//!
//! # Rules
//! - Records are grouped by client `(name, version)`. A record without a client (a malformed
//!   line before `initialize`) joins the client of its connection, when that connection named
//!   one; otherwise it is counted under an unnamed client.
//! - The verdict comes from the identity verdicts the probe recorded for each `tools/call`, which
//!   are [`crate::identity::from_meta`]'s, so the code and message are the router's own:
//!   `accepted` when every call was accepted; `rejected` with the first rejected call's code and
//!   message when any call was (one unusable call is enough to fail closed); `unknown` when no
//!   `tools/call` was recorded.
//! - Call-level versus context keys: across the client's `tools/call` records, a top-level `_meta`
//!   key whose digest (or presence) changes between calls is call-level, one whose digest is the
//!   same on every call is context. From a single call nothing can be told apart: every key is
//!   listed as `unknown_keys` and `key_split` says `unknown`.
//! - Call ID, per-attempt value or context, per key: [`classify_runs`] adds each client's
//!   [`super::kinds`] when the input holds a run that knows its redeliveries (a timeout or
//!   server-dies log); the call-level / context split above stays as it is.
//! - Per-call IDs: the digests of the accepted source key across accepted calls; distinct when
//!   no digest repeats. A digest that repeats with the same request digest is a redelivery; with
//!   a different request digest it is a reused ID, which the router refuses.
//!
//! - Identity sources beyond the built-in table ([`classify_with`], `--identity-sources`): each
//!   `tools/call` is judged again from its recorded `_meta` shape, by the same rules. A call
//!   that carries one of the table's extra keys and no other source is accepted when the value
//!   is a string of 1 to `max_bytes` bytes (its white space and control characters were checked
//!   by no one: the shape records only type, length and digest, so the router's own check still
//!   applies); a call that carries two or more sources is `ambiguous_identity`; a call that
//!   carries none of the extra keys keeps the verdict the probe recorded.
//!
//! Digests are only comparable within one digest scheme and salt: combine logs written with the
//! same `--digest-salt` (or none).

use super::kinds::RunKind;
use super::pointer::{key_pointer, pointer_key};
use crate::probe::read::shown_path;
pub use crate::probe::read::{BadLine, ReadError as ClassifyError, read_logs};
use crate::probe::record::{IdentityVerdict, Kind, Record};
use crate::shape::JsonType;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// A client, as it names itself (`None` when it never did).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ClientName {
    /// `clientInfo.name`.
    pub name: Option<String>,
    /// `clientInfo.version`.
    pub version: Option<String>,
}

impl std::fmt::Display for ClientName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.name, &self.version) {
            (Some(n), Some(v)) if !v.is_empty() => write!(f, "{n} {v}"),
            (Some(n), _) => f.write_str(n),
            (None, _) => f.write_str("(unnamed client)"),
        }
    }
}

/// The verdict for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every recorded `tools/call` carried a trusted per-call identity.
    Accepted,
    /// At least one `tools/call` had no usable identity.
    Rejected,
    /// No `tools/call` was recorded.
    Unknown,
}

impl Verdict {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
            Verdict::Unknown => "unknown",
        }
    }
}

/// Whether call-level and context keys could be told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySplit {
    /// Inferred from two or more calls.
    Inferred,
    /// Fewer than two calls: no split is claimed.
    Unknown,
}

/// How one key behaved across calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyClass {
    /// Its value changed between calls.
    CallLevel,
    /// Its value was the same on every call.
    Context,
    /// Seen on fewer than two calls, or only outside `tools/call`.
    Unknown,
}

/// One `_meta` key path across a client's records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeySummary {
    /// JSON pointer from `_meta` (top-level keys are `/name`).
    pub path: String,
    /// The key name for top-level keys (pointer unescaped), `None` for nested paths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// JSON types seen.
    pub types: Vec<JsonType>,
    /// Smallest length seen (strings: bytes; arrays: items; objects: keys).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub len_min: Option<usize>,
    /// Largest length seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub len_max: Option<usize>,
    /// Requests (any method) that carried it.
    pub requests: usize,
    /// `tools/call` requests that carried it.
    pub calls: usize,
    /// Distinct digests across those calls.
    pub distinct_values: usize,
    /// Call-level, context or unknown.
    pub class: KeyClass,
}

/// Per-call ID behaviour across accepted calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PerCallIds {
    /// Accepted calls.
    pub calls: usize,
    /// Distinct ID digests among them.
    pub distinct: usize,
    /// Whether no ID repeated.
    pub all_distinct: bool,
    /// IDs that repeated with the same request digest (redeliveries).
    pub redelivered: usize,
    /// IDs that repeated with a different request digest (the router refuses these).
    pub reused_with_different_request: usize,
}

/// JSON-RPC ids of the client's `tools/call` requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JsonRpcIds {
    /// Types seen.
    pub types: Vec<JsonType>,
    /// Distinct id digests.
    pub distinct: usize,
    /// Calls.
    pub calls: usize,
}

/// How often a method was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MethodCount {
    /// The method.
    pub method: String,
    /// Messages.
    pub count: usize,
}

/// One client's verdict and the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientVerdict {
    /// The client.
    pub client: ClientName,
    /// The verdict.
    pub verdict: Verdict,
    /// Platform of the accepted identity (`codex`, `claude-code`, ...), or `None`.
    pub source: Option<String>,
    /// The `_meta` key the identity came from, or `None`.
    pub source_key: Option<String>,
    /// Identity error code when rejected (`missing_identity`, ...), `no_tool_calls` when unknown.
    pub reason: Option<String>,
    /// The message that goes with `reason`, as the router gives it.
    pub reason_message: Option<String>,
    /// Whether the key split was inferred.
    pub key_split: KeySplit,
    /// Top-level keys whose value changed between calls (the source key included).
    pub call_level_keys: Vec<String>,
    /// Top-level keys whose value was the same on every call.
    pub context_keys: Vec<String>,
    /// Top-level keys that could not be classified.
    pub unknown_keys: Vec<String>,
    /// `tools/call` requests recorded.
    pub calls: usize,
    /// Of those, calls with an accepted identity.
    pub calls_accepted: usize,
    /// Per-call ID behaviour (`None` when no call was accepted).
    pub per_call_ids: Option<PerCallIds>,
    /// JSON-RPC ids of the calls.
    pub jsonrpc_ids: JsonRpcIds,
    /// Protocol versions seen.
    pub protocol_versions: Vec<String>,
    /// Methods seen, in order of first appearance.
    pub methods: Vec<MethodCount>,
    /// Malformed or oversize messages.
    pub bad_messages: usize,
    /// Connections (or HTTP sessions) seen.
    pub connections: usize,
    /// Every `_meta` key path seen, in order of first appearance.
    pub keys: Vec<KeySummary>,
    /// Call ID, per-attempt value or context, per top-level key, with the evidence; only when
    /// the input holds a run that knows its redeliveries (see [`super::kinds`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub key_kinds: Vec<super::kinds::KeyKind>,
}

/// One log file: its records, and what the run knows about its calls (from the file's name,
/// [`RunKind::of_file`]; `None` leaves it out of [`super::kinds`]).
#[derive(Debug, Clone)]
pub struct Run {
    /// What the run knows.
    pub kind: Option<RunKind>,
    /// Its records.
    pub records: Vec<Record>,
}

/// Reads each log as a [`Run`]: every record, and every line that is not one (skipped, with its
/// place). Fails only when no log holds a record.
pub fn read_runs(paths: &[PathBuf]) -> Result<(Vec<Run>, Vec<BadLine>), ClassifyError> {
    let mut runs = Vec::new();
    let mut bad = Vec::new();
    for path in paths {
        match read_logs(std::slice::from_ref(path)) {
            Ok((records, skipped)) => {
                bad.extend(skipped);
                runs.push(Run {
                    kind: RunKind::of_file(path),
                    records,
                });
            }
            Err(ClassifyError::NoRecords { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if runs.is_empty() {
        return Err(ClassifyError::NoRecords {
            paths: paths.iter().map(|p| shown_path(p)).collect(),
        });
    }
    Ok((runs, bad))
}

/// [`classify_with`] over every run's records, then each client's key kinds from the runs (see
/// [`super::kinds`]).
pub fn classify_runs(
    runs: &[Run],
    sources: &crate::identity::IdentitySources,
) -> Vec<ClientVerdict> {
    let all: Vec<Record> = runs
        .iter()
        .flat_map(|r| r.records.iter().cloned())
        .collect();
    let mut verdicts = classify_with(&all, sources);
    for v in &mut verdicts {
        let per_run: Vec<(RunKind, Vec<&Record>)> = runs
            .iter()
            .filter_map(|run| {
                let kind = run.kind?;
                group_by_client(&run.records)
                    .into_iter()
                    .find(|(name, _)| *name == v.client)
                    .map(|(_, records)| (kind, records))
            })
            .collect();
        if per_run.iter().any(|(k, _)| *k == RunKind::OneCall) {
            v.key_kinds = super::kinds::key_kinds(&per_run);
        }
    }
    verdicts
}

/// Groups records by client and gives each its verdict, in order of first appearance, judging
/// each call by `sources` (see the module's rules).
pub fn classify_with(
    records: &[Record],
    sources: &crate::identity::IdentitySources,
) -> Vec<ClientVerdict> {
    if sources.extended().next().is_none() {
        return classify(records);
    }
    let rejudged: Vec<Record> = records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r.kind == Kind::Request
                && r.method.as_deref() == Some("tools/call")
                && let Some(verdict) = rejudge(&r, sources)
            {
                r.identity = Some(verdict);
            }
            r
        })
        .collect();
    classify(&rejudged)
}

/// The verdict of one recorded call by a table with extra sources, from its `_meta` shape, or
/// `None` when the call carries none of the extra keys (the recorded verdict stands).
fn rejudge(r: &Record, sources: &crate::identity::IdentitySources) -> Option<IdentityVerdict> {
    use crate::identity::{IdentityError, Source, ValueRule};
    let rejected = |e: IdentityError| IdentityVerdict::Rejected {
        code: e.code().to_string(),
        message: e.to_string(),
    };
    // Still missing, but the message names the table's sources too.
    let still_missing = || match &r.identity {
        Some(IdentityVerdict::Rejected { code, .. }) if code == "missing_identity" => {
            sources.from_meta(None).err().map(rejected)
        }
        _ => None,
    };
    let Some(shape) = r.meta_shape() else {
        return still_missing();
    };
    let present: Vec<(&crate::identity::SourceEntry, &crate::shape::ShapeEntry)> = sources
        .entries()
        .iter()
        .filter_map(|s| {
            let path = key_pointer(&s.key);
            shape
                .entries
                .iter()
                .find(|e| e.valid_key.is_some() && e.path == path)
                .map(|e| (s, e))
        })
        .collect();
    if !present.iter().any(|(s, _)| s.source == Source::Extended) {
        return still_missing();
    }
    let [(source, entry)] = present.as_slice() else {
        return Some(rejected(IdentityError::Ambiguous {
            keys: present.iter().map(|(s, _)| s.key.clone()).collect(),
        }));
    };
    let ValueRule::Identifier { max_bytes } = source.value else {
        return None;
    };
    let field = crate::identity::field_name(&source.key);
    let len = entry.value.len.unwrap_or(0);
    let rule = if entry.value.kind != JsonType::String {
        Some(format!(
            "must be a JSON string; got {}",
            entry.value.kind.name()
        ))
    } else if len == 0 {
        Some("must not be empty".to_string())
    } else if len > max_bytes {
        Some(format!(
            "must be at most {max_bytes} bytes; got {len} bytes"
        ))
    } else {
        None
    };
    Some(match rule {
        Some(rule) => rejected(IdentityError::Invalid { field, rule }),
        None => IdentityVerdict::Accepted {
            platform: source.platform.clone().unwrap_or_default(),
            source: source.key.clone(),
        },
    })
}

/// Groups records by client and gives each its verdict, in order of first appearance, by the
/// identity verdicts the probe recorded.
pub fn classify(records: &[Record]) -> Vec<ClientVerdict> {
    group_by_client(records)
        .into_iter()
        .map(|(name, records)| verdict_for(name, &records))
        .collect()
}

/// Records grouped by client, in order of first appearance (see the module's rules).
fn group_by_client(records: &[Record]) -> Vec<(ClientName, Vec<&Record>)> {
    let mut by_connection: HashMap<&str, ClientName> = HashMap::new();
    for r in records {
        if let Some(c) = &r.client {
            by_connection
                .entry(r.connection.as_str())
                .or_insert_with(|| ClientName {
                    name: Some(c.name.clone()),
                    version: Some(c.version.clone()),
                });
        }
    }
    let mut order: Vec<ClientName> = Vec::new();
    let mut groups: HashMap<ClientName, Vec<&Record>> = HashMap::new();
    for r in records {
        let name = match &r.client {
            Some(c) => ClientName {
                name: Some(c.name.clone()),
                version: Some(c.version.clone()),
            },
            None => by_connection
                .get(r.connection.as_str())
                .cloned()
                .unwrap_or(ClientName {
                    name: None,
                    version: None,
                }),
        };
        groups
            .entry(name.clone())
            .or_insert_with(|| {
                order.push(name);
                Vec::new()
            })
            .push(r);
    }
    order
        .into_iter()
        .map(|name| {
            let records = groups.remove(&name).expect("a group per client");
            (name, records)
        })
        .collect()
}

fn verdict_for(client: ClientName, records: &[&Record]) -> ClientVerdict {
    let calls: Vec<&Record> = records
        .iter()
        .copied()
        .filter(|r| r.kind == Kind::Request && r.method.as_deref() == Some("tools/call"))
        .collect();
    let accepted: Vec<(&Record, &str, &str)> = calls
        .iter()
        .filter_map(|r| match &r.identity {
            Some(IdentityVerdict::Accepted { platform, source }) => {
                Some((*r, platform.as_str(), source.as_str()))
            }
            _ => None,
        })
        .collect();
    let first_rejection = calls.iter().find_map(|r| match &r.identity {
        Some(IdentityVerdict::Rejected { code, message }) => Some((code.clone(), message.clone())),
        None => Some((
            "missing_identity".to_string(),
            crate::identity::IdentityError::Missing.to_string(),
        )),
        _ => None,
    });
    let (verdict, source, source_key, reason, reason_message) = if calls.is_empty() {
        (
            Verdict::Unknown,
            None,
            None,
            Some("no_tool_calls".to_string()),
            Some(
                "no `tools/call` was recorded for this client; ask the agent to call the probe's \
                 `capabilities` tool, then classify again"
                    .to_string(),
            ),
        )
    } else if let Some((code, message)) = first_rejection {
        (Verdict::Rejected, None, None, Some(code), Some(message))
    } else {
        let (_, platform, key) = accepted[0];
        (
            Verdict::Accepted,
            Some(platform.to_string()),
            Some(key.to_string()),
            None,
            None,
        )
    };

    let keys = key_summaries(records, &calls);
    let split = if calls.len() >= 2 {
        KeySplit::Inferred
    } else {
        KeySplit::Unknown
    };
    let top: Vec<&KeySummary> = keys.iter().filter(|k| k.key.is_some()).collect();
    let pick = |class: KeyClass| -> Vec<String> {
        top.iter()
            .filter(|k| k.class == class)
            .filter_map(|k| k.key.clone())
            .collect()
    };

    let per_call_ids = (!accepted.is_empty()).then(|| per_call_ids(&accepted));
    let mut id_types = BTreeSet::new();
    let mut id_digests = BTreeSet::new();
    for r in &calls {
        if let Some(id) = &r.id {
            id_types.insert(id.kind);
            id_digests.insert(id.digest.as_str());
        }
    }
    let mut protocol_versions: Vec<String> = Vec::new();
    let mut methods: Vec<MethodCount> = Vec::new();
    let mut connections = BTreeSet::new();
    for r in records {
        connections.insert(r.connection.as_str());
        if let Some(p) = &r.protocol_version
            && !protocol_versions.contains(p)
        {
            protocol_versions.push(p.clone());
        }
        if let Some(m) = &r.method
            && matches!(r.kind, Kind::Request | Kind::Notification)
        {
            match methods.iter_mut().find(|c| &c.method == m) {
                Some(c) => c.count += 1,
                None => methods.push(MethodCount {
                    method: m.clone(),
                    count: 1,
                }),
            }
        }
    }
    ClientVerdict {
        client,
        verdict,
        source,
        source_key,
        reason,
        reason_message,
        key_split: split,
        call_level_keys: pick(KeyClass::CallLevel),
        context_keys: pick(KeyClass::Context),
        unknown_keys: pick(KeyClass::Unknown),
        calls: calls.len(),
        calls_accepted: accepted.len(),
        per_call_ids,
        jsonrpc_ids: JsonRpcIds {
            types: id_types.into_iter().collect(),
            distinct: id_digests.len(),
            calls: calls.len(),
        },
        protocol_versions,
        methods,
        bad_messages: records
            .iter()
            .filter(|r| matches!(r.kind, Kind::Malformed | Kind::Oversize))
            .count(),
        connections: connections.len(),
        keys,
        key_kinds: Vec::new(),
    }
}

fn key_summaries(records: &[&Record], calls: &[&Record]) -> Vec<KeySummary> {
    let mut order: Vec<String> = Vec::new();
    let mut summaries: HashMap<String, KeySummary> = HashMap::new();
    // Per path, the digest on each call (None when absent), to classify.
    let mut per_call: HashMap<String, Vec<Option<String>>> = HashMap::new();
    for r in records {
        let Some(shape) = r.meta_shape() else {
            continue;
        };
        let is_call = r.kind == Kind::Request && r.method.as_deref() == Some("tools/call");
        for e in &shape.entries {
            let s = summaries.entry(e.path.clone()).or_insert_with(|| {
                order.push(e.path.clone());
                KeySummary {
                    path: e.path.clone(),
                    key: e.valid_key.is_some().then(|| pointer_key(&e.path)),
                    types: Vec::new(),
                    len_min: None,
                    len_max: None,
                    requests: 0,
                    calls: 0,
                    distinct_values: 0,
                    class: KeyClass::Unknown,
                }
            });
            if !s.types.contains(&e.value.kind) {
                s.types.push(e.value.kind);
            }
            if let Some(len) = e.value.len {
                s.len_min = Some(s.len_min.map_or(len, |m| m.min(len)));
                s.len_max = Some(s.len_max.map_or(len, |m| m.max(len)));
            }
            if r.kind == Kind::Request {
                s.requests += 1;
            }
            if is_call {
                s.calls += 1;
            }
        }
    }
    for (i, r) in calls.iter().enumerate() {
        let shape = r.meta_shape();
        for path in &order {
            let digest = shape.and_then(|s| {
                s.entries
                    .iter()
                    .find(|e| &e.path == path)
                    .map(|e| e.value.digest.to_string())
            });
            let v = per_call.entry(path.clone()).or_default();
            v.resize(i, None);
            v.push(digest);
        }
    }
    order
        .into_iter()
        .map(|path| {
            let mut s = summaries.remove(&path).expect("a summary per path");
            let values = per_call.remove(&path).unwrap_or_default();
            let present: BTreeSet<&String> = values.iter().flatten().collect();
            s.distinct_values = present.len();
            let all: BTreeSet<Option<&String>> = values.iter().map(Option::as_ref).collect();
            s.class = if calls.len() < 2 || s.calls == 0 {
                KeyClass::Unknown
            } else if all.len() == 1 {
                KeyClass::Context
            } else {
                KeyClass::CallLevel
            };
            s
        })
        .collect()
}

fn per_call_ids(accepted: &[(&Record, &str, &str)]) -> PerCallIds {
    let mut by_id: BTreeMap<String, Vec<Option<&str>>> = BTreeMap::new();
    for (r, _, key) in accepted {
        let id_path = if *key == crate::identity::ENVELOPE_KEY {
            key_pointer(key) + "/invocation_id"
        } else {
            key_pointer(key)
        };
        let digest = r
            .meta_shape()
            .and_then(|s| s.entries.iter().find(|e| e.path == id_path))
            .map(|e| e.value.digest.to_string())
            .unwrap_or_default();
        by_id
            .entry(digest)
            .or_default()
            .push(r.request_digest.as_deref());
    }
    let mut redelivered = 0;
    let mut reused = 0;
    for requests in by_id.values().filter(|v| v.len() > 1) {
        let distinct: BTreeSet<_> = requests.iter().collect();
        if distinct.len() > 1 {
            reused += 1;
        } else {
            redelivered += 1;
        }
    }
    PerCallIds {
        calls: accepted.len(),
        distinct: by_id.len(),
        all_distinct: by_id.len() == accepted.len(),
        redelivered,
        reused_with_different_request: reused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{RecordContext, Transport, record_for_request};
    use crate::shape::Digester;
    use serde_json::{Value, json};

    struct Client {
        ctx: RecordContext,
        records: Vec<Record>,
    }

    impl Client {
        fn new(name: &str) -> Self {
            let ctx = RecordContext::new(Transport::Stdio);
            let mut c = Client {
                ctx,
                records: Vec::new(),
            };
            let r = c.send(
                "initialize",
                json!(0),
                json!({"protocolVersion": "2025-11-25", "clientInfo": {"name": name, "version": "1"}}),
            );
            c.ctx.client = r.client.clone();
            c
        }

        fn send(&mut self, method: &str, id: Value, params: Value) -> Record {
            let r = record_for_request(
                method,
                Some(&id),
                Some(&params),
                1,
                &self.ctx,
                &Digester::Plain,
            );
            self.records.push(r.clone());
            r
        }

        fn call(&mut self, id: i64, args: Value, meta: Value) {
            self.send(
                "tools/call",
                json!(id),
                json!({"name": "buy", "arguments": args, "_meta": meta}),
            );
        }

        fn verdict(&self) -> ClientVerdict {
            let mut v = classify(&self.records);
            assert_eq!(v.len(), 1);
            v.remove(0)
        }
    }

    #[test]
    fn key_split_and_ids() {
        let mut c = Client::new("codex-like");
        c.call(
            1,
            json!({"p": "fox"}),
            json!({"callId": "c1", "session": "s", "progressToken": 0}),
        );
        c.call(
            2,
            json!({"p": "fox"}),
            json!({"callId": "c2", "session": "s", "progressToken": 1}),
        );
        // Redelivery of c2, and c1 reused for different work.
        c.call(
            3,
            json!({"p": "fox"}),
            json!({"callId": "c2", "session": "s", "progressToken": 2}),
        );
        c.call(
            4,
            json!({"p": "crane"}),
            json!({"callId": "c1", "session": "s", "progressToken": 3}),
        );
        let v = c.verdict();
        assert_eq!(v.verdict, Verdict::Accepted);
        assert_eq!(v.source.as_deref(), Some("codex"));
        assert_eq!(v.call_level_keys, ["callId", "progressToken"]);
        assert_eq!(v.context_keys, ["session"]);
        let ids = v.per_call_ids.unwrap();
        assert_eq!((ids.calls, ids.distinct, ids.all_distinct), (4, 2, false));
        assert_eq!((ids.redelivered, ids.reused_with_different_request), (1, 1));
        assert_eq!(v.jsonrpc_ids.distinct, 4);
    }

    #[test]
    fn a_key_present_on_some_calls_is_call_level() {
        let mut c = Client::new("sometimes");
        c.call(1, json!({}), json!({"callId": "a", "trace": "t"}));
        c.call(2, json!({}), json!({"callId": "b"}));
        assert_eq!(c.verdict().call_level_keys, ["callId", "trace"]);
    }

    #[test]
    fn verdicts_table() {
        let cases: Vec<(Vec<Value>, Verdict, Option<&str>, KeySplit)> = vec![
            (
                vec![],
                Verdict::Unknown,
                Some("no_tool_calls"),
                KeySplit::Unknown,
            ),
            (
                vec![json!({"callId": "a"})],
                Verdict::Accepted,
                None,
                KeySplit::Unknown,
            ),
            (
                vec![json!({"callId": "a"}), json!({"x": 1})],
                Verdict::Rejected,
                Some("missing_identity"),
                KeySplit::Inferred,
            ),
            (
                vec![json!({"callId": "a", "claudecode/toolUseId": "b"})],
                Verdict::Rejected,
                Some("ambiguous_identity"),
                KeySplit::Unknown,
            ),
            (
                vec![json!({"callId": ""})],
                Verdict::Rejected,
                Some("invalid_identity"),
                KeySplit::Unknown,
            ),
        ];
        for (metas, verdict, reason, split) in cases {
            let mut c = Client::new("t");
            for (i, m) in metas.iter().enumerate() {
                c.call(i as i64 + 1, json!({}), m.clone());
            }
            let v = c.verdict();
            assert_eq!(
                (v.verdict, v.reason.as_deref(), v.key_split),
                (verdict, reason, split),
                "{metas:?}"
            );
            if v.key_split == KeySplit::Unknown {
                assert!(v.call_level_keys.is_empty() && v.context_keys.is_empty());
            }
        }
    }

    #[test]
    fn records_without_client_join_their_connection() {
        let mut c = Client::new("named");
        let mut stray = Record::new(
            Kind::Malformed,
            3,
            &RecordContext {
                client: None,
                ..c.ctx.clone()
            },
            &Digester::Plain,
        );
        stray.error = None;
        c.records.insert(0, stray);
        let v = c.verdict();
        assert_eq!(v.client.name.as_deref(), Some("named"));
        assert_eq!(v.bad_messages, 1);
    }
}
