//! Legacy Streamable HTTP (2025-03-26 … 2025-11-25): session ids, per-request SSE
//! streams, the standalone GET stream, `Last-Event-ID` resumption, and the driver
//! loop that feeds the adapters' session machine and carries out what it asks.
//!
//! Locking: each session's machine and stream table sit behind one `std` mutex that
//! is never held across an `.await`; upstream exchanges and timers take the lock only
//! to feed a message and perform the resulting events.
//!
//! A request's first upstream exchange runs inside its own POST handler (no task
//! hand-off each way on the hot path) and is detached into a task of its own when the
//! handler stops waiting; every other exchange is a task from the start.

use super::auth::BindingKey;
use super::driver::{self, Ended, Out};
use super::forwarded::Forwarded;
use super::session_store::{Lookup, SessionStore, StoreError};
use super::telemetry::{SessionTelemetry, WIRE_HTTP};
use super::trace::TraceContext;
use super::upstream::Denial;
use super::{cache, text, GatewayConfig, Route};
use crate::body::{empty, full, ChannelBody, GatewayBody, MeteredSender, SendError};
use crate::inbound::RequestBody;
use crate::sse;
use bytes::Bytes;
use dashmap::DashMap;
use dualera_adapters::jsonrpc::{self, Incoming as Parsed};
use dualera_adapters::replay::ReplayRing;
use dualera_adapters::usage::Feature;
use dualera_adapters::{
    Config as MachineConfig, Denied, ErrorCode, ErrorObject, Message, PeerStream, ProtocolVersion,
    RequestId, Response as RpcResponse, Session, SessionState, Timestamp, UpstreamRole,
};
use futures_util::future::{abortable, AbortHandle};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{debug, info, warn, Instrument};

/// Messages queued towards one live SSE connection before it counts as stalled.
pub(super) const STREAM_QUEUE: usize = 256;
/// Finished streams whose events are kept for resumption, per session.
pub(super) const FINISHED_KEPT: usize = 16;
/// How long a request's POST waits for a first message before it opens an SSE stream.
pub(super) const FIRST_MESSAGE_WAIT: Duration = Duration::from_secs(1);
/// How long an `initialize` may wait for the upstream's discover.
pub(super) const INIT_WAIT: Duration = Duration::from_secs(30);
/// How long a POST waits for the upstream to accept (or refuse, 401/403) the exchange
/// it caused before committing to a response: the refusal must reach the host as
/// HTTP, so no SSE stream is opened before the upstream's response head.
pub(super) const HEAD_WAIT: Duration = Duration::from_secs(30);

/// The machine's clock: the process's monotonic milliseconds ([`crate::clock`]).
pub(super) fn now() -> Timestamp {
    Timestamp::from_millis(crate::clock::now_ms())
}

/// Who a session counts against for `max_sessions_per_caller`: its binding, and for a
/// caller without credentials also its peer address ([`BindingKey::caller`]), so that
/// local hosts do not share one bound.
pub(super) type Binding = BindingKey;

/// Live legacy sessions.
#[derive(Debug)]
pub(super) struct Sessions {
    map: DashMap<String, Arc<SessionHandle>>,
    /// Sessions per caller (kept with `map`, so admission never scans for it).
    per_caller: DashMap<Binding, usize>,
    /// The machine's bounds and timings, shared by every session.
    machine: Arc<MachineConfig>,
    max_sessions: usize,
    max_per_caller: usize,
}

/// Why a new session was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The table is full and every session has a request in flight.
    Full,
    /// This caller holds its share and every one of them has a request in flight.
    CallerFull,
}

impl Sessions {
    pub(super) fn new(config: &GatewayConfig) -> Self {
        Self {
            map: DashMap::new(),
            per_caller: DashMap::new(),
            machine: Arc::new(machine_config(config)),
            max_sessions: config.max_sessions,
            max_per_caller: config.max_sessions_per_caller,
        }
    }

    /// Closes every session (gateway shutdown).
    pub(super) fn close_all(&self) {
        for entry in self.map.iter() {
            entry.value().close();
        }
        self.map.clear();
        self.per_caller.clear();
    }

    fn insert(&self, handle: Arc<SessionHandle>) {
        *self.per_caller.entry(handle.caller).or_insert(0) += 1;
        self.map.insert(handle.id.clone(), handle);
    }

    /// Removes a session from the table (the caller closes it).
    fn remove(&self, id: &str) -> Option<Arc<SessionHandle>> {
        let (_, handle) = self.map.remove(id)?;
        if let dashmap::Entry::Occupied(mut e) = self.per_caller.entry(handle.caller) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        Some(handle)
    }

    /// Makes room for one more session of `caller`: the one place that applies
    /// `max_sessions` and `max_sessions_per_caller`. When a bound is reached, the
    /// longest-idle session with no request in flight is evicted — of that caller, for
    /// its own bound; of the caller holding the most sessions, for the table's — so a
    /// caller's flood costs its own sessions, never an idle one of a smaller caller.
    /// Only when every candidate is busy is the new one refused.
    fn admit(&self, caller: &Binding) -> Result<(), Refused> {
        let held = self.per_caller.get(caller).map_or(0, |c| *c);
        if held >= self.max_per_caller {
            self.evict_idlest(Some(caller)).ok_or(Refused::CallerFull)?;
        }
        if self.map.len() >= self.max_sessions {
            self.evict_idlest(None).ok_or(Refused::Full)?;
        }
        Ok(())
    }

    /// Evicts the longest-idle session without a request in flight (of `caller` only,
    /// when given; else of the caller holding the most); returns its log tag.
    fn evict_idlest(&self, caller: Option<&Binding>) -> Option<String> {
        let held = |c: &Binding| self.per_caller.get(c).map_or(0, |n| *n);
        let victim = self
            .map
            .iter()
            .filter(|e| caller.is_none_or(|c| e.value().caller.matches(c)))
            .filter(|e| {
                // A session whose lock is taken is being used right now: not idle.
                e.value()
                    .shared
                    .try_lock()
                    .is_ok_and(|s| s.machine.in_flight() == 0)
            })
            .min_by_key(|e| {
                let h = e.value();
                (
                    std::cmp::Reverse(held(&h.caller)),
                    h.last_used.load(Ordering::Relaxed),
                )
            })
            .map(|e| e.key().clone())?;
        let handle = self.remove(&victim)?;
        handle.close();
        info!(session = %handle.tag, "idle session evicted to make room");
        Some(handle.tag.clone())
    }

    /// A machine for a new session on `transport`, with ids of its own.
    pub(super) fn new_machine(&self, transport: &str) -> Session {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "dualera-{transport}{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Session::with_shared_config(self.machine.clone(), prefix)
    }

