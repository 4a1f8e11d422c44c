//! Which instance of a route's upstream gets the next request, as plain code over
//! atomics with the time handed in (milliseconds on the pool's clock), so every rule
//! here is tested without a socket or a sleep.
//!
//! - Round-robin over the healthy instances: one shared cursor, each request starts one
//!   past where the previous one started.
//! - An instance that refused a connection (or failed its TLS handshake: nothing was
//!   sent) is *down* until its backoff ends: 500 ms after the first failure, doubling to
//!   at most 30 s, each scaled by a jitter in [0.75, 1.25) so that replicas and routes
//!   do not retry in step. A request skips it meanwhile.
//! - Once the backoff ended the instance is *due*: exactly one request claims the trial
//!   (compare-and-set on its deadline, which moves one backoff further), the others keep
//!   skipping it. The trial's success makes it healthy again; its failure doubles the
//!   backoff.
//! - When no instance is healthy or due (every one is down), the request still tries
//!   one: the instance due soonest. A route with one instance thus behaves as it would
//!   without any health tracking, and a route whose instances all restarted recovers
//!   with the first request that finds one up, while the request does not wait for
//!   every dead instance's connect timeout in turn.
//! - A retry of an MRTR round ([`Selector::plan`] with `after`) starts one past the
//!   instance that answered the previous round, so with two or more healthy instances
//!   a round and its retry are always on different instances: nothing is pinned, and
//!   every round proves that the upstream keeps no state between them.
//!
//! What this module does not do: send anything, or decide what counts as a failure
//! (the pool does: only a connection that could not be made, since then nothing was
//! sent and the request can go elsewhere unchanged).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Most instances one route may have (a plan tracks them in one `u64`).
pub const MAX_INSTANCES: usize = 64;

/// How long an instance stays down after failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// After the first failure, in ms.
    pub base_ms: u64,
    /// The longest backoff, in ms.
    pub max_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_ms: 500,
            max_ms: 30_000,
        }
    }
}

impl Backoff {
    /// The backoff after `failures` consecutive failures (at least 1), scaled by
    /// `jitter` in [0, 1) mapped onto [0.75, 1.25).
    pub fn after(&self, failures: u32, jitter: f64) -> u64 {
        let doublings = failures.saturating_sub(1).min(32);
        let plain = self
            .base_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms);
        let scale = 0.75 + jitter.clamp(0.0, 0.999_999) * 0.5;
        ((plain as f64) * scale) as u64
    }
}

/// One instance's health.
#[derive(Debug, Default)]
struct Health {
    /// Consecutive failures (0: healthy).
    failures: AtomicU32,
    /// Until when (pool clock, ms) the instance is skipped; 0: healthy.
    down_until: AtomicU64,
}

/// What a plan says about one instance when it was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Healthy.
    Healthy(usize),
    /// Down, its backoff over: this request claimed the trial.
    Trial(usize),
    /// Down and not due, but nothing else is left to try.
    Desperate(usize),
}

impl Pick {
    /// The instance.
    pub fn index(self) -> usize {
        match self {
            Self::Healthy(i) | Self::Trial(i) | Self::Desperate(i) => i,
        }
    }
}

/// The state of one instance, for `/readyz` and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Taking requests.
    Healthy,
    /// Skipped for `retry_in_ms` more (0: due for a trial).
    Down {
        /// Consecutive failures.
        failures: u32,
        /// Until its trial, in ms.
        retry_in_ms: u64,
    },
}

/// Round-robin with health over `n` instances.
#[derive(Debug)]
pub struct Selector {
    next: AtomicUsize,
    instances: Box<[Health]>,
    backoff: Backoff,
}

impl Selector {
    /// A selector over `n` instances (1 ≤ n ≤ [`MAX_INSTANCES`]), all healthy.
    pub fn new(n: usize, backoff: Backoff) -> Self {
        let n = n.clamp(1, MAX_INSTANCES);
        Self {
            next: AtomicUsize::new(0),
            instances: (0..n).map(|_| Health::default()).collect(),
            backoff,
        }
    }

