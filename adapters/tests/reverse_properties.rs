//! Property test of the reverse machine: generated sequences of everything a driver can
//! feed it (host requests of every kind, retries with the states it issued, with
//! foreign principals, stale and forged states; hosts going away; server results,
//! errors, live requests of every kind on and off a call's stream, notifications,
//! losses, session expiry; timers), with the invariants checked after every step:
//!
//! - nothing panics, and an input that returns `Err` emits nothing;
//! - every host request gets at most one final answer (a response or an
//!   `input_required`), only host keys handed in are addressed, and no host key is
//!   answered after it went away;
//! - every round state names this partition's session and principal;
//! - calls, the queue, parked requests, listeners and subscriptions stay within their
//!   bounds, and one input emits a bounded number of events;
//! - `poll_timeout` never returns a time before the last `now` handed in.
//!
//! Seeded like the session machine's properties (`DUALERA_PROPTEST_SEED`,
//! `DUALERA_PROPTEST_CASES`).

use dualera_adapters::jsonrpc::{
    ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response,
};
use dualera_adapters::reverse::{
    Config, Event, HostKey, HostRequest, LegacySession, OpenedState, Partition, RoundState,
};
use dualera_adapters::Timestamp;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[path = "../../tests/seeded/mod.rs"]
mod seeded;
use seeded::{run_seeded, Check};

const METHODS: [&str; 7] = [
    "tools/call",
    "prompts/get",
    "resources/read",
    "tools/list",
    "server/discover",
    "subscriptions/listen",
    "completion/complete",
];
const SERVER_METHODS: [&str; 6] = [
    "elicitation/create",
    "sampling/createMessage",
    "roots/list",
    "ping",
    "tools/call",
    "elicitation/create",
];
const VERSIONS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2099-01-01",
];

#[derive(Debug, Clone)]
enum Op {
    Host {
        method: usize,
        level: bool,
        progress: bool,
        args: u8,
    },
    Retry {
        state: usize,
        principal_ok: bool,
        answer_all: bool,
        args_ok: bool,
    },
    Forged,
    Gone {
        host: usize,
    },
    Init {
        version: usize,
        fail: bool,
    },
    Answer {
        id: usize,
        ok: bool,
    },
    ServerRequest {
        method: usize,
        on: Option<usize>,
        url: bool,
        id: u8,
    },
    Notify {
        kind: u8,
        target: usize,
    },
    ServerCancel {
        id: u8,
    },
    Lost {
        id: usize,
    },
    Expired {
        id: Option<usize>,
    },
    Tick {
        ms: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..METHODS.len(), any::<bool>(), any::<bool>(), 0u8..3)
            .prop_map(|(method, level, progress, args)| Op::Host { method, level, progress, args }),
        3 => (0usize..8, any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(state, principal_ok, answer_all, args_ok)| Op::Retry { state, principal_ok, answer_all, args_ok }),
        1 => Just(Op::Forged),
        2 => (0usize..16).prop_map(|host| Op::Gone { host }),
        1 => (0..VERSIONS.len(), any::<bool>()).prop_map(|(version, fail)| Op::Init { version, fail }),
        4 => (0usize..6, any::<bool>()).prop_map(|(id, ok)| Op::Answer { id, ok }),
        4 => (0..SERVER_METHODS.len(), proptest::option::of(0usize..3), any::<bool>(), 0u8..6)
            .prop_map(|(method, on, url, id)| Op::ServerRequest { method, on, url, id }),
        2 => (0u8..6, 0usize..16).prop_map(|(kind, target)| Op::Notify { kind, target }),
        1 => (0u8..6).prop_map(|id| Op::ServerCancel { id }),
        1 => (0usize..16).prop_map(|id| Op::Lost { id }),
        1 => proptest::option::of(0usize..16).prop_map(|id| Op::Expired { id }),
        2 => (0u16..2000).prop_map(|ms| Op::Tick { ms }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    caps: u8,
    /// Whether the session is initialized (with a revision the table knows) first.
    ready: bool,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u8..8,
        proptest::bool::weighted(0.8),
        proptest::collection::vec(op(), 1..60),
    )
        .prop_map(|(caps, ready, ops)| Case { caps, ready, ops })
}

