//! Tests of the backend facade and the execution layer, on real SQLite files, with the real
//! provider ledger (in-process) or the real provider HTTP server on 127.0.0.1.

use super::*;
use crate::canonical::request_hash;
use crate::keys::DEFAULT_KEY_PREFIX;
use crate::provider::{ChargeOutcome, HookAction, ProviderError, ProviderHooks};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real in-process provider, counting calls; it can lose the next N replies after charging
/// (the provider charged, the answer never arrived).
struct Counting {
    ledger: Ledger,
    calls: AtomicUsize,
    lose_replies: AtomicUsize,
    keys: std::sync::Mutex<Vec<String>>,
}

impl Counting {
    fn new(ledger: Ledger) -> Arc<Self> {
        Arc::new(Counting {
            ledger,
            calls: AtomicUsize::new(0),
            lose_replies: AtomicUsize::new(0),
            keys: Default::default(),
        })
    }
}

impl ProviderApi for Counting {
    fn create_image<'a>(
        &'a self,
        key: &'a str,
        req: &'a ImageRequest,
    ) -> provider::BoxFuture<'a, Result<ChargeOutcome, ProviderError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.keys.lock().unwrap().push(key.to_owned());
            let outcome = self.ledger.create_image(key, req).await?;
            let lose = self
                .lose_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if lose {
                return Err(ProviderError::Internal {
                    reason: "reply lost after the charge".into(),
                });
            }
            Ok(outcome)
        })
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    backend: Backend,
    provider: Arc<Counting>,
}

fn fixture(config: BackendConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join(PROVIDER_LEDGER_FILE)).unwrap();
    let provider = Counting::new(ledger);
    let backend = Backend::with_provider(dir.path(), provider.clone(), config).unwrap();
    Fixture {
        _dir: dir,
        backend,
        provider,
    }
}

fn key() -> OperationKey {
    OperationKey::generate(DEFAULT_KEY_PREFIX, "codex")
}

fn hash_of(req: &ImageRequest) -> RequestHash {
    request_hash("generate_image", &serde_json::to_value(req).unwrap()).unwrap()
}

