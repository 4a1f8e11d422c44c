//! Streamable HTTP for the modern server (2026-07-28): POST-only `/mcp`, JSON or SSE
//! responses, 202 for notifications, header/body cross-checks via the router.

use super::access::{Denied, LOCAL_PRINCIPAL};
use super::error::ServerError;
use super::oauth::METADATA_PATH;
use super::router::{Handled, Listen, MirroredHeaders};
use super::{Server, Sink};
use crate::body::{empty, full, ChannelBody, GatewayBody};
use crate::guard;
use crate::header_names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};
use crate::inbound::RequestBody;
use crate::listener::{ConnInfo, ListenerConfig};
use bytes::Bytes;
use dualera_adapters::Message;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing::info;

use crate::endpoint::ENDPOINT;

/// Notifications queued for one response stream.
const NOTIFY_QUEUE: usize = 64;
/// Comment keepalive interval on `subscriptions/listen` streams.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// Serves HTTP on a bound listener until `shutdown` resolves, then lets in-flight
/// requests finish (up to 10 s). Default listener bounds, no TLS.
pub async fn serve(
    listener: TcpListener,
    server: Server,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, ListenerConfig::default(), server, shutdown).await
}

/// [`serve`] with the listener's bounds and TLS given.
pub async fn serve_with(
    listener: TcpListener,
    config: ListenerConfig,
    server: Server,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let loopback = listener.local_addr()?.ip().is_loopback();
    let service =
        move |req: Request<RequestBody>, _conn: &ConnInfo| handle(server.clone(), loopback, req);
    crate::listener::serve(listener, config, service, async move {
        shutdown.await;
        info!("shutting down; waiting for in-flight requests");
    })
    .await
}

/// Binds `addr` and reports the bound address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn plain(status: StatusCode, text: &'static str) -> Response<GatewayBody> {
    let mut r = Response::new(full(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

fn error_response(e: ServerError) -> Response<GatewayBody> {
    let (status, error) = e.respond();
    let body = Message::Response(dualera_adapters::Response::error(None, error)).to_vec();
    json_response(status, body)
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<GatewayBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn header_str(h: &HeaderMap, name: &http::header::HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Whether the client asked for SSE only (otherwise JSON is sent).
fn wants_sse_only(h: &HeaderMap) -> bool {
    let accept = h
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    accept.contains("text/event-stream")
        && !accept.contains("application/json")
        && !accept.contains("*/*")
}

/// A 401/403 with its challenge.
fn refused(denied: Denied) -> Response<GatewayBody> {
    let e = if denied.status == StatusCode::FORBIDDEN {
        ServerError::Forbidden {
            reason: denied.reason,
        }
    } else {
        ServerError::Unauthorized {
            reason: denied.reason,
        }
    };
    let mut r = error_response(e);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, denied.challenge);
    r
}

/// The Protected Resource Metadata document (RFC 9728 §3), at the well-known root and
/// at the well-known path of the MCP endpoint (the 2025-11-25 authorization page,
/// "Protected Resource Metadata Discovery Requirements", lets clients try both). It is
/// public: no token, CORS open, like the discovery documents of authorization servers.
fn metadata(server: &Server, req: &Request<RequestBody>) -> Option<Response<GatewayBody>> {
    let path = req.uri().path();
    let rest = path.strip_prefix(METADATA_PATH)?;
    let oauth = server.services().access.oauth()?;
    let audience_path = oauth
        .metadata_url()
        .split_once(METADATA_PATH)
        .map_or("", |(_, p)| p);
    if !(rest.is_empty() || rest == ENDPOINT || rest == audience_path) {
        return None;
    }
    let mut r = match *req.method() {
        Method::GET | Method::HEAD => {
            let mut r = json_response(StatusCode::OK, oauth.metadata().to_vec());
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                header::HeaderValue::from_static("max-age=300"),
            );
            r
        }
        Method::OPTIONS => {
            let mut r = Response::new(empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r.headers_mut().insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                header::HeaderValue::from_static("GET, OPTIONS"),
            );
            r
        }
        _ => {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
            r.headers_mut().insert(
                header::ALLOW,
                header::HeaderValue::from_static("GET, OPTIONS"),
            );
            r
        }
    };
    r.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        header::HeaderValue::from_static("*"),
    );
    Some(r)
}

async fn handle(
    server: Server,
    loopback: bool,
    req: Request<RequestBody>,
) -> Response<GatewayBody> {
    if let Some(r) = metadata(&server, &req) {
        return r;
    }
    if req.uri().path() != ENDPOINT {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; the MCP endpoint is /mcp\n",
        );
    }
    if let Some(refused) = guard::refusal(&req, loopback, server.allowed_origins()) {
        return error_response(ServerError::InvalidRequest {
            detail: refused.reason().into(),
        })
        .map_status(StatusCode::FORBIDDEN);
    }
    let headers = req.headers();
    if req.method() != Method::POST {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "this endpoint takes POST only (protocol 2026-07-28 has no GET stream and no sessions)\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    if !guard::is_json(headers) {
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST bodies must be Content-Type: application/json\n",
        );
    }
    let access = &server.services().access;
    let principal = if access.auth_required() {
        let caller = match access.caller(headers.get(header::AUTHORIZATION)).await {
            Ok(c) => c,
            Err(denied) => return refused(denied),
        };
        // The tool's scopes, checked before the body is read: over HTTP a `tools/call`
        // names its tool in `Mcp-Name`, and the router refuses any body that disagrees.
        let is_call = headers
            .get(&MCP_METHOD)
            .is_some_and(|m| m.as_bytes() == b"tools/call");
        let tool = headers
            .get(&MCP_NAME)
            .and_then(|v| v.to_str().ok())
            .and_then(super::router::decode_header_value);
        if let (true, Some(tool)) = (is_call, tool) {
            if let Err(denied) = access.check_tool(&caller, &tool) {
                return refused(denied);
            }
        }
        caller.principal
    } else {
        LOCAL_PRINCIPAL.to_owned()
    };
    let mirrored = MirroredHeaders {
        protocol_version: header_str(headers, &MCP_PROTOCOL_VERSION),
        method: header_str(headers, &MCP_METHOD),
        name: header_str(headers, &MCP_NAME),
        params: headers
            .iter()
            .filter_map(|(name, value)| {
                let param = name.as_str().strip_prefix("mcp-param-")?;
                Some((param.to_owned(), value.to_str().ok().map(str::to_owned)))
            })
            .collect(),
    };
    let sse = wants_sse_only(headers);
    let limit = server.services().limits.max_body_bytes;
    let body = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return error_response(ServerError::InvalidRequest {
                    detail: format!("body larger than {limit} bytes"),
                })
                .map_status(StatusCode::PAYLOAD_TOO_LARGE);
            }
            return plain(StatusCode::BAD_REQUEST, "could not read the request body\n");
        }
    };
    run_request(server, principal, body, mirrored, sse).await
}

