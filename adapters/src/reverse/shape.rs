//! What the reverse bridge changes in messages as they cross from a legacy server
//! (2025-11-25 … 2024-11-05) to a 2026-07-28 host and back: capabilities both ways,
//! the `server/discover` result built from `initialize`, results and errors, and the
//! input requests a parked server request becomes.
//!
//! Kept apart from the machine so each rule can be read (and tested) on its own; none
//! of these functions keeps state.

use crate::jsonrpc::{ErrorCode, ErrorObject};
use crate::revision::Revision;
use crate::version::ProtocolVersion;
use serde_json::{json, Map, Value};

/// The prefix of every `_meta` key MCP reserves for protocol fields
/// (`io.modelcontextprotocol/protocolVersion`, `…/clientCapabilities`, …): those are
/// the modern request's envelope and have no place in a legacy request.
pub const RESERVED_META_PREFIX: &str = "io.modelcontextprotocol/";

/// Methods whose 2026-07-28 results are cacheable (`CacheableResult`: `ttlMs` and
/// `cacheScope` are required; 2026-07-28 `server/utilities/caching`).
pub const CACHEABLE_METHODS: [&str; 5] = [
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

fn empty() -> Value {
    Value::Object(Map::new())
}

fn object_or_empty(value: Option<&Value>) -> Value {
    match value {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        _ => empty(),
    }
}

/// The host's declared modern `ClientCapabilities`, normalized: `"elicitation": {}`
/// means form only (2026-07-28 `client/elicitation`), so it becomes `{"form": {}}`;
/// anything that is not an object is no capability at all.
pub fn normalize_host_capabilities(modern: &Value) -> Value {
    let Some(modern) = modern.as_object() else {
        return empty();
    };
    let mut out = Map::new();
    for (key, value) in modern {
        if !value.is_object() {
            continue;
        }
        if key == "elicitation" && value.as_object().is_some_and(Map::is_empty) {
            out.insert(key.clone(), json!({ "form": {} }));
        } else {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

/// The legacy `ClientCapabilities` the bridge declares in `initialize`, from the
/// host's (normalized) modern ones, in the 2025-11-25 shape (the revision offered
/// first). `elicitation.form` / `.url`, `sampling` (with `context` / `tools`) and
/// `experimental` are kept; `roots` becomes `{}`: a modern host has no
/// `notifications/roots/list_changed` to send, so `listChanged` is never promised.
/// `extensions` has no legacy counterpart and is dropped.
pub fn client_to_legacy(modern: &Value) -> Value {
    let mut out = Map::new();
    if let Some(elicitation) = modern.get("elicitation").and_then(Value::as_object) {
        let mut modes = Map::new();
        for mode in ["form", "url"] {
            if elicitation.contains_key(mode) {
                modes.insert(mode.into(), object_or_empty(elicitation.get(mode)));
            }
        }
        out.insert("elicitation".into(), Value::Object(modes));
    }
    if let Some(sampling) = modern.get("sampling").and_then(Value::as_object) {
        let mut sub = Map::new();
        for key in ["context", "tools"] {
            if sampling.contains_key(key) {
                sub.insert(key.into(), object_or_empty(sampling.get(key)));
            }
        }
        out.insert("sampling".into(), Value::Object(sub));
    }
    if modern.get("roots").is_some_and(Value::is_object) {
        out.insert("roots".into(), empty());
    }
    if let Some(experimental @ Value::Object(_)) = modern.get("experimental") {
        out.insert("experimental".into(), experimental.clone());
    }
    Value::Object(out)
}

/// The legacy server's `initialize` capabilities as 2026-07-28 `ServerCapabilities`:
/// `prompts`, `resources`, `tools` with their boolean flags, `logging`, `completions`
/// (2025-03-26 and later only) and `experimental`; legacy-only members (`tasks`) are
/// dropped.
pub fn server_to_modern(revision: &Revision, legacy: &Value) -> Value {
    let mut out = Map::new();
    let keep_flags = |v: &Value, flags: &[&str]| {
        let mut m = Map::new();
        if let Some(o) = v.as_object() {
            for flag in flags {
                if let Some(b @ Value::Bool(_)) = o.get(*flag) {
                    m.insert((*flag).into(), b.clone());
                }
            }
        }
        Value::Object(m)
    };
    if let Some(v) = legacy.get("prompts").filter(|v| v.is_object()) {
        out.insert("prompts".into(), keep_flags(v, &["listChanged"]));
    }
    if let Some(v) = legacy.get("resources").filter(|v| v.is_object()) {
        out.insert(
            "resources".into(),
            keep_flags(v, &["subscribe", "listChanged"]),
        );
    }
    if let Some(v) = legacy.get("tools").filter(|v| v.is_object()) {
        out.insert("tools".into(), keep_flags(v, &["listChanged"]));
    }
    if legacy.get("logging").is_some_and(Value::is_object) {
        out.insert("logging".into(), empty());
    }
    if revision.completions && legacy.get("completions").is_some_and(Value::is_object) {
        out.insert("completions".into(), empty());
    }
    if let Some(experimental @ Value::Object(_)) = legacy.get("experimental") {
        out.insert("experimental".into(), experimental.clone());
    }
    Value::Object(out)
}

/// How long, and for whom, a translated result may be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caching {
    /// `ttlMs`.
    pub ttl_ms: u64,
    /// `cacheScope` is `"public"` (else `"private"`).
    pub public: bool,
}

impl Caching {
    fn insert(self, out: &mut Map<String, Value>) {
        out.insert("ttlMs".into(), Value::from(self.ttl_ms));
        out.insert(
            "cacheScope".into(),
            Value::from(if self.public { "public" } else { "private" }),
        );
    }
}

/// The 2026-07-28 `server/discover` result for a legacy server, from its `initialize`
/// result (2026-07-28 `server/discover`, "DiscoverResult"): `supportedVersions` names
/// the modern revisions the bridge speaks (the host talks to the bridge, not to the
/// legacy server), `serverInfo` goes to `_meta`, `instructions` is kept when it is a
/// string.
pub fn discover_result(revision: &Revision, initialize: &Value, caching: Caching) -> Value {
    let mut out = Map::new();
    out.insert("resultType".into(), Value::from("complete"));
    out.insert(
        "supportedVersions".into(),
        Value::from(ProtocolVersion::MODERN.to_vec()),
    );
    out.insert(
        "capabilities".into(),
        server_to_modern(
            revision,
            initialize.get("capabilities").unwrap_or(&Value::Null),
        ),
    );
    if let Some(instructions @ Value::String(_)) = initialize.get("instructions") {
        out.insert("instructions".into(), instructions.clone());
    }
    if let Some(info @ Value::Object(_)) = initialize.get("serverInfo") {
        out.insert(
            "_meta".into(),
            json!({ "io.modelcontextprotocol/serverInfo": info }),
        );
    }
    caching.insert(&mut out);
    Value::Object(out)
}

/// A legacy result as the 2026-07-28 result of `method`: `resultType: "complete"`
/// (2026-07-28 `basic`, "Responses": servers of this revision MUST include it), plus
/// `ttlMs` / `cacheScope` on the cacheable methods. A result that is not an object
/// (a broken server) is wrapped as it is under `resultType`, never dropped silently.
pub fn complete_result(method: &str, legacy: Value, caching: Caching) -> Value {
    let mut out = match legacy {
        Value::Object(o) => o,
        _ => Map::new(),
    };
    out.insert("resultType".into(), Value::from("complete"));
    if CACHEABLE_METHODS.contains(&method) {
        caching.insert(&mut out);
    }
    Value::Object(out)
}

/// A legacy server's error as the 2026-07-28 error of `method`: the legacy
/// resource-not-found code `-32002` becomes `-32602` on `resources/read` (2026-07-28
/// `server/resources`, "Error Handling"); everything else passes unchanged.
pub fn modern_error(method: &str, mut error: ErrorObject) -> ErrorObject {
    if method == "resources/read" && error.code == ErrorCode::LEGACY_RESOURCE_NOT_FOUND {
        error.code = ErrorCode::INVALID_PARAMS;
    }
    error
}

/// A legacy server request, parked, as the 2026-07-28 input request the host sees:
/// `elicitation/create` loses the 2025-11-25 `elicitationId` (the modern revision has
/// none) and gets `mode: "form"` when a 2025-06-18 server sent none; the other
/// methods pass unchanged. Reserved `_meta` keys (`progressToken` lives there too) are
/// the legacy session's business and are removed.
pub fn input_request(method: &str, params: Option<&Value>) -> Value {
    let mut params = match params {
        Some(Value::Object(p)) => p.clone(),
        _ => Map::new(),
    };
    params.remove("_meta");
    if method == "elicitation/create" {
        params.remove("elicitationId");
        if !params.contains_key("mode") {
            params.insert("mode".into(), Value::from("form"));
        }
    }
    let mut out = Map::new();
    out.insert("method".into(), Value::from(method));
    if method != "roots/list" || !params.is_empty() {
        out.insert("params".into(), Value::Object(params));
    }
    Value::Object(out)
}

/// A host's answer to a parked server request, shaped for the server's revision: a
/// `CreateMessageResult` whose `content` is a one-block array (2025-11-25 and
/// 2026-07-28 allow arrays, for sampling with tools) becomes that block for a revision
/// without sampling tools, whose schema has a single content block. Everything else
/// passes unchanged.
pub fn input_response(revision: &Revision, method: &str, answer: Value) -> Value {
    if method != "sampling/createMessage" || revision.sampling_tools {
        return answer;
    }
    let Value::Object(mut answer) = answer else {
        return answer;
    };
    if let Some(Value::Array(blocks)) = answer.get_mut("content") {
        if blocks.len() == 1 {
            let block = blocks.remove(0);
            answer.insert("content".into(), block);
        }
    }
    Value::Object(answer)
}

/// The legacy error the bridge answers a server request with when the host did not
/// declare the capability it needs (2025-11-25 `client/roots` "Error Handling":
/// `-32601` when roots are not supported; `client/elicitation` "Error Handling":
/// `-32602` for a mode not declared; a method of a capability not declared at all is
/// not available: `-32601`).
pub fn unsupported_capability(method: &str, capability: &str) -> ErrorObject {
    let (code, message) = match (method, capability) {
        ("roots/list", _) => (ErrorCode::METHOD_NOT_FOUND, "Roots not supported"),
        ("sampling/createMessage", "sampling") => {
            (ErrorCode::METHOD_NOT_FOUND, "Sampling not supported")
        }
        ("sampling/createMessage", _) => (
            ErrorCode::INVALID_PARAMS,
            "Sampling with tools not supported",
        ),
        ("elicitation/create", "elicitation") => {
            (ErrorCode::METHOD_NOT_FOUND, "Elicitation not supported")
        }
        ("elicitation/create", _) => (ErrorCode::INVALID_PARAMS, "Elicitation mode not supported"),
        _ => (ErrorCode::METHOD_NOT_FOUND, "Method not found"),
    };
    ErrorObject::new(code, message).with_data(json!({
        "reason": format!("Client does not have {capability} capability"),
    }))
}

/// The params of a modern host request as a legacy request's: reserved `_meta` keys
/// removed (an empty `_meta` with them), `inputResponses` / `requestState` removed
/// (they belong to the modern round, not to the server's method), and the bridge's
/// own progress token set when the host asked for progress.
pub fn legacy_params(params: &Map<String, Value>, progress_token: Option<&Value>) -> Value {
    let mut out = params.clone();
    out.remove("inputResponses");
    out.remove("requestState");
    let mut meta = match out.remove("_meta") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    meta.retain(|k, _| !k.starts_with(RESERVED_META_PREFIX) && k != "progressToken");
    if let Some(token) = progress_token {
        meta.insert("progressToken".into(), token.clone());
    }
    if !meta.is_empty() {
        out.insert("_meta".into(), Value::Object(meta));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{v2024_11_05, v2025_11_25};

    #[test]
    fn host_capabilities_become_legacy() {
        let host = normalize_host_capabilities(
            &json!({"elicitation": {}, "sampling": {"tools": {}}, "roots": {}, "extensions": {"a.b/c": {}}, "bogus": 1}),
        );
        assert_eq!(
            host,
            json!({"elicitation": {"form": {}}, "sampling": {"tools": {}}, "roots": {}, "extensions": {"a.b/c": {}}})
        );
        assert_eq!(
            client_to_legacy(&host),
            json!({"elicitation": {"form": {}}, "sampling": {"tools": {}}, "roots": {}})
        );
    }

    #[test]
    fn server_capabilities_per_revision() {
        let caps = json!({"tools": {"listChanged": true, "x": 1}, "completions": {}, "tasks": {}, "logging": {}});
        assert_eq!(
            server_to_modern(&v2025_11_25::REVISION, &caps),
            json!({"tools": {"listChanged": true}, "completions": {}, "logging": {}})
        );
        assert_eq!(
            server_to_modern(&v2024_11_05::REVISION, &caps),
            json!({"tools": {"listChanged": true}, "logging": {}})
        );
    }

    #[test]
    fn results_and_errors() {
        let caching = Caching {
            ttl_ms: 5,
            public: false,
        };
        assert_eq!(
            complete_result("tools/list", json!({"tools": []}), caching),
            json!({"tools": [], "resultType": "complete", "ttlMs": 5, "cacheScope": "private"})
        );
        assert_eq!(
            complete_result("tools/call", json!({"content": []}), caching),
            json!({"content": [], "resultType": "complete"})
        );
        let e = modern_error(
            "resources/read",
            ErrorObject::new(ErrorCode::LEGACY_RESOURCE_NOT_FOUND, "gone"),
        );
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        let e = modern_error(
            "tools/call",
            ErrorObject::new(ErrorCode::LEGACY_RESOURCE_NOT_FOUND, "gone"),
        );
        assert_eq!(e.code, ErrorCode::LEGACY_RESOURCE_NOT_FOUND);
    }

    #[test]
    fn input_requests_and_params() {
        assert_eq!(
            input_request(
                "elicitation/create",
                Some(
                    &json!({"mode": "url", "url": "https://x", "message": "m", "elicitationId": "e1", "_meta": {"progressToken": 1}})
                )
            ),
            json!({"method": "elicitation/create", "params": {"mode": "url", "url": "https://x", "message": "m"}})
        );
        assert_eq!(
            input_request("elicitation/create", Some(&json!({"message": "m"}))),
            json!({"method": "elicitation/create", "params": {"message": "m", "mode": "form"}})
        );
        assert_eq!(
            input_request("roots/list", None),
            json!({"method": "roots/list"})
        );
        let params: Map<String, Value> = serde_json::from_value(json!({
            "name": "t", "inputResponses": {}, "requestState": "s",
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "progressToken": "h", "com.example/x": 1}
        }))
        .unwrap();
        assert_eq!(
            legacy_params(&params, Some(&json!("p1"))),
            json!({"name": "t", "_meta": {"com.example/x": 1, "progressToken": "p1"}})
        );
    }

    #[test]
    fn sampling_answers_fit_older_revisions() {
        use crate::v2025_06_18;
        let one =
            json!({"role": "assistant", "model": "m", "content": [{"type": "text", "text": "a"}]});
        assert_eq!(
            input_response(
                &v2025_06_18::REVISION,
                "sampling/createMessage",
                one.clone()
            ),
            json!({"role": "assistant", "model": "m", "content": {"type": "text", "text": "a"}})
        );
        assert_eq!(
            input_response(
                &v2025_11_25::REVISION,
                "sampling/createMessage",
                one.clone()
            ),
            one
        );
        assert_eq!(
            input_response(&v2025_06_18::REVISION, "roots/list", one.clone()),
            one
        );
    }

    #[test]
    fn unsupported_capabilities_use_the_client_pages_codes() {
        assert_eq!(
            unsupported_capability("roots/list", "roots").code,
            ErrorCode::METHOD_NOT_FOUND
        );
        assert_eq!(
            unsupported_capability("elicitation/create", "elicitation.url").code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            unsupported_capability("sampling/createMessage", "sampling").code,
            ErrorCode::METHOD_NOT_FOUND
        );
    }
}
