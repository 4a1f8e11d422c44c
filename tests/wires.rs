//! One scenario list over every downstream wire (Streamable HTTP, stdio, WebSocket,
//! HTTP+SSE) and both upstream wires (HTTP, stdio child): a test matrix, not a copy per
//! wire. Plus the stdio upstream's restart: a child killed mid-round fails that request
//! and the next call succeeds.

mod common;

use bytes::Bytes;
use common::gateway::{pki, Proc};
use dualera::sse;
use dualera_adapters::jsonrpc::{self, Message, Notification, Request, RequestId, Response};
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_dualera");
const WAIT: Duration = Duration::from_secs(30);

/// A directory of its own for one test, removed when the returned guard is dropped.
fn tmp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("dualera-wires-{tag}-"))
        .tempdir()
        .expect("tmp dir")
}

/// Spawns `dualera ARGS`; the process and the URL it announced after `marker`.
fn spawn_listening(args: &[&str], marker: &str) -> (Proc, String) {
    let p = Proc::spawn(args, marker);
    let url = p.url.clone();
    (p, url)
}

#[derive(Clone, Copy, Debug)]
enum Up {
    Http,
    /// `dualera serve --tls-cert/--tls-key`, fronted with `--upstream-ca`.
    Https,
    Stdio,
}

fn tls_listener_args() -> Vec<String> {
    vec![
        "--tls-cert".into(),
        pki().cert.display().to_string(),
        "--tls-key".into(),
        pki().key.display().to_string(),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Down {
    StreamableHttp,
    Stdio,
    WebSocket,
    HttpSse,
}

/// A legacy peer's view of a wire: send one message, receive the next.
struct Wire {
    tx: mpsc::Sender<Message>,
    rx: mpsc::Receiver<Message>,
    _procs: Vec<Proc>,
}

impl Wire {
    async fn send(&self, m: Message) {
        self.tx.send(m).await.expect("wire closed");
    }

    async fn recv(&mut self) -> Message {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("timed out waiting for the gateway")
            .expect("wire closed")
    }
}

fn demo_dir(dir: &Path) -> (String, String) {
    let notes = format!("file://{}/notes", dir.display());
    let repo = format!("{}/repo", dir.display());
    (notes, repo)
}

async fn open(up: Up, down: Down, tls: bool, dir: &Path) -> Wire {
    let demo = dir.to_string_lossy().into_owned();
    let mut procs = Vec::new();
    let upstream_args: Vec<String> = match up {
        Up::Http => {
            let (p, url) = spawn_listening(
                &["serve", "--demo", &demo, "--listen", "127.0.0.1:0"],
                "listening on ",
            );
            procs.push(p);
            vec!["--upstream".into(), url]
        }
        Up::Https => {
            let mut args: Vec<String> = ["serve", "--demo", &demo, "--listen", "127.0.0.1:0"]
                .map(String::from)
                .to_vec();
            args.extend(tls_listener_args());
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let (p, url) = spawn_listening(&argv, "listening on ");
            assert!(url.starts_with("https://"), "{url}");
            procs.push(p);
            vec![
                "--upstream".into(),
                url,
                "--upstream-ca".into(),
                pki().ca.display().to_string(),
            ]
        }
        Up::Stdio => {
            // Seed the demo first so the child finds it.
            let out = Command::new(BIN)
                .args(["serve", "--stdio", "--demo", &demo])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .expect("seed");
            assert!(out.status.success());
            vec![
                "--upstream-cmd".into(),
                format!("{BIN} serve --stdio --demo {demo}"),
            ]
        }
    };
    let (to_gw, mut from_test) = mpsc::channel::<Message>(64);
    let (to_test, rx) = mpsc::channel::<Message>(64);
    match down {
        Down::Stdio => {
            let mut args: Vec<String> = vec!["gateway".into(), "--stdio".into()];
            args.extend(upstream_args);
            let mut child = tokio::process::Command::new(BIN)
                .args(&args)
                .env("DUALERA_LOG", "warn")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn stdio gateway");
            let mut stdin = child.stdin.take().expect("stdin");
            let stdout = child.stdout.take().expect("stdout");
            tokio::spawn(async move {
                let _child = child;
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                loop {
                    tokio::select! {
                        m = from_test.recv() => match m {
                            Some(m) => {
                                let mut b = m.to_vec();
                                b.push(b'\n');
                                if stdin.write_all(&b).await.is_err() { return; }
                            }
                            None => return,
                        },
                        line = lines.next_line() => match line {
                            Ok(Some(l)) => {
                                if let Ok(m) = jsonrpc::parse(l.as_bytes()) {
                                    let _ = to_test.send(m).await;
                                }
                            }
                            _ => return,
                        },
                    }
                }
            });
        }
        _ => {
            let mut args: Vec<String> =
                vec!["gateway".into(), "--listen".into(), "127.0.0.1:0".into()];
            args.extend(upstream_args);
            if tls {
                args.extend(tls_listener_args());
            }
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let (p, url) = spawn_listening(&argv, "listening on ");
            assert_eq!(url.starts_with("https://"), tls, "{url}");
            procs.push(p);
            let base = url.trim_end_matches("/mcp").to_owned();
            match down {
                Down::StreamableHttp => {
                    tokio::spawn(streamable_http(format!("{base}/mcp"), from_test, to_test))
                }
                Down::WebSocket => tokio::spawn(websocket(
                    base.replace("https://", "wss://")
                        .replace("http://", "ws://")
                        + "/ws",
                    from_test,
                    to_test,
                )),
                Down::HttpSse => tokio::spawn(http_sse(base, from_test, to_test)),
                Down::Stdio => unreachable!(),
            };
        }
    }
    Wire {
        tx: to_gw,
        rx,
        _procs: procs,
    }
}

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// HTTP, or HTTPS trusting the test CA.
fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(
        hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*pki().client).clone())
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build(),
    )
}

