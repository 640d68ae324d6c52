//! Credentials as types that cannot leak by accident: [`Secret`] (a bearer token) and
//! [`SecretUrl`] (a URL that may carry a password or an API key in its query).
//!
//! # Guarantees
//! - [`Secret`] has no `Display` and a redacting `Debug`; reading it takes [`Secret::expose`].
//! - [`SecretUrl`]'s `Display` and `Debug` show the redacted form: the userinfo
//!   becomes `REDACTED`, every query value becomes `REDACTED` (keys stay), a fragment becomes
//!   `REDACTED`. Only [`SecretUrl::expose`] gives the real URL, for the HTTP client.
//! - Errors about a credential name where it came from, never its value.
//! - [`redact_urls`] shows every http(s) URL in a text that way: what an HTTP client's or an MCP
//!   library's error text passes through before it reaches an agent or standard error.

use reqwest::Url;
use std::path::{Path, PathBuf};

/// What replaces a secret in anything shown.
pub const REDACTED: &str = "REDACTED";

/// A credential (a bearer token): 1 to 4096 visible ASCII characters.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Why a credential could not be read. Never carries the credential.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The token file could not be read.
    #[error("failed to read the token file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The token is empty or is not visible ASCII.
    #[error(
        "the token in {origin} is {problem}; put one line of 1 to 4096 visible ASCII characters \
         there"
    )]
    Invalid {
        /// Where it came from (`the file `x``, `CALLID_PROVIDER_TOKEN`).
        origin: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The token was given twice.
    #[error("a token is given both in {0} and in {1}; give it in one place")]
    Twice(String, String),
}

impl SecretError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            SecretError::Read { .. } => "token_unreadable",
            SecretError::Invalid { .. } => "token_invalid",
            SecretError::Twice(..) => "token_given_twice",
        }
    }
}

impl Secret {
    /// Checks and wraps `text` (surrounding white space, such as a file's last newline, is
    /// removed); `origin` names where it came from, for the error.
    pub fn new(text: &str, origin: &str) -> Result<Secret, SecretError> {
        let text = text.trim();
        let problem = if text.is_empty() {
            Some("empty")
        } else if text.len() > 4096 {
            Some("longer than 4096 characters")
        } else if !text.bytes().all(|b| b.is_ascii_graphic()) {
            Some("not visible ASCII (or spans several lines)")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(SecretError::Invalid {
                origin: origin.to_string(),
                problem,
            }),
            None => Ok(Secret(text.to_string())),
        }
    }

    /// The token read from `file`, or from the environment variable `env`; neither is `None`,
    /// both is an error. `flag` names the file's command-line flag in errors.
    pub fn from_file_or_env(
        file: Option<&Path>,
        flag: &str,
        env: &str,
    ) -> Result<Option<Secret>, SecretError> {
        let from_env = std::env::var_os(env).filter(|v| !v.is_empty());
        match (file, from_env) {
            (Some(_), Some(_)) => Err(SecretError::Twice(format!("`{flag}`"), format!("`{env}`"))),
            (Some(path), None) => {
                let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                Secret::new(&text, &format!("`{}`", path.display())).map(Some)
            }
            (None, Some(value)) => {
                let origin = format!("`{env}`");
                let text = value.into_string().map_err(|_| SecretError::Invalid {
                    origin: origin.clone(),
                    problem: "not visible ASCII (or spans several lines)",
                })?;
                Secret::new(&text, &origin).map(Some)
            }
            (None, None) => Ok(None),
        }
    }

    /// The credential's text, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this credential, compared without an early exit on the first
    /// differing byte.
    pub fn matches(&self, given: &[u8]) -> bool {
        use sha2::Digest as _;
        let (a, b) = (sha2::Sha256::digest(&self.0), sha2::Sha256::digest(given));
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

/// An absolute `http`/`https` URL whose secrets never show: see the module's guarantees.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    url: Url,
    redacted: String,
}

/// Why a URL was refused. Never carries the URL (it may hold a secret and did not parse).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// It does not parse as an absolute URL.
    #[error("the URL does not parse; write it as http://HOST:PORT")]
    Parse(#[source] <Url as std::str::FromStr>::Err),
    /// Its scheme is not `http` or `https`.
    #[error("the URL's scheme is `{0}`; use http or https")]
    Scheme(String),
}

impl std::str::FromStr for SecretUrl {
    type Err = UrlError;

