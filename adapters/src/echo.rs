//! Bounded echo of peer input. An error message or a log field that repeats what a peer
//! sent (an id, a method, a name) repeats at most [`MAX_ECHO`] bytes of it, marked as
//! truncated, so a 3 MB id cannot become a 3 MB error body or log line.

use std::fmt;

/// Most bytes of one peer-supplied string repeated in an error message or log field.
pub const MAX_ECHO: usize = 256;

/// Displays a peer-supplied string, cut at [`MAX_ECHO`] bytes (on a character
/// boundary) with a `…(truncated, N bytes)` mark when it is longer.
#[derive(Debug, Clone, Copy)]
pub struct Echo<'a> {
    text: &'a str,
    quoted: bool,
}

/// `text` as it may be repeated: plain.
pub fn echo(text: &str) -> Echo<'_> {
    Echo {
        text,
        quoted: false,
    }
}

/// `text` as it may be repeated: quoted and escaped like `{:?}`.
pub fn echo_quoted(text: &str) -> Echo<'_> {
    Echo { text, quoted: true }
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
        let shown = prefix(self.text, MAX_ECHO);
        if self.quoted {
            write!(f, "{shown:?}")?;
        } else {
            f.write_str(shown)?;
        }
        if shown.len() < self.text.len() {
            write!(f, "…(truncated, {} bytes)", self.text.len())?;
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
}
