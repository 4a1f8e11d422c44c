//! The response cache: a shared gateway MAY store and serve cacheable results
//! (2026-07-28 `server/utilities/caching.mdx`). `complete` results of `server/discover`,
//! `tools/list`, `prompts/list`, `resources/list`, `resources/templates/list` and
//! `resources/read` are kept while fresh (`now < t_received + ttlMs`, capped by
//! `max_ttl_ms`), `public` ones for every caller and `private` ones per authorization
//! context. Both of the gateway's paths use the one cache: modern pass-through
//! ([`passthrough`]) and the upstream calls of legacy sessions ([`legacy`]).
//!
//! ```text
//!   request ─► key (route, method, revision, params without _meta) ─► fresh entry? ─► answer
//!                                                    │ no
//!                                                    ▼
//!                     one flight per (key, caller) ─► upstream ─► complete + ttlMs > 0? ─► store
//!   upstream subscriptions/listen (one per route) ─► list_changed / resources/updated ─► drop
//! ```
//!
//! What this module does not do: decide who a caller is (the drivers hand it a
//! [`Caller`]), or relax anything the upstream checks — a request the cache cannot
//! prove equivalent to the one that produced an entry goes upstream.
//!
//! Eviction is `quick_cache` (S3-FIFO-like CLOCK-Pro: scan resistant, better hit
//! ratios than LRU, one lock per shard and no background threads). `moka` was the other
//! candidate; its own TTL runs on its own clock, which would make freshness untestable
//! with an injected clock, and its read path costs more. Entries weigh their bytes, with
//! a floor of `max_bytes / max_entries`, so one weight capacity bounds both.

mod key;
pub(super) mod legacy;
mod listen;
pub(super) mod passthrough;

pub use key::{AuthContext, Cacheable, Caller, RequestKey};

use crate::header_names::MCP_METHOD;
use bytes::Bytes;
use dashmap::DashMap;
use dualera_adapters::json::write as json_write;
use key::{Audience, Scope};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a request waits for a concurrent identical miss before asking upstream
/// itself.
const FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// A `tools/list` entry younger than this is not dropped for a failed `tools/call`:
/// any caller can make a tool call fail, and must not be able to make every caller
/// miss (an upstream `tools/list` at most once a second per entry).
const TOOL_ERROR_MIN_AGE: Duration = Duration::from_secs(1);

/// The `[cache]` settings.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Whether the gateway caches at all.
    pub enabled: bool,
    /// Most entries.
    pub max_entries: usize,
    /// Most bytes of cached results (and keys).
    pub max_bytes: u64,
    /// Cap on any result's `ttlMs`.
    pub max_ttl: Duration,
    /// How long after expiry an entry may still be served when its re-fetch fails
    /// (caching.mdx: clients MAY serve stale responses if errors occur during
    /// re-fetching). Zero: never.
    pub stale_if_error: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_entries: 10_000,
            max_bytes: 64 * 1024 * 1024,
            max_ttl: Duration::from_secs(3600),
            stale_if_error: Duration::ZERO,
        }
    }
}

impl CacheConfig {
    /// Defaults overridden by a config file's `[cache]` section.
    pub fn from_section(s: &crate::config::CacheSection) -> Self {
        let d = Self::default();
        Self {
            enabled: s.enabled.unwrap_or(d.enabled),
            max_entries: s.max_entries.unwrap_or(d.max_entries).max(1),
            max_bytes: s.max_bytes.unwrap_or(d.max_bytes).max(1),
            max_ttl: s.max_ttl_ms.map_or(d.max_ttl, Duration::from_millis),
            stale_if_error: s
                .stale_if_error_ms
                .map_or(d.stale_if_error, Duration::from_millis),
        }
    }
}

/// Where the cache reads the time (an injectable clock for tests).
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now.
    fn now(&self) -> Instant;
}

/// The monotonic system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Instant>>);

impl Default for ManualClock {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        if let Ok(mut t) = self.0.lock() {
            *t += by;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.0.lock().map_or_else(|_| Instant::now(), |t| *t)
    }
}

/// The cache's counters, one struct so a metrics endpoint can read them all at once.
#[derive(Debug, Default)]
pub struct CacheCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    stale_served: AtomicU64,
    stored: AtomicU64,
}

