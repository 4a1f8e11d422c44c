//! The reverse bridge over real sockets: the gateway binary (`--upstream-era legacy`)
//! in front of the official Python SDK's FastMCP server (mcp 1.30.0,
//! `tests/interop/py/legacy_server.py`) over Streamable HTTP, the modern host being
//! raw 2026-07-28 HTTP requests from this test.
//!
//! - `server/discover` is answered from the legacy `initialize` result;
//! - a plain `tools/call` is `complete`;
//! - an elicitation, a sampling request and a roots request of the server during a
//!   call become `input_required` rounds whose retries complete with the server's
//!   result reflecting the answer;
//! - the session's first call waits for the standalone GET stream, the only one a
//!   server's request that names no call comes on;
//! - a tampered, replayed or foreign `requestState` is `-32602`;
//! - two tokens never share an upstream session (the server's own `Mcp-Session-Id`s),
//!   and the token reaches the server on the session it opened;
//! - two calls in progress on one legacy session each get their own server request;
//! - a malformed modern request gets the modern server's error, never the legacy
//!   server's answer.
//!
//! The Python peer lives in the interop suite's venv. Without it these tests fail (they
//! never skip); `python3 tests/interop/run.py --prepare-legacy-python` creates it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

#[path = "common/legacy_server.rs"]
mod legacy_server;
use legacy_server::{stdio_command, Proc, PyServer};

/// `dualera gateway --upstream-era legacy` in front of `upstream`.
struct Gateway {
    _proc: Proc,
    addr: SocketAddr,
}

impl Gateway {
    fn spawn(upstream: &str) -> Self {
        Self::spawn_with("--upstream", upstream)
    }

    /// In front of a command's stdio (`--upstream-cmd`).
    fn spawn_cmd(cmd: &str) -> Self {
        Self::spawn_with("--upstream-cmd", cmd)
    }

    fn spawn_with(flag: &str, upstream: &str) -> Self {
        Self::spawn_args(&[flag, upstream])
    }

    /// With these arguments besides the era and the listener.
    fn spawn_args(args: &[&str]) -> Self {
        Self::spawn_era("legacy", args)
    }

    /// With `--upstream-era era` and these arguments besides the listener.
    fn spawn_era(era: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
            .arg("gateway")
            .args(args)
            .args(["--upstream-era", era, "--listen", "127.0.0.1:0"])
            .env("DUALERA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dualera");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let marker = "gateway listening on http://";
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split(marker).nth(1) {
                    let a = rest.split('/').next().unwrap_or("");
                    if let Ok(a) = a.parse::<SocketAddr>() {
                        let _ = tx.send(a);
                    }
                }
            }
        });
        let proc = Proc(child);
        let addr = rx.recv_timeout(WAIT).expect("the gateway's listening line");
        Self { _proc: proc, addr }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// The `_meta` of a modern host declaring every client capability.
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "elicitation": { "form": {} },
            "sampling": {},
            "roots": {}
        },
        "io.modelcontextprotocol/clientInfo": { "name": "modern-host", "version": "1" }
    })
}

/// One 2026-07-28 request (no session); the HTTP status and the JSON-RPC answer.
async fn post(url: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let (status, content_type, bytes) = post_raw(url, token, body).await;
    assert_eq!(content_type, "application/json");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("a JSON answer, got {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// One 2026-07-28 request; the HTTP status, content type and body.
async fn post_raw(url: &str, token: Option<&str>, body: &Value) -> (u16, String, Bytes) {
    post_version(url, token, "2026-07-28", body).await
}

/// One request with `version` as its `MCP-Protocol-Version` header.
async fn post_version(
    url: &str,
    token: Option<&str>,
    version: &str,
    body: &Value,
) -> (u16, String, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut b = http::Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version);
    if let Some(method) = body["method"].as_str() {
        b = b.header("mcp-method", method);
    }
    // The routing name a 2026-07-28 host sends with a call, a prompt or a read.
    let params = &body["params"];
    if let Some(name) = params["name"].as_str().or(params["uri"].as_str()) {
        b = b.header("mcp-name", name);
    }
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = b
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answered in time")
        .expect("request sent");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, content_type, bytes)
}

fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": meta() } })
}