fn charges(f: &Fixture) -> u64 {
    f.provider.ledger.charge_count().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_retry_returns_the_same_receipt_and_charges_once() {
    let f = fixture(BackendConfig::default());
    let (key, req) = (key(), ImageRequest::new("origami fox"));
    let first = f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    assert_eq!(first.amount_cents, 3);
    assert!(!first.provider_replayed);
    let again = f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(charges(&f), 1);
    let text = serde_json::to_string(&first).unwrap();
    assert!(
        !text.contains(key.expose()),
        "receipt leaks the key: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_arguments_under_a_new_key_is_a_second_charge() {
    let f = fixture(BackendConfig::default());
    let req = ImageRequest::new("origami fox");
    let a = f.backend.spend(&key(), &req, &hash_of(&req)).await.unwrap();
    let b = f.backend.spend(&key(), &req, &hash_of(&req)).await.unwrap();
    assert_ne!(a.decision_id, b.decision_id);
    assert_ne!(a.charge_id, b.charge_id);
    assert_eq!(charges(&f), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_for_other_work_is_create_new_operation_before_the_provider() {
    let f = fixture(BackendConfig::default());
    let (key, req) = (key(), ImageRequest::new("origami fox"));
    f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    let mut pro = req.clone();
    pro.model = "flux-pro".into();
    let mut bigger = req.clone();
    bigger.width = 2048;
    let mut reworded = req.clone();
    reworded.prompt = "origami wolf".into();
    for other in [pro, bigger, reworded] {
        let err = f
            .backend
            .spend(&key, &other, &hash_of(&other))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "create_new_operation", "{other:?}");
        assert!(!format!("{err} {err:?}").contains(key.expose()));
    }
    assert_eq!(f.provider.calls.load(Ordering::SeqCst), 1);
    assert_eq!(charges(&f), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_is_refused_and_charges_nothing() {
    let f = fixture(BackendConfig {
        budget_cents: Some(8),
        ..BackendConfig::default()
    });
    let req = ImageRequest::new("fox");
    f.backend.spend(&key(), &req, &hash_of(&req)).await.unwrap();
    let mut dev = req.clone();
    dev.model = "flux-dev".into();
    f.backend.spend(&key(), &dev, &hash_of(&dev)).await.unwrap();
    let err = f
        .backend
        .spend(&key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "budget_exceeded");
    assert_eq!(charges(&f), 2);
    assert_eq!(f.provider.calls.load(Ordering::SeqCst), 2);
    let budget = f.backend.budget().await.unwrap();
    assert_eq!((budget.budget_cents, budget.spent_cents), (Some(8), 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_and_bad_size_are_refused_before_anything_is_recorded() {
    let f = fixture(BackendConfig::default());
    let mut req = ImageRequest::new("fox");
    req.model = "dall-e".into();
    assert_eq!(f.backend.quote(&req).unwrap_err().code(), "unknown_model");
    let err = f
        .backend
        .spend(&key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unknown_model");
    req.model = "flux-pro".into();
    assert_eq!(f.backend.quote(&req).unwrap(), 25);
    req.width = 1;
    let err = f
        .backend
        .spend(&key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_request");
    assert_eq!(f.provider.calls.load(Ordering::SeqCst), 0);
    assert_eq!(f.backend.budget().await.unwrap().spent_cents, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_key_is_derived_from_the_decision_never_the_operation_key() {
    let f = fixture(BackendConfig::default());
    let (key, req) = (key(), ImageRequest::new("fox"));
    let receipt = f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    let records = f.provider.ledger.charges().unwrap();
    assert_eq!(records.len(), 1);
    let used = &records[0].idempotency_key;
    assert_eq!(used, &provider_key(&receipt.decision_id));
    assert!(used.starts_with("gongbu:") && used.len() == "gongbu:".len() + 32);
    let uuid = key.expose().rsplit(':').next().unwrap();
    assert!(!used.contains(uuid) && !used.contains("hubu:"));
    // Known vector: sha256("d") = 18ac3e73...
    assert_eq!(provider_key("d"), "gongbu:18ac3e7343f016890c510e93f9352611");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_retry_returns_the_record_without_calling_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Counting::new(Ledger::open(&dir.path().join(PROVIDER_LEDGER_FILE)).unwrap());
    let (key, req) = (key(), ImageRequest::new("fox"));
    let first = {
        let backend =
            Backend::with_provider(dir.path(), provider.clone(), BackendConfig::default()).unwrap();
        backend.spend(&key, &req, &hash_of(&req)).await.unwrap()
    };
    // A restart: new backend on the same state directory.
    let backend =
        Backend::with_provider(dir.path(), provider.clone(), BackendConfig::default()).unwrap();
    for _ in 0..3 {
        assert_eq!(
            backend.spend(&key, &req, &hash_of(&req)).await.unwrap(),
            first
        );
    }
    assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatched_retry_calls_again_with_the_same_key_and_charges_once() {
    let f = fixture(BackendConfig::default());
    f.provider.lose_replies.store(2, Ordering::SeqCst);
    let (key, req) = (key(), ImageRequest::new("fox"));
    for _ in 0..2 {
        let err = f
            .backend
            .spend(&key, &req, &hash_of(&req))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "provider_unavailable");
        assert!(err.is_retryable());
        assert_eq!(charges(&f), 1);
    }
    let receipt = f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    assert!(receipt.provider_replayed);
    assert_eq!(charges(&f), 1);
    assert_eq!(
        receipt.charge_id,
        f.provider.ledger.charges().unwrap()[0].charge_id
    );
    let keys = f.provider.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k == &keys[0]));
    // Now completed: the next retry does not call the provider.
    assert_eq!(
        f.backend.spend(&key, &req, &hash_of(&req)).await.unwrap(),
        receipt
    );
    assert_eq!(f.provider.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_spends_of_one_key_charge_once() {
    let f = fixture(BackendConfig::default());
    let (key, req) = (key(), ImageRequest::new("fox"));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (backend, key, req) = (f.backend.clone(), key.clone(), req.clone());
            tokio::spawn(async move { backend.spend(&key, &req, &hash_of(&req)).await })
        })
        .collect();
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.unwrap().unwrap());
    }
    assert!(receipts.iter().all(|r| r == &receipts[0]));
    assert_eq!(charges(&f), 1);
    assert_eq!(
        f.provider.calls.load(Ordering::SeqCst),
        1,
        "single flight per decision"
    );
}

struct FailAfterChargeOnce(AtomicUsize);

impl ProviderHooks for FailAfterChargeOnce {
    fn after_charge(&self, _key: &str, _replayed: bool) -> HookAction {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            HookAction::Fail(503)
        } else {
            HookAction::Proceed
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_lost_reply_is_retried_into_one_charge_and_a_completed_one_needs_no_provider() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("remote-ledger.sqlite3")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = provider::spawn(
        listener,
        ledger.clone(),
        Some(Arc::new(FailAfterChargeOnce(AtomicUsize::new(0)))),
    )
    .unwrap();
    let state = dir.path().join("state");
    let backend = Backend::open(
        &state,
        ProviderTarget::Http {
            endpoint: server.base_url().parse().unwrap(),
        },
        BackendConfig::default(),
    )
    .unwrap();
    assert!(backend.ledger().is_none());
    let (key, req) = (key(), ImageRequest::new("fox"));
    let err = backend.spend(&key, &req, &hash_of(&req)).await.unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
    assert_eq!(ledger.charge_count().unwrap(), 1);
    let receipt = backend.spend(&key, &req, &hash_of(&req)).await.unwrap();
    assert!(receipt.provider_replayed);
    assert_eq!(ledger.charge_count().unwrap(), 1);

    server.shutdown().await.unwrap();
    assert_eq!(
        backend.spend(&key, &req, &hash_of(&req)).await.unwrap(),
        receipt
    );
    let err = backend
        .spend(&self::key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
    assert!(err.to_string().contains("retry the same call"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_target_keeps_its_ledger_beside_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(
        dir.path(),
        ProviderTarget::InProcess,
        BackendConfig::default(),
    )
    .unwrap();
    let req = ImageRequest::new("fox");
    backend.spend(&key(), &req, &hash_of(&req)).await.unwrap();
    for file in [AUTHORIZATION_FILE, EXECUTION_FILE, PROVIDER_LEDGER_FILE] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    assert_eq!(backend.ledger().unwrap().charge_count().unwrap(), 1);
}

#[test]
fn a_foreign_state_file_is_backend_state_unavailable() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(EXECUTION_FILE);
    std::fs::write(&file, b"not a database, not at all").unwrap();
    // Private, as callid's own files are: a file open to other users is refused for its mode
    // before its content is read.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = Backend::open(
        dir.path(),
        ProviderTarget::InProcess,
        BackendConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "backend_state_unavailable");
    assert!(err.is_state_corrupt());
    assert_eq!(
        err.state_file(),
        Some(dir.path().join(EXECUTION_FILE).as_path())
    );
    assert_eq!(
        std::fs::read(dir.path().join(EXECUTION_FILE)).unwrap(),
        b"not a database, not at all"
    );
}

/// A provider that answers every charge with a fixed outcome, recording the requests it got.
struct Scripted {
    answer: fn(&ImageRequest) -> Result<ChargeOutcome, ProviderError>,
    seen: std::sync::Mutex<Vec<ImageRequest>>,
}

impl ProviderApi for Scripted {
    fn create_image<'a>(
        &'a self,
        _key: &'a str,
        req: &'a ImageRequest,
    ) -> provider::BoxFuture<'a, Result<ChargeOutcome, ProviderError>> {
        self.seen.lock().unwrap().push(req.clone());
        let answer = (self.answer)(req);
        Box::pin(async move { answer })
    }
}

fn scripted(
    answer: fn(&ImageRequest) -> Result<ChargeOutcome, ProviderError>,
    budget: u64,
) -> (tempfile::TempDir, Backend, Arc<Scripted>) {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(Scripted {
        answer,
        seen: Default::default(),
    });
    let backend = Backend::with_provider(
        dir.path(),
        provider.clone(),
        BackendConfig {
            budget_cents: Some(budget),
            ..BackendConfig::default()
        },
    )
    .unwrap();
    (dir, backend, provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overcharge_is_debited_whole_and_the_maximum_was_sent() {
    let (_dir, backend, provider) = scripted(
        |req| {
            Ok(ChargeOutcome {
                receipt: crate::provider::Receipt {
                    charge_id: "ch_1".into(),
                    amount_cents: 500,
                    model: req.model.clone(),
                    image: crate::provider::Image {
                        id: "img_1".into(),
                        width: req.width,
                        height: req.height,
                        sha256: "00".into(),
                    },
                    created_at: "2026-01-01T00:00:00Z".into(),
                },
                replayed: false,
            })
        },
        10,
    );
    let req = ImageRequest::new("fox");
    let receipt = backend.spend(&key(), &req, &hash_of(&req)).await.unwrap();
    assert_eq!((receipt.authorized_cents, receipt.amount_cents), (3, 500));
    assert_eq!(provider.seen.lock().unwrap()[0].max_amount_cents, Some(3));
    assert_eq!(backend.budget().await.unwrap().spent_cents, 500);
    let err = backend
        .spend(&key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "budget_exceeded");
    assert_eq!(provider.seen.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_releases_its_reservation_and_a_lost_answer_keeps_it() {
    let (_dir, backend, _) = scripted(
        |_| {
            Err(ProviderError::Http {
                status: 422,
                code: "content_policy".into(),
                message: "refused".into(),
            })
        },
        3,
    );
    let req = ImageRequest::new("fox");
    for _ in 0..3 {
        let err = backend
            .spend(&key(), &req, &hash_of(&req))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "provider_error");
        assert_eq!(backend.budget().await.unwrap().spent_cents, 0);
    }
    let (_dir, backend, _) = scripted(
        |_| {
            Err(ProviderError::Internal {
                reason: "the answer was lost".into(),
            })
        },
        3,
    );
    let err = backend
        .spend(&key(), &req, &hash_of(&req))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
    // The provider may have charged: the reservation stays.
    assert_eq!(backend.budget().await.unwrap().spent_cents, 3);
}

#[test]
fn every_error_code_and_message() {
    let dir = "/state";
    let errors = [
        BackendError::CreateNewOperation {
            differs: "amount, scope".into(),
        },
        BackendError::BudgetExceeded {
            account: "default".into(),
            amount_cents: 25,
            budget_cents: 30,
            remaining_cents: 5,
        },
        BackendError::from_provider(ProviderError::UnknownModel {
            model: "dall-e".into(),
        }),
        BackendError::from_provider(ProviderError::InvalidRequest {
            reason: "`width` is 1; it must be between 64 and 4096 pixels".into(),
        }),
        BackendError::from_provider(ProviderError::Injected {
            status: 503,
            when: "nothing was charged",
        }),
        BackendError::from_provider(ProviderError::Http {
            status: 402,
            code: "payment_required".into(),
            message: "the card was declined".into(),
        }),
        BackendError::StateUnavailable(crate::storage::sqlite::StoreError::Foreign {
            kind: "execution store",
            path: PathBuf::from(dir).join(EXECUTION_FILE),
            detail: "not a SQLite database".into(),
        }),
    ];
    let chains: String = errors
        .iter()
        .map(|e| {
            let mut line = format!("{}: {e}", e.code());
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                line.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            line + "\n"
        })
        .collect();
    insta::assert_snapshot!(chains);
}
