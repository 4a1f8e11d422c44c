//! The gateway: one endpoint for both eras, per route. A modern request (2026-07-28
//! header, no session) is proxied untouched; legacy traffic (an `initialize`, or a
//! known session) is driven through the sans-IO session machine of `dualera-adapters`.
//!
//! ```text
//!   POST /a/mcp ─► guard ─► route by path ─► era? ─ modern ─► passthrough ─► route's pool ─► instance
//!                                                └ legacy ─► legacy_http ─► Session (adapters)
//!                                                                     ▲           │ commands
//!                                                                     └─ route's pool
//! ```
//!
//! A [`Route`] holds everything that serves one path (its upstream pool, sessions,
//! cache, telemetry); a [`Gateway`] handle points at one route and dereferences to it,
//! so the drivers (`legacy_http`, `pipe`, `passthrough`, …) read the route they serve
//! as `gw.upstream`, `gw.legacy`, `gw.cache` and never know that other routes exist.

// The pieces shared with the server live in `dualera-common`; imported at the root so
// that `crate::body`, `crate::config`, … name them from every module of this crate.
use dualera_common::{
    bearer, clock, config, digest, endpoint, framing, header_names, inbound, listener,
    request_state, sse, throttle, tls,
};

pub mod admin;
mod auth;
pub mod cache;
mod driver;
pub mod forwarded;
pub mod http_sse;
mod legacy_http;
pub mod metrics;
pub mod passthrough;
mod pipe;
pub mod public_resource;
pub mod readiness;
pub mod report;
pub mod reverse;
pub mod routes;
pub mod store;
pub mod telemetry;
pub mod token_exchange;
pub mod trace;
pub mod upstream;
pub mod websocket;
mod wire;

use crate::config::ForwardedHeaders;
use crate::header_names::{MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::inbound::RequestBody;
use crate::listener::{ConnHook, ConnInfo, ListenerConfig};
use dualera_adapters::version::is_modern_or_later;
use dualera_adapters::ProtocolVersion;
use dualera_common::body::{self, GatewayBody};
use dualera_common::guard;
use forwarded::Forwarded;
use http::{header, Method, Request, Response, StatusCode};
pub use routes::RouteError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::info;
pub use upstream::{
    Denial, HttpUpstream, OnBehalf, PoolError, StdioUpstream, Upstream, UpstreamClient,
    UpstreamError, UpstreamOptions, UpstreamPool,
};

/// Gateway settings; every bound has a default.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest request body accepted (and largest upstream message decoded).
    pub max_body_bytes: usize,
    /// Extra `Origin` values accepted besides loopback ones.
    pub allowed_origins: Vec<String>,
    /// Most live legacy sessions.
    pub max_sessions: usize,
    /// A legacy session unused this long is evicted.
    pub session_idle_ttl: Duration,
    /// SSE comment keepalive interval on idle legacy streams.
    pub keepalive: Duration,
    /// How long a live server-initiated request may go unanswered (reset by progress).
    pub live_request_timeout: Duration,
    /// How long a live request may run at most, progress or not.
    pub live_request_timeout_max: Duration,
    /// Legacy revisions offered to hosts, newest first (`None`: all of them).
    pub legacy_versions: Option<Vec<String>>,
    /// Pause before retrying a round that carried only `requestState`.
    pub retry_pause: Duration,
    /// Most MRTR rounds per legacy request.
    pub max_rounds: u32,
    /// Events kept per stream for `Last-Event-ID` resumption.
    pub replay_buffer: usize,
    /// Requests in flight per legacy session.
    pub max_in_flight: usize,
    /// Which forwarded headers upstream requests carry.
    pub forwarded: ForwardedHeaders,
    /// A WebSocket whose peer sent nothing (not even a pong) this long is closed.
    pub idle_timeout: Duration,
    /// What binds a legacy session to its caller.
    pub session_binding: crate::config::SessionBinding,
    /// The response cache (`[cache]`).
    pub cache: cache::CacheConfig,
    /// Live requests outstanding at the host per legacy session.
    pub max_live_requests: usize,
    /// Largest request the upstream accepts (what would exceed it is refused here).
    pub upstream_max_body_bytes: usize,
    /// Bytes queued toward a host SSE connection that does not read before it is closed.
    pub max_buffered_bytes: usize,
    /// How long the upstream read waits for a host SSE connection with half of
    /// `max_buffered_bytes` queued to drain before the connection counts as not reading.
    pub stalled_reader_timeout: Duration,
    /// Bytes of events kept per stream for `Last-Event-ID` resumption.
    pub replay_buffer_bytes: usize,
    /// Legacy sessions one caller may hold.
    pub max_sessions_per_caller: usize,
    /// Where legacy Streamable HTTP sessions live (`session_store`).
    pub session_store: store::SessionStoreConfig,
    /// The route's own public identity (metadata rewrite, token exchange); `None`:
    /// the transparent relay.
    pub public_resource: Option<Arc<public_resource::PublicResource>>,
    /// The era of the route's upstream (`era`, `--upstream-era`).
    pub era: crate::config::UpstreamEra,
    /// Legacy upstream sessions in total, every route together (`max_upstream_sessions`).
    pub max_upstream_sessions: usize,
    /// Legacy upstream sessions per key (`max_upstream_sessions_per_key`).
    pub max_upstream_sessions_per_key: usize,
    /// An unused legacy upstream session is closed after this long
    /// (`upstream_session_idle_ms`).
    pub upstream_session_idle: Duration,
    /// The keys the reverse bridge seals `requestState` with (`[state]`; empty:
    /// random ones for this process).
    pub state_keys: reverse::seal::StateKeys,
    /// How long a reverse-bridge round waits for its retry (`[state] ttl_ms`).
    pub state_ttl: Duration,
    /// `ttlMs` of what the reverse bridge translates (`bridge_list_ttl_ms`).
    pub bridge_list_ttl: Duration,
    /// `cacheScope: "public"` for it (`bridge_cache_public`; default `private`).
    pub bridge_cache_public: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            max_sessions: 10_000,
            session_idle_ttl: Duration::from_secs(30 * 60),
            keepalive: Duration::from_secs(15),
            live_request_timeout: Duration::from_secs(600),
            live_request_timeout_max: Duration::from_secs(3600),
            legacy_versions: None,
            retry_pause: Duration::from_millis(250),
            max_rounds: 8,
            replay_buffer: 64,
            max_in_flight: 64,
            forwarded: ForwardedHeaders::default(),
            idle_timeout: crate::listener::DEFAULT_IDLE_TIMEOUT,
            session_binding: crate::config::SessionBinding::default(),
            cache: cache::CacheConfig::default(),
            max_live_requests: 128,
            upstream_max_body_bytes: 1024 * 1024,
            max_buffered_bytes: 4 * 1024 * 1024,
            stalled_reader_timeout: Duration::from_secs(30),
            replay_buffer_bytes: 1024 * 1024,
            max_sessions_per_caller: 1000,
            session_store: store::SessionStoreConfig::Memory,
            public_resource: None,
            era: crate::config::UpstreamEra::Auto,
            max_upstream_sessions: 1024,
            max_upstream_sessions_per_key: 8,
            upstream_session_idle: Duration::from_secs(300),
            state_keys: reverse::seal::StateKeys::default(),
            state_ttl: Duration::from_secs(300),
            bridge_list_ttl: Duration::ZERO,
            bridge_cache_public: false,
        }
    }
}

