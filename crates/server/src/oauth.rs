//! The modern server as an OAuth 2.1 resource server: JWT access tokens from one or
//! more issuers (each with its keys and its token shape, see `token_profile`), checked
//! on every request, and the Protected Resource Metadata
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
//! insufficient scopes), RFC 9068 §4 (JWT access tokens: `typ` MUST be `at+jwt`; other
//! types only when configured, and said so at start-up).
//!
//! Every refusal names the check that failed and the setting that governs it, and
//! never repeats the token.

use super::token_profile::TokenProfile;
use crate::config::{AuthSection, ConfigError, IssuerSection};
use bytes::Bytes;
use http::header::HeaderValue;
use http::Uri;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
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
/// Most issuers one `[auth]` may name.
const MAX_ISSUERS: usize = 16;

/// Why a token was refused. The text goes into `error_description`: it names the check
/// and the setting, and never repeats the token.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a JWS compact serialization, or not one this server accepts.
    #[error("the access token is malformed")]
    Malformed,
    /// `typ` is not one of `token_types` (RFC 9068 §4 asks for `at+jwt`).
    #[error("the token's typ {found} is not accepted (token_types: {accepted})")]
    TokenType {
        /// The header's `typ` (printable, shortened) or "(none)".
        found: String,
        /// The accepted values.
        accepted: String,
    },
    /// The header's `alg` is not one of the accepted algorithms.
    #[error("the token's signature algorithm is not accepted (algorithms)")]
    Algorithm,
    /// No key of the JWK Set verifies it.
    #[error("the token is not signed by a known key (no key of its issuer's JWK Set has its kid)")]
    UnknownKey,
    /// Signature check failed.
    #[error("the token's signature is invalid")]
    Signature,
    /// Past `exp` (plus the allowed skew).
    #[error("the access token expired (exp)")]
    Expired,
    /// Before `nbf`.
    #[error("the access token is not yet valid (nbf)")]
    NotYetValid,
    /// `iss` is not a configured issuer.
    #[error("the token's issuer (iss) is not one this server accepts (issuer, [[auth.issuers]])")]
    Issuer,
    /// `aud` does not name this resource.
    #[error("the token's audience (aud) is not this resource (audience, audiences)")]
    Audience,
    /// A required claim is missing or has a value not allowed.
    #[error("the token's {claim} claim is missing or not allowed (required_claims)")]
    RequiredClaim {
        /// The claim's name.
        claim: String,
    },
    /// The principal claim is missing or not a string.
    #[error("the token has no usable {claim} claim (principal_claim)")]
    NoPrincipal {
        /// The claim's name.
        claim: String,
    },
    /// The keys could not be had.
    #[error("the authorization server's keys are unavailable")]
    KeysUnavailable,
}

/// A verified token: who it is for, and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The principal named by the configured claim.
    pub principal: String,
    /// The token's scopes (the profile's `scope_claims`; `scope`, space-separated, in
    /// RFC 9068 §2.2.3).
    pub scopes: BTreeSet<String>,
    /// When the token carries scopes only in claims the profile does not read: a
    /// sentence saying so, for a 403's description.
    pub scope_hint: Option<String>,
}

/// JWT checking for this resource's issuers and audiences.
#[derive(Debug)]
pub struct ResourceServer {
    issuers: Vec<Issuer>,
    metadata_url: String,
    metadata: Bytes,
    algorithms: Vec<Algorithm>,
    leeway: u64,
    scopes: BTreeMap<String, Vec<String>>,
}

