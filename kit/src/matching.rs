//! Matching observed JSON against a vector's expectations.
//!
//! The rules (`adapters/vectors/README.md`, "Matching"):
//!
//! - values compare exactly: objects by key set (order ignored), arrays in order,
//!   numbers by value (`1` equals `1.0`);
//! - a string `"$name"` is a placeholder: its first occurrence matches any string or
//!   number and binds it, later occurrences must equal the bound value;
//!   `"$name~REGEX"` also requires the first value to match `REGEX`; `"$_"` matches
//!   anything and binds nothing; `"$$x"` is the literal string `"$x"`;
//! - a key written `"name?"` marks a field the spec leaves to the implementation: a
//!   [`Mode::Strict`] match treats it as `"name"` (the vector's own implementation
//!   must produce exactly that), a [`Mode::Lenient`] match accepts any value or none.
//!
//! A failed match leaves the bindings untouched ([`Bindings::try_match`]).

use regex::Regex;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt;

/// How implementation-defined (`"name?"`) fields are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// As written: the implementation the vectors were recorded from.
    Strict,
    /// Any value, or none: any other implementation.
    Lenient,
}

/// Where and why a value did not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// JSON path of the first difference (`.result.capabilities`).
    pub path: String,
    /// What differs.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.detail)
        } else {
            write!(f, "at {}: {}", self.path, self.detail)
        }
    }
}

/// A placeholder used before anything bound it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("placeholder {0} is used before an output bound it")]
pub struct Unbound(pub String);

enum Token<'a> {
    Literal(&'a str),
    Any,
    Placeholder {
        name: &'a str,
        pattern: Option<&'a str>,
    },
}

fn token(s: &str) -> Token<'_> {
    if s.starts_with("$$") {
        return Token::Literal(&s[1..]);
    }
    let Some(body) = s.strip_prefix('$') else {
        return Token::Literal(s);
    };
    if body == "_" {
        return Token::Any;
    }
    let (name, pattern) = match body.split_once('~') {
        Some((n, p)) => (n, Some(p)),
        None => (body, None),
    };
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Token::Literal(s);
    }
    Token::Placeholder {
        name: &s[..=name.len()],
        pattern,
    }
}

/// Whether `key` marks an implementation-defined field (`"name?"`); returns the name.
pub fn optional_key(key: &str) -> Option<&str> {
    key.strip_suffix('?').filter(|k| !k.is_empty())
}

/// Placeholder values bound so far in one vector run.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    values: HashMap<String, Value>,
}

