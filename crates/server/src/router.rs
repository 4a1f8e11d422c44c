//! The validation ladder every request climbs before a handler runs, then dispatch.
//!
//! Order (2026-07-28 `basic/index.mdx`, `transports/streamable-http.mdx`): envelope →
//! `MCP-Protocol-Version` header present → `_meta` (`-32602`) → header equals `_meta`
//! version (`-32020`) → version supported (`-32022`) → `Mcp-Method`/`Mcp-Name` match the
//! body (`-32020`) → method exists (`-32601`) → params and tool → capabilities
//! (`-32021`) → handler.

use super::error::ServerError;
use super::meta::{RequestMeta, SERVER_INFO, SUBSCRIPTION_ID};
use super::tasks::{self, NewTask, TaskSupport};
use super::tools::{CallContext, Outcome, Sink};
use super::{now_ms, Server};
use dualera_adapters::echo::{echo, echo_quoted};
use dualera_adapters::jsonrpc::{self, Message, Notification, Request, RequestId, Response};
use dualera_adapters::param_headers::ParamHeader;
use dualera_adapters::ProtocolVersion;
use http::StatusCode;
use serde_json::{json, Map, Value};
use tracing::{debug, info_span};

/// The HTTP headers that mirror body fields (absent on stdio).
#[derive(Debug, Clone, Default)]
pub struct MirroredHeaders {
    /// `MCP-Protocol-Version`.
    pub protocol_version: Option<String>,
    /// `Mcp-Method`.
    pub method: Option<String>,
    /// `Mcp-Name`, raw (possibly `=?base64?…?=`).
    pub name: Option<String>,
    /// Every `Mcp-Param-{Name}` header: `{Name}` lower-cased, and the raw value (`None`
    /// when it is not visible ASCII).
    pub params: Vec<(String, Option<String>)>,
}

/// What the transport should do with a request body.
#[derive(Debug)]
pub enum Handled {
    /// Send this response with this HTTP status.
    Reply {
        /// The HTTP status (stdio ignores it).
        status: StatusCode,
        /// The response.
        response: Response,
    },
    /// A notification: HTTP 202 with no body; nothing on stdio.
    Accepted {
        /// For `notifications/cancelled` (stdio): the request to cancel.
        cancelled: Option<RequestId>,
    },
    /// A `subscriptions/listen` stream to keep open.
    Listen(Listen),
}

/// Methods of the legacy era that a modern-only server answers with `-32601`.
const LEGACY_METHODS: &[&str] = dualera_adapters::ProtocolVersion::REMOVED_IN_MODERN;

/// A `subscriptions/listen` request that passed validation: the transport keeps its
/// stream open and forwards matching changes.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The listen request's id (the subscription id).
    pub id: RequestId,
    /// Who listens (task status goes only to the task's principal).
    pub principal: String,
    /// The honored filter (what the acknowledgment carries).
    pub honored: Map<String, Value>,
}

impl Listen {
    /// The `notifications/subscriptions/acknowledged` message, first on the stream.
    pub fn acknowledgment(&self) -> Message {
        Message::Notification(Notification {
            method: "notifications/subscriptions/acknowledged".into(),
            params: Some(json!({
                "_meta": { SUBSCRIPTION_ID: self.id.to_value() },
                "notifications": self.honored,
            })),
        })
    }

