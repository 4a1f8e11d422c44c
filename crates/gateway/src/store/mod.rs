//! Where legacy Streamable HTTP sessions live, behind one trait: [`SessionStore`].
//!
//! Two stores of the same sans-IO session machine implement it, and both carry out
//! the machine's events through the one driver (`driver::plan`, `driver::exchange`):
//!
//! - [`memory`] (the embedded default): one process owns each session; its machine
//!   and SSE streams sit behind one lock; a step is lock, feed, plan, perform;
//! - [`redis`] (`session_store = "redis://…"`): any replica behind a plain load
//!   balancer serves any request of any session. A step loads the session's state,
//!   feeds it one message, plans, stores the state and the plan's stream entries with
//!   compare-and-set on a version in one script, and only then performs the rest.
//!
//! ```text
//!   legacy_http ──► headers, session lookup and binding, body, envelope; then each
//!        │           operation written once over the trait's narrow part:
//!        │             message, DELETE          step / end
//!        │             request, batch           post, step (+ bind), first_message, respond
//!        │             standalone GET           hold, step, head or token probe, attach
//!        │             initialize               new_machine, driver::handshake, create
//!        │             GET with Last-Event-ID   resume
//!        ▼
//!   SessionStore ──► step: load, feed (a StepState: machine + streams), plan,
//!        │                  store (CAS + append), perform (exchanges, leases, timers)
//!        ├─ memory::Sessions        (lock, feed, plan, perform)
//!        └─ redis::RedisSessions    (load, feed, plan, CAS + append, perform)
//!   initialize: the driver's handshake on a new machine (`new_machine`), then
//!        `create` (admission in this process / a create script);
//!   resumption by `Last-Event-ID`: `resume` (a replay ring / the stream's entries
//!        relayed), its refusals and failures answered by the front.
//! ```
//!
//! The step is one operation (load, compare-and-set, append) rather than three: the
//! in-memory store's "load" is its lock and its "compare-and-set" the unlock, so
//! split calls would either hold a lock across them or make the in-memory store
//! serialize its state as the shared one must (measured: 2.6× a legacy call's
//! instructions). What a stream *is* stays each store's: a live connection and a
//! replay ring here, an entry log relayed by whichever replica holds the host's
//! connection there; so how a POST waits for its first message and answers (JSON or a
//! stream) is behind [`SessionStore::first_message`] and [`SessionStore::respond`].
//!
//! The single-channel wires (stdio, WebSocket, 2024-11-05 HTTP+SSE) hold one
//! connection per session, which cannot move between processes: they stay in memory
//! whatever the store (`pipe`), on `driver::run`.

pub(super) mod memory;
// Redis is the `redis` feature; without it, `no_redis` refuses a `redis://` store.
#[cfg(feature = "redis")]
pub(super) mod redis;
#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
pub(super) mod redis;
#[cfg(feature = "redis")]
pub mod redis_conns;

use super::driver::HeadWatch;
use super::forwarded::Forwarded;
use super::legacy_http::HEAD_WAIT;
use super::trace::TraceContext;
use crate::body::GatewayBody;
use crate::Route;
use bytes::Bytes;
use dualera_adapters::{Observation, PeerStream, RequestId, Session, Timestamp};
use http::header::HeaderValue;
use http::Response;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// The hasher of maps keyed by ids the gateway or its machine minted (session ids,
/// stream numbers, upstream request ids, connection tokens and the key names built
/// from them), in either store: no peer chooses their keys, so HashDoS does not apply
/// and foldhash (randomly seeded) is cheaper than SipHash. A map that also takes a
/// peer's guess at such an id does so only for as long as one request of it runs (the
/// shared store's per-session step locks), so a peer cannot fill it. Maps keyed by a
/// peer's request ids or by callers keep SipHash.
pub(crate) type OwnHasher = foldhash::fast::RandomState;

/// Which store holds legacy Streamable HTTP sessions (`[gateway] session_store`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SessionStoreConfig {
    /// In this process (the default, and what `dualera up` uses).
    #[default]
    Memory,
    /// In Redis, shared by every replica that names the same server and prefix.
    Redis(RedisStoreConfig),
}

