//! Invalidation by notification: while the upstream advertises `listChanged` or
//! `subscribe`, the cache keeps one `subscriptions/listen` of its own per route
//! (2026-07-28 `basic/patterns/subscriptions.mdx`) and drops entries on
//! `notifications/{tools,prompts,resources}/list_changed` and on
//! `notifications/resources/updated` for a cached URI (caching.mdx, "Interaction with
//! Notifications": a relevant notification invalidates a cached response at once).
//!
//! The listen starts with the first stored entry (nothing to invalidate before), asks
//! anonymously (the gateway keeps no caller's token for later use), and reconnects with
//! jittered exponential backoff (back to 1 s once a listen was up: a lost listen is
//! re-opened on whichever of the route's instances is up). Every time one is
//! acknowledged, the route's entries
//! are dropped: notifications sent while no listen was open were missed. When the set
//! of cached resource URIs grows, a new listen naming them is opened and the old one is
//! closed only once the new one is acknowledged, so lists are never unwatched.

use super::{Cacheable, Invalidate, ResponseCache};
use crate::upstream::{OnBehalf, Outbound, UpstreamError, UpstreamPool};
use dualera_adapters::{Message, ProtocolVersion, Request, RequestId};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tracing::{debug, info, warn, Instrument};

/// Most resource URIs one listen names; reads of others rely on their TTL alone.
const MAX_URIS: usize = 1024;
/// How long a listen may take to be acknowledged.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// Re-read the upstream's capabilities this often when it advertises nothing to
/// listen for.
const RECHECK: Duration = Duration::from_secs(300);
/// URIs cached within this long of each other are subscribed to together.
const DEBOUNCE: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The cache's side of its listener.
#[derive(Debug, Default)]
pub(super) struct Handle {
    upstream: OnceLock<Arc<UpstreamPool>>,
    started: AtomicBool,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    uris: Mutex<BTreeSet<Box<str>>>,
    changed: Notify,
    established: AtomicU64,
}

impl Handle {
    /// Records a cached resource URI, for the listener to subscribe to.
    pub(super) fn resource_cached(&self, uri: &str) {
        let Ok(mut g) = self.uris.lock() else {
            return;
        };
        if g.len() >= MAX_URIS || g.contains(uri) {
            return;
        }
        g.insert(uri.into());
        drop(g);
        self.changed.notify_one();
    }
}

impl ResponseCache {
    /// Tells the cache which upstream (the route's pool) its listener subscribes to.
    pub(crate) fn attach(&self, upstream: Arc<UpstreamPool>) {
        let _ = self.listen.upstream.set(upstream);
    }

    /// Starts the listener if it is not running (called once something is cached).
    pub(super) fn ensure_listening(self: &Arc<Self>) {
        if self.listen.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let (Some(upstream), Ok(rt)) = (
            self.listen.upstream.get().cloned(),
            tokio::runtime::Handle::try_current(),
        ) else {
            self.listen.started.store(false, Ordering::Release);
            return;
        };
        let task = rt.spawn(
            run(self.clone(), upstream)
                .instrument(tracing::info_span!("cache_listen", route = %self.route)),
        );
        if let Ok(mut g) = self.listen.task.lock() {
            *g = Some(task.abort_handle());
        }
    }

    /// Stops the listener (gateway shutdown).
    pub(crate) fn stop_listening(&self) {
        if let Ok(mut g) = self.listen.task.lock() {
            if let Some(t) = g.take() {
                t.abort();
            }
        }
    }

    /// How many times a listen of the cache's was acknowledged (for tests and metrics).
    pub fn listens_established(&self) -> u64 {
        self.listen.established.load(Ordering::Relaxed)
    }
}

/// What the upstream advertises that the cache can listen for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Watch {
    tools: bool,
    prompts: bool,
    resources: bool,
    subscribe: bool,
}

impl Watch {
    fn from_discover(result: &Value) -> Self {
        let caps = &result["capabilities"];
        let flag = |p: &str| caps.pointer(p).and_then(Value::as_bool) == Some(true);
        Self {
            tools: flag("/tools/listChanged"),
            prompts: flag("/prompts/listChanged"),
            resources: flag("/resources/listChanged"),
            subscribe: flag("/resources/subscribe"),
        }
    }

    fn any(self) -> bool {
        self.tools || self.prompts || self.resources || self.subscribe
    }

    fn filter(self, uris: &BTreeSet<Box<str>>) -> Value {
        let mut f = serde_json::Map::new();
        if self.tools {
            f.insert("toolsListChanged".into(), json!(true));
        }
        if self.prompts {
            f.insert("promptsListChanged".into(), json!(true));
        }
        if self.resources {
            f.insert("resourcesListChanged".into(), json!(true));
        }
        if self.subscribe && !uris.is_empty() {
            f.insert(
                "resourceSubscriptions".into(),
                json!(uris.iter().map(|u| &**u).collect::<Vec<_>>()),
            );
        }
        Value::Object(f)
    }
}

enum Outcome {
    NothingToWatch,
    Lost,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn request(method: &str, extra: Option<(&str, Value)>) -> Message {
    let mut params = serde_json::Map::new();
    params.insert(
        "_meta".into(),
        json!({
            "io.modelcontextprotocol/protocolVersion": ProtocolVersion::V2026_07_28,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "dualera-cache", "version": env!("CARGO_PKG_VERSION")},
        }),
    );
    if let Some((k, v)) = extra {
        params.insert(k.into(), v);
    }
    Message::Request(Request {
        id: RequestId::String(format!(
            "dualera-cache-{}",
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        )),
        method: method.into(),
        params: Some(Value::Object(params)),
    })
}

