//! The data model of `matrices/clients.yaml` and `matrices/routers.yaml`: strict, validated, and
//! written back in one canonical form.
//!
//! Both files are read through `serde_path_to_error` with `deny_unknown_fields` everywhere, so a
//! typo fails with the path of the offending field (`clients[2].stability.distinct_ids`). After
//! parsing, [`ClientsFile::validate`] applies the rules a row must keep: a `measured` row names
//! its version, date and evidence; a `reported` row never claims a version it did not see; an
//! `accepted` row names its per-call ID key, a `rejected` row its reason code.

use crate::identity;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Format version of `routers.yaml`, and the oldest `clients.yaml` still read.
pub const FORMAT_VERSION: u32 = 1;
/// Format version of `clients.yaml` as written now: 2 adds each row's `protocol`, which a
/// measured row must give. Version 1 files (no `protocol`) are still read.
pub const CLIENTS_FORMAT_VERSION: u32 = 2;
/// File name of the client rows inside the matrix directory.
pub const CLIENTS_FILE: &str = "clients.yaml";
/// File name of the router rows inside the matrix directory.
pub const ROUTERS_FILE: &str = "routers.yaml";
/// File name of the rendered Markdown inside the matrix directory.
pub const SUPPORT_FILE: &str = "SUPPORT.md";
/// Folder of evidence files (probe shape logs) inside the matrix directory.
pub const EVIDENCE_DIR: &str = "evidence";

/// Why matrix data could not be read, checked or written. Each variant has a stable
/// [`code`](Self::code).
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// A file could not be read or written.
    #[error("failed to {action} `{path}`")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A YAML file does not fit the data model.
    #[error("invalid `{file}` at `{path}`: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// Path of the offending field, e.g. `clients[2].verdict`.
        path: String,
        /// What the parser said.
        message: String,
    },
    /// A row breaks a rule of the matrix.
    #[error("invalid row `{row}` in `{file}`: {rule}")]
    Rule {
        /// The file.
        file: PathBuf,
        /// The row's `id`.
        row: String,
        /// The rule broken, as a fragment.
        rule: String,
    },
}

impl MatrixError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            MatrixError::Io { .. } => "matrix_io",
            MatrixError::Parse { .. } => "matrix_parse",
            MatrixError::Rule { .. } => "matrix_rule",
        }
    }
}

/// `matrices/clients.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientsFile {
    /// [`CLIENTS_FORMAT_VERSION`], or [`FORMAT_VERSION`] for a file written before rows had a
    /// `protocol`.
    pub version: u32,
    /// One row per client surface, in the order they are rendered.
    pub clients: Vec<ClientRow>,
}

/// An identity verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The client sends exactly one trusted per-call ID.
    Accepted,
    /// It does not (the reason code says why).
    Rejected,
}

impl Verdict {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
        }
    }
}

/// One client surface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientRow {
    /// Stable slug, unique in the file (e.g. `codex-cli`).
    pub id: String,
    /// The client as people call it (e.g. `Codex CLI`).
    pub client: String,
    /// Where and how it ran (e.g. `codex exec, MCP over stdio`).
    pub surface: String,
    /// Exact version tested; only for measured rows or a source that states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The version the client states in MCP `clientInfo`, when that is not `version` (some
    /// clients send a fixed placeholder such as `0.0.1`): what the evidence shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info_version: Option<String>,
    /// Day of the measurement or the report, `YYYY-MM-DD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// The MCP protocol version the client used for its `tools/call`s (e.g. `2026-07-28`, or the
    /// `2025-11-25` it agreed in `initialize`), as the probe recorded it: a measured row takes it
    /// from its first evidence file and is checked against it; a reported row gives it only when
    /// its source states it. Several versions are listed comma-separated, sorted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The identity verdict.
    pub verdict: Verdict,
    /// Identity error code when rejected (e.g. `missing_identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The `_meta` key of the per-call ID when accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_call_id: Option<String>,
    /// Other `_meta` keys whose value changes per call; absent when it could not be told (a
    /// measurement with a single call), rendered `unknown` as `callid classify` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_level_keys: Option<Vec<String>>,
    /// `_meta` keys whose value stays the same across calls; absent when it could not be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_keys: Option<Vec<String>>,
    /// `_meta` keys whose value changed when the client redelivered a call: per-attempt values,
    /// never call IDs. A measured row takes them from its timeout and server-dies runs (see
    /// [`crate::classify::kinds`]) and is checked against them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_attempt_keys: Vec<String>,
    /// How the per-call ID behaves beyond one call.
    #[serde(default, skip_serializing_if = "Stability::is_not_measured")]
    pub stability: Stability,
    /// Whether the row was measured or reported, and its evidence or source.
    pub how: How,
    /// Anything a reader needs to read the row right.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

