//! Hostile and sloppy peers, over real sockets: late replies are accepted and dropped
//! on every wire; duplicate JSON member names never decide consent; overload is a
//! protocol-level refusal (429); peer input is echoed bounded; what the upstream could
//! not take is refused naming the limit; a host that does not read its SSE stream is
//! cut off without losing the session; a full session table evicts the idlest session.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A scripted upstream whose `tools/call` asks two `roots/list` in one round, and
/// completes once answered; `held` tools are held open instead (a stream that only
/// ends when the gateway closes it), `slow` ones answered after 20 s, `big` ones with
/// 8 MiB of text.
async fn two_input_upstream(gateway: &[(&str, &str)]) -> Scripted {
    // Every rig has an admin listener: the metrics count what these peers did.
    let admin = "[admin]\nlisten = \"127.0.0.1:0\"\n";
    Scripted::with_config(gateway, admin, json!({"tools": {}}), |s| {
        let name = s.params()["name"].as_str().unwrap_or_default().to_owned();
        if name == "held" {
            return Script::Stream(vec![]);
        }
        if name == "big" {
            let text = "b".repeat(8 * 1024 * 1024);
            return Script::Json(complete(
                &s.id,
                json!({"content": [{"type": "text", "text": text}]}),
            ));
        }
        if name == "slow" {
            let done = complete(
                &s.id,
                json!({"content": [{"type": "text", "text": "late"}]}),
            );
            return Script::Delayed(Duration::from_secs(20), Box::new(Script::Json(done)));
        }
        if s.params().get("inputResponses").is_some() {
            return Script::Json(complete(
                &s.id,
                json!({"content": [{"type": "text", "text": "done"}]}),
            ));
        }
        Script::Json(input_required(
            &s.id,
            Some(json!({"a": {"method": "roots/list"}, "b": {"method": "roots/list"}})),
            Some("state-1"),
        ))
    })
    .await
}

/// The gateway's metrics (the admin listener has no token in these rigs).
async fn scrape(rig: &Scripted) -> String {
    let url = format!("{}/metrics", admin_url(&rig.gateway));
    let r = raw(&http_client(), http::Method::GET, &url, &[], "").await;
    assert_eq!(r.status, StatusCode::OK);
    String::from_utf8(r.body.to_vec()).expect("UTF-8 metrics")
}

fn roots_reply(id: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}})
}

