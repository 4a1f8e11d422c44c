//! The gateway's IO toward legacy upstreams, over real sockets and real legacy servers:
//! the official Python SDK's FastMCP server (mcp 1.30.0, `tests/interop/py/legacy_server.py`)
//! over Streamable HTTP, the 2024-11-05 HTTP+SSE transport and stdio, and the repo's own
//! `dualera serve` as the modern upstream.
//!
//! - the era probe (`upstream::era`): modern for `dualera serve`, legacy with the right
//!   transport for each Python transport; a second probe costs the upstream nothing
//!   (counted by the server); a contradicted assumption is probed again;
//! - legacy sessions (`upstream::legacy`): a tool called, a server→client request
//!   (elicitation) received on the stream and answered, `404` reported as expiry,
//!   `DELETE` on close, on each transport;
//! - the pool: two keys never share an upstream session (the server's own
//!   `Mcp-Session-Id`s), bounds refuse with their limit, idle sessions are pinged and
//!   closed;
//! - the gateway binary: a legacy host in front of a legacy upstream passes straight
//!   through (initialize, tools/call, DELETE), and `/readyz` and `/metrics` name the
//!   legacy upstream.
//!
//! The Python peer lives in the interop suite's venv. Without it these tests fail (they
//! never skip); `python3 tests/interop/run.py --prepare-legacy-python` creates it.

use bytes::Bytes;
use dualera::config::UpstreamEra;
use dualera::gateway::upstream::era::{self, Era, EraProber, Target};
use dualera::gateway::upstream::legacy::{
    LegacyError, LegacySession, LegacyTransport, PoolKey, PoolLimits, SessionOptions, SessionPool,
};
use dualera::gateway::upstream::{OnBehalf, UpstreamClient, UpstreamOptions};
use dualera_adapters::jsonrpc::{Message, Request, RequestId, Response};
use http::header::HeaderValue;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_secs(10);
const MAX: usize = 4 * 1024 * 1024;

#[path = "common/legacy_server.rs"]
mod legacy_server;
use legacy_server::{python, server_script, Proc, PyServer};

