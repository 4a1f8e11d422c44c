//! Plays one vector against a bridge: feeds each step's input on the right wire, then
//! matches what the bridge does against the step's expected outputs, under the
//! black-box rules of `adapters/vectors/README.md` ("Running a vector against a
//! bridge"). The first difference ends the play.

// A `Difference` ends the play: it is made once per vector, so boxing it would buy
// nothing on any path that matters.
#![allow(clippy::result_large_err)]

use super::host_http::{Carries, HttpHost};
use super::host_stdio::StdioHost;
use super::observe::{Observed, Sink, Timed, SINK_DEPTH};
use super::upstream::{Delivery, Upstream};
use crate::format::{
    Expected, ExpectedKind, HttpExpect, Input, StatusPattern, Step, Transport, Vector,
};
use crate::matching::{self, Bindings, Mode};
use crate::report::{Difference, Verdict};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Longest wait, after a vector, for results a shared bridge may cache to go stale.
const MAX_CACHE_WAIT: Duration = Duration::from_secs(10);

/// How the play reaches the bridge.
#[derive(Debug, Clone)]
pub(crate) enum Wire {
    /// A running Streamable HTTP bridge at this URL.
    Http(http::Uri),
    /// A stdio bridge spawned per session from this argv (`{upstream}` substituted).
    Command(Vec<String>),
}

/// Timings of the black-box rules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long a step waits for its outputs.
    pub(crate) step: Duration,
    /// How long a step without outputs waits before the next one.
    pub(crate) settle: Duration,
    /// How long after the last step nothing more may arrive.
    pub(crate) quiet: Duration,
    /// How early before its `at` an output of a timer step may arrive.
    pub(crate) early: Duration,
}

enum Host {
    Http(HttpHost),
    Stdio(StdioHost),
}

struct Session {
    host: Host,
    closed: bool,
}

/// A check on the head of an HTTP response the host is waiting for.
struct Deferred {
    step: usize,
    exchange: u64,
    expect: HttpExpect,
    /// The step by whose end the head must have arrived, once that is known: its own
    /// step for a POST of notifications or replies that makes the bridge call no
    /// upstream (a host waits for the 202); else the step that ends the last of
    /// `waits_on`; else only the vector's end.
    due: Option<usize>,
    /// The upstream requests (placeholders) the step makes the bridge send. A bridge
    /// may hold its answer to the host's request until the upstream has answered
    /// them, to relay a 401/403 on it (2025-11-25 `basic/authorization`, "Error
    /// Handling"; DESIGN.md: "before any SSE is committed").
    waits_on: Vec<String>,
    seen: bool,
}

/// Where an observed output went.
enum Placed {
    Matched,
    /// Not matched; the closest expectation (for the report).
    Unmatched(Option<Value>, Option<String>),
}

/// What `Play::auto_answer` did with an upstream request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auto {
    /// Left to the vector's expectations.
    No,
    /// Answered by the runner: background traffic.
    Answered,
    /// Answered, though the step expects that method (see `auto_answer`).
    Crossed,
}

pub(crate) struct Play<'a> {
    vector: &'a Vector,
    transport: Transport,
    mode: Mode,
    wire: &'a Wire,
    upstream: &'a Upstream,
    timing: Timing,
    sink: Sink,
    rx: mpsc::Receiver<Timed>,
    backlog: VecDeque<Timed>,
    bindings: Bindings,
    sessions: HashMap<String, Session>,
    /// Upstream request placeholders (`$up1`) → the scripted upstream's request key.
    up_keys: HashMap<String, u64>,
    discover: Option<Value>,
    deferred: Vec<Deferred>,
    next_exchange: u64,
    t0: Instant,
    offset: Duration,
    notes: Vec<String>,
    /// Placeholders only a skipped step would have bound.
    unplayable: HashSet<String>,
    /// Expectations of later `standalone_opened` steps met early (single pipes).
    hoisted: HashMap<usize, Vec<bool>>,
    /// Upstream requests the runner handled on its own (see `auto_answer`).
    auto_keys: HashSet<u64>,
    /// Until when a result sent by the upstream may still be fresh in a cache.
    fresh_until: Option<Instant>,
    /// How a `server/discover` that crossed the step being collected differed from
    /// the one the step awaits (see `auto_answer`): reported if that one never comes.
    /// Lives only while the step is collected.
    crossed: Option<Difference>,
}

impl<'a> Play<'a> {
    pub(crate) fn new(
        vector: &'a Vector,
        transport: Transport,
        mode: Mode,
        wire: &'a Wire,
        upstream: &'a Upstream,
        timing: Timing,
    ) -> Self {
        let (sink, rx) = mpsc::channel(SINK_DEPTH);
        upstream.attach(sink.clone());
        Self {
            vector,
            transport,
            mode,
            wire,
            upstream,
            timing,
            sink,
            rx,
            backlog: VecDeque::new(),
            bindings: Bindings::default(),
            sessions: HashMap::new(),
            up_keys: HashMap::new(),
            discover: None,
            deferred: Vec::new(),
            next_exchange: 0,
            t0: Instant::now(),
            offset: Duration::ZERO,
            notes: Vec::new(),
            unplayable: HashSet::new(),
            hoisted: HashMap::new(),
            auto_keys: HashSet::new(),
            fresh_until: None,
            crossed: None,
        }
    }

    /// Plays every step; returns the verdict and the parts not playable on this wire.
    pub(crate) async fn run(mut self) -> (Verdict, Vec<String>) {
        let result = self.steps().await;
        self.cleanup().await;
        let verdict = match result {
            Ok(()) => Verdict::Pass,
            Err(d) => Verdict::Fail(d),
        };
        (verdict, self.notes)
    }