impl GatewayConfig {
    /// Defaults overridden by a config file's `[gateway]` section.
    pub fn from_section(s: &crate::config::GatewaySection) -> Self {
        let d = Self::default();
        Self {
            max_body_bytes: s.max_body_bytes.unwrap_or(d.max_body_bytes),
            allowed_origins: s.allowed_origins.clone(),
            max_sessions: s.max_sessions.unwrap_or(d.max_sessions),
            session_idle_ttl: s
                .session_idle_ttl_secs
                .map_or(d.session_idle_ttl, Duration::from_secs),
            keepalive: s.keepalive_secs.map_or(d.keepalive, Duration::from_secs),
            live_request_timeout: s
                .live_request_timeout_secs
                .map_or(d.live_request_timeout, Duration::from_secs),
            live_request_timeout_max: s
                .live_request_timeout_max_secs
                .map_or(d.live_request_timeout_max, Duration::from_secs),
            legacy_versions: s.legacy_versions.clone(),
            retry_pause: s
                .retry_pause_ms
                .map_or(d.retry_pause, Duration::from_millis),
            max_rounds: s.max_rounds.unwrap_or(d.max_rounds),
            replay_buffer: s.replay_buffer.unwrap_or(d.replay_buffer),
            max_in_flight: s.max_in_flight.unwrap_or(d.max_in_flight),
            max_live_requests: s.max_live_requests.unwrap_or(d.max_live_requests),
            upstream_max_body_bytes: s
                .upstream_max_body_bytes
                .unwrap_or(d.upstream_max_body_bytes),
            max_buffered_bytes: s.max_buffered_bytes.unwrap_or(d.max_buffered_bytes),
            stalled_reader_timeout: s
                .stalled_reader_timeout_secs
                .map_or(d.stalled_reader_timeout, Duration::from_secs),
            replay_buffer_bytes: s.replay_buffer_bytes.unwrap_or(d.replay_buffer_bytes),
            max_sessions_per_caller: s
                .max_sessions_per_caller
                .unwrap_or(d.max_sessions_per_caller),
            forwarded: s.forwarded.unwrap_or_default(),
            idle_timeout: s
                .idle_timeout_secs
                .map_or(d.idle_timeout, Duration::from_secs),
            session_binding: s.session_binding.unwrap_or(d.session_binding),
            cache: d.cache,
            session_store: d.session_store,
            public_resource: None,
            era: s.era.unwrap_or(d.era),
            max_upstream_sessions: s.max_upstream_sessions.unwrap_or(d.max_upstream_sessions),
            max_upstream_sessions_per_key: s
                .max_upstream_sessions_per_key
                .unwrap_or(d.max_upstream_sessions_per_key),
            bridge_list_ttl: s
                .bridge_list_ttl_ms
                .map_or(d.bridge_list_ttl, Duration::from_millis),
            bridge_cache_public: s.bridge_cache_public.unwrap_or(d.bridge_cache_public),
            upstream_session_idle: s
                .upstream_session_idle_ms
                .map_or(d.upstream_session_idle, Duration::from_millis),
            state_keys: d.state_keys.clone(),
            state_ttl: d.state_ttl,
        }
    }

