//! Legacy Streamable HTTP (2025-03-26 … 2025-11-25), the front every session store
//! shares: the `Origin`/version checks, the session lookup and its binding, the body
//! and the envelope; then each operation — `initialize`, a request's POST, a batch, a
//! notification or reply, `DELETE`, the standalone `GET` — written once over the
//! store's narrow part (`store::SessionStore`: a new machine and its creation once the
//! driver's handshake made it ready, a step, a POST's wait and answer, the standalone
//! stream's hold); and the answers every store gives alike (refusals, `404`,
//! `Last-Event-ID` parsing).
//!
//! Where the sessions live — this process (`store::memory`) or Redis
//! (`store::redis`) — is the store's business; what their machines' events mean is the
//! driver's (`driver`).

use super::driver::{self, HeadWatch};
use super::forwarded::Forwarded;
use super::store::{
    Created, Fed, Feeding, Held, Lookup, NotCreated, Served, SessionStore, StepError, StepState,
    Stepped, StoreError,
};
use super::trace::TraceContext;
use super::{text, GatewayConfig, Route};
use crate::body::{empty, full, GatewayBody};
use crate::header_names::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::inbound::RequestBody;
use bytes::Bytes;
use dualera_adapters::jsonrpc::{self, Incoming as Parsed};
use dualera_adapters::{
    Config as MachineConfig, ErrorCode, ErrorObject, Message, PeerStream, ProtocolVersion,
    RequestId, Response as RpcResponse, SessionState,
};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

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
        r.headers_mut().insert(MCP_SESSION_ID, v);
    }
    r
}

/// Handles one legacy request (POST, GET or DELETE on `/mcp`), in whichever store
/// holds the gateway's sessions: that store's future, boxed once. A future is as
/// large as the largest path it could take, and boxing moves (copies) all of it:
/// one future over both stores would make the in-memory path copy the Redis one's
/// size, and boxing it inside another box made every shared request copy twice.
pub(super) fn handle(
    gw: &Arc<Route>,
    req: Request<RequestBody>,
    forwarded: Forwarded,
) -> Pin<Box<dyn Future<Output = Response<GatewayBody>> + Send + '_>> {
    match gw.redis.as_ref() {
        Some(shared) => Box::pin(front(gw, shared, req, forwarded)),
        None => Box::pin(front(gw, &gw.legacy, req, forwarded)),
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
    if let Some(v) = req.headers().get(&MCP_PROTOCOL_VERSION) {
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
    // Borrowed from the request's head, which lives as long as this call.
    let session_header = req
        .headers()
        .get(&MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok());
    let existing = match session_header {
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
            Some(h) => match last_event_id(req.headers()) {
                Some((number, after)) => resume(gw, store, &h, number, after, auth.as_ref()).await,
                None => standalone(gw, store, &h, auth).await,
            },
            None => rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required".into(),
            ),
        },
        Method::DELETE => match existing {
            Some(h) => delete(gw, store, &h, auth.as_ref()).await,
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
                // Once per session, and large: boxed, out of every request's future.
                Box::pin(initialize(gw, store, r, cx)).await
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
        Parsed::Single(Message::Request(r)) => request(gw, store, &handle, r, body, cx).await,
        Parsed::Single(other) => message(gw, store, &handle, other, body, cx.auth).await,
        Parsed::Batch(items) => batch(gw, store, &handle, items, cx).await,
    }
}

