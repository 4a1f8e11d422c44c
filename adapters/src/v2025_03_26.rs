//! Legacy revision 2025-03-26: the only revision with JSON-RPC batches; no elicitation,
//! no structured tool output, no titles, no `resource_link` content.

use crate::revision::{ElicitationSupport, Revision};

/// The 2025-03-26 feature set.
pub const REVISION: Revision = Revision {
    version: "2025-03-26",
    elicitation: ElicitationSupport::None,
    sampling_tools: false,
    batches: true,
    structured_content: false,
    titles: false,
    icons: false,
    resource_links: false,
    audio: true,
    tool_annotations: true,
    completions: true,
    progress_message: true,
    implementation_fields: &["name", "version"],
};
