//! A monotonic clock in milliseconds since the process's first reading: what the
//! connection, body and log-budget bookkeeping keep in atomics (an `Instant` does not
//! fit in one).

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the first call in this process.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Unix time, in milliseconds, at this clock's zero: what turns a [`now_ms`] reading
/// into wall time (the sans-IO machines' `unix_at_zero_ms`). Read once per use: the
/// wall clock may be stepped, this clock is not.
pub fn unix_at_zero_ms() -> u64 {
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    unix_now.saturating_sub(now_ms())
}
