//! Capability mapping between eras: a legacy peer's `initialize` capabilities become the
//! modern `clientCapabilities` sent on every upstream request, the upstream's discovered
//! capabilities become the legacy `initialize` result, and each MRTR input request is
//! checked against what the peer declared.

use crate::revision::{ElicitationSupport, Revision};
use serde_json::{json, Map, Value};

fn empty() -> Value {
    Value::Object(Map::new())
}

fn object_or_empty(value: Option<&Value>) -> Value {
    match value {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        _ => empty(),
    }
}

/// Maps a legacy peer's declared `capabilities` to the modern `ClientCapabilities`.
///
/// - `elicitation` (2025-11-25): `{}` means form only and becomes `{"form":{}}`; `form`
///   and `url` are kept. (2025-06-18): any `elicitation` object means form only.
///   Older revisions have no elicitation, so it is dropped.
/// - `sampling`: kept; its `context` / `tools` sub-capabilities only on 2025-11-25.
/// - `roots`: kept as `{}` (the modern object has no `listChanged`).
/// - `experimental`: kept. `tasks` (2025-11-25) is dropped here: the session declares
///   the modern tasks extension only on the requests of its tasks (see
///   [`crate::tasks`]).
pub fn client_to_modern(revision: &Revision, legacy: &Value) -> Value {
    let mut out = Map::new();
    let Some(legacy) = legacy.as_object() else {
        return Value::Object(out);
    };
    if let Some(elicitation) = legacy.get("elicitation").and_then(Value::as_object) {
        match revision.elicitation {
            ElicitationSupport::None => {}
            ElicitationSupport::FormWithoutMode => {
                out.insert("elicitation".into(), json!({ "form": {} }));
            }
            ElicitationSupport::FormAndUrl => {
                let mut modes = Map::new();
                if elicitation.contains_key("form") {
                    modes.insert("form".into(), object_or_empty(elicitation.get("form")));
                }
                if elicitation.contains_key("url") {
                    modes.insert("url".into(), object_or_empty(elicitation.get("url")));
                }
                if modes.is_empty() {
                    modes.insert("form".into(), empty());
                }
                out.insert("elicitation".into(), Value::Object(modes));
            }
        }
    }
    if let Some(sampling) = legacy.get("sampling").and_then(Value::as_object) {
        let mut sub = Map::new();
        if revision.sampling_tools {
            for key in ["context", "tools"] {
                if sampling.contains_key(key) {
                    sub.insert(key.into(), object_or_empty(sampling.get(key)));
                }
            }
        }
        out.insert("sampling".into(), Value::Object(sub));
    }
    if legacy.get("roots").is_some_and(Value::is_object) {
        out.insert("roots".into(), empty());
    }
    if let Some(experimental @ Value::Object(_)) = legacy.get("experimental") {
        out.insert("experimental".into(), experimental.clone());
    }
    Value::Object(out)
}

/// Maps the upstream's modern `ServerCapabilities` (from `server/discover`) to what a
/// legacy revision's `initialize` result may carry.
///
/// Kept: `prompts` / `tools` (`listChanged`), `resources` (`subscribe`, `listChanged`),
/// `logging`, `experimental`, and `completions` where the revision has it. Dropped:
/// `extensions` (modern only) and anything else the legacy schemas lack.
pub fn server_to_legacy(revision: &Revision, modern: &Value) -> Value {
    server_shared(revision, modern)
}

/// The members of `ServerCapabilities` both eras share, kept as they are:
/// `prompts`, `resources`, `tools` with their boolean flags, `logging`,
/// `completions` where `revision` has it, and `experimental`. Everything else —
/// `extensions` (modern only), `tasks` (legacy only), unknown members — is dropped.
/// Both directions of the bridge translate server capabilities through it.
pub fn server_shared(revision: &Revision, capabilities: &Value) -> Value {
    let mut out = Map::new();
    let Some(caps) = capabilities.as_object() else {
        return Value::Object(out);
    };
    let keep_flags = |value: &Value, flags: &[&str]| -> Value {
        let mut m = Map::new();
        if let Some(o) = value.as_object() {
            for flag in flags {
                if let Some(b @ Value::Bool(_)) = o.get(*flag) {
                    m.insert((*flag).into(), b.clone());
                }
            }
        }
        Value::Object(m)
    };
    if let Some(v) = caps.get("prompts").filter(|v| v.is_object()) {
        out.insert("prompts".into(), keep_flags(v, &["listChanged"]));
    }
    if let Some(v) = caps.get("resources").filter(|v| v.is_object()) {
        out.insert(
            "resources".into(),
            keep_flags(v, &["subscribe", "listChanged"]),
        );
    }
    if let Some(v) = caps.get("tools").filter(|v| v.is_object()) {
        out.insert("tools".into(), keep_flags(v, &["listChanged"]));
    }
    if caps.get("logging").is_some_and(Value::is_object) {
        out.insert("logging".into(), empty());
    }
    if revision.completions && caps.get("completions").is_some_and(Value::is_object) {
        out.insert("completions".into(), empty());
    }
    if let Some(experimental @ Value::Object(_)) = caps.get("experimental") {
        out.insert("experimental".into(), experimental.clone());
    }
    Value::Object(out)
}

/// A capability an input request needs that the peer did not declare.
#[derive(Debug, Clone, PartialEq)]
pub struct MissingCapability {
    /// The `inputRequests` key of the request that needs it.
    pub input_key: String,
    /// The method of that input request.
    pub method: String,
    /// The capability as a dotted path, e.g. `elicitation.url`.
    pub capability: &'static str,
}

