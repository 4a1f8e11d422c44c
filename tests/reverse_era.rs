//! The reverse bridge's "everything else of the era" over real sockets: the gateway
//! binary (`--upstream-era legacy`) in front of the official Python SDK's FastMCP
//! server (mcp 1.30.0, `tests/interop/py/legacy_server.py`), the modern host being raw
//! 2026-07-28 HTTP requests from this test.
//!
//! - log lines and progress the server sends on one request's response stream reach
//!   that host request's stream only, with the host's own progress token, while
//!   another call of the same partition runs;
//! - the forwarded and trace headers of a host request reach the legacy server on the
//!   call it causes;
//! - a host's `notifications/cancelled` for a request cancels its legacy call upstream;
//! - `subscriptions/listen` subscribes upstream (`resources/subscribe`), relays
//!   `notifications/resources/updated` and `notifications/tools/list_changed` on the
//!   listener's stream with its subscription id, and unsubscribes when the host
//!   closes it; a listener whose wait runs out ends with the graceful closure result;
//! - `/readyz`, the metrics and the migration report name the legacy upstream, and
//!   the metrics count the bridge's answers and rounds.
//!
//! The Python peer lives in the interop suite's venv. Without it these tests fail (they
//! never skip); `python3 tests/interop/run.py --prepare-legacy-python` creates it.

#[path = "common/legacy_server.rs"]
mod legacy_server;
#[path = "common/modern_host.rs"]
mod modern_host;

use legacy_server::PyServer;
use modern_host::{call, get, meta, post, send, text, Gateway, Stream, WAIT};
use serde_json::{json, Value};
use std::time::Duration;

/// `steps(tag, n)` asking for log lines at `info` and progress with token `token`.
fn steps(id: i64, tag: &str, n: u64, token: &str) -> Value {
    let mut request = call(id, "steps", json!({ "tag": tag, "n": n }));
    let m = &mut request["params"]["_meta"];
    m["io.modelcontextprotocol/logLevel"] = json!("info");
    m["progressToken"] = json!(token);
    request
}

#[tokio::test]
async fn log_lines_and_progress_reach_only_the_stream_of_their_request() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    // Open the partition's session first, so both calls run on it at once.
    let (_, added) = post(&gw.url(), &[], &call(1, "add", json!({ "a": 1, "b": 2 }))).await;
    assert_eq!(text(&added[0]), "3");
    let url = gw.url();
    let a = steps(2, "alpha", 4, "tok-a");
    let b = steps(3, "beta", 4, "tok-b");
    let (ra, rb) = tokio::join!(post(&url, &[], &a), post(&url, &[], &b));
    for ((status, messages), (tag, token, id)) in
        [(ra, ("alpha", "tok-a", 2)), (rb, ("beta", "tok-b", 3))]
    {
        assert_eq!(status, 200);
        let (last, before) = messages.split_last().expect("messages");
        assert_eq!(last["id"], id, "{last}");
        assert_eq!(text(last), tag);
        let logs: Vec<&Value> = before
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .collect();
        let progress: Vec<&Value> = before
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        // 2026-07-28 basic/patterns/progress and server/utilities/logging: a
        // request's notifications travel on its own stream.
        assert_eq!(logs.len(), 4, "{tag}: {before:?}");
        for (i, l) in logs.iter().enumerate() {
            assert_eq!(l["params"]["data"], format!("{tag} {i}"), "{l}");
        }
        assert_eq!(progress.len(), 4, "{tag}: {before:?}");
        for (i, p) in progress.iter().enumerate() {
            assert_eq!(p["params"]["progressToken"], token, "{p}");
            assert_eq!(p["params"]["progress"], json!(i as f64 + 1.0), "{p}");
        }
    }
}

