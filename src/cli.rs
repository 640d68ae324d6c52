//! The command line: clap types only. [`crate::app`] turns them into each module's options, so no
//! library module depends on clap.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

mod suggest;
pub use suggest::try_parse_from;

/// Parses the process's command line into a [`Cli`], or prints clap's error (with callid's tips,
/// see [`try_parse_from`]) and exits.
pub fn parse() -> Cli {
    try_parse_from(std::env::args_os()).unwrap_or_else(|err| err.exit())
}

/// Trusted per-call IDs for paid MCP tool calls: measure which clients send one, route paid calls
/// by it, and check that a router tells "the same call again" from "a new call that looks the
/// same".
#[derive(Debug, Parser)]
#[command(
    name = "callid",
    version = VERSION,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `callid --version`: the crate version, and the git commit when built from a checkout
/// (`0.1.0 (commit 0123456789ab)`; see `build.rs`).
pub const VERSION: &str = env!("CALLID_VERSION");

/// `--format` of `callid conform`: every renderer of the conformance report.
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

impl From<FormatArg> for crate::conform::report::Format {
    fn from(arg: FormatArg) -> Self {
        use crate::conform::report::Format;
        match arg {
            FormatArg::Table => Format::Table,
            FormatArg::Markdown => Format::Markdown,
            FormatArg::Json => Format::Json,
            FormatArg::Junit => Format::Junit,
        }
    }
}

/// `--format` of `callid classify`, `demo` and `bench`: they have no JUnit renderer, so clap
/// refuses `junit` and their help lists only what they print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlainFormatArg {
    /// A table for people.
    Table,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// JSON for machines.
    Json,
}

impl From<PlainFormatArg> for crate::classify::Format {
    fn from(arg: PlainFormatArg) -> Self {
        match arg {
            PlainFormatArg::Table => crate::classify::Format::Table,
            PlainFormatArg::Markdown => crate::classify::Format::Markdown,
            PlainFormatArg::Json => crate::classify::Format::Json,
        }
    }
}

/// `--format` of `callid identity-sources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourcesFormatArg {
    /// A table for people.
    Table,
    /// JSON for machines.
    Json,
}

/// `--print-profile` of `callid conform`: which shipped profile it prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileArg {
    /// The reference router's, its comment listing every name a profile may map (the default).
    Router,
    /// `callid gateway` in front of the runner's upstream MCP server (`backend: upstream`); its
    /// spend policy is `gateway-policy.yaml` beside the profile.
    Gateway,
}

impl From<ProfileArg> for crate::conform::target::Shipped {
    fn from(arg: ProfileArg) -> Self {
        use crate::conform::target::Shipped;
        match arg {
            ProfileArg::Router => Shipped::Router,
            ProfileArg::Gateway => Shipped::Gateway,
        }
    }
}

/// Shells `callid completions` writes a completion script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    /// Bash: `callid completions bash > ~/.local/share/bash-completion/completions/callid`.
    Bash,
    /// Zsh: `callid completions zsh > "${fpath[1]}/_callid"`.
    Zsh,
    /// Fish: `callid completions fish > ~/.config/fish/completions/callid.fish`.
    Fish,
    /// PowerShell: `callid completions powershell >> $PROFILE`.
    Powershell,
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
    /// Run the reference router, or operate on its registry (approve, deny, resolve, status,
    /// keys).
    Router(RouterArgs),
    /// Run the paid image provider: charges once per idempotency key, with a durable ledger.
    Provider(ProviderArgs),
    /// Put the router's pipeline in front of a paid MCP server: `callid gateway --registry FILE
    /// --spend TOOL -- CMD ARGS...`.
    Gateway(GatewayArgs),
    /// Replay the conformance scenarios against a router and report a verdict per rule.
    Conform(ConformArgs),
    /// Render or update the support matrix in `matrices/`.
    Matrix(MatrixArgs),
    /// Measure a real client program offline against the probe and print its matrix row.
    Measure(MeasureArgs),
    /// Run the end-to-end benchmarks, each figure beside its baseline.
    #[cfg(feature = "bench")]
    Bench(BenchArgs),
    /// Print a shell completion script for `callid` to standard output.
    Completions(CompletionsArgs),
    /// Print the identity sources accepted: the built-in table, extended by `--identity-sources`.
    IdentitySources(IdentitySourcesArgs),
    /// Signed platform-invocation envelopes: generate a key, sign an envelope, verify one.
    #[command(subcommand)]
    Envelope(EnvelopeCommand),
    /// (internal) The stdio form of `callid conform`'s upstream MCP role: bridges stdin/stdout to
    /// the runner's upstream at URL. The runner hands it to routers as `{upstream_argv}`.
    #[command(name = "conform-upstream-relay", hide = true)]
    ConformUpstreamRelay {
        /// The runner's upstream endpoint (`http://127.0.0.1:PORT/mcp`).
        url: String,
    },
}

