//! What goes into the reverse machine from a modern host, and what comes out.

use super::round::{OpenedState, RoundState};
use crate::jsonrpc::{Message, RequestId};
use serde_json::{Map, Value};
use std::fmt;

/// The driver's name for one host request (one HTTP POST, or one request on a stdio
/// pipe): unique among the requests it hands one machine. Host JSON-RPC ids are not
/// unique across the hosts of a partition, so the machine never keys by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostKey(pub u64);

impl fmt::Display for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host-{}", self.0)
    }
}

/// A 2026-07-28 request from a modern host, already validated by the modern front
/// (protocol version, capabilities present, headers).
#[derive(Debug, Clone, PartialEq)]
pub struct HostRequest {
    /// The driver's key for this request.
    pub host: HostKey,
    /// The host's JSON-RPC id, repeated in the answer.
    pub id: RequestId,
    /// The method.
    pub method: String,
    /// The params (empty when absent), `_meta` included.
    pub params: Map<String, Value>,
    /// The authenticated principal of this request.
    pub principal: String,
    /// The request's `requestState`, verified and opened by the driver.
    pub state: OpenedState,
}

/// An output of the reverse machine.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Send `message` to the legacy server (a request, a notification, or the answer
    /// to one of its requests).
    ToUpstream {
        /// The message, in the negotiated legacy revision's shape.
        message: Message,
    },
    /// Send `message` on host request `host`'s stream: a notification (progress, log,
    /// a subscription's notifications) or its final response, which ends the stream.
    ToHost {
        /// Whose stream.
        host: HostKey,
        /// The message, in 2026-07-28 shape.
        message: Message,
    },
    /// Answer host request `host` (JSON-RPC id `id`) with an `input_required` result:
    /// the driver serializes and seals `state`, sets the sealed string as the result's
    /// `requestState`, and sends the response; it ends the stream.
    InputRequired {
        /// Whose request.
        host: HostKey,
        /// The host's JSON-RPC id.
        id: RequestId,
        /// The result, without `requestState`.
        result: Value,
        /// The round state to seal.
        state: RoundState,
    },
    /// The legacy session cannot be used (initialize refused, or a protocol version
    /// the bridge does not speak); every host request was answered with an error.
    /// The driver drops the machine and closes the legacy session.
    Failed {
        /// Why, for logs.
        reason: String,
    },
}
