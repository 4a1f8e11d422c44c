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
