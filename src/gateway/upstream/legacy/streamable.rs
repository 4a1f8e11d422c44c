//! A legacy session over Streamable HTTP (2025-03-26 to 2025-11-25,
//! `basic/transports.mdx` of 2025-11-25): every message is a POST with
//! `Accept: application/json, text/event-stream`; after `initialize` every request
//! carries the `Mcp-Session-Id` the server assigned and the negotiated
//! `MCP-Protocol-Version`; answers come as one JSON body or an SSE stream; once the
//! session is initialized a standalone GET stream carries the server's requests and
//! notifications that belong to no request; a `404` means the server forgot the
//! session; `DELETE` ends it.

use super::{parse_one, pump_events, Inner, LegacyError, SessionOptions, SseBody};
use crate::body::full;
use crate::gateway::upstream::{OnBehalf, UpstreamClient, UpstreamError};
use bytes::Bytes;
use dualera_adapters::jsonrpc::{Message, Request, RequestId};
use http::header::{self, HeaderValue};
use http::{Method, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::debug;

/// Longest `Mcp-Session-Id` accepted from the server.
const MAX_SESSION_ID: usize = 256;
/// Reconnections of the standalone GET stream in a row that may fail before the
/// session gives up on it.
const GET_RETRIES: u32 = 5;

/// What the transport learned from the server, shared with its readers.
#[derive(Debug, Default)]
struct Learned {
    session_id: Option<HeaderValue>,
    protocol_version: Option<HeaderValue>,
    /// The id of the `initialize` in flight: its response names the version.
    initialize: Option<RequestId>,
}

#[derive(Debug)]
pub(super) struct Streamable {
    client: UpstreamClient,
    uri: Uri,
    host: Option<HeaderValue>,
    options: SessionOptions,
    learned: Arc<Mutex<Learned>>,
}

impl Streamable {
    pub(super) fn new(client: UpstreamClient, uri: Uri, options: SessionOptions) -> Self {
        let host = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        Self {
            client,
            uri,
            host,
            options,
            learned: Arc::default(),
        }
    }

    pub(super) fn session_id(&self) -> Option<String> {
        let learned = self.learned.lock().ok()?;
        learned
            .session_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// A request to the endpoint with the session's headers.
    fn request(&self, method: Method, on_behalf: OnBehalf<'_>) -> http::request::Builder {
        let mut b = http::Request::builder()
            .method(method)
            .uri(self.uri.clone());
        if let Some(h) = &self.host {
            b = b.header(header::HOST, h.clone());
        }
        if let Some(headers) = b.headers_mut() {
            if let Some(a) = &self.options.authorization {
                headers.insert(header::AUTHORIZATION, a.clone());
            }
            on_behalf.apply(headers);
            if let Ok(l) = self.learned.lock() {
                if let Some(id) = &l.session_id {
                    headers.insert("mcp-session-id", id.clone());
                }
                if let Some(v) = &l.protocol_version {
                    headers.insert("mcp-protocol-version", v.clone());
                }
            }
        }
        b
    }

    pub(super) async fn send(
        &self,
        inner: &Inner,
        message: &Message,
        on_behalf: OnBehalf<'_>,
    ) -> Result<(), LegacyError> {
        let initialize = match message {
            Message::Request(Request { id, method, .. }) if method == "initialize" => {
                if let Ok(mut l) = self.learned.lock() {
                    l.initialize = Some(id.clone());
                }
                true
            }
            _ => false,
        };
        let req = self
            .request(Method::POST, on_behalf)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(full(Bytes::from(message.to_vec())))
            .map_err(|e| LegacyError::protocol(e.to_string()))?;
        let resp = self
            .client
            .client()
            .request(req)
            .await
            .map_err(|e| LegacyError::Upstream(UpstreamError::from_client(&e)))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(LegacyError::Upstream(
                denial(resp, self.options.max_message).await,
            ));
        }
        let has_session = self.learned.lock().is_ok_and(|l| l.session_id.is_some());
        if status == StatusCode::NOT_FOUND && has_session {
            // 2025-11-25 transports, "Session Management": a 404 to a request with an
            // `Mcp-Session-Id` means the session is gone; the client MUST start a new
            // one with a fresh `initialize`.
            inner.core.fail(LegacyError::Expired).await;
            return Err(LegacyError::Expired);
        }
        if initialize && status.is_success() {
            let id = resp
                .headers()
                .get("mcp-session-id")
                .filter(|v| valid_session_id(v))
                .cloned();
            if let Ok(mut l) = self.learned.lock() {
                l.session_id = id;
            }
        }
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            if matches!(message, Message::Notification(n) if n.method == "notifications/initialized")
            {
                self.open_stream(inner);
            }
            return Ok(());
        }
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let core = inner.core.clone();
        let learned = self.learned.clone();
        let max = self.options.max_message;
        if is_sse && status.is_success() {
            let carrier = match message {
                Message::Request(r) => Some(r.id.clone()),
                _ => None,
            };
            inner.spawn(async move {
                let mut body = SseBody::new(resp.into_body(), max);
                let ended = pump_events(&mut body, &core, |_, m| {
                    learn(&learned, m);
                    if let Some(carrier) = &carrier {
                        core.note_carrier(m, carrier);
                    }
                })
                .await;
                if let Err(Some(e)) = ended {
                    // The consumer learns that this answer will not come (an event over
                    // the byte limit, a broken stream); the session itself goes on.
                    debug!(error = %e, "upstream response stream broke");
                    let _ = core.tx.send(Err(e)).await;
                }
            });
            return Ok(());
        }
        // A JSON body (a response, or the server's error for the request): read whole,
        // bounded, handed over by a task so that a full queue never blocks the sender.
        let bytes = http_body_util::Limited::new(resp.into_body(), max)
            .collect()
            .await
            .map_err(|e| {
                LegacyError::Upstream(UpstreamError::Unreachable {
                    detail: e.to_string(),
                })
            })?
            .to_bytes();
        match parse_one(&bytes) {
            Ok(m @ Message::Response(_)) => {
                learn(&learned, &m);
                inner.spawn(async move {
                    let _ = core.deliver(m).await;
                });
                Ok(())
            }
            _ if status.is_success() && bytes.is_empty() => Ok(()),
            _ => Err(LegacyError::Upstream(UpstreamError::Status {
                status: status.as_u16(),
            })),
        }
    }

    /// Opens the standalone GET stream (2025-11-25 transports, "Listening for Messages
    /// from the Server") and keeps it open: reconnected with `Last-Event-ID` when it
    /// ends, given up after [`GET_RETRIES`] failures in a row. A server that offers no
    /// such stream answers `405`, which is fine.
    fn open_stream(&self, inner: &Inner) {
        let core = inner.core.clone();
        let client = self.client.clone();
        let this = Self {
            client,
            uri: self.uri.clone(),
            host: self.host.clone(),
            options: self.options.clone(),
            learned: self.learned.clone(),
        };
        inner.spawn(async move {
            let mut last_event: Option<String> = None;
            let mut failures = 0u32;
            while core.is_alive() && failures < GET_RETRIES {
                let mut b = this
                    .request(Method::GET, OnBehalf::default())
                    .header(header::ACCEPT, "text/event-stream");
                if let Some(id) = last_event.as_deref() {
                    b = b.header("last-event-id", id);
                }
                let Ok(req) = b.body(crate::body::empty()) else {
                    return;
                };
                let resp = match this.client.client().request(req).await {
                    Ok(r) => r,
                    Err(e) => {
                        debug!(error = %e, "upstream GET stream failed");
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(200 << failures)).await;
                        continue;
                    }
                };
                match resp.status() {
                    StatusCode::METHOD_NOT_ALLOWED => return,
                    StatusCode::NOT_FOUND => {
                        core.fail(LegacyError::Expired).await;
                        return;
                    }
                    s if !s.is_success() => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(200 << failures)).await;
                        continue;
                    }
                    _ => {}
                }
                failures = 0;
                let mut body = SseBody::new(resp.into_body(), this.options.max_message);
                let ended = pump_events(&mut body, &core, |ev, _| {
                    if let Some(id) = &ev.id {
                        last_event = Some(id.clone());
                    }
                })
                .await;
                match ended {
                    Err(None) => return,
                    Err(Some(e)) => debug!(error = %e, "upstream GET stream broke"),
                    Ok(()) => {}
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }

    /// `DELETE` with the session id (bounded; a `405` means the server does not let
    /// clients end sessions, which is allowed).
    pub(super) async fn close(&self) {
        if self.session_id().is_none() {
            return;
        }
        let Ok(req) = self
            .request(Method::DELETE, OnBehalf::default())
            .body(crate::body::empty())
        else {
            return;
        };
        match tokio::time::timeout(super::OPEN_TIMEOUT, self.client.client().request(req)).await {
            Ok(Ok(resp)) => debug!(status = resp.status().as_u16(), "upstream session deleted"),
            Ok(Err(e)) => debug!(error = %e, "upstream session DELETE failed"),
            Err(_) => debug!("upstream session DELETE timed out"),
        }
    }
}

/// Notes the negotiated version from the response to the `initialize` in flight.
fn learn(learned: &Mutex<Learned>, message: &Message) {
    let Message::Response(r) = message else {
        return;
    };
    let Ok(mut l) = learned.lock() else { return };
    if l.initialize.is_none() || l.initialize.as_ref() != r.id.as_ref() {
        return;
    }
    l.initialize = None;
    if let Ok(result) = &r.outcome {
        l.protocol_version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| v.len() <= 32)
            .and_then(|v| HeaderValue::from_str(v).ok());
    }
}

