//! PostgreSQL connection URLs: [`PgUrl`], parsed and checked once, shown only redacted, and the
//! one way every PostgreSQL session of callid is opened ([`PgUrl::connect`], or
//! [`PgUrl::session`] for one that pipelines: [`PgSession`]): the connection settings and TLS;
//! and the one way a schema is migrated ([`migrate`], schemas in [`super::schema`]).
//!
//! The router's registry ([`crate::spend::registry`]) and the backend's shared state
//! ([`crate::backend::shared`]) live in the same database and connect through this one type, so
//! both redact the same way, speak TLS the same way and both notice a vanished server within the
//! same time. Whether a `FILE|URL` value (`--registry`) names a database, a file, or a URL
//! callid does not serve is decided in one place too: [`database_url`].
//!
//! # TLS (`sslmode`, libpq's meaning)
//! | `sslmode` | TLS | server certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | if the server offers it, else plaintext | no, unless `sslrootcert` is given: then as `verify-ca` |
//! | `require` | always; a server without TLS is refused | no, unless `sslrootcert` is given: then as `verify-ca` |
//! | `verify-ca` | always | signed by a CA in `sslrootcert` |
//! | `verify-full` | always | as `verify-ca`, and it names the URL's host (a DNS name or an IP address) |
//!
//! As in libpq, `require` without `sslrootcert` encrypts but does not authenticate the server: it
//! stops a passive eavesdropper, not an active one (SCRAM's channel binding, used when the server
//! offers it, still stops a relaying man in the middle from logging in as you). Use `verify-full`
//! across networks you do not control. A TLS handshake that fails is an error in every mode, never
//! retried in plaintext (libpq's `prefer` would retry). Over a Unix socket (`?host=/dir`) the
//! server never offers TLS, so `require` and above are refused there (libpq ignores them).
//!
//! Query parameters: `sslmode`, `sslrootcert=PATH` (PEM, one or more CA certificates; required by
//! `verify-ca` and `verify-full`: unlike libpq there is no default `~/.postgresql/root.crt`, and
//! `system` is refused), `sslcert=PATH` and `sslkey=PATH` (PEM client certificate chain and its
//! key, both or neither). The files are read once, when the URL is parsed (a bad file is refused
//! there, naming it); replacing them needs a restart. TLS runs on rustls with the `ring` provider
//! (TLS 1.2 and 1.3), offering ALPN `postgresql`.
//!
//! # Guarantees
//! - `Display` and `Debug` show the password and every query value as `REDACTED` (the user
//!   stays: it names the role to check); so does [`BadPgUrl`], the error of a URL that is not
//!   usable.
//! - A [`PgUrl`] names a host and a database and is accepted by the `postgres` client's own
//!   parser, so connecting never fails for the URL's syntax.
//! - Never a downgrade: with `require`, `verify-ca` or `verify-full`, a server that does not
//!   offer TLS is refused before anything (user name, password, query) is sent, and so is a
//!   certificate that fails the mode's checks. [`PgUrl::explain`] names the cause and the fix
//!   (and the `sslrootcert` path: a CA certificate is no secret).
//! - A session the server ended while it sat idle (a restart) is found and replaced before a
//!   statement is sent on it ([`session_gone`]), so the first calls after a restart succeed.
//! - [`migrate`] applies a schema's missing migrations in one transaction under an advisory
//!   lock, so replicas starting at once apply them once; a database whose marker names another
//!   application, one with the schema's tables but no marker, or one newer than this build is
//!   refused, unchanged.

use postgres::Config;
use postgres::config::SslMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

/// `--registry` is a URL this build cannot use: a PostgreSQL URL that does not work, or another
/// scheme. Never carries a password.
#[derive(Debug, thiserror::Error)]
pub enum BadPgUrl {
    /// A `postgres://` URL that cannot be used.
    #[error(
        "registry URL `{url}` is not usable: {detail}; pass `postgres://USER@HOST:PORT/DATABASE`"
    )]
    Unusable {
        /// The URL, password redacted.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// A `SCHEME://` callid serves no registry at (shown by its scheme only: the rest may hold a
    /// password and need not parse).
    #[error(
        "registry `{scheme}://…` names a scheme callid does not serve; pass a SQLite file path \
         (a relative one that holds `://` as `./PATH`) or `postgres://USER@HOST:PORT/DATABASE` \
         (`postgresql://` too, in any letter case)"
    )]
    Scheme {
        /// The scheme as given.
        scheme: String,
    },
}

