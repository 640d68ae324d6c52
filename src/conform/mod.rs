//! The conformance runner: replays `scenarios/*.yaml` against any router, one verdict per rule.
//!
//! [`run`] loads the target ([`target::Profile`]), starts the runner's own paid provider
//! ([`provider::RunnerProvider`], whose ledger is the ground truth of every charge count), runs
//! each scenario ([`scenario::Scenario`]) in its own fresh state through [`runner`], classifies
//! every verdict against the expected-failures baseline ([`expected`]) and returns one
//! [`report::Report`] that every format renders.
//!
//! # Guarantees
//! - A check passes only if every expectation of every step held; a check the target cannot run
//!   is `n-a`, never `pass`.
//! - Charge counts come from the provider's ledger, never from what the router says.
//! - Every byte of every response is scanned for the private key pattern.
//! - A router that dies mid-scenario is an `error` for that scenario; the run goes on.
//! - Check ids are stable: they are the `id:` of the scenario files, each citing its article rule.

pub mod expected;
pub mod provider;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod target;

use expected::ExpectedFailures;
use report::{CheckResult, Report, Verdict};
use runner::{Outcome, ProgressSink, ScenarioRun};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which router to test.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    /// The built-in reference router (this binary's `router` subcommand).
    Reference,
    /// A profile file.
    Profile(PathBuf),
    /// `--stdio 'CMD ARGS'`.
    Stdio(String),
    /// `--url URL`.
    Url(String),
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The target.
    pub target: TargetSpec,
    /// The scenario directory.
    pub scenarios: PathBuf,
    /// Only these check ids (all when empty).
    pub only: Vec<String>,
    /// The expected-failures file.
    pub expected_failures: Option<PathBuf>,
    /// Draw a live progress line on stderr (only when stderr is a terminal).
    pub progress: bool,
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
            ConformError::Start(_) => "router_start_failed",
            ConformError::Io(_) => "setup_io",
        }
    }
}

/// Runs the selected scenarios against the target and returns the report.
pub async fn run(options: &Options) -> Result<Report, ConformError> {
    let started = Instant::now();
    let all = scenario::load_dir(&options.scenarios)?;
    let known: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    let expected = match &options.expected_failures {
        Some(file) => ExpectedFailures::load(file, &known)?,
        None => ExpectedFailures::default(),
    };
    let scenarios = scenario::select(all.clone(), &options.only)?;
    let profile = match &options.target {
        TargetSpec::Reference => target::Profile::reference(),
        TargetSpec::Profile(file) => target::Profile::load(file)?,
        TargetSpec::Stdio(command) => target::Profile::stdio_command(command)?,
        TargetSpec::Url(url) => target::Profile::url(url),
    };
    let callid = std::env::current_exe()?.display().to_string();
    let provider = if profile.has_ledger() {
        let listen = profile.provider_listen.as_deref().unwrap_or("127.0.0.1:0");
        Some(provider::RunnerProvider::start(listen).await?)
    } else {
        None
    };
    let progress = Progress::start(
        options.progress && std::io::stderr().is_terminal(),
        scenarios.len(),
    );
    let mut checks = Vec::with_capacity(scenarios.len());
    for (index, scenario) in scenarios.iter().enumerate() {
        progress.scenario(index, &scenario.id);
        let begun = Instant::now();
        let outcome = match runner::not_applicable(&profile, scenario) {
            Some(reason) => Outcome::NotApplicable(reason),
            None => {
                ScenarioRun::new(&profile, provider.as_ref(), scenario, &callid)?
                    .run(&progress)
                    .await?
            }
        };
        let (verdict, reason) = match outcome {
            Outcome::Pass => (Verdict::Pass, String::new()),
            Outcome::Fail(r) => (Verdict::Fail, r),
            Outcome::NotApplicable(r) => (Verdict::NotApplicable, r),
            Outcome::Error(r) => (Verdict::Error, r),
        };
        checks.push(CheckResult {
            id: scenario.id.clone(),
            title: scenario.title.clone(),
            rule: scenario.rule.clone(),
            article: scenario.article.clone(),
            baseline: expected.classify(&scenario.id, verdict),
            verdict,
            reason,
            duration: begun.elapsed(),
        });
    }
    progress.finish();
    Ok(Report {
        target: profile.name.clone(),
        checks,
        duration: started.elapsed(),
    })
}

/// The live progress line on stderr: `[3/29] redelivery.after-restart · step 2 restart · 4.1 s`.
struct Progress {
    state: Option<Arc<Mutex<ProgressState>>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

struct ProgressState {
    total: usize,
    index: usize,
    id: String,
    step: String,
    started: Instant,
}

impl ProgressState {
    fn draw(&self) {
        use std::io::Write;
        let line = format!(
            "[{}/{}] {} · {} · {:.1} s",
            self.index + 1,
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
            index: 0,
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

    fn scenario(&self, index: usize, id: &str) {
        if let Some(state) = &self.state {
            let mut s = state.lock().expect("progress lock");
            s.index = index;
            s.id = id.to_string();
            s.step = "starting".into();
            s.draw();
        }
    }

    fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
            eprint!("\r\x1b[2K");
        }
    }
}

impl ProgressSink for Progress {
    fn step(&self, index: usize, kind: &str) {
        if let Some(state) = &self.state {
            let mut s = state.lock().expect("progress lock");
            s.step = format!("step {} {kind}", index + 1);
            s.draw();
        }
    }
}
