//! WebSocket (`GET <route>/ws`, and `/ws` for `/mcp`): one legacy session per connection, JSON-RPC in text frames,
//! subprotocol `mcp` when offered, ping keepalives, frame and message size limits.
//!
//! Close codes name the cause (RFC 6455 §7.4.1): 1009 message too big, 1007 text that
//! is not UTF-8, 1003 a binary frame, 1002 any other protocol error, 1001 a peer that
//! went silent (no frame, not even a pong, for the idle timeout), 1011 our failure.
//!
//! A peer that floods pings and never reads cannot make us queue pongs: pending pongs
//! are coalesced (only the latest is answered, RFC 6455 §5.5.3), the write buffer is
//! bounded, and after a control frame the loop flushes before it reads again, so a
//! peer that does not read stops being read (TCP pushes back on it) and is dropped
//! if it stays blocked past the idle timeout.

use super::forwarded::Forwarded;
use super::wire::Wire;
use super::{pipe, text, Route};
use crate::body::{empty, GatewayBody};
use crate::inbound::RequestBody;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, Instrument};

/// The `/mcp` route's WebSocket endpoint path (every route also has `<route>/ws`).
pub const PATH: &str = super::routes::WEBSOCKET_SUFFIX;
/// The subprotocol negotiated when the client offers it.
pub const SUBPROTOCOL: &str = "mcp";
/// tungstenite's default write buffer size.
const WRITE_BUFFER: usize = 128 * 1024;

/// The close code for a read error, by cause.
fn close_code(e: &WsError) -> (CloseCode, &'static str) {
    match e {
        WsError::Capacity(_) => (CloseCode::Size, "message too big"),
        WsError::Utf8(_) => (CloseCode::Invalid, "text frame is not valid UTF-8"),
        WsError::Protocol(_) => (CloseCode::Protocol, "WebSocket protocol error"),
        _ => (CloseCode::Error, "connection error"),
    }
}

fn header_has(req: &Request<RequestBody>, name: header::HeaderName, token: &str) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Answers the upgrade and runs the session on the upgraded connection.
pub(super) async fn upgrade(
    gw: &Arc<Route>,
    mut req: Request<RequestBody>,
    forwarded: Forwarded,
) -> Response<GatewayBody> {
    if req.method() != http::Method::GET
        || !header_has(&req, header::UPGRADE, "websocket")
        || !header_has(&req, header::CONNECTION, "upgrade")
        || req
            .headers()
            .get(header::SEC_WEBSOCKET_VERSION)
            .map(HeaderValue::as_bytes)
            != Some(b"13")
    {
        return text(
            StatusCode::BAD_REQUEST,
            "expected a WebSocket upgrade (version 13)\n",
        );
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key\n");
    };
    let offered_mcp = header_has(&req, header::SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL);
    let auth = super::auth::credentials(req.headers());
    let limit = gw.config.max_body_bytes;
    let gw2 = gw.clone();
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let config = WebSocketConfig::default()
                        .max_message_size(Some(limit))
                        .max_frame_size(Some(limit))
                        // Room for one outgoing message beyond the usual buffer; a
                        // pong that does not fit waits (coalesced) in tungstenite.
                        .max_write_buffer_size(WRITE_BUFFER + limit + 1024);
                    let ws = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(config),
                    )
                    .await;
                    run(gw2, ws, auth, forwarded).await;
                }
                Err(e) => debug!(error = %e, "WebSocket upgrade failed"),
            }
        }
        .instrument(tracing::info_span!("session", transport = "websocket")),
    );
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if offered_mcp {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(SUBPROTOCOL),
        );
    }
    r
}

async fn run<S>(
    gw: Arc<Route>,
    ws: WebSocketStream<S>,
    auth: Option<HeaderValue>,
    forwarded: Forwarded,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    let mut keepalive = tokio::time::interval(gw.config.keepalive);
    keepalive.reset();
    let wire = WsWire {
        ws,
        keepalive,
        idle: gw.config.idle_timeout,
        last_heard: tokio::time::Instant::now(),
        closed: false,
    };
    pipe::run_session(gw, wire, auth, Arc::new(forwarded)).await;
}

fn close(code: CloseCode, reason: &'static str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// A session's WebSocket connection: text frames carry messages; pings, pongs,
/// keepalives and close frames are answered here, between the host's messages.
struct WsWire<S> {
    ws: WebSocketStream<S>,
    keepalive: tokio::time::Interval,
    idle: std::time::Duration,
    last_heard: tokio::time::Instant,
    /// The connection is over (closed by either side, or failed).
    closed: bool,
}

impl<S> WsWire<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    /// Says goodbye with `code` (bounded by the idle timeout) and ends the connection.
    async fn close_with(&mut self, code: CloseCode, reason: &'static str) {
        self.closed = true;
        let _ = tokio::time::timeout(self.idle, self.ws.send(close(code, reason))).await;
    }
}

impl<S> Wire for WsWire<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    const TRANSPORT: &'static str = "websocket";

    async fn recv(&mut self) -> Option<Vec<u8>> {
        // Cancel-safe: `next` and `tick` are; a control frame's flush or a ping that a
        // cancel cuts short is finished by the next write.
        while !self.closed {
            tokio::select! {
                frame = self.ws.next() => {
                    self.last_heard = tokio::time::Instant::now();
                    match frame {
                        Some(Ok(WsMessage::Text(t))) => return Some(t.as_str().as_bytes().to_vec()),
                        Some(Ok(WsMessage::Binary(_))) => {
                            self.close_with(CloseCode::Unsupported, "MCP messages are JSON-RPC text frames").await;
                        }
                        Some(Ok(WsMessage::Close(_))) | None => self.closed = true,
                        Some(Ok(_)) => {
                            // A ping (its pong is queued, replacing any older one) or a
                            // pong: write it out before reading on, so a peer that does
                            // not read is not read either.
                            match tokio::time::timeout(self.idle, self.ws.flush()).await {
                                Ok(Ok(())) => {}
                                Ok(Err(_)) => self.closed = true,
                                Err(_) => {
                                    debug!("WebSocket peer does not read; connection dropped");
                                    self.closed = true;
                                }
                            }
                        }
                        Some(Err(e)) => {
                            let (code, reason) = close_code(&e);
                            debug!(error = %e, code = u16::from(code), "WebSocket read failed");
                            if matches!(e, WsError::ConnectionClosed | WsError::AlreadyClosed | WsError::Io(_)) {
                                self.closed = true;
                            } else {
                                self.close_with(code, reason).await;
                            }
                        }
                    }
                },
                _ = self.keepalive.tick() => {
                    if self.last_heard.elapsed() >= self.idle {
                        debug!("WebSocket peer silent past the idle timeout; closing");
                        self.close_with(CloseCode::Away, "idle").await;
                    } else if !matches!(
                        tokio::time::timeout(self.idle, self.ws.send(WsMessage::Ping(Vec::new().into()))).await,
                        Ok(Ok(()))
                    ) {
                        self.closed = true;
                    }
                }
            }
        }
        None
    }

    async fn send(&mut self, message: Vec<u8>) -> bool {
        if self.closed {
            return false;
        }
        // What the session sends is serialized JSON: always UTF-8.
        let Ok(text) = String::from_utf8(message) else {
            return true;
        };
        let sent =
            tokio::time::timeout(self.idle, self.ws.send(WsMessage::Text(text.into()))).await;
        if !matches!(sent, Ok(Ok(()))) {
            self.closed = true;
        }
        !self.closed
    }

    async fn finish(mut self) {
        if !self.closed {
            self.close_with(CloseCode::Error, "session ended").await;
        }
    }
}
