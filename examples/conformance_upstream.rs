//! The conformance fixture upstream: a modern-only (2026-07-28) MCP server built on
//! dualera's server framework (`Server::with_catalog`), offering the tools, resources,
//! prompts and completions that the official conformance suite's server scenarios call
//! (`../shared/conformance/FIXTURE.md` §1–§6 and §8.2).
//!
//! It is an ordinary app on the framework: every request climbs the same validation
//! ladder as the notes server, MRTR rounds ride in signed `requestState`, logs are
//! emitted only when a request's `_meta` asks for them, and list changes go to
//! `subscriptions/listen` streams. Legacy traffic (`initialize`) gets the framework's
//! modern-only error; put `dualera gateway` in front of it for legacy hosts. The legacy
//! suite's live sampling/elicitation tools exist here as MRTR tools whose input
//! requests carry exactly the legacy request params, so the gateway turns them into the
//! live requests a 2025-11-25 host expects.
//!
//! ```sh
//! cargo run --example conformance_upstream -- --listen 127.0.0.1:0
//! # stderr: listening on http://127.0.0.1:PORT/mcp
//! cargo run --example conformance_upstream -- --stdio   # JSON-RPC lines on stdin/stdout
//! ```

use dualera::config::Config;
use dualera::server::catalog::{
    CacheHints, Catalog, CompletionProvider, PromptProvider, ResourceProvider,
};
use dualera::server::tools::{text_result, CallContext, Outcome, Tool, ToolRegistry};
use dualera::server::{http, stdio, Server, ServerError};
use dualera_adapters::{Message, Notification};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// 1x1 PNG.
const IMG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A tiny WAV file.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
/// Pause between streamed notifications of one call.
const STEP: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------
// Helpers shared by the tools and prompts.

/// A tool whose behaviour is a plain function of its call context.
struct FnTool {
    name: &'static str,
    descriptor: Value,
    needs: Option<Value>,
    run: fn(&CallContext<'_>) -> Result<Outcome, ServerError>,
}

/// A task-supporting tool: its descriptor declares `execution.taskSupport`, and with
/// `after_input` its first MRTR round answers synchronously (the task is created by
/// the request that brings the answers).
struct TaskTool {
    inner: FnTool,
    after_input: bool,
}

impl std::fmt::Debug for TaskTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Tool for TaskTool {
    fn name(&self) -> &'static str {
        self.inner.name
    }

    fn descriptor(&self) -> Value {
        self.inner.descriptor.clone()
    }

    fn task_after_input(&self) -> bool {
        self.after_input
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        (self.inner.run)(cx)
    }
}

impl std::fmt::Debug for FnTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnTool").field("name", &self.name).finish()
    }
}

impl Tool for FnTool {
    fn name(&self) -> &'static str {
        self.name
    }

    fn descriptor(&self) -> Value {
        self.descriptor.clone()
    }

    fn required_capabilities(&self) -> Option<Value> {
        self.needs.clone()
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        (self.run)(cx)
    }
}

/// A tool descriptor with `properties` and `required` argument names.
fn descriptor(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": { "type": "object", "properties": properties, "required": required },
    })
}

fn tool(
    name: &'static str,
    description: &str,
    properties: Value,
    required: &[&str],
    run: fn(&CallContext<'_>) -> Result<Outcome, ServerError>,
) -> FnTool {
    FnTool {
        name,
        descriptor: descriptor(name, description, properties, required),
        needs: None,
        run,
    }
}

fn content(items: Value) -> Result<Outcome, ServerError> {
    Ok(Outcome::Complete(json!({ "content": items })))
}

fn text(t: impl Into<String>) -> Result<Outcome, ServerError> {
    Ok(Outcome::Complete(text_result(t, None, false)))
}

/// One `inputRequests` entry.
fn ask(method: &str, params: Value) -> Value {
    json!({ "method": method, "params": params })
}

/// An `input_required` outcome.
fn input_required(requests: Vec<(&str, Value)>, state: Option<String>) -> Outcome {
    Outcome::InputRequired {
        input_requests: requests
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Map<String, Value>>(),
        request_state: state,
    }
}

/// A form elicitation asking for one string field.
fn ask_string(message: &str, field: &str) -> Value {
    ask(
        "elicitation/create",
        json!({
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": { field: { "type": "string" } },
                "required": [field],
            },
        }),
    )
}

/// A sampling request with one user text message.
fn ask_sample(prompt: &str, max_tokens: u32) -> Value {
    ask(
        "sampling/createMessage",
        json!({
            "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
            "maxTokens": max_tokens,
        }),
    )
}

/// An elicitation answer: the action, and the content when it was accepted.
type Elicited<'a> = (String, Option<&'a Map<String, Value>>);

/// The client's answer to an elicitation, validated: the content object only when it
/// was accepted.
fn elicit_answer<'a>(key: &str, answer: &'a Value) -> Result<Elicited<'a>, ServerError> {
    let bad = || ServerError::params(format!("inputResponses.{key} is not an elicitation result"));
    let obj = answer.as_object().ok_or_else(bad)?;
    let action = obj.get("action").and_then(Value::as_str).ok_or_else(bad)?;
    match action {
        "accept" => {
            let content = obj
                .get("content")
                .and_then(Value::as_object)
                .ok_or_else(bad)?;
            Ok((action.to_owned(), Some(content)))
        }
        "decline" | "cancel" => Ok((action.to_owned(), None)),
        _ => Err(bad()),
    }
}

/// A required string field of accepted elicitation content.
fn field<'a>(
    key: &str,
    content: &'a Map<String, Value>,
    name: &str,
) -> Result<&'a str, ServerError> {
    content.get(name).and_then(Value::as_str).ok_or_else(|| {
        ServerError::params(format!(
            "inputResponses.{key}.content.{name} must be a string"
        ))
    })
}