/// The shared store's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStoreConfig {
    /// `redis://HOST:PORT/DB`, or `redis+unix:///PATH?db=DB` for a Redis on this
    /// machine.
    pub url: String,
    /// This replica's name (leases and logs).
    pub replica_id: String,
    /// Prefix of every key and channel.
    pub key_prefix: String,
    /// A running upstream exchange's lease, renewed at a third of it.
    pub lease: Duration,
    /// Bound on one store command.
    pub timeout: Duration,
    /// Where other replicas reach this one (`http://HOST:PORT`), registered under the
    /// replica id while it runs: reverse-bridge retries are forwarded there.
    pub advertise_url: Option<String>,
    /// How records are written (both forms are always read).
    pub record_format: RecordFormat,
}

/// How a replica writes the session and lease records it stores
/// (`session_record_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecordFormat {
    /// MessagePack with field names (the default): a record takes about half the
    /// time of JSON to write and two thirds to read.
    #[default]
    MessagePack,
    /// JSON, as builds before MessagePack records wrote and read them: for the new
    /// replicas of a rolling upgrade while older ones still serve.
    Json,
}

impl RecordFormat {
    const ALL: [Self; 2] = [Self::MessagePack, Self::Json];

    /// Its `session_record_format` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MessagePack => "msgpack",
            Self::Json => "json",
        }
    }

    /// Reads `"msgpack"` or `"json"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == text)
            .ok_or_else(|| {
                format!("session_record_format must be \"msgpack\" or \"json\", not {text:?}")
            })
    }
}

impl SessionStoreConfig {
    /// Reads `session_store` (`"memory"` or a `redis://` URL) with the replica settings.
    pub fn parse(
        store: &str,
        replica_id: Option<&str>,
        key_prefix: Option<&str>,
        lease: Option<Duration>,
        timeout: Option<Duration>,
        record_format: Option<&str>,
    ) -> Result<Self, String> {
        let record_format = record_format
            .map(RecordFormat::parse)
            .transpose()?
            .unwrap_or_default();
        if store == "memory" {
            return Ok(Self::Memory);
        }
        if !SHARED_SCHEMES.iter().any(|s| store.starts_with(s)) {
            return Err(format!(
                "session_store must be \"memory\", redis://HOST:PORT/DB or \
                 redis+unix:///PATH?db=DB, not {}",
                shown(store)
            ));
        }
        if let Some(id) = replica_id {
            if id.is_empty()
                || id.len() > 64
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err("replica_id must be 1-64 characters of [A-Za-z0-9._-]".into());
            }
        }
        let key_prefix = key_prefix.unwrap_or("dualera:");
        if key_prefix.len() > 64 || key_prefix.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err("session_key_prefix must be at most 64 characters, no spaces".into());
        }
        let lease = lease.unwrap_or(Duration::from_secs(10));
        if lease < Duration::from_millis(300) {
            return Err("upstream_lease_ms must be at least 300".into());
        }
        Ok(Self::Redis(RedisStoreConfig {
            url: store.to_owned(),
            replica_id: replica_id.map_or_else(random_replica_id, str::to_owned),
            key_prefix: key_prefix.to_owned(),
            lease,
            timeout: timeout.unwrap_or(Duration::from_secs(2)),
            advertise_url: None,
            record_format,
        }))
    }
}

/// Checks an `advertise_url`: `http://HOST:PORT` (a trailing `/` allowed), nothing
/// else, since the path of a forwarded request is its own.
pub fn check_advertise_url(url: &str) -> Result<(), String> {
    let refused = || format!("advertise_url must be http://HOST:PORT, not {url:?}");
    let uri: http::Uri = url.parse().map_err(|_| refused())?;
    let plain = uri.scheme_str() == Some("http")
        && uri.authority().is_some_and(|a| a.port_u16().is_some())
        && matches!(uri.path(), "" | "/")
        && uri.query().is_none();
    if plain {
        Ok(())
    } else {
        Err(refused())
    }
}

