//! Sans-IO MCP era translation.
//!
//! This crate is the compatibility boundary of dualera. It holds the JSON-RPC 2.0
//! envelope every MCP revision shares, the table of protocol revisions and their era,
//! and (as it grows) the legacy session machine that turns a session-based peer's
//! messages into stateless 2026-07-28 requests.
//!
//! What it does **not** do: no sockets, no async runtime, no clocks it is not handed.
//! Callers feed it bytes or parsed messages and act on what it returns:
//!
//! ```text
//!   bytes from a peer ──► jsonrpc::parse ──► Message ──► (state machine) ──► commands
//!                                                                          │
//!   bytes to a peer   ◄── Message::to_vec ◄──────────────────────────────────┘
//! ```

pub mod jsonrpc;
pub mod version;

pub use jsonrpc::{ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response};
pub use version::{Era, ProtocolVersion};
