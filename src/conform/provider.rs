//! The runner's paid provider: [`crate::provider`] served in-process on 127.0.0.1 over a temporary
//! ledger, with the runner's own hooks ([`RunnerHooks`], see [`super::hooks`]).
//!
//! The ledger is the ground truth of every `charges:` expectation: it is the provider's own
//! durable record, so a router cannot report a charge count, only cause one.
//!
//! The same ledger and hooks serve the runner's other role, the upstream MCP server
//! ([`super::upstream`], `backend: upstream`): [`RunnerProvider::start_upstream`]. The role is
//! named in every charge-count message ("the upstream recorded 0 charge(s)").

use super::hooks::RunnerHooks;
use super::target::Backend;
use crate::provider::{Ledger, ProviderError, ProviderHandle, ProviderHooks};
use std::sync::Arc;

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
    use crate::provider::NO_KEY;

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

    /// A hold until released ends when a second dispatch of its operation arrives or when the
    /// runner releases it (not on another operation's dispatch), and otherwise at its ceiling,
    /// where it simply ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_until_released_ends_on_its_event_or_at_its_ceiling() {
        use std::time::{Duration, Instant};
        let provider = RunnerProvider::start("127.0.0.1:0").await.unwrap();
        let url = provider.url();
        let hooks = provider.hooks();
        let held = |key: &'static str| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, Some(key)).await })
        };
        // Far beyond what a released hold takes: a hold that waits for it was not released.
        let long = Duration::from_secs(60);
        let released_within = Duration::from_secs(10);

        hooks.hold_until_released(long);
        let first = held("k1");
        hooks.dispatch_seen().await;
        assert_eq!(post(&url, Some("k1")).await, 200);
        let first = tokio::time::timeout(released_within, first).await;
        assert_eq!(
            first
                .expect("a second dispatch did not end the hold")
                .unwrap(),
            200
        );

        hooks.reset();
        hooks.hold_until_released(long);
        let first = held("k2");
        hooks.dispatch_seen().await;
        assert_eq!(post(&url, Some("k3")).await, 200);
        assert!(
            !first.is_finished(),
            "another operation's dispatch ended the hold"
        );
        hooks.release();
        let first = tokio::time::timeout(released_within, first).await;
        assert_eq!(
            first.expect("the release did not end the hold").unwrap(),
            200
        );

        hooks.reset();
        let ceiling = Duration::from_millis(300);
        hooks.hold_until_released(ceiling);
        let start = Instant::now();
        assert_eq!(post(&url, Some("k4")).await, 200);
        let took = start.elapsed();
        assert!(
            took >= ceiling,
            "the hold ended before its ceiling: {took:?}"
        );
        assert!(
            took < released_within,
            "the hold outlasted its ceiling: {took:?}"
        );
    }
}
