//! Tasks across eras in the session machine, on the paths the transcript vectors do not
//! walk: a session's tasks survive serialization between two inputs (the Redis store
//! serializes the machine after every step), a `tasks/result` wait paces its polls by
//! the upstream's `pollIntervalMs` and gives up at the live-request cap, a terminal
//! task keeps its state, and the task methods take only string ids of this session.

use dualera_adapters::{
    Config, Event, Message, Notification, PeerStream, Request, RequestId, Response, Session,
    Timestamp,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const TASKS: &str = "io.modelcontextprotocol/tasks";
const RELATED: &str = "io.modelcontextprotocol/related-task";

fn discover() -> Value {
    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
           "capabilities": {"tools": {}, "extensions": {TASKS: {}}},
           "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}})
}

fn request(id: i64, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id: RequestId::Number(id),
        method: method.into(),
        params: Some(params),
    })
}

fn drain(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event())
        .filter(|e| !matches!(e, Event::Observed(_)))
        .collect()
}

fn at(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// The one upstream request among `events`: (id, method, params).
fn upstream(events: &[Event]) -> (RequestId, String, Value) {
    let ups: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToUpstream { request, .. } => Some(request.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ups.len(), 1, "one upstream request expected: {events:?}");
    let r = &ups[0];
    (r.id.clone(), r.method.clone(), r.params.clone().unwrap())
}

/// What reached the peer among `events`.
fn to_peer(events: &[Event]) -> Vec<(PeerStream, Value)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToPeer { stream, message } => Some((stream.clone(), message.to_value())),
            _ => None,
        })
        .collect()
}

fn task_state(status: &str, extra: Value) -> Value {
    let mut t = json!({"resultType": "complete", "taskId": "tk1", "status": status,
        "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:00Z",
        "ttlMs": 60000, "pollIntervalMs": 300});
    for (k, v) in extra.as_object().unwrap() {
        t[k] = v.clone();
    }
    t
}

fn answer(s: &mut Session, id: RequestId, result: Value, now: u64) -> Vec<Event> {
    s.handle_upstream_message(
        Some(id.clone()),
        Message::Response(Response::result(id, result)),
        at(now),
    )
    .unwrap();
    drain(s)
}

/// Serializes, deserializes and restores `s`, as the Redis driver does between steps.
fn round_trip(s: &Session, config: &Arc<Config>) -> Session {
    let bytes = serde_json::to_vec(s).unwrap();
    let back: Session = serde_json::from_slice(&bytes).unwrap();
    back.restore(config.clone(), Some(Arc::new(discover())))
}

/// A 2025-11-25 session that declared tasks, with task `tk1` created.
fn with_task(config: &Arc<Config>) -> Session {
    let mut s = Session::with_shared_config(config.clone(), "p1");
    s.handle_discover(discover()).unwrap();
    let caps = json!({"sampling": {}, "tasks": {"list": {}}});
    s.handle_peer_message(
        request(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": caps,
                   "clientInfo": {"name": "h", "version": "1"}}),
        ),
        at(0),
    )
    .unwrap();
    let init = to_peer(&drain(&mut s));
    assert_eq!(
        init[0].1["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    s.handle_peer_message(
        request(
            1,
            "tools/call",
            json!({"name": "t", "arguments": {}, "task": {}}),
        ),
        at(0),
    )
    .unwrap();
    let (id, method, params) = upstream(&drain(&mut s));
    assert_eq!(method, "tools/call");
    assert!(params.get("task").is_none());
    assert_eq!(
        params["_meta"]["io.modelcontextprotocol/clientCapabilities"]["extensions"],
        json!({TASKS: {}})
    );
    let created = answer(
        &mut s,
        id,
        json!({"resultType": "task", "taskId": "tk1", "status": "working",
               "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:00Z",
               "ttlMs": 60000, "pollIntervalMs": 300}),
        0,
    );
    assert_eq!(
        to_peer(&created)[0].1["result"]["task"]["status"],
        "working"
    );
    s
}

