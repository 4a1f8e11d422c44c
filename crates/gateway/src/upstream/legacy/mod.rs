//! Legacy sessions on the upstream side: the gateway as the *client* of a server that
//! speaks only the session-based revisions (2025-11-25 and earlier), for modern hosts
//! in front of it (the reverse bridge, DESIGN.md "Reverse bridge").
//!
//! A [`LegacySession`] is one session to such a server over one of its three
//! transports, one file each: `streamable` (Streamable HTTP, 2025-03-26 to
//! 2025-11-25), `sse` (the 2024-11-05 HTTP+SSE transport) and `stdio` (a child process
//! of its own). The interface is message-level and the same for all three:
//!
//! ```text
//!   send(message, on_behalf) ──► upstream         (requests, notifications, replies)
//!   recv() ◄── bounded queue ◄── every message the server sends (responses, its own
//!                                requests and notifications), in arrival order
//! ```
//!
//! The queue is bounded and its producers wait: an SSE body or a child's stdout is
//! read no faster than the consumer takes messages, and nothing is dropped. The
//! gateway's own traffic never reaches the consumer: answers to its keep-alive pings
//! are taken out of the stream, and the server's pings are answered here.
//!
//! The `initialize` handshake is the translation machine's business; the session only
//! notices what its transport needs from it (the `Mcp-Session-Id` of the `initialize`
//! response, the negotiated `protocolVersion` for `MCP-Protocol-Version`, and
//! `notifications/initialized` as the moment to open the standalone GET stream).
//!
//! [`pool`] keeps these sessions per (authorization context, declared capabilities,
//! upstream), with bounds, idle closing and pings.

pub mod pool;
mod sse;
mod stdio;
mod streamable;

pub use self::pool::{Lease, PoolKey, PoolLimits, SessionPool};

use super::{OnBehalf, UpstreamClient, UpstreamError};
use dualera_adapters::jsonrpc::{self, Message, Request, RequestId, Response};
use http::header::HeaderValue;
use http::Uri;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// Messages from the server queued toward the consumer (its producers wait when full).
const INBOUND_QUEUE: usize = 64;
/// Keep-alive pings outstanding at once on one session.
const MAX_PINGS: usize = 4;
/// The id prefix of the gateway's own pings (their answers never reach the consumer).
const PING_PREFIX: &str = "dualera-ping-";
/// How long opening a transport (the HTTP+SSE `endpoint` event, a child's spawn) and
/// closing one (`DELETE`) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a legacy upstream session (or the pool) cannot do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LegacyError {
    /// The upstream answered `404` for the session: it no longer knows it (2025-11-25
    /// transports: the client MUST start a new session). Re-initialize.
    #[error("the upstream session expired (HTTP 404); a new one must be initialized")]
    Expired,
    /// The session was closed (by the gateway, or the transport ended).
    #[error("the upstream session is closed: {detail}")]
    Closed {
        /// Why.
        detail: String,
    },
    /// The exchange failed (unreachable, TLS, credentials refused, undecodable).
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// A ping got no answer in time.
    #[error("the upstream did not answer a ping within {} ms", .0.as_millis())]
    PingTimeout(Duration),
    /// `max_upstream_sessions` is reached.
    #[error("Too many upstream sessions; try again later (limit {max})")]
    TooManySessions {
        /// The bound.
        max: usize,
    },
    /// `max_upstream_sessions_per_key` is reached for this caller and capabilities.
    #[error(
        "Too many upstream sessions for this caller; end one or try again later (limit {max})"
    )]
    TooManyForKey {
        /// The bound.
        max: usize,
    },
}

impl LegacyError {
    fn closed(detail: impl Into<String>) -> Self {
        Self::Closed {
            detail: detail.into(),
        }
    }

    fn protocol(detail: impl Into<String>) -> Self {
        Self::Upstream(UpstreamError::Protocol {
            detail: detail.into(),
        })
    }

    /// Whether a new session (a fresh `initialize`) is the remedy.
    pub fn needs_new_session(&self) -> bool {
        matches!(self, Self::Expired | Self::Closed { .. })
    }
}

/// One item of a session's inbound stream: a message, or why the session broke.
pub type Item = Result<Message, LegacyError>;

/// An [`Item`] with the legacy request whose response stream carried it (Streamable
/// HTTP: a server request or notification sent about that request, 2025-11-25
/// `basic/transports`, "Sending Messages to the Server"); `None` for what came on a
/// stream shared by the whole session (the standalone GET stream, the 2024-11-05 SSE
/// stream, a child's stdout).
pub type Attributed = (Option<RequestId>, Item);

