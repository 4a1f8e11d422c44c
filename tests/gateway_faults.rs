//! Faults at the gateway, over real sockets: the upstream down at `initialize` and in
//! the middle of a round, a silent peer, DELETE mid-round, refused replies, session
//! errors (404/400), `Last-Event-ID` resumption of a broken POST or GET stream, and a
//! host that hangs up before its first message.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn sample(text: &str) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 50}})
}

/// A scripted upstream: `ask` (tools/call or prompts/get) takes one sampling round.
fn one_round(s: &Seen) -> Script {
    if s.params().get("inputResponses").is_some() {
        match s.method.as_str() {
            "prompts/get" => Script::Json(complete(&s.id, json!({"messages": []}))),
            _ => Script::Json(complete(
                &s.id,
                json!({"content": [{"type": "text", "text": "answered"}]}),
            )),
        }
    } else {
        Script::Json(input_required(
            &s.id,
            Some(json!({"q": sample("ready?")})),
            Some("st"),
        ))
    }
}

/// The harness itself: the validators do reject what they must.
#[test]
fn schema_validators_reject_invalid_traffic() {
    use gateway_support::schema::{check_downstream, check_upstream};
    let none = |_: &Value| None;
    let init = |_: &Value| Some("initialize".to_owned());
    assert!(check_downstream(
        &json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete"}}),
        &none
    )
    .is_err());
    assert!(check_downstream(
        &json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-11-25"}}),
        &init
    )
    .is_err());
    assert!(check_downstream(&json!({"jsonrpc": "2.0", "id": "x", "method": "elicitation/create", "params": {"message": "m"}}), &none).is_err());
    assert!(check_downstream(&json!({"jsonrpc": "2.0", "id": 1, "result": {"_meta": {"io.modelcontextprotocol/serverInfo": {}}}}), &none).is_err());
    assert!(check_downstream(&json!({"jsonrpc": "2.0", "id": 1, "result": {}}), &none).is_ok());
    let call =
        json!({"jsonrpc": "2.0", "id": "u1", "method": "tools/call", "params": {"name": "t"}});
    assert!(check_upstream(&call).is_err(), "no _meta");
    let call = json!({"jsonrpc": "2.0", "id": "u1", "method": "tools/call", "params": {"name": "t",
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    assert!(check_upstream(&call).is_ok());
    assert!(check_upstream(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    )
    .is_err());
}

/// Upstream unreachable at `initialize`: a clear JSON-RPC error and no session; once
/// the upstream is back, sessions work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_at_initialize() {
    // Nothing listens at all.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let ws = Workspace::new(&[]);
    let gw = Proc::gateway(&format!("http://127.0.0.1:{port}/mcp"), &ws);
    let mut host = Legacy::new(&gw.url);
    let (reply, response) = host.initialize("2025-11-25", json!({})).await;
    assert!(
        reply.headers.get("mcp-session-id").is_none(),
        "no session: {response}"
    );
    let err = response
        .get("error")
        .unwrap_or_else(|| panic!("an error: {response}"));
    assert_eq!(err["code"], -32603);
    assert!(
        err["message"].as_str().unwrap().contains("upstream"),
        "{err}"
    );

    // An upstream that drops connections, then recovers.
    let sc = Scripted::new(&[], json!({"tools": {}}), one_round).await;
    sc.up.set_down(true);
    let mut host = sc.legacy();
    let (reply, response) = host.initialize("2025-06-18", json!({"sampling": {}})).await;
    assert!(reply.headers.get("mcp-session-id").is_none());
    assert_eq!(response["error"]["code"], -32603, "{response}");
    assert!(response["error"]["message"]
        .as_str()
        .unwrap()
        .contains("upstream"));
    sc.up.set_down(false);
    let mut host = sc.legacy();
    let result = host.open("2025-06-18", json!({"sampling": {}})).await;
    assert_eq!(result["serverInfo"]["name"], "scripted-upstream");
    let ex = host
        .exchange("tools/call", json!({"name": "ask", "arguments": {}}))
        .await;
    assert_eq!(ex.response["result"]["content"][0]["text"], "answered");
}

/// Upstream lost in the middle of a round (the retry cannot be delivered; a held
/// stream ends without a response): the legacy request fails clearly and the session
/// stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_mid_round() {
    let sc = Scripted::new(&[], json!({"tools": {}, "prompts": {}}), |s| {
        if s.params()["name"] == "hang" {
            Script::Stream(vec![])
        } else {
            one_round(s)
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open("2025-11-25", json!({"sampling": {}})).await;

    // tools/call: the retry hits a dead upstream → isError result.
    let (id, reply) = host
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let live = stream.next_message().await.expect("live sampling");
    sc.up.set_down(true);
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(resp["result"]["isError"], true, "{resp}");
    assert!(
        resp["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("upstream"),
        "{resp}"
    );

    // prompts/get: a JSON-RPC error with the reason.
    sc.up.set_down(false);
    let (id, reply) = host.request("prompts/get", json!({"name": "ask"})).await;
    let mut stream = reply.sse();
    let live = stream.next_message().await.expect("live sampling");
    sc.up.set_down(true);
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(resp["error"]["code"], -32603, "{resp}");
    assert_eq!(resp["error"]["data"]["reason"], "upstreamLost");

    // The upstream comes back: the same session works.
    sc.up.set_down(false);
    let ex = host
        .exchange("tools/call", json!({"name": "ask", "arguments": {}}))
        .await;
    assert_eq!(ex.response["result"]["content"][0]["text"], "answered");

    // A held upstream stream that ends without a response.
    let (id, reply) = host
        .request("tools/call", json!({"name": "hang", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let held = eventually(WAIT, "the held call upstream", || {
        sc.up
            .seen_method("tools/call")
            .into_iter()
            .find(|s| s.params()["name"] == "hang")
    })
    .await;
    sc.up.wait_held(&held.id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    sc.up.end(&held.id);
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(resp["result"]["isError"], true, "{resp}");
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
}

/// A peer that never answers an elicitation: after `live_request_timeout_secs` the
/// request fails with a timeout, the live request is cancelled at the peer, upstream is
/// not retried and nothing is deleted; a late reply is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_times_out() {
    let rig = Rig::new(&[("live_request_timeout_secs", "2")]).await;
    rig.seed("Keep", "a").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let ws = rig.ws.notes_uri.clone();
    let (id, mut stream, live) = host.delete_round(&ws, "Keep").await;
    assert_eq!(live["method"], "elicitation/create");
    let asked = Instant::now();
    let rest = stream.drain().await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "timed out too early: {waited:?}"
    );
    let cancelled = rest
        .iter()
        .find(|m| m["method"] == "notifications/cancelled")
        .unwrap_or_else(|| panic!("the live request is cancelled at the peer: {rest:?}"));
    assert_eq!(cancelled["params"]["requestId"], live["id"]);
    let resp = rest.last().unwrap();
    assert_eq!(resp["id"], id);
    assert_eq!(resp["result"]["isError"], true, "{resp}");
    let text = resp["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("elicitation/create") && text.contains("in time"),
        "{text}"
    );
    // A late answer is accepted and dropped (2025-11-25 cancellation: the sender of
    // a cancellation SHOULD ignore later responses), and changes nothing.
    let late = host.post(&default_answer(&live)).await;
    assert_eq!(late.status, StatusCode::ACCEPTED);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        rig.hop.seen_method("tools/call").len(),
        1,
        "upstream not retried"
    );
    assert_eq!(rig.count("Keep").await, 1);
}

/// DELETE in the middle of a round: the upstream request in flight is closed (seen by
/// the upstream), nothing more goes upstream, nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mid_round() {
    // Upstream request in flight when DELETE arrives (the retry is held open).
    let sc = Scripted::new(&[], json!({"tools": {}}), |s| {
        if s.params().get("inputResponses").is_some() {
            Script::Stream(vec![])
        } else {
            one_round(s)
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open("2025-06-18", json!({"sampling": {}})).await;
    let (_, reply) = host
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let live = stream.next_message().await.expect("live sampling");
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    let retry = sc.up.wait_method("tools/call", 2).await.remove(1);
    assert_eq!(host.delete().await, StatusCode::OK);
    sc.up.wait_closed(&retry.id).await;
    let rest = stream.drain().await;
    assert!(rest.iter().all(|m| m.get("result").is_none()), "{rest:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sc.up.seen_method("tools/call").len(), 2);

    // Live request pending at the peer when DELETE arrives (real server): the late
    // answer finds no session, nothing is deleted, upstream never retried.
    let rig = Rig::new(&[]).await;
    rig.seed("Precious", "x").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let ws = rig.ws.notes_uri.clone();
    let (_, mut stream, live) = host.delete_round(&ws, "Precious").await;
    assert_eq!(host.delete().await, StatusCode::OK);
    let late = host.post(&default_answer(&live)).await;
    assert_eq!(late.status, StatusCode::NOT_FOUND);
    let _ = stream.drain().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.hop.seen_method("tools/call").len(), 1);
    assert_eq!(rig.count("Precious").await, 1, "nothing deleted");
}

/// Two replies for one live request: the second is accepted and dropped (the first
/// counts); a reply to an id the gateway never sent is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_replies_dropped_and_unknown_refused() {
    let rig = Rig::new(&[]).await;
    rig.seed("Twice", "x").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;

    let never = host
        .post(&json!({"jsonrpc": "2.0", "id": "never-sent-1", "result": {"action": "accept"}}))
        .await;
    assert_eq!(never.status, StatusCode::BAD_REQUEST);
    let never = host
        .post(&json!({"jsonrpc": "2.0", "id": 424242, "error": {"code": -1, "message": "no"}}))
        .await;
    assert_eq!(never.status, StatusCode::BAD_REQUEST);

    let ws = rig.ws.notes_uri.clone();
    let (id, mut stream, live) = host.delete_round(&ws, "Twice").await;
    let decline = json!({"jsonrpc": "2.0", "id": live["id"], "result": {"action": "decline"}});
    assert_eq!(host.post(&decline).await.status, StatusCode::ACCEPTED);
    let second = host.post(&default_answer(&live)).await;
    assert_eq!(
        second.status,
        StatusCode::ACCEPTED,
        "second reply accepted and dropped"
    );
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(
        resp["result"]["structuredContent"]["action"], "decline",
        "the first reply counts: {resp}"
    );
    assert_eq!(rig.hop.seen_method("tools/call").len(), 2);
    assert_eq!(rig.count("Twice").await, 1);
    // A third, after the request finished: still dropped, still nothing changes.
    assert_eq!(host.post(&decline).await.status, StatusCode::ACCEPTED);
}

/// Session errors: unknown or deleted session → 404; missing session id → 400; the id
/// presented with another credential → 404; a bad `MCP-Protocol-Version` → 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_errors() {
    let rig = Rig::new(&[]).await;
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});

    let mut ghost = rig.legacy();
    ghost.session = Some("0123456789abcdef0123456789abcdef0123456789abcdef".into());
    ghost.version = Some("2025-11-25".into());
    assert_eq!(ghost.post(&ping).await.status, StatusCode::NOT_FOUND);
    assert_eq!(ghost.get(None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(ghost.delete().await, StatusCode::NOT_FOUND);

    let anon = rig.legacy();
    let r = anon.post(&ping).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "missing session id");
    assert_eq!(r.json()["error"]["code"], -32600);
    assert_eq!(anon.get(None).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        anon.send(Method::DELETE, None, &[]).await.status,
        StatusCode::BAD_REQUEST
    );

    // Bound to the caller's Authorization.
    let mut alice = rig.legacy();
    alice.auth = Some("Bearer alice-token".into());
    alice.open("2025-11-25", json!({})).await;
    assert_eq!(alice.call("ping", json!({})).await["result"], json!({}));
    for other in ["Bearer mallory-token", "Bearer alice-token2", ""] {
        let r = alice
            .send(Method::POST, Some(&ping), &[("authorization", other)])
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "Authorization {other:?}");
        let r = alice
            .send(
                Method::GET,
                None,
                &[("authorization", other), ("accept", "text/event-stream")],
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::NOT_FOUND,
            "GET with Authorization {other:?}"
        );
        let r = alice
            .send(Method::DELETE, None, &[("authorization", other)])
            .await;
        assert_eq!(
            r.status,
            StatusCode::NOT_FOUND,
            "DELETE with Authorization {other:?}"
        );
    }
    assert_eq!(
        alice.call("ping", json!({})).await["result"],
        json!({}),
        "still alice's"
    );

    // Bad MCP-Protocol-Version on a live session.
    for bad in ["1999-01-01", "garbage", "2026-07-28-x"] {
        let r = alice
            .send(Method::POST, Some(&ping), &[("mcp-protocol-version", bad)])
            .await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "MCP-Protocol-Version {bad:?}"
        );
        assert_eq!(r.json()["error"]["code"], -32600);
    }

    // Deleted: 404 afterwards.
    assert_eq!(alice.delete().await, StatusCode::OK);
    assert_eq!(alice.post(&ping).await.status, StatusCode::NOT_FOUND);
    assert_eq!(alice.delete().await, StatusCode::NOT_FOUND);
}

/// `Last-Event-ID`: a POST's SSE stream broken before its response; the events sent
/// meanwhile are delivered on a GET that names the last event seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_broken_stream() {
    let rig = Rig::new(&[]).await;
    rig.seed("Resume", "x").await;
    rig.seed("Resume", "y").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let ws = rig.ws.notes_uri.clone();
    let (id, reply) = host
        .request(
            "tools/call",
            json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Resume"}}),
        )
        .await;
    let mut stream = reply.sse();
    let (mut ids, mut live) = (Vec::new(), None);
    while live.is_none() {
        match stream.next_within(WAIT).await {
            Next::Item(item) => {
                if let Some(i) = &item.id {
                    ids.push(i.clone());
                }
                live = item.data;
            }
            other => panic!("{other:?}"),
        }
    }
    let live = live.unwrap();
    assert_eq!(live["method"], "elicitation/create");
    let last = ids.last().cloned().expect("event ids");
    let (stream_no, seq) = last.split_once('.').unwrap();
    // Break the connection, then answer: the response is produced while no one listens.
    drop(stream);
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    rig.hop.wait_method("tools/call", 2).await;

    let mut resumed = host.get(Some(&last)).await.sse();
    let (eid, resp) = resumed
        .next_message_item()
        .await
        .expect("the missed response");
    assert_eq!(resp["id"], id, "{resp}");
    assert_ne!(resp["result"]["isError"], true, "{resp}");
    let eid = eid.expect("event id");
    let (n, s) = eid.split_once('.').unwrap();
    assert_eq!(n, stream_no, "same stream");
    assert!(s.parse::<u64>().unwrap() > seq.parse::<u64>().unwrap());
    assert!(
        resumed.next_message().await.is_none(),
        "the finished stream ends after replay"
    );

    // From the priming event: everything again, in order.
    let mut again = host.get(Some(&format!("{stream_no}.0"))).await.sse();
    let all = again.drain().await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0]["id"], live["id"]);
    assert_eq!(all[1]["id"], id);
    assert_eq!(rig.count("Resume").await, 1, "deleted once");
    assert_eq!(rig.hop.seen_method("tools/call").len(), 2);

    // A stream the session never told of: nothing to resume, and the session stays.
    host.get(Some("999.0")).await.assert_unresumable();
    let ping = json!({"jsonrpc": "2.0", "id": "after", "method": "ping"});
    assert_eq!(host.post(&ping).await.json()["result"], json!({}));
}

