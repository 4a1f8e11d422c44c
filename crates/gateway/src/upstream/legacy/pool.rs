//! The gateway's legacy sessions to legacy upstreams, kept per
//! (authorization context, declared client capabilities, upstream).
//!
//! Why partitioned: a legacy session is stateful at the server (what it was told, what
//! it may ask, whose credentials opened it). Sharing one between two principals would
//! let one act with the other's authority — the confused deputy. A key never holds the
//! raw credential, only its SHA-256 over the canonical spelling
//! ([`crate::bearer::canonical`]); capabilities are digested in a canonical JSON form
//! (object members sorted), so the same declaration always finds the same sessions.
//!
//! Bounds: sessions in total (`max_upstream_sessions`) and per key
//! (`max_upstream_sessions_per_key`), counted with the ones being opened, refused with
//! the existing wording ("Too many … (limit N)"). A session nobody holds a
//! [`Lease`] on and unused for `upstream_session_idle_ms` is closed (`DELETE` over
//! Streamable HTTP); idle sessions are pinged (basic/utilities/ping.mdx) and dropped
//! when a ping fails; an expired or ended session is dropped at its next sight, so the
//! next [`SessionPool::acquire`] opens a new one.

use super::{LegacyError, LegacySession};
use crate::digest::hex;
use http::header::HeaderValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::debug;

/// Which sessions a caller may use: digests only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    authorization: [u8; 32],
    capabilities: [u8; 32],
    upstream: Arc<str>,
}

impl std::fmt::Debug for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolKey")
            .field("authorization", &hex(&self.authorization[..4]))
            .field("capabilities", &hex(&self.capabilities[..4]))
            .field("upstream", &self.upstream)
            .finish()
    }
}

impl PoolKey {
    /// The key of a caller presenting `authorization` (none: anonymous) and declaring
    /// `capabilities`, for the upstream named `upstream` (its URL, or its command).
    pub fn new(authorization: Option<&HeaderValue>, capabilities: &Value, upstream: &str) -> Self {
        let mut a = Sha256::new();
        match authorization {
            Some(v) => {
                a.update(b"1");
                a.update(crate::bearer::canonical(v));
            }
            None => a.update(b"0"),
        }
        let mut c = Sha256::new();
        canonical_json(capabilities, &mut c);
        Self {
            authorization: a.finalize().into(),
            capabilities: c.finalize().into(),
            upstream: Arc::from(upstream),
        }
    }
}

/// Feeds `v` to `h` with object members sorted by name, whatever order the map keeps.
fn canonical_json(v: &Value, h: &mut Sha256) {
    match v {
        Value::Object(m) => {
            let mut members: Vec<_> = m.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            h.update(b"{");
            for (k, v) in members {
                h.update(Value::String(k.clone()).to_string().as_bytes());
                h.update(b":");
                canonical_json(v, h);
                h.update(b",");
            }
            h.update(b"}");
        }
        Value::Array(a) => {
            h.update(b"[");
            for v in a {
                canonical_json(v, h);
                h.update(b",");
            }
            h.update(b"]");
        }
        other => h.update(other.to_string().as_bytes()),
    }
}

/// The pool's bounds and timers.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Sessions in total (`max_upstream_sessions`).
    pub max_sessions: usize,
    /// Sessions per key (`max_upstream_sessions_per_key`).
    pub max_per_key: usize,
    /// An unleased session unused this long is closed (`upstream_session_idle_ms`).
    pub idle: Duration,
    /// An unleased session is pinged when it was quiet this long.
    pub ping_interval: Duration,
    /// How long a ping may go unanswered.
    pub ping_timeout: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            max_sessions: 1024,
            max_per_key: 8,
            idle: Duration::from_secs(300),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
