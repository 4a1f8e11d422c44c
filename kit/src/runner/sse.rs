//! Server-sent events, both ways, as far as MCP uses them: `data:` lines joined into
//! one message per event; comments (keepalives) and other fields are ignored. The
//! decoder holds at most `limit` bytes of an unfinished event.

/// Feeds bytes, yields the data of each complete event.
#[derive(Debug)]
pub(crate) struct Decoder {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    last_was_cr: bool,
    limit: usize,
}

/// An event exceeded the limit.
#[derive(Debug, thiserror::Error)]
#[error("an SSE event is larger than {limit} bytes")]
pub(crate) struct TooLarge {
    limit: usize,
}

impl Decoder {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            last_was_cr: false,
            limit,
        }
    }

    /// The data of every event completed by `bytes`.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, TooLarge> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' && self.last_was_cr {
                self.last_was_cr = false;
                continue;
            }
            self.last_was_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                self.end_line(&mut out);
            } else {
                if self.line.len() + self.data.len() >= self.limit {
                    return Err(TooLarge { limit: self.limit });
                }
                self.line.push(b);
            }
        }
        Ok(out)
    }

    fn end_line(&mut self, out: &mut Vec<String>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                out.push(String::from_utf8_lossy(&self.data).into_owned());
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }
}

/// One SSE event carrying `data` (one line: JSON has no raw newlines).
pub(crate) fn encode(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_across_chunks_and_line_endings() {
        let mut d = Decoder::new(1024);
        assert_eq!(
            d.feed(b": keepalive\n\nid: 1.0\ndata:\n\n").unwrap(),
            vec![""]
        );
        assert!(d
            .feed(b"event: message\r\ndata: {\"a\"")
            .unwrap()
            .is_empty());
        assert_eq!(
            d.feed(b":1}\r\n\r\ndata: x\rdata: y\r\r").unwrap(),
            vec!["{\"a\":1}", "x\ny"]
        );
    }

    #[test]
    fn bounded() {
        let mut d = Decoder::new(8);
        assert!(d.feed(b"data: 0123456789").is_err());
    }
}
