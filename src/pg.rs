//! PostgreSQL connection URLs: [`PgUrl`], parsed and checked once, shown only redacted, and the
//! connection settings every PostgreSQL session of callid uses.
//!
//! The router's registry ([`crate::router::registry`]) and the backend's shared state
//! ([`crate::backend::shared`]) live in the same database and connect through this one type, so
//! both redact the same way and both notice a vanished server within the same time.
//!
//! # Guarantees
//! - `Display` and `Debug` show the password and every query value as `REDACTED` (the user
//!   stays: it names the role to check); so does [`BadPgUrl`], the error of a URL that is not
//!   usable.
//! - A [`PgUrl`] names a host and a database and is accepted by the `postgres` client's own
//!   parser, so connecting never fails for the URL's syntax.

use postgres::Config;
use postgres::config::SslMode;
use std::str::FromStr;
use std::time::Duration;

/// `--registry` looks like a PostgreSQL URL but is not one this build can use.
#[derive(Debug, thiserror::Error)]
#[error("registry URL `{url}` is not usable: {detail}; pass `postgres://USER@HOST:PORT/DATABASE`")]
pub struct BadPgUrl {
    /// The URL, password redacted.
    pub url: String,
    /// What was wrong.
    pub detail: String,
}

/// A `postgres://` URL whose password (and query values) are redacted wherever it is shown.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl {
    raw: String,
    redacted: String,
}

impl PgUrl {
    /// Parses and checks a `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` URL.
    pub fn parse(text: &str) -> Result<PgUrl, BadPgUrl> {
        let text = text.trim();
        let bad = |redacted: String, detail: &str| BadPgUrl {
            url: redacted,
            detail: detail.to_string(),
        };
        let url = reqwest::Url::parse(text)
            .map_err(|e| bad("postgres://…".into(), &format!("it does not parse ({e})")))?;
        let redacted = redact(&url);
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad(redacted, "it names no host"));
        }
        if url.path().trim_matches('/').is_empty() {
            return Err(bad(redacted, "it names no database"));
        }
        let config = Config::from_str(text).map_err(|e| bad(redacted.clone(), &e.to_string()))?;
        if !matches!(config.get_ssl_mode(), SslMode::Disable | SslMode::Prefer) {
            return Err(bad(
                redacted,
                "it asks for TLS (`sslmode=require`), which this build does not speak; refused \
                 rather than connecting in plaintext: keep the database on loopback or a private \
                 network and drop `sslmode` (or set `sslmode=disable`)",
            ));
        }
        Ok(PgUrl {
            raw: text.to_string(),
            redacted,
        })
    }

    pub(crate) fn config(&self) -> Config {
        let mut config = Config::from_str(&self.raw).expect("checked in PgUrl::parse");
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
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgUrl({})", self.redacted)
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
    fn a_url_asking_for_tls_is_refused_never_downgraded() {
        let err =
            PgUrl::parse("postgres://bob:pw@db.example:5432/reg?sslmode=require").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`sslmode=require`"), "{text}");
        assert!(text.contains("plaintext"), "{text}");
        assert!(!text.contains(":pw@"), "{text}");
        // Plaintext asked for, or allowed (`prefer`, the default): accepted.
        for ok in ["?sslmode=disable", "?sslmode=prefer", ""] {
            PgUrl::parse(&format!("postgres://bob@db.example:5432/reg{ok}")).unwrap();
        }
    }
}
