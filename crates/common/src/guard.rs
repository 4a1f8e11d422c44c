//! Defences shared by every HTTP listener: `Origin` and `Host` checks against DNS
//! rebinding, and the `Content-Type` check that keeps CORS "simple requests" out.
//!
//! Both header values are parsed before anything is compared: an origin is exactly
//! `scheme "://" host [":" port]` and a host is `host [":" port]`, with a port of
//! digits only and no userinfo, so `http://localhost:x.evil.example` and
//! `127.0.0.1:8901@evil.example` are refused rather than matched by their prefix.

use http::header::{HeaderMap, CONTENT_TYPE};

/// Whether a host name (lowercase, without port) is a loopback name.
fn is_loopback_host(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]") || host.ends_with(".localhost")
}

/// Parses an authority `host[:port]` (RFC 3986 §3.2, without userinfo): a bracketed
/// IPv6 literal or a reg-name/IPv4 of unreserved characters, then optionally `:`
/// and 1–5 digits. Returns the lowercase host.
fn parse_authority(authority: &str) -> Option<String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let literal = &rest[..end];
        if literal.is_empty()
            || !literal
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return None;
        }
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{}]", literal.to_ascii_lowercase()), port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let name_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        if !name_ok {
            return None;
        }
        (host.to_ascii_lowercase(), port)
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if p.parse::<u32>().ok()? > 65_535 {
            return None;
        }
    }
    Some(host)
}

/// Parses a serialized origin (`scheme://host[:port]`, RFC 6454 §6.2) with an
/// `http` or `https` scheme; returns the lowercase host.
fn parse_origin(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    parse_authority(rest)
}

/// Whether an `Origin` header value may call us: loopback origins always, plus the
/// configured ones (exact match, scheme and host compared case-insensitively).
/// `null` and anything that does not parse as an origin never.
pub fn origin_allowed(origin: &str, extra: &[String]) -> bool {
    let Some(host) = parse_origin(origin) else {
        return false;
    };
    if extra.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
        return true;
    }
    is_loopback_host(&host)
}

/// Whether a `Host` header value is acceptable for a loopback listener.
pub fn host_allowed_on_loopback(host: &str) -> bool {
    parse_authority(host).is_some_and(|h| is_loopback_host(&h))
}

/// The host a client addressed: `Host`, or the HTTP/2 `:authority` (which carries it
/// there); what the loopback `Host` check and `X-Forwarded-Host` use.
pub fn requested_host<B>(req: &http::Request<B>) -> Option<&str> {
    req.headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(http::uri::Authority::as_str))
}

/// Whether a request's `Content-Type` is `application/json` (parameters such as
/// `charset` allowed). Anything else on a POST gets 415: `text/plain`, form and
/// multipart bodies are what a web page can send cross-origin without a preflight.
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// Why a request is refused with 403 before anything else reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its `Origin` is not allowed ([`origin_allowed`]).
    Origin,
    /// On a loopback listener, its `Host` (or `:authority`) is not a loopback name.
    Host,
}

impl Refusal {
    /// The reason, for a JSON-RPC error's message.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Origin => "Origin not allowed",
            Self::Host => "Host not allowed",
        }
    }

    /// The reason as a `text/plain` body.
    pub fn text(self) -> &'static str {
        match self {
            Self::Origin => "Origin not allowed\n",
            Self::Host => "Host not allowed\n",
        }
    }
}

