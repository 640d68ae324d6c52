//! Runs scenarios against one target and turns each into a verdict.
//!
//! For every scenario the runner starts the router on a fresh state directory (when it owns the
//! process), drives it with [`crate::jsonrpc`] (chosen ids, exact `_meta`, redelivery with a new
//! id), counts charges in its own provider's (or upstream's) ledger, and checks every
//! expectation of every step. Besides the written expectations, every step checks that no byte
//! of any response contains the private key prefix, and that a `tools/call` is never answered
//! with a JSON-RPC error. A step may go to a second process of the router on the same state, and
//! a profile's `setup` commands run before each scenario's router starts (`runner/second.rs`).
//!
//! # Layout
//! - `runner.rs`: the step interpreter, [`ScenarioRun`] and its per-step methods.
//! - `runner/process.rs`: the router process lifecycle (start, restart, kill, `{port}` leases,
//!   `initialize`, stderr tails).
//! - `runner/expect.rs`: the expectation checks of a step and the reasons they give.
//! - `runner/judge.rs`: which expectations a target can show, which are a rule's core, and when
//!   a run that broke nothing may pass.
//! - `runner/dispatches.rs`: dispatches counted apart from charges, and never two of one
//!   operation in flight at once.
//! - `runner/second.rs`: the second router process, `setup` commands, `{check_slug}`.
//!
//! # Verdicts
//! - `pass`: every expectation that could be checked held, and the rule's core was among them
//!   (`runner/judge.rs`).
//! - `fail`: an expectation did not hold; the reason names the step and what differed, a broken
//!   core expectation (a charge count, a refusal, the result) before a status or a handle.
//! - `skipped`: the profile declares absent what the scenario needs (`capabilities: {approval:
//!   false}`); never counted as passed.
//! - `not run`: the runner cannot run it against this target (it does not start the router, cannot
//!   count charges, the profile leaves a capability undeclared), or nothing of the rule's core
//!   could be checked (the profile declares absent every field it reads); never counted as
//!   passed, and the run is incomplete.
//! - `error`: the scenario could not finish (the router died outside a planned kill, a request
//!   timed out, an operator command failed); the run goes on with the next scenario.

use super::provider::RunnerProvider;
use super::scenario::{
    ArgumentSet, Arguments, CallIds, Expect, KillTrigger, Scenario, Step, expand,
};
use super::target::{Can, Profile, Transport, Vars};
use crate::jsonrpc::{Connection, Response, RpcError};
use expect::{check_schemas, describe, pointer, pointer_str};
use process::{PortLease, Process, Router, initialize, last_line, self_connect_http};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::time::Duration;

mod dispatches;
mod expect;
mod judge;
mod process;
mod second;
pub use second::{check_slug, router_of};

/// How long a request whose router is to be killed may take before the kill counts as missed.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// How the reason of a scenario whose router did not start begins.
pub const START_FAILED: &str = "starting the router";

/// The reason text of a verdict: a sentence for a person, shown as it is in every report and
/// never matched on. A type alias, not an error type: it has no cause to chain and no code of its
/// own (the [`Outcome`] variant is the code).
pub type Reason = String;

/// The outcome of one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every expectation held.
    Pass,
    /// An expectation did not hold.
    Fail(Reason),
    /// The profile declares absent what it needs.
    Skipped(Reason),
    /// The runner cannot run it against this target (the run is incomplete).
    NotRun(Reason),
    /// It could not finish.
    Error(Reason),
    /// The target is set up so that the check cannot judge it (a setup error for the run).
    Setup(Reason),
}

