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
//! # Verdicts
//! - `pass`: every expectation held.
//! - `fail`: an expectation did not hold; the reason names the step and what differed.
//! - `skipped`: the profile declares absent what the scenario needs (`capabilities: {approval:
//!   false}`); never counted as passed.
//! - `not run`: the runner cannot run it against this target (it does not start the router, cannot
//!   count charges, the profile leaves a capability undeclared); never counted as passed, and the
//!   run is incomplete.
//! - `error`: the scenario could not finish (the router died outside a planned kill, a request
//!   timed out, an operator command failed); the run goes on with the next scenario.

use super::provider::RunnerProvider;
use super::scenario::{
    ArgumentSet, Arguments, CallIds, Expect, KillTrigger, Scenario, Step, expand,
};
use super::target::{Can, Profile, Transport, Vars};
use crate::jsonrpc::{Child, Connection, Response, RpcError};
use crate::text::{clip, cut};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

mod second;
pub use second::{check_slug, router_of};

/// How long one request may take before the scenario errors.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request whose router is to be killed may take before the kill counts as missed.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP router started by the runner may take to answer.
const HTTP_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a router may take to exit after its stdin closes.
const GRACEFUL_EXIT: Duration = Duration::from_secs(3);

/// How the reason of a scenario whose router did not start begins.
pub const START_FAILED: &str = "starting the router";

/// The outcome of one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every expectation held.
    Pass,
    /// An expectation did not hold.
    Fail(String),
    /// The profile declares absent what it needs.
    Skipped(String),
    /// The runner cannot run it against this target (the run is incomplete).
    NotRun(String),
    /// It could not finish.
    Error(String),
    /// The target is set up so that the check cannot judge it (a setup error for the run).
    Setup(String),
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
/// every missing capability is one the profile declares absent, [`Outcome::NotRun`] otherwise.
pub fn not_runnable(profile: &Profile, scenario: &Scenario) -> Option<Outcome> {
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
                if c.provider_fails.is_some() {
                    need(profile.ledger());
                }
            }
            Step::Concurrent(c) => {
                if c.arguments.set == Some(ArgumentSet::Approval) {
                    need(profile.approval());
                }
            }
            Step::Approve(_) | Step::Deny(_) => need(profile.approval()),
            Step::Status(_) if profile.tools.status.is_none() => need(Can::Cannot(
                "a status tool: the profile names none (`tools.status`)".into(),
            )),
            Step::Resume(_) if profile.tools.resume.is_none() => need(Can::Cannot(
                "a resume tool: the profile names none (`tools.resume`)".into(),
            )),
            Step::Status(_) | Step::Resume(_) | Step::Redeliver(_) | Step::ListTools(_) => {}
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

/// The router the runner drives: its connection and (when the runner owns it) its process.
struct Router {
    conn: Connection,
    process: Option<Process>,
}

enum Process {
    Stdio(Child),
    Http(tokio::process::Child),
}

impl Process {
    fn pid(&self) -> Option<u32> {
        match self {
            Process::Stdio(c) => c.pid(),
            Process::Http(c) => c.id(),
        }
    }

    /// SIGKILL to its whole process group, then to it (and reaped).
    async fn kill9(&mut self) {
        if let Some(pid) = self.pid() {
            super::provider::sigkill(pid);
        }
        let _ = match self {
            Process::Stdio(c) => c.kill9().await,
            Process::Http(c) => c.kill().await,
        };
    }

    fn stderr_tail(&self) -> String {
        match self {
            Process::Stdio(c) => tail(&c.stderr_text()),
            Process::Http(_) => String::new(),
        }
    }
}

/// The last lines of a program's stderr (up to 8 non-empty lines, 800 bytes), on one line each
/// joined by ` | `: a traceback or a panic names its problem a few lines above its last line.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let mut kept: Vec<&str> = Vec::new();
    let mut size = 0;
    for line in lines.iter().rev().take(8) {
        size += line.len() + 3;
        if size > 800 && !kept.is_empty() {
            break;
        }
        kept.push(line);
    }
    kept.reverse();
    clip(&kept.join(" | "), 800)
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| clip(l.trim(), 200))
        .unwrap_or_default()
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
    _state: tempfile::TempDir,
    _port: PortLease,
}

