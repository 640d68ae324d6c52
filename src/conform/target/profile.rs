//! The target profile: its types, loading and validation from YAML, the capabilities it
//! declares, and the `--print-profile` template (the placeholders it may use are checked here,
//! and expanded by [`super::Vars`]).

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::placeholders::{UPSTREAM_ARGV, is_env_name, known_placeholders, placeholders_in};
use super::shell::split_words;

/// The shipped profile of the reference router.
pub const REFERENCE_PROFILE: &str = include_str!("../../../scenarios/targets/reference.yaml");

/// The shipped profile of `callid gateway` in front of the runner's upstream MCP server.
pub const GATEWAY_PROFILE: &str = include_str!("../../../scenarios/targets/gateway.yaml");

/// A shipped profile `callid conform --print-profile` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shipped {
    /// The reference router's ([`template`]).
    Router,
    /// The gateway's ([`GATEWAY_PROFILE`]), whose policy is `gateway-policy.yaml` beside it.
    Gateway,
}

/// The text `callid conform --print-profile` prints for `which`: the shipped file.
pub fn shipped_profile(which: Shipped) -> String {
    match which {
        Shipped::Router => template(),
        Shipped::Gateway => GATEWAY_PROFILE.to_owned(),
    }
}

/// One target profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Name shown in reports.
    pub name: String,
    /// How the runner talks to the router.
    pub transport: Transport,
    /// Program that starts the router (stdio: required; http: optional).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added to the runner's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The MCP endpoint (http).
    #[serde(default)]
    pub url: Option<String>,
    /// Tool names.
    pub tools: Tools,
    /// The argument sets scenarios refer to.
    pub arguments: ArgumentSets,
    /// Where things sit in a tool result.
    #[serde(default)]
    pub pointers: Pointers,
    /// Text that must never appear in any response: the private key's prefix.
    #[serde(default = "default_private_prefix")]
    pub private_key_prefix: String,
    /// Operator command that approves `{handle}`.
    #[serde(default)]
    pub approve: Option<OperatorCommand>,
    /// Operator command that denies `{handle}`.
    #[serde(default)]
    pub deny: Option<OperatorCommand>,
    /// Operator command that resolves the in-doubt operation `{handle}`: `{outcome}` is
    /// `charged` or `not-charged` (what a person found at the backend).
    #[serde(default)]
    pub resolve: Option<OperatorCommand>,
    /// Which backend the router is built for: `true` (one that honours idempotency keys: an
    /// unknown outcome is continued under the same key), `false` (one that charges every
    /// request: at most one dispatch, `in_doubt` until `resolve`). Left out, `true`: the
    /// `at-most-once.*` checks are skipped, saying this key turns them on.
    #[serde(default)]
    pub idempotent_backend: Option<bool>,
    /// What the runner may do to this target.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// The router's own error codes, by the contract's name (`missing_identity: no_call_id`);
    /// a code not listed is the contract's own name. Keys: [`mappable_error_codes`].
    #[serde(default)]
    pub error_codes: BTreeMap<String, String>,
    /// The router's own status words, by the contract's name (`completed: done`). Keys:
    /// [`mappable_statuses`].
    #[serde(default)]
    pub statuses: BTreeMap<String, String>,
    /// For a router the runner does not start: the address the runner's provider listens on
    /// (the router was configured with `http://{provider_listen}`). Without it, and without a
    /// start command, charges cannot be counted.
    #[serde(default)]
    pub provider_listen: Option<String>,
    /// What `{registry}` stands for (default `{state_dir}/registry.sqlite3`), e.g. a database
    /// URL made fresh per check by `setup` (`postgres://…/{check_slug}`).
    #[serde(default)]
    pub registry: Option<String>,
    /// Operator commands run, in order, before each check's router starts (e.g. create the
    /// check's own database); one that fails makes the run a setup error.
    #[serde(default)]
    pub setup: Vec<SetupCommand>,
    /// Every `redeliver` step that names no `router:` goes to the second router process (a
    /// replicated target: the redelivery lands on the other replica). Needs
    /// `capabilities.shared_registry: true`.
    #[serde(default)]
    pub redeliver_on_second: bool,
    /// Which of the runner's paid backends the router calls: its HTTP provider (default) or
    /// its upstream MCP server.
    #[serde(default)]
    pub backend: Backend,
    /// The router verifies signed envelopes: how to start it, in the `signature.*` checks, with
    /// the runner's key (`{trust_keys}`, `{signing_public_key}`). Left out, those checks are
    /// skipped, saying this key turns them on.
    #[serde(default)]
    pub signed_envelopes: Option<SignedEnvelopes>,
    /// The profile's directory (`{profile_dir}`), set on load.
    #[serde(skip)]
    pub dir: PathBuf,
}

/// `signed_envelopes:`: how the router is started in the checks that sign envelopes. The runner
/// makes a fresh Ed25519 key for each of those checks ([`crate::conform::signer`]) and hands its public
/// half to the router through [`SIGNING_PLACEHOLDERS`], which are known here only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedEnvelopes {
    /// The router's arguments in those checks, instead of `args` (left out: `args`).
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Environment added to `env` in those checks.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The placeholders that hand the router the runner's signing key, known only in
/// `signed_envelopes`: `{trust_keys}` (a trust file in callid's format: key id `conform-signer`,
/// Ed25519, platform `conform-signed`) and `{signing_public_key}` (the raw public key,
/// base64url without padding).
pub const SIGNING_PLACEHOLDERS: [&str; 2] = ["trust_keys", "signing_public_key"];

/// The runner's role behind the router: what the router calls to spend, and what counts the
/// charges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The runner's HTTP provider at `{provider_url}` (`POST /v1/images`, `Idempotency-Key`).
    #[default]
    Provider,
    /// The runner's upstream MCP server (`{upstream_url}`, `{upstream_command}`,
    /// `{upstream_argv}`) exposing the paid tool: for gateways and MCP-native routers.
    Upstream,
}

impl Backend {
    /// How reports name it: `provider` or `upstream`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Provider => "provider",
            Backend::Upstream => "upstream",
        }
    }

    /// The placeholders that only this backend fills.
    fn own_placeholders(self) -> &'static [&'static str] {
        match self {
            Backend::Provider => &["provider_url"],
            Backend::Upstream => &["upstream_url", "upstream_command", "upstream_argv"],
        }
    }
}

fn default_private_prefix() -> String {
    crate::keys::DEFAULT_KEY_PREFIX.to_string()
}

