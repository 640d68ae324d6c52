//! The runner's hooks on its paid backend ([`RunnerHooks`]), shared by both roles the backend
//! plays: the HTTP provider ([`super::provider`]) and the upstream MCP server
//! ([`super::upstream`]).
//!
//! The hooks let a scenario hold the first charge (so deliveries overlap), and kill the router
//! with SIGKILL when its request reaches the provider (nothing charged, answered 503 to a dead
//! socket) or right after the charge is committed and before the reply is sent.
//!
//! A hold lasts either a fixed time ([`RunnerHooks::hold_next`]: a slow backend) or until an
//! event ends it ([`RunnerHooks::hold_until_released`]): a second dispatch of the held
//! operation arrives, or the runner releases it, and at the latest at its ceiling, when it simply
//! ends like a fixed hold.
//!
//! The hooks also log every request the backend received, as a [`Dispatch`] (its operation, its
//! start and its end), so a check can count dispatches apart from charges and see two
//! dispatches of one operation in flight at once; and with [`RunnerHooks::ignore_keys`] the
//! backend plays one that ignores idempotency keys and charges every request.

use super::scenario::KillTrigger;
use crate::provider::{HookAction, ImageRequest, NO_KEY, ProviderHooks};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// What the hooks do next; reset for every scenario.
#[derive(Debug, Default)]
struct Plan {
    kill: Option<(KillTrigger, u32)>,
    hold_first: Option<Hold>,
    release: Option<Release>,
    fail_next: Option<u16>,
    killed: bool,
    keys_seen: Vec<String>,
    ignore_keys: bool,
}

/// How long the next request is held before charging.
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// This long.
    For(Duration),
    /// Until released ([`Release`]), at most this long.
    UntilReleased(Duration),
}

/// The event that ends a [`Hold::UntilReleased`].
#[derive(Debug)]
struct Release {
    /// Turns true when the hold may end.
    released: watch::Sender<bool>,
    /// The operation of the first dispatch since the hold was armed: the held one.
    operation: Option<String>,
}

impl Release {
    /// Whether the request under `key` is the held one: of the first dispatch's operation (a
    /// request that reaches the charge sooner, of another operation, is not held).
    fn holds(&self, key: &str) -> bool {
        self.operation
            .as_deref()
            .is_some_and(|op| op == key || (key == NO_KEY && op.starts_with(NO_KEY)))
    }
}

/// One request the backend received for the paid tool: a dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// The operation it belongs to: its idempotency key, or for a request without one, the
    /// request's fingerprint (the same arguments sent again count as the same operation).
    pub operation: String,
    /// When the request reached the backend.
    pub start: Instant,
    /// When the backend was done with it (answered, failed, or abandoned by its client);
    /// `None` while it is in flight.
    pub end: Option<Instant>,
}

#[derive(Debug, Default)]
struct DispatchLog {
    next: u64,
    entries: Vec<(u64, Dispatch)>,
}

/// Ends its [`Dispatch`] when dropped: the backend holds it while it works on the request.
pub struct DispatchEnd {
    log: Arc<Mutex<DispatchLog>>,
    id: u64,
}

impl Drop for DispatchEnd {
    fn drop(&mut self) {
        let mut log = self.log.lock().expect("dispatch log lock");
        if let Some((_, d)) = log.entries.iter_mut().find(|(id, _)| *id == self.id) {
            d.end.get_or_insert_with(Instant::now);
        }
    }
}

/// The runner's hooks: record every idempotency key and dispatch, hold once, kill once.
#[derive(Debug, Default)]
pub struct RunnerHooks {
    plan: Mutex<Plan>,
    dispatches: Arc<Mutex<DispatchLog>>,
    /// Woken at every dispatch.
    dispatched: Notify,
}

impl RunnerHooks {
    /// Forgets the keys and dispatches seen, disarms everything and honours keys again.
    pub fn reset(&self) {
        *self.plan.lock().expect("plan lock") = Plan::default();
        *self.dispatches.lock().expect("dispatch log lock") = DispatchLog::default();
    }

    /// Until the next reset, the backend ignores idempotency keys: every request is charged
    /// (under a fresh key), with a key or without one.
    pub fn ignore_keys(&self) {
        self.plan.lock().expect("plan lock").ignore_keys = true;
    }

    /// Whether the backend ignores idempotency keys now.
    pub fn ignores_keys(&self) -> bool {
        self.plan.lock().expect("plan lock").ignore_keys
    }

    /// Logs a dispatch of the request under `key` ([`NO_KEY`] when it has none); it ends when
    /// the returned value is dropped.
    pub fn dispatch_started(&self, key: &str, request: &ImageRequest) -> DispatchEnd {
        let operation = if key == NO_KEY {
            format!("{NO_KEY} {}", request.fingerprint())
        } else {
            key.to_string()
        };
        let mut log = self.dispatches.lock().expect("dispatch log lock");
        let id = log.next;
        log.next += 1;
        log.entries.push((
            id,
            Dispatch {
                operation: operation.clone(),
                start: Instant::now(),
                end: None,
            },
        ));
        drop(log);
        if let Some(release) = &mut self.plan.lock().expect("plan lock").release {
            match &release.operation {
                None => release.operation = Some(operation),
                Some(held) if *held == operation => {
                    release.released.send_replace(true);
                }
                Some(_) => {}
            }
        }
        self.dispatched.notify_waiters();
        DispatchEnd {
            log: self.dispatches.clone(),
            id,
        }
    }

