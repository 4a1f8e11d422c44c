//! Typed errors of the session machine: [`SessionError`] for inputs the machine refuses
//! (the driver logs them and answers or drops them), [`Failure`] for legacy requests that
//! fail inside the gateway (the peer gets a response built by [`failure_response`]).

use crate::echo::echo;
use crate::jsonrpc::{ErrorCode, ErrorObject, RequestId, Response};
use serde_json::{json, Value};
use std::fmt;

/// An input the session refused; the session's state is unchanged by it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SessionError {
    /// The session was closed; no input is accepted any more.
    Closed,
    /// The peer sent a request whose id is already in flight.
    DuplicateRequestId {
        /// The reused id.
        id: RequestId,
    },
    /// The peer answered an id the gateway never sent it.
    UnknownReply {
        /// The id in the reply.
        id: RequestId,
    },
    /// The peer sent a reply without an id (an error about a message it could not
    /// read); nothing can be correlated with it.
    ReplyWithoutId {
        /// The error the peer sent, if it was an error.
        error: Option<ErrorObject>,
    },
    /// The upstream sent a response without an id on a pipe shared by all requests.
    UpstreamResponseWithoutId,
    /// The peer answered a live request a second time.
    DuplicateReply {
        /// The id in the reply.
        id: RequestId,
    },
    /// The peer answered a live request the gateway had already given up on (timed out,
    /// cancelled, or its legacy request failed); the reply is ignored.
    LateReply {
        /// The id in the reply.
        id: RequestId,
    },
    /// A batch arrived but the negotiated revision does not allow batches (only
    /// 2025-03-26 does, and never before `initialize` has been answered).
    BatchNotAllowed {
        /// The negotiated revision, if any.
        negotiated: Option<&'static str>,
    },
    /// A batch holds more messages than the configured bound.
    BatchTooLarge {
        /// Messages in the batch.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The upstream answered an id the machine never sent.
    UnknownUpstreamId {
        /// The id in the answer.
        id: RequestId,
    },
    /// The upstream answered a request the machine no longer waits for (cancelled or
    /// already answered); the answer is ignored.
    LateUpstreamResponse {
        /// The id in the answer.
        id: RequestId,
    },
    /// The upstream sent a request; modern servers never send requests.
    UnexpectedUpstreamRequest {
        /// Its method.
        method: String,
    },
    /// An upstream notification that belongs to no request or subscription in flight.
    UncorrelatedNotification {
        /// Its method.
        method: String,
    },
    /// The peer sent a request that would be forwarded while the session already has
    /// [`Config::max_in_flight`](crate::Config::max_in_flight) of them in flight. The
    /// request is refused, never queued: on HTTP answer 429 with `Retry-After`.
    TooManyInFlight {
        /// The request.
        id: RequestId,
        /// The bound.
        limit: usize,
    },
    /// The peer's request, as the upstream would receive it, is larger than the
    /// upstream accepts ([`Config::max_upstream_message`](crate::Config::max_upstream_message)),
    /// so it is refused before anything is sent.
    TooLargeForUpstream {
        /// The request.
        id: RequestId,
        /// Bytes of the upstream request it would make.
        size: usize,
        /// The upstream's limit.
        limit: usize,
    },
    /// A `server/discover` result the gateway cannot use.
    InvalidDiscover {
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl SessionError {
    /// Whether this input is accepted and dropped rather than refused: a reply to a
    /// live request the gateway minted and then gave up on (cancelled, abandoned, timed
    /// out) or already had an answer for. 2025-11-25 cancellation: the sender of a
    /// cancellation SHOULD ignore responses that arrive afterwards, so the peer did
    /// nothing wrong. Drivers answer it as accepted (HTTP `202`), send nothing back on
    /// single-channel wires, and log it at debug level with the id.
    pub fn is_dropped(&self) -> bool {
        matches!(self, Self::LateReply { .. } | Self::DuplicateReply { .. })
    }

    /// The error response a driver sends the legacy peer for this refusal, when one
    /// is due: only refused requests and batches get one (a batch refusal has no id).
    /// Replies and upstream problems get none (log them; on HTTP answer the POST 202 or
    /// 400 as the transport page says).
    pub fn to_response(&self) -> Option<Response> {
        match self {
            Self::DuplicateRequestId { id } => Some(Response::error(
                Some(id.clone()),
                ErrorObject::new(ErrorCode::INVALID_REQUEST, self.to_string()),
            )),
            Self::TooManyInFlight { id, limit } => Some(Response::error(
                Some(id.clone()),
                ErrorObject::new(ErrorCode::INTERNAL_ERROR, self.to_string())
                    .with_data(json!({ "reason": "tooManyInFlight", "limit": limit })),
            )),
            Self::TooLargeForUpstream { id, size, limit } => Some(Response::error(
                Some(id.clone()),
                ErrorObject::new(ErrorCode::INVALID_REQUEST, self.to_string())
                    .with_data(json!({ "reason": "upstreamLimit", "size": size, "limit": limit })),
            )),
            Self::BatchNotAllowed { .. } | Self::BatchTooLarge { .. } => Some(Response::error(
                None,
                ErrorObject::new(ErrorCode::INVALID_REQUEST, self.to_string()),
            )),
            _ => None,
        }
    }
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("the session is closed"),
            Self::DuplicateRequestId { id } => write!(f, "request id {id} is already in flight"),
            Self::UnknownReply { id } => write!(f, "reply to id {id}, which was never sent"),
            Self::DuplicateReply { id } => write!(f, "second reply to id {id}"),
            Self::ReplyWithoutId { .. } => f.write_str("reply without an id"),
            Self::UpstreamResponseWithoutId => {
                f.write_str("upstream response without an id on a shared pipe")
            }
            Self::LateReply { id } => write!(f, "reply to id {id} after the gateway gave up on it"),
            Self::BatchNotAllowed {
                negotiated: Some(v),
            } => {
                write!(
                    f,
                    "JSON-RPC batches are not allowed in protocol version {v}"
                )
            }
            Self::BatchNotAllowed { negotiated: None } => {
                f.write_str("JSON-RPC batches are not allowed before initialization")
            }
            Self::BatchTooLarge { len, max } => {
                write!(f, "batch of {len} messages exceeds the limit of {max}")
            }
            Self::UnknownUpstreamId { id } => write!(f, "upstream answered unknown id {id}"),
            Self::LateUpstreamResponse { id } => {
                write!(f, "upstream answered id {id}, which is no longer awaited")
            }
            Self::UnexpectedUpstreamRequest { method } => {
                write!(
                    f,
                    "upstream sent a request ({}); modern servers do not",
                    echo(method)
                )
            }
            Self::UncorrelatedNotification { method } => {
                write!(
                    f,
                    "upstream notification {} belongs to nothing in flight",
                    echo(method)
                )
            }
            Self::TooManyInFlight { limit, .. } => write!(
                f,
                "Too many requests in flight in this session (limit {limit}); retry when one has finished"
            ),
            Self::TooLargeForUpstream { size, limit, .. } => write!(
                f,
                "Request too large for the upstream server: it would be {size} bytes; the upstream accepts at most {limit}"
            ),
            Self::InvalidDiscover { reason } => {
                write!(f, "unusable server/discover result: {reason}")
            }
        }
    }
}

