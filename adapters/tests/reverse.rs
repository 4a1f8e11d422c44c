//! The reverse machine's bounds and error paths, one behaviour per test, driven the way
//! the gateway's driver drives it (see `reverse_vectors.rs` for whole transcripts).

use dualera_adapters::jsonrpc::{Message, Notification, Request, RequestId, Response};
use dualera_adapters::reverse::{
    Config, Event, HostKey, HostRequest, LegacySession, OpenedState, Partition, ReverseError,
    RoundState, SessionState,
};
use dualera_adapters::Timestamp;
use serde_json::{json, Map, Value};
use std::time::Duration;

fn digest(bytes: &[u8]) -> String {
    // Not a cryptographic hash: the tests only need equal bytes to give equal text.
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn config() -> Config {
    let mut c = Config::new(digest);
    c.ping_interval = Duration::ZERO;
    c
}

fn partition(capabilities: Value, client_info: Value) -> Partition {
    Partition {
        session: "s1".into(),
        principal: "alice".into(),
        capabilities,
        client_info,
    }
}

const T0: Timestamp = Timestamp::from_millis(0);

struct Harness {
    m: LegacySession,
    next_host: u64,
    /// The `initialize` request's id.
    init: RequestId,
    /// What creating the machine emitted, until read.
    first: Vec<Event>,
}

impl Harness {
    fn new(config: Config) -> Self {
        Self::with(
            config,
            partition(
                json!({"elicitation": {}, "sampling": {}, "roots": {}}),
                json!({"name": "h", "version": "1"}),
            ),
        )
    }

    fn with(config: Config, partition: Partition) -> Self {
        let mut m = LegacySession::new(config, partition, T0);
        let first: Vec<Event> = std::iter::from_fn(|| m.poll_event()).collect();
        let init = upstream_request_ids(&first)[0].clone();
        Self {
            m,
            next_host: 0,
            init,
            first,
        }
    }

    fn events(&mut self) -> Vec<Event> {
        let mut out = std::mem::take(&mut self.first);
        out.extend(std::iter::from_fn(|| self.m.poll_event()));
        out
    }

    /// Answers `initialize` with 2025-11-25 and full capabilities.
    fn ready(&mut self) -> Vec<Event> {
        self.events();
        let id = self.init.clone();
        self.upstream(Message::Response(Response::result(
            id,
            json!({"protocolVersion": "2025-11-25", "serverInfo": {"name": "s", "version": "1"},
                   "capabilities": {"tools": {}, "logging": {}, "resources": {"subscribe": true}}}),
        )))
    }

    fn request(
        &mut self,
        method: &str,
        params: Value,
        state: OpenedState,
    ) -> (HostKey, Vec<Event>) {
        self.request_as("alice", method, params, state)
    }

    fn request_as(
        &mut self,
        principal: &str,
        method: &str,
        params: Value,
        state: OpenedState,
    ) -> (HostKey, Vec<Event>) {
        self.next_host += 1;
        let host = HostKey(self.next_host);
        let params: Map<String, Value> = serde_json::from_value(params).unwrap();
        self.m
            .handle_host_request(
                HostRequest {
                    host,
                    id: RequestId::Number(self.next_host as i64),
                    method: method.into(),
                    params,
                    principal: principal.into(),
                    state,
                },
                T0,
            )
            .unwrap();
        (host, self.events())
    }

    fn upstream(&mut self, message: Message) -> Vec<Event> {
        self.upstream_on(None, message)
    }

    fn upstream_on(&mut self, on: Option<&RequestId>, message: Message) -> Vec<Event> {
        self.m.handle_upstream_message(on, message, T0).unwrap();
        self.events()
    }
}

fn upstream_request_ids(events: &[Event]) -> Vec<RequestId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToUpstream {
                message: Message::Request(r),
            } => Some(r.id.clone()),
            _ => None,
        })
        .collect()
}

fn server_request(id: &str, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id: RequestId::String(id.into()),
        method: method.into(),
        params: Some(params),
    })
}

/// The host's error (code, `data.reason`) in `events`, if any.
fn host_error(events: &[Event]) -> Option<(i64, String)> {
    events.iter().find_map(|e| match e {
        Event::ToHost {
            message: Message::Response(Response {
                outcome: Err(e), ..
            }),
            ..
        } => Some((
            e.code.0,
            e.data
                .as_ref()
                .and_then(|d| d["reason"].as_str())
                .unwrap_or("")
                .to_owned(),
        )),
        _ => None,
    })
}

