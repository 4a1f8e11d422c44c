//! HTTP bodies shared by the server and the gateway: boxed, so a streamed upstream
//! body, a fixed JSON body and a live SSE channel share one type.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// The error type carried by gateway bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The one body type the gateway's responses and upstream requests use.
pub type GatewayBody = BoxBody<Bytes, BoxError>;

/// A fixed body.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> GatewayBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A body fed by a channel: each message is one frame, sent as soon as it arrives
/// (no buffering), ending when every sender is gone.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender that feeds it; `capacity` bounds what may be queued.
    pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, GatewayBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, Self { rx }.boxed())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}

/// A `200` SSE response over `body`, with the headers every SSE stream gets here
/// (`no-cache`, and `X-Accel-Buffering: no` so reverse proxies do not hold events back).
pub fn sse_response(body: GatewayBody) -> http::Response<GatewayBody> {
    let mut r = http::Response::new(body);
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    h.insert("x-accel-buffering", http::HeaderValue::from_static("no"));
    r
}