/// `initialize` without a session: the machine's handshake with the upstream runs
/// before any store keeps the session, and the store admits it only once it is ready.
async fn initialize<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    init: dualera_adapters::Request,
    cx: PostContext,
) -> Response<GatewayBody> {
    let PostContext {
        auth,
        forwarded,
        trace,
        peer,
    } = cx;
    let arrived = std::time::Instant::now();
    let init_id = init.id.clone();
    let Some(sid) = mint_session_id() else {
        return internal();
    };
    let mut machine = store.new_machine(&sid);
    if let Some(d) = crate::cache::legacy::discover_for_initialize(&gw.cache, auth.as_ref()) {
        let _ = machine.handle_discover_shared(d);
    }
    if let Err(e) = machine.handle_peer_message(Message::Request(init), store.now()) {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            Some(init_id),
            ErrorCode::INVALID_REQUEST,
            format!("Invalid request: {e}"),
        );
    }
    let handshake = driver::handshake(
        gw,
        &mut machine,
        auth.as_ref(),
        trace.as_ref(),
        &forwarded,
        || store.now(),
    );
    let (answer, observed) = match tokio::time::timeout(INIT_WAIT, handshake).await {
        Ok(Ok(driver::Handshake {
            answer: Some(answer),
            observed,
        })) => (answer, observed),
        Ok(Err(denial)) => {
            // The upstream refused the caller's credentials: its status and challenge
            // go back as they are, and no session is minted.
            info!(
                status = denial.status.as_u16(),
                "initialize refused by the upstream"
            );
            return denial.response();
        }
        Ok(Ok(driver::Handshake { answer: None, .. })) | Err(_) => {
            return rpc_error(
                StatusCode::GATEWAY_TIMEOUT,
                Some(init_id),
                ErrorCode::INTERNAL_ERROR,
                "the upstream server did not answer in time".into(),
            )
        }
    };
    let mut response = Response::new(full(answer));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if machine.state() != SessionState::Ready {
        // A failed initialize leaves no session behind; the request is counted all
        // the same (its outcome and duration).
        let mut telemetry = gw.telemetry.session(crate::telemetry::WIRE_HTTP);
        telemetry.request_started_at(&init_id, arrived);
        for o in observed {
            telemetry.observe(o, &machine);
        }
        return response;
    }
    let created = Created {
        sid,
        machine,
        observed,
        init: (init_id.clone(), arrived),
        auth,
        forwarded,
        trace,
        peer,
    };
    let sid = created.sid.clone();
    match store.create(gw, created).await {
        Ok(()) => with_session_header(response, &sid),
        Err(NotCreated::Full) => sessions_refused(
            Some(init_id),
            StatusCode::SERVICE_UNAVAILABLE,
            gw.config.max_sessions,
        ),
        Err(NotCreated::CallerFull) => sessions_refused(
            Some(init_id),
            StatusCode::TOO_MANY_REQUESTS,
            gw.config.max_sessions_per_caller,
        ),
        Err(NotCreated::Store(e)) => store_unavailable(Some(init_id), &e),
    }
}

/// A body that read as one message, read again ([`Fed`]).
fn single(body: &[u8]) -> Option<Message> {
    match jsonrpc::parse_incoming(body) {
        Ok(Parsed::Single(m)) => Some(m),
        _ => None,
    }
}

/// A body that read as one request, read again ([`Fed`]).
fn single_request(body: &[u8]) -> Option<dualera_adapters::Request> {
    match single(body) {
        Some(Message::Request(r)) => Some(r),
        _ => None,
    }
}

/// Why a step refused a host message.
enum Refusal {
    /// A request whose stream is still open: its id is in use.
    Busy,
    /// The machine's reason.
    Machine(dualera_adapters::SessionError),
    /// Its body did not read as it did the first time ([`Fed::take`]).
    Unreadable,
}

/// A request on a session: JSON when answered at once, else an SSE stream.
async fn request<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    r: dualera_adapters::Request,
    body: Bytes,
    cx: PostContext,
) -> Response<GatewayBody> {
    let PostContext { auth, trace, .. } = cx;
    let id = r.id.clone();
    let peer = PeerStream::Request(id.clone());
    let mut post = store.post(session);
    let head = Arc::new(HeadWatch::default());
    let feeding = Feeding {
        auth: auth.as_ref(),
        head: Some(&head),
    };
    store.served(session, Served::Request(&id, &r.method));
    let Stepped { fed, mut exchange } = store
        .step(
            gw,
            session,
            feeding,
            Fed::new(r, body, single_request),
            |state, r, now| {
                if state.busy(&peer) {
                    return Err(Refusal::Busy);
                }
                let r = r.take().ok_or(Refusal::Unreadable)?;
                state.started(&id);
                let number = state.open(&peer, trace.as_ref(), auth.as_ref());
                store.bind(session, &mut post, &peer);
                let machine = state.machine();
                match machine.handle_peer_message(Message::Request(r), now) {
                    Ok(()) => Ok((number, machine.has_call(&id))),
                    Err(e) => Err(Refusal::Machine(e)),
                }
            },
        )
        .await;
    let (number, forwarded) = match fed {
        Ok(fed) => fed,
        Err(StepError::Refused(Refusal::Busy)) => {
            // Refused before the machine sees it (its stream must survive), in the
            // machine's own words, as every other wire says it.
            let e = dualera_adapters::SessionError::DuplicateRequestId { id: id.clone() };
            return refusal(Some(id), &e);
        }
        Err(StepError::Refused(Refusal::Machine(e))) => {
            info!(session = %store.tag(session), error = %e, "request refused");
            return refusal(Some(id), &e);
        }
        Err(StepError::Refused(Refusal::Unreadable)) => return internal(),
        Err(e) => return step_failed(gw, auth.as_ref(), Some(id), e.map_refused(drop)).await,
    };
    // A request answered without any live round gets a plain JSON response. Nothing
    // is committed before the upstream accepted the exchange: its 401/403 must reach
    // the host as HTTP on this POST.
    store
        .first_message(
            session,
            &mut post,
            &mut exchange,
            forwarded.then_some(&*head),
        )
        .await;
    drop(exchange);
    if let Some(denial) = head.finish() {
        store.forget(session, post);
        return denial.response();
    }
    store.respond(gw, session, post, number).await
}

