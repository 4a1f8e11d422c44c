//! Shared harness for the integration tests: a temporary workspace with a config
//! file, the real `dualera serve` binary spawned over HTTP (raw HTTP/1.1 over TCP) or
//! stdio (newline-delimited JSON-RPC), and request builders. Every response the
//! server sends through [`Server`] is validated against the 2026-07-28 schema.
//!
//! The gateway's harness is [`gateway`] (a test file names it
//! `use common::gateway as gateway_support;`); the Python legacy server of the
//! legacy-upstream and reverse-bridge tests is `legacy_server.rs`.
//!
//! Each test file uses a different subset of these helpers.
#![allow(dead_code)]

pub(crate) mod gateway;
pub(crate) mod pg_cluster;
pub(crate) mod schema;
pub(crate) mod tasks;

use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The only protocol version the server speaks.
pub(crate) const VERSION: &str = "2026-07-28";
pub(crate) const PV: &str = "io.modelcontextprotocol/protocolVersion";
pub(crate) const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
pub(crate) const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub(crate) const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The state-signing secret shared by every server of a fixture.
pub(crate) const STATE_SECRET: &str = "integration-test-secret-0123456789abcdef";
/// How long to wait for anything from a server (generous: loaded CI machines).
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// Which transport a server is spawned with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Http,
    Stdio,
}

/// Instantiates `fn name(kind: Kind)` as one test per transport:
/// `name::http` and `name::stdio`.
#[macro_export]
macro_rules! both_transports {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn http() {
                    super::$name($crate::common::Kind::Http)
                }
                #[test]
                fn stdio() {
                    super::$name($crate::common::Kind::Stdio)
                }
            }
        )+
    };
}

// ---------------------------------------------------------------------------------
// Fixture: temp dir, notes workspace URIs, repository, config file.
// ---------------------------------------------------------------------------------

/// Knobs for the config file a fixture writes.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `[state] ttl_ms`.
    pub(crate) ttl_ms: u64,
    /// `[[principals]]` as (name, token); empty: auth off, principal `local`.
    pub(crate) principals: Vec<(String, String)>,
    /// `[limits] max_body_bytes`.
    pub(crate) max_body_bytes: Option<usize>,
    /// `[store] url` (PostgreSQL); `None`: the fixture's SQLite file.
    pub(crate) store_url: Option<String>,
    /// `[limits] max_delete_candidates`.
    pub(crate) max_delete_candidates: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            ttl_ms: 300_000,
            principals: Vec::new(),
            max_body_bytes: None,
            store_url: None,
            max_delete_candidates: None,
        }
    }
}

/// A temporary directory holding the config, the SQLite store, the notes workspace
/// and a small repository (with a symlink that leaves it). Removed on drop.
#[derive(Debug)]
pub(crate) struct Fixture {
    pub(crate) dir: PathBuf,
    pub(crate) config_path: PathBuf,
    pub(crate) store_path: PathBuf,
    /// `file://<dir>/notes`, granted.
    pub(crate) notes_uri: String,
    /// `file://<dir>/notes2`, granted too (for the roots adapter).
    pub(crate) notes2_uri: String,
    /// `<dir>/repo`, granted.
    pub(crate) repo_dir: PathBuf,
    /// Text of `<dir>/secret.txt`, outside the repository (target of `repo/leak.txt`).
    pub(crate) secret_text: String,
    pub(crate) options: Options,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Files of the sample repository.
pub(crate) const REPO_FILES: &[(&str, &str)] = &[
    ("README.md", "# tinyledger\n\nA tiny double-entry ledger library.\n"),
    ("Cargo.toml", "[package]\nname = \"tinyledger\"\nversion = \"0.3.1\"\n"),
    (
        "src/lib.rs",
        "//! Double-entry bookkeeping.\npub fn balanced(c: &[i64]) -> bool { c.iter().sum::<i64>() == 0 }\n",
    ),
    ("docs/intro.md", "# Introduction\n\nEvery transaction must balance.\n"),
];

impl Fixture {
    pub(crate) fn new() -> Arc<Self> {
        Self::with(Options::default())
    }

