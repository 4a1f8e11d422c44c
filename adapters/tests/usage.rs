//! The machine's observations (`Event::Observed`): what a driver's metrics and
//! migration report are built from. Each test drives a session through its public API
//! and checks the exact observations, in order.

use dualera_adapters::jsonrpc::{parse_incoming, Incoming};
use dualera_adapters::usage::{
    FailureReason, Feature, LiveKind, LiveOutcome, Method, Observation, RequestOutcome,
};
use dualera_adapters::{
    Config, ErrorCode, ErrorObject, Event, Message, Notification, Request, RequestId, Response,
    Session, Timestamp,
};
use serde_json::{json, Value};
use std::time::Duration;

const T0: Timestamp = Timestamp::from_millis(0);

fn discover() -> Value {
    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
           "capabilities": {"tools": {}, "resources": {"subscribe": true}}})
}

fn request(id: i64, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id: RequestId::Number(id),
        method: method.into(),
        params: Some(params),
    })
}

fn notification(method: &str, params: Value) -> Message {
    Message::Notification(Notification {
        method: method.into(),
        params: Some(params),
    })
}

/// Every event, split into (observations, everything else).
fn drain(s: &mut Session) -> (Vec<Observation>, Vec<Event>) {
    let mut observed = Vec::new();
    let mut rest = Vec::new();
    while let Some(e) = s.poll_event() {
        match e {
            Event::Observed(o) => observed.push(o),
            other => rest.push(other),
        }
    }
    (observed, rest)
}

fn ended(id: i64, method: Method, outcome: RequestOutcome, rounds: u32) -> Observation {
    Observation::RequestEnded {
        id: RequestId::Number(id),
        method,
        outcome,
        rounds,
    }
}

fn session(config: Config, version: &str, caps: Value) -> Session {
    let mut s = Session::new(config);
    s.handle_discover(discover()).unwrap();
    s.handle_peer_message(
        request(
            0,
            "initialize",
            json!({"protocolVersion": version, "capabilities": caps,
                   "clientInfo": {"name": "h", "version": "1"}}),
        ),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::SessionReady,
            ended(0, Method::Initialize, RequestOutcome::Ok, 0)
        ]
    );
    s
}

fn upstream_ids(events: &[Event]) -> Vec<RequestId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToUpstream { request, .. } => Some(request.id.clone()),
            _ => None,
        })
        .collect()
}

fn live_ids(events: &[Event]) -> Vec<RequestId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToPeer {
                message: Message::Request(r),
                ..
            } => Some(r.id.clone()),
            _ => None,
        })
        .collect()
}

fn answer_upstream(
    s: &mut Session,
    events: &[Event],
    result: Value,
) -> (Vec<Observation>, Vec<Event>) {
    let id = upstream_ids(events).pop().expect("an upstream request");
    s.handle_upstream_message(
        Some(id.clone()),
        Message::Response(Response::result(id, result)),
        T0,
    )
    .unwrap();
    drain(s)
}

fn form() -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": "ok?",
        "requestedSchema": {"type": "object", "properties": {}}}})
}

fn input(requests: Value) -> Value {
    json!({"resultType": "input_required", "requestState": "st", "inputRequests": requests})
}

/// Sends `tools/call` `id`, answers its first attempt with one form elicitation;
/// returns the live request's id.
fn form_round(s: &mut Session, id: i64) -> RequestId {
    s.handle_peer_message(request(id, "tools/call", json!({"name": "t"})), T0)
        .unwrap();
    let (_, events) = drain(s);
    let (_, events) = answer_upstream(s, &events, input(json!({"a": form()})));
    live_ids(&events).pop().unwrap()
}

#[test]
fn local_requests_and_features_are_observed() {
    let mut s = session(Config::default(), "2025-11-25", json!({}));
    s.handle_peer_message(request(1, "ping", json!({})), T0)
        .unwrap();
    s.handle_peer_message(request(2, "logging/setLevel", json!({"level": "info"})), T0)
        .unwrap();
    s.handle_peer_message(request(3, "logging/setLevel", json!({"level": "loud"})), T0)
        .unwrap();
    s.handle_peer_message(
        request(4, "resources/subscribe", json!({"uri": "file:///a"})),
        T0,
    )
    .unwrap();
    s.handle_peer_message(request(5, "server/discover", json!({})), T0)
        .unwrap();
    s.handle_peer_message(request(6, "initialize", json!({})), T0)
        .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            ended(1, Method::Ping, RequestOutcome::Ok, 0),
            Observation::Used(Feature::LoggingSetLevel),
            ended(2, Method::LoggingSetLevel, RequestOutcome::Ok, 0),
            Observation::Used(Feature::LoggingSetLevel),
            ended(3, Method::LoggingSetLevel, RequestOutcome::Error, 0),
            Observation::Used(Feature::ResourcesSubscribe),
            ended(4, Method::ResourcesSubscribe, RequestOutcome::Ok, 0),
            ended(5, Method::ServerDiscover, RequestOutcome::Error, 0),
            ended(6, Method::Initialize, RequestOutcome::Error, 0),
        ]
    );
    s.handle_peer_message(
        notification("notifications/cancelled", json!({"requestId": 99})),
        T0,
    )
    .unwrap();
    s.handle_peer_message(
        notification(
            "notifications/progress",
            json!({"progressToken": 1, "progress": 1}),
        ),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::Used(Feature::Cancellation),
            Observation::Used(Feature::Progress)
        ]
    );
}

