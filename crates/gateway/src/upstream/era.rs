//! Which era an upstream speaks, found out the way `basic/versioning.mdx` ("Backward
//! Compatibility") tells a dual-era client to, and remembered.
//!
//! ```text
//!   server/discover (2026-07-28 headers and _meta, the readiness prober's request)
//!     ├─ a result, or a recognized modern error (-32020/-32021/-32022) ─► modern
//!     └─ a 4xx without one (or, on stdio, any other error or silence) ─► legacy:
//!          initialize over Streamable HTTP ─ accepted ─► legacy, streamable-http
//!            └─ refused (4xx) ─► GET, `endpoint` event, initialize ─► legacy, http+sse
//! ```
//!
//! The answer is a property of the server, so it is cached (the spec: per origin for
//! HTTP, per server process for stdio). Here an entry is per endpoint URL (origin and
//! path: one origin may serve a 2024-11-05 `/sse` beside a Streamable HTTP `/mcp`) or per
//! command line, in a bounded map with a TTL; when a cached assumption fails (a modern
//! request answered the legacy way, or the reverse) [`EraProber::refute`] drops the entry
//! and the next use probes again. The probe is anonymous unless the caller hands it the
//! host's credentials; an upstream that refuses them (401/403) leaves the era unknown.
//!
//! The probe's `initialize` is a minimal handshake of its own ([`handshake`]): the
//! translation machine performs the real one on the sessions it uses.

use super::legacy::{LegacyError, LegacySession, LegacyTransport, SessionOptions};
use super::{HttpUpstream, OnBehalf, Outbound, UpstreamClient, UpstreamError};
use crate::config::UpstreamEra;
use dualera_adapters::jsonrpc::{ErrorCode, Message, Notification, Request, RequestId};
use http::header::HeaderValue;
use http::{StatusCode, Uri};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// Upstreams whose era is remembered at once.
const MAX_ENTRIES: usize = 256;
/// How long a probed era is trusted without a contradiction.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// How long each step of a probe may take (a stdio server that stays silent on
/// `server/discover` is legacy once this passes).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// The legacy revision the probe's `initialize` asks for (the server may answer with
/// an older one it supports).
const LEGACY_VERSION: &str = dualera_adapters::ProtocolVersion::V2025_11_25;

/// What an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28.
    Modern,
    /// 2025-11-25 and earlier, over this transport.
    Legacy(LegacyTransport),
}

impl Era {
    /// `modern`, or `legacy` (the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Modern => "modern",
            Self::Legacy(_) => "legacy",
        }
    }

    /// Whether the upstream is legacy.
    pub fn is_legacy(self) -> bool {
        matches!(self, Self::Legacy(_))
    }

    /// How `/readyz` and the report name it: `modern upstream`, or
    /// `legacy upstream (streamable-http)`.
    pub fn describe(self) -> String {
        match self {
            Self::Modern => "modern upstream".into(),
            Self::Legacy(t) => format!("legacy upstream ({})", t.as_str()),
        }
    }
}

