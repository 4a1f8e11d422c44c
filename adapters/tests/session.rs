//! Unit tests of the legacy session machine's tricky paths, through its public API.

use dualera_adapters::jsonrpc::{parse_incoming, Incoming};
use dualera_adapters::{
    Config, ErrorCode, Event, Failure, Message, Notification, PeerStream, Request, RequestId,
    Response, Session, SessionError, SessionState, Timestamp, UpstreamRole,
};
use serde_json::{json, Value};
use std::time::Duration;

const T0: Timestamp = Timestamp::from_millis(0);

fn discover() -> Value {
    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
           "capabilities": {"tools": {"listChanged": true}, "resources": {"subscribe": true}},
           "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}})
}

fn request(id: impl Into<Value>, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id: RequestId::from_value(&id.into()).unwrap(),
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

fn reply(id: &RequestId, result: Value) -> Message {
    Message::Response(Response::result(id.clone(), result))
}

/// What the machine asks the driver to do (its observations left out: see
/// `adapters/tests/usage.rs`).
fn drain(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event())
        .filter(|e| !matches!(e, Event::Observed(_)))
        .collect()
}

fn ready_with(config: Config, version: &str, caps: Value) -> Session {
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
    s.handle_peer_message(notification("notifications/initialized", json!({})), T0)
        .unwrap();
    drain(&mut s);
    assert_eq!(s.state(), SessionState::Ready);
    s
}

fn ready(version: &str, caps: Value) -> Session {
    ready_with(Config::default(), version, caps)
}

/// The only upstream request among `events`.
fn upstream(events: &[Event]) -> Request {
    let found: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToUpstream { request, .. } => Some(request.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one upstream request in {events:?}"
    );
    found.into_iter().next().unwrap()
}

/// Requests sent to the peer among `events`.
fn live(events: &[Event]) -> Vec<Request> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToPeer {
                message: Message::Request(r),
                ..
            } => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The final response to the peer among `events`.
fn response(events: &[Event]) -> Response {
    events
        .iter()
        .find_map(|e| match e {
            Event::ToPeer {
                message: Message::Response(r),
                ..
            } => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no response in {events:?}"))
}

fn is_error_text(r: &Response) -> String {
    let result = r.outcome.as_ref().expect("a result");
    assert_eq!(result["isError"], json!(true));
    result["content"][0]["text"].as_str().unwrap().to_owned()
}

/// Starts a tools/call and answers its first attempt with `input_required`.
fn call_with_input(s: &mut Session, id: i64, input: Value, now: Timestamp) -> Vec<Event> {
    s.handle_peer_message(request(id, "tools/call", json!({"name": "t"})), now)
        .unwrap();
    let up = upstream(&drain(s));
    s.handle_upstream_message(
        Some(up.id.clone()),
        reply(
            &up.id,
            json!({"resultType": "input_required", "requestState": "st", "inputRequests": input}),
        ),
        now,
    )
    .unwrap();
    drain(s)
}

fn form() -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": "ok?",
        "requestedSchema": {"type": "object", "properties": {}}}})
}