/// `callid completions`
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: ShellArg,
}

/// `--identity-sources`, shared by probe, classify and router.
#[derive(Debug, Clone, Default, Args)]
pub struct IdentitySourcesArg {
    /// Also accept the sources of this YAML table (repeatable; e.g. the goose preset, written by
    /// `callid identity-sources --print-preset goose > goose.yaml`). A key is only as trustworthy
    /// as the harness that sets it: see `callid identity-sources` and the README.
    #[arg(long = "identity-sources", value_name = "FILE")]
    pub identity_sources: Vec<PathBuf>,
}

/// `--trust-keys` and `--unsigned-harness-ids`, shared by router and gateway.
#[derive(Debug, Clone, Default, Args)]
pub struct TrustArg {
    /// Verify signed `hubu.dev/platform-invocation` envelopes with the keys of this YAML file
    /// (key ids, Ed25519 public keys or 0600 HMAC secret files, the platforms each key may sign
    /// for, the allowed clock skew): an envelope unsigned, forged, expired, not yet valid, or
    /// signed by an unknown key or one not allowed for its platform is refused before anything is
    /// recorded. Keys come from `callid envelope keygen`.
    #[arg(long = "trust-keys", value_name = "FILE")]
    pub trust_keys: Option<PathBuf>,
    /// With `--trust-keys`: whether harness identities (`callId`, `claudecode/toolUseId`,
    /// `--identity-sources` keys), which cannot be signed, are still accepted. Default: `refuse`
    /// with `--http` (anyone who reaches the listener writes `_meta`), `accept` on stdio (the
    /// harness started this process and owns its input).
    #[arg(
        long = "unsigned-harness-ids",
        value_name = "POLICY",
        value_enum,
        requires = "trust_keys"
    )]
    pub unsigned_harness_ids: Option<HarnessIdsArg>,
}

/// `--unsigned-harness-ids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HarnessIdsArg {
    /// Accept harness identities unsigned.
    Accept,
    /// Refuse them with `unsigned_identity`.
    Refuse,
}

/// A signing algorithm of `callid envelope keygen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgArg {
    /// Ed25519: the platform keeps the private key, routers get the public one.
    Ed25519,
    /// HMAC-SHA-256: one shared secret, for a single operator who runs both ends.
    Hs256,
}

