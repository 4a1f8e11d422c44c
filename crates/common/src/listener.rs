//! The one HTTP listener every program here serves on (the modern server, the
//! gateway, the gateway's admin endpoints): it owns the accept
//! loop and each connection's life, so that hostile or sloppy peers are bounded the
//! same way everywhere.
//!
//! - **Connection cap with back-pressure**: a permit is taken *before* `accept`, so at
//!   `max_connections` the loop stops accepting (the kernel's backlog holds the rest)
//!   and resumes as soon as a connection ends. An upgraded connection (WebSocket)
//!   keeps its permit until it closes.
//! - **Header read timeout**: a connection must deliver a request's head (and, over
//!   TLS, finish its handshake) within `header_read_timeout` from its first byte (or
//!   from being accepted); otherwise it is dropped.
//! - **Body deadline** ([`crate::inbound`]): a request body must keep coming (no gap
//!   over `body_idle_timeout`) and be complete within `body_read_timeout`, and one peer
//!   address may have only `max_slow_bodies_per_peer` slow bodies in progress;
//!   otherwise the request gets 408 and the connection is closed.
//! - **Idle timeout**: a connection with no request in progress and no bytes moving
//!   either way for `idle_timeout` is closed gracefully. A streaming response (SSE)
//!   writes keepalives, so it is never idle while it carries them.
//! - **`EMFILE`/`ENFILE`**: accept errors that mean "out of descriptors or memory" are
//!   logged once per burst (failures less than a minute apart) and backed off (10 ms
//!   doubling to 1 s); the loop keeps going.
//! - **TLS** is a transport detail: with [`ListenerConfig::tls`] every connection is a
//!   rustls session first (ALPN `h2`/`http/1.1`); the service sees the same requests.
//! - Either HTTP version, per connection (hyper-util's auto builder), with upgrades.
//! - **A hook per connection** ([`ConnHook`]): the state a service keeps for one
//!   connection is made when it is accepted and dropped when it (or the WebSocket it
//!   was upgraded to) ends — where the gateway counts open connections and remembers
//!   the client identified on a connection.
//!
//! ```text
//!  permit ─► accept ─► [TLS handshake] ─► hyper conn (h1 | h2) ─► service(req, conn)
//!    ▲                                         │ watched: head / idle deadlines
//!    └──────────── dropped when the connection (or its upgrade) ends
//! ```
//!
//! The deadlines are checked by a timer per connection, armed no further out than
//! `header_read_timeout`: a head that starts on an idle keep-alive connection is cut
//! off at most one header timeout late, and the common path never wakes anything.

use crate::body::GatewayBody;
use crate::clock::now_ms as clock;
use crate::inbound::{BodyLimits, RequestBody, SlowBodies};
use crate::outbound::{self, ConnMeter};
use crate::self_wake::SelfWakes;
use crate::tls::ServerTls;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn, Instrument};

/// Accept failures closer together than this are one burst (one log line).
const BURST_QUIET: Duration = Duration::from_secs(60);

/// Default [`ListenerConfig::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ListenerConfig::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`ListenerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;

/// How a listener treats its connections.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Time allowed to deliver a request head (and the TLS handshake), counted from the
    /// connection's acceptance or the head's first byte.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress and no traffic this long is closed.
    pub idle_timeout: Duration,
    /// Most connections open at once (upgraded ones included).
    pub max_connections: usize,
    /// Deadlines of request bodies.
    pub body: BodyLimits,
    /// Response bytes the whole process may hold unwritten before new requests get
    /// 503 ([`crate::outbound`]).
    pub max_pending_write_bytes: usize,
    /// Serve TLS with this certificate.
    pub tls: Option<Arc<ServerTls>>,
    /// How long in-flight requests may finish after shutdown begins.
    pub grace: Duration,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body: BodyLimits::default(),
            max_pending_write_bytes: outbound::DEFAULT_MAX_PENDING,
            tls: None,
            grace: Duration::from_secs(10),
        }
    }
}

