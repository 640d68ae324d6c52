//! Integration tests of `callid conform`'s upstream MCP role (`backend: upstream`): `callid
//! gateway` judged through it over stdio (`{upstream_argv}`) and streamable HTTP
//! (`{upstream_url}`), crash checks included; a gateway-like proxy whose flaws double-charge,
//! caught and blamed on the upstream's count; `{upstream_command}`; and the stdio relay itself.

use crate::common::conform::{conform, verdicts};
use crate::common::{bin, repo};
use callid::conform::RunnerProvider;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs the whole suite against a gateway profile: every required check passes (the crash
/// checks included: they fail unless the upstream's kill trigger fired) but those written for the
/// other kind of backend (skipped, saying why), and the one recommended check the gateway does
/// not follow is reported as such.
fn gateway_passes(profile: &str, idempotent: bool) {
    let output = conform(&["--target", profile, "--format", "json"]);
    let verdicts = verdicts(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{verdicts:#?}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let scenarios = std::fs::read_dir(repo().join("scenarios"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "yaml")
        })
        .count();
    assert_eq!(verdicts.len(), scenarios);
    for (id, (verdict, reason, level)) in &verdicts {
        if id == "convention.status-returns-result" {
            // The gateway's status tool wraps the upstream's whole tool result.
            assert_eq!((verdict.as_str(), level.as_str()), ("fail", "recommended"));
            assert!(
                reason.contains("the result differs from `first`'s"),
                "{reason}"
            );
        } else if !crate::common::conform::skipped_for_its_backend(id, verdict, reason, idempotent)
        {
            assert_eq!(verdict, "pass", "{id} ({level}): {reason}");
        }
    }
    let judged: &[&str] = if idempotent {
        crate::common::conform::ID_KEYED_RESEND
    } else {
        &[
            "at-most-once.crash-before-charge",
            "at-most-once.crash-after-charge",
            "at-most-once.provider-failure",
            "at-most-once.after-timeout",
        ]
    };
    for id in judged {
        assert_eq!(verdicts[*id].0, "pass", "{id}");
    }
}

#[test]
fn the_gateway_with_a_stdio_upstream_passes_every_required_check() {
    gateway_passes("scenarios/targets/gateway.yaml", true);
}

#[test]
fn the_gateway_with_an_http_upstream_passes_every_required_check() {
    gateway_passes("scenarios/targets/gateway-http.yaml", true);
}

/// In front of an upstream that charges every request, with `generate_image` not declared
/// idempotent, the gateway sends each operation at most once and answers in doubt until
/// `resolve`: the `at-most-once.*` checks pass, the keyed re-send checks are skipped.
#[test]
fn the_gateway_at_most_once_passes_against_an_upstream_that_charges_every_request() {
    gateway_passes("scenarios/targets/gateway-at-most-once.yaml", false);
}

/// The proxy fixture's profile with `flags` before `--` (or the upstream as one string).
fn proxy_profile(dir: &Path, flags: &[&str], one_string: bool) -> String {
    let fixture = repo().join("tests/fixtures/broken_routers");
    let mut args: Vec<String> = vec![format!("{}/proxy.py", fixture.display())];
    args.extend(flags.iter().map(|f| f.to_string()));
    if one_string {
        args.extend(["--upstream-command".into(), "{upstream_command}".into()]);
    } else {
        args.extend(["--".into(), "{upstream_argv}".into()]);
    }
    let base = std::fs::read_to_string(fixture.join("profile-proxy.yaml")).unwrap();
    let text = base.replace(
        "args: [\"{profile_dir}/proxy.py\", --, \"{upstream_argv}\"]",
        &format!("args: {}", json!(args)),
    );
    assert_ne!(text, base);
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const MONEY_CHECKS: &[&str] = &[
    "redelivery.same-connection",
    "crash.after-charge-before-reply",
    "crash.after-dispatch-before-charge",
];

fn run_proxy(flags: &[&str], one_string: bool) -> BTreeMap<String, (String, String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let profile = proxy_profile(dir.path(), flags, one_string);
    let mut args = vec!["--target", profile.as_str(), "--format", "json"];
    for id in MONEY_CHECKS {
        args.extend(["--only", id]);
    }
    verdicts(&conform(&args))
}

#[test]
fn a_proxy_that_forwards_redeliveries_without_a_key_is_caught_by_the_upstream_count() {
    // Keyed, the upstream's idempotency saves even a proxy that forwards every delivery, over
    // either stdio form.
    for one_string in [false, true] {
        let verdicts = run_proxy(&["--flaw", "forward-redelivery"], one_string);
        for id in MONEY_CHECKS {
            assert_eq!(verdicts[*id].0, "pass", "{id}: {}", verdicts[*id].1);
        }
    }
    // Without a key the upstream charges every forwarded call, and says so.
    let verdicts = run_proxy(&["--flaw", "no-key", "--flaw", "forward-redelivery"], false);
    let want = [
        (
            "redelivery.same-connection",
            "steps[1] (redeliver `first`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge",
        ),
        (
            "crash.after-charge-before-reply",
            "steps[2] (redeliver `again`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge",
        ),
        (
            "crash.after-dispatch-before-charge",
            "steps[3] (redeliver `first`): the upstream saw 3 dispatches, 2 charges in this scenario; expected 1 charge",
        ),
    ];
    for (id, reason) in want {
        assert_eq!(
            (verdicts[id].0.as_str(), verdicts[id].1.as_str()),
            ("fail", reason),
            "{id}"
        );
    }
    // A memory-only proxy without a key: only a restart shows the double charge.
    let verdicts = run_proxy(&["--flaw", "no-key"], true);
    assert_eq!(verdicts["redelivery.same-connection"].0, "pass");
    assert_eq!(
        verdicts["crash.after-charge-before-reply"].1,
        "steps[2] (redeliver `again`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge"
    );
}

fn send(stdin: &mut std::process::ChildStdin, message: Value) {
    use std::io::Write as _;
    writeln!(stdin, "{message}").unwrap();
    stdin.flush().unwrap();
}

fn receive(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Value {
    let line = lines.next().expect("a line").unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relay_bridges_stdio_to_the_runner_upstream() {
    use std::io::BufRead as _;
    let upstream = RunnerProvider::start_upstream("127.0.0.1:0").await.unwrap();
    let url = upstream.url();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    let mut child = Command::new(bin())
        .args(["conform-upstream-relay", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let call = |id: u32, meta: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "generate_image", "arguments": {"prompt": "fox", "width": 512}, "_meta": meta}})
    };
    let (reply, mut stdin, mut lines) = tokio::task::spawn_blocking(move || {
        send(
            &mut stdin,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}),
        );
        let init = receive(&mut lines);
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
        send(
            &mut stdin,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        send(
            &mut stdin,
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        );
        let list = receive(&mut lines);
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["generate_image", "list_charges"]);
        let mut replies = Vec::new();
        for (id, meta) in [
            (2, json!({"callid/idempotency-key": "k1"})),
            (3, json!({"callid/idempotency-key": "k1"})),
            (4, json!({})),
            (5, json!({})),
        ] {
            send(&mut stdin, call(id, meta));
            replies.push(receive(&mut lines));
        }
        (replies, stdin, lines)
    })
    .await
    .unwrap();
    assert_eq!(reply[0]["id"], 2);
    let receipt = &reply[0]["result"]["structuredContent"];
    assert_eq!(reply[1]["result"]["structuredContent"], *receipt);
    assert_eq!(
        reply[1]["result"]["_meta"]["callid-provider/replayed"],
        true
    );
    assert_ne!(
        reply[2]["result"]["structuredContent"]["charge_id"],
        reply[3]["result"]["structuredContent"]["charge_id"]
    );
    // One charge for the key, one for each call without a key.
    assert_eq!(upstream.charge_count().unwrap(), 3);
    assert_eq!(
        upstream.hooks().keys_seen(),
        ["k1", "k1", callid::conform::NO_KEY, callid::conform::NO_KEY]
    );
    // An upstream outage ends the relay: to the router, its stdio upstream died mid-call.
    upstream.hooks().fail_next(503);
    let status = tokio::task::spawn_blocking(move || {
        send(&mut stdin, call(6, json!({"callid/idempotency-key": "k2"})));
        assert!(lines.next().is_none(), "no answer after an outage");
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert!(!status.0.success());
    assert!(status.1.contains("answered HTTP 503"), "{}", status.1);
    assert_eq!(upstream.charge_count().unwrap(), 3);
}

/// Every shipped target profile (callid's own and the third-party ones) loads: a renamed field or
/// placeholder would otherwise surface only when someone runs that profile.
#[test]
fn every_shipped_target_profile_loads() {
    let mut seen = 0;
    let mut dirs = vec![crate::common::repo().join("scenarios/targets")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && !path.to_string_lossy().ends_with("-policy.yaml")
            {
                // Parsed, not loaded: loading also wants the `{env:NAME}` variables set.
                let text = std::fs::read_to_string(&path).unwrap();
                let dir = path.parent().unwrap().to_path_buf();
                callid::conform::Profile::parse(&text, &path.display().to_string(), dir)
                    .unwrap_or_else(|e| panic!("{e}"));
                seen += 1;
            }
        }
    }
    assert!(seen >= 10, "only {seen} profiles found");
}

/// The gateway with `generate_image` declared idempotent re-sends an operation under its key
/// after a crash: right against an upstream that honours the key, a second charge against one
/// that charges every request, which the at-most-once profile's upstream plays.
#[test]
fn a_gateway_that_re_sends_under_its_key_fails_against_an_upstream_that_charges_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let targets = repo().join("scenarios/targets");
    let base = std::fs::read_to_string(targets.join("gateway-at-most-once.yaml")).unwrap();
    let text = base.replace(
        "{profile_dir}/gateway-at-most-once-policy.yaml",
        &targets.join("gateway-policy.yaml").display().to_string(),
    );
    assert_ne!(text, base);
    let profile = dir.path().join("profile.yaml");
    std::fs::write(&profile, text).unwrap();
    let verdicts = verdicts(&conform(&[
        "--target",
        profile.to_str().unwrap(),
        "--format",
        "json",
        "--only",
        "at-most-once.crash-after-charge",
    ]));
    assert_eq!(
        verdicts["at-most-once.crash-after-charge"].1,
        "steps[2] (redeliver `again`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge"
    );
}

