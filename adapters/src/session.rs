//! The legacy session machine: one legacy MCP session (2025-11-25 … 2024-11-05) served
//! over a stateless 2026-07-28 upstream, as a deterministic state machine without IO.
//!
//! See [`Session`] for the call order and the data flow.

use crate::capabilities::{self, InputCheck};
use crate::downgrade;
use crate::error::{failure_response, Failure, SessionError};
use crate::event::{BatchId, Event, PeerStream, UpstreamRole};
use crate::json::{self, JsonText};
use crate::jsonrpc::{
    EnvelopeError, ErrorCode, ErrorObject, Message, Notification, Request, RequestId, Response,
};
use crate::mrtr::{self, ResultKind, Round};
use crate::param_headers::{self, ParamHeader};
use crate::revision::{ElicitationSupport, Revision};
use crate::snapshot;
use crate::tasks::{Book, Link};
use crate::time::Timestamp;
use crate::usage::{self, Feature, LiveKind, LiveOutcome, Observation, RequestOutcome};
use crate::version::ProtocolVersion;
use crate::{v2025_06_18, v2025_11_25};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// A map keyed by ids this machine mints (upstream request ids, live request ids, batch
/// numbers). No peer chooses these keys, so flooding one bucket (HashDoS) is not
/// possible and foldhash replaces std's slower SipHash. Maps keyed by ids a peer
/// chooses (`calls`, keyed by the legacy request id) keep SipHash.
type OwnMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// For `skip_serializing_if`: a counter that has not moved.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

mod task_calls;

/// Tools whose `x-mcp-header` parameters a session remembers (one `tools/list` page is
/// bounded by the message size; this bounds what many pages can add).
const MAX_TOOL_HEADERS: usize = 1024;

/// `_meta` key: protocol version of a modern request.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: client capabilities of a modern request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: client implementation info of a modern request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key: minimum log level for a modern request.
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key: server implementation info on a modern result.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key: the subscription a notification belongs to.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The log levels `logging/setLevel` accepts, lowest first.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// Bounds and timings of a session. Every map the machine keeps is bounded by one of
/// these.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Legacy revisions offered to peers, newest first (default: all four).
    pub legacy_versions: Vec<String>,
    /// Most legacy requests forwarded upstream at once (default 64); one more is
    /// refused with [`SessionError::TooManyInFlight`], never queued.
    pub max_in_flight: usize,
    /// Most live requests outstanding at the peer, over all rounds of the session
    /// (default 128); a round that would exceed it fails its request
    /// ([`Failure::TooManyLive`]).
    pub max_live: usize,
    /// Largest upstream request, in bytes, the upstream accepts (default 1 MiB, the
    /// modern server's own default). A peer request that would exceed it is refused
    /// ([`SessionError::TooLargeForUpstream`]); a retry whose answers would exceed it
    /// fails its request ([`Failure::AnswersTooLarge`]).
    pub max_upstream_message: usize,
    /// Most `inputRequests` in one round (default 16).
    pub max_input_requests: usize,
    /// Most `input_required` rounds per legacy request (default 8).
    pub max_rounds: u32,
    /// Pause before retrying a round that had only `requestState` (default 250 ms).
    pub retry_pause: Duration,
    /// How long a live request may go unanswered; reset by the peer's
    /// `notifications/progress` for it (default 600 s).
    pub live_timeout: Duration,
    /// How long a live request may run at most, progress or not (default 3600 s).
    pub live_timeout_max: Duration,
    /// Most messages in one batch (default 32).
    pub max_batch_len: usize,
    /// Most resource URIs one session may subscribe to (default 256).
    pub max_subscriptions: usize,
    /// Pause before re-opening a lost `subscriptions/listen` (default 1 s).
    pub listen_retry_pause: Duration,
    /// Consecutive `subscriptions/listen` losses before giving up until the filter
    /// changes (default 5).
    pub max_listen_retries: u32,
    /// How many finished request ids are remembered to tell late and duplicate
    /// replies from unknown ones (default 1024).
    pub retired_ids: usize,
    /// Prefix of every id the machine mints (`<prefix>-u7`, `<prefix>-l3`,
    /// `<prefix>-e1`). Drivers that share one upstream pipe between sessions give each
    /// session its own prefix (default `dualera`).
    pub id_prefix: String,
    /// `serverInfo` used when the upstream's discover result has none.
    pub fallback_server_info: Value,
    /// Unix time, in milliseconds, at the driver's [`Timestamp`] `0`: the wall clock
    /// of the `createdAt` / `lastUpdatedAt` of a task the gateway makes itself of a
    /// synchronous answer (default 0: transcript vectors count from the epoch).
    pub unix_at_zero_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            legacy_versions: ProtocolVersion::LEGACY
                .iter()
                .map(|v| (*v).to_owned())
                .collect(),
            max_in_flight: 64,
            max_live: 128,
            max_upstream_message: 1024 * 1024,
            max_input_requests: 16,
            max_rounds: 8,
            retry_pause: Duration::from_millis(250),
            live_timeout: Duration::from_secs(600),
            live_timeout_max: Duration::from_secs(3600),
            max_batch_len: 32,
            max_subscriptions: 256,
            listen_retry_pause: Duration::from_secs(1),
            max_listen_retries: 5,
            retired_ids: 1024,
            id_prefix: "dualera".to_owned(),
            fallback_server_info: json!({ "name": "dualera", "version": env!("CARGO_PKG_VERSION") }),
            unix_at_zero_ms: 0,
        }
    }
}

/// Where a session is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SessionState {
    /// No `initialize` yet.
    #[default]
    AwaitingInitialize,
    /// `initialize` received; waiting for the upstream's `server/discover`.
    Initializing,
    /// `initialize` answered; requests are served.
    Ready,
    /// Closed by [`Session::close`]; every input is refused.
    Closed,
}

/// What a batch fed with [`Session::handle_peer_batch`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOutcome {
    /// The batch's stream, when it held requests (its grouped responses follow as
    /// [`Event::ToPeerBatch`]); `None` when it held only notifications and replies (on
    /// HTTP: answer `202 Accepted`).
    pub batch: Option<BatchId>,
    /// Replies in the batch that were refused, for logging.
    pub refused: Vec<SessionError>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PendingInit {
    id: RequestId,
    stream: PeerStream,
}

#[derive(Debug, Serialize, Deserialize)]
struct UrlElicitation {
    key: String,
    url: String,
    elicitation_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
enum Phase {
    /// Between attempts: no upstream request in flight, nothing pending at the peer.
    Idle,
    /// An upstream attempt is in flight.
    Upstream(RequestId),
    /// Live requests are out at the peer.
    Input(Round),
    /// A state-only round waits for its retry time.
    Paused {
        until: Timestamp,
        request_state: Option<String>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Call {
    seq: u64,
    method: String,
    params: Map<String, Value>,
    stream: PeerStream,
    rounds: u32,
    phase: Phase,
    url_elicitations: Vec<UrlElicitation>,
    /// `tools/list` was fetched again after a `-32020`: a second one is not retried.
    tools_refreshed: bool,
    /// The round whose answers the attempt in flight carries, kept until the upstream
    /// accepts that attempt: if it refuses the credentials (HTTP 401/403) the round
    /// waits again for its last answer ([`Session::handle_upstream_denied`]).
    answered: Option<Answered>,
    /// What the call does for a task (see [`crate::tasks`]); `None` for a plain call
    /// (and then not written: every build that knew it reads it missing as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link: Option<Link>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answered {
    round: Round,
    live_id: RequestId,
    live: Live,
}

/// What [`Session::handle_upstream_denied`] did with the refused upstream request; the
/// driver answers the host's HTTP request that carried it with the upstream's
/// 401/403 where one is waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Denied {
    /// `initialize`'s `server/discover`: the session is back to awaiting `initialize`
    /// and nothing was sent to the peer.
    Initialize,
    /// The first attempt of a legacy request (or its `tools/list` refresh): the
    /// request is forgotten and nothing was sent on its stream; the peer may send it
    /// again, with other credentials.
    Request {
        /// The legacy request.
        legacy: RequestId,
    },
    /// A retry carrying a round's answers: the round waits again for the answer to
    /// the live request `live` (until the live-request timeout), and the retry goes
    /// again when the peer re-sends it.
    Round {
        /// The legacy request.
        legacy: RequestId,
        /// The live request whose answer is awaited again.
        live: RequestId,
    },
    /// No peer request carried it (a state-only retry, a batch member, the
    /// subscription stream): handled as a lost upstream request.
    Lost,
}

#[derive(Debug, Serialize, Deserialize)]
struct Live {
    seq: u64,
    legacy: RequestId,
    key: String,
    method: String,
    kind: LiveKind,
    deadline: Timestamp,
    hard_deadline: Timestamp,
}

#[derive(Debug, Serialize, Deserialize)]
struct UpstreamEntry {
    seq: u64,
    role: UpstreamRole,
}

#[derive(Debug, Serialize, Deserialize)]
enum ListenState {
    Open(RequestId),
    RetryAt(Timestamp),
    GaveUp,
}

#[derive(Debug, Serialize, Deserialize)]
struct Listen {
    filter: Value,
    state: ListenState,
    failures: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Batch {
    open: usize,
    responses: Vec<Message>,
    /// The ids of the batch's requests: until the group is sent, the peer has no
    /// answer for any of them, so none may be reused.
    ids: Vec<RequestId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum RetiredKind {
    Answered,
    Abandoned,
}

/// A bounded memory of ids that were finished, oldest forgotten first. Serialized as
/// its cap and the ids with their kind, oldest first.
#[derive(Debug)]
struct Retired {
    /// The ids oldest first, each with its kind: writing the ring (every replicated
    /// step does) then looks nothing up.
    order: VecDeque<(RequestId, RetiredKind)>,
    /// Retired live and upstream ids: minted here.
    kinds: OwnMap<RequestId, RetiredKind>,
    cap: usize,
}

impl Retired {
    fn remove(&mut self, id: &RequestId) {
        if self.kinds.remove(id).is_some() {
            self.order.retain(|(o, _)| o != id);
        }
    }

    fn new(cap: usize) -> Self {
        Self {
            order: VecDeque::new(),
            kinds: OwnMap::default(),
            cap: cap.max(1),
        }
    }

    fn insert(&mut self, id: RequestId, kind: RetiredKind) {
        match self.kinds.insert(id.clone(), kind) {
            None => {
                self.order.push_back((id, kind));
                while self.order.len() > self.cap {
                    if let Some((old, _)) = self.order.pop_front() {
                        self.kinds.remove(&old);
                    }
                }
            }
            // Retired again with another kind: it keeps its place, with the new kind.
            Some(was) if was != kind => {
                if let Some(entry) = self.order.iter_mut().find(|(o, _)| *o == id) {
                    entry.1 = kind;
                }
            }
            Some(_) => {}
        }
    }

    fn get(&self, id: &RequestId) -> Option<RetiredKind> {
        self.kinds.get(id).copied()
    }

    /// Applies a (driver's) cap, forgetting the oldest ids beyond it.
    fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
        while self.order.len() > self.cap {
            if let Some((old, _)) = self.order.pop_front() {
                self.kinds.remove(&old);
            }
        }
    }

    fn len(&self) -> usize {
        self.kinds.len().max(self.order.len())
    }
}

/// `Retired` as stored. The ids are minted by the machine and share its prefix, so
/// the compact form keeps their longest common prefix once (`p`), the rest of each id
/// (`r`) and the kinds as one string (`k`: `a` answered, `x` abandoned): a session's
/// 16 retired ids take about 150 bytes rather than 600, in every shared step's state.
/// Ids that are not all strings, and snapshots written before, use `ids`: pairs of an
/// id and its kind; both forms are read. Written from a borrow ([`RetiredRef`]).
/// Read with its strings borrowed from the snapshot where the format allows: a
/// replica that did not write a session's last step reads its state whole, and
/// these ids are most of its strings.
#[derive(Deserialize)]
struct RetiredData<'a> {
    cap: usize,
    #[serde(default)]
    ids: Vec<(RequestId, RetiredKind)>,
    #[serde(default, borrow)]
    p: json::Str<'a>,
    #[serde(default, borrow)]
    r: Vec<json::Str<'a>>,
    #[serde(default, borrow)]
    k: json::Str<'a>,
}

impl<'de> Deserialize<'de> for Retired {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let data = RetiredData::deserialize(deserializer)?;
        Self::try_from(data).map_err(serde::de::Error::custom)
    }
}

/// [`RetiredData`] borrowed from a [`Retired`], for writing it: the same fields,
/// without cloning the ring and its map as `#[serde(into)]` would (every shared
/// step stores its session's state, so this runs twice per replicated call).
#[derive(Serialize)]
struct RetiredRef<'a> {
    cap: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ids: Vec<(&'a RequestId, RetiredKind)>,
    #[serde(skip_serializing_if = "str::is_empty")]
    p: &'a str,
    #[serde(skip_serializing_if = "Rests::is_empty")]
    r: Rests<'a>,
    #[serde(skip_serializing_if = "String::is_empty")]
    k: String,
}

/// The ids' rests after their common prefix, written as a sequence of strings.
struct Rests<'a> {
    texts: Vec<&'a str>,
    common: usize,
}

