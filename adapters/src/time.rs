//! Driver-supplied time: the session machine never reads a clock, so every input that
//! can start or check a timer carries a [`Timestamp`] handed in by the driver.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A point in time, in milliseconds on a monotonic clock the driver chooses.
///
/// The machine only compares timestamps and adds durations to them; what `0` means is
/// up to the driver (a typical driver keeps one `std::time::Instant` taken at start-up
/// and passes `start.elapsed()` as milliseconds). Timestamps handed to one session must
/// never go backwards. Transcript vectors use plain numbers starting at `0`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The timestamp `ms` milliseconds after the driver's epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the driver's epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This timestamp plus `duration` (saturating at the far future).
    pub fn saturating_add(self, duration: Duration) -> Self {
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(ms))
    }

    /// How long after `earlier` this timestamp is (zero when it is not later).
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let t = Timestamp::from_millis(10);
        assert_eq!(t.saturating_add(Duration::from_millis(5)).as_millis(), 15);
        assert_eq!(
            Timestamp::from_millis(u64::MAX - 1)
                .saturating_add(Duration::from_secs(1))
                .as_millis(),
            u64::MAX
        );
        assert_eq!(
            t.saturating_duration_since(Timestamp::from_millis(20)),
            Duration::ZERO
        );
    }
}