#[tokio::test]
async fn forwarded_and_trace_headers_reach_the_legacy_call() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let headers = [("traceparent", parent), ("tracestate", "vendor=1")];
    let header_of = |id: i64, name: &str| call(id, "header", json!({ "name": name }));
    let (_, got) = post(&gw.url(), &headers, &header_of(1, "traceparent")).await;
    assert_eq!(text(&got[0]), parent);
    let (_, got) = post(&gw.url(), &headers, &header_of(2, "tracestate")).await;
    assert_eq!(text(&got[0]), "vendor=1");
    // The gateway's hop, as in the forward direction (X-Forwarded-* by default).
    let (_, got) = post(&gw.url(), &[], &header_of(3, "x-forwarded-for")).await;
    assert_eq!(text(&got[0]), "127.0.0.1");
    let (_, got) = post(&gw.url(), &[], &header_of(4, "x-forwarded-proto")).await;
    assert_eq!(text(&got[0]), "http");
    // A request without a trace context sends none.
    let (_, got) = post(&gw.url(), &[], &header_of(5, "traceparent")).await;
    assert_eq!(text(&got[0]), "");
}

#[tokio::test]
async fn a_hosts_cancellation_notification_cancels_its_call_upstream() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    let token = [("authorization", "Bearer alpha")];
    let (_, added) = post(
        &gw.url(),
        &token,
        &call(1, "add", json!({ "a": 1, "b": 1 })),
    )
    .await;
    assert_eq!(text(&added[0]), "2");
    let url = gw.url();
    let slow = tokio::spawn(async move {
        let token = [("authorization", "Bearer alpha")];
        post(&url, &token, &call(7, "wait", json!({ "seconds": 20 }))).await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(py.count("POST /mcp notifications/cancelled").await, 0);
    let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 7, "reason": "user" } });
    // Another principal's cancellation of the same id cancels nothing.
    let other = send(&gw.url(), &[("authorization", "Bearer beta")], &cancel).await;
    assert_eq!(other.status(), 202);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(py.count("POST /mcp notifications/cancelled").await, 0);
    assert!(
        !slow.is_finished(),
        "the call ended on another's cancellation"
    );
    let accepted = send(&gw.url(), &token, &cancel).await;
    assert_eq!(accepted.status(), 202);
    // 2025-11-25 basic/utilities/cancellation: the bridge tells the server.
    let deadline = std::time::Instant::now() + WAIT;
    while py.count("POST /mcp notifications/cancelled").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no cancellation upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The cancelled request's own POST ends long before the call would have.
    let (_, answer) = tokio::time::timeout(Duration::from_secs(5), slow)
        .await
        .expect("the cancelled request ended")
        .expect("joined");
    assert!(answer[0]["error"].is_object(), "{answer:?}");
    let (_, added) = post(
        &gw.url(),
        &token,
        &call(8, "add", json!({ "a": 2, "b": 2 })),
    )
    .await;
    assert_eq!(text(&added[0]), "4");
}

fn listen(id: i64, uri: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
        "_meta": meta(),
        "notifications": {
            "toolsListChanged": true,
            "promptsListChanged": true,
            "resourceSubscriptions": [uri]
        } } })
}

#[tokio::test]
async fn listen_subscribes_upstream_and_relays_the_servers_notifications() {
    let py = PyServer::spawn("streamable-http-notify");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    let uri = "file:///notes/a.md";
    let mut stream = Stream::open(&gw.url(), &[], &listen(1, uri)).await;
    let ack = stream.next().await.expect("acknowledgment");
    // 2026-07-28 basic/patterns/subscriptions: the acknowledgment first, with the
    // subscription id and the subset the server honours.
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        1
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({ "toolsListChanged": true, "promptsListChanged": true,
                "resourceSubscriptions": [uri] }),
        "{ack}"
    );
    // 2025-11-25 server/resources, "Subscriptions": the bridge subscribed upstream.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, s) = post(&gw.url(), &[], &call(2, "subscribed", json!({}))).await;
        if text(&s[0]) == uri {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never subscribed upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, touched) = post(&gw.url(), &[], &call(3, "touch", json!({ "uri": uri }))).await;
    assert_eq!(text(&touched[0]), "touched");
    let updated = stream.next().await.expect("resources/updated");
    assert_eq!(
        updated["method"], "notifications/resources/updated",
        "{updated}"
    );
    assert_eq!(updated["params"]["uri"], uri);
    assert_eq!(
        updated["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1,
        "{updated}"
    );
    // Another resource's change is not this listener's business.
    let (_, _) = post(
        &gw.url(),
        &[],
        &call(4, "touch", json!({ "uri": "file:///other" })),
    )
    .await;
    let (_, grown) = post(&gw.url(), &[], &call(5, "grow", json!({ "name": "extra" }))).await;
    assert_eq!(text(&grown[0]), "grown");
    let changed = stream.next().await.expect("tools/list_changed");
    assert_eq!(
        changed["method"], "notifications/tools/list_changed",
        "{changed}"
    );
    assert_eq!(
        changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1,
        "{changed}"
    );
    // The host closes its stream: the subscription ends upstream too.
    drop(stream);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, s) = post(&gw.url(), &[], &call(6, "subscribed", json!({}))).await;
        if text(&s[0]).is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never unsubscribed upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(py.count("POST /mcp resources/subscribe").await, 1);
    assert_eq!(py.count("POST /mcp resources/unsubscribe").await, 1);
}