/// `call` as a retry: the round's answers and its state.
fn retry(id: i64, name: &str, arguments: Value, responses: Value, state: &str) -> Value {
    let mut v = call(id, name, arguments);
    v["params"]["inputResponses"] = responses;
    v["params"]["requestState"] = json!(state);
    v
}

/// The `inputResponses` answering the sampling request `key` with the model's `text`.
fn sampling_answer(key: &str, text: &str) -> Value {
    json!({ key: {
        "role": "assistant",
        "content": { "type": "text", "text": text },
        "model": "test-model",
        "stopReason": "endTurn"
    } })
}

/// The text of a complete `tools/call` result.
fn text(answer: &Value) -> String {
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("text content in {answer}"))
        .to_owned()
}

/// The one input request of an `input_required` answer: its key, method and params,
/// and the round's `requestState`.
fn round(answer: &Value) -> (String, String, Value, String) {
    let result = &answer["result"];
    assert_eq!(result["resultType"], "input_required", "{answer}");
    let requests = result["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{answer}");
    let (key, request) = requests.iter().next().expect("one input request");
    let state = result["requestState"].as_str().expect("requestState");
    (
        key.clone(),
        request["method"].as_str().unwrap_or_default().to_owned(),
        request["params"].clone(),
        state.to_owned(),
    )
}

#[tokio::test]
async fn discover_comes_from_the_legacy_initialize_and_a_plain_call_completes() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let (status, discover) = post(
        &gw.url(),
        None,
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": meta() } }),
    )
    .await;
    assert_eq!(status, 200, "{discover}");
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete", "{discover}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "legacy-fixture",
        "{discover}"
    );
    assert_eq!(result["instructions"], "A legacy fixture server.");
    assert!(result["capabilities"]["tools"].is_object(), "{discover}");
    assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));

    let (status, added) = post(&gw.url(), None, &call(2, "add", json!({ "a": 2, "b": 3 }))).await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(added["id"], 2);
    assert_eq!(text(&added), "5");

    let (_, listed) = post(
        &gw.url(),
        None,
        &json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": { "_meta": meta() } }),
    )
    .await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"ask") && names.contains(&"add"), "{listed}");
}

#[tokio::test]
async fn an_elicitation_becomes_a_round_and_the_retry_completes_with_the_answer() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let args = json!({ "question": "Favourite colour?" });
    let (status, first) = post(&gw.url(), Some("alpha"), &call(1, "ask", args.clone())).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["id"], 1);
    let (key, method, params, state) = round(&first);
    assert_eq!(method, "elicitation/create");
    assert_eq!(params["message"], "Favourite colour?", "{first}");
    assert!(
        params["requestedSchema"]["properties"]["answer"].is_object(),
        "{first}"
    );

    // A tampered state: the integrity check refuses it.
    let mut tampered = state.clone();
    let at = tampered.len() / 3;
    let c = if tampered.as_bytes()[at] == b'A' {
        "B"
    } else {
        "A"
    };
    tampered.replace_range(at..=at, c);
    let answer = json!({ key.clone(): { "action": "accept", "content": { "answer": "blue" } } });
    let (status, refused) = post(
        &gw.url(),
        Some("alpha"),
        &retry(2, "ask", args.clone(), answer.clone(), &tampered),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(refused["id"], 2);

    // The state of this call on another call's arguments: refused as well.
    let (_, foreign) = post(
        &gw.url(),
        Some("alpha"),
        &retry(
            3,
            "ask",
            json!({ "question": "Other?" }),
            answer.clone(),
            &state,
        ),
    )
    .await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");

    // The real retry: the parked request is answered, the server's result returns.
    let (status, done) = post(
        &gw.url(),
        Some("alpha"),
        &retry(4, "ask", args.clone(), answer.clone(), &state),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["id"], 4);
    assert_eq!(text(&done), "answered: blue");

    // The same round again (a replay): nothing waits for it.
    let (_, replay) = post(
        &gw.url(),
        Some("alpha"),
        &retry(5, "ask", args, answer, &state),
    )
    .await;
    assert_eq!(replay["error"]["code"], -32602, "{replay}");
}

