//! The JSON-RPC 2.0 envelope shared by every MCP revision, and its strict parser.
//!
//! Parsing is two-step on purpose: bytes become a `serde_json::Value` (failure is
//! `-32700`), then the value is checked against the envelope rules (failure is `-32600`,
//! with the request id when it could be read). Params stay a `Value`: what a method's
//! params mean is the handler's business, not the envelope's.

use crate::json::write;
use serde_json::{Map, Value};
use std::fmt;

/// A JSON-RPC request id. MCP allows strings and integers, never `null`. Ordered
/// (integers first) so that serialized maps keyed by ids are deterministic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestId {
    /// An integer id.
    Number(i64),
    /// A string id.
    String(String),
}

/// One write per id where the derived hash made two (the variant, then the value): a
/// session's maps are keyed by ids, and a request looks them up a dozen times. Equal
/// ids still hash equally; a number and a string may share a hash, which equality
/// tells apart (a pair at most: nothing to flood a table with).
impl std::hash::Hash for RequestId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Self::Number(n) => state.write_i64(*n),
            Self::String(s) => s.hash(state),
        }
    }
}

impl RequestId {
    /// Reads an id from a JSON value; `None` for anything but a string or an integer
    /// that fits in 64 bits.
    pub fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::String(s) => Some(Self::String(s.clone())),
            Value::Number(n) => n.as_i64().map(Self::Number),
            _ => None,
        }
    }

    /// The id as a JSON value.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Number(n) => Value::from(*n),
            Self::String(s) => Value::String(s.clone()),
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::String(s) => write!(f, "{}", crate::echo::echo_quoted(s)),
        }
    }
}

/// A JSON-RPC error code. Unknown codes are kept as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub i64);

impl ErrorCode {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: Self = Self(-32700);
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: Self = Self(-32600);
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: Self = Self(-32601);
    /// Invalid method parameters.
    pub const INVALID_PARAMS: Self = Self(-32602);
    /// Internal JSON-RPC error.
    pub const INTERNAL_ERROR: Self = Self(-32603);
    /// HTTP headers do not match the body (2026-07-28).
    pub const HEADER_MISMATCH: Self = Self(-32020);
    /// A capability the request needs is missing from its `_meta` (2026-07-28).
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: Self = Self(-32021);
    /// The requested protocol version is not supported (2026-07-28).
    pub const UNSUPPORTED_PROTOCOL_VERSION: Self = Self(-32022);
    /// Resource not found (2025-11-25 and earlier only).
    pub const LEGACY_RESOURCE_NOT_FOUND: Self = Self(-32002);
    /// URL elicitation required (2025-11-25 only).
    pub const URL_ELICITATION_REQUIRED: Self = Self(-32042);
}

/// The `error` member of an error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorObject {
    /// The error code.
    pub code: ErrorCode,
    /// A short human-readable description.
    pub message: String,
    /// Optional structured detail.
    pub data: Option<Value>,
}

impl ErrorObject {
    /// An error with no `data`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Attaches `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The error object as JSON.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("code".into(), Value::from(self.code.0));
        m.insert("message".into(), Value::String(self.message.clone()));
        if let Some(d) = &self.data {
            m.insert("data".into(), d.clone());
        }
        Value::Object(m)
    }

    /// Reads an error object (`code`, `message`, optional `data`); `None` when it is
    /// not one.
    pub fn from_value(v: &Value) -> Option<Self> {
        let o = v.as_object()?;
        Some(Self {
            code: ErrorCode(o.get("code")?.as_i64()?),
            message: o.get("message")?.as_str()?.to_owned(),
            data: o.get("data").cloned(),
        })
    }
}

/// A request: expects exactly one response with the same id.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request id.
    pub id: RequestId,
    /// The method name.
    pub method: String,
    /// The params object, if any.
    pub params: Option<Value>,
}

/// A notification: no id, never answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name.
    pub method: String,
    /// The params object, if any.
    pub params: Option<Value>,
}

impl Notification {
    /// The request a `notifications/cancelled` names (`params.requestId`); `None` for
    /// any other notification or one without a valid id (2025-11-25
    /// basic/utilities/cancellation: such a notification is ignored).
    pub fn cancelled_request(&self) -> Option<RequestId> {
        if self.method != "notifications/cancelled" {
            return None;
        }
        self.params
            .as_ref()?
            .get("requestId")
            .and_then(RequestId::from_value)
    }
}