    /// How many sessions are live.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

/// The session machine's bounds and timings from the gateway's config: the same for
/// every driver (in memory, shared through Redis).
pub(super) fn machine_config(config: &GatewayConfig) -> MachineConfig {
    let mut machine = MachineConfig::default();
    machine.max_in_flight = config.max_in_flight;
    machine.max_rounds = config.max_rounds;
    machine.retry_pause = config.retry_pause;
    machine.live_timeout = config.live_request_timeout;
    machine.live_timeout_max = config.live_request_timeout_max;
    if let Some(v) = &config.legacy_versions {
        machine.legacy_versions = v.clone();
    }
    machine.max_live = config.max_live_requests;
    machine.max_upstream_message = config.upstream_max_body_bytes;
    // Timestamps are `crate::clock` readings: the wall clock at its zero.
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    machine.unix_at_zero_ms = unix_now.saturating_sub(crate::clock::now_ms());
    machine
}

/// One stream towards the peer.
#[derive(Debug)]
struct StreamState {
    /// Stream number inside the session (first part of its event ids).
    number: u64,
    /// Last event sequence number used.
    seq: u64,
    /// Recent events, for `Last-Event-ID` resumption.
    ring: ReplayRing<Bytes>,
    /// The live connection, if one is attached.
    tx: Option<MeteredSender>,
    /// Before the POST handler decides between JSON and SSE: the messages so far.
    pending: Option<Vec<Vec<u8>>>,
    /// The stream's last message was sent.
    finished: bool,
    /// The POST handler waiting for this stream's first (or last) message.
    waiter: Option<Waker>,
    /// The trace context of the HTTP request that opened the stream: every upstream
    /// attempt of its legacy request carries it.
    trace: Option<Arc<TraceContext>>,
}

#[derive(Debug)]
struct Shared {
    machine: Session,
    streams: HashMap<PeerStream, StreamState>,
    by_number: HashMap<u64, PeerStream>,
    finished_order: VecDeque<PeerStream>,
    next_stream: u64,
    upstream_tasks: HashMap<RequestId, AbortHandle>,
    /// Where `perform` leaves the first upstream exchange it starts for the POST handler
    /// that is feeding the machine, instead of spawning it.
    inline: InlineSlot,
    /// Metrics and report of this session.
    telemetry: SessionTelemetry,
    /// The trace context of the `initialize` POST (for the discover it may cause).
    init_trace: Option<Arc<TraceContext>>,
    /// The `Authorization` of the latest host request of each legacy request still in
    /// flight, for the upstream calls no host request causes (a state-only retry after
    /// its pause, a `tools/list` refresh); dropped when the request ends.
    call_auth: HashMap<RequestId, HeaderValue>,
    /// The `Authorization` of the open standalone GET, for `subscriptions/listen`;
    /// dropped when that GET closes.
    standalone_auth: Option<HeaderValue>,
}

/// One upstream exchange, abortable through its entry in `upstream_tasks`.
type Exchange = Pin<Box<dyn Future<Output = ()> + Send>>;

/// See [`Shared::inline`].
enum InlineSlot {
    /// Nobody is waiting inline: exchanges are spawned.
    Closed,
    /// A POST handler will drive the next exchange itself, and learns through the
    /// watch whether the upstream accepted or refused it.
    Open(Arc<HeadWatch>),
    /// The exchange that handler will drive.
    Taken(Exchange),
}

/// Whether the upstream accepted an exchange a host request is waiting on, or refused
/// its credentials: one `tokio::sync::watch` cell, for the in-memory driver (which
/// polls it while driving the exchange inline) and the Redis one (which waits on it
/// with [`HeadWatch::settle`]). Its lock is taken after the session lock, never before.
#[derive(Debug)]
pub(super) struct HeadWatch(tokio::sync::watch::Sender<HeadState>);

#[derive(Debug, Default)]
pub(super) enum HeadState {
    #[default]
    Waiting,
    Accepted,
    Denied(Box<Denial>),
    /// The host request stopped waiting: a refusal now goes to the session machine.
    Abandoned,
}

impl Default for HeadWatch {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(HeadState::Waiting))
    }
}

impl HeadWatch {
    pub(super) fn accepted(&self) {
        self.0.send_if_modified(|h| {
            let waiting = matches!(h, HeadState::Waiting);
            if waiting {
                *h = HeadState::Accepted;
            }
            waiting
        });
    }

    /// Hands a refusal to the waiting host request; false if it stopped waiting.
    pub(super) fn offer(&self, denial: &Denial) -> bool {
        self.0.send_if_modified(|h| {
            let waiting = matches!(h, HeadState::Waiting);
            if waiting {
                *h = HeadState::Denied(Box::new(denial.clone()));
            }
            waiting
        })
    }

    pub(super) fn settled(&self) -> bool {
        !matches!(*self.0.borrow(), HeadState::Waiting)
    }

    pub(super) fn denied(&self) -> bool {
        matches!(*self.0.borrow(), HeadState::Denied(_))
    }

    /// A receiver told of every change from now on.
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<HeadState> {
        self.0.subscribe()
    }

    /// Waits until the upstream accepted or refused, up to `limit`.
    pub(super) async fn settle(&self, limit: Duration) {
        let mut rx = self.0.subscribe();
        let settled = rx.wait_for(|h| !matches!(h, HeadState::Waiting));
        let _ = tokio::time::timeout(limit, settled).await;
    }

    /// Stops waiting; the refusal, if one came.
    pub(super) fn finish(&self) -> Option<Box<Denial>> {
        let mut refusal = None;
        self.0.send_if_modified(|h| {
            match std::mem::replace(h, HeadState::Abandoned) {
                HeadState::Denied(d) => refusal = Some(d),
                HeadState::Accepted => *h = HeadState::Accepted,
                HeadState::Waiting | HeadState::Abandoned => {}
            }
            // Nobody waits past this point: no one to notify.
            false
        });
        refusal
    }
}

impl std::fmt::Debug for InlineSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Closed => "Closed",
            Self::Open(_) => "Open",
            Self::Taken(_) => "Taken",
        })
    }
}

/// An exchange a POST handler drives; if the handler stops before it finishes (it got
/// its first message, or its client went away) the rest runs as a task, so dropping
/// the handler never cancels upstream work.
struct Detachable(Option<Exchange>);

impl Detachable {
    /// Closes the inline slot, taking the exchange `perform` left there, if any.
    fn take(s: &mut Shared) -> Self {
        match std::mem::replace(&mut s.inline, InlineSlot::Closed) {
            InlineSlot::Taken(exchange) => Self(Some(exchange)),
            InlineSlot::Open(_) | InlineSlot::Closed => Self(None),
        }
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        if let (Some(rest), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(rest);
        }
    }
}

/// A legacy session: the machine, its streams, and what binds it to its caller.
#[derive(Debug)]
pub(super) struct SessionHandle {
    id: String,
    /// What logs show instead of the id (a bearer secret): [`crate::digest::log_tag`].
    tag: String,
    /// The principal (or token digest) the session is bound to.
    binding: BindingKey,
    /// Who it counts against for `max_sessions_per_caller` ([`Binding`]).
    caller: BindingKey,
    /// Opened without credentials: its discover result may be shared.
    anonymous: bool,
    /// Forwarded headers of the request that opened the session.
    forwarded: Forwarded,
    shared: Mutex<Shared>,
    last_used: AtomicU64,
    /// Wakes the timer task early (a deadline moved earlier, or the session closed).
    wake: Notify,
    /// When the timer task will next wake on its own (machine clock, ms); set by it
    /// under the session lock, so that routine traffic does not wake it for nothing.
    timer_at: AtomicU64,
    replay: usize,
    replay_bytes: usize,
    /// Bytes queued toward one host connection before it counts as not reading.
    max_buffered: usize,
}

impl SessionHandle {
    fn touch(&self) {
        self.last_used.store(now().as_millis(), Ordering::Relaxed);
    }

    fn close(&self) {
        if let Ok(mut s) = self.shared.lock() {
            s.machine.close();
            s.telemetry.close();
            for (_, h) in s.upstream_tasks.drain() {
                h.abort();
            }
            for st in s.streams.values_mut() {
                st.tx = None;
            }
        }
        self.wake.notify_one();
    }
}

pub(super) fn mint_session_id() -> Option<String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).ok()?;
    Some(crate::digest::hex(&bytes))
}

