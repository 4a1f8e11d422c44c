//! The admin listener: operating endpoints, on a listener of their own (loopback by
//! default, off unless `[admin] listen` or `--admin` is set), never on the MCP one.
//!
//! | path | answers |
//! |---|---|
//! | `GET /healthz` | 200 while the process serves |
//! | `GET /readyz` | 200 when every route's upstream answered `server/discover` recently, else 503 naming the routes that did not ([`super::readiness`]) |
//! | `GET /metrics` | Prometheus exposition ([`super::metrics`]): OpenMetrics text when the scraper asks for it, else text format 0.0.4 |
//! | `GET /report` | the migration report as JSON ([`super::report`]) |
//! | `GET /report.html` | the same as a page |
//!
//! With a token configured, `/metrics` and `/report*` need `Authorization: Bearer
//! <token>` (compared in constant time); the health endpoints stay open for
//! orchestrator probes. A non-loopback admin listener without a token is refused at
//! start-up. `Host` and `Origin` are checked as on the MCP listener (DNS rebinding).
//!
//! It is served by the shared listener ([`crate::listener`]) with bounds of its own:
//! 64 connections (scrapers and probes need few), the listener's header read and idle
//! timeouts, no TLS (loopback or a private network; a token where it is not loopback).

use super::telemetry::ConnectionsOpen;
use super::Gateway;
use crate::body::{full, GatewayBody};
use crate::guard;
use crate::inbound::RequestBody;
use crate::listener::{ConnInfo, ListenerConfig};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::info;

/// Most admin connections served at once (scrapers and probes need few).
const MAX_CONNECTIONS: usize = 64;

/// The admin listener's settings.
#[derive(Clone, Default)]
pub struct AdminSettings {
    /// The bearer token for `/metrics` and `/report*`, if any.
    pub token: Option<String>,
    /// How often each upstream is probed for `/readyz`.
    pub probe_interval: Duration,
}

impl std::fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSettings")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("probe_interval", &self.probe_interval)
            .finish()
    }
}

impl AdminSettings {
    /// From a config file's `[admin]` section (the token resolved from the
    /// environment when `token_env` is given).
    pub fn from_section(
        s: &crate::config::AdminSection,
    ) -> Result<Self, crate::config::ConfigError> {
        let token = match (&s.token, &s.token_env) {
            (None, None) => None,
            (inline, env) => Some(crate::config::resolve_secret("[admin] token", inline, env)?),
        };
        Ok(Self {
            token,
            probe_interval: Duration::from_millis(s.probe_interval_ms.unwrap_or(5000).max(50)),
        })
    }
}

/// Whether the request carries the token: both sides hashed to the same length, then
/// compared without an early exit.
fn authorized(req: &Request<RequestBody>, token: &str) -> bool {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(crate::bearer::token)
        .unwrap_or("");
    crate::digest::constant_time_eq(presented.as_bytes(), token.as_bytes()) && !presented.is_empty()
}

/// Refuses a non-loopback admin address without a token.
pub fn check_exposure(addr: std::net::SocketAddr, settings: &AdminSettings) -> Result<(), String> {
    if !addr.ip().is_loopback() && settings.token.is_none() {
        return Err(format!(
            "refusing an admin listener on non-loopback {addr} without [admin] token or token_env"
        ));
    }
    Ok(())
}

/// The admin listener's bounds: the listener defaults (header read and idle
/// timeouts) with [`MAX_CONNECTIONS`], no TLS.
pub fn listener_config() -> ListenerConfig {
    ListenerConfig {
        max_connections: MAX_CONNECTIONS,
        grace: Duration::from_secs(5),
        ..ListenerConfig::default()
    }
}

/// Serves the admin endpoints on a bound listener until `shutdown` resolves; probes
/// the upstreams for `/readyz` meanwhile.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    settings: AdminSettings,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let prober = tokio::spawn(super::readiness::probe_loop(
        gateway.clone(),
        settings.probe_interval,
    ));
    let hook = ConnectionsOpen::new(gateway.telemetry(), "admin");
    let settings = Arc::new(settings);
    let service = move |req: Request<RequestBody>, conn: &ConnInfo, _: &Arc<_>| {
        let loopback = conn.local.ip().is_loopback();
        let response = handle(&gateway, &settings, loopback, &req);
        async move { response }
    };
    let stop_probing = prober.abort_handle();
    let served =
        crate::listener::serve_hooked(listener, listener_config(), hook, service, async move {
            shutdown.await;
            info!("admin listener shutting down");
            stop_probing.abort();
        })
        .await;
    prober.abort();
    served
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<bytes::Bytes>,
) -> Response<GatewayBody> {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn plain(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<GatewayBody> {
    respond(status, "text/plain; charset=utf-8", body)
}

fn handle(
    gw: &Gateway,
    settings: &AdminSettings,
    loopback: bool,
    req: &Request<RequestBody>,
) -> Response<GatewayBody> {
    if let Some(refused) = guard::refusal(req, loopback, &gw.route.config.allowed_origins) {
        return plain(StatusCode::FORBIDDEN, refused.text());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = req.uri().path();
    let guarded = matches!(path, "/metrics" | "/report" | "/report.html");
    if guarded {
        if let Some(token) = &settings.token {
            if !authorized(req, token) {
                let mut r = plain(StatusCode::UNAUTHORIZED, "a bearer token is required\n");
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"dualera-admin\""),
                );
                return r;
            }
        }
    }
    let t = gw.telemetry();
    match path {
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" => {
            let v = t.readiness().verdict();
            let status = if v.ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            plain(status, v.text)
        }
        "/metrics" => {
            let openmetrics = req
                .headers()
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.contains("application/openmetrics-text"));
            let (body, content_type) = t.metrics().encode(openmetrics);
            respond(StatusCode::OK, content_type, body)
        }
        "/report" => {
            let body = serde_json::to_vec_pretty(&t.report().snapshot()).unwrap_or_default();
            respond(StatusCode::OK, "application/json", body)
        }
        "/report.html" => {
            let page = super::report::html::render(&t.report().snapshot());
            let mut r = respond(StatusCode::OK, "text/html; charset=utf-8", page);
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; \
                     form-action 'none'; frame-ancestors 'none'",
                ),
            );
            h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found; the admin endpoints are /healthz, /readyz, /metrics, /report, /report.html\n",
        ),
    }
}