/// One live request of a round fails; the host's reply to its sibling, already in
/// flight, is accepted (202) and dropped; a second reply too; the tool call ends
/// with the failure result. Only an id the gateway never minted is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replies_are_accepted_over_streamable_http() {
    let rig = two_input_upstream(&[]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({"roots": {}})).await;
    let (id, reply) = host
        .request("tools/call", json!({"name": "t", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let first = stream.next_message().await.expect("first live request");
    let second = stream.next_message().await.expect("second live request");
    assert_eq!(first["method"], "roots/list");
    assert_eq!(second["method"], "roots/list");
    let failed = json!({"jsonrpc": "2.0", "id": first["id"], "error": {"code": -32603, "message": "no roots here"}});
    assert_eq!(host.post(&failed).await.status, StatusCode::ACCEPTED);
    let mut cancelled = Vec::new();
    let response = loop {
        let m = stream.next_message().await.expect("the round's end");
        if m["method"] == "notifications/cancelled" {
            cancelled.push(m["params"]["requestId"].clone());
        } else {
            break m;
        }
    };
    assert_eq!(cancelled, vec![second["id"].clone()]);
    assert_eq!(response["id"], id);
    assert_eq!(response["result"]["isError"], true, "{response}");
    assert!(response["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("no roots here"));
    // The sibling's reply was in flight: accepted and dropped, twice.
    for _ in 0..2 {
        let r = host.post(&roots_reply(&second["id"])).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        assert!(matches!(r.body, Body::Empty), "{:?}", r.body);
    }
    // The failed one answered again: also an id the gateway minted.
    assert_eq!(
        host.post(&roots_reply(&first["id"])).await.status,
        StatusCode::ACCEPTED
    );
    // Never minted: refused.
    let r = host.post(&roots_reply(&json!("dualera-l424242"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], -32600);
    // The session is fine.
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    assert!(
        !rig.gateway.log().iter().any(|l| l.contains("late")),
        "a dropped late reply is logged at debug level only"
    );
    // Counted: the sibling's two replies came late, the failed one's second is a duplicate.
    let m = scrape(&rig).await;
    let dropped = |kind| metric(&m, "dualera_dropped_replies_total", &[("kind", kind)]);
    assert_eq!(dropped("late"), 2.0, "{m}");
    assert_eq!(dropped("duplicate"), 1.0, "{m}");
}

/// Reads lines from the stdio gateway until one satisfies `want`; returns it.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: &mut Vec<Value>,
    want: impl Fn(&Value) -> bool,
) -> Value {
    loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the stdio gateway went quiet")
            .expect("read")
            .expect("the stdio gateway closed its stdout");
        let v: Value = serde_json::from_str(&line).expect("a JSON line");
        seen.push(v.clone());
        if want(&v) {
            return v;
        }
    }
}

/// The same on a single-channel wire (`dualera gateway --stdio`): a late reply gets
/// no message back at all, the next line is the answer to the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replies_get_no_error_over_stdio() {
    let rig = two_input_upstream(&[]).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args(["gateway", "--stdio", "--upstream", &rig.up.url])
        .env("DUALERA_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the stdio gateway");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let send = |v: Value| {
        let mut line = serde_json::to_vec(&v).unwrap();
        line.push(b'\n');
        line
    };
    stdin
        .write_all(&send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
            "clientInfo": {"name": "stdio-host", "version": "1"}}}),
        ))
        .await
        .unwrap();
    read_until(&mut lines, &mut seen, |v| v["id"] == 1).await;
    stdin
        .write_all(&send(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ))
        .await
        .unwrap();
    stdin
        .write_all(&send(
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "t", "arguments": {}}}),
        ))
        .await
        .unwrap();
    let first = read_until(&mut lines, &mut seen, |v| v["method"] == "roots/list").await;
    let second = read_until(&mut lines, &mut seen, |v| v["method"] == "roots/list").await;
    stdin
        .write_all(&send(json!({"jsonrpc": "2.0", "id": first["id"],
            "error": {"code": -32603, "message": "no roots here"}})))
        .await
        .unwrap();
    let response = read_until(&mut lines, &mut seen, |v| v["id"] == 2).await;
    assert_eq!(response["result"]["isError"], true, "{response}");
    // Late, twice, then a ping: the very next line is the ping's answer.
    stdin
        .write_all(&send(roots_reply(&second["id"])))
        .await
        .unwrap();
    stdin
        .write_all(&send(roots_reply(&second["id"])))
        .await
        .unwrap();
    stdin
        .write_all(&send(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})))
        .await
        .unwrap();
    let next = read_until(&mut lines, &mut seen, |_| true).await;
    assert_eq!(next, json!({"jsonrpc": "2.0", "id": 3, "result": {}}));
    drop(stdin);
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

/// Duplicate member names never decide consent: `{"action":"decline","action":"accept"}`
/// and `"confirm":false,"confirm":true` are refused (-32600) by the gateway and by the
/// modern server, and no note is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_member_names_never_delete_a_note() {
    let rig = Rig::new(&[]).await;
    rig.seed("Dup", "keep me").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let ws = rig.ws.notes_uri.clone();
    let (_, _stream, live) = host.delete_round(&ws, "Dup").await;
    let note = live["params"]["requestedSchema"]["properties"]["note_id"]["enum"][0].clone();
    let id = live["id"].to_string();
    for body in [
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"action":"decline","action":"accept","content":{{"note_id":{note},"confirm":true}}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"action":"accept","content":{{"note_id":{note},"confirm":false,"confirm":true}}}}}}"#
        ),
    ] {
        let r = host.post_raw(body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let e = r.json();
        assert_eq!(e["error"]["code"], -32600, "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("duplicate member name"),
            "{e}"
        );
        assert_eq!(rig.count("Dup").await, 1, "a note was deleted");
    }
    // The modern server refuses them too.
    let client = http_client();
    let retry = modern_delete_retry(
        &client,
        &rig,
        "Dup",
        json!({"note_id": note, "confirm": true}),
    )
    .await;
    let text = serde_json::to_string(&retry).unwrap();
    let dup = text.replacen("\"confirm\":true", "\"confirm\":false,\"confirm\":true", 1);
    assert_ne!(dup, text);
    let headers = modern_headers(&retry);
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = raw(&client, http::Method::POST, &rig.server.url, &headers, dup).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], -32600);
    assert_eq!(
        rig.count("Dup").await,
        1,
        "the modern server deleted a note"
    );
}