    pub(crate) fn with(options: Options) -> Arc<Self> {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dualera-it");
        std::fs::create_dir_all(&base).expect("create test tmp base");
        let base = std::fs::canonicalize(&base).expect("canonicalize tmp base");
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("t{}-{}-{}", std::process::id(), n, nanos));
        std::fs::create_dir_all(&dir).expect("create fixture dir");
        let repo_dir = dir.join("repo");
        for (rel, text) in REPO_FILES {
            let p = repo_dir.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, text).expect("write repo file");
        }
        let secret_text = format!("TOP-SECRET-{n}-do-not-leak");
        std::fs::write(dir.join("secret.txt"), &secret_text).expect("write secret");
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.join("secret.txt"), repo_dir.join("leak.txt"))
            .expect("symlink");
        std::fs::create_dir_all(dir.join("notes")).expect("mkdir notes");
        let notes_uri = format!("file://{}", dir.join("notes").display());
        let notes2_uri = format!("file://{}", dir.join("notes2").display());
        let store_path = dir.join("store.db");
        let config_path = dir.join("dualera.toml");
        let fx = Self {
            dir,
            config_path,
            store_path,
            notes_uri,
            notes2_uri,
            repo_dir,
            secret_text,
            options,
        };
        std::fs::write(&fx.config_path, fx.config_text()).expect("write config");
        Arc::new(fx)
    }

    fn config_text(&self) -> String {
        self.config_text_signing_with("test-1", STATE_SECRET)
    }

    /// The fixture's configuration with another `[[state.keys]]` entry.
    pub(crate) fn config_text_signing_with(&self, key_id: &str, secret: &str) -> String {
        let mut t = String::new();
        t.push_str(&format!(
            "[store]\npath = {:?}\n",
            self.store_path.display().to_string()
        ));
        if let Some(url) = &self.options.store_url {
            t.push_str(&format!("url = {url:?}\n"));
        }
        t.push_str(&format!(
            "\n[state]\nttl_ms = {}\n\n[[state.keys]]\nid = {key_id:?}\nsecret = {secret:?}\n\n",
            self.options.ttl_ms,
        ));
        t.push_str("[limits]\n");
        if let Some(max) = self.options.max_body_bytes {
            t.push_str(&format!("max_body_bytes = {max}\n"));
        }
        if let Some(max) = self.options.max_delete_candidates {
            t.push_str(&format!("max_delete_candidates = {max}\n"));
        }
        t.push('\n');
        let mut names = vec!["local".to_owned()];
        for (name, token) in &self.options.principals {
            t.push_str(&format!(
                "[[principals]]\nname = {name:?}\ntoken = {token:?}\n\n"
            ));
            names.push(name.clone());
        }
        for name in names {
            t.push_str(&format!(
                "[[grants]]\nprincipal = {name:?}\nworkspaces = [{:?}, {:?}]\nrepositories = [{:?}]\n\n",
                self.notes_uri,
                self.notes2_uri,
                self.repo_dir.display().to_string()
            ));
        }
        t
    }

    /// A URI below the notes workspace.
    pub(crate) fn notes_path(&self, rest: &str) -> String {
        format!("{}/{rest}", self.notes_uri)
    }

    /// The token of a configured principal.
    pub(crate) fn token_of(&self, principal: &str) -> Option<String> {
        self.options
            .principals
            .iter()
            .find(|(n, _)| n == principal)
            .map(|(_, t)| t.clone())
    }

    /// Spawns a server over `kind` (principal `local`, or the first configured
    /// principal's token on HTTP when auth is on).
    pub(crate) fn spawn(self: &Arc<Self>, kind: Kind) -> Server {
        let principal = self
            .options
            .principals
            .first()
            .map_or_else(|| "local".to_owned(), |(n, _)| n.clone());
        self.spawn_as(kind, &principal)
    }

    /// Spawns a server whose requests come from `principal` (stdio: `--principal`;
    /// HTTP: that principal's bearer token when auth is on).
    pub(crate) fn spawn_as(self: &Arc<Self>, kind: Kind, principal: &str) -> Server {
        Server::spawn(self.clone(), kind, principal, &self.config_path)
    }

    /// `n` servers on the fixture's one store and one key set (with `store_url`: `n`
    /// instances on one PostgreSQL database), each its own `dualera serve` process.
    pub(crate) fn spawn_n(self: &Arc<Self>, kind: Kind, n: usize) -> Vec<Server> {
        (0..n).map(|_| self.spawn(kind)).collect()
    }

    /// A server started with another configuration file (principal `local`).
    pub(crate) fn spawn_with_config(
        self: &Arc<Self>,
        kind: Kind,
        config: &std::path::Path,
    ) -> Server {
        Server::spawn(self.clone(), kind, "local", config)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------
// Server process and its connection.
// ---------------------------------------------------------------------------------

/// What came back for one message.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// HTTP status (`None` on stdio).
    pub(crate) status: Option<u16>,
    /// HTTP response headers, names lower-cased (empty on stdio).
    pub(crate) headers: Vec<(String, String)>,
    /// The raw body (HTTP) or line (stdio; empty when no line came).
    pub(crate) raw: Vec<u8>,
    /// The JSON-RPC message, if any was sent back.
    pub(crate) json: Option<Value>,
}