/// The text of a sampling result (`content` a block or an array of blocks).
fn sample_text(key: &str, answer: &Value) -> Result<String, ServerError> {
    let bad = || ServerError::params(format!("inputResponses.{key} is not a sampling result"));
    let content = answer.get("content").ok_or_else(bad)?;
    let blocks: Vec<&Value> = match content {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| (b.get("type")?.as_str()? == "text").then(|| b.get("text")?.as_str())?)
        .collect();
    if texts.is_empty() && blocks.is_empty() {
        return Err(bad());
    }
    Ok(texts.join(""))
}

/// The roots of a `roots/list` result.
fn roots(key: &str, answer: &Value) -> Result<Vec<Value>, ServerError> {
    answer
        .get("roots")
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| {
            ServerError::params(format!("inputResponses.{key} is not a roots/list result"))
        })
}

/// The phase of this call's verified `requestState`, if it carries one.
fn phase(cx: &CallContext<'_>, tool: &str) -> Result<Option<(String, Value)>, ServerError> {
    Ok(cx.open_state(tool)?.map(|o| (o.phase, o.data)))
}

// ---------------------------------------------------------------------------------
// Content tools (both eras).

fn simple_text(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    text("This is a simple text response for testing.")
}

fn image_content(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    content(json!([{ "type": "image", "data": IMG, "mimeType": "image/png" }]))
}

fn audio_content(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    content(json!([{ "type": "audio", "data": WAV, "mimeType": "audio/wav" }]))
}

fn embedded_resource(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    content(json!([{
        "type": "resource",
        "resource": {
            "uri": "test://embedded-resource",
            "mimeType": "text/plain",
            "text": "This is an embedded resource content.",
        },
    }]))
}

fn multiple_content_types(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    content(json!([
        { "type": "text", "text": "Multiple content types test:" },
        { "type": "image", "data": IMG, "mimeType": "image/png" },
        {
            "type": "resource",
            "resource": {
                "uri": "test://mixed-content-resource",
                "mimeType": "application/json",
                "text": "{\"test\":\"data\",\"value\":123}",
            },
        },
    ]))
}

fn error_handling(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    Ok(Outcome::Complete(text_result(
        "This tool intentionally returns an error for testing",
        None,
        true,
    )))
}

fn with_progress(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
        if i > 0 {
            std::thread::sleep(STEP);
        }
        if cx.is_cancelled() {
            return Err(ServerError::params("cancelled"));
        }
        cx.progress(p, Some(100.0), Some(&format!("Completed step {p} of 100")));
    }
    let token = match &cx.meta.progress_token {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "no progress token".to_owned(),
    };
    text(token)
}

fn with_logging(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    for (i, m) in [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            std::thread::sleep(STEP);
        }
        cx.log("info", json!(m));
    }
    text("Tool with logging executed successfully")
}

// ---------------------------------------------------------------------------------
// The legacy suite's live-request tools, as MRTR tools (FIXTURE §8.2).

fn sampling(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let prompt = cx.string_arg("prompt", 64 * 1024)?;
    match cx.input_response("sampling") {
        Some(answer) => text(format!(
            "LLM response: {}",
            sample_text("sampling", answer)?
        )),
        None => Ok(input_required(
            vec![("sampling", ask_sample(prompt, 100))],
            None,
        )),
    }
}

/// Round 1 asks `params`; round 2 reports the answer as `"{label}: action=…, content=…"`.
fn elicit_once(cx: &CallContext<'_>, params: Value, label: &str) -> Result<Outcome, ServerError> {
    match cx.input_response("elicitation") {
        Some(answer) => {
            let (action, content) = elicit_answer("elicitation", answer)?;
            let content = content.map_or(Value::Null, |c| Value::Object(c.clone()));
            text(format!("{label}: action={action}, content={content}"))
        }
        None => Ok(input_required(
            vec![("elicitation", ask("elicitation/create", params))],
            None,
        )),
    }
}

fn elicitation(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let message = cx.string_arg("message", 64 * 1024)?;
    let params = json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "username": { "type": "string", "description": "User's response" },
                "email": { "type": "string", "description": "User's email address" },
            },
            "required": ["username", "email"],
        },
    });
    elicit_once(cx, params, "User response")
}

fn elicitation_defaults(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let params = json!({
        "message": "Please review and update the form fields with defaults",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "User name", "default": "John Doe" },
                "age": { "type": "integer", "description": "User age", "default": 30 },
                "score": { "type": "number", "description": "User score", "default": 95.5 },
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": { "type": "boolean", "description": "Verification status", "default": true },
            },
            "required": [],
        },
    });
    elicit_once(cx, params, "Elicitation completed")
}

fn elicitation_enums(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let params = json!({
        "message": "Please select options from the enum fields",
        "requestedSchema": {
            "type": "object",
            "required": [],
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Select one option",
                    "enum": ["option1", "option2", "option3"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Select one option with titles",
                    "oneOf": [
                        { "const": "value1", "title": "First Option" },
                        { "const": "value2", "title": "Second Option" },
                        { "const": "value3", "title": "Third Option" },
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Select one option (legacy)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Select multiple options",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": { "type": "string", "enum": ["option1", "option2", "option3"] },
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Select multiple options with titles",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "anyOf": [
                            { "const": "value1", "title": "First Choice" },
                            { "const": "value2", "title": "Second Choice" },
                            { "const": "value3", "title": "Third Choice" },
                        ],
                    },
                },
            },
        },
    });
    elicit_once(cx, params, "Elicitation completed")
}

// ---------------------------------------------------------------------------------
// 2026-07-28 diagnostic tools.

