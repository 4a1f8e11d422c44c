//! Property tests of the legacy session machine: generated sequences of everything a
//! driver can feed it (peer requests, notifications, replies right, wrong, duplicate
//! and late; upstream results `complete`, `input_required` with 1–4 input requests,
//! errors and losses; timers, cancels, `close`), for every legacy revision, with the
//! invariants checked after every step:
//!
//! - nothing panics;
//! - every peer request the machine accepted is answered exactly once, or ended by
//!   the peer's own cancellation, or the session is closed (checked after settling:
//!   every upstream request answered, every live request answered, every timer run);
//! - an input that returns `Err` emits nothing and changes nothing;
//! - a reply to a live id the machine minted is never refused as unknown (it is
//!   accepted, or dropped as late/duplicate); a reply to an id it never minted is;
//! - no upstream exchange outlives `close`: every one is cancelled;
//! - the machine's maps stay within their bounds (in flight, live, retired ids), its
//!   upstream requests are exactly those the driver was told about, and the replay
//!   rings a driver keeps of its output stay within theirs;
//! - `poll_timeout` never returns a time before the last `now` handed in.
//!
//! Seeded and reproducible: the run prints its seed; `DUALERA_PROPTEST_SEED=<64 hex>`
//! replays it (`random` picks a fresh one), `DUALERA_PROPTEST_CASES=N` changes the
//! number of cases (default 10 000). A failure prints the seed and the minimal case.

use dualera_adapters::jsonrpc::{
    EnvelopeError, Message, Notification, Request, RequestId, Response,
};
use dualera_adapters::replay::ReplayRing;
use dualera_adapters::usage::Observation;
use dualera_adapters::{
    Config, ErrorCode, ErrorObject, Event, Footprint, PeerStream, Session, SessionError,
    SessionState, Timestamp, UpstreamRole,
};
use proptest::prelude::*;

#[path = "../../tests/seeded/mod.rs"]
mod seeded;
use seeded::run_seeded;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const REVISIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
const METHODS: [&str; 11] = [
    "tools/call",
    "prompts/get",
    "resources/read",
    "tools/list",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
    "initialize",
    "server/discover",
    "completion/complete",
];
/// Replay ring bounds of the simulated driver.
const RING_EVENTS: usize = 8;
const RING_BYTES: usize = 4096;

#[derive(Debug, Clone)]
enum Reply {
    /// A result for the live request.
    Ok,
    /// A JSON-RPC error for it.
    Error,
    /// A reply to an id the machine never minted.
    Unknown,
    /// A reply to an id minted earlier (possibly answered, abandoned or timed out).
    Minted,
}

#[derive(Debug, Clone)]
enum Upstream {
    Complete,
    /// `input_required` asking these inputs (0 elicitation form, 1 elicitation URL,
    /// 2 sampling, 3 roots), with or without `requestState`.
    InputRequired(Vec<u8>, bool),
    /// `input_required` with only `requestState`.
    StateOnly,
    Error(i64),
    Lost,
    UnknownResultType,
    Malformed,
    /// A notification on the request's stream.
    Notify,
    /// A response to an id never sent.
    Stray,
}

#[derive(Debug, Clone)]
enum Op {
    Initialize { version: u8, caps: u8 },
    Initialized,
    Request { id: u8, method: u8 },
    Cancel { id: u8 },
    Progress { live: u8 },
    RootsChanged,
    Reply { live: u8, kind: Reply },
    Upstream { target: u8, kind: Upstream },
    Advance { ms: u16 },
    Timer,
    Discover,
    StandaloneOpened,
    StandaloneClosed,
    Ping,
    Batch { items: Vec<(u8, u8)> },
    Close,
}

#[derive(Debug, Clone)]
struct Case {
    revision: u8,
    initialized: bool,
    max_in_flight: usize,
    max_live: usize,
    retired_ids: usize,
    max_rounds: u32,
    live_timeout_ms: u64,
    retry_pause_ms: u64,
    ops: Vec<Op>,
}

