//! A modern (2026-07-28) upstream over HTTP or HTTPS, reached through one pooled client.
//! Pass-through uses the raw client; the legacy path uses [`HttpUpstream::exchange`],
//! which sends one JSON-RPC request and hands back what the upstream says about it as
//! an [`Exchange`] pulled frame by frame.
//!
//! HTTPS is rustls (ring) through hyper-rustls, with the roots of [`crate::tls::client_config`];
//! SNI is the URL's host. When the upstream offers `h2` by ALPN (and `upstream_http2`
//! is not `never`) one HTTP/2 connection carries every request, and dropping a
//! request's future resets its stream, which is how 2026-07-28 cancels. Plain
//! `http://` upstreams stay HTTP/1.1.
//!
//! [`UpstreamClient`] is the shared part (TLS configuration and connection pool): an
//! upstream with several instances holds one [`HttpUpstream`] per instance URL, all
//! cloned from one client.

use super::{Denial, UpstreamError};
use super::{Exchange, Item, OnBehalf, Outbound};
use crate::body::{full, GatewayBody};
use crate::config::UpstreamHttp2;
use crate::header_names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};
use crate::sse;
use crate::tls::{TlsError, TlsFailure};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dualera_adapters::jsonrpc::{self, Message};
use dualera_adapters::ProtocolVersion;
use http::header::{self, HeaderValue};
use http::{Request, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

/// The connector every upstream request goes through (HTTP or HTTPS by the URL).
pub type Connector = HttpsConnector<HttpConnector>;

/// How the gateway reaches HTTP upstreams.
#[derive(Debug, Clone, Default)]
pub struct UpstreamOptions {
    /// A PEM bundle trusted besides the system and webpki roots.
    pub extra_ca: Option<PathBuf>,
    /// HTTP/2 by ALPN, or never.
    pub http2: UpstreamHttp2,
}

/// The pooled client shared by every HTTP upstream (cheap to clone).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: Client<Connector, GatewayBody>,
}

impl UpstreamClient {
    /// A client trusting the system roots, the webpki roots and `options.extra_ca`.
    pub fn new(options: &UpstreamOptions) -> Result<Self, TlsError> {
        let tls = crate::tls::client_config(options.extra_ca.as_deref())?;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        // `https_or_http`: the scheme of each request's URI decides.
        http.enforce_http(false);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match options.http2 {
            UpstreamHttp2::Auto => builder.enable_http1().enable_http2().wrap_connector(http),
            UpstreamHttp2::Never => builder.enable_http1().wrap_connector(http),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
        Ok(Self { client })
    }

    /// The hyper client.
    pub fn client(&self) -> &Client<Connector, GatewayBody> {
        &self.client
    }
}

/// One upstream endpoint and the pooled client that reaches it.
#[derive(Clone, Debug)]
pub struct HttpUpstream {
    uri: Uri,
    authority: Option<String>,
    /// `authority` as a header value, built once (pass-through sets it per request).
    host: Option<HeaderValue>,
    client: UpstreamClient,
    max_message: usize,
}

impl HttpUpstream {
    /// An upstream at `uri` (`http://host:port/mcp` or `https://…`) with a client of
    /// its own (default options: system and webpki roots, HTTP/2 when offered).
    pub fn new(uri: Uri, max_message: usize) -> Result<Self, TlsError> {
        Ok(Self::with_client(
            uri,
            UpstreamClient::new(&UpstreamOptions::default())?,
            max_message,
        ))
    }

    /// An upstream at `uri` reached through a shared `client`.
    pub fn with_client(uri: Uri, client: UpstreamClient, max_message: usize) -> Self {
        let authority = uri.authority().map(|a| a.as_str().to_owned());
        let host = authority
            .as_deref()
            .and_then(|a| HeaderValue::from_str(a).ok());
        Self {
            uri,
            authority,
            host,
            client,
            max_message,
        }
    }

