//! What the gateway's drivers record, and where: the session machine's observations
//! (`Event::Observed`) and the few facts only a driver sees (the GET stream,
//! `Last-Event-ID` resumption, pass-through requests, upstream failures) become
//! metric samples ([`Metrics`]) and migration-report counts ([`Report`]).
//!
//! This is the one place the `route` label and report field are filled: each route
//! holds a [`Telemetry`] naming its path, over the gateway's one set of metrics, report
//! and readiness, and everything a route's drivers record goes through it. A session holds a [`SessionTelemetry`] (its host's report record and labels,
//! resolved once); a connection holds a [`ConnectionTelemetry`] (the modern client last
//! identified on it).
//!
//! Identifying modern clients costs the pass-through no parsing of bodies it would not
//! read anyway: a client's `_meta` `clientInfo` is read from the bodies the gateway
//! already holds (cacheable methods, which the response cache reads) and from
//! `server/discover`, which 2026-07-28 clients send first and which is small (read,
//! bounded by the body limit, even with the cache off). Later requests on the same
//! connection count for that client; requests on a connection that never carried one
//! count for an unidentified modern client. A proxy that multiplexes several clients on
//! one connection attributes them to the last one identified.

use super::metrics::{Era, Metrics};
use super::readiness::Readiness;
use super::report::{HostKey, HostRecord, Report};
use super::upstream::UpstreamError;
use crate::listener::{ConnHook, ConnInfo};
use dualera_adapters::usage::{Feature, Method, Observation, RequestOutcome};
use dualera_adapters::{RequestId, Session};
use http::StatusCode;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Requests whose start is remembered per session, for latency (more in flight at
/// once than a session allows are not timed).
const MAX_TIMED: usize = 4096;

/// Host records a route keeps at hand for shared sessions' steps
/// ([`Telemetry::shared_session`]), and the longest `clientInfo` text kept with one
/// (a longer one is looked up in the report each time).
const SHARED_HOSTS_KEPT: usize = 32;
const SHARED_HOST_TEXT: usize = 1024;

/// A host record found for a shared session's step, and what it was found from: the
/// `clientInfo` text as the session keeps it, the revision and the wire.
#[derive(Debug)]
struct SharedHost {
    client_info: Option<Box<str>>,
    revision: &'static str,
    wire: &'static str,
    record: Arc<HostRecord>,
}

/// The gateway's metrics, report and readiness (shared by every route), and the route
/// they are filled for: each route holds its own [`Telemetry`].
#[derive(Debug)]
pub struct Telemetry {
    route: Arc<str>,
    metrics: Arc<Metrics>,
    report: Arc<Report>,
    readiness: Arc<Readiness>,
    /// The host records of the shared sessions' recent steps, latest last: a step
    /// finds its host here by the session's `clientInfo` text, where looking it up in
    /// the report parsed that text, cleaned its fields and hashed them, at every step
    /// that records anything (a report record lives as long as the report, so one
    /// kept here never goes stale).
    shared_hosts: Mutex<std::collections::VecDeque<SharedHost>>,
}

impl Telemetry {
    pub(super) fn new(
        route: Arc<str>,
        metrics: Arc<Metrics>,
        report: Arc<Report>,
        readiness: Arc<Readiness>,
    ) -> Self {
        Self {
            route,
            metrics,
            report,
            readiness,
            shared_hosts: Mutex::default(),
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The migration report.
    pub fn report(&self) -> &Arc<Report> {
        &self.report
    }

    /// Each route's readiness.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The route this recorder fills in.
    pub fn route(&self) -> &Arc<str> {
        &self.route
    }

    /// A new legacy session's recorder on `wire`.
    pub(super) fn session(self: &Arc<Self>, wire: &'static str) -> SessionTelemetry {
        SessionTelemetry {
            telemetry: self.clone(),
            wire,
            host: None,
            revision: "",
            opened: None,
            started: HashMap::new(),
            shared: false,
        }
    }

    /// A recorder for one step of a session kept in a shared store (Redis): the host's
    /// report record is looked up from the machine, nothing is kept between steps (so
    /// no request durations), and the open-sessions gauge is left alone (a shared
    /// session ends on no particular replica).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // used by the Redis store only
    pub(super) fn shared_session(
        self: &Arc<Self>,
        wire: &'static str,
        machine: &Session,
    ) -> SessionTelemetry {
        let mut t = self.session(wire);
        t.shared = true;
        if let Some(revision) = machine.revision() {
            t.host = Some(self.shared_host(machine, revision.version, wire));
        }
        t
    }

    /// The report record of a shared session's host (see [`Self::shared_hosts`]).
    fn shared_host(
        &self,
        machine: &Session,
        revision: &'static str,
        wire: &'static str,
    ) -> Arc<HostRecord> {
        let text = machine.client_info_text();
        let found = |h: &SharedHost| {
            h.revision == revision && h.wire == wire && h.client_info.as_deref() == text
        };
        if let Some(r) = self.shared_hosts.lock().ok().and_then(|kept| {
            kept.iter()
                .rev()
                .find(|h| found(h))
                .map(|h| h.record.clone())
        }) {
            return r;
        }
        let key = HostKey::legacy(&self.route, machine.client_info().as_ref(), revision, wire);
        let record = self.report.host(key);
        if text.is_some_and(|t| t.len() > SHARED_HOST_TEXT) {
            return record;
        }
        if let Ok(mut kept) = self.shared_hosts.lock() {
            if !kept.iter().any(found) {
                if kept.len() >= SHARED_HOSTS_KEPT {
                    kept.pop_front();
                }
                kept.push_back(SharedHost {
                    client_info: text.map(Box::from),
                    revision,
                    wire,
                    record: record.clone(),
                });
            }
        }
        record
    }

    /// An upstream exchange failed without an MCP answer.
    pub(super) fn upstream_error(&self, error: &UpstreamError) {
        self.metrics.upstream_error(&self.route, error.kind());
    }

    /// One modern pass-through request ended with `status` (its outcome: `ok` for
    /// 2xx, `failed` when the gateway could not reach the upstream, `error` for any
    /// other status; an SSE response's JSON-RPC errors are not looked at).
    pub(super) fn passthrough(
        &self,
        connection: &ConnectionTelemetry,
        method: Method,
        revision: &str,
        status: StatusCode,
        started: Instant,
    ) {
        let outcome = if status.is_success() {
            "ok"
        } else if status == StatusCode::BAD_GATEWAY {
            "failed"
        } else {
            "error"
        };
        self.metrics.request(
            &self.route,
            Era::Modern,
            method.as_str(),
            outcome,
            Some(started.elapsed()),
        );
        let host = connection.host(|| {
            self.report.host(HostKey::new(
                &self.route,
                Era::Modern,
                None,
                None,
                revision,
                WIRE_HTTP,
            ))
        });
        host.request(method);
    }

    /// Reads the modern client's `clientInfo` from a request body the gateway holds,
    /// unless this connection already identified its client.
    pub(super) fn identify(&self, connection: &ConnectionTelemetry, revision: &str, body: &[u8]) {
        if connection.identified() {
            return;
        }
        let Ok(envelope) = serde_json::from_slice::<Envelope<'_>>(body) else {
            return;
        };
        let Some(info) = envelope
            .params
            .and_then(|p| p.meta)
            .and_then(|m| m.client_info)
        else {
            return;
        };
        let key = HostKey::new(
            &self.route,
            Era::Modern,
            info.name.as_deref(),
            info.version.as_deref(),
            revision,
            WIRE_HTTP,
        );
        connection.set(self.report.host(key));
    }
}

/// The wire of Streamable HTTP sessions and of pass-through.
pub(super) const WIRE_HTTP: &str = "streamable-http";

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(rename = "_meta", borrow)]
    meta: Option<Meta<'a>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/clientInfo", borrow)]
    client_info: Option<ClientInfo<'a>>,
}

