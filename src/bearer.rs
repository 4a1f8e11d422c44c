//! The `Authorization: Bearer <token>` header, read the same way by the modern server
//! and the gateway (neither reaches into the other for it).
//!
//! The scheme name is case-insensitive (RFC 9110 §11.1: "It uses a case-insensitive
//! token to identify the authentication scheme"); the token is RFC 6750 §2.1's
//! `b64token` and is compared exactly.

use http::header::HeaderValue;

/// The bearer token in an `Authorization` value, if it carries one.
pub fn token(authorization: &HeaderValue) -> Option<&str> {
    let value = authorization.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(' ').trim_end_matches(' ');
    let b64token = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
    (!token.is_empty() && token.bytes().all(b64token)).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::token;
    use http::header::HeaderValue;

    #[test]
    fn scheme_is_case_insensitive_and_token_exact() {
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let v = HeaderValue::from_str(&format!("{scheme} abc.DEF-1_~+/=")).unwrap();
            assert_eq!(token(&v), Some("abc.DEF-1_~+/="), "{scheme}");
        }
        for bad in [
            "Basic abc",
            "Bearer",
            "Bearer ",
            "Bearerabc",
            "Bearer a b",
            "Bearer a\"b",
        ] {
            assert_eq!(token(&HeaderValue::from_static(bad)), None, "{bad:?}");
        }
    }
}