fn op() -> impl Strategy<Value = Op> {
    let reply = prop_oneof![
        4 => Just(Reply::Ok),
        2 => Just(Reply::Error),
        1 => Just(Reply::Unknown),
        2 => Just(Reply::Minted),
    ];
    let upstream = prop_oneof![
        4 => Just(Upstream::Complete),
        5 => (prop::collection::vec(0u8..4, 1..=4), any::<bool>())
            .prop_map(|(m, s)| Upstream::InputRequired(m, s)),
        1 => Just(Upstream::StateOnly),
        2 => prop_oneof![Just(-32603i64), Just(-32020), Just(-32602), Just(-32021)]
            .prop_map(Upstream::Error),
        2 => Just(Upstream::Lost),
        1 => Just(Upstream::UnknownResultType),
        1 => Just(Upstream::Malformed),
        1 => Just(Upstream::Notify),
        1 => Just(Upstream::Stray),
    ];
    prop_oneof![
        1 => (0u8..5, 0u8..8).prop_map(|(version, caps)| Op::Initialize { version, caps }),
        1 => Just(Op::Initialized),
        8 => (0u8..6, 0u8..METHODS.len() as u8).prop_map(|(id, method)| Op::Request { id, method }),
        2 => (0u8..6).prop_map(|id| Op::Cancel { id }),
        1 => any::<u8>().prop_map(|live| Op::Progress { live }),
        1 => Just(Op::RootsChanged),
        8 => (any::<u8>(), reply).prop_map(|(live, kind)| Op::Reply { live, kind }),
        10 => (any::<u8>(), upstream).prop_map(|(target, kind)| Op::Upstream { target, kind }),
        3 => (0u16..3000).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Timer),
        1 => Just(Op::Discover),
        1 => Just(Op::StandaloneOpened),
        1 => Just(Op::StandaloneClosed),
        1 => Just(Op::Ping),
        1 => prop::collection::vec((0u8..6, 0u8..METHODS.len() as u8), 1..4)
            .prop_map(|items| Op::Batch { items }),
        1 => Just(Op::Close),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u8..4,
        prop::bool::weighted(0.9),
        1usize..5,
        1usize..7,
        1usize..8,
        1u32..4,
        (100u64..3000, 0u64..400),
        prop::collection::vec(op(), 1..48),
    )
        .prop_map(
            |(
                revision,
                initialized,
                max_in_flight,
                max_live,
                retired_ids,
                max_rounds,
                (live_timeout_ms, retry_pause_ms),
                ops,
            )| Case {
                revision,
                initialized,
                max_in_flight,
                max_live,
                retired_ids,
                max_rounds,
                live_timeout_ms,
                retry_pause_ms,
                ops,
            },
        )
}

fn discover_result() -> Value {
    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
        "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "resources": {"subscribe": true, "listChanged": true}, "logging": {}},
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}})
}

fn caps(bits: u8) -> Value {
    let mut c = serde_json::Map::new();
    if bits & 1 != 0 {
        c.insert("elicitation".into(), json!({"form": {}, "url": {}}));
    }
    if bits & 2 != 0 {
        c.insert("sampling".into(), json!({}));
    }
    if bits & 4 != 0 {
        c.insert("roots".into(), json!({"listChanged": true}));
    }
    Value::Object(c)
}

fn params_for(method: &str, id: u8) -> Value {
    match method {
        "tools/call" => json!({"name": format!("tool{}", id % 3), "arguments": {"n": id}}),
        "prompts/get" => json!({"name": "p", "arguments": {}}),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            json!({"uri": format!("file:///r/{}", id % 3)})
        }
        "logging/setLevel" => json!({"level": if id.is_multiple_of(2) { "debug" } else { "loud" }}),
        "initialize" => json!({"protocolVersion": "2025-11-25", "capabilities": {}}),
        _ => json!({}),
    }
}