    /// Waits until the backend has received at least one dispatch since the last reset.
    pub async fn dispatch_seen(&self) {
        loop {
            let notified = self.dispatched.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self
                .dispatches
                .lock()
                .expect("dispatch log lock")
                .entries
                .is_empty()
            {
                return;
            }
            notified.await;
        }
    }

    /// Every dispatch since the last reset, in the order they started.
    pub fn dispatches(&self) -> Vec<Dispatch> {
        self.dispatches
            .lock()
            .expect("dispatch log lock")
            .entries
            .iter()
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// Kills process `pid` with SIGKILL the next time `trigger` happens.
    pub fn arm_kill(&self, trigger: KillTrigger, pid: u32) {
        let mut plan = self.plan.lock().expect("plan lock");
        plan.kill = Some((trigger, pid));
        plan.killed = false;
    }

    /// Disarms a kill that did not happen; returns whether it happened.
    pub fn disarm_kill(&self) -> bool {
        let mut plan = self.plan.lock().expect("plan lock");
        plan.kill = None;
        std::mem::take(&mut plan.killed)
    }

    /// Holds the next request before charging for `hold`.
    pub fn hold_next(&self, hold: Duration) {
        self.plan.lock().expect("plan lock").hold_first = Some(Hold::For(hold));
    }

    /// Holds the next request before charging until [`RunnerHooks::release`] is called or a
    /// second dispatch of its operation arrives, at most `ceiling`.
    pub fn hold_until_released(&self, ceiling: Duration) {
        let mut plan = self.plan.lock().expect("plan lock");
        plan.hold_first = Some(Hold::UntilReleased(ceiling));
        plan.release = Some(Release {
            released: watch::Sender::new(false),
            operation: None,
        });
    }

    /// Ends the hold of [`RunnerHooks::hold_until_released`] (now, or at once when it starts).
    pub fn release(&self) {
        if let Some(release) = &self.plan.lock().expect("plan lock").release {
            release.released.send_replace(true);
        }
    }

    /// Answers the next request with HTTP `status` without charging (a provider outage).
    pub fn fail_next(&self, status: u16) {
        self.plan.lock().expect("plan lock").fail_next = Some(status);
    }

    /// Records an idempotency key received besides the one [`ProviderHooks::before_charge`]
    /// was called with (the upstream's `Idempotency-Key` header when `_meta` holds another).
    pub fn record_key(&self, key: &str) {
        self.plan
            .lock()
            .expect("plan lock")
            .keys_seen
            .push(key.to_string());
    }

    /// Every idempotency key the provider received since the last reset.
    pub fn keys_seen(&self) -> Vec<String> {
        self.plan.lock().expect("plan lock").keys_seen.clone()
    }

    fn kill_if(&self, trigger: KillTrigger) -> bool {
        let mut plan = self.plan.lock().expect("plan lock");
        match plan.kill {
            Some((armed, pid)) if armed == trigger => {
                plan.kill = None;
                plan.killed = sigkill(pid);
                plan.killed
            }
            _ => false,
        }
    }
}

/// Sends SIGKILL to the process group `pid` leads (the runner starts every router as a group
/// leader, so a wrapper script and the router it started die together), or to `pid` alone when
/// it leads no group, and waits until the signal is delivered (`kill` has returned).
pub fn sigkill(pid: u32) -> bool {
    let kill = |target: String| {
        std::process::Command::new("kill")
            .args(["-KILL", "--", &target])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    kill(format!("-{pid}")) || kill(pid.to_string())
}

impl ProviderHooks for RunnerHooks {
    fn dispatch(&self, key: &str, request: &ImageRequest) -> Option<Box<dyn Send>> {
        Some(Box::new(self.dispatch_started(key, request)))
    }

    fn ignores_keys(&self) -> bool {
        RunnerHooks::ignores_keys(self)
    }

    fn before_charge(&self, key: &str) -> HookAction {
        let (hold, fail) = {
            let mut plan = self.plan.lock().expect("plan lock");
            plan.keys_seen.push(key.to_string());
            let hold = match (plan.hold_first, &plan.release) {
                (Some(Hold::For(d)), _) => Some(HookAction::Hold(d)),
                (Some(Hold::UntilReleased(ceiling)), Some(r)) if r.holds(key) => {
                    let mut released = r.released.subscribe();
                    Some(HookAction::HoldUntil(Box::pin(async move {
                        let wait = released.wait_for(|r| *r);
                        // At the ceiling the hold simply ends, released or not.
                        let _ = tokio::time::timeout(ceiling, wait).await;
                    })))
                }
                _ => None,
            };
            if hold.is_some() {
                plan.hold_first = None;
            }
            (hold, plan.fail_next.take())
        };
        if let Some(status) = fail {
            return HookAction::Fail(status);
        }
        if self.kill_if(KillTrigger::BeforeCharge) {
            return HookAction::Fail(503);
        }
        hold.unwrap_or(HookAction::Proceed)
    }

    fn after_charge(&self, _key: &str, _replayed: bool) -> HookAction {
        self.kill_if(KillTrigger::AfterCharge);
        HookAction::Proceed
    }
}
