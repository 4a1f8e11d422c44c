//! The one driver of the legacy session machine: what every store and every wire
//! shares when it feeds `adapters::Session` and carries out what it asked for.
//!
//! The machine lives in three places between its inputs — under a lock in the
//! in-memory Streamable HTTP store (`store::memory`), in Redis (`store::redis`, a
//! load and compare-and-set per input), owned by a task on the single-channel wires
//! (`pipe`: stdio, WebSocket, HTTP+SSE, through [`run`]) — but what its inputs and its
//! events mean is decided here, once:
//!
//! - [`feed`] feeds every input no host request carries: an upstream message, how an
//!   upstream exchange ended, the machine's deadline. (A host's messages are fed by
//!   the front of its wire: `legacy_http`, written once over the store trait, and
//!   `pipe`.)
//! - [`plan`] drains the machine after a step into a [`Plan`]: the messages for the
//!   peer in order, the upstream exchanges to start with what each carries (the
//!   credentials and trace context of the host request that caused it, DESIGN.md
//!   "Remote upstreams"), the cancellations, and what to log and record. The store
//!   decides only *where* these go: into a connection and replay ring, into a Redis
//!   transaction, onto a pipe.
//! - [`exchange`] runs one upstream exchange to its end: messages go back through a
//!   [`Feed`], each one after the host's connection has room for it (a slow host
//!   slows the upstream read; nothing is dropped), and the end — answered, lost,
//!   refused, the credentials denied — is told to the same [`Feed`].
//!
//! Credentials are parameters here: the `Authorization` of the host request being fed
//! comes in as `feeding`, and what a store keeps for the calls no host request causes
//! (a paused round's retry, the subscription stream) is read and written through
//! [`CallContext`], not through fields the driver reaches into.

use super::auth::fingerprint;
use super::forwarded::Forwarded;
use super::trace::TraceContext;
use super::upstream::{Denial, OnBehalf, Outbound, UpstreamError};
use super::Route;
use dualera_adapters::reverse;
use dualera_adapters::session::Denied;
use dualera_adapters::{Event, Failure, Message, PeerStream, RequestId, Session, UpstreamRole};
use dualera_adapters::{Observation, Request, SessionError, SessionState, Timestamp};
use http::header::HeaderValue;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// What a store keeps beside the machine for the upstream calls it makes: the
/// credentials of the legacy requests in flight and the trace contexts of the HTTP
/// requests that carried them.
pub(super) trait CallContext {
    /// The credential kept for `legacy`, or for the standalone stream (`None`).
    fn credential(&self, legacy: Option<&RequestId>) -> Option<HeaderValue>;
    /// Keeps `auth` as the credential of `legacy`'s later calls.
    fn keep_credential(&mut self, legacy: &RequestId, auth: &HeaderValue);
    /// The trace context of the HTTP request that carried `legacy`, or that opened
    /// the session (`None`, for the `server/discover` it causes).
    fn trace(&self, machine: &Session, legacy: Option<&RequestId>) -> Option<Arc<TraceContext>>;
}

/// A context that does not change: a single-channel wire's (one credential for the
/// session's life, the request that opened it; no HTTP request per message to take a
/// trace from), or a session still being opened (the `initialize` POST's).
pub(crate) struct Fixed<'a> {
    pub(crate) auth: Option<&'a HeaderValue>,
    pub(crate) trace: Option<&'a Arc<TraceContext>>,
}

impl CallContext for Fixed<'_> {
    fn credential(&self, _: Option<&RequestId>) -> Option<HeaderValue> {
        self.auth.cloned()
    }
    fn keep_credential(&mut self, _: &RequestId, _: &HeaderValue) {}
    fn trace(&self, _: &Session, _: Option<&RequestId>) -> Option<Arc<TraceContext>> {
        self.trace.cloned()
    }
}