pub(super) fn rpc_error(
    status: StatusCode,
    id: Option<RequestId>,
    code: ErrorCode,
    msg: String,
) -> Response<GatewayBody> {
    let body = Message::Response(RpcResponse::error(id, ErrorObject::new(code, msg))).to_vec();
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn with_session_header(mut r: Response<GatewayBody>, id: &str) -> Response<GatewayBody> {
    if let Ok(v) = HeaderValue::from_str(id) {
        r.headers_mut().insert("mcp-session-id", v);
    }
    r
}

/// Handles one legacy request (POST, GET or DELETE on `/mcp`), in whichever store
/// holds the gateway's sessions.
pub(super) async fn handle(
    gw: &Arc<Route>,
    req: Request<RequestBody>,
    forwarded: Forwarded,
) -> Response<GatewayBody> {
    // The Redis store's future is boxed: inline, its size would be the in-memory
    // path's too, moved (copied) on every request.
    match gw.redis.as_ref() {
        Some(shared) => Box::pin(front(gw, &shared.clone(), req, forwarded)).await,
        None => front(gw, &gw.legacy, req, forwarded).await,
    }
}

/// What every store shares: header checks, the session lookup and its binding, the
/// body, the envelope, and the dispatch to the store's operation.
async fn front<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    req: Request<RequestBody>,
    forwarded: Forwarded,
) -> Response<GatewayBody> {
    let session_header = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(v) = req.headers().get("mcp-protocol-version") {
        let known = v
            .to_str()
            .is_ok_and(|v| ProtocolVersion::LEGACY.contains(&v));
        if !known {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                ErrorCode::INVALID_REQUEST,
                format!(
                    "Bad Request: unsupported MCP-Protocol-Version {}; supported: {}",
                    dualera_adapters::echo::echo_bytes(v.as_bytes()),
                    ProtocolVersion::LEGACY.join(", ")
                ),
            );
        }
    }
    let auth = super::auth::credentials(req.headers());
    let existing = match &session_header {
        None => None,
        Some(id) => match store.find(gw, id, auth.as_ref()).await {
            Ok(Lookup::Found(h)) => Some(h),
            Ok(Lookup::NotFound { anonymous }) => {
                return session_missing(gw, auth.as_ref(), anonymous).await
            }
            Err(e) => return store_unavailable(None, &e),
        },
    };
    match *req.method() {
        Method::POST => post(gw, store, req, existing, auth, forwarded).await,
        Method::GET => match existing {
            Some(h) => {
                let headers = req.headers().clone();
                store.stream(gw, &h, &headers, auth).await
            }
            None => rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required".into(),
            ),
        },
        Method::DELETE => match existing {
            Some(h) => store.delete(gw, &h).await,
            None => rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required".into(),
            ),
        },
        _ => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

/// The answer to a session id that is unknown, ended, expired or another caller's:
/// 404, never 401 (DESIGN.md, "Remote upstreams"), so the id gives nothing away —
/// except that a request without credentials naming a session opened with some (or an
/// unknown one) gets the upstream's own challenge when it demands credentials: a host
/// whose token expired may drop it and must learn to authorize again.
pub(super) async fn session_missing(
    gw: &Arc<Route>,
    auth: Option<&HeaderValue>,
    anonymous: bool,
) -> Response<GatewayBody> {
    if auth.is_none() && !anonymous {
        if let Some(denial) = super::auth::upstream_denial(gw, None).await {
            return denial.response();
        }
    }
    rpc_error(
        StatusCode::NOT_FOUND,
        None,
        ErrorCode::INVALID_REQUEST,
        "Session not found: it ended, expired, or belongs to another caller; send initialize again"
            .into(),
    )
}

/// The shared session store could not be used: `-32603` with
/// `data.reason = "sessionStoreUnavailable"`, HTTP 503 with `Retry-After`. The cause
/// is logged, never sent (it may name the store's address).
pub(super) fn store_unavailable(
    id: Option<RequestId>,
    error: &StoreError,
) -> Response<GatewayBody> {
    warn!(error = %error, "session store unavailable; request refused");
    let body = Message::Response(RpcResponse::error(
        id,
        ErrorObject::new(
            ErrorCode::INTERNAL_ERROR,
            "The session store is unavailable; try again shortly",
        )
        .with_data(serde_json::json!({ "reason": "sessionStoreUnavailable" })),
    ))
    .to_vec();
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECS),
    );
    r
}

/// What a POST carries besides its body, for the store's operation.
pub(super) struct PostContext {
    /// The request's `Authorization`.
    pub(super) auth: Option<HeaderValue>,
    /// Forwarded headers for the upstream (kept per session from `initialize`).
    pub(super) forwarded: Forwarded,
    /// The request's W3C trace context.
    pub(super) trace: Option<Arc<TraceContext>>,
    /// The peer's address (a caller without credentials is counted by it).
    pub(super) peer: Option<std::net::IpAddr>,
}

async fn post<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    req: Request<RequestBody>,
    existing: Option<S::Session>,
    auth: Option<HeaderValue>,
    forwarded: Forwarded,
) -> Response<GatewayBody> {
    let limit = gw.config.max_body_bytes;
    let trace = TraceContext::from_headers(req.headers()).map(Arc::new);
    let peer = crate::listener::peer_of(&req);
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                ErrorCode::INVALID_REQUEST,
                format!("Invalid request: body larger than {limit} bytes"),
            )
        }
    };
    let parsed = match jsonrpc::parse_incoming(&body) {
        Ok(p) => p,
        Err(e) => {
            let resp = e.to_response();
            let mut r = Response::new(full(Message::Response(resp).to_vec()));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return r;
        }
    };
    let cx = PostContext {
        auth,
        forwarded,
        trace,
        peer,
    };
    let Some(handle) = existing else {
        return match parsed {
            Parsed::Single(Message::Request(r)) if r.method == "initialize" => {
                store.initialize(gw, r, cx).await
            }
            _ => rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required (or send initialize to start a session)".into(),
            ),
        };
    };
    match parsed {
        Parsed::Single(Message::Request(r)) => store.request(gw, &handle, r, cx).await,
        Parsed::Single(other) => store.message(gw, &handle, other, cx.auth).await,
        Parsed::Batch(items) => store.batch(gw, &handle, items, cx).await,
    }
}

impl SessionStore for Sessions {
    type Session = Arc<SessionHandle>;

    async fn find(
        &self,
        gw: &Arc<Route>,
        id: &str,
        authorization: Option<&HeaderValue>,
    ) -> Result<Lookup<Arc<SessionHandle>>, StoreError> {
        Ok(match self.map.get(id).map(|e| e.value().clone()) {
            // Another principal, or no credentials on a session opened with some: 404.
            Some(h)
                if h.binding
                    .matches(&BindingKey::of(gw.config.session_binding, authorization)) =>
            {
                Lookup::Found(h)
            }
            found => Lookup::NotFound {
                anonymous: found.is_some_and(|h| h.anonymous),
            },
        })
    }

    async fn initialize(
        &self,
        gw: &Arc<Route>,
        init: dualera_adapters::Request,
        cx: PostContext,
    ) -> Response<GatewayBody> {
        let caller = BindingKey::of(gw.config.session_binding, cx.auth.as_ref())
            .caller(cx.auth.is_none(), cx.peer);
        // Once per session, and large: boxed, out of every request's future.
        Box::pin(initialize(
            gw,
            init,
            cx.auth,
            cx.forwarded,
            cx.trace,
            caller,
        ))
        .await
    }

    async fn request(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        r: dualera_adapters::Request,
        cx: PostContext,
    ) -> Response<GatewayBody> {
        handle.touch();
        request(gw, handle, r, cx.auth, cx.trace).await
    }

    async fn message(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        other: Message,
        auth: Option<HeaderValue>,
    ) -> Response<GatewayBody> {
        handle.touch();
        message(gw, handle, other, auth).await
    }

    async fn batch(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        items: Vec<Result<Message, jsonrpc::EnvelopeError>>,
        cx: PostContext,
    ) -> Response<GatewayBody> {
        handle.touch();
        batch(gw, handle, items, cx.auth, cx.trace)
    }

