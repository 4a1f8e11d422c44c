//! Per-request `_meta` of revision 2026-07-28: read it, check it, and answer capability
//! questions about *this* request only (earlier requests never count).

use super::error::ServerError;
use serde_json::{Map, Value};

/// `_meta` key carrying the protocol version.
pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key carrying the client capabilities.
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying the self-reported client identity.
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key carrying the requested log level.
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key correlating notifications with their `subscriptions/listen`.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// `_meta` key carrying the server identity on results.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The protocol fields of one request's `_meta`.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    /// The protocol version the request says it speaks.
    pub version: String,
    /// The capabilities the client declared for this request.
    pub capabilities: Map<String, Value>,
    /// Self-reported client identity: for logs only, never for decisions.
    pub client_info: Option<Value>,
    /// Requested minimum log level, if any.
    pub log_level: Option<String>,
    /// `progressToken`, if the request opted into progress notifications.
    pub progress_token: Option<Value>,
}

impl RequestMeta {
    /// Reads `params._meta`; anything missing or of the wrong type is `-32602`
    /// (2026-07-28 basic/index.mdx, "Per-request protocol fields").
    pub fn read(params: Option<&Value>) -> Result<Self, ServerError> {
        let meta = params
            .and_then(|p| p.get("_meta"))
            .ok_or_else(|| ServerError::params("params._meta is required"))?
            .as_object()
            .ok_or_else(|| ServerError::params("params._meta must be an object"))?;
        let version = match meta.get(PROTOCOL_VERSION) {
            Some(Value::String(v)) => v.clone(),
            Some(_) => {
                return Err(ServerError::params(format!(
                    "_meta[\"{PROTOCOL_VERSION}\"] must be a string"
                )))
            }
            None => {
                return Err(ServerError::params(format!(
                    "_meta[\"{PROTOCOL_VERSION}\"] is required"
                )))
            }
        };
        let capabilities = match meta.get(CLIENT_CAPABILITIES) {
            Some(Value::Object(c)) => c.clone(),
            Some(_) => {
                return Err(ServerError::params(format!(
                    "_meta[\"{CLIENT_CAPABILITIES}\"] must be an object"
                )))
            }
            None => {
                return Err(ServerError::params(format!(
                    "_meta[\"{CLIENT_CAPABILITIES}\"] is required"
                )))
            }
        };
        let log_level = meta
            .get(LOG_LEVEL)
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Self {
            version,
            capabilities,
            client_info: meta.get(CLIENT_INFO).cloned(),
            log_level,
            progress_token: meta
                .get("progressToken")
                .filter(|t| t.is_string() || t.is_i64())
                .cloned(),
        })
    }

    /// Whether this request's client can answer a form-mode `elicitation/create`.
    /// `"elicitation": {}` means form; `{"url": {}}` alone does not.
    pub fn supports_form_elicitation(&self) -> bool {
        match self.capabilities.get("elicitation") {
            Some(Value::Object(e)) => {
                e.get("form").is_some_and(Value::is_object)
                    || (!e.contains_key("form") && !e.contains_key("url"))
            }
            _ => false,
        }
    }

    /// Whether this request's client can answer `sampling/createMessage`.
    pub fn supports_sampling(&self) -> bool {
        self.capabilities
            .get("sampling")
            .is_some_and(Value::is_object)
    }

    /// Whether this request's client can answer `roots/list`.
    pub fn supports_roots(&self) -> bool {
        self.capabilities.get("roots").is_some_and(Value::is_object)
    }

    /// The protocol fields as a `_meta` object again (what a task keeps of the request
    /// that created it; the progress token is not kept: a task has no stream).
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert(PROTOCOL_VERSION.into(), Value::String(self.version.clone()));
        m.insert(
            CLIENT_CAPABILITIES.into(),
            Value::Object(self.capabilities.clone()),
        );
        if let Some(info) = &self.client_info {
            m.insert(CLIENT_INFO.into(), info.clone());
        }
        if let Some(level) = &self.log_level {
            m.insert(LOG_LEVEL.into(), Value::String(level.clone()));
        }
        Value::Object(m)
    }

    /// Whether this request's capabilities declare the extension `id` (2026-07-28
    /// `ClientCapabilities.extensions`: an object per extension; only this request's
    /// `_meta` counts).
    pub fn has_extension(&self, id: &str) -> bool {
        self.capabilities
            .get("extensions")
            .and_then(|e| e.get(id))
            .is_some_and(Value::is_object)
    }

    /// Checks a need expressed in `ClientCapabilities` shape (as sent in `-32021`).
    pub fn satisfies(&self, need: &Value) -> bool {
        let Some(need) = need.as_object() else {
            return true;
        };
        need.iter().all(|(cap, detail)| match cap.as_str() {
            "elicitation" => {
                let wants_url = detail.get("url").is_some();
                let wants_form = detail.get("form").is_some() || !wants_url;
                (!wants_form || self.supports_form_elicitation())
                    && (!wants_url
                        || self
                            .capabilities
                            .get("elicitation")
                            .and_then(|e| e.get("url"))
                            .is_some_and(Value::is_object))
            }
            "extensions" => detail
                .as_object()
                .is_none_or(|ids| ids.keys().all(|id| self.has_extension(id))),
            other => self.capabilities.get(other).is_some_and(Value::is_object),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(caps: Value) -> RequestMeta {
        RequestMeta::read(Some(&json!({"_meta": {
            PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: caps
        }})))
        .unwrap()
    }

    #[test]
    fn elicitation_modes() {
        let form = json!({"elicitation": {"form": {}}});
        assert!(meta(json!({"elicitation": {}})).satisfies(&form));
        assert!(meta(json!({"elicitation": {"form": {}}})).satisfies(&form));
        assert!(meta(json!({"elicitation": {"form": {}, "url": {}}})).satisfies(&form));
        assert!(!meta(json!({"elicitation": {"url": {}}})).satisfies(&form));
        assert!(!meta(json!({})).satisfies(&form));
        assert!(meta(json!({"sampling": {}})).satisfies(&json!({"sampling": {}})));
        assert!(!meta(json!({"sampling": true})).satisfies(&json!({"sampling": {}})));
        let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
        assert!(meta(tasks.clone()).satisfies(&tasks));
        assert!(meta(tasks.clone()).has_extension("io.modelcontextprotocol/tasks"));
        assert!(!meta(json!({"extensions": {}})).satisfies(&tasks));
        assert!(
            !meta(json!({"extensions": {"io.modelcontextprotocol/tasks": true}})).satisfies(&tasks)
        );
    }

    #[test]
    fn required_fields() {
        assert!(RequestMeta::read(None).is_err());
        assert!(RequestMeta::read(Some(&json!({"_meta": {}}))).is_err());
        assert!(RequestMeta::read(Some(
            &json!({"_meta": {PROTOCOL_VERSION: 5, CLIENT_CAPABILITIES: {}}})
        ))
        .is_err());
        assert!(RequestMeta::read(Some(&json!({"_meta": {PROTOCOL_VERSION: "x"}}))).is_err());
    }
}
