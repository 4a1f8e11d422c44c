//! The reverse machine's errors: inputs it refuses ([`ReverseError`], for the driver's
//! logs) and the reasons a host request fails ([`HostFailure`]), with the one function
//! that turns a failure into the 2026-07-28 error the host receives.

use super::round::StateMismatch;
use crate::jsonrpc::{ErrorCode, ErrorObject, RequestId};
use serde_json::json;
use std::fmt;

/// An input the machine refuses; nothing changed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ReverseError {
    /// The session is closed or failed.
    Closed,
    /// The driver handed in a host key that is already in use.
    DuplicateHost {
        /// The key.
        host: super::HostKey,
    },
    /// The server answered an id the machine never sent (or already settled).
    UnknownUpstreamId {
        /// The id.
        id: RequestId,
    },
    /// The server sent a response without an id.
    ResponseWithoutId,
    /// A request (not a retry) of a principal the partition does not serve: the
    /// driver routed it to the wrong machine.
    OtherPrincipal,
}

impl fmt::Display for ReverseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("the legacy session is closed"),
            Self::DuplicateHost { host } => write!(f, "{host} is already in use"),
            Self::UnknownUpstreamId { id } => write!(f, "upstream answered unknown id {id}"),
            Self::ResponseWithoutId => f.write_str("upstream response without an id"),
            Self::OtherPrincipal => {
                f.write_str("a request of a principal this session does not serve")
            }
        }
    }
}

impl std::error::Error for ReverseError {}

/// Why a host request fails inside the bridge.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum HostFailure {
    /// The retry's round state is refused.
    State(StateMismatch),
    /// The retry's `inputResponses` is not an object.
    InputResponsesNotObject,
    /// Too many host requests wait for the session to initialize.
    QueueFull {
        /// The bound.
        limit: usize,
    },
    /// Too many host calls are in progress.
    TooManyCalls {
        /// The bound.
        limit: usize,
    },
    /// Too many `subscriptions/listen` streams are open.
    TooManyListeners {
        /// The bound.
        limit: usize,
    },
    /// The server asked for input more often than allowed.
    RoundLimit {
        /// The bound.
        max_rounds: u32,
    },
    /// The legacy request ended without a response.
    UpstreamLost,
    /// The legacy session expired while the request was running, and sending it again
    /// could repeat its effect.
    SessionExpired,
    /// The legacy session cannot be used.
    Unusable {
        /// Why.
        reason: String,
    },
}

impl HostFailure {
    /// A short machine-readable name, `data.reason` of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::State(m) => m.kind(),
            Self::InputResponsesNotObject => "invalidInputResponses",
            Self::QueueFull { .. } => "queueFull",
            Self::TooManyCalls { .. } => "tooManyCalls",
            Self::TooManyListeners { .. } => "tooManyListeners",
            Self::RoundLimit { .. } => "roundLimit",
            Self::UpstreamLost => "upstreamLost",
            Self::SessionExpired => "sessionExpired",
            Self::Unusable { .. } => "upstreamUnusable",
        }
    }
}

impl fmt::Display for HostFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::State(m) => f.write_str(m.message()),
            Self::InputResponsesNotObject => f.write_str("inputResponses must be an object"),
            Self::QueueFull { limit } => write!(
                f,
                "Too many requests wait for the upstream session (limit {limit}); retry later"
            ),
            Self::TooManyCalls { limit } => write!(
                f,
                "Too many requests in progress on the upstream session (limit {limit}); retry when one has finished"
            ),
            Self::TooManyListeners { limit } => {
                write!(f, "Too many subscription streams open (limit {limit})")
            }
            Self::RoundLimit { max_rounds } => write!(
                f,
                "The server asked for more input than allowed ({max_rounds} rounds)"
            ),
            Self::UpstreamLost => f.write_str("The upstream server did not answer"),
            Self::SessionExpired => f.write_str(
                "The upstream session expired while the request was in progress; it may or may not have taken effect",
            ),
            // The reason is the machine's own text (peer strings in it are echoed
            // where it is composed).
            Self::Unusable { reason } => write!(f, "The upstream server cannot be used: {reason}"),
        }
    }
}

/// The one place a [`HostFailure`] becomes the host's JSON-RPC error: a refused round
/// state or `inputResponses` is `-32602` (invalid params: they are the request's own
/// params); every other failure is `-32603`. `data.reason` names the failure.
pub fn host_error(failure: &HostFailure) -> ErrorObject {
    let code = match failure {
        HostFailure::State(_) | HostFailure::InputResponsesNotObject => ErrorCode::INVALID_PARAMS,
        _ => ErrorCode::INTERNAL_ERROR,
    };
    ErrorObject::new(code, failure.to_string()).with_data(json!({ "reason": failure.kind() }))
}
