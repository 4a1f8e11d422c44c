//! Who is calling (bearer token → principal) and what they may touch (grants).
//! `clientInfo` never plays any part here.

use super::scope::{Scope, ScopeError};
use crate::config::{resolve_secret, Config, ConfigError};
use crate::digest::constant_time_eq;

/// Principals and their grants.
#[derive(Debug)]
pub struct Access {
    tokens: Vec<(String, TokenSecret)>,
    grants: Vec<(String, Vec<Scope>, Vec<Scope>)>,
}

/// A bearer token, kept out of `Debug` output.
struct TokenSecret(String);

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
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
        Ok(Self { tokens, grants })
    }

    /// Whether bearer authentication is on.
    pub fn auth_required(&self) -> bool {
        !self.tokens.is_empty()
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
