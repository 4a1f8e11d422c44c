//! The validation ladder every request climbs before a handler runs, then dispatch.
//!
//! Order (2026-07-28 `basic/index.mdx`, `transports/streamable-http.mdx`): envelope →
//! `MCP-Protocol-Version` header present → `_meta` (`-32602`) → header equals `_meta`
//! version (`-32020`) → version supported (`-32022`) → `Mcp-Method`/`Mcp-Name` match the
//! body (`-32020`) → method exists (`-32601`) → params and tool → capabilities
//! (`-32021`) → handler.

use super::error::ServerError;
use super::meta::{RequestMeta, SERVER_INFO};
use super::tools::{CallContext, ToolOutcome};
use super::{now_ms, Server};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dualera_adapters::jsonrpc::{self, Message, Request, Response};
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
    Accepted,
}

/// Methods of the legacy era that a modern-only server answers with `-32601`.
const LEGACY_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

impl Server {
    /// Handles one body (HTTP) or line (stdio) from `principal`.
    pub fn handle_bytes(
        &self,
        principal: &str,
        body: &[u8],
        headers: Option<&MirroredHeaders>,
    ) -> Handled {
        match jsonrpc::parse(body) {
            Ok(Message::Request(req)) => self.handle_request(principal, req, headers),
            Ok(Message::Notification(n)) => {
                debug!(method = %n.method, "notification accepted");
                Handled::Accepted
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
    ) -> Handled {
        let span = info_span!("request", rpc.id = %req.id, method = %req.method, principal);
        let _enter = span.enter();
        let id = req.id.clone();
        match self.dispatch(principal, req, headers) {
            Ok(result) => Handled::Reply {
                status: StatusCode::OK,
                response: Response::result(id, result),
            },
            Err(e) => {
                debug!(error = %e, "request refused");
                reply_error(Some(id), e)
            }
        }
    }

    fn dispatch(
        &self,
        principal: &str,
        req: Request,
        headers: Option<&MirroredHeaders>,
    ) -> Result<Value, ServerError> {
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
                        "MCP-Protocol-Version header {:?} does not match _meta protocolVersion {:?}",
                        h.protocol_version.as_deref().unwrap_or_default(),
                        meta.version
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
        let params = req.params.as_ref().and_then(Value::as_object);
        match req.method.as_str() {
            "server/discover" => Ok(self.discover()),
            "tools/list" => self.tools_list(params),
            "tools/call" => self.tools_call(principal, &meta, params),
            m if LEGACY_METHODS.contains(&m) => Err(legacy_method(m)),
            other => Err(ServerError::MethodNotFound {
                method: other.to_owned(),
            }),
        }
    }

    fn server_info(&self) -> Value {
        json!({ "name": self.inner.name, "version": env!("CARGO_PKG_VERSION") })
    }

    fn result_meta(&self) -> Value {
        json!({ SERVER_INFO: self.server_info() })
    }

    fn discover(&self) -> Value {
        json!({
            "resultType": "complete",
            "supportedVersions": ProtocolVersion::MODERN,
            "capabilities": { "tools": { "listChanged": false } },
            "instructions": "Notes live in workspaces named by file: URIs that the server's \
                configuration grants you; pass workspaceUri explicitly. notes_delete asks the \
                user to pick and confirm through a form; summarize_repo asks your model twice \
                (pick files, then summarize).",
            "ttlMs": 3_600_000,
            "cacheScope": "public",
            "_meta": self.result_meta(),
        })
    }

    fn tools_list(&self, params: Option<&Map<String, Value>>) -> Result<Value, ServerError> {
        if let Some(cursor) = params.and_then(|p| p.get("cursor")) {
            // One page holds every tool, so no cursor was ever issued.
            return Err(ServerError::params(format!("unknown cursor {cursor}")));
        }
        Ok(json!({
            "resultType": "complete",
            "tools": self.inner.tools.descriptors(),
            "ttlMs": 3_600_000,
            "cacheScope": "public",
            "_meta": self.result_meta(),
        }))
    }

    fn tools_call(
        &self,
        principal: &str,
        meta: &RequestMeta,
        params: Option<&Map<String, Value>>,
    ) -> Result<Value, ServerError> {
        let params = params.ok_or_else(|| ServerError::params("params are required"))?;
        let name = match params.get("name") {
            Some(Value::String(n)) => n.as_str(),
            _ => return Err(ServerError::params("params.name must be a string")),
        };
        let tool = self
            .inner
            .tools
            .get(name)
            .ok_or_else(|| ServerError::params(format!("Unknown tool: {name}")))?;
        let empty = Map::new();
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(a)) => a,
            Some(_) => return Err(ServerError::params("params.arguments must be an object")),
        };
        let input_responses = match params.get("inputResponses") {
            None | Some(Value::Null) => None,
            Some(Value::Object(r)) => Some(r),
            Some(_) => return Err(ServerError::params("params.inputResponses must be an object")),
        };
        let request_state = match params.get("requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(ServerError::params("params.requestState must be a string")),
        };
        if let Some(need) = tool.required_capabilities() {
            if !meta.satisfies(&need) {
                return Err(ServerError::MissingCapability { required: need });
            }
        }
        let cx = CallContext {
            principal,
            meta,
            arguments,
            input_responses,
            request_state,
            services: &self.inner.services,
            now_ms: now_ms(),
        };
        let span = info_span!("tool", tool = name, round = request_state.is_some());
        let _enter = span.enter();
        match tool.call(&cx)? {
            ToolOutcome::Complete(mut result) => {
                if let Value::Object(m) = &mut result {
                    m.insert("resultType".into(), json!("complete"));
                    m.insert("_meta".into(), self.result_meta());
                }
                Ok(result)
            }
            ToolOutcome::InputRequired {
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
                Ok(Value::Object(m))
            }
        }
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
    ServerError::MethodNotFound {
        method: format!(
            "{method} (a legacy, session-based method; this server speaks only protocol \
             version {}: use server/discover, or put the dualera gateway in front of it \
             for legacy hosts)",
            ProtocolVersion::MODERN.join(", ")
        ),
    }
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
                    "Mcp-Method header {m:?} does not match body method {:?}",
                    req.method
                ),
            })
        }
        Some(_) => {}
    }
    let name_field = match req.method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
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
                    "Mcp-Name header {header:?} does not match body {field} {:?}",
                    body.unwrap_or_default()
                ),
            });
        }
    }
    Ok(())
}

/// Decodes a mirrored header value (plain visible ASCII, or `=?base64?…?=`).
fn decode_header_value(raw: &str) -> Option<String> {
    if let Some(inner) = raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        return String::from_utf8(STANDARD.decode(inner).ok()?).ok();
    }
    raw.bytes()
        .all(|b| b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b))
        .then(|| raw.to_owned())
}

fn reply_error(id: Option<dualera_adapters::RequestId>, e: ServerError) -> Handled {
    if matches!(e, ServerError::Store(_) | ServerError::Internal { .. }) {
        tracing::error!(error = %e, "internal error");
    }
    let (status, error) = e.respond();
    Handled::Reply {
        status,
        response: Response::error(id, error),
    }
}

#[cfg(test)]
mod tests {
    use super::decode_header_value;

    #[test]
    fn header_values() {
        assert_eq!(decode_header_value("notes_delete").as_deref(), Some("notes_delete"));
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?=").as_deref(),
            Some("Hello, 世界")
        );
        assert_eq!(decode_header_value("=?base64?!!!?="), None);
        assert_eq!(decode_header_value("a\u{1}b"), None);
    }
}
