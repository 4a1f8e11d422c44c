//! One route's upstream: its instances (one or more HTTP(S) endpoints of one server, or
//! one stdio child), and the choice of instance for each request ([`balance`]).
//!
//! ```text
//!   exchange / send ─► Selector::plan ─► instance i ─► answered ─► healthy
//!                              ▲                 └─► no connection (nothing sent)
//!                              └──── next instance ◄─┘   └─► down, backoff
//! ```
//!
//! Only a connection that could not be made counts against an instance (refused, timed
//! out, TLS handshake failed): nothing was sent, so the request goes to the next instance
//! unchanged, whatever it was. A failure after the request was sent is the caller's,
//! as with one upstream: the request may have had effects, and an MRTR upstream's state
//! travels with the request anyway.
//!
//! What the pool adds for MRTR and subscriptions, with more than one instance:
//! - a retry echoing a `requestState` goes to the instance after the one that issued it
//!   ([`RoundMemory`]), so a round and its retry never share an instance while two are up;
//! - a `subscriptions/listen` stream is ended when its instance is found down by any
//!   other request (or by the readiness probe), so its owner (a session, the cache)
//!   re-opens it on an instance that is up, instead of waiting on a dead connection.
//!
//! The session machine knows nothing of this: it asks "the upstream"; drivers hand
//! its requests to the route's pool.

use super::balance::{Backoff, Pick, RoundMemory, Selector, State};
use super::{Exchange, HttpUpstream, OnBehalf, Outbound, StdioUpstream, Upstream, UpstreamError};
use dualera_adapters::Message;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tracing::{debug, warn};

/// Why a set of instances cannot be one pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No instance.
    #[error("an upstream needs at least one instance")]
    Empty,
    /// More than [`super::balance::MAX_INSTANCES`].
    #[error("an upstream may have at most {max} instances, {given} given")]
    TooMany {
        /// How many were given.
        given: usize,
        /// The bound.
        max: usize,
    },
    /// A stdio child among other instances (a child is one process of its own).
    #[error("a stdio upstream (upstream_cmd) has exactly one instance")]
    StdioAmongOthers,
}

/// One instance and what the pool knows about it.
#[derive(Debug)]
struct Instance {
    upstream: Upstream,
    /// `scheme://host:port/path` (or `stdio`), for `/readyz` and the metrics.
    label: Box<str>,
    /// Bumped each time the instance is found down: open listens on it end.
    gone: watch::Sender<u64>,
}

/// A route's upstream instances.
#[derive(Debug)]
pub struct UpstreamPool {
    instances: Box<[Instance]>,
    selector: Selector,
    rounds: Arc<RoundMemory>,
    epoch: Instant,
    /// Requests sent on to another instance after one could not be reached.
    failovers: AtomicU64,
}

/// One instance's state, for `/readyz` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    /// `scheme://host:port/path` (no user info), or `stdio`.
    pub label: String,
    /// Healthy, or down with its backoff.
    pub state: State,
}

impl UpstreamPool {
    /// A pool over `instances`: HTTP(S) endpoints of one server, or one stdio child.
    pub fn new(instances: Vec<Upstream>) -> Result<Self, PoolError> {
        Self::with_backoff(instances, Backoff::default())
    }

    /// [`UpstreamPool::new`] with another backoff (tests).
    pub fn with_backoff(instances: Vec<Upstream>, backoff: Backoff) -> Result<Self, PoolError> {
        let max = super::balance::MAX_INSTANCES;
        match instances.len() {
            0 => return Err(PoolError::Empty),
            n if n > max => return Err(PoolError::TooMany { given: n, max }),
            n if n > 1 && instances.iter().any(|u| matches!(u, Upstream::Stdio(_))) => {
                return Err(PoolError::StdioAmongOthers)
            }
            _ => {}
        }
        let selector = Selector::new(instances.len(), backoff);
        let instances = instances
            .into_iter()
            .map(|upstream| Instance {
                label: label_of(&upstream).into(),
                upstream,
                gone: watch::channel(0).0,
            })
            .collect();
        Ok(Self {
            instances,
            selector,
            rounds: Arc::default(),
            epoch: Instant::now(),
            failovers: AtomicU64::new(0),
        })
    }