/// A consistent-enough copy of the counters (each read once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Requests answered from a fresh entry.
    pub hits: u64,
    /// Requests that went upstream (cacheable ones only).
    pub misses: u64,
    /// Requests answered from a concurrent identical request's upstream result.
    pub coalesced: u64,
    /// Entries evicted to stay within the bounds.
    pub evictions: u64,
    /// Entries dropped by a notification or a failed tool call.
    pub invalidations: u64,
    /// Stale entries served because the re-fetch failed.
    pub stale_served: u64,
    /// Results stored.
    pub stored: u64,
    /// Entries held now.
    pub entries: u64,
    /// Weight held now (bytes, each entry at least `max_bytes / max_entries`).
    pub weight: u64,
}

impl CacheCounters {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> CacheStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheStats {
            hits: r(&self.hits),
            misses: r(&self.misses),
            coalesced: r(&self.coalesced),
            evictions: r(&self.evictions),
            invalidations: r(&self.invalidations),
            stale_served: r(&self.stale_served),
            stored: r(&self.stored),
            entries: 0,
            weight: 0,
        }
    }
}

/// One cached response.
pub(crate) struct Entry {
    /// The whole JSON-RPC response the upstream sent (for a pass-through store) or the
    /// gateway framed (for a legacy one).
    body: Bytes,
    /// Where the response's `id` sits in `body`; a hit puts the caller's id there.
    id: Range<usize>,
    /// Where the result object sits in `body`.
    result: Range<usize>,
    /// `body` is the upstream's bytes, not a re-serialization.
    verbatim: bool,
    received: Instant,
    fresh_until: Instant,
    /// For `tools/list`: the names of the tools it lists.
    tools: Box<[Box<str>]>,
    parsed: OnceLock<Arc<Value>>,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("bytes", &self.body.len())
            .field("verbatim", &self.verbatim)
            .finish_non_exhaustive()
    }
}

impl Entry {
    /// The result, parsed once and shared.
    pub(crate) fn value(&self) -> Arc<Value> {
        self.parsed
            .get_or_init(|| {
                Arc::new(
                    serde_json::from_slice(&self.body[self.result.clone()]).unwrap_or(Value::Null),
                )
            })
            .clone()
    }

    /// The cached response with `id` (raw JSON) in place of the original id.
    pub(crate) fn with_id(&self, id: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(self.body.len() + id.len());
        out.extend_from_slice(&self.body[..self.id.start]);
        out.extend_from_slice(id);
        out.extend_from_slice(&self.body[self.id.end..]);
        Bytes::from(out)
    }
}

#[derive(Clone, PartialEq, Eq)]
struct Key {
    request: Arc<RequestKey>,
    audience: Audience,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.request.hash(state);
        self.audience.hash(state);
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct FlightKey {
    request: Arc<RequestKey>,
    caller: Caller,
}

#[derive(Clone)]
struct Weigh {
    floor: u64,
}

impl quick_cache::Weighter<Key, Arc<Entry>> for Weigh {
    fn weight(&self, key: &Key, e: &Arc<Entry>) -> u64 {
        weight_of(key, e).max(self.floor)
    }
}

#[derive(Clone)]
struct CountEvictions(Arc<CacheCounters>);

impl quick_cache::Lifecycle<Key, Arc<Entry>> for CountEvictions {
    type RequestState = ();
    fn on_evict(&self, _: &mut (), _: Key, _: Arc<Entry>) {
        CacheCounters::bump(&self.0.evictions);
    }
}

type Store = quick_cache::sync::Cache<
    Key,
    Arc<Entry>,
    Weigh,
    quick_cache::DefaultHashBuilder,
    CountEvictions,
>;

/// What dropped entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalidate<'a> {
    /// Every entry of these methods.
    Methods(&'a [Cacheable]),
    /// `resources/read` entries of this URI.
    Resource(&'a str),
    /// Every entry of the route.
    All,
}

/// The response cache of one route.
pub struct ResponseCache {
    config: CacheConfig,
    route: Arc<str>,
    clock: Arc<dyn Clock>,
    entries: Store,
    flights: DashMap<FlightKey, watch::Receiver<()>>,
    /// Bumped by every invalidation: a fetch that began before one is not stored, so
    /// a notification that overtakes a response cannot be undone by it.
    epoch: AtomicU64,
    counters: Arc<CacheCounters>,
    listen: listen::Handle,
    max_item: u64,
}

impl fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseCache")
            .field("route", &self.route)
            .field("enabled", &self.config.enabled)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// The outcome of [`ResponseCache::begin`].
pub(crate) enum Begin {
    /// A fresh entry.
    Hit(Arc<Entry>),
    /// Go upstream; store what comes back with [`ResponseCache::store`].
    Fetch(Fetch),
}

/// A fetch in progress: the single flight's leader (waiters are released when it is
/// dropped), or a request that waited in vain and goes alone.
pub(crate) struct Fetch {
    request: Arc<RequestKey>,
    caller: Caller,
    epoch: u64,
    /// An expired entry still within `stale_if_error`.
    pub(crate) stale: Option<Arc<Entry>>,
    _flight: Option<FlightGuard>,
}

struct FlightGuard {
    cache: Arc<ResponseCache>,
    key: FlightKey,
    _done: watch::Sender<()>,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.cache.flights.remove(&self.key);
    }
}

enum Found {
    Fresh(Arc<Entry>),
    Stale(Arc<Entry>),
    Nothing,
}

/// The caching hints of a result (caching.mdx, "Cacheable Model").
#[derive(Deserialize)]
struct Hints {
    #[serde(rename = "resultType")]
    result_type: Option<String>,
    #[serde(rename = "ttlMs")]
    ttl_ms: Option<serde_json::Number>,
    #[serde(rename = "cacheScope")]
    cache_scope: Option<String>,
    tools: Option<Vec<ToolName>>,
}

#[derive(Deserialize)]
struct ToolName {
    name: Option<String>,
}

impl ResponseCache {
    /// A cache for `route` on the system clock.
    pub fn new(config: CacheConfig, route: &str) -> Self {
        Self::with_clock(config, route, Arc::new(SystemClock))
    }