/// The URL schemes of a shared store: Redis over TCP, or over a Unix socket on the
/// same machine (`redis+unix:///PATH?db=DB`, `unix://` the same; redis-rs reads both).
const SHARED_SCHEMES: &[&str] = &["redis://", "redis+unix://", "unix://"];

/// A refused `session_store` as an error may show it: a URL by its scheme only, since
/// the rest may hold a password; anything else (a misspelled `memory`) as given, cut
/// to 64 characters.
fn shown(store: &str) -> String {
    match store.split_once("://") {
        Some((scheme, _)) => format!("a {:?} URL", scheme.chars().take(16).collect::<String>()),
        None => format!("{:?}", store.chars().take(64).collect::<String>()),
    }
}

fn random_replica_id() -> String {
    let mut bytes = [0u8; 6];
    if getrandom::fill(&mut bytes).is_err() {
        return format!("replica-{}", std::process::id());
    }
    format!("replica-{}", crate::digest::hex(&bytes))
}

/// The store could not be used; requests of shared sessions fail with `-32603` and
/// `data.reason = "sessionStoreUnavailable"`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis refused or dropped the command, or could not be reached.
    #[cfg(feature = "redis")]
    #[error("session store unreachable: {source}")]
    Unreachable {
        /// What the client said.
        source: ::redis::RedisError,
    },
    /// The store is a part this build left out.
    #[error(transparent)]
    NotBuilt(#[from] dualera_common::parts::NotBuilt),
    /// A command took longer than `session_store_timeout_ms`.
    #[error("session store did not answer within {timeout:?}")]
    Timeout {
        /// The bound.
        timeout: Duration,
    },
    /// Stored data that does not decode (another build, or corruption).
    #[error("session store holds unreadable data: {reason}")]
    Corrupt {
        /// What did not decode.
        reason: String,
    },
    /// Other replicas kept changing the session while this one tried to store it.
    #[error("session store contention: {attempts} compare-and-set attempts failed")]
    Contention {
        /// How many were made.
        attempts: u32,
    },
}

/// What looking a session up found.
#[derive(Debug)]
pub(super) enum Lookup<H> {
    /// The session, bound to this caller (or a handle whose operations check).
    Found(H),
    /// None for this caller; `anonymous` when a session of that id exists and was
    /// opened without credentials (see `legacy_http::session_missing`).
    NotFound {
        /// The session found was opened without credentials.
        anonymous: bool,
    },
}

/// One upstream exchange, driven by whoever holds it.
pub(super) type Exchange = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The first upstream exchange a step started, left for the host request's handler to
/// drive itself (no hand-off to a task and back on the common path). Dropped before it
/// finishes — the handler got its answer, or its client went away — the rest runs as
/// a task: a host request that stops waiting never cancels upstream work (2025-11-25:
/// a disconnection is not a cancellation).
pub(super) struct Detachable(pub(super) Option<Exchange>);

impl Detachable {
    /// Drives the exchange until the upstream accepted or refused it (`head`), it
    /// ended, or [`HEAD_WAIT`] passed. The exchange itself settles `head`, from inside
    /// its own poll, so nothing else needs to wake this wait.
    pub(super) async fn wait_head(&mut self, head: &HeadWatch) {
        if self.0.is_none() {
            return;
        }
        let sleep = tokio::time::sleep(HEAD_WAIT);
        tokio::pin!(sleep);
        std::future::poll_fn(|cx| {
            if let Some(exchange) = self.0.as_mut() {
                if exchange.as_mut().poll(cx).is_ready() {
                    self.0 = None;
                }
            }
            if self.0.is_none() || head.settled() {
                return Poll::Ready(());
            }
            sleep.as_mut().poll(cx)
        })
        .await;
    }