    /// The notification to forward for a change announced by a handler, if this
    /// subscription asked for it, tagged with the subscription id.
    pub fn forward(&self, change: &Value) -> Option<Message> {
        let method = change.get("method")?.as_str()?;
        let wanted = match method {
            "notifications/tools/list_changed" => self.flag("toolsListChanged"),
            "notifications/prompts/list_changed" => self.flag("promptsListChanged"),
            "notifications/resources/list_changed" => self.flag("resourcesListChanged"),
            tasks::NOTIFICATION => {
                self.flag(tasks::LISTEN_FILTER)
                    && change.get("principal").and_then(Value::as_str)
                        == Some(self.principal.as_str())
            }
            "notifications/resources/updated" => {
                let uri = change.pointer("/params/uri").and_then(Value::as_str);
                self.honored
                    .get("resourceSubscriptions")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|u| u.as_str() == uri))
            }
            _ => false,
        };
        if !wanted {
            return None;
        }
        let mut params = change
            .get("params")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        params.insert(
            "_meta".into(),
            json!({ SUBSCRIPTION_ID: self.id.to_value() }),
        );
        Some(Message::Notification(Notification {
            method: method.to_owned(),
            params: Some(Value::Object(params)),
        }))
    }

    /// The graceful end of the subscription (sent when the server shuts down).
    pub fn closing(&self) -> Message {
        Message::Response(Response::result(
            self.id.clone(),
            json!({ "resultType": "complete", "_meta": { SUBSCRIPTION_ID: self.id.to_value() } }),
        ))
    }

    fn flag(&self, key: &str) -> bool {
        self.honored.get(key).and_then(Value::as_bool) == Some(true)
    }
}

/// What a request turned into before the transport answers it.
enum Answer {
    Result(Value),
    Listen(Listen),
}

impl Server {
    /// Handles one body (HTTP) or line (stdio) from `principal`. Notifications about
    /// the request go to `sink` before the return value is sent.
    pub fn handle_bytes(
        &self,
        principal: &str,
        body: &[u8],
        headers: Option<&MirroredHeaders>,
        sink: &Sink<'_>,
    ) -> Handled {
        match jsonrpc::parse(body) {
            Ok(Message::Request(req)) => self.handle_request(principal, req, headers, sink),
            Ok(Message::Notification(n)) => {
                debug!(method = %dualera_adapters::echo::echo(&n.method), "notification accepted");
                let cancelled = n.cancelled_request();
                Handled::Accepted { cancelled }
            }
            Ok(Message::Response(_)) => reply_error(
                None,
                ServerError::InvalidRequest {
                    detail: "clients must not send responses to this server".into(),
                },
            ),
            Err(e) => {
                let id = match &e {
                    jsonrpc::EnvelopeError::Invalid { id, .. } => id.clone(),
                    jsonrpc::EnvelopeError::Parse { .. } => None,
                };
                reply_error(id, e.into())
            }
        }
    }

    /// Handles one parsed request.
    pub fn handle_request(
        &self,
        principal: &str,
        req: Request,
        headers: Option<&MirroredHeaders>,
        sink: &Sink<'_>,
    ) -> Handled {
        let span = info_span!("request", rpc.id = %req.id, method = %echo(&req.method), principal);
        let _enter = span.enter();
        let id = req.id.clone();
        match self.dispatch(principal, req, headers, sink) {
            Ok(Answer::Result(result)) => Handled::Reply {
                status: StatusCode::OK,
                response: Response::result(id, result),
            },
            Ok(Answer::Listen(listen)) => Handled::Listen(listen),
            Err(e) => {
                debug!(error = %dualera_adapters::echo::prefix_marked(&e.to_string(), crate::error::MAX_MESSAGE), "request refused");
                reply_error(Some(id), e)
            }
        }
    }

