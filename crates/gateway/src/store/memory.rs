//! Legacy Streamable HTTP sessions in this process (the embedded default): one lock
//! per session over its machine and its SSE streams (replay rings, live connections),
//! per-session timers, idle eviction.
//!
//! Locking: each session's machine and stream table sit behind one `std` mutex that
//! is never held across an `.await`; upstream exchanges and timers take the lock only
//! to feed a message and perform the resulting plan (`driver::plan`).
//!
//! A request's first upstream exchange runs inside its own POST handler (no task
//! hand-off each way on the hot path) and is detached into a task of its own when the
//! handler stops waiting; every other exchange is a task from the start.

use crate::auth::BindingKey;
use crate::body::{full, ChannelBody, GatewayBody, MeteredSender, SendError};
use crate::driver::{self, Ended, HeadWatch, Input, Out};
use crate::forwarded::Forwarded;
use crate::legacy_http::{
    internal, machine_config, FINISHED_KEPT, FIRST_MESSAGE_WAIT, HEAD_WAIT, STREAM_QUEUE,
};
use crate::sse;
use crate::store::{
    Created, Detachable, Exchange, Feeding, Held, Lookup, NotCreated, OwnHasher, Served,
    SessionStore, StepError, StepState, Stepped, StoreError,
};
use crate::telemetry::{SessionTelemetry, WIRE_HTTP};
use crate::trace::TraceContext;
use crate::{GatewayConfig, Route};
use bytes::Bytes;
use dashmap::DashMap;
use dualera_adapters::replay::ReplayRing;
use dualera_adapters::usage::Feature;
use dualera_adapters::{
    Config as MachineConfig, Denied, Message, PeerStream, RequestId, Session, SessionState,
    Timestamp, UpstreamRole,
};
use futures_util::future::{abortable, AbortHandle};
use http::header::{self, HeaderValue};
use http::Response;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{debug, info, warn, Instrument};

/// The machine's clock: the process's monotonic milliseconds ([`crate::clock`]).
pub(crate) fn now() -> Timestamp {
    Timestamp::from_millis(crate::clock::now_ms())
}

/// Who a session counts against for `max_sessions_per_caller`: its binding, and for a
/// caller without credentials also its peer address ([`BindingKey::caller`]), so that
/// local hosts do not share one bound.
pub(crate) type Binding = BindingKey;

// Maps keyed by a peer's request ids (`streams`, `call_auth`) or by callers
// (`per_caller`) keep SipHash; see [`OwnHasher`].

/// Live legacy sessions.
#[derive(Debug)]
pub(crate) struct Sessions {
    /// By session id. Only ids the gateway minted (random) are inserted, so a peer's
    /// chosen `Mcp-Session-Id` cannot crowd a bucket: foldhash, not SipHash.
    /// The key is the handle's own `id`, shared (one copy of the id per session).
    map: DashMap<Arc<str>, Arc<SessionHandle>, OwnHasher>,
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
    pub(crate) fn new(config: &GatewayConfig) -> Self {
        Self {
            map: DashMap::default(),
            per_caller: DashMap::new(),
            machine: Arc::new(machine_config(config)),
            max_sessions: config.max_sessions,
            max_per_caller: config.max_sessions_per_caller,
        }
    }

    /// Closes every session (gateway shutdown).
    pub(crate) fn close_all(&self) {
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
    fn evict_idlest(&self, caller: Option<&Binding>) -> Option<Box<str>> {
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

    /// A machine for a new session of a single-channel wire (`transport`), with ids
    /// of its own.
    pub(crate) fn wire_machine(&self, transport: &str) -> Session {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "dualera-{transport}{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Session::with_shared_config(self.machine.clone(), prefix)
    }

    /// How many sessions are live.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
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
    /// Before the POST handler decides between JSON and SSE: the messages so far, as
    /// JSON. They become SSE events (in `ring`, numbered from 1) only if the answer is
    /// a stream; a request answered with one JSON body is never SSE-encoded.
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
    by_number: HashMap<u64, PeerStream, OwnHasher>,
    finished_order: VecDeque<PeerStream>,
    next_stream: u64,
    upstream_tasks: HashMap<RequestId, AbortHandle, OwnHasher>,
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
    /// A `GET` holds the standalone stream and has not attached yet ([`Hold`]).
    standalone_held: bool,
}

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

impl std::fmt::Debug for InlineSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Closed => "Closed",
            Self::Open(_) => "Open",
            Self::Taken(_) => "Taken",
        })
    }
}

