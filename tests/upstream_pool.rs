//! The gateway in front of several instances of one upstream (`--upstream` given twice),
//! over real sockets: requests spread round-robin; an MRTR round's retry goes to the
//! other instance; an instance that refuses connections is skipped (the host sees
//! nothing), tried again after its backoff and back in the rotation once it answers; a
//! pass-through request whose instance refused is sent, body and all, to the next;
//! `subscriptions/listen` streams (the session's and the cache's) are re-opened on the
//! surviving instance when theirs goes away.
//!
//! The instances are scripted modern servers (`common::gateway::Upstream`) so that
//! each request's instance is known; the same over real `dualera serve` instances on
//! PostgreSQL, with the official SDK hosts, is the interop suite's `*/instances` columns.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A scripted instance named `name`: discover with `capabilities`; `tools/call` of
/// `confirm` asks for a form (state `s-<name>-<n>`) and completes on the retry, naming
/// the instance that completed; `tools/list` lists one tool; listens are held open.
async fn instance(name: &'static str, capabilities: Value) -> Upstream {
    let n = Arc::new(AtomicUsize::new(0));
    Upstream::scripted(move |s: &Seen| match s.method.as_str() {
        "server/discover" => Script::Json(discover_result(&s.id, capabilities.clone())),
        // Cacheable (with the cache on, the first stored entry starts its listen).
        "tools/list" => Script::Json(complete(
            &s.id,
            json!({"tools": [{"name": "confirm", "inputSchema": {"type": "object"}}],
                   "ttlMs": 60_000, "cacheScope": "public"}),
        )),
        "subscriptions/listen" => Script::Stream(vec![json!({
            "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID: s.id}, "notifications": s.params()["notifications"]}
        })]),
        "tools/call" if s.params().get("requestState").is_none() => {
            let k = n.fetch_add(1, Ordering::SeqCst);
            Script::Json(input_required(
                &s.id,
                Some(json!({"ok": {"method": "elicitation/create", "params": {
                    "mode": "form", "message": "Sure?",
                    "requestedSchema": {"type": "object", "properties": {"sure": {"type": "boolean"}}}
                }}})),
                Some(&format!("s-{name}-{k}")),
            ))
        }
        "tools/call" => Script::Json(complete(
            &s.id,
            json!({"content": [{"type": "text", "text": format!("done by {name}")}]}),
        )),
        _ => Script::Json(complete(&s.id, json!({}))),
    })
    .await
}

