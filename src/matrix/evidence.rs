//! From probe shape logs to rows, and back: [`row_from_observed`] builds a row from
//! [`classify`](crate::classify::classify)'s verdict ([`observed`]), and [`check_rows`] classifies each measured
//! row's committed evidence again and refuses a row that says something its evidence does not.
//!
//! Evidence files are the probe's own logs (shapes and digests, never a value). A measured row's
//! first evidence file holds the run with two distinct model tool calls; files ending in
//! `.duplicate-id.jsonl`, `.timeout.jsonl` and `.server-dies.jsonl` hold the runs for the (b) and
//! (c) stability columns, `.one-answer.jsonl` and `.one-answer-same-id.jsonl` those for (d) and
//! (e); a one-answer run may record no `tools/call` at all (a client that cannot take two calls
//! in one answer), and is then checked for that alone. A row's `per_attempt_keys` come from all of them together
//! ([`per_attempt_keys`]): only a timeout or server-dies run in which the client redelivered its
//! one call can show that a value changes per attempt (see [`crate::classify::kinds`]).

use super::analyze;
use super::data::{
    ClientRow, ClientsFile, DistinctIds, How, IdOrigin, MatrixError, Stability, Verdict,
};
use crate::classify::kinds::{self, RunKind, ValueKind};
use crate::classify::runs::{IdStyle, Scenario};
use crate::classify::{self, ClientVerdict, KeySplit};
use crate::probe::record::Record;
use std::path::{Path, PathBuf};

/// Why a row disagrees with its evidence, or evidence cannot make a row.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The evidence could not be read or holds no records.
    #[error("failed to read the evidence of row `{row}`")]
    Read {
        /// The row.
        row: String,
        /// The cause.
        #[source]
        source: classify::ClassifyError,
    },
    /// The evidence holds a line that is not a probe record.
    #[error("evidence of row `{row}` has a line that is not a probe record: {line}")]
    BadLine {
        /// The row.
        row: String,
        /// `file:line: reason`.
        line: String,
    },
    /// The evidence does not classify to exactly one client.
    #[error("evidence `{file}` classifies to {count} clients; one evidence file holds one client")]
    ClientCount {
        /// The file.
        file: PathBuf,
        /// How many.
        count: usize,
    },
    /// The evidence classifies to no verdict (no `tools/call` recorded).
    #[error(
        "evidence `{file}` records no `tools/call`, so it gives no verdict; make one call through \
         the probe and try again"
    )]
    NoCalls {
        /// The file.
        file: PathBuf,
    },
    /// A row says something its evidence does not.
    #[error(
        "row `{row}` disagrees with its evidence `{file}`: `{field}` is {row_value} in the row but {evidence_value} in the evidence; measure it again or fix the row"
    )]
    Disagrees {
        /// The row.
        row: String,
        /// The evidence file.
        file: PathBuf,
        /// The field.
        field: &'static str,
        /// What the row says.
        row_value: String,
        /// What the evidence says.
        evidence_value: String,
    },
    /// A matrix rule or file problem.
    #[error(transparent)]
    Matrix(#[from] MatrixError),
}

impl EvidenceError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            EvidenceError::Read { .. } => "evidence_unreadable",
            EvidenceError::BadLine { .. } => "evidence_bad_line",
            EvidenceError::ClientCount { .. } => "evidence_client_count",
            EvidenceError::NoCalls { .. } => "evidence_no_calls",
            EvidenceError::Disagrees { .. } => "evidence_disagrees",
            EvidenceError::Matrix(e) => e.code(),
        }
    }
}

/// What a probe log says about one client, in row terms (keys sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The client as it names itself.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Error code when rejected.
    pub reason: Option<String>,
    /// Source key when accepted.
    pub per_call_id: Option<String>,
    /// Call-level keys other than the source key.
    pub call_level_keys: Vec<String>,
    /// Context keys.
    pub context_keys: Vec<String>,
    /// Keys whose class could not be told (fewer than two calls, or seen only outside
    /// `tools/call`).
    pub unknown_keys: Vec<String>,
    /// Whether the call-level / context split was inferred from two or more calls.
    pub split_known: bool,
    /// The protocol version(s) its `tools/call`s were made under ([`protocol_of`]); `None` when
    /// the probe could not tell.
    pub protocol: Option<String>,
}