/// A session's state while a step holds its lock ([`SessionStore::step`]).
pub(crate) struct StepOn<'s> {
    handle: &'s SessionHandle,
    s: &'s mut Shared,
    /// The stream the step opened: forgotten again if the machine refuses the input.
    opened: Option<PeerStream>,
}

impl StepState for StepOn<'_> {
    fn machine(&mut self) -> &mut Session {
        &mut self.s.machine
    }

    fn busy(&self, peer: &PeerStream) -> bool {
        self.s.streams.get(peer).is_some_and(|st| !st.finished)
    }

    fn started(&mut self, id: &RequestId) {
        self.s.telemetry.request_started(id);
    }

    fn open_standalone(&mut self, auth: Option<&HeaderValue>) -> (u64, u64) {
        let stream = PeerStream::Standalone;
        if !self.s.streams.contains_key(&stream) {
            // Announced by its priming event from the start: never answered as JSON.
            open_pending(self.handle, self.s, stream.clone(), false, None);
        }
        self.s.telemetry.feature(Feature::GetStream);
        self.s.standalone_auth = auth.cloned();
        self.s
            .streams
            .get(&stream)
            .map_or((0, 0), |st| (st.number, st.seq))
    }

    fn close_standalone(&mut self) {
        if let Some(st) = self.s.streams.get_mut(&PeerStream::Standalone) {
            st.tx = None;
        }
        self.s.standalone_auth = None;
    }

    fn open(
        &mut self,
        peer: &PeerStream,
        trace: Option<&Arc<TraceContext>>,
        // Kept by `perform` for the calls this step starts (`driver::CallContext`).
        _auth: Option<&HeaderValue>,
    ) -> u64 {
        self.opened = Some(peer.clone());
        open_pending(self.handle, self.s, peer.clone(), true, trace.cloned())
    }
}

/// The standalone stream held for a `GET` until it attaches; dropped before that (the
/// `GET` went away, or was refused), the hold goes.
pub(crate) struct Hold(Option<Arc<SessionHandle>>);

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(Ok(mut s)) = self.0.as_ref().map(|h| h.shared.lock()) {
            s.standalone_held = false;
        }
    }
}

/// A POST waiting for its stream's first message: the stream, once the step opened it.
pub(crate) struct Post(Option<PeerStream>);

/// Closes the inline slot, taking the exchange `perform` left there, if any.
fn take_inline(s: &mut Shared) -> Detachable {
    match std::mem::replace(&mut s.inline, InlineSlot::Closed) {
        InlineSlot::Taken(exchange) => Detachable(Some(exchange)),
        InlineSlot::Open(_) | InlineSlot::Closed => Detachable(None),
    }
}

/// A legacy session: the machine, its streams, and what binds it to its caller.
#[derive(Debug)]
pub(crate) struct SessionHandle {
    id: Arc<str>,
    /// What logs show instead of the id (a bearer secret): [`crate::digest::log_tag`].
    tag: Box<str>,
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

    fn new_machine(&self, sid: &str) -> Session {
        let prefix = format!("dualera-{}", crate::digest::log_tag(sid));
        Session::with_shared_config(self.machine.clone(), prefix)
    }

    fn now(&self) -> Timestamp {
        now()
    }

    async fn create(&self, gw: &Arc<Route>, created: Created) -> Result<(), NotCreated> {
        let Created {
            sid,
            machine,
            observed,
            init: (init_id, arrived),
            auth,
            forwarded,
            trace,
            peer,
        } = created;
        let binding = BindingKey::of(gw.config.session_binding, auth.as_ref());
        let caller = binding.caller(auth.is_none(), peer);
        self.admit(&caller).map_err(|refused| match refused {
            Refused::Full => NotCreated::Full,
            Refused::CallerFull => NotCreated::CallerFull,
        })?;
        let tag = crate::digest::log_tag(&sid);
        let mut telemetry = gw.telemetry.session(WIRE_HTTP);
        telemetry.request_started_at(&init_id, arrived);
        for o in observed {
            telemetry.observe(o, &machine);
        }
        let handle = Arc::new(SessionHandle {
            id: sid.as_str().into(),
            tag: tag.as_str().into(),
            binding,
            caller,
            anonymous: auth.is_none(),
            forwarded,
            shared: Mutex::new(Shared {
                machine,
                streams: HashMap::new(),
                by_number: HashMap::default(),
                finished_order: VecDeque::new(),
                next_stream: 0,
                upstream_tasks: HashMap::default(),
                inline: InlineSlot::Closed,
                telemetry,
                init_trace: trace,
                call_auth: HashMap::new(),
                standalone_auth: None,
                standalone_held: false,
            }),
            last_used: AtomicU64::new(now().as_millis()),
            timer_at: AtomicU64::new(0),
            wake: Notify::new(),
            replay: gw.config.replay_buffer,
            replay_bytes: gw.config.replay_buffer_bytes,
            max_buffered: gw.config.max_buffered_bytes,
        });
        if let Ok(s) = handle.shared.lock() {
            // The machine's first deadline, if it has one, from now on.
            rearm(gw, &handle, &s);
        }
        self.insert(handle);
        info!(session = %tag, sessions = self.len(), "legacy session opened");
        Ok(())
    }

