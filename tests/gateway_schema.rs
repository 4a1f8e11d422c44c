//! Schema conformance of everything the gateway says, over real sockets: each message
//! it sends a legacy peer validates against the 2025-11-25 `schema.json`, each message
//! it sends upstream against the 2026-07-28 one (the harness checks every message of
//! every gateway test; these tests drive a broad session per revision through it and
//! count), plus notifications relayed from the upstream (progress, logs).

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

per_revision!(
    a_broad_session_validates_both_ways,
    progress_and_logs_relayed_on_the_request_stream,
);

/// A session touching every path the notes server offers, success and failure; every
/// message both ways is checked by the harness as it passes.
async fn a_broad_session_validates_both_ways(rev: &str) {
    let rig = Rig::new(&[]).await;
    let ws = rig.ws.notes_uri.clone();
    let repo = rig.ws.repo.display().to_string();
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let mut get = host.get(None).await.sse();

    host.call("ping", json!({})).await;
    host.call("logging/setLevel", json!({"level": "info"}))
        .await;
    host.call("tools/list", json!({})).await;
    for i in 0..2 {
        let r = host
            .call("tools/call", json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": "Schema", "body": format!("n{i}")}}))
            .await;
        assert_ne!(r["result"]["isError"], true, "{r}");
    }
    host.call(
        "tools/call",
        json!({"name": "notes_list", "arguments": {"workspaceUri": ws, "query": "n1"}}),
    )
    .await;
    if rev != "2025-03-26" {
        let ex = host
            .exchange("tools/call", json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Schema"}}))
            .await;
        assert_eq!(ex.live.len(), 1);
        let ex = host
            .exchange_with(
                "tools/call",
                json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Schema"}}),
                |l| json!({"jsonrpc": "2.0", "id": l["id"], "result": {"action": "cancel"}}),
            )
            .await;
        assert_eq!(
            ex.response["result"]["structuredContent"]["action"],
            "cancel"
        );
    }
    host.exchange(
        "tools/call",
        json!({"name": "summarize_repo", "arguments": {"directory": repo, "audience": "ops"}}),
    )
    .await;
    host.exchange("tools/call", json!({"name": "notes_list", "arguments": {}}))
        .await;
    // Failures, passed through or made by the gateway.
    let errors = [
        host.call("resources/list", json!({})).await,
        host.call("no/such/method", json!({})).await,
        host.call("tools/call", json!({"name": "no_such_tool", "arguments": {}})).await,
        host.call("tools/call", json!({"name": "notes_list", "arguments": {"workspaceUri": "file:///etc"}})).await,
        host.call("logging/setLevel", json!({})).await,
        host.call("initialize", json!({"protocolVersion": rev, "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}})).await,
        host.call("server/discover", json!({})).await,
        host.call("resources/subscribe", json!({})).await,
    ];
    for e in &errors {
        assert!(
            e.get("error").is_some() || e["result"]["isError"] == true,
            "{e}"
        );
    }
    let bad = host.post(&json!({"jsonrpc": "2.0", "id": 77})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["code"], -32600);
    if rev == "2025-03-26" {
        host.expect_response(&json!(500), "ping");
        host.expect_response(&json!(501), "tools/list");
        let reply = host
            .post(&json!([
                {"jsonrpc": "2.0", "id": 500, "method": "ping"},
                {"jsonrpc": "2.0", "id": 501, "method": "tools/list"},
                {"jsonrpc": "2.0", "id": 502, "method": "no/such/method"},
                {"jsonrpc": "2.0", "id": 503},
            ]))
            .await;
        match reply.body {
            Body::Json(v) => assert_eq!(v.as_array().map(Vec::len), Some(4), "{v}"),
            Body::Sse(mut s) => {
                let v = s.next_message().await.expect("batch answer");
                assert_eq!(v.as_array().map(Vec::len), Some(4), "{v}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(host.delete().await, StatusCode::OK);
    let _ = get.drain().await;

    let downstream = host.validated.load(Ordering::SeqCst);
    let upstream = rig.hop.validated();
    assert!(
        downstream >= 20,
        "only {downstream} messages validated downstream"
    );
    assert!(
        upstream >= 10,
        "only {upstream} messages validated upstream"
    );
    // Every upstream request was valid (the hop panics on any violation).
    assert_eq!(rig.hop.seen().len(), upstream);
}

/// Upstream notifications about a request (progress with the peer's own token, log
/// messages) reach the peer on that request's stream, shaped for its revision; the
/// peer's progress on a live request keeps it from timing out.
async fn progress_and_logs_relayed_on_the_request_stream(rev: &str) {
    let sc = Scripted::new(&[("live_request_timeout_secs", "3")], json!({"tools": {}, "logging": {}}), |s| {
        let token = s.meta()["progressToken"].clone();
        match s.params()["name"].as_str() {
            Some("work") => Script::Stream(vec![
                json!({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"progressToken": token, "progress": 1, "total": 2, "message": "half way"}}),
                json!({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": "info", "logger": "work", "data": {"step": 1}}}),
                complete(&s.id, json!({"content": [{"type": "text", "text": "worked"}]})),
            ]),
            _ if s.params().get("inputResponses").is_some() => {
                Script::Json(complete(&s.id, json!({"content": [{"type": "text", "text": "patient"}]})))
            }
            _ => Script::Json(input_required(
                &s.id,
                Some(json!({"q": {"method": "sampling/createMessage", "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "slow?"}}], "maxTokens": 5}}})),
                None,
            )),
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open(rev, full_caps(rev)).await;
    host.call("logging/setLevel", json!({"level": "info"}))
        .await;
    let ex = host
        .exchange(
            "tools/call",
            json!({"name": "work", "arguments": {}, "_meta": {"progressToken": "pt-1"}}),
        )
        .await;
    assert_eq!(ex.response["result"]["content"][0]["text"], "worked");
    assert_eq!(ex.notifications.len(), 2, "{:?}", ex.notifications);
    let progress = &ex.notifications[0];
    assert_eq!(progress["method"], "notifications/progress");
    assert_eq!(progress["params"]["progressToken"], "pt-1");
    assert_eq!(progress["params"]["progress"], 1);
    assert_eq!(progress["params"]["message"], "half way");
    assert_eq!(
        ex.notifications[1],
        json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "logger": "work", "data": {"step": 1}}})
    );
    let up = sc.up.seen_method("tools/call");
    assert_eq!(up[0].meta()["progressToken"], "pt-1");
    assert_eq!(up[0].meta()[LOG_LEVEL], "info");

    // The peer reports progress on a live request for longer than the live timeout
    // (3 s) and then answers: the request is not failed in between.
    let (id, reply) = host
        .request("tools/call", json!({"name": "patient", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let live = stream.next_message().await.expect("live sampling");
    let token = live["params"]["_meta"]["progressToken"].clone();
    assert_eq!(token, live["id"]);
    for step in 1..=8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let st = host
            .notify(
                "notifications/progress",
                json!({"progressToken": token, "progress": step}),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    assert_eq!(
        host.post(&default_answer(&live)).await.status,
        StatusCode::ACCEPTED
    );
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(resp["result"]["content"][0]["text"], "patient", "{resp}");
    let _: Vec<Value> = stream.drain().await;
}