/// A modern client's `notes_delete` of `title` straight to the modern server, and the
/// retry answering its form with `accept` and `content` (not sent).
async fn modern_delete_retry(client: &HttpClient, rig: &Rig, title: &str, content: Value) -> Value {
    let call = modern_request(
        json!(1),
        "tools/call",
        json!({"name": "notes_delete", "arguments": {"workspaceUri": rig.ws.notes_uri, "title": title}}),
        json!({"elicitation": {"form": {}}}),
    );
    let first = modern_post(client, &rig.server.url, &call).await.json();
    let inputs = first["result"]["inputRequests"]
        .as_object()
        .expect("input_required");
    let key = inputs.keys().next().expect("one input request").clone();
    let mut retry = call;
    retry["params"]["requestState"] = first["result"]["requestState"].clone();
    retry["params"]["inputResponses"] = json!({ key: {"action": "accept", "content": content}});
    retry
}

/// Beyond `max_in_flight`, a request is refused at the protocol level: HTTP 429 with
/// `Retry-After` and a JSON-RPC error naming the limit, never a tool result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_429_with_retry_after() {
    let rig = two_input_upstream(&[("max_in_flight", "1")]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({"roots": {}})).await;
    let _held = hold(&mut host).await;
    let (id, r) = host
        .request("tools/call", json!({"name": "t", "arguments": {}}))
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let e = r.json();
    assert_eq!(e["id"], id);
    assert!(e.get("result").is_none(), "not a tool result: {e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("limit 1"),
        "{e}"
    );
    assert_eq!(e["error"]["data"]["reason"], "tooManyInFlight");
    // Requests answered by the gateway itself still work.
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    // Counted as an overload failure of a tools/call.
    let m = scrape(&rig).await;
    let overload = [("reason", "overload")];
    assert_eq!(
        metric(&m, "dualera_request_failures_total", &overload),
        1.0,
        "{m}"
    );
    let failed = [("mcp_method_name", "tools/call"), ("outcome", "failed")];
    assert_eq!(metric(&m, "dualera_requests_total", &failed), 1.0, "{m}");
}

/// What the gateway repeats of peer input is bounded: a reply with a 3 MB id gets a
/// small error and small log lines; a 900 KB `note_id` gets a small error from the
/// modern server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_input_is_echoed_bounded() {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let huge = "i".repeat(3 * 1024 * 1024);
    let r = host
        .post_raw(serde_json::to_vec(&roots_reply(&json!(huge))).unwrap())
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.len() < 2048, "error body of {} bytes", r.body.len());
    assert!(String::from_utf8_lossy(&r.body).contains("truncated"));
    let longest = rig.gateway.log().iter().map(String::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");
    let session = host.session.clone().unwrap();
    assert!(
        !rig.gateway.log().iter().any(|l| l.contains(&session)),
        "a session id was logged"
    );

    rig.seed("Echo", "x").await;
    let client = http_client();
    let content = json!({"note_id": "n".repeat(900 * 1024), "confirm": true});
    let retry = modern_delete_retry(&client, &rig, "Echo", content).await;
    let r = modern_post(&client, &rig.server.url, &retry).await;
    assert!(r.body.len() < 2048, "error body of {} bytes", r.body.len());
    assert_eq!(r.json()["error"]["code"], -32602);
}