#[derive(Deserialize)]
struct ClientInfo<'a> {
    #[serde(borrow, default, deserialize_with = "lenient")]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "lenient")]
    version: Option<Cow<'a, str>>,
}

/// A string member, or `None` for any other JSON value.
fn lenient<'de, D>(d: D) -> Result<Option<Cow<'de, str>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Maybe<'a> {
        Text(#[serde(borrow)] Cow<'a, str>),
        Other(serde::de::IgnoredAny),
    }
    Ok(match Maybe::deserialize(d)? {
        Maybe::Text(s) => Some(s),
        Maybe::Other(_) => None,
    })
}

/// One open connection, counted in `dualera_connections_open` until dropped.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl OpenConnection {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The listener hook that counts a listener's open connections (an upgraded one
/// until its WebSocket closes).
#[derive(Debug, Clone)]
pub struct ConnectionsOpen(Gauge);

impl ConnectionsOpen {
    /// Counts into the gauge of `listener` (`gateway` or `admin`).
    pub fn new(telemetry: &Telemetry, listener: &'static str) -> Self {
        Self(telemetry.metrics.connections(listener))
    }
}

impl ConnHook for ConnectionsOpen {
    type State = OpenConnection;
    fn opened(&self, _: &ConnInfo) -> OpenConnection {
        OpenConnection::new(&self.0)
    }
}