    type State<'s> = StepOn<'s>;
    type Post = Post;
    type Hold = Hold;

    async fn resume(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        number: u64,
        after: u64,
    ) -> Result<Response<GatewayBody>, StepError<()>> {
        handle.touch();
        let Ok(mut s) = handle.shared.lock() else {
            return Err(StepError::Broken);
        };
        resume(gw, handle, &mut s, number, after).ok_or(StepError::Refused(()))
    }

    async fn hold(&self, handle: &Arc<SessionHandle>) -> Result<Hold, Held> {
        let Ok(mut s) = handle.shared.lock() else {
            return Err(Held::Failed(StepError::Broken));
        };
        let connected = s
            .streams
            .get(&PeerStream::Standalone)
            .is_some_and(|st| st.tx.as_ref().is_some_and(|t| !t.is_closed()));
        if connected || s.standalone_held {
            return Err(Held::Conflict);
        }
        s.standalone_held = true;
        Ok(Hold(Some(handle.clone())))
    }

    async fn release(&self, _handle: &Arc<SessionHandle>, hold: Hold) {
        drop(hold);
    }

    fn attach(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        mut hold: Hold,
        number: u64,
        seq: u64,
    ) -> Response<GatewayBody> {
        // Let go here, under the lock below, not by `Drop` (which takes the lock).
        drop(hold.0.take());
        let Ok(mut s) = handle.shared.lock() else {
            return internal();
        };
        let Some(st) = s.streams.get_mut(&PeerStream::Standalone) else {
            return internal();
        };
        // The priming event names where the step opened the stream; what the stream
        // carried since (the ring) follows it.
        let backlog = std::iter::once(sse::prime(&format!("{number}.{seq}")))
            .chain(st.ring.after(seq).cloned())
            .collect();
        let (tx, body) = ChannelBody::metered(backlog, STREAM_QUEUE, handle.max_buffered);
        watch_standalone(gw.clone(), handle.clone(), tx.clone());
        st.tx = Some(tx);
        // Connected: the hold is no longer what keeps a second GET out.
        s.standalone_held = false;
        rearm(gw, handle, &s);
        crate::body::sse_response(body)
    }

    fn anonymous(&self, handle: &Arc<SessionHandle>) -> bool {
        handle.anonymous
    }