/// The gateway refuses what the upstream could not take, naming the limit: a request
/// larger than the upstream's body limit is 413 before anything is sent; an answer
/// that makes the retry too large fails the call with the limit in its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_upstream_cannot_take_is_refused_naming_the_limit() {
    let rig = Rig::new(&[]).await;
    rig.seed("Big", "x").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let ws = rig.ws.notes_uri.clone();
    let before = rig.hop.seen_method("tools/call").len();
    let (id, r) = host
        .request(
            "tools/call",
            json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": "Huge",
                "body": "b".repeat(2 * 1024 * 1024)}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let e = r.json();
    assert_eq!(e["id"], id);
    assert_eq!(e["error"]["data"]["limit"], 1024 * 1024, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("1048576"));
    assert_eq!(
        rig.hop.seen_method("tools/call").len(),
        before,
        "nothing sent"
    );

    let padding = "p".repeat(1536 * 1024);
    let ex = host
        .exchange_with(
            "tools/call",
            json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Big"}}),
            |live| {
                let mut a = default_answer(live);
                a["result"]["content"]["padding"] = json!(padding);
                a
            },
        )
        .await;
    assert_eq!(ex.response["result"]["isError"], true, "{}", ex.response);
    assert!(ex.response["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("at most 1048576"));
    assert_eq!(rig.count("Big").await, 1);
}

/// A host that does not read its SSE stream is cut off once half of
/// `max_buffered_bytes` stayed queued for `stalled_reader_timeout_secs`; the session
/// survives and the host resumes from its last event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_does_not_read_is_cut_off_and_resumes() {
    let rig = Scripted::new(
        &[
            ("max_buffered_bytes", "65536"),
            ("stalled_reader_timeout_secs", "1"),
            ("replay_buffer", "4096"),
            ("replay_buffer_bytes", "67108864"),
        ],
        json!({"tools": {}, "logging": {}}),
        |_| Script::Stream(vec![]),
    )
    .await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({})).await;
    let (id, reply) = host
        .request("tools/call", json!({"name": "chatty", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let call = rig.up.wait_method("tools/call", 1).await.remove(0);
    rig.up.wait_held(&call.id).await;
    let chunk = "c".repeat(8 * 1024);
    // Far more than the socket buffers can hold, while the host reads nothing.
    for i in 0..1500 {
        rig.up.push(
            &call.id,
            json!({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": format!("{i} {chunk}")}}),
        );
    }
    eventually(WAIT, "the gateway cuts the stream off", || {
        rig.gateway
            .log()
            .iter()
            .any(|l| l.contains("host not reading"))
            .then_some(())
    })
    .await;
    rig.up.push(
        &call.id,
        complete(
            &call.id,
            json!({"content": [{"type": "text", "text": "finally"}]}),
        ),
    );
    // Read what did arrive, up to where the connection was cut.
    let mut last = None;
    let mut got = 0;
    while let Some((event_id, m)) = stream.next_message_item().await {
        assert!(
            m.get("method").is_some(),
            "the response cannot have been sent: {m}"
        );
        last = event_id.or(last);
        got += 1;
    }
    assert!(got < 1500, "the stream was never cut ({got} messages)");
    let mut last = last.expect("an event id");
    // Resume, as a host does, from the last event id it saw, each time the stream
    // ends without the response: the rest comes from the replay ring, then the
    // response.
    let mut rest = 0;
    let mut resumes = 0;
    let response = 'resume: loop {
        resumes += 1;
        assert!(resumes < 50, "no response after {resumes} resumptions");
        let mut resumed = host.get(Some(&last)).await.sse();
        while let Some((event_id, m)) = resumed.next_message_item().await {
            if let Some(e) = event_id {
                last = e;
            }
            if m.get("method").is_some() {
                rest += 1;
            } else {
                break 'resume m;
            }
        }
    };
    assert_eq!(response["id"], id);
    assert_eq!(response["result"]["content"][0]["text"], "finally");
    assert_eq!(got + rest, 1500, "nothing lost: {got} + {rest}");
}

/// Starts a `tools/call` the upstream holds open: the session has a request in flight.
async fn hold(host: &mut Legacy) -> SseReader {
    let (_, reply) = host
        .request("tools/call", json!({"name": "held", "arguments": {}}))
        .await;
    reply.sse()
}

/// The session of `host` no longer exists.
async fn assert_gone(host: &Legacy) {
    let ping = json!({"jsonrpc": "2.0", "id": 99, "method": "ping"});
    assert_eq!(host.post(&ping).await.status, StatusCode::NOT_FOUND);
}

/// A full session table evicts the longest-idle session with nothing in flight; it
/// refuses (503 + Retry-After) only when every session is busy. One caller may hold
/// at most `max_sessions_per_caller`: its own idlest goes first, then 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_tables_evict_the_idlest_and_callers_are_bounded() {
    let rig = two_input_upstream(&[("max_sessions", "2"), ("max_sessions_per_caller", "10")]).await;
    let mut a = rig.legacy();
    a.open("2025-11-25", json!({})).await;
    let mut b = rig.legacy();
    b.open("2025-11-25", json!({})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(a.call("ping", json!({})).await["result"], json!({}));
    // b is the idlest: c takes its place.
    let mut c = rig.legacy();
    c.open("2025-11-25", json!({})).await;
    assert_gone(&b).await;
    assert_eq!(a.call("ping", json!({})).await["result"], json!({}));
    // Both busy: the next one is refused.
    let _ha = hold(&mut a).await;
    let _hc = hold(&mut c).await;
    let mut d = rig.legacy();
    let (reply, response) = d.initialize("2025-11-25", json!({})).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{response}");
    assert!(reply.headers.get("retry-after").is_some());
    assert!(reply.headers.get("mcp-session-id").is_none());

    // Per caller: a fresh gateway with room for many sessions, one per credential.
    let rig =
        two_input_upstream(&[("max_sessions", "100"), ("max_sessions_per_caller", "1")]).await;
    let mut x1 = rig.legacy();
    x1.auth = Some("Bearer caller-x".into());
    x1.open("2025-11-25", json!({})).await;
    let mut y = rig.legacy();
    y.auth = Some("Bearer caller-y".into());
    y.open("2025-11-25", json!({})).await;
    let mut x2 = rig.legacy();
    x2.auth = Some("Bearer caller-x".into());
    x2.open("2025-11-25", json!({})).await;
    // x1 (same caller, idle) made room; y is untouched.
    assert_gone(&x1).await;
    assert_eq!(y.call("ping", json!({})).await["result"], json!({}));
    let _hx = hold(&mut x2).await;
    let mut x3 = rig.legacy();
    x3.auth = Some("Bearer caller-x".into());
    let (reply, response) = x3.initialize("2025-11-25", json!({})).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{response}");
    assert!(response["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit 1"));
    assert_eq!(y.call("ping", json!({})).await["result"], json!({}));
}

/// Sends a request head announcing a 4 MB body to `url`, then one body byte every
/// `every` until the gateway answers or closes; returns the status line's code (0 when
/// closed without one) and how long the connection lived.
async fn trickle(url: &str, every: Duration) -> (u16, Duration) {
    let u: http::Uri = url.parse().expect("gateway URL");
    let authority = u.authority().expect("authority").to_string();
    let started = std::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(&authority)
        .await
        .expect("connect");
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 4000000\r\n\r\n",
        u.path()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if wr.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut answer),
    )
    .await;
    writer.abort();
    let code = std::str::from_utf8(answer.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, started.elapsed())
}

/// 200 connections that announce a 4 MB body and trickle it one byte a second are
/// answered 408 and closed within the body deadline (3 s here); the ones beyond the
/// address's slow-body budget at once; meanwhile a real host opens a session and is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_bodies_are_cut_off_while_hosts_are_served() {
    let rig = two_input_upstream(&[
        ("body_read_timeout_secs", "3"),
        ("max_slow_bodies_per_peer", "50"),
    ])
    .await;
    let url = rig.gateway.url.clone();
    let trickles: Vec<_> = (0..200)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { trickle(&url, Duration::from_secs(1)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let served = std::time::Instant::now();
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({})).await;
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    assert!(
        served.elapsed() < Duration::from_secs(2),
        "the host waited {:?}",
        served.elapsed()
    );
    let mut quick = 0;
    for t in trickles {
        let (code, lived) = t.await.expect("trickler");
        assert_eq!(code, 408, "a trickled body's answer");
        assert!(lived < Duration::from_secs(5), "open for {lived:?}");
        if lived < Duration::from_millis(2500) {
            quick += 1;
        }
    }
    // Over the budget of 50: refused as soon as they became slow.
    assert!(quick >= 150, "{quick} refused before the deadline");
    // A trickled body is cut by the idle gap as well as by the total deadline.
    let rig = two_input_upstream(&[("body_idle_timeout_secs", "1")]).await;
    let (code, lived) = trickle(&rig.gateway.url, Duration::from_secs(3)).await;
    assert_eq!(code, 408);
    assert!(lived < Duration::from_millis(2500), "open for {lived:?}");
}

/// A session is bound to the token, not to the header's spelling: the scheme is
/// case-insensitive (RFC 9110 §11.1) and the spaces after it are not part of the
/// credential, so `bearer T`, `BEARER T` and `Bearer  T` reach the session opened with
/// `Bearer T`, and count as the same caller; another token does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_binds_the_session_not_its_spelling() {
    let rig = two_input_upstream(&[("max_sessions_per_caller", "1")]).await;
    let mut host = rig.legacy();
    host.auth = Some("Bearer T-1".into());
    host.open("2025-11-25", json!({})).await;
    for spelling in ["bearer T-1", "BEARER T-1", "Bearer  T-1", "Bearer T-1"] {
        host.auth = Some(spelling.into());
        assert_eq!(
            host.call("ping", json!({})).await["result"],
            json!({}),
            "{spelling:?}"
        );
    }
    host.auth = Some("Bearer T-2".into());
    let ping = json!({"jsonrpc": "2.0", "id": 7, "method": "ping"});
    assert_eq!(host.post(&ping).await.status, StatusCode::NOT_FOUND);
    // One caller: a second session under another spelling takes the first one's place.
    let mut again = rig.legacy();
    again.auth = Some("BEARER  T-1".into());
    again.open("2025-11-25", json!({})).await;
    host.auth = Some("Bearer T-1".into());
    assert_gone(&host).await;
}

