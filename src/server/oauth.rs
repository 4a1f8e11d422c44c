//! The modern server as an OAuth 2.1 resource server: JWT access tokens from one
//! authorization server, checked on every request, and the Protected Resource Metadata
//! document (RFC 9728) that tells a client where to get them.
//!
//! Why here and not in `access`: `access` knows principals and grants; this module
//! knows tokens — signatures, JWKS, issuers, audiences, scopes — and turns a valid
//! token into a principal for `access` (the static `[[principals]]` tokens are the
//! other source).
//!
//! Spec: 2025-11-25 `basic/authorization.mdx` and 2026-07-28 `basic/authorization/`
//! ("Token Handling": servers MUST validate access tokens per OAuth 2.1 §5.2, MUST
//! validate that tokens were issued for them as the audience per RFC 8707 §2, and
//! invalid or expired tokens MUST receive 401; "Authorization Server Location": the
//! metadata document MUST list `authorization_servers`; "Error Handling": 403 for
//! insufficient scopes), RFC 9068 §4 (JWT access tokens: `typ` MUST be `at+jwt`).

use crate::config::{AuthSection, ConfigError};
use bytes::Bytes;
use http::header::HeaderValue;
use http::Uri;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The well-known path of the Protected Resource Metadata (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Largest JWK Set accepted from `jwks_uri`.
const MAX_JWKS_BYTES: usize = 256 * 1024;
/// How long a `jwks_uri` fetch may take.
const JWKS_TIMEOUT: Duration = Duration::from_secs(10);
/// Most keys kept from one JWK Set.
const MAX_KEYS: usize = 64;

/// Why a token was refused. The text goes into `error_description`: it never repeats
/// the token.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a JWS compact serialization, or not one this server accepts.
    #[error("the access token is malformed")]
    Malformed,
    /// `typ` is not `at+jwt` (RFC 9068 §4).
    #[error("the token is not a JWT access token (typ must be at+jwt)")]
    NotAccessToken,
    /// The header's `alg` is not one of the accepted algorithms.
    #[error("the token's signature algorithm is not accepted")]
    Algorithm,
    /// No key of the JWK Set verifies it.
    #[error("the token is not signed by a known key")]
    UnknownKey,
    /// Signature check failed.
    #[error("the token's signature is invalid")]
    Signature,
    /// Past `exp` (plus the allowed skew).
    #[error("the access token expired")]
    Expired,
    /// Before `nbf`.
    #[error("the access token is not yet valid")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("the token was issued by another authorization server")]
    Issuer,
    /// `aud` does not name this resource.
    #[error("the token was issued for another resource (audience)")]
    Audience,
    /// The principal claim is missing or not a string.
    #[error("the token has no usable principal claim")]
    NoPrincipal,
    /// The keys could not be had.
    #[error("the authorization server's keys are unavailable")]
    KeysUnavailable,
}

/// A verified token: who it is for, and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The principal named by the configured claim.
    pub principal: String,
    /// The token's scopes (`scope`, space-separated, RFC 9068 §2.2.3).
    pub scopes: BTreeSet<String>,
}

/// JWT checking for one issuer and one audience.
#[derive(Debug)]
pub struct ResourceServer {
    issuer: String,
    audience: String,
    metadata_url: String,
    metadata: Bytes,
    algorithms: Vec<Algorithm>,
    leeway: u64,
    principal_claim: String,
    scopes: BTreeMap<String, Vec<String>>,
    keys: Keys,
}

#[derive(Debug)]
enum Keys {
    Static(Arc<JwkSet>),
    Remote(Box<RemoteKeys>),
}

type KeyClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

#[derive(Debug)]
struct RemoteKeys {
    uri: Uri,
    client: KeyClient,
    /// Least time between two fetches prompted by unknown `kid`s.
    refetch: Duration,
    /// The last set fetched and when; the async mutex makes concurrent misses share
    /// one fetch.
    cache: tokio::sync::Mutex<(Option<Arc<JwkSet>>, Option<Instant>)>,
}