    /// Awaits `wait` while driving the exchange in place; what is left of it runs as a
    /// task once this is dropped (so also when the caller stops waiting).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the shared store only
    pub(super) async fn drive_while<T>(&mut self, wait: impl Future<Output = T>) -> T {
        tokio::pin!(wait);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = wait.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            if let Some(exchange) = self.0.as_mut() {
                if exchange.as_mut().poll(cx).is_ready() {
                    self.0 = None;
                    // Its end may have decided what `wait` waits for.
                    return wait.as_mut().poll(cx);
                }
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        if let (Some(rest), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(rest);
        }
    }
}

/// Why a step stored nothing.
#[derive(Debug)]
pub(super) enum StepError<R> {
    /// No such session for this caller (or it ended); `anonymous` when one of that
    /// id exists and was opened without credentials.
    NotFound { anonymous: bool },
    /// The store failed.
    Store(StoreError),
    /// The session's state is unusable (a panic while it was held): `500`.
    Broken,
    /// The input was refused; nothing changed but what the machine observed.
    Refused(R),
}

impl<R> StepError<R> {
    /// The same failure with the refusal mapped.
    pub(super) fn map_refused<Q>(self, f: impl FnOnce(R) -> Q) -> StepError<Q> {
        match self {
            Self::NotFound { anonymous } => StepError::NotFound { anonymous },
            Self::Store(e) => StepError::Store(e),
            Self::Broken => StepError::Broken,
            Self::Refused(r) => StepError::Refused(f(r)),
        }
    }
}

impl<R> From<StoreError> for StepError<R> {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// Who feeds a step: the host request in hand, if one is.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Feeding<'a> {
    /// Its `Authorization`: the upstream calls the step starts carry it.
    pub(super) auth: Option<&'a HeaderValue>,
    /// Told whether the upstream accepted the first exchange the step starts, which
    /// the step then leaves to the caller ([`Stepped::exchange`]).
    pub(super) head: Option<&'a Arc<HeadWatch>>,
}

/// What a step did: `feed`'s value (or why nothing was stored), and the first exchange
/// it started when the caller passed a head watch.
pub(super) struct Stepped<T, R> {
    pub(super) fed: Result<T, StepError<R>>,
    pub(super) exchange: Detachable,
}

/// What a step sees of a session's state: its machine and its streams.
pub(super) trait StepState {
    /// The session's machine.
    fn machine(&mut self) -> &mut Session;
    /// A stream for `peer` is open and has not sent its last message.
    fn busy(&self, peer: &PeerStream) -> bool;
    /// A host request arrived (where the state lives in this process, its duration is
    /// timed from here).
    fn started(&mut self, id: &RequestId);
    /// Opens the standalone stream (or finds it open) for a `GET` carrying `auth`
    /// (kept while that `GET` is open: `subscriptions/listen` runs on its behalf): its
    /// number and last sequence number.
    fn open_standalone(&mut self, auth: Option<&HeaderValue>) -> (u64, u64);
    /// The standalone stream's `GET` went away: its credentials go too.
    fn close_standalone(&mut self);
    /// Opens the stream of a host request's POST: its number (the first part of its
    /// event ids). Every upstream attempt of the request carries `trace`, and `auth`
    /// until another host request of it brings its own.
    fn open(
        &mut self,
        peer: &PeerStream,
        trace: Option<&Arc<TraceContext>>,
        auth: Option<&HeaderValue>,
    ) -> u64;
}

/// A session whose `initialize` succeeded, for its store to keep
/// ([`SessionStore::create`]).
pub(super) struct Created {
    /// Its id.
    pub(super) sid: String,
    /// Its machine, ready.
    pub(super) machine: Session,
    /// What the machine observed during the handshake.
    pub(super) observed: Vec<Observation>,
    /// The `initialize` request's id, and when it arrived (its duration is timed).
    pub(super) init: (RequestId, std::time::Instant),
    /// The `initialize`'s `Authorization`, forwarded headers, trace context and peer.
    pub(super) auth: Option<HeaderValue>,
    pub(super) forwarded: Forwarded,
    pub(super) trace: Option<Arc<TraceContext>>,
    pub(super) peer: Option<std::net::IpAddr>,
}

/// Why a session was not stored.
#[derive(Debug)]
pub(super) enum NotCreated {
    /// `max_sessions` reached, and every session has a request in flight: `503`.
    Full,
    /// The caller holds `max_sessions_per_caller`, all busy: `429`.
    CallerFull,
    /// The store failed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the shared store only
    Store(StoreError),
}

/// Why the standalone stream could not be held for a `GET`.
#[derive(Debug)]
pub(super) enum Held {
    /// Another `GET` holds it: `409`.
    Conflict,
    /// What kept a step from running.
    Failed(StepError<()>),
}

/// An operation a store served, for its log line ([`SessionStore::served`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Served<'a> {
    /// A request, with its method as the host spelled it.
    Request(&'a RequestId, &'a str),
    /// A notification or a reply.
    Message(&'static str),
    /// `DELETE`.
    Delete,
}

/// Where the sessions of the Streamable HTTP front live. The front
/// (`legacy_http`) writes each operation once over the narrow part: [`find`],
/// [`step`], [`end`]; for `initialize` a machine ([`new_machine`]) that the driver
/// takes through its handshake before the store keeps it ([`create`]); for a
/// request's POST [`post`], [`first_message`], [`respond`]; for a `GET` [`hold`] and
/// [`attach`]; for a `GET` with `Last-Event-ID` [`resume`] (what it replays from is
/// what a stream *is* in each store; the front answers its failures).
///
/// [`find`]: SessionStore::find
/// [`step`]: SessionStore::step
/// [`end`]: SessionStore::end
/// [`post`]: SessionStore::post
/// [`first_message`]: SessionStore::first_message
/// [`respond`]: SessionStore::respond
/// [`hold`]: SessionStore::hold
/// [`attach`]: SessionStore::attach
/// [`new_machine`]: SessionStore::new_machine
/// [`create`]: SessionStore::create
/// [`resume`]: SessionStore::resume
/// A host message a step is fed, with the request body it was read from: what a step
/// may need more than once ([`SessionStore::step`]) without copying the message.
///
/// The shared store feeds a step again after a conflicting writer, from the current
/// state, so it keeps a copy of its input before the first attempt. A copy of this
/// is the body alone (a reference count), read again only when a later attempt takes
/// it: where a deep copy of the message (its params' map and strings) was made, and
/// dropped, for every request and reply a replica stepped.
#[derive(Debug)]
pub(crate) struct Fed<T> {
    message: Option<T>,
    body: Bytes,
    read: fn(&[u8]) -> Option<T>,
}

impl<T> Fed<T> {
    /// `message`, read from `body` by `read`.
    pub(crate) fn new(message: T, body: Bytes, read: fn(&[u8]) -> Option<T>) -> Self {
        Self {
            message: Some(message),
            body,
            read,
        }
    }

