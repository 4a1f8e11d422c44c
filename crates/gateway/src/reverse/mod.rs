//! The reverse bridge's gateway side: a 2026-07-28 host request on a route whose
//! upstream is a legacy (session-based) server is served by the sans-IO reverse
//! machine ([`dualera_adapters::reverse`]) over a pooled legacy session (DESIGN.md,
//! "Reverse bridge").
//!
//! ```text
//!   POST (modern) ─► handle ─► partition (principal, capabilities, upstream) ─► its task
//!                     ▲            (`partition`: machine + pooled legacy session)
//!                     └── JSON answer, or input_required + sealed requestState (`seal`)
//! ```
//!
//! Partitions are keyed like the pool's sessions ([`PoolKey`]: a digest of the
//! credentials, the declared client capabilities, the upstream), so two tokens never
//! share a legacy session; each holds the principal ([`auth::BindingKey`]) its round
//! states are bound to. A retry is routed by the session its verified state names, not
//! by its credentials: a retry that changed credentials reaches the round it answers
//! and the machine refuses it for the principal. Their number is bounded by the pool's
//! total bound. An answer is JSON, or an SSE stream when the server sends notifications
//! for the request (progress, log lines at the host's level) before its result.

mod envelope;
mod forward;
mod inflight;
mod partition;
pub mod seal;
pub mod stats;

use super::auth::BindingKey;
use super::forwarded::Forwarded;
use super::passthrough::status_only;
use super::telemetry::ConnectionTelemetry;
use super::trace::TraceContext;
use super::upstream::legacy::{LegacyError, LegacyTransport, PoolKey};
use super::{body, GatewayBody, RequestBody, Route};
use crate::header_names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};
use crate::request_state::StateCodec;
use dualera_adapters::jsonrpc::{self, ErrorCode, ErrorObject, Message, Request};
use dualera_adapters::reverse::{
    host_error, Config, HostFailure, HostKey, HostRequest, OpenedState, Partition, StateMismatch,
};
use dualera_adapters::session::{META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_SUBSCRIPTION_ID};
use dualera_adapters::time::Timestamp;
use dualera_adapters::usage::Method;
use http::header::{self, HeaderValue};
use http::{Request as HttpRequest, Response as HttpResponse, StatusCode};
use partition::{Answer, Command, Opener, Relay, Reply};
use seal::StateKeys;
use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};
use stats::Outcome;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The bridge's clock: the machines' timestamps are [`crate::clock`] readings, and
/// the wall time of round states and sealed `requestState`s is that reading plus the
/// Unix time at the clock's zero, taken once ([`Config::unix_at_zero_ms`]), so that
/// the machine's expiry and the codec's agree and never go backwards.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    unix_at_zero_ms: u64,
}

impl Clock {
    fn new() -> Self {
        Self {
            unix_at_zero_ms: crate::clock::unix_at_zero_ms(),
        }
    }

    /// Unix milliseconds now, as the codec and round states count.
    fn now_ms(&self) -> u64 {
        self.unix_at_zero_ms.saturating_add(crate::clock::now_ms())
    }

    /// The machine's timestamp now.
    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::from_millis(crate::clock::now_ms())
    }

    /// The tokio instant of a machine timestamp (a past one: now; at most a day
    /// ahead).
    pub(crate) fn instant(&self, t: Timestamp) -> tokio::time::Instant {
        let ahead = t.as_millis().saturating_sub(crate::clock::now_ms());
        tokio::time::Instant::now() + Duration::from_millis(ahead.min(86_400_000))
    }
}

/// A partition's task as the handlers see it.
#[derive(Clone)]
struct Handle {
    /// The machine's session name (routing key of retries).
    name: Arc<str>,
    commands: mpsc::Sender<Command>,
}

#[derive(Default)]
struct Registry {
    by_key: HashMap<PoolKey, Handle>,
    by_name: HashMap<Arc<str>, Handle>,
}

