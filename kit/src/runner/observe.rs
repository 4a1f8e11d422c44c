//! What the runner sees on the wires, as one stream of timed events for the play.

use serde_json::Value;
use std::time::Instant;
use tokio::sync::mpsc;

/// One thing seen on a wire.
#[derive(Debug)]
pub(crate) enum Observed {
    /// A message (or batch) from the bridge to a host, in output form
    /// (`{"to":"peer","stream":…,"message":…}`); the stream is `null` on a single pipe.
    PeerOutput { session: String, output: Value },
    /// A stream to the host ended without its response (SSE closed early).
    PeerClose { session: String, stream: Value },
    /// The head of an HTTP response to one of the host's requests, with its body
    /// when that is JSON (not for SSE streams).
    PeerHead {
        exchange: u64,
        status: u16,
        headers: Vec<(String, String)>,
        body: Option<Value>,
    },
    /// One of the host's HTTP requests failed at the connection level.
    PeerFailed { exchange: u64, detail: String },
    /// A request from the bridge to the scripted upstream (held until answered).
    UpstreamRequest {
        key: u64,
        message: Value,
        headers: Vec<(String, String)>,
    },
    /// A notification the bridge POSTed upstream (other than a cancellation).
    UpstreamNotification { message: Value },
    /// The bridge cancelled an upstream request (closed its stream, or sent
    /// `notifications/cancelled` for it).
    UpstreamCancel { key: u64 },
    /// The bridge broke a wire rule (not JSON, a batch upstream, a bad SSE stream).
    Fault { detail: String },
    /// A spawned bridge exited.
    Exited { session: String, status: String },
}

/// An observation and when it arrived.
#[derive(Debug)]
pub(crate) struct Timed {
    pub(crate) at: Instant,
    pub(crate) event: Observed,
}

/// Where wire tasks report (bounded: a flooding bridge loses events, never memory).
pub(crate) type Sink = mpsc::Sender<Timed>;

/// How many observations may queue before the play reads them.
pub(crate) const SINK_DEPTH: usize = 4096;

/// Reports `event` now; drops it if the play is gone or far behind.
pub(crate) fn emit(sink: &Sink, event: Observed) {
    let _ = sink.try_send(Timed {
        at: Instant::now(),
        event,
    });
}

/// Largest message or HTTP body the runner reads from a bridge.
pub(crate) const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// HTTP headers as (lower-case name, value) pairs, values read as lossy UTF-8.
pub(crate) fn header_pairs(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}
