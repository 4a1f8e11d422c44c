//! Pub/sub wake-ups: a replica subscribes to the channel of each session it relays a
//! stream of (or runs an upstream exchange for) and fans what arrives out to its local
//! waiters. A message only says "read again" (or "cancel upstream request X"); the
//! data always comes from the stream itself, so a lost message delays, never loses.
//! When the pub/sub connection drops, every waiter is woken to re-read (the client
//! resubscribes by itself).
//!
//! Subscriptions change in one task, in the order they were asked for, so a session's
//! channel is never left unsubscribed while someone waits on it; a channel nobody
//! waits on is dropped after a grace period rather than at once (a session's next
//! request usually follows soon).

use super::keys::Keys;
use super::redis::Redis;
use dualera_adapters::RequestId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

/// How long a channel nobody waits on stays subscribed.
const LINGER: Duration = Duration::from_secs(10);

/// What arrived for a session.
#[derive(Debug)]
pub(super) enum Wake {
    /// Its streams may have new entries.
    Streams,
    /// Cancel the upstream request with this id, if it runs here.
    Cancel(RequestId),
}

#[derive(Debug)]
struct Entry {
    tx: watch::Sender<u64>,
    /// Whether the subscription is confirmed.
    subscribed: watch::Sender<bool>,
    refs: usize,
    idle_since: Option<Instant>,
}

enum Change {
    Subscribe(String, watch::Sender<bool>),
    Unsubscribe(String),
}

/// A replica's wake-up fan-in.
pub(super) struct Wakes {
    keys: Keys,
    map: Mutex<HashMap<String, Entry>>,
    changes: mpsc::UnboundedSender<Change>,
    changes_rx: Mutex<Option<mpsc::UnboundedReceiver<Change>>>,
    cancel: Mutex<Option<mpsc::UnboundedSender<(String, RequestId)>>>,
}

impl std::fmt::Debug for Wakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakes").finish_non_exhaustive()
    }
}

/// A waiter on one session's wake-ups; unsubscribes (later) when the last one drops.
pub(super) struct Waiter {
    wakes: Arc<Wakes>,
    sid: String,
    pub(super) rx: watch::Receiver<u64>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Ok(mut map) = self.wakes.map.lock() {
            if let Some(e) = map.get_mut(&self.sid) {
                e.refs = e.refs.saturating_sub(1);
                if e.refs == 0 {
                    e.idle_since = Some(Instant::now());
                }
            }
        }
    }
}

