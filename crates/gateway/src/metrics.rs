//! The gateway's Prometheus metrics: every family, its name, help and labels, in one
//! place (the README's "Metrics" table is written from this file).
//!
//! Names follow the OpenTelemetry MCP semantic conventions where they name a thing
//! (`mcp.server.operation.duration` → `mcp_server_operation_duration_seconds`,
//! `mcp.server.session.duration`, the attributes `mcp.method.name` and
//! `mcp.protocol.version` → labels `mcp_method_name`, `mcp_protocol_version`); what
//! they do not name is `dualera_*`. Every label value comes from a closed set (enums
//! of `dualera_adapters::usage`, the revision table, the routes in the config): no
//! session id, no tool argument, no method name a client made up (those fold into
//! `_OTHER`), so a peer cannot grow the number of series.
//!
//! Built on the `prometheus-client` crate (the Prometheus project's Rust client):
//! typed label sets, one registry per gateway (no global state, so several gateways in
//! one process keep their own counts), and both exposition formats — OpenMetrics text
//! for scrapers that ask for it, the Prometheus text format 0.0.4 otherwise.
//! `metrics` + `metrics-exporter-prometheus` was the other candidate; its global
//! recorder and string labels built per call fit a bounded, per-gateway set less well.

use super::cache::ResponseCache;
use super::upstream::balance::State;
use super::upstream::UpstreamPool;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;

/// Latency buckets, in seconds: the OpenTelemetry MCP conventions' boundaries
/// (`0.01` … `300`) with four finer ones below them, so that pass-through latencies
/// (well under 10 ms) are not all in the first bucket.
const LATENCY_BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
/// Session duration buckets, in seconds (OpenTelemetry MCP conventions, plus longer
/// ones: legacy sessions live for minutes to hours).
const SESSION_BUCKETS: [f64; 17] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
    14400.0,
];
/// MRTR rounds per request.
const ROUND_BUCKETS: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0];

/// The era of a request: a legacy session's, or modern pass-through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// A legacy session (any wire).
    Legacy,
    /// Modern pass-through.
    Modern,
}