/// The host drops its POST before anything came back (2025-11-25: a disconnection is
/// not a cancellation). The upstream call the gateway was driving for that POST keeps
/// running, gets its answer, and is never cancelled; the session stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_gone_before_first_message_keeps_upstream_call() {
    let sc = Scripted::new(&[], json!({"tools": {}}), |_| Script::Stream(vec![])).await;
    let mut host = sc.legacy();
    host.open("2025-11-25", json!({})).await;
    let gone = tokio::time::timeout(
        Duration::from_millis(300),
        host.request("tools/call", json!({"name": "slow", "arguments": {}})),
    )
    .await;
    assert!(
        gone.is_err(),
        "the gateway answered before its first message"
    );
    let call = sc.up.wait_method("tools/call", 1).await.remove(0);
    sc.up.wait_held(&call.id).await;
    // Past the point where the POST would have become an SSE stream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !sc.up.was_closed(&call.id),
        "the upstream call was cancelled"
    );
    sc.up.push(
        &call.id,
        complete(
            &call.id,
            json!({"content": [{"type": "text", "text": "done"}]}),
        ),
    );
    eventually(WAIT, "the upstream call to finish", || {
        sc.up.was_finished(&call.id).then_some(())
    })
    .await;
    assert!(!sc.up.was_closed(&call.id));
    assert_eq!(sc.up.seen_method("notifications/cancelled").len(), 0);
    let ping = json!({"jsonrpc": "2.0", "id": "after", "method": "ping"});
    assert_eq!(host.post(&ping).await.json()["result"], json!({}));
}

