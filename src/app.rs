//! Runs one command and is the one place that turns errors into messages and exit codes.
//!
//! Commands return `Ok(code)`: [`exit_codes::SUCCESS`], or [`exit_codes::CHECK_FAILED`] when they
//! ran and found a failing check. Any `Err` is a usage or setup error: it is printed once with its
//! whole cause chain and exits with [`exit_codes::SETUP_ERROR`]. A closed standard output (the
//! reader of a pipe went away) is not an error.

use crate::cli::{Cli, Command};
use crate::exit_codes;
use anyhow::Context as _;
use std::process::ExitCode;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_tracing();
    match cli.command {
        Command::Probe(args) => run_probe(args),
        Command::Classify(args) => run_classify(args),
        Command::Demo(args) => run_demo(args),
        Command::Router(args) => run_router(args),
        Command::Provider(args) => run_provider(args),
        Command::Conform(args) => conform(args),
        Command::Matrix(args) => matrix_command(args),
        Command::Measure(args) => measure_command(args),
        Command::Bench(args) => bench(args),
    }
}

/// `callid conform`: runs the scenarios and renders the report; 1 when a check failed unexpectedly
/// or an expected failure is stale.
fn conform(args: crate::cli::ConformArgs) -> anyhow::Result<ExitCode> {
    use crate::conform::{Options, TargetSpec, report};
    let target = match (args.target, args.stdio, args.url) {
        (Some(file), None, None) => TargetSpec::Profile(file),
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
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let report = runtime.block_on(crate::conform::run(&options))?;
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
            let mut out = std::io::stdout().lock();
            report::render(&report, format, &mut out).context("failed to write the report")?;
        }
    }
    runtime.shutdown_background();
    Ok(ExitCode::from(if report.success() {
        exit_codes::SUCCESS
    } else {
        exit_codes::CHECK_FAILED
    }))
}

