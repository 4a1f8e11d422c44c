//! Tasks: the `io.modelcontextprotocol/tasks` extension on the modern server
//! (`extensions/tasks/overview.mdx`, SEP-2663).
//!
//! Why a module of its own: a task outlives the request that created it, so its state
//! lives in the store (any instance answers `tasks/get`, `tasks/update`, `tasks/cancel`
//! for any task) and its work runs on a thread of the instance that started the round,
//! never inside a poll. A task runs a tool's ordinary MRTR loop on the server: each
//! round calls the tool with the answers gathered so far and the tool's signed state;
//! an `input_required` round parks the task (`inputRequests` on `tasks/get`), and the
//! `tasks/update` that answers the last pending request starts the next round on the
//! instance that received it. The tools themselves do not know whether they run as a
//! task.
//!
//! Bounds: a principal holds at most `[tasks] max_per_principal` unexpired tasks in
//! the store, an instance runs at most `[tasks] max_running` rounds at once, a task
//! takes at most `[limits] max_rounds + 2` tool rounds, and a task is forgotten
//! `ttlMs` after it was created.

mod record;

pub use record::{Status, Task, TaskDoc};

use super::error::ServerError;
use super::meta::{RequestMeta, SERVER_INFO};
use super::store::TaskRow;
use super::tools::{CallContext, Outcome, Sink};
use super::{now_ms, Server};
use crate::config::TasksSection;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{debug, warn};

/// The extension identifier, in `capabilities.extensions` both ways.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The `subscriptions/listen` filter key that opts into `notifications/tasks`.
pub const LISTEN_FILTER: &str = "taskStatus";
/// The notification carrying a task's state on `subscriptions/listen` streams.
pub const NOTIFICATION: &str = "notifications/tasks";
/// Longest task id accepted from a client.
const MAX_TASK_ID: usize = 128;
/// Compare-and-set attempts before a write gives up (another writer keeps winning).
const MAX_CAS: usize = 16;

/// How a tool may run as a task: its descriptor's `execution.taskSupport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskSupport {
    /// Never (absent, or `"forbidden"`).
    #[default]
    Forbidden,
    /// When the caller declared the extension.
    Optional,
    /// Only as a task: a caller without the extension gets `-32021`.
    Required,
}

impl TaskSupport {
    /// Reads `execution.taskSupport` from a tool descriptor.
    pub fn of(descriptor: &Value) -> Self {
        match descriptor
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
        {
            Some("optional") => Self::Optional,
            Some("required") => Self::Required,
            _ => Self::Forbidden,
        }
    }
}

/// The instance's view of tasks: settings, and the rounds running here (each with the
/// flag its tool polls for cooperative cancellation).
#[derive(Debug)]
pub struct Tasks {
    config: TasksSection,
    running: Mutex<Running>,
}

/// The rounds running on this instance: per task, the round's generation and its
/// cancellation flag.
#[derive(Debug, Default)]
struct Running {
    rounds: HashMap<String, (u64, Arc<AtomicBool>)>,
    next: u64,
}

/// A registered round: which one (its generation) and the flag its tool polls.
#[derive(Debug, Clone)]
struct Slot {
    generation: u64,
    flag: Arc<AtomicBool>,
}

impl Tasks {
    /// Tasks with these settings.
    pub fn new(config: TasksSection) -> Self {
        Self {
            config,
            running: Mutex::new(Running::default()),
        }
    }

    /// The settings.
    pub fn config(&self) -> &TasksSection {
        &self.config
    }

    /// Registers a round of `id` about to run here; `None` when `max_running` rounds
    /// already run. A round of the same task still registered is one that has written
    /// its end and is leaving (a new round only starts from a state the old one
    /// wrote): the new one takes its place.
    fn start(&self, id: &str) -> Option<Slot> {
        let mut running = self.running.lock().ok()?;
        if running.rounds.len() >= self.config.max_running && !running.rounds.contains_key(id) {
            return None;
        }
        running.next += 1;
        let slot = Slot {
            generation: running.next,
            flag: Arc::new(AtomicBool::new(false)),
        };
        running
            .rounds
            .insert(id.to_owned(), (slot.generation, slot.flag.clone()));
        Some(slot)
    }