/// A verdict in row terms; `None` when it has no `tools/call` to judge.
pub fn observed(v: &ClientVerdict) -> Option<Observed> {
    let verdict = match v.verdict {
        classify::Verdict::Accepted => Verdict::Accepted,
        classify::Verdict::Rejected => Verdict::Rejected,
        classify::Verdict::Unknown => return None,
    };
    let sorted = |keys: &[String]| {
        let mut k: Vec<String> = keys
            .iter()
            .filter(|k| Some(k.as_str()) != v.source_key.as_deref())
            .cloned()
            .collect();
        k.sort();
        k.dedup();
        k
    };
    let mut unknown = sorted(&v.unknown_keys);
    if v.key_split == KeySplit::Unknown {
        unknown.extend(sorted(&v.call_level_keys));
        unknown.extend(sorted(&v.context_keys));
        unknown.sort();
        unknown.dedup();
    }
    let split = v.key_split == KeySplit::Inferred;
    Some(Observed {
        name: v
            .client
            .name
            .clone()
            .unwrap_or_else(|| "unnamed client".into()),
        version: v.client.version.clone().unwrap_or_default(),
        verdict,
        reason: match verdict {
            Verdict::Rejected => v.reason.clone(),
            Verdict::Accepted => None,
        },
        per_call_id: match verdict {
            Verdict::Accepted => v.source_key.clone(),
            Verdict::Rejected => None,
        },
        call_level_keys: if split {
            sorted(&v.call_level_keys)
        } else {
            Vec::new()
        },
        context_keys: if split {
            sorted(&v.context_keys)
        } else {
            Vec::new()
        },
        unknown_keys: unknown,
        split_known: split,
        protocol: None,
    })
}

/// The MCP protocol version the `tools/call` requests in `records` were made under, as the probe
/// recorded it for each: the request's own `io.modelcontextprotocol/protocolVersion` under
/// 2026-07-28, else the version agreed in `initialize` (see [`crate::probe::tap`]). Distinct
/// versions are sorted and joined with `, `; `None` when no call has one. What a client sent on
/// `server/discover` before falling back does not count: only the calls do.
pub fn protocol_of(records: &[Record]) -> Option<String> {
    let versions: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| {
            r.kind == crate::probe::record::Kind::Request
                && r.method.as_deref() == Some("tools/call")
        })
        .filter_map(|r| r.protocol_version.as_deref())
        .collect();
    (!versions.is_empty()).then(|| versions.into_iter().collect::<Vec<_>>().join(", "))
}

/// Reads one evidence file strictly: every line must be a probe record.
pub fn read_evidence(row: &str, path: &Path) -> Result<Vec<Record>, EvidenceError> {
    let (records, bad) =
        classify::read_logs(&[path.to_owned()]).map_err(|source| EvidenceError::Read {
            row: row.to_owned(),
            source,
        })?;
    if let Some(first) = bad.first() {
        return Err(EvidenceError::BadLine {
            row: row.to_owned(),
            line: first.to_string(),
        });
    }
    Ok(records)
}

/// The one client an evidence file holds.
pub fn single_client(path: &Path, records: &[Record]) -> Result<Observed, EvidenceError> {
    let verdicts: Vec<ClientVerdict> = classify::classify(records)
        .into_iter()
        .filter(|v| v.calls > 0 || v.client.name.is_some())
        .collect();
    match verdicts.as_slice() {
        [one] => observed(one)
            .map(|o| Observed {
                protocol: protocol_of(records),
                ..o
            })
            .ok_or_else(|| EvidenceError::NoCalls {
                file: path.to_owned(),
            }),
        _ => Err(EvidenceError::ClientCount {
            file: path.to_owned(),
            count: verdicts.len(),
        }),
    }
}

/// A new row from what a log observed.
pub fn row_from_observed(
    o: &Observed,
    id: String,
    surface: String,
    date: String,
    how: How,
) -> ClientRow {
    let listed = o
        .unknown_keys
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let notes = match (o.unknown_keys.is_empty(), o.split_known) {
        (true, _) => None,
        (false, true) => Some(format!(
            "Keys sent only outside `tools/call` (on discovery or other requests): {listed}."
        )),
        (false, false) => Some(format!(
            "Only one call was recorded, so call-level and context keys could not be told apart; \
             keys seen: {listed}."
        )),
    };
    ClientRow {
        id,
        client: o.name.clone(),
        surface,
        version: Some(o.version.clone()).filter(|v| !v.is_empty()),
        client_info_version: None,
        date: Some(date),
        protocol: o.protocol.clone(),
        verdict: o.verdict,
        reason: o.reason.clone(),
        per_call_id: o.per_call_id.clone(),
        call_level_keys: o.split_known.then(|| o.call_level_keys.clone()),
        context_keys: o.split_known.then(|| o.context_keys.clone()),
        per_attempt_keys: Vec::new(),
        stability: Stability::default(),
        how,
        notes,
    }
}

