//! The command line: clap types only. [`crate::app`] turns them into each module's options, so no
//! library module depends on clap.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Trusted per-call IDs for paid MCP tool calls: measure which clients send one, route paid calls
/// by it, and check that a router tells "the same call again" from "a new call that looks the
/// same".
#[derive(Debug, Parser)]
#[command(
    name = "callid",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output formats. Each command accepts the subset it can render and says so in its help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// A table for people.
    Table,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// JSON for machines.
    Json,
    /// JUnit XML for CI systems.
    Junit,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an MCP server (or a transparent proxy) that records the shape of every request's
    /// `_meta`, never a value.
    Probe(ProbeArgs),
    /// Turn probe logs into one identity verdict per client.
    Classify(ClassifyArgs),
    /// Run a scripted client of each kind against the probe and print the verdict table.
    Demo(DemoArgs),
    /// Run the reference router, or operate on its registry (approve, deny, status, keys).
    Router(RouterArgs),
    /// Run the paid image provider: charges once per idempotency key, with a durable ledger.
    Provider(ProviderArgs),
    /// Replay the conformance scenarios against a router and report a verdict per rule.
    Conform(ConformArgs),
    /// Render or update the support matrix in `matrices/`.
    Matrix(MatrixArgs),
    /// Measure a real client program offline against the probe and print its matrix row.
    Measure(MeasureArgs),
    /// Run the end-to-end benchmarks, each figure beside its baseline.
    Bench(BenchArgs),
}

/// `callid probe`
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Serve streamable HTTP on this loopback address instead of stdio (e.g. 127.0.0.1:8765).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Append one JSON line per request to this file (shapes only).
    #[arg(long, value_name = "FILE", env = "CALLID_PROBE_LOG")]
    pub log: Option<PathBuf>,
    /// Key the digests with this secret (HMAC-SHA-256) so low-entropy values cannot be looked up.
    #[arg(
        long,
        value_name = "SALT",
        env = "CALLID_DIGEST_SALT",
        hide_env_values = true
    )]
    pub digest_salt: Option<String>,
    /// Proxy stdio to the MCP server command given after `--`, forwarding every byte unchanged,
    /// and record shapes: `callid probe --wrap -- CMD ARGS...`.
    #[arg(long, requires = "command", conflicts_with = "http")]
    pub wrap: bool,
    /// The server command `--wrap` runs (after `--`).
    #[arg(last = true, value_name = "CMD", requires = "wrap")]
    pub command: Vec<String>,
}

/// `callid classify`
#[derive(Debug, Args)]
pub struct ClassifyArgs {
    /// Probe log files (JSON lines).
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Output format: table, markdown or json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
}

/// `callid demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Output format: table, markdown or json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
}

/// `callid router`
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct RouterArgs {
    /// Operator commands; without one, the router serves MCP.
    #[command(subcommand)]
    pub command: Option<RouterCommand>,
    /// Serving options.
    #[command(flatten)]
    pub serve: RouterServeArgs,
}

/// Where the router keeps its state; shared by serving and every operator command.
#[derive(Debug, Clone, Args)]
pub struct RegistryArg {
    /// The router's SQLite registry (default: `callid/registry.sqlite3` under the user's data
    /// directory). The backend layers' state files live beside it.
    #[arg(long, value_name = "FILE", env = "CALLID_REGISTRY")]
    pub registry: Option<PathBuf>,
}

/// `callid router` serving options.
#[derive(Debug, Clone, Args)]
pub struct RouterServeArgs {
    /// Registry location.
    #[command(flatten)]
    pub registry: RegistryArg,
    /// Serve streamable HTTP on this loopback address instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Base URL of the paid provider (e.g. http://127.0.0.1:9000). Without it, the provider runs
    /// in-process with its ledger beside the registry.
    #[arg(long, value_name = "URL", env = "CALLID_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// An approval policy file (YAML); flags below override its fields.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Spends above this many cents need a person's approval.
    #[arg(long, value_name = "CENTS")]
    pub approval_above_cents: Option<u64>,
    /// Spends with this model need a person's approval (repeatable).
    #[arg(long = "approval-model", value_name = "MODEL")]
    pub approval_models: Vec<String>,
    /// Budget of the account, in cents; a spend over what is left is refused.
    #[arg(long, value_name = "CENTS")]
    pub budget_cents: Option<u64>,
    /// Claim keys from this preallocated-key database instead of generating them.
    #[arg(long, value_name = "FILE")]
    pub preallocated_keys: Option<PathBuf>,
    /// Prefix of private operation keys.
    #[arg(long, value_name = "PREFIX", default_value = crate::keys::DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
    /// Prefix of public handles.
    #[arg(long, value_name = "PREFIX", default_value = crate::keys::DEFAULT_HANDLE_PREFIX)]
    pub handle_prefix: String,
    /// Append the probe's shape record of each call's `_meta` to this file (opt-in; never values).
    #[arg(long, value_name = "FILE")]
    pub diagnose_meta: Option<PathBuf>,
}

