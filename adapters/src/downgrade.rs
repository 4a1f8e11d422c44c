//! Shaping modern messages for a legacy peer: removes what the peer's revision schema
//! lacks (`resultType`, `ttlMs`, `cacheScope`, the reserved `io.modelcontextprotocol/*`
//! `_meta` keys, and per-revision fields), so nothing modern-only leaks downstream.
//!
//! The rules, applied to every result the gateway hands a legacy peer:
//!
//! - always: `resultType`, `ttlMs`, `cacheScope` removed; `_meta` keys under
//!   `io.modelcontextprotocol/` removed (they are modern per-response protocol fields
//!   such as `serverInfo`), and `_meta` itself removed when that leaves it empty;
//! - `tools/call`: `structuredContent` removed where the revision lacks it (if that
//!   would leave no content at all, its JSON text becomes one `text` block, as the
//!   spec's backwards-compatibility advice says); content blocks downgraded;
//! - `tools/list`, `prompts/list`, `resources/list`, `resources/templates/list`:
//!   `title`, `icons`, `outputSchema`, `annotations`, `execution` removed per revision;
//! - `prompts/get`: each message's content block downgraded;
//! - content blocks: `resource_link` (before 2025-06-18) becomes a `text` block naming
//!   the link, `audio` (2024-11-05) becomes a `text` block saying audio was omitted.

use crate::revision::Revision;
use crate::Notification;
use serde_json::{Map, Value};

/// The prefix of `_meta` keys reserved for MCP protocol fields.
pub const RESERVED_META_PREFIX: &str = "io.modelcontextprotocol/";

/// Removes the reserved `io.modelcontextprotocol/*` keys from `obj["_meta"]`, and the
/// `_meta` object itself when that leaves it empty.
pub fn strip_reserved_meta(obj: &mut Map<String, Value>) {
    let now_empty = match obj.get_mut("_meta") {
        Some(Value::Object(meta)) => {
            meta.retain(|k, _| !k.starts_with(RESERVED_META_PREFIX));
            meta.is_empty()
        }
        _ => false,
    };
    if now_empty {
        obj.remove("_meta");
    }
}

/// Shapes an upstream `complete` result of `method` for a peer on `revision`.
pub fn result(revision: &Revision, method: &str, result: Value) -> Value {
    let Value::Object(mut obj) = result else {
        return result;
    };
    for key in ["resultType", "ttlMs", "cacheScope"] {
        obj.remove(key);
    }
    strip_reserved_meta(&mut obj);
    match method {
        "tools/call" => {
            if !revision.structured_content {
                if let Some(structured) = obj.remove("structuredContent") {
                    let no_content = obj
                        .get("content")
                        .and_then(Value::as_array)
                        .is_none_or(Vec::is_empty);
                    if no_content {
                        let text = serde_json::to_string(&structured).unwrap_or_default();
                        obj.insert(
                            "content".into(),
                            serde_json::json!([{ "type": "text", "text": text }]),
                        );
                    }
                }
            }
            if let Some(Value::Array(blocks)) = obj.get_mut("content") {
                for block in blocks.iter_mut() {
                    content_block(revision, block);
                }
            }
        }
        "tools/list" => items(revision, &mut obj, "tools", true),
        "prompts/list" => items(revision, &mut obj, "prompts", false),
        "resources/list" => items(revision, &mut obj, "resources", false),
        "resources/templates/list" => items(revision, &mut obj, "resourceTemplates", false),
        "prompts/get" => {
            if let Some(Value::Array(messages)) = obj.get_mut("messages") {
                for message in messages.iter_mut() {
                    if let Some(block) = message.get_mut("content") {
                        content_block(revision, block);
                    }
                }
            }
        }
        _ => {}
    }
    Value::Object(obj)
}

