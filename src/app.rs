//! Runs one command and is the one place that turns errors into messages and exit codes.
//!
//! Commands return `Ok(code)`: [`exit_codes::SUCCESS`], or [`exit_codes::CHECK_FAILED`] when they
//! ran and found a failing check. Any `Err` is a usage or setup error: it is printed once with its
//! whole cause chain and exits with [`exit_codes::SETUP_ERROR`]. A closed standard output (the
//! reader of a pipe went away) is not an error.

use crate::cli::{Cli, Command, FormatArg};
use crate::exit_codes;
use anyhow::Context as _;
use std::process::ExitCode;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_tracing();
    match cli.command {
        Command::Probe(args) => run_probe(args),
        Command::Classify(_) => anyhow::bail!("`callid classify` is not built yet"),
        Command::Demo(_) => anyhow::bail!("`callid demo` is not built yet"),
        Command::Router(_) => anyhow::bail!("`callid router` is not built yet"),
        Command::Provider(_) => anyhow::bail!("`callid provider` is not built yet"),
        Command::Conform(_) => anyhow::bail!("`callid conform` is not built yet"),
        Command::Matrix(_) => anyhow::bail!("`callid matrix` is not built yet"),
        Command::Measure(_) => anyhow::bail!("`callid measure` is not built yet"),
        Command::Bench(args) => bench(args),
    }
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

/// `callid bench`: exit 0 when every row was measured or skipped (a missed target is reported,
/// not an error: the figures are for people to read), 1 when a row could not be measured.
fn bench(args: crate::cli::BenchArgs) -> anyhow::Result<ExitCode> {
    use crate::bench;
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
