//! Tasks across eras: a 2025-11-25 host's task-augmented requests served from a
//! 2026-07-28 upstream that offers the `io.modelcontextprotocol/tasks` extension.
//!
//! Why a module of its own: the two eras disagree on who keeps what. A 2025-11-25 host
//! asks for a task (`params.task`), lists its tasks (`tasks/list`) and collects the
//! task's input requests and result with a blocking `tasks/result`; the modern
//! extension has the server decide, no list, no result method, and input requests
//! read from `tasks/get` and answered with `tasks/update`. So the session keeps the
//! tasks it created ([`Book`], bounded, serialized with the session) and runs a
//! `tasks/result` as a wait ([`Link::Await`]): poll `tasks/get`, turn an
//! `input_required` task's `inputRequests` into live requests on the `tasks/result`
//! stream carrying the related-task `_meta`, answer them with `tasks/update`, and
//! answer the host when the task is terminal. A host without the tasks capability in
//! front of an upstream that returns a task anyway gets the same wait on its
//! `tools/call`, ending in a plain result.
//!
//! Spec: `2025-11-25/basic/utilities/tasks` (legacy shapes and MUSTs) and
//! `extensions/tasks/overview` (the upstream side). This module holds the data and
//! the shape conversions; the session machine ([`crate::session`]) drives the calls.

use crate::jsonrpc::{ErrorCode, ErrorObject};
use crate::time::rfc3339;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The modern extension's identifier, in `capabilities.extensions` both ways.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The `_meta` key associating a message with a task (2025-11-25 tasks, "Associating
/// Task-Related Messages").
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// The modern notification carrying a task's state on `subscriptions/listen`.
pub const NOTIFICATION: &str = "notifications/tasks";
/// The 2025-11-25 notification carrying a task's state.
pub const LEGACY_NOTIFICATION: &str = "notifications/tasks/status";
/// The `subscriptions/listen` filter key that opts into [`NOTIFICATION`].
pub const LISTEN_FILTER: &str = "taskStatus";
/// Most tasks one session remembers; the oldest terminal one is forgotten for a new
/// one, and a task-augmented request is refused when all of them are still running.
pub const MAX_TASKS: usize = 64;
/// Most tasks in one `tasks/list` page.
pub const PAGE: usize = 32;
/// Bounds of the pause between two `tasks/get` polls of a wait, in milliseconds (the
/// upstream's `pollIntervalMs`, clamped).
pub const POLL_MIN_MS: u64 = 50;
/// See [`POLL_MIN_MS`].
pub const POLL_MAX_MS: u64 = 5_000;

/// What a task-related legacy request does upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Link {
    /// `tools/call` with `params.task`: the upstream request with the extension
    /// declared; its answer becomes a `CreateTaskResult`.
    Create,
    /// `tasks/get` → `tasks/get`.
    Get {
        /// The task (host and upstream id are the same for upstream tasks).
        task: String,
    },
    /// `tasks/cancel` → `tasks/cancel`, then `tasks/get` for the state to answer with.
    Cancel {
        /// The task.
        task: String,
        /// The upstream acknowledged the cancel.
        acked: bool,
    },
    /// Waits for the task's terminal state, delivering its input requests on the way:
    /// `tasks/result`, or a plain `tools/call` the upstream answered with a task.
    Await {
        /// The task.
        task: String,
        /// `tasks/result` (the host knows the task: related-task `_meta`, the host's
        /// book updated) or a plain `tools/call` (the host never sees the task).
        related: bool,
        /// The request in flight is a `tasks/update` (its ack is followed by a poll).
        updating: bool,
        /// The wait gives up at this time (driver clock, milliseconds).
        until: u64,
    },
}

impl Link {
    /// The task this request concerns, if it is about one already created.
    pub fn task(&self) -> Option<&str> {
        match self {
            Self::Create => None,
            Self::Get { task } | Self::Cancel { task, .. } | Self::Await { task, .. } => Some(task),
        }
    }
}