    /// The limits of the gateway's legacy upstream session pool.
    pub fn upstream_session_limits(&self) -> upstream::legacy::PoolLimits {
        upstream::legacy::PoolLimits {
            max_sessions: self.max_upstream_sessions,
            max_per_key: self.max_upstream_sessions_per_key,
            idle: self.upstream_session_idle,
            ..upstream::legacy::PoolLimits::default()
        }
    }

    /// These settings with a route's own limits (`[[gateway.routes]]`).
    pub fn for_route(&self, r: &crate::config::RouteSection) -> Self {
        let mut c = self.clone();
        c.max_body_bytes = r.max_body_bytes.unwrap_or(c.max_body_bytes);
        c.max_sessions = r.max_sessions.unwrap_or(c.max_sessions);
        c.max_in_flight = r.max_in_flight.unwrap_or(c.max_in_flight);
        c.max_rounds = r.max_rounds.unwrap_or(c.max_rounds);
        if let Some(s) = r.live_request_timeout_secs {
            c.live_request_timeout = Duration::from_secs(s);
        }
        if let Some(ms) = r.retry_pause_ms {
            c.retry_pause = Duration::from_millis(ms);
        }
        if let Some(s) = r.session_idle_ttl_secs {
            c.session_idle_ttl = Duration::from_secs(s);
        }
        c.era = r.era.unwrap_or(c.era);
        c
    }

    /// Reads `[gateway] session_store` (or the `--session-store` flag, which wins)
    /// with the replica settings.
    pub fn with_session_store(
        self,
        s: &crate::config::GatewaySection,
        flag: Option<&str>,
    ) -> Result<Self, String> {
        self.with_shared_store(s, flag, None)
    }

    /// [`Self::with_session_store`] with the `--advertise-url` flag too (it wins over
    /// `[gateway] advertise_url`), refused without a Redis store: only replicas
    /// sharing one forward reverse-bridge retries to each other.
    pub fn with_shared_store(
        mut self,
        s: &crate::config::GatewaySection,
        flag: Option<&str>,
        advertise_flag: Option<&str>,
    ) -> Result<Self, String> {
        let advertise = advertise_flag.or(s.advertise_url.as_deref());
        let Some(store) = flag.or(s.session_store.as_deref()) else {
            return match advertise {
                Some(_) => Err(ADVERTISE_NEEDS_REDIS.into()),
                None => Ok(self),
            };
        };
        let mut parsed = store::SessionStoreConfig::parse(
            store,
            s.replica_id.as_deref(),
            s.session_key_prefix.as_deref(),
            s.upstream_lease_ms.map(Duration::from_millis),
            s.session_store_timeout_ms.map(Duration::from_millis),
            s.session_record_format.as_deref(),
        )?;
        match &mut parsed {
            store::SessionStoreConfig::Redis(r) => {
                store::redis::client::check_url(&r.url)?;
                if let Some(url) = advertise {
                    store::check_advertise_url(url)?;
                    r.advertise_url = Some(url.trim_end_matches('/').to_owned());
                }
            }
            store::SessionStoreConfig::Memory if advertise.is_some() => {
                return Err(ADVERTISE_NEEDS_REDIS.into());
            }
            store::SessionStoreConfig::Memory => {}
        }
        self.session_store = parsed;
        Ok(self)
    }

    /// Defaults overridden by a config file's `[gateway]` and `[cache]` sections.
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            cache: cache::CacheConfig::from_section(&c.cache),
            state_keys: reverse::seal::StateKeys::from_section(&c.state),
            state_ttl: Duration::from_millis(c.state.ttl_ms),
            ..Self::from_section(&c.gateway)
        }
    }
}

/// One route: an MCP endpoint path and everything that serves it.
#[derive(Debug)]
pub struct Route {
    /// The endpoint path (`/mcp`, `/notes/mcp`): the `route` label of its metrics.
    path: Arc<str>,
    /// The gateway settings with this route's limits.
    config: GatewayConfig,
    /// Its upstream's instances.
    upstream: Arc<UpstreamPool>,
    /// Its legacy Streamable HTTP sessions.
    legacy: store::memory::Sessions,
    /// Its legacy Streamable HTTP sessions in Redis (shared by the replicas), when
    /// `session_store` names Redis.
    redis: Option<Arc<store::redis::RedisSessions>>,
    /// Its HTTP+SSE (2024-11-05) sessions.
    sse: Arc<http_sse::SseSessions>,
    /// Its response cache (keys carry the route).
    cache: Arc<cache::ResponseCache>,
    /// Metrics, report and readiness, filled for this route.
    telemetry: Arc<telemetry::Telemetry>,
    /// Where its upstream is for the era probe (the first instance).
    era_target: upstream::era::Target,
    /// The gateway's remembered upstream eras (shared by the routes).
    eras: Arc<upstream::era::EraProber>,
    /// The gateway's legacy upstream sessions (shared by the routes: one total bound).
    upstream_sessions: Arc<upstream::legacy::SessionPool>,
    /// The gateway's reverse bridge (shared by the routes).
    reverse: Arc<reverse::Bridge>,
}