impl Rests<'_> {
    fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

impl Serialize for Rests<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.texts.iter().map(|t| &t[self.common..]))
    }
}

impl Serialize for Retired {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Oldest first, as they were retired; one pass for the compact form, whose ids
        // are all strings (minted here), else the pairs.
        let ids = || self.order.iter().map(|(id, kind)| (id, *kind));
        let mut texts = Vec::with_capacity(self.order.len());
        let mut k = String::with_capacity(self.order.len());
        for (id, kind) in ids() {
            let RequestId::String(text) = id else {
                texts.clear();
                break;
            };
            texts.push(text.as_str());
            k.push(match kind {
                RetiredKind::Answered => 'a',
                RetiredKind::Abandoned => 'x',
            });
        }
        if texts.is_empty() {
            return RetiredRef {
                cap: self.cap,
                ids: ids().collect(),
                p: "",
                r: Rests { texts, common: 0 },
                k: String::new(),
            }
            .serialize(serializer);
        }
        let first = texts[0].as_bytes();
        let mut common = first.len();
        for t in &texts[1..] {
            let t = t.as_bytes();
            // Usually the whole prefix matches: one comparison of slices.
            if t.len() >= common && t[..common] == first[..common] {
                continue;
            }
            common = first
                .iter()
                .zip(t)
                .take(common)
                .take_while(|(a, b)| a == b)
                .count();
        }
        while !texts[0].is_char_boundary(common) {
            common -= 1;
        }
        RetiredRef {
            cap: self.cap,
            ids: Vec::new(),
            p: &texts[0][..common],
            k,
            r: Rests { texts, common },
        }
        .serialize(serializer)
    }
}

impl TryFrom<RetiredData<'_>> for Retired {
    type Error = &'static str;

    fn try_from(data: RetiredData<'_>) -> Result<Self, Self::Error> {
        let (prefix, kinds) = (data.p.as_str(), data.k.as_str());
        if data.r.len() != kinds.len() {
            return Err("retired ids and kinds differ in number");
        }
        if !data.ids.is_empty() && !data.r.is_empty() {
            return Err("retired ids given in both forms");
        }
        let count = data.ids.len() + data.r.len();
        let compact = data.r.iter().zip(kinds.bytes()).map(|(rest, kind)| {
            let kind = match kind {
                b'a' => RetiredKind::Answered,
                b'x' => RetiredKind::Abandoned,
                _ => return Err("unknown retired kind"),
            };
            let mut id = String::with_capacity(prefix.len() + rest.as_str().len());
            id.push_str(prefix);
            id.push_str(rest.as_str());
            Ok((RequestId::String(id), kind))
        });
        let mut retired = Retired::new(data.cap);
        retired.order.reserve(count.min(retired.cap));
        retired.kinds.reserve(count.min(retired.cap));
        for pair in data.ids.into_iter().map(Ok).chain(compact) {
            let (id, kind) = pair?;
            if retired.kinds.contains_key(&id) {
                return Err("a retired id is listed twice");
            }
            retired.insert(id, kind);
        }
        Ok(retired)
    }
}

/// What a session holds, by map (see [`Session::footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Footprint {
    /// Legacy requests in flight.
    pub calls: usize,
    /// Live requests outstanding at the peer.
    pub live: usize,
    /// Upstream requests in flight.
    pub upstream: usize,
    /// Remembered finished live-request ids.
    pub retired_live: usize,
    /// Remembered finished upstream ids.
    pub retired_upstream: usize,
    /// Batches waiting for their responses.
    pub batches: usize,
    /// Subscribed resource URIs.
    pub subscriptions: usize,
    /// Tools whose `x-mcp-header` parameters are remembered.
    pub tool_headers: usize,
    /// Tasks the session created and remembers (at most [`crate::tasks::MAX_TASKS`]).
    pub tasks: usize,
    /// Events not yet polled.
    pub events: usize,
}

/// One legacy session, sans IO.
///
/// # What it does
///
/// It plays the server towards a legacy peer (answering `initialize`, `ping`,
/// `logging/setLevel`, `resources/(un)subscribe` itself) and the client towards a
/// 2026-07-28 upstream (forwarding every other request with per-request `_meta`, and
/// driving Multi Round-Trip Requests by turning `inputRequests` into live
/// `elicitation/create` / `sampling/createMessage` / `roots/list` requests to the peer).
///
/// ```text
///  legacy peer ──handle_peer_message / handle_peer_batch──►┐
///  upstream    ──handle_upstream_message / _lost──────────►│ Session ──poll_event──► Event::ToPeer{stream,..}
///  driver      ──handle_discover / handle_standalone_*────►│         ──poll_timeout─► next deadline
///  clock       ──handle_timeout(now)──────────────────────►┘                          Event::ToUpstream / CancelUpstream …
/// ```
///
/// # Call order
///
/// 1. [`Session::new`]; optionally [`Session::handle_discover`] with a cached
///    `server/discover` result (otherwise the machine asks for one with an
///    [`Event::ToUpstream`] of role [`UpstreamRole::Discover`] when `initialize` arrives).
/// 2. For every input — a peer message ([`handle_peer_message`](Self::handle_peer_message),
///    [`handle_peer_batch`](Self::handle_peer_batch)), an upstream message or failure
///    ([`handle_upstream_message`](Self::handle_upstream_message),
///    [`handle_upstream_lost`](Self::handle_upstream_lost)), a stream change
///    ([`handle_standalone_opened`](Self::handle_standalone_opened) /
///    [`handle_standalone_closed`](Self::handle_standalone_closed)) or a timer
///    ([`handle_timeout`](Self::handle_timeout)) — call the `handle_*` method, then drain
///    [`poll_event`](Self::poll_event) until `None` and act on each event in order,
///    then re-read [`poll_timeout`](Self::poll_timeout) and arm the driver's timer.
/// 3. When the peer goes away (HTTP `DELETE`, stdio EOF, socket closed) call
///    [`close`](Self::close) and drain the events once more (they cancel upstream work).
///
/// A `handle_*` method that returns `Err` changed nothing; the error says what the
/// driver should log, and [`SessionError::to_response`] what (if anything) to answer.
///
/// # Serialization
///
/// A session serializes (serde) to plain data between two inputs, so that a driver can
/// keep it in a shared store and feed its next message in another process: serialize
/// after draining [`poll_event`](Self::poll_event), deserialize, then
/// [`restore`](Self::restore) the driver's [`Config`] and the discover result. See
/// [`crate::snapshot`] for what is left out and why. A member that holds its default
/// (an empty map, `None`, `false`, a zero counter) is not written: a shared store
/// writes a session's state at every step, and most of its members are empty between
/// requests; read back, a missing member takes the value [`Session::new`] gives it,
/// as it does in a snapshot an older build wrote.
#[derive(Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct Session {
    /// The driver's bounds and timings, shared by every session it runs (not part of
    /// a snapshot: [`Session::restore`] hands it back).
    #[serde(skip)]
    config: Arc<Config>,
    /// The prefix of every id this session mints (its own, unlike the rest of the
    /// config).
    id_prefix: Box<str>,
    state: SessionState,
    #[serde(with = "snapshot::revision")]
    revision: Option<&'static Revision>,
    /// Kept as compact text, like the capabilities: see [`JsonText`].
    client_info: Option<JsonText>,
    /// What the peer declared in `initialize`, mapped to the modern form (the legacy
    /// form itself is not kept: nothing after `initialize` reads it).
    client_capabilities: JsonText,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_level: Option<String>,
    #[serde(skip)]
    discover: Option<Arc<Value>>,
    /// Boxed, like `listen`: set only while `initialize` waits, and the machine is
    /// inline in every session's allocation (8 bytes of it instead of 48).
    #[serde(skip_serializing_if = "Option::is_none")]
    init: Option<Box<PendingInit>>,
    #[serde(with = "snapshot::pairs", skip_serializing_if = "HashMap::is_empty")]
    calls: HashMap<RequestId, Call>,
    #[serde(with = "snapshot::pairs", skip_serializing_if = "HashMap::is_empty")]
    live: OwnMap<RequestId, Live>,
    #[serde(with = "snapshot::pairs", skip_serializing_if = "HashMap::is_empty")]
    upstream: OwnMap<RequestId, UpstreamEntry>,
    retired_live: Retired,
    retired_upstream: Retired,
    #[serde(with = "snapshot::pairs", skip_serializing_if = "HashMap::is_empty")]
    batches: OwnMap<BatchId, Batch>,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    subscriptions: BTreeSet<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    standalone_open: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<Box<Listen>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ping: Option<RequestId>,
    /// `x-mcp-header` parameters of the upstream's tools, by tool name, as learned from
    /// the `tools/list` results that passed through.
    #[serde(with = "snapshot::sorted", skip_serializing_if = "HashMap::is_empty")]
    tool_headers: HashMap<String, Vec<ParamHeader>>,
    /// The peer is a 2025-11-25 host that declared the `tasks` capability.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    host_tasks: bool,
    /// The tasks this session created; `Some` when tasks are offered to the peer
    /// (it declared them and the upstream offers the extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Book>,
    next_upstream: u64,
    next_live: u64,
    #[serde(skip_serializing_if = "is_zero")]
    next_elicitation: u64,
    #[serde(skip_serializing_if = "is_zero")]
    next_batch: u64,
    next_seq: u64,
    #[serde(skip)]
    events: VecDeque<Event>,
}

