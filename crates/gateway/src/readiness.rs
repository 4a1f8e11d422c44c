//! `GET /readyz`: whether every route's upstream answered `server/discover` recently.
//!
//! A prober (run by the admin listener) sends each route's upstream an anonymous
//! `server/discover` every `[admin] probe_interval_ms`, straight to the upstream (never
//! through the response cache). A route is ready when its last probe was answered
//! with a result that lists 2026-07-28 (or was refused with HTTP 401/403: the upstream
//! is up and wants credentials the prober does not have) and that answer is recent
//! (within three probe intervals, so a stuck prober shows). Client traffic does not
//! count: a cached discover is no evidence that the upstream is up.
//!
//! A route with several instances is probed instance by instance: it is ready while
//! one answers, and `/readyz` lists the others under it. The answers also feed the
//! pool's health, so an instance that came back is in the rotation again without
//! waiting for a request to try it.
//!
//! With a shared session store (`session_store = "redis://…"`), the store is a line of
//! its own: not ready while the last command to it failed (requests of shared sessions
//! then fail with `sessionStoreUnavailable`; pass-through still works).

use super::upstream::era::Era;
use super::upstream::legacy::LegacyTransport;
use super::upstream::{OnBehalf, Outbound, UpstreamError, UpstreamPool};
use super::Gateway;
use dualera_adapters::session::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION,
};
use dualera_adapters::{Message, ProtocolVersion, Request, RequestId};
use serde_json::{json, Value};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::clock::now_ms;

/// One route's probe results.
#[derive(Debug)]
struct RouteState {
    route: Arc<str>,
    /// When the last successful probe answered (ms on the process clock; 0: never).
    ok_at: AtomicU64,
    /// When the last probe ended (ms; 0: none yet).
    probed_at: AtomicU64,
    /// Why the last probe failed, if it did.
    failure: Mutex<Option<String>>,
    /// With several instances: one line per instance that did not answer the last
    /// probe (the route is ready while one did).
    instances: Mutex<Vec<String>>,
    /// `legacy upstream (…)` when the upstream is legacy, named on the route's line.
    legacy: Mutex<Option<String>>,
}

/// Whether the shared session store answered its last command.
type StoreCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// Every route's readiness.
pub struct Readiness {
    routes: Vec<RouteState>,
    interval: AtomicU64,
    store: OnceLock<StoreCheck>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("routes", &self.routes)
            .field("interval", &self.interval)
            .field("store", &self.store.get().is_some())
            .finish()
    }
}

/// The answer to `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Every route is ready.
    pub ready: bool,
    /// One line per route.
    pub text: String,
}

impl Readiness {
    /// Readiness for these routes, none probed yet.
    pub fn new(routes: Vec<Arc<str>>) -> Self {
        let _ = now_ms();
        Self {
            routes: routes
                .into_iter()
                .map(|route| RouteState {
                    route,
                    ok_at: AtomicU64::new(0),
                    probed_at: AtomicU64::new(0),
                    failure: Mutex::new(None),
                    instances: Mutex::new(Vec::new()),
                    legacy: Mutex::new(None),
                })
                .collect(),
            interval: AtomicU64::new(5000),
            store: OnceLock::new(),
        }
    }

    /// Makes the shared session store part of readiness (`check`: whether it answered
    /// its last command; it is pinged every second).
    pub(super) fn watch_store(&self, check: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.store.set(Arc::new(check));
    }

    fn record(
        &self,
        index: usize,
        outcome: Result<(), String>,
        instances: Vec<String>,
        era: Option<Era>,
    ) {
        let Some(r) = self.routes.get(index) else {
            return;
        };
        if let Ok(mut l) = r.legacy.lock() {
            *l = era.filter(|e| e.is_legacy()).map(Era::describe);
        }
        let now = now_ms().max(1);
        if let Ok(mut i) = r.instances.lock() {
            *i = instances;
        }
        if let Ok(mut f) = r.failure.lock() {
            *f = outcome.as_ref().err().cloned();
        }
        if outcome.is_ok() {
            r.ok_at.store(now, Ordering::Relaxed);
        }
        r.probed_at.store(now, Ordering::Relaxed);
    }

    /// Whether every route is ready now, with a line per route naming any that is not.
    pub fn verdict(&self) -> Verdict {
        let window = self.interval.load(Ordering::Relaxed).saturating_mul(3);
        let now = now_ms();
        let mut ready = true;
        let mut text = String::new();
        for r in &self.routes {
            let ok_at = r.ok_at.load(Ordering::Relaxed);
            let probed_at = r.probed_at.load(Ordering::Relaxed);
            let failure = r.failure.lock().ok().and_then(|f| f.clone());
            let legacy = r.legacy.lock().ok().and_then(|l| l.clone());
            let route = match legacy {
                Some(l) => format!("{} ({l})", r.route),
                None => r.route.to_string(),
            };
            let ago = |t: u64| Duration::from_millis(now.saturating_sub(t)).as_secs_f64();
            let line = match (failure, ok_at) {
                (None, t) if t > 0 && now.saturating_sub(t) <= window => {
                    format!(
                        "route {}: ready (server/discover answered {:.1} s ago)",
                        route,
                        ago(t)
                    )
                }
                (None, 0) if probed_at == 0 => {
                    ready = false;
                    format!("route {}: not ready: not probed yet", r.route)
                }
                (None, t) => {
                    ready = false;
                    format!(
                        "route {}: not ready: the last answer to server/discover is {:.1} s old",
                        route,
                        ago(t)
                    )
                }
                (Some(why), t) => {
                    ready = false;
                    let last = if t == 0 {
                        "never answered".to_owned()
                    } else {
                        format!("last answered {:.1} s ago", ago(t))
                    };
                    format!("route {}: not ready: {why} ({last})", route)
                }
            };
            let _ = writeln!(text, "{line}");
            if let Ok(down) = r.instances.lock() {
                for d in down.iter() {
                    let _ = writeln!(text, "  {d}");
                }
            }
        }
        if let Some(check) = self.store.get() {
            if check() {
                let _ = writeln!(text, "session store: ready");
            } else {
                ready = false;
                let _ = writeln!(
                    text,
                    "session store: not ready: unreachable (sessionStoreUnavailable); pass-through still served"
                );
            }
        }
        Verdict { ready, text }
    }
}