/// How a session reaches its server and what bounds it.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Largest message decoded from the server (the gateway's upstream body limit).
    pub max_message: usize,
    /// The `Authorization` every exchange the gateway makes on its own for this
    /// session carries (the standalone GET stream, pings, `DELETE`): the session
    /// belongs to one authorization context ([`PoolKey`]).
    pub authorization: Option<HeaderValue>,
    /// Whether a Streamable HTTP session opens the standalone GET stream once
    /// initialized (and sends its first request only once that stream is open). The
    /// era probe's session, closed right after its handshake, does not.
    pub standalone_stream: bool,
}

impl SessionOptions {
    /// No credentials; messages up to `max_message` bytes; the standalone stream.
    pub fn new(max_message: usize) -> Self {
        Self {
            max_message,
            authorization: None,
            standalone_stream: true,
        }
    }
}

/// Which legacy transport a session speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyTransport {
    /// Streamable HTTP (2025-03-26 to 2025-11-25).
    StreamableHttp,
    /// The 2024-11-05 HTTP+SSE transport.
    HttpSse,
    /// A child process on stdio.
    Stdio,
}

impl LegacyTransport {
    /// Its name in `/readyz`, the metrics and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StreamableHttp => "streamable-http",
            Self::HttpSse => "http+sse",
            Self::Stdio => "stdio",
        }
    }
}

/// What the transports' readers share with the session: the queue toward the
/// consumer, the pings in flight, and whether the session still lives.
#[derive(Debug)]
struct Core {
    tx: mpsc::Sender<Attributed>,
    pings: Mutex<HashMap<String, oneshot::Sender<()>>>,
    /// Ids of the server's `ping` requests, answered by the session's pong task.
    pongs: mpsc::Sender<RequestId>,
    closed: AtomicBool,
    expired: AtomicBool,
}

impl Core {
    /// Hands one message of the server to the consumer, waiting while the queue is
    /// full; the gateway's own ping traffic is handled here instead. `false`: the
    /// consumer is gone.
    async fn deliver(&self, message: Message) -> bool {
        self.deliver_on(None, message).await
    }

    /// [`Core::deliver`], naming the legacy request whose stream carried `message`.
    async fn deliver_on(&self, on: Option<RequestId>, message: Message) -> bool {
        match &message {
            Message::Response(Response {
                id: Some(RequestId::String(id)),
                ..
            }) if id.starts_with(PING_PREFIX) => {
                let waiter = self.pings.lock().ok().and_then(|mut p| p.remove(id));
                if let Some(w) = waiter {
                    let _ = w.send(());
                    return true;
                }
            }
            // basic/utilities/ping.mdx: "The receiver MUST respond promptly with an
            // empty response" — the session answers the server's pings itself, so an
            // idle pooled session (nobody reading) still does.
            Message::Request(Request { id, method, .. }) if method == "ping" => {
                let _ = self.pongs.send(id.clone()).await;
                return true;
            }
            _ => {}
        }
        self.tx.send((on, Ok(message))).await.is_ok()
    }

    /// Ends the session, and the consumer's stream with `error` (once). Never waits:
    /// the caller may be the consumer itself (a send that got a 404 while its queue is
    /// full); a consumer that misses the item still sees [`LegacySession::is_alive`]
    /// and the error of its next send.
    async fn fail(&self, error: LegacyError) {
        if matches!(error, LegacyError::Expired) {
            self.expired.store(true, Ordering::Relaxed);
        }
        if !self.closed.swap(true, Ordering::Relaxed) {
            let _ = self.tx.try_send((None, Err(error)));
        }
    }

    fn is_alive(&self) -> bool {
        !self.closed.load(Ordering::Relaxed)
    }
}

/// The transport under a session.
#[derive(Debug)]
enum Transport {
    Streamable(streamable::Streamable),
    Sse(sse::Sse),
    Stdio(stdio::Stdio),
}