fn missing_capability(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    text("Success")
}

fn streaming_elicitation(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    // The stateless era has no server-initiated request on a response stream: the
    // question goes back as an MRTR round.
    match cx.input_response("confirmation") {
        Some(answer) => {
            let (action, _) = elicit_answer("confirmation", answer)?;
            text(format!("Elicitation finished: action={action}"))
        }
        None => Ok(input_required(
            vec![(
                "confirmation",
                ask_string("Please confirm to continue", "confirm"),
            )],
            None,
        )),
    }
}

fn logging_tool(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    cx.log("info", json!("Logging tool called"));
    text("Logging tool finished")
}

fn trigger_tool_change(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    cx.announce("notifications/tools/list_changed", json!({}));
    text("Mutation triggered")
}

fn trigger_prompt_change(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    cx.announce("notifications/prompts/list_changed", json!({}));
    text("Mutation triggered")
}

// ---------------------------------------------------------------------------------
// Floods, for the gateway's backpressure tests (`tests/backpressure.rs`): many
// messages, each numbered, as fast as the transport takes them.

/// Most messages one flood sends.
const FLOOD_MAX_COUNT: u64 = 100_000;
/// Most padding bytes per flooded message.
const FLOOD_MAX_BYTES: u64 = 64 * 1024;
/// Announced changes not yet taken by every listen stream before `flood_changes`
/// waits (the fan-out channel holds 256 and drops the oldest beyond that).
const FLOOD_CHANGES_QUEUED: usize = 128;
/// How long `flood_changes` waits for a listen stream to appear, or for one queued
/// change to be taken.
const FLOOD_WAIT: Duration = Duration::from_secs(60);
/// The `_meta` key (and the list-change params key) carrying a flood's padding.
const FLOOD_PAD: &str = "dualera.test/pad";

/// `count` (1..=100,000) and `bytes` (0..=65,536) of a flood call.
fn flood_args(cx: &CallContext<'_>) -> Result<(u64, String), ServerError> {
    cx.only_args(&["count", "bytes"])?;
    let int = |key: &str, min: u64, max: u64| match cx.arguments.get(key) {
        None if min == 0 => Ok(0),
        Some(v) => v
            .as_u64()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| {
                ServerError::params(format!(
                    "argument {key} must be an integer in {min}..={max}"
                ))
            }),
        None => Err(ServerError::params(format!("argument {key} is required"))),
    };
    let count = int("count", 1, FLOOD_MAX_COUNT)?;
    let bytes = int("bytes", 0, FLOOD_MAX_BYTES)?;
    Ok((count, "x".repeat(usize::try_from(bytes).unwrap_or(0))))
}

/// The result naming how many messages a flood sent.
fn flooded(count: u64) -> Result<Outcome, ServerError> {
    Ok(Outcome::Complete(text_result(
        format!("flooded {count}"),
        Some(json!({ "count": count })),
        false,
    )))
}

/// Sends `count` `notifications/progress` on the request's own stream (progress
/// 1..=count, the sequence number; `total` = count; padding in `_meta`), then the
/// result. The transport's send waits while its queue is full, so nothing is dropped
/// here: a slow reader slows this loop.
fn flood(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let (count, pad) = flood_args(cx)?;
    let token = cx
        .meta
        .progress_token
        .clone()
        .ok_or_else(|| ServerError::params("flood needs _meta.progressToken"))?;
    for seq in 1..=count {
        if cx.is_cancelled() {
            return Err(ServerError::params("cancelled"));
        }
        (cx.sink.notify)(Message::Notification(Notification {
            method: "notifications/progress".into(),
            params: Some(json!({
                "progressToken": token,
                "progress": seq,
                "total": count,
                "_meta": { FLOOD_PAD: pad },
            })),
        }));
    }
    flooded(count)
}