    /// The upstream endpoint.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// `host:port` of the upstream.
    pub fn authority(&self) -> Option<&str> {
        self.authority.as_deref()
    }

    /// `host:port` of the upstream as a `Host` header value.
    pub fn host_header(&self) -> Option<&HeaderValue> {
        self.host.as_ref()
    }

    /// The pooled client.
    pub fn client(&self) -> &Client<Connector, GatewayBody> {
        self.client.client()
    }

    /// The shared client itself (legacy upstream sessions and the era probe reach the
    /// same endpoint through it).
    pub fn upstream_client(&self) -> &UpstreamClient {
        &self.client
    }

    /// Sends one modern request (with the 2026-07-28 mirrored headers); once the
    /// upstream accepted it, the messages it sends about it, read from the response
    /// body only as the caller pulls them ([`Exchange`]). Dropping the exchange closes
    /// the upstream stream, which is how 2026-07-28 cancels a request over HTTP.
    pub async fn exchange(
        &self,
        request: &Outbound,
        on_behalf: OnBehalf<'_>,
        params: &[(String, String)],
    ) -> Result<Exchange, UpstreamError> {
        let Message::Request(r) = request.message() else {
            return Err(UpstreamError::Protocol {
                detail: "only requests are exchanged".into(),
            });
        };
        // The head is written into the request's own map with names known at compile
        // time: a `Request::builder` parses every name and moves itself per header.
        let mut req = Request::new(full(request.text()));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.uri.clone();
        // Room for every header below and the on-behalf ones (authorization, trace
        // context, three forwarded): the map would otherwise grow, and rehash, twice.
        *req.headers_mut() = http::HeaderMap::with_capacity(12 + params.len());
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        h.insert(
            MCP_PROTOCOL_VERSION,
            HeaderValue::from_static(ProtocolVersion::V2026_07_28),
        );
        if let Some(host) = &self.host {
            h.insert(header::HOST, host.clone());
        }
        // A method, name or parameter that cannot be a header value fails the exchange.
        fn invalid(e: impl std::fmt::Display) -> UpstreamError {
            UpstreamError::Protocol {
                detail: e.to_string(),
            }
        }
        let method = HeaderValue::from_str(r.method.as_str()).map_err(invalid)?;
        let name_field = match r.method.as_str() {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            // The tasks extension's methods name their task (the session machine sends
            // them for 2025-11-25 hosts' tasks).
            "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
            _ => None,
        };
        h.insert(MCP_METHOD, method);
        if let Some(name) = name_field
            .and_then(|f| r.params.as_ref()?.get(f))
            .and_then(Value::as_str)
        {
            let value = HeaderValue::try_from(encode_header_value(name)).map_err(invalid)?;
            h.insert(MCP_NAME, value);
        }
        // `x-mcp-header` parameters, encoded like `Mcp-Name` (2026-07-28 transports,
        // "Value Encoding"); names were checked as field-name tokens when learned.
        for (name, value) in params {
            let name = http::header::HeaderName::from_bytes(name.as_bytes()).map_err(invalid)?;
            let value = HeaderValue::try_from(encode_header_value(value)).map_err(invalid)?;
            h.append(name, value);
        }
        on_behalf.apply(h);
        let resp = self
            .client()
            .request(req)
            .await
            .map_err(|e| UpstreamError::from_client(&e))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.denial(resp).await);
        }
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = resp.into_body();
        if is_sse {
            return Ok(Exchange::new(
                SseMessages::new(body, self.max_message).into_stream(),
            ));
        }
        let max = self.max_message;
        Ok(Exchange::new(futures_util::stream::once(async move {
            let bytes = http_body_util::Limited::new(body, max)
                .collect()
                .await
                .map_err(|e| UpstreamError::Unreachable {
                    detail: e.to_string(),
                })?
                .to_bytes();
            match jsonrpc::parse(&bytes) {
                Ok(msg @ Message::Response(_)) => Ok(msg),
                _ => Err(UpstreamError::Status {
                    status: status.as_u16(),
                }),
            }
        })))
    }
}

