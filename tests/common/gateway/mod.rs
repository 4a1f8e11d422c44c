//! Harness for the gateway's acceptance tests, all over real sockets:
//!
//! - [`Workspace`]: a temp dir with a config (store, state key, grants, `[gateway]`
//!   knobs), a notes workspace and a small repository;
//! - [`Proc`]: the real `dualera serve` / `dualera gateway` binaries, spawned on port 0;
//! - [`Upstream`]: an in-process HTTP peer on 127.0.0.1:0 standing upstream of the
//!   gateway, either a *recording hop* that forwards to the real modern server, or a
//!   *scripted* modern server for behaviour the notes server cannot produce (holding a
//!   request open, going down, URL elicitation, subscriptions). Every request the
//!   gateway sends it is validated against the 2026-07-28 schema;
//! - [`Legacy`]: a legacy Streamable HTTP host (2025-03-26 … 2025-11-25). Every message
//!   it receives from the gateway is validated against the 2025-11-25 schema.
//!
//! Each test file uses a different subset of these helpers.
#![allow(dead_code, unreachable_pub)]

pub mod replicas;
pub mod schema;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// The body type of the upstream peer's responses.
pub type UpBody = BoxBody<Bytes, BoxError>;

fn full(bytes: impl Into<Bytes>) -> UpBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A response body fed frame by frame from a channel.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|m| m.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// Why the upstream peer dropped a connection.
#[derive(Debug)]
struct UpError(String);

impl std::fmt::Display for UpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UpError {}

fn up_err(e: impl std::fmt::Display) -> UpError {
    UpError(e.to_string())
}

// One definition of each, shared with the server's harness (`tests/common`).
pub(crate) use super::{CAPS, CLIENT_INFO, PV, REPO_FILES, SERVER_INFO, WAIT};
/// The modern revision.
pub const MODERN: &str = super::VERSION;
/// The legacy revisions the gateway serves over Streamable HTTP.
pub const REVISIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const STATE_SECRET: &str = "gateway-acceptance-secret-0123456789abcdef";

/// Instantiates `async fn name(rev: &str)` once per legacy revision:
/// `name::v2025_11_25`, `name::v2025_06_18`, `name::v2025_03_26`.
#[macro_export]
macro_rules! per_revision {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn v2025_11_25() {
                    super::$name("2025-11-25").await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn v2025_06_18() {
                    super::$name("2025-06-18").await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn v2025_03_26() {
                    super::$name("2025-03-26").await
                }
            }
        )+
    };
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `within`.
pub async fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------
// Workspace and processes
// ---------------------------------------------------------------------------------

/// A temp dir with config, store, notes workspace and repository; removed on drop.
#[derive(Debug)]
pub struct Workspace {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub notes_uri: String,
    pub repo: PathBuf,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Workspace {
    /// A workspace whose config has these `[gateway]` entries (`key`, TOML value), with
    /// the response cache off: these tests count what reaches the upstream.
    pub fn new(gateway: &[(&str, &str)]) -> Self {
        Self::with_cache(gateway, &[("enabled", "false")])
    }

    /// A workspace with these `[gateway]` and `[cache]` entries.
    pub fn with_cache(gateway: &[(&str, &str)], cache: &[(&str, &str)]) -> Self {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dualera-gw");
        std::fs::create_dir_all(&base).expect("tmp base");
        let base = std::fs::canonicalize(&base).expect("canonical tmp base");
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("g{}-{n}-{nanos}", std::process::id()));
        let repo = dir.join("repo");
        for (rel, text) in REPO_FILES {
            let p = repo.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, text).expect("write repo file");
        }
        std::fs::create_dir_all(dir.join("notes")).expect("mkdir notes");
        let notes_uri = format!("file://{}", dir.join("notes").display());
        let config = dir.join("dualera.toml");
        let mut text = format!(
            "[store]\npath = {:?}\n\n[[state.keys]]\nid = \"gw-1\"\nsecret = {STATE_SECRET:?}\n\n\
             [[grants]]\nprincipal = \"local\"\nworkspaces = [{notes_uri:?}]\nrepositories = [{:?}]\n\n[gateway]\n",
            dir.join("store.db").display().to_string(),
            repo.display().to_string(),
        );
        for (k, v) in gateway {
            text.push_str(&format!("{k} = {v}\n"));
        }
        text.push_str("\n[cache]\n");
        for (k, v) in cache {
            text.push_str(&format!("{k} = {v}\n"));
        }
        std::fs::write(&config, text).expect("write config");
        Self {
            dir,
            config,
            notes_uri,
            repo,
        }
    }

    /// The directory that contains the notes workspace, as a `file:` URI (a root that
    /// selects the workspace).
    pub fn notes_parent_uri(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A spawned `dualera` process, killed on drop.
pub struct Proc {
    child: Child,
    /// The MCP endpoint it printed.
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc").field("url", &self.url).finish()
    }
}