/// Announces `count` `notifications/resources/list_changed` (params `seq` 1..=count and
/// padding) to the `subscriptions/listen` streams, then one
/// `notifications/tools/list_changed` naming `count`, then answers. It first waits for
/// a listen stream, and never lets the fan-out channel overflow (which would drop
/// changes): it waits while a stream has not taken the queued ones.
fn flood_changes(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let (count, pad) = flood_args(cx)?;
    let changes = &cx.services.changes;
    let wait = |ready: &dyn Fn() -> bool, what: &str| {
        let start = std::time::Instant::now();
        while !ready() {
            if cx.is_cancelled() {
                return Err(ServerError::params("cancelled"));
            }
            if start.elapsed() > FLOOD_WAIT {
                return Err(ServerError::params(format!(
                    "flood_changes: waited {}s {what}",
                    FLOOD_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    };
    wait(
        &|| changes.receiver_count() > 0,
        "for a subscriptions/listen stream",
    )?;
    let announce = |method: &str, params: Value| {
        changes
            .send(json!({ "method": method, "params": params }))
            .map_err(|_| {
                ServerError::params("flood_changes: every subscriptions/listen stream closed")
            })
    };
    for seq in 1..=count {
        wait(
            &|| changes.len() < FLOOD_CHANGES_QUEUED,
            "for a listen stream to read",
        )?;
        announce(
            "notifications/resources/list_changed",
            json!({ "seq": seq, FLOOD_PAD: pad }),
        )?;
    }
    wait(
        &|| changes.len() < FLOOD_CHANGES_QUEUED,
        "for a listen stream to read",
    )?;
    announce(
        "notifications/tools/list_changed",
        json!({ "count": count }),
    )?;
    flooded(count)
}

// ---------------------------------------------------------------------------------
// 2026-07-28 MRTR tools (FIXTURE §6).

const NAME_QUESTION: &str = "What is your name?";

fn ir_elicitation(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    // Unknown keys are ignored; a missing answer is asked again; a malformed one is
    // an error, never a completion.
    match cx.input_response("user_name") {
        Some(answer) => match elicit_answer("user_name", answer)? {
            (_, Some(content)) => text(format!("Hello, {}!", field("user_name", content, "name")?)),
            (action, None) => text(format!("No name given (action={action})")),
        },
        None => Ok(input_required(
            vec![("user_name", ask_string(NAME_QUESTION, "name"))],
            None,
        )),
    }
}

fn ir_sampling(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    match cx.input_response("capital_question") {
        Some(answer) => text(format!(
            "Model answered: {}",
            sample_text("capital_question", answer)?
        )),
        None => Ok(input_required(
            vec![(
                "capital_question",
                ask_sample("What is the capital of France?", 100),
            )],
            None,
        )),
    }
}

fn ir_list_roots(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    match cx.input_response("client_roots") {
        Some(answer) => text(format!(
            "Found {} root(s)",
            roots("client_roots", answer)?.len()
        )),
        None => Ok(input_required(
            vec![("client_roots", ask("roots/list", json!({})))],
            None,
        )),
    }
}

fn ask_confirm() -> Value {
    ask(
        "elicitation/create",
        json!({
            "message": "Please confirm",
            "requestedSchema": {
                "type": "object",
                "properties": { "ok": { "type": "boolean" } },
                "required": ["ok"],
            },
        }),
    )
}

/// Asks `confirm` with a signed state; completes once the state and answer come back.
fn confirm_with_state(cx: &CallContext<'_>, tool: &str) -> Result<Outcome, ServerError> {
    let state = phase(cx, tool)?;
    match (state, cx.input_response("confirm")) {
        (Some((p, _)), Some(answer)) if p == "confirm" => match elicit_answer("confirm", answer)? {
            (_, Some(content)) => {
                let ok = content.get("ok").and_then(Value::as_bool).ok_or_else(|| {
                    ServerError::params("inputResponses.confirm.content.ok must be a boolean")
                })?;
                text(format!("state-ok: confirmed={ok}"))
            }
            (action, None) => text(format!("state-ok: action={action}")),
        },
        _ => Ok(input_required(
            vec![("confirm", ask_confirm())],
            Some(cx.seal_state(tool, "confirm", 1, json!({}))?),
        )),
    }
}

fn ir_request_state(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    confirm_with_state(cx, "test_input_required_result_request_state")
}

fn ir_tampered_state(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    confirm_with_state(cx, "test_input_required_result_tampered_state")
}

fn ir_multiple_inputs(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    const TOOL: &str = "test_input_required_result_multiple_inputs";
    let state = phase(cx, TOOL)?;
    let answers = (
        cx.input_response("user_name"),
        cx.input_response("greeting"),
        cx.input_response("client_roots"),
    );
    if let (Some(_), (Some(name), Some(greeting), Some(r))) = (&state, answers) {
        let who = match elicit_answer("user_name", name)? {
            (_, Some(c)) => field("user_name", c, "name")?.to_owned(),
            (action, None) => format!("(no name: {action})"),
        };
        let greeting = sample_text("greeting", greeting)?;
        let n = roots("client_roots", r)?.len();
        return text(format!("Name: {who}; greeting: {greeting}; roots: {n}"));
    }
    Ok(input_required(
        vec![
            ("user_name", ask_string(NAME_QUESTION, "name")),
            ("greeting", ask_sample("Generate a greeting", 50)),
            ("client_roots", ask("roots/list", json!({}))),
        ],
        Some(cx.seal_state(TOOL, "all", 1, json!({}))?),
    ))
}

fn ir_multi_round(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    const TOOL: &str = "test_input_required_result_multi_round";
    let step1 = || -> Result<Outcome, ServerError> {
        Ok(input_required(
            vec![("step1", ask_string("Step 1: What is your name?", "name"))],
            Some(cx.seal_state(TOOL, "step1", 1, json!({}))?),
        ))
    };
    match phase(cx, TOOL)? {
        Some((p, _)) if p == "step1" => match cx.input_response("step1") {
            Some(answer) => {
                let name = match elicit_answer("step1", answer)? {
                    (_, Some(c)) => field("step1", c, "name")?.to_owned(),
                    (action, None) => return text(format!("Stopped at step 1 (action={action})")),
                };
                Ok(input_required(
                    vec![(
                        "step2",
                        ask_string("Step 2: What is your favorite color?", "color"),
                    )],
                    Some(cx.seal_state(TOOL, "step2", 2, json!({ "name": name }))?),
                ))
            }
            None => step1(),
        },
        Some((p, data)) if p == "step2" => match cx.input_response("step2") {
            Some(answer) => {
                let name = data.get("name").and_then(Value::as_str).unwrap_or_default();
                match elicit_answer("step2", answer)? {
                    (_, Some(c)) => text(format!(
                        "{name}'s favorite color is {}",
                        field("step2", c, "color")?
                    )),
                    (action, None) => text(format!("Stopped at step 2 (action={action})")),
                }
            }
            None => Ok(input_required(
                vec![(
                    "step2",
                    ask_string("Step 2: What is your favorite color?", "color"),
                )],
                Some(cx.seal_state(TOOL, "step2", 2, data)?),
            )),
        },
        _ => step1(),
    }
}

fn ir_capabilities(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    const TOOL: &str = "test_input_required_result_capabilities";
    if phase(cx, TOOL)?.is_some() {
        let answered: Vec<&str> = ["sample_input", "form_input"]
            .into_iter()
            .filter(|k| cx.input_response(k).is_some())
            .collect();
        if !answered.is_empty() {
            return text(format!("Answered: {}", answered.join(", ")));
        }
    }
    // Ask only what this request's client declared it can answer.
    let mut asks = Vec::new();
    if cx.meta.supports_sampling() {
        asks.push(("sample_input", ask_sample("Sample request", 50)));
    }
    if cx.meta.supports_form_elicitation() {
        asks.push(("form_input", ask_string("Sample question", "answer")));
    }
    if asks.is_empty() {
        return Err(ServerError::MissingCapability {
            required: json!({ "sampling": {} }),
        });
    }
    Ok(input_required(
        asks,
        Some(cx.seal_state(TOOL, "ask", 1, json!({}))?),
    ))
}

fn tools() -> ToolRegistry {
    let none = json!({});
    let mut r = ToolRegistry::new();
    let mut add = |t: FnTool| r.add(Box::new(t));
    add(tool(
        "test_simple_text",
        "Returns a simple text response",
        none.clone(),
        &[],
        simple_text,
    ));
    add(tool(
        "test_image_content",
        "Returns an image (1x1 PNG)",
        none.clone(),
        &[],
        image_content,
    ));
    add(tool(
        "test_audio_content",
        "Returns audio (a tiny WAV)",
        none.clone(),
        &[],
        audio_content,
    ));
    add(tool(
        "test_embedded_resource",
        "Returns an embedded text resource",
        none.clone(),
        &[],
        embedded_resource,
    ));
    add(tool(
        "test_multiple_content_types",
        "Returns text, an image and an embedded resource",
        none.clone(),
        &[],
        multiple_content_types,
    ));
    add(tool(
        "test_error_handling",
        "Always returns a tool error (isError)",
        none.clone(),
        &[],
        error_handling,
    ));
    add(tool(
        "test_tool_with_progress",
        "Reports progress three times (when the request carries a progressToken), then returns the token",
        none.clone(),
        &[],
        with_progress,
    ));
    add(tool(
        "test_tool_with_logging",
        "Emits three info logs (when the request asks for logs), then returns",
        none.clone(),
        &[],
        with_logging,
    ));
    let mut s = tool(
        "test_sampling",
        "Asks the client's model to answer a prompt (sampling via an input_required round)",
        json!({ "prompt": { "type": "string", "description": "The prompt to send to the model" } }),
        &["prompt"],
        sampling,
    );
    s.needs = Some(json!({ "sampling": {} }));
    add(s);
    let form = json!({ "elicitation": { "form": {} } });
    let mut e = tool(
        "test_elicitation",
        "Asks the user for a username and email (form elicitation via an input_required round)",
        json!({ "message": { "type": "string", "description": "The message shown to the user" } }),
        &["message"],
        elicitation,
    );
    e.needs = Some(form.clone());
    add(e);
    let mut e = tool(
        "test_elicitation_sep1034_defaults",
        "Asks for a form whose fields all carry defaults (SEP-1034)",
        none.clone(),
        &[],
        elicitation_defaults,
    );
    e.needs = Some(form.clone());
    add(e);
    let mut e = tool(
        "test_elicitation_sep1330_enums",
        "Asks for a form with every enum variant (SEP-1330)",
        none.clone(),
        &[],
        elicitation_enums,
    );
    e.needs = Some(form);
    add(e);
    let mut m = tool(
        "test_missing_capability",
        "Needs the sampling capability; refused with -32021 when the request lacks it",
        none.clone(),
        &[],
        missing_capability,
    );
    m.needs = Some(json!({ "sampling": {} }));
    add(m);
    add(tool(
        "test_streaming_elicitation",
        "Asks the user to confirm through an input_required round",
        none.clone(),
        &[],
        streaming_elicitation,
    ));
    add(tool(
        "test_logging_tool",
        "Logs one message, only if the request asks for logs",
        none.clone(),
        &[],
        logging_tool,
    ));
    add(tool(
        "test_trigger_tool_change",
        "Announces notifications/tools/list_changed to listening clients",
        none.clone(),
        &[],
        trigger_tool_change,
    ));
    add(tool(
        "test_trigger_prompt_change",
        "Announces notifications/prompts/list_changed to listening clients",
        none.clone(),
        &[],
        trigger_prompt_change,
    ));
    add(FnTool {
        name: "json_schema_2020_12_tool",
        descriptor: json!({
            "name": "json_schema_2020_12_tool",
            "description": "Takes arguments described by a JSON Schema 2020-12 inputSchema ($defs, $anchor, allOf/anyOf, if/then/else)",
            "inputSchema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "$anchor": "addressDef",
                        "type": "object",
                        "properties": { "street": { "type": "string" }, "city": { "type": "string" } },
                    },
                },
                "properties": {
                    "name": { "type": "string" },
                    "address": { "$ref": "#/$defs/address" },
                    "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                    "phone": { "type": "string" },
                    "email": { "type": "string" },
                },
                "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
                "then": { "required": ["phone"] },
                "else": { "required": ["email"] },
                "additionalProperties": false,
            },
        }),
        needs: None,
        run: |cx| text(format!("ok: {}", Value::Object(cx.arguments.clone()))),
    });
    add(FnTool {
        name: "query_region",
        descriptor: json!({
            "name": "query_region",
            "description": "Runs a query in a region; the region and the row limit are mirrored into Mcp-Param-* headers (x-mcp-header) for intermediaries that route on them",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "region": { "type": "string", "x-mcp-header": "Region" },
                    "limit": { "type": "integer", "x-mcp-header": "Limit" },
                    "query": { "type": "string" },
                },
                "required": ["region", "query"],
            },
        }),
        needs: None,
        run: |cx| text(format!("ok: {}", Value::Object(cx.arguments.clone()))),
    });
    let flood_schema = json!({
        "count": { "type": "integer", "minimum": 1, "maximum": FLOOD_MAX_COUNT },
        "bytes": { "type": "integer", "minimum": 0, "maximum": FLOOD_MAX_BYTES },
    });
    add(tool(
        "flood",
        "Streams `count` numbered progress notifications (each padded with `bytes`), then the result",
        flood_schema.clone(),
        &["count"],
        flood,
    ));
    add(tool(
        "flood_changes",
        "Announces `count` numbered resources/list_changed (each padded with `bytes`) to the listen streams, then tools/list_changed, then answers",
        flood_schema,
        &["count"],
        flood_changes,
    ));
    for (name, description, run) in [
        (
            "test_input_required_result_elicitation",
            "Asks the user's name through an input_required round",
            ir_elicitation as fn(&CallContext<'_>) -> Result<Outcome, ServerError>,
        ),
        (
            "test_input_required_result_sampling",
            "Asks the client's model a question through an input_required round",
            ir_sampling,
        ),
        (
            "test_input_required_result_list_roots",
            "Asks the client's roots through an input_required round",
            ir_list_roots,
        ),
        (
            "test_input_required_result_request_state",
            "Asks for confirmation with a signed requestState",
            ir_request_state,
        ),
        (
            "test_input_required_result_multiple_inputs",
            "Asks three things at once (elicitation, sampling, roots)",
            ir_multiple_inputs,
        ),
        (
            "test_input_required_result_multi_round",
            "Asks two questions in two rounds",
            ir_multi_round,
        ),
        (
            "test_input_required_result_tampered_state",
            "Asks for confirmation; a tampered requestState is refused",
            ir_tampered_state,
        ),
        (
            "test_input_required_result_capabilities",
            "Asks only what the request's client capabilities allow",
            ir_capabilities,
        ),
    ] {
        add(tool(name, description, none.clone(), &[], run));
    }
    add_task_tools(&mut r);
    r
}

// ---------------------------------------------------------------------------------
// Tasks (the io.modelcontextprotocol/tasks extension, SEP-2663): the tools the suite's
// tasks-* scenarios call. The server framework decides task or not from each tool's
// `execution.taskSupport` and the request's capabilities; these are plain MRTR tools.

/// Longest `slow_compute` sleep, in seconds.
const SLOW_MAX_SECONDS: u64 = 300;

fn task_tool(
    name: &'static str,
    description: &str,
    properties: Value,
    support: &str,
    after_input: bool,
    run: fn(&CallContext<'_>) -> Result<Outcome, ServerError>,
) -> TaskTool {
    let mut descriptor = descriptor(name, description, properties, &[]);
    descriptor["execution"] = json!({ "taskSupport": support });
    TaskTool {
        inner: FnTool {
            name,
            descriptor,
            needs: None,
            run,
        },
        after_input,
    }
}

fn greet(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let name = cx.optional_string_arg("name", 256)?.unwrap_or("World");
    text(format!("Hello, {name}!"))
}

/// Sleeps `seconds` (checking for cancellation every step), then answers.
fn slow_compute(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let seconds = match cx.arguments.get("seconds") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .filter(|s| *s <= SLOW_MAX_SECONDS)
            .ok_or_else(|| {
                ServerError::params(format!(
                    "argument seconds must be an integer from 0 to {SLOW_MAX_SECONDS}"
                ))
            })?,
    };
    let label = cx.optional_string_arg("label", 256)?.unwrap_or("compute");
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        if cx.is_cancelled() {
            return text(format!("{label}: cancelled"));
        }
        std::thread::sleep(STEP);
    }
    text(format!("{label}: computed after {seconds}s"))
}