impl Reply {
    /// The response message; panics when there is none.
    pub(crate) fn msg(&self) -> &Value {
        self.json
            .as_ref()
            .unwrap_or_else(|| panic!("expected a JSON-RPC response, got none ({self:?})"))
    }

    /// The `result`; panics on an error response.
    pub(crate) fn result(&self) -> &Value {
        let m = self.msg();
        m.get("result")
            .unwrap_or_else(|| panic!("expected a result, got {m}"))
    }

    /// The `error`; panics on a result.
    pub(crate) fn error(&self) -> &Value {
        let m = self.msg();
        m.get("error")
            .unwrap_or_else(|| panic!("expected an error, got {m}"))
    }

    /// The error code; panics on a result.
    pub(crate) fn code(&self) -> i64 {
        self.error()["code"].as_i64().expect("integer error code")
    }

    /// The error message, lower-cased.
    pub(crate) fn message(&self) -> String {
        self.error()["message"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase()
    }

    /// A response header.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts a JSON-RPC error with `code` (and HTTP 4xx on HTTP) and returns it.
    pub(crate) fn expect_error(&self, code: i64) -> &Value {
        assert_eq!(self.code(), code, "wrong error code: {}", self.msg());
        if let Some(s) = self.status {
            assert!(
                (400..500).contains(&s),
                "HTTP status {s} for error {}",
                self.msg()
            );
        }
        self.error()
    }

    /// The result's `requestState`.
    pub(crate) fn state(&self) -> String {
        self.result()["requestState"]
            .as_str()
            .unwrap_or_else(|| panic!("no requestState in {}", self.msg()))
            .to_owned()
    }
}

/// Extra control over one HTTP exchange.
#[derive(Debug, Clone, Default)]
pub(crate) struct HttpOpts {
    /// HTTP method (default POST).
    pub(crate) method: Option<String>,
    /// Headers replacing the derived ones (same name) or added.
    pub(crate) set: Vec<(String, String)>,
    /// Derived headers to leave out.
    pub(crate) omit: Vec<String>,
}

impl HttpOpts {
    pub(crate) fn set(mut self, name: &str, value: &str) -> Self {
        self.set.push((name.to_owned(), value.to_owned()));
        self
    }
    pub(crate) fn omit(mut self, name: &str) -> Self {
        self.omit.push(name.to_owned());
        self
    }
    pub(crate) fn method(mut self, m: &str) -> Self {
        self.method = Some(m.to_owned());
        self
    }
}

enum Conn {
    Http {
        addr: SocketAddr,
        token: Mutex<Option<String>>,
    },
    Stdio {
        stdin: Mutex<Option<ChildStdin>>,
        lines: Mutex<Receiver<Vec<u8>>>,
    },
}

/// One spawned `dualera serve` process. Killed on drop.
pub(crate) struct Server {
    pub(crate) fixture: Arc<Fixture>,
    pub(crate) kind: Kind,
    child: Mutex<Child>,
    conn: Conn,
    stderr: Arc<Mutex<Vec<String>>>,
    ids: AtomicU64,
}

impl Server {
    fn spawn(fixture: Arc<Fixture>, kind: Kind, principal: &str, config: &std::path::Path) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dualera"));
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .env_remove("DUALERA_STORE_URL")
            .env("DUALERA_LOG", "warn")
            .stderr(Stdio::piped());
        match kind {
            Kind::Http => {
                cmd.args(["--listen", "127.0.0.1:0"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null());
            }
            Kind::Stdio => {
                cmd.arg("--stdio")
                    .args(["--principal", principal])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped());
            }
        }
        let mut child = cmd.spawn().expect("spawn the dualera binary");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
        {
            let pipe = child.stderr.take().expect("stderr piped");
            let log = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        if let Some(a) = rest.strip_suffix("/mcp").and_then(|a| a.parse().ok()) {
                            let _ = addr_tx.send(a);
                        }
                    }
                    log.lock().expect("stderr log").push(line);
                }
            });
        }
        let conn = match kind {
            Kind::Http => {
                let addr = match addr_rx.recv_timeout(WAIT) {
                    Ok(a) => a,
                    Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!(
                            "server did not report its address; stderr:\n{}",
                            stderr.lock().expect("log").join("\n")
                        );
                    }
                };
                let token = fixture.token_of(principal);
                Conn::Http {
                    addr,
                    token: Mutex::new(token),
                }
            }
            Kind::Stdio => {
                let stdin = child.stdin.take().expect("stdin piped");
                let stdout = child.stdout.take().expect("stdout piped");
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(stdout);
                    loop {
                        let mut line = Vec::new();
                        match r.read_until(b'\n', &mut line) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {
                                if line.last() == Some(&b'\n') {
                                    line.pop();
                                }
                                if tx.send(line).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
                Conn::Stdio {
                    stdin: Mutex::new(Some(stdin)),
                    lines: Mutex::new(rx),
                }
            }
        };
        Self {
            fixture,
            kind,
            child: Mutex::new(child),
            conn,
            stderr,
            ids: AtomicU64::new(0),
        }
    }

    /// A fresh request id for helper traffic (strings, so they never collide with
    /// the integer ids tests choose).
    /// The listening address of an HTTP server (`None` on stdio).
    pub(crate) fn http_addr(&self) -> Option<SocketAddr> {
        match &self.conn {
            Conn::Http { addr, .. } => Some(*addr),
            Conn::Stdio { .. } => None,
        }
    }

    pub(crate) fn next_id(&self) -> Value {
        json!(format!("h-{}", self.ids.fetch_add(1, Ordering::SeqCst)))
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&self) -> bool {
        matches!(self.child.lock().expect("child").try_wait(), Ok(None))
    }

    /// What the server wrote on stderr so far.
    pub(crate) fn stderr_text(&self) -> String {
        self.stderr.lock().expect("log").join("\n")
    }

    /// Switches the bearer token used on HTTP (`None`: no Authorization header).
    pub(crate) fn set_token(&self, token: Option<&str>) {
        if let Conn::Http { token: t, .. } = &self.conn {
            *t.lock().expect("token") = token.map(str::to_owned);
        }
    }

    /// Sends one JSON-RPC message with the headers a conforming client would send,
    /// and validates the answer against the schema.
    pub(crate) fn send(&self, msg: &Value) -> Reply {
        self.send_with(msg, HttpOpts::default())
    }

    /// [`Server::send`] with HTTP header overrides (ignored on stdio).
    pub(crate) fn send_with(&self, msg: &Value, opts: HttpOpts) -> Reply {
        let body = serde_json::to_vec(msg).expect("serialize");
        let reply = self.exchange(&body, Some(msg), opts);
        if let (Some(sent), Some(got)) = (msg.get("id"), reply.json.as_ref()) {
            if sent.is_string() || sent.is_i64() || sent.is_u64() {
                if let Some(got_id) = got.get("id") {
                    assert_eq!(got_id, sent, "response id differs from request id: {got}");
                }
            }
        }
        reply
    }

    /// Sends raw bytes as one body (HTTP) or one line (stdio; the bytes must not hold a
    /// newline). Headers are derived from the bytes when they parse.
    pub(crate) fn send_raw(&self, bytes: &[u8]) -> Reply {
        self.send_raw_with(bytes, HttpOpts::default())
    }

    /// [`Server::send_raw`] with HTTP header overrides.
    pub(crate) fn send_raw_with(&self, bytes: &[u8], opts: HttpOpts) -> Reply {
        let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
        self.exchange(bytes, parsed.as_ref(), opts)
    }

    /// Sends raw bytes that must be answered (an error, typically): on stdio the next
    /// line is read as the answer, whatever the bytes look like.
    pub(crate) fn send_raw_answered(&self, bytes: &[u8]) -> Reply {
        let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
        self.exchange_expecting(bytes, parsed.as_ref(), HttpOpts::default(), true)
    }

    fn exchange(&self, body: &[u8], parsed: Option<&Value>, opts: HttpOpts) -> Reply {
        // Only something shaped like a notification (an object with a method and no
        // id) may go unanswered.
        let notification_shaped = parsed.is_some_and(|v| {
            v.is_object() && v.get("id").is_none() && v.get("method").is_some_and(Value::is_string)
        });
        self.exchange_expecting(body, parsed, opts, !notification_shaped)
    }

    fn exchange_expecting(
        &self,
        body: &[u8],
        parsed: Option<&Value>,
        opts: HttpOpts,
        expects_line: bool,
    ) -> Reply {
        let method = parsed
            .and_then(|v| v.get("method"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let reply = match &self.conn {
            Conn::Http { addr, token } => {
                let mut headers = derived_headers(parsed);
                if let Some(t) = token.lock().expect("token").as_ref() {
                    headers.push(("Authorization".into(), format!("Bearer {t}")));
                }
                headers.retain(|(n, _)| {
                    !opts.omit.iter().any(|o| o.eq_ignore_ascii_case(n))
                        && !opts.set.iter().any(|(s, _)| s.eq_ignore_ascii_case(n))
                });
                headers.extend(opts.set.iter().cloned());
                let m = opts.method.as_deref().unwrap_or("POST");
                let r = http_exchange(*addr, m, "/mcp", &headers, body);
                let json =
                    if r.body.is_empty() {
                        None
                    } else {
                        let text = String::from_utf8_lossy(&r.body);
                        let is_json = r
                            .headers
                            .iter()
                            .any(|(n, v)| n == "content-type" && v.starts_with("application/json"));
                        if is_json {
                            Some(serde_json::from_str(&text).unwrap_or_else(|e| {
                                panic!("server sent invalid JSON ({e}): {text}")
                            }))
                        } else {
                            None
                        }
                    };
                Reply {
                    status: Some(r.status),
                    headers: r.headers,
                    raw: r.body,
                    json,
                }
            }
            Conn::Stdio { .. } => {
                assert!(
                    !body.contains(&b'\n'),
                    "a stdio message cannot contain a newline"
                );
                self.stdio_exchange(body, expects_line)
            }
        };
        if let Some(j) = &reply.json {
            schema::check_response(method.as_deref(), j);
        }
        reply
    }

    fn write_line(&self, bytes: &[u8]) {
        let Conn::Stdio { stdin, .. } = &self.conn else {
            unreachable!()
        };
        let mut guard = stdin.lock().expect("stdin");
        let w = guard.as_mut().expect("stdin open");
        w.write_all(bytes).expect("write to server stdin");
        w.write_all(b"\n").expect("write newline");
        w.flush().expect("flush stdin");
    }

    fn read_line(&self) -> Option<Vec<u8>> {
        let Conn::Stdio { lines, .. } = &self.conn else {
            unreachable!()
        };
        match lines.lock().expect("lines").recv_timeout(WAIT) {
            Ok(l) => Some(l),
            Err(RecvTimeoutError::Timeout) => panic!(
                "no line from the stdio server within {WAIT:?}; stderr:\n{}",
                self.stderr_text()
            ),
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Writes one line. When `expects_line` (a request, or bytes that do not parse), the
    /// next line is the answer. Otherwise (a notification) a sentinel request follows,
    /// and every line before its answer is reported (there should be none).
    fn stdio_exchange(&self, body: &[u8], expects_line: bool) -> Reply {
        self.write_line(body);
        let mut out = Reply {
            status: None,
            headers: Vec::new(),
            raw: Vec::new(),
            json: None,
        };
        if expects_line {
            let line = self.read_line().unwrap_or_else(|| {
                panic!(
                    "stdio server closed stdout; stderr:\n{}",
                    self.stderr_text()
                )
            });
            out.json = Some(parse_line(&line));
            out.raw = line;
            return out;
        }
        let sentinel_id = format!("sentinel-{}", self.ids.fetch_add(1, Ordering::SeqCst));
        let sentinel = rpc(json!(sentinel_id), "server/discover", json!({}), json!({}));
        self.write_line(&serde_json::to_vec(&sentinel).expect("serialize"));
        loop {
            let line = self
                .read_line()
                .unwrap_or_else(|| panic!("stdio server closed stdout"));
            let v = parse_line(&line);
            if v.get("id") == Some(&json!(sentinel_id)) {
                schema::check_response(Some("server/discover"), &v);
                return out;
            }
            assert!(
                out.json.is_none(),
                "more than one line for one message: {v}"
            );
            out.json = Some(v);
            out.raw = line;
        }
    }

    // -----------------------------------------------------------------------------
    // Helpers built on send().
    // -----------------------------------------------------------------------------

    /// `tools/call` with helper id; returns the reply.
    pub(crate) fn call(&self, tool: &str, args: Value, caps: Value) -> Reply {
        self.send(&call(self.next_id(), tool, args, caps))
    }

    /// Creates a note in the notes workspace; returns its public id.
    pub(crate) fn create_note(&self, title: &str, body: &str) -> String {
        let r = self.call(
            "notes_create",
            json!({"workspaceUri": self.fixture.notes_uri, "title": title, "body": body}),
            json!({}),
        );
        let res = r.result();
        assert_eq!(res["resultType"], "complete", "{res}");
        res["structuredContent"]["id"]
            .as_str()
            .expect("created note id")
            .to_owned()
    }

    /// Seeds three "TPS report" notes, a "Standup" and an "Ideas" note.
    pub(crate) fn seed(&self) -> Seed {
        let tps = vec![
            self.create_note("TPS report", "Q3 TPS report draft: cover sheet missing."),
            self.create_note("TPS report", "TPS report for the Initech account."),
            self.create_note("TPS report", "Old TPS report template. Safe to remove."),
        ];
        let standup = self.create_note("Standup", "Monday standup notes.");
        let ideas = self.create_note("Ideas", "A roots-free workspace picker.");
        Seed {
            tps,
            standup,
            ideas,
        }
    }

    /// The notes in the notes workspace (through `notes_list`).
    pub(crate) fn notes(&self) -> Vec<Value> {
        let r = self.call(
            "notes_list",
            json!({"workspaceUri": self.fixture.notes_uri}),
            json!({}),
        );
        r.result()["structuredContent"]["notes"]
            .as_array()
            .unwrap_or_else(|| panic!("notes_list without notes: {}", r.msg()))
            .clone()
    }

    /// Ids of the notes in the notes workspace.
    pub(crate) fn note_ids(&self) -> Vec<String> {
        self.notes()
            .iter()
            .map(|n| n["id"].as_str().expect("note id").to_owned())
            .collect()
    }

    /// How many notes the notes workspace holds.
    pub(crate) fn note_count(&self) -> usize {
        self.notes().len()
    }

    /// Round 1 of `notes_delete` for `title` (form capability); returns the reply,
    /// which must be `input_required`.
    pub(crate) fn delete_round1(&self, id: Value, title: &str) -> Reply {
        let r = self.send(&call(id, "notes_delete", self.delete_args(title), form()));
        assert_eq!(r.result()["resultType"], "input_required", "{}", r.msg());
        r
    }

    /// Arguments of `notes_delete` in the notes workspace.
    pub(crate) fn delete_args(&self, title: &str) -> Value {
        json!({"workspaceUri": self.fixture.notes_uri, "title": title})
    }

    /// A `notes_delete` retry answering `delete_choice` with `answer`.
    pub(crate) fn delete_retry(&self, id: Value, title: &str, answer: Value, state: &str) -> Reply {
        self.send(&retry(
            id,
            "notes_delete",
            self.delete_args(title),
            form(),
            json!({"delete_choice": answer}),
            state,
        ))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Conn::Stdio { stdin, .. } = &self.conn {
            if let Ok(mut g) = stdin.lock() {
                g.take();
            }
        }
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            if let Ok(log) = self.stderr.lock() {
                eprintln!(
                    "--- server stderr ({:?}) ---\n{}",
                    self.kind,
                    log.join("\n")
                );
            }
        }
    }
}

/// The notes [`Server::seed`] made.
#[derive(Debug, Clone)]
pub(crate) struct Seed {
    pub(crate) tps: Vec<String>,
    pub(crate) standup: String,
    pub(crate) ideas: String,
}

fn parse_line(line: &[u8]) -> Value {
    serde_json::from_slice(line).unwrap_or_else(|e| {
        panic!(
            "stdio server wrote a line that is not JSON ({e}): {}",
            String::from_utf8_lossy(line)
        )
    })
}

/// The headers a conforming 2026-07-28 client sends for `msg`.
fn derived_headers(msg: Option<&Value>) -> Vec<(String, String)> {
    let mut h = vec![
        ("Content-Type".to_owned(), "application/json".to_owned()),
        (
            "Accept".to_owned(),
            "application/json, text/event-stream".to_owned(),
        ),
    ];
    let version = msg
        .and_then(|m| m.get("params"))
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(PV))
        .and_then(Value::as_str)
        .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .unwrap_or(VERSION);
    h.push(("MCP-Protocol-Version".to_owned(), version.to_owned()));
    if let Some(method) = msg.and_then(|m| m.get("method")).and_then(Value::as_str) {
        if method.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            h.push(("Mcp-Method".to_owned(), method.to_owned()));
        }
        let field = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
            _ => None,
        };
        if let Some(name) = field
            .and_then(|f| msg.and_then(|m| m.get("params")).and_then(|p| p.get(f)))
            .and_then(Value::as_str)
        {
            if name.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                h.push(("Mcp-Name".to_owned(), name.to_owned()));
            }
        }
    }
    h
}