#[tokio::test]
async fn sampling_and_roots_requests_become_rounds_too() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let args = json!({ "prompt": "Say hi" });
    let (_, first) = post(&gw.url(), None, &call(1, "sample", args.clone())).await;
    let (key, method, params, state) = round(&first);
    assert_eq!(method, "sampling/createMessage");
    assert_eq!(
        params["messages"][0]["content"]["text"], "Say hi",
        "{first}"
    );
    let sampled = sampling_answer(&key, "hi there");
    let (_, done) = post(&gw.url(), None, &retry(2, "sample", args, sampled, &state)).await;
    assert_eq!(text(&done), "sampled: hi there");

    let (_, first) = post(&gw.url(), None, &call(3, "roots", json!({}))).await;
    let (key, method, _, state) = round(&first);
    assert_eq!(method, "roots/list");
    let roots = json!({ key: { "roots": [
        { "uri": "file:///work", "name": "work" },
        { "uri": "file:///home", "name": "home" }
    ] } });
    let (_, done) = post(
        &gw.url(),
        None,
        &retry(4, "roots", json!({}), roots, &state),
    )
    .await;
    assert_eq!(text(&done), "roots: file:///work,file:///home");
}

/// The Python SDK sends a sampling or roots request made without naming the call it
/// serves on the standalone GET stream only, and drops it while that stream is not
/// open. This server answers each `GET` half a second late: a session whose first call
/// went out before the stream's head came back would lose the request, and the call
/// would never end.
#[tokio::test]
async fn the_first_call_waits_for_the_stream_the_servers_requests_come_on() {
    let py = PyServer::spawn("streamable-http-slow-get");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let args = json!({ "prompt": "Say hi" });
    let (_, first) = tokio::time::timeout(
        Duration::from_secs(10),
        post(&gw.url(), None, &call(1, "sample", args.clone())),
    )
    .await
    .expect(
        "the sampling request reached the host (the call went out before the stream was open?)",
    );
    let (key, method, _, state) = round(&first);
    assert_eq!(method, "sampling/createMessage");
    let sampled = sampling_answer(&key, "late");
    let (_, done) = post(&gw.url(), None, &retry(2, "sample", args, sampled, &state)).await;
    assert_eq!(text(&done), "sampled: late");
}

#[tokio::test]
async fn two_tokens_never_share_an_upstream_session() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let session_of = |token: &'static str, id: i64| {
        let url = gw.url();
        async move {
            let (_, answer) = post(&url, Some(token), &call(id, "session_id", json!({}))).await;
            text(&answer)
        }
    };
    let alpha = session_of("alpha", 1).await;
    let beta = session_of("beta", 2).await;
    assert!(!alpha.is_empty() && !beta.is_empty(), "{alpha:?} {beta:?}");
    assert_ne!(alpha, beta, "two tokens, one upstream session");
    // Each token keeps its own session.
    assert_eq!(session_of("alpha", 3).await, alpha);
    assert_eq!(session_of("beta", 4).await, beta);
    // The host's credentials reach the server on the session opened for them.
    for token in ["alpha", "beta"] {
        let (_, answer) = post(&gw.url(), Some(token), &call(5, "authorization", json!({}))).await;
        assert_eq!(text(&answer), format!("Bearer {token}"));
    }
    // A round of one token cannot be answered with the other's credentials.
    let args = json!({ "question": "Who?" });
    let (_, first) = post(&gw.url(), Some("alpha"), &call(6, "ask", args.clone())).await;
    let (key, _, _, state) = round(&first);
    let answer = json!({ key: { "action": "accept", "content": { "answer": "x" } } });
    let (status, stolen) = post(
        &gw.url(),
        Some("beta"),
        &retry(7, "ask", args.clone(), answer.clone(), &state),
    )
    .await;
    assert_eq!(status, 400, "{stolen}");
    assert_eq!(stolen["error"]["code"], -32602, "{stolen}");
    let (_, done) = post(
        &gw.url(),
        Some("alpha"),
        &retry(8, "ask", args, answer, &state),
    )
    .await;
    assert_eq!(text(&done), "answered: x");
}