/// The modern client last identified on one connection.
#[derive(Debug, Default)]
pub struct ConnectionTelemetry {
    host: Mutex<Option<(Arc<HostRecord>, bool)>>,
}

impl ConnectionTelemetry {
    fn identified(&self) -> bool {
        self.host
            .lock()
            .is_ok_and(|h| h.as_ref().is_some_and(|(_, named)| *named))
    }

    fn set(&self, record: Arc<HostRecord>) {
        if let Ok(mut h) = self.host.lock() {
            *h = Some((record, true));
        }
    }

    fn host(&self, unidentified: impl FnOnce() -> Arc<HostRecord>) -> Arc<HostRecord> {
        let Ok(mut h) = self.host.lock() else {
            return unidentified();
        };
        h.get_or_insert_with(|| (unidentified(), false)).0.clone()
    }
}

/// What one legacy session records: its host's report record (once `initialize` was
/// answered) and the starts of its requests in flight.
#[derive(Debug)]
pub struct SessionTelemetry {
    telemetry: Arc<Telemetry>,
    wire: &'static str,
    host: Option<Arc<HostRecord>>,
    revision: &'static str,
    opened: Option<Instant>,
    started: HashMap<RequestId, Instant>,
    /// A shared session's step (see [`Telemetry::shared_session`]).
    shared: bool,
}

impl SessionTelemetry {
    /// A request of the peer arrived (call before feeding it to the machine).
    pub(super) fn request_started(&mut self, id: &RequestId) {
        self.request_started_at(id, Instant::now());
    }

    /// A request of the peer arrived at `at` (before this telemetry existed: the
    /// `initialize` that opened the session).
    pub(super) fn request_started_at(&mut self, id: &RequestId, at: Instant) {
        if self.started.len() < MAX_TIMED {
            self.started.entry(id.clone()).or_insert(at);
        }
    }

    /// Records one observation of the machine (`machine` is the session it came from).
    pub(super) fn observe(&mut self, observation: Observation, machine: &Session) {
        let t = &*self.telemetry;
        match observation {
            Observation::SessionReady => {
                let revision = machine.revision().map_or("", |r| r.version);
                let key = HostKey::legacy(
                    &t.route,
                    machine.client_info().as_ref(),
                    revision,
                    self.wire,
                );
                let host = t.report.host(key);
                host.session();
                if self.opened.is_none() && !self.shared {
                    t.metrics.session(&t.route, revision, self.wire, None);
                    self.opened = Some(Instant::now());
                    self.revision = revision;
                }
                self.host = Some(host);
            }
            Observation::RequestEnded {
                id,
                method,
                outcome,
                rounds,
            } => {
                let elapsed = self.started.remove(&id).map(|s| s.elapsed());
                if self.started.is_empty() {
                    // An idle session keeps no table sized for its busiest moment.
                    self.started.shrink_to_fit();
                }
                t.metrics.request(
                    &t.route,
                    Era::Legacy,
                    method.as_str(),
                    outcome.as_str(),
                    elapsed,
                );
                if matches!(
                    method,
                    Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead
                ) {
                    t.metrics.rounds(&t.route, method.as_str(), rounds);
                }
                if let RequestOutcome::Failed(reason) = outcome {
                    t.metrics.failure(&t.route, reason.as_str());
                    if let Some(h) = &self.host {
                        h.failure(reason);
                    }
                }
                if let Some(h) = &self.host {
                    h.request(method);
                }
            }
            Observation::Used(feature) => self.feature(feature),
            Observation::LiveEnded { kind, outcome } => {
                t.metrics.live(&t.route, kind.as_str(), outcome.as_str());
                if let Some(h) = &self.host {
                    h.live(kind, outcome);
                }
            }
            Observation::ReplyDropped { duplicate } => {
                let kind = if duplicate { "duplicate" } else { "late" };
                t.metrics.dropped_reply(&t.route, kind);
            }
            _ => {}
        }
    }

