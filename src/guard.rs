//! DNS-rebinding defences shared by every HTTP listener: `Origin` and `Host` checks.

/// Whether a host name (without port) is a loopback name.
fn is_loopback_host(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1") || host.ends_with(".localhost")
}

/// Splits `host[:port]` (with `[v6]` literals) and returns the host part.
fn host_part(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// Whether an `Origin` header value may call us: loopback origins always, plus the
/// configured ones (exact match). `null` and anything unparsable never.
pub fn origin_allowed(origin: &str, extra: &[String]) -> bool {
    if extra.iter().any(|o| o == origin) {
        return true;
    }
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if rest.contains('/') || rest.is_empty() {
        return false;
    }
    is_loopback_host(&host_part(rest).to_ascii_lowercase())
}

/// Whether a `Host` header value is acceptable for a loopback listener.
pub fn host_allowed_on_loopback(host: &str) -> bool {
    is_loopback_host(&host_part(host).to_ascii_lowercase())
}

/// Why a request must be refused with 403 before anything else (its `Origin` is not
/// allowed, or on a loopback listener its `Host` is not a loopback name), if it must.
pub fn refusal(
    headers: &http::HeaderMap,
    loopback: bool,
    allowed_origins: &[String],
) -> Option<&'static str> {
    if let Some(origin) = headers.get(http::header::ORIGIN) {
        if !origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, allowed_origins))
        {
            return Some("Origin not allowed\n");
        }
    }
    let host_ok = headers
        .get(http::header::HOST)
        .is_none_or(|v| v.to_str().is_ok_and(host_allowed_on_loopback));
    (loopback && !host_ok).then_some("Host not allowed\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert!(origin_allowed("http://localhost:3000", &[]));
        assert!(origin_allowed("http://127.0.0.1:8787", &[]));
        assert!(origin_allowed("https://[::1]:1", &[]));
        assert!(!origin_allowed("http://evil.example.com", &[]));
        assert!(!origin_allowed("http://localhost.evil.com", &[]));
        assert!(!origin_allowed("null", &[]));
        assert!(origin_allowed(
            "https://app.example",
            &["https://app.example".into()]
        ));
        assert!(host_allowed_on_loopback("localhost:8787"));
        assert!(host_allowed_on_loopback("[::1]:80"));
        assert!(!host_allowed_on_loopback("evil.example.com"));
    }
}
