//! Pub/sub wake-ups: each replica subscribes, once, to its own channel (a step on
//! another replica appended to a stream whose connection this replica holds, or
//! cancelled an upstream request whose lease this replica holds) and to the broadcast
//! channel (a session ended), and fans what arrives out to its local waiters by
//! session. A session costs no subscription, and a step wakes only the replica that
//! relays the stream it wrote to (see `redis::STEP`). A step whose host owes an answer
//! also pushes the session's new state to the other replicas that step it, for what
//! they remember.
//!
//! A message for a stream carries its new entries, addressed to the connection that
//! holds it (by its token), and the replica that wrote them: that relay sends them as
//! they are, reads the stream only when a sequence number is missing, and tells the
//! writer how far it has sent (an *ack*, see `backlog`), so that the writer's
//! exchange waits for it. Other messages only say "read again" (or
//! "cancel upstream request X"); the stream itself stays the record, so a lost message
//! delays, never loses. When the pub/sub connection drops, every waiter is woken to
//! re-read (the client resubscribes by itself).

use super::backlog::Backlog;
use super::client::Redis;
use super::keys::Keys;
use crate::store::OwnHasher;
use dualera_adapters::RequestId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::debug;

/// Length of a session id (see `keys::valid_session_id`).
const SID_LEN: usize = 48;
/// Entries an inbox keeps for its relay; past that they are left to a read of the
/// stream (the relay sees the gap in sequence numbers).
const INBOX_MAX: usize = 256;

/// An entry of a stream: sequence number, message (empty for a bare end marker),
/// whether it ends the stream.
pub(super) type Handed = (u64, Vec<u8>, bool);

/// Entries handed to one relay (by this replica's steps, or through its channel),
/// not yet sent.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    entries: Mutex<Vec<Handed>>,
    pub(super) notify: tokio::sync::Notify,
    /// The other replica whose steps last published entries for this relay: the one
    /// its acks go to.
    writer: Mutex<Option<String>>,
}

impl Inbox {
    /// Queues `entries` (up to [`INBOX_MAX`]) and wakes the relay.
    pub(super) fn hand(&self, entries: impl IntoIterator<Item = Handed>) {
        if let Ok(mut q) = self.entries.lock() {
            for e in entries {
                if q.len() < INBOX_MAX {
                    q.push(e);
                }
            }
        }
        self.notify.notify_waiters();
    }

    /// Another replica's entry, through pub/sub.
    fn hand_from(&self, writer: Option<String>, entry: Handed) {
        if let Some(w) = writer {
            if let Ok(mut cur) = self.writer.lock() {
                if cur.as_deref() != Some(w.as_str()) {
                    *cur = Some(w);
                }
            }
        }
        self.hand([entry]);
    }

    /// The replica to send acks to, if another one writes this relay's stream.
    pub(super) fn writer(&self) -> Option<String> {
        self.writer.lock().ok()?.clone()
    }

    /// What is queued.
    pub(super) fn take(&self) -> Vec<Handed> {
        self.entries
            .lock()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }
}

/// What arrived for a session.
#[derive(Debug, PartialEq)]
pub(super) enum Wake {
    /// Its streams may have new entries.
    Streams,
    /// Cancel the upstream request with this id, if it runs here.
    Cancel(RequestId),
    /// An entry for the relay holding its stream with this token, and the replica
    /// that wrote it (absent from replicas that predate acks).
    Entry(String, Handed, Option<String>),
    /// The relay of the stream whose holder key this is has sent up to this sequence
    /// number (`None`: it stopped).
    Ack(String, Option<u64>),
    /// Another replica stored this version and state of the session, whose host owes
    /// an answer (see `redis::STEP`, `p`).
    State(String, Vec<u8>),
}

/// Where a pushed state goes ([`Wake::State`]): the session id, the version, the state.
pub(super) type OnState = Box<dyn Fn(&str, &str, Vec<u8>) + Send + Sync>;

#[derive(Debug)]
struct Entry {
    tx: watch::Sender<u64>,
    refs: usize,
}

