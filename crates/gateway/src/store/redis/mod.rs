//! Legacy Streamable HTTP sessions shared through Redis (`session_store =
//! "redis://…"`): the second driver of the adapters' session machine, beside the
//! in-memory one (`legacy_http`), so that any replica behind a plain, non-sticky load
//! balancer serves any request of any session.
//!
//! One request is one *step*: load the session's record and machine, feed one input,
//! drain the machine's events into effects, and store the new state together with
//! those effects in one compare-and-set script (version check; a conflict returns the
//! current state and the step is fed again from it). Only once stored does the replica
//! perform what the machine asked: start upstream exchanges, answer the host. One
//! step answers first: the one whose only effect is a plain `tools/call`'s answer as a
//! JSON body, stored with the session's next step ([`Unstored`]).
//!
//! ```text
//!  host ─► LB ─► replica A: load ─► feed ─► CAS{state, XADD, lease, timer, PUBLISH} ─► exchange ─► upstream
//!                replica B: SSE relay ◄── pub/sub wake-up ◄────────────┘ (then XRANGE: the data is in the stream)
//!                replica A: its own SSE relay ◄── the step's entries, handed over in memory (no wake-up, no read)
//!                replica C: sweeper ─► due timers, leases past their deadline (redo the exchange)
//! ```
//!
//! - Every SSE stream is a Redis Stream; event ids `N.SEQ` are unique within the
//!   session (stream N, its SEQth entry), and `GET` with `Last-Event-ID` on any replica
//!   replays that stream only, then keeps relaying it.
//! - The replica that receives a round's last answer runs the retry itself, under a
//!   lease (owner + deadline, renewed at a third of it); when that replica dies, a
//!   sweeper elsewhere takes the lease over after its deadline and sends the same
//!   request again: upstream calls are at-least-once across a replica death, once the
//!   host can receive their outcome. A request's first attempt, which its own POST
//!   drives, is leased only once that POST shows the host something to resume (or has
//!   run a third of the lease): one answered before, as most are, costs no lease
//!   ([`PendingLease`]).
//! - Timers (live-request deadlines, paused rounds, subscription retries) sit in a
//!   shared sorted set that every replica's sweeper claims from.
//! - A step that leaves the host owing an answer (a live request out) pushes the new
//!   state to the other replicas that step the session
//!   (`RedisSessions::remember_pushed`): the answer may reach any of them, and one
//!   that remembered an older state would read the current one back from a conflict
//!   first.
//! - Nothing is served from a copy: when Redis cannot be reached, requests of shared
//!   sessions fail with `-32603` and `data.reason = "sessionStoreUnavailable"`.

mod backlog;
pub(crate) mod client;
mod exchange;
pub(crate) mod keys;
mod relay;
mod stored;
mod wake;

use self::backlog::{Backlog, Progress};
use self::client::{Checked, Loaded, Redis, Stored as CasResult};
use self::keys::{valid_session_id, Keys};
use self::stored::{codec, Append, LeaseRecord, NewLease, Ops, Record};
use self::wake::{Handed, Inbox, Waiter, Wake, Wakes};
use crate::auth::BindingKey;
use crate::body::{full, GatewayBody};
use crate::digest::log_tag;
use crate::driver::{self, HeadWatch, Out};
use crate::forwarded::Forwarded;
use crate::legacy_http::{self, FINISHED_KEPT, FIRST_MESSAGE_WAIT, HEAD_WAIT};
use crate::store::{
    Created, Detachable, Exchange, Feeding, Held, Lookup, NotCreated, OwnHasher, RecordFormat,
    RedisStoreConfig, Served, SessionStore, StepError, Stepped, StoreError,
};
use crate::telemetry::WIRE_HTTP;
use crate::{GatewayConfig, Route};
use dashmap::DashMap;
use dualera_adapters::session::Footprint;
use dualera_adapters::usage::{Feature, Observation};
use dualera_adapters::{
    Config as MachineConfig, PeerStream, RequestId, Session, Timestamp, UpstreamRole,
};
use http::header::{self, HeaderValue};
use http::Response;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// How often a stream's relay renews its hold and checks its connection.
const HOLD_TICK: Duration = Duration::from_secs(2);
/// A relay's hold lasts this long without renewal.
const HOLD: Duration = Duration::from_secs(8);
/// Cancellations from other replicas waiting for this one's exchanges to be aborted.
const CANCELS_QUEUED: usize = 1024;
/// Compare-and-set attempts before a step gives up.
const MAX_ATTEMPTS: u32 = 32;
/// Discover results kept decoded, by digest.
const DISCOVERS_KEPT: usize = 64;
/// Sessions whose last stored version a replica remembers, to try its next step's
/// compare-and-set without reading first.
const VERSIONS_KEPT: usize = 4096;
/// Finished ids a shared session remembers (the machine's `retired_ids`): every step
/// reads and writes the whole record, and ids older than this are still told apart
/// from unknown ones by their shape.
const RETIRED_IDS: usize = 16;

/// How often a session's last use moves in the `sessions` and caller zsets, for an
/// idle TTL: a sixteenth of it, at most a minute.
fn touch_ms(idle_ttl: Duration) -> u64 {
    u64::try_from(idle_ttl.as_millis() / 16)
        .unwrap_or(u64::MAX)
        .min(60_000)
}

fn idle_ttl_ms(idle_ttl: Duration) -> u64 {
    u64::try_from(idle_ttl.as_millis()).unwrap_or(u64::MAX)
}

/// The session hash's TTL for an idle TTL: the idle TTL plus [`touch_ms`]. Only a step
/// that moves the session's last use renews it (a replica does so at most every
/// `touch_ms`, and remembers when), so a session is still there the whole idle TTL
/// after its last step, one `PEXPIRE` a step the cheaper; open streams and leases
/// renew it too.
fn session_ttl_ms(idle_ttl: Duration) -> u64 {
    idle_ttl_ms(idle_ttl).saturating_add(touch_ms(idle_ttl))
}

/// Milliseconds since the Unix epoch: the machine's clock in a shared session, so that
/// its deadlines mean the same on every replica (their clocks must agree to well under
/// a second).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

use crate::digest::hex;

fn same(a: &str, b: &str) -> bool {
    crate::digest::constant_time_eq(a.as_bytes(), b.as_bytes())
}

/// A shared session as the front found it: its id and the caller's binding. Whether
/// it exists is learned by the operation (one read, not two).
#[derive(Debug)]
pub(crate) struct RedisSession {
    id: String,
    binding: String,
    /// The request carries no credentials.
    anonymous: bool,
}

/// Whether a POST answers with JSON or opens an SSE stream, decided by the first
/// message for its stream: one final response within the first second is JSON (and
/// never stored in Redis); anything else is SSE, relayed from the stream.
#[derive(Debug)]
struct Decider {
    state: Mutex<Decision>,
    notify: Notify,
    /// The token its relay will hold the stream with.
    token: String,
    /// The entries for its relay, not yet sent: the relay sends them without reading
    /// them back. This replica's steps hand theirs over (the deciding step also took
    /// the hold; a later one only while the relay still holds the stream, as its
    /// compare-and-set checks); another replica's come through pub/sub, addressed to
    /// `token`.
    inbox: Arc<Inbox>,
    /// How far its relay has sent the stream (registered in the [`Backlog`] once a
    /// step decided that the POST streams, so the exchange waits for the relay from
    /// its first entries on).
    progress: Arc<Progress>,
}

impl Decider {
    fn new(token: String) -> Self {
        Self {
            state: Mutex::new(Decision::Deciding),
            notify: Notify::new(),
            token,
            inbox: Arc::new(Inbox::default()),
            progress: Progress::starting_after(0),
        }
    }
}

#[derive(Debug, Default, Clone)]
enum Decision {
    #[default]
    Deciding,
    /// A step holds the answer (to send as JSON, or the first entries of the
    /// stream) and is storing the state.
    Claimed,
    /// Stored: answer with this JSON.
    Json(Vec<u8>),
    /// Relay the stream.
    Streaming,
}

impl Decider {
    fn set(&self, to: Decision) {
        if let Ok(mut s) = self.state.lock() {
            *s = to;
        }
        self.notify.notify_waiters();
    }
}

/// What a replica remembers of a session it stepped: the version and state it stored
/// (or read), the decoded record, taken by the next step (steps of one session on one
/// replica are serialized) so that it is not decoded again, and when this replica last
/// moved the session's last use in the zsets (see `RedisSessions::plan`).
struct Remembered {
    version: String,
    state: Arc<Vec<u8>>,
    record: Option<Box<Record>>,
    touched: u64,
}

fn remember(
    version: String,
    state: Vec<u8>,
    record: Option<Box<Record>>,
    touched: u64,
) -> Arc<Mutex<Remembered>> {
    Arc::new(Mutex::new(Remembered {
        version,
        state: Arc::new(state),
        record,
        touched,
    }))
}