// ---------------------------------------------------------------------------------
// Raw HTTP/1.1 client.
// ---------------------------------------------------------------------------------

/// One HTTP response.
#[derive(Debug, Clone)]
pub(crate) struct HttpResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// Sends one request on a fresh connection (`Connection: close`) and reads the
/// response. The body is written from another thread so that a server answering
/// early (413) is read even while the upload is still going.
pub(crate) fn http_exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> HttpResponse {
    let stream = TcpStream::connect_timeout(&addr, WAIT).expect("connect to the server");
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    stream.set_write_timeout(Some(WAIT)).expect("write timeout");
    let _ = stream.set_nodelay(true);
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut payload = head.into_bytes();
    payload.extend_from_slice(body);
    let mut writer = stream.try_clone().expect("clone stream");
    let upload = std::thread::spawn(move || {
        // The server may answer and close before reading everything (413).
        let _ = writer.write_all(&payload);
        let _ = writer.flush();
    });
    let mut reader = stream;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let response = loop {
        match reader.read(&mut chunk) {
            Ok(0) => {
                break parse_http(&buf).unwrap_or_else(|| {
                    panic!(
                        "connection closed before a full HTTP response: {:?}",
                        String::from_utf8_lossy(&buf)
                    )
                })
            }
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(r) = parse_http(&buf).filter(|r| r.1) {
                    break r;
                }
            }
            // A signal (the tests stop and start database servers) interrupts the read:
            // not a failure of the peer.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => match parse_http(&buf) {
                Some(r) if r.1 => break r,
                _ => panic!(
                    "reading the HTTP response failed ({e}); got so far: {:?}",
                    String::from_utf8_lossy(&buf)
                ),
            },
        }
    };
    drop(reader);
    let _ = upload.join();
    response.0
}

