//! How to run each real client program non-interactively, offline, against a scripted model
//! endpoint and one MCP server: its binary, version, temporary home, config and command line.
//!
//! Every run gets a fresh temporary directory as its home: the client's own config, sessions,
//! caches and credentials never touch the user's, and nothing from the user's leaks in.

use super::endpoint::{ToolName, Wire};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A client `measure` knows how to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// OpenAI Codex CLI (`codex exec`).
    Codex,
    /// Anthropic Claude Code (`claude -p`).
    ClaudeCode,
}

/// The MCP server name the client is configured with; tool names derive from it.
pub const SERVER_NAME: &str = "probe";
/// The probe's tool the scripted model calls.
pub const TOOL: &str = "capabilities";
/// Seconds the client waits for one tool call before giving up, where it can be configured.
pub const TOOL_TIMEOUT_SECS: u64 = 6;
/// The prompt. The scripted model ignores it; it is there because the client requires one.
pub const PROMPT: &str = "Call the probe's capabilities tool and report what it says.";

/// Why a client could not be prepared or run.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No binary found.
    #[error(
        "no `{program}` binary found in `{searched}`; install the pinned clients with `npm install \
         --no-save --prefix matrices/clients`, or pass `--bin PATH`"
    )]
    NotFound {
        /// The program name.
        program: &'static str,
        /// Where it was looked for.
        searched: String,
    },
    /// `--version` failed or said something unexpected.
    #[error("failed to read the version of `{bin}`: {detail}")]
    Version {
        /// The binary.
        bin: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A temporary file could not be written.
    #[error("failed to write `{path}`")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::NotFound { .. } => "client_not_found",
            ClientError::Version { .. } => "client_version",
            ClientError::Io { .. } => "client_io",
        }
    }
}

/// A prepared run: program, arguments, environment, working directory.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Environment variables set on top of a cleared environment.
    pub envs: Vec<(OsString, OsString)>,
    /// Working directory.
    pub cwd: PathBuf,
}