#[derive(Debug)]
struct Inner {
    transport: Transport,
    core: Arc<Core>,
    /// Readers and helper tasks, ended with the session.
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Inner {
    async fn send(&self, message: &Message, on_behalf: OnBehalf<'_>) -> Result<(), LegacyError> {
        use tracing::Instrument;
        let span = tracing::debug_span!(
            "upstream_legacy_send",
            transport = tracing::field::Empty,
            session = tracing::field::Empty,
            method = tracing::field::Empty,
            request = tracing::field::Empty,
        );
        if !span.is_disabled() {
            self.describe(&span, message);
        }
        self.send_inner(message, on_behalf).instrument(span).await
    }

    /// Fills a send's span: the transport, the session's log tag (never the id
    /// itself), the method and the request id.
    fn describe(&self, span: &tracing::Span, message: &Message) {
        let (transport, session) = match &self.transport {
            Transport::Streamable(t) => ("streamable-http", t.session_id()),
            Transport::Sse(t) => ("http+sse", Some(t.endpoint().to_string())),
            Transport::Stdio(_) => ("stdio", None),
        };
        span.record("transport", transport);
        if let Some(s) = session {
            span.record(
                "session",
                crate::digest::short_digest(s.as_bytes(), 4).as_str(),
            );
        }
        match message {
            Message::Request(r) => {
                span.record("method", r.method.as_str());
                span.record("request", tracing::field::debug(&r.id));
            }
            Message::Notification(n) => {
                span.record("method", n.method.as_str());
            }
            Message::Response(r) => {
                if let Some(id) = &r.id {
                    span.record("request", tracing::field::debug(id));
                }
            }
        }
    }

    async fn send_inner(
        &self,
        message: &Message,
        on_behalf: OnBehalf<'_>,
    ) -> Result<(), LegacyError> {
        if !self.core.is_alive() {
            return Err(if self.core.expired.load(Ordering::Relaxed) {
                LegacyError::Expired
            } else {
                LegacyError::closed("the session has ended")
            });
        }
        match &self.transport {
            Transport::Streamable(t) => t.send(self, message, on_behalf).await,
            Transport::Sse(t) => t.send(&self.core, message, on_behalf).await,
            Transport::Stdio(t) => t.send(message).await,
        }
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task).abort_handle();
        if let Ok(mut t) = self.tasks.lock() {
            t.retain(|h| !h.is_finished());
            t.push(handle);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.lock() {
            for t in tasks.iter() {
                t.abort();
            }
        }
    }
}

/// One legacy session to an upstream server.
#[derive(Debug)]
pub struct LegacySession {
    inner: Arc<Inner>,
    inbound: tokio::sync::Mutex<mpsc::Receiver<Attributed>>,
    next_ping: AtomicU64,
}

impl LegacySession {
    fn assemble(
        transport: Transport,
        make_core: impl FnOnce(mpsc::Sender<Attributed>, mpsc::Sender<RequestId>) -> Arc<Core>,
    ) -> (Self, mpsc::Receiver<RequestId>) {
        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
        let (pong_tx, pong_rx) = mpsc::channel(INBOUND_QUEUE);
        let core = make_core(tx, pong_tx);
        let inner = Arc::new(Inner {
            transport,
            core,
            tasks: Mutex::new(Vec::new()),
        });
        (
            Self {
                inner,
                inbound: tokio::sync::Mutex::new(rx),
                next_ping: AtomicU64::new(0),
            },
            pong_rx,
        )
    }

    fn core(tx: mpsc::Sender<Attributed>, pongs: mpsc::Sender<RequestId>) -> Arc<Core> {
        Arc::new(Core {
            tx,
            pings: Mutex::new(HashMap::new()),
            pongs,
            closed: AtomicBool::new(false),
            expired: AtomicBool::new(false),
        })
    }

    /// Starts the task answering the server's pings (it holds the session weakly).
    fn start_pongs(&self, mut pongs: mpsc::Receiver<RequestId>) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        self.inner.spawn(async move {
            while let Some(id) = pongs.recv().await {
                let Some(inner) = weak.upgrade() else { return };
                let pong = Message::Response(Response::result(id, serde_json::json!({})));
                if inner.send(&pong, OnBehalf::default()).await.is_err() {
                    return;
                }
            }
        });
    }

    /// A Streamable HTTP session to `uri` (nothing is sent until the first message,
    /// which should be `initialize`).
    pub fn streamable_http(client: UpstreamClient, uri: Uri, options: SessionOptions) -> Self {
        let transport = Transport::Streamable(streamable::Streamable::new(client, uri, options));
        let (session, pongs) = Self::assemble(transport, Self::core);
        session.start_pongs(pongs);
        session
    }

    /// A 2024-11-05 HTTP+SSE session: `GET uri`, and once the `endpoint` event named
    /// where to POST (same origin only), a session ready for `initialize`.
    pub async fn http_sse(
        client: UpstreamClient,
        uri: Uri,
        options: SessionOptions,
    ) -> Result<Self, LegacyError> {
        let (opened, body) = sse::Sse::open(client, uri, options).await?;
        let (session, pongs) = Self::assemble(Transport::Sse(opened), Self::core);
        session.start_pongs(pongs);
        let core = session.inner.core.clone();
        session.inner.spawn(sse::pump(body, core));
        Ok(session)
    }