/// Why the era could not be determined.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EraError {
    /// The upstream could not be reached, or answered nothing MCP.
    #[error("cannot determine the upstream's era: {0}")]
    Upstream(#[from] UpstreamError),
    /// The legacy handshake failed on every legacy transport.
    #[error("the upstream is not modern and refused a legacy session: {0}")]
    Legacy(#[from] LegacyError),
}

/// Where an upstream is, for probing.
#[derive(Debug, Clone)]
pub enum Target {
    /// An HTTP(S) endpoint.
    Http {
        /// The gateway's upstream client (TLS verified, `--upstream-ca`; boxed: it is
        /// large beside the stdio variant).
        client: Box<UpstreamClient>,
        /// The endpoint URL.
        uri: Uri,
        /// Largest message decoded.
        max_message: usize,
    },
    /// A command spawned on stdio.
    Stdio {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// Largest line read.
        max_message: usize,
    },
}

impl Target {
    /// The cache key: the endpoint URL, or `stdio:` and the command line.
    pub fn key(&self) -> String {
        match self {
            Self::Http { uri, .. } => uri.to_string(),
            Self::Stdio { program, args, .. } => {
                let mut k = format!("stdio:{program}");
                for a in args {
                    k.push(' ');
                    k.push_str(a);
                }
                k
            }
        }
    }
}

/// The gateway's remembered eras, and the probe.
#[derive(Debug)]
pub struct EraProber {
    cache: Mutex<HashMap<String, (Era, Instant)>>,
    ttl: Duration,
    step: Duration,
    probes: AtomicU64,
    /// One probe at a time: concurrent first uses wait for it and find its answer.
    probing: tokio::sync::Mutex<()>,
    /// A background probe is running (at most one).
    background: AtomicBool,
    /// Some upstream was ever found legacy: until then the dispatch of every modern
    /// request (the pass-through hot path) looks no further, no lock, no key built.
    any_legacy: AtomicBool,
    /// When the last background probe started (ms since `epoch`; peers can provoke
    /// them, so they are rate limited).
    last_background: AtomicU64,
    epoch: Instant,
}

/// Background probes start at most this often.
const BACKGROUND_EVERY: Duration = Duration::from_secs(5);

impl Default for EraProber {
    fn default() -> Self {
        Self::new(DEFAULT_TTL, STEP_TIMEOUT)
    }
}

impl EraProber {
    /// A prober trusting answers for `ttl`, each probe step bounded by `step`.
    pub fn new(ttl: Duration, step: Duration) -> Self {
        Self {
            cache: Mutex::new(HashMap::new()),
            ttl,
            step,
            probes: AtomicU64::new(0),
            probing: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
            any_legacy: AtomicBool::new(false),
            last_background: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Probes run so far (each is at least one request to an upstream).
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// The remembered era of `target`, if fresh.
    pub fn cached(&self, target: &Target) -> Option<Era> {
        let key = target.key();
        let c = self.cache.lock().ok()?;
        let (era, at) = c.get(&key)?;
        (at.elapsed() < self.ttl).then_some(*era)
    }

    /// The remembered era of `target`, fresh or not (`true`: fresh): a stale answer
    /// is still the best guess while a new probe runs.
    pub fn remembered(&self, target: &Target) -> Option<(Era, bool)> {
        let key = target.key();
        let c = self.cache.lock().ok()?;
        let (era, at) = c.get(&key)?;
        Some((*era, at.elapsed() < self.ttl))
    }

    /// Probes `target` again in the background (anonymously), unless a background
    /// probe is already running; its answer replaces the remembered one.
    pub fn refresh_in_background(self: &Arc<Self>, target: &Target, setting: UpstreamEra) {
        if setting == UpstreamEra::Modern {
            return;
        }
        // ms since the epoch, +1 so that 0 means "never".
        let now = u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last_background.load(Ordering::Relaxed);
        let every = u64::try_from(BACKGROUND_EVERY.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return;
        }
        if self.background.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_background.store(now, Ordering::Relaxed);
        let this = self.clone();
        let target = target.clone();
        tokio::spawn(async move {
            let _one = this.probing.lock().await;
            this.probes.fetch_add(1, Ordering::Relaxed);
            match this.probe(&target, setting, OnBehalf::default()).await {
                Ok(era) => {
                    debug!(upstream = %target.key(), era = ?era, "upstream era probed");
                    this.remember(&target, era);
                }
                Err(e) => debug!(upstream = %target.key(), error = %e, "upstream era probe failed"),
            }
            this.background.store(false, Ordering::Release);
        });
    }

    /// What an exchange just showed (`observed`): when it is not what is remembered
    /// (or nothing is), forget the old answer and probe again in the background.
    pub fn suspect(self: &Arc<Self>, target: &Target, setting: UpstreamEra, observed: Era) {
        if setting == UpstreamEra::Modern {
            return;
        }
        let agrees = self
            .remembered(target)
            .is_some_and(|(era, _)| era.is_legacy() == observed.is_legacy());
        if !agrees {
            self.refute(target, observed);
            self.refresh_in_background(target, setting);
        }
    }

    /// Whether any upstream was ever found legacy (see [`EraProber::any_legacy`]'s
    /// field): false, and no legacy era is remembered.
    pub fn any_legacy(&self) -> bool {
        self.any_legacy.load(Ordering::Acquire)
    }

    fn remember(&self, target: &Target, era: Era) {
        if era.is_legacy() {
            self.any_legacy.store(true, Ordering::Release);
        }
        let Ok(mut c) = self.cache.lock() else { return };
        if c.len() >= MAX_ENTRIES {
            c.retain(|_, (_, at)| at.elapsed() < self.ttl);
        }
        if c.len() >= MAX_ENTRIES {
            if let Some(oldest) = c
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                c.remove(&oldest);
            }
        }
        c.insert(target.key(), (era, Instant::now()));
    }

    /// A cached assumption failed: `observed` is what the upstream just showed (a
    /// modern request answered the legacy way: `Era::Legacy`; a legacy one answered
    /// the modern way: `Era::Modern`). If it contradicts the remembered era the entry
    /// is dropped and `true` returned: the next [`EraProber::era`] probes again.
    pub fn refute(&self, target: &Target, observed: Era) -> bool {
        let Ok(mut c) = self.cache.lock() else {
            return false;
        };
        let key = target.key();
        let contradicted = c
            .get(&key)
            .is_some_and(|(era, _)| era.is_legacy() != observed.is_legacy());
        if contradicted {
            c.remove(&key);
            info!(upstream = %key, observed = observed.as_str(), "the upstream's era changed; it will be probed again");
        }
        contradicted
    }

    /// The era of `target` under `setting`: `modern` is taken at its word; `legacy`
    /// still finds out which legacy transport; `auto` probes fully. Remembered
    /// either way.
    pub async fn era(
        &self,
        target: &Target,
        setting: UpstreamEra,
        on_behalf: OnBehalf<'_>,
    ) -> Result<Era, EraError> {
        if setting == UpstreamEra::Modern {
            return Ok(Era::Modern);
        }
        if let Some(era) = self.cached(target) {
            if setting == UpstreamEra::Auto || era.is_legacy() {
                return Ok(era);
            }
        }
        let _one = self.probing.lock().await;
        if let Some(era) = self.cached(target) {
            if setting == UpstreamEra::Auto || era.is_legacy() {
                return Ok(era);
            }
        }
        self.probes.fetch_add(1, Ordering::Relaxed);
        let era = self.probe(target, setting, on_behalf).await?;
        debug!(upstream = %target.key(), era = ?era, "upstream era probed");
        self.remember(target, era);
        Ok(era)
    }

    async fn probe(
        &self,
        target: &Target,
        setting: UpstreamEra,
        on_behalf: OnBehalf<'_>,
    ) -> Result<Era, EraError> {
        match target {
            Target::Http {
                client,
                uri,
                max_message,
            } => {
                if setting == UpstreamEra::Auto {
                    let up = HttpUpstream::with_client(
                        uri.clone(),
                        UpstreamClient::clone(client),
                        *max_message,
                    );
                    let request = Outbound::from(discover_request());
                    let answer = tokio::time::timeout(self.step, async {
                        up.exchange(&request, on_behalf, &[])
                            .await?
                            .response()
                            .await
                    })
                    .await
                    .unwrap_or_else(|_| {
                        Err(UpstreamError::Unreachable {
                            detail: "no answer to server/discover in time".into(),
                        })
                    });
                    match modern_verdict(answer) {
                        Verdict::Modern => return Ok(Era::Modern),
                        Verdict::Legacy => {}
                        Verdict::Unknown(e) => return Err(e.into()),
                    }
                }
                // No standalone stream: the session is closed right after its
                // handshake, and would wait for the stream's head before that.
                let options = SessionOptions {
                    authorization: on_behalf.authorization.cloned(),
                    standalone_stream: false,
                    ..SessionOptions::new(*max_message)
                };
                let session = LegacySession::streamable_http(
                    UpstreamClient::clone(client),
                    uri.clone(),
                    options.clone(),
                );
                let first = handshake(&session, self.step).await;
                session.close().await;
                match first {
                    Ok(_) => return Ok(Era::Legacy(LegacyTransport::StreamableHttp)),
                    // 2025-11-25 transports, "Backwards Compatibility": a POST of
                    // `initialize` refused with a 4xx means an older server: GET the
                    // URL and expect an `endpoint` event.
                    Err(LegacyError::Upstream(UpstreamError::Status { status }))
                        if (400..500).contains(&status) => {}
                    Err(e) => return Err(e.into()),
                }
                let session =
                    LegacySession::http_sse(UpstreamClient::clone(client), uri.clone(), options)
                        .await?;
                let done = handshake(&session, self.step).await;
                session.close().await;
                done?;
                Ok(Era::Legacy(LegacyTransport::HttpSse))
            }
            Target::Stdio {
                program,
                args,
                max_message,
            } => {
                let session =
                    LegacySession::stdio(program, args, &SessionOptions::new(*max_message))?;
                let era = self.probe_stdio(&session, setting).await;
                session.close().await;
                era
            }
        }
    }

    /// stdio's probe (2026-07-28 `basic/transports/stdio.mdx`, "Backward
    /// Compatibility"): `server/discover` first; a result or a recognized modern error
    /// is modern; any other error, or silence past the step timeout, is legacy — "the
    /// fallback MUST NOT be keyed to one specific error code".
    async fn probe_stdio(
        &self,
        session: &LegacySession,
        setting: UpstreamEra,
    ) -> Result<Era, EraError> {
        if setting == UpstreamEra::Auto {
            let request = discover_request();
            session.send(&request, OnBehalf::default()).await?;
            let id = RequestId::String(PROBE_ID.into());
            let answer = tokio::time::timeout(self.step, response_to(session, &id)).await;
            if let Ok(Ok(response)) = answer {
                if modern_verdict(Ok(response)) == Verdict::Modern {
                    return Ok(Era::Modern);
                }
            }
        }
        handshake(session, self.step).await?;
        Ok(Era::Legacy(LegacyTransport::Stdio))
    }
}

/// The id of the probe's `server/discover`.
const PROBE_ID: &str = "dualera-era-probe";

/// The probe's `server/discover`: the readiness prober's request.
fn discover_request() -> Message {
    crate::readiness::discover_request(RequestId::String(PROBE_ID.into()))
}

/// What one answer to `server/discover` says.
#[derive(Debug)]
enum Verdict {
    Modern,
    Legacy,
    Unknown(UpstreamError),
}

impl PartialEq for Verdict {
    fn eq(&self, other: &Self) -> bool {
        matches!(
            (self, other),
            (Self::Modern, Self::Modern) | (Self::Legacy, Self::Legacy)
        )
    }
}

/// 2026-07-28 `basic/transports/streamable-http.mdx`, "Backward Compatibility": a
/// result or a recognized modern error is a modern server ("retry … rather than
/// falling back"); a 4xx whose body is empty or not a recognized modern JSON-RPC error
/// is a legacy one. Credentials refused or no answer at all decide nothing.
fn modern_verdict(answer: Result<dualera_adapters::Response, UpstreamError>) -> Verdict {
    match answer {
        Ok(r) => match r.outcome {
            Ok(_) => Verdict::Modern,
            Err(e) if is_modern_error(e.code) => Verdict::Modern,
            Err(_) => Verdict::Legacy,
        },
        Err(UpstreamError::Status { status }) if (400..500).contains(&status) => Verdict::Legacy,
        Err(e) => Verdict::Unknown(e),
    }
}

/// The errors only a modern server sends (`basic/index.mdx`, the MCP range).
fn is_modern_error(code: ErrorCode) -> bool {
    [
        ErrorCode::HEADER_MISMATCH,
        ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
    ]
    .contains(&code)
}

/// Which era an HTTP answer shows, for [`EraProber::refute`]: a `4xx` whose body is a
/// recognized modern error is modern; any other `4xx` to a modern request (`400
/// Missing session ID` and the like) is legacy. `None`: nothing to learn.
pub fn evidence(status: StatusCode, body: &[u8]) -> Option<Era> {
    if !status.is_client_error()
        || status == StatusCode::UNAUTHORIZED
        || status == StatusCode::FORBIDDEN
    {
        return None;
    }
    let modern = dualera_adapters::jsonrpc::parse(body).ok().is_some_and(|m| {
        matches!(m, Message::Response(r) if r.outcome.as_ref().err().is_some_and(|e| is_modern_error(e.code)))
    });
    Some(if modern {
        Era::Modern
    } else {
        Era::Legacy(LegacyTransport::StreamableHttp)
    })
}

/// Which era an answer to the gateway's own modern `server/discover` (request `id`,
/// the translating path's) shows. The legacy way is a refusal at the transport: a 4xx
/// without a JSON-RPC body, or an error that is not a recognized modern one and does
/// not answer `id` (the official SDKs' "Missing session ID" carries `"server-error"`
/// or `null`). An error that answers the request is the server's answer to it, modern
/// or not, and teaches nothing. `None`: nothing to learn.
pub fn discover_answer_evidence(
    answer: Result<&dualera_adapters::Response, &UpstreamError>,
    id: &RequestId,
) -> Option<Era> {
    let legacy = match answer {
        Ok(r) => {
            r.id.as_ref() != Some(id)
                && r.outcome
                    .as_ref()
                    .err()
                    .is_some_and(|e| !is_modern_error(e.code))
        }
        Err(UpstreamError::Status { status }) => (400..500).contains(status),
        Err(_) => false,
    };
    legacy.then_some(Era::Legacy(LegacyTransport::StreamableHttp))
}

/// Which era an error answer to a host's `server/discover` relayed over a stdio upstream
/// shows: on stdio any error but a recognized modern one means legacy (2026-07-28
/// `basic/transports/stdio.mdx`, "Backward Compatibility": the fallback "MUST NOT be
/// keyed to one specific error code"). `None`: a result, or a modern error.
pub fn stdio_discover_evidence(answer: &dualera_adapters::Response) -> Option<Era> {
    let legacy = answer
        .outcome
        .as_ref()
        .err()
        .is_some_and(|e| !is_modern_error(e.code));
    legacy.then_some(Era::Legacy(LegacyTransport::Stdio))
}

/// The next response with `id` on the session (other messages are skipped: a probe
/// and a test handshake have nothing else to say).
async fn response_to(
    session: &LegacySession,
    id: &RequestId,
) -> Result<dualera_adapters::Response, LegacyError> {
    while let Some(item) = session.recv().await {
        if let Message::Response(r) = item? {
            if r.id.as_ref() == Some(id) {
                return Ok(r);
            }
        }
    }
    Err(LegacyError::Closed {
        detail: "the session ended before its answer".into(),
    })
}

/// A minimal `initialize` / `notifications/initialized` handshake (the probe's, and a
/// test's): the gateway as `dualera` declaring no capabilities. Returns the
/// `initialize` result.
pub async fn handshake(session: &LegacySession, timeout: Duration) -> Result<Value, LegacyError> {
    handshake_as(session, &json!({}), timeout).await
}

/// [`handshake`] declaring `capabilities`.
pub async fn handshake_as(
    session: &LegacySession,
    capabilities: &Value,
    timeout: Duration,
) -> Result<Value, LegacyError> {
    let id = RequestId::String("dualera-init".into());
    let initialize = Message::Request(Request {
        id: id.clone(),
        method: "initialize".into(),
        params: Some(json!({
            "protocolVersion": LEGACY_VERSION,
            "capabilities": capabilities,
            "clientInfo": { "name": "dualera", "version": env!("CARGO_PKG_VERSION") },
        })),
    });
    let answered = tokio::time::timeout(timeout, async {
        session.send(&initialize, OnBehalf::default()).await?;
        response_to(session, &id).await
    })
    .await
    .map_err(|_| LegacyError::Closed {
        detail: "no answer to initialize in time".into(),
    })??;
    let result = answered.outcome.map_err(|e| {
        LegacyError::Upstream(UpstreamError::Protocol {
            detail: format!("initialize refused: {} {}", e.code.0, e.message),
        })
    })?;
    if !result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| dualera_adapters::ProtocolVersion::LEGACY.contains(&v))
    {
        return Err(LegacyError::Upstream(UpstreamError::Protocol {
            detail: "initialize answered without a legacy protocolVersion".into(),
        }));
    }
    let initialized = Message::Notification(Notification {
        method: "notifications/initialized".into(),
        params: None,
    });
    session.send(&initialized, OnBehalf::default()).await?;
    Ok(result)
}

/// An `Authorization` value, for callers that hold one by value.
pub fn on_behalf_of(authorization: Option<&HeaderValue>) -> OnBehalf<'_> {
    OnBehalf {
        authorization,
        ..OnBehalf::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualera_adapters::{ErrorObject, Response};

    fn error(code: i64) -> Result<Response, UpstreamError> {
        Ok(Response::error(
            Some(RequestId::Number(1)),
            ErrorObject::new(ErrorCode(code), "x"),
        ))
    }

    #[test]
    fn recognized_modern_errors_are_modern_and_the_rest_legacy() {
        assert_eq!(modern_verdict(error(-32022)), Verdict::Modern);
        assert_eq!(modern_verdict(error(-32020)), Verdict::Modern);
        assert_eq!(modern_verdict(error(-32021)), Verdict::Modern);
        assert_eq!(modern_verdict(error(-32600)), Verdict::Legacy);
        assert_eq!(modern_verdict(error(-32601)), Verdict::Legacy);
        assert_eq!(
            modern_verdict(Ok(Response::result(RequestId::Number(1), json!({})))),
            Verdict::Modern
        );
        assert_eq!(
            modern_verdict(Err(UpstreamError::Status { status: 405 })),
            Verdict::Legacy
        );
        assert!(matches!(
            modern_verdict(Err(UpstreamError::Status { status: 502 })),
            Verdict::Unknown(_)
        ));
    }

    #[test]
    fn only_a_refusal_at_the_transport_is_legacy_evidence() {
        let id = RequestId::String("d".into());
        let refusal = Response::error(
            Some(RequestId::String("server-error".into())),
            ErrorObject::new(ErrorCode(-32600), "Bad Request: Missing session ID"),
        );
        let null_id = Response::error(None, ErrorObject::new(ErrorCode(-32000), "No session"));
        let answered = Response::error(
            Some(id.clone()),
            ErrorObject::new(ErrorCode(-32603), "boom"),
        );
        let modern = Response::error(None, ErrorObject::new(ErrorCode(-32022), "versions"));
        assert!(discover_answer_evidence(Ok(&refusal), &id).is_some_and(Era::is_legacy));
        assert!(discover_answer_evidence(Ok(&null_id), &id).is_some_and(Era::is_legacy));
        assert_eq!(discover_answer_evidence(Ok(&answered), &id), None);
        assert_eq!(discover_answer_evidence(Ok(&modern), &id), None);
        let status = UpstreamError::Status { status: 404 };
        assert!(discover_answer_evidence(Err(&status), &id).is_some());
        let down = UpstreamError::Status { status: 502 };
        assert_eq!(discover_answer_evidence(Err(&down), &id), None);
    }

    #[test]
    fn evidence_reads_a_4xx_body() {
        let legacy = br#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#;
        let modern = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported","data":{"supported":["2026-07-28"]}}}"#;
        assert!(evidence(StatusCode::BAD_REQUEST, legacy).is_some_and(Era::is_legacy));
        assert_eq!(evidence(StatusCode::BAD_REQUEST, modern), Some(Era::Modern));
        assert!(evidence(StatusCode::NOT_FOUND, b"").is_some_and(Era::is_legacy));
        assert_eq!(evidence(StatusCode::OK, legacy), None);
        assert_eq!(evidence(StatusCode::UNAUTHORIZED, b""), None);
    }

    #[test]
    fn the_cache_is_bounded_and_refuted_entries_go() {
        let p = EraProber::default();
        let t = |i: usize| Target::Stdio {
            program: format!("p{i}"),
            args: vec!["--x".into()],
            max_message: 1,
        };
        for i in 0..MAX_ENTRIES + 10 {
            p.remember(&t(i), Era::Modern);
        }
        assert!(p.cache.lock().unwrap().len() <= MAX_ENTRIES);
        let last = t(MAX_ENTRIES + 9);
        assert_eq!(p.cached(&last), Some(Era::Modern));
        assert!(!p.refute(&last, Era::Modern));
        assert!(p.refute(&last, Era::Legacy(LegacyTransport::Stdio)));
        assert_eq!(p.cached(&last), None);
        assert_eq!(last.key(), format!("stdio:p{} --x", MAX_ENTRIES + 9));
    }

    #[test]
    fn entries_expire() {
        let p = EraProber::new(Duration::from_millis(0), STEP_TIMEOUT);
        let t = Target::Stdio {
            program: "p".into(),
            args: vec![],
            max_message: 1,
        };
        p.remember(&t, Era::Modern);
        assert_eq!(p.cached(&t), None);
    }
}