    /// The message: the one read first, else the body read again (`None` only if
    /// reading it again gives something else, which a body read once cannot).
    pub(crate) fn take(self) -> Option<T> {
        self.message.or_else(|| (self.read)(&self.body))
    }
}

impl<T> Clone for Fed<T> {
    fn clone(&self) -> Self {
        Self {
            message: None,
            body: self.body.clone(),
            read: self.read,
        }
    }
}

pub(super) trait SessionStore: Send + Sync {
    /// A session found for a caller (what the operations below act on).
    type Session: Send + Sync;

    /// A session's state while a step holds it ([`StepState`]).
    type State<'s>: StepState
    where
        Self: 's;

    /// A POST waiting for its stream's first message ([`SessionStore::post`]).
    type Post: Send;

    /// The standalone stream held for a `GET` ([`SessionStore::hold`]).
    type Hold: Send;

    /// One step of the session's machine: load its state, `feed` it `input`, plan,
    /// store what changed (compare-and-set on the version, with the messages appended
    /// to their streams, where the state is shared), then perform the rest (upstream
    /// exchanges started, cancelled; leases; timers). `feed` may run more than once
    /// (a conflicting writer): the first time with `input` itself, later with a copy
    /// of it, made before the first (a [`Fed`] message's copy is its body); an `Err`
    /// from it stores nothing but the machine's observations.
    fn step<I, T, R, F>(
        &self,
        gw: &Arc<Route>,
        session: &Self::Session,
        feeding: Feeding<'_>,
        input: I,
        feed: F,
    ) -> impl Future<Output = Stepped<T, R>> + Send
    where
        I: Clone + Send + Sync,
        T: Send,
        R: Send,
        F: for<'s> FnMut(&mut Self::State<'s>, I, Timestamp) -> Result<T, R> + Send;