/// A fatal setup problem: the router program could not be started at all.
#[derive(Debug, thiserror::Error)]
#[error("failed to start the router `{program}`: {source}")]
pub struct StartError {
    /// The program.
    pub program: String,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// Hands out scenario progress (scenario index, step) to whoever displays it.
pub trait ProgressSink: Send + Sync {
    /// A step of the current scenario starts.
    fn step(&self, index: usize, kind: &str);
}

/// Why the scenario cannot be run against this target, if it cannot: [`Outcome::Skipped`] when
/// the check is written for the other kind of backend ([`Profile::backend_is`]) or every missing
/// capability is one the profile declares absent, [`Outcome::NotRun`] otherwise.
pub fn not_runnable(profile: &Profile, scenario: &Scenario) -> Option<Outcome> {
    // A check written for the other kind of backend does not apply, whatever else it needs.
    if let Some(want) = scenario.idempotent_backend
        && let Can::DeclaredAbsent(reason) = profile.backend_is(want)
    {
        return Some(Outcome::Skipped(reason));
    }
    let mut skipped: Vec<String> = Vec::new();
    let mut not_run: Vec<String> = Vec::new();
    let mut need = |can: Can| match can {
        Can::Yes => {}
        Can::DeclaredAbsent(r) => {
            if !skipped.contains(&r) {
                skipped.push(r);
            }
        }
        Can::Cannot(r) => {
            if !not_run.contains(&r) {
                not_run.push(r);
            }
        }
    };
    if scenario.signed_envelopes {
        need(profile.signed_envelopes());
    }
    for step in &scenario.steps {
        if router_of(profile, step) != super::scenario::RouterChoice::First {
            need(profile.shared_registry());
        }
        match step {
            Step::Restart(_) => need(profile.restart()),
            Step::Reconnect(_) => {
                if profile.transport == Transport::Stdio {
                    need(profile.restart());
                }
            }
            Step::Call(c) => {
                if c.kill.is_some() {
                    need(profile.kill());
                }
                if c.arguments.set == Some(ArgumentSet::Approval) {
                    need(profile.approval());
                }
                if c.provider_fails.is_some() || c.hold_ms > 0 {
                    need(profile.ledger());
                }
            }
            Step::Concurrent(c) => {
                if c.arguments.set == Some(ArgumentSet::Approval) {
                    need(profile.approval());
                }
            }
            Step::Approve(_) | Step::Deny(_) => need(profile.approval()),
            Step::Resolve(_) => need(profile.resolve()),
            Step::Status(_) if profile.tools.status.is_none() => need(Can::Cannot(
                "a status tool: the profile names none (`tools.status`)".into(),
            )),
            Step::Resume(_) if profile.tools.resume.is_none() => need(Can::Cannot(
                "a resume tool: the profile names none (`tools.resume`)".into(),
            )),
            Step::Status(_) | Step::Resume(_) | Step::Redeliver(_) | Step::ListTools(_) => {}
        }
        let names_a_handle = match step {
            Step::Status(s) | Step::Resume(s) => s.of.is_some(),
            Step::Approve(_) | Step::Deny(_) => true,
            _ => false,
        };
        if names_a_handle && profile.pointers.handle.is_none() {
            need(Can::DeclaredAbsent(
                "an operation's public handle to name it by: the profile declares `pointers.handle: null`".into(),
            ));
        }
        if step.expect().is_some_and(Expect::needs_ledger) {
            need(profile.ledger());
        }
    }
    if !not_run.is_empty() {
        not_run.extend(skipped);
        Some(Outcome::NotRun(not_run.join("; ")))
    } else if !skipped.is_empty() {
        Some(Outcome::Skipped(skipped.join("; ")))
    } else {
        None
    }
}

/// A `tools/call`: tool, arguments, `_meta`, and whether the arguments are written escaped.
type Params = (String, Value, Option<Value>, bool);

/// What a named step left behind for later steps.
#[derive(Debug, Clone, Default)]
struct Done {
    /// The `tools/call` params to redeliver.
    params: Option<Params>,
    handle: Option<String>,
    result: Option<Value>,
}

/// One scenario run's state.
pub struct ScenarioRun<'a> {
    profile: &'a Profile,
    provider: Option<&'a RunnerProvider>,
    scenario: &'a Scenario,
    vars: Vars,
    ids: CallIds,
    next_id: i64,
    router: Option<Router>,
    done: HashMap<String, Done>,
    baseline: u64,
    /// The second router process (`router: second`), started on first use.
    second: second::Second,
    /// What the run could check so far.
    judge: judge::Judge,
    /// The check's signing key (a scenario with `signed_envelopes: true`).
    signer: Option<super::signer::Signer>,
    _state: tempfile::TempDir,
    _port: PortLease,
}

/// A step's failure: a broken rule, a broken expectation that is not the rule's core or a
/// convention not followed (both reported only when no core expectation breaks later: the money
/// leads), or a scenario that could not go on.
enum StepError {
    Fail(String),
    /// A broken expectation that is not core ([`judge::Kind::is_core`]): the scenario goes on.
    Presentation(String),
    Cosmetic(String),
    Error(String),
    /// The target is set up wrong for this check (a wrapper survived SIGKILL): a setup error.
    Setup(String),
}

type StepResult<T = ()> = Result<T, StepError>;