/// `callid envelope`
#[derive(Debug, Subcommand)]
pub enum EnvelopeCommand {
    /// Generate a signing key into a new file (mode 0600, never overwritten) and print the
    /// trust-file entry that verifies it (the public key; never the private key or secret).
    Keygen {
        /// Key id, written in every signature's header and the trust file.
        #[arg(long, value_name = "ID")]
        kid: String,
        /// The new private key file.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Algorithm.
        #[arg(long, value_enum, default_value = "ed25519")]
        alg: AlgArg,
        /// A platform this key signs for, in the printed entry (repeatable).
        #[arg(long = "platform", value_name = "NAME", required = true)]
        platforms: Vec<String>,
    },
    /// Sign an envelope and print the `_meta` object to send: the envelope and its signature.
    Sign {
        /// The private key file (`callid envelope keygen`; mode 0600).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The key id the trust file lists it under.
        #[arg(long, value_name = "ID")]
        kid: String,
        /// The envelope, as JSON: `{"platform": ..., "invocation_id": ..., "installation_id"?,
        /// "task_id"?}`.
        #[arg(long, value_name = "JSON")]
        envelope: String,
        /// Seconds the signature stays valid.
        #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=86_400))]
        ttl: u32,
    },
    /// Check a request's `_meta` as a router with these trust keys would: prints `valid` (exit
    /// 0) or the refusal's code and the rule that failed (exit 1).
    Verify {
        /// The trust file.
        #[arg(long = "trust-keys", value_name = "FILE")]
        trust_keys: PathBuf,
        /// The `_meta` object as JSON, or `-` to read it from standard input.
        #[arg(long, value_name = "JSON|-")]
        meta: String,
        /// Whether harness identities are accepted unsigned (default: accept).
        #[arg(
            long = "unsigned-harness-ids",
            value_name = "POLICY",
            value_enum,
            default_value = "accept"
        )]
        unsigned_harness_ids: HarnessIdsArg,
    },
}

/// `callid identity-sources`
#[derive(Debug, Args)]
pub struct IdentitySourcesArgs {
    /// Tables to add to the built-in one.
    #[command(flatten)]
    pub sources: IdentitySourcesArg,
    /// Output format: table or json.
    #[arg(long, value_enum, default_value = "table")]
    pub format: SourcesFormatArg,
    /// Print the YAML table of a preset that ships with callid (off until passed to
    /// `--identity-sources`), and exit.
    #[arg(
        long,
        value_name = "NAME",
        value_parser = clap::builder::PossibleValuesParser::new(
            crate::identity::PRESETS.iter().map(|(name, _)| *name)
        ),
        conflicts_with = "format"
    )]
    pub print_preset: Option<String>,
}

/// `callid probe`
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Serve streamable HTTP on this loopback address instead of stdio (e.g. 127.0.0.1:8765,
    /// localhost:8765).
    #[arg(long, value_name = "ADDR", value_parser = crate::http_guard::parse_listen_addr)]
    pub http: Option<SocketAddr>,
    /// With `--http`: also answer browser requests from this origin (repeatable; e.g.
    /// `https://app.example.com`). Other `Origin`s are refused with 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    pub allow_origins: Vec<String>,
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
    /// Speak only the `initialize` lifecycle (MCP 2025-11-25 and earlier): answer
    /// `server/discover` with -32601 so clients that try MCP 2026-07-28 first fall back.
    #[arg(long, conflicts_with = "wrap")]
    pub legacy_handshake: bool,
    /// Proxy stdio to the MCP server command given after `--`, forwarding every byte unchanged,
    /// and record shapes: `callid probe --wrap -- CMD ARGS...`.
    #[arg(long, requires = "command", conflicts_with = "http")]
    pub wrap: bool,
    /// The server command `--wrap` runs (after `--`).
    #[arg(last = true, value_name = "CMD", requires = "wrap")]
    pub command: Vec<String>,
    /// Identity sources beyond the built-in table.
    #[command(flatten)]
    pub sources: IdentitySourcesArg,
}

/// `callid classify`
#[derive(Debug, Args)]
pub struct ClassifyArgs {
    /// Probe log files (JSON lines); `-` reads standard input.
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: PlainFormatArg,
    /// Identity sources beyond the built-in table (re-judged from each call's `_meta` shape).
    #[command(flatten)]
    pub sources: IdentitySourcesArg,
}

/// `callid demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: PlainFormatArg,
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

