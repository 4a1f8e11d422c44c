//! Legacy sessions shared through a real Redis by several `dualera gateway` replicas
//! behind a real HAProxy (round-robin, no stickiness), in front of one `dualera serve`:
//! any replica serves any request of a session, a stream survives the death of the
//! replica holding it, a retry survives the death of the replica running it, and Redis
//! trouble gives a clear error and heals by itself. Behind an HAProxy that hashes
//! `Mcp-Session-Id`, a session's requests stay on one replica while it lives.

mod common;
use common::gateway as gateway_support;

use gateway_support::replicas::{field, Balance, Cluster};
use gateway_support::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const REV: &str = "2025-11-25";

fn caps() -> Value {
    json!({"elicitation": {}})
}

async fn seed_tps(c: &Cluster, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(seed_note(&c.server.url, &c.ws, "TPS report", &format!("draft {i}")).await);
    }
    ids
}

fn delete_args(c: &Cluster) -> Value {
    json!({"name": "notes_delete", "arguments": {"workspaceUri": c.ws.notes_uri, "title": "TPS report"}})
}

fn accept(live: &Value) -> Value {
    let pick = live["params"]["requestedSchema"]["properties"]["note_id"]["enum"][0].clone();
    json!({"jsonrpc": "2.0", "id": live["id"], "result": {"action": "accept",
        "content": {"note_id": pick, "confirm": true}}})
}

/// Reads the stream until the response to the delete `call`, which must say it deleted.
async fn until_deleted(stream: &mut SseReader, call: &Value) -> Value {
    let result = until_response(stream, call).await;
    assert!(
        result["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Deleted"),
        "{result}"
    );
    result
}

/// A raw legacy host on `url`, its session initialized.
async fn initialized(url: &str) -> Legacy {
    let mut host = Legacy::new(url);
    host.initialize(REV, caps()).await;
    host
}

/// The session id (logs name it by `dualera::digest::log_tag`).
fn sid(host: &Legacy) -> String {
    host.session.clone().expect("a session")
}

/// Reads the stream until `elicitation/create`; returns it and its event id.
async fn until_elicitation(stream: &mut SseReader) -> (Value, String) {
    loop {
        let (id, msg) = stream
            .next_message_item()
            .await
            .expect("the stream ended before elicitation/create");
        if msg["method"] == "elicitation/create" {
            return (msg, id.expect("an event id"));
        }
    }
}

/// `tools/call notes_delete` from `host` (on its current URL): the call's id, its
/// stream, and the `elicitation/create` the stream carried.
async fn delete_until_elicitation(c: &Cluster, host: &mut Legacy) -> (Value, SseReader, Value) {
    let call = host.mint();
    let reply = host
        .request_with_id(call.clone(), "tools/call", delete_args(c))
        .await;
    assert_eq!(reply.status, 200);
    let mut stream = reply.sse();
    let (live, _) = until_elicitation(&mut stream).await;
    (call, stream, live)
}

/// `GET` with `Last-Event-ID` through the balancer: the stream, resumed there.
async fn resume_through_balancer(c: &Cluster, host: &mut Legacy, event: &str) -> SseReader {
    host.url = c.lb.url();
    let resumed = host
        .send(
            http::Method::GET,
            None,
            &[("last-event-id", event), ("accept", "text/event-stream")],
        )
        .await;
    assert_eq!(resumed.status, 200, "resumption through the balancer");
    resumed.sse()
}

/// Reads the stream until the result of `call`: the note deleted, exactly once.
async fn until_deleted_once(c: &Cluster, stream: &mut SseReader, call: &Value) {
    let result = until_response(stream, call).await;
    assert!(
        result["result"]["structuredContent"]["deleted"].is_string(),
        "{result}"
    );
    assert_eq!(
        count_notes(&c.server.url, &c.ws, "TPS report").await,
        1,
        "deleted exactly once"
    );
}

