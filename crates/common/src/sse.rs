//! Server-Sent Events, for both programs: an incremental, bounded decoder (the gateway
//! reads upstream response streams with it) and the encoder for the events the server
//! and the gateway send.

use bytes::Bytes;

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` field (empty for the default `message`).
    pub event: String,
    /// `data:` lines joined with `\n`.
    pub data: String,
    /// `id:` field, if any.
    pub id: Option<String>,
}

/// Why a stream cannot be decoded further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// One event grew past the limit.
    #[error("SSE event larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
}

/// Feeds bytes in, takes whole events out.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    data: String,
    event: String,
    id: Option<String>,
    has_data: bool,
    limit: usize,
    /// The stream's last event id (the SSE "last event ID buffer"): kept across
    /// events, what a client resumes from.
    last_id: Option<String>,
    /// The reconnection time the server asked for with `retry:`, in milliseconds.
    retry: Option<u64>,
}

impl Decoder {
    /// A decoder refusing events larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            data: String::new(),
            event: String::new(),
            id: None,
            has_data: false,
            limit,
            last_id: None,
            retry: None,
        }
    }

    /// The id of the last event that named one (an empty `id:` clears it), even
    /// one without data such as a priming event: where a resumed stream starts.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// The reconnection time the stream's last `retry:` field asked for, in ms.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry
    }

    /// Adds bytes and returns every event they complete.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(rel) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + rel;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if line.is_empty() {
                if self.has_data {
                    out.push(Event {
                        event: std::mem::take(&mut self.event),
                        data: std::mem::take(&mut self.data),
                        id: self.id.take(),
                    });
                }
                self.has_data = false;
                self.event.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.has_data = true;
                }
                "event" => self.event = value.to_owned(),
                "id" if !value.contains('\0') => {
                    self.id = Some(value.to_owned());
                    self.last_id = (!value.is_empty()).then(|| value.to_owned());
                }
                "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                    self.retry = value.parse().ok();
                }
                _ => {}
            }
            if self.data.len() > self.limit {
                return Err(SseError::TooLarge { limit: self.limit });
            }
        }
        self.buf.drain(..start);
        if self.buf.len() > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
        }
        Ok(out)
    }
}

/// Encodes one `message` event carrying JSON (which has no raw newlines).
pub fn encode(id: Option<&str>, json: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(json.len() + 48);
    if let Some(id) = id {
        v.extend_from_slice(b"id: ");
        v.extend_from_slice(id.as_bytes());
        v.push(b'\n');
    }
    v.extend_from_slice(b"event: message\ndata: ");
    v.extend_from_slice(json);
    v.extend_from_slice(b"\n\n");
    Bytes::from(v)
}

/// A priming event: an id and empty data, so a client can resume from it.
pub fn prime(id: &str) -> Bytes {
    Bytes::from(format!("id: {id}\ndata: \n\n"))
}

/// A comment line that keeps intermediaries from reaping an idle stream.
pub fn keepalive() -> Bytes {
    Bytes::from_static(b": keepalive\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_split_events() {
        let mut d = Decoder::new(1024);
        assert!(d.feed(b"event: message\r\nda").unwrap().is_empty());
        let ev = d
            .feed(b"ta: {\"a\":1}\r\nid: 7\r\n\r\n: comment\n\ndata: x\ndata: y\n\n")
            .unwrap();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "{\"a\":1}");
        assert_eq!(ev[0].id.as_deref(), Some("7"));
        assert_eq!(ev[1].data, "x\ny");
        let mut d = Decoder::new(8);
        assert!(d.feed(b"data: 0123456789\n").is_err());
    }

    #[test]
    fn the_last_event_id_and_retry_outlive_their_events() {
        let mut d = Decoder::new(1024);
        assert_eq!(d.last_event_id(), None);
        let ev = d.feed(b"id: p-1\nretry: 250\ndata: \n\n").unwrap();
        assert_eq!(ev[0].data, "");
        assert_eq!(d.last_event_id(), Some("p-1"));
        assert_eq!(d.retry_ms(), Some(250));
        d.feed(b"data: {}\n\nretry: soon\n\n").unwrap();
        assert_eq!(d.last_event_id(), Some("p-1"));
        assert_eq!(d.retry_ms(), Some(250));
        d.feed(b"id:\ndata: x\n\n").unwrap();
        assert_eq!(d.last_event_id(), None);
    }
}
