//! The gateway: one endpoint for both eras. A modern request (2026-07-28 header, no
//! session) is proxied untouched; legacy traffic (an `initialize`, or a known session)
//! is driven through the sans-IO session machine of `dualera-adapters`.
//!
//! ```text
//!   POST /mcp ─► origin/host guard ─► era? ─ modern ─► passthrough::forward ─► upstream
//!                                          └ legacy ─► legacy_http ─► Session (adapters)
//!                                                              ▲           │ commands
//!                                                              └─ upstream::exchange
//! ```

mod auth;
pub mod cache;
pub mod http_sse;
mod legacy_http;
pub mod passthrough;
mod pipe;
mod replicas;
pub mod session_store;
pub mod sse;
pub mod upstream;
pub mod websocket;

use crate::body::{self, GatewayBody};
use crate::guard;
use dualera_adapters::version::is_modern_or_later;
use dualera_adapters::ProtocolVersion;
use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::{debug, info, Instrument};
pub use upstream::{Denial, HttpUpstream, StdioUpstream, Upstream, UpstreamError};

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
    /// Pause before retrying a round that carried only `requestState`.
    pub retry_pause: Duration,
    /// Most MRTR rounds per legacy request.
    pub max_rounds: u32,
    /// Events kept per stream for `Last-Event-ID` resumption.
    pub replay_buffer: usize,
    /// Requests in flight per legacy session.
    pub max_in_flight: usize,
    /// What binds a legacy session to its caller.
    pub session_binding: crate::config::SessionBinding,
    /// The response cache (`[cache]`).
    pub cache: cache::CacheConfig,
    /// Where legacy Streamable HTTP sessions live (`session_store`).
    pub session_store: session_store::SessionStoreConfig,
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
            retry_pause: Duration::from_millis(250),
            max_rounds: 8,
            replay_buffer: 64,
            max_in_flight: 64,
            session_binding: crate::config::SessionBinding::default(),
            cache: cache::CacheConfig::default(),
            session_store: session_store::SessionStoreConfig::Memory,
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
            retry_pause: s
                .retry_pause_ms
                .map_or(d.retry_pause, Duration::from_millis),
            max_rounds: s.max_rounds.unwrap_or(d.max_rounds),
            replay_buffer: s.replay_buffer.unwrap_or(d.replay_buffer),
            max_in_flight: s.max_in_flight.unwrap_or(d.max_in_flight),
            session_binding: s.session_binding.unwrap_or(d.session_binding),
            cache: d.cache,
            session_store: d.session_store,
        }
    }

    /// Reads `[gateway] session_store` (or the `--session-store` flag, which wins)
    /// with the replica settings.
    pub fn with_session_store(
        mut self,
        s: &crate::config::GatewaySection,
        flag: Option<&str>,
    ) -> Result<Self, String> {
        let Some(store) = flag.or(s.session_store.as_deref()) else {
            return Ok(self);
        };
        let parsed = session_store::SessionStoreConfig::parse(
            store,
            s.replica_id.as_deref(),
            s.session_key_prefix.as_deref(),
            s.upstream_lease_ms.map(Duration::from_millis),
            s.session_store_timeout_ms.map(Duration::from_millis),
        )?;
        if let session_store::SessionStoreConfig::Redis(r) = &parsed {
            replicas::redis::check_url(&r.url)?;
        }
        self.session_store = parsed;
        Ok(self)
    }

    /// Defaults overridden by a config file's `[gateway]` and `[cache]` sections.
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            cache: cache::CacheConfig::from_section(&c.cache),
            ..Self::from_section(&c.gateway)
        }
    }
}

/// A cheaply clonable gateway handle.
#[derive(Clone, Debug)]
pub struct Gateway {
    config: Arc<GatewayConfig>,
    /// Shared: a handle is cloned per request, and the HTTP upstream's fields (URI,
    /// authority, pooled client) would otherwise be copied each time.
    upstream: Arc<Upstream>,
    legacy: Arc<legacy_http::Sessions>,
    /// Legacy Streamable HTTP sessions shared through Redis, when configured.
    shared: Option<Arc<replicas::SharedSessions>>,
    sse: Arc<http_sse::SseSessions>,
    cache: Arc<cache::ResponseCache>,
}