impl ListenerConfig {
    /// Defaults overridden by a config section's listener keys
    /// (`header_read_timeout_secs`, `idle_timeout_secs`, `max_connections`, and the
    /// body keys in [`BodyKeys`]).
    pub fn from_keys(
        header_read_timeout_secs: Option<u64>,
        idle_timeout_secs: Option<u64>,
        max_connections: Option<usize>,
        body: BodyKeys,
    ) -> Self {
        let d = Self::default();
        let floor = Duration::from_millis(100);
        Self {
            body: BodyLimits {
                idle: body
                    .body_idle_timeout_secs
                    .map_or(d.body.idle, Duration::from_secs)
                    .max(floor),
                total: body
                    .body_read_timeout_secs
                    .map_or(d.body.total, Duration::from_secs)
                    .max(floor),
                max_slow_per_peer: body
                    .max_slow_bodies_per_peer
                    .unwrap_or(d.body.max_slow_per_peer)
                    .max(1),
            },
            max_pending_write_bytes: body
                .max_pending_write_bytes
                .unwrap_or(d.max_pending_write_bytes),
            header_read_timeout: header_read_timeout_secs
                .map_or(d.header_read_timeout, Duration::from_secs)
                .max(Duration::from_millis(100)),
            idle_timeout: idle_timeout_secs
                .map_or(d.idle_timeout, Duration::from_secs)
                .max(Duration::from_millis(100)),
            max_connections: max_connections.unwrap_or(d.max_connections).max(1),
            ..d
        }
    }

    /// The `[server]` section's listener.
    pub fn server(s: &crate::config::ServerSection) -> Self {
        Self::from_keys(
            s.header_read_timeout_secs,
            s.idle_timeout_secs,
            s.max_connections,
            BodyKeys {
                body_idle_timeout_secs: s.body_idle_timeout_secs,
                body_read_timeout_secs: s.body_read_timeout_secs,
                max_slow_bodies_per_peer: s.max_slow_bodies_per_peer,
                max_pending_write_bytes: s.max_pending_write_bytes,
            },
        )
    }

    /// The `[gateway]` section's listener.
    pub fn gateway(s: &crate::config::GatewaySection) -> Self {
        Self::from_keys(
            s.header_read_timeout_secs,
            s.idle_timeout_secs,
            s.max_connections,
            BodyKeys {
                body_idle_timeout_secs: s.body_idle_timeout_secs,
                body_read_timeout_secs: s.body_read_timeout_secs,
                max_slow_bodies_per_peer: s.max_slow_bodies_per_peer,
                max_pending_write_bytes: s.max_pending_write_bytes,
            },
        )
    }
}

/// A config section's body keys (`None`: the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyKeys {
    /// Seconds allowed between two pieces of a request body (default 10).
    pub body_idle_timeout_secs: Option<u64>,
    /// Seconds a whole request body may take (default 30).
    pub body_read_timeout_secs: Option<u64>,
    /// Slow bodies one peer address may have in progress (default 64).
    pub max_slow_bodies_per_peer: Option<usize>,
    /// Unwritten response bytes the process may hold (default 256 MiB).
    pub max_pending_write_bytes: Option<usize>,
}

/// The peer address of a request a listener handed its service.
pub fn peer_of<B>(req: &Request<B>) -> Option<std::net::IpAddr> {
    req.extensions().get::<ConnInfo>().map(|c| c.peer.ip())
}

/// What a service knows about the connection a request came on (also in each
/// request's extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's address.
    pub peer: SocketAddr,
    /// Our address.
    pub local: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

impl ConnInfo {
    /// The scheme the client used: `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

/// What a listener does for each connection besides serving its requests: the state
/// [`ConnHook::opened`] returns is handed to every request of the connection and
/// dropped when the connection ends — for an upgraded connection, when the upgrade
/// (the WebSocket) ends. A gauge of open connections is a `Drop` of that state.
pub trait ConnHook: Send + Sync + 'static {
    /// The per-connection state.
    type State: Send + Sync + 'static;
    /// A connection was accepted (before any TLS handshake).
    fn opened(&self, info: &ConnInfo) -> Self::State;
}

/// No per-connection state.
impl ConnHook for () {
    type State = ();
    fn opened(&self, _: &ConnInfo) {}
}