/// Runs the handler on the blocking pool. If it emits a notification before its
/// response, the answer becomes an SSE stream (notifications, then the response);
/// otherwise it is plain JSON. A client that goes away sets the cancel flag.
async fn run_request(
    server: Server,
    principal: String,
    body: Bytes,
    mirrored: MirroredHeaders,
    sse_only: bool,
) -> Response<GatewayBody> {
    let (note_tx, mut note_rx) = mpsc::channel::<Message>(NOTIFY_QUEUE);
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = cancelled.clone();
    let listen_server = server.clone();
    let mut task = tokio::task::spawn_blocking(move || {
        let notify = move |m: Message| {
            let _ = note_tx.blocking_send(m);
        };
        let sink = Sink {
            notify: &notify,
            cancelled: &flag,
        };
        server.handle_bytes(&principal, &body, Some(&mirrored), &sink)
    });
    let first = tokio::select! {
        biased;
        note = note_rx.recv() => note,
        done = &mut task => {
            let early: Vec<Message> = std::iter::from_fn(|| note_rx.try_recv().ok()).collect();
            return finish(listen_server, done, early, sse_only);
        }
    };
    let Some(first) = first else {
        return finish(listen_server, task.await, Vec::new(), sse_only);
    };
    // Streaming: the first notification is already here.
    let (tx, body) = ChannelBody::channel(NOTIFY_QUEUE);
    tokio::spawn(async move {
        if tx.send(sse_event(&first.to_vec())).await.is_err() {
            cancelled.store(true, Ordering::Relaxed);
        }
        while let Some(note) = note_rx.recv().await {
            if tx.send(sse_event(&note.to_vec())).await.is_err() {
                cancelled.store(true, Ordering::Relaxed);
            }
        }
        if let Ok(Handled::Reply { response, .. }) = task.await {
            let _ = tx
                .send(sse_event(&Message::Response(response).to_vec()))
                .await;
        }
    });
    sse_stream(StatusCode::OK, body)
}

fn finish(
    server: Server,
    done: Result<Handled, tokio::task::JoinError>,
    early: Vec<Message>,
    sse_only: bool,
) -> Response<GatewayBody> {
    match done {
        Ok(Handled::Accepted { .. }) => {
            let mut r = Response::new(empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        Ok(Handled::Reply { status, response }) => {
            let body = Message::Response(response).to_vec();
            if sse_only || !early.is_empty() {
                let mut bytes = Vec::new();
                for m in &early {
                    bytes.extend_from_slice(&sse_event(&m.to_vec()));
                }
                bytes.extend_from_slice(&sse_event(&body));
                sse_stream(status, full(bytes))
            } else {
                json_response(status, body)
            }
        }
        Ok(Handled::Listen(listen)) => listen_stream(server, listen),
        Err(_) => error_response(ServerError::Internal {
            detail: "handler panicked".into(),
        }),
    }
}

/// Keeps a `subscriptions/listen` stream open: the acknowledgment first, then every
/// announced change the filter asked for, with comment keepalives, until the client
/// closes it or the server stops.
fn listen_stream(server: Server, listen: Listen) -> Response<GatewayBody> {
    let mut changes = server.services().changes.subscribe();
    let (tx, body) = ChannelBody::channel(NOTIFY_QUEUE);
    tokio::spawn(async move {
        if tx
            .send(sse_event(&listen.acknowledgment().to_vec()))
            .await
            .is_err()
        {
            return;
        }
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(change) => {
                        if let Some(m) = listen.forward(&change) {
                            if tx.send(sse_event(&m.to_vec())).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "listen stream lagged behind");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        let _ = tx.send(sse_event(&listen.closing().to_vec())).await;
                        return;
                    }
                },
                _ = keepalive.tick() => {
                    if tx.send(crate::sse::keepalive()).await.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    sse_stream(StatusCode::OK, body)
}

fn sse_event(json: &[u8]) -> Bytes {
    crate::sse::encode(None, json)
}

fn sse_stream(status: StatusCode, body: GatewayBody) -> Response<GatewayBody> {
    let mut r = crate::body::sse_response(body);
    *r.status_mut() = status;
    r
}

trait MapStatus {
    fn map_status(self, status: StatusCode) -> Self;
}

impl MapStatus for Response<GatewayBody> {
    fn map_status(mut self, status: StatusCode) -> Self {
        *self.status_mut() = status;
        self
    }
}