impl MissingCapability {
    /// The capability as a modern `requiredCapabilities` fragment, e.g.
    /// `{"elicitation":{"url":{}}}`.
    pub fn as_required(&self) -> Value {
        required_fragment(self.capability)
    }
}

fn required_fragment(path: &str) -> Value {
    path.rsplit('.')
        .fold(empty(), |inner, segment| json!({ segment: inner }))
}

/// Merges several `requiredCapabilities` fragments into one object.
pub fn merge_required(missing: &[MissingCapability]) -> Value {
    fn merge(into: &mut Map<String, Value>, from: &Value) {
        if let Some(from) = from.as_object() {
            for (k, v) in from {
                let slot = into.entry(k.clone()).or_insert_with(empty);
                if let Value::Object(slot) = slot {
                    merge(slot, v);
                }
            }
        }
    }
    let mut out = Map::new();
    for m in missing {
        merge(&mut out, &m.as_required());
    }
    Value::Object(out)
}

/// The outcome of [`check_input_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputCheck {
    /// The peer declared what the input request needs.
    Covered,
    /// The peer did not declare this capability (a dotted path such as `elicitation.url`).
    Missing(&'static str),
    /// The method is not one MRTR may ask for (`elicitation/create`,
    /// `sampling/createMessage`, `roots/list`).
    NotAnInputRequest,
}

impl InputCheck {
    fn need(missing: bool, capability: &'static str) -> Self {
        if missing {
            Self::Missing(capability)
        } else {
            Self::Covered
        }
    }
}

/// What an input request needs from the peer, checked against the session's modern
/// client capabilities (already narrowed to what the peer's revision can express by
/// [`client_to_modern`]).
///
pub fn check_input_request(
    modern_client: &Value,
    method: &str,
    params: &Map<String, Value>,
) -> InputCheck {
    let has = |path: &[&str]| -> bool {
        let mut at = modern_client;
        for segment in path {
            match at.get(*segment) {
                Some(v) => at = v,
                None => return false,
            }
        }
        at.is_object()
    };
    match method {
        "elicitation/create" => {
            if params.get("mode").and_then(Value::as_str) == Some("url") {
                InputCheck::need(!has(&["elicitation", "url"]), "elicitation.url")
            } else {
                InputCheck::need(!has(&["elicitation", "form"]), "elicitation.form")
            }
        }
        "sampling/createMessage" => {
            if !has(&["sampling"]) {
                InputCheck::Missing("sampling")
            } else {
                let wants_tools = params.contains_key("tools") || params.contains_key("toolChoice");
                InputCheck::need(
                    wants_tools && !has(&["sampling", "tools"]),
                    "sampling.tools",
                )
            }
        }
        "roots/list" => InputCheck::need(!has(&["roots"]), "roots"),
        _ => InputCheck::NotAnInputRequest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{v2024_11_05, v2025_03_26, v2025_06_18, v2025_11_25};

    #[test]
    fn client_mapping_per_revision() {
        let caps = json!({"elicitation": {}, "sampling": {"tools": {}}, "roots": {"listChanged": true}, "tasks": {}});
        assert_eq!(
            client_to_modern(&v2025_11_25::REVISION, &caps),
            json!({"elicitation": {"form": {}}, "sampling": {"tools": {}}, "roots": {}})
        );
        assert_eq!(
            client_to_modern(&v2025_06_18::REVISION, &json!({"elicitation": {"url": {}}})),
            json!({"elicitation": {"form": {}}})
        );
        assert_eq!(
            client_to_modern(&v2025_03_26::REVISION, &caps),
            json!({"sampling": {}, "roots": {}})
        );
        assert_eq!(
            client_to_modern(&v2025_11_25::REVISION, &json!({"elicitation": {"url": {}}})),
            json!({"elicitation": {"url": {}}})
        );
    }

    #[test]
    fn server_mapping_per_revision() {
        let caps = json!({"tools": {"listChanged": true}, "completions": {}, "extensions": {"x.y/z": {}}, "resources": {"subscribe": true, "other": 1}});
        assert_eq!(
            server_to_legacy(&v2025_03_26::REVISION, &caps),
            json!({"tools": {"listChanged": true}, "completions": {}, "resources": {"subscribe": true}})
        );
        assert_eq!(
            server_to_legacy(&v2024_11_05::REVISION, &caps),
            json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}})
        );
    }

    #[test]
    fn input_checks() {
        let caps = json!({"elicitation": {"form": {}}, "sampling": {}});
        let url: Map<String, Value> = serde_json::from_value(json!({"mode": "url"})).unwrap();
        let tools: Map<String, Value> = serde_json::from_value(json!({"tools": []})).unwrap();
        let none = Map::new();
        assert_eq!(
            check_input_request(&caps, "elicitation/create", &url),
            InputCheck::Missing("elicitation.url")
        );
        assert_eq!(
            check_input_request(&caps, "elicitation/create", &none),
            InputCheck::Covered
        );
        assert_eq!(
            check_input_request(&caps, "sampling/createMessage", &tools),
            InputCheck::Missing("sampling.tools")
        );
        assert_eq!(
            check_input_request(&caps, "roots/list", &none),
            InputCheck::Missing("roots")
        );
        assert_eq!(
            check_input_request(&caps, "tools/call", &none),
            InputCheck::NotAnInputRequest
        );
        let missing = [
            MissingCapability {
                input_key: "a".into(),
                method: "elicitation/create".into(),
                capability: "elicitation.url",
            },
            MissingCapability {
                input_key: "b".into(),
                method: "roots/list".into(),
                capability: "roots",
            },
        ];
        assert_eq!(
            merge_required(&missing),
            json!({"elicitation": {"url": {}}, "roots": {}})
        );
    }
}