    /// How many instances.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Always false (a selector has at least one instance).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The order in which one request may try the instances, computed as it goes:
    /// call [`Plan::next`] for the first instance and again only after it failed.
    /// `after`: the instance that answered this request's previous MRTR round, if
    /// known; the plan then starts one past it instead of at the shared cursor.
    pub fn plan(&self, now: u64, after: Option<usize>) -> Plan<'_> {
        let n = self.instances.len();
        if n == 1 {
            return Plan {
                selector: self,
                now,
                start: 0,
                scanned: 0,
                tried: 0,
                desperate_done: false,
            };
        }
        // Every request takes a turn, a retry too (so a steady mix of requests and
        // retries still spreads over every instance); a retry starts past the instance
        // that answered its round instead of where its turn would.
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let start = match after {
            Some(i) if i < n => (i + 1) % n,
            _ => turn,
        };
        Plan {
            selector: self,
            now,
            start,
            scanned: 0,
            tried: 0,
            desperate_done: false,
        }
    }

    /// An exchange with instance `i` got an answer (any HTTP response).
    pub fn succeeded(&self, i: usize) {
        let Some(h) = self.instances.get(i) else {
            return;
        };
        // Reads first: on the common path (healthy) nothing is written.
        if h.failures.load(Ordering::Relaxed) != 0 {
            h.failures.store(0, Ordering::Relaxed);
        }
        if h.down_until.load(Ordering::Relaxed) != 0 {
            h.down_until.store(0, Ordering::Release);
        }
    }

    /// Instance `i` could not be reached at `now`; returns until when it is skipped.
    /// `jitter` is a random number in [0, 1).
    pub fn failed(&self, i: usize, now: u64, jitter: f64) -> u64 {
        let Some(h) = self.instances.get(i) else {
            return now;
        };
        let failures = h.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        // At least 1: 0 means healthy.
        let until = now
            .saturating_add(self.backoff.after(failures, jitter))
            .max(1);
        h.down_until.store(until, Ordering::Release);
        until
    }

    /// Instance `i`'s state at `now`.
    pub fn state(&self, i: usize, now: u64) -> State {
        let Some(h) = self.instances.get(i) else {
            return State::Healthy;
        };
        match h.down_until.load(Ordering::Acquire) {
            0 => State::Healthy,
            until => State::Down {
                failures: h.failures.load(Ordering::Relaxed),
                retry_in_ms: until.saturating_sub(now),
            },
        }
    }

    /// Whether instance `i` takes requests at `now` without a trial.
    pub fn is_healthy(&self, i: usize) -> bool {
        self.instances
            .get(i)
            .is_some_and(|h| h.down_until.load(Ordering::Acquire) == 0)
    }

    /// Claims the trial of a due instance: moves its deadline one backoff on, so
    /// that concurrent requests keep skipping it while this one tries.
    fn claim(&self, i: usize, seen: u64, now: u64) -> bool {
        let h = &self.instances[i];
        let failures = h.failures.load(Ordering::Relaxed).max(1);
        let until = now.saturating_add(self.backoff.after(failures, 0.5)).max(1);
        h.down_until
            .compare_exchange(seen, until, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

/// The instances one request may try, in order (see [`Selector::plan`]).
#[derive(Debug)]
pub struct Plan<'a> {
    selector: &'a Selector,
    now: u64,
    start: usize,
    /// How far the ring pass got.
    scanned: usize,
    /// Instances handed out (bit i).
    tried: u64,
    desperate_done: bool,
}

impl Plan<'_> {
    /// The next instance to try, or `None` when this request has none left.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Pick> {
        let s = self.selector;
        let n = s.instances.len();
        while self.scanned < n {
            let i = (self.start + self.scanned) % n;
            self.scanned += 1;
            let until = s.instances[i].down_until.load(Ordering::Acquire);
            if until == 0 {
                self.tried |= 1 << i;
                return Some(Pick::Healthy(i));
            }
            if until <= self.now && s.claim(i, until, self.now) {
                self.tried |= 1 << i;
                return Some(Pick::Trial(i));
            }
        }
        // Nothing healthy or due was left untried: try the instance due soonest, once,
        // and only if no instance was tried at all (a request that failed over from a
        // healthy instance has seen the route, and the rest are down).
        if self.desperate_done || self.tried != 0 {
            return None;
        }
        self.desperate_done = true;
        let soonest = (0..n)
            .filter(|i| self.tried & (1 << i) == 0)
            .min_by_key(|&i| s.instances[i].down_until.load(Ordering::Acquire))?;
        self.tried |= 1 << soonest;
        Some(Pick::Desperate(soonest))
    }
}

