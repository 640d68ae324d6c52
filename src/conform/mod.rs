//! The conformance runner: replays the scenarios against any router, one verdict per rule.
//!
//! The scenarios and the reference profile are built into the binary ([`builtin`]), so an
//! installed `callid conform` runs from any directory; `--scenarios DIR` adds or replaces them.
//! [`run`] loads the target ([`target::Profile`]), starts the runner's own paid provider
//! ([`provider::RunnerProvider`], whose ledger is the ground truth of every charge count), or,
//! for a profile with `backend: upstream`, the runner's upstream MCP server over the same kind of
//! ledger ([`upstream`]: for gateways and MCP-native routers), runs
//! each scenario ([`scenario::Scenario`]) in its own fresh state through [`runner`], classifies
//! every verdict against the expected-failures baseline ([`expected`]) and returns one
//! [`report::Report`] that every format renders.
//!
//! # Guarantees
//! - A check passes only if every expectation of every step that the target can show held, and
//!   the rule's core was among them (`runner/judge.rs`: a profile may declare that results
//!   carry no handle or status; nothing core checked is `not run`). A check not run is never a
//!   pass: it is `skipped` only when the profile declares the capability absent, and otherwise
//!   `not run`, which fails the run unless `--allow-incomplete`.
//! - Required checks (the article's rules) decide the exit code; recommended ones (callid's
//!   conventions) are reported in their own section.
//! - Charge counts come from the provider's (or upstream's) ledger and dispatch counts from its
//!   request log, never from what the router says; every count message names the role that
//!   counted, and its dispatches and charges apart. Two dispatches of one operation in flight at
//!   once fail any check that counts charges.
//! - A profile's `idempotent_backend: false` makes the provider (or upstream) charge every
//!   request; the checks written for the other kind of backend are skipped, never passed.
//! - The checks that sign envelopes (`signature.*`) run only against a profile that declares
//!   `signed_envelopes` (otherwise skipped, saying so), each with a fresh key the runner makes
//!   and hands to the router ([`signer`]).
//! - Every byte of every response is scanned for the private key pattern.
//! - A router that dies mid-scenario is an `error` for that scenario; the run goes on.
//! - Check ids are stable: they are the `id:` of the scenario files, each citing its article rule.
//! - A run interrupted by SIGINT, SIGTERM or SIGHUP ends every process group it started, removes
//!   its temporary directories and returns a report marked interrupted, where every check that
//!   did not finish is `not run` ([`crate::signals`]).

mod builtin;
pub(crate) mod expected;
mod hooks;
mod provider;
pub(crate) mod report;
mod runner;
pub(crate) mod scenario;
pub(crate) mod signer;
pub(crate) mod target;
pub(crate) mod upstream;

pub use provider::RunnerProvider;
pub use scenario::Scenario;
pub use target::Profile;
pub use upstream::NO_KEY;

use expected::ExpectedFailures;
use report::{CheckResult, Report, Verdict};
use runner::{Outcome, ProgressSink, ScenarioRun};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which router to test.
#[derive(Debug, Clone)]
pub(crate) enum TargetSpec {
    /// The built-in reference router (this binary's `router` subcommand).
    Reference,
    /// A profile file.
    Profile(PathBuf),
    /// `--stdio 'CMD ARGS'`.
    Stdio(String),
    /// `--url URL`.
    Url(String),
    /// `--target FILE --url URL`: the profile's names, for a router already running at the URL.
    ProfileAt(PathBuf, String),
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The target.
    pub target: TargetSpec,
    /// A directory of scenario files added to the built-in ones (same id: replaces it).
    pub scenarios: Option<PathBuf>,
    /// Only these check ids (all when empty).
    pub only: Vec<String>,
    /// The expected-failures file.
    pub expected_failures: Option<PathBuf>,
    /// Draw a live progress line on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// Checks not run do not fail the run.
    pub allow_incomplete: bool,
}