fn failing_job(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    std::thread::sleep(Duration::from_millis(500));
    Ok(Outcome::Complete(text_result(
        "the job failed: simulated tool error",
        None,
        true,
    )))
}

fn protocol_error_job(_: &CallContext<'_>) -> Result<Outcome, ServerError> {
    std::thread::sleep(Duration::from_millis(200));
    Err(ServerError::Internal {
        detail: "protocol_error_job: simulated internal failure".into(),
    })
}

fn ask_delete(filename: &str) -> Value {
    ask(
        "elicitation/create",
        json!({
            "message": format!("Delete {filename}?"),
            "requestedSchema": {
                "type": "object",
                "properties": { "confirm": { "type": "boolean" } },
                "required": ["confirm"],
            },
        }),
    )
}

fn confirm_delete(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    let filename = cx
        .optional_string_arg("filename", 256)?
        .unwrap_or("file.txt");
    match cx.input_response("confirm") {
        Some(answer) => match elicit_answer("confirm", answer)? {
            (_, Some(content)) => {
                let yes = content.get("confirm").and_then(Value::as_bool) == Some(true);
                text(format!(
                    "{filename}: {}",
                    if yes { "deleted" } else { "kept" }
                ))
            }
            (action, None) => text(format!("{filename}: kept (action={action})")),
        },
        None => Ok(input_required(
            vec![("confirm", ask_delete(filename))],
            None,
        )),
    }
}

