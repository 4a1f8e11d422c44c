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
use super::{pipe, text, Route};
use crate::body::{empty, GatewayBody};
use crate::inbound::RequestBody;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::sync::mpsc;
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
    mut ws: WebSocketStream<S>,
    auth: Option<HeaderValue>,
    forwarded: Forwarded,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let session = tokio::spawn(
        pipe::run_session(
            gw.clone(),
            in_rx,
            out_tx,
            "websocket",
            auth,
            Arc::new(forwarded),
        )
        .in_current_span(),
    );
    let mut keepalive = tokio::time::interval(gw.config.keepalive);
    keepalive.tick().await;
    let idle = gw.config.idle_timeout;
    let mut last_heard = tokio::time::Instant::now();
    let close = |code: CloseCode, reason: &'static str| {
        WsMessage::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
    };
    loop {
        tokio::select! {
            frame = ws.next() => {
                last_heard = tokio::time::Instant::now();
                match frame {
                    Some(Ok(WsMessage::Text(t))) => {
                        if in_tx.send(t.as_str().as_bytes().to_vec()).await.is_err() {
                            let _ = ws.send(close(CloseCode::Error, "session ended")).await;
                            break;
                        }
                    }
                    Some(Ok(WsMessage::Binary(_))) => {
                        let _ = ws.send(close(CloseCode::Unsupported, "MCP messages are JSON-RPC text frames")).await;
                        break;
                    }
                    Some(Ok(WsMessage::Close(_))) | None => break,
                    Some(Ok(_)) => {
                        // A ping (its pong is queued, replacing any older one) or a
                        // pong: write it out before reading on, so a peer that does not
                        // read is not read either.
                        match tokio::time::timeout(idle, ws.flush()).await {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => break,
                            Err(_) => {
                                debug!("WebSocket peer does not read; connection dropped");
                                break;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        let (code, reason) = close_code(&e);
                        debug!(error = %e, code = u16::from(code), "WebSocket read failed");
                        if !matches!(e, WsError::ConnectionClosed | WsError::AlreadyClosed | WsError::Io(_)) {
                            let _ = tokio::time::timeout(idle, ws.send(close(code, reason))).await;
                        }
                        break;
                    }
                }
            },
            out = out_rx.recv() => match out {
                Some(bytes) => {
                    let Ok(text) = String::from_utf8(bytes) else { continue };
                    match tokio::time::timeout(idle, ws.send(WsMessage::Text(text.into()))).await {
                        Ok(Ok(())) => {}
                        _ => break,
                    }
                }
                None => {
                    let _ = tokio::time::timeout(idle, ws.send(close(CloseCode::Error, "session ended"))).await;
                    break;
                }
            },
            _ = keepalive.tick() => {
                if last_heard.elapsed() >= idle {
                    debug!("WebSocket peer silent past the idle timeout; closing");
                    let _ = tokio::time::timeout(idle, ws.send(close(CloseCode::Away, "idle"))).await;
                    break;
                }
                match tokio::time::timeout(idle, ws.send(WsMessage::Ping(Vec::new().into()))).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
            }
        }
    }
    drop(in_tx);
    let _ = session.await;
}