    /// Before the step that opens a POST's stream: what will wait for its first
    /// message (registered first, so that no wake-up is missed).
    fn post(&self, session: &Self::Session) -> Self::Post;

    /// Inside that step, once the stream is open: `post` waits on `peer`'s stream
    /// (the step's messages for it are kept for the POST to answer with, not only
    /// appended). Binding again to the same stream changes nothing.
    fn bind(&self, session: &Self::Session, post: &mut Self::Post, peer: &PeerStream);

    /// Waits up to [`FIRST_MESSAGE_WAIT`](super::legacy_http::FIRST_MESSAGE_WAIT) for the stream's first message, driving the
    /// step's `exchange` meanwhile; with `head`, no answer is committed before the
    /// upstream accepted (or refused) the exchange, up to [`HEAD_WAIT`].
    fn first_message(
        &self,
        session: &Self::Session,
        post: &mut Self::Post,
        exchange: &mut Detachable,
        head: Option<&HeadWatch>,
    ) -> impl Future<Output = ()> + Send;

    /// The POST's answer: JSON when its stream carried only its final message, else an
    /// SSE stream of what it carried so far and everything that follows.
    fn respond(
        &self,
        gw: &Arc<Route>,
        session: &Self::Session,
        post: Self::Post,
        number: u64,
    ) -> impl Future<Output = Response<GatewayBody>> + Send;

    /// The POST is answered otherwise (the upstream refused the credentials): its
    /// stream is forgotten.
    fn forget(&self, session: &Self::Session, post: Self::Post);

    /// The session ends (`DELETE`): its machine closes, its streams end, its upstream
    /// work is cancelled.
    fn end(
        &self,
        gw: &Arc<Route>,
        session: &Self::Session,
    ) -> impl Future<Output = Result<(), StepError<()>>> + Send;

    /// What logs name the session by ([`crate::digest::log_tag`], never the id).
    fn tag<'a>(&self, session: &'a Self::Session) -> std::borrow::Cow<'a, str>;

    /// One line at `info` per operation served, where the store logs them (the shared
    /// store: which replica served which session's request).
    fn served(&self, session: &Self::Session, what: Served<'_>);

    /// The session `id`, if it exists and is bound to `authorization`'s caller.
    /// `NotFound` becomes 404. A store that checks existence inside each operation
    /// (one read, not two) may return a handle without looking.
    fn find(
        &self,
        gw: &Arc<Route>,
        id: &str,
        authorization: Option<&HeaderValue>,
    ) -> impl Future<Output = Result<Lookup<Self::Session>, StoreError>> + Send;

    /// A new session's machine (`sid`: its id, for the ids the machine mints).
    fn new_machine(&self, sid: &str) -> Session;

    /// The clock of this store's machines.
    fn now(&self) -> Timestamp;

    /// Stores a session whose `initialize` succeeded (its machine is ready): admission
    /// (`max_sessions`, `max_sessions_per_caller`, evicting idle sessions to make
    /// room) is decided here.
    fn create(
        &self,
        gw: &Arc<Route>,
        created: Created,
    ) -> impl Future<Output = Result<(), NotCreated>> + Send;

    /// `GET` with `Last-Event-ID`: stream `number` again from after event `after`, on
    /// this connection (the stream's previous connection, if any, ends). Refused
    /// when the session has no such stream the peer was told of (never announced,
    /// answered as JSON, or forgotten): the front answers that, as every failure.
    fn resume(
        &self,
        gw: &Arc<Route>,
        session: &Self::Session,
        number: u64,
        after: u64,
    ) -> impl Future<Output = Result<Response<GatewayBody>, StepError<()>>> + Send;

    /// The standalone `GET` stream is one connection at a time: held for this `GET`
    /// until it attaches ([`SessionStore::attach`]) or lets go.
    fn hold(
        &self,
        session: &Self::Session,
    ) -> impl Future<Output = Result<Self::Hold, Held>> + Send;

    /// The standalone stream was not opened after all (the upstream refused the
    /// credentials): the hold goes.
    fn release(&self, session: &Self::Session, hold: Self::Hold)
        -> impl Future<Output = ()> + Send;

    /// The held standalone stream, opened by a step at (`number`, `seq`), answers this
    /// `GET`: a priming event, what the stream carried since, and what follows.
    fn attach(
        &self,
        gw: &Arc<Route>,
        session: &Self::Session,
        hold: Self::Hold,
        number: u64,
        seq: u64,
    ) -> Response<GatewayBody>;

    /// The session was opened without credentials.
    fn anonymous(&self, session: &Self::Session) -> bool;
}

