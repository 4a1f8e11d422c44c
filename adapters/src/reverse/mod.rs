//! The reverse bridge: one legacy MCP session (2025-11-25 … 2024-11-05) that the gateway
//! holds, as a client, with a legacy server, serving 2026-07-28 hosts in front of it.
//! The mirror image of [`crate::session`], as a deterministic state machine without IO.
//!
//! ```text
//!   host request (validated) ──► LegacySession::handle_host_request ─┐
//!   host stream closed       ──► LegacySession::handle_host_gone ────┤
//!   server message           ──► LegacySession::handle_upstream_message
//!   server 404 (expired)     ──► LegacySession::handle_upstream_expired
//!   timer fired              ──► LegacySession::handle_timeout ──────┤
//!                                                                     ▼
//!   to the host's stream  ◄── Event::ToHost / Event::InputRequired ◄── poll_event
//!   to the legacy server  ◄── Event::ToUpstream                   ◄──┘
//! ```
//!
//! One machine serves one *partition* ([`Partition`]: a principal and the
//! capabilities its hosts declare); the driver never lets two principals share one.
//! Creating the machine emits the legacy `initialize` (the first revision of
//! [`Config::legacy_versions`], the host's `clientInfo`, its capabilities in legacy
//! shape); a server answering with another revision the table knows is accepted, any
//! other ends the machine ([`Event::Failed`]). Host requests that arrive meanwhile wait
//! in a bounded queue.
//!
//! **Live server requests become rounds.** An `elicitation/create`,
//! `sampling/createMessage` or `roots/list` the server sends during a host's
//! `tools/call` / `prompts/get` / `resources/read` is parked and the host request is
//! answered with `resultType: "input_required"` and a [`RoundState`] the driver seals
//! as `requestState`. The host's retry (a new request) answers the parked requests on
//! the legacy session and attaches to the same legacy call, which goes on: further
//! server requests make further rounds, the server's result is the retry's `complete`
//! answer. What arrives while no host request is attached (between rounds) is kept
//! for the retry: server requests (bounded by [`Config::max_input_requests`]) and the
//! result. A server request for a capability the partition did not declare is answered
//! by the machine with the legacy error for it. A retry that does not come within
//! [`Config::retry_wait`] cancels the legacy call (`notifications/cancelled`).
//!
//! **Session expiry.** When the driver reports the legacy session gone
//! ([`LegacySession::handle_upstream_expired`], an HTTP 404), the machine initializes
//! again and then sends again each legacy request that has no answer yet **and** can be
//! sent again safely: one the driver saw refused with the 404 itself (never
//! processed), or one whose method has no side effects (every method but `tools/call`)
//! and for which no host input was handed to the server yet. Every other one (a
//! `tools/call` that may have run, a call whose input was already answered) fails with
//! a clear error ([`HostFailure::SessionExpired`]). Rounds waiting for a retry are
//! dropped: their server requests died with the old session, and their round states
//! name the old session ([`StateMismatch::SessionRenewed`]).
//!
//! **Round answers** follow 2026-07-28 `basic/patterns/mrtr` ("Error Handling"): keys of
//! `inputResponses` the round did not ask for are ignored, and a key it asked for that
//! the retry lacks stays parked and is asked again in a new round (not an error).
//!
//! **Log level.** A legacy session has one level: the machine sends `logging/setLevel`
//! when a host request asks for a level other than the last one sent, and hands each
//! host request only the messages at or above its own level (none without one).
//!
//! **Attribution.** On Streamable HTTP a server message about a request rides that
//! request's response stream: the driver names it (`on`). Without it (stdio, the
//! 2024-11-05 SSE stream) a server request is given to the one host call in progress;
//! when there are several, it is refused (`-32603`), since handing one host's input
//! request to another is never right.

mod config;
mod error;
mod event;
pub mod round;
pub mod shape;

pub use config::{Config, Digest, Partition};
pub use error::{host_error, HostFailure, ReverseError};
pub use event::{Event, HostKey, HostRequest};
pub use round::{OpenedState, RoundState, StateMismatch};

use crate::capabilities::{self, InputCheck};
use crate::jsonrpc::{ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response};
use crate::mrtr::MRTR_METHODS;
use crate::revision::Revision;
use crate::session::{LOG_LEVELS, META_LOG_LEVEL, META_SUBSCRIPTION_ID};
use crate::time::Timestamp;
use serde_json::{json, Map, Value};
use shape::Caching;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Most requests of the machine's own (`logging/setLevel`, `resources/subscribe`, …)
/// remembered while unanswered: a server that never answers them cannot grow the
/// map; the answer to one not remembered is refused as unknown, which changes
/// nothing.
const MAX_OWN: usize = 256;

/// Largest `clientInfo` relayed, in bytes of JSON; a larger one is replaced by
/// [`Config::fallback_client_info`].
const MAX_CLIENT_INFO_BYTES: usize = 4096;

/// The lifecycle of the legacy session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// `initialize` sent, its answer awaited.
    Initializing,
    /// Initialized; host requests are served.
    Ready,
    /// Unusable (see [`Event::Failed`]).
    Failed,
    /// Closed by the driver.
    Closed,
}

/// The host request currently attached to a call.
#[derive(Debug, Clone)]
struct Attached {
    host: HostKey,
    id: RequestId,
    /// The host's `_meta.progressToken`, if it asked for progress.
    progress: Option<Value>,
    /// The host's `_meta` log level: without one, no log messages reach it
    /// (2026-07-28 `RequestMetaObject.logLevel`).
    log_level: Option<usize>,
}

/// A server request waiting for the host.
#[derive(Debug, Clone)]
struct Parked {
    server_id: RequestId,
    /// The 2026-07-28 input request shown to the host.
    request: Value,
    /// The round it was shown in (`None`: not shown yet).
    asked_in: Option<u32>,
}