    /// A pool of one instance.
    pub fn single(upstream: Upstream) -> Self {
        let selector = Selector::new(1, Backoff::default());
        Self {
            instances: Box::new([Instance {
                label: label_of(&upstream).into(),
                upstream,
                gone: watch::channel(0).0,
            }]),
            selector,
            rounds: Arc::default(),
            epoch: Instant::now(),
            failovers: AtomicU64::new(0),
        }
    }

    /// How many instances.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Always false: a pool has at least one instance.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The stdio child, when this pool is one.
    pub fn stdio(&self) -> Option<&StdioUpstream> {
        match &self.instances[0].upstream {
            Upstream::Stdio(s) => Some(s),
            Upstream::Http(_) => None,
        }
    }

    /// The first instance (its URL stands for the upstream in messages and relays that
    /// need one).
    pub fn first(&self) -> &Upstream {
        &self.instances[0].upstream
    }

    /// Each instance's state now.
    pub fn status(&self) -> Vec<InstanceStatus> {
        let now = self.now();
        self.instances
            .iter()
            .enumerate()
            .map(|(i, inst)| InstanceStatus {
                label: inst.label.to_string(),
                state: self.selector.state(i, now),
            })
            .collect()
    }

    /// Requests sent on to another instance after one could not be reached.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Instance `i` could not be reached: skipped for a backoff, and its listens end.
    fn mark_down(&self, i: usize, error: &dyn std::fmt::Display) {
        let mut r = [0u8; 2];
        let _ = getrandom::fill(&mut r);
        let jitter = f64::from(u16::from_le_bytes(r)) / 65_536.0;
        let now = self.now();
        let until = self.selector.failed(i, now, jitter);
        let inst = &self.instances[i];
        warn!(
            instance = %inst.label,
            retry_in_ms = until.saturating_sub(now),
            error = %error,
            "upstream instance unreachable; skipped until its backoff ends"
        );
        if self.instances.len() > 1 {
            inst.gone.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn answered(&self, i: usize) {
        if !self.selector.is_healthy(i) {
            debug!(instance = %self.instances[i].label, "upstream instance answers again");
        }
        self.selector.succeeded(i);
    }

    /// Sends one modern request to the next healthy instance (see
    /// [`Upstream::exchange`]); one that cannot be reached is skipped for the next.
    /// The instance that accepted it answers the rest of the exchange; with several
    /// instances, the `requestState` it issues is remembered so that the round's retry
    /// goes back to it, and a listen on it ends when it is found down.
    pub async fn exchange(
        &self,
        request: &Outbound,
        on_behalf: OnBehalf<'_>,
        params: &[(String, String)],
    ) -> Result<Exchange, UpstreamError> {
        let (listen, after) = match request.message() {
            Message::Request(r) if self.instances.len() > 1 => (
                r.method == "subscriptions/listen",
                r.params
                    .as_ref()
                    .and_then(|p| p.get("requestState"))
                    .and_then(Value::as_str)
                    .and_then(|s| self.rounds.recall(s)),
            ),
            _ => (false, None),
        };
        let mut plan = self.selector.plan(self.now(), after);
        let mut last = None;
        while let Some(pick) = plan.next() {
            let i = pick.index();
            if last.is_some() {
                self.failovers.fetch_add(1, Ordering::Relaxed);
            }
            let inst = &self.instances[i];
            let gone = listen.then(|| inst.gone.subscribe());
            match inst.upstream.exchange(request, on_behalf, params).await {
                Err(e) if e.is_connect() => {
                    self.mark_down(i, &e);
                    last = Some(e);
                }
                Err(e @ UpstreamError::Unreachable { .. }) => return Err(e),
                outcome => {
                    self.answered(i);
                    if matches!(pick, Pick::Trial(_) | Pick::Desperate(_)) {
                        debug!(instance = %inst.label, "upstream instance back after a trial");
                    }
                    let mut exchange = outcome?;
                    if self.instances.len() > 1 {
                        let rounds = self.rounds.clone();
                        exchange = exchange.inspect(move |m| {
                            if let Some(state) = issued_state(m) {
                                rounds.remember(state, i);
                            }
                        });
                    }
                    if let Some(mut gone) = gone {
                        let label = inst.label.clone();
                        exchange = exchange.until(async move {
                            let _ = gone.changed().await;
                            UpstreamError::Unreachable {
                                detail: format!("instance {label} went away"),
                            }
                        });
                    }
                    return Ok(exchange);
                }
            }
        }
        Err(last.unwrap_or_else(|| UpstreamError::Connect {
            detail: "every instance of this upstream is down".into(),
        }))
    }

    /// One attempt per instance, for HTTP requests the caller builds itself
    /// (pass-through, the metadata relay): `attempt` gets the instance and returns the
    /// request's future, or `None` when it cannot send the request again (a streamed
    /// body already taken). A connection that could not be made moves on to the next
    /// instance; anything else is the answer.
    pub async fn send<T, F, Fut>(&self, mut attempt: F) -> Result<T, UpstreamError>
    where
        F: FnMut(&HttpUpstream) -> Option<Fut>,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        let mut plan = self.selector.plan(self.now(), None);
        let mut last = None;
        while let Some(pick) = plan.next() {
            let i = pick.index();
            let Upstream::Http(up) = &self.instances[i].upstream else {
                break;
            };
            let Some(fut) = attempt(up) else {
                break;
            };
            if last.is_some() {
                self.failovers.fetch_add(1, Ordering::Relaxed);
            }
            match fut.await {
                Err(e) if e.is_connect() => {
                    self.mark_down(i, &e);
                    last = Some(e);
                }
                Err(e) => return Err(e),
                Ok(r) => {
                    self.answered(i);
                    return Ok(r);
                }
            }
        }
        Err(last.unwrap_or_else(|| UpstreamError::Connect {
            detail: "no instance of this upstream could take the request".into(),
        }))
    }

    /// Sends `request` to every instance (the readiness probe): each outcome, in
    /// instance order, recorded into the instances' health.
    pub async fn probe_each(
        &self,
        request: &Outbound,
        timeout: std::time::Duration,
    ) -> Vec<(
        String,
        Result<Option<dualera_adapters::Response>, UpstreamError>,
    )> {
        let mut out = Vec::with_capacity(self.instances.len());
        for (i, inst) in self.instances.iter().enumerate() {
            let exchange = async {
                match inst
                    .upstream
                    .exchange(request, OnBehalf::default(), &[])
                    .await
                {
                    Ok(ex) => ex.response().await.map(Some),
                    Err(e) => Err(e),
                }
            };
            let outcome = match tokio::time::timeout(timeout, exchange).await {
                Err(_) => Err(UpstreamError::Connect {
                    detail: format!(
                        "server/discover was not answered within {:.1} s",
                        timeout.as_secs_f64()
                    ),
                }),
                Ok(r) => r,
            };
            let outcome = match outcome {
                Ok(answer) => {
                    self.answered(i);
                    Ok(answer)
                }
                Err(e) => {
                    if e.is_connect() {
                        self.mark_down(i, &e);
                    } else if matches!(e, UpstreamError::Denied(_)) {
                        self.answered(i);
                    }
                    Err(e)
                }
            };
            out.push((inst.label.to_string(), outcome));
        }
        out
    }
}

/// The `requestState` of an `input_required` result, if `m` is one.
fn issued_state(m: &Message) -> Option<&str> {
    let Message::Response(r) = m else {
        return None;
    };
    let result = r.outcome.as_ref().ok()?;
    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return None;
    }
    result.get("requestState").and_then(Value::as_str)
}

/// `scheme://host:port/path` of an HTTP instance (never its user info or query), or
/// `stdio`.
fn label_of(upstream: &Upstream) -> String {
    match upstream {
        Upstream::Stdio(_) => "stdio".to_owned(),
        Upstream::Http(h) => {
            let uri = h.uri();
            format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or("http"),
                h.authority()
                    .map(|a| a.rsplit('@').next().unwrap_or(a))
                    .unwrap_or(""),
                uri.path()
            )
        }
    }
}