/// What a `FILE|URL` value (`--registry`, `CALLID_REGISTRY`, a conform profile's `registry`)
/// names: `Some` database, or `None` for a file path. The one rule: after trimming white space,
/// a value that starts `SCHEME://` (RFC 3986's scheme, of two characters or more) is a URL;
/// `postgres` and `postgresql`, in any letter case, are a database ([`PgUrl::parse`]); any other
/// scheme is refused ([`BadPgUrl::Scheme`]) rather than taken as a file named after the URL.
/// Everything else is a path, as given.
pub fn database_url(text: &std::ffi::OsStr) -> Result<Option<PgUrl>, BadPgUrl> {
    let lossy = text.to_string_lossy();
    let Some(scheme) = url_scheme(lossy.trim()) else {
        return Ok(None);
    };
    match text.to_str() {
        Some(text) => PgUrl::parse(text).map(Some),
        None => Err(BadPgUrl::Unusable {
            url: format!("{scheme}://…"),
            detail: "it is not UTF-8".into(),
        }),
    }
}

/// The scheme of `text` when it starts `SCHEME://` (RFC 3986: a letter, then letters, digits,
/// `+`, `-` or `.`), of at least two characters so that a drive letter (`C://x`) stays a path.
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = scheme.len() >= 2
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

/// What `sslmode` asks for (libpq's meaning; see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// `disable`: plaintext only.
    Disable,
    /// `prefer`: TLS if the server offers it, unverified; plaintext otherwise.
    Prefer,
    /// `require`: TLS or nothing; unverified unless `sslrootcert` is given.
    Require,
    /// `verify-ca`: TLS, certificate signed by a CA in `sslrootcert`.
    VerifyCa,
    /// `verify-full`: as `VerifyCa`, and the certificate names the host.
    VerifyFull,
}

impl TlsMode {
    fn parse(value: &str) -> Result<TlsMode, String> {
        Ok(match value {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            "allow" => {
                return Err(
                    "`sslmode=allow` (plaintext first) is not supported: use `prefer` \
                            (TLS first) or `disable`"
                        .into(),
                );
            }
            _ => {
                return Err(format!(
                    "`sslmode={value}` is not one of disable, prefer, require, verify-ca, \
                     verify-full"
                ));
            }
        })
    }

    /// The `sslmode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Prefer => "prefer",
            TlsMode::Require => "require",
            TlsMode::VerifyCa => "verify-ca",
            TlsMode::VerifyFull => "verify-full",
        }
    }
}

/// The TLS part of a URL: its mode and files.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TlsParams {
    mode: TlsMode,
    root_cert: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
}

/// A `postgres://` URL whose password (and query values) are redacted wherever it is shown.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct PgUrl(Arc<Parsed>);

struct Parsed {
    /// The URL without the TLS parameters, which the `postgres` client does not know.
    driver: String,
    redacted: String,
    tls: TlsParams,
    /// Built once from `tls`; `None` for `sslmode=disable`.
    connector: Option<MakeRustlsConnect>,
}

impl PartialEq for PgUrl {
    fn eq(&self, other: &PgUrl) -> bool {
        self.0.driver == other.0.driver && self.0.tls == other.0.tls
    }
}

impl Eq for PgUrl {}

