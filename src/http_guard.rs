//! What every HTTP server of callid accepts (the router's and the probe's `--http`, the
//! provider's `--listen`): one loopback policy ([`bind`]) and one `Host` and `Origin` check
//! ([`Guard`]).
//!
//! # Guarantees
//! - A server listens on a loopback address only (`127.0.0.0/8`, `::1`, or `localhost`, which
//!   means 127.0.0.1); any other address is refused before anything is created, with the flag to
//!   use instead ([`BindError::NotLoopback`]). A port in use is refused naming the fix.
//! - `Host` must name the server as a client on this machine does: `localhost` or the IP address
//!   the socket is bound to (so `--http 127.0.0.2:PORT` answers `Host: 127.0.0.2:PORT`). Any
//!   other name is refused with 403: a page that rebinds its own DNS name to 127.0.0.1 sends its
//!   own name.
//! - A request with an `Origin` header (sent by browsers, never by MCP clients or `curl`) is
//!   refused with 403 unless the origin is the server's own (`http://localhost:PORT`,
//!   `http://IP:PORT`) or listed with `--allow-origin` (repeatable; `null` allows `Origin: null`).
//!   No `Origin` is allowed. The MCP streamable-HTTP transport requires servers to validate it.
//! - The check runs before any handler sees the request: nothing is recorded, charged or
//!   answered for a refused request. The same host list is given to rmcp's own check
//!   ([`Guard::rmcp_config`]), so both agree.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Which server is starting: names it, its address flag, and why it stays on loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `callid router --http`.
    Router,
    /// `callid probe --http`.
    Probe,
    /// `callid provider --listen`.
    Provider,
    /// `callid gateway --http`.
    Gateway,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Router => "the router",
            Server::Probe => "the probe",
            Server::Provider => "the provider",
            Server::Gateway => "the gateway",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Server::Router | Server::Probe | Server::Gateway => "--http",
            Server::Provider => "--listen",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Server::Router => "it trusts the identity in `_meta` from whoever connects",
            Server::Probe => "it answers and records whoever connects, without authentication",
            Server::Provider => "it charges whoever connects, over plain HTTP",
            Server::Gateway => {
                "it trusts the identity in `_meta` from whoever connects and spends upstream for it"
            }
        }
    }
}

/// Why a server did not start listening.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The address is not a loopback address.
    #[error(
        "refusing to serve on `{addr}`: {server} listens on loopback only, because {why}; use \
         `{flag} 127.0.0.1:PORT` (or `{flag} localhost:PORT`)"
    )]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
        /// The server's name.
        server: &'static str,
        /// Why it stays on loopback.
        why: &'static str,
        /// The flag to fix.
        flag: &'static str,
    },
    /// Another program listens on the port.
    #[error(
        "failed to listen on `{addr}`: another program listens there; stop it, or pick another \
         port (`{flag} 127.0.0.1:0` picks a free one)"
    )]
    InUse {
        /// The address asked for.
        addr: SocketAddr,
        /// The flag to fix.
        flag: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Binding failed otherwise.
    #[error("failed to listen on `{addr}`; pick a free loopback port, or port 0 for any")]
    Io {
        /// The address asked for.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An `--allow-origin` value is not an origin.
    #[error(
        "invalid `--allow-origin {value}`: {reason}; write an origin as `scheme://host[:port]` \
         (e.g. `https://app.example.com`), or `null`"
    )]
    InvalidOrigin {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl BindError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            BindError::NotLoopback { .. } => "not_loopback",
            BindError::InUse { .. } => "address_in_use",
            BindError::Io { .. } => "bind_failed",
            BindError::InvalidOrigin { .. } => "invalid_origin",
        }
    }
}

