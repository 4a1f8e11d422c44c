//! Forwarded headers: what the gateway tells the upstream about the caller, so an
//! upstream behind it can build its public URLs and log real client addresses.
//! `X-Forwarded-For`/`-Proto`/`-Host` by default, or RFC 7239 `Forwarded`, or nothing
//! (`[gateway] forwarded`). An address a client already put in `X-Forwarded-For` or
//! `Forwarded` is kept and ours appended, as proxies chain them.

use crate::config::ForwardedHeaders;
use crate::listener::ConnInfo;
use http::header::{HeaderMap, HeaderName, HeaderValue, FORWARDED};
use http::Request;
use std::net::{IpAddr, Ipv4Addr};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The forwarded headers for one downstream request (or the session it opened).
#[derive(Debug, Clone, Default)]
pub struct Forwarded {
    /// Boxed, not a `Vec`: a session keeps its opening request's headers for its
    /// whole life, so no spare capacity.
    headers: Box<[(HeaderName, HeaderValue)]>,
}

use crate::guard::requested_host;

fn node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4_text(v4),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// The address as text, as every request's forwarded headers write it: written by
/// hand, since `Display` goes through the formatting machinery (padding, width) and
/// cost half of what making the headers of a pass-through request did.
fn v4_text(ip: Ipv4Addr) -> String {
    let mut out = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4_text(v4),
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// A `Forwarded` quoted-string, or the token as it is when it is one.
fn forwarded_value(v: &str) -> String {
    let token = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        v.to_owned()
    } else {
        let escaped: String = v
            .chars()
            .flat_map(|c| match c {
                '"' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!("\"{escaped}\"")
    }
}

impl Forwarded {
    /// The headers for a request that arrived on `conn`, in `mode`; `existing` are
    /// the downstream request's headers (their `X-Forwarded-For`/`Forwarded` chain is
    /// continued).
    pub fn new<B>(mode: ForwardedHeaders, conn: &ConnInfo, req: &Request<B>) -> Self {
        let existing = req.headers();
        let host = requested_host(req);
        let mut headers = Vec::new();
        let joined = |name: &HeaderName, ours: String| {
            let before: Vec<&str> = existing
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            if before.is_empty() {
                ours
            } else {
                format!("{}, {ours}", before.join(", "))
            }
        };
        match mode {
            ForwardedHeaders::None => {}
            ForwardedHeaders::XForwarded => {
                let chain = joined(&X_FORWARDED_FOR, ip_text(conn.peer.ip()));
                if let Ok(v) = HeaderValue::from_str(&chain) {
                    headers.push((X_FORWARDED_FOR, v));
                }
                headers.push((X_FORWARDED_PROTO, HeaderValue::from_static(conn.scheme())));
                if let Some(v) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
                    headers.push((X_FORWARDED_HOST, v));
                }
            }
            ForwardedHeaders::Forwarded => {
                let mut element = format!("for={};proto={}", node(conn.peer.ip()), conn.scheme());
                if let Some(h) = host {
                    element.push_str(";host=");
                    element.push_str(&forwarded_value(h));
                }
                if let Ok(v) = HeaderValue::from_str(&joined(&FORWARDED, element)) {
                    headers.push((FORWARDED, v));
                }
            }
        }
        Self {
            headers: headers.into_boxed_slice(),
        }
    }

    /// Sets these headers on an upstream request (replacing what the client sent).
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// The headers, for tests and logs.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The headers as text pairs, for a session kept outside the process (a shared
    /// session's record).
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect()
    }

    /// The headers [`Forwarded::to_pairs`] wrote; pairs that are not valid header
    /// names and values are dropped.
    pub fn from_pairs(pairs: &[(String, String)]) -> Self {
        Self {
            headers: pairs
                .iter()
                .filter_map(|(n, v)| {
                    Some((
                        HeaderName::from_bytes(n.as_bytes()).ok()?,
                        HeaderValue::from_str(v).ok()?,
                    ))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(peer: &str, tls: bool) -> ConnInfo {
        ConnInfo {
            peer: peer.parse().unwrap(),
            local: "127.0.0.1:8788".parse().unwrap(),
            tls,
        }
    }

    fn get(f: &Forwarded, name: &str) -> Option<String> {
        f.headers()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        // Every mix of one-, two- and three-digit octets, at every place.
        let edges = [0u8, 1, 9, 10, 99, 100, 199, 200, 255];
        for a in edges {
            for b in edges {
                for c in edges {
                    for d in edges {
                        let ip = Ipv4Addr::new(a, b, c, d);
                        assert_eq!(v4_text(ip), ip.to_string());
                    }
                }
            }
        }
        for n in (0..=u32::MAX).step_by(65_537) {
            let ip = Ipv4Addr::from(n);
            assert_eq!(v4_text(ip), ip.to_string());
        }
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(ip_text(v6), "2001:db8::1");
    }

    #[test]
    fn x_forwarded_chain_and_host() {
        let req = Request::builder()
            .uri("/mcp")
            .header("host", "gw.example:8443")
            .header("x-forwarded-for", "203.0.113.7")
            .body(())
            .unwrap();
        let f = Forwarded::new(
            ForwardedHeaders::XForwarded,
            &conn("198.51.100.2:5000", true),
            &req,
        );
        assert_eq!(
            get(&f, "x-forwarded-for").as_deref(),
            Some("203.0.113.7, 198.51.100.2")
        );
        assert_eq!(get(&f, "x-forwarded-proto").as_deref(), Some("https"));
        assert_eq!(
            get(&f, "x-forwarded-host").as_deref(),
            Some("gw.example:8443")
        );
    }

    #[test]
    fn rfc7239_quotes_v6_and_ports() {
        let req = Request::builder()
            .uri("https://gw.example:8443/mcp")
            .body(())
            .unwrap();
        let f = Forwarded::new(
            ForwardedHeaders::Forwarded,
            &conn("[2001:db8::1]:5000", false),
            &req,
        );
        assert_eq!(
            get(&f, "forwarded").as_deref(),
            Some("for=\"[2001:db8::1]\";proto=http;host=\"gw.example:8443\"")
        );
        let none = Forwarded::new(ForwardedHeaders::None, &conn("127.0.0.1:1", false), &req);
        assert!(none.headers().is_empty());
    }
}