/// The query parameters [`PgUrl`] handles itself (libpq's names).
const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl PgUrl {
    /// Parses and checks a `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=...]` URL,
    /// reading the TLS files it names.
    ///
    /// The scheme matches in any letter case (`Postgres://`); another scheme is refused
    /// ([`BadPgUrl::Scheme`]).
    pub fn parse(text: &str) -> Result<PgUrl, BadPgUrl> {
        let text = text.trim();
        let bad = |redacted: String, detail: &str| BadPgUrl::Unusable {
            url: redacted,
            detail: detail.to_string(),
        };
        let text = match url_scheme(text) {
            Some(scheme)
                if scheme.eq_ignore_ascii_case("postgres")
                    || scheme.eq_ignore_ascii_case("postgresql") =>
            {
                format!("{}{}", scheme.to_ascii_lowercase(), &text[scheme.len()..])
            }
            Some(scheme) => {
                return Err(BadPgUrl::Scheme {
                    scheme: scheme.to_string(),
                });
            }
            None => text.to_string(),
        };
        let text = text.as_str();
        let url = reqwest::Url::parse(text)
            .map_err(|e| bad("postgres://…".into(), &format!("it does not parse ({e})")))?;
        let redacted = redact(&url);
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad(redacted, "it names no host"));
        }
        if url.path().trim_matches('/').is_empty() {
            return Err(bad(redacted, "it names no database"));
        }
        let (driver, tls) = split_tls_params(text).map_err(|d| bad(redacted.clone(), &d))?;
        Config::from_str(&driver).map_err(|e| bad(redacted.clone(), &error_chain(&e)))?;
        let connector = tls_connector(&tls).map_err(|d| bad(redacted.clone(), &d))?;
        Ok(PgUrl(Arc::new(Parsed {
            driver,
            redacted,
            tls,
            connector,
        })))
    }

    /// The `sslmode` in force (`prefer` when the URL names none).
    pub fn tls_mode(&self) -> TlsMode {
        self.0.tls.mode
    }

    fn config(&self) -> Config {
        Config::from(self.async_config())
    }

    fn async_config(&self) -> tokio_postgres::Config {
        let mut config =
            tokio_postgres::Config::from_str(&self.0.driver).expect("checked in PgUrl::parse");
        config.ssl_mode(ssl_mode(self.0.tls.mode));
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        if config.get_application_name().is_none() {
            config.application_name("callid-router");
        }
        // A replica on a machine that vanished (no FIN) is noticed within about 8 s.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(8));
        config
    }

    /// Opens one session: [`PgUrl::config`]'s settings, TLS as `sslmode` says. An error's
    /// `Display` is terse: show it with [`PgUrl::explain`].
    pub fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        let config = self.config();
        match &self.0.connector {
            Some(tls) => config.connect(tls.clone()),
            None => config.connect(postgres::NoTls),
        }
    }

    /// Opens one session that can pipeline ([`PgSession`]), with [`PgUrl::connect`]'s
    /// settings and TLS.
    pub fn session(&self) -> Result<PgSession, postgres::Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        let config = self.async_config();
        let client = runtime.block_on(async {
            let (client, connection) = match &self.0.connector {
                Some(tls) => {
                    let (client, connection) = config.connect(tls.clone()).await?;
                    (client, tokio::spawn(connection))
                }
                None => {
                    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
                    (client, tokio::spawn(connection))
                }
            };
            drop(connection);
            Ok::<_, postgres::Error>(client)
        })?;
        Ok(PgSession { runtime, client })
    }

    /// `error` (from a session of this URL) in full: its causes, and for a TLS failure what to
    /// change. The `postgres` client's own `Display` names only the kind ("error performing TLS
    /// handshake", "db error").
    pub fn explain(&self, error: &postgres::Error) -> String {
        let text = error_chain(error);
        match self.tls_fix(error) {
            Some(fix) => format!("{text} ({fix})"),
            None => text,
        }
    }

    fn tls_fix(&self, error: &postgres::Error) -> Option<String> {
        let mode = self.0.tls.mode.as_str();
        let root = || {
            self.0
                .tls
                .root_cert
                .as_deref()
                .map_or("-".into(), |p| p.display().to_string())
        };
        let mut source = std::error::Error::source(error);
        while let Some(e) = source {
            if e.to_string() == "server does not support TLS" {
                return Some(format!(
                    "`sslmode={mode}` demands TLS and the server does not offer it, so nothing \
                     was sent, never plaintext: turn TLS on in the server (`ssl = on` with \
                     `ssl_cert_file` and `ssl_key_file`), or, on a network you trust, use \
                     `sslmode=prefer` or `disable`"
                ));
            }
            let inner = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .or_else(|| e.downcast_ref::<rustls::Error>());
            if let Some(rustls::Error::InvalidCertificate(cert)) = inner {
                return Some(match cert {
                    CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                        "`sslmode={mode}`: the server's certificate is not signed by a CA in \
                         `sslrootcert` ({}): point `sslrootcert` at the CA certificate that \
                         issued the server's `ssl_cert_file`",
                        root()
                    ),
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. } => format!(
                        "`sslmode={mode}`: the server's certificate does not name the host this \
                         URL connects to: connect by a name (or IP address) the certificate \
                         lists, or reissue it with this host among its subject alternative \
                         names"
                    ),
                    CertificateError::Expired
                    | CertificateError::ExpiredContext { .. }
                    | CertificateError::NotValidYet
                    | CertificateError::NotValidYetContext { .. } => format!(
                        "`sslmode={mode}`: the server's certificate is outside its validity \
                         period: renew it (or check this machine's clock)"
                    ),
                    _ => format!("`sslmode={mode}`: the server's certificate was refused"),
                });
            }
            if let Some(rustls::Error::AlertReceived(alert)) = inner {
                return Some(format!(
                    "the server ended the TLS handshake ({alert:?}): it may require a client \
                     certificate (`sslcert` and `sslkey`) or refuse the one given"
                ));
            }
            source = e.source();
        }
        None
    }
}