impl Route {
    /// The era of the upstream as far as it is known: `modern` when configured so,
    /// else what was probed and is still remembered (`None`: not probed yet).
    pub fn upstream_era(&self) -> Option<upstream::era::Era> {
        match self.config.era {
            crate::config::UpstreamEra::Modern => Some(upstream::era::Era::Modern),
            _ => self.eras.cached(&self.era_target),
        }
    }

    /// The era to act on now, without waiting: `modern` when configured so, else the
    /// remembered answer even when stale (a stale one is refreshed in the background).
    /// `None` under `auto` until something probed: the readiness prober, or an
    /// answer the legacy way to a `server/discover`, the translating path's or a
    /// modern host's (`passthrough`).
    pub fn upstream_era_now(&self) -> Option<upstream::era::Era> {
        if self.config.era == crate::config::UpstreamEra::Modern {
            return Some(upstream::era::Era::Modern);
        }
        if !self.eras.any_legacy() {
            // Nothing legacy was ever seen: whatever is remembered is modern (or
            // nothing is), and the request goes the modern way either way.
            return None;
        }
        let (era, fresh) = self.eras.remembered(&self.era_target)?;
        if !fresh {
            self.eras
                .refresh_in_background(&self.era_target, self.config.era);
        }
        Some(era)
    }

    /// The era of the upstream, probed now if it is not known (`on_behalf`: the
    /// credentials of the host request that needs it, for an upstream that wants some).
    pub async fn resolve_era(
        &self,
        on_behalf: upstream::OnBehalf<'_>,
    ) -> Result<upstream::era::Era, upstream::era::EraError> {
        let era = self
            .eras
            .era(&self.era_target, self.config.era, on_behalf)
            .await;
        if let Ok(e) = &era {
            self.telemetry.metrics().upstream_era(&self.path, Some(*e));
            let named = e.is_legacy().then(|| e.describe());
            self.telemetry.report().upstream(&self.path, named);
        }
        era
    }

    /// A cached era was contradicted by what the upstream just did (see
    /// [`upstream::era::evidence`]): forget it, so the next use probes again.
    pub fn refute_era(&self, observed: upstream::era::Era) -> bool {
        self.eras.refute(&self.era_target, observed)
    }

    /// Probes the upstream's era again in the background (at most one such probe).
    pub fn refresh_era(&self) {
        self.eras
            .refresh_in_background(&self.era_target, self.config.era);
    }

    /// Where the upstream is, for the era probe and for legacy upstream sessions.
    pub fn era_target(&self) -> &upstream::era::Target {
        &self.era_target
    }

    /// The gateway's legacy upstream sessions.
    pub fn upstream_sessions(&self) -> &Arc<upstream::legacy::SessionPool> {
        &self.upstream_sessions
    }

    /// The endpoint path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The upstream's instances.
    pub fn upstream(&self) -> &Arc<UpstreamPool> {
        &self.upstream
    }

    /// One upstream exchange of a legacy session: the route's upstream stack, the
    /// response cache's layer over the pool's failover over the transport. Every
    /// legacy driver reaches the upstream through here.
    pub(crate) async fn exchange(
        &self,
        role: &dualera_adapters::UpstreamRole,
        request: &upstream::Outbound,
        on_behalf: upstream::OnBehalf<'_>,
        params: &[(String, String)],
    ) -> Result<upstream::Exchange, upstream::UpstreamError> {
        let exchange = cache::legacy::exchange(
            &self.cache,
            &self.upstream,
            role,
            request,
            on_behalf,
            params,
        )
        .await;
        // The translating path's own `server/discover` is the modern request
        // `basic/versioning.mdx` starts era detection with: answered the legacy way,
        // it sends the era probe on (in the background; this host request fails as
        // it would have).
        let id = match request.message() {
            dualera_adapters::Message::Request(r) if r.method == "server/discover" => r.id.clone(),
            _ => return exchange,
        };
        if self.config.era == crate::config::UpstreamEra::Modern {
            return exchange;
        }
        let (eras, target, setting) = (self.eras.clone(), self.era_target.clone(), self.config.era);
        match exchange {
            Err(e) => {
                if let Some(seen) = upstream::era::discover_answer_evidence(Err(&e), &id) {
                    eras.suspect(&target, setting, seen);
                }
                Err(e)
            }
            Ok(ex) => Ok(ex.inspect(move |m| {
                if let dualera_adapters::Message::Response(r) = m {
                    if let Some(seen) = upstream::era::discover_answer_evidence(Ok(r), &id) {
                        eras.suspect(&target, setting, seen);
                    }
                }
            })),
        }
    }
}

/// A route's sessions in Redis when `session_store` names it: every route's keys under
/// the configured prefix, the routes other than `/mcp` each under a prefix of its own
/// (a session id is only ever found on the route that minted it).
/// Why `advertise_url` alone is refused.
const ADVERTISE_NEEDS_REDIS: &str =
    "advertise_url (--advertise-url) needs a Redis session_store (redis:// or redis+unix://): only replicas sharing one forward retries to each other";