    /// A cache reading the time from `clock`.
    pub fn with_clock(config: CacheConfig, route: &str, clock: Arc<dyn Clock>) -> Self {
        let counters = Arc::new(CacheCounters::default());
        let floor = (config.max_bytes / config.max_entries.max(1) as u64).max(1);
        let capacity = config.max_bytes.max(floor);
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(config.max_entries.max(1))
            .weight_capacity(capacity)
            .build();
        let entries = match options {
            Ok(o) => Store::with_options(
                o,
                Weigh { floor },
                quick_cache::DefaultHashBuilder::default(),
                CountEvictions(counters.clone()),
            ),
            Err(_) => Store::with(
                config.max_entries.max(1),
                capacity,
                Weigh { floor },
                quick_cache::DefaultHashBuilder::default(),
                CountEvictions(counters.clone()),
            ),
        };
        let shards = entries.num_shards().max(1) as u64;
        Self {
            max_item: (capacity / shards / 2).max(1),
            config,
            route: Arc::from(route),
            clock,
            entries,
            flights: DashMap::new(),
            epoch: AtomicU64::new(0),
            counters,
            listen: listen::Handle::default(),
        }
    }

    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The route whose responses it holds.
    pub fn route(&self) -> &Arc<str> {
        &self.route
    }

    /// The counters, with the current size.
    pub fn stats(&self) -> CacheStats {
        let mut s = self.counters.snapshot();
        s.entries = self.entries.len() as u64;
        s.weight = self.entries.weight();
        s
    }

    /// The cacheable operation a request announces in its `Mcp-Method` header, when
    /// the cache is on. Read without touching the body.
    pub fn cacheable(&self, headers: &http::HeaderMap) -> Option<Cacheable> {
        if !self.config.enabled {
            return None;
        }
        Cacheable::from_method(headers.get(&MCP_METHOD)?.to_str().ok()?)
    }

    fn find(&self, request: &Arc<RequestKey>, caller: &Caller, verbatim: bool) -> Found {
        let now = self.clock.now();
        let mut stale = None;
        for audience in caller.audiences() {
            let key = Key {
                request: request.clone(),
                audience,
            };
            let Some(e) = self.entries.get(&key) else {
                continue;
            };
            if verbatim && !e.verbatim {
                continue;
            }
            if now < e.fresh_until {
                return Found::Fresh(e);
            }
            if now < e.fresh_until + self.config.stale_if_error {
                stale.get_or_insert(e);
            } else {
                self.entries.remove_if(&key, |v| Arc::ptr_eq(v, &e));
            }
        }
        stale.map_or(Found::Nothing, Found::Stale)
    }