/// The per-attempt keys (sorted) of one client's evidence: each file with its records, the run
/// it holds told by its name ([`RunKind::of_file`]). Only a timeout or server-dies run where the
/// client redelivered its call can show one; see [`crate::classify::kinds`].
pub fn per_attempt_keys(files: &[(&Path, &[Record])]) -> Vec<String> {
    let runs: Vec<(RunKind, Vec<&Record>)> = files
        .iter()
        .filter_map(|(path, records)| Some((RunKind::of_file(path)?, records.iter().collect())))
        .collect();
    let mut keys: Vec<String> = kinds::key_kinds(&runs)
        .into_iter()
        .filter(|k| k.kind == ValueKind::PerAttempt)
        .map(|k| k.key)
        .collect();
    keys.sort();
    keys
}

/// The style of the scripted tool-call ids a per-call key goes with (Codex's and Claude Code's).
fn id_style_for_key(key: Option<&str>) -> Option<IdStyle> {
    match key {
        Some(crate::identity::CODEX_KEY) => Some(IdStyle::OpenAi),
        Some(crate::identity::CLAUDE_CODE_KEY) => Some(IdStyle::Anthropic),
        _ => None,
    }
}

fn disagree<T: std::fmt::Debug + PartialEq>(
    row: &ClientRow,
    file: &Path,
    field: &'static str,
    in_row: T,
    in_evidence: T,
) -> Result<(), EvidenceError> {
    if in_row == in_evidence {
        return Ok(());
    }
    Err(EvidenceError::Disagrees {
        row: row.id.clone(),
        file: file.to_owned(),
        field,
        row_value: format!("{in_row:?}"),
        evidence_value: format!("{in_evidence:?}"),
    })
}

