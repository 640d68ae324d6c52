//! Target profiles: how the runner starts, reaches and operates one router.
//!
//! A [`Profile`] (YAML, strict) says how to start the router (a command over stdio, or a URL with
//! an optional start command), the spend, status and resume tools, three argument sets, the JSON
//! pointers of the handle, error code, status, result and charge id in a tool result, the private
//! key pattern to scan for, the operator commands, and the capabilities the runner may use. What a
//! target cannot do makes the scenarios that need it not applicable, never passed.
//!
//! # Placeholders (in command, args, env, url)
//! `{callid}` this binary, `{state_dir}` a fresh directory per scenario, `{registry}`
//! (`{state_dir}/registry.sqlite3`), `{provider_url}` the runner's provider, `{port}` a free
//! loopback port picked per scenario, `{handle}` (operator commands), `{profile_dir}` the
//! profile's directory.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The shipped profile of the reference router.
pub const REFERENCE_PROFILE: &str = include_str!("../../scenarios/targets/reference.yaml");

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
    /// What the runner may do to this target.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// For a router the runner does not start: the address the runner's provider listens on
    /// (the router was configured with `http://{provider_listen}`). Without it, and without a
    /// start command, charges cannot be counted.
    #[serde(default)]
    pub provider_listen: Option<String>,
    /// The profile's directory (`{profile_dir}`), set on load.
    #[serde(skip)]
    pub dir: PathBuf,
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
    /// The public handle.
    #[serde(default = "p_handle")]
    pub handle: String,
    /// The error code of a tool error.
    #[serde(default = "p_error")]
    pub error: String,
    /// The operation status.
    #[serde(default = "p_status")]
    pub status: String,
    /// The part of a result that a replay must reproduce exactly.
    #[serde(default = "p_result")]
    pub result: String,
    /// The provider's charge id.
    #[serde(default = "p_charge")]
    pub charge_id: String,
    /// The boolean that marks a replayed result.
    #[serde(default = "p_replayed")]
    pub replayed: String,
}

fn p_handle() -> String {
    "/structuredContent/handle".into()
}
fn p_error() -> String {
    "/structuredContent/error".into()
}
fn p_status() -> String {
    "/structuredContent/status".into()
}
fn p_result() -> String {
    "/structuredContent".into()
}
fn p_charge() -> String {
    "/structuredContent/result/charge_id".into()
}
fn p_replayed() -> String {
    "/_meta/callid~1replayed".into()
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

/// What the runner may do to the target.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Stop and start it again on the same state.
    #[serde(default)]
    pub restart: bool,
    /// Kill it with SIGKILL at a provider trigger.
    #[serde(default)]
    pub kill: bool,
    /// It has an approval policy and operator commands.
    #[serde(default)]
    pub approval: bool,
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
    /// `--stdio` could not be split into words.
    #[error("failed to split `--stdio {0}` into words: unbalanced quote")]
    Split(String),
}

impl TargetError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::Read { .. } => "target_unreadable",
            TargetError::Invalid { .. } => "target_invalid",
            TargetError::Split(_) => "target_command_invalid",
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
        let dir = file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Profile::parse(&text, &file.display().to_string(), dir)
    }

    /// Parses a profile document; `name` labels errors.
    pub fn parse(text: &str, name: &str, dir: PathBuf) -> Result<Profile, TargetError> {
        let invalid = |path: String, message: String| TargetError::Invalid {
            file: name.to_string(),
            path,
            message,
        };
        let de = serde_yaml::Deserializer::from_str(text);
        let mut profile: Profile = serde_path_to_error::deserialize(de)
            .map_err(|e| invalid(e.path().to_string(), crate::yaml::message(&e)))?;
        profile.dir = dir;
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
        if profile.capabilities.approval
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
        for (field, pointer) in [
            ("pointers.handle", &profile.pointers.handle),
            ("pointers.error", &profile.pointers.error),
            ("pointers.status", &profile.pointers.status),
            ("pointers.result", &profile.pointers.result),
            ("pointers.charge_id", &profile.pointers.charge_id),
            ("pointers.replayed", &profile.pointers.replayed),
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
        profile.capabilities = Capabilities::default();
        profile
    }

    /// Whether the runner starts the router itself (and so can point it at its provider).
    pub fn runner_starts(&self) -> bool {
        self.command.is_some()
    }

    /// Whether the runner can count the router's charges.
    pub fn has_ledger(&self) -> bool {
        self.runner_starts() || self.provider_listen.is_some()
    }

    /// Whether stop-and-start on the same state is possible.
    pub fn can_restart(&self) -> bool {
        self.capabilities.restart && self.runner_starts()
    }

    /// Whether the runner may kill the router with SIGKILL (it must own the process).
    pub fn can_kill(&self) -> bool {
        self.capabilities.kill && self.runner_starts()
    }

    /// Whether approval scenarios can run.
    pub fn can_approve(&self) -> bool {
        self.capabilities.approval && self.approve.is_some() && self.deny.is_some()
    }
}

/// Values of the placeholders for one scenario.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    /// `{callid}`.
    pub callid: String,
    /// `{state_dir}`.
    pub state_dir: String,
    /// `{registry}`.
    pub registry: String,
    /// `{provider_url}`.
    pub provider_url: String,
    /// `{port}`.
    pub port: String,
    /// `{profile_dir}`.
    pub profile_dir: String,
    /// `{handle}`.
    pub handle: String,
}

impl Vars {
    /// Replaces every known placeholder in `text`.
    pub fn apply(&self, text: &str) -> String {
        text.replace("{callid}", &self.callid)
            .replace("{state_dir}", &self.state_dir)
            .replace("{registry}", &self.registry)
            .replace("{provider_url}", &self.provider_url)
            .replace("{port}", &self.port)
            .replace("{profile_dir}", &self.profile_dir)
            .replace("{handle}", &self.handle)
    }
}

/// Splits a command line into words like a POSIX shell does for quotes and backslashes (no
/// expansion of any kind). `None` on an unbalanced quote.
pub fn split_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => word.push(c),
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_words_follows_shell_quoting() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            (
                "python3 router.py --flaw x",
                Some(&["python3", "router.py", "--flaw", "x"]),
            ),
            (
                "  a   'b c'  \"d \\\" e\" f\\ g ",
                Some(&["a", "b c", "d \" e", "f g"]),
            ),
            ("''", Some(&[""])),
            ("", Some(&[])),
            ("a 'b", None),
            ("a \"b", None),
        ];
        for (line, want) in cases {
            let got = split_words(line);
            assert_eq!(
                got.as_deref()
                    .map(|w| w.iter().map(String::as_str).collect::<Vec<_>>()),
                want.map(|w| w.to_vec()),
                "{line:?}"
            );
        }
    }

    #[test]
    fn reference_profile_is_valid_and_fully_capable() {
        let p = Profile::reference();
        assert!(p.can_restart() && p.can_kill() && p.can_approve() && p.has_ledger());
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
        assert!(!p.can_restart() && !p.can_kill() && !p.can_approve() && !p.has_ledger());
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
            bad.starts_with("p.yaml: capabilitie: unknown field")
                || bad.starts_with("p.yaml: .: unknown field `capabilitie`"),
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
