//! Token exchange (RFC 8693) for a route whose upstream accepts only tokens issued for
//! itself (`[gateway.routes.token_exchange]`).
//!
//! Why: the gateway is normally a transparent resource proxy — the host's token is for
//! the gateway's public URL, which is the upstream's canonical URI. A third-party
//! upstream cannot be told to accept tokens for the gateway's URL; so the gateway,
//! a confidential client of the same authorization server, trades the host's token
//! (subject token, audience: the gateway) for one whose audience is the upstream, and
//! sends only that one upstream.
//!
//! - One exchange per subject token and lifetime: concurrent requests carrying the same
//!   subject token share one exchange (single flight), and the result is cached, keyed
//!   by the subject token's SHA-256, for the `expires_in` the authorization server gave (a
//!   tenth off, at most 5 s), never past the subject token's own `exp` (a JWT's,
//!   read only to shorten the cache: the authorization server verified it). The cache
//!   is bounded (`max_cached`).
//! - A refusal by the authorization server reaches the host as a [`Refusal`]: 401
//!   `invalid_token` when the subject token is what it refused (`invalid_grant`,
//!   `invalid_request`, `invalid_token`), 403 otherwise, with a challenge naming the
//!   gateway's metadata; the gateway's own misconfiguration (`invalid_client`,
//!   `unauthorized_client`) or an unreachable authorization server is a 502.
//! - Neither token is ever logged: logs carry the authorization server's error code,
//!   statuses and whether the cache answered.
//!
//! Spec: 2025-11-25 `basic/authorization.mdx`, "Access Token Privilege Restriction":
//! servers MUST only accept tokens issued for themselves, and a server acting as a
//! client toward an upstream uses a separate token for it and MUST NOT pass through the
//! one it received — which is what this module does for a route whose upstream is not
//! the gateway's own resource. RFC 8693 §2.1 (request: `grant_type`, `subject_token`, `subject_token_type`,
//! `resource`, `audience`, `scope`, `requested_token_type`), §2.2.1 (response:
//! `access_token`, `issued_token_type`, `token_type`, `expires_in`), §2.2.2 (errors as
//! RFC 6749 §5.2); RFC 6749 §2.3.1 (`client_secret_basic`, id and secret
//! form-encoded first).

use crate::config::{resolve_secret, ConfigError, TokenExchangeSection};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// RFC 8693 §2.1 `grant_type`.
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// RFC 8693 §3: an OAuth 2.0 access token.
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// How long one exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest token response read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Default bound of the cache.
const DEFAULT_MAX_CACHED: usize = 1024;
/// Most of a token lifetime taken off before the cache forgets it.
const MAX_MARGIN: Duration = Duration::from_secs(5);

type ExchangeClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A route's exchanger: where to exchange, as whom, for what, and the tokens it got.
pub struct TokenExchanger {
    endpoint: Uri,
    /// `Basic …` of the gateway's client credentials (marked sensitive).
    client_auth: HeaderValue,
    resource: String,
    audience: Option<String>,
    scope: Option<String>,
    max_cached: usize,
    client: ExchangeClient,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    /// Exchanges under way, by cache key, shared by the requests that wait for them
    /// (at most `max_cached`; beyond that a request exchanges on its own).
    in_flight: Mutex<HashMap<[u8; 32], Arc<Flight>>>,
}

/// One exchange, awaited by every request carrying its subject token.
type Flight = tokio::sync::OnceCell<Result<(HeaderValue, Duration), ExchangeError>>;

impl std::fmt::Debug for TokenExchanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenExchanger")
            .field("endpoint", &self.endpoint)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// An exchanged token and until when it is served from the cache.
struct Cached {
    authorization: HeaderValue,
    until: Instant,
}

/// Why an exchange gave no token (for logs and for the host's answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The host's credentials are not a bearer token.
    #[error("the host's credentials are not a bearer token")]
    NotBearer,
    /// The authorization server answered with an OAuth error.
    #[error("the authorization server refused the token exchange ({code})")]
    Refused {
        /// HTTP status of its answer.
        status: u16,
        /// Its `error` code (sanitized).
        code: String,
    },
    /// It could not be reached in time.
    #[error("the authorization server is unreachable: {detail}")]
    Unreachable {
        /// What failed.
        detail: String,
    },
    /// Its answer is not a token response this gateway can use.
    #[error("the authorization server's answer is not a usable token response: {detail}")]
    BadResponse {
        /// What was wrong.
        detail: String,
    },
}