impl ResourceServer {
    /// Builds the checker from `[auth]`, reading `jwks_file` now (a `jwks_uri` is
    /// fetched on first use).
    pub fn from_config(section: &AuthSection, server_name: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            reason: format!("[auth]: {reason}"),
        };
        if section.issuer.is_empty() || section.audience.is_empty() {
            return Err(invalid("issuer and audience must be set".into()));
        }
        let audience: Uri = section
            .audience
            .parse()
            .map_err(|e| invalid(format!("audience {:?} is not a URI: {e}", section.audience)))?;
        let (Some(scheme), Some(authority)) = (audience.scheme_str(), audience.authority()) else {
            return Err(invalid(
                "audience must be an absolute http(s) URI (the canonical URI of the resource)"
                    .into(),
            ));
        };
        let path = audience.path().trim_end_matches('/');
        let metadata_url = format!("{scheme}://{authority}{METADATA_PATH}{path}");
        let mut algorithms = Vec::new();
        for a in &section.algorithms {
            algorithms.push(match a.as_str() {
                "RS256" => Algorithm::RS256,
                "ES256" => Algorithm::ES256,
                "EdDSA" => Algorithm::EdDSA,
                other => {
                    return Err(invalid(format!(
                        "algorithm {other:?} is not supported (RS256, ES256, EdDSA)"
                    )))
                }
            });
        }
        if algorithms.is_empty() {
            return Err(invalid("algorithms must not be empty".into()));
        }
        let keys = match (&section.jwks_file, &section.jwks_uri) {
            (Some(file), None) => {
                let text = std::fs::read(file).map_err(|e| {
                    invalid(format!("cannot read jwks_file {}: {e}", file.display()))
                })?;
                Keys::Static(Arc::new(parse_jwks(&text).map_err(|e| {
                    invalid(format!("jwks_file {}: {e}", file.display()))
                })?))
            }
            (None, Some(uri)) => {
                let uri: Uri = uri
                    .parse()
                    .map_err(|e| invalid(format!("jwks_uri {uri:?}: {e}")))?;
                let loopback = uri.host().is_some_and(is_loopback_host);
                match uri.scheme_str() {
                    Some("https") => {}
                    Some("http") if loopback => {}
                    _ => {
                        return Err(invalid(
                            "jwks_uri must be https (plain http only to a loopback address)".into(),
                        ))
                    }
                }
                Keys::Remote(Box::new(RemoteKeys {
                    uri,
                    client: key_client()?,
                    refetch: Duration::from_secs(section.jwks_refresh_secs),
                    cache: tokio::sync::Mutex::new((None, None)),
                }))
            }
            _ => return Err(invalid("give exactly one of jwks_file or jwks_uri".into())),
        };
        let servers = if section.authorization_servers.is_empty() {
            vec![section.issuer.clone()]
        } else {
            section.authorization_servers.clone()
        };
        let supported: BTreeSet<&String> = section.scopes.values().flatten().collect();
        // RFC 9728 §2; the 2025-11-25 authorization page: `authorization_servers` MUST
        // list at least one authorization server.
        let metadata = json!({
            "resource": section.audience,
            "authorization_servers": servers,
            "scopes_supported": supported,
            "bearer_methods_supported": ["header"],
            "resource_name": server_name,
        });
        Ok(Self {
            issuer: section.issuer.clone(),
            audience: section.audience.clone(),
            metadata_url,
            metadata: Bytes::from(serde_json::to_vec(&metadata).unwrap_or_default()),
            algorithms,
            leeway: section.clock_skew_secs,
            principal_claim: section.principal_claim.clone(),
            scopes: section.scopes.clone(),
            keys,
        })
    }

    /// The Protected Resource Metadata document (JSON).
    pub fn metadata(&self) -> Bytes {
        self.metadata.clone()
    }

    /// Where the metadata document is published (RFC 9728 §3.1: the well-known path
    /// inserted before the resource's path).
    pub fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The scopes a `tools/call` of `tool` needs.
    pub fn scopes_for(&self, tool: &str) -> &[String] {
        self.scopes.get(tool).map_or(&[], Vec::as_slice)
    }

    /// Every scope some tool needs, space-separated (the `scope` of a 401 challenge:
    /// the 2025-11-25 authorization page says servers SHOULD include one).
    pub fn all_scopes(&self) -> String {
        let all: BTreeSet<&String> = self.scopes.values().flatten().collect();
        all.into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A `WWW-Authenticate` value: `Bearer resource_metadata="…"` plus `error`,
    /// `error_description` and `scope` when given (RFC 6750 §3, RFC 9728 §5.1).
    pub fn challenge(
        &self,
        error: Option<&str>,
        description: Option<&str>,
        scope: Option<&str>,
    ) -> HeaderValue {
        let mut v = format!("Bearer resource_metadata=\"{}\"", self.metadata_url);
        if let Some(e) = error {
            v.push_str(&format!(", error=\"{e}\""));
        }
        if let Some(d) = description {
            v.push_str(&format!(", error_description=\"{}\"", quoted(d)));
        }
        if let Some(s) = scope.filter(|s| !s.is_empty()) {
            v.push_str(&format!(", scope=\"{}\"", quoted(s)));
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// Verifies a JWT access token: signature (JWKS), `typ`, `iss`, `aud`, `exp`/`nbf`.
    pub async fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let typ_ok = header.typ.as_deref().is_some_and(|t| {
            t.eq_ignore_ascii_case("at+jwt") || t.eq_ignore_ascii_case("application/at+jwt")
        });
        if !typ_ok {
            return Err(TokenError::NotAccessToken);
        }
        if !self.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm);
        }
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation).map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                match e.kind() {
                    K::ExpiredSignature => TokenError::Expired,
                    K::ImmatureSignature => TokenError::NotYetValid,
                    K::InvalidIssuer => TokenError::Issuer,
                    K::InvalidAudience => TokenError::Audience,
                    K::InvalidSignature => TokenError::Signature,
                    K::InvalidAlgorithm => TokenError::Algorithm,
                    K::MissingRequiredClaim(c) if c == "aud" => TokenError::Audience,
                    K::MissingRequiredClaim(c) if c == "iss" => TokenError::Issuer,
                    _ => TokenError::Malformed,
                }
            })?;
        let claims = data.claims;
        let principal = claims
            .get(&self.principal_claim)
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .ok_or(TokenError::NoPrincipal)?
            .to_owned();
        let scopes = claims
            .get("scope")
            .and_then(Value::as_str)
            .map(|s| {
                s.split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Verified { principal, scopes })
    }

    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, TokenError> {
        let pick = |set: &JwkSet| -> Option<DecodingKey> {
            let jwk = match kid {
                Some(kid) => set.find(kid),
                // Without a `kid` only an unambiguous set will do.
                None if set.keys.len() == 1 => set.keys.first(),
                None => None,
            }?;
            key_fits(jwk, alg).then(|| DecodingKey::from_jwk(jwk).ok())?
        };
        match &self.keys {
            Keys::Static(set) => pick(set).ok_or(TokenError::UnknownKey),
            Keys::Remote(remote) => {
                let mut cache = remote.cache.lock().await;
                if let Some(key) = cache.0.as_deref().and_then(pick) {
                    return Ok(key);
                }
                let recently = cache.1.is_some_and(|at| at.elapsed() < remote.refetch);
                if recently && cache.0.is_some() {
                    return Err(TokenError::UnknownKey);
                }
                // Never fetched, or a `kid` we do not know: the authorization server may
                // have rotated its keys.
                cache.1 = Some(Instant::now());
                match remote.fetch().await {
                    Ok(set) => {
                        info!(keys = set.keys.len(), "JWK Set fetched");
                        cache.0 = Some(Arc::new(set));
                    }
                    Err(e) => {
                        warn!(error = %e, "JWK Set fetch failed");
                        if cache.0.is_none() {
                            return Err(TokenError::KeysUnavailable);
                        }
                    }
                }
                cache
                    .0
                    .as_deref()
                    .and_then(pick)
                    .ok_or(TokenError::UnknownKey)
            }
        }
    }
}

