//! What an access token of one issuer looks like: the accepted JOSE `typ` values, the
//! claims scopes are read from, the principal claim, extra audiences and required
//! claims — resolved from `[auth]`, `[[auth.issuers]]` and the provider presets.
//!
//! Why a module of its own: `oauth` checks signatures, issuers and expiry the same way
//! for every provider; what differs between Keycloak, Entra ID, Auth0, Okta and a
//! strict RFC 9068 server is only this shape. Keeping the presets here, as plain data
//! next to their tests, lets the README quote them line by line.
//!
//! Nothing gets weaker silently: RFC 9068 §4 says a resource server MUST check that
//! `typ` is `at+jwt`; a profile that accepts anything else says so ([`relaxed_types`]),
//! and `ResourceServer` logs it at start-up.
//!
//! [`relaxed_types`]: TokenProfile::relaxed_types

use crate::config::{AuthSection, IdentityProvider, IssuerSection};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The `typ` values RFC 9068 §4 allows.
pub const STRICT_TYPES: [&str; 2] = ["at+jwt", "application/at+jwt"];
/// Claims some provider puts scopes in: a token carrying one the profile does not read
/// gets a refusal that says so.
const KNOWN_SCOPE_CLAIMS: [&str; 4] = ["scope", "scp", "roles", "permissions"];
/// Most scopes kept from one token.
const MAX_SCOPES: usize = 256;

/// The resolved shape of one issuer's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenProfile {
    /// Accepted `typ` values; `""` accepts a token without `typ`.
    pub token_types: Vec<String>,
    /// Claims scopes are read from.
    pub scope_claims: Vec<String>,
    /// The claim naming the principal.
    pub principal_claim: String,
    /// Audiences accepted besides the canonical one.
    pub audiences: Vec<String>,
    /// Claim -> allowed values.
    pub required_claims: BTreeMap<String, Vec<String>>,
}

/// The defaults a provider's tokens need (each value is documented in the README's
/// section for the provider).
#[derive(Debug, Clone, Copy)]
struct Preset {
    token_types: &'static [&'static str],
    scope_claims: &'static [&'static str],
    principal_claim: &'static str,
    required_claims: &'static [(&'static str, &'static [&'static str])],
}

/// The strict profile: RFC 9068 as written.
const STRICT: Preset = Preset {
    token_types: &STRICT_TYPES,
    scope_claims: &["scope"],
    principal_claim: "sub",
    required_claims: &[],
};

fn preset(provider: Option<IdentityProvider>) -> Preset {
    match provider {
        None => STRICT,
        // Header `typ: "JWT"`; `scope` space-separated; the payload's own `typ` claim
        // is "Bearer" on access tokens and "ID" on ID tokens: requiring it keeps ID
        // tokens out even though the header cannot tell them apart.
        Some(IdentityProvider::Keycloak) => Preset {
            token_types: &["at+jwt", "application/at+jwt", "JWT"],
            required_claims: &[("typ", &["Bearer"])],
            ..STRICT
        },
        // Header `typ: "JWT"`; delegated scopes in `scp` (space-separated), application
        // permissions in `roles` (array); `oid` is the caller's object id across the
        // tenant (`sub` is pairwise per application).
        Some(IdentityProvider::Entra) => Preset {
            token_types: &["at+jwt", "application/at+jwt", "JWT"],
            scope_claims: &["scp", "roles"],
            principal_claim: "oid",
            required_claims: &[],
        },
        // Default token profile: header `typ: "JWT"` (the RFC 9068 profile issues
        // `at+jwt`); `scope` space-separated, RBAC permissions in `permissions` (array).
        Some(IdentityProvider::Auth0) => Preset {
            token_types: &["at+jwt", "application/at+jwt", "JWT"],
            scope_claims: &["scope", "permissions"],
            ..STRICT
        },
        // Custom authorization servers sign access tokens with no `typ` in the header
        // (some setups say "JWT"); scopes in `scp` (array).
        Some(IdentityProvider::Okta) => Preset {
            token_types: &["at+jwt", "application/at+jwt", "JWT", ""],
            scope_claims: &["scp"],
            ..STRICT
        },
    }
}