    fn dispatch(
        &self,
        principal: &str,
        req: Request,
        headers: Option<&MirroredHeaders>,
        sink: &Sink<'_>,
    ) -> Result<Answer, ServerError> {
        if LEGACY_METHODS.contains(&req.method.as_str()) && is_legacy_shaped(&req, headers) {
            return Err(legacy_method(&req.method));
        }
        if let Some(h) = headers {
            if h.protocol_version.is_none() {
                return Err(ServerError::HeaderMismatch {
                    reason: "the MCP-Protocol-Version header is required".into(),
                });
            }
        }
        let meta = RequestMeta::read(req.params.as_ref())?;
        if let Some(h) = headers {
            if h.protocol_version.as_deref() != Some(meta.version.as_str()) {
                return Err(ServerError::HeaderMismatch {
                    reason: format!(
                        "MCP-Protocol-Version header {} does not match _meta protocolVersion {}",
                        echo_quoted(h.protocol_version.as_deref().unwrap_or_default()),
                        echo_quoted(&meta.version)
                    ),
                });
            }
        }
        if !ProtocolVersion::MODERN.contains(&meta.version.as_str()) {
            return Err(ServerError::UnsupportedVersion {
                requested: meta.version,
            });
        }
        if let Some(h) = headers {
            check_mirrored(h, &req)?;
        }
        let empty = Map::new();
        let params = req
            .params
            .as_ref()
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let catalog = &self.inner.catalog;
        let result = match req.method.as_str() {
            "server/discover" => self.discover(),
            "tools/list" => {
                no_cursor(params)?;
                self.list_result("tools", Value::from(catalog.tools.descriptors()))
            }
            "tools/call" => self.call(principal, &meta, params, sink, "tools/call", headers)?,
            "resources/list" if catalog.resources.is_some() => {
                no_cursor(params)?;
                let list = catalog
                    .resources
                    .as_ref()
                    .map(|r| r.list())
                    .unwrap_or_default();
                self.list_result("resources", Value::from(list))
            }
            "resources/templates/list" if catalog.resources.is_some() => {
                no_cursor(params)?;
                let list = catalog
                    .resources
                    .as_ref()
                    .map(|r| r.templates())
                    .unwrap_or_default();
                self.list_result("resourceTemplates", Value::from(list))
            }
            "resources/read" if catalog.resources.is_some() => {
                self.call(principal, &meta, params, sink, "resources/read", None)?
            }
            "prompts/list" if catalog.prompts.is_some() => {
                no_cursor(params)?;
                let list = catalog
                    .prompts
                    .as_ref()
                    .map(|p| p.list())
                    .unwrap_or_default();
                self.list_result("prompts", Value::from(list))
            }
            "prompts/get" if catalog.prompts.is_some() => {
                self.call(principal, &meta, params, sink, "prompts/get", None)?
            }
            "completion/complete" if catalog.completions.is_some() => {
                let completion = catalog
                    .completions
                    .as_ref()
                    .map(|c| c.complete(params))
                    .transpose()?
                    .unwrap_or(Value::Null);
                json!({ "resultType": "complete", "completion": completion, "_meta": self.result_meta() })
            }
            "subscriptions/listen" => {
                return Ok(Answer::Listen(self.listen(
                    req.id.clone(),
                    principal,
                    &meta,
                    params,
                )?))
            }
            "tasks/get" | "tasks/update" | "tasks/cancel" => {
                self.task_method(principal, &meta, &req.method, params)?
            }
            m if LEGACY_METHODS.contains(&m) => return Err(legacy_method(m)),
            other => {
                return Err(ServerError::MethodNotFound {
                    method: other.to_owned(),
                })
            }
        };
        Ok(Answer::Result(result))
    }

    fn server_info(&self) -> Value {
        json!({ "name": self.inner.catalog.name, "version": self.inner.catalog.version })
    }

    fn result_meta(&self) -> Value {
        json!({ SERVER_INFO: self.server_info() })
    }

    fn discover(&self) -> Value {
        let c = &self.inner.catalog;
        let mut v = json!({
            "resultType": "complete",
            "supportedVersions": ProtocolVersion::MODERN,
            "capabilities": c.capabilities(),
            "ttlMs": c.cache.discover_ttl_ms,
            "cacheScope": c.cache.discover_scope,
            "_meta": self.result_meta(),
        });
        if let (Some(i), Value::Object(m)) = (&c.instructions, &mut v) {
            m.insert("instructions".into(), Value::String(i.clone()));
        }
        v
    }

    fn list_result(&self, key: &str, items: Value) -> Value {
        let c = &self.inner.catalog;
        let mut m = Map::new();
        m.insert("resultType".into(), json!("complete"));
        m.insert(key.into(), items);
        m.insert("ttlMs".into(), json!(c.cache.list_ttl_ms));
        m.insert("cacheScope".into(), json!(c.cache.list_scope));
        m.insert("_meta".into(), self.result_meta());
        Value::Object(m)
    }