    async fn step<I, T, R, F>(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        feeding: Feeding<'_>,
        input: I,
        mut feed: F,
    ) -> Stepped<T, R>
    where
        I: Clone + Send + Sync,
        T: Send,
        R: Send,
        F: for<'s> FnMut(&mut StepOn<'s>, I, Timestamp) -> Result<T, R> + Send,
    {
        handle.touch();
        let Ok(mut s) = handle.shared.lock() else {
            return Stepped {
                fed: Err(StepError::Broken),
                exchange: Detachable(None),
            };
        };
        if s.machine.state() == SessionState::Closed {
            // Ended (DELETE, eviction) after the front found it: 404, as for any
            // session that ended.
            return Stepped {
                fed: Err(StepError::NotFound {
                    anonymous: handle.anonymous,
                }),
                exchange: Detachable(None),
            };
        }
        if let Some(head) = feeding.head {
            s.inline = InlineSlot::Open(head.clone());
        }
        let mut on = StepOn {
            handle,
            s: &mut s,
            opened: None,
        };
        let fed = feed(&mut on, input, now()).map_err(StepError::Refused);
        let opened = on.opened.take();
        if fed.is_err() {
            // Nothing but the observation of the refusal changes: a stream the step
            // opened goes again.
            if let Some(stream) = opened {
                forget_stream(&mut s, &stream);
            }
        }
        // Performed even when refused: the machine's observation of it (an overload
        // counts) is recorded.
        perform(gw, handle, &mut s, feeding.auth);
        Stepped {
            fed,
            exchange: take_inline(&mut s),
        }
    }

    fn post(&self, _handle: &Arc<SessionHandle>) -> Post {
        Post(None)
    }

    fn bind(&self, _handle: &Arc<SessionHandle>, post: &mut Post, peer: &PeerStream) {
        post.0 = Some(peer.clone());
    }

    async fn first_message(
        &self,
        handle: &Arc<SessionHandle>,
        post: &mut Post,
        inline: &mut Detachable,
        head: Option<&HeadWatch>,
    ) {
        let Some(stream) = &post.0 else {
            return;
        };
        let denied = || head.is_some_and(HeadWatch::denied);
        let ready = |st: &StreamState| {
            st.finished || st.pending.as_ref().is_none_or(|p| !p.is_empty()) || denied()
        };
        wait_stream(handle, stream, FIRST_MESSAGE_WAIT, inline, ready).await;
        if let Some(head) = head {
            if inline.0.is_some() && !head.settled() {
                let more = HEAD_WAIT.saturating_sub(FIRST_MESSAGE_WAIT);
                wait_stream(handle, stream, more, inline, |st| {
                    ready(st) || head.settled()
                })
                .await;
            }
        }
    }

    async fn respond(
        &self,
        gw: &Arc<Route>,
        handle: &Arc<SessionHandle>,
        post: Post,
        _number: u64,
    ) -> Response<GatewayBody> {
        let (Some(stream), Ok(mut s)) = (&post.0, handle.shared.lock()) else {
            return internal();
        };
        respond_on(gw, handle, &mut s, stream)
    }

    fn forget(&self, handle: &Arc<SessionHandle>, post: Post) {
        if let (Some(stream), Ok(mut s)) = (&post.0, handle.shared.lock()) {
            forget_stream(&mut s, stream);
        }
    }

    async fn end(&self, _gw: &Arc<Route>, h: &Arc<SessionHandle>) -> Result<(), StepError<()>> {
        // Another DELETE (or eviction) ended it since the front found it.
        if self.remove(&h.id).is_none() {
            return Err(StepError::NotFound {
                anonymous: h.anonymous,
            });
        }
        h.close();
        Ok(())
    }

    fn tag<'a>(&self, h: &'a Arc<SessionHandle>) -> Cow<'a, str> {
        Cow::Borrowed(&h.tag)
    }

    fn served(&self, h: &Arc<SessionHandle>, what: Served<'_>) {
        match what {
            Served::Request(id, method) => {
                debug!(session = %h.tag, rpc.id = %id, method = %dualera_adapters::echo::echo(method), "legacy request served");
            }
            Served::Message(kind) => {
                debug!(session = %h.tag, method = kind, "legacy message served")
            }
            Served::Delete => info!(session = %h.tag, "session deleted by the peer"),
        }
    }
}

/// Opens a stream towards the peer: its number. `pending`: its messages are kept as
/// JSON until its POST decides between JSON and SSE ([`StreamState::pending`]).
fn open_pending(
    handle: &SessionHandle,
    s: &mut Shared,
    stream: PeerStream,
    pending: bool,
    trace: Option<Arc<TraceContext>>,
) -> u64 {
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
            pending: pending.then(Vec::new),
            finished: false,
            waiter: None,
            trace,
        },
    );
    number
}