/// Reads the stream until the response to `id`.
async fn until_response(stream: &mut SseReader, id: &Value) -> Value {
    loop {
        let msg = stream
            .next_message()
            .await
            .expect("the stream ended before the response");
        if &msg["id"] == id && msg.get("method").is_none() {
            return msg;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_any_request_of_a_session() {
    let c = Cluster::start(3, &[]).await;
    seed_tps(&c, 3).await;
    let (a, b, cc) = (c.url(0), c.url(1), c.url(2));
    let mut host = initialized(&a).await;
    let session = sid(&host);

    // tools/call on B: its SSE stream carries the live request.
    host.url = b.clone();
    let call = host.mint();
    let reply = host
        .request_with_id(call.clone(), "tools/call", delete_args(&c))
        .await;
    assert_eq!(reply.status, 200);
    let mut stream = reply.sse();
    let (live, event) = until_elicitation(&mut stream).await;
    assert!(event.contains('.'), "event ids are <stream>.<seq>: {event}");

    // The answer on A, the result on B's stream; A counts the round trips its step
    // (and the retry's) made.
    let trips = round_trips(&c, 0).await;
    assert!(trips > 0.0, "A has sent Redis round trips: {trips}");
    host.url = a.clone();
    let answered = host.post(&accept(&live)).await;
    assert_eq!(answered.status, 202);
    let moved = round_trips(&c, 0).await;
    assert!(moved > trips, "A's round trips moved: {trips} -> {moved}");
    let result = until_deleted(&mut stream, &call).await;
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 2);
    assert!(
        stream.drain().await.is_empty(),
        "the result ended the stream"
    );

    // The finished stream resumes on C, which never held it: the record keeps a
    // finished stream as its number, its entries stay in Redis.
    host.url = cc.clone();
    let mut replay = host
        .send(
            http::Method::GET,
            None,
            &[
                ("last-event-id", event.as_str()),
                ("accept", "text/event-stream"),
            ],
        )
        .await
        .sse();
    let replayed = replay.drain().await;
    assert_eq!(replayed.len(), 1, "the result only: {replayed:?}");
    assert_eq!(replayed[0], result, "replayed as it was sent");

    // A second call on C, cancelled from A: its stream ends, nothing is deleted, and
    // the upstream attempt is abandoned.
    host.url = cc.clone();
    let second = host.mint();
    let reply = host
        .request_with_id(second.clone(), "tools/call", delete_args(&c))
        .await;
    let mut stream2 = reply.sse();
    let (_live2, _) = until_elicitation(&mut stream2).await;
    host.url = a.clone();
    let st = host
        .notify(
            "notifications/cancelled",
            json!({"requestId": second, "reason": "changed my mind"}),
        )
        .await;
    assert_eq!(st, 202);
    let rest = stream2.drain().await;
    assert!(
        rest.iter().all(|m| m.get("result").is_none()),
        "a cancelled request gets no response: {rest:?}"
    );
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 2);

    // Each replica served requests of this one session.
    let served = c.served_by(&session, "legacy");
    assert_eq!(served, vec![0, 1, 2], "replicas that logged the session");

    // DELETE on A, then a request on B: 404. The finished streams' entries go too.
    let entries = format!("dualera:x:{{{session}}}:*");
    assert_eq!(keys_matching(&c, &entries), 2, "two streams' entries");
    host.url = a.clone();
    let del = host.send(http::Method::DELETE, None, &[]).await;
    assert_eq!(del.status, 200);
    assert_eq!(keys_matching(&c, &entries), 0, "no stream left");
    host.url = b.clone();
    let gone = host
        .post(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}))
        .await;
    assert_eq!(
        gone.status, 404,
        "a deleted session is gone on every replica"
    );
    host.url = cc;
    let gone = host.send(http::Method::GET, None, &[]).await;
    assert_eq!(gone.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumes_through_the_balancer_after_its_replica_dies() {
    let mut c = Cluster::start(3, &[]).await;
    seed_tps(&c, 2).await;
    let mut host = initialized(&c.lb.url()).await;
    // The call lands on replica 1, whose connection then dies with it.
    host.url = c.url(1);
    let call = host.mint();
    let mut stream = host
        .request_with_id(call.clone(), "tools/call", delete_args(&c))
        .await
        .sse();
    let (live, event) = until_elicitation(&mut stream).await;
    c.kill9(1);
    drop(stream);

    // Resume through the balancer with the last event id, answer, get the result.
    let mut resumed = resume_through_balancer(&c, &mut host, &event).await;
    let answered = host.post(&accept(&live)).await;
    assert_eq!(answered.status, 202);
    until_deleted_once(&c, &mut resumed, &call).await;
    // The live request was not replayed: the stream resumed after it.
    assert_eq!(
        c.hop
            .seen_method("tools/call")
            .iter()
            .filter(|s| s.params().get("inputResponses").is_some())
            .count(),
        1
    );
    // A stream the session never told of, on any replica: nothing to resume.
    for url in [c.url(0), c.url(2)] {
        host.url = url;
        host.send(
            http::Method::GET,
            None,
            &[("last-event-id", "999.0"), ("accept", "text/event-stream")],
        )
        .await
        .assert_unresumable();
    }
}

/// Each replica's `tools/call` requests so far (`dualera_requests_total`; 0 for a
/// killed one).
async fn calls_served(c: &Cluster) -> Vec<f64> {
    let mut served = Vec::new();
    for i in 0..c.gateways.len() {
        served.push(if c.gateways[i].is_none() {
            0.0
        } else {
            replica_metric(
                c,
                i,
                "dualera_requests_total",
                &[("mcp_method_name", "tools/call")],
            )
            .await
        });
    }
    served
}

/// `tools/call notes_delete` through the host's URL, answered and deleted; returns
/// the replica that served its calls, checking that one did: `calls` of them.
async fn delete_on_one_replica(c: &Cluster, host: &mut Legacy, calls: f64) -> usize {
    let before = calls_served(c).await;
    if calls > 1.0 {
        let (_, reply) = host
            .request(
                "tools/call",
                json!({"name": "notes_list", "arguments": {"workspaceUri": c.ws.notes_uri}}),
            )
            .await;
        assert_eq!(reply.status, 200);
    }
    let (call, mut stream, live) = delete_until_elicitation(c, host).await;
    let answered = host.post(&accept(&live)).await;
    assert_eq!(answered.status, 202);
    until_deleted(&mut stream, &call).await;
    let after = calls_served(c).await;
    let moved: Vec<usize> = (0..after.len()).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(
        moved.len(),
        1,
        "one replica served: {before:?} -> {after:?}"
    );
    assert_eq!(after[moved[0]] - before[moved[0]], calls);
    moved[0]
}

/// The replicas need no stickiness, and take it when the balancer has it: with HAProxy
/// hashing `Mcp-Session-Id` (consistently), every request of a session after its
/// `initialize` reaches one replica, the elicitation's answer and the call's stream
/// included, so the flow runs on the replica that holds the session's state and
/// streams (the bench's `--replica-affinity`). When that replica dies, the hash
/// moves the session to another, which serves it from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancer_hashing_the_session_id_keeps_a_session_on_one_replica() {
    let mut c = Cluster::start_balanced(3, &[], false, Balance::SessionHash).await;
    seed_tps(&c, 4).await;
    let mut last = None;
    for _ in 0..4 {
        let mut host = initialized(&c.lb.url()).await;
        let home = delete_on_one_replica(&c, &mut host, 2.0).await;
        last = Some((host, home));
    }
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 0);

    // The session's replica dies: the balancer's next pick for it serves it.
    let (mut host, home) = last.expect("a session");
    c.kill9(home);
    seed_tps(&c, 1).await;
    let next = delete_on_one_replica(&c, &mut host, 1.0).await;
    assert_ne!(next, home, "another replica took the session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_taken_over_when_its_replica_dies() {
    let mut c = Cluster::start(3, &[]).await;
    take_over_a_retry(&mut c, |_, _| {}).await;
}