/// `Last-Event-ID` on the standalone GET stream: a notification sent while the host's
/// GET was broken is replayed, alone and in order, on the GET that names the last event
/// seen; the subscription behind it is never dropped upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_broken_get_stream() {
    let caps = json!({"resources": {"subscribe": true}});
    let sc = Scripted::new(&[], caps, |s| match s.method.as_str() {
        "subscriptions/listen" => Script::Stream(vec![json!({
            "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID: s.id}, "notifications": s.params()["notifications"]}
        })]),
        _ => Script::Json(complete(&s.id, json!({}))),
    })
    .await;
    let mut host = sc.legacy();
    host.open("2025-11-25", json!({})).await;
    let mut get = host.get(None).await.sse();
    let uri = "file:///docs/plan.md";
    assert_eq!(
        host.call("resources/subscribe", json!({"uri": uri})).await["result"],
        json!({})
    );
    let listen = eventually(WAIT, "the listen carrying the subscription", || {
        sc.up
            .seen_method("subscriptions/listen")
            .into_iter()
            .find(|s| s.params()["notifications"]["resourceSubscriptions"] == json!([uri]))
    })
    .await;
    sc.up.wait_held(&listen.id).await;
    let updated = |n: u32| {
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
               "params": {"uri": format!("{uri}#{n}"), "_meta": {SUBSCRIPTION_ID: listen.id}}})
    };
    sc.up.push(&listen.id, updated(1));
    let (first_id, first) = get.next_message_item().await.expect("first update");
    assert_eq!(first["params"]["uri"], format!("{uri}#1"));
    let first_id = first_id.expect("an event id on the GET stream");

    // Break the GET, then let two more updates happen while nobody listens.
    drop(get);
    tokio::time::sleep(Duration::from_millis(200)).await;
    sc.up.push(&listen.id, updated(2));
    sc.up.push(&listen.id, updated(3));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut resumed = host.get(Some(&first_id)).await.sse();
    let (id2, m2) = resumed.next_message_item().await.expect("missed update 2");
    let (_, m3) = resumed.next_message_item().await.expect("missed update 3");
    assert_eq!(m2["params"]["uri"], format!("{uri}#2"), "{m2}");
    assert_eq!(m3["params"]["uri"], format!("{uri}#3"), "{m3}");
    let (n1, s1) = first_id.split_once('.').unwrap();
    let (n2, s2) = id2.as_deref().expect("event id").split_once('.').unwrap();
    assert_eq!(n1, n2, "same stream");
    assert!(s2.parse::<u64>().unwrap() > s1.parse::<u64>().unwrap());
    // The resumed stream stays live.
    sc.up.push(&listen.id, updated(4));
    let (_, m4) = resumed.next_message_item().await.expect("live update 4");
    assert_eq!(m4["params"]["uri"], format!("{uri}#4"), "{m4}");
    assert!(
        !sc.up.was_closed(&listen.id),
        "the subscription was dropped"
    );
}