/// A usage or setup error: nothing was tested.
#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    /// A scenario file or directory.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// The target profile.
    #[error(transparent)]
    Target(#[from] target::TargetError),
    /// The expected-failures file.
    #[error(transparent)]
    Expected(#[from] expected::ExpectedError),
    /// The runner's provider.
    #[error(transparent)]
    Provider(#[from] provider::ProviderSetupError),
    /// The router program could not be started at all.
    #[error(transparent)]
    Start(#[from] runner::StartError),
    /// The router started in no scenario at all: a setup problem, not a verdict.
    #[error("the router never started: {0}; check the target's command and arguments")]
    NeverStarted(String),
    /// A router at `--url` (or a profile without a command) could not be reached.
    #[error("failed to reach the router at `{url}`: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why, with the fix.
        reason: String,
    },
    /// A check found the target set up so that it cannot be judged.
    #[error("check `{id}` cannot judge this target: {reason}")]
    Setup {
        /// The check.
        id: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// This binary's path (for the reference router) or a temporary directory.
    #[error("failed to prepare the run: {0}")]
    Io(#[from] std::io::Error),
}

impl ConformError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ConformError::Scenario(e) => e.code(),
            ConformError::Target(e) => e.code(),
            ConformError::Expected(e) => e.code(),
            ConformError::Provider(_) => "provider_unavailable",
            ConformError::Start(_) | ConformError::NeverStarted(_) => "router_start_failed",
            ConformError::Unreachable { .. } => "router_unreachable",
            ConformError::Setup { .. } => "target_setup",
            ConformError::Io(_) => "setup_io",
        }
    }
}

/// How many scenarios run at once when each gets its own provider (`CALLID_CONFORM_JOBS`
/// overrides). Scenarios are isolated (own state directory, own router, own ledger), so the only
/// limit is the machine: most of a scenario's time is spent waiting on fsync and process start.
pub(crate) const DEFAULT_JOBS: usize = 4;

/// Runs the selected scenarios against the target and returns the report.
pub(crate) async fn run(options: &Options) -> Result<Report, ConformError> {
    let started = Instant::now();
    let mut signals = crate::signals::Signals::install()?;
    let all = load_scenarios(options.scenarios.as_deref())?;
    let known: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    let expected = match &options.expected_failures {
        Some(file) => ExpectedFailures::load(file, &known)?,
        None => ExpectedFailures::default(),
    };
    let scenarios = scenario::select(all.clone(), &options.only)?;
    let profile = Arc::new(match &options.target {
        TargetSpec::Reference => target::Profile::reference(),
        TargetSpec::Profile(file) => target::Profile::load(file)?,
        TargetSpec::Stdio(command) => target::Profile::stdio_command(command)?,
        TargetSpec::Url(url) => target::Profile::url(url),
        TargetSpec::ProfileAt(file, url) => target::Profile::load(file)?.at_url(url),
    });
    let callid = std::env::current_exe()?.display().to_string();
    // A router the runner does not start is pointed at one fixed provider address: its charges
    // can only be told apart by running one scenario at a time against one shared ledger.
    let shared = match &profile.provider_listen {
        Some(listen) => Some(Arc::new(provider::RunnerProvider::start(listen).await?)),
        None => None,
    };
    let jobs = if profile.provider_listen.is_some() || !profile.runner_starts() {
        1
    } else {
        std::env::var("CALLID_CONFORM_JOBS")
            .ok()
            .and_then(|j| j.parse::<usize>().ok())
            .filter(|j| *j > 0)
            .unwrap_or(DEFAULT_JOBS)
    };
    let progress = Arc::new(Progress::start(
        options.progress && std::io::stderr().is_terminal(),
        scenarios.len(),
    ));
    let selected = scenarios.clone();
    let mut pending = scenarios.into_iter().enumerate();
    let mut running = tokio::task::JoinSet::new();
    let mut results: Vec<(usize, Scenario, Outcome, Duration)> = Vec::new();
    let mut interrupted = None;
    loop {
        while running.len() < jobs {
            let Some((index, scenario)) = pending.next() else {
                break;
            };
            let profile = profile.clone();
            let shared = shared.clone();
            let callid = callid.clone();
            let progress = progress.clone();
            running.spawn(async move {
                let begun = Instant::now();
                let outcome = run_one(&profile, shared, &scenario, &callid, &progress).await;
                outcome.map(|o| (index, scenario, o, begun.elapsed()))
            });
        }
        let joined = tokio::select! {
            biased;
            signal = signals.recv() => {
                interrupted = Some(signal);
                break;
            }
            joined = running.join_next() => joined,
        };
        let Some(joined) = joined else {
            break;
        };
        let done = joined.map_err(|e| ConformError::Io(std::io::Error::other(e)))??;
        progress.done();
        results.push(done);
    }
    if let Some(signal) = interrupted {
        // Dropping a check's future kills its routers, then removes its state and provider.
        running.abort_all();
        while running.join_next().await.is_some() {}
        crate::signals::end_all().await;
        let reason = format!(
            "the run was interrupted by {} before this check finished",
            signal.name()
        );
        for (index, scenario) in selected.into_iter().enumerate() {
            if !results.iter().any(|(done, ..)| *done == index) {
                results.push((
                    index,
                    scenario,
                    Outcome::NotRun(reason.clone()),
                    Duration::ZERO,
                ));
            }
        }
    }
    results.sort_by_key(|(index, ..)| *index);
    // An interrupted run is reported as it stands: its exit code is the signal's.
    if interrupted.is_none()
        && let Some((_, scenario, Outcome::Setup(reason), _)) = results
            .iter()
            .find(|(_, _, o, _)| matches!(o, Outcome::Setup(_)))
    {
        return Err(ConformError::Setup {
            id: scenario.id.clone(),
            reason: reason.clone(),
        });
    }
    let ran: Vec<&Outcome> = results
        .iter()
        .map(|(_, _, o, _)| o)
        .filter(|o| !matches!(o, Outcome::Skipped(_) | Outcome::NotRun(_)))
        .collect();
    if interrupted.is_none()
        && let Some(Outcome::Error(first)) = ran.first()
        && ran
            .iter()
            .all(|o| matches!(o, Outcome::Error(r) if r.starts_with(runner::START_FAILED)))
    {
        if !profile.runner_starts() {
            let url = profile.url.clone().unwrap_or_default();
            return Err(ConformError::Unreachable {
                reason: unreachable_reason(&url, first),
                url,
            });
        }
        return Err(ConformError::NeverStarted(first.clone()));
    }
    let checks = results
        .into_iter()
        .map(|(_, scenario, outcome, duration)| {
            let (verdict, reason) = match outcome {
                Outcome::Pass => (Verdict::Pass, String::new()),
                Outcome::Fail(r) => (Verdict::Fail, r),
                Outcome::Skipped(r) => (Verdict::Skipped, r),
                Outcome::NotRun(r) => (Verdict::NotRun, r),
                Outcome::Error(r) | Outcome::Setup(r) => (Verdict::Error, r),
            };
            CheckResult {
                baseline: expected.classify(&scenario.id, verdict),
                id: scenario.id,
                title: scenario.title,
                rule: scenario.rule,
                article: scenario.article,
                level: scenario.level,
                verdict,
                reason,
                duration,
            }
        })
        .collect();
    drop(progress);
    Ok(Report {
        target: profile.name.clone(),
        checks,
        duration: started.elapsed(),
        allow_incomplete: options.allow_incomplete,
        interrupted,
    })
}

/// The built-in scenarios, with those of `dir` added or replacing them.
pub fn load_scenarios(dir: Option<&std::path::Path>) -> Result<Vec<Scenario>, ConformError> {
    Ok(match dir {
        Some(dir) => scenario::load_with_overrides(dir)?,
        None => scenario::load_builtin()?,
    })
}

/// `callid conform --list`: every check id, its level, the rule it cites and the article's words.
pub(crate) fn list(scenarios: &[Scenario], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    for level in [report::Level::Required, report::Level::Recommended] {
        let of_level: Vec<&Scenario> = scenarios.iter().filter(|s| s.level == level).collect();
        if of_level.is_empty() {
            continue;
        }
        match level {
            report::Level::Required => writeln!(
                out,
                "required (the article's rules: a failure fails the run)"
            )?,
            report::Level::Recommended => writeln!(
                out,
                "\nrecommended (callid's conventions: reported, never fail the run)"
            )?,
        }
        for s in of_level {
            writeln!(out, "  {}  {}", s.id, s.rule)?;
            writeln!(out, "      \"{}\"", s.article.trim())?;
        }
    }
    Ok(())
}

/// Why a router the runner does not start could not be reached, with the fix.
fn unreachable_reason(url: &str, first: &str) -> String {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let refused = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .map(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
        .unwrap_or(false);
    if refused {
        format!(
            "connection refused: nothing listens on `{authority}`; start the router first (or fix the URL)"
        )
    } else {
        format!("{first}; check that the URL is the router's MCP endpoint")
    }
}

/// One scenario, with its own provider unless one is shared.
async fn run_one(
    profile: &target::Profile,
    shared: Option<Arc<provider::RunnerProvider>>,
    scenario: &Scenario,
    callid: &str,
    progress: &Progress,
) -> Result<Outcome, ConformError> {
    if let Some(outcome) = runner::not_runnable(profile, scenario) {
        return Ok(outcome);
    }
    let provider = match shared {
        Some(shared) => Some(shared),
        None if profile.runner_starts() => Some(Arc::new(
            provider::RunnerProvider::start_for(profile.backend).await?,
        )),
        None => None,
    };
    let sink = ScenarioProgress {
        progress,
        id: &scenario.id,
    };
    let signing;
    let profile = if scenario.signed_envelopes {
        signing = profile.with_signed_envelopes();
        &signing
    } else {
        profile
    };
    Ok(
        ScenarioRun::new(profile, provider.as_deref(), scenario, callid)?
            .run(&sink)
            .await?,
    )
}

/// The live progress line on stderr: `[3/29] redelivery.after-restart · step 2 restart · 4.1 s`
/// (the scenario that moved last, and the run's elapsed time), redrawn every 200 ms.
struct Progress {
    state: Option<Arc<Mutex<ProgressState>>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

struct ProgressState {
    total: usize,
    done: usize,
    id: String,
    step: String,
    started: Instant,
}

impl ProgressState {
    fn draw(&self) {
        use std::io::Write;
        let line = format!(
            "[{}/{}] {} · {} · {:.1} s",
            self.done,
            self.total,
            self.id,
            self.step,
            self.started.elapsed().as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }
}

impl Progress {
    fn start(enabled: bool, total: usize) -> Progress {
        if !enabled {
            return Progress {
                state: None,
                ticker: None,
            };
        }
        let state = Arc::new(Mutex::new(ProgressState {
            total,
            done: 0,
            id: String::new(),
            step: "starting".into(),
            started: Instant::now(),
        }));
        let ticking = state.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                ticking.lock().expect("progress lock").draw();
            }
        });
        Progress {
            state: Some(state),
            ticker: Some(ticker),
        }
    }

    fn update(&self, id: &str, step: String) {
        if let Some(state) = &self.state {
            let mut s = state.lock().expect("progress lock");
            s.id = id.to_string();
            s.step = step;
            s.draw();
        }
    }

    fn done(&self) {
        if let Some(state) = &self.state {
            state.lock().expect("progress lock").done += 1;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
            eprint!("\r\x1b[2K");
        }
    }
}

struct ScenarioProgress<'a> {
    progress: &'a Progress,
    id: &'a str,
}

impl ProgressSink for ScenarioProgress<'_> {
    fn step(&self, index: usize, kind: &str) {
        self.progress
            .update(self.id, format!("step {} {kind}", index + 1));
    }
}

/// The router contract (`ROUTER-CONTRACT.md`): what a router must do to be judged.
pub(crate) const ROUTER_CONTRACT: &str = include_str!("../../ROUTER-CONTRACT.md");
