//! The legacy host over Streamable HTTP (2025-03-26 … 2025-11-25): one POST per
//! message or batch, the session id the bridge mints on `initialize` sent back on
//! every later request with the negotiated `MCP-Protocol-Version`, an optional GET
//! stream, DELETE to end the session. Every response is read to its end in a task of
//! its own: its head, its JSON body or SSE events, and whether an SSE stream ended
//! before the response it was carrying.

use super::observe::{emit, header_pairs, Observed, Sink, MAX_MESSAGE};
use super::sse;
use bytes::Bytes;
use http::{header, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// What one POST carries, so its response can be attributed.
#[derive(Debug, Clone)]
pub(crate) enum Carries {
    /// One request: its stream is `{"request": id}`.
    Request { id: Value, initialize: bool },
    /// A batch: its stream is `{"batch": stand-in}`.
    Batch { stream: Value, has_requests: bool },
    /// Notifications or responses only (or a DELETE): answered by a status, no stream.
    Nothing,
    /// The GET stream.
    Standalone,
}

#[derive(Debug, Default)]
struct State {
    session_id: Option<String>,
    protocol_version: Option<String>,
    /// Headers the vector has the host send (`host_headers`), e.g. `Authorization`.
    extra: Vec<(String, String)>,
}

/// One legacy session over Streamable HTTP.
pub(crate) struct HttpHost {
    name: String,
    url: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    state: Arc<Mutex<State>>,
    sink: Sink,
    tasks: Vec<JoinHandle<()>>,
    standalone: Option<JoinHandle<()>>,
}

impl Drop for HttpHost {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(t) = &self.standalone {
            t.abort();
        }
    }
}

impl HttpHost {
    pub(crate) fn new(name: &str, url: Uri, sink: Sink) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
        Self {
            name: name.to_owned(),
            url,
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build(connector),
            state: Arc::default(),
            sink,
            tasks: Vec::new(),
            standalone: None,
        }
    }

    /// Sets (or, for `None`, stops sending) headers on this session's later requests.
    pub(crate) fn set_headers(&mut self, headers: &[(String, Option<String>)]) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        for (name, value) in headers {
            state.extra.retain(|(n, _)| n != name);
            if let Some(v) = value {
                state.extra.push((name.clone(), v.clone()));
            }
        }
    }

    /// Whether the bridge minted a session id for this session.
    pub(crate) fn session_id(&self) -> Option<String> {
        self.state.lock().ok()?.session_id.clone()
    }

    fn request(
        &self,
        method: Method,
        body: Option<Vec<u8>>,
        accept: &str,
    ) -> Option<Request<Full<Bytes>>> {
        let state = self.state.lock().ok()?;
        let mut b = Request::builder()
            .method(method)
            .uri(self.url.clone())
            .header(header::ACCEPT, accept);
        if body.is_some() {
            b = b.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(id) = &state.session_id {
            b = b.header("mcp-session-id", id.as_str());
        }
        for (name, value) in &state.extra {
            b = b.header(name.as_str(), value.as_str());
        }
        // The header exists from 2025-06-18 on; earlier revisions never send it.
        if let Some(v) = state
            .protocol_version
            .as_deref()
            .filter(|v| *v >= "2025-06-18")
        {
            b = b.header("mcp-protocol-version", v);
        }
        b.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .ok()
    }

    fn spawn(&self, req: Request<Full<Bytes>>, exchange: u64, carries: Carries) -> JoinHandle<()> {
        tokio::spawn(read_response(
            self.client.clone(),
            req,
            self.name.clone(),
            exchange,
            carries,
            self.state.clone(),
            self.sink.clone(),
        ))
    }

    /// POSTs a message or batch; its response is reported as exchange `exchange`.
    pub(crate) fn post(&mut self, exchange: u64, body: &Value, carries: Carries) {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        let Some(req) = self.request(
            Method::POST,
            Some(bytes),
            "application/json, text/event-stream",
        ) else {
            return;
        };
        let task = self.spawn(req, exchange, carries);
        self.tasks.push(task);
    }

    /// Opens the standalone GET stream.
    pub(crate) fn open_standalone(&mut self, exchange: u64) {
        let Some(req) = self.request(Method::GET, None, "text/event-stream") else {
            return;
        };
        let task = self.spawn(req, exchange, Carries::Standalone);
        if let Some(old) = self.standalone.replace(task) {
            old.abort();
        }
    }

    /// Closes the standalone GET stream (drops its connection).
    pub(crate) fn close_standalone(&mut self) {
        if let Some(t) = self.standalone.take() {
            t.abort();
        }
    }

    /// Ends the session with DELETE (when the bridge minted an id).
    pub(crate) fn delete(&mut self, exchange: u64) {
        let Some(req) = self.request(Method::DELETE, None, "application/json, text/event-stream")
        else {
            return;
        };
        let task = self.spawn(req, exchange, Carries::Nothing);
        self.tasks.push(task);
    }
}

