//! Backpressure end to end (issue 24, point 3): a host that reads slowly gets every
//! upstream message, in order, and the gateway's memory stays bounded meanwhile.
//!
//! One test per wire. In each, the upstream is a real server process, the conformance
//! fixture (`examples/conformance_upstream.rs`, built once by this file with `cargo
//! build --example`), whose `flood` tool streams [`COUNT`] numbered
//! `notifications/progress` then its result, and whose `flood_changes` tool announces
//! [`COUNT`] numbered `notifications/resources/list_changed` to the `subscriptions/listen`
//! stream then one `notifications/tools/list_changed` (the GET stream's "result").
//! The fixture's own sends wait when its transport is full, so whatever is missing at
//! the host was lost in the gateway.
//!
//! The host does not read for [`STALL`] after sending the call, then reads at most
//! [`CHUNK`] bytes per read with a [`PAUSE`] between reads: at the socket (or pipe), so
//! no client library buffers ahead of it. It checks the sequence numbers (each one
//! exactly one more than the last) and that the result names [`COUNT`].
//!
//! Memory bound: the gateway's VmRSS (`/proc/PID/status`), sampled every
//! [`RSS_EVERY`] during the flood, stays under its RSS after the host's `initialize`
//! (or, for pass-through, before any request) plus [`RSS_HEADROOM`] = 24 MiB. Measured
//! on this machine (2 cores, debug build): baseline 23–34 MiB; peak at most 7.5 MiB
//! above baseline on every wire, both with the gateway before issue 24 (which drops
//! most of the flood) and with the pulled upstream streams (which carry all of it).
//! The headroom is three times that; the flood itself is [`COUNT`] × [`PAD`] ≈ 41 MB
//! of padding, so a gateway that held the backlog in memory instead of slowing its
//! upstream crosses the bound.
//!
//! Runtime: the tests mostly wait (the stall, the paced reads), so they can run at
//! once. A passing flood takes about 7 s (the whole file about 40 s at the harness's
//! default of two tests at a time on 2 cores). A lost message shows as [`SILENCE`]
//! after the stall with nothing arriving (about 17 s), or as the wire closing.

mod common;
use common::gateway as gateway_support;

use bytes::Bytes;
use dualera::framing::read_bounded_line;
use dualera::sse;
use futures_util::{SinkExt, StreamExt};
use gateway_support::{modern_headers, modern_request, Proc};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Notifications the upstream streams before its result.
const COUNT: u64 = 10_000;
/// Padding bytes per notification.
const PAD: u64 = 4096;
/// How long the host leaves the stream unread after sending the call.
const STALL: Duration = Duration::from_secs(3);
/// Most bytes the host takes per read once it reads.
const CHUNK: usize = 32 * 1024;
/// The host's pause after each read.
const PAUSE: Duration = Duration::from_millis(1);
/// Nothing arriving for this long (plus the stall) means the rest was lost.
const SILENCE: Duration = Duration::from_secs(10);
/// The whole flood, stall included, must be over by then.
const DEADLINE: Duration = Duration::from_secs(45);
/// The same with the session in Redis, where every upstream message is a step (a
/// Redis round trip) of its own: a flood takes 10–12 s on this machine, 22–26 s while
/// it builds something else.
#[cfg(feature = "redis")]
const SHARED_DEADLINE: Duration = Duration::from_secs(120);
/// The gateway's RSS may grow by at most this much over its idle session's.
const RSS_HEADROOM: u64 = 24 * 1024 * 1024;
/// RSS sampling interval.
const RSS_EVERY: Duration = Duration::from_millis(50);
/// The progress token of the flood call.
const TOKEN: &str = "flood";
/// Most bytes of one SSE event or stdio line the host accepts.
const MAX_EVENT: usize = 1 << 20;

// ---------------------------------------------------------------------------------
// The upstream: the conformance fixture, a real process.