/// A pure pass-through proxy (`proxy.py --transparent`: no handle, no status, nothing kept or
/// refused) is judged on what it can show: `pass` where forwarding everything keeps the rule,
/// `fail` with the upstream's charge count where it breaks it, `not run` where nothing of the
/// rule could be checked; never a failure for the handle or status its profile declares absent.
#[test]
fn a_transparent_proxy_is_judged_on_what_it_can_show() {
    let profile = repo().join("tests/fixtures/broken_routers/profile-transparent.yaml");
    let output = conform(&[
        "--target",
        profile.to_str().unwrap(),
        "--allow-incomplete",
        "--format",
        "json",
    ]);
    let verdicts = verdicts(&output);
    for keeps in ["identity.same-id-two-platforms", "schema.no-identity-field"] {
        assert_eq!(verdicts[keeps].0, "pass", "{keeps}: {}", verdicts[keeps].1);
    }
    assert_eq!(
        verdicts["redelivery.same-connection"],
        (
            "fail".to_string(),
            "steps[1] (redeliver `first`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge".to_string(),
            "required".to_string()
        )
    );
    for (id, (verdict, reason, _)) in &verdicts {
        assert!(
            !reason.contains("expected status") && !reason.contains("handle ("),
            "{id} is judged on a field its profile declares absent: {verdict}: {reason}"
        );
    }
    let table: String = verdicts
        .iter()
        .map(|(id, (verdict, reason, _))| format!("{id}: {verdict}: {reason}\n"))
        .collect();
    // How many of a burst's dispatches overlap depends on scheduling; their number does not.
    insta::with_settings!({filters => vec![
        (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
        (r"\(\d+ at once\)", "([N] at once)"),
    ]}, {
        insta::assert_snapshot!(table);
    });
}

/// A profile that names a status the router never sends (the transparent proxy judged as if it
/// had one): the missing status at the first call does not end the check, and the reason leads
/// with the broken core expectation, the upstream's second charge at the redelivery.
#[test]
fn a_broken_charge_count_leads_a_missing_status() {
    let fixture = repo().join("tests/fixtures/broken_routers");
    let base = std::fs::read_to_string(fixture.join("profile-transparent.yaml")).unwrap();
    let text = base
        .replace("status: null", "status: /structuredContent/status")
        .replace("{profile_dir}", fixture.to_str().unwrap());
    assert_ne!(text, base);
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("transparent.yaml");
    std::fs::write(&profile, text).unwrap();
    let output = conform(&[
        "--target",
        profile.to_str().unwrap(),
        "--format",
        "json",
        "--only",
        "redelivery.same-connection",
    ]);
    assert_eq!(
        verdicts(&output)["redelivery.same-connection"].1,
        "steps[1] (redeliver `first`): the upstream saw 2 dispatches, 2 charges in this scenario; expected 1 charge (also steps[0] (call `first`): expected status `completed`, got none at `/structuredContent/status`)"
    );
}
