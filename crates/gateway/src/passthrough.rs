//! Modern pass-through: a 2026-07-28 request is proxied without its body being parsed
//! or waited for (a body that came with its head is sent as it is, one still arriving
//! streams). Headers are kept except hop-by-hop ones, the upstream status is kept,
//! SSE flows frame by frame, and a client that goes away drops the upstream request.

use super::forwarded::Forwarded;
use super::telemetry::ConnectionTelemetry;
use super::trace::TraceContext;
use super::upstream::{HttpUpstream, StdioUpstream, UpstreamError};
use super::{cache, Route};
use crate::body::{full, limited, BoxError, ChannelBody, GatewayBody};
use crate::header_names::{MCP_METHOD, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::inbound::RequestBody;
use crate::sse;
use bytes::Bytes;
use dualera_adapters::jsonrpc::{self, Message};
use dualera_adapters::usage::Method;
use dualera_adapters::{ErrorCode, ErrorObject, Response as RpcResponse};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
];

/// Removes hop-by-hop headers, including any the `Connection` header names.
///
/// On the pass-through hot path: one pass over the names present finds which to remove,
/// so a request pays one hashed removal per hop-by-hop header it carries (usually just
/// `Host`) rather than one per name in the list.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    const KEEP_ALIVE: usize = HOP_BY_HOP.len();
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present |= 1 << i;
        } else if name.as_str() == "keep-alive" {
            present |= 1 << KEEP_ALIVE;
        }
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0 {
        // HOP_BY_HOP[0] is Connection: the names it lists go too.
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
            .collect();
        for n in &named {
            headers.remove(n);
        }
    }
    for (i, n) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(n);
        }
    }
    if present & (1 << KEEP_ALIVE) != 0 {
        headers.remove("keep-alive");
    }
}

/// Proxies one modern request to the upstream, and records it (metrics, and the
/// client's row of the migration report).
pub(super) async fn forward(
    gateway: &Arc<Route>,
    connection: &ConnectionTelemetry,
    req: Request<RequestBody>,
    forwarded: &Forwarded,
) -> Response<GatewayBody> {
    let started = Instant::now();
    let h = req.headers();
    // Bounded label: a method outside the table is `_OTHER`.
    let method = h
        .get(&MCP_METHOD)
        .and_then(|v| v.to_str().ok())
        .map_or(Method::Other, Method::from_name);
    let revision = h.get(&MCP_PROTOCOL_VERSION).cloned();
    let span = tracing::debug_span!(
        "passthrough",
        method = method.as_str(),
        trace_id = tracing::field::Empty
    );
    if !span.is_disabled() {
        if let Some(t) = TraceContext::from_headers(h) {
            span.record("trace_id", t.trace_id());
        }
    }
    let resp = match gateway.upstream.stdio() {
        None => {
            forward_http(gateway, connection, req, forwarded)
                .instrument(span)
                .await
        }
        // Boxed: a rare branch, kept out of the size of every request's future.
        Some(up) => Box::pin(forward_stdio(gateway, connection, up, req).instrument(span)).await,
    };
    let revision = revision
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    gateway
        .telemetry
        .passthrough(connection, method, revision, resp.status(), started);
    resp
}

