//! Scenario files: the strict YAML language of `scenarios/*.yaml`, and their loading.
//!
//! A [`Scenario`] is one check: a stable id, the article rule it cites, and the steps that drive a
//! router, each with its expectations. Parsing is strict (`deny_unknown_fields` everywhere) and
//! every error names the file and the path inside it (`scenarios/x.yaml: steps[2].expect.charges:
//! ...`). Steps are internally tagged by `do:`; serde's internally tagged enums buffer their
//! content and lose the path, so the tag is dispatched here by hand and the path kept.
//!
//! # Router processes
//! Every step but `approve` and `deny` takes `router: first` (the default) or `router: second`: a
//! second process of the same target profile on the same state, started on first use (see
//! [`RouterChoice`]); a `concurrent` step may take `router: both`, alternating its deliveries. A
//! `redeliver` step that names no router goes to the second process when the profile sets
//! `redeliver_on_second` (a replicated target).
//!
//! # Backends
//! A scenario with `idempotent_backend: true` is written for a backend that honours idempotency
//! keys (it re-sends under the key), one with `false` for a backend that charges every request
//! (`at-most-once.*`: `dispatches:` counts, `do: resolve` runs the profile's resolve command);
//! against a profile declaring the other kind it is skipped ([`Scenario::idempotent_backend`]).
//!
//! # Signed envelopes
//! A scenario with `signed_envelopes: true` runs the router as the profile's `signed_envelopes`
//! says, with a key the runner makes for the check, and is skipped for a profile without it; its
//! `call` steps may `sign:` their envelope ([`SignAs`]: `valid`, `forged`, `unknown_key`,
//! `expired`, `not_yet_valid`). A redelivery sends the same signed `_meta` again.
//!
//! # Placeholders in `_meta` and argument strings
//! - `{call:NAME}`: a fresh ID, the same for every use of `NAME` within one run of the scenario and
//!   different in every run (so a router with a long-lived registry never sees an old ID).
//! - `{long:N}`: `N` ASCII letters (bounds tests).
//! - `{repeat:N:TEXT}`: `TEXT` (no `}`) `N` times, e.g. `{repeat:171:€}` is 171 characters and
//!   513 bytes (bounds counted in bytes).

pub use super::signer::SignAs;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One check: a scenario file.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Stable check id (`redelivery.same-connection`).
    pub id: String,
    /// One line saying what is checked.
    pub title: String,
    /// Short citation of the article rule.
    pub rule: String,
    /// The article's own words for the rule.
    pub article: String,
    /// Required (an article rule: decides the exit code) or recommended (a callid convention).
    pub level: super::report::Level,
    /// MCP protocol version to initialize with (default [`DEFAULT_PROTOCOL`]).
    pub protocol: String,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Which backend the check is written for: `Some(true)` one that honours idempotency keys,
    /// `Some(false)` one that charges every request; `None` either. A check whose backend is not
    /// the profile's (`idempotent_backend`) is skipped.
    pub idempotent_backend: Option<bool>,
    /// The check signs envelopes (`sign:` steps, or an unsigned envelope a router with trust
    /// keys must refuse): it runs the router as the profile's `signed_envelopes` says, with a
    /// key the runner makes for it ([`super::signer`]), and is skipped for a profile without it.
    pub signed_envelopes: bool,
    /// The file it was read from.
    pub file: PathBuf,
}

/// Protocol version a scenario initializes with unless it names one.
pub const DEFAULT_PROTOCOL: &str = "2025-06-18";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    id: String,
    title: String,
    rule: String,
    article: String,
    #[serde(default)]
    level: super::report::Level,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    idempotent_backend: Option<bool>,
    #[serde(default)]
    signed_envelopes: bool,
    steps: Vec<serde_yaml::Value>,
}

/// One step of a scenario (`do:` in YAML).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `do: call`: one `tools/call` of the spend tool.
    Call(CallStep),
    /// `do: redeliver`: the same `tools/call` as step `of`, again, with a new JSON-RPC id.
    Redeliver(RedeliverStep),
    /// `do: concurrent`: `count` deliveries of one call, all in flight at once.
    Concurrent(ConcurrentStep),
    /// `do: status`: the status tool with the handle of step `of` (or a given handle).
    Status(HandleStep),
    /// `do: resume`: the resume tool with the handle of step `of`.
    Resume(HandleStep),
    /// `do: approve`: the target's approve command with the handle of step `of`.
    Approve(OperatorStep),
    /// `do: deny`: the target's deny command with the handle of step `of`.
    Deny(OperatorStep),
    /// `do: resolve`: the target's resolve command with the handle of step `of` and what a
    /// person found (`charged: true|false`).
    Resolve(ResolveStep),
    /// `do: restart`: stop the router (kill -9 unless `graceful`) and start it on the same state.
    Restart(RestartStep),
    /// `do: reconnect`: drop the connection and open a new one (a new process on the same state
    /// for stdio; a new session for HTTP).
    Reconnect(ReconnectStep),
    /// `do: list_tools`: `tools/list`.
    ListTools(ListToolsStep),
}

