//! What the reverse bridge counts for the metrics: its answers to modern hosts by
//! route, method and outcome, the rounds it sealed, the host cancellations it heard,
//! and, read at each scrape, the partitions (legacy sessions it drives) and the host
//! requests waiting. Every label comes from a closed set (the configured routes, the
//! method table's names with `_OTHER`, the outcomes below).

use super::Bridge;
use prometheus_client::collector::Collector as PromCollector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::TypedMetric;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How a host request through the bridge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Outcome {
    /// A `complete` result.
    Complete,
    /// An `input_required` result (a round).
    InputRequired,
    /// A JSON-RPC error from the server or the bridge.
    Error,
    /// The upstream refused the credentials (401/403, relayed).
    Denied,
    /// No answer came (the session or the wait ended).
    Lost,
    /// Refused before reaching a legacy session (its `requestState`, a bound).
    Refused,
    /// Refused as a malformed 2026-07-28 request (its envelope: `_meta`, the
    /// mirrored headers, a removed method).
    Invalid,
    /// A retry sent on to the replica holding its round, which answered it.
    Forwarded,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::InputRequired => "input_required",
            Self::Error => "error",
            Self::Denied => "denied",
            Self::Lost => "lost",
            Self::Refused => "refused",
            Self::Invalid => "invalid",
            Self::Forwarded => "forwarded",
        }
    }
}

/// (route, method, outcome): the labels of one request count.
type RequestKey = (Arc<str>, &'static str, Outcome);

/// The bridge's counters.
#[derive(Debug, Default)]
pub(super) struct Stats {
    requests: Mutex<HashMap<RequestKey, u64>>,
    cancellations: AtomicU64,
}

impl Stats {
    /// A host request of `route` ended so.
    pub(super) fn request(&self, route: &Arc<str>, method: &'static str, outcome: Outcome) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.clone(), method, outcome)).or_default() += 1;
        }
    }

    /// A host request left before its answer (its host closed the stream or said so,
    /// or its wait ran out): its call is cancelled.
    pub(super) fn cancelled(&self) {
        self.cancellations.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: Arc<str>,
    mcp_method_name: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

/// The bridge's families, read at each scrape.
#[derive(Debug)]
pub struct Collector(pub Arc<Bridge>);

impl PromCollector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let bridge = &self.0;
        let mut rows: Vec<(RequestLabels, u64)> = bridge
            .stats
            .requests
            .lock()
            .map(|m| {
                m.iter()
                    .map(|((route, method, outcome), n)| {
                        let labels = RequestLabels {
                            route: route.clone(),
                            mcp_method_name: method,
                            outcome: outcome.as_str(),
                        };
                        (labels, *n)
                    })
                    .collect()
            })
            .unwrap_or_default();
        rows.sort_by(|a, b| {
            (&a.0.route, a.0.mcp_method_name, a.0.outcome).cmp(&(
                &b.0.route,
                b.0.mcp_method_name,
                b.0.outcome,
            ))
        });
        {
            let mut family = encoder.encode_descriptor(
                "dualera_bridge_requests",
                "Requests of modern hosts served by the reverse bridge (in front of legacy \
                 upstreams), by route, method and outcome",
                None,
                ConstCounter::<u64>::TYPE,
            )?;
            for (labels, n) in &rows {
                ConstCounter::new(*n).encode(family.encode_family(labels)?)?;
            }
        }
        let counters = [(
            "dualera_bridge_cancellations",
            "Legacy calls the reverse bridge cancelled for a host request that left: its host \
             closed its stream or sent notifications/cancelled, or its wait ran out",
            bridge.stats.cancellations.load(Ordering::Relaxed),
        )];
        for (name, help, value) in counters {
            let mut family =
                encoder.encode_descriptor(name, help, None, ConstCounter::<u64>::TYPE)?;
            ConstCounter::new(value).encode(family.encode_family(&NoLabels {})?)?;
        }
        let gauges = [
            (
                "dualera_bridge_partitions",
                "Legacy sessions the reverse bridge drives (one per principal, declared \
                 capabilities and upstream)",
                bridge.partitions(),
            ),
            (
                "dualera_bridge_waiting",
                "Host requests of the reverse bridge waiting for their answer",
                bridge.inflight.len(),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family =
                encoder.encode_descriptor(name, help, None, ConstGauge::<i64>::TYPE)?;
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(family.encode_family(&NoLabels {})?)?;
        }
        Ok(())
    }
}