struct Slot {
    session: LegacySession,
    leases: AtomicUsize,
    /// Last lease ended, or the session was opened (ms on the pool's clock).
    used_at: AtomicU64,
    /// Last ping answered (ms), or `used_at`'s value when none yet.
    pinged_at: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<PoolKey, Vec<Arc<Slot>>>,
    /// Sessions being opened, per key (they count against the bounds).
    opening: HashMap<PoolKey, usize>,
    /// Sessions held plus sessions being opened.
    total: usize,
}

/// Counters, for tests and the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Sessions opened.
    pub opened: u64,
    /// Sessions closed for idleness.
    pub idle_closed: u64,
    /// Sessions dropped because they ended, expired or failed a ping.
    pub dropped: u64,
    /// Pings answered.
    pub pings: u64,
    /// Acquisitions refused by a bound.
    pub refused: u64,
}

/// The legacy upstream sessions of a gateway.
#[derive(Debug)]
pub struct SessionPool {
    limits: PoolLimits,
    state: Mutex<State>,
    epoch: Instant,
    opened: AtomicU64,
    idle_closed: AtomicU64,
    dropped: AtomicU64,
    pings: AtomicU64,
    refused: AtomicU64,
    /// Woken whenever an opening ends (a session added, or its reservation returned).
    opened_or_failed: tokio::sync::Notify,
}

/// How long an acquisition waits for another one's opening of the same key before it
/// opens a session of its own.
const OPENING_WAIT: Duration = Duration::from_secs(15);

/// A session in use: while any lease is held the session is not closed for
/// idleness. Dropping it marks the session used now.
#[derive(Debug)]
pub struct Lease {
    slot: Arc<Slot>,
    pool: Arc<SessionPool>,
}

impl std::ops::Deref for Lease {
    type Target = LegacySession;
    fn deref(&self) -> &LegacySession {
        &self.slot.session
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.used_at.store(self.pool.now(), Ordering::Relaxed);
        self.slot.leases.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes back a reservation that did not become a session.
struct Reservation<'a> {
    pool: &'a SessionPool,
    key: &'a PoolKey,
    done: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.unreserve(self.key);
        }
    }
}

impl SessionPool {
    /// An empty pool with these bounds.
    pub fn new(limits: PoolLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::default(),
            epoch: Instant::now(),
            opened: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            pings: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            opened_or_failed: tokio::sync::Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The bounds.
    pub fn limits(&self) -> &PoolLimits {
        &self.limits
    }

    /// Sessions held (and being opened), all keys.
    pub fn len(&self) -> usize {
        self.state.lock().map_or(0, |s| s.total)
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sessions held for `key`.
    pub fn len_of(&self, key: &PoolKey) -> usize {
        self.state
            .lock()
            .map_or(0, |s| s.keys.get(key).map_or(0, Vec::len))
    }

    /// The counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            opened: self.opened.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            pings: self.pings.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// A session of `key`: the live one with the fewest leases, or, when the key has
    /// none, a new one from `open` (which performs the handshake), within the bounds.
    /// While another acquisition of the key is opening one, this waits for it (at most
    /// [`OPENING_WAIT`]) instead of opening a second.
    pub async fn acquire<F, Fut>(
        self: &Arc<Self>,
        key: &PoolKey,
        open: F,
    ) -> Result<Lease, LegacyError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LegacySession, LegacyError>>,
    {
        let deadline = tokio::time::Instant::now() + OPENING_WAIT;
        loop {
            // Registered before looking, so an opening that ends in between still
            // wakes this one.
            let ended = self.opened_or_failed.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(lease) = self.reuse(key) {
                return Ok(lease);
            }
            let pending = self
                .state
                .lock()
                .map_or(0, |s| s.opening.get(key).copied().unwrap_or(0));
            if pending == 0 || tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.open(key, open).await;
            }
        }
    }

    /// Always a new session of `key` (a caller that wants one of its own), within the
    /// bounds.
    pub async fn open<F, Fut>(
        self: &Arc<Self>,
        key: &PoolKey,
        open: F,
    ) -> Result<Lease, LegacyError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LegacySession, LegacyError>>,
    {
        let mut reservation = self.reserve(key)?;
        let session = open().await?;
        let now = self.now();
        let slot = Arc::new(Slot {
            session,
            leases: AtomicUsize::new(1),
            used_at: AtomicU64::new(now),
            pinged_at: AtomicU64::new(now),
        });
        {
            let Ok(mut s) = self.state.lock() else {
                return Err(LegacyError::closed("the session pool is poisoned"));
            };
            if let Some(n) = s.opening.get_mut(key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    s.opening.remove(key);
                }
            }
            s.keys.entry(key.clone()).or_default().push(slot.clone());
        }
        reservation.done = true;
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.opened_or_failed.notify_waiters();
        Ok(Lease {
            slot,
            pool: self.clone(),
        })
    }