async fn read_body_messages(
    resp: hyper::Response<hyper::body::Incoming>,
    to_test: &mpsc::Sender<Message>,
) {
    let is_sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    if !is_sse {
        if let Ok(b) = body.collect().await {
            if let Ok(m) = jsonrpc::parse(&b.to_bytes()) {
                let _ = to_test.send(m).await;
            }
        }
        return;
    }
    let mut dec = sse::Decoder::new(1 << 22);
    while let Some(Ok(frame)) = body.frame().await {
        let Some(d) = frame.data_ref() else { continue };
        for ev in dec.feed(d).unwrap_or_default() {
            if let Ok(m) = jsonrpc::parse(ev.data.as_bytes()) {
                let _ = to_test.send(m).await;
            }
        }
    }
}

async fn streamable_http(
    url: String,
    mut from_test: mpsc::Receiver<Message>,
    to_test: mpsc::Sender<Message>,
) {
    let client = client();
    let session: Arc<Mutex<Option<String>>> = Arc::default();
    while let Some(m) = from_test.recv().await {
        let mut b = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session.lock().unwrap().clone() {
            b = b
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let req = b.body(Full::new(Bytes::from(m.to_vec()))).expect("request");
        let resp = client.request(req).await.expect("POST");
        if let Some(s) = resp.headers().get("mcp-session-id") {
            *session.lock().unwrap() = Some(s.to_str().unwrap_or_default().to_owned());
        }
        let tx = to_test.clone();
        tokio::spawn(async move { read_body_messages(resp, &tx).await });
    }
}

async fn websocket(
    url: String,
    from_test: mpsc::Receiver<Message>,
    to_test: mpsc::Sender<Message>,
) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.as_str().into_client_request().expect("ws request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        http::HeaderValue::from_static("mcp"),
    );
    let secure = url.starts_with("wss://");
    let host = url
        .trim_start_matches("wss://")
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let tcp = tokio::net::TcpStream::connect(&host)
        .await
        .expect("connect");
    if secure {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(pki().client.clone())
            .connect(name, tcp)
            .await
            .expect("TLS handshake");
        let (ws, resp) = tokio_tungstenite::client_async(req, tls)
            .await
            .expect("wss handshake");
        ws_loop(ws, resp, from_test, to_test).await;
    } else {
        let (ws, resp) = tokio_tungstenite::client_async(req, tcp)
            .await
            .expect("ws handshake");
        ws_loop(ws, resp, from_test, to_test).await;
    }
}

