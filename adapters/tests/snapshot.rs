//! Round trips of the session machine's serialized state (`adapters::snapshot`): a
//! session is driven through random inputs — every legacy revision, forwarded requests,
//! MRTR rounds with elicitation, sampling and roots, replies, errors, cancellations,
//! progress, batches, subscriptions, timers, closing, 2025-11-25 tasks (created, polled,
//! waited on with their input rounds, listed, cancelled) — and after every input its state
//! is serialized, deserialized and restored. The restored copy must serialize to the
//! same bytes and answer the next input with exactly the same events as the original,
//! so nothing the machine remembers is lost between two messages.

use dualera_adapters::jsonrpc::EnvelopeError;
use dualera_adapters::{
    Config, Event, Message, Notification, ProtocolVersion, Request, RequestId, Response, Session,
    Timestamp,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

fn discover() -> Value {
    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
           "capabilities": {"tools": {"listChanged": true}, "resources": {"subscribe": true, "listChanged": true},
               "extensions": {"io.modelcontextprotocol/tasks": {}}},
           "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}})
}

fn config() -> Config {
    let mut c = Config::default();
    c.max_in_flight = 4;
    c.max_rounds = 3;
    c.retired_ids = 8;
    c.live_timeout = Duration::from_millis(500);
    c.live_timeout_max = Duration::from_millis(1500);
    c.retry_pause = Duration::from_millis(50);
    c.listen_retry_pause = Duration::from_millis(100);
    c.id_prefix = "p7".into();
    c
}

/// One input, abstract: indices pick among what is outstanding when it is applied.
#[derive(Debug, Clone)]
enum Action {
    Initialize { revision: usize, caps: u8 },
    CachedDiscover,
    Initialized,
    Call { method: usize, with_progress: bool },
    LocalRequest { which: usize },
    Upstream { pick: usize, answer: usize },
    UpstreamLost { pick: usize },
    UpstreamProgress { pick: usize },
    Reply { pick: usize, error: bool },
    Cancel { pick: usize },
    Progress { pick: usize },
    Batch { len: usize },
    Standalone { open: bool },
    Ping,
    Advance { ms: u64 },
    Close,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        2 => (0usize..4, any::<u8>()).prop_map(|(revision, caps)| Action::Initialize { revision, caps }),
        1 => Just(Action::CachedDiscover),
        1 => Just(Action::Initialized),
        6 => (0usize..9, any::<bool>()).prop_map(|(method, with_progress)| Action::Call { method, with_progress }),
        2 => (0usize..5).prop_map(|which| Action::LocalRequest { which }),
        8 => (any::<usize>(), 0usize..12).prop_map(|(pick, answer)| Action::Upstream { pick, answer }),
        1 => any::<usize>().prop_map(|pick| Action::UpstreamLost { pick }),
        1 => any::<usize>().prop_map(|pick| Action::UpstreamProgress { pick }),
        6 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(pick, error)| Action::Reply { pick, error }),
        1 => any::<usize>().prop_map(|pick| Action::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Action::Progress { pick }),
        1 => (1usize..4).prop_map(|len| Action::Batch { len }),
        1 => any::<bool>().prop_map(|open| Action::Standalone { open }),
        1 => Just(Action::Ping),
        2 => (1u64..900).prop_map(|ms| Action::Advance { ms }),
        1 => Just(Action::Close),
    ]
}

/// What the harness knows from the events so far.
#[derive(Default)]
struct Seen {
    upstream: Vec<RequestId>,
    live: Vec<RequestId>,
    legacy: Vec<RequestId>,
    next_id: i64,
    now: u64,
}

impl Seen {
    fn learn(&mut self, events: &[Event]) {
        for e in events {
            match e {
                Event::ToUpstream { request, .. } => self.upstream.push(request.id.clone()),
                Event::ToPeer {
                    message: Message::Request(r),
                    ..
                } => self.live.push(r.id.clone()),
                _ => {}
            }
        }
    }
}

fn pick<T: Clone>(items: &[T], i: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[i % items.len()].clone())
}

