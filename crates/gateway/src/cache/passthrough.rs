//! The cache on the modern pass-through path, as a layer the pass-through handler
//! drives: it never sends anything itself. Only requests whose `Mcp-Method` names a
//! cacheable operation are looked up (the handler reads the small body, the key is
//! built from it); a hit is the cached response with the caller's JSON-RPC id spliced
//! in — the result bytes are the upstream's own, never re-serialized — and a miss is
//! forwarded by the handler as usual, its response handed back here to be kept on the
//! way to the caller if it may be cached.
//!
//! The one other request this module looks at is a `tools/call` answered with HTTP
//! 400/404 (how a JSON-RPC error reaches a modern client): only then is the small
//! error body read, to drop a cached `tools/list` that still lists the tool.

use super::key::{self, Cacheable, Caller};
use super::{Begin, Fetch, ResponseCache};
use crate::body::{full, BoxError, GatewayBody};
use crate::header_names::{MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION};
use crate::sse;
use crate::upstream::encode_header_value;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Largest error body read after a failed `tools/call`.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// What the cache makes of a cacheable pass-through request whose body is in hand.
pub(crate) enum Lookup {
    /// Answered from the cache: send this, not the request.
    Hit(Response<GatewayBody>),
    /// Send the request; when it is `Some`, hand the upstream's response to [`Keep`].
    Miss(Option<Keep>),
}

/// Looks a cacheable pass-through request up (its `method` known from `Mcp-Method`,
/// its `body` read whole by the caller, at most `limit` bytes). A request that is not
/// provably the one an entry answers is a miss the cache does not keep: the upstream
/// has its say.
pub(crate) async fn lookup(
    cache: &Arc<ResponseCache>,
    headers: &HeaderMap,
    body: &Bytes,
    method: Cacheable,
    limit: usize,
) -> Lookup {
    let parsed = headers
        .get(&MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .and_then(|version| key::parse_request(body, cache.route(), method, version))
        .filter(|p| servable(headers, p));
    let Some(parsed) = parsed else {
        return Lookup::Miss(None);
    };
    let caller = Caller::from_authorization(headers.get(header::AUTHORIZATION));
    let id = body.slice(parsed.id.clone());
    match cache.begin(parsed.key, caller, true).await {
        Begin::Hit(entry) => Lookup::Hit(answer(entry.with_id(&id))),
        Begin::Fetch(fetch) => Lookup::Miss(Some(Keep {
            cache: cache.clone(),
            fetch,
            id,
            limit,
        })),
    }
}

/// A miss the cache waits on: the upstream's response, once the caller has it, goes
/// through [`Keep::fetched`].
pub(crate) struct Keep {
    cache: Arc<ResponseCache>,
    fetch: Fetch,
    /// The caller's JSON-RPC id, spliced into a stale entry served instead.
    id: Bytes,
    limit: usize,
}

/// Checks the headers the upstream would check against the body and the cache cannot
/// see in the key: `Accept` must allow JSON (a hit is answered as JSON), and a
/// `resources/read` must name its URI in `Mcp-Name` (2026-07-28 transports, "Request
/// headers"; the upstream answers a mismatch with `-32020`).
fn servable(headers: &HeaderMap, parsed: &key::ParsedRequest) -> bool {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|a| a.contains("application/json") || a.contains("*/*"));
    let accept = accept || !headers.contains_key(header::ACCEPT);
    let name_ok = match parsed.key.uri.as_deref() {
        Some(uri) => headers
            .get(&MCP_NAME)
            .is_some_and(|v| v.as_bytes() == encode_header_value(uri).as_bytes()),
        None => parsed.key.method != Cacheable::ResourcesRead,
    };
    accept && name_ok
}