/// Who fed a step.
#[derive(Debug, Default)]
struct Ctx {
    /// The caller's binding; `None` for the replica's own inputs (timers, exchanges).
    binding: Option<String>,
    /// The `Authorization` of the host request in hand.
    auth: Option<String>,
    /// The step ends the session (DELETE).
    tomb: bool,
    /// The step fires timers the sweeper claimed.
    timer: bool,
    /// The step feeds the end of this upstream exchange (its lease goes).
    done_upstream: Option<RequestId>,
    /// The host request waiting on the first exchange the step starts.
    head: Option<Arc<HeadWatch>>,
    /// Where that first exchange is left for the host request's handler to drive
    /// itself (no hand-off to a task and back on the common path), when it asks.
    inline: Option<Mutex<Option<Running>>>,
    /// The step writes the session's pending leases ([`PendingLease`]) whose exchanges
    /// still run, though it appends nothing.
    write_leases: bool,
    /// The upstream's last message of an exchange the host request's handler drove,
    /// to feed again if the step is answered before it is stored ([`Unstored`]).
    replay: Option<driver::Input>,
    /// Asked for by an exchange's feed (the only reader), set when the step is stored:
    /// the last sequence number it appended to each stream, by the stream's holder
    /// key, and whether another replica's relay holds that stream (what an exchange
    /// waits for its relay to send before feeding more, see `backlog`).
    appended: Option<Mutex<Vec<Appended>>>,
}

/// What a stored step appended to one stream: its holder key, the last sequence
/// number, whether another replica's relay holds it.
type Appended = (String, u64, bool);

/// An upstream exchange to run once a step is stored, and what it runs under here.
#[derive(Debug)]
struct Running {
    start: driver::Start,
    /// Its lease (none for `server/discover`, which nothing redoes).
    lease: Option<String>,
    head: Option<Arc<HeadWatch>>,
    /// The forwarded headers of the request that opened the session.
    forwarded: Forwarded,
}

/// The lease of a request's first attempt that its own POST drives, not written yet.
///
/// A lease lets another replica send a request again when the replica running it dies,
/// so that a host still able to receive the outcome gets it. Until the POST's stream
/// shows the host anything (its priming event or a first message) the host has
/// nothing to resume: a replica death ends the POST with a broken connection, and a
/// request sent again then would be a second upstream call whose answer nobody reads.
/// So the step that starts such an exchange leaves its lease here, and it is written
/// only by the first of: a step of the session that appends to a stream (the answer's
/// step drops it unwritten instead), the POST answering with a stream (before its
/// priming event), and the exchange's first renewal tick (a third of the lease). A
/// first attempt answered at once, as most are, costs no lease: three commands when
/// it starts and two when it ends, fewer. Retries (the outcome goes to a stream the
/// host already holds) and every other exchange write theirs when they start.
#[derive(Debug)]
struct PendingLease {
    /// The upstream request (its lease key is the usual one, `Keys::lease`).
    id: RequestId,
    record: LeaseRecord,
}

/// Sessions with pending leases a replica keeps at most (beyond, leases are written
/// when their exchanges start).
const PENDING_SESSIONS: usize = 4096;

/// The last steps of plain `tools/call`s answered with one JSON body that a session's
/// record does not hold yet: each is answered before it is stored, then stored with
/// the session's next step on this replica (which starts from it: one round trip where
/// there were two), or by the sweeper once [`UNSTORED_FOR`] old, or at shutdown.
///
/// Only a step whose one effect is the answer, which ends the call and changes nothing
/// else the session keeps (`Session::answers_plain_call`, and its footprint compared),
/// and whose request's lease was never written ([`PendingLease`]) waits so; nothing
/// waits on its being stored. The answer went out in the POST's body, which no
/// resumption replays. No replica sends the request again: no lease of it exists. An
/// answer that records a task or a tool's headers is stored first: the host may rely on
/// it at once, on any replica. Another replica stepping the session
/// meanwhile finds the request still in flight, as it would while the upstream
/// answers; the next compare-and-set here then conflicts, and the answers are fed
/// again onto the current state, their streams forgotten rather than stored. A replica
/// that dies first leaves the request in flight in the shared state, as one that dies
/// while the upstream answers does; the host has its answer.
struct Unstored {
    replays: Vec<Replay>,
    /// When the oldest was answered.
    since: tokio::time::Instant,
    /// The sweeper's step storing them runs (one at a time, however long Redis takes).
    storing: bool,
}

/// An unstored step ([`Unstored`]): the upstream's answer it fed, and the streams it
/// answered with JSON.
#[derive(Clone)]
struct Replay {
    input: driver::Input,
    answered: Vec<PeerStream>,
    /// The size of the answer it sent: what it counts against [`UNSTORED_BYTES`].
    bytes: usize,
}

/// Sessions with unstored steps a replica keeps at most (beyond, steps are stored
/// before they answer).
const UNSTORED_SESSIONS: usize = 1024;
/// Unstored steps one session keeps at most.
const UNSTORED_PER_SESSION: usize = 4;
/// The answers of unstored steps a replica keeps at most, in bytes (each keeps the
/// upstream's answer to feed again).
const UNSTORED_BYTES: usize = 8 << 20;
/// How long a step waits for the session's next one before the sweeper stores it.
const UNSTORED_FOR: Duration = Duration::from_millis(50);
/// A step Redis did not take this long after it was answered is given up (logged).
const UNSTORED_AT_MOST: Duration = Duration::from_secs(30);
/// How long shutdown waits for them to be stored.
const UNSTORED_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// One stream's messages in a step: the stream, its messages with "is last", and
/// whether it was closed without a last message.
type Group = (PeerStream, Vec<(Vec<u8>, bool)>, bool);

/// Entries a step hands to this replica's relay of their stream.
struct Handing {
    relay: Arc<Decider>,
    entries: Vec<Handed>,
    /// The stream's holder key.
    holder: String,
    /// This step decided that the POST streams (else it was streaming already).
    decided: bool,
}

/// What a stored step leaves to do.
#[derive(Default)]
struct After {
    starts: Vec<Running>,
    cancels: Vec<RequestId>,
    /// What is left of the step's plan: its log lines.
    plan: driver::Plan,
    json: Vec<(Arc<Decider>, Vec<u8>)>,
    /// The streams of `json`.
    answered: Vec<PeerStream>,
    /// Entries for this replica's relays (they are handed over if the step script
    /// found the relay still holding the stream).
    streaming: Vec<Handing>,
    appended: bool,
    /// The machine's observations, recorded once the step is stored.
    observed: Vec<Observation>,
    /// The lease the step's inline exchange leaves pending, once stored.
    deferred: Option<PendingLease>,
    /// Pending leases the step wrote, or dropped unwritten (the exchange ended, or was
    /// cancelled): no longer pending once stored.
    settled: Vec<RequestId>,
}

impl After {
    /// The step was not stored: deciders it claimed go back to deciding.
    fn revert(&self) {
        for (d, _) in &self.json {
            d.set(Decision::Deciding);
        }
        for h in &self.streaming {
            if h.decided {
                h.relay.set(Decision::Deciding);
            }
        }
    }
}

/// How long a replica's registration ([`RedisSessions::advertise`]) outlives its
/// last refresh.
const REGISTRATION_TTL: Duration = Duration::from_secs(5);
/// How often a running replica refreshes it.
const REGISTRATION_REFRESH: Duration = Duration::from_secs(1);

/// The shared sessions of one replica.
pub(crate) struct RedisSessions {
    redis: Arc<Redis>,
    keys: Keys,
    replica: String,
    lease: Duration,
    machine: Arc<MachineConfig>,
    idle_ttl: Duration,
    keepalive: Duration,
    replay: usize,
    max_sessions: usize,
    max_per_caller: usize,
    /// Bytes queued toward one host connection before it counts as not reading.
    max_buffered: usize,
    /// How long a relay waits for a slow host to take what is queued.
    stalled_reader_timeout: std::time::Duration,
    wakes: Arc<Wakes>,
    /// How far the relays of the streams this replica's exchanges feed have sent them
    /// (this replica's, and others' through their acks).
    backlog: Arc<Backlog>,
    deciders: DashMap<(String, PeerStream), Arc<Decider>>,
    /// By session and upstream request id (the machine's).
    exchanges: DashMap<(String, RequestId), futures_util::future::AbortHandle, OwnHasher>,
    /// One per session with a step running here; gone when none is.
    locks: DashMap<String, Arc<tokio::sync::Mutex<()>>, OwnHasher>,
    /// Leases of exchanges this replica runs, not written yet, by session
    /// ([`PendingLease`]). Read and changed only by steps of the session, which hold its
    /// lock.
    pending_leases: DashMap<String, Vec<PendingLease>, OwnHasher>,
    /// Steps answered before they were stored, by session ([`Unstored`]). Read and
    /// changed only by steps of the session, which hold its lock.
    unstored: DashMap<String, Unstored, OwnHasher>,
    /// The bytes `unstored` keeps ([`UNSTORED_BYTES`]).
    unstored_bytes: std::sync::atomic::AtomicUsize,
    /// Shutting down: every step is stored before it answers.
    closing: std::sync::atomic::AtomicBool,
    /// The last version and state this replica stored or read per session: a step
    /// starts from it and the compare-and-set says whether it is still current (a
    /// conflict returns the current state in the same round trip). Never used to
    /// answer anything on its own.
    versions: quick_cache::sync::Cache<String, Arc<Mutex<Remembered>>>,
    discovers: Mutex<Vec<(String, Arc<Value>)>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Where other replicas reach this one ([`Self::advertise`]).
    advertise_url: Option<String>,
    /// How records are written ([`stored::codec`]).
    format: RecordFormat,
    /// Names this replica's connections ([`Self::token`]).
    tokens: Tokens,
    /// Ticks every [`HOLD_TICK`] (a task of [`Self::start`]): every relay of this
    /// replica renews its hold and sends its keep-alive on it. One timer for all of
    /// them, where a timer per relay made each new stream move the runtime's next
    /// wake-up earlier (a write to wake its I/O driver, once per replicated flow).
    hold_tick: tokio::sync::watch::Sender<()>,
    /// The step script's arguments that are the same for all of this replica's steps.
    fixed: Fixed,
}