    /// Unregisters the round `generation` of `id` (not a newer one).
    fn finish(&self, id: &str, generation: u64) {
        if let Ok(mut running) = self.running.lock() {
            if running
                .rounds
                .get(id)
                .is_some_and(|(g, _)| *g == generation)
            {
                running.rounds.remove(id);
            }
        }
    }

    /// Asks the round of `id` running here, if any, to stop.
    fn cancel_local(&self, id: &str) {
        if let Some((_, flag)) = self
            .running
            .lock()
            .ok()
            .and_then(|r| r.rounds.get(id).cloned())
        {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

/// Unregisters a round when it ends, however it ends.
struct RoundGuard<'a> {
    tasks: &'a Tasks,
    id: String,
    generation: u64,
    armed: bool,
}

impl<'a> RoundGuard<'a> {
    fn new(tasks: &'a Tasks, id: &str, slot: &Slot) -> Self {
        Self {
            tasks,
            id: id.to_owned(),
            generation: slot.generation,
            armed: true,
        }
    }

    /// The round's thread takes the registration over (its own guard ends it).
    fn hand_over(mut self) {
        self.armed = false;
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.tasks.finish(&self.id, self.generation);
        }
    }
}

fn busy() -> ServerError {
    ServerError::Busy {
        reason: "too many task rounds are running on this server; retry later".into(),
    }
}

/// The `-32021` answer to a request that needs the extension and did not declare it
/// (SEP-2575 "Missing Required Capabilities", SEP-2663 "Required Capabilities").
pub fn missing_extension() -> ServerError {
    ServerError::MissingCapability {
        required: json!({ "extensions": { EXTENSION: {} } }),
    }
}

/// A fresh task id: 256 random bits, base64url (unguessable; ids are capabilities only
/// together with the principal they are bound to).
fn new_task_id() -> Result<String, ServerError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ServerError::Internal {
        detail: format!("random source failed: {e}"),
    })?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// What a round of a tool ended with, before it is written.
enum RoundEnd {
    Outcome(Outcome),
    Error(ServerError),
    /// Not run: the client asked to cancel.
    Cancelled,
}

/// A new task's starting point: the tool, its arguments, and (for a tool whose first
/// MRTR rounds ran synchronously) the answers and state the creating request carried.
#[derive(Debug)]
pub struct NewTask<'a> {
    /// The tool.
    pub tool: &'a str,
    /// Its arguments.
    pub arguments: &'a Map<String, Value>,
    /// `inputResponses` of the creating request.
    pub input_responses: Option<&'a Map<String, Value>>,
    /// `requestState` of the creating request (already verified by the router).
    pub request_state: Option<&'a str>,
}

impl Server {
    fn tasks(&self) -> &Tasks {
        &self.inner.services.tasks
    }

    fn meta_value(&self) -> Value {
        json!({ SERVER_INFO: { "name": self.inner.catalog.name, "version": self.inner.catalog.version } })
    }

    /// Creates a task for a `tools/call` and starts its first round; answers the
    /// `CreateTaskResult`. The task is in the store before this returns
    /// (`overview.mdx`: "The task is durably created before the response is sent").
    pub(super) fn create_task(
        &self,
        principal: &str,
        meta: &RequestMeta,
        new: &NewTask<'_>,
    ) -> Result<Value, ServerError> {
        let config = self.tasks().config().clone();
        let id = new_task_id()?;
        let now = now_ms();
        let slot = self.tasks().start(&id).ok_or_else(busy)?;
        let guard = RoundGuard::new(self.tasks(), &id, &slot);
        let doc = TaskDoc {
            status: Status::Working,
            status_message: None,
            tool: new.tool.to_owned(),
            arguments: new.arguments.clone(),
            meta: meta.to_value(),
            created_ms: now,
            updated_ms: now,
            ttl_ms: config.ttl_ms,
            poll_interval_ms: config.poll_interval_ms,
            input_requests: Map::new(),
            input_responses: new.input_responses.cloned().unwrap_or_default(),
            request_state: new.request_state.map(str::to_owned),
            result: None,
            error: None,
            cancel_requested: false,
            rounds: 0,
        };
        let task = Task {
            row: TaskRow {
                id: id.clone(),
                principal: principal.to_owned(),
                expires_ms: now.saturating_add(config.ttl_ms),
                version: 0,
                body: String::new(),
            },
            doc,
        };
        let stored =
            self.services()
                .store
                .task_insert(&task.to_row(), config.max_per_principal, now)?;
        if !stored {
            return Err(ServerError::Busy {
                reason: format!(
                    "this principal already holds {} unexpired tasks",
                    config.max_per_principal
                ),
            });
        }
        debug!(tool = new.tool, "task created");
        let mut result = task.envelope();
        result.insert("resultType".into(), json!("task"));
        result.insert("_meta".into(), self.meta_value());
        guard.hand_over();
        self.spawn_rounds(id, slot);
        Ok(Value::Object(result))
    }