impl Step {
    /// The `do:` name of the step.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Call(_) => "call",
            Step::Redeliver(_) => "redeliver",
            Step::Concurrent(_) => "concurrent",
            Step::Status(_) => "status",
            Step::Resume(_) => "resume",
            Step::Approve(_) => "approve",
            Step::Deny(_) => "deny",
            Step::Resolve(_) => "resolve",
            Step::Restart(_) => "restart",
            Step::Reconnect(_) => "reconnect",
            Step::ListTools(_) => "list_tools",
        }
    }

    /// The router process the step talks to (`approve` and `deny` run an operator command on
    /// the shared state: the first).
    pub fn router(&self) -> RouterChoice {
        match self {
            Step::Call(s) => s.router,
            Step::Redeliver(s) => s.router.unwrap_or_default(),
            Step::Concurrent(s) => s.router,
            Step::Status(s) | Step::Resume(s) => s.router,
            Step::Restart(s) => s.router,
            Step::Reconnect(s) => s.router,
            Step::ListTools(s) => s.router,
            Step::Approve(_) | Step::Deny(_) | Step::Resolve(_) => RouterChoice::First,
        }
    }

    /// The step's expectations, if it has any.
    pub fn expect(&self) -> Option<&Expect> {
        match self {
            Step::Call(s) => Some(&s.expect),
            Step::Redeliver(s) => Some(&s.expect),
            Step::Concurrent(s) => Some(&s.expect),
            Step::Status(s) | Step::Resume(s) => Some(&s.expect),
            Step::ListTools(s) => Some(&s.expect),
            Step::Approve(_)
            | Step::Deny(_)
            | Step::Resolve(_)
            | Step::Restart(_)
            | Step::Reconnect(_) => None,
        }
    }
}

/// Which router process a step talks to. Both processes are started from the same profile on
/// the same state (`{state_dir}`, `{registry}`); the second one has its own `{port}` and is started
/// on first use. Steps that use the second process need the profile's
/// `capabilities.shared_registry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterChoice {
    /// The router process every scenario starts with.
    #[default]
    First,
    /// A second process of the same router on the same registry.
    Second,
    /// (`concurrent` only) deliveries alternate between the first and the second process.
    Both,
}

/// `do: call`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallStep {
    /// Label that later steps refer to (`of:`).
    #[serde(default)]
    pub name: Option<String>,
    /// The request's `_meta`; absent means no `_meta` at all.
    #[serde(default)]
    pub meta: Option<Map<String, Value>>,
    /// The arguments (default: the profile's `spend` set).
    #[serde(default)]
    pub arguments: Arguments,
    /// The JSON-RPC id to use (default: the connection's next unused number).
    #[serde(default)]
    pub jsonrpc_id: Option<Value>,
    /// Kill the router at this provider trigger while the call is in flight.
    #[serde(default)]
    pub kill: Option<KillTrigger>,
    /// The provider answers the next request with this HTTP status (charging nothing).
    #[serde(default)]
    pub provider_fails: Option<u16>,
    /// The backend holds its answer to this call this long before charging (a slow backend: a
    /// router's own timeout may end its wait first).
    #[serde(default)]
    pub hold_ms: u64,
    /// Sign the `_meta` envelope with the check's key this way ([`SignAs`]); needs
    /// `signed_envelopes: true`. A redelivery of the step sends the same signature again.
    #[serde(default)]
    pub sign: Option<SignAs>,
    /// Which router process takes this step (`first`, the default; `second`, a second process
    /// of the same profile on the same state, started on first use).
    #[serde(default)]
    pub router: RouterChoice,
    /// What must hold after the step.
    #[serde(default)]
    pub expect: Expect,
}

/// `do: redeliver`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedeliverStep {
    /// Label of this delivery.
    #[serde(default)]
    pub name: Option<String>,
    /// The call (or concurrent burst) to deliver again.
    pub of: String,
    /// The JSON-RPC id to use (default: the connection's next unused number).
    #[serde(default)]
    pub jsonrpc_id: Option<Value>,
    /// Which router process takes the redelivery; left out, the first, or the second when the
    /// profile sets `redeliver_on_second` (a replicated target).
    #[serde(default)]
    pub router: Option<RouterChoice>,
    /// What must hold after the step.
    #[serde(default)]
    pub expect: Expect,
}

