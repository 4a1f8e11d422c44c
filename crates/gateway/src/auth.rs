//! Credentials on the gateway's legacy path, in one place: what binds a session to its
//! caller, the relay of the upstream's Protected Resource Metadata, and the refusal a
//! host gets when the upstream answers 401/403.
//!
//! The gateway is a transparent resource proxy (DESIGN.md, "Remote upstreams"): the
//! host's token is for the gateway's public URL, which is the upstream's canonical
//! resource URI, and the upstream verifies every call. So the gateway never validates
//! a token; it only
//!
//! - binds a legacy session to a principal ([`BindingKey`]): a JWT's `iss`+`sub`,
//!   decoded only as a key, else the token's digest (`[gateway] session_binding`);
//! - relays `/.well-known/oauth-protected-resource[/<endpoint>]` verbatim and offers
//!   no authorization-server facade (2025-11-25 `basic/authorization.mdx`, "Protected
//!   Resource Metadata Discovery Requirements": clients fetch the document from the
//!   URL in the challenge or from these well-known paths);
//! - answers the host request that caused an upstream 401/403 with the same status,
//!   `WWW-Authenticate` (byte for byte) and body ([`Denial`]).
//!
//! Tokens are never logged: a credential appears in logs only as
//! [`fingerprint`], a short digest.