impl Default for Session {
    /// A session with the default [`Config`]; what a snapshot's missing fields start
    /// from.
    fn default() -> Self {
        Self::new(Config::default())
    }
}

impl Session {
    /// A new session waiting for `initialize`.
    pub fn new(config: Config) -> Self {
        let id_prefix = config.id_prefix.clone().into_boxed_str();
        Self::with_shared_config(Arc::new(config), id_prefix)
    }

    /// A session on a configuration shared with the driver's other sessions, minting
    /// ids under `id_prefix` (instead of [`Config::id_prefix`]).
    pub fn with_shared_config(config: Arc<Config>, id_prefix: impl Into<Box<str>>) -> Self {
        let retired = config.retired_ids;
        Self {
            config,
            id_prefix: id_prefix.into(),
            state: SessionState::AwaitingInitialize,
            revision: None,
            client_info: None,
            client_capabilities: JsonText::default(),
            log_level: None,
            discover: None,
            init: None,
            calls: HashMap::new(),
            live: OwnMap::default(),
            upstream: OwnMap::default(),
            retired_live: Retired::new(retired),
            retired_upstream: Retired::new(retired),
            batches: OwnMap::default(),
            subscriptions: BTreeSet::new(),
            standalone_open: false,
            listen: None,
            ping: None,
            tool_headers: HashMap::new(),
            host_tasks: false,
            tasks: None,
            next_upstream: 0,
            next_live: 0,
            next_elicitation: 0,
            next_batch: 0,
            next_seq: 0,
            events: VecDeque::new(),
        }
    }

    /// Re-attaches what a serialized session leaves out (see [`crate::snapshot`]): the
    /// driver's `config` (the session keeps its own `id_prefix`) and the shared
    /// `server/discover` result it was started from ([`Session::discover`]).
    pub fn restore(mut self, config: impl Into<Arc<Config>>, discover: Option<Arc<Value>>) -> Self {
        let config = config.into();
        self.retired_live.set_cap(config.retired_ids);
        self.retired_upstream.set_cap(config.retired_ids);
        self.config = config;
        self.discover = discover;
        self
    }

    // ----- introspection -------------------------------------------------------------

    /// The `server/discover` result the session answers `initialize` from and reads the
    /// upstream's capabilities in, shared (a serialized session leaves it out).
    pub fn discover(&self) -> Option<&Arc<Value>> {
        self.discover.as_ref()
    }

    /// Where the session is in its lifecycle.
    pub fn state(&self) -> SessionState {
        self.state
    }