/// A step's failure: a broken rule, a convention not followed (reported only when no rule
/// breaks later: the money leads), or a scenario that could not go on.
enum StepError {
    Fail(String),
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
            check_slug: check_slug(&scenario.id),
            upstream_url: provider
                .map(RunnerProvider::upstream_url)
                .unwrap_or_default(),
            upstream_argv: upstream_argv(provider, callid),
        };
        if let Some(registry) = &profile.registry {
            vars.registry = vars.apply(registry);
        }
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
            _state: state,
            _port: port,
        })
    }

    /// Runs every step; the router is killed at the end whatever happened.
    pub async fn run(mut self, progress: &dyn ProgressSink) -> Result<Outcome, StartError> {
        if let Some(provider) = self.provider {
            provider.hooks().reset();
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
            Err(StepError::Fail(e) | StepError::Cosmetic(e)) => {
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
        let mut cosmetic: Option<String> = None;
        for (i, step) in scenario.steps.iter().enumerate() {
            progress.step(i, step.kind());
            let label = step_label(i, step);
            if let Err(e) = self.step_on(step).await {
                let also = |m: String| match &cosmetic {
                    Some(c) => format!("{label}: {m} (also {c})"),
                    None => format!("{label}: {m}"),
                };
                match e {
                    StepError::Setup(m) => return Outcome::Setup(format!("{label}: {m}")),
                    StepError::Fail(m) => return Outcome::Fail(also(m)),
                    StepError::Error(m) => return Outcome::Error(also(m)),
                    StepError::Cosmetic(m) => {
                        cosmetic.get_or_insert(format!("{label}: {m}"));
                    }
                }
            }
        }
        match cosmetic {
            Some(c) => Outcome::Fail(c),
            None => Outcome::Pass,
        }
    }

    async fn step(&mut self, step: &Step) -> StepResult {
        match step {
            Step::Call(s) => {
                let params = self.params(&s.meta, &s.arguments, None);
                let id = self.id(s.jsonrpc_id.clone());
                if let (Some(status), Some(provider)) = (s.provider_fails, self.provider) {
                    provider.hooks().fail_next(status);
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
                self.operator(step.kind(), &command, &handle).await
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
        let meta = meta
            .as_ref()
            .map(|m| expand(&Value::Object(m.clone()), &mut self.ids));
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

    async fn concurrent(&mut self, s: &super::scenario::ConcurrentStep) -> StepResult {
        let params = self.params(&s.meta, &s.arguments, None);
        if s.hold_ms > 0
            && let Some(p) = self.provider
        {
            p.hooks().hold_next(Duration::from_millis(s.hold_ms));
        }
        let conns = self.delivery_conns(s.router)?;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..s.count as usize {
            let id = self.id(None);
            let conn = conns[i % conns.len()].clone();
            let (tool, args, meta, _) = params.clone();
            set.spawn(async move { conn.call_tool(id, &tool, args, meta).await });
        }
        let mut responses = Vec::new();
        while let Some(joined) = set.join_next().await {
            let result =
                joined.map_err(|e| StepError::Error(format!("delivery task failed: {e}")))?;
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
            let handle = pointer_str(r, &pointers.handle);
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
    ) -> StepResult {
        let mut vars = self.vars.clone();
        vars.handle = handle.to_string();
        let program = vars.apply(&command.command);
        let output = tokio::process::Command::new(&program)
            .args(command.args.iter().map(|a| vars.apply(a)))
            .envs(command.env.iter().map(|(k, v)| (k, vars.apply(v))))
            .stdin(std::process::Stdio::null())
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
        let handle = response.and_then(|r| pointer_str(r, &pointers.handle));
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

    fn check_response(
        &self,
        r: &Response,
        expect: &Expect,
        handle: Option<&str>,
        result: Option<&Value>,
    ) -> StepResult {
        let pointers = &self.profile.pointers;
        let profile = self.profile;
        // Conventions (a code's name, a status word, the replay marker) are checked after the
        // rules, so a broken rule is the reason whenever both break.
        let mut cosmetic: Option<String> = None;
        if let Some(error) = &r.error {
            return fail(format!(
                "answered a JSON-RPC error ({}) where the contract requires a tool result",
                clip(&error.to_string(), 200)
            ));
        }
        if r.tool_result().is_none() {
            return fail("the response has neither `result` nor `error`");
        }
        let code = pointer_str(r, &pointers.error);
        if let Some(want) = expect.ok {
            if want && r.is_tool_error() {
                return fail(format!(
                    "expected success, got {}",
                    describe(r, &pointers.error)
                ));
            }
            if !want && !r.is_tool_error() {
                return fail("expected a tool error, got success");
            }
        }
        for (want, named) in [
            (
                expect.error.as_deref().map(|w| profile.error_code(w)),
                false,
            ),
            (expect.error_named.as_deref(), true),
        ] {
            let Some(want) = want else { continue };
            if !r.is_tool_error() {
                return fail(format!(
                    "expected the tool error `{want}`, got success{}",
                    handle
                        .map(|h| format!(" with handle `{h}`"))
                        .unwrap_or_default()
                ));
            }
            if code.as_deref() != Some(want) {
                let message = format!(
                    "expected the tool error `{want}`{}, got {}",
                    if named { " (callid's name for it)" } else { "" },
                    describe(r, &pointers.error)
                );
                if named {
                    cosmetic.get_or_insert(message);
                } else {
                    return fail(message);
                }
            }
        }
        if let Some(want) = &expect.status {
            let want = profile.status_word(want);
            let got = pointer_str(r, &pointers.status);
            if got.as_deref() != Some(want) {
                return fail(format!(
                    "expected status `{want}`, got {}",
                    got.map(|g| format!("`{g}`"))
                        .unwrap_or_else(|| format!("none at `{}`", pointers.status))
                ));
            }
        }
        if let Some(want) = expect.replayed {
            match &pointers.replayed {
                None => {
                    cosmetic.get_or_insert(
                        "the profile names no replay marker (`pointers.replayed: null`)".into(),
                    );
                }
                Some(at) => {
                    let got = pointer(r, at);
                    if got.and_then(Value::as_bool) != Some(want) {
                        cosmetic.get_or_insert(format!(
                            "expected the replay flag at `{at}` to be {want}, got {}",
                            got.map(|g| format!("`{g}`"))
                                .unwrap_or_else(|| "none".into())
                        ));
                    }
                }
            }
        }
        if let Some(want) = expect.has_handle
            && want != handle.is_some()
        {
            return fail(if want {
                format!(
                    "expected a public handle at `{}`, found none",
                    pointers.handle
                )
            } else {
                format!("expected no handle, got `{}`", handle.unwrap_or_default())
            });
        }
        if let Some(other) = &expect.same_handle_as {
            let theirs = self.done.get(other).and_then(|d| d.handle.as_deref());
            match (handle, theirs) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    return fail(format!(
                        "expected the handle of `{other}` (`{b}`), got `{a}`: a second operation"
                    ));
                }
                (None, _) => {
                    return fail(format!(
                        "expected the handle of `{other}`, got no handle ({})",
                        describe(r, &pointers.error)
                    ));
                }
                (Some(_), None) => {
                    return fail(format!("step `{other}` has no handle to compare with"));
                }
            }
        }
        for other in &expect.different_handle_from {
            let theirs = self.done.get(other).and_then(|d| d.handle.as_deref());
            match (handle, theirs) {
                (Some(a), Some(b)) if a == b => {
                    return fail(format!(
                        "expected a new operation, got the handle of `{other}` (`{a}`): two calls collapsed into one"
                    ));
                }
                (Some(_), Some(_)) => {}
                (None, _) => {
                    return fail(format!(
                        "expected a new operation with its own handle, got no handle ({})",
                        describe(r, &pointers.error)
                    ));
                }
                (Some(_), None) => {
                    return fail(format!("step `{other}` has no handle to compare with"));
                }
            }
        }
        if let Some(other) = &expect.result_equals {
            let theirs = self.done.get(other).and_then(|d| d.result.as_ref());
            match (result, theirs) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    return fail(format!(
                        "the result differs from `{other}`'s: {}",
                        first_difference(b, a, "")
                    ));
                }
                _ => {
                    return fail(format!(
                        "no result at `{}` to compare with `{other}`'s",
                        pointers.result
                    ));
                }
            }
        }
        match cosmetic {
            Some(c) => Err(StepError::Cosmetic(c)),
            None => Ok(()),
        }
    }

    fn check_ledger(&self, expect: &Expect) -> StepResult {
        self.check_ledger_with(expect, None)
    }

    fn check_ledger_with(&self, expect: &Expect, response: Option<&Response>) -> StepResult {
        if !expect.needs_ledger() {
            return Ok(());
        }
        let provider = self.provider.expect("checked by not_runnable");
        let ledger_error =
            |e: String| StepError::Error(format!("reading the runner's ledger failed: {e}"));
        if let Some(want) = expect.charges {
            let got = provider.charge_count().map_err(ledger_error)? - self.baseline;
            if got != want {
                return fail(format!(
                    "the {} recorded {got} charge(s) in this scenario, expected {want}",
                    provider.role().name()
                ));
            }
        }
        if expect.charge_in_ledger == Some(true) {
            let pointer_at = &self.profile.pointers.charge_id;
            let Some(charge) = response.and_then(|r| pointer_str(r, pointer_at)) else {
                return fail(format!("no charge id at `{pointer_at}` in the result"));
            };
            let ids = provider.charge_ids().map_err(ledger_error)?;
            if !ids.contains(&charge) {
                return fail(format!(
                    "the result's charge id `{charge}` is not a charge the {} recorded",
                    provider.role().name()
                ));
            }
        }
        if expect.provider_keys_not_private == Some(true) {
            let prefix = &self.profile.private_key_prefix;
            if let Some(key) = provider
                .hooks()
                .keys_seen()
                .iter()
                .find(|k| k.contains(prefix.as_str()))
            {
                return fail(format!(
                    "the {} received the private operation key as its idempotency key (`{}`)",
                    provider.role().name(),
                    clip(key, 40)
                ));
            }
        }
        if expect.provider_one_key == Some(true) {
            let mut keys = provider.hooks().keys_seen();
            keys.sort();
            keys.dedup();
            if keys.len() > 1 {
                return fail(format!(
                    "the {} received {} different idempotency keys for one operation: a redelivery must continue the same operation under the same key",
                    provider.role().name(),
                    keys.len()
                ));
            }
        }
        Ok(())
    }

    /// No byte of any message the router sent may contain the private key prefix.
    fn scan(&self, response: &Response) -> StepResult {
        let prefix = &self.profile.private_key_prefix;
        let unmatched = self
            .router
            .as_ref()
            .map(|r| r.conn.take_unmatched())
            .unwrap_or_default();
        for raw in std::iter::once(&response.raw).chain(unmatched.iter()) {
            if let Some(at) = raw.find(prefix.as_str()) {
                return fail(format!(
                    "a response contains the private key pattern `{prefix}` (`{}`…): the key must never reach the agent",
                    cut(&raw[at..], prefix.len() + 24)
                ));
            }
        }
        Ok(())
    }

    fn transport_error(&self, e: RpcError) -> StepError {
        let stderr = self
            .router
            .as_ref()
            .and_then(|r| r.process.as_ref())
            .map(Process::stderr_tail)
            .unwrap_or_default();
        let message = match &e {
            RpcError::Closed { .. } => "the router exited unexpectedly".to_string(),
            RpcError::Timeout {
                method, timeout, ..
            } => {
                format!("the router did not answer `{method}` within {timeout:?}")
            }
            other => clip(&other.to_string(), 200),
        };
        if stderr.is_empty() {
            StepError::Error(message)
        } else {
            StepError::Error(format!("{message} (its stderr ends with: {stderr})"))
        }
    }

    /// Starts (or restarts) the router on this scenario's state and initializes a connection.
    async fn start(&mut self) -> StepResult {
        let profile = self.profile;
        let vars = &self.vars;
        let env: Vec<(String, String)> = profile
            .env
            .iter()
            .map(|(k, v)| (k.clone(), vars.apply(v)))
            .collect();
        let args: Vec<String> = vars.apply_args(&profile.args);
        let router = match (profile.transport, &profile.command) {
            (Transport::Stdio, Some(command)) => {
                let program = PathBuf::from(vars.apply(command));
                let (mut conn, child) = Connection::spawn_stdio_in(&program, &args, &env, true)
                    .await
                    .map_err(|e| match e {
                        RpcError::Spawn { program, source } => {
                            StepError::Error(format!("spawn: `{program}`: {source}"))
                        }
                        other => StepError::Error(other.to_string()),
                    })?;
                conn.set_timeout(REQUEST_TIMEOUT);
                Router {
                    conn,
                    process: Some(Process::Stdio(child)),
                }
            }
            (Transport::Http, command) => {
                let process = match command {
                    Some(command) => {
                        let program = vars.apply(command);
                        let child = tokio::process::Command::new(&program)
                            .args(&args)
                            .envs(env.iter().map(|(k, v)| (k, v)))
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .stderr(std::process::Stdio::null())
                            .process_group(0)
                            .kill_on_drop(true)
                            .spawn()
                            .map_err(|e| StepError::Error(format!("spawn: `{program}`: {e}")))?;
                        Some(Process::Http(child))
                    }
                    None => None,
                };
                let conn = self_connect_http(profile, vars).await?;
                Router { conn, process }
            }
            (Transport::Stdio, None) => unreachable!("validated on load"),
        };
        let id = self.id(None);
        let wait_for_http = profile.transport == Transport::Http && router.process.is_some();
        self.router = Some(router);
        let conn = self.conn()?.clone();
        if wait_for_http {
            let deadline = tokio::time::Instant::now() + HTTP_START_TIMEOUT;
            loop {
                match initialize(&conn, id.clone(), &self.scenario.protocol).await {
                    Ok(()) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            Ok(())
        } else {
            match initialize(&conn, id, &self.scenario.protocol).await {
                Err(StepError::Error(m)) => {
                    let mut tail = String::new();
                    if let Some(process) = self.router.as_ref().and_then(|r| r.process.as_ref()) {
                        if let Process::Stdio(child) = process {
                            child.stderr_closed(Duration::from_secs(2)).await;
                        }
                        tail = process.stderr_tail();
                    }
                    Err(StepError::Error(if tail.is_empty() {
                        m
                    } else {
                        format!("{m} (its stderr ends with: {tail})")
                    }))
                }
                other => other,
            }
        }
    }

    async fn stop_router(&mut self, graceful: bool) {
        let Some(mut router) = self.router.take() else {
            return;
        };
        if graceful {
            router.conn.close().await;
            if let Some(Process::Stdio(child)) = &mut router.process
                && tokio::time::timeout(GRACEFUL_EXIT, child.wait())
                    .await
                    .is_ok()
            {
                return;
            }
        }
        if let Some(p) = &mut router.process {
            p.kill9().await;
        }
    }

    async fn stop(&mut self) {
        if self.profile.runner_starts() {
            self.stop_router(false).await;
        } else if let Some(router) = self.router.take() {
            router.conn.close().await;
        }
    }
}

async fn self_connect_http(profile: &Profile, vars: &Vars) -> StepResult<Connection> {
    let url = vars.apply(profile.url.as_deref().expect("validated on load"));
    let mut conn = Connection::http(&url)
        .await
        .map_err(|e| StepError::Error(e.to_string()))?;
    conn.set_timeout(REQUEST_TIMEOUT);
    Ok(conn)
}

async fn initialize(conn: &Connection, id: Value, protocol: &str) -> StepResult {
    let response = conn
        .initialize(id, protocol, "callid-conform", env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| {
            StepError::Error(match e {
                RpcError::Closed { .. } => "the router exited before answering `initialize`".into(),
                other => format!("initialize failed: {}", clip(&other.to_string(), 300)),
            })
        })?;
    if let Some(error) = response.error {
        return fail(format!(
            "initialize with protocol {protocol} was refused: {error}"
        ));
    }
    Ok(())
}

/// A loopback port for `{port}`, held for one scenario against every other conform process.
///
/// A port found free and then released can be taken by another scenario (or another conform
/// run) before the router binds it, and the runner would then drive someone else's router. So the
/// port comes from outside the kernel's ephemeral range (where `bind(0)` never lands), and the
/// file `callid-conform-ports/PORT.claim` in the temporary directory, created exclusively, claims
/// it until the scenario ends. A claim older than [`STALE_CLAIM`] is left over from a killed run
/// and is taken over.
struct PortLease {
    port: u16,
    claim: Option<PathBuf>,
}

/// Age after which a port claim is considered abandoned (a scenario takes seconds).
const STALE_CLAIM: Duration = Duration::from_secs(600);

/// Ports handed out for `{port}`: below Linux's default ephemeral range (32768-60999).
const PORT_RANGE: std::ops::Range<u16> = 20000..32000;

impl PortLease {
    fn take() -> std::io::Result<PortLease> {
        let dir = std::env::temp_dir().join("callid-conform-ports");
        std::fs::create_dir_all(&dir)?;
        let span = PORT_RANGE.end - PORT_RANGE.start;
        let start = (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
        for i in 0..span {
            let port = PORT_RANGE.start + (start + i) % span;
            let path = dir.join(format!("{port}.claim"));
            let stale = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_CLAIM);
            if stale {
                let _ = std::fs::remove_file(&path);
            }
            let claimed = std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path)
                .is_ok();
            if !claimed {
                continue;
            }
            let lease = PortLease {
                port,
                claim: Some(path),
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(lease);
            }
        }
        Err(std::io::Error::other(format!(
            "no free loopback port in {}..{}",
            PORT_RANGE.start, PORT_RANGE.end
        )))
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        // Dropped after the scenario's router is stopped: the port is free again.
        if let Some(path) = self.claim.take() {
            let _ = std::fs::remove_file(path);
        }
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

fn pointer<'r>(r: &'r Response, at: &str) -> Option<&'r Value> {
    r.tool_result()?.pointer(at)
}

fn pointer_str(r: &Response, at: &str) -> Option<String> {
    pointer(r, at).and_then(Value::as_str).map(str::to_string)
}

/// `the tool error `code` ("message")`, `success`, or the JSON-RPC error, for reasons.
fn describe(r: &Response, error_pointer: &str) -> String {
    if let Some(e) = &r.error {
        return format!("the JSON-RPC error {}", clip(&e.to_string(), 160));
    }
    if r.is_tool_error() {
        let code = pointer_str(r, error_pointer).unwrap_or_else(|| "(no code)".into());
        let text = r
            .tool_result()
            .and_then(|t| t.pointer("/content/0/text"))
            .and_then(Value::as_str)
            .map(|t| format!(" ({})", clip(t, 120)))
            .unwrap_or_default();
        return format!("the tool error `{code}`{text}");
    }
    "success".to_string()
}

/// The first place two JSON values differ, as `at /path: `a` vs `b``.
fn first_difference(want: &Value, got: &Value, at: &str) -> String {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let path = format!("{at}/{k}");
                match b.get(k) {
                    Some(w) if w == v => {}
                    Some(w) => return first_difference(v, w, &path),
                    None => return format!("at `{path}`: missing"),
                }
            }
            if let Some(k) = b.keys().find(|k| !a.contains_key(*k)) {
                return format!("at `{at}/{k}`: unexpected");
            }
            format!("at `{at}`")
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                if v != w {
                    return first_difference(v, w, &format!("{at}/{i}"));
                }
            }
            format!("at `{at}`")
        }
        _ => format!(
            "at `{}`: `{}` became `{}`",
            if at.is_empty() { "/" } else { at },
            clip(&want.to_string(), 60),
            clip(&got.to_string(), 60)
        ),
    }
}