/// Numbers every step passes to its script, written once ([`stored::Ops`]).
#[derive(Debug)]
struct Fixed {
    /// The idle TTL, ms.
    ttl: String,
    /// The session hash's TTL, ms ([`session_ttl_ms`]).
    sttl: String,
    /// Entries kept per stream (the replay buffer).
    keep: String,
}

impl std::fmt::Debug for RedisSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSessions")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl RedisSessions {
    pub(crate) fn new(
        store: &RedisStoreConfig,
        config: &GatewayConfig,
    ) -> Result<Arc<Self>, StoreError> {
        let keys = Keys::new(&store.key_prefix);
        let backlog = Arc::new(Backlog::default());
        let wakes = Wakes::new(&keys, &store.replica_id, backlog.clone());
        let sink = wakes.clone();
        let redis = Redis::open(&store.url, store.timeout, move |info: ::redis::PushInfo| {
            sink.push(info);
            Ok::<(), ::redis::aio::SendError>(())
        })
        .map_err(|source| StoreError::Unreachable { source })?;
        let mut machine = legacy_http::machine_config(config);
        machine.retired_ids = RETIRED_IDS;
        // This driver's timestamps are Unix milliseconds already.
        machine.unix_at_zero_ms = 0;
        let machine = Arc::new(machine);
        let replay = config.replay_buffer.max(1);
        let fixed = Fixed {
            ttl: decimal(idle_ttl_ms(config.session_idle_ttl)),
            sttl: decimal(session_ttl_ms(config.session_idle_ttl)),
            keep: decimal(replay),
        };
        Ok(Arc::new(Self {
            redis: Arc::new(redis),
            keys,
            replica: store.replica_id.clone(),
            lease: store.lease,
            machine,
            idle_ttl: config.session_idle_ttl,
            keepalive: config.keepalive,
            replay,
            max_sessions: config.max_sessions,
            max_per_caller: config.max_sessions_per_caller,
            max_buffered: config.max_buffered_bytes,
            stalled_reader_timeout: config.stalled_reader_timeout,
            wakes,
            backlog,
            deciders: DashMap::new(),
            exchanges: DashMap::default(),
            locks: DashMap::default(),
            pending_leases: DashMap::default(),
            unstored: DashMap::default(),
            unstored_bytes: std::sync::atomic::AtomicUsize::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
            versions: quick_cache::sync::Cache::new(VERSIONS_KEPT),
            discovers: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
            advertise_url: store.advertise_url.clone(),
            format: store.record_format,
            tokens: Tokens::new(&store.replica_id),
            hold_tick: tokio::sync::watch::Sender::new(()),
            fixed,
        }))
    }

    /// This replica's name.
    pub(crate) fn replica(&self) -> &str {
        &self.replica
    }

    /// A new connection token of this replica (see [`Tokens`]).
    fn token(&self) -> String {
        self.tokens.next()
    }

    /// Whether the store answered the last command.
    pub(crate) fn ready(&self) -> bool {
        self.redis.is_up()
    }

    /// Round trips this replica made to Redis (`dualera_store_redis_round_trips`).
    pub(crate) fn round_trips(&self) -> u64 {
        self.redis.round_trips()
    }

    /// Starts the background tasks: subscriptions, the sweeper, cancellations.
    pub(crate) fn start(self: &Arc<Self>, gw: &Arc<Route>) {
        let (cancel_tx, mut cancel_rx) = tokio::sync::mpsc::channel(CANCELS_QUEUED);
        self.wakes.on_cancel(cancel_tx);
        let weak = Arc::downgrade(self);
        self.wakes.on_state(Box::new(move |sid, version, state| {
            if let Some(me) = weak.upgrade() {
                me.remember_pushed(sid, version, state);
            }
        }));
        let me = self.clone();
        let cancels = tokio::spawn(async move {
            while let Some((sid, id)) = cancel_rx.recv().await {
                if let Some((_, h)) = me.exchanges.remove(&(sid, id.clone())) {
                    debug!(rpc.id = %id, "upstream request cancelled by another replica");
                    h.abort();
                }
            }
        });
        let subs = tokio::spawn(self.wakes.clone().run(self.redis.clone()));
        // The sweeper's tick also keeps readiness current while no traffic flows.
        let sweeper = tokio::spawn(exchange::sweep(self.clone(), gw.clone()));
        let me = self.clone();
        let holds = tokio::spawn(async move {
            let mut every = tokio::time::interval(HOLD_TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                me.hold_tick.send_replace(());
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.extend([cancels, subs, sweeper, holds]);
        }
        info!(replica = %self.replica, records = self.format.as_str(), "shared session store in use");
    }

    /// Registers this replica's `advertise_url` under its id, for
    /// [`REGISTRATION_TTL`], again every [`REGISTRATION_REFRESH`] while it runs (a
    /// task of its own, stopped with the others): a replica that dies is no longer
    /// found a few seconds later. Nothing without an `advertise_url`.
    pub(crate) fn advertise(self: &Arc<Self>) {
        let Some(url) = self.advertise_url.clone() else {
            return;
        };
        let me = self.clone();
        let key = self.keys.replica(&self.replica);
        let ttl_ms = u64::try_from(REGISTRATION_TTL.as_millis()).unwrap_or(u64::MAX);
        let refresh = tokio::spawn(async move {
            loop {
                if let Err(e) = me.redis.hold(&key, &url, ttl_ms, false).await {
                    debug!(error = %e, "replica registration not refreshed");
                }
                tokio::time::sleep(REGISTRATION_REFRESH).await;
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.push(refresh);
        }
        info!(replica = %self.replica, url = %self.advertise_url.as_deref().unwrap_or_default(), "replica registered for forwarded retries");
    }

    /// Where replica `replica` said it is reached, if it is registered.
    pub(crate) async fn replica_url(&self, replica: &str) -> Result<Option<String>, StoreError> {
        let raw = self.redis.get(&self.keys.replica(replica)).await?;
        Ok(raw.and_then(|b| String::from_utf8(b).ok()))
    }

    /// Stops the background tasks and the exchanges this replica runs (their leases
    /// let another replica finish them).
    pub(crate) fn stop(&self) {
        if let Ok(mut t) = self.tasks.lock() {
            for h in t.drain(..) {
                h.abort();
            }
        }
        for e in self.exchanges.iter() {
            e.value().abort();
        }
        self.exchanges.clear();
    }

    fn new_machine(&self, sid: &str) -> Session {
        Session::with_shared_config(self.machine.clone(), format!("dualera-{}", &sid[..8]))
    }

    // ----- discover results -------------------------------------------------------

    fn discover_digest(value: &Value) -> String {
        let mut bytes = Vec::new();
        dualera_adapters::json::write::value(&mut bytes, value);
        hex(&Sha256::digest(&bytes))
    }

    async fn discover(&self, digest: &str) -> Result<Option<Arc<Value>>, StoreError> {
        if let Ok(d) = self.discovers.lock() {
            if let Some((_, v)) = d.iter().find(|(k, _)| k == digest) {
                return Ok(Some(v.clone()));
            }
        }
        let Some(bytes) = self.redis.get(&self.keys.discover(digest)).await? else {
            return Ok(None);
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            reason: format!("discover result: {e}"),
        })?;
        let value = Arc::new(value);
        let _ = self.remember_discover(digest, &value);
        Ok(Some(value))
    }

    /// Keeps a discover result this replica stored or read; true when it was new here.
    fn remember_discover(&self, digest: &str, value: &Arc<Value>) -> bool {
        let Ok(mut d) = self.discovers.lock() else {
            return true;
        };
        if d.iter().any(|(k, _)| k == digest) {
            return false;
        }
        if d.len() >= DISCOVERS_KEPT {
            d.remove(0);
        }
        d.push((digest.to_owned(), value.clone()));
        true
    }

    // ----- steps ------------------------------------------------------------------

    /// Boxed: a step's futures hold records across their awaits, and inline each one
    /// made them larger by its size, copied whenever such a future is moved (a
    /// request's future is moved as it is boxed).
    async fn decode(&self, state: &[u8]) -> Result<Box<Record>, StoreError> {
        let mut record: Box<Record> = Box::new(codec::decode(state, "session record")?);
        let discover = match &record.discover {
            Some(digest) => self.discover(digest).await?,
            None => None,
        };
        let machine = std::mem::take(&mut record.machine);
        record.machine = machine.restore(self.machine.clone(), discover);
        Ok(record)
    }

    /// Reads a session without changing it.
    async fn read(
        &self,
        sid: &str,
        binding: &str,
    ) -> Result<Result<Box<Record>, bool>, StoreError> {
        match self.redis.load(&self.keys.session(sid)).await? {
            Loaded::Found { state, .. } => {
                let record = self.decode(&state).await?;
                Ok(if same(&record.binding, binding) {
                    Ok(record)
                } else {
                    Err(record.anonymous)
                })
            }
            Loaded::Missing | Loaded::Gone => Ok(Err(false)),
        }
    }

    /// One step: load, `feed`, store with compare-and-set (again from the current state
    /// on conflict), then perform. `feed` may run several times; an `Err` from it
    /// stores nothing.
    async fn step<T, R>(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        ctx: &Ctx,
        mut feed: impl FnMut(&mut Record, Timestamp) -> Result<T, R>,
    ) -> Result<T, StepError<R>> {
        let lock = self
            .locks
            .entry(sid.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let outcome = {
            let _held = lock.lock().await;
            self.step_locked(gw, sid, ctx, &mut feed).await
        };
        drop(lock);
        self.locks.remove_if(sid, |_, l| Arc::strong_count(l) == 1);
        outcome
    }

    /// Whether the session moved on from the `version` this replica remembers: the
    /// current version and state when it did, `None` when it did not ([`CHECK`]: the
    /// state comes back only when it changed). A session gone is `NotFound`.
    ///
    /// [`CHECK`]: client::Redis::check
    async fn changed_since<R>(
        &self,
        sid: &str,
        key: &str,
        version: &str,
    ) -> Result<Option<(String, Vec<u8>)>, StepError<R>> {
        match self.redis.check(key, version).await? {
            Checked::Current => Ok(None),
            Checked::Changed { version, state } => Ok(Some((version, state))),
            Checked::Missing | Checked::Gone => {
                self.forget_session(sid);
                Err(StepError::NotFound { anonymous: false })
            }
        }
    }

    async fn step_locked<T, R>(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        ctx: &Ctx,
        feed: &mut impl FnMut(&mut Record, Timestamp) -> Result<T, R>,
    ) -> Result<T, StepError<R>> {
        let key = self.keys.session(sid);
        // Kept to store the next version in place: no new entry, key or slot a step.
        let slot = self.versions.get(sid);
        let cached = slot.as_ref().and_then(|slot| {
            let mut r = slot.lock().ok()?;
            Some((
                r.version.clone(),
                r.state.clone(),
                r.record.take(),
                r.touched,
            ))
        });
        let touched = cached.as_ref().map_or(0, |c| c.3);
        let (mut version, mut state, mut remembered, mut decoded) = match cached {
            Some((v, s, record, _)) => (v, s, true, record),
            None => match self.redis.load(&key).await? {
                Loaded::Found { version, state } => (version, Arc::new(state), false, None),
                Loaded::Missing | Loaded::Gone => {
                    self.drop_unstored(sid, |_| true);
                    return Err(StepError::NotFound { anonymous: false });
                }
            },
        };
        for _ in 0..MAX_ATTEMPTS {
            let now = wall_ms();
            let mut record = match decoded.take() {
                Some(r) => r,
                None => {
                    // A state read from Redis lacks the steps this replica answered
                    // before storing them; a remembered record holds them.
                    let mut r = self.decode(&state).await?;
                    self.replay(sid, &mut r, now);
                    r
                }
            };
            if let Some(b) = &ctx.binding {
                if !same(&record.binding, b) {
                    return Err(StepError::NotFound {
                        anonymous: record.anonymous,
                    });
                }
            }
            // A plain call's answer may be left unstored; what the session keeps
            // beside its calls is compared after the feed.
            let plain = match (&ctx.done_upstream, &ctx.replay) {
                (Some(id), Some(_)) if record.machine.answers_plain_call(id) => {
                    Some(record.machine.footprint())
                }
                _ => None,
            };
            let value = match feed(&mut record, Timestamp::from_millis(now)) {
                Ok(v) => v,
                Err(r) => {
                    if remembered {
                        // Refused by a remembered state: it stands only if that state
                        // is still the current one.
                        remembered = false;
                        if let Some((v, s)) = self.changed_since(sid, &key, &version).await? {
                            version = v;
                            state = Arc::new(s);
                            continue;
                        }
                    }
                    return Err(StepError::Refused(r));
                }
            };
            // What Redis holds of the flags the plan may change, for a step left
            // unstored.
            let (busy, due) = (record.busy, record.due);
            let (ops, mut after) = self.plan(sid, &mut record, now, ctx, touched);
            if self.may_leave_unstored(sid, ctx, plain, &record.machine, &ops, &after) {
                // Answered now, encoded and stored with the session's next step (see
                // `Unstored`). The record keeps the flags as Redis has them, so that
                // the step that stores it writes what changed.
                record.busy = busy;
                record.due = due;
                self.leave_unstored(sid, ctx, &after);
                self.observe(gw, &record.machine, std::mem::take(&mut after.observed));
                self.settle_leases(sid, &mut after);
                let next = Remembered {
                    version,
                    state,
                    record: Some(record),
                    touched,
                };
                self.keep(sid, slot.as_ref(), next);
                self.perform(gw, sid, after, ctx, &[], false);
                return Ok(value);
            }
            // Sized for the state it replaces: grown from serde_json's default of 128
            // bytes, the buffer was reallocated and copied four or five times a step.
            let mut blob = Vec::with_capacity(state.len() + 128);
            codec::encode_record(self.format, &mut record, &mut blob)?;
            let nothing = after.starts.is_empty()
                && after.cancels.is_empty()
                && ops.xadd.is_empty()
                && !ctx.tomb
                && ctx.done_upstream.is_none()
                && ops.lease_new.is_empty()
                && blob == *state;
            if nothing {
                after.revert();
                if remembered {
                    // Nothing to store, but the answer came from a remembered state:
                    // it stands only if that state is still the current one.
                    remembered = false;
                    if let Some((v, s)) = self.changed_since(sid, &key, &version).await? {
                        version = v;
                        state = Arc::new(s);
                        continue;
                    }
                }
                // Only pending leases whose calls ended can be settled here: dropped.
                self.settle_leases(sid, &mut after);
                return Ok(value);
            }
            match self.redis.step(&key, &version, &blob, &ops.args()).await {
                Ok(CasResult::Committed {
                    version: v,
                    handed,
                    local_wake,
                    remote,
                }) => {
                    self.observe(gw, &record.machine, std::mem::take(&mut after.observed));
                    self.settle_leases(sid, &mut after);
                    if ctx.tomb {
                        self.forget_session(sid);
                    } else {
                        // The record held the unstored steps: stored with this one.
                        self.drop_unstored(sid, |_| true);
                        let touched = if ops.touch { now } else { touched };
                        let next = Remembered {
                            version: v,
                            state: Arc::new(blob),
                            record: Some(record),
                            touched,
                        };
                        self.keep(sid, slot.as_ref(), next);
                    }
                    if let Some(Ok(mut last)) = ctx.appended.as_ref().map(Mutex::lock) {
                        last.clear();
                        for a in &ops.xadd {
                            match last.iter_mut().find(|(h, _, _)| *h == a.h) {
                                Some(l) => l.1 = l.1.max(a.s),
                                None => last.push((a.h.clone(), a.s, remote.contains(&a.h))),
                            }
                        }
                    }
                    self.perform(gw, sid, after, ctx, &handed, local_wake);
                    return Ok(value);
                }
                Ok(CasResult::Conflict {
                    version: v,
                    state: s,
                }) => {
                    after.revert();
                    version = v;
                    state = Arc::new(s);
                    remembered = false;
                }
                Ok(CasResult::Missing | CasResult::Gone) => {
                    after.revert();
                    self.forget_session(sid);
                    return Err(StepError::NotFound { anonymous: false });
                }
                Err(e) => {
                    after.revert();
                    return Err(StepError::Store(e));
                }
            }
        }
        Err(StepError::Store(StoreError::Contention {
            attempts: MAX_ATTEMPTS,
        }))
    }

    /// Drains the machine's events into the script's effects and what to do after.
    /// `touched`: when this replica last moved the session's last use in the zsets.
    fn plan<'a>(
        &'a self,
        sid: &'a str,
        record: &mut Record,
        now: u64,
        ctx: &Ctx,
        touched: u64,
    ) -> (Ops<'a>, After) {
        let mut ops = Ops {
            ttl: &self.fixed.ttl,
            sttl: &self.fixed.sttl,
            sid,
            now: decimal(now),
            keep: &self.fixed.keep,
            me: &self.replica,
            wk: self.keys.wake_all(),
            timers: self.keys.timers(),
            leases: self.keys.leases(),
            sessions: self.keys.sessions(),
            caller: self.keys.caller(&record.binding),
            disc: record.discover.as_ref().map(|d| self.keys.discover(d)),
            ..Ops::default()
        };
        let mut after = After::default();
        // Messages per stream, in the order streams first appear: (stream, messages
        // with "is last", closed without a last message).
        let mut groups: Vec<Group> = Vec::new();
        fn group<'a>(groups: &'a mut Vec<Group>, stream: &PeerStream) -> &'a mut Group {
            let i = match groups.iter().position(|g| &g.0 == stream) {
                Some(i) => i,
                None => {
                    groups.push((stream.clone(), Vec::new(), false));
                    groups.len() - 1
                }
            };
            &mut groups[i]
        }
        let feeding = ctx
            .auth
            .as_deref()
            .and_then(|a| HeaderValue::from_str(a).ok());
        let mut plan = {
            let (machine, mut calls) = record.split();
            driver::plan(machine, &mut calls, feeding.as_ref())
        };
        for out in std::mem::take(&mut plan.out) {
            match out {
                Out::Message {
                    stream,
                    bytes,
                    last,
                } => group(&mut groups, &stream).1.push((bytes, last)),
                Out::Close { stream } => group(&mut groups, &stream).2 = true,
            }
        }
        for start in std::mem::take(&mut plan.starts) {
            // The first start is the one the host request's handler drives, when it
            // asks (and the one that host request waits on).
            let first = after.starts.is_empty();
            let lease = (!matches!(start.role, UpstreamRole::Discover)).then(|| {
                let key = self.keys.lease(sid, &id_text(&start.id));
                let rec = LeaseRecord {
                    sid: sid.to_owned(),
                    request: stored::RequestText(start.message.text()),
                    headers: start.headers.clone(),
                    role: start.role.clone(),
                };
                if first && ctx.inline.is_some() && self.may_defer(sid, record, &start.role) {
                    after.deferred = Some(PendingLease {
                        id: start.id.clone(),
                        record: rec,
                    });
                } else {
                    ops.lease_new.push(self.new_lease(key.clone(), &rec, now));
                }
                key
            });
            let head = if first { ctx.head.clone() } else { None };
            after.starts.push(Running {
                start,
                lease,
                head,
                forwarded: record.forwarded(),
            });
        }
        for (id, reason) in std::mem::take(&mut plan.cancels) {
            debug!(session = %log_tag(sid), rpc.id = %id, reason, "upstream request cancelled");
            if self.lease_pending(sid, &id) {
                // Its exchange runs here (aborted once stored), its lease unwritten.
                after.settled.push(id.clone());
            } else {
                let lease = self.keys.lease(sid, &id_text(&id));
                ops.cancel
                    .push((lease.clone(), wake::payload(sid, &Wake::Cancel(id.clone()))));
                ops.lease_del.push(lease);
            }
            after.cancels.push(id);
        }
        after.observed = std::mem::take(&mut plan.observed);
        after.plan = plan;
        if let Some(id) = &ctx.done_upstream {
            if self.lease_pending(sid, id) {
                after.settled.push(id.clone());
            } else {
                ops.lease_del.push(self.keys.lease(sid, &id_text(id)));
            }
        }
        for (peer, messages, closed) in groups {
            let decider = self
                .deciders
                .get(&(sid.to_owned(), peer.clone()))
                .map(|d| d.value().clone());
            // This replica's relay of the stream, if it has one: (relay, decided now).
            let mut handing: Option<(Arc<Decider>, bool)> = None;
            if let Some(d) = decider {
                let single_final = !closed && messages.len() == 1 && messages[0].1;
                let mut state = d
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match *state {
                    Decision::Deciding => {
                        if single_final {
                            *state = Decision::Claimed;
                            drop(state);
                            after.json.push((d, messages[0].0.clone()));
                            record.forget(&peer);
                            after.answered.push(peer);
                            continue;
                        }
                        // Streaming once stored and its entries handed over (see
                        // `perform`): the POST's relay starts with them.
                        *state = Decision::Claimed;
                        drop(state);
                        handing = Some((d, true));
                    }
                    Decision::Streaming => {
                        drop(state);
                        handing = Some((d, false));
                    }
                    _ => {}
                }
            }
            if record.stream(&peer).is_none() {
                if messages.is_empty() {
                    // Nothing to close: the stream finished, or was answered as JSON.
                    continue;
                }
                // A stream the peer has not opened (the GET stream before any GET):
                // its messages are kept for a later resumption.
                record.open_stream(peer.clone());
            }
            let Some(meta) = record.stream_mut(&peer) else {
                continue;
            };
            let key = self.keys.stream(sid, meta.number);
            let holder = self
                .keys
                .holder(sid, (peer != PeerStream::Standalone).then_some(meta.number));
            let token = handing.as_ref().map(|(d, _)| d.token.clone());
            let was_finished = meta.finished;
            let mut handed = Vec::new();
            for (bytes, last) in messages {
                meta.seq += 1;
                // A copy only for this replica's relay; the script gets the message.
                if handing.is_some() {
                    handed.push((meta.seq, bytes.clone(), last));
                }
                ops.xadd.push(Append {
                    k: key.clone(),
                    s: meta.seq,
                    m: Some(bytes),
                    e: last,
                    h: holder.clone(),
                    t: token.clone(),
                });
                meta.finished |= last;
            }
            if closed && !meta.finished {
                meta.seq += 1;
                ops.xadd.push(Append {
                    k: key,
                    s: meta.seq,
                    m: None,
                    e: true,
                    h: holder.clone(),
                    t: token.clone(),
                });
                meta.finished = true;
                if handing.is_some() {
                    handed.push((meta.seq, Vec::new(), true));
                }
            }
            if let Some((relay, decided)) = handing {
                if decided {
                    // The POST's own relay starts after these, holding the stream
                    // from this very transaction.
                    ops.hold
                        .push((holder.clone(), relay.token.clone(), decimal(hold_ms())));
                }
                after.streaming.push(Handing {
                    relay,
                    entries: handed,
                    holder,
                    decided,
                });
            }
            if meta.finished && !was_finished {
                let n = meta.number;
                record.finished.push_back(n);
            }
        }
        if !ops.xadd.is_empty() || ctx.write_leases {
            // The host may see a stream from now on: the leases that let another
            // replica finish what it waits for are written with what it sees.
            if let Some(p) = after.deferred.take() {
                ops.lease_new.push(self.pending_lease(sid, &p, now));
            }
            if let Some(pending) = self.pending_leases.get(sid) {
                for p in pending.iter() {
                    if after.settled.contains(&p.id) {
                        continue;
                    }
                    if record.machine.awaits_upstream(&p.id) {
                        ops.lease_new.push(self.pending_lease(sid, p, now));
                    }
                    after.settled.push(p.id.clone());
                }
            }
        }
        record.settle_finished();
        while record.finished.len() > FINISHED_KEPT {
            if let Some(n) = record.finished.pop_front() {
                record.streams.retain(|s| s.number != n);
                ops.del.push(self.keys.stream(sid, n));
                ops.del.push(self.keys.holder(sid, Some(n)));
            }
        }
        // Credentials of requests that ended are dropped.
        let machine = &record.machine;
        record
            .auth
            .retain(|(k, _)| k.as_ref().is_none_or(|id| machine.has_call(id)));
        after.appended = !ops.xadd.is_empty();
        let busy = record.machine.in_flight() > 0;
        if record.busy != busy {
            record.busy = busy;
            ops.busy = Some(busy);
        }
        // The last use moves in the zsets at most every `touch_ms` per replica: their
        // order (idlest first, for eviction) is that coarse, and pruning allows for it.
        ops.touch = now.saturating_sub(touched) >= self.touch_ms();
        // The timers zset is written only when the deadline changes (the record keeps
        // what was last written), when a claimed timer fires (its claim moved the
        // score), and when the session ends.
        let due = record.machine.poll_timeout().map(|t| t.as_millis());
        ops.tw = due != record.due || ctx.timer || ctx.tomb;
        record.due = due;
        ops.due = due.map(decimal);
        // The host owes an answer to a request of this step's (an elicitation, a
        // sampling or roots request, a ping), and may send it to any replica: the
        // others that step this session get the new state with it (`client::STEP`).
        ops.push = !ctx.tomb && record.machine.footprint().live > 0;
        if ctx.tomb {
            ops.tomb = Some(decimal(self.idle_ttl_ms().min(60_000)));
            for n in record.numbers() {
                ops.del.push(self.keys.stream(sid, n));
                ops.del.push(self.keys.holder(sid, Some(n)));
            }
            ops.del.push(self.keys.holder(sid, None));
            ops.publish.push((
                self.keys.wake_all().to_owned(),
                wake::payload(sid, &Wake::Streams),
            ));
        }
        (ops, after)
    }

    /// What this replica remembers of session `sid` after a step: in `slot`, the entry
    /// the step started from, when there was one.
    fn keep(&self, sid: &str, slot: Option<&Arc<Mutex<Remembered>>>, next: Remembered) {
        match slot.map(|s| s.lock()) {
            Some(Ok(mut r)) => *r = next,
            _ => {
                self.versions
                    .insert(sid.to_owned(), Arc::new(Mutex::new(next)));
            }
        }
    }

    /// A state another replica stored, pushed because the host owes an answer it may
    /// send here (`client::STEP`, `p`): it replaces what this replica remembers of the
    /// session when newer, so that the answer's step stores at its first
    /// compare-and-set. Only a session this replica remembers; like any remembered
    /// state, a hint the compare-and-set checks. Its record is decoded by the step that
    /// uses it, which replays this replica's unstored steps onto it, as after a
    /// conflict.
    fn remember_pushed(&self, sid: &str, version: &str, state: Vec<u8>) {
        let Some(slot) = self.versions.get(sid) else {
            return;
        };
        let Ok(new) = version.parse::<u64>() else {
            return;
        };
        let Ok(mut r) = slot.lock() else {
            return;
        };
        if r.version.parse::<u64>().is_ok_and(|old| old < new) {
            r.version = version.to_owned();
            r.state = Arc::new(state);
            r.record = None;
        }
    }

    /// The session is gone, or ended here: nothing of it is remembered or left to
    /// store.
    fn forget_session(&self, sid: &str) {
        self.versions.remove(sid);
        self.drop_unstored(sid, |_| true);
    }

    /// Drops session `sid`'s unstored steps if `which` says so; whether it did.
    fn drop_unstored(&self, sid: &str, which: impl FnOnce(&Unstored) -> bool) -> bool {
        let Some((_, u)) = self.unstored.remove_if(sid, |_, u| which(u)) else {
            return false;
        };
        let bytes: usize = u.replays.iter().map(|r| r.bytes).sum();
        self.unstored_bytes
            .fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Whether a step that fed a plain call's answer may answer before it is stored
    /// ([`Unstored`]): `before`, the machine's footprint before the feed when it was
    /// such an answer (`Session::answers_plain_call`), shows nothing the session keeps
    /// changed but its calls; the answer goes out as JSON and is all the step does
    /// beside changing the record; and the exchange's lease was never written.
    fn may_leave_unstored(
        &self,
        sid: &str,
        ctx: &Ctx,
        before: Option<Footprint>,
        machine: &Session,
        ops: &Ops<'_>,
        after: &After,
    ) -> bool {
        let (Some(before), Some(id)) = (before, &ctx.done_upstream) else {
            return false;
        };
        let now = machine.footprint();
        let only_calls = (before.live, before.batches, before.subscriptions)
            == (now.live, now.batches, now.subscriptions)
            && (before.tool_headers, before.tasks) == (now.tool_headers, now.tasks);
        let bytes: usize = after.json.iter().map(|(_, b)| b.len()).sum();
        let kept = self
            .unstored_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        only_calls
            && ops.record_only()
            && kept.saturating_add(bytes) <= UNSTORED_BYTES
            && !ctx.timer
            && after.settled.contains(id)
            && !after.json.is_empty()
            && after.starts.is_empty()
            && after.cancels.is_empty()
            && after.streaming.is_empty()
            && !self.closing.load(std::sync::atomic::Ordering::Relaxed)
            && match self.unstored.get(sid) {
                Some(u) => u.replays.len() < UNSTORED_PER_SESSION,
                None => self.unstored.len() < UNSTORED_SESSIONS,
            }
    }

    /// Keeps what a step left unstored fed, to feed it again onto a newer state.
    fn leave_unstored(&self, sid: &str, ctx: &Ctx, after: &After) {
        let Some(input) = ctx.replay.clone() else {
            return;
        };
        let bytes = after.json.iter().map(|(_, b)| b.len()).sum();
        self.unstored_bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        let replay = Replay {
            input,
            answered: after.answered.clone(),
            bytes,
        };
        self.unstored
            .entry(sid.to_owned())
            .or_insert_with(|| Unstored {
                replays: Vec::new(),
                since: tokio::time::Instant::now(),
                storing: false,
            })
            .replays
            .push(replay);
    }

    /// Feeds a state read from Redis what the steps this replica left unstored fed.
    /// Their effects were performed when they answered: what the machine asks now is
    /// dropped, and the streams they answered with JSON are forgotten. An answer the
    /// state no longer awaits (another replica cancelled its request meanwhile) is
    /// refused by the machine, and changes nothing.
    fn replay(&self, sid: &str, record: &mut Record, now: u64) {
        let Some(unstored) = self.unstored.get(sid) else {
            return;
        };
        for r in &unstored.replays {
            let _ = exchange::feed_input(record, r.input.clone(), Timestamp::from_millis(now));
            while record.machine.poll_event().is_some() {}
            for peer in &r.answered {
                record.forget(peer);
            }
        }
    }

    /// Stores, each in a step of its own, what the sessions' steps left unstored for
    /// [`UNSTORED_FOR`] or longer (the sweeper's tick).
    pub(super) fn store_unstored(self: &Arc<Self>, gw: &Arc<Route>) {
        if self.unstored.is_empty() {
            return;
        }
        let mut due = Vec::new();
        for mut u in self.unstored.iter_mut() {
            if !u.storing && u.since.elapsed() >= UNSTORED_FOR {
                u.storing = true;
                due.push(u.key().clone());
            }
        }
        for sid in due {
            tokio::spawn(self.clone().store_left(gw.clone(), sid));
        }
    }

    /// Stores what session `sid`'s steps left unstored: a step with no input, which
    /// starts from the record that holds them. One at a time per session from the
    /// sweeper ([`Unstored::storing`]).
    async fn store_left(self: Arc<Self>, gw: Arc<Route>, sid: String) {
        if !self.unstored.contains_key(&sid) {
            return;
        }
        self.store_one(&gw, &sid).await;
        if let Some(mut u) = self.unstored.get_mut(&sid) {
            u.storing = false;
        }
    }

    /// The step with no input of [`Self::store_left`]; what Redis has not taken for
    /// [`UNSTORED_AT_MOST`] is given up.
    async fn store_one(self: &Arc<Self>, gw: &Arc<Route>, sid: &str) {
        match self
            .step(gw, sid, &Ctx::default(), |_, _| Ok::<(), ()>(()))
            .await
        {
            Ok(()) | Err(StepError::NotFound { .. }) => {}
            Err(e) => {
                if self.drop_unstored(sid, |u| u.since.elapsed() >= UNSTORED_AT_MOST) {
                    warn!(session = %log_tag(sid), "the last step of a request answered with JSON was not stored; given up");
                } else if let StepError::Store(e) = e {
                    debug!(session = %log_tag(sid), error = %e, "a step left unstored is not stored yet");
                }
            }
        }
    }

    /// At shutdown: every step is stored before it answers from now on, and what was
    /// left unstored is stored (for at most [`UNSTORED_AT_SHUTDOWN`]).
    pub(crate) async fn store_all_unstored(self: &Arc<Self>, gw: &Arc<Route>) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Again while any is left: a step that decided before `closing` was set may
        // leave one after a round began.
        let all = async {
            while !self.unstored.is_empty() {
                let round: Vec<_> = self
                    .unstored
                    .iter()
                    .map(|u| self.clone().store_left(gw.clone(), u.key().clone()))
                    .collect();
                futures_util::future::join_all(round).await;
                if !self.unstored.is_empty() {
                    // Redis failed them: again shortly, not at once.
                    tokio::time::sleep(UNSTORED_FOR).await;
                }
            }
        };
        if tokio::time::timeout(UNSTORED_AT_SHUTDOWN, all)
            .await
            .is_err()
        {
            warn!("steps left unstored were not all stored before shutdown");
        }
    }

    /// A lease to write, from now.
    fn new_lease(&self, k: String, rec: &LeaseRecord, now: u64) -> NewLease {
        NewLease {
            k,
            o: self.replica.clone(),
            d: decimal(now + self.lease_ms()),
            r: codec::to_vec(self.format, rec, "lease record").unwrap_or_default(),
        }
    }

    /// A pending lease to write, from now.
    fn pending_lease(&self, sid: &str, p: &PendingLease, now: u64) -> NewLease {
        self.new_lease(self.keys.lease(sid, &id_text(&p.id)), &p.record, now)
    }

    /// Whether the lease of an exchange a step starts, which the host request's
    /// handler drives, is left pending ([`PendingLease`]): a request's first attempt
    /// whose stream has shown the host nothing yet, while this replica keeps few
    /// enough.
    fn may_defer(&self, sid: &str, record: &Record, role: &UpstreamRole) -> bool {
        let UpstreamRole::Call { legacy, round: 0 } = role else {
            return false;
        };
        let unseen = record
            .stream(&PeerStream::Request(legacy.clone()))
            .is_some_and(|m| m.seq == 0);
        unseen
            && (self.pending_leases.len() < PENDING_SESSIONS
                || self.pending_leases.contains_key(sid))
    }

    /// Whether the lease of upstream request `id` of session `sid` is pending here.
    fn lease_pending(&self, sid: &str, id: &RequestId) -> bool {
        self.pending_leases
            .get(sid)
            .is_some_and(|l| l.iter().any(|p| &p.id == id))
    }

    /// A step is stored (or found nothing to store): the pending leases it wrote or
    /// dropped go, the one it left pending comes.
    fn settle_leases(&self, sid: &str, after: &mut After) {
        if !after.settled.is_empty() {
            self.unpend(sid, |id| after.settled.contains(id));
        }
        if let Some(p) = after.deferred.take() {
            self.pending_leases
                .entry(sid.to_owned())
                .or_default()
                .push(p);
        }
    }

    /// An exchange ended: a lease of it still pending is never written.
    fn forget_lease(&self, sid: &str, id: &RequestId) {
        self.unpend(sid, |p| p == id);
    }

    /// Drops the session's pending leases whose request ids `gone` picks.
    fn unpend(&self, sid: &str, gone: impl Fn(&RequestId) -> bool) {
        if let Some(mut pending) = self.pending_leases.get_mut(sid) {
            pending.retain(|p| !gone(&p.id));
        }
        self.pending_leases.remove_if(sid, |_, l| l.is_empty());
    }

    /// Writes the session's pending leases whose exchanges still run, in a step of
    /// their own (see [`PendingLease`]).
    async fn write_leases(self: &Arc<Self>, gw: &Arc<Route>, sid: &str) -> Result<(), StoreError> {
        if !self.pending_leases.contains_key(sid) {
            return Ok(());
        }
        let ctx = Ctx {
            write_leases: true,
            ..Ctx::default()
        };
        match self.step(gw, sid, &ctx, |_, _| Ok::<(), ()>(())).await {
            Err(StepError::Store(e)) => Err(e),
            Err(StepError::NotFound { .. }) => {
                // The session is gone: nothing of it is redone.
                self.pending_leases.remove(sid);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Records a stored step's observations (metrics, migration report).
    fn observe(&self, gw: &Arc<Route>, machine: &Session, observed: Vec<Observation>) {
        if observed.is_empty() {
            return;
        }
        let mut t = gw.telemetry.shared_session(WIRE_HTTP, machine);
        for o in observed {
            t.observe(o, machine);
        }
    }

    /// Records a feature only the driver sees (the GET stream, a resumption).
    fn feature(gw: &Arc<Route>, machine: &Session, feature: Feature) {
        gw.telemetry
            .shared_session(WIRE_HTTP, machine)
            .feature(feature);
    }

    /// How often a session's last use moves in the `sessions` and caller zsets: a
    /// sixteenth of the idle TTL, at most a minute.
    fn touch_ms(&self) -> u64 {
        touch_ms(self.idle_ttl)
    }

    fn idle_ttl_ms(&self) -> u64 {
        idle_ttl_ms(self.idle_ttl)
    }

    /// The session hash's TTL ([`session_ttl_ms`]).
    fn session_ttl_ms(&self) -> u64 {
        session_ttl_ms(self.idle_ttl)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// Carries out a stored step: `handed` the holder keys of the streams whose relay
    /// here still holds them (the step script checked), `local_wake` whether another
    /// connection of this replica holds a stream the step appended to.
    fn perform(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        after: After,
        ctx: &Ctx,
        handed: &[String],
        local_wake: bool,
    ) {
        for (d, bytes) in after.json {
            d.set(Decision::Json(bytes));
        }
        let mut wake = local_wake || ctx.tomb;
        for h in after.streaming {
            if handed.contains(&h.holder) {
                if h.decided {
                    // The POST's relay starts with these: the exchange waits for it.
                    self.backlog.register(&h.holder, &h.relay.progress);
                }
                h.relay.inbox.hand(h.entries);
            } else {
                // Taken over meanwhile: whoever holds it reads the stream.
                wake = true;
            }
            if h.decided {
                h.relay.set(Decision::Streaming);
            }
        }
        if (after.appended && wake) || ctx.tomb {
            self.wakes.wake(sid);
        }
        for id in after.cancels {
            if let Some((_, h)) = self.exchanges.remove(&(sid.to_owned(), id)) {
                h.abort();
            }
        }
        let mut plan = after.plan;
        plan.log(|| log_tag(sid));
        let mut starts = after.starts.into_iter();
        if let Some(slot) = &ctx.inline {
            if let (Ok(mut slot), Some(first)) = (slot.lock(), starts.next()) {
                *slot = Some(first);
            }
        }
        for start in starts {
            let me = self.clone();
            let gw = gw.clone();
            let sid = sid.to_owned();
            tokio::spawn(async move { me.run_exchange(gw, sid, start).await });
        }
    }

    /// The exchange a step left for its caller to drive ([`Ctx::inline`]).
    fn inline_exchange(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        ctx: &Ctx,
    ) -> Option<Exchange> {
        let start = ctx.inline.as_ref()?.lock().ok()?.take()?;
        let me = self.clone();
        let gw = gw.clone();
        let sid = sid.to_owned();
        Some(Box::pin(
            async move { me.run_exchange(gw, sid, start).await },
        ))
    }

    // ----- operations -------------------------------------------------------------

    /// Stores a session whose `initialize` succeeded, with admission in the same
    /// script (CREATE): `max_sessions` and `max_sessions_per_caller` are counted by
    /// binding across replicas (a caller without credentials is not told apart by its
    /// address here: the shared record has no field for it).
    async fn create(self: &Arc<Self>, gw: &Arc<Route>, created: Created) -> Result<(), NotCreated> {
        let Created {
            sid,
            machine,
            observed,
            auth,
            forwarded,
            ..
        } = created;
        let discover = machine.discover().cloned();
        let digest = discover.as_deref().map(Self::discover_digest);
        // A digest this replica stored or read is sent without its result (CREATE
        // asks for it if it expired meanwhile).
        let mut known = false;
        if let (Some(d), Some(v)) = (&digest, &discover) {
            known = !self.remember_discover(d, v);
        }
        let binding = BindingKey::of(gw.config.session_binding, auth.as_ref()).to_hex();
        let caller = self.keys.caller(&binding);
        let now = wall_ms();
        let mut record = Record {
            binding,
            anonymous: auth.is_none(),
            discover: digest.clone(),
            streams: Vec::new(),
            finished: Default::default(),
            next_stream: 0,
            auth: Vec::new(),
            forwarded: forwarded.to_pairs(),
            forwarded_headers: None,
            unchanging: None,
            // CREATE leaves the session idle (no `b` field), and out of the timers zset.
            busy: false,
            due: None,
            machine,
        };
        let mut blob = Vec::new();
        codec::encode_record(self.format, &mut record, &mut blob).map_err(NotCreated::Store)?;
        let ttl = self.idle_ttl_ms();
        let (sk1, sk2) = self.keys.session_parts();
        let mut ops = serde_json::json!({
            "ttl": ttl.to_string(),
            "sid": sid,
            "now": now.to_string(),
            "sessions": self.keys.sessions(),
            "caller": caller,
            "sttl": self.session_ttl_ms().to_string(),
            "timers": self.keys.timers(),
            // Past the hash's TTL (a live session's last use lags by up to `touch_ms`).
            "cutoff": now.saturating_sub(self.session_ttl_ms()).to_string(),
            "max": self.max_sessions.to_string(),
            "maxc": self.max_per_caller.to_string(),
            "sk1": sk1,
            "sk2": sk2,
            "tomb": ttl.min(60_000).to_string(),
            "wk": self.keys.wake_all(),
        });
        if let Some(d) = &digest {
            ops["disc"] = self.keys.discover(d).into();
        }
        let mut created = Ok(-3);
        for send in [!known, true] {
            if let (true, Some(v)) = (send, discover.as_deref()) {
                ops["dv"] = serde_json::to_string(v).unwrap_or_default().into();
            }
            let bytes = serde_json::to_vec(&ops).unwrap_or_default();
            created = self
                .redis
                .create(&self.keys.session(&sid), &blob, &bytes)
                .await;
            if !matches!(created, Ok(-3)) {
                break;
            }
        }
        match created {
            Ok(1) => {}
            Ok(n @ 2..) => {
                info!(evicted = n - 1, "idle session evicted to make room");
            }
            Ok(-1) => return Err(NotCreated::Full),
            Ok(-2) => return Err(NotCreated::CallerFull),
            Ok(n) => {
                return Err(NotCreated::Store(StoreError::Corrupt {
                    reason: format!("create script answered {n}"),
                }))
            }
            Err(e) => return Err(NotCreated::Store(e)),
        }
        self.observe(gw, &record.machine, observed);
        // Its next step here starts from what was just stored (version 1, see CREATE):
        // no read first.
        self.versions.insert(
            sid.clone(),
            remember("1".into(), blob, Some(Box::new(record)), now),
        );
        info!(session = %log_tag(&sid), replica = %self.replica, "legacy session opened");
        Ok(())
    }

    fn ctx(s: &RedisSession, auth: Option<&HeaderValue>, head: Option<Arc<HeadWatch>>) -> Ctx {
        Ctx {
            binding: Some(s.binding.clone()),
            auth: auth_text(auth),
            inline: head.is_some().then(|| Mutex::new(None)),
            head,
            ..Ctx::default()
        }
    }

    /// `GET` with `Last-Event-ID`: relayed from the stream's entries after `after`.
    async fn resume(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        s: &RedisSession,
        number: u64,
        after: u64,
    ) -> Result<Response<GatewayBody>, StepError<()>> {
        let record = match self.read(&s.id, &s.binding).await? {
            Ok(r) => r,
            Err(anonymous) => return Err(StepError::NotFound { anonymous }),
        };
        let standalone = record.resumable(number).ok_or(StepError::Refused(()))?;
        let holder = (!standalone).then_some(number);
        Self::feature(gw, &record.machine, Feature::Resumption);
        info!(session = %log_tag(&s.id), replica = %self.replica, stream = number, after, "stream resumed");
        Ok(self
            .open_relay(&s.id, number, after, holder, standalone, false)
            .await)
    }
}

fn json_body(body: Vec<u8>) -> Response<GatewayBody> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The standalone stream held for a `GET`: its holder key and this connection's token.
pub(crate) struct Hold {
    key: String,
    token: String,
}

/// A request's POST waiting for its stream's first message: its decider, the wake-up
/// its relay will wait on, and what was decided.
pub(crate) struct Post {
    guard: DeciderGuard,
    waiter: Waiter,
    decision: Decision,
}

/// Removes a POST's deciders when it is answered (as JSON, or its relay ended).
struct DeciderGuard {
    sessions: Arc<RedisSessions>,
    keys: Vec<(String, PeerStream)>,
    decider: Arc<Decider>,
}

impl DeciderGuard {
    /// Waits up to `limit` for the first message: JSON if it is the only, final one,
    /// else a stream to relay. A claim in progress is waited for; with `head`, no
    /// stream is committed before the upstream accepted (or refused) the exchange, up
    /// to `HEAD_WAIT`.
    async fn decide(&self, limit: Duration, head: Option<&HeadWatch>) -> Decision {
        let start = tokio::time::Instant::now();
        let deadline = start + limit;
        let head_deadline = start + HEAD_WAIT;
        // Subscribed before the first look: a change after it is never missed.
        let mut head_changes = head.map(HeadWatch::subscribe);
        loop {
            let notified = self.decider.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let denied = head.is_some_and(|h| h.denied());
            let settled = head.is_none_or(|h| h.settled());
            let now = tokio::time::Instant::now();
            {
                let Ok(mut state) = self.decider.state.lock() else {
                    return Decision::Streaming;
                };
                if denied {
                    return Decision::Deciding;
                }
                match &*state {
                    Decision::Json(_) => return state.clone(),
                    Decision::Streaming if settled || now >= head_deadline => {
                        return Decision::Streaming
                    }
                    Decision::Deciding if now >= deadline && (settled || now >= head_deadline) => {
                        *state = Decision::Streaming;
                        return Decision::Streaming;
                    }
                    _ => {}
                }
            }
            let until = if now < deadline {
                deadline
            } else {
                head_deadline
            };
            let head_wait = async {
                let changed = match head_changes.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => false,
                };
                // No watch, or a closed one (dropped), never changes again.
                if !changed {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = &mut notified => {}
                () = head_wait => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

impl Drop for DeciderGuard {
    fn drop(&mut self) {
        self.sessions.wakes.unregister(&self.decider.token);
        for k in self.keys.drain(..) {
            self.sessions
                .deciders
                .remove_if(&k, |_, d| Arc::ptr_eq(d, &self.decider));
        }
    }
}

fn wall_ms_ts() -> Timestamp {
    Timestamp::from_millis(wall_ms())
}

fn hold_ms() -> u64 {
    u64::try_from(HOLD.as_millis()).unwrap_or(u64::MAX)
}

/// Tokens naming this replica's connections: `REPLICA.RANDOM` then a count, in hex
/// (the step script reads whom to wake from the part before the last dot). Only
/// unique, never secret (a token stays inside Redis and this replica): the random part
/// is drawn once, so that a restarted replica of the same name does not repeat the
/// tokens of its previous life, and a connection costs a counter increment rather than
/// a `getrandom` call (two per replicated flow before).
struct Tokens {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl Tokens {
    fn new(replica: &str) -> Self {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No randomness: the start time still tells this life from the previous.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            bytes = (nanos as u64 ^ u64::from(std::process::id()).rotate_left(32)).to_be_bytes();
        }
        Self {
            prefix: keys::name(&[replica, ".", &hex(&bytes)]),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        keys::name(&[&self.prefix, &hex(&n.to_be_bytes())])
    }
}

fn auth_text(auth: Option<&HeaderValue>) -> Option<String> {
    auth.and_then(|a| a.to_str().ok()).map(str::to_owned)
}

/// A number as a script argument (here and in `stored::Ops::args`): without
/// `Display`'s formatter, several times the work for the handful every step passes.
fn decimal(n: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

fn id_text(id: &RequestId) -> String {
    match id {
        RequestId::String(s) => s.clone(),
        RequestId::Number(n) => decimal(*n),
    }
}

impl SessionStore for Arc<RedisSessions> {
    type Session = RedisSession;

    async fn find(
        &self,
        gw: &Arc<Route>,
        id: &str,
        authorization: Option<&HeaderValue>,
    ) -> Result<Lookup<RedisSession>, StoreError> {
        if !valid_session_id(id) {
            return Ok(Lookup::NotFound { anonymous: false });
        }
        Ok(Lookup::Found(RedisSession {
            id: id.to_owned(),
            binding: BindingKey::of(gw.config.session_binding, authorization).to_hex(),
            anonymous: authorization.is_none(),
        }))
    }

    fn new_machine(&self, sid: &str) -> Session {
        RedisSessions::new_machine(self, sid)
    }

    fn now(&self) -> Timestamp {
        wall_ms_ts()
    }

    async fn create(&self, gw: &Arc<Route>, created: Created) -> Result<(), NotCreated> {
        RedisSessions::create(self, gw, created).await
    }

    type State<'s> = Record;
    type Post = Post;
    type Hold = Hold;

    async fn resume(
        &self,
        gw: &Arc<Route>,
        session: &RedisSession,
        number: u64,
        after: u64,
    ) -> Result<Response<GatewayBody>, StepError<()>> {
        RedisSessions::resume(self, gw, session, number, after).await
    }

    async fn hold(&self, session: &RedisSession) -> Result<Hold, Held> {
        let token = self.token();
        let key = self.keys.holder(&session.id, None);
        match self.redis.hold(&key, &token, hold_ms(), true).await {
            Ok(true) => Ok(Hold { key, token }),
            Ok(false) => Err(Held::Conflict),
            Err(e) => Err(Held::Failed(StepError::Store(e))),
        }
    }

    async fn release(&self, _session: &RedisSession, hold: Hold) {
        let _ = self.redis.release_holder(&hold.key, &hold.token).await;
    }

    fn attach(
        &self,
        gw: &Arc<Route>,
        session: &RedisSession,
        hold: Hold,
        number: u64,
        seq: u64,
    ) -> Response<GatewayBody> {
        info!(session = %log_tag(&session.id), replica = %self.replica, stream = number, "standalone stream opened");
        self.relay_with(gw, &session.id, number, seq, None, true, hold.token, true)
    }

    fn anonymous(&self, session: &RedisSession) -> bool {
        session.anonymous
    }

    async fn step<I, T, R, F>(
        &self,
        gw: &Arc<Route>,
        session: &RedisSession,
        feeding: Feeding<'_>,
        input: I,
        mut feed: F,
    ) -> Stepped<T, R>
    where
        I: Clone + Send + Sync,
        T: Send,
        R: Send,
        F: for<'s> FnMut(&mut Record, I, Timestamp) -> Result<T, R> + Send,
    {
        let ctx = RedisSessions::ctx(session, feeding.auth, feeding.head.cloned());
        // Fed again from the current state after a conflicting writer: the first
        // attempt takes `input`, each later one a copy of the copy made before it.
        let spare = input.clone();
        let mut first = Some(input);
        let fed = RedisSessions::step(self, gw, &session.id, &ctx, |record, now| {
            feed(record, first.take().unwrap_or_else(|| spare.clone()), now)
        })
        .await;
        let exchange = Detachable(self.inline_exchange(gw, &session.id, &ctx));
        Stepped { fed, exchange }
    }

    fn post(&self, session: &RedisSession) -> Post {
        let decider = Arc::new(Decider::new(self.token()));
        self.wakes.register(&decider.token, decider.inbox.clone());
        // Registered before the step: a wake-up for the stream from then on is seen.
        let waiter = self.wakes.waiter(&session.id);
        Post {
            guard: DeciderGuard {
                sessions: self.clone(),
                keys: Vec::new(),
                decider,
            },
            waiter,
            decision: Decision::Deciding,
        }
    }

    fn bind(&self, session: &RedisSession, post: &mut Post, peer: &PeerStream) {
        let key = (session.id.clone(), peer.clone());
        if post.guard.keys.contains(&key) {
            return;
        }
        // Before the step is stored: its plan finds the decider of the stream.
        self.deciders
            .insert(key.clone(), post.guard.decider.clone());
        post.guard.keys.push(key);
    }

    async fn first_message(
        &self,
        _session: &RedisSession,
        post: &mut Post,
        exchange: &mut Detachable,
        head: Option<&HeadWatch>,
    ) {
        post.decision = exchange
            .drive_while(post.guard.decide(FIRST_MESSAGE_WAIT, head))
            .await;
    }

    async fn respond(
        &self,
        gw: &Arc<Route>,
        session: &RedisSession,
        post: Post,
        number: u64,
    ) -> Response<GatewayBody> {
        match post.decision {
            Decision::Json(body) => json_body(body),
            _ => {
                // Before its priming event, from which on the host can resume it.
                if let Err(e) = self.write_leases(gw, &session.id).await {
                    warn!(error = %e, "the lease of a streaming request not written");
                }
                self.post_relay(&session.id, number, post.guard, post.waiter)
                    .await
            }
        }
    }

    fn forget(&self, _session: &RedisSession, post: Post) {
        // The stream stays in the state, finished by the machine; the deciders go.
        drop(post);
    }

    async fn end(&self, gw: &Arc<Route>, session: &RedisSession) -> Result<(), StepError<()>> {
        let ctx = Ctx {
            binding: Some(session.binding.clone()),
            tomb: true,
            ..Ctx::default()
        };
        RedisSessions::step(self, gw, &session.id, &ctx, |record, _now| {
            record.machine.close();
            Ok::<(), ()>(())
        })
        .await
    }

    fn tag<'a>(&self, session: &'a RedisSession) -> std::borrow::Cow<'a, str> {
        std::borrow::Cow::Owned(log_tag(&session.id))
    }

    fn served(&self, session: &RedisSession, what: Served<'_>) {
        // The tag (a SHA-256 of the id) is worked out inside each macro, so only when
        // the event is logged.
        match what {
            Served::Request(id, method) => {
                info!(session = %log_tag(&session.id), replica = %self.replica, rpc.id = %id, method = %dualera_adapters::echo::echo(method), "legacy request served");
            }
            Served::Message(kind) => {
                info!(session = %log_tag(&session.id), replica = %self.replica, method = kind, "legacy message served");
            }
            Served::Delete => {
                info!(session = %log_tag(&session.id), replica = %self.replica, "session deleted by the peer");
            }
        }
    }
}