/// What a terminal task yields: what the underlying request would have returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// A result (modern form, not yet downgraded).
    Result(Value),
    /// A JSON-RPC error object.
    Error(Value),
}

/// One task the session created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The id the host uses.
    pub id: String,
    /// The upstream's id, or `None` for a task the gateway made of a synchronous
    /// answer.
    pub upstream: Option<String>,
    /// The last known state, in the 2025-11-25 `Task` shape.
    pub state: Map<String, Value>,
    /// For a gateway-made task: what it ended with.
    pub outcome: Option<Outcome>,
}

impl Entry {
    /// Its status.
    pub fn status(&self) -> &str {
        self.state
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("working")
    }
}

/// The tasks one session created, oldest first, at most [`MAX_TASKS`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Book {
    tasks: Vec<Entry>,
    next_local: u64,
}

/// Why a task cannot be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookFull;

impl Book {
    /// How many tasks it holds.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether it holds a task the upstream runs (whose status notifications the
    /// session listens for).
    pub fn has_upstream_tasks(&self) -> bool {
        self.tasks.iter().any(|t| t.upstream.is_some())
    }

    /// Whether one more task fits (possibly by forgetting a terminal one).
    pub fn has_room(&self) -> bool {
        self.tasks.len() < MAX_TASKS || self.tasks.iter().any(|t| is_terminal(t.status()))
    }

    /// The task the host calls `id`.
    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// The task the upstream calls `upstream`.
    pub fn by_upstream(&self, upstream: &str) -> Option<&Entry> {
        self.tasks
            .iter()
            .find(|t| t.upstream.as_deref() == Some(upstream))
    }

    fn make_room(&mut self) -> Result<(), BookFull> {
        if self.tasks.len() < MAX_TASKS {
            return Ok(());
        }
        let oldest = self
            .tasks
            .iter()
            .position(|t| is_terminal(t.status()))
            .ok_or(BookFull)?;
        self.tasks.remove(oldest);
        Ok(())
    }

    /// Records a task the upstream created from its modern state; returns the host's
    /// view of it.
    pub fn create_upstream(&mut self, modern: &Value) -> Result<Map<String, Value>, BookFull> {
        let id = modern
            .get("taskId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.make_room()?;
        let state = legacy_task(&id, modern);
        self.tasks.push(Entry {
            id: id.clone(),
            upstream: Some(id),
            state: state.clone(),
            outcome: None,
        });
        Ok(state)
    }

    /// Records a task the gateway makes of a synchronous answer, already terminal:
    /// `completed`, or `failed` for a tool result with `isError` (2025-11-25 tasks,
    /// "Task Status"). `prefix` keeps ids of different sessions apart; `at` is the
    /// answer's wall-clock time in Unix milliseconds.
    pub fn create_local(
        &mut self,
        prefix: &str,
        result: Value,
        at: u64,
    ) -> Result<Map<String, Value>, BookFull> {
        self.make_room()?;
        self.next_local += 1;
        let id = format!("{prefix}-t{}", self.next_local);
        let failed = result.get("isError").and_then(Value::as_bool) == Some(true);
        let stamp = rfc3339(at);
        let mut state = Map::new();
        state.insert("taskId".into(), json!(id));
        state.insert(
            "status".into(),
            json!(if failed { "failed" } else { "completed" }),
        );
        state.insert("createdAt".into(), json!(stamp));
        state.insert("lastUpdatedAt".into(), json!(stamp));
        state.insert("ttl".into(), Value::Null);
        self.tasks.push(Entry {
            id,
            upstream: None,
            state: state.clone(),
            outcome: Some(Outcome::Result(result)),
        });
        Ok(state)
    }

    /// Updates a task from a modern state (a `tasks/get` result or a status
    /// notification); returns the host's view, or `None` for a task not in the book.
    /// A terminal task keeps its state (2025-11-25 tasks: terminal states "MUST NOT
    /// transition to any other status").
    pub fn update(&mut self, id: &str, modern: &Value) -> Option<Map<String, Value>> {
        let entry = self.tasks.iter_mut().find(|t| t.id == id)?;
        if !is_terminal(entry.status()) {
            entry.state = legacy_task(id, modern);
        }
        Some(entry.state.clone())
    }

    /// One `tasks/list` page from `cursor` (an offset written by an earlier page).
    pub fn list(&self, cursor: Option<&Value>) -> Result<Value, ErrorObject> {
        let start = match cursor {
            None | Some(Value::Null) => 0,
            Some(Value::String(s)) => s
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= self.tasks.len())
                .ok_or_else(|| invalid("params.cursor is not a cursor this server gave"))?,
            Some(_) => return Err(invalid("params.cursor must be a string")),
        };
        let end = (start + PAGE).min(self.tasks.len());
        let tasks: Vec<Value> = self.tasks[start..end]
            .iter()
            .map(|t| Value::Object(t.state.clone()))
            .collect();
        let mut result = Map::new();
        result.insert("tasks".into(), Value::Array(tasks));
        // 2025-11-25 tasks, "Task Listing": receivers MUST include a nextCursor if
        // more tasks are available.
        if end < self.tasks.len() {
            result.insert("nextCursor".into(), json!(end.to_string()));
        }
        Ok(Value::Object(result))
    }
}