impl Proc {
    /// Spawns `dualera ARGS` and waits for the line containing `marker`, whose last
    /// word is the endpoint URL.
    pub fn spawn(args: &[&str], marker: &str) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dualera"));
        cmd.args(args);
        Self::spawn_command(cmd, args, marker)
    }

    /// Runs `script` with `sh -c` (it should `exec` dualera, e.g. after `ulimit`).
    pub fn spawn_shell(script: &str, marker: &str) -> Self {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Self::spawn_command(cmd, &[script], marker)
    }

    fn spawn_command(cmd: Command, args: &[&str], marker: &str) -> Self {
        let level = std::env::var("DUALERA_TEST_LOG").unwrap_or_else(|_| "warn".into());
        Self::spawn_logging(cmd, args, marker, &level)
    }

    fn spawn_logging(mut cmd: Command, args: &[&str], marker: &str, level: &str) -> Self {
        let mut child = cmd
            .env("DUALERA_LOG", level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dualera");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let sink = log.clone();
        // Keeps draining stderr for the process's whole life.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if std::env::var_os("DUALERA_TEST_LOG").is_some() {
                    eprintln!("[dualera] {line}");
                }
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + WAIT;
        let url = tokio::task::block_in_place(|| loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(marker) => {
                    break line
                        .split_whitespace()
                        .last()
                        .unwrap_or_default()
                        .to_owned()
                }
                Ok(_) => {}
                Err(_) => panic!(
                    "dualera {args:?} did not print {marker:?}; stderr: {:?}",
                    log.lock().unwrap()
                ),
            }
        });
        assert!(
            !tls() || url.starts_with("https://"),
            "dualera {args:?} announced {url}, expected an https URL"
        );
        Self { child, url, log }
    }

    /// `dualera serve --config <ws> --listen 127.0.0.1:0` (with TLS in the TLS run).
    pub fn serve(ws: &Workspace) -> Self {
        let config = ws.config.display().to_string();
        let mut args: Vec<String> = ["serve", "--config", &config, "--listen", "127.0.0.1:0"]
            .map(String::from)
            .to_vec();
        args.extend(listener_tls_args());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn(&refs, "modern server listening on")
    }

    /// `dualera gateway --upstream <url> --config <ws> --listen 127.0.0.1:0` (in the TLS
    /// run: a TLS listener and `--upstream-ca` with the test CA).
    pub fn gateway(upstream: &str, ws: &Workspace) -> Self {
        Self::gateway_with(upstream, ws, &[])
    }

    /// [`Self::gateway`] with extra arguments.
    pub fn gateway_with(upstream: &str, ws: &Workspace, extra: &[&str]) -> Self {
        let config = ws.config.display().to_string();
        let args = gateway_args(upstream, &config, extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn(&refs, "gateway listening on")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process with SIGTERM (a clean shutdown); whether it exited within
    /// `WAIT` (it is killed otherwise).
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// [`Proc::gateway`] logging at `level` (`DUALERA_LOG`), for tests that read its log,
    /// with an admin listener ([`admin_url`]).
    pub fn gateway_logging(upstream: &str, ws: &Workspace, level: &str) -> Self {
        let config = ws.config.display().to_string();
        let args = gateway_args(upstream, &config, &["--admin", "127.0.0.1:0"]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dualera"));
        cmd.args(&refs);
        Self::spawn_logging(cmd, &refs, "gateway listening on", level)
    }

    /// What the process wrote on stderr so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The admin listener's URL, as the gateway printed it (`--admin`).
    pub fn admin_url(&self) -> String {
        self.log()
            .iter()
            .find_map(|l| l.split("admin listening on ").nth(1))
            .map(|u| u.trim().to_owned())
            .unwrap_or_else(|| panic!("no admin URL in {:?}", self.log()))
    }

    /// `host:port` of the endpoint.
    pub fn authority(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches("/mcp")
            .to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------
// Plain HTTP client helpers
// ---------------------------------------------------------------------------------

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for the gateway and the servers: plain HTTP, or (in the TLS run) HTTPS
/// trusting the test CA, HTTP/2 when the server offers it.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(https_connector())
}

fn https_connector() -> HttpsConnector<HttpConnector> {
    let tls = if tls() {
        (*pki().client).clone()
    } else {
        rustls::ClientConfig::builder_with_provider(dualera::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
    };
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build()
}

// ---------------------------------------------------------------------------------
// TLS: the `gateway_tls` test binary runs this whole harness over TLS on both hops
// ---------------------------------------------------------------------------------

/// Whether this test binary runs over TLS (host → gateway → upstream all HTTPS).
pub fn tls() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_tls")
}

/// The scheme of every URL in this run.
pub fn scheme() -> &'static str {
    if tls() {
        "https"
    } else {
        "http"
    }
}

/// A private CA and one certificate for `127.0.0.1`/`localhost` signed by it, made
/// once per test binary (rcgen) and written to a temp dir.
pub struct TestPki {
    pub ca_pem: String,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client: Arc<rustls::ClientConfig>,
    pub server: Arc<rustls::ServerConfig>,
    pub authority: dualera::tls::ThrowawayCa,
}

/// Server config (ALPN h2, http/1.1) for a PEM chain and key.
pub fn server_config(cert_pem: &str, key_pem: &str) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("cert PEM");
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
    let mut c = rustls::ServerConfig::builder_with_provider(dualera::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(c)
}

/// Client config trusting only `ca_pem`.
pub fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA added");
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(dualera::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

pub fn pki() -> &'static TestPki {
    static PKI: std::sync::OnceLock<TestPki> = std::sync::OnceLock::new();
    PKI.get_or_init(|| {
        let authority = dualera::tls::ThrowawayCa::new("dualera test CA").expect("CA");
        let (cert_pem, key_pem) = authority
            .issue(&["127.0.0.1", "localhost"], dualera::tls::Validity::Current)
            .expect("leaf");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("dualera-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write pki file");
            p
        };
        let ca_pem = authority.cert_pem().to_owned();
        TestPki {
            ca: write("ca.pem", &ca_pem),
            cert: write("cert.pem", &cert_pem),
            key: write("key.pem", &key_pem),
            client: client_config(&ca_pem),
            server: server_config(&cert_pem, &key_pem),
            ca_pem,
            authority,
        }
    })
}

/// The `--tls-cert/--tls-key` arguments of this run (none without TLS).
fn listener_tls_args() -> Vec<String> {
    if !tls() {
        return Vec::new();
    }
    let p = pki();
    vec![
        "--tls-cert".into(),
        p.cert.display().to_string(),
        "--tls-key".into(),
        p.key.display().to_string(),
    ]
}

/// One raw HTTP exchange with its whole body.
#[derive(Debug, Clone)]
pub struct RawReply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl RawReply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "HTTP {} body is not JSON ({e}): {:?}",
                self.status, self.body
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends one request and reads the whole answer.
pub async fn raw(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> RawReply {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("HTTP exchange timed out")
        .expect("HTTP exchange failed");
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("reading the body timed out")
        .expect("reading the body failed")
        .to_bytes();
    RawReply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// A 2026-07-28 request body with `_meta` (protocolVersion, capabilities, clientInfo).
pub fn modern_request(id: Value, method: &str, params: Value, caps: Value) -> Value {
    let mut params = params;
    if !params.is_object() {
        params = json!({});
    }
    params["_meta"] = json!({
        PV: MODERN,
        CAPS: caps,
        CLIENT_INFO: {"name": "gateway-acceptance", "version": "1.0.0"},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// The headers a 2026-07-28 client sends for `body`.
pub fn modern_headers(body: &Value) -> Vec<(String, String)> {
    let mut h = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        (
            "accept".to_owned(),
            "application/json, text/event-stream".to_owned(),
        ),
        ("mcp-protocol-version".to_owned(), MODERN.to_owned()),
    ];
    if let Some(m) = body["method"].as_str() {
        h.push(("mcp-method".into(), m.into()));
        let name = match m {
            "tools/call" | "prompts/get" => body.pointer("/params/name"),
            "resources/read" => body.pointer("/params/uri"),
            _ => None,
        };
        if let Some(n) = name.and_then(Value::as_str) {
            h.push(("mcp-name".into(), n.into()));
        }
    }
    h
}

/// Posts a modern request (with its mirrored headers) and returns the raw answer.
pub async fn modern_post(client: &HttpClient, url: &str, body: &Value) -> RawReply {
    let h = modern_headers(body);
    let refs: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    raw(
        client,
        Method::POST,
        url,
        &refs,
        serde_json::to_vec(body).unwrap(),
    )
    .await
}

/// Calls a tool on a modern endpoint with full capabilities; returns the result.
pub async fn modern_tool(url: &str, name: &str, arguments: Value) -> Value {
    let body = modern_request(
        json!("direct"),
        "tools/call",
        json!({"name": name, "arguments": arguments}),
        json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}}),
    );
    let r = modern_post(&http_client(), url, &body).await;
    let v = r.json();
    assert!(v.get("result").is_some(), "{name} failed: {v}");
    v["result"].clone()
}

/// Creates a note directly on the modern server; returns its id.
pub async fn seed_note(server_url: &str, ws: &Workspace, title: &str, body: &str) -> String {
    let r = modern_tool(
        server_url,
        "notes_create",
        json!({"workspaceUri": ws.notes_uri, "title": title, "body": body}),
    )
    .await;
    r.pointer("/structuredContent/note/id")
        .or_else(|| r.pointer("/structuredContent/id"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("notes_create result without an id: {r}"))
        .to_owned()
}

/// How many notes titled `title` the modern server holds in the workspace.
pub async fn count_notes(server_url: &str, ws: &Workspace, title: &str) -> usize {
    let r = modern_tool(
        server_url,
        "notes_list",
        json!({"workspaceUri": ws.notes_uri}),
    )
    .await;
    r.pointer("/structuredContent/notes")
        .and_then(Value::as_array)
        .map_or(0, |a| a.iter().filter(|n| n["title"] == title).count())
}

// ---------------------------------------------------------------------------------
// The upstream peer: recording hop or scripted modern server
// ---------------------------------------------------------------------------------

/// One request the gateway sent upstream.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub id: Value,
    pub body: Value,
    pub raw: Bytes,
    pub headers: HeaderMap,
    /// The HTTP version the gateway used.
    pub version: http::Version,
    /// The upstream's answer, when it was a plain JSON body (recording hop).
    pub answer: Option<Value>,
}

impl Seen {
    pub fn meta(&self) -> &Value {
        &self.body["params"]["_meta"]
    }
    pub fn params(&self) -> &Value {
        &self.body["params"]
    }
}

/// What a scripted upstream answers.
#[derive(Debug)]
pub enum Script {
    /// A JSON body (one JSON-RPC response).
    Json(Value),
    /// An SSE stream: these messages, then the stream stays open (SSE comments every
    /// 100 ms) fed by [`Upstream::push`] until a response is sent or the gateway closes it.
    Stream(Vec<Value>),
    /// The connection is dropped without an answer.
    Fail,
    /// This answer, after a pause.
    Delayed(Duration, Box<Script>),
    /// A JSON body with this HTTP status (how an HTTP server sends a JSON-RPC error).
    Status(StatusCode, Value),
}

type Handler = Arc<dyn Fn(&Seen) -> Script + Send + Sync>;

#[derive(Default)]
struct UpState {
    seen: Mutex<Vec<Seen>>,
    closed: Mutex<Vec<Value>>,
    finished: Mutex<Vec<Value>>,
    feeds: Mutex<HashMap<String, mpsc::UnboundedSender<Value>>>,
    violations: Mutex<Vec<String>>,
    down: AtomicBool,
    validated: AtomicUsize,
    /// A pause before the recording hop forwards a request (chosen per request).
    delay: Mutex<Option<Delay>>,
    /// A pause between the response head the recording hop sends at once (an SSE
    /// stream) and the answer it forwards as that stream's event (chosen per request).
    stream_delay: Mutex<Option<Delay>>,
    connections: AtomicUsize,
    raw: Mutex<Vec<u8>>,
    conn_tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

/// Picks the pause before the recording hop forwards a request, if any.
type Delay = Arc<dyn Fn(&Seen) -> Option<Duration> + Send + Sync>;

/// An accepted socket that keeps a copy of the first bytes it reads.
struct Recorded {
    inner: tokio::net::TcpStream,
    st: Arc<UpState>,
}

impl tokio::io::AsyncRead for Recorded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let mut raw = self.st.raw.lock().unwrap();
        if raw.len() < 65536 {
            raw.extend_from_slice(&buf.filled()[before..]);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Recorded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An HTTP peer upstream of the gateway (see the module docs).
pub struct Upstream {
    pub url: String,
    state: Arc<UpState>,
    task: tokio::task::JoinHandle<()>,
    /// What [`Upstream::restart`] needs to serve again on the same address.
    serving: Serving,
}

/// How an upstream peer serves: address, script or target, TLS.
#[derive(Clone)]
struct Serving {
    addr: std::net::SocketAddr,
    handler: Option<Handler>,
    target: Option<Uri>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("url", &self.url).finish()
    }
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Upstream {
    /// A recording hop in front of `target` (the real modern server).
    pub async fn hop(target: &str) -> Self {
        let target: Uri = target.parse().expect("target URI");
        Self::start(None, Some(target)).await
    }

    /// A scripted modern server.
    pub async fn scripted(handler: impl Fn(&Seen) -> Script + Send + Sync + 'static) -> Self {
        Self::start(Some(Arc::new(handler)), None).await
    }

    /// A scripted modern server serving TLS with `tls` (whatever the run), e.g. with
    /// a certificate the gateway must refuse.
    pub async fn scripted_tls(
        tls: Arc<rustls::ServerConfig>,
        handler: impl Fn(&Seen) -> Script + Send + Sync + 'static,
    ) -> Self {
        Self::start_with(Some(Arc::new(handler)), None, Some(tls)).await
    }

    async fn start(handler: Option<Handler>, target: Option<Uri>) -> Self {
        let tls = tls().then(|| pki().server.clone());
        Self::start_with(handler, target, tls).await
    }

    async fn start_with(
        handler: Option<Handler>,
        target: Option<Uri>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        tokio::task::block_in_place(schema::warm_up);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(UpState::default());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let serving = Serving {
            addr,
            handler,
            target,
            acceptor: tls.map(tokio_rustls::TlsAcceptor::from),
        };
        let task = Self::accept(listener, state.clone(), serving.clone());
        Self {
            url: format!("{scheme}://{addr}/mcp"),
            state,
            task,
            serving,
        }
    }

    /// The accept loop: every connection served by [`serve_one`] in a task of its own
    /// (kept, so that [`Upstream::stop`] can close it).
    fn accept(
        listener: tokio::net::TcpListener,
        st: Arc<UpState>,
        serving: Serving,
    ) -> tokio::task::JoinHandle<()> {
        let Serving {
            handler,
            target,
            acceptor,
            ..
        } = serving;
        let client = http_client();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                st.connections.fetch_add(1, Ordering::SeqCst);
                let stream = Recorded {
                    inner: stream,
                    st: st.clone(),
                };
                let conns = st.conn_tasks.clone();
                let st = st.clone();
                let handler = handler.clone();
                let target = target.clone();
                let client = client.clone();
                let svc = service_fn(move |req: Request<Incoming>| {
                    let st = st.clone();
                    let handler = handler.clone();
                    let target = target.clone();
                    let client = client.clone();
                    async move { serve_one(st, handler, target, client, req).await }
                });
                let acceptor = acceptor.clone();
                let conn = tokio::spawn(async move {
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match acceptor {
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(acceptor) => {
                            let Ok(tls) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
                        }
                    }
                });
                let mut conns = conns.lock().unwrap();
                conns.retain(|c| !c.is_finished());
                conns.push(conn.abort_handle());
            }
        })
    }

    /// Goes away as a crashed instance does: the listener is closed (new connections
    /// are refused) and every open connection is dropped.
    pub fn stop(&self) {
        self.task.abort();
        for c in self.state.conn_tasks.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// [`Upstream::stop`], returning once the address refuses connections (the
    /// accept loop's abort lands at its next await, so a connection it accepted just
    /// before may have started a task `stop` did not see: those are aborted too).
    pub async fn stopped(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(self.serving.addr)
            .await
            .is_ok()
        {
            assert!(
                Instant::now() < deadline,
                "the stopped upstream still accepts"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for c in self.state.conn_tasks.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// Serves again on the same address, after [`Upstream::stop`].
    pub async fn restart(&mut self) {
        let mut listener = None;
        for _ in 0..100 {
            match tokio::net::TcpListener::bind(self.serving.addr).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let listener = listener.expect("bind the stopped upstream's address again");
        self.task = Self::accept(listener, self.state.clone(), self.serving.clone());
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// The first bytes received on any connection (up to 64 KiB), as sent: over TLS
    /// this is ciphertext.
    pub fn raw_received(&self) -> Vec<u8> {
        self.state.raw.lock().unwrap().clone()
    }

    fn check(&self) {
        let v = self.state.violations.lock().unwrap();
        assert!(
            v.is_empty(),
            "the gateway sent invalid upstream traffic:\n{}",
            v.join("\n")
        );
    }

    /// Every request seen so far (panics if any of them was invalid).
    pub fn seen(&self) -> Vec<Seen> {
        self.check();
        self.state.seen.lock().unwrap().clone()
    }

    /// Requests seen with this method.
    pub fn seen_method(&self, method: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method)
            .collect()
    }

    /// How many upstream messages were schema-validated.
    pub fn validated(&self) -> usize {
        self.state.validated.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests of `method` were seen; returns them.
    pub async fn wait_method(&self, method: &str, n: usize) -> Vec<Seen> {
        eventually(WAIT, &format!("{n} upstream {method} request(s)"), || {
            let s = self.seen_method(method);
            (s.len() >= n).then_some(s)
        })
        .await
    }

    /// Whether the held stream of upstream request `id` was closed by the gateway.
    pub fn was_closed(&self, id: &Value) -> bool {
        self.state.closed.lock().unwrap().contains(id)
    }

    /// Whether the held stream of upstream request `id` ended with its response.
    pub fn was_finished(&self, id: &Value) -> bool {
        self.state.finished.lock().unwrap().contains(id)
    }

    /// Waits until the held stream of upstream request `id` is open and can
    /// take [`Upstream::push`]. A request is recorded as seen before its
    /// script runs, so seeing it does not mean its stream is held yet.
    pub async fn wait_held(&self, id: &Value) {
        eventually(
            WAIT,
            &format!("the held stream of upstream request {id}"),
            || {
                let held = self.state.feeds.lock().unwrap().contains_key(&id_key(id));
                held.then_some(())
            },
        )
        .await;
    }

    /// Waits until the gateway closed the held stream of upstream request `id`.
    pub async fn wait_closed(&self, id: &Value) {
        eventually(
            WAIT,
            &format!("the gateway to close upstream request {id}"),
            || self.was_closed(id).then_some(()),
        )
        .await;
    }

    /// Sends `msg` on the held stream of upstream request `id`.
    pub fn push(&self, id: &Value, msg: Value) {
        let tx = self.state.feeds.lock().unwrap().get(&id_key(id)).cloned();
        let tx = tx.unwrap_or_else(|| panic!("no open upstream stream for {id}"));
        tx.send(msg).expect("stream task alive");
    }

    /// Ends the held stream of upstream request `id` without a response (the
    /// upstream went away mid-request).
    pub fn end(&self, id: &Value) {
        self.push(id, Value::Null);
    }

    /// Makes the recording hop pause before forwarding the requests `delay` picks.
    pub fn set_delay(&self, delay: impl Fn(&Seen) -> Option<Duration> + Send + Sync + 'static) {
        *self.state.delay.lock().unwrap() = Some(Arc::new(delay));
    }

    /// Makes the recording hop answer the requests `delay` picks with an SSE stream at
    /// once, and forward them only after the pause, their answer that stream's event:
    /// an upstream that accepted a request and works on it.
    pub fn set_stream_delay(
        &self,
        delay: impl Fn(&Seen) -> Option<Duration> + Send + Sync + 'static,
    ) {
        *self.state.stream_delay.lock().unwrap() = Some(Arc::new(delay));
    }

    /// While down, every connection is dropped without an answer.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
        if !std::thread::panicking() {
            self.check();
        }
    }
}

/// The recording hop's copy of a request for its target: the same headers but `Host`.
fn forwarded(
    target: &Uri,
    headers: &http::HeaderMap,
    raw: Bytes,
) -> Result<Request<Full<Bytes>>, UpError> {
    let mut b = Request::builder().method(Method::POST).uri(target.clone());
    for (k, v) in headers {
        if k != header::HOST {
            b = b.header(k, v);
        }
    }
    if let Some(a) = target.authority() {
        b = b.header(header::HOST, a.as_str());
    }
    b.body(Full::new(raw)).map_err(up_err)
}

fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

async fn serve_one(
    st: Arc<UpState>,
    handler: Option<Handler>,
    target: Option<Uri>,
    client: HttpClient,
    req: Request<Incoming>,
) -> Result<Response<UpBody>, UpError> {
    if st.down.load(Ordering::SeqCst) {
        return Err(UpError("upstream is down".into()));
    }
    let (parts, body) = req.into_parts();
    let raw = body.collect().await.map_err(up_err)?.to_bytes();
    let body: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => {
            st.violations
                .lock()
                .unwrap()
                .push(format!("upstream body is not JSON ({e}): {raw:?}"));
            return Ok(json_response(StatusCode::BAD_REQUEST, &json!({})));
        }
    };
    // Schema and mirrored headers.
    let mut problems = Vec::new();
    if let Err(e) = schema::check_upstream(&body) {
        problems.push(e);
    }
    let hv = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if parts.method != Method::POST {
        problems.push(format!(
            "upstream request with HTTP method {}",
            parts.method
        ));
    }
    if hv("mcp-protocol-version").as_deref()
        != body
            .pointer("/params/_meta")
            .and_then(|m| m.get(PV))
            .and_then(Value::as_str)
    {
        problems.push(format!(
            "MCP-Protocol-Version header {:?} does not mirror _meta: {body}",
            hv("mcp-protocol-version")
        ));
    }
    if hv("mcp-method").as_deref() != body["method"].as_str() {
        problems.push(format!(
            "Mcp-Method header {:?} does not mirror the body: {body}",
            hv("mcp-method")
        ));
    }
    if !hv("accept")
        .is_some_and(|a| a.contains("application/json") && a.contains("text/event-stream"))
    {
        problems.push(format!(
            "Accept header {:?} must list application/json and text/event-stream",
            hv("accept")
        ));
    }
    if hv("mcp-session-id").is_some() {
        problems.push("a session id was sent upstream".into());
    }
    if tls() && parts.version != http::Version::HTTP_2 {
        problems.push(format!(
            "the upstream offered h2 by ALPN but the gateway spoke {:?}",
            parts.version
        ));
    }
    st.validated.fetch_add(1, Ordering::SeqCst);
    if !problems.is_empty() {
        st.violations.lock().unwrap().extend(problems);
    }
    let method = body["method"].as_str().unwrap_or_default().to_owned();
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    let mut seen = Seen {
        method,
        id: id.clone(),
        body,
        raw: raw.clone(),
        headers: parts.headers.clone(),
        version: parts.version,
        answer: None,
    };
    if let Some(target) = target {
        let stream_delay = st.stream_delay.lock().unwrap().clone();
        if let Some(pause) = stream_delay.and_then(|d| d(&seen)) {
            st.seen.lock().unwrap().push(seen);
            let (tx, rx) = mpsc::channel::<Bytes>(4);
            tokio::spawn(async move {
                tokio::time::sleep(pause).await;
                let Ok(req) = forwarded(&target, &parts.headers, raw) else {
                    return;
                };
                let Ok(resp) = client.request(req).await else {
                    return;
                };
                let is_sse = is_event_stream(resp.headers());
                let Ok(bytes) = resp.into_body().collect().await.map(|b| b.to_bytes()) else {
                    return;
                };
                let event = if is_sse {
                    bytes
                } else {
                    let text = String::from_utf8_lossy(&bytes).replace('\n', "");
                    Bytes::from(format!("event: message\ndata: {text}\n\n"))
                };
                let _ = tx.send(event).await;
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(ChannelBody(rx).boxed())
                .map_err(up_err);
        }
        let delay = st.delay.lock().unwrap().clone();
        if let Some(pause) = delay.and_then(|d| d(&seen)) {
            tokio::time::sleep(pause).await;
        }
        let resp = client
            .request(forwarded(&target, &parts.headers, raw)?)
            .await
            .map_err(up_err)?;
        let (rparts, rbody) = resp.into_parts();
        let is_sse = is_event_stream(&rparts.headers);
        if is_sse {
            st.seen.lock().unwrap().push(seen);
            return Ok(Response::from_parts(
                rparts,
                rbody.map_err(|e| -> BoxError { Box::new(e) }).boxed(),
            ));
        }
        let bytes = rbody.collect().await.map_err(up_err)?.to_bytes();
        seen.answer = serde_json::from_slice(&bytes).ok();
        st.seen.lock().unwrap().push(seen);
        return Ok(Response::from_parts(rparts, full(bytes)));
    }
    st.seen.lock().unwrap().push(seen.clone());
    let handler = handler.expect("a scripted upstream has a handler");
    let mut script = handler(&seen);
    while let Script::Delayed(pause, then) = script {
        tokio::time::sleep(pause).await;
        script = *then;
    }
    match script {
        Script::Delayed(..) => unreachable!("unwrapped above"),
        Script::Json(v) => Ok(json_response(StatusCode::OK, &v)),
        Script::Status(status, v) => Ok(json_response(status, &v)),
        Script::Fail => Err(UpError("scripted failure".into())),
        Script::Stream(initial) => {
            let (tx, rx) = mpsc::channel::<Bytes>(16);
            let body = ChannelBody(rx).boxed();
            let (feed_tx, mut feed_rx) = mpsc::unbounded_channel::<Value>();
            st.feeds.lock().unwrap().insert(id_key(&id), feed_tx);
            let st2 = st.clone();
            tokio::spawn(async move {
                let ended = |st: &UpState, closed: bool| {
                    st.feeds.lock().unwrap().remove(&id_key(&id));
                    if closed {
                        st.closed.lock().unwrap().push(id.clone());
                    } else {
                        st.finished.lock().unwrap().push(id.clone());
                    }
                };
                let mut queue: VecDeque<Value> = initial.into();
                loop {
                    let next = match queue.pop_front() {
                        Some(m) => Some(m),
                        None => tokio::select! {
                            m = feed_rx.recv() => m,
                            () = tokio::time::sleep(Duration::from_millis(100)) => None,
                            () = tx.closed() => { ended(&st2, true); return; }
                        },
                    };
                    if next.as_ref().is_some_and(Value::is_null) {
                        // Upstream::end: the stream stops without a response.
                        ended(&st2, false);
                        return;
                    }
                    let (bytes, last) = match &next {
                        Some(m) => (
                            Bytes::from(format!("event: message\ndata: {m}\n\n")),
                            m.get("method").is_none(),
                        ),
                        None => (Bytes::from_static(b": upstream keepalive\n\n"), false),
                    };
                    if tx.send(bytes).await.is_err() {
                        ended(&st2, true);
                        return;
                    }
                    if last {
                        ended(&st2, false);
                        return;
                    }
                }
            });
            let mut r = Response::new(body);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
            Ok(r)
        }
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response<UpBody> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    r
}

/// A `complete` result response for the scripted upstream.
pub fn complete(id: &Value, result: Value) -> Value {
    let mut result = result;
    result["resultType"] = json!("complete");
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An `input_required` response for the scripted upstream.
pub fn input_required(id: &Value, requests: Option<Value>, state: Option<&str>) -> Value {
    let mut result = json!({"resultType": "input_required"});
    if let Some(r) = requests {
        result["inputRequests"] = r;
    }
    if let Some(s) = state {
        result["requestState"] = json!(s);
    }
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The `server/discover` answer of the scripted upstream.
pub fn discover_result(id: &Value, capabilities: Value) -> Value {
    complete(
        id,
        json!({
            "supportedVersions": [MODERN],
            "capabilities": capabilities,
            "instructions": "scripted upstream",
            "_meta": {SERVER_INFO: {"name": "scripted-upstream", "version": "9.9.9"}},
        }),
    )
}

// ---------------------------------------------------------------------------------
// The legacy host
// ---------------------------------------------------------------------------------

/// One SSE event as received.
#[derive(Debug, Clone)]
pub struct SseItem {
    pub id: Option<String>,
    /// The JSON message, if the event had data.
    pub data: Option<Value>,
    /// A comment-only block (`: keepalive`).
    pub comment: bool,
}

type MethodMap = Arc<Mutex<HashMap<String, String>>>;

/// Reads an SSE response body event by event, validating every message.
pub struct SseReader {
    body: Incoming,
    buf: Vec<u8>,
    ready: VecDeque<SseItem>,
    methods: MethodMap,
    validated: Arc<AtomicUsize>,
    ended: bool,
}

/// What the next read produced.
#[derive(Debug)]
pub enum Next {
    Item(SseItem),
    End,
    Timeout,
}

impl SseReader {
    fn parse_block(block: &str) -> SseItem {
        let mut id = None;
        let mut data: Option<String> = None;
        let mut comment = true;
        for line in block.lines() {
            if line.starts_with(':') {
                continue;
            }
            comment = false;
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => id = Some(value.to_owned()),
                "data" => {
                    let d = data.get_or_insert_with(String::new);
                    if !d.is_empty() {
                        d.push('\n');
                    }
                    d.push_str(value);
                }
                _ => {}
            }
        }
        let data = data.filter(|d| !d.trim().is_empty()).map(|d| {
            serde_json::from_str(&d).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {d}"))
        });
        SseItem { id, data, comment }
    }

    /// The next event (comments included), waiting at most `within`.
    pub async fn next_within(&mut self, within: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(item) = self.ready.pop_front() {
                if let Some(d) = &item.data {
                    let methods = self.methods.clone();
                    let lookup =
                        move |id: &Value| methods.lock().unwrap().get(&id.to_string()).cloned();
                    if let Err(e) = schema::check_downstream(d, &lookup) {
                        panic!("{e}");
                    }
                    self.validated.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(id) = &item.id {
                    assert!(
                        id.split_once('.').is_some_and(
                            |(a, b)| a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok()
                        ),
                        "SSE event id {id:?} is not <stream>.<seq>"
                    );
                }
                return Next::Item(item);
            }
            if self.ended {
                return Next::End;
            }
            let frame = match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Next::Timeout,
                Ok(None) => {
                    self.ended = true;
                    continue;
                }
                Ok(Some(Err(_))) => {
                    self.ended = true;
                    continue;
                }
                Ok(Some(Ok(f))) => f,
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            self.buf.extend_from_slice(data);
            let text = String::from_utf8(self.buf.clone()).expect("SSE is UTF-8");
            let normalized = text.replace("\r\n", "\n");
            let mut rest = normalized.as_str();
            while let Some(end) = rest.find("\n\n") {
                let block = &rest[..end];
                if !block.trim().is_empty() {
                    self.ready.push_back(Self::parse_block(block));
                }
                rest = &rest[end + 2..];
            }
            self.buf = rest.as_bytes().to_vec();
        }
    }

    /// The next event with a JSON message (skipping comments and priming events);
    /// `None` when the stream ended. Panics after [`WAIT`].
    pub async fn next_message(&mut self) -> Option<Value> {
        self.next_message_item().await.map(|(_, v)| v)
    }

    /// Like [`Self::next_message`], with the event id.
    pub async fn next_message_item(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            match self.next_within(WAIT).await {
                Next::Item(SseItem {
                    data: Some(d), id, ..
                }) => return Some((id, d)),
                Next::Item(_) => {}
                Next::End => return None,
                Next::Timeout => panic!("no SSE message within {WAIT:?}"),
            }
        }
    }

    /// Reads until the stream ends; returns the messages (panics after [`WAIT`]).
    pub async fn drain(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(m) = self.next_message().await {
            out.push(m);
        }
        out
    }
}

/// What a POST or GET to the gateway returned.
pub enum Body {
    Json(Value),
    Sse(SseReader),
    Text(String),
    Empty,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Json(v) => write!(f, "Json({v})"),
            Self::Sse(_) => f.write_str("Sse(..)"),
            Self::Text(t) => write!(f, "Text({t:?})"),
            Self::Empty => f.write_str("Empty"),
        }
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Body,
}

impl Reply {
    pub fn json(self) -> Value {
        match self.body {
            Body::Json(v) => v,
            other => panic!("expected a JSON body, got HTTP {} {other:?}", self.status),
        }
    }

    pub fn sse(self) -> SseReader {
        match self.body {
            Body::Sse(s) => s,
            other => panic!("expected an SSE body, got HTTP {} {other:?}", self.status),
        }
    }

    /// The answer to a `Last-Event-ID` that names no stream of the session: 404 with
    /// `-32600`, saying so.
    pub fn assert_unresumable(self) {
        assert_eq!(self.status, StatusCode::NOT_FOUND);
        let body = self.json();
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Unknown Last-Event-ID")),
            "{body}"
        );
    }
}

/// How a live request was answered.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The final response to the legacy request.
    pub response: Value,
    /// Live requests the gateway sent on the request's stream, in order.
    pub live: Vec<Value>,
    /// Notifications seen on the stream, in order.
    pub notifications: Vec<Value>,
    /// Whether the answer came as an SSE stream.
    pub streamed: bool,
}

/// A legacy Streamable HTTP host.
pub struct Legacy {
    pub url: String,
    /// The negotiated revision (sent as `MCP-Protocol-Version` from 2025-06-18 on).
    pub version: Option<String>,
    pub session: Option<String>,
    /// An `Authorization` header value to send.
    pub auth: Option<String>,
    client: HttpClient,
    next_id: i64,
    methods: MethodMap,
    /// Messages received and validated so far.
    pub validated: Arc<AtomicUsize>,
}

/// The live-request answers of a scripted user: accept the first candidate,
/// pick two files then summarize, report no roots.
pub fn default_answer(live: &Value) -> Value {
    let id = live["id"].clone();
    let p = &live["params"];
    let result = match live["method"].as_str().unwrap_or_default() {
        "elicitation/create" => {
            let first = p
                .pointer("/requestedSchema/properties/note_id/enum/0")
                .cloned()
                .unwrap_or(Value::Null);
            if first.is_null() {
                json!({"action": "accept", "content": {}})
            } else {
                json!({"action": "accept", "content": {"note_id": first, "confirm": true}})
            }
        }
        "sampling/createMessage" => {
            let prompt = p
                .pointer("/messages/0/content/text")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let text = if prompt.contains("JSON array") {
                r#"["README.md", "src/lib.rs"]"#
            } else {
                "tinyledger is a small double-entry ledger library."
            };
            json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "scripted-host", "stopReason": "endTurn"})
        }
        "roots/list" => json!({"roots": []}),
        "ping" => json!({}),
        other => panic!("unexpected live request {other}"),
    };
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// Capabilities a legacy host of `rev` declares: everything its revision has.
pub fn full_caps(rev: &str) -> Value {
    if rev == "2025-03-26" {
        json!({"sampling": {}, "roots": {"listChanged": true}})
    } else {
        json!({"elicitation": {}, "sampling": {}, "roots": {"listChanged": true}})
    }
}

/// What the gateway must send upstream as `clientCapabilities` for [`full_caps`].
pub fn mapped_full_caps(rev: &str) -> Value {
    if rev == "2025-03-26" {
        json!({"sampling": {}, "roots": {}})
    } else {
        json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}})
    }
}

impl Legacy {
    pub fn new(url: &str) -> Self {
        // Compiling the validators takes a while in debug builds: never in the middle
        // of a session, where it would look like an idle peer.
        schema::warm_up();
        Self {
            url: url.to_owned(),
            version: None,
            session: None,
            auth: None,
            client: http_client(),
            next_id: 0,
            methods: Arc::default(),
            validated: Arc::default(),
        }
    }

    /// A new request id (numbers, as most hosts use).
    pub fn mint(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            (
                "accept".to_owned(),
                "application/json, text/event-stream".to_owned(),
            ),
        ];
        if let Some(s) = &self.session {
            h.push(("mcp-session-id".into(), s.clone()));
        }
        if let Some(v) = self.version.as_deref().filter(|v| *v != "2025-03-26") {
            h.push(("mcp-protocol-version".into(), v.to_owned()));
        }
        if let Some(a) = &self.auth {
            h.push(("authorization".into(), a.clone()));
        }
        h
    }

    /// Sends one HTTP request with the session's headers (plus `extra`, which replace
    /// same-named ones; an empty value removes the header).
    pub async fn send(
        &self,
        method: Method,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> Reply {
        let mut headers = self.headers();
        for (k, v) in extra {
            headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
            if !v.is_empty() {
                headers.push(((*k).to_owned(), (*v).to_owned()));
            }
        }
        let mut b = Request::builder().method(method).uri(&self.url);
        for (k, v) in &headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let bytes = body
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let req = b.body(Full::new(Bytes::from(bytes))).unwrap();
        let resp = tokio::time::timeout(WAIT, self.client.request(req))
            .await
            .expect("gateway did not answer in time")
            .expect("HTTP exchange with the gateway failed");
        let (parts, body) = resp.into_parts();
        let ctype = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = if ctype.starts_with("text/event-stream") {
            Body::Sse(SseReader {
                body,
                buf: Vec::new(),
                ready: VecDeque::new(),
                methods: self.methods.clone(),
                validated: self.validated.clone(),
                ended: false,
            })
        } else {
            let bytes = tokio::time::timeout(WAIT, body.collect())
                .await
                .expect("body timed out")
                .expect("body failed")
                .to_bytes();
            if bytes.is_empty() {
                Body::Empty
            } else if ctype.starts_with("application/json") {
                let v: Value = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("gateway JSON body is not JSON ({e}): {bytes:?}"));
                let methods = self.methods.clone();
                let lookup =
                    move |id: &Value| methods.lock().unwrap().get(&id.to_string()).cloned();
                if let Err(e) = schema::check_downstream(&v, &lookup) {
                    panic!("{e}");
                }
                self.validated.fetch_add(1, Ordering::SeqCst);
                Body::Json(v)
            } else {
                Body::Text(String::from_utf8_lossy(&bytes).into_owned())
            }
        };
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// POSTs raw bytes with the session's headers (for bodies a `Value` cannot hold,
    /// such as duplicate member names); the answer is not validated.
    pub async fn post_raw(&self, body: impl Into<Bytes>) -> RawReply {
        let headers = self.headers();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        raw(&self.client, Method::POST, &self.url, &headers, body).await
    }

    /// POSTs one JSON-RPC message (or batch).
    pub async fn post(&self, msg: &Value) -> Reply {
        self.send(Method::POST, Some(msg), &[]).await
    }

    /// Remembers the method of a request id so its response can be validated.
    pub fn expect_response(&self, id: &Value, method: &str) {
        self.methods
            .lock()
            .unwrap()
            .insert(id.to_string(), method.to_owned());
    }

    /// POSTs a request with id `id`.
    pub async fn request_with_id(&mut self, id: Value, method: &str, params: Value) -> Reply {
        self.expect_response(&id, method);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.post(&msg).await
    }

    /// POSTs a request with a fresh id; returns the id and the reply.
    /// Calls `notes_delete` for `title` in `ws` and reads the round's first message,
    /// the elicitation: the call's id, the stream the rest arrives on, the elicitation.
    pub async fn delete_round(&mut self, ws: &str, title: &str) -> (Value, SseReader, Value) {
        let (id, reply) = self
            .request(
                "tools/call",
                json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": title}}),
            )
            .await;
        let mut stream = reply.sse();
        let live = stream.next_message().await.expect("elicitation");
        (id, stream, live)
    }

    pub async fn request(&mut self, method: &str, params: Value) -> (Value, Reply) {
        let id = self.mint();
        let r = self.request_with_id(id.clone(), method, params).await;
        (id, r)
    }

    /// POSTs a notification; returns the HTTP status.
    pub async fn notify(&self, method: &str, params: Value) -> StatusCode {
        let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.post(&msg).await.status
    }

    /// `initialize` asking for `version`; on success stores the session and the
    /// negotiated version and sends `notifications/initialized`. Returns the response.
    pub async fn initialize(&mut self, version: &str, caps: Value) -> (Reply, Value) {
        let id = self.mint();
        self.expect_response(&id, "initialize");
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": version,
            "capabilities": caps,
            "clientInfo": {"name": "legacy-acceptance-host", "version": "2.0.0"},
        }});
        let mut extra: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = self.auth.as_deref() {
            extra.push(("authorization", a));
        }
        let reply = self.send(Method::POST, Some(&msg), &extra).await;
        let status = reply.status;
        let headers = reply.headers.clone();
        let response = match reply.body {
            Body::Json(v) => v,
            Body::Sse(mut s) => s.next_message().await.expect("initialize response"),
            other => panic!("initialize answered HTTP {status} {other:?}"),
        };
        let reply = Reply {
            status,
            headers: headers.clone(),
            body: Body::Empty,
        };
        if let Some(result) = response.get("result") {
            self.session = headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            self.version = result["protocolVersion"].as_str().map(str::to_owned);
            if self.session.is_some() {
                let st = self.notify("notifications/initialized", json!({})).await;
                assert_eq!(st, StatusCode::ACCEPTED, "notifications/initialized");
            }
        }
        (reply, response)
    }

    /// Opens a session on `rev` with `caps`; returns the `initialize` result.
    pub async fn open(&mut self, rev: &str, caps: Value) -> Value {
        let (reply, response) = self.initialize(rev, caps).await;
        assert_eq!(reply.status, StatusCode::OK, "{response}");
        assert!(self.session.is_some(), "no Mcp-Session-Id: {response}");
        response["result"].clone()
    }

    /// Sends a request and serves its live requests with `answer` until the response
    /// arrives (`answer` returns the full reply message to POST).
    pub async fn exchange_with(
        &mut self,
        method: &str,
        params: Value,
        answer: impl FnMut(&Value) -> Value,
    ) -> Exchange {
        let id = self.mint();
        self.exchange_with_id(id, method, params, answer).await
    }

    /// [`Self::exchange_with`] with a chosen request id.
    pub async fn exchange_with_id(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
        mut answer: impl FnMut(&Value) -> Value,
    ) -> Exchange {
        let reply = self.request_with_id(id.clone(), method, params).await;
        let mut ex = Exchange {
            response: Value::Null,
            live: Vec::new(),
            notifications: Vec::new(),
            streamed: false,
        };
        match reply.body {
            Body::Json(v) => {
                ex.response = v;
                ex
            }
            Body::Sse(mut s) => {
                ex.streamed = true;
                while let Some(m) = s.next_message().await {
                    if m.get("method").is_none() {
                        assert_eq!(
                            m["id"], id,
                            "a response for another request on this stream: {m}"
                        );
                        ex.response = m;
                        // The response is the stream's last message.
                        assert!(
                            s.next_message().await.is_none(),
                            "messages after the response"
                        );
                        return ex;
                    }
                    if m.get("id").is_some() {
                        ex.live.push(m.clone());
                        let reply = answer(&m);
                        let r = self.post(&reply).await;
                        assert_eq!(
                            r.status,
                            StatusCode::ACCEPTED,
                            "reply to a live request refused: {:?}",
                            r.body
                        );
                    } else {
                        ex.notifications.push(m);
                    }
                }
                panic!(
                    "the stream of {method} ended without a response (live {:?})",
                    ex.live
                );
            }
            other => panic!("{method} answered HTTP {} {other:?}", reply.status),
        }
    }

    /// [`Self::exchange_with`] with [`default_answer`].
    pub async fn exchange(&mut self, method: &str, params: Value) -> Exchange {
        self.exchange_with(method, params, default_answer).await
    }

    /// A request that must be answered without live requests; returns the response.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let ex = self
            .exchange_with(method, params, |m| panic!("unexpected live request {m}"))
            .await;
        ex.response
    }

    /// [`Self::call`] with a chosen request id.
    pub async fn call_with_id(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.exchange_with_id(id, method, params, |m| {
            panic!("unexpected live request {m}")
        })
        .await
        .response
    }

    /// Opens the standalone GET stream (or resumes one with `Last-Event-ID`).
    pub async fn get(&self, last_event_id: Option<&str>) -> Reply {
        let mut extra = vec![("accept", "text/event-stream")];
        if let Some(l) = last_event_id {
            extra.push(("last-event-id", l));
        }
        self.send(Method::GET, None, &extra).await
    }

    /// Ends the session with DELETE.
    pub async fn delete(&self) -> StatusCode {
        self.send(Method::DELETE, None, &[]).await.status
    }
}