/// The reverse bridge of a gateway (shared by its routes): the state codec and the
/// partitions.
pub struct Bridge {
    codec: StateCodec,
    ttl: Duration,
    clock: Clock,
    next_host: AtomicU64,
    registry: Arc<Mutex<Registry>>,
    /// Host requests waiting, for the host's `notifications/cancelled`.
    inflight: inflight::InFlight,
    /// What the metrics read.
    stats: stats::Stats,
    /// Sends retries on to the replica holding their round.
    forwarder: forward::Forwarder,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("codec", &self.codec)
            .field("partitions", &self.partitions())
            .finish()
    }
}

impl Bridge {
    /// A bridge sealing with `keys` (random ones when empty) for `ttl`.
    pub fn new(keys: &StateKeys, ttl: Duration) -> Self {
        Self {
            codec: seal::codec(keys, ttl),
            ttl,
            clock: Clock::new(),
            next_host: AtomicU64::new(0),
            registry: Arc::default(),
            inflight: inflight::InFlight::default(),
            stats: stats::Stats::default(),
            forwarder: forward::Forwarder::default(),
        }
    }

    /// Partitions (legacy sessions driven by the bridge) alive.
    pub fn partitions(&self) -> usize {
        self.registry.lock().map_or(0, |r| r.by_key.len())
    }

    fn by_name(&self, name: &str) -> Option<Handle> {
        self.registry.lock().ok()?.by_name.get(name).cloned()
    }

    fn by_key(&self, key: &PoolKey) -> Option<Handle> {
        let handle = self.registry.lock().ok()?.by_key.get(key).cloned()?;
        (!handle.commands.is_closed()).then_some(handle)
    }
}

/// SHA-256, hex: the machine's arguments digest.
fn sha256_hex(bytes: &[u8]) -> String {
    crate::digest::hex(&Sha256::digest(bytes))
}

/// The principal round states bind and cancellations are matched by: the digest of
/// the request's binding key.
fn principal_of(gw: &Route, authorization: Option<&HeaderValue>) -> String {
    crate::digest::hex(BindingKey::of(gw.config.session_binding, authorization).as_bytes())
}

