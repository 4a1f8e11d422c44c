//! What both dualera programs use: the gateway (`dualera-gateway`) and the modern
//! server (`dualera-server`) may each depend on this crate, never on each other, so
//! a piece either needs lives here: the listener and its limits ([`listener`],
//! [`inbound`], [`outbound`], [`guard`], [`throttle`]), bodies and framing ([`body`],
//! [`framing`], [`sse`]), TLS ([`tls`]), digests and signed state ([`digest`],
//! [`request_state`], [`bearer`]), the endpoint path ([`endpoint`]), the mirrored
//! request headers' encoding ([`mirrored`]), the clock
//! ([`clock`]) and the configuration file's schema ([`config`], which both programs
//! read and the binary loads), and the one error for a part a build left out
//! ([`parts`]). Wall-clock text is `dualera_adapters::time`, which the
//! session machine uses too.

pub mod bearer;
pub mod body;
pub mod clock;
pub mod config;
pub mod digest;
pub mod endpoint;
pub mod framing;
pub mod guard;
pub mod header_names;
pub mod inbound;
pub mod listener;
pub mod mirrored;
pub mod outbound;
pub mod parts;
pub mod request_state;
pub mod self_wake;
pub mod sse;
pub mod throttle;
#[cfg(feature = "tls")]
pub mod throwaway_ca;
pub mod tls;