/// One message (or the end) of a stream towards the peer.
#[derive(Debug)]
pub(super) enum Out {
    /// A message; `last` when it is the response that ends its request's stream.
    Message {
        stream: PeerStream,
        bytes: Vec<u8>,
        last: bool,
    },
    /// The stream ends without a last message of its own.
    Close { stream: PeerStream },
}

/// An upstream exchange to start, with everything it carries.
#[derive(Debug)]
pub(super) struct Start {
    pub(super) role: UpstreamRole,
    /// The upstream request's id.
    pub(super) id: RequestId,
    /// The upstream request, built once (`Message::Request`), and its text once
    /// written (a lease's record and the transport share it).
    pub(super) message: Outbound,
    /// `Mcp-Param-*` headers.
    pub(super) headers: Vec<(String, String)>,
    /// The `Authorization` it carries.
    pub(super) auth: Option<HeaderValue>,
    pub(super) trace: Option<Arc<TraceContext>>,
}

/// What one step of the machine asked for, in the order it asked.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) out: Vec<Out>,
    pub(super) starts: Vec<Start>,
    /// Upstream requests to cancel, with why.
    pub(super) cancels: Vec<(RequestId, &'static str)>,
    /// Legacy requests that failed, and tools left out of `tools/list`: logged once
    /// the step took effect (a Redis step may be tried more than once).
    pub(super) notes: Vec<Note>,
    pub(super) observed: Vec<Observation>,
}

/// A log line a step leaves ([`Plan::log`]).
#[derive(Debug)]
pub(super) enum Note {
    Failed { legacy: RequestId, failure: Failure },
    ToolRejected { tool: String, reason: String },
}

impl Plan {
    /// Logs what the step left to say, for the session tagged `tag()` (asked only
    /// when there is something to log: a tag may be a digest to work out).
    pub(super) fn log<T: AsRef<str>>(&mut self, tag: impl FnOnce() -> T) {
        if self.notes.is_empty() {
            return;
        }
        let tag = tag();
        let session = tag.as_ref();
        for note in self.notes.drain(..) {
            match note {
                Note::Failed { legacy, failure } => {
                    info!(session, rpc.id = %legacy, failure = %failure, "legacy request failed");
                }
                Note::ToolRejected { tool, reason } => {
                    warn!(
                        session,
                        tool, reason, "upstream tool left out of tools/list"
                    );
                }
            }
        }
    }
}

/// Drains the machine's events after a step into a [`Plan`]. `feeding` is the
/// `Authorization` of the host request whose message was just fed, if one was.
pub(super) fn plan(
    machine: &mut Session,
    cx: &mut impl CallContext,
    feeding: Option<&HeaderValue>,
) -> Plan {
    let mut plan = Plan::default();
    while let Some(event) = Machine::poll_event(machine) {
        plan.add(event, machine, cx, feeding);
    }
    plan
}

impl Plan {
    /// Plans one event of the machine, in the order it came.
    pub(super) fn add(
        &mut self,
        event: Event,
        machine: &Session,
        cx: &mut impl CallContext,
        feeding: Option<&HeaderValue>,
    ) {
        let plan = self;
        match event {
            Event::ToPeer { stream, message } => {
                let last = matches!(&message, Message::Response(r) if matches!(&stream, PeerStream::Request(id) if r.id.as_ref() == Some(id)));
                plan.out.push(Out::Message {
                    stream,
                    bytes: message.to_vec(),
                    last,
                });
            }
            Event::ToPeerBatch { stream, messages } => {
                let values: Vec<Value> = messages.iter().map(Message::to_value).collect();
                plan.out.push(Out::Message {
                    stream,
                    bytes: serde_json::to_vec(&Value::Array(values)).unwrap_or_default(),
                    last: true,
                });
            }
            Event::CloseStream { stream } => plan.out.push(Out::Close { stream }),
            Event::ToUpstream { role, request } => {
                let headers = machine.upstream_headers(&request);
                if let (
                    Some(a),
                    UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy },
                ) = (feeding, &role)
                {
                    cx.keep_credential(legacy, a);
                }
                let (auth, trace) = carried(&role, &request, machine, cx, feeding);
                plan.starts.push(Start {
                    role,
                    id: request.id.clone(),
                    message: Message::Request(request).into(),
                    headers,
                    auth,
                    trace,
                });
            }
            Event::CancelUpstream { id, reason } => plan.cancels.push((id, reason)),
            Event::RequestFailed { legacy, failure } => {
                plan.notes.push(Note::Failed { legacy, failure });
            }
            Event::ToolRejected { tool, reason } => {
                plan.notes.push(Note::ToolRejected { tool, reason });
            }
            Event::Observed(o) => plan.observed.push(o),
            _ => {}
        }
    }
}

