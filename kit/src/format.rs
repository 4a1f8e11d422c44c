//! The transcript-vector format, version 1 (`adapters/vectors/README.md` is its
//! specification; `adapters/vectors/schema/vector-1.schema.json` its JSON Schema).
//!
//! A vector file is parsed into a [`Vector`]: every key is known (unknown keys are
//! errors, so a typo never silently weakens a vector) and every step is checked for
//! the fields its kind needs. Values inside messages and expectations stay
//! [`serde_json::Value`]s: they are matched by [`crate::matching`], not interpreted.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt;

/// The format version this crate reads (and the schema file it ships).
pub const FORMAT_VERSION: u32 = 1;

/// The session a step belongs to when it names none.
pub const DEFAULT_SESSION: &str = "main";

/// Session settings a vector may assume, with their defaults (the `config` object).
pub const SETTINGS: &[(&str, SettingDefault)] = &[
    ("max_in_flight", SettingDefault::Number(64)),
    ("max_input_requests", SettingDefault::Number(16)),
    ("max_rounds", SettingDefault::Number(8)),
    ("retry_pause_ms", SettingDefault::Number(250)),
    ("live_timeout_ms", SettingDefault::Number(600_000)),
    ("live_timeout_max_ms", SettingDefault::Number(3_600_000)),
    ("max_batch_len", SettingDefault::Number(32)),
    ("max_subscriptions", SettingDefault::Number(256)),
    ("listen_retry_pause_ms", SettingDefault::Number(1000)),
    ("max_listen_retries", SettingDefault::Number(5)),
    (
        "max_upstream_message_bytes",
        SettingDefault::Number(1_048_576),
    ),
    ("legacy_versions", SettingDefault::AllLegacyVersions),
    ("id_prefix", SettingDefault::Unspecified),
];

/// Settings of a reverse-direction vector (a modern host in front of a legacy server),
/// with their defaults.
pub const REVERSE_SETTINGS: &[(&str, SettingDefault)] = &[
    ("max_queued", SettingDefault::Number(16)),
    ("max_calls", SettingDefault::Number(64)),
    ("max_input_requests", SettingDefault::Number(16)),
    ("max_rounds", SettingDefault::Number(8)),
    ("retry_wait_ms", SettingDefault::Number(300_000)),
    ("initialize_timeout_ms", SettingDefault::Number(30_000)),
    ("ping_interval_ms", SettingDefault::Number(30_000)),
    ("list_ttl_ms", SettingDefault::Number(0)),
    ("public_cache", SettingDefault::Flag(false)),
    ("max_listeners", SettingDefault::Number(16)),
    ("max_subscriptions", SettingDefault::Number(256)),
    ("legacy_versions", SettingDefault::AllLegacyVersions),
    ("id_prefix", SettingDefault::Unspecified),
];

/// Which way a vector's bridge translates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// A legacy host in front of a 2026-07-28 upstream (the default).
    #[default]
    Forward,
    /// A 2026-07-28 host in front of a legacy server: `peer` steps are the modern
    /// host's messages, `upstream` steps the legacy server's.
    Reverse,
}

impl Direction {
    /// The name in vector files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Reverse => "reverse",
        }
    }

    /// The settings a vector of this direction may assume.
    pub fn settings(self) -> &'static [(&'static str, SettingDefault)] {
        match self {
            Self::Forward => SETTINGS,
            Self::Reverse => REVERSE_SETTINGS,
        }
    }
}

/// The legacy revisions a bridge offers by default, newest first.
pub const LEGACY_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The default of one setting.
#[derive(Debug, Clone, Copy)]
pub enum SettingDefault {
    /// A number.
    Number(u64),
    /// A boolean.
    Flag(bool),
    /// All four legacy revisions, newest first.
    AllLegacyVersions,
    /// Left to the implementation (the setting only shapes minted values, which
    /// vectors match by placeholder anyway).
    Unspecified,
}

impl SettingDefault {
    /// The default as JSON, if there is one.
    pub fn value(self) -> Option<Value> {
        match self {
            Self::Number(n) => Some(Value::from(n)),
            Self::Flag(b) => Some(Value::Bool(b)),
            Self::AllLegacyVersions => Some(Value::from(LEGACY_VERSIONS.to_vec())),
            Self::Unspecified => None,
        }
    }
}

/// Why a vector file is not a valid vector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Not JSON, or a key or value of the wrong shape.
    #[error("{file}: {detail}")]
    Shape {
        /// The file.
        file: String,
        /// What serde said.
        detail: String,
    },
    /// A step lacks what its kind needs, or has what it must not.
    #[error("{file}: step {step}: {detail}")]
    Step {
        /// The file.
        file: String,
        /// The step's index.
        step: usize,
        /// What is wrong.
        detail: String,
    },
    /// A top-level value is wrong.
    #[error("{file}: {detail}")]
    Vector {
        /// The file.
        file: String,
        /// What is wrong.
        detail: String,
    },
}