    fn from_str(text: &str) -> Result<SecretUrl, UrlError> {
        let url = Url::parse(text.trim()).map_err(UrlError::Parse)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UrlError::Scheme(url.scheme().to_string()));
        }
        let redacted = redacted(&url);
        Ok(SecretUrl { url, redacted })
    }
}

impl SecretUrl {
    /// The real URL, for the HTTP client only.
    pub fn expose(&self) -> &Url {
        &self.url
    }

    /// The URL with its secrets replaced by `REDACTED`, and no trailing `/`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// Whether the URL carries a user name or password.
    pub fn has_userinfo(&self) -> bool {
        !self.url.username().is_empty() || self.url.password().is_some()
    }

    /// The URL of `path` (e.g. `/v1/images`) under this base: the base's path joined with
    /// `path`, its query kept.
    pub fn join(&self, path: &str) -> Url {
        let mut url = self.url.clone();
        let joined = format!("{}{path}", url.path().trim_end_matches('/'));
        url.set_path(&joined);
        url
    }
}

impl std::fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretUrl({:?})", self.redacted)
    }
}

fn redacted(url: &Url) -> String {
    let mut out = format!("{}://", url.scheme());
    if !url.username().is_empty() || url.password().is_some() {
        out.push_str(REDACTED);
        out.push('@');
    }
    if let Some(host) = url.host_str() {
        out.push_str(host);
    }
    if let Some(port) = url.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(url.path().trim_end_matches('/'));
    if let Some(query) = url.query() {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) => format!("{key}={REDACTED}"),
                None => REDACTED.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    if url.fragment().is_some() {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

/// `text` with every `http://` or `https://` URL in it shown as [`SecretUrl`] shows it: the one
/// function every text that may quote a URL passes through before it leaves the process (an
/// HTTP client's error quotes the URL it failed to reach, with its query and fragment).
///
/// A URL runs to the first white space, control or non-ASCII character, or one of `` "<>`\ ``
/// (none of which a serialized URL holds); trailing `)`, `,`, `.`, `;`, `:`, `]` and `'` are
/// taken as the surrounding sentence's. A URL without user info, query or fragment is left as
/// written; one that does not parse but holds `@`, `?` or `#` becomes `SCHEME://REDACTED`.
pub fn redact_urls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find("://") {
        let sep = search + found;
        let scheme_start = text[..sep]
            .rfind(|c: char| !c.is_ascii_alphabetic())
            .map_or(0, |i| i + 1);
        let scheme = &text[scheme_start..sep];
        search = sep + 3;
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            continue;
        }
        let end = bytes[search..]
            .iter()
            .position(|&b| {
                !b.is_ascii()
                    || b.is_ascii_whitespace()
                    || b.is_ascii_control()
                    || b"\"<>`\\".contains(&b)
            })
            .map_or(text.len(), |i| search + i);
        let token = text[scheme_start..end].trim_end_matches([')', ',', '.', ';', ':', ']', '\'']);
        let shown = match Url::parse(token) {
            Ok(url)
                if url.username().is_empty()
                    && url.password().is_none()
                    && url.query().is_none()
                    && url.fragment().is_none() =>
            {
                None
            }
            Ok(url) => Some(redacted(&url)),
            Err(_) if token.contains(['@', '?', '#']) => Some(format!("{scheme}://{REDACTED}")),
            Err(_) => None,
        };
        if let Some(shown) = shown {
            out.push_str(&text[copied..scheme_start]);
            out.push_str(&shown);
            copied = scheme_start + token.len();
        }
        search = scheme_start + token.len().max(scheme.len() + 3);
    }
    if copied == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_show_no_password_no_query_value_no_fragment() {
        let table = [
            ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
            ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
            ("https://api.example.com/v2/", "https://api.example.com/v2"),
            (
                "http://user:hunter2@127.0.0.1:9000/?api_key=sk-123&mode=fast",
                "http://REDACTED@127.0.0.1:9000?api_key=REDACTED&mode=REDACTED",
            ),
            (
                "https://tok-abc@api.example.com/x?sk-lonely#frag",
                "https://REDACTED@api.example.com/x?REDACTED#REDACTED",
            ),
        ];
        for (given, shown) in table {
            let url: SecretUrl = given.parse().unwrap();
            assert_eq!(url.redacted(), shown);
            assert_eq!(url.to_string(), shown);
            assert_eq!(format!("{url:?}"), format!("SecretUrl({shown:?})"));
            if url.expose().query().is_some() {
                assert_eq!(redact_urls(given), shown);
            }
        }
    }

    #[test]
    fn urls_in_text_show_no_secret() {
        let table = [
            ("no url here", "no url here"),
            (
                "error sending request for url (http://127.0.0.1:1/mcp?api_key=SECRET#frag), when \
                 send initialize request",
                "error sending request for url (http://127.0.0.1:1/mcp?api_key=REDACTED#REDACTED), \
                 when send initialize request",
            ),
            (
                "Client(reqwest::Error { url: \"https://u:pw@h.example/x?a=1&b\" })",
                "Client(reqwest::Error { url: \"https://REDACTED@h.example/x?a=REDACTED&REDACTED\" })",
            ),
            (
                "`HTTP://user:pw@127.0.0.1:9/mcp` and http://127.0.0.1:9/plain.",
                "`http://REDACTED@127.0.0.1:9/mcp` and http://127.0.0.1:9/plain.",
            ),
            (
                "write it as http://HOST:PORT; see ftp://u:p@x",
                "write it as http://HOST:PORT; see ftp://u:p@x",
            ),
            ("http://u:pw@[bad/?k=SECRET", "http://REDACTED"),
            ("https://", "https://"),
            ("x://y http://a@b:c", "x://y http://REDACTED"),
        ];
        for (given, shown) in table {
            assert_eq!(redact_urls(given), shown, "{given}");
        }
        assert!(matches!(
            redact_urls("http://127.0.0.1:1/mcp"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        let err = "127.0.0.1:9000/?api_key=sk-123"
            .parse::<SecretUrl>()
            .unwrap_err();
        assert!(!err.to_string().contains("sk-123"), "{err}");
        let err = "ftp://u:sk-123@files.example"
            .parse::<SecretUrl>()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the URL's scheme is `ftp`; use http or https"
        );
    }

    #[test]
    fn join_keeps_the_base_path_and_query() {
        let url: SecretUrl = "http://h:1/base/?api_key=k".parse().unwrap();
        assert_eq!(
            url.join("/v1/images").as_str(),
            "http://h:1/base/v1/images?api_key=k"
        );
        let url: SecretUrl = "http://h:1".parse().unwrap();
        assert_eq!(url.join("/v1/charges").as_str(), "http://h:1/v1/charges");
    }

    #[test]
    fn tokens_are_checked_redacted_and_compared() {
        let t = Secret::new("  tok-123\n", "`f`").unwrap();
        assert_eq!(t.expose(), "tok-123");
        assert_eq!(format!("{t:?}"), "Secret(<redacted>)");
        assert!(t.matches(b"tok-123"));
        assert!(!t.matches(b"tok-124"));
        assert!(!t.matches(b""));
        for bad in ["", "  \n", "two words", "a\nb", "é"] {
            let err = Secret::new(bad, "`f`").unwrap_err();
            assert_eq!(err.code(), "token_invalid");
        }
        let err = Secret::new("with space", "`f`").unwrap_err();
        assert!(!err.to_string().contains("with space"));
    }
}
