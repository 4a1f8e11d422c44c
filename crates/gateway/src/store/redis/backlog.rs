//! Backpressure for shared sessions: how far the relay of each stream this replica's
//! exchanges feed has sent it, so that the exchange waits for a slow host instead of
//! outrunning it.
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
//! A relay on another replica (a stream resumed there with `Last-Event-ID` while its
//! exchange still runs here) is seen through acks: the step script tells the writer
//! that it published its entries to another replica's relay, the writer registers a
//! progress for that stream starting just before them, and that relay publishes how
//! far it has sent to the writer's channel every [`ack_every`] entries, and once more
//! when it stops (`wake`); its first ack goes out with the first entry it gets. A
//! remote relay that goes silent (its replica died) is waited for once, up to the
//! limit, and one that never acks (a replica from before acks) for [`FIRST_ACK`];
//! then the exchange no longer follows that stream.

use crate::store::OwnHasher;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// Dead registrations are swept once the table holds this many.
const SWEEP_AT: usize = 1024;

/// How long a followed remote relay may take to send its first ack (it sends one
/// with the first entry it gets) before it counts as one that never will.
pub(super) const FIRST_ACK: Duration = Duration::from_secs(2);

/// How far behind what an exchange appended its stream's relay may be, for a stream
/// capped at `replay` entries: half the cap, so a step's entries never push out what
/// the relay has still to send (0 with a cap of 1: the relay must be caught up).
pub(super) fn window(replay: usize) -> u64 {
    u64::try_from(replay / 2).unwrap_or(u64::MAX)
}

/// How often a relay fed by another replica tells it how far it has sent: every
/// half window, so the writer's view lags by less than that.
pub(super) fn ack_every(replay: usize) -> u64 {
    (window(replay) / 2).max(1)
}

/// What waiting for a relay came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// No wait: within the window, or no relay to wait for.
    Free,
    /// Waited until the relay caught up or went.
    Waited,
    /// Waited the whole limit without the relay catching up.
    TimedOut,
}

/// How far one relay has sent its stream.
#[derive(Debug)]
pub(super) struct Progress {
    /// The last sequence number the relay handed to the host's connection.
    sent: AtomicU64,
    /// Notified when `sent` moves and when the relay goes (waiters hold this, not the
    /// progress, so that a relay dropped without unregistering is seen as gone).
    moved: Arc<Notify>,
    /// Another replica's relay, moved by its acks (which never move a relay of this
    /// replica: a late ack or stop of a relay the stream was taken from is ignored).
    remote: bool,
    /// A remote relay has acked at least once.
    heard: AtomicBool,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.moved.notify_waiters();
    }
}

impl Progress {
    /// A relay of this replica that has sent everything up to `seq`.
    pub(super) fn starting_after(seq: u64) -> Arc<Self> {
        Self::new(seq, false)
    }

    /// Another replica's relay, taken to have sent everything up to `seq`.
    pub(super) fn remote_after(seq: u64) -> Arc<Self> {
        Self::new(seq, true)
    }

    fn new(seq: u64, remote: bool) -> Arc<Self> {
        Arc::new(Self {
            sent: AtomicU64::new(seq),
            moved: Arc::new(Notify::new()),
            remote,
            heard: AtomicBool::new(false),
        })
    }

    /// The relay has sent (or passed over) everything up to `seq`.
    pub(super) fn sent(&self, seq: u64) {
        self.sent.fetch_max(seq, Ordering::Relaxed);
        self.moved.notify_waiters();
    }
}