/// The shared store's counters, read at each scrape (registered only when a
/// `redis://` store is configured).
#[derive(Debug)]
pub(crate) struct StoreCollector(pub(crate) Arc<redis::RedisSessions>);

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::TypedMetric;
        let metric = ConstCounter::new(self.0.round_trips());
        let family = encoder.encode_descriptor(
            "dualera_store_redis_round_trips",
            "Calls this replica sent to Redis through its session store (a script or a \
             pipeline counts one)",
            None,
            ConstCounter::<u64>::TYPE,
        )?;
        metric.encode(family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(format: Option<&str>) -> Result<SessionStoreConfig, String> {
        SessionStoreConfig::parse("redis://127.0.0.1:6379/0", None, None, None, None, format)
    }

    fn format_of(c: SessionStoreConfig) -> RecordFormat {
        match c {
            SessionStoreConfig::Redis(r) => r.record_format,
            SessionStoreConfig::Memory => panic!("a redis:// store"),
        }
    }

    #[test]
    fn a_fed_message_is_taken_first_and_its_copies_read_the_body_again() {
        fn words(b: &[u8]) -> Option<Vec<String>> {
            let text = std::str::from_utf8(b).ok()?;
            (!text.is_empty()).then(|| text.split(' ').map(str::to_owned).collect())
        }
        let first = vec!["first".to_owned()];
        let fed = Fed::new(first.clone(), Bytes::from_static(b"read again"), words);
        let copy = fed.clone();
        // The copy holds the body alone: no copy of the message is made for it.
        assert!(copy.message.is_none());
        assert_eq!(fed.take(), Some(first));
        assert_eq!(
            copy.clone().take(),
            Some(vec!["read".into(), "again".into()])
        );
        let unreadable = Fed::new(vec![], Bytes::new(), words).clone();
        assert_eq!(unreadable.take(), None);
    }

    #[test]
    fn the_record_format_is_msgpack_unless_told_json_and_nothing_else() {
        assert_eq!(format_of(parse(None).unwrap()), RecordFormat::MessagePack);
        assert_eq!(
            format_of(parse(Some("msgpack")).unwrap()),
            RecordFormat::MessagePack
        );
        assert_eq!(format_of(parse(Some("json")).unwrap()), RecordFormat::Json);
        let e = parse(Some("JSON")).unwrap_err();
        assert_eq!(
            e,
            "session_record_format must be \"msgpack\" or \"json\", not \"JSON\""
        );
        // A typo is refused even where it would not be used yet.
        assert!(SessionStoreConfig::parse("memory", None, None, None, None, Some("cbor")).is_err());
    }

    #[test]
    fn a_shared_store_is_redis_over_tcp_or_a_unix_socket_and_a_refusal_hides_the_url() {
        let store = |url: &str| SessionStoreConfig::parse(url, None, None, None, None, None);
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis+unix:///run/redis/redis.sock?db=2",
            "unix:///run/redis/redis.sock",
        ] {
            match store(url).unwrap() {
                SessionStoreConfig::Redis(r) => assert_eq!(r.url, url),
                SessionStoreConfig::Memory => panic!("{url} is a shared store"),
            }
        }
        // TLS to Redis is not built; the password in the URL stays out of the error.
        let e = store("rediss://:hunter2@cache.example:6380/0").unwrap_err();
        assert!(e.ends_with("not a \"rediss\" URL"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = store("memroy").unwrap_err();
        assert!(e.ends_with("not \"memroy\""), "{e}");
    }
}
