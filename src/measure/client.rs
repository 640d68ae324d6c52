//! How to run each real client program non-interactively, offline, against a scripted model
//! endpoint and one MCP server: its binary, version, temporary home, config and command line.
//!
//! Every run gets a fresh temporary directory as its home: the client's own config, sessions,
//! caches and credentials never touch the user's, and nothing from the user's leaks in.

use super::endpoint::{SCRIPTED_MODEL, ToolName, Wire};
use crate::classify::runs::IdStyle;
use crate::matrix::outdated::{Package, Registry};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A client `measure` knows how to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// OpenAI Codex CLI (`codex exec`).
    Codex,
    /// Anthropic Claude Code (`claude -p`).
    ClaudeCode,
    /// Google Gemini CLI (`gemini -p`), Gemini API.
    GeminiCli,
    /// GitHub Copilot CLI (`copilot -p`), Chat Completions through its own-provider mode.
    CopilotCli,
    /// Qwen Code (`qwen -p`), Chat Completions.
    QwenCode,
    /// OpenCode (`opencode run`), Chat Completions through `@ai-sdk/openai-compatible`.
    OpenCode,
    /// Kilo Code CLI (`kilo run`), an OpenCode fork.
    KiloCode,
    /// Cline CLI (`cline PROMPT`), Chat Completions.
    Cline,
    /// Continue CLI (`cn -p`), Chat Completions.
    ContinueCli,
    /// fast-agent (`fast-agent go`, PyPI `fast-agent-mcp`), Chat Completions as its `generic`
    /// provider.
    FastAgent,
    /// The OpenAI Agents SDK (PyPI `openai-agents`): one `Agent` run by the driver
    /// `matrices/clients/drivers/openai-agents-client.py`, Chat Completions.
    OpenAiAgents,
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
    #[error("no `{program}` binary found in `{searched}`; {hint}, or pass `--bin PATH`")]
    NotFound {
        /// The program name.
        program: &'static str,
        /// How to install it.
        hint: String,
        /// Where it was looked for.
        searched: String,
    },
    /// The `--bin` path is not a file.
    #[error(
        "`--bin {}` does not exist or is not a file; give the path of the installed `{program}` \
         program (`command -v {program}` prints it when it is on PATH)",
        .path.display()
    )]
    BinMissing {
        /// The program name.
        program: &'static str,
        /// The path given.
        path: PathBuf,
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
            ClientError::BinMissing { .. } => "client_bin_missing",
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
    /// Every client `measure` drives with a scripted model.
    pub const ALL: [Client; 11] = [
        Client::Codex,
        Client::ClaudeCode,
        Client::GeminiCli,
        Client::CopilotCli,
        Client::QwenCode,
        Client::OpenCode,
        Client::KiloCode,
        Client::Cline,
        Client::ContinueCli,
        Client::FastAgent,
        Client::OpenAiAgents,
    ];

    /// The package the client is installed from (pinned in `matrices/clients/`).
    pub fn package(self) -> Package {
        let (registry, name) = match self {
            Client::Codex => (Registry::Npm, "@openai/codex"),
            Client::ClaudeCode => (Registry::Npm, "@anthropic-ai/claude-code"),
            Client::GeminiCli => (Registry::Npm, "@google/gemini-cli"),
            Client::CopilotCli => (Registry::Npm, "@github/copilot"),
            Client::QwenCode => (Registry::Npm, "@qwen-code/qwen-code"),
            Client::OpenCode => (Registry::Npm, "opencode-ai"),
            Client::KiloCode => (Registry::Npm, "@kilocode/cli"),
            Client::Cline => (Registry::Npm, "cline"),
            Client::ContinueCli => (Registry::Npm, "@continuedev/cli"),
            Client::FastAgent => (Registry::PyPi, "fast-agent-mcp"),
            Client::OpenAiAgents => (Registry::PyPi, "openai-agents"),
        };
        Package { registry, name }
    }

    /// The program's name on PATH and in `node_modules/.bin`.
    pub fn program(self) -> &'static str {
        match self {
            Client::Codex => "codex",
            Client::ClaudeCode => "claude",
            Client::GeminiCli => "gemini",
            Client::CopilotCli => "copilot",
            Client::QwenCode => "qwen",
            Client::OpenCode => "opencode",
            Client::KiloCode => "kilo",
            Client::Cline => "cline",
            Client::ContinueCli => "cn",
            Client::FastAgent => "fast-agent",
            Client::OpenAiAgents => "python",
        }
    }

    /// Short name used in rows, evidence files and `--client`.
    pub fn slug(self) -> &'static str {
        match self {
            Client::Codex => "codex",
            Client::ClaudeCode => "claude-code",
            Client::GeminiCli => "gemini-cli",
            Client::CopilotCli => "copilot-cli",
            Client::QwenCode => "qwen-code",
            Client::OpenCode => "opencode",
            Client::KiloCode => "kilo-code",
            Client::Cline => "cline",
            Client::ContinueCli => "continue-cli",
            Client::FastAgent => "fast-agent",
            Client::OpenAiAgents => "openai-agents",
        }
    }

    /// The row id: the slug, with `-cli` added where the slug does not say it.
    pub fn row_id(self) -> String {
        match self.slug() {
            slug if slug.ends_with("-cli") => slug.to_owned(),
            slug => format!("{slug}-cli"),
        }
    }

    /// The row's display name and surface.
    pub fn display(self) -> (&'static str, &'static str) {
        match self {
            Client::Codex => ("Codex CLI", "`codex exec`, MCP server over stdio"),
            Client::ClaudeCode => ("Claude Code", "`claude -p`, MCP server over stdio"),
            Client::GeminiCli => ("Gemini CLI", "`gemini -p`, MCP server over stdio"),
            Client::CopilotCli => ("GitHub Copilot CLI", "`copilot -p`, MCP server over stdio"),
            Client::QwenCode => (
                "Qwen Code",
                "`qwen -p`, MCP server over stdio (through its `tool_call` tool)",
            ),
            Client::OpenCode => ("OpenCode", "`opencode run`, MCP server over stdio"),
            Client::KiloCode => ("Kilo Code CLI", "`kilo run`, MCP server over stdio"),
            Client::Cline => ("Cline CLI", "`cline PROMPT`, MCP server over stdio"),
            Client::ContinueCli => ("Continue CLI", "`cn -p`, MCP server over stdio"),
            Client::FastAgent => (
                "fast-agent",
                "`fast-agent go --message`, MCP server over stdio",
            ),
            Client::OpenAiAgents => (
                "OpenAI Agents SDK (Python)",
                "`Runner.run` of an `Agent` with `MCPServerStdio`, Chat Completions model",
            ),
        }
    }

    /// Whether the client states its own package version in MCP `clientInfo`. Those that do
    /// not send a fixed placeholder, which the row records beside the package version.
    pub fn states_its_version(self) -> bool {
        !matches!(
            self,
            Client::QwenCode | Client::Cline | Client::ContinueCli | Client::OpenAiAgents
        )
    }

    /// Whether the client is a Python package in the project-local venv
    /// (`matrices/clients/.venv`) rather than an npm package.
    pub fn is_python(self) -> bool {
        matches!(self, Client::FastAgent | Client::OpenAiAgents)
    }

    /// How to install the client: inside a callid checkout (`matrix_dir/clients` holds the
    /// pinned versions) the command that installs the pinned one, elsewhere the package to
    /// install.
    pub fn install_hint(self, matrix_dir: &Path) -> String {
        let clients = matrix_dir.join("clients");
        let name = self.display().0;
        let package = self.package();
        match (self.is_python(), clients.join("package.json").is_file()) {
            (false, true) => {
                "install the pinned clients with `npm install --no-save --prefix matrices/clients`"
                    .into()
            }
            (true, true) => "make the venv with the pinned Python clients: `python3.12 -m venv \
                 matrices/clients/.venv && matrices/clients/.venv/bin/python -m pip install -r \
                 matrices/clients/requirements.txt` (`.ci/run` does this)"
                .into(),
            (false, false) => format!(
                "install {name} (npm package `{}`) so that `{}` is on PATH",
                package.name,
                self.program()
            ),
            (true, false) => format!(
                "install {name} (PyPI package `{}`) in a Python virtual environment",
                package.name
            ),
        }
    }

    /// The wire format of its model API.
    pub fn wire(self) -> Wire {
        match self {
            Client::Codex => Wire::Responses,
            Client::ClaudeCode => Wire::Messages,
            Client::GeminiCli => Wire::Gemini,
            Client::CopilotCli
            | Client::QwenCode
            | Client::OpenCode
            | Client::KiloCode
            | Client::Cline
            | Client::ContinueCli
            | Client::FastAgent
            | Client::OpenAiAgents => Wire::ChatCompletions,
        }
    }

    /// How the client presents the probe's tool to the model.
    pub fn tool_name(self) -> ToolName {
        ToolName::Flat(match self {
            Client::Codex => {
                return ToolName::Namespaced {
                    namespace: format!("mcp__{SERVER_NAME}"),
                    name: TOOL.into(),
                };
            }
            Client::ClaudeCode => format!("mcp__{SERVER_NAME}__{TOOL}"),
            Client::GeminiCli => format!("mcp_{SERVER_NAME}_{TOOL}"),
            Client::CopilotCli => format!("{SERVER_NAME}-{TOOL}"),
            // Qwen Code offers MCP tools only through its own `tool_call` tool.
            Client::QwenCode => "tool_call".into(),
            Client::OpenCode | Client::KiloCode => format!("{SERVER_NAME}_{TOOL}"),
            Client::Cline => format!("{SERVER_NAME}__{TOOL}"),
            Client::ContinueCli | Client::OpenAiAgents => TOOL.into(),
            Client::FastAgent => format!("{SERVER_NAME}__{TOOL}"),
        })
    }

    /// The arguments of a scripted model tool call that passes `arguments` to the probe's tool:
    /// `arguments` themselves, or for Qwen Code's `tool_call` the probe's tool by name with them.
    pub fn tool_arguments(self, arguments: serde_json::Value) -> serde_json::Value {
        match self {
            Client::QwenCode => serde_json::json!({
                "name": format!("mcp__{SERVER_NAME}__{TOOL}"),
                "arguments": arguments,
            }),
            _ => arguments,
        }
    }

    /// The model's tool-call id for call number `n` of scenario `tag`: the shape each vendor's
    /// API uses (`call_` + 24 alphanumerics, `toolu_` + 24 base62), fixed so evidence can be
    /// checked against it.
    #[cfg(test)]
    pub fn model_call_id(self, tag: &str, n: usize) -> String {
        self.id_style().model_call_id(tag, n)
    }

    /// The shape of the tool-call ids of this client's model API.
    pub fn id_style(self) -> IdStyle {
        match self.wire() {
            Wire::Messages => IdStyle::Anthropic,
            Wire::Responses | Wire::ChatCompletions | Wire::Gemini => IdStyle::OpenAi,
        }
    }

    /// Finds the binary: `bin` if given, else `matrix_dir/clients/node_modules/.bin`, else PATH.
    pub fn locate(self, bin: Option<&Path>, matrix_dir: &Path) -> Result<PathBuf, ClientError> {
        if let Some(bin) = bin {
            return if bin.is_file() {
                Ok(std::path::absolute(bin).unwrap_or_else(|_| bin.to_owned()))
            } else {
                Err(ClientError::BinMissing {
                    program: self.program(),
                    path: bin.to_owned(),
                })
            };
        }
        let in_checkout = matrix_dir.join("clients/package.json").is_file();
        let local = if self.is_python() {
            matrix_dir.join("clients/.venv/bin").join(self.program())
        } else {
            matrix_dir
                .join("clients/node_modules/.bin")
                .join(self.program())
        };
        if local.is_file() {
            // The client runs in its own working directory: the path must not be relative.
            // (Not canonicalized: a venv's `python` is a symlink that must keep its venv.)
            return Ok(std::path::absolute(&local).unwrap_or(local));
        }
        if self.is_python() {
            // A `python` or `fast-agent` elsewhere on PATH is not the pinned one.
            return Err(ClientError::NotFound {
                program: self.program(),
                hint: self.install_hint(matrix_dir),
                searched: local.display().to_string(),
            });
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
            hint: self.install_hint(matrix_dir),
            searched: if in_checkout {
                format!("{} and PATH", local.display())
            } else {
                "PATH".into()
            },
        })
    }

    /// The exact version the binary reports (`codex-cli 0.171.0` -> `0.171.0`,
    /// `2.1.332 (Claude Code)` -> `2.1.332`, `GitHub Copilot CLI 1.0.102.` -> `1.0.102`).
    pub fn version(self, bin: &Path) -> Result<String, ClientError> {
        let mut cmd = std::process::Command::new(bin);
        if self == Client::OpenAiAgents {
            // A library: the venv's Python says which version it has installed.
            cmd.args([
                "-c",
                "from importlib.metadata import version; print(version('openai-agents'))",
            ]);
        } else {
            cmd.arg("--version");
        }
        let out = cmd
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
                let mut config = format!(
                    "model = \"gpt-5\"\nmodel_provider = \"scripted\"\napproval_policy = \"never\"\n\
                     [model_providers.scripted]\nname = \"scripted\"\nbase_url = {}\n\
                     wire_api = \"responses\"\nenv_key = \"CALLID_SCRIPTED_KEY\"\n\
                     request_max_retries = 0\nstream_max_retries = 0\n",
                    toml_str(&format!("{endpoint_base}/v1")),
                );
                config.push_str(&codex_server_toml(SERVER_NAME, server));
                config.push_str(&format!(
                    "startup_timeout_sec = 20\ntool_timeout_sec = {TOOL_TIMEOUT_SECS}\n"
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
                let mcp = claude_code_mcp_json(SERVER_NAME, server);
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
            Client::GeminiCli | Client::QwenCode => {
                // Gemini CLI and its fork Qwen Code read `~/.gemini` / `~/.qwen/settings.json`.
                let mcp = serde_json::json!({SERVER_NAME: {
                    "command": server[0], "args": &server[1..],
                    "timeout": TOOL_TIMEOUT_SECS * 1000, "trust": true}});
                let mut args: Vec<OsString> = vec!["-p".into(), PROMPT.into(), "--yolo".into()];
                if self == Client::GeminiCli {
                    let settings = serde_json::json!({
                        "security": {"auth": {"selectedType": "gemini-api-key"},
                                     "folderTrust": {"enabled": false}},
                        "privacy": {"usageStatisticsEnabled": false},
                        "mcpServers": mcp,
                    });
                    write(home.join(".gemini/settings.json"), settings.to_string())?;
                    envs.push(("GOOGLE_GEMINI_BASE_URL".into(), endpoint_base.into()));
                    envs.push(("GEMINI_API_KEY".into(), "scripted-offline-key".into()));
                } else {
                    let settings = serde_json::json!({"mcpServers": mcp});
                    write(home.join(".qwen/settings.json"), settings.to_string())?;
                    for (k, v) in [
                        ("OPENAI_BASE_URL", format!("{endpoint_base}/v1")),
                        ("OPENAI_API_KEY", "scripted-offline-key".into()),
                        ("OPENAI_MODEL", SCRIPTED_MODEL.into()),
                        ("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1".into()),
                    ] {
                        envs.push((k.into(), v.into()));
                    }
                    args.extend(["--auth-type".into(), "openai".into()]);
                }
                (bin.to_owned(), args)
            }
            Client::CopilotCli => {
                let mcp = serde_json::json!({"mcpServers": {SERVER_NAME: {
                    "type": "local", "command": server[0], "args": &server[1..],
                    "tools": ["*"], "timeout": TOOL_TIMEOUT_SECS * 1000}}});
                write(home.join(".copilot/mcp-config.json"), mcp.to_string())?;
                for (k, v) in [
                    ("COPILOT_OFFLINE", "true".to_owned()),
                    ("COPILOT_PROVIDER_BASE_URL", format!("{endpoint_base}/v1")),
                    ("COPILOT_PROVIDER_TYPE", "openai".into()),
                    ("COPILOT_PROVIDER_API_KEY", "scripted-offline-key".into()),
                    ("COPILOT_MODEL", SCRIPTED_MODEL.into()),
                ] {
                    envs.push((k.into(), v.into()));
                }
                (
                    bin.to_owned(),
                    vec![
                        "-p".into(),
                        PROMPT.into(),
                        "--allow-all-tools".into(),
                        "--trust-folder".into(),
                    ],
                )
            }
            Client::OpenCode | Client::KiloCode => {
                let config = serde_json::json!({
                    "provider": {"scripted": {
                        "npm": "@ai-sdk/openai-compatible", "name": "scripted",
                        "options": {"baseURL": format!("{endpoint_base}/v1"),
                                    "apiKey": "scripted-offline-key"},
                        "models": {SCRIPTED_MODEL: {"name": SCRIPTED_MODEL}}}},
                    "model": format!("scripted/{SCRIPTED_MODEL}"),
                    "mcp": {SERVER_NAME: {"type": "local", "command": server, "enabled": true,
                                          "timeout": TOOL_TIMEOUT_SECS * 1000}},
                    "autoupdate": false,
                    "share": "disabled",
                });
                write(work.join("opencode.json"), config.to_string())?;
                // Kilo renamed OpenCode's switches; each reads its own.
                let prefix = if self == Client::KiloCode {
                    "KILO"
                } else {
                    "OPENCODE"
                };
                for k in [
                    "DISABLE_AUTOUPDATE",
                    "DISABLE_MODELS_FETCH",
                    "DISABLE_LSP_DOWNLOAD",
                    "DISABLE_DEFAULT_PLUGINS",
                ] {
                    envs.push((format!("{prefix}_{k}").into(), "1".into()));
                }
                if self == Client::KiloCode {
                    for k in [
                        "KILO_DISABLE_CODEBASE_INDEXING",
                        "KILO_DISABLE_SESSION_INGEST",
                        "KILO_DISABLE_SHARE",
                        "KILO_DISABLE_PRESENCE",
                    ] {
                        envs.push((k.into(), "1".into()));
                    }
                    // Telemetry that cannot reach its host delays the start by tens of seconds.
                    envs.push(("KILO_TELEMETRY_LEVEL".into(), "off".into()));
                }
                (bin.to_owned(), vec!["run".into(), PROMPT.into()])
            }
            Client::Cline => {
                let providers = serde_json::json!({
                    "version": 1, "lastUsedProvider": "openai-compatible", "modes": {},
                    "providers": {"openai-compatible": {"settings": {
                        "provider": "openai-compatible", "apiKey": "scripted-offline-key",
                        "model": SCRIPTED_MODEL, "baseUrl": format!("{endpoint_base}/v1")},
                        // Cline ignores a provider entry without `updatedAt`.
                        "updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"}}});
                write(
                    home.join(".cline/data/settings/providers.json"),
                    providers.to_string(),
                )?;
                let mcp = serde_json::json!({"mcpServers": {SERVER_NAME: {
                    "type": "stdio", "command": server[0], "args": &server[1..],
                    "timeout": TOOL_TIMEOUT_SECS}}});
                let mcp_path = home.join("cline-mcp.json");
                write(mcp_path.clone(), mcp.to_string())?;
                envs.push(("CLINE_MCP_SETTINGS_PATH".into(), mcp_path.into()));
                // The local backend runs the session in this process: without it Cline starts
                // a hub daemon in a session of its own that outlives the run.
                envs.push(("CLINE_SESSION_BACKEND_MODE".into(), "local".into()));
                envs.push(("CLINE_NO_AUTO_UPDATE".into(), "1".into()));
                (bin.to_owned(), vec![PROMPT.into()])
            }
            Client::ContinueCli => {
                let config = serde_json::json!({
                    "name": "scripted", "version": "0.0.1", "schema": "v1",
                    "models": [{"name": "scripted", "provider": "openai", "model": SCRIPTED_MODEL,
                                "apiBase": format!("{endpoint_base}/v1"),
                                "apiKey": "scripted-offline-key", "roles": ["chat"]}],
                    "mcpServers": [{"name": SERVER_NAME, "command": server[0],
                                    "args": &server[1..]}],
                });
                // YAML is a superset of JSON: the JSON text is a valid config.yaml.
                let config_path = home.join("continue.yaml");
                write(config_path.clone(), config.to_string())?;
                (
                    bin.to_owned(),
                    vec![
                        "-p".into(),
                        PROMPT.into(),
                        "--config".into(),
                        config_path.into(),
                        "--auto".into(),
                    ],
                )
            }
            Client::FastAgent => {
                let config = serde_json::json!({
                    "default_model": format!("generic.{SCRIPTED_MODEL}"),
                    "generic": {"api_key": "scripted-offline-key",
                                "base_url": format!("{endpoint_base}/v1")},
                    "mcp": {"servers": {SERVER_NAME: {"command": server[0], "args": &server[1..],
                                                      "read_timeout_seconds": TOOL_TIMEOUT_SECS}}},
                    "logger": {"progress_display": false, "show_chat": false, "show_tools": false},
                });
                let config_path = work.join("fastagent.config.yaml");
                write(config_path.clone(), config.to_string())?;
                (
                    bin.to_owned(),
                    vec![
                        "go".into(),
                        "--config-path".into(),
                        config_path.into(),
                        "--servers".into(),
                        SERVER_NAME.into(),
                        "--model".into(),
                        format!("generic.{SCRIPTED_MODEL}").into(),
                        "--message".into(),
                        PROMPT.into(),
                    ],
                )
            }
            Client::OpenAiAgents => {
                // `bin` is `matrices/clients/.venv/bin/python`; the driver sits beside the venv.
                let clients = bin
                    .parent()
                    .and_then(Path::parent)
                    .and_then(Path::parent)
                    .unwrap_or(Path::new("."));
                let driver = clients.join("drivers/openai-agents-client.py");
                let mut args: Vec<OsString> = vec![
                    driver.into(),
                    format!("{endpoint_base}/v1").into(),
                    TOOL_TIMEOUT_SECS.to_string().into(),
                    PROMPT.into(),
                ];
                args.extend(server.iter().map(OsString::from));
                (bin.to_owned(), args)
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

/// The `[mcp_servers.NAME]` table of Codex's `config.toml` that starts `server` (program first)
/// over stdio. `measure` configures Codex with it, and the README's Codex snippet is this table
/// (a test compares them).
pub fn codex_server_toml(name: &str, server: &[String]) -> String {
    let args: Vec<String> = server[1..].iter().map(|a| toml_str(a)).collect();
    format!(
        "[mcp_servers.{name}]\ncommand = {}\nargs = [{}]\n",
        toml_str(&server[0]),
        args.join(", ")
    )
}

/// The `codex mcp add` command line that writes [`codex_server_toml`] into `~/.codex/config.toml`.
pub fn codex_mcp_add(name: &str, server: &[String]) -> String {
    format!("codex mcp add {name} -- {}", shell_words(server))
}

/// Claude Code's MCP config (`.mcp.json`, or a file given to `--mcp-config`) that starts `server`
/// (program first) over stdio. `measure` runs Claude Code with it, and the README's `.mcp.json`
/// snippet is this object (a test compares them).
pub fn claude_code_mcp_json(name: &str, server: &[String]) -> serde_json::Value {
    serde_json::json!({"mcpServers": {name: {
        "type": "stdio", "command": server[0], "args": &server[1..], "env": {}}}})
}

/// The `claude mcp add` command line that adds the same stdio server as [`claude_code_mcp_json`].
pub fn claude_mcp_add(name: &str, server: &[String]) -> String {
    format!(
        "claude mcp add --transport stdio {name} -- {}",
        shell_words(server)
    )
}

/// A TOML basic string (a JSON string literal is one).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// Words for a POSIX shell, single-quoted where they need it.
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first dotted version number in `text`.
pub fn parse_version(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .map(|w| w.trim_end_matches('.').trim_start_matches('v'))
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
        assert_eq!(
            parse_version("GitHub Copilot CLI 1.0.102.\nRun 'copilot update'").as_deref(),
            Some("1.0.102")
        );
        assert_eq!(
            parse_version("fast-agent-mcp v0.10.48\n").as_deref(),
            Some("0.10.48")
        );
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
