//! What each legacy revision can carry, as data: the session machine asks a
//! [`Revision`] instead of comparing version strings all over the place.
//!
//! The per-revision values live in [`crate::v2025_11_25`], [`crate::v2025_06_18`],
//! [`crate::v2025_03_26`] and [`crate::v2024_11_05`]; this module holds the shape and the
//! lookup.

use crate::{v2024_11_05, v2025_03_26, v2025_06_18, v2025_11_25};

/// Which elicitation requests a legacy revision can express.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElicitationSupport {
    /// No `elicitation/create` at all (2025-03-26, 2024-11-05).
    None,
    /// Form elicitation only, and its params have no `mode` field (2025-06-18).
    FormWithoutMode,
    /// Form and URL elicitation; URL mode carries an `elicitationId` (2025-11-25).
    FormAndUrl,
}

/// The features of one legacy revision that change what the gateway may send it.
///
/// Each flag names a field or a message shape the revision's schema has; when a flag
/// is `false`, results and requests for a peer on that revision are shaped without it
/// (see [`crate::downgrade`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revision {
    /// The revision string, e.g. `2025-06-18`.
    pub version: &'static str,
    /// Which elicitation requests the revision can express.
    pub elicitation: ElicitationSupport,
    /// `sampling.tools` / `sampling.context` client capabilities and the `tools` /
    /// `toolChoice` sampling params.
    pub sampling_tools: bool,
    /// JSON-RPC batches in one HTTP body or stdio line.
    pub batches: bool,
    /// `CallToolResult.structuredContent` and `Tool.outputSchema`.
    pub structured_content: bool,
    /// `title` on tools, prompts, resources, templates and implementations.
    pub titles: bool,
    /// `icons` on tools, prompts, resources, templates and implementations.
    pub icons: bool,
    /// `resource_link` content blocks.
    pub resource_links: bool,
    /// `audio` content blocks.
    pub audio: bool,
    /// `Tool.annotations`.
    pub tool_annotations: bool,
    /// The `completions` server capability.
    pub completions: bool,
    /// The `message` field of `notifications/progress`.
    pub progress_message: bool,
    /// The fields the revision's `Implementation` (`serverInfo`) has.
    pub implementation_fields: &'static [&'static str],
}

impl Revision {
    /// Every legacy revision this crate speaks, newest first.
    pub fn all() -> [&'static Revision; 4] {
        [
            &v2025_11_25::REVISION,
            &v2025_06_18::REVISION,
            &v2025_03_26::REVISION,
            &v2024_11_05::REVISION,
        ]
    }

    /// The revision named by `version`, if it is a legacy revision this crate speaks.
    pub fn lookup(version: &str) -> Option<&'static Revision> {
        Self::all().into_iter().find(|r| r.version == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProtocolVersion;

    #[test]
    fn table_matches_version_list() {
        let names: Vec<_> = Revision::all().iter().map(|r| r.version).collect();
        assert_eq!(names, ProtocolVersion::LEGACY);
        assert!(Revision::lookup("2026-07-28").is_none());
        assert!(Revision::lookup("2025-03-26").unwrap().batches);
    }
}