fn stream_of(carries: &Carries) -> Value {
    match carries {
        Carries::Request { id, .. } => json!({ "request": id }),
        Carries::Batch { stream, .. } => json!({ "batch": stream }),
        Carries::Nothing | Carries::Standalone => json!("standalone"),
    }
}

async fn read_response(
    client: Client<HttpConnector, Full<Bytes>>,
    req: Request<Full<Bytes>>,
    session: String,
    exchange: u64,
    carries: Carries,
    state: Arc<Mutex<State>>,
    sink: Sink,
) {
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            emit(
                &sink,
                Observed::PeerFailed {
                    exchange,
                    detail: format!("{e:?}"),
                },
            );
            return;
        }
    };
    let status = resp.status().as_u16();
    let headers = header_pairs(resp.headers());
    if let Carries::Request {
        initialize: true, ..
    } = carries
    {
        if let Some(id) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            if let Ok(mut s) = state.lock() {
                s.session_id = Some(id.to_owned());
            }
        }
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let head = |body: Option<Value>| Observed::PeerHead {
        exchange,
        status,
        headers: headers.clone(),
        body,
    };
    let stream = stream_of(&carries);
    let mut body = resp.into_body();
    let mut answered = false;
    let deliver = |value: Value, answered: &mut bool| {
        match (&carries, &value) {
            (Carries::Request { id, initialize }, Value::Object(m)) => {
                let is_response = m.get("method").is_none() && m.get("id") == Some(id);
                if is_response {
                    *answered = true;
                    if *initialize {
                        if let Some(v) = m
                            .get("result")
                            .and_then(|r| r.get("protocolVersion"))
                            .and_then(Value::as_str)
                        {
                            if let Ok(mut s) = state.lock() {
                                s.protocol_version = Some(v.to_owned());
                            }
                        }
                    }
                }
            }
            (Carries::Batch { .. }, Value::Array(_)) => *answered = true,
            _ => {}
        }
        let output = match value {
            Value::Array(items) => json!({"to": "peer", "stream": stream, "batch": items}),
            m => json!({"to": "peer", "stream": stream, "message": m}),
        };
        emit(
            &sink,
            Observed::PeerOutput {
                session: session.clone(),
                output,
            },
        );
    };
    if is_sse {
        emit(&sink, head(None));
        let mut decoder = sse::Decoder::new(MAX_MESSAGE);
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let events = match decoder.feed(data) {
                Ok(e) => e,
                Err(e) => {
                    emit(
                        &sink,
                        Observed::Fault {
                            detail: e.to_string(),
                        },
                    );
                    return;
                }
            };
            for data in events {
                if data.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(&data) {
                    Ok(v) => deliver(v, &mut answered),
                    Err(_) => emit(
                        &sink,
                        Observed::Fault {
                            detail: format!("an SSE event to the host is not JSON: {}", cut(&data)),
                        },
                    ),
                }
            }
        }
        let carries_requests = match &carries {
            Carries::Request { .. } => true,
            Carries::Batch { has_requests, .. } => *has_requests,
            Carries::Nothing | Carries::Standalone => false,
        };
        if carries_requests && !answered {
            emit(&sink, Observed::PeerClose { session, stream });
        }
        return;
    }
    let Ok(collected) = Limited::new(body, MAX_MESSAGE).collect().await else {
        emit(&sink, head(None));
        return;
    };
    let bytes = collected.to_bytes();
    let parsed = serde_json::from_slice::<Value>(&bytes).ok();
    emit(&sink, head(parsed.clone()));
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Some(value) = parsed else {
        if status < 400 {
            emit(
                &sink,
                Observed::Fault {
                    detail: format!(
                        "the body of a {status} response to the host is not JSON: {}",
                        cut(&String::from_utf8_lossy(&bytes))
                    ),
                },
            );
        }
        return;
    };
    // The body of an error status is an output only when it is the JSON-RPC answer
    // to what was posted: the request's own id, or none (`null`) for a refused batch. Other
    // error bodies (a `null`-id error for a request refused at the HTTP level) belong
    // to the HTTP answer and are matched only by the step's `http.body`.
    if status >= 400 {
        let id = value.get("id");
        let is_answer = match &carries {
            Carries::Request { id: want, .. } => id == Some(want),
            Carries::Batch { .. } => id.is_none_or(Value::is_null) || value.is_array(),
            Carries::Nothing | Carries::Standalone => false,
        };
        if !is_answer {
            return;
        }
    }
    if matches!(carries, Carries::Nothing | Carries::Standalone) {
        return;
    }
    deliver(value, &mut answered);
}

fn cut(s: &str) -> String {
    s.chars().take(200).collect()
}