#[test]
fn a_forwarded_request_with_two_rounds_reports_its_rounds_and_live_outcomes() {
    let mut s = session(
        Config::default(),
        "2025-11-25",
        json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}),
    );
    s.handle_peer_message(
        request(
            1,
            "tools/call",
            json!({"name": "t", "_meta": {"progressToken": "p"}}),
        ),
        T0,
    )
    .unwrap();
    let (observed, events) = drain(&mut s);
    assert_eq!(observed, [Observation::Used(Feature::Progress)]);
    // Round 1: a form, a URL elicitation and a sampling request at once.
    let (observed, events) = answer_upstream(
        &mut s,
        &events,
        input(json!({
            "a": form(),
            "b": {"method": "elicitation/create", "params": {"mode": "url", "message": "go",
                  "url": "https://example.com/x"}},
            "c": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},
        })),
    );
    assert_eq!(
        observed,
        [
            Observation::Used(Feature::ElicitationForm),
            Observation::Used(Feature::ElicitationUrl),
            Observation::Used(Feature::Sampling),
        ]
    );
    let lives = live_ids(&events);
    let results = [
        json!({"action": "accept", "content": {}}),
        json!({"action": "decline"}),
        json!({"role": "assistant", "content": {"type": "text", "text": "x"}, "model": "m"}),
    ];
    let mut all = Vec::new();
    let mut events = Vec::new();
    for (id, result) in lives.iter().zip(results) {
        s.handle_peer_message(Message::Response(Response::result(id.clone(), result)), T0)
            .unwrap();
        let (o, e) = drain(&mut s);
        all.extend(o);
        events.extend(e);
    }
    assert_eq!(
        all,
        [
            Observation::LiveEnded {
                kind: LiveKind::ElicitationForm,
                outcome: LiveOutcome::Accept
            },
            Observation::LiveEnded {
                kind: LiveKind::ElicitationUrl,
                outcome: LiveOutcome::Decline
            },
            Observation::LiveEnded {
                kind: LiveKind::Sampling,
                outcome: LiveOutcome::Accept
            },
        ]
    );
    // Round 2: roots; then the upstream completes.
    let (observed, events) = answer_upstream(
        &mut s,
        &events,
        input(json!({"r": {"method": "roots/list"}})),
    );
    assert_eq!(observed, [Observation::Used(Feature::Roots)]);
    let root = live_ids(&events).pop().unwrap();
    s.handle_peer_message(
        Message::Response(Response::result(root, json!({"roots": []}))),
        T0,
    )
    .unwrap();
    let (observed, events) = drain(&mut s);
    assert_eq!(
        observed,
        [Observation::LiveEnded {
            kind: LiveKind::Roots,
            outcome: LiveOutcome::Accept
        }]
    );
    let (observed, _) = answer_upstream(
        &mut s,
        &events,
        json!({"resultType": "complete", "content": []}),
    );
    assert_eq!(
        observed,
        [ended(1, Method::ToolsCall, RequestOutcome::Ok, 2)]
    );
}