#[tokio::test]
async fn a_listener_whose_wait_runs_out_ends_gracefully() {
    let py = PyServer::spawn("streamable-http-notify");
    let guard = tempfile::Builder::new()
        .prefix("dualera-reverse-era-")
        .tempdir()
        .expect("temp dir");
    let dir = guard.path();
    let config = dir.join("listen.toml");
    std::fs::write(&config, "[gateway]\nlive_request_timeout_max_secs = 2\n").expect("config");
    let gw = Gateway::spawn(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "--upstream",
        &py.url("/mcp"),
    ]);
    let uri = "file:///notes/b.md";
    let mut stream = Stream::open(&gw.url(), &[], &listen(9, uri)).await;
    let ack = stream.next().await.expect("acknowledgment");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    // 2026-07-28 basic/patterns/subscriptions, "Graceful Closure".
    let end = stream.next().await.expect("the closing response");
    assert_eq!(end["id"], 9, "{end}");
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    assert_eq!(
        end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 9,
        "{end}"
    );
    assert!(stream.next().await.is_none(), "the stream ends after it");
    let deadline = std::time::Instant::now() + WAIT;
    while py.count("POST /mcp resources/unsubscribe").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "never unsubscribed upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request with `token`; the status, `WWW-Authenticate` and body.
async fn denied(url: &str, token: Option<&str>, body: &Value) -> (u16, String, String) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("authorization", b)])
        .unwrap_or_default();
    let resp = send(url, &headers, body).await;
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        challenge,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn upstream_oauth_challenges_reach_the_host_as_they_are() {
    let py = PyServer::spawn("streamable-http-auth");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    // No credentials: the legacy session cannot be opened; the host gets the
    // upstream's 401, its challenge and body, as in the forward direction.
    let (status, challenge, body) =
        denied(&gw.url(), None, &call(1, "session_id", json!({}))).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        challenge,
        format!(
            "Bearer error=\"invalid_token\", resource_metadata=\"http://127.0.0.1:{}/.well-known/oauth-protected-resource\"",
            py.port
        )
    );
    assert_eq!(body, r#"{"error": "invalid_token"}"#);
    let (status, _, _) = denied(&gw.url(), Some("wrong"), &call(2, "add", json!({}))).await;
    assert_eq!(status, 401);
    // A token the upstream takes, on a call it needs more scope for: its 403.
    let (status, challenge, _body) = denied(
        &gw.url(),
        Some("good"),
        &call(3, "add", json!({ "a": 1, "b": 2 })),
    )
    .await;
    assert_eq!(status, 403, "{challenge} {_body}");
    assert_eq!(
        challenge,
        "Bearer error=\"insufficient_scope\", scope=\"notes:admin\""
    );
    // The session of that token goes on serving what the token may do.
    let good = [("authorization", "Bearer good")];
    let (status, answer) = post(&gw.url(), &good, &call(4, "session_id", json!({}))).await;
    assert_eq!(status, 200);
    assert!(!text(&answer[0]).is_empty());
    // The stepped-up token is another partition, and may.
    let admin = [("authorization", "Bearer admin")];
    let (_, added) = post(
        &gw.url(),
        &admin,
        &call(5, "add", json!({ "a": 1, "b": 2 })),
    )
    .await;
    assert_eq!(text(&added[0]), "3");
}