    fn listen(
        &self,
        id: RequestId,
        principal: &str,
        meta: &RequestMeta,
        params: &Map<String, Value>,
    ) -> Result<Listen, ServerError> {
        let filter = match params.get("notifications") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(f)) => f.clone(),
            Some(_) => {
                return Err(ServerError::params(
                    "params.notifications must be an object",
                ))
            }
        };
        let c = &self.inner.catalog;
        let mut honored = Map::new();
        for (key, offered) in [
            ("toolsListChanged", c.list_changed),
            ("promptsListChanged", c.list_changed && c.prompts.is_some()),
            (
                "resourcesListChanged",
                c.list_changed && c.resources.is_some(),
            ),
        ] {
            match filter.get(key) {
                None | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => {
                    if offered {
                        honored.insert(key.into(), Value::Bool(true));
                    }
                }
                Some(_) => {
                    return Err(ServerError::params(format!(
                        "notifications.{key} must be a boolean"
                    )))
                }
            }
        }
        // Task status (the tasks extension's `notifications/tasks`): honored for a
        // listener that declared the extension; it gets its own principal's tasks only.
        match filter.get(tasks::LISTEN_FILTER) {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                if meta.has_extension(tasks::EXTENSION) {
                    honored.insert(tasks::LISTEN_FILTER.into(), Value::Bool(true));
                }
            }
            Some(_) => {
                return Err(ServerError::params(format!(
                    "notifications.{} must be a boolean",
                    tasks::LISTEN_FILTER
                )))
            }
        }
        if let Some(subs) = filter.get("resourceSubscriptions") {
            let subs = subs.as_array().ok_or_else(|| {
                ServerError::params("notifications.resourceSubscriptions must be an array")
            })?;
            let kept: Vec<Value> = subs
                .iter()
                .take(256)
                .filter(|u| {
                    u.as_str()
                        .is_some_and(|u| c.resources.as_ref().is_some_and(|r| r.subscribable(u)))
                })
                .cloned()
                .collect();
            if !kept.is_empty() {
                honored.insert("resourceSubscriptions".into(), Value::Array(kept));
            }
        }
        Ok(Listen {
            id,
            principal: principal.to_owned(),
            honored,
        })
    }

    /// `tools/call`, `prompts/get`, `resources/read`: the methods that may answer
    /// `input_required`.
    fn call(
        &self,
        principal: &str,
        meta: &RequestMeta,
        params: &Map<String, Value>,
        sink: &Sink<'_>,
        method: &str,
        headers: Option<&MirroredHeaders>,
    ) -> Result<Value, ServerError> {
        let catalog = &self.inner.catalog;
        let (target_key, args_key) = match method {
            "resources/read" => ("uri", None),
            "prompts/get" => ("name", Some("arguments")),
            _ => ("name", Some("arguments")),
        };
        let target = match params.get(target_key) {
            Some(Value::String(n)) => n.as_str(),
            _ => {
                return Err(ServerError::params(format!(
                    "params.{target_key} must be a string"
                )))
            }
        };
        let empty = Map::new();
        let arguments = match args_key.and_then(|k| params.get(k)) {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(a)) => a,
            Some(_) => return Err(ServerError::params("params.arguments must be an object")),
        };
        let input_responses = match params.get("inputResponses") {
            None | Some(Value::Null) => None,
            Some(Value::Object(r)) => Some(r),
            Some(_) => {
                return Err(ServerError::params(
                    "params.inputResponses must be an object",
                ))
            }
        };
        let request_state = match params.get("requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(ServerError::params("params.requestState must be a string")),
        };
        let mut task = false;
        let tool = if method == "tools/call" {
            let tool = catalog.tools.get(target).ok_or_else(|| {
                ServerError::params(format!("Unknown tool: {}", echo_quoted(target)))
            })?;
            if let Some(h) = headers {
                check_param_headers(h, catalog.tools.param_headers(target), arguments)?;
            }
            if let Some(need) = tool.required_capabilities() {
                if !meta.satisfies(&need) {
                    return Err(ServerError::MissingCapability { required: need });
                }
            }
            // The tasks extension: the server decides; only a caller that declared
            // the extension in this request gets a task, and a tool that runs only
            // as a task refuses the others with -32021 (SEP-2663 "Required
            // Capabilities"; extensions/tasks/overview.mdx "Check client capabilities").
            let support = catalog.tools.task_support(target);
            let as_task = meta.has_extension(tasks::EXTENSION);
            if support == TaskSupport::Required && !as_task {
                return Err(tasks::missing_extension());
            }
            if support != TaskSupport::Forbidden
                && as_task
                && (!tool.task_after_input()
                    || input_responses.is_some()
                    || request_state.is_some())
            {
                task = true;
            }
            Some(tool)
        } else {
            None
        };
        let cx = CallContext {
            principal,
            method,
            sink,
            meta,
            arguments,
            input_responses,
            request_state,
            services: &self.inner.services,
            now_ms: now_ms(),
        };
        // An echoed requestState is verified (tag, expiry, principal, method, target,
        // arguments) before any handler runs, including handlers and paths that never
        // use one: a state replayed elsewhere is -32602, never silently ignored.
        if request_state.is_some() {
            cx.open_state(target)?;
        }
        if let (true, Some(tool)) = (task, tool) {
            return self.create_task(
                principal,
                meta,
                &NewTask {
                    tool: tool.name(),
                    arguments,
                    input_responses,
                    request_state,
                },
            );
        }
        let span = info_span!("call", target, round = request_state.is_some());
        let _enter = span.enter();
        let outcome = match (method, tool) {
            (_, Some(tool)) => tool.call(&cx)?,
            ("prompts/get", None) => catalog
                .prompts
                .as_ref()
                .ok_or_else(|| ServerError::MethodNotFound {
                    method: method.into(),
                })?
                .get(&cx, target)?,
            _ => catalog
                .resources
                .as_ref()
                .ok_or_else(|| ServerError::MethodNotFound {
                    method: method.into(),
                })?
                .read(&cx, target)?,
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            // Which round answered which: a retry's `state_in` is the `state_out` of the
            // round it answers, wherever that ran (digests only; a state is opaque).
            let (result, state_out) = match &outcome {
                Outcome::Complete(_) => ("complete", None),
                Outcome::InputRequired { request_state, .. } => {
                    ("input_required", request_state.as_deref().map(state_digest))
                }
            };
            debug!(
                result,
                state_in = request_state.map(state_digest).as_deref(),
                state_out = state_out.as_deref(),
                "call answered"
            );
        }
        Ok(match outcome {
            Outcome::Complete(mut result) => {
                if let Value::Object(m) = &mut result {
                    m.insert("resultType".into(), json!("complete"));
                    if method == "resources/read" {
                        m.insert("ttlMs".into(), json!(catalog.cache.read_ttl_ms));
                        m.insert("cacheScope".into(), json!(catalog.cache.read_scope));
                    }
                    m.insert("_meta".into(), self.result_meta());
                }
                result
            }
            Outcome::InputRequired {
                input_requests,
                request_state,
            } => {
                let mut m = Map::new();
                m.insert("resultType".into(), json!("input_required"));
                if !input_requests.is_empty() {
                    m.insert("inputRequests".into(), Value::Object(input_requests));
                }
                if let Some(s) = request_state {
                    m.insert("requestState".into(), Value::String(s));
                }
                m.insert("_meta".into(), self.result_meta());
                Value::Object(m)
            }
        })
    }
}