/// Classifies one measured row's evidence again and compares every field it can support.
pub fn check_row(dir: &Path, row: &ClientRow) -> Result<(), EvidenceError> {
    let How::Measured { evidence, .. } = &row.how else {
        return Ok(());
    };
    let has = |scenario: Scenario| evidence.iter().any(|f| Scenario::of_file(f) == scenario);
    let s = &row.stability;
    for (claimed, scenario, field) in [
        (
            s.duplicate_model_id != Default::default(),
            Scenario::DuplicateModelId,
            "stability.duplicate_model_id",
        ),
        (
            s.on_timeout != Default::default(),
            Scenario::Timeout,
            "stability.on_timeout",
        ),
        (
            s.on_server_death != Default::default(),
            Scenario::ServerDies,
            "stability.on_server_death",
        ),
        (
            !s.one_answer_two_ids.is_not_measured(),
            Scenario::OneAnswerTwoIds,
            "stability.one_answer_two_ids",
        ),
        (
            !s.one_answer_same_id.is_not_measured(),
            Scenario::OneAnswerSameId,
            "stability.one_answer_same_id",
        ),
    ] {
        if claimed && !has(scenario) {
            return Err(EvidenceError::Disagrees {
                row: row.id.clone(),
                file: dir.join(format!("*.{}.jsonl", scenario.tag())),
                field,
                row_value: "a finding".into(),
                evidence_value: "no such evidence file".into(),
            });
        }
    }
    let mut read: Vec<(PathBuf, Vec<Record>)> = Vec::new();
    for (i, file) in evidence.iter().enumerate() {
        let path = dir.join(file);
        let records = read_evidence(&row.id, &path)?;
        let scenario = Scenario::of_file(file);
        let calls = analyze::tool_calls(&records);
        if scenario.one_answer() {
            let field = if scenario == Scenario::OneAnswerTwoIds {
                (
                    "stability.one_answer_two_ids",
                    row.stability.one_answer_two_ids,
                )
            } else {
                (
                    "stability.one_answer_same_id",
                    row.stability.one_answer_same_id,
                )
            };
            disagree(
                row,
                &path,
                field.0,
                field.1,
                analyze::one_answer(&calls, &scenario.call_arguments()),
            )?;
            if calls.is_empty() {
                continue;
            }
        }
        let o = single_client(&path, &records)?;
        // A client that states a fixed placeholder in `clientInfo` has it recorded beside the
        // package version; the evidence must show that placeholder.
        disagree(
            row,
            &path,
            if row.client_info_version.is_some() {
                "client_info_version"
            } else {
                "version"
            },
            row.client_info_version.clone().or(row.version.clone()),
            Some(o.version.clone()),
        )?;
        disagree(row, &path, "verdict", row.verdict, o.verdict)?;
        disagree(row, &path, "reason", row.reason.clone(), o.reason.clone())?;
        disagree(
            row,
            &path,
            "per_call_id",
            row.per_call_id.clone(),
            o.per_call_id.clone(),
        )?;
        if i == 0 {
            if row.protocol.is_some() {
                disagree(
                    row,
                    &path,
                    "protocol",
                    row.protocol.clone(),
                    o.protocol.clone(),
                )?;
            }
            let sorted = |keys: &Option<Vec<String>>| {
                keys.clone().map(|mut k| {
                    k.sort();
                    k
                })
            };
            disagree(
                row,
                &path,
                "call_level_keys",
                sorted(&row.call_level_keys),
                o.split_known.then(|| o.call_level_keys.clone()),
            )?;
            disagree(
                row,
                &path,
                "context_keys",
                sorted(&row.context_keys),
                o.split_known.then(|| o.context_keys.clone()),
            )?;
            if row.stability.distinct_ids != DistinctIds::NotMeasured {
                disagree(
                    row,
                    &path,
                    "stability.distinct_ids",
                    row.stability.distinct_ids,
                    analyze::distinct_ids(&calls),
                )?;
            }
            if row.stability.id_origin != IdOrigin::NotMeasured {
                let model_ids = id_style_for_key(o.per_call_id.as_deref())
                    .map(|c| scenario.model_ids(c))
                    .unwrap_or_default();
                disagree(
                    row,
                    &path,
                    "stability.id_origin",
                    row.stability.id_origin,
                    analyze::id_origin(&calls, &model_ids),
                )?;
            }
        }
        match scenario {
            Scenario::DuplicateModelId => disagree(
                row,
                &path,
                "stability.duplicate_model_id",
                row.stability.duplicate_model_id,
                analyze::duplicate_model_id(&calls),
            )?,
            Scenario::Timeout => disagree(
                row,
                &path,
                "stability.on_timeout",
                row.stability.on_timeout,
                analyze::on_timeout(&calls),
            )?,
            Scenario::ServerDies => disagree(
                row,
                &path,
                "stability.on_server_death",
                row.stability.on_server_death,
                analyze::on_timeout(&calls),
            )?,
            Scenario::TwoCalls | Scenario::OneAnswerTwoIds | Scenario::OneAnswerSameId => {}
        }
        read.push((path, records));
    }
    let files: Vec<(&Path, &[Record])> = read
        .iter()
        .map(|(p, r)| (p.as_path(), r.as_slice()))
        .collect();
    let mut listed = row.per_attempt_keys.clone();
    listed.sort();
    disagree(
        row,
        &dir.join(format!(
            "*.{{{},{}}}.jsonl",
            Scenario::Timeout.tag(),
            Scenario::ServerDies.tag()
        )),
        "per_attempt_keys",
        listed,
        per_attempt_keys(&files),
    )
}

/// [`check_row`] for every row.
pub fn check_rows(dir: &Path, file: &ClientsFile) -> Result<(), EvidenceError> {
    file.clients.iter().try_for_each(|row| check_row(dir, row))
}

