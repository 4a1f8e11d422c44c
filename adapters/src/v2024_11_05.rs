//! Legacy revision 2024-11-05: the first revision; besides what 2025-03-26 lacks it has
//! no audio content, no tool annotations, no `completions` capability and no progress
//! `message`.

use crate::revision::{ElicitationSupport, Revision};

/// The 2024-11-05 feature set.
pub const REVISION: Revision = Revision {
    version: "2024-11-05",
    elicitation: ElicitationSupport::None,
    sampling_tools: false,
    batches: false,
    structured_content: false,
    titles: false,
    icons: false,
    resource_links: false,
    audio: false,
    tool_annotations: false,
    completions: false,
    progress_message: false,
    implementation_fields: &["name", "version"],
};
