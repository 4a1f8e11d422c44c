//! The session machine's side of tasks across eras: routing a 2025-11-25 host's task
//! requests, the upstream steps of each ([`Link`]), and what their answers become.
//! The data and the shapes live in [`crate::tasks`]; this file holds what needs the
//! machine's calls, rounds and streams.

use super::{Call, Phase, Session, META_CLIENT_CAPABILITIES};
use crate::downgrade;
use crate::error::{Failure, SessionError};
use crate::event::PeerStream;
use crate::jsonrpc::{ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response};
use crate::mrtr::{self, ResultKind};
use crate::revision::Revision;
use crate::tasks::{self, Link, Outcome};
use crate::time::Timestamp;
use crate::usage::{self, RequestOutcome};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Whether `request` is one the tasks translation routes: a task method, or a
/// `tools/call` augmented with `params.task`.
pub(super) fn is_task_request(request: &Request) -> bool {
    match request.method.as_str() {
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" => true,
        "tools/call" => request
            .params
            .as_ref()
            .is_some_and(|p| p.get("task").is_some()),
        _ => false,
    }
}

/// Declares the extension in an upstream request's `_meta` (extension overview,
/// "Declare support": per-request capabilities).
pub(super) fn declare_extension(params: &mut Map<String, Value>) {
    if let Some(meta) = params.get_mut("_meta") {
        tasks::declare_extension(meta, META_CLIENT_CAPABILITIES);
    }
}

impl Session {
    /// Serves a task request from the peer (see [`is_task_request`]).
    pub(super) fn task_request(
        &mut self,
        mut request: Request,
        stream: PeerStream,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        let label = usage::Method::from_name(&request.method);
        if request.method == "tools/call" {
            // The modern revision has no task parameter.
            if let Some(Value::Object(params)) = request.params.as_mut() {
                params.remove("task");
            }
            return match &self.tasks {
                // 2025-11-25 tasks, "Task Support and Handling": a receiver that did
                // not declare the capability MUST process the request normally.
                None => self.forward(request, stream, now, None),
                Some(book) if !book.has_room() => {
                    self.refuse(
                        stream,
                        request.id,
                        label,
                        ErrorCode::INVALID_REQUEST,
                        "this session holds as many unfinished tasks as it may",
                    );
                    Ok(())
                }
                Some(_) => self.forward(request, stream, now, Some(Link::Create)),
            };
        }
        let Some(book) = &self.tasks else {
            self.refuse(
                stream,
                request.id,
                label,
                ErrorCode::METHOD_NOT_FOUND,
                "tasks are not offered on this session",
            );
            return Ok(());
        };
        let params = request.params.as_ref();
        if request.method == "tasks/list" {
            let response = match book.list(params.and_then(|p| p.get("cursor"))) {
                Ok(result) => Response::result(request.id, result),
                Err(error) => Response::error(Some(request.id), error),
            };
            self.answer(stream, response, label);
            return Ok(());
        }
        let Some(id) = params.and_then(|p| p.get("taskId")).and_then(Value::as_str) else {
            self.refuse_with(stream, request.id, label, "params.taskId must be a string");
            return Ok(());
        };
        // Task ids are bound to the session: one it did not create is unknown here.
        let Some(entry) = book.get(id) else {
            self.refuse_with(stream, request.id, label, "unknown taskId");
            return Ok(());
        };
        let task = entry.id.clone();
        let local = entry.upstream.is_none();
        let state = entry.state.clone();
        let terminal = tasks::is_terminal(entry.status());
        let outcome = entry.outcome.clone();
        let link = match request.method.as_str() {
            "tasks/get" if local => {
                self.answer(
                    stream,
                    Response::result(request.id, Value::Object(state)),
                    label,
                );
                return Ok(());
            }
            "tasks/get" => Link::Get { task },
            "tasks/result" => match (local, outcome) {
                (true, Some(outcome)) => {
                    let response = self.outcome_response(request.id, &task, true, outcome);
                    self.answer(stream, response, label);
                    return Ok(());
                }
                _ => Link::Await {
                    task,
                    related: true,
                    updating: false,
                    until: now.saturating_add(self.config.live_timeout_max).as_millis(),
                },
            },
            // 2025-11-25 tasks, "Task Cancellation": receivers MUST reject
            // cancellation of a terminal task with -32602.
            _ if terminal => {
                let status = state.get("status").and_then(Value::as_str).unwrap_or("");
                let message = format!("the task is already {status}");
                self.refuse_with(stream, request.id, label, &message);
                return Ok(());
            }
            _ => Link::Cancel { task, acked: false },
        };
        self.forward(request, stream, now, Some(link))
    }

    fn refuse_with(
        &mut self,
        stream: PeerStream,
        id: RequestId,
        label: usage::Method,
        message: &str,
    ) {
        self.refuse(stream, id, label, ErrorCode::INVALID_PARAMS, message);
    }