#[test]
fn a_tasks_result_wait_survives_serialization_at_every_step() {
    let config = Arc::new(Config::default());
    let mut s = round_trip(&with_task(&config), &config);
    s.handle_peer_message(request(2, "tasks/result", json!({"taskId": "tk1"})), at(10))
        .unwrap();
    let (id, method, _) = upstream(&drain(&mut s));
    assert_eq!(method, "tasks/get");
    let mut s = round_trip(&s, &config);
    // Still working: the next poll waits for the upstream's poll interval.
    assert!(answer(&mut s, id, task_state("working", json!({})), 10).is_empty());
    assert_eq!(s.poll_timeout(), Some(at(310)));
    let mut s = round_trip(&s, &config);
    s.handle_timeout(at(310));
    let (id, method, _) = upstream(&drain(&mut s));
    assert_eq!(method, "tasks/get");
    let mut s = round_trip(&s, &config);
    let input = json!({"inputRequests": {"pick": {"method": "sampling/createMessage",
        "params": {"messages": [], "maxTokens": 5}}}});
    let live = to_peer(&answer(
        &mut s,
        id,
        task_state("input_required", input),
        320,
    ));
    assert_eq!(live.len(), 1);
    let (stream, live) = &live[0];
    assert_eq!(*stream, PeerStream::Request(RequestId::Number(2)));
    assert_eq!(live["params"]["_meta"][RELATED], json!({"taskId": "tk1"}));
    let live_id = RequestId::from_value(&live["id"]).unwrap();
    let mut s = round_trip(&s, &config);
    s.handle_peer_message(
        Message::Response(Response::result(
            live_id,
            json!({"role": "assistant",
            "content": {"type": "text", "text": "x"}, "model": "m"}),
        )),
        at(330),
    )
    .unwrap();
    let (id, method, params) = upstream(&drain(&mut s));
    assert_eq!(method, "tasks/update");
    assert_eq!(params["inputResponses"]["pick"]["model"], "m");
    let mut s = round_trip(&s, &config);
    let (id, method, _) = upstream(&answer(&mut s, id, json!({"resultType": "complete"}), 340));
    assert_eq!(method, "tasks/get");
    let mut s = round_trip(&s, &config);
    let done = task_state(
        "completed",
        json!({"result": {"resultType": "complete", "content": [{"type": "text", "text": "ok"}]}}),
    );
    let out = to_peer(&answer(&mut s, id, done, 350));
    assert_eq!(
        out[0].1["result"],
        json!({"content": [{"type": "text", "text": "ok"}], "_meta": {RELATED: {"taskId": "tk1"}}})
    );
    // The book, restored once more, lists the task as completed; a later status
    // notification cannot move it out of its terminal state.
    let mut s = round_trip(&s, &config);
    s.handle_peer_message(request(3, "tasks/list", json!({})), at(360))
        .unwrap();
    let listed = to_peer(&drain(&mut s));
    assert_eq!(listed[0].1["result"]["tasks"][0]["status"], "completed");
    assert_eq!(listed[0].1["result"]["tasks"][0]["ttl"], 60000);
}

#[test]
fn a_wait_gives_up_at_the_live_request_cap() {
    let mut config = Config::default();
    config.live_timeout_max = Duration::from_millis(1000);
    let config = Arc::new(config);
    let mut s = with_task(&config);
    s.handle_peer_message(request(2, "tasks/result", json!({"taskId": "tk1"})), at(0))
        .unwrap();
    let (mut id, _, _) = upstream(&drain(&mut s));
    let mut now = 0;
    for _ in 0..10 {
        let out = answer(&mut s, id.clone(), task_state("working", json!({})), now);
        if let Some((_, m)) = to_peer(&out).first() {
            assert_eq!(m["error"]["data"]["reason"], "taskTimeout", "{m}");
            assert!(now >= 1000);
            return;
        }
        now += 300;
        s.handle_timeout(at(now));
        id = upstream(&drain(&mut s)).0;
    }
    panic!("the wait never gave up");
}

#[test]
fn task_ids_are_strings_of_this_session() {
    let config = Arc::new(Config::default());
    let mut s = with_task(&config);
    for (id, params) in [
        (2, json!({"taskId": 7})),
        (3, json!({})),
        (4, json!({"taskId": "tk-other"})),
    ] {
        s.handle_peer_message(request(id, "tasks/get", params), at(0))
            .unwrap();
        let out = drain(&mut s);
        assert!(
            !out.iter().any(|e| matches!(e, Event::ToUpstream { .. })),
            "{out:?}"
        );
        assert_eq!(to_peer(&out)[0].1["error"]["code"], -32602);
    }
    // The standalone stream opens: the subscription asks for task status, and a
    // status notification becomes `notifications/tasks/status` for this session's
    // task only.
    s.handle_standalone_opened().unwrap();
    let (listen, method, params) = upstream(&drain(&mut s));
    assert_eq!(method, "subscriptions/listen");
    assert_eq!(params["notifications"]["taskStatus"], true);
    for (task, shown) in [("tk-other", false), ("tk1", true)] {
        let n = Notification {
            method: "notifications/tasks".into(),
            params: Some(task_state("completed", json!({"taskId": task}))),
        };
        s.handle_upstream_message(Some(listen.clone()), Message::Notification(n), at(0))
            .unwrap();
        let out = to_peer(&drain(&mut s));
        if shown {
            assert_eq!(out[0].0, PeerStream::Standalone);
            assert_eq!(out[0].1["method"], "notifications/tasks/status");
            assert_eq!(out[0].1["params"]["taskId"], "tk1");
            assert_eq!(out[0].1["params"]["ttl"], 60000);
            assert!(out[0].1["params"].get("resultType").is_none());
        } else {
            assert!(out.is_empty(), "{out:?}");
        }
    }
}