impl RemoteKeys {
    async fn fetch(&self) -> Result<JwkSet, String> {
        let req = http::Request::get(self.uri.clone())
            .header(
                http::header::ACCEPT,
                "application/json, application/jwk-set+json",
            )
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(JWKS_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status().as_u16()));
        }
        let body = tokio::time::timeout(
            JWKS_TIMEOUT,
            Limited::new(resp.into_body(), MAX_JWKS_BYTES).collect(),
        )
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
        debug!(bytes = body.len(), "JWK Set received");
        parse_jwks(&body)
    }
}

/// A client for `jwks_uri`: TLS with the webpki roots, certificates always verified.
fn key_client() -> Result<KeyClient, ConfigError> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// A JWK Set, keeping the keys this crate can use and skipping the others (an
/// authorization server may publish encryption keys or algorithms we do not take).
fn parse_jwks(bytes: &[u8]) -> Result<JwkSet, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let keys = v
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("not a JWK Set (no \"keys\" array)")?;
    let keys: Vec<Jwk> = keys
        .iter()
        .filter(|k| {
            k.get("use")
                .and_then(Value::as_str)
                .is_none_or(|u| u == "sig")
        })
        .filter_map(|k| serde_json::from_value::<Jwk>(k.clone()).ok())
        .take(MAX_KEYS)
        .collect();
    if keys.is_empty() {
        return Err("no usable signing key".into());
    }
    Ok(JwkSet { keys })
}

/// Whether a key may verify `alg` (its own `alg`, when it states one, must agree).
fn key_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    use jsonwebtoken::jwk::{AlgorithmParameters as P, KeyAlgorithm as K};
    let family = matches!(
        (&jwk.algorithm, alg),
        (P::RSA(_), Algorithm::RS256)
            | (P::EllipticCurve(_), Algorithm::ES256)
            | (P::OctetKeyPair(_), Algorithm::EdDSA)
    );
    let stated = match jwk.common.key_algorithm {
        None => true,
        Some(K::RS256) => alg == Algorithm::RS256,
        Some(K::ES256) => alg == Algorithm::ES256,
        Some(K::EdDSA) => alg == Algorithm::EdDSA,
        Some(_) => false,
    };
    family && stated
}

fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An RFC 9110 quoted-string body (no `"` or `\` left unescaped).
fn quoted(s: &str) -> String {
    s.chars()
        .filter(|c| (' '..='~').contains(c))
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(audience: &str, jwks: &std::path::Path) -> AuthSection {
        AuthSection {
            issuer: "https://auth.example".into(),
            audience: audience.into(),
            jwks_file: Some(jwks.to_owned()),
            jwks_uri: None,
            principal_claim: "sub".into(),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            clock_skew_secs: 30,
            jwks_refresh_secs: 10,
            authorization_servers: Vec::new(),
            scopes: [("notes_delete".to_owned(), vec!["notes:write".to_owned()])].into(),
        }
    }

    /// A JWKS file of its own for each caller: tests run in parallel, and one test
    /// rewriting a shared file would let another read it half-written.
    fn jwks_file() -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dualera-oauth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("jwks-{n}.json"));
        // An Ed25519 public key (RFC 8037 §A.2).
        std::fs::write(
            &path,
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]}"#,
        )
        .unwrap();
        path
    }

    #[test]
    fn metadata_url_inserts_the_well_known_path_before_the_resource_path() {
        let jwks = jwks_file();
        let rs =
            ResourceServer::from_config(&section("https://gw.example/mcp", &jwks), "n").unwrap();
        assert_eq!(
            rs.metadata_url(),
            "https://gw.example/.well-known/oauth-protected-resource/mcp"
        );
        let doc: Value = serde_json::from_slice(&rs.metadata()).unwrap();
        assert_eq!(doc["resource"], "https://gw.example/mcp");
        assert_eq!(
            doc["authorization_servers"],
            json!(["https://auth.example"])
        );
        assert_eq!(doc["scopes_supported"], json!(["notes:write"]));
        let root = ResourceServer::from_config(&section("https://gw.example", &jwks), "n").unwrap();
        assert_eq!(
            root.metadata_url(),
            "https://gw.example/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn challenges_carry_metadata_error_and_scope() {
        let rs = ResourceServer::from_config(&section("https://gw.example/mcp", &jwks_file()), "n")
            .unwrap();
        assert_eq!(
            rs.challenge(Some("insufficient_scope"), None, Some("notes:write")),
            "Bearer resource_metadata=\"https://gw.example/.well-known/oauth-protected-resource/mcp\", error=\"insufficient_scope\", scope=\"notes:write\""
        );
        assert!(rs
            .challenge(Some("invalid_token"), Some("say \"no\""), None)
            .to_str()
            .unwrap()
            .ends_with("error_description=\"say \\\"no\\\"\""));
    }

    #[test]
    fn bad_configs_are_refused() {
        let jwks = jwks_file();
        let mut s = section("https://gw.example/mcp", &jwks);
        s.jwks_uri = Some("https://auth.example/jwks".into());
        assert!(
            ResourceServer::from_config(&s, "n").is_err(),
            "both key sources"
        );
        s.jwks_file = None;
        s.jwks_uri = Some("http://auth.example/jwks".into());
        assert!(
            ResourceServer::from_config(&s, "n").is_err(),
            "plain http off loopback"
        );
        s.jwks_uri = Some("http://127.0.0.1:9/jwks".into());
        assert!(ResourceServer::from_config(&s, "n").is_ok());
        let mut s = section("relative/path", &jwks);
        assert!(ResourceServer::from_config(&s, "n").is_err());
        s.audience = "https://gw.example/mcp".into();
        s.algorithms = vec!["HS256".into()];
        assert!(
            ResourceServer::from_config(&s, "n").is_err(),
            "symmetric algorithms"
        );
    }

    #[tokio::test]
    async fn malformed_and_unknown_tokens_are_refused() {
        let rs = ResourceServer::from_config(&section("https://gw.example/mcp", &jwks_file()), "n")
            .unwrap();
        assert_eq!(rs.verify("not-a-jwt").await, Err(TokenError::Malformed));
        // {"alg":"EdDSA","typ":"JWT","kid":"k1"} . {} . sig
        let plain_jwt = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCIsImtpZCI6ImsxIn0.e30.AAAA";
        assert_eq!(rs.verify(plain_jwt).await, Err(TokenError::NotAccessToken));
        // {"alg":"EdDSA","typ":"at+jwt","kid":"nope"}
        let unknown = "eyJhbGciOiJFZERTQSIsInR5cCI6ImF0K2p3dCIsImtpZCI6Im5vcGUifQ.e30.AAAA";
        assert_eq!(rs.verify(unknown).await, Err(TokenError::UnknownKey));
        // {"alg":"EdDSA","typ":"at+jwt","kid":"k1"}, bad signature
        let forged = "eyJhbGciOiJFZERTQSIsInR5cCI6ImF0K2p3dCIsImtpZCI6ImsxIn0.e30.AAAA";
        assert!(rs.verify(forged).await.is_err());
    }
}