/// Where a row came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum How {
    /// Measured by a command against the real program.
    Measured {
        /// The command that measured it (e.g. `callid measure --client codex`).
        command: String,
        /// Evidence files (probe shape logs), relative to the matrix directory.
        evidence: Vec<String>,
    },
    /// Reported by a source; no version claimed unless the source states one.
    Reported {
        /// Who or what reported it.
        source: String,
    },
}

/// ID stability findings (issue 5, "Beyond the article").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stability {
    /// Where the per-call ID comes from.
    #[serde(default)]
    pub id_origin: IdOrigin,
    /// (a) Two distinct model tool calls give two distinct IDs.
    #[serde(default)]
    pub distinct_ids: DistinctIds,
    /// (b) The model API returns the same tool-call id twice.
    #[serde(default)]
    pub duplicate_model_id: DuplicateModelId,
    /// (c) The server does not answer within the client's tool timeout.
    #[serde(default)]
    pub on_timeout: OnFailure,
    /// (c) The server process dies while the call is in flight.
    #[serde(default)]
    pub on_server_death: OnFailure,
    /// (d) One model answer with two tool calls of distinct ids.
    #[serde(default, skip_serializing_if = "OneAnswer::is_not_measured")]
    pub one_answer_two_ids: OneAnswer,
    /// (e) One model answer with two tool calls sharing one id, with different arguments.
    #[serde(default, skip_serializing_if = "OneAnswer::is_not_measured")]
    pub one_answer_same_id: OneAnswer,
}

/// Where the per-call ID comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdOrigin {
    /// Not measured.
    #[default]
    NotMeasured,
    /// The client copies the model's own tool-call id: uniqueness rests on the model provider.
    CopiedFromModel,
    /// The client makes its own ID.
    ClientGenerated,
    /// The client's calls carry no per-call ID at all.
    NoId,
}

/// (a) Two distinct model tool calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistinctIds {
    /// Not measured.
    #[default]
    NotMeasured,
    /// Two calls, two different IDs.
    Distinct,
    /// Two calls, the same ID.
    Repeated,
    /// Two calls, neither with a per-call ID.
    NoId,
}

/// (b) The model API returns the same tool-call id twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DuplicateModelId {
    /// Not measured.
    #[default]
    NotMeasured,
    /// Both calls reach the server with the same per-call ID.
    PassedThrough,
    /// Both calls reach the server, with different per-call IDs.
    MadeDistinct,
    /// Only one of the two calls reaches the server.
    Dropped,
    /// Both calls reach the server, neither with a per-call ID.
    SentWithoutId,
}

/// (c) What the client does when a call in flight fails: the server times out or dies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Not measured.
    #[default]
    NotMeasured,
    /// The client gives up on the call and does not send it again.
    NoRetry,
    /// The client sends the call again with the same per-call ID.
    RetriedSameId,
    /// The client sends the call again with a different per-call ID.
    RetriedNewId,
    /// The client sends the call again, and neither attempt carries a per-call ID.
    RetriedWithoutId,
}

/// (d) and (e): what reaches the server when one model answer holds two tool calls (the first
/// and the second carry different arguments, so the evidence shows which one ran).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OneAnswer {
    /// Not measured.
    #[default]
    NotMeasured,
    /// Both calls reach the server, each with its own per-call ID.
    BothOwnIds,
    /// Both calls reach the server with one and the same per-call ID.
    BothSharedId,
    /// Both calls reach the server, not each with a per-call ID.
    BothWithoutId,
    /// Two calls reach the server, both with the first call's arguments; the second never does.
    FirstTwice,
    /// Two calls reach the server, both with the second call's arguments; the first never does.
    SecondTwice,
    /// Only the first call reaches the server.
    OnlyFirst,
    /// Only one call reaches the server, with the second call's arguments.
    OnlySecond,
    /// Only one call reaches the server, with arguments of neither.
    OnlyOne,
    /// Three calls reach the server.
    BothThenAThird,
    /// More than three calls reach the server.
    BothThenMore,
    /// No call reaches the server: the client cannot take two tool calls in one answer.
    Neither,
}

