//! A task as the store keeps it (one JSON document per row, [`TaskDoc`]) and as clients
//! see it on the wire (the extension's `Task`, `CreateTaskResult` and `DetailedTask`
//! shapes). Kept apart from the machinery that runs tasks so that the wire shape can be
//! read in one place.

use crate::store::TaskRow;
use dualera_adapters::time::rfc3339;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// A task's status (`extensions/tasks/overview.mdx`, "Task lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The operation is in progress.
    Working,
    /// The server needs client input (`inputRequests`) before continuing.
    InputRequired,
    /// Finished; `result` holds what the request would have returned.
    Completed,
    /// A JSON-RPC error ended it; `error` holds it.
    Failed,
    /// Cancelled by the client.
    Cancelled,
}

impl Status {
    /// `completed`, `failed` and `cancelled` never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Everything about a task beyond the indexed columns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskDoc {
    /// Current status.
    pub status: Status,
    /// Human-readable note on the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// The tool being run.
    pub tool: String,
    /// Its arguments.
    pub arguments: Map<String, Value>,
    /// The protocol fields of the request that created the task (its capabilities
    /// decide what the rounds may ask).
    pub meta: Value,
    /// Created, ms since epoch.
    pub created_ms: u64,
    /// Last status change, ms since epoch.
    pub updated_ms: u64,
    /// How long the task stays readable after creation.
    pub ttl_ms: u64,
    /// Suggested polling interval.
    pub poll_interval_ms: u64,
    /// The current round's input requests (while `input_required`).
    #[serde(default)]
    pub input_requests: Map<String, Value>,
    /// The answers received so far for them.
    #[serde(default)]
    pub input_responses: Map<String, Value>,
    /// The tool's signed state between rounds (never shown to the client: the task
    /// envelope has no `requestState`).
    #[serde(default)]
    pub request_state: Option<String>,
    /// The result, once `completed`.
    #[serde(default)]
    pub result: Option<Value>,
    /// The JSON-RPC error, once `failed`.
    #[serde(default)]
    pub error: Option<Value>,
    /// The client asked to cancel while a round was running.
    #[serde(default)]
    pub cancel_requested: bool,
    /// Tool rounds run so far.
    #[serde(default)]
    pub rounds: u32,
}

/// A task read from the store: its row (id, principal, version) and document.
#[derive(Debug, Clone)]
pub struct Task {
    /// The row as read (its `version` is what a write compares against).
    pub row: TaskRow,
    /// The parsed document.
    pub doc: TaskDoc,
}

impl Task {
    /// The row to write back: this task's row with the document re-serialized.
    pub fn to_row(&self) -> TaskRow {
        TaskRow {
            body: serde_json::to_string(&self.doc).unwrap_or_default(),
            ..self.row.clone()
        }
    }

    /// Input requests not yet answered.
    pub fn pending(&self) -> Map<String, Value> {
        self.doc
            .input_requests
            .iter()
            .filter(|(k, _)| !self.doc.input_responses.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The `Task` fields every task response carries.
    pub fn envelope(&self) -> Map<String, Value> {
        let d = &self.doc;
        let mut m = Map::new();
        m.insert("taskId".into(), json!(self.row.id));
        m.insert("status".into(), json!(d.status.as_str()));
        if let Some(msg) = &d.status_message {
            m.insert("statusMessage".into(), json!(msg));
        }
        m.insert("createdAt".into(), json!(rfc3339(d.created_ms)));
        m.insert("lastUpdatedAt".into(), json!(rfc3339(d.updated_ms)));
        m.insert("ttlMs".into(), json!(d.ttl_ms));
        m.insert("pollIntervalMs".into(), json!(d.poll_interval_ms));
        m
    }

    /// The `DetailedTask` of `tasks/get` and of status notifications: the envelope,
    /// plus the pending `inputRequests`, the `result` or the `error`.
    pub fn detailed(&self) -> Map<String, Value> {
        let mut m = self.envelope();
        match self.doc.status {
            Status::InputRequired => {
                m.insert("inputRequests".into(), Value::Object(self.pending()));
            }
            Status::Completed => {
                if let Some(r) = &self.doc.result {
                    m.insert("result".into(), r.clone());
                }
            }
            Status::Failed => {
                if let Some(e) = &self.doc.error {
                    m.insert("error".into(), e.clone());
                }
            }
            Status::Working | Status::Cancelled => {}
        }
        m
    }
}
