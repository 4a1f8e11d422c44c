//! Pub/sub wake-ups: each replica subscribes, once, to its own channel (a step on
//! another replica appended to a stream whose connection this replica holds, or
//! cancelled an upstream request whose lease this replica holds) and to the broadcast
//! channel (a session ended), and fans what arrives out to its local waiters by
//! session. A session costs no subscription, and a step wakes only the replica that
//! relays the stream it wrote to (see `redis::STEP`).
//!
//! A message only says "read again" (or "cancel upstream request X"); the data always
//! comes from the stream itself, so a lost message delays, never loses. When the
//! pub/sub connection drops, every waiter is woken to re-read (the client resubscribes
//! by itself).

use super::keys::Keys;
use super::redis::Redis;
use dualera_adapters::RequestId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::debug;

/// Length of a session id (see `keys::valid_session_id`).
const SID_LEN: usize = 48;

/// What arrived for a session.
#[derive(Debug, PartialEq)]
pub(super) enum Wake {
    /// Its streams may have new entries.
    Streams,
    /// Cancel the upstream request with this id, if it runs here.
    Cancel(RequestId),
}

#[derive(Debug)]
struct Entry {
    tx: watch::Sender<u64>,
    refs: usize,
}

/// A replica's wake-up fan-in.
pub(super) struct Wakes {
    channels: [String; 2],
    map: Mutex<HashMap<String, Entry>>,
    /// Whether both channels are subscribed.
    subscribed: watch::Sender<bool>,
    cancel: Mutex<Option<mpsc::UnboundedSender<(String, RequestId)>>>,
}

impl std::fmt::Debug for Wakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakes").finish_non_exhaustive()
    }
}

/// A waiter on one session's wake-ups.
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
                    map.remove(&self.sid);
                }
            }
        }
    }
}

impl Wakes {
    pub(super) fn new(keys: &Keys, replica: &str) -> Arc<Self> {
        Arc::new(Self {
            channels: [keys.wake_replica(replica), keys.wake_all()],
            map: Mutex::new(HashMap::new()),
            subscribed: watch::channel(false).0,
            cancel: Mutex::new(None),
        })
    }

    /// Where cancellations for exchanges are delivered.
    pub(super) fn on_cancel(&self, tx: mpsc::UnboundedSender<(String, RequestId)>) {
        if let Ok(mut c) = self.cancel.lock() {
            *c = Some(tx);
        }
    }

    /// Whether the replica's channels are subscribed: a wake-up published from now on
    /// arrives.
    pub(super) fn listening(&self) -> bool {
        *self.subscribed.borrow()
    }

    /// Waits on `sid`; with `confirmed`, returns once the replica's channels are
    /// subscribed (so that nothing published after this returns is missed), at most
    /// two seconds.
    pub(super) async fn watch(self: &Arc<Self>, sid: &str, confirmed: bool) -> Waiter {
        let waiter = self.waiter(sid);
        if confirmed && !self.listening() {
            let mut subscribed = self.subscribed.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(2), subscribed.wait_for(|s| *s)).await;
        }
        waiter
    }

    /// A waiter on `sid`, from now on.
    pub(super) fn waiter(self: &Arc<Self>, sid: &str) -> Waiter {
        let rx = match self.map.lock() {
            Ok(mut map) => {
                let e = map.entry(sid.to_owned()).or_insert_with(|| Entry {
                    tx: watch::channel(0u64).0,
                    refs: 0,
                });
                e.refs += 1;
                e.tx.subscribe()
            }
            Err(_) => watch::channel(0).1,
        };
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
                if !self.channels.iter().any(|c| c.as_bytes() == channel) {
                    return;
                }
                match parse(&payload) {
                    Some((sid, Wake::Streams)) => self.wake(sid),
                    Some((sid, Wake::Cancel(id))) => {
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
            redis::PushKind::Disconnection => {
                self.subscribed.send_replace(false);
                self.wake_all();
            }
            redis::PushKind::Subscribe => {
                self.subscribed.send_replace(true);
                self.wake_all();
            }
            _ => {}
        }
    }

    /// Subscribes the replica's channels, retrying until it holds (the client keeps
    /// them subscribed across reconnections).
    pub(super) async fn run(self: Arc<Self>, redis: Arc<Redis>) {
        for channel in &self.channels {
            let mut delay = Duration::from_millis(50);
            while let Err(e) = redis.subscribe(channel).await {
                debug!(error = %e, "subscribe failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
        self.subscribed.send_replace(true);
        self.wake_all();
    }
}

/// `s` + SID: read the streams again; `c` + SID + id JSON: cancel that upstream
/// request.
pub(super) fn payload(sid: &str, wake: &Wake) -> String {
    match wake {
        Wake::Streams => format!("s{sid}"),
        Wake::Cancel(id) => format!("c{sid}{}", id.to_value()),
    }
}

fn parse(payload: &[u8]) -> Option<(&str, Wake)> {
    let kind = *payload.first()?;
    let sid = std::str::from_utf8(payload.get(1..=SID_LEN)?).ok()?;
    let rest = &payload[1 + SID_LEN..];
    let wake = match kind {
        b's' => Wake::Streams,
        b'c' => serde_json::from_slice::<serde_json::Value>(rest)
            .ok()
            .and_then(|v| RequestId::from_value(&v))
            .map(Wake::Cancel)?,
        _ => return None,
    };
    Some((sid, wake))
}

fn bytes(v: &redis::Value) -> Option<Vec<u8>> {
    match v {
        redis::Value::BulkString(b) => Some(b.clone()),
        redis::Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_back() {
        let sid = "a".repeat(SID_LEN);
        let p = payload(&sid, &Wake::Streams);
        assert_eq!(parse(p.as_bytes()), Some((sid.as_str(), Wake::Streams)));
        let id = RequestId::String("up-7".into());
        let p = payload(&sid, &Wake::Cancel(id.clone()));
        assert_eq!(parse(p.as_bytes()), Some((sid.as_str(), Wake::Cancel(id))));
        assert_eq!(parse(b"sshort"), None);
        assert_eq!(parse(format!("x{sid}").as_bytes()), None);
    }
}
