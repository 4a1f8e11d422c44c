//! The gateway's response cache over real sockets (2026-07-28
//! `server/utilities/caching.mdx`): the real `dualera gateway` binary in front of a
//! scripted modern upstream that counts what reaches it. Freshness is exercised with
//! short TTLs (the cache core's injected-clock tests are in `crates/gateway/src/cache/tests.rs`).

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The gateway with the cache on (plus `cache` entries) in front of `handler`, which
/// answers everything (`server/discover` included).
async fn rig(
    cache: &[(&str, &str)],
    handler: impl Fn(&Seen) -> Script + Send + Sync + 'static,
) -> (Workspace, Upstream, Proc) {
    let ws = Workspace::with_cache(&[], cache);
    let up = Upstream::scripted(handler).await;
    let gw = Proc::gateway(&up.url, &ws);
    (ws, up, gw)
}

fn discover(id: &Value, caps: Value, ttl: Option<u64>) -> Value {
    let mut d = discover_result(id, caps);
    if let Some(ttl) = ttl {
        d["result"]["ttlMs"] = json!(ttl);
        d["result"]["cacheScope"] = json!("public");
    }
    d
}

fn tools_result(ttl: Option<i64>, scope: &str) -> Value {
    let mut r = json!({
        "tools": [{"name": "t1", "title": "Tool one", "inputSchema": {"type": "object"},
                   "outputSchema": {"type": "object"}}],
        "cacheScope": scope,
    });
    if let Some(t) = ttl {
        r["ttlMs"] = json!(t);
    }
    r
}

/// Requests seen with `method`, without the cache listener's own.
fn count(up: &Upstream, method: &str) -> usize {
    up.seen_method(method)
        .iter()
        .filter(|s| s.meta()[CLIENT_INFO]["name"] != "dualera-cache")
        .count()
}

async fn post(gw: &Proc, id: Value, method: &str, params: Value) -> RawReply {
    post_as(gw, id, method, params, None).await
}

