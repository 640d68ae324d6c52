//! TLS to the PostgreSQL registry (`sslmode`, libpq's meaning): real `callid router` processes and
//! operator commands against a real throwaway cluster with `ssl = on`, its CA and server
//! certificate made here with the `openssl` command, and against one with TLS off.
//!
//! Without PostgreSQL binaries these tests print a SKIP outside CI and fail in CI (`CI=true`),
//! where `.ci/run` installs them (and `openssl` comes with the image).

use crate::common::bin;
use crate::pg::PgCluster;
use callid::jsonrpc::{Connection, Response};
use callid::provider::{Ledger, ProviderHandle};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Output};

/// A CA, a server certificate it signed (for IP address 127.0.0.1 only, as `verify-full`
/// checks), a client certificate for role `certuser`, and a second CA that signed neither.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        for (ca, cn) in [("ca", "callid test CA"), ("wrong-ca", "callid other CA")] {
            pki.openssl(
                &["req", "-x509"],
                &ec,
                &[
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            );
        }
        std::fs::write(
            pki.path("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(pki.path("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (name, cn) in [("server", "127.0.0.1"), ("client", "certuser")] {
            pki.openssl(
                &["req", "-new"],
                &ec,
                &[
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            );
            pki.openssl(
                &["x509", "-req"],
                &[],
                &[
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-set_serial",
                    if name == "server" { "2" } else { "3" },
                    "-days",
                    "2",
                    "-extfile",
                    &format!("{name}.ext"),
                    "-out",
                    &format!("{name}.crt"),
                ],
            );
        }
        pki
    }

    fn openssl(&self, command: &[&str], key: &[&str], args: &[&str]) {
        let out = Command::new("openssl")
            .args(command)
            .args(key)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("the `openssl` command (Debian package `openssl`)");
        assert!(
            out.status.success(),
            "openssl {command:?} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `path(name)` as a URL query value.
    fn param(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

/// `callid ARGS` with `CALLID_REGISTRY=registry`.
fn callid(args: &[&str], registry: &str) -> Output {
    Command::new(bin())
        .args(args)
        .env("CALLID_REGISTRY", registry)
        .output()
        .unwrap()
}

/// Asserts `out` failed without connecting (in plaintext or otherwise) and returns its stderr.
fn refused(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{what}: connected\n{stderr}");
    assert!(
        !stderr.contains("no operation has handle"),
        "{what}: connected\n{stderr}"
    );
    stderr
}

/// `sslmode` and friends appended to the cluster's URL.
fn with(pg: &PgCluster, query: &str) -> String {
    format!("{}?{query}", pg.url())
}

/// One paid spend through `callid router --registry URL` (a real provider and its ledger): the
/// answer, and per connection of the router to the database whether it is TLS (read from
/// `pg_stat_ssl` while the router is up).
async fn spend_through_router(pg: &PgCluster, registry: &str, call_id: &str) -> (Value, Vec<bool>) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_addr = listener.local_addr().unwrap();
    let _provider: ProviderHandle =
        callid::provider::spawn(listener, Ledger::open(&ledger).unwrap(), None).unwrap();
    let args: Vec<String> = vec![
        "router".into(),
        "--provider-url".into(),
        format!("http://{provider_addr}"),
    ];
    let env: Vec<(String, String)> = vec![
        ("CALLID_REGISTRY".into(), registry.into()),
        ("XDG_DATA_HOME".into(), dir.path().display().to_string()),
    ];
    let (conn, mut child) = Connection::spawn_stdio(&bin(), &args, &env).await.unwrap();
    let init = conn
        .initialize(json!(0), "2025-06-18", "callid-tests", "1")
        .await
        .unwrap();
    assert!(init.result.is_some(), "initialize failed: {}", init.raw);
    let r: Response = conn
        .call_tool(
            json!(1),
            "generate_image",
            json!({"prompt": "an origami fox"}),
            Some(json!({"callId": call_id, "openai/session": "sess-1"})),
        )
        .await
        .unwrap_or_else(|e| panic!("spend failed: {e}\n{}", child.stderr_text()));
    assert!(!r.is_tool_error(), "{}\n{}", r.raw, child.stderr_text());
    let answer = r.structured().unwrap().clone();
    assert_eq!(answer["status"], "completed", "{}", r.raw);
    let tls = pg.sql(
        "postgres",
        "SELECT string_agg(s.ssl::text, ',' ORDER BY a.pid) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'callid-router'",
    );
    let _ = child.kill9().await;
    assert_eq!(Ledger::open(&ledger).unwrap().charge_count().unwrap(), 1);
    (answer, tls.split(',').map(|t| t == "true").collect())
}

#[tokio::test]
async fn verify_full_spends_end_to_end_and_a_wrong_ca_or_host_is_refused() {
    let Some(pg) = PgCluster::start("verify_full_spends_end_to_end") else {
        return;
    };
    let pki = Pki::new();
    pg.reconfigure(
        &[
            &pki.path("server.crt"),
            &pki.path("server.key"),
            &pki.path("ca.crt"),
        ],
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
         ssl_ca_file = 'ca.crt'",
        "hostssl all certuser 127.0.0.1/32 cert\n\
         hostssl all scramuser 127.0.0.1/32 scram-sha-256",
    );
    let ca = pki.param("ca.crt");

    // verify-full: one spend end to end, every connection of the router encrypted.
    let full = with(&pg, &format!("sslmode=verify-full&sslrootcert={ca}"));
    let (answer, tls) = spend_through_router(&pg, &full, "tls-1").await;
    assert!(
        tls.len() >= 2 && tls.iter().all(|t| *t),
        "TLS per connection: {tls:?}"
    );
    let handle = answer["handle"].as_str().unwrap().to_string();
    let status = ["router", "status", handle.as_str()];
    let out = callid(&status, &full);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["status"], "completed");

    // `prefer` (the default) and `require` without a CA: encrypted, unverified (libpq's meaning).
    for query in ["", "?sslmode=prefer", "?sslmode=require"] {
        let out = callid(&status, &format!("{}{query}", pg.url()));
        assert!(
            out.status.success(),
            "{query}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (_, tls) = spend_through_router(&pg, &with(&pg, "sslmode=prefer"), "tls-2").await;
    assert!(
        tls.iter().all(|t| *t),
        "prefer against a TLS server: {tls:?}"
    );

    // A CA that did not sign the server's certificate: refused, naming the URL and the fix;
    // `prefer` and `require` with `sslrootcert` check the CA too (as libpq does), and a failed
    // handshake is never retried in plaintext.
    let wrong = pki.param("wrong-ca.crt");
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        let url = with(&pg, &format!("sslmode={mode}&sslrootcert={wrong}"));
        let stderr = refused(&callid(&status, &url), mode);
        assert!(
            stderr.contains(&format!(
                "registry `{}?sslmode=REDACTED&sslrootcert=REDACTED` failed while connecting",
                pg.url()
            )),
            "{mode}: {stderr}"
        );
        assert!(stderr.contains("UnknownIssuer"), "{mode}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "`sslmode={mode}`: the server's certificate is not signed by a CA in \
                 `sslrootcert` ({wrong}): point `sslrootcert` at the CA certificate"
            )),
            "{mode}: {stderr}"
        );
    }

    // verify-full checks the host: the certificate names 127.0.0.1, not `localhost`;
    // verify-ca does not.
    let by_name = pg.url().replace("127.0.0.1", "localhost");
    let stderr = refused(
        &callid(
            &status,
            &format!("{by_name}?sslmode=verify-full&sslrootcert={ca}"),
        ),
        "verify-full by name",
    );
    assert!(
        stderr.contains("the server's certificate does not name the host"),
        "{stderr}"
    );
    let out = callid(
        &status,
        &format!("{by_name}?sslmode=verify-ca&sslrootcert={ca}"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A password over TLS (SCRAM, with channel binding to the server's certificate).
    pg.sql("postgres", "CREATE ROLE scramuser LOGIN PASSWORD 'hunter2'");
    pg.sql("postgres", "CREATE DATABASE scramdb OWNER scramuser");
    let scram = pg
        .url()
        .replace("callid@", "scramuser:hunter2@")
        .replace("/callid", "/scramdb");
    let out = callid(
        &["router", "status", "nope"],
        &format!("{scram}?sslmode=verify-full&sslrootcert={ca}"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no operation has handle `nope`"),
        "{stderr}"
    );
    let stderr = refused(
        &callid(
            &["router", "status", "nope"],
            &format!(
                "{}?sslmode=verify-full&sslrootcert={ca}",
                scram.replace("hunter2", "wrong")
            ),
        ),
        "a wrong password",
    );
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong@") && !stderr.contains("hunter2"),
        "{stderr}"
    );

    // A client certificate (`sslcert`, `sslkey`) for a role the server admits only by one.
    pg.sql("postgres", "CREATE ROLE certuser LOGIN");
    pg.sql("postgres", "CREATE DATABASE certdb OWNER certuser");
    let cert_url = pg
        .url()
        .replace("callid@", "certuser@")
        .replace("/callid", "/certdb");
    let verify = format!("{cert_url}?sslmode=verify-full&sslrootcert={ca}");
    let stderr = refused(
        &callid(&["router", "status", "nope"], &verify),
        "no client cert",
    );
    assert!(stderr.contains("certificate"), "{stderr}");
    let out = callid(
        &["router", "status", "nope"],
        &format!(
            "{verify}&sslcert={}&sslkey={}",
            pki.param("client.crt"),
            pki.param("client.key")
        ),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no operation has handle `nope`"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_server_without_tls_is_refused_by_require_and_above_and_prefer_falls_back() {
    let Some(pg) = PgCluster::start("a_server_without_tls_is_refused") else {
        return;
    };
    let pki = Pki::new();
    let ca = pki.param("ca.crt");
    let status = ["router", "status", "nope"];
    // The server accepts anyone in plaintext (`trust`): a fallback would have connected.
    for query in [
        "sslmode=require".to_string(),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
        format!("sslmode=verify-full&sslrootcert={ca}"),
    ] {
        let stderr = refused(&callid(&status, &with(&pg, &query)), &query);
        let mode = query.split('&').next().unwrap();
        assert!(
            stderr.contains(&format!("registry `{}?sslmode=REDACTED", pg.url())),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "server does not support TLS (`{mode}` demands TLS and the server does not \
                 offer it, so nothing was sent, never plaintext: turn TLS on in the server"
            )),
            "{stderr}"
        );
    }
    assert_eq!(
        pg.sql(
            "postgres",
            "SELECT count(*) FROM pg_database WHERE datname = 'callid'"
        ),
        "1"
    );
    assert_eq!(
        pg.sql(
            "callid",
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'callid%'"
        ),
        "0",
        "nothing reached the database"
    );
    // `prefer` (and no `sslmode`) fall back to plaintext: one spend, no TLS.
    let (_, tls) = spend_through_router(&pg, &with(&pg, "sslmode=prefer"), "plain-1").await;
    assert!(tls.len() >= 2 && tls.iter().all(|t| !*t), "{tls:?}");
    let out = callid(&status, &pg.url());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no operation has handle `nope`"),
        "{stderr}"
    );
}