/// `sslmode` as the `postgres` client knows it: it negotiates, the connector checks.
fn ssl_mode(mode: TlsMode) -> SslMode {
    match mode {
        TlsMode::Disable => SslMode::Disable,
        TlsMode::Prefer => SslMode::Prefer,
        TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
    }
}

/// `error` and each of its sources, joined by `: ` (an I/O error's inner error included).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next: Option<&(dyn std::error::Error + 'static)> = error.source();
    while let Some(e) = next {
        let part = e.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        // `io::Error::source` skips the error it wraps: step into it.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) if inner.to_string() != part => Some(inner),
            _ => e.source(),
        };
    }
    text
}

/// The URL without libpq's TLS parameters (kept byte for byte otherwise), and those parameters.
fn split_tls_params(text: &str) -> Result<(String, TlsParams), String> {
    let (head, fragment) = match text.split_once('#') {
        Some((head, _)) => (head, true),
        None => (text, false),
    };
    if fragment {
        return Err("it has a `#fragment`".into());
    }
    let (base, query) = head.split_once('?').unwrap_or((head, ""));
    let mut kept = Vec::new();
    let mut mode = TlsMode::Prefer;
    let (mut root_cert, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k)?, percent_decode(v)?);
        if !TLS_PARAMS.contains(&k.as_str()) {
            kept.push(pair);
            continue;
        }
        let path = || {
            if v.is_empty() {
                Err(format!("`{k}` is empty"))
            } else {
                Ok(PathBuf::from(&v))
            }
        };
        match k.as_str() {
            "sslmode" => mode = TlsMode::parse(&v)?,
            "sslrootcert" if v == "system" => {
                return Err(
                    "`sslrootcert=system` (the operating system's CAs) is not supported: \
                            give the path of the CA certificate that signed the server's"
                        .into(),
                );
            }
            "sslrootcert" => root_cert = Some(path()?),
            "sslcert" => cert = Some(path()?),
            _ => key = Some(path()?),
        }
    }
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err("`sslcert` and `sslkey` go together: give both or neither".into()),
    };
    if matches!(mode, TlsMode::VerifyCa | TlsMode::VerifyFull) && root_cert.is_none() {
        return Err(format!(
            "`sslmode={}` checks the server's certificate against `sslrootcert=PATH` (the CA \
             certificate, PEM), which it does not name",
            mode.as_str()
        ));
    }
    let driver = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((
        driver,
        TlsParams {
            mode,
            root_cert,
            client_cert,
        },
    ))
}

/// libpq's URI decoding: `%XX` only (a `+` stays a `+`).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "a query parameter has a bad `%` escape".to_string())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a query parameter is not UTF-8".to_string())
}

