//! JSON text to `serde_json::Value`, refusing duplicate member names.
//!
//! RFC 8259 §4 says names within an object SHOULD be unique and that receivers disagree
//! on what duplicates mean; I-JSON (RFC 7493 §2.3) says they MUST NOT occur. serde_json
//! keeps the last value, while an audit layer or another parser may keep the first: for
//! `{"action":"decline","action":"accept"}` one reads a refusal and the other consent.
//! Every message either program parses goes through [`parse`], which refuses such
//! text instead of picking a winner. The way back, values to compact text as
//! serde_json writes it, is [`write`].

pub mod write;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

/// Why bytes are not acceptable JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON at all.
    Syntax {
        /// What the JSON parser said.
        detail: String,
    },
    /// An object repeats a member name.
    DuplicateMember {
        /// The repeated name.
        name: String,
        /// How deep the object is: `0` for the top-level object.
        depth: usize,
    },
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { detail } => f.write_str(detail),
            Self::DuplicateMember { name, .. } => write!(
                f,
                "duplicate member name {} (object member names must be unique: RFC 8259 §4, I-JSON RFC 7493 §2.3)",
                crate::echo::echo_quoted(name)
            ),
        }
    }
}

impl std::error::Error for JsonError {}

/// Parses JSON text; duplicate member names anywhere are an error.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonError> {
    parse_lenient(bytes).and_then(|(value, dup)| match dup {
        Some(e) => Err(e),
        None => Ok(value),
    })
}

/// Parses JSON text and reports the first duplicate member name beside the value
/// (which keeps the first of the duplicates), so a caller can still read, say, a
/// top-level id for its error response.
pub fn parse_lenient(bytes: &[u8]) -> Result<(Value, Option<JsonError>), JsonError> {
    // Text checked once as a whole is read without checking each string again, as
    // the byte reader does string by string (about 3 % of a plain legacy call's
    // instructions). Bytes that are not UTF-8 go through the byte reader, whose error
    // says where.
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_with(serde_json::Deserializer::from_str(text)),
        Err(_) => parse_with(serde_json::Deserializer::from_slice(bytes)),
    }
}