/// A `dualera` subcommand, and the addresses it reported (`… listening on http://A/…`).
struct Dualera {
    _proc: Proc,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Dualera {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
            .args(args)
            .env("DUALERA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dualera");
        let stderr = child.stderr.take().expect("stderr");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                keep.lock().unwrap().push(line);
            }
        });
        Self {
            _proc: Proc(child),
            lines,
        }
    }

    /// The address after `<what> listening on http://`.
    fn addr(&self, what: &str) -> SocketAddr {
        let deadline = std::time::Instant::now() + WAIT;
        let marker = format!("{what} listening on http://");
        loop {
            {
                let lines = self.lines.lock().unwrap();
                for l in lines.iter() {
                    if let Some(rest) = l.split(&marker).nth(1) {
                        let a = rest.split('/').next().unwrap_or("");
                        if let Ok(a) = a.parse() {
                            return a;
                        }
                    }
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no `{marker}` line; stderr:\n{}",
                    lines.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One HTTP request; status, headers and the whole body.
async fn http(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, http::HeaderMap, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = body.map_or_else(Bytes::new, |v| Bytes::from(v.to_string()));
    let req = b.body(Full::new(body)).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answered in time")
        .expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, headers, bytes)
}

/// The JSON-RPC message of a JSON body or of the SSE body's data line.
fn rpc_of(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body);
    if let Ok(v) = serde_json::from_str(&text) {
        return v;
    }
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .rfind(|d| !d.is_empty())
        .unwrap_or_else(|| panic!("no data line in {text:?}"));
    serde_json::from_str(data).expect("JSON data")
}

fn client() -> UpstreamClient {
    UpstreamClient::new(&UpstreamOptions::default()).expect("client")
}

fn http_target(url: &str) -> Target {
    Target::Http {
        client: Box::new(client()),
        uri: url.parse().unwrap(),
        max_message: MAX,
    }
}

fn stdio_target() -> Target {
    Target::Stdio {
        program: python().display().to_string(),
        args: vec![server_script().display().to_string(), "stdio".into()],
        max_message: MAX,
    }
}

fn request(id: i64, method: &str, params: Value) -> Message {
    Message::Request(Request {
        id: RequestId::Number(id),
        method: method.into(),
        params: Some(params),
    })
}

fn call(id: i64, name: &str, arguments: Value) -> Message {
    request(
        id,
        "tools/call",
        json!({ "name": name, "arguments": arguments }),
    )
}

/// The next message on the session (bounded wait).
async fn next(session: &LegacySession) -> Message {
    tokio::time::timeout(WAIT, session.recv())
        .await
        .expect("a message in time")
        .expect("the session is open")
        .expect("a message, not an error")
}

/// The response to `id`, skipping notifications (logging, progress).
async fn response(session: &LegacySession, id: i64) -> Response {
    loop {
        match next(session).await {
            Message::Response(r) if r.id == Some(RequestId::Number(id)) => return r,
            Message::Response(r) => panic!("unexpected response {r:?}"),
            _ => {}
        }
    }
}

fn text_of(r: &Response) -> String {
    let result = r.outcome.as_ref().expect("a result");
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {result}"))
        .to_owned()
}

/// `add`, then `ask` with its elicitation received on the stream and answered, then
/// the session's own id as the server sees it (over HTTP).
async fn exercise(session: &LegacySession) -> String {
    era::handshake_as(session, &json!({ "elicitation": {} }), STEP)
        .await
        .expect("handshake");
    session
        .send(
            &call(1, "add", json!({ "a": 2, "b": 3 })),
            OnBehalf::default(),
        )
        .await
        .expect("tools/call sent");
    assert_eq!(text_of(&response(session, 1).await), "5");
    session
        .send(
            &call(2, "ask", json!({ "question": "colour?" })),
            OnBehalf::default(),
        )
        .await
        .expect("tools/call sent");
    let elicitation = loop {
        match next(session).await {
            Message::Request(r) => break r,
            Message::Notification(_) => continue,
            other => panic!("expected the server's elicitation request, got {other:?}"),
        }
    };
    assert_eq!(elicitation.method, "elicitation/create");
    assert_eq!(elicitation.params.as_ref().unwrap()["message"], "colour?");
    let reply = Message::Response(Response::result(
        elicitation.id.clone(),
        json!({ "action": "accept", "content": { "answer": "teal" } }),
    ));
    session
        .send(&reply, OnBehalf::default())
        .await
        .expect("reply sent");
    assert_eq!(text_of(&response(session, 2).await), "answered: teal");
    session
        .send(&call(3, "session_id", json!({})), OnBehalf::default())
        .await
        .expect("tools/call sent");
    text_of(&response(session, 3).await)
}

#[tokio::test]
async fn the_probe_names_a_modern_upstream() {
    let dir = tempdir();
    let serve = Dualera::spawn(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--demo",
        dir.path().to_str().unwrap(),
    ]);
    let addr = serve.addr("modern server");
    let prober = EraProber::default();
    let target = http_target(&format!("http://{addr}/mcp"));
    let era = prober
        .era(&target, UpstreamEra::Auto, OnBehalf::default())
        .await
        .expect("probed");
    assert_eq!(era, Era::Modern);
    assert_eq!(prober.cached(&target), Some(Era::Modern));
}

#[tokio::test]
async fn the_probe_names_each_legacy_transport_and_remembers_it() {
    let py = PyServer::spawn("streamable-http");
    let prober = EraProber::default();
    let target = http_target(&py.url("/mcp"));
    let era = prober
        .era(&target, UpstreamEra::Auto, OnBehalf::default())
        .await
        .expect("probed");
    assert_eq!(era, Era::Legacy(LegacyTransport::StreamableHttp));
    let after_first = py.stats().await;
    assert_eq!(after_first["POST /mcp server/discover"], 1, "{after_first}");
    assert_eq!(after_first["POST /mcp initialize"], 1, "{after_first}");
    assert_eq!(
        after_first["DELETE /mcp"], 1,
        "the probe's session is closed"
    );
    assert_eq!(
        after_first.get("GET /mcp"),
        None,
        "the probe opens no standalone stream: {after_first}"
    );
    // The second probe costs the upstream nothing.
    let again = prober
        .era(&target, UpstreamEra::Auto, OnBehalf::default())
        .await
        .expect("cached");
    assert_eq!(again, era);
    assert_eq!(py.stats().await, after_first);
    assert_eq!(prober.probes(), 1);

    let sse = PyServer::spawn("sse");
    let target = http_target(&sse.url("/sse"));
    assert_eq!(
        prober
            .era(&target, UpstreamEra::Auto, OnBehalf::default())
            .await
            .expect("probed"),
        Era::Legacy(LegacyTransport::HttpSse)
    );
    let stats = sse.stats().await;
    assert_eq!(stats["GET /sse"], 1, "{stats}");

    // era = "legacy" skips the modern request but still finds the transport.
    let plain = PyServer::spawn("streamable-http");
    let t = http_target(&plain.url("/mcp"));
    let fresh = EraProber::default();
    assert_eq!(
        fresh
            .era(&t, UpstreamEra::Legacy, OnBehalf::default())
            .await
            .unwrap(),
        Era::Legacy(LegacyTransport::StreamableHttp)
    );
    assert_eq!(plain.count("POST /mcp server/discover").await, 0);

    let stdio = stdio_target();
    assert_eq!(
        prober
            .era(&stdio, UpstreamEra::Auto, OnBehalf::default())
            .await
            .expect("probed"),
        Era::Legacy(LegacyTransport::Stdio)
    );
    assert_eq!(prober.probes(), 3);
}

#[tokio::test]
async fn a_failed_assumption_is_probed_again() {
    // A modern server first, remembered as modern…
    let dir = tempdir();
    let serve = Dualera::spawn(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--demo",
        dir.path().to_str().unwrap(),
    ]);
    let addr = serve.addr("modern server");
    let url = format!("http://{addr}/mcp");
    let prober = EraProber::default();
    let target = http_target(&url);
    assert_eq!(
        prober
            .era(&target, UpstreamEra::Auto, OnBehalf::default())
            .await
            .unwrap(),
        Era::Modern
    );
    drop(serve);
    // …then a legacy one on the same address: the next modern request is answered the
    // legacy way, which refutes the remembered era.
    let py = PyServer::spawn_on("streamable-http", addr.port());
    let (status, _, body) = http(
        &url,
        "POST",
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ],
        Some(&json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {} })),
    )
    .await;
    let observed = era::evidence(http::StatusCode::from_u16(status).unwrap(), &body)
        .expect("a 4xx to learn from");
    assert!(observed.is_legacy(), "{status} {body:?}");
    assert_eq!(prober.cached(&target), Some(Era::Modern));
    assert!(prober.refute(&target, observed));
    assert_eq!(prober.cached(&target), None);
    assert_eq!(
        prober
            .era(&target, UpstreamEra::Auto, OnBehalf::default())
            .await
            .unwrap(),
        Era::Legacy(LegacyTransport::StreamableHttp)
    );
    assert_eq!(prober.probes(), 2);
    assert_eq!(py.count("POST /mcp initialize").await, 1);
}

