//! Modern pass-through (`gateway_modern.rs`) over TLS on both hops; see
//! `gateway_tls.rs` for how the harness switches.

#[path = "gateway_modern.rs"]
mod modern_matrix;