impl Client {
    /// The program's name on PATH and in `node_modules/.bin`.
    pub fn program(self) -> &'static str {
        match self {
            Client::Codex => "codex",
            Client::ClaudeCode => "claude",
        }
    }

    /// Short name used in rows, evidence files and `--client`.
    pub fn slug(self) -> &'static str {
        match self {
            Client::Codex => "codex",
            Client::ClaudeCode => "claude-code",
        }
    }

    /// The row's display name and surface.
    pub fn display(self) -> (&'static str, &'static str) {
        match self {
            Client::Codex => ("Codex CLI", "`codex exec`, MCP server over stdio"),
            Client::ClaudeCode => ("Claude Code", "`claude -p`, MCP server over stdio"),
        }
    }

    /// The wire format of its model API.
    pub fn wire(self) -> Wire {
        match self {
            Client::Codex => Wire::Responses,
            Client::ClaudeCode => Wire::Messages,
        }
    }

    /// How the client presents the probe's tool to the model.
    pub fn tool_name(self) -> ToolName {
        match self {
            Client::Codex => ToolName::Namespaced {
                namespace: format!("mcp__{SERVER_NAME}"),
                name: TOOL.into(),
            },
            Client::ClaudeCode => ToolName::Flat(format!("mcp__{SERVER_NAME}__{TOOL}")),
        }
    }

    /// The arguments of the scripted model's tool call.
    pub fn tool_arguments(self) -> serde_json::Value {
        serde_json::json!({})
    }

    /// The model's tool-call id for call number `n` of scenario `tag`: the shape each vendor's
    /// API uses (`call_` + 24 alphanumerics, `toolu_` + 24 base62), fixed so evidence can be
    /// checked against it.
    pub fn model_call_id(self, tag: &str, n: usize) -> String {
        let mut body = format!("callidmeasure{tag}{n}");
        body.retain(|c| c.is_ascii_alphanumeric());
        while body.len() < 24 {
            body.push('0');
        }
        body.truncate(24);
        match self {
            Client::Codex => format!("call_{body}"),
            Client::ClaudeCode => format!("toolu_{body}"),
        }
    }

    /// Finds the binary: `bin` if given, else `matrix_dir/clients/node_modules/.bin`, else PATH.
    pub fn locate(self, bin: Option<&Path>, matrix_dir: &Path) -> Result<PathBuf, ClientError> {
        if let Some(bin) = bin {
            return if bin.is_file() {
                Ok(std::path::absolute(bin).unwrap_or_else(|_| bin.to_owned()))
            } else {
                Err(ClientError::NotFound {
                    program: self.program(),
                    searched: bin.display().to_string(),
                })
            };
        }
        let local = matrix_dir
            .join("clients/node_modules/.bin")
            .join(self.program());
        if local.is_file() {
            // The client runs in its own working directory: the path must not be relative.
            return Ok(std::path::absolute(&local).unwrap_or(local));
        }
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let candidate = dir.join(self.program());
                if candidate.is_file() {
                    return Ok(candidate);
                }
            }
        }
        Err(ClientError::NotFound {
            program: self.program(),
            searched: format!("{} and PATH", local.display()),
        })
    }

    /// The exact version the binary reports (`codex-cli 0.171.0` -> `0.171.0`,
    /// `2.1.332 (Claude Code)` -> `2.1.332`).
    pub fn version(self, bin: &Path) -> Result<String, ClientError> {
        let out = std::process::Command::new(bin)
            .arg("--version")
            .env("DISABLE_AUTOUPDATER", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| ClientError::Version {
                bin: bin.to_owned(),
                detail: e.to_string(),
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        parse_version(&text).ok_or_else(|| ClientError::Version {
            bin: bin.to_owned(),
            detail: format!("no version number in {:?}", text.trim()),
        })
    }

    /// Writes the client's config into `home` and returns how to run it. `server` is the MCP
    /// server command line (program first).
    pub fn prepare(
        self,
        bin: &Path,
        home: &Path,
        endpoint_base: &str,
        server: &[String],
    ) -> Result<Invocation, ClientError> {
        let write = |path: PathBuf, text: String| {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| ClientError::Io {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            std::fs::write(&path, text).map_err(|source| ClientError::Io { path, source })
        };
        let work = home.join("work");
        std::fs::create_dir_all(&work).map_err(|source| ClientError::Io {
            path: work.clone(),
            source,
        })?;
        let mut envs: Vec<(OsString, OsString)> = vec![
            ("HOME".into(), home.into()),
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("TMPDIR".into(), std::env::temp_dir().into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("NO_COLOR".into(), "1".into()),
        ];
        let (program, args) = match self {
            Client::Codex => {
                let codex_home = home.join("codex");
                let toml_str = |s: &str| serde_json::to_string(s).expect("strings serialize");
                let mut config = format!(
                    "model = \"gpt-5\"\nmodel_provider = \"scripted\"\napproval_policy = \"never\"\n\
                     [model_providers.scripted]\nname = \"scripted\"\nbase_url = {}\n\
                     wire_api = \"responses\"\nenv_key = \"CALLID_SCRIPTED_KEY\"\n\
                     request_max_retries = 0\nstream_max_retries = 0\n\
                     [mcp_servers.{SERVER_NAME}]\ncommand = {}\nargs = [",
                    toml_str(&format!("{endpoint_base}/v1")),
                    toml_str(&server[0]),
                );
                config.push_str(
                    &server[1..]
                        .iter()
                        .map(|a| toml_str(a))
                        .collect::<Vec<_>>()
                        .join(", "),
                );
                config.push_str(&format!(
                    "]\nstartup_timeout_sec = 20\ntool_timeout_sec = {TOOL_TIMEOUT_SECS}\n"
                ));
                write(codex_home.join("config.toml"), config)?;
                envs.push(("CODEX_HOME".into(), codex_home.into()));
                envs.push(("CALLID_SCRIPTED_KEY".into(), "scripted-offline-key".into()));
                (
                    bin.to_owned(),
                    vec![
                        "exec".into(),
                        "--skip-git-repo-check".into(),
                        "--dangerously-bypass-approvals-and-sandbox".into(),
                        "--disable".into(),
                        "plugins".into(),
                        "--disable".into(),
                        "apps".into(),
                        PROMPT.into(),
                    ],
                )
            }
            Client::ClaudeCode => {
                let config_dir = home.join("claude");
                let mcp = serde_json::json!({"mcpServers": {SERVER_NAME: {
                    "type": "stdio", "command": server[0], "args": &server[1..], "env": {}}}});
                let mcp_path = home.join("mcp.json");
                write(mcp_path.clone(), mcp.to_string())?;
                std::fs::create_dir_all(&config_dir).map_err(|source| ClientError::Io {
                    path: config_dir.clone(),
                    source,
                })?;
                for (k, v) in [
                    ("ANTHROPIC_BASE_URL", endpoint_base),
                    ("ANTHROPIC_API_KEY", "scripted-offline-key"),
                    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
                    ("DISABLE_AUTOUPDATER", "1"),
                    ("DISABLE_TELEMETRY", "1"),
                    ("DISABLE_ERROR_REPORTING", "1"),
                    ("ENABLE_TOOL_SEARCH", "false"),
                    ("MCP_TIMEOUT", "20000"),
                    ("MCP_TOOL_TIMEOUT", &(TOOL_TIMEOUT_SECS * 1000).to_string()),
                ] {
                    envs.push((k.into(), v.into()));
                }
                envs.push(("CLAUDE_CONFIG_DIR".into(), config_dir.into()));
                (
                    bin.to_owned(),
                    vec![
                        "-p".into(),
                        PROMPT.into(),
                        "--mcp-config".into(),
                        mcp_path.into(),
                        "--strict-mcp-config".into(),
                        "--allowedTools".into(),
                        format!("mcp__{SERVER_NAME}__{TOOL}").into(),
                    ],
                )
            }
        };
        Ok(Invocation {
            program,
            args,
            envs,
            cwd: work,
        })
    }
}

/// The first dotted version number in `text`.
pub fn parse_version(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .find(|w| {
            let parts: Vec<&str> = w.split('.').collect();
            parts.len() >= 2
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_ids() {
        assert_eq!(
            parse_version("codex-cli 0.171.0\n").as_deref(),
            Some("0.171.0")
        );
        assert_eq!(
            parse_version("2.1.332 (Claude Code)\n").as_deref(),
            Some("2.1.332")
        );
        assert_eq!(parse_version("codex-cli dev"), None);
        let id = Client::Codex.model_call_id("dup", 1);
        assert_eq!(id, "call_callidmeasuredup10000000");
        assert_eq!(id.len(), "call_".len() + 24);
        let id = Client::ClaudeCode.model_call_id("basic", 2);
        assert_eq!(id.len(), "toolu_".len() + 24);
        assert_ne!(
            Client::Codex.model_call_id("basic", 1),
            Client::Codex.model_call_id("basic", 2)
        );
    }
}