/// An `INVALID_PARAMS` error with this message.
pub fn invalid(message: &str) -> ErrorObject {
    ErrorObject::new(ErrorCode::INVALID_PARAMS, message)
}

/// Whether `status` is terminal (`completed`, `failed`, `cancelled`).
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// The status of a modern task state.
pub fn status_of(modern: &Value) -> &str {
    modern.get("status").and_then(Value::as_str).unwrap_or("")
}

/// Whether a legacy host declared the `tasks` capability in `initialize`.
pub fn host_declares(legacy_capabilities: &Value) -> bool {
    legacy_capabilities
        .get("tasks")
        .is_some_and(Value::is_object)
}

/// Whether the upstream's `server/discover` result offers the extension.
pub fn upstream_offers(discover: &Value) -> bool {
    discover
        .pointer("/capabilities/extensions")
        .and_then(|e| e.get(EXTENSION))
        .is_some_and(Value::is_object)
}

/// The 2025-11-25 server `tasks` capability the gateway advertises: `tasks/list` (it
/// keeps the list), `tasks/cancel`, and task-augmented `tools/call`.
pub fn server_capability() -> Value {
    json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } })
}

/// Adds the extension to the `clientCapabilities` in an upstream request's `_meta`.
pub fn declare_extension(meta: &mut Value, capabilities_key: &str) {
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let caps = meta.entry(capabilities_key).or_insert_with(|| json!({}));
    if !caps.is_object() {
        *caps = json!({});
    }
    if let Some(caps) = caps.as_object_mut() {
        let extensions = caps.entry("extensions").or_insert_with(|| json!({}));
        if !extensions.is_object() {
            *extensions = json!({});
        }
        if let Some(extensions) = extensions.as_object_mut() {
            extensions.insert(EXTENSION.into(), json!({}));
        }
    }
}