fn request(id: RequestId, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id,
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

fn upstream_answer(id: &RequestId, answer: usize) -> Message {
    let result = match answer {
        0 | 1 => json!({"resultType": "complete", "content": [{"type": "text", "text": "done"}],
                        "ttlMs": 5, "_meta": {"x": 1}}),
        2 => json!({"resultType": "input_required", "requestState": "s\u{e9}t==",
            "inputRequests": {"form": {"method": "elicitation/create", "params": {"mode": "form",
                "message": "ok?", "requestedSchema": {"type": "object", "properties": {}}}}}}),
        3 => json!({"resultType": "input_required", "requestState": "two",
            "inputRequests": {
                "pick": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},
                "roots": {"method": "roots/list"}}}),
        4 => json!({"resultType": "input_required", "requestState": "only-state"}),
        5 => json!({"resultType": "input_required", "inputRequests": {"u": {"method":
            "elicitation/create", "params": {"mode": "url", "message": "go", "url": "https://x.example/a",
            "elicitationId": "up-1"}}}}),
        6 => json!({"resultType": "complete", "tools": [
            {"name": "t", "inputSchema": {"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"}}}},
            {"name": "bad", "inputSchema": {"type": "object", "properties": {
                "r": {"type": "string", "x-mcp-header": "bad name"}}}}]}),
        7 => json!({"resultType": "task", "taskId": "tk1", "status": "working", "ttlMs": 9000,
            "pollIntervalMs": 100, "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:00Z"}),
        8 => {
            json!({"resultType": "complete", "taskId": "tk1", "status": "input_required", "ttlMs": 9000,
            "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:01Z",
            "inputRequests": {"pick": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}}})
        }
        9 => {
            json!({"resultType": "complete", "taskId": "tk1", "status": "completed", "ttlMs": 9000,
            "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:02Z",
            "result": {"content": [{"type": "text", "text": "done"}]}})
        }
        10 => {
            json!({"resultType": "complete", "taskId": "tk1", "status": "cancelled", "ttlMs": 9000,
            "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:02Z"})
        }
        _ => {
            return Message::Response(Response::error(
                Some(id.clone()),
                dualera_adapters::ErrorObject::new(dualera_adapters::ErrorCode(-32020), "headers"),
            ))
        }
    };
    Message::Response(Response::result(id.clone(), result))
}

