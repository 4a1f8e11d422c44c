//! The migration report: which hosts still depend on the legacy era, and for what.
//!
//! One row per host identity — route, era, `clientInfo` name and version, negotiated
//! revision, wire — with when it was first and last seen, its sessions, its requests by
//! method, the legacy features it used (counts; the session machine observes them, see
//! `dualera_adapters::usage`), how its live requests ended, its failures by reason, and
//! a verdict in words. Modern pass-through clients have rows too; their verdict is
//! "already modern".
//!
//! `clientInfo` is whatever the host sent: every string kept is stripped of control and
//! bidirectional-formatting characters and cut to a few dozen characters, and the
//! number of identities is bounded (`[report] max_hosts`); the sessions of identities
//! beyond it are counted in one overflow row per route and era, so counts are never
//! lost. Rendering escapes everything again ([`html`], [`text`]).
//!
//! Counters are atomics in a record each session holds, so recording costs no lookup;
//! with `[report] path` set, changed records are written to a SQLite file every few
//! seconds and at shutdown ([`store`]), and loaded at start-up, so a trial survives
//! restarts.

pub mod html;
// The file needs SQLite (the `sqlite` feature); without it, `no_store` refuses a path.
#[cfg(feature = "sqlite")]
mod store;
#[cfg(not(feature = "sqlite"))]
#[path = "no_store.rs"]
mod store;
pub mod text;

use super::metrics::Era;
pub use dualera_adapters::time::rfc3339;
use dualera_adapters::usage::{self, FailureReason, Feature, LiveKind, LiveOutcome, Method};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use store::ReportError;

/// Longest `clientInfo.name` kept, in characters.
const MAX_NAME_CHARS: usize = 64;
/// Longest `clientInfo.version` (and revision) kept, in characters.
const MAX_VERSION_CHARS: usize = 32;
/// The name of the overflow row.
pub const OVERFLOW_NAME: &str = "(other hosts: [report] max_hosts reached)";
/// The name of a host that sent no usable `clientInfo`.
pub const UNNAMED: &str = "(no clientInfo)";
/// How often changed records are written to the SQLite file.
const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// The `[report]` settings.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// The SQLite file the report is kept in across restarts (none: memory only).
    pub path: Option<PathBuf>,
    /// Most host identities kept.
    pub max_hosts: usize,
}

impl Default for ReportConfig {
    fn default() -> Self {
        Self {
            path: None,
            max_hosts: 1000,
        }
    }
}

impl ReportConfig {
    /// Defaults overridden by a config file's `[report]` section.
    pub fn from_section(s: &crate::config::ReportSection) -> Self {
        let d = Self::default();
        Self {
            path: s.path.clone(),
            max_hosts: s.max_hosts.unwrap_or(d.max_hosts).max(1),
        }
    }
}

/// Keeps what is printable of `s`: no control or bidirectional-formatting characters,
/// surrounding white space trimmed, at most `max` characters (an ellipsis marks a cut).
pub fn sanitize(s: &str, max: usize) -> String {
    // The usual name or version, printable ASCII with nothing to trim, is kept as it
    // is (a shared session's step sanitizes its host's on every step).
    if s.len() <= max
        && s.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && !s.starts_with(' ')
        && !s.ends_with(' ')
    {
        return s.to_owned();
    }
    let kept: String = s
        .chars()
        .filter(|c| !c.is_control() && !is_invisible_format(*c))
        .collect();
    let kept = kept.trim();
    if kept.chars().count() <= max {
        return kept.to_owned();
    }
    let mut out: String = kept.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Unicode format characters that reorder or hide text (bidirectional overrides and
/// isolates, zero-width characters, the byte-order mark).
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2069}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// Milliseconds since the Unix epoch.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Who a row is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostKey {
    /// The route (endpoint path) the host used.
    pub route: Arc<str>,
    /// Legacy session or modern pass-through.
    pub era: EraName,
    /// `clientInfo.name`, sanitized.
    pub name: String,
    /// `clientInfo.version`, sanitized.
    pub version: String,
    /// The negotiated revision (modern: the one it sent).
    pub revision: String,
    /// The wire (`streamable-http`, `http+sse`, `websocket`, `stdio`).
    pub wire: String,
}

/// The era of a row, ordered legacy first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EraName {
    /// A legacy session.
    Legacy,
    /// Modern pass-through.
    Modern,
}

impl From<Era> for EraName {
    fn from(e: Era) -> Self {
        match e {
            Era::Legacy => EraName::Legacy,
            Era::Modern => EraName::Modern,
        }
    }
}