/// The `MCP-Protocol-Version` a request names (for the report's row of its client).
fn revision_of(headers: &HeaderMap) -> &str {
    headers
        .get(&MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Over a stdio upstream the body must be read (ids are rewritten for the shared
/// pipe): JSON back when nothing else came first, else an SSE stream.
async fn forward_stdio(
    gateway: &Arc<Route>,
    connection: &ConnectionTelemetry,
    upstream: &StdioUpstream,
    req: Request<RequestBody>,
) -> Response<GatewayBody> {
    let (parts, body) = req.into_parts();
    let body = match read_body(body, gateway.config.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    // Read anyway (ids are rewritten): its clientInfo names the client.
    gateway
        .telemetry
        .identify(connection, revision_of(&parts.headers), &body);
    let msg = match jsonrpc::parse(&body) {
        Ok(m @ Message::Request(_)) => m,
        Ok(_) => return status_only(StatusCode::ACCEPTED),
        Err(e) => {
            let mut r = Response::new(full(Message::Response(e.to_response()).to_vec()));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return r;
        }
    };
    // Under `auto`, a host's `server/discover` is where era detection starts (see
    // `legacy_discover` for HTTP).
    let discover = gateway.config.era == crate::config::UpstreamEra::Auto
        && matches!(&msg, Message::Request(r) if r.method == "server/discover");
    let Ok(mut exchange) = upstream.exchange(&msg).await else {
        return unavailable();
    };
    match exchange.next().await {
        Some(Ok(m @ Message::Response(_))) => {
            if let (true, Message::Response(answer)) = (discover, &m) {
                if let Some(seen) = super::upstream::era::stdio_discover_evidence(answer) {
                    gateway.refute_era(seen);
                    let era = gateway.resolve_era(Default::default()).await;
                    if let Ok(super::upstream::era::Era::Legacy(transport)) = era {
                        // A stdio upstream carries no HTTP headers: nothing to forward.
                        let none = Forwarded::default();
                        return super::reverse::handle_read(
                            gateway, &parts, &body, transport, none,
                        )
                        .await;
                    }
                }
            }
            let status = status_for(&m);
            let mut r = Response::new(full(m.to_vec()));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Some(Ok(first)) => {
            // Each event waits for room in the body: a client that reads slowly slows
            // the read from the child's pipe; dropping the body cancels the exchange.
            let (out, body) = ChannelBody::channel(64);
            tokio::spawn(async move {
                let _ = out.send(sse::encode(None, &first.to_vec())).await;
                while let Some(Ok(m)) = exchange.next().await {
                    if out.send(sse::encode(None, &m.to_vec())).await.is_err() {
                        break;
                    }
                }
            });
            crate::body::sse_response(body)
        }
        Some(Err(_)) | None => unavailable(),
    }
}

/// The HTTP status the modern server would have used for this response.
pub(super) fn status_for(m: &Message) -> StatusCode {
    match m {
        Message::Response(r) => match &r.outcome {
            Ok(_) => StatusCode::OK,
            Err(e) if e.code == ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            Err(e) if e.code == ErrorCode::INTERNAL_ERROR => StatusCode::INTERNAL_SERVER_ERROR,
            Err(_) => StatusCode::BAD_REQUEST,
        },
        _ => StatusCode::OK,
    }
}

fn unavailable() -> Response<GatewayBody> {
    bad_gateway(Bytes::from_static(
        br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"Upstream unavailable"}}"#,
    ))
}

/// 502 naming why the upstream could not be reached (`data.reason`), when it is known.
fn upstream_failed(e: &UpstreamError) -> Response<GatewayBody> {
    let Some((reason, message)) = e.refusal() else {
        return unavailable();
    };
    let error = ErrorObject::new(ErrorCode::INTERNAL_ERROR, message)
        .with_data(serde_json::json!({ "reason": reason }));
    bad_gateway(Bytes::from(
        Message::Response(RpcResponse::error(None, error)).to_vec(),
    ))
}

fn bad_gateway(body: Bytes) -> Response<GatewayBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The body a relay sends upstream: taken whole when it came with its head (nearly
/// every request: its one frame is ready on the handler's first poll), else streamed
/// as it arrives (what was already taken first); within `limit` either way (413
/// beyond it; 400 when the connection failed while it was read), never parsed.
///
/// Taking it on that first poll is what lets the listener's body clock find it
/// finished and never arm its deadline timer (`dualera_common::inbound::BodyClock`).
/// Streamed, the body was first polled by the upstream connection's task, after the
/// clock had armed a timer; a timer due before the runtime's next wake-up costs a
/// write to wake its I/O driver, and that thread a wake-up, on every request.
fn relay_body(mut body: RequestBody, limit: usize) -> Result<GatewayBody, StatusCode> {
    use futures_util::{FutureExt, StreamExt};
    use http_body_util::{BodyStream, StreamBody};
    use hyper::body::Body as _;
    let first = match body.frame().now_or_never() {
        // Still arriving: polled again, with a real waker, by whoever sends it.
        None => return Ok(limited(body, limit)),
        Some(None) => return Ok(crate::body::empty()),
        Some(Some(Err(_))) => return Err(StatusCode::BAD_REQUEST),
        Some(Some(Ok(frame))) => frame,
    };
    let first = match first.into_data() {
        Ok(data) if data.len() > limit => return Err(StatusCode::PAYLOAD_TOO_LARGE),
        Ok(data) if body.is_end_stream() => return Ok(full(data)),
        Ok(data) => hyper::body::Frame::data(data),
        Err(frame) => frame,
    };
    let rest = futures_util::stream::once(std::future::ready(Ok::<_, crate::inbound::BodyError>(
        first,
    )))
    .chain(BodyStream::new(body));
    Ok(limited(StreamBody::new(rest), limit))
}

/// A relayed request's head with the forwarded headers applied, and its body; `None`
/// when its declared length is over `limit` (413 before a byte is read).
fn admit(
    limit: usize,
    req: Request<RequestBody>,
    forwarded: &Forwarded,
) -> Option<(http::request::Parts, RequestBody)> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return None;
    }
    let (mut parts, body) = req.into_parts();
    forwarded.apply(&mut parts.headers);
    Some((parts, body))
}

async fn forward_http(
    gateway: &Arc<Route>,
    connection: &ConnectionTelemetry,
    req: Request<RequestBody>,
    forwarded: &Forwarded,
) -> Response<GatewayBody> {
    let limit = gateway.config.max_body_bytes;
    let Some((parts, body)) = admit(limit, req, forwarded) else {
        return status_only(StatusCode::PAYLOAD_TOO_LARGE);
    };
    // Cacheable methods (known from `Mcp-Method` alone) are looked up in the cache, and
    // a `server/discover` (a modern client's first request) names the client for the
    // report: both are small and read whole. Every other request stays unparsed.
    let cacheable = gateway.cache.cacheable(&parts.headers);
    let discover = parts
        .headers
        .get(&MCP_METHOD)
        .is_some_and(|m| m == "server/discover");
    if cacheable.is_some() || discover {
        // Boxed, like every branch but the plain relay below: hyper moves a request's
        // future as it starts serving it, all of its bytes.
        return Box::pin(read_whole(
            gateway, connection, parts, body, cacheable, forwarded,
        ))
        .await;
    }
    let tool_call = cache::passthrough::ToolCall::watch(&gateway.cache, &parts.headers);
    let body = match relay_body(body, limit) {
        Ok(body) => body,
        Err(status) => return status_only(status),
    };
    match send(gateway, parts, body).await {
        Ok(resp) => match tool_call {
            Some(call) => call.observe(&gateway.cache, downstream(resp)),
            None => downstream(resp),
        },
        Err(e) => upstream_failed(&e),
    }
}

/// A legacy host's request to a legacy upstream over Streamable HTTP, relayed as it is
/// (POST, the GET stream, DELETE): `Mcp-Session-Id`, `MCP-Protocol-Version` and
/// `Last-Event-ID` are end-to-end headers and go through with the rest; bodies stream
/// both ways; hop-by-hop headers are stripped; the route's instances and failover
/// apply as for modern requests. Nothing is parsed: the session is the host's and the
/// upstream's, and the gateway neither translates nor keeps it.
pub(super) async fn forward_legacy(
    gateway: &Arc<Route>,
    req: Request<RequestBody>,
    forwarded: &Forwarded,
) -> Response<GatewayBody> {
    let limit = gateway.config.max_body_bytes;
    let Some((parts, body)) = admit(limit, req, forwarded) else {
        return status_only(StatusCode::PAYLOAD_TOO_LARGE);
    };
    let span = tracing::debug_span!(
        "legacy_passthrough",
        method = %parts.method,
        session = tracing::field::Empty
    );
    if !span.is_disabled() {
        if let Some(id) = parts.headers.get(&MCP_SESSION_ID) {
            let tag = crate::digest::short_digest(id.as_bytes(), 4);
            span.record("session", tag.as_str());
        }
    }
    let body = match relay_body(body, limit) {
        Ok(body) => body,
        Err(status) => return status_only(status),
    };
    // A 4xx to an `initialize` (no session yet; 401/403 are challenges) means the
    // upstream may no longer be the legacy server it was remembered as: a modern one
    // answers `initialize` with an error (`basic/versioning.mdx`, "Compatibility
    // Matrix", Legacy → Modern). The era is probed again in the background (rate
    // limited); meanwhile the answer is relayed as it is.
    let opening =
        !parts.headers.contains_key(&MCP_SESSION_ID) && parts.method == http::Method::POST;
    match send(gateway, parts, body).instrument(span).await {
        Ok(resp) => {
            let status = resp.status();
            if opening
                && status.is_client_error()
                && !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
            {
                gateway.refresh_era();
            }
            downstream(resp)
        }
        Err(e) => upstream_failed(&e),
    }
}

/// A pass-through request read whole (small: a cacheable method, or `server/discover`,
/// which names the client for the report): looked up in the cache when cacheable,
/// else (or on a miss) sent.
async fn read_whole(
    gateway: &Arc<Route>,
    connection: &ConnectionTelemetry,
    parts: http::request::Parts,
    body: RequestBody,
    cacheable: Option<cache::Cacheable>,
    forwarded: &Forwarded,
) -> Response<GatewayBody> {
    let limit = gateway.config.max_body_bytes;
    let bytes = match read_body(body, limit).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    gateway
        .telemetry
        .identify(connection, revision_of(&parts.headers), &bytes);
    let keep = match cacheable {
        Some(method) => {
            match cache::passthrough::lookup(&gateway.cache, &parts.headers, &bytes, method, limit)
                .await
            {
                cache::passthrough::Lookup::Hit(resp) => return resp,
                cache::passthrough::Lookup::Miss(keep) => keep,
            }
        }
        None => None,
    };
    // Under `auto`, a host's `server/discover` is the modern request era detection
    // starts with: kept, in case the upstream refuses it the legacy way.
    let discover = (gateway.config.era == crate::config::UpstreamEra::Auto
        && parts
            .headers
            .get(&MCP_METHOD)
            .is_some_and(|m| m == "server/discover"))
    .then(|| (parts.clone(), bytes.clone()));
    let resp = match send(gateway, parts, full(bytes)).await {
        Ok(resp) => match discover {
            Some((parts, bytes)) => {
                match Box::pin(legacy_discover(gateway, &parts, &bytes, resp, forwarded)).await {
                    // Served by the reverse bridge: nothing of the upstream's to cache.
                    Ok(bridged) => return bridged,
                    Err(resp) => resp,
                }
            }
            None => downstream(resp),
        },
        Err(e) => upstream_failed(&e),
    };
    match keep {
        Some(keep) => keep.fetched(resp),
        None => resp,
    }
}

/// The most of a refusal's body read to tell a legacy server's refusal from a modern one.
const REFUSAL_BODY_LIMIT: usize = 64 * 1024;

/// A host's `server/discover` under `auto` that the upstream refused the legacy way (a
/// 4xx without a recognized modern error: `basic/versioning.mdx`, "Backward
/// Compatibility"): the era is probed now, and when the upstream is legacy the request
/// is served by the reverse bridge (`Ok`) instead of failing with the refusal, so a
/// modern host in front of a legacy server that was never probed is bridged from its
/// first request. Any other answer is relayed as it is (`Err`).
async fn legacy_discover(
    gateway: &Arc<Route>,
    parts: &http::request::Parts,
    bytes: &[u8],
    resp: Response<Incoming>,
    forwarded: &Forwarded,
) -> Result<Response<GatewayBody>, Response<GatewayBody>> {
    use super::upstream::era::{self, Era};
    let status = resp.status();
    if !status.is_client_error() {
        return Err(downstream(resp));
    }
    let (mut head, body) = resp.into_parts();
    let Ok(body) = Limited::new(body, REFUSAL_BODY_LIMIT).collect().await else {
        return Err(unavailable());
    };
    let body = body.to_bytes();
    strip_hop_by_hop(&mut head.headers);
    head.version = http::Version::HTTP_11;
    let refusal = Response::from_parts(head, full(body.clone()));
    let Some(seen @ Era::Legacy(_)) = era::evidence(status, &body) else {
        return Err(refusal);
    };
    // A remembered modern era is contradicted: forgotten, so the probe runs.
    gateway.refute_era(seen);
    let on_behalf = super::upstream::OnBehalf {
        authorization: parts.headers.get(header::AUTHORIZATION),
        ..Default::default()
    };
    match gateway.resolve_era(on_behalf).await {
        Ok(Era::Legacy(transport)) => {
            let forwarded = forwarded.clone();
            Ok(super::reverse::handle_read(gateway, parts, bytes, transport, forwarded).await)
        }
        _ => Err(refusal),
    }
}

/// Sends a pass-through request to the route's upstream: hop-by-hop headers stripped,
/// the instance's `Host` and URI. When an instance could not be reached, nothing was
/// sent, and the request (its body, unread, taken back) goes to the next instance. A
/// request that gets no response is counted as an upstream error (of its kind: `tls`
/// names a refused certificate, else `unreachable`) and logged.
async fn send(
    gateway: &Arc<Route>,
    mut parts: http::request::Parts,
    body: GatewayBody,
) -> Result<Response<Incoming>, UpstreamError> {
    strip_hop_by_hop(&mut parts.headers);
    // The client picks HTTP/1.1 or HTTP/2 per upstream connection, whatever the host
    // spoke to us.
    parts.version = http::Version::HTTP_11;
    let pool = &gateway.upstream;
    let sent = if pool.len() == 1 {
        let mut once = Some((parts, body));
        pool.send(|up| once.take().map(|(parts, body)| attempt(up, parts, body)))
            .await
    } else {
        let (body, slot) = Reclaim::wrap(body);
        let mut body = Some(body);
        pool.send(|up| {
            let body = body.take().or_else(|| slot.take())?;
            Some(attempt(up, parts.clone(), body))
        })
        .await
    };
    sent.map_err(|e| {
        gateway.telemetry.upstream_error(&e);
        tracing::warn!(error = %e, "upstream request failed");
        e
    })
}

/// One instance's attempt at a pass-through request.
fn attempt(
    upstream: &HttpUpstream,
    mut parts: http::request::Parts,
    body: GatewayBody,
) -> impl std::future::Future<Output = Result<Response<Incoming>, UpstreamError>> {
    if let Some(host) = upstream.host_header() {
        parts.headers.insert(header::HOST, host.clone());
    }
    parts.uri = upstream.uri().clone();
    let sent = upstream.client().request(Request::from_parts(parts, body));
    async move { sent.await.map_err(|e| UpstreamError::from_client(&e)) }
}

/// A request body that comes back if the request is dropped before the body was read
/// (the client could not connect, so nothing was sent): the next instance gets it.
struct Reclaim {
    body: Option<GatewayBody>,
    read: bool,
    slot: std::sync::Arc<std::sync::Mutex<Option<GatewayBody>>>,
}

/// Where a [`Reclaim`] leaves its body.
#[derive(Clone)]
struct Slot(std::sync::Arc<std::sync::Mutex<Option<GatewayBody>>>);

impl Slot {
    fn take(&self) -> Option<GatewayBody> {
        self.0.lock().ok()?.take()
    }
}

impl Reclaim {
    /// `body`, wrapped, and the slot it comes back to.
    fn wrap(body: GatewayBody) -> (GatewayBody, Slot) {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
        let r = Self {
            body: Some(body),
            read: false,
            slot: slot.clone(),
        };
        (r.boxed(), Slot(slot))
    }
}

impl hyper::body::Body for Reclaim {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.read = true;
        match self.body.as_mut() {
            Some(b) => std::pin::Pin::new(b).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body
            .as_ref()
            .is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.as_ref().map_or_else(
            || hyper::body::SizeHint::with_exact(0),
            hyper::body::Body::size_hint,
        )
    }
}

impl Drop for Reclaim {
    fn drop(&mut self) {
        if !self.read {
            if let (Some(body), Ok(mut slot)) = (self.body.take(), self.slot.lock()) {
                *slot = Some(body);
            }
        }
    }
}

/// The upstream's response as the caller gets it: hop-by-hop headers stripped, the
/// body streamed.
fn downstream(resp: Response<Incoming>) -> Response<GatewayBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = http::Version::HTTP_11;
    Response::from_parts(parts, body.map_err(|e| -> BoxError { Box::new(e) }).boxed())
}

/// A request body read whole, or the 413 for one over `limit` bytes.
pub(super) async fn read_body(
    body: RequestBody,
    limit: usize,
) -> Result<Bytes, Response<GatewayBody>> {
    Limited::new(body, limit)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|_| status_only(StatusCode::PAYLOAD_TOO_LARGE))
}

pub(super) fn status_only(status: StatusCode) -> Response<GatewayBody> {
    let mut r = Response::new(super::body::empty());
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "a"),
            ("connection", "keep-alive, x-hop"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("mcp-protocol-version", "2026-07-28"),
            ("content-type", "application/json"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "mcp-protocol-version"]);

        let mut none = HeaderMap::new();
        none.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut none);
        assert_eq!(none.len(), 1);
    }
}