/// The transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// One JSON object per line over the child's stdin/stdout.
    Stdio,
    /// Streamable HTTP at `url`.
    Http,
}

/// Tool names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    /// The tool that spends.
    pub spend: String,
    /// The status tool (`{handle}` argument).
    #[serde(default)]
    pub status: Option<String>,
    /// The resume tool (`{handle}` argument).
    #[serde(default)]
    pub resume: Option<String>,
}

/// The argument sets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgumentSets {
    /// A spend under every approval threshold.
    pub spend: Map<String, Value>,
    /// A different spend, also under the thresholds.
    pub other: Map<String, Value>,
    /// A spend the target's policy sends to approval.
    #[serde(default)]
    pub approval: Option<Map<String, Value>>,
}

/// JSON pointers into a `CallToolResult`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pointers {
    /// The public handle (`null`: the router's results carry none, as a transparent proxy's;
    /// the expectations about handles are then not checked, see `runner/judge.rs`).
    #[serde(default = "p_handle")]
    pub handle: Option<String>,
    /// The error code of a tool error.
    #[serde(default = "p_error")]
    pub error: String,
    /// The operation status (`null`: the router's results carry none; the expectations about
    /// a status are then not checked).
    #[serde(default = "p_status")]
    pub status: Option<String>,
    /// The part of a result that a replay must reproduce exactly.
    #[serde(default = "p_result")]
    pub result: String,
    /// The provider's charge id.
    #[serde(default = "p_charge")]
    pub charge_id: String,
    /// The boolean that marks a replayed result (`null`: the router has no replay marker; only
    /// the recommended check that looks for one is affected).
    #[serde(default = "p_replayed")]
    pub replayed: Option<String>,
}

fn p_handle() -> Option<String> {
    Some("/structuredContent/handle".into())
}
fn p_error() -> String {
    "/structuredContent/error".into()
}
fn p_status() -> Option<String> {
    Some("/structuredContent/status".into())
}
fn p_result() -> String {
    "/structuredContent".into()
}
fn p_charge() -> String {
    "/structuredContent/result/charge_id".into()
}
fn p_replayed() -> Option<String> {
    Some("/_meta/callid~1replayed".into())
}

impl Default for Pointers {
    fn default() -> Self {
        Pointers {
            handle: p_handle(),
            error: p_error(),
            status: p_status(),
            result: p_result(),
            charge_id: p_charge(),
            replayed: p_replayed(),
        }
    }
}

/// An operator command (approve or deny).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorCommand {
    /// Program.
    pub command: String,
    /// Arguments (with `{handle}`).
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A setup command (`setup:`), run before each check's router starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupCommand {
    /// Program.
    pub command: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// What the runner may do to the target. `false` declares the capability absent: the checks
/// that need it are *skipped*. Left out, it is undeclared: those checks are *not run*, which
/// makes the run incomplete (exit 1 unless `--allow-incomplete`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Stop and start it again on the same state.
    #[serde(default)]
    pub restart: Option<bool>,
    /// Kill it with SIGKILL at a provider trigger.
    #[serde(default)]
    pub kill: Option<bool>,
    /// Two processes of it, started from this profile on the same `{state_dir}` and
    /// `{registry}`, may serve at once (a second router process, or replicas on one database).
    #[serde(default)]
    pub shared_registry: Option<bool>,
    /// It has an approval policy and operator commands.
    #[serde(default)]
    pub approval: Option<bool>,
}

/// Whether the runner can use a capability, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Can {
    /// It can.
    Yes,
    /// The profile declares it absent: the check is skipped.
    DeclaredAbsent(String),
    /// It cannot for another reason: the check is not run.
    Cannot(String),
}

/// The operator commands of a profile: the only fields where `{handle}` is known.
pub const OPERATOR_COMMANDS: [&str; 3] = ["approve", "deny", "resolve"];

/// The operator command where `{outcome}` (`charged` or `not-charged`) is known too.
pub const RESOLVE_COMMAND: &str = "resolve";

/// Every status name a profile's `statuses` may map: the router's catalogue, in lifecycle order.
pub fn mappable_statuses() -> impl Iterator<Item = &'static str> {
    crate::spend::registry::Status::ALL
        .into_iter()
        .map(|s| s.name())
}

/// Every error code a profile's `error_codes` may map: the catalogue of every code a tool call
/// of the router or the gateway can answer.
pub fn mappable_error_codes() -> impl Iterator<Item = &'static str> {
    crate::spend::reply::ToolCode::ALL
        .into_iter()
        .map(|c| c.code())
}

/// The line of [`REFERENCE_PROFILE`] after which [`template`] lists the names a profile may map.
const MAPPABLE_MARKER: &str =
    "# other key is an error naming the nearest valid one. The keys a profile may map:\n";

/// `callid conform --print-profile`: the reference profile, its comment on `error_codes` and
/// `statuses` listing every name they may map ([`mappable_error_codes`], [`mappable_statuses`]).
/// The shipped file holds the same text (a test keeps them equal).
pub fn template() -> String {
    let (head, rest) = REFERENCE_PROFILE
        .split_once(MAPPABLE_MARKER)
        .expect("the reference profile has the marker line");
    let (_, tail) = rest
        .split_once("\nerror_codes:")
        .expect("the reference profile maps error codes");
    let mut text = format!("{head}{MAPPABLE_MARKER}");
    for (label, names) in [
        ("error codes", mappable_error_codes().collect::<Vec<_>>()),
        ("statuses", mappable_statuses().collect()),
    ] {
        // The profile's comment layout: the list indented under its label.
        let first = format!(r"#   {label}: ");
        let indent = format!("#{}", " ".repeat(first.len() - 1));
        text.push_str(&wrap_list(&first, &indent, &names));
    }
    text.push_str("error_codes:");
    text.push_str(tail);
    text
}

/// `words` after `first`, separated by `, `, in lines of at most 100 characters that go on
/// after `indent`; ends with a line break.
fn wrap_list(first: &str, indent: &str, words: &[&str]) -> String {
    let mut text = String::new();
    let mut line = first.to_string();
    for (i, word) in words.iter().enumerate() {
        let word = if i + 1 < words.len() {
            format!("{word},")
        } else {
            word.to_string()
        };
        if line.len() + word.len() > 99 && line.len() > first.len() {
            text.push_str(line.trim_end());
            text.push('\n');
            line = indent.to_string();
        }
        line.push_str(&word);
        line.push(' ');
    }
    text.push_str(line.trim_end());
    text.push('\n');
    text
}