    async fn steps(&mut self) -> Result<(), Difference> {
        self.t0 = Instant::now();
        let vector = self.vector;
        for step in &vector.steps {
            if !step.transports.includes(self.transport) {
                self.skip(step, "not for this wire");
                continue;
            }
            if let Some(why) = self.unplayable_reason(step) {
                self.skip(step, &why);
                continue;
            }
            let target = step
                .at
                .map(|at| self.t0 + Duration::from_millis(at) + self.offset);
            if let Some(target) = target {
                self.idle_until(target).await?;
                let now = Instant::now();
                if now > target + Duration::from_millis(5) {
                    self.offset += now - target;
                }
            }
            self.apply(step).await?;
            self.collect(step, target).await?;
        }
        self.finish().await
    }

    fn skip(&mut self, step: &Step, why: &str) {
        self.notes.push(format!(
            "step {} ({}): {why}",
            step.index,
            step.input.kind()
        ));
        for e in &step.expect {
            let mut names = Vec::new();
            matching::placeholders(&e.value, &mut names);
            for n in names {
                if self.bindings.get(&n).is_none() {
                    self.unplayable.insert(n);
                }
            }
        }
    }

    fn unplayable_reason(&self, step: &Step) -> Option<String> {
        let single = self.transport.single_pipe();
        let closed = self.sessions.get(&step.session).is_some_and(|s| s.closed);
        match &step.input {
            Input::Ping => return Some("the bridge decides when to ping; a runner cannot make it".into()),
            Input::StandaloneClosed if single => {
                return Some("a single pipe's standalone stream never closes".into())
            }
            Input::Peer { .. } | Input::PeerBatch { .. } if single && closed => {
                return Some("the session's stdin is closed".into())
            }
            Input::Upstream { on: None, message, .. }
                if message.get("id").is_none()
                    && message
                        .pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
                        .is_none()
                    && message.pointer("/params/progressToken").is_none() =>
            {
                return Some(
                    "a notification on a shared upstream pipe, tied to no request; the runner's upstream is HTTP, where every message rides a request's stream".into(),
                )
            }
            _ => {}
        }
        let mut names = Vec::new();
        match &step.input {
            Input::Peer { message } => matching::placeholders(message, &mut names),
            Input::PeerBatch { messages, .. } => messages
                .iter()
                .for_each(|m| matching::placeholders(m, &mut names)),
            Input::Upstream { on, message, .. } => {
                matching::placeholders(message, &mut names);
                if let Some(on) = on {
                    matching::placeholders(on, &mut names);
                }
            }
            Input::UpstreamLost { id, .. } => matching::placeholders(id, &mut names),
            _ => {}
        }
        names
            .iter()
            .find(|n| self.unplayable.contains(*n))
            .map(|n| format!("uses {n}, which only a skipped step binds"))
    }

    fn subst(&self, step: &Step, v: &Value) -> Result<Value, Difference> {
        self.bindings.substitute(v).map_err(|e| {
            Difference::plain(
                Some(step.index),
                format!("{e} (an earlier output the vector relies on did not bind it)"),
            )
        })
    }

    fn exchange(&mut self) -> u64 {
        self.next_exchange += 1;
        self.next_exchange
    }

    async fn host(&mut self, step: &Step) -> Result<&mut Session, Difference> {
        if !self.sessions.contains_key(&step.session) {
            let host = match self.wire {
                Wire::Http(url) => {
                    Host::Http(HttpHost::new(&step.session, url.clone(), self.sink.clone()))
                }
                Wire::Command(argv) => {
                    let url = self.upstream.url();
                    let argv: Vec<String> =
                        argv.iter().map(|a| a.replace("{upstream}", &url)).collect();
                    let h = StdioHost::spawn(&step.session, &argv, self.sink.clone())
                        .map_err(|e| Difference::plain(Some(step.index), e.to_string()))?;
                    Host::Stdio(h)
                }
            };
            self.sessions.insert(
                step.session.clone(),
                Session {
                    host,
                    closed: false,
                },
            );
        }
        Ok(self.sessions.get_mut(&step.session).expect("inserted"))
    }

    fn defer(&mut self, step: &Step, exchange: u64, expect: Option<HttpExpect>, in_step: bool) {
        let Some(expect) = expect else { return };
        let waits_on: Vec<String> = step
            .expect
            .iter()
            .filter(|e| e.kind == ExpectedKind::UpstreamRequest)
            .filter_map(|e| e.value.pointer("/message/id"))
            .filter_map(matching::placeholder_name)
            .map(str::to_owned)
            .collect();
        let due = (in_step && waits_on.is_empty()).then_some(step.index);
        self.deferred.push(Deferred {
            step: step.index,
            exchange,
            expect,
            due,
            waits_on,
            seen: false,
        });
    }

    /// Upstream request `key` has ended at `step`: the host requests whose answer
    /// waited for it are due by the end of this step.
    fn upstream_ended(&mut self, step: &Step, key: u64) {
        for d in &mut self.deferred {
            if d.seen || d.due.is_some() {
                continue;
            }
            let ended = d.waits_on.iter().any(|n| self.up_keys.get(n) == Some(&key));
            if ended {
                d.due = Some(step.index);
            }
        }
    }

    /// Sets the session's host headers as the step says (Streamable HTTP; elsewhere
    /// there is nowhere to put them, which the notes say).
    async fn apply_host_headers(&mut self, step: &Step) -> Result<(), Difference> {
        if step.host_headers.is_empty() {
            return Ok(());
        }
        let single = self.transport.single_pipe();
        let session = self.host(step).await?;
        match &mut session.host {
            Host::Http(h) => h.set_headers(&step.host_headers),
            Host::Stdio(_) => {}
        }
        if single {
            self.skip_part(step, "headers the host sends (no HTTP on this wire)");
        }
        Ok(())
    }

    fn skip_part(&mut self, step: &Step, what: &str) {
        self.notes.push(format!(
            "step {} ({}): not on this wire: {what}",
            step.index,
            step.input.kind()
        ));
    }

    /// The expectation on a POST that carries no request: the step's, else the
    /// transport page's 202 (or an error status for a refused input).
    fn reply_post_expect(step: &Step) -> HttpExpect {
        step.http.clone().unwrap_or(HttpExpect {
            status: Some(if step.error.is_some() {
                StatusPattern::Class(4)
            } else {
                StatusPattern::Exact(202)
            }),
            headers: Vec::new(),
            body: None,
        })
    }

