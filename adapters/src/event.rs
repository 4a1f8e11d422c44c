//! What the session machine asks its driver to do, and where: every output names its
//! target stream so an HTTP driver can map it to an SSE stream and a stdio or WebSocket
//! driver to its single pipe.

use crate::error::Failure;
use crate::jsonrpc::{Message, Request, RequestId};
use crate::usage::Observation;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// Identifies the group of requests that arrived in one JSON-RPC batch (2025-03-26).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BatchId(pub u64);

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch-{}", self.0)
    }
}

/// A stream towards the legacy peer.
///
/// On Streamable HTTP, [`PeerStream::Request`] is the SSE response stream of the POST
/// that carried that request, [`PeerStream::Batch`] the one of a POST that carried a
/// batch, and [`PeerStream::Standalone`] the GET stream. The 2024-11-05 HTTP+SSE
/// transport, stdio and WebSocket have one channel: the driver sends everything there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerStream {
    /// The response stream of the legacy request with this id. A response carrying this
    /// id is the last message on it.
    Request(RequestId),
    /// The response stream of a batch; [`Event::ToPeerBatch`] is its last message.
    Batch(BatchId),
    /// The stream for messages unrelated to any request (HTTP GET).
    Standalone,
}

/// As [`RequestId`]'s hash: the id alone for a request's stream (the most looked-up
/// key of a session's stream table), a tag byte after the others.
impl std::hash::Hash for PeerStream {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Self::Request(id) => id.hash(state),
            Self::Batch(b) => {
                state.write_u64(b.0);
                state.write_u8(1);
            }
            Self::Standalone => state.write_u8(2),
        }
    }
}

/// Why the machine sends a request upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpstreamRole {
    /// `server/discover`, needed to answer `initialize`.
    Discover,
    /// One attempt of a forwarded legacy request; `round` counts the `input_required`
    /// answers received before this attempt (0 for the first attempt).
    Call {
        /// The legacy request id this attempt serves.
        legacy: RequestId,
        /// The MRTR round this attempt answers.
        round: u32,
    },
    /// The session's single `subscriptions/listen`: a long-lived stream of notifications.
    Listen,
    /// A `tools/list` sent because the upstream refused an attempt of `legacy` with
    /// `-32020` (its `Mcp-Param-*` headers did not match): the tool's `inputSchema`
    /// may have changed. The attempt is sent again once it is answered.
    ToolsRefresh {
        /// The legacy `tools/call` waiting for it.
        legacy: RequestId,
    },
}

/// An output of the session machine, returned by
/// [`Session::poll_event`](crate::session::Session::poll_event).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Send `message` to the legacy peer on `stream`.
    ToPeer {
        /// Where it goes.
        stream: PeerStream,
        /// The message, already shaped for the peer's revision.
        message: Message,
    },
    /// Send the grouped responses of a batch as one JSON array on `stream` (always a
    /// [`PeerStream::Batch`]); it ends that stream.
    ToPeerBatch {
        /// Where it goes.
        stream: PeerStream,
        /// The responses, in the order their requests finished.
        messages: Vec<Message>,
    },
    /// The stream ends without a response (its request was cancelled by the peer):
    /// an HTTP driver closes the SSE stream; a single-pipe driver does nothing.
    CloseStream {
        /// The stream that ends.
        stream: PeerStream,
    },
    /// Send this 2026-07-28 request upstream. Feed its response (and notifications
    /// arriving on its response stream) back with
    /// [`Session::handle_upstream_message`](crate::session::Session::handle_upstream_message),
    /// or report a transport failure with
    /// [`Session::handle_upstream_lost`](crate::session::Session::handle_upstream_lost).
    ToUpstream {
        /// Why it is sent.
        role: UpstreamRole,
        /// The request; its id is minted by the machine and unique in the session.
        request: Request,
    },
    /// Cancel the upstream request `id`: on HTTP close its response stream; on stdio
    /// send `notifications/cancelled` with this id and reason.
    CancelUpstream {
        /// The upstream request to cancel.
        id: RequestId,
        /// A short reason for logs and for the stdio notification.
        reason: &'static str,
    },
    /// A fresh `server/discover` result: the driver may cache it for its `ttlMs`
    /// (within its `cacheScope`) and hand it to later sessions with
    /// [`Session::handle_discover`](crate::session::Session::handle_discover).
    DiscoverFetched {
        /// The result as the upstream sent it.
        result: Value,
    },
    /// A tool definition from the upstream was left out of `tools/list` because its
    /// `x-mcp-header` annotations break the 2026-07-28 rules; the driver should log a
    /// warning naming the tool and the reason.
    ToolRejected {
        /// The tool's name.
        tool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A legacy request failed inside the gateway (the peer also gets a response saying
    /// so); for logs and metrics.
    RequestFailed {
        /// The legacy request id.
        legacy: RequestId,
        /// Why.
        failure: Failure,
    },
    /// What the session just did, for the driver's metrics and migration report
    /// (nothing to send anywhere).
    Observed(Observation),
}
