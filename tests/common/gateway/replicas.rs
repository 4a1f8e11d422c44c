//! The real peers of the replica tests: a private `redis-server` (persistence off) and
//! HAProxy (round-robin, no stickiness; or hashing `Mcp-Session-Id`) in front of several `dualera gateway`
//! processes that share that Redis and one `dualera serve`, everything on free
//! loopback ports picked at run time, stopped on drop. Both come from Debian
//! (`tests/services/debian.sh redis-server haproxy`); a missing one fails the test.

use super::{eventually, Proc, Upstream, Workspace, WAIT};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn program(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let p = PathBuf::from(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is not installed: run `bash tests/services/debian.sh redis-server haproxy`");
}

fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A throw-away Redis on a loopback port (and, when asked, a Unix socket in its own
/// directory, mode 700), no persistence.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    with_socket: bool,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_on(false)
    }

    /// [`Self::start`], listening on [`Self::socket`] too when `with_socket`.
    pub fn start_on(with_socket: bool) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dualera-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut r = Self {
            port,
            dir,
            child: None,
            with_socket,
        };
        r.restart();
        r
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its Unix socket's path (started by [`Self::start_on`] with a socket).
    pub fn socket(&self) -> PathBuf {
        assert!(self.with_socket, "this Redis was started without a socket");
        self.dir.join("redis.sock")
    }

    /// `redis+unix:///…/redis.sock?db=0`: the same Redis over its Unix socket.
    pub fn socket_url(&self) -> String {
        format!("redis+unix://{}?db=0", self.socket().display())
    }

    /// The URL a gateway should use: over the socket when it was started with one.
    pub fn store_url(&self) -> String {
        if self.with_socket {
            self.socket_url()
        } else {
            self.url()
        }
    }

    /// Kills it (SIGKILL: nothing is saved, and there is no persistence anyway).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let mut command = Command::new(program("redis-server"));
        if self.with_socket {
            command
                .arg("--unixsocket")
                .arg(self.socket())
                .args(["--unixsocketperm", "700"]);
        }
        let child = command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &self.dir.display().to_string(),
                "--protected-mode",
                "yes",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        tokio::task::block_in_place(|| {
            let deadline = Instant::now() + WAIT;
            while self.command(&["PING"]).trim() != "+PONG" {
                assert!(
                    Instant::now() < deadline,
                    "redis-server did not answer PING"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }

    /// One command over RESP; the raw reply (`+PONG`, `:12`, `$5 …`), or "" when
    /// Redis cannot be reached.
    pub fn command(&self, args: &[&str]) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        if s.write_all(req.as_bytes()).is_err() {
            return String::new();
        }
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        // Replies here are small; read until the reply is complete enough to parse.
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if reply_complete(&out) {
                        break;
                    }
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// An integer reply (`DBSIZE`, `ZCARD`, …).
    pub fn int(&self, args: &[&str]) -> i64 {
        let r = self.command(args);
        r.trim()
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{args:?} answered {r:?}"))
    }
}

fn reply_complete(out: &[u8]) -> bool {
    let text = String::from_utf8_lossy(out);
    match out.first() {
        Some(b'+' | b'-' | b':') => text.ends_with("\r\n"),
        Some(b'$') => {
            let Some((len, rest)) = text[1..].split_once("\r\n") else {
                return false;
            };
            let len: i64 = len.parse().unwrap_or(0);
            len < 0 || rest.len() >= usize::try_from(len).unwrap_or(0) + 2
        }
        // Arrays: good enough for the few this harness reads (a short pause after).
        Some(b'*') => text.ends_with("\r\n"),
        _ => false,
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// HAProxy in front of `backends` (`host:port`): round-robin, no stickiness, unless
/// started with another [`Balance`].
/// Health checks every 300 ms and redispatch on a refused connection, as a
/// production balancer in front of replicas is set up.
pub struct HaProxy {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

/// How HAProxy picks a replica: round-robin (what the replicas need no more than), or
/// a consistent hash of `Mcp-Session-Id`, which keeps a session's requests on one
/// replica after its `initialize` (a request without the header goes round-robin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    SessionHash,
}

impl Balance {
    fn lines(self) -> &'static str {
        match self {
            Self::RoundRobin => "  balance roundrobin\n",
            Self::SessionHash => "  balance hdr(mcp-session-id)\n  hash-type consistent\n",
        }
    }
}

impl HaProxy {
    pub fn start(backends: &[String]) -> Self {
        Self::start_with(backends, Balance::RoundRobin)
    }

    pub fn start_with(backends: &[String], balance: Balance) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("dualera-haproxy-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("haproxy dir");
        let mut cfg = format!(
            "global\n  maxconn 4096\n\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  \
             timeout server 120s\n  option redispatch\n  retries 3\n\nfrontend mcp\n  bind 127.0.0.1:{port}\n  \
             default_backend gateways\n\nbackend gateways\n{}",
            balance.lines()
        );
        for (i, b) in backends.iter().enumerate() {
            cfg.push_str(&format!(
                "  server g{i} {b} check inter 300ms fall 1 rise 2\n"
            ));
        }
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, cfg).expect("write haproxy.cfg");
        let child = Command::new(program("haproxy"))
            .args(["-db", "-f", &file.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy");
        wait_listening(port, "haproxy");
        Self { port, dir, child }
    }

    /// The balanced MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Gateways sharing one Redis, behind HAProxy, in front of one modern server (through
/// a recording hop, so tests count what reached the upstream).
pub struct Cluster {
    pub ws: Workspace,
    pub redis: RedisServer,
    pub server: Proc,
    pub hop: Upstream,
    pub gateways: Vec<Option<Proc>>,
    pub lb: HaProxy,
}

impl Cluster {
    /// `n` gateways with these extra `[gateway]` entries (an `upstream_lease_ms` among
    /// them replaces the cluster's 1500).
    pub async fn start(n: usize, gateway: &[(&str, &str)]) -> Self {
        Self::start_on(n, gateway, false).await
    }

    /// [`Self::start`], the gateways reaching Redis over its Unix socket when
    /// `over_socket`, else over TCP.
    pub async fn start_on(n: usize, gateway: &[(&str, &str)], over_socket: bool) -> Self {
        Self::start_balanced(n, gateway, over_socket, Balance::RoundRobin).await
    }

    /// [`Self::start_on`] behind a balancer that picks replicas as `balance` says.
    pub async fn start_balanced(
        n: usize,
        gateway: &[(&str, &str)],
        over_socket: bool,
        balance: Balance,
    ) -> Self {
        let redis = RedisServer::start_on(over_socket);
        let store = format!("{:?}", redis.store_url());
        let mut entries: Vec<(&str, &str)> = vec![("session_store", store.as_str())];
        if !gateway.iter().any(|(k, _)| *k == "upstream_lease_ms") {
            entries.push(("upstream_lease_ms", "1500"));
        }
        entries.extend_from_slice(gateway);
        let ws = Workspace::new(&entries);
        let server = Proc::serve(&ws);
        let hop = Upstream::hop(&server.url).await;
        let gateways: Vec<Option<Proc>> = (0..n)
            .map(|_| Some(Proc::gateway_logging(&hop.url, &ws, "info")))
            .collect();
        let backends: Vec<String> = gateways.iter().flatten().map(Proc::authority).collect();
        let lb = HaProxy::start_with(&backends, balance);
        Self {
            ws,
            redis,
            server,
            hop,
            gateways,
            lb,
        }
    }

    /// Gateway `i`'s MCP endpoint.
    pub fn url(&self, i: usize) -> String {
        self.gateways[i]
            .as_ref()
            .expect("gateway alive")
            .url
            .clone()
    }

    /// `kill -9` of gateway `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some(p) = self.gateways[i].take() {
            drop(p);
        }
    }

    /// Gateway `i`'s admin listener (`/readyz`).
    pub fn admin(&self, i: usize) -> String {
        super::admin_url(self.gateways[i].as_ref().expect("gateway alive"))
    }

    /// The replica id gateway `i` logged at start.
    pub async fn replica_id(&self, i: usize) -> String {
        let p = self.gateways[i].as_ref().expect("gateway alive");
        eventually(WAIT, "the replica id in the gateway's log", || {
            p.log().iter().find_map(|l| field(l, "replica"))
        })
        .await
    }

    /// Which gateways logged a line with `message` and session `sid` (logs name a
    /// session by its tag, never its id).
    pub fn served_by(&self, sid: &str, message: &str) -> Vec<usize> {
        let tag = dualera::digest::log_tag(sid);
        self.gateways
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                g.as_ref().is_some_and(|g| {
                    g.log().iter().any(|l| {
                        l.contains(message) && field(l, "session").as_deref() == Some(tag.as_str())
                    })
                })
            })
            .map(|(i, _)| i)
            .collect()
    }
}

/// `key=value` in a tracing line (ANSI colours removed).
pub fn field(line: &str, key: &str) -> Option<String> {
    let plain = strip_ansi(line);
    let needle = format!("{key}=");
    let start = plain.find(&needle)? + needle.len();
    let rest = &plain[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"').to_owned())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
