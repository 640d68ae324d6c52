//! Integration tests of how callid opens its SQLite files (`callid::store`): the real binary on
//! real files. Permissions (0600, refused when open to others), foreign and newer files left
//! byte-for-byte untouched (their `-wal` included), plain paths that are never SQLite URIs, a
//! fresh file created by many processes at once, and the router's start-up refusals.

use crate::common::bin;
use crate::common::mcp::{Served, code, codex, env_of, fox};
use crate::common::provider;
use callid::jsonrpc::Response;
use serde_json::json;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn side(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Digests of the bytes of a file and of its `-wal` (when there is one).
fn bytes(path: &Path) -> (String, Option<String>) {
    use sha2::Digest as _;
    let digest = |b: Vec<u8>| callid::canonical::hex(&sha2::Sha256::digest(b));
    (
        digest(std::fs::read(path).unwrap()),
        std::fs::read(side(path, "-wal")).ok().map(digest),
    )
}

/// `callid ARGS` in `cwd`, stdin closed.
fn callid(cwd: &Path, args: &[&str]) -> Output {
    std::process::Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A router on stdio with the provider in-process, started in `cwd` under `umask 000` (so that
/// only callid's own modes protect its files).
async fn start_router(cwd: &Path, registry: &str, extra: &[&str]) -> Served {
    let mut args: Vec<String> = vec![
        "-c".into(),
        r#"cd "$0" && umask 000 && exec "$@""#.into(),
        cwd.display().to_string(),
        bin().display().to_string(),
        "router".into(),
        "--registry".into(),
        registry.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let env = env_of(&[("CALLID_LOG", "debug")], &[]);
    Served::start("the router", Path::new("/bin/sh"), &args, &env, None).await
}

/// Router `r` spends the fox as call `call_id`.
async fn spend(r: &Served, call_id: &str) -> Response {
    let meta = json!({"callId": call_id, "openai/session": "sess-1"});
    r.spend(fox(), meta).await
}

fn charges(ledger: &Path) -> u64 {
    provider::charge_count_or_zero(ledger)
}

fn header(path: &Path) -> (i32, i64) {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    c.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id), \
                (SELECT user_version FROM pragma_user_version)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[tokio::test]
async fn a_registry_named_like_a_sqlite_uri_is_a_durable_plain_file() {
    let dir = tempfile::tempdir().unwrap();
    let name = "file:x?mode=memory";
    let r = start_router(dir.path(), name, &[]).await;
    let first = spend(&r, "uri-1").await;
    assert!(!first.is_tool_error(), "{}", first.raw);
    r.stop().await;

    let file = dir.path().join(name);
    assert_eq!(
        header(&file).0,
        callid::testing::registry::APPLICATION_ID,
        "the registry is the file literally named `{name}`"
    );
    assert_eq!(mode(&file), 0o600);

    let r = start_router(dir.path(), name, &[]).await;
    let again = spend(&r, "uri-1").await;
    r.stop().await;
    assert!(!again.is_tool_error(), "{}", again.raw);
    assert_eq!(
        again.tool_result().unwrap()["_meta"]["callid/replayed"],
        json!(true),
        "the restarted router found the row: {}",
        again.raw
    );
    assert_eq!(
        again.structured().unwrap()["handle"],
        first.structured().unwrap()["handle"]
    );
    assert_eq!(charges(&dir.path().join("provider-ledger.sqlite3")), 1);
}

/// An earlier callid's layer files in a state directory whose name starts with `file:` are
/// imported from those very files (what they charged keeps counting against the budget), not
/// from wherever that name leads when read as a SQLite URI.
#[tokio::test]
async fn layer_files_in_a_directory_named_like_a_sqlite_uri_are_imported_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let state = "file:state";
    {
        // An earlier callid's layout: the library's own-file backend, one 25-cent image.
        let backend = callid::backend::Backend::open(
            &dir.path().join(state),
            callid::backend::ProviderTarget::InProcess,
            callid::backend::BackendConfig {
                agent_id: "callid-router:earlier".into(),
                ..Default::default()
            },
        )
        .unwrap();
        let args = json!({"prompt": "an earlier fox", "model": "flux-pro"});
        let request: callid::provider::ImageRequest = serde_json::from_value(args.clone()).unwrap();
        let key = callid::keys::OperationKey::generate("hubu:operation:v1:", "codex");
        let hash = callid::canonical::request_hash("generate_image", &args).unwrap();
        let receipt = backend.spend(&key, &request, &hash).await.unwrap();
        assert_eq!(receipt.amount_cents, 25);
    }
    let registry = format!("{state}/registry.sqlite3");
    let r = start_router(dir.path(), &registry, &["--budget-cents", "30"]).await;
    let cheap = json!({"prompt": "an origami fox", "width": 512, "model": "flux-schnell"});
    let fits = r.spend(cheap.clone(), codex("fits")).await;
    assert!(!fits.is_tool_error(), "{}", fits.raw);
    let over = r.spend(cheap, codex("over")).await;
    r.stop().await;
    assert_eq!(code(&over), "budget_exceeded", "the earlier 25 cents count");
    for name in [
        callid::backend::AUTHORIZATION_FILE,
        callid::backend::EXECUTION_FILE,
    ] {
        let file = dir.path().join(state).join(name);
        assert!(!file.exists(), "{name} was imported and renamed");
    }
    assert!(
        !dir.path().join("state").exists(),
        "nothing is opened where the name leads as a URI"
    );
}

#[tokio::test]
async fn every_state_file_is_private_even_under_umask_000() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let registry = state.join("registry.sqlite3");
    let keys = dir.path().join("keys.sqlite3");
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", r#"umask 000 && exec "$@""#, "sh"])
        .arg(bin())
        .args(["router", "keys", keys.to_str().unwrap(), "--count", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r = start_router(
        dir.path(),
        registry.to_str().unwrap(),
        &["--preallocated-keys", keys.to_str().unwrap()],
    )
    .await;
    let done = spend(&r, "private-1").await;
    assert!(!done.is_tool_error(), "{}", done.raw);
    // Killed, so every journal file is still there.
    r.stop().await;
    assert_eq!(mode(&state), 0o700, "a directory callid creates");
    let mut checked = 0;
    // The authorization and execution layers keep their tables in the registry's file.
    for layer in [
        callid::backend::AUTHORIZATION_FILE,
        callid::backend::EXECUTION_FILE,
    ] {
        assert!(!state.join(layer).exists(), "{layer} is in the registry");
    }
    for db in [
        registry.clone(),
        keys.clone(),
        state.join(callid::backend::PROVIDER_LEDGER_FILE),
    ] {
        for file in [db.clone(), side(&db, "-wal"), side(&db, "-shm")] {
            if file == db || file.exists() {
                assert_eq!(mode(&file), 0o600, "{}", file.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "the journals exist: {checked} files checked");
}

#[tokio::test]
async fn a_registry_open_to_other_users_is_refused_with_the_chmod_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite3");
    std::fs::write(&registry, b"").unwrap();
    std::fs::set_permissions(&registry, std::fs::Permissions::from_mode(0o644)).unwrap();
    let fix = format!("run `chmod 600 {}`", registry.display());

    // The router refuses to start (see `registry_startup.rs` for every kind of refusal).
    let out = callid(
        dir.path(),
        &["router", "--registry", registry.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&fix), "{}", stderr(&out));
    assert!(stderr(&out).contains("has mode 0644"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&registry).unwrap(), b"", "still empty");
    assert_eq!(
        mode(&registry),
        0o644,
        "not changed behind the operator's back"
    );
    assert!(!side(&registry, "-wal").exists(), "no journal holds a key");
    assert_eq!(charges(&dir.path().join("provider-ledger.sqlite3")), 0);

    let out = callid(
        dir.path(),
        &[
            "router",
            "status",
            "hubu:public-operation:v1:x",
            "--registry",
            registry.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&fix), "{}", stderr(&out));
    insta::assert_snapshot!(
        "registry_open_to_other_users",
        stderr(&out).replace(&dir.path().display().to_string(), "[TMP]")
    );

    std::fs::set_permissions(&registry, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = start_router(dir.path(), registry.to_str().unwrap(), &[]).await;
    let done = spend(&r, "open-1").await;
    r.stop().await;
    assert!(
        !done.is_tool_error(),
        "after the chmod it works: {}",
        done.raw
    );
}

/// Leaves a WAL-mode database whose last commits are still in its `-wal`, as a killed process
/// leaves it, with `mode`.
fn with_live_wal(path: &Path, setup: &str, mode: u32) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .unwrap();
    let journal: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    c.execute_batch(setup).unwrap();
    drop(c);
    assert!(std::fs::metadata(side(path, "-wal")).unwrap().len() > 0);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn foreign_and_newer_registries_with_a_wal_are_refused_byte_for_byte_untouched() {
    let newer = format!(
        "PRAGMA application_id = {}; PRAGMA user_version = 99; CREATE TABLE future (x); \
         INSERT INTO future VALUES (1);",
        callid::testing::registry::APPLICATION_ID
    );
    for (name, setup, mode, wanted) in [
        (
            "foreign",
            "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');",
            0o644,
            "is not a callid registry",
        ),
        ("newer", newer.as_str(), 0o600, "has schema version 99"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("registry.sqlite3");
        with_live_wal(&registry, setup, mode);
        let before = bytes(&registry);

        let out = callid(
            dir.path(),
            &["router", "--registry", registry.to_str().unwrap()],
        );
        assert_eq!(bytes(&registry), before, "{name}: file or -wal changed");
        assert_eq!(out.status.code(), Some(2), "{name}");
        let message = stderr(&out);
        assert!(message.contains(wanted), "{name}: {message}");
        assert!(message.contains("left unmodified"), "{name}: {message}");

        let out = callid(
            dir.path(),
            &[
                "router",
                "approve",
                "hubu:public-operation:v1:x",
                "--registry",
                registry.to_str().unwrap(),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(stderr(&out).contains(wanted), "{name}: {}", stderr(&out));
        assert_eq!(bytes(&registry), before, "{name}: file or -wal changed");
    }
}

#[test]
fn a_key_pool_from_a_newer_callid_is_refused_untouched_never_downgraded() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("keys.sqlite3");
    let path = pool.to_str().unwrap();
    let out = callid(dir.path(), &["router", "keys", path, "--count", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        header(&pool),
        (callid::testing::preallocated::APPLICATION_ID, 2)
    );
    {
        let c = rusqlite::Connection::open(&pool).unwrap();
        c.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
        c.execute_batch("PRAGMA user_version = 3; CREATE TABLE future (x);")
            .unwrap();
    }
    let before = bytes(&pool);
    assert!(before.1.is_some(), "the newer pool has a live -wal");

    let out = callid(dir.path(), &["router", "keys", path, "--count", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("has schema version 3, newer than the 2 this callid understands"),
        "{text}"
    );
    assert_eq!(bytes(&pool), before, "file or -wal changed");
    assert_eq!(header(&pool).1, 3, "not downgraded");
}

#[test]
fn many_processes_creating_one_fresh_key_pool_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("fresh-keys.sqlite3");
    let children: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new(bin())
                .args(["router", "keys", pool.to_str().unwrap(), "--count", "5"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let c = rusqlite::Connection::open(&pool).unwrap();
    let keys: i64 = c
        .query_row("SELECT count(*) FROM keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(keys, 40);
}

#[test]
fn the_router_refuses_to_start_on_a_policy_or_prefixes_it_cannot_honour() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("r/registry.sqlite3");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "approval_models: [dall-e]\n").unwrap();
    let mut report = String::new();
    for (label, extra) in [
        (
            "an approval model the price table does not sell",
            vec![
                "--approval-model",
                "flux-pro",
                "--approval-model",
                "flux-ultra",
            ],
        ),
        (
            "a policy file's approval model",
            vec!["--policy", policy.to_str().unwrap()],
        ),
        (
            "a key prefix inside the handle prefix",
            vec!["--key-prefix", "hubu:"],
        ),
        (
            "a handle prefix inside the key prefix",
            vec!["--key-prefix", "acme:op:", "--handle-prefix", "op:"],
        ),
        ("an empty key prefix", vec!["--key-prefix", ""]),
    ] {
        let mut args = vec!["router", "--registry", registry.to_str().unwrap()];
        args.extend(extra);
        let out = callid(dir.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{label}: {}", stderr(&out));
        assert_eq!(out.stdout, b"", "{label}");
        assert!(!registry.exists(), "{label}: nothing is created first");
        report.push_str(&format!("{label}:\n{}", stderr(&out)));
    }
    insta::assert_snapshot!(
        "router_start_up_refusals",
        report.replace(&dir.path().display().to_string(), "[TMP]")
    );
}