/// `do: concurrent`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrentStep {
    /// Label (its handle is the handle the deliveries agreed on).
    #[serde(default)]
    pub name: Option<String>,
    /// How many deliveries (2 to 256).
    pub count: u32,
    /// The provider holds its reply to the first charge this long, so deliveries overlap. With
    /// `router: both` it is a ceiling: the hold ends on an observed event or at the latest
    /// then, and the step is judged the same either way (see the runner's `concurrent`).
    #[serde(default)]
    pub hold_ms: u64,
    /// The request's `_meta`.
    #[serde(default)]
    pub meta: Option<Map<String, Value>>,
    /// The arguments.
    #[serde(default)]
    pub arguments: Arguments,
    /// Which router process receives the deliveries: `both` alternates them between the first
    /// and the second process (single flight across processes sharing one registry).
    #[serde(default)]
    pub router: RouterChoice,
    /// What must hold after the step.
    #[serde(default)]
    pub expect: Expect,
}

/// `do: status` and `do: resume`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandleStep {
    /// Label of this step.
    #[serde(default)]
    pub name: Option<String>,
    /// The step whose handle is used.
    #[serde(default)]
    pub of: Option<String>,
    /// A literal handle instead (e.g. an unknown one).
    #[serde(default)]
    pub handle: Option<String>,
    /// Which router process takes this step (`first`, the default; `second`, a second process
    /// of the same profile on the same state, started on first use).
    #[serde(default)]
    pub router: RouterChoice,
    /// What must hold after the step.
    #[serde(default)]
    pub expect: Expect,
}

/// `do: approve` and `do: deny`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorStep {
    /// The step whose handle is approved or denied.
    pub of: String,
}

/// `do: resolve`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveStep {
    /// The step whose handle (an operation in doubt) is resolved.
    pub of: String,
    /// What a person found at the backend: it charged (`{outcome}` is `charged`) or not
    /// (`not-charged`).
    pub charged: bool,
}

/// `do: restart`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartStep {
    /// Close stdin and let the router exit instead of killing it with SIGKILL.
    #[serde(default)]
    pub graceful: bool,
    /// Which router process is restarted.
    #[serde(default)]
    pub router: RouterChoice,
}

/// `do: reconnect`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconnectStep {
    /// Which router process is reconnected.
    #[serde(default)]
    pub router: RouterChoice,
}

/// `do: list_tools`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListToolsStep {
    /// Which router process takes this step (`first`, the default; `second`, a second process
    /// of the same profile on the same state, started on first use).
    #[serde(default)]
    pub router: RouterChoice,
    /// What must hold after the step.
    #[serde(default)]
    pub expect: Expect,
}

/// The arguments of a call: a named set from the target profile, plus keys, or a literal object.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arguments {
    /// A named argument set of the target profile.
    #[serde(default)]
    pub set: Option<ArgumentSet>,
    /// Keys added at the top level of the set.
    #[serde(default)]
    pub add: Option<Map<String, Value>>,
    /// A literal arguments value instead of a set.
    #[serde(default)]
    pub literal: Option<Value>,
    /// Write the same arguments in another JSON form (the same JSON value, other bytes).
    #[serde(default)]
    pub form: Option<Form>,
}

impl Default for Arguments {
    fn default() -> Self {
        Arguments {
            set: Some(ArgumentSet::Spend),
            add: None,
            literal: None,
            form: None,
        }
    }
}

/// Other ways to write the same JSON arguments, for the request hash's canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Every object's members in reverse order, at every depth.
    Reordered,
    /// Every integer written as a number with a fraction (`512` as `512.0`).
    FractionNumbers,
    /// Both.
    ReorderedFractionNumbers,
    /// Every character of every string (keys included) written as a `\uXXXX` escape.
    Escaped,
}

impl Form {
    /// `value` written in this form.
    pub fn apply(self, value: &Value) -> Value {
        fn reorder(v: &Value) -> Value {
            match v {
                Value::Object(m) => Value::Object(
                    m.iter()
                        .rev()
                        .map(|(k, v)| (k.clone(), reorder(v)))
                        .collect(),
                ),
                Value::Array(a) => Value::Array(a.iter().map(reorder).collect()),
                other => other.clone(),
            }
        }
        fn fractions(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    Value::Object(m.iter().map(|(k, v)| (k.clone(), fractions(v))).collect())
                }
                Value::Array(a) => Value::Array(a.iter().map(fractions).collect()),
                Value::Number(n) if n.is_i64() || n.is_u64() => n
                    .as_f64()
                    .filter(|f| f.abs() < 9_007_199_254_740_992.0)
                    .and_then(serde_json::Number::from_f64)
                    .map_or_else(|| v.clone(), Value::Number),
                other => other.clone(),
            }
        }
        match self {
            Form::Reordered => reorder(value),
            Form::FractionNumbers => fractions(value),
            Form::ReorderedFractionNumbers => reorder(&fractions(value)),
            Form::Escaped => value.clone(),
        }
    }
}

