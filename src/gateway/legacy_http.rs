//! Legacy Streamable HTTP (2025-03-26 … 2025-11-25): sessions, SSE streams and the
//! driver loop around the adapters' session machine.

use super::body::GatewayBody;
use super::{GatewayConfig, Gateway};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

/// Live legacy sessions.
#[derive(Debug)]
pub(super) struct Sessions {}

impl Sessions {
    pub(super) fn new(_config: &GatewayConfig) -> Self {
        Self {}
    }

    pub(super) fn close_all(&self) {}
}

/// Evicts idle sessions, forever.
pub(super) async fn reap(_gw: Gateway) {}

/// Handles one legacy request.
pub(super) async fn handle(_gw: &Gateway, _req: Request<Incoming>) -> Response<GatewayBody> {
    super::text(StatusCode::NOT_IMPLEMENTED, "legacy sessions are not implemented yet\n")
}