/// One echo rule for every peer string, headers included: a 300 KB
/// `MCP-Protocol-Version` on a session gets an error body under 1 KiB stating the
/// header's length; a 10 KB method name is not found in under 1 KiB, from the modern
/// server and through the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_headers_and_methods_stay_under_a_kibibyte() {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let version = "9".repeat(300 * 1024);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let r = host
        .send(
            http::Method::POST,
            Some(&ping),
            &[("mcp-protocol-version", &version)],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let Body::Json(v) = &r.body else {
        panic!("{:?}", r.body)
    };
    let text = v.to_string();
    assert!(text.len() <= 1024, "error body of {} bytes", text.len());
    assert!(text.contains("truncated, 307200 bytes"), "{text}");
    assert_eq!(v["error"]["code"], -32600);

    let client = http_client();
    let method = "m".repeat(10 * 1024);
    let call = modern_request(json!(2), &method, json!({}), json!({}));
    for url in [&rig.server.url, &rig.gateway.url] {
        let r = modern_post(&client, url, &call).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{url}");
        assert!(
            r.body.len() <= 1024,
            "{url}: error body of {}",
            r.body.len()
        );
        assert_eq!(r.json()["error"]["code"], -32601);
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("truncated, 10240 bytes"), "{message}");
    }
    let longest = rig.gateway.log().iter().map(String::len).max().unwrap_or(0);
    assert!(longest < 2048, "a gateway log line of {longest} bytes");
    let longest = rig.server.log().iter().map(String::len).max().unwrap_or(0);
    assert!(longest < 2048, "a server log line of {longest} bytes");
}