/// `value` as JSON text with every character of every string (keys included) written as a
/// `\uXXXX` escape (UTF-16, surrogate pairs beyond the BMP): the same JSON value in other bytes.
pub fn escaped_json(value: &Value) -> String {
    fn string(s: &str, out: &mut String) {
        out.push('"');
        let mut units = [0u16; 2];
        for c in s.chars() {
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
        out.push('"');
    }
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::String(s) => string(s, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                out.push('{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    string(k, out);
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// The argument sets every target profile names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgumentSet {
    /// A spend that needs no approval.
    Spend,
    /// A different spend that needs no approval.
    Other,
    /// A spend that the target's policy sends to approval.
    Approval,
}

/// The provider events at which the runner can kill the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KillTrigger {
    /// The provider received the request; nothing is charged (it answers 503 to a dead router).
    BeforeCharge,
    /// The provider committed the charge; the router dies before it reads the reply.
    AfterCharge,
}

/// What must hold after a step. Every field is optional; all given ones are checked.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// A successful tool result (`isError` not true).
    #[serde(default)]
    pub ok: Option<bool>,
    /// A tool error with this contract code (the profile's `error_codes` maps it to the router's
    /// own name).
    #[serde(default)]
    pub error: Option<String>,
    /// A tool error whose code is literally this name, whatever the profile maps (callid's
    /// error-code convention: recommended checks only).
    #[serde(default)]
    pub error_named: Option<String>,
    /// The operation status in the result.
    #[serde(default)]
    pub status: Option<String>,
    /// Whether the response carries a public handle.
    #[serde(default)]
    pub has_handle: Option<bool>,
    /// The handle equals that of this step.
    #[serde(default)]
    pub same_handle_as: Option<String>,
    /// The handle differs from that of each of these steps.
    #[serde(default)]
    pub different_handle_from: Vec<String>,
    /// The result (profile pointer `result`) equals that of this step.
    #[serde(default)]
    pub result_equals: Option<String>,
    /// The result is marked replayed (profile pointer `replayed`), or not.
    #[serde(default)]
    pub replayed: Option<bool>,
    /// Charges the runner's provider recorded since the scenario started.
    #[serde(default)]
    pub charges: Option<u64>,
    /// Requests for the paid tool the runner's provider received since the scenario started
    /// (dispatches, charged or not).
    #[serde(default)]
    pub dispatches: Option<u64>,
    /// The result's charge id is a charge in the runner's ledger.
    #[serde(default)]
    pub charge_in_ledger: Option<bool>,
    /// No idempotency key the provider received contains the private key prefix.
    #[serde(default)]
    pub provider_keys_not_private: Option<bool>,
    /// Every request the provider received in this scenario carried one idempotency key (one
    /// operation continued under the same key).
    #[serde(default)]
    pub provider_one_key: Option<bool>,
    /// The router died without answering (with `kill:`).
    #[serde(default)]
    pub no_reply: Option<bool>,
    /// (`concurrent`) every delivery answered the same operation (success or
    /// `operation_in_progress`, one handle), and at least one succeeded.
    #[serde(default)]
    pub one_operation: Option<bool>,
    /// (`list_tools`) no tool's input schema has an identity-like property, at any depth.
    #[serde(default)]
    pub no_identity_fields: Option<bool>,
}

impl Expect {
    /// Whether this expectation reads the runner's ledger.
    pub fn needs_ledger(&self) -> bool {
        self.charges.is_some()
            || self.dispatches.is_some()
            || self.charge_in_ledger.is_some()
            || self.provider_keys_not_private.is_some()
            || self.provider_one_key.is_some()
    }
}

/// Why a scenario file or directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The directory could not be read.
    #[error("failed to read the scenario directory `{dir}`: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read.
    #[error("failed to read `{file}`: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a valid scenario.
    #[error("{file}: {path}: {message}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Where in the file (`steps[2].expect.charges`, or `.` for the whole document).
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Two files declare the same id.
    #[error("check id `{id}` is declared by both `{first}` and `{second}`; ids must be unique")]
    DuplicateId {
        /// The id.
        id: String,
        /// The first file.
        first: PathBuf,
        /// The second file.
        second: PathBuf,
    },
    /// `--only` named an id no file declares.
    #[error(
        "no scenario has the check id `{id}` (the nearest is `{nearest}`); `callid conform \
         --list` prints every id"
    )]
    UnknownId {
        /// The id given.
        id: String,
        /// The declared id with the fewest edits from it.
        nearest: String,
    },
    /// The directory has no scenario.
    #[error("no scenario file (`*.yaml`) in `{0}`")]
    Empty(PathBuf),
}

