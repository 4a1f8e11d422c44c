//! Bounds and timers of legacy sessions, over real sockets: SSE comment keepalives on
//! idle streams, idle-session eviction, the session limit.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::StatusCode;
use serde_json::json;
use std::time::Duration;

/// An idle GET stream and an idle POST stream (a live request left unanswered) both
/// get SSE comment keepalives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_comments_on_idle_streams() {
    let rig = Rig::new(&[("keepalive_secs", "1")]).await;
    rig.seed("Idle", "x").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;

    let mut get = host.get(None).await.sse();
    let mut comments = 0;
    while comments < 2 {
        match get.next_within(WAIT).await {
            Next::Item(item) if item.comment => comments += 1,
            Next::Item(item) => assert!(item.data.is_none(), "nothing but keepalives: {item:?}"),
            other => panic!("no keepalive on the idle GET stream: {other:?}"),
        }
    }

    let ws = rig.ws.notes_uri.clone();
    let (_, mut post, live) = host.delete_round(&ws, "Idle").await;
    assert_eq!(live["method"], "elicitation/create");
    match post.next_within(WAIT).await {
        Next::Item(item) if item.comment => {}
        Next::Item(item) => panic!("unexpected event while idle: {item:?}"),
        other => panic!("no keepalive on the idle POST stream: {other:?}"),
    }
    // The stream still works after keepalives.
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    let resp = post.next_message().await.expect("response");
    assert_ne!(resp["result"]["isError"], true, "{resp}");
}

/// A session unused for `session_idle_ttl_secs` is evicted: its id then gets 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_evicted() {
    let rig = Rig::new(&[("session_idle_ttl_secs", "1")]).await;
    let mut host = rig.legacy();
    host.open("2025-06-18", json!({})).await;
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    // Each probe that finds the session alive uses it again, so wait well past the TTL
    // between probes (a loaded machine may delay the reaper).
    let mut evicted = false;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let r = host.post(&ping).await;
        if r.status == StatusCode::NOT_FOUND {
            evicted = true;
            break;
        }
        assert_eq!(r.status, StatusCode::OK);
    }
    assert!(evicted, "the idle session was never evicted");
    // A new session works.
    let mut again = rig.legacy();
    again.open("2025-06-18", json!({})).await;
    assert_eq!(again.call("ping", json!({})).await["result"], json!({}));
}

/// `max_sessions`: one more `initialize` evicts the longest-idle session that has
/// nothing in flight (its id then gets 404); the others are unaffected. (Refusal when
/// every session is busy: `tests/hostile_peers.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_enforced() {
    let rig = Rig::new(&[("max_sessions", "2")]).await;
    let mut a = rig.legacy();
    a.open("2025-11-25", json!({})).await;
    let mut b = rig.legacy();
    b.open("2025-03-26", json!({})).await;
    let mut c = rig.legacy();
    let (reply, response) = c.initialize("2025-11-25", json!({})).await;
    assert_eq!(reply.status, StatusCode::OK, "{response}");
    assert!(reply.headers.get("mcp-session-id").is_some());
    let ping = json!({"jsonrpc": "2.0", "id": 77, "method": "ping"});
    assert_eq!(
        a.post(&ping).await.status,
        StatusCode::NOT_FOUND,
        "a was the idlest"
    );
    assert_eq!(b.call("ping", json!({})).await["result"], json!({}));
    assert_eq!(c.call("ping", json!({})).await["result"], json!({}));
    assert!(rig.gateway.log().len() < 1000);
}

/// A session is idle from the moment it is opened, not from when its `initialize`
/// arrived: an upstream slower to discover than the idle TTL must not get fresh
/// sessions evicted before the peer can use them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_discover_does_not_evict_the_new_session() {
    let ws = Workspace::new(&[("session_idle_ttl_secs", "4")]);
    let up = Upstream::scripted(|s| match s.method.as_str() {
        "server/discover" => Script::Delayed(
            Duration::from_secs(8),
            Box::new(Script::Json(discover_result(&s.id, json!({"tools": {}})))),
        ),
        _ => Script::Json(complete(&s.id, json!({"tools": []}))),
    })
    .await;
    let gw = Proc::gateway(&up.url, &ws);
    let mut host = Legacy::new(&gw.url);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "slow", "version": "1"}}});
    host.expect_response(&json!(1), "initialize");
    let reply = host.post(&init).await;
    assert_eq!(reply.status, StatusCode::OK);
    host.session = reply
        .headers
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    host.version = Some("2025-06-18".into());
    assert!(host.session.is_some());
    // Well inside the TTL counted from the answer, well past it counted from the
    // request (and past at least one reaper pass).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = host
        .post(&json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the new session was evicted before first use"
    );
}
