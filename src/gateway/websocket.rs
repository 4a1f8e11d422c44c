//! WebSocket (`GET /ws`): one legacy session per connection, JSON-RPC in text frames,
//! subprotocol `mcp` when offered, ping keepalives, frame and message size limits, and
//! close codes 1008 (policy: the peer broke the protocol) / 1011 (our failure).

use super::{pipe, text, Gateway};
use crate::body::{empty, GatewayBody};
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, Instrument};

/// The WebSocket endpoint path.
pub const PATH: &str = "/ws";
/// The subprotocol negotiated when the client offers it.
pub const SUBPROTOCOL: &str = "mcp";

fn header_has(req: &Request<Incoming>, name: header::HeaderName, token: &str) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Answers the upgrade and runs the session on the upgraded connection.
pub(super) async fn upgrade(gw: &Gateway, mut req: Request<Incoming>) -> Response<GatewayBody> {
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
                        .max_frame_size(Some(limit));
                    let ws = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(config),
                    )
                    .await;
                    run(gw2, ws, auth).await;
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

async fn run<S>(gw: Gateway, mut ws: WebSocketStream<S>, auth: Option<HeaderValue>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let session = tokio::spawn(
        pipe::run_session(gw.clone(), in_rx, out_tx, "websocket", auth).in_current_span(),
    );
    let mut keepalive = tokio::time::interval(gw.config.keepalive);
    keepalive.tick().await;
    let close = |code: CloseCode, reason: &'static str| {
        WsMessage::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
    };
    loop {
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(WsMessage::Text(t))) => {
                    if in_tx.send(t.as_str().as_bytes().to_vec()).await.is_err() {
                        let _ = ws.send(close(CloseCode::Error, "session ended")).await;
                        break;
                    }
                }
                Some(Ok(WsMessage::Binary(_))) => {
                    let _ = ws.send(close(CloseCode::Policy, "MCP messages are JSON-RPC text frames")).await;
                    break;
                }
                Some(Ok(WsMessage::Close(_))) | None => break,
                Some(Ok(_)) => {} // ping/pong: answered by the library
                Some(Err(e)) => {
                    debug!(error = %e, "WebSocket protocol error");
                    let _ = ws.send(close(CloseCode::Policy, "protocol error or message too large")).await;
                    break;
                }
            },
            out = out_rx.recv() => match out {
                Some(bytes) => {
                    let Ok(text) = String::from_utf8(bytes) else { continue };
                    if ws.send(WsMessage::Text(text.into())).await.is_err() {
                        break;
                    }
                }
                None => {
                    let _ = ws.send(close(CloseCode::Error, "session ended")).await;
                    break;
                }
            },
            _ = keepalive.tick() => {
                if ws.send(WsMessage::Ping(Vec::new().into())).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(in_tx);
    let _ = session.await;
}