/// A request the host cancels ends its POST stream as soon as the cancel is processed
/// (well within a second), rather than at the next keepalive or idle timeout: while the
/// upstream holds it, and while the host owes it answers to live requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_s_stream_ends_at_once() {
    let rig = two_input_upstream(&[("keepalive_secs", "30")]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({"roots": {}})).await;
    for name in ["held", "asks"] {
        let (id, reply) = host
            .request("tools/call", json!({"name": name, "arguments": {}}))
            .await;
        let mut stream = reply.sse();
        if name == "asks" {
            let live = stream.next_message().await.expect("a live request");
            assert_eq!(live["method"], "roots/list");
        } else {
            // The upstream has the call.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "changed my mind"}});
        assert_eq!(host.post(&cancel).await.status, StatusCode::ACCEPTED);
        let cancelled = std::time::Instant::now();
        loop {
            match stream.next_within(Duration::from_secs(1)).await {
                Next::End => break,
                Next::Item(item) => assert!(
                    item.data
                        .as_ref()
                        .is_none_or(|m| m["method"] == "roots/list"
                            || m["method"] == "notifications/cancelled"),
                    "{item:?}"
                ),
                Next::Timeout => panic!("{name}: the stream is open a second after the cancel"),
            }
        }
        assert!(cancelled.elapsed() < Duration::from_secs(1), "{name}");
        assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    } // The upstream is silent for 20 s: the host's POST has no answer yet when the
      // cancel comes on another connection.
    let mut other = rig.legacy();
    other.session = host.session.clone();
    other.version = host.version.clone();
    let slow = tokio::spawn(async move {
        let reply = host
            .request_with_id(
                json!("slow-1"),
                "tools/call",
                json!({"name": "slow", "arguments": {}}),
            )
            .await;
        if let Body::Sse(mut stream) = reply.body {
            while let Next::Item(_) = stream.next_within(Duration::from_secs(30)).await {}
        }
        std::time::Instant::now()
    });
    while !rig.up.seen().iter().any(|s| s.params()["name"] == "slow") {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "slow-1"}});
    assert_eq!(other.post(&cancel).await.status, StatusCode::ACCEPTED);
    let cancelled = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), slow)
        .await
        .expect("the slow request's POST is still open 5 s after the cancel")
        .expect("host task");
    assert!(
        ended.duration_since(cancelled) < Duration::from_secs(1),
        "ended {:?} after the cancel",
        ended.duration_since(cancelled)
    );
}

