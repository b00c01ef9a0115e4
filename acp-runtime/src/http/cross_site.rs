//! Cross-site checks (research/contract.md, "Auth and CORS"): which
//! `Origin` and which `Host` a request may carry.
//!
//! A server without a token on loopback is reachable from every page the
//! machine's browser opens. Two rules keep those pages out:
//!
//! - `Origin`: a browser sends it on every cross-site POST and WebSocket
//!   handshake. One whose host and port are not the request's own
//!   authority (the scheme is not compared: a TLS proxy in front makes the
//!   page's origin `https://`) and not allowed by `--cors-allow-origin` is
//!   refused with 403 `forbidden-origin`.
//! - `Host`: DNS rebinding makes an attacker's page same-origin, but its
//!   requests still name the attacker's host. On a connection accepted on a
//!   loopback address only loopback names (`localhost`, `127.0.0.0/8`,
//!   `[::1]`, any port) and `--allowed-host` values are served, else 403
//!   `forbidden-host`. A connection accepted on any other address (a sandbox
//!   platform's proxy) is not checked: what name it arrives under is the
//!   platform's business.
//!
//! - `Sec-Fetch-Site`: a page's `<script>`, `<img>` or `no-cors` fetch
//!   sends no `Origin` but does send `Sec-Fetch-Site: cross-site` (or
//!   `same-site`, which another port of `localhost` is): such a request,
//!   unless it is a top-level navigation or its `Origin` is allowed by
//!   `--cors-allow-origin`, is refused with 403 `forbidden-origin`. Every
//!   answer also carries `Cross-Origin-Resource-Policy: same-origin` and
//!   `X-Content-Type-Options: nosniff` (set by `http::handle`).
//! - Two `Host` fields are 400 (RFC 9112 section 3.2): a proxy in front may
//!   have read the other one.
//!
//! Requests without `Origin` or `Sec-Fetch-Site` (curl, SDKs) and without
//! `Host` (HTTP/1.0 tools; browsers always send one) pass.

use super::body::HttpRequest;
use crate::config::ServerConfig;
use crate::error::Error;
use crate::protocol;
use http::HeaderName;
use http::header::{HOST, ORIGIN};
use http::uri::{Authority, Scheme, Uri};
use std::net::{IpAddr, SocketAddr};

const SEC_FETCH_SITE: HeaderName = HeaderName::from_static(protocol::SEC_FETCH_SITE_HEADER);
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static(protocol::SEC_FETCH_MODE_HEADER);
const SEC_FETCH_DEST: HeaderName = HeaderName::from_static(protocol::SEC_FETCH_DEST_HEADER);

/// Refuses `request`, accepted on the local address `local`, when its
/// `Host` or `Origin` is not allowed by `config` (module doc).
///
/// # Errors
/// [`Error::InvalidRequest`] for two `Host` fields, then
/// [`Error::ForbiddenHost`], then [`Error::ForbiddenOrigin`].
pub(crate) fn check(
    config: &ServerConfig,
    local: SocketAddr,
    request: &HttpRequest,
) -> Result<(), Error> {
    if request.headers().get_all(HOST).iter().count() > 1 {
        return Err(Error::InvalidRequest(
            "two Host fields: send exactly one (RFC 9112 section 3.2)".to_owned(),
        ));
    }
    // HTTP/2: a `Host` that disagrees with `:authority` makes the request
    // malformed (RFC 9113 section 8.3.1); HTTP/1.1's absolute form wins
    // over `Host` by RFC 9112 section 3.2.2, so only HTTP/2 is refused.
    if request.version() == http::Version::HTTP_2
        && let (Some(authority), Some(host)) =
            (request.uri().authority(), request.headers().get(HOST))
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return Err(Error::InvalidRequest(
            "the Host field and :authority disagree (RFC 9113 section 8.3.1)".to_owned(),
        ));
    }
    let authority = request_authority(request);
    if is_loopback(local.ip())
        && let Some(authority) = &authority
        && !host_allowed(authority, &config.allowed_hosts)
    {
        return Err(Error::ForbiddenHost(shown(authority)));
    }
    for origin in request.headers().get_all(ORIGIN) {
        let allowed_by_cors = config
            .cors_allow_origins
            .iter()
            .any(|allowed| allowed == "*" || allowed.as_bytes() == origin.as_bytes());
        let same = |authority: &RequestAuthority| {
            origin
                .to_str()
                .is_ok_and(|origin| same_authority(origin, authority))
        };
        if !allowed_by_cors && !authority.as_ref().is_some_and(same) {
            return Err(Error::ForbiddenOrigin(shown_bytes(origin.as_bytes())));
        }
    }
    let headers = request.headers();
    let is = |name: &HeaderName, value: &str| {
        headers
            .get_all(name)
            .iter()
            .any(|field| field.as_bytes().eq_ignore_ascii_case(value.as_bytes()))
    };
    let from_another_site = is(&SEC_FETCH_SITE, "cross-site") || is(&SEC_FETCH_SITE, "same-site");
    if from_another_site && headers.get(ORIGIN).is_none() {
        // Only a person following a link to the inspector: any other answer
        // (a download, an error page) would tell the page something.
        let document = is(&SEC_FETCH_MODE, "navigate")
            && (headers.get(SEC_FETCH_DEST).is_none() || is(&SEC_FETCH_DEST, "document"));
        let path = request.uri().path();
        let inspector = path == "/" || path == "/ui" || path.starts_with("/ui/");
        if !(document && inspector) {
            return Err(Error::ForbiddenOrigin(
                "a request another site's page made without an Origin (Sec-Fetch-Site)".to_owned(),
            ));
        }
    }
    Ok(())
}