/// `{a}`, `{b}`: placeholders as a message lists them.
fn braced(names: &[&str]) -> String {
    names
        .iter()
        .map(|p| format!("`{{{p}}}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a`, `b`: names as a message lists them.
fn ticked<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a target could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The profile file could not be read.
    #[error("failed to read the target profile `{file}`: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The profile is not valid.
    #[error("{file}: {path}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Where.
        path: String,
        /// What.
        message: String,
    },
    /// A `{placeholder}` the runner does not know (a typo would otherwise pass through
    /// literally and, say, put every scenario's state in one directory).
    #[error(
        "{file}: {path}: unknown placeholder `{{{name}}}`; the known ones are {}",
        braced(&known_placeholders(*operator))
    )]
    UnknownPlaceholder {
        /// The file.
        file: String,
        /// Where.
        path: String,
        /// The placeholder, without braces.
        name: String,
        /// Whether the field is an operator command's (where `{handle}` is known too).
        operator: bool,
    },
    /// `{handle}` outside the operator commands (there is no operation to name when a router
    /// starts).
    #[error(
        "{file}: {path}: `{{handle}}` is the public handle of an operation, known only in the operator commands ({}); the known ones here are {}",
        ticked(&OPERATOR_COMMANDS),
        braced(&known_placeholders(false))
    )]
    HandleOutsideOperator {
        /// The file.
        file: String,
        /// Where.
        path: String,
    },
    /// A key or a word outside its closed set (a misspelt field, status or error code would
    /// otherwise be ignored, and every check that needs it fail for another reason).
    #[error(transparent)]
    UnknownName(Box<UnknownName>),
    /// An `{env:NAME}` placeholder names a variable that is not set.
    #[error(
        "{file}: {path}: the environment variable `{name}` (placeholder `{{env:{name}}}`) is not set; set it before running conform"
    )]
    EnvUnset {
        /// The file.
        file: String,
        /// Where.
        path: String,
        /// The variable.
        name: String,
    },
    /// `--stdio` could not be split into words.
    #[error("failed to split `--stdio {0}` into words: unbalanced quote")]
    Split(String),
}

/// What [`TargetError::UnknownName`] says.
#[derive(Debug, thiserror::Error)]
#[error(
    "{file}: {path}: unknown {what} `{name}`{}{}; the valid ones are {}",
    location.as_ref().map(|l| format!(" at {l}")).unwrap_or_default(),
    nearest.as_ref().map(|n| format!(" (did you mean `{n}`?)")).unwrap_or_default(),
    ticked(valid)
)]
pub struct UnknownName {
    /// The file.
    pub file: String,
    /// Where (the unknown key's own path).
    pub path: String,
    /// `key`, `value`, `status` or `error code`.
    pub what: &'static str,
    /// The name as written.
    pub name: String,
    /// Every valid name.
    pub valid: Vec<String>,
    /// The valid name nearest to it, when one is near.
    pub nearest: Option<String>,
    /// Where the parser saw it (`line 3 column 5`), when it said.
    pub location: Option<String>,
}

impl TargetError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::Read { .. } => "target_unreadable",
            TargetError::Invalid { .. } => "target_invalid",
            TargetError::UnknownPlaceholder { .. } | TargetError::HandleOutsideOperator { .. } => {
                "target_unknown_placeholder"
            }
            TargetError::UnknownName(_) => "target_unknown_name",
            TargetError::Split(_) => "target_command_invalid",
            TargetError::EnvUnset { .. } => "target_env_unset",
        }
    }
}

impl Profile {
    /// Loads a profile file.
    pub fn load(file: &Path) -> Result<Profile, TargetError> {
        let text = std::fs::read_to_string(file).map_err(|source| TargetError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        // A bare file name's parent is the empty path: `{profile_dir}/x` must not become `/x`.
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let profile = Profile::parse(&text, &file.display().to_string(), dir)?;
        profile.check_env(&file.display().to_string())?;
        Ok(profile)
    }

    /// Parses a profile document; `name` labels errors.
    pub fn parse(text: &str, name: &str, dir: PathBuf) -> Result<Profile, TargetError> {
        let invalid = |path: String, message: String| TargetError::Invalid {
            file: name.to_string(),
            path,
            message,
        };
        let mut profile: Profile =
            crate::yaml::from_str(text).map_err(|e| match e.unknown_name() {
                Some(unknown) => TargetError::unknown_name(
                    name,
                    e.path.clone(),
                    unknown.what,
                    unknown.name,
                    unknown.valid,
                    unknown.location,
                ),
                None => invalid(e.path, e.message),
            })?;
        profile.dir = dir;
        profile.check_mapped_names(name)?;
        match profile.transport {
            Transport::Stdio if profile.command.is_none() => {
                return Err(invalid(
                    "command".into(),
                    "a stdio target needs `command`".into(),
                ));
            }
            Transport::Http if profile.url.is_none() => {
                return Err(invalid("url".into(), "an http target needs `url`".into()));
            }
            _ => {}
        }
        profile.check_placeholders(name)?;
        if profile.redeliver_on_second && profile.capabilities.shared_registry != Some(true) {
            return Err(invalid(
                "redeliver_on_second".into(),
                "sending redeliveries to a second router process needs `capabilities.shared_registry: true`".into(),
            ));
        }
        if profile.capabilities.approval == Some(true)
            && (profile.approve.is_none()
                || profile.deny.is_none()
                || profile.arguments.approval.is_none()
                || profile.tools.resume.is_none())
        {
            return Err(invalid(
                "capabilities.approval".into(),
                "approval needs `approve`, `deny`, `arguments.approval` and `tools.resume`".into(),
            ));
        }
        let absent = String::new();
        for (field, pointer) in [
            (
                "pointers.handle",
                profile.pointers.handle.as_ref().unwrap_or(&absent),
            ),
            ("pointers.error", &profile.pointers.error),
            (
                "pointers.status",
                profile.pointers.status.as_ref().unwrap_or(&absent),
            ),
            ("pointers.result", &profile.pointers.result),
            ("pointers.charge_id", &profile.pointers.charge_id),
            (
                "pointers.replayed",
                profile.pointers.replayed.as_ref().unwrap_or(&absent),
            ),
        ] {
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(invalid(
                    field.into(),
                    format!("`{pointer}` is not a JSON pointer (RFC 6901): start it with `/`"),
                ));
            }
        }
        if profile.private_key_prefix.is_empty() {
            return Err(invalid(
                "private_key_prefix".into(),
                "must not be empty: every response would match".into(),
            ));
        }
        Ok(profile)
    }

