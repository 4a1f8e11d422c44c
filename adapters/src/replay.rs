//! The replay ring of one stream towards a legacy peer: the most recent events, kept so
//! that a peer that lost its connection can resume with `Last-Event-ID` (2025-11-25
//! transports, "Resumability and Redelivery"). Bounded both in events and in bytes;
//! the newest event is always kept, however large, so that the last message of a
//! stream can be redelivered.
//!
//! Plain data, no IO: a driver pushes each event it sends and replays from it; a
//! shared store can keep the same entries.

use std::collections::VecDeque;

/// Recent events of one stream, oldest first, numbered by their sequence number.
#[derive(Debug, Clone)]
pub struct ReplayRing<T> {
    events: VecDeque<(u64, T)>,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

impl<T: AsRef<[u8]>> ReplayRing<T> {
    /// An empty ring keeping at most `max_events` events (at least one) and at most
    /// `max_bytes` bytes (except for the newest event).
    pub fn new(max_events: usize, max_bytes: usize) -> Self {
        Self {
            events: VecDeque::new(),
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes,
        }
    }

    /// Keeps event `seq`, forgetting the oldest ones beyond the bounds.
    pub fn push(&mut self, seq: u64, event: T) {
        self.bytes += event.as_ref().len();
        self.events.push_back((seq, event));
        while self.events.len() > self.max_events
            || (self.bytes > self.max_bytes && self.events.len() > 1)
        {
            if let Some((_, old)) = self.events.pop_front() {
                self.bytes -= old.as_ref().len();
            }
        }
    }

    /// The events after `seq`, oldest first.
    pub fn after(&self, seq: u64) -> impl Iterator<Item = &T> {
        self.events
            .iter()
            .filter(move |(s, _)| *s > seq)
            .map(|(_, e)| e)
    }

    /// Every event kept, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.events.iter().map(|(_, e)| e)
    }

    /// Whether events after `seq` were forgotten (a resumption from `seq` has a gap).
    pub fn has_gap_after(&self, seq: u64) -> bool {
        self.events
            .front()
            .is_some_and(|(first, _)| *first > seq.saturating_add(1))
    }

    /// Events kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the ring is within its bounds (the newest event may exceed the byte
    /// bound alone).
    pub fn within_bounds(&self) -> bool {
        self.events.len() <= self.max_events
            && (self.bytes <= self.max_bytes || self.events.len() == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_events_and_bytes() {
        let mut r = ReplayRing::new(3, 10);
        for seq in 1..=5 {
            r.push(seq, vec![0u8; 3]);
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.after(3).count(), 2);
        assert!(r.has_gap_after(1));
        assert!(!r.has_gap_after(2));
        r.push(6, vec![0u8; 50]);
        assert_eq!(r.len(), 1, "the newest event is kept alone");
        assert!(r.within_bounds());
    }
}
