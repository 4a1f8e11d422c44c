//! The encoding of values a 2026-07-28 request mirrors into HTTP headers (`Mcp-Name`,
//! `Mcp-Param-*`; `basic/transports/streamable-http.mdx`, "Standard Headers"): the
//! modern server checks them against the body, and so does the gateway's reverse
//! bridge, which answers modern hosts in the modern server's place. One decoder, so
//! the two agree on what a valid header is.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Decodes a mirrored header value: `=?base64?…?=` decoded to UTF-8, or visible ASCII,
/// spaces and tabs as they are. `None`: not validly encoded.
pub fn decode_header_value(raw: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::decode_header_value;

    #[test]
    fn plain_base64_and_invalid_values() {
        assert_eq!(
            decode_header_value("notes_delete").as_deref(),
            Some("notes_delete")
        );
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?=").as_deref(),
            Some("Hello, 世界")
        );
        assert_eq!(decode_header_value("=?base64?!!!?="), None);
        assert_eq!(decode_header_value("a\u{1}b"), None);
    }
}