    /// Runs the task's rounds on a thread of this instance (registered already).
    fn spawn_rounds(&self, id: String, slot: Slot) {
        let server = self.clone();
        let spawned = std::thread::Builder::new()
            .name("dualera-task".into())
            .spawn({
                let id = id.clone();
                let slot = slot.clone();
                move || server.run_rounds(&id, &slot)
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a task thread");
            self.tasks().finish(&id, slot.generation);
            let error = ServerError::Internal {
                detail: "cannot start the task".into(),
            };
            let _ = self.settle(&id, &RoundEnd::Error(error), None);
        }
    }

    /// Reads a task (unexpired).
    fn load(&self, id: &str) -> Result<Option<Task>, ServerError> {
        let Some(row) = self.services().store.task_get(id, now_ms())? else {
            return Ok(None);
        };
        let doc: TaskDoc = serde_json::from_str(&row.body).map_err(|e| ServerError::Internal {
            detail: format!("unreadable task document: {e}"),
        })?;
        Ok(Some(Task { row, doc }))
    }

    /// Reads a task for `principal`; a task of someone else is as unknown as a task
    /// that never existed (`-32602`).
    fn load_for(&self, principal: &str, id: &str) -> Result<Task, ServerError> {
        let unknown = || {
            ServerError::params(format!(
                "unknown taskId {}",
                dualera_adapters::echo::echo_quoted(id)
            ))
        };
        let task = self.load(id)?.ok_or_else(unknown)?;
        if !crate::digest::constant_time_eq(task.row.principal.as_bytes(), principal.as_bytes()) {
            return Err(unknown());
        }
        Ok(task)
    }

    /// Applies `change` to the stored task by compare-and-set, re-reading on conflict.
    /// `change` returns `false` to leave the task as it is. Returns the task as
    /// written (or as found when nothing was written); `None` when it expired.
    fn modify(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Task) -> bool,
    ) -> Result<Option<(Task, bool)>, ServerError> {
        for _ in 0..MAX_CAS {
            let Some(mut task) = self.load(id)? else {
                return Ok(None);
            };
            if !change(&mut task) {
                return Ok(Some((task, false)));
            }
            task.doc.updated_ms = now_ms().max(task.doc.updated_ms);
            if self.services().store.task_replace(&task.to_row())? {
                task.row.version += 1;
                self.announce(&task);
                return Ok(Some((task, true)));
            }
        }
        Err(ServerError::Internal {
            detail: "task kept changing under this write".into(),
        })
    }

    /// Sends the task's new state to the `subscriptions/listen` streams of its
    /// principal that asked for task status.
    fn announce(&self, task: &Task) {
        let _ = self.services().changes.send(json!({
            "method": NOTIFICATION,
            "params": Value::Object(task.detailed()),
            "principal": task.row.principal,
        }));
    }