    async fn stream(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        headers: &http::HeaderMap,
        auth: Option<HeaderValue>,
    ) -> Response<GatewayBody> {
        Box::pin(get(gw, handle, headers, auth)).await
    }

    async fn delete(&self, _gw: &Arc<Route>, h: &Arc<SessionHandle>) -> Response<GatewayBody> {
        self.remove(&h.id);
        h.close();
        info!(session = %h.tag, "session deleted by the peer");
        let mut r = Response::new(empty());
        *r.status_mut() = StatusCode::OK;
        r
    }
}

/// A notification or a reply to a live request on an in-memory session.
async fn message(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    other: Message,
    auth: Option<HeaderValue>,
) -> Response<GatewayBody> {
    let watch = Arc::new(HeadWatch::default());
    let (result, mut inline) = {
        let Ok(mut s) = handle.shared.lock() else {
            return internal();
        };
        s.inline = InlineSlot::Open(watch.clone());
        let r = s.machine.handle_peer_message(other, now());
        perform(gw, handle, &mut s, auth.as_ref());
        (r, Detachable::take(&mut s))
    };
    // An answer that completes a round starts the upstream retry on behalf of
    // this POST: a 401/403 for it answers this POST, and the round waits for
    // the answer again.
    if inline.0.is_some() {
        wait_head(&watch, &mut inline).await;
    }
    drop(inline);
    if let Some(denial) = watch.finish() {
        return denial.response();
    }
    match result {
        Ok(()) => accepted(),
        // A reply to a live request the gateway gave up on: accepted, dropped.
        Err(e) if e.is_dropped() => {
            debug!(session = %handle.tag, error = %e, "late or duplicate reply dropped");
            accepted()
        }
        Err(e) => {
            warn!(session = %handle.tag, error = %e, "peer message refused");
            refusal(None, &e)
        }
    }
}

/// Drives `inline` until the upstream accepted or refused it (or [`HEAD_WAIT`]).
async fn wait_head(watch: &HeadWatch, inline: &mut Detachable) {
    let sleep = tokio::time::sleep(HEAD_WAIT);
    tokio::pin!(sleep);
    std::future::poll_fn(|cx| {
        if let Some(exchange) = inline.0.as_mut() {
            if exchange.as_mut().poll(cx).is_ready() {
                inline.0 = None;
            }
        }
        if inline.0.is_none() || watch.settled() {
            return Poll::Ready(());
        }
        sleep.as_mut().poll(cx)
    })
    .await;
}

/// The HTTP answer to input the session machine refused (the one mapping from
/// [`SessionError`](dualera_adapters::SessionError) to an HTTP status): its own
/// JSON-RPC error when it has one, else a generic `-32600`. Overload is `429` with
/// `Retry-After` (before any SSE is committed: the request was never started), a
/// request the upstream could not take `413`, anything else `400`.
pub(super) fn refusal(
    id: Option<RequestId>,
    e: &dualera_adapters::SessionError,
) -> Response<GatewayBody> {
    use dualera_adapters::SessionError as E;
    let resp = e.to_response().unwrap_or_else(|| {
        RpcResponse::error(
            id,
            ErrorObject::new(ErrorCode::INVALID_REQUEST, format!("Invalid request: {e}")),
        )
    });
    let status = match e {
        E::TooManyInFlight { .. } => StatusCode::TOO_MANY_REQUESTS,
        E::TooLargeForUpstream { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    let mut r = Response::new(full(Message::Response(resp).to_vec()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECS),
        );
    }
    r
}

/// The answer to an `initialize` refused because a session bound is reached and every
/// session that could make room is busy: `503` for `max_sessions`, `429` for the
/// caller's `max_sessions_per_caller`, both with `Retry-After`. Both stores use it.
pub(super) fn sessions_refused(
    id: Option<RequestId>,
    status: StatusCode,
    limit: usize,
) -> Response<GatewayBody> {
    let what = if status == StatusCode::TOO_MANY_REQUESTS {
        "Too many sessions for this caller, all of them busy; end one or try again later (limit"
    } else {
        "Too many sessions, all of them busy; try again later (limit"
    };
    // A peer can ask again and again: one line per interval, with the count.
    static REFUSED: crate::throttle::Throttle = crate::throttle::Throttle::per_secs(10);
    if let Some(refused) = REFUSED.hit() {
        warn!(
            limit,
            status = status.as_u16(),
            refused,
            "session limit reached; initialize refused (count since the last such line)"
        );
    }
    let mut r = rpc_error(
        status,
        id,
        ErrorCode::INTERNAL_ERROR,
        format!("{what} {limit})"),
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECS),
    );
    r
}

/// `Retry-After` on overload refusals, in seconds.
const RETRY_AFTER_SECS: &str = "1";

pub(super) fn accepted() -> Response<GatewayBody> {
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

pub(super) fn internal() -> Response<GatewayBody> {
    rpc_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        None,
        ErrorCode::INTERNAL_ERROR,
        "Internal error".into(),
    )
}

async fn initialize(
    gw: &Arc<Route>,
    init: dualera_adapters::Request,
    auth: Option<HeaderValue>,
    forwarded: Forwarded,
    trace: Option<Arc<TraceContext>>,
    caller: BindingKey,
) -> Response<GatewayBody> {
    let binding = BindingKey::of(gw.config.session_binding, auth.as_ref());
    if let Err(refused) = gw.legacy.admit(&caller) {
        return match refused {
            Refused::Full => sessions_refused(
                Some(init.id),
                StatusCode::SERVICE_UNAVAILABLE,
                gw.config.max_sessions,
            ),
            Refused::CallerFull => sessions_refused(
                Some(init.id),
                StatusCode::TOO_MANY_REQUESTS,
                gw.config.max_sessions_per_caller,
            ),
        };
    }
    let Some(id) = mint_session_id() else {
        return internal();
    };
    let tag = crate::digest::log_tag(&id);
    let mut machine =
        Session::with_shared_config(gw.legacy.machine.clone(), format!("dualera-{tag}"));
    if let Some(d) = cache::legacy::discover_for_initialize(&gw.cache, auth.as_ref()) {
        let _ = machine.handle_discover_shared(d);
    }
    let handle = Arc::new(SessionHandle {
        id: id.clone(),
        tag: tag.clone(),
        binding,
        caller,
        anonymous: auth.is_none(),
        forwarded,
        shared: Mutex::new(Shared {
            machine,
            streams: HashMap::new(),
            by_number: HashMap::new(),
            finished_order: VecDeque::new(),
            next_stream: 0,
            upstream_tasks: HashMap::new(),
            inline: InlineSlot::Closed,
            telemetry: gw.telemetry.session(WIRE_HTTP),
            init_trace: trace,
            call_auth: HashMap::new(),
            standalone_auth: None,
        }),
        last_used: AtomicU64::new(now().as_millis()),
        timer_at: AtomicU64::new(0),
        wake: Notify::new(),
        replay: gw.config.replay_buffer,
        replay_bytes: gw.config.replay_buffer_bytes,
        max_buffered: gw.config.max_buffered_bytes,
    });
    let stream = PeerStream::Request(init.id.clone());
    let init_id = init.id.clone();
    let watch = Arc::new(HeadWatch::default());
    let mut inline = {
        let Ok(mut s) = handle.shared.lock() else {
            return internal();
        };
        open_pending(&handle, &mut s, stream.clone());
        s.telemetry.request_started(&init.id);
        if let Err(e) = s.machine.handle_peer_message(Message::Request(init), now()) {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Some(init_id),
                ErrorCode::INVALID_REQUEST,
                format!("Invalid request: {e}"),
            );
        }
        s.inline = InlineSlot::Open(watch.clone());
        perform(gw, &handle, &mut s, auth.as_ref());
        Detachable::take(&mut s)
    };
    let outcome = wait_pending(&handle, &stream, INIT_WAIT, &mut inline, &watch).await;
    drop(inline);
    if let Some(denial) = watch.finish() {
        // The upstream refused the caller's credentials: its status and challenge go
        // back as they are, and no session is minted.
        handle.close();
        info!(
            status = denial.status.as_u16(),
            "initialize refused by the upstream"
        );
        return denial.response();
    }
    let Some(messages) = outcome else {
        handle.close();
        return rpc_error(
            StatusCode::GATEWAY_TIMEOUT,
            Some(init_id),
            ErrorCode::INTERNAL_ERROR,
            "the upstream server did not answer in time".into(),
        );
    };
    let ready = handle
        .shared
        .lock()
        .map(|s| s.machine.state() == SessionState::Ready)
        .unwrap_or(false);
    let body = messages.last().cloned().unwrap_or_default();
    let mut r = Response::new(full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if !ready {
        // A failed initialize leaves no session behind.
        handle.close();
        return r;
    }
    // Idle time counts from now, not from when `initialize` arrived: a slow discover
    // must not make the new session look idle before the peer could use it.
    handle.touch();
    gw.legacy.insert(handle.clone());
    info!(session = %tag, sessions = gw.legacy.len(), "legacy session opened");
    with_session_header(r, &id)
}