fn run_probe(args: crate::cli::ProbeArgs) -> anyhow::Result<ExitCode> {
    let options = crate::probe::ProbeOptions {
        http: args.http,
        log: args.log,
        digest_salt: args.digest_salt,
        wrap: if args.wrap { args.command } else { Vec::new() },
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(crate::probe::run(options));
    // Standard input is read on a blocking thread that may never return: do not wait for it.
    runtime.shutdown_background();
    let code = result.map_err(anyhow::Error::from)?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn verdict_format(format: crate::cli::FormatArg) -> anyhow::Result<crate::classify::Format> {
    use crate::cli::FormatArg;
    match format {
        FormatArg::Table => Ok(crate::classify::Format::Table),
        FormatArg::Markdown => Ok(crate::classify::Format::Markdown),
        FormatArg::Json => Ok(crate::classify::Format::Json),
        FormatArg::Junit => {
            anyhow::bail!("`--format junit` is not available here; use table, markdown or json")
        }
    }
}

fn run_classify(args: crate::cli::ClassifyArgs) -> anyhow::Result<ExitCode> {
    let format = verdict_format(args.format)?;
    let (records, bad) = crate::classify::read_logs(&args.logs)?;
    for line in &bad {
        eprintln!("warning: skipped {line}");
    }
    let verdicts = crate::classify::classify(&records);
    let mut out = std::io::stdout().lock();
    crate::classify::render(&verdicts, format, &mut out)?;
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

fn run_demo(args: crate::cli::DemoArgs) -> anyhow::Result<ExitCode> {
    let format = verdict_format(args.format)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(crate::probe::demo::run());
    runtime.shutdown_background();
    let outcome = result.context("running the demo")?;
    let mut out = std::io::stdout().lock();
    crate::classify::render(&outcome.verdicts, format, &mut out)?;
    if outcome.mismatches.is_empty() {
        Ok(ExitCode::from(exit_codes::SUCCESS))
    } else {
        for m in &outcome.mismatches {
            eprintln!("demo: {m}");
        }
        Ok(ExitCode::from(exit_codes::CHECK_FAILED))
    }
}

/// `callid provider`: opens the ledger, binds, prints `listening on http://ADDR`, serves until
/// SIGINT or SIGTERM.
fn run_provider(args: crate::cli::ProviderArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use std::io::Write as _;
    if !args.listen.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on `{}`: the provider has no authentication; use a loopback \
             address such as 127.0.0.1:0",
            args.listen
        );
    }
    let ledger = crate::provider::Ledger::open(&args.ledger).context("starting the provider")?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding `{}`", args.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let handle = crate::provider::spawn(listener, ledger, None)
            .context("starting the provider server")?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on http://{addr}")?;
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

/// Prints `err` once, with its cause chain, and returns the exit code for it.
pub fn report_error(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        return ExitCode::from(exit_codes::SUCCESS);
    }
    eprintln!("error: {err:#}");
    ExitCode::from(exit_codes::SETUP_ERROR)
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Logs go to stderr (stdout may carry the MCP protocol), filtered by `CALLID_LOG` (default
/// `warn`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CALLID_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// `callid router`: serve MCP, or run an operator command on the registry.
fn run_router(args: crate::cli::RouterArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::{RegistryArg, RouterCommand};
    use crate::router::{operator, policy::Policy, registry};
    use anyhow::Context as _;
    let registry_path = |arg: &RegistryArg| -> anyhow::Result<std::path::PathBuf> {
        arg.registry
            .clone()
            .or_else(registry::default_path)
            .context("no registry location: pass `--registry FILE` (or set XDG_DATA_HOME or HOME)")
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
            });
            let options = crate::router::RouterOptions {
                registry: registry_path(&serve.registry)?,
                provider_url: serve.provider_url,
                policy,
                preallocated_keys: serve.preallocated_keys,
                key_prefix: serve.key_prefix,
                handle_prefix: serve.handle_prefix,
                diagnose_meta: serve.diagnose_meta,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(crate::router::run(options, serve.http))?;
            return Ok(ExitCode::from(exit_codes::SUCCESS));
        }
    };
    use std::io::Write as _;
    std::io::stdout().write_all(out.as_bytes())?;
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
            let today = crate::measure::today();
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
    let callid = std::env::current_exe().context("locating the `callid` binary for the probe")?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let (measurement, slug) = match agent {
        Ok(client) => {
            let bin = client.locate(args.bin.as_deref(), &args.dir)?;
            let m = rt
                .block_on(crate::measure::measure(client, &bin, &callid))
                .with_context(|| format!("measuring `{}`", bin.display()))?;
            (m, client.slug())
        }
        Err(sdk) => {
            if args.bin.is_some() {
                anyhow::bail!("`--bin` applies to agent clients only, not to the SDK rows");
            }
            let m = rt
                .block_on(crate::measure::sdk::measure_sdk(sdk, &args.dir, &callid))
                .with_context(|| format!("measuring the {} client", sdk.slug()))?;
            (m, sdk.slug())
        }
    };
    let row = &measurement.row;
    print!(
        "{}",
        serde_yaml::to_string(&vec![row]).context("printing the row")?
    );
    let clients_path = args.dir.join(CLIENTS_FILE);
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
        for (name, bytes) in &measurement.evidence {
            let path = args.dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating `{}`", parent.display()))?;
            }
            std::fs::write(&path, bytes)
                .with_context(|| format!("writing `{}`", path.display()))?;
        }
        let mut file = ClientsFile::load(&clients_path)?;
        file.upsert(row.clone());
        file.save(&clients_path)?;
        match crate::matrix::render_dir(&args.dir, false)? {
            crate::matrix::RenderOutcome::EvidenceDisagrees(e) => return Err(e.into()),
            _ => eprintln!(
                "updated `{}`, its evidence and `{}`",
                clients_path.display(),
                args.dir.join(crate::matrix::data::SUPPORT_FILE).display()
            ),
        }
    }
    Ok(ExitCode::from(exit_codes::SUCCESS))
}

/// `callid bench`: exit 0 when every row was measured or skipped (a missed target is reported,
/// not an error: the figures are for people to read), 1 when a row could not be measured.
fn bench(args: crate::cli::BenchArgs) -> anyhow::Result<ExitCode> {
    use crate::bench;
    use crate::cli::FormatArg;
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
    let report = runtime.block_on(bench::run(&options));
    let mut out = std::io::stdout().lock();
    match args.format {
        FormatArg::Table => bench::render_table(&report, &mut out),
        FormatArg::Markdown => bench::render_markdown(&report, &mut out),
        FormatArg::Json => bench::render_json(&report, &mut out),
        FormatArg::Junit => {
            anyhow::bail!("`callid bench` prints table, markdown or json, not junit")
        }
    }
    .context("failed to write the report")?;
    Ok(ExitCode::from(if report.has_errors() {
        exit_codes::CHECK_FAILED
    } else {
        exit_codes::SUCCESS
    }))
}
