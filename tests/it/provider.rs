//! Integration tests of `callid provider` and the backend layers: the real binary on 127.0.0.1,
//! real HTTP requests, real SQLite ledgers.

use crate::common::bin;
use callid::backend::{Backend, BackendConfig, ProviderTarget, provider_key};
use callid::canonical::request_hash;
use callid::keys::{DEFAULT_KEY_PREFIX, OperationKey};
use callid::provider::ImageRequest;
use serde_json::{Value, json};
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `callid provider` child; killed when dropped.
struct Provider {
    child: Child,
    url: String,
}

impl Provider {
    fn start(ledger: &Path) -> Provider {
        let mut child = Command::new(bin())
            .args(["provider", "--listen", "127.0.0.1:0", "--ledger"])
            .arg(ledger)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning `callid provider`");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no `listening on` line within 30 s");
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim_end()
            .to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        assert!(line.ends_with('\n'));
        Provider { child, url }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Reply {
    status: u16,
    replayed: Option<String>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn post(url: &str, key: Option<&str>, body: &str) -> Reply {
    let mut request = reqwest::Client::new()
        .post(format!("{url}/v1/images"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    Reply {
        status: response.status().as_u16(),
        replayed: response
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned()),
        body: response.text().await.unwrap(),
    }
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{url}{path}")).await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

const FOX: &str = r#"{"prompt":"origami fox","width":1024,"height":1024,"model":"flux-schnell"}"#;

#[tokio::test]
async fn charges_once_per_key_replays_byte_identically_and_refuses_misuse() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(&dir.path().join("ledger.sqlite3"));
    let url = provider.url.as_str();

    let first = post(url, Some("order-1"), FOX).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.replayed, None);
    let receipt = first.json();
    assert_eq!(receipt["amount_cents"], 3);
    assert_eq!(receipt["model"], "flux-schnell");
    assert_eq!(receipt["image"]["width"], 1024);
    assert_eq!(receipt["image"]["sha256"].as_str().unwrap().len(), 64);
    assert!(receipt["charge_id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(
        receipt.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["charge_id", "amount_cents", "model", "image", "created_at"]
    );

    let again = post(url, Some("order-1"), FOX).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.replayed.as_deref(), Some("true"));
    assert_eq!(again.body, first.body, "a replay is byte-identical");
    // The same request written differently (defaults left out, other member order) is the same.
    let same = post(url, Some("order-1"), r#"{ "prompt" : "origami fox" }"#).await;
    assert_eq!(
        (same.status, same.body.as_str()),
        (200, first.body.as_str())
    );

    let pro = post(
        url,
        Some("order-2"),
        r#"{"prompt":"origami fox","model":"flux-pro"}"#,
    )
    .await;
    assert_eq!(
        (pro.status, pro.json()["amount_cents"].as_u64()),
        (200, Some(25))
    );

    let mut refusals = String::new();
    let long_key = "k".repeat(256);
    for (label, key, body) in [
        (
            "same key, other prompt",
            Some("order-1"),
            r#"{"prompt":"origami wolf"}"#,
        ),
        (
            "same key, other model",
            Some("order-1"),
            r#"{"prompt":"origami fox","model":"flux-dev"}"#,
        ),
        ("no key", None, FOX),
        ("empty key", Some(""), FOX),
        ("key with a space", Some("order 3"), FOX),
        ("key of 256 bytes", Some(long_key.as_str()), FOX),
        ("body not JSON", Some("order-3"), "{prompt: fox"),
        (
            "unknown field",
            Some("order-3"),
            r#"{"prompt":"fox","seed":7}"#,
        ),
        (
            "width out of bounds",
            Some("order-3"),
            r#"{"prompt":"fox","width":8}"#,
        ),
        ("empty prompt", Some("order-3"), r#"{"prompt":"  "}"#),
        (
            "unknown model",
            Some("order-3"),
            r#"{"prompt":"fox","model":"dall-e"}"#,
        ),
    ] {
        let reply = post(url, key, body).await;
        assert_eq!(reply.replayed, None);
        let error = &reply.json()["error"];
        refusals.push_str(&format!(
            "{label}: {} {}\n  {}\n",
            reply.status,
            error["code"].as_str().unwrap(),
            error["message"].as_str().unwrap()
        ));
    }
    insta::assert_snapshot!("provider_refusals", refusals);

    let (status, page) = get(url, "/v1/charges").await;
    assert_eq!(status, 200);
    assert_eq!(page["count"], 2, "{page}");
    assert_eq!(page["total_cents"], 28);
    let charges = page["charges"].as_array().unwrap();
    assert_eq!(charges[0]["idempotency_key"], "order-1");
    assert_eq!(charges[0]["charge_id"], receipt["charge_id"]);
    assert_eq!(charges[0]["created_at"], receipt["created_at"]);
    assert_eq!(charges[1]["idempotency_key"], "order-2");
    assert_eq!(charges[1]["amount_cents"], 25);

    assert_eq!(get(url, "/healthz").await, (200, json!({"status": "ok"})));
    let (status, body) = get(url, "/v2/images").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn a_restart_on_the_same_ledger_keeps_every_charge() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let mut provider = Provider::start(&ledger);
    let first = post(&provider.url, Some("a"), FOX).await;
    post(&provider.url, Some("b"), FOX).await;
    // SIGTERM stops it cleanly...
    let status = Command::new("kill")
        .args(["-TERM", &provider.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(provider.child.wait().unwrap().code(), Some(0));

    let mut provider = Provider::start(&ledger);
    let replay = post(&provider.url, Some("a"), FOX).await;
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, first.body);
    post(&provider.url, Some("c"), FOX).await;
    // ...and kill -9 loses nothing that was answered.
    provider.kill9();

    let provider = Provider::start(&ledger);
    let (_, page) = get(&provider.url, "/v1/charges").await;
    assert_eq!(page["count"], 3, "{page}");
    let keys: Vec<&str> = page["charges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "b", "c"]);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&ledger).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_requests_with_one_key_make_one_charge() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(&dir.path().join("ledger.sqlite3"));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (url, barrier) = (provider.url.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                post(&url, Some("one-key"), FOX).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert!(replies.iter().all(|r| r.status == 200));
    assert!(replies.iter().all(|r| r.body == replies[0].body));
    assert_eq!(replies.iter().filter(|r| r.replayed.is_none()).count(), 1);
    let (_, page) = get(&provider.url, "/v1/charges").await;
    assert_eq!(page["count"], 1, "{page}");
}

fn run_provider_expecting_failure(args: &[&str], ledger: &Path) -> (i32, String, String) {
    let output = Command::new(bin())
        .arg("provider")
        .args(args)
        .arg("--ledger")
        .arg(ledger)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn a_foreign_or_newer_ledger_is_refused_and_left_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    let mut report = String::new();
    for (label, setup) in [
        (
            "foreign SQLite database",
            "CREATE TABLE customers (name TEXT); INSERT INTO customers VALUES ('ada');",
        ),
        (
            "another application's database",
            "PRAGMA application_id = 1; CREATE TABLE t (x);",
        ),
        (
            "a ledger from a newer callid",
            "PRAGMA application_id = 1129074764; PRAGMA user_version = 9;",
        ),
    ] {
        let path = dir.path().join("ledger.sqlite3");
        let _ = std::fs::remove_file(&path);
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
        // Private, so what is refused is the content (an open file is refused for its mode
        // before its content is read: tests/it/registry_startup.rs).
        private(&path);
        let before = std::fs::read(&path).unwrap();
        let entries = std::fs::read_dir(dir.path()).unwrap().count();
        let (code, stdout, stderr) =
            run_provider_expecting_failure(&["--listen", "127.0.0.1:0"], &path);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{label}: file modified"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            entries,
            "{label}"
        );
        assert_eq!(code, 2, "{label}");
        assert_eq!(stdout, "", "{label}: nothing is listening");
        let stderr = stderr.replace(&dir.path().display().to_string(), "[TMP]");
        report.push_str(&format!("{label}: exit {code}\n{stderr}"));
    }
    let text_file = dir.path().join("notes.txt");
    std::fs::write(&text_file, "shopping list\n".repeat(400)).unwrap();
    private(&text_file);
    let (code, _, stderr) =
        run_provider_expecting_failure(&["--listen", "127.0.0.1:0"], &text_file);
    assert_eq!(
        std::fs::read_to_string(&text_file).unwrap(),
        "shopping list\n".repeat(400)
    );
    let stderr = stderr.replace(&dir.path().display().to_string(), "[TMP]");
    report.push_str(&format!("a text file: exit {code}\n{stderr}"));
    insta::assert_snapshot!("provider_refuses_foreign_ledgers", report);
}

#[test]
fn a_non_loopback_address_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let (code, stdout, stderr) =
        run_provider_expecting_failure(&["--listen", "0.0.0.0:0"], &ledger);
    assert_eq!((code, stdout.as_str()), (2, ""));
    assert!(!ledger.exists(), "nothing is created before the refusal");
    insta::assert_snapshot!("provider_refuses_non_loopback", stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_spends_through_the_real_provider_binary() {
    let dir = tempfile::tempdir().unwrap();
    let mut provider = Provider::start(&dir.path().join("vendor-ledger.sqlite3"));
    let backend = Backend::open(
        &dir.path().join("state"),
        ProviderTarget::Http {
            endpoint: provider.url.parse().unwrap(),
        },
        BackendConfig::default(),
    )
    .unwrap();
    let key = OperationKey::generate(DEFAULT_KEY_PREFIX, "codex");
    let req = ImageRequest::new("origami fox");
    let hash = request_hash("generate_image", &serde_json::to_value(&req).unwrap()).unwrap();
    let receipt = backend.spend(&key, &req, &hash).await.unwrap();
    assert_eq!(backend.spend(&key, &req, &hash).await.unwrap(), receipt);

    let (_, page) = get(&provider.url, "/v1/charges").await;
    assert_eq!(page["count"], 1);
    assert_eq!(
        page["charges"][0]["charge_id"].as_str(),
        Some(receipt.charge_id.as_str())
    );
    assert_eq!(
        page["charges"][0]["idempotency_key"].as_str(),
        Some(provider_key(&receipt.decision_id).as_str())
    );
    assert!(!page.to_string().contains(key.expose()));

    provider.kill9();
    assert_eq!(
        backend.spend(&key, &req, &hash).await.unwrap(),
        receipt,
        "a completed spend is answered from the record, without the provider"
    );
    let other = OperationKey::generate(DEFAULT_KEY_PREFIX, "codex");
    let err = backend.spend(&other, &req, &hash).await.unwrap_err();
    assert_eq!(err.code(), "provider_unavailable");
}

/// Makes `path` readable and writable by its owner only.
fn private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
