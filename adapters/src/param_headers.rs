//! `x-mcp-header` (2026-07-28): tool parameters a client mirrors into `Mcp-Param-{Name}`
//! HTTP headers. The gateway is the upstream's client, so it must reject tool
//! definitions whose annotations break the rules and mirror the values of valid ones
//! (Streamable HTTP transport, "Custom Headers from Tool Parameters"; tools page,
//! "x-mcp-header").

use serde_json::{Map, Value};

/// One annotated parameter of a tool: the header's name part and where its value
/// lives in the call's `arguments` (a chain of `properties` keys).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParamHeader {
    /// The `{Name}` of `Mcp-Param-{Name}`, as the tool declared it.
    pub name: String,
    /// The property path from the arguments' root.
    pub path: Vec<String>,
}

impl ParamHeader {
    /// The parameter's value in a call's `arguments`: `None` when absent or `null`
    /// (then no header is sent, and none may be).
    pub fn value_in<'a>(&self, arguments: &'a Map<String, Value>) -> Option<&'a Value> {
        let (first, rest) = self.path.split_first()?;
        let mut v = arguments.get(first)?;
        for step in rest {
            v = v.as_object()?.get(step)?;
        }
        (!v.is_null()).then_some(v)
    }
}

/// Largest integer a header may carry: IEEE 754 doubles are exact up to 2^53 − 1.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// The annotated parameters of a tool's `inputSchema`, or why the definition must be
/// rejected (a client then leaves the tool out of `tools/list`).
pub fn tool_param_headers(input_schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(input_schema, &mut path, &mut out)?;
    Ok(out)
}