impl ScenarioError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ScenarioError::Dir { .. } => "scenario_dir_unreadable",
            ScenarioError::Read { .. } => "scenario_unreadable",
            ScenarioError::Invalid { .. } => "scenario_invalid",
            ScenarioError::DuplicateId { .. } => "scenario_duplicate_id",
            ScenarioError::UnknownId { .. } => "scenario_unknown_id",
            ScenarioError::Empty(_) => "scenario_dir_empty",
        }
    }
}

/// The built-in scenarios ([`super::builtin::SCENARIOS`]), sorted by check id.
pub fn load_builtin() -> Result<Vec<Scenario>, ScenarioError> {
    let texts = super::builtin::SCENARIOS.iter().map(|(name, text)| {
        (
            PathBuf::from(format!("scenarios/{name} (built in)")),
            text.to_string(),
        )
    });
    collect(texts)
}

/// The built-in scenarios with those of `dir` added; a file of `dir` whose id is a built-in one
/// replaces it.
pub fn load_with_overrides(dir: &Path) -> Result<Vec<Scenario>, ScenarioError> {
    let mut scenarios = load_builtin()?;
    for own in load_dir(dir)? {
        match scenarios.iter_mut().find(|s| s.id == own.id) {
            Some(slot) => *slot = own,
            None => scenarios.push(own),
        }
    }
    scenarios.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(scenarios)
}

/// Loads every `*.yaml` file directly in `dir` (not subdirectories), sorted by check id.
pub fn load_dir(dir: &Path) -> Result<Vec<Scenario>, ScenarioError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ScenarioError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ScenarioError::Empty(dir.to_path_buf()));
    }
    let mut texts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ScenarioError::Read {
            file: file.clone(),
            source,
        })?;
        texts.push((file, text));
    }
    collect(texts)
}

/// Parses `(file, text)` pairs, refusing duplicate ids; sorted by check id.
fn collect(
    texts: impl IntoIterator<Item = (PathBuf, String)>,
) -> Result<Vec<Scenario>, ScenarioError> {
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut scenarios = Vec::new();
    for (file, text) in texts {
        let scenario = parse(&text, &file)?;
        if let Some(first) = seen.insert(scenario.id.clone(), file.clone()) {
            return Err(ScenarioError::DuplicateId {
                id: scenario.id,
                first,
                second: file,
            });
        }
        scenarios.push(scenario);
    }
    scenarios.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(scenarios)
}

/// Keeps only the scenarios whose id is in `only` (all when `only` is empty).
pub fn select(scenarios: Vec<Scenario>, only: &[String]) -> Result<Vec<Scenario>, ScenarioError> {
    if only.is_empty() {
        return Ok(scenarios);
    }
    if let Some(unknown) = only
        .iter()
        .find(|id| !scenarios.iter().any(|s| &&s.id == id))
    {
        let ids = scenarios.iter().map(|s| s.id.as_str());
        return Err(ScenarioError::UnknownId {
            id: unknown.clone(),
            nearest: crate::text::nearest(unknown, ids)
                .unwrap_or_default()
                .to_owned(),
        });
    }
    Ok(scenarios
        .into_iter()
        .filter(|s| only.contains(&s.id))
        .collect())
}

fn invalid(file: &Path, path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        file: file.to_path_buf(),
        path: path.into(),
        message: message.into(),
    }
}

fn from_value<T: serde::de::DeserializeOwned>(
    value: serde_yaml::Value,
    file: &Path,
    prefix: &str,
) -> Result<T, ScenarioError> {
    crate::yaml::from_value(value).map_err(|e| {
        let path = match (prefix.is_empty(), e.path == ".") {
            (true, _) => e.path,
            (false, true) => prefix.to_string(),
            (false, false) => format!("{prefix}.{}", e.path),
        };
        invalid(file, path, e.message)
    })
}