/// The gateway in front of the real modern server, with a recording hop between them.
pub struct Rig {
    pub ws: Workspace,
    pub server: Proc,
    pub hop: Upstream,
    pub gateway: Proc,
}

impl Rig {
    pub async fn new(gateway: &[(&str, &str)]) -> Self {
        let ws = Workspace::new(gateway);
        let server = Proc::serve(&ws);
        let hop = Upstream::hop(&server.url).await;
        let gateway = Proc::gateway(&hop.url, &ws);
        Self {
            ws,
            server,
            hop,
            gateway,
        }
    }

    pub fn legacy(&self) -> Legacy {
        Legacy::new(&self.gateway.url)
    }

    pub async fn seed(&self, title: &str, body: &str) -> String {
        seed_note(&self.server.url, &self.ws, title, body).await
    }

    pub async fn count(&self, title: &str) -> usize {
        count_notes(&self.server.url, &self.ws, title).await
    }
}

/// The gateway in front of a scripted upstream.
pub struct Scripted {
    pub ws: Workspace,
    pub up: Upstream,
    pub gateway: Proc,
}

impl Scripted {
    /// `handler` answers everything except `server/discover`, which is answered with
    /// `capabilities`.
    pub async fn new(
        gateway: &[(&str, &str)],
        capabilities: Value,
        handler: impl Fn(&Seen) -> Script + Send + Sync + 'static,
    ) -> Self {
        Self::with_config(gateway, "", capabilities, handler).await
    }

