//! Legacy revision 2025-11-25: what it adds over 2025-06-18 (URL-mode elicitation with
//! an `elicitationId` and `notifications/elicitation/complete`, icons, sampling tools).

use crate::revision::{ElicitationSupport, Revision};

/// The 2025-11-25 feature set.
pub const REVISION: Revision = Revision {
    version: "2025-11-25",
    elicitation: ElicitationSupport::FormAndUrl,
    sampling_tools: true,
    batches: false,
    structured_content: true,
    titles: true,
    icons: true,
    resource_links: true,
    audio: true,
    tool_annotations: true,
    completions: true,
    progress_message: true,
    implementation_fields: &[
        "name",
        "title",
        "version",
        "description",
        "icons",
        "websiteUrl",
    ],
};

/// The method of the notification that tells a 2025-11-25 peer a URL-mode elicitation
/// finished out of band.
pub const ELICITATION_COMPLETE: &str = "notifications/elicitation/complete";

use serde_json::{Map, Value};

/// Shapes a modern URL-mode `elicitation/create` params object for a 2025-11-25 peer:
/// the modern revision has no `elicitationId`, the 2025-11-25 one requires it, so the
/// gateway supplies the id it minted.
pub fn url_elicitation_params(
    mut params: Map<String, Value>,
    elicitation_id: &str,
) -> Map<String, Value> {
    params.insert(
        "elicitationId".into(),
        Value::String(elicitation_id.to_owned()),
    );
    params
}

/// The `notifications/elicitation/complete` params for a finished URL elicitation.
pub fn elicitation_complete_params(elicitation_id: &str) -> Value {
    serde_json::json!({ "elicitationId": elicitation_id })
}
