//! The soak run: legacy sessions on every wire doing real flows while a chaos loop
//! breaks things around them, then checks that nothing was lost, nothing deleted
//! without consent, nothing left unanswered, and that the gateway gave back what it
//! took. A program, not a timed test; loopback only; stops by itself.
//!
//! ```sh
//! cargo run --release --example soak -- --secs 120
//! cargo run --release --example soak -- --secs 30 --sessions 20 --seed 7
//! cargo run --release --example soak -- --secs 60 --session-store redis://127.0.0.1:6379/0
//! ```
//!
//! Topology (all on 127.0.0.1, ports picked at run time, a throw-away demo workspace
//! under the system temp folder):
//!
//! ```text
//!  Streamable HTTP, HTTP+SSE, WebSocket ─► gateway A ─ HTTP ─► dualera serve (restarted by the chaos loop)
//!  Streamable HTTP, WebSocket ───────────► gateway B ─ stdio ─► dualera serve --stdio (child killed by the chaos loop)
//!  stdio hosts ─► dualera gateway --stdio (one per session) ─ HTTP ─► the same dualera serve
//! ```
//!
//! Every server shares one SQLite store and one `requestState` key. Each session loops
//! over two flows: `notes_create` then `notes_delete` with a form elicitation (the host
//! accepts with or without `confirm`, declines, cancels, fails the live request, answers
//! only after cancelling its request — a late reply —, or drops its connection
//! mid-round and resumes with `Last-Event-ID`, or not), and `summarize_repo` with two
//! sampling rounds. Meanwhile the chaos loop restarts the HTTP upstream, kills the stdio
//! upstream's child, and opens bursts of half-open connections (request headers never
//! finished), each held until the gateway's header read timeout closes it, of
//! trickling bodies (a head announcing 4 MB, then a byte every 2 s), each held until
//! the gateway's body deadline closes it, and of requests with a 3.9 MB id whose
//! answer is left unread for 5 s (refused with 400 when finally read).
//!
//! At the end it prints and checks: every note deleted had an accepted confirmation and
//! every note with none is still there (read from the store itself); every request a
//! host kept waiting for was answered; every half-open connection was closed by the
//! gateway (waited for, bounded, before measuring); the gateways' open fds came back
//! within 10 % of their baseline after the sessions and the half-open connections
//! closed (the baseline is taken after a warm-up round on every session with two
//! half-open bursts); their RSS stopped growing (the largest RSS of the soak's last
//! third within 10 % of the largest before it); no process panicked. Exit status 1
//! when a check fails.
//!
//! RSS is not required to return to the baseline: glibc's allocator keeps the pages
//! of freed connection and session buffers in its arenas (fragmented, so not trimmed
//! back), and the soak cannot tell those from live memory from the outside. Attached
//! with gdb after a run, `malloc_trim(0)` brings both gateways below their warmed
//! baseline (README, soak section): retention, not a leak. A leak grows with the
//! traffic; the plateau check fails on that. RSS against the baseline is printed.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as Ws;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const LEGACY: &str = "2025-11-25";
/// How long a host waits for the answer to one request before counting it unanswered.
const ANSWER_WAIT: Duration = Duration::from_secs(60);
/// How long the gateways get to give back memory and fds after the sessions close.
const SETTLE_WAIT: Duration = Duration::from_secs(100);
/// The gateways' header read timeout (written to their config).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a half-open connection may stay open before it counts as not closed by
/// the gateway: the listener's head deadline runs from the accept, so a connection
/// that never finishes its head is cut one header timeout after it was accepted; the
/// rest is margin for a loaded machine.
const HALF_OPEN_WAIT: Duration = Duration::from_secs(30);
/// The window of the RSS series printed at the end.
const RSS_WINDOW: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------
// Options, randomness
// ---------------------------------------------------------------------------------

struct Opts {
    secs: u64,
    sessions: usize,
    seed: u64,
    no_build: bool,
    /// Half-open connections per burst and gateway (0: none).
    half_open: usize,
    /// Where gateways A and B keep their Streamable HTTP sessions (`--session-store`:
    /// a `redis://` URL; default: in memory).
    session_store: Option<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 120,
        sessions: 50,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        no_build: false,
        half_open: 100,
        session_store: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--secs" => o.secs = val().parse().unwrap_or_else(|_| usage()),
            "--sessions" => o.sessions = val().parse().unwrap_or_else(|_| usage()),
            "--seed" => o.seed = val().parse().unwrap_or_else(|_| usage()),
            "--no-build" => o.no_build = true,
            "--half-open" => o.half_open = val().parse().unwrap_or_else(|_| usage()),
            "--session-store" => o.session_store = Some(val()),
            _ => usage(),
        }
    }
    o.sessions = o.sessions.max(4);
    o
}

fn usage() -> ! {
    eprintln!("usage: soak [--secs 120] [--sessions 50] [--seed N] [--half-open 100] [--session-store redis://HOST:PORT/DB] [--no-build]");
    std::process::exit(2)
}

/// A small deterministic generator (xorshift64*), one per task, seeded from `--seed`.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        Self((seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------

struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(bin: &Path, args: &[&str], log: &Path, marker: &str) -> Res<(Self, String)> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let start = file.metadata()?.len() as usize;
        let child = Command::new(bin)
            .args(args)
            .env("DUALERA_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()?;
        let p = Self { child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(line) = text
                .get(start..)
                .unwrap_or("")
                .lines()
                .find(|l| l.contains(marker))
            {
                let url = line
                    .split_whitespace()
                    .last()
                    .unwrap_or_default()
                    .to_owned();
                return Ok((p, url));
            }
            if Instant::now() > deadline {
                return Err(format!("{bin:?} {args:?} did not print {marker:?}").into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn free_port() -> Res<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

// ---------------------------------------------------------------------------------
// The ledger: what hosts did and saw
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consent {
    /// accept + confirm: true reached the gateway while the round was live.
    Accepted,
    /// Anything else: confirm false, decline, cancel, an error, a late answer, none.
    NotGiven,
}

#[derive(Debug)]
struct NoteRecord {
    consent: Consent,
    /// The delete call's result said the note was deleted.
    reported_deleted: bool,
    how: &'static str,
}

#[derive(Default)]
struct Ledger {
    notes: Mutex<HashMap<String, NoteRecord>>,
    sent: AtomicU64,
    answered: AtomicU64,
    cancelled_by_host: AtomicU64,
    abandoned_by_host: AtomicU64,
    unanswered: Mutex<Vec<String>>,
    flows: Mutex<HashMap<(&'static str, &'static str), u64>>,
    failed_calls: Mutex<HashMap<String, u64>>,
    chaos: Mutex<HashMap<&'static str, u64>>,
    late_replies: AtomicU64,
    resumed: AtomicU64,
    half_open: HalfOpen,
    /// Sessions that broke under a host that did nothing wrong (the wire closed, an
    /// HTTP error on a POST): none are expected.
    broken: Mutex<Vec<String>>,
}

/// The half-open connections of the chaos loop: each is held until the gateway
/// closes it (its header read timeout), never let go by the soak itself.
#[derive(Default)]
struct HalfOpen {
    /// Opened and not yet closed by the gateway.
    open: AtomicUsize,
    /// Closed by the gateway.
    closed: AtomicU64,
    /// Still open after [`HALF_OPEN_WAIT`] (then dropped by the soak).
    not_closed: AtomicU64,
    /// The longest a gateway took to close one, in milliseconds.
    slowest_ms: AtomicU64,
    /// Of the closed ones, those that trickled a body (head complete, one body byte
    /// every 2 s) until the gateway's body deadline answered 408 and closed them.
    trickled: AtomicU64,
    /// Requests with a 3.9 MB id whose answer was left unread for 5 s.
    large_sent: AtomicU64,
    /// Of those, answered 400 when finally read (the id is refused, not repeated).
    large_refused: AtomicU64,
}

/// What one connection of a burst does.
#[derive(Debug, Clone, Copy)]
enum Abuse {
    /// Starts a request head and never finishes it.
    HalfHead,
    /// Sends a head announcing 4 MB, then one body byte every 2 s.
    Trickle,
    /// Sends a request with a 3.9 MB id and does not read the answer for 5 s.
    LargeId,
}

impl HalfOpen {
    /// Abuses `s` as `abuse` says; a half head or a trickled body is held until the
    /// gateway closes it, an unread large-id request for 5 s.
    async fn hold(&self, mut s: tokio::net::TcpStream, abuse: Abuse) {
        let opened = Instant::now();
        match abuse {
            Abuse::HalfHead => {
                let _ = s
                    .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
                    .await;
            }
            Abuse::Trickle => {
                let _ = s
                    .write_all(
                        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                          Accept: application/json, text/event-stream\r\nContent-Length: 4000000\r\n\r\n",
                    )
                    .await;
            }
            Abuse::LargeId => return self.unread_large_id(s).await,
        }
        let (mut rd, mut wr) = s.into_split();
        let closed = tokio::time::timeout(HALF_OPEN_WAIT, async {
            let mut buf = [0u8; 1024];
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            tick.tick().await;
            // Whatever the gateway says before closing (a 408, nothing) is read and
            // ignored; end of stream or a reset is the close.
            loop {
                tokio::select! {
                    r = tokio::io::AsyncReadExt::read(&mut rd, &mut buf) => match r {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    },
                    _ = tick.tick(), if matches!(abuse, Abuse::Trickle) => {
                        let _ = wr.write_all(b" ").await;
                    }
                }
            }
        })
        .await;
        match closed {
            Ok(()) => {
                self.closed.fetch_add(1, Ordering::Relaxed);
                if matches!(abuse, Abuse::Trickle) {
                    self.trickled.fetch_add(1, Ordering::Relaxed);
                }
                let ms = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.slowest_ms.fetch_max(ms, Ordering::Relaxed);
            }
            Err(_) => {
                self.not_closed.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Sends `tools/list` with a 3.9 MB id, leaves the answer unread for 5 s, then reads
    /// its status line and lets go.
    async fn unread_large_id(&self, mut s: tokio::net::TcpStream) {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"tools/list"}}"#,
            "i".repeat(3_900_000)
        );
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.large_sent.fetch_add(1, Ordering::Relaxed);
        let sent = tokio::time::timeout(HALF_OPEN_WAIT, async {
            s.write_all(head.as_bytes()).await?;
            s.write_all(body.as_bytes()).await
        })
        .await;
        if matches!(sent, Ok(Ok(()))) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let mut status = [0u8; 12];
            let read = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::io::AsyncReadExt::read_exact(&mut s, &mut status),
            )
            .await;
            if matches!(read, Ok(Ok(_))) && status.starts_with(b"HTTP/1.1 400") {
                self.large_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Waits (bounded) until no half-open connection is left open.
    async fn drained(&self) -> bool {
        let deadline = Instant::now() + HALF_OPEN_WAIT + Duration::from_secs(5);
        while self.open.load(Ordering::Relaxed) > 0 {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        true
    }
}

impl Ledger {
    fn flow(&self, wire: &'static str, what: &'static str) {
        *self.flows.lock().unwrap().entry((wire, what)).or_default() += 1;
    }
    fn chaos(&self, what: &'static str) {
        *self.chaos.lock().unwrap().entry(what).or_default() += 1;
    }
    fn failed(&self, why: String) {
        *self.failed_calls.lock().unwrap().entry(why).or_default() += 1;
    }
}

// ---------------------------------------------------------------------------------
// Hosts: one per wire, one behaviour
// ---------------------------------------------------------------------------------

/// What a host does with a live request.
#[derive(Debug, Clone)]
enum Act {
    /// Reply with this result.
    Reply(Value),
    /// Reply with a JSON-RPC error.
    Fail,
    /// Cancel its own request, then reply with this result anyway (a late reply).
    Late(Value),
    /// Drop the connection; with `Some`, resume (reply with this result first).
    Drop(Option<Value>),
}

/// How a request ended, as the host saw it.
#[derive(Debug)]
enum Outcome {
    Response(Value),
    /// The host cancelled it (after a late reply).
    Cancelled,
    /// The host gave up on it (dropped without resuming); the session is gone.
    Abandoned,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

fn reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error_reply(id: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "the soak host failed this request"}})
}

fn init_params(name: &str) -> Value {
    json!({"protocolVersion": LEGACY,
        "capabilities": {"elicitation": {"form": {}}, "sampling": {}, "roots": {}},
        "clientInfo": {"name": name, "version": "1.0.0"}})
}

/// Reads SSE events (id, data) from a hyper body.
struct SseBody {
    body: Incoming,
    decoder: dualera::sse::Decoder,
    ready: std::collections::VecDeque<(Option<String>, Value)>,
}

impl SseBody {
    fn new(body: Incoming) -> Self {
        Self {
            body,
            decoder: dualera::sse::Decoder::new(16 * 1024 * 1024),
            ready: Default::default(),
        }
    }

    /// The next message, `None` when the stream ended (or broke).
    async fn next(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                return Some(m);
            }
            let frame = self.body.frame().await?.ok()?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for ev in self.decoder.feed(data).ok()? {
                if ev.data.trim().is_empty() {
                    continue;
                }
                if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                    self.ready.push_back((ev.id, v));
                }
            }
        }
    }
}

/// A legacy Streamable HTTP host.
struct HttpHost {
    url: String,
    client: HttpClient,
    session: Option<String>,
    next_id: u64,
}

impl HttpHost {
    async fn send(
        &self,
        method: Method,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> Res<http::Response<Incoming>> {
        let mut b = Request::builder()
            .method(method)
            .uri(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", LEGACY);
        if let Some(s) = &self.session {
            b = b.header("mcp-session-id", s.as_str());
        }
        for (k, v) in extra {
            b = b.header(*k, *v);
        }
        let bytes = body
            .map(|v| serde_json::to_vec(v).unwrap_or_default())
            .unwrap_or_default();
        let req = b.body(Full::new(Bytes::from(bytes)))?;
        Ok(tokio::time::timeout(ANSWER_WAIT, self.client.request(req)).await??)
    }

    async fn post_ok(&self, msg: &Value) -> Res<StatusCode> {
        let r = self.send(Method::POST, Some(msg), &[]).await?;
        let status = r.status();
        let _ = r.into_body().collect().await;
        Ok(status)
    }

    async fn open(url: &str, client: HttpClient, name: &str) -> Res<Self> {
        let mut h = Self {
            url: url.to_owned(),
            client,
            session: None,
            next_id: 0,
        };
        let r = h
            .send(
                Method::POST,
                Some(&rpc(0, "initialize", init_params(name))),
                &[],
            )
            .await?;
        if r.status() != StatusCode::OK {
            return Err(format!("initialize answered {}", r.status()).into());
        }
        h.session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let _ = r.into_body().collect().await;
        if h.session.is_none() {
            return Err("no session id".into());
        }
        h.post_ok(&notification("notifications/initialized", json!({})))
            .await?;
        Ok(h)
    }

    async fn close(&mut self) {
        if self.session.is_some() {
            if let Ok(r) = self.send(Method::DELETE, None, &[]).await {
                let _ = r.into_body().collect().await;
            }
        }
        self.session = None;
    }

    async fn request(
        &mut self,
        ledger: &Ledger,
        method: &str,
        params: Value,
        act: &mut (dyn FnMut(&Value) -> Act + Send),
    ) -> Res<Outcome> {
        self.next_id += 1;
        let id = json!(self.next_id);
        let r = self
            .send(Method::POST, Some(&rpc(self.next_id, method, params)), &[])
            .await?;
        let status = r.status();
        let is_sse = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            let body = r.into_body().collect().await?.to_bytes();
            let v: Value = serde_json::from_slice(&body)
                .map_err(|e| format!("HTTP {status}, body not JSON: {e}"))?;
            return Ok(Outcome::Response(v));
        }
        let mut stream = SseBody::new(r.into_body());
        let mut last: Option<String> = None;
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .map_err(|_| "no answer in time")?;
            let Some((event_id, m)) = next else {
                // The stream ended without the response: resume from the last id.
                let Some(from) = last.clone() else {
                    return Err("the stream ended before any event".into());
                };
                let r = self
                    .send(Method::GET, None, &[("last-event-id", &from)])
                    .await?;
                if r.status() != StatusCode::OK {
                    return Err(format!("resumption answered {}", r.status()).into());
                }
                ledger.resumed.fetch_add(1, Ordering::Relaxed);
                stream = SseBody::new(r.into_body());
                continue;
            };
            if event_id.is_some() {
                last = event_id;
            }
            if m.get("method").is_none() {
                if m["id"] == id {
                    return Ok(Outcome::Response(m));
                }
                continue;
            }
            let Some(live) = m.get("id").cloned() else {
                continue; // notifications (cancelled, progress, log)
            };
            match act(&m) {
                Act::Reply(result) => {
                    self.post_ok(&reply(&live, result)).await?;
                }
                Act::Fail => {
                    self.post_ok(&error_reply(&live)).await?;
                }
                Act::Late(result) => {
                    self.post_ok(&notification(
                        "notifications/cancelled",
                        json!({"requestId": id, "reason": "the user stopped it"}),
                    ))
                    .await?;
                    let st = self.post_ok(&reply(&live, result)).await?;
                    if st != StatusCode::ACCEPTED {
                        return Err(format!("a late reply was answered {st}").into());
                    }
                    ledger.late_replies.fetch_add(1, Ordering::Relaxed);
                    return Ok(Outcome::Cancelled);
                }
                Act::Drop(resume) => {
                    drop(stream);
                    let Some(result) = resume else {
                        self.close().await;
                        return Ok(Outcome::Abandoned);
                    };
                    self.post_ok(&reply(&live, result)).await?;
                    let from = last.clone().ok_or("no event id to resume from")?;
                    let r = self
                        .send(Method::GET, None, &[("last-event-id", &from)])
                        .await?;
                    if r.status() != StatusCode::OK {
                        return Err(format!("resumption answered {}", r.status()).into());
                    }
                    ledger.resumed.fetch_add(1, Ordering::Relaxed);
                    stream = SseBody::new(r.into_body());
                }
            }
        }
    }
}

/// The single-channel wires: every message of the session on one duplex channel.
enum Pipe {
    Sse {
        post_url: String,
        client: HttpClient,
        rx: mpsc::Receiver<Value>,
        task: tokio::task::JoinHandle<()>,
    },
    Ws {
        ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    },
    Stdio {
        child: tokio::process::Child,
        stdin: tokio::process::ChildStdin,
        lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    },
}

struct PipeHost {
    pipe: Pipe,
    next_id: u64,
}

impl PipeHost {
    async fn open_sse(base: &str, client: HttpClient, name: &str) -> Res<Self> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(format!("{base}/sse"))
            .header("accept", "text/event-stream")
            .body(Full::new(Bytes::new()))?;
        let r = tokio::time::timeout(ANSWER_WAIT, client.request(req)).await??;
        if r.status() != StatusCode::OK {
            return Err(format!("GET /sse answered {}", r.status()).into());
        }
        let mut body = r.into_body();
        let mut decoder = dualera::sse::Decoder::new(16 * 1024 * 1024);
        let mut endpoint = None;
        let mut early = Vec::new();
        while endpoint.is_none() {
            let frame = body.frame().await.ok_or("the SSE stream ended")??;
            if let Some(data) = frame.data_ref() {
                for ev in decoder.feed(data)? {
                    if ev.event == "endpoint" {
                        endpoint = Some(ev.data);
                    } else if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                        early.push(v);
                    }
                }
            }
        }
        let (tx, rx) = mpsc::channel(256);
        let task = tokio::spawn(async move {
            for v in early {
                let _ = tx.send(v).await;
            }
            while let Some(Ok(frame)) = body.frame().await {
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let Ok(events) = decoder.feed(data) else {
                    break;
                };
                for ev in events {
                    if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                        if tx.send(v).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut h = Self {
            pipe: Pipe::Sse {
                post_url: format!("{base}{}", endpoint.unwrap_or_default()),
                client,
                rx,
                task,
            },
            next_id: 0,
        };
        h.initialize(name).await?;
        Ok(h)
    }

    async fn open_ws(addr: SocketAddr, name: &str) -> Res<Self> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), tcp).await?;
        let mut h = Self {
            pipe: Pipe::Ws { ws },
            next_id: 0,
        };
        h.initialize(name).await?;
        Ok(h)
    }

    async fn open_stdio(
        bin: &Path,
        upstream: &str,
        config: &Path,
        log: &Path,
        name: &str,
    ) -> Res<Self> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut child = tokio::process::Command::new(bin)
            .args(["gateway", "--stdio", "--upstream", upstream, "--config"])
            .arg(config)
            .env("DUALERA_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let mut h = Self {
            pipe: Pipe::Stdio {
                child,
                stdin,
                lines,
            },
            next_id: 0,
        };
        h.initialize(name).await?;
        Ok(h)
    }

    async fn send(&mut self, v: &Value) -> Res<()> {
        match &mut self.pipe {
            Pipe::Sse {
                post_url, client, ..
            } => {
                let req = Request::builder()
                    .method(Method::POST)
                    .uri(post_url.as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(serde_json::to_vec(v)?)))?;
                let r = tokio::time::timeout(ANSWER_WAIT, client.request(req)).await??;
                let status = r.status();
                let _ = r.into_body().collect().await;
                if status != StatusCode::ACCEPTED {
                    return Err(format!("a message POST was answered {status}").into());
                }
            }
            Pipe::Ws { ws } => ws.send(Ws::Text(v.to_string().into())).await?,
            Pipe::Stdio { stdin, .. } => {
                let mut line = serde_json::to_vec(v)?;
                line.push(b'\n');
                stdin.write_all(&line).await?;
                stdin.flush().await?;
            }
        }
        Ok(())
    }

    async fn recv(&mut self) -> Option<Value> {
        match &mut self.pipe {
            Pipe::Sse { rx, .. } => rx.recv().await,
            Pipe::Ws { ws } => loop {
                match ws.next().await? {
                    Ok(Ws::Text(t)) => return serde_json::from_str(t.as_str()).ok(),
                    Ok(Ws::Close(_)) | Err(_) => return None,
                    Ok(_) => {}
                }
            },
            Pipe::Stdio { lines, .. } => {
                let line = lines.next_line().await.ok()??;
                serde_json::from_str(&line).ok()
            }
        }
    }

    async fn initialize(&mut self, name: &str) -> Res<()> {
        self.send(&rpc(0, "initialize", init_params(name))).await?;
        loop {
            let m = tokio::time::timeout(ANSWER_WAIT, self.recv())
                .await?
                .ok_or("the wire closed during initialize")?;
            if m["id"] == json!(0) {
                if m.get("result").is_none() {
                    return Err(format!("initialize failed: {m}").into());
                }
                break;
            }
        }
        self.send(&notification("notifications/initialized", json!({})))
            .await
    }

    async fn close(&mut self) {
        match &mut self.pipe {
            Pipe::Sse { task, .. } => task.abort(),
            Pipe::Ws { ws } => {
                let _ = ws.close(None).await;
            }
            Pipe::Stdio { child, stdin, .. } => {
                let _ = stdin.shutdown().await;
                let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
                let _ = child.kill().await;
            }
        }
    }

    async fn request(
        &mut self,
        ledger: &Ledger,
        method: &str,
        params: Value,
        act: &mut (dyn FnMut(&Value) -> Act + Send),
    ) -> Res<Outcome> {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.send(&rpc(self.next_id, method, params)).await?;
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        loop {
            let m = tokio::time::timeout_at(deadline, self.recv())
                .await
                .map_err(|_| "no answer in time")?
                .ok_or("the wire closed")?;
            if m.get("method").is_none() {
                if m["id"] == id {
                    return Ok(Outcome::Response(m));
                }
                continue;
            }
            let Some(live) = m.get("id").cloned() else {
                continue;
            };
            match act(&m) {
                Act::Reply(result) => self.send(&reply(&live, result)).await?,
                Act::Fail => self.send(&error_reply(&live)).await?,
                Act::Late(result) => {
                    self.send(&notification(
                        "notifications/cancelled",
                        json!({"requestId": id, "reason": "the user stopped it"}),
                    ))
                    .await?;
                    self.send(&reply(&live, result)).await?;
                    ledger.late_replies.fetch_add(1, Ordering::Relaxed);
                    return Ok(Outcome::Cancelled);
                }
                // Single-channel wires have nothing to resume: dropping ends the session.
                Act::Drop(_) => {
                    self.close().await;
                    return Ok(Outcome::Abandoned);
                }
            }
        }
    }
}