fn fail<T>(message: impl Into<String>) -> StepResult<T> {
    Err(StepError::Fail(message.into()))
}

impl<'a> ScenarioRun<'a> {
    /// Prepares a run: a fresh state directory and the placeholder values.
    pub fn new(
        profile: &'a Profile,
        provider: Option<&'a RunnerProvider>,
        scenario: &'a Scenario,
        callid: &str,
    ) -> std::io::Result<Self> {
        let state = tempfile::Builder::new()
            .prefix("callid-conform-state-")
            .tempdir()?;
        let port = PortLease::take()?;
        let mut vars = Vars {
            callid: callid.to_string(),
            state_dir: state.path().display().to_string(),
            registry: state.path().join("registry.sqlite3").display().to_string(),
            provider_url: provider
                .map(RunnerProvider::provider_url)
                .unwrap_or_default(),
            port: port.port.to_string(),
            profile_dir: profile.dir.display().to_string(),
            handle: String::new(),
            outcome: String::new(),
            check_slug: check_slug(&scenario.id),
            upstream_url: provider
                .map(RunnerProvider::upstream_url)
                .unwrap_or_default(),
            upstream_argv: upstream_argv(provider, callid),
            trust_keys: String::new(),
            signing_public_key: String::new(),
        };
        if let Some(registry) = &profile.registry {
            vars.registry = vars.apply(registry);
        }
        let signer = if scenario.signed_envelopes {
            let signer = super::signer::Signer::new()?;
            vars.trust_keys = signer.trust_file().display().to_string();
            vars.signing_public_key = signer.public_key().to_string();
            Some(signer)
        } else {
            None
        };
        Ok(ScenarioRun {
            profile,
            provider,
            scenario,
            vars,
            ids: CallIds::new(),
            next_id: 1,
            router: None,
            done: HashMap::new(),
            baseline: 0,
            second: second::Second::default(),
            judge: judge::Judge::new(scenario),
            signer,
            _state: state,
            _port: port,
        })
    }

    /// Runs every step; the router is killed at the end whatever happened.
    pub async fn run(mut self, progress: &dyn ProgressSink) -> Result<Outcome, StartError> {
        if let Some(provider) = self.provider {
            provider.hooks().reset();
            if !self.profile.backend_idempotent() {
                provider.hooks().ignore_keys();
            }
            self.baseline = provider.charge_count().unwrap_or(0);
        }
        if let Err(reason) = self.setup().await {
            return Ok(Outcome::Setup(reason));
        }
        let outcome = match self.start().await {
            Err(StepError::Error(e)) if e.starts_with("spawn:") => {
                return Err(StartError {
                    program: self.profile.command.clone().unwrap_or_default(),
                    source: std::io::Error::other(
                        e.trim_start_matches("spawn:").trim().to_string(),
                    ),
                });
            }
            Err(StepError::Error(e) | StepError::Setup(e)) => {
                Outcome::Error(format!("{START_FAILED}: {e}"))
            }
            Err(StepError::Fail(e) | StepError::Presentation(e) | StepError::Cosmetic(e)) => {
                Outcome::Fail(format!("{START_FAILED}: {e}"))
            }
            Ok(()) => self.steps(progress).await,
        };
        self.stop().await;
        self.stop_second().await;
        Ok(outcome)
    }

    async fn steps(&mut self, progress: &dyn ProgressSink) -> Outcome {
        let scenario = self.scenario;
        let profile = self.profile;
        let pointers = &profile.pointers;
        // The first broken expectation that is not core, and the first convention not followed:
        // each the reason only when nothing core breaks in a later step.
        let mut presentation: Option<String> = None;
        let mut cosmetic: Option<String> = None;
        for (i, step) in scenario.steps.iter().enumerate() {
            progress.step(i, step.kind());
            let label = step_label(i, step);
            let result = self.step_on(step).await;
            if matches!(result, Ok(()) | Err(StepError::Cosmetic(_)))
                && let Some(expect) = step.expect()
            {
                self.judge.held(expect, pointers);
            }
            if let Err(e) = result {
                let also = |m: String| match presentation.as_ref().or(cosmetic.as_ref()) {
                    Some(c) => format!("{label}: {m} (also {c})"),
                    None => format!("{label}: {m}"),
                };
                match e {
                    StepError::Setup(m) => return Outcome::Setup(format!("{label}: {m}")),
                    StepError::Fail(m) => return Outcome::Fail(also(m)),
                    StepError::Error(_) if presentation.is_some() => break,
                    StepError::Error(m) => return Outcome::Error(also(m)),
                    StepError::Presentation(m) => {
                        presentation.get_or_insert(format!("{label}: {m}"));
                    }
                    StepError::Cosmetic(m) => {
                        cosmetic.get_or_insert(format!("{label}: {m}"));
                    }
                }
            }
        }
        match (presentation, cosmetic, self.judge.not_run()) {
            (Some(p), _, _) => Outcome::Fail(p),
            (None, Some(c), _) => Outcome::Fail(c),
            (None, None, Some(reason)) => Outcome::NotRun(reason),
            (None, None, None) => Outcome::Pass,
        }
    }

