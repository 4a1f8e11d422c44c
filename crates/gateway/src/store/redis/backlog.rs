//! Backpressure for shared sessions: how far each of this replica's relays has sent
//! its stream, so that an upstream exchange feeding that stream waits for a slow host
//! instead of outrunning it.
//!
//! A step appends upstream messages to a Redis Stream capped at the replay size
//! (`XADD MAXLEN`); a relay that falls further behind than that would find the entries
//! it has not sent trimmed away. So the exchange, before feeding its next message,
//! waits until the relay holding the stream is at most half the replay size behind
//! what the exchange appended: the host's socket fills, the relay waits for room, the
//! exchange waits for the relay, and the upstream's read waits for the exchange, as
//! on every in-memory wire. A relay that stops (host gone, stalled past
//! `stalled_reader_timeout`, stream taken over) drops its progress and the exchange
//! goes on: the entries stay in the stream for `Last-Event-ID`, as an in-memory
//! stream keeps its replay ring.
//!
//! Only relays of this replica are seen here. A stream whose connection another
//! replica holds (a POST stream resumed elsewhere) is not waited for; that relay
//! reports entries trimmed before it sent them (see `relay`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// Dead registrations are swept once the table holds this many.
const SWEEP_AT: usize = 1024;

/// How far one relay has sent its stream.
#[derive(Debug)]
pub(super) struct Progress {
    /// The last sequence number the relay handed to the host's connection.
    sent: AtomicU64,
    /// Notified when `sent` moves and when the relay goes (waiters hold this, not the
    /// progress, so that a relay dropped without unregistering is seen as gone).
    moved: Arc<Notify>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.moved.notify_waiters();
    }
}

impl Progress {
    /// A relay that has sent everything up to `seq`.
    pub(super) fn starting_after(seq: u64) -> Arc<Self> {
        Arc::new(Self {
            sent: AtomicU64::new(seq),
            moved: Arc::new(Notify::new()),
        })
    }

    /// The relay has sent (or passed over) everything up to `seq`.
    pub(super) fn sent(&self, seq: u64) {
        self.sent.fetch_max(seq, Ordering::Relaxed);
        self.moved.notify_waiters();
    }
}

/// This replica's relays by holder key. A registration lives as long as its relay
/// (or the POST that will start it) holds the [`Progress`]: the table keeps only a
/// weak reference, so a relay that ends without unregistering is no longer waited for.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    relays: Mutex<HashMap<String, Weak<Progress>>>,
}

impl Backlog {
    /// `progress` is the relay of the stream `holder` names from now on.
    pub(super) fn register(&self, holder: &str, progress: &Arc<Progress>) {
        let Ok(mut m) = self.relays.lock() else {
            return;
        };
        if m.len() >= SWEEP_AT {
            m.retain(|_, w| w.strong_count() > 0);
        }
        m.insert(holder.to_owned(), Arc::downgrade(progress));
    }

    /// The relay stopped: its registration goes, unless another relay replaced it.
    pub(super) fn unregister(&self, holder: &str, progress: &Arc<Progress>) {
        if let Ok(mut m) = self.relays.lock() {
            if m.get(holder)
                .is_some_and(|w| w.as_ptr() == Arc::as_ptr(progress))
            {
                m.remove(holder);
            }
        }
        progress.moved.notify_waiters();
    }

    fn relay(&self, holder: &str) -> Option<Arc<Progress>> {
        let mut m = self.relays.lock().ok()?;
        let found = m.get(holder)?.upgrade();
        if found.is_none() {
            m.remove(holder);
        }
        found
    }

    /// Waits until this replica's relay of the stream `holder` names has sent up to
    /// `seq - window`, or there is no such relay (any more), or `limit` passed.
    /// Returns whether it waited at all.
    pub(super) async fn room(&self, holder: &str, seq: u64, window: u64, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let mut waited = false;
        loop {
            let Some(relay) = self.relay(holder) else {
                return waited;
            };
            let notify = relay.moved.clone();
            let moved = notify.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if seq <= relay.sent.load(Ordering::Relaxed).saturating_add(window) {
                return waited;
            }
            // Woken when it sends, and when it stops or is dropped.
            drop(relay);
            waited = true;
            tokio::select! {
                () = &mut moved => {}
                () = tokio::time::sleep_until(deadline) => return waited,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_exchange_waits_for_its_relay_and_not_for_a_relay_that_stopped() {
        let backlog = Arc::new(Backlog::default());
        let far = Duration::from_secs(30);
        // No relay: nothing to wait for.
        assert!(!backlog.room("h", 100, 4, far).await);
        let relay = Progress::starting_after(0);
        backlog.register("h", &relay);
        // Within the window: no wait.
        assert!(!backlog.room("h", 4, 4, far).await);
        // Past it: waits until the relay catches up.
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 10, 4, far).await });
        tokio::task::yield_now().await;
        relay.sent(5);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "5 + 4 < 10: still waiting");
        relay.sent(6);
        assert!(tokio::time::timeout(far, waiting).await.unwrap().unwrap());
        // A relay that stops releases its waiters.
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 100, 4, far).await });
        tokio::task::yield_now().await;
        backlog.unregister("h", &relay);
        assert!(tokio::time::timeout(far, waiting).await.unwrap().unwrap());
        // So does one dropped without unregistering, while waited for or before.
        let other = Progress::starting_after(0);
        backlog.register("h", &other);
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 100, 4, far).await });
        tokio::task::yield_now().await;
        drop(other);
        assert!(tokio::time::timeout(far, waiting).await.unwrap().unwrap());
        let gone = Progress::starting_after(0);
        backlog.register("h", &gone);
        drop(gone);
        assert!(!backlog.room("h", 100, 4, far).await);
        // The limit bounds the wait.
        let stuck = Progress::starting_after(0);
        backlog.register("h", &stuck);
        assert!(backlog.room("h", 100, 4, Duration::from_millis(20)).await);
        // A replaced registration is not removed by the relay it replaced.
        let newer = Progress::starting_after(0);
        backlog.register("h", &newer);
        backlog.unregister("h", &stuck);
        assert!(backlog.relay("h").is_some());
    }
}