/// A response: a result or an error for the request with the same id.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id of the request answered; `None` only for errors about unreadable requests.
    pub id: Option<RequestId>,
    /// The result, or the error.
    pub outcome: Result<Value, ErrorObject>,
}

impl Response {
    /// A successful response.
    pub fn result(id: RequestId, result: Value) -> Self {
        Self {
            id: Some(id),
            outcome: Ok(result),
        }
    }

    /// An error response.
    pub fn error(id: Option<RequestId>, error: ErrorObject) -> Self {
        Self {
            id,
            outcome: Err(error),
        }
    }
}

/// Any JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A response.
    Response(Response),
}

/// Why bytes are not a JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvelopeError {
    /// Not JSON at all (`-32700`).
    Parse {
        /// What the JSON parser said.
        detail: String,
    },
    /// JSON, but not a valid JSON-RPC message (`-32600`).
    Invalid {
        /// The request id, when it could be read.
        id: Option<RequestId>,
        /// What rule was broken.
        detail: String,
    },
}

impl EnvelopeError {
    /// The error response a receiver sends for this envelope error.
    pub fn to_response(&self) -> Response {
        match self {
            Self::Parse { detail } => Response::error(
                None,
                ErrorObject::new(ErrorCode::PARSE_ERROR, format!("Parse error: {detail}")),
            ),
            Self::Invalid { id, detail } => Response::error(
                id.clone(),
                ErrorObject::new(
                    ErrorCode::INVALID_REQUEST,
                    format!("Invalid request: {detail}"),
                ),
            ),
        }
    }
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse { detail } => write!(f, "parse error: {detail}"),
            Self::Invalid { detail, .. } => write!(f, "invalid request: {detail}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// What one HTTP body or one stdio line holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A single message.
    Single(Message),
    /// A JSON-RPC batch (allowed by 2025-03-26 only); each element parsed on its own.
    Batch(Vec<Result<Message, EnvelopeError>>),
}

/// Parses bytes holding exactly one message (batches are refused as `-32600`).
pub fn parse(bytes: &[u8]) -> Result<Message, EnvelopeError> {
    let value = parse_json(bytes)?;
    if value.is_array() {
        return Err(invalid(None, "batches are not supported"));
    }
    Message::from_value(value)
}

/// Parses bytes holding a message or a batch of messages.
pub fn parse_incoming(bytes: &[u8]) -> Result<Incoming, EnvelopeError> {
    match parse_json(bytes)? {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(invalid(None, "empty batch"));
            }
            Ok(Incoming::Batch(
                items.into_iter().map(Message::from_value).collect(),
            ))
        }
        other => Message::from_value(other).map(Incoming::Single),
    }
}

/// Bytes to JSON: not JSON is `-32700`; JSON whose objects repeat a member name is
/// `-32600` (see [`crate::json`]), with the message's id when that is not what repeats.
fn parse_json(bytes: &[u8]) -> Result<Value, EnvelopeError> {
    match crate::json::parse_lenient(bytes) {
        Err(e) => Err(EnvelopeError::Parse {
            detail: e.to_string(),
        }),
        Ok((value, None)) => Ok(value),
        Ok((value, Some(dup))) => {
            let id = match &dup {
                crate::json::JsonError::DuplicateMember { name, depth: 0 } if name == "id" => None,
                _ => value.get("id").and_then(RequestId::from_value),
            };
            Err(invalid(id, dup.to_string()))
        }
    }
}

fn invalid(id: Option<RequestId>, detail: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Invalid {
        id,
        detail: detail.into(),
    }
}

/// Longest string id accepted, in bytes. JSON-RPC requires a response to repeat its
/// request's id, so a peer choosing a megabyte id would have every answer (and every
/// answer a host does not read) cost a megabyte; a longer id is refused as an invalid
/// request whose id is not repeated. Room is left for an intermediary that prefixes
/// the ids it forwards.
pub const MAX_ID_BYTES: usize = 1024;