impl HostKey {
    /// The key of a host from what it sent (`clientInfo` members, possibly absent or
    /// not strings), sanitized.
    pub fn new(
        route: &Arc<str>,
        era: Era,
        name: Option<&str>,
        version: Option<&str>,
        revision: &str,
        wire: &str,
    ) -> Self {
        let name = name
            .map(|n| sanitize(n, MAX_NAME_CHARS))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| UNNAMED.to_owned());
        Self {
            route: route.clone(),
            era: era.into(),
            name,
            version: version
                .map(|v| sanitize(v, MAX_VERSION_CHARS))
                .unwrap_or_default(),
            revision: sanitize(revision, MAX_VERSION_CHARS),
            wire: sanitize(wire, MAX_VERSION_CHARS),
        }
    }

    /// The key of a legacy host from its `initialize` `clientInfo`.
    pub fn legacy(
        route: &Arc<str>,
        client_info: Option<&Value>,
        revision: &str,
        wire: &str,
    ) -> Self {
        let field = |k: &str| client_info.and_then(|c| c.get(k)).and_then(Value::as_str);
        Self::new(
            route,
            Era::Legacy,
            field("name"),
            field("version"),
            revision,
            wire,
        )
    }

    fn overflow(&self) -> Self {
        Self {
            route: self.route.clone(),
            era: self.era,
            name: OVERFLOW_NAME.to_owned(),
            version: String::new(),
            revision: String::new(),
            wire: String::new(),
        }
    }
}

fn counters<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

/// The counters of one host identity. Shared by every session of that host; each
/// method updates `last_seen` and marks the record for the next write to the file.
#[derive(Debug)]
pub struct HostRecord {
    key: HostKey,
    first_seen: AtomicU64,
    last_seen: AtomicU64,
    sessions: AtomicU64,
    requests: [AtomicU64; Method::ALL.len()],
    features: [AtomicU64; Feature::ALL.len()],
    live: [[AtomicU64; LiveOutcome::ALL.len()]; LiveKind::ALL.len()],
    failures: [AtomicU64; FailureReason::ALL.len()],
    dirty: AtomicBool,
}

impl HostRecord {
    fn new(key: HostKey) -> Self {
        let now = unix_ms();
        Self {
            key,
            first_seen: AtomicU64::new(now),
            last_seen: AtomicU64::new(now),
            sessions: AtomicU64::new(0),
            requests: counters(),
            features: counters(),
            live: std::array::from_fn(|_| counters()),
            failures: counters(),
            dirty: AtomicBool::new(true),
        }
    }

    /// Who this record is about.
    pub fn key(&self) -> &HostKey {
        &self.key
    }