impl std::error::Error for SessionError {}

/// Why a legacy request failed inside the gateway.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Failure {
    /// An input request needs capabilities the peer did not declare.
    MissingCapabilities {
        /// Each missing capability, as a dotted path (`elicitation.url`), with the
        /// `inputRequests` key that needs it.
        missing: Vec<(String, &'static str)>,
        /// The merged modern `requiredCapabilities` object.
        required: Value,
    },
    /// An input request uses a method MRTR does not allow.
    UnsupportedInputRequest {
        /// Its `inputRequests` key.
        input_key: String,
        /// Its method.
        method: String,
    },
    /// The peer answered a live request with a JSON-RPC error.
    PeerError {
        /// The method of the live request.
        method: String,
        /// The peer's error.
        error: ErrorObject,
    },
    /// The peer did not answer a live request in time.
    LiveTimeout {
        /// The method of the live request.
        method: String,
        /// Its `inputRequests` key.
        input_key: String,
    },
    /// The upstream asked for input more often than allowed.
    RoundLimit {
        /// The bound.
        max_rounds: u32,
    },
    /// One round asked for more input requests than allowed.
    TooManyInputRequests {
        /// How many it asked for.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// The upstream's `input_required` result is malformed.
    MalformedInputRequired {
        /// What is wrong.
        reason: &'static str,
    },
    /// The upstream answered `input_required` to a method that may not use MRTR.
    InputRequiredNotAllowed {
        /// The legacy method.
        method: String,
    },
    /// The upstream answered with a `resultType` the gateway does not know.
    UnknownResultType {
        /// The value sent.
        result_type: String,
    },
    /// The upstream request failed without a response (connection lost, HTTP error).
    UpstreamLost,
    /// The upstream could not be reached for a reason the driver named (e.g. its TLS
    /// certificate was refused).
    UpstreamRefused {
        /// Machine-readable cause, `data.reason` (e.g. `tlsUnknownIssuer`).
        reason: &'static str,
        /// What happened, for people.
        message: String,
    },
    /// A round would put more live requests outstanding at the peer than the
    /// session allows ([`Config::max_live`](crate::Config::max_live)).
    TooManyLive {
        /// The bound.
        limit: usize,
    },
    /// The retry carrying the peer's answers would be larger than the upstream
    /// accepts ([`Config::max_upstream_message`](crate::Config::max_upstream_message)).
    AnswersTooLarge {
        /// Bytes of the retry.
        size: usize,
        /// The upstream's limit.
        limit: usize,
    },
    /// A `tasks/result` (or a plain call the upstream made a task of) waited longer
    /// than a live request may run ([`Config::live_timeout_max`](crate::Config::live_timeout_max)).
    TaskWaitTimeout,
    /// The session already holds as many unfinished tasks as it may
    /// ([`crate::tasks::MAX_TASKS`]).
    TooManyTasks {
        /// The bound.
        limit: usize,
    },
    /// The upstream answered with a task that has no `taskId`.
    MalformedTask,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingCapabilities { missing, .. } => {
                f.write_str("The client did not declare the capabilities the server needs for this request: ")?;
                for (i, (key, capability)) in missing.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{capability} (input request \"{}\")", echo(key))?;
                }
                Ok(())
            }
            Self::UnsupportedInputRequest { input_key, method } => write!(
                f,
                "The server asked for input with unsupported method {} (input request \"{}\")",
                echo(method),
                echo(input_key)
            ),
            Self::PeerError { method, error } => write!(
                f,
                "The client answered {method} with error {}: {}",
                error.code.0,
                echo(&error.message)
            ),
            Self::LiveTimeout { method, input_key } => write!(
                f,
                "The client did not answer {method} (input request \"{}\") in time",
                echo(input_key)
            ),
            Self::RoundLimit { max_rounds } => write!(
                f,
                "The server asked for more input than allowed ({max_rounds} rounds)"
            ),
            Self::TooManyInputRequests { count, max } => write!(
                f,
                "The server asked for {count} inputs at once; the limit is {max}"
            ),
            Self::MalformedInputRequired { reason } => {
                write!(f, "The server sent a malformed input_required result: {reason}")
            }
            Self::InputRequiredNotAllowed { method } => {
                write!(f, "The server asked for input on {method}, which does not allow it")
            }
            Self::UnknownResultType { result_type } => write!(
                f,
                "The server answered with unknown resultType \"{}\"",
                echo(result_type)
            ),
            Self::UpstreamLost => f.write_str("The upstream server did not answer"),
            Self::TooManyLive { limit } => write!(
                f,
                "The server asked for more input than this session may have outstanding (limit {limit} input requests)"
            ),
            Self::AnswersTooLarge { size, limit } => write!(
                f,
                "The answers to the server's input requests make a request of {size} bytes; the upstream server accepts at most {limit}"
            ),
            Self::UpstreamRefused { message, .. } => f.write_str(message),
            Self::TaskWaitTimeout => f.write_str("The task did not finish in time"),
            Self::TooManyTasks { limit } => write!(
                f,
                "This session holds as many unfinished tasks as it may ({limit})"
            ),
            Self::MalformedTask => f.write_str("The server answered with a task without a taskId"),
        }
    }
}