/// What the host gets when there is no token to send upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 502.
    pub status: StatusCode,
    /// `error` of the challenge (none on a 502).
    pub error: Option<&'static str>,
    /// Why, for `error_description` (never a token).
    pub description: String,
}

impl From<&ExchangeError> for Refusal {
    fn from(e: &ExchangeError) -> Self {
        let (status, error) = match e {
            ExchangeError::NotBearer => (StatusCode::UNAUTHORIZED, Some("invalid_token")),
            ExchangeError::Refused { code, .. } => match code.as_str() {
                "invalid_grant" | "invalid_request" | "invalid_token" => {
                    (StatusCode::UNAUTHORIZED, Some("invalid_token"))
                }
                "invalid_client" | "unauthorized_client" | "unsupported_grant_type" => {
                    (StatusCode::BAD_GATEWAY, None)
                }
                _ => (StatusCode::FORBIDDEN, Some("insufficient_scope")),
            },
            ExchangeError::Unreachable { .. } | ExchangeError::BadResponse { .. } => {
                (StatusCode::BAD_GATEWAY, None)
            }
        };
        let description = match e {
            ExchangeError::Unreachable { .. } | ExchangeError::BadResponse { .. } => {
                "the gateway could not exchange the token at the authorization server".into()
            }
            other => other.to_string(),
        };
        Self {
            status,
            error,
            description,
        }
    }
}