    /// The round loop of one task on this instance: call the tool, write what it
    /// answered, and go on while it asks nothing of the client.
    fn run_rounds(&self, id: &str, slot: &Slot) {
        let _guard = RoundGuard::new(self.tasks(), id, slot);
        let flag = &*slot.flag;
        let max_rounds = self.services().limits.max_rounds.saturating_add(2);
        loop {
            let task = match self.load(id) {
                Ok(Some(t)) => t,
                Ok(None) => return,
                Err(e) => {
                    warn!(error = %e, "task round cannot read its task");
                    return;
                }
            };
            if task.doc.status != Status::Working {
                return;
            }
            // The id is a capability: logs carry a short digest of it.
            let span = tracing::info_span!(
                "task",
                task = %crate::digest::short_digest(id.as_bytes(), 6),
                tool = %task.doc.tool,
                round = task.doc.rounds + 1,
            );
            let _enter = span.enter();
            let end = if task.doc.rounds >= max_rounds {
                RoundEnd::Error(ServerError::params(format!(
                    "the task took more than {max_rounds} rounds"
                )))
            } else if task.doc.cancel_requested || flag.load(Ordering::Relaxed) {
                RoundEnd::Cancelled
            } else {
                self.round(&task, flag)
            };
            match self.settle(id, &end, Some(flag)) {
                Ok(Some(Status::Working)) => continue,
                Ok(_) => return,
                Err(e) => {
                    warn!(error = %e, "task round cannot write its task");
                    return;
                }
            }
        }
    }