/// The fixture binary, built (or found up to date) once per test run by the same
/// cargo that runs this test, into this test's target directory.
fn fixture_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        // target/<profile>/deps/backpressure-HASH
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>");
        let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        cmd.args([
            "build",
            "--locked",
            "--quiet",
            "--example",
            "conformance_upstream",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        // Without the variables cargo sets for a test process: build scripts that
        // watch one (ring watches CARGO_MANIFEST_DIR) would rebuild the whole tree
        // here, and again on the next plain `cargo build`.
        const SET_FOR_TESTS: [&str; 6] = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ];
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if SET_FOR_TESTS.iter().any(|p| key.starts_with(p)) {
                cmd.env_remove(&*key);
            }
        }
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = tokio::task::block_in_place(|| cmd.status()).expect("run cargo build");
        assert!(
            status.success(),
            "cargo build --example conformance_upstream failed"
        );
        let bin = profile_dir.join("examples").join("conformance_upstream");
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
    .clone()
}

/// The fixture on HTTP; its MCP endpoint is `Proc::url`.
fn fixture_http() -> Proc {
    let bin = fixture_bin();
    Proc::spawn_shell(
        &format!("exec '{}' --listen 127.0.0.1:0", bin.display()),
        "listening on",
    )
}

/// `dualera gateway --listen 127.0.0.1:0 ARGS`.
fn gateway(upstream: &[&str]) -> Proc {
    let mut args = vec!["gateway", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(upstream);
    Proc::spawn(&args, "gateway listening on")
}

// ---------------------------------------------------------------------------------
// The slow host's side of a socket or pipe.

/// When a host's reads stall and slow down: free until [`Pace::stall`], then nothing
/// for [`STALL`], then [`CHUNK`] bytes per read with a [`PAUSE`] after each.
#[derive(Clone, Debug, Default)]
struct Pace(Arc<Mutex<Option<Instant>>>);

impl Pace {
    fn stall(&self) {
        *self.0.lock().unwrap() = Some(Instant::now() + STALL);
    }

    fn slow_from(&self) -> Option<Instant> {
        *self.0.lock().unwrap()
    }
}

/// A reader (and writer) read at the host's [`Pace`]; writes go straight through.
struct Slow<T> {
    io: T,
    pace: Pace,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Slow<T> {
    fn new(io: T, pace: &Pace) -> Self {
        Self {
            io,
            pace: pace.clone(),
            wait: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Slow<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let Some(from) = this.pace.slow_from() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        if this.wait.is_none() && Instant::now() < from {
            this.wait = Some(Box::pin(tokio::time::sleep_until(from.into())));
        }
        if let Some(wait) = this.wait.as_mut() {
            ready!(wait.as_mut().poll(cx));
            this.wait = None;
        }
        let mut chunk = [0u8; CHUNK];
        let take = CHUNK.min(buf.remaining());
        let mut small = ReadBuf::new(&mut chunk[..take]);
        ready!(Pin::new(&mut this.io).poll_read(cx, &mut small))?;
        buf.put_slice(small.filled());
        if !small.filled().is_empty() {
            this.wait = Some(Box::pin(tokio::time::sleep(PAUSE)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Slow<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Messages the host received, in arrival order (every wire feeds one of these).
type Inbox = mpsc::Receiver<Value>;
type Outbox = mpsc::Sender<Value>;

/// `host:port` and path of an `http://` URL.
fn split_url(url: &str) -> (String, String) {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    (authority.to_owned(), path.to_owned())
}

/// Sends one HTTP/1.1 request on its own connection, read at `pace`, and returns the
/// response head and body.
async fn http_open(
    url: &str,
    method: http::Method,
    headers: &[(String, String)],
    body: Vec<u8>,
    pace: &Pace,
) -> (http::response::Parts, hyper::body::Incoming) {
    let (authority, path) = split_url(url);
    let tcp = TcpStream::connect(&authority).await.expect("connect");
    let io = TokioIo::new(Slow::new(tcp, pace));
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", &authority);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = send
        .send_request(req.body(Full::new(Bytes::from(body))).expect("request"))
        .await
        .expect("response head");
    resp.into_parts()
}

/// Forwards the JSON messages of an SSE body to `out`, starting with `dec`'s state.
async fn forward_sse(mut body: hyper::body::Incoming, mut dec: sse::Decoder, out: Outbox) {
    while let Some(Ok(frame)) = body.frame().await {
        let Some(d) = frame.data_ref() else { continue };
        let Ok(events) = dec.feed(d) else { return };
        for ev in events {
            if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                if out.send(v).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// [`http_open`], then the response's messages (a JSON body or an SSE stream) go to
/// `out` as they arrive. Returns the response head.
async fn http_request(
    url: &str,
    method: http::Method,
    headers: &[(String, String)],
    body: Vec<u8>,
    pace: &Pace,
    out: Outbox,
) -> http::response::Parts {
    let (head, body) = http_open(url, method, headers, body, pace).await;
    let is_sse = head
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    tokio::spawn(async move {
        if is_sse {
            forward_sse(body, sse::Decoder::new(MAX_EVENT), out).await;
        } else if let Ok(b) = body.collect().await {
            if let Ok(v) = serde_json::from_slice::<Value>(&b.to_bytes()) {
                let _ = out.send(v).await;
            }
        }
    });
    head
}

/// A host's connection to the gateway: send a message; read what comes back.
struct Host {
    tx: mpsc::Sender<Value>,
    inbox: Inbox,
    /// The reads that [`Pace::stall`] slows.
    pace: Pace,
    /// Streamable HTTP's `Mcp-Session-Id`, once `initialize` is answered.
    session: Arc<Mutex<Option<String>>>,
    /// The stdio gateway, killed on drop.
    _child: Option<tokio::process::Child>,
}

impl Host {
    fn new(tx: mpsc::Sender<Value>, inbox: Inbox, pace: Pace) -> Self {
        Self {
            tx,
            inbox,
            pace,
            session: Arc::default(),
            _child: None,
        }
    }

    async fn send(&self, m: Value) {
        self.tx.send(m).await.expect("wire closed");
    }

    /// The response to `id` (anything before it is dropped).
    async fn response(&mut self, id: u64) -> Value {
        let wait = async {
            loop {
                let m = self.inbox.recv().await.expect("wire closed");
                if m["id"] == id && m.get("method").is_none() {
                    return m;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("no response to request {id}"))
    }

    /// `initialize`, `notifications/initialized`, then a `ping` answered: every message
    /// so far has been handled.
    async fn initialize(&mut self, version: &str) {
        self.send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "backpressure", "version": "1"}}}),
        )
        .await;
        let r = self.response(1).await;
        assert_eq!(r["result"]["protocolVersion"], version, "{r}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        self.send(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
            .await;
        let pong = self.response(3).await;
        assert!(pong.get("result").is_some(), "{pong}");
    }
}

/// Streamable HTTP: each message is a POST on its own connection, read at the host's
/// pace. Legacy (2025-11-25): the session id of `initialize`'s answer goes on the later
/// ones. Modern (2026-07-28): the request's mirrored headers, no session.
fn streamable_http(url: String, modern: bool) -> Host {
    let (tx, mut outgoing) = mpsc::channel::<Value>(8);
    let (out, inbox) = mpsc::channel(16);
    let host = Host::new(tx, inbox, Pace::default());
    let pace = host.pace.clone();
    let session = host.session.clone();
    tokio::spawn(async move {
        while let Some(m) = outgoing.recv().await {
            let mut headers = if modern {
                modern_headers(&m)
            } else {
                vec![
                    ("content-type".into(), "application/json".into()),
                    (
                        "accept".into(),
                        "application/json, text/event-stream".into(),
                    ),
                ]
            };
            let sid = session.lock().unwrap().clone();
            if let Some(s) = sid {
                headers.push(("mcp-session-id".into(), s));
                headers.push(("mcp-protocol-version".into(), "2025-11-25".into()));
            }
            let body = serde_json::to_vec(&m).expect("json");
            let head =
                http_request(&url, http::Method::POST, &headers, body, &pace, out.clone()).await;
            if let Some(s) = head.headers.get("mcp-session-id") {
                *session.lock().unwrap() = s.to_str().ok().map(str::to_owned);
            }
        }
    });
    host
}

/// Legacy HTTP+SSE (2024-11-05): one `GET /sse` stream, read at the host's pace,
/// carries every answer; messages are POSTed to the endpoint its first event names.
async fn http_sse(mcp_url: &str) -> Host {
    let base = mcp_url.trim_end_matches("/mcp").to_owned();
    let (tx, mut outgoing) = mpsc::channel::<Value>(8);
    let (out, inbox) = mpsc::channel(16);
    let host = Host::new(tx, inbox, Pace::default());
    let accept = [("accept".to_owned(), "text/event-stream".to_owned())];
    let (head, mut body) = http_open(
        &format!("{base}/sse"),
        http::Method::GET,
        &accept,
        Vec::new(),
        &host.pace,
    )
    .await;
    assert_eq!(head.status, 200, "GET /sse");
    let mut dec = sse::Decoder::new(MAX_EVENT);
    let endpoint = 'endpoint: loop {
        let frame = body.frame().await.expect("stream").expect("frame");
        let Some(d) = frame.data_ref() else { continue };
        for ev in dec.feed(d).expect("SSE") {
            if ev.event == "endpoint" {
                break 'endpoint ev.data;
            }
        }
    };
    tokio::spawn(forward_sse(body, dec, out));
    let post_url = format!("{base}{endpoint}");
    tokio::spawn(async move {
        let json = [("content-type".to_owned(), "application/json".to_owned())];
        while let Some(m) = outgoing.recv().await {
            let body = serde_json::to_vec(&m).expect("json");
            let (head, _) =
                http_open(&post_url, http::Method::POST, &json, body, &Pace::default()).await;
            assert_eq!(head.status, 202, "HTTP+SSE messages get 202");
        }
    });
    host
}

/// Legacy WebSocket (subprotocol `mcp`) on `/ws`, read at the host's pace.
async fn websocket(mcp_url: &str) -> Host {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let (authority, _) = split_url(mcp_url);
    let (tx, mut outgoing) = mpsc::channel::<Value>(8);
    let (out, inbox) = mpsc::channel(16);
    let host = Host::new(tx, inbox, Pace::default());
    let mut req = format!("ws://{authority}/ws")
        .into_client_request()
        .expect("ws request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        http::HeaderValue::from_static("mcp"),
    );
    let tcp = TcpStream::connect(&authority).await.expect("connect");
    let (mut ws, _) = tokio_tungstenite::client_async(req, Slow::new(tcp, &host.pace))
        .await
        .expect("ws handshake");
    tokio::spawn(async move {
        loop {
            tokio::select! {
                m = outgoing.recv() => match m {
                    Some(m) => {
                        if ws.send(Ws::Text(m.to_string().into())).await.is_err() { return; }
                    }
                    None => return,
                },
                f = ws.next() => match f {
                    Some(Ok(Ws::Text(t))) => {
                        if let Ok(v) = serde_json::from_str::<Value>(t.as_str()) {
                            if out.send(v).await.is_err() { return; }
                        }
                    }
                    Some(Ok(_)) => {}
                    _ => return,
                },
            }
        }
    });
    host
}

/// `dualera gateway --stdio --upstream URL`: lines on its stdin; its stdout read at the
/// host's pace. Returns the host and the gateway's pid.
fn stdio(upstream: &str) -> (Host, u32) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args(["gateway", "--stdio", "--upstream", upstream])
        .env("DUALERA_LOG", "error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the stdio gateway");
    let pid = child.id().expect("pid");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, mut outgoing) = mpsc::channel::<Value>(8);
    let (out, inbox) = mpsc::channel(16);
    let mut host = Host::new(tx, inbox, Pace::default());
    let mut reader = tokio::io::BufReader::with_capacity(CHUNK, Slow::new(stdout, &host.pace));
    tokio::spawn(async move {
        while let Some(m) = outgoing.recv().await {
            let mut line = m.to_string().into_bytes();
            line.push(b'\n');
            if stdin.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut line = Vec::new();
        while let Ok(Some(read)) = read_bounded_line(&mut reader, &mut line, MAX_EVENT).await {
            if read.is_err() {
                return;
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                if out.send(v).await.is_err() {
                    return;
                }
            }
        }
    });
    host._child = Some(child);
    (host, pid)
}

// ---------------------------------------------------------------------------------
// The gateway's memory.

/// VmRSS of `pid` in bytes (0 once it is gone).
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Samples `pid`'s RSS every [`RSS_EVERY`] until dropped; keeps the peak.
struct RssPeak {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssPeak {
    fn sample(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(rss(pid)));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                p.fetch_max(rss(pid), Ordering::Relaxed);
                tokio::time::sleep(RSS_EVERY).await;
            }
        });
        Self { peak, task }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------
// What the host received.

/// A flood as the host saw it.
#[derive(Debug, Default)]
struct Received {
    /// Numbered notifications that arrived.
    notifications: u64,
    /// The first one out of order: (expected, got).
    out_of_order: Option<(u64, u64)>,
    /// The closing message (the call's result, or the GET stream's last notification).
    end: Option<Value>,
    /// Why the host stopped before the end: nothing arrived for [`SILENCE`] (after
    /// the [`STALL`]), the deadline passed, or the wire closed.
    stopped: Option<&'static str>,
    /// From sending the call to the end.
    took: Duration,
}

/// Reads `inbox` until the closing message: `seq` numbers a flood notification;
/// `is_end` recognises the close.
async fn receive(
    inbox: &mut Inbox,
    deadline: Duration,
    seq: impl Fn(&Value) -> Option<u64>,
    is_end: impl Fn(&Value) -> bool,
) -> Received {
    let start = Instant::now();
    let mut got = Received::default();
    loop {
        let left = deadline.saturating_sub(start.elapsed());
        let m = match tokio::time::timeout(left.min(STALL + SILENCE), inbox.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                got.stopped = Some("wire closed");
                break;
            }
            Err(_) if left <= STALL + SILENCE => {
                got.stopped = Some("deadline");
                break;
            }
            Err(_) => {
                got.stopped = Some("silence");
                break;
            }
        };
        if let Some(n) = seq(&m) {
            let expected = got.notifications + 1;
            if n != expected && got.out_of_order.is_none() {
                got.out_of_order = Some((expected, n));
            }
            got.notifications += 1;
        } else if is_end(&m) {
            got.end = Some(m);
            break;
        }
    }
    got.took = start.elapsed();
    got
}

/// Asserts that every notification and the end arrived in order, and the gateway's
/// RSS stayed under `baseline + RSS_HEADROOM`.
fn check(wire: &str, got: &Received, end_ok: bool, baseline: u64, peak: u64) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let summary = format!(
        "{wire}: {} of {COUNT} notifications (first out of order: {:?}), end {}, stopped: {}, \
         in {:.1}s; gateway RSS baseline {:.1} MiB, peak {:.1} MiB, bound {:.1} MiB",
        got.notifications,
        got.out_of_order,
        if got.end.is_some() {
            "received"
        } else {
            "missing"
        },
        got.stopped.unwrap_or("no"),
        got.took.as_secs_f64(),
        mib(baseline),
        mib(peak),
        mib(baseline + RSS_HEADROOM),
    );
    eprintln!("{summary}");
    assert_eq!(got.notifications, COUNT, "{summary}");
    assert_eq!(got.out_of_order, None, "{summary}");
    assert!(end_ok, "{summary}; end: {:?}", got.end);
    assert!(peak <= baseline + RSS_HEADROOM, "{summary}");
}

/// Whether a `tools/call` answer is the flood's success naming [`COUNT`] (as
/// structured content, or as text where the revision has none).
fn names_count(answer: &Value) -> bool {
    let result = &answer["result"];
    if result["isError"] == true {
        return false;
    }
    if result.pointer("/structuredContent/count") == Some(&json!(COUNT)) {
        return true;
    }
    result["content"].as_array().is_some_and(|items| {
        items.iter().filter_map(|c| c["text"].as_str()).any(|t| {
            t == format!("flooded {COUNT}")
                || serde_json::from_str::<Value>(t).ok() == Some(json!({ "count": COUNT }))
        })
    })
}

/// The `notifications/progress` sequence number of the flood call.
fn progress_seq(m: &Value) -> Option<u64> {
    if m["method"] != "notifications/progress" || m["params"]["progressToken"] != TOKEN {
        return None;
    }
    m["params"]["progress"].as_u64()
}

/// The `tools/call` of `tool` with id 2 and the flood's arguments, legacy or modern.
fn flood_call(tool: &str, modern: bool) -> Value {
    let params = json!({"name": tool, "arguments": {"count": COUNT, "bytes": PAD}});
    if modern {
        let mut m = modern_request(json!(2), "tools/call", params, json!({}));
        m["params"]["_meta"]["progressToken"] = json!(TOKEN);
        m
    } else {
        let mut params = params;
        params["_meta"] = json!({ "progressToken": TOKEN });
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
    }
}

/// The flood on the call's own stream: `host` (initialized when `legacy` names its
/// revision) stalls, then reads slowly; every progress notification and the result
/// arrive, in order, with the gateway `gateway_pid` under its memory bound.
async fn call_flood(wire: &str, mut host: Host, gateway_pid: u32, legacy: Option<&str>) {
    if let Some(version) = legacy {
        host.initialize(version).await;
    }
    flood(wire, host, gateway_pid, legacy.is_none(), DEADLINE).await;
}

/// [`call_flood`] once the host is initialized (or, `modern`, needs no session).
async fn flood(wire: &str, mut host: Host, gateway_pid: u32, modern: bool, deadline: Duration) {
    let baseline = rss(gateway_pid);
    let sampler = RssPeak::sample(gateway_pid);
    host.pace.stall();
    host.send(flood_call("flood", modern)).await;
    let got = receive(&mut host.inbox, deadline, progress_seq, |m| {
        m["id"] == 2 && m.get("method").is_none()
    })
    .await;
    let end_ok = got.end.as_ref().is_some_and(names_count);
    check(wire, &got, end_ok, baseline, sampler.peak());
}

// ---------------------------------------------------------------------------------
// One test per wire.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_post_stream_delivers_a_flood_to_a_slow_host() {
    let upstream = fixture_http();
    let gw = gateway(&["--upstream", &upstream.url]);
    let host = streamable_http(gw.url.clone(), false);
    call_flood(
        "Streamable HTTP POST stream",
        host,
        gw.pid(),
        Some("2025-11-25"),
    )
    .await;
}

/// The GET stream: the upstream's `subscriptions/listen` stream carries the flood
/// (the fixture announces while the listen stream keeps up, so it drops nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_get_stream_delivers_a_flood_to_a_slow_host() {
    let upstream = fixture_http();
    let gw = gateway(&["--upstream", &upstream.url]);
    get_flood("Streamable HTTP GET stream", &gw, DEADLINE).await;
}

/// A legacy session on `gw`, its GET stream read at a slow host's pace while a
/// `flood_changes` call announces the flood on it.
async fn get_flood(wire: &str, gw: &Proc, deadline: Duration) {
    let mut host = streamable_http(gw.url.clone(), false);
    host.initialize("2025-11-25").await;
    let session = host.session.lock().unwrap().clone().expect("session id");
    let get_pace = Pace::default();
    let (out, mut get_inbox) = mpsc::channel(16);
    let headers = [
        ("accept".to_owned(), "text/event-stream".to_owned()),
        ("mcp-session-id".to_owned(), session),
        ("mcp-protocol-version".to_owned(), "2025-11-25".to_owned()),
    ];
    let head = http_request(
        &gw.url,
        http::Method::GET,
        &headers,
        Vec::new(),
        &get_pace,
        out,
    )
    .await;
    assert_eq!(head.status, 200, "GET stream opened");
    let baseline = rss(gw.pid());
    let sampler = RssPeak::sample(gw.pid());
    get_pace.stall();
    host.send(flood_call("flood_changes", false)).await;
    let got = receive(
        &mut get_inbox,
        deadline,
        |m| {
            (m["method"] == "notifications/resources/list_changed")
                .then(|| m["params"]["seq"].as_u64())
                .flatten()
        },
        |m| m["method"] == "notifications/tools/list_changed",
    )
    .await;
    let end_ok = got
        .end
        .as_ref()
        .is_some_and(|m| m["params"]["count"] == COUNT);
    check(wire, &got, end_ok, baseline, sampler.peak());
    let answer = host.response(2).await;
    assert!(names_count(&answer), "flood_changes answered {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sse_delivers_a_flood_to_a_slow_host() {
    let upstream = fixture_http();
    let gw = gateway(&["--upstream", &upstream.url]);
    let host = http_sse(&gw.url).await;
    call_flood("HTTP+SSE", host, gw.pid(), Some("2024-11-05")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_delivers_a_flood_to_a_slow_host() {
    let upstream = fixture_http();
    let gw = gateway(&["--upstream", &upstream.url]);
    let host = websocket(&gw.url).await;
    call_flood("WebSocket", host, gw.pid(), Some("2025-11-25")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_host_gets_a_flood_while_reading_slowly() {
    let upstream = fixture_http();
    let (host, pid) = stdio(&upstream.url);
    call_flood("stdio host", host, pid, Some("2025-11-25")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_pass_through_over_http_delivers_a_flood_to_a_slow_host() {
    let upstream = fixture_http();
    let gw = gateway(&["--upstream", &upstream.url]);
    let host = streamable_http(gw.url.clone(), true);
    call_flood("pass-through, HTTP upstream", host, gw.pid(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_pass_through_over_stdio_delivers_a_flood_to_a_slow_host() {
    let cmd = format!("{} --stdio", fixture_bin().display());
    let gw = gateway(&["--upstream-cmd", &cmd]);
    let host = streamable_http(gw.url.clone(), true);
    call_flood("pass-through, stdio upstream", host, gw.pid(), None).await;
}

// ---------------------------------------------------------------------------------
// The same streams with the session in Redis (`--session-store`): each upstream
// message is a step that appends it to a Redis Stream capped at the replay size, and
// the exchange reads the next one only once this replica's relay of that stream is
// within half of it (`store/redis/backlog.rs`); before, the stream was trimmed under
// a slow host and the relay skipped what was gone.

#[cfg(feature = "redis")]
mod shared_sessions {
    use super::*;
    use gateway_support::replicas::RedisServer;

    fn shared_gateway(upstream: &Proc, redis: &RedisServer) -> Proc {
        gateway(&["--upstream", &upstream.url, "--session-store", &redis.url()])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn post_stream_delivers_a_flood_to_a_slow_host() {
        let redis = RedisServer::start();
        let upstream = fixture_http();
        let gw = shared_gateway(&upstream, &redis);
        let mut host = streamable_http(gw.url.clone(), false);
        host.initialize("2025-11-25").await;
        let wire = "shared session, POST stream";
        flood(wire, host, gw.pid(), false, SHARED_DEADLINE).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn get_stream_delivers_a_flood_to_a_slow_host() {
        let redis = RedisServer::start();
        let upstream = fixture_http();
        let gw = shared_gateway(&upstream, &redis);
        get_flood("shared session, GET stream", &gw, SHARED_DEADLINE).await;
    }

    /// The session opened on one replica, the flood called on the other: the replica
    /// that serves the call runs its exchange and relays its stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_called_on_another_replica_reaches_a_slow_host() {
        let redis = RedisServer::start();
        let upstream = fixture_http();
        let a = shared_gateway(&upstream, &redis);
        let b = shared_gateway(&upstream, &redis);
        let mut opener = streamable_http(a.url.clone(), false);
        opener.initialize("2025-11-25").await;
        let host = streamable_http(b.url.clone(), false);
        *host.session.lock().unwrap() = opener.session.lock().unwrap().clone();
        let wire = "shared session, call on the other replica";
        flood(wire, host, b.pid(), false, SHARED_DEADLINE).await;
    }

    /// The flood's POST stream, read fast on replica A for its first `RESUME_AT`
    /// notifications, then resumed with `Last-Event-ID` on replica B by a host that
    /// stalls, then reads slowly, while the call still runs on A: B's relay acks how
    /// far it has sent to A, whose exchange waits for it. What A appended while no
    /// connection held the stream may be gone (as from an in-memory replay ring);
    /// from the first notification B delivers on, none may be missing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_post_stream_resumed_on_another_replica_stays_whole() {
        const RESUME_AT: u64 = 100;
        let redis = RedisServer::start();
        let upstream = fixture_http();
        let a = shared_gateway(&upstream, &redis);
        let b = shared_gateway(&upstream, &redis);
        let mut host = streamable_http(a.url.clone(), false);
        host.initialize("2025-11-25").await;
        let sid = host.session.lock().unwrap().clone().expect("session id");
        let session = [
            ("mcp-session-id".to_owned(), sid),
            ("mcp-protocol-version".to_owned(), "2025-11-25".to_owned()),
        ];
        let mut post = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            (
                "accept".to_owned(),
                "application/json, text/event-stream".to_owned(),
            ),
        ];
        post.extend(session.iter().cloned());
        let call = serde_json::to_vec(&flood_call("flood", false)).unwrap();
        let (head, mut body) =
            http_open(&a.url, http::Method::POST, &post, call, &Pace::default()).await;
        assert_eq!(head.status, 200);
        let mut dec = sse::Decoder::new(MAX_EVENT);
        let mut last_id = None;
        'first: while let Some(Ok(frame)) = body.frame().await {
            let Some(d) = frame.data_ref() else { continue };
            for ev in dec.feed(d).expect("SSE") {
                let v: Value = serde_json::from_str(&ev.data).unwrap_or_default();
                if progress_seq(&v).is_some_and(|n| n >= RESUME_AT) {
                    last_id = ev.id.clone();
                    break 'first;
                }
            }
        }
        let last_id = last_id.expect("an event id on the POST stream");
        // The host's connection to A goes away.
        drop(body);
        let pace = Pace::default();
        pace.stall();
        let (out, mut inbox) = mpsc::channel(16);
        let mut get = vec![
            ("accept".to_owned(), "text/event-stream".to_owned()),
            ("last-event-id".to_owned(), last_id),
        ];
        get.extend(session.iter().cloned());
        let baseline = rss(b.pid());
        let sampler = RssPeak::sample(b.pid());
        let head = http_request(&b.url, http::Method::GET, &get, Vec::new(), &pace, out).await;
        assert_eq!(head.status, 200, "resumed on B");
        let mut first = None;
        let mut next = 0;
        let mut gaps = Vec::new();
        let mut end = None;
        let deadline = Instant::now() + SHARED_DEADLINE;
        while end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = match tokio::time::timeout(left.min(STALL + SILENCE), inbox.recv()).await {
                Ok(Some(m)) => m,
                other => panic!(
                    "resumed stream stopped ({}) after notification {next}, first {first:?}",
                    if other.is_ok() { "closed" } else { "silence" }
                ),
            };
            if let Some(n) = progress_seq(&m) {
                if first.is_none() {
                    first = Some(n);
                } else if n != next + 1 {
                    gaps.push((next, n));
                }
                next = n;
            } else if m["id"] == 2 && m.get("method").is_none() {
                end = Some(m);
            }
        }
        let first = first.expect("notifications after the resumption");
        eprintln!(
            "resumed on another replica: notifications {first}..={next} (resumed after \
             {RESUME_AT}), gaps after the first {gaps:?}; B's RSS baseline {} MiB, peak {} MiB",
            baseline / (1 << 20),
            sampler.peak() / (1 << 20)
        );
        assert!(first > RESUME_AT, "resumed after {RESUME_AT}, got {first}");
        assert_eq!(
            gaps,
            Vec::<(u64, u64)>::new(),
            "notifications lost after the resumption"
        );
        assert_eq!(next, COUNT, "the last notification");
        assert!(names_count(end.as_ref().unwrap()), "{end:?}");
        assert!(sampler.peak() <= baseline + RSS_HEADROOM);
    }
}