/// Operator commands of the router. None of them is reachable by the model.
#[derive(Debug, Subcommand)]
pub enum RouterCommand {
    /// Approve an operation waiting for a person, by public handle.
    Approve {
        /// The public handle the agent was given.
        handle: String,
        /// Registry location.
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Deny an operation waiting for a person, by public handle.
    Deny {
        /// The public handle the agent was given.
        handle: String,
        /// Why (recorded, and shown to the agent).
        #[arg(long)]
        reason: Option<String>,
        /// Registry location.
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Show an operation by public handle.
    Status {
        /// The public handle.
        handle: String,
        /// Registry location.
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Create or fill a preallocated-key database.
    Keys {
        /// The key database to create or add to.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// How many keys to add.
        #[arg(long, default_value_t = 100)]
        count: u32,
        /// Prefix of the keys (the platform `codex` and a UUID follow).
        #[arg(long, default_value = crate::keys::DEFAULT_KEY_PREFIX)]
        prefix: String,
    },
}

/// `callid provider`
#[derive(Debug, Args)]
pub struct ProviderArgs {
    /// Loopback address to listen on (port 0 picks one; the chosen address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The durable ledger (SQLite).
    #[arg(long, value_name = "FILE")]
    pub ledger: PathBuf,
}

/// `callid conform`
#[derive(Debug, Args)]
pub struct ConformArgs {
    /// A target profile (YAML) saying how to start and drive the router.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["stdio", "url"])]
    pub target: Option<PathBuf>,
    /// A router started as this command over stdio (the reference router's profile otherwise).
    #[arg(long, value_name = "'CMD ARGS'", conflicts_with = "url")]
    pub stdio: Option<String>,
    /// A router already running at this streamable HTTP URL.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Directory of scenario files.
    #[arg(long, value_name = "DIR", default_value = "scenarios")]
    pub scenarios: PathBuf,
    /// Run only these check ids (repeatable).
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub only: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
    /// Write the report here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Check ids expected to fail (one per line, `#` comments); a listed check that passes fails
    /// as stale.
    #[arg(long, value_name = "FILE")]
    pub expected_failures: Option<PathBuf>,
}

/// `callid matrix`
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// What to do with the matrix.
    #[command(subcommand)]
    pub command: MatrixCommand,
}

/// Matrix subcommands.
#[derive(Debug, Subcommand)]
pub enum MatrixCommand {
    /// Write `matrices/SUPPORT.md` from the data in `matrices/`.
    Render {
        /// Exit 1 if the committed file differs from what the data renders; write nothing.
        #[arg(long)]
        check: bool,
        /// The matrix directory.
        #[arg(long, value_name = "DIR", default_value = "matrices")]
        dir: PathBuf,
    },
    /// Turn probe logs into rows of `matrices/clients.yaml`, and `callid conform --format json`
    /// reports into rows of `matrices/routers.yaml`.
    Add {
        /// Probe log files or conformance reports.
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        /// The matrix directory.
        #[arg(long, value_name = "DIR", default_value = "matrices")]
        dir: PathBuf,
    },
}

/// Clients `measure` knows how to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientArg {
    /// OpenAI Codex CLI (`codex exec`).
    Codex,
    /// Anthropic Claude Code (`claude -p`).
    ClaudeCode,
    /// Google Gemini CLI (`gemini -p`).
    GeminiCli,
    /// GitHub Copilot CLI (`copilot -p`).
    CopilotCli,
    /// Qwen Code (`qwen -p`).
    QwenCode,
    /// OpenCode (`opencode run`).
    Opencode,
    /// Kilo Code CLI (`kilo run`).
    KiloCode,
    /// Cline CLI (`cline PROMPT`).
    Cline,
    /// Continue CLI (`cn -p`).
    ContinueCli,
    /// fast-agent (`fast-agent go`, PyPI `fast-agent-mcp`).
    FastAgent,
    /// The OpenAI Agents SDK (PyPI `openai-agents`), one agent run by a driver.
    OpenaiAgents,
    /// MCP Inspector's CLI (`mcp-inspector --cli`), no model.
    InspectorCli,
    /// The MCP TypeScript SDK's client, no model.
    TsSdk,
    /// The MCP Python SDK's client, no model.
    PythonSdk,
    /// rmcp's client, no model.
    Rmcp,
}

/// `callid measure`
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The client program to measure.
    #[arg(long, value_enum)]
    pub client: ClientArg,
    /// Path of the agent client's binary (default: `DIR/clients/node_modules/.bin`, then PATH).
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Write the row to `matrices/clients.yaml` and the evidence files, and render SUPPORT.md.
    #[arg(long, conflicts_with = "check")]
    pub update: bool,
    /// Exit 1 if the measured row differs from the committed one (CI); write nothing.
    #[arg(long)]
    pub check: bool,
    /// The matrix directory.
    #[arg(long, value_name = "DIR", default_value = "matrices")]
    pub dir: PathBuf,
}

/// `callid bench`
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A smoke run that finishes in under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Output format: table, markdown or json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
    /// Run only these rows (repeatable): probe_round_trip, probe_throughput, shape_extraction,
    /// request_hash, router_new_operation, router_concurrent, router_replay, conform_suite,
    /// probe_rss, router_rss.
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub only: Vec<String>,
    /// The Python that runs the `mcp` SDK probe baseline (default: `target/bench-venv` under the
    /// current directory, then `python3`).
    #[arg(long, value_name = "PATH", env = "CALLID_BENCH_PYTHON")]
    pub python: Option<PathBuf>,
    /// Serve the bare rmcp baseline server on stdio (started by `callid bench` itself).
    #[arg(long, hide = true, conflicts_with_all = ["quick", "only", "python"])]
    pub serve_baseline: bool,
}