/// A JSON-RPC batch (2025-03-26): its responses as one JSON array, or an SSE stream
/// when they take longer; `202` when it held only notifications and replies. Its
/// upstream calls carry its token; a 401/403 for one of them reaches the host as that
/// element's error in the batch's answer (one HTTP answer for many).
async fn batch<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    items: Vec<Result<Message, jsonrpc::EnvelopeError>>,
    cx: PostContext,
) -> Response<GatewayBody> {
    let PostContext { auth, trace, .. } = cx;
    let mut post = store.post(session);
    let feeding = Feeding {
        auth: auth.as_ref(),
        head: None,
    };
    let Stepped { fed, mut exchange } = store
        .step(gw, session, feeding, items, |state, items, now| {
            for item in &items {
                if let Ok(Message::Request(r)) = item {
                    state.started(&r.id);
                }
            }
            let outcome = state.machine().handle_peer_batch(items, now)?;
            // Its stream is known only once the machine numbered the batch.
            let number = outcome.batch.map(|b| {
                let peer = PeerStream::Batch(b);
                let number = state.open(&peer, trace.as_ref(), auth.as_ref());
                store.bind(session, &mut post, &peer);
                number
            });
            Ok::<_, dualera_adapters::SessionError>((number, outcome.refused))
        })
        .await;
    let (number, refused) = match fed {
        Ok(fed) => fed,
        Err(StepError::Refused(e)) => return refusal(None, &e),
        Err(e) => return step_failed(gw, auth.as_ref(), None, e.map_refused(drop)).await,
    };
    for e in &refused {
        warn!(session = %store.tag(session), error = %e, "batch element refused");
    }
    let Some(number) = number else {
        return accepted();
    };
    store
        .first_message(session, &mut post, &mut exchange, None)
        .await;
    drop(exchange);
    store.respond(gw, session, post, number).await
}

/// `GET` with `Last-Event-ID`: stream `number` again after event `after` (the
/// event ids are `number.seq`, see [`last_event_id`]), or why not.
async fn resume<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    number: u64,
    after: u64,
    auth: Option<&HeaderValue>,
) -> Response<GatewayBody> {
    match store.resume(gw, session, number, after).await {
        Ok(stream) => stream,
        Err(StepError::Refused(())) => rpc_error(
            StatusCode::NOT_FOUND,
            None,
            ErrorCode::INVALID_REQUEST,
            "Unknown Last-Event-ID: that stream can no longer be resumed".into(),
        ),
        Err(e) => step_failed(gw, auth, None, e).await,
    }
}

/// `GET` without `Last-Event-ID`: the session's standalone stream, one connection at a
/// time.
async fn standalone<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    auth: Option<HeaderValue>,
) -> Response<GatewayBody> {
    let hold = match store.hold(session).await {
        Ok(hold) => hold,
        Err(Held::Conflict) => {
            return rpc_error(
                StatusCode::CONFLICT,
                None,
                ErrorCode::INVALID_REQUEST,
                "Conflict: this session already has a GET stream open".into(),
            )
        }
        Err(Held::Failed(e)) => return step_failed(gw, auth.as_ref(), None, e).await,
    };
    let head = Arc::new(HeadWatch::default());
    let feeding = Feeding {
        auth: auth.as_ref(),
        head: Some(&head),
    };
    let Stepped { fed, mut exchange } = store
        .step(gw, session, feeding, (), |state, (), _now| {
            let at = state.open_standalone(auth.as_ref());
            state.machine().handle_standalone_opened().map(|()| at)
        })
        .await;
    let (number, seq) = match fed {
        Ok(at) => at,
        Err(e) => {
            store.release(session, hold).await;
            return match e {
                StepError::Refused(e) => refusal(None, &e),
                e => step_failed(gw, auth.as_ref(), None, e.map_refused(drop)).await,
            };
        }
    };
    // Opening the stream may start `subscriptions/listen` with this GET's token: its
    // 401/403 answers the GET, and the stream is closed again. Without one, the
    // upstream is asked about the token all the same (a bound session only).
    let mut denied = None;
    if exchange.0.is_some() {
        exchange.wait_head(&head).await;
    } else if Arc::strong_count(&head) > 1 {
        head.settle(HEAD_WAIT).await;
    } else if auth.is_some() && !store.anonymous(session) {
        denied = super::auth::upstream_denial(gw, auth.as_ref())
            .await
            .map(Box::new);
    }
    drop(exchange);
    if let Some(denial) = head.finish().or(denied) {
        store.release(session, hold).await;
        let closed = store
            .step(gw, session, Feeding::default(), (), |state, (), _now| {
                state.close_standalone();
                state.machine().handle_standalone_closed()
            })
            .await;
        if let Err(StepError::Store(e)) = closed.fed {
            warn!(error = %e, "standalone stream close not recorded");
        }
        return denial.response();
    }
    store.attach(gw, session, hold, number, seq)
}

