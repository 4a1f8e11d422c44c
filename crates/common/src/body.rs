//! HTTP bodies shared by the server and the gateway: boxed, so a streamed upstream
//! body, a fixed JSON body and a live SSE channel share one type.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
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

/// `body` as one of ours, cut off with an error past `max` bytes: a relayed body
/// (a request sent upstream, an answer passed back) is never read whole first.
pub fn limited<B>(body: B, max: usize) -> GatewayBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    http_body_util::Limited::new(body, max)
        .map_err(|e| -> BoxError { e })
        .boxed()
}

/// A body fed by a channel: each message is one frame, sent as soon as it arrives
/// (no buffering), ending when every sender is gone.
#[derive(Debug)]
pub struct ChannelBody {
    /// Frames sent before anything from `rx` (a replayed backlog), not metered.
    backlog: std::collections::VecDeque<Bytes>,
    rx: mpsc::Receiver<Bytes>,
    meter: Option<Arc<Meter>>,
}

/// Bytes queued in a metered channel and not yet taken by the connection, and whether
/// the stream was cut off.
#[derive(Debug, Default)]
struct Meter {
    queued: AtomicUsize,
    cut: AtomicBool,
    /// Woken when the reader took a frame or went away ([`MeteredSender::ready`]).
    drained: tokio::sync::Notify,
}

/// Why a [`MeteredSender`] refused a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The reader is gone.
    #[error("the stream's reader is gone")]
    Closed,
    /// The reader is not keeping up: queuing this frame would exceed the byte bound.
    #[error("the stream's reader is not keeping up")]
    Stalled,
}

/// The sending side of a metered channel body: refuses frames once more than its
/// byte bound is waiting for a reader that does not read (a frame is always accepted
/// into an empty queue, whatever its size).
#[derive(Debug, Clone)]
pub struct MeteredSender {
    tx: mpsc::Sender<Bytes>,
    meter: Arc<Meter>,
    max_bytes: usize,
}

impl MeteredSender {
    /// Queues `frame` without waiting.
    pub fn try_send(&self, frame: Bytes) -> Result<(), SendError> {
        if self.tx.is_closed() {
            return Err(SendError::Closed);
        }
        let len = frame.len();
        let queued = self.meter.queued.load(Ordering::Acquire);
        if queued > 0 && queued.saturating_add(len) > self.max_bytes {
            return Err(SendError::Stalled);
        }
        self.meter.queued.fetch_add(len, Ordering::AcqRel);
        self.tx.try_send(frame).map_err(|e| {
            self.meter.queued.fetch_sub(len, Ordering::AcqRel);
            match e {
                mpsc::error::TrySendError::Closed(_) => SendError::Closed,
                mpsc::error::TrySendError::Full(_) => SendError::Stalled,
            }
        })
    }

    /// Waits, up to `limit`, until the queue is at or below half its bounds (bytes and
    /// frames) or the reader is gone: the producer then has room for what one more
    /// message may add. Returns false when the reader took too little in that time
    /// (it is not reading).
    pub async fn ready(&self, limit: std::time::Duration) -> bool {
        // The usual case (the reader keeps up) registers no waiter.
        if self.has_room() {
            return true;
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let drained = self.meter.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.has_room() {
                return true;
            }
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                return self.has_room();
            }
        }
    }

    fn has_room(&self) -> bool {
        self.tx.is_closed()
            || self.meter.cut.load(Ordering::Acquire)
            || (self.meter.queued.load(Ordering::Acquire) <= self.max_bytes / 2
                && self.tx.capacity() >= self.tx.max_capacity() / 2)
    }

    /// Whether the reader is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the reader is gone (the host hung up).
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// The byte bound.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Whether both senders feed the same body.
    pub fn same_channel(&self, other: &Self) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// Bytes waiting for the reader.
    pub fn queued(&self) -> usize {
        self.meter.queued.load(Ordering::Acquire)
    }

    /// Ends the body with an error the next time it is polled, dropping what is still
    /// queued: the connection is closed instead of finishing a stream nobody reads.
    pub fn cut(&self) {
        self.meter.cut.store(true, Ordering::Release);
    }
}

impl ChannelBody {
    /// A body and the sender that feeds it; `capacity` bounds what may be queued.
    pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, GatewayBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            tx,
            Self {
                backlog: Default::default(),
                rx,
                meter: None,
            }
            .boxed(),
        )
    }

    /// A body whose sender refuses frames beyond `capacity` frames or `max_bytes`
    /// bytes queued (see [`MeteredSender`]). `backlog` is sent first, as the reader
    /// takes it: frames already held elsewhere (a replay ring) cost no extra memory
    /// and do not count against the bound.
    pub fn metered(
        backlog: Vec<Bytes>,
        capacity: usize,
        max_bytes: usize,
    ) -> (MeteredSender, GatewayBody) {
        let (tx, rx) = mpsc::channel(capacity);
        let meter = Arc::new(Meter::default());
        let sender = MeteredSender {
            tx,
            meter: meter.clone(),
            max_bytes,
        };
        (
            sender,
            Self {
                backlog: backlog.into(),
                rx,
                meter: Some(meter),
            }
            .boxed(),
        )
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(meter) = &self.meter {
            if meter.cut.load(Ordering::Acquire) {
                return Poll::Ready(Some(Err("the stream's reader fell too far behind".into())));
            }
        }
        if let Some(frame) = self.backlog.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        let polled = self.rx.poll_recv(cx);
        if let (Poll::Ready(Some(b)), Some(meter)) = (&polled, &self.meter) {
            meter.queued.fetch_sub(b.len(), Ordering::AcqRel);
            meter.drained.notify_waiters();
        }
        polled.map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}

impl Drop for ChannelBody {
    fn drop(&mut self) {
        // A producer waiting for room learns that nobody will read.
        self.rx.close();
        if let Some(meter) = &self.meter {
            meter.drained.notify_waiters();
        }
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