    /// Sends the next upstream request of a task call other than [`Link::Create`]:
    /// `tasks/get`, `tasks/cancel`, or `tasks/update` carrying a round's answers.
    pub(super) fn send_task_step(
        &mut self,
        legacy: &RequestId,
        responses: Option<Map<String, Value>>,
    ) {
        let Some(call) = self.calls.get_mut(legacy) else {
            return;
        };
        let mut params = Map::new();
        let method = match &mut call.link {
            Some(Link::Get { task }) | Some(Link::Cancel { task, acked: true }) => {
                params.insert("taskId".into(), json!(task));
                "tasks/get"
            }
            Some(Link::Cancel { task, acked: false }) => {
                params.insert("taskId".into(), json!(task));
                "tasks/cancel"
            }
            Some(Link::Await { task, updating, .. }) => {
                params.insert("taskId".into(), json!(task));
                *updating = responses.is_some();
                match responses {
                    Some(responses) => {
                        params.insert("inputResponses".into(), Value::Object(responses));
                        "tasks/update"
                    }
                    None => "tasks/get",
                }
            }
            Some(Link::Create) | None => return,
        };
        params.insert("_meta".into(), self.upstream_meta(None, false));
        declare_extension(&mut params);
        self.send_checked(legacy, method, params);
    }

    /// The upstream answered a step of a task call.
    pub(super) fn task_answered(
        &mut self,
        legacy: RequestId,
        mut call: Call,
        outcome: Result<Value, ErrorObject>,
        now: Timestamp,
    ) {
        let result = match outcome {
            Ok(result) => result,
            Err(error) => {
                let method = usage::Method::from_name(&call.method);
                self.ended(&legacy, method, RequestOutcome::Error, call.rounds);
                return self.respond(call.stream, Response::error(Some(legacy), error));
            }
        };
        let Some(link) = call.link.clone() else {
            return;
        };
        match link {
            Link::Create => self.task_created(legacy, call, result, now),
            Link::Get { task } => {
                let state = self.track(&task, &result);
                self.finish(legacy, call, Value::Object(state));
            }
            Link::Cancel { task, acked: false } => {
                call.link = Some(Link::Cancel { task, acked: true });
                self.calls.insert(legacy.clone(), call);
                self.send_task_step(&legacy, None);
            }
            Link::Cancel { task, acked: true } => {
                let state = self.track(&task, &result);
                self.finish(legacy, call, Value::Object(state));
                if let Some(outcome) = tasks::outcome_of(&result) {
                    self.settle_waits(&task, outcome);
                }
            }
            Link::Await { updating: true, .. } => {
                // The answers were taken: look at the task again.
                call.phase = Phase::Idle;
                self.calls.insert(legacy.clone(), call);
                self.send_task_step(&legacy, None);
            }
            Link::Await {
                task,
                related,
                until,
                ..
            } => {
                if related {
                    self.track(&task, &result);
                }
                if let Some(outcome) = tasks::outcome_of(&result) {
                    let response = self.outcome_response(legacy, &task, related, outcome);
                    return self.finish_response(call, response);
                }
                if now.as_millis() >= until {
                    let failure = Failure::TaskWaitTimeout;
                    return self.fail_call(legacy, call, failure, "");
                }
                if tasks::status_of(&result) == "input_required" {
                    return self.start_round(legacy, call, result, now);
                }
                let pause = Duration::from_millis(tasks::poll_pause_ms(&result));
                call.phase = Phase::Paused {
                    until: now.saturating_add(pause),
                    request_state: None,
                };
                self.calls.insert(legacy, call);
            }
        }
    }

    /// The upstream answered a task-augmented `tools/call`.
    fn task_created(&mut self, legacy: RequestId, call: Call, result: Value, now: Timestamp) {
        let revision = self.revision.unwrap_or(Revision::all()[0]);
        let prefix = self.id_prefix.to_string();
        let Some(book) = self.tasks.as_mut() else {
            return;
        };
        let created = match mrtr::classify(&result) {
            ResultKind::Unknown(t) if t == "task" => book.create_upstream(&result),
            // A synchronous answer: the gateway makes a completed task of it.
            ResultKind::Complete => {
                let at = self.config.unix_at_zero_ms.saturating_add(now.as_millis());
                let shaped = downgrade::result(revision, "tools/call", result);
                book.create_local(&prefix, shaped, at)
            }
            ResultKind::InputRequired => return self.start_round(legacy, call, result, now),
            ResultKind::Unknown(result_type) => {
                let failure = Failure::UnknownResultType { result_type };
                return self.fail_call(legacy, call, failure, "");
            }
        };
        match created {
            Ok(state) => {
                self.finish(legacy, call, json!({ "task": state }));
                self.update_listen();
            }
            Err(tasks::BookFull) => {
                let failure = Failure::TooManyTasks {
                    limit: tasks::MAX_TASKS,
                };
                self.fail_call(legacy, call, failure, "");
            }
        }
    }

