//! A modern (2026-07-28) upstream over HTTP, reached through one pooled client.
//! Pass-through uses the raw client; the legacy path uses [`HttpUpstream::exchange`],
//! which sends one JSON-RPC request and streams back what the upstream says about it.

use super::{Denial, UpstreamError};
use crate::body::{full, GatewayBody};
use crate::gateway::sse;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use dualera_adapters::jsonrpc::{self, Message};
use dualera_adapters::ProtocolVersion;
use http::header::{self, HeaderValue};
use http::{Request, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::time::Duration;

/// The upstream server and the pooled client that reaches it.
#[derive(Clone, Debug)]
pub struct HttpUpstream {
    uri: Uri,
    authority: Option<String>,
    /// `authority` as a header value, built once (pass-through sets it per request).
    host: Option<HeaderValue>,
    client: Client<HttpConnector, GatewayBody>,
    max_message: usize,
}

impl HttpUpstream {
    /// An upstream at `uri` (`http://host:port/mcp`).
    pub fn new(uri: Uri, max_message: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
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
    pub fn client(&self) -> &Client<HttpConnector, GatewayBody> {
        &self.client
    }

    /// Sends one modern request (with the 2026-07-28 mirrored headers) and calls
    /// `on_message` for every message the upstream sends about it: notifications as
    /// they stream, then the response. Dropping the future closes the upstream stream,
    /// which is how 2026-07-28 cancels a request over HTTP.
    pub async fn exchange(
        &self,
        request: &Message,
        authorization: Option<&HeaderValue>,
        params: &[(String, String)],
        on_head: impl FnOnce(),
        mut on_message: impl FnMut(Message),
    ) -> Result<(), UpstreamError> {
        let Message::Request(r) = request else {
            return Err(UpstreamError::Protocol {
                detail: "only requests are exchanged".into(),
            });
        };
        let mut builder = Request::post(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", ProtocolVersion::V2026_07_28)
            .header("mcp-method", r.method.as_str());
        if let Some(a) = &self.authority {
            builder = builder.header(header::HOST, a.as_str());
        }
        let name_field = match r.method.as_str() {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            _ => None,
        };
        if let Some(name) = name_field
            .and_then(|f| r.params.as_ref()?.get(f))
            .and_then(Value::as_str)
        {
            builder = builder.header("mcp-name", encode_header_value(name));
        }
        if let Some(auth) = authorization {
            builder = builder.header(header::AUTHORIZATION, auth.clone());
        }
        // `x-mcp-header` parameters, encoded like `Mcp-Name` (2026-07-28 transports,
        // "Value Encoding"); names were checked as field-name tokens when learned.
        for (name, value) in params {
            builder = builder.header(name.as_str(), encode_header_value(value));
        }
        let req = builder
            .body(full(Bytes::from(request.to_vec())))
            .map_err(|e| UpstreamError::Protocol {
                detail: e.to_string(),
            })?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| UpstreamError::Unreachable {
                detail: e.to_string(),
            })?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.denial(resp).await);
        }
        on_head();
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = resp.into_body();
        if is_sse {
            let mut decoder = sse::Decoder::new(self.max_message);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| UpstreamError::Unreachable {
                    detail: e.to_string(),
                })?;
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let events = decoder.feed(data).map_err(|e| UpstreamError::Protocol {
                    detail: e.to_string(),
                })?;
                for ev in events {
                    if ev.data.trim().is_empty() {
                        continue;
                    }
                    let msg = jsonrpc::parse(ev.data.as_bytes()).map_err(|e| {
                        UpstreamError::Protocol {
                            detail: e.to_string(),
                        }
                    })?;
                    let done = matches!(msg, Message::Response(_));
                    on_message(msg);
                    if done {
                        return Ok(());
                    }
                }
            }
            return Err(UpstreamError::Protocol {
                detail: "the SSE stream ended without a response".into(),
            });
        }
        let bytes = http_body_util::Limited::new(body, self.max_message)
            .collect()
            .await
            .map_err(|e| UpstreamError::Unreachable {
                detail: e.to_string(),
            })?
            .to_bytes();
        match jsonrpc::parse(&bytes) {
            Ok(msg @ Message::Response(_)) => {
                on_message(msg);
                Ok(())
            }
            _ => Err(UpstreamError::Status {
                status: status.as_u16(),
            }),
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