#[tokio::test]
async fn log_notifications_before_the_result_make_an_sse_answer() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let mut request = call(1, "chatter", json!({ "n": 3 }));
    request["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let (status, content_type, body) = post_raw(&gw.url(), None, &request).await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let text_body = String::from_utf8_lossy(&body).into_owned();
    let messages: Vec<Value> = text_body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).expect("JSON event"))
        .collect();
    let (last, before) = messages.split_last().expect("events");
    assert_eq!(before.len(), 3, "{text_body}");
    for (i, n) in before.iter().enumerate() {
        assert_eq!(n["method"], "notifications/message", "{n}");
        assert_eq!(n["params"]["data"], format!("line {i}"), "{n}");
    }
    assert_eq!(last["id"], 1);
    assert_eq!(text(last), "3");

    // Without a log level the same call is answered with JSON alone.
    let (status, plain) = post(&gw.url(), None, &call(2, "chatter", json!({ "n": 2 }))).await;
    assert_eq!(status, 200);
    assert_eq!(text(&plain), "2");
}

#[tokio::test]
async fn a_stdio_legacy_upstream_is_bridged_too() {
    let gw = Gateway::spawn_cmd(&stdio_command());
    let (status, discover) = post(
        &gw.url(),
        None,
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": meta() } }),
    )
    .await;
    assert_eq!(status, 200, "{discover}");
    assert_eq!(
        discover["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "legacy-fixture",
        "{discover}"
    );
    let (_, added) = post(
        &gw.url(),
        None,
        &call(2, "add", json!({ "a": 20, "b": 22 })),
    )
    .await;
    assert_eq!(text(&added), "42");
    let args = json!({ "question": "Over a pipe?" });
    let (_, first) = post(&gw.url(), None, &call(3, "ask", args.clone())).await;
    let (key, method, _, state) = round(&first);
    assert_eq!(method, "elicitation/create");
    let answer = json!({ key: { "action": "accept", "content": { "answer": "yes" } } });
    let (_, done) = post(&gw.url(), None, &retry(4, "ask", args, answer, &state)).await;
    assert_eq!(text(&done), "answered: yes");
}

/// Under `auto` (the default) and with no readiness prober to have probed it, the
/// upstream's era is unknown when the first modern host arrives. Its `server/discover`,
/// refused the legacy way (FastMCP's `400 Missing session ID`), is what
/// `basic/versioning.mdx` ("Backward Compatibility") starts era detection with: the
/// gateway probes, finds the legacy server and bridges that very request.
#[tokio::test]
async fn under_auto_a_modern_hosts_first_discover_finds_the_legacy_server() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn_era("auto", &["--upstream", &py.url("/mcp")]);
    discover_finds_the_legacy_fixture(&gw).await;
    assert_eq!(
        py.count("POST /mcp initialize").await,
        2,
        "the probe's and the partition's"
    );
}

/// The same over stdio (`--upstream-cmd`): the server answers the host's
/// `server/discover` with an error that is not a modern one, which on stdio means
/// legacy (2026-07-28 `basic/transports/stdio.mdx`, "Backward Compatibility").
#[tokio::test]
async fn under_auto_a_modern_hosts_first_discover_finds_a_legacy_stdio_server() {
    let gw = Gateway::spawn_era("auto", &["--upstream-cmd", &stdio_command()]);
    discover_finds_the_legacy_fixture(&gw).await;
}

/// A modern host's first `server/discover` under `auto` is bridged to the legacy
/// fixture, and the era is remembered: the next request goes to the bridge at once.
async fn discover_finds_the_legacy_fixture(gw: &Gateway) {
    let (status, discover) = post(
        &gw.url(),
        None,
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": meta() } }),
    )
    .await;
    assert_eq!(status, 200, "{discover}");
    assert_eq!(
        discover["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "legacy-fixture",
        "{discover}"
    );
    let (_, added) = post(
        &gw.url(),
        None,
        &call(2, "add", json!({ "a": 20, "b": 22 })),
    )
    .await;
    assert_eq!(text(&added), "42");
}

#[tokio::test]
async fn a_forgotten_upstream_session_is_opened_again() {
    let py = PyServer::spawn("streamable-http");
    let port = py.port;
    let gw = Gateway::spawn(&py.url("/mcp"));
    let (_, before) = post(&gw.url(), None, &call(1, "session_id", json!({}))).await;
    let before = text(&before);
    // The server restarts on the same address and knows no session any more (a 404
    // to the old id, or the old session's stream ended): the next call is served on
    // a new legacy session.
    drop(py);
    let _py = PyServer::spawn_on("streamable-http", port);
    let (status, after) = post(&gw.url(), None, &call(2, "session_id", json!({}))).await;
    assert_eq!(status, 200, "{after}");
    let after = text(&after);
    assert!(!after.is_empty());
    assert_ne!(before, after);
}

#[tokio::test]
async fn a_host_that_leaves_cancels_its_call_upstream() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    // A call to open the partition's session first, so the one below is in progress
    // upstream when the host leaves.
    let (_, added) = post(&gw.url(), None, &call(1, "add", json!({ "a": 1, "b": 1 }))).await;
    assert_eq!(text(&added), "2");
    assert_eq!(py.count("POST /mcp notifications/cancelled").await, 0);
    let slow = call(2, "wait", json!({ "seconds": 20 }));
    let url = gw.url();
    let left = tokio::time::timeout(Duration::from_millis(700), post_raw(&url, None, &slow));
    assert!(left.await.is_err(), "the slow call answered early");
    // 2025-11-25 basic/utilities/cancellation: the bridge tells the server.
    let deadline = std::time::Instant::now() + WAIT;
    while py.count("POST /mcp notifications/cancelled").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no notifications/cancelled upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The partition goes on serving.
    let (_, added) = post(&gw.url(), None, &call(3, "add", json!({ "a": 2, "b": 2 }))).await;
    assert_eq!(text(&added), "4");
}