    /// Refuses a key of `statuses` or `error_codes` that names no status or code of the
    /// catalogue.
    fn check_mapped_names(&self, file: &str) -> Result<(), TargetError> {
        for (field, what, map, valid) in [
            (
                "statuses",
                "status",
                &self.statuses,
                mappable_statuses().collect::<Vec<_>>(),
            ),
            (
                "error_codes",
                "error code",
                &self.error_codes,
                mappable_error_codes().collect(),
            ),
        ] {
            if let Some(name) = map.keys().find(|k| !valid.contains(&k.as_str())) {
                return Err(TargetError::unknown_name(
                    file,
                    format!("{field}.{name}"),
                    what,
                    name.clone(),
                    valid.iter().map(|v| v.to_string()).collect(),
                    None,
                ));
            }
        }
        Ok(())
    }

    /// Refuses any `{name}` in the command, arguments, environment, URL or operator commands
    /// that is not a known placeholder (`{handle}` only in operator commands).
    fn check_placeholders(&self, file: &str) -> Result<(), TargetError> {
        let other = match self.backend {
            Backend::Provider => Backend::Upstream,
            Backend::Upstream => Backend::Provider,
        };
        for (path, text, operator) in self.placeholder_fields() {
            for name in placeholders_in(text) {
                if name == "outcome" && path.starts_with(&format!("{RESOLVE_COMMAND}.")) {
                    continue;
                }
                if SIGNING_PLACEHOLDERS.contains(&name) && !path.starts_with("signed_envelopes.") {
                    return Err(TargetError::Invalid {
                        file: file.to_string(),
                        path,
                        message: format!(
                            "`{{{name}}}` hands the router the runner's signing key, known only in \
                             `signed_envelopes` (`args`, `env`): the other checks start the \
                             router without it"
                        ),
                    });
                }
                if name == "handle" && !operator {
                    return Err(TargetError::HandleOutsideOperator {
                        file: file.to_string(),
                        path,
                    });
                }
                let known = if let Some(var) = name.strip_prefix("env:") {
                    is_env_name(var)
                } else {
                    // A signing placeholder outside `signed_envelopes` was refused above.
                    SIGNING_PLACEHOLDERS.contains(&name)
                        || (known_placeholders(operator).contains(&name)
                            && !(path == "registry" && name == "registry"))
                };
                if !known {
                    return Err(TargetError::UnknownPlaceholder {
                        file: file.to_string(),
                        path,
                        name: name.to_string(),
                        operator,
                    });
                }
                let invalid = |message: String| TargetError::Invalid {
                    file: file.to_string(),
                    path: path.clone(),
                    message,
                };
                if other.own_placeholders().contains(&name) {
                    return Err(invalid(format!(
                        "`{{{name}}}` belongs to `backend: {}`, and this profile has `backend: {}`",
                        other.name(),
                        self.backend.name()
                    )));
                }
                let whole_arg = (path.starts_with("args[")
                    || path.starts_with("signed_envelopes.args["))
                    && text == UPSTREAM_ARGV;
                if name == "upstream_argv" && !whole_arg {
                    return Err(invalid(
                        "`{upstream_argv}` expands into several arguments: give it as a whole `args` element (`args: [..., \"--\", \"{upstream_argv}\"]`), or use `{upstream_command}` for one string".into(),
                    ));
                }
            }
        }
        if let Some(signed) = &self.signed_envelopes {
            let hands_key = signed
                .args
                .iter()
                .flatten()
                .chain(signed.env.values())
                .any(|t| {
                    placeholders_in(t)
                        .iter()
                        .any(|p| SIGNING_PLACEHOLDERS.contains(p))
                });
            if !hands_key {
                return Err(TargetError::Invalid {
                    file: file.to_string(),
                    path: "signed_envelopes".into(),
                    message: "hand the router the runner's key: use `{trust_keys}` or \
                              `{signing_public_key}` in `signed_envelopes.args` or \
                              `signed_envelopes.env` (e.g. `args: [..., --trust-keys, \
                              \"{trust_keys}\"]`)"
                        .into(),
                });
            }
        }
        if self.backend == Backend::Upstream && self.provider_listen.is_some() {
            return Err(TargetError::Invalid {
                file: file.to_string(),
                path: "provider_listen".into(),
                message: "`provider_listen` is for `backend: provider`; with `backend: upstream` the runner starts the router and hands it `{upstream_url}` or `{upstream_command}`".into(),
            });
        }
        Ok(())
    }