/// How long a dispatch lease lasts unless renewed (router and gateway).
#[derive(Debug, Clone, Args)]
pub struct LeaseArg {
    /// Seconds a dispatch lease holds other processes sharing the registry off an operation
    /// unless renewed (decimals allowed). A live dispatcher renews it every third of that
    /// while the backend works, so any call length is safe; it matters only when a process
    /// dies, hangs, is paused or loses the registry, and is how long the others wait before
    /// taking over a dispatched operation.
    #[arg(long = "lease-ttl", value_name = "SECS", default_value = "10", value_parser = parse_lease_ttl)]
    pub ttl: std::time::Duration,
}

/// `--lease-ttl`: positive seconds, at most a day.
fn parse_lease_ttl(text: &str) -> Result<std::time::Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.05..=86_400.0).contains(&s) => {
            Ok(std::time::Duration::from_secs_f64(s))
        }
        _ => Err(format!(
            "`{text}` is not a lease lifetime: give seconds from 0.05 to 86400, e.g. 120 or 1.5"
        )),
    }
}

/// Where the router keeps its state; shared by serving and every operator command.
#[derive(Debug, Clone, Args)]
pub struct RegistryArg {
    /// The router's registry: a SQLite file (default: `callid/registry.sqlite3` under the
    /// user's data directory; the backend layers' state files live beside it), or
    /// `postgres://USER@HOST:PORT/DATABASE` shared by router replicas (password redacted
    /// wherever shown; TLS as libpq's `sslmode`, e.g. `?sslmode=verify-full&sslrootcert=CA.pem`).
    #[arg(
        long,
        value_name = "FILE|URL",
        env = "CALLID_REGISTRY",
        hide_env_values = true
    )]
    pub registry: Option<PathBuf>,
}

/// `callid router` serving options.
#[derive(Debug, Clone, Args)]
pub struct RouterServeArgs {
    /// Registry location.
    #[command(flatten)]
    pub registry: RegistryArg,
    /// Serve streamable HTTP on this loopback address instead of stdio (e.g. 127.0.0.1:8766,
    /// localhost:8766).
    #[arg(long, value_name = "ADDR", value_parser = crate::http_guard::parse_listen_addr)]
    pub http: Option<SocketAddr>,
    /// With `--http`: also answer browser requests from this origin (repeatable; e.g.
    /// `https://app.example.com`). Other `Origin`s are refused with 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    pub allow_origins: Vec<String>,
    /// Base URL of the paid provider (e.g. http://127.0.0.1:9000). Without it, the provider runs
    /// in-process with its ledger beside the registry. Its password and query values are
    /// redacted wherever the URL is shown.
    #[arg(
        long,
        value_name = "URL",
        env = "CALLID_PROVIDER_URL",
        hide_env_values = true
    )]
    pub provider_url: Option<String>,
    /// A file whose one line is the provider's token, sent as `Authorization: Bearer`
    /// (or set CALLID_PROVIDER_TOKEN; never on the command line).
    #[arg(long, value_name = "FILE", requires = "provider_url")]
    pub provider_token_file: Option<PathBuf>,
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
    /// Identity sources beyond the built-in table.
    #[command(flatten)]
    pub sources: IdentitySourcesArg,
    /// Lease.
    #[command(flatten)]
    pub lease: LeaseArg,
    /// Signed envelopes.
    #[command(flatten)]
    pub trust: TrustArg,
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
    /// Record what a person found for an operation in doubt (sent to a backend that ignores
    /// idempotency keys, outcome unknown): `--charged` (redeliveries then answer `--result`, or
    /// a stated "charged, result unknown") or `--not-charged` (the next redelivery sends it once
    /// more). Recorded with who and when.
    #[command(group(clap::ArgGroup::new("outcome").required(true).args(["charged", "not_charged"])))]
    Resolve {
        /// The public handle the agent was given.
        handle: String,
        /// The backend charged it.
        #[arg(long)]
        charged: bool,
        /// The backend did not charge it (nothing happened there).
        #[arg(long = "not-charged")]
        not_charged: bool,
        /// With `--charged`: the backend's result, as the `CallToolResult` JSON the agent should
        /// be answered (`{"content": [...]}`), read from this file (`-` for standard input).
        // Not `requires = "charged"`: a flag always has a value (false), so that holds anyway.
        #[arg(long, value_name = "FILE", conflicts_with = "not_charged")]
        result: Option<PathBuf>,
        /// Who checked (recorded; default: the `USER` environment variable).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
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
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:0",
        value_parser = crate::http_guard::parse_listen_addr
    )]
    pub listen: SocketAddr,
    /// The durable ledger (SQLite).
    #[arg(long, value_name = "FILE")]
    pub ledger: PathBuf,
    /// Require `Authorization: Bearer TOKEN` on every request, TOKEN being this file's one line
    /// (or set CALLID_PROVIDER_TOKEN; never on the command line); others get 401.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also answer browser requests from this origin (repeatable). Other `Origin`s get 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Serve MCP over stdio instead of HTTP: a paid `generate_image` tool charged once per
    /// `_meta["callid/idempotency-key"]`, and a free `list_charges` (the upstream `callid
    /// gateway` is put in front of).
    #[arg(long, conflicts_with_all = ["token_file", "allow_origins"])]
    pub mcp: bool,
}