fn multi_input(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    match (cx.input_response("first"), cx.input_response("second")) {
        (Some(a), Some(b)) => {
            let name = |key: &str, v: &Value| -> Result<String, ServerError> {
                Ok(match elicit_answer(key, v)? {
                    (_, Some(c)) => c
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_owned(),
                    (action, None) => action,
                })
            };
            text(format!(
                "first={}, second={}",
                name("first", a)?,
                name("second", b)?
            ))
        }
        _ => Ok(input_required(
            vec![
                ("first", ask_string("First name?", "name")),
                ("second", ask_string("Second name?", "name")),
            ],
            None,
        )),
    }
}

/// Round 1 (synchronous MRTR) asks a name; the request answering it becomes a task
/// whose result names the answer.
fn tool_with_task(cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
    match cx.input_response("user_name") {
        Some(answer) => match elicit_answer("user_name", answer)? {
            (_, Some(content)) => {
                let name = content
                    .get("name")
                    .or_else(|| content.get("user_name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ServerError::params(
                            "inputResponses.user_name.content.name must be a string",
                        )
                    })?;
                std::thread::sleep(Duration::from_millis(200));
                text(format!("Hello, {name}! (finished as a task)"))
            }
            (action, None) => text(format!("No name given (action={action})")),
        },
        None => Ok(input_required(
            vec![("user_name", ask_string(NAME_QUESTION, "name"))],
            None,
        )),
    }
}