    /// A plain `tools/call` the upstream answered with a task: wait for it.
    pub(super) fn await_plain(
        &mut self,
        legacy: RequestId,
        mut call: Call,
        result: &Value,
        now: Timestamp,
    ) {
        let Some(task) = result.get("taskId").and_then(Value::as_str) else {
            let failure = Failure::MalformedTask;
            return self.fail_call(legacy, call, failure, "");
        };
        call.link = Some(Link::Await {
            task: task.to_owned(),
            related: false,
            updating: false,
            until: now.saturating_add(self.config.live_timeout_max).as_millis(),
        });
        self.calls.insert(legacy.clone(), call);
        self.send_task_step(&legacy, None);
    }

    /// An upstream task notification on the subscription stream: a task of this
    /// session becomes `notifications/tasks/status` with its full 2025-11-25 state
    /// (and no related-task `_meta`, which the spec says it SHOULD NOT carry); any
    /// other task's is dropped.
    pub(super) fn task_notification(&mut self, notification: &Notification) {
        let Some(params) = notification.params.as_ref() else {
            return;
        };
        let Some(task) = params.get("taskId").and_then(Value::as_str) else {
            return;
        };
        let Some(state) = self
            .tasks
            .as_mut()
            .filter(|book| book.by_upstream(task).is_some())
            .and_then(|book| book.update(task, params))
        else {
            return;
        };
        let status = Notification {
            method: tasks::LEGACY_NOTIFICATION.into(),
            params: Some(Value::Object(state)),
        };
        self.emit_peer(PeerStream::Standalone, Message::Notification(status));
    }

    /// Records a modern task state in the book; the host's view of it.
    fn track(&mut self, task: &str, modern: &Value) -> Map<String, Value> {
        self.tasks
            .as_mut()
            .and_then(|book| book.update(task, modern))
            .unwrap_or_else(|| tasks::legacy_task(task, modern))
    }

    /// What a wait on `task` answers with: the underlying request's result (with the
    /// related-task `_meta` when the host knows the task) or its error.
    fn outcome_response(
        &self,
        id: RequestId,
        task: &str,
        related: bool,
        outcome: Outcome,
    ) -> Response {
        let revision = self.revision.unwrap_or(Revision::all()[0]);
        match outcome {
            Outcome::Result(result) => {
                let mut result = downgrade::result(revision, "tools/call", result);
                if let (true, Some(obj)) = (related, result.as_object_mut()) {
                    // 2025-11-25 tasks, "Associating Task-Related Messages": responses
                    // related to a task MUST carry the related-task metadata.
                    tasks::relate(obj, task);
                }
                Response::result(id, result)
            }
            Outcome::Error(error) => Response::error(
                Some(id),
                ErrorObject::from_value(&error).unwrap_or_else(tasks::cancelled_error),
            ),
        }
    }

    /// Answers a task call with `result`.
    fn finish(&mut self, legacy: RequestId, call: Call, result: Value) {
        self.finish_response(call, Response::result(legacy, result));
    }

    fn finish_response(&mut self, call: Call, response: Response) {
        if let Some(id) = &response.id {
            let outcome = if response.outcome.is_ok() {
                RequestOutcome::Ok
            } else {
                RequestOutcome::Error
            };
            let method = usage::Method::from_name(&call.method);
            self.ended(id, method, outcome, call.rounds);
        }
        self.respond(call.stream, response);
    }

    /// `task` reached a terminal state through `tasks/cancel`: the `tasks/result`
    /// waits on it that are not waiting for the upstream end now (their live requests
    /// are cancelled at the peer).
    fn settle_waits(&mut self, task: &str, outcome: Outcome) {
        let waiting = self.calls_in_order(|c| {
            !matches!(c.phase, Phase::Upstream(_))
                && matches!(&c.link, Some(Link::Await { task: t, .. }) if t == task)
        });
        for legacy in waiting {
            let Some(call) = self.calls.remove(&legacy) else {
                continue;
            };
            self.abandon(&call, "the task was cancelled", None);
            let related = matches!(call.link, Some(Link::Await { related: true, .. }));
            let response = self.outcome_response(legacy, task, related, outcome.clone());
            self.finish_response(call, response);
        }
    }

    /// A `tools/list` result for a session with tasks keeps each tool's
    /// `execution.taskSupport` (2025-11-25 "Tool-Level Negotiation"): the downgrade
    /// removes `execution` for every other session.
    pub(super) fn keep_task_support(
        &self,
        method: &str,
        modern: &Value,
        mut shaped: Value,
    ) -> Value {
        if method != "tools/list" || self.tasks.is_none() {
            return shaped;
        }
        let (Some(before), Some(after)) = (
            modern.get("tools").and_then(Value::as_array),
            shaped.get_mut("tools").and_then(Value::as_array_mut),
        ) else {
            return shaped;
        };
        for tool in after.iter_mut() {
            let name = tool.get("name").cloned();
            let support = before
                .iter()
                .find(|t| t.get("name") == name.as_ref())
                .and_then(|t| t.pointer("/execution/taskSupport"))
                .filter(|v| v.is_string());
            if let (Some(support), Some(obj)) = (support, tool.as_object_mut()) {
                obj.insert("execution".into(), json!({ "taskSupport": support }));
            }
        }
        shaped
    }
}