impl Era {
    fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "legacy",
            Era::Modern => "modern",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: Arc<str>,
    era: &'static str,
    mcp_method_name: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    route: Arc<str>,
    era: &'static str,
    mcp_method_name: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    route: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SessionLabels {
    route: Arc<str>,
    mcp_protocol_version: &'static str,
    wire: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LiveLabels {
    route: Arc<str>,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    route: Arc<str>,
    mcp_method_name: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    route: Arc<str>,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

fn session_length() -> Histogram {
    Histogram::new(SESSION_BUCKETS)
}

fn rounds() -> Histogram {
    Histogram::new(ROUND_BUCKETS)
}

/// The gateway's metric families and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Histograms<DurationLabels>,
    failures: Family<FailureLabels, Counter>,
    sessions_open: Family<SessionLabels, Gauge>,
    session_duration: Histograms<SessionLabels>,
    live: Family<LiveLabels, Counter>,
    dropped_replies: Family<KindLabels, Counter>,
    rounds: Histograms<MethodLabels>,
    resumptions: Family<RouteLabels, Counter>,
    upstream_errors: Family<KindLabels, Counter>,
    connections: Family<ListenerLabels, Gauge>,
    ready: Family<RouteLabels, Gauge>,
    upstream_era: Family<EraLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EraLabels {
    route: Arc<str>,
    era: &'static str,
}

impl Metrics {
    /// Every family, registered; `caches` and the routes' upstream `pools` are read at
    /// each scrape.
    pub fn new(
        caches: Vec<Arc<ResponseCache>>,
        pools: Vec<(Arc<str>, Arc<UpstreamPool>)>,
        report: Arc<super::report::Report>,
    ) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "dualera_requests",
            "MCP requests served, by route, era (legacy session or modern pass-through), \
             method and outcome (ok, error, failed inside the gateway, cancelled by the host)",
            requests.clone(),
        );
        let duration: Histograms<DurationLabels> = Family::new_with_constructor(latency);
        registry.register_with_unit(
            "mcp_server_operation_duration",
            "MCP request duration as observed by the gateway, from the request's arrival to \
             its final response (pass-through: to the upstream's response head)",
            Unit::Seconds,
            duration.clone(),
        );
        let failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "dualera_request_failures",
            "Legacy requests that failed inside the gateway, by reason",
            failures.clone(),
        );
        let sessions_open = Family::<SessionLabels, Gauge>::default();
        registry.register(
            "dualera_sessions_open",
            "Legacy sessions open, by negotiated revision and wire",
            sessions_open.clone(),
        );
        let session_duration: Histograms<SessionLabels> =
            Family::new_with_constructor(session_length);
        registry.register_with_unit(
            "mcp_server_session_duration",
            "Duration of the legacy sessions that ended",
            Unit::Seconds,
            session_duration.clone(),
        );
        let live = Family::<LiveLabels, Counter>::default();
        registry.register(
            "dualera_live_requests",
            "Live requests sent to legacy hosts for MRTR rounds, by kind and outcome",
            live.clone(),
        );
        let dropped_replies = Family::<KindLabels, Counter>::default();
        registry.register(
            "dualera_dropped_replies",
            "Host replies to live requests accepted and dropped: late (the gateway had \
             cancelled, abandoned or timed out the request) or duplicate",
            dropped_replies.clone(),
        );
        let rounds: Histograms<MethodLabels> = Family::new_with_constructor(rounds);
        registry.register(
            "dualera_request_rounds",
            "MRTR rounds (input_required answers) per legacy request that may take them",
            rounds.clone(),
        );
        let resumptions = Family::<RouteLabels, Counter>::default();
        registry.register(
            "dualera_resumptions",
            "Streams resumed with Last-Event-ID",
            resumptions.clone(),
        );
        let upstream_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "dualera_upstream_errors",
            "Upstream exchanges that failed without an MCP answer, by kind",
            upstream_errors.clone(),
        );
        let connections = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "dualera_connections_open",
            "TCP connections open, by listener",
            connections.clone(),
        );
        let ready = Family::<RouteLabels, Gauge>::default();
        registry.register(
            "dualera_upstream_ready",
            "1 when the route's upstream answered the last server/discover probe",
            ready.clone(),
        );
        let upstream_era = Family::<EraLabels, Gauge>::default();
        registry.register(
            "dualera_upstream_era",
            "1 for the era of the route's upstream as configured or probed: modern, \
             legacy (a legacy upstream), or unknown (not probed yet, or the probe failed)",
            upstream_era.clone(),
        );
        registry.register_collector(Box::new(CacheCollector(caches)));
        registry.register_collector(Box::new(UpstreamCollector(pools)));
        registry.register_collector(Box::new(ReportCollector(report)));
        Self {
            registry,
            requests,
            duration,
            failures,
            sessions_open,
            session_duration,
            live,
            dropped_replies,
            rounds,
            resumptions,
            upstream_errors,
            connections,
            ready,
            upstream_era,
        }
    }

    /// Exposes the gateway's legacy upstream session pool.
    pub fn with_upstream_sessions(
        mut self,
        pool: Arc<super::upstream::legacy::SessionPool>,
    ) -> Self {
        self.registry
            .register_collector(Box::new(UpstreamSessionsCollector(pool)));
        self
    }

    /// Exposes another collector's families (the reverse bridge's).
    pub fn with_collector(mut self, collector: Box<dyn Collector>) -> Self {
        self.registry.register_collector(collector);
        self
    }

    /// The era of the route's upstream (`None`: unknown).
    pub fn upstream_era(&self, route: &Arc<str>, era: Option<super::upstream::era::Era>) {
        let now = era.map_or("unknown", super::upstream::era::Era::as_str);
        for label in ["modern", "legacy", "unknown"] {
            self.upstream_era
                .get_or_create(&EraLabels {
                    route: route.clone(),
                    era: label,
                })
                .set(i64::from(label == now));
        }
    }

    /// One request ended.
    pub fn request(
        &self,
        route: &Arc<str>,
        era: Era,
        method: &'static str,
        outcome: &'static str,
        elapsed: Option<Duration>,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.clone(),
                era: era.as_str(),
                mcp_method_name: method,
                outcome,
            })
            .inc();
        if let Some(elapsed) = elapsed {
            self.duration
                .get_or_create(&DurationLabels {
                    route: route.clone(),
                    era: era.as_str(),
                    mcp_method_name: method,
                })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// A legacy request failed inside the gateway.
    pub fn failure(&self, route: &Arc<str>, reason: &'static str) {
        self.failures
            .get_or_create(&FailureLabels {
                route: route.clone(),
                reason,
            })
            .inc();
    }

    /// The rounds one legacy request took.
    pub fn rounds(&self, route: &Arc<str>, method: &'static str, rounds: u32) {
        self.rounds
            .get_or_create(&MethodLabels {
                route: route.clone(),
                mcp_method_name: method,
            })
            .observe(f64::from(rounds));
    }

    /// A legacy session opened (`+1`) or closed (`-1`, with its duration).
    pub fn session(
        &self,
        route: &Arc<str>,
        revision: &'static str,
        wire: &'static str,
        closed_after: Option<Duration>,
    ) {
        let labels = SessionLabels {
            route: route.clone(),
            mcp_protocol_version: revision,
            wire,
        };
        match closed_after {
            None => {
                self.sessions_open.get_or_create(&labels).inc();
            }
            Some(d) => {
                self.sessions_open.get_or_create(&labels).dec();
                self.session_duration
                    .get_or_create(&labels)
                    .observe(d.as_secs_f64());
            }
        }
    }

    /// A live request ended.
    pub fn live(&self, route: &Arc<str>, kind: &'static str, outcome: &'static str) {
        self.live
            .get_or_create(&LiveLabels {
                route: route.clone(),
                kind,
                outcome,
            })
            .inc();
    }

    /// A host reply was accepted and dropped (`kind`: `late` or `duplicate`).
    pub fn dropped_reply(&self, route: &Arc<str>, kind: &'static str) {
        self.dropped_replies
            .get_or_create(&KindLabels {
                route: route.clone(),
                kind,
            })
            .inc();
    }

    /// A stream was resumed with `Last-Event-ID`.
    pub fn resumption(&self, route: &Arc<str>) {
        self.resumptions
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .inc();
    }

    /// An upstream exchange failed.
    pub fn upstream_error(&self, route: &Arc<str>, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&KindLabels {
                route: route.clone(),
                kind,
            })
            .inc();
    }

    /// The gauge of open connections on `listener` (`gateway` or `admin`).
    pub fn connections(&self, listener: &'static str) -> Gauge {
        self.connections
            .get_or_create_owned(&ListenerLabels { listener })
    }

    /// The route's readiness as the last probe found it.
    pub fn ready(&self, route: &Arc<str>, ready: bool) {
        self.ready
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .set(i64::from(ready));
    }

    /// The exposition: OpenMetrics text when `openmetrics`, else the Prometheus text
    /// format 0.0.4. Returns the body and its content type.
    pub fn encode(&self, openmetrics: bool) -> (String, &'static str) {
        let mut out = String::with_capacity(16 * 1024);
        if openmetrics {
            // Writing to a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
            (
                out,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        } else {
            let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
            (
                out,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )
        }
    }
}