/// The DNS-rebinding guard every listener runs first: a request whose `Origin` is
/// present and not allowed, or, on a loopback listener, whose requested host
/// ([`requested_host`]) is not a loopback name, is refused. Both are parsed first
/// (digits-only port, no userinfo; see the module docs). 2026-07-28
/// `basic/transports/streamable-http.mdx` ("Security & Endpoint"): servers MUST validate
/// `Origin` on every connection and answer an invalid one with 403.
pub fn refusal<B>(
    req: &http::Request<B>,
    loopback: bool,
    allowed_origins: &[String],
) -> Option<Refusal> {
    if let Some(origin) = req.headers().get(http::header::ORIGIN) {
        if !origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, allowed_origins))
        {
            return Some(Refusal::Origin);
        }
    }
    let host_ok = || requested_host(req).is_none_or(host_allowed_on_loopback);
    (loopback && !host_ok()).then_some(Refusal::Host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert!(origin_allowed("http://localhost:3000", &[]));
        assert!(origin_allowed("http://127.0.0.1:8787", &[]));
        assert!(origin_allowed("https://[::1]:1", &[]));
        assert!(origin_allowed("http://LOCALHOST", &[]));
        assert!(!origin_allowed("http://evil.example.com", &[]));
        assert!(!origin_allowed("http://localhost.evil.com", &[]));
        assert!(!origin_allowed("null", &[]));
        assert!(!origin_allowed("http://localhost:x.evil.example", &[]));
        assert!(!origin_allowed("http://localhost:80.evil.example", &[]));
        assert!(!origin_allowed("http://127.0.0.1:8901@evil.example", &[]));
        assert!(!origin_allowed("http://user@localhost:1", &[]));
        assert!(!origin_allowed("http://localhost:1/", &[]));
        assert!(!origin_allowed("http://localhost:99999", &[]));
        assert!(!origin_allowed("ftp://localhost", &[]));
        assert!(!origin_allowed("http://[::1", &[]));
        assert!(origin_allowed(
            "https://app.example",
            &["https://app.example".into()]
        ));
    }

    #[test]
    fn hosts() {
        assert!(host_allowed_on_loopback("localhost:8787"));
        assert!(host_allowed_on_loopback("[::1]:80"));
        assert!(host_allowed_on_loopback("127.0.0.1"));
        assert!(!host_allowed_on_loopback("evil.example.com"));
        assert!(!host_allowed_on_loopback("127.0.0.1:8901@evil.example"));
        assert!(!host_allowed_on_loopback("localhost:x.evil.example"));
        assert!(!host_allowed_on_loopback("localhost:"));
        assert!(!host_allowed_on_loopback("[::1]evil"));
        assert!(!host_allowed_on_loopback(""));
    }

    #[test]
    fn refusals() {
        let req = |origin: Option<&str>, host: Option<&str>| {
            let mut b = http::Request::builder().uri("/mcp");
            if let Some(o) = origin {
                b = b.header("origin", o);
            }
            if let Some(h) = host {
                b = b.header("host", h);
            }
            b.body(()).unwrap()
        };
        let extra = ["https://app.example".to_owned()];
        assert_eq!(refusal(&req(None, None), true, &[]), None);
        assert_eq!(
            refusal(
                &req(Some("http://localhost:3000"), Some("127.0.0.1:8788")),
                true,
                &[]
            ),
            None
        );
        assert_eq!(
            refusal(
                &req(Some("https://app.example"), Some("localhost")),
                true,
                &extra
            ),
            None
        );
        assert_eq!(
            refusal(
                &req(Some("http://localhost:x.evil.example"), None),
                true,
                &[]
            ),
            Some(Refusal::Origin)
        );
        assert_eq!(
            refusal(&req(None, Some("127.0.0.1:8901@evil.example")), true, &[]),
            Some(Refusal::Host)
        );
        assert_eq!(
            refusal(&req(None, Some("localhost:80x")), true, &[]),
            Some(Refusal::Host)
        );
        // Not a loopback listener: any Host, but still the Origin check.
        assert_eq!(refusal(&req(None, Some("evil.example")), false, &[]), None);
        assert_eq!(
            refusal(&req(Some("null"), Some("evil.example")), false, &[]),
            Some(Refusal::Origin)
        );
        // HTTP/2: `:authority` stands in for `Host`.
        let h2 = http::Request::builder()
            .uri("https://evil.example/mcp")
            .body(())
            .unwrap();
        assert_eq!(refusal(&h2, true, &[]), Some(Refusal::Host));
    }

    #[test]
    fn content_types() {
        let ct = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, v.parse().unwrap());
            is_json(&h)
        };
        assert!(ct("application/json"));
        assert!(ct("Application/JSON; charset=utf-8"));
        assert!(!ct("text/plain"));
        assert!(!ct("application/x-www-form-urlencoded"));
        assert!(!ct("multipart/form-data; boundary=x"));
        assert!(!ct("application/jsonx"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