fn owned(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

impl TokenProfile {
    /// The profile of the issuer `[auth]` names itself (`issuer = None`) or of one
    /// `[[auth.issuers]]`: the closest setting wins — the issuer's own field, its
    /// provider's preset, `[auth]`'s field, `[auth]`'s provider's preset, the strict
    /// default.
    pub fn resolve(auth: &AuthSection, issuer: Option<&IssuerSection>) -> Self {
        let own = issuer.and_then(|i| i.provider.map(|p| preset(Some(p))));
        let outer = preset(auth.provider);
        macro_rules! pick {
            ($field:ident, $from_preset:expr) => {
                issuer
                    .and_then(|i| i.$field.clone())
                    .or_else(|| own.map($from_preset))
                    .or_else(|| auth.$field.clone())
                    .unwrap_or_else(|| $from_preset(outer))
            };
        }
        Self {
            token_types: pick!(token_types, |p: Preset| owned(p.token_types)),
            scope_claims: pick!(scope_claims, |p: Preset| owned(p.scope_claims)),
            principal_claim: pick!(principal_claim, |p: Preset| p.principal_claim.to_owned()),
            required_claims: pick!(required_claims, |p: Preset| p
                .required_claims
                .iter()
                .map(|(claim, values)| ((*claim).to_owned(), owned(values)))
                .collect()),
            audiences: issuer
                .and_then(|i| i.audiences.clone())
                .unwrap_or_else(|| auth.audiences.clone()),
        }
    }

    /// Whether a token whose header says `typ` (or has none) is of an accepted type.
    /// RFC 7515 §4.1.9: compared ignoring case, with or without `application/`.
    pub fn accepts_type(&self, typ: Option<&str>) -> bool {
        let found = typ.map(media_type);
        self.token_types.iter().any(|t| match &found {
            None => t.is_empty(),
            Some(f) => !t.is_empty() && media_type(t) == *f,
        })
    }

    /// The accepted types beyond RFC 9068's, when there are any (for the start-up
    /// warning).
    pub fn relaxed_types(&self) -> Option<String> {
        let strict: Vec<String> = STRICT_TYPES.iter().map(|t| media_type(t)).collect();
        let extra: Vec<&str> = self
            .token_types
            .iter()
            .filter(|t| t.is_empty() || !strict.contains(&media_type(t)))
            .map(|t| if t.is_empty() { "(no typ)" } else { t.as_str() })
            .collect();
        (!extra.is_empty()).then(|| extra.join(", "))
    }

    /// The first required claim the token lacks or carries with a value not allowed.
    pub fn missing_claim<'a>(&'a self, claims: &Map<String, Value>) -> Option<&'a str> {
        self.required_claims
            .iter()
            .find(|(claim, allowed)| {
                !string_values(claims.get(claim.as_str())).any(|v| allowed.iter().any(|a| a == v))
            })
            .map(|(claim, _)| claim.as_str())
    }

    /// The scopes the token carries in the claims this profile reads, and, when it
    /// carries scopes only in claims the profile does not read, a sentence saying so
    /// (for the refusal, should a tool need a scope).
    pub fn scopes(&self, claims: &Map<String, Value>) -> (BTreeSet<String>, Option<String>) {
        let scopes: BTreeSet<String> = self
            .scope_claims
            .iter()
            .flat_map(|c| string_values(claims.get(c.as_str())))
            .flat_map(|v| v.split(' '))
            .filter(|s| !s.is_empty())
            .take(MAX_SCOPES)
            .map(str::to_owned)
            .collect();
        let unread: Vec<&str> = KNOWN_SCOPE_CLAIMS
            .into_iter()
            .filter(|c| !self.scope_claims.iter().any(|s| s == c) && claims.contains_key(*c))
            .collect();
        let hint = (scopes.is_empty() && !unread.is_empty()).then(|| {
            format!(
                "the token carries scopes in {}, which scope_claims ({}) does not read",
                unread.join(", "),
                self.scope_claims.join(", ")
            )
        });
        (scopes, hint)
    }
}

/// A JOSE media type compared as RFC 7515 §4.1.9 says: case-insensitive, the
/// `application/` prefix optional.
fn media_type(t: &str) -> String {
    let lower = t.to_ascii_lowercase();
    match lower.strip_prefix("application/") {
        Some(rest) => rest.to_owned(),
        None => lower,
    }
}