/// `dualera gateway --upstream a --upstream b` with the workspace's config (and an
/// admin listener, for the metrics).
fn gateway(ws: &Workspace, upstreams: &[&str]) -> (Proc, String) {
    let config = ws.config.display().to_string();
    let mut args = vec![
        "gateway",
        "--config",
        &config,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    for u in upstreams {
        args.extend(["--upstream", u]);
    }
    let gw = Proc::spawn(&args, "gateway listening on");
    let admin = gw.admin_url();
    (gw, admin)
}

/// One metric sample's value from the admin listener (0 when absent).
async fn metric(admin: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let client = http_client();
    let r = raw(
        &client,
        http::Method::GET,
        &format!("{admin}/metrics"),
        &[],
        "",
    )
    .await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `dualera_upstream_instance_up` of one instance.
async fn instance_up(admin: &str, instance: &str) -> f64 {
    metric(
        admin,
        "dualera_upstream_instance_up",
        &[("instance", instance)],
    )
    .await
}

fn instance_of(text: &str) -> &str {
    text.rsplit(' ').next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spread_round_robin_over_the_instances() {
    let ws = Workspace::new(&[]);
    let a = instance("a", json!({"tools": {}})).await;
    let b = instance("b", json!({"tools": {}})).await;
    let (gw, _admin) = gateway(&ws, &[&a.url, &b.url]);
    // Modern pass-through (the cache is off in these workspaces).
    let client = http_client();
    for i in 0..10 {
        let body = modern_request(json!(i), "tools/list", json!({}), json!({}));
        let r = modern_post(&client, &gw.url, &body).await;
        assert_eq!(r.status, 200, "{:?}", r.json());
    }
    assert_eq!(a.seen_method("tools/list").len(), 5);
    assert_eq!(b.seen_method("tools/list").len(), 5);
    // A legacy session: its upstream calls take turns too.
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({})).await;
    for _ in 0..10 {
        host.call("tools/list", json!({})).await;
    }
    let (na, nb) = (
        a.seen_method("tools/list").len(),
        b.seen_method("tools/list").len(),
    );
    assert_eq!(na + nb, 20);
    assert!((9..=11).contains(&na), "a got {na} of 20, b {nb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_and_its_retry_land_on_different_instances() {
    let ws = Workspace::new(&[]);
    let a = instance("a", json!({"tools": {}})).await;
    let b = instance("b", json!({"tools": {}})).await;
    let (gw, _admin) = gateway(&ws, &[&a.url, &b.url]);
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({"elicitation": {}})).await;
    let mut finished_by = Vec::new();
    for _ in 0..6 {
        // Unrelated traffic in between moves the shared cursor: it must not matter.
        host.call("tools/list", json!({})).await;
        let ex = host
            .exchange_with(
                "tools/call",
                json!({"name": "confirm", "arguments": {}}),
                |live| json!({"jsonrpc": "2.0", "id": live["id"], "result": {"action": "accept", "content": {"sure": true}}}),
            )
            .await;
        let text = ex.response["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", ex.response))
            .to_owned();
        finished_by.push(instance_of(&text).to_owned());
    }
    // Every retry carried the state the *other* instance issued.
    for (up, me) in [(&a, "a"), (&b, "b")] {
        for retry in up.seen_method("tools/call") {
            let Some(state) = retry.params()["requestState"].as_str() else {
                continue;
            };
            assert!(
                !state.starts_with(&format!("s-{me}-")),
                "instance {me} got the retry of its own round ({state})"
            );
        }
    }
    assert!(
        finished_by.iter().any(|i| i == "a") && finished_by.iter().any(|i| i == "b"),
        "{finished_by:?}"
    );
    let rounds = a.seen_method("tools/call").len() + b.seen_method("tools/call").len();
    assert_eq!(rounds, 12, "six first attempts and six retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_refuses_connections_is_skipped_and_tried_again_later() {
    let ws = Workspace::new(&[]);
    let a = instance("a", json!({"tools": {}})).await;
    let mut b = instance("b", json!({"tools": {}})).await;
    let (gw, admin) = gateway(&ws, &[&a.url, &b.url]);
    let b_label = b.url.clone();
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({"elicitation": {}})).await;
    host.call("tools/list", json!({})).await;

    b.stop();
    let before = a.seen_method("tools/list").len();
    for _ in 0..10 {
        let r = host.call("tools/list", json!({})).await;
        assert!(r.get("result").is_some(), "the host saw the failure: {r}");
    }
    assert_eq!(a.seen_method("tools/list").len(), before + 10);
    // Refused once, then skipped: at most one request per backoff went to b.
    let failovers = metric(&admin, "dualera_upstream_failovers_total", &[]).await;
    assert!((1.0..=3.0).contains(&failovers), "{failovers} failovers");
    assert_eq!(instance_up(&admin, &b_label).await, 0.0);
    assert_eq!(instance_up(&admin, &a.url).await, 1.0);

    // Back on the same address: after its backoff one request tries it, and it is in
    // the rotation again.
    b.restart().await;
    let b_before = b.seen_method("tools/list").len();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.seen_method("tools/list").len() == b_before {
        assert!(
            std::time::Instant::now() < deadline,
            "b was never tried again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.call("tools/list", json!({})).await;
    }
    let b_before = b.seen_method("tools/list").len();
    for _ in 0..10 {
        host.call("tools/list", json!({})).await;
    }
    assert!(
        b.seen_method("tools/list").len() >= b_before + 4,
        "b is not in the rotation again"
    );
    assert_eq!(instance_up(&admin, &b_label).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_request_goes_to_the_next_instance_with_its_body() {
    let ws = Workspace::new(&[]);
    let a = instance("a", json!({"tools": {}})).await;
    let b = instance("b", json!({"tools": {}})).await;
    let (gw, _admin) = gateway(&ws, &[&a.url, &b.url]);
    // The first request's turn is a's, which is gone before anything reached it.
    a.stopped().await;
    let client = http_client();
    let args = json!({"name": "confirm", "arguments": {"note": "x".repeat(200_000)}});
    let body = modern_request(json!("big"), "tools/call", args.clone(), json!({}));
    let r = modern_post(&client, &gw.url, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["resultType"], "input_required");
    let seen = b.wait_method("tools/call", 1).await;
    assert_eq!(
        seen[0].params()["arguments"],
        args["arguments"],
        "body intact"
    );
    // And the rest go to b without a word while a is down.
    for i in 0..4 {
        let body = modern_request(json!(i), "tools/list", json!({}), json!({}));
        assert_eq!(modern_post(&client, &gw.url, &body).await.status, 200);
    }
    assert_eq!(b.seen_method("tools/list").len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_are_reopened_on_the_other_instance_when_theirs_goes_away() {
    // With the cache on, the cache keeps a listen of its own beside the session's.
    let ws = Workspace::with_cache(&[], &[]);
    let caps = json!({"tools": {"listChanged": true}});
    let mut a = instance("a", caps.clone()).await;
    let mut b = instance("b", caps).await;
    let (gw, _admin) = gateway(&ws, &[&a.url, &b.url]);
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({})).await;
    host.call("tools/list", json!({})).await;
    let mut get = host.get(None).await.sse();
    let open_on = |up: &Upstream, who: &str| {
        up.seen_method("subscriptions/listen")
            .into_iter()
            .filter(|s| {
                let cache = s.meta()[CLIENT_INFO]["name"] == "dualera-cache";
                (who == "cache") == cache
            })
            .rfind(|s| !up.was_closed(&s.id) && !up.was_finished(&s.id))
    };
    // The session's listen and the cache's, each on one instance.
    let where_session = eventually(WAIT, "the session's listen", || {
        open_on(&a, "session")
            .map(|_| "a")
            .or_else(|| open_on(&b, "session").map(|_| "b"))
    })
    .await;
    eventually(WAIT, "the cache's listen", || {
        open_on(&a, "cache").or_else(|| open_on(&b, "cache"))
    })
    .await;
    // The instance holding the session's listen goes away.
    let (gone, survivor) = if where_session == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    gone.stop();
    let session_listen = eventually(WAIT, "the session's listen on the survivor", || {
        open_on(survivor, "session")
    })
    .await;
    eventually(WAIT, "the cache's listen on the survivor", || {
        open_on(survivor, "cache")
    })
    .await;
    // The re-opened listen carries notifications to the host's GET stream.
    survivor.wait_held(&session_listen.id).await;
    survivor.push(
        &session_listen.id,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
               "params": {"_meta": {SUBSCRIPTION_ID: session_listen.id}}}),
    );
    let n = tokio::time::timeout(WAIT, async {
        loop {
            let m = get.next_message().await.expect("the GET stream ended");
            if m["method"] == "notifications/tools/list_changed" {
                return m;
            }
        }
    })
    .await
    .expect("the notification on the GET stream");
    assert!(n.get("id").is_none());
    drop(gw);
}

/// `dualera serve` with `config`, plain HTTP on a free port.
fn serve(config: &std::path::Path) -> Proc {
    let config = config.display().to_string();
    Proc::spawn(
        &["serve", "--config", &config, "--listen", "127.0.0.1:0"],
        "modern server listening on",
    )
}

/// The notes in the workspace, as an instance lists them.
async fn note_titles(instance: &str, ws: &Workspace) -> Vec<String> {
    let client = http_client();
    let body = modern_request(
        json!(1),
        "tools/call",
        json!({"name": "notes_list", "arguments": {"workspaceUri": ws.notes_uri}}),
        json!({}),
    );
    let r = modern_post(&client, instance, &body).await;
    r.json()["result"]["structuredContent"]["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", r.json()))
        .iter()
        .filter_map(|n| n["title"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_other_state_keys_refuse_each_others_rounds_with_32602() {
    // Two real instances on one store (a SQLite file both open), their [[state.keys]]
    // different: each round's retry goes to the other instance, which cannot verify the
    // state. The host gets -32602 and no note is deleted.
    let ws = Workspace::new(&[]);
    let text = std::fs::read_to_string(&ws.config).expect("config");
    let other = ws.dir.join("other-keys.toml");
    let replaced = text.replace(
        "gateway-acceptance-secret-0123456789abcdef",
        "another-key-set-entirely-0123456789abcdef",
    );
    assert_ne!(
        replaced, text,
        "the workspace config names its state secret"
    );
    std::fs::write(&other, replaced).expect("config");
    let a = serve(&ws.config);
    let b = serve(&other);
    let (gw, _admin) = gateway(&ws, &[&a.url, &b.url]);
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({"elicitation": {}})).await;
    for round in 0..2 {
        let title = format!("keep {round}");
        let created = host
            .call(
                "tools/call",
                json!({"name": "notes_create", "arguments": {"workspaceUri": ws.notes_uri, "title": title, "body": "b"}}),
            )
            .await;
        assert!(created.get("result").is_some(), "{created}");
        let mut asked = 0;
        let ex = host
            .exchange_with(
                "tools/call",
                json!({"name": "notes_delete", "arguments": {"workspaceUri": ws.notes_uri, "title": title}}),
                |live| {
                    asked += 1;
                    let id = live
                        .pointer("/params/requestedSchema/properties/note_id/enum/0")
                        .cloned()
                        .unwrap_or_else(|| panic!("no candidate in {live}"));
                    json!({"jsonrpc": "2.0", "id": live["id"], "result": {"action": "accept",
                           "content": {"note_id": id, "confirm": true}}})
                },
            )
            .await;
        assert_eq!(asked, 1, "one elicitation round: {}", ex.response);
        assert_eq!(
            ex.response.pointer("/error/code"),
            Some(&json!(-32602)),
            "the retry on the instance with other keys: {}",
            ex.response
        );
    }
    // Nothing was deleted: both notes are there, whichever instance is asked.
    for instance in [&a.url, &b.url] {
        let titles = note_titles(instance, &ws).await;
        for round in 0..2 {
            assert!(
                titles.contains(&format!("keep {round}")),
                "{instance}: {titles:?}"
            );
        }
    }
    drop(gw);
}