#[test]
fn progress_never_extends_past_the_hard_deadline() {
    let mut config = Config::default();
    config.live_timeout = Duration::from_millis(100);
    config.live_timeout_max = Duration::from_millis(250);
    let mut s = ready_with(config, "2025-11-25", json!({"elicitation": {}}));
    let events = call_with_input(&mut s, 1, json!({"a": form()}), T0);
    let l = live(&events).remove(0);
    assert_eq!(s.poll_timeout(), Some(Timestamp::from_millis(100)));
    for at in [90, 180] {
        s.handle_peer_message(
            notification(
                "notifications/progress",
                json!({"progressToken": l.id.to_value(), "progress": at}),
            ),
            Timestamp::from_millis(at),
        )
        .unwrap();
    }
    assert_eq!(s.poll_timeout(), Some(Timestamp::from_millis(250)));
    s.handle_timeout(Timestamp::from_millis(249));
    assert!(drain(&mut s).is_empty());
    s.handle_timeout(Timestamp::from_millis(250));
    let events = drain(&mut s);
    assert!(events.iter().any(|e| matches!(
        e,
        Event::RequestFailed {
            failure: Failure::LiveTimeout { .. },
            ..
        }
    )));
    assert!(is_error_text(&response(&events)).contains("in time"));
    assert_eq!(s.in_flight(), 0);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn unknown_duplicate_and_late_replies_leave_state_unchanged() {
    let mut config = Config::default();
    config.retired_ids = 1;
    let mut s = ready_with(config, "2025-06-18", json!({"roots": {}}));
    let events = call_with_input(
        &mut s,
        1,
        json!({"a": {"method": "roots/list"}, "b": {"method": "roots/list"}, "c": {"method": "roots/list"}}),
        T0,
    );
    let lives = live(&events);
    assert_eq!(lives.len(), 3);
    let ids: Vec<_> = lives.iter().map(|r| r.id.clone()).collect();
    s.handle_peer_message(reply(&ids[0], json!({"roots": []})), T0)
        .unwrap();
    assert_eq!(
        s.handle_peer_message(reply(&ids[0], json!({"roots": []})), T0),
        Err(SessionError::DuplicateReply { id: ids[0].clone() })
    );
    s.handle_peer_message(reply(&ids[1], json!({"roots": []})), T0)
        .unwrap();
    // ids[0] left the (size 1) retired memory: still recognised as ours, so late.
    assert_eq!(
        s.handle_peer_message(reply(&ids[0], json!({"roots": []})), T0),
        Err(SessionError::LateReply { id: ids[0].clone() })
    );
    let never = RequestId::String("dualera-l999".into());
    assert_eq!(
        s.handle_peer_message(reply(&never, json!({})), T0),
        Err(SessionError::UnknownReply { id: never })
    );
    let theirs = RequestId::Number(7);
    assert_eq!(
        s.handle_peer_message(reply(&theirs, json!({})), T0),
        Err(SessionError::UnknownReply { id: theirs })
    );
    assert!(matches!(
        s.handle_peer_message(
            Message::Response(Response::error(
                None,
                dualera_adapters::ErrorObject::new(ErrorCode::PARSE_ERROR, "x")
            )),
            T0
        ),
        Err(SessionError::ReplyWithoutId { .. })
    ));
    assert!(drain(&mut s).is_empty(), "refused replies emit nothing");
    // The round still completes normally.
    s.handle_peer_message(reply(&ids[2], json!({"roots": []})), T0)
        .unwrap();
    let retry = upstream(&drain(&mut s));
    let params = retry.params.unwrap();
    assert_eq!(params["inputResponses"].as_object().unwrap().len(), 3);
    assert_eq!(params["requestState"], json!("st"));
}

#[test]
fn cancelling_a_batched_request_mid_round_drops_it_from_the_group() {
    let mut s = ready("2025-03-26", json!({"sampling": {}}));
    let Incoming::Batch(items) = parse_incoming(
        br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}},
             {"jsonrpc":"2.0","id":2,"method":"ping"}]"#,
    )
    .unwrap() else {
        panic!("batch expected")
    };
    let outcome = s.handle_peer_batch(items, T0).unwrap();
    let batch = outcome.batch.unwrap();
    let up = upstream(&drain(&mut s));
    s.handle_upstream_message(
        None,
        reply(&up.id, json!({"resultType": "input_required",
            "inputRequests": {"s": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}}})),
        T0,
    )
    .unwrap();
    let events = drain(&mut s);
    assert!(
        matches!(&events[0], Event::ToPeer { stream: PeerStream::Batch(b), .. } if *b == batch)
    );
    let l = live(&events).remove(0);
    s.handle_peer_message(
        notification("notifications/cancelled", json!({"requestId": 1})),
        T0,
    )
    .unwrap();
    let events = drain(&mut s);
    assert!(
        matches!(&events[0], Event::ToPeer { message: Message::Notification(n), .. }
        if n.method == "notifications/cancelled" && n.params.as_ref().unwrap()["requestId"] == l.id.to_value())
    );
    match &events[1] {
        Event::ToPeerBatch { stream, messages } => {
            assert_eq!(stream, &PeerStream::Batch(batch));
            assert_eq!(messages.len(), 1, "only the ping is answered");
        }
        other => panic!("expected the batch group, got {other:?}"),
    }
    assert_eq!(
        s.handle_peer_message(reply(&l.id, json!({})), T0),
        Err(SessionError::LateReply { id: l.id })
    );
}

