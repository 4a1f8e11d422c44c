//! Sans-IO MCP era translation.
//!
//! This crate is the compatibility boundary of dualera. It holds the JSON-RPC 2.0
//! envelope every MCP revision shares, the table of protocol revisions and their era,
//! and the legacy session machine ([`session::Session`]) that serves a session-based
//! peer (2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05) from a stateless 2026-07-28
//! upstream.
//!
//! What it does **not** do: no sockets, no async runtime, no threads, no clocks it is
//! not handed (time comes in as [`Timestamp`]). Callers feed it parsed messages and act
//! on the events it returns:
//!
//! ```text
//!   bytes from a peer ──► jsonrpc::parse ──► Message ──► Session::handle_peer_* ─┐
//!   upstream answers  ──► jsonrpc::parse ──► Message ──► Session::handle_upstream_*┤
//!   timer fired       ─────────────────────────────────► Session::handle_timeout ──┤
//!                                                                                   ▼
//!   bytes to a peer   ◄── Message::to_vec ◄── Event::ToPeer{stream} ◄── Session::poll_event
//!   upstream requests ◄── Message::to_vec ◄── Event::ToUpstream     ◄──┘
//! ```
//!
//! The reverse direction, modern hosts in front of a legacy server, is a second
//! machine: [`reverse::LegacySession`] holds one legacy session as a client and answers
//! 2026-07-28 requests from it, live server requests becoming `input_required` rounds.
//!
//! Everything version-specific lives here: [`capabilities`] maps capabilities between
//! eras, [`downgrade`] shapes results per revision, [`mrtr`] runs Multi Round-Trip
//! Requests, [`tasks`] keeps a 2025-11-25 host's tasks over the modern tasks
//! extension, and the `v*` modules hold what differs between the legacy revisions.

pub mod capabilities;
pub mod downgrade;
pub mod echo;
pub mod error;
pub mod event;
pub mod json;
pub mod jsonrpc;
pub mod mrtr;
pub mod param_headers;
pub mod replay;
pub mod reverse;
pub mod revision;
pub mod session;
pub mod snapshot;
pub mod tasks;
pub mod time;
pub mod usage;
pub mod v2024_11_05;
pub mod v2025_03_26;
pub mod v2025_06_18;
pub mod v2025_11_25;
pub mod version;

pub use error::{Failure, SessionError};
pub use event::{BatchId, Event, PeerStream, UpstreamRole};
pub use jsonrpc::{ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response};
pub use revision::Revision;
pub use session::{BatchOutcome, Config, Denied, Footprint, Session, SessionState};
pub use time::Timestamp;
pub use usage::Observation;
pub use version::{Era, ProtocolVersion};