fn upstream_error(events: &[Event]) -> Option<(i64, Value)> {
    events.iter().find_map(|e| match e {
        Event::ToUpstream {
            message: Message::Response(Response {
                outcome: Err(e), ..
            }),
        } => Some((e.code.0, e.data.clone().unwrap_or(Value::Null))),
        _ => None,
    })
}

fn round_state(events: &[Event]) -> Option<RoundState> {
    events.iter().find_map(|e| match e {
        Event::InputRequired { state, .. } => Some(state.clone()),
        _ => None,
    })
}

fn call_params() -> Value {
    json!({"name": "t", "arguments": {"a": 1}})
}

fn retry_params(responses: Value) -> Value {
    json!({"name": "t", "arguments": {"a": 1}, "inputResponses": responses})
}

/// A tools/call on a ready session, with the server's elicitation parked: the round's
/// state and the legacy call id.
fn one_round(h: &mut Harness) -> (RoundState, RequestId) {
    h.ready();
    let (_, events) = h.request("tools/call", call_params(), OpenedState::Absent);
    let call = upstream_request_ids(&events)[0].clone();
    let events = h.upstream_on(
        Some(&call),
        server_request(
            "e1",
            "elicitation/create",
            json!({"message": "m", "requestedSchema": {}}),
        ),
    );
    (round_state(&events).expect("a round"), call)
}

#[test]
fn initialize_carries_the_hosts_info_and_legacy_capabilities() {
    let mut h = Harness::new(config());
    let events = h.events();
    let Event::ToUpstream {
        message: Message::Request(init),
    } = &events[0]
    else {
        panic!("{events:?}")
    };
    assert_eq!(init.method, "initialize");
    assert_eq!(
        init.params.as_ref().unwrap(),
        &json!({"protocolVersion": "2025-11-25",
                "capabilities": {"elicitation": {"form": {}}, "sampling": {}, "roots": {}},
                "clientInfo": {"name": "h", "version": "1"}})
    );
}

#[test]
fn unusable_or_oversized_client_info_is_replaced() {
    for info in [
        json!({"name": "h"}),
        json!("text"),
        json!({"name": "h", "version": "1", "title": "x".repeat(5000)}),
    ] {
        let mut h = Harness::with(config(), partition(json!({}), info));
        let events = h.events();
        let Event::ToUpstream {
            message: Message::Request(init),
        } = &events[0]
        else {
            panic!()
        };
        assert_eq!(
            init.params.as_ref().unwrap()["clientInfo"]["name"],
            "dualera"
        );
    }
    // Fields that are not Implementation's are not relayed.
    let mut h = Harness::with(
        config(),
        partition(
            json!({}),
            json!({"name": "h", "version": "1", "secret": "x"}),
        ),
    );
    let events = h.events();
    let Event::ToUpstream {
        message: Message::Request(init),
    } = &events[0]
    else {
        panic!()
    };
    assert_eq!(
        init.params.as_ref().unwrap()["clientInfo"],
        json!({"name": "h", "version": "1"})
    );
}

#[test]
fn the_initialize_queue_is_bounded() {
    let mut c = config();
    c.max_queued = 2;
    let mut h = Harness::new(c);
    h.events();
    for _ in 0..2 {
        let (_, events) = h.request("tools/list", json!({}), OpenedState::Absent);
        assert!(events.is_empty());
    }
    let (_, events) = h.request("tools/list", json!({}), OpenedState::Absent);
    assert_eq!(host_error(&events), Some((-32603, "queueFull".into())));
    assert_eq!(h.m.queued(), 2);
}

#[test]
fn a_host_gone_while_queued_is_never_sent() {
    let mut h = Harness::new(config());
    let (host, _) = h.request("tools/list", json!({}), OpenedState::Absent);
    h.m.handle_host_gone(host);
    let events = h.ready();
    assert_eq!(
        events.len(),
        1,
        "only notifications/initialized: {events:?}"
    );
}

#[test]
fn calls_in_progress_are_bounded() {
    let mut c = config();
    c.max_calls = 1;
    let mut h = Harness::new(c);
    h.ready();
    h.request("tools/list", json!({}), OpenedState::Absent);
    let (_, events) = h.request("tools/list", json!({}), OpenedState::Absent);
    assert_eq!(host_error(&events), Some((-32603, "tooManyCalls".into())));
    assert_eq!(h.m.calls(), 1);
}

