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
        Command::Classify(_) => anyhow::bail!("`callid classify` is not built yet"),
        Command::Demo(_) => anyhow::bail!("`callid demo` is not built yet"),
        Command::Router(_) => anyhow::bail!("`callid router` is not built yet"),
        Command::Provider(_) => anyhow::bail!("`callid provider` is not built yet"),
        Command::Conform(_) => anyhow::bail!("`callid conform` is not built yet"),
        Command::Matrix(args) => matrix_command(args),
        Command::Measure(args) => measure_command(args),
        Command::Bench(_) => anyhow::bail!("`callid bench` is not built yet"),
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

fn matrix_command(args: crate::cli::MatrixArgs) -> anyhow::Result<ExitCode> {
    use crate::cli::MatrixCommand;
    use crate::matrix::RenderOutcome;
    match args.command {
        MatrixCommand::Render { check, dir } => {
            let path = dir.join(crate::matrix::data::SUPPORT_FILE);
            match crate::matrix::render_dir(&dir, check)? {
                RenderOutcome::Written { changed } => {
                    let what = if changed { "wrote" } else { "unchanged:" };
                    eprintln!("{what} {}", path.display());
                    Ok(ExitCode::from(exit_codes::SUCCESS))
                }
                RenderOutcome::UpToDate => {
                    eprintln!("{} matches its data", path.display());
                    Ok(ExitCode::from(exit_codes::SUCCESS))
                }
                RenderOutcome::Differs(diff) => {
                    eprintln!(
                        "{} differs from what the data in {} renders: {diff}\n\
                         hint: run `callid matrix render --dir {}` and commit the result",
                        path.display(),
                        dir.display(),
                        dir.display()
                    );
                    Ok(ExitCode::from(exit_codes::CHECK_FAILED))
                }
            }
        }
        MatrixCommand::Add { .. } => anyhow::bail!("`callid matrix add` is not built yet"),
    }
}

fn measure_command(args: crate::cli::MeasureArgs) -> anyhow::Result<ExitCode> {
    use crate::measure::{client::Client, run};
    let client = match args.client {
        crate::cli::ClientArg::Codex => Client::Codex,
        crate::cli::ClientArg::ClaudeCode => Client::ClaudeCode,
    };
    let bin = client.locate(args.bin.as_deref(), &args.dir)?;
    let version = client.version(&bin)?;
    let callid = std::env::current_exe().context("locating the `callid` binary for the probe")?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    for scenario in run::Scenario::ALL {
        let r = rt.block_on(run::run_scenario(client, &bin, &callid, scenario))?;
        eprintln!("{} {version} {:?}: exit {:?} timed_out {} seen {:#?}\n{}", client.slug(), scenario, r.exit_code, r.timed_out, r.seen, r.output_tail);
        eprintln!("log: {}", std::fs::read_to_string(&r.log).unwrap_or_default());
    }
    Ok(ExitCode::from(exit_codes::SUCCESS))
}
