//! The names of the HTTP headers MCP (and trace context) define, made once.
//!
//! A lookup by `&str` parses and lowercases the name on every call before it hashes
//! it; a `HeaderName` constant is already in the form the map compares. Every request
//! reads several of these, on every path.

use http::header::HeaderName;

/// `MCP-Protocol-Version`: the revision a request speaks.
pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Session-Id`: a legacy session (2025-11-25 and earlier).
pub const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `Mcp-Method`: the JSON-RPC method of a 2026-07-28 request.
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`: the tool, prompt or resource a 2026-07-28 request names.
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
/// `Last-Event-ID`: where a resumed SSE stream picks up.
pub const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
/// `traceparent` (W3C Trace Context): the caller's trace and span.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate` (W3C Trace Context): vendors' trace data.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