    /// One call of the task's tool with what the task holds.
    fn round(&self, task: &Task, flag: &AtomicBool) -> RoundEnd {
        let catalog = &self.inner.catalog;
        let Some(tool) = catalog.tools.get(&task.doc.tool) else {
            return RoundEnd::Error(ServerError::Internal {
                detail: "the task's tool is gone".into(),
            });
        };
        let meta = match RequestMeta::read(Some(&json!({ "_meta": task.doc.meta }))) {
            Ok(m) => m,
            Err(e) => return RoundEnd::Error(e),
        };
        let sink = Sink {
            notify: &|_| {},
            cancelled: flag,
        };
        let responses = &task.doc.input_responses;
        let cx = CallContext {
            principal: &task.row.principal,
            method: "tools/call",
            sink: &sink,
            meta: &meta,
            arguments: &task.doc.arguments,
            input_responses: (!responses.is_empty()).then_some(responses),
            request_state: task.doc.request_state.as_deref(),
            services: self.services(),
            now_ms: now_ms(),
        };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if cx.request_state.is_some() {
                cx.open_state(tool.name())?;
            }
            tool.call(&cx)
        }));
        match ran {
            Ok(Ok(outcome)) => RoundEnd::Outcome(outcome),
            Ok(Err(e)) => RoundEnd::Error(e),
            Err(_) => RoundEnd::Error(ServerError::Internal {
                detail: "the tool panicked".into(),
            }),
        }
    }

    /// Writes the end of a round; returns the status written.
    fn settle(
        &self,
        id: &str,
        end: &RoundEnd,
        flag: Option<&AtomicBool>,
    ) -> Result<Option<Status>, ServerError> {
        let written = self.modify(id, |task| {
            let d = &mut task.doc;
            if d.status != Status::Working {
                return false;
            }
            d.rounds = d.rounds.saturating_add(1);
            d.input_requests = Map::new();
            d.input_responses = Map::new();
            d.status_message = None;
            let cancelled = d.cancel_requested || flag.is_some_and(|f| f.load(Ordering::Relaxed));
            match end {
                // Cooperative cancel: whatever the round produced, a cancel asked
                // before it was written wins.
                _ if cancelled => {
                    d.status = Status::Cancelled;
                    d.request_state = None;
                }
                RoundEnd::Cancelled => {
                    d.status = Status::Cancelled;
                    d.request_state = None;
                }
                RoundEnd::Outcome(Outcome::Complete(result)) => {
                    let mut result = result.clone();
                    if let Value::Object(m) = &mut result {
                        m.insert("resultType".into(), json!("complete"));
                    }
                    d.status = Status::Completed;
                    d.result = Some(result);
                    d.request_state = None;
                }
                RoundEnd::Outcome(Outcome::InputRequired {
                    input_requests,
                    request_state,
                }) => {
                    d.request_state.clone_from(request_state);
                    if input_requests.is_empty() {
                        // Nothing to ask: the next round runs at once.
                        d.status = Status::Working;
                    } else {
                        d.status = Status::InputRequired;
                        d.input_requests.clone_from(input_requests);
                    }
                }
                RoundEnd::Error(e) => {
                    if matches!(e, ServerError::Store(_) | ServerError::Internal { .. }) {
                        warn!(error = %e, "task failed");
                    }
                    d.status = Status::Failed;
                    d.error = Some(e.respond().1.to_value());
                    d.request_state = None;
                }
            }
            true
        })?;
        Ok(written.map(|(t, _)| t.doc.status))
    }

    /// `tasks/get`, `tasks/update`, `tasks/cancel`.
    pub(super) fn task_method(
        &self,
        principal: &str,
        meta: &RequestMeta,
        method: &str,
        params: &Map<String, Value>,
    ) -> Result<Value, ServerError> {
        // SEP-2663 / SEP-2575: the task methods need the extension in this request's
        // capabilities, checked before the task is looked up.
        if !meta.has_extension(EXTENSION) {
            return Err(missing_extension());
        }
        let id = match params.get("taskId") {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_TASK_ID => s.as_str(),
            Some(Value::String(_)) => {
                return Err(ServerError::params(format!(
                    "params.taskId must be 1 to {MAX_TASK_ID} bytes"
                )))
            }
            _ => return Err(ServerError::params("params.taskId must be a string")),
        };
        let task = self.load_for(principal, id)?;
        let mut result = match method {
            "tasks/get" => task.detailed(),
            "tasks/update" => {
                self.update(task, params)?;
                Map::new()
            }
            _ => {
                self.cancel(&task)?;
                Map::new()
            }
        };
        // Every response other than a CreateTaskResult is `resultType: "complete"`
        // (SEP-2322); the acks carry no task fields.
        result.insert("resultType".into(), json!("complete"));
        result.insert("_meta".into(), self.meta_value());
        Ok(Value::Object(result))
    }

    /// `tasks/update`: records answers to pending input requests (unknown or already
    /// answered keys are ignored, `overview.mdx` "Handle tasks/update"); the answer to
    /// the last pending one starts the next round here.
    fn update(&self, task: Task, params: &Map<String, Value>) -> Result<(), ServerError> {
        let responses = match params.get("inputResponses") {
            Some(Value::Object(r)) => r,
            _ => {
                return Err(ServerError::params(
                    "params.inputResponses must be an object",
                ))
            }
        };
        if task.doc.status != Status::InputRequired
            || !responses.keys().any(|k| task.pending().contains_key(k))
        {
            return Ok(());
        }
        let id = task.row.id.clone();
        // The slot for the next round is taken before the last answer is written, so
        // a task never waits in `working` with no round to run it.
        let slot = self.tasks().start(&id).ok_or_else(busy)?;
        let guard = RoundGuard::new(self.tasks(), &id, &slot);
        let written = self.modify(&id, |t| {
            if t.doc.status != Status::InputRequired {
                return false;
            }
            let pending = t.pending();
            let mut changed = false;
            for (k, v) in responses {
                if pending.contains_key(k) {
                    t.doc.input_responses.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
            if changed && t.pending().is_empty() {
                t.doc.status = Status::Working;
            }
            changed
        })?;
        if let Some((t, true)) = written {
            if t.doc.status == Status::Working {
                guard.hand_over();
                self.spawn_rounds(id, slot);
            }
        }
        Ok(())
    }

    /// `tasks/cancel`: a parked task is cancelled at once; a running round is asked to
    /// stop (cooperative, `overview.mdx` "Cancellation") and settles as `cancelled`;
    /// a finished task stays as it is (the same empty ack).
    fn cancel(&self, task: &Task) -> Result<(), ServerError> {
        if task.doc.status.is_terminal() {
            return Ok(());
        }
        self.modify(&task.row.id, |t| match t.doc.status {
            Status::InputRequired => {
                t.doc.status = Status::Cancelled;
                t.doc.input_requests = Map::new();
                t.doc.input_responses = Map::new();
                t.doc.request_state = None;
                true
            }
            Status::Working if !t.doc.cancel_requested => {
                t.doc.cancel_requested = true;
                t.doc.status_message = Some("cancellation requested".into());
                true
            }
            _ => false,
        })?;
        self.tasks().cancel_local(&task.row.id);
        Ok(())
    }
}