fn redis_sessions(path: &str, config: &GatewayConfig) -> Option<Arc<store::redis::RedisSessions>> {
    let store::SessionStoreConfig::Redis(r) = &config.session_store else {
        return None;
    };
    let mut r = r.clone();
    if path != routes::DEFAULT_ROUTE {
        r.key_prefix = format!("{}{path}:", r.key_prefix);
    }
    match store::redis::RedisSessions::new(&r, config) {
        Ok(s) => Some(s),
        Err(e) => {
            // The URL was checked when the config was read.
            tracing::error!(error = %e, route = %path, "session store cannot be opened");
            None
        }
    }
}

/// Where a route's upstream is for the era probe: its first instance.
fn era_target(pool: &UpstreamPool, config: &GatewayConfig) -> upstream::era::Target {
    match pool.first() {
        Upstream::Http(h) => upstream::era::Target::Http {
            client: Box::new(h.upstream_client().clone()),
            uri: h.uri().clone(),
            max_message: config.max_body_bytes,
        },
        Upstream::Stdio(s) => {
            let (program, args) = s.command();
            upstream::era::Target::Stdio {
                program: program.to_owned(),
                args: args.to_vec(),
                max_message: config.max_body_bytes,
            }
        }
    }
}

/// What one route is built from.
#[derive(Debug)]
pub struct RouteSpec {
    /// The endpoint path (checked: [`routes::check_path`]).
    pub path: String,
    /// The upstream's instances.
    pub upstream: UpstreamPool,
    /// The gateway settings with the route's own limits.
    pub config: GatewayConfig,
}

/// Every route, and the table that finds one by request path.
#[derive(Debug)]
struct RouteTable {
    list: Vec<Arc<Route>>,
    paths: routes::Paths,
}

/// A cheaply clonable gateway handle: the routes, and the one route this handle
/// stands for (`/mcp`, or the first route, at the top; [`Gateway::route`] gives the
/// others). A request is served by its route alone: the handlers take the
/// [`Route`], never the whole gateway.
#[derive(Clone, Debug)]
pub struct Gateway {
    route: Arc<Route>,
    table: Arc<RouteTable>,
}

/// What the gateway keeps for one accepted connection, from the listener's hook
/// until the connection (or its WebSocket) ends.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Counted in `dualera_connections_open{listener="gateway"}` while it lives.
    _open: telemetry::OpenConnection,
    /// The modern client identified on this connection, for the report.
    telemetry: telemetry::ConnectionTelemetry,
}

/// The gateway listener's [`ConnHook`].
struct Connections(telemetry::ConnectionsOpen);

impl ConnHook for Connections {
    type State = Connection;
    fn opened(&self, info: &ConnInfo) -> Connection {
        Connection {
            _open: self.0.opened(info),
            telemetry: telemetry::ConnectionTelemetry::default(),
        }
    }
}

impl Gateway {
    /// A gateway in front of `upstream` (the route `/mcp`), its migration report in
    /// memory.
    pub fn new(upstream: Upstream, config: GatewayConfig) -> Self {
        let report = report::Report::in_memory(report::ReportConfig::default().max_hosts);
        Self::with_report(upstream, config, report)
    }

    /// A gateway in front of `upstream` (the route `/mcp`) that keeps its migration
    /// report in `report` ([`report::Report::open`]).
    pub fn with_report(upstream: Upstream, config: GatewayConfig, report: report::Report) -> Self {
        let spec = RouteSpec {
            path: routes::DEFAULT_ROUTE.to_owned(),
            upstream: UpstreamPool::single(upstream),
            config,
        };
        Self::assemble(vec![spec], routes::Paths::default_route(), report)
    }

    /// A gateway serving these routes (in this order; the first `/mcp`, if any, is
    /// the one `--stdio` serves, else the first), its report in `report`.
    pub fn with_routes(specs: Vec<RouteSpec>, report: report::Report) -> Result<Self, RouteError> {
        let paths = routes::Paths::build(specs.iter().map(|s| s.path.as_str()))?;
        Ok(Self::assemble(specs, paths, report))
    }