#[test]
fn a_host_key_in_use_is_refused() {
    let mut h = Harness::new(config());
    h.ready();
    h.request("tools/list", json!({}), OpenedState::Absent);
    let again = h.m.handle_host_request(
        HostRequest {
            host: HostKey(1),
            id: RequestId::Number(9),
            method: "tools/list".into(),
            params: Map::new(),
            principal: "alice".into(),
            state: OpenedState::Absent,
        },
        T0,
    );
    assert_eq!(again, Err(ReverseError::DuplicateHost { host: HostKey(1) }));
}

#[test]
fn unknown_and_lost_upstream_ids() {
    let mut h = Harness::new(config());
    h.ready();
    let stray = h.m.handle_upstream_message(
        None,
        Message::Response(Response::result(RequestId::Number(77), json!({}))),
        T0,
    );
    assert!(matches!(stray, Err(ReverseError::UnknownUpstreamId { .. })));
    let (_, events) = h.request("tools/list", json!({}), OpenedState::Absent);
    let id = upstream_request_ids(&events)[0].clone();
    h.m.handle_upstream_lost(&id, T0).unwrap();
    assert_eq!(
        host_error(&h.events()),
        Some((-32603, "upstreamLost".into()))
    );
    assert_eq!(h.m.calls(), 0);
}

#[test]
fn a_refused_initialize_fails_the_session() {
    let mut h = Harness::new(config());
    let init = h.init.clone();
    h.request("tools/list", json!({}), OpenedState::Absent);
    let events = h.upstream(Message::Response(Response::error(
        Some(init),
        dualera_adapters::ErrorObject::new(dualera_adapters::ErrorCode(-32602), "no"),
    )));
    assert_eq!(
        host_error(&events),
        Some((-32603, "upstreamUnusable".into()))
    );
    assert!(events.iter().any(|e| matches!(e, Event::Failed { .. })));
    assert_eq!(h.m.state(), &SessionState::Failed);
    let after =
        h.m.handle_upstream_message(None, server_request("x", "ping", json!({})), T0);
    assert_eq!(after, Err(ReverseError::Closed));
}

#[test]
fn another_principal_cannot_use_the_round_state() {
    let mut h = Harness::new(config());
    let (state, _) = one_round(&mut h);
    let (_, events) = h.request_as(
        "mallory",
        "tools/call",
        retry_params(json!({"in1": {"action": "decline"}})),
        OpenedState::Opened(state),
    );
    assert_eq!(host_error(&events), Some((-32602, "otherPrincipal".into())));
    assert!(upstream_request_ids(&events).is_empty());
}

#[test]
fn input_requests_per_call_are_bounded() {
    let mut c = config();
    c.max_input_requests = 1;
    let mut h = Harness::new(c);
    let (_, call) = one_round(&mut h);
    // Detached between rounds: the next one waits for the retry, up to the bound.
    let events = h.upstream_on(Some(&call), server_request("e2", "roots/list", json!({})));
    assert_eq!(
        upstream_error(&events).map(|(c, d)| (c, d["reason"].clone())),
        Some((-32603, json!("tooManyInputRequests")))
    );
    assert_eq!(h.m.parked(), 1);
}

#[test]
fn rounds_are_bounded() {
    let mut c = config();
    c.max_rounds = 1;
    let mut h = Harness::new(c);
    let (state, call) = one_round(&mut h);
    h.request(
        "tools/call",
        retry_params(json!({"in1": {"action": "decline"}})),
        OpenedState::Opened(state),
    );
    let events = h.upstream_on(Some(&call), server_request("e2", "roots/list", json!({})));
    assert!(matches!(
        &events[0],
        Event::ToUpstream { message: Message::Notification(n) } if n.method == "notifications/cancelled"
    ));
    assert_eq!(host_error(&events), Some((-32603, "roundLimit".into())));
    assert_eq!(h.m.calls(), 0);
}

#[test]
fn a_result_between_rounds_waits_for_the_retry() {
    let mut h = Harness::new(config());
    let (state, call) = one_round(&mut h);
    let events = h.upstream(Message::Response(Response::result(
        call,
        json!({"content": []}),
    )));
    assert!(events.is_empty(), "kept for the retry: {events:?}");
    let (_, events) = h.request(
        "tools/call",
        retry_params(json!({"in1": {"action": "cancel"}})),
        OpenedState::Opened(state),
    );
    // The answer still goes to the server, then the kept result to the host.
    assert!(matches!(
        &events[0],
        Event::ToUpstream {
            message: Message::Response(_)
        }
    ));
    assert!(matches!(
        &events[1],
        Event::ToHost { message: Message::Response(Response { outcome: Ok(r), .. }), .. }
            if r["resultType"] == "complete"
    ));
    assert_eq!(h.m.calls(), 0);
}