#[test]
fn failures_carry_their_reason_and_siblings_count_as_cancelled() {
    let mut config = Config::default();
    config.live_timeout = Duration::from_millis(100);
    config.max_rounds = 1;
    let mut s = session(config, "2025-11-25", json!({"elicitation": {}}));

    // A capability the host lacks.
    s.handle_peer_message(request(1, "prompts/get", json!({"name": "p"})), T0)
        .unwrap();
    let (_, events) = drain(&mut s);
    let (observed, _) = answer_upstream(
        &mut s,
        &events,
        input(
            json!({"s": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}}),
        ),
    );
    assert_eq!(
        observed,
        [ended(
            1,
            Method::PromptsGet,
            RequestOutcome::Failed(FailureReason::MissingCapability),
            1
        )]
    );

    // A timeout: the timed-out request counts as timeout, its sibling as cancelled.
    s.handle_peer_message(request(2, "tools/call", json!({"name": "t"})), T0)
        .unwrap();
    let (_, events) = drain(&mut s);
    let (_, events) = answer_upstream(&mut s, &events, input(json!({"a": form(), "b": form()})));
    let lives = live_ids(&events);
    s.handle_peer_message(
        notification(
            "notifications/progress",
            json!({"progressToken": lives[1].to_value(), "progress": 1}),
        ),
        Timestamp::from_millis(50),
    )
    .unwrap();
    drain(&mut s);
    s.handle_timeout(Timestamp::from_millis(100));
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::LiveEnded {
                kind: LiveKind::ElicitationForm,
                outcome: LiveOutcome::Timeout
            },
            Observation::LiveEnded {
                kind: LiveKind::ElicitationForm,
                outcome: LiveOutcome::Cancel
            },
            ended(
                2,
                Method::ToolsCall,
                RequestOutcome::Failed(FailureReason::Timeout),
                1
            ),
        ]
    );

    // A host error.
    let l = form_round(&mut s, 3);
    s.handle_peer_message(
        Message::Response(Response::error(
            Some(l),
            ErrorObject::new(ErrorCode::INTERNAL_ERROR, "no"),
        )),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::LiveEnded {
                kind: LiveKind::ElicitationForm,
                outcome: LiveOutcome::Error
            },
            ended(
                3,
                Method::ToolsCall,
                RequestOutcome::Failed(FailureReason::HostError),
                1
            ),
        ]
    );

    // The round limit (1): a second input_required fails the request.
    let l = form_round(&mut s, 4);
    s.handle_peer_message(
        Message::Response(Response::result(
            l,
            json!({"action": "accept", "content": {}}),
        )),
        T0,
    )
    .unwrap();
    let (_, events) = drain(&mut s);
    let (observed, _) = answer_upstream(&mut s, &events, input(json!({"a": form()})));
    assert_eq!(
        observed,
        [ended(
            4,
            Method::ToolsCall,
            RequestOutcome::Failed(FailureReason::RoundLimit),
            2
        )]
    );

    // The upstream's own capability refusal counts as the host's capability gap.
    s.handle_peer_message(request(7, "tools/call", json!({"name": "t"})), T0)
        .unwrap();
    let (_, events) = drain(&mut s);
    let id = upstream_ids(&events).pop().unwrap();
    s.handle_upstream_message(
        Some(id.clone()),
        Message::Response(Response::error(
            Some(id),
            ErrorObject::new(
                ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                "needs sampling",
            ),
        )),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [ended(
            7,
            Method::ToolsCall,
            RequestOutcome::Failed(FailureReason::MissingCapability),
            0
        )]
    );

    // An upstream error, and a cancellation by the peer.
    s.handle_peer_message(request(5, "resources/read", json!({"uri": "x:y"})), T0)
        .unwrap();
    let (_, events) = drain(&mut s);
    let id = upstream_ids(&events).pop().unwrap();
    s.handle_upstream_message(
        Some(id.clone()),
        Message::Response(Response::error(
            Some(id),
            ErrorObject::new(ErrorCode::INVALID_PARAMS, "unknown resource"),
        )),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [ended(5, Method::ResourcesRead, RequestOutcome::Error, 0)]
    );
    s.handle_peer_message(request(6, "vendor/thing", json!({})), T0)
        .unwrap();
    drain(&mut s);
    s.handle_peer_message(
        notification("notifications/cancelled", json!({"requestId": 6})),
        T0,
    )
    .unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::Used(Feature::Cancellation),
            ended(6, Method::Other, RequestOutcome::Cancelled, 0),
        ]
    );
}

#[test]
fn batches_are_a_feature_and_each_element_ends_once() {
    let mut s = session(Config::default(), "2025-03-26", json!({}));
    let Incoming::Batch(items) = parse_incoming(
        br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#,
    )
    .unwrap() else {
        panic!("a batch")
    };
    s.handle_peer_batch(items, T0).unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [
            Observation::Used(Feature::Batch),
            ended(1, Method::Ping, RequestOutcome::Ok, 0),
            ended(2, Method::Ping, RequestOutcome::Ok, 0),
        ]
    );
}

#[test]
fn a_failed_initialize_is_observed_without_a_ready_session() {
    let mut s = Session::new(Config::default());
    s.handle_peer_message(
        request(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}}),
        ),
        T0,
    )
    .unwrap();
    let (observed, events) = drain(&mut s);
    assert!(observed.is_empty());
    let id = upstream_ids(&events).pop().unwrap();
    s.handle_upstream_lost(&id, T0).unwrap();
    let (observed, _) = drain(&mut s);
    assert_eq!(
        observed,
        [ended(0, Method::Initialize, RequestOutcome::Error, 0)]
    );
}