async fn ws_loop<S>(
    mut ws: tokio_tungstenite::WebSocketStream<S>,
    resp: tokio_tungstenite::tungstenite::handshake::client::Response,
    mut from_test: mpsc::Receiver<Message>,
    to_test: mpsc::Sender<Message>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::Message as Ws;
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.as_bytes()),
        Some(&b"mcp"[..]),
        "subprotocol mcp negotiated"
    );
    loop {
        tokio::select! {
            m = from_test.recv() => match m {
                Some(m) => {
                    let text = String::from_utf8(m.to_vec()).expect("utf8");
                    if ws.send(Ws::Text(text.into())).await.is_err() { return; }
                }
                None => return,
            },
            f = ws.next() => match f {
                Some(Ok(Ws::Text(t))) => {
                    if let Ok(m) = jsonrpc::parse(t.as_str().as_bytes()) {
                        let _ = to_test.send(m).await;
                    }
                }
                Some(Ok(_)) => {}
                _ => return,
            },
        }
    }
}

async fn http_sse(
    base: String,
    mut from_test: mpsc::Receiver<Message>,
    to_test: mpsc::Sender<Message>,
) {
    let client = client();
    let req = http::Request::get(format!("{base}/sse"))
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client.request(req).await.expect("GET /sse");
    let mut body = resp.into_body();
    let mut dec = sse::Decoder::new(1 << 22);
    let mut endpoint = None;
    while endpoint.is_none() {
        let frame = body.frame().await.expect("stream").expect("frame");
        if let Some(d) = frame.data_ref() {
            for ev in dec.feed(d).unwrap_or_default() {
                if ev.event == "endpoint" {
                    endpoint = Some(ev.data.clone());
                }
            }
        }
    }
    let post_url = format!("{base}{}", endpoint.unwrap_or_default());
    let tx = to_test.clone();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            let Some(d) = frame.data_ref() else { continue };
            for ev in dec.feed(d).unwrap_or_default() {
                if let Ok(m) = jsonrpc::parse(ev.data.as_bytes()) {
                    let _ = tx.send(m).await;
                }
            }
        }
    });
    while let Some(m) = from_test.recv().await {
        let req = http::Request::post(&post_url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(m.to_vec())))
            .expect("request");
        let resp = client.request(req).await.expect("POST /messages");
        assert_eq!(resp.status(), 202, "HTTP+SSE messages get 202");
    }
}

/// The scripted user: how to answer forms, and what the model says.
#[derive(Clone, Copy)]
enum Answer {
    Accept,
    Decline,
    Cancel,
}

struct Peer {
    wire: Wire,
    next: i64,
    answer: Answer,
    live: Vec<String>,
}

impl Peer {
    async fn request(&mut self, method: &str, params: Value) -> Response {
        self.next += 1;
        let id = RequestId::Number(self.next);
        self.wire
            .send(Message::Request(Request {
                id: id.clone(),
                method: method.into(),
                params: Some(params),
            }))
            .await;
        loop {
            match self.wire.recv().await {
                Message::Response(r) if r.id.as_ref() == Some(&id) => return r,
                Message::Request(live) => {
                    self.live.push(live.method.clone());
                    let p = live.params.clone().unwrap_or(Value::Null);
                    let result = match live.method.as_str() {
                        "elicitation/create" => match self.answer {
                            Answer::Accept => json!({"action": "accept", "content": {
                                "note_id": p.pointer("/requestedSchema/properties/note_id/enum/0").cloned().unwrap_or(Value::Null),
                                "confirm": true}}),
                            Answer::Decline => json!({"action": "decline"}),
                            Answer::Cancel => json!({"action": "cancel"}),
                        },
                        "sampling/createMessage" => {
                            let prompt = p
                                .pointer("/messages/0/content/text")
                                .and_then(Value::as_str)
                                .unwrap_or_default();
                            let text = if prompt.contains("JSON array") {
                                r#"["README.md"]"#
                            } else {
                                "A tiny ledger library."
                            };
                            json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "m", "stopReason": "endTurn"})
                        }
                        "roots/list" => json!({"roots": []}),
                        _ => json!({}),
                    };
                    self.wire
                        .send(Message::Response(Response::result(live.id, result)))
                        .await;
                }
                _ => {}
            }
        }
    }

    async fn initialize(&mut self) {
        let r = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}, "sampling": {}},
                       "clientInfo": {"name": "wires", "version": "1"}}),
            )
            .await;
        let result = r.outcome.expect("initialize succeeds");
        assert!(result.get("protocolVersion").is_some());
        self.wire
            .send(Message::Notification(Notification {
                method: "notifications/initialized".into(),
                params: None,
            }))
            .await;
    }

    async fn tool(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
            .await
            .outcome
            .unwrap_or_else(|e| panic!("{name} failed: {}", e.message))
    }

    async fn tps(&mut self, ws: &str) -> usize {
        let r = self.tool("notes_list", json!({"workspaceUri": ws})).await;
        r.pointer("/structuredContent/notes")
            .and_then(Value::as_array)
            .map_or(0, |a| {
                a.iter().filter(|n| n["title"] == "TPS report").count()
            })
    }
}

