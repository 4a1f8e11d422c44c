//! Forwarding a retry to the replica whose partition task holds its round.
//!
//! A parked round is a live legacy session and the server requests it parked, held by
//! one replica's partition task: neither can move through the shared store. So a retry
//! whose sealed owner ([`super::seal::Opened::owner`]) is another replica is sent there
//! over HTTP, to the address that replica registered in the store
//! ([`crate::store::redis::RedisSessions::advertise`]; never one the request names),
//! and its answer (JSON or SSE) streams back as it comes. A forwarded request carries
//! [`HOP_HEADER`] and is never forwarded again. An owner that is not registered or
//! refuses the connection is gone, and its round with it: the host is told at once
//! ([`StateMismatch::SessionLost`](dualera_adapters::reverse::StateMismatch)).

use crate::passthrough::strip_hop_by_hop;
use crate::store::redis::RedisSessions;
use dualera_common::body::{limited, GatewayBody};
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The header a forwarded retry carries: the forwarding replica's id.
pub(super) const HOP_HEADER: &str = "dualera-forwarded-by";
/// How long connecting to the owner may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle connections kept per owner.
const IDLE_PER_OWNER: usize = 8;

/// Why a retry could not reach its owner.
#[derive(Debug, thiserror::Error)]
pub(super) enum ForwardError {
    #[error("the owning replica is not registered")]
    Unregistered,
    #[error("the shared store could not be read: {0}")]
    Store(String),
    #[error("the owning replica's address is unusable")]
    BadAddress,
    #[error("the owning replica did not answer: {0}")]
    Unreachable(String),
    #[error("the owning replica did not answer in time")]
    Timeout,
}

/// The forwarding client (one per bridge: its idle connections are bounded per owner).
pub(super) struct Forwarder {
    client: Client<HttpConnector, Full<bytes::Bytes>>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

impl Default for Forwarder {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_OWNER)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self { client }
    }
}

/// What to forward: the retry as it arrived.
pub(super) struct Retry<'a> {
    pub(super) parts: &'a http::request::Parts,
    pub(super) bytes: &'a [u8],
}

impl Forwarder {
    /// Sends `retry` to replica `owner` and returns its answer, the body streamed
    /// through (at most `max_bytes` of it); `wait` bounds the time to its head.
    pub(super) async fn forward(
        &self,
        shared: &RedisSessions,
        owner: &str,
        retry: Retry<'_>,
        wait: Duration,
        max_bytes: usize,
    ) -> Result<Response<GatewayBody>, ForwardError> {
        let base = shared
            .replica_url(owner)
            .await
            .map_err(|e| ForwardError::Store(e.to_string()))?
            .ok_or(ForwardError::Unregistered)?;
        let path = retry.parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let uri: Uri = format!("{base}{path}")
            .parse()
            .map_err(|_| ForwardError::BadAddress)?;
        let mut request = Request::new(Full::new(bytes::Bytes::copy_from_slice(retry.bytes)));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri;
        let mut headers = retry.parts.headers.clone();
        strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        let me = HeaderValue::from_str(shared.replica()).map_err(|_| ForwardError::BadAddress)?;
        headers.insert(HOP_HEADER, me);
        *request.headers_mut() = headers;
        let response = tokio::time::timeout(wait, self.client.request(request))
            .await
            .map_err(|_| ForwardError::Timeout)?
            .map_err(|e| ForwardError::Unreachable(e.to_string()))?;
        let (mut head, body) = response.into_parts();
        strip_hop_by_hop(&mut head.headers);
        Ok(Response::from_parts(head, limited(body, max_bytes)))
    }
}