impl OneAnswer {
    /// Whether nothing was measured.
    pub fn is_not_measured(&self) -> bool {
        *self == OneAnswer::NotMeasured
    }
}

impl Stability {
    /// Whether nothing was measured.
    pub fn is_not_measured(&self) -> bool {
        *self == Stability::default()
    }
}

/// `matrices/routers.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutersFile {
    /// Always [`FORMAT_VERSION`].
    pub version: u32,
    /// One row per router.
    pub routers: Vec<RouterRow>,
}

/// One router's conformance result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterRow {
    /// Stable slug, unique in the file.
    pub id: String,
    /// The router as people call it.
    pub router: String,
    /// Version tested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Day of the run, `YYYY-MM-DD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// The command that produced the result.
    pub command: String,
    /// One verdict per conformance check id, in check order.
    pub checks: Vec<RouterCheck>,
}

/// One conformance check's verdict for a router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterCheck {
    /// The check id.
    pub id: String,
    /// The verdict.
    pub verdict: CheckVerdict,
}

/// A conformance verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckVerdict {
    /// The router keeps the rule.
    Pass,
    /// The router breaks the rule.
    Fail,
    /// The check does not apply to this router (conform's `skipped`: the profile declares the
    /// capability absent).
    #[serde(alias = "skipped")]
    NotApplicable,
    /// The check could not run (conform's `not-run` and `error`).
    #[serde(alias = "not-run")]
    Error,
}

impl CheckVerdict {
    /// Word used in the Markdown.
    pub fn name(self) -> &'static str {
        match self {
            CheckVerdict::Pass => "pass",
            CheckVerdict::Fail => "fail",
            CheckVerdict::NotApplicable => "n/a",
            CheckVerdict::Error => "error",
        }
    }
}

/// Reads and parses a YAML file strictly, naming the field path on error.
fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, MatrixError> {
    let text = std::fs::read_to_string(path).map_err(|source| MatrixError::Io {
        action: "read",
        path: path.to_owned(),
        source,
    })?;
    parse_yaml(&text, path)
}

/// Parses YAML text strictly; `file` only names the source in errors.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &Path,
) -> Result<T, MatrixError> {
    crate::yaml::from_str(text).map_err(|e| MatrixError::Parse {
        file: file.to_owned(),
        path: e.path,
        message: e.message,
    })
}