#[test]
fn capability_gaps_and_bad_input_requests_fail_without_retry() {
    // sampling without the tools sub-capability.
    let mut s = ready("2025-11-25", json!({"sampling": {}}));
    let events = call_with_input(
        &mut s,
        1,
        json!({"s": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5, "tools": []}}}),
        T0,
    );
    assert!(live(&events).is_empty());
    assert!(!events.iter().any(|e| matches!(e, Event::ToUpstream { .. })));
    assert!(is_error_text(&response(&events)).contains("sampling.tools"));

    // an input request MRTR does not allow.
    let events = call_with_input(
        &mut s,
        2,
        json!({"x": {"method": "tools/call", "params": {}}}),
        T0,
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::RequestFailed {
            failure: Failure::UnsupportedInputRequest { .. },
            ..
        }
    )));

    // a malformed round.
    let events = call_with_input(&mut s, 3, json!("not an object"), T0);
    assert!(is_error_text(&response(&events)).contains("malformed"));
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn too_many_input_requests_and_rounds_on_the_wrong_method() {
    let mut config = Config::default();
    config.max_input_requests = 1;
    let mut s = ready_with(config, "2025-06-18", json!({"roots": {}}));
    let events = call_with_input(
        &mut s,
        1,
        json!({"a": {"method": "roots/list"}, "b": {"method": "roots/list"}}),
        T0,
    );
    assert!(live(&events).is_empty());
    assert!(is_error_text(&response(&events)).contains("2 inputs at once"));

    s.handle_peer_message(request(2, "tools/list", json!({})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    s.handle_upstream_message(
        None,
        reply(
            &up.id,
            json!({"resultType": "input_required", "requestState": "x"}),
        ),
        T0,
    )
    .unwrap();
    let r = response(&drain(&mut s));
    let error = r.outcome.unwrap_err();
    assert_eq!(error.code, ErrorCode::INTERNAL_ERROR);
    assert_eq!(
        error.data.unwrap()["reason"],
        json!("inputRequiredNotAllowed")
    );

    s.handle_peer_message(request(3, "prompts/get", json!({"name": "p"})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    s.handle_upstream_message(None, reply(&up.id, json!({"resultType": "task"})), T0)
        .unwrap();
    let error = response(&drain(&mut s)).outcome.unwrap_err();
    assert!(error.message.contains("unknown resultType \"task\""));
}

#[test]
fn round_bound_counts_state_only_rounds() {
    let mut config = Config::default();
    config.max_rounds = 1;
    let mut s = ready_with(config, "2025-11-25", json!({}));
    s.handle_peer_message(request(1, "resources/read", json!({"uri": "u"})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    let state_only = json!({"resultType": "input_required", "requestState": "again"});
    s.handle_upstream_message(None, reply(&up.id, state_only.clone()), T0)
        .unwrap();
    assert!(drain(&mut s).is_empty());
    s.handle_timeout(Timestamp::from_millis(250));
    let up = upstream(&drain(&mut s));
    assert_eq!(up.params.unwrap()["requestState"], json!("again"));
    s.handle_upstream_message(None, reply(&up.id, state_only), Timestamp::from_millis(260))
        .unwrap();
    let error = response(&drain(&mut s)).outcome.unwrap_err();
    assert_eq!(error.data.unwrap()["reason"], json!("roundLimit"));
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn request_state_is_echoed_exactly() {
    let mut s = ready("2025-11-25", json!({"roots": {}}));
    // Parse from bytes, as a driver would: escapes decode to the same string value.
    let raw = r#"{"jsonrpc":"2.0","id":"ID","result":{"resultType":"input_required","requestState":"  a\u00e9\"\\/+=\n ","inputRequests":{"r":{"method":"roots/list"}}}}"#;
    s.handle_peer_message(request(1, "tools/call", json!({"name": "t"})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    let raw = raw.replace("\"ID\"", &up.id.to_value().to_string());
    let message = dualera_adapters::jsonrpc::parse(raw.as_bytes()).unwrap();
    s.handle_upstream_message(None, message, T0).unwrap();
    let l = live(&drain(&mut s)).remove(0);
    s.handle_peer_message(reply(&l.id, json!({"roots": []})), T0)
        .unwrap();
    let retry = upstream(&drain(&mut s));
    assert_ne!(retry.id, up.id, "each attempt gets a fresh upstream id");
    assert_eq!(
        retry.params.unwrap()["requestState"],
        Value::String("  a\u{e9}\"\\/+=\n ".into())
    );
}

#[test]
fn in_flight_bound() {
    let mut config = Config::default();
    config.max_in_flight = 1;
    let mut s = ready_with(config, "2025-11-25", json!({}));
    s.handle_peer_message(request(1, "tools/list", json!({})), T0)
        .unwrap();
    drain(&mut s);
    // One more is refused outright (a protocol-level error, not a tool result), and
    // nothing changed: no upstream request, no event.
    let refused = s
        .handle_peer_message(request(2, "tools/call", json!({"name": "t"})), T0)
        .unwrap_err();
    assert!(matches!(
        refused,
        SessionError::TooManyInFlight { limit: 1, .. }
    ));
    let error = refused.to_response().unwrap().outcome.unwrap_err();
    assert!(error.message.contains("limit 1"), "{}", error.message);
    assert_eq!(error.data.unwrap()["reason"], "tooManyInFlight");
    assert!(drain(&mut s).is_empty());
    // Locally answered requests are not forwarded, so they still work.
    s.handle_peer_message(request(3, "ping", json!({})), T0)
        .unwrap();
    assert_eq!(response(&drain(&mut s)).outcome, Ok(json!({})));
}

#[test]
fn live_bound_fails_the_round() {
    let mut config = Config::default();
    config.max_live = 2;
    let mut s = ready_with(config, "2025-11-25", json!({"roots": {}}));
    let two = json!({"a": {"method": "roots/list"}, "b": {"method": "roots/list"}});
    assert_eq!(live(&call_with_input(&mut s, 1, two.clone(), T0)).len(), 2);
    // A second round of two while two are outstanding: over the bound.
    let events = call_with_input(&mut s, 2, two, T0);
    assert!(live(&events).is_empty(), "{events:?}");
    assert!(is_error_text(&response(&events)).contains("limit 2 input requests"));
}

#[test]
fn requests_the_upstream_could_not_take_are_refused() {
    let mut config = Config::default();
    config.max_upstream_message = 2048;
    let mut s = ready_with(config, "2025-11-25", json!({"roots": {}}));
    let big = "x".repeat(4096);
    let refused = s
        .handle_peer_message(
            request(
                1,
                "tools/call",
                json!({"name": "t", "arguments": {"text": big}}),
            ),
            T0,
        )
        .unwrap_err();
    let SessionError::TooLargeForUpstream { size, limit, .. } = refused else {
        panic!("{refused:?}");
    };
    assert!(size > 4096 && limit == 2048);
    assert!(drain(&mut s).is_empty());
    // The size that counts is the written one: 400 plain bytes fit, 400 control
    // characters (six bytes each once escaped) do not, and the error gives it exactly.
    for (id, text, fits) in [
        (10, "x".repeat(400), true),
        (11, "\u{1}".repeat(400), false),
    ] {
        let params = json!({"name": "t", "arguments": {"text": text}});
        let outcome = s.handle_peer_message(request(id, "tools/call", params.clone()), T0);
        let events = drain(&mut s);
        if fits {
            outcome.unwrap();
            assert_eq!(
                upstream(&events).params.unwrap()["arguments"],
                params["arguments"]
            );
        } else {
            let Err(SessionError::TooLargeForUpstream { size, .. }) = outcome else {
                panic!("{outcome:?}");
            };
            let written = serde_json::to_vec(&params).unwrap().len();
            assert!(
                size > written && size < written + 1024,
                "{size} against {written}"
            );
            assert!(events.is_empty());
        }
    }
    // A host answer that would make the retry too large fails the request, naming
    // the limit, and nothing goes upstream.
    let events = call_with_input(&mut s, 2, json!({"r": {"method": "roots/list"}}), T0);
    let l = live(&events).remove(0);
    s.handle_peer_message(
        reply(&l.id, json!({"roots": [{"uri": format!("file:///{big}")}]})),
        T0,
    )
    .unwrap();
    let events = drain(&mut s);
    assert!(!events.iter().any(|e| matches!(e, Event::ToUpstream { .. })));
    assert!(is_error_text(&response(&events)).contains("at most 2048"));
}

#[test]
fn upstream_lost_fails_the_request() {
    let mut s = ready("2025-11-25", json!({}));
    s.handle_peer_message(request(1, "tools/call", json!({"name": "t"})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    s.handle_upstream_lost(&up.id, T0).unwrap();
    let events = drain(&mut s);
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::CancelUpstream { .. })));
    assert_eq!(
        is_error_text(&response(&events)),
        "The upstream server did not answer"
    );
    assert_eq!(
        s.handle_upstream_lost(&up.id, T0),
        Err(SessionError::LateUpstreamResponse { id: up.id })
    );
    s.handle_peer_message(request(2, "tools/list", json!({})), T0)
        .unwrap();
    let up = upstream(&drain(&mut s));
    s.handle_upstream_lost(&up.id, T0).unwrap();
    assert_eq!(
        response(&drain(&mut s)).outcome.unwrap_err().code,
        ErrorCode::INTERNAL_ERROR
    );
}

#[test]
fn cached_discover_cancels_the_one_in_flight() {
    let mut s = Session::new(Config::default());
    s.handle_peer_message(
        request(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}}),
        ),
        T0,
    )
    .unwrap();
    let events = drain(&mut s);
    assert!(matches!(
        &events[0],
        Event::ToUpstream {
            role: UpstreamRole::Discover,
            ..
        }
    ));
    let discover_id = upstream(&events).id;
    assert_eq!(s.state(), SessionState::Initializing);
    s.handle_peer_message(request(2, "tools/list", json!({})), T0)
        .unwrap();
    assert!(response(&drain(&mut s)).outcome.is_err());
    assert!(matches!(
        s.handle_discover(json!({"supportedVersions": ["2025-11-25"]})),
        Err(SessionError::InvalidDiscover { .. })
    ));
    s.handle_discover(discover()).unwrap();
    let events = drain(&mut s);
    assert!(matches!(&events[0], Event::CancelUpstream { id, .. } if *id == discover_id));
    let result = response(&events).outcome.unwrap();
    assert_eq!(result["protocolVersion"], json!("2025-06-18"));
    assert_eq!(result["serverInfo"], json!({"name": "up", "version": "1"}));
    assert!(result.get("instructions").is_none());
    assert_eq!(s.state(), SessionState::Ready);
    assert_eq!(s.client_info(), None);
}

#[test]
fn listen_gives_up_after_repeated_losses() {
    let mut config = Config::default();
    config.max_listen_retries = 2;
    config.listen_retry_pause = Duration::from_millis(10);
    let mut s = ready_with(config, "2025-11-25", json!({}));
    s.handle_standalone_opened().unwrap();
    let mut now = 0;
    for attempt in 0..3 {
        let up = upstream(&drain(&mut s));
        assert_eq!(up.method, "subscriptions/listen");
        s.handle_upstream_lost(&up.id, Timestamp::from_millis(now))
            .unwrap();
        if attempt < 2 {
            assert_eq!(s.poll_timeout(), Some(Timestamp::from_millis(now + 10)));
            now += 10;
            s.handle_timeout(Timestamp::from_millis(now));
        }
    }
    assert_eq!(s.poll_timeout(), None);
    assert!(drain(&mut s).is_empty());
    // A filter change tries again.
    s.handle_peer_message(request(1, "resources/subscribe", json!({"uri": "a"})), T0)
        .unwrap();
    let events = drain(&mut s);
    assert_eq!(
        upstream(&events).params.unwrap()["notifications"]["resourceSubscriptions"],
        json!(["a"])
    );
    assert_eq!(s.subscriptions().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn subscription_bound() {
    let mut config = Config::default();
    config.max_subscriptions = 1;
    let mut s = ready_with(config, "2025-11-25", json!({}));
    s.handle_peer_message(request(1, "resources/subscribe", json!({"uri": "a"})), T0)
        .unwrap();
    drain(&mut s);
    s.handle_peer_message(request(2, "resources/subscribe", json!({"uri": "b"})), T0)
        .unwrap();
    let events = drain(&mut s);
    assert_eq!(events.len(), 1);
    assert!(response(&events).outcome.is_err());
}

#[test]
fn minted_ids_are_unique_and_prefixed() {
    let mut config = Config::default();
    config.id_prefix = "s42".into();
    let mut s = ready_with(
        config,
        "2025-11-25",
        json!({"roots": {}, "elicitation": {"url": {}}}),
    );
    let events = call_with_input(
        &mut s,
        1,
        json!({"r": {"method": "roots/list"}, "u": {"method": "elicitation/create",
            "params": {"mode": "url", "url": "https://x", "message": "m"}}}),
        T0,
    );
    let lives = live(&events);
    let mut seen = std::collections::HashSet::new();
    for r in &lives {
        let RequestId::String(id) = &r.id else {
            panic!("string ids")
        };
        assert!(id.starts_with("s42-"));
        assert!(seen.insert(id.clone()));
    }
    let url = lives
        .iter()
        .find(|r| r.method == "elicitation/create")
        .unwrap();
    assert!(url.params.as_ref().unwrap()["elicitationId"]
        .as_str()
        .unwrap()
        .starts_with("s42-e"));
}

#[test]
fn refusals_and_close() {
    let mut s = ready("2025-03-26", json!({}));
    let mut config = Config::default();
    config.max_batch_len = 1;
    let mut small = ready_with(config, "2025-03-26", json!({}));
    assert_eq!(
        small.handle_peer_batch(
            vec![
                Ok(request(1, "ping", json!({}))),
                Ok(request(2, "ping", json!({})))
            ],
            T0
        ),
        Err(SessionError::BatchTooLarge { len: 2, max: 1 })
    );
    let only_notes = s
        .handle_peer_batch(
            vec![Ok(notification("notifications/initialized", json!({})))],
            T0,
        )
        .unwrap();
    assert_eq!(only_notes.batch, None);
    assert!(matches!(
        s.handle_upstream_message(None, request(9, "sampling/createMessage", json!({})), T0),
        Err(SessionError::UnexpectedUpstreamRequest { .. })
    ));
    assert!(SessionError::BatchNotAllowed { negotiated: None }
        .to_response()
        .is_some());
    assert!(SessionError::Closed.to_response().is_none());
    s.close();
    assert_eq!(s.state(), SessionState::Closed);
    assert_eq!(
        s.handle_peer_message(request(1, "ping", json!({})), T0),
        Err(SessionError::Closed)
    );
    assert_eq!(s.handle_standalone_opened(), Err(SessionError::Closed));
    assert_eq!(s.ping_peer(), None);
}

#[test]
fn client_info_is_forwarded_only_in_the_implementation_shape() {
    let cases = [
        (
            json!({"name": "h", "version": "1", "title": "H", "icons": [{"src": "data:x"}], "x": 1}),
            Some(json!({"name": "h", "version": "1", "title": "H"})),
        ),
        (json!({"name": {"not": "a string"}, "version": "1"}), None),
        (json!({"name": "h"}), None),
        (json!("h"), None),
    ];
    for (sent, kept) in cases {
        let mut s = Session::new(Config::default());
        s.handle_discover(discover()).unwrap();
        s.handle_peer_message(
            request(
                0,
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": sent}),
            ),
            T0,
        )
        .unwrap();
        drain(&mut s);
        assert_eq!(s.client_info(), kept);
        s.handle_peer_message(request(1, "tools/list", json!({})), T0)
            .unwrap();
        let up = upstream(&drain(&mut s));
        let meta = &up.params.unwrap()["_meta"];
        assert_eq!(
            meta.get("io.modelcontextprotocol/clientInfo"),
            kept.as_ref()
        );
    }
}