/// Probes every route's upstream every `interval` until aborted.
pub(super) async fn probe_loop(gw: Gateway, interval: Duration) {
    let interval = interval.max(Duration::from_millis(50));
    let t = gw.telemetry().clone();
    t.readiness().interval.store(
        u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    let mut n: u64 = 0;
    loop {
        for (i, route) in gw.routes().enumerate() {
            n += 1;
            let timeout = interval.max(Duration::from_secs(1));
            // The era first (remembered after the first probe): a legacy upstream
            // answers server/discover the legacy way, and that is its sign of life.
            let era = match route.upstream_era() {
                Some(era) => Some(era),
                None => tokio::time::timeout(timeout, route.resolve_era(OnBehalf::default()))
                    .await
                    .ok()
                    .and_then(Result::ok),
            };
            t.metrics().upstream_era(&route.path, era);
            if let Some(e) = era {
                t.report()
                    .upstream(&route.path, e.is_legacy().then(|| e.describe()));
            }
            let (outcome, instances) = match era {
                // A legacy stdio server's answer to server/discover before
                // initialize is implementation-defined (or none): its era probe,
                // which completed a handshake, is the evidence.
                Some(Era::Legacy(LegacyTransport::Stdio)) => (Ok(()), Vec::new()),
                Some(e) => probe(&route.upstream, n, timeout, e.is_legacy()).await,
                None => probe(&route.upstream, n, timeout, false).await,
            };
            if let Err(why) = &outcome {
                tracing::debug!(route = %route.path, reason = %why, "readiness probe failed");
            }
            t.metrics().ready(&route.path, outcome.is_ok());
            t.readiness().record(i, outcome, instances, era);
        }
        tokio::time::sleep(interval).await;
    }
}

/// One anonymous `server/discover` to each instance of a route's upstream, straight
/// (the answers also tell the pool which instances are up). The route is ready when
/// one instance answered; the others are listed.
async fn probe(
    pool: &UpstreamPool,
    n: u64,
    timeout: Duration,
    legacy: bool,
) -> (Result<(), String>, Vec<String>) {
    let request = Outbound::from(discover_request(RequestId::String(format!(
        "dualera-ready-{n}"
    ))));
    let results = pool.probe_each(&request, timeout).await;
    let several = results.len() > 1;
    let mut ok = false;
    let mut reasons = Vec::new();
    for (label, outcome) in results {
        match verdict(outcome, legacy) {
            Ok(()) => ok = true,
            Err(why) if several => reasons.push(format!("instance {label}: {why}")),
            Err(why) => reasons.push(why),
        }
    }
    if ok {
        (Ok(()), reasons)
    } else if several {
        (Err("no instance answered".into()), reasons)
    } else {
        (Err(reasons.join("; ")), Vec::new())
    }
}

/// The anonymous `server/discover` the gateway probes upstreams with (readiness, and
/// the era probe of `upstream::era`): 2026-07-28 in `_meta`, no capabilities.
pub(crate) fn discover_request(id: RequestId) -> Message {
    Message::Request(Request {
        id,
        method: "server/discover".into(),
        params: Some(json!({ "_meta": {
            META_PROTOCOL_VERSION: ProtocolVersion::V2026_07_28,
            META_CLIENT_CAPABILITIES: {},
            META_CLIENT_INFO: { "name": "dualera-readiness", "version": env!("CARGO_PKG_VERSION") },
        }})),
    })
}

/// Whether one instance's answer to the probe shows a ready modern upstream (an HTTP
/// 401/403 does: it is up and wants credentials the prober does not have). For a
/// legacy upstream (`legacy`), an answer the legacy way (a JSON-RPC error, or a 4xx
/// without one) shows it is up.
fn verdict(
    outcome: Result<Option<dualera_adapters::Response>, UpstreamError>,
    legacy: bool,
) -> Result<(), String> {
    match outcome {
        Err(UpstreamError::Denied(_)) => Ok(()),
        Err(UpstreamError::Status { status }) if legacy && (400..500).contains(&status) => Ok(()),
        Ok(Some(dualera_adapters::Response {
            outcome: Err(_), ..
        })) if legacy => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(answer) => match answer.map(|r| r.outcome) {
            Some(Ok(result)) => {
                let modern = result
                    .get("supportedVersions")
                    .and_then(Value::as_array)
                    .is_some_and(|v| v.iter().any(|v| v == ProtocolVersion::V2026_07_28));
                if modern {
                    Ok(())
                } else {
                    Err("server/discover does not list 2026-07-28".into())
                }
            }
            Some(Err(e)) => Err(format!(
                "server/discover answered error {}: {}",
                e.code.0, e.message
            )),
            None => Err("server/discover got no response".into()),
        },
    }
}