impl Gateway {
    /// A gateway in front of `upstream`.
    pub fn new(upstream: Upstream, config: GatewayConfig) -> Self {
        let upstream = Arc::new(upstream);
        let cache = Arc::new(cache::ResponseCache::new(
            config.cache.clone(),
            crate::server::http::ENDPOINT,
        ));
        cache.attach(upstream.clone());
        let shared = match &config.session_store {
            session_store::SessionStoreConfig::Memory => None,
            session_store::SessionStoreConfig::Redis(r) => {
                match replicas::SharedSessions::new(r, &config) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        // The URL was checked when the config was read.
                        tracing::error!(error = %e, "session store cannot be opened");
                        None
                    }
                }
            }
        };
        Self {
            legacy: Arc::new(legacy_http::Sessions::new(&config)),
            shared,
            sse: Arc::default(),
            config: Arc::new(config),
            upstream,
            cache,
        }
    }

    /// Whether the shared session store is reachable (`None` when sessions are kept
    /// in memory): what a readiness probe reports.
    pub fn session_store_ready(&self) -> Option<bool> {
        self.shared.as_ref().map(|s| s.ready())
    }

    /// This replica's name in the shared session store, if one is used.
    pub fn replica_id(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.replica())
    }

    /// The response cache (its counters: [`cache::ResponseCache::stats`]).
    pub fn cache(&self) -> &Arc<cache::ResponseCache> {
        &self.cache
    }

    /// Serves on a bound listener until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let loopback = listener.local_addr()?.ip().is_loopback();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let reaper = tokio::spawn(legacy_http::reap(self.clone()));
        if let Some(shared) = &self.shared {
            shared.start(&self);
        }
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    while connections.try_join_next().is_some() {}
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            debug!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let gw = self.clone();
                    let svc = service_fn(move |req| {
                        let gw = gw.clone();
                        async move { Ok::<_, Infallible>(gw.route(loopback, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    let mut stop = stop_rx.clone();
                    connections.spawn(
                        async move {
                            tokio::pin!(conn);
                            tokio::select! {
                                res = conn.as_mut() => {
                                    if let Err(e) = res {
                                        debug!(error = %e, "connection ended with an error");
                                    }
                                    return;
                                }
                                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                            }
                            let _ = conn.await;
                        }
                        .instrument(tracing::debug_span!("connection", transport = "http", %peer)),
                    );
                }
                () = &mut shutdown => break,
            }
        }
        info!("gateway shutting down");
        reaper.abort();
        self.cache.stop_listening();
        let stats = self.cache.stats();
        info!(
            hits = stats.hits,
            misses = stats.misses,
            coalesced = stats.coalesced,
            evictions = stats.evictions,
            invalidations = stats.invalidations,
            stale_served = stats.stale_served,
            "cache counters"
        );
        self.legacy.close_all();
        if let Some(shared) = &self.shared {
            shared.stop();
        }
        self.sse.close_all();
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        Ok(())
    }

    /// Serves one legacy session over a byte stream (the stdio host bridge): one
    /// JSON-RPC message per line each way. Returns at EOF, after cancelling what the
    /// session still had in flight upstream.
    pub async fn serve_stdio<R, W>(self, mut reader: R, mut writer: W) -> std::io::Result<()>
    where
        R: tokio::io::AsyncBufRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        use tokio::io::AsyncWriteExt;
        let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
        let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(256);
        let writer_task = tokio::spawn(async move {
            while let Some(mut line) = out_rx.recv().await {
                line.push(b'\n');
                if writer.write_all(&line).await.is_err() || writer.flush().await.is_err() {
                    break;
                }
            }
        });
        let session = tokio::spawn(pipe::run_session(
            self.clone(),
            in_rx,
            out_tx,
            "stdio",
            None,
        ));
        let limit = self.config.max_body_bytes;
        let mut buf = Vec::new();
        while let Some(line) =
            crate::server::stdio::read_bounded_line(&mut reader, &mut buf, limit).await?
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
        self.cache.stop_listening();
        let _ = writer_task.await;
        Ok(())
    }

    async fn route(&self, loopback: bool, req: Request<Incoming>) -> Response<GatewayBody> {
        let h = req.headers();
        if let Some(origin) = h.get(header::ORIGIN) {
            if !origin
                .to_str()
                .is_ok_and(|o| guard::origin_allowed(o, &self.config.allowed_origins))
            {
                return text(StatusCode::FORBIDDEN, "Origin not allowed\n");
            }
        }
        if loopback
            && !h
                .get(header::HOST)
                .is_none_or(|v| v.to_str().is_ok_and(guard::host_allowed_on_loopback))
        {
            return text(StatusCode::FORBIDDEN, "Host not allowed\n");
        }
        match req.uri().path() {
            crate::server::http::ENDPOINT => {}
            websocket::PATH => return websocket::upgrade(self, req).await,
            http_sse::SSE_PATH => return http_sse::open(self, &req),
            http_sse::MESSAGES_PATH => return http_sse::post(self, req).await,
            p if auth::is_metadata_path(p) => return auth::relay_metadata(self, req).await,
            _ => {
                return text(
                    StatusCode::NOT_FOUND,
                    "not found; the MCP endpoint is /mcp\n",
                )
            }
        }
        let h = req.headers();
        // Without a session, any MCP-Protocol-Version header that is not a legacy
        // revision goes upstream: a modern one to be served, an unknown one (e.g.
        // `v999.0.0`) to be refused by the upstream with `-32022`, the request id and
        // the versions it supports, as the modern era requires.
        let modern = h
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| is_modern_or_later(v) || !ProtocolVersion::LEGACY.contains(&v))
            && !h.contains_key("mcp-session-id");
        if modern {
            passthrough::forward(self, req).await
        } else {
            legacy_http::handle(self, req).await
        }
    }
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