/// A short digest of a `requestState`, for logs.
fn state_digest(state: &str) -> String {
    crate::digest::short_digest(state.as_bytes(), 6)
}

fn no_cursor(params: &Map<String, Value>) -> Result<(), ServerError> {
    match params.get("cursor") {
        // One page holds everything, so no cursor was ever issued.
        Some(c) if !c.is_null() => Err(ServerError::params(format!(
            "unknown cursor {}",
            echo(&c.to_string())
        ))),
        _ => Ok(()),
    }
}

/// A legacy method with no modern `_meta`: legacy traffic, answered before the
/// header checks so that the error names what this server speaks.
fn is_legacy_shaped(req: &Request, headers: Option<&MirroredHeaders>) -> bool {
    let has_meta_version = req
        .params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(super::meta::PROTOCOL_VERSION))
        .is_some();
    !has_meta_version
        || headers.is_some_and(|h| {
            h.protocol_version
                .as_deref()
                .is_none_or(|v| !dualera_adapters::version::is_modern_or_later(v))
        })
}

fn legacy_method(method: &str) -> ServerError {
    let method = LEGACY_METHODS
        .iter()
        .copied()
        .find(|m| *m == method)
        .unwrap_or("a legacy method");
    ServerError::LegacyMethod { method }
}

fn check_mirrored(h: &MirroredHeaders, req: &Request) -> Result<(), ServerError> {
    match h.method.as_deref() {
        None => {
            return Err(ServerError::HeaderMismatch {
                reason: "the Mcp-Method header is required".into(),
            })
        }
        Some(m) if m != req.method => {
            return Err(ServerError::HeaderMismatch {
                reason: format!(
                    "Mcp-Method header {} does not match body method {}",
                    echo_quoted(m),
                    echo_quoted(&req.method)
                ),
            })
        }
        Some(_) => {}
    }
    let name_field = match req.method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        // SEP-2663 "Streamable HTTP: Routing Headers": the task methods carry
        // `Mcp-Name: <taskId>`.
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    if let Some(field) = name_field {
        let body = req
            .params
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str);
        let header = match h.name.as_deref() {
            None => {
                return Err(ServerError::HeaderMismatch {
                    reason: "the Mcp-Name header is required".into(),
                })
            }
            Some(raw) => decode_header_value(raw).ok_or_else(|| ServerError::HeaderMismatch {
                reason: "the Mcp-Name header is not valid (bad characters or base64)".into(),
            })?,
        };
        if body != Some(header.as_str()) {
            return Err(ServerError::HeaderMismatch {
                reason: format!(
                    "Mcp-Name header {} does not match body {field} {}",
                    echo_quoted(&header),
                    echo_quoted(body.unwrap_or_default())
                ),
            });
        }
    }
    Ok(())
}