impl TokenExchanger {
    /// Builds a route's exchanger from its `[gateway.routes.token_exchange]`.
    pub fn from_config(section: &TokenExchangeSection) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            reason: format!("token_exchange: {reason}"),
        };
        let endpoint: Uri = section
            .token_endpoint
            .parse()
            .map_err(|e| invalid(format!("token_endpoint: {e}")))?;
        let loopback = endpoint.host().is_some_and(|h| {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            h.eq_ignore_ascii_case("localhost")
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        match endpoint.scheme_str() {
            Some("https") => {}
            Some("http") if loopback => {}
            _ => {
                return Err(invalid(
                    "token_endpoint must be https (plain http only to a loopback address)".into(),
                ))
            }
        }
        if section.client_id.is_empty() || section.resource.is_empty() {
            return Err(invalid("client_id and resource must be set".into()));
        }
        let secret = resolve_secret(
            "token_exchange client secret",
            &section.client_secret,
            &section.client_secret_env,
        )?;
        let form = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
        let basic = STANDARD.encode(format!("{}:{}", form(&section.client_id), form(&secret)));
        let mut client_auth = HeaderValue::from_str(&format!("Basic {basic}"))
            .map_err(|_| invalid("the client credentials are not a header value".into()))?;
        client_auth.set_sensitive(true);
        Ok(Self {
            endpoint,
            client_auth,
            resource: section.resource.clone(),
            audience: section.audience.clone(),
            scope: section.scope.clone(),
            max_cached: section.max_cached.unwrap_or(DEFAULT_MAX_CACHED).max(1),
            client: crate::tls::webpki_client(),
            cache: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// The `Authorization` to send upstream for a host request carrying `host`: none
    /// for none (the upstream's own challenge tells the host to authorize), else the
    /// exchanged token, from the cache or from the authorization server.
    pub async fn authorization_for(
        &self,
        host: Option<&HeaderValue>,
    ) -> Result<Option<HeaderValue>, ExchangeError> {
        let Some(host) = host else {
            return Ok(None);
        };
        let subject = crate::bearer::token(host).ok_or(ExchangeError::NotBearer)?;
        let key = cache_key(subject);
        if let Some(hit) = self.cached(&key) {
            tracing::debug!(cache = "hit", "token exchange");
            return Ok(Some(hit));
        }
        let (authorization, lifetime) = self.shared_exchange(key, subject).await?;
        let lifetime = match subject_expiry(subject) {
            Some(left) => lifetime.min(left),
            None => lifetime,
        };
        let keep = lifetime.saturating_sub((lifetime / 10).min(MAX_MARGIN));
        tracing::debug!(
            cache = "miss",
            keep_ms = keep.as_millis() as u64,
            "token exchange"
        );
        if !keep.is_zero() {
            self.remember(key, authorization.clone(), Instant::now() + keep);
        }
        Ok(Some(authorization))
    }

    /// [`Self::exchange`], run once for all the requests that carry `subject` at the
    /// same time.
    async fn shared_exchange(
        &self,
        key: [u8; 32],
        subject: &str,
    ) -> Result<(HeaderValue, Duration), ExchangeError> {
        let flight = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            match in_flight.get(&key) {
                Some(f) => Some(f.clone()),
                None if in_flight.len() < self.max_cached => {
                    let f = Arc::new(Flight::new());
                    in_flight.insert(key, f.clone());
                    Some(f)
                }
                None => None,
            }
        };
        let Some(flight) = flight else {
            return self.exchange(subject).await;
        };
        let outcome = flight.get_or_init(|| self.exchange(subject)).await.clone();
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if in_flight.get(&key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            in_flight.remove(&key);
        }
        outcome
    }

    fn cached(&self, key: &[u8; 32]) -> Option<HeaderValue> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|c| c.until > Instant::now())
            .map(|c| c.authorization.clone())
    }

    fn remember(&self, key: [u8; 32], authorization: HeaderValue, until: Instant) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= self.max_cached && !cache.contains_key(&key) {
            let now = Instant::now();
            cache.retain(|_, c| c.until > now);
            if cache.len() >= self.max_cached {
                // Still full: the entry that would expire first goes.
                if let Some(first) = cache.iter().min_by_key(|(_, c)| c.until).map(|(k, _)| *k) {
                    cache.remove(&first);
                }
            }
        }
        cache.insert(
            key,
            Cached {
                authorization,
                until,
            },
        );
    }

    /// Entries cached now (for tests and metrics).
    pub fn cached_len(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.len())
    }

    /// One RFC 8693 request: the new `Authorization` and how long the token lives.
    async fn exchange(&self, subject: &str) -> Result<(HeaderValue, Duration), ExchangeError> {
        let mut fields = vec![
            ("grant_type", GRANT_TYPE),
            ("subject_token", subject),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", ACCESS_TOKEN_TYPE),
            ("resource", self.resource.as_str()),
        ];
        if let Some(a) = &self.audience {
            fields.push(("audience", a));
        }
        if let Some(s) = &self.scope {
            fields.push(("scope", s));
        }
        let body = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, NON_ALPHANUMERIC)))
            .collect::<Vec<_>>()
            .join("&");
        let req = http::Request::post(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .header(header::AUTHORIZATION, self.client_auth.clone())
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ExchangeError::Unreachable {
                detail: e.to_string(),
            })?;
        let unreachable = |detail: String| ExchangeError::Unreachable { detail };
        let resp = tokio::time::timeout(EXCHANGE_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| unreachable("timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status();
        let body = tokio::time::timeout(
            EXCHANGE_TIMEOUT,
            Limited::new(resp.into_body(), MAX_RESPONSE_BYTES).collect(),
        )
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
        let outcome = token_response(status, &body);
        match &outcome {
            Ok(_) => tracing::info!(status = status.as_u16(), "token exchanged"),
            Err(e) => {
                tracing::warn!(status = status.as_u16(), error = %e, "token exchange refused")
            }
        }
        outcome
    }
}

/// Reads the authorization server's answer (RFC 8693 §2.2).
fn token_response(
    status: StatusCode,
    body: &[u8],
) -> Result<(HeaderValue, Duration), ExchangeError> {
    let bad = |detail: &str| ExchangeError::BadResponse {
        detail: detail.into(),
    };
    let json: Value = serde_json::from_slice(body).map_err(|_| {
        if status.is_success() {
            bad("not JSON")
        } else {
            ExchangeError::Refused {
                status: status.as_u16(),
                code: "no_error_code".into(),
            }
        }
    })?;
    if !status.is_success() {
        let code: String = json
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no_error_code")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect();
        return Err(ExchangeError::Refused {
            status: status.as_u16(),
            code,
        });
    }
    let token = json
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("no access_token"))?;
    // §2.2.1: `token_type` "Bearer", or "N_A" when the issued token is not an access
    // token for a bearer header; only the first can be sent upstream.
    let token_type = json.get("token_type").and_then(Value::as_str).unwrap_or("");
    if !token_type.eq_ignore_ascii_case("bearer") {
        return Err(bad("token_type is not Bearer"));
    }
    let mut authorization = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| bad("the access_token is not a header value"))?;
    authorization.set_sensitive(true);
    if crate::bearer::token(&authorization).is_none() {
        return Err(bad("the access_token is not a bearer token"));
    }
    // Without `expires_in` the lifetime is unknown: used once, not cached.
    let lifetime = json
        .get("expires_in")
        .and_then(Value::as_u64)
        .map_or(Duration::ZERO, Duration::from_secs);
    Ok((authorization, lifetime))
}