impl Failure {
    /// A short machine-readable name, used as `data.reason` in error responses.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MissingCapabilities { .. } => "missingCapabilities",
            Self::UnsupportedInputRequest { .. } => "unsupportedInputRequest",
            Self::PeerError { .. } => "clientError",
            Self::LiveTimeout { .. } => "clientTimeout",
            Self::RoundLimit { .. } => "roundLimit",
            Self::TooManyInputRequests { .. } => "tooManyInputRequests",
            Self::MalformedInputRequired { .. } => "malformedInputRequired",
            Self::InputRequiredNotAllowed { .. } => "inputRequiredNotAllowed",
            Self::UnknownResultType { .. } => "unknownResultType",
            Self::UpstreamLost => "upstreamLost",
            Self::TooManyLive { .. } => "tooManyLive",
            Self::AnswersTooLarge { .. } => "upstreamLimit",
            Self::UpstreamRefused { reason, .. } => reason,
            Self::TaskWaitTimeout => "taskTimeout",
            Self::TooManyTasks { .. } => "tooManyTasks",
            Self::MalformedTask => "malformedTask",
        }
    }
}

/// The one place a [`Failure`] becomes the legacy peer's response.
///
/// - `tools/call`: a normal result `{content:[{type:"text",text}], isError:true}` so the
///   model sees what went wrong — except when the upstream could not be reached for a
///   named reason ([`Failure::UpstreamRefused`], e.g. a refused TLS certificate), which
///   is the gateway's configuration, not the tool's outcome: a JSON-RPC error;
/// - any other method: a JSON-RPC error. A peer's own error to a live request is passed
///   on as it was; every other failure is `-32603` with the same text as `message` and
///   `data: {"reason": <kind>}` (plus `requiredCapabilities` for capability gaps).
pub fn failure_response(method: &str, id: RequestId, failure: &Failure) -> Response {
    if method == "tools/call" && !matches!(failure, Failure::UpstreamRefused { .. }) {
        return Response::result(
            id,
            json!({
                "content": [{ "type": "text", "text": failure.to_string() }],
                "isError": true
            }),
        );
    }
    let error = match failure {
        Failure::PeerError { error, .. } => error.clone(),
        Failure::MissingCapabilities { required, .. } => {
            ErrorObject::new(ErrorCode::INTERNAL_ERROR, failure.to_string()).with_data(json!({
                "reason": failure.kind(),
                "requiredCapabilities": required,
            }))
        }
        _ => ErrorObject::new(ErrorCode::INTERNAL_ERROR, failure.to_string())
            .with_data(json!({ "reason": failure.kind() })),
    };
    Response::error(Some(id), error)
}