    fn reuse(self: &Arc<Self>, key: &PoolKey) -> Option<Lease> {
        let mut s = self.state.lock().ok()?;
        let slots = s.keys.get_mut(key)?;
        let before = slots.len();
        slots.retain(|slot| slot.session.is_alive());
        let gone = before - slots.len();
        let best = slots
            .iter()
            .min_by_key(|slot| slot.leases.load(Ordering::Relaxed))
            .cloned();
        if slots.is_empty() {
            s.keys.remove(key);
        }
        s.total -= gone;
        drop(s);
        if gone > 0 {
            self.dropped.fetch_add(gone as u64, Ordering::Relaxed);
        }
        let slot = best?;
        slot.leases.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            slot,
            pool: self.clone(),
        })
    }

    fn reserve<'a>(&'a self, key: &'a PoolKey) -> Result<Reservation<'a>, LegacyError> {
        let Ok(mut s) = self.state.lock() else {
            return Err(LegacyError::closed("the session pool is poisoned"));
        };
        let of_key = s.keys.get(key).map_or(0, Vec::len) + s.opening.get(key).copied().unwrap_or(0);
        let refused = if s.total >= self.limits.max_sessions {
            Some(LegacyError::TooManySessions {
                max: self.limits.max_sessions,
            })
        } else if of_key >= self.limits.max_per_key {
            Some(LegacyError::TooManyForKey {
                max: self.limits.max_per_key,
            })
        } else {
            None
        };
        if let Some(e) = refused {
            drop(s);
            self.refused.fetch_add(1, Ordering::Relaxed);
            static REFUSED: crate::throttle::Throttle = crate::throttle::Throttle::per_secs(10);
            if let Some(count) = REFUSED.hit() {
                tracing::warn!(error = %e, refused = count, "legacy upstream session refused (count since the last such line)");
            }
            return Err(e);
        }
        *s.opening.entry(key.clone()).or_default() += 1;
        s.total += 1;
        Ok(Reservation {
            pool: self,
            key,
            done: false,
        })
    }

    fn unreserve(&self, key: &PoolKey) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(n) = s.opening.get_mut(key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    s.opening.remove(key);
                }
                s.total = s.total.saturating_sub(1);
            }
        }
        self.opened_or_failed.notify_waiters();
    }

    /// Drops the lease's session from the pool and closes it (it expired, or its
    /// caller found it unusable); the next acquisition opens a new one.
    pub async fn discard(&self, lease: Lease) {
        let found = self.remove(&lease.slot);
        if found {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        lease.slot.session.close().await;
    }

    fn remove(&self, slot: &Arc<Slot>) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        let mut found = false;
        s.keys.retain(|_, slots| {
            let before = slots.len();
            slots.retain(|x| !Arc::ptr_eq(x, slot));
            found |= slots.len() != before;
            !slots.is_empty()
        });
        if found {
            s.total -= 1;
        }
        found
    }

    /// One pass of upkeep: sessions that ended are dropped, unleased ones idle past
    /// the limit are closed, unleased quiet ones are pinged (and dropped when the ping
    /// fails).
    pub async fn sweep(&self) {
        let now = self.now();
        let idle = u64::try_from(self.limits.idle.as_millis()).unwrap_or(u64::MAX);
        let ping_every = u64::try_from(self.limits.ping_interval.as_millis()).unwrap_or(u64::MAX);
        let mut to_close = Vec::new();
        let mut to_ping = Vec::new();
        {
            let Ok(s) = self.state.lock() else { return };
            for slot in s.keys.values().flatten() {
                if !slot.session.is_alive() {
                    to_close.push((slot.clone(), false));
                    continue;
                }
                if slot.leases.load(Ordering::Relaxed) > 0 {
                    continue;
                }
                let used = slot.used_at.load(Ordering::Relaxed);
                if now.saturating_sub(used) >= idle {
                    to_close.push((slot.clone(), true));
                } else if now.saturating_sub(slot.pinged_at.load(Ordering::Relaxed).max(used))
                    >= ping_every
                {
                    to_ping.push(slot.clone());
                }
            }
        }
        let pings = to_ping.iter().map(|slot| async move {
            (
                slot.clone(),
                slot.session.ping(self.limits.ping_timeout).await,
            )
        });
        for (slot, outcome) in futures_util::future::join_all(pings).await {
            match outcome {
                Ok(()) => {
                    self.pings.fetch_add(1, Ordering::Relaxed);
                    slot.pinged_at.store(self.now(), Ordering::Relaxed);
                }
                Err(e) => {
                    debug!(error = %e, "legacy upstream session failed its ping; dropped");
                    to_close.push((slot, false));
                }
            }
        }
        for (slot, for_idle) in to_close {
            if self.remove(&slot) {
                if for_idle {
                    self.idle_closed.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            slot.session.close().await;
        }
    }

    /// Runs [`SessionPool::sweep`] on a timer until the returned handle is aborted
    /// (or the pool dropped).
    pub fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = self
            .limits
            .idle
            .min(self.limits.ping_interval)
            .checked_div(4)
            .unwrap_or_default()
            .clamp(Duration::from_millis(20), Duration::from_secs(5));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = weak.upgrade() else { return };
                pool.sweep().await;
            }
        })
    }

    /// Closes every session (the gateway stops).
    pub async fn close_all(&self) {
        let slots: Vec<Arc<Slot>> = match self.state.lock() {
            Ok(mut s) => {
                s.total = s.total.saturating_sub(s.keys.values().map(Vec::len).sum());
                s.keys.drain().flat_map(|(_, v)| v).collect()
            }
            Err(_) => return,
        };
        for slot in slots {
            slot.session.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_digest_credentials_and_capabilities() {
        let a = HeaderValue::from_static("Bearer alpha");
        let a2 = HeaderValue::from_static("bearer   alpha");
        let b = HeaderValue::from_static("Bearer beta");
        let caps = json!({ "elicitation": { "form": {} }, "roots": {} });
        let caps_reordered: Value =
            serde_json::from_str(r#"{"roots":{},"elicitation":{"form":{}}}"#).unwrap();
        let k = PoolKey::new(Some(&a), &caps, "http://u/mcp");
        assert_eq!(k, PoolKey::new(Some(&a2), &caps_reordered, "http://u/mcp"));
        assert_ne!(k, PoolKey::new(Some(&b), &caps, "http://u/mcp"));
        assert_ne!(k, PoolKey::new(None, &caps, "http://u/mcp"));
        assert_ne!(k, PoolKey::new(Some(&a), &json!({}), "http://u/mcp"));
        assert_ne!(k, PoolKey::new(Some(&a), &caps, "http://v/mcp"));
        // Never the raw credential, not even in a debug print.
        assert!(!format!("{k:?}").contains("alpha"));
    }

    #[test]
    fn canonical_json_tells_structure_apart() {
        let digest = |v: &Value| {
            let mut h = Sha256::new();
            canonical_json(v, &mut h);
            h.finalize()
        };
        assert_ne!(
            digest(&json!({"a": [1, 2]})),
            digest(&json!({"a": [[1], 2]}))
        );
        assert_ne!(digest(&json!({"a": "b"})), digest(&json!({"ab": ""})));
    }
}
