//! Modern pass-through: a 2026-07-28 request is proxied without its body being parsed
//! or buffered. Headers are kept except hop-by-hop ones, the upstream status is kept,
//! SSE flows frame by frame, and a client that goes away drops the upstream request.

use crate::body::{full, BoxError, GatewayBody};
use super::Gateway;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

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
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(n);
    }
    headers.remove("keep-alive");
}

/// Proxies one modern request to the upstream.
pub async fn forward(gateway: &Gateway, req: Request<Incoming>) -> Response<GatewayBody> {
    let limit = gateway.config.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return status_only(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(authority) = gateway.upstream.authority() {
        if let Ok(v) = HeaderValue::from_str(authority) {
            parts.headers.insert(header::HOST, v);
        }
    }
    parts.uri = gateway.upstream.uri().clone();
    let body: GatewayBody = Limited::new(body, limit)
        .map_err(|e| -> BoxError { e })
        .boxed();
    let upstream_req = Request::from_parts(parts, body);
    match gateway.upstream.client().request(upstream_req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(|e| -> BoxError { Box::new(e) }).boxed())
        }
        Err(e) => {
            tracing::warn!(error = %e, "upstream request failed");
            let mut r = Response::new(full(Bytes::from_static(
                br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"Upstream unavailable"}}"#,
            )));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
    }
}

fn status_only(status: StatusCode) -> Response<GatewayBody> {
    let mut r = Response::new(super::body::empty());
    *r.status_mut() = status;
    r
}