/// A cached response, as JSON.
fn answer(body: Bytes) -> Response<GatewayBody> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl Keep {
    /// The upstream answered the miss (`resp`, or the gateway's own 5xx when it could
    /// not be reached): a stale entry is served instead of a server error when one may
    /// be, a 200 is relayed and kept for the cache as it streams by, anything else is
    /// relayed untouched.
    pub(crate) fn fetched(self, resp: Response<GatewayBody>) -> Response<GatewayBody> {
        let Self {
            cache,
            fetch,
            id,
            limit,
        } = self;
        if resp.status().is_server_error() {
            if let Some(stale) = &fetch.stale {
                cache.served_stale();
                tracing::info!("upstream failed; stale cache entry served");
                return answer(stale.with_id(&id));
            }
            return resp;
        }
        if resp.status() != StatusCode::OK {
            return resp;
        }
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let (parts, body) = resp.into_parts();
        let captured = Capture::new(
            body,
            limit.min(usize::try_from(cache.max_item).unwrap_or(usize::MAX)),
            Box::new(move |bytes: Bytes| {
                let body = if is_sse {
                    only_response(&bytes, limit)
                } else {
                    Some(bytes)
                };
                if let Some(body) = body {
                    cache.store(&fetch, body, true);
                }
            }),
        );
        Response::from_parts(parts, captured.boxed())
    }
}

/// The data of an SSE body that carried exactly one message, the response; `None`
/// when anything else was streamed (a response that came after notifications is
/// never cached).
fn only_response(bytes: &[u8], limit: usize) -> Option<Bytes> {
    let mut decoder = sse::Decoder::new(limit);
    let events = decoder.feed(bytes).ok()?;
    let mut data = events.into_iter().filter(|e| !e.data.trim().is_empty());
    let first = data.next()?;
    if data.next().is_some() {
        return None;
    }
    Some(Bytes::from(first.data))
}

/// Watches a pass-through `tools/call` for an error that invalidates a cached list.
#[derive(Debug)]
pub(crate) struct ToolCall {
    tool: HeaderValue,
}

impl ToolCall {
    /// `Some` for a `tools/call` (by its headers) while the cache is on.
    pub(crate) fn watch(cache: &ResponseCache, headers: &HeaderMap) -> Option<Self> {
        if !cache.enabled() || headers.get(&MCP_METHOD)? != "tools/call" {
            return None;
        }
        Some(Self {
            tool: headers.get(&MCP_NAME)?.clone(),
        })
    }

    /// Passes the response on; a 400 or 404 for a tool a cached `tools/list` shows is
    /// read (bounded) on its way to find the JSON-RPC error code.
    pub(crate) fn observe(
        self,
        cache: &Arc<ResponseCache>,
        resp: Response<GatewayBody>,
    ) -> Response<GatewayBody> {
        if !matches!(
            resp.status(),
            StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND
        ) {
            return resp;
        }
        let Ok(tool) = self.tool.to_str() else {
            return resp;
        };
        if !cache.lists_tool(tool) {
            return resp;
        }
        let tool = tool.to_owned();
        let cache = cache.clone();
        let (parts, body) = resp.into_parts();
        let captured = Capture::new(
            body,
            ERROR_BODY_LIMIT,
            Box::new(move |bytes: Bytes| {
                let code = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.pointer("/error/code").and_then(serde_json::Value::as_i64));
                if let Some(code) = code {
                    cache.tool_call_failed(&tool, code);
                }
            }),
        );
        Response::from_parts(parts, captured.boxed())
    }
}

type OnEnd = Box<dyn FnOnce(Bytes) + Send + Sync>;

/// A body passed through frame by frame while a copy is kept (up to `limit`; past it
/// the copy is dropped); `on_end` gets the copy once the body ended whole. Dropped
/// early (the caller went away), it never calls `on_end`.
struct Capture<B> {
    inner: B,
    buf: Vec<u8>,
    limit: usize,
    on_end: Option<OnEnd>,
}

impl<B> Capture<B> {
    fn new(inner: B, limit: usize, on_end: OnEnd) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            limit,
            on_end: Some(on_end),
        }
    }

    fn finish(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(Bytes::from(std::mem::take(&mut self.buf)));
        }
    }
}

impl<B> Body for Capture<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    if this.on_end.is_some() {
                        if this.buf.len() + d.len() > this.limit {
                            this.on_end = None;
                            this.buf = Vec::new();
                        } else {
                            this.buf.extend_from_slice(d);
                        }
                    }
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.on_end = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