fn open_pending(handle: &SessionHandle, s: &mut Shared, stream: PeerStream) {
    s.next_stream += 1;
    let number = s.next_stream;
    s.by_number.insert(number, stream.clone());
    s.streams.insert(
        stream,
        StreamState {
            number,
            seq: 0,
            ring: ReplayRing::new(handle.replay, handle.replay_bytes),
            tx: None,
            pending: Some(Vec::new()),
            finished: false,
            waiter: None,
            trace: None,
        },
    );
}

/// Waits until the pending stream finished (its last message arrived), up to `limit`,
/// driving `inline` meanwhile.
async fn wait_pending(
    handle: &SessionHandle,
    stream: &PeerStream,
    limit: Duration,
    inline: &mut Detachable,
    watch: &HeadWatch,
) -> Option<Vec<Vec<u8>>> {
    wait_stream(handle, stream, limit, inline, |st| {
        st.finished || watch.denied()
    })
    .await;
    let mut s = handle.shared.lock().ok()?;
    let st = s.streams.get_mut(stream)?;
    if !st.finished {
        return None;
    }
    let pending = st.pending.take();
    // Answered as JSON: no event id ever reached the peer.
    forget_stream(&mut s, stream);
    pending
}

/// Waits until `ready` holds for the stream (or it is gone), up to `limit`, while
/// driving the caller's inline exchange.
///
/// The waker is parked in the stream itself and cleared before the exchange is
/// polled: a message the exchange delivers during that poll must not wake the task
/// that is running it, because a task woken during its own poll is requeued as a
/// yield, which makes the runtime wake an idle worker for nothing (twice per request
/// before this was done, per `perf record -e sched:sched_wakeup`).
async fn wait_stream(
    handle: &SessionHandle,
    stream: &PeerStream,
    limit: Duration,
    inline: &mut Detachable,
    ready: impl Fn(&StreamState) -> bool,
) {
    let sleep = tokio::time::sleep(limit);
    tokio::pin!(sleep);
    std::future::poll_fn(|cx| {
        if let Some(exchange) = inline.0.as_mut() {
            if let Ok(mut s) = handle.shared.lock() {
                if let Some(st) = s.streams.get_mut(stream) {
                    st.waiter = None;
                }
            }
            if exchange.as_mut().poll(cx).is_ready() {
                inline.0 = None;
            }
        }
        {
            let Ok(mut s) = handle.shared.lock() else {
                return Poll::Ready(());
            };
            match s.streams.get_mut(stream) {
                Some(st) if !ready(st) => match &st.waiter {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => st.waiter = Some(cx.waker().clone()),
                },
                _ => return Poll::Ready(()),
            }
        }
        sleep.as_mut().poll(cx)
    })
    .await;
}

async fn request(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    r: dualera_adapters::Request,
    auth: Option<HeaderValue>,
    trace: Option<Arc<TraceContext>>,
) -> Response<GatewayBody> {
    let stream = PeerStream::Request(r.id.clone());
    let watch = Arc::new(HeadWatch::default());
    let mut inline = match feed_request(gw, handle, r, &stream, auth, trace, &watch) {
        Ok(inline) => inline,
        Err(refused) => return *refused,
    };
    // A request answered without any live round gets a plain JSON response.
    let ready = |st: &StreamState| {
        st.finished || st.pending.as_ref().is_none_or(|p| !p.is_empty()) || watch.denied()
    };
    wait_stream(handle, &stream, FIRST_MESSAGE_WAIT, &mut inline, ready).await;
    // Nothing is committed before the upstream accepted the exchange: its 401/403
    // must reach the host as HTTP on this POST.
    if inline.0.is_some() && !watch.settled() {
        let more = HEAD_WAIT.saturating_sub(FIRST_MESSAGE_WAIT);
        wait_stream(handle, &stream, more, &mut inline, |st| {
            ready(st) || watch.settled()
        })
        .await;
    }
    drop(inline);
    let Ok(mut s) = handle.shared.lock() else {
        return internal();
    };
    if let Some(denial) = watch.finish() {
        forget_stream(&mut s, &stream);
        return denial.response();
    }
    respond_on(gw, handle, &mut s, &stream)
}

/// Feeds a request to the machine; returns the first upstream exchange it started,
/// for the caller to drive.
fn feed_request(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    r: dualera_adapters::Request,
    stream: &PeerStream,
    auth: Option<HeaderValue>,
    trace: Option<Arc<TraceContext>>,
    watch: &Arc<HeadWatch>,
) -> Result<Detachable, Box<Response<GatewayBody>>> {
    let id = r.id.clone();
    let Ok(mut s) = handle.shared.lock() else {
        return Err(Box::new(internal()));
    };
    if s.streams.get(stream).is_some_and(|st| !st.finished) {
        // Refused before the machine sees it (its stream must survive), in the
        // machine's own words, as every other wire says it.
        let e = dualera_adapters::SessionError::DuplicateRequestId { id: id.clone() };
        return Err(Box::new(refusal(Some(id), &e)));
    }
    open_pending(handle, &mut s, stream.clone());
    if let Some(st) = s.streams.get_mut(stream) {
        st.trace = trace;
    }
    s.telemetry.request_started(&id);
    if let Err(e) = s.machine.handle_peer_message(Message::Request(r), now()) {
        forget_stream(&mut s, stream);
        // Nothing changed but the observation of the refusal (an overload counts).
        perform(gw, handle, &mut s, None);
        info!(session = %handle.tag, error = %e, "request refused");
        return Err(Box::new(refusal(Some(id), &e)));
    }
    s.inline = InlineSlot::Open(watch.clone());
    perform(gw, handle, &mut s, auth.as_ref());
    Ok(Detachable::take(&mut s))
}