async fn scenarios(up: Up, down: Down, tls: bool) {
    let guard = tmp_dir(&format!("{up:?}-{down:?}-{tls}"));
    let dir = guard.path();
    let (ws, repo) = demo_dir(dir);
    let wire = open(up, down, tls, dir).await;
    let mut peer = Peer {
        wire,
        next: 0,
        answer: Answer::Accept,
        live: Vec::new(),
    };
    peer.initialize().await;
    let tools = peer
        .request("tools/list", json!({}))
        .await
        .outcome
        .expect("tools/list");
    assert_eq!(
        tools["tools"].as_array().map(Vec::len),
        Some(4),
        "{up:?}/{down:?}: four tools"
    );
    assert!(
        tools.get("resultType").is_none(),
        "resultType stripped for legacy peers"
    );
    for (answer, gone) in [
        (Answer::Accept, 1),
        (Answer::Decline, 0),
        (Answer::Cancel, 0),
    ] {
        peer.answer = answer;
        let before = peer.tps(&ws).await;
        let r = peer
            .tool(
                "notes_delete",
                json!({"workspaceUri": ws, "title": "TPS report"}),
            )
            .await;
        assert_ne!(r["isError"], true, "{up:?}/{down:?}: {r}");
        assert_eq!(
            peer.tps(&ws).await,
            before - gone,
            "{up:?}/{down:?}: notes after answer"
        );
    }
    let r = peer
        .tool(
            "summarize_repo",
            json!({"directory": repo, "audience": "developer"}),
        )
        .await;
    assert_eq!(
        r.pointer("/structuredContent/files"),
        Some(&json!(["README.md"])),
        "{up:?}/{down:?}: {r}"
    );
    assert_eq!(
        peer.live
            .iter()
            .filter(|m| *m == "sampling/createMessage")
            .count(),
        2
    );
    assert_eq!(
        peer.live
            .iter()
            .filter(|m| *m == "elicitation/create")
            .count(),
        3
    );
    drop(peer);
}

macro_rules! matrix {
    ($($name:ident: $up:expr, $down:expr, $tls:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            scenarios($up, $down, $tls).await;
        }
    )*};
}

matrix! {
    http_up_streamable_http: Up::Http, Down::StreamableHttp, false;
    http_up_stdio: Up::Http, Down::Stdio, false;
    http_up_websocket: Up::Http, Down::WebSocket, false;
    http_up_http_sse: Up::Http, Down::HttpSse, false;
    stdio_up_streamable_http: Up::Stdio, Down::StreamableHttp, false;
    stdio_up_stdio: Up::Stdio, Down::Stdio, false;
    stdio_up_websocket: Up::Stdio, Down::WebSocket, false;
    stdio_up_http_sse: Up::Stdio, Down::HttpSse, false;
    // TLS on both hops, one row per downstream wire (stdio has no listener).
    https_up_https_streamable_http: Up::Https, Down::StreamableHttp, true;
    https_up_stdio: Up::Https, Down::Stdio, false;
    https_up_wss_websocket: Up::Https, Down::WebSocket, true;
    https_up_https_http_sse: Up::Https, Down::HttpSse, true;
}

