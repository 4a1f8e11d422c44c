//! The legacy wires that carry one session over one channel — stdio, WebSocket, the
//! 2024-11-05 HTTP+SSE transport — as the driver's IO side ([`crate::pipe`]) sees
//! them: a [`Wire`] yields the host's next message and takes one message for the
//! host. Each wire's framing (lines, frames with their pings and close codes, SSE
//! events with keepalives) lives in its implementation; the session loop is the
//! driver's, written once. Streamable HTTP, whose streams a session can have several
//! of and which may outlive a connection, is the session stores' front instead
//! (`legacy_http`, `store`).
//!
//! The session task talks to the wire directly: a host that does not read blocks the
//! send, the session stops taking upstream messages, and the upstream is slowed in
//! turn. No queue of the wire's own stands between them.

use std::future::Future;

/// One legacy session's channel to its host.
pub(super) trait Wire: Send {
    /// The transport's name in logs, metrics and the migration report.
    const TRANSPORT: &'static str;

    /// The host's next message or batch, as text; `None` once the host is gone (or
    /// broke the wire's rules, which the wire has answered). Cancel-safe: dropping the
    /// future loses nothing the host sent.
    fn recv(&mut self) -> impl Future<Output = Option<Vec<u8>>> + Send;

    /// Sends one message or batch to the host, waiting for room; `false` when the host
    /// is gone or stopped reading past the wire's limit.
    fn send(&mut self, message: Vec<u8>) -> impl Future<Output = bool> + Send;

    /// The session is over: whatever the wire says at the end (a close frame).
    fn finish(self) -> impl Future<Output = ()> + Send;
}

/// The stdio host bridge (`Gateway::serve_stdio`): one message per line each way.
/// Lines are read by the bridge, which hands them over complete.
pub(super) struct Stdio<W> {
    incoming: tokio::sync::mpsc::Receiver<Vec<u8>>,
    writer: W,
}

impl<W> Stdio<W> {
    pub(super) fn new(incoming: tokio::sync::mpsc::Receiver<Vec<u8>>, writer: W) -> Self {
        Self { incoming, writer }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin + Send> Wire for Stdio<W> {
    const TRANSPORT: &'static str = "stdio";

    async fn recv(&mut self) -> Option<Vec<u8>> {
        self.incoming.recv().await
    }

    async fn send(&mut self, mut message: Vec<u8>) -> bool {
        use tokio::io::AsyncWriteExt;
        message.push(b'\n');
        self.writer.write_all(&message).await.is_ok() && self.writer.flush().await.is_ok()
    }

    async fn finish(mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.writer.flush().await;
    }
}