impl Message {
    /// Checks a JSON value against the envelope rules.
    pub fn from_value(value: Value) -> Result<Self, EnvelopeError> {
        let Value::Object(mut obj) = value else {
            return Err(invalid(None, "a message must be a JSON object"));
        };
        let raw_id = obj.remove("id");
        if let Some(Value::String(long)) = &raw_id {
            if long.len() > MAX_ID_BYTES {
                return Err(invalid(
                    None,
                    format!(
                        "`id` longer than {MAX_ID_BYTES} bytes: {}",
                        crate::echo::echo_quoted(long)
                    ),
                ));
            }
        }
        let id = match &raw_id {
            None => None,
            Some(v) => match RequestId::from_value(v) {
                Some(id) => Some(id),
                None => {
                    return Err(invalid(
                        None,
                        "`id` must be a string or an integer (and not null)",
                    ))
                }
            },
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(invalid(id, "`jsonrpc` must be \"2.0\""));
        }
        if let Some(method) = obj.remove("method") {
            let Value::String(method) = method else {
                return Err(invalid(id, "`method` must be a string"));
            };
            let params = obj.remove("params");
            if let Some(p) = &params {
                if !p.is_object() {
                    return Err(invalid(id, "`params` must be an object"));
                }
            }
            if obj.contains_key("result") || obj.contains_key("error") {
                return Err(invalid(id, "a request cannot carry `result` or `error`"));
            }
            return Ok(match id {
                Some(id) => Self::Request(Request { id, method, params }),
                None => Self::Notification(Notification { method, params }),
            });
        }
        match (obj.remove("result"), obj.remove("error")) {
            (Some(result), None) => {
                let Some(id) = id else {
                    return Err(invalid(None, "a result response needs an `id`"));
                };
                Ok(Self::Response(Response::result(id, result)))
            }
            (None, Some(error)) => {
                let error = ErrorObject::from_value(&error).ok_or_else(|| {
                    invalid(
                        id.clone(),
                        "`error` needs an integer `code` and a `message`",
                    )
                })?;
                Ok(Self::Response(Response::error(id, error)))
            }
            _ => Err(invalid(
                id,
                "a message needs `method`, or exactly one of `result` and `error`",
            )),
        }
    }

    /// The message as JSON.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("jsonrpc".into(), Value::from("2.0"));
        match self {
            Self::Request(r) => {
                m.insert("id".into(), r.id.to_value());
                m.insert("method".into(), Value::String(r.method.clone()));
                if let Some(p) = &r.params {
                    m.insert("params".into(), p.clone());
                }
            }
            Self::Notification(n) => {
                m.insert("method".into(), Value::String(n.method.clone()));
                if let Some(p) = &n.params {
                    m.insert("params".into(), p.clone());
                }
            }
            Self::Response(r) => {
                if let Some(id) = &r.id {
                    m.insert("id".into(), id.to_value());
                }
                match &r.outcome {
                    Ok(v) => m.insert("result".into(), v.clone()),
                    Err(e) => m.insert("error".into(), e.to_value()),
                };
            }
        }
        Value::Object(m)
    }

    /// The message serialized as compact JSON: the bytes `to_value` would serialize to
    /// (members in the same sorted order), written straight from the fields. Every
    /// message crossing the gateway goes through here, so no intermediate tree is built.
    pub fn to_vec(&self) -> Vec<u8> {
        // The envelope's members and an id take under 64 bytes.
        let hint = |v: &Option<Value>| v.as_ref().map_or(0, write::len_hint);
        let body = match self {
            Self::Request(r) => r.method.len() + hint(&r.params),
            Self::Notification(n) => n.method.len() + hint(&n.params),
            Self::Response(r) => match &r.outcome {
                Ok(v) => write::len_hint(v),
                Err(e) => e.message.len() + hint(&e.data),
            },
        };
        let mut out = Vec::with_capacity(64 + body);
        let params = |out: &mut Vec<u8>, p: &Option<Value>| {
            if let Some(p) = p {
                out.extend_from_slice(b",\"params\":");
                write::value(out, p);
            }
        };
        match self {
            Self::Request(r) => {
                out.extend_from_slice(b"{\"id\":");
                write_id(&mut out, &r.id);
                out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"method\":");
                write::string(&mut out, &r.method);
                params(&mut out, &r.params);
            }
            Self::Notification(n) => {
                out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
                write::string(&mut out, &n.method);
                params(&mut out, &n.params);
            }
            Self::Response(r) => {
                // Sorted member order: "error" < "id" < "jsonrpc" < "result".
                out.push(b'{');
                if let Err(e) = &r.outcome {
                    out.extend_from_slice(b"\"error\":{\"code\":");
                    out.extend_from_slice(e.code.0.to_string().as_bytes());
                    if let Some(d) = &e.data {
                        out.extend_from_slice(b",\"data\":");
                        write::value(&mut out, d);
                    }
                    out.extend_from_slice(b",\"message\":");
                    write::string(&mut out, &e.message);
                    out.extend_from_slice(b"},");
                }
                if let Some(id) = &r.id {
                    out.extend_from_slice(b"\"id\":");
                    write_id(&mut out, id);
                    out.push(b',');
                }
                out.extend_from_slice(b"\"jsonrpc\":\"2.0\"");
                if let Ok(v) = &r.outcome {
                    out.extend_from_slice(b",\"result\":");
                    write::value(&mut out, v);
                }
            }
        }
        out.push(b'}');
        out
    }
}