/// Parses a response; the flag says whether it is complete (Content-Length reached).
fn parse_http(buf: &[u8]) -> Option<(HttpResponse, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &buf[end + 4..];
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let (body, complete) = match length {
        Some(l) if rest.len() >= l => (rest[..l].to_vec(), true),
        Some(_) => (rest.to_vec(), false),
        None => (rest.to_vec(), false),
    };
    Some((
        HttpResponse {
            status,
            headers,
            body,
        },
        complete,
    ))
}

// ---------------------------------------------------------------------------------
// Request builders.
// ---------------------------------------------------------------------------------

/// `_meta` with the protocol version, `caps` and a clientInfo.
pub(crate) fn meta(caps: Value) -> Value {
    json!({
        PV: VERSION,
        CAPS: caps,
        CLIENT_INFO: {"name": "dualera-integration-tests", "version": "0.0.0"},
    })
}

/// A request: `params` (an object) gets `_meta` for `caps`.
pub(crate) fn rpc(id: Value, method: &str, caps: Value, params: Value) -> Value {
    let mut p: Map<String, Value> = params.as_object().cloned().unwrap_or_default();
    p.insert("_meta".into(), meta(caps));
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": p})
}

/// A notification (no id) of `method` with a proper `_meta`.
pub(crate) fn notification(method: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": {"_meta": meta(json!({}))}})
}