fn batch(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    items: Vec<Result<Message, jsonrpc::EnvelopeError>>,
    auth: Option<HeaderValue>,
    trace: Option<Arc<TraceContext>>,
) -> Response<GatewayBody> {
    let Ok(mut s) = handle.shared.lock() else {
        return internal();
    };
    for item in &items {
        if let Ok(Message::Request(r)) = item {
            s.telemetry.request_started(&r.id);
        }
    }
    // A batch's upstream calls carry its token; a 401/403 for one of them reaches the
    // peer as that element's error in the batch's response (one HTTP answer for many).
    // The stream id of the batch is known only after feeding; buffer by peeking the
    // next batch id is not possible, so feed and then adopt whatever the batch emitted.
    let outcome = s.machine.handle_peer_batch(items, now());
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return refusal(None, &e),
    };
    for refused in &outcome.refused {
        warn!(session = %handle.tag, error = %refused, "batch element refused");
    }
    let Some(batch) = outcome.batch else {
        perform(gw, handle, &mut s, auth.as_ref());
        return accepted();
    };
    let stream = PeerStream::Batch(batch);
    open_pending(handle, &mut s, stream.clone());
    if let Some(st) = s.streams.get_mut(&stream) {
        st.trace = trace;
    }
    perform(gw, handle, &mut s, auth.as_ref());
    respond_on(gw, handle, &mut s, &stream)
}