fn items(revision: &Revision, obj: &mut Map<String, Value>, list: &str, tools: bool) {
    let Some(Value::Array(entries)) = obj.get_mut(list) else {
        return;
    };
    for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
        if !revision.titles {
            entry.remove("title");
        }
        if !revision.icons {
            entry.remove("icons");
        }
        if tools {
            if !revision.structured_content {
                entry.remove("outputSchema");
            }
            if !revision.tool_annotations {
                entry.remove("annotations");
            }
            // `Tool.execution` exists in 2025-11-25 only (tasks): the session machine
            // puts `taskSupport` back for a session it offers tasks to.
            entry.remove("execution");
        }
    }
}

/// Downgrades one content block in place for `revision`.
pub fn content_block(revision: &Revision, block: &mut Value) {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let replacement = match kind {
        "resource_link" if !revision.resource_links => {
            let uri = block.get("uri").and_then(Value::as_str).unwrap_or("");
            let name = block.get("name").and_then(Value::as_str).unwrap_or(uri);
            Some(format!("Resource link: {name} <{uri}>"))
        }
        "audio" if !revision.audio => {
            let mime = block
                .get("mimeType")
                .and_then(Value::as_str)
                .unwrap_or("audio");
            Some(format!(
                "[{mime} content omitted: not supported by protocol {}]",
                revision.version
            ))
        }
        _ => None,
    };
    if let Some(text) = replacement {
        *block = serde_json::json!({ "type": "text", "text": text });
    }
}

/// Keeps only the `Implementation` (`serverInfo`) fields `revision` has.
pub fn implementation(revision: &Revision, info: &Value) -> Value {
    let mut out = Map::new();
    if let Some(obj) = info.as_object() {
        for field in revision.implementation_fields {
            if let Some(v) = obj.get(*field) {
                out.insert((*field).to_owned(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Shapes an upstream notification for a peer on `revision`: reserved `_meta` keys
/// removed, and the progress `message` dropped where the revision lacks it.
pub fn notification(revision: &Revision, mut notification: Notification) -> Notification {
    if let Some(Value::Object(params)) = notification.params.as_mut() {
        strip_reserved_meta(params);
        if notification.method == "notifications/progress" && !revision.progress_message {
            params.remove("message");
        }
    }
    notification
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{v2024_11_05, v2025_03_26, v2025_06_18, v2025_11_25};
    use serde_json::json;

    #[test]
    fn strips_modern_fields() {
        let r = json!({"resultType": "complete", "tools": [{"name": "a", "title": "A", "icons": [], "outputSchema": {}, "annotations": {}}],
            "ttlMs": 5, "cacheScope": "public", "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x"}}});
        assert_eq!(
            result(&v2025_11_25::REVISION, "tools/list", r.clone()),
            json!({"tools": [{"name": "a", "title": "A", "icons": [], "outputSchema": {}, "annotations": {}}]})
        );
        assert_eq!(
            result(&v2025_06_18::REVISION, "tools/list", r.clone()),
            json!({"tools": [{"name": "a", "title": "A", "outputSchema": {}, "annotations": {}}]})
        );
        assert_eq!(
            result(&v2024_11_05::REVISION, "tools/list", r),
            json!({"tools": [{"name": "a"}]})
        );
    }

    #[test]
    fn tool_results() {
        let r = json!({"resultType": "complete", "content": [], "structuredContent": {"n": 1}, "_meta": {"k": 1}});
        assert_eq!(
            result(&v2025_03_26::REVISION, "tools/call", r.clone()),
            json!({"content": [{"type": "text", "text": "{\"n\":1}"}], "_meta": {"k": 1}})
        );
        assert_eq!(
            result(&v2025_06_18::REVISION, "tools/call", r),
            json!({"content": [], "structuredContent": {"n": 1}, "_meta": {"k": 1}})
        );
        let link = json!({"content": [{"type": "resource_link", "uri": "file:///a", "name": "a"}, {"type": "audio", "data": "", "mimeType": "audio/wav"}]});
        assert_eq!(
            result(&v2024_11_05::REVISION, "tools/call", link),
            json!({"content": [{"type": "text", "text": "Resource link: a <file:///a>"},
                {"type": "text", "text": "[audio/wav content omitted: not supported by protocol 2024-11-05]"}]})
        );
    }
}