fn add_task_tools(r: &mut ToolRegistry) {
    let none = json!({});
    r.add(Box::new(FnTool {
        name: "greet",
        descriptor: descriptor(
            "greet",
            "Greets by name (synchronous only)",
            json!({ "name": { "type": "string" } }),
            &[],
        ),
        needs: None,
        run: greet,
    }));
    for tool in [
        task_tool(
            "slow_compute",
            "Sleeps `seconds` then answers; runs as a task for callers that declare the tasks extension",
            json!({ "seconds": { "type": "integer", "minimum": 0 }, "label": { "type": "string" } }),
            "optional",
            false,
            slow_compute,
        ),
        task_tool(
            "failing_job",
            "Runs only as a task; ends with a tool error",
            none.clone(),
            "required",
            false,
            failing_job,
        ),
        task_tool(
            "protocol_error_job",
            "Runs as a task; ends with a protocol (JSON-RPC) error",
            none.clone(),
            "optional",
            false,
            protocol_error_job,
        ),
        task_tool(
            "confirm_delete",
            "Asks for confirmation (elicitation) before deleting",
            json!({ "filename": { "type": "string" } }),
            "optional",
            false,
            confirm_delete,
        ),
        task_tool(
            "multi_input",
            "Asks two questions at once (two elicitations)",
            none.clone(),
            "optional",
            false,
            multi_input,
        ),
        task_tool(
            "test_tool_with_task",
            "Asks a name synchronously (MRTR), then finishes as a task",
            none,
            "required",
            true,
            tool_with_task,
        ),
    ] {
        r.add(Box::new(tool));
    }
}

// ---------------------------------------------------------------------------------
// Resources.

#[derive(Debug)]
struct Resources;

const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

impl ResourceProvider for Resources {
    fn list(&self) -> Vec<Value> {
        vec![
            json!({
                "uri": "test://static-text",
                "name": "static-text",
                "title": "Static Text Resource",
                "description": "A static text resource for testing",
                "mimeType": "text/plain",
            }),
            json!({
                "uri": "test://static-binary",
                "name": "static-binary",
                "title": "Static Binary Resource",
                "description": "A static binary resource (1x1 PNG) for testing",
                "mimeType": "image/png",
            }),
            json!({
                "uri": "test://watched-resource",
                "name": "watched-resource",
                "title": "Watched Resource",
                "description": "A resource that can be subscribed to",
                "mimeType": "text/plain",
            }),
        ]
    }

    fn templates(&self) -> Vec<Value> {
        vec![json!({
            "uriTemplate": "test://template/{id}/data",
            "name": "template",
            "title": "Template Resource",
            "description": "A resource template with an id parameter",
            "mimeType": "application/json",
        })]
    }

    fn read(&self, _cx: &CallContext<'_>, uri: &str) -> Result<Outcome, ServerError> {
        let item = match uri {
            "test://static-text" => json!({
                "uri": uri, "mimeType": "text/plain",
                "text": "This is the content of the static text resource.",
            }),
            "test://static-binary" => json!({ "uri": uri, "mimeType": "image/png", "blob": IMG }),
            "test://watched-resource" => json!({
                "uri": uri, "mimeType": "text/plain", "text": "Watched resource content",
            }),
            _ => {
                let id = uri
                    .strip_prefix(TEMPLATE_PREFIX)
                    .and_then(|r| r.strip_suffix(TEMPLATE_SUFFIX))
                    .filter(|id| !id.is_empty() && !id.contains('/'))
                    .ok_or_else(|| ServerError::ResourceNotFound {
                        uri: uri.to_owned(),
                    })?;
                let data =
                    json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") });
                json!({ "uri": uri, "mimeType": "application/json", "text": data.to_string() })
            }
        };
        Ok(Outcome::Complete(json!({ "contents": [item] })))
    }

    fn subscribable(&self, uri: &str) -> bool {
        uri == "test://watched-resource"
    }
}

// ---------------------------------------------------------------------------------
// Prompts.

#[derive(Debug)]
struct Prompts;

fn user(content: Value) -> Value {
    json!({ "role": "user", "content": content })
}

fn messages(items: Vec<Value>) -> Result<Outcome, ServerError> {
    Ok(Outcome::Complete(json!({ "messages": items })))
}

impl PromptProvider for Prompts {
    fn list(&self) -> Vec<Value> {
        vec![
            json!({ "name": "test_simple_prompt", "description": "A simple prompt without arguments" }),
            json!({
                "name": "test_prompt_with_arguments",
                "description": "A prompt with two required arguments",
                "arguments": [
                    { "name": "arg1", "description": "First test argument", "required": true },
                    { "name": "arg2", "description": "Second test argument", "required": true },
                ],
            }),
            json!({
                "name": "test_prompt_with_embedded_resource",
                "description": "A prompt that embeds a resource",
                "arguments": [
                    { "name": "resourceUri", "description": "URI of the resource to embed", "required": true },
                ],
            }),
            json!({ "name": "test_prompt_with_image", "description": "A prompt with an image" }),
            json!({
                "name": "test_input_required_result_prompt",
                "description": "A prompt that asks the user for context through an input_required round",
            }),
        ]
    }