/// Parses one scenario document; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Scenario, ScenarioError> {
    let doc: serde_yaml::Value =
        crate::yaml::from_str(text).map_err(|e| invalid(file, e.path, e.message))?;
    let raw: RawScenario = from_value(doc, file, "")?;
    if !is_check_id(&raw.id) {
        return Err(invalid(
            file,
            "id",
            format!(
                "`{}` is not a check id: use lowercase letters, digits, `-` and `.`, starting with a letter",
                raw.id
            ),
        ));
    }
    if raw.steps.is_empty() {
        return Err(invalid(file, "steps", "a scenario needs at least one step"));
    }
    let mut steps = Vec::with_capacity(raw.steps.len());
    for (i, value) in raw.steps.into_iter().enumerate() {
        steps.push(parse_step(value, file, &format!("steps[{i}]"))?);
    }
    let scenario = Scenario {
        id: raw.id,
        title: raw.title,
        rule: raw.rule,
        article: raw.article,
        level: raw.level,
        protocol: raw.protocol.unwrap_or_else(|| DEFAULT_PROTOCOL.to_string()),
        steps,
        idempotent_backend: raw.idempotent_backend,
        signed_envelopes: raw.signed_envelopes,
        file: file.to_path_buf(),
    };
    validate(&scenario)?;
    Ok(scenario)
}

fn is_check_id(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_lowercase())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

fn parse_step(value: serde_yaml::Value, file: &Path, at: &str) -> Result<Step, ScenarioError> {
    let serde_yaml::Value::Mapping(mut map) = value else {
        return Err(invalid(
            file,
            at,
            "a step must be a mapping with a `do:` key",
        ));
    };
    let kind = match map.remove("do") {
        Some(serde_yaml::Value::String(kind)) => kind,
        Some(_) => return Err(invalid(file, format!("{at}.do"), "`do` must be a string")),
        None => {
            return Err(invalid(
                file,
                at,
                "missing `do:` (call, redeliver, concurrent, status, resume, approve, deny, resolve, restart, reconnect, list_tools)",
            ));
        }
    };
    let rest = serde_yaml::Value::Mapping(map);
    Ok(match kind.as_str() {
        "call" => Step::Call(from_value(rest, file, at)?),
        "redeliver" => Step::Redeliver(from_value(rest, file, at)?),
        "concurrent" => Step::Concurrent(from_value(rest, file, at)?),
        "status" => Step::Status(from_value(rest, file, at)?),
        "resume" => Step::Resume(from_value(rest, file, at)?),
        "approve" => Step::Approve(from_value(rest, file, at)?),
        "deny" => Step::Deny(from_value(rest, file, at)?),
        "resolve" => Step::Resolve(from_value(rest, file, at)?),
        "restart" => Step::Restart(from_value(rest, file, at)?),
        "reconnect" => Step::Reconnect(from_value(rest, file, at)?),
        "list_tools" => Step::ListTools(from_value(rest, file, at)?),
        other => {
            return Err(invalid(
                file,
                format!("{at}.do"),
                format!(
                    "unknown step `{other}`, expected one of call, redeliver, concurrent, status, resume, approve, deny, resolve, restart, reconnect, list_tools"
                ),
            ));
        }
    })
}

