//! dualera: a dual-era MCP gateway, and the modern (2026-07-28) notes and
//! repository-summary server it fronts.
//!
//! This package is the `dualera` binary (CLI, configuration loading, the `up` demo,
//! the kit's `vectors` subcommand). Its library only re-exports the workspace's
//! crates under their old paths, so integration tests, examples and the bench name
//! `dualera::gateway`, `dualera::server`, `dualera::config`, …:
//!
//! ```text
//!  dualera (binary) ──► dualera-gateway ──┐
//!        │          └─► dualera-server  ──┼─► dualera-common ──► dualera-adapters (sans-IO)
//!        └─► dualera-kit (feature `kit`)  └───────────────────────┘
//! ```
//!
//! The gateway and the server do not depend on each other: what both need is in
//! `dualera-common`.

pub mod demo;

pub use dualera_common::{
    bearer, body, clock, config, digest, endpoint, framing, guard, inbound, listener, outbound,
    parts, request_state, sse, throttle, tls,
};
pub use dualera_gateway as gateway;
pub use dualera_server as server;