#[tokio::test]
async fn readyz_metrics_and_report_name_the_legacy_upstream_and_count_the_bridge() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp"), "--admin", "127.0.0.1:0"]);
    let admin = gw.listening("admin");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (status, text) = get(&format!("http://{admin}/readyz")).await;
        if status == 200 {
            assert!(
                text.contains("route /mcp (legacy upstream (streamable-http)): ready"),
                "{text}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status} {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, added) = post(&gw.url(), &[], &call(1, "add", json!({ "a": 1, "b": 2 }))).await;
    assert_eq!(text(&added[0]), "3");
    let (_, asked) = post(&gw.url(), &[], &call(2, "ask", json!({ "question": "?" }))).await;
    assert_eq!(asked[0]["result"]["resultType"], "input_required");
    let mut forged = call(3, "ask", json!({ "question": "?" }));
    forged["params"]["requestState"] = json!("forged");
    forged["params"]["inputResponses"] = json!({});
    let (status, _) = post(&gw.url(), &[], &forged).await;
    assert_eq!(status, 400);
    let (_, metrics) = get(&format!("http://{admin}/metrics")).await;
    for line in [
        r#"dualera_upstream_era{route="/mcp",era="legacy"} 1"#,
        r#"dualera_bridge_requests_total{route="/mcp",mcp_method_name="tools/call",outcome="complete"} 1"#,
        r#"dualera_bridge_requests_total{route="/mcp",mcp_method_name="tools/call",outcome="input_required"} 1"#,
        r#"dualera_bridge_requests_total{route="/mcp",mcp_method_name="tools/call",outcome="refused"} 1"#,
        "dualera_bridge_partitions 1",
        "dualera_bridge_waiting 0",
    ] {
        assert!(metrics.contains(line), "{line} missing in\n{metrics}");
    }
    let (_, report) = get(&format!("http://{admin}/report")).await;
    let report: Value = serde_json::from_str(&report).expect("report JSON");
    assert_eq!(
        report["upstreams"]["/mcp"], "legacy upstream (streamable-http)",
        "{report}"
    );
    // The modern host of the bridge has its row, named by its `_meta.clientInfo`.
    let hosts = report["hosts"].as_array().expect("hosts");
    let row = hosts
        .iter()
        .find(|h| h["era"] == "modern" && h["route"] == "/mcp")
        .unwrap_or_else(|| panic!("no modern row in {report}"));
    assert_eq!(row["name"], "modern-host", "{row}");
    assert_eq!(row["requests"]["tools/call"], 3, "{row}");
}

#[tokio::test]
async fn translated_lists_are_private_with_no_ttl_unless_configured() {
    let py = PyServer::spawn("streamable-http");
    let list = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list",
        "params": { "_meta": meta() } });
    let gw = Gateway::spawn(&["--upstream", &py.url("/mcp")]);
    let (_, listed) = post(&gw.url(), &[], &list).await;
    // 2026-07-28 server/utilities/caching: cacheable results carry both fields.
    assert_eq!(listed[0]["result"]["ttlMs"], 0, "{listed:?}");
    assert_eq!(listed[0]["result"]["cacheScope"], "private", "{listed:?}");
    drop(gw);
    let guard = tempfile::Builder::new()
        .prefix("dualera-reverse-era-cache-")
        .tempdir()
        .expect("temp dir");
    let dir = guard.path();
    let config = dir.join("cache.toml");
    std::fs::write(
        &config,
        "[gateway]\nbridge_list_ttl_ms = 60000\nbridge_cache_public = true\n",
    )
    .expect("config");
    let gw = Gateway::spawn(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "--upstream",
        &py.url("/mcp"),
    ]);
    let (_, listed) = post(&gw.url(), &[], &list).await;
    assert_eq!(listed[0]["result"]["ttlMs"], 60000, "{listed:?}");
    assert_eq!(listed[0]["result"]["cacheScope"], "public", "{listed:?}");
    let discover = json!({ "jsonrpc": "2.0", "id": 2, "method": "server/discover",
        "params": { "_meta": meta() } });
    let (_, found) = post(&gw.url(), &[], &discover).await;
    assert_eq!(found[0]["result"]["ttlMs"], 60000, "{found:?}");
}
