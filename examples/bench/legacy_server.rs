//! `bench legacy-server`: a small session-based (2025-11-25 Streamable HTTP) MCP server,
//! the legacy peer of the `reverse` scenario. A Python or Node server would spend more
//! per request than the gateway does and make the ratios say nothing about it; this one
//! costs a few microseconds a call, so what a ratio shows is the path in front of it.
//!
//! It answers `initialize` (a new `Mcp-Session-Id`), `notifications/initialized`,
//! `ping`, `tools/list` and `tools/call` for two tools: `echo` (a JSON answer at once)
//! and `ask` (an SSE answer: one `elicitation/create` on the call's stream, then, once
//! the client's answer arrives as a POST on the session, the result `answered: X`).
//! The standalone GET stream is 405. Loopback only; sessions, bodies and waits are
//! bounded; it runs until killed.

use crate::*;
use http::Response;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Sessions it keeps at most (a new `initialize` past it is refused with 503).
const MAX_SESSIONS: usize = 100_000;
/// Largest request body, bytes.
const MAX_BODY: usize = 1 << 20;
/// How long `ask` waits for the client's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// Elicitations waiting for their answer, per session.
const MAX_WAITING: usize = 64;

#[derive(Default)]
struct Session {
    /// Our request id → the `ask` call waiting for the answer.
    waiting: HashMap<String, oneshot::Sender<Value>>,
    next: u64,
}

#[derive(Default)]
struct State {
    sessions: Mutex<HashMap<String, Session>>,
    next_session: AtomicUsize,
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).boxed()
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(
        serde_json::to_vec(body).unwrap_or_default(),
    )));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn status_only(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn sse_event(message: &Value) -> String {
    format!("event: message\ndata: {message}\n\n")
}

/// `bench legacy-server`: serves until killed.
pub(crate) fn legacy_server_main() -> Res<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        eprintln!(
            "legacy server listening on http://{}/mcp",
            listener.local_addr()?
        );
        let state = Arc::new(State::default());
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, std::convert::Infallible>(serve(&state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
        #[allow(unreachable_code)]
        Ok::<_, BoxError>(())
    })
}

async fn serve(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match *req.method() {
        http::Method::POST => {}
        http::Method::DELETE => {
            if let (Some(s), Ok(mut map)) = (&session, state.sessions.lock()) {
                map.remove(s);
            }
            return status_only(StatusCode::OK);
        }
        _ => return status_only(StatusCode::METHOD_NOT_ALLOWED),
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return status_only(StatusCode::PAYLOAD_TOO_LARGE),
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &error(&Value::Null, -32700, "Parse error"),
        );
    };
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let Some(session) = session else {
        if method != "initialize" {
            return json_response(
                StatusCode::BAD_REQUEST,
                &error(&id, -32000, "Bad Request: Missing session ID"),
            );
        }
        let Ok(mut map) = state.sessions.lock() else {
            return status_only(StatusCode::INTERNAL_SERVER_ERROR);
        };
        if map.len() >= MAX_SESSIONS {
            return status_only(StatusCode::SERVICE_UNAVAILABLE);
        }
        let sid = format!(
            "bench-{}",
            state.next_session.fetch_add(1, Ordering::Relaxed)
        );
        map.insert(sid.clone(), Session::default());
        let version = message
            .pointer("/params/protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| ["2025-03-26", "2025-06-18", LEGACY].contains(v))
            .unwrap_or(LEGACY);
        let mut r = json_response(
            StatusCode::OK,
            &json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench-legacy", "version": "1"}
            }}),
        );
        r.headers_mut().insert("mcp-session-id", hv(&sid));
        return r;
    };
    if !state
        .sessions
        .lock()
        .is_ok_and(|m| m.contains_key(&session))
    {
        return json_response(
            StatusCode::NOT_FOUND,
            &error(&id, -32001, "Session not found"),
        );
    }
    if method.is_empty() {
        // The client's answer to one of our requests.
        if let Some(our) = message.get("id").and_then(Value::as_str) {
            let waiter = state
                .sessions
                .lock()
                .ok()
                .and_then(|mut m| m.get_mut(&session).and_then(|s| s.waiting.remove(our)));
            if let Some(w) = waiter {
                let _ = w.send(message);
            }
        }
        return status_only(StatusCode::ACCEPTED);
    }
    if message.get("id").is_none() {
        return status_only(StatusCode::ACCEPTED);
    }
    match method {
        "ping" => json_response(
            StatusCode::OK,
            &json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        ),
        "tools/list" => json_response(
            StatusCode::OK,
            &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
                {"name": "echo", "description": "Echoes its text", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
                {"name": "ask", "description": "Asks the client one question", "inputSchema": {"type": "object", "properties": {"question": {"type": "string"}}}}
            ]}}),
        ),
        "tools/call" => {
            let name = message
                .pointer("/params/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            match name {
                "echo" => {
                    let text = message
                        .pointer("/params/arguments/text")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    json_response(
                        StatusCode::OK,
                        &json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}}),
                    )
                }
                "ask" => ask(state, &session, id, &message),
                _ => json_response(StatusCode::OK, &error(&id, -32602, "Unknown tool")),
            }
        }
        _ => json_response(StatusCode::OK, &error(&id, -32601, "Method not found")),
    }
}

/// `ask`: the elicitation on the call's SSE stream, then the result once answered.
fn ask(state: &Arc<State>, session: &str, id: Value, message: &Value) -> Response<Body> {
    let question = message
        .pointer("/params/arguments/question")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let (tx, rx) = oneshot::channel();
    let ours = {
        let Ok(mut map) = state.sessions.lock() else {
            return status_only(StatusCode::INTERNAL_SERVER_ERROR);
        };
        let Some(s) = map.get_mut(session) else {
            return status_only(StatusCode::NOT_FOUND);
        };
        if s.waiting.len() >= MAX_WAITING {
            return json_response(StatusCode::OK, &error(&id, -32603, "Too many questions"));
        }
        s.next += 1;
        let ours = format!("ask-{}", s.next);
        s.waiting.insert(ours.clone(), tx);
        ours
    };
    let elicit = json!({"jsonrpc": "2.0", "id": ours, "method": "elicitation/create", "params": {
        "mode": "form", "message": question,
        "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    }});
    // The stream's two events: the elicitation now, the result once answered.
    let (frames, events) = tokio::sync::mpsc::channel::<Bytes>(2);
    let _ = frames.try_send(Bytes::from(sse_event(&elicit)));
    let state = state.clone();
    let session = session.to_owned();
    tokio::spawn(async move {
        let result = match tokio::time::timeout(ANSWER_WAIT, rx).await {
            Ok(Ok(reply)) => {
                let text = reply
                    .pointer("/result/content/answer")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": format!("answered: {text}")}]}})
            }
            _ => {
                if let Ok(mut m) = state.sessions.lock() {
                    if let Some(s) = m.get_mut(&session) {
                        s.waiting.remove(&ours);
                    }
                }
                error(&id, -32603, "No answer")
            }
        };
        let _ = frames.send(Bytes::from(sse_event(&result))).await;
    });
    let stream = futures_util::stream::unfold(events, |mut events| async move {
        events
            .recv()
            .await
            .map(|b| (Ok(hyper::body::Frame::data(b)), events))
    });
    let mut r = Response::new(http_body_util::StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}