    async fn step(&mut self, step: &Step) -> StepResult {
        match step {
            Step::Call(s) => {
                let params = self.params(&s.meta, &s.arguments, None, s.sign);
                let id = self.id(s.jsonrpc_id.clone());
                if let (Some(status), Some(provider)) = (s.provider_fails, self.provider) {
                    provider.hooks().fail_next(status);
                }
                if let (true, Some(provider)) = (s.hold_ms > 0, self.provider) {
                    provider.hooks().hold_next(Duration::from_millis(s.hold_ms));
                }
                let response = match s.kill {
                    Some(trigger) => self.call_killed(trigger, id, &params).await?,
                    None => Some(self.call(id, &params).await?),
                };
                if s.expect.no_reply == Some(true) && response.is_some() {
                    return fail(format!(
                        "expected no reply (the router is killed at the {})",
                        self.role()
                    ));
                }
                self.after(
                    s.name.as_deref(),
                    Some(params),
                    response.as_ref(),
                    &s.expect,
                )
            }
            Step::Redeliver(s) => {
                let Some(params) = self.done.get(&s.of).and_then(|d| d.params.clone()) else {
                    return Err(StepError::Error(format!(
                        "step `{}` sent no call to redeliver",
                        s.of
                    )));
                };
                let id = self.id(s.jsonrpc_id.clone());
                let response = self.call(id, &params).await?;
                self.after(s.name.as_deref(), Some(params), Some(&response), &s.expect)
            }
            Step::Concurrent(s) => self.concurrent(s).await,
            Step::Status(s) | Step::Resume(s) => {
                let tool = match step {
                    Step::Status(_) => self.profile.tools.status.clone(),
                    _ => self.profile.tools.resume.clone(),
                }
                .expect("checked by not_runnable");
                let handle = match (&s.of, &s.handle) {
                    (Some(of), _) => self.handle_of(of)?,
                    (None, Some(h)) => h.clone(),
                    (None, None) => unreachable!("validated on load"),
                };
                let params = (tool, json!({"handle": handle}), None, false);
                let id = self.id(None);
                let response = self.call(id, &params).await?;
                self.after(s.name.as_deref(), None, Some(&response), &s.expect)
            }
            Step::Approve(s) | Step::Deny(s) => {
                let handle = self.handle_of(&s.of)?;
                let command = match step {
                    Step::Approve(_) => self.profile.approve.clone(),
                    _ => self.profile.deny.clone(),
                }
                .expect("checked by not_runnable");
                self.operator(step.kind(), &command, &handle, "").await
            }
            Step::Resolve(s) => {
                let handle = self.handle_of(&s.of)?;
                let command = self
                    .profile
                    .resolve
                    .clone()
                    .expect("checked by not_runnable");
                let outcome = if s.charged { "charged" } else { "not-charged" };
                self.operator(step.kind(), &command, &handle, outcome).await
            }
            Step::Restart(s) => {
                self.stop_router(s.graceful).await;
                self.start().await
            }
            Step::Reconnect(_) => {
                if self.profile.transport == Transport::Http {
                    if let Some(router) = &mut self.router {
                        router.conn.close().await;
                        router.conn = self_connect_http(self.profile, &self.vars).await?;
                        let id = json!(self.next_id);
                        self.next_id += 1;
                        initialize(&router.conn, id, &self.scenario.protocol).await?;
                    }
                    Ok(())
                } else {
                    self.stop_router(true).await;
                    self.start().await
                }
            }
            Step::ListTools(s) => {
                let id = self.id(None);
                let response = self
                    .conn()?
                    .request(id, "tools/list", json!({}))
                    .await
                    .map_err(|e| self.transport_error(e))?;
                self.scan(&response)?;
                if s.expect.no_identity_fields == Some(true) {
                    check_schemas(&response, &self.profile.tools.spend)?;
                }
                Ok(())
            }
        }
    }