/// With `session_record_format = "json"` (the new replicas of a rolling upgrade while
/// older ones still serve), every record a replica writes is the JSON builds before
/// MessagePack records read, the lease's request a JSON object as they read it, and
/// the replicas work on it as before: a retry's lease read back and taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_records_for_a_rolling_upgrade_are_what_older_builds_read() {
    let mut c = Cluster::start(3, &[("session_record_format", "\"json\"")]).await;
    take_over_a_retry(&mut c, |c, sid| {
        let record = bulk(c, &["HGET", &format!("dualera:s:{{{sid}}}"), "d"]);
        let record: Value = serde_json::from_str(&record)
            .unwrap_or_else(|e| panic!("the session record is JSON ({e}): {record:?}"));
        assert!(record["binding"].is_string(), "{record}");
        assert!(record["machine"]["calls"].is_array(), "{record}");
        let leases = c
            .redis
            .command(&["KEYS", &format!("dualera:l:{{{sid}}}:*")]);
        let lease = leases
            .lines()
            .nth(2)
            .unwrap_or_else(|| panic!("the running retry's lease: {leases:?}"));
        let rec = bulk(c, &["HGET", lease, "rec"]);
        let rec: Value = serde_json::from_str(&rec)
            .unwrap_or_else(|e| panic!("the lease record is JSON ({e}): {rec:?}"));
        assert_eq!(rec["sid"], sid, "{rec}");
        assert_eq!(rec["request"]["method"], "tools/call", "{rec}");
        assert!(
            rec["request"]["params"]["inputResponses"].is_object(),
            "the retry, as a JSON object: {rec}"
        );
    })
    .await;
    // Each replica says at start how it writes records.
    let said: Vec<Option<String>> = c
        .gateways
        .iter()
        .flatten()
        .filter_map(|g| {
            g.log()
                .into_iter()
                .find(|l| l.contains("shared session store in use"))
        })
        .map(|l| field(&l, "records"))
        .collect();
    assert_eq!(said, vec![Some("json".to_owned()); 2], "the live replicas");
}

/// A bulk string reply's text.
fn bulk(c: &Cluster, args: &[&str]) -> String {
    let reply = c.redis.command(args);
    let (len, rest) = reply
        .strip_prefix('$')
        .and_then(|r| r.split_once("\r\n"))
        .unwrap_or_else(|| panic!("{args:?} answered {reply:?}"));
    let len: usize = len
        .parse()
        .unwrap_or_else(|_| panic!("{args:?} answered {reply:?}"));
    rest[..len].to_owned()
}

/// Counts the upstream `tools/call` attempts that are retries (carry `inputResponses`),
/// or first attempts, and picks the first of them to hold for `pause`.
fn hold_first(
    retries: bool,
    pause: Duration,
) -> (
    Arc<AtomicUsize>,
    impl Fn(&Seen) -> Option<Duration> + Send + Sync + 'static,
) {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let pick = move |seen: &Seen| {
        let retry = seen.params().get("inputResponses").is_some();
        if seen.method == "tools/call" && retry == retries {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            return (n == 0).then_some(pause);
        }
        None
    };
    (count, pick)
}