    fn bump(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
        self.last_seen.fetch_max(unix_ms(), Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// A session of this host started.
    pub fn session(&self) {
        self.bump(&self.sessions);
    }

    /// A request of this host ended.
    pub fn request(&self, method: Method) {
        self.bump(&self.requests[method.index()]);
    }

    /// This host used a legacy feature once.
    pub fn feature(&self, feature: Feature) {
        self.bump(&self.features[feature.index()]);
    }

    /// A live request to this host ended.
    pub fn live(&self, kind: LiveKind, outcome: LiveOutcome) {
        self.bump(&self.live[kind.index()][outcome.index()]);
    }

    /// A request of this host failed inside the gateway.
    pub fn failure(&self, reason: FailureReason) {
        self.bump(&self.failures[reason.index()]);
    }

    /// Adds the counts of a stored row (loaded at start-up).
    fn absorb(&self, row: &HostReport) {
        let add = |c: &AtomicU64, v: u64| {
            c.fetch_add(v, Ordering::Relaxed);
        };
        self.first_seen
            .fetch_min(row.first_seen_ms, Ordering::Relaxed);
        self.last_seen
            .fetch_max(row.last_seen_ms, Ordering::Relaxed);
        add(&self.sessions, row.sessions);
        for (name, v) in &row.requests {
            let m = Method::ALL
                .iter()
                .copied()
                .find(|m| m.as_str() == name)
                .unwrap_or(Method::Other);
            add(&self.requests[m.index()], *v);
        }
        for (name, v) in &row.features {
            if let Some(f) = Feature::from_name(name) {
                add(&self.features[f.index()], *v);
            }
        }
        for (kind, outcomes) in &row.live {
            let Some(k) = LiveKind::ALL.iter().find(|k| k.as_str() == kind) else {
                continue;
            };
            for (outcome, v) in outcomes {
                if let Some(o) = LiveOutcome::ALL.iter().find(|o| o.as_str() == outcome) {
                    add(&self.live[k.index()][o.index()], *v);
                }
            }
        }
        for (name, v) in &row.failures {
            if let Some(r) = FailureReason::from_name(name) {
                add(&self.failures[r.index()], *v);
            }
        }
    }

    /// The record as a report row.
    pub fn snapshot(&self) -> HostReport {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let nonzero = |pairs: Vec<(&'static str, u64)>| -> BTreeMap<String, u64> {
            pairs
                .into_iter()
                .filter(|(_, v)| *v > 0)
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        };
        let requests = nonzero(
            Method::ALL
                .iter()
                .map(|m| (m.as_str(), r(&self.requests[m.index()])))
                .collect(),
        );
        let features = nonzero(
            Feature::ALL
                .iter()
                .map(|f| (f.as_str(), r(&self.features[f.index()])))
                .collect(),
        );
        let live: BTreeMap<String, BTreeMap<String, u64>> = LiveKind::ALL
            .iter()
            .map(|k| {
                let outcomes = nonzero(
                    LiveOutcome::ALL
                        .iter()
                        .map(|o| (o.as_str(), r(&self.live[k.index()][o.index()])))
                        .collect(),
                );
                (k.as_str().to_owned(), outcomes)
            })
            .filter(|(_, o)| !o.is_empty())
            .collect();
        let failures = nonzero(
            FailureReason::ALL
                .iter()
                .map(|f| (f.as_str(), r(&self.failures[f.index()])))
                .collect(),
        );
        let used = Feature::ALL
            .iter()
            .copied()
            .filter(|f| r(&self.features[f.index()]) > 0);
        let (needs, verdict) = match self.key.era {
            EraName::Modern => (Vec::new(), usage::VERDICT_MODERN.to_owned()),
            EraName::Legacy => {
                let needs = usage::needs(used);
                let verdict = if needs.is_empty() {
                    usage::VERDICT_DIRECT.to_owned()
                } else {
                    needs.join("; ")
                };
                (needs, verdict)
            }
        };
        let first = r(&self.first_seen);
        let last = r(&self.last_seen);
        HostReport {
            route: self.key.route.to_string(),
            era: self.key.era,
            name: self.key.name.clone(),
            version: self.key.version.clone(),
            revision: self.key.revision.clone(),
            wire: self.key.wire.clone(),
            first_seen: rfc3339(first),
            last_seen: rfc3339(last),
            first_seen_ms: first,
            last_seen_ms: last,
            sessions: r(&self.sessions),
            request_total: requests.values().sum(),
            requests,
            features,
            live,
            failures,
            needs,
            verdict,
        }
    }
}

/// One row of the report (the JSON of `GET /report`, and what the SQLite file keeps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostReport {
    /// The route the host used.
    pub route: String,
    /// `legacy` or `modern`.
    pub era: EraName,
    /// `clientInfo.name` (sanitized).
    pub name: String,
    /// `clientInfo.version` (sanitized).
    pub version: String,
    /// The negotiated revision.
    pub revision: String,
    /// The wire.
    pub wire: String,
    /// First seen (RFC 3339, UTC).
    pub first_seen: String,
    /// Last seen (RFC 3339, UTC).
    pub last_seen: String,
    /// First seen, Unix milliseconds.
    pub first_seen_ms: u64,
    /// Last seen, Unix milliseconds.
    pub last_seen_ms: u64,
    /// Sessions opened (0 for modern clients: they have none).
    pub sessions: u64,
    /// Requests, all methods.
    pub request_total: u64,
    /// Requests by method (`_OTHER` for methods outside the table).
    pub requests: BTreeMap<String, u64>,
    /// Legacy features used, with counts.
    pub features: BTreeMap<String, u64>,
    /// Live requests by kind, then outcome.
    pub live: BTreeMap<String, BTreeMap<String, u64>>,
    /// Failures inside the gateway by reason.
    pub failures: BTreeMap<String, u64>,
    /// What the host still needs to talk 2026-07-28 directly, one sentence each.
    pub needs: Vec<String>,
    /// The verdict in words.
    pub verdict: String,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportSnapshot {
    /// When it was taken (RFC 3339, UTC).
    pub generated_at: String,
    /// The bound on host identities.
    pub max_hosts: usize,
    /// Sessions of identities beyond the bound, counted in the overflow rows.
    pub folded: u64,
    /// One row per host identity: legacy first, then by name.
    pub hosts: Vec<HostReport>,
    /// The routes whose upstream is a legacy server: route path → `legacy upstream
    /// (<transport>)`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub upstreams: BTreeMap<String, String>,
}

/// The report: every host identity's record, bounded, optionally kept in SQLite.
#[derive(Debug)]
pub struct Report {
    hosts: Mutex<HashMap<HostKey, Arc<HostRecord>>>,
    max_hosts: usize,
    folded: AtomicU64,
    store: Option<store::Store>,
    /// Route path → how its upstream is named ([`ReportSnapshot::upstreams`]).
    upstreams: Mutex<BTreeMap<String, String>>,
}

/// Routes whose upstream the report names (routes come from the configuration; this
/// only keeps a misuse from growing the map).
const MAX_UPSTREAMS: usize = 1024;

impl Report {
    /// A report in memory only.
    pub fn in_memory(max_hosts: usize) -> Self {
        Self {
            hosts: Mutex::new(HashMap::new()),
            max_hosts: max_hosts.max(1),
            folded: AtomicU64::new(0),
            store: None,
            upstreams: Mutex::new(BTreeMap::new()),
        }
    }

    /// Names the upstream of `route` when it is a legacy one (`legacy upstream (…)`);
    /// `None` (a modern upstream) takes the name away: the report names only what
    /// differs from the default.
    pub fn upstream(&self, route: &str, named: Option<String>) {
        if let Ok(mut u) = self.upstreams.lock() {
            match named {
                None => {
                    u.remove(route);
                }
                Some(n) if u.len() < MAX_UPSTREAMS || u.contains_key(route) => {
                    u.insert(route.to_owned(), n);
                }
                Some(_) => {}
            }
        }
    }

    /// A report as configured: with a path, the SQLite file is opened (created if
    /// missing) and its rows loaded.
    pub fn open(config: &ReportConfig) -> Result<Self, ReportError> {
        let mut report = Self::in_memory(config.max_hosts);
        let Some(path) = &config.path else {
            return Ok(report);
        };
        let store = store::Store::open(path)?;
        for row in store.load(report.max_hosts)? {
            let key = HostKey {
                route: Arc::from(sanitize(&row.route, MAX_NAME_CHARS)),
                era: row.era,
                name: sanitize(&row.name, MAX_NAME_CHARS),
                version: sanitize(&row.version, MAX_VERSION_CHARS),
                revision: sanitize(&row.revision, MAX_VERSION_CHARS),
                wire: sanitize(&row.wire, MAX_VERSION_CHARS),
            };
            let record = report.entry(key);
            record.absorb(&row);
            record.dirty.store(false, Ordering::Relaxed);
        }
        report.store = Some(store);
        Ok(report)
    }

    fn entry(&self, key: HostKey) -> Arc<HostRecord> {
        let Ok(mut hosts) = self.hosts.lock() else {
            return Arc::new(HostRecord::new(key));
        };
        if let Some(r) = hosts.get(&key) {
            return r.clone();
        }
        let key = if hosts.len() >= self.max_hosts && key.name != OVERFLOW_NAME {
            self.folded.fetch_add(1, Ordering::Relaxed);
            key.overflow()
        } else {
            key
        };
        hosts
            .entry(key.clone())
            .or_insert_with(|| Arc::new(HostRecord::new(key)))
            .clone()
    }

    /// The record of `key`, created if new (or the overflow row's, past the bound).
    pub fn host(&self, key: HostKey) -> Arc<HostRecord> {
        self.entry(key)
    }

    /// How many identities are kept, and how many sessions were folded.
    pub fn size(&self) -> (usize, u64) {
        let n = self.hosts.lock().map_or(0, |h| h.len());
        (n, self.folded.load(Ordering::Relaxed))
    }

    /// Every row, legacy first, then by route, name, version, revision and wire.
    pub fn snapshot(&self) -> ReportSnapshot {
        let mut records: Vec<Arc<HostRecord>> = self
            .hosts
            .lock()
            .map(|h| h.values().cloned().collect())
            .unwrap_or_default();
        records.sort_by(|a, b| {
            (a.key.era, &a.key.route, &a.key.name, &a.key.version)
                .cmp(&(b.key.era, &b.key.route, &b.key.name, &b.key.version))
                .then_with(|| (&a.key.revision, &a.key.wire).cmp(&(&b.key.revision, &b.key.wire)))
        });
        ReportSnapshot {
            generated_at: rfc3339(unix_ms()),
            max_hosts: self.max_hosts,
            folded: self.folded.load(Ordering::Relaxed),
            hosts: records.iter().map(|r| r.snapshot()).collect(),
            upstreams: self.upstreams.lock().map(|u| u.clone()).unwrap_or_default(),
        }
    }

    /// Writes the changed records to the SQLite file, if there is one. Blocking.
    pub fn flush(&self) -> Result<(), ReportError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let dirty: Vec<Arc<HostRecord>> = self
            .hosts
            .lock()
            .map(|h| {
                h.values()
                    .filter(|r| r.dirty.swap(false, Ordering::Relaxed))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if dirty.is_empty() {
            return Ok(());
        }
        let rows: Vec<HostReport> = dirty.iter().map(|r| r.snapshot()).collect();
        if let Err(e) = store.save(&rows) {
            for r in &dirty {
                r.dirty.store(true, Ordering::Relaxed);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Whether the report is kept in a file.
    pub fn persistent(&self) -> bool {
        self.store.is_some()
    }
}

/// Writes the report's changes to its file every few seconds, until aborted (the
/// gateway flushes once more when it stops).
pub async fn flush_loop(report: Arc<Report>) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let r = report.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || r.flush()).await {
            tracing::warn!(error = %e, "migration report not saved");
        }
    }
}

/// Fetches `GET <admin>/report` from a gateway's admin listener (`dualera report`).
pub async fn fetch(admin: &str, token: Option<&str>) -> Result<bytes::Bytes, String> {
    use http_body_util::BodyExt;
    let base = admin.trim_end_matches('/');
    let uri: http::Uri = format!("{base}/report")
        .parse()
        .map_err(|e| format!("bad admin URL {admin:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "the admin URL must be http://host:port, got {admin:?}"
        ));
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let mut req = http::Request::get(uri).header(http::header::ACCEPT, "application/json");
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(crate::body::empty()).map_err(|e| e.to_string())?;
    let fetch = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("cannot reach the admin listener at {admin}: {e}"))?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024 * 1024)
            .collect()
            .await
            .map_err(|e| format!("reading {admin}/report: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{admin}/report answered {status}: {}",
                sanitize(&String::from_utf8_lossy(&body), 200)
            ));
        }
        Ok(body)
    };
    tokio::time::timeout(Duration::from_secs(30), fetch)
        .await
        .map_err(|_| format!("{admin}/report did not answer within 30 s"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_strips_controls_and_bidi_and_bounds_length() {
        assert_eq!(sanitize(" a\u{1b}[31mb\u{202e}c\n ", 10), "a[31mbc");
        assert_eq!(sanitize("abcdef", 4), "abc…");
        assert_eq!(sanitize("\u{200b}", 4), "");
        // The printable-ASCII shortcut agrees with the general path.
        assert_eq!(sanitize("claude-code 1.2", 15), "claude-code 1.2");
        assert_eq!(sanitize(" padded ", 15), "padded");
        assert_eq!(sanitize("abcd", 4), "abcd");
        assert_eq!(sanitize("abcde", 4), "abc…");
    }

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_785_231_000_123), "2026-07-28T09:30:00.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn identities_are_bounded_and_overflow_is_counted() {
        let route: Arc<str> = Arc::from("/mcp");
        let report = Report::in_memory(2);
        for name in ["a", "b", "c", "d"] {
            report
                .host(HostKey::new(
                    &route,
                    Era::Legacy,
                    Some(name),
                    Some("1"),
                    "2025-11-25",
                    "stdio",
                ))
                .session();
        }
        let snap = report.snapshot();
        assert_eq!(snap.hosts.len(), 3);
        assert_eq!(snap.folded, 2);
        let overflow = snap.hosts.iter().find(|h| h.name == OVERFLOW_NAME).unwrap();
        assert_eq!(overflow.sessions, 2);
    }

    #[test]
    fn verdicts() {
        let route: Arc<str> = Arc::from("/mcp");
        let report = Report::in_memory(10);
        let legacy = report.host(HostKey::new(
            &route,
            Era::Legacy,
            Some("l"),
            None,
            "2025-06-18",
            "streamable-http",
        ));
        legacy.request(Method::ToolsCall);
        assert_eq!(legacy.snapshot().verdict, usage::VERDICT_DIRECT);
        legacy.feature(Feature::Sampling);
        assert_eq!(
            legacy.snapshot().verdict,
            "answers sampling live: needs an MRTR-capable client"
        );
        let modern = report.host(HostKey::new(
            &route,
            Era::Modern,
            None,
            None,
            "2026-07-28",
            "streamable-http",
        ));
        assert_eq!(modern.snapshot().verdict, usage::VERDICT_MODERN);
        assert_eq!(modern.snapshot().name, UNNAMED);
    }
}