    /// A session with a child process of its own: `program args…` speaking
    /// newline-delimited JSON-RPC on stdio (killed when the session ends).
    pub fn stdio(
        program: &str,
        args: &[String],
        options: &SessionOptions,
    ) -> Result<Self, LegacyError> {
        let (child, reader) = stdio::Stdio::spawn(program, args, options.max_message)?;
        let (session, pongs) = Self::assemble(Transport::Stdio(child), Self::core);
        session.start_pongs(pongs);
        let core = session.inner.core.clone();
        session.inner.spawn(reader.run(core));
        Ok(session)
    }

    /// A session to `target` over `transport` (what the era probe found), carrying
    /// `authorization` on the exchanges it makes on its own. Nothing is sent over
    /// Streamable HTTP until the first message; HTTP+SSE waits for its `endpoint`
    /// event; stdio spawns the child.
    pub async fn open(
        target: &super::era::Target,
        transport: LegacyTransport,
        authorization: Option<HeaderValue>,
    ) -> Result<Self, LegacyError> {
        use super::era::Target;
        match (target, transport) {
            (
                Target::Http {
                    client,
                    uri,
                    max_message,
                },
                LegacyTransport::StreamableHttp | LegacyTransport::HttpSse,
            ) => {
                let options = SessionOptions {
                    authorization,
                    ..SessionOptions::new(*max_message)
                };
                let client = UpstreamClient::clone(client);
                if transport == LegacyTransport::HttpSse {
                    Self::http_sse(client, uri.clone(), options).await
                } else {
                    Ok(Self::streamable_http(client, uri.clone(), options))
                }
            }
            (
                Target::Stdio {
                    program,
                    args,
                    max_message,
                },
                LegacyTransport::Stdio,
            ) => Self::stdio(program, args, &SessionOptions::new(*max_message)),
            _ => Err(LegacyError::closed(format!(
                "a {} session cannot reach this upstream",
                transport.as_str()
            ))),
        }
    }

    /// Which transport this session speaks.
    pub fn transport(&self) -> LegacyTransport {
        match &self.inner.transport {
            Transport::Streamable(_) => LegacyTransport::StreamableHttp,
            Transport::Sse(_) => LegacyTransport::HttpSse,
            Transport::Stdio(_) => LegacyTransport::Stdio,
        }
    }

    /// The upstream's name for this session: the `Mcp-Session-Id` it assigned
    /// (Streamable HTTP), the endpoint it named (HTTP+SSE); none over stdio.
    pub fn upstream_session_id(&self) -> Option<String> {
        match &self.inner.transport {
            Transport::Streamable(t) => t.session_id(),
            Transport::Sse(t) => Some(t.endpoint().to_string()),
            Transport::Stdio(_) => None,
        }
    }

    /// Whether the session still lives (not closed, not expired, transport up).
    pub fn is_alive(&self) -> bool {
        self.inner.core.is_alive()
    }

    /// Sends one message (a request, a notification, or a reply to the server's
    /// request) with the headers of the host request that caused it. Whatever the
    /// server says back arrives on [`LegacySession::recv`]. `Err(Expired)`: the
    /// upstream answered 404; open a new session.
    pub async fn send(
        &self,
        message: &Message,
        on_behalf: OnBehalf<'_>,
    ) -> Result<(), LegacyError> {
        self.inner.send(message, on_behalf).await
    }

    /// The next message the server sent, waiting for one; `None` once the session
    /// ended and everything before was taken. The server's stream is read only as
    /// fast as this is called.
    pub async fn recv(&self) -> Option<Item> {
        self.recv_attributed().await.map(|(_, item)| item)
    }

    /// [`LegacySession::recv`], with the legacy request whose response stream carried
    /// the message, when one did ([`Attributed`]).
    pub async fn recv_attributed(&self) -> Option<Attributed> {
        self.inbound.lock().await.recv().await
    }