/// Applies one action; errors are part of the behaviour compared, so they are returned.
fn apply(s: &mut Session, seen: &mut Seen, a: &Action) -> Vec<String> {
    let now = Timestamp::from_millis(seen.now);
    let mut out = Vec::new();
    let mut note = |r: Result<(), dualera_adapters::SessionError>| {
        if let Err(e) = r {
            out.push(e.to_string());
        }
    };
    match a {
        Action::Initialize { revision, caps } => {
            let version = ProtocolVersion::LEGACY[*revision % ProtocolVersion::LEGACY.len()];
            let mut c = serde_json::Map::new();
            if caps & 1 != 0 {
                c.insert("elicitation".into(), json!({"form": {}, "url": {}}));
            }
            if caps & 2 != 0 {
                c.insert("sampling".into(), json!({}));
            }
            if caps & 4 != 0 {
                c.insert("roots".into(), json!({"listChanged": true}));
            }
            if caps & 8 != 0 {
                c.insert("tasks".into(), json!({"list": {}, "cancel": {}}));
            }
            seen.next_id += 1;
            note(s.handle_peer_message(
                request(
                    RequestId::Number(seen.next_id),
                    "initialize",
                    json!({"protocolVersion": version, "capabilities": c,
                           "clientInfo": {"name": "host", "version": "1.0"}}),
                ),
                now,
            ));
        }
        Action::CachedDiscover => note(s.handle_discover_shared(Arc::new(discover()))),
        Action::Initialized => {
            note(s.handle_peer_message(notification("notifications/initialized", json!({})), now))
        }
        Action::Call {
            method,
            with_progress,
        } => {
            seen.next_id += 1;
            let id = if seen.next_id % 3 == 0 {
                RequestId::String(format!("r{}", seen.next_id))
            } else {
                RequestId::Number(seen.next_id)
            };
            seen.legacy.push(id.clone());
            let (m, params) = match method {
                0 => (
                    "tools/call",
                    json!({"name": "t", "arguments": {"region": "eu"}}),
                ),
                1 => ("prompts/get", json!({"name": "p"})),
                2 => ("resources/read", json!({"uri": "file:///x"})),
                3 => ("tools/list", json!({})),
                4 => (
                    "tools/call",
                    json!({"name": "t", "arguments": {"region": "eu"}, "task": {"ttl": 9000}}),
                ),
                5 => ("tasks/get", json!({"taskId": "tk1"})),
                6 => ("tasks/result", json!({"taskId": "tk1"})),
                7 => ("tasks/cancel", json!({"taskId": "tk1"})),
                _ => ("tasks/list", json!({})),
            };
            let mut params = params;
            if *with_progress {
                params["_meta"] = json!({"progressToken": format!("tok{}", seen.next_id)});
            }
            note(s.handle_peer_message(request(id, m, params), now));
        }
        Action::LocalRequest { which } => {
            seen.next_id += 1;
            let id = RequestId::Number(seen.next_id);
            let (m, params) = match which {
                0 => ("logging/setLevel", json!({"level": "warning"})),
                1 => (
                    "resources/subscribe",
                    json!({"uri": format!("file:///r{}", seen.next_id % 3)}),
                ),
                2 => ("resources/unsubscribe", json!({"uri": "file:///r1"})),
                3 => ("ping", json!({})),
                _ => ("server/discover", json!({})),
            };
            note(s.handle_peer_message(request(id, m, params), now));
        }
        Action::Upstream { pick: p, answer } => {
            if let Some(id) = pick(&seen.upstream, *p) {
                let message = if id_is_discover(s, &id) && *answer < 11 {
                    Message::Response(Response::result(id.clone(), discover()))
                } else {
                    upstream_answer(&id, *answer)
                };
                note(s.handle_upstream_message(Some(id), message, now));
            }
        }
        Action::UpstreamLost { pick: p } => {
            if let Some(id) = pick(&seen.upstream, *p) {
                note(s.handle_upstream_lost(&id, now));
            }
        }
        Action::UpstreamProgress { pick: p } => {
            if let Some(id) = pick(&seen.upstream, *p) {
                note(s.handle_upstream_message(
                    Some(id),
                    notification(
                        "notifications/progress",
                        json!({"progressToken": "tok1", "progress": 1}),
                    ),
                    now,
                ));
            }
        }
        Action::Reply { pick: p, error } => {
            if let Some(id) = pick(&seen.live, *p) {
                let message = if *error {
                    Message::Response(Response::error(
                        Some(id),
                        dualera_adapters::ErrorObject::new(
                            dualera_adapters::ErrorCode(-1),
                            "user refused",
                        ),
                    ))
                } else {
                    Message::Response(Response::result(
                        id,
                        json!({"action": "accept", "content": {}, "roots": [], "role": "assistant",
                               "content_text": "x", "model": "m"}),
                    ))
                };
                note(s.handle_peer_message(message, now));
            }
        }
        Action::Cancel { pick: p } => {
            if let Some(id) = pick(&seen.legacy, *p) {
                note(s.handle_peer_message(
                    notification(
                        "notifications/cancelled",
                        json!({"requestId": id.to_value(), "reason": "stop"}),
                    ),
                    now,
                ));
            }
        }
        Action::Progress { pick: p } => {
            if let Some(id) = pick(&seen.live, *p) {
                note(s.handle_peer_message(
                    notification(
                        "notifications/progress",
                        json!({"progressToken": id.to_value(), "progress": 1}),
                    ),
                    now,
                ));
            }
        }
        Action::Batch { len } => {
            let mut items: Vec<Result<Message, EnvelopeError>> = Vec::new();
            for i in 0..*len {
                seen.next_id += 1;
                let id = RequestId::Number(seen.next_id);
                seen.legacy.push(id.clone());
                items.push(Ok(if i == 1 {
                    request(id, "ping", json!({}))
                } else {
                    request(id, "tools/call", json!({"name": "t"}))
                }));
            }
            match s.handle_peer_batch(items, now) {
                Ok(outcome) => out.extend(outcome.refused.iter().map(ToString::to_string)),
                Err(e) => out.push(e.to_string()),
            }
        }
        Action::Standalone { open } => note(if *open {
            s.handle_standalone_opened()
        } else {
            s.handle_standalone_closed()
        }),
        Action::Ping => {
            if let Some(id) = s.ping_peer() {
                out.push(format!("ping {id}"));
            }
        }
        Action::Advance { ms } => {
            seen.now += ms;
            s.handle_timeout(Timestamp::from_millis(seen.now));
        }
        Action::Close => s.close(),
    }
    out
}