/// Relays by holder key: this replica's, and other replicas' that its exchanges
/// follow. A registration lives as long as its relay (or the POST that will start it,
/// or the exchange following a remote relay) holds the [`Progress`]: the table keeps
/// only a weak reference, so one that ends without unregistering is not waited for.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    relays: Mutex<HashMap<String, Weak<Progress>, OwnHasher>>,
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

    /// Whether `progress` is still the registered relay of `holder`.
    pub(super) fn holds(&self, holder: &str, progress: &Arc<Progress>) -> bool {
        self.relays.lock().is_ok_and(|m| {
            m.get(holder)
                .is_some_and(|w| w.as_ptr() == Arc::as_ptr(progress))
        })
    }

    /// Another replica's relay of `holder` has sent up to `seq`.
    pub(super) fn acked(&self, holder: &str, seq: u64) {
        if let Some(p) = self.relay(holder).filter(|p| p.remote) {
            p.heard.store(true, Ordering::Relaxed);
            p.sent(seq);
        }
    }

    /// Another replica's relay of `holder` stopped: nothing to wait for there.
    pub(super) fn stopped(&self, holder: &str) {
        let gone = self.relays.lock().ok().and_then(|mut m| {
            let remote = m.get(holder)?.upgrade()?;
            if !remote.remote {
                return None;
            }
            m.remove(holder);
            Some(remote)
        });
        if let Some(p) = gone {
            p.moved.notify_waiters();
        }
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
    /// `seq - window`, or there is no such relay (any more), or `limit` passed
    /// ([`FIRST_ACK`], if shorter, for a remote relay not heard from yet).
    pub(super) async fn room(&self, holder: &str, seq: u64, window: u64, limit: Duration) -> Room {
        let start = tokio::time::Instant::now();
        let mut waited = Room::Free;
        loop {
            let Some(relay) = self.relay(holder) else {
                return waited;
            };
            let deadline = if relay.remote && !relay.heard.load(Ordering::Relaxed) {
                start + limit.min(FIRST_ACK)
            } else {
                start + limit
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
            waited = Room::Waited;
            tokio::select! {
                () = &mut moved => {}
                () = tokio::time::sleep_until(deadline) => return Room::TimedOut,
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
        assert_eq!(Room::Free, backlog.room("h", 100, 4, far).await);
        let relay = Progress::starting_after(0);
        backlog.register("h", &relay);
        // Within the window: no wait.
        assert_eq!(Room::Free, backlog.room("h", 4, 4, far).await);
        // Past it: waits until the relay catches up.
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 10, 4, far).await });
        tokio::task::yield_now().await;
        relay.sent(5);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "5 + 4 < 10: still waiting");
        relay.sent(6);
        assert_eq!(
            Room::Waited,
            tokio::time::timeout(far, waiting).await.unwrap().unwrap()
        );
        // A relay that stops releases its waiters.
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 100, 4, far).await });
        tokio::task::yield_now().await;
        backlog.unregister("h", &relay);
        assert_eq!(
            Room::Waited,
            tokio::time::timeout(far, waiting).await.unwrap().unwrap()
        );
        // So does one dropped without unregistering, while waited for or before.
        let other = Progress::starting_after(0);
        backlog.register("h", &other);
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("h", 100, 4, far).await });
        tokio::task::yield_now().await;
        drop(other);
        assert_eq!(
            Room::Waited,
            tokio::time::timeout(far, waiting).await.unwrap().unwrap()
        );
        let gone = Progress::starting_after(0);
        backlog.register("h", &gone);
        drop(gone);
        assert_eq!(Room::Free, backlog.room("h", 100, 4, far).await);
        // The limit bounds the wait.
        let stuck = Progress::starting_after(0);
        backlog.register("h", &stuck);
        assert_eq!(
            Room::TimedOut,
            backlog.room("h", 100, 4, Duration::from_millis(20)).await
        );
        // A replaced registration is not removed by the relay it replaced.
        let newer = Progress::starting_after(0);
        backlog.register("h", &newer);
        backlog.unregister("h", &stuck);
        assert!(backlog.holds("h", &newer));
        // Acks and stops never touch a relay of this replica.
        backlog.acked("h", 50);
        backlog.stopped("h");
        assert!(backlog.holds("h", &newer));
        assert_eq!(newer.sent.load(Ordering::Relaxed), 0);
        // A remote relay: acks move it, and its stop releases the waiter.
        let remote = Progress::remote_after(9);
        backlog.register("r", &remote);
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("r", 20, 4, far).await });
        tokio::task::yield_now().await;
        backlog.acked("r", 12);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "12 + 4 < 20: still waiting");
        backlog.acked("r", 16);
        assert_eq!(
            Room::Waited,
            tokio::time::timeout(far, waiting).await.unwrap().unwrap()
        );
        let b = backlog.clone();
        let waiting = tokio::spawn(async move { b.room("r", 100, 4, far).await });
        tokio::task::yield_now().await;
        backlog.stopped("r");
        assert_eq!(
            Room::Waited,
            tokio::time::timeout(far, waiting).await.unwrap().unwrap()
        );
        assert!(!backlog.holds("r", &remote));
        // A remote relay never heard from is waited for FIRST_ACK at most.
        let silent = Progress::remote_after(0);
        backlog.register("s", &silent);
        let began = tokio::time::Instant::now();
        assert_eq!(Room::TimedOut, backlog.room("s", 100, 4, far).await);
        assert!(began.elapsed() < far / 2);
    }
}