/// Remembers which instance answered an MRTR round, by a digest of the `requestState`
/// it returned, so the round's retry (which echoes that state) can start one past it.
/// A fixed table of tagged slots: bounded (32 KiB), lock-free, and a lost or colliding
/// entry only means the retry takes the shared cursor instead. The digest is SipHash
/// with a key drawn per table, so a peer cannot aim states at one slot.
#[derive(Debug)]
pub struct RoundMemory {
    slots: Box<[AtomicU64]>,
    hasher: std::collections::hash_map::RandomState,
}

/// Slots in a [`RoundMemory`] (a power of two).
const ROUND_SLOTS: usize = 4096;

impl Default for RoundMemory {
    fn default() -> Self {
        Self {
            slots: (0..ROUND_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl RoundMemory {
    /// `(slot, tag)` of a state: the tag is the digest's upper 48 bits, never 0.
    fn place(&self, state: &str) -> (usize, u64) {
        let h = self.hasher.hash_one(state);
        let slot = (h as usize) & (ROUND_SLOTS - 1);
        let tag = (h >> 16).max(1);
        (slot, tag)
    }

    /// Instance `instance` answered a round with `state`.
    pub fn remember(&self, state: &str, instance: usize) {
        let (slot, tag) = self.place(state);
        // The low 16 bits hold the instance (< MAX_INSTANCES).
        self.slots[slot].store((tag << 16) | (instance as u64 & 0xffff), Ordering::Relaxed);
    }

    /// The instance that answered the round whose `state` a retry echoes, if known.
    pub fn recall(&self, state: &str) -> Option<usize> {
        let (slot, tag) = self.place(state);
        let v = self.slots[slot].load(Ordering::Relaxed);
        (v >> 16 == tag).then_some((v & 0xffff) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(s: &Selector, now: u64, after: Option<usize>) -> Vec<Pick> {
        let mut p = s.plan(now, after);
        let mut out = Vec::new();
        while let Some(i) = p.next() {
            out.push(i);
        }
        out
    }

    #[test]
    fn round_robin_over_healthy_instances() {
        let s = Selector::new(3, Backoff::default());
        let firsts: Vec<usize> = (0..6)
            .map(|_| s.plan(0, None).next().unwrap().index())
            .collect();
        assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
        // A request whose instance refused fails over through the ring.
        assert_eq!(
            order(&s, 0, None),
            [Pick::Healthy(0), Pick::Healthy(1), Pick::Healthy(2)]
        );
    }

    #[test]
    fn a_down_instance_is_skipped_until_its_backoff_ends_then_tried_once() {
        let s = Selector::new(2, Backoff::default());
        let until = s.failed(1, 1_000, 0.5);
        assert_eq!(until, 1_500, "500 ms at jitter 0.5");
        for _ in 0..4 {
            assert_eq!(order(&s, 1_200, None), [Pick::Healthy(0)]);
        }
        // Due: one request claims the trial, a concurrent one skips it.
        let mut first = s.plan(1_600, Some(0));
        assert_eq!(first.next(), Some(Pick::Trial(1)));
        assert_eq!(order(&s, 1_600, Some(0)), [Pick::Healthy(0)]);
        // The trial failed: twice the backoff.
        assert_eq!(s.failed(1, 1_600, 0.5), 2_600);
        assert_eq!(
            s.state(1, 1_600),
            State::Down {
                failures: 2,
                retry_in_ms: 1_000
            }
        );
        // It answered: healthy again, back in the rotation.
        s.succeeded(1);
        assert_eq!(s.state(1, 1_600), State::Healthy);
        let firsts: Vec<usize> = (0..4)
            .map(|_| s.plan(1_600, None).next().unwrap().index())
            .collect();
        assert!(firsts.contains(&0) && firsts.contains(&1), "{firsts:?}");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let b = Backoff::default();
        assert_eq!(b.after(1, 0.5), 500);
        assert_eq!(b.after(2, 0.5), 1_000);
        assert_eq!(b.after(7, 0.5), 30_000);
        assert_eq!(b.after(400, 0.5), 30_000);
        assert_eq!(b.after(1, 0.0), 375);
        assert!(b.after(1, 0.999) < 625);
    }

    #[test]
    fn when_every_instance_is_down_the_soonest_due_is_tried_alone() {
        let s = Selector::new(3, Backoff::default());
        s.failed(0, 0, 0.5); // until 500
        s.failed(1, 0, 0.0); // until 375
        s.failed(2, 0, 0.9); // until 575
        assert_eq!(order(&s, 100, None), [Pick::Desperate(1)]);
        // One instance: never refused outright.
        let one = Selector::new(1, Backoff::default());
        one.failed(0, 0, 0.5);
        assert_eq!(order(&one, 10, None), [Pick::Desperate(0)]);
        assert_eq!(order(&one, 10, None), [Pick::Desperate(0)]);
        // A request that failed over from a healthy instance does not go on to the
        // down ones.
        let s = Selector::new(2, Backoff::default());
        s.failed(1, 0, 0.5);
        let mut p = s.plan(10, None);
        assert_eq!(p.next(), Some(Pick::Healthy(0)));
        assert_eq!(p.next(), None);
    }

    #[test]
    fn a_retry_starts_past_the_instance_that_answered_the_round() {
        let s = Selector::new(2, Backoff::default());
        for answered in [0, 1, 0, 1] {
            // Other traffic moves the shared cursor meanwhile: it does not matter.
            let _ = s.plan(0, None).next();
            assert_eq!(
                s.plan(0, Some(answered)).next(),
                Some(Pick::Healthy(1 - answered))
            );
        }
        // The other instance is down: the retry goes back to the one that answered.
        s.failed(1, 0, 0.5);
        assert_eq!(order(&s, 10, Some(0)), [Pick::Healthy(0)]);
        let three = Selector::new(3, Backoff::default());
        assert_eq!(three.plan(0, Some(2)).next(), Some(Pick::Healthy(0)));
        // An index from elsewhere (a stale hint) falls back to the cursor.
        assert!(three.plan(0, Some(9)).next().is_some());
    }

    #[test]
    fn concurrent_plans_claim_a_trial_once() {
        let s = std::sync::Arc::new(Selector::new(2, Backoff::default()));
        s.failed(1, 0, 0.5);
        let trials: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let s = s.clone();
                    scope.spawn(move || {
                        let mut p = s.plan(10_000, Some(0));
                        usize::from(matches!(p.next(), Some(Pick::Trial(1))))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(trials, 1);
    }

    #[test]
    fn rounds_are_remembered_by_their_state() {
        let m = RoundMemory::default();
        assert_eq!(m.recall("state-a"), None);
        m.remember("state-a", 1);
        m.remember("state-b", 0);
        assert_eq!(m.recall("state-a"), Some(1));
        assert_eq!(m.recall("state-b"), Some(0));
        assert_eq!(m.recall("state-c"), None);
        // Bounded: many more states than slots, and the table stays one size.
        for i in 0..20_000 {
            m.remember(&format!("s{i}"), i % 3);
        }
        assert_eq!(m.slots.len(), ROUND_SLOTS);
        let known = (0..20_000)
            .filter(|i| m.recall(&format!("s{i}")) == Some(i % 3))
            .count();
        assert!(known >= ROUND_SLOTS / 2, "{known}");
    }
}