/// 2025-11-25 transports: the session id "MUST only contain visible ASCII characters
/// (ranging from 0x21 to 0x7E)".
fn valid_session_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= MAX_SESSION_ID && b.iter().all(|c| (0x21..=0x7e).contains(c))
}

/// A 401/403 as the upstream error the rest of the gateway relays.
async fn denial(resp: http::Response<hyper::body::Incoming>, max: usize) -> UpstreamError {
    let (parts, body) = resp.into_parts();
    let body = http_body_util::Limited::new(body, max)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    UpstreamError::Denied(Box::new(crate::gateway::upstream::Denial {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_visible_ascii_and_bounded() {
        assert!(valid_session_id(&HeaderValue::from_static("abc-123")));
        assert!(!valid_session_id(&HeaderValue::from_static("")));
        assert!(!valid_session_id(&HeaderValue::from_static("a b")));
        let long = "a".repeat(MAX_SESSION_ID + 1);
        assert!(!valid_session_id(&HeaderValue::from_str(&long).unwrap()));
    }

    #[test]
    fn the_version_is_learned_from_the_initialize_response_only() {
        use dualera_adapters::jsonrpc::Response;
        let learned = Mutex::new(Learned {
            initialize: Some(RequestId::Number(1)),
            ..Learned::default()
        });
        let other = Message::Response(Response::result(
            RequestId::Number(2),
            serde_json::json!({ "protocolVersion": "2024-11-05" }),
        ));
        learn(&learned, &other);
        assert!(learned.lock().unwrap().protocol_version.is_none());
        let init = Message::Response(Response::result(
            RequestId::Number(1),
            serde_json::json!({ "protocolVersion": "2025-11-25" }),
        ));
        learn(&learned, &init);
        let l = learned.lock().unwrap();
        assert_eq!(l.protocol_version.as_ref().unwrap(), "2025-11-25");
        assert!(l.initialize.is_none());
    }
}