/// Parses a listen address for the command line: `IP:PORT`, or `localhost:PORT` (127.0.0.1,
/// never a DNS lookup).
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Some((host, port)) = text.rsplit_once(':')
        && host.eq_ignore_ascii_case("localhost")
    {
        return port
            .parse::<u16>()
            .map(|port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
            .map_err(|_| format!("`{port}` is not a port number (0 to 65535)"));
    }
    text.parse().map_err(|_| {
        format!("`{text}` is not an address; use IP:PORT or localhost:PORT, e.g. 127.0.0.1:8765")
    })
}

/// A listening socket and the guard for what it may answer.
#[derive(Debug)]
pub struct Bound {
    /// The socket.
    pub listener: TcpListener,
    /// The address it is bound to (the chosen port when 0 was asked for).
    pub addr: SocketAddr,
    /// The `Host` and `Origin` check for this address.
    pub guard: Guard,
}

/// `listener` with `TCP_NODELAY` set on every connection it accepts. Every HTTP server of callid
/// serves through it: a streamable-HTTP reply goes out as several small writes (headers, then
/// each SSE event), and with Nagle's algorithm the later writes wait for the client's delayed
/// ACK, up to 40 ms per call on Linux (see BENCHMARKS.md, "Why, in a page": HTTP sessions).
pub fn nodelay(
    listener: TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY: {e}");
        }
    })
}

/// Checks the loopback policy and the `--allow-origin` values, then binds `addr`. Nothing is
/// bound when a check fails.
pub async fn bind(
    server: Server,
    addr: SocketAddr,
    allow_origins: &[String],
) -> Result<Bound, BindError> {
    if !addr.ip().is_loopback() {
        return Err(BindError::NotLoopback {
            addr,
            server: server.name(),
            why: server.why(),
            flag: server.flag(),
        });
    }
    let origins = allow_origins
        .iter()
        .map(|value| {
            parse_origin(value).map_err(|reason| BindError::InvalidOrigin {
                value: value.clone(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let listener = TcpListener::bind(addr).await.map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            BindError::InUse {
                addr,
                flag: server.flag(),
                source,
            }
        } else {
            BindError::Io { addr, source }
        }
    })?;
    let local = listener
        .local_addr()
        .map_err(|source| BindError::Io { addr, source })?;
    Ok(Bound {
        listener,
        addr: local,
        guard: Guard::new(server, local, origins),
    })
}

/// An origin: `null`, or scheme, host and port (the scheme's default port when omitted).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: u16,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Null => f.write_str("null"),
            Origin::Tuple { scheme, host, port } if host.contains(':') => {
                write!(f, "{scheme}://[{host}]:{port}")
            }
            Origin::Tuple { scheme, host, port } => write!(f, "{scheme}://{host}:{port}"),
        }
    }
}

fn parse_origin(text: &str) -> Result<Origin, &'static str> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("null") {
        return Ok(Origin::Null);
    }
    let uri: axum::http::Uri = text.parse().map_err(|_| "it does not parse as a URL")?;
    let scheme = uri
        .scheme_str()
        .ok_or("it has no scheme")?
        .to_ascii_lowercase();
    let authority = uri.authority().ok_or("it has no host")?;
    if authority.as_str().contains('@') {
        return Err("an origin has no user or password");
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("an origin has no path or query");
    }
    let port = match authority.port_u16() {
        Some(port) => port,
        None => match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err("it has no port and its scheme has no default port"),
        },
    };
    Ok(Origin::Tuple {
        scheme,
        host: normalize_host(authority.host()),
        port,
    })
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// The `Host` and `Origin` check of one listening address. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Guard {
    server: Server,
    /// Host names a request may address: `localhost` and the bound IP.
    hosts: Vec<String>,
    /// The server's own origins, then the `--allow-origin` values.
    origins: Vec<Origin>,
}

/// A refused request: its status and a message that says why and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 400 for a missing or malformed `Host`, 403 for a foreign one or a foreign `Origin`.
    pub status: StatusCode,
    /// What was refused and why.
    pub message: String,
}