enum Host {
    Http(HttpHost),
    Pipe(PipeHost),
}

impl Host {
    async fn request(
        &mut self,
        ledger: &Ledger,
        method: &str,
        params: Value,
        act: &mut (dyn FnMut(&Value) -> Act + Send),
    ) -> Res<Outcome> {
        match self {
            Self::Http(h) => h.request(ledger, method, params, act).await,
            Self::Pipe(p) => p.request(ledger, method, params, act).await,
        }
    }

    async fn close(&mut self) {
        match self {
            Self::Http(h) => h.close().await,
            Self::Pipe(p) => p.close().await,
        }
    }
}

// ---------------------------------------------------------------------------------
// Sessions and flows
// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    Http,
    Sse,
    WebSocket,
    Stdio,
}

impl Wire {
    fn name(self) -> &'static str {
        match self {
            Self::Http => "streamable-http",
            Self::Sse => "http+sse",
            Self::WebSocket => "websocket",
            Self::Stdio => "stdio",
        }
    }
}

struct Env {
    bin: PathBuf,
    dir: PathBuf,
    gw_config: PathBuf,
    notes_uri: String,
    repo: String,
    /// Gateway A (HTTP upstream) and B (stdio upstream), and the HTTP upstream's URL.
    gateway_a: SocketAddr,
    gateway_b: SocketAddr,
    upstream_url: String,
    client: HttpClient,
}

