//! Bounded echo of peer input. An error message or a log field that repeats what a peer
//! sent (an id, a method, a name) repeats at most [`MAX_ECHO`] bytes of it, marked as
//! truncated, so a 3 MB id cannot become a 3 MB error body or log line. It is escaped
//! (a peer cannot write control characters or forged lines into a log) and the mark
//! states the original length. One rule for every peer string, headers included
//! ([`echo_bytes`]).

use std::fmt;

/// Most bytes of one peer-supplied string repeated in an error message or log field.
pub const MAX_ECHO: usize = 256;

/// Displays a peer-supplied string escaped (control characters, backslashes, quotes
/// and bytes that are not UTF-8 as Rust escapes) and cut so that what is shown of it
/// is at most [`MAX_ECHO`] bytes, with a `…(truncated, N bytes)` mark stating the
/// original length when it is longer.
#[derive(Debug, Clone, Copy)]
pub struct Echo<'a> {
    bytes: &'a [u8],
    quoted: bool,
}

/// `text` as it may be repeated: escaped, without quotes.
pub fn echo(text: &str) -> Echo<'_> {
    Echo {
        bytes: text.as_bytes(),
        quoted: false,
    }
}

/// `text` as it may be repeated: quoted and escaped like `{:?}`.
pub fn echo_quoted(text: &str) -> Echo<'_> {
    Echo {
        bytes: text.as_bytes(),
        quoted: true,
    }
}

/// Bytes a peer sent that need not be UTF-8 (an HTTP header's value) as they may be
/// repeated: quoted and escaped, invalid bytes as `\xNN`.
pub fn echo_bytes(bytes: &[u8]) -> Echo<'_> {
    Echo {
        bytes,
        quoted: true,
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
pub fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut at `max` bytes (on a character boundary) and marked when longer: for a
/// whole message that may contain several echoes.
pub fn prefix_marked(text: &str, max: usize) -> String {
    let shown = prefix(text, max);
    if shown.len() == text.len() {
        text.to_owned()
    } else {
        format!("{shown}…(truncated, {} bytes)", text.len())
    }
}

/// `text` bounded as an owned string (for error `data` fields that repeat peer input).
pub fn bounded(text: &str) -> String {
    echo(text).to_string()
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = String::new();
        let mut taken = 0;
        'chunks: for chunk in self.bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                let before = shown.len();
                if c == '\'' {
                    shown.push(c);
                } else {
                    shown.extend(c.escape_debug());
                }
                if shown.len() > MAX_ECHO {
                    shown.truncate(before);
                    break 'chunks;
                }
                taken += c.len_utf8();
            }
            for b in chunk.invalid() {
                if shown.len() + 4 > MAX_ECHO {
                    break 'chunks;
                }
                shown.push_str(&format!("\\x{b:02x}"));
                taken += 1;
            }
        }
        if self.quoted {
            write!(f, "\"{shown}\"")?;
        } else {
            f.write_str(&shown)?;
        }
        if taken < self.bytes.len() {
            write!(f, "…(truncated, {} bytes)", self.bytes.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_marks() {
        assert_eq!(echo("short").to_string(), "short");
        assert_eq!(echo_quoted("a\"b").to_string(), "\"a\\\"b\"");
        let long = "é".repeat(1000);
        let shown = echo(&long).to_string();
        assert!(shown.len() < MAX_ECHO + 40, "{}", shown.len());
        assert!(shown.ends_with("…(truncated, 2000 bytes)"));
        assert_eq!(prefix("héllo", 2), "h");
    }

    #[test]
    fn escapes_within_the_bound_and_states_the_length() {
        assert_eq!(echo("a\nb\u{1b}").to_string(), "a\\nb\\u{1b}");
        assert_eq!(echo_bytes(b"v\xff1").to_string(), "\"v\\xff1\"");
        // Escaping does not let the shown part grow past the bound.
        let controls = "\u{1}".repeat(300);
        let shown = echo(&controls).to_string();
        let mark = "…(truncated, 300 bytes)";
        assert!(shown.ends_with(mark), "{shown}");
        assert!(shown.len() - mark.len() <= MAX_ECHO, "{}", shown.len());
        let header = vec![b'x'; 300 * 1024];
        let shown = echo_bytes(&header).to_string();
        assert!(shown.len() <= MAX_ECHO + 2 + 40, "{}", shown.len());
        assert!(shown.ends_with("…(truncated, 307200 bytes)"));
    }
}
