//! The scripted upstream: a 2026-07-28 Streamable HTTP endpoint on a loopback port
//! that answers nothing on its own. Every request the bridge POSTs is reported to the
//! play and held until the vector says how the upstream answers it: a JSON body, an
//! SSE stream (notifications first, the response last), an HTTP status with headers,
//! or a stream that ends without a response. A bridge closing a held request's
//! connection, or its SSE stream before the response, is reported as a cancellation
//! (2026-07-28 `basic/transports/streamable-http#cancellation`).

use super::observe::{emit, header_pairs, Observed, Sink, MAX_MESSAGE};
use super::sse;
use crate::format::UpstreamAnswer;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

type Body = BoxBody<Bytes, Infallible>;

/// Events queued on one SSE stream towards the bridge.
const STREAM_DEPTH: usize = 256;

/// How the play answers a held request.
enum Answer {
    /// The first message: JSON if it is the response and SSE was not asked for.
    Message {
        bytes: Vec<u8>,
        last: bool,
        http: Option<UpstreamAnswer>,
    },
    /// Ends the request without a JSON-RPC response: an empty SSE stream, or the
    /// status, headers and body given.
    Lost { http: Option<UpstreamAnswer> },
}

enum Queued {
    Event(Vec<u8>),
    End,
}

enum Slot {
    Held(oneshot::Sender<Answer>),
    /// Answered, the handler is building its SSE stream; later messages wait here.
    Answering(Vec<Queued>),
    Streaming(mpsc::Sender<Result<Frame<Bytes>, Infallible>>),
    Finished,
}

struct Entry {
    id: Value,
    message: Value,
    slot: Slot,
}

#[derive(Default)]
struct Inner {
    next: u64,
    sink: Option<Sink>,
    entries: HashMap<u64, Entry>,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: Observed) {
        if let Some(sink) = &self.lock().sink {
            emit(sink, event);
        }
    }

    /// Marks `key` finished; reports a cancellation if it had not been answered in full.
    fn cancelled(&self, key: u64) {
        let mut g = self.lock();
        let Some(e) = g.entries.get_mut(&key) else {
            return;
        };
        if matches!(e.slot, Slot::Finished) {
            return;
        }
        e.slot = Slot::Finished;
        if let Some(sink) = &g.sink {
            emit(sink, Observed::UpstreamCancel { key });
        }
    }
}

/// Whether a message reached the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    Delivered,
    /// The request was already answered, or the bridge had closed it.
    Closed,
}

