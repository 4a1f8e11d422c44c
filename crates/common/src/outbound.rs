//! Response bytes a listener has taken from its services and not yet written to their
//! sockets, per connection and for the whole process. A host that sends requests and
//! never reads the answers makes the process hold those answers; the per-connection
//! count is what its connection holds (HTTP/1 serves the next request only once the
//! answer is written, so one connection holds at most one answer), and the
//! process-wide count bounds all of them: past `max_pending_write_bytes`, new requests
//! get 503 with `Retry-After` until the bytes drain (or their connections close).

use crate::body::{BoxError, GatewayBody};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Default `max_pending_write_bytes`.
pub const DEFAULT_MAX_PENDING: usize = 256 * 1024 * 1024;

/// Bytes taken from response bodies and not yet written, process-wide.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Response bytes pending in the whole process.
pub fn pending() -> usize {
    PENDING.load(Ordering::Acquire)
}

/// One connection's response bytes taken and not yet written.
#[derive(Debug, Default)]
pub struct ConnMeter(AtomicUsize);

impl ConnMeter {
    fn produced(&self, n: usize) {
        self.0.fetch_add(n, Ordering::AcqRel);
        PENDING.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` bytes went out on the socket (headers and framing included: the count
    /// only goes down to zero).
    pub fn written(&self, n: usize) {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let take = current.min(n);
            if take == 0 {
                return;
            }
            match self.0.compare_exchange_weak(
                current,
                current - take,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    PENDING.fetch_sub(take, Ordering::AcqRel);
                    return;
                }
                Err(now) => current = now,
            }
        }
    }

    /// Bytes this connection holds.
    pub fn pending(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for ConnMeter {
    fn drop(&mut self) {
        // The connection is gone, and what it had not written with it.
        PENDING.fetch_sub(*self.0.get_mut(), Ordering::AcqRel);
    }
}

/// A response body whose data frames are counted on their connection's meter as the
/// connection takes them.
struct Metered {
    inner: GatewayBody,
    meter: Arc<ConnMeter>,
}

impl Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.meter.produced(data.len());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `body`, counted on `meter` as its connection takes it.
pub fn metered(body: GatewayBody, meter: Arc<ConnMeter>) -> GatewayBody {
    Metered { inner: body, meter }.boxed()
}

/// The answer while the process holds more than its budget of unwritten response
/// bytes: 503 with `Retry-After`.
pub fn over_budget() -> http::Response<GatewayBody> {
    let mut r = http::Response::new(crate::body::full(
        "too many answers are waiting for their readers; try again shortly\n",
    ));
    *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    r
}
