//! Tools: the trait every tool implements, the registry, and helpers for arguments
//! and results shared by the notes and summary tools.

mod notes;
mod summarize;

use super::error::ServerError;
use super::meta::RequestMeta;
use super::tasks::TaskSupport;
use super::Services;
use crate::request_state::{digest_arguments, Binding, Opened};
use dualera_adapters::param_headers::{tool_param_headers, ParamHeader};
use dualera_adapters::{Message, Notification};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a request's notifications go, and how its transport says it was cancelled.
pub struct Sink<'a> {
    /// Called for each notification about the request (progress, log), in order,
    /// before the response.
    pub notify: &'a (dyn Fn(Message) + Sync),
    /// Set by the transport when the client cancelled or went away.
    pub cancelled: &'a AtomicBool,
}

impl std::fmt::Debug for Sink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("cancelled", &self.cancelled)
            .finish()
    }
}

/// A sink that drops notifications and is never cancelled.
pub fn discard(f: impl FnOnce(&Sink<'_>) -> Handled) -> Handled {
    let cancelled = AtomicBool::new(false);
    f(&Sink {
        notify: &|_| {},
        cancelled: &cancelled,
    })
}

use super::router::Handled;

/// Everything a tool call may look at. Built fresh for every request.
#[derive(Debug)]
pub struct CallContext<'a> {
    /// The authenticated principal.
    pub principal: &'a str,
    /// The method being served (`tools/call`, `prompts/get`, `resources/read`).
    pub method: &'a str,
    /// Notifications and cancellation.
    pub sink: &'a Sink<'a>,
    /// This request's `_meta`.
    pub meta: &'a RequestMeta,
    /// `params.arguments`.
    pub arguments: &'a Map<String, Value>,
    /// `params.inputResponses` on an MRTR retry.
    pub input_responses: Option<&'a Map<String, Value>>,
    /// `params.requestState` on an MRTR retry (attacker-controlled until opened).
    pub request_state: Option<&'a str>,
    /// Store, codec, access rules, limits.
    pub services: &'a Services,
    /// Now, in ms since the epoch.
    pub now_ms: u64,
}

/// What a tool, prompt or resource handler answers.
#[derive(Debug)]
pub enum Outcome {
    /// The final result (without `resultType`; the router adds it).
    Complete(Value),
    /// More input is needed: an MRTR round.
    InputRequired {
        /// Keyed input requests (`elicitation/create`, `sampling/createMessage`, `roots/list`).
        input_requests: Map<String, Value>,
        /// Signed state to be echoed on the retry.
        request_state: Option<String>,
    },
}

/// A tool.
pub trait Tool: Send + Sync + std::fmt::Debug {
    /// The tool's name.
    fn name(&self) -> &'static str;
    /// The `Tool` descriptor served by `tools/list`.
    fn descriptor(&self) -> Value;
    /// Capabilities a caller must declare (in `ClientCapabilities` shape).
    fn required_capabilities(&self) -> Option<Value> {
        None
    }
    /// Whether, for a caller running it as a task, the tool's first MRTR round is
    /// answered synchronously and the task is created by the request that brings its
    /// answers (SEP-2663 MRTR → tasks composition). Most tools start the task at once.
    fn task_after_input(&self) -> bool {
        false
    }
    /// Runs the tool.
    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError>;
}

/// Tools by name, listed in a fixed order.
#[derive(Debug, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<&'static str, Box<dyn Tool>>,
    /// Each tool's `x-mcp-header` parameters, read from its descriptor once.
    param_headers: BTreeMap<&'static str, Vec<ParamHeader>>,
    /// Each tool's `execution.taskSupport`, read from its descriptor once.
    task_support: BTreeMap<&'static str, TaskSupport>,
}

impl ToolRegistry {
    /// An empty registry (another app on the framework adds its own tools).
    pub fn new() -> Self {
        Self::default()
    }

    /// The notes + repository-summary server's tools.
    pub fn notes_server(limits: &crate::config::Limits) -> Self {
        let mut r = Self::new();
        r.add(Box::new(notes::NotesCreate));
        r.add(Box::new(notes::NotesList {
            max_list: limits.max_list,
        }));
        r.add(Box::new(notes::NotesDelete {
            max_candidates: limits.max_delete_candidates,
        }));
        r.add(Box::new(summarize::SummarizeRepo));
        r
    }

    /// Adds a tool (replacing one of the same name).
    ///
    /// Panics if the tool's `inputSchema` carries an `x-mcp-header` annotation that
    /// breaks the 2026-07-28 rules: clients would drop the tool, so it is a bug in the
    /// tool, caught when the server is assembled.
    pub fn add(&mut self, tool: Box<dyn Tool>) {
        let name = tool.name();
        let descriptor = tool.descriptor();
        self.task_support.insert(name, TaskSupport::of(&descriptor));
        let schema = descriptor.get("inputSchema").cloned();
        let headers = tool_param_headers(schema.as_ref().unwrap_or(&Value::Null))
            .unwrap_or_else(|e| panic!("tool {name}: invalid x-mcp-header: {e}"));
        if headers.is_empty() {
            self.param_headers.remove(name);
        } else {
            self.param_headers.insert(name, headers);
        }
        self.tools.insert(name, tool);
    }

    /// The `x-mcp-header` parameters of a tool (empty for most).
    pub fn param_headers(&self, name: &str) -> &[ParamHeader] {
        self.param_headers.get(name).map_or(&[], Vec::as_slice)
    }

