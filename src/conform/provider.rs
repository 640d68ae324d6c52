//! The runner's paid provider: [`crate::provider`] served in-process on 127.0.0.1 over a temporary
//! ledger, with the runner's own hooks ([`RunnerHooks`]).
//!
//! The ledger is the ground truth of every `charges:` expectation: it is the provider's own
//! durable record, so a router cannot report a charge count, only cause one. The hooks let a
//! scenario hold the first charge (so deliveries overlap), and kill the router with SIGKILL when
//! its request reaches the provider (nothing charged, answered 503 to a dead socket) or right
//! after the charge is committed and before the reply is sent.
//!
//! The hooks also log every request the backend received, as a [`Dispatch`] (its operation, its
//! start and its end), so a check can count dispatches apart from charges and see two
//! dispatches of one operation in flight at once; and with [`RunnerHooks::ignore_keys`] the
//! backend plays one that ignores idempotency keys and charges every request.
//!
//! The same ledger and hooks serve the runner's other role, the upstream MCP server
//! ([`super::upstream`], `backend: upstream`): [`RunnerProvider::start_upstream`]. The role is
//! named in every charge-count message ("the upstream recorded 0 charge(s)").

use super::scenario::KillTrigger;
use super::target::Backend;
use crate::provider::{
    HookAction, ImageRequest, Ledger, NO_KEY, ProviderError, ProviderHandle, ProviderHooks,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why the runner's provider could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    /// The temporary ledger could not be created.
    #[error("failed to create the runner's provider ledger: {0}")]
    Ledger(String),
    /// The listen address could not be bound.
    #[error("failed to listen on `{addr}` for the runner's provider: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The runner's ledger could not be read, so a `charges:` or `charge_in_ledger` expectation
/// cannot be judged (the scenario is an error, not a failure).
#[derive(Debug, thiserror::Error)]
#[error("failed to read the runner's ledger")]
pub struct LedgerReadError {
    /// The ledger's error.
    #[source]
    pub source: ProviderError,
}

impl LedgerReadError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        "runner_ledger_unreadable"
    }
}

/// What the hooks do next; reset for every scenario.
#[derive(Debug, Default)]
struct Plan {
    kill: Option<(KillTrigger, u32)>,
    hold_first: Option<Duration>,
    fail_next: Option<u16>,
    killed: bool,
    keys_seen: Vec<String>,
    ignore_keys: bool,
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
                operation,
                start: Instant::now(),
                end: None,
            },
        ));
        DispatchEnd {
            log: self.dispatches.clone(),
            id,
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
        self.plan.lock().expect("plan lock").hold_first = Some(hold);
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
            (plan.hold_first.take(), plan.fail_next.take())
        };
        if let Some(status) = fail {
            return HookAction::Fail(status);
        }
        if self.kill_if(KillTrigger::BeforeCharge) {
            return HookAction::Fail(503);
        }
        match hold {
            Some(d) => HookAction::Hold(d),
            None => HookAction::Proceed,
        }
    }

    fn after_charge(&self, _key: &str, _replayed: bool) -> HookAction {
        self.kill_if(KillTrigger::AfterCharge);
        HookAction::Proceed
    }
}

/// The running provider (or upstream), its ledger and hooks.
pub struct RunnerProvider {
    server: Server,
    ledger: Ledger,
    hooks: Arc<RunnerHooks>,
    _dir: tempfile::TempDir,
}

/// What serves the ledger: the HTTP provider or the upstream MCP server.
enum Server {
    Provider(ProviderHandle),
    Upstream(super::upstream::UpstreamServer),
}

fn ledger_dir() -> Result<(tempfile::TempDir, Ledger), ProviderSetupError> {
    let dir = tempfile::Builder::new()
        .prefix("callid-conform-provider-")
        .tempdir()
        .map_err(|e| ProviderSetupError::Ledger(e.to_string()))?;
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3"))
        .map_err(|e| ProviderSetupError::Ledger(e.to_string()))?;
    Ok((dir, ledger))
}