/// One issuer: its identifier, keys, accepted audiences (the canonical one first) and
/// token shape.
#[derive(Debug)]
struct Issuer {
    id: String,
    keys: Keys,
    audiences: Vec<String>,
    profile: TokenProfile,
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
        if section.audience.is_empty() {
            return Err(invalid("audience must be set".into()));
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
        let top = (!section.issuer.is_empty()).then(|| IssuerSection {
            issuer: section.issuer.clone(),
            jwks_file: section.jwks_file.clone(),
            jwks_uri: section.jwks_uri.clone(),
            ..IssuerSection::default()
        });
        if top.is_none() && (section.jwks_file.is_some() || section.jwks_uri.is_some()) {
            return Err(invalid(
                "jwks_file/jwks_uri without issuer: give issuer too, or move them to [[auth.issuers]]"
                    .into(),
            ));
        }
        let mut issuers = Vec::new();
        for (i, own) in top
            .iter()
            .map(|t| (t, None))
            .chain(section.issuers.iter().map(|i| (i, Some(i))))
        {
            if i.issuer.is_empty() {
                return Err(invalid("every [[auth.issuers]] needs an issuer".into()));
            }
            if issuers.iter().any(|known: &Issuer| known.id == i.issuer) {
                return Err(invalid(format!("issuer {:?} is given twice", i.issuer)));
            }
            let profile = TokenProfile::resolve(section, own);
            if profile.token_types.is_empty() || profile.scope_claims.is_empty() {
                return Err(invalid(format!(
                    "issuer {:?}: token_types and scope_claims must not be empty",
                    i.issuer
                )));
            }
            if let Some(extra) = profile.relaxed_types() {
                // Nothing gets weaker silently: RFC 9068 §4 asks for `at+jwt` so that an
                // ID token of the same issuer and audience is not taken for an access
                // token.
                warn!(
                    issuer = %i.issuer,
                    accepted = %extra,
                    "access tokens whose typ is not at+jwt are accepted (token_types)"
                );
            }
            let audiences = std::iter::once(section.audience.clone())
                .chain(profile.audiences.iter().cloned())
                .collect();
            issuers.push(Issuer {
                id: i.issuer.clone(),
                keys: Keys::from_config(i, section.jwks_refresh_secs)
                    .map_err(|reason| invalid(format!("issuer {:?}: {reason}", i.issuer)))?,
                audiences,
                profile,
            });
        }
        if issuers.is_empty() {
            return Err(invalid("issuer (or [[auth.issuers]]) must be set".into()));
        }
        if issuers.len() > MAX_ISSUERS {
            return Err(invalid(format!("at most {MAX_ISSUERS} issuers")));
        }
        let servers = if section.authorization_servers.is_empty() {
            issuers.iter().map(|i| i.id.clone()).collect()
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
            issuers,
            metadata_url,
            metadata: Bytes::from(serde_json::to_vec(&metadata).unwrap_or_default()),
            algorithms,
            leeway: section.clock_skew_secs,
            scopes: section.scopes.clone(),
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

    /// Verifies a JWT access token: its issuer among the configured ones, then with
    /// that issuer's profile and keys: `typ`, signature (JWKS), `iss`, `aud`,
    /// `exp`/`nbf`, required claims, principal and scopes.
    pub async fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        // The issuer picks the keys and the profile; its claim is trusted only once the
        // signature by its keys and `iss` itself are checked below.
        let unverified = jsonwebtoken::dangerous::insecure_decode::<Map<String, Value>>(token)
            .map_err(|_| TokenError::Malformed)?;
        let issuer = unverified
            .claims
            .get("iss")
            .and_then(Value::as_str)
            .and_then(|iss| self.issuers.iter().find(|i| i.id == iss))
            .ok_or(TokenError::Issuer)?;
        let profile = &issuer.profile;
        if !profile.accepts_type(header.typ.as_deref()) {
            return Err(TokenError::TokenType {
                found: header.typ.as_deref().map_or("(none)".into(), |t| {
                    t.chars()
                        .filter(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\'))
                        .take(32)
                        .collect()
                }),
                accepted: profile
                    .token_types
                    .iter()
                    .map(|t| if t.is_empty() { "\"\"" } else { t })
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if !self.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm);
        }
        let key = issuer.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.set_issuer(&[&issuer.id]);
        validation.set_audience(&issuer.audiences);
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
        if let Some(claim) = profile.missing_claim(&claims) {
            return Err(TokenError::RequiredClaim {
                claim: claim.to_owned(),
            });
        }
        let principal = claims
            .get(&profile.principal_claim)
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| TokenError::NoPrincipal {
                claim: profile.principal_claim.clone(),
            })?
            .to_owned();
        let (scopes, scope_hint) = profile.scopes(&claims);
        Ok(Verified {
            principal,
            scopes,
            scope_hint,
        })
    }
}

impl Issuer {
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

impl Keys {
    /// The keys of one issuer: `jwks_file` read now, `jwks_uri` fetched on first use.
    fn from_config(issuer: &IssuerSection, refetch_secs: u64) -> Result<Self, String> {
        match (&issuer.jwks_file, &issuer.jwks_uri) {
            (Some(file), None) => {
                let text = std::fs::read(file)
                    .map_err(|e| format!("cannot read jwks_file {}: {e}", file.display()))?;
                Ok(Keys::Static(Arc::new(parse_jwks(&text).map_err(|e| {
                    format!("jwks_file {}: {e}", file.display())
                })?)))
            }
            (None, Some(uri)) => {
                let uri: Uri = uri.parse().map_err(|e| format!("jwks_uri {uri:?}: {e}"))?;
                let loopback = uri.host().is_some_and(is_loopback_host);
                match uri.scheme_str() {
                    Some("https") => {}
                    Some("http") if loopback => {}
                    _ => {
                        return Err(
                            "jwks_uri must be https (plain http only to a loopback address)".into(),
                        )
                    }
                }
                Ok(Keys::Remote(Box::new(RemoteKeys {
                    uri,
                    client: crate::tls::webpki_client(),
                    refetch: Duration::from_secs(refetch_secs),
                    cache: tokio::sync::Mutex::new((None, None)),
                })))
            }
            _ => Err("give exactly one of jwks_file or jwks_uri".into()),
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
            provider: None,
            issuer: "https://auth.example".into(),
            audience: audience.into(),
            audiences: Vec::new(),
            jwks_file: Some(jwks.to_owned()),
            jwks_uri: None,
            principal_claim: None,
            token_types: None,
            scope_claims: None,
            required_claims: None,
            issuers: Vec::new(),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            clock_skew_secs: 30,
            jwks_refresh_secs: 10,
            authorization_servers: Vec::new(),
            scopes: [("notes_delete".to_owned(), vec!["notes:write".to_owned()])].into(),
        }
    }

    /// A JWKS file of its own for each caller (tests run in parallel, and one test
    /// rewriting a shared file would let another read it half-written), removed when
    /// the returned path is dropped.
    fn jwks_file() -> tempfile::TempPath {
        let path = tempfile::Builder::new()
            .prefix("dualera-jwks-")
            .suffix(".json")
            .tempfile()
            .unwrap()
            .into_temp_path();
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

    /// A token signed by the Ed25519 key of RFC 8037 §A.1 (the public half is `k1` of
    /// [`jwks_file`]).
    fn signed(typ: Option<&str>, claims: Value) -> String {
        let mut der = hex_bytes("302e020100300506032b657004220420");
        der.extend(hex_bytes(
            "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        ));
        let mut header = jsonwebtoken::Header::new(Algorithm::EdDSA);
        header.typ = typ.map(str::to_owned);
        header.kid = Some("k1".into());
        let key = jsonwebtoken::EncodingKey::from_ed_der(&der);
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    fn claims(extra: Value) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut c = json!({"iss": "https://auth.example", "aud": "https://gw.example/mcp",
                           "sub": "alice", "exp": now + 300, "scope": "notes:write"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    #[tokio::test]
    async fn malformed_and_unknown_tokens_are_refused() {
        let rs = ResourceServer::from_config(&section("https://gw.example/mcp", &jwks_file()), "n")
            .unwrap();
        assert_eq!(rs.verify("not-a-jwt").await, Err(TokenError::Malformed));
        // {"alg":"EdDSA","typ":"at+jwt","kid":"k1"} . {"iss":"https://auth.example"} . sig
        let forged = "eyJhbGciOiJFZERTQSIsInR5cCI6ImF0K2p3dCIsImtpZCI6ImsxIn0.eyJpc3MiOiJodHRwczovL2F1dGguZXhhbXBsZSJ9.AAAA";
        assert!(rs.verify(forged).await.is_err());
        // The same with "kid":"nope".
        let unknown = "eyJhbGciOiJFZERTQSIsInR5cCI6ImF0K2p3dCIsImtpZCI6Im5vcGUifQ.eyJpc3MiOiJodHRwczovL2F1dGguZXhhbXBsZSJ9.AAAA";
        assert_eq!(rs.verify(unknown).await, Err(TokenError::UnknownKey));
        let ok = rs
            .verify(&signed(Some("at+jwt"), claims(json!({}))))
            .await
            .unwrap();
        assert_eq!(ok.principal, "alice");
        assert!(ok.scopes.contains("notes:write"));
    }

    /// Each refusal names its check and setting, and never carries the token.
    #[tokio::test]
    async fn refusals_name_the_check_and_the_setting() {
        let rs = ResourceServer::from_config(&section("https://gw.example/mcp", &jwks_file()), "n")
            .unwrap();
        let cases = [
            (
                signed(Some("JWT"), claims(json!({}))),
                "the token's typ JWT is not accepted (token_types: at+jwt, application/at+jwt)",
            ),
            (
                signed(None, claims(json!({}))),
                "the token's typ (none) is not accepted (token_types: at+jwt, application/at+jwt)",
            ),
            (
                signed(Some("at+jwt"), claims(json!({"aud": "api://notes"}))),
                "the token's audience (aud) is not this resource (audience, audiences)",
            ),
            (
                signed(Some("at+jwt"), claims(json!({"iss": "https://other.example"}))),
                "the token's issuer (iss) is not one this server accepts (issuer, [[auth.issuers]])",
            ),
            (
                signed(Some("at+jwt"), claims(json!({"exp": 1_000_000}))),
                "the access token expired (exp)",
            ),
            (
                signed(Some("at+jwt"), claims(json!({"sub": 7}))),
                "the token has no usable sub claim (principal_claim)",
            ),
        ];
        for (token, want) in cases {
            let e = rs.verify(&token).await.unwrap_err();
            assert_eq!(e.to_string(), want);
            let sig = token.rsplit('.').next().unwrap();
            assert!(!e.to_string().contains(sig));
        }
    }

    /// An Entra ID shaped token: refused by the strict default, accepted by the preset
    /// once its audience is listed.
    #[tokio::test]
    async fn entra_tokens_need_the_preset_and_the_audience() {
        let jwks = jwks_file();
        let token = signed(
            Some("JWT"),
            claims(
                json!({"aud": "0c8a5b2e-5f4d-4a53-9d0e-1b2c3d4e5f60", "scp": "notes:write",
                          "oid": "9f1e", "scope": null}),
            ),
        );
        let mut s = section("https://gw.example/mcp", &jwks);
        s.provider = Some(crate::config::IdentityProvider::Entra);
        let rs = ResourceServer::from_config(&s, "n").unwrap();
        assert_eq!(rs.verify(&token).await, Err(TokenError::Audience));
        s.audiences = vec!["0c8a5b2e-5f4d-4a53-9d0e-1b2c3d4e5f60".into()];
        let rs = ResourceServer::from_config(&s, "n").unwrap();
        let v = rs.verify(&token).await.unwrap();
        assert_eq!(v.principal, "9f1e");
        assert!(v.scopes.contains("notes:write") && v.scope_hint.is_none());
        // Strict, once typ is allowed: the scopes are in a claim it does not read.
        s.provider = None;
        s.token_types = Some(vec!["JWT".into()]);
        s.principal_claim = Some("oid".into());
        let v = ResourceServer::from_config(&s, "n")
            .unwrap()
            .verify(&token)
            .await
            .unwrap();
        assert!(v.scopes.is_empty());
        assert_eq!(
            v.scope_hint.as_deref(),
            Some("the token carries scopes in scp, which scope_claims (scope) does not read")
        );
    }

    /// Several issuers (tenants), each with its own keys and shape; the metadata lists
    /// them all.
    #[tokio::test]
    async fn several_issuers_each_with_its_profile() {
        let jwks = jwks_file();
        let mut s = section("https://gw.example/mcp", &jwks);
        s.issuers = vec![IssuerSection {
            issuer: "https://login.example/tenant-b/v2.0".into(),
            provider: Some(crate::config::IdentityProvider::Okta),
            jwks_file: Some(jwks.to_path_buf()),
            required_claims: Some([("cid".to_owned(), vec!["app-1".to_owned()])].into()),
            ..IssuerSection::default()
        }];
        let rs = ResourceServer::from_config(&s, "n").unwrap();
        let doc: Value = serde_json::from_slice(&rs.metadata()).unwrap();
        assert_eq!(
            doc["authorization_servers"],
            json!([
                "https://auth.example",
                "https://login.example/tenant-b/v2.0"
            ])
        );
        let tenant_b = |extra: Value| {
            let mut c = claims(json!({"iss": "https://login.example/tenant-b/v2.0",
                                      "scp": ["notes:read"], "scope": null}));
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            signed(None, c)
        };
        let v = rs.verify(&tenant_b(json!({"cid": "app-1"}))).await.unwrap();
        assert!(v.scopes.contains("notes:read"));
        assert_eq!(
            rs.verify(&tenant_b(json!({"cid": "app-2"})))
                .await
                .unwrap_err()
                .to_string(),
            "the token's cid claim is missing or not allowed (required_claims)"
        );
        // The first issuer keeps the strict profile.
        assert!(matches!(
            rs.verify(&signed(None, claims(json!({})))).await,
            Err(TokenError::TokenType { .. })
        ));
        s.issuers.push(s.issuers[0].clone());
        assert!(ResourceServer::from_config(&s, "n").is_err(), "twice");
    }
}