struct Spec {
    wire: Wire,
    /// Gateway B (stdio upstream) instead of A.
    via_b: bool,
    index: usize,
}

async fn open_host(env: &Env, spec: &Spec, generation: u64) -> Res<Host> {
    let addr = if spec.via_b {
        env.gateway_b
    } else {
        env.gateway_a
    };
    let name = format!("soak-{}-{}-{generation}", spec.wire.name(), spec.index);
    Ok(match spec.wire {
        Wire::Http => Host::Http(
            HttpHost::open(&format!("http://{addr}/mcp"), env.client.clone(), &name).await?,
        ),
        Wire::Sse => Host::Pipe(
            PipeHost::open_sse(&format!("http://{addr}"), env.client.clone(), &name).await?,
        ),
        Wire::WebSocket => Host::Pipe(PipeHost::open_ws(addr, &name).await?),
        Wire::Stdio => Host::Pipe(
            PipeHost::open_stdio(
                &env.bin,
                &env.upstream_url,
                &env.gw_config,
                &env.dir.join("stdio-gateways.log"),
                &name,
            )
            .await?,
        ),
    })
}

fn tool_text(m: &Value) -> (bool, String) {
    let r = &m["result"];
    let text = r["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    (
        m.get("result").is_some() && r["isError"] != json!(true),
        text,
    )
}

/// How this delete's host answers the elicitation.
#[derive(Clone, Copy, Debug)]
enum Choice {
    Confirm,
    NoConfirm,
    Decline,
    Cancel,
    Fail,
    Late,
    DropResume,
    DropAbandon,
}

fn choose(rng: &mut Rng, chaos: bool, wire: Wire) -> Choice {
    if !chaos {
        return Choice::Confirm;
    }
    match rng.below(20) {
        0..=7 => Choice::Confirm,
        8..=9 => Choice::NoConfirm,
        10..=11 => Choice::Decline,
        12 => Choice::Cancel,
        13..=14 => Choice::Fail,
        15..=16 => Choice::Late,
        17..=18 if wire == Wire::Http => Choice::DropResume,
        17..=18 => Choice::Confirm,
        _ if wire == Wire::Stdio => Choice::Confirm,
        _ => Choice::DropAbandon,
    }
}

/// One create + delete flow; returns false when the session is gone.
async fn create_delete(
    host: &mut Host,
    env: &Env,
    ledger: &Ledger,
    spec: &Spec,
    rng: &mut Rng,
    n: u64,
    chaos: bool,
) -> Res<bool> {
    let title = format!("soak {} {} #{n}", spec.wire.name(), spec.index);
    ledger.sent.fetch_add(1, Ordering::Relaxed);
    let created = host
        .request(
            ledger,
            "tools/call",
            json!({"name": "notes_create", "arguments": {
            "workspaceUri": env.notes_uri, "title": title, "body": "written by the soak run"}}),
            &mut |m| Act::Reply(reply_for(m)),
        )
        .await?;
    let Outcome::Response(m) = created else {
        return Ok(false);
    };
    ledger.answered.fetch_add(1, Ordering::Relaxed);
    let (ok, text) = tool_text(&m);
    if !ok {
        ledger.failed(format!("notes_create: {}", short(&text, &m)));
        return Ok(true);
    }
    let choice = choose(rng, chaos, spec.wire);
    let consent = std::sync::Mutex::new(Consent::NotGiven);
    let form = |m: &Value, confirm: bool| -> Value {
        let id = m
            .pointer("/params/requestedSchema/properties/note_id/enum/0")
            .cloned()
            .unwrap_or(Value::Null);
        json!({"action": "accept", "content": {"note_id": id, "confirm": confirm}})
    };
    let mut act = |m: &Value| -> Act {
        match choice {
            Choice::Confirm => {
                *consent.lock().unwrap() = Consent::Accepted;
                Act::Reply(form(m, true))
            }
            Choice::NoConfirm => Act::Reply(form(m, false)),
            Choice::Decline => Act::Reply(json!({"action": "decline"})),
            Choice::Cancel => Act::Reply(json!({"action": "cancel"})),
            Choice::Fail => Act::Fail,
            // Consent sent only after the host cancelled its request: it must not count.
            Choice::Late => Act::Late(form(m, true)),
            Choice::DropResume => {
                *consent.lock().unwrap() = Consent::Accepted;
                Act::Drop(Some(form(m, true)))
            }
            Choice::DropAbandon => Act::Drop(None),
        }
    };
    ledger.sent.fetch_add(1, Ordering::Relaxed);
    let outcome = host
        .request(
            ledger,
            "tools/call",
            json!({"name": "notes_delete", "arguments": {
            "workspaceUri": env.notes_uri, "title": title}}),
            &mut act,
        )
        .await;
    let consent = *consent.lock().unwrap();
    let mut record = NoteRecord {
        consent,
        reported_deleted: false,
        how: choice_name(choice),
    };
    let alive = match outcome {
        Ok(Outcome::Response(m)) => {
            ledger.answered.fetch_add(1, Ordering::Relaxed);
            let (ok, text) = tool_text(&m);
            record.reported_deleted = ok && text.starts_with("Deleted");
            if !ok && !matches!(choice, Choice::Fail) {
                ledger.failed(format!("notes_delete: {}", short(&text, &m)));
            }
            true
        }
        Ok(Outcome::Cancelled) => {
            ledger.cancelled_by_host.fetch_add(1, Ordering::Relaxed);
            true
        }
        Ok(Outcome::Abandoned) => {
            ledger.abandoned_by_host.fetch_add(1, Ordering::Relaxed);
            false
        }
        Err(e) => {
            ledger.notes.lock().unwrap().insert(title, record);
            return Err(e);
        }
    };
    ledger.notes.lock().unwrap().insert(title, record);
    ledger.flow(spec.wire.name(), "create+delete");
    Ok(alive)
}