    /// The negotiated legacy revision, once `initialize` has been received.
    pub fn revision(&self) -> Option<&'static Revision> {
        self.revision
    }

    /// The peer's `clientInfo`, as sent in `initialize` (its implementation fields).
    pub fn client_info(&self) -> Option<Value> {
        self.client_info.as_ref().map(JsonText::value)
    }

    /// The peer's `clientInfo` as the session keeps it (compact JSON text): what a
    /// driver can compare without parsing it.
    pub fn client_info_text(&self) -> Option<&str> {
        self.client_info.as_ref().map(JsonText::as_str)
    }

    /// The modern `clientCapabilities` sent upstream, mapped from the peer's.
    pub fn client_capabilities(&self) -> Value {
        self.client_capabilities.value()
    }

    /// The log level set with `logging/setLevel`, if any.
    pub fn log_level(&self) -> Option<&str> {
        self.log_level.as_deref()
    }

    /// Legacy requests currently forwarded upstream (or waiting for the peer's input).
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Whether the legacy request `id` is still being served (forwarded upstream, or
    /// waiting for the peer's input).
    pub fn has_call(&self, id: &RequestId) -> bool {
        self.calls.contains_key(id)
    }

    /// Whether the upstream request `id` this machine sent is still unanswered (not
    /// answered, cancelled or abandoned).
    pub fn awaits_upstream(&self, id: &RequestId) -> bool {
        self.upstream.contains_key(id)
    }

    /// Whether the upstream request `id` is the first attempt of a plain legacy
    /// `tools/call`: no task, no round answered. Its answer ends the call and, unless
    /// it opens a round, changes nothing else the session keeps (no task, subscription
    /// or tool headers recorded), so a driver that shares sessions may answer it
    /// before it stores that change.
    pub fn answers_plain_call(&self, id: &RequestId) -> bool {
        let Some(UpstreamEntry {
            role: UpstreamRole::Call { legacy, round: 0 },
            ..
        }) = self.upstream.get(id)
        else {
            return false;
        };
        self.calls
            .get(legacy)
            .is_some_and(|c| c.method == "tools/call" && c.link.is_none() && c.rounds == 0)
    }

    /// The resource URIs the peer subscribed to.
    pub fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.subscriptions.iter().map(String::as_str)
    }

    /// How much the session holds right now: every map it keeps, for bound checks
    /// (the property tests) and metrics.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            calls: self.calls.len(),
            live: self.live.len(),
            upstream: self.upstream.len(),
            retired_live: self.retired_live.len(),
            retired_upstream: self.retired_upstream.len(),
            batches: self.batches.len(),
            subscriptions: self.subscriptions.len(),
            tool_headers: self.tool_headers.len(),
            tasks: self.tasks.as_ref().map_or(0, Book::len),
            events: self.events.len(),
        }
    }

    /// The stream of the legacy request `legacy` while it is in flight (a driver uses it
    /// to find what belongs to the peer request that caused an upstream attempt, such
    /// as its trace context).
    pub fn request_stream(&self, legacy: &RequestId) -> Option<&PeerStream> {
        self.calls.get(legacy).map(|c| &c.stream)
    }

    // ----- outputs -------------------------------------------------------------------

    /// The next thing the driver must do, in order; `None` when there is nothing left.
    pub fn poll_event(&mut self) -> Option<Event> {
        let event = self.events.pop_front();
        if event.is_none() && self.calls.is_empty() {
            self.shrink_idle();
        }
        event
    }

    /// An idle session (no request in flight, every event drained) gives back what its
    /// busiest moment left allocated: the event queue and the per-request tables keep
    /// their capacity when emptied, and at 100k idle sessions that is most of their
    /// memory. Only empty ones are shrunk, so a busy session never reallocates here.
    fn shrink_idle(&mut self) {
        if self.events.capacity() != 0 {
            self.events = VecDeque::new();
        }
        if self.calls.capacity() != 0 {
            self.calls.shrink_to_fit();
        }
        if self.live.is_empty() && self.live.capacity() != 0 {
            self.live.shrink_to_fit();
        }
        if self.upstream.is_empty() && self.upstream.capacity() != 0 {
            self.upstream.shrink_to_fit();
        }
        if self.batches.is_empty() && self.batches.capacity() != 0 {
            self.batches.shrink_to_fit();
        }
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) must be called, if any
    /// timer is armed (a live-request deadline, a paused round, a subscription retry).
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let live = self.live.values().map(|l| l.deadline);
        let paused = self.calls.values().filter_map(|c| match c.phase {
            Phase::Paused { until, .. } => Some(until),
            _ => None,
        });
        let listen = self.listen.iter().filter_map(|l| match l.state {
            ListenState::RetryAt(at) => Some(at),
            _ => None,
        });
        live.chain(paused).chain(listen).min()
    }

    // ----- inputs: driver ------------------------------------------------------------

    /// Supplies a `server/discover` result the driver cached (or fetched itself). May be
    /// called at any time before or while `initialize` waits for one; a waiting
    /// `initialize` is answered at once (and an upstream discover in flight cancelled).
    pub fn handle_discover(&mut self, result: Value) -> Result<(), SessionError> {
        self.handle_discover_shared(Arc::new(result))
    }

    /// [`Session::handle_discover`] with a result shared between sessions (a driver's
    /// cache), so that each session does not keep its own copy.
    pub fn handle_discover_shared(&mut self, result: Arc<Value>) -> Result<(), SessionError> {
        self.check_open()?;
        validate_discover(&result)?;
        self.discover = Some(result);
        if self.state == SessionState::Initializing {
            if let Some(id) = self.pending_discover() {
                self.cancel_upstream(id, "discover supplied by the driver");
            }
            self.answer_initialize();
        }
        Ok(())
    }

    /// The peer opened its standalone stream (HTTP GET). Single-pipe drivers (stdio,
    /// WebSocket) call this once right after creating the session.
    pub fn handle_standalone_opened(&mut self) -> Result<(), SessionError> {
        self.check_open()?;
        self.standalone_open = true;
        self.update_listen();
        Ok(())
    }

    /// The peer's standalone stream closed.
    pub fn handle_standalone_closed(&mut self) -> Result<(), SessionError> {
        self.check_open()?;
        self.standalone_open = false;
        self.update_listen();
        Ok(())
    }

    /// Sends the peer a `ping` on the standalone stream (at most one outstanding);
    /// returns its id. The peer's reply is absorbed by the machine.
    pub fn ping_peer(&mut self) -> Option<RequestId> {
        if self.state != SessionState::Ready || self.ping.is_some() {
            return None;
        }
        let id = self.mint_live();
        self.ping = Some(id.clone());
        self.emit_peer(
            PeerStream::Standalone,
            Message::Request(Request {
                id: id.clone(),
                method: "ping".into(),
                params: None,
            }),
        );
        Some(id)
    }

    /// Closes the session (HTTP `DELETE`, stdio EOF, connection lost): every upstream
    /// request in flight is cancelled, pending live requests are abandoned, and every
    /// later input is refused with [`SessionError::Closed`].
    pub fn close(&mut self) {
        if self.state == SessionState::Closed {
            return;
        }
        let mut ids: Vec<(u64, RequestId)> =
            self.upstream.drain().map(|(id, e)| (e.seq, id)).collect();
        ids.sort_by_key(|(seq, _)| *seq);
        for (_, id) in ids {
            self.events.push_back(Event::CancelUpstream {
                id,
                reason: "session closed",
            });
        }
        self.calls.clear();
        self.live.clear();
        self.batches.clear();
        self.listen = None;
        self.init = None;
        self.ping = None;
        self.state = SessionState::Closed;
    }

    /// Fires every timer due at `now`: live requests past their deadline fail their
    /// legacy request, paused rounds are retried, a lost subscription is re-opened.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.state == SessionState::Closed {
            return;
        }
        let mut expired: Vec<(u64, RequestId)> = self
            .live
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, l)| (l.seq, id.clone()))
            .collect();
        expired.sort_by_key(|(seq, _)| *seq);
        for (_, id) in expired {
            let Some(live) = self.live.get(&id) else {
                continue;
            };
            let failure = Failure::LiveTimeout {
                method: live.method.clone(),
                input_key: live.key.clone(),
            };
            let legacy = live.legacy.clone();
            let kind = live.kind;
            self.observe(Observation::LiveEnded {
                kind,
                outcome: LiveOutcome::Timeout,
            });
            if let Some(call) = self.calls.remove(&legacy) {
                self.fail_call_reported(legacy, call, failure, "timed out", Some(&id));
            }
        }
        let due =
            self.calls_in_order(|c| matches!(c.phase, Phase::Paused { until, .. } if until <= now));
        for legacy in due {
            let state = match self.calls.get_mut(&legacy).map(|c| &mut c.phase) {
                Some(Phase::Paused { request_state, .. }) => request_state.take(),
                _ => continue,
            };
            self.send_attempt(&legacy, None, state);
        }
        if let Some(listen) = &self.listen {
            if matches!(listen.state, ListenState::RetryAt(at) if at <= now) {
                let filter = listen.filter.clone();
                let failures = listen.failures;
                self.open_listen(filter, failures);
            }
        }
    }

    /// The ids of the calls that satisfy `pred`, oldest first (the order timers and
    /// settlements act in, so that outputs do not depend on map order).
    fn calls_in_order(&self, pred: impl Fn(&Call) -> bool) -> Vec<RequestId> {
        let mut ids: Vec<(u64, RequestId)> = self
            .calls
            .iter()
            .filter(|(_, c)| pred(c))
            .map(|(id, c)| (c.seq, id.clone()))
            .collect();
        ids.sort_by_key(|(seq, _)| *seq);
        ids.into_iter().map(|(_, id)| id).collect()
    }

    // ----- inputs: peer --------------------------------------------------------------

    /// Feeds one message from the legacy peer.
    pub fn handle_peer_message(
        &mut self,
        message: Message,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        self.check_open()?;
        match message {
            Message::Request(request) => self.peer_request(request, None, now),
            Message::Notification(notification) => {
                self.peer_notification(notification, now);
                Ok(())
            }
            Message::Response(response) => self.peer_response(response, now),
        }
    }

    /// Feeds a JSON-RPC batch from the legacy peer (2025-03-26 only; elements as
    /// [`crate::jsonrpc::parse_incoming`] returns them). The responses to its requests
    /// are grouped into one [`Event::ToPeerBatch`] on [`PeerStream::Batch`] once all of
    /// them are settled; invalid elements get their error response in that group.
    pub fn handle_peer_batch(
        &mut self,
        items: Vec<Result<Message, EnvelopeError>>,
        now: Timestamp,
    ) -> Result<BatchOutcome, SessionError> {
        self.check_open()?;
        let negotiated = self.revision.map(|r| r.version);
        if self.state != SessionState::Ready || !self.revision.is_some_and(|r| r.batches) {
            return Err(SessionError::BatchNotAllowed { negotiated });
        }
        if items.len() > self.config.max_batch_len {
            return Err(SessionError::BatchTooLarge {
                len: items.len(),
                max: self.config.max_batch_len,
            });
        }
        self.observe(Observation::Used(Feature::Batch));
        let answers_due = items
            .iter()
            .any(|i| matches!(i, Ok(Message::Request(_)) | Err(_)));
        let mut refused = Vec::new();
        let batch = if answers_due {
            self.next_batch += 1;
            let id = BatchId(self.next_batch);
            // One extra "open" slot held while the elements are fed, so the group
            // cannot be sent before the last element was seen.
            self.batches.insert(
                id,
                Batch {
                    open: 1,
                    responses: Vec::new(),
                    ids: Vec::new(),
                },
            );
            Some(id)
        } else {
            None
        };
        for item in items {
            match item {
                Ok(Message::Request(request)) => {
                    if let Some(b) = batch.and_then(|b| self.batches.get_mut(&b)) {
                        b.open += 1;
                    }
                    let id = request.id.clone();
                    if let Err(e) = self.peer_request(request, batch, now) {
                        refused.push(e);
                    }
                    if let Some(b) = batch.and_then(|b| self.batches.get_mut(&b)) {
                        b.ids.push(id);
                    }
                }
                Ok(Message::Notification(n)) => self.peer_notification(n, now),
                Ok(Message::Response(r)) => {
                    if let Err(e) = self.peer_response(r, now) {
                        refused.push(e);
                    }
                }
                Err(e) => {
                    if let Some(b) = batch {
                        if let Some(entry) = self.batches.get_mut(&b) {
                            entry.open += 1;
                        }
                        self.respond(PeerStream::Batch(b), e.to_response());
                    }
                }
            }
        }
        if let Some(b) = batch {
            self.settle_batch(b, None);
        }
        Ok(BatchOutcome { batch, refused })
    }

    fn peer_request(
        &mut self,
        request: Request,
        batch: Option<BatchId>,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        let stream = match batch {
            Some(b) => PeerStream::Batch(b),
            None => PeerStream::Request(request.id.clone()),
        };
        let id = request.id.clone();
        // In flight, waiting for initialize, or answered inside a batch whose group
        // has not been sent yet: the peer has no answer for it, so the id is taken.
        let duplicate = self.calls.contains_key(&id)
            || self.init.as_ref().is_some_and(|i| i.id == id)
            || self.batches.values().any(|b| b.ids.contains(&id));
        if duplicate {
            let error = SessionError::DuplicateRequestId { id };
            if batch.is_some() {
                if let Some(response) = error.to_response() {
                    self.answer(stream, response, usage::Method::from_name(&request.method));
                }
                return Ok(());
            }
            return Err(error);
        }
        let method = request.method.as_str();
        let label = usage::Method::from_name(method);
        match (self.state, method) {
            (_, "ping") => self.answer(stream, Response::result(id, json!({})), label),
            (SessionState::AwaitingInitialize, "initialize") => {
                self.initialize(request, stream);
            }
            (SessionState::Initializing, "initialize") => self.refuse(
                stream,
                id,
                label,
                ErrorCode::INVALID_REQUEST,
                "initialize is already in progress",
            ),
            (SessionState::AwaitingInitialize | SessionState::Initializing, _) => self.refuse(
                stream,
                id,
                label,
                ErrorCode::INVALID_REQUEST,
                "the session is not initialized: send initialize first",
            ),
            (_, "initialize") => self.refuse(
                stream,
                id,
                label,
                ErrorCode::INVALID_REQUEST,
                "the session is already initialized",
            ),
            (_, "logging/setLevel") => self.set_level(request, stream),
            (_, "resources/subscribe" | "resources/unsubscribe") => {
                self.subscribe(request, stream);
            }
            (_, "subscriptions/listen" | "server/discover") => self.refuse(
                stream,
                id,
                label,
                ErrorCode::METHOD_NOT_FOUND,
                "method not found in legacy protocol revisions",
            ),
            _ => {
                let routed = if task_calls::is_task_request(&request) {
                    self.task_request(request, stream.clone(), now)
                } else {
                    self.forward(request, stream.clone(), now, None)
                };
                if let Err(refused) = routed {
                    // In a batch the refusal is one of the grouped responses.
                    if batch.is_some() {
                        if let Some(response) = refused.to_response() {
                            self.respond(stream, response);
                        }
                        return Ok(());
                    }
                    return Err(refused);
                }
            }
        }
        Ok(())
    }

    fn peer_notification(&mut self, notification: Notification, now: Timestamp) {
        let params = notification.params.as_ref();
        match notification.method.as_str() {
            // Not recorded: nothing reads it. The server's side of the lifecycle
            // ("SHOULD NOT send requests other than pings and logging before
            // receiving the initialized notification", 2025-11-25
            // basic/lifecycle) holds without it, since every request this machine
            // sends the peer belongs to a round of one of the peer's own requests,
            // which its side of the same rule keeps after the notification. A
            // snapshot's `initialized_notified` from an earlier build is ignored, and
            // an earlier build reads its absence as `false`, a value it never used
            // either: a store keeps no write for this notification.
            "notifications/initialized" => {}
            "notifications/cancelled" => {
                self.observe(Observation::Used(Feature::Cancellation));
                let Some(id) = notification.cancelled_request() else {
                    return;
                };
                if let Some(call) = self.calls.remove(&id) {
                    self.cancel_call(id, call);
                }
            }
            "notifications/progress" => {
                self.observe(Observation::Used(Feature::Progress));
                let Some(id) = params
                    .and_then(|p| p.get("progressToken"))
                    .and_then(RequestId::from_value)
                else {
                    return;
                };
                if let Some(live) = self.live.get_mut(&id) {
                    live.deadline = now
                        .saturating_add(self.config.live_timeout)
                        .min(live.hard_deadline);
                }
            }
            // Roots are asked for afresh in every round and never cached, so a change
            // needs no action.
            "notifications/roots/list_changed" => {}
            _ => {}
        }
    }

    fn peer_response(&mut self, response: Response, _now: Timestamp) -> Result<(), SessionError> {
        let Some(id) = response.id else {
            return Err(SessionError::ReplyWithoutId {
                error: response.outcome.err(),
            });
        };
        if self.ping.as_ref() == Some(&id) {
            self.ping = None;
            self.retired_live.insert(id, RetiredKind::Answered);
            return Ok(());
        }
        let Some(live) = self.live.remove(&id) else {
            let error = match self.retired_live.get(&id) {
                Some(RetiredKind::Answered) => SessionError::DuplicateReply { id },
                Some(RetiredKind::Abandoned) => SessionError::LateReply { id },
                None if self.was_minted(&id, 'l', self.next_live) => SessionError::LateReply { id },
                None => SessionError::UnknownReply { id },
            };
            if error.is_dropped() {
                self.observe(Observation::ReplyDropped {
                    duplicate: matches!(error, SessionError::DuplicateReply { .. }),
                });
            }
            return Err(error);
        };
        self.retired_live.insert(id.clone(), RetiredKind::Answered);
        let outcome = match &response.outcome {
            Ok(result) => LiveOutcome::of_result(live.kind, result),
            Err(_) => LiveOutcome::Error,
        };
        self.observe(Observation::LiveEnded {
            kind: live.kind,
            outcome,
        });
        let Some(mut call) = self.calls.remove(&live.legacy) else {
            return Ok(());
        };
        match response.outcome {
            Ok(result) => {
                let Phase::Input(round) = &mut call.phase else {
                    self.calls.insert(live.legacy, call);
                    return Ok(());
                };
                if round.answer(&live.key, result) {
                    let round = std::mem::take(round);
                    let legacy = live.legacy.clone();
                    call.answered = Some(Answered {
                        round: round.clone(),
                        live_id: id,
                        live,
                    });
                    self.calls.insert(legacy.clone(), call);
                    self.send_attempt(&legacy, Some(round.responses), round.request_state);
                } else {
                    self.calls.insert(live.legacy, call);
                }
            }
            Err(error) => {
                let failure = Failure::PeerError {
                    method: live.method,
                    error,
                };
                self.fail_call(live.legacy, call, failure, "another input request failed");
            }
        }
        Ok(())
    }

    // ----- inputs: upstream ----------------------------------------------------------

    /// Feeds one message from the upstream. `on` is the upstream request whose response
    /// stream carried it (HTTP), or `None` when all upstream traffic shares one pipe
    /// (stdio); responses are matched by their id either way.
    pub fn handle_upstream_message(
        &mut self,
        on: Option<RequestId>,
        message: Message,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        self.check_open()?;
        match message {
            Message::Response(response) => {
                let Some(id) = response.id.or(on) else {
                    return Err(SessionError::UpstreamResponseWithoutId);
                };
                let entry = self.take_upstream(&id)?;
                self.upstream_answered(id, entry.role, response.outcome, now);
                Ok(())
            }
            Message::Notification(n) => self.upstream_notification(on, n, now),
            Message::Request(r) => {
                Err(SessionError::UnexpectedUpstreamRequest { method: r.method })
            }
        }
    }

    /// The upstream request `id` ended without a JSON-RPC response (connection refused,
    /// stream closed early, HTTP error without a JSON-RPC body, driver-side timeout).
    pub fn handle_upstream_lost(
        &mut self,
        id: &RequestId,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        self.check_open()?;
        let entry = self.take_upstream(id)?;
        match entry.role {
            UpstreamRole::Discover => self.fail_initialize(
                ErrorObject::new(
                    ErrorCode::INTERNAL_ERROR,
                    "the upstream server did not answer server/discover",
                )
                .with_data(json!({ "reason": Failure::UpstreamLost.kind() })),
            ),
            UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy } => {
                if let Some(mut call) = self.calls.remove(&legacy) {
                    call.phase = Phase::Idle;
                    self.fail_call(legacy, call, Failure::UpstreamLost, "upstream lost");
                }
            }
            UpstreamRole::Listen => self.listen_lost(id, now),
        }
        Ok(())
    }

    /// Feeds the failure of upstream request `id` to reach the upstream for a reason
    /// the driver could name (a refused TLS certificate): like
    /// [`Self::handle_upstream_lost`], but the legacy peer is told why, with `reason`
    /// as `data.reason` of a `-32603` error and `message` as its text, on every method
    /// (the cause is the upstream's identity, not the tool's outcome).
    pub fn handle_upstream_refused(
        &mut self,
        id: &RequestId,
        reason: &'static str,
        message: String,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        self.check_open()?;
        let entry = self.take_upstream(id)?;
        let failure = Failure::UpstreamRefused { reason, message };
        match entry.role {
            UpstreamRole::Discover => self.fail_initialize(
                ErrorObject::new(ErrorCode::INTERNAL_ERROR, failure.to_string())
                    .with_data(json!({ "reason": reason })),
            ),
            UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy } => {
                if let Some(mut call) = self.calls.remove(&legacy) {
                    call.phase = Phase::Idle;
                    self.fail_call(legacy, call, failure, "upstream refused");
                }
            }
            UpstreamRole::Listen => self.listen_lost(id, now),
        }
        Ok(())
    }

    /// The upstream refused the credentials of request `id` (HTTP 401/403, relayed to
    /// the host by the driver). Unlike [`handle_upstream_lost`](Self::handle_upstream_lost)
    /// nothing is said to the peer where the driver can answer the HTTP request that
    /// carried the refused credentials; see [`Denied`]. A driver that can no longer
    /// answer that HTTP request (it already committed an SSE stream) calls
    /// `handle_upstream_lost` instead.
    pub fn handle_upstream_denied(
        &mut self,
        id: &RequestId,
        now: Timestamp,
    ) -> Result<Denied, SessionError> {
        self.check_open()?;
        let entry = self.take_upstream(id)?;
        let legacy = match entry.role {
            UpstreamRole::Discover => {
                if let Some(init) = self.init.take() {
                    self.state = SessionState::AwaitingInitialize;
                    self.revision = None;
                    // Answered by the driver with the upstream's 401/403.
                    self.ended(
                        &init.id,
                        usage::Method::Initialize,
                        RequestOutcome::Error,
                        0,
                    );
                }
                return Ok(Denied::Initialize);
            }
            UpstreamRole::Listen => {
                self.listen_lost(id, now);
                return Ok(Denied::Lost);
            }
            UpstreamRole::Call { legacy, .. } | UpstreamRole::ToolsRefresh { legacy } => legacy,
        };
        let Some(mut call) = self.calls.remove(&legacy) else {
            return Ok(Denied::Lost);
        };
        call.phase = Phase::Idle;
        if let Some(answered) = call.answered.take() {
            let Answered {
                mut round,
                live_id,
                mut live,
            } = answered;
            round.responses.remove(&live.key);
            round.pending.insert(live.key.clone(), live_id.clone());
            live.deadline = now
                .saturating_add(self.config.live_timeout)
                .min(live.hard_deadline);
            self.retired_live.remove(&live_id);
            self.live.insert(live_id.clone(), live);
            call.phase = Phase::Input(round);
            self.calls.insert(legacy.clone(), call);
            return Ok(Denied::Round {
                legacy,
                live: live_id,
            });
        }
        let first_attempt = call.rounds == 0 && matches!(call.stream, PeerStream::Request(_));
        if first_attempt {
            // Answered by the driver with the upstream's 401/403.
            let method = usage::Method::from_name(&call.method);
            self.ended(&legacy, method, RequestOutcome::Error, 0);
            return Ok(Denied::Request { legacy });
        }
        self.fail_call(
            legacy,
            call,
            Failure::UpstreamLost,
            "upstream refused the credentials",
        );
        Ok(Denied::Lost)
    }

    fn take_upstream(&mut self, id: &RequestId) -> Result<UpstreamEntry, SessionError> {
        match self.upstream.remove(id) {
            Some(entry) => {
                self.retired_upstream
                    .insert(id.clone(), RetiredKind::Answered);
                Ok(entry)
            }
            None if self.retired_upstream.get(id).is_some()
                || self.was_minted(id, 'u', self.next_upstream) =>
            {
                Err(SessionError::LateUpstreamResponse { id: id.clone() })
            }
            None => Err(SessionError::UnknownUpstreamId { id: id.clone() }),
        }
    }

    fn upstream_answered(
        &mut self,
        id: RequestId,
        role: UpstreamRole,
        outcome: Result<Value, ErrorObject>,
        now: Timestamp,
    ) {
        match role {
            UpstreamRole::Discover => match outcome {
                Ok(result) => match validate_discover(&result) {
                    Ok(()) => {
                        self.discover = Some(Arc::new(result.clone()));
                        self.events.push_back(Event::DiscoverFetched { result });
                        self.answer_initialize();
                    }
                    Err(SessionError::InvalidDiscover { reason }) => {
                        let supported = result.get("supportedVersions").cloned();
                        self.fail_initialize(
                            ErrorObject::new(
                                ErrorCode::INTERNAL_ERROR,
                                format!("the upstream server cannot be used: {reason}"),
                            )
                            .with_data(json!({
                                "reason": "invalidDiscover",
                                "upstreamSupportedVersions": supported,
                            })),
                        );
                    }
                    Err(_) => {}
                },
                Err(error) => self.fail_initialize(
                    ErrorObject::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!(
                            "the upstream server refused server/discover: {}",
                            error.message
                        ),
                    )
                    .with_data(
                        json!({ "reason": "discoverFailed", "upstreamError": error.to_value() }),
                    ),
                ),
            },
            UpstreamRole::Call { legacy, .. } => {
                if let Some(mut call) = self.calls.remove(&legacy) {
                    call.phase = Phase::Idle;
                    call.answered = None;
                    self.call_answered(legacy, call, outcome, now);
                }
            }
            // Whatever the refresh says, the attempt goes again: with the headers the
            // new list implies, or as before (and a second -32020 reaches the peer).
            UpstreamRole::ToolsRefresh { legacy } => {
                if let Ok(result) = outcome {
                    let _ = self.learn_tools(result);
                }
                if let Some(call) = self.calls.get_mut(&legacy) {
                    call.phase = Phase::Idle;
                    self.send_attempt(&legacy, None, None);
                }
            }
            // The upstream ended the subscription gracefully: open it again.
            UpstreamRole::Listen => self.listen_lost(&id, now),
        }
    }

    fn upstream_notification(
        &mut self,
        on: Option<RequestId>,
        notification: Notification,
        now: Timestamp,
    ) -> Result<(), SessionError> {
        let uncorrelated = |n: &Notification| SessionError::UncorrelatedNotification {
            method: n.method.clone(),
        };
        let params = notification.params.as_ref();
        let subscription = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get(META_SUBSCRIPTION_ID))
            .and_then(RequestId::from_value);
        let open_listen = match self.listen.as_ref().map(|l| &l.state) {
            Some(ListenState::Open(id)) => Some(id.clone()),
            _ => None,
        };
        let cancelled_target = notification.cancelled_request();
        let target = subscription.clone().or(cancelled_target).or(on.clone());
        if let (Some(target), Some(listen_id)) = (&target, &open_listen) {
            if target == listen_id {
                match notification.method.as_str() {
                    "notifications/subscriptions/acknowledged" => {
                        if let Some(l) = self.listen.as_mut() {
                            l.failures = 0;
                        }
                    }
                    "notifications/cancelled" => {
                        self.upstream.remove(listen_id);
                        self.retired_upstream
                            .insert(listen_id.clone(), RetiredKind::Answered);
                        self.listen_lost(&listen_id.clone(), now);
                    }
                    crate::tasks::NOTIFICATION => self.task_notification(&notification),
                    _ => {
                        let shaped = self.shape_notification(notification);
                        self.emit_peer(PeerStream::Standalone, Message::Notification(shaped));
                    }
                }
                return Ok(());
            }
        }
        if subscription.is_some() || notification.method == "notifications/cancelled" {
            return Err(uncorrelated(&notification));
        }
        let by_stream = on.as_ref().and_then(|id| match self.upstream.get(id) {
            Some(UpstreamEntry {
                role: UpstreamRole::Call { legacy, .. },
                ..
            }) => Some(legacy.clone()),
            _ => None,
        });
        if on.is_some() && by_stream.is_none() {
            return Err(uncorrelated(&notification));
        }
        let legacy = by_stream.or_else(|| {
            if notification.method != "notifications/progress" {
                return None;
            }
            let token = params.and_then(|p| p.get("progressToken"))?;
            self.calls
                .iter()
                .find(|(_, c)| {
                    c.params.get("_meta").and_then(|m| m.get("progressToken")) == Some(token)
                })
                .map(|(id, _)| id.clone())
        });
        let stream = match legacy.and_then(|l| self.calls.get(&l)) {
            Some(call) => call.stream.clone(),
            None if notification.method == "notifications/progress" => {
                return Err(uncorrelated(&notification));
            }
            // On a shared pipe a log message or list change belongs to no request:
            // legacy peers take those on the standalone stream.
            None => PeerStream::Standalone,
        };
        let shaped = self.shape_notification(notification);
        self.emit_peer(stream, Message::Notification(shaped));
        Ok(())
    }

    // ----- initialize ----------------------------------------------------------------

    fn initialize(&mut self, request: Request, stream: PeerStream) {
        let params = request.params.unwrap_or_else(|| json!({}));
        let Some(requested) = params.get("protocolVersion").and_then(Value::as_str) else {
            self.refuse(
                stream,
                request.id,
                usage::Method::Initialize,
                ErrorCode::INVALID_PARAMS,
                "initialize needs params.protocolVersion (a string)",
            );
            return;
        };
        let offered: Vec<&'static Revision> = self
            .config
            .legacy_versions
            .iter()
            .filter_map(|v| Revision::lookup(v))
            .collect();
        let revision = offered
            .iter()
            .copied()
            .find(|r| r.version == requested)
            .or_else(|| offered.first().copied())
            .unwrap_or(Revision::all()[0]);
        self.revision = Some(revision);
        self.client_info = params
            .get("clientInfo")
            .and_then(implementation)
            .map(|info| JsonText::new(&info));
        let none = Value::Object(Map::new());
        let declared = params
            .get("capabilities")
            .filter(|v| v.is_object())
            .unwrap_or(&none);
        self.client_capabilities =
            JsonText::new(&capabilities::client_to_modern(revision, declared));
        self.host_tasks = revision.version == ProtocolVersion::V2025_11_25
            && crate::tasks::host_declares(declared);
        self.state = SessionState::Initializing;
        self.init = Some(Box::new(PendingInit {
            id: request.id,
            stream,
        }));
        if self.discover.is_some() {
            self.answer_initialize();
        } else {
            let id = self.mint_upstream();
            let params = json!({ "_meta": self.upstream_meta(None, false) });
            self.send_upstream(UpstreamRole::Discover, id, "server/discover", params);
        }
    }

    fn pending_discover(&self) -> Option<RequestId> {
        self.upstream
            .iter()
            .find(|(_, e)| e.role == UpstreamRole::Discover)
            .map(|(id, _)| id.clone())
    }

    fn answer_initialize(&mut self) {
        let (Some(init), Some(revision), Some(discover)) =
            (self.init.take(), self.revision, self.discover.as_ref())
        else {
            return;
        };
        let mut capabilities = capabilities::server_to_legacy(
            revision,
            discover.get("capabilities").unwrap_or(&Value::Null),
        );
        if self.host_tasks && crate::tasks::upstream_offers(discover) {
            if let Some(caps) = capabilities.as_object_mut() {
                caps.insert("tasks".into(), crate::tasks::server_capability());
            }
            self.tasks = Some(Book::default());
        }
        let info = discover
            .get("_meta")
            .and_then(|m| m.get(META_SERVER_INFO))
            .filter(|v| v.is_object())
            .unwrap_or(&self.config.fallback_server_info);
        let mut result = Map::new();
        result.insert("protocolVersion".into(), json!(revision.version));
        result.insert("capabilities".into(), capabilities);
        result.insert(
            "serverInfo".into(),
            downgrade::implementation(revision, info),
        );
        if let Some(instructions @ Value::String(_)) = discover.get("instructions") {
            result.insert("instructions".into(), instructions.clone());
        }
        self.state = SessionState::Ready;
        self.observe(Observation::SessionReady);
        self.answer(
            init.stream,
            Response::result(init.id, Value::Object(result)),
            usage::Method::Initialize,
        );
        self.update_listen();
    }

    fn fail_initialize(&mut self, error: ErrorObject) {
        let Some(init) = self.init.take() else {
            return;
        };
        self.state = SessionState::AwaitingInitialize;
        self.revision = None;
        self.answer(
            init.stream,
            Response::error(Some(init.id), error),
            usage::Method::Initialize,
        );
    }

    // ----- locally answered requests -------------------------------------------------

    fn set_level(&mut self, request: Request, stream: PeerStream) {
        self.observe(Observation::Used(Feature::LoggingSetLevel));
        let label = usage::Method::LoggingSetLevel;
        let level = request
            .params
            .as_ref()
            .and_then(|p| p.get("level"))
            .and_then(Value::as_str);
        match level {
            Some(level) if LOG_LEVELS.contains(&level) => {
                self.log_level = Some(level.to_owned());
                self.answer(stream, Response::result(request.id, json!({})), label);
            }
            _ => self.refuse(
                stream,
                request.id,
                label,
                ErrorCode::INVALID_PARAMS,
                "params.level must be one of debug, info, notice, warning, error, critical, alert, emergency",
            ),
        }
    }

    fn subscribe(&mut self, request: Request, stream: PeerStream) {
        let subscribe = request.method == "resources/subscribe";
        let label = usage::Method::from_name(&request.method);
        if subscribe {
            self.observe(Observation::Used(Feature::ResourcesSubscribe));
        }
        let Some(uri) = request
            .params
            .as_ref()
            .and_then(|p| p.get("uri"))
            .and_then(Value::as_str)
        else {
            self.refuse(
                stream,
                request.id,
                label,
                ErrorCode::INVALID_PARAMS,
                "params.uri must be a string",
            );
            return;
        };
        if subscribe
            && !self.subscriptions.contains(uri)
            && self.subscriptions.len() >= self.config.max_subscriptions
        {
            self.refuse(
                stream,
                request.id,
                label,
                ErrorCode::INTERNAL_ERROR,
                "too many resource subscriptions in this session",
            );
            return;
        }
        if subscribe {
            self.subscriptions.insert(uri.to_owned());
        } else {
            self.subscriptions.remove(uri);
        }
        self.answer(stream, Response::result(request.id, json!({})), label);
        self.update_listen();
    }

    // ----- forwarding and rounds -----------------------------------------------------

    /// Forwards a request upstream; refuses it (changing nothing) when the session is
    /// at its in-flight bound or the upstream could not take it.
    fn forward(
        &mut self,
        request: Request,
        stream: PeerStream,
        _now: Timestamp,
        link: Option<Link>,
    ) -> Result<(), SessionError> {
        if self.calls.len() >= self.config.max_in_flight {
            // Refused before anything is kept; only the observation records it.
            self.ended(
                &request.id,
                usage::Method::from_name(&request.method),
                RequestOutcome::Failed(usage::FailureReason::Overload),
                0,
            );
            return Err(SessionError::TooManyInFlight {
                id: request.id,
                limit: self.config.max_in_flight,
            });
        }
        let mut params = match request.params {
            Some(Value::Object(p)) => p,
            _ => Map::new(),
        };
        if params
            .get("_meta")
            .is_some_and(|m| m.get("progressToken").is_some())
        {
            self.observe(Observation::Used(Feature::Progress));
        }
        // The machine owns the MRTR fields: a legacy peer cannot supply them.
        params.remove("inputResponses");
        params.remove("requestState");
        let mut first = self.attempt_params(&params, None, None);
        if link.is_some() {
            task_calls::declare_extension(&mut first);
        }
        if let Some(size) =
            upstream_request_over(&request.method, &first, self.config.max_upstream_message)
        {
            self.ended(
                &request.id,
                usage::Method::from_name(&request.method),
                RequestOutcome::Error,
                0,
            );
            return Err(SessionError::TooLargeForUpstream {
                id: request.id,
                size,
                limit: self.config.max_upstream_message,
            });
        }
        self.next_seq += 1;
        let call = Call {
            seq: self.next_seq,
            method: request.method,
            params,
            stream,
            rounds: 0,
            phase: Phase::Idle,
            url_elicitations: Vec::new(),
            tools_refreshed: false,
            answered: None,
            link,
        };
        let steps = call.link.as_ref().is_some_and(|l| *l != Link::Create);
        self.calls.insert(request.id.clone(), call);
        if steps {
            self.send_task_step(&request.id, None);
        } else {
            self.send_prepared(&request.id, first);
        }
        Ok(())
    }

    /// The params of an upstream attempt: the peer's params, the round's answers and
    /// state, and the session's `_meta`.
    fn attempt_params(
        &self,
        params: &Map<String, Value>,
        responses: Option<Map<String, Value>>,
        request_state: Option<&str>,
    ) -> Map<String, Value> {
        let mut params = mrtr::retry_params(params, responses, request_state);
        let meta = self.upstream_meta(params.get("_meta"), true);
        params.insert("_meta".into(), meta);
        params
    }

    /// Sends the next attempt of `legacy`; a retry the upstream could not take (its
    /// answers made it too large) fails the request instead.
    fn send_attempt(
        &mut self,
        legacy: &RequestId,
        responses: Option<Map<String, Value>>,
        request_state: Option<String>,
    ) {
        let Some(call) = self.calls.get(legacy) else {
            return;
        };
        if call.link.as_ref().is_some_and(|l| *l != Link::Create) {
            return self.send_task_step(legacy, responses);
        }
        let mut params = self.attempt_params(&call.params, responses, request_state.as_deref());
        if call.link.is_some() {
            task_calls::declare_extension(&mut params);
        }
        let method = call.method.clone();
        self.send_checked(legacy, &method, params);
    }

    /// Sends `method` for `legacy` unless the upstream could not take it (the round's
    /// answers made it too large): then the request fails.
    fn send_checked(&mut self, legacy: &RequestId, method: &str, params: Map<String, Value>) {
        if let Some(size) = upstream_request_over(method, &params, self.config.max_upstream_message)
        {
            let failure = Failure::AnswersTooLarge {
                size,
                limit: self.config.max_upstream_message,
            };
            if let Some(mut call) = self.calls.remove(legacy) {
                call.phase = Phase::Idle;
                self.fail_call(legacy.clone(), call, failure, "");
            }
            return;
        }
        self.send_call_request(legacy, method, params);
    }

    fn send_prepared(&mut self, legacy: &RequestId, params: Map<String, Value>) {
        let Some(call) = self.calls.get(legacy) else {
            return;
        };
        let method = call.method.clone();
        self.send_call_request(legacy, &method, params);
    }

    /// Sends one upstream request `method` for the legacy request `legacy`.
    fn send_call_request(&mut self, legacy: &RequestId, method: &str, params: Map<String, Value>) {
        let Some(call) = self.calls.get(legacy) else {
            return;
        };
        let round = call.rounds;
        let id = self.mint_upstream();
        if let Some(call) = self.calls.get_mut(legacy) {
            call.phase = Phase::Upstream(id.clone());
        }
        self.send_upstream(
            UpstreamRole::Call {
                legacy: legacy.clone(),
                round,
            },
            id,
            method,
            Value::Object(params),
        );
    }

    fn call_answered(
        &mut self,
        legacy: RequestId,
        call: Call,
        outcome: Result<Value, ErrorObject>,
        now: Timestamp,
    ) {
        if call.link.is_some() {
            return self.task_answered(legacy, call, outcome, now);
        }
        match outcome {
            Err(error)
                if error.code == ErrorCode::HEADER_MISMATCH
                    && call.method == "tools/call"
                    && call.rounds == 0
                    && !call.tools_refreshed =>
            {
                self.refresh_tools(legacy, call)
            }
            Err(error) => {
                let method = usage::Method::from_name(&call.method);
                // The upstream's own capability refusal is the host's capability gap.
                let outcome = if error.code == ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY {
                    RequestOutcome::Failed(usage::FailureReason::MissingCapability)
                } else {
                    RequestOutcome::Error
                };
                self.ended(&legacy, method, outcome, call.rounds);
                self.respond(call.stream, Response::error(Some(legacy), error));
            }
            Ok(result) => match mrtr::classify(&result) {
                ResultKind::Complete => self.complete(legacy, call, result),
                ResultKind::InputRequired => self.start_round(legacy, call, result, now),
                // An upstream that returns a task to a request that did not declare
                // the extension: the gateway waits for it, and the peer gets the
                // plain result.
                ResultKind::Unknown(t) if t == "task" && call.method == "tools/call" => {
                    self.await_plain(legacy, call, &result, now)
                }
                ResultKind::Unknown(result_type) => {
                    self.fail_call(legacy, call, Failure::UnknownResultType { result_type }, "")
                }
            },
        }
    }

    fn complete(&mut self, legacy: RequestId, call: Call, result: Value) {
        // The upstream no longer asks for any URL elicitation of this request.
        for url in &call.url_elicitations {
            self.emit_elicitation_complete(call.stream.clone(), &url.elicitation_id);
        }
        let revision = self.revision.unwrap_or(Revision::all()[0]);
        let result = if call.method == "tools/list" {
            self.learn_tools(result)
        } else {
            result
        };
        // Only tasks' `tools/list` needs the upstream's form beside the shaped one; every
        // other result moves through unchanged in size (no deep copy of its `Value`).
        let result = if call.method == "tools/list" && self.tasks.is_some() {
            let shaped = downgrade::result(revision, &call.method, result.clone());
            self.keep_task_support(&call.method, &result, shaped)
        } else {
            downgrade::result(revision, &call.method, result)
        };
        let method = usage::Method::from_name(&call.method);
        self.ended(&legacy, method, RequestOutcome::Ok, call.rounds);
        self.respond(call.stream, Response::result(legacy, result));
    }

    /// Records the `x-mcp-header` parameters of each listed tool and removes the tools
    /// whose annotations are invalid: a client on the Streamable HTTP transport MUST
    /// leave them out of `tools/list` (2026-07-28 transports, "Custom Headers from Tool
    /// Parameters").
    fn learn_tools(&mut self, mut result: Value) -> Value {
        let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
            return result;
        };
        let mut rejected = Vec::new();
        tools.retain(|tool| {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
            match param_headers::tool_param_headers(schema) {
                Ok(headers) => {
                    if headers.is_empty() {
                        self.tool_headers.remove(name);
                    } else if self.tool_headers.len() < MAX_TOOL_HEADERS
                        || self.tool_headers.contains_key(name)
                    {
                        self.tool_headers.insert(name.to_owned(), headers);
                    }
                    true
                }
                Err(reason) => {
                    self.tool_headers.remove(name);
                    rejected.push((name.to_owned(), reason));
                    false
                }
            }
        });
        for (tool, reason) in rejected {
            self.events.push_back(Event::ToolRejected { tool, reason });
        }
        result
    }

    /// The upstream refused the first attempt of a `tools/call` with `-32020`: fetch
    /// `tools/list` (the tool's `x-mcp-header` annotations may have changed) and send
    /// the attempt again, once (the transport's client behaviour SHOULD).
    fn refresh_tools(&mut self, legacy: RequestId, mut call: Call) {
        call.tools_refreshed = true;
        let id = self.mint_upstream();
        call.phase = Phase::Upstream(id.clone());
        self.calls.insert(legacy.clone(), call);
        let mut params = Map::new();
        params.insert("_meta".into(), self.upstream_meta(None, false));
        self.send_upstream(
            UpstreamRole::ToolsRefresh { legacy },
            id,
            "tools/list",
            Value::Object(params),
        );
    }

    /// The `Mcp-Param-*` headers (name, plain value) an upstream request must carry
    /// over HTTP: the `x-mcp-header` parameters of the called tool, as learned from
    /// `tools/list`. Values are not yet encoded for HTTP. Empty for anything but a
    /// `tools/call` of an annotated tool.
    pub fn upstream_headers(&self, request: &Request) -> Vec<(String, String)> {
        if request.method != "tools/call" {
            return Vec::new();
        }
        let params = request.params.as_ref();
        let Some(headers) = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .and_then(|name| self.tool_headers.get(name))
        else {
            return Vec::new();
        };
        param_headers::mirror(headers, params.and_then(|p| p.get("arguments")))
    }

    fn start_round(&mut self, legacy: RequestId, mut call: Call, result: Value, now: Timestamp) {
        call.rounds += 1;
        let waiting = matches!(call.link, Some(Link::Await { .. }));
        if !waiting && !mrtr::MRTR_METHODS.contains(&call.method.as_str()) {
            let method = call.method.clone();
            return self.fail_call(
                legacy,
                call,
                Failure::InputRequiredNotAllowed { method },
                "",
            );
        }
        if call.rounds > self.config.max_rounds {
            let max_rounds = self.config.max_rounds;
            return self.fail_call(legacy, call, Failure::RoundLimit { max_rounds }, "");
        }
        let parsed = match mrtr::parse_input_required(result) {
            Ok(parsed) => parsed,
            Err(failure) => return self.fail_call(legacy, call, failure, ""),
        };
        if parsed.requests.len() > self.config.max_input_requests {
            let failure = Failure::TooManyInputRequests {
                count: parsed.requests.len(),
                max: self.config.max_input_requests,
            };
            return self.fail_call(legacy, call, failure, "");
        }
        if self.live.len() + parsed.requests.len() > self.config.max_live {
            let limit = self.config.max_live;
            return self.fail_call(legacy, call, Failure::TooManyLive { limit }, "");
        }
        let mut missing = Vec::new();
        let declared = self.client_capabilities.value();
        for (key, request) in &parsed.requests {
            match capabilities::check_input_request(&declared, &request.method, &request.params) {
                InputCheck::Covered => {}
                InputCheck::Missing(capability) => missing.push(capabilities::MissingCapability {
                    input_key: key.clone(),
                    method: request.method.clone(),
                    capability,
                }),
                InputCheck::NotAnInputRequest => {
                    let failure = Failure::UnsupportedInputRequest {
                        input_key: key.clone(),
                        method: request.method.clone(),
                    };
                    return self.fail_call(legacy, call, failure, "");
                }
            }
        }
        if !missing.is_empty() {
            let failure = Failure::MissingCapabilities {
                required: capabilities::merge_required(&missing),
                missing: missing
                    .into_iter()
                    .map(|m| (m.input_key, m.capability))
                    .collect(),
            };
            return self.fail_call(legacy, call, failure, "");
        }
        let revision = self.revision.unwrap_or(Revision::all()[0]);
        let mut round = Round {
            request_state: parsed.request_state,
            ..Round::default()
        };
        let mut urls = Vec::new();
        let mut outgoing = Vec::new();
        for (key, request) in parsed.requests {
            let mut params = request.params;
            // Checked above: every request is an input request.
            let kind = LiveKind::of(&request.method, &params).unwrap_or(LiveKind::Roots);
            self.observe(Observation::Used(kind.feature()));
            if request.method == "elicitation/create" {
                let url_mode = params.get("mode").and_then(Value::as_str) == Some("url");
                match revision.elicitation {
                    ElicitationSupport::FormWithoutMode => {
                        params = v2025_06_18::form_elicitation_params(params);
                    }
                    ElicitationSupport::FormAndUrl if url_mode => {
                        let url = params
                            .get("url")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned();
                        let reused = call
                            .url_elicitations
                            .iter()
                            .position(|u| u.key == key && u.url == url)
                            .map(|i| call.url_elicitations.remove(i));
                        let entry = match reused {
                            Some(entry) => entry,
                            None => UrlElicitation {
                                key: key.clone(),
                                url,
                                elicitation_id: self.mint_elicitation(),
                            },
                        };
                        params = v2025_11_25::url_elicitation_params(params, &entry.elicitation_id);
                        urls.push(entry);
                    }
                    _ => {}
                }
            }
            let id = self.mint_live();
            if !matches!(params.get("_meta"), Some(Value::Object(_))) {
                params.insert("_meta".into(), json!({}));
            }
            if let Some(Value::Object(meta)) = params.get_mut("_meta") {
                // Lets the peer report progress, which resets this request's timeout.
                meta.insert("progressToken".into(), id.to_value());
            }
            if let Some(Link::Await {
                task,
                related: true,
                ..
            }) = &call.link
            {
                // 2025-11-25 tasks, "Input Required Status": the receiver MUST include
                // the related-task metadata in the request.
                crate::tasks::relate(&mut params, task);
            }
            self.next_seq += 1;
            self.live.insert(
                id.clone(),
                Live {
                    seq: self.next_seq,
                    legacy: legacy.clone(),
                    key: key.clone(),
                    method: request.method.clone(),
                    kind,
                    deadline: now.saturating_add(self.config.live_timeout),
                    hard_deadline: now.saturating_add(self.config.live_timeout_max),
                },
            );
            round.pending.insert(key, id.clone());
            outgoing.push(Message::Request(Request {
                id,
                method: request.method,
                params: Some(Value::Object(params)),
            }));
        }
        // URL elicitations of the previous round the upstream stopped asking for.
        for done in std::mem::replace(&mut call.url_elicitations, urls) {
            self.emit_elicitation_complete(call.stream.clone(), &done.elicitation_id);
        }
        for message in outgoing {
            self.emit_peer(call.stream.clone(), message);
        }
        call.phase = if round.pending.is_empty() {
            Phase::Paused {
                until: now.saturating_add(self.config.retry_pause),
                request_state: round.request_state,
            }
        } else {
            Phase::Input(round)
        };
        self.calls.insert(legacy, call);
    }

    /// Ends `call` with `failure`: its live requests are cancelled at the peer, an
    /// upstream attempt in flight is cancelled, and the peer gets the failure response.
    fn fail_call(&mut self, legacy: RequestId, call: Call, failure: Failure, reason: &str) {
        self.fail_call_reported(legacy, call, failure, reason, None);
    }

    /// [`Self::fail_call`], where the live request `reported` already had its end
    /// observed.
    fn fail_call_reported(
        &mut self,
        legacy: RequestId,
        call: Call,
        failure: Failure,
        reason: &str,
        reported: Option<&RequestId>,
    ) {
        let reason = if reason.is_empty() {
            "the request failed"
        } else {
            reason
        };
        self.abandon(&call, reason, reported);
        let method = usage::Method::from_name(&call.method);
        self.ended(
            &legacy,
            method,
            RequestOutcome::Failed((&failure).into()),
            call.rounds,
        );
        // A task-augmented `tools/call` expects a `CreateTaskResult`, never a tool
        // result: its failure is a JSON-RPC error.
        let method = match call.link {
            Some(Link::Create) => "tasks/create",
            _ => call.method.as_str(),
        };
        let response = failure_response(method, legacy.clone(), &failure);
        self.events
            .push_back(Event::RequestFailed { legacy, failure });
        self.respond(call.stream, response);
    }

    /// Ends `call` because the peer cancelled it: no response, its stream just ends.
    fn cancel_call(&mut self, legacy: RequestId, call: Call) {
        self.abandon(&call, "the request was cancelled", None);
        let method = usage::Method::from_name(&call.method);
        self.ended(&legacy, method, RequestOutcome::Cancelled, call.rounds);
        match call.stream {
            PeerStream::Batch(b) => {
                // Its group will not answer it: the peer may use the id again.
                if let Some(batch) = self.batches.get_mut(&b) {
                    batch.ids.retain(|id| *id != legacy);
                }
                self.settle_batch(b, None)
            }
            stream => self.events.push_back(Event::CloseStream { stream }),
        }
    }

    fn abandon(&mut self, call: &Call, reason: &str, reported: Option<&RequestId>) {
        match &call.phase {
            Phase::Upstream(id) => {
                self.upstream.remove(id);
                self.retired_upstream
                    .insert(id.clone(), RetiredKind::Abandoned);
                self.events.push_back(Event::CancelUpstream {
                    id: id.clone(),
                    reason: "legacy request ended",
                });
            }
            Phase::Input(round) => {
                for id in round.pending.values() {
                    if let Some(live) = self.live.remove(id) {
                        if reported != Some(id) {
                            self.events
                                .push_back(Event::Observed(Observation::LiveEnded {
                                    kind: live.kind,
                                    outcome: LiveOutcome::Cancel,
                                }));
                        }
                        self.retired_live.insert(id.clone(), RetiredKind::Abandoned);
                        self.emit_peer(
                            call.stream.clone(),
                            Message::Notification(Notification {
                                method: "notifications/cancelled".into(),
                                params: Some(
                                    json!({ "requestId": id.to_value(), "reason": reason }),
                                ),
                            }),
                        );
                    }
                }
            }
            Phase::Paused { .. } | Phase::Idle => {}
        }
    }

    // ----- subscriptions -------------------------------------------------------------

    fn desired_filter(&self) -> Option<Value> {
        if self.state != SessionState::Ready {
            return None;
        }
        let caps = self.discover.as_ref().and_then(|d| d.get("capabilities"));
        let flag = |cap: &str| {
            caps.and_then(|c| c.get(cap))
                .and_then(|c| c.get("listChanged"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let mut filter = Map::new();
        if self.standalone_open {
            for (cap, field) in [
                ("tools", "toolsListChanged"),
                ("prompts", "promptsListChanged"),
                ("resources", "resourcesListChanged"),
            ] {
                if flag(cap) {
                    filter.insert(field.into(), Value::Bool(true));
                }
            }
        }
        if self.standalone_open && self.tasks.as_ref().is_some_and(Book::has_upstream_tasks) {
            filter.insert(crate::tasks::LISTEN_FILTER.into(), Value::Bool(true));
        }
        if !self.subscriptions.is_empty() {
            filter.insert(
                "resourceSubscriptions".into(),
                self.subscriptions.iter().cloned().collect(),
            );
        }
        (!filter.is_empty()).then_some(Value::Object(filter))
    }

    fn update_listen(&mut self) {
        let desired = self.desired_filter();
        if desired.as_ref() == self.listen.as_ref().map(|l| &l.filter) {
            return;
        }
        if let Some(ListenState::Open(id)) = self.listen.take().map(|l| l.state) {
            self.cancel_upstream(id, "subscription filter changed");
        }
        if let Some(filter) = desired {
            self.open_listen(filter, 0);
        }
    }

    fn open_listen(&mut self, filter: Value, failures: u32) {
        let id = self.mint_upstream();
        let params = json!({
            "_meta": self.upstream_meta(None, false),
            "notifications": filter.clone(),
        });
        self.listen = Some(Box::new(Listen {
            filter,
            state: ListenState::Open(id.clone()),
            failures,
        }));
        self.send_upstream(UpstreamRole::Listen, id, "subscriptions/listen", params);
    }

    fn listen_lost(&mut self, id: &RequestId, now: Timestamp) {
        let Some(listen) = self.listen.as_mut() else {
            return;
        };
        if !matches!(&listen.state, ListenState::Open(open) if open == id) {
            return;
        }
        listen.failures += 1;
        listen.state = if listen.failures > self.config.max_listen_retries {
            ListenState::GaveUp
        } else {
            ListenState::RetryAt(now.saturating_add(self.config.listen_retry_pause))
        };
    }

    // ----- helpers -------------------------------------------------------------------

    fn check_open(&self) -> Result<(), SessionError> {
        if self.state == SessionState::Closed {
            Err(SessionError::Closed)
        } else {
            Ok(())
        }
    }

    /// The `_meta` of an upstream request: the peer's own keys (minus any reserved
    /// `io.modelcontextprotocol/*` ones, which the gateway owns) plus the session's
    /// protocol fields.
    fn upstream_meta(&self, peer_meta: Option<&Value>, with_log_level: bool) -> Value {
        let mut meta = match peer_meta {
            Some(Value::Object(m)) => m
                .iter()
                .filter(|(k, _)| !k.starts_with(downgrade::RESERVED_META_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            _ => Map::new(),
        };
        meta.insert(
            META_PROTOCOL_VERSION.into(),
            json!(ProtocolVersion::V2026_07_28),
        );
        meta.insert(
            META_CLIENT_CAPABILITIES.into(),
            self.client_capabilities.value(),
        );
        if let Some(info) = &self.client_info {
            meta.insert(META_CLIENT_INFO.into(), info.value());
        }
        if with_log_level {
            if let Some(level) = &self.log_level {
                meta.insert(META_LOG_LEVEL.into(), json!(level));
            }
        }
        Value::Object(meta)
    }

    fn shape_notification(&self, notification: Notification) -> Notification {
        let revision = self.revision.unwrap_or(Revision::all()[0]);
        downgrade::notification(revision, notification)
    }

    fn send_upstream(&mut self, role: UpstreamRole, id: RequestId, method: &str, params: Value) {
        self.next_seq += 1;
        self.upstream.insert(
            id.clone(),
            UpstreamEntry {
                seq: self.next_seq,
                role: role.clone(),
            },
        );
        self.events.push_back(Event::ToUpstream {
            role,
            request: Request {
                id,
                method: method.to_owned(),
                params: Some(params),
            },
        });
    }

    fn cancel_upstream(&mut self, id: RequestId, reason: &'static str) {
        self.upstream.remove(&id);
        self.retired_upstream
            .insert(id.clone(), RetiredKind::Abandoned);
        self.events.push_back(Event::CancelUpstream { id, reason });
    }

    fn emit_peer(&mut self, stream: PeerStream, message: Message) {
        self.events.push_back(Event::ToPeer { stream, message });
    }

    fn observe(&mut self, observation: Observation) {
        self.events.push_back(Event::Observed(observation));
    }

    fn ended(
        &mut self,
        id: &RequestId,
        method: usage::Method,
        outcome: RequestOutcome,
        rounds: u32,
    ) {
        self.observe(Observation::RequestEnded {
            id: id.clone(),
            method,
            outcome,
            rounds,
        });
    }

    /// Answers a request the session serves itself, observing how it ended.
    fn answer(&mut self, stream: PeerStream, response: Response, method: usage::Method) {
        if let Some(id) = &response.id {
            let outcome = if response.outcome.is_ok() {
                RequestOutcome::Ok
            } else {
                RequestOutcome::Error
            };
            self.ended(id, method, outcome, 0);
        }
        self.respond(stream, response);
    }

    /// Refuses a request the session serves itself with a JSON-RPC error.
    fn refuse(
        &mut self,
        stream: PeerStream,
        id: RequestId,
        method: usage::Method,
        code: ErrorCode,
        message: &str,
    ) {
        self.answer(
            stream,
            Response::error(Some(id), ErrorObject::new(code, message)),
            method,
        );
    }

    fn emit_elicitation_complete(&mut self, stream: PeerStream, elicitation_id: &str) {
        self.emit_peer(
            stream,
            Message::Notification(Notification {
                method: v2025_11_25::ELICITATION_COMPLETE.into(),
                params: Some(v2025_11_25::elicitation_complete_params(elicitation_id)),
            }),
        );
    }

    fn respond(&mut self, stream: PeerStream, response: Response) {
        match stream {
            PeerStream::Batch(b) => self.settle_batch(b, Some(Message::Response(response))),
            stream => self.emit_peer(stream, Message::Response(response)),
        }
    }

    fn settle_batch(&mut self, batch: BatchId, message: Option<Message>) {
        let Some(entry) = self.batches.get_mut(&batch) else {
            return;
        };
        entry.responses.extend(message);
        entry.open = entry.open.saturating_sub(1);
        if entry.open > 0 {
            return;
        }
        let Some(entry) = self.batches.remove(&batch) else {
            return;
        };
        let stream = PeerStream::Batch(batch);
        if entry.responses.is_empty() {
            self.events.push_back(Event::CloseStream { stream });
        } else {
            self.events.push_back(Event::ToPeerBatch {
                stream,
                messages: entry.responses,
            });
        }
    }

    fn mint_upstream(&mut self) -> RequestId {
        self.next_upstream += 1;
        RequestId::String(format!("{}-u{}", self.id_prefix, self.next_upstream))
    }

    fn mint_live(&mut self) -> RequestId {
        self.next_live += 1;
        RequestId::String(format!("{}-l{}", self.id_prefix, self.next_live))
    }

    fn mint_elicitation(&mut self) -> String {
        self.next_elicitation += 1;
        format!("{}-e{}", self.id_prefix, self.next_elicitation)
    }

    /// Whether `id` has the shape of an id this session minted with `tag` (so a reply
    /// to it is late rather than unknown, even after it left the retired memory).
    fn was_minted(&self, id: &RequestId, tag: char, counter: u64) -> bool {
        let RequestId::String(s) = id else {
            return false;
        };
        let Some(rest) = s
            .strip_prefix(&*self.id_prefix)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|r| r.strip_prefix(tag))
        else {
            return false;
        };
        rest.parse::<u64>().is_ok_and(|n| n >= 1 && n <= counter)
    }
}

/// Bytes of the upstream request `method` + `params` makes, envelope and a minted id
/// included, when they are more than `limit`. Most requests are far below it: their
/// bound ([`json::object_len_bound`]) shows that without writing them out.
fn upstream_request_over(method: &str, params: &Map<String, Value>, limit: usize) -> Option<usize> {
    // `{"id":"<prefix>-u<n>","jsonrpc":"2.0","method":,"params":}`
    const ENVELOPE: usize = 96;
    let bound = json::object_len_bound(params) + 2 + 6 * method.len() + ENVELOPE;
    if bound <= limit {
        return None;
    }
    let size = json::written_len(params) + json::written_len(&method) + ENVELOPE;
    (size > limit).then_some(size)
}

/// The peer's `clientInfo` in the shape both eras' `Implementation` has, or `None`
/// when `name` or `version` is not a string: only that is remembered and sent upstream
/// as `_meta` clientInfo. Optional string members are kept; `icons` (display only,
/// possibly large `data:` URIs) and anything else are not.
fn implementation(info: &Value) -> Option<Value> {
    let obj = info.as_object()?;
    let mut out = Map::new();
    for key in ["name", "version"] {
        out.insert(
            key.into(),
            Value::String(obj.get(key)?.as_str()?.to_owned()),
        );
    }
    for key in ["title", "description", "websiteUrl"] {
        if let Some(Value::String(v)) = obj.get(key) {
            out.insert(key.into(), Value::String(v.clone()));
        }
    }
    Some(Value::Object(out))
}

fn validate_discover(result: &Value) -> Result<(), SessionError> {
    let invalid = |reason| Err(SessionError::InvalidDiscover { reason });
    let Some(obj) = result.as_object() else {
        return invalid("the result is not an object");
    };
    let speaks_modern = obj
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| {
            v.iter()
                .any(|v| v.as_str() == Some(ProtocolVersion::V2026_07_28))
        });
    if !speaks_modern {
        return invalid("supportedVersions does not include 2026-07-28");
    }
    if obj.get("capabilities").is_some_and(|c| !c.is_object()) {
        return invalid("capabilities is not an object");
    }
    Ok(())
}
