//! The settings of one reverse-bridge session and the partition it serves: what the
//! driver decides once, when it opens a legacy session on behalf of a modern host.

use crate::version::ProtocolVersion;
use serde_json::{json, Value};
use std::time::Duration;

/// Hashes the canonical bytes of a host request's arguments (see
/// [`super::round::canonical_arguments`]) into the text bound in round states. The
/// driver supplies a collision-resistant hash (dualera's gateway: SHA-256, hex); the
/// state is sealed by the driver, so the digest needs no key.
pub type Digest = fn(&[u8]) -> String;

/// Bounds and timings of one legacy session. Every map and queue the machine keeps is
/// bounded by one of these.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Legacy revisions the bridge accepts from the server, newest first; the first is
    /// the one `initialize` asks for (default: all four, 2025-11-25 first).
    pub legacy_versions: Vec<String>,
    /// Most host requests waiting while the session initializes (default 16); one
    /// more is answered with an error at once.
    pub max_queued: usize,
    /// Most host calls in progress at once, rounds included (default 64).
    pub max_calls: usize,
    /// Most server requests parked for one host call (default 16); one more is
    /// answered with an error to the server.
    pub max_input_requests: usize,
    /// Most `input_required` rounds per host call (default 8).
    pub max_rounds: u32,
    /// How long a round waits for the host's retry, and how long its round state is
    /// valid (default 300 s); then the legacy call is cancelled.
    pub retry_wait: Duration,
    /// How long `initialize` may go unanswered before the session fails (default
    /// 30 s).
    pub initialize_timeout: Duration,
    /// Interval of the keep-alive `ping` to the server (default 30 s; zero: none).
    pub ping_interval: Duration,
    /// `ttlMs` of translated lists, `resources/read` and `server/discover` (default 0:
    /// a legacy server promises nothing about how long its lists hold).
    pub list_ttl: Duration,
    /// Whether those results are `cacheScope: "public"` (default `false`: `private`,
    /// since a legacy server may shape results per user).
    pub public_cache: bool,
    /// Most `subscriptions/listen` streams open at once (default 16).
    pub max_listeners: usize,
    /// Most resource URIs subscribed upstream (default 256).
    pub max_subscriptions: usize,
    /// Prefix of every id the machine mints (default `dualera`).
    pub id_prefix: String,
    /// `clientInfo` sent in `initialize` when the host's is missing or unusable.
    pub fallback_client_info: Value,
    /// The arguments digest ([`Digest`]).
    pub digest: Digest,
    /// Unix time, in milliseconds, at the driver's [`crate::Timestamp`] `0`: round
    /// states carry their expiry as wall time ([`super::RoundState::expires_at_ms`]),
    /// so that the sealed state and the codec agree on it (default 0: transcript
    /// vectors count from the epoch).
    pub unix_at_zero_ms: u64,
}

impl Config {
    /// The default settings, with the driver's digest function.
    pub fn new(digest: Digest) -> Self {
        Self {
            legacy_versions: ProtocolVersion::LEGACY
                .iter()
                .map(|v| (*v).to_owned())
                .collect(),
            max_queued: 16,
            max_calls: 64,
            max_input_requests: 16,
            max_rounds: 8,
            retry_wait: Duration::from_secs(300),
            initialize_timeout: Duration::from_secs(30),
            ping_interval: Duration::from_secs(30),
            list_ttl: Duration::ZERO,
            public_cache: false,
            max_listeners: 16,
            max_subscriptions: 256,
            id_prefix: "dualera".to_owned(),
            fallback_client_info: json!({ "name": "dualera", "version": env!("CARGO_PKG_VERSION") }),
            digest,
            unix_at_zero_ms: 0,
        }
    }
}

/// Who a legacy session is opened for. The gateway keys sessions by (principal,
/// declared capabilities, upstream) and never shares one across principals: the
/// confused-deputy boundary (DESIGN.md, "Reverse bridge").
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// The bridge's name for this legacy session, unique and unguessable (it is bound
    /// in every round state; the driver routes a retry by it).
    pub session: String,
    /// The authenticated principal, bound in every round state.
    pub principal: String,
    /// The modern `ClientCapabilities` the partition's hosts declare.
    pub capabilities: Value,
    /// The `clientInfo` of the host that opened the partition (self-reported, for the
    /// server's logs; attacker-controlled, so it is filtered and bounded).
    pub client_info: Value,
}
