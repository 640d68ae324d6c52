//! The second router process of a scenario, the profile's per-check `setup` commands, and the
//! `{check_slug}` placeholder.
//!
//! # Guarantees
//! - A step with `router: second` (or a `redeliver` step of a profile with `redeliver_on_second`)
//!   talks to a second process started from the same profile on the same `{state_dir}` and
//!   `{registry}`, with its own `{port}`. It is started on first use (never silently again after a
//!   kill: a killed process needs `do: restart` with `router: second`), and it is stopped like the
//!   first, by SIGKILL to its process group, whatever happened.
//! - A `concurrent` step with `router: both` alternates its deliveries between the two processes
//!   (the first one alone first, while a hold is armed; the hold ends on an observed event or at
//!   its ceiling: see `ScenarioRun::concurrent`).
//! - Every step that uses the second process needs `capabilities.shared_registry` (see
//!   [`super::not_runnable`]): declared false, the check is skipped; undeclared, it is not run.
//! - `setup` commands run in order before the check's first router starts, with the check's
//!   placeholders; one that cannot start, fails or takes longer than [`SETUP_TIMEOUT`] is a setup
//!   error for the run (nothing about the router was judged).
//! - `{check_slug}` is unique per check run: the check id with every character other than a
//!   letter or digit made `_` (at most 40), `_`, and 12 random hex digits, so it is a valid
//!   unquoted SQL identifier and database name (at most 53 bytes, lowercase, starts with a letter).

use super::process::{PortLease, Router, last_line};
use super::{Reason, ScenarioRun, StepError, StepResult};
use crate::conform::scenario::{RouterChoice, Step};
use crate::conform::target::Profile;
use crate::jsonrpc::Connection;
use std::time::Duration;

/// How long one setup command may take.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The second router process of one scenario run.
#[derive(Default)]
pub(super) struct Second {
    router: Option<Router>,
    /// Its `{port}`, claimed on first use.
    port: Option<PortLease>,
    /// The `{port}` of the process that is not in the run's placeholders right now.
    other_port: String,
    /// Whether it was ever started (a killed one is not started again behind the scenario's back).
    started: bool,
}

/// The process `step` goes to: its own `router:`, or the second for a `redeliver` step that names
/// none when the profile sets `redeliver_on_second`.
pub fn router_of(profile: &Profile, step: &Step) -> RouterChoice {
    match step {
        Step::Redeliver(s) if s.router.is_none() && profile.redeliver_on_second => {
            RouterChoice::Second
        }
        _ => step.router(),
    }
}

/// `{check_slug}` for check `id` (see the module's guarantees).
pub fn check_slug(id: &str) -> String {
    let base: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    format!("{}_{}", base.to_ascii_lowercase(), &tag[..12])
}

impl ScenarioRun<'_> {
    /// Runs `step` on the router process it names.
    pub(super) async fn step_on(&mut self, step: &Step) -> StepResult {
        match router_of(self.profile, step) {
            RouterChoice::First => self.step(step).await,
            RouterChoice::Second => {
                self.swap_second()?;
                let mut result = Ok(());
                if !self.second.started && !matches!(step, Step::Restart(_)) {
                    result = self.start().await;
                }
                self.second.started = true;
                if result.is_ok() {
                    result = self.step(step).await;
                }
                self.swap_second()?;
                result
            }
            RouterChoice::Both => {
                if !self.second.started {
                    self.swap_second()?;
                    self.second.started = true;
                    let started = self.start().await;
                    self.swap_second()?;
                    started?;
                }
                self.step(step).await
            }
        }
    }

    /// Exchanges the first and the second process (connection, process and `{port}`), so every
    /// step of the runner works on either.
    fn swap_second(&mut self) -> StepResult {
        if self.second.port.is_none() {
            let lease = PortLease::take().map_err(|e| {
                StepError::Error(format!("no port for the second router process: {e}"))
            })?;
            self.second.other_port = lease.port.to_string();
            self.second.port = Some(lease);
        }
        std::mem::swap(&mut self.router, &mut self.second.router);
        std::mem::swap(&mut self.vars.port, &mut self.second.other_port);
        Ok(())
    }

    /// The connections deliveries of a `concurrent` step go to, in turn.
    pub(super) fn delivery_conns(&self, choice: RouterChoice) -> StepResult<Vec<Connection>> {
        let mut conns = vec![self.conn()?.clone()];
        if choice == RouterChoice::Both {
            let second = self.second.router.as_ref().map(|r| r.conn.clone()).ok_or_else(|| {
                StepError::Error(
                    "the second router process is not running (a killed router needs `do: restart` with `router: second`)".into(),
                )
            })?;
            conns.push(second);
        }
        Ok(conns)
    }

    /// Stops the second process, if it runs.
    pub(super) async fn stop_second(&mut self) {
        if self.second.router.is_some() && self.swap_second().is_ok() {
            self.stop().await;
            let _ = self.swap_second();
        }
    }

    /// Runs the profile's `setup` commands; `Err` is the reason, for a setup error.
    pub(super) async fn setup(&self) -> Result<(), Reason> {
        for (i, command) in self.profile.setup.iter().enumerate() {
            let program = self.vars.apply(&command.command);
            let run = tokio::process::Command::new(&program)
                .args(command.args.iter().map(|a| self.vars.apply(a)))
                .envs(command.env.iter().map(|(k, v)| (k, self.vars.apply(v))))
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output();
            let output = match tokio::time::timeout(SETUP_TIMEOUT, run).await {
                Err(_) => {
                    return Err(format!(
                        "the profile's setup[{i}] `{program}` did not finish within {SETUP_TIMEOUT:?}"
                    ));
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "failed to run the profile's setup[{i}] `{program}`: {e}"
                    ));
                }
                Ok(Ok(output)) => output,
            };
            if !output.status.success() {
                return Err(format!(
                    "the profile's setup[{i}] `{program}` exited with {}: {}",
                    output.status,
                    last_line(&String::from_utf8_lossy(&output.stderr))
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_slugs_are_unique_sql_identifiers() {
        let a = check_slug("concurrency.two-processes-one-registry");
        let b = check_slug("concurrency.two-processes-one-registry");
        assert_ne!(a, b);
        assert!(
            a.starts_with("concurrency_two_processes_one_registry_"),
            "{a}"
        );
        for slug in [a, check_slug(&"x.".repeat(80))] {
            assert!(slug.len() <= 53, "{slug}");
            assert!(slug.starts_with(|c: char| c.is_ascii_lowercase()), "{slug}");
            assert!(
                slug.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{slug}"
            );
        }
    }
}