impl Guard {
    fn new(server: Server, local: SocketAddr, allowed: Vec<Origin>) -> Guard {
        let hosts = vec!["localhost".to_string(), local.ip().to_string()];
        let mut origins: Vec<Origin> = hosts
            .iter()
            .map(|host| Origin::Tuple {
                scheme: "http".into(),
                host: host.clone(),
                port: local.port(),
            })
            .collect();
        origins.extend(allowed);
        Guard {
            server,
            hosts,
            origins,
        }
    }

    /// Checks a request's `Host` and `Origin` headers.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let refuse = |status, message: String| Err(Refusal { status, message });
        let Some(host) = headers.get(header::HOST) else {
            return refuse(StatusCode::BAD_REQUEST, "missing `Host` header".into());
        };
        let Some(authority) = host
            .to_str()
            .ok()
            .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        else {
            return refuse(StatusCode::BAD_REQUEST, "malformed `Host` header".into());
        };
        let name = normalize_host(authority.host());
        if !self.hosts.contains(&name) {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "`Host: {}` is not allowed: {} answers only requests addressed to {} \
                     (a guard against DNS rebinding)",
                    shorten(authority.as_str()),
                    self.server.name(),
                    self.hosts.join(" or ")
                ),
            );
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let text = String::from_utf8_lossy(origin.as_bytes());
        match parse_origin(&text) {
            Ok(origin) if self.origins.contains(&origin) => Ok(()),
            Ok(origin) => refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "`Origin: {}` is not allowed: {} refuses requests from web pages of other \
                     origins; if this page may use it, start it with `--allow-origin {origin}`",
                    shorten(&text),
                    self.server.name()
                ),
            ),
            Err(reason) => refuse(
                StatusCode::FORBIDDEN,
                format!("`Origin: {}` is not allowed: {reason}", shorten(&text)),
            ),
        }
    }

    /// Puts the check in front of every route of `app`: a refused request gets its status and a
    /// plain-text message, and never reaches a handler.
    pub fn protect(self, app: axum::Router) -> axum::Router {
        app.layer(axum::middleware::from_fn_with_state(
            Arc::new(self),
            guard_layer,
        ))
    }

    /// rmcp's streamable-HTTP configuration with this guard's host list (rmcp's default list
    /// knows 127.0.0.1 and localhost only).
    pub fn rmcp_config(&self) -> StreamableHttpServerConfig {
        StreamableHttpServerConfig::default().with_allowed_hosts(self.hosts.clone())
    }
}

async fn guard_layer(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match guard.check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            tracing::warn!("refused a request: {}", refusal.message);
            (refusal.status, refusal.message).into_response()
        }
    }
}