/// Writes `text` to `path`, making its directory first.
pub(super) fn write_text(path: &Path, text: &str) -> Result<(), MatrixError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| MatrixError::Io {
            action: "write",
            path: parent.to_owned(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| MatrixError::Io {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

const CLIENTS_HEADER: &str = r"# The support matrix: one row per client surface. `callid matrix render` turns this file into
# SUPPORT.md; `callid measure --update` and `callid matrix add` rewrite it (comments are not kept).
";
const ROUTERS_HEADER: &str = r"# Conformance results per router. `callid matrix render` turns this file into SUPPORT.md.
";

fn version_rule(version: u32, file: &Path) -> Result<(), MatrixError> {
    if version == FORMAT_VERSION {
        Ok(())
    } else {
        Err(MatrixError::Parse {
            file: file.to_owned(),
            path: "version".into(),
            message: format!(
                "format version {version} is not supported; this callid reads {FORMAT_VERSION}"
            ),
        })
    }
}

impl ClientsFile {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, MatrixError> {
        let file: ClientsFile = read_yaml(path)?;
        if file.version != CLIENTS_FORMAT_VERSION {
            version_rule(file.version, path).map_err(|_| MatrixError::Parse {
                file: path.to_owned(),
                path: "version".into(),
                message: format!(
                    "format version {} is not supported; this callid reads {FORMAT_VERSION} and \
                     {CLIENTS_FORMAT_VERSION}",
                    file.version
                ),
            })?;
        }
        file.validate(path)?;
        Ok(file)
    }

    /// Writes the file in its canonical form.
    pub fn save(&self, path: &Path) -> Result<(), MatrixError> {
        self.validate(path)?;
        let body = serde_yaml::to_string(self).expect("matrix rows always serialize");
        write_text(path, &format!("{CLIENTS_HEADER}{body}"))
    }

    /// Inserts `row`, replacing the row with the same `id`; new rows go last. A version 1 file
    /// becomes [`CLIENTS_FORMAT_VERSION`] once every measured row gives its `protocol`.
    pub fn upsert(&mut self, row: ClientRow) {
        match self.clients.iter_mut().find(|r| r.id == row.id) {
            Some(slot) => *slot = row,
            None => self.clients.push(row),
        }
        if self
            .clients
            .iter()
            .all(|r| !matches!(r.how, How::Measured { .. }) || r.protocol.is_some())
        {
            self.version = CLIENTS_FORMAT_VERSION;
        }
    }

    /// Checks every rule; `file` only names the source in errors.
    pub fn validate(&self, file: &Path) -> Result<(), MatrixError> {
        let mut seen = std::collections::BTreeSet::new();
        for row in &self.clients {
            let fail = |rule: String| MatrixError::Rule {
                file: file.to_owned(),
                row: row.id.clone(),
                rule,
            };
            check_id_and_date(&mut seen, &row.id, row.date.as_deref())
                .map_err(|BrokenRule(rule)| fail(rule))?;
            match row.verdict {
                Verdict::Accepted => {
                    let Some(key) = &row.per_call_id else {
                        return Err(fail(
                            "an accepted row must name its `per_call_id` key".into(),
                        ));
                    };
                    if identity::Source::from_key(key).is_none() {
                        return Err(fail(format!(
                            "`per_call_id` `{key}` is not an identity source key (one of {})",
                            identity::SOURCE_KEYS.map(|k| format!("`{k}`")).join(", ")
                        )));
                    }
                    if row.reason.is_some() {
                        return Err(fail("an accepted row has no `reason`".into()));
                    }
                }
                Verdict::Rejected => {
                    let Some(reason) = &row.reason else {
                        return Err(fail("a rejected row must give its `reason` code".into()));
                    };
                    if !identity::IdentityError::CODES.contains(&reason.as_str()) {
                        return Err(fail(format!(
                            "`reason` `{reason}` is not an identity error code (one of {})",
                            identity::IdentityError::CODES
                                .map(|k| format!("`{k}`"))
                                .join(", ")
                        )));
                    }
                }
            }
            match &row.how {
                How::Measured { command, evidence } => {
                    if self.version >= CLIENTS_FORMAT_VERSION && row.protocol.is_none() {
                        return Err(fail(format!(
                            "a measured row must give the `protocol` version its evidence shows \
                             (format version {CLIENTS_FORMAT_VERSION})"
                        )));
                    }
                    if row.version.is_none() || row.date.is_none() {
                        return Err(fail(
                            "a measured row must give the exact `version` and `date` it measured"
                                .into(),
                        ));
                    }
                    if command.trim().is_empty() || evidence.is_empty() {
                        return Err(fail(
                            "a measured row must name its `command` and at least one `evidence` file"
                                .into(),
                        ));
                    }
                    for e in evidence {
                        if e.starts_with('/') || e.split('/').any(|part| part == "..") {
                            return Err(fail(format!(
                                "evidence `{e}` must be a path inside the matrix directory"
                            )));
                        }
                    }
                }
                How::Reported { source } => {
                    if source.trim().is_empty() {
                        return Err(fail("a reported row must name its `source`".into()));
                    }
                    if row.version.is_some() {
                        return Err(fail(
                            "a reported row must not claim a `version` it did not see; measure it \
                             to give one"
                                .into(),
                        ));
                    }
                    if row.stability != Stability::default() {
                        return Err(fail(
                            "a reported row has no `stability` findings; they come only from \
                             measurement"
                                .into(),
                        ));
                    }
                    reported_keys_rule(row).map_err(|BrokenRule(rule)| fail(rule))?;
                }
            }
        }
        Ok(())
    }
}

impl RoutersFile {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, MatrixError> {
        let file: RoutersFile = read_yaml(path)?;
        version_rule(file.version, path)?;
        file.validate(path)?;
        Ok(file)
    }

    /// Writes the file in its canonical form.
    pub fn save(&self, path: &Path) -> Result<(), MatrixError> {
        self.validate(path)?;
        let body = serde_yaml::to_string(self).expect("router rows always serialize");
        write_text(path, &format!("{ROUTERS_HEADER}{body}"))
    }

    /// Checks every rule; `file` only names the source in errors.
    pub fn validate(&self, file: &Path) -> Result<(), MatrixError> {
        let mut seen = std::collections::BTreeSet::new();
        for row in &self.routers {
            let fail = |rule: String| MatrixError::Rule {
                file: file.to_owned(),
                row: row.id.clone(),
                rule,
            };
            check_id_and_date(&mut seen, &row.id, row.date.as_deref())
                .map_err(|BrokenRule(rule)| fail(rule))?;
            let mut checks = std::collections::BTreeSet::new();
            for c in &row.checks {
                if !checks.insert(c.id.as_str()) {
                    return Err(fail(format!("check `{}` appears twice", c.id)));
                }
            }
        }
        Ok(())
    }
}

/// The matrix directory's data, loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// The client rows.
    pub clients: ClientsFile,
    /// The router rows (empty when `routers.yaml` does not exist).
    pub routers: RoutersFile,
}

impl Matrix {
    /// Loads `dir/clients.yaml` and, if present, `dir/routers.yaml`.
    pub fn load(dir: &Path) -> Result<Self, MatrixError> {
        let clients = ClientsFile::load(&dir.join(CLIENTS_FILE))?;
        let routers_path = dir.join(ROUTERS_FILE);
        let routers = if routers_path.exists() {
            RoutersFile::load(&routers_path)?
        } else {
            RoutersFile {
                version: FORMAT_VERSION,
                routers: Vec::new(),
            }
        };
        Ok(Matrix { clients, routers })
    }
}

fn is_slug(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// A slug for file names from a client name and version: lowercase, runs of anything else
/// turned into one `-`.
pub fn slug(parts: &[&str]) -> String {
    let mut out = String::new();
    for part in parts {
        for c in part.chars() {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
                out.push(c);
            } else if !out.ends_with('-') && !out.is_empty() {
                out.push('-');
            }
        }
        if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out.truncate(64);
    out
}

/// A rule a row breaks, as a fragment ("`id` appears twice; ..."): what a row check knows before
/// the file and the row are named. A newtype rather than an error type: it only ever becomes the
/// `rule` of a [`MatrixError::Rule`] (code `matrix_rule`), which the caller builds.
struct BrokenRule(String);

/// A reported row lists the keys of one `tools/call` `_meta`, so its verdict must be what the
/// identity rules make of those keys: each key listed once; an accepted row carries no identity
/// source key beside its `per_call_id` (two are `ambiguous_identity`); a `missing_identity` row
/// carries none, an `ambiguous_identity` row at least two. (A measured row is checked against
/// its evidence instead: its keys span several calls, which may differ.)
fn reported_keys_rule(row: &ClientRow) -> Result<(), BrokenRule> {
    let mut seen = std::collections::BTreeSet::new();
    let listed = row
        .per_call_id
        .iter()
        .chain(row.call_level_keys.iter().flatten())
        .chain(row.context_keys.iter().flatten());
    for key in listed {
        if !seen.insert(key.as_str()) {
            return Err(BrokenRule(format!(
                "`{key}` is listed twice; a key is the per-call ID, a call-level key or a \
                 context key"
            )));
        }
    }
    let sources: Vec<&str> = row
        .call_level_keys
        .iter()
        .flatten()
        .chain(row.context_keys.iter().flatten())
        .map(String::as_str)
        .filter(|k| identity::Source::from_key(k).is_some())
        .collect();
    match (row.verdict, row.reason.as_deref()) {
        (Verdict::Accepted, _) => match sources.first() {
            Some(key) => Err(BrokenRule(format!(
                "lists the identity source key `{key}` beside its `per_call_id`; the identity \
                 rules refuse a `_meta` with two source keys (`ambiguous_identity`)"
            ))),
            None => Ok(()),
        },
        (Verdict::Rejected, Some("missing_identity")) => match sources.first() {
            Some(key) => Err(BrokenRule(format!(
                "lists the identity source key `{key}`, so the identity rules would not judge \
                 its `_meta` `missing_identity`"
            ))),
            None => Ok(()),
        },
        (Verdict::Rejected, Some("ambiguous_identity")) if sources.len() < 2 => Err(BrokenRule(
            "an `ambiguous_identity` row must list at least two identity source keys".into(),
        )),
        _ => Ok(()),
    }
}

/// The rules every row shares: a slug `id`, unique in its file, and an ISO `date` if any.
fn check_id_and_date<'a>(
    seen: &mut std::collections::BTreeSet<&'a str>,
    id: &'a str,
    date: Option<&str>,
) -> Result<(), BrokenRule> {
    if !is_slug(id) {
        return Err(BrokenRule(
            "`id` must be 1 to 64 of lowercase letters, digits, `.` and `-`".into(),
        ));
    }
    if !seen.insert(id) {
        return Err(BrokenRule(
            "`id` appears twice; each row needs its own".into(),
        ));
    }
    if let Some(date) = date
        && !is_date(date)
    {
        return Err(BrokenRule(format!("`date` `{date}` is not `YYYY-MM-DD`")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_yaml_errors_name_the_path() {
        let cases = [
            (
                "version: 1\nclients:\n  - id: a\n    client: A\n    surface: s\n    verdict: maybe\n    how: {kind: reported, source: x}\n",
                "clients[0].verdict",
            ),
            (
                "version: 1\nclients:\n  - id: a\n    client: A\n    surface: s\n    verdict: accepted\n    per_call_id: callId\n    colour: red\n    how: {kind: reported, source: x}\n",
                "clients[0].colour",
            ),
            (
                "version: 1\nclients:\n  - id: a\n    client: A\n    surface: s\n    verdict: accepted\n    per_call_id: callId\n    stability: {distinct_ids: sometimes}\n    how: {kind: reported, source: x}\n",
                "clients[0].stability.distinct_ids",
            ),
            (
                "version: 1\nclients:\n  - id: a\n    client: A\n    surface: s\n    verdict: accepted\n    per_call_id: callId\n    how: {kind: guessed}\n",
                "clients[0].how.kind",
            ),
        ];
        for (text, want) in cases {
            let err = parse_yaml::<ClientsFile>(text, Path::new("clients.yaml")).unwrap_err();
            match &err {
                MatrixError::Parse { path, .. } => assert_eq!(path, want, "{err}"),
                other => panic!("expected a parse error, got {other}"),
            }
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    fn row(text: &str) -> Result<(), MatrixError> {
        let file: ClientsFile = parse_yaml(text, Path::new("clients.yaml"))?;
        file.validate(Path::new("clients.yaml"))
    }

    #[test]
    fn rules_refuse_rows_that_claim_too_much() {
        let head = "version: 1\nclients:\n  - id: a\n    client: A\n    surface: s\n";
        let cases = [
            (
                "verdict: accepted\n    how: {kind: reported, source: x}\n",
                "must name its `per_call_id`",
            ),
            (
                "verdict: accepted\n    per_call_id: sessionId\n    how: {kind: reported, source: x}\n",
                "not an identity source key",
            ),
            (
                "verdict: rejected\n    how: {kind: reported, source: x}\n",
                "must give its `reason`",
            ),
            (
                "verdict: rejected\n    reason: nope\n    how: {kind: reported, source: x}\n",
                "not an identity error code",
            ),
            (
                "version: 1.0.0\n    verdict: accepted\n    per_call_id: callId\n    how: {kind: reported, source: x}\n",
                "must not claim a `version`",
            ),
            (
                "verdict: accepted\n    per_call_id: callId\n    how: {kind: measured, command: c, evidence: [e.jsonl]}\n",
                "exact `version` and `date`",
            ),
            (
                "version: 1\n    date: 2026-11-29\n    verdict: accepted\n    per_call_id: callId\n    how: {kind: measured, command: c, evidence: []}\n",
                "at least one `evidence`",
            ),
            (
                "version: 1\n    date: 2026-11-29\n    verdict: accepted\n    per_call_id: callId\n    how: {kind: measured, command: c, evidence: [../x]}\n",
                "inside the matrix directory",
            ),
            (
                "date: 29.11.2026\n    verdict: accepted\n    per_call_id: callId\n    how: {kind: reported, source: x}\n",
                "not `YYYY-MM-DD`",
            ),
            (
                "verdict: accepted\n    per_call_id: callId\n    stability: {distinct_ids: distinct}\n    how: {kind: reported, source: x}\n",
                "no `stability` findings",
            ),
            (
                "verdict: accepted\n    per_call_id: callId\n    call_level_keys: [callId]\n    how: {kind: reported, source: x}\n",
                "`callId` is listed twice",
            ),
            (
                "verdict: rejected\n    reason: missing_identity\n    call_level_keys: [a]\n    context_keys: [a]\n    how: {kind: reported, source: x}\n",
                "`a` is listed twice",
            ),
            (
                "verdict: accepted\n    per_call_id: claudecode/toolUseId\n    call_level_keys: [callId]\n    how: {kind: reported, source: x}\n",
                "beside its `per_call_id`",
            ),
            (
                "verdict: rejected\n    reason: missing_identity\n    context_keys: [sessionId, claudecode/toolUseId]\n    how: {kind: reported, source: x}\n",
                "would not judge its `_meta` `missing_identity`",
            ),
            (
                "verdict: rejected\n    reason: ambiguous_identity\n    call_level_keys: [callId, itemId]\n    how: {kind: reported, source: x}\n",
                "at least two identity source keys",
            ),
        ];
        for (tail, want) in cases {
            let err = row(&format!("{head}    {tail}")).unwrap_err();
            assert_eq!(err.code(), "matrix_rule", "{err}");
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        row(&format!(
            "{head}    verdict: rejected\n    reason: missing_identity\n    how: {{kind: reported, source: x}}\n"
        ))
        .unwrap();
        row(&format!(
            "{head}    verdict: rejected\n    reason: ambiguous_identity\n    call_level_keys: [callId, claudecode/toolUseId]\n    how: {{kind: reported, source: x}}\n"
        ))
        .unwrap();
        row(&format!(
            "{head}    verdict: accepted\n    per_call_id: claudecode/toolUseId\n    call_level_keys: [io.opengsd/idempotency-key]\n    how: {{kind: reported, source: x}}\n"
        ))
        .unwrap();
        // A measured row's keys span several calls and are checked against its evidence.
        row(&format!(
            "{head}    version: 1.0.0\n    date: 2026-11-30\n    verdict: rejected\n    reason: missing_identity\n    call_level_keys: [callId]\n    how: {{kind: measured, command: c, evidence: [e.jsonl]}}\n"
        ))
        .unwrap();
    }

    #[test]
    fn format_2_needs_the_protocol_of_a_measured_row_and_format_1_is_still_read() {
        let measured = "  - id: a\n    client: A\n    surface: s\n    version: 1.0.0\n    \
                        date: 2026-11-30\n{protocol}    verdict: rejected\n    reason: \
                        missing_identity\n    how: {kind: measured, command: c, evidence: [e.jsonl]}\n";
        let file = |version: u32, protocol: &str| {
            format!(
                "version: {version}\nclients:\n{}",
                measured.replace("{protocol}", protocol)
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CLIENTS_FILE);
        let load = |text: String| {
            std::fs::write(&path, text).unwrap();
            ClientsFile::load(&path)
        };
        load(file(1, "")).unwrap();
        let ok = load(file(2, "    protocol: 2026-07-28\n")).unwrap();
        assert_eq!(ok.clients[0].protocol.as_deref(), Some("2026-07-28"));
        let err = load(file(2, "")).unwrap_err();
        assert!(
            err.to_string().contains("must give the `protocol`"),
            "{err}"
        );
        let err = load(file(3, "    protocol: 2026-07-28\n")).unwrap_err();
        assert_eq!(err.code(), "matrix_parse");
        assert!(err.to_string().contains("reads 1 and 2"), "{err}");
        // A version 1 file becomes version 2 once every measured row gives its protocol.
        let mut v1 = load(file(1, "")).unwrap();
        let mut row = v1.clients[0].clone();
        v1.upsert(row.clone());
        assert_eq!(v1.version, FORMAT_VERSION);
        row.protocol = Some("2025-11-25".into());
        v1.upsert(row);
        assert_eq!(v1.version, CLIENTS_FORMAT_VERSION);
    }

    #[test]
    fn slugs() {
        assert_eq!(
            slug(&["codex-mcp-client", "0.171.0"]),
            "codex-mcp-client-0.171.0"
        );
        assert_eq!(slug(&["Claude Code", "2.1.332"]), "claude-code-2.1.332");
        assert_eq!(slug(&["@x/y!", ""]), "x-y");
    }
}
