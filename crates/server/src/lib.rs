//! The modern, stateless MCP server (revision 2026-07-28): notes and repository
//! summaries. Every request carries everything needed to answer it; what must survive
//! between MRTR rounds rides in a signed `requestState`, and the only shared state is
//! the store. Nothing here knows about legacy sessions.
//!
//! ```text
//!  HTTP POST /mcp ─┐                        ┌─ server/discover, tools/list
//!                  ├─► Server::handle_bytes ─┤
//!  stdio line   ───┘   (envelope, _meta,    └─ tools/call ─► Tool::call ─► complete
//!                       headers, version)                        │          or input_required
//!                                                                └─► store (SQLite or
//!                                                                    PostgreSQL)
//! ```

// The pieces shared with the gateway live in `dualera-common`; imported at the root so
// that `crate::body`, `crate::config`, … name them from every module of this crate.
use dualera_common::{
    bearer, body, config, digest, endpoint, framing, guard, header_names, inbound, listener,
    request_state, sse, tls,
};

pub mod access;
pub mod catalog;
pub mod cursor;
pub mod error;
pub mod http;
pub mod meta;
pub mod oauth;
mod router;
pub mod scope;
pub mod stdio;
pub mod store;
pub mod tasks;
pub mod token_profile;
pub mod tools;

pub use access::Access;
pub use error::ServerError;
pub use router::{Handled, Listen, MirroredHeaders};
pub use tools::Sink;

use crate::config::{resolve_secret, Config, ConfigError, Limits};
use crate::request_state::StateCodec;
use catalog::Catalog;
use std::sync::Arc;
use store::Store;

/// What handlers can reach: the store, the state codec, access rules and limits.
#[derive(Debug)]
pub struct Services {
    /// Notes and nonces.
    pub store: Box<dyn Store>,
    /// Signs and verifies `requestState`.
    pub codec: StateCodec,
    /// Principals and grants.
    pub access: Access,
    /// Size and round limits.
    pub limits: Limits,
    /// Changes announced by handlers, fanned out to `subscriptions/listen` streams.
    pub changes: tokio::sync::broadcast::Sender<serde_json::Value>,
    /// Task settings and the task rounds running on this instance.
    pub tasks: tasks::Tasks,
}

/// A cheaply clonable handle on one server instance.
#[derive(Clone, Debug)]
pub struct Server {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    services: Services,
    catalog: Catalog,
    allowed_origins: Vec<String>,
}

/// How a server's signing key came to be (so `main` can say so on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// From the configuration.
    Configured,
    /// Generated at start-up because the configuration names none.
    Generated,
}

impl Server {
    /// Builds the notes server from a configuration: opens the store, resolves secrets.
    pub fn from_config(config: &Config) -> Result<(Self, KeySource), ConfigError> {
        Self::with_catalog(
            config,
            Catalog::notes(config.server.name.clone(), &config.limits),
        )
    }

    /// Builds a server offering `catalog` (the notes server, or another app on the
    /// same framework such as the conformance fixture).
    pub fn with_catalog(
        config: &Config,
        catalog: Catalog,
    ) -> Result<(Self, KeySource), ConfigError> {
        let limits = config.limits.clone();
        let (codec, source) =
            if config.state.keys.is_empty() {
                let codec = StateCodec::random(config.state.ttl_ms, limits.max_state_bytes)
                    .map_err(|e| ConfigError::Invalid {
                        reason: format!("cannot draw a random state key: {e}"),
                    })?;
                (codec, KeySource::Generated)
            } else {
                let mut keys = Vec::new();
                for k in &config.state.keys {
                    let secret =
                        resolve_secret(&format!("state key {:?}", k.id), &k.secret, &k.secret_env)?;
                    if secret.len() < 16 {
                        return Err(ConfigError::Invalid {
                            reason: format!("state key {:?} is shorter than 16 bytes", k.id),
                        });
                    }
                    keys.push((k.id.clone(), secret.into_bytes()));
                }
                (
                    StateCodec::new(keys, config.state.ttl_ms, limits.max_state_bytes),
                    KeySource::Configured,
                )
            };
        let t = &config.tasks;
        if t.ttl_ms == 0
            || t.poll_interval_ms == 0
            || t.max_per_principal == 0
            || t.max_running == 0
        {
            return Err(ConfigError::Invalid {
                reason: "[tasks] ttl_ms, poll_interval_ms, max_per_principal and max_running must be at least 1".into(),
            });
        }
        if limits.max_list == 0 || limits.max_delete_candidates == 0 {
            return Err(ConfigError::Invalid {
                reason: "[limits] max_list and max_delete_candidates must be at least 1".into(),
            });
        }
        let location =
            store::Location::from_section(&config.store).map_err(|e| ConfigError::Invalid {
                reason: format!("cannot open the store: {e}"),
            })?;
        let store = store::open_at(&location, &config.store).map_err(|e| ConfigError::Invalid {
            reason: format!("cannot open store {}: {e}", location.redacted()),
        })?;
        tracing::debug!(engine = store.engine(), "store opened");
        let access = Access::from_config(config)?;
        Ok((
            Self {
                inner: Arc::new(Inner {
                    services: Services {
                        store,
                        codec,
                        access,
                        limits,
                        changes: tokio::sync::broadcast::channel(256).0,
                        tasks: tasks::Tasks::new(config.tasks.clone()),
                    },
                    catalog,
                    allowed_origins: config.server.allowed_origins.clone(),
                }),
            },
            source,
        ))
    }

    /// The services handlers use.
    pub fn services(&self) -> &Services {
        &self.inner.services
    }

    /// Extra allowed `Origin` values.
    pub fn allowed_origins(&self) -> &[String] {
        &self.inner.allowed_origins
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