    fn assemble(specs: Vec<RouteSpec>, paths: routes::Paths, report: report::Report) -> Self {
        let report = Arc::new(report);
        // One pool and one era memory for the gateway: the total bound spans routes,
        // and an upstream behind two routes is probed once.
        let eras = Arc::new(upstream::era::EraProber::default());
        let upstream_sessions = upstream::legacy::SessionPool::new(
            specs
                .first()
                .map(|s| s.config.upstream_session_limits())
                .unwrap_or_default(),
        );
        let reverse = Arc::new(
            specs
                .first()
                .map(|s| reverse::Bridge::new(&s.config.state_keys, s.config.state_ttl))
                .unwrap_or_else(|| {
                    reverse::Bridge::new(
                        &reverse::seal::StateKeys::default(),
                        Duration::from_secs(300),
                    )
                }),
        );
        /// A route's parts that the shared metrics and readiness are built from.
        struct Parts {
            path: Arc<str>,
            upstream: Arc<UpstreamPool>,
            cache: Arc<cache::ResponseCache>,
            redis: Option<Arc<store::redis::RedisSessions>>,
            config: GatewayConfig,
        }
        let built: Vec<Parts> = specs
            .into_iter()
            .map(|spec| {
                let path: Arc<str> = Arc::from(spec.path);
                let upstream = Arc::new(spec.upstream);
                let cache = Arc::new(cache::ResponseCache::new(spec.config.cache.clone(), &path));
                cache.attach(upstream.clone());
                let redis = redis_sessions(&path, &spec.config);
                Parts {
                    path,
                    upstream,
                    cache,
                    redis,
                    config: spec.config,
                }
            })
            .collect();
        let mut metrics = metrics::Metrics::new(
            built.iter().map(|b| b.cache.clone()).collect(),
            built
                .iter()
                .map(|b| (b.path.clone(), b.upstream.clone()))
                .collect(),
            report.clone(),
        )
        .with_upstream_sessions(upstream_sessions.clone())
        .with_collector(Box::new(reverse::stats::Collector(reverse.clone())));
        if let Some(shared) = built.iter().find_map(|b| b.redis.clone()) {
            // One store for every route: its counters once.
            metrics = metrics.with_collector(Box::new(store::StoreCollector(shared)));
        }
        let metrics = Arc::new(metrics);
        let readiness = Arc::new(readiness::Readiness::new(
            built.iter().map(|b| b.path.clone()).collect(),
        ));
        if let Some(shared) = built.iter().find_map(|b| b.redis.clone()) {
            // One store for every route (one `session_store`): its line in /readyz.
            readiness.watch_store(move || shared.ready());
        }
        let list: Vec<Arc<Route>> = built
            .into_iter()
            .map(|b| {
                Arc::new(Route {
                    telemetry: Arc::new(telemetry::Telemetry::new(
                        b.path.clone(),
                        metrics.clone(),
                        report.clone(),
                        readiness.clone(),
                    )),
                    legacy: store::memory::Sessions::new(&b.config),
                    redis: b.redis,
                    sse: Arc::default(),
                    era_target: era_target(&b.upstream, &b.config),
                    eras: eras.clone(),
                    upstream_sessions: upstream_sessions.clone(),
                    reverse: reverse.clone(),
                    path: b.path,
                    config: b.config,
                    upstream: b.upstream,
                    cache: b.cache,
                })
            })
            .collect();
        let first = list
            .iter()
            .position(|r| &*r.path == routes::DEFAULT_ROUTE)
            .unwrap_or(0);
        Self {
            route: list[first].clone(),
            table: Arc::new(RouteTable { list, paths }),
        }
    }

    /// The handle of the route at `path`, if there is one.
    pub fn route(&self, path: &str) -> Option<Gateway> {
        let (i, routes::Endpoint::Mcp) = self.table.paths.find(path)? else {
            return None;
        };
        Some(self.on(i))
    }

    /// The endpoint path of this handle's route.
    pub fn path(&self) -> &str {
        self.route.path()
    }