/// The answer to a step that could not run: the session is gone for this caller, the
/// store failed, or its state is unusable (a refused input is answered by its caller,
/// in the machine's words). `id`: the request's, for its JSON-RPC error.
async fn step_failed(
    gw: &Arc<Route>,
    auth: Option<&HeaderValue>,
    id: Option<RequestId>,
    e: StepError<()>,
) -> Response<GatewayBody> {
    match e {
        StepError::NotFound { anonymous } => session_missing(gw, auth, anonymous).await,
        StepError::Store(e) => store_unavailable(id, &e),
        StepError::Broken | StepError::Refused(()) => internal(),
    }
}

/// A notification or a reply to a live request: `202`, or `400` when refused.
async fn message<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    message: Message,
    body: Bytes,
    auth: Option<HeaderValue>,
) -> Response<GatewayBody> {
    let head = Arc::new(HeadWatch::default());
    let kind = match &message {
        Message::Response(_) => "reply",
        _ => "notification",
    };
    let feeding = Feeding {
        auth: auth.as_ref(),
        head: Some(&head),
    };
    let Stepped { fed, mut exchange } = store
        .step(
            gw,
            session,
            feeding,
            Fed::new(message, body, single),
            |state, m, now| {
                let m = m.take().ok_or(Refusal::Unreadable)?;
                state
                    .machine()
                    .handle_peer_message(m, now)
                    .map_err(Refusal::Machine)
            },
        )
        .await;
    store.served(session, Served::Message(kind));
    match fed {
        Ok(()) => {
            // An answer that completes a round starts the upstream retry on behalf
            // of this POST: a 401/403 for it answers this POST, and the round waits
            // for the answer again.
            if exchange.0.is_some() {
                exchange.wait_head(&head).await;
            } else if Arc::strong_count(&head) > 1 {
                head.settle(HEAD_WAIT).await;
            }
            drop(exchange);
            match head.finish() {
                Some(denial) => denial.response(),
                None => accepted(),
            }
        }
        // A reply to a live request the gateway gave up on: accepted, dropped.
        Err(StepError::Refused(Refusal::Machine(e))) if e.is_dropped() => {
            debug!(session = %store.tag(session), error = %e, "late or duplicate reply dropped");
            accepted()
        }
        Err(StepError::Refused(Refusal::Machine(e))) => {
            warn!(session = %store.tag(session), error = %e, "peer message refused");
            refusal(None, &e)
        }
        Err(StepError::Refused(Refusal::Busy | Refusal::Unreadable)) => internal(),
        Err(e) => step_failed(gw, auth.as_ref(), None, e.map_refused(drop)).await,
    }
}

/// `DELETE`: the session ends; `200`.
async fn delete<S: SessionStore>(
    gw: &Arc<Route>,
    store: &S,
    session: &S::Session,
    auth: Option<&HeaderValue>,
) -> Response<GatewayBody> {
    match store.end(gw, session).await {
        Ok(()) => {
            store.served(session, Served::Delete);
            let mut r = Response::new(empty());
            *r.status_mut() = StatusCode::OK;
            r
        }
        Err(e) => step_failed(gw, auth, None, e).await,
    }
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

/// A GET's `Last-Event-ID` as (stream number, sequence number): the event ids this
/// gateway mints are `N.SEQ`, unique across the streams of a session (2025-11-25
/// `basic/transports.mdx`, Resumability). Anything else is no resumption.
pub(super) fn last_event_id(headers: &http::HeaderMap) -> Option<(u64, u64)> {
    let (a, b) = headers
        .get(&LAST_EVENT_ID)?
        .to_str()
        .ok()?
        .split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}