fn choice_name(c: Choice) -> &'static str {
    match c {
        Choice::Confirm => "accept+confirm",
        Choice::NoConfirm => "accept, confirm false",
        Choice::Decline => "decline",
        Choice::Cancel => "cancel",
        Choice::Fail => "host error",
        Choice::Late => "late accept after cancelling",
        Choice::DropResume => "dropped mid-round, resumed",
        Choice::DropAbandon => "dropped mid-round, abandoned",
    }
}

fn short(text: &str, m: &Value) -> String {
    let s = if text.is_empty() {
        m["error"]["message"].as_str().unwrap_or("?").to_owned()
    } else {
        text.to_owned()
    };
    s.chars().take(70).collect()
}

/// The answer of a well-behaved host to any live request.
fn reply_for(m: &Value) -> Value {
    match m["method"].as_str().unwrap_or_default() {
        "sampling/createMessage" => {
            let prompt = m
                .pointer("/params/messages/0/content/text")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let text = if prompt.contains("JSON array") {
                r#"["README.md", "src/lib.rs"]"#
            } else {
                "tinyledger is a tiny double-entry ledger library (soak summary)."
            };
            json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "soak", "stopReason": "endTurn"})
        }
        "roots/list" => json!({"roots": []}),
        "elicitation/create" => json!({"action": "decline"}),
        _ => json!({}),
    }
}

async fn summarize(
    host: &mut Host,
    env: &Env,
    ledger: &Ledger,
    spec: &Spec,
    rng: &mut Rng,
    chaos: bool,
) -> Res<bool> {
    ledger.sent.fetch_add(1, Ordering::Relaxed);
    let drop_at = if chaos && spec.wire == Wire::Http && rng.below(6) == 0 {
        Some(rng.below(2))
    } else {
        None
    };
    let mut seen = 0u64;
    let outcome = host
        .request(
            ledger,
            "tools/call",
            json!({"name": "summarize_repo", "arguments": {
            "directory": env.repo, "audience": "developer"}}),
            &mut |m| {
                let r = reply_for(m);
                seen += 1;
                if drop_at == Some(seen - 1) {
                    Act::Drop(Some(r))
                } else {
                    Act::Reply(r)
                }
            },
        )
        .await?;
    match outcome {
        Outcome::Response(m) => {
            ledger.answered.fetch_add(1, Ordering::Relaxed);
            let (ok, text) = tool_text(&m);
            if !ok {
                ledger.failed(format!("summarize_repo: {}", short(&text, &m)));
            }
            ledger.flow(spec.wire.name(), "summarize");
            Ok(true)
        }
        Outcome::Cancelled => Ok(true),
        Outcome::Abandoned => Ok(false),
    }
}