    /// As [`Scripted::new`], with `extra` TOML appended to the workspace's config
    /// (e.g. an `[admin]` section).
    pub async fn with_config(
        gateway: &[(&str, &str)],
        extra: &str,
        capabilities: Value,
        handler: impl Fn(&Seen) -> Script + Send + Sync + 'static,
    ) -> Self {
        let ws = Workspace::new(gateway);
        if !extra.is_empty() {
            let mut config = std::fs::read_to_string(&ws.config).expect("read the config");
            config.push('\n');
            config.push_str(extra);
            std::fs::write(&ws.config, config).expect("write the config");
        }
        let up = Upstream::scripted(move |s: &Seen| {
            if s.method == "server/discover" {
                Script::Json(discover_result(&s.id, capabilities.clone()))
            } else {
                handler(s)
            }
        })
        .await;
        let gateway = Proc::gateway(&up.url, &ws);
        Self { ws, up, gateway }
    }

    pub fn legacy(&self) -> Legacy {
        Legacy::new(&self.gateway.url)
    }
}

/// `dualera gateway` arguments for `upstream` with this config (in the TLS run: a TLS
/// listener and `--upstream-ca` with the test CA), then `extra`.
fn gateway_args(upstream: &str, config: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "gateway",
        "--upstream",
        upstream,
        "--config",
        config,
        "--listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(listener_tls_args());
    if tls() {
        args.push("--upstream-ca".into());
        args.push(pki().ca.display().to_string());
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// The admin listener's URL a gateway printed.
pub fn admin_url(proc: &Proc) -> String {
    proc.log()
        .iter()
        .find_map(|l| l.split("admin listening on ").nth(1).map(str::to_owned))
        .unwrap_or_else(|| panic!("no admin URL in {:?}", proc.log()))
}

/// The sum of the samples of `name` whose labels include `labels` (Prometheus text).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (n == name).then_some((rest, value))
        })
        .filter(|(rest, _)| {
            labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v.parse::<f64>().expect("a sample value"))
        .sum()
}

/// Whether a session id is visible ASCII (0x21–0x7E) carrying at least 128 bits.
pub fn assert_session_id(id: &str) {
    assert!(
        !id.is_empty() && id.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "session id {id:?} must be visible ASCII"
    );
    assert!(
        id.bytes().all(|b| b.is_ascii_hexdigit()) && id.len() * 4 >= 128,
        "session id {id:?} must carry at least 128 random bits (hex)"
    );
}