/// One host call (a request forwarded to the legacy server), across its rounds.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    /// The legacy params, kept to send the call again after a session expiry.
    params: Value,
    /// The arguments digest, bound in round states.
    arguments: String,
    /// The legacy request id of the current attempt; `None` while waiting to be sent
    /// again on a renewed session.
    upstream: Option<RequestId>,
    host: Option<Attached>,
    parked: BTreeMap<String, Parked>,
    /// Parked requests the server withdrew (`notifications/cancelled`) after they
    /// were shown: a retry may still answer them; the answer is dropped.
    withdrawn: BTreeSet<String>,
    round: u32,
    /// The server's answer, kept while no host request is attached.
    outcome: Option<Result<Value, ErrorObject>>,
    /// When the wait for the host's retry ends.
    deadline: Option<Timestamp>,
    /// Host input was handed to the server (sending the call again is unsafe).
    answered_input: bool,
}

/// An open `subscriptions/listen` stream.
#[derive(Debug, Clone)]
struct Listener {
    id: RequestId,
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: BTreeSet<String>,
}

/// What a request the machine sends for itself is for.
#[derive(Debug, Clone, PartialEq)]
enum Own {
    Initialize,
    Ping,
    SetLevel,
    Subscribe,
    Unsubscribe,
}

/// One legacy session held for one partition. See the [module docs](self).
///
/// Call order: [`LegacySession::new`] (emits `initialize`); then any of the `handle_*`
/// methods as inputs arrive, each followed by draining [`LegacySession::poll_event`];
/// after every input, sleep until [`LegacySession::poll_timeout`] and call
/// [`LegacySession::handle_timeout`]. Timestamps never go backwards.
#[derive(Debug)]
pub struct LegacySession {
    config: Config,
    partition: Partition,
    /// The partition's capabilities, normalized ([`shape::normalize_host_capabilities`]).
    capabilities: Value,
    state: SessionState,
    /// Number of `initialize` exchanges begun (1 for the first session).
    epoch: u32,
    next_id: u64,
    next_call: u64,
    next_input: u64,
    revision: Option<&'static Revision>,
    initialize: Option<Value>,
    queued: VecDeque<HostRequest>,
    calls: BTreeMap<u64, Call>,
    /// Legacy request id → call.
    by_upstream: HashMap<RequestId, u64>,
    /// Host key → call it is attached to.
    by_host: HashMap<HostKey, u64>,
    own: HashMap<RequestId, Own>,
    log_level: Option<String>,
    listeners: BTreeMap<HostKey, Listener>,
    subscribed: BTreeSet<String>,
    next_ping: Option<Timestamp>,
    ping_outstanding: bool,
    /// When an unanswered `initialize` fails the session.
    initialize_deadline: Option<Timestamp>,
    events: VecDeque<Event>,
}

impl LegacySession {
    /// Opens a legacy session for `partition`: emits `initialize`.
    pub fn new(config: Config, partition: Partition, now: Timestamp) -> Self {
        let capabilities = shape::normalize_host_capabilities(&partition.capabilities);
        let mut machine = Self {
            config,
            partition,
            capabilities,
            state: SessionState::Initializing,
            epoch: 0,
            next_id: 0,
            next_call: 0,
            next_input: 0,
            revision: None,
            initialize: None,
            queued: VecDeque::new(),
            calls: BTreeMap::new(),
            by_upstream: HashMap::new(),
            by_host: HashMap::new(),
            own: HashMap::new(),
            log_level: None,
            listeners: BTreeMap::new(),
            subscribed: BTreeSet::new(),
            next_ping: None,
            ping_outstanding: false,
            initialize_deadline: None,
            events: VecDeque::new(),
        };
        machine.send_initialize(now);
        machine
    }