fn parse_with<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
) -> Result<(Value, Option<JsonError>), JsonError> {
    let dup = RefCell::new(None);
    let value = Seed {
        dup: &dup,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(|e| JsonError::Syntax {
        detail: e.to_string(),
    })?;
    Ok((value, dup.into_inner()))
}

#[derive(Clone, Copy)]
struct Seed<'a> {
    dup: &'a RefCell<Option<JsonError>>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = Seed {
            dup: self.dup,
            depth: self.depth + 1,
        };
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element_seed(inner)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = Seed {
            dup: self.dup,
            depth: self.depth + 1,
        };
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(inner)?;
            // One lookup per member: the first of duplicates is kept.
            match members.entry(name) {
                serde_json::map::Entry::Vacant(e) => {
                    e.insert(value);
                }
                serde_json::map::Entry::Occupied(e) => {
                    let mut dup = self.dup.borrow_mut();
                    if dup.is_none() {
                        *dup = Some(JsonError::DuplicateMember {
                            name: e.key().clone(),
                            depth: self.depth,
                        });
                    }
                }
            }
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Any JSON value: strings with control characters, quotes, backslashes and
    /// non-ASCII text (the escapes that make text longer than its bytes), integers and
    /// floats of every size, nested arrays and objects.
    fn any_value() -> impl Strategy<Value = Value> {
        values(
            "[\\x00-\\x1f\"\\\\a-zé😀]{0,12}",
            "[\\x00-\\x1f\"a-zé]{0,6}",
        )
    }

    /// JSON values whose strings match `text` and whose member names match `names`
    /// (regular expressions), with integers and floats of every size, nested arrays
    /// and objects.
    pub(in crate::json) fn values(
        text: &'static str,
        names: &'static str,
    ) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text.prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((names, inner), 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_length_bound_is_never_below_the_written_length(v in any_value()) {
            let text = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(written_len(&v), text.len());
            prop_assert!(encoded_len_bound(&v) >= text.len(), "{} < {}", encoded_len_bound(&v), text.len());
            if let Value::Object(m) = &v {
                prop_assert_eq!(object_len_bound(m), encoded_len_bound(&v));
            }
        }
    }

    proptest! {
        #[test]
        fn text_reads_as_serde_json_reads_its_bytes(v in any_value()) {
            // (Not `v` itself: serde_json's default float parsing is not exact.)
            let text = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(parse(&text).unwrap(), serde_json::from_slice::<Value>(&text).unwrap());
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused_where_they_are() {
        // Read as bytes, not as text: the error is serde_json's, with its position.
        let bytes = b"{\"a\":\"ok\",\"b\":\"\xff\"}";
        let Err(JsonError::Syntax { detail }) = parse(bytes) else {
            panic!("parsed")
        };
        let expected = serde_json::from_slice::<Value>(bytes).unwrap_err();
        assert_eq!(detail, expected.to_string());
        assert!(detail.ends_with("at line 1 column 16"), "{detail}");
        // Text read as `&str` still has its duplicate members found, at any depth.
        assert!(matches!(
            parse(r#"{"é":1,"b":{"c":1,"c":2}}"#.as_bytes()),
            Err(JsonError::DuplicateMember { name, depth: 1 }) if name == "c"
        ));
    }

    #[test]
    fn the_length_bound_is_tight_for_the_longest_escapes() {
        let v = json!({"\u{1}": ["\u{1f}", null, false], "": {}});
        assert_eq!(written_len(&v), 38);
        // One comma too many for the array and one for the object.
        assert_eq!(encoded_len_bound(&v), 40);
    }

    #[test]
    fn canonical_text_ignores_member_order() {
        let a: Value =
            serde_json::from_str(r#"{"b":[{"y":1,"x":"\u00e9"}],"a":null,"é":2}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"é":2,"a":null,"b":[{"x":"é","y":1}]}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":null,"b":[{"x":"é","y":1}],"é":2}"#);
        let Value::Object(o) = &a else { unreachable!() };
        assert_eq!(canonical_filtered(o, |k| k != "b"), r#"{"a":null,"é":2}"#);
    }

    #[test]
    fn same_values_as_serde_json() {
        for raw in [
            r#"{"a":[1,-2,3.5,1e300,"x\u00e9",null,true,{"b":{}}],"c":18446744073709551615}"#,
            "[]",
            "\"s\"",
            "  7 ",
        ] {
            let ours = parse(raw.as_bytes()).unwrap();
            let theirs: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(ours, theirs, "{raw}");
        }
    }

    #[test]
    fn refuses_duplicates_at_any_depth() {
        let e = parse(br#"{"action":"decline","action":"accept"}"#).unwrap_err();
        assert_eq!(
            e,
            JsonError::DuplicateMember {
                name: "action".into(),
                depth: 0
            }
        );
        let (v, dup) =
            parse_lenient(br#"{"id":3,"params":{"content":{"confirm":false,"confirm":true}}}"#)
                .unwrap();
        assert_eq!(v["id"], json!(3));
        assert!(matches!(
            dup,
            Some(JsonError::DuplicateMember { depth: 2, .. })
        ));
        assert!(matches!(
            parse(b"[{\"a\":1,\"a\":1}]"),
            Err(JsonError::DuplicateMember { .. })
        ));
        assert!(matches!(
            parse(b"{\"a\":1} x"),
            Err(JsonError::Syntax { .. })
        ));
        assert!(matches!(parse(b"{"), Err(JsonError::Syntax { .. })));
    }
}

/// A string deserialized borrowed from its input where the format allows (a binary
/// format always; JSON when the string has no escapes), else owned: for readers that
/// only look at a string (a cache key's member names, a snapshot's retired ids) and
/// would otherwise allocate each one.
#[derive(Debug, Default)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Str<'_> {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Borrowing;
        impl<'de> Visitor<'de> for Borrowing {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        deserializer.deserialize_str(Borrowing).map(Str)
    }
}

/// A JSON value a long-lived object keeps as its compact text, parsed again where it is
/// read.
///
/// A legacy session holds its peer's `clientInfo` and mapped capabilities for its
/// whole life and reads them once per upstream request. As `Value` trees they cost a
/// B-tree node per object (over 600 bytes each, most of an idle session); as text, a
/// few dozen bytes, for a parse of a small object per read. Serialized as JSON, it is
/// the value itself, unchanged on the wire; in a binary format (the shared store's
/// snapshot), the text as a string.
#[derive(Clone)]
pub struct JsonText(Box<serde_json::value::RawValue>);

impl serde::Serialize for JsonText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serde::Serialize::serialize(&self.0, serializer)
        } else {
            // A `RawValue` is a token only serde_json understands.
            serializer.serialize_str(self.0.get())
        }
    }
}

impl<'de> serde::Deserialize<'de> for JsonText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            return Box::<serde_json::value::RawValue>::deserialize(deserializer).map(Self);
        }
        let text = String::deserialize(deserializer)?;
        serde_json::value::RawValue::from_string(text)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonText {
    /// The compact text of `value`.
    pub fn new(value: &Value) -> Self {
        // A `Value` always serializes (its map keys are strings): the fallback is never
        // taken.
        serde_json::value::to_raw_value(value)
            .map_or_else(|_| Self(serde_json::value::RawValue::NULL.to_owned()), Self)
    }

    /// The value, parsed from the text (valid JSON: it was written from a `Value` or
    /// read by serde_json).
    pub fn value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl Default for JsonText {
    /// An empty object.
    fn default() -> Self {
        Self::new(&Value::Object(Map::new()))
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

/// Canonical JSON text of `value`: object members sorted by name (byte order of the
/// UTF-8 names), no whitespace, strings escaped and numbers written as serde_json
/// writes them. Equal values give equal text whatever order their members came in,
/// and whatever map type serde_json was built with (`preserve_order` keeps insertion
/// order, so its own serializer is not canonical). The digests of arguments that sealed
/// states bind (the modern server's `requestState`, the reverse bridge's round state)
/// are taken over this text.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            write_members(members, out);
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        Value::String(text) => write::string(out, text),
        other => out.push_str(&other.to_string()),
    }
}

/// Writes an object of `members`, in the order given.
fn write_members<'a>(members: impl IntoIterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    out.push('{');
    for (i, (k, v)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write::string(out, k);
        out.push(':');
        write_canonical(v, out);
    }
    out.push('}');
}

/// Canonical JSON text of an object made of the members of `object` that `keep`
/// accepts (see [`canonical`]).
pub fn canonical_filtered(
    object: &serde_json::Map<String, Value>,
    keep: impl Fn(&str) -> bool,
) -> String {
    let mut members: Vec<(&String, &Value)> = object.iter().filter(|(k, _)| keep(k)).collect();
    members.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::new();
    write_members(members, &mut out);
    out
}

/// An upper bound on the length of `value`'s compact JSON text, found by walking the
/// tree instead of writing it: each string counts as if every byte needed the longest
/// escape (`\u00XX`, six bytes), each number is written to find its length. A check
/// against a byte limit can skip writing the text whenever the bound is within it.
pub fn encoded_len_bound(value: &Value) -> usize {
    // Quotes around a string, and the worst escape of each of its bytes.
    fn string(s: &str) -> usize {
        2 + 6 * s.len()
    }
    match value {
        Value::Null => 4,
        Value::Bool(_) => 5,
        Value::Number(n) => written_len(n),
        Value::String(s) => string(s),
        Value::Array(items) => {
            // Brackets and the commas between items.
            2 + items.len() + items.iter().map(encoded_len_bound).sum::<usize>()
        }
        Value::Object(members) => object_len_bound(members),
    }
}

/// [`encoded_len_bound`] of an object given as its map.
pub fn object_len_bound(members: &Map<String, Value>) -> usize {
    // Braces, and per member its colon and the comma before the next.
    2 + members
        .iter()
        .map(|(k, v)| 2 + 6 * k.len() + 2 + encoded_len_bound(v))
        .sum::<usize>()
}

/// The exact length of the compact JSON text of `value`, counted as it is written
/// (nothing is kept).
pub fn written_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` (or a string, or a number) into memory does not fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