#[tokio::test]
async fn a_streamable_http_session_calls_tools_answers_requests_and_deletes() {
    let py = PyServer::spawn("streamable-http");
    let session = LegacySession::streamable_http(
        client(),
        py.url("/mcp").parse().unwrap(),
        SessionOptions::new(MAX),
    );
    let seen = exercise(&session).await;
    let id = session
        .upstream_session_id()
        .expect("the server assigned an id");
    assert_eq!(
        seen, id,
        "every request carried the server's Mcp-Session-Id"
    );
    // The standalone GET stream was opened after notifications/initialized.
    assert!(py.count("GET /mcp").await >= 1);
    session.close().await;
    assert_eq!(py.count("DELETE /mcp").await, 1);
    assert!(!session.is_alive());
}

#[tokio::test]
async fn a_slow_consumer_loses_nothing_and_the_byte_limit_holds() {
    let py = PyServer::spawn("streamable-http");
    let session = LegacySession::streamable_http(
        client(),
        py.url("/mcp").parse().unwrap(),
        SessionOptions::new(16 * 1024),
    );
    era::handshake(&session, STEP).await.expect("handshake");
    // Five times the inbound queue, while nobody reads: the reader waits, nothing is
    // dropped, order is kept.
    let n = 320;
    session
        .send(&call(1, "chatter", json!({ "n": n })), OnBehalf::default())
        .await
        .expect("sent");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lines = Vec::new();
    let done = loop {
        match next(&session).await {
            Message::Notification(note) if note.method == "notifications/message" => {
                lines.push(note.params.unwrap()["data"].as_str().unwrap().to_owned());
            }
            Message::Response(r) => break r,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(text_of(&done), n.to_string());
    let want: Vec<String> = (0..n).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, want);
    // A message over the session's byte limit is an error on the stream, not a
    // buffer that grows; the session goes on.
    session
        .send(
            &call(2, "big", json!({ "n": 64 * 1024 })),
            OnBehalf::default(),
        )
        .await
        .expect("sent");
    let item = tokio::time::timeout(WAIT, session.recv())
        .await
        .expect("in time")
        .expect("open");
    let e = item.expect_err("over the limit");
    assert!(e.to_string().contains("larger than"), "{e}");
    session
        .send(
            &call(3, "add", json!({ "a": 1, "b": 2 })),
            OnBehalf::default(),
        )
        .await
        .expect("sent");
    assert_eq!(text_of(&response(&session, 3).await), "3");
    session.close().await;
}

#[tokio::test]
async fn a_404_is_reported_as_an_expired_session() {
    let py = PyServer::spawn("streamable-http");
    let session = LegacySession::streamable_http(
        client(),
        py.url("/mcp").parse().unwrap(),
        SessionOptions::new(MAX),
    );
    era::handshake(&session, STEP).await.expect("handshake");
    let id = session.upstream_session_id().expect("id");
    // The server forgets the session (ended by someone else).
    let (status, _, _) = http(
        &py.url("/mcp"),
        "DELETE",
        &[
            ("mcp-session-id", id.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        None,
    )
    .await;
    assert_eq!(status, 200);
    let e = session
        .send(
            &call(7, "add", json!({ "a": 1, "b": 1 })),
            OnBehalf::default(),
        )
        .await
        .expect_err("the server no longer knows the session");
    assert!(matches!(e, LegacyError::Expired), "{e:?}");
    assert!(e.needs_new_session());
    assert!(!session.is_alive());
}

#[tokio::test]
async fn an_http_sse_session_calls_tools_and_answers_requests() {
    let py = PyServer::spawn("sse");
    let session = LegacySession::http_sse(
        client(),
        py.url("/sse").parse().unwrap(),
        SessionOptions::new(MAX),
    )
    .await
    .expect("endpoint event");
    assert_eq!(session.transport(), LegacyTransport::HttpSse);
    let endpoint = session.upstream_session_id().expect("the endpoint");
    assert!(endpoint.starts_with(&py.url("/messages/")), "{endpoint}");
    exercise(&session).await;
    session.close().await;
    assert!(py.count("POST /messages/ tools/call").await >= 3);
}

#[tokio::test]
async fn a_stdio_session_calls_tools_and_answers_requests() {
    // Opened the way a driver opens one: from the route's target and the probed era.
    let session = LegacySession::open(&stdio_target(), LegacyTransport::Stdio, None)
        .await
        .expect("spawned");
    assert!(
        LegacySession::open(&stdio_target(), LegacyTransport::HttpSse, None)
            .await
            .is_err(),
        "a stdio command has no HTTP transport"
    );
    assert_eq!(exercise(&session).await, "stdio");
    session.ping(STEP).await.expect("the child answers pings");
    session.close().await;
    assert!(!session.is_alive());
}

async fn open_streamable(
    url: String,
    authorization: Option<HeaderValue>,
) -> Result<LegacySession, LegacyError> {
    let session = LegacySession::streamable_http(
        client(),
        url.parse().unwrap(),
        SessionOptions {
            authorization,
            ..SessionOptions::new(MAX)
        },
    );
    era::handshake_as(&session, &json!({ "elicitation": {} }), STEP).await?;
    Ok(session)
}

/// An opener that must not run (the pool reuses a session, or refuses first).
async fn must_not_open() -> Result<LegacySession, LegacyError> {
    panic!("a session was opened where none should be")
}

/// The session id the server sees on a `session_id` call through `session`.
async fn server_side_id(session: &LegacySession, id: i64) -> String {
    session
        .send(&call(id, "session_id", json!({})), OnBehalf::default())
        .await
        .expect("sent");
    text_of(&response(session, id).await)
}

#[tokio::test]
async fn two_keys_never_share_an_upstream_session() {
    let py = PyServer::spawn("streamable-http");
    let url = py.url("/mcp");
    let pool = SessionPool::new(PoolLimits::default());
    let caps = json!({ "elicitation": {} });
    let alice = HeaderValue::from_static("Bearer alice-token");
    let bob = HeaderValue::from_static("Bearer bob-token");
    let ka = PoolKey::new(Some(&alice), &caps, &url);
    let kb = PoolKey::new(Some(&bob), &caps, &url);
    let a = pool
        .acquire(&ka, || open_streamable(url.clone(), Some(alice.clone())))
        .await
        .expect("alice's session");
    let b = pool
        .acquire(&kb, || open_streamable(url.clone(), Some(bob.clone())))
        .await
        .expect("bob's session");
    let id_a = server_side_id(&a, 1).await;
    let id_b = server_side_id(&b, 1).await;
    assert_ne!(id_a, id_b, "one upstream session per key");
    // Each session carries its own principal's credentials, and only those.
    for (session, token) in [(&a, "Bearer alice-token"), (&b, "Bearer bob-token")] {
        session
            .send(&call(9, "authorization", json!({})), OnBehalf::default())
            .await
            .expect("sent");
        assert_eq!(text_of(&response(session, 9).await), token);
    }
    assert_eq!(Some(id_a.clone()), a.upstream_session_id());
    drop(a);
    // The same key finds its own session again; other capabilities get another.
    let again = pool.acquire(&ka, must_not_open).await.expect("reused");
    assert_eq!(server_side_id(&again, 2).await, id_a);
    let kc = PoolKey::new(Some(&alice), &json!({}), &url);
    let c = pool
        .acquire(&kc, || open_streamable(url.clone(), Some(alice.clone())))
        .await
        .expect("other capabilities");
    let id_c = server_side_id(&c, 1).await;
    assert!(id_c != id_a && id_c != id_b);
    assert_eq!(pool.len(), 3);
    assert_eq!(py.count("POST /mcp initialize").await, 3);
    pool.close_all().await;
    assert_eq!(py.count("DELETE /mcp").await, 3);
}

#[tokio::test]
async fn concurrent_acquisitions_of_one_key_share_one_opening() {
    let py = PyServer::spawn("streamable-http");
    let url = py.url("/mcp");
    let pool = SessionPool::new(PoolLimits::default());
    let key = PoolKey::new(None, &json!({}), &url);
    let (a, b, c) = tokio::join!(
        pool.acquire(&key, || open_streamable(url.clone(), None)),
        pool.acquire(&key, || open_streamable(url.clone(), None)),
        pool.acquire(&key, || open_streamable(url.clone(), None)),
    );
    let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
    let id = a.upstream_session_id();
    assert!(id.is_some());
    assert_eq!(b.upstream_session_id(), id);
    assert_eq!(c.upstream_session_id(), id);
    assert_eq!(pool.len_of(&key), 1);
    assert_eq!(py.count("POST /mcp initialize").await, 1);
}

#[tokio::test]
async fn the_bounds_refuse_clearly() {
    let py = PyServer::spawn("streamable-http");
    let url = py.url("/mcp");
    let pool = SessionPool::new(PoolLimits {
        max_sessions: 2,
        max_per_key: 1,
        ..PoolLimits::default()
    });
    let key = |t: &'static str| PoolKey::new(Some(&HeaderValue::from_static(t)), &json!({}), &url);
    let _a = pool
        .open(&key("Bearer a"), || open_streamable(url.clone(), None))
        .await
        .expect("first");
    let e = pool
        .open(&key("Bearer a"), must_not_open)
        .await
        .expect_err("per key");
    assert!(matches!(e, LegacyError::TooManyForKey { max: 1 }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "Too many upstream sessions for this caller; end one or try again later (limit 1)"
    );
    let _b = pool
        .open(&key("Bearer b"), || open_streamable(url.clone(), None))
        .await
        .expect("second key");
    let e = pool
        .open(&key("Bearer c"), must_not_open)
        .await
        .expect_err("in total");
    assert_eq!(
        e.to_string(),
        "Too many upstream sessions; try again later (limit 2)"
    );
    assert_eq!(pool.stats().refused, 2);
    // A session that failed to open gives its place back.
    let failed = pool
        .open(&key("Bearer c"), || async {
            Err(LegacyError::Closed { detail: "x".into() })
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(pool.len(), 2);
    assert_eq!(py.count("POST /mcp initialize").await, 2);
}

#[tokio::test]
async fn idle_sessions_are_pinged_then_closed() {
    let py = PyServer::spawn("streamable-http");
    let url = py.url("/mcp");
    let pool = SessionPool::new(PoolLimits {
        idle: Duration::from_millis(1500),
        ping_interval: Duration::from_millis(200),
        ..PoolLimits::default()
    });
    let key = PoolKey::new(None, &json!({}), &url);
    let lease = pool
        .acquire(&key, || open_streamable(url.clone(), None))
        .await
        .expect("opened");
    drop(lease);
    tokio::time::sleep(Duration::from_millis(400)).await;
    pool.sweep().await;
    assert_eq!(pool.stats().pings, 1, "a quiet session is pinged");
    assert_eq!(py.count("POST /mcp ping").await, 1);
    assert_eq!(pool.len(), 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    pool.sweep().await;
    assert_eq!(pool.stats().idle_closed, 1);
    assert!(pool.is_empty());
    assert_eq!(py.count("DELETE /mcp").await, 1);
}

#[tokio::test]
async fn a_legacy_host_passes_straight_through_to_a_legacy_upstream() {
    let py = PyServer::spawn("streamable-http");
    let gw = Dualera::spawn(&[
        "gateway",
        "--upstream",
        &py.url("/mcp"),
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    let addr = gw.addr("gateway");
    let admin = gw.addr("admin");
    // The readiness prober found the era (auto): /readyz names the legacy upstream.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (status, _, body) = http(&format!("http://{admin}/readyz"), "GET", &[], None).await;
        let text = String::from_utf8_lossy(&body).into_owned();
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
    let url = format!("http://{addr}/mcp");
    let json_headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let (status, headers, body) = http(
        &url,
        "POST",
        &json_headers,
        Some(
            &json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": { "name": "legacy-host", "version": "1" } } }),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body:?}");
    let init = rpc_of(&body);
    // The upstream's own answer, untranslated.
    assert_eq!(init["result"]["serverInfo"]["name"], "legacy-fixture");
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("the upstream's session id, relayed")
        .to_owned();
    let with_session = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let (status, _, _) = http(
        &url,
        "POST",
        &with_session,
        Some(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })),
    )
    .await;
    assert_eq!(status, 202);
    let (status, _, body) = http(
        &url,
        "POST",
        &with_session,
        Some(&json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": "session_id", "arguments": {} } })),
    )
    .await;
    assert_eq!(status, 200);
    let msg = rpc_of(&body);
    assert_eq!(msg["result"]["content"][0]["text"], session.as_str());
    let (status, _, _) = http(&url, "DELETE", &with_session[2..], None).await;
    assert_eq!(status, 200);
    let stats = py.stats().await;
    // The gateway's probe (discover, initialize, DELETE; readiness adds discovers) and
    // the host's session, each request once: nothing translated, nothing added.
    assert!(
        stats["POST /mcp server/discover"].as_u64() >= Some(1),
        "{stats}"
    );
    assert_eq!(stats["POST /mcp initialize"], 2, "{stats}");
    assert_eq!(stats["POST /mcp tools/call"], 1, "{stats}");
    assert_eq!(stats["DELETE /mcp"], 2, "{stats}");
    // The session is gone upstream: the host now gets the upstream's 404.
    let (status, _, _) = http(
        &url,
        "POST",
        &with_session,
        Some(&json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/list" })),
    )
    .await;
    assert_eq!(status, 404);

    let (_, _, body) = http(&format!("http://{admin}/metrics"), "GET", &[], None).await;
    let metrics = String::from_utf8_lossy(&body);
    assert!(
        metrics.contains(r#"dualera_upstream_era{route="/mcp",era="legacy"} 1"#),
        "{metrics}"
    );
    // So does the migration report.
    let (_, _, body) = http(&format!("http://{admin}/report"), "GET", &[], None).await;
    let report: Value = serde_json::from_slice(&body).expect("report JSON");
    assert_eq!(
        report["upstreams"]["/mcp"], "legacy upstream (streamable-http)",
        "{report}"
    );
    let (_, _, body) = http(&format!("http://{admin}/report.html"), "GET", &[], None).await;
    assert!(
        String::from_utf8_lossy(&body).contains("<b>/mcp</b> legacy upstream (streamable-http)")
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args(["report", "--admin", &format!("http://{admin}")])
        .output()
        .expect("dualera report ran");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .last()
            .is_some_and(|l| l == "Upstream of /mcp: legacy upstream (streamable-http)"),
        "{table}"
    );
}

#[tokio::test]
async fn the_translating_paths_discover_answered_the_legacy_way_starts_the_probe() {
    // auto, no admin listener (so no readiness prober): the era is not known, the
    // first legacy host goes the translating way, whose server/discover the legacy
    // upstream answers the legacy way; that sends the era probe on, and the host's
    // next initialize passes straight through.
    let py = PyServer::spawn("streamable-http");
    let gw = Dualera::spawn(&[
        "gateway",
        "--upstream",
        &py.url("/mcp"),
        "--listen",
        "127.0.0.1:0",
    ]);
    let url = format!("http://{}/mcp", gw.addr("gateway"));
    let initialize = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "legacy-host", "version": "1" } } });
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    // The first goes the translating way, which this upstream never answers in a
    // form it accepts; it is not waited for.
    let first = tokio::time::timeout(
        Duration::from_secs(3),
        http(&url, "POST", &headers, Some(&initialize)),
    )
    .await;
    if let Ok((status, _, body)) = &first {
        assert!(
            !String::from_utf8_lossy(body).contains("legacy-fixture"),
            "{status}: passed through before any probe"
        );
    }
    let deadline = std::time::Instant::now() + WAIT;
    let mut attempts = 1;
    loop {
        attempts += 1;
        let (status, _, body) = http(&url, "POST", &headers, Some(&initialize)).await;
        let through =
            status == 200 && rpc_of(&body)["result"]["serverInfo"]["name"] == "legacy-fixture";
        if through {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status} {body:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(attempts >= 2);
    // Exactly one probe: its initialize and DELETE, besides the host's initialize.
    assert_eq!(py.count("DELETE /mcp").await, 1);
    assert_eq!(py.count("POST /mcp initialize").await, 2);
}

#[tokio::test]
async fn a_legacy_upstream_replaced_by_a_modern_one_is_probed_again() {
    // auto with the readiness prober: the era is known (legacy) before any host comes.
    let py = PyServer::spawn("streamable-http");
    let port = py.port;
    let gw = Dualera::spawn(&[
        "gateway",
        "--upstream",
        &py.url("/mcp"),
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    let url = format!("http://{}/mcp", gw.addr("gateway"));
    let admin = gw.addr("admin");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, _, body) = http(&format!("http://{admin}/readyz"), "GET", &[], None).await;
        if String::from_utf8_lossy(&body).contains("legacy upstream (streamable-http)): ready") {
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The legacy server goes; a modern one takes its address.
    drop(py);
    let dir = tempdir();
    let _serve = Dualera::spawn(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--demo",
        dir.path().to_str().unwrap(),
    ]);
    let initialize = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "legacy-host", "version": "1" } } });
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    // The first initialize still passes through (legacy was remembered) and the
    // modern server refuses it; that sends the probe on, and a later initialize is
    // translated for the modern upstream.
    let deadline = std::time::Instant::now() + WAIT;
    let mut refused = 0;
    loop {
        let (status, _, body) = http(&url, "POST", &headers, Some(&initialize)).await;
        if status == 200 {
            let msg = rpc_of(&body);
            assert!(msg["result"]["protocolVersion"].is_string(), "{msg}");
            break;
        }
        refused += 1;
        assert!(std::time::Instant::now() < deadline, "{status} {body:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(refused >= 1, "the remembered era was used first");
    // The readiness prober's next pass shows the new era.
    loop {
        let (_, _, body) = http(&format!("http://{admin}/metrics"), "GET", &[], None).await;
        let metrics = String::from_utf8_lossy(&body).into_owned();
        if metrics.contains(r#"dualera_upstream_era{route="/mcp",era="modern"} 1"#) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn era_modern_probes_nothing_and_a_bad_era_is_refused() {
    // era = "modern": taken at its word; readiness probes server/discover only.
    let py = PyServer::spawn("streamable-http");
    let gw = Dualera::spawn(&[
        "gateway",
        "--upstream",
        &py.url("/mcp"),
        "--upstream-era",
        "modern",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    let admin = gw.addr("admin");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, _, body) = http(&format!("http://{admin}/metrics"), "GET", &[], None).await;
        let metrics = String::from_utf8_lossy(&body).into_owned();
        if metrics.contains(r#"dualera_upstream_era{route="/mcp",era="modern"} 1"#) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The (legacy) upstream answers the discover the legacy way: not ready, and no
    // legacy session was ever opened to find out more.
    let (status, _, body) = http(&format!("http://{admin}/readyz"), "GET", &[], None).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(py.count("POST /mcp server/discover").await >= 1);
    assert_eq!(py.count("POST /mcp initialize").await, 0);

    let bad = Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args([
            "gateway",
            "--upstream",
            "http://127.0.0.1:1/mcp",
            "--upstream-era",
            "sometimes",
        ])
        .output()
        .expect("ran");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("not an upstream era"), "{stderr}");
}

/// A directory of its own for one test's workspace, removed when the test ends.
fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dualera-legacy-upstream-")
        .tempdir()
        .expect("temp dir")
}