/// `server/discover`.
pub(crate) fn discover(id: Value) -> Value {
    rpc(id, "server/discover", json!({}), json!({}))
}

/// `tools/list`.
pub(crate) fn tools_list(id: Value) -> Value {
    rpc(id, "tools/list", json!({}), json!({}))
}

/// `tools/call`.
pub(crate) fn call(id: Value, tool: &str, args: Value, caps: Value) -> Value {
    rpc(
        id,
        "tools/call",
        caps,
        json!({"name": tool, "arguments": args}),
    )
}

/// An MRTR retry of `tools/call`: the original arguments, `inputResponses`, the
/// echoed `requestState`.
pub(crate) fn retry(
    id: Value,
    tool: &str,
    args: Value,
    caps: Value,
    responses: Value,
    state: &str,
) -> Value {
    rpc(
        id,
        "tools/call",
        caps,
        json!({"name": tool, "arguments": args, "inputResponses": responses, "requestState": state}),
    )
}

/// `{"elicitation": {"form": {}}}`.
pub(crate) fn form() -> Value {
    json!({"elicitation": {"form": {}}})
}

/// `{"sampling": {}}`.
pub(crate) fn sampling() -> Value {
    json!({"sampling": {}})
}

/// An elicitation `accept` answer.
pub(crate) fn accept(note_id: &str, confirm: bool) -> Value {
    json!({"action": "accept", "content": {"note_id": note_id, "confirm": confirm}})
}

/// A `CreateMessageResult` carrying `text`.
pub(crate) fn model_reply(text: &str) -> Value {
    json!({
        "role": "assistant",
        "content": {"type": "text", "text": text},
        "model": "host-model",
        "stopReason": "endTurn"
    })
}

/// The state with one byte in the middle changed (to another base64url character).
pub(crate) fn tamper(state: &str) -> String {
    let mut b = state.as_bytes().to_vec();
    let mid = b.len() / 2;
    b[mid] = if b[mid] == b'A' { b'B' } else { b'A' };
    String::from_utf8(b).expect("ascii state")
}