    /// Every route, in configuration order.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.table.list.iter()
    }

    /// The handle of route `i` (an index of the table).
    fn on(&self, i: usize) -> Gateway {
        Gateway {
            route: self.table.list[i].clone(),
            table: self.table.clone(),
        }
    }

    /// The gateway's metrics, migration report and readiness (filled for this
    /// handle's route).
    pub fn telemetry(&self) -> &Arc<telemetry::Telemetry> {
        &self.route.telemetry
    }

    /// Writes the migration report to its file, if it has one (also done every few
    /// seconds while serving, and when serving stops).
    pub fn flush_report(&self) {
        if let Err(e) = self.telemetry().report().flush() {
            tracing::warn!(error = %e, "migration report not saved");
        }
    }

    /// Whether the shared session store is reachable (`None` when sessions are kept
    /// in memory): what a readiness probe reports.
    pub fn session_store_ready(&self) -> Option<bool> {
        self.route.redis.as_ref().map(|s| s.ready())
    }

    /// This replica's name in the shared session store, if one is used.
    pub fn replica_id(&self) -> Option<&str> {
        self.route.redis.as_ref().map(|s| s.replica())
    }

    /// This handle's route's response cache (its counters:
    /// [`cache::ResponseCache::stats`]).
    pub fn cache(&self) -> &Arc<cache::ResponseCache> {
        &self.route.cache
    }

    /// Serves on a bound listener until `shutdown` resolves (default listener bounds,
    /// no TLS).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let config = ListenerConfig {
            grace: Duration::from_secs(5),
            ..ListenerConfig::default()
        };
        self.serve_with(listener, config, shutdown).await
    }

    /// Serves on a bound listener with these bounds (and TLS) until `shutdown`
    /// resolves; then ends every legacy session, so their streams close and the
    /// connections can finish.
    pub async fn serve_with(
        self,
        listener: TcpListener,
        config: ListenerConfig,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let reapers: Vec<_> = (0..self.table.list.len())
            .map(|i| tokio::spawn(store::memory::reap(self.table.list[i].clone())))
            .collect();
        for route in 0..self.table.list.len() {
            let on = &self.table.list[route];
            if let Some(shared) = &on.redis {
                shared.start(on);
                shared.advertise();
            }
        }
        let flusher = tokio::spawn(report::flush_loop(self.telemetry().report().clone()));
        let upstream_sessions = self.route.upstream_sessions.clone();
        let sweeper = upstream_sessions.start();
        let hook = Connections(telemetry::ConnectionsOpen::new(self.telemetry(), "gateway"));
        let gw = self.clone();
        let service = move |req: Request<RequestBody>, conn: &ConnInfo, state: &Arc<Connection>| {
            let gw = gw.clone();
            let conn = conn.clone();
            let state = state.clone();
            async move { gw.dispatch(&conn, &state, req).await }
        };
        let sessions = self.clone();
        crate::listener::serve_hooked(listener, config, hook, service, async move {
            shutdown.await;
            info!("gateway shutting down");
            for r in &reapers {
                r.abort();
            }
            flusher.abort();
            sweeper.abort();
            upstream_sessions.close_all().await;
            for route in sessions.routes() {
                route.cache.stop_listening();
                let stats = route.cache.stats();
                info!(
                    route = %route.path,
                    hits = stats.hits,
                    misses = stats.misses,
                    coalesced = stats.coalesced,
                    evictions = stats.evictions,
                    invalidations = stats.invalidations,
                    stale_served = stats.stale_served,
                    "cache counters"
                );
                route.legacy.close_all();
                if let Some(shared) = &route.redis {
                    shared.store_all_unstored(route).await;
                    shared.stop();
                }
                route.sse.close_all();
            }
        })
        .await?;
        let gw = self.clone();
        let _ = tokio::task::spawn_blocking(move || gw.flush_report()).await;
        Ok(())
    }

    /// Serves one legacy session over a byte stream (the stdio host bridge): one
    /// JSON-RPC message per line each way. Returns at EOF, after cancelling what the
    /// session still had in flight upstream.
    pub async fn serve_stdio<R, W>(self, mut reader: R, writer: W) -> std::io::Result<()>
    where
        R: tokio::io::AsyncBufRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // Lines are read here, not by the session task: a line read cut short by a
        // cancel would lose its start.
        let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
        let wire = wire::Stdio::new(in_rx, writer);
        let session = tokio::spawn(pipe::run_session(
            self.route.clone(),
            wire,
            None,
            Arc::default(),
        ));
        let flusher = tokio::spawn(report::flush_loop(self.telemetry().report().clone()));
        let flusher = flusher.abort_handle();
        let _flusher = scopeguard(move || flusher.abort());
        let limit = self.route.config.max_body_bytes;
        let mut buf = Vec::new();
        while let Some(line) =
            crate::framing::read_bounded_line(&mut reader, &mut buf, limit).await?
        {
            if line.is_err() {
                tracing::warn!(limit, "over-long line from the host dropped");
                continue;
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if in_tx.send(std::mem::take(&mut buf)).await.is_err() {
                break;
            }
        }
        drop(in_tx);
        let _ = session.await;
        self.route.cache.stop_listening();
        let gw = self.clone();
        let _ = tokio::task::spawn_blocking(move || gw.flush_report()).await;
        Ok(())
    }

    async fn dispatch(
        &self,
        conn: &ConnInfo,
        connection: &Connection,
        req: Request<RequestBody>,
    ) -> Response<GatewayBody> {
        let loopback = conn.local.ip().is_loopback();
        if let Some(refused) = guard::refusal(&req, loopback, &self.route.config.allowed_origins) {
            return text(StatusCode::FORBIDDEN, refused.text());
        }
        let Some((i, endpoint)) = self.table.paths.find(req.uri().path()) else {
            return not_found(&self.table.paths);
        };
        let gw = &self.table.list[i];
        // JSON-RPC endpoints take JSON only: a CORS "simple request" (text/plain, form,
        // multipart) never reaches a session or the upstream. The metadata paths are
        // relayed as they are.
        let rpc_path = matches!(endpoint, routes::Endpoint::Mcp | routes::Endpoint::Messages);
        if rpc_path && req.method() == Method::POST && !guard::is_json(req.headers()) {
            return text(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "POST bodies must be Content-Type: application/json\n",
            );
        }
        let Some(public) = &gw.config.public_resource else {
            return serve_endpoint(gw, connection, endpoint, req, conn).await;
        };
        if endpoint == routes::Endpoint::Metadata {
            let relayed = Box::pin(auth::relay_metadata(gw, req)).await;
            return Box::pin(public.metadata(relayed)).await;
        }
        match Box::pin(public.prepare(req)).await {
            Ok(req) => public.finish(serve_endpoint(gw, connection, endpoint, req, conn).await),
            Err(refused) => refused,
        }
    }
}