#[test]
fn a_withdrawn_request_may_still_be_answered_and_is_dropped() {
    let mut h = Harness::new(config());
    let (state, _) = one_round(&mut h);
    h.upstream(Message::Notification(Notification {
        method: "notifications/cancelled".into(),
        params: Some(json!({"requestId": "e1"})),
    }));
    assert_eq!(h.m.parked(), 0);
    let (_, events) = h.request(
        "tools/call",
        retry_params(json!({"in1": {"action": "accept", "content": {}}})),
        OpenedState::Opened(state),
    );
    assert!(events.is_empty(), "nothing to answer: {events:?}");
}

#[test]
fn server_requests_that_belong_to_no_single_call_are_refused() {
    let mut h = Harness::new(config());
    h.ready();
    h.request("tools/call", call_params(), OpenedState::Absent);
    h.request("tools/call", call_params(), OpenedState::Absent);
    let events = h.upstream(server_request("e1", "roots/list", json!({})));
    assert_eq!(
        upstream_error(&events).map(|(c, d)| (c, d["reason"].clone())),
        Some((-32603, json!("noHostRequest")))
    );
    let events = h.upstream(server_request("x", "tools/call", json!({})));
    assert_eq!(upstream_error(&events).map(|(c, _)| c), Some(-32601));
}

#[test]
fn input_is_never_asked_during_a_method_without_rounds() {
    let mut h = Harness::new(config());
    h.ready();
    let (_, events) = h.request("tools/list", json!({}), OpenedState::Absent);
    let id = upstream_request_ids(&events)[0].clone();
    let events = h.upstream_on(Some(&id), server_request("e1", "roots/list", json!({})));
    assert_eq!(
        upstream_error(&events).map(|(c, d)| (c, d["reason"].clone())),
        Some((-32603, json!("inputNotAllowed")))
    );
}

#[test]
fn an_elicitation_the_host_did_not_declare_at_all_is_method_not_found() {
    let mut h = Harness::with(
        config(),
        partition(
            json!({"sampling": {}}),
            json!({"name": "h", "version": "1"}),
        ),
    );
    h.ready();
    h.request("tools/call", call_params(), OpenedState::Absent);
    let events = h.upstream(server_request(
        "e1",
        "elicitation/create",
        json!({"message": "m", "requestedSchema": {}}),
    ));
    assert_eq!(upstream_error(&events).map(|(c, _)| c), Some(-32601));
}

#[test]
fn listeners_and_subscriptions_are_bounded() {
    let mut c = config();
    c.max_listeners = 1;
    c.max_subscriptions = 2;
    let mut h = Harness::new(c);
    h.ready();
    let (_, events) = h.request(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": ["a", "b", "c"]}}),
        OpenedState::Absent,
    );
    assert_eq!(upstream_request_ids(&events).len(), 2);
    assert_eq!(h.m.subscriptions().count(), 2);
    let (_, events) = h.request(
        "subscriptions/listen",
        json!({"notifications": {}}),
        OpenedState::Absent,
    );
    assert_eq!(
        host_error(&events),
        Some((-32603, "tooManyListeners".into()))
    );
    assert_eq!(h.m.listeners(), 1);
}

#[test]
fn closing_answers_what_is_waiting() {
    let mut h = Harness::new(config());
    h.ready();
    h.request("tools/list", json!({}), OpenedState::Absent);
    h.m.close();
    assert_eq!(
        host_error(&h.events()),
        Some((-32603, "upstreamUnusable".into()))
    );
    let refused = h.m.handle_host_request(
        HostRequest {
            host: HostKey(50),
            id: RequestId::Number(50),
            method: "tools/list".into(),
            params: Map::new(),
            principal: "alice".into(),
            state: OpenedState::Absent,
        },
        T0,
    );
    assert_eq!(refused, Err(ReverseError::Closed));
}

