//! One upstream exchange as a stream of messages that its caller pulls.
//!
//! Why pulled: the upstream is read only as fast as the caller takes messages. Over
//! HTTP the next body frame is read when the caller asks for the next message, so a
//! slow host leaves bytes in the upstream's TCP window; over stdio the reader of the
//! child's pipe waits on the exchange's bounded queue, so the pipe fills. Nothing is
//! ever dropped to make room, and what one exchange holds is bounded by one body
//! frame's worth of decoded messages (the SSE decoder is bounded by the upstream
//! message limit).
//!
//! ```text
//!   caller ── exchange(request) ──► Ok(Exchange)    the upstream accepted it (HTTP: a
//!                                                   head that is not 401/403)
//!   caller ── next() ─────────────► notification, notification, …, response, None
//! ```
//!
//! Layers (the pool's round memory, the cache's store-on-complete, the wire trace)
//! wrap the stream ([`Exchange::inspect`], [`Exchange::until`], [`Exchange::map`]);
//! none calls back into its caller. Dropping an exchange cancels it upstream (HTTP:
//! the response stream closes; stdio: `notifications/cancelled`).

use super::UpstreamError;
use dualera_adapters::Message;
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use std::future::Future;

/// One item of an exchange: a message, or why the exchange broke.
pub type Item = Result<Message, UpstreamError>;

/// The messages the upstream sends about one request: notifications as they come,
/// then the response, which ends the exchange.
pub struct Exchange {
    messages: BoxStream<'static, Item>,
    finished: bool,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    /// An exchange over `messages`. The stream may end after the response; if it ends
    /// before one, [`Exchange::next`] says so as a protocol error.
    pub fn new(messages: impl Stream<Item = Item> + Send + 'static) -> Self {
        Self {
            messages: messages.boxed(),
            finished: false,
        }
    }

    /// An exchange already answered (a cache hit, a buffered JSON body).
    pub fn answered(response: Message) -> Self {
        Self::new(stream::iter([Ok(response)]))
    }

    /// The next message, waiting for the upstream; `None` once the response (or an
    /// error) was returned. An error ends the exchange.
    pub async fn next(&mut self) -> Option<Item> {
        if self.finished {
            return None;
        }
        let item = self
            .messages
            .next()
            .await
            .unwrap_or_else(|| Err(UpstreamError::ended()));
        if !matches!(item, Ok(Message::Notification(_) | Message::Request(_))) {
            self.finished = true;
        }
        Some(item)
    }

    /// Reads the exchange to its end: the response, its notifications dropped (the
    /// gateway's own probes and lookups, which carry no host's stream).
    pub async fn response(mut self) -> Result<dualera_adapters::Response, UpstreamError> {
        while let Some(item) = self.next().await {
            if let Message::Response(r) = item? {
                return Ok(r);
            }
        }
        Err(UpstreamError::ended())
    }

    /// Reads the exchange to its end, keeping every message (a caller that feeds them
    /// all at once, inside a bounded wait).
    pub async fn collect(mut self) -> (Vec<Message>, Result<(), UpstreamError>) {
        let mut got = Vec::new();
        while let Some(item) = self.next().await {
            match item {
                Ok(m) => got.push(m),
                Err(e) => return (got, Err(e)),
            }
        }
        (got, Ok(()))
    }

    /// Calls `f` on every message as it passes (observers: round memory, metrics).
    pub fn inspect(self, mut f: impl FnMut(&Message) + Send + 'static) -> Self {
        Self::new(self.messages.inspect(move |item| {
            if let Ok(m) = item {
                f(m);
            }
        }))
    }

    /// Rewrites every item as it passes (a layer that may replace the response, such
    /// as the cache serving a stale entry when the upstream fails).
    pub fn map(self, f: impl FnMut(Item) -> Item + Send + 'static) -> Self {
        Self::new(self.messages.map(f))
    }

    /// Ends the exchange with the error `stop` resolves to, if it resolves first (an
    /// instance found down ends the listens open on it).
    pub fn until(self, stop: impl Future<Output = UpstreamError> + Send + 'static) -> Self {
        let state = Some((self.messages, Box::pin(stop)));
        Self::new(stream::unfold(state, |state| async move {
            let (mut messages, mut stop) = state?;
            tokio::select! {
                item = messages.next() => item.map(|i| (i, Some((messages, stop)))),
                e = &mut stop => Some((Err(e), None)),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualera_adapters::{Notification, RequestId, Response};
    use serde_json::json;

    fn note(i: u64) -> Item {
        Ok(Message::Notification(Notification {
            method: "notifications/progress".into(),
            params: Some(json!({ "progress": i })),
        }))
    }

    fn done() -> Item {
        Ok(Message::Response(Response::result(
            RequestId::Number(1),
            json!({}),
        )))
    }

    #[tokio::test]
    async fn the_response_ends_the_exchange_and_nothing_after_it_is_read() {
        let mut ex = Exchange::new(stream::iter([note(1), done(), note(2)]));
        assert!(matches!(
            ex.next().await,
            Some(Ok(Message::Notification(_)))
        ));
        assert!(matches!(ex.next().await, Some(Ok(Message::Response(_)))));
        assert!(ex.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stream_that_ends_without_a_response_is_an_error() {
        let mut ex = Exchange::new(stream::iter([note(1)]));
        assert!(ex.next().await.unwrap().is_ok());
        assert!(matches!(
            ex.next().await,
            Some(Err(UpstreamError::Protocol { .. }))
        ));
        assert!(ex.next().await.is_none());
    }

    #[tokio::test]
    async fn until_ends_an_open_stream_with_its_error() {
        let ex = Exchange::new(stream::pending()).until(async {
            UpstreamError::Unreachable {
                detail: "gone".into(),
            }
        });
        let (got, end) = ex.collect().await;
        assert!(got.is_empty());
        assert!(matches!(end, Err(UpstreamError::Unreachable { .. })));
    }

    #[tokio::test]
    async fn inspect_sees_every_message_in_order() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let ex = Exchange::new(stream::iter([note(1), note(2), done()])).inspect(move |m| {
            s.lock().unwrap().push(matches!(m, Message::Response(_)));
        });
        assert!(ex.response().await.is_ok());
        assert_eq!(*seen.lock().unwrap(), vec![false, false, true]);
    }
}