/// Logs at start-up what a listener on `addr` exposes: a non-loopback listener
/// without TLS carries requests, tokens and answers in clear text.
pub fn warn_if_clear_text(addr: SocketAddr, config: &ListenerConfig, what: &'static str) {
    if config.tls.is_none() && !addr.ip().is_loopback() {
        warn!(
            listener = what,
            %addr,
            "listening on a non-loopback address without TLS: bearer tokens, notes and \
             answers cross the network in clear text; give --tls-cert/--tls-key"
        );
    }
}

/// What one connection's watchdog reads; written by its IO wrapper and its service.
#[derive(Debug)]
struct ConnState {
    /// Requests whose service future has not finished.
    in_service: AtomicUsize,
    /// When the head being read started (ms on [`clock`]); 0 when none is pending.
    head_since: AtomicU64,
    /// Last byte read or written.
    last_activity: AtomicU64,
    /// HTTP/2: many requests share the connection; bytes between them are frames,
    /// not the start of a head.
    multiplexed: AtomicBool,
    /// Response bytes taken from the service and not yet written.
    out: Arc<ConnMeter>,
    /// The [`ConnHook`]'s state, kept as long as the socket (upgrades included).
    _hooked: Arc<dyn Any + Send + Sync>,
    _permit: OwnedSemaphorePermit,
}

enum Verdict {
    Wait(Duration),
    HeadTimeout,
    Idle,
}

impl ConnState {
    fn new(permit: OwnedSemaphorePermit, hooked: Arc<dyn Any + Send + Sync>) -> Self {
        let now = clock().max(1);
        Self {
            in_service: AtomicUsize::new(0),
            head_since: AtomicU64::new(now),
            last_activity: AtomicU64::new(now),
            multiplexed: AtomicBool::new(false),
            out: Arc::default(),
            _hooked: hooked,
            _permit: permit,
        }
    }

    fn on_read(&self) {
        let now = clock().max(1);
        self.last_activity.store(now, Ordering::Relaxed);
        if self.in_service.load(Ordering::Relaxed) == 0
            && !self.multiplexed.load(Ordering::Relaxed)
            && self.head_since.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(now, Ordering::Relaxed);
        }
    }

    fn on_write(&self, n: usize) {
        self.last_activity.store(clock(), Ordering::Relaxed);
        self.out.written(n);
    }

    fn verdict(&self, config: &ListenerConfig) -> Verdict {
        let now = clock();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let header = ms(config.header_read_timeout);
        let idle = ms(config.idle_timeout);
        let cap = config.header_read_timeout;
        if self.in_service.load(Ordering::Relaxed) > 0 {
            return Verdict::Wait(cap.max(Duration::from_millis(50)));
        }
        let head = self.head_since.load(Ordering::Relaxed);
        if head != 0 {
            let due = head.saturating_add(header);
            return if now >= due {
                Verdict::HeadTimeout
            } else {
                Verdict::Wait(Duration::from_millis(due - now))
            };
        }
        let due = self
            .last_activity
            .load(Ordering::Relaxed)
            .saturating_add(idle);
        if now >= due {
            Verdict::Idle
        } else {
            Verdict::Wait(Duration::from_millis(due - now).min(cap))
        }
    }
}

/// Counts a request as in service until dropped.
struct InService(Arc<ConnState>);

impl Drop for InService {
    fn drop(&mut self) {
        self.0.in_service.fetch_sub(1, Ordering::Relaxed);
        self.0.last_activity.store(clock(), Ordering::Relaxed);
    }
}