/// Where a vector (or a step) applies: the session machine fed directly, or a bridge
/// under test reached over one of the legacy host wires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    /// The sans-IO session machine, fed in process (no wire at all).
    InProcess,
    /// A bridge reached over legacy Streamable HTTP (2025-03-26 and later).
    StreamableHttp,
    /// A bridge spawned by the host, speaking newline-delimited JSON-RPC on stdio.
    Stdio,
}

impl Transport {
    /// Every transport, in the order tables list them.
    pub const ALL: [Transport; 3] = [Self::InProcess, Self::StreamableHttp, Self::Stdio];

    /// The name used in vector files.
    pub fn name(self) -> &'static str {
        match self {
            Self::InProcess => "in-process",
            Self::StreamableHttp => "streamable-http",
            Self::Stdio => "stdio",
        }
    }

    /// The transport a vector file names.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Whether the wire is a single pipe (every stream of the session shares it).
    pub fn single_pipe(self) -> bool {
        matches!(self, Self::Stdio)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transports a vector or step applies to (all when the file lists none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transports(Option<BTreeSet<Transport>>);

impl Transports {
    /// Whether `t` is included.
    pub fn includes(&self, t: Transport) -> bool {
        self.0.as_ref().is_none_or(|s| s.contains(&t))
    }

    /// The listed transports, if the file restricts them.
    pub fn listed(&self) -> Option<Vec<Transport>> {
        self.0.as_ref().map(|s| s.iter().copied().collect())
    }
}

/// One vector file.
#[derive(Debug, Clone)]
pub struct Vector {
    /// File name without `.json`.
    pub name: String,
    /// What the transcript shows.
    pub description: String,
    /// The row of the era-translation table it exercises.
    pub row: String,
    /// Which way the bridge translates (`direction`, default forward).
    pub direction: Direction,
    /// The legacy revision the transcript negotiates (informative).
    pub revision: Option<String>,
    /// The spec text it checks: `REVISION/PAGE#ANCHOR` references.
    pub spec: Vec<String>,
    /// Session settings the transcript assumes, beyond the defaults.
    pub config: Map<String, Value>,
    /// Where the vector applies.
    pub transports: Transports,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Vector {
    /// The sessions the vector opens, in order of first use.
    pub fn sessions(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.steps {
            if !out.contains(&s.session) {
                out.push(s.session.clone());
            }
        }
        out
    }

    /// Every setting, the vector's overrides applied over the defaults (settings
    /// without a default appear only when the vector sets them).
    pub fn settings(&self) -> Map<String, Value> {
        let mut out = defaults_of(self.direction.settings());
        for (k, v) in &self.config {
            out.insert(k.clone(), v.clone());
        }
        out
    }
}

/// The documented default settings.
pub fn default_settings() -> Map<String, Value> {
    defaults_of(SETTINGS)
}

fn defaults_of(settings: &[(&str, SettingDefault)]) -> Map<String, Value> {
    settings
        .iter()
        .filter_map(|(k, d)| Some(((*k).to_owned(), d.value()?)))
        .collect()
}

/// One step: an input, then what must (and must not) come out.
#[derive(Debug, Clone)]
pub struct Step {
    /// Position in the file.
    pub index: usize,
    /// Absolute time of the step in ms, if the file gives one.
    pub at: Option<u64>,
    /// The legacy session the step addresses.
    pub session: String,
    /// What happens.
    pub input: Input,
    /// The machine must refuse the input with this error kind (in process only).
    pub error: Option<String>,
    /// The host's reply is accepted and dropped: it answers a live request the bridge
    /// gave up on or already had the answer to.
    pub dropped: Option<Dropped>,
    /// The outputs, all of them.
    pub expect: Vec<Expected>,
    /// Outputs that must not appear during this step.
    pub absent: Vec<Expected>,
    /// The earliest armed deadline afterwards (in process only): `Some(None)` = none.
    pub next_timeout: Option<Option<u64>>,
    /// Expectation on the HTTP response to the HTTP request this step makes.
    pub http: Option<HttpExpect>,
    /// Headers the host's HTTP requests in this session carry from this step on
    /// (lower-cased names; `None` stops sending one), e.g. `Authorization`.
    pub host_headers: Vec<(String, Option<String>)>,
    /// Where the step applies.
    pub transports: Transports,
}

/// Why a host's reply is accepted and then ignored (a step's `dropped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A reply to a live request the bridge gave up on (cancelled, abandoned with its
    /// round, timed out).
    Late,
    /// A second reply to a live request the bridge already had the answer to.
    Duplicate,
}

impl Dropped {
    /// The name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Late => "late",
            Self::Duplicate => "duplicate",
        }
    }
}