impl Wakes {
    pub(super) fn new(keys: Keys) -> Arc<Self> {
        let (changes, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            keys,
            map: Mutex::new(HashMap::new()),
            changes,
            changes_rx: Mutex::new(Some(rx)),
            cancel: Mutex::new(None),
        })
    }

    /// Where cancellations for exchanges are delivered.
    pub(super) fn on_cancel(&self, tx: mpsc::UnboundedSender<(String, RequestId)>) {
        if let Ok(mut c) = self.cancel.lock() {
            *c = Some(tx);
        }
    }

    /// Waits on `sid`; with `confirmed`, returns once the subscription is in place
    /// (so that nothing published after this returns is missed).
    pub(super) async fn watch(self: &Arc<Self>, sid: &str, confirmed: bool) -> Waiter {
        let (rx, mut subscribed) = {
            let Ok(mut map) = self.map.lock() else {
                let (_tx, rx) = watch::channel(0);
                return Waiter {
                    wakes: self.clone(),
                    sid: sid.to_owned(),
                    rx,
                };
            };
            let e = map.entry(sid.to_owned()).or_insert_with(|| {
                let (tx, _) = watch::channel(0u64);
                let (subscribed, _) = watch::channel(false);
                let _ = self
                    .changes
                    .send(Change::Subscribe(self.keys.wake(sid), subscribed.clone()));
                Entry {
                    tx,
                    subscribed,
                    refs: 0,
                    idle_since: None,
                }
            });
            e.refs += 1;
            e.idle_since = None;
            (e.tx.subscribe(), e.subscribed.subscribe())
        };
        if confirmed {
            let _ = tokio::time::timeout(Duration::from_secs(2), subscribed.wait_for(|s| *s)).await;
        }
        Waiter {
            wakes: self.clone(),
            sid: sid.to_owned(),
            rx,
        }
    }

    /// Wakes local waiters of `sid` (a step of this replica appended entries).
    pub(super) fn wake(&self, sid: &str) {
        if let Ok(map) = self.map.lock() {
            if let Some(e) = map.get(sid) {
                e.tx.send_modify(|g| *g = g.wrapping_add(1));
            }
        }
    }

    fn wake_all(&self) {
        if let Ok(map) = self.map.lock() {
            for e in map.values() {
                e.tx.send_modify(|g| *g = g.wrapping_add(1));
            }
        }
    }

    /// Handles one push message of the pub/sub connection (never blocks).
    pub(super) fn push(&self, info: redis::PushInfo) {
        match info.kind {
            redis::PushKind::Message => {
                let mut data = info.data.into_iter();
                let channel = data.next().and_then(|v| bytes(&v));
                let payload = data.next().and_then(|v| bytes(&v));
                let (Some(channel), Some(payload)) = (channel, payload) else {
                    return;
                };
                let Some(sid) = std::str::from_utf8(&channel)
                    .ok()
                    .and_then(|c| self.keys.sid_of_wake(c))
                else {
                    return;
                };
                match parse(&payload) {
                    Some(Wake::Streams) => self.wake(sid),
                    Some(Wake::Cancel(id)) => {
                        if let Ok(c) = self.cancel.lock() {
                            if let Some(tx) = c.as_ref() {
                                let _ = tx.send((sid.to_owned(), id));
                            }
                        }
                    }
                    None => {}
                }
            }
            // Messages may have been missed while the connection was down: read again.
            redis::PushKind::Disconnection | redis::PushKind::Subscribe => self.wake_all(),
            _ => {}
        }
    }

    /// Applies subscription changes in order, and drops lingering channels; runs until
    /// the replica stops.
    pub(super) async fn run(self: Arc<Self>, redis: Arc<Redis>) {
        let Some(mut rx) = self.changes_rx.lock().ok().and_then(|mut r| r.take()) else {
            return;
        };
        let mut sweep = tokio::time::interval(LINGER / 2);
        loop {
            tokio::select! {
                change = rx.recv() => match change {
                    Some(Change::Subscribe(channel, done)) => {
                        // Retried until it holds: a waiter must not miss its wake-ups.
                        let mut delay = Duration::from_millis(50);
                        loop {
                            match redis.subscribe(&channel).await {
                                Ok(()) => break,
                                Err(e) => {
                                    debug!(error = %e, "subscribe failed; retrying");
                                    tokio::time::sleep(delay).await;
                                    delay = (delay * 2).min(Duration::from_secs(1));
                                    if done.is_closed() && done.receiver_count() == 0 {
                                        break;
                                    }
                                }
                            }
                        }
                        // Kept even when nobody waits right now: later waiters read it.
                        done.send_replace(true);
                    }
                    Some(Change::Unsubscribe(channel)) => {
                        if let Err(e) = redis.unsubscribe(&channel).await {
                            warn!(error = %e, "unsubscribe failed");
                        }
                    }
                    None => return,
                },
                _ = sweep.tick() => {
                    let Ok(mut map) = self.map.lock() else { continue };
                    let stale: Vec<String> = map
                        .iter()
                        .filter(|(_, e)| e.refs == 0 && e.idle_since.is_some_and(|t| t.elapsed() >= LINGER))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for sid in stale {
                        map.remove(&sid);
                        let _ = self.changes.send(Change::Unsubscribe(self.keys.wake(&sid)));
                    }
                }
            }
        }
    }
}

/// `s`: read the streams again; `c<id JSON>`: cancel that upstream request.
pub(super) fn payload(wake: &Wake) -> String {
    match wake {
        Wake::Streams => "s".into(),
        Wake::Cancel(id) => format!("c{}", id.to_value()),
    }
}

fn parse(payload: &[u8]) -> Option<Wake> {
    match payload.first()? {
        b's' => Some(Wake::Streams),
        b'c' => serde_json::from_slice::<serde_json::Value>(&payload[1..])
            .ok()
            .and_then(|v| RequestId::from_value(&v))
            .map(Wake::Cancel),
        _ => None,
    }
}

fn bytes(v: &redis::Value) -> Option<Vec<u8>> {
    match v {
        redis::Value::BulkString(b) => Some(b.clone()),
        redis::Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}
