//! The protocol-revision table: which revisions exist, which era each belongs to.

use std::fmt;

/// The era a protocol revision belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Era {
    /// Session-based revisions that open with `initialize` (2025-11-25 and earlier).
    Legacy,
    /// Stateless revisions that carry version and capabilities in every request's `_meta`.
    Modern,
}

/// A protocol revision string such as `2026-07-28`.
///
/// Unknown values are kept as they were sent (the wire can always name a revision we
/// have never heard of); [`ProtocolVersion::era`] says whether we know it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtocolVersion(String);

impl ProtocolVersion {
    /// The modern, stateless revision.
    pub const V2026_07_28: &'static str = "2026-07-28";
    /// The newest legacy revision.
    pub const V2025_11_25: &'static str = "2025-11-25";
    /// Legacy revision that added structured tool output and elicitation.
    pub const V2025_06_18: &'static str = "2025-06-18";
    /// Legacy revision that introduced Streamable HTTP (and allowed JSON-RPC batches).
    pub const V2025_03_26: &'static str = "2025-03-26";
    /// The first revision, with the HTTP+SSE transport.
    pub const V2024_11_05: &'static str = "2024-11-05";

    /// Modern revisions this implementation speaks, newest first.
    pub const MODERN: &'static [&'static str] = &[Self::V2026_07_28];
    /// Methods of the legacy era that 2026-07-28 removed: a modern server (and the
    /// reverse bridge, answering in its place) answers them with `-32601`.
    pub const REMOVED_IN_MODERN: &'static [&'static str] = &[
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
    ];
    /// Legacy revisions this implementation speaks, newest first.
    pub const LEGACY: &'static [&'static str] = &[
        Self::V2025_11_25,
        Self::V2025_06_18,
        Self::V2025_03_26,
        Self::V2024_11_05,
    ];

    /// Wraps a revision string as sent on the wire.
    pub fn new(version: impl Into<String>) -> Self {
        Self(version.into())
    }

    /// The revision string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The era of a known revision, `None` for a revision this table does not list.
    pub fn era(&self) -> Option<Era> {
        era_of(&self.0)
    }
}

/// The era of a known revision string, `None` when the table does not list it.
pub fn era_of(version: &str) -> Option<Era> {
    if ProtocolVersion::MODERN.contains(&version) {
        Some(Era::Modern)
    } else if ProtocolVersion::LEGACY.contains(&version) {
        Some(Era::Legacy)
    } else {
        None
    }
}

/// Whether a revision string names a modern revision or a later one.
///
/// Revision strings are ISO dates, so the order of the strings is the order of the
/// revisions. Anything dated on or after the first modern revision is modern in shape
/// (per-request `_meta`, no session), even when this table does not know it yet.
pub fn is_modern_or_later(version: &str) -> bool {
    looks_like_revision(version) && version >= ProtocolVersion::V2026_07_28
}

/// Whether a string has the `YYYY-MM-DD` shape of a revision identifier.
pub fn looks_like_revision(version: &str) -> bool {
    let b = version.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eras() {
        assert_eq!(era_of("2026-07-28"), Some(Era::Modern));
        assert_eq!(era_of("2025-11-25"), Some(Era::Legacy));
        assert_eq!(era_of("2024-11-05"), Some(Era::Legacy));
        assert_eq!(era_of("1900-01-01"), None);
        assert!(is_modern_or_later("2027-01-01"));
        assert!(!is_modern_or_later("2025-11-25"));
        assert!(!is_modern_or_later("garbage-string"));
    }
}