/// `Mcp-Param-*` against the body (2026-07-28 Streamable HTTP, "Server Validation"): a
/// server that reads the body MUST reject, with 400 and `-32020`, a header that is
/// missing while its parameter has a value, present while it has none, not validly
/// encoded, or different from the value (integers compared as numbers).
fn check_param_headers(
    h: &MirroredHeaders,
    annotated: &[ParamHeader],
    arguments: &Map<String, Value>,
) -> Result<(), ServerError> {
    let mismatch = |reason: String| ServerError::HeaderMismatch { reason };
    for param in annotated {
        let header = format!("Mcp-Param-{}", param.name);
        let raw = h
            .params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&param.name))
            .map(|(_, v)| v);
        let value = param.value_in(arguments);
        let at = param.path.join(".");
        let raw = match (value, raw) {
            (None, None) => continue,
            (Some(_), None) => {
                return Err(mismatch(format!(
                    "the {header} header is required: arguments.{at} has a value"
                )))
            }
            (None, Some(_)) => {
                return Err(mismatch(format!(
                    "{header} header sent, but arguments.{at} has no value"
                )))
            }
            (Some(_), Some(raw)) => raw,
        };
        let decoded = raw
            .as_deref()
            .and_then(decode_header_value)
            .ok_or_else(|| {
                mismatch(format!(
                    "the {header} header is not valid (bad characters or base64)"
                ))
            })?;
        let matches = match value {
            Some(Value::String(s)) => *s == decoded,
            Some(Value::Bool(b)) => decoded == if *b { "true" } else { "false" },
            Some(Value::Number(n)) => decoded
                .trim()
                .parse::<f64>()
                .is_ok_and(|d| n.as_f64() == Some(d)),
            _ => false,
        };
        if !matches {
            return Err(mismatch(format!(
                "{header} header {} does not match arguments.{at}",
                echo_quoted(&decoded)
            )));
        }
    }
    Ok(())
}