/// What a step feeds in.
#[derive(Debug, Clone)]
pub enum Input {
    /// One JSON-RPC message from the legacy host.
    Peer {
        /// The message (placeholders not yet substituted).
        message: Value,
    },
    /// One JSON-RPC batch from the legacy host.
    PeerBatch {
        /// The elements.
        messages: Vec<Value>,
        /// Placeholder bound to the batch's stream.
        bind: Option<String>,
    },
    /// A message from the upstream.
    Upstream {
        /// The upstream request whose response stream carries it, if named.
        on: Option<Value>,
        /// The message.
        message: Value,
        /// How a scripted HTTP upstream sends it (status, headers).
        http: Option<UpstreamAnswer>,
    },
    /// The upstream request ended without a JSON-RPC response.
    UpstreamLost {
        /// The upstream request.
        id: Value,
        /// How a scripted HTTP upstream ends it (status, headers, body).
        http: Option<UpstreamAnswer>,
    },
    /// The driver's timer fired at `at`.
    Timer,
    /// The driver supplies a `server/discover` result (a black-box upstream answers
    /// every `server/discover` with it).
    Discover {
        /// The result.
        result: Value,
    },
    /// The host's standalone stream (HTTP GET) opened.
    StandaloneOpened,
    /// The host's standalone stream closed.
    StandaloneClosed,
    /// The session ends (HTTP DELETE, stdio EOF).
    Close,
    /// The gateway pings the host (a driver decision: not playable on a wire).
    Ping,
}

impl Input {
    /// Whether the host makes an HTTP request for this input on Streamable HTTP (a
    /// POST, the standalone GET, the DELETE), which `http` and `host_headers` are about.
    pub fn makes_host_request(&self) -> bool {
        matches!(
            self,
            Self::Peer { .. } | Self::PeerBatch { .. } | Self::Close | Self::StandaloneOpened
        )
    }

    /// A short name for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Peer { .. } => "peer message",
            Self::PeerBatch { .. } => "peer batch",
            Self::Upstream { .. } => "upstream message",
            Self::UpstreamLost { http: Some(a), .. } if a.is_denial() => "upstream refusal",
            Self::UpstreamLost { .. } => "upstream lost",
            Self::Timer => "timer",
            Self::Discover { .. } => "driver discover",
            Self::StandaloneOpened => "driver standalone_opened",
            Self::StandaloneClosed => "driver standalone_closed",
            Self::Close => "driver close",
            Self::Ping => "driver ping",
        }
    }
}

/// How the scripted HTTP upstream answers one request.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamAnswer {
    /// HTTP status (default 200).
    pub status: u16,
    /// Extra response headers, sent byte for byte.
    pub headers: Vec<(String, String)>,
    /// The body when the step has no message: a string as is, anything else as JSON.
    pub body: Option<Value>,
    /// Send the message as an SSE event even if it is the first and only one.
    pub sse: bool,
}

impl UpstreamAnswer {
    /// Whether the answer refuses the request's credentials (HTTP 401 or 403;
    /// 2025-11-25 `basic/authorization`, "Error Handling"): whatever its body, it
    /// carries no JSON-RPC response.
    pub fn is_denial(&self) -> bool {
        matches!(self.status, 401 | 403)
    }
}

/// An HTTP status a response must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusPattern {
    /// Exactly this code.
    Exact(u16),
    /// Any code of this class (`4` for `"4xx"`).
    Class(u16),
    /// `"status?"`: a code the spec leaves to the implementation within its class
    /// (`429` where the spec asks for an error status): exactly this in a strict
    /// run, any code of its class in a lenient one.
    Defined(u16),
}

impl StatusPattern {
    /// Whether `status` fits, in a strict run or a lenient one.
    pub fn accepts(self, status: u16, strict: bool) -> bool {
        match self {
            Self::Exact(s) => s == status,
            Self::Defined(s) if strict => s == status,
            Self::Class(c) => status / 100 == c,
            Self::Defined(s) => status / 100 == s / 100,
        }
    }
}

impl fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(s) => write!(f, "{s}"),
            Self::Class(c) => write!(f, "{c}xx"),
            Self::Defined(s) => write!(f, "{s} (or another {}xx)", s / 100),
        }
    }
}

/// What an HTTP response (legacy side) or request (upstream side) must carry.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpExpect {
    /// The status (responses only).
    pub status: Option<StatusPattern>,
    /// Headers, lower-cased names: a string pattern (placeholders allowed), or `null`
    /// for "absent". A name ending in `?` is implementation-defined: checked only in a
    /// strict run.
    pub headers: Vec<(String, Value)>,
    /// The body as JSON (matched like a message), responses only.
    pub body: Option<Value>,
}

/// One expected output.
#[derive(Debug, Clone)]
pub struct Expected {
    /// The session it belongs to.
    pub session: String,
    /// What kind of output.
    pub kind: ExpectedKind,
    /// The output as written, without `session`, `role` and `http` (what the matcher
    /// compares with an observed output in the same form).
    pub value: Value,
    /// The upstream request's role, if the file checks it (in process only).
    pub role: Option<String>,
    /// HTTP expectations on an upstream request (black-box only).
    pub http: Option<HttpExpect>,
}