/// A claim's string values: the string itself, or the strings of an array.
fn string_values(v: Option<&Value>) -> impl Iterator<Item = &str> {
    let (one, many) = match v {
        Some(Value::String(s)) => (Some(s.as_str()), None),
        Some(Value::Array(a)) => (None, Some(a.iter().filter_map(Value::as_str))),
        _ => (None, None),
    };
    one.into_iter().chain(many.into_iter().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn auth(text: &str) -> AuthSection {
        let config = crate::config::Config::parse(&format!(
            "[auth]\naudience = \"https://gw.example/mcp\"\n{text}"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        config.auth.unwrap()
    }

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_default_is_rfc_9068() {
        let p = TokenProfile::resolve(&auth(""), None);
        assert_eq!(p.token_types, ["at+jwt", "application/at+jwt"]);
        assert_eq!(p.scope_claims, ["scope"]);
        assert_eq!(p.principal_claim, "sub");
        assert!(p.required_claims.is_empty() && p.audiences.is_empty());
        assert!(p.accepts_type(Some("at+jwt")));
        assert!(p.accepts_type(Some("AT+JWT")));
        assert!(p.accepts_type(Some("application/at+jwt")));
        assert!(!p.accepts_type(Some("JWT")));
        assert!(!p.accepts_type(None));
        assert!(!p.accepts_type(Some("")));
        assert_eq!(p.relaxed_types(), None);
    }

    #[test]
    fn presets_hold_each_providers_shape() {
        let kc = TokenProfile::resolve(&auth("provider = \"keycloak\""), None);
        assert!(kc.accepts_type(Some("JWT")) && !kc.accepts_type(None));
        assert_eq!(kc.relaxed_types().as_deref(), Some("JWT"));
        assert_eq!(kc.missing_claim(&claims(json!({"typ": "ID"}))), Some("typ"));
        assert_eq!(kc.missing_claim(&claims(json!({"typ": "Bearer"}))), None);

        let entra = TokenProfile::resolve(&auth("provider = \"entra\""), None);
        assert_eq!(entra.scope_claims, ["scp", "roles"]);
        assert_eq!(entra.principal_claim, "oid");
        let (scopes, hint) = entra.scopes(&claims(
            json!({"scp": "notes:read notes:write", "roles": ["Notes.All"]}),
        ));
        assert_eq!(
            scopes.into_iter().collect::<Vec<_>>(),
            ["Notes.All", "notes:read", "notes:write"]
        );
        assert_eq!(hint, None);

        let auth0 = TokenProfile::resolve(&auth("provider = \"auth0\""), None);
        assert_eq!(auth0.scope_claims, ["scope", "permissions"]);
        assert!(auth0.accepts_type(Some("JWT")) && !auth0.accepts_type(None));

        let okta = TokenProfile::resolve(&auth("provider = \"okta\""), None);
        assert!(okta.accepts_type(None) && okta.accepts_type(Some("JWT")));
        assert_eq!(okta.relaxed_types().as_deref(), Some("JWT, (no typ)"));
        let (scopes, _) = okta.scopes(&claims(json!({"scp": ["notes:read"]})));
        assert!(scopes.contains("notes:read"));
    }

    #[test]
    fn the_closest_setting_wins() {
        let a = auth(
            "provider = \"entra\"\nscope_claims = [\"scope\"]\naudiences = [\"api://notes\"]\n\
             [[auth.issuers]]\nissuer = \"https://a\"\njwks_uri = \"https://a/jwks\"\n\
             [[auth.issuers]]\nissuer = \"https://b\"\njwks_uri = \"https://b/jwks\"\n\
             provider = \"okta\"\n\
             [[auth.issuers]]\nissuer = \"https://c\"\njwks_uri = \"https://c/jwks\"\n\
             provider = \"okta\"\ntoken_types = [\"at+jwt\"]\naudiences = []\n",
        );
        let top = TokenProfile::resolve(&a, None);
        assert_eq!(
            top.scope_claims,
            ["scope"],
            "explicit [auth] over its preset"
        );
        assert_eq!(top.principal_claim, "oid", "the rest from the preset");
        assert_eq!(top.audiences, ["api://notes"]);
        let inherits = TokenProfile::resolve(&a, Some(&a.issuers[0]));
        assert_eq!(inherits, top);
        let own = TokenProfile::resolve(&a, Some(&a.issuers[1]));
        assert_eq!(own.scope_claims, ["scp"], "its own preset over [auth]");
        assert_eq!(own.principal_claim, "sub");
        let explicit = TokenProfile::resolve(&a, Some(&a.issuers[2]));
        assert_eq!(explicit.token_types, ["at+jwt"]);
        assert!(explicit.audiences.is_empty());
    }

    #[test]
    fn unread_scope_claims_are_named() {
        let strict = TokenProfile::resolve(&auth(""), None);
        let (scopes, hint) = strict.scopes(&claims(json!({"scp": "notes:write"})));
        assert!(scopes.is_empty());
        assert_eq!(
            hint.as_deref(),
            Some("the token carries scopes in scp, which scope_claims (scope) does not read")
        );
        let (scopes, hint) = strict.scopes(&claims(json!({"scope": "a b", "scp": "c"})));
        assert_eq!(scopes.len(), 2);
        assert_eq!(hint, None);
    }

    #[test]
    fn required_claims_take_strings_and_arrays() {
        let p = TokenProfile::resolve(
            &auth("[auth.required_claims]\nazp = [\"app-1\", \"app-2\"]\n"),
            None,
        );
        assert_eq!(p.missing_claim(&claims(json!({"azp": "app-2"}))), None);
        assert_eq!(
            p.missing_claim(&claims(json!({"azp": ["x", "app-1"]}))),
            None
        );
        assert_eq!(
            p.missing_claim(&claims(json!({"azp": "app-3"}))),
            Some("azp")
        );
        assert_eq!(p.missing_claim(&claims(json!({}))), Some("azp"));
        assert_eq!(p.missing_claim(&claims(json!({"azp": 1}))), Some("azp"));
    }

    #[test]
    fn unknown_keys_and_providers_are_refused() {
        for bad in [
            "provider = \"cognito\"",
            "token_type = [\"JWT\"]",
            "[[auth.issuers]]\nissuer = \"https://a\"\nbogus = 1",
        ] {
            assert!(
                crate::config::Config::parse(&format!(
                    "[auth]\naudience = \"https://gw.example/mcp\"\n{bad}\n"
                ))
                .is_err(),
                "{bad}"
            );
        }
    }
}