#[tokio::test]
async fn a_round_not_retried_in_time_expires_and_is_cancelled_upstream() {
    let py = PyServer::spawn("streamable-http");
    let guard = tempfile::Builder::new()
        .prefix("dualera-reverse-bridge-")
        .tempdir()
        .expect("temp dir");
    let dir = guard.path();
    let config = dir.join("expiry.toml");
    std::fs::write(
        &config,
        "[state]\nttl_ms = 1000\n\n[[state.keys]]\nid = \"k1\"\nsecret = \"0123456789abcdef0123\"\n",
    )
    .expect("config");
    let gw = Gateway::spawn_args(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "--upstream",
        &py.url("/mcp"),
    ]);
    let args = json!({ "question": "Too late?" });
    let (_, first) = post(&gw.url(), None, &call(1, "ask", args.clone())).await;
    let (key, _, _, state) = round(&first);
    // The round lapses: the legacy call is cancelled (2025-11-25
    // basic/utilities/cancellation) and the late retry is refused as expired.
    let deadline = std::time::Instant::now() + WAIT;
    while py.count("POST /mcp notifications/cancelled").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no notifications/cancelled upstream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = json!({ key: { "action": "accept", "content": { "answer": "late" } } });
    let (status, late) = post(&gw.url(), None, &retry(2, "ask", args, answer, &state)).await;
    assert_eq!(status, 400, "{late}");
    assert_eq!(late["error"]["code"], -32602, "{late}");
    assert_eq!(late["error"]["data"]["reason"], "expiredState", "{late}");
}

#[tokio::test]
async fn two_calls_in_progress_on_one_session_each_get_their_own_round() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    // The first call's round stays open (its call in progress upstream) while the
    // second call's server request arrives on the same legacy session: each request
    // came on its own call's response stream, so each call gets its own.
    let (_, first) = post(
        &gw.url(),
        Some("alpha"),
        &call(1, "ask", json!({ "question": "First?" })),
    )
    .await;
    let (key1, _, params1, state1) = round(&first);
    assert_eq!(params1["message"], "First?", "{first}");
    let (_, second) = post(
        &gw.url(),
        Some("alpha"),
        &call(2, "ask", json!({ "question": "Second?" })),
    )
    .await;
    let (key2, _, params2, state2) = round(&second);
    assert_eq!(params2["message"], "Second?", "{second}");

    let answer =
        |key: &str, a: &str| json!({ key: { "action": "accept", "content": { "answer": a } } });
    let (_, done2) = post(
        &gw.url(),
        Some("alpha"),
        &retry(
            3,
            "ask",
            json!({ "question": "Second?" }),
            answer(&key2, "two"),
            &state2,
        ),
    )
    .await;
    assert_eq!(text(&done2), "answered: two");
    let (_, done1) = post(
        &gw.url(),
        Some("alpha"),
        &retry(
            4,
            "ask",
            json!({ "question": "First?" }),
            answer(&key1, "one"),
            &state1,
        ),
    )
    .await;
    assert_eq!(text(&done1), "answered: one");
}