/// The scripted upstream's listener.
pub(crate) struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Listens on `addr` (port 0 picks a free one).
    pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// The endpoint URL to give the bridge.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Starts a vector: its observations go to `sink`; nothing of the last one is kept.
    pub(crate) fn attach(&self, sink: Sink) {
        let mut g = self.shared.lock();
        g.entries.clear();
        g.sink = Some(sink);
    }

    /// Ends a vector: held requests are dropped (their handlers answer 503).
    pub(crate) fn detach(&self) {
        let mut g = self.shared.lock();
        g.sink = None;
        g.entries.clear();
    }

    /// The JSON-RPC id of request `key`.
    pub(crate) fn id_of(&self, key: u64) -> Option<Value> {
        self.shared.lock().entries.get(&key).map(|e| e.id.clone())
    }

    /// Requests not yet answered in full, newest first, with their id and message.
    pub(crate) fn open(&self) -> Vec<(u64, Value, Value)> {
        let g = self.shared.lock();
        let mut v: Vec<_> = g
            .entries
            .iter()
            .filter(|(_, e)| !matches!(e.slot, Slot::Finished))
            .map(|(k, e)| (*k, e.id.clone(), e.message.clone()))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.0));
        v
    }

    /// Sends one message on request `key`'s response; the response ends it.
    pub(crate) fn send(
        &self,
        key: u64,
        message: &Value,
        http: Option<&UpstreamAnswer>,
    ) -> Delivery {
        let last = message.get("method").is_none();
        let bytes = serde_json::to_vec(message).unwrap_or_default();
        let mut g = self.shared.lock();
        let Some(e) = g.entries.get_mut(&key) else {
            return Delivery::Closed;
        };
        match std::mem::replace(&mut e.slot, Slot::Finished) {
            Slot::Held(tx) => {
                let sse_needed = !last || http.is_some_and(|h| h.sse);
                e.slot = if sse_needed {
                    Slot::Answering(Vec::new())
                } else {
                    Slot::Finished
                };
                let answer = Answer::Message {
                    bytes,
                    last,
                    http: http.cloned(),
                };
                if tx.send(answer).is_err() {
                    e.slot = Slot::Finished;
                    return Delivery::Closed;
                }
                Delivery::Delivered
            }
            Slot::Answering(mut q) => {
                q.push(Queued::Event(bytes));
                if last {
                    q.push(Queued::End);
                }
                e.slot = Slot::Answering(q);
                Delivery::Delivered
            }
            Slot::Streaming(tx) => {
                let sent = tx
                    .try_send(Ok(Frame::data(Bytes::from(sse::encode(&bytes)))))
                    .is_ok();
                if !last {
                    e.slot = Slot::Streaming(tx);
                }
                if sent {
                    Delivery::Delivered
                } else {
                    Delivery::Closed
                }
            }
            Slot::Finished => Delivery::Closed,
        }
    }

    /// Ends request `key` without a JSON-RPC response.
    pub(crate) fn lose(&self, key: u64, http: Option<&UpstreamAnswer>) -> Delivery {
        let mut g = self.shared.lock();
        let Some(e) = g.entries.get_mut(&key) else {
            return Delivery::Closed;
        };
        match std::mem::replace(&mut e.slot, Slot::Finished) {
            Slot::Held(tx) => {
                if tx
                    .send(Answer::Lost {
                        http: http.cloned(),
                    })
                    .is_err()
                {
                    return Delivery::Closed;
                }
                Delivery::Delivered
            }
            Slot::Answering(mut q) => {
                q.push(Queued::End);
                e.slot = Slot::Answering(q);
                Delivery::Delivered
            }
            Slot::Streaming(_) => Delivery::Delivered,
            Slot::Finished => Delivery::Closed,
        }
    }
}

/// An SSE body that reports a cancellation when hyper drops it (the bridge hung up)
/// while the request is still streaming.
struct Guarded {
    rx: mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    shared: Arc<Shared>,
    key: u64,
}

impl futures_util::Stream for Guarded {
    type Item = Result<Frame<Bytes>, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let streaming = matches!(
            self.shared.lock().entries.get(&self.key).map(|e| &e.slot),
            Some(Slot::Streaming(_) | Slot::Answering(_))
        );
        if streaming {
            self.shared.cancelled(self.key);
        }
    }
}

/// Reports a cancellation if the handler is dropped (the bridge hung up) before it
/// answered.
struct HangUp {
    shared: Arc<Shared>,
    key: u64,
    armed: bool,
}