/// Waits until `ready` holds for the stream (or it is gone), up to `limit`, while
/// driving the caller's inline exchange.
///
/// The waker is parked in the stream itself and cleared before the exchange is
/// polled: a message the exchange delivers during that poll must not wake the task
/// that is running it, because a task woken during its own poll is requeued as a
/// yield, which makes the runtime wake an idle worker for nothing (twice per request
/// before this was done, per `perf record -e sched:sched_wakeup`). Over HTTP/1 the
/// listener's `SelfWakes` would absorb such a wake too (the handler runs in the
/// connection's task); over HTTP/2 each stream's handler is a task of its own, which
/// that wrapper does not cover, so the clearing here is what avoids the yield.
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
    // Answered as a stream: what it carried so far becomes its first events.
    for (seq, message) in (1..).zip(&pending) {
        let event = sse::encode(Some(&format!("{}.{seq}", st.number)), message);
        st.ring.push(seq, event);
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

/// `GET` with `Last-Event-ID`: stream `number` again after event `after`, on this
/// connection; `None` when the session has no such stream to resume.
fn resume(
    gw: &Arc<Route>,
    handle: &Arc<SessionHandle>,
    s: &mut Shared,
    number: u64,
    after: u64,
) -> Option<Response<GatewayBody>> {
    let stream = s.by_number.get(&number).cloned()?;
    // A stream still `pending` was never announced to the peer (its events are not
    // encoded yet): it cannot be resumed.
    let st = s
        .streams
        .get_mut(&stream)
        .filter(|st| st.pending.is_none())?;
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
    Some(crate::body::sse_response(body))
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
        let id = start.id.clone();
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
        // Boxed where it is built: the exchange's future is large (the upstream stack's
        // futures inline), and every wrapper taking it by value (the abort handle, the
        // boxed `Exchange`) would copy all of it again.
        let exchange: Exchange = Box::pin(
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
        let (exchange, abort) = abortable(exchange);
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
    plan.log(|| &*handle.tag);
    for o in plan.observed {
        s.telemetry.observe(o, &s.machine);
    }
    trim_finished(s);
    if !s.call_auth.is_empty() {
        let machine = &s.machine;
        s.call_auth.retain(|id, _| machine.has_call(id));
    }
    if s.machine.in_flight() == 0 {
        shrink_idle(s);
    }
    rearm(gw, handle, s);
}

/// An idle session keeps no table sized for its busiest moment (the machine does the
/// same for its own, [`Session::poll_event`]): emptied maps keep their capacity.
fn shrink_idle(s: &mut Shared) {
    if s.upstream_tasks.is_empty() && s.upstream_tasks.capacity() != 0 {
        s.upstream_tasks.shrink_to_fit();
    }
    if s.call_auth.is_empty() && s.call_auth.capacity() != 0 {
        s.call_auth.shrink_to_fit();
    }
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
        // A stream the peer never opened (the standalone one before any GET): opened
        // detached, its events kept in the ring for a resumption.
        open_pending(handle, s, stream.clone(), false, None);
    }
    let Some(st) = s.streams.get_mut(stream) else {
        return;
    };
    st.seq += 1;
    let woke = if let Some(p) = st.pending.as_mut() {
        // Not yet answered: JSON or SSE is decided by `respond_on`, which encodes the
        // events then if it is SSE. Nothing is attached to read them before that.
        p.push(bytes);
        true
    } else {
        let event = sse::encode(Some(&format!("{}.{}", st.number, st.seq)), &bytes);
        st.ring.push(st.seq, event.clone());
        push_live(handle, st, event);
        false
    };
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

/// Sends one event to the stream's attached connection, if any.
fn push_live(handle: &SessionHandle, st: &mut StreamState, event: Bytes) {
    let Some(tx) = &st.tx else {
        return;
    };
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
        let on = Some(id.clone());
        feed(&self.gw, &self.handle, Input::Upstream { on, message })
    }

    async fn ended(&self, id: &RequestId, ended: Ended) {
        let id = id.clone();
        feed(&self.gw, &self.handle, Input::Ended { id, ended });
    }
}

/// Feeds one input that no host request carries ([`driver::feed`]) under the
/// session's lock, and performs what it asked for; false when the lock is unusable.
fn feed(gw: &Arc<Route>, handle: &Arc<SessionHandle>, input: Input) -> bool {
    let Ok(mut s) = handle.shared.lock() else {
        return false;
    };
    if let Input::Ended { id, .. } = &input {
        s.upstream_tasks.remove(id);
    }
    match driver::feed(&mut s.machine, input, now()) {
        Ok(Some(Denied::Round { legacy, live })) => {
            debug!(session = %handle.tag, rpc.id = %legacy, live = %live, "round parked until the answer is sent again");
        }
        Ok(_) => {}
        Err(e) => debug!(session = %handle.tag, error = %e, "input refused by the machine"),
    }
    perform(gw, handle, &mut s, None);
    true
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
        if machine_at.is_some_and(|m| m <= tokio::time::Instant::now())
            && !feed(&gw, &handle, Input::Timer)
        {
            return;
        }
        if tokio::time::Instant::now() >= next_keepalive {
            let Ok(mut s) = handle.shared.lock() else {
                return;
            };
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
pub(crate) async fn reap(gw: Arc<Route>) {
    let ttl = gw.config.session_idle_ttl;
    let period = (ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        tokio::time::sleep(period).await;
        let cutoff = now()
            .as_millis()
            .saturating_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let idle: Vec<Arc<str>> = gw
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