/// Serves a request on this route's endpoint `endpoint`.
async fn serve_endpoint(
    gw: &Arc<Route>,
    connection: &Connection,
    endpoint: routes::Endpoint,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Response<GatewayBody> {
    let fwd = Forwarded::new(gw.config.forwarded, conn, &req);
    // Every branch but pass-through is boxed: a request's future is as large as
    // the largest branch it could take, and hyper moves it (a memcpy of all of it)
    // as it starts serving it. Inline, the legacy handler made every request,
    // pass-through included, copy some 20 KB (callgrind, `bench --profile`).
    match endpoint {
        routes::Endpoint::Mcp => {}
        routes::Endpoint::WebSocket => return Box::pin(websocket::upgrade(gw, req, fwd)).await,
        routes::Endpoint::Sse => return http_sse::open(gw, &req, fwd),
        routes::Endpoint::Messages => return Box::pin(http_sse::post(gw, req)).await,
        routes::Endpoint::Metadata => return Box::pin(auth::relay_metadata(gw, req)).await,
    }
    let h = req.headers();
    // Without a session, any MCP-Protocol-Version header that is not a legacy
    // revision goes upstream: a modern one to be served, an unknown one (e.g.
    // `v999.0.0`) to be refused by the upstream with `-32022`, the request id and
    // the versions it supports, as the modern era requires.
    let modern = h
        .get(&MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| is_modern_or_later(v) || !ProtocolVersion::LEGACY.contains(&v))
        && !h.contains_key(&MCP_SESSION_ID);
    if modern {
        let legacy = match gw.config.era {
            // The common case answers without a future of its own.
            crate::config::UpstreamEra::Auto | crate::config::UpstreamEra::Modern => legacy_now(gw),
            crate::config::UpstreamEra::Legacy => Box::pin(legacy_upstream(gw, &req, &fwd)).await,
        };
        match legacy {
            // A modern host in front of a legacy server: the reverse bridge.
            Some(transport) => {
                Box::pin(reverse::handle(
                    gw,
                    &connection.telemetry,
                    req,
                    transport,
                    fwd,
                ))
                .await
            }
            None => passthrough::forward(gw, &connection.telemetry, req, &fwd).await,
        }
    } else if legacy_upstream_http(gw, &req, &fwd).await {
        // A legacy host in front of a legacy Streamable HTTP upstream: nothing to
        // translate, the session is theirs.
        Box::pin(passthrough::forward_legacy(gw, req, &fwd)).await
    } else {
        legacy_http::handle(gw, req, fwd).await
    }
}

/// Whether the route's upstream is a legacy server over Streamable HTTP. Under `auto`
/// an upstream whose era is not known yet is taken for modern (the translating path,
/// as before eras existed): no host request waits for a probe, and a modern upstream
/// sees no request it would not have seen. A probe that fails leaves the request to
/// the translating path too.
async fn legacy_upstream_http(gw: &Route, req: &Request<RequestBody>, fwd: &Forwarded) -> bool {
    let transport = match gw.config.era {
        crate::config::UpstreamEra::Legacy => Box::pin(legacy_upstream(gw, req, fwd)).await,
        _ => legacy_now(gw),
    };
    transport == Some(upstream::legacy::LegacyTransport::StreamableHttp)
}

/// The legacy transport of the route's upstream as known now, without waiting (`auto`
/// and `modern`; see [`legacy_upstream`]).
fn legacy_now(gw: &Route) -> Option<upstream::legacy::LegacyTransport> {
    match gw.upstream_era_now() {
        Some(upstream::era::Era::Legacy(transport)) => Some(transport),
        _ => None,
    }
}

/// The transport of the route's upstream when it is a legacy server, as far as it is
/// known without holding a host request under `auto` (see [`legacy_upstream_http`]).
async fn legacy_upstream(
    gw: &Route,
    req: &Request<RequestBody>,
    fwd: &Forwarded,
) -> Option<upstream::legacy::LegacyTransport> {
    use upstream::era::Era;
    let era = match gw.config.era {
        crate::config::UpstreamEra::Modern => return None,
        // Configured legacy: only the transport is found out (once, remembered).
        crate::config::UpstreamEra::Legacy => {
            let on_behalf = OnBehalf {
                authorization: req.headers().get(header::AUTHORIZATION),
                forwarded: Some(fwd),
                trace: None,
            };
            match gw.resolve_era(on_behalf).await {
                Ok(era) => Some(era),
                Err(e) => {
                    tracing::debug!(route = %gw.path, error = %e, "legacy upstream transport unknown");
                    None
                }
            }
        }
        // `auto` never holds a host request for a probe: what is known now.
        crate::config::UpstreamEra::Auto => gw.upstream_era_now(),
    };
    match era {
        Some(Era::Legacy(transport)) => Some(transport),
        _ => None,
    }
}

/// The 404 for a path no route answers, naming the routes.
fn not_found(paths: &routes::Paths) -> Response<GatewayBody> {
    let msg = if paths.listing().contains(',') {
        format!("not found; the MCP endpoints are {}\n", paths.listing())
    } else {
        format!("not found; the MCP endpoint is {}\n", paths.listing())
    };
    let mut r = text(StatusCode::NOT_FOUND, "");
    *r.body_mut() = body::full(msg);
    r
}

/// Runs `f` when dropped (also when the future holding it is cancelled).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, msg: &'static str) -> Response<GatewayBody> {
    let mut r = Response::new(body::full(msg));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}
