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