/// The response cache's counters (`ResponseCache::stats`), read at each scrape.
#[derive(Debug)]
struct CacheCollector(Vec<Arc<ResponseCache>>);

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    labels: &impl EncodeLabelSet,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    let mut family = encoder.encode_descriptor(name, help, None, ConstCounter::<u64>::TYPE)?;
    metric.encode(family.encode_family(labels)?)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    labels: &impl EncodeLabelSet,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    let mut family = encoder.encode_descriptor(name, help, unit, ConstGauge::<i64>::TYPE)?;
    metric.encode(family.encode_family(labels)?)
}

/// One family of the cache collector: its name, help, unit, and how to read it.
struct CacheFamily {
    name: &'static str,
    help: &'static str,
    gauge: Option<Option<Unit>>,
    read: fn(&super::cache::CacheStats) -> u64,
}

const CACHE_FAMILIES: [CacheFamily; 9] = [
    CacheFamily {
        name: "dualera_cache_hits",
        help: "Requests answered from a fresh cache entry",
        gauge: None,
        read: |s| s.hits,
    },
    CacheFamily {
        name: "dualera_cache_misses",
        help: "Cacheable requests that went upstream",
        gauge: None,
        read: |s| s.misses,
    },
    CacheFamily {
        name: "dualera_cache_coalesced",
        help: "Requests answered from a concurrent identical request's upstream result",
        gauge: None,
        read: |s| s.coalesced,
    },
    CacheFamily {
        name: "dualera_cache_stored",
        help: "Results stored in the cache",
        gauge: None,
        read: |s| s.stored,
    },
    CacheFamily {
        name: "dualera_cache_evictions",
        help: "Cache entries evicted to stay within the bounds",
        gauge: None,
        read: |s| s.evictions,
    },
    CacheFamily {
        name: "dualera_cache_invalidations",
        help: "Cache entries dropped by a notification or a failed tool call",
        gauge: None,
        read: |s| s.invalidations,
    },
    CacheFamily {
        name: "dualera_cache_stale_served",
        help: "Stale cache entries served because the re-fetch failed",
        gauge: None,
        read: |s| s.stale_served,
    },
    CacheFamily {
        name: "dualera_cache_entries",
        help: "Cache entries held",
        gauge: Some(None),
        read: |s| s.entries,
    },
    CacheFamily {
        name: "dualera_cache_weight",
        help: "Cache weight held (each entry weighs its bytes, at least max_bytes / max_entries)",
        gauge: Some(Some(Unit::Bytes)),
        read: |s| s.weight,
    },
];

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // One descriptor per family, one sample per route: a family named twice is
        // not valid exposition.
        let stats: Vec<(RouteLabels, super::cache::CacheStats)> = self
            .0
            .iter()
            .map(|c| {
                (
                    RouteLabels {
                        route: c.route().clone(),
                    },
                    c.stats(),
                )
            })
            .collect();
        for f in &CACHE_FAMILIES {
            match &f.gauge {
                None => {
                    let mut family = encoder.encode_descriptor(
                        f.name,
                        f.help,
                        None,
                        ConstCounter::<u64>::TYPE,
                    )?;
                    for (labels, s) in &stats {
                        ConstCounter::new((f.read)(s)).encode(family.encode_family(labels)?)?;
                    }
                }
                Some(unit) => {
                    let mut family = encoder.encode_descriptor(
                        f.name,
                        f.help,
                        unit.as_ref(),
                        ConstGauge::<i64>::TYPE,
                    )?;
                    for (labels, s) in &stats {
                        let v = i64::try_from((f.read)(s)).unwrap_or(i64::MAX);
                        ConstGauge::new(v).encode(family.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Each route's upstream instances (their health, and requests sent on to another
/// instance), read at each scrape.
#[derive(Debug)]
struct UpstreamCollector(Vec<(Arc<str>, Arc<UpstreamPool>)>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    route: Arc<str>,
    instance: String,
}

impl Collector for UpstreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        {
            let mut family = encoder.encode_descriptor(
                "dualera_upstream_instance_up",
                "1 while the instance takes requests; 0 while it is skipped after a \
                 connection that could not be made (until its backoff ends)",
                None,
                ConstGauge::<i64>::TYPE,
            )?;
            for (route, pool) in &self.0 {
                for st in pool.status() {
                    let labels = InstanceLabels {
                        route: route.clone(),
                        instance: st.label,
                    };
                    let up = i64::from(st.state == State::Healthy);
                    ConstGauge::new(up).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "dualera_upstream_failovers",
            "Requests sent on to another instance because one could not be reached",
            None,
            ConstCounter::<u64>::TYPE,
        )?;
        for (route, pool) in &self.0 {
            let labels = RouteLabels {
                route: route.clone(),
            };
            ConstCounter::new(pool.failovers()).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The gateway's sessions to legacy upstreams (the pool's counters), read at each
/// scrape.
#[derive(Debug)]
struct UpstreamSessionsCollector(Arc<super::upstream::legacy::SessionPool>);

impl Collector for UpstreamSessionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let stats = self.0.stats();
        gauge(
            e,
            "dualera_upstream_sessions_open",
            "Legacy sessions the gateway holds to legacy upstreams (and is opening)",
            None,
            &NoLabels {},
            i64::try_from(self.0.len()).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "dualera_upstream_sessions_opened",
            "Legacy upstream sessions opened",
            &NoLabels {},
            stats.opened,
        )?;
        counter(
            e,
            "dualera_upstream_sessions_idle_closed",
            "Legacy upstream sessions closed unused past upstream_session_idle_ms",
            &NoLabels {},
            stats.idle_closed,
        )?;
        counter(
            e,
            "dualera_upstream_sessions_dropped",
            "Legacy upstream sessions dropped: expired (404), ended, or a failed ping",
            &NoLabels {},
            stats.dropped,
        )?;
        counter(
            e,
            "dualera_upstream_sessions_refused",
            "Legacy upstream sessions refused by max_upstream_sessions or \
             max_upstream_sessions_per_key",
            &NoLabels {},
            stats.refused,
        )
    }
}

/// The migration report's size, read at each scrape.
#[derive(Debug)]
struct ReportCollector(Arc<super::report::Report>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

impl Collector for ReportCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (hosts, folded) = self.0.size();
        let e = &mut encoder;
        gauge(
            e,
            "dualera_report_hosts",
            "Host identities the migration report keeps",
            None,
            &NoLabels {},
            i64::try_from(hosts).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "dualera_report_folded",
            "Sessions of new host identities folded into the report's overflow row ([report] max_hosts reached)",
            &NoLabels {},
            folded,
        )
    }
}