impl RunnerProvider {
    /// Starts the provider on `listen` (`127.0.0.1:0` picks a port) over a fresh ledger.
    pub async fn start(listen: &str) -> Result<RunnerProvider, ProviderSetupError> {
        let (dir, ledger) = ledger_dir()?;
        let bind = |source| ProviderSetupError::Bind {
            addr: listen.to_string(),
            source,
        };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind)?;
        let hooks = Arc::new(RunnerHooks::default());
        let dyn_hooks: Arc<dyn ProviderHooks> = hooks.clone();
        let handle =
            crate::provider::spawn(listener, ledger.clone(), Some(dyn_hooks)).map_err(bind)?;
        Ok(RunnerProvider {
            server: Server::Provider(handle),
            ledger,
            hooks,
            _dir: dir,
        })
    }

    /// Starts the runner's upstream MCP server on `listen` (`127.0.0.1:0` picks a port) over a
    /// fresh ledger, with the same hooks: see [`super::upstream`].
    pub async fn start_upstream(listen: &str) -> Result<RunnerProvider, ProviderSetupError> {
        let (dir, ledger) = ledger_dir()?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| ProviderSetupError::Bind {
                addr: listen.to_string(),
                source,
            })?;
        let hooks = Arc::new(RunnerHooks::default());
        let server =
            super::upstream::UpstreamServer::spawn(listener, ledger.clone(), hooks.clone())
                .map_err(|source| ProviderSetupError::Bind {
                    addr: listen.to_string(),
                    source,
                })?;
        Ok(RunnerProvider {
            server: Server::Upstream(server),
            ledger,
            hooks,
            _dir: dir,
        })
    }

    /// Starts the role `backend` names on a free loopback port.
    pub async fn start_for(backend: Backend) -> Result<RunnerProvider, ProviderSetupError> {
        match backend {
            Backend::Provider => RunnerProvider::start("127.0.0.1:0").await,
            Backend::Upstream => RunnerProvider::start_upstream("127.0.0.1:0").await,
        }
    }

    /// Which role this is.
    pub fn role(&self) -> Backend {
        match self.server {
            Server::Provider(_) => Backend::Provider,
            Server::Upstream(_) => Backend::Upstream,
        }
    }

    /// The provider's `http://127.0.0.1:PORT`, or the upstream's `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        match &self.server {
            Server::Provider(handle) => handle.base_url(),
            Server::Upstream(server) => server.url(),
        }
    }

    /// `{provider_url}`: the provider's URL, empty in the upstream role.
    pub fn provider_url(&self) -> String {
        match self.role() {
            Backend::Provider => self.url(),
            Backend::Upstream => String::new(),
        }
    }

    /// `{upstream_url}`: the upstream's URL, empty in the provider role.
    pub fn upstream_url(&self) -> String {
        match self.role() {
            Backend::Upstream => self.url(),
            Backend::Provider => String::new(),
        }
    }

    /// The hooks.
    pub fn hooks(&self) -> &RunnerHooks {
        &self.hooks
    }

    /// How many charges the ledger holds.
    pub fn charge_count(&self) -> Result<u64, LedgerReadError> {
        self.ledger
            .charge_count()
            .map_err(|source| LedgerReadError { source })
    }

    /// The charge ids in the ledger.
    pub fn charge_ids(&self) -> Result<Vec<String>, LedgerReadError> {
        Ok(self
            .ledger
            .charges()
            .map_err(|source| LedgerReadError { source })?
            .into_iter()
            .map(|c| c.charge_id)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posts one image request with `key` (none: no header) and returns the HTTP status.
    async fn post(url: &str, key: Option<&str>) -> u16 {
        let mut request = reqwest::Client::new()
            .post(format!("{url}/v1/images"))
            .json(&serde_json::json!({"prompt": "an origami fox"}));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.unwrap().status().as_u16()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_provider_logs_every_dispatch_and_can_ignore_keys() {
        let provider = RunnerProvider::start("127.0.0.1:0").await.unwrap();
        let url = provider.url();
        // Honouring keys: one charge for a key sent twice, no request without a key.
        assert_eq!(post(&url, Some("k1")).await, 200);
        assert_eq!(post(&url, Some("k1")).await, 200);
        assert_eq!(post(&url, None).await, 400);
        assert_eq!(provider.charge_count().unwrap(), 1);
        let dispatches = provider.hooks().dispatches();
        assert_eq!(dispatches.len(), 2, "{dispatches:?}");
        assert!(
            dispatches
                .iter()
                .all(|d| d.operation == "k1" && d.end.is_some())
        );
        // Ignoring keys: every request is charged, with a key or without one.
        provider.hooks().reset();
        provider.hooks().ignore_keys();
        assert_eq!(post(&url, Some("k1")).await, 200);
        assert_eq!(post(&url, Some("k1")).await, 200);
        assert_eq!(post(&url, None).await, 200);
        assert_eq!(provider.charge_count().unwrap(), 4);
        let operations: Vec<String> = provider
            .hooks()
            .dispatches()
            .into_iter()
            .map(|d| d.operation)
            .collect();
        assert_eq!(operations.len(), 3);
        assert!(operations[2].starts_with(NO_KEY), "{operations:?}");
        // A reset honours keys again.
        provider.hooks().reset();
        assert_eq!(post(&url, Some("k1")).await, 200);
        assert_eq!(provider.charge_count().unwrap(), 4);
    }
}
