//! Log lines for events a peer can repeat at will (refused sessions, overload): the
//! first occurrence is logged, then at most one line per interval stating how many
//! occurred since the last one, so 10,000 refusals cost a few lines, not megabytes.

use crate::clock::now_ms;
use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of repeated event's log budget: a line at most every `interval_ms`.
#[derive(Debug)]
pub struct Throttle {
    interval_ms: u64,
    /// When the next line may be written (ms on [`now_ms`]).
    next: AtomicU64,
    /// Occurrences since the last line.
    count: AtomicU64,
}

impl Throttle {
    /// A budget of one line per `interval_secs`.
    pub const fn per_secs(interval_secs: u64) -> Self {
        Self {
            interval_ms: interval_secs.saturating_mul(1000),
            next: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence; when a line is due, returns how many occurred since the
    /// last line (this one included) and starts a new interval.
    pub fn hit(&self) -> Option<u64> {
        self.count.fetch_add(1, Ordering::AcqRel);
        let now = now_ms();
        let next = self.next.load(Ordering::Acquire);
        if now < next {
            return None;
        }
        let due = now.saturating_add(self.interval_ms);
        self.next
            .compare_exchange(next, due, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.count.swap(0, Ordering::AcqRel))
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn the_first_is_logged_then_one_line_per_interval_with_the_count() {
        let t = Throttle::per_secs(3600);
        assert_eq!(t.hit(), Some(1));
        for _ in 0..999 {
            assert_eq!(t.hit(), None);
        }
        let t = Throttle::per_secs(0);
        assert_eq!(t.hit(), Some(1));
        assert_eq!(t.hit(), Some(1));
    }
}