    /// The runner's role behind the router (`provider` or `upstream`), for messages.
    fn role(&self) -> &'static str {
        self.provider
            .map_or(self.profile.backend, RunnerProvider::role)
            .name()
    }

    fn id(&mut self, explicit: Option<Value>) -> Value {
        explicit.unwrap_or_else(|| {
            let id = self.next_id;
            self.next_id += 1;
            json!(id)
        })
    }

    fn conn(&self) -> StepResult<&Connection> {
        self.router.as_ref().map(|r| &r.conn).ok_or_else(|| {
            StepError::Error(
                "the router is not running (a killed router needs `do: restart`)".into(),
            )
        })
    }

    fn params(
        &mut self,
        meta: &Option<Map<String, Value>>,
        arguments: &Arguments,
        tool: Option<&str>,
        sign: Option<super::signer::SignAs>,
    ) -> Params {
        let args = match (&arguments.set, &arguments.literal) {
            (_, Some(literal)) => literal.clone(),
            (Some(set), None) => {
                let sets = &self.profile.arguments;
                let mut base = match set {
                    ArgumentSet::Spend => sets.spend.clone(),
                    ArgumentSet::Other => sets.other.clone(),
                    ArgumentSet::Approval => sets.approval.clone().unwrap_or_default(),
                };
                for (k, v) in arguments.add.iter().flatten() {
                    base.insert(k.clone(), v.clone());
                }
                Value::Object(base)
            }
            (None, None) => unreachable!("validated on load"),
        };
        let mut args = expand(&args, &mut self.ids);
        if let Some(form) = arguments.form {
            args = form.apply(&args);
        }
        let mut meta = meta
            .as_ref()
            .map(|m| expand(&Value::Object(m.clone()), &mut self.ids));
        if let (Some(how), Some(signer), Some(Value::Object(m))) =
            (sign, &self.signer, meta.as_mut())
            && let Some(jws) = m
                .get(crate::identity::ENVELOPE_KEY)
                .and_then(|e| signer.sign(e, how, crate::identity::trust::now_secs()))
        {
            m.insert(
                crate::identity::signature::SIGNATURE_KEY.into(),
                Value::String(jws),
            );
        }
        (
            tool.unwrap_or(&self.profile.tools.spend).to_string(),
            args,
            meta,
            arguments.form == Some(super::scenario::Form::Escaped),
        )
    }

    async fn call(&self, id: Value, params: &Params) -> StepResult<Response> {
        let (tool, args, meta, escaped) = params;
        let sent = if *escaped {
            let text = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":{},"arguments":{}{}}}}}"#,
                id,
                json!(tool),
                super::scenario::escaped_json(args),
                meta.as_ref()
                    .map(|m| format!(r#","_meta":{m}"#))
                    .unwrap_or_default()
            );
            self.conn()?.request_text(id, "tools/call", &text).await
        } else {
            self.conn()?
                .call_tool(id, tool, args.clone(), meta.clone())
                .await
        };
        let response = sent.map_err(|e| self.transport_error(e))?;
        self.scan(&response)?;
        Ok(response)
    }

    /// A call during which the provider kills the router; `None` when it died without replying.
    async fn call_killed(
        &mut self,
        trigger: KillTrigger,
        id: Value,
        params: &Params,
    ) -> StepResult<Option<Response>> {
        let provider = self.provider.expect("checked by not_runnable");
        let pid = self
            .router
            .as_ref()
            .and_then(|r| r.process.as_ref())
            .and_then(Process::pid)
            .ok_or_else(|| StepError::Error("the router process has no pid to kill".into()))?;
        provider.hooks().arm_kill(trigger, pid);
        let (tool, args, meta, _) = params;
        let mut conn = self.conn()?.clone();
        conn.set_timeout(KILL_TIMEOUT);
        let result = conn.call_tool(id, tool, args.clone(), meta.clone()).await;
        let killed = provider.hooks().disarm_kill();
        match result {
            Ok(response) => {
                self.scan(&response)?;
                if killed && self.still_answers().await {
                    return Err(StepError::Setup(format!(
                        "the runner killed the router's process group with SIGKILL at `{}`, yet the process that answers survived and replied: the profile's command is probably a wrapper that starts the router in a new session or process group without `exec`; start the router itself, or `exec` it from the wrapper",
                        trigger_name(trigger)
                    )));
                }
                if killed {
                    // The router died after writing this reply: possible only if it replied
                    // before the provider answered, which is itself a broken rule.
                    return fail(format!(
                        "the router answered before the {}'s reply reached it: {}",
                        self.role(),
                        describe(&response, &self.profile.pointers.error)
                    ));
                }
                fail(format!(
                    "the router answered without reaching the {}'s kill trigger `{}`: {}",
                    self.role(),
                    trigger_name(trigger),
                    describe(&response, &self.profile.pointers.error)
                ))
            }
            // Over stdio the pipe closes; over HTTP the response body breaks off.
            Err(RpcError::Closed { .. } | RpcError::Http { .. } | RpcError::Io(_)) if killed => {
                if let Some(router) = &mut self.router
                    && let Some(p) = &mut router.process
                {
                    p.kill9().await;
                }
                self.router = None;
                Ok(None)
            }
            Err(e) => Err(self.transport_error(e)),
        }
    }

    /// Whether something still answers on the connection of a router that was just killed.
    async fn still_answers(&mut self) -> bool {
        let Ok(conn) = self.conn() else {
            return false;
        };
        let mut conn = conn.clone();
        conn.set_timeout(Duration::from_secs(2));
        let id = self.id(None);
        conn.request(id, "ping", json!({})).await.is_ok()
    }

    /// `count` deliveries of one call at once. With `router: both` and a hold, the first
    /// delivery goes alone to the first process until its dispatch reaches the backend, then the
    /// rest alternate (second process first), and the hold ends on an observed event: a second
    /// dispatch of the operation arrived, or the second process answered every delivery it got.
    /// `hold_ms` is then only the ceiling: reaching it ends the hold like any other, and the
    /// step is judged as usual (a second dispatch in flight beside the held one fails it,
    /// `runner/dispatches.rs`). A process that waits for the other's dispatch passes, up to the
    /// ceiling later; one that ignores the lease only after the ceiling is not seen overlapping.
    async fn concurrent(&mut self, s: &super::scenario::ConcurrentStep) -> StepResult {
        let params = self.params(&s.meta, &s.arguments, None, None);
        let conns = self.delivery_conns(s.router)?;
        let ceiling = Duration::from_millis(s.hold_ms);
        let observed = match self.provider {
            Some(p) if s.hold_ms > 0 && conns.len() > 1 => {
                p.hooks().hold_until_released(ceiling);
                Some(p)
            }
            Some(p) if s.hold_ms > 0 => {
                p.hooks().hold_next(ceiling);
                None
            }
            _ => None,
        };
        let ids: Vec<Value> = (0..s.count).map(|_| self.id(None)).collect();
        let mut set = tokio::task::JoinSet::new();
        let spawn = |set: &mut tokio::task::JoinSet<_>, i: usize| {
            let conn: Connection = conns[i % conns.len()].clone();
            let (id, (tool, args, meta, _)) = (ids[i].clone(), params.clone());
            set.spawn(async move { (i, conn.call_tool(id, &tool, args, meta).await) });
        };
        spawn(&mut set, 0);
        let mut joined_early = None;
        if let Some(p) = observed {
            tokio::select! {
                () = p.hooks().dispatch_seen() => {}
                joined = set.join_next() => joined_early = joined,
                () = tokio::time::sleep(ceiling) => {}
            }
        }
        for i in 1..s.count as usize {
            spawn(&mut set, i);
        }
        // Deliveries to the processes the first delivery did not go to, still unanswered.
        let mut others_left = (1..s.count as usize)
            .filter(|i| i % conns.len() != 0)
            .count();
        let mut responses = Vec::new();
        while let Some(joined) = match joined_early.take() {
            Some(joined) => Some(joined),
            None => set.join_next().await,
        } {
            let (i, result) =
                joined.map_err(|e| StepError::Error(format!("delivery task failed: {e}")))?;
            if i % conns.len() != 0 {
                others_left -= 1;
                if let (0, Some(p)) = (others_left, observed) {
                    p.hooks().release();
                }
            }
            let response = result.map_err(|e| self.transport_error(e))?;
            self.scan(&response)?;
            responses.push(response);
        }
        let pointers = &self.profile.pointers;
        let mut handles: Vec<String> = Vec::new();
        let mut successes = 0;
        let mut first_ok: Option<&Response> = None;
        for r in &responses {
            if r.error.is_some() {
                return fail(format!(
                    "a delivery got a JSON-RPC error instead of a tool result: {}",
                    describe(r, &pointers.error)
                ));
            }
            let handle = pointers.handle.as_deref().and_then(|at| pointer_str(r, at));
            if r.is_tool_error() {
                let code = pointer_str(r, &pointers.error).unwrap_or_default();
                if s.expect.one_operation == Some(true)
                    && code != self.profile.error_code("operation_in_progress")
                {
                    return fail(format!(
                        "a delivery was refused with `{code}`; concurrent deliveries of one call may only succeed or answer `operation_in_progress`"
                    ));
                }
            } else {
                successes += 1;
                first_ok.get_or_insert(r);
            }
            if let Some(h) = handle
                && !handles.contains(&h)
            {
                handles.push(h);
            }
        }
        if s.expect.one_operation == Some(true) {
            if handles.len() > 1 {
                return fail(format!(
                    "{} deliveries of one call answered {} different handles: {} operations for one call",
                    s.count,
                    handles.len(),
                    handles.len()
                ));
            }
            if successes == 0 {
                return fail(format!("none of {} deliveries succeeded", s.count));
            }
        }
        let mut expect = s.expect.clone();
        expect.one_operation = None;
        self.check_ledger(&expect)?;
        if let Some(name) = &s.name {
            self.done.insert(
                name.clone(),
                Done {
                    params: Some(params),
                    handle: handles.first().cloned(),
                    result: first_ok.and_then(|r| pointer(r, &pointers.result).cloned()),
                },
            );
        }
        Ok(())
    }

    fn handle_of(&self, name: &str) -> StepResult<String> {
        self.done
            .get(name)
            .and_then(|d| d.handle.clone())
            .ok_or_else(|| StepError::Fail(format!("step `{name}` got no handle to use")))
    }

    async fn operator(
        &mut self,
        verb: &str,
        command: &super::target::OperatorCommand,
        handle: &str,
        outcome: &str,
    ) -> StepResult {
        let mut vars = self.vars.clone();
        vars.handle = handle.to_string();
        vars.outcome = outcome.to_string();
        let program = vars.apply(&command.command);
        let output = tokio::process::Command::new(&program)
            .args(command.args.iter().map(|a| vars.apply(a)))
            .envs(command.env.iter().map(|(k, v)| (k, vars.apply(v))))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| {
                StepError::Error(format!("failed to run the {verb} command `{program}`: {e}"))
            })?;
        if !output.status.success() {
            return Err(StepError::Error(format!(
                "the {verb} command exited with {}: {}",
                output.status,
                last_line(&String::from_utf8_lossy(&output.stderr))
            )));
        }
        Ok(())
    }

    /// Checks `expect` against `response` and records the step under `name`.
    fn after(
        &mut self,
        name: Option<&str>,
        params: Option<Params>,
        response: Option<&Response>,
        expect: &Expect,
    ) -> StepResult {
        let pointers = &self.profile.pointers;
        let handle = pointers
            .handle
            .as_deref()
            .and_then(|at| response.and_then(|r| pointer_str(r, at)));
        let result = response.and_then(|r| pointer(r, &pointers.result).cloned());
        // Money first: a double charge is the reason, not a missing marker.
        self.check_ledger_with(expect, response)?;
        let checked = match response {
            Some(r) => self.check_response(r, expect, handle.as_deref(), result.as_ref()),
            None => Ok(()),
        };
        if let Some(name) = name {
            self.done.insert(
                name.to_string(),
                Done {
                    params,
                    handle,
                    result,
                },
            );
        }
        checked
    }
}