/// The fields in which a newly measured row differs from a committed one, as readable lines.
/// `date` and evidence bytes change on every run and are not compared; `version` is, since CI
/// measures the pinned client.
pub fn row_differences(committed: &ClientRow, measured: &ClientRow) -> Vec<String> {
    let mut out = Vec::new();
    let mut cmp = |field: &str, a: String, b: String| {
        if a != b {
            out.push(format!("`{field}`: committed {a}, measured {b}"));
        }
    };
    let sorted = |v: &Option<Vec<String>>| match v {
        None => "unknown".to_owned(),
        Some(v) => {
            let mut v = v.clone();
            v.sort();
            format!("{v:?}")
        }
    };
    cmp(
        "version",
        format!("{:?}", committed.version),
        format!("{:?}", measured.version),
    );
    cmp(
        "client_info_version",
        format!("{:?}", committed.client_info_version),
        format!("{:?}", measured.client_info_version),
    );
    cmp(
        "protocol",
        format!("{:?}", committed.protocol),
        format!("{:?}", measured.protocol),
    );
    cmp(
        "verdict",
        committed.verdict.name().into(),
        measured.verdict.name().into(),
    );
    cmp(
        "reason",
        format!("{:?}", committed.reason),
        format!("{:?}", measured.reason),
    );
    cmp(
        "per_call_id",
        format!("{:?}", committed.per_call_id),
        format!("{:?}", measured.per_call_id),
    );
    cmp(
        "call_level_keys",
        sorted(&committed.call_level_keys),
        sorted(&measured.call_level_keys),
    );
    cmp(
        "context_keys",
        sorted(&committed.context_keys),
        sorted(&measured.context_keys),
    );
    cmp(
        "per_attempt_keys",
        sorted(&Some(committed.per_attempt_keys.clone())),
        sorted(&Some(measured.per_attempt_keys.clone())),
    );
    cmp(
        "stability",
        format!("{:?}", committed.stability),
        format!("{:?}", measured.stability),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::data::OnFailure;
    use crate::probe::record::{RecordContext, Transport, record_for_request};
    use crate::shape::Digester;
    use serde_json::{Value, json};

    fn record(method: &str, id: Value, params: Value, ctx: &RecordContext) -> Record {
        record_for_request(method, Some(&id), Some(&params), 1, ctx, &Digester::Plain)
    }

    fn call(id: i64, meta: Value, ctx: &RecordContext) -> Record {
        let params = json!({"name": "capabilities", "arguments": {}, "_meta": meta});
        record("tools/call", json!(id), params, ctx)
    }

    #[test]
    fn the_protocol_is_the_one_the_calls_were_made_under() {
        // 2026-07-28: each call declares it, whatever `server/discover` said.
        let ctx = RecordContext::new(Transport::Stdio);
        let v = |p: &str| json!({"io.modelcontextprotocol/protocolVersion": p});
        let records = vec![
            record(
                "server/discover",
                json!(1),
                json!({"_meta": v("2026-07-28")}),
                &ctx,
            ),
            call(2, v("2026-07-28"), &ctx),
            call(3, v("2026-07-28"), &ctx),
        ];
        assert_eq!(protocol_of(&records).as_deref(), Some("2026-07-28"));
        // A fallback to `initialize`: the calls are under the agreed version, and a discover
        // that was refused does not count.
        let mut agreed = RecordContext::new(Transport::Stdio);
        agreed.protocol_version = Some("2025-11-25".into());
        let records = vec![
            record(
                "server/discover",
                json!(1),
                json!({"_meta": v("2026-07-28")}),
                &ctx,
            ),
            call(2, json!({}), &agreed),
        ];
        assert_eq!(protocol_of(&records).as_deref(), Some("2025-11-25"));
        // Mixed versions are all listed, sorted; no call, no protocol.
        let records = vec![call(1, v("2026-07-28"), &ctx), call(2, json!({}), &agreed)];
        assert_eq!(
            protocol_of(&records).as_deref(),
            Some("2025-11-25, 2026-07-28")
        );
        assert_eq!(protocol_of(&records[..0]), None);
    }

    #[test]
    fn a_retry_under_2026_07_28_is_judged_by_its_call_id_never_its_json_rpc_id() {
        let ctx = RecordContext::new(Transport::Stdio);
        let meta = |id: &str| json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "callId": id});
        // The retry carries a new JSON-RPC id, as 2026-07-28 requires, and the same call ID.
        let same = [call(7, meta("c1"), &ctx), call(8, meta("c1"), &ctx)];
        assert_ne!(same[0].id, same[1].id);
        assert_eq!(
            analyze::on_timeout(&analyze::tool_calls(&same)),
            OnFailure::RetriedSameId
        );
        // The same JSON-RPC id twice with two call IDs is a new ID, not the same one.
        let new = [call(7, meta("c1"), &ctx), call(7, meta("c2"), &ctx)];
        assert_eq!(
            analyze::on_timeout(&analyze::tool_calls(&new)),
            OnFailure::RetriedNewId
        );
    }
}