/// Serves one 2026-07-28 request on a route whose upstream is a legacy server over
/// `transport`.
///
/// The host gets its row in the migration report as any modern host does (its
/// `_meta.clientInfo`, the revision it sent), on a route the report names as having a
/// legacy upstream.
pub(super) async fn handle(
    gw: &Arc<Route>,
    connection: &ConnectionTelemetry,
    req: HttpRequest<RequestBody>,
    transport: LegacyTransport,
    forwarded: Forwarded,
) -> HttpResponse<GatewayBody> {
    let started = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let revision = parts
        .headers
        .get(&MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let method = parts
        .headers
        .get(&MCP_METHOD)
        .and_then(|v| v.to_str().ok())
        .map_or(Method::Other, Method::from_name);
    let bytes = match super::passthrough::read_body(body, gw.config.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    gw.telemetry.identify(connection, &revision, &bytes);
    let response = handle_read(gw, &parts, &bytes, transport, forwarded).await;
    gw.telemetry
        .passthrough(connection, method, &revision, response.status(), started);
    response
}

/// [`handle`] for a request whose body was read already (a pass-through request found
/// to be for a legacy upstream only once the upstream refused it).
pub(super) async fn handle_read(
    gw: &Arc<Route>,
    parts: &http::request::Parts,
    bytes: &[u8],
    transport: LegacyTransport,
    forwarded: Forwarded,
) -> HttpResponse<GatewayBody> {
    let request = match jsonrpc::parse(bytes) {
        Ok(Message::Request(r)) => r,
        Ok(Message::Notification(n)) => {
            // Cancellation is the host closing its request's stream; a host that
            // says it with `notifications/cancelled` as well is heard the same way.
            if let Some(id) = n.cancelled_request() {
                let authorization = parts.headers.get(header::AUTHORIZATION);
                let principal = principal_of(gw, authorization);
                let cancelled = gw.reverse.inflight.cancel(&principal, &id);
                if cancelled {
                    gw.reverse.stats.cancelled();
                }
                tracing::debug!(route = %gw.path, request = ?id, cancelled, "host cancellation");
            }
            return status_only(StatusCode::ACCEPTED);
        }
        // Responses have nothing to answer in this revision.
        Ok(_) => return status_only(StatusCode::ACCEPTED),
        Err(e) => return json(StatusCode::BAD_REQUEST, &Message::Response(e.to_response())),
    };
    // What the legacy messages this request causes carry (`X-Forwarded-*` or
    // `Forwarded`, the trace context of its headers or its `_meta`), as in the
    // forward direction.
    let trace = TraceContext::from_headers(&parts.headers)
        .or_else(|| TraceContext::from_meta(request.params.as_ref()));
    let relay = Relay { forwarded, trace };
    let version = parts
        .headers
        .get(&MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok());
    let header =
        |name: &http::header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let routing = envelope::Routing {
        method: header(&MCP_METHOD),
        name: header(&MCP_NAME),
    };
    if let Err(e) = envelope::check(&request.method, request.params.as_ref(), version, routing) {
        let method = Method::from_name(&request.method).as_str();
        gw.reverse.stats.request(&gw.path, method, Outcome::Invalid);
        return answer(jsonrpc::Response::error(Some(request.id), e));
    }
    let authorization = parts.headers.get(header::AUTHORIZATION).cloned();
    let principal = principal_of(gw, authorization.as_ref());
    let span = tracing::debug_span!(
        "reverse_request",
        route = %gw.path,
        method = %request.method,
        request = ?request.id,
        round = tracing::field::Empty,
    );
    use tracing::Instrument;
    let retry = forward::Retry { parts, bytes };
    serve(
        gw,
        request,
        authorization,
        principal,
        transport,
        relay,
        retry,
    )
    .instrument(span)
    .await
}

async fn serve(
    gw: &Arc<Route>,
    request: Request,
    authorization: Option<HeaderValue>,
    principal: String,
    transport: LegacyTransport,
    relay: Relay,
    retry: forward::Retry<'_>,
) -> HttpResponse<GatewayBody> {
    let bridge = &gw.reverse;
    let id = request.id.clone();
    let params: Map<String, Value> = match request.params {
        None => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            let e = ErrorObject::new(ErrorCode::INVALID_PARAMS, "params must be an object");
            return answer(jsonrpc::Response::error(Some(id), e));
        }
    };
    let binding = seal::binding(&principal, &request.method, &params);
    let now_ms = bridge.clock.now_ms();
    // A retry goes to the machine its verified state names.
    let (state, handle) = match params.get("requestState") {
        None => (OpenedState::Absent, None),
        Some(token) => {
            let opened = token
                .as_str()
                .ok_or(StateMismatch::Invalid)
                .and_then(|t| seal::open(&bridge.codec, t, &binding, now_ms));
            let routed = opened.and_then(|o| match bridge.by_name(&o.state.session) {
                Some(h) => Ok(Routed::Here(o.state, h)),
                None => elsewhere(gw, o.owner, &retry.parts.headers),
            });
            match routed {
                Ok(Routed::Here(s, h)) => {
                    tracing::Span::current().record("round", s.round);
                    (OpenedState::Opened(s), Some(h))
                }
                Ok(Routed::Owner(shared, owner)) => {
                    return forward_retry(gw, &shared, &owner, &request.method, &id, retry).await;
                }
                Err(m) => {
                    let method = Method::from_name(&request.method).as_str();
                    bridge.stats.request(&gw.path, method, Outcome::Refused);
                    let e = host_error(&HostFailure::State(m));
                    return answer(jsonrpc::Response::error(Some(id), e));
                }
            }
        }
    };
    let meta = params.get("_meta").and_then(Value::as_object);
    let capabilities = meta
        .and_then(|m| m.get(META_CLIENT_CAPABILITIES))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let handle = match handle {
        Some(h) => h,
        None => {
            let client_info = meta
                .and_then(|m| m.get(META_CLIENT_INFO))
                .cloned()
                .unwrap_or(Value::Null);
            let key = PoolKey::new(
                authorization.as_ref(),
                &capabilities,
                &gw.era_target().key(),
            );
            match partition_for(
                gw,
                key,
                authorization,
                &principal,
                capabilities,
                client_info,
                transport,
            )
            .await
            {
                Ok(h) => h,
                Err(Opening::Denied(denial)) => return denial.response(),
                Err(Opening::Failed(reason)) => {
                    let e = host_error(&HostFailure::Unusable { reason });
                    return answer(jsonrpc::Response::error(Some(id), e));
                }
            }
        }
    };
    let host = HostKey(bridge.next_host.fetch_add(1, Ordering::Relaxed));
    let host_request = HostRequest {
        host,
        id: id.clone(),
        method: request.method.clone(),
        params,
        principal: principal.clone(),
        state,
    };
    let (answer_tx, mut answered) = oneshot::channel();
    let (notify_tx, mut notifications) = mpsc::channel(partition::NOTIFICATION_QUEUE);
    let reply = Reply {
        notifications: notify_tx,
        answer: answer_tx,
        relay,
    };
    if handle
        .commands
        .try_send(Command::Request(Box::new(host_request), reply))
        .is_err()
    {
        let e = host_error(&HostFailure::QueueFull {
            limit: partition::COMMAND_QUEUE,
        });
        return answer(jsonrpc::Response::error(Some(id), e));
    }
    // Dropped with this future (or the stream's task) too: a host that leaves
    // cancels its call upstream.
    bridge
        .inflight
        .insert(&principal, &id, host, handle.commands.clone());
    let mut gone = Gone {
        commands: handle.commands.clone(),
        host,
        armed: true,
        bridge: bridge.clone(),
        principal,
        id: id.clone(),
    };
    let deadline = tokio::time::Instant::now() + gw.config.live_request_timeout_max;
    let sealer = Sealer {
        bridge: gw.reverse.clone(),
        owner: gw.redis.as_ref().map(|s| s.replica().to_owned()),
        binding,
        listen: request.method == "subscriptions/listen",
        route: gw.path.clone(),
        method: Method::from_name(&request.method).as_str(),
    };
    // 2026-07-28 transports: the answer to a POST is one JSON response, or an SSE
    // stream when messages precede it. JSON unless a notification comes first.
    let first = tokio::select! {
        biased;
        n = notifications.recv() => n,
        a = &mut answered => {
            gone.disarm();
            if let Ok(Answer::Denied(denial)) = a {
                return sealer.denied(&denial);
            }
            return answer(sealer.finish(&id, a.ok()));
        }
        () = tokio::time::sleep_until(deadline) => {
            return answer(sealer.lapsed(&id));
        }
    };
    let Some(first) = first else {
        // The partition dropped the request's senders: its answer is final now.
        gone.disarm();
        return match answered.await {
            Ok(Answer::Denied(denial)) => sealer.denied(&denial),
            a => answer(sealer.finish(&id, a.ok())),
        };
    };
    let (out, stream) = body::ChannelBody::channel(partition::NOTIFICATION_QUEUE);
    tokio::spawn(async move {
        let mut next = Some(first);
        loop {
            if let Some(message) = next.take() {
                if !put(&out, &message).await {
                    return; // The host left or stopped reading: `gone` cancels its call.
                }
            }
            tokio::select! {
                biased;
                n = notifications.recv() => match n {
                    Some(m) => next = Some(m),
                    None => break,
                },
                a = &mut answered => {
                    // What was queued before the answer goes first.
                    while let Ok(m) = notifications.try_recv() {
                        if !put(&out, &m).await {
                            return;
                        }
                    }
                    gone.disarm();
                    let last = Message::Response(sealer.finish(&id, a.ok()));
                    let _ = put(&out, &last).await;
                    return;
                }
                () = tokio::time::sleep_until(deadline) => break,
                // The host closed the stream while nothing was being sent (a quiet
                // listener, a call waiting for the server): `gone` cancels it.
                () = out.closed() => return,
            }
        }
        // The wait ran out (or the partition ended): `gone`, still armed, cancels the
        // call upstream or ends the listener (its upstream subscriptions with it).
        let last = match answered.try_recv().ok() {
            Some(a) => {
                gone.disarm();
                sealer.finish(&id, Some(a))
            }
            None => sealer.lapsed(&id),
        };
        let _ = put(&out, &Message::Response(last)).await;
    });
    body::sse_response(stream)
}

/// Where a retry's round is.
enum Routed {
    /// In a partition task of this replica.
    Here(dualera_adapters::reverse::RoundState, Handle),
    /// In another replica's, reached through the shared store's registration.
    Owner(Arc<crate::store::redis::RedisSessions>, String),
}

/// The round of a retry this replica does not hold: another replica's when the sealed
/// owner names one and the retry was not forwarded already (one hop at most: a
/// forwarded retry whose round is not here is refused, never sent on); else a round
/// of a session that is gone.
fn elsewhere(
    gw: &Route,
    owner: Option<String>,
    headers: &http::HeaderMap,
) -> Result<Routed, StateMismatch> {
    let (Some(shared), Some(owner)) = (gw.redis.as_ref(), owner) else {
        return Err(StateMismatch::OtherSession);
    };
    if owner == shared.replica() {
        // Sealed here, and its partition ended (idle, or the session failed).
        return Err(StateMismatch::OtherSession);
    }
    if let Some(by) = headers.get(forward::HOP_HEADER) {
        tracing::warn!(by = ?by, %owner, "reverse bridge: a forwarded retry whose round is not here; not forwarded again");
        return Err(StateMismatch::OtherSession);
    }
    Ok(Routed::Owner(shared.clone(), owner))
}

/// Sends a retry on to `owner` and relays its answer; an owner that is gone is the
/// host's `sessionLost`, at once.
async fn forward_retry(
    gw: &Arc<Route>,
    shared: &crate::store::redis::RedisSessions,
    owner: &str,
    method: &str,
    id: &jsonrpc::RequestId,
    retry: forward::Retry<'_>,
) -> HttpResponse<GatewayBody> {
    let bridge = &gw.reverse;
    let metric = Method::from_name(method).as_str();
    let wait = gw.config.live_request_timeout_max + Duration::from_secs(5);
    let forwarded = bridge
        .forwarder
        .forward(
            shared,
            owner,
            retry,
            wait,
            gw.config.max_body_bytes.max(1 << 20),
        )
        .await;
    match forwarded {
        Ok(response) => {
            tracing::debug!(%owner, status = response.status().as_u16(), "retry forwarded to the replica holding its round");
            bridge.stats.request(&gw.path, metric, Outcome::Forwarded);
            response
        }
        Err(e) => {
            tracing::warn!(%owner, error = %e, "reverse bridge: the replica holding the round is gone");
            bridge.stats.request(&gw.path, metric, Outcome::Refused);
            let e = host_error(&HostFailure::State(StateMismatch::SessionLost));
            answer(jsonrpc::Response::error(Some(id.clone()), e))
        }
    }
}

/// Puts one event on a host request's SSE stream once it has room, waiting up to
/// [`partition::STALLED_READER_TIMEOUT`]; false when the host left or stopped reading.
async fn put(out: &mpsc::Sender<bytes::Bytes>, message: &Message) -> bool {
    let frame = crate::sse::encode(None, &message.to_vec());
    let sent = tokio::time::timeout(partition::STALLED_READER_TIMEOUT, out.send(frame)).await;
    matches!(sent, Ok(Ok(())))
}

/// Turns a partition's answer into the host's response: an `input_required`
/// result gets its sealed `requestState`.
struct Sealer {
    bridge: Arc<Bridge>,
    /// This replica, sealed beside the round when replicas share a store.
    owner: Option<String>,
    binding: crate::request_state::Binding,
    /// The request is a `subscriptions/listen`.
    listen: bool,
    /// For the metrics.
    route: Arc<str>,
    method: &'static str,
}

impl Sealer {
    /// The answer of a request whose wait ran out: a listener's stream ends
    /// gracefully (2026-07-28 `basic/patterns/subscriptions`, "Graceful Closure": a
    /// server ending a subscription SHOULD answer the `subscriptions/listen` request
    /// with a complete result carrying the subscription id); any other request gets
    /// the error of an answer that did not come.
    fn lapsed(&self, id: &jsonrpc::RequestId) -> jsonrpc::Response {
        if self.listen {
            let result = json!({
                "resultType": "complete",
                "_meta": { META_SUBSCRIPTION_ID: id.to_value() },
            });
            let stats = &self.bridge.stats;
            stats.request(&self.route, self.method, Outcome::Complete);
            return jsonrpc::Response::result(id.clone(), result);
        }
        self.finish(id, None)
    }

    /// The upstream's refusal of the credentials, as it is.
    fn denied(&self, denial: &crate::upstream::Denial) -> HttpResponse<GatewayBody> {
        let stats = &self.bridge.stats;
        stats.request(&self.route, self.method, Outcome::Denied);
        denial.response()
    }

    fn finish(&self, id: &jsonrpc::RequestId, outcome: Option<Answer>) -> jsonrpc::Response {
        let response = self.finish_inner(id, outcome);
        let outcome = match &response.outcome {
            Ok(r) if r.get("resultType").and_then(Value::as_str) == Some("input_required") => {
                Outcome::InputRequired
            }
            Ok(_) => Outcome::Complete,
            Err(e)
                if e.data.as_ref().and_then(|d| d.get("reason"))
                    == Some(&json!("upstreamLost")) =>
            {
                Outcome::Lost
            }
            Err(_) => Outcome::Error,
        };
        self.bridge.stats.request(&self.route, self.method, outcome);
        response
    }

    fn finish_inner(&self, id: &jsonrpc::RequestId, outcome: Option<Answer>) -> jsonrpc::Response {
        match outcome {
            Some(Answer::Response(r)) => r,
            Some(Answer::InputRequired { id, result, state }) => {
                let now = self.bridge.clock.now_ms();
                let Some(token) = seal::seal(
                    &self.bridge.codec,
                    &self.binding,
                    &state,
                    self.owner.as_deref(),
                    now,
                ) else {
                    let e = host_error(&HostFailure::Unusable {
                        reason: "the round state could not be sealed".into(),
                    });
                    return jsonrpc::Response::error(Some(id), e);
                };
                let mut result = result;
                if let Some(r) = result.as_object_mut() {
                    r.insert("requestState".into(), Value::String(token));
                }
                jsonrpc::Response::result(id, result)
            }
            // On a stream already begun the status cannot change: the refusal is an
            // error like any lost answer.
            Some(Answer::Denied(_)) | None => {
                jsonrpc::Response::error(Some(id.clone()), host_error(&HostFailure::UpstreamLost))
            }
        }
    }
}

/// Tells the partition a host request left, unless it was answered; the request no
/// longer waits either way.
struct Gone {
    commands: mpsc::Sender<Command>,
    host: HostKey,
    armed: bool,
    bridge: Arc<Bridge>,
    principal: String,
    id: jsonrpc::RequestId,
}

impl Gone {
    /// The request was answered: nothing to tell.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Gone {
    fn drop(&mut self) {
        self.bridge
            .inflight
            .remove(&self.principal, &self.id, self.host);
        if self.armed {
            self.bridge.stats.cancelled();
            let _ = self.commands.try_send(Command::Gone(self.host));
        }
    }
}

/// Why a partition could not be had.
enum Opening {
    /// The upstream refused the credentials while the session was opened (the
    /// HTTP+SSE stream's GET): relayed as it is.
    Denied(Box<crate::upstream::Denial>),
    /// Anything else, for the host's error.
    Failed(String),
}

impl From<String> for Opening {
    fn from(reason: String) -> Self {
        Self::Failed(reason)
    }
}

/// The partition of `key`, its task started when it has none.
async fn partition_for(
    gw: &Arc<Route>,
    key: PoolKey,
    authorization: Option<HeaderValue>,
    principal: &str,
    capabilities: Value,
    client_info: Value,
    transport: LegacyTransport,
) -> Result<Handle, Opening> {
    let bridge = &gw.reverse;
    if let Some(h) = bridge.by_key(&key) {
        return Ok(h);
    }
    let pool = gw.upstream_sessions().clone();
    let max = pool.limits().max_sessions;
    if bridge.partitions() >= max {
        return Err(Opening::Failed(format!(
            "Too many upstream sessions; try again later (limit {max})"
        )));
    }
    let opener = Opener {
        pool: pool.clone(),
        key: key.clone(),
        target: gw.era_target().clone(),
        transport,
        authorization,
    };
    let lease = opener.open().await.map_err(|e| match e {
        LegacyError::Upstream(crate::upstream::UpstreamError::Denied(d)) => Opening::Denied(d),
        e => Opening::Failed(e.to_string()),
    })?;
    let mut name = [0u8; 16];
    getrandom::fill(&mut name).map_err(|e| Opening::Failed(e.to_string()))?;
    let name: Arc<str> = Arc::from(crate::digest::hex(&name));
    let (commands, rx) = mpsc::channel(partition::COMMAND_QUEUE);
    let handle = Handle {
        name: name.clone(),
        commands,
    };
    // Another request of the partition may have opened it meanwhile: then its task
    // serves this one too and the session just opened goes back.
    let existing = {
        let Ok(mut r) = bridge.registry.lock() else {
            return Err(Opening::Failed("the reverse bridge is poisoned".into()));
        };
        match r.by_key.get(&key).filter(|h| !h.commands.is_closed()) {
            Some(h) => Some(h.clone()),
            None => {
                r.by_key.insert(key.clone(), handle.clone());
                r.by_name.insert(name.clone(), handle.clone());
                None
            }
        }
    };
    if let Some(h) = existing {
        pool.discard(lease).await;
        return Ok(h);
    }
    let mut config = Config::new(sha256_hex);
    config.retry_wait = bridge.ttl;
    config.unix_at_zero_ms = bridge.clock.unix_at_zero_ms;
    config.list_ttl = gw.config.bridge_list_ttl;
    config.public_cache = gw.config.bridge_cache_public;
    let machine = dualera_adapters::reverse::LegacySession::new(
        config,
        Partition {
            session: name.to_string(),
            principal: principal.to_owned(),
            capabilities,
            client_info,
        },
        bridge.clock.now(),
    );
    let task = partition::Partition::new(lease, opener, bridge.clock, pool.limits().idle, rx);
    let registry = bridge.registry.clone();
    tokio::spawn(partition::run(machine, task, move || {
        if let Ok(mut r) = registry.lock() {
            if r.by_key.get(&key).is_some_and(|h| h.name == name) {
                r.by_key.remove(&key);
            }
            r.by_name.remove(&name);
        }
    }));
    Ok(handle)
}

/// The JSON answer to a host request, with the status the modern server would use.
fn answer(response: jsonrpc::Response) -> HttpResponse<GatewayBody> {
    let message = Message::Response(response);
    let status = super::passthrough::status_for(&message);
    json(status, &message)
}

fn json(status: StatusCode, message: &Message) -> HttpResponse<GatewayBody> {
    let mut r = HttpResponse::new(body::full(message.to_vec()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clocks_wall_time_is_the_machine_time_plus_the_unix_time_at_zero() {
        let clock = Clock {
            unix_at_zero_ms: 1_700_000_000_000,
        };
        let machine = clock.now().as_millis();
        let wall = clock.now_ms();
        // Read one after the other: the same instant within a little.
        let offset = wall - machine;
        assert!(
            (1_700_000_000_000..1_700_000_000_000 + 1000).contains(&offset),
            "{offset}"
        );
        assert!(clock.now_ms() >= wall, "wall time never goes backwards");
        // A real clock's wall time is today's.
        let real = Clock::new();
        let unix = SystemTimeNow::ms();
        assert!(
            real.now_ms().abs_diff(unix) < 1000,
            "{} {unix}",
            real.now_ms()
        );
    }

    #[test]
    fn a_deadline_becomes_the_instant_that_far_ahead_and_a_past_one_now() {
        let clock = Clock::new();
        let now = tokio::time::Instant::now();
        let ahead = clock.instant(clock.now().saturating_add(Duration::from_secs(5)));
        let d = ahead.duration_since(now);
        assert!(
            d >= Duration::from_millis(4900) && d <= Duration::from_millis(5100),
            "{d:?}"
        );
        let past = clock.instant(Timestamp::from_millis(0));
        assert!(past.duration_since(now) < Duration::from_millis(100));
        // Far-future deadlines are capped at a day (a timer must not overflow).
        let far = clock.instant(Timestamp::from_millis(u64::MAX));
        assert!(far.duration_since(now) <= Duration::from_secs(86_400) + Duration::from_secs(1));
    }

    struct SystemTimeNow;

    impl SystemTimeNow {
        fn ms() -> u64 {
            let d = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970");
            u64::try_from(d.as_millis()).expect("fits")
        }
    }
}