/// A header value for a message: at most 200 bytes.
fn shorten(text: &str) -> String {
    crate::text::clip(text, 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn guard(local: &str, allow: &[&str]) -> Guard {
        let origins = allow.iter().map(|o| parse_origin(o).unwrap()).collect();
        Guard::new(Server::Router, local.parse().unwrap(), origins)
    }

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        if let Some(origin) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        }
        h
    }

    fn status(g: &Guard, host: Option<&str>, origin: Option<&str>) -> u16 {
        match g.check(&headers(host, origin)) {
            Ok(()) => 200,
            Err(r) => r.status.as_u16(),
        }
    }

    #[test]
    fn host_names_the_bound_address_or_localhost() {
        let g = guard("127.0.0.2:8765", &[]);
        let table = [
            (Some("127.0.0.2:8765"), 200),
            (Some("127.0.0.2"), 200),
            (Some("LOCALHOST:8765"), 200),
            (Some("127.0.0.1:8765"), 403),
            (Some("evil.example:8765"), 403),
            (Some("localhost.evil.example"), 403),
            (Some("not a host"), 400),
            (None, 400),
        ];
        for (host, want) in table {
            assert_eq!(status(&g, host, None), want, "Host {host:?}");
        }
        let v6 = guard("[::1]:9000", &[]);
        assert_eq!(status(&v6, Some("[::1]:9000"), None), 200);
        assert_eq!(status(&v6, Some("127.0.0.1:9000"), None), 403);
    }

    #[test]
    fn origin_is_absent_the_servers_own_or_allowed() {
        let g = guard(
            "127.0.0.1:8765",
            &["https://app.example.com", "http://localhost:3000", "null"],
        );
        let host = Some("127.0.0.1:8765");
        let table = [
            (None, 200),
            (Some("http://127.0.0.1:8765"), 200),
            (Some("http://localhost:8765"), 200),
            (Some("https://app.example.com"), 200),
            (Some("https://APP.example.com:443"), 200),
            (Some("http://localhost:3000"), 200),
            (Some("null"), 200),
            (Some("https://evil.example"), 403),
            (Some("http://app.example.com"), 403),
            (Some("https://app.example.com:8443"), 403),
            (Some("http://localhost:3001"), 403),
            (Some("http://127.0.0.1:8766"), 403),
            (Some("garbage"), 403),
        ];
        for (origin, want) in table {
            assert_eq!(status(&g, host, origin), want, "Origin {origin:?}");
        }
        assert_eq!(
            status(&guard("127.0.0.1:8765", &[]), host, Some("null")),
            403
        );
    }

    #[test]
    fn refusals_say_what_to_change() {
        let g = guard("127.0.0.1:8765", &[]);
        let r = g
            .check(&headers(
                Some("127.0.0.1:8765"),
                Some("https://evil.example"),
            ))
            .unwrap_err();
        assert_eq!(
            r.message,
            "`Origin: https://evil.example` is not allowed: the router refuses requests from web \
             pages of other origins; if this page may use it, start it with `--allow-origin \
             https://evil.example:443`"
        );
        let r = g.check(&headers(Some("evil.example"), None)).unwrap_err();
        assert_eq!(
            r.message,
            "`Host: evil.example` is not allowed: the router answers only requests addressed to \
             localhost or 127.0.0.1 (a guard against DNS rebinding)"
        );
    }

    #[test]
    fn allow_origin_values_are_checked() {
        for bad in [
            "app.example.com",
            "https://app.example.com/path",
            "https://u:p@app.example.com",
            "ftp://files.example",
            "https://app.example.com/?q=1",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_origin("https://app.example.com/")
                .unwrap()
                .to_string(),
            "https://app.example.com:443"
        );
    }

    #[test]
    fn listen_addresses_accept_localhost() {
        assert_eq!(
            parse_listen_addr("localhost:8765").unwrap(),
            "127.0.0.1:8765".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.2:0").unwrap(),
            "127.0.0.2:0".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:80").unwrap(),
            "[::1]:80".parse::<SocketAddr>().unwrap()
        );
        assert!(parse_listen_addr("localhost:http").is_err());
        assert!(
            parse_listen_addr("example.com:80")
                .unwrap_err()
                .contains("localhost:PORT")
        );
    }

    #[tokio::test]
    async fn only_loopback_addresses_are_bound() {
        let err = bind(Server::Probe, "0.0.0.0:0".parse().unwrap(), &[])
            .await
            .unwrap_err();
        assert_eq!(err.code(), "not_loopback");
        assert!(
            err.to_string().contains("use `--http 127.0.0.1:PORT`"),
            "{err}"
        );
        let err = bind(
            Server::Provider,
            "127.0.0.1:0".parse().unwrap(),
            &["nope".into()],
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "invalid_origin");
        let bound = bind(Server::Router, "127.0.0.1:0".parse().unwrap(), &[])
            .await
            .unwrap();
        let err = bind(Server::Provider, bound.addr, &[]).await.unwrap_err();
        assert_eq!(err.code(), "address_in_use");
        assert!(
            err.to_string()
                .contains("`--listen 127.0.0.1:0` picks a free one"),
            "{err}"
        );
    }
}