    async fn apply(&mut self, step: &Step) -> Result<(), Difference> {
        self.apply_host_headers(step).await?;
        match &step.input {
            Input::Peer { message } => {
                let msg = self.subst(step, message)?;
                let exchange = self.exchange();
                let carries = if is_request(&msg) {
                    Carries::Request {
                        id: msg["id"].clone(),
                        initialize: msg["method"] == "initialize",
                    }
                } else {
                    Carries::Nothing
                };
                self.send_peer(step, exchange, &msg, carries).await?;
            }
            Input::PeerBatch { messages, bind } => {
                let items = messages
                    .iter()
                    .map(|m| self.subst(step, m))
                    .collect::<Result<Vec<_>, _>>()?;
                let exchange = self.exchange();
                let stream = json!(format!("batch-{exchange}"));
                if let Some(b) = bind {
                    self.bindings.bind(b, stream.clone());
                }
                let has_requests = items.iter().any(is_request);
                let carries = Carries::Batch {
                    stream,
                    has_requests,
                };
                self.send_peer(step, exchange, &Value::Array(items), carries)
                    .await?;
            }
            Input::Upstream { on, message, http } => {
                let msg = self.subst(step, message)?;
                let target = match on {
                    Some(on) => self.resolve(step, on)?,
                    None => self.carrier(step, message, &msg)?,
                };
                let delivered = target.map(|k| self.upstream.send(k, &msg, http.as_ref()));
                if let (Some(k), true) = (target, msg.get("method").is_none()) {
                    self.upstream_ended(step, k);
                }
                self.note_cacheable(&msg);
                if delivered != Some(Delivery::Delivered) {
                    self.notes.push(format!(
                        "step {}: upstream message not delivered (the bridge had closed or never opened the request that would carry it)",
                        step.index
                    ));
                }
            }
            Input::UpstreamLost { id, http } => {
                let target = self.resolve(step, id)?;
                let delivered = target.map(|k| self.upstream.lose(k, http.as_ref()));
                if let Some(k) = target {
                    self.upstream_ended(step, k);
                }
                if delivered != Some(Delivery::Delivered) {
                    self.notes.push(format!(
                        "step {}: upstream request already closed by the bridge",
                        step.index
                    ));
                }
            }
            Input::Timer => {}
            Input::Discover { result } => self.discover = Some(result.clone()),
            Input::StandaloneOpened => {
                if !self.transport.single_pipe() {
                    let exchange = self.exchange();
                    let session = self.host(step).await?;
                    if let Host::Http(h) = &mut session.host {
                        h.open_standalone(exchange);
                    }
                    self.defer(step, exchange, step.http.clone(), false);
                }
            }
            Input::StandaloneClosed => {
                if let Some(Session {
                    host: Host::Http(h),
                    ..
                }) = self.sessions.get_mut(&step.session)
                {
                    h.close_standalone();
                }
            }
            Input::Close => {
                let exchange = self.exchange();
                if let Some(s) = self.sessions.get_mut(&step.session) {
                    s.closed = true;
                    match &mut s.host {
                        Host::Http(h) => {
                            h.delete(exchange);
                            self.defer(step, exchange, step.http.clone(), true);
                        }
                        Host::Stdio(h) => h.close(),
                    }
                }
            }
            Input::Ping => {}
        }
        Ok(())
    }

    /// Sends what a `peer` step posts: over HTTP, a POST whose response head is then
    /// checked (a POST carrying no request must be answered within the step); over
    /// stdio, a line.
    async fn send_peer(
        &mut self,
        step: &Step,
        exchange: u64,
        body: &Value,
        carries: Carries,
    ) -> Result<(), Difference> {
        let carries_request = match &carries {
            Carries::Request { .. } => true,
            Carries::Batch { has_requests, .. } => *has_requests,
            Carries::Nothing | Carries::Standalone => false,
        };
        let session = self.host(step).await?;
        match &mut session.host {
            Host::Http(h) => {
                h.post(exchange, body, carries);
                if carries_request {
                    self.defer(step, exchange, step.http.clone(), false);
                } else {
                    self.defer(step, exchange, Some(Self::reply_post_expect(step)), true);
                }
            }
            Host::Stdio(h) => {
                if !h.send(body).await {
                    let tail = h.stderr_tail();
                    return Err(Difference {
                        context: Some(format!("bridge stderr (tail):\n{tail}")),
                        ..Difference::plain(
                            Some(step.index),
                            "the bridge's stdin is closed (it exited?)",
                        )
                    });
                }
            }
        }
        Ok(())
    }

    /// The upstream request a step names (`on`, `lost`), by placeholder or by id.
    fn resolve(&self, step: &Step, raw: &Value) -> Result<Option<u64>, Difference> {
        if let Some(name) = matching::placeholder_name(raw) {
            if let Some(k) = self.up_keys.get(name) {
                return Ok(Some(*k));
            }
        }
        let id = self.subst(step, raw)?;
        Ok(self
            .upstream
            .open()
            .into_iter()
            .find(|(_, i, _)| matching::json_eq(i, &id))
            .map(|(k, _, _)| k))
    }