/// An upstream SSE response body decoded into messages, one body frame at a time:
/// the next frame is read only once every message of the last one was taken.
struct SseMessages {
    body: hyper::body::Incoming,
    decoder: sse::Decoder,
    /// Decoded from the last frame and not yet taken; an error, if any, is last.
    ready: VecDeque<Item>,
    /// A response or an error is queued: nothing more is read.
    ended: bool,
}

impl SseMessages {
    fn new(body: hyper::body::Incoming, max_message: usize) -> Self {
        Self {
            body,
            decoder: sse::Decoder::new(max_message),
            ready: VecDeque::new(),
            ended: false,
        }
    }

    fn into_stream(self) -> impl futures_util::Stream<Item = Item> + Send + 'static {
        futures_util::stream::unfold(self, |mut s| async move {
            loop {
                if let Some(item) = s.ready.pop_front() {
                    return Some((item, s));
                }
                if s.ended {
                    return None;
                }
                match s.body.frame().await {
                    None => return None,
                    Some(Err(e)) => {
                        s.end(Err(UpstreamError::Unreachable {
                            detail: e.to_string(),
                        }));
                    }
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            s.decode(data);
                        }
                    }
                }
            }
        })
    }

    fn end(&mut self, last: Item) {
        self.ready.push_back(last);
        self.ended = true;
    }

    fn decode(&mut self, data: &[u8]) {
        let events = match self.decoder.feed(data) {
            Ok(events) => events,
            Err(e) => {
                return self.end(Err(UpstreamError::Protocol {
                    detail: e.to_string(),
                }))
            }
        };
        for ev in events {
            if ev.data.trim().is_empty() {
                continue;
            }
            match jsonrpc::parse(ev.data.as_bytes()) {
                Ok(msg @ Message::Response(_)) => return self.end(Ok(msg)),
                Ok(msg) => self.ready.push_back(Ok(msg)),
                Err(e) => {
                    return self.end(Err(UpstreamError::Protocol {
                        detail: e.to_string(),
                    }))
                }
            }
        }
    }
}

impl UpstreamError {
    /// Classifies a client error: a TLS failure names its cause, a connection that
    /// could not be made is [`UpstreamError::Connect`], anything else is "unreachable";
    /// each with the whole error chain.
    pub fn from_client(e: &hyper_util::client::legacy::Error) -> Self {
        if let Some((failure, detail)) = TlsFailure::find(e) {
            return Self::Tls { failure, detail };
        }
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            source = s.source();
        }
        if e.is_connect() {
            // No connection: nothing was sent (another instance may take it).
            Self::Connect { detail }
        } else {
            Self::Unreachable { detail }
        }
    }
}

impl HttpUpstream {
    /// A 401/403 as a typed outcome: status, every challenge, and the (bounded) body.
    async fn denial(&self, resp: http::Response<hyper::body::Incoming>) -> UpstreamError {
        let (parts, body) = resp.into_parts();
        let body = http_body_util::Limited::new(body, self.max_message)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        UpstreamError::Denied(Box::new(Denial {
            status: parts.status,
            challenges: parts
                .headers
                .get_all(header::WWW_AUTHENTICATE)
                .iter()
                .cloned()
                .collect(),
            content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
            body,
        }))
    }
}

/// Encodes a value for `Mcp-Name` (plain when header-safe, else the base64 sentinel).
pub fn encode_header_value(v: &str) -> String {
    let sentinel = v.starts_with("=?base64?") && v.ends_with("?=");
    let plain = !v.is_empty()
        && v.bytes().all(|b| (0x21..=0x7e).contains(&b) || b == b' ')
        && !v.starts_with(' ')
        && !v.ends_with(' ')
        && !sentinel;
    if plain {
        v.to_owned()
    } else {
        format!("=?base64?{}?=", STANDARD.encode(v.as_bytes()))
    }
}
