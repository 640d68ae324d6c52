//! Runs one command and is the one place that turns errors into messages and exit codes.
//!
//! Commands return `Ok(code)`: [`exit_codes::SUCCESS`], or [`exit_codes::CHECK_FAILED`] when they
//! ran and found a failing check. Any `Err` is a usage or setup error: it is printed once with its
//! whole cause chain ([`crate::error_chain::format`]) and exits with [`exit_codes::SETUP_ERROR`].
//!
//! A closed standard output (`callid conform | head -1`) is not an error: every command writes its
//! result through [`stdout`], which stops writing once the reader has gone and lets the command
//! finish, so the exit code is still decided by the result (a failed check exits 1 whether or not
//! anyone read the report).

use crate::cli::{Cli, Command};
use crate::exit_codes;
use anyhow::Context as _;
use std::process::ExitCode;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    crate::logging::init();
    match cli.command {
        Command::Probe(args) => run_probe(args),
        Command::Classify(args) => run_classify(args),
        Command::Demo(args) => run_demo(args),
        Command::Router(args) => run_router(args),
        Command::Provider(args) => run_provider(args),
        Command::Gateway(args) => run_gateway(args),
        Command::Conform(args) => conform(args),
        Command::Matrix(args) => matrix_command(args),
        Command::Measure(args) => measure_command(args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench(args),
        Command::IdentitySources(args) => identity_sources_command(args),
        Command::Envelope(command) => envelope_command(command),
        Command::Completions(args) => completions(args),
        Command::ConformUpstreamRelay { url } => conform_upstream_relay(&url),
    }
}

/// `callid conform-upstream-relay URL` (hidden): see [`crate::conform::upstream::relay`].
fn conform_upstream_relay(url: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let relayed = runtime.block_on(crate::conform::upstream::relay(url));
    // The blocking read of stdin would otherwise hold the process open after an error.
    runtime.shutdown_background();
    relayed?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// `callid completions SHELL`: the completion script, generated from the same clap definition
/// the binary parses with.
fn completions(args: crate::cli::CompletionsArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::ShellArg;
    use clap::CommandFactory as _;
    use clap_complete::Shell;
    let shell = match args.shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
        ShellArg::Powershell => Shell::PowerShell,
    };
    let mut command = Cli::command();
    let mut out = stdout();
    clap_complete::generate(shell, &mut command, "callid", &mut out);
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// Standard output for a command's result. Once the reader has gone (`EPIPE`), further writes
/// are dropped and reported as done, so the command runs to its end and its exit code still says
/// how the checks went; output to a file or a live reader is written as usual.
pub(crate) struct Stdout {
    inner: std::io::StdoutLock<'static>,
    closed: bool,
}

/// The process's standard output, quiet after a broken pipe (see [`Stdout`]).
pub(crate) fn stdout() -> Stdout {
    Stdout {
        inner: std::io::stdout().lock(),
        closed: false,
    }
}

impl Stdout {
    fn quiet(&mut self, result: std::io::Result<()>) -> std::io::Result<()> {
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let result = self.inner.flush();
        self.quiet(result)
    }
}

/// One line on stderr when a stdio MCP server was started from a terminal: it says the process is
/// waiting for an MCP client on standard input (not hung) and where its state goes. Nothing when
/// standard input is not a terminal (a client started it), so client logs stay clean.
pub(crate) fn stdio_banner(program: &str, state: &str) {
    use std::io::IsTerminal as _;
    if std::io::stdin().is_terminal() {
        eprintln!(
            "{program}: waiting for an MCP client on stdin (this is an MCP server: start it from a \
             client's config, or type JSON-RPC lines); {state}; Ctrl-D ends it"
        );
    }
}

/// The built-in identity table extended by `--identity-sources` files.
fn identity_sources(
    arg: &crate::cli::IdentitySourcesArg,
) -> anyhow::Result<std::sync::Arc<crate::identity::IdentitySources>> {
    if arg.identity_sources.is_empty() {
        return Ok(crate::identity::IdentitySources::built_in_shared());
    }
    Ok(std::sync::Arc::new(crate::identity::IdentitySources::load(
        &arg.identity_sources,
    )?))
}

/// `--trust-keys` loaded, with `--unsigned-harness-ids` or its default: refuse over HTTP, accept
/// on stdio.
fn trust_keys(
    arg: &crate::cli::TrustArg,
    http: bool,
) -> anyhow::Result<Option<std::sync::Arc<crate::identity::trust::TrustKeys>>> {
    use crate::identity::trust::{HarnessIds, TrustKeys};
    let Some(path) = &arg.trust_keys else {
        return Ok(None);
    };
    let harness = match arg.unsigned_harness_ids {
        Some(policy) => harness_ids(policy),
        None if http => HarnessIds::Refuse,
        None => HarnessIds::Accept,
    };
    Ok(Some(std::sync::Arc::new(TrustKeys::load(path, harness)?)))
}

fn harness_ids(arg: crate::cli::HarnessIdsArg) -> crate::identity::trust::HarnessIds {
    match arg {
        crate::cli::HarnessIdsArg::Accept => crate::identity::trust::HarnessIds::Accept,
        crate::cli::HarnessIdsArg::Refuse => crate::identity::trust::HarnessIds::Refuse,
    }
}

/// `callid envelope keygen|sign|verify` ([`crate::identity::tools`]); `verify` exits 1 when the
/// `_meta` would be refused.
fn envelope_command(command: crate::cli::EnvelopeCommand) -> anyhow::Result<ExitCode> {
    use crate::cli::{AlgArg, EnvelopeCommand};
    use crate::identity::{signature::Alg, tools, trust::now_secs};
    use std::io::{Read as _, Write as _};
    let (text, code) = match command {
        EnvelopeCommand::Keygen {
            kid,
            out,
            alg,
            platforms,
        } => {
            let alg = match alg {
                AlgArg::Ed25519 => Alg::Ed25519,
                AlgArg::Hs256 => Alg::Hs256,
            };
            (
                tools::keygen(&kid, &out, alg, &platforms)?,
                exit_codes::SUCCESS,
            )
        }
        EnvelopeCommand::Sign {
            key,
            kid,
            envelope,
            ttl,
        } => (
            tools::sign(&key, &kid, &envelope, ttl, now_secs())?,
            exit_codes::SUCCESS,
        ),
        EnvelopeCommand::Verify {
            trust_keys,
            meta,
            unsigned_harness_ids,
        } => {
            let meta = if meta == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("failed to read `_meta` from standard input")?;
                text
            } else {
                meta
            };
            let verdict = tools::verify(
                &trust_keys,
                &meta,
                harness_ids(unsigned_harness_ids),
                now_secs(),
            )?;
            let code = if verdict.valid {
                exit_codes::SUCCESS
            } else {
                exit_codes::CHECK_FAILED
            };
            (verdict.text, code)
        }
    };
    stdout()
        .write_all(text.as_bytes())
        .context("failed to write to standard output")?;
    Ok(ExitCode::from(code))
}