/// The accepted socket, reporting its traffic to the connection's [`ConnState`].
/// It travels into an upgraded connection, and with it the connection's permit.
#[derive(Debug)]
struct Watched {
    inner: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n @ 1..)) = r {
            self.state.on_write(n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n @ 1..)) = r {
            self.state.on_write(n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether an accept error means the process or system ran out of descriptors or
/// memory (the loop must back off rather than spin).
fn resource_exhausted(e: &io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 (Linux numbering; elsewhere the
    // kinds below still catch the memory cases).
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12)) || e.kind() == io::ErrorKind::OutOfMemory
}

/// Serves `service` on a bound listener until `shutdown` resolves; then stops
/// accepting, asks every connection to finish gracefully, and waits up to
/// [`ListenerConfig::grace`] for them.
pub async fn serve<S, F>(
    listener: TcpListener,
    config: ListenerConfig,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    S: Fn(Request<RequestBody>, &ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<GatewayBody>> + Send + 'static,
{
    let service = move |req, info: &ConnInfo, _: &Arc<()>| service(req, info);
    serve_hooked(listener, config, (), service, shutdown).await
}

/// [`serve`] with a [`ConnHook`]: each request also gets its connection's state.
pub async fn serve_hooked<H, S, F>(
    listener: TcpListener,
    config: ListenerConfig,
    hook: H,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    H: ConnHook,
    S: Fn(Request<RequestBody>, &ConnInfo, &Arc<H::State>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<GatewayBody>> + Send + 'static,
{
    let local = listener.local_addr()?;
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let slow = Arc::new(SlowBodies::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut failures: u64 = 0;
    let mut last_failure: Option<Instant> = None;
    let mut recovered = true;
    let mut backoff = Duration::from_millis(10);
    let mut at_cap = false;
    let mut permit: Option<OwnedSemaphorePermit> = None;
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let held = match permit.take() {
            Some(p) => p,
            None => match slots.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if !at_cap {
                        at_cap = true;
                        warn!(
                            limit = config.max_connections,
                            "connection limit reached; not accepting until a connection ends"
                        );
                    }
                    tokio::select! {
                        p = slots.clone().acquire_owned() => match p {
                            Ok(p) => p,
                            Err(_) => break,
                        },
                        () = &mut shutdown => break,
                    }
                }
            },
        };
        if at_cap {
            at_cap = false;
            info!(
                limit = config.max_connections,
                "below the connection limit; accepting again"
            );
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                permit = Some(held);
                if resource_exhausted(&e) {
                    // One warning (and one recovery line) per burst: failures less than
                    // a minute apart, even if a freed descriptor let an accept through.
                    if last_failure.is_none_or(|t: Instant| t.elapsed() >= BURST_QUIET) {
                        warn!(error = %e, "accept failed: out of file descriptors or memory; backing off");
                        recovered = false;
                    }
                    last_failure = Some(Instant::now());
                    failures += 1;
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                } else {
                    debug!(error = %e, "accept failed");
                }
                continue;
            }
        };
        if failures > 0 {
            backoff = Duration::from_millis(10);
            if !recovered {
                info!(failed_accepts = failures, "accepting connections again");
                recovered = true;
            }
            failures = 0;
        }
        let _ = stream.set_nodelay(true);
        let info = ConnInfo {
            peer,
            local,
            tls: config.tls.is_some(),
        };
        let hooked = Arc::new(hook.opened(&info));
        let state = Arc::new(ConnState::new(held, hooked.clone()));
        let io = Watched {
            inner: stream,
            state: state.clone(),
        };
        let span = tracing::debug_span!("connection", transport = info.scheme(), %peer);
        connections.spawn(
            connection(
                io,
                state,
                (info, hooked, slow.clone()),
                config.clone(),
                service.clone(),
                stop_rx.clone(),
            )
            .instrument(span),
        );
    }
    drop(permit);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(config.grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// A connection's [`ConnInfo`], its [`ConnHook`] state and its listener's slow bodies.
type Conn<T> = (ConnInfo, Arc<T>, Arc<SlowBodies>);

async fn connection<T, S, F>(
    io: Watched,
    state: Arc<ConnState>,
    info: Conn<T>,
    config: Arc<ListenerConfig>,
    service: S,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    T: Send + Sync + 'static,
    S: Fn(Request<RequestBody>, &ConnInfo, &Arc<T>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<GatewayBody>> + Send + 'static,
{
    match &config.tls {
        None => drive(io, state, info, &config, service, stop).await,
        Some(tls) => {
            let handshake =
                tokio::time::timeout(config.header_read_timeout, tls.acceptor().accept(io)).await;
            match handshake {
                Ok(Ok(tls_io)) => drive(tls_io, state, info, &config, service, stop).await,
                Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
                Err(_) => debug!("TLS handshake timed out"),
            }
        }
    }
}

async fn drive<IO, T, S, F>(
    io: IO,
    state: Arc<ConnState>,
    (info, hooked, slow): Conn<T>,
    config: &ListenerConfig,
    service: S,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: Send + Sync + 'static,
    S: Fn(Request<RequestBody>, &ConnInfo, &Arc<T>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<GatewayBody>> + Send + 'static,
{
    let svc_state = state.clone();
    let body_limits = config.body;
    let max_pending = config.max_pending_write_bytes;
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = &svc_state;
        st.in_service.fetch_add(1, Ordering::Relaxed);
        st.head_since.store(0, Ordering::Relaxed);
        if req.version() == http::Version::HTTP_2 {
            st.multiplexed.store(true, Ordering::Relaxed);
        }
        let guard = InService(st.clone());
        let version = req.version();
        let (mut parts, incoming) = req.into_parts();
        parts.extensions.insert(info.clone());
        let (body, clock) = RequestBody::new(incoming);
        // Over the process's budget of unwritten answers, the service is not asked.
        // Boxed once here: the handler's future is large (every path's state inline),
        // and unboxed it was copied each time it moved (into this block, out of the
        // closure, into hyper's slot): thousands of bytes per request.
        let fut = (outbound::pending() <= max_pending)
            .then(|| Box::pin(service(Request::from_parts(parts, body), &info, &hooked)));
        let (limits, slow, peer) = (body_limits, slow.clone(), info.peer.ip());
        let meter = st.out.clone();
        async move {
            let Some(mut fut) = fut else {
                drop(guard);
                return Ok::<_, Infallible>(outbound::over_budget());
            };
            // The handler first: a body that came with its head is read on this first
            // poll, and the clock, finding it finished, never arms its timer (a timer
            // registered and cancelled per request, otherwise, half the time).
            let response = tokio::select! {
                biased;
                r = &mut fut => r,
                () = clock.expired(&limits, &slow, peer) => {
                    debug!(
                        %peer,
                        total_ms = u64::try_from(limits.total.as_millis()).unwrap_or(u64::MAX),
                        "request body not received in time; 408 and the connection closed"
                    );
                    body_timeout(version)
                }
            };
            drop(guard);
            Ok::<_, Infallible>(response.map(|b| outbound::metered(b, meter)))
        }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    // The handlers run inside this task and wake it as they read their bodies.
    let self_wakes = SelfWakes::default();
    // Once set, the connection is finishing: only this deadline is watched.
    let mut draining: Option<tokio::time::Instant> = None;
    loop {
        let until = match draining {
            Some(at) => at,
            None => match state.verdict(config) {
                Verdict::Wait(d) => tokio::time::Instant::now() + d,
                Verdict::HeadTimeout => {
                    debug!(
                        timeout_ms = u64::try_from(config.header_read_timeout.as_millis())
                            .unwrap_or(u64::MAX),
                        "request head not received in time; connection dropped"
                    );
                    return;
                }
                Verdict::Idle => {
                    debug!("idle connection closed");
                    conn.as_mut().graceful_shutdown();
                    let at = tokio::time::Instant::now() + config.header_read_timeout;
                    draining = Some(at);
                    at
                }
            },
        };
        tokio::select! {
            res = std::future::poll_fn(|cx| self_wakes.poll(conn.as_mut(), cx)) => {
                if let Err(e) = res {
                    debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(until) => {
                if draining.is_some() {
                    return;
                }
            }
            _ = stop.changed(), if draining.is_none() => {
                conn.as_mut().graceful_shutdown();
                draining = Some(tokio::time::Instant::now() + config.grace);
            }
        }
    }
}

/// The answer to a request whose body did not arrive in time: 408, and over HTTP/1
/// `Connection: close` so the connection ends once it is written (HTTP/2 ends only
/// that stream).
fn body_timeout(version: http::Version) -> Response<GatewayBody> {
    let mut r = Response::new(crate::body::full("request body not received in time\n"));
    *r.status_mut() = http::StatusCode::REQUEST_TIMEOUT;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if version != http::Version::HTTP_2 {
        h.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    r
}