/// Cross-step rules: names are unique and declared before use, arguments are well formed.
fn validate(scenario: &Scenario) -> Result<(), ScenarioError> {
    let file = scenario.file.as_path();
    let mut names: Vec<&str> = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = format!("steps[{i}]");
        let refs: Vec<(&str, &str)> = {
            let mut r: Vec<(&str, &str)> = Vec::new();
            match step {
                Step::Redeliver(s) => r.push(("of", &s.of)),
                Step::Status(s) | Step::Resume(s) => match (&s.of, &s.handle) {
                    (Some(of), None) => r.push(("of", of)),
                    (None, Some(_)) => {}
                    _ => {
                        return Err(invalid(
                            file,
                            at,
                            "give exactly one of `of` (a step's handle) and `handle`",
                        ));
                    }
                },
                Step::Approve(s) | Step::Deny(s) => r.push(("of", &s.of)),
                Step::Resolve(s) => r.push(("of", &s.of)),
                _ => {}
            }
            if let Some(expect) = step.expect() {
                if let Some(n) = &expect.same_handle_as {
                    r.push(("expect.same_handle_as", n));
                }
                if let Some(n) = &expect.result_equals {
                    r.push(("expect.result_equals", n));
                }
                for n in &expect.different_handle_from {
                    r.push(("expect.different_handle_from", n));
                }
            }
            r
        };
        for (field, name) in refs {
            if !names.contains(&name) {
                return Err(invalid(
                    file,
                    format!("{at}.{field}"),
                    format!("no earlier step is named `{name}`"),
                ));
            }
        }
        if step.router() == RouterChoice::Both && !matches!(step, Step::Concurrent(_)) {
            return Err(invalid(
                file,
                format!("{at}.router"),
                "`both` goes in `concurrent` steps only; use `first` or `second`",
            ));
        }
        match step {
            Step::Call(s) => {
                check_arguments(&s.arguments, file, &at)?;
                if s.sign.is_some() {
                    if !scenario.signed_envelopes {
                        return Err(invalid(
                            file,
                            format!("{at}.sign"),
                            "a step that signs needs `signed_envelopes: true` on the scenario",
                        ));
                    }
                    let envelope = s
                        .meta
                        .as_ref()
                        .and_then(|m| m.get(crate::identity::ENVELOPE_KEY));
                    if !envelope.is_some_and(Value::is_object) {
                        return Err(invalid(
                            file,
                            format!("{at}.sign"),
                            format!(
                                "`sign` signs the `{}` envelope object in `meta`, and this step \
                                 has none",
                                crate::identity::ENVELOPE_KEY
                            ),
                        ));
                    }
                }
                if s.arguments.form == Some(Form::Escaped) && s.kill.is_some() {
                    return Err(invalid(
                        file,
                        format!("{at}.arguments.form"),
                        "`escaped` arguments cannot be combined with `kill`",
                    ));
                }
            }
            Step::Concurrent(s) => {
                check_arguments(&s.arguments, file, &at)?;
                if s.arguments.form == Some(Form::Escaped) {
                    return Err(invalid(
                        file,
                        format!("{at}.arguments.form"),
                        "`escaped` arguments go in `call` steps only",
                    ));
                }
                if !(2..=256).contains(&s.count) {
                    return Err(invalid(
                        file,
                        format!("{at}.count"),
                        "`count` must be between 2 and 256",
                    ));
                }
            }
            _ => {}
        }
        let own = match step {
            Step::Call(s) => s.name.as_deref(),
            Step::Redeliver(s) => s.name.as_deref(),
            Step::Concurrent(s) => s.name.as_deref(),
            Step::Status(s) | Step::Resume(s) => s.name.as_deref(),
            _ => None,
        };
        if let Some(name) = own {
            if names.contains(&name) {
                return Err(invalid(
                    file,
                    format!("{at}.name"),
                    format!("the name `{name}` is already used by an earlier step"),
                ));
            }
            names.push(name);
        }
    }
    Ok(())
}

fn check_arguments(arguments: &Arguments, file: &Path, at: &str) -> Result<(), ScenarioError> {
    match (&arguments.set, &arguments.literal, &arguments.add) {
        (Some(_), None, _) | (None, Some(_), None) => Ok(()),
        (None, Some(_), Some(_)) => Err(invalid(
            file,
            format!("{at}.arguments.add"),
            "`add` goes with `set`, not with `literal`",
        )),
        _ => Err(invalid(
            file,
            format!("{at}.arguments"),
            "give exactly one of `set` (spend, other, approval) and `literal`",
        )),
    }
}