fn id_is_discover(s: &Session, _id: &RequestId) -> bool {
    s.state() == dualera_adapters::SessionState::Initializing
}

fn drain(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn round_trip(s: &Session) -> (Vec<u8>, Session) {
    let bytes = serde_json::to_vec(s).expect("a session serializes");
    let back: Session = serde_json::from_slice(&bytes).expect("and deserializes");
    (bytes, back.restore(config(), s.discover().cloned()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn restored_sessions_serialize_and_behave_the_same(actions in prop::collection::vec(action(), 1..60)) {
        let mut original = Session::new(config());
        let mut seen = Seen::default();
        for a in &actions {
            let (bytes, mut restored) = round_trip(&original);
            let (again, _) = round_trip(&restored);
            prop_assert_eq!(&bytes, &again, "a restored session serializes differently");
            let mut seen_restored = Seen { now: seen.now, next_id: seen.next_id, ..Seen::default() };
            seen_restored.upstream.clone_from(&seen.upstream);
            seen_restored.live.clone_from(&seen.live);
            seen_restored.legacy.clone_from(&seen.legacy);
            let errors = apply(&mut original, &mut seen, a);
            let events = drain(&mut original);
            let errors_restored = apply(&mut restored, &mut seen_restored, a);
            let events_restored = drain(&mut restored);
            prop_assert_eq!(&errors, &errors_restored, "errors differ after {:?}", a);
            prop_assert_eq!(&events, &events_restored, "events differ after {:?}", a);
            prop_assert_eq!(original.poll_timeout(), restored.poll_timeout());
            prop_assert_eq!(original.state(), restored.state());
            seen.learn(&events);
        }
    }
}

/// A session through `initialize` (2025-11-25), its events drained.
fn initialized() -> Session {
    let mut s = Session::new(config());
    s.handle_discover(discover()).unwrap();
    s.handle_peer_message(
        request(
            RequestId::Number(0),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "h", "version": "1"}}),
        ),
        Timestamp::from_millis(0),
    )
    .unwrap();
    drain(&mut s);
    s
}

#[test]
fn a_snapshot_leaves_out_config_and_discover_and_keeps_its_prefix() {
    let s = initialized();
    let text = serde_json::to_string(&s).unwrap();
    assert!(text.contains("\"id_prefix\":\"p7\""), "{text}");
    assert!(
        !text.contains("supportedVersions"),
        "the discover result is shared, not copied: {text}"
    );
    assert!(
        !text.contains("max_in_flight"),
        "the config is the driver's: {text}"
    );
    let back: Session = serde_json::from_str(&text).unwrap();
    let mut other = config();
    other.id_prefix = "someone-else".into();
    let mut back = back.restore(other, s.discover().cloned());
    back.handle_peer_message(
        request(RequestId::Number(1), "tools/call", json!({"name": "t"})),
        Timestamp::from_millis(1),
    )
    .unwrap();
    let minted = drain(&mut back).into_iter().find_map(|e| match e {
        Event::ToUpstream { request, .. } => Some(request.id),
        _ => None,
    });
    assert_eq!(minted, Some(RequestId::String("p7-u1".into())));
}