/// What an upstream call of `role` carries: its credentials and trace context.
///
/// DESIGN.md, "Remote upstreams": every upstream call carries the `Authorization` of
/// the host request that caused it (`feeding`); a call no host request causes (a
/// retry after a live round's pause, a `tools/list` refresh, a lease taken over) the
/// latest one of the same legacy request, the subscription stream the open GET's.
/// The trace context is that of the HTTP request that carried the legacy request,
/// else the request's own `_meta.traceparent`.
pub(super) fn carried(
    role: &UpstreamRole,
    request: &Request,
    machine: &Session,
    cx: &impl CallContext,
    feeding: Option<&HeaderValue>,
) -> (Option<HeaderValue>, Option<Arc<TraceContext>>) {
    let (auth, trace) = match role {
        UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy } => {
            (cx.credential(Some(legacy)), cx.trace(machine, Some(legacy)))
        }
        UpstreamRole::Listen => (cx.credential(None), None),
        UpstreamRole::Discover => (feeding.cloned(), cx.trace(machine, None)),
    };
    let trace = trace.or_else(|| TraceContext::from_meta(request.params.as_ref()).map(Arc::new));
    (auth, trace)
}

/// How an upstream exchange ended.
#[derive(Debug, Clone)]
pub(super) enum Ended {
    /// The upstream answered (or the feed stopped taking messages).
    Done,
    /// No answer: lost (`None`: the machine retries or fails the request), or
    /// refused for a reason of its own (a TLS refusal: the request fails with it).
    Lost(Option<(&'static str, String)>),
    /// The upstream refused the credentials, and the host request waiting for the
    /// exchange's head took the refusal ([`HeadWatch::offer`]).
    Denied,
}

/// Where an exchange's messages go: the store (and wire) of the session.
pub(super) trait Feed: Sync {
    /// Waits until the host connection the next message of `role` goes to can take
    /// it (a connection's queue is bounded; a store may have nothing to wait for).
    fn room(&self, role: &UpstreamRole) -> impl Future<Output = ()> + Send;
    /// Feeds one upstream message (`last`: the response) to the session; false when
    /// nobody takes messages any more and the exchange should stop.
    fn message(
        &self,
        id: &RequestId,
        message: Message,
        last: bool,
    ) -> impl Future<Output = bool> + Send;
    /// Feeds the end of the exchange.
    fn ended(&self, id: &RequestId, ended: Ended) -> impl Future<Output = ()> + Send;
}

/// What a new session's `initialize` came to ([`handshake`]).
pub(super) struct Handshake {
    /// The answer to the host's `initialize` (`None`: no answer, the upstream gave
    /// none in time or the exchange ended without one).
    pub(super) answer: Option<Vec<u8>>,
    /// What the machine observed meanwhile, recorded once the session is stored.
    pub(super) observed: Vec<Observation>,
}

/// Runs a new session's `initialize`, already fed to `machine`, until it is answered:
/// the machine's plan after each step, its `server/discover` exchange driven here, its
/// messages and end fed back whole. The session is not stored anywhere until this
/// succeeded, so every store starts sessions the same way and stores only ready
/// ones; `now` is the clock of the store that will keep the machine. A refusal of
/// the caller's credentials comes back as it is: no session is minted.
pub(super) async fn handshake(
    route: &Route,
    machine: &mut Session,
    auth: Option<&HeaderValue>,
    trace: Option<&Arc<TraceContext>>,
    forwarded: &Forwarded,
    now: impl Fn() -> Timestamp,
) -> Result<Handshake, Box<Denial>> {
    let mut observed = Vec::new();
    let mut calls = Fixed { auth, trace };
    loop {
        let mut plan = self::plan(machine, &mut calls, auth);
        observed.append(&mut plan.observed);
        let answer = plan.out.into_iter().find_map(|out| match out {
            Out::Message {
                bytes, last: true, ..
            } => Some(bytes),
            _ => None,
        });
        if answer.is_some() {
            // What else the answer's step said, the session not stored yet: only its
            // observations count.
            let mut rest = self::plan(machine, &mut calls, None);
            observed.append(&mut rest.observed);
            return Ok(Handshake { answer, observed });
        }
        let Some(start) = plan.starts.into_iter().next() else {
            return Ok(Handshake {
                answer: None,
                observed,
            });
        };
        let head = HeadWatch::default();
        let collected = Collect::default();
        exchange(route, &start, forwarded, Some(&head), &collected).await;
        if let Some(denial) = head.finish() {
            return Err(denial);
        }
        let at = now();
        let (got, end) = collected.take();
        // The discover's answer, fed whole (its notifications, if any, first).
        for message in got {
            let on = Some(start.id.clone());
            let _ = feed(machine, Input::Upstream { on, message }, at);
        }
        if let Some(ended) = end {
            let _ = feed(
                machine,
                Input::Ended {
                    id: start.id,
                    ended,
                },
                at,
            );
        }
    }
}

/// An input of a session machine that no host request carries.
#[derive(Debug, Clone)]
pub(super) enum Input {
    /// A message from the upstream; `on`: the upstream request whose exchange
    /// (response stream) carried it, if one did.
    Upstream {
        on: Option<RequestId>,
        message: Message,
    },
    /// An upstream exchange ended (its answer, if any, was fed as a message before).
    Ended { id: RequestId, ended: Ended },
    /// The machine's deadline passed.
    Timer,
}

/// Feeds the legacy machine one input that no host request carries. Every store and
/// wire feeds these through here — the memory store under its session lock, the Redis
/// store inside a step, the single-channel wires in [`run`] — so what each means is
/// decided once, as [`plan`] decides what the machine's events mean. `Ok(Some(_))`: an
/// exchange ended with the credentials denied ([`ended`]).
pub(super) fn feed(
    machine: &mut Session,
    input: Input,
    now: Timestamp,
) -> Result<Option<Denied>, SessionError> {
    match input {
        Input::Upstream { on, message } => machine
            .handle_upstream_message(on, message, now)
            .map(|()| None),
        Input::Ended { id, ended } => self::ended(machine, &id, ended, now),
        Input::Timer => {
            machine.handle_timeout(now);
            Ok(None)
        }
    }
}

/// Feeds the end of upstream exchange `id` to the machine. What each way of ending
/// means is decided here, once, for every store and wire:
///
/// - answered: nothing more (the answer was fed as a message);
/// - lost: the machine retries the request or fails it;
/// - refused for a reason of the gateway's own (a TLS refusal): the request fails
///   with that reason;
/// - the credentials denied, and the host request that caused the call answered with
///   the upstream's 401/403: the machine forgets the attempt or parks its round until
///   the answer is sent again ([`Denied`]), which the store may have to act on (what
///   it keeps for the forgotten request).
fn ended(
    machine: &mut Session,
    id: &RequestId,
    ended: Ended,
    now: Timestamp,
) -> Result<Option<Denied>, SessionError> {
    match ended {
        Ended::Done => Ok(None),
        Ended::Lost(None) => machine.handle_upstream_lost(id, now).map(|()| None),
        Ended::Lost(Some((reason, message))) => machine
            .handle_upstream_refused(id, reason, message, now)
            .map(|()| None),
        Ended::Denied => machine.handle_upstream_denied(id, now).map(Some),
    }
}

/// The exchange of a session still being opened: its messages and its end, fed to
/// the machine once it is over.
#[derive(Default)]
struct Collect(std::sync::Mutex<(Vec<Message>, Option<Ended>)>);

impl Collect {
    fn take(self) -> (Vec<Message>, Option<Ended>) {
        self.0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Feed for Collect {
    async fn room(&self, _: &UpstreamRole) {}

    async fn message(&self, _: &RequestId, message: Message, _: bool) -> bool {
        if let Ok(mut c) = self.0.lock() {
            c.0.push(message);
        }
        true
    }

    async fn ended(&self, _: &RequestId, ended: Ended) {
        if let Ok(mut c) = self.0.lock() {
            c.1 = Some(ended);
        }
    }
}

/// Runs one upstream exchange to its end through the route's upstream path. `head`:
/// the host request waiting to learn whether the upstream accepted the exchange.
pub(super) async fn exchange<F: Feed>(
    route: &Route,
    start: &Start,
    forwarded: &Forwarded,
    head: Option<&HeadWatch>,
    feed: &F,
) {
    let id = &start.id;
    let on_behalf = OnBehalf {
        authorization: start.auth.as_ref(),
        forwarded: Some(forwarded),
        trace: start.trace.as_deref(),
    };
    let mut answered = false;
    let result = async {
        let mut exchange = route
            .exchange(&start.role, &start.message, on_behalf, &start.headers)
            .await?;
        if let Some(h) = head {
            h.accepted();
        }
        while let Some(item) = exchange.next().await {
            let m = item?;
            let last = matches!(m, Message::Response(_));
            feed.room(&start.role).await;
            answered |= last;
            if !feed.message(id, m, last).await {
                break;
            }
        }
        Ok::<(), UpstreamError>(())
    }
    .await;
    let ended = match result {
        Ok(()) => Ended::Done,
        Err(UpstreamError::Denied(denial)) => {
            let credential = fingerprint(start.auth.as_ref());
            let status = denial.status.as_u16();
            let relayed = head.is_some_and(|h| h.offer(&denial));
            route
                .telemetry
                .upstream_error(&UpstreamError::Denied(denial));
            if relayed {
                // The host request that caused this call is still waiting: it gets the
                // upstream's status and challenge, and the machine says nothing.
                info!(rpc.id = %id, status, %credential, "upstream refused the credentials; relayed to the host request");
                Ended::Denied
            } else {
                info!(rpc.id = %id, status, %credential, "upstream refused the credentials; no host request waits for it");
                Ended::Lost(None)
            }
        }
        Err(e) => {
            route.telemetry.upstream_error(&e);
            warn!(rpc.id = %id, error = %e, "upstream exchange failed");
            if answered {
                Ended::Done
            } else {
                Ended::Lost(e.refusal())
            }
        }
    };
    debug!(rpc.id = %id, ?ended, "upstream exchange ended");
    feed.ended(id, ended).await;
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
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // used by the Redis store only
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<HeadState> {
        self.0.subscribe()
    }

    /// Waits until the upstream accepted or refused, up to `limit`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // used by the Redis store only
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

/// Which peer of a driven machine a message comes from or goes to: the host (the
/// gateway's client) or the upstream (the server the gateway calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Host,
    Upstream,
}

/// A sans-IO machine [`run`] drives: `adapters::Session` (a legacy host in front of
/// a modern upstream) and `adapters::reverse::LegacySession` (a modern host in front
/// of a legacy upstream). What comes from the host differs between them and is fed
/// by the IO side ([`Io::feed`]); what comes from the upstream, time and the end are
/// fed here.
pub(super) trait Machine {
    /// What the machine asks for after a step ([`Machine::poll_event`]).
    type Event;
    /// Why the machine refused a message.
    type Error: std::fmt::Display;
    /// Feeds one input that no host request carries ([`Input`]).
    fn feed(&mut self, input: Input, now: Timestamp) -> Result<(), Self::Error>;
    /// The next thing the machine asks for, in order.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// When the machine's next deadline falls ([`Input::Timer`]), if it has one.
    fn poll_timeout(&self) -> Option<Timestamp>;
    /// Whether the machine is over (closed or failed).
    fn is_closed(&self) -> bool;
    /// Ends the machine: what is in progress fails, what it still asks for is queued.
    fn close(&mut self);
}

impl Machine for Session {
    type Event = Event;
    type Error = dualera_adapters::SessionError;
    fn feed(&mut self, input: Input, now: Timestamp) -> Result<(), Self::Error> {
        feed(self, input, now).map(|_| ())
    }
    fn poll_event(&mut self) -> Option<Event> {
        Session::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        Session::poll_timeout(self)
    }
    fn is_closed(&self) -> bool {
        self.state() == SessionState::Closed
    }
    fn close(&mut self) {
        Session::close(self);
    }
}

impl Machine for reverse::LegacySession {
    type Event = reverse::Event;
    type Error = reverse::ReverseError;
    fn feed(&mut self, input: Input, now: Timestamp) -> Result<(), Self::Error> {
        match input {
            Input::Upstream { on, message } => {
                self.handle_upstream_message(on.as_ref(), message, now)
            }
            Input::Ended {
                ended: Ended::Done, ..
            } => Ok(()),
            // A legacy upstream has no credentials of its own to refuse, and no reason
            // of the gateway's to tell: the call fails or is retried as lost.
            Input::Ended { id, .. } => self.handle_upstream_lost(&id, now),
            Input::Timer => {
                self.handle_timeout(now);
                Ok(())
            }
        }
    }
    fn poll_event(&mut self) -> Option<reverse::Event> {
        reverse::LegacySession::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        reverse::LegacySession::poll_timeout(self)
    }
    fn is_closed(&self) -> bool {
        matches!(
            self.state(),
            reverse::SessionState::Closed | reverse::SessionState::Failed
        )
    }
    fn close(&mut self) {
        reverse::LegacySession::close(self);
    }
}

/// What arrives at a driven machine, one item at a time.
#[derive(Debug)]
pub(super) enum Inbox<H> {
    /// From the host: what its wire carries (a message, a request and where its
    /// answer goes, the host leaving), fed by [`Io::feed`].
    Host(H),
    /// From the upstream (a message, an exchange's end) or the clock: fed by the
    /// driver ([`feed`]).
    Input(Input),
    /// The upstream forgot the session as a whole (the reverse bridge's upstream
    /// session expired), fed by [`Io::feed`].
    Forgotten,
    /// That side went away, or the IO side has nothing more to do: the machine ends.
    Closed(Side),
}

/// The IO side of a driven machine: where its inputs come from and where what it asks
/// for goes. `Pipe` (single-channel legacy wires) and the reverse bridge's
/// `Partition` are the two.
pub(super) trait Io<M: Machine> {
    /// What the host's side of the wire carries.
    type Host;
    /// The machine's clock.
    fn now(&self) -> Timestamp;
    /// When the machine's timestamp `t` falls.
    fn instant(&self, t: Timestamp) -> tokio::time::Instant;
    /// Waits for the next input. Bounded queues only: a side that is not read waits.
    fn recv(&mut self, machine: &M) -> impl Future<Output = Inbox<Self::Host>> + Send;
    /// Feeds a host item, or the upstream's forgetting the session; false when the
    /// machine is over.
    fn feed(&mut self, machine: &mut M, inbox: Inbox<Self::Host>) -> impl Future<Output = bool>;
    /// The upstream exchange `id` ended (fed to the machine next): what the IO side
    /// kept for it can go.
    fn ended(&mut self, _id: &RequestId) {}
    /// Carries out everything the machine asked for; false when the machine is over.
    fn perform(&mut self, machine: &mut M) -> impl Future<Output = bool>;
    /// After the machine closed: carries out its last events, lets go of what is open.
    fn finish(self, machine: &mut M) -> impl Future<Output = ()>
    where
        Self: Sized;
}

/// The one loop: owns `machine` and its IO side, waits on the inbox and the machine's
/// next timeout, steps the machine and carries out what it asked, until either side
/// ends or the machine does. Every wait is bounded by the IO side's queues.
pub(super) async fn run<M: Machine, I: Io<M>>(mut machine: M, mut io: I) {
    loop {
        if !io.perform(&mut machine).await || machine.is_closed() {
            break;
        }
        let deadline = machine.poll_timeout().map(|t| io.instant(t));
        let inbox = tokio::select! {
            inbox = io.recv(&machine) => inbox,
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => Inbox::Input(Input::Timer),
        };
        match inbox {
            Inbox::Input(input) => {
                if let Input::Ended { id, .. } = &input {
                    io.ended(id);
                }
                if let Err(e) = machine.feed(input, io.now()) {
                    debug!(error = %e, "input refused by the machine");
                }
            }
            Inbox::Closed(side) => {
                debug!(?side, "driven machine's side ended");
                break;
            }
            inbox => {
                if !io.feed(&mut machine, inbox).await {
                    break;
                }
            }
        }
    }
    machine.close();
    io.finish(&mut machine).await;
}

#[cfg(test)]
mod tests {
    //! [`feed`] decides, for every store and wire, what each input no host request
    //! carries means: these pin each meaning on the machine itself.
    use super::*;
    use dualera_adapters::{Config, Notification, Response};
    use serde_json::json;

    const T0: Timestamp = Timestamp::from_millis(0);

    /// What the machine asks for (its observations left out).
    fn drain(s: &mut Session) -> Vec<Event> {
        std::iter::from_fn(|| s.poll_event())
            .filter(|e| !matches!(e, Event::Observed(_)))
            .collect()
    }

    fn request(id: i64, method: &str, params: Value) -> Message {
        Message::Request(Request {
            id: RequestId::from_value(&json!(id)).unwrap(),
            method: method.into(),
            params: Some(params),
        })
    }

    /// A 2025-11-25 session past `initialize`, whose peer takes elicitations.
    fn ready(config: Config) -> Session {
        let mut s = Session::new(config);
        s.handle_discover(json!({"resultType": "complete",
            "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}))
            .unwrap();
        let init = json!({"protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {}}, "clientInfo": {"name": "h", "version": "1"}});
        s.handle_peer_message(request(0, "initialize", init), T0)
            .unwrap();
        let initialized = Notification {
            method: "notifications/initialized".into(),
            params: None,
        };
        s.handle_peer_message(Message::Notification(initialized), T0)
            .unwrap();
        drain(&mut s);
        assert_eq!(s.state(), SessionState::Ready);
        s
    }

    /// Starts the peer's `tools/call` 1: the id of the upstream request it caused.
    fn call(s: &mut Session) -> RequestId {
        s.handle_peer_message(request(1, "tools/call", json!({"name": "t"})), T0)
            .unwrap();
        drain(s)
            .into_iter()
            .find_map(|e| match e {
                Event::ToUpstream { request, .. } => Some(request.id),
                _ => None,
            })
            .expect("an upstream request")
    }

    /// The upstream's answer to `up`, as a message on its exchange.
    fn answered(up: &RequestId, result: Value) -> Input {
        Input::Upstream {
            on: Some(up.clone()),
            message: Message::Response(Response::result(up.clone(), result)),
        }
    }

    /// The response to the peer among `events`.
    fn to_peer(events: &[Event]) -> Option<&Response> {
        events.iter().find_map(|e| match e {
            Event::ToPeer {
                message: Message::Response(r),
                ..
            } => Some(r),
            _ => None,
        })
    }

    fn failed(events: &[Event]) -> Option<&Failure> {
        events.iter().find_map(|e| match e {
            Event::RequestFailed { failure, .. } => Some(failure),
            _ => None,
        })
    }

    #[test]
    fn an_answer_is_a_message_and_the_end_after_it_adds_nothing() {
        let mut s = ready(Config::default());
        let up = call(&mut s);
        let result = json!({"resultType": "complete", "content": [{"type": "text", "text": "ok"}]});
        assert!(matches!(feed(&mut s, answered(&up, result), T0), Ok(None)));
        let events = drain(&mut s);
        let answer = to_peer(&events).expect("the call's answer");
        assert_eq!(answer.outcome.as_ref().unwrap()["content"][0]["text"], "ok");
        let end = Input::Ended {
            id: up,
            ended: Ended::Done,
        };
        assert!(matches!(feed(&mut s, end, T0), Ok(None)));
        assert!(drain(&mut s).is_empty());
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn a_lost_exchange_fails_the_call_as_the_tools_result() {
        let mut s = ready(Config::default());
        let up = call(&mut s);
        let end = Input::Ended {
            id: up,
            ended: Ended::Lost(None),
        };
        assert!(matches!(feed(&mut s, end, T0), Ok(None)));
        let events = drain(&mut s);
        assert!(matches!(failed(&events), Some(Failure::UpstreamLost)));
        let answer = to_peer(&events).expect("the call's answer");
        assert_eq!(answer.outcome.as_ref().unwrap()["isError"], true);
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn a_refusal_of_the_gateways_own_fails_the_call_with_its_reason() {
        let mut s = ready(Config::default());
        let up = call(&mut s);
        let refused = Ended::Lost(Some(("tlsUnknownIssuer", "certificate refused".into())));
        let end = Input::Ended {
            id: up,
            ended: refused,
        };
        assert!(matches!(feed(&mut s, end, T0), Ok(None)));
        let events = drain(&mut s);
        let error = to_peer(&events)
            .and_then(|r| r.outcome.as_ref().err())
            .expect("a JSON-RPC error, not a tool result");
        assert_eq!(error.data.as_ref().unwrap()["reason"], "tlsUnknownIssuer");
    }

    #[test]
    fn denied_credentials_forget_a_first_attempt_and_tell_the_peer_nothing() {
        let mut s = ready(Config::default());
        let up = call(&mut s);
        let end = Input::Ended {
            id: up,
            ended: Ended::Denied,
        };
        let legacy = RequestId::from_value(&json!(1)).unwrap();
        assert_eq!(
            feed(&mut s, end, T0).unwrap(),
            Some(Denied::Request { legacy })
        );
        assert!(drain(&mut s)
            .iter()
            .all(|e| !matches!(e, Event::ToPeer { .. })));
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn the_timer_fails_a_round_whose_live_request_went_unanswered() {
        let mut config = Config::default();
        config.live_timeout = Duration::from_millis(100);
        let mut s = ready(config);
        let up = call(&mut s);
        let form = json!({"method": "elicitation/create", "params": {"mode": "form",
            "message": "ok?", "requestedSchema": {"type": "object", "properties": {}}}});
        let round = json!({"resultType": "input_required", "requestState": "st",
            "inputRequests": {"a": form}});
        feed(&mut s, answered(&up, round), T0).unwrap();
        let events = drain(&mut s);
        assert!(events.iter().any(|e| matches!(
            e,
            Event::ToPeer {
                message: Message::Request(_),
                ..
            }
        )));
        assert_eq!(s.poll_timeout(), Some(Timestamp::from_millis(100)));
        assert!(matches!(
            feed(&mut s, Input::Timer, Timestamp::from_millis(99)),
            Ok(None)
        ));
        assert!(drain(&mut s).is_empty());
        feed(&mut s, Input::Timer, Timestamp::from_millis(100)).unwrap();
        let events = drain(&mut s);
        assert!(matches!(failed(&events), Some(Failure::LiveTimeout { .. })));
        assert!(to_peer(&events).is_some());
        assert_eq!(s.in_flight(), 0);
    }
}
