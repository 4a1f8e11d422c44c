//! Compact JSON text, written as serde_json writes it, with strings copied in runs.
//!
//! Every message crossing the gateway is written once or twice (to the upstream, to the
//! host, into a replicated step's lease), and most of a message's text is strings: the
//! `requestState` the server sealed, an elicitation's message and schema, a tool's text
//! content. serde_json looks each byte of a string up in its escape table before moving
//! on, which made writing strings the largest single cost of a legacy elicitation flow
//! (a quarter of its instructions went to parsing and writing JSON). Here a string is
//! searched eight bytes at a time for the only bytes JSON must escape (a control
//! character, `"`, `\`), and the runs between them are copied whole. What comes out is
//! byte for byte what `serde_json::to_writer` writes for the same value (the members in
//! the map's order, the same escapes, numbers written by serde_json itself): the
//! property test below holds it to that. The canonical forms that digests and cache
//! keys are taken over ([`crate::json::canonical`], the gateway's cache key) write
//! their strings with [`string`] too, into a `String`.

use serde_json::Value;

/// Appends `value` as compact JSON.
pub fn value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Writing a number into memory does not fail; serde_json picks its form
        // (integers as written, floats by ryu's shortest round trip).
        Value::Number(n) => {
            let _ = serde_json::to_writer(&mut *out, n);
        }
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                self::value(out, item);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (i, (name, member)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(out, name);
                out.push(b':');
                self::value(out, member);
            }
            out.push(b'}');
        }
    }
}

/// About how many bytes [`value`] writes for `value`, found by a walk that writes
/// nothing: when no string needs an escape and every number has at most eight
/// characters, the exact length and a comma per array or object that is not empty; a
/// little under when they do. A buffer reserved this big takes the text
/// without growing (a message's text grown by doubling from a guess was copied four
/// or five times on the way to a kilobyte), and holds little it does not use.
pub fn len_hint(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        // Brackets, and a comma after each item (the last one's is not written).
        Value::Array(items) => 2 + items.iter().map(|v| len_hint(v) + 1).sum::<usize>(),
        // Braces, and per member its quoted name, colon and comma.
        Value::Object(members) => {
            2 + members
                .iter()
                .map(|(k, v)| k.len() + 4 + len_hint(v))
                .sum::<usize>()
        }
    }
}

/// Where JSON text is written: bytes on their way to a socket, or a `String` (the
/// canonical forms that keys and digests are taken over).
pub trait Text {
    /// Appends `s`.
    fn put(&mut self, s: &str);
    /// Makes room for `additional` more bytes.
    fn room(&mut self, additional: usize);
}

impl Text for Vec<u8> {
    fn put(&mut self, s: &str) {
        self.extend_from_slice(s.as_bytes());
    }
    fn room(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl Text for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
    fn room(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

/// Appends `s` as a JSON string: quoted, with serde_json's escapes (`\"`, `\\`, the
/// short forms `\b` `\t` `\n` `\f` `\r`, `\u00XX` in lower-case hex for the other
/// control characters; nothing else escaped).
pub fn string(out: &mut (impl Text + ?Sized), s: &str) {
    let bytes = s.as_bytes();
    out.room(bytes.len() + 2);
    out.put("\"");
    let mut start = 0;
    while let Some(at) = next_escape(bytes, start) {
        // Escaped bytes are ASCII: the runs between them are whole characters.
        out.put(s.get(start..at).unwrap_or_default());
        escape(out, bytes[at]);
        start = at + 1;
    }
    out.put(s.get(start..).unwrap_or_default());
    out.put("\"");
}

/// The index of the first byte at or after `from` that JSON must escape.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    // A byte of `x` is flagged in `(x - 0x01..01·c) & !x & 0x80..80` when it is below
    // `c` (with `c` = 0x20), or, on `x` XORed with a byte repeated, when it equals that
    // byte. A borrow can flag bytes above a flagged one, never below it, so the lowest
    // flag is exact.
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut at = from;
    let mut chunks = bytes.get(from..).unwrap_or_default().chunks_exact(8);
    for chunk in chunks.by_ref() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let b = x ^ (ONES * u64::from(b'\\'));
        let backslash = b.wrapping_sub(ONES) & !b;
        let flagged = (control | quote | backslash) & HIGH;
        if flagged != 0 {
            return Some(at + flagged.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| needs_escape(c))
        .map(|i| at + i)
}

fn needs_escape(c: u8) -> bool {
    c < 0x20 || c == b'"' || c == b'\\'
}

/// Appends the escape of `c`, one of the bytes [`needs_escape`] names.
fn escape(out: &mut (impl Text + ?Sized), c: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match c {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        0x08 => "\\b",
        b'\t' => "\\t",
        b'\n' => "\\n",
        0x0c => "\\f",
        b'\r' => "\\r",
        _ => {
            let code = [
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xf)],
            ];
            // Six ASCII bytes.
            out.put(std::str::from_utf8(&code).unwrap_or_default());
            return;
        }
    };
    out.put(short);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn written(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        value(&mut out, v);
        out
    }

    /// Any JSON value, its strings and member names drawn mostly from the bytes that
    /// need escaping and their neighbours (0x1f, 0x20, `!`, `#`, `[`, `]`, DEL), with
    /// non-ASCII text, at lengths on both sides of a word.
    fn any_value() -> impl Strategy<Value = Value> {
        const TEXT: &str = "[\\x00-\\x21\"#\\\\\\[\\]\\x7fa-zé😀]{0,20}";
        crate::json::tests::values(TEXT, TEXT)
    }

    proptest! {
        #[test]
        fn writes_what_serde_json_writes(v in any_value()) {
            prop_assert_eq!(written(&v), serde_json::to_vec(&v).unwrap());
        }

        #[test]
        fn finds_every_escape_at_every_offset(prefix in 0usize..17, c in 0u8..0x80) {
            // One byte that may need escaping, after `prefix` plain ones: each position
            // in a word and in the tail past the last whole word.
            let s = format!("{}{}xyz", "a".repeat(prefix), char::from(c));
            let mut out = Vec::new();
            string(&mut out, &s);
            prop_assert_eq!(&out, &serde_json::to_vec(&s).unwrap());
            // Into a `String` (the canonical forms), the same text.
            let mut text = String::new();
            string(&mut text, &s);
            prop_assert_eq!(text.as_bytes(), &out[..]);
        }
    }

    #[test]
    fn the_hint_is_the_length_without_escapes_and_long_numbers() {
        let v = json!({"a": [null, false, "xyz", 12345678, {}], "bc": {"d": []}});
        let text = written(&v);
        // One comma too many in each array and object that is not empty: after its
        // last item or member.
        assert_eq!(len_hint(&v), text.len() + 3);
        let escaped = json!(["\n\"\u{1}", 1.234_567_890_123_456_7e-300]);
        assert!(len_hint(&escaped) < written(&escaped).len());
    }

    #[test]
    fn escapes_as_serde_json_does() {
        let v = json!({"k\u{1}": ["\"\\\u{8}\u{c}\n\r\t\u{1f}é", 1.5, -3, null, true, {}], "": []});
        assert_eq!(
            String::from_utf8(written(&v)).unwrap(),
            r#"{"":[],"k\u0001":["\"\\\b\f\n\r\t\u001fé",1.5,-3,null,true,{}]}"#
        );
        assert_eq!(written(&v), serde_json::to_vec(&v).unwrap());
    }
}