/// One session slot: opens a host, runs flows until `until`, reopens when the session
/// is lost, closes at the end. `chaos` off: well-behaved flows only (the warm-up).
async fn session_loop(
    env: Arc<Env>,
    ledger: Arc<Ledger>,
    spec: Spec,
    seed: u64,
    until: Instant,
    chaos: bool,
) {
    let mut rng = Rng::new(seed, spec.index as u64 + if chaos { 1000 } else { 0 });
    let mut generation = 0;
    let mut n = if chaos { 1_000_000 } else { 0 };
    'sessions: while Instant::now() < until {
        generation += 1;
        let mut host = match open_host(&env, &spec, generation).await {
            Ok(h) => h,
            Err(e) => {
                ledger.failed(format!(
                    "open {}: {}",
                    spec.wire.name(),
                    e.to_string().chars().take(60).collect::<String>()
                ));
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        loop {
            n += 1;
            let r = if rng.below(10) < 7 {
                create_delete(&mut host, &env, &ledger, &spec, &mut rng, n, chaos).await
            } else {
                summarize(&mut host, &env, &ledger, &spec, &mut rng, chaos).await
            };
            match r {
                Ok(true) => {}
                Ok(false) => continue 'sessions,
                Err(e) => {
                    let e = e.to_string();
                    if e.contains("no answer in time") {
                        ledger.unanswered.lock().unwrap().push(format!(
                            "{} #{}: {e}",
                            spec.wire.name(),
                            spec.index
                        ));
                    } else {
                        ledger.broken.lock().unwrap().push(format!(
                            "{} #{}: {}",
                            spec.wire.name(),
                            spec.index,
                            e.chars().take(100).collect::<String>()
                        ));
                    }
                    host.close().await;
                    continue 'sessions;
                }
            }
            if Instant::now() >= until {
                host.close().await;
                break 'sessions;
            }
            tokio::time::sleep(Duration::from_millis(rng.below(200))).await;
        }
    }
}

// ---------------------------------------------------------------------------------
// Chaos
// ---------------------------------------------------------------------------------

struct Upstreams {
    bin: PathBuf,
    server_args: Vec<String>,
    server: Mutex<Option<Proc>>,
    server_log: PathBuf,
    gateway_b: u32,
}

impl Upstreams {
    fn restart_http(&self) -> Res<()> {
        if let Some(mut p) = self.server.lock().unwrap().take() {
            p.kill();
        }
        std::thread::sleep(Duration::from_millis(300));
        let args: Vec<&str> = self.server_args.iter().map(String::as_str).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Proc::spawn(
                &self.bin,
                &args,
                &self.server_log,
                "modern server listening on",
            ) {
                Ok((p, _)) => {
                    *self.server.lock().unwrap() = Some(p);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("soak: restarting the HTTP upstream: {e}; again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

async fn chaos_loop(
    ups: Arc<Upstreams>,
    ledger: Arc<Ledger>,
    targets: Vec<SocketAddr>,
    seed: u64,
    until: Instant,
    stop: Arc<AtomicBool>,
    half_open: usize,
) {
    let mut rng = Rng::new(seed, 7777);
    let mut next_restart = Instant::now() + Duration::from_secs(6 + rng.below(6));
    let mut next_kill = Instant::now() + Duration::from_secs(4 + rng.below(6));
    let mut next_half_open = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_restart {
            let u = ups.clone();
            match tokio::task::spawn_blocking(move || u.restart_http()).await {
                Ok(Ok(())) => ledger.chaos("HTTP upstream restarted"),
                _ => ledger.chaos("HTTP upstream restart FAILED"),
            }
            next_restart = Instant::now() + Duration::from_secs(8 + rng.below(8));
        }
        if now >= next_kill {
            let kids = children_of(ups.gateway_b);
            if let Some(pid) = kids.first() {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                ledger.chaos("stdio upstream child killed");
            }
            next_kill = Instant::now() + Duration::from_secs(8 + rng.below(8));
        }
        if now >= next_half_open {
            half_open_burst(&ledger, &targets, half_open).await;
            next_half_open = Instant::now() + Duration::from_secs(6 + rng.below(4));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens `n` half-open connections to each of `targets`, `n / 2` that trickle a body
/// (each held, in its own task, until the gateway closes it) and `n / 10` that leave
/// the answer to a 3.9 MB id unread.
async fn half_open_burst(ledger: &Arc<Ledger>, targets: &[SocketAddr], n: usize) {
    let mix = [
        (Abuse::HalfHead, n, "half-open connections opened"),
        (Abuse::Trickle, n / 2, "trickling bodies opened"),
        (Abuse::LargeId, n / 10, "unread large-id requests opened"),
    ];
    for addr in targets {
        for (abuse, count, what) in mix {
            for _ in 0..count {
                if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
                    ledger.half_open.open.fetch_add(1, Ordering::Relaxed);
                    ledger.chaos(what);
                    let ledger = ledger.clone();
                    tokio::spawn(async move { ledger.half_open.hold(s, abuse).await });
                }
            }
        }
    }
}

/// The warm-up's half-open bursts: the chaos loop's cadence (the first after 2 s,
/// then every 7 s) without its restarts and kills.
async fn warm_half_open(ledger: Arc<Ledger>, targets: Vec<SocketAddr>, n: usize, until: Instant) {
    if n == 0 {
        return;
    }
    let mut next = Instant::now() + Duration::from_secs(2);
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        half_open_burst(&ledger, &targets, n).await;
        next += Duration::from_secs(7);
    }
}

// ---------------------------------------------------------------------------------
// Setup, run, checks
// ---------------------------------------------------------------------------------

fn build(release: bool) -> Res<()> {
    let Ok(cargo) = std::env::var("CARGO") else {
        return Ok(());
    };
    let mut c = Command::new(cargo);
    c.args(["build", "--locked", "--bin", "dualera"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        c.arg("--release");
    }
    if !c.status()?.success() {
        return Err("building dualera failed".into());
    }
    Ok(())
}

fn store_titles(db: &Path) -> Res<HashMap<String, usize>> {
    let con =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    con.busy_timeout(Duration::from_secs(10))?;
    let mut stmt = con.prepare("SELECT title FROM notes")?;
    let mut out = HashMap::new();
    for t in stmt.query_map([], |r| r.get::<_, String>(0))? {
        *out.entry(t?).or_default() += 1;
    }
    Ok(out)
}

fn panics_in(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            for l in text.lines().filter(|l| l.contains("panicked")) {
                found.push(format!("{}: {l}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

struct Usage {
    rss: u64,
    fds: usize,
}

fn usage_of(pid: u32) -> Usage {
    Usage {
        rss: rss_of(pid),
        fds: fds_of(pid),
    }
}

fn within(now: &Usage, base: &Usage) -> bool {
    now.rss as f64 <= base.rss as f64 * 1.10 && fds_within(now, base)
}

fn fds_within(now: &Usage, base: &Usage) -> bool {
    now.fds as f64 <= base.fds as f64 * 1.10
}

/// The largest RSS before the last third of a series of windows and the largest in
/// it (None when there are fewer than three windows to compare). Not the middle third
/// alone: in a short soak that is one window, and one that happens to fall between
/// bursts (B at 67.4, 55.3 and 64.1 MiB in one 40 s run) reads as growth. A leak grows
/// with the traffic, so the last third tops everything before it either way.
fn plateau(series: &[u64]) -> Option<(u64, u64)> {
    let n = series.len();
    if n < 3 {
        return None;
    }
    let before = series[..2 * n / 3].iter().copied().max()?;
    let late = series[2 * n / 3..].iter().copied().max()?;
    Some((before, late))
}

fn specs(n: usize) -> Vec<Spec> {
    // 2/5 Streamable HTTP, 1/5 HTTP+SSE, 1/5 WebSocket, 1/5 stdio; every fourth
    // Streamable HTTP or WebSocket session goes through gateway B (stdio upstream).
    (0..n)
        .map(|index| {
            let wire = match index % 5 {
                0 | 1 => Wire::Http,
                2 => Wire::Sse,
                3 => Wire::WebSocket,
                _ => Wire::Stdio,
            };
            let via_b = matches!(wire, Wire::Http | Wire::WebSocket) && index % 4 == 1;
            Spec { wire, via_b, index }
        })
        .collect()
}

async fn run(o: Opts) -> Res<bool> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target dir")?
        .to_owned();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    if !release {
        eprintln!("soak: WARNING: not a --release build");
    }
    if !o.no_build {
        build(release)?;
    }
    let bin = profile_dir.join("dualera");
    let dir = std::env::temp_dir().join(format!("dualera-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = dualera::demo::ensure(&dir)?;
    let db = dir.join("soak.db");
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| e.to_string())?;
    let secret = dualera::digest::hex(&secret);
    let server_config = dir.join("soak-server.toml");
    std::fs::write(&server_config, format!(
        "[store]\npath = {db:?}\n\n[state]\nttl_ms = 600000\n\n[[state.keys]]\nid = \"soak\"\nsecret = {secret:?}\n\n\
         [[grants]]\nprincipal = \"local\"\nworkspaces = [{:?}]\nrepositories = [{:?}]\n",
        layout.notes_uri, layout.repo_dir.to_string_lossy(), db = db.to_string_lossy()))?;
    let gw_config = dir.join("soak-gateway.toml");
    std::fs::write(
        &gw_config,
        format!(
            "[gateway]\nlive_request_timeout_secs = 60\nkeepalive_secs = 5\n\
             header_read_timeout_secs = {}\nbody_read_timeout_secs = {}\n",
            HEADER_TIMEOUT.as_secs(),
            HEADER_TIMEOUT.as_secs()
        ),
    )?;
    // Gateways A and B: the same settings, and with `--session-store` their Streamable
    // HTTP sessions in Redis, each under a prefix of its own (they front different
    // upstreams). The stdio bridges keep the plain config: they have no HTTP sessions.
    let gateway_config = |name: &str| -> Res<String> {
        let Some(store) = &o.session_store else {
            return Ok(gw_config.to_string_lossy().into_owned());
        };
        let path = dir.join(format!("soak-gateway-{name}.toml"));
        let base = std::fs::read_to_string(&gw_config)?;
        std::fs::write(
            &path,
            format!(
                "{base}session_store = {store:?}\nsession_key_prefix = \"soak-{}-{name}:\"\n",
                std::process::id()
            ),
        )?;
        Ok(path.to_string_lossy().into_owned())
    };
    let port = free_port()?;
    let server_args: Vec<String> = [
        "serve",
        "--config",
        &server_config.to_string_lossy(),
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let sargs: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let server_log = dir.join("server-http.log");
    let (server, upstream_url) =
        Proc::spawn(&bin, &sargs, &server_log, "modern server listening on")?;
    let gwc = gateway_config("a")?;
    let (gateway_a, url_a) = Proc::spawn(
        &bin,
        &[
            "gateway",
            "--upstream",
            &upstream_url,
            "--config",
            &gwc,
            "--listen",
            "127.0.0.1:0",
        ],
        &dir.join("gateway-a.log"),
        "gateway listening on",
    )?;
    let cmd = format!(
        "{} serve --stdio --config {}",
        bin.display(),
        server_config.display()
    );
    let gwc = gateway_config("b")?;
    let (gateway_b, url_b) = Proc::spawn(
        &bin,
        &[
            "gateway",
            "--upstream-cmd",
            &cmd,
            "--config",
            &gwc,
            "--listen",
            "127.0.0.1:0",
        ],
        &dir.join("gateway-b.log"),
        "gateway listening on",
    )?;
    let addr = |u: &str| -> Res<SocketAddr> {
        Ok(u.trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .parse()?)
    };
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(8)
        .build(HttpConnector::new());
    let env = Arc::new(Env {
        bin: bin.clone(),
        dir: dir.clone(),
        gw_config: gw_config.clone(),
        notes_uri: layout.notes_uri.clone(),
        repo: layout.repo_dir.to_string_lossy().into_owned(),
        gateway_a: addr(&url_a)?,
        gateway_b: addr(&url_b)?,
        upstream_url: upstream_url.clone(),
        client,
    });
    let seeded = store_titles(&db)?;
    println!(
        "soak: seed {}, {} sessions, {} s, dir {}",
        o.seed,
        o.sessions,
        o.secs,
        dir.display()
    );

    // Warm-up: the same sessions and flows, for a tenth of the run (at least 10 s),
    // with the chaos loop's half-open bursts but not its restarts and kills; then
    // every session closed and every half-open connection closed by the gateways: the
    // baseline is a gateway that carried this load once (runtime threads, allocator
    // arenas, pooled connections), so what stays above it after the soak is what the
    // soak's repetitions left behind. (glibc's allocator keeps the pages of freed
    // connection buffers in its arenas: a gateway that held two bursts of half-open
    // connections stays several MiB above one that never did, and returns them when
    // `malloc_trim` is called — retention, not a leak; what must not happen is growth
    // with every further burst.)
    let cold_a = usage_of(gateway_a.pid());
    let cold_b = usage_of(gateway_b.pid());
    let warm = Arc::new(Ledger::default());
    let mut tasks = Vec::new();
    let warm_until = Instant::now() + Duration::from_secs((o.secs / 10).max(10));
    let warm_bursts = tokio::spawn(warm_half_open(
        warm.clone(),
        vec![env.gateway_a, env.gateway_b],
        o.half_open,
        warm_until,
    ));
    for spec in specs(o.sessions) {
        tasks.push(tokio::spawn(session_loop(
            env.clone(),
            warm.clone(),
            spec,
            o.seed,
            warm_until,
            false,
        )));
    }
    for t in tasks {
        let _ = t.await;
    }
    let _ = warm_bursts.await;
    let warm_half_open_gone = warm.half_open.drained().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let base_a = usage_of(gateway_a.pid());
    let base_b = usage_of(gateway_b.pid());
    println!(
        "soak: cold gateway A {:.1} MiB / {} fds, gateway B {:.1} MiB / {} fds",
        mib(cold_a.rss),
        cold_a.fds,
        mib(cold_b.rss),
        cold_b.fds
    );
    println!("soak: warm-up done ({} flows, {} half-open connections closed by the gateways); baseline gateway A {:.1} MiB / {} fds, gateway B {:.1} MiB / {} fds",
        warm.flows.lock().unwrap().values().sum::<u64>(), warm.half_open.closed.load(Ordering::Relaxed), mib(base_a.rss), base_a.fds, mib(base_b.rss), base_b.fds);

    // The soak.
    let ledger = Arc::new(Ledger::default());
    let ups = Arc::new(Upstreams {
        bin: bin.clone(),
        server_args,
        server: Mutex::new(Some(server)),
        server_log,
        gateway_b: gateway_b.pid(),
    });
    let until = Instant::now() + Duration::from_secs(o.secs);
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = tokio::spawn(chaos_loop(
        ups.clone(),
        ledger.clone(),
        vec![env.gateway_a, env.gateway_b],
        o.seed,
        until,
        stop.clone(),
        o.half_open,
    ));
    let mut tasks = Vec::new();
    for spec in specs(o.sessions) {
        tasks.push(tokio::spawn(session_loop(
            env.clone(),
            ledger.clone(),
            spec,
            o.seed,
            until,
            true,
        )));
    }
    let sampler = {
        let (a, b) = (gateway_a.pid(), gateway_b.pid());
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = (0u64, 0usize, 0u64, 0usize);
            // The largest RSS of each gateway in every RSS_WINDOW: growth with every
            // burst would show as a rising series, retention as a plateau.
            let mut windows: Vec<(u64, u64)> = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let (ua, ub) = (usage_of(a), usage_of(b));
                peak = (
                    peak.0.max(ua.rss),
                    peak.1.max(ua.fds),
                    peak.2.max(ub.rss),
                    peak.3.max(ub.fds),
                );
                let w = (started.elapsed().as_secs() / RSS_WINDOW.as_secs()) as usize;
                if windows.len() <= w {
                    windows.resize(w + 1, (0, 0));
                }
                windows[w] = (windows[w].0.max(ua.rss), windows[w].1.max(ub.rss));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (peak, windows)
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = chaos.await;
    let (peak, windows) = sampler.await.unwrap_or_default();
    let plateau_a = plateau(&windows.iter().map(|w| w.0).collect::<Vec<_>>());
    let plateau_b = plateau(&windows.iter().map(|w| w.1).collect::<Vec<_>>());
    // The HTTP upstream may be down from the last restart: bring it up for the checks.
    if ups.server.lock().unwrap().is_none() {
        let u = ups.clone();
        let _ = tokio::task::spawn_blocking(move || u.restart_http()).await;
    }

    // The half-open connections are closed by the gateways' header timeout, not by
    // the soak: wait for the last of them before measuring.
    let half_open_start = Instant::now();
    let half_open_gone = ledger.half_open.drained().await;
    let half_open_wait = half_open_start.elapsed();

    // Give back: every session is closed now.
    let settle_start = Instant::now();
    let (mut end_a, mut end_b);
    loop {
        end_a = usage_of(gateway_a.pid());
        end_b = usage_of(gateway_b.pid());
        if (within(&end_a, &base_a) && within(&end_b, &base_b))
            || settle_start.elapsed() > SETTLE_WAIT
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled_in = settle_start.elapsed();

    // Checks.
    let titles = store_titles(&db)?;
    let notes = ledger.notes.lock().unwrap();
    let mut deleted_without_consent = Vec::new();
    let mut reported_but_present = Vec::new();
    let mut duplicated = Vec::new();
    let mut deleted = 0;
    let mut kept_with_consent = 0;
    for (title, rec) in notes.iter() {
        let present = titles.get(title).copied().unwrap_or(0);
        if present > 1 {
            duplicated.push(title.clone());
        }
        if present == 0 {
            deleted += 1;
            if rec.consent != Consent::Accepted {
                deleted_without_consent.push(format!("{title} ({})", rec.how));
            }
        } else if rec.reported_deleted {
            reported_but_present.push(title.clone());
        } else if rec.consent == Consent::Accepted {
            kept_with_consent += 1;
        }
    }
    let seeded_lost: Vec<_> = seeded
        .iter()
        .filter(|(t, n)| titles.get(*t).copied().unwrap_or(0) < **n)
        .map(|(t, _)| t.clone())
        .collect();
    let unanswered = ledger.unanswered.lock().unwrap().clone();
    let broken = ledger.broken.lock().unwrap().clone();
    let panics = panics_in(&dir);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Soak run: {} s, {} sessions, seed {}\n",
        o.secs, o.sessions, o.seed
    );
    let _ = writeln!(
        out,
        "| wire | create+delete flows | summarize flows |\n|---|---|---|"
    );
    for w in [Wire::Http, Wire::Sse, Wire::WebSocket, Wire::Stdio] {
        let f = ledger.flows.lock().unwrap();
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            w.name(),
            f.get(&(w.name(), "create+delete")).unwrap_or(&0),
            f.get(&(w.name(), "summarize")).unwrap_or(&0)
        );
    }
    let _ = writeln!(out, "\nchaos:");
    for (k, v) in ledger.chaos.lock().unwrap().iter() {
        let _ = writeln!(out, "  {k}: {v}");
    }
    let ho = &ledger.half_open;
    let _ = writeln!(
        out,
        "half-open connections: {} closed by the gateways' header or body timeout ({} s; {} of them trickling a body), the slowest after {:.1} s; {} not closed within {} s; the last gone {:.1} s after the sessions ended",
        ho.closed.load(Ordering::Relaxed),
        HEADER_TIMEOUT.as_secs(),
        ho.trickled.load(Ordering::Relaxed),
        ho.slowest_ms.load(Ordering::Relaxed) as f64 / 1000.0,
        ho.not_closed.load(Ordering::Relaxed),
        HALF_OPEN_WAIT.as_secs(),
        half_open_wait.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "unread large-id requests: {} sent, {} answered 400 when read 5 s later",
        ho.large_sent.load(Ordering::Relaxed),
        ho.large_refused.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "hosts: {} requests sent, {} answered, {} cancelled by the host after a late reply ({} late replies), {} abandoned by the host (dropped, not resumed), {} streams resumed with Last-Event-ID",
        ledger.sent.load(Ordering::Relaxed), ledger.answered.load(Ordering::Relaxed), ledger.cancelled_by_host.load(Ordering::Relaxed),
        ledger.late_replies.load(Ordering::Relaxed), ledger.abandoned_by_host.load(Ordering::Relaxed), ledger.resumed.load(Ordering::Relaxed));
    let failed = ledger.failed_calls.lock().unwrap();
    let _ = writeln!(
        out,
        "requests that failed (answered with an error, mostly while an upstream was down): {}",
        failed.values().sum::<u64>()
    );
    let mut failed: Vec<_> = failed.iter().collect();
    failed.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in failed.iter().take(8) {
        let _ = writeln!(out, "  {n} × {why}");
    }
    let _ = writeln!(out, "notes: {} created and put up for deletion, {} deleted, {} kept although confirmed (the call failed before the delete)", notes.len(), deleted, kept_with_consent);
    let _ = writeln!(
        out,
        "gateway A (HTTP upstream): cold {:.1} MiB / {} fds",
        mib(cold_a.rss),
        cold_a.fds
    );
    let _ = writeln!(
        out,
        "  warmed baseline {:.1} MiB / {} fds, peak {:.1} MiB / {} fds, after {:.1} MiB / {} fds",
        mib(base_a.rss),
        base_a.fds,
        mib(peak.0),
        peak.1,
        mib(end_a.rss),
        end_a.fds
    );
    let _ = writeln!(
        out,
        "gateway B (stdio upstream): cold {:.1} MiB / {} fds",
        mib(cold_b.rss),
        cold_b.fds
    );
    let _ = writeln!(out, "  warmed baseline {:.1} MiB / {} fds, peak {:.1} MiB / {} fds, after {:.1} MiB / {} fds (settled in {:.0} s)",
        mib(base_b.rss), base_b.fds, mib(peak.2), peak.3, mib(end_b.rss), end_b.fds, settled_in.as_secs_f64());
    let series = |pick: fn(&(u64, u64)) -> u64| {
        windows
            .iter()
            .map(|w| format!("{:.1}", mib(pick(w))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        out,
        "RSS during the soak, largest per {} s (MiB): gateway A {}; gateway B {}",
        RSS_WINDOW.as_secs(),
        series(|w| w.0),
        series(|w| w.1)
    );
    let checks = [
        (
            "every deleted note had an accepted confirmation",
            deleted_without_consent.is_empty(),
            format!("{deleted_without_consent:?}"),
        ),
        (
            "every note reported deleted is gone, none twice",
            reported_but_present.is_empty() && duplicated.is_empty(),
            format!("{reported_but_present:?} {duplicated:?}"),
        ),
        (
            "the seeded notes are untouched",
            seeded_lost.is_empty(),
            format!("{seeded_lost:?}"),
        ),
        (
            "no request left unanswered",
            unanswered.is_empty(),
            format!("{unanswered:?}"),
        ),
        (
            "no session broken under a well-behaved host",
            broken.is_empty(),
            format!("{broken:?}"),
        ),
        (
            "every unread large-id request refused (400)",
            ho.large_refused.load(Ordering::Relaxed) == ho.large_sent.load(Ordering::Relaxed),
            format!(
                "{} of {} refused",
                ho.large_refused.load(Ordering::Relaxed),
                ho.large_sent.load(Ordering::Relaxed)
            ),
        ),
        (
            "every half-open connection closed by the header or body timeout",
            warm_half_open_gone
                && half_open_gone
                && ho.not_closed.load(Ordering::Relaxed) == 0
                && warm.half_open.not_closed.load(Ordering::Relaxed) == 0,
            format!(
                "{} still open, {} not closed in time ({} and {} in the warm-up)",
                ho.open.load(Ordering::Relaxed),
                ho.not_closed.load(Ordering::Relaxed),
                warm.half_open.open.load(Ordering::Relaxed),
                warm.half_open.not_closed.load(Ordering::Relaxed)
            ),
        ),
        (
            "gateway fds back within 10 % of baseline",
            fds_within(&end_a, &base_a) && fds_within(&end_b, &base_b),
            format!(
                "A {} → {}, B {} → {}",
                base_a.fds, end_a.fds, base_b.fds, end_b.fds
            ),
        ),
        (
            "gateway RSS stops growing (last third of the soak within 10 % of the largest before it)",
            [plateau_a, plateau_b].iter().all(|p| {
                p.is_some_and(|(before, late)| late as f64 <= before as f64 * 1.10)
            }),
            format!("{plateau_a:?} {plateau_b:?} (needs --secs 60 or more)"),
        ),
        (
            "no panic in any log",
            panics.is_empty(),
            format!("{panics:?}"),
        ),
        (
            "every wire ran flows",
            [Wire::Http, Wire::Sse, Wire::WebSocket, Wire::Stdio]
                .iter()
                .all(|w| {
                    ledger
                        .flows
                        .lock()
                        .unwrap()
                        .keys()
                        .any(|(n, _)| *n == w.name())
                }),
            String::new(),
        ),
    ];
    let _ = writeln!(out, "\nchecks:");
    let mut ok = true;
    for (what, pass, detail) in &checks {
        ok &= *pass;
        let _ = writeln!(
            out,
            "  {} {what}{}",
            if *pass { "PASS" } else { "FAIL" },
            if *pass || detail.is_empty() {
                String::new()
            } else {
                format!(": {}", detail.chars().take(600).collect::<String>())
            }
        );
    }
    let _ = writeln!(
        out,
        "\nsoak: {}",
        if ok { "all checks passed" } else { "FAILED" }
    );
    print!("{out}");
    drop(notes);
    drop(gateway_a);
    drop(gateway_b);
    ups.server.lock().unwrap().take();
    if ok {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("soak: logs kept in {}", dir.display());
    }
    Ok(ok)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() -> std::process::ExitCode {
    let o = opts();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soak: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(o)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
