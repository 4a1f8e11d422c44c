//! dualera: a dual-era MCP gateway, and the modern (2026-07-28) notes and
//! repository-summary server it fronts.
//!
//! This crate is the IO side: listeners, transports, the modern server and the CLI's
//! building blocks. Protocol translation that must be deterministic and testable
//! without sockets lives in the sans-IO crate `dualera-adapters`.
//!
//! Pieces both programs use (and that neither may borrow from the other) sit at the
//! top level: [`body`], [`digest`], [`endpoint`], [`framing`], [`guard`], [`sse`],
//! [`inbound`], [`outbound`], [`throttle`], [`clock`]; wall-clock text is
//! `dualera_adapters::time`, which the session machine uses too.
//!
//! ```text
//!  legacy host ──► gateway (src/, drives adapters' session machine) ──► modern server
//!  modern host ──► gateway pass-through ─────────────────────────────► modern server
//!                                                                     (src/server/)
//! ```

pub mod bearer;
pub mod body;
pub mod clock;
pub mod config;
pub mod demo;
pub mod digest;
pub mod endpoint;
pub mod framing;
pub mod gateway;
pub mod guard;
pub mod inbound;
pub mod listener;
pub mod outbound;
pub mod request_state;
pub mod server;
pub mod sse;
pub mod throttle;
pub mod tls;
