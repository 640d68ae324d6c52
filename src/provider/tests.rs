//! The HTTP provider's client ([`super::Client`]) against its real server ([`super::spawn`]) on
//! a loopback port: what the server answers and how the client maps every answer. Above both
//! files, so neither depends on the other.

use super::client::{Client, Endpoint, ProviderApi as _};
use super::server::{HookAction, ProviderHooks, require_token, router, spawn, spawn_app};
use super::{ImageRequest, Ledger, ProviderError};
use crate::secret::{Secret, SecretUrl};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_show_no_secret_of_the_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(format!("http://ops:hunter2@127.0.0.1:{port}/?api_key=sk-1")).unwrap();
    assert_eq!(
        client.base_url(),
        format!("http://REDACTED@127.0.0.1:{port}?api_key=REDACTED")
    );
    let err = client
        .create_image("k", &ImageRequest::new("fox"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
    let debug = format!("{err:?}");
    let shown = format!("{:#} {debug}", anyhow::Error::from(err));
    for secret in ["hunter2", "sk-1", "ops"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(format!("{client:?}").contains("REDACTED"));
    assert!(!format!("{client:?}").contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_sent_as_bearer_and_a_missing_one_is_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token = Secret::new("tok-9", "a test").unwrap();
    let server = spawn_app(listener, require_token(router(ledger, None), token.clone())).unwrap();
    let url: SecretUrl = server.base_url().parse().unwrap();
    let with = Client::connect(Endpoint::new(url.clone(), Some(token)).unwrap()).unwrap();
    assert!(!format!("{with:?}").contains("tok-9"));
    with.create_image("k", &ImageRequest::new("fox"))
        .await
        .unwrap();
    let without = Client::connect(Endpoint::new(url, None).unwrap()).unwrap();
    let err = without.charges().await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Http { status: 401, code, .. } if code == "unauthorized"),
        "{err:?}"
    );
    assert!(!err.is_transient());
    let basic: SecretUrl = format!("http://u:p@{}", server.addr()).parse().unwrap();
    let both = Endpoint::new(basic, Some(Secret::new("t", "x").unwrap())).unwrap_err();
    assert_eq!(both.code(), "invalid_provider_url");
}

/// Fails the first request before charging, holds the second, and records what it saw.
#[derive(Default)]
struct Script {
    before: AtomicUsize,
    seen: Mutex<Vec<(String, bool)>>,
}

impl ProviderHooks for Script {
    fn before_charge(&self, _key: &str) -> HookAction {
        match self.before.fetch_add(1, Ordering::SeqCst) {
            0 => HookAction::Fail(503),
            1 => HookAction::Hold(Duration::from_millis(300)),
            _ => HookAction::Proceed,
        }
    }

    fn after_charge(&self, key: &str, replayed: bool) -> HookAction {
        self.seen.lock().unwrap().push((key.to_owned(), replayed));
        HookAction::Proceed
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_fail_hold_and_observe_and_the_client_maps_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let script = Arc::new(Script::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = spawn(listener, ledger.clone(), Some(script.clone())).unwrap();
    let client = Client::new(format!("{}/", server.base_url())).unwrap();
    assert_eq!(client.base_url(), server.base_url());
    let req = ImageRequest::new("fox");

    let err = client.create_image("k", &req).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Http { status: 503, code, .. } if code == "injected_failure"),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(
        ledger.charge_count().unwrap(),
        0,
        "failed before the charge"
    );

    let started = std::time::Instant::now();
    let first = client.create_image("k", &req).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300), "held");
    assert!(!first.replayed);
    let again = client.create_image("k", &req).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.receipt, first.receipt);
    assert_eq!(
        *script.seen.lock().unwrap(),
        [("k".to_owned(), false), ("k".to_owned(), true)]
    );

    let mut other = req.clone();
    other.prompt = "wolf".into();
    assert!(matches!(
        client.create_image("k", &other).await,
        Err(ProviderError::KeyReused)
    ));
    other.model = "dall-e".into();
    let err = client.create_image("k2", &other).await.unwrap_err();
    assert_eq!(err.code(), "unknown_model");
    let err = client.create_image("bad key", &req).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Http { status: 400, code, .. } if code == "invalid_idempotency_key"),
        "{err:?}"
    );
    assert!(!err.is_transient());

    let page = client.charges().await.unwrap();
    assert_eq!((page.count, page.total_cents), (1, 3));
    assert_eq!(page.charges[0].charge_id, first.receipt.charge_id);

    server.shutdown().await.unwrap();
    let err = client.create_image("k", &req).await.unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
    assert!(err.is_transient());
}