    /// How a tool may run as a task.
    pub fn task_support(&self, name: &str) -> TaskSupport {
        self.task_support.get(name).copied().unwrap_or_default()
    }

    /// Whether any tool may run as a task (the server then declares the extension).
    pub fn offers_tasks(&self) -> bool {
        self.task_support
            .values()
            .any(|s| *s != TaskSupport::Forbidden)
    }

    /// Looks a tool up.
    pub fn get(&self, name: &str) -> Option<&dyn Tool> {
        self.tools.get(name).map(|t| &**t)
    }

    /// Every descriptor, in name order (deterministic).
    pub fn descriptors(&self) -> Vec<Value> {
        self.tools.values().map(|t| t.descriptor()).collect()
    }
}

impl CallContext<'_> {
    /// A required string argument, non-empty, at most `max` bytes.
    pub fn string_arg(&self, key: &str, max: usize) -> Result<&str, ServerError> {
        match self.arguments.get(key) {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= max => Ok(s),
            Some(Value::String(s)) if s.is_empty() => Err(ServerError::params(format!(
                "argument {key} must not be empty"
            ))),
            Some(Value::String(_)) => Err(ServerError::params(format!(
                "argument {key} is longer than {max} bytes"
            ))),
            Some(_) => Err(ServerError::params(format!(
                "argument {key} must be a string"
            ))),
            None => Err(ServerError::params(format!("argument {key} is required"))),
        }
    }

    /// An optional string argument.
    pub fn optional_string_arg(&self, key: &str, max: usize) -> Result<Option<&str>, ServerError> {
        match self.arguments.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.string_arg(key, max).map(Some),
        }
    }

    /// Refuses arguments the schema does not list.
    pub fn only_args(&self, allowed: &[&str]) -> Result<(), ServerError> {
        match self
            .arguments
            .keys()
            .find(|k| !allowed.contains(&k.as_str()))
        {
            Some(k) => Err(ServerError::params(format!("unknown argument {k}"))),
            None => Ok(()),
        }
    }

    /// Whether the client cancelled this request (or went away).
    pub fn is_cancelled(&self) -> bool {
        self.sink.cancelled.load(Ordering::Relaxed)
    }

    /// Sends `notifications/progress` if the request carried a `progressToken`.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(token) = self.meta.progress_token.clone() else {
            return;
        };
        let mut params = Map::new();
        params.insert("progressToken".into(), token);
        params.insert("progress".into(), json!(progress));
        if let Some(t) = total {
            params.insert("total".into(), json!(t));
        }
        if let Some(m) = message {
            params.insert("message".into(), json!(m));
        }
        (self.sink.notify)(Message::Notification(Notification {
            method: "notifications/progress".into(),
            params: Some(Value::Object(params)),
        }));
    }

    /// Sends `notifications/message` if this request asked for logs at `level` or
    /// more severe (`_meta["io.modelcontextprotocol/logLevel"]`); never otherwise.
    pub fn log(&self, level: &str, data: Value) {
        let Some(wanted) = self.meta.log_level.as_deref() else {
            return;
        };
        if severity(level) < severity(wanted) {
            return;
        }
        (self.sink.notify)(Message::Notification(Notification {
            method: "notifications/message".into(),
            params: Some(json!({ "level": level, "data": data })),
        }));
    }

    /// Tells every `subscriptions/listen` stream that asked for it (e.g.
    /// `notifications/tools/list_changed`).
    pub fn announce(&self, method: &str, params: Value) {
        let _ = self
            .services
            .changes
            .send(json!({ "method": method, "params": params }));
    }

    /// The state binding for this call: principal, method, target, argument digest.
    pub fn binding(&self, tool: &str) -> Binding {
        Binding {
            principal: self.principal.to_owned(),
            method: self.method.to_owned(),
            target: tool.to_owned(),
            arguments: digest_arguments(&Value::Object(self.arguments.clone())),
        }
    }

    /// Opens this call's `requestState`, if it carries one.
    pub fn open_state(&self, tool: &str) -> Result<Option<Opened>, ServerError> {
        match self.request_state {
            None => Ok(None),
            Some(token) => self
                .services
                .codec
                .open(token, &self.binding(tool), self.now_ms)
                .map(Some)
                .map_err(|e| ServerError::params(e.to_string())),
        }
    }

    /// Signs a new state for this call.
    pub fn seal_state(
        &self,
        tool: &str,
        phase: &str,
        round: u32,
        data: Value,
    ) -> Result<String, ServerError> {
        self.services
            .codec
            .seal(&self.binding(tool), phase, round, data, self.now_ms)
            .map_err(|e| ServerError::Internal {
                detail: format!("random source failed: {e}"),
            })
    }

    /// The input response under `key`, if the client sent one.
    pub fn input_response(&self, key: &str) -> Option<&Value> {
        self.input_responses.and_then(|r| r.get(key))
    }
}

/// RFC 5424 severity order of MCP log levels (higher is more severe).
pub fn severity(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "notice" => 2,
        "warning" => 3,
        "error" => 4,
        "critical" => 5,
        "alert" => 6,
        "emergency" => 7,
        _ => 0,
    }
}

/// A `CallToolResult` with one text block, optional structured content.
pub fn text_result(text: impl Into<String>, structured: Option<Value>, is_error: bool) -> Value {
    let mut m = Map::new();
    m.insert(
        "content".into(),
        json!([{ "type": "text", "text": text.into() }]),
    );
    if let Some(s) = structured {
        m.insert("structuredContent".into(), s);
    }
    if is_error {
        m.insert("isError".into(), Value::Bool(true));
    }
    Value::Object(m)
}