#[tokio::test]
async fn a_malformed_modern_request_gets_the_modern_servers_error() {
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    let refused = |status: u16, bytes: &Bytes| -> (u16, Value) {
        (
            status,
            serde_json::from_slice(bytes).expect("a JSON answer"),
        )
    };

    // No `_meta`: -32602, 400.
    let bare = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {} });
    let (status, _, bytes) = post_version(&gw.url(), None, "2026-07-28", &bare).await;
    let (status, answer) = refused(status, &bytes);
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (400, json!(-32602)),
        "{answer}"
    );
    assert_eq!(answer["id"], 1);

    // `_meta` without the client capabilities: -32602 too.
    let mut partial = call(2, "add", json!({ "a": 1, "b": 2 }));
    partial["params"]["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28" });
    let (status, _, bytes) = post_version(&gw.url(), None, "2026-07-28", &partial).await;
    let (status, answer) = refused(status, &bytes);
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (400, json!(-32602)),
        "{answer}"
    );

    // The header disagrees with `_meta`: -32020.
    let good = call(3, "add", json!({ "a": 1, "b": 2 }));
    let (status, _, bytes) = post_version(&gw.url(), None, "2099-01-01", &good).await;
    let (status, answer) = refused(status, &bytes);
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (400, json!(-32020)),
        "{answer}"
    );

    // A version this gateway does not speak, consistently: -32022 naming 2026-07-28.
    let mut future = call(4, "add", json!({ "a": 1, "b": 2 }));
    future["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let (status, _, bytes) = post_version(&gw.url(), None, "2099-01-01", &future).await;
    let (status, answer) = refused(status, &bytes);
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (400, json!(-32022)),
        "{answer}"
    );
    assert_eq!(answer["error"]["data"]["supported"], json!(["2026-07-28"]));

    // Methods the modern revision removed: -32601, 404, though the legacy server has them.
    for (id, method) in [
        (5, "ping"),
        (6, "initialize"),
        (7, "logging/setLevel"),
        (8, "resources/subscribe"),
    ] {
        let body =
            json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": { "_meta": meta() } });
        let (status, answer) = post(&gw.url(), None, &body).await;
        assert_eq!(
            (status, answer["error"]["code"].clone()),
            (404, json!(-32601)),
            "{method}: {answer}"
        );
        assert_eq!(answer["id"], id);
    }

    // And a well-formed call is still served.
    let (status, answer) = post(&gw.url(), None, &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(text(&answer), "3");
}

#[tokio::test]
async fn a_host_that_reads_late_and_slowly_gets_every_notification_in_order() {
    const N: usize = 2_000;
    const PAD: usize = 4_000;
    let py = PyServer::spawn("streamable-http");
    let gw = Gateway::spawn(&py.url("/mcp"));
    // Padded lines (8 MB in all, more than loopback socket buffers hold) and a small
    // receive buffer: the gateway's queues and the sockets' buffers fill long before
    // the host starts reading.
    let mut request = call(1, "chatter", json!({ "n": N, "pad": PAD }));
    request["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_recv_buffer_size(Some(4096));
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<Bytes>>(connector);
    let req = http::Request::builder()
        .method("POST")
        .uri(gw.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "chatter")
        .body(Full::new(Bytes::from(request.to_string())))
        .expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answered in time")
        .expect("request sent");
    assert_eq!(resp.status(), 200);
    // The host reads nothing for a while, then reads slowly.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut body = resp.into_body();
    let mut text_body = String::new();
    let mut frames = 0u32;
    while let Some(frame) = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("a frame in time")
    {
        if let Ok(data) = frame.expect("frame").into_data() {
            text_body.push_str(&String::from_utf8_lossy(&data));
        }
        frames += 1;
        if frames.is_multiple_of(50) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let messages: Vec<Value> = text_body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).expect("JSON event"))
        .collect();
    let (last, before) = messages.split_last().expect("events");
    assert_eq!(before.len(), N, "notifications received before the result");
    let pad = ".".repeat(PAD);
    for (i, n) in before.iter().enumerate() {
        assert_eq!(n["method"], "notifications/message");
        assert_eq!(
            n["params"]["data"],
            format!("line {i}{pad}"),
            "out of order at {i}"
        );
    }
    assert_eq!(last["id"], 1);
    assert_eq!(text(last), N.to_string());
}