/// After feeding a request: JSON when it was answered at once, else an SSE stream
/// carrying what was produced so far and everything that follows.
fn respond_on(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    s: &mut Shared,
    stream: &PeerStream,
) -> Response<GatewayBody> {
    let Some(st) = s.streams.get_mut(stream) else {
        return internal();
    };
    let pending = st.pending.take().unwrap_or_default();
    if st.finished && pending.len() == 1 {
        let body = pending.into_iter().next().unwrap_or_default();
        // Answered as JSON: no event id ever reached the peer, so nothing can resume it.
        forget_stream(s, stream);
        let mut r = Response::new(full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return r;
    }
    // Priming event (lets the client resume this stream from its start), then what
    // the stream carried so far.
    let backlog = std::iter::once(sse::prime(&format!("{}.0", st.number)))
        .chain(st.ring.iter().cloned())
        .collect();
    let (tx, body) = ChannelBody::metered(backlog, STREAM_QUEUE, handle.max_buffered);
    let number = st.number;
    if !st.finished {
        st.tx = Some(tx);
        rearm(gw, handle, s);
    }
    debug!(session = %handle.tag, stream = number, "SSE stream opened");
    crate::body::sse_response(body)
}

async fn get(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    headers: &http::HeaderMap,
    auth: Option<HeaderValue>,
) -> Response<GatewayBody> {
    handle.touch();
    let watch = Arc::new(HeadWatch::default());
    let probe_auth = auth.clone();
    let (response, mut inline) = {
        let Ok(mut s) = handle.shared.lock() else {
            return internal();
        };
        let r = open_get(gw, handle, &mut s, headers, auth, &watch);
        (r, Detachable::take(&mut s))
    };
    // Opening the stream may start `subscriptions/listen` with this GET's token: its
    // 401/403 answers the GET, and the stream is closed again. Without one, the
    // upstream is asked about the token all the same (a bound session only).
    let mut denied = None;
    if inline.0.is_some() {
        wait_head(&watch, &mut inline).await;
    } else if probe_auth.is_some() && !handle.anonymous {
        denied = super::auth::upstream_denial(gw, probe_auth.as_ref())
            .await
            .map(Box::new);
    }
    drop(inline);
    if let Some(denial) = watch.finish().or(denied) {
        if let Ok(mut s) = handle.shared.lock() {
            if let Some(st) = s.streams.get_mut(&PeerStream::Standalone) {
                st.tx = None;
            }
            s.standalone_auth = None;
            let _ = s.machine.handle_standalone_closed();
            perform(gw, handle, &mut s, None);
        }
        return denial.response();
    }
    response
}

/// A GET's `Last-Event-ID` as (stream number, sequence number): the event ids this
/// gateway mints are `N.SEQ`, unique across the streams of a session (2025-11-25
/// `basic/transports.mdx`, Resumability). Anything else is no resumption.
pub(super) fn last_event_id(headers: &http::HeaderMap) -> Option<(u64, u64)> {
    let (a, b) = headers
        .get("last-event-id")?
        .to_str()
        .ok()?
        .split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Attaches a GET to a stream: a resumed one (`Last-Event-ID`) or the standalone one.
fn open_get(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    s: &mut Shared,
    headers: &http::HeaderMap,
    auth: Option<HeaderValue>,
    watch: &Arc<HeadWatch>,
) -> Response<GatewayBody> {
    let body = if let Some((number, after)) = last_event_id(headers) {
        let Some(stream) = s.by_number.get(&number).cloned() else {
            return rpc_error(
                StatusCode::NOT_FOUND,
                None,
                ErrorCode::INVALID_REQUEST,
                "Unknown Last-Event-ID: that stream can no longer be resumed".into(),
            );
        };
        let Some(st) = s.streams.get_mut(&stream) else {
            return internal();
        };
        if st.ring.has_gap_after(after) {
            warn!(session = %handle.tag, stream = number, "resumption gap: older events were dropped");
        }
        let backlog = st.ring.after(after).cloned().collect();
        let (tx, body) = ChannelBody::metered(backlog, STREAM_QUEUE, handle.max_buffered);
        if !st.finished {
            st.tx = Some(tx);
            rearm(gw, handle, s);
        }
        s.telemetry.feature(Feature::Resumption);
        debug!(session = %handle.tag, stream = number, after, "stream resumed");
        body
    } else {
        let stream = PeerStream::Standalone;
        if s.streams
            .get(&stream)
            .is_some_and(|st| st.tx.as_ref().is_some_and(|t| !t.is_closed()))
        {
            return rpc_error(
                StatusCode::CONFLICT,
                None,
                ErrorCode::INVALID_REQUEST,
                "Conflict: this session already has a GET stream open".into(),
            );
        }
        if !s.streams.contains_key(&stream) {
            open_pending(handle, s, stream.clone());
            if let Some(st) = s.streams.get_mut(&stream) {
                st.pending = None;
            }
        }
        let Some(st) = s.streams.get_mut(&stream) else {
            return internal();
        };
        let prime = vec![sse::prime(&format!("{}.{}", st.number, st.seq))];
        let (tx, body) = ChannelBody::metered(prime, STREAM_QUEUE, handle.max_buffered);
        watch_standalone(gw.clone(), handle.clone(), tx.clone());
        st.tx = Some(tx);
        s.telemetry.feature(Feature::GetStream);
        // Kept only while this GET is open: `subscriptions/listen` runs on its behalf.
        s.standalone_auth = auth;
        s.inline = InlineSlot::Open(watch.clone());
        let _ = s.machine.handle_standalone_opened();
        perform(gw, handle, s, None);
        body
    };
    crate::body::sse_response(body)
}

/// Tells the machine as soon as the host hangs up its GET stream (hyper drops the
/// body), so the upstream listen it fed is cancelled at once rather than at the next
/// keepalive. Holding a sender keeps the body open, so the watch lets go once the
/// stream is no longer this one or the session ended.
fn watch_standalone(gw: Arc<Route>, handle: Arc<SessionHandle>, watch: MeteredSender) {
    let span = tracing::debug_span!("standalone", session = %handle.tag);
    tokio::spawn(
        async move {
            let is_current = |s: &Shared| {
                s.streams
                    .get(&PeerStream::Standalone)
                    .and_then(|st| st.tx.as_ref())
                    .is_some_and(|t| t.same_channel(&watch))
            };
            loop {
                tokio::select! {
                    () = watch.closed() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                let Ok(s) = handle.shared.lock() else { return };
                if !is_current(&s) || s.machine.state() == SessionState::Closed {
                    return;
                }
            }
            let Ok(mut s) = handle.shared.lock() else {
                return;
            };
            if !is_current(&s) {
                return;
            }
            if let Some(st) = s.streams.get_mut(&PeerStream::Standalone) {
                st.tx = None;
            }
            debug!("standalone stream closed by the peer");
            let _ = s.machine.handle_standalone_closed();
            perform(&gw, &handle, &mut s, None);
        }
        .instrument(span),
    );
}

/// What the in-memory store keeps beside the machine for its upstream calls, seen
/// by the driver ([`driver::CallContext`]).
struct Calls<'a> {
    call_auth: &'a mut HashMap<RequestId, HeaderValue>,
    standalone_auth: Option<&'a HeaderValue>,
    streams: &'a HashMap<PeerStream, StreamState>,
    init_trace: Option<&'a Arc<TraceContext>>,
}

impl driver::CallContext for Calls<'_> {
    fn credential(&self, legacy: Option<&RequestId>) -> Option<HeaderValue> {
        match legacy {
            Some(id) => self.call_auth.get(id).cloned(),
            None => self.standalone_auth.cloned(),
        }
    }

    fn keep_credential(&mut self, legacy: &RequestId, auth: &HeaderValue) {
        self.call_auth.insert(legacy.clone(), auth.clone());
    }

    fn trace(&self, machine: &Session, legacy: Option<&RequestId>) -> Option<Arc<TraceContext>> {
        match legacy {
            Some(id) => machine
                .request_stream(id)
                .and_then(|stream| self.streams.get(stream))
                .and_then(|st| st.trace.clone()),
            None => self.init_trace.cloned(),
        }
    }
}

/// Carries out everything the machine asked for ([`driver::plan`]) in this store:
/// messages into the streams' rings and connections, exchanges started (the first
/// one left inline for the POST handler that waits on it). Called with the session
/// lock held; never awaits. `feeding` is the `Authorization` of the host request whose
/// message was just fed, if one was.
fn perform(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    s: &mut Shared,
    feeding: Option<&HeaderValue>,
) {
    let mut plan = {
        let mut calls = Calls {
            call_auth: &mut s.call_auth,
            standalone_auth: s.standalone_auth.as_ref(),
            streams: &s.streams,
            init_trace: s.init_trace.as_ref(),
        };
        driver::plan(&mut s.machine, &mut calls, feeding)
    };
    for out in std::mem::take(&mut plan.out) {
        match out {
            Out::Message {
                stream,
                bytes,
                last,
            } => deliver(handle, s, &stream, bytes, last),
            Out::Close { stream } => {
                if let Some(st) = s.streams.get_mut(&stream) {
                    st.finished = true;
                    st.tx = None;
                    if let Some(w) = st.waiter.take() {
                        w.wake();
                    }
                }
            }
        }
    }
    for start in std::mem::take(&mut plan.starts) {
        let id = start.request.id.clone();
        let span = tracing::debug_span!(
            "upstream",
            session = %handle.tag,
            rpc.id = %id,
            role = ?start.role,
            trace_id = start.trace.as_ref().map_or("", |t| t.trace_id()),
        );
        let watch = match &s.inline {
            InlineSlot::Open(w) => Some(w.clone()),
            _ => None,
        };
        let feed = MemoryFeed {
            gw: gw.clone(),
            handle: handle.clone(),
        };
        let inline = watch.is_some();
        let (exchange, abort) = abortable(
            async move {
                driver::exchange(
                    &feed.gw,
                    &start,
                    &feed.handle.forwarded,
                    watch.as_deref(),
                    &feed,
                )
                .await;
            }
            .instrument(span),
        );
        s.upstream_tasks.insert(id, abort);
        let exchange: Exchange = Box::pin(async move {
            let _ = exchange.await;
        });
        if inline {
            s.inline = InlineSlot::Taken(exchange);
        } else {
            tokio::spawn(exchange);
        }
    }
    for (id, reason) in std::mem::take(&mut plan.cancels) {
        if let Some(h) = s.upstream_tasks.remove(&id) {
            debug!(session = %handle.tag, rpc.id = %id, reason, "upstream request cancelled");
            h.abort();
        }
    }
    plan.log(&handle.tag);
    for o in plan.observed {
        s.telemetry.observe(o, &s.machine);
    }
    trim_finished(s);
    if !s.call_auth.is_empty() {
        let machine = &s.machine;
        s.call_auth.retain(|id, _| machine.has_call(id));
    }
    rearm(gw, handle, s);
}

/// Queues one message on a stream, and wakes the POST waiting on it when the stream
/// finished or a not-yet-answered POST got its first message.
fn deliver(
    handle: &SessionHandle,
    s: &mut Shared,
    stream: &PeerStream,
    bytes: Vec<u8>,
    last: bool,
) {
    if !s.streams.contains_key(stream) {
        // A stream the peer never opened (e.g. standalone before any GET): keep the
        // events so a later GET can... no: the standalone stream only carries what is
        // sent while it is open, so open a detached one that buffers for resumption.
        open_pending(handle, s, stream.clone());
        if let Some(st) = s.streams.get_mut(stream) {
            st.pending = None;
        }
    }
    let Some(st) = s.streams.get_mut(stream) else {
        return;
    };
    let mut woke = false;
    if let Some(p) = st.pending.as_mut() {
        p.push(bytes.clone());
        woke = true;
    }
    st.seq += 1;
    let event = sse::encode(Some(&format!("{}.{}", st.number, st.seq)), &bytes);
    st.ring.push(st.seq, event.clone());
    if let Some(tx) = &st.tx {
        match tx.try_send(event) {
            Ok(()) => {}
            Err(SendError::Stalled) => {
                // The host does not read: close the connection rather than buffer
                // without bound; the session and the ring stay for Last-Event-ID.
                warn!(session = %handle.tag, stream = st.number, queued = tx.queued(), limit = handle.max_buffered, "host not reading its SSE stream: closed; events kept for resumption");
                tx.cut();
                st.tx = None;
            }
            Err(_) => {
                debug!(session = %handle.tag, stream = st.number, "stream detached (closed); events kept for resumption");
                st.tx = None;
            }
        }
    }
    if last {
        st.finished = true;
        st.tx = None;
        if !s.finished_order.contains(stream) {
            s.finished_order.push_back(stream.clone());
        }
    }
    if last || woke {
        if let Some(w) = st.waiter.take() {
            w.wake();
        }
    }
}

/// Drops a finished stream the peer got as a plain JSON response (it never saw an event
/// id, so it cannot resume it); keeping its events would only hold memory per session.
fn forget_stream(s: &mut Shared, stream: &PeerStream) {
    if let Some(st) = s.streams.remove(stream) {
        s.by_number.remove(&st.number);
    }
    s.finished_order.retain(|f| f != stream);
    if s.streams.is_empty() {
        s.streams.shrink_to_fit();
        s.by_number.shrink_to_fit();
        s.finished_order.shrink_to_fit();
    }
}

fn trim_finished(s: &mut Shared) {
    while s.finished_order.len() > FINISHED_KEPT {
        if let Some(old) = s.finished_order.pop_front() {
            if let Some(st) = s.streams.remove(&old) {
                s.by_number.remove(&st.number);
            }
        }
    }
}

/// An upstream exchange of an in-memory session feeds the machine under its lock.
struct MemoryFeed {
    gw: Arc<Route>,
    handle: Arc<SessionHandle>,
}

impl driver::Feed for MemoryFeed {
    async fn room(&self, role: &UpstreamRole) {
        room(&self.gw, &self.handle, role).await;
    }

    async fn message(&self, id: &RequestId, message: Message, _last: bool) -> bool {
        let Ok(mut s) = self.handle.shared.lock() else {
            return false;
        };
        if let Err(e) = s
            .machine
            .handle_upstream_message(Some(id.clone()), message, now())
        {
            debug!(session = %self.handle.tag, error = %e, "upstream message refused");
        }
        perform(&self.gw, &self.handle, &mut s, None);
        true
    }

    async fn ended(&self, id: &RequestId, ended: Ended) {
        let Ok(mut s) = self.handle.shared.lock() else {
            return;
        };
        s.upstream_tasks.remove(id);
        match ended {
            Ended::Done => {}
            Ended::Denied => {
                if let Ok(Denied::Round { legacy, live }) =
                    s.machine.handle_upstream_denied(id, now())
                {
                    debug!(session = %self.handle.tag, rpc.id = %legacy, live = %live, "round parked until the answer is sent again");
                }
            }
            Ended::Lost(Some((reason, message))) => {
                let _ = s
                    .machine
                    .handle_upstream_refused(id, reason, message, now());
            }
            Ended::Lost(None) => {
                let _ = s.machine.handle_upstream_lost(id, now());
            }
        }
        perform(&self.gw, &self.handle, &mut s, None);
    }
}

/// Messages a POST handler's stream may gather before the handler attaches its
/// connection (it does so as soon as the first one arrives).
const PENDING_MAX: usize = 64;

/// Waits until the host connection that an exchange's next message goes to can take
/// it: the upstream is read no faster than the host reads (DESIGN.md, "The runtime":
/// a slow host slows the upstream read; nothing is dropped). A connection that takes
/// nothing for `stalled_reader_timeout` is closed as not reading; its events stay in
/// the replay ring for `Last-Event-ID`. Streams with no connection (the host went
/// away, or has not opened its GET) keep events for resumption, bounded by the ring.
async fn room(gw: &Arc<Route>, handle: &SessionHandle, role: &UpstreamRole) {
    let deadline = tokio::time::Instant::now() + HEAD_WAIT;
    let (stream, tx) = loop {
        // One look under the lock: the stream the message goes to, and its connection.
        let (stream, tx, gathering) = {
            let Ok(s) = handle.shared.lock() else { return };
            let stream = match role {
                UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy } => {
                    match s.machine.request_stream(legacy) {
                        Some(stream) => stream.clone(),
                        None => return,
                    }
                }
                UpstreamRole::Listen => PeerStream::Standalone,
                _ => return,
            };
            let Some(st) = s.streams.get(&stream) else {
                return;
            };
            let gathering = st.pending.as_ref().is_some_and(|p| p.len() >= PENDING_MAX);
            (stream, st.tx.clone(), gathering)
        };
        match tx {
            Some(tx) => break (stream, tx),
            // The POST handler is about to attach its connection: let it.
            None if gathering && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            None => return,
        }
    };
    if tx.ready(gw.config.stalled_reader_timeout).await {
        return;
    }
    let Ok(mut s) = handle.shared.lock() else {
        return;
    };
    if let Some(st) = s.streams.get_mut(&stream) {
        if st.tx.as_ref().is_some_and(|cur| cur.same_channel(&tx)) {
            warn!(session = %handle.tag, stream = st.number, queued = tx.queued(), limit = handle.max_buffered, "host not reading its SSE stream: closed; events kept for resumption");
            tx.cut();
            st.tx = None;
        }
    }
}