    /// Sends a `ping` (basic/utilities/ping.mdx) and waits for its answer. A ping that
    /// goes unanswered within `timeout`, or any failure, means the session is not
    /// usable.
    pub async fn ping(&self, timeout: Duration) -> Result<(), LegacyError> {
        let n = self.next_ping.fetch_add(1, Ordering::Relaxed);
        let id = format!("{PING_PREFIX}{n}");
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut pings) = self.inner.core.pings.lock() else {
                return Err(LegacyError::closed("poisoned"));
            };
            if pings.len() >= MAX_PINGS {
                return Err(LegacyError::PingTimeout(timeout));
            }
            pings.insert(id.clone(), tx);
        }
        let request = Message::Request(Request {
            id: RequestId::String(id.clone()),
            method: "ping".into(),
            params: None,
        });
        let outcome = match self.send(&request, OnBehalf::default()).await {
            Err(e) => Err(e),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(LegacyError::closed("the session ended during a ping")),
                Err(_) => Err(LegacyError::PingTimeout(timeout)),
            },
        };
        if let Ok(mut pings) = self.inner.core.pings.lock() {
            pings.remove(&id);
        }
        outcome
    }

    /// Ends the session: Streamable HTTP sends `DELETE` with its `Mcp-Session-Id`
    /// (2025-11-25 transports, "Session Management"), HTTP+SSE closes its stream,
    /// stdio closes the child's stdin and ends it. Bounded by a timeout.
    pub async fn close(&self) {
        self.inner.core.closed.store(true, Ordering::Relaxed);
        match &self.inner.transport {
            Transport::Streamable(t) => t.close().await,
            Transport::Sse(_) => {}
            Transport::Stdio(t) => t.close().await,
        }
        if let Ok(tasks) = self.inner.tasks.lock() {
            for t in tasks.iter() {
                t.abort();
            }
        }
    }
}

/// A JSON-RPC body read whole (bounded), as one message.
fn parse_one(bytes: &[u8]) -> Result<Message, LegacyError> {
    jsonrpc::parse(bytes).map_err(|e| LegacyError::protocol(e.to_string()))
}

/// An SSE response body read frame by frame: the next frame only once every event of
/// the last one was taken (what keeps a slow consumer's backpressure on the upstream).
struct SseBody {
    body: hyper::body::Incoming,
    decoder: crate::sse::Decoder,
    ready: std::collections::VecDeque<crate::sse::Event>,
}

impl SseBody {
    fn new(body: hyper::body::Incoming, max_message: usize) -> Self {
        Self {
            body,
            decoder: crate::sse::Decoder::new(max_message),
            ready: std::collections::VecDeque::new(),
        }
    }

    /// The id of the body's last event that named one (a priming event's too): where
    /// a resumed stream starts. Read at the end of the body, it names the last event
    /// handed out.
    fn last_event_id(&self) -> Option<&str> {
        self.decoder.last_event_id()
    }

    /// The reconnection time the body's server asked for (`retry:`).
    fn retry(&self) -> Option<Duration> {
        self.decoder.retry_ms().map(Duration::from_millis)
    }

    /// The next event; `None` at the end of the body.
    async fn next(&mut self) -> Option<Result<crate::sse::Event, LegacyError>> {
        use http_body_util::BodyExt;
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return Some(Ok(ev));
            }
            match self.body.frame().await? {
                Err(e) => {
                    return Some(Err(LegacyError::Upstream(UpstreamError::Unreachable {
                        detail: e.to_string(),
                    })))
                }
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        match self.decoder.feed(data) {
                            Ok(events) => self.ready.extend(events),
                            Err(e) => return Some(Err(LegacyError::protocol(e.to_string()))),
                        }
                    }
                }
            }
        }
    }
}

/// Feeds the `message` events of an SSE body to the consumer; `on_message` sees each
/// message first and says whether the body has nothing more to carry once it is
/// delivered (a resumed stream's response). `on` is the legacy request whose response
/// the body is (`None`: a stream of the whole session). Returns how the body ended:
/// `Ok` at its end (or after the message `on_message` called the last), `Err` when it
/// broke or the consumer left (`None`).
async fn pump_events(
    body: &mut SseBody,
    core: &Core,
    on: Option<&RequestId>,
    mut on_message: impl FnMut(&Message) -> bool,
) -> Result<(), Option<LegacyError>> {
    while let Some(ev) = body.next().await {
        let ev = ev.map_err(Some)?;
        if ev.data.trim().is_empty() || !(ev.event.is_empty() || ev.event == "message") {
            continue;
        }
        let message = match parse_one(ev.data.as_bytes()) {
            Ok(m) => m,
            Err(e) => return Err(Some(e)),
        };
        let last = on_message(&message);
        if !core.deliver_on(on.cloned(), message).await {
            return Err(None);
        }
        if last {
            return Ok(());
        }
    }
    Ok(())
}