    fn get(&self, cx: &CallContext<'_>, name: &str) -> Result<Outcome, ServerError> {
        match name {
            "test_simple_prompt" => messages(vec![user(
                json!({ "type": "text", "text": "This is a simple prompt for testing." }),
            )]),
            "test_prompt_with_arguments" => {
                let a1 = cx.string_arg("arg1", 4096)?;
                let a2 = cx.string_arg("arg2", 4096)?;
                messages(vec![user(json!({
                    "type": "text",
                    "text": format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'"),
                }))])
            }
            "test_prompt_with_embedded_resource" => {
                let uri = cx.string_arg("resourceUri", 4096)?;
                messages(vec![
                    user(json!({
                        "type": "resource",
                        "resource": {
                            "uri": uri,
                            "mimeType": "text/plain",
                            "text": "Embedded resource content for testing.",
                        },
                    })),
                    user(
                        json!({ "type": "text", "text": "Please process the embedded resource above." }),
                    ),
                ])
            }
            "test_prompt_with_image" => messages(vec![
                user(json!({ "type": "image", "data": IMG, "mimeType": "image/png" })),
                user(json!({ "type": "text", "text": "Please analyze the image above." })),
            ]),
            "test_input_required_result_prompt" => match cx.input_response("user_context") {
                Some(answer) => match elicit_answer("user_context", answer)? {
                    (_, Some(c)) => messages(vec![user(json!({
                        "type": "text",
                        "text": format!("Prompt with context: {}", field("user_context", c, "context")?),
                    }))]),
                    (action, None) => messages(vec![user(json!({
                        "type": "text",
                        "text": format!("Prompt without context (action={action})"),
                    }))]),
                },
                None => Ok(input_required(
                    vec![(
                        "user_context",
                        ask_string("What context should the prompt use?", "context"),
                    )],
                    None,
                )),
            },
            other => Err(ServerError::params(format!("Unknown prompt: {other}"))),
        }
    }
}

// ---------------------------------------------------------------------------------
// Completion.

#[derive(Debug)]
struct Completions;

impl CompletionProvider for Completions {
    fn complete(&self, params: &Map<String, Value>) -> Result<Value, ServerError> {
        let argument = params
            .get("argument")
            .and_then(Value::as_object)
            .ok_or_else(|| ServerError::params("params.argument must be an object"))?;
        let name = argument
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let value = argument
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let prompt = params
            .get("ref")
            .filter(|r| r.get("type").and_then(Value::as_str) == Some("ref/prompt"))
            .and_then(|r| r.get("name"))
            .and_then(Value::as_str);
        let candidates: &[&str] = match (prompt, name) {
            (Some("test_prompt_with_embedded_resource"), "resourceUri") => &[
                "test://static-text",
                "test://static-binary",
                "test://watched-resource",
            ],
            _ => &[],
        };
        let values: Vec<&str> = candidates
            .iter()
            .copied()
            .filter(|c| c.starts_with(value))
            .collect();
        Ok(json!({ "values": values, "total": values.len(), "hasMore": false }))
    }
}

fn catalog() -> Catalog {
    let mut c = Catalog::with_tools("dualera-conformance-fixture", tools());
    c.resources = Some(Box::new(Resources));
    c.prompts = Some(Box::new(Prompts));
    c.completions = Some(Box::new(Completions));
    c.list_changed = true;
    c.logging = true;
    c.cache = CacheHints {
        discover_ttl_ms: 0,
        discover_scope: "private",
        list_ttl_ms: 300_000,
        list_scope: "public",
        read_ttl_ms: 300_000,
        read_scope: "private",
    };
    c
}

// ---------------------------------------------------------------------------------
// Program.

/// Where to serve: an HTTP listener, or newline-delimited JSON-RPC on stdin/stdout.
enum Serve {
    Listen(SocketAddr),
    Stdio,
}

fn parse_args() -> Result<Serve, String> {
    let mut args = std::env::args().skip(1);
    let mut serve = Serve::Listen(SocketAddr::from(([127, 0, 0, 1], 0)));
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => {
                let v = args.next().ok_or("--listen needs an address")?;
                serve = Serve::Listen(v.parse().map_err(|e| format!("--listen {v}: {e}"))?);
            }
            "--stdio" => serve = Serve::Stdio,
            "-h" | "--help" => {
                return Err("usage: conformance_upstream [--listen 127.0.0.1:0 | --stdio]".into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(serve)
}

async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DUALERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let serve = match parse_args() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("conformance_upstream: {e}");
            return ExitCode::from(2);
        }
    };
    // Config::default(): in-memory store, loopback only, a random requestState key.
    let server = match Server::with_catalog(&Config::default(), catalog()) {
        Ok((s, _)) => s,
        Err(e) => {
            eprintln!("conformance_upstream: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = match serve {
        Serve::Listen(addr) => addr,
        Serve::Stdio => {
            // The principal `dualera serve --stdio` uses by default (stdio has no tokens).
            let stdin = tokio::io::BufReader::new(tokio::io::stdin());
            return match stdio::serve(server, "local".into(), stdin, tokio::io::stdout()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("conformance_upstream: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    let listener = match http::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("conformance_upstream: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(bound) => eprintln!("listening on http://{bound}{}", dualera::endpoint::ENDPOINT),
        Err(e) => {
            eprintln!("conformance_upstream: {e}");
            return ExitCode::FAILURE;
        }
    }
    match http::serve(listener, server, shutdown()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conformance_upstream: {e}");
            ExitCode::FAILURE
        }
    }
}