fn write_id(out: &mut Vec<u8>, id: &RequestId) {
    match id {
        RequestId::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        RequestId::String(s) => write::string(out, s),
    }
}

impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Self::Response(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_id_is_refused_without_being_repeated() {
        let ok = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"x"}}"#,
            "i".repeat(MAX_ID_BYTES)
        );
        assert!(matches!(parse(ok.as_bytes()), Ok(Message::Request(_))));
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"x"}}"#,
            "i".repeat(MAX_ID_BYTES + 1)
        );
        let Err(e @ EnvelopeError::Invalid { id: None, .. }) = parse(long.as_bytes()) else {
            panic!("a long id was accepted or repeated");
        };
        let r = e.to_response();
        assert_eq!(r.id, None);
        assert_eq!(
            r.outcome.as_ref().err().map(|e| e.code),
            Some(ErrorCode::INVALID_REQUEST)
        );
        assert!(Message::Response(r).to_vec().len() < 600);
    }

    #[test]
    fn classifies() {
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Ok(Message::Request(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            Ok(Message::Response(_))
        ));
        assert!(matches!(parse(b"{"), Err(EnvelopeError::Parse { .. })));
        assert!(matches!(
            parse(b"\xff\xfe"),
            Err(EnvelopeError::Parse { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"1.0","id":7,"method":"x"}"#),
            Err(EnvelopeError::Invalid {
                id: Some(RequestId::Number(7)),
                ..
            })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
            Err(EnvelopeError::Invalid { id: None, .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#),
            Err(EnvelopeError::Invalid { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            Err(EnvelopeError::Invalid { .. })
        ));
    }

    #[test]
    fn duplicate_member_names_are_refused() {
        let e =
            parse(br#"{"jsonrpc":"2.0","id":4,"result":{"action":"decline","action":"accept"}}"#)
                .unwrap_err();
        let EnvelopeError::Invalid { id, detail } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(id, &Some(RequestId::Number(4)));
        assert!(
            detail.contains("duplicate member name \"action\""),
            "{detail}"
        );
        assert_eq!(
            e.to_response().outcome.unwrap_err().code,
            ErrorCode::INVALID_REQUEST
        );
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#),
            Err(EnvelopeError::Invalid { id: None, .. })
        ));
        assert!(matches!(
            parse_incoming(br#"[{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}]"#),
            Err(EnvelopeError::Invalid { .. })
        ));
    }

    #[test]
    fn ids_are_displayed_bounded() {
        let id = RequestId::String("x".repeat(3_000_000));
        assert!(id.to_string().len() < 400);
    }

    #[test]
    fn batches() {
        let Ok(Incoming::Batch(items)) =
            parse_incoming(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"bad":1}]"#)
        else {
            panic!("expected a batch");
        };
        assert!(items[0].is_ok());
        assert!(items[1].is_err());
        assert!(parse_incoming(b"[]").is_err());
    }

    #[test]
    fn roundtrip() {
        let raw =
            br#"{"jsonrpc":"2.0","id":"x","error":{"code":-32022,"message":"m","data":{"a":1}}}"#;
        let m = parse(raw).unwrap();
        assert_eq!(parse(&m.to_vec()).unwrap(), m);
    }

    #[test]
    fn to_vec_matches_the_value_serialization() {
        for raw in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\"b","arguments":{"z":1,"a":[true,null]}}}"#,
            r#"{"jsonrpc":"2.0","id":"s\u0001","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":0.5}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":-7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32022,"message":"m\n","data":{"a":1}}}"#,
            r#"{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"}}"#,
        ] {
            let m = parse(raw.as_bytes()).unwrap();
            assert_eq!(
                m.to_vec(),
                serde_json::to_vec(&m.to_value()).unwrap(),
                "{raw}"
            );
        }
    }
}