async fn run(cache: Arc<ResponseCache>, upstream: Arc<UpstreamPool>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let before = cache.listens_established();
        let outcome = watch_once(&cache, &upstream).await;
        if cache.listens_established() > before {
            // A listen that was up and then lost (its instance went away, say) is
            // re-opened promptly, on whichever instance is up: the backoff is for an
            // upstream that keeps failing, not for one that worked.
            backoff = Duration::from_secs(1);
        }
        let pause = match outcome {
            Outcome::NothingToWatch => RECHECK,
            Outcome::Lost => {
                let p = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                p
            }
        };
        // Jitter: up to half the pause again, so replicas do not reconnect in step.
        let mut r = [0u8; 2];
        let _ = getrandom::fill(&mut r);
        let jitter = pause.mul_f64(f64::from(u16::from_le_bytes(r)) / f64::from(u16::MAX) / 2.0);
        tokio::time::sleep(pause + jitter).await;
    }
}

async fn discover(upstream: &UpstreamPool) -> Option<Value> {
    let outcome = match upstream
        .exchange(
            &Outbound::from(request("server/discover", None)),
            OnBehalf::default(),
            &[],
        )
        .await
    {
        Ok(exchange) => exchange.response().await,
        Err(e) => Err(e),
    };
    let result = match outcome {
        Ok(r) => r.outcome.ok(),
        Err(e) => {
            debug!(error = %e, "cache listener: server/discover failed");
            None
        }
    };
    result
}

async fn watch_once(cache: &Arc<ResponseCache>, upstream: &Arc<UpstreamPool>) -> Outcome {
    let Some(result) = discover(upstream).await else {
        return Outcome::Lost;
    };
    let watch = Watch::from_discover(&result);
    if !watch.any() {
        debug!("upstream advertises no listChanged or subscribe: entries rely on their TTL");
        return Outcome::NothingToWatch;
    }
    let mut current: Option<(tokio::task::JoinHandle<()>, BTreeSet<Box<str>>)> = None;
    loop {
        let uris = cache
            .listen
            .uris
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default();
        let (ack_tx, ack_rx) = oneshot::channel();
        let mut next = tokio::spawn(
            listen_one(cache.clone(), upstream.clone(), watch.filter(&uris), ack_tx)
                .in_current_span(),
        );
        tokio::select! {
            ack = ack_rx => if ack.is_err() {
                next.abort();
                return Outcome::Lost;
            },
            _ = &mut next => return Outcome::Lost,
            () = tokio::time::sleep(ACK_WAIT) => {
                warn!("cache listener: subscriptions/listen was not acknowledged");
                next.abort();
                return Outcome::Lost;
            }
        }
        cache.listen.established.fetch_add(1, Ordering::Relaxed);
        match current.take() {
            None => {
                let n = cache.invalidate(Invalidate::All);
                info!(
                    dropped = n,
                    "cache listener: listening for upstream changes"
                );
            }
            Some((old, old_uris)) => {
                // The lists were watched throughout; the newly named URIs were not.
                for u in uris.difference(&old_uris) {
                    cache.invalidate(Invalidate::Resource(u));
                }
                old.abort();
            }
        }
        current = Some((next, uris));
        let Some((task, _)) = current.as_mut() else {
            return Outcome::Lost;
        };
        tokio::select! {
            _ = task => return Outcome::Lost,
            () = cache.listen.changed.notified(), if watch.subscribe => {
                tokio::time::sleep(DEBOUNCE).await;
            }
        }
    }
}

async fn listen_one(
    cache: Arc<ResponseCache>,
    upstream: Arc<UpstreamPool>,
    filter: Value,
    ack: oneshot::Sender<()>,
) {
    let mut ack = Some(ack);
    let msg = Outbound::from(request(
        "subscriptions/listen",
        Some(("notifications", filter)),
    ));
    let outcome = async {
        let mut exchange = upstream.exchange(&msg, OnBehalf::default(), &[]).await?;
        while let Some(item) = exchange.next().await {
            let Message::Notification(n) = item? else {
                continue;
            };
            let dropped = match n.method.as_str() {
                "notifications/subscriptions/acknowledged" => {
                    if let Some(tx) = ack.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                "notifications/tools/list_changed" => {
                    cache.invalidate(Invalidate::Methods(&[Cacheable::ToolsList]))
                }
                "notifications/prompts/list_changed" => {
                    cache.invalidate(Invalidate::Methods(&[Cacheable::PromptsList]))
                }
                "notifications/resources/list_changed" => cache.invalidate(Invalidate::Methods(&[
                    Cacheable::ResourcesList,
                    Cacheable::ResourceTemplatesList,
                ])),
                "notifications/resources/updated" => {
                    match n
                        .params
                        .as_ref()
                        .and_then(|p| p.get("uri"))
                        .and_then(Value::as_str)
                    {
                        Some(uri) => cache.invalidate(Invalidate::Resource(uri)),
                        None => continue,
                    }
                }
                _ => continue,
            };
            debug!(notification = %n.method, dropped, "cache entries invalidated");
        }
        Ok::<(), UpstreamError>(())
    }
    .await;
    if let Err(e) = outcome {
        debug!(error = %e, "cache listener: subscriptions/listen ended");
    }
}
