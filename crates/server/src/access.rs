//! Who is calling (bearer token → principal) and what they may touch (grants).
//! `clientInfo` never plays any part here.
//!
//! A principal comes from one of two sources: a static `[[principals]]` token (the
//! demo), or a JWT access token checked by [`ResourceServer`] (`[auth]`). Either way
//! the rest of the server sees a [`Caller`].

use super::oauth::{ResourceServer, TokenError};
use super::scope::{Scope, ScopeError};
use crate::config::{resolve_secret, Config, ConfigError};
use crate::digest::constant_time_eq;
use http::header::HeaderValue;
use http::StatusCode;
use std::collections::BTreeSet;

/// Principals and their grants.
#[derive(Debug)]
pub struct Access {
    tokens: Vec<(String, TokenSecret)>,
    grants: Vec<(String, Vec<Scope>, Vec<Scope>)>,
    oauth: Option<ResourceServer>,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The principal grants refer to.
    pub principal: String,
    /// The token's scopes; `None` for a static token or with authentication off
    /// (scopes are an OAuth notion: those callers may call every tool).
    pub scopes: Option<BTreeSet<String>>,
    /// Why the token's scopes may be missing (scopes only in claims `scope_claims`
    /// does not read), for a 403's description.
    pub scope_hint: Option<String>,
}

/// A refused request: the HTTP status, its `WWW-Authenticate` challenge, and why.
#[derive(Debug, Clone)]
pub struct Denied {
    /// 401 or 403.
    pub status: StatusCode,
    /// The challenge (RFC 6750 §3).
    pub challenge: HeaderValue,
    /// For the JSON-RPC error message (never the token).
    pub reason: String,
}

/// A bearer token, kept out of `Debug` output.
struct TokenSecret(String);

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

fn token_reason(e: &TokenError) -> String {
    e.to_string()
}

/// The principal used when authentication is off.
pub const LOCAL_PRINCIPAL: &str = "local";

impl Access {
    /// Reads principals and grants from the configuration.
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        let mut tokens = Vec::new();
        for p in &config.principals {
            let token = resolve_secret(
                &format!("token of principal {:?}", p.name),
                &p.token,
                &p.token_env,
            )?;
            tokens.push((p.name.clone(), TokenSecret(token)));
        }
        let mut grants = Vec::new();
        for g in &config.grants {
            let parse = |v: &String, f: fn(&str) -> Result<Scope, ScopeError>| {
                f(v).map_err(|e| ConfigError::Invalid {
                    reason: format!("grant for {:?}: {e}", g.principal),
                })
            };
            let ws = g
                .workspaces
                .iter()
                .map(|w| parse(w, Scope::from_file_uri))
                .collect::<Result<Vec<_>, _>>()?;
            let repos = g
                .repositories
                .iter()
                .map(|r| parse(r, Scope::from_path_or_uri))
                .collect::<Result<Vec<_>, _>>()?;
            grants.push((g.principal.clone(), ws, repos));
        }
        let oauth = config
            .auth
            .as_ref()
            .map(|a| ResourceServer::from_config(a, &config.server.name))
            .transpose()?;
        Ok(Self {
            tokens,
            grants,
            oauth,
        })
    }

    /// Whether bearer authentication is on.
    pub fn auth_required(&self) -> bool {
        !self.tokens.is_empty() || self.oauth.is_some()
    }

    /// The OAuth resource server, when `[auth]` is configured.
    pub fn oauth(&self) -> Option<&ResourceServer> {
        self.oauth.as_ref()
    }

    /// The caller behind an `Authorization` header: a static token first, then a JWT
    /// access token. Refusals carry the challenge the 401 must send.
    pub async fn caller(&self, authorization: Option<&HeaderValue>) -> Result<Caller, Denied> {
        let token = authorization.and_then(crate::bearer::token);
        let Some(token) = token else {
            return Err(self.unauthorized(None, "a bearer token is required"));
        };
        if let Some(p) = self.authenticate(token) {
            return Ok(Caller {
                principal: p.to_owned(),
                scopes: None,
                scope_hint: None,
            });
        }
        let Some(oauth) = &self.oauth else {
            return Err(self.unauthorized(Some(()), "the bearer token is not valid"));
        };
        match oauth.verify(token).await {
            Ok(v) => Ok(Caller {
                principal: v.principal,
                scopes: Some(v.scopes),
                scope_hint: v.scope_hint,
            }),
            Err(e) => {
                tracing::info!(reason = %e, "access token refused");
                Err(self.unauthorized(Some(()), &token_reason(&e)))
            }
        }
    }

    /// Whether `caller` holds the scopes a `tools/call` of `tool` needs; a 403 with
    /// `error="insufficient_scope"` and the needed `scope` if not (2025-11-25
    /// authorization, "Scope Challenge Handling"; RFC 6750 §3.1).
    pub fn check_tool(&self, caller: &Caller, tool: &str) -> Result<(), Denied> {
        let (Some(oauth), Some(held)) = (&self.oauth, &caller.scopes) else {
            return Ok(());
        };
        let needed = oauth.scopes_for(tool);
        if needed.iter().all(|s| held.contains(s)) {
            return Ok(());
        }
        let scope = needed.join(" ");
        let description = match &caller.scope_hint {
            Some(hint) => format!("{tool} needs scope {scope}; {hint}"),
            None => format!("{tool} needs scope {scope}"),
        };
        Err(Denied {
            status: StatusCode::FORBIDDEN,
            challenge: oauth.challenge(
                Some("insufficient_scope"),
                Some(&description),
                Some(&scope),
            ),
            reason: format!("insufficient scope: {tool} needs {scope}"),
        })
    }

    /// A 401: `invalid_token` when a token was presented (RFC 6750 §3.1), none when it
    /// was missing (§3: "SHOULD NOT include an error code").
    fn unauthorized(&self, presented: Option<()>, reason: &str) -> Denied {
        let error = presented.map(|()| "invalid_token");
        let challenge = match &self.oauth {
            Some(o) => o.challenge(error, presented.map(|()| reason), Some(&o.all_scopes())),
            None if presented.is_some() => {
                HeaderValue::from_static("Bearer error=\"invalid_token\"")
            }
            None => HeaderValue::from_static("Bearer"),
        };
        Denied {
            status: StatusCode::UNAUTHORIZED,
            challenge,
            reason: reason.to_owned(),
        }
    }

    /// The principal owning `token`, compared in constant time against every token.
    pub fn authenticate(&self, token: &str) -> Option<&str> {
        let mut found = None;
        for (name, secret) in &self.tokens {
            if constant_time_eq(secret.0.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// Workspaces granted to `principal`.
    pub fn workspaces(&self, principal: &str) -> Vec<&Scope> {
        self.grants
            .iter()
            .filter(|g| g.0 == principal)
            .flat_map(|g| g.1.iter())
            .collect()
    }

    /// Repository directories granted to `principal`.
    pub fn repositories(&self, principal: &str) -> Vec<&Scope> {
        self.grants
            .iter()
            .filter(|g| g.0 == principal)
            .flat_map(|g| g.2.iter())
            .collect()
    }

    /// The granted workspace containing `target`, if any.
    pub fn workspace_for(&self, principal: &str, target: &Scope) -> Option<&Scope> {
        self.workspaces(principal)
            .into_iter()
            .find(|w| w.contains(target))
    }

    /// The granted repository containing `target`, if any.
    pub fn repository_for(&self, principal: &str, target: &Scope) -> Option<&Scope> {
        self.repositories(principal)
            .into_iter()
            .find(|r| r.contains(target))
    }
}