/// A replica's wake-up fan-in.
pub(super) struct Wakes {
    channels: [String; 2],
    /// By session id.
    map: Mutex<HashMap<String, Entry, OwnHasher>>,
    /// The inboxes of this replica's relays, by connection token.
    inboxes: Mutex<HashMap<String, Arc<Inbox>, OwnHasher>>,
    /// Whether both channels are subscribed.
    subscribed: watch::Sender<bool>,
    cancel: Mutex<Option<mpsc::Sender<(String, RequestId)>>>,
    on_state: std::sync::OnceLock<OnState>,
    /// Where acks from other replicas' relays go.
    backlog: Arc<Backlog>,
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
    pub(super) fn new(keys: &Keys, replica: &str, backlog: Arc<Backlog>) -> Arc<Self> {
        Arc::new(Self {
            channels: [keys.wake_replica(replica), keys.wake_all().to_owned()],
            map: Mutex::new(HashMap::default()),
            inboxes: Mutex::new(HashMap::default()),
            subscribed: watch::channel(false).0,
            cancel: Mutex::new(None),
            on_state: std::sync::OnceLock::new(),
            backlog,
        })
    }

    /// Where cancellations for exchanges are delivered (a bounded queue: one that
    /// finds it full is dropped, and the exchange still stops at its next lease
    /// renewal, which finds the lease gone).
    pub(super) fn on_cancel(&self, tx: mpsc::Sender<(String, RequestId)>) {
        if let Ok(mut c) = self.cancel.lock() {
            *c = Some(tx);
        }
    }

