//! The request body every listener hands its service, and the deadline that bounds
//! it. The header read timeout ends once a head is in; without this module a peer
//! could then announce `Content-Length: 4000000` and send one byte every few seconds,
//! holding a connection (and, thousands of times over, the whole connection limit)
//! before any authentication runs.
//!
//! [`RequestBody`] wraps hyper's body and reports each frame to a [`BodyClock`]; the
//! listener races the service against [`BodyClock::expired`], which resolves when the
//! body is still unfinished and either no byte came for `body_idle_timeout` or the
//! whole body took longer than `body_read_timeout`. The listener then answers 408 and
//! closes the connection.
//!
//! A body still unfinished after [`SLOW_AFTER`] is *slow*: it holds one of its peer
//! address's [`SlowBodies`] slots until it finishes, and a peer already holding
//! `max_slow_bodies_per_peer` of them gets 408 at once, so one address cannot hold
//! the connection limit with trickled bodies.

use crate::clock::now_ms;
use bytes::Bytes;
use dashmap::DashMap;
use hyper::body::{Body, Frame, SizeHint};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A body unfinished this long after its request came in counts against its peer's
/// slow-body budget.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The peer did not send the body in time (idle gap, total deadline or its
    /// address's slow-body budget).
    #[error("request body not received in time")]
    TimedOut,
    /// The connection failed while the body was read.
    #[error("reading the request body failed: {0}")]
    Read(#[from] hyper::Error),
}

/// One request body's progress, shared by the body and the listener's race.
#[derive(Debug)]
pub struct BodyClock {
    started: Instant,
    /// Last frame received, in ms on [`now_ms`].
    last_frame: AtomicU64,
    finished: AtomicBool,
    timed_out: AtomicBool,
    changed: Notify,
}

impl BodyClock {
    fn new(finished: bool) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            last_frame: AtomicU64::new(now_ms()),
            finished: AtomicBool::new(finished),
            timed_out: AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    fn finish(&self) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            self.changed.notify_waiters();
        }
    }

    /// Whether the deadline cut this body off.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Acquire)
    }

    /// Resolves when the body is still unfinished past its deadline (never once it
    /// has finished or been dropped). While the body is slow it holds a slot of
    /// `peer`'s budget in `slow`; over budget, it resolves at once.
    pub async fn expired(&self, limits: &BodyLimits, slow: &SlowBodies, peer: IpAddr) {
        let mut slot: Option<SlowSlot<'_>> = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.finished.load(Ordering::Acquire) {
                drop(slot);
                return std::future::pending().await;
            }
            let elapsed = self.started.elapsed();
            if slot.is_none() && elapsed >= SLOW_AFTER {
                match slow.take(peer, limits.max_slow_per_peer) {
                    Some(s) => slot = Some(s),
                    None => break,
                }
            }
            let idle_ms = now_ms().saturating_sub(self.last_frame.load(Ordering::Acquire));
            let idle_left = limits.idle.saturating_sub(Duration::from_millis(idle_ms));
            let total_left = limits.total.saturating_sub(elapsed);
            if idle_left.is_zero() || total_left.is_zero() {
                break;
            }
            let mut wait = idle_left.min(total_left);
            if slot.is_none() {
                wait = wait.min(SLOW_AFTER.saturating_sub(elapsed));
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = notified => {}
            }
        }
        self.timed_out.store(true, Ordering::Release);
    }
}

/// The request body a listener's service reads: hyper's body, reporting its progress
/// to the request's [`BodyClock`] and failing with [`BodyError::TimedOut`] once the
/// listener has cut it off.
#[derive(Debug)]
pub struct RequestBody {
    inner: hyper::body::Incoming,
    clock: Arc<BodyClock>,
}

impl RequestBody {
    /// Wraps a request's body; the clock is what the listener races the service with.
    pub fn new(inner: hyper::body::Incoming) -> (Self, Arc<BodyClock>) {
        let clock = BodyClock::new(inner.is_end_stream());
        (
            Self {
                inner,
                clock: clock.clone(),
            },
            clock,
        )
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // A body the service dropped is no longer the peer's to deliver.
        self.clock.finish();
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.clock.timed_out() {
            return Poll::Ready(Some(Err(BodyError::TimedOut)));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                self.clock.last_frame.store(now_ms(), Ordering::Release);
                if self.inner.is_end_stream() {
                    self.clock.finish();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.clock.finish(),
            Poll::Pending => {}
        }
        polled.map(|f| f.map(|r| r.map_err(BodyError::Read)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A listener's body deadlines (`body_idle_timeout_secs`, `body_read_timeout_secs`,
/// `max_slow_bodies_per_peer`).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Longest gap between two frames of a body.
    pub idle: Duration,
    /// Longest a whole body may take.
    pub total: Duration,
    /// Slow bodies one peer address may have in progress.
    pub max_slow_per_peer: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(10),
            total: Duration::from_secs(30),
            max_slow_per_peer: 64,
        }
    }
}

/// Slow bodies in progress per peer address, for one listener. An entry lives only
/// while its count is above zero, so the map holds at most one entry per connection.
#[derive(Debug, Default)]
pub struct SlowBodies(DashMap<IpAddr, usize>);

impl SlowBodies {
    fn take(&self, peer: IpAddr, max: usize) -> Option<SlowSlot<'_>> {
        let mut n = self.0.entry(peer).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SlowSlot { map: self, peer })
    }

    /// Slow bodies in progress from `peer`.
    pub fn held(&self, peer: IpAddr) -> usize {
        self.0.get(&peer).map_or(0, |n| *n)
    }
}

struct SlowSlot<'a> {
    map: &'a SlowBodies,
    peer: IpAddr,
}

impl Drop for SlowSlot<'_> {
    fn drop(&mut self) {
        self.map.0.remove_if_mut(&self.peer, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}