/// `callid identity-sources`: prints the table in force, or a preset (`--print-preset`).
fn identity_sources_command(args: crate::cli::IdentitySourcesArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::SourcesFormatArg;
    use std::io::Write as _;
    if let Some(name) = &args.print_preset {
        let (_, text) = crate::identity::PRESETS
            .iter()
            .find(|(preset, _)| preset == name)
            .expect("clap accepts only preset names");
        stdout()
            .write_all(text.as_bytes())
            .context("failed to write to standard output")?;
        return Ok(ExitCode::from(exit_codes::SUCCESS));
    }
    let table = identity_sources(&args.sources)?;
    let text = match args.format {
        SourcesFormatArg::Table => table.render_text(),
        SourcesFormatArg::Json => serde_json::to_string_pretty(table.entries())? + "\n",
    };
    stdout()
        .write_all(text.as_bytes())
        .context("failed to write to standard output")?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// `callid conform`: runs the scenarios and renders the report; 1 when a required check failed
/// unexpectedly, an expected failure is stale, or a check was not run (unless
/// `--allow-incomplete`). `--list`, `--print-profile` and `--contract` print and exit.
fn conform(args: crate::cli::ConformArgs) -> anyhow::Result<ExitCode> {
    use crate::conform::{Options, TargetSpec, report};
    use std::io::Write as _;
    if args.print_profile.is_some() || args.contract {
        let text = match args.print_profile {
            Some(which) => crate::conform::target::shipped_profile(which.into()),
            None => crate::conform::ROUTER_CONTRACT.to_owned(),
        };
        std::io::stdout()
            .lock()
            .write_all(text.as_bytes())
            .context("failed to write to standard output")?;
        return Ok(ExitCode::from(exit_codes::SUCCESS));
    }
    if args.list {
        let scenarios = crate::conform::load_scenarios(args.scenarios.as_deref())?;
        crate::conform::list(&scenarios, &mut std::io::stdout().lock())
            .context("failed to write the list")?;
        return Ok(ExitCode::from(exit_codes::SUCCESS));
    }
    let target = match (args.target, args.stdio, args.url) {
        (Some(file), None, None) => TargetSpec::Profile(file),
        (Some(file), None, Some(url)) => TargetSpec::ProfileAt(file, url),
        (None, Some(command), None) => TargetSpec::Stdio(command),
        (None, None, Some(url)) => TargetSpec::Url(url),
        (None, None, None) => TargetSpec::Reference,
        _ => anyhow::bail!("give at most one of `--target`, `--stdio` and `--url`"),
    };
    let options = Options {
        target,
        scenarios: args.scenarios,
        only: args.only,
        expected_failures: args.expected_failures,
        progress: true,
        allow_incomplete: args.allow_incomplete,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let report = runtime.block_on(crate::conform::run(&options))?;
    if let Some(signal) = report.interrupted {
        return conform_interrupted(&report, signal, args.out.as_deref(), args.format, runtime);
    }
    if let Some(path) = &args.write_expected_failures {
        std::fs::write(path, crate::conform::expected::baseline_text(&report))
            .with_context(|| format!("failed to write `{}`", path.display()))?;
    }
    let format = report::Format::from(args.format);
    match &args.out {
        Some(path) => {
            let mut file = std::fs::File::create(path)
                .with_context(|| format!("failed to create `{}`", path.display()))?;
            report::render(&report, format, &mut file)
                .with_context(|| format!("failed to write `{}`", path.display()))?;
            eprintln!("{}", report.summary_line());
        }
        None => {
            report::render(&report, format, &mut stdout()).context("failed to write the report")?;
        }
    }
    runtime.shutdown_background();
    Ok(ExitCode::from(if report.success() {
        exit_codes::SUCCESS
    } else {
        exit_codes::CHECK_FAILED
    }))
}

/// The end of a `callid conform` run interrupted by `signal` (whatever it started is already
/// ended): the partial report goes to `--out` only (standard output may be a pipe the same signal
/// closed), no expected-failures baseline is written from it, and the exit code is the signal's.
fn conform_interrupted(
    report: &crate::conform::report::Report,
    signal: crate::signals::Signal,
    out: Option<&std::path::Path>,
    format: crate::cli::FormatArg,
    runtime: tokio::runtime::Runtime,
) -> anyhow::Result<ExitCode> {
    use crate::conform::report;
    if let Some(path) = out {
        let mut file = std::fs::File::create(path)
            .with_context(|| format!("failed to create `{}`", path.display()))?;
        report::render(report, report::Format::from(format), &mut file)
            .with_context(|| format!("failed to write `{}`", path.display()))?;
    }
    eprintln!("{}", report.summary_line());
    runtime.shutdown_background();
    Ok(ExitCode::from(signal.exit_code()))
}

fn run_probe(args: crate::cli::ProbeArgs) -> anyhow::Result<ExitCode> {
    if args.http.is_none() {
        let log = match &args.log {
            Some(path) => format!("shape records go to `{}`", path.display()),
            None => "shape records go to stderr (pass `--log FILE` to keep them)".to_owned(),
        };
        stdio_banner("callid probe", &log);
    }
    let options = crate::probe::ProbeOptions {
        http: args.http,
        allow_origins: args.allow_origins,
        log: args.log,
        digest_salt: args.digest_salt,
        wrap: if args.wrap { args.command } else { Vec::new() },
        identity_sources: identity_sources(&args.sources)?,
        legacy_handshake: args.legacy_handshake,
    };
    let runtime = crate::probe::runtime(&options)?;
    let result = runtime.block_on(crate::probe::run(options));
    // Standard input is read on a blocking thread that may never return: do not wait for it.
    runtime.shutdown_background();
    let code = result.map_err(anyhow::Error::from)?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn run_classify(args: crate::cli::ClassifyArgs) -> anyhow::Result<ExitCode> {
    let sources = identity_sources(&args.sources)?;
    let (runs, bad) = crate::classify::read_runs(&args.logs)?;
    for line in &bad {
        eprintln!("warning: skipped {line}");
    }
    let verdicts = crate::classify::classify_runs(&runs, &sources);
    crate::classify::render(&verdicts, args.format.into(), &mut stdout())
        .context("failed to write the verdicts")?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

fn run_demo(args: crate::cli::DemoArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(crate::demo::run());
    runtime.shutdown_background();
    let outcome = result.context("running the demo")?;
    crate::classify::render(&outcome.verdicts, args.format.into(), &mut stdout())
        .context("failed to write the verdicts")?;
    if outcome.mismatches.is_empty() {
        Ok(ExitCode::from(exit_codes::SUCCESS))
    } else {
        for m in &outcome.mismatches {
            eprintln!("demo: {m}");
        }
        Ok(ExitCode::from(exit_codes::CHECK_FAILED))
    }
}

/// `callid provider`: binds (loopback only), opens the ledger, prints `listening on
/// http://ADDR`, serves until SIGINT or SIGTERM.
fn run_provider(args: crate::cli::ProviderArgs) -> anyhow::Result<ExitCode> {
    use crate::http_guard::{self, Server};
    use anyhow::Context as _;
    use std::io::Write as _;
    let token = crate::secret::Secret::from_file_or_env(
        args.token_file.as_deref(),
        "--token-file",
        crate::provider::TOKEN_ENV,
    )?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    if args.mcp {
        let ledger =
            crate::provider::Ledger::open(&args.ledger).context("starting the provider")?;
        runtime.block_on(crate::provider::mcp::serve_stdio(ledger))?;
        return Ok(ExitCode::from(exit_codes::SUCCESS));
    }
    runtime.block_on(async move {
        let bound = http_guard::bind(Server::Provider, args.listen, &args.allow_origins).await?;
        let ledger =
            crate::provider::Ledger::open(&args.ledger).context("starting the provider")?;
        let mut app = crate::provider::router(ledger, None);
        if let Some(token) = token {
            app = crate::provider::require_token(app, token);
        }
        let handle = crate::provider::spawn_app(bound.listener, bound.guard.protect(app))
            .context("starting the provider server")?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on http://{}", bound.addr)?;
        stdout.flush()?;
        drop(stdout);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("installing the SIGTERM handler")?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        handle.shutdown().await.context("serving the provider")?;
        Ok(ExitCode::from(exit_codes::SUCCESS))
    })
}

/// `callid gateway`: connects to the upstream, checks its tools, serves the agent on stdio.
fn run_gateway(args: crate::cli::GatewayArgs) -> anyhow::Result<ExitCode> {
    use crate::gateway::{GatewayOptions, UpstreamSpec};
    use anyhow::Context as _;
    if args.upstream_timeout == 0 {
        anyhow::bail!("`--upstream-timeout` must be at least 1 second");
    }
    if args.passthrough_timeout == 0 {
        anyhow::bail!("`--passthrough-timeout` must be at least 1 second");
    }
    if args.upstream_max_message_bytes < crate::gateway::MIN_MAX_MESSAGE_BYTES {
        anyhow::bail!(
            "`--upstream-max-message-bytes` must be at least {} (an `initialize` answer must fit)",
            crate::gateway::MIN_MAX_MESSAGE_BYTES
        );
    }
    let upstream = match args.upstream_url {
        Some(url) => UpstreamSpec::Url(
            url.parse::<crate::secret::SecretUrl>()
                .context("invalid `--upstream-url`")?,
        ),
        None => UpstreamSpec::Command(args.command),
    };
    let mut policy: crate::gateway::policy::GatewayPolicy = match &args.policy {
        Some(path) => crate::gateway::policy::GatewayPolicy::load(path)?,
        None => Default::default(),
    };
    for tool in &args.idempotent {
        if !args.spend.contains(tool) && !policy.tools.contains_key(tool) {
            anyhow::bail!(
                "`--idempotent {tool}` names no spend tool: `--idempotent` declares that a spend \
                 tool's upstream honours the idempotency key; add `--spend {tool}` (or list it \
                 in the policy) if it spends"
            );
        }
        policy.tools.entry(tool.clone()).or_default().idempotent = true;
    }
    let options = GatewayOptions {
        policy,
        registry: crate::spend::registry::RegistryLocation::parse(args.registry.as_os_str())?,
        spend: args.spend.into_iter().collect(),
        upstream,
        upstream_timeout: std::time::Duration::from_secs(args.upstream_timeout),
        passthrough_timeout: std::time::Duration::from_secs(args.passthrough_timeout),
        upstream_max_message_bytes: args.upstream_max_message_bytes,
        key_prefix: crate::keys::DEFAULT_KEY_PREFIX.into(),
        handle_prefix: crate::keys::DEFAULT_HANDLE_PREFIX.into(),
        identity_sources: identity_sources(&args.sources)?,
        lease_ttl: args.lease.ttl,
        trust: trust_keys(&args.trust, args.http.is_some())?,
        vouch: match (&args.vouch_key, args.vouch_kid, args.vouch_platform) {
            (Some(key), Some(kid), Some(platform)) => {
                let field = "--vouch-platform";
                crate::identity::platform_name(
                    &serde_json::Value::String(platform.clone()),
                    field,
                )?;
                if crate::identity::BUILT_IN_PLATFORMS
                    .iter()
                    .any(|b| b.eq_ignore_ascii_case(&platform))
                {
                    anyhow::bail!(
                        "`--vouch-platform {platform}` names a built-in source's platform, which no \
                         envelope may claim; name the gateway, e.g. `my-gateway`"
                    );
                }
                Some(std::sync::Arc::new(crate::gateway::vouch::Vouch {
                    key: crate::identity::signature::read_signing_key(key)?,
                    kid,
                    platform,
                }))
            }
            _ => None,
        },
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(crate::gateway::run(options, args.http, &args.allow_origins))?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// Prints `err` once, with its cause chain, and returns the exit code for it. A broken pipe here
/// is not standard output going away ([`stdout`] absorbs that) but a failure like any other, for
/// example a router that died while it was being written to.
pub fn report_error(err: &anyhow::Error) -> ExitCode {
    crate::logging::line(format_args!(
        "error: {}",
        crate::error_chain::format(err.as_ref())
    ));
    ExitCode::from(exit_codes::SETUP_ERROR)
}

/// `callid router`: serve MCP, or run an operator command on the registry.
fn run_router(args: crate::cli::RouterArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::{RegistryArg, RouterCommand};
    use crate::router::policy::Policy;
    use crate::spend::{operator, registry};
    use anyhow::Context as _;
    let registry_path =
        |arg: &RegistryArg| -> anyhow::Result<registry::RegistryLocation> {
            match &arg.registry {
            Some(given) => Ok(registry::RegistryLocation::parse(given.as_os_str())?),
            None => registry::default_path().map(registry::RegistryLocation::File).context(
                "no registry location: pass `--registry FILE` or `--registry postgres://...` \
                 (or set XDG_DATA_HOME or HOME)",
            ),
        }
        };
    let out = match args.command {
        Some(RouterCommand::Approve { handle, registry }) => {
            operator::approve(&registry_path(&registry)?, &handle)?
        }
        Some(RouterCommand::Deny {
            handle,
            reason,
            registry,
        }) => operator::deny(&registry_path(&registry)?, &handle, reason.as_deref())?,
        Some(RouterCommand::Resolve {
            handle,
            charged,
            not_charged: _,
            result,
            by,
            registry,
        }) => {
            let result = match &result {
                Some(path) => Some(operator::read_result(path)?),
                None => None,
            };
            let by = by
                .or_else(|| std::env::var("USER").ok().filter(|u| !u.trim().is_empty()))
                .unwrap_or_else(|| "an unnamed operator".into());
            operator::resolve(&registry_path(&registry)?, &handle, charged, result, &by)?
        }
        Some(RouterCommand::Status { handle, registry }) => {
            operator::status(&registry_path(&registry)?, &handle)?
        }
        Some(RouterCommand::Keys {
            file,
            count,
            prefix,
        }) => operator::keys(&file, count, &prefix)?,
        None => {
            let serve = args.serve;
            let file_policy = match &serve.policy {
                Some(path) => Policy::load(path)?,
                None => Policy::default(),
            };
            let policy = file_policy.overridden_by(Policy {
                approval_above_cents: serve.approval_above_cents,
                approval_models: serve.approval_models,
                budget_cents: serve.budget_cents,
                ..Policy::default()
            });
            policy.check()?;
            crate::keys::check_prefixes(&serve.key_prefix, &serve.handle_prefix)?;
            let provider = match &serve.provider_url {
                Some(url) => {
                    let url = url
                        .parse::<crate::secret::SecretUrl>()
                        .context("invalid `--provider-url`")?;
                    let token = crate::secret::Secret::from_file_or_env(
                        serve.provider_token_file.as_deref(),
                        "--provider-token-file",
                        crate::provider::TOKEN_ENV,
                    )?;
                    Some(crate::provider::Endpoint::new(url, token)?)
                }
                None => None,
            };
            let registry = registry_path(&serve.registry)?;
            if serve.http.is_none() {
                stdio_banner(
                    "callid router",
                    &format!("registry `{}`", registry.display()),
                );
            }
            let options = crate::router::RouterOptions {
                registry,
                provider,
                policy,
                preallocated_keys: serve.preallocated_keys,
                key_prefix: serve.key_prefix,
                handle_prefix: serve.handle_prefix,
                diagnose_meta: serve.diagnose_meta,
                identity_sources: identity_sources(&serve.sources)?,
                lease_ttl: serve.lease.ttl,
                trust: trust_keys(&serve.trust, serve.http.is_some())?,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(crate::router::run(
                options,
                serve.http,
                &serve.allow_origins,
            ))?;
            return Ok(ExitCode::from(exit_codes::SUCCESS));
        }
    };
    use std::io::Write as _;
    stdout()
        .write_all(out.as_bytes())
        .context("failed to write the answer")?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

fn matrix_command(args: crate::cli::MatrixArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::MatrixCommand;
    use crate::matrix::RenderOutcome;
    match args.command {
        MatrixCommand::Render { check, dir } => {
            let path = dir.join(crate::matrix::data::SUPPORT_FILE);
            match crate::matrix::render_dir(&dir, check)
                .with_context(|| format!("rendering the matrix in `{}`", dir.display()))?
            {
                RenderOutcome::Written { changed } => {
                    let what = if changed { "wrote" } else { "unchanged:" };
                    eprintln!("{what} {}", path.display());
                    Ok(ExitCode::from(exit_codes::SUCCESS))
                }
                RenderOutcome::UpToDate => {
                    eprintln!(
                        "{} matches its data, and every measured row agrees with its evidence",
                        path.display()
                    );
                    Ok(ExitCode::from(exit_codes::SUCCESS))
                }
                RenderOutcome::Differs(diff) => {
                    eprintln!(
                        "error: `{}` differs from what the data in `{}` renders: {diff}\n\
                         hint: run `callid matrix render --dir {}` and commit the result",
                        path.display(),
                        dir.display(),
                        dir.display()
                    );
                    Ok(ExitCode::from(exit_codes::CHECK_FAILED))
                }
                RenderOutcome::EvidenceDisagrees(err) => {
                    eprintln!("error [{}]: {err}", err.code());
                    Ok(ExitCode::from(exit_codes::CHECK_FAILED))
                }
            }
        }
        MatrixCommand::Add { logs, dir } => {
            let today = crate::clock::today();
            let (reports, logs): (Vec<_>, Vec<_>) = logs.into_iter().partition(|p| {
                std::fs::read_to_string(p).is_ok_and(|t| crate::matrix::is_conform_report(&t))
            });
            for report in &reports {
                let row =
                    crate::matrix::add_conform_report(&dir, report, &today).with_context(|| {
                        format!("adding the conformance report `{}`", report.display())
                    })?;
                eprintln!("added router `{}` ({} checks)", row.id, row.checks.len());
            }
            if logs.is_empty() {
                return Ok(ExitCode::from(exit_codes::SUCCESS));
            }
            let rows = crate::matrix::add_logs(&dir, &logs, &today)
                .with_context(|| format!("adding rows to the matrix in `{}`", dir.display()))?;
            if rows.is_empty() {
                anyhow::bail!(
                    "no client in {} made a `tools/call`, so no row was added",
                    logs.iter()
                        .map(|l| format!("`{}`", l.display()))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            for row in &rows {
                eprintln!(
                    "added `{}` ({} {}): {}",
                    row.id,
                    row.client,
                    row.version.as_deref().unwrap_or(""),
                    row.verdict.name()
                );
            }
            Ok(ExitCode::from(exit_codes::SUCCESS))
        }
        MatrixCommand::Outdated { dir } => matrix_outdated(&dir),
    }
}

/// `callid matrix outdated`: one line per measured row, stale ones first.
fn matrix_outdated(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let compared = match crate::matrix::outdated::outdated_dir(dir, crate::measure::package_of)? {
        Ok(compared) => compared,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            return Ok(ExitCode::from(exit_codes::SETUP_ERROR));
        }
    };
    let (stale, current): (Vec<_>, Vec<_>) = compared.iter().partition(|c| c.is_stale());
    let mut out = String::new();
    for c in &stale {
        out.push_str(&format!(
            "stale: {} (`{}`) measured on {}, {} `{}` is at {}: install {}, then run `callid measure --client {} --update`\n",
            c.client,
            c.row,
            c.measured,
            c.package.registry.name(),
            c.package.name,
            c.latest,
            c.latest,
            c.slug
        ));
    }
    for c in &current {
        out.push_str(&format!(
            "current: {} (`{}`) {}, {} `{}` latest {}\n",
            c.client,
            c.row,
            c.measured,
            c.package.registry.name(),
            c.package.name,
            c.latest
        ));
    }
    use std::io::Write as _;
    stdout()
        .write_all(out.as_bytes())
        .context("failed to write the list")?;
    if stale.is_empty() {
        eprintln!(
            "all {} measured rows are on their client's latest version",
            compared.len()
        );
        Ok(ExitCode::from(exit_codes::SUCCESS))
    } else {
        eprintln!(
            "{} of {} measured rows are behind their client's latest version",
            stale.len(),
            compared.len()
        );
        Ok(ExitCode::from(exit_codes::CHECK_FAILED))
    }
}

fn measure_command(args: crate::cli::MeasureArgs) -> anyhow::Result<ExitCode> {
    use crate::matrix::data::{CLIENTS_FILE, ClientsFile};
    use crate::measure::client::Client;
    use crate::measure::sdk::SdkClient;
    let agent = match args.client {
        crate::cli::ClientArg::Codex => Ok(Client::Codex),
        crate::cli::ClientArg::ClaudeCode => Ok(Client::ClaudeCode),
        crate::cli::ClientArg::GeminiCli => Ok(Client::GeminiCli),
        crate::cli::ClientArg::CopilotCli => Ok(Client::CopilotCli),
        crate::cli::ClientArg::QwenCode => Ok(Client::QwenCode),
        crate::cli::ClientArg::Opencode => Ok(Client::OpenCode),
        crate::cli::ClientArg::KiloCode => Ok(Client::KiloCode),
        crate::cli::ClientArg::Cline => Ok(Client::Cline),
        crate::cli::ClientArg::ContinueCli => Ok(Client::ContinueCli),
        crate::cli::ClientArg::FastAgent => Ok(Client::FastAgent),
        crate::cli::ClientArg::OpenaiAgents => Ok(Client::OpenAiAgents),
        crate::cli::ClientArg::InspectorCli => Err(SdkClient::Inspector),
        crate::cli::ClientArg::TsSdk => Err(SdkClient::TsSdk),
        crate::cli::ClientArg::PythonSdk => Err(SdkClient::PythonSdk),
        crate::cli::ClientArg::Rmcp => Err(SdkClient::Rmcp),
    };
    let clients_path = args.dir.join(CLIENTS_FILE);
    // Everything the result will be written to or compared with is checked before the client
    // runs: a measurement takes minutes, and its result must have somewhere to go.
    if args.update || args.check {
        let flag = if args.update { "--update" } else { "--check" };
        if !args.dir.is_dir() {
            anyhow::bail!(
                "the matrix directory `{}` does not exist, so `{flag}` has no matrix to {}; run \
                 from a callid checkout, pass `--dir DIR`, or leave out `{flag}` (`--out DIR` \
                 keeps the evidence)",
                args.dir.display(),
                if args.update {
                    "update"
                } else {
                    "compare with"
                }
            );
        }
        ClientsFile::load(&clients_path)?;
    }
    if let Some(out) = args
        .out
        .as_ref()
        .filter(|out| out.exists() && !out.is_dir())
    {
        anyhow::bail!(
            "`--out {}` is a file, not a directory; give a directory to keep the evidence in",
            out.display()
        );
    }
    let callid = std::env::current_exe().context("locating the `callid` binary for the probe")?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let progress = |line: String| eprintln!("{line}");
    let (measurement, slug) = match agent {
        Ok(client) => {
            let bin = client.locate(args.bin.as_deref(), &args.dir)?;
            let m = rt
                .block_on(crate::measure::measure(client, &bin, &callid, &progress))
                .with_context(|| format!("measuring `{}`", bin.display()))?;
            (m, client.slug())
        }
        Err(sdk) => {
            if args.bin.is_some() {
                anyhow::bail!("`--bin` applies to agent clients only, not to the SDK rows");
            }
            progress(format!("measuring the {} client", sdk.slug()));
            let m = rt
                .block_on(crate::measure::sdk::measure_sdk(sdk, &args.dir, &callid))
                .with_context(|| format!("measuring the {} client", sdk.slug()))?;
            (m, sdk.slug())
        }
    };
    let row = &measurement.row;
    let yaml = serde_yaml::to_string(&vec![row]).context("printing the row")?;
    {
        use std::io::Write as _;
        let text = format!("{}\n\n{yaml}", crate::measure::answer(row));
        stdout()
            .write_all(text.as_bytes())
            .context("failed to write the row")?;
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out.join(crate::matrix::data::EVIDENCE_DIR))
            .with_context(|| format!("creating the evidence directory `{}`", out.display()))?;
        for (name, bytes) in &measurement.evidence {
            let path = out.join(name);
            std::fs::write(&path, bytes)
                .with_context(|| format!("writing `{}`", path.display()))?;
        }
        let path = out.join("row.yaml");
        std::fs::write(&path, &yaml).with_context(|| format!("writing `{}`", path.display()))?;
        eprintln!(
            "kept the evidence in `{}` ({} probe logs and `row.yaml`)",
            out.display(),
            measurement.evidence.len()
        );
    }
    if args.check {
        let committed = ClientsFile::load(&clients_path)?;
        let Some(old) = committed.clients.iter().find(|r| r.id == row.id) else {
            eprintln!(
                "error: `{}` has no row `{}` to compare with; run `callid measure --client {} --update`",
                clients_path.display(),
                row.id,
                slug
            );
            return Ok(ExitCode::from(exit_codes::CHECK_FAILED));
        };
        let diffs = crate::matrix::evidence::row_differences(old, row);
        if diffs.is_empty() {
            eprintln!(
                "{} {}: measured row matches the committed row `{}`",
                row.client,
                row.version.as_deref().unwrap_or(""),
                row.id
            );
            return Ok(ExitCode::from(exit_codes::SUCCESS));
        }
        eprintln!(
            "error: the measured row differs from the committed row `{}` in `{}`:",
            row.id,
            clients_path.display()
        );
        for d in diffs {
            eprintln!("  {d}");
        }
        return Ok(ExitCode::from(exit_codes::CHECK_FAILED));
    }
    if args.update {
        update_matrix(&args.dir, &measurement)?;
        eprintln!(
            "updated `{}`, its evidence and `{}`",
            clients_path.display(),
            args.dir.join(crate::matrix::data::SUPPORT_FILE).display()
        );
    }
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// Puts a measurement into the matrix in `dir`: the evidence is staged beside it and checked
/// against the row first, so a row that cannot be written, or that disagrees with its
/// evidence, leaves no evidence file behind.
fn update_matrix(
    dir: &std::path::Path,
    measurement: &crate::measure::Measurement,
) -> anyhow::Result<()> {
    use crate::matrix::data::{CLIENTS_FILE, ClientsFile};
    let clients_path = dir.join(CLIENTS_FILE);
    let mut file = ClientsFile::load(&clients_path)?;
    file.upsert(measurement.row.clone());
    file.validate(&clients_path)?;
    let staging = tempfile::Builder::new()
        .prefix(".callid-measure-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a staging directory in `{}`", dir.display()))?;
    for (name, bytes) in &measurement.evidence {
        let path = staging.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating `{}`", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing `{}`", path.display()))?;
    }
    crate::matrix::evidence::check_row(staging.path(), &measurement.row)?;
    for (name, _) in &measurement.evidence {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating `{}`", parent.display()))?;
        }
        std::fs::rename(staging.path().join(name), &path)
            .with_context(|| format!("moving the evidence into `{}`", path.display()))?;
    }
    file.save(&clients_path)?;
    match crate::matrix::render_dir(dir, false)? {
        crate::matrix::RenderOutcome::EvidenceDisagrees(e) => Err(e.into()),
        _ => Ok(()),
    }
}

/// How long an interrupted `callid bench` waits for its blocking work before it exits.
#[cfg(feature = "bench")]
const BENCH_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(10);

/// `callid bench`: exit 0 when every row was measured or skipped (a missed target is reported,
/// not an error: the figures are for people to read), 1 when a row could not be measured, 128 +
/// the signal's number when SIGINT, SIGTERM or SIGHUP ended it (after everything it started).
#[cfg(feature = "bench")]
fn bench(args: crate::cli::BenchArgs) -> anyhow::Result<ExitCode> {
    use crate::bench;
    use crate::cli::PlainFormatArg;
    use anyhow::Context as _;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    if args.serve_baseline {
        runtime.block_on(bench::baseline::serve_stdio())?;
        return Ok(ExitCode::from(exit_codes::SUCCESS));
    }
    let only = args
        .only
        .iter()
        .map(|id| {
            bench::RowId::from_id(id).with_context(|| {
                let known: Vec<&str> = bench::RowId::ALL.iter().map(|r| r.id()).collect();
                format!("unknown bench row `{id}` (known: {})", known.join(", "))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let options = bench::Options {
        quick: args.quick,
        only,
        python: args.python,
    };
    // Ended by a signal, the run is dropped where it stands: its servers are killed
    // (`kill_on_drop`), its throwaway PostgreSQL cluster stopped and its scratch directory
    // removed, as each of them is dropped; then whatever it started and still lives (a server
    // being killed, the routers of a killed `callid conform`, adopted) is killed and waited for.
    crate::signals::adopt_orphans().context("failed to become the parent of orphaned servers")?;
    let finished = runtime
        .block_on(async {
            let mut signals = crate::signals::Signals::install()?;
            let finished = tokio::select! {
                report = bench::run(&options) => Ok(report),
                signal = signals.recv() => Err(signal),
            };
            if finished.is_err() {
                crate::signals::end_children().await;
            }
            std::io::Result::Ok(finished)
        })
        .context("failed to take over SIGINT, SIGTERM and SIGHUP")?;
    let report = match finished {
        Ok(report) => report,
        Err(signal) => {
            // A raw baseline batch may still run on a blocking thread: it ends within a second.
            runtime.shutdown_timeout(BENCH_SHUTDOWN);
            eprintln!(
                "callid bench: interrupted by {}; the processes and the scratch directory it \
                 started are gone, and no report was written",
                signal.name()
            );
            return Ok(ExitCode::from(signal.exit_code()));
        }
    };
    let mut out = stdout();
    match args.format {
        PlainFormatArg::Table => bench::render_table(&report, &mut out),
        PlainFormatArg::Markdown => bench::render_markdown(&report, &mut out),
        PlainFormatArg::Json => bench::render_json(&report, &mut out),
    }
    .context("failed to write the report")?;
    Ok(ExitCode::from(if report.has_errors() {
        exit_codes::CHECK_FAILED
    } else {
        exit_codes::SUCCESS
    }))
}