/// The rustls connector for `tls` (`None` for `disable`), its files read now.
fn tls_connector(tls: &TlsParams) -> Result<Option<MakeRustlsConnect>, String> {
    if tls.mode == TlsMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &tls.root_cert {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(path, "sslrootcert")? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "`sslrootcert` ({}) holds a bad certificate: {e}",
                        path.display()
                    )
                })?;
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("`sslrootcert` ({}): {e}", path.display()))?;
            if tls.mode == TlsMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
        _ => Arc::new(Unverified(provider)),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &tls.client_cert {
        Some((cert, key)) => {
            let chain = read_certs(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "`sslkey` ({}) is not a PEM private key: {e}",
                    Path::new(key).display()
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("`sslcert` and `sslkey` do not make a client identity: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The PEM certificates in `path` (at least one).
fn read_certs(path: &Path, param: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("`{param}` ({}) cannot be read as PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "`{param}` ({}) holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

/// `verify-ca` (and `prefer` or `require` with `sslrootcert`): the chain must lead to a CA in
/// `sslrootcert`; the name is not checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first and the name last: a name error means the chain held.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without `sslrootcert` (libpq's meaning): any certificate; the
/// handshake's signatures are still checked, so the session is bound to the certificate's key.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.redacted)
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgUrl({})", self.0.redacted)
    }
}

/// The URL with its password and every query value replaced by `REDACTED` (the user stays).
fn redact(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("REDACTED"));
    }
    if url.query().is_some() {
        let pairs: Vec<String> = url
            .query_pairs()
            .map(|(k, _)| format!("{k}=REDACTED"))
            .collect();
        shown.set_query(Some(&pairs.join("&")));
    }
    shown.set_fragment(None);
    shown.to_string()
}

/// How long a session may sit idle before [`session_gone`] checks it with a round trip: shorter
/// than any server restart (stopping and starting a server takes longer than this).
pub const IDLE_CHECK: Duration = Duration::from_millis(100);

/// How long [`session_gone`]'s round trip may take before the session counts as gone.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `client`'s session is gone, `idle` after it last answered; every session of callid is
/// checked so before it is used, and one that is gone is replaced by a new one.
///
/// callid's sync client reads the socket only while it runs a statement, so a session the server
/// ended while it sat idle (a restart, `pg_terminate_backend`, an idle timeout) still looks open,
/// and the next statement sent on it would fail. So: a session idle for [`IDLE_CHECK`] or more
/// runs an empty query first (it changes nothing, so it is safe whatever happens to it); a
/// session used more recently than that is only polled for what already arrived. A statement that
/// fails once it was sent is never retried here: it may have committed.
pub fn session_gone(client: &mut postgres::Client, idle: Duration) -> bool {
    use postgres::fallible_iterator::FallibleIterator as _;
    // Polls once without waiting (callid's sessions never `LISTEN`, so no notification is
    // taken); an error is the session ending, which `is_closed` then says.
    let _ = client.notifications().iter().next();
    if client.is_closed() {
        return true;
    }
    idle >= IDLE_CHECK && (client.is_valid(CHECK_TIMEOUT).is_err() || client.is_closed())
}

/// A session whose statements can be pipelined: several requests sent in one flight before
/// the first answer is read ([`PgSession::send`]), so they cost one round trip together. The
/// sync `postgres` client waits for each answer; this one drives `tokio-postgres` on a runtime
/// of its own, which runs only inside its calls (so, like that client, it must be called and
/// dropped off any async task: [`drop_off_runtime`]). Requests go out in the order they are
/// sent, and the server answers them in that order.
pub struct PgSession {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl PgSession {
    /// The client, to build a request's future with.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Runs `future` (requests and their answers) to its end.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Sends what `future` sends first, without waiting for an answer: its answer, if it
    /// already has one, or `None`; then await it with [`PgSession::block_on`]. The requests
    /// leave with those of the next call that waits (one flight).
    pub fn send<F: std::future::Future + ?Sized>(
        &self,
        future: std::pin::Pin<&mut F>,
    ) -> Option<F::Output> {
        let mut future = future;
        match self.runtime.block_on(std::future::poll_fn(|cx| {
            std::task::Poll::Ready(future.as_mut().poll(cx))
        })) {
            std::task::Poll::Ready(answer) => Some(answer),
            std::task::Poll::Pending => None,
        }
    }

    /// Whether the session ended (its connection closed).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// [`session_gone`] for this session: what already arrived is read first; a session idle for
    /// [`IDLE_CHECK`] or more runs an empty query.
    pub fn gone(&self, idle: Duration) -> bool {
        // Lets the connection read what arrived (an error ends it, which `is_closed` then says).
        self.runtime.block_on(tokio::task::yield_now());
        if self.client.is_closed() {
            return true;
        }
        if idle < IDLE_CHECK {
            return false;
        }
        let checked = self.runtime.block_on(async {
            tokio::time::timeout(CHECK_TIMEOUT, self.client.simple_query("")).await
        });
        !matches!(checked, Ok(Ok(_))) || self.client.is_closed()
    }
}

/// The statements a backend layer runs inside a transaction of its caller
/// ([`super::LayerTx::Postgres`]): typed ones, each sent with its parameters' types (parse, bind
/// and execute in one request: one round trip, no statement to prepare first).
pub trait PgStatements {
    /// The rows of `sql`.
    fn query_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
    ) -> Result<Vec<postgres::Row>, postgres::Error>;
    /// The one row of `sql`, or an error.
    fn query_typed_one(
        &mut self,
        sql: &str,
        params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
    ) -> Result<postgres::Row, postgres::Error>;
    /// The row of `sql`, if any (more than one is an error).
    fn query_typed_opt(
        &mut self,
        sql: &str,
        params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
    ) -> Result<Option<postgres::Row>, postgres::Error>;
    /// How many rows `sql` changed.
    fn execute_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
    ) -> Result<u64, postgres::Error>;
    /// `sql`, one or more statements without parameters.
    fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error>;
}

/// The sync client's sessions and transactions run the layers' statements as they are.
macro_rules! sync_statements {
    ($($ty:ty),*) => {$(
        impl PgStatements for $ty {
            fn query_typed(
                &mut self,
                sql: &str,
                params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
            ) -> Result<Vec<postgres::Row>, postgres::Error> {
                <$ty>::query_typed(self, sql, params)
            }
            fn query_typed_one(
                &mut self,
                sql: &str,
                params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
            ) -> Result<postgres::Row, postgres::Error> {
                <$ty>::query_typed_one(self, sql, params)
            }
            fn query_typed_opt(
                &mut self,
                sql: &str,
                params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
            ) -> Result<Option<postgres::Row>, postgres::Error> {
                <$ty>::query_typed_opt(self, sql, params)
            }
            fn execute_typed(
                &mut self,
                sql: &str,
                params: &[(&(dyn postgres::types::ToSql + Sync), postgres::types::Type)],
            ) -> Result<u64, postgres::Error> {
                <$ty>::execute_typed(self, sql, params)
            }
            fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
                <$ty>::batch_execute(self, sql)
            }
        }
    )*};
}