#[test]
fn a_fresh_request_of_another_principal_is_refused() {
    let mut h = Harness::new(config());
    h.ready();
    let refused = h.m.handle_host_request(
        HostRequest {
            host: HostKey(40),
            id: RequestId::Number(40),
            method: "tools/list".into(),
            params: Map::new(),
            principal: "mallory".into(),
            state: OpenedState::Absent,
        },
        T0,
    );
    assert_eq!(refused, Err(ReverseError::OtherPrincipal));
    assert!(h.events().is_empty());
}

#[test]
fn an_expiry_while_initializing_fails_the_session() {
    let mut h = Harness::new(config());
    h.request("tools/list", json!({}), OpenedState::Absent);
    let init = h.init.clone();
    h.m.handle_upstream_expired(&[init], T0).unwrap();
    let events = h.events();
    assert_eq!(
        host_error(&events),
        Some((-32603, "upstreamUnusable".into()))
    );
    assert_eq!(h.m.state(), &SessionState::Failed);
}

#[test]
fn an_initialize_without_answer_fails_the_session_in_time() {
    let mut c = config();
    c.initialize_timeout = Duration::from_millis(500);
    let mut h = Harness::new(c);
    h.request("tools/list", json!({}), OpenedState::Absent);
    assert_eq!(h.m.poll_timeout(), Some(Timestamp::from_millis(500)));
    h.m.handle_timeout(Timestamp::from_millis(499));
    assert!(h.events().is_empty());
    h.m.handle_timeout(Timestamp::from_millis(500));
    assert_eq!(
        host_error(&h.events()),
        Some((-32603, "upstreamUnusable".into()))
    );
    assert_eq!(h.m.poll_timeout(), None);
}

#[test]
fn unanswered_requests_of_its_own_are_remembered_within_a_bound() {
    let mut h = Harness::new(config());
    h.ready();
    let mut last = None;
    for i in 0..600 {
        let level = if i % 2 == 0 { "info" } else { "error" };
        let (_, events) = h.request(
            "tools/list",
            json!({"_meta": {"io.modelcontextprotocol/logLevel": level}}),
            OpenedState::Absent,
        );
        let ids = upstream_request_ids(&events);
        assert_eq!(ids.len(), 2, "logging/setLevel, then the call");
        last = Some(ids[0].clone());
        // The call itself ends; only the level requests stay unanswered.
        h.m.handle_upstream_message(
            None,
            Message::Response(Response::result(ids[1].clone(), json!({"tools": []}))),
            T0,
        )
        .unwrap();
        h.events();
    }
    let late = h.m.handle_upstream_message(
        None,
        Message::Response(Response::result(last.unwrap(), json!({}))),
        T0,
    );
    assert!(matches!(late, Err(ReverseError::UnknownUpstreamId { .. })));
}

/// A retry of `state` handed to the machine at `at`.
fn retry_at(h: &mut Harness, state: RoundState, at: Timestamp) -> Vec<Event> {
    h.next_host += 1;
    let host = HostKey(h.next_host);
    let params: Map<String, Value> =
        serde_json::from_value(retry_params(json!({"in1": {"action": "decline"}}))).unwrap();
    h.m.handle_host_request(
        HostRequest {
            host,
            id: RequestId::Number(h.next_host as i64),
            method: "tools/call".into(),
            params,
            principal: "alice".into(),
            state: OpenedState::Opened(state),
        },
        at,
    )
    .unwrap();
    h.events()
}

#[test]
fn round_expiry_is_wall_time_the_driver_clock_plus_the_unix_time_at_zero() {
    let unix_at_zero = 1_700_000_000_000;
    let wait = Duration::from_secs(300);
    let mut c = config();
    c.unix_at_zero_ms = unix_at_zero;
    c.retry_wait = wait;
    let mut h = Harness::new(c.clone());
    let (state, _) = one_round(&mut h);
    // The round was asked at T0: it lapses `retry_wait` later, in Unix milliseconds.
    assert_eq!(state.expires_at_ms, unix_at_zero + 300_000);
    // One millisecond before: the retry answers the round.
    let just_before = T0.saturating_add(wait - Duration::from_millis(1));
    let events = retry_at(&mut h, state, just_before);
    assert_eq!(host_error(&events), None, "{events:?}");
    assert_eq!(upstream_error(&events), None);

    // At the instant of expiry: expired (2026-07-28 basic/patterns/mrtr: a state past
    // its expiry is refused).
    let mut h = Harness::new(c);
    let (state, _) = one_round(&mut h);
    let events = retry_at(&mut h, state, T0.saturating_add(wait));
    assert_eq!(host_error(&events), Some((-32602, "expiredState".into())));
}
