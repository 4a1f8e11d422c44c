//! An upstream request with its JSON text, written at most once.
//!
//! A replicated session writes each upstream request into the lease that lets another
//! replica redo it, then the transport sends it; the pool sends it again to the next
//! instance when the first cannot be reached. Each of them used to write the message
//! anew (a kilobyte of JSON a round: about 2 % of a replicated flow's instructions).

use bytes::Bytes;
use dualera_adapters::Message;
use std::sync::OnceLock;

/// A request for the upstream, and its text once some layer needed it.
#[derive(Debug)]
pub struct Outbound {
    message: Message,
    text: OnceLock<Bytes>,
}

impl Outbound {
    /// The message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Its compact JSON text, written on the first call.
    pub fn text(&self) -> Bytes {
        self.text
            .get_or_init(|| Bytes::from(self.message.to_vec()))
            .clone()
    }
}

impl From<Message> for Outbound {
    fn from(message: Message) -> Self {
        Self {
            message,
            text: OnceLock::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualera_adapters::{Request, RequestId};

    #[test]
    fn the_text_is_the_message_written_once() {
        let m = Message::Request(Request {
            id: RequestId::Number(7),
            method: "tools/call".into(),
            params: Some(serde_json::json!({"name": "notes_list", "arguments": {"q": "a\"b"}})),
        });
        let out = Outbound::from(m.clone());
        let first = out.text();
        assert_eq!(&first[..], &m.to_vec()[..]);
        // The same allocation the second time: nothing was written again.
        assert_eq!(out.text().as_ptr(), first.as_ptr());
    }
}