fn digest(bytes: &[u8]) -> String {
    format!(
        "{}:{}",
        bytes.len(),
        bytes.iter().map(|b| u64::from(*b)).sum::<u64>()
    )
}

const MAX_CALLS: usize = 4;
const MAX_QUEUED: usize = 3;
const MAX_INPUT: usize = 2;
const MAX_LISTENERS: usize = 2;
const MAX_SUBSCRIPTIONS: usize = 3;
const MAX_EVENTS_PER_INPUT: usize = 64;

/// Rounds issued over the whole run: the generator must reach them.
static ROUNDS: AtomicUsize = AtomicUsize::new(0);

struct Harness {
    m: LegacySession,
    now: u64,
    next_host: u64,
    hosts: Vec<HostKey>,
    answered: HashSet<HostKey>,
    gone: HashSet<HostKey>,
    upstream: Vec<RequestId>,
    states: Vec<RoundState>,
}

impl Harness {
    fn new(case: &Case) -> Self {
        let mut c = Config::new(digest);
        c.max_calls = MAX_CALLS;
        c.max_queued = MAX_QUEUED;
        c.max_input_requests = MAX_INPUT;
        c.max_rounds = 3;
        c.max_listeners = MAX_LISTENERS;
        c.max_subscriptions = MAX_SUBSCRIPTIONS;
        c.retry_wait = Duration::from_millis(1500);
        c.ping_interval = Duration::from_millis(700);
        let mut caps = Map::new();
        if case.caps & 1 != 0 {
            caps.insert("elicitation".into(), json!({"form": {}, "url": {}}));
        }
        if case.caps & 2 != 0 {
            caps.insert("sampling".into(), json!({}));
        }
        if case.caps & 4 != 0 {
            caps.insert("roots".into(), json!({}));
        }
        let partition = Partition {
            session: "p".into(),
            principal: "alice".into(),
            capabilities: Value::Object(caps),
            client_info: json!({"name": "h", "version": "1"}),
        };
        let mut h = Self {
            m: LegacySession::new(c, partition, Timestamp::from_millis(0)),
            now: 0,
            next_host: 0,
            hosts: Vec::new(),
            answered: HashSet::new(),
            gone: HashSet::new(),
            upstream: Vec::new(),
            states: Vec::new(),
        };
        let _ = h.drain();
        h
    }

    fn t(&self) -> Timestamp {
        Timestamp::from_millis(self.now)
    }

    fn drain(&mut self) -> Result<usize, String> {
        let mut n = 0;
        while let Some(event) = self.m.poll_event() {
            n += 1;
            if n > MAX_EVENTS_PER_INPUT {
                return Err("too many events for one input".into());
            }
            let final_to = match &event {
                Event::ToUpstream {
                    message: Message::Request(r),
                } => {
                    self.upstream.push(r.id.clone());
                    None
                }
                Event::ToHost { host, message } => {
                    if !self.hosts.contains(host) {
                        return Err(format!("event for {host}, never handed in"));
                    }
                    matches!(message, Message::Response(_)).then_some(*host)
                }
                Event::InputRequired { host, state, .. } => {
                    if state.session != "p" || state.principal != "alice" {
                        return Err(format!("a round state of another partition: {state:?}"));
                    }
                    self.states.push(state.clone());
                    ROUNDS.fetch_add(1, Ordering::Relaxed);
                    Some(*host)
                }
                _ => None,
            };
            if let Some(host) = final_to {
                if !self.answered.insert(host) {
                    return Err(format!("{host} answered twice"));
                }
                if self.gone.contains(&host) {
                    return Err(format!("{host} answered after it went away"));
                }
            }
        }
        Ok(n)
    }

