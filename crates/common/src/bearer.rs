//! The `Authorization: Bearer <token>` header, read the same way by the modern server
//! and the gateway (neither reaches into the other for it).
//!
//! The scheme name is case-insensitive (RFC 9110 §11.1: "It uses a case-insensitive
//! token to identify the authentication scheme"); the token is RFC 6750 §2.1's
//! `b64token` and is compared exactly. [`canonical`] is the one spelling of a
//! credential that sessions, fingerprints and cache contexts are keyed by.

use http::header::HeaderValue;

/// Whitespace between an auth scheme and its credentials (RFC 9110 §11.4 asks for
/// `1*SP`; a tab is tolerated the same way).
fn blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The bearer token in an `Authorization` value, if it carries one.
pub fn token(authorization: &HeaderValue) -> Option<&str> {
    let value = authorization.to_str().ok()?.trim_matches(blank);
    let (scheme, rest) = value.split_once(blank)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_matches(blank);
    let b64token = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
    (!token.is_empty() && token.bytes().all(b64token)).then_some(token)
}

/// The credential an `Authorization` value carries, in one spelling, for whatever is
/// keyed by it (a session's binding, a log fingerprint, a cache context): `Bearer T`,
/// `bearer T`, `BEARER T` and `Bearer  T` are one credential, `bearer T`; another
/// scheme is lowercased and separated from its (unchanged) parameters by one space.
/// A value that is not text is taken as it is.
pub fn canonical(authorization: &HeaderValue) -> Vec<u8> {
    if let Some(t) = token(authorization) {
        return [b"bearer ".as_slice(), t.as_bytes()].concat();
    }
    let Ok(value) = authorization.to_str() else {
        return authorization.as_bytes().to_vec();
    };
    let value = value.trim_matches(blank);
    match value.split_once(blank) {
        Some((scheme, rest)) => format!(
            "{} {}",
            scheme.to_ascii_lowercase(),
            rest.trim_matches(blank)
        )
        .into_bytes(),
        None => value.to_ascii_lowercase().into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::{canonical, token};
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

    #[test]
    fn one_credential_has_one_spelling() {
        let one = canonical(&HeaderValue::from_static("Bearer T-1"));
        assert_eq!(one, b"bearer T-1");
        for spelling in [
            "bearer T-1",
            "BEARER T-1",
            "Bearer  T-1",
            "Bearer\tT-1",
            " Bearer T-1 ",
        ] {
            assert_eq!(
                canonical(&HeaderValue::from_str(spelling).unwrap()),
                one,
                "{spelling:?}"
            );
        }
        // The token itself is compared exactly.
        assert_ne!(canonical(&HeaderValue::from_static("Bearer t-1")), one);
        let basic = canonical(&HeaderValue::from_static("BASIC  dXNlcg=="));
        assert_eq!(basic, b"basic dXNlcg==");
        assert_ne!(
            canonical(&HeaderValue::from_static("Basic dXNlcG==")),
            basic
        );
    }
}
