//! Driver-supplied time: the session machine never reads a clock, so every input that
//! can start or check a timer carries a [`Timestamp`] handed in by the driver. Also the
//! one RFC 3339 formatter ([`rfc3339`]) every part of dualera prints wall time with.

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

/// A Unix time in milliseconds as RFC 3339 UTC (`2026-07-28T09:30:00.123Z`): the
/// wall-clock text of task times (here, for the tasks the session makes itself; in the
/// modern server) and of the migration report. Kept in this crate, which every part
/// of dualera depends on, so that none borrows it from another.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // rfc3339: tested where the migration report prints it (crates/gateway/src/report).

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