fn input_request(kind: u8) -> Value {
    match kind {
        0 => json!({"method": "elicitation/create", "params": {"mode": "form", "message": "ok?",
            "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}),
        1 => json!({"method": "elicitation/create", "params": {"mode": "url", "message": "go",
            "url": "https://example.com/auth", "elicitationId": "x"}}),
        2 => json!({"method": "sampling/createMessage", "params": {"messages": [
            {"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10}}),
        _ => json!({"method": "roots/list"}),
    }
}

fn live_answer(method: &str) -> Value {
    match method {
        "elicitation/create" => json!({"action": "accept", "content": {"ok": true}}),
        "sampling/createMessage" => json!({"role": "assistant",
            "content": {"type": "text", "text": "hello"}, "model": "m"}),
        "roots/list" => json!({"roots": []}),
        _ => json!({}),
    }
}

struct Harness {
    s: Session,
    now: u64,
    config: Config,
    closed: bool,
    /// Peer requests the machine accepted and has not answered.
    pending: HashSet<RequestId>,
    /// Peer requests the peer cancelled (their stream may end without a response).
    cancelled: HashSet<RequestId>,
    /// Pending requests that came in a batch (a cancelled one just leaves the group).
    in_batch: HashSet<RequestId>,
    /// Live requests outstanding at the peer, with their method.
    live: Vec<(RequestId, String)>,
    minted_live: Vec<RequestId>,
    /// The machine's ping to the peer, if one is out.
    ping: Option<RequestId>,
    /// Upstream requests outstanding.
    upstream: Vec<(RequestId, UpstreamRole)>,
    rings: HashMap<PeerStream, ReplayRing<Vec<u8>>>,
    steps: usize,
}

use seeded::Check;

fn fail<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

impl Harness {
    fn new(c: &Case) -> Self {
        let mut config = Config::default();
        config.max_in_flight = c.max_in_flight;
        config.max_live = c.max_live;
        config.retired_ids = c.retired_ids;
        config.max_rounds = c.max_rounds;
        config.live_timeout = Duration::from_millis(c.live_timeout_ms);
        config.live_timeout_max = Duration::from_millis(c.live_timeout_ms * 3);
        config.retry_pause = Duration::from_millis(c.retry_pause_ms);
        config.listen_retry_pause = Duration::from_millis(200);
        config.max_listen_retries = 2;
        config.max_input_requests = 4;
        config.id_prefix = "p".into();
        Self {
            s: Session::new(config.clone()),
            now: 0,
            config,
            closed: false,
            pending: HashSet::new(),
            cancelled: HashSet::new(),
            in_batch: HashSet::new(),
            live: Vec::new(),
            minted_live: Vec::new(),
            ping: None,
            upstream: Vec::new(),
            rings: HashMap::new(),
            steps: 0,
        }
    }

    fn t(&self) -> Timestamp {
        Timestamp::from_millis(self.now)
    }

    /// Runs one input: `Err` inputs must change nothing and emit nothing but the
    /// observation of the refusal (an overload, a dropped reply).
    fn feed<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Session, Timestamp) -> Result<T, SessionError>,
    ) -> Result<Result<T, SessionError>, String> {
        let before = self.s.footprint();
        let now = self.t();
        let r = f(&mut self.s, now);
        if let Err(e) = &r {
            let after = self.s.footprint();
            let held = |mut f: Footprint| {
                f.events = 0;
                f
            };
            if held(before) != held(after) {
                return fail(format!(
                    "{what}: refused with {e:?} but changed {before:?} -> {after:?}"
                ));
            }
            while let Some(event) = self.s.poll_event() {
                if !refusal_observation(e, &event) {
                    return fail(format!("{what}: refused with {e:?} but emitted {event:?}"));
                }
            }
            if self.closed && *e != SessionError::Closed {
                return fail(format!(
                    "{what}: closed session refused with {e:?}, not Closed"
                ));
            }
        } else if self.closed {
            return fail(format!("{what}: a closed session accepted input"));
        }
        self.drain()?;
        Ok(r)
    }

    /// [`Self::feed`] for inputs that must be accepted (unless the session is closed).
    fn feed_ok<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Session, Timestamp) -> Result<T, SessionError>,
    ) -> Check {
        match self.feed(what, f)? {
            Ok(_) | Err(SessionError::Closed) => Ok(()),
            Err(e) => fail(format!("{what} refused: {e:?}")),
        }
    }

    fn answered(&mut self, id: &RequestId, how: &str) -> Check {
        if !self.pending.remove(id) {
            return fail(format!("request {id} answered ({how}) but it was not pending (answered twice, or never accepted)"));
        }
        self.cancelled.remove(id);
        self.in_batch.remove(id);
        Ok(())
    }

    fn drain(&mut self) -> Check {
        while let Some(event) = self.s.poll_event() {
            match event {
                Event::ToPeer { stream, message } => {
                    let ring = self
                        .rings
                        .entry(stream.clone())
                        .or_insert_with(|| ReplayRing::new(RING_EVENTS, RING_BYTES));
                    ring.push(self.steps as u64, message.to_vec());
                    if !ring.within_bounds() {
                        return fail("a replay ring grew past its bounds");
                    }
                    match message {
                        Message::Response(r) => {
                            let Some(id) = r.id.clone() else {
                                return fail("a response without id outside a batch");
                            };
                            if let PeerStream::Request(s) = &stream {
                                if *s != id {
                                    return fail(format!("response {id} on the stream of {s}"));
                                }
                            }
                            self.answered(&id, "response")?;
                        }
                        Message::Request(r) => {
                            if r.method == "ping" {
                                self.ping = Some(r.id.clone());
                            } else {
                                self.live.push((r.id.clone(), r.method.clone()));
                            }
                            self.minted_live.push(r.id);
                        }
                        Message::Notification(n) => {
                            if n.method == "notifications/cancelled" {
                                let target = n.cancelled_request();
                                let before = self.live.len();
                                self.live.retain(|(id, _)| Some(id) != target.as_ref());
                                if self.live.len() == before {
                                    return fail(format!(
                                        "cancelled {target:?}, which was not outstanding"
                                    ));
                                }
                            }
                        }
                    }
                }
                Event::ToPeerBatch { messages, .. } => {
                    for m in messages {
                        if let Message::Response(Response { id: Some(id), .. }) = m {
                            // Invalid elements' errors were never pending.
                            if self.pending.contains(&id) {
                                self.answered(&id, "batch")?;
                            }
                        }
                    }
                }
                Event::CloseStream {
                    stream: PeerStream::Request(id),
                } => {
                    if !self.cancelled.contains(&id) {
                        return fail(format!(
                            "stream of {id} closed without the peer cancelling it"
                        ));
                    }
                    self.answered(&id, "cancel")?;
                }
                Event::ToUpstream { role, request } => {
                    if self.upstream.iter().any(|(id, _)| *id == request.id) {
                        return fail(format!("upstream id {} reused", request.id));
                    }
                    self.upstream.push((request.id, role));
                }
                Event::CancelUpstream { id, .. } => {
                    let before = self.upstream.len();
                    self.upstream.retain(|(u, _)| *u != id);
                    if self.upstream.len() == before {
                        return fail(format!(
                            "cancelled upstream {id}, which was not outstanding"
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check(&self) -> Check {
        if let Some(t) = self.s.poll_timeout() {
            if t.as_millis() < self.now {
                return fail(format!(
                    "poll_timeout {} is before now {}",
                    t.as_millis(),
                    self.now
                ));
            }
        }
        let f = self.s.footprint();
        if f.retired_live > self.config.retired_ids || f.retired_upstream > self.config.retired_ids
        {
            return fail(format!(
                "retired ids beyond {}: {f:?}",
                self.config.retired_ids
            ));
        }
        if f.tasks > dualera_adapters::tasks::MAX_TASKS {
            return fail(format!("{} tasks remembered: {f:?}", f.tasks));
        }
        if f.calls > self.config.max_in_flight {
            return fail(format!(
                "{} calls in flight, bound {}",
                f.calls, self.config.max_in_flight
            ));
        }
        if f.live > self.config.max_live {
            return fail(format!(
                "{} live requests, bound {}",
                f.live, self.config.max_live
            ));
        }
        if f.upstream != self.upstream.len() {
            return fail(format!(
                "the machine holds {} upstream requests, the driver was told of {}",
                f.upstream,
                self.upstream.len()
            ));
        }
        if !self.closed && f.live != self.live.len() {
            return fail(format!(
                "the machine holds {} live requests, the driver saw {} outstanding",
                f.live,
                self.live.len()
            ));
        }
        if self.closed && !self.upstream.is_empty() {
            return fail(format!(
                "upstream requests outlived close: {:?}",
                self.upstream
            ));
        }
        if self.s.state() == SessionState::Closed && !self.closed {
            return fail("the session closed by itself");
        }
        Ok(())
    }

    fn request_message(&self, id: u8, method: &str) -> Message {
        Message::Request(Request {
            id: RequestId::Number(i64::from(id)),
            method: method.into(),
            params: Some(params_for(method, id)),
        })
    }

    fn peer_request(&mut self, id: u8, method: &str) -> Check {
        let msg = self.request_message(id, method);
        let rid = RequestId::Number(i64::from(id));
        let was_pending = self.pending.contains(&rid);
        // Accepted requests are pending until answered; mark before draining.
        self.pending.insert(rid.clone());
        let r = self.feed("peer request", |s, now| s.handle_peer_message(msg, now))?;
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                if !was_pending {
                    self.pending.remove(&rid);
                }
                match e {
                    SessionError::Closed
                    | SessionError::DuplicateRequestId { .. }
                    | SessionError::TooManyInFlight { .. }
                    | SessionError::TooLargeForUpstream { .. } => {}
                    other => return fail(format!("request refused with {other:?}")),
                }
                if !matches!(e, SessionError::Closed) && e.to_response().is_none() {
                    return fail(format!("refused request without a response: {e:?}"));
                }
                if matches!(e, SessionError::DuplicateRequestId { .. }) && !was_pending {
                    return fail("duplicate id refused but no request with it was pending");
                }
                Ok(())
            }
        }
    }

    fn upstream_reply(&mut self, target: u8, kind: &Upstream) -> Check {
        if matches!(kind, Upstream::Stray) {
            let msg = Message::Response(Response::result(
                RequestId::String("stray".into()),
                json!({}),
            ));
            let r = self.feed("stray upstream", |s, now| {
                s.handle_upstream_message(None, msg, now)
            })?;
            return match r {
                Err(SessionError::UnknownUpstreamId { .. } | SessionError::Closed) => Ok(()),
                other => fail(format!("a stray upstream response gave {other:?}")),
            };
        }
        if self.upstream.is_empty() {
            return Ok(());
        }
        let (id, role) = self.upstream[usize::from(target) % self.upstream.len()].clone();
        if matches!(kind, Upstream::Lost) {
            self.upstream.retain(|(u, _)| *u != id);
            let r = self.feed("upstream lost", |s, now| s.handle_upstream_lost(&id, now))?;
            return r.map_err(|e| format!("upstream lost refused: {e:?}"));
        }
        if matches!(kind, Upstream::Notify) {
            let n = Message::Notification(Notification {
                method: "notifications/message".into(),
                params: Some(json!({"level": "info", "data": "x"})),
            });
            let on = Some(id.clone());
            let r = self.feed("upstream notification", |s, now| {
                s.handle_upstream_message(on, n, now)
            })?;
            return match r {
                Ok(()) | Err(SessionError::UncorrelatedNotification { .. }) => Ok(()),
                Err(e) => fail(format!("upstream notification refused: {e:?}")),
            };
        }
        let outcome = match (&role, kind) {
            (UpstreamRole::Discover, Upstream::Complete) => Ok(discover_result()),
            (UpstreamRole::Discover, Upstream::Malformed) => Ok(json!({"supportedVersions": []})),
            (UpstreamRole::ToolsRefresh { .. }, _) => Ok(json!({"tools": [{"name": "tool0",
                "inputSchema": {"type": "object"}}]})),
            (_, Upstream::Complete) => Ok(json!({"resultType": "complete", "content": []})),
            (_, Upstream::InputRequired(kinds, state)) => {
                let mut reqs = serde_json::Map::new();
                for (i, k) in kinds.iter().enumerate() {
                    reqs.insert(format!("k{i}"), input_request(*k));
                }
                let mut r = json!({"resultType": "input_required", "inputRequests": reqs});
                if *state {
                    r["requestState"] = json!("s");
                }
                Ok(r)
            }
            (_, Upstream::StateOnly) => {
                Ok(json!({"resultType": "input_required", "requestState": "s"}))
            }
            (_, Upstream::Error(code)) => {
                Err(ErrorObject::new(ErrorCode(*code), "upstream says no"))
            }
            (_, Upstream::UnknownResultType) => Ok(json!({"resultType": "weird"})),
            (_, Upstream::Malformed) => {
                Ok(json!({"resultType": "input_required", "inputRequests": 7}))
            }
            (_, Upstream::Lost | Upstream::Notify | Upstream::Stray) => unreachable!(),
        };
        self.upstream.retain(|(u, _)| *u != id);
        let msg = Message::Response(Response {
            id: Some(id.clone()),
            outcome,
        });
        let r = self.feed("upstream response", |s, now| {
            s.handle_upstream_message(None, msg, now)
        })?;
        r.map_err(|e| format!("an outstanding upstream response was refused: {e:?}"))
    }

    fn peer_reply(&mut self, pick: u8, kind: &Reply) -> Check {
        let (id, method, outstanding) = match kind {
            Reply::Unknown => (
                RequestId::String(format!("never-{pick}")),
                String::new(),
                false,
            ),
            Reply::Minted => {
                if self.minted_live.is_empty() {
                    return Ok(());
                }
                let id = self.minted_live[usize::from(pick) % self.minted_live.len()].clone();
                let method = self
                    .live
                    .iter()
                    .find(|(l, _)| *l == id)
                    .map(|(_, m)| m.clone());
                let outstanding = method.is_some() || self.ping.as_ref() == Some(&id);
                (id, method.unwrap_or_default(), outstanding)
            }
            Reply::Ok | Reply::Error => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let (id, method) = self.live[usize::from(pick) % self.live.len()].clone();
                (id, method, true)
            }
        };
        let outcome = match kind {
            Reply::Error => Err(ErrorObject::new(ErrorCode(-32603), "the host failed")),
            _ => Ok(live_answer(&method)),
        };
        let msg = Message::Response(Response {
            id: Some(id.clone()),
            outcome,
        });
        let r = self.feed("peer reply", |s, now| s.handle_peer_message(msg, now))?;
        match (r, outstanding) {
            (Err(SessionError::Closed), _) => Ok(()),
            (Ok(()), true) => {
                self.live.retain(|(l, _)| *l != id);
                if self.ping.as_ref() == Some(&id) {
                    self.ping = None;
                }
                Ok(())
            }
            (Err(e), false) if matches!(kind, Reply::Unknown) => match e {
                SessionError::UnknownReply { .. } => Ok(()),
                other => fail(format!("reply to a never-minted id gave {other:?}")),
            },
            (Err(e), false) if e.is_dropped() => Ok(()),
            (other, outstanding) => fail(format!(
                "reply to {id} (outstanding: {outstanding}, {kind:?}) gave {other:?}"
            )),
        }
    }

    fn advance(&mut self, ms: u64) -> Check {
        let target = self.now + ms;
        let mut fired = 0;
        while let Some(t) = self.s.poll_timeout().map(Timestamp::as_millis) {
            if t > target {
                break;
            }
            fired += 1;
            if fired > 1000 {
                return fail("timers keep firing without the clock moving");
            }
            self.now = self.now.max(t);
            let now = self.t();
            self.s.handle_timeout(now);
            self.drain()?;
            self.check()?;
        }
        self.now = target;
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Check {
        self.steps += 1;
        match op {
            Op::Initialize {
                version,
                caps: bits,
            } => {
                let version = REVISIONS
                    .get(usize::from(*version))
                    .copied()
                    .unwrap_or("1999-01-01");
                let msg = Message::Request(Request {
                    id: RequestId::String("init".into()),
                    method: "initialize".into(),
                    params: Some(
                        json!({"protocolVersion": version, "capabilities": caps(*bits),
                        "clientInfo": {"name": "prop", "version": "1"}}),
                    ),
                });
                let rid = RequestId::String("init".into());
                let was = self.pending.contains(&rid);
                self.pending.insert(rid.clone());
                let r = self.feed("initialize", |s, now| s.handle_peer_message(msg, now))?;
                if r.is_err() && !was {
                    self.pending.remove(&rid);
                }
            }
            Op::Initialized => {
                let n = Message::Notification(Notification {
                    method: "notifications/initialized".into(),
                    params: None,
                });
                self.feed_ok("initialized", |s, now| s.handle_peer_message(n, now))?;
            }
            Op::Request { id, method } => self.peer_request(*id, METHODS[usize::from(*method)])?,
            Op::Cancel { id } => {
                let rid = RequestId::Number(i64::from(*id));
                if self.pending.contains(&rid) {
                    self.cancelled.insert(rid.clone());
                }
                let n = Message::Notification(Notification {
                    method: "notifications/cancelled".into(),
                    params: Some(json!({"requestId": rid.to_value(), "reason": "user"})),
                });
                let calls = self.s.footprint().calls;
                self.feed_ok("cancel", |s, now| s.handle_peer_message(n, now))?;
                if self.in_batch.contains(&rid) && self.s.footprint().calls < calls {
                    // Its batch's group will simply not contain it.
                    self.answered(&rid, "cancelled in a batch")?;
                }
            }
            Op::Progress { live } => {
                let token = match self.live.get(usize::from(*live) % self.live.len().max(1)) {
                    Some((id, _)) => id.to_value(),
                    None => json!("nothing"),
                };
                let n = Message::Notification(Notification {
                    method: "notifications/progress".into(),
                    params: Some(json!({"progressToken": token, "progress": 1})),
                });
                self.feed_ok("progress", |s, now| s.handle_peer_message(n, now))?;
            }
            Op::RootsChanged => {
                let n = Message::Notification(Notification {
                    method: "notifications/roots/list_changed".into(),
                    params: None,
                });
                self.feed_ok("roots changed", |s, now| s.handle_peer_message(n, now))?;
            }
            Op::Reply { live, kind } => self.peer_reply(*live, kind)?,
            Op::Upstream { target, kind } => self.upstream_reply(*target, kind)?,
            Op::Advance { ms } => self.advance(u64::from(*ms))?,
            Op::Timer => {
                let now = self.t();
                self.s.handle_timeout(now);
                self.drain()?;
            }
            Op::Discover => {
                self.feed_ok("discover", |s, _| s.handle_discover(discover_result()))?;
            }
            Op::StandaloneOpened => {
                self.feed_ok("standalone opened", |s, _| s.handle_standalone_opened())?;
            }
            Op::StandaloneClosed => {
                self.feed_ok("standalone closed", |s, _| s.handle_standalone_closed())?;
            }
            Op::Ping => {
                self.s.ping_peer();
                self.drain()?;
            }
            Op::Batch { items } => {
                let mut parsed: Vec<Result<Message, EnvelopeError>> = Vec::new();
                let mut ids = Vec::new();
                for (id, method) in items {
                    // Ids already in flight (or twice in the batch) are the peer's
                    // error; the group's responses could not be told apart.
                    let rid = RequestId::Number(i64::from(*id));
                    if self.pending.contains(&rid) || ids.contains(&rid) {
                        continue;
                    }
                    ids.push(rid);
                    parsed.push(Ok(self.request_message(*id, METHODS[usize::from(*method)])));
                }
                parsed.push(Err(EnvelopeError::Invalid {
                    id: None,
                    detail: "bad".into(),
                }));
                for rid in &ids {
                    self.pending.insert(rid.clone());
                    self.in_batch.insert(rid.clone());
                }
                let r = self.feed("batch", |s, now| s.handle_peer_batch(parsed, now))?;
                if r.is_err() {
                    for rid in &ids {
                        self.pending.remove(rid);
                        self.in_batch.remove(rid);
                    }
                    let negotiated = self.s.revision().map(|r| r.version);
                    if negotiated == Some("2025-03-26") && self.s.state() == SessionState::Ready {
                        return fail(format!("a batch was refused in 2025-03-26: {r:?}"));
                    }
                }
            }
            Op::Close => {
                self.s.close();
                self.closed = true;
                self.drain()?;
            }
        }
        self.check()
    }

    /// Answers everything outstanding and runs every timer until nothing is left;
    /// then every accepted request must have been answered.
    fn settle(&mut self) -> Check {
        for _ in 0..500 {
            if self.closed {
                return Ok(());
            }
            if let Some(i) = self
                .upstream
                .iter()
                .position(|(_, r)| !matches!(r, UpstreamRole::Listen))
            {
                self.upstream_reply(i as u8, &Upstream::Complete)?;
            } else if !self.live.is_empty() {
                self.peer_reply(0, &Reply::Ok)?;
            } else if !self.pending.is_empty() && self.s.poll_timeout().is_some() {
                self.advance(5000)?;
            } else {
                break;
            }
            self.check()?;
        }
        if !self.pending.is_empty() {
            return fail(format!(
                "requests never answered: {:?} (state {:?}, footprint {:?})",
                self.pending,
                self.s.state(),
                self.s.footprint()
            ));
        }
        // Closing now cancels whatever is left (the subscription).
        self.s.close();
        self.closed = true;
        self.drain()?;
        self.check()
    }
}

fn run(case: &Case) -> Check {
    let mut h = Harness::new(case);
    if case.initialized {
        h.step(&Op::Initialize {
            version: case.revision,
            caps: 7,
        })?;
        if h.upstream.iter().any(|(_, r)| *r == UpstreamRole::Discover) {
            h.upstream_reply(0, &Upstream::Complete)?;
        }
        h.step(&Op::Initialized)?;
    }
    for (i, op) in case.ops.iter().enumerate() {
        h.step(op).map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    h.settle().map_err(|e| format!("settling: {e}"))
}

#[test]
fn session_machine_invariants() {
    run_seeded("session machine", 10_000, case(), run);
}

/// Whether `event` is what a refusal `e` may emit: the refused request's end (an
/// overload or a request the upstream could not take), or a dropped reply.
fn refusal_observation(e: &SessionError, event: &Event) -> bool {
    match (e, event) {
        (
            SessionError::TooManyInFlight { id, .. } | SessionError::TooLargeForUpstream { id, .. },
            Event::Observed(Observation::RequestEnded { id: ended, .. }),
        ) => id == ended,
        (
            SessionError::LateReply { .. } | SessionError::DuplicateReply { .. },
            Event::Observed(Observation::ReplyDropped { duplicate }),
        ) => *duplicate == matches!(e, SessionError::DuplicateReply { .. }),
        _ => false,
    }
}