/// Fails when a tool's input schema names an identity-like property at any depth, or the spend
/// tool is not listed.
fn check_schemas(response: &Response, spend: &str) -> StepResult {
    if let Some(error) = &response.error {
        return fail(format!("`tools/list` failed: {error}"));
    }
    let tools = response
        .result
        .as_ref()
        .and_then(|r| r.get("tools"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !tools
        .iter()
        .any(|t| t.get("name").and_then(Value::as_str) == Some(spend))
    {
        return fail(format!("the spend tool `{spend}` is not listed"));
    }
    for tool in &tools {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("?");
        let Some(schema) = tool.get("inputSchema") else {
            continue;
        };
        if let Some(path) = identity_property(schema, "") {
            return fail(format!(
                "tool `{name}` exposes the identity-like field `{path}` in its input schema: the model would write it"
            ));
        }
    }
    Ok(())
}

fn identity_property(schema: &Value, at: &str) -> Option<String> {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if matches!(key.as_str(), "properties" | "patternProperties")
                    && let Value::Object(props) = value
                {
                    for (prop, sub) in props {
                        let path = format!("{at}/{prop}");
                        if crate::identity::is_identity_like(prop) {
                            return Some(path);
                        }
                        if let Some(found) = identity_property(sub, &path) {
                            return Some(found);
                        }
                    }
                } else if key == "required"
                    && let Value::Array(names) = value
                    && let Some(n) = names
                        .iter()
                        .filter_map(Value::as_str)
                        .find(|n| crate::identity::is_identity_like(n))
                {
                    return Some(format!("{at}/{n}"));
                } else if let Some(found) = identity_property(value, at) {
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => items.iter().find_map(|v| identity_property(v, at)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_properties_are_found_at_any_depth() {
        let cases = [
            (
                json!({"type": "object", "properties": {"prompt": {"type": "string"}}}),
                None,
            ),
            (
                json!({"properties": {"prompt": {}, "callId": {}}}),
                Some("/callId"),
            ),
            (
                json!({"properties": {"options": {"properties": {"idempotency_key": {}}}}}),
                Some("/options/idempotency_key"),
            ),
            (
                json!({"properties": {"layers": {"items": {"properties": {"tool_use_id": {}}}}}}),
                Some("/layers/tool_use_id"),
            ),
            (
                json!({"$defs": {"x": {"properties": {"_meta": {}}}}}),
                Some("/_meta"),
            ),
            (
                json!({"required": ["operation_key"]}),
                Some("/operation_key"),
            ),
        ];
        for (schema, want) in cases {
            assert_eq!(identity_property(&schema, "").as_deref(), want, "{schema}");
        }
    }

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
    }

    #[test]
    fn the_stderr_tail_keeps_the_lines_that_name_the_problem() {
        let traceback = "Traceback (most recent call last):\n  File \"r.py\", line 3, in <module>\n    import nope\nModuleNotFoundError: No module named 'nope'\n\n";
        assert_eq!(
            tail(traceback),
            "Traceback (most recent call last): |   File \"r.py\", line 3, in <module> |     import nope | ModuleNotFoundError: No module named 'nope'"
        );
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let got = tail(&long);
        assert!(
            got.starts_with("line 92 | ") && got.ends_with("line 99"),
            "{got}"
        );
    }

    #[test]
    fn first_difference_names_the_path() {
        let a = json!({"handle": "h", "result": {"charge_id": "c1", "n": [1, 2]}});
        let b = json!({"handle": "h", "result": {"charge_id": "c2", "n": [1, 2]}});
        assert_eq!(
            first_difference(&a, &b, ""),
            "at `/result/charge_id`: `\"c1\"` became `\"c2\"`"
        );
        let c = json!({"handle": "h", "result": {"charge_id": "c1", "n": [1, 2]}, "x": 1});
        assert_eq!(first_difference(&a, &c, ""), "at `/x`: unexpected");
    }
}