    fn host_request(
        &mut self,
        method: &str,
        params: Value,
        principal: &str,
        state: OpenedState,
    ) -> Result<(), String> {
        self.next_host += 1;
        let host = HostKey(self.next_host);
        self.hosts.push(host);
        let params: Map<String, Value> =
            serde_json::from_value(params).map_err(|e| e.to_string())?;
        let result = self.m.handle_host_request(
            HostRequest {
                host,
                id: RequestId::Number(self.next_host as i64),
                method: method.into(),
                params,
                principal: principal.into(),
                state,
            },
            self.t(),
        );
        self.after(result.map_err(|e| e.to_string()))
    }

    /// An input's outcome: a refused input emits nothing.
    fn after(&mut self, result: Result<(), String>) -> Result<(), String> {
        let n = self.drain()?;
        if result.is_err() && n > 0 {
            return Err(format!("a refused input emitted {n} events"));
        }
        Ok(())
    }

    fn upstream_id(&self, i: usize) -> Option<RequestId> {
        if self.upstream.is_empty() {
            None
        } else {
            // Counted from the newest: small indices are the calls just made.
            let n = self.upstream.len();
            Some(self.upstream[n - 1 - i % n].clone())
        }
    }

    fn step(&mut self, op: &Op) -> Check {
        match op {
            Op::Host {
                method,
                level,
                progress,
                args,
            } => {
                let method = METHODS[*method];
                let mut meta = Map::new();
                if *level {
                    meta.insert("io.modelcontextprotocol/logLevel".into(), json!("info"));
                }
                if *progress {
                    meta.insert("progressToken".into(), json!("tok"));
                }
                let params = json!({"name": "t", "arguments": {"n": args}, "_meta": meta,
                    "notifications": {"toolsListChanged": true, "resourceSubscriptions": ["a", "b", "c", "d"]}});
                self.host_request(method, params, "alice", OpenedState::Absent)?;
            }
            Op::Retry {
                state,
                principal_ok,
                answer_all,
                args_ok,
            } => {
                let Some(st) = (!self.states.is_empty())
                    .then(|| self.states[state % self.states.len()].clone())
                else {
                    return Ok(());
                };
                let responses: Map<String, Value> = st
                    .parked
                    .keys()
                    .enumerate()
                    .filter(|(i, _)| *answer_all || *i == 0)
                    .map(|(_, k)| (k.clone(), json!({"action": "accept", "content": {}})))
                    .collect();
                // Calls are made with `n` in 0..3: `0` matches some, `9` none.
                let args = if *args_ok { 0 } else { 9 };
                let params =
                    json!({"name": "t", "arguments": {"n": args}, "inputResponses": responses});
                let principal = if *principal_ok { "alice" } else { "mallory" };
                let method = st.method.clone();
                self.host_request(&method, params, principal, OpenedState::Opened(st))?;
            }
            Op::Forged => {
                self.host_request("tools/call", json!({}), "alice", OpenedState::Invalid)?;
            }
            Op::Gone { host } => {
                if let Some(h) =
                    (!self.hosts.is_empty()).then(|| self.hosts[host % self.hosts.len()])
                {
                    self.m.handle_host_gone(h);
                    self.gone.insert(h);
                    self.drain()?;
                }
            }
            Op::Init { version, fail } => {
                let Some(id) = self.upstream.iter().rev().find(|_| true).cloned() else {
                    return Ok(());
                };
                // Answer the oldest upstream request as if it were initialize.
                let id = self.upstream.first().cloned().unwrap_or(id);
                let outcome = if *fail {
                    Err(ErrorObject::new(ErrorCode::INVALID_PARAMS, "no"))
                } else {
                    Ok(
                        json!({"protocolVersion": VERSIONS[*version], "serverInfo": {"name": "s", "version": "1"},
                        "capabilities": {"tools": {"listChanged": true}, "logging": {}, "resources": {"subscribe": true}}}),
                    )
                };
                let r = self.m.handle_upstream_message(
                    None,
                    Message::Response(Response {
                        id: Some(id),
                        outcome,
                    }),
                    self.t(),
                );
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::Answer { id, ok } => {
                let Some(id) = self.upstream_id(*id) else {
                    return Ok(());
                };
                let outcome = if *ok {
                    Ok(json!({"content": [], "tools": []}))
                } else {
                    Err(ErrorObject::new(ErrorCode(-32002), "gone"))
                };
                let r = self.m.handle_upstream_message(
                    None,
                    Message::Response(Response {
                        id: Some(id),
                        outcome,
                    }),
                    self.t(),
                );
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::ServerRequest {
                method,
                on,
                url,
                id,
            } => {
                let on = on.and_then(|i| self.upstream_id(i));
                let params = if *url {
                    json!({"mode": "url", "url": "https://x", "message": "m", "elicitationId": "e"})
                } else {
                    json!({"message": "m", "requestedSchema": {}, "messages": [], "maxTokens": 1})
                };
                let m = Message::Request(Request {
                    id: RequestId::Number(i64::from(*id)),
                    method: SERVER_METHODS[*method].into(),
                    params: Some(params),
                });
                let r = self.m.handle_upstream_message(on.as_ref(), m, self.t());
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::Notify { kind, target } => {
                let token = self
                    .upstream_id(*target)
                    .map(|i| i.to_value())
                    .unwrap_or(json!(0));
                let (method, params) = match kind {
                    0 => (
                        "notifications/progress",
                        json!({"progressToken": token, "progress": 1}),
                    ),
                    1 => (
                        "notifications/message",
                        json!({"level": "error", "data": "x"}),
                    ),
                    2 => ("notifications/tools/list_changed", json!({})),
                    3 => ("notifications/resources/updated", json!({"uri": "a"})),
                    4 => (
                        "notifications/elicitation/complete",
                        json!({"elicitationId": "e"}),
                    ),
                    _ => ("notifications/unknown", json!({})),
                };
                let on = self.upstream_id(*target);
                let r = self.m.handle_upstream_message(
                    on.as_ref(),
                    Message::Notification(Notification {
                        method: method.into(),
                        params: Some(params),
                    }),
                    self.t(),
                );
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::ServerCancel { id } => {
                let r = self.m.handle_upstream_message(
                    None,
                    Message::Notification(Notification {
                        method: "notifications/cancelled".into(),
                        params: Some(json!({"requestId": id})),
                    }),
                    self.t(),
                );
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::Lost { id } => {
                let Some(id) = self.upstream_id(*id) else {
                    return Ok(());
                };
                let r = self.m.handle_upstream_lost(&id, self.t());
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::Expired { id } => {
                let refused: Vec<RequestId> =
                    id.and_then(|i| self.upstream_id(i)).into_iter().collect();
                let r = self.m.handle_upstream_expired(&refused, self.t());
                self.after(r.map_err(|e| e.to_string()))?;
            }
            Op::Tick { ms } => {
                self.now += u64::from(*ms);
                self.m.handle_timeout(self.t());
                self.drain()?;
            }
        }
        self.check()
    }

    fn check(&self) -> Check {
        let m = &self.m;
        if m.calls() > MAX_CALLS {
            return Err(format!("{} calls", m.calls()));
        }
        if m.queued() > MAX_QUEUED {
            return Err(format!("{} queued", m.queued()));
        }
        if m.parked() > MAX_CALLS * MAX_INPUT {
            return Err(format!("{} parked", m.parked()));
        }
        if m.listeners() > MAX_LISTENERS {
            return Err(format!("{} listeners", m.listeners()));
        }
        if m.subscriptions().count() > MAX_SUBSCRIPTIONS {
            return Err("too many subscriptions".into());
        }
        if m.poll_timeout().is_some_and(|t| t.as_millis() < self.now) {
            return Err("a deadline in the past".into());
        }
        Ok(())
    }
}

fn run(case: &Case) -> Check {
    let mut h = Harness::new(case);
    if case.ready {
        h.step(&Op::Init {
            version: 0,
            fail: false,
        })?;
    }
    for (i, op) in case.ops.iter().enumerate() {
        h.step(op).map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    Ok(())
}

#[test]
fn reverse_machine_invariants() {
    run_seeded("reverse machine", 3_000, case(), run);
    assert!(
        ROUNDS.load(Ordering::Relaxed) > 100,
        "the generated cases hardly reach input_required rounds"
    );
}