async fn post_as(
    gw: &Proc,
    id: Value,
    method: &str,
    params: Value,
    auth: Option<&str>,
) -> RawReply {
    let body = modern_request(id, method, params, json!({}));
    let mut h = modern_headers(&body);
    if let Some(a) = auth {
        h.push(("authorization".into(), a.into()));
    }
    let refs: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    raw(
        &http_client(),
        http::Method::POST,
        &gw.url,
        &refs,
        serde_json::to_vec(&body).unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_entries_are_served_without_the_upstream_until_they_expire() {
    let (_ws, up, gw) = rig(&[], |s| match s.method.as_str() {
        "server/discover" => Script::Json(discover(&s.id, json!({"tools": {}}), None)),
        // Key-order and escapes of the upstream's own: a hit must repeat them exactly.
        "tools/list" => Script::Json(complete(&s.id, tools_result(Some(1500), "public"))),
        _ => Script::Json(complete(&s.id, json!({}))),
    })
    .await;
    let first = post(&gw, json!(1), "tools/list", json!({})).await;
    assert_eq!(first.status, StatusCode::OK);
    let second = post(&gw, json!("two"), "tools/list", json!({})).await;
    assert_eq!(
        count(&up, "tools/list"),
        1,
        "the second was served from the cache"
    );
    // Byte-identical apart from the id.
    let expected =
        String::from_utf8(first.body.to_vec())
            .unwrap()
            .replacen("\"id\":1", "\"id\":\"two\"", 1);
    assert_eq!(String::from_utf8(second.body.to_vec()).unwrap(), expected);
    assert_eq!(second.header("content-type"), Some("application/json"));
    // `_meta` is not part of the key; params are.
    let body = modern_request(json!(3), "tools/list", json!({}), json!({"sampling": {}}));
    let r = modern_post(&http_client(), &gw.url, &body).await;
    assert_eq!(r.json()["result"], first.json()["result"]);
    assert_eq!(count(&up, "tools/list"), 1);
    post(&gw, json!(4), "tools/list", json!({"cursor": "page-2"})).await;
    assert_eq!(
        count(&up, "tools/list"),
        2,
        "another cursor is another request"
    );
    // Expired: asked again.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    post(&gw, json!(5), "tools/list", json!({})).await;
    assert_eq!(count(&up, "tools/list"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_or_missing_ttl_interim_results_retries_errors_and_streams_are_never_cached() {
    let (_ws, up, gw) = rig(&[], |s| {
        let uri = s.params()["uri"].as_str().unwrap_or_default().to_owned();
        match (s.method.as_str(), uri.as_str()) {
            ("server/discover", _) => Script::Json(discover(&s.id, json!({"tools": {}, "resources": {}}), None)),
            ("tools/list", _) => Script::Json(complete(&s.id, tools_result(Some(0), "public"))),
            ("prompts/list", _) => Script::Json(complete(&s.id, json!({"prompts": [], "cacheScope": "public"}))),
            ("resources/read", "file:///ask") if s.params().get("requestState").is_none() => Script::Json(
                input_required(&s.id, Some(json!({"q": {"method": "roots/list", "params": {}}})), Some("st-1")),
            ),
            ("resources/read", "file:///ask") => Script::Json(complete(&s.id, json!({
                "contents": [{"uri": "file:///ask", "text": "answered"}], "ttlMs": 60000, "cacheScope": "public"}))),
            ("resources/read", "file:///missing") => Script::Status(StatusCode::BAD_REQUEST, json!({
                "jsonrpc": "2.0", "id": s.id, "error": {"code": -32602, "message": "Resource not found"}})),
            ("resources/templates/list", _) => Script::Stream(vec![
                json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}),
                complete(&s.id, json!({"resourceTemplates": [], "ttlMs": 60000, "cacheScope": "public"})),
            ]),
            _ => Script::Json(complete(&s.id, json!({}))),
        }
    })
    .await;
    for i in 0..2 {
        post(&gw, json!(i), "tools/list", json!({})).await;
        post(&gw, json!(i), "prompts/list", json!({})).await;
        let r = post(
            &gw,
            json!(i),
            "resources/read",
            json!({"uri": "file:///ask"}),
        )
        .await;
        assert_eq!(r.json()["result"]["resultType"], "input_required");
        let retry = json!({"uri": "file:///ask", "requestState": "st-1", "inputResponses": {"q": {"roots": []}}});
        let r = post(&gw, json!(i), "resources/read", retry).await;
        assert_eq!(r.json()["result"]["contents"][0]["text"], "answered");
        let r = post(
            &gw,
            json!(i),
            "resources/read",
            json!({"uri": "file:///missing"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let r = post(&gw, json!(i), "resources/templates/list", json!({})).await;
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
    }
    assert_eq!(count(&up, "tools/list"), 2, "ttlMs 0");
    assert_eq!(count(&up, "prompts/list"), 2, "no ttlMs");
    assert_eq!(
        count(&up, "resources/read"),
        6,
        "input_required, retries and errors"
    );
    assert_eq!(
        count(&up, "resources/templates/list"),
        2,
        "a stream that carried a notification"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_results_are_never_served_to_another_token() {
    let (_ws, up, gw) = rig(&[], |s| match s.method.as_str() {
        "server/discover" => Script::Json(discover(&s.id, json!({"resources": {}}), None)),
        "resources/read" => {
            let who = s.headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("nobody").to_owned();
            Script::Json(complete(&s.id, json!({
                "contents": [{"uri": "file:///me", "text": format!("for {who}")}], "ttlMs": 60000, "cacheScope": "private"})))
        }
        "tools/list" => Script::Json(complete(&s.id, tools_result(Some(60000), "public"))),
        _ => Script::Json(complete(&s.id, json!({}))),
    })
    .await;
    let read = |auth: Option<&'static str>| {
        let gw = &gw;
        async move {
            post_as(
                gw,
                json!(1),
                "resources/read",
                json!({"uri": "file:///me"}),
                auth,
            )
            .await
            .json()["result"]["contents"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    assert_eq!(read(Some("Bearer alice")).await, "for Bearer alice");
    assert_eq!(read(Some("Bearer alice")).await, "for Bearer alice");
    assert_eq!(
        count(&up, "resources/read"),
        1,
        "alice's second read was a hit"
    );
    assert_eq!(read(Some("Bearer bob")).await, "for Bearer bob");
    assert_eq!(read(None).await, "for nobody");
    assert_eq!(read(Some("Bearer bob")).await, "for Bearer bob");
    assert_eq!(count(&up, "resources/read"), 3);
    // A public result fetched with a token is shared with other tokens, not with
    // callers that present none (they get the upstream's own answer).
    post_as(&gw, json!(1), "tools/list", json!({}), Some("Bearer alice")).await;
    post_as(&gw, json!(2), "tools/list", json!({}), Some("Bearer bob")).await;
    assert_eq!(count(&up, "tools/list"), 1);
    post_as(&gw, json!(3), "tools/list", json!({}), None).await;
    assert_eq!(count(&up, "tools/list"), 2);
}

/// A scripted upstream that advertises `listChanged`/`subscribe` and holds the cache's
/// `subscriptions/listen` open after acknowledging it.
fn listening_upstream(s: &Seen) -> Script {
    match s.method.as_str() {
        "server/discover" => Script::Json(discover(
            &s.id,
            json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}}),
            None,
        )),
        "subscriptions/listen" => Script::Stream(vec![json!({
            "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID: s.id}, "notifications": s.params()["notifications"]},
        })]),
        "tools/list" => Script::Json(complete(&s.id, tools_result(Some(600_000), "public"))),
        "resources/read" => Script::Json(complete(
            &s.id,
            json!({
            "contents": [{"uri": s.params()["uri"], "text": "v"}], "ttlMs": 600000, "cacheScope": "public"}),
        )),
        "tools/call" => Script::Status(
            StatusCode::BAD_REQUEST,
            json!({
            "jsonrpc": "2.0", "id": s.id, "error": {"code": -32602, "message": "Invalid params"}}),
        ),
        _ => Script::Json(complete(&s.id, json!({}))),
    }
}

/// Fetches `method` until the count of upstream requests reaches `n` (each fetch that
/// finds a fresh entry leaves it unchanged); panics after 10 s.
async fn until_upstream(gw: &Proc, up: &Upstream, method: &str, params: Value, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count(up, method) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{method} was not fetched again"
        );
        post(gw, json!("poll"), method, params.clone()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_notifications_and_failed_tool_calls_invalidate() {
    let (_ws, up, gw) = rig(&[], listening_upstream).await;
    post(&gw, json!(1), "tools/list", json!({})).await;
    // The first entry starts the cache's listen; its acknowledgment drops what was
    // cached before it (notifications may have been missed until then).
    let listen = up.wait_method("subscriptions/listen", 1).await.remove(0);
    assert_eq!(listen.params()["notifications"]["toolsListChanged"], true);
    assert!(
        listen.headers.get("authorization").is_none(),
        "the gateway keeps no caller's token"
    );
    until_upstream(&gw, &up, "tools/list", json!({}), 2).await;
    for i in 0..3 {
        post(&gw, json!(i), "tools/list", json!({})).await;
    }
    assert_eq!(
        count(&up, "tools/list"),
        2,
        "fresh again after the listen was acknowledged"
    );
    // list_changed drops it at once (TTL is 10 minutes).
    up.wait_held(&listen.id).await;
    up.push(
        &listen.id,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
        "params": {"_meta": {SUBSCRIPTION_ID: listen.id}}}),
    );
    until_upstream(&gw, &up, "tools/list", json!({}), 3).await;

    // A cached resource URI is subscribed to by a new listen; resources/updated for it
    // drops that entry only.
    post(
        &gw,
        json!(1),
        "resources/read",
        json!({"uri": "file:///r1"}),
    )
    .await;
    let listens = up.wait_method("subscriptions/listen", 2).await;
    let second = listens[1].clone();
    assert_eq!(
        second.params()["notifications"]["resourceSubscriptions"],
        json!(["file:///r1"])
    );
    up.wait_closed(&listen.id).await;
    until_upstream(&gw, &up, "resources/read", json!({"uri": "file:///r1"}), 2).await;
    let before = count(&up, "tools/list");
    post(
        &gw,
        json!(2),
        "resources/read",
        json!({"uri": "file:///r1"}),
    )
    .await;
    assert_eq!(count(&up, "resources/read"), 2);
    up.wait_held(&second.id).await;
    up.push(
        &second.id,
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
        "params": {"_meta": {SUBSCRIPTION_ID: second.id}, "uri": "file:///r1"}}),
    );
    until_upstream(&gw, &up, "resources/read", json!({"uri": "file:///r1"}), 3).await;
    post(&gw, json!(3), "tools/list", json!({})).await;
    assert_eq!(count(&up, "tools/list"), before, "the tools list survived");

    // -32602 on a tools/call for a tool the cached list shows drops the list.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let call = post(
        &gw,
        json!(9),
        "tools/call",
        json!({"name": "t1", "arguments": {}}),
    )
    .await;
    assert_eq!(call.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        call.json()["error"]["code"],
        -32602,
        "the caller gets the error untouched"
    );
    post(&gw, json!(10), "tools/list", json!({})).await;
    assert_eq!(count(&up, "tools/list"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_share_one_upstream_request() {
    let (_ws, up, gw) = rig(&[], |s| match s.method.as_str() {
        "server/discover" => Script::Json(discover(&s.id, json!({"tools": {}}), None)),
        "tools/list" => Script::Delayed(
            Duration::from_millis(600),
            Box::new(Script::Json(complete(
                &s.id,
                tools_result(Some(60000), "public"),
            ))),
        ),
        _ => Script::Json(complete(&s.id, json!({}))),
    })
    .await;
    let gw = Arc::new(gw);
    let ok = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let gw = gw.clone();
            let ok = ok.clone();
            tokio::spawn(async move {
                let r = post(&gw, json!(i), "tools/list", json!({})).await;
                if r.json()["id"] == i && r.json()["result"]["tools"][0]["name"] == "t1" {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        ok.load(Ordering::SeqCst),
        8,
        "each caller got the result with its own id"
    );
    assert_eq!(count(&up, "tools/list"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_entries_are_served_when_the_refetch_fails() {
    let (_ws, up, gw) = rig(&[("stale_if_error_ms", "60000")], |s| {
        match s.method.as_str() {
            "server/discover" => Script::Json(discover(&s.id, json!({"tools": {}}), None)),
            "tools/list" => Script::Json(complete(&s.id, tools_result(Some(300), "public"))),
            _ => Script::Json(complete(&s.id, json!({}))),
        }
    })
    .await;
    let first = post(&gw, json!(1), "tools/list", json!({})).await.json();
    tokio::time::sleep(Duration::from_millis(400)).await;
    up.set_down(true);
    let stale = post(&gw, json!(2), "tools/list", json!({})).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.json()["result"], first["result"]);
    // Not cached: a fresh prompts/list has nothing stale to fall back on.
    let r = post(&gw, json!(3), "prompts/list", json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
}

/// Legacy sessions use the same entries: a result a modern client got cached reaches
/// each legacy revision downgraded exactly as a fresh one does (compared with a
/// gateway whose cache is off), and a cached discover opens anonymous sessions without
/// the upstream — but never one for a caller with credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_hosts_get_the_downgraded_form_of_cached_results() {
    let (ws, up, gw) = rig(&[], |s| {
        let auth = s.headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        match s.method.as_str() {
            "server/discover" if auth.as_deref() == Some("Bearer revoked") => Script::Status(
                StatusCode::BAD_REQUEST,
                json!({"jsonrpc": "2.0", "id": s.id, "error": {"code": -32600, "message": "token revoked"}}),
            ),
            "server/discover" => Script::Json(discover(&s.id, json!({"tools": {"listChanged": true}}), Some(600_000))),
            "subscriptions/listen" => Script::Stream(vec![json!({
                "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                "params": {"_meta": {SUBSCRIPTION_ID: s.id}, "notifications": s.params()["notifications"]},
            })]),
            "tools/list" => Script::Json(complete(&s.id, tools_result(Some(600_000), "public"))),
            _ => Script::Json(complete(&s.id, json!({}))),
        }
    })
    .await;
    let plain = Proc::gateway(&up.url, &Workspace::new(&[]));
    // Fill the cache from pass-through (and let the listen settle first).
    post(&gw, json!(0), "server/discover", json!({})).await;
    up.wait_method("subscriptions/listen", 1).await;
    until_upstream(&gw, &up, "server/discover", json!({}), 2).await;
    until_upstream(&gw, &up, "tools/list", json!({}), 1).await;
    let (discovers, lists) = (count(&up, "server/discover"), count(&up, "tools/list"));
    for rev in REVISIONS {
        let mut cached = Legacy::new(&gw.url);
        cached.open(rev, full_caps(rev)).await;
        let from_cache = cached.call("tools/list", json!({})).await;
        let mut fresh = Legacy::new(&plain.url);
        fresh.open(rev, full_caps(rev)).await;
        let from_upstream = fresh.call("tools/list", json!({})).await;
        assert_eq!(from_cache["result"], from_upstream["result"], "{rev}");
        assert!(
            from_cache["result"].get("resultType").is_none(),
            "{rev}: {from_cache}"
        );
    }
    let plain_calls = REVISIONS.len();
    assert_eq!(
        count(&up, "tools/list"),
        lists + plain_calls,
        "the cached gateway asked nothing"
    );
    assert_eq!(
        count(&up, "server/discover"),
        discovers + plain_calls,
        "anonymous sessions opened from the cached discover"
    );
    // With credentials, initialize asks the upstream with them, every time.
    let mut ok = Legacy::new(&gw.url);
    ok.auth = Some("Bearer fine".into());
    ok.open("2025-11-25", json!({})).await;
    let asked = up.seen_method("server/discover");
    assert_eq!(
        asked.last().unwrap().headers.get("authorization").unwrap(),
        "Bearer fine"
    );
    let mut revoked = Legacy::new(&gw.url);
    revoked.auth = Some("Bearer revoked".into());
    let (_, response) = revoked.initialize("2025-11-25", json!({})).await;
    assert!(response.get("error").is_some(), "{response}");
    assert!(
        revoked.session.is_none(),
        "no session for a caller the upstream refused"
    );
    drop(ws);
}