/// Pids of processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 (after the parenthesized command) is the parent pid.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        if after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
            == Some(parent)
        {
            out.push(pid);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_upstream_child_killed_mid_round_then_restarted() {
    let guard = tmp_dir("kill");
    let dir = guard.path();
    let (ws, _) = demo_dir(dir);
    let demo = dir.to_string_lossy().into_owned();
    let seed = Command::new(BIN)
        .args(["serve", "--stdio", "--demo", &demo])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("seed");
    assert!(seed.status.success());
    let (gw, url) = spawn_listening(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--upstream-cmd",
            &format!("{BIN} serve --stdio --demo {demo}"),
        ],
        "listening on ",
    );
    let gw_pid = gw.pid();
    let (tx, from_test) = mpsc::channel(64);
    let (to_test, rx) = mpsc::channel(64);
    tokio::spawn(streamable_http(url, from_test, to_test));
    let mut peer = Peer {
        wire: Wire {
            tx,
            rx,
            _procs: vec![gw],
        },
        next: 0,
        answer: Answer::Accept,
        live: Vec::new(),
    };
    peer.initialize().await;
    let before = peer.tps(&ws).await;
    // Start a delete; when the form arrives, kill the child instead of answering.
    peer.next += 1;
    let id = RequestId::Number(peer.next);
    peer.wire
        .send(Message::Request(Request {
            id: id.clone(),
            method: "tools/call".into(),
            params: Some(json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "TPS report"}})),
        }))
        .await;
    let live = loop {
        match peer.wire.recv().await {
            Message::Request(r) if r.method == "elicitation/create" => break r,
            _ => {}
        }
    };
    let kids = children_of(gw_pid);
    assert!(!kids.is_empty(), "the gateway has a stdio child");
    for k in kids {
        let _ = Command::new("kill").args(["-9", &k.to_string()]).status();
    }
    // The answer reaches a restarted child whose key cannot verify the old state.
    let accept = json!({"action": "accept", "content": {
        "note_id": live.params.as_ref().and_then(|p| p.pointer("/requestedSchema/properties/note_id/enum/0")).cloned(),
        "confirm": true}});
    peer.wire
        .send(Message::Response(Response::result(live.id, accept)))
        .await;
    let failed = loop {
        match peer.wire.recv().await {
            Message::Response(r) if r.id.as_ref() == Some(&id) => break r,
            _ => {}
        }
    };
    let failed_text = match &failed.outcome {
        Ok(v) => {
            assert_eq!(v["isError"], true, "the interrupted call fails: {v}");
            v.to_string()
        }
        Err(e) => e.message.clone(),
    };
    assert!(!failed_text.is_empty());
    // The next call works on the restarted child, and nothing was deleted.
    assert_eq!(peer.tps(&ws).await, before);
    let r = peer
        .tool(
            "notes_delete",
            json!({"workspaceUri": ws, "title": "TPS report"}),
        )
        .await;
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(peer.tps(&ws).await, before - 1);
}

/// Gateway shutdown ends open HTTP+SSE streams instead of waiting out the grace period
/// for them (in-process, so the shutdown is exactly when the test says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sse_stream_ends_promptly_on_gateway_shutdown() {
    use dualera::gateway::{Gateway, GatewayConfig, HttpUpstream, Upstream};
    let guard = tmp_dir("sse-shutdown");
    let dir = guard.path();
    let demo = dir.to_string_lossy().into_owned();
    let (_up, upstream) = spawn_listening(
        &["serve", "--demo", &demo, "--listen", "127.0.0.1:0"],
        "listening on ",
    );
    let gw = Gateway::new(
        Upstream::Http(Box::new(
            HttpUpstream::new(upstream.parse().expect("upstream URI"), 1 << 22)
                .expect("upstream client"),
        )),
        GatewayConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(gw.serve(listener, async move {
        let _ = stopped.await;
    }));
    let client = client();
    let req = http::Request::get(format!("{base}/sse"))
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let mut body = client.request(req).await.expect("GET /sse").into_body();
    let mut dec = sse::Decoder::new(1 << 22);
    'endpoint: loop {
        let frame = body.frame().await.expect("stream").expect("frame");
        if let Some(d) = frame.data_ref() {
            if dec
                .feed(d)
                .unwrap_or_default()
                .iter()
                .any(|ev| ev.event == "endpoint")
            {
                break 'endpoint;
            }
        }
    }
    let t0 = std::time::Instant::now();
    let _ = stop.send(());
    // The stream ends (its session is closed) and `serve` returns, well before the 5 s
    // the gateway grants connections that do not finish on their own.
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
    assert!(ended.is_ok(), "the HTTP+SSE stream outlived the shutdown");
    let served = tokio::time::timeout(Duration::from_secs(3), serving).await;
    assert!(
        matches!(served, Ok(Ok(Ok(())))),
        "serve did not return promptly: {served:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}