    /// The peer used a feature only the driver sees (the GET stream, resumption), or
    /// one the machine observed.
    pub(super) fn feature(&mut self, feature: Feature) {
        if feature == Feature::Resumption {
            self.telemetry.metrics.resumption(&self.telemetry.route);
        }
        if let Some(h) = &self.host {
            h.feature(feature);
        }
    }

    /// The session ended (idempotent; also on drop).
    pub(super) fn close(&mut self) {
        if let Some(opened) = self.opened.take() {
            let t = &self.telemetry;
            t.metrics
                .session(&t.route, self.revision, self.wire, Some(opened.elapsed()));
        }
        self.started.clear();
    }
}

impl Drop for SessionTelemetry {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::Readiness;
    use dualera_adapters::{Config, Message, Request, Timestamp};
    use serde_json::{json, Value};

    fn telemetry() -> Arc<Telemetry> {
        let report = Arc::new(Report::in_memory(100));
        Arc::new(Telemetry::new(
            Arc::from("/mcp"),
            Arc::new(Metrics::new(Vec::new(), Vec::new(), report.clone())),
            report,
            Arc::new(Readiness::new(Vec::new())),
        ))
    }

    /// A 2025-11-25 session through `initialize`, sent with `client_info`.
    fn initialized(client_info: Value) -> Session {
        let mut s = Session::new(Config::default());
        s.handle_discover(
            json!({"resultType": "complete", "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}}}),
        )
        .unwrap();
        s.handle_peer_message(
            Message::Request(Request {
                id: RequestId::Number(0),
                method: "initialize".into(),
                params: Some(json!({"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": client_info})),
            }),
            Timestamp::from_millis(0),
        )
        .unwrap();
        s
    }

    fn host(t: &Arc<Telemetry>, s: &Session) -> Arc<HostRecord> {
        t.shared_session("streamable-http", s).host.clone().unwrap()
    }

    #[test]
    fn a_shared_sessions_host_is_found_again_without_the_report() {
        let t = telemetry();
        let a = initialized(json!({"name": "host-a", "version": "1"}));
        let again = initialized(json!({"name": "host-a", "version": "1"}));
        let b = initialized(json!({"name": "host-b", "version": "1"}));
        let first = host(&t, &a);
        assert_eq!(first.key().name, "host-a");
        assert!(Arc::ptr_eq(&first, &host(&t, &again)));
        assert!(Arc::ptr_eq(&first, &host(&t, &a)));
        let other = host(&t, &b);
        assert_eq!(other.key().name, "host-b");
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(t.shared_hosts.lock().unwrap().len(), 2);
        // The same host on another wire is another report row.
        let sse = t.shared_session("sse", &a).host.clone().unwrap();
        assert!(!Arc::ptr_eq(&first, &sse));
        assert_eq!(t.report.size().0, 3);
    }

    #[test]
    fn the_kept_hosts_are_bounded_and_long_client_infos_are_not_kept() {
        let t = telemetry();
        for i in 0..SHARED_HOSTS_KEPT + 8 {
            host(
                &t,
                &initialized(json!({"name": format!("h{i}"), "version": "1"})),
            );
        }
        assert_eq!(t.shared_hosts.lock().unwrap().len(), SHARED_HOSTS_KEPT);
        // The oldest went; found again, it is the report's record still.
        let h0 = initialized(json!({"name": "h0", "version": "1"}));
        let found = host(&t, &h0);
        assert_eq!(found.key().name, "h0");
        assert!(Arc::ptr_eq(&found, &host(&t, &h0)));
        let long = initialized(json!({"name": "long", "version": "x".repeat(SHARED_HOST_TEXT)}));
        let before = t.shared_hosts.lock().unwrap().len();
        let record = host(&t, &long);
        assert_eq!(record.key().name, "long");
        assert!(Arc::ptr_eq(&record, &host(&t, &long)));
        assert_eq!(t.shared_hosts.lock().unwrap().len(), before);
    }
}