/// Follows `properties` chains from the root; an annotation anywhere else is an error.
fn walk(schema: &Value, path: &mut Vec<String>, out: &mut Vec<ParamHeader>) -> Result<(), String> {
    let Some(obj) = schema.as_object() else {
        return Ok(());
    };
    if let Some(name) = obj.get("x-mcp-header") {
        if path.is_empty() {
            return Err("x-mcp-header on the schema root".into());
        }
        let where_ = path.join(".");
        let Some(name) = name.as_str() else {
            return Err(format!("x-mcp-header of `{where_}` is not a string"));
        };
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!(
                "x-mcp-header {name:?} of `{where_}` is not an HTTP field-name token"
            ));
        }
        if out.iter().any(|h| h.name.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "x-mcp-header {name:?} is used twice (case-insensitively)"
            ));
        }
        match obj.get("type").and_then(Value::as_str) {
            Some("string" | "integer" | "boolean") => {}
            other => {
                return Err(format!(
                    "x-mcp-header {name:?} is on `{where_}` of type {}; only string, integer and boolean are allowed",
                    other.map_or_else(|| "unspecified".to_owned(), |t| format!("{t:?}"))
                ))
            }
        }
        out.push(ParamHeader {
            name: name.to_owned(),
            path: path.clone(),
        });
    }
    for (key, value) in obj {
        match key.as_str() {
            "x-mcp-header" => {}
            "properties" => {
                let Some(props) = value.as_object() else {
                    continue;
                };
                for (prop, sub) in props {
                    path.push(prop.clone());
                    let r = walk(sub, path, out);
                    path.pop();
                    r?;
                }
            }
            _ => {
                if let Some(bad) = annotated_elsewhere(key, value) {
                    let at = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{}.{key}", path.join("."))
                    };
                    return Err(format!(
                        "x-mcp-header {bad:?} under `{at}` is not statically reachable (only chains of `properties` are)"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Any annotation inside the value of schema keyword `key` (items, composition,
/// conditionals, `$defs`, …). Keywords whose values are data, not schemas, are skipped.
fn annotated_elsewhere(key: &str, value: &Value) -> Option<String> {
    if matches!(key, "enum" | "const" | "default" | "examples" | "required") {
        return None;
    }
    match value {
        Value::Object(obj) => {
            if let Some(name) = obj.get("x-mcp-header") {
                return Some(name.as_str().unwrap_or("?").to_owned());
            }
            obj.iter().find_map(|(k, v)| annotated_elsewhere(k, v))
        }
        Value::Array(items) => items.iter().find_map(|v| annotated_elsewhere("", v)),
        _ => None,
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The `(header name, plain value)` pairs a `tools/call` with these `arguments` must
/// carry. A parameter that is absent or `null` gets no header; a value that is not a
/// string, a boolean or a safe integer is left for the server to refuse. The values are
/// not yet encoded for HTTP (see the transport's Value Encoding).
pub fn mirror(headers: &[ParamHeader], arguments: Option<&Value>) -> Vec<(String, String)> {
    let Some(arguments) = arguments.and_then(Value::as_object) else {
        return Vec::new();
    };
    headers
        .iter()
        .filter_map(|h| {
            let text = match h.value_in(arguments)? {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => {
                    let i = n.as_i64()?;
                    if !(-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i) {
                        return None;
                    }
                    i.to_string()
                }
                _ => return None,
            };
            Some((format!("Mcp-Param-{}", h.name), text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(schema: Value) -> Result<Vec<(String, String)>, String> {
        tool_param_headers(&schema)
            .map(|v| v.into_iter().map(|h| (h.name, h.path.join("."))).collect())
    }

    #[test]
    fn finds_annotations_on_properties_chains() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"},
            "opts": {"type": "object", "properties": {
                "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"}}},
            "x-mcp-header": {"type": "integer"}
        }, "required": ["region"], "enum": [{"x-mcp-header": "data"}]});
        let mut got = names(schema).unwrap();
        got.sort();
        assert_eq!(
            got,
            [
                ("Dry-Run".to_owned(), "opts.dry".to_owned()),
                ("Region".to_owned(), "region".to_owned())
            ]
        );
        assert_eq!(names(json!({"type": "object"})).unwrap(), []);
    }

    #[test]
    fn rejects_what_the_spec_forbids() {
        for (schema, why) in [
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": ""}}}),
                "token",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "A B"}}}),
                "token",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "A\r\nX: y"}}}),
                "token",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": 7}}}),
                "not a string",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "number", "x-mcp-header": "A"}}}),
                "type",
            ),
            (
                json!({"type": "object", "properties": {"a": {"x-mcp-header": "A"}}}),
                "unspecified",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "object", "x-mcp-header": "A"}}}),
                "type",
            ),
            (
                json!({"type": "object", "properties": {
                "a": {"type": "string", "x-mcp-header": "Key"},
                "b": {"type": "string", "x-mcp-header": "key"}}}),
                "twice",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array",
                "items": {"type": "string", "x-mcp-header": "A"}}}}),
                "statically",
            ),
            (
                json!({"type": "object", "oneOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
                "statically",
            ),
            (
                json!({"type": "object", "$defs": {"d": {"type": "string", "x-mcp-header": "A"}},
                "properties": {"a": {"$ref": "#/$defs/d"}}}),
                "statically",
            ),
            (
                json!({"type": "object", "if": {"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}}),
                "statically",
            ),
            (json!({"type": "string", "x-mcp-header": "Root"}), "root"),
        ] {
            let err = names(schema.clone()).expect_err(&schema.to_string());
            assert!(err.contains(why), "{schema}: {err}");
        }
    }

    #[test]
    fn mirrors_present_primitive_values() {
        let specs = tool_param_headers(&json!({"type": "object", "properties": {
            "s": {"type": "string", "x-mcp-header": "S"},
            "i": {"type": "integer", "x-mcp-header": "I"},
            "b": {"type": "boolean", "x-mcp-header": "B"},
            "n": {"type": "string", "x-mcp-header": "N"},
            "missing": {"type": "string", "x-mcp-header": "M"},
            "big": {"type": "integer", "x-mcp-header": "Big"},
            "o": {"type": "object", "properties": {"deep": {"type": "integer", "x-mcp-header": "Deep"}}}
        }}))
        .unwrap();
        let args = json!({"s": "us-west1", "i": -7, "b": false, "n": null,
                          "big": 9_007_199_254_740_992_i64, "o": {"deep": 42}});
        let mut got = mirror(&specs, Some(&args));
        got.sort();
        assert_eq!(
            got,
            [
                ("Mcp-Param-B".to_owned(), "false".to_owned()),
                ("Mcp-Param-Deep".to_owned(), "42".to_owned()),
                ("Mcp-Param-I".to_owned(), "-7".to_owned()),
                ("Mcp-Param-S".to_owned(), "us-west1".to_owned()),
            ]
        );
        assert!(mirror(&specs, None).is_empty());
    }
}