/// The first retry of an elicitation flow is held upstream until the replica running
/// it is killed; another replica takes its lease over and completes the round.
/// `while_held` looks at the cluster (and the session id) while the retry is held.
async fn take_over_a_retry(c: &mut Cluster, while_held: impl FnOnce(&Cluster, &str)) {
    seed_tps(c, 2).await;
    // The first retry is held upstream long enough to kill the replica running it.
    let (retries, hold) = hold_first(true, Duration::from_secs(4));
    c.hop.set_delay(hold);
    let mut host = initialized(&c.url(0)).await;
    let (call, mut stream, live) = delete_until_elicitation(c, &mut host).await;
    // The answer reaches replica 2, which runs the retry. Its POST waits for the
    // retry's response head (a 401 would answer it), so it is sent from a task: the
    // replica dies while it waits.
    host.url = c.url(2);
    let runner = c.replica_id(2).await;
    let answer = accept(&live);
    let mut answering = Legacy::new(&host.url);
    answering.version = host.version.clone();
    answering.session = host.session.clone();
    let posted = tokio::spawn(async move {
        let _ = tokio::time::timeout(WAIT, answering.post(&answer)).await;
    });
    eventually(WAIT, "the retry to reach the upstream", || {
        (retries.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    while_held(c, &sid(&host));
    c.kill9(2);
    posted.abort();
    // Another replica takes the lease over and completes the round.
    let result = until_response(&mut stream, &call).await;
    assert!(
        result["result"]["structuredContent"]["deleted"].is_string(),
        "{result}"
    );
    let seen = retries.load(Ordering::SeqCst);
    assert!((1..=2).contains(&seen), "the upstream saw {seen} retries");
    assert_eq!(
        seen, 2,
        "the retry was sent again by the replica that took over"
    );
    assert_eq!(
        count_notes(&c.server.url, &c.ws, "TPS report").await,
        1,
        "one delete"
    );
    assert_taken_over_once_from(c, &runner);
}

/// Exactly one replica logged taking a lease over, from `runner`.
fn assert_taken_over_once_from(c: &Cluster, runner: &str) {
    let took_over: Vec<String> = c
        .gateways
        .iter()
        .flatten()
        .flat_map(|g| g.log())
        .filter(|l| l.contains("lease taken over"))
        .collect();
    assert_eq!(took_over.len(), 1, "{took_over:?}");
    assert_eq!(field(&took_over[0], "from").as_deref(), Some(runner));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_trouble_gives_a_clear_error_and_heals_by_itself() {
    let mut c = Cluster::start(2, &[("session_store_timeout_ms", "500")]).await;
    let host = initialized(&c.url(0)).await;
    let admin = c.admin(0);
    readyz_until(&admin, 200, "session store: ready").await;
    c.redis.stop();

    let reply = host
        .post(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .await;
    assert_eq!(reply.status, 503);
    let body = reply.json();
    assert_eq!(body["error"]["code"], -32603, "{body}");
    assert_eq!(
        body["error"]["data"]["reason"], "sessionStoreUnavailable",
        "{body}"
    );
    assert_eq!(body["id"], 5);
    let mut fresh = Legacy::new(&c.url(1));
    let (reply, response) = fresh.initialize(REV, caps()).await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        response["error"]["data"]["reason"],
        "sessionStoreUnavailable"
    );
    // Pass-through needs no session store.
    let direct = modern_tool(
        &c.url(1),
        "notes_list",
        json!({"workspaceUri": c.ws.notes_uri}),
    )
    .await;
    assert!(direct.get("structuredContent").is_some(), "{direct}");
    // `/readyz` says why (the store is pinged every second, also without traffic).
    readyz_until(&admin, 503, "session store: not ready").await;

    // Redis back (empty: persistence is off): new sessions work on every replica
    // without restarting any, and the lost session is a clean 404.
    c.redis.restart();
    back_empty(&c, &host).await;
    readyz_until(&admin, 200, "session store: ready").await;
}

/// After Redis came back empty: new sessions work on the first two replicas without
/// restarting either (they reconnect by themselves), and `host`'s lost session is a
/// clean 404.
async fn back_empty(c: &Cluster, host: &Legacy) {
    for i in 0..2 {
        let mut again = Legacy::new(&c.url(i));
        let response = eventually_initialize(&mut again).await;
        assert!(response.get("result").is_some(), "replica {i}: {response}");
        let (_, reply) = again.request("tools/list", json!({})).await;
        assert_eq!(reply.status, 200, "replica {i}");
    }
    let reply = host
        .post(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}))
        .await;
    assert_eq!(reply.status, 404);
}

/// Gateway `i`'s `dualera_store_redis_round_trips_total` (its `/metrics`).
async fn round_trips(c: &Cluster, i: usize) -> f64 {
    replica_metric(c, i, "dualera_store_redis_round_trips_total", &[]).await
}

/// A metric of gateway `i`'s `/metrics`, its series with these labels summed.
async fn replica_metric(c: &Cluster, i: usize, name: &str, labels: &[(&str, &str)]) -> f64 {
    let r = raw(
        &http_client(),
        http::Method::GET,
        &format!("{}/metrics", c.admin(i)),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    metric(&String::from_utf8_lossy(&r.body), name, labels)
}

/// Polls `/readyz` until it answers `status` with a body containing `text`.
async fn readyz_until(admin: &str, status: u16, text: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let r = raw(
            &http_client(),
            http::Method::GET,
            &format!("{admin}/readyz"),
            &[],
            "",
        )
        .await;
        let body = String::from_utf8_lossy(&r.body).into_owned();
        if r.status.as_u16() == status && body.contains(text) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz still {} {body:?}, waiting for {status} {text:?}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `initialize` until the replica's connection to Redis is back (it reconnects on
/// its own, with a short backoff).
async fn eventually_initialize(host: &mut Legacy) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (reply, response) = host.initialize(REV, caps()).await;
        if reply.status == 200 {
            return response;
        }
        assert!(std::time::Instant::now() < deadline, "still {response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_bound_and_leave_a_tombstone() {
    let c = Cluster::start(2, &[("session_idle_ttl_secs", "2"), ("max_sessions", "3")]).await;
    // The session bound across replicas: another caller's token gets 404 on either.
    let host = initialized(&c.url(0)).await;
    let session = sid(&host);
    let key = format!("dualera:s:{{{session}}}");
    assert_eq!(c.redis.int(&["EXISTS", &key]), 1);
    let ttl = c.redis.int(&["PTTL", &key]);
    // The idle TTL (2 s) plus the touch interval (a sixteenth of it): only a step that
    // moves the session's last use renews it.
    assert!(
        (1..=2125).contains(&ttl),
        "the record's TTL is the idle TTL plus the touch interval: {ttl}"
    );
    let mut stranger = Legacy::new(&c.url(1));
    stranger.session = host.session.clone();
    stranger.version = host.version.clone();
    stranger.auth = Some("Bearer someone-else".into());
    let r = stranger
        .post(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    assert_eq!(r.status, 404, "another caller's session is not found");

    // max_sessions counts every replica's sessions; at the bound, the longest-idle
    // session without a request in flight is ended to make room (as in memory), on
    // whichever replica it lives.
    let mut second = Legacy::new(&c.url(1));
    second.initialize(REV, caps()).await;
    let mut third = Legacy::new(&c.url(0));
    third.initialize(REV, caps()).await;
    assert_eq!(c.redis.int(&["ZCARD", "dualera:sessions"]), 3);
    let mut fourth = Legacy::new(&c.url(1));
    let (reply, _) = fourth.initialize(REV, caps()).await;
    assert_eq!(reply.status, 200, "the fourth session makes room");
    assert_eq!(c.redis.int(&["ZCARD", "dualera:sessions"]), 3);
    let r = host
        .post(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await;
    assert_eq!(r.status, 404, "the longest-idle session was evicted");
    assert_eq!(
        c.redis.command(&["HGET", &key, "gone"]).trim_end(),
        "$1\r\n1",
        "an evicted session leaves a tombstone"
    );

    // DELETE leaves a tombstone: the id is never served again.
    let fourth_key = format!("dualera:s:{{{}}}", sid(&fourth));
    fourth.url = c.url(0);
    assert_eq!(
        fourth.send(http::Method::DELETE, None, &[]).await.status,
        200
    );
    assert_eq!(
        c.redis.command(&["HGET", &fourth_key, "gone"]).trim_end(),
        "$1\r\n1",
        "a tombstone"
    );
    assert_eq!(
        c.redis.int(&["HEXISTS", &fourth_key, "d"]),
        0,
        "no state left"
    );
    let r = fourth
        .post(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .await;
    assert_eq!(r.status, 404, "a deleted session is not served again");

    // Idle sessions expire as in memory: used ones are kept alive, idle ones go.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, r) = second.request("tools/list", json!({})).await;
        assert_eq!(r.status, 200, "a session in use does not expire");
    }
    let r = third
        .post(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}))
        .await;
    assert_eq!(r.status, 404, "an idle session expired");
    let third_key = format!("dualera:s:{{{}}}", sid(&third));
    assert_eq!(
        c.redis.int(&["EXISTS", &third_key]),
        0,
        "and its record is gone"
    );
}

/// A session outlives its last step by the idle TTL, although a step renews its TTL
/// only when it moves the session's last use (a replica does at most once a touch
/// interval, a sixteenth of the idle TTL): the TTL it sets covers that interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_outlives_its_last_step_by_the_idle_ttl() {
    let c = Cluster::start(2, &[("session_idle_ttl_secs", "16")]).await;
    let mut host = initialized(&c.url(0)).await;
    let key = format!("dualera:s:{{{}}}", sid(&host));
    // Steps inside the touch interval (1 s) after the session was made: none renews.
    let mut last = std::time::Instant::now();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (_, r) = host.request("tools/list", json!({})).await;
        assert_eq!(r.status, 200);
        last = std::time::Instant::now();
    }
    let ttl = c.redis.int(&["PTTL", &key]);
    let since = i64::try_from(last.elapsed().as_millis()).unwrap();
    assert!(
        ttl + since >= 16_000,
        "the session expires {ttl} ms from now, {since} ms after its last step's answer"
    );
    assert!(
        ttl <= 17_000,
        "at most the idle TTL plus the touch interval: {ttl}"
    );
}

/// A 2025-03-26 batch on another replica than the one that opened its session: its
/// answers as one JSON array; a batch of notifications only, 202; a batch on a later
/// revision's session, `-32600`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_answered_by_any_replica() {
    let c = Cluster::start(2, &[]).await;
    let mut host = Legacy::new(&c.url(0));
    host.initialize("2025-03-26", json!({})).await;
    host.url = c.url(1);
    let batch = json!([
        {"jsonrpc": "2.0", "id": 10, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "id": 11, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "notes_list",
            "arguments": {"workspaceUri": c.ws.notes_uri}}},
    ]);
    let reply = host.post(&batch).await;
    assert_eq!(reply.status, 200);
    let answer = match reply.body {
        Body::Json(v) => v,
        Body::Sse(mut s) => s.next_message().await.expect("the batch's answer"),
        other => panic!("{other:?}"),
    };
    let items = answer.as_array().expect("an array");
    let mut ids: Vec<i64> = items.iter().filter_map(|i| i["id"].as_i64()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [10, 11, 12], "{answer}");
    assert!(items.iter().all(|i| i.get("result").is_some()), "{answer}");
    host.url = c.url(0);
    let notes = json!([{"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}]);
    assert_eq!(host.post(&notes).await.status, 202);

    let mut later = Legacy::new(&c.url(1));
    later.initialize(REV, json!({})).await;
    later.url = c.url(0);
    let refused = later
        .post(&json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
        .await;
    assert_eq!(refused.status, 400);
    let v = refused.json();
    assert_eq!(v["error"]["code"], -32600, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_get_stream_per_session_across_replicas() {
    let c = Cluster::start(2, &[]).await;
    let mut host = initialized(&c.url(0)).await;
    let get = host
        .send(http::Method::GET, None, &[("accept", "text/event-stream")])
        .await;
    assert_eq!(get.status, 200);
    let mut stream = get.sse();
    host.url = c.url(1);
    let second = host
        .send(http::Method::GET, None, &[("accept", "text/event-stream")])
        .await;
    assert_eq!(
        second.status, 409,
        "a second GET stream, on another replica"
    );
    // The open stream's priming event names it; resuming it on the other replica
    // takes it over, and the first connection ends.
    let first = match stream.next_within(WAIT).await {
        Next::Item(item) => item.id.expect("a priming event id"),
        other => panic!("no priming event: {other:?}"),
    };
    let resumed = host
        .send(
            http::Method::GET,
            None,
            &[
                ("last-event-id", first.as_str()),
                ("accept", "text/event-stream"),
            ],
        )
        .await;
    assert_eq!(resumed.status, 200);
    let rest = tokio::time::timeout(WAIT, stream.drain()).await;
    assert!(rest.is_ok(), "the taken-over connection ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardening_bounds_hold_for_shared_sessions() {
    let c = Cluster::start(
        2,
        &[("max_in_flight", "1"), ("max_sessions_per_caller", "1")],
    )
    .await;
    seed_tps(&c, 1).await;
    let mut host = initialized(&c.url(0)).await;
    host.url = c.url(1);
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;

    // max_in_flight, on the other replica: 429 with Retry-After, nothing started.
    host.url = c.url(0);
    let over = host
        .post(&json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list"}))
        .await;
    assert_eq!(over.status, 429);
    assert!(over.headers.contains_key("retry-after"));

    // max_sessions_per_caller over every replica: the caller's only session is busy,
    // so a new one is refused (429 + Retry-After), not made room for.
    let mut another = Legacy::new(&c.url(1));
    let (refused, _) = another.initialize(REV, caps()).await;
    assert_eq!(refused.status, 429);
    assert!(refused.headers.contains_key("retry-after"));
    // What kept it: the record's busy field, which the steps set and clear.
    let key = format!("dualera:s:{{{}}}", sid(&host));
    assert_eq!(c.redis.command(&["HGET", &key, "b"]).trim_end(), "$1\r\n1");

    // The answer on A, then the same answer again on B: a duplicate reply is
    // accepted (202) and dropped; the note is deleted once.
    let answered = host.post(&accept(&live)).await;
    assert_eq!(answered.status, 202);
    let result = until_response(&mut stream, &call).await;
    assert!(result.get("result").is_some(), "{result}");
    host.url = c.url(1);
    let again = host.post(&accept(&live)).await;
    assert_eq!(again.status, 202, "a late or duplicate reply is accepted");
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 0);

    // Now idle: the caller's next session takes the old one's place.
    assert_eq!(c.redis.command(&["HGET", &key, "b"]).trim_end(), "$1\r\n0");
    let (made, _) = another.initialize(REV, caps()).await;
    assert_eq!(made.status, 200);
    let gone = host
        .post(&json!({"jsonrpc": "2.0", "id": 51, "method": "tools/list"}))
        .await;
    assert_eq!(
        gone.status, 404,
        "the idle session was evicted for the new one"
    );
}

/// The number of keys matching `pattern` (a `KEYS` reply's `*N` header).
fn keys_matching(c: &Cluster, pattern: &str) -> usize {
    let reply = c.redis.command(&["KEYS", pattern]);
    reply
        .lines()
        .next()
        .and_then(|l| l.strip_prefix('*'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a KEYS reply: {reply:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discover_result_is_stored_once_and_again_when_it_expired() {
    let c = Cluster::start(2, &[]).await;
    // The first session stores the upstream's discover result under its digest.
    let mut first = Legacy::new(&c.url(0));
    first.initialize(REV, caps()).await;
    assert_eq!(keys_matching(&c, "dualera:d:*"), 1, "one discover result");
    let stored = c.redis.command(&["KEYS", "dualera:d:*"]);
    let key = stored
        .lines()
        .nth(2)
        .expect("the discover key's name")
        .to_owned();
    let sets = |c: &Cluster| {
        // `cmdstat_set:calls=N,usec=…` (no line before the first SET).
        let stats = c.redis.command(&["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = sets(&c);
    // A second session on the replica that stored it does not send it again.
    let mut second = Legacy::new(&c.url(0));
    second.initialize(REV, caps()).await;
    assert_eq!(
        sets(&c),
        before,
        "a known discover result is not written again"
    );
    // Gone from Redis (expired, flushed): the next session sends it again, and the other
    // replica serves that session with it.
    assert_eq!(c.redis.int(&["DEL", &key]), 1);
    let mut third = Legacy::new(&c.url(0));
    let (reply, _) = third.initialize(REV, caps()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(c.redis.int(&["EXISTS", &key]), 1, "stored again");
    third.url = c.url(1);
    let (_, r) = third.request("tools/list", json!({})).await;
    assert_eq!(r.status, 200, "the other replica serves the session");
}

/// `MONITOR` on the cluster's Redis: every command it runs (a script's included), read
/// on a thread until [`Monitor::stop`].
struct Monitor {
    stream: std::net::TcpStream,
    reader: std::thread::JoinHandle<Vec<String>>,
}

/// What [`Monitor::stop`] sends last: the reader stops once it saw it.
const MONITOR_END: &str = "dualera-test-monitor-end";

impl Monitor {
    fn start(c: &Cluster) -> Self {
        use std::io::{BufRead, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", c.redis.port)).expect("connect to Redis");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let mut lines = std::io::BufReader::new(stream.try_clone().expect("a second handle"));
        let mut ok = String::new();
        lines.read_line(&mut ok).expect("MONITOR's answer");
        assert_eq!(ok.trim(), "+OK", "MONITOR answered {ok:?}");
        let reader = std::thread::spawn(move || {
            lines
                .lines()
                .map_while(Result::ok)
                .take_while(|l| !l.contains(MONITOR_END))
                .collect::<Vec<String>>()
        });
        Self { stream, reader }
    }

    /// Everything Redis ran until now (a marker command sent last tells the reader
    /// that it has seen it all).
    fn stop(self, c: &Cluster) -> Vec<String> {
        c.redis.command(&["ECHO", MONITOR_END]);
        let seen = self.reader.join().expect("the MONITOR reader");
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        seen
    }
}

/// A request's first attempt that its POST drives writes no lease when the upstream
/// answers it before the host could resume anything: the elicitation's round ends
/// with its `input_required` answer, in the step that delivers it. The retry writes
/// one (its outcome goes to a stream the host already holds), as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_answered_at_once_writes_no_lease() {
    // A lease long enough that no renewal tick (a third of it) falls inside the test.
    let c = Cluster::start(2, &[("upstream_lease_ms", "30000")]).await;
    seed_tps(&c, 2).await;
    let mut host = initialized(&c.lb.url()).await;
    let leases = format!("dualera:l:{{{}}}:", sid(&host));
    let monitor = Monitor::start(&c);
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    let result = until_response(&mut stream, &call).await;
    assert!(
        result["result"]["structuredContent"]["deleted"].is_string(),
        "{result}"
    );
    let seen = monitor.stop(&c);
    // The lease keys written (the lines also carry the requests).
    let written: Vec<&str> = seen
        .iter()
        .filter(|l| l.contains("\"HSET\"") && l.contains(&leases))
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    assert_eq!(written.len(), 1, "the retry's lease only: {written:?}");
    assert!(
        seen.iter()
            .any(|l| l.contains("\"DEL\"") && l.contains(&leases)),
        "the retry's lease dropped with its answer"
    );
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 1);
}

/// A first attempt the upstream accepted but has not answered is leased once the host
/// can resume what it waits for: not while nothing of it showed, and before its POST's
/// priming event. Its replica killed then, another takes the lease over, sends the
/// attempt again, and the host gets the round on the stream it resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_is_leased_before_its_stream_shows_and_taken_over() {
    let mut c = Cluster::start(3, &[("upstream_lease_ms", "6000")]).await;
    seed_tps(&c, 2).await;
    // The first attempt is accepted at once and answered after the replica's death.
    // The lease (6 s) is renewed every 2 s: only the POST's answer writes it by 1 s.
    let (firsts, hold) = hold_first(false, Duration::from_secs(8));
    c.hop.set_stream_delay(hold);
    let mut host = initialized(&c.url(1)).await;
    let leases = format!("dualera:l:{{{}}}:*", sid(&host));
    let call = host.mint();
    let mut posting = Legacy::new(&host.url);
    posting.version = host.version.clone();
    posting.session = host.session.clone();
    let (id, args) = (call.clone(), delete_args(&c));
    let posted = tokio::spawn(async move { posting.request_with_id(id, "tools/call", args).await });
    eventually(WAIT, "the first attempt to reach the upstream", || {
        (firsts.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    assert_eq!(
        keys_matching(&c, &leases),
        0,
        "no lease while nothing showed"
    );
    let reply = posted.await.expect("the POST");
    assert_eq!(reply.status, 200);
    let mut stream = reply.sse();
    let primed = loop {
        match stream.next_within(WAIT).await {
            Next::Item(item) if item.id.is_some() => break item.id.expect("an id"),
            Next::Item(_) => {}
            other => panic!("no priming event: {other:?}"),
        }
    };
    assert_eq!(
        keys_matching(&c, &leases),
        1,
        "leased before the priming event"
    );
    let runner = c.replica_id(1).await;
    c.kill9(1);
    drop(stream);

    let mut resumed = resume_through_balancer(&c, &mut host, &primed).await;
    let (live, _) = until_elicitation(&mut resumed).await;
    assert_eq!(firsts.load(Ordering::SeqCst), 2, "sent again by the taker");
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    until_deleted_once(&c, &mut resumed, &call).await;
    assert_taken_over_once_from(&c, &runner);
}

/// The clients `CLIENT LIST` shows, as (over the Unix socket, protocol, last command).
fn redis_clients(c: &Cluster) -> Vec<(bool, String, String)> {
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_default()
            .to_owned()
    };
    c.redis
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains("addr="))
        .map(|l| {
            let unix = field(l, "flags=").contains('U');
            (unix, field(l, "resp="), field(l, "cmd="))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_sessions_over_a_unix_socket() {
    let mut c = Cluster::start_on(2, &[], true).await;
    seed_tps(&c, 2).await;
    let mut host = initialized(&c.url(0)).await;

    // The elicitation's call on B, its answer on A: A's step wakes B's stream through
    // Redis's pub/sub, here over the socket too.
    host.url = c.url(1);
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;
    host.url = c.url(0);
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    until_deleted(&mut stream, &call).await;
    assert_eq!(count_notes(&c.server.url, &c.ws, "TPS report").await, 1);

    // Every connection of the replicas is on the socket: commands (RESP2) and pub/sub
    // (RESP3), both replicas'. Over TCP only this harness's own (`CLIENT LIST`, the
    // start's `PING`s).
    let clients = redis_clients(&c);
    let over_socket = |resp: &str| clients.iter().filter(|(u, r, _)| *u && r == resp).count();
    assert!(over_socket("2") >= 2, "command connections: {clients:?}");
    assert!(over_socket("3") >= 2, "pub/sub connections: {clients:?}");
    assert!(
        clients
            .iter()
            .all(|(u, _, cmd)| *u || cmd == "client|list" || cmd == "ping"),
        "a replica connected over TCP: {clients:?}"
    );

    // A restart (the socket made again, the data gone): the lost session is a clean
    // 404 and new ones work on both replicas, which reconnect by themselves.
    c.redis.restart();
    back_empty(&c, &host).await;
}

/// A `tools/call` answered with one JSON body is answered before its last step is
/// stored: that step goes to Redis with the session's next step on the same replica,
/// or by the replica's sweeper soon after when none comes, or when the replica shuts
/// down. A replica killed before any of them leaves the request in flight in the shared
/// state, as one killed while the upstream answers does, and the session goes on on
/// the other replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answers_step_is_stored_with_the_sessions_next() {
    let mut c = Cluster::start(3, &[]).await;
    seed_tps(&c, 2).await;
    let mut host = initialized(&c.url(0)).await;
    let key = format!("dualera:s:{{{}}}", sid(&host));
    // The record's flag of requests in flight (`b`: "1" or "0").
    let busy = |c: &Cluster| c.redis.command(&["HGET", &key, "b"]) == "$1\r\n1\r\n";
    let list = json!({"name": "notes_list", "arguments": {"workspaceUri": c.ws.notes_uri}});

    // Five calls one after another on one replica: one step each reaches Redis with
    // the answer of the call before it, and the last one's answer comes after.
    let monitor = Monitor::start(&c);
    for _ in 0..5 {
        listed(&mut host, &list).await;
    }
    eventually(WAIT, "the last answer's step stored", || {
        (!busy(&c)).then_some(())
    })
    .await;
    let seen = monitor.stop(&c);
    let steps = seen
        .iter()
        .filter(|l| l.contains("\"EVALSHA\"") && l.contains(&key))
        .count();
    // Each stored before it answers, these five calls take eleven scripts: an
    // admission and an answer each, and the first sent again once Redis loaded the
    // script (`NOSCRIPT`: the first step in this Redis). Each answer's step stored with
    // the next call's, seven; a call slower than the sweeper's wait costs one more.
    assert!(
        (7..=9).contains(&steps),
        "{steps} steps stored for five calls"
    );

    // A clean shutdown stores what its replica left unstored.
    host.url = c.url(1);
    listed(&mut host, &list).await;
    let stopped = c.gateways[1].as_mut().expect("gateway 1").terminate();
    assert!(stopped, "gateway 1 stops on SIGTERM");
    assert!(!busy(&c), "the answer's step stored at shutdown");

    // Killed before it stored the answer's step: the request stays in flight in Redis,
    // and the session goes on on another replica.
    host.url = c.url(2);
    listed(&mut host, &list).await;
    c.kill9(2);
    assert!(busy(&c), "the killed replica's answer not stored");
    host.url = c.url(0);
    listed(&mut host, &list).await;
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    until_deleted(&mut stream, &call).await;
    assert_eq!(
        host.send(http::Method::DELETE, None, &[]).await.status,
        200,
        "the session ends"
    );
}

/// A step that leaves the host owing an answer (here an elicitation) pushes the
/// session's new state to the other replicas that step the session: the answer's
/// step, on one of them, stores at its first compare-and-set instead of reading the
/// state back from a conflict. A session only one replica steps pushes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_the_host_owes_an_answer_for_goes_to_the_other_replicas() {
    let c = Cluster::start(2, &[]).await;
    seed_tps(&c, 2).await;
    let list = json!({"name": "notes_list", "arguments": {"workspaceUri": c.ws.notes_uri}});
    let mut host = initialized(&c.url(0)).await;
    let key = format!("dualera:s:{{{}}}", sid(&host));
    let pushed = format!("\"r{}", sid(&host));
    let steps = |seen: &[String]| {
        seen.iter()
            .filter(|l| l.contains("\"EVALSHA\"") && l.contains(&key))
            .count()
    };
    let pushes = |seen: &[String]| {
        seen.iter()
            .filter(|l| l.contains("\"PUBLISH\"") && l.contains(&pushed))
            .count()
    };

    // Replica 0 alone: its elicitation's state goes nowhere.
    listed(&mut host, &list).await;
    let monitor = Monitor::start(&c);
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    until_deleted(&mut stream, &call).await;
    let seen = monitor.stop(&c);
    assert_eq!(pushes(&seen), 0, "one replica pushes nothing");

    // Replica 1 steps the session once, replica 0 goes on without it: what replica 1
    // remembers is behind by then.
    host.url = c.url(1);
    listed(&mut host, &list).await;
    // Its answer's step stored (by its sweeper: no next step comes to it).
    let busy = |c: &Cluster| c.redis.command(&["HGET", &key, "b"]) == "$1\r\n1\r\n";
    eventually(WAIT, "replica 1's answer stored", || {
        (!busy(&c)).then_some(())
    })
    .await;
    host.url = c.url(0);
    listed(&mut host, &list).await;
    let monitor = Monitor::start(&c);
    let (call, mut stream, live) = delete_until_elicitation(&c, &mut host).await;
    let seen = monitor.stop(&c);
    assert_eq!(
        pushes(&seen),
        1,
        "the elicitation's state pushed to replica 1"
    );
    // Replica 1 has what was pushed before the host's answer gets there (a push
    // that came later would cost the round trip it saves, as before).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let monitor = Monitor::start(&c);
    host.url = c.url(1);
    assert_eq!(host.post(&accept(&live)).await.status, 202);
    until_deleted(&mut stream, &call).await;
    let seen = monitor.stop(&c);
    // The answer's step and the result's; reading the state back from a conflict
    // would take a third.
    assert_eq!(
        steps(&seen),
        2,
        "the answer's step stored at its first compare-and-set: {seen:#?}"
    );
    assert_eq!(pushes(&seen), 0, "nothing owed once answered");
}

/// `tools/call notes_list` (`list`), answered with its result as one JSON body.
async fn listed(host: &mut Legacy, list: &Value) {
    let (_, reply) = host.request("tools/call", list.clone()).await;
    assert_eq!(reply.status, 200);
    let answer = reply.json();
    assert!(
        answer["result"]["structuredContent"].is_object(),
        "{answer}"
    );
}