    /// Looks `request` up for `caller`; on a miss, joins or leads the single flight
    /// for it. `verbatim`: only entries holding the upstream's own bytes will do.
    pub(crate) async fn begin(
        self: &Arc<Self>,
        request: Arc<RequestKey>,
        caller: Caller,
        verbatim: bool,
    ) -> Begin {
        let stale = match self.find(&request, &caller, verbatim) {
            Found::Fresh(e) => {
                CacheCounters::bump(&self.counters.hits);
                return Begin::Hit(e);
            }
            Found::Stale(e) => Some(e),
            Found::Nothing => None,
        };
        let key = FlightKey {
            request: request.clone(),
            caller,
        };
        // Concurrent misses of one caller share one upstream request. Callers in
        // different authorization contexts never do: the result may be private.
        let mut rx = match self.flights.entry(key.clone()) {
            dashmap::Entry::Occupied(o) => o.get().clone(),
            dashmap::Entry::Vacant(v) => {
                let (tx, rx) = watch::channel(());
                v.insert(rx);
                CacheCounters::bump(&self.counters.misses);
                return Begin::Fetch(Fetch {
                    request,
                    caller,
                    epoch: self.epoch.load(Ordering::Acquire),
                    stale,
                    _flight: Some(FlightGuard {
                        cache: self.clone(),
                        key,
                        _done: tx,
                    }),
                });
            }
        };
        // Released when the leader drops its guard (stored or not); bounded.
        let _ = tokio::time::timeout(FLIGHT_WAIT, rx.changed()).await;
        match self.find(&request, &caller, verbatim) {
            Found::Fresh(e) => {
                CacheCounters::bump(&self.counters.coalesced);
                Begin::Hit(e)
            }
            found => {
                // Nothing cacheable came of it (ttlMs 0, an error, input_required):
                // ask upstream alone rather than queue behind another leader.
                CacheCounters::bump(&self.counters.misses);
                Begin::Fetch(Fetch {
                    request,
                    caller,
                    epoch: self.epoch.load(Ordering::Acquire),
                    stale: match found {
                        Found::Stale(e) => Some(e),
                        _ => stale,
                    },
                    _flight: None,
                })
            }
        }
    }

    /// A fetch that skips the lookup: the caller must get the upstream's own answer
    /// (a legacy `initialize` with credentials, a `tools/list` refresh after `-32020`).
    /// What comes back is stored as usual.
    pub(crate) fn revalidate(&self, request: Arc<RequestKey>, caller: Caller) -> Fetch {
        CacheCounters::bump(&self.counters.misses);
        Fetch {
            request,
            caller,
            epoch: self.epoch.load(Ordering::Acquire),
            stale: None,
            _flight: None,
        }
    }

    /// A fresh entry for `request`, without single flight or counting a miss.
    pub(crate) fn peek(&self, request: &Arc<RequestKey>, caller: &Caller) -> Option<Arc<Entry>> {
        match self.find(request, caller, false) {
            Found::Fresh(e) => {
                CacheCounters::bump(&self.counters.hits);
                Some(e)
            }
            _ => None,
        }
    }

    /// Counts a stale entry served after a failed re-fetch.
    pub(crate) fn served_stale(&self) {
        CacheCounters::bump(&self.counters.stale_served);
    }

    /// Stores the JSON-RPC response `body` fetched for `fetch` if its result may be
    /// cached: `resultType: "complete"` (caching.mdx, "Cacheable Results":
    /// `input_required` is not cacheable), `ttlMs` > 0 (0, absent or negative: stale at
    /// once, so never stored), within the bounds. `verbatim`: `body` holds the
    /// upstream's own bytes. Returns whether it was stored.
    pub(crate) fn store(self: &Arc<Self>, fetch: &Fetch, body: Bytes, verbatim: bool) -> bool {
        let Some((id, result)) = locate(&body) else {
            return false;
        };
        let Ok(hints) = serde_json::from_slice::<Hints>(&body[result.clone()]) else {
            return false;
        };
        self.insert(fetch, hints, body, (id, result), verbatim, OnceLock::new())
    }

    /// [`ResponseCache::store`] for a result the legacy path already holds parsed: the
    /// hints are read from the value, the entry's body is written once (for the
    /// pass-through hits it may serve) and the value is kept as the entry's parse.
    pub(crate) fn store_result(self: &Arc<Self>, fetch: &Fetch, result: &Value) -> bool {
        let Ok(hints) = Hints::deserialize(result) else {
            return false;
        };
        if hints.result_type.as_deref() != Some("complete") {
            return false;
        }
        const HEAD: &[u8] = br#"{"id":0,"jsonrpc":"2.0","result":"#;
        let mut out = Vec::with_capacity(HEAD.len() + 1 + json_write::len_hint(result));
        out.extend_from_slice(HEAD);
        json_write::value(&mut out, result);
        let end = out.len();
        out.push(b'}');
        let id = 6..7;
        let parsed = OnceLock::from(Arc::new(result.clone()));
        self.insert(
            fetch,
            hints,
            Bytes::from(out),
            (id, HEAD.len()..end),
            false,
            parsed,
        )
    }