    /// Where pushed states are delivered, on the pub/sub connection's task: `f` must
    /// not block. Set once.
    pub(super) fn on_state(&self, f: OnState) {
        let _ = self.on_state.set(f);
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

    /// Routes entries published for the connection `token` to `inbox`, until
    /// [`Wakes::unregister`].
    pub(super) fn register(&self, token: &str, inbox: Arc<Inbox>) {
        if let Ok(mut m) = self.inboxes.lock() {
            m.insert(token.to_owned(), inbox);
        }
    }

    pub(super) fn unregister(&self, token: &str) {
        if let Ok(mut m) = self.inboxes.lock() {
            m.remove(token);
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
                    Some((sid, Wake::Entry(token, entry, writer))) => {
                        let inbox = self
                            .inboxes
                            .lock()
                            .ok()
                            .and_then(|m| m.get(&token).cloned());
                        match inbox {
                            Some(inbox) => inbox.hand_from(writer, entry),
                            // That connection is gone: whoever holds the stream now
                            // reads it.
                            None => self.wake(sid),
                        }
                    }
                    Some((_, Wake::Ack(holder, Some(seq)))) => self.backlog.acked(&holder, seq),
                    Some((_, Wake::Ack(holder, None))) => self.backlog.stopped(&holder),
                    Some((sid, Wake::State(version, state))) => {
                        if let Some(f) = self.on_state.get() {
                            f(sid, &version, state);
                        }
                    }
                    Some((sid, Wake::Cancel(id))) => {
                        if let Ok(c) = self.cancel.lock() {
                            if let Some(tx) = c.as_ref() {
                                let _ = tx.try_send((sid.to_owned(), id));
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

/// The wire form of a wake-up:
/// - `s` SID: read the streams again;
/// - `c` SID, the id as JSON: cancel that upstream request;
/// - `e` SID, token, `\n`, SEQ, space, `1` if it ends the stream (else `0`), space and
///   the writing replica's name (older replicas leave both out), `\n`, the message: an
///   entry for the relay holding its stream with that token (written by the step
///   script, `redis::STEP`);
/// - `a` SID, holder key, `\n`, SEQ or `-`: the relay holding that stream has sent up
///   to SEQ, or has stopped (`-`);
/// - `r` SID, version, `\n`, the state as stored: the session's new state, pushed by
///   the step script (never built here but in tests; the state is not text).
pub(super) fn payload(sid: &str, wake: &Wake) -> String {
    match wake {
        Wake::Streams => format!("s{sid}"),
        Wake::Cancel(id) => format!("c{sid}{}", id.to_value()),
        // Messages are JSON text.
        Wake::Entry(token, (seq, message, end), writer) => format!(
            "e{sid}{token}\n{seq} {}{}{}\n{}",
            u8::from(*end),
            if writer.is_some() { " " } else { "" },
            writer.as_deref().unwrap_or(""),
            String::from_utf8_lossy(message)
        ),
        Wake::Ack(holder, Some(seq)) => format!("a{sid}{holder}\n{seq}"),
        Wake::Ack(holder, None) => format!("a{sid}{holder}\n-"),
        Wake::State(version, state) => {
            format!("r{sid}{version}\n{}", String::from_utf8_lossy(state))
        }
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
        b'e' => {
            let mut parts = rest.splitn(3, |b| *b == b'\n');
            let token = std::str::from_utf8(parts.next()?).ok()?;
            let mut head = std::str::from_utf8(parts.next()?).ok()?.splitn(3, ' ');
            let seq = head.next()?;
            let end = match head.next()? {
                "1" => true,
                "0" => false,
                _ => return None,
            };
            let writer = match head.next() {
                Some("") => return None,
                w => w.map(str::to_owned),
            };
            let message = parts.next()?.to_vec();
            Wake::Entry(token.to_owned(), (seq.parse().ok()?, message, end), writer)
        }
        b'a' => {
            let (holder, seq) = std::str::from_utf8(rest).ok()?.split_once('\n')?;
            let seq = match seq {
                "-" => None,
                n => Some(n.parse().ok()?),
            };
            Wake::Ack(holder.to_owned(), seq)
        }
        b'r' => {
            let at = rest.iter().position(|b| *b == b'\n')?;
            let version = std::str::from_utf8(&rest[..at]).ok()?;
            if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Wake::State(version.to_owned(), rest[at + 1..].to_vec())
        }
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
        let entry = Wake::Entry(
            "r-1.ab".into(),
            (7, b"{\"a\":\"x\\ny\"}".to_vec(), true),
            Some("r-2".into()),
        );
        let p = payload(&sid, &entry);
        assert_eq!(parse(p.as_bytes()), Some((sid.as_str(), entry)));
        // What a replica from before acks publishes.
        let older = Wake::Entry("r-1.ab".into(), (9, b"{}".to_vec(), false), None);
        assert_eq!(
            parse(format!("e{sid}r-1.ab\n9 0\n{{}}").as_bytes()),
            Some((sid.as_str(), older))
        );
        assert_eq!(parse(format!("e{sid}r-1.ab\n9 0 \n{{}}").as_bytes()), None);
        for ack in [
            Wake::Ack("p:h:{x}:3".into(), Some(12)),
            Wake::Ack("p:h:{x}:g".into(), None),
        ] {
            let p = payload(&sid, &ack);
            assert_eq!(parse(p.as_bytes()), Some((sid.as_str(), ack)));
        }
        assert_eq!(parse(format!("a{sid}p:h:{{x}}:3\nten").as_bytes()), None);
        let bare = Wake::Entry("r-1.ab".into(), (8, Vec::new(), true), None);
        assert_eq!(
            parse(payload(&sid, &bare).as_bytes()),
            Some((sid.as_str(), bare))
        );
        assert_eq!(parse(format!("e{sid}tok\n3 2\n{{}}").as_bytes()), None);
        // A pushed state is bytes as stored (MessagePack here), newlines included.
        let mut pushed = format!("r{sid}42\n").into_bytes();
        pushed.extend_from_slice(&[0x82, 0xa1, b'v', b'\n', 0xff]);
        assert_eq!(
            parse(&pushed),
            Some((
                sid.as_str(),
                Wake::State("42".into(), vec![0x82, 0xa1, b'v', b'\n', 0xff])
            ))
        );
        let text = Wake::State("7".into(), b"{}".to_vec());
        assert_eq!(
            parse(payload(&sid, &text).as_bytes()),
            Some((sid.as_str(), text))
        );
        assert_eq!(parse(format!("r{sid}\n{{}}").as_bytes()), None);
        assert_eq!(parse(format!("r{sid}4x\n{{}}").as_bytes()), None);
        assert_eq!(parse(format!("r{sid}12").as_bytes()), None);
        assert_eq!(parse(b"sshort"), None);
        assert_eq!(parse(format!("x{sid}").as_bytes()), None);
    }
}