impl Bindings {
    /// The value bound to `name` (with its `$`).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.values.get(name)
    }

    /// Binds `name` (a runner binds batch streams this way).
    pub fn bind(&mut self, name: &str, value: Value) {
        self.values.insert(name.to_owned(), value);
    }

    /// Matches `actual` against `expected`; binds placeholders only if it matches.
    pub fn try_match(
        &mut self,
        expected: &Value,
        actual: &Value,
        mode: Mode,
    ) -> Result<(), Mismatch> {
        let mut trial = self.clone();
        trial.walk(expected, actual, mode, &mut String::new())?;
        *self = trial;
        Ok(())
    }

    /// Whether `actual` matches, without binding anything.
    pub fn matches(&self, expected: &Value, actual: &Value, mode: Mode) -> bool {
        self.clone()
            .walk(expected, actual, mode, &mut String::new())
            .is_ok()
    }

    fn walk(
        &mut self,
        expected: &Value,
        actual: &Value,
        mode: Mode,
        path: &mut String,
    ) -> Result<(), Mismatch> {
        let fail = |path: &str, detail: String| {
            Err(Mismatch {
                path: path.to_owned(),
                detail,
            })
        };
        match expected {
            Value::String(s) => match token(s) {
                Token::Any => Ok(()),
                Token::Literal(l) => {
                    if actual.as_str() == Some(l) {
                        Ok(())
                    } else {
                        fail(
                            path,
                            format!("expected {}, got {}", short(&Value::from(l)), short(actual)),
                        )
                    }
                }
                Token::Placeholder { name, pattern } => {
                    if let Some(bound) = self.values.get(name) {
                        return if json_eq(bound, actual) {
                            Ok(())
                        } else {
                            fail(
                                path,
                                format!(
                                    "expected {} (bound to {name}), got {}",
                                    short(bound),
                                    short(actual)
                                ),
                            )
                        };
                    }
                    let text = match actual {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        other => {
                            return fail(
                                path,
                                format!("{name} binds a string or number, got {}", short(other)),
                            )
                        }
                    };
                    if let Some(p) = pattern {
                        let re = Regex::new(p).map_err(|e| Mismatch {
                            path: path.clone(),
                            detail: format!("bad pattern in {s}: {e}"),
                        })?;
                        if !re.is_match(&text) {
                            return fail(
                                path,
                                format!("{} does not match {name}'s pattern /{p}/", short(actual)),
                            );
                        }
                    }
                    self.values.insert(name.to_owned(), actual.clone());
                    Ok(())
                }
            },
            Value::Object(e) => {
                let Value::Object(a) = actual else {
                    return fail(path, format!("expected an object, got {}", short(actual)));
                };
                self.walk_object(e, a, mode, path)
            }
            Value::Array(e) => {
                let Value::Array(a) = actual else {
                    return fail(path, format!("expected an array, got {}", short(actual)));
                };
                if e.len() != a.len() {
                    return fail(
                        path,
                        format!("expected {} elements, got {}", e.len(), a.len()),
                    );
                }
                for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    self.walk(ev, av, mode, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            other => {
                if json_eq(other, actual) {
                    Ok(())
                } else {
                    fail(
                        path,
                        format!("expected {}, got {}", short(other), short(actual)),
                    )
                }
            }
        }
    }

    fn walk_object(
        &mut self,
        e: &Map<String, Value>,
        a: &Map<String, Value>,
        mode: Mode,
        path: &mut String,
    ) -> Result<(), Mismatch> {
        for (k, ev) in e {
            let (key, optional) = match optional_key(k) {
                Some(base) => (base, true),
                None => (k.as_str(), false),
            };
            if optional && mode == Mode::Lenient {
                continue;
            }
            let len = path.len();
            path.push('.');
            path.push_str(key);
            match a.get(key) {
                Some(av) => self.walk(ev, av, mode, path)?,
                None => {
                    return Err(Mismatch {
                        path: path.clone(),
                        detail: "missing".into(),
                    })
                }
            }
            path.truncate(len);
        }
        for k in a.keys() {
            let known = e.contains_key(k) || e.contains_key(&format!("{k}?"));
            if !known {
                return Err(Mismatch {
                    path: format!("{path}.{k}"),
                    detail: format!("unexpected key (value {})", short(&a[k])),
                });
            }
        }
        Ok(())
    }

    /// Replaces bound placeholders in an input; `$$x` becomes `$x`.
    pub fn substitute(&self, value: &Value) -> Result<Value, Unbound> {
        Ok(match value {
            Value::String(s) => match token(s) {
                Token::Literal(l) => Value::String(l.to_owned()),
                Token::Any => return Err(Unbound(s.clone())),
                Token::Placeholder { name, .. } => self
                    .values
                    .get(name)
                    .cloned()
                    .ok_or_else(|| Unbound(name.to_owned()))?,
            },
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| self.substitute(v))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| Ok((k.clone(), self.substitute(v)?)))
                    .collect::<Result<_, Unbound>>()?,
            ),
            other => other.clone(),
        })
    }

    /// `expected` with bound placeholders filled in (for showing differences).
    pub fn render(&self, expected: &Value) -> Value {
        match expected {
            Value::String(s) => match token(s) {
                Token::Placeholder { name, .. } => self
                    .values
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| expected.clone()),
                _ => expected.clone(),
            },
            Value::Array(items) => Value::Array(items.iter().map(|v| self.render(v)).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), self.render(v))).collect())
            }
            other => other.clone(),
        }
    }
}