    /// Refuses an `{env:NAME}` placeholder whose variable is not set (checked when a profile
    /// file is loaded for a run, so a missing server URL is named before anything starts).
    pub fn check_env(&self, file: &str) -> Result<(), TargetError> {
        for (path, text, _) in self.placeholder_fields() {
            for name in placeholders_in(text) {
                if let Some(var) = name.strip_prefix("env:")
                    && std::env::var_os(var).is_none()
                {
                    return Err(TargetError::EnvUnset {
                        file: file.to_string(),
                        path,
                        name: var.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Every field that may hold placeholders: `(path, text, is an operator command)`.
    fn placeholder_fields(&self) -> Vec<(String, &str, bool)> {
        let mut fields: Vec<(String, &str, bool)> = Vec::new();
        if let Some(c) = &self.command {
            fields.push(("command".into(), c, false));
        }
        for (i, a) in self.args.iter().enumerate() {
            fields.push((format!("args[{i}]"), a, false));
        }
        for (k, v) in &self.env {
            fields.push((format!("env.{k}"), v, false));
        }
        if let Some(u) = &self.url {
            fields.push(("url".into(), u, false));
        }
        for verb in OPERATOR_COMMANDS {
            if let Some(op) = self.operator_command(verb) {
                fields.push((format!("{verb}.command"), &op.command, true));
                for (i, a) in op.args.iter().enumerate() {
                    fields.push((format!("{verb}.args[{i}]"), a, true));
                }
                for (k, v) in &op.env {
                    fields.push((format!("{verb}.env.{k}"), v, true));
                }
            }
        }
        if let Some(r) = &self.registry {
            fields.push(("registry".into(), r, false));
        }
        if let Some(signed) = &self.signed_envelopes {
            for (i, a) in signed.args.iter().flatten().enumerate() {
                fields.push((format!("signed_envelopes.args[{i}]"), a, false));
            }
            for (k, v) in &signed.env {
                fields.push((format!("signed_envelopes.env.{k}"), v, false));
            }
        }
        for (i, op) in self.setup.iter().enumerate() {
            fields.push((format!("setup[{i}].command"), &op.command, false));
            for (j, a) in op.args.iter().enumerate() {
                fields.push((format!("setup[{i}].args[{j}]"), a, false));
            }
            for (k, v) in &op.env {
                fields.push((format!("setup[{i}].env.{k}"), v, false));
            }
        }
        fields
    }

    /// The operator command named `verb` (one of [`OPERATOR_COMMANDS`]), if the profile has it.
    fn operator_command(&self, verb: &str) -> Option<&OperatorCommand> {
        match verb {
            "approve" => self.approve.as_ref(),
            "deny" => self.deny.as_ref(),
            "resolve" => self.resolve.as_ref(),
            _ => None,
        }
    }

    /// The router's own name for the contract's error code `code`.
    pub fn error_code<'a>(&'a self, code: &'a str) -> &'a str {
        self.error_codes.get(code).map_or(code, String::as_str)
    }

    /// The router's own word for the contract's status `status`.
    pub fn status_word<'a>(&'a self, status: &'a str) -> &'a str {
        self.statuses.get(status).map_or(status, String::as_str)
    }

    /// The reference router's profile.
    pub fn reference() -> Profile {
        Profile::parse(
            REFERENCE_PROFILE,
            "scenarios/targets/reference.yaml",
            PathBuf::from("."),
        )
        .expect("the shipped reference profile is valid")
    }

    /// The reference profile with the router started as `command` (`--stdio 'CMD ARGS'`): the
    /// words of `command`, then the contract's flags; operator commands are `CMD ARGS approve
    /// {handle} --registry {registry}`.
    pub fn stdio_command(command: &str) -> Result<Profile, TargetError> {
        let words = split_words(command).ok_or_else(|| TargetError::Split(command.to_string()))?;
        let Some((program, base)) = words.split_first() else {
            return Err(TargetError::Split(command.to_string()));
        };
        let mut profile = Profile::reference();
        profile.name = command.to_string();
        profile.command = Some(program.clone());
        profile.args = base.to_vec();
        profile.args.extend(
            [
                "--registry",
                "{registry}",
                "--provider-url",
                "{provider_url}",
                "--approval-above-cents",
                "10",
            ]
            .map(String::from),
        );
        let operator = |verb: &str| OperatorCommand {
            command: program.clone(),
            args: base
                .iter()
                .cloned()
                .chain([verb, "{handle}", "--registry", "{registry}"].map(String::from))
                .collect(),
            env: BTreeMap::new(),
        };
        profile.approve = Some(operator("approve"));
        profile.deny = Some(operator("deny"));
        profile.signed_envelopes = None;
        profile.dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Ok(profile)
    }

    /// A router already running at `url` (`--url URL`): no restart, no kill, no approval
    /// commands, no runner-owned provider.
    pub fn url(url: &str) -> Profile {
        let mut profile = Profile::reference();
        profile.name = url.to_string();
        profile.transport = Transport::Http;
        profile.url = Some(url.to_string());
        profile.command = None;
        profile.args.clear();
        profile.approve = None;
        profile.deny = None;
        profile.resolve = None;
        profile.signed_envelopes = None;
        profile.capabilities = Capabilities::default();
        profile
    }

    /// This profile for a router already running at `url` (`--target FILE --url URL`): its
    /// names, pointers and capabilities, over streamable HTTP at `url`, started by nobody (no
    /// `command`, no `setup`).
    pub fn at_url(mut self, url: &str) -> Profile {
        self.transport = Transport::Http;
        self.url = Some(url.to_string());
        self.command = None;
        self.args.clear();
        self.setup.clear();
        self
    }

    fn capability(&self, declared: Option<bool>, field: &str, what: &str) -> Can {
        match declared {
            Some(false) => Can::DeclaredAbsent(format!(
                "{what}: the profile declares `capabilities.{field}: false`"
            )),
            _ if !self.runner_starts() => Can::Cannot(format!(
                "{what}: the runner does not start this router (no `command` in the profile, or `--url`), so it cannot do that"
            )),
            None => Can::Cannot(format!(
                "{what}: the profile does not declare `capabilities.{field}`; set it to true, or to false to skip these checks"
            )),
            Some(true) => Can::Yes,
        }
    }

    /// Whether stop-and-start on the same state is possible.
    pub fn restart(&self) -> Can {
        self.capability(
            self.capabilities.restart,
            "restart",
            "restarting the router on the same state",
        )
    }

    /// Whether the runner may kill the router with SIGKILL (it must own the process).
    pub fn kill(&self) -> Can {
        self.capability(
            self.capabilities.kill,
            "kill",
            "killing the router (kill -9)",
        )
    }

    /// Whether a second process of the router may run on the same state.
    pub fn shared_registry(&self) -> Can {
        self.capability(
            self.capabilities.shared_registry,
            "shared_registry",
            "a second router process on the same registry",
        )
    }

    /// Whether approval scenarios can run.
    pub fn approval(&self) -> Can {
        match self.capabilities.approval {
            Some(false) => Can::DeclaredAbsent(
                "an approval policy: the profile declares `capabilities.approval: false`".into(),
            ),
            Some(true) if self.approve.is_some() && self.deny.is_some() => Can::Yes,
            Some(true) => Can::Cannot(
                "an approval policy: the profile names no `approve` and `deny` commands".into(),
            ),
            None => Can::Cannot(
                "an approval policy: the profile does not declare `capabilities.approval`; set it to true (with `approve`, `deny`, `arguments.approval`, `tools.resume`), or to false to skip these checks".into(),
            ),
        }
    }

    /// Whether the router is judged against a backend that honours idempotency keys (the
    /// default) or one that charges every request (`idempotent_backend: false`).
    pub fn backend_idempotent(&self) -> bool {
        self.idempotent_backend != Some(false)
    }

    /// Whether a check written for a backend that is (`want`) or is not idempotent applies.
    pub fn backend_is(&self, want: bool) -> Can {
        match (want, self.idempotent_backend) {
            (true, Some(false)) => Can::DeclaredAbsent(
                "a backend that honours idempotency keys: the profile declares `idempotent_backend: false` (this check re-sends an operation under its key; the `at-most-once.*` checks judge this router instead)".into(),
            ),
            (false, None) => Can::DeclaredAbsent(
                "a backend that charges every request: the profile does not declare `idempotent_backend`, so its router is judged against an idempotent one; set `idempotent_backend: false` (with `resolve`) to judge a router built for backends that ignore idempotency keys".into(),
            ),
            (false, Some(true)) => Can::DeclaredAbsent(
                "a backend that charges every request: the profile declares `idempotent_backend: true`".into(),
            ),
            _ => Can::Yes,
        }
    }

    /// Whether the checks that sign envelopes can run: the profile says how to start the router
    /// with the runner's key, and the runner starts it.
    pub fn signed_envelopes(&self) -> Can {
        match &self.signed_envelopes {
            None => Can::DeclaredAbsent(
                "signed envelopes: the profile does not declare `signed_envelopes`; declare how the router is started with the runner's key (`signed_envelopes: {args: [..., --trust-keys, \"{trust_keys}\"]}`) to run these checks".into(),
            ),
            Some(_) if !self.runner_starts() => Can::Cannot(
                "signed envelopes: the runner does not start this router (no `command` in the profile, or `--url`), so it cannot hand it the check's key".into(),
            ),
            Some(_) => Can::Yes,
        }
    }

    /// This profile as the checks that sign envelopes start the router: `signed_envelopes.args`
    /// instead of `args` (when given), `signed_envelopes.env` added to `env`.
    pub fn with_signed_envelopes(&self) -> Profile {
        let mut profile = self.clone();
        if let Some(signed) = &self.signed_envelopes {
            if let Some(args) = &signed.args {
                profile.args = args.clone();
            }
            profile
                .env
                .extend(signed.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        profile
    }

    /// Whether an in-doubt operation can be resolved (the profile's `resolve` command).
    pub fn resolve(&self) -> Can {
        match &self.resolve {
            Some(_) => Can::Yes,
            None => Can::Cannot(
                "resolving an operation in doubt: the profile names no `resolve` command (e.g. `{command: \"{callid}\", args: [router, resolve, \"{handle}\", \"--{outcome}\", --registry, \"{registry}\"]}`)".into(),
            ),
        }
    }

    /// Whether charges can be counted.
    pub fn ledger(&self) -> Can {
        if self.has_ledger() {
            Can::Yes
        } else {
            Can::Cannot(
                "charges cannot be counted: the router does not use the runner's provider or upstream (start it from the profile with `{provider_url}`, or `backend: upstream` and `{upstream_url}` / `{upstream_argv}`; or set `provider_listen` and point the router there)".into(),
            )
        }
    }

    /// Whether the runner starts the router itself (and so can point it at its provider).
    pub fn runner_starts(&self) -> bool {
        self.command.is_some()
    }

    /// Whether the runner can count the router's charges.
    pub fn has_ledger(&self) -> bool {
        self.runner_starts() || self.provider_listen.is_some()
    }
}

impl TargetError {
    /// An [`TargetError::UnknownName`], with the valid name nearest to `name`.
    fn unknown_name(
        file: &str,
        path: String,
        what: &'static str,
        name: String,
        valid: Vec<String>,
        location: Option<String>,
    ) -> TargetError {
        let nearest =
            crate::text::misspelling_of(&name, valid.iter().map(String::as_str)).map(str::to_owned);
        TargetError::UnknownName(Box::new(UnknownName {
            file: file.to_string(),
            path,
            what,
            name,
            valid,
            nearest,
            location,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::target::Vars;

    #[test]
    fn the_backend_key_says_which_checks_apply_and_resolve_knows_the_outcome() {
        let reference = Profile::reference();
        assert!(reference.backend_idempotent());
        assert_eq!(reference.backend_is(true), Can::Yes);
        assert!(
            matches!(reference.backend_is(false), Can::DeclaredAbsent(r) if r.contains("set `idempotent_backend: false` (with `resolve`)"))
        );
        assert!(matches!(reference.resolve(), Can::Cannot(_)));
        let text = format!(
            "{REFERENCE_PROFILE}\nresolve: {{command: x, args: [\"{{handle}}\", \"--{{outcome}}\"]}}\nidempotent_backend: false\n"
        );
        let at_most_once = Profile::parse(&text, "p.yaml", PathBuf::new()).unwrap();
        assert!(!at_most_once.backend_idempotent());
        assert_eq!(at_most_once.backend_is(false), Can::Yes);
        assert!(matches!(
            at_most_once.backend_is(true),
            Can::DeclaredAbsent(_)
        ));
        assert_eq!(at_most_once.resolve(), Can::Yes);
        let vars = Vars {
            handle: "h".into(),
            outcome: "not-charged".into(),
            ..Vars::default()
        };
        let resolve = at_most_once.resolve.unwrap();
        assert_eq!(
            resolve
                .args
                .iter()
                .map(|a| vars.apply(a))
                .collect::<Vec<_>>(),
            ["h", "--not-charged"]
        );
    }

    #[test]
    fn reference_profile_is_valid_and_fully_capable() {
        let p = Profile::reference();
        for can in [p.restart(), p.kill(), p.approval(), p.ledger()] {
            assert_eq!(can, Can::Yes);
        }
        assert_eq!(p.tools.spend, "generate_image");
    }

    #[test]
    fn stdio_command_keeps_the_contract_flags() {
        let p = Profile::stdio_command("python3 'my router.py' --flaw session-key").unwrap();
        assert_eq!(p.command.as_deref(), Some("python3"));
        assert_eq!(p.args[..3], ["my router.py", "--flaw", "session-key"]);
        assert!(p.args.contains(&"{provider_url}".to_string()));
        assert_eq!(
            p.approve.unwrap().args,
            [
                "my router.py",
                "--flaw",
                "session-key",
                "approve",
                "{handle}",
                "--registry",
                "{registry}"
            ]
        );
    }

    #[test]
    fn url_profile_can_do_nothing_it_does_not_own() {
        let p = Profile::url("http://127.0.0.1:9/mcp");
        for can in [p.restart(), p.kill(), p.approval(), p.ledger()] {
            assert!(matches!(can, Can::Cannot(_)), "{can:?}");
        }
    }

    #[test]
    fn unknown_placeholders_are_named_with_the_known_ones() {
        let bad = Profile::parse(
            &REFERENCE_PROFILE.replace(
                "\"{registry}\", --provider-url",
                "\"{regsitry}\", --provider-url",
            ),
            "p.yaml",
            PathBuf::new(),
        )
        .unwrap_err();
        assert_eq!(bad.code(), "target_unknown_placeholder");
        let text = bad.to_string();
        assert!(
            text.starts_with("p.yaml: args[2]: unknown placeholder `{regsitry}`; the known ones are `{callid}`, `{state_dir}`, `{registry}`"),
            "{text}"
        );
        let bad = Profile::parse(
            &REFERENCE_PROFILE.replace(
                "\"{registry}\", --provider-url",
                "\"{handle}\", --provider-url",
            ),
            "p.yaml",
            PathBuf::new(),
        )
        .unwrap_err();
        assert_eq!(bad.code(), "target_unknown_placeholder");
        assert!(
            bad.to_string().starts_with("p.yaml: args[2]: `{handle}` is the public handle of an operation, known only in the operator commands (`approve`, `deny`, `resolve`); the known ones here are `{callid}`"),
            "{bad}"
        );
        assert!(!bad.to_string().contains(", `{handle}`"), "{bad}");
        assert_eq!(
            placeholders_in("a {x} {y_1}{ {} }z {a b} {env:HOME} {env:a-b}"),
            ["x", "y_1", "env:HOME"]
        );
        for (field, bad) in [
            (
                "registry: \"{registry}.x\"",
                "registry: unknown placeholder `{registry}`",
            ),
            (
                "registry: \"{env:1X}\"",
                "registry: unknown placeholder `{env:1X}`",
            ),
            (
                "setup: [{command: x, args: [\"--{outcome}\"]}]",
                "setup[0].args[0]: unknown placeholder `{outcome}`",
            ),
            (
                "setup: [{command: x, args: [\"{handle}\"]}]",
                "setup[0].args[0]: `{handle}` is the public handle of an operation, known only in the operator commands",
            ),
        ] {
            let text = format!("{REFERENCE_PROFILE}\n{field}\n");
            let bad_one = Profile::parse(&text, "p.yaml", PathBuf::new()).unwrap_err();
            assert!(
                bad_one.to_string().starts_with(&format!("p.yaml: {bad}")),
                "{bad_one}"
            );
        }
        let good = Profile::parse(
            &format!(
                "{REFERENCE_PROFILE}\nregistry: \"{{env:PG}}/{{check_slug}}\"\nsetup: [{{command: createdb, args: [\"{{check_slug}}\"]}}]\n"
            ),
            "p.yaml",
            PathBuf::new(),
        )
        .unwrap();
        let unset = "CALLID_TEST_SURELY_UNSET_VARIABLE";
        let mut vars = Vars {
            check_slug: "c_1".into(),
            ..Vars::default()
        };
        vars.port = "7".into();
        assert_eq!(
            vars.apply(&format!("{{env:{unset}}}:{{port}}/{{check_slug}}")),
            ":7/c_1"
        );
        let text = good.check_env("p.yaml").unwrap_err().to_string();
        assert!(
            text.starts_with("p.yaml: registry: the environment variable `PG`")
                || std::env::var_os("PG").is_some(),
            "{text}"
        );
    }

    /// The key's placeholders work in `signed_envelopes` only, which must use one; the checks
    /// that sign start the router with its `args` and `env`, and a profile the runner does not
    /// start cannot run them.
    #[test]
    fn signing_placeholders_belong_to_signed_envelopes() {
        let gateway = include_str!("../../../scenarios/targets/gateway.yaml");
        let p = Profile::parse(gateway, "g.yaml", PathBuf::new()).unwrap();
        assert_eq!(p.signed_envelopes(), Can::Yes);
        let vars = Vars {
            trust_keys: "/tmp/t/trust-keys.yaml".into(),
            upstream_argv: vec!["relay".into()],
            ..Vars::default()
        };
        let signing = p.with_signed_envelopes();
        let args = vars.apply_args(&signing.args);
        assert_eq!(
            args[args.len() - 4..],
            ["--trust-keys", "/tmp/t/trust-keys.yaml", "--", "relay"]
        );
        assert!(
            !vars
                .apply_args(&p.args)
                .contains(&"--trust-keys".to_string())
        );
        assert!(matches!(
            Profile::url("http://127.0.0.1:9/mcp").signed_envelopes(),
            Can::DeclaredAbsent(r) if r.contains("does not declare `signed_envelopes`")
        ));
        assert!(matches!(
            p.clone().at_url("http://127.0.0.1:9/mcp").signed_envelopes(),
            Can::Cannot(r) if r.contains("cannot hand it the check's key")
        ));
        let env_only = format!(
            "{}\nsigned_envelopes: {{env: {{KEY: \"{{signing_public_key}}\"}}}}\n",
            gateway.split_once("\n# The signature.*").unwrap().0
        );
        let p = Profile::parse(&env_only, "g.yaml", PathBuf::new()).unwrap();
        assert_eq!(p.with_signed_envelopes().args, p.args);
        assert_eq!(p.with_signed_envelopes().env["KEY"], "{signing_public_key}");

        let bad = |from: &str, to: &str| {
            let text = gateway.replacen(from, to, 1);
            assert_ne!(text, gateway, "{from}");
            let err = Profile::parse(&text, "g.yaml", PathBuf::new()).unwrap_err();
            format!("{} ({})", err, err.code())
        };
        insta::assert_snapshot!(
            [
                bad(
                    "--spend, generate_image, --",
                    "--trust-keys, \"{trust_keys}\", --"
                ),
                bad("env: {}", "env: {K: \"{signing_public_key}\"}"),
                bad(
                    "\"{trust_keys}\", --, \"{upstream_argv}\"]",
                    "x, --, \"{upstream_argv}\"]"
                ),
                bad(
                    "--trust-keys, \"{trust_keys}\"",
                    "--trust-keys, \"x{upstream_argv}\""
                ),
                bad("signed_envelopes:\n", "signed_envelopes:\n  argz: []\n"),
            ]
            .join("\n")
        );
    }

    #[test]
    fn upstream_placeholders_belong_to_the_upstream_backend() {
        let gateway = GATEWAY_PROFILE;
        let p = Profile::parse(gateway, "g.yaml", PathBuf::new()).unwrap();
        assert_eq!(p.backend, Backend::Upstream);
        assert_eq!(p.ledger(), Can::Yes);
        let vars = Vars {
            callid: "/bin/callid".into(),
            upstream_argv: vec![
                "/opt/my callid".into(),
                "conform-upstream-relay".into(),
                "http://127.0.0.1:9/mcp".into(),
            ],
            ..Vars::default()
        };
        let args = vars.apply_args(&p.args);
        assert_eq!(
            args[args.len() - 4..],
            [
                "--",
                "/opt/my callid",
                "conform-upstream-relay",
                "http://127.0.0.1:9/mcp"
            ]
        );
        assert_eq!(
            vars.upstream_command(),
            "'/opt/my callid' conform-upstream-relay http://127.0.0.1:9/mcp"
        );
        assert_eq!(
            split_words(&vars.upstream_command()).unwrap(),
            vars.upstream_argv
        );

        let bad = |from: &str, to: &str| {
            Profile::parse(&gateway.replace(from, to), "g.yaml", PathBuf::new())
                .unwrap_err()
                .to_string()
        };
        let text = bad("\"{upstream_argv}\"]", "\"{provider_url}\"]");
        assert!(
            text.contains("`{provider_url}` belongs to `backend: provider`"),
            "{text}"
        );
        let text = bad("\"{upstream_argv}\"]", "\"x{upstream_argv}\"]");
        assert!(text.contains("give it as a whole `args` element"), "{text}");
        let text = Profile::parse(
            &REFERENCE_PROFILE.replace(
                "\"{provider_url}\", --approval",
                "\"{upstream_url}\", --approval",
            ),
            "r.yaml",
            PathBuf::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            text.contains("`{upstream_url}` belongs to `backend: upstream`"),
            "{text}"
        );
    }

    /// `--print-profile` lists every status and error code of the router's catalogues, and the
    /// shipped reference profile is that text (`in_doubt` and `outcome_in_doubt` included).
    #[test]
    fn the_template_lists_every_mappable_name_and_is_the_shipped_profile() {
        let text = template();
        for name in mappable_error_codes().chain(mappable_statuses()) {
            assert!(
                text.contains(&format!(" {name},")) || text.contains(&format!(" {name}\n")),
                "`{name}` missing from the template"
            );
        }
        assert!(text.contains(" outcome_in_doubt,") && text.contains(" in_doubt\n"));
        assert!(
            text == REFERENCE_PROFILE,
            "scenarios/targets/reference.yaml must equal `callid conform --print-profile`; write it as:\n{text}"
        );
    }

    /// ROUTER-CONTRACT.md lists exactly the statuses and error codes a profile may map.
    #[test]
    fn the_contract_lists_every_mappable_name() {
        let ticked = |names: Vec<&str>| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>();
        let codes = ticked(mappable_error_codes().collect());
        let statuses = ticked(mappable_statuses().collect());
        let list = |first: &str, names: &[String]| {
            wrap_list(
                first,
                "  ",
                &names.iter().map(String::as_str).collect::<Vec<_>>(),
            )
        };
        let want = format!(
            "{}{}",
            list("- error codes: ", &codes),
            list("- statuses: ", &statuses)
        );
        let contract = crate::conform::ROUTER_CONTRACT;
        let at = contract
            .find("- error codes: ")
            .expect("the contract lists the error codes a profile may map");
        assert!(
            contract[at..].starts_with(&want),
            "ROUTER-CONTRACT.md must list the mappable names as:\n{want}"
        );
    }

    /// Every refusal of an unknown name, in one labelled snapshot: a key of a fixed mapping at
    /// any depth, a word of a closed set, a status or error code a profile cannot map, and
    /// `{handle}` outside the operator commands.
    #[test]
    fn unknown_keys_anywhere_are_refused_with_the_valid_ones_and_the_nearest() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "a misspelt status",
                "statuses: {}",
                "statuses: {complete: done}",
            ),
            (
                "a misspelt error code",
                "error_codes: {}",
                "error_codes: {missing_identiy: no_call_id}",
            ),
            (
                "a status far from any",
                "statuses: {}",
                "statuses: {done: ok}",
            ),
            (
                "a capability",
                "capabilities: {restart: true",
                "capabilities: {restat: true",
            ),
            (
                "a tool",
                "  resume: resume_operation",
                "  resume: resume_operation\n  statsu: x",
            ),
            ("a pointer", "  replayed: /_meta", "  replay: /_meta"),
            ("an argument set", "  other: {prompt", "  othr: {prompt"),
            (
                "an operator command",
                "approve: {command: \"{callid}\", args",
                "approve: {comand: \"{callid}\", args",
            ),
            (
                "a top-level key",
                "private_key_prefix:",
                "private_key_prefx:",
            ),
            ("a transport", "transport: stdio", "transport: stdoi"),
            ("a backend", "backend: provider", "backend: upstrem"),
            (
                "{handle} in args",
                "\"{registry}\", --provider-url",
                "\"{handle}\", --provider-url",
            ),
            (
                "a typo in an operator command",
                "approve, \"{handle}\"",
                "approve, \"{handel}\"",
            ),
        ];
        let mut shown = String::new();
        for (label, from, to) in cases {
            assert!(REFERENCE_PROFILE.contains(from), "{label}: `{from}`");
            let err = Profile::parse(
                &REFERENCE_PROFILE.replacen(from, to, 1),
                "p.yaml",
                PathBuf::new(),
            )
            .unwrap_err();
            shown.push_str(&format!("{label} ({}):\n  {err}\n", err.code()));
        }
        insta::assert_snapshot!(shown);
    }

    #[test]
    fn every_mappable_name_is_accepted() {
        let statuses: Vec<String> = mappable_statuses().map(|s| format!("{s}: x_{s}")).collect();
        let codes: Vec<String> = mappable_error_codes()
            .map(|c| format!("{c}: x_{c}"))
            .collect();
        let text = REFERENCE_PROFILE
            .replace(
                "statuses: {}",
                &format!("statuses: {{{}}}", statuses.join(", ")),
            )
            .replace(
                "error_codes: {}",
                &format!("error_codes: {{{}}}", codes.join(", ")),
            );
        let p = Profile::parse(&text, "p.yaml", PathBuf::new()).unwrap();
        assert_eq!(p.status_word("in_doubt"), "x_in_doubt");
        assert_eq!(p.error_code("outcome_in_doubt"), "x_outcome_in_doubt");
    }

    #[test]
    fn invalid_profiles_name_the_path() {
        let bad = Profile::parse(
            &REFERENCE_PROFILE.replace("capabilities:", "capabilitie:"),
            "p.yaml",
            PathBuf::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad.starts_with("p.yaml: capabilitie: unknown key `capabilitie` at line ")
                && bad.contains(" (did you mean `capabilities`?); the valid ones are `name`, "),
            "{bad}"
        );
        let bad = Profile::parse(
            &REFERENCE_PROFILE.replace(
                "handle: /structuredContent/handle",
                "handle: structuredContent.handle",
            ),
            "p.yaml",
            PathBuf::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(bad.starts_with("p.yaml: pointers.handle: "), "{bad}");
    }
}