impl Drop for HangUp {
    fn drop(&mut self) {
        if self.armed {
            self.shared.cancelled(self.key);
        }
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_owned())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

fn with_headers(
    mut r: Response<Body>,
    status: u16,
    headers: &[(String, String)],
) -> Response<Body> {
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    for (n, v) in headers {
        if let (Ok(n), Ok(v)) = (
            header::HeaderName::from_bytes(n.as_bytes()),
            header::HeaderValue::from_str(v),
        ) {
            r.headers_mut().insert(n, v);
        }
    }
    r
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::POST {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "POST only (2026-07-28)\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    let headers = header_pairs(req.headers());
    let body = match Limited::new(req.into_body(), MAX_MESSAGE).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n"),
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(Value::Array(_)) => {
            shared.emit(Observed::Fault {
                detail: "the bridge POSTed a JSON-RPC batch upstream; 2026-07-28 takes one message per POST".into(),
            });
            return plain(StatusCode::BAD_REQUEST, "one JSON-RPC message per POST\n");
        }
        _ => {
            shared.emit(Observed::Fault {
                detail: format!(
                    "the bridge POSTed upstream a body that is not a JSON-RPC message: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ),
            });
            return plain(StatusCode::BAD_REQUEST, "not JSON\n");
        }
    };
    let id = message.get("id").filter(|v| !v.is_null()).cloned();
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (Some(id), Some(_)) = (id, method.as_deref()) else {
        if method.as_deref() == Some("notifications/cancelled") {
            let target = message.pointer("/params/requestId").cloned();
            let key = {
                let g = shared.lock();
                g.entries
                    .iter()
                    .filter(|(_, e)| !matches!(e.slot, Slot::Finished))
                    .find(|(_, e)| Some(&e.id) == target.as_ref())
                    .map(|(k, _)| *k)
            };
            if let Some(key) = key {
                shared.cancelled(key);
                let mut r = Response::new(Full::new(Bytes::new()).boxed());
                *r.status_mut() = StatusCode::ACCEPTED;
                return r;
            }
        }
        if method.is_some() {
            shared.emit(Observed::UpstreamNotification { message });
            let mut r = Response::new(Full::new(Bytes::new()).boxed());
            *r.status_mut() = StatusCode::ACCEPTED;
            return r;
        }
        shared.emit(Observed::Fault {
            detail: "the bridge POSTed a JSON-RPC response upstream; 2026-07-28 clients send none"
                .into(),
        });
        return plain(StatusCode::BAD_REQUEST, "responses are not accepted\n");
    };
    let (tx, rx) = oneshot::channel();
    let key = {
        let mut g = shared.lock();
        if g.sink.is_none() {
            return plain(StatusCode::SERVICE_UNAVAILABLE, "no vector is running\n");
        }
        g.next += 1;
        let key = g.next;
        g.entries.insert(
            key,
            Entry {
                id,
                message: message.clone(),
                slot: Slot::Held(tx),
            },
        );
        if let Some(sink) = &g.sink {
            emit(
                sink,
                Observed::UpstreamRequest {
                    key,
                    message,
                    headers,
                },
            );
        }
        key
    };
    let mut hang_up = HangUp {
        shared: shared.clone(),
        key,
        armed: true,
    };
    let Ok(answer) = rx.await else {
        hang_up.armed = false;
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the vector ended\n");
    };
    hang_up.armed = false;
    match answer {
        Answer::Message { bytes, last, http } => {
            let (status, extra) = http
                .as_ref()
                .map_or((200, &[][..]), |h| (h.status, h.headers.as_slice()));
            let sse_needed = !last || http.as_ref().is_some_and(|h| h.sse);
            if !sse_needed {
                let mut r = Response::new(Full::new(Bytes::from(bytes)).boxed());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                return with_headers(r, status, extra);
            }
            let (stx, srx) = mpsc::channel(STREAM_DEPTH);
            let _ = stx.try_send(Ok(Frame::data(Bytes::from(sse::encode(&bytes)))));
            let mut open = !last;
            {
                let mut g = shared.lock();
                if let Some(e) = g.entries.get_mut(&key) {
                    if let Slot::Answering(q) = std::mem::replace(&mut e.slot, Slot::Finished) {
                        for item in q {
                            match item {
                                Queued::Event(b) if open => {
                                    let _ =
                                        stx.try_send(Ok(Frame::data(Bytes::from(sse::encode(&b)))));
                                }
                                Queued::Event(_) => {}
                                Queued::End => open = false,
                            }
                        }
                        if open {
                            e.slot = Slot::Streaming(stx.clone());
                        }
                    }
                }
            }
            drop(stx);
            // The bridge closing the stream before the response is a cancellation:
            // hyper drops the body when the connection goes.
            let stream = Guarded {
                rx: srx,
                shared: shared.clone(),
                key,
            };
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                header::HeaderValue::from_static("no-store"),
            );
            with_headers(r, status, extra)
        }
        Answer::Lost { http: None } => {
            let mut r = Response::new(Full::new(Bytes::new()).boxed());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        Answer::Lost { http: Some(h) } => {
            let (bytes, ctype) = match &h.body {
                None => (Vec::new(), None),
                Some(Value::String(s)) => (s.clone().into_bytes(), Some("text/plain")),
                Some(v) => (
                    serde_json::to_vec(v).unwrap_or_default(),
                    Some("application/json"),
                ),
            };
            let mut r = Response::new(Full::new(Bytes::from(bytes)).boxed());
            if let Some(c) = ctype {
                r.headers_mut()
                    .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(c));
            }
            with_headers(r, h.status, &h.headers)
        }
    }
}
