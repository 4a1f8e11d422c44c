//! The modern server's error enum and the one place that turns an error into a
//! JSON-RPC error object and an HTTP status.

use dualera_adapters::echo;
use dualera_adapters::jsonrpc::EnvelopeError;

/// Longest error message sent, in bytes (longer ones are cut and marked).
pub const MAX_MESSAGE: usize = 1024;
use dualera_adapters::{ErrorCode, ErrorObject, ProtocolVersion};
use http::StatusCode;
use serde_json::{json, Value};

/// Everything that can make the modern server refuse a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The body is not JSON.
    #[error("Parse error: {detail}")]
    Parse {
        /// What the parser said.
        detail: String,
    },
    /// The body is JSON but not a valid JSON-RPC request.
    #[error("Invalid request: {detail}")]
    InvalidRequest {
        /// Which rule was broken.
        detail: String,
    },
    /// No such method.
    #[error("Method not found: {}", echo::echo_quoted(method))]
    MethodNotFound {
        /// The method asked for.
        method: String,
    },
    /// A legacy, session-based method (`initialize`, …) sent to this modern server.
    #[error(
        "Method not found: {method} (a legacy, session-based method; this server speaks \
         only protocol version {}: use server/discover, or put the dualera gateway in front \
         of it for legacy hosts)",
        ProtocolVersion::MODERN.join(", ")
    )]
    LegacyMethod {
        /// Which one (from the server's own list, not the peer's string).
        method: &'static str,
    },
    /// The params are wrong (unknown tool, bad arguments, bad `_meta`, bad state).
    #[error("Invalid params: {reason}")]
    InvalidParams {
        /// What is wrong, for the caller.
        reason: String,
    },
    /// `resources/read` of a URI the server does not have (`-32602`, `data.uri`).
    #[error("Resource not found: {}", echo::echo_quoted(uri))]
    ResourceNotFound {
        /// The URI asked for.
        uri: String,
    },
    /// The requested protocol version is not one this server speaks.
    #[error("Unsupported protocol version: {}", echo::echo_quoted(requested))]
    UnsupportedVersion {
        /// What the client asked for.
        requested: String,
    },
    /// The request needs a client capability it did not declare.
    #[error("Missing required client capability")]
    MissingCapability {
        /// The capabilities needed, in `ClientCapabilities` shape.
        required: Value,
    },
    /// HTTP headers disagree with the body (or a required one is missing).
    #[error("Header mismatch: {reason}")]
    HeaderMismatch {
        /// Which header, and why.
        reason: String,
    },
    /// The caller did not authenticate.
    #[error("Unauthorized: {reason}")]
    Unauthorized {
        /// Why.
        reason: String,
    },
    /// The caller authenticated but may not do this (insufficient scope).
    #[error("Forbidden: {reason}")]
    Forbidden {
        /// Why.
        reason: String,
    },
    /// A bound on tasks was reached (running rounds, tasks held per principal).
    #[error("Server busy: {reason}")]
    Busy {
        /// Which bound.
        reason: String,
    },
    /// The store failed.
    #[error("Internal error")]
    Store(#[from] crate::store::StoreError),
    /// Anything else that is the server's fault.
    #[error("Internal error: {detail}")]
    Internal {
        /// Logged, and said to the caller without secrets.
        detail: String,
    },
}

impl From<EnvelopeError> for ServerError {
    fn from(e: EnvelopeError) -> Self {
        match e {
            EnvelopeError::Parse { detail } => Self::Parse { detail },
            EnvelopeError::Invalid { detail, .. } => Self::InvalidRequest { detail },
        }
    }
}

impl ServerError {
    /// Shorthand for [`ServerError::InvalidParams`].
    pub fn params(reason: impl Into<String>) -> Self {
        Self::InvalidParams {
            reason: reason.into(),
        }
    }

    /// The JSON-RPC error object and HTTP status for this error: the only mapping.
    ///
    /// Statuses follow the 2026-07-28 Streamable HTTP page: 400 for malformed requests,
    /// version and capability errors and header mismatches, 404 for an unknown method.
    ///
    /// Messages repeat peer input (a tool name, a `note_id`, a URI): each is cut at
    /// [`MAX_MESSAGE`] bytes and marked, and peer strings in `data` at
    /// [`echo::MAX_ECHO`], so a megabyte of input never becomes a megabyte of error.
    pub fn respond(&self) -> (StatusCode, ErrorObject) {
        let message = echo::prefix_marked(&self.to_string(), MAX_MESSAGE);
        match self {
            Self::Parse { .. } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(ErrorCode::PARSE_ERROR, message),
            ),
            Self::InvalidRequest { .. } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(ErrorCode::INVALID_REQUEST, message),
            ),
            Self::MethodNotFound { .. } | Self::LegacyMethod { .. } => (
                StatusCode::NOT_FOUND,
                ErrorObject::new(ErrorCode::METHOD_NOT_FOUND, message),
            ),
            Self::InvalidParams { .. } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(ErrorCode::INVALID_PARAMS, message),
            ),
            Self::ResourceNotFound { uri } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(ErrorCode::INVALID_PARAMS, message)
                    .with_data(json!({ "uri": echo::bounded(uri) })),
            ),
            Self::UnsupportedVersion { requested } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(
                    ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
                    format!(
                        "Unsupported protocol version {}; this server supports {}",
                        echo::echo_quoted(requested),
                        ProtocolVersion::MODERN.join(", ")
                    ),
                )
                .with_data(json!({
                    "supported": ProtocolVersion::MODERN,
                    "requested": echo::bounded(requested),
                })),
            ),
            Self::MissingCapability { required } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(
                    ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                    format!("Missing required client capability: {required}"),
                )
                .with_data(json!({ "requiredCapabilities": required })),
            ),
            Self::HeaderMismatch { .. } => (
                StatusCode::BAD_REQUEST,
                ErrorObject::new(ErrorCode::HEADER_MISMATCH, message),
            ),
            Self::Unauthorized { .. } => (
                StatusCode::UNAUTHORIZED,
                ErrorObject::new(ErrorCode::INVALID_REQUEST, message),
            ),
            Self::Forbidden { .. } => (
                StatusCode::FORBIDDEN,
                ErrorObject::new(ErrorCode::INVALID_REQUEST, message),
            ),
            Self::Busy { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorObject::new(ErrorCode::INTERNAL_ERROR, message),
            ),
            Self::Store(_) | Self::Internal { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorObject::new(ErrorCode::INTERNAL_ERROR, "Internal error"),
            ),
        }
    }
}