/// The placeholder names (with `$`) used anywhere in `value`.
pub fn placeholders(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => {
            if let Token::Placeholder { name, .. } = token(s) {
                if !out.iter().any(|n| n == name) {
                    out.push(name.to_owned());
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| placeholders(v, out)),
        Value::Object(o) => o.values().for_each(|v| placeholders(v, out)),
        _ => {}
    }
}

/// The placeholder a string is, if it is one (`"$up1"`, `"$sid~^[0-9a-f]+$"` → `$sid`).
pub fn placeholder_name(value: &Value) -> Option<&str> {
    match token(value.as_str()?) {
        Token::Placeholder { name, .. } => Some(name),
        _ => None,
    }
}

/// JSON equality with numbers compared by value.
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || match (x.as_i64(), y.as_i64()) {
                    (Some(i), Some(j)) => i == j,
                    _ => x.as_f64().zip(y.as_f64()).is_some_and(|(p, q)| p == q),
                }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// A value in one line, cut to a readable length.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        let cut: String = s.chars().take(117).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// A line diff of two JSON values, pretty-printed (`-` expected, `+` actual).
pub fn diff(expected: Option<&Value>, actual: Option<&Value>) -> String {
    let pretty = |v: Option<&Value>| {
        v.map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
            .unwrap_or_default()
    };
    let (e, a) = (pretty(expected), pretty(actual));
    let diff = similar::TextDiff::from_lines(&e, &a);
    let mut out = String::new();
    for op in diff.ops() {
        for change in diff.iter_changes(op) {
            let sign = match change.tag() {
                similar::ChangeTag::Delete => '-',
                similar::ChangeTag::Insert => '+',
                similar::ChangeTag::Equal => ' ',
            };
            out.push(sign);
            out.push_str(change.value().trim_end_matches('\n'));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_bind_then_follow() {
        let mut b = Bindings::default();
        b.try_match(&json!({"id": "$up1"}), &json!({"id": 7}), Mode::Strict)
            .unwrap();
        assert!(b
            .try_match(&json!({"id": "$up1"}), &json!({"id": 8}), Mode::Strict)
            .is_err());
        b.try_match(&json!({"id": "$up1"}), &json!({"id": 7.0}), Mode::Strict)
            .unwrap();
        assert_eq!(
            b.substitute(&json!(["$up1", "$$up1", "x"])).unwrap(),
            json!([7, "$up1", "x"])
        );
        assert_eq!(b.substitute(&json!("$nope")), Err(Unbound("$nope".into())));
    }

    #[test]
    fn failed_matches_bind_nothing() {
        let mut b = Bindings::default();
        assert!(b
            .try_match(
                &json!({"a": "$x", "b": 1}),
                &json!({"a": "v", "b": 2}),
                Mode::Strict
            )
            .is_err());
        assert!(b.get("$x").is_none());
    }

    #[test]
    fn placeholders_bind_ids_only_and_check_patterns() {
        let mut b = Bindings::default();
        assert!(b
            .try_match(&json!("$x"), &json!({"a": 1}), Mode::Strict)
            .is_err());
        assert!(b
            .try_match(&json!("$x"), &json!(null), Mode::Strict)
            .is_err());
        assert!(b
            .try_match(&json!("$sid~^[0-9a-f]{4}$"), &json!("12g4"), Mode::Strict)
            .is_err());
        b.try_match(&json!("$sid~^[0-9a-f]{4}$"), &json!("12f4"), Mode::Strict)
            .unwrap();
        b.try_match(&json!("$sid"), &json!("12f4"), Mode::Strict)
            .unwrap();
        b.try_match(&json!("$_"), &json!({"anything": [1]}), Mode::Strict)
            .unwrap();
    }

    #[test]
    fn optional_keys_depend_on_mode() {
        let e = json!({"code": -32600, "message?": "dualera's words"});
        let other = json!({"code": -32600, "message": "someone else's"});
        let none = json!({"code": -32600});
        let b = Bindings::default();
        assert!(b.matches(&e, &other, Mode::Lenient));
        assert!(b.matches(&e, &none, Mode::Lenient));
        assert!(!b.matches(&e, &other, Mode::Strict));
        assert!(!b.matches(&e, &none, Mode::Strict));
        assert!(b.matches(
            &e,
            &json!({"code": -32600, "message": "dualera's words"}),
            Mode::Strict
        ));
        assert!(!b.matches(&e, &json!({"code": -32601, "message": "x"}), Mode::Lenient));
    }

    #[test]
    fn objects_compare_key_sets() {
        let b = Bindings::default();
        let m = b
            .clone()
            .try_match(&json!({"a": 1}), &json!({"a": 1, "b": 2}), Mode::Strict);
        assert_eq!(m.unwrap_err().path, ".b");
        let m = b.clone().try_match(
            &json!({"a": {"c": [1, 2]}}),
            &json!({"a": {"c": [1, 3]}}),
            Mode::Strict,
        );
        assert_eq!(m.unwrap_err().path, ".a.c[1]");
    }

    #[test]
    fn diffs_show_both_sides() {
        let d = diff(Some(&json!({"a": 1})), Some(&json!({"a": 2})));
        assert!(d.contains("-  \"a\": 1"), "{d}");
        assert!(d.contains("+  \"a\": 2"), "{d}");
    }
}