use super::passthrough::strip_hop_by_hop;
use super::upstream::{Denial, OnBehalf, Outbound, UpstreamError};
use super::{text, Route};
use crate::body::{empty, full, BoxError, GatewayBody};
use crate::config::SessionBinding;
use crate::inbound::RequestBody;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use dualera_adapters::session::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION,
};
use dualera_adapters::{Message, ProtocolVersion, Request as RpcRequest, RequestId};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// The well-known path of the Protected Resource Metadata (RFC 9728 §3).
pub(super) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Longest JWT payload decoded for a binding key (a token is an HTTP header: hyper
/// already bounds it; this bounds the work on a forged one).
const MAX_PAYLOAD: usize = 8 * 1024;

/// What a legacy session is bound to, as a digest compared in constant time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct BindingKey([u8; 32]);

impl std::fmt::Debug for BindingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BindingKey({:02x}{:02x}{:02x}{:02x}…)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

impl BindingKey {
    /// The digest itself (the reverse bridge's principal in round states).
    pub(super) fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key of a request's `Authorization` header. With `Subject` and a bearer JWT
    /// whose payload has string `iss` and `sub`, the principal (a refreshed token of
    /// the same principal gives the same key); otherwise the digest of the credential
    /// itself ([`crate::bearer::canonical`]: the scheme's case and the spaces after it
    /// do not make another caller).
    /// No header at all has a key of its own, so a session opened with a token is not
    /// found without one.
    pub(super) fn of(mode: SessionBinding, authorization: Option<&HeaderValue>) -> Self {
        // Every request of a session without credentials asks for this one value.
        static NONE: std::sync::LazyLock<BindingKey> = std::sync::LazyLock::new(|| {
            let mut h = Sha256::new();
            h.update(b"dualera-session-binding\0");
            h.update(b"none");
            BindingKey(h.finalize().into())
        });
        let mut h = Sha256::new();
        h.update(b"dualera-session-binding\0");
        match authorization {
            None => return *NONE,
            Some(auth) => match (mode, jwt_subject(auth)) {
                (SessionBinding::Subject, Some((iss, sub))) => {
                    h.update(b"subject\0");
                    h.update(iss.as_bytes());
                    h.update(b"\0");
                    h.update(sub.as_bytes());
                }
                _ => {
                    h.update(b"token\0");
                    h.update(crate::bearer::canonical(auth));
                }
            },
        }
        Self(h.finalize().into())
    }

    /// Who a session with this binding counts against for `max_sessions_per_caller`:
    /// the binding itself, except for a caller without credentials, whose peer address
    /// is added (every local host would otherwise share the one "none" caller, and one
    /// host's flood of `initialize` would take the others' sessions).
    pub(super) fn caller(self, anonymous: bool, peer: Option<std::net::IpAddr>) -> Self {
        let (true, Some(ip)) = (anonymous, peer) else {
            return self;
        };
        let mut h = Sha256::new();
        h.update(b"dualera-session-caller\0");
        h.update(self.0);
        h.update(ip.to_string().as_bytes());
        Self(h.finalize().into())
    }

    /// The key as hex, for a store shared between replicas (the digest, never the
    /// credential).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // used by the Redis store only
    pub(super) fn to_hex(self) -> String {
        crate::digest::hex(&self.0)
    }

    /// Constant-time comparison.
    pub(super) fn matches(&self, other: &Self) -> bool {
        crate::digest::constant_time_eq(&self.0, &other.0)
    }
}

/// `iss` and `sub` of a bearer token that is a JWS compact serialization. Not
/// verified: it is only a key; the upstream verifies every call that uses the token.
fn jwt_subject(auth: &HeaderValue) -> Option<(String, String)> {
    let claims = unverified_claims(crate::bearer::token(auth)?)?;
    let iss = claims.get("iss")?.as_str()?;
    let sub = claims.get("sub")?.as_str()?;
    Some((iss.to_owned(), sub.to_owned()))
}

/// The claims of a JWS compact serialization, decoded but **not verified**: only ever
/// a key (the session binding) or a bound on a cache lifetime, never a reason to trust
/// the token. `None` for anything else, or a payload over [`MAX_PAYLOAD`].
pub(super) fn unverified_claims(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A request's `Authorization`, marked sensitive: `Debug` prints no token (the session
/// state that holds it for the request in hand derives `Debug`).
pub(super) fn credentials(headers: &http::HeaderMap) -> Option<HeaderValue> {
    headers.get(header::AUTHORIZATION).map(|v| {
        let mut v = v.clone();
        v.set_sensitive(true);
        v
    })
}

/// A short digest of a credential, for logs (never the credential itself).
pub(super) fn fingerprint(authorization: Option<&HeaderValue>) -> String {
    match authorization {
        None => "none".to_owned(),
        Some(a) => crate::digest::short_digest(&crate::bearer::canonical(a), 4),
    }
}

impl Denial {
    /// The response for the host: the upstream's status, challenges and body.
    pub(super) fn response(&self) -> Response<GatewayBody> {
        let mut r = Response::new(if self.body.is_empty() {
            empty()
        } else {
            full(self.body.clone())
        });
        *r.status_mut() = self.status;
        for c in &self.challenges {
            r.headers_mut().append(header::WWW_AUTHENTICATE, c.clone());
        }
        if let Some(ct) = &self.content_type {
            r.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
        }
        r
    }
}

/// What the upstream says to `authorization` (none: a caller without credentials),
/// when it refuses it: its 401/403 for a `server/discover` carrying that header.
///
/// Asked where a host request must learn that its credentials no longer do but would
/// otherwise cause no upstream call:
/// - a request naming a session without credentials while the session was opened with
///   some (or is unknown): a host whose token expired may send its next request
///   without one (the Python SDK does) and must learn to authorize again, not that its
///   session is gone; an unknown session id gets the same answer, so it reveals nothing;
/// - a standalone GET that starts no `subscriptions/listen`: the stream is opened on
///   behalf of its token, so the upstream checks that token first.
///
/// Only a refusal is relayed; the session is not touched. Bounded by [`PROBE_WAIT`].
pub(super) async fn upstream_denial(
    gw: &Arc<Route>,
    authorization: Option<&HeaderValue>,
) -> Option<Denial> {
    let probe = Message::Request(RpcRequest {
        id: RequestId::String("dualera-credentials-probe".into()),
        method: "server/discover".into(),
        params: Some(json!({ "_meta": {
            META_PROTOCOL_VERSION: ProtocolVersion::V2026_07_28,
            META_CLIENT_CAPABILITIES: {},
            META_CLIENT_INFO: { "name": "dualera", "version": env!("CARGO_PKG_VERSION") },
        }})),
    });
    let on_behalf = OnBehalf {
        authorization,
        ..OnBehalf::default()
    };
    // The head decides: a 401/403 comes before any message.
    let probe = Outbound::from(probe);
    let asked = gw.upstream.exchange(&probe, on_behalf, &[]);
    match tokio::time::timeout(PROBE_WAIT, asked).await {
        Ok(Err(UpstreamError::Denied(d))) => Some(*d),
        _ => None,
    }
}

/// How long [`upstream_denial`] waits for the upstream.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Relays `GET`/`HEAD`/`OPTIONS` on a metadata path to the upstream verbatim (status,
/// headers but hop-by-hop ones, body). The endpoint suffix maps to the upstream's own
/// endpoint path, so the document is the one the upstream publishes for itself.
pub(super) async fn relay_metadata(
    gw: &Arc<Route>,
    req: Request<RequestBody>,
) -> Response<GatewayBody> {
    if !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut().insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, OPTIONS"),
        );
        return r;
    }
    if gw.upstream.stdio().is_some() {
        return text(
            StatusCode::NOT_FOUND,
            "this upstream is a local process: it has no protected resource metadata\n",
        );
    }
    // The root document maps to the upstream's root; a route's path maps to the
    // upstream's own endpoint path (RFC 9728 §3.1), whatever the route is called here.
    let root = matches!(
        req.uri().path().strip_prefix(METADATA_PATH),
        Some("") | None
    );
    let query = req.uri().query().map(str::to_owned);
    let (mut parts, _body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    let sent = gw
        .upstream
        .send(|upstream| {
            let suffix = if root {
                ""
            } else {
                upstream.uri().path().trim_end_matches('/')
            };
            let path = match &query {
                Some(q) => format!("{METADATA_PATH}{suffix}?{q}"),
                None => format!("{METADATA_PATH}{suffix}"),
            };
            let mut target = upstream.uri().clone().into_parts();
            target.path_and_query = path.parse().ok();
            let uri = Uri::from_parts(target).ok()?;
            let mut parts = parts.clone();
            if let Some(host) = upstream.host_header() {
                parts.headers.insert(header::HOST, host.clone());
            }
            parts.uri = uri;
            let sent = upstream
                .client()
                .request(Request::from_parts(parts, empty()));
            Some(async move { sent.await.map_err(|e| UpstreamError::from_client(&e)) })
        })
        .await;
    match sent {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(|e| -> BoxError { Box::new(e) }).boxed())
        }
        Err(e) => {
            tracing::warn!(error = %e, "upstream metadata request failed");
            text(
                StatusCode::BAD_GATEWAY,
                "the upstream server is unreachable\n",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> HeaderValue {
        let enc = |s: &str| URL_SAFE_NO_PAD.encode(s);
        HeaderValue::from_str(&format!(
            "Bearer {}.{}.c2ln",
            enc(r#"{"alg":"RS256","typ":"at+jwt"}"#),
            enc(claims)
        ))
        .unwrap()
    }

    #[test]
    fn subject_binding_follows_the_principal_not_the_token() {
        let a1 = jwt(r#"{"iss":"https://as","sub":"alice","jti":"1"}"#);
        let a2 = jwt(r#"{"iss":"https://as","sub":"alice","jti":"2"}"#);
        let b = jwt(r#"{"iss":"https://as","sub":"bob","jti":"1"}"#);
        let other_iss = jwt(r#"{"iss":"https://evil","sub":"alice"}"#);
        let key = |a: &HeaderValue| BindingKey::of(SessionBinding::Subject, Some(a));
        assert!(key(&a1).matches(&key(&a2)));
        assert!(!key(&a1).matches(&key(&b)));
        assert!(!key(&a1).matches(&key(&other_iss)));
        let none = BindingKey::of(SessionBinding::Subject, None);
        assert!(!key(&a1).matches(&none));
        // The `iss`/`sub` boundary cannot be shifted.
        let shifted = jwt(r#"{"iss":"https://asa","sub":"lice"}"#);
        assert!(!key(&a1).matches(&key(&shifted)));
    }

    #[test]
    fn token_binding_and_opaque_tokens_use_the_digest() {
        let a1 = jwt(r#"{"iss":"https://as","sub":"alice","jti":"1"}"#);
        let a2 = jwt(r#"{"iss":"https://as","sub":"alice","jti":"2"}"#);
        let key = |a: &HeaderValue| BindingKey::of(SessionBinding::Token, Some(a));
        assert!(!key(&a1).matches(&key(&a2)));
        assert!(key(&a1).matches(&key(&a1.clone())));
        let opaque1 = HeaderValue::from_static("Bearer opaque-1");
        let opaque2 = HeaderValue::from_static("Bearer opaque-2");
        let subj = |a: &HeaderValue| BindingKey::of(SessionBinding::Subject, Some(a));
        assert!(!subj(&opaque1).matches(&subj(&opaque2)));
        // No `sub`: the digest, not a shared "no subject" key.
        let no_sub1 = jwt(r#"{"iss":"https://as","jti":"1"}"#);
        let no_sub2 = jwt(r#"{"iss":"https://as","jti":"2"}"#);
        assert!(!subj(&no_sub1).matches(&subj(&no_sub2)));
    }

    #[test]
    fn fingerprints_hide_the_token() {
        let secret = HeaderValue::from_static("Bearer s3cr3t-token");
        let fp = fingerprint(Some(&secret));
        assert_eq!(fp.len(), 8);
        assert!(!fp.contains("s3cr3t"));
        let mut h = http::HeaderMap::new();
        h.insert(header::AUTHORIZATION, secret);
        let held = credentials(&h).unwrap();
        assert!(!format!("{held:?}").contains("s3cr3t"));
        assert_eq!(held.as_bytes(), b"Bearer s3cr3t-token");
    }
}