    fn insert(
        self: &Arc<Self>,
        fetch: &Fetch,
        hints: Hints,
        body: Bytes,
        (id, result): (Range<usize>, Range<usize>),
        verbatim: bool,
        parsed: OnceLock<Arc<Value>>,
    ) -> bool {
        if hints.result_type.as_deref() != Some("complete") {
            return false;
        }
        let ttl = match hints.ttl_ms.as_ref().and_then(serde_json::Number::as_f64) {
            Some(ms) if ms >= 1.0 => Duration::from_millis(ms.min(u64::MAX as f64) as u64),
            _ => return false,
        };
        let ttl = ttl.min(self.config.max_ttl);
        if ttl.is_zero() {
            return false;
        }
        // Anything but an explicit "public" stays within the caller's context.
        let scope = match hints.cache_scope.as_deref() {
            Some("public") => Scope::Public,
            _ => Scope::Private,
        };
        if fetch.request.route != self.route {
            return false;
        }
        let received = self.clock.now();
        let entry = Entry {
            id,
            result,
            verbatim,
            received,
            fresh_until: received + ttl,
            tools: if fetch.request.method == Cacheable::ToolsList {
                hints
                    .tools
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|t| t.name.map(String::into_boxed_str))
                    .collect()
            } else {
                Box::default()
            },
            parsed,
            body,
        };
        let key = Key {
            request: fetch.request.clone(),
            audience: fetch.caller.audience_for(scope),
        };
        if weight_of(&key, &entry) > self.max_item {
            return false;
        }
        // Checked last, right before inserting: a notification that arrived while
        // the response was on its way wins.
        if self.epoch.load(Ordering::Acquire) != fetch.epoch {
            return false;
        }
        let uri = fetch.request.uri.clone();
        self.entries.insert(key, Arc::new(entry));
        CacheCounters::bump(&self.counters.stored);
        if let Some(uri) = uri {
            self.listen.resource_cached(&uri);
        }
        self.ensure_listening();
        true
    }

    /// Drops entries (a notification from the upstream, or a listen (re)opened after a
    /// gap in which notifications may have been missed).
    pub(crate) fn invalidate(&self, what: Invalidate<'_>) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let dropped = AtomicU64::new(0);
        self.entries.retain(|k, _| {
            let hit = match what {
                Invalidate::All => true,
                Invalidate::Methods(ms) => ms.contains(&k.request.method),
                Invalidate::Resource(uri) => {
                    k.request.method == Cacheable::ResourcesRead
                        && k.request.uri.as_deref() == Some(uri)
                }
            };
            if hit {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
            !hit
        });
        let n = dropped.into_inner();
        self.counters.invalidations.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// A `tools/call` of `tool` failed with `code`: a `-32602` or `-32601` for a tool
    /// a cached `tools/list` shows suggests the list changed (caching.mdx: clients MAY
    /// re-fetch before the TTL expires on "an unexpected error on a tool call
    /// indicating the method was not found or the parameters were invalid").
    pub(crate) fn tool_call_failed(&self, tool: &str, code: i64) -> u64 {
        if code != -32602 && code != -32601 {
            return 0;
        }
        let now = self.clock.now();
        let dropped = AtomicU64::new(0);
        self.entries.retain(|k, e| {
            let hit = k.request.method == Cacheable::ToolsList
                && now.saturating_duration_since(e.received) >= TOOL_ERROR_MIN_AGE
                && e.tools.iter().any(|t| &**t == tool);
            if hit {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
            !hit
        });
        let n = dropped.into_inner();
        if n > 0 {
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.counters.invalidations.fetch_add(n, Ordering::Relaxed);
            tracing::debug!(
                tool,
                code,
                dropped = n,
                "tools/list invalidated by a failed tools/call"
            );
        }
        n
    }

    /// Whether any cached `tools/list` names `tool`.
    pub(crate) fn lists_tool(&self, tool: &str) -> bool {
        self.entries.iter().any(|(k, e)| {
            k.request.method == Cacheable::ToolsList && e.tools.iter().any(|t| &**t == tool)
        })
    }
}

/// Bytes an entry holds, with a fixed allowance for its bookkeeping.
fn weight_of(key: &Key, e: &Entry) -> u64 {
    (e.body.len() + key.request.params().len() + 128) as u64
}

/// Finds the `id` and `result` of a JSON-RPC response in its bytes.
fn locate(body: &[u8]) -> Option<(Range<usize>, Range<usize>)> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
    }
    let e: Envelope<'_> = serde_json::from_slice(body).ok()?;
    let range = |raw: &RawValue| {
        let text = raw.get();
        let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
        let end = start + text.len();
        (body.get(start..end) == Some(text.as_bytes())).then_some(start..end)
    };
    Some((range(e.id?)?, range(e.result?)?))
}

#[cfg(test)]
mod tests;
