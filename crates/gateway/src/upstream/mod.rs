//! The upstream a gateway fronts: a modern (2026-07-28) server over HTTP, or one it
//! spawns and speaks to over stdio. One closed enum, one file per variant.

pub mod balance;
pub mod era;
mod exchange;
mod http;
pub mod legacy;
mod outbound;
mod pool;
mod stdio;

pub use self::exchange::{Exchange, Item};
pub use self::http::{
    encode_header_value, Connector, HttpUpstream, UpstreamClient, UpstreamOptions,
};
pub use self::outbound::Outbound;
pub use self::pool::{InstanceStatus, PoolError, UpstreamPool};
pub use self::stdio::StdioUpstream;

use super::forwarded::Forwarded;
use super::trace::TraceContext;
use crate::header_names::{TRACEPARENT, TRACESTATE};
use ::http::header::{self as h, HeaderMap, HeaderValue};
use ::http::StatusCode;
use bytes::Bytes;

/// An upstream's 401 or 403: relayed to the host request that caused it, unchanged
/// (the gateway is a transparent resource proxy; see `gateway::auth`).
#[derive(Debug, Clone)]
pub struct Denial {
    /// 401 or 403.
    pub status: StatusCode,
    /// Every `WWW-Authenticate` value, byte for byte.
    pub challenges: Vec<HeaderValue>,
    /// `Content-Type` of the body, if any.
    pub content_type: Option<HeaderValue>,
    /// The body (bounded by the upstream message limit).
    pub body: Bytes,
}

/// Why an exchange with the upstream failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// No connection, or it broke (for stdio: the child is down or died).
    #[error("upstream unreachable: {detail}")]
    Unreachable {
        /// What failed.
        detail: String,
    },
    /// No connection could be made (refused, timed out): nothing was sent, so another
    /// instance may take the request as it is.
    #[error("upstream unreachable: {detail}")]
    Connect {
        /// What failed.
        detail: String,
    },
    /// The upstream answered with something that is not MCP.
    #[error("upstream answered HTTP {status} without a JSON-RPC body")]
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// The TLS connection to the upstream failed; `failure` names why.
    #[error("upstream TLS failed: {failure}: {detail}")]
    Tls {
        /// The cause (unknown issuer, name mismatch, expired, …).
        failure: crate::tls::TlsFailure,
        /// What rustls said.
        detail: String,
    },
    /// The upstream refused the request's credentials (HTTP 401/403).
    #[error("upstream refused the credentials: HTTP {}", .0.status.as_u16())]
    Denied(Box<Denial>),
    /// The upstream's body could not be decoded.
    #[error("upstream sent an undecodable body: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
}

impl UpstreamError {
    /// The upstream's stream ended before the response.
    pub fn ended() -> Self {
        Self::Protocol {
            detail: "the upstream's stream ended without a response".into(),
        }
    }

    /// Whether nothing reached the upstream: no connection could be made (refused,
    /// timed out, or the TLS handshake failed).
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Tls { .. })
    }

    /// What the session machine tells the legacy host about this failure: a TLS
    /// failure gets its own reason (`data.reason`) and text; the rest is "upstream lost".
    pub fn refusal(&self) -> Option<(&'static str, String)> {
        match self {
            Self::Tls { failure, detail } => Some((
                failure.kind(),
                format!("The TLS connection to the upstream server failed: {failure} ({detail})"),
            )),
            _ => None,
        }
    }

    /// A short machine name (metric label `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unreachable { .. } | Self::Connect { .. } => "unreachable",
            Self::Status { .. } => "http_status",
            Self::Tls { .. } => "tls",
            Self::Denied(_) => "denied",
            Self::Protocol { .. } => "protocol",
        }
    }
}

/// What an upstream exchange carries on behalf of the host request that caused it:
/// the host's credentials, the forwarded headers of its connection, and its trace
/// context. The default is on behalf of nobody (the gateway's own probes and
/// listens). The stdio transport has no headers and carries none of it.
#[derive(Debug, Clone, Copy, Default)]
pub struct OnBehalf<'a> {
    /// The host's `Authorization`, relayed as it is (`gateway::auth`).
    pub authorization: Option<&'a HeaderValue>,
    /// `X-Forwarded-*` / `Forwarded`.
    pub forwarded: Option<&'a Forwarded>,
    /// `traceparent` / `tracestate` ([`super::trace`]).
    pub trace: Option<&'a TraceContext>,
}

impl OnBehalf<'_> {
    /// Sets these headers on an upstream request (replacing any of the same name).
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(auth) = self.authorization {
            headers.insert(h::AUTHORIZATION, auth.clone());
        }
        if let Some(t) = self.trace {
            headers.insert(TRACEPARENT, t.traceparent().clone());
            if let Some(state) = t.tracestate() {
                headers.insert(TRACESTATE, state.clone());
            }
        }
        if let Some(f) = self.forwarded {
            f.apply(headers);
        }
    }
}

/// The upstream server.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// Over HTTP (pooled connections).
    Http(Box<HttpUpstream>),
    /// A child process speaking newline-delimited JSON-RPC on stdio.
    Stdio(StdioUpstream),
}

impl Upstream {
    /// Sends one modern request; once the upstream accepted it (HTTP: a response head
    /// that is not a 401/403; stdio: once written), the messages it sends about it,
    /// pulled by the caller ([`Exchange`]). Dropping the exchange cancels the request
    /// upstream (HTTP: the stream closes; stdio: `notifications/cancelled`).
    ///
    /// `params` are the request's `Mcp-Param-*` headers (name, plain value), from
    /// [`Session::upstream_headers`](dualera_adapters::Session::upstream_headers); the
    /// stdio transport has no headers and MAY ignore them.
    pub async fn exchange(
        &self,
        request: &Outbound,
        on_behalf: OnBehalf<'_>,
        params: &[(String, String)],
    ) -> Result<Exchange, UpstreamError> {
        // Message bodies (never headers, so never credentials) at trace level, opt-in:
        // `DUALERA_LOG=dualera::wire=trace` prints the gateway→upstream transcript.
        let wire = tracing::enabled!(target: "dualera::wire", tracing::Level::TRACE);
        if wire {
            tracing::trace!(target: "dualera::wire", direction = "to-upstream", body = %String::from_utf8_lossy(&request.text()));
        }
        let exchange = match self {
            Self::Http(h) => h.exchange(request, on_behalf, params).await?,
            Self::Stdio(s) => s.exchange(request.message()).await?,
        };
        Ok(if wire {
            exchange.inspect(|m| {
                tracing::trace!(target: "dualera::wire", direction = "from-upstream", body = %String::from_utf8_lossy(&m.to_vec()));
            })
        } else {
            exchange
        })
    }
}