/// The cache key of a subject token: its SHA-256 under a label of its own.
fn cache_key(subject: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"dualera-token-exchange\0");
    h.update(subject.as_bytes());
    h.finalize().into()
}

/// How long a JWT subject token has left by its `exp` (not verified: only to keep the
/// cache from outliving it). `None` for an opaque token or one without `exp`.
fn subject_expiry(subject: &str) -> Option<Duration> {
    let exp = super::auth::unverified_claims(subject)?
        .get("exp")?
        .as_u64()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(exp.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn section() -> TokenExchangeSection {
        TokenExchangeSection {
            token_endpoint: "http://127.0.0.1:9/token".into(),
            client_id: "gateway".into(),
            client_secret: Some("s3cr3t&=".into()),
            client_secret_env: None,
            resource: "https://upstream.example/mcp".into(),
            audience: None,
            scope: None,
            max_cached: Some(2),
        }
    }

    #[test]
    fn configs_are_checked() {
        let x = TokenExchanger::from_config(&section()).unwrap();
        // RFC 6749 §2.3.1: the secret is form-encoded before base64.
        assert_eq!(
            x.client_auth,
            format!("Basic {}", STANDARD.encode("gateway:s3cr3t%26%3D")).as_str()
        );
        assert!(x.client_auth.is_sensitive());
        assert!(!format!("{x:?}").contains("s3cr3t"));
        let mut s = section();
        s.token_endpoint = "http://as.example/token".into();
        assert!(
            TokenExchanger::from_config(&s).is_err(),
            "plain http off loopback"
        );
        let mut s = section();
        s.client_secret = None;
        assert!(TokenExchanger::from_config(&s).is_err(), "no secret");
    }

    #[test]
    fn refusals_map_to_401_403_or_502() {
        let refused = |code: &str| {
            Refusal::from(&ExchangeError::Refused {
                status: 400,
                code: code.into(),
            })
        };
        let r = refused("invalid_grant");
        assert_eq!(
            (r.status, r.error),
            (StatusCode::UNAUTHORIZED, Some("invalid_token"))
        );
        assert_eq!(
            r.description,
            "the authorization server refused the token exchange (invalid_grant)"
        );
        assert_eq!(refused("invalid_target").status, StatusCode::FORBIDDEN);
        assert_eq!(refused("invalid_client").status, StatusCode::BAD_GATEWAY);
        assert_eq!(refused("invalid_client").error, None);
        let r = Refusal::from(&ExchangeError::NotBearer);
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn token_responses_are_read_strictly() {
        let ok = token_response(
            StatusCode::OK,
            br#"{"access_token":"abc.def.ghi","issued_token_type":"urn:ietf:params:oauth:token-type:access_token","token_type":"Bearer","expires_in":60}"#,
        )
        .unwrap();
        assert_eq!(ok.0, "Bearer abc.def.ghi");
        assert_eq!(ok.1, Duration::from_secs(60));
        let no_expiry = token_response(
            StatusCode::OK,
            br#"{"access_token":"abc","token_type":"bearer"}"#,
        )
        .unwrap();
        assert_eq!(no_expiry.1, Duration::ZERO);
        for bad in [
            &br#"{"access_token":"abc","token_type":"N_A"}"#[..],
            br#"{"token_type":"Bearer"}"#,
            br#"{"access_token":"a b","token_type":"Bearer"}"#,
            b"<html>",
        ] {
            assert!(matches!(
                token_response(StatusCode::OK, bad),
                Err(ExchangeError::BadResponse { .. })
            ));
        }
        assert_eq!(
            token_response(
                StatusCode::BAD_REQUEST,
                br#"{"error":"invalid_grant\"<script>","error_description":"x"}"#
            ),
            Err(ExchangeError::Refused {
                status: 400,
                code: "invalid_grantscript".into()
            })
        );
    }

    #[test]
    fn the_cache_is_bounded_and_expires() {
        let x = TokenExchanger::from_config(&section()).unwrap();
        let value = HeaderValue::from_static("Bearer x");
        let later = Instant::now() + Duration::from_secs(60);
        x.remember(cache_key("a"), value.clone(), later);
        x.remember(
            cache_key("b"),
            value.clone(),
            later + Duration::from_secs(1),
        );
        x.remember(
            cache_key("c"),
            value.clone(),
            later + Duration::from_secs(2),
        );
        assert_eq!(x.cached_len(), 2);
        assert!(
            x.cached(&cache_key("a")).is_none(),
            "the soonest to expire went"
        );
        assert!(x.cached(&cache_key("c")).is_some());
        x.remember(cache_key("d"), value, Instant::now());
        assert!(
            x.cached(&cache_key("d")).is_none(),
            "expired entries are not served"
        );
    }

    /// A token endpoint on a loopback socket that answers slowly and counts requests:
    /// concurrent requests with one subject token share one exchange, the cache answers
    /// the next, another subject token gets its own; a refusal is relayed.
    #[tokio::test]
    async fn one_exchange_per_subject_token_over_a_real_socket() {
        use hyper::service::service_fn;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let served = count.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let served = served.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let served = served.clone();
                        async move {
                            let basic = req.headers()[header::AUTHORIZATION].clone();
                            let form = req.into_body().collect().await.unwrap().to_bytes();
                            let form = String::from_utf8_lossy(&form).into_owned();
                            let n = served.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            assert!(basic.to_str().unwrap().starts_with("Basic "));
                            assert!(form.contains("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant%2Dtype%3Atoken%2Dexchange"));
                            let (status, body) = if form.contains("subject_token=bad") {
                                (400, r#"{"error":"invalid_grant"}"#.to_owned())
                            } else {
                                (
                                    200,
                                    format!(
                                        r#"{{"access_token":"exchanged-{n}","token_type":"Bearer","expires_in":60}}"#
                                    ),
                                )
                            };
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .status(status)
                                    .header(header::CONTENT_TYPE, "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        let mut s = section();
        s.token_endpoint = format!("http://{addr}/token");
        let x = Arc::new(TokenExchanger::from_config(&s).unwrap());
        let host = HeaderValue::from_static("Bearer subject-1");
        let asks = (0..5).map(|_| {
            let (x, host) = (x.clone(), host.clone());
            tokio::spawn(async move { x.authorization_for(Some(&host)).await })
        });
        for a in asks {
            assert_eq!(a.await.unwrap().unwrap().unwrap(), "Bearer exchanged-0");
        }
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "one exchange for five requests"
        );
        let again = x.authorization_for(Some(&host)).await.unwrap().unwrap();
        assert_eq!(again, "Bearer exchanged-0");
        assert_eq!(count.load(Ordering::SeqCst), 1, "the cache answered");
        let other = HeaderValue::from_static("Bearer subject-2");
        assert_eq!(
            x.authorization_for(Some(&other)).await.unwrap().unwrap(),
            "Bearer exchanged-1"
        );
        let bad = HeaderValue::from_static("Bearer bad");
        assert_eq!(
            x.authorization_for(Some(&bad)).await,
            Err(ExchangeError::Refused {
                status: 400,
                code: "invalid_grant".into()
            })
        );
        assert_eq!(x.authorization_for(None).await, Ok(None));
        assert_eq!(
            x.authorization_for(Some(&HeaderValue::from_static("Basic eA==")))
                .await,
            Err(ExchangeError::NotBearer)
        );
        assert!(x.in_flight.lock().unwrap().is_empty());
    }

    #[test]
    fn a_subject_jwt_caps_the_cache() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let jwt = |exp: u64| {
            format!(
                "e30.{}.c2ln",
                URL_SAFE_NO_PAD.encode(format!("{{\"exp\":{exp}}}"))
            )
        };
        let left = subject_expiry(&jwt(now + 30)).unwrap();
        assert!(left <= Duration::from_secs(30) && left >= Duration::from_secs(28));
        assert_eq!(subject_expiry(&jwt(now - 30)), Some(Duration::ZERO));
        assert_eq!(subject_expiry("opaque-token"), None);
    }
}