/// Expands `{call:NAME}` and `{long:N}` in every string of `value` (keys included).
pub fn expand(value: &Value, ids: &mut CallIds) -> Value {
    match value {
        Value::String(s) => Value::String(expand_str(s, ids)),
        Value::Array(items) => Value::Array(items.iter().map(|v| expand(v, ids)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (expand_str(k, ids), expand(v, ids)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn expand_str(text: &str, ids: &mut CallIds) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let Some(end) = after.find('}') else {
            out.push_str(after);
            return out;
        };
        let token = &after[1..end];
        if let Some(name) = token.strip_prefix("call:") {
            out.push_str(&ids.get(name));
        } else if let Some(n) = token
            .strip_prefix("long:")
            .and_then(|n| n.parse::<usize>().ok())
        {
            out.extend(std::iter::repeat_n('x', n));
        } else if let Some((n, text)) = token
            .strip_prefix("repeat:")
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(n, text)| Some((n.parse::<usize>().ok()?, text)))
        {
            out.push_str(&text.repeat(n));
        } else {
            out.push_str(&after[..=end]);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The fresh call IDs of one scenario run, by placeholder name.
#[derive(Debug, Default)]
pub struct CallIds {
    run: String,
    ids: HashMap<String, String>,
}

impl CallIds {
    /// A new set; every ID it hands out contains a random run tag.
    pub fn new() -> Self {
        CallIds {
            run: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            ids: HashMap::new(),
        }
    }

    /// The ID for `name`, created on first use.
    pub fn get(&mut self, name: &str) -> String {
        let run = &self.run;
        self.ids
            .entry(name.to_string())
            .or_insert_with(|| format!("call_{run}_{name}"))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, Path::new("scenarios/x.yaml"))
            .expect_err("must be refused")
            .to_string()
    }

    const HEAD: &str = "id: a.b\ntitle: t\nrule: r\narticle: q\n";

    #[test]
    fn every_shipped_scenario_loads() {
        let scenarios = load_builtin().expect("built-in scenarios load");
        assert!(scenarios.len() >= 25, "{} scenarios", scenarios.len());
    }

    #[test]
    fn errors_name_the_file_and_the_path() {
        let cases = [
            (
                "steps:\n  - do: call\n  - do: call\n  - do: call\n    expect: {charges: many}\n",
                "scenarios/x.yaml: steps[2].expect.charges: invalid type: string \"many\", expected u64",
            ),
            (
                "steps:\n  - do: call\n    expect: {chargs: 1}\n",
                "scenarios/x.yaml: steps[0].expect.chargs: unknown field `chargs`, expected one of",
            ),
            (
                "steps:\n  - do: teleport\n",
                "scenarios/x.yaml: steps[0].do: unknown step `teleport`",
            ),
            (
                "steps:\n  - {do: redeliver, of: nope}\n",
                "scenarios/x.yaml: steps[0].of: no earlier step is named `nope`",
            ),
            (
                "steps:\n  - do: call\n    arguments: {set: spend, literal: {}}\n",
                "scenarios/x.yaml: steps[0].arguments: give exactly one of `set`",
            ),
            (
                "steps:\n  - do: call\n    arguments: {set: lavish}\n",
                "scenarios/x.yaml: steps[0].arguments.set: unknown variant `lavish`",
            ),
            (
                "steps: []\n",
                "scenarios/x.yaml: steps: a scenario needs at least one step",
            ),
            (
                "steps:\n  - {do: concurrent, count: 1}\n",
                "scenarios/x.yaml: steps[0].count: `count` must be between 2 and 256",
            ),
            (
                "steps:\n  - {do: call, router: both}\n",
                "scenarios/x.yaml: steps[0].router: `both` goes in `concurrent` steps only",
            ),
            (
                "steps:\n  - {do: call, sign: valid, meta: {\"hubu.dev/platform-invocation\": {platform: p, invocation_id: i}}}\n",
                "scenarios/x.yaml: steps[0].sign: a step that signs needs `signed_envelopes: true` on the scenario",
            ),
            (
                "signed_envelopes: true\nsteps:\n  - {do: call, sign: valid, meta: {callId: c}}\n",
                "scenarios/x.yaml: steps[0].sign: `sign` signs the `hubu.dev/platform-invocation` envelope object in `meta`, and this step has none",
            ),
            (
                "signed_envelopes: true\nsteps:\n  - {do: call, sign: stolen}\n",
                "scenarios/x.yaml: steps[0].sign: unknown variant `stolen`, expected one of `valid`, `forged`, `unknown_key`, `expired`, `not_yet_valid`",
            ),
            (
                "steps:\n  - {do: restart, router: third}\n",
                "scenarios/x.yaml: steps[0].router: unknown variant `third`, expected one of `first`, `second`, `both`",
            ),
        ];
        for (body, want) in cases {
            let got = err(&format!("{HEAD}{body}"));
            assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
        }
        let got =
            err("id: a.b\ntitle: t\nrule: r\narticle: q\nsteps: [{do: reconnect}]\nextra: 1\n");
        assert!(
            got.starts_with("scenarios/x.yaml: extra: unknown field `extra`"),
            "{got}"
        );
    }

    #[test]
    fn placeholders_expand_consistently_within_a_run() {
        let mut ids = CallIds::new();
        let v = serde_json::json!({"callId": "{call:a}", "x": ["{call:a}", "p{long:3}q", "{odd}"]});
        let out = expand(&v, &mut ids);
        assert_eq!(out["callId"], out["x"][0]);
        assert_eq!(out["x"][1], "pxxxq");
        assert_eq!(out["x"][2], "{odd}");
        let v = serde_json::json!({"a": 1, "b": {"c": 2, "d": [3, "x"]}});
        assert_eq!(
            serde_json::to_string(&Form::ReorderedFractionNumbers.apply(&v)).unwrap(),
            r#"{"b":{"d":[3.0,"x"],"c":2.0},"a":1.0}"#
        );
        let escaped = escaped_json(&serde_json::json!({"a": ["é🦊", 1.5, null]}));
        assert_eq!(escaped, r#"{"\u0061":["\u00e9\ud83e\udd8a",1.5,null]}"#);
        assert_eq!(
            serde_json::from_str::<Value>(&escaped).unwrap(),
            serde_json::json!({"a": ["é🦊", 1.5, null]})
        );
        let multibyte = expand(&serde_json::json!("{repeat:3:€}y"), &mut ids);
        assert_eq!(multibyte, "€€€y");
        assert_eq!(multibyte.as_str().unwrap().len(), 10);
        let other = expand(&v, &mut CallIds::new());
        assert_ne!(out["callId"], other["callId"]);
    }
}