/// `callid gateway`
#[derive(Debug, Args)]
#[command(
    after_help = "The contract: a spend tool whose upstream ignores idempotency keys (the \
default, and most real paid servers) is sent at most once; when its outcome is unknown (timeout, \
crash, lost connection) the operation is `in_doubt` and is never sent again. A tool declared \
idempotent (`--idempotent TOOL`, or `idempotent: true` in the policy) is re-sent under the same \
idempotency key on redelivery instead. An in-doubt operation waits for a person: check the \
upstream, then `callid router resolve HANDLE --charged [--result FILE]` or `--not-charged`, with \
`--registry` set to this gateway's registry."
)]
pub struct GatewayArgs {
    /// The gateway's registry: a SQLite file, created if missing, or
    /// `postgres://USER@HOST:PORT/DATABASE` shared by gateway replicas (password redacted
    /// wherever shown; TLS as libpq's `sslmode`, e.g. `?sslmode=verify-full&sslrootcert=CA.pem`).
    #[arg(
        long,
        value_name = "FILE|URL",
        env = "CALLID_REGISTRY",
        hide_env_values = true
    )]
    pub registry: PathBuf,
    /// A tool of the upstream that spends money: its calls go through the whole pipeline
    /// (repeatable).
    #[arg(
        long = "spend",
        value_name = "TOOL",
        required_unless_present = "policy"
    )]
    pub spend: Vec<String>,
    /// Prices per tool (fixed or read from the arguments), approvals and budget (YAML); every
    /// tool it lists spends.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Connect to an upstream MCP server over streamable HTTP at this URL instead of starting
    /// one (e.g. http://127.0.0.1:9000/mcp).
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub upstream_url: Option<String>,
    /// Seconds to wait for an upstream answer before the call's outcome is unknown: the
    /// operation is then in doubt (never sent again until `callid router resolve`), or, for a
    /// tool declared idempotent, stays open and a redelivery re-sends it under the same key.
    #[arg(long, value_name = "SECS", default_value_t = 100)]
    pub upstream_timeout: u64,
    /// Seconds to wait for the upstream's answer to a request passed through (a tool that does
    /// not spend, resources, prompts, completions) before the agent gets a JSON-RPC error
    /// (-32001) and the upstream a cancellation. Its own limit, apart from `--upstream-timeout`,
    /// which also decides when a spend is in doubt.
    #[arg(long, value_name = "SECS", default_value_t = 100)]
    pub passthrough_timeout: u64,
    /// A spend tool whose upstream honours `_meta["callid/idempotency-key"]`, returning the first
    /// result for a repeated key (repeatable; also `idempotent: true` in the policy). Without
    /// it a spend tool is dispatched at most once: most paid servers ignore the key.
    #[arg(long = "idempotent", value_name = "TOOL")]
    pub idempotent: Vec<String>,
    /// Lease.
    #[command(flatten)]
    pub lease: LeaseArg,
    /// The longest message (one line) read from an upstream started with `-- CMD`, in bytes:
    /// a longer answer fails its call at once, naming its size (the upstream ran the call and
    /// may have charged for it). The default is rmcp's own, 16 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = crate::gateway::DEFAULT_MAX_MESSAGE_BYTES)]
    pub upstream_max_message_bytes: usize,
    /// Serve the agent over streamable HTTP on this loopback address instead of stdio (e.g.
    /// 127.0.0.1:8766; port 0 picks one, printed on stderr).
    #[arg(long, value_name = "ADDR", value_parser = crate::http_guard::parse_listen_addr)]
    pub http: Option<SocketAddr>,
    /// With `--http`: also answer browser requests from this origin (repeatable).
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    pub allow_origins: Vec<String>,
    /// Identity sources beyond the built-in table (see `callid identity-sources`).
    #[command(flatten)]
    pub sources: IdentitySourcesArg,
    /// Signed envelopes.
    #[command(flatten)]
    pub trust: TrustArg,
    /// Vouch for each spend to the upstream: sign, with this private key (`callid envelope
    /// keygen`), an envelope of the operation (its idempotency key as `invocation_id`) and the
    /// agent identity this gateway verified (`_meta["callid/vouched-for"]`), for an upstream that
    /// verifies envelopes (`--trust-keys`, or the Guard API).
    #[arg(long, value_name = "FILE", requires_all = ["vouch_kid", "vouch_platform"])]
    pub vouch_key: Option<PathBuf>,
    /// With `--vouch-key`: its key id in the upstream's trust file.
    #[arg(long, value_name = "ID", requires = "vouch_key")]
    pub vouch_kid: Option<String>,
    /// With `--vouch-key`: the platform the gateway's envelopes name (listed for its key in the
    /// upstream's trust file).
    #[arg(long, value_name = "NAME", requires = "vouch_key")]
    pub vouch_platform: Option<String>,
    /// The upstream MCP server to start, after `--`: `-- CMD ARGS...`.
    #[arg(
        last = true,
        value_name = "CMD",
        required_unless_present = "upstream_url"
    )]
    pub command: Vec<String>,
}