/// A modern task state in the 2025-11-25 `Task` shape, under the host's id `id`:
/// `ttlMs` → `ttl` (`null` when absent: unlimited), `pollIntervalMs` →
/// `pollInterval`; `inputRequests`, `result`, `error` and `resultType` are not part
/// of a legacy `Task`.
pub fn legacy_task(id: &str, modern: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("taskId".into(), json!(id));
    out.insert("status".into(), json!(status_of(modern)));
    for key in ["statusMessage", "createdAt", "lastUpdatedAt"] {
        if let Some(v @ Value::String(_)) = modern.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    // 2025-11-25 tasks, "TTL and Resource Management": receivers MUST include the
    // actual ttl (or null for unlimited).
    out.insert(
        "ttl".into(),
        modern
            .get("ttlMs")
            .filter(|v| v.is_u64())
            .cloned()
            .unwrap_or(Value::Null),
    );
    if let Some(v) = modern.get("pollIntervalMs").filter(|v| v.is_u64()) {
        out.insert("pollInterval".into(), v.clone());
    }
    out
}

/// What a terminal modern task state yields, or `None` while it is not terminal.
pub fn outcome_of(modern: &Value) -> Option<Outcome> {
    match status_of(modern) {
        "completed" => Some(Outcome::Result(
            modern.get("result").cloned().unwrap_or_else(|| json!({})),
        )),
        "failed" => Some(match (modern.get("error"), modern.get("result")) {
            (Some(e @ Value::Object(_)), _) => Outcome::Error(e.clone()),
            (_, Some(r @ Value::Object(_))) => Outcome::Result(r.clone()),
            _ => Outcome::Error(
                ErrorObject::new(ErrorCode::INTERNAL_ERROR, "the task failed").to_value(),
            ),
        }),
        "cancelled" => Some(Outcome::Error(cancelled_error().to_value())),
        _ => None,
    }
}

/// What waiting on a cancelled task yields: the request was not carried out.
pub fn cancelled_error() -> ErrorObject {
    ErrorObject::new(ErrorCode::INTERNAL_ERROR, "the task was cancelled")
        .with_data(json!({ "reason": "taskCancelled" }))
}

/// The pause before the next poll of a task in this modern state.
pub fn poll_pause_ms(modern: &Value) -> u64 {
    modern
        .get("pollIntervalMs")
        .and_then(Value::as_u64)
        .unwrap_or(POLL_MIN_MS)
        .clamp(POLL_MIN_MS, POLL_MAX_MS)
}

/// Puts the related-task `_meta` on a request's or result's params.
pub fn relate(params: &mut Map<String, Value>, task: &str) {
    if !matches!(params.get("_meta"), Some(Value::Object(_))) {
        params.insert("_meta".into(), json!({}));
    }
    if let Some(Value::Object(meta)) = params.get_mut("_meta") {
        meta.insert(RELATED_TASK.into(), json!({ "taskId": task }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_a_modern_task() {
        let modern = json!({"resultType": "task", "taskId": "u1", "status": "input_required",
            "createdAt": "a", "lastUpdatedAt": "b", "ttlMs": 60000, "pollIntervalMs": 500,
            "inputRequests": {"k": {}}});
        assert_eq!(
            Value::Object(legacy_task("u1", &modern)),
            json!({"taskId": "u1", "status": "input_required", "createdAt": "a",
                "lastUpdatedAt": "b", "ttl": 60000, "pollInterval": 500})
        );
    }

    #[test]
    fn book_is_bounded_and_pages() {
        let mut book = Book::default();
        for i in 0..MAX_TASKS {
            book.create_upstream(&json!({"taskId": format!("u{i}"), "status": "working"}))
                .unwrap();
        }
        assert!(!book.has_room());
        assert_eq!(
            book.create_upstream(&json!({"taskId": "x", "status": "working"})),
            Err(BookFull)
        );
        book.update("u3", &json!({"status": "completed"}));
        book.create_local("p", json!({"content": []}), 0).unwrap();
        assert_eq!(book.len(), MAX_TASKS);
        assert!(book.get("u3").is_none() && book.get("p-t1").is_some());
        // A terminal task keeps its state.
        book.update("p-t1", &json!({"status": "working"}));
        assert_eq!(book.get("p-t1").unwrap().status(), "completed");
        let first = book.list(None).unwrap();
        assert_eq!(first["tasks"].as_array().unwrap().len(), PAGE);
        let next = first["nextCursor"].clone();
        let second = book.list(Some(&next)).unwrap();
        assert_eq!(second["tasks"].as_array().unwrap().len(), PAGE);
        assert!(second.get("nextCursor").is_none());
        assert!(book.list(Some(&json!("999"))).is_err());
        assert!(book.list(Some(&json!(3))).is_err());
    }
}
