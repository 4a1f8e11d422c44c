//! Legacy revision 2025-06-18: form-only elicitation whose params have no `mode`,
//! structured tool output, titles and `resource_link` content; no batches.

use crate::revision::{ElicitationSupport, Revision};

/// The 2025-06-18 feature set.
pub const REVISION: Revision = Revision {
    version: "2025-06-18",
    elicitation: ElicitationSupport::FormWithoutMode,
    sampling_tools: false,
    batches: false,
    structured_content: true,
    titles: true,
    icons: false,
    resource_links: true,
    audio: true,
    tool_annotations: true,
    completions: true,
    progress_message: true,
    implementation_fields: &["name", "title", "version"],
};

use serde_json::{Map, Value};

/// Shapes a modern form-mode `elicitation/create` params object for a 2025-06-18 peer:
/// that revision's `ElicitRequest` params have no `mode` field.
pub fn form_elicitation_params(mut params: Map<String, Value>) -> Map<String, Value> {
    params.remove("mode");
    params
}