/// The kinds of output.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpectedKind {
    /// A message to the host on a stream.
    PeerMessage {
        /// The stream (placeholders allowed).
        stream: Value,
    },
    /// A batch of responses to the host on a stream.
    PeerBatch {
        /// The stream.
        stream: Value,
    },
    /// A stream to the host ends without its response.
    PeerClose {
        /// The stream.
        stream: Value,
    },
    /// A request to the upstream.
    UpstreamRequest,
    /// An upstream request is cancelled.
    UpstreamCancel {
        /// The upstream request (placeholder or id).
        id: Value,
    },
}

impl Expected {
    /// The message, batch or cancelled id inside the output.
    pub fn message(&self) -> Option<&Value> {
        self.value.get("message")
    }

    /// Whether this is a request sent to the host (a live request or a ping).
    pub fn is_peer_request(&self) -> bool {
        matches!(self.kind, ExpectedKind::PeerMessage { .. })
            && self
                .message()
                .is_some_and(|m| m.get("method").is_some() && m.get("id").is_some())
    }

    /// The stream of a peer output.
    pub fn stream(&self) -> Option<&Value> {
        match &self.kind {
            ExpectedKind::PeerMessage { stream }
            | ExpectedKind::PeerBatch { stream }
            | ExpectedKind::PeerClose { stream } => Some(stream),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVector {
    #[serde(rename = "$schema")]
    _schema: Option<String>,
    description: String,
    row: String,
    direction: Option<String>,
    revision: Option<String>,
    #[serde(default)]
    spec: Vec<String>,
    #[serde(default)]
    config: Map<String, Value>,
    transports: Option<Vec<String>>,
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    from: String,
    at: Option<u64>,
    session: Option<String>,
    message: Option<Value>,
    batch: Option<String>,
    on: Option<Value>,
    lost: Option<Value>,
    action: Option<String>,
    result: Option<Value>,
    error: Option<String>,
    dropped: Option<String>,
    #[serde(default)]
    expect: Vec<Map<String, Value>>,
    #[serde(default)]
    absent: Vec<Map<String, Value>>,
    #[serde(default, deserialize_with = "present")]
    next_timeout: Option<Option<u64>>,
    http: Option<Map<String, Value>>,
    host_headers: Option<Map<String, Value>>,
    transports: Option<Vec<String>>,
    #[serde(rename = "note")]
    _note: Option<String>,
}

/// Keeps "present and null" apart from "absent".
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// Parses one vector file's text; `name` is the file name without `.json`.
pub fn parse(name: &str, text: &str) -> Result<Vector, FormatError> {
    let file = format!("{name}.json");
    let raw: RawVector = serde_json::from_str(text).map_err(|e| FormatError::Shape {
        file: file.clone(),
        detail: e.to_string(),
    })?;
    let vector_err = |detail: String| FormatError::Vector {
        file: file.clone(),
        detail,
    };
    let direction = match raw.direction.as_deref() {
        None | Some("forward") => Direction::Forward,
        Some("reverse") => Direction::Reverse,
        Some(other) => {
            return Err(vector_err(format!(
                "unknown direction {other:?} (forward, reverse)"
            )))
        }
    };
    for (k, v) in &raw.config {
        let Some((_, default)) = direction.settings().iter().find(|(s, _)| s == k) else {
            return Err(vector_err(format!(
                "unknown config key {k:?} for a {} vector",
                direction.name()
            )));
        };
        let ok = match default {
            SettingDefault::Number(_) => v.is_u64(),
            SettingDefault::Flag(_) => v.is_boolean(),
            SettingDefault::AllLegacyVersions => v
                .as_array()
                .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_string)),
            SettingDefault::Unspecified => v.is_string(),
        };
        if !ok {
            return Err(vector_err(format!("config {k} has the wrong type")));
        }
    }
    for s in &raw.spec {
        if !spec_ref_shape(s) {
            return Err(vector_err(format!(
                "spec reference {s:?} is not REVISION/PAGE or REVISION/PAGE#ANCHOR"
            )));
        }
    }
    let transports = parse_transports(raw.transports.as_deref()).map_err(vector_err)?;
    if raw.steps.is_empty() {
        return Err(vector_err("no steps".into()));
    }
    let mut steps = Vec::with_capacity(raw.steps.len());
    let mut last_at = 0;
    for (index, r) in raw.steps.into_iter().enumerate() {
        let step_err = |detail: String| FormatError::Step {
            file: file.clone(),
            step: index,
            detail,
        };
        if let Some(at) = r.at {
            if at < last_at {
                return Err(step_err("time goes backwards".into()));
            }
            last_at = at;
        }
        let step = parse_step(index, r).map_err(step_err)?;
        steps.push(step);
    }
    Ok(Vector {
        name: name.to_owned(),
        description: raw.description,
        row: raw.row,
        direction,
        revision: raw.revision,
        spec: raw.spec,
        config: raw.config,
        transports,
        steps,
    })
}

fn spec_ref_shape(s: &str) -> bool {
    let (rev, rest) = match s.split_once('/') {
        Some(p) => p,
        None => return false,
    };
    rev.len() == 10
        && rev.bytes().all(|b| b.is_ascii_digit() || b == b'-')
        && !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_#.".contains(&b))
}

fn parse_transports(list: Option<&[String]>) -> Result<Transports, String> {
    let Some(list) = list else {
        return Ok(Transports::default());
    };
    let mut set = BTreeSet::new();
    for t in list {
        set.insert(Transport::parse(t).ok_or_else(|| {
            format!("unknown transport {t:?} (in-process, streamable-http, stdio)")
        })?);
    }
    if set.is_empty() {
        return Err("transports is empty".into());
    }
    Ok(Transports(Some(set)))
}

fn parse_step(index: usize, r: RawStep) -> Result<Step, String> {
    let session = r
        .session
        .clone()
        .unwrap_or_else(|| DEFAULT_SESSION.to_owned());
    let only = |allowed: &[&str], r: &RawStep| -> Result<(), String> {
        let given = [
            ("message", r.message.is_some()),
            ("batch", r.batch.is_some()),
            ("on", r.on.is_some()),
            ("lost", r.lost.is_some()),
            ("action", r.action.is_some()),
            ("result", r.result.is_some()),
        ];
        for (name, present) in given {
            if present && !allowed.contains(&name) {
                return Err(format!("`{name}` does not belong in a `{}` step", r.from));
            }
        }
        Ok(())
    };
    let mut http_is_answer = false;
    let input = match r.from.as_str() {
        "peer" => {
            only(&["message", "batch"], &r)?;
            match r.message.clone() {
                Some(Value::Array(messages)) => {
                    if let Some(b) = &r.batch {
                        if !is_placeholder_name(b) {
                            return Err(format!("batch {b:?} must be a placeholder like \"$b1\""));
                        }
                    }
                    Input::PeerBatch {
                        messages,
                        bind: r.batch.clone(),
                    }
                }
                Some(message @ Value::Object(_)) => {
                    if r.batch.is_some() {
                        return Err("`batch` names the stream of an array message".into());
                    }
                    Input::Peer { message }
                }
                Some(_) => return Err("a peer message is an object or an array".into()),
                None => return Err("a peer step needs `message`".into()),
            }
        }
        "upstream" => {
            only(&["message", "on", "lost"], &r)?;
            http_is_answer = true;
            let http = r.http.as_ref().map(parse_answer).transpose()?;
            match (r.message.clone(), r.lost.clone()) {
                (Some(message @ Value::Object(_)), None) => {
                    if http.as_ref().is_some_and(UpstreamAnswer::is_denial) {
                        return Err("a 401/403 answer refuses the credentials and carries no JSON-RPC response: write it as `lost` with `http` (a body goes in `http.body`)".into());
                    }
                    Input::Upstream {
                        on: r.on.clone(),
                        message,
                        http,
                    }
                }
                (None, Some(id)) => {
                    if r.on.is_some() {
                        return Err("`lost` names the request; `on` does not belong".into());
                    }
                    Input::UpstreamLost { id, http }
                }
                (Some(_), None) => return Err("an upstream message is an object".into()),
                _ => return Err("an upstream step needs `message` or `lost` (not both)".into()),
            }
        }
        "timer" => {
            only(&[], &r)?;
            if r.at.is_none() {
                return Err("a timer step needs `at`".into());
            }
            Input::Timer
        }
        "driver" => {
            let action = r.action.clone().ok_or("a driver step needs `action`")?;
            match action.as_str() {
                "discover" => {
                    only(&["action", "result"], &r)?;
                    Input::Discover {
                        result: r.result.clone().ok_or("discover needs `result`")?,
                    }
                }
                other => {
                    only(&["action"], &r)?;
                    match other {
                        "standalone_opened" => Input::StandaloneOpened,
                        "standalone_closed" => Input::StandaloneClosed,
                        "close" => Input::Close,
                        "ping" => Input::Ping,
                        _ => return Err(format!("unknown driver action {other:?}")),
                    }
                }
            }
        }
        other => return Err(format!("unknown `from` {other:?}")),
    };
    let http = if http_is_answer {
        None
    } else {
        match &r.http {
            Some(h) => {
                if !input.makes_host_request() {
                    return Err(format!("`http` does not belong in a {} step", input.kind()));
                }
                Some(parse_http_expect(h, true)?)
            }
            None => None,
        }
    };
    let host_headers = match &r.host_headers {
        None => Vec::new(),
        Some(h) => {
            if !input.makes_host_request() {
                return Err(format!(
                    "`host_headers` does not belong in a {} step (only steps that make a host HTTP request)",
                    input.kind()
                ));
            }
            parse_host_headers(h)?
        }
    };
    let expect = r
        .expect
        .into_iter()
        .enumerate()
        .map(|(i, o)| parse_output(o, &session).map_err(|e| format!("expect[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let absent = r
        .absent
        .into_iter()
        .enumerate()
        .map(|(i, o)| parse_output(o, &session).map_err(|e| format!("absent[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let dropped = parse_dropped(r.dropped.as_deref(), r.error.as_deref(), &input)?;
    Ok(Step {
        index,
        at: r.at,
        session,
        input,
        error: r.error,
        dropped,
        expect,
        absent,
        next_timeout: r.next_timeout,
        http,
        host_headers,
        transports: parse_transports(r.transports.as_deref())?,
    })
}

/// A step's `dropped`: only on a host reply, never with `error` (a dropped reply is
/// accepted, not refused), and the only way to say it (`error` may not name the
/// dropped kinds).
fn parse_dropped(
    dropped: Option<&str>,
    error: Option<&str>,
    input: &Input,
) -> Result<Option<Dropped>, String> {
    if let Some(e @ ("LateReply" | "DuplicateReply")) = error {
        return Err(format!(
            "`error: {e}` is not a refusal: a reply the bridge gave up on or already had is accepted and dropped; write `\"dropped\": \"{}\"`",
            if e == "LateReply" { "late" } else { "duplicate" }
        ));
    }
    let Some(d) = dropped else {
        return Ok(None);
    };
    let kind = match d {
        "late" => Dropped::Late,
        "duplicate" => Dropped::Duplicate,
        other => return Err(format!("unknown `dropped` {other:?} (late, duplicate)")),
    };
    if error.is_some() {
        return Err("`dropped` and `error` exclude each other: a dropped reply is accepted".into());
    }
    match input {
        Input::Peer { message }
            if message.get("method").is_none()
                && (message.get("result").is_some() || message.get("error").is_some()) =>
        {
            Ok(Some(kind))
        }
        _ => Err(
            "`dropped` belongs on a peer step whose message is a reply (result or error)".into(),
        ),
    }
}

/// Whether `s` is a placeholder name (`$` then letters, digits, `_`).
pub fn is_placeholder_name(s: &str) -> bool {
    s.strip_prefix('$')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

/// Headers the runner manages itself: a vector may not set them for the host.
const MANAGED_HEADERS: [&str; 6] = [
    "mcp-session-id",
    "mcp-protocol-version",
    "content-type",
    "accept",
    "content-length",
    "host",
];

fn parse_host_headers(h: &Map<String, Value>) -> Result<Vec<(String, Option<String>)>, String> {
    let mut out = Vec::with_capacity(h.len());
    for (name, value) in h {
        let lower = name.to_ascii_lowercase();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err(format!("host_headers: {name:?} is not a header name"));
        }
        if MANAGED_HEADERS.contains(&lower.as_str()) {
            return Err(format!("host_headers: {name} is the runner's to send"));
        }
        let value = match value {
            Value::String(v) if v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) => {
                Some(v.clone())
            }
            Value::Null => None,
            _ => {
                return Err(format!(
                    "host_headers.{name} must be a string of visible ASCII, or null"
                ))
            }
        };
        out.push((lower, value));
    }
    Ok(out)
}

fn parse_answer(h: &Map<String, Value>) -> Result<UpstreamAnswer, String> {
    let mut a = UpstreamAnswer {
        status: 200,
        headers: Vec::new(),
        body: None,
        sse: false,
    };
    for (k, v) in h {
        match k.as_str() {
            "status" => {
                a.status = v
                    .as_u64()
                    .and_then(|s| u16::try_from(s).ok())
                    .filter(|s| (100..=599).contains(s))
                    .ok_or("http.status must be an HTTP status code")?;
            }
            "headers" => {
                let o = v.as_object().ok_or("http.headers must be an object")?;
                for (name, value) in o {
                    let value = value
                        .as_str()
                        .ok_or("upstream http.headers values are strings")?;
                    a.headers
                        .push((name.to_ascii_lowercase(), value.to_owned()));
                }
            }
            "body" => a.body = Some(v.clone()),
            "sse" => a.sse = v.as_bool().ok_or("http.sse must be a boolean")?,
            other => return Err(format!("unknown key http.{other}")),
        }
    }
    Ok(a)
}

fn parse_http_expect(h: &Map<String, Value>, response: bool) -> Result<HttpExpect, String> {
    let mut e = HttpExpect {
        status: None,
        headers: Vec::new(),
        body: None,
    };
    if h.contains_key("status") && h.contains_key("status?") {
        return Err("http.status and http.status? exclude each other".into());
    }
    for (k, v) in h {
        match (k.as_str(), response) {
            ("status", true) => e.status = Some(parse_status(v)?),
            ("status?", true) => {
                e.status = Some(match parse_status(v)? {
                    StatusPattern::Exact(n) => StatusPattern::Defined(n),
                    _ => return Err("http.status? is a code (429), not a class".into()),
                })
            }
            ("body", true) => e.body = Some(v.clone()),
            ("headers", _) => {
                let o = v.as_object().ok_or("http.headers must be an object")?;
                for (name, value) in o {
                    if !(value.is_string() || value.is_null()) {
                        return Err(format!("http.headers.{name} must be a string or null"));
                    }
                    e.headers.push((name.to_ascii_lowercase(), value.clone()));
                }
            }
            (other, _) => return Err(format!("unknown key http.{other}")),
        }
    }
    Ok(e)
}

fn parse_status(v: &Value) -> Result<StatusPattern, String> {
    if let Some(n) = v.as_u64() {
        return u16::try_from(n)
            .ok()
            .filter(|s| (100..=599).contains(s))
            .map(StatusPattern::Exact)
            .ok_or_else(|| format!("{n} is not an HTTP status"));
    }
    match v.as_str().map(str::as_bytes) {
        Some([c @ b'1'..=b'5', b'x', b'x']) => Ok(StatusPattern::Class(u16::from(c - b'0'))),
        _ => Err("http.status is a code (202) or a class (\"4xx\")".into()),
    }
}

fn parse_output(mut o: Map<String, Value>, step_session: &str) -> Result<Expected, String> {
    let session = match o.remove("session") {
        Some(Value::String(s)) => s,
        Some(_) => return Err("session must be a string".into()),
        None => step_session.to_owned(),
    };
    let role = match o.remove("role") {
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err("role must be a string".into()),
        None => None,
    };
    let http = o.remove("http");
    let to = o.get("to").and_then(Value::as_str).ok_or("no `to`")?;
    let has = |k: &str| o.contains_key(k);
    let kind = match to {
        "peer" => {
            let stream = o
                .get("stream")
                .cloned()
                .ok_or("a peer output needs `stream`")?;
            check_stream(&stream)?;
            let keys: Vec<&str> = o.keys().map(String::as_str).collect();
            for k in &keys {
                if !["to", "stream", "message", "batch", "close"].contains(k) {
                    return Err(format!("unknown key {k:?} in a peer output"));
                }
            }
            match (has("message"), has("batch"), has("close")) {
                (true, false, false) => ExpectedKind::PeerMessage { stream },
                (false, true, false) => {
                    if !o["batch"].is_array() {
                        return Err("batch must be an array".into());
                    }
                    ExpectedKind::PeerBatch { stream }
                }
                (false, false, true) => {
                    if o["close"] != Value::Bool(true) {
                        return Err("close must be true".into());
                    }
                    ExpectedKind::PeerClose { stream }
                }
                _ => return Err("a peer output has exactly one of message, batch, close".into()),
            }
        }
        "upstream" => {
            for k in o.keys() {
                if !["to", "message", "cancel"].contains(&k.as_str()) {
                    return Err(format!("unknown key {k:?} in an upstream output"));
                }
            }
            match (has("message"), has("cancel")) {
                (true, false) => ExpectedKind::UpstreamRequest,
                (false, true) => ExpectedKind::UpstreamCancel {
                    id: o["cancel"].clone(),
                },
                _ => return Err("an upstream output has exactly one of message, cancel".into()),
            }
        }
        other => return Err(format!("unknown `to` {other:?}")),
    };
    let http = match http {
        None => None,
        Some(Value::Object(h)) => {
            if kind != ExpectedKind::UpstreamRequest {
                return Err("`http` on an output belongs to upstream requests only (the legacy side's HTTP is the step's `http`)".into());
            }
            Some(parse_http_expect(&h, false)?)
        }
        Some(_) => return Err("http must be an object".into()),
    };
    if role.is_some() && kind != ExpectedKind::UpstreamRequest {
        return Err("role belongs to upstream requests".into());
    }
    Ok(Expected {
        session,
        kind,
        value: Value::Object(o),
        role,
        http,
    })
}

fn check_stream(s: &Value) -> Result<(), String> {
    match s {
        Value::String(s) if s == "standalone" => Ok(()),
        Value::Object(o)
            if o.len() == 1 && (o.contains_key("request") || o.contains_key("batch")) =>
        {
            Ok(())
        }
        _ => Err("stream is {\"request\": ID}, {\"batch\": \"$bN\"} or \"standalone\"".into()),
    }
}

/// Reads every `*.json` directly inside `dir` (not its subfolders), sorted by name.
pub fn load_dir(dir: &std::path::Path) -> Result<Vec<Vector>, LoadError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::Io {
            path: dir.display().to_string(),
            detail: e.to_string(),
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| LoadError::Io {
                path: p.display().to_string(),
                detail: e.to_string(),
            })?;
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            parse(&name, &text).map_err(LoadError::Format)
        })
        .collect()
}

/// Why a vector folder could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file or the folder could not be read.
    #[error("{path}: {detail}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        detail: String,
    },
    /// A file is not a valid vector.
    #[error(transparent)]
    Format(#[from] FormatError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(step: &str) -> Result<Vector, FormatError> {
        parse(
            "t",
            &format!(r#"{{"description":"d","row":"r","steps":[{step}]}}"#),
        )
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(one(r#"{"from":"timer","at":1,"expct":[]}"#).is_err());
        assert!(parse("t", r#"{"description":"d","row":"r","steps":[],"x":1}"#).is_err());
    }

    #[test]
    fn steps_need_their_fields() {
        assert!(one(r#"{"from":"timer"}"#).is_err());
        assert!(one(r#"{"from":"peer"}"#).is_err());
        assert!(one(r#"{"from":"upstream","message":{},"lost":"x"}"#).is_err());
        assert!(one(r#"{"from":"driver","action":"dance"}"#).is_err());
        assert!(one(r#"{"from":"peer","message":{},"on":1}"#).is_err());
        assert!(one(r#"{"from":"timer","at":1,"http":{"status":202}}"#).is_err());
        assert!(one(r#"{"from":"peer","message":{},"http":{"status":"2xy"}}"#).is_err());
    }

    #[test]
    fn outputs_are_checked() {
        assert!(
            one(r#"{"from":"peer","message":{},"expect":[{"to":"peer","message":{}}]}"#).is_err()
        );
        assert!(one(
            r#"{"from":"peer","message":{},"expect":[{"to":"peer","stream":"x","message":{}}]}"#
        )
        .is_err());
        let v = one(r#"{"from":"peer","message":{},"expect":[{"to":"upstream","message":{"id":"$up1"},"role":"call","http":{"headers":{"Mcp-Method":"tools/call"}}}]}"#).unwrap();
        let e = &v.steps[0].expect[0];
        assert_eq!(e.role.as_deref(), Some("call"));
        assert_eq!(
            e.http.as_ref().unwrap().headers,
            vec![("mcp-method".to_owned(), Value::from("tools/call"))]
        );
        assert!(e.value.get("role").is_none());
    }

    #[test]
    fn host_headers_and_denials() {
        let v = one(r#"{"from":"peer","message":{},"host_headers":{"Authorization":"Bearer a","X-Old":null}}"#).unwrap();
        assert_eq!(
            v.steps[0].host_headers,
            vec![
                ("authorization".to_owned(), Some("Bearer a".to_owned())),
                ("x-old".to_owned(), None)
            ]
        );
        assert!(one(r#"{"from":"timer","at":1,"host_headers":{"Authorization":"x"}}"#).is_err());
        assert!(
            one(r#"{"from":"peer","message":{},"host_headers":{"Mcp-Session-Id":"x"}}"#).is_err()
        );
        assert!(one(r#"{"from":"peer","message":{},"host_headers":{"A":1}}"#).is_err());
        assert!(one(r#"{"from":"upstream","message":{"id":1},"http":{"status":401}}"#).is_err());
        let v = one(r#"{"from":"upstream","lost":"$up1","http":{"status":403,"headers":{"WWW-Authenticate":"Bearer error=\"insufficient_scope\""}}}"#).unwrap();
        match &v.steps[0].input {
            Input::UpstreamLost { http: Some(a), .. } => assert!(a.is_denial()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn direction_and_its_settings() {
        let v = one(r#"{"from":"timer","at":1}"#).unwrap();
        assert_eq!(v.direction, Direction::Forward);
        let v = parse(
            "t",
            r#"{"description":"d","row":"r","direction":"reverse","config":{"retry_wait_ms":5,"public_cache":true},
                "steps":[{"from":"timer","at":1}]}"#,
        )
        .unwrap();
        assert_eq!(v.direction, Direction::Reverse);
        assert_eq!(v.settings()["retry_wait_ms"], 5);
        assert_eq!(v.settings()["max_calls"], 64);
        assert!(v.settings().get("max_batch_len").is_none());
        for bad in [
            r#""direction":"sideways""#,
            r#""direction":"reverse","config":{"max_batch_len":2}"#,
            r#""config":{"retry_wait_ms":2}"#,
            r#""direction":"reverse","config":{"public_cache":1}"#,
        ] {
            let text = format!(
                r#"{{"description":"d","row":"r",{bad},"steps":[{{"from":"timer","at":1}}]}}"#
            );
            assert!(parse("t", &text).is_err(), "{bad}");
        }
    }

    #[test]
    fn next_timeout_null_is_kept_apart_from_absent() {
        let v = one(r#"{"from":"timer","at":1,"next_timeout":null}"#).unwrap();
        assert_eq!(v.steps[0].next_timeout, Some(None));
        let v = one(r#"{"from":"timer","at":1}"#).unwrap();
        assert_eq!(v.steps[0].next_timeout, None);
    }

    #[test]
    fn transports_and_settings() {
        let v = parse(
            "t",
            r#"{"description":"d","row":"r","transports":["stdio"],"config":{"max_rounds":2},
                "steps":[{"from":"timer","at":1,"transports":["in-process"]}]}"#,
        )
        .unwrap();
        assert!(v.transports.includes(Transport::Stdio));
        assert!(!v.transports.includes(Transport::StreamableHttp));
        assert!(!v.steps[0].transports.includes(Transport::Stdio));
        assert_eq!(v.settings()["max_rounds"], 2);
        assert_eq!(v.settings()["retry_pause_ms"], 250);
        assert!(parse(
            "t",
            r#"{"description":"d","row":"r","config":{"max_round":2},"steps":[{"from":"timer","at":1}]}"#
        )
        .is_err());
    }
}