sync_statements!(postgres::Client, postgres::Transaction<'_>);

/// What a kind of PostgreSQL schema is, for [`migrate`]: its marker table and the application
/// named in it, the advisory lock its migrations run under, and its migrations.
#[derive(Debug)]
pub struct PgSchema {
    /// Human name of the schema, used in messages (`registry`).
    pub kind: &'static str,
    /// The application named in the marker table's one row.
    pub application: &'static str,
    /// The table holding the application and the version (one row).
    pub marker: &'static str,
    /// The advisory-lock namespace: `(lock_namespace, 0)` serializes the migrations.
    pub lock_namespace: i32,
    /// Tables of this schema whose presence without a marker means someone else's (or a broken)
    /// schema, which is refused.
    pub owned_tables: &'static [&'static str],
    /// Append-only migrations; migration `i` takes the version from `i` to `i + 1`.
    pub migrations: &'static [&'static str],
}

/// Why [`migrate`] did not bring a database to the newest schema.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database holds a schema this build must not touch; nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The server failed a statement; the migration's transaction was rolled back.
    #[error("{0}")]
    Postgres(#[from] postgres::Error),
}

/// Applies the missing migrations of `schema` on `conn` in one transaction, under the schema's
/// advisory lock (replicas starting at once apply them once). A foreign marker, the schema's
/// tables without a marker, or a version newer than this build knows are refused and nothing is
/// changed. Running it again is a no-op.
pub fn migrate(conn: &mut postgres::Client, schema: &PgSchema) -> Result<(), MigrateError> {
    let mut tx = conn.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, 0)",
        &[&schema.lock_namespace],
    )?;
    let exists = |tx: &mut postgres::Transaction<'_>, table: &str| {
        tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .and_then(|r| r.try_get::<_, bool>(0))
    };
    let marker = schema.marker;
    let version: i32 = if exists(&mut tx, marker)? {
        let rows = tx.query(&format!("SELECT application, version FROM {marker}"), &[])?;
        match rows.as_slice() {
            [row] => {
                let application: String = row.try_get(0)?;
                if application != schema.application {
                    return Err(MigrateError::Refused(format!(
                        "its `{marker}` belongs to `{application}`, not callid's {}; use another \
                         database",
                        schema.kind
                    )));
                }
                row.try_get(1)?
            }
            _ => {
                return Err(MigrateError::Refused(format!(
                    "its `{marker}` holds {} rows instead of one; use another database",
                    rows.len()
                )));
            }
        }
    } else {
        for table in schema.owned_tables {
            if exists(&mut tx, table)? {
                return Err(MigrateError::Refused(format!(
                    "it has a `{table}` table but no callid schema marker (`{marker}`); use \
                     another database"
                )));
            }
        }
        0
    };
    let known = schema.migrations.len() as i32;
    if version > known {
        return Err(MigrateError::Refused(format!(
            "its schema version {version} is newer than this build knows ({known}); run a newer \
             callid"
        )));
    }
    if version == known {
        return Ok(());
    }
    for sql in &schema.migrations[version as usize..] {
        tx.batch_execute(sql)?;
    }
    if version == 0 {
        tx.execute(
            &format!("INSERT INTO {marker} (application, version) VALUES ($1, $2)"),
            &[&schema.application, &known],
        )
    } else {
        tx.execute(&format!("UPDATE {marker} SET version = $1"), &[&known])
    }?;
    Ok(tx.commit()?)
}