/// `callid conform`
#[derive(Debug, Args)]
#[command(
    after_help = "The router contract, what a router must do to be judged (required: the \
article's rules; recommended: callid's conventions), is ROUTER-CONTRACT.md in callid's \
repository, and `callid conform --contract` prints it. Start a profile for your router with \
`callid conform --print-profile > router.yaml`; list the checks with `--list`. A gateway or an \
MCP-native router spends through the runner's upstream MCP server instead of its HTTP provider: \
`backend: upstream` in the profile (`callid conform --print-profile gateway` prints the one of \
callid's gateway)."
)]
pub struct ConformArgs {
    /// A target profile (YAML) saying how to start and drive the router
    /// (`--print-profile` writes a commented template).
    #[arg(long, value_name = "FILE", conflicts_with = "stdio")]
    pub target: Option<PathBuf>,
    /// A router started as this command over stdio, driven like the reference router: the
    /// runner appends `--registry FILE --provider-url URL --approval-above-cents 10`, and runs
    /// `CMD ARGS approve|deny HANDLE --registry FILE` as the operator commands.
    #[arg(long, value_name = "'CMD ARGS'", conflicts_with = "url")]
    pub stdio: Option<String>,
    /// A router already running at this streamable HTTP URL. Alone, it is driven with the
    /// reference router's names: the tools `generate_image`, `operation_status` and
    /// `resume_operation`, its argument sets, result pointers, statuses and the contract's error
    /// codes (`--print-profile` shows them all). With `--target FILE`, the profile's names are
    /// used and URL replaces its `url` (its `command` and `setup` are not run). The runner does
    /// not start the router, and sees its charges only through the profile's `provider_listen`,
    /// so most checks are not run and the run exits 1 unless `--allow-incomplete`.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Directory of scenario files added to the built-in ones (a file with a built-in check's id
    /// replaces it).
    #[arg(long, value_name = "DIR")]
    pub scenarios: Option<PathBuf>,
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
    /// Write the required checks that failed in this run to FILE as an expected-failures
    /// baseline (for `--expected-failures`); the run's exit code is unchanged.
    #[arg(long, value_name = "FILE")]
    pub write_expected_failures: Option<PathBuf>,
    /// Checks that could not be run (not skipped by the profile) do not fail the run.
    #[arg(long)]
    pub allow_incomplete: bool,
    /// Print every check id with the rule it cites, and exit.
    #[arg(long, conflicts_with_all = ["target", "stdio", "url", "print_profile"])]
    pub list: bool,
    /// Print a shipped profile as a commented template for a new target, and exit: the reference
    /// router's (the default), or `gateway` for `callid gateway` in front of the runner's
    /// upstream.
    #[arg(
        long,
        value_enum,
        value_name = "TARGET",
        num_args = 0..=1,
        default_missing_value = "router",
        conflicts_with_all = ["target", "stdio", "url", "contract"]
    )]
    pub print_profile: Option<ProfileArg>,
    /// Print the router contract (ROUTER-CONTRACT.md), and exit.
    #[arg(long, conflicts_with_all = ["target", "stdio", "url", "list"])]
    pub contract: bool,
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
    /// List the measured rows whose client has a newer version in its package registry.
    ///
    /// Asks npm (`npm view PKG version`), PyPI (its JSON API, through `python3`; set
    /// `CALLID_PYPI_URL` for a mirror) and crates.io (`cargo info`) for the latest version of
    /// each measured client. Exit 0 when every row is current, 1 when one is older than the
    /// latest (measure it again with the command shown), 2 when a registry cannot be reached.
    Outdated {
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
    /// Measure this binary of the agent client instead of the one in
    /// `DIR/clients/node_modules/.bin` (or the venv `DIR/clients/.venv`), else on PATH.
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Write the row to `matrices/clients.yaml` and the evidence files, and render SUPPORT.md.
    #[arg(long, conflicts_with = "check")]
    pub update: bool,
    /// Exit 1 if the measured row differs from the committed one (CI); write nothing.
    #[arg(long)]
    pub check: bool,
    /// Keep the evidence: write the probe logs (`DIR/evidence/*.jsonl`) and the row
    /// (`DIR/row.yaml`) into DIR, created if missing. Needs no matrix directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The matrix directory.
    #[arg(long, value_name = "DIR", default_value = "matrices")]
    pub dir: PathBuf,
}

/// `callid bench`
#[cfg(feature = "bench")]
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A smoke run that finishes in under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: PlainFormatArg,
    /// Run only these rows (repeatable): probe_round_trip, probe_throughput, shape_extraction,
    /// request_hash, router_new_operation, router_concurrent, router_replay, conform_suite,
    /// probe_rss, router_rss, postgres_new_operation, postgres_replicas, postgres_network
    /// (PostgreSQL: a throwaway cluster, or the database of `CALLID_BENCH_POSTGRES_URL`).
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub only: Vec<String>,
    /// The Python that runs the `mcp` SDK probe baseline (default: `matrices/clients/.venv` of
    /// the checkout, then `target/bench-venv`, then `python3`; when none has the SDK, callid bench
    /// makes `matrices/clients/.venv` from the pinned requirements if PyPI answers).
    #[arg(long, value_name = "PATH", env = "CALLID_BENCH_PYTHON")]
    pub python: Option<PathBuf>,
    /// Serve the bare rmcp baseline server on stdio (started by `callid bench` itself).
    #[arg(long, hide = true, conflicts_with_all = ["quick", "only", "python"])]
    pub serve_baseline: bool,
}
