//! What ROUTER-CONTRACT.md now answers and the runner checks (issue 23, item 4): the code of the
//! reply to a provider failure, and `--url` driven with a `--target` profile's names.

use crate::common::conform::{code, conform_in, stderr, verdicts};
use crate::common::{bin, repo};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The broken-router fixture's profile (contract names), with `extra` appended and its
/// `{profile_dir}` made absolute, written to `dir`.
fn python_profile(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let fixtures = repo().join("tests/fixtures/broken_routers");
    let text = std::fs::read_to_string(fixtures.join("profile.yaml"))
        .unwrap()
        .replace("{profile_dir}", &fixtures.display().to_string());
    let path = dir.join("profile.yaml");
    std::fs::write(&path, format!("{text}{extra}")).unwrap();
    path
}

/// The runner checks the code of the reply to a provider failure: a router that answers
/// `provider_unavailable` where its profile says it has another name fails the check, naming both.
#[test]
fn a_provider_failure_is_judged_on_its_error_code() {
    let dir = tempfile::tempdir().unwrap();
    let id = "redelivery.after-provider-failure";
    let right = python_profile(dir.path(), "");
    let output = conform_in(
        dir.path(),
        &[
            "--target",
            right.to_str().unwrap(),
            "--format",
            "json",
            "--only",
            id,
        ],
        &[],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let renamed = dir.path().join("renamed");
    std::fs::create_dir(&renamed).unwrap();
    let wrong = python_profile(
        &renamed,
        "error_codes: {provider_unavailable: E_PROVIDER_DOWN}\n",
    );
    let output = conform_in(
        dir.path(),
        &[
            "--target",
            wrong.to_str().unwrap(),
            "--format",
            "json",
            "--only",
            id,
        ],
        &[],
    );
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let (verdict, reason, _) = &verdicts(&output)[id];
    assert_eq!(verdict, "fail");
    assert!(
        reason.starts_with(
            "steps[0] (call `first`): expected the tool error `E_PROVIDER_DOWN`, got the tool error `provider_unavailable`"
        ),
        "{reason}"
    );
}

/// The reference router serving streamable HTTP on a free port, until dropped.
struct HttpRouter {
    child: Child,
    url: String,
    _state: tempfile::TempDir,
}

impl HttpRouter {
    fn start() -> HttpRouter {
        let state = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin())
            .args([
                "router",
                "--http",
                &format!("127.0.0.1:{port}"),
                "--registry",
            ])
            .arg(state.path().join("registry.sqlite3"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the router did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpRouter {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            _state: state,
        }
    }
}

impl Drop for HttpRouter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--url` with `--target`: the profile's names drive the router at the URL (not the profile's
/// own `url`, and its `command` is not started), so a profile that gives the refusal another name
/// is judged by that name.
#[test]
fn url_with_a_target_drives_the_router_there_with_the_profiles_names() {
    let router = HttpRouter::start();
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("refusal.yaml"),
        "id: own.missing-identity-named\ntitle: t\nrule: r\narticle: q\nsteps:\n  - {do: call, expect: {error: missing_identity}}\n",
    )
    .unwrap();
    // Its own URL points where nothing listens, and its command would fail: neither is used.
    let shipped = std::fs::read_to_string(repo().join("scenarios/targets/reference-http.yaml"))
        .unwrap()
        .replace(
            "url: \"http://127.0.0.1:{port}/mcp\"",
            "url: \"http://127.0.0.1:9/mcp\"",
        )
        .replace("command: \"{callid}\"", "command: /nonexistent/router");
    assert!(shipped.contains("127.0.0.1:9/mcp") && shipped.contains("/nonexistent/router"));
    let run = |profile: &str| {
        let path = dir.path().join("target.yaml");
        std::fs::write(&path, profile).unwrap();
        conform_in(
            dir.path(),
            &[
                "--target",
                path.to_str().unwrap(),
                "--url",
                &router.url,
                "--scenarios",
                scenarios.to_str().unwrap(),
                "--only",
                "own.missing-identity-named",
                "--format",
                "json",
            ],
            &[],
        )
    };
    let output = run(&shipped);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        doc["target"],
        "callid reference router over streamable HTTP"
    );
    let renamed = run(&format!(
        "{shipped}error_codes: {{missing_identity: no_call_id}}\n"
    ));
    assert_eq!(code(&renamed), 1, "{}", stderr(&renamed));
    let (verdict, reason, _) = &verdicts(&renamed)["own.missing-identity-named"];
    assert_eq!(verdict, "fail");
    assert!(
        reason.contains(
            "expected the tool error `no_call_id`, got the tool error `missing_identity`"
        ),
        "{reason}"
    );
}