/// Keeps the session's timer task in step with what it has to time. Called with the
/// session lock held, after feeding the machine and when a stream gets a connection.
///
/// An idle session (no machine deadline, no connected stream) has no timer task at
/// all: at 100k idle sessions a task each is memory and wake-ups for nothing. The
/// task is spawned when there is something to time, and ends itself when there is
/// nothing left; both decisions are taken under the session lock, through
/// `timer_at` (0: no task). A running task is woken only if the machine now needs it
/// before it would wake anyway (or the session closed): waking it after every message
/// costs a task switch per message.
fn rearm(gw: &Arc<Route>, handle: &Arc<SessionHandle>, s: &Shared) {
    let at = handle.timer_at.load(Ordering::Relaxed);
    if at == 0 {
        if s.machine.state() != SessionState::Closed && needs_timer(s) {
            // A time already past: nothing waits for this task to wake before it
            // publishes its own.
            handle.timer_at.store(1, Ordering::Relaxed);
            let timer = tokio::spawn(
                timer_loop(gw.clone(), handle.clone())
                    .instrument(tracing::info_span!("session", session = %handle.tag)),
            );
            drop(timer);
        }
        return;
    }
    let due = s.machine.poll_timeout().map(Timestamp::as_millis);
    if due.is_some_and(|t| t < at) || s.machine.state() == SessionState::Closed {
        handle.wake.notify_one();
    }
}

/// Whether the session has anything to time: a machine deadline, or a stream with a
/// connection (its keepalives).
fn needs_timer(s: &Shared) -> bool {
    s.machine.poll_timeout().is_some() || s.streams.values().any(|st| st.tx.is_some())
}

/// Per-session timers: the machine's deadlines and SSE keepalives.
async fn timer_loop(gw: Arc<Route>, handle: Arc<SessionHandle>) {
    let keepalive = gw.config.keepalive;
    let mut next_keepalive = tokio::time::Instant::now() + keepalive;
    loop {
        let (machine_at, at) = {
            let Ok(s) = handle.shared.lock() else {
                return;
            };
            if s.machine.state() == SessionState::Closed || !needs_timer(&s) {
                // Nothing left to time: the next `rearm` that finds something spawns
                // a task again.
                handle.timer_at.store(0, Ordering::Relaxed);
                return;
            }
            let machine_at = s.machine.poll_timeout().map(|t| {
                let wait = t.saturating_duration_since(now());
                tokio::time::Instant::now() + wait
            });
            let at = machine_at.map_or(next_keepalive, |m| m.min(next_keepalive));
            // Published under the lock: whoever feeds the machine next sees it.
            let in_ms = at
                .saturating_duration_since(tokio::time::Instant::now())
                .as_millis();
            // Never 0, which says there is no task.
            handle.timer_at.store(
                now()
                    .as_millis()
                    .saturating_add(u64::try_from(in_ms).unwrap_or(u64::MAX))
                    .max(1),
                Ordering::Relaxed,
            );
            (machine_at, at)
        };
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = handle.wake.notified() => continue,
        }
        let Ok(mut s) = handle.shared.lock() else {
            return;
        };
        if machine_at.is_some_and(|m| m <= tokio::time::Instant::now()) {
            s.machine.handle_timeout(now());
            perform(&gw, &handle, &mut s, None);
        }
        if tokio::time::Instant::now() >= next_keepalive {
            next_keepalive = tokio::time::Instant::now() + keepalive;
            let mut lost_standalone = false;
            for (stream, st) in s.streams.iter_mut() {
                if let Some(tx) = &st.tx {
                    match tx.try_send(sse::keepalive()) {
                        Ok(()) => {}
                        Err(e) => {
                            if e == SendError::Stalled {
                                tx.cut();
                            }
                            st.tx = None;
                            lost_standalone |= *stream == PeerStream::Standalone;
                        }
                    }
                }
            }
            if lost_standalone {
                s.standalone_auth = None;
                let _ = s.machine.handle_standalone_closed();
                perform(&gw, &handle, &mut s, None);
            }
        }
    }
}

/// Evicts idle sessions, forever (aborted at shutdown).
pub(super) async fn reap(gw: Arc<Route>) {
    let ttl = gw.config.session_idle_ttl;
    let period = (ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        tokio::time::sleep(period).await;
        let cutoff = now()
            .as_millis()
            .saturating_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let idle: Vec<String> = gw
            .legacy
            .map
            .iter()
            .filter(|e| {
                let h = e.value();
                h.last_used.load(Ordering::Relaxed) < cutoff
                    && h.shared.lock().is_ok_and(|s| {
                        s.machine.in_flight() == 0
                            && s.streams
                                .values()
                                .all(|st| st.tx.as_ref().is_none_or(|t| t.is_closed()))
                    })
            })
            .map(|e| e.key().clone())
            .collect();
        for id in idle {
            if let Some(h) = gw.legacy.remove(&id) {
                h.close();
                info!(session = %h.tag, "idle session evicted");
            }
        }
    }
}