/// Members holding their default are not written, and a snapshot that writes them
/// (as builds before did) reads as the same session.
#[test]
fn empty_members_are_left_out_and_still_read_when_written() {
    let s = initialized();
    let text = serde_json::to_string(&s).unwrap();
    for member in [
        "log_level",
        "init",
        "calls",
        "live",
        "upstream",
        "batches",
        "subscriptions",
        "standalone_open",
        "listen",
        "ping",
        "tool_headers",
        "host_tasks",
        "tasks",
        "next_elicitation",
        "next_batch",
    ] {
        assert!(
            !text.contains(&format!("\"{member}\":")),
            "{member}: {text}"
        );
    }
    let mut written: Value = serde_json::from_str(&text).unwrap();
    let full = json!({"log_level": null, "init": null, "calls": [], "live": [],
        "upstream": [], "batches": [], "subscriptions": [], "standalone_open": false,
        "listen": null, "ping": null, "tool_headers": {}, "host_tasks": false,
        "tasks": null, "next_elicitation": 0, "next_batch": 0});
    for (k, v) in full.as_object().unwrap() {
        written[k] = v.clone();
    }
    let older: Session = serde_json::from_value(written).unwrap();
    assert_eq!(serde_json::to_string(&older).unwrap(), text);
    // Both answer the next request alike.
    let (_, back) = round_trip(&s);
    let older = older.restore(config(), s.discover().cloned());
    for mut session in [back, older] {
        session
            .handle_peer_message(
                request(RequestId::Number(1), "tools/call", json!({"name": "t"})),
                Timestamp::from_millis(1),
            )
            .unwrap();
        let sent = drain(&mut session).into_iter().find_map(|e| match e {
            Event::ToUpstream { request, .. } => Some(request.id),
            _ => None,
        });
        assert_eq!(sent, Some(RequestId::String("p7-u1".into())));
    }
}

#[test]
fn corrupt_snapshots_are_refused() {
    for bad in [
        r#"{"revision": "1999-01-01"}"#,
        r#"{"calls": {"1": {}}}"#,
        r#"{"retired_live": {"cap": 4, "ids": [[1, "Answered"], [1, "Answered"]]}}"#,
        r#"{"upstream": [[null, {"seq": 1, "role": "Discover"}]]}"#,
        r#"{"live": [["a", {}], ["a", {}]]}"#,
        r#"{"retired_live": {"cap": 4, "p": "p7-l", "r": ["1", "2"], "k": "a"}}"#,
        r#"{"retired_live": {"cap": 4, "p": "p7-l", "r": ["1"], "k": "z"}}"#,
        r#"{"retired_live": {"cap": 4, "p": "p7-l", "r": ["1", "1"], "k": "aa"}}"#,
        r#"{"retired_live": {"cap": 4, "ids": [["p7-l1", "Answered"]], "p": "p7-l", "r": ["2"], "k": "a"}}"#,
    ] {
        assert!(
            serde_json::from_str::<Session>(bad).is_err(),
            "accepted {bad}"
        );
    }
    let empty: Session = serde_json::from_str("{}").unwrap();
    assert_eq!(
        empty.state(),
        dualera_adapters::SessionState::AwaitingInitialize
    );
}

#[test]
fn retired_ids_are_stored_once_prefixed_and_the_older_form_is_still_read() {
    let older = r#"{"retired_live": {"cap": 4, "ids": [["p7-l1", "Answered"], ["p7-l12", "Abandoned"]]},
                    "retired_upstream": {"cap": 4, "ids": [[3, "Answered"]]}}"#;
    let compact = r#"{"retired_live": {"cap": 4, "p": "p7-l1", "r": ["", "2"], "k": "ax"},
                      "retired_upstream": {"cap": 4, "ids": [[3, "Answered"]]}}"#;
    let a: Session = serde_json::from_str(older).unwrap();
    let b: Session = serde_json::from_str(compact).unwrap();
    let text = serde_json::to_string(&a).unwrap();
    assert_eq!(text, serde_json::to_string(&b).unwrap());
    assert!(
        text.contains(r#""retired_live":{"cap":4,"p":"p7-l1","r":["","2"],"k":"ax"}"#),
        "string ids share their prefix: {text}"
    );
    assert!(
        text.contains(r#""retired_upstream":{"cap":4,"ids":[[3,"Answered"]]}"#),
        "other ids keep the pairs: {text}"
    );
    assert_eq!(a.footprint().retired_live, 2);
    assert_eq!(b.footprint().retired_upstream, 1);
}
