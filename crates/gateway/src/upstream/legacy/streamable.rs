//! A legacy session over Streamable HTTP (2025-03-26 to 2025-11-25,
//! `basic/transports.mdx` of 2025-11-25): every message is a POST with
//! `Accept: application/json, text/event-stream`; after `initialize` every request
//! carries the `Mcp-Session-Id` the server assigned and the negotiated
//! `MCP-Protocol-Version`; answers come as one JSON body or an SSE stream; once the
//! session is initialized a standalone GET stream carries the server's requests and
//! notifications that belong to no request; a `404` means the server forgot the
//! session; `DELETE` ends it.

use super::{parse_one, pump_events, Core, Inner, LegacyError, SessionOptions, SseBody};
use crate::body::full;
use crate::header_names::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::upstream::{OnBehalf, UpstreamClient, UpstreamError};
use bytes::Bytes;
use dualera_adapters::jsonrpc::{Message, Request, RequestId};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, Instrument};

/// Longest `Mcp-Session-Id` accepted from the server.
const MAX_SESSION_ID: usize = 256;
/// Reconnections of the standalone GET stream in a row that may fail before the
/// session gives up on it.
const GET_RETRIES: u32 = 5;
/// The longest wait for the standalone GET stream's head before the session's first
/// request goes out anyway (a server that holds its SSE headers until a first event).
const GET_HEAD_WAIT: Duration = Duration::from_secs(3);
/// Resumptions of one response stream in a row that may fail (refused, unreachable,
/// ended with nothing new) before its request's answer is declared lost.
const RESUME_RETRIES: u32 = 5;
/// Resumptions of one response stream in all (a server that polls: closes the stream
/// after every few events).
const MAX_RESUMES: u32 = 256;
/// The wait before resuming when the server asked for none (`retry:`).
const RESUME_WAIT: Duration = Duration::from_millis(250);
/// The longest wait before resuming a server's `retry:` may ask for.
const MAX_RESUME_WAIT: Duration = Duration::from_secs(5);

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
                    headers.insert(MCP_SESSION_ID, id.clone());
                }
                if let Some(v) = &l.protocol_version {
                    headers.insert(MCP_PROTOCOL_VERSION, v.clone());
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
                .get(&MCP_SESSION_ID)
                .filter(|v| valid_session_id(v))
                .cloned();
            if let Ok(mut l) = self.learned.lock() {
                l.session_id = id;
            }
        }
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            if self.options.standalone_stream
                && matches!(message, Message::Notification(n) if n.method == "notifications/initialized")
            {
                self.open_stream(inner).await;
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
        // What this response's stream carries besides the response is about this
        // request (its log lines, progress, the server's requests during it).
        let on = match message {
            Message::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        if is_sse && status.is_success() {
            let this = self.handle();
            // The host's headers, for a resumption of this stream made on its behalf.
            let mut behalf = HeaderMap::new();
            on_behalf.apply(&mut behalf);
            inner.spawn(async move {
                let mut body = SseBody::new(resp.into_body(), max);
                let Some(id) = on else {
                    let _ = pump_events(&mut body, &core, None, |m| {
                        learn(&learned, m);
                        false
                    })
                    .await;
                    return;
                };
                let span = tracing::debug_span!(
                    "upstream_legacy_response_stream",
                    request = ?id,
                    attempt = tracing::field::Empty,
                );
                let ended = this
                    .follow(&core, &id, body, &behalf)
                    .instrument(span)
                    .await;
                if let Err(e) = ended {
                    // The consumer learns that this answer will not come (an event over
                    // the byte limit, a broken stream that cannot be resumed); the
                    // session itself goes on.
                    debug!(request = ?id, error = %e, "upstream response stream lost");
                    let _ = core.tx.send((Some(id), Err(e))).await;
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
    ///
    /// Returns once the first `GET` was answered (or failed), [`GET_HEAD_WAIT`] at
    /// most: a server sends a request that belongs to no request of the client (an SDK
    /// server's sampling or roots request made without naming the call it serves) on
    /// this stream only, and drops it while the stream is not open (the Python SDK
    /// does, without an event store). Were the session's first call sent before the
    /// stream's head came back, the server's request for that call could be lost and
    /// the call would never end.
    async fn open_stream(&self, inner: &Inner) {
        let core = inner.core.clone();
        let this = self.handle();
        // Dropped once the first `GET` has its answer (or its failure): the signal.
        let (opened, head) = tokio::sync::oneshot::channel::<()>();
        inner.spawn(async move {
            let mut opened = Some(opened);
            let mut last_event: Option<String> = None;
            let mut failures = 0u32;
            while core.is_alive() && failures < GET_RETRIES {
                let mut b = this
                    .request(Method::GET, OnBehalf::default())
                    .header(header::ACCEPT, "text/event-stream");
                if let Some(id) = last_event.as_deref() {
                    b = b.header(LAST_EVENT_ID, id);
                }
                let Ok(req) = b.body(crate::body::empty()) else {
                    return;
                };
                let resp = this.client.client().request(req).await;
                drop(opened.take());
                let resp = match resp {
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
                let ended = pump_events(&mut body, &core, None, |_| false).await;
                if let Some(id) = body.last_event_id() {
                    last_event = Some(id.to_owned());
                }
                match ended {
                    Err(None) => return,
                    Err(Some(e)) => debug!(error = %e, "upstream GET stream broke"),
                    Ok(()) => {}
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        if tokio::time::timeout(GET_HEAD_WAIT, head).await.is_err() {
            debug!("upstream GET stream not answered yet; the session goes on");
        }
    }

    /// A copy for a task of the session's (the same client, endpoint and learned
    /// headers).
    fn handle(&self) -> Self {
        Self {
            client: self.client.clone(),
            uri: self.uri.clone(),
            host: self.host.clone(),
            options: self.options.clone(),
            learned: self.learned.clone(),
        }
    }

    /// Reads the response stream of request `id` until its response, resuming it
    /// (2025-11-25 transports, "Resumability and Redelivery") when it ends before:
    /// `GET` with `Last-Event-ID` (and the session's and the host's headers) after the
    /// server's `retry` (at most [`MAX_RESUME_WAIT`]), the replay and whatever follows
    /// going to the consumer as this request's. `Err`: the response will not come (the
    /// stream broke or ended with no event id to resume from, or every resumption
    /// failed); `Ok` also when the consumer left.
    async fn follow(
        &self,
        core: &Core,
        id: &RequestId,
        mut body: SseBody,
        behalf: &HeaderMap,
    ) -> Result<(), LegacyError> {
        let mut answered = false;
        let mut resumed = false;
        let mut failures = 0u32;
        let mut resumes = 0u32;
        let mut wait = RESUME_WAIT;
        let mut last: Option<String> = None;
        loop {
            let ended = pump_events(&mut body, core, Some(id), |m| {
                learn(&self.learned, m);
                answered |= is_response_to(m, id);
                // A resumed stream may stay open after the replay: done at the answer.
                answered && resumed
            })
            .await;
            let broke = match ended {
                Err(None) => return Ok(()),
                _ if answered => return Ok(()),
                // The connection was cut: what followed can be replayed.
                Err(Some(e @ LegacyError::Upstream(UpstreamError::Unreachable { .. }))) => Some(e),
                // An event that cannot be taken (over the byte limit, undecodable):
                // resuming after it would skip it.
                Err(Some(e)) => return Err(e),
                Ok(()) => None,
            };
            if let Some(r) = body.retry() {
                wait = r.min(MAX_RESUME_WAIT);
            }
            let now = body.last_event_id().map(str::to_owned);
            if now.is_some() && now != last {
                failures = 0;
            } else if resumed {
                failures += 1;
            }
            let Some(from) = now.or(last.take()) else {
                return Err(broke.unwrap_or_else(|| {
                    LegacyError::protocol("the response stream ended without the response")
                }));
            };
            if let Some(e) = &broke {
                debug!(error = %e, "upstream response stream broke; resuming");
            }
            // Opens the resumed stream, failures in a row counted and waited off.
            body = loop {
                if failures >= RESUME_RETRIES || resumes >= MAX_RESUMES || !core.is_alive() {
                    return Err(broke.unwrap_or_else(|| {
                        LegacyError::protocol(format!(
                            "the response stream ended without the response; \
                             {resumes} resumptions did not bring it"
                        ))
                    }));
                }
                tokio::time::sleep(wait.saturating_mul(1 << failures).min(MAX_RESUME_WAIT)).await;
                resumes += 1;
                tracing::Span::current().record("attempt", resumes);
                match self.resume(&from, behalf).await {
                    Ok(Some(b)) => break b,
                    Ok(None) => {
                        core.fail(LegacyError::Expired).await;
                        return Err(LegacyError::Expired);
                    }
                    Err(e) => {
                        debug!(error = %e, "upstream response stream not resumed");
                        failures += 1;
                    }
                }
            };
            debug!("upstream response stream resumed");
            last = Some(from);
            resumed = true;
        }
    }

    /// One `GET` with `Last-Event-ID: from`: the resumed stream's body, `None` when the
    /// server forgot the session (`404`).
    async fn resume(&self, from: &str, behalf: &HeaderMap) -> Result<Option<SseBody>, LegacyError> {
        let mut b = self
            .request(Method::GET, OnBehalf::default())
            .header(header::ACCEPT, "text/event-stream");
        if let Some(headers) = b.headers_mut() {
            for (name, value) in behalf {
                headers.insert(name, value.clone());
            }
        }
        let from = HeaderValue::from_str(from)
            .map_err(|_| LegacyError::protocol("the event id is no header value"))?;
        let req = b
            .header(LAST_EVENT_ID, from)
            .body(crate::body::empty())
            .map_err(|e| LegacyError::protocol(e.to_string()))?;
        let resp = tokio::time::timeout(super::OPEN_TIMEOUT, self.client.client().request(req))
            .await
            .map_err(|_| LegacyError::protocol("the resumption got no answer in time"))?
            .map_err(|e| LegacyError::Upstream(UpstreamError::from_client(&e)))?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() || !is_sse {
            return Err(LegacyError::Upstream(UpstreamError::Status {
                status: status.as_u16(),
            }));
        }
        Ok(Some(SseBody::new(
            resp.into_body(),
            self.options.max_message,
        )))
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

/// Whether `message` is the response (a result or an error) to request `id`.
fn is_response_to(message: &Message, id: &RequestId) -> bool {
    matches!(message, Message::Response(r) if r.id.as_ref() == Some(id))
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
    UpstreamError::Denied(Box::new(crate::upstream::Denial {
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