    /// The lifecycle state.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// The negotiated legacy revision, once initialized.
    pub fn revision(&self) -> Option<&'static Revision> {
        self.revision
    }

    /// Host calls in progress (attached or between rounds).
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// Server requests parked for the host, over all calls.
    pub fn parked(&self) -> usize {
        self.calls.values().map(|c| c.parked.len()).sum()
    }

    /// Open `subscriptions/listen` streams.
    pub fn listeners(&self) -> usize {
        self.listeners.len()
    }

    /// Host requests waiting for initialization.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The host request attached to the call whose legacy request is `id` (what the
    /// driver sends on behalf of that host carries its headers).
    pub fn upstream_host(&self, id: &RequestId) -> Option<HostKey> {
        let number = self.by_upstream.get(id)?;
        self.calls.get(number)?.host.as_ref().map(|h| h.host)
    }

    /// Resource URIs subscribed upstream.
    pub fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.subscribed.iter().map(String::as_str)
    }

    /// The next output, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest deadline armed: the keep-alive ping, or a round's wait for its
    /// retry.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let rounds = self.calls.values().filter_map(|c| c.deadline);
        let initialize = self
            .initialize_deadline
            .filter(|_| self.state == SessionState::Initializing);
        self.next_ping
            .into_iter()
            .chain(initialize)
            .chain(rounds)
            .min()
    }

    /// Closes the session: host requests still attached or queued get an error. The
    /// driver ends the legacy session itself (HTTP DELETE, closing stdin).
    pub fn close(&mut self) {
        if matches!(self.state, SessionState::Closed | SessionState::Failed) {
            return;
        }
        self.fail_everything(&HostFailure::Unusable {
            reason: "the session was closed".into(),
        });
        self.state = SessionState::Closed;
    }

    // ---- inputs: host ----

    /// A request from a modern host. Refused (nothing changes) only when the session is
    /// closed, the host key is already in use, or a request that is not a retry comes
    /// from another principal than the partition's (the driver routed it wrongly);
    /// every other outcome, errors included, is an event for the host. A retry is
    /// routed by the session its opened state names; its principal is checked here.
    pub fn handle_host_request(
        &mut self,
        request: HostRequest,
        now: Timestamp,
    ) -> Result<(), ReverseError> {
        if self.state == SessionState::Closed {
            return Err(ReverseError::Closed);
        }
        if request.principal != self.partition.principal
            && !matches!(request.state, OpenedState::Opened(_))
        {
            // A retry from another principal is answered (its state names this
            // session); any other request of another principal was routed wrongly.
            return Err(ReverseError::OtherPrincipal);
        }
        if self.by_host.contains_key(&request.host)
            || self.listeners.contains_key(&request.host)
            || self.queued.iter().any(|q| q.host == request.host)
        {
            return Err(ReverseError::DuplicateHost { host: request.host });
        }
        match self.state {
            SessionState::Failed => {
                let failure = HostFailure::Unusable {
                    reason: "the upstream session failed".into(),
                };
                self.answer_error(request.host, request.id, &failure);
            }
            SessionState::Initializing => {
                if self.queued.len() >= self.config.max_queued {
                    let failure = HostFailure::QueueFull {
                        limit: self.config.max_queued,
                    };
                    self.answer_error(request.host, request.id, &failure);
                } else {
                    self.queued.push_back(request);
                }
            }
            SessionState::Ready => self.dispatch(request, now),
            SessionState::Closed => {}
        }
        Ok(())
    }

    /// The host's stream for request `host` closed (or the host sent
    /// `notifications/cancelled` for it): its legacy call is cancelled upstream
    /// (2025-11-25 `basic/utilities/cancellation`), a listener's subscriptions are
    /// dropped. Unknown keys are ignored (the request may have finished).
    pub fn handle_host_gone(&mut self, host: HostKey) {
        if let Some(call) = self.by_host.remove(&host) {
            self.abandon(call, "The host closed its request");
        } else if self.listeners.remove(&host).is_some() {
            self.sync_subscriptions();
        } else {
            self.queued.retain(|q| q.host != host);
        }
    }

    // ---- inputs: upstream ----

    /// A message from the legacy server. `on` is the legacy request whose response
    /// stream carried it (Streamable HTTP), `None` on a shared pipe.
    pub fn handle_upstream_message(
        &mut self,
        on: Option<&RequestId>,
        message: Message,
        now: Timestamp,
    ) -> Result<(), ReverseError> {
        if matches!(self.state, SessionState::Closed | SessionState::Failed) {
            return Err(ReverseError::Closed);
        }
        match message {
            Message::Response(response) => self.upstream_response(response, now),
            Message::Request(request) => {
                self.upstream_request(on, request, now);
                Ok(())
            }
            Message::Notification(notification) => {
                self.upstream_notification(on, notification);
                Ok(())
            }
        }
    }

    /// Legacy request `id` ended without a response (connection lost, HTTP error
    /// other than 404): its host call fails; a lost `initialize` fails the session.
    pub fn handle_upstream_lost(
        &mut self,
        id: &RequestId,
        _now: Timestamp,
    ) -> Result<(), ReverseError> {
        if let Some(own) = self.own.remove(id) {
            match own {
                Own::Initialize => self.fail_session("initialize got no answer".into()),
                Own::Ping => self.ping_outstanding = false,
                Own::SetLevel => self.log_level = None,
                Own::Subscribe | Own::Unsubscribe => {}
            }
            return Ok(());
        }
        let Some(call) = self.by_upstream.remove(id) else {
            return Err(ReverseError::UnknownUpstreamId { id: id.clone() });
        };
        self.settle(call, Err(host_error(&HostFailure::UpstreamLost)));
        Ok(())
    }

    /// The legacy session is gone (the server answered `404` to a request carrying its
    /// session id). `refused` are the legacy requests the driver saw refused that way
    /// (never processed). The machine initializes again and sends again what can be
    /// sent safely (see the [module docs](self)). An expiry while initializing fails
    /// the session ([`Event::Failed`]): the driver opens a new machine later.
    pub fn handle_upstream_expired(
        &mut self,
        refused: &[RequestId],
        now: Timestamp,
    ) -> Result<(), ReverseError> {
        if matches!(self.state, SessionState::Closed | SessionState::Failed) {
            return Err(ReverseError::Closed);
        }
        if self.state == SessionState::Initializing {
            // The new session is refused as well: initializing again would loop.
            self.fail_session("the upstream session expired before it was initialized".into());
            return Ok(());
        }
        self.own.clear();
        self.by_upstream.clear();
        self.log_level = None;
        self.ping_outstanding = false;
        self.next_ping = None;
        let numbers: Vec<u64> = self.calls.keys().copied().collect();
        for number in numbers {
            let Some(call) = self.calls.get_mut(&number) else {
                continue;
            };
            if call.outcome.is_some() {
                // Answered already; only its retry is missing. That retry names the
                // old session, so it cannot come: drop the call.
                self.remove_call(number);
                continue;
            }
            if call.host.is_none() {
                // Waiting for a retry of a round whose server requests are gone.
                self.remove_call(number);
                continue;
            }
            let refused_here = call.upstream.as_ref().is_some_and(|u| refused.contains(u));
            let safe = refused_here || (call.method != "tools/call" && !call.answered_input);
            if safe {
                call.upstream = None;
                call.parked.clear();
                call.withdrawn.clear();
            } else {
                self.settle_now(number, Err(host_error(&HostFailure::SessionExpired)));
            }
        }
        self.subscribed.clear();
        self.state = SessionState::Initializing;
        self.send_initialize(now);
        Ok(())
    }

    /// The driver's timer fired: an `initialize` that got no answer, keep-alive ping,
    /// rounds whose retry did not come.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.state == SessionState::Initializing
            && self.initialize_deadline.is_some_and(|t| t <= now)
        {
            return self.fail_session("initialize got no answer in time".into());
        }
        if self.next_ping.is_some_and(|t| t <= now) {
            if self.state == SessionState::Ready && !self.ping_outstanding {
                let id = self.mint();
                self.track(id.clone(), Own::Ping);
                self.ping_outstanding = true;
                self.send_upstream(Message::Request(Request {
                    id,
                    method: "ping".into(),
                    params: None,
                }));
            }
            self.arm_ping(now);
        }
        let lapsed: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(n, _)| *n)
            .collect();
        for number in lapsed {
            self.abandon(number, "The host did not retry in time");
        }
    }

    // ---- host side ----

    fn dispatch(&mut self, request: HostRequest, now: Timestamp) {
        match &request.state {
            OpenedState::Invalid => {
                let failure = HostFailure::State(StateMismatch::Invalid);
                self.answer_error(request.host, request.id, &failure);
                return;
            }
            OpenedState::Opened(_) => return self.retry(request, now),
            OpenedState::Absent => {}
        }
        match request.method.as_str() {
            "server/discover" => {
                let result = match (self.revision, &self.initialize) {
                    (Some(revision), Some(init)) => {
                        shape::discover_result(revision, init, self.caching())
                    }
                    _ => Value::Null,
                };
                self.send_host(
                    request.host,
                    Message::Response(Response::result(request.id, result)),
                );
            }
            "subscriptions/listen" => self.listen(request),
            _ => self.start_call(request),
        }
    }

    fn start_call(&mut self, request: HostRequest) {
        if self.calls.len() >= self.config.max_calls {
            let failure = HostFailure::TooManyCalls {
                limit: self.config.max_calls,
            };
            return self.answer_error(request.host, request.id, &failure);
        }
        let arguments = self.digest(&request.method, &request.params);
        let attached = self.attach(&request);
        self.next_call += 1;
        let number = self.next_call;
        let params = shape::legacy_params(&request.params, None);
        self.calls.insert(
            number,
            Call {
                method: request.method,
                params,
                arguments,
                upstream: None,
                host: Some(attached),
                parked: BTreeMap::new(),
                withdrawn: BTreeSet::new(),
                round: 0,
                outcome: None,
                deadline: None,
                answered_input: false,
            },
        );
        self.by_host.insert(request.host, number);
        self.send_call(number);
    }

    /// The host request as the attachment of a call; sends `logging/setLevel` first
    /// when its level differs from the session's.
    fn attach(&mut self, request: &HostRequest) -> Attached {
        let meta = request.params.get("_meta").and_then(Value::as_object);
        let level = meta
            .and_then(|m| m.get(META_LOG_LEVEL))
            .and_then(Value::as_str)
            .and_then(|l| LOG_LEVELS.iter().position(|x| *x == l));
        if let Some(level) = level {
            self.set_level(LOG_LEVELS[level]);
        }
        Attached {
            host: request.host,
            id: request.id.clone(),
            progress: meta
                .and_then(|m| m.get("progressToken"))
                .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
                .cloned(),
            log_level: level,
        }
    }

    /// 2025-11-25 `server/utilities/logging`: the level is set with
    /// `logging/setLevel`, sent only to a server that declared `logging`, and only
    /// when it changes.
    fn set_level(&mut self, level: &str) {
        let declared = self
            .initialize
            .as_ref()
            .and_then(|i| i.get("capabilities"))
            .and_then(|c| c.get("logging"))
            .is_some_and(Value::is_object);
        if !declared || self.log_level.as_deref() == Some(level) {
            return;
        }
        self.log_level = Some(level.to_owned());
        let id = self.mint();
        self.track(id.clone(), Own::SetLevel);
        self.send_upstream(Message::Request(Request {
            id,
            method: "logging/setLevel".into(),
            params: Some(json!({ "level": level })),
        }));
    }

    /// Sends (or sends again) call `number` upstream with a fresh legacy id; the
    /// host's progress token is replaced by that id.
    fn send_call(&mut self, number: u64) {
        let id = self.mint();
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let wants_progress = call.host.as_ref().is_some_and(|h| h.progress.is_some());
        let mut params = call.params.clone();
        if let (true, Some(p)) = (wants_progress, params.as_object_mut()) {
            let meta = p
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("progressToken".into(), id.to_value());
            }
        }
        call.upstream = Some(id.clone());
        let method = call.method.clone();
        self.by_upstream.insert(id.clone(), number);
        self.send_upstream(Message::Request(Request {
            id,
            method,
            params: Some(params),
        }));
    }

    /// A retry: the state's checks, the answers to the parked requests, and the call
    /// goes on with this request attached.
    fn retry(&mut self, request: HostRequest, now: Timestamp) {
        let OpenedState::Opened(state) = &request.state else {
            return;
        };
        let arguments = self.digest(&request.method, &request.params);
        let checked = state
            .check(
                &self.partition.session,
                self.epoch,
                &request.principal,
                self.unix_ms(now),
                &request.method,
                &arguments,
            )
            .and_then(|()| self.waiting(state));
        if let Err(mismatch) = checked {
            return self.answer_error(request.host, request.id, &HostFailure::State(mismatch));
        }
        let responses = match request.params.get("inputResponses") {
            None => Map::new(),
            Some(Value::Object(r)) => r.clone(),
            Some(_) => {
                return self.answer_error(
                    request.host,
                    request.id,
                    &HostFailure::InputResponsesNotObject,
                )
            }
        };
        let number = state.call;
        let attached = self.attach(&request);
        let revision = self.revision;
        let mut answers = Vec::new();
        if let Some(call) = self.calls.get_mut(&number) {
            // 2026-07-28 `basic/patterns/mrtr` ("Error Handling"): keys the round did
            // not ask for are ignored; a key it asked for and did not get stays
            // parked and is asked again in the next round.
            for key in state.parked.keys() {
                let Some(answer) = responses.get(key) else {
                    continue;
                };
                if call.withdrawn.remove(key) {
                    continue;
                }
                if let Some(parked) = call.parked.remove(key) {
                    let method = parked.request["method"].as_str().unwrap_or("");
                    let answer = match revision {
                        Some(revision) => shape::input_response(revision, method, answer.clone()),
                        None => answer.clone(),
                    };
                    answers.push(Response::result(parked.server_id, answer));
                }
            }
            call.answered_input |= !answers.is_empty();
            call.host = Some(attached);
            call.deadline = None;
        }
        self.by_host.insert(request.host, number);
        for answer in answers {
            self.send_upstream(Message::Response(answer));
        }
        self.advance(number, now);
    }

    /// Whether the call and parked requests a state names are waiting for this round.
    fn waiting(&self, state: &RoundState) -> Result<(), StateMismatch> {
        let call = self
            .calls
            .get(&state.call)
            .ok_or(StateMismatch::NotWaiting)?;
        if call.host.is_some() || call.round != state.round {
            return Err(StateMismatch::NotWaiting);
        }
        for (key, server_id) in &state.parked {
            let still = match call.parked.get(key) {
                Some(p) => p.asked_in == Some(state.round) && &p.server_id.to_value() == server_id,
                None => call.withdrawn.contains(key),
            };
            if !still {
                return Err(StateMismatch::NotWaiting);
            }
        }
        Ok(())
    }

    /// What an attached call does next: its kept outcome, or a round for what is
    /// parked, or nothing (wait for the server).
    fn advance(&mut self, number: u64, now: Timestamp) {
        let Some(call) = self.calls.get(&number) else {
            return;
        };
        if call.host.is_none() {
            return;
        }
        if let Some(outcome) = call.outcome.clone() {
            return self.settle_now(number, outcome);
        }
        if !call.parked.is_empty() {
            self.ask(number, now);
        }
    }

    /// Answers the attached host with a round of every parked request.
    fn ask(&mut self, number: u64, now: Timestamp) {
        let max_rounds = self.config.max_rounds;
        let expires = now.saturating_add(self.config.retry_wait);
        let expires_at_ms = self.unix_ms(expires);
        let session = self.partition.session.clone();
        let principal = self.partition.principal.clone();
        let epoch = self.epoch;
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        if call.round >= max_rounds {
            let failure = HostFailure::RoundLimit { max_rounds };
            self.cancel_upstream(number, "The server asked for input too often");
            return self.settle_now(number, Err(host_error(&failure)));
        }
        let Some(host) = call.host.take() else {
            return;
        };
        call.round += 1;
        call.withdrawn.clear();
        let mut requests = Map::new();
        let mut parked = BTreeMap::new();
        for (key, p) in &mut call.parked {
            p.asked_in = Some(call.round);
            requests.insert(key.clone(), p.request.clone());
            parked.insert(key.clone(), p.server_id.to_value());
        }
        call.deadline = Some(expires);
        let state = RoundState {
            session,
            epoch,
            call: number,
            round: call.round,
            parked,
            method: call.method.clone(),
            arguments: call.arguments.clone(),
            principal,
            expires_at_ms,
        };
        self.by_host.remove(&host.host);
        self.events.push_back(Event::InputRequired {
            host: host.host,
            id: host.id,
            result: json!({ "resultType": "input_required", "inputRequests": requests }),
            state,
        });
    }

    fn listen(&mut self, request: HostRequest) {
        if self.listeners.len() >= self.config.max_listeners {
            let failure = HostFailure::TooManyListeners {
                limit: self.config.max_listeners,
            };
            return self.answer_error(request.host, request.id, &failure);
        }
        let caps = self
            .initialize
            .as_ref()
            .and_then(|i| i.get("capabilities"))
            .cloned()
            .unwrap_or(Value::Null);
        let flag = |cap: &str, flag: &str| {
            caps.get(cap)
                .and_then(|c| c.get(flag))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let wanted = request
            .params
            .get("notifications")
            .cloned()
            .unwrap_or(Value::Null);
        let asks = |key: &str| wanted.get(key).and_then(Value::as_bool).unwrap_or(false);
        // 2026-07-28 `basic/patterns/subscriptions`: the acknowledgment reflects the
        // subset the server agreed to honor; unsupported types are omitted.
        let mut listener = Listener {
            id: request.id.clone(),
            tools: asks("toolsListChanged") && flag("tools", "listChanged"),
            prompts: asks("promptsListChanged") && flag("prompts", "listChanged"),
            resources: asks("resourcesListChanged") && flag("resources", "listChanged"),
            uris: BTreeSet::new(),
        };
        if flag("resources", "subscribe") {
            let uris = wanted
                .get("resourceSubscriptions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            for uri in uris {
                let known = self.subscribed.contains(uri) || listener.uris.contains(uri);
                let room =
                    self.subscribed.len() + listener.uris.len() < self.config.max_subscriptions;
                if known || room {
                    listener.uris.insert(uri.to_owned());
                }
            }
        }
        let mut acknowledged = Map::new();
        for (key, on) in [
            ("toolsListChanged", listener.tools),
            ("promptsListChanged", listener.prompts),
            ("resourcesListChanged", listener.resources),
        ] {
            if on {
                acknowledged.insert(key.into(), Value::Bool(true));
            }
        }
        if !listener.uris.is_empty() {
            acknowledged.insert(
                "resourceSubscriptions".into(),
                Value::from(listener.uris.iter().cloned().collect::<Vec<_>>()),
            );
        }
        let host = request.host;
        let id = request.id.to_value();
        self.listeners.insert(host, listener);
        self.send_host(
            host,
            Message::Notification(Notification {
                method: "notifications/subscriptions/acknowledged".into(),
                params: Some(json!({
                    "_meta": { META_SUBSCRIPTION_ID: id },
                    "notifications": acknowledged,
                })),
            }),
        );
        self.sync_subscriptions();
    }

    /// Subscribes upstream to every URI a listener wants and unsubscribes from those
    /// none wants any more (2025-11-25 `server/resources`, "Subscriptions").
    fn sync_subscriptions(&mut self) {
        if self.state != SessionState::Ready {
            return;
        }
        let wanted: BTreeSet<String> = self
            .listeners
            .values()
            .flat_map(|l| l.uris.iter().cloned())
            .collect();
        let gone: Vec<String> = self.subscribed.difference(&wanted).cloned().collect();
        let new: Vec<String> = wanted.difference(&self.subscribed).cloned().collect();
        for uri in gone {
            self.subscribed.remove(&uri);
            self.own_request(
                "resources/unsubscribe",
                json!({ "uri": uri }),
                Own::Unsubscribe,
            );
        }
        for uri in new {
            self.subscribed.insert(uri.clone());
            self.own_request("resources/subscribe", json!({ "uri": uri }), Own::Subscribe);
        }
    }

    // ---- upstream side ----

    fn upstream_response(
        &mut self,
        response: Response,
        now: Timestamp,
    ) -> Result<(), ReverseError> {
        let Some(id) = response.id else {
            return Err(ReverseError::ResponseWithoutId);
        };
        if let Some(own) = self.own.remove(&id) {
            match own {
                Own::Initialize => self.initialized(response.outcome, now),
                Own::Ping => self.ping_outstanding = false,
                Own::SetLevel => {
                    if response.outcome.is_err() {
                        self.log_level = None;
                    }
                }
                Own::Subscribe | Own::Unsubscribe => {}
            }
            return Ok(());
        }
        let Some(number) = self.by_upstream.remove(&id) else {
            return Err(ReverseError::UnknownUpstreamId { id });
        };
        let method = self
            .calls
            .get(&number)
            .map(|c| c.method.clone())
            .unwrap_or_default();
        let outcome = match response.outcome {
            Ok(result) => Ok(shape::complete_result(&method, result, self.caching())),
            Err(error) => Err(shape::modern_error(&method, error)),
        };
        self.settle(number, outcome);
        Ok(())
    }

    /// 2025-11-25 `basic/lifecycle` ("Version Negotiation"): a server that does not
    /// support the requested version answers with another it supports; a client that
    /// does not support that one SHOULD disconnect.
    fn initialized(&mut self, outcome: Result<Value, ErrorObject>, now: Timestamp) {
        let result = match outcome {
            Ok(result) => result,
            Err(error) => {
                return self.fail_session(format!(
                    "initialize was refused with error {}: {}",
                    error.code.0,
                    crate::echo::echo(&error.message)
                ))
            }
        };
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let revision = Revision::lookup(version)
            .filter(|_| self.config.legacy_versions.iter().any(|v| v == version));
        let Some(revision) = revision else {
            return self.fail_session(format!(
                "the server answered protocol version {}, which the bridge does not speak",
                crate::echo::echo_quoted(version)
            ));
        };
        self.revision = Some(revision);
        self.initialize = Some(result);
        self.initialize_deadline = None;
        self.state = SessionState::Ready;
        self.send_upstream(Message::Notification(Notification {
            method: "notifications/initialized".into(),
            params: None,
        }));
        self.arm_ping(now);
        let resend: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.upstream.is_none() && c.outcome.is_none())
            .map(|(n, _)| *n)
            .collect();
        for number in resend {
            let level = self
                .calls
                .get(&number)
                .and_then(|c| c.host.as_ref())
                .and_then(|h| h.log_level);
            if let Some(level) = level {
                self.set_level(LOG_LEVELS[level]);
            }
            self.send_call(number);
        }
        self.sync_subscriptions();
        while let Some(request) = self.queued.pop_front() {
            self.dispatch(request, now);
        }
    }

    fn upstream_request(&mut self, on: Option<&RequestId>, request: Request, now: Timestamp) {
        let method = request.method.as_str();
        if method == "ping" {
            // 2025-11-25 `basic/utilities/ping`: the receiver MUST respond promptly
            // with an empty response.
            return self.send_upstream(Message::Response(Response::result(request.id, json!({}))));
        }
        if !matches!(
            method,
            "elicitation/create" | "sampling/createMessage" | "roots/list"
        ) {
            return self.refuse_server_request(
                request.id,
                ErrorObject::new(ErrorCode::METHOD_NOT_FOUND, "Method not found"),
            );
        }
        let params = match &request.params {
            Some(Value::Object(p)) => p.clone(),
            _ => Map::new(),
        };
        let check =
            if method == "elicitation/create" && self.capabilities.get("elicitation").is_none() {
                InputCheck::Missing("elicitation")
            } else {
                capabilities::check_input_request(&self.capabilities, method, &params)
            };
        if let InputCheck::Missing(capability) = check {
            return self.refuse_server_request(
                request.id,
                shape::unsupported_capability(method, capability),
            );
        }
        let Some(number) = self.attribute(on) else {
            return self.refuse_server_request(
                request.id,
                ErrorObject::new(
                    ErrorCode::INTERNAL_ERROR,
                    "No host request can answer this request",
                )
                .with_data(json!({ "reason": "noHostRequest" })),
            );
        };
        let max = self.config.max_input_requests;
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        if !MRTR_METHODS.contains(&call.method.as_str()) {
            // 2026-07-28 `basic/patterns/mrtr` ("Supported Requests"): only these
            // methods may answer input_required.
            let refusal = ErrorObject::new(
                ErrorCode::INTERNAL_ERROR,
                format!("The host cannot answer requests during {}", call.method),
            )
            .with_data(json!({ "reason": "inputNotAllowed" }));
            return self.refuse_server_request(request.id, refusal);
        }
        if call.parked.len() >= max {
            let refusal = ErrorObject::new(
                ErrorCode::INTERNAL_ERROR,
                format!("Too many requests wait for the host (limit {max})"),
            )
            .with_data(json!({ "reason": "tooManyInputRequests" }));
            return self.refuse_server_request(request.id, refusal);
        }
        if call.parked.values().any(|p| p.server_id == request.id) {
            let refusal = ErrorObject::new(ErrorCode::INVALID_REQUEST, "Duplicate request id");
            return self.refuse_server_request(request.id, refusal);
        }
        self.next_input += 1;
        let key = format!("in{}", self.next_input);
        call.parked.insert(
            key,
            Parked {
                server_id: request.id.clone(),
                request: shape::input_request(method, request.params.as_ref()),
                asked_in: None,
            },
        );
        if call.host.is_some() {
            self.ask(number, now);
        }
    }

    /// The call a server message belongs to: the one `on` names, else the only call
    /// in progress.
    fn attribute(&self, on: Option<&RequestId>) -> Option<u64> {
        match on {
            Some(id) => self.by_upstream.get(id).copied(),
            None => {
                let mut live = self.calls.iter().filter(|(_, c)| c.outcome.is_none());
                match (live.next(), live.next()) {
                    (Some((n, _)), None) => Some(*n),
                    _ => None,
                }
            }
        }
    }

    fn upstream_notification(&mut self, on: Option<&RequestId>, notification: Notification) {
        let params = notification.params.clone().unwrap_or(Value::Null);
        match notification.method.as_str() {
            "notifications/progress" => {
                let Some(number) = params
                    .get("progressToken")
                    .and_then(RequestId::from_value)
                    .and_then(|t| self.by_upstream.get(&t).copied())
                else {
                    return;
                };
                let Some(host) = self.calls.get(&number).and_then(|c| c.host.clone()) else {
                    return;
                };
                let Some(token) = host.progress else {
                    return;
                };
                let mut params = params.as_object().cloned().unwrap_or_default();
                params.insert("progressToken".into(), token);
                self.send_host(
                    host.host,
                    Message::Notification(Notification {
                        method: notification.method,
                        params: Some(Value::Object(params)),
                    }),
                );
            }
            "notifications/message" => {
                let level = params
                    .get("level")
                    .and_then(Value::as_str)
                    .and_then(|l| LOG_LEVELS.iter().position(|x| *x == l));
                let Some(level) = level else {
                    return;
                };
                let targets: Vec<HostKey> = match on {
                    Some(id) => self
                        .by_upstream
                        .get(id)
                        .and_then(|n| self.calls.get(n))
                        .and_then(|c| c.host.as_ref())
                        .filter(|h| h.log_level.is_some_and(|l| l <= level))
                        .map(|h| h.host)
                        .into_iter()
                        .collect(),
                    None => self
                        .calls
                        .values()
                        .filter_map(|c| c.host.as_ref())
                        .filter(|h| h.log_level.is_some_and(|l| l <= level))
                        .map(|h| h.host)
                        .collect(),
                };
                for host in targets {
                    self.send_host(host, Message::Notification(notification.clone()));
                }
            }
            "notifications/cancelled" => {
                // The server withdrew one of its requests.
                let Some(id) = notification.cancelled_request() else {
                    return;
                };
                for call in self.calls.values_mut() {
                    let key = call
                        .parked
                        .iter()
                        .find(|(_, p)| p.server_id == id)
                        .map(|(k, p)| (k.clone(), p.asked_in.is_some()));
                    if let Some((key, shown)) = key {
                        call.parked.remove(&key);
                        if shown {
                            call.withdrawn.insert(key);
                        }
                    }
                }
            }
            method @ ("notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated") => {
                let uri = params.get("uri").and_then(Value::as_str);
                let targets: Vec<(HostKey, Value)> = self
                    .listeners
                    .iter()
                    .filter(|(_, l)| match method {
                        "notifications/tools/list_changed" => l.tools,
                        "notifications/prompts/list_changed" => l.prompts,
                        "notifications/resources/list_changed" => l.resources,
                        _ => uri.is_some_and(|u| l.uris.contains(u)),
                    })
                    .map(|(k, l)| (*k, l.id.to_value()))
                    .collect();
                for (host, id) in targets {
                    let mut out = params.as_object().cloned().unwrap_or_default();
                    let mut meta = match out.remove("_meta") {
                        Some(Value::Object(m)) => m,
                        _ => Map::new(),
                    };
                    meta.insert(META_SUBSCRIPTION_ID.into(), id);
                    out.insert("_meta".into(), Value::Object(meta));
                    self.send_host(
                        host,
                        Message::Notification(Notification {
                            method: method.to_owned(),
                            params: Some(Value::Object(out)),
                        }),
                    );
                }
            }
            // `notifications/elicitation/complete` and anything else have no modern
            // counterpart on a host request's stream.
            _ => {}
        }
    }

    // ---- settling calls ----

    /// The server answered call `number` (or its request was lost): the attached host
    /// gets it now, or it is kept for the retry.
    fn settle(&mut self, number: u64, outcome: Result<Value, ErrorObject>) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        call.upstream = None;
        if call.host.is_some() {
            self.settle_now(number, outcome);
        } else {
            call.outcome = Some(outcome);
        }
    }

    /// Answers the attached host (if any) and forgets the call.
    fn settle_now(&mut self, number: u64, outcome: Result<Value, ErrorObject>) {
        let Some(call) = self.remove_call(number) else {
            return;
        };
        if let Some(host) = call.host {
            let response = match outcome {
                Ok(result) => Response::result(host.id, result),
                Err(error) => Response::error(Some(host.id), error),
            };
            self.send_host(host.host, Message::Response(response));
        }
    }

    fn remove_call(&mut self, number: u64) -> Option<Call> {
        let call = self.calls.remove(&number)?;
        if let Some(id) = &call.upstream {
            self.by_upstream.remove(id);
        }
        if let Some(host) = &call.host {
            self.by_host.remove(&host.host);
        }
        Some(call)
    }

    /// Gives up on call `number`: cancels its legacy request when it has no answer
    /// yet, and forgets it (its parked server requests are left to the server's
    /// cancellation handling).
    fn abandon(&mut self, number: u64, reason: &str) {
        self.cancel_upstream(number, reason);
        self.remove_call(number);
    }

    /// 2025-11-25 `basic/utilities/cancellation`: `notifications/cancelled` with the
    /// request's id and a reason.
    fn cancel_upstream(&mut self, number: u64, reason: &str) {
        let Some(id) = self.calls.get_mut(&number).and_then(|c| c.upstream.take()) else {
            return;
        };
        self.by_upstream.remove(&id);
        self.send_upstream(Message::Notification(Notification {
            method: "notifications/cancelled".into(),
            params: Some(json!({ "requestId": id.to_value(), "reason": reason })),
        }));
    }

    fn fail_session(&mut self, reason: String) {
        let failure = HostFailure::Unusable {
            reason: reason.clone(),
        };
        self.fail_everything(&failure);
        self.state = SessionState::Failed;
        self.next_ping = None;
        self.events.push_back(Event::Failed { reason });
    }

    fn fail_everything(&mut self, failure: &HostFailure) {
        let error = host_error(failure);
        while let Some(request) = self.queued.pop_front() {
            self.send_host(
                request.host,
                Message::Response(Response::error(Some(request.id), error.clone())),
            );
        }
        let numbers: Vec<u64> = self.calls.keys().copied().collect();
        for number in numbers {
            self.settle_now(number, Err(error.clone()));
        }
        let listeners = std::mem::take(&mut self.listeners);
        for (host, listener) in listeners {
            self.send_host(
                host,
                Message::Response(Response::error(Some(listener.id), error.clone())),
            );
        }
        self.own.clear();
        self.by_upstream.clear();
    }

    // ---- helpers ----

    fn send_initialize(&mut self, now: Timestamp) {
        self.epoch = self.epoch.saturating_add(1);
        self.initialize_deadline = Some(now.saturating_add(self.config.initialize_timeout));
        let version = self
            .config
            .legacy_versions
            .first()
            .cloned()
            .unwrap_or_else(|| crate::ProtocolVersion::V2025_11_25.to_owned());
        let params = json!({
            "protocolVersion": version,
            "capabilities": shape::client_to_legacy(&self.capabilities),
            "clientInfo": self.client_info(&version),
        });
        let id = self.mint();
        self.track(id.clone(), Own::Initialize);
        self.send_upstream(Message::Request(Request {
            id,
            method: "initialize".into(),
            params: Some(params),
        }));
    }

    /// The host's `clientInfo`, kept to the `Implementation` fields and bounded;
    /// the fallback when it is not an `Implementation` (a `name` and a `version`).
    fn client_info(&self, version: &str) -> Value {
        // The `Implementation` fields of the revision offered.
        let fields = Revision::lookup(version)
            .unwrap_or(&crate::v2025_11_25::REVISION)
            .implementation_fields;
        let info = &self.partition.client_info;
        let usable = info.get("name").is_some_and(Value::is_string)
            && info.get("version").is_some_and(Value::is_string);
        if usable {
            let kept: Map<String, Value> = info
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| fields.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let kept = Value::Object(kept);
            if kept.to_string().len() <= MAX_CLIENT_INFO_BYTES {
                return kept;
            }
        }
        self.config.fallback_client_info.clone()
    }

    fn own_request(&mut self, method: &str, params: Value, own: Own) {
        let id = self.mint();
        self.track(id.clone(), own);
        self.send_upstream(Message::Request(Request {
            id,
            method: method.to_owned(),
            params: Some(params),
        }));
    }

    /// Remembers a request of the machine's own, within [`MAX_OWN`] (`initialize` is
    /// always remembered: the map is emptied before it is sent again).
    fn track(&mut self, id: RequestId, own: Own) {
        if self.own.len() < MAX_OWN || own == Own::Initialize {
            self.own.insert(id, own);
        }
    }

    fn refuse_server_request(&mut self, id: RequestId, error: ErrorObject) {
        self.send_upstream(Message::Response(Response::error(Some(id), error)));
    }

    fn answer_error(&mut self, host: HostKey, id: RequestId, failure: &HostFailure) {
        self.send_host(
            host,
            Message::Response(Response::error(Some(id), host_error(failure))),
        );
    }

    /// A driver timestamp as Unix milliseconds ([`Config::unix_at_zero_ms`]).
    fn unix_ms(&self, t: Timestamp) -> u64 {
        self.config.unix_at_zero_ms.saturating_add(t.as_millis())
    }

    fn mint(&mut self) -> RequestId {
        self.next_id += 1;
        RequestId::String(format!("{}-{}", self.config.id_prefix, self.next_id))
    }

    fn digest(&self, method: &str, params: &Map<String, Value>) -> String {
        (self.config.digest)(&round::canonical_arguments(method, params))
    }

    fn caching(&self) -> Caching {
        Caching {
            ttl_ms: u64::try_from(self.config.list_ttl.as_millis()).unwrap_or(u64::MAX),
            public: self.config.public_cache,
        }
    }

    fn arm_ping(&mut self, now: Timestamp) {
        self.next_ping = if self.config.ping_interval.is_zero() {
            None
        } else {
            Some(now.saturating_add(self.config.ping_interval))
        };
    }

    fn send_upstream(&mut self, message: Message) {
        self.events.push_back(Event::ToUpstream { message });
    }

    fn send_host(&mut self, host: HostKey, message: Message) {
        self.events.push_back(Event::ToHost { host, message });
    }
}