/// An `initialize` without credentials from `source` (another loopback address: another
/// local host), over a fresh connection; returns the HTTP status.
async fn initialize_from(source: &str, url: &str) -> u16 {
    let u: http::Uri = url.parse().expect("gateway URL");
    let authority = u.authority().expect("authority").to_string();
    let target: std::net::SocketAddr = authority.parse().expect("an IP gateway address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().unwrap())
        .expect("bind the source address");
    let mut s = socket.connect(target).await.expect("connect");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "flood", "version": "1"}}})
    .to_string();
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        u.path(),
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("request");
    let mut head = [0u8; 12];
    tokio::io::AsyncReadExt::read_exact(&mut s, &mut head)
        .await
        .expect("status line");
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// Local hosts without credentials are told apart by address: one local host's flood
/// of `initialize` costs its own idle sessions, never another local host's idle one —
/// at its own bound, and at the table's (the caller holding the most gives way). When
/// the flood is refused, the refusals are logged once, with a count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_flood_does_not_evict_another_local_host_s_session() {
    for (max, per_caller) in [("100", "3"), ("4", "100")] {
        let rig = two_input_upstream(&[
            ("max_sessions", max),
            ("max_sessions_per_caller", per_caller),
        ])
        .await;
        let mut b = rig.legacy();
        b.open("2025-11-25", json!({})).await;
        for _ in 0..20 {
            assert_eq!(initialize_from("127.0.0.2", &rig.gateway.url).await, 200);
        }
        assert_eq!(
            b.call("ping", json!({})).await["result"],
            json!({}),
            "max_sessions {max}, per caller {per_caller}"
        );
    }

    // Refused 200 times: one log line says so, with the count.
    let rig = two_input_upstream(&[("max_sessions_per_caller", "1")]).await;
    let mut busy = rig.legacy();
    busy.open("2025-11-25", json!({})).await;
    let _held = hold(&mut busy).await;
    for _ in 0..200 {
        let (reply, _) = rig.legacy().initialize("2025-11-25", json!({})).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let lines: Vec<String> = rig
        .gateway
        .log()
        .into_iter()
        .filter(|l| l.contains("session limit reached"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    // The line without its terminal colours.
    let mut plain = String::new();
    let mut in_escape = false;
    for c in lines[0].chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (false, c) => plain.push(c),
            (true, 'm') => in_escape = false,
            (true, _) => {}
        }
    }
    assert!(plain.contains("refused=1"), "{plain}");
}

/// The resident set of a process, in bytes (`VmRSS` in `/proc/PID/status`).
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Connects to the gateway of `host` from `socket` and POSTs `body` on its session,
/// raw (a peer the HTTP client cannot play); returns the connection, open, unread.
async fn raw_session_post(
    host: &Legacy,
    socket: tokio::net::TcpSocket,
    body: &str,
) -> tokio::net::TcpStream {
    let u: http::Uri = host.url.parse().expect("gateway URL");
    let authority = u.authority().expect("authority").to_string();
    let mut s = socket
        .connect(authority.parse().expect("an IP address"))
        .await
        .expect("connect");
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: {}\r\nContent-Length: {}\r\n\r\n",
        u.path(),
        host.session.as_deref().expect("a session"),
        host.version.as_deref().expect("a version"),
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(body.as_bytes()).await.expect("body");
    s
}