pub(super) use dualera_common::mirrored::decode_header_value;

fn reply_error(id: Option<dualera_adapters::RequestId>, e: ServerError) -> Handled {
    match &e {
        // The store's own error (never the URL or a password) goes to the log; the
        // client only learns that it was internal.
        ServerError::Store(store) => tracing::error!(error = %store, "store error"),
        ServerError::Internal { .. } => tracing::error!(error = %e, "internal error"),
        _ => {}
    }
    let (status, error) = e.respond();
    Handled::Reply {
        status,
        response: Response::error(id, error),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_param_headers, MirroredHeaders};
    use dualera_adapters::param_headers::tool_param_headers;
    use serde_json::{json, Value};

    #[test]
    fn param_headers_checked_against_the_body() {
        let annotated = tool_param_headers(&json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "limit": {"type": "integer", "x-mcp-header": "Limit"},
            "opts": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry"}}},
            "query": {"type": "string"}}}))
        .unwrap();
        let check = |args: Value, headers: &[(&str, Option<&str>)]| {
            let h = MirroredHeaders {
                params: headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), v.map(str::to_owned)))
                    .collect(),
                ..MirroredHeaders::default()
            };
            check_param_headers(&h, &annotated, args.as_object().unwrap()).is_ok()
        };
        let args = json!({"region": "Hello", "limit": 42, "opts": {"dry": true}, "query": "q"});
        let good = [
            ("region", Some("Hello")),
            ("limit", Some("42")),
            ("dry", Some("true")),
        ];
        assert!(check(args.clone(), &good));
        // Header names are case-insensitive; integers compare as numbers; Base64 decodes.
        assert!(check(
            args.clone(),
            &[
                ("REGION", Some("=?base64?SGVsbG8=?=")),
                ("limit", Some("42.0")),
                ("dry", Some("true"))
            ]
        ));
        // A literal that only looks half like the sentinel is a literal.
        assert!(check(
            json!({"region": "=?base64?SGVsbG8=", "limit": 1}),
            &[("region", Some("=?base64?SGVsbG8=")), ("limit", Some("1"))]
        ));
        // Absent and null parameters need no header.
        assert!(check(json!({"query": "q", "limit": null}), &[]));
        for (args, headers) in [
            // Missing while the body has a value.
            (args.clone(), &good[..2]),
            // Different value.
            (
                args.clone(),
                &[
                    ("region", Some("Goodbye")),
                    ("limit", Some("42")),
                    ("dry", Some("true")),
                ][..],
            ),
            (
                args.clone(),
                &[
                    ("region", Some("Hello")),
                    ("limit", Some("41")),
                    ("dry", Some("true")),
                ][..],
            ),
            (
                args.clone(),
                &[
                    ("region", Some("Hello")),
                    ("limit", Some("42")),
                    ("dry", Some("false")),
                ][..],
            ),
            // Bad padding, bad alphabet, not visible ASCII.
            (
                args.clone(),
                &[
                    ("region", Some("=?base64?SGVsbG8?=")),
                    ("limit", Some("42")),
                    ("dry", Some("true")),
                ][..],
            ),
            (
                args.clone(),
                &[
                    ("region", Some("=?base64?SGVs!!!bG8=?=")),
                    ("limit", Some("42")),
                    ("dry", Some("true")),
                ][..],
            ),
            (
                args.clone(),
                &[
                    ("region", None),
                    ("limit", Some("42")),
                    ("dry", Some("true")),
                ][..],
            ),
            // Sent for a parameter with no value.
            (json!({"query": "q"}), &[("region", Some("Hello"))][..]),
        ] {
            assert!(!check(args.clone(), headers), "{args} {headers:?}");
        }
    }
}