/// `{upstream_argv}`: the stdio relay to the runner's upstream (empty in the provider role).
fn upstream_argv(provider: Option<&RunnerProvider>, callid: &str) -> Vec<String> {
    match provider {
        Some(p) if p.role() == super::target::Backend::Upstream => {
            super::upstream::relay_argv(callid, &p.url())
        }
        _ => Vec::new(),
    }
}

fn step_label(i: usize, step: &Step) -> String {
    let name = match step {
        Step::Call(s) => s.name.as_deref(),
        Step::Redeliver(s) => s.name.as_deref().or(Some(s.of.as_str())),
        Step::Concurrent(s) => s.name.as_deref(),
        Step::Status(s) | Step::Resume(s) => s.name.as_deref().or(s.of.as_deref()),
        Step::Approve(s) | Step::Deny(s) => Some(s.of.as_str()),
        Step::Resolve(s) => Some(s.of.as_str()),
        _ => None,
    };
    match name {
        Some(n) => format!("steps[{i}] ({} `{n}`)", step.kind()),
        None => format!("steps[{i}] ({})", step.kind()),
    }
}

fn trigger_name(t: KillTrigger) -> &'static str {
    match t {
        KillTrigger::BeforeCharge => "before_charge",
        KillTrigger::AfterCharge => "after_charge",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_only_when_declared_absent_otherwise_not_run() {
        use crate::conform::scenario::parse;
        use std::path::Path;
        let scenario = |steps: &str| {
            parse(
                &format!("id: a.b\ntitle: t\nrule: r\narticle: q\nsteps:\n{steps}"),
                Path::new("x.yaml"),
            )
            .unwrap()
        };
        let reference = Profile::reference();
        let url = Profile::url("http://127.0.0.1:9/mcp");
        let mut no_restart = Profile::reference();
        no_restart.capabilities.restart = Some(false);
        let mut undeclared = Profile::reference();
        undeclared.capabilities.approval = None;
        let mut alone = Profile::reference();
        alone.capabilities.shared_registry = Some(false);
        let mut replicated = Profile::reference();
        replicated.redeliver_on_second = true;
        replicated.capabilities.shared_registry = None;
        let skip = |r: &str| Some(Outcome::Skipped(r.to_string()));
        let not_run = |r: &str| Some(Outcome::NotRun(r.to_string()));
        let cases: Vec<(&Profile, &str, Option<Outcome>)> = vec![
            (
                &reference,
                "  - do: restart\n  - {do: call, kill: after_charge}\n",
                None,
            ),
            (&url, "  - do: list_tools\n", None),
            (
                &url,
                "  - {do: call, expect: {error: missing_identity}}\n",
                None,
            ),
            (
                &url,
                "  - {do: call, expect: {charges: 0}}\n",
                not_run(
                    "charges cannot be counted: the router does not use the runner's provider or upstream (start it from the profile with `{provider_url}`, or `backend: upstream` and `{upstream_url}` / `{upstream_argv}`; or set `provider_listen` and point the router there)",
                ),
            ),
            (&url, "  - do: reconnect\n", None),
            (
                &no_restart,
                "  - do: reconnect\n  - do: restart\n",
                skip(
                    "restarting the router on the same state: the profile declares `capabilities.restart: false`",
                ),
            ),
            (
                &undeclared,
                "  - {do: call, name: a, arguments: {set: approval}}\n  - {do: approve, of: a}\n",
                not_run(
                    "an approval policy: the profile does not declare `capabilities.approval`; set it to true (with `approve`, `deny`, `arguments.approval`, `tools.resume`), or to false to skip these checks",
                ),
            ),
            (
                &url,
                "  - {do: call, kill: before_charge}\n",
                not_run(
                    "killing the router (kill -9): the runner does not start this router (no `command` in the profile, or `--url`), so it cannot do that",
                ),
            ),
        ];
        let cases = cases.into_iter().chain([
            (&reference, "  - {do: concurrent, count: 2, router: both}\n", None),
            (
                &alone,
                "  - {do: call, name: a}\n  - {do: redeliver, of: a, router: second}\n",
                skip(
                    "a second router process on the same registry: the profile declares `capabilities.shared_registry: false`",
                ),
            ),
            (&alone, "  - {do: call, name: a}\n  - {do: redeliver, of: a}\n", None),
            (
                &replicated,
                "  - {do: call, name: a}\n  - {do: redeliver, of: a}\n",
                not_run(
                    "a second router process on the same registry: the profile does not declare `capabilities.shared_registry`; set it to true, or to false to skip these checks",
                ),
            ),
        ]);
        for (profile, steps, want) in cases {
            assert_eq!(not_runnable(profile, &scenario(steps)), want, "{steps}");
        }
        let signed = parse(
            "id: a.b\ntitle: t\nrule: r\narticle: q\nsigned_envelopes: true\nsteps:\n  - do: call\n",
            Path::new("x.yaml"),
        )
        .unwrap();
        assert_eq!(not_runnable(&reference, &signed), None);
        assert!(matches!(
            not_runnable(&url, &signed),
            Some(Outcome::Skipped(r)) if r.contains("does not declare `signed_envelopes`")
        ));
        assert!(matches!(
            not_runnable(&reference.clone().at_url("http://127.0.0.1:9/mcp"), &signed),
            Some(Outcome::NotRun(r)) if r.contains("cannot hand it the check's key")
        ));
    }
}