/// Sends `tools/list` on the session of `host` with a 3.9 MB string id over a fresh
/// connection, and never reads the answer; the connection is returned open.
async fn unread_large_id(host: &Legacy) -> tokio::net::TcpStream {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"{}","method":"tools/list"}}"#,
        "i".repeat(3_900_000)
    );
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    raw_session_post(host, socket, &body).await
}

/// 100 hosts that send a 3.9 MB id and never read the answer: the id is refused
/// (400, -32600, not repeated), the gateway's RSS grows by less than 256 MiB while
/// they hang on (their bodies were read: 390 MB in all; before the id cap the unread
/// answers alone held as much again), and comes back within 20 % of its baseline once
/// they are gone (within 20 s: jemalloc's decay; with glibc it stays 90–120 MiB above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_to_large_ids_do_not_keep_memory() {
    let rig = two_input_upstream(&[]).await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({})).await;
    let pid = rig.gateway.pid();
    // One round first: the baseline includes what the first requests warm up.
    drop(unread_large_id(&host).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = rss_of(pid);
    let mut held = Vec::new();
    let mut peak = baseline;
    for _ in 0..100 {
        held.push(unread_large_id(&host).await);
        peak = peak.max(rss_of(pid));
    }
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak = peak.max(rss_of(pid));
    }
    // One of them, read after all: the small refusal.
    let mut answer = vec![0u8; 4096];
    let n = tokio::io::AsyncReadExt::read(&mut held[0], &mut answer)
        .await
        .expect("an answer");
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(
        text.contains("-32600") && !text.contains("\"id\":\"i"),
        "{text}"
    );
    assert!(text.len() < 1024, "{} bytes", text.len());
    drop(held);
    // The allocator gives freed pages back within its decay time (10 s).
    let mut after = u64::MAX;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = rss_of(pid);
        if after * 5 <= baseline * 6 {
            break;
        }
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "gateway RSS: baseline {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
        mib(baseline),
        mib(peak),
        mib(after)
    );
    assert!(
        peak - baseline < 256 * 1024 * 1024,
        "grew by {:.1} MiB",
        mib(peak - baseline)
    );
    assert!(
        after * 5 <= baseline * 6,
        "after {:.1} MiB, baseline {:.1} MiB",
        mib(after),
        mib(baseline)
    );
}

/// Sends a `tools/call` of `big` on the session of `host` from a socket with a small
/// receive buffer, and never reads: of the 8 MiB answer, what the kernel's send buffer
/// (4 MiB at most) does not take waits in the gateway.
async fn unread_big_answer(host: &Legacy) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let body = json!({"jsonrpc": "2.0", "id": "big", "method": "tools/call",
        "params": {"name": "big", "arguments": {}}});
    raw_session_post(host, socket, &body.to_string()).await
}

/// Answers nobody reads are bounded process-wide: past `max_pending_write_bytes`
/// (1 MB here), new requests get 503 with `Retry-After`; once the readers that do not
/// read are gone, requests are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritten_answers_are_bounded_process_wide() {
    let rig = two_input_upstream(&[
        ("max_pending_write_bytes", "1000000"),
        ("max_body_bytes", "20000000"),
    ])
    .await;
    let mut host = rig.legacy();
    host.open("2025-11-25", json!({})).await;
    let ping = json!({"jsonrpc": "2.0", "id": "p", "method": "ping"});
    let mut unread = vec![unread_big_answer(&host).await];
    let refused = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = host.post(&ping).await;
        if r.status != StatusCode::OK || unread.len() == 4 {
            break r;
        }
        unread.push(unread_big_answer(&host).await);
    };
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "after {} unread answers",
        unread.len()
    );
    assert_eq!(refused.headers.get("retry-after").unwrap(), "1");
    drop(unread);
    let mut served = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if host.post(&ping).await.status == StatusCode::OK {
            served = true;
            break;
        }
    }
    assert!(served, "still refused after the readers left");
}