/// The authority a request names: the URI's (HTTP/2 `:authority`, or an
/// HTTP/1.1 absolute-form target, which RFC 9112 section 3.2.2 puts before
/// `Host`), else the `Host` header. `None` when there is neither.
#[derive(Debug)]
enum RequestAuthority {
    /// A parsed authority.
    Valid(Authority),
    /// A `Host` value that is not an authority: matches nothing.
    Invalid(String),
}

fn request_authority(request: &HttpRequest) -> Option<RequestAuthority> {
    if let Some(authority) = request.uri().authority() {
        return Some(RequestAuthority::Valid(authority.clone()));
    }
    let host = request.headers().get(HOST)?;
    Some(
        std::str::from_utf8(host.as_bytes())
            .ok()
            .and_then(|text| text.trim().parse::<Authority>().ok())
            // `user@host` is not a Host value (RFC 9110 section 7.2).
            .filter(|authority| !authority.as_str().contains('@'))
            .map_or_else(
                || RequestAuthority::Invalid(shown_bytes(host.as_bytes())),
                RequestAuthority::Valid,
            ),
    )
}

/// Whether `ip` is a loopback address, an IPv4-mapped one included (a
/// dual-stack `[::]` listener sees `127.0.0.1` as `::ffff:127.0.0.1`).
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Whether a loopback connection may serve `authority`: a loopback name
/// (`localhost`, a loopback IP literal) at any port (`ssh -L` and
/// `kubectl port-forward` arrive on other ports), or an `--allowed-host`
/// value (`host` for any port, `host:port` for that port only).
fn host_allowed(authority: &RequestAuthority, allowed_hosts: &[String]) -> bool {
    let RequestAuthority::Valid(authority) = authority else {
        return false;
    };
    let host = authority.host();
    if is_loopback_name(host) {
        return true;
    }
    allowed_hosts.iter().any(|allowed| {
        let Ok(allowed) = allowed.parse::<Authority>() else {
            return false;
        };
        allowed.host().eq_ignore_ascii_case(host)
            && allowed
                .port_u16()
                .is_none_or(|port| authority.port_u16() == Some(port))
    })
}

/// `localhost` (RFC 6761 section 6.3: always loopback) or a loopback IP
/// literal (`127.0.0.0/8`, `[::1]`). No other name can be trusted: DNS
/// decides what it points at.
fn is_loopback_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let literal = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    literal.parse::<IpAddr>().is_ok_and(is_loopback)
}

/// Whether the serialized origin `origin` (`scheme://host[:port]`, Fetch
/// standard) has the host and port of `authority`. The scheme is not
/// compared, only used for the default port when `origin` names none; a
/// `Host` without a port matches an origin at its scheme's default port.
fn same_authority(origin: &str, authority: &RequestAuthority) -> bool {
    let RequestAuthority::Valid(authority) = authority else {
        return false;
    };
    let Ok(origin) = origin.parse::<Uri>() else {
        return false;
    };
    let (Some(scheme), Some(origin_authority)) = (origin.scheme(), origin.authority()) else {
        return false;
    };
    if !origin_authority
        .host()
        .eq_ignore_ascii_case(authority.host())
    {
        return false;
    }
    let default_port = if *scheme == Scheme::HTTPS || scheme.as_str().eq_ignore_ascii_case("wss") {
        Some(443)
    } else if *scheme == Scheme::HTTP || scheme.as_str().eq_ignore_ascii_case("ws") {
        Some(80)
    } else {
        None
    };
    let origin_port = origin_authority.port_u16().or(default_port);
    match authority.port_u16() {
        Some(port) => origin_port == Some(port),
        None => origin_port.is_some() && origin_port == default_port,
    }
}

fn shown(authority: &RequestAuthority) -> String {
    match authority {
        RequestAuthority::Valid(authority) => authority.as_str().to_owned(),
        RequestAuthority::Invalid(text) => text.clone(),
    }
}