/// Drops a sync PostgreSQL client (or anything holding one) on a plain thread: the client owns a
/// runtime, which must not be dropped inside an async task.
pub fn drop_off_runtime<T: Send + 'static>(value: T) {
    let _ = std::thread::spawn(move || drop(value)).join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_and_query_values_are_redacted_and_the_user_kept() {
        let url =
            PgUrl::parse("postgres://alice:s3cret@db.example:5433/reg?sslmode=disable").unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://alice:REDACTED@db.example:5433/reg?sslmode=REDACTED"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        for (text, why) in [
            ("postgres://bob:pw@db.example:5432/", "names no database"),
            ("postgres:///db", "names no host"),
            ("postgres://bob:pw@db.example:99999/db", "does not parse"),
        ] {
            let err = PgUrl::parse(text).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(!err.contains("pw@"), "{err}");
        }
    }

    #[test]
    fn the_scheme_matches_in_any_case_and_another_scheme_is_refused_by_name_only() {
        let url = PgUrl::parse(" PostgreSQL://alice:s3cret@db.example/reg\n").unwrap();
        assert_eq!(url.0.driver, "postgresql://alice:s3cret@db.example/reg");
        assert_eq!(
            url.to_string(),
            "postgresql://alice:REDACTED@db.example/reg"
        );
        for (text, scheme) in [
            ("mysql://u:s3cret@h/db", "mysql"),
            ("FILE://s3cret", "FILE"),
        ] {
            let err = PgUrl::parse(text).unwrap_err();
            assert!(
                matches!(&err, BadPgUrl::Scheme { scheme: s } if s == scheme),
                "{err}"
            );
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        assert!(database_url("relative/file".as_ref()).unwrap().is_none());
    }

    /// A throwaway self-signed CA (P-256, valid until 2126) and its key, for parsing only.
    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBkjCCATmgAwIBAgIUF6AIru02iMqDJ26xcwJgjMZIvs8wCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTY2FsbGlkIHVuaXQtdGVzdCBDQTAgFw0yNjExMzAxNDI1MzRa
GA8yMTI2MTEwNjE0MjUzNFowHjEcMBoGA1UEAwwTY2FsbGlkIHVuaXQtdGVzdCBD
QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABOW0Gf0MHLqu7OzWg+ZS9nN9LNFP
zb4Ta/KAMegmZPDtyJggAFTLKzhbPVs59jLC7sB6JMEk++sa/I5b9RpyneujUzBR
MB0GA1UdDgQWBBTM1CJTVfFMyJ0h++3FbVs+a/oorzAfBgNVHSMEGDAWgBTM1CJT
VfFMyJ0h++3FbVs+a/oorzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cA
MEQCIF9mZLawkcAYYQV71WiFuQptnESH1j/vm7iwoZ4WcgqoAiA/Qn3X+4dToFVg
PE+KvQh2bE/H5IpOqhkQyP34KFNrNw==
-----END CERTIFICATE-----
";
    const CA_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgDLO/UKr9Uog90m/w
15HN/uZu2in0gH1UZFYaxs2fp4ChRANCAATltBn9DBy6ruzs1oPmUvZzfSzRT82+
E2vygDHoJmTw7ciYIABUyys4Wz1bOfYywu7AeiTBJPvrGvyOW/Uacp3r
-----END PRIVATE KEY-----
";

    /// A directory holding `ca.pem`, `key.pem` and `junk.pem` (not PEM).
    fn files() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), CA_PEM).unwrap();
        std::fs::write(dir.path().join("key.pem"), CA_KEY_PEM).unwrap();
        std::fs::write(dir.path().join("junk.pem"), "not a certificate\n").unwrap();
        dir
    }

    #[test]
    fn every_libpq_sslmode_parses_and_the_tls_params_never_reach_the_driver() {
        let dir = files();
        let ca = dir.path().join("ca.pem");
        let ca = ca.display();
        for (query, mode) in [
            (String::new(), TlsMode::Prefer),
            ("?sslmode=disable".into(), TlsMode::Disable),
            ("?sslmode=prefer".into(), TlsMode::Prefer),
            ("?sslmode=require".into(), TlsMode::Require),
            (
                format!("?sslmode=require&sslrootcert={ca}"),
                TlsMode::Require,
            ),
            (
                format!("?sslmode=verify-ca&sslrootcert={ca}"),
                TlsMode::VerifyCa,
            ),
            (
                format!("?sslrootcert={ca}&sslmode=verify-full"),
                TlsMode::VerifyFull,
            ),
        ] {
            let url = PgUrl::parse(&format!("postgres://bob:pw@db.example:5432/reg{query}"))
                .unwrap_or_else(|e| panic!("{query}: {e}"));
            assert_eq!(url.tls_mode(), mode, "{query}");
            assert_eq!(url.0.connector.is_none(), mode == TlsMode::Disable);
            assert_eq!(url.0.driver, "postgres://bob:pw@db.example:5432/reg");
            let shown = url.to_string();
            assert!(!shown.contains(&ca.to_string()), "{shown}");
        }
        // Other parameters reach the driver byte for byte (libpq decodes `%XX` only, never `+`),
        // and the last `sslmode` wins, as in the driver.
        let url = PgUrl::parse(&format!(
            "postgres://bob@db.example/reg?application_name=a+b%20c&sslmode=disable&\
             sslrootcert={ca}&connect_timeout=3&sslmode=verify-full"
        ))
        .unwrap();
        assert_eq!(url.tls_mode(), TlsMode::VerifyFull);
        assert_eq!(
            url.0.driver,
            "postgres://bob@db.example/reg?application_name=a+b%20c&connect_timeout=3"
        );
        assert_eq!(
            url.config().get_application_name(),
            Some("a+b c"),
            "{:?}",
            url.config()
        );
        assert_eq!(url.config().get_ssl_mode(), SslMode::Require);
        // A client certificate: both files, percent-encoded paths decoded.
        let key = dir.path().join("key.pem").display().to_string();
        let url = PgUrl::parse(&format!(
            "postgres://bob@db.example/reg?sslmode=require&sslcert={ca}&sslkey={}",
            key.replace('/', "%2F")
        ))
        .unwrap();
        assert_eq!(
            url.0
                .tls
                .client_cert
                .as_ref()
                .map(|(_, k)| k.display().to_string()),
            Some(key)
        );
    }

    #[test]
    fn a_tls_url_that_cannot_be_honoured_is_refused_naming_the_fix() {
        let dir = files();
        let path = |name: &str| dir.path().join(name).display().to_string();
        let (ca, key, junk, gone) = (
            path("ca.pem"),
            path("key.pem"),
            path("junk.pem"),
            path("gone.pem"),
        );
        for (query, why) in [
            ("sslmode=verify-full".to_string(), "`sslrootcert=PATH`"),
            ("sslmode=verify-ca".into(), "`sslrootcert=PATH`"),
            ("sslmode=allow".into(), "`sslmode=allow`"),
            ("sslmode=strict".into(), "not one of disable, prefer"),
            (
                "sslmode=verify-full&sslrootcert=system".into(),
                "`sslrootcert=system`",
            ),
            (
                format!("sslmode=verify-full&sslrootcert={gone}"),
                "gone.pem",
            ),
            (
                format!("sslmode=verify-full&sslrootcert={junk}"),
                "holds no PEM",
            ),
            (
                format!("sslmode=require&sslcert={ca}"),
                "give both or neither",
            ),
            (
                format!("sslmode=require&sslkey={key}"),
                "give both or neither",
            ),
            (
                format!("sslmode=require&sslcert={ca}&sslkey={junk}"),
                "is not a PEM private key",
            ),
            (
                "sslmode=require&sslrootcert=".into(),
                "`sslrootcert` is empty",
            ),
            ("sslmode=%zz".into(), "bad `%` escape"),
        ] {
            let err = PgUrl::parse(&format!("postgres://bob:pw@db.example:5432/reg?{query}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{query}: {err}");
            assert!(!err.contains(":pw@"), "{err}");
            assert!(
                err.starts_with("registry URL `postgres://bob:REDACTED@"),
                "{err}"
            );
        }
    }

    #[test]
    fn explain_names_the_fix_of_a_server_without_tls() {
        // A server that answers the TLS request with `N` (as one with `ssl = off` does).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            let (mut socket, _) = listener.accept().unwrap();
            let mut request = [0u8; 8];
            socket.read_exact(&mut request).unwrap();
            socket.write_all(b"N").unwrap();
            // Anything more would be the startup message: plaintext after a refusal.
            let mut rest = Vec::new();
            let _ = socket.read_to_end(&mut rest);
            (request, rest)
        });
        let url = PgUrl::parse(&format!(
            "postgres://bob:pw@127.0.0.1:{port}/reg?sslmode=require"
        ))
        .unwrap();
        let err = url
            .connect()
            .err()
            .expect("a server without TLS is refused");
        let (request, rest) = server.join().unwrap();
        assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "an SSLRequest");
        assert!(rest.is_empty(), "sent after the refusal: {rest:?}");
        let text = url.explain(&err);
        assert!(text.contains("server does not support TLS"), "{text}");
        assert!(text.contains("`sslmode=require` demands TLS"), "{text}");
        assert!(text.contains("`ssl = on`"), "{text}");
    }
}
