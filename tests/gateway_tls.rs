//! The gateway acceptance matrix over TLS on both hops: the tests of
//! `gateway_legacy.rs` (every era-translation row — legacy rounds, subscriptions,
//! cancellation — for every legacy revision), compiled into this binary, whose harness
//! (`common::gateway::tls()`) then runs a private CA (rcgen), `dualera serve
//! --tls-cert/--tls-key`, the in-process upstream peers on TLS, `dualera gateway
//! --upstream https://… --upstream-ca … --tls-cert …`, and hosts that speak HTTPS
//! (HTTP/2 where offered) trusting only the test CA. `gateway_modern_tls.rs` does the
//! same for pass-through.

#[path = "gateway_legacy.rs"]
mod legacy_matrix;