/// A header value for a problem's detail: lossy UTF-8, at most 200 bytes.
fn shown_bytes(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn config(cors: &[&str], allowed: &[&str]) -> ServerConfig {
        let mut config = ServerConfig::new(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Default::default(),
            std::path::PathBuf::from("/nonexistent"),
        );
        config.cors_allow_origins = cors.iter().map(|s| (*s).to_owned()).collect();
        config.allowed_hosts = allowed.iter().map(|s| (*s).to_owned()).collect();
        config
    }

    fn request(host: Option<&str>, origin: Option<&str>) -> HttpRequest {
        let mut builder = http::Request::builder().uri("/v2/fs/mkdir");
        if let Some(host) = host {
            builder = builder.header(HOST, host);
        }
        if let Some(origin) = origin {
            builder = builder.header(ORIGIN, origin);
        }
        builder.body(None).expect("request")
    }

    const LOOPBACK: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 2468);
    const PUBLIC: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 2468);

    fn kind(result: Result<(), Error>) -> &'static str {
        match result {
            Ok(()) => "ok",
            Err(error) => error.kind(),
        }
    }

    #[test]
    fn hosts_on_a_loopback_connection() {
        let config = config(&[], &["sandbox.example", "proxy.example:8443"]);
        for host in [
            "127.0.0.1:2468",
            "localhost:9999",
            "LOCALHOST",
            "localhost.:1",
            "[::1]:2468",
            "127.1.2.3:80",
            "sandbox.example",
            "Sandbox.Example:1234",
            "proxy.example:8443",
        ] {
            assert_eq!(
                kind(check(&config, LOOPBACK, &request(Some(host), None))),
                "ok",
                "{host}"
            );
        }
        for host in [
            "attacker.example:2468",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:2468",
            "proxy.example:8444",
            "proxy.example",
            "user@127.0.0.1:2468",
            "[::2]:2468",
            "not a host",
        ] {
            assert_eq!(
                kind(check(&config, LOOPBACK, &request(Some(host), None))),
                "forbidden-host",
                "{host}"
            );
        }
        let mapped = SocketAddr::new(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()), 1);
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 1);
        for local in [mapped, v6] {
            let attacked = request(Some("attacker.example"), None);
            assert_eq!(kind(check(&config, local, &attacked)), "forbidden-host");
        }
        // No Host at all: not a browser.
        assert_eq!(kind(check(&config, LOOPBACK, &request(None, None))), "ok");
    }

    #[test]
    fn any_host_on_another_address() {
        let config = config(&[], &[]);
        let proxied = request(Some("abc123.sandbox.example"), None);
        assert_eq!(kind(check(&config, PUBLIC, &proxied)), "ok");
    }

    #[test]
    fn origins() {
        let config = config(&["https://app.example"], &[]);
        let cases = [
            ("127.0.0.1:2468", "http://127.0.0.1:2468", "ok"),
            ("127.0.0.1:2468", "https://127.0.0.1:2468", "ok"),
            ("localhost:2468", "http://LOCALHOST:2468", "ok"),
            ("127.0.0.1:2468", "https://app.example", "ok"),
            ("localhost", "http://localhost", "ok"),
            ("localhost", "https://localhost", "ok"),
            ("localhost:443", "https://localhost", "ok"),
            ("[::1]:2468", "http://[::1]:2468", "ok"),
            ("127.0.0.1:2468", "http://evil.example", "forbidden-origin"),
            (
                "127.0.0.1:2468",
                "http://127.0.0.1:2469",
                "forbidden-origin",
            ),
            (
                "127.0.0.1:2468",
                "http://localhost:2468",
                "forbidden-origin",
            ),
            ("127.0.0.1:2468", "http://127.0.0.1", "forbidden-origin"),
            ("localhost", "http://localhost:8080", "forbidden-origin"),
            ("127.0.0.1:2468", "null", "forbidden-origin"),
            ("127.0.0.1:2468", "127.0.0.1:2468", "forbidden-origin"),
            (
                "127.0.0.1:2468",
                "https://app.example.evil",
                "forbidden-origin",
            ),
        ];
        for (host, origin, expected) in cases {
            let result = check(&config, LOOPBACK, &request(Some(host), Some(origin)));
            assert_eq!(kind(result), expected, "Host {host}, Origin {origin}");
        }
        // Without a Host there is nothing the origin could equal.
        let result = check(
            &config,
            PUBLIC,
            &request(None, Some("http://127.0.0.1:2468")),
        );
        assert_eq!(kind(result), "forbidden-origin");
        let any = self::config(&["*"], &[]);
        let result = check(&any, LOOPBACK, &request(Some("127.0.0.1:1"), Some("null")));
        assert_eq!(kind(result), "ok");
    }

    #[test]
    fn http2_authority_comes_from_the_uri() {
        let config = config(&[], &[]);
        let request = |authority: &str, origin: &str| {
            http::Request::builder()
                .uri(format!("http://{authority}/v2/health"))
                .header(ORIGIN, origin)
                .body(None)
                .expect("request")
        };
        let same = request("127.0.0.1:2468", "http://127.0.0.1:2468");
        assert_eq!(kind(check(&config, LOOPBACK, &same)), "ok");
        let rebound = request("attacker.example:2468", "http://attacker.example:2468");
        assert_eq!(kind(check(&config, LOOPBACK, &rebound)), "forbidden-host");
    }
}
