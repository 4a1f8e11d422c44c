//! The deprecated HTTP+SSE transport (2024-11-05): `GET <route>/sse` (`/sse` for the
//! `/mcp` route) opens the session's one stream and names, in an `endpoint` event, the
//! URL to POST messages to (`<route>/messages`, beside the stream); each POST gets 202
//! and every answer travels on the stream. The session ends with the stream. Sessions
//! belong to their route: another route's messages path does not find them.

use super::forwarded::Forwarded;
use super::wire::Wire;
use super::{pipe, Route};
use crate::body::{empty, ChannelBody, GatewayBody};
use crate::inbound::RequestBody;
use crate::sse;
use bytes::Bytes;
use dashmap::DashMap;
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::{info, Instrument};

/// The `/mcp` route's stream endpoint (every route also has `<route>/sse`).
pub const SSE_PATH: &str = super::routes::SSE_SUFFIX;
/// The `/mcp` route's message endpoint, with `?sessionId=` (every route also has
/// `<route>/messages`: the one next to the stream a session was opened on).
pub const MESSAGES_PATH: &str = super::routes::MESSAGES_SUFFIX;

/// Live HTTP+SSE sessions.
#[derive(Debug, Default)]
pub(super) struct SseSessions {
    map: DashMap<String, (mpsc::Sender<Vec<u8>>, [u8; 32])>,
}

impl SseSessions {
    /// Ends every session (gateway shutdown): with its message sender gone, a session's
    /// task closes the machine and returns, and its stream ends, so the `GET /sse`
    /// response completes and the connection can shut down gracefully.
    pub(super) fn close_all(&self) {
        self.map.clear();
    }
}

fn credential(auth: Option<&HeaderValue>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"dualera-sse-credential\0");
    if let Some(a) = auth {
        h.update(crate::bearer::canonical(a));
    }
    h.finalize().into()
}

fn status(code: StatusCode, msg: &'static str) -> Response<GatewayBody> {
    super::text(code, msg)
}

/// `GET /sse`: opens a session.
pub(super) fn open(
    gw: &Arc<Route>,
    req: &Request<RequestBody>,
    forwarded: Forwarded,
) -> Response<GatewayBody> {
    if req.method() != http::Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, "GET opens the stream\n");
    }
    if gw.sse.map.len() >= gw.config.max_sessions {
        return status(StatusCode::SERVICE_UNAVAILABLE, "too many sessions\n");
    }
    let mut raw = [0u8; 24];
    if getrandom::fill(&mut raw).is_err() {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "no randomness\n");
    }
    let id = crate::digest::hex(&raw);
    let auth = super::auth::credentials(req.headers());
    let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(64);
    let (stream_tx, body) = ChannelBody::channel(256);
    gw.sse
        .map
        .insert(id.clone(), (in_tx, credential(auth.as_ref())));
    let messages = super::routes::messages_path(req.uri().path());
    let endpoint = format!("event: endpoint\ndata: {messages}?sessionId={id}\n\n");
    let _ = stream_tx.try_send(Bytes::from(endpoint));
    // The id is a bearer secret (it is the whole credential of the message URL).
    let tag = crate::digest::log_tag(&id);
    let span = tracing::info_span!("session", transport = "http+sse", session = %tag);
    let sessions: Arc<SseSessions> = gw.sse.clone();
    let mut keepalive = tokio::time::interval(gw.config.keepalive);
    keepalive.reset();
    let wire = SseWire {
        incoming: in_rx,
        stream: stream_tx,
        keepalive,
    };
    let gw = gw.clone();
    tokio::spawn(
        async move {
            pipe::run_session(gw, wire, auth, Arc::new(forwarded)).await;
            // The stream is gone, or the session ended: so is its message URL.
            sessions.map.remove(&id);
            info!("HTTP+SSE session ended");
        }
        .instrument(span),
    );
    crate::body::sse_response(body)
}

/// A session's stream and message URL: the POSTs' messages come through `incoming`,
/// every message for the host is an event on `stream`, with keepalive comments
/// between them.
struct SseWire {
    incoming: mpsc::Receiver<Vec<u8>>,
    stream: mpsc::Sender<Bytes>,
    keepalive: tokio::time::Interval,
}

impl Wire for SseWire {
    const TRANSPORT: &'static str = "http+sse";

    async fn recv(&mut self) -> Option<Vec<u8>> {
        loop {
            tokio::select! {
                m = self.incoming.recv() => return m,
                _ = self.keepalive.tick() => {
                    if self.stream.send(sse::keepalive()).await.is_err() {
                        return None;
                    }
                }
                () = self.stream.closed() => return None,
            }
        }
    }

    async fn send(&mut self, message: Vec<u8>) -> bool {
        self.stream.send(sse::encode(None, &message)).await.is_ok()
    }

    async fn finish(self) {}
}

/// `POST /messages?sessionId=…`: one message into a session.
pub(super) async fn post(gw: &Arc<Route>, req: Request<RequestBody>) -> Response<GatewayBody> {
    if req.method() != http::Method::POST {
        return status(StatusCode::METHOD_NOT_ALLOWED, "POST messages here\n");
    }
    let id = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("sessionId="))
        .map(str::to_owned);
    let Some(id) = id else {
        return status(StatusCode::BAD_REQUEST, "missing sessionId\n");
    };
    let auth = super::auth::credentials(req.headers());
    let Some(tx) = gw.sse.map.get(&id).and_then(|e| {
        let (tx, cred) = e.value();
        crate::digest::constant_time_eq(cred, &credential(auth.as_ref())).then(|| tx.clone())
    }) else {
        return status(StatusCode::NOT_FOUND, "unknown session\n");
    };
    let limit = gw.config.max_body_bytes;
    let Ok(body) = Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map(|b| b.to_bytes())
    else {
        return status(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n");
    };
    if tx.send(body.to_vec()).await.is_err() {
        return status(StatusCode::NOT_FOUND, "session ended\n");
    }
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}