    /// Which upstream request carries a message the vector sends without `on`: a
    /// response goes on its request's stream; a notification on the stream of the
    /// request its subscription id or progress token names.
    fn carrier(&self, step: &Step, raw: &Value, msg: &Value) -> Result<Option<u64>, Difference> {
        if let Some(id) = raw.get("id") {
            return self.resolve(step, id);
        }
        if let Some(sub) = raw.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId") {
            return self.resolve(step, sub);
        }
        let open = self.upstream.open();
        if let Some(token) = msg.pointer("/params/progressToken") {
            let by_token = open.iter().find(|(_, _, m)| {
                m.pointer("/params/_meta/progressToken")
                    .is_some_and(|t| matching::json_eq(t, token))
            });
            if let Some((k, _, _)) = by_token {
                return Ok(Some(*k));
            }
        }
        Ok(None)
    }

    async fn next_event(&mut self, until: Instant) -> Option<Timed> {
        if let Some(e) = self.backlog.pop_front() {
            return Some(e);
        }
        tokio::time::timeout_at(until.into(), self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// Waits until `target`, answering what needs no vector (heads, pings) and keeping
    /// everything else for the step.
    async fn idle_until(&mut self, target: Instant) -> Result<(), Difference> {
        while Instant::now() < target {
            let Ok(Some(ev)) = tokio::time::timeout_at(target.into(), self.rx.recv()).await else {
                break;
            };
            if !self.housekeeping(None, &ev).await? {
                self.backlog.push_back(ev);
            }
        }
        Ok(())
    }

    /// Handles what belongs to no step's expectations: HTTP heads, connection
    /// failures, wire faults, exits, and the bridge's pings. True if consumed.
    async fn housekeeping(&mut self, step: Option<usize>, ev: &Timed) -> Result<bool, Difference> {
        match &ev.event {
            Observed::PeerHead {
                exchange,
                status,
                headers,
                body,
                ..
            } => {
                self.check_head(*exchange, *status, headers, body.as_ref())?;
                Ok(true)
            }
            Observed::PeerFailed {
                exchange, detail, ..
            } => {
                let owner = self
                    .deferred
                    .iter()
                    .find(|d| d.exchange == *exchange)
                    .map(|d| d.step);
                Err(Difference::plain(
                    owner.or(step),
                    format!("the host's HTTP request got no response: {detail}"),
                ))
            }
            Observed::Fault { detail } => Err(Difference::plain(step, detail.clone())),
            Observed::Exited { session, status } => {
                let expected = self.sessions.get(session).is_none_or(|s| s.closed);
                if expected {
                    return Ok(true);
                }
                let tail = match self.sessions.get(session).map(|s| &s.host) {
                    Some(Host::Stdio(h)) => h.stderr_tail(),
                    _ => String::new(),
                };
                Err(Difference {
                    context: Some(format!("bridge stderr (tail):\n{tail}")),
                    ..Difference::plain(
                        step,
                        format!("the bridge exited ({status}) while the session was open"),
                    )
                })
            }
            Observed::PeerClose { session, .. }
                if self.sessions.get(session).is_some_and(|s| s.closed) =>
            {
                // Ending a session ends its streams.
                Ok(true)
            }
            Observed::PeerOutput {
                session, output, ..
            } => {
                let m = output.get("message");
                let is_ping = m.is_some_and(|m| {
                    m.get("method") == Some(&json!("ping")) && m.get("id").is_some()
                });
                if !is_ping {
                    return Ok(false);
                }
                // Keepalive pings are the bridge's business: answered, not scored.
                let reply = json!({"jsonrpc": "2.0", "id": m.and_then(|m| m.get("id")).cloned(), "result": {}});
                let exchange = self.exchange();
                if let Some(s) = self.sessions.get_mut(session) {
                    match &mut s.host {
                        Host::Http(h) => h.post(exchange, &reply, Carries::Nothing),
                        Host::Stdio(h) => {
                            h.send(&reply).await;
                        }
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn check_head(
        &mut self,
        exchange: u64,
        status: u16,
        headers: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<(), Difference> {
        let Some(i) = self.deferred.iter().position(|d| d.exchange == exchange) else {
            return Ok(());
        };
        self.deferred[i].seen = true;
        let d = &self.deferred[i];
        let (step, expect) = (d.step, d.expect.clone());
        let actual = head_json(status, headers, &expect, body);
        let wanted = expect_json(&expect, &self.bindings);
        let differ = |summary: String| Difference {
            step: Some(step),
            summary,
            expected: Some(wanted.clone()),
            actual: Some(actual.clone()),
            context: None,
        };
        if let Some(s) = expect.status {
            let strict = self.mode == Mode::Strict;
            if !s.accepts(status, strict) {
                let want = match s {
                    StatusPattern::Defined(n) if strict => n.to_string(),
                    other => other.to_string(),
                };
                return Err(differ(format!("HTTP status {status}, expected {want}")));
            }
        }
        if let Err(m) = self.check_headers(&expect.headers, headers) {
            return Err(differ(format!("HTTP header {m}")));
        }
        if let Some(want) = &expect.body {
            let got = body.cloned().unwrap_or(Value::Null);
            if let Err(m) = self.bindings.try_match(want, &got, self.mode) {
                return Err(differ(format!("HTTP body {m}")));
            }
        }
        Ok(())
    }

    fn observable(&self, e: &Expected) -> bool {
        if self.transport.single_pipe() && matches!(e.kind, ExpectedKind::PeerClose { .. }) {
            return false;
        }
        let mut names = Vec::new();
        matching::placeholders(&e.value, &mut names);
        !names.iter().any(|n| self.unplayable.contains(n))
    }

    /// Whether expectation `j` may match now: on one stream, outputs keep their order
    /// (except a round's live requests, which may come in any order).
    fn ready(&self, expect: &[Expected], matched: &[bool], j: usize) -> bool {
        let ej = &expect[j];
        let Some(sj) = ej.stream() else { return true };
        expect[..j].iter().enumerate().all(|(i, ei)| {
            matched[i]
                || !self.observable(ei)
                || ei.session != ej.session
                || ei.stream().is_none_or(|si| {
                    self.bindings.render(si) != self.bindings.render(sj)
                        || (ei.is_peer_request() && ej.is_peer_request())
                })
        })
    }

    /// Tries `output` against the unmatched expectations in `expect`.
    fn place(
        &mut self,
        expect: &[Expected],
        matched: &mut [bool],
        session: &str,
        output: &Value,
        key: Option<u64>,
        headers: &[(String, String)],
    ) -> Result<Placed, Difference> {
        let mut closest: Option<(Value, String)> = None;
        for j in 0..expect.len() {
            let e = &expect[j];
            if matched[j]
                || !self.observable(e)
                || e.session != session
                || !same_kind(&e.kind, output)
            {
                continue;
            }
            if !self.ready(expect, matched, j) {
                continue;
            }
            let result = self.try_one(e, output, key);
            match result {
                Ok(()) => {
                    matched[j] = true;
                    if let (ExpectedKind::UpstreamRequest, Some(key)) = (&e.kind, key) {
                        if let Some(name) = e
                            .value
                            .pointer("/message/id")
                            .and_then(matching::placeholder_name)
                        {
                            self.up_keys.insert(name.to_owned(), key);
                        }
                        if let Some(h) = &e.http {
                            self.check_headers(&h.headers, headers)
                                .map_err(|m| Difference {
                                    step: None,
                                    summary: format!("upstream request header {m}"),
                                    expected: Some(self.bindings.render(&e.value)),
                                    actual: Some(with_headers(output, headers)),
                                    context: None,
                                })?;
                        }
                    }
                    return Ok(Placed::Matched);
                }
                Err(m) => {
                    let related = closest.is_none() || related(e, output);
                    if related {
                        closest = Some((self.bindings.render(&e.value), m.to_string()));
                    }
                }
            }
        }
        Ok(match closest {
            Some((v, m)) => Placed::Unmatched(Some(v), Some(m)),
            None => Placed::Unmatched(None, None),
        })
    }

    fn try_one(
        &mut self,
        e: &Expected,
        output: &Value,
        key: Option<u64>,
    ) -> Result<(), matching::Mismatch> {
        let mut expected = e.value.clone();
        if self.transport.single_pipe() {
            if let Some(s) = expected.get_mut("stream") {
                *s = json!("$_");
            }
        }
        match &e.kind {
            ExpectedKind::UpstreamCancel { id } => {
                if let (Some(name), Some(key)) = (matching::placeholder_name(id), key) {
                    if let Some(k) = self.up_keys.get(name) {
                        return if *k == key {
                            Ok(())
                        } else {
                            Err(matching::Mismatch {
                                path: ".cancel".into(),
                                detail: format!(
                                    "another upstream request was cancelled, not {name}"
                                ),
                            })
                        };
                    }
                }
                self.bindings.try_match(&expected, output, self.mode)
            }
            ExpectedKind::PeerBatch { .. } => {
                let (Some(Value::Array(want)), Some(Value::Array(got))) =
                    (expected.get("batch"), output.get("batch"))
                else {
                    return Err(matching::Mismatch {
                        path: ".batch".into(),
                        detail: "not a batch".into(),
                    });
                };
                let mut shell_e = expected.clone();
                let mut shell_a = output.clone();
                shell_e["batch"] = json!([]);
                shell_a["batch"] = json!([]);
                let mut trial = self.bindings.clone();
                trial.try_match(&shell_e, &shell_a, self.mode)?;
                if want.len() != got.len() {
                    return Err(matching::Mismatch {
                        path: ".batch".into(),
                        detail: format!("expected {} responses, got {}", want.len(), got.len()),
                    });
                }
                // JSON-RPC lets a batch's responses come in any order.
                let mut used = vec![false; got.len()];
                for (i, w) in want.iter().enumerate() {
                    let found = (0..got.len())
                        .find(|&k| !used[k] && trial.try_match(w, &got[k], self.mode).is_ok());
                    match found {
                        Some(k) => used[k] = true,
                        None => {
                            return Err(matching::Mismatch {
                                path: format!(".batch[{i}]"),
                                detail: "no response in the batch matches".into(),
                            })
                        }
                    }
                }
                self.bindings = trial;
                Ok(())
            }
            _ => self.bindings.try_match(&expected, output, self.mode),
        }
    }

    /// Checks header patterns (`null`: must be absent), binding placeholders.
    fn check_headers(
        &mut self,
        patterns: &[(String, Value)],
        headers: &[(String, String)],
    ) -> Result<(), String> {
        for (name, pattern) in patterns {
            let (name, defined) = name
                .strip_suffix('?')
                .map_or((name.as_str(), false), |n| (n, true));
            if defined && self.mode == Mode::Lenient {
                continue;
            }
            let got = headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone());
            match (pattern, got) {
                (Value::Null, None) => {}
                (Value::Null, Some(v)) => return Err(format!("{name}: {v:?}, expected none")),
                (_, None) => return Err(format!("{name} is missing")),
                (p, Some(v)) => self
                    .bindings
                    .try_match(p, &Value::String(v), self.mode)
                    .map_err(|m| format!("{name}: {m}"))?,
            }
        }
        Ok(())
    }

    /// The first later `standalone_opened` step of `session`, on single pipes (whose
    /// standalone stream is open from the start, so its outputs may come early).
    fn hoist_target(&self, current: usize, session: &str) -> Option<usize> {
        if !self.transport.single_pipe() {
            return None;
        }
        self.vector.steps[current + 1..]
            .iter()
            .find(|s| s.session == session && matches!(s.input, Input::StandaloneOpened))
            .filter(|s| s.transports.includes(self.transport))
            .map(|s| s.index)
    }

    /// Handles one observation during `step`; Ok if it fit somewhere.
    async fn observe(
        &mut self,
        step: &Step,
        matched: &mut [bool],
        ev: Timed,
        target: Option<Instant>,
    ) -> Result<(), Difference> {
        if self.housekeeping(Some(step.index), &ev).await? {
            return Ok(());
        }
        let (session, output, key, headers) = match ev.event {
            Observed::PeerOutput {
                session, output, ..
            } => (session, output, None, Vec::new()),
            Observed::PeerClose { session, stream } => (
                session,
                json!({"to": "peer", "stream": stream, "close": true}),
                None,
                Vec::new(),
            ),
            Observed::UpstreamRequest {
                key,
                message,
                headers,
            } => {
                let output = json!({"to": "upstream", "message": message});
                // The header rules bind 2026-07-28 requests; anything else (a legacy
                // `initialize` sent upstream) is simply not what the vector expects.
                let modern = message
                    .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
                    .is_some();
                if let (true, Err(rule)) = (modern, upstream_rules(&message, &headers)) {
                    return Err(Difference {
                        step: Some(step.index),
                        summary: format!(
                            "upstream request breaks the 2026-07-28 transport: {rule}"
                        ),
                        expected: None,
                        actual: Some(with_headers(&output, &headers)),
                        context: None,
                    });
                }
                (self.owner_session(step), output, Some(key), headers)
            }
            Observed::UpstreamNotification { message } => (
                self.owner_session(step),
                json!({"to": "upstream", "message": message}),
                None,
                Vec::new(),
            ),
            Observed::UpstreamCancel { key } => {
                let id = self.upstream.id_of(key).unwrap_or(Value::Null);
                (
                    self.owner_session(step),
                    json!({"to": "upstream", "cancel": id}),
                    Some(key),
                    Vec::new(),
                )
            }
            _ => return Ok(()),
        };
        // Upstream outputs carry no session on the wire: they may belong to any.
        let sessions: Vec<String> = if output["to"] == "upstream" {
            let mut s: Vec<String> = step.expect.iter().map(|e| e.session.clone()).collect();
            s.dedup();
            if s.is_empty() {
                s.push(session.clone());
            }
            s
        } else {
            vec![session.clone()]
        };
        let mut closest = Placed::Unmatched(None, None);
        for s in &sessions {
            match self.place(&step.expect, matched, s, &output, key, &headers)? {
                Placed::Matched => {
                    if let (Input::Timer, Some(target)) = (&step.input, target) {
                        if ev.at + self.timing.early < target {
                            let early = target - ev.at;
                            return Err(Difference {
                                step: Some(step.index),
                                summary: format!(
                                    "came {} ms before the step's time",
                                    early.as_millis()
                                ),
                                expected: None,
                                actual: Some(output),
                                context: None,
                            });
                        }
                    }
                    return Ok(());
                }
                p @ Placed::Unmatched(Some(_), _) => closest = p,
                Placed::Unmatched(None, _) => {}
            }
        }
        if let Some(h) = self.hoist_target(step.index, &session) {
            let later = &self.vector.steps[h];
            let mut m = self
                .hoisted
                .remove(&h)
                .unwrap_or_else(|| vec![false; later.expect.len()]);
            let placed = self.place(&later.expect, &mut m, &session, &output, key, &headers)?;
            self.hoisted.insert(h, m);
            if matches!(placed, Placed::Matched) {
                return Ok(());
            }
        }
        for pattern in &step.absent {
            if self.bindings.matches(&pattern.value, &output, self.mode) {
                return Err(Difference {
                    step: Some(step.index),
                    summary: format!(
                        "the bridge sent what the vector says must not be sent ({})",
                        describe(&output)
                    ),
                    expected: None,
                    actual: Some(output),
                    context: None,
                });
            }
        }
        let auto = key.map(|key| self.auto_answer(step, matched, key, &output));
        if auto == Some(Auto::Answered) {
            return Ok(());
        }
        let (expected, why) = match closest {
            Placed::Unmatched(e, w) => (e, w),
            Placed::Matched => (None, None),
        };
        // A single pipe has no streams: show the expected one, not a spurious `null`.
        let mut output = output;
        if let (true, Some(stream)) = (
            self.transport.single_pipe(),
            expected.as_ref().and_then(|e| e.get("stream")),
        ) {
            output["stream"] = stream.clone();
        }
        let summary = match why {
            Some(w) => format!("output differs from what the vector expects {w}"),
            None => format!("unexpected output ({})", describe(&output)),
        };
        let difference = Difference {
            step: Some(step.index),
            summary,
            expected,
            actual: Some(output),
            context: None,
        };
        if auto == Some(Auto::Crossed) {
            // Answered; the step still waits for the discover it expects.
            self.crossed = Some(difference);
            return Ok(());
        }
        // A discover that crossed this step and was never followed by the awaited one
        // is the first difference; what came after it follows from it.
        Err(self.crossed.take().unwrap_or(difference))
    }

    /// Upstream traffic left to the bridge, unless the step expects that very method:
    /// `server/discover` (a bridge fetches and caches it when it likes) answered with
    /// the vector's discover result; a `subscriptions/listen` (a bridge may keep one
    /// open for the host whenever it likes: on a single pipe the host's standalone
    /// stream exists from the start) held open, its cancellation absorbed; pings.
    ///
    /// A `server/discover` the step expects, that did not match what it expects, is
    /// one of the bridge's own (its response cache's, say, with its own `clientInfo`)
    /// crossing the awaited one: answered all the same (`Auto::Crossed`), and its
    /// difference reported only if the awaited discover does not come.
    fn auto_answer(&mut self, step: &Step, matched: &[bool], key: u64, output: &Value) -> Auto {
        if output.get("cancel").is_some() {
            return if self.auto_keys.contains(&key) {
                Auto::Answered
            } else {
                Auto::No
            };
        }
        let Some(m) = output.get("message") else {
            return Auto::No;
        };
        let Some(id) = m.get("id").cloned() else {
            return Auto::No;
        };
        let method = m.get("method").and_then(Value::as_str).unwrap_or("");
        let expected_here = step.expect.iter().zip(matched).any(|(e, done)| {
            !done && e.value.pointer("/message/method").and_then(Value::as_str) == Some(method)
        });
        if expected_here && method != "server/discover" {
            return Auto::No;
        }
        let done = if expected_here {
            Auto::Crossed
        } else {
            Auto::Answered
        };
        let answer = match method {
            // The latest result the vector supplied, or the first it will supply (a
            // bridge may fetch it before the host says anything).
            "server/discover" => match self.discover.clone().or_else(|| {
                self.vector.steps.iter().find_map(|s| match &s.input {
                    Input::Discover { result } => Some(result.clone()),
                    _ => None,
                })
            }) {
                Some(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                None => return Auto::No,
            },
            "subscriptions/listen" => {
                self.auto_keys.insert(key);
                return Auto::Answered;
            }
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            _ => return Auto::No,
        };
        self.auto_keys.insert(key);
        self.note_cacheable(&answer);
        self.upstream.send(key, &answer, None);
        done
    }

    /// Remembers until when a result the upstream sent may be served from a cache
    /// (`ttlMs`, 2026-07-28 `server/utilities/caching`).
    fn note_cacheable(&mut self, msg: &Value) {
        let ttl = msg
            .pointer("/result/ttlMs")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if ttl > 0 {
            let until = Instant::now() + Duration::from_millis(ttl);
            self.fresh_until = Some(self.fresh_until.map_or(until, |u| u.max(until)));
        }
    }

    fn owner_session(&self, step: &Step) -> String {
        step.session.clone()
    }

    async fn collect(&mut self, step: &Step, target: Option<Instant>) -> Result<(), Difference> {
        let mut matched = self
            .hoisted
            .remove(&step.index)
            .unwrap_or_else(|| vec![false; step.expect.len()]);
        let observable: Vec<bool> = step.expect.iter().map(|e| self.observable(e)).collect();
        for (e, o) in step.expect.iter().zip(&observable) {
            if !o {
                self.notes.push(format!(
                    "step {}: output not observable on this wire: {}",
                    step.index,
                    matching::short(&e.value)
                ));
            }
        }
        self.crossed = None;
        let start = target.map_or_else(Instant::now, |t| t.max(Instant::now()));
        let deadline = start + self.timing.step;
        let any_expected = observable.iter().any(|o| *o);
        loop {
            let outputs_done = matched.iter().zip(&observable).all(|(m, o)| *m || !o);
            let heads_done = self
                .deferred
                .iter()
                .all(|d| d.seen || d.due != Some(step.index));
            if outputs_done && heads_done {
                break;
            }
            let Some(ev) = self.next_event(deadline).await else {
                let crossed = self.crossed.take();
                return Err(crossed.unwrap_or_else(|| self.missing(step, &matched, &observable)));
            };
            self.observe(step, &mut matched, ev, target).await?;
        }
        // The awaited discover came: a crossing one was the bridge's own.
        self.crossed = None;
        if !any_expected {
            // Give the bridge a moment, keeping what it does for the next step.
            let until = Instant::now() + self.timing.settle;
            while let Ok(Some(ev)) = tokio::time::timeout_at(until.into(), self.rx.recv()).await {
                if !self.housekeeping(Some(step.index), &ev).await? {
                    self.backlog.push_back(ev);
                }
            }
        }
        Ok(())
    }

    fn missing(&self, step: &Step, matched: &[bool], observable: &[bool]) -> Difference {
        let secs = self.timing.step.as_secs_f64();
        if let Some(j) = (0..step.expect.len()).find(|&j| !matched[j] && observable[j]) {
            return Difference {
                step: Some(step.index),
                summary: format!(
                    "expected output not seen within {secs:.1} s ({})",
                    describe(&step.expect[j].value)
                ),
                expected: Some(self.bindings.render(&step.expect[j].value)),
                actual: None,
                context: self.stderr_context(&step.session),
            };
        }
        let head = self
            .deferred
            .iter()
            .find(|d| !d.seen && d.due == Some(step.index));
        let whose = match head {
            Some(d) if d.step != step.index => format!("step {}'s request", d.step),
            _ => "the step's request".into(),
        };
        Difference {
            step: Some(step.index),
            summary: format!("no HTTP response to {whose} within {secs:.1} s"),
            expected: head.map(|d| expect_json(&d.expect, &self.bindings)),
            actual: None,
            context: None,
        }
    }

    fn stderr_context(&self, session: &str) -> Option<String> {
        match self.sessions.get(session).map(|s| &s.host) {
            Some(Host::Stdio(h)) => {
                let tail = h.stderr_tail();
                (!tail.trim().is_empty()).then(|| format!("bridge stderr (tail):\n{tail}"))
            }
            _ => None,
        }
    }

    /// After the last step: nothing more may come, and every awaited HTTP response
    /// must have arrived.
    async fn finish(&mut self) -> Result<(), Difference> {
        let last = self.vector.steps.last().map_or(0, |s| s.index);
        let until = Instant::now() + self.timing.quiet;
        let pending_heads = |p: &Self| p.deferred.iter().any(|d| !d.seen);
        let hard = until + self.timing.step;
        loop {
            let now = Instant::now();
            if now >= hard || (now >= until && !pending_heads(self)) {
                break;
            }
            let wait = if pending_heads(self) { hard } else { until };
            let Some(ev) = self.next_event(wait).await else {
                continue;
            };
            if self.housekeeping(Some(last), &ev).await? {
                continue;
            }
            let step = self.vector.steps.last().expect("a vector has steps");
            let mut none: Vec<bool> = Vec::new();
            let empty = Step {
                expect: Vec::new(),
                absent: step.absent.clone(),
                input: Input::Timer,
                at: None,
                ..step.clone()
            };
            self.observe(&empty, &mut none, ev, None)
                .await
                .map_err(|mut d| {
                    d.summary = format!("after the last step: {}", d.summary);
                    d
                })?;
        }
        if let Some(d) = self.deferred.iter().find(|d| !d.seen) {
            return Err(Difference {
                step: Some(d.step),
                summary: "the HTTP request of this step was never answered".into(),
                expected: Some(expect_json(&d.expect, &self.bindings)),
                actual: None,
                context: None,
            });
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        let mut http = false;
        for s in self.sessions.values_mut() {
            match &mut s.host {
                Host::Http(h) => {
                    if !s.closed && h.session_id().is_some() {
                        h.delete(u64::MAX);
                        http = true;
                    }
                }
                Host::Stdio(h) => h.stop(Duration::from_secs(2)).await,
            }
        }
        if http {
            // Let the DELETEs land before the next vector reuses the bridge, and let
            // whatever a shared bridge may have cached from this vector go stale, so
            // vectors stay independent.
            let mut until = Instant::now() + Duration::from_millis(200);
            if let Some(fresh) = self.fresh_until {
                if fresh > until + MAX_CACHE_WAIT {
                    self.notes.push("a result of this vector may still be cached by the bridge (its ttlMs is longer than the runner waits)".into());
                }
                until = until.max(fresh.min(until + MAX_CACHE_WAIT));
            }
            while tokio::time::timeout_at(until.into(), self.rx.recv())
                .await
                .is_ok_and(|e| e.is_some())
            {}
        }
        self.upstream.detach();
        self.sessions.clear();
    }
}

/// Whether a message is a JSON-RPC request.
fn is_request(m: &Value) -> bool {
    m.get("method").is_some() && m.get("id").is_some()
}

/// One output in a few words, for a difference's headline.
fn describe(output: &Value) -> String {
    let to = output["to"].as_str().unwrap_or("?");
    if let Some(id) = output.get("cancel") {
        return format!("cancel of upstream request {}", matching::short(id));
    }
    if output.get("close").is_some() {
        return format!(
            "{} closed without a response",
            matching::short(&output["stream"])
        );
    }
    if let Some(b) = output.get("batch").and_then(Value::as_array) {
        return format!("a batch of {} to the {to}", b.len());
    }
    let m = &output["message"];
    let what = match (m.get("method").and_then(Value::as_str), m.get("id")) {
        (Some(method), Some(_)) => format!("request {method}"),
        (Some(method), None) => format!("notification {method}"),
        (None, id) => {
            let id = id.map_or("-".into(), matching::short);
            match m.pointer("/error/code") {
                Some(code) => format!("error {code} for id {id}"),
                None => format!("result for id {id}"),
            }
        }
    };
    format!("{what} to the {to}")
}

fn same_kind(kind: &ExpectedKind, output: &Value) -> bool {
    let to = output["to"].as_str().unwrap_or("");
    match kind {
        ExpectedKind::PeerMessage { .. } => to == "peer" && output.get("message").is_some(),
        ExpectedKind::PeerBatch { .. } => to == "peer" && output.get("batch").is_some(),
        ExpectedKind::PeerClose { .. } => to == "peer" && output.get("close").is_some(),
        ExpectedKind::UpstreamRequest => to == "upstream" && output.get("message").is_some(),
        ExpectedKind::UpstreamCancel { .. } => to == "upstream" && output.get("cancel").is_some(),
    }
}

/// Whether an expectation is about the same message as an output (same method, or
/// the same response id), to pick the one a difference is shown against.
fn related(e: &Expected, output: &Value) -> bool {
    let (Some(em), Some(am)) = (e.value.get("message"), output.get("message")) else {
        return false;
    };
    match (em.get("method"), am.get("method")) {
        (Some(x), Some(y)) => x == y,
        (None, None) => {
            em.get("id") == am.get("id") || matching::placeholder_name(&em["id"]).is_some()
        }
        _ => false,
    }
}

fn with_headers(output: &Value, headers: &[(String, String)]) -> Value {
    let mut v = output.clone();
    let h: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(n, v)| (n.clone(), Value::String(v.clone())))
        .collect();
    v["http"] = json!({ "headers": h });
    v
}

fn head_json(
    status: u16,
    headers: &[(String, String)],
    expect: &HttpExpect,
    body: Option<&Value>,
) -> Value {
    let named: serde_json::Map<String, Value> = expect
        .headers
        .iter()
        .map(|(n, _)| {
            let bare = n.strip_suffix('?').unwrap_or(n);
            let v = headers
                .iter()
                .find(|(h, _)| h == bare)
                .map_or(Value::Null, |(_, v)| Value::String(v.clone()));
            (n.clone(), v)
        })
        .collect();
    let mut v = json!({ "status": status });
    if !named.is_empty() {
        v["headers"] = Value::Object(named);
    }
    if expect.body.is_some() {
        v["body"] = body.cloned().unwrap_or(Value::Null);
    }
    v
}

fn expect_json(expect: &HttpExpect, bindings: &Bindings) -> Value {
    let mut v = json!({});
    if let Some(s) = expect.status {
        v["status"] = match s {
            StatusPattern::Exact(n) | StatusPattern::Defined(n) => json!(n),
            StatusPattern::Class(_) => json!(s.to_string()),
        };
    }
    if !expect.headers.is_empty() {
        v["headers"] = Value::Object(
            expect
                .headers
                .iter()
                .map(|(n, p)| (n.clone(), bindings.render(p)))
                .collect(),
        );
    }
    if let Some(b) = &expect.body {
        v["body"] = bindings.render(b);
    }
    v
}

/// What every 2026-07-28 client MUST put on a POST
/// (`2026-07-28/basic/transports/streamable-http`, "Sending Messages" and "Request
/// Metadata").
fn upstream_rules(message: &Value, headers: &[(String, String)]) -> Result<(), String> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let accept = get("accept").unwrap_or("").to_ascii_lowercase();
    if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
        return Err(format!(
            "Accept must list application/json and text/event-stream (got {:?}) — #sending-messages",
            get("accept").unwrap_or("")
        ));
    }
    let version = message
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str);
    match (get("mcp-protocol-version"), version) {
        (None, _) => {
            return Err("MCP-Protocol-Version header missing — #protocol-version-header".into())
        }
        (Some(h), Some(v)) if h != v => {
            return Err(format!(
                "MCP-Protocol-Version {h:?} differs from _meta's {v:?} — #protocol-version-header"
            ))
        }
        _ => {}
    }
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    if get("mcp-method") != Some(method) {
        return Err(format!(
            "Mcp-Method must be {method:?} (got {:?}) — #standard-request-headers",
            get("mcp-method")
        ));
    }
    let name_field = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    if let Some(field) = name_field {
        if let Some(want) = message
            .pointer(&format!("/params/{field}"))
            .and_then(Value::as_str)
        {
            let got = get("mcp-name").map(decode_header_value);
            if got.as_deref() != Some(want) {
                return Err(format!(
                    "Mcp-Name must carry params.{field} {want:?} (got {:?}) — #standard-request-headers",
                    get("mcp-name")
                ));
            }
        }
    }
    Ok(())
}

/// A header value in the Base64 sentinel form (`=?base64?…?=`) decoded, else as is.
fn decode_header_value(v: &str) -> String {
    if let Some(inner) = v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(inner) {
            if let Ok(s) = String::from_utf8(bytes) {
                return s;
            }
        }
    }
    v.to_owned()
}
