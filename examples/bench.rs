//! The benchmark suite: pass-through overhead, MRTR translation cost, session memory and
//! pending rounds, each against a baseline measured in the same run. A program, not a
//! test; loopback only, bounded in count and time, stops by itself.
//!
//! ```sh
//! cargo run --release --example bench                       # the whole suite
//! cargo run --release --example bench -- --scenarios passthrough --rounds 3
//! cargo run --release --example bench -- --scenarios passthrough --profile perf
//! ```
//!
//! It builds and spawns its own processes (`target/release/dualera serve`,
//! `dualera gateway`, `examples/bare_proxy`) on 127.0.0.1 ephemeral ports, with a
//! throw-away workspace under the system temp folder, and writes
//! `bench/results/<unix-time>.{md,json}` plus `latest.{md,json}`.
//!
//! Scenarios (`--scenarios a,b,…`, default all):
//! - `passthrough`: `tools/list` and `tools/call notes_list`, concurrency 1/16/64, against
//!   the modern server directly, through the gateway, and through `bare_proxy`. Variants
//!   are interleaved (rotating order) for `--rounds` rounds of `--secs` each; medians.
//! - `legacy-call`: gateway CPU per plain legacy `tools/call notes_list` (an initialized
//!   2025-11-25 session per connection, answered with JSON) against the same call passed
//!   through from a modern client, at concurrency 1 and 16, one gateway (cache off),
//!   interleaved: what the session machine adds per request to the proxy path.
//! - `cache`: the response cache. `tools/list`, `server/discover` and a mixed workload
//!   (90 % `tools/call notes_list`, 10 % `tools/list`) at concurrency 1/16/64 against
//!   the modern server directly, through `bare_proxy`, and through the gateway with its
//!   cache on (`gateway+cache`; one gateway process per request kind, so its cache
//!   counters, logged when it stops, give each kind's hit ratio and upstream request
//!   count). Interleaved like `passthrough`. The `passthrough` gateway runs with the
//!   cache off: it measures the proxy path itself.
//! - `mrtr`: notes_create + notes_delete with one elicitation round (accept): one legacy
//!   session through the gateway vs a modern client doing the MRTR retry directly, with
//!   the modern client through `bare_proxy` as the one-hop reference; flows alternate
//!   one by one.
//! - `memory`: gateway RSS with 0, 1k, 10k, 100k idle initialized legacy sessions.
//! - `pending`: 10k legacy requests parked on an unanswered elicitation, then drained.
//! - `store`: the modern MRTR flow against one instance on SQLite (the run's server) and
//!   one on PostgreSQL (a throw-away cluster the benchmark starts, PostgreSQL's durable
//!   defaults), flows alternating one by one.
//! - `instances`: the legacy MRTR flow (one live elicitation, accepted) through a gateway
//!   in front of two `dualera serve` instances on one PostgreSQL (each round's retry on
//!   the other instance) vs a gateway in front of one of them, at concurrency 1 (flows
//!   alternating one by one) and 8 (alternating time slices); flows/s and ratios.
//! - `h2` (with `--tls`): pass-through at concurrency 64 through a gateway speaking
//!   HTTP/2 to the upstream (ALPN) vs one with `upstream_http2 = "never"`, both with
//!   the cache off, interleaved.
//!
//! `--tls` puts the modern server on HTTPS (a throw-away CA made at start-up): the
//! direct variant, the gateway and the bare proxy all reach it over TLS (the gateway
//! and the proxy with HTTP/2 when offered), so ratios compare like with like.
//!
//! - `replicas`: the legacy MRTR flow on two gateway replicas sharing a throw-away Redis
//!   (`session_store = "redis://…"`; each flow's requests alternate between them, so the
//!   answer's retry runs on the replica that does not hold the stream) against one
//!   gateway with sessions in memory, flows alternating one by one; then Redis memory
//!   per idle session at `--replica-sessions` (10k) sessions.
//!
//! `--profile perf` records the gateway with `perf record -g` during the selected
//! scenarios (report and, with inferno installed, a flamegraph under bench/results/);
//! `--profile callgrind` runs the gateway under `valgrind --tool=callgrind` (instruction
//! counts; timings are then meaningless), `--profile massif` under massif (heap by
//! allocation site, for per-session memory). Each is skipped with a message when its tool
//! is absent. `--dualera PATH` runs another build of the binary (before/after figures).
//!
//! Scenario timings are medians of interleaved rounds; nothing here asserts on a timing:
//! the targets table says which were met.

use bytes::Bytes;
use dualera::server::store::{NoteStore, SqliteStore};
use dualera::sse;

#[path = "../tests/common/pg_cluster.rs"]
mod pg_cluster;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const MODERN: &str = "2026-07-28";
const LEGACY: &str = "2025-11-25";
const PV: &str = "io.modelcontextprotocol/protocolVersion";
const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
const ALL_SCENARIOS: [&str; 10] = [
    "passthrough",
    "legacy-call",
    "cache",
    "mrtr",
    "memory",
    "pending",
    "store",
    "instances",
    "replicas",
    "h2",
];
/// What runs without `--scenarios` (`h2` needs `--tls`).
const DEFAULT_SCENARIOS: [&str; 9] = [
    "passthrough",
    "legacy-call",
    "cache",
    "mrtr",
    "memory",
    "pending",
    "store",
    "instances",
    "replicas",
];

/// Addresses served over TLS, and the client configuration that trusts them: every
/// [`Conn::open`] to one of them (the direct variant) speaks HTTPS.
static TLS_TARGETS: std::sync::Mutex<Vec<(SocketAddr, Arc<rustls::ClientConfig>)>> =
    std::sync::Mutex::new(Vec::new());

// ---------------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Perf,
    Callgrind,
    Massif,
}

#[derive(Debug, Clone)]
struct Opts {
    scenarios: Vec<String>,
    rounds: usize,
    secs: f64,
    concurrency: Vec<usize>,
    session_levels: Vec<usize>,
    pending: usize,
    pending_sessions: usize,
    /// Idle sessions opened on the replicas for Redis memory (default 10k).
    replica_sessions: usize,
    /// Hosts at once per variant in the replicas scenario's capacity part (default 8).
    replica_hosts: usize,
    profile: Option<Profile>,
    no_build: bool,
    dualera: Option<PathBuf>,
    tls: bool,
    /// The cache scenario's request kinds to run (default all three).
    cache_requests: Option<Vec<String>>,
    /// Round-trip time added to every packet to and from the modern server (netem).
    upstream_rtt_ms: Option<f64>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench [--scenarios passthrough,legacy-call,cache,mrtr,memory,pending,store,instances,replicas,h2] [--rounds N] [--secs S]\n\
         \x20            [--concurrency 1,16,64] [--sessions 1000,10000,100000]\n\
         \x20            [--pending N] [--pending-sessions N] [--replica-sessions N] [--replica-hosts N]\n\
         \x20            [--profile perf|callgrind|massif] [--no-build]\n\
         \x20            [--dualera PATH (another build of the binary, e.g. to compare before/after)]\n\
         \x20            [--tls (the modern server on HTTPS; enables the h2 scenario)]\n\
         \x20            [--cache-requests tools/list,server/discover,mixed]\n\
         \x20            [--upstream-rtt-ms MS (the modern server MS round trip away, behind a delaying relay)]"
    );
    std::process::exit(2)
}

fn list<T: std::str::FromStr>(v: &str) -> Vec<T> {
    v.split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| usage()))
        .collect()
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        scenarios: DEFAULT_SCENARIOS.iter().map(|s| (*s).to_owned()).collect(),
        rounds: 5,
        secs: 1.0,
        concurrency: vec![1, 16, 64],
        session_levels: vec![1_000, 10_000, 100_000],
        pending: 10_000,
        pending_sessions: 2_500,
        replica_sessions: 10_000,
        replica_hosts: 8,
        profile: None,
        no_build: false,
        dualera: None,
        tls: false,
        upstream_rtt_ms: None,
        cache_requests: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--scenarios" => {
                o.scenarios = list(&val());
                if o.scenarios
                    .iter()
                    .any(|s| !ALL_SCENARIOS.contains(&s.as_str()))
                {
                    usage()
                }
            }
            "--rounds" => o.rounds = val().parse().unwrap_or_else(|_| usage()),
            "--secs" => o.secs = val().parse().unwrap_or_else(|_| usage()),
            "--concurrency" => o.concurrency = list(&val()),
            "--sessions" => o.session_levels = list(&val()),
            "--pending" => o.pending = val().parse().unwrap_or_else(|_| usage()),
            "--pending-sessions" => o.pending_sessions = val().parse().unwrap_or_else(|_| usage()),
            "--replica-sessions" => o.replica_sessions = val().parse().unwrap_or_else(|_| usage()),
            "--replica-hosts" => o.replica_hosts = val().parse().unwrap_or_else(|_| usage()),
            "--profile" => {
                o.profile = match val().as_str() {
                    "perf" => Some(Profile::Perf),
                    "callgrind" => Some(Profile::Callgrind),
                    "massif" => Some(Profile::Massif),
                    _ => usage(),
                }
            }
            "--no-build" => o.no_build = true,
            "--dualera" => o.dualera = Some(PathBuf::from(val())),
            "--tls" => o.tls = true,
            "--cache-requests" => {
                let wanted: Vec<String> = list(&val());
                if wanted
                    .iter()
                    .any(|w| !["tools/list", "server/discover", "mixed"].contains(&w.as_str()))
                {
                    usage()
                }
                o.cache_requests = Some(wanted);
            }
            "--upstream-rtt-ms" => {
                let ms: f64 = val().parse().unwrap_or_else(|_| usage());
                if !(ms > 0.0 && ms <= 1000.0) {
                    usage()
                }
                o.upstream_rtt_ms = Some(ms);
            }
            _ => usage(),
        }
    }
    o.rounds = o.rounds.clamp(1, 50);
    o.secs = o.secs.clamp(0.1, 30.0);
    o.pending_sessions = o.pending_sessions.clamp(1, o.pending.max(1));
    o
}

// ---------------------------------------------------------------------------------
// Processes.
// ---------------------------------------------------------------------------------

/// `bench relay ONE_WAY_US UPSTREAM`: a TCP relay in front of the modern server that
/// holds every chunk `ONE_WAY_US` before passing it on, in each direction, so that the
/// server sits a round trip away from all its clients — direct, and the proxies — the
/// way a remote upstream does, while the driver reaches the proxies without delay.
/// (Loopback has no `netem` on every kernel; this needs nothing.) Blocking threads, so
/// that a delay is slept precisely rather than on a millisecond timer wheel; each
/// direction's queue is bounded, a full one stops reading.
fn relay_main(args: &[String]) -> Res<()> {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let [one_way, upstream] = args else {
        return Err("usage: bench relay ONE_WAY_US UPSTREAM_ADDR".into());
    };
    let one_way = Duration::from_micros(one_way.parse()?);
    let upstream: SocketAddr = upstream.parse()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    eprintln!("relay listening on http://{}/mcp", listener.local_addr()?);
    let pass = move |mut from: TcpStream, mut to: TcpStream| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(Instant, Vec<u8>)>(1024);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if tx
                    .send((Instant::now() + one_way, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for (at, bytes) in rx {
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if to.write_all(&bytes).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    };
    for down in listener.incoming() {
        let Ok(down) = down else { continue };
        let Ok(up) = TcpStream::connect(upstream) else {
            continue;
        };
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else {
            continue;
        };
        pass(down, up2);
        pass(up, down2);
    }
    Ok(())
}

/// A child process this benchmark started; terminated (SIGTERM, then SIGKILL) on drop.
struct Proc {
    name: String,
    child: Child,
    addr: SocketAddr,
    scheme: String,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: &Path, wait: Duration) -> Res<Self> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut logfile = std::fs::File::create(log)?;
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(logfile, "{line}");
                if let Some(rest) = line.split("listening on ").nth(1) {
                    if let Some((scheme, addr)) = rest.split_once("://") {
                        if let Some(t) = tx.take() {
                            let _ = t.send((
                                scheme.to_owned(),
                                addr.trim_end_matches("/mcp").to_owned(),
                            ));
                        }
                    }
                }
            }
        });
        let mut p = Self {
            name: name.to_owned(),
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            scheme: "http".into(),
        };
        match rx.recv_timeout(wait) {
            Ok((scheme, a)) => {
                p.addr = a.parse()?;
                p.scheme = scheme;
            }
            Err(_) => {
                return Err(format!(
                    "{name} did not report its address in {wait:?}; see {}",
                    log.display()
                )
                .into())
            }
        }
        Ok(p)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn url(&self) -> String {
        format!("{}://{}/mcp", self.scheme, self.addr)
    }

    /// Resident set size, bytes (VmRSS).
    fn rss(&self) -> Res<u64> {
        rss_of(self.pid())
    }
}

fn rss_of(pid: u32) -> Res<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kb * 1024)
}

/// CPU time (user + system) a process used so far, in seconds.
fn cpu_of(pid: u32) -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces): utime is the 12th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / ticks
}

/// Context switches (voluntary + involuntary) of every thread of a process so far.
fn switches_of(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|st| {
            st.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

impl Drop for Proc {
    fn drop(&mut self) {
        signal(self.child.id(), "-TERM");
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("bench: {} did not stop on SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where everything lives for one run.
struct Env {
    bin: PathBuf,
    bare: PathBuf,
    dir: PathBuf,
    results: PathBuf,
    stamp: u64,
    server_config: PathBuf,
    gateway_config: PathBuf,
    /// The same `[gateway]` section with `[cache] enabled = false`.
    nocache_config: PathBuf,
    db: PathBuf,
    notes_uri: String,
    scratch_uri: String,
    profile: Option<Profile>,
    /// `--tls`: the server's certificate files and the CA that signed them.
    tls: Option<BenchTls>,
    /// The pass-through gateway config with `upstream_http2 = "never"` (the h2
    /// scenario's baseline).
    gateway_h1_config: PathBuf,
}

struct BenchTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl BenchTls {
    fn new(dir: &Path) -> Res<Self> {
        use rustls::pki_types::pem::PemObject;
        let ca = dualera::tls::ThrowawayCa::new("dualera bench CA")?;
        let (cert, key) = ca.issue(&["127.0.0.1"], dualera::tls::Validity::Current)?;
        let write = |name: &str, text: &str| -> Res<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text)?;
            Ok(p)
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
            roots.add(c?)?;
        }
        let client = rustls::ClientConfig::builder_with_provider(dualera::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            ca: write("ca.pem", ca.cert_pem())?,
            cert: write("server.pem", &cert)?,
            key: write("server-key.pem", &key)?,
            client: Arc::new(client),
        })
    }
}

impl Env {
    /// With `--tls`, connections to `addr` verify the modern server's certificate
    /// against the run's CA.
    fn trust_server_at(&self, addr: SocketAddr) {
        if let Some(t) = &self.tls {
            if let Ok(mut targets) = TLS_TARGETS.lock() {
                targets.push((addr, t.client.clone()));
            }
        }
    }

    fn server(&self) -> Res<Proc> {
        let mut c = Command::new(&self.bin);
        c.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&self.server_config)
            .env("DUALERA_LOG", "warn");
        if let Some(t) = &self.tls {
            c.arg("--tls-cert")
                .arg(&t.cert)
                .arg("--tls-key")
                .arg(&t.key);
        }
        let p = Proc::spawn(
            "server",
            c,
            &self.results.join("logs/server.log"),
            Duration::from_secs(30),
        )?;
        self.trust_server_at(p.addr);
        Ok(p)
    }

    /// Another server on the same configuration, its store the PostgreSQL at `url`.
    fn server_on(&self, url: &str, tag: &str) -> Res<Proc> {
        let mut c = Command::new(&self.bin);
        c.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&self.server_config)
            .env("DUALERA_STORE_URL", url)
            .env("DUALERA_LOG", "warn");
        Proc::spawn(
            "server",
            c,
            &self.results.join(format!("logs/server-{tag}.log")),
            Duration::from_secs(30),
        )
    }

    fn gateway(&self, upstream: &Proc, tag: &str) -> Res<Proc> {
        self.gateway_with(upstream, tag, &self.gateway_config, "warn")
    }

    fn gateway_with(&self, upstream: &Proc, tag: &str, config: &Path, log: &str) -> Res<Proc> {
        self.gateway_over(&[upstream], tag, config, log)
    }

    /// A gateway whose `/mcp` route has these instances (`--upstream` once each).
    fn gateway_over(&self, upstreams: &[&Proc], tag: &str, config: &Path, log: &str) -> Res<Proc> {
        let under_valgrind = matches!(self.profile, Some(Profile::Callgrind | Profile::Massif));
        let mut c = if under_valgrind {
            let tool = if self.profile == Some(Profile::Massif) {
                "massif"
            } else {
                "callgrind"
            };
            let mut c = Command::new("valgrind");
            c.arg(format!("--tool={tool}"))
                .arg(format!(
                    "--{tool}-out-file={}",
                    self.results
                        .join(format!("{tool}-{}-{tag}.out", self.stamp))
                        .display()
                ))
                .arg(&self.bin);
            c
        } else {
            Command::new(&self.bin)
        };
        c.args(["gateway", "--listen", "127.0.0.1:0"]);
        for upstream in upstreams {
            c.arg("--upstream").arg(upstream.url());
        }
        c.arg("--config").arg(config).env("DUALERA_LOG", log);
        if let Some(t) = &self.tls {
            if upstreams.iter().any(|u| u.scheme == "https") {
                c.arg("--upstream-ca").arg(&t.ca);
            }
        }
        Proc::spawn(
            "gateway",
            c,
            &self.results.join(format!("logs/gateway-{tag}.log")),
            Duration::from_secs(if under_valgrind { 120 } else { 30 }),
        )
    }

    fn bare_proxy(&self, upstream: &Proc) -> Res<Proc> {
        let mut c = Command::new(&self.bare);
        c.arg(upstream.url()).arg("127.0.0.1:0");
        if let Some(t) = &self.tls {
            c.arg(&t.ca);
        }
        Proc::spawn(
            "bare_proxy",
            c,
            &self.results.join("logs/bare_proxy.log"),
            Duration::from_secs(30),
        )
    }
}

/// `perf record` attached to one process for the life of this guard.
struct PerfGuard {
    child: Option<Child>,
    data: PathBuf,
    results: PathBuf,
    tag: String,
}

impl PerfGuard {
    fn start(env: &Env, pid: u32, tag: &str) -> Option<Self> {
        if env.profile != Some(Profile::Perf) {
            return None;
        }
        let data = env.results.join(format!("perf-{}-{tag}.data", env.stamp));
        let child = Command::new("perf")
            .args(["record", "-F", "999", "-g", "-p", &pid.to_string(), "-o"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                eprintln!("bench: perf is not available ({e}); profiling skipped");
                return None;
            }
        };
        std::thread::sleep(Duration::from_millis(300));
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!(
                "bench: perf record exited at once ({status}); check perf_event_paranoid; profiling skipped"
            );
            return None;
        }
        eprintln!("bench: perf recording the gateway into {}", data.display());
        Some(Self {
            child: Some(child),
            data,
            results: env.results.clone(),
            tag: tag.to_owned(),
        })
    }
}

impl Drop for PerfGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), "-INT");
        let _ = child.wait();
        let report = self.results.join(format!("perf-{}-report.txt", self.tag));
        if let Ok(out) = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--percent-limit",
                "0.5",
                "-i",
            ])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
        {
            let _ = std::fs::write(&report, out.stdout);
            eprintln!("bench: perf report in {}", report.display());
        }
        let have = |p: &str| {
            Command::new(p)
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        if have("inferno-collapse-perf") && have("inferno-flamegraph") {
            let svg = self.results.join(format!("flamegraph-{}.svg", self.tag));
            let script = format!(
                "perf script -i '{}' | inferno-collapse-perf | inferno-flamegraph > '{}'",
                self.data.display(),
                svg.display()
            );
            if Command::new("sh")
                .args(["-c", &script])
                .status()
                .is_ok_and(|s| s.success())
            {
                eprintln!("bench: flamegraph in {}", svg.display());
            }
        } else {
            eprintln!(
                "bench: no inferno-flamegraph on PATH (cargo install inferno); perf report only"
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// HTTP client.
// ---------------------------------------------------------------------------------

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    tx: SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

type Headers = Vec<(HeaderName, HeaderValue)>;

impl Conn {
    async fn open(addr: SocketAddr) -> Res<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let tls = TLS_TARGETS
            .lock()
            .ok()
            .and_then(|t| t.iter().find(|(a, _)| *a == addr).map(|(_, c)| c.clone()));
        let tx = match tls {
            None => {
                let (tx, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                tx
            }
            Some(config) => {
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let stream = tokio_rustls::TlsConnector::from(config)
                    .connect(name, stream)
                    .await?;
                let (tx, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                tx
            }
        };
        Ok(Self {
            tx,
            host: HeaderValue::from_str(&addr.to_string())?,
        })
    }

    async fn post(&mut self, headers: &Headers, body: Bytes) -> Res<http::Response<Incoming>> {
        self.tx.ready().await?;
        let mut req = Request::post("/mcp").body(Full::new(body))?;
        let h = req.headers_mut();
        h.insert(header::HOST, self.host.clone());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        for (k, v) in headers {
            h.insert(k.clone(), v.clone());
        }
        Ok(self.tx.send_request(req).await?)
    }

    /// POSTs and returns every JSON-RPC message of the answer (JSON or SSE).
    async fn exchange(&mut self, headers: &Headers, body: Bytes) -> Res<(StatusCode, Vec<Value>)> {
        let resp = self.post(headers, body).await?;
        let status = resp.status();
        let is_sse = is_sse(&resp);
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !is_sse {
            if bytes.is_empty() {
                return Ok((status, Vec::new()));
            }
            return Ok((status, vec![serde_json::from_slice(&bytes)?]));
        }
        let mut dec = sse::Decoder::new(16 << 20);
        let mut out = Vec::new();
        for ev in dec.feed(&bytes)? {
            if !ev.data.trim().is_empty() {
                out.push(serde_json::from_str(&ev.data)?);
            }
        }
        Ok((status, out))
    }
}

fn is_sse(resp: &http::Response<Incoming>) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn modern_headers(method: &str, name: Option<&str>) -> Headers {
    let mut h = vec![
        (HeaderName::from_static("mcp-protocol-version"), hv(MODERN)),
        (HeaderName::from_static("mcp-method"), hv(method)),
    ];
    if let Some(n) = name {
        h.push((HeaderName::from_static("mcp-name"), hv(n)));
    }
    h
}

fn modern_body(id: u64, method: &str, mut params: Value, caps: Value) -> Bytes {
    params["_meta"] =
        json!({PV: MODERN, CAPS: caps, CLIENT_INFO: {"name": "dualera-bench", "version": "0"}});
    Bytes::from(
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap_or_default(),
    )
}

/// The JSON-RPC response among `msgs`: its result, or an error.
fn result_of(status: StatusCode, msgs: &[Value]) -> Res<Value> {
    let r = msgs
        .iter()
        .rev()
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .ok_or_else(|| format!("HTTP {status} without a JSON-RPC response"))?;
    if let Some(e) = r.get("error") {
        return Err(format!("JSON-RPC error: {e}").into());
    }
    Ok(r["result"].clone())
}

// ---------------------------------------------------------------------------------
// Statistics.
// ---------------------------------------------------------------------------------

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn percentile(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1] as f64 / 1000.0
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rps: f64,
    /// Every request answered, warm-up and tail included (what the CPU was spent on).
    total: usize,
    p50_us: f64,
    p99_us: f64,
    n: usize,
    errors: usize,
}

fn fmt_f(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "–".into()
    }
}

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// Scenario 1: pass-through.
// ---------------------------------------------------------------------------------

struct Spec {
    headers: Headers,
    body: Bytes,
}

/// `conc` connections posting `spec` back to back; after `warm`, counts what completes
/// within `secs`. Bounded by time and by `max` requests.
async fn load(addr: SocketAddr, spec: Arc<Spec>, conc: usize, warm: f64, secs: f64) -> Res<Sample> {
    load_mix(addr, Arc::new(vec![spec]), conc, warm, secs).await
}

/// [`load`] where each connection cycles through `specs` in order (a workload mix).
async fn load_mix(
    addr: SocketAddr,
    specs: Arc<Vec<Arc<Spec>>>,
    conc: usize,
    warm: f64,
    secs: f64,
) -> Res<Sample> {
    let mut workers: Vec<Worker> = Vec::with_capacity(conc);
    for w in 0..conc {
        let specs = specs.clone();
        // Offset per connection, so a mix is mixed at every instant.
        let next = Box::new(move |sent: usize| specs[(sent + w) % specs.len()].clone());
        workers.push((Conn::open(addr).await?, next));
    }
    run_load(workers, warm, secs).await
}

/// One load connection and what it posts: its `n`th request (from 0).
type Worker = (Conn, Box<dyn FnMut(usize) -> Arc<Spec> + Send>);

/// Each worker posting back to back on its connection; after `warm`, counts what
/// completes with HTTP 200 within `secs`.
async fn run_load(workers: Vec<Worker>, warm: f64, secs: f64) -> Res<Sample> {
    const MAX_PER_WORKER: usize = 400_000;
    let start = Instant::now() + Duration::from_secs_f64(warm);
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for (mut c, mut next) in workers {
        tasks.spawn(async move {
            let mut lat: Vec<u64> = Vec::with_capacity(16_384);
            let mut errors = 0usize;
            let mut sent = 0usize;
            let mut answered = 0usize;
            loop {
                let t0 = Instant::now();
                if t0 >= end || sent >= MAX_PER_WORKER {
                    break;
                }
                let spec = next(sent);
                sent += 1;
                let ok = match c.post(&spec.headers, spec.body.clone()).await {
                    Ok(resp) => {
                        let st = resp.status();
                        resp.into_body().collect().await.is_ok() && st == StatusCode::OK
                    }
                    Err(_) => false,
                };
                let t1 = Instant::now();
                if !ok {
                    errors += 1;
                    if c.tx.is_closed() {
                        match Conn::open(c.tx_addr()).await {
                            Ok(n) => c = n,
                            Err(_) => break,
                        }
                    }
                    continue;
                }
                answered += 1;
                if t0 >= start && t1 <= end {
                    lat.push(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
                }
            }
            (lat, errors, answered)
        });
    }
    let mut all = Vec::new();
    let mut errors = 0;
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        let (lat, e, answered) = r?;
        all.extend(lat);
        errors += e;
        total += answered;
    }
    all.sort_unstable();
    Ok(Sample {
        rps: all.len() as f64 / secs,
        total,
        p50_us: percentile(&all, 50.0),
        p99_us: percentile(&all, 99.0),
        n: all.len(),
        errors,
    })
}

impl Conn {
    fn tx_addr(&self) -> SocketAddr {
        self.host
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

const VARIANTS: [&str; 3] = ["direct", "gateway", "bare_proxy"];

/// The two pass-through requests: `tools/list` and `tools/call notes_list`.
fn passthrough_kinds(env: &Env) -> Vec<(&'static str, Arc<Spec>)> {
    vec![
        (
            "tools/list",
            Arc::new(Spec {
                headers: modern_headers("tools/list", None),
                body: modern_body(1, "tools/list", json!({}), json!({})),
            }),
        ),
        (
            "tools/call notes_list",
            Arc::new(Spec {
                headers: modern_headers("tools/call", Some("notes_list")),
                body: modern_body(
                    1,
                    "tools/call",
                    json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}}),
                    json!({}),
                ),
            }),
        ),
    ]
}

async fn passthrough(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway_with(server, "passthrough", &env.nocache_config, "warn")?;
    let bare = env.bare_proxy(server)?;
    let _perf = PerfGuard::start(env, gateway.pid(), "passthrough");
    let addrs = [server.addr, gateway.addr, bare.addr];
    let kinds = passthrough_kinds(env);
    // Correctness first: every variant gives the same answer.
    for (kind, spec) in &kinds {
        let mut answers = Vec::new();
        for a in addrs {
            let mut c = Conn::open(a).await?;
            let (st, msgs) = c.exchange(&spec.headers, spec.body.clone()).await?;
            let r = result_of(st, &msgs)?;
            if st != StatusCode::OK {
                return Err(format!("{kind}: HTTP {st}").into());
            }
            answers.push(r);
        }
        if answers.iter().any(|a| a != &answers[0]) {
            return Err(format!("{kind}: the variants answered differently").into());
        }
    }
    eprintln!("bench: passthrough (load {})", load_avg());
    let mut samples: BTreeMap<(usize, usize, usize), Vec<Sample>> = BTreeMap::new();
    // CPU seconds and requests per proxy (gateway, bare proxy) and per concurrency.
    let pids = [server.pid(), gateway.pid(), bare.pid()];
    let mut cpu: BTreeMap<(usize, usize), (f64, usize)> = BTreeMap::new();
    // Per (concurrency, kind): gateway/direct, gateway/bare, p50 added, one per round.
    type Ratios = Vec<(f64, f64, f64, f64, f64)>;
    let mut ratios: BTreeMap<(usize, usize), Ratios> = BTreeMap::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, spec)) in kinds.iter().enumerate() {
            for round in 0..opts.rounds {
                let mut this = [None; 3];
                for k in 0..3 {
                    let v = (round + k) % 3;
                    let before = cpu_of(pids[v]);
                    let s = load(addrs[v], spec.clone(), conc, 0.2, opts.secs).await?;
                    let used = cpu_of(pids[v]) - before;
                    let e = cpu.entry((ci, v)).or_default();
                    e.0 += used;
                    e.1 += s.total;
                    this[v] = Some(s);
                    samples.entry((ci, ki, v)).or_default().push(s);
                }
                let [Some(d), Some(g), Some(b)] = this else {
                    continue;
                };
                ratios.entry((ci, ki)).or_default().push((
                    g.rps / d.rps,
                    g.rps / b.rps,
                    g.p50_us - d.p50_us,
                    b.rps / d.rps,
                    b.p50_us - d.p50_us,
                ));
                eprintln!(
                    "  c={conc:<3} {kind:<22} round {}: direct {:>7.0}/s  gateway {:>7.0}/s  bare {:>7.0}/s",
                    round + 1,
                    d.rps,
                    g.rps,
                    b.rps
                );
            }
        }
    }
    let rss = gateway.rss().unwrap_or(0);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 1. Pass-through ({} rounds × {} s per variant, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | conc | variant | req/s | p50 µs | p99 µs | errors |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            for (v, name) in VARIANTS.iter().enumerate() {
                let s = &samples[&(ci, ki, v)];
                let rps = median(&s.iter().map(|x| x.rps).collect::<Vec<_>>());
                let p50 = median(&s.iter().map(|x| x.p50_us).collect::<Vec<_>>());
                let p99 = median(&s.iter().map(|x| x.p99_us).collect::<Vec<_>>());
                let errors: usize = s.iter().map(|x| x.errors).sum();
                let _ = writeln!(
                    md,
                    "| {kind} | {conc} | {name} | {} | {} | {} | {errors} |",
                    fmt_f(rps, 0),
                    fmt_f(p50, 1),
                    fmt_f(p99, 1)
                );
                json_rows.push(json!({
                    "request": kind, "concurrency": conc, "variant": name,
                    "rps_median": rps, "p50_us_median": p50, "p99_us_median": p99, "errors": errors,
                    "rounds": s.iter().map(|x| json!({"rps": x.rps, "p50_us": x.p50_us, "p99_us": x.p99_us, "n": x.n, "errors": x.errors})).collect::<Vec<_>>(),
                }));
            }
        }
    }
    let _ = writeln!(
        md,
        "\n| request | conc | gateway/direct req/s | gateway/bare req/s | p50 added vs direct µs | bare/direct req/s | bare p50 added µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let mut json_ratios = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            let r = &ratios[&(ci, ki)];
            let gd = median(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let gb = median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let added = median(&r.iter().map(|x| x.2).collect::<Vec<_>>());
            let bd = median(&r.iter().map(|x| x.3).collect::<Vec<_>>());
            let bare_added = median(&r.iter().map(|x| x.4).collect::<Vec<_>>());
            let _ = writeln!(
                md,
                "| {kind} | {conc} | {} | {} | {} | {} | {} |",
                fmt_f(gd, 3),
                fmt_f(gb, 3),
                fmt_f(added, 1),
                fmt_f(bd, 3),
                fmt_f(bare_added, 1)
            );
            json_ratios.push(json!({"request": kind, "concurrency": conc,
                "gateway_over_direct": gd, "gateway_over_bare_proxy": gb, "p50_added_us": added,
                "bare_proxy_over_direct": bd, "bare_proxy_p50_added_us": bare_added}));
            report.passthrough_ratios.push(PassthroughRatio {
                conc,
                kind: kind.to_string(),
                gateway_over_direct: gd,
                gateway_over_bare: gb,
                added,
                bare_over_direct: bd,
                bare_added,
            });
        }
    }
    let _ = writeln!(
        md,
        "\nRatios are medians of per-round ratios (each round runs the three variants back to back). Gateway RSS after this scenario: {:.1} MiB.",
        rss as f64 / 1048576.0
    );
    let _ = writeln!(
        md,
        "\nCPU per request of the process serving the variant (from /proc/PID/stat, both request kinds; for direct that is the server's own work):\n"
    );
    let _ = writeln!(
        md,
        "| conc | server (direct) µs | gateway µs | bare proxy µs |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    let mut json_cpu = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        let per = |v: usize| {
            cpu.get(&(ci, v))
                .map_or(f64::NAN, |(secs, n)| secs * 1e6 / (*n).max(1) as f64)
        };
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | {} |",
            fmt_f(per(0), 1),
            fmt_f(per(1), 1),
            fmt_f(per(2), 1)
        );
        json_cpu.push(json!({"concurrency": conc, "server_direct_cpu_us": per(0), "gateway_cpu_us": per(1), "bare_proxy_cpu_us": per(2)}));
    }
    report.add(
        "passthrough",
        md,
        json!({"rows": json_rows, "ratios": json_ratios, "cpu_per_request": json_cpu, "gateway_rss_bytes": rss}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 1a: a plain legacy call against the same call passed through.
// ---------------------------------------------------------------------------------

/// Gateway CPU per plain legacy `tools/call notes_list` (no elicitation; an initialized
/// 2025-11-25 session per connection, each call a POST answered with JSON) against the
/// same call from a modern client passed through, at concurrency 1 and 16, through one
/// gateway with the cache off, interleaved round by round. What the session machine
/// costs per request beyond the proxy path.
async fn legacy_call(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway_with(server, "legacy-call", &env.nocache_config, "warn")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "legacy-call");
    eprintln!("bench: legacy-call (load {})", load_avg());
    let modern = passthrough_kinds(env)
        .into_iter()
        .find(|(k, _)| *k == "tools/call notes_list")
        .map(|(_, spec)| spec)
        .ok_or("no tools/call spec")?;
    let args = json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}});
    // Correctness first: both paths give the same answer.
    {
        let mut c = Conn::open(gateway.addr).await?;
        let (st, msgs) = c.exchange(&modern.headers, modern.body.clone()).await?;
        let through = result_of(st, &msgs)?;
        let mut l = LegacyClient::open(gateway.addr).await?;
        let legacy = l.tool("notes_list", args["arguments"].clone()).await?;
        if legacy.get("content") != through.get("content") {
            return Err("legacy-call: the legacy and the modern answers differ".into());
        }
    }
    const CONCS: [usize; 2] = [1, 16];
    let mut rows = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### Plain legacy call vs pass-through ({} rounds × {} s per variant, interleaved)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| conc | legacy calls/s | pass-through req/s | gateway CPU per legacy call µs | gateway CPU per pass-through request µs | context switches per legacy call / per pass-through request | legacy / pass-through CPU |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    for conc in CONCS {
        // [legacy, pass-through]: CPU seconds, requests answered, req/s per round,
        // context switches.
        let mut cpu = [(0.0f64, 0usize); 2];
        let mut switches = [0u64; 2];
        let mut rates: [Vec<f64>; 2] = Default::default();
        for round in 0..opts.rounds {
            for k in 0..2 {
                let v = (round + k) % 2;
                let mut workers: Vec<Worker> = Vec::with_capacity(conc);
                for _ in 0..conc {
                    let mut c = Conn::open(gateway.addr).await?;
                    let next: Box<dyn FnMut(usize) -> Arc<Spec> + Send> = if v == 0 {
                        let headers = legacy_headers(&legacy_open(&mut c).await?);
                        let args = args.clone();
                        // Each call its own id: a session never reuses one.
                        Box::new(move |n: usize| {
                            Arc::new(Spec {
                                headers: headers.clone(),
                                body: rpc(n as u64 + 1, "tools/call", args.clone()),
                            })
                        })
                    } else {
                        let spec = modern.clone();
                        Box::new(move |_| spec.clone())
                    };
                    workers.push((c, next));
                }
                let before = cpu_of(gateway.pid());
                let switched = switches_of(gateway.pid());
                let s = run_load(workers, 0.2, opts.secs).await?;
                cpu[v].0 += cpu_of(gateway.pid()) - before;
                switches[v] += switches_of(gateway.pid()).saturating_sub(switched);
                cpu[v].1 += s.total;
                if s.errors > 0 {
                    return Err(format!("legacy-call c={conc}: {} errors", s.errors).into());
                }
                rates[v].push(s.rps);
            }
        }
        let per = |v: usize| cpu[v].0 * 1e6 / cpu[v].1.max(1) as f64;
        let switched = |v: usize| switches[v] as f64 / cpu[v].1.max(1) as f64;
        let ratio = per(0) / per(1);
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | {} | {} | {} / {} | **{}** |",
            fmt_f(median(&rates[0]), 0),
            fmt_f(median(&rates[1]), 0),
            fmt_f(per(0), 1),
            fmt_f(per(1), 1),
            fmt_f(switched(0), 2),
            fmt_f(switched(1), 2),
            fmt_f(ratio, 3)
        );
        eprintln!(
            "  c={conc:<3} gateway CPU per legacy call {:.1} µs, per pass-through request {:.1} µs: {ratio:.3}",
            per(0),
            per(1)
        );
        rows.push(
            json!({"concurrency": conc, "legacy_calls_per_s": median(&rates[0]),
            "passthrough_per_s": median(&rates[1]), "gateway_cpu_us_per_legacy_call": per(0),
            "gateway_cpu_us_per_passthrough": per(1), "legacy_over_passthrough_cpu": ratio}),
        );
        report.legacy_call.push((conc, ratio));
    }
    let _ = writeln!(
        md,
        "\nCPU is the gateway process's (from /proc/PID/stat) over the whole of each variant's rounds, the warm-up and the session opening included; the client runs on the same two cores."
    );
    report.add("legacy-call", md, json!({"rows": rows}));
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 1b: the response cache.
// ---------------------------------------------------------------------------------

const CACHE_VARIANTS: [&str; 3] = ["direct", "bare_proxy", "gateway+cache"];

/// The cache counters a gateway logs when it stops (`cache counters` at info level).
fn cache_counters(log: &Path) -> BTreeMap<String, u64> {
    let raw = std::fs::read_to_string(log).unwrap_or_default();
    // Without ANSI colour sequences (`ESC [ … m`).
    let mut text = String::with_capacity(raw.len());
    let mut in_escape = false;
    for ch in raw.chars() {
        match (in_escape, ch) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => text.push(c),
        }
    }
    let Some(line) = text.lines().rev().find(|l| l.contains("cache counters")) else {
        return BTreeMap::new();
    };
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.trim_matches(',').parse().ok()?)))
        .collect()
}

async fn cache(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let bare = env.bare_proxy(server)?;
    let spec = |method: &str, name: Option<&str>, params: Value| {
        Arc::new(Spec {
            headers: modern_headers(method, name),
            body: modern_body(1, method, params, json!({})),
        })
    };
    let list = spec("tools/list", None, json!({}));
    let call = spec(
        "tools/call",
        Some("notes_list"),
        json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}}),
    );
    let mut mixed = vec![call.clone(); 9];
    mixed.push(list.clone());
    let kinds: Vec<(&str, Arc<Vec<Arc<Spec>>>)> = vec![
        ("tools/list", Arc::new(vec![list])),
        (
            "server/discover",
            Arc::new(vec![spec("server/discover", None, json!({}))]),
        ),
        ("mixed", Arc::new(mixed)),
    ];
    let kinds: Vec<_> = match &opts.cache_requests {
        Some(wanted) => kinds
            .into_iter()
            .filter(|(n, _)| wanted.iter().any(|w| w == n))
            .collect(),
        None => kinds,
    };
    // One cached gateway per kind: its counters then belong to that kind alone.
    let mut gateways = Vec::new();
    for (kind, _) in &kinds {
        let tag = format!("cache-{}", kind.replace('/', "-"));
        let g = env.gateway_with(
            server,
            &tag,
            &env.gateway_config,
            "warn,dualera::gateway=info",
        )?;
        gateways.push((tag, g));
    }
    // Correctness first: the cached answers equal the direct ones.
    for (ki, (kind, specs)) in kinds.iter().enumerate() {
        for s in specs.iter().take(2) {
            let mut answers = Vec::new();
            for a in [
                server.addr,
                bare.addr,
                gateways[ki].1.addr,
                gateways[ki].1.addr,
            ] {
                let mut c = Conn::open(a).await?;
                let (st, msgs) = c.exchange(&s.headers, s.body.clone()).await?;
                answers.push(result_of(st, &msgs)?);
            }
            if answers.iter().any(|a| a != &answers[0]) {
                return Err(format!("{kind}: the variants answered differently").into());
            }
        }
    }
    eprintln!("bench: cache (load {})", load_avg());
    let mut samples: BTreeMap<(usize, usize, usize), Vec<Sample>> = BTreeMap::new();
    // Per (concurrency, kind): cache/direct, cache/bare, p50 vs direct, one per round.
    type CacheRatios = Vec<(f64, f64, f64)>;
    let mut ratios: BTreeMap<(usize, usize), CacheRatios> = BTreeMap::new();
    let mut served = vec![0usize; kinds.len()];
    // Per (concurrency, kind, variant): CPU seconds of [upstream, proxy, driver], requests.
    let mut cpu: BTreeMap<(usize, usize, usize), ([f64; 3], usize)> = BTreeMap::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, specs)) in kinds.iter().enumerate() {
            let addrs = [server.addr, bare.addr, gateways[ki].1.addr];
            for round in 0..opts.rounds {
                let mut this = [None; 3];
                for k in 0..3 {
                    let v = (round + k) % 3;
                    // CPU of the upstream, the proxy in the path (if any) and this driver.
                    let pids = [
                        server.pid(),
                        [0, bare.pid(), gateways[ki].1.pid()][v],
                        std::process::id(),
                    ];
                    let before = pids.map(cpu_of);
                    let s = load_mix(addrs[v], specs.clone(), conc, 0.2, opts.secs).await?;
                    let after = pids.map(cpu_of);
                    let e = cpu.entry((ci, ki, v)).or_insert(([0.0; 3], 0));
                    for p in 0..3 {
                        if pids[p] != 0 {
                            e.0[p] += after[p] - before[p];
                        }
                    }
                    e.1 += s.total;
                    if v == 2 {
                        served[ki] += s.total;
                    }
                    this[v] = Some(s);
                    samples.entry((ci, ki, v)).or_default().push(s);
                }
                let [Some(d), Some(b), Some(g)] = this else {
                    continue;
                };
                ratios.entry((ci, ki)).or_default().push((
                    g.rps / d.rps,
                    g.rps / b.rps,
                    g.p50_us - d.p50_us,
                ));
                eprintln!(
                    "  c={conc:<3} {kind:<16} round {}: direct {:>7.0}/s  bare {:>7.0}/s  gateway+cache {:>7.0}/s",
                    round + 1,
                    d.rps,
                    b.rps,
                    g.rps
                );
            }
        }
    }
    // Stop the cached gateways; each logs its counters on the way out.
    let mut counters = Vec::new();
    for (tag, g) in gateways {
        drop(g);
        counters.push(cache_counters(
            &env.results.join(format!("logs/gateway-{tag}.log")),
        ));
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 1b. Response cache ({} rounds × {} s per variant, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | conc | variant | req/s | p50 µs | p99 µs | errors | CPU µs/req: upstream | proxy | driver | all |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            for (v, name) in CACHE_VARIANTS.iter().enumerate() {
                let s = &samples[&(ci, ki, v)];
                let rps = median(&s.iter().map(|x| x.rps).collect::<Vec<_>>());
                let p50 = median(&s.iter().map(|x| x.p50_us).collect::<Vec<_>>());
                let p99 = median(&s.iter().map(|x| x.p99_us).collect::<Vec<_>>());
                let errors: usize = s.iter().map(|x| x.errors).sum();
                let (secs, n) = cpu.get(&(ci, ki, v)).copied().unwrap_or(([0.0; 3], 0));
                let per = secs.map(|c| c * 1e6 / n.max(1) as f64);
                let proxy = if v == 0 {
                    "–".to_owned()
                } else {
                    fmt_f(per[1], 1)
                };
                let _ = writeln!(
                    md,
                    "| {kind} | {conc} | {name} | {} | {} | {} | {errors} | {} | {proxy} | {} | {} |",
                    fmt_f(rps, 0),
                    fmt_f(p50, 1),
                    fmt_f(p99, 1),
                    fmt_f(per[0], 1),
                    fmt_f(per[2], 1),
                    fmt_f(per.iter().sum::<f64>(), 1),
                );
                json_rows.push(
                    json!({"request": kind, "concurrency": conc, "variant": name,
                    "rps_median": rps, "p50_us_median": p50, "p99_us_median": p99, "errors": errors,
                    "cpu_us_per_request": {"upstream": per[0], "proxy": per[1], "driver": per[2]}}),
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\n| request | conc | gateway+cache/direct req/s | gateway+cache/bare req/s | p50 vs direct µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    let mut json_ratios = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            let r = &ratios[&(ci, ki)];
            let gd = median(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let gb = median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let added = median(&r.iter().map(|x| x.2).collect::<Vec<_>>());
            let _ = writeln!(
                md,
                "| {kind} | {conc} | {} | {} | {} |",
                fmt_f(gd, 3),
                fmt_f(gb, 3),
                fmt_f(added, 1)
            );
            json_ratios.push(json!({"request": kind, "concurrency": conc,
                "cache_over_direct": gd, "cache_over_bare_proxy": gb, "p50_vs_direct_us": added}));
            report
                .cache_ratios
                .push((conc, kind.to_string(), gd, gb, added));
        }
    }
    let _ = writeln!(
        md,
        "\nWhat reached the upstream from each cached gateway (its cache counters; hit ratio = (hits + coalesced) / cacheable requests; requests served: every answer of the load, warm-up included; cacheable: the same plus the correctness checks; for the mix, 90 % of requests are `tools/call`, which always go upstream):\n"
    );
    let _ = writeln!(
        md,
        "| request | requests served | cacheable | hits | coalesced | misses (upstream) | upstream requests | hit ratio |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_counts = Vec::new();
    for (ki, (kind, _)) in kinds.iter().enumerate() {
        let c = &counters[ki];
        let get = |k: &str| c.get(k).copied().unwrap_or(0);
        let (hits, coalesced, misses) = (get("hits"), get("coalesced"), get("misses"));
        let cacheable = hits + coalesced + misses;
        let passed = (served[ki] as u64).saturating_sub(cacheable);
        let ratio = (hits + coalesced) as f64 / cacheable.max(1) as f64;
        let _ = writeln!(
            md,
            "| {kind} | {} | {cacheable} | {hits} | {coalesced} | {misses} | ≈{} | {} |",
            served[ki],
            misses + passed,
            fmt_f(ratio, 5)
        );
        json_counts.push(json!({"request": kind, "served": served[ki], "cacheable": cacheable,
            "hits": hits, "coalesced": coalesced, "misses": misses, "invalidations": get("invalidations"),
            "upstream_requests_approx": misses + passed, "hit_ratio": ratio}));
    }
    report.add(
        "cache",
        md,
        json!({"rows": json_rows, "ratios": json_ratios, "upstream": json_counts}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 5: HTTP/2 vs HTTP/1.1 to a TLS upstream.
// ---------------------------------------------------------------------------------

async fn h2_vs_h1(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let h2 = env.gateway_with(server, "h2", &env.nocache_config, "warn")?;
    let h1 = env.gateway_with(server, "h1", &env.gateway_h1_config, "warn")?;
    let conc = 64;
    eprintln!("bench: h2 vs h1 upstream at c={conc} (load {})", load_avg());
    let kinds = passthrough_kinds(env);
    let variants = [("h2", &h2), ("http/1.1", &h1)];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 5. HTTP/2 vs HTTP/1.1 to the TLS upstream, pass-through at concurrency {conc} ({} rounds × {} s, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | h2 req/s | h1 req/s | h2/h1 | h2 p50 µs | h1 p50 µs | h2 gateway CPU µs/req | h1 gateway CPU µs/req |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (kind, spec) in &kinds {
        let mut rps: [Vec<f64>; 2] = Default::default();
        let mut p50: [Vec<f64>; 2] = Default::default();
        let mut ratio = Vec::new();
        let mut cpu = [(0.0f64, 0usize); 2];
        for round in 0..opts.rounds {
            let mut this = [0.0f64; 2];
            for k in 0..2 {
                let v = (round + k) % 2;
                let p = variants[v].1;
                let before = cpu_of(p.pid());
                let s = load(p.addr, spec.clone(), conc, 0.2, opts.secs).await?;
                cpu[v].0 += cpu_of(p.pid()) - before;
                cpu[v].1 += s.total;
                rps[v].push(s.rps);
                p50[v].push(s.p50_us);
                this[v] = s.rps;
            }
            ratio.push(this[0] / this[1]);
            eprintln!(
                "  {kind:<22} round {}: h2 {:>7.0}/s  h1 {:>7.0}/s",
                round + 1,
                this[0],
                this[1]
            );
        }
        let per = |v: usize| cpu[v].0 * 1e6 / cpu[v].1.max(1) as f64;
        let _ = writeln!(
            md,
            "| {kind} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_f(median(&rps[0]), 0),
            fmt_f(median(&rps[1]), 0),
            fmt_f(median(&ratio), 3),
            fmt_f(median(&p50[0]), 1),
            fmt_f(median(&p50[1]), 1),
            fmt_f(per(0), 1),
            fmt_f(per(1), 1)
        );
        rows.push(json!({"request": kind, "concurrency": conc,
            "h2_rps": median(&rps[0]), "h1_rps": median(&rps[1]), "h2_over_h1": median(&ratio),
            "h2_p50_us": median(&p50[0]), "h1_p50_us": median(&p50[1]),
            "h2_gateway_cpu_us": per(0), "h1_gateway_cpu_us": per(1)}));
    }
    let _ = writeln!(
        md,
        "\nThe h2 gateway multiplexes every request over one upstream connection; the HTTP/1.1 one keeps a pool (up to 64 connections here)."
    );
    report.add("h2", md, json!({"rows": rows}));
    Ok(())
}

// ---------------------------------------------------------------------------------
// Legacy client (2025-11-25 Streamable HTTP).
// ---------------------------------------------------------------------------------

fn legacy_headers(session: &str) -> Headers {
    vec![
        (HeaderName::from_static("mcp-session-id"), hv(session)),
        (HeaderName::from_static("mcp-protocol-version"), hv(LEGACY)),
    ]
}

fn rpc(id: u64, method: &str, params: Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap_or_default(),
    )
}

/// Opens an initialized legacy session on `conn`; returns its id.
async fn legacy_open(conn: &mut Conn) -> Res<String> {
    let init = rpc(
        0,
        "initialize",
        json!({"protocolVersion": LEGACY, "capabilities": {"elicitation": {"form": {}}},
               "clientInfo": {"name": "dualera-bench", "version": "0"}}),
    );
    let resp = conn.post(&Vec::new(), init).await?;
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.into_body().collect().await?.to_bytes();
    let Some(sid) = sid else {
        return Err(format!(
            "initialize: HTTP {status} without a session: {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    };
    let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let resp = conn.post(&legacy_headers(&sid), note).await?;
    let st = resp.status();
    resp.into_body().collect().await?;
    if st != StatusCode::ACCEPTED {
        return Err(format!("initialized: HTTP {st}").into());
    }
    Ok(sid)
}

/// The reply a scripted user gives to a delete form: accept + confirm the first note.
fn accept_reply(live: &Value) -> Res<Bytes> {
    let note = live
        .pointer("/params/requestedSchema/properties/note_id/enum/0")
        .cloned()
        .ok_or("elicitation without a note to pick")?;
    Ok(Bytes::from(serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": live["id"],
        "result": {"action": "accept", "content": {"note_id": note, "confirm": true}}
    }))?))
}

/// Reads an SSE response until it ends, calling `on_live` for server requests.
async fn read_sse(
    resp: http::Response<Incoming>,
    mut on_live: impl FnMut(Value) -> Option<Bytes>,
    replies: &mut Vec<Bytes>,
) -> Res<Option<Value>> {
    let mut body = resp.into_body();
    let mut dec = sse::Decoder::new(16 << 20);
    let mut response = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        for ev in dec.feed(data)? {
            if ev.data.trim().is_empty() {
                continue;
            }
            let m: Value = serde_json::from_str(&ev.data)?;
            if m.get("method").is_some() && m.get("id").is_some() {
                if let Some(r) = on_live(m) {
                    replies.push(r);
                }
            } else if m.get("result").is_some() || m.get("error").is_some() {
                response = Some(m);
            }
        }
    }
    Ok(response)
}

/// One legacy session on two connections (requests + SSE on `a`, replies on `b`).
struct LegacyClient {
    a: Conn,
    b: Conn,
    headers: Headers,
    next: u64,
}

impl LegacyClient {
    async fn open(addr: SocketAddr) -> Res<Self> {
        let mut a = Conn::open(addr).await?;
        let b = Conn::open(addr).await?;
        let sid = legacy_open(&mut a).await?;
        Ok(Self {
            a,
            b,
            headers: legacy_headers(&sid),
            next: 1,
        })
    }

    /// A session opened on `first`, its replies posted to `second` (two replicas).
    async fn open_pair(first: SocketAddr, second: SocketAddr) -> Res<Self> {
        let mut a = Conn::open(first).await?;
        let b = Conn::open(second).await?;
        let sid = legacy_open(&mut a).await?;
        Ok(Self {
            a,
            b,
            headers: legacy_headers(&sid),
            next: 1,
        })
    }

    /// Swaps the two connections: the next flow's requests go where the replies went.
    fn swap(&mut self) {
        std::mem::swap(&mut self.a, &mut self.b);
    }

    /// Calls a tool, answering live elicitation with accept; returns the result.
    async fn tool(&mut self, name: &str, args: Value) -> Res<Value> {
        self.tool_metered(name, args, None).await
    }

    /// [`LegacyClient::tool`], marking each step of the flow on `meter`: the request
    /// until the elicitation arrives, the answer until its 202, the rest until the
    /// result (or the whole call when it is answered at once).
    async fn tool_metered(
        &mut self,
        name: &str,
        args: Value,
        mut meter: Option<&mut StepMeter<'_>>,
    ) -> Res<Value> {
        self.next += 1;
        let body = rpc(
            self.next,
            "tools/call",
            json!({"name": name, "arguments": args}),
        );
        let resp = self.a.post(&self.headers, body).await?;
        let status = resp.status();
        if !is_sse(&resp) {
            let bytes = resp.into_body().collect().await?.to_bytes();
            if let Some(m) = meter.as_deref_mut() {
                m.mark("tools/call answered at once (JSON)").await?;
            }
            return result_of(status, &[serde_json::from_slice(&bytes)?]);
        }
        // The elicitation arrives first; answer it on the other connection while this
        // stream stays open, then read on to the response.
        let mut body = resp.into_body();
        let mut dec = sse::Decoder::new(16 << 20);
        let mut response = None;
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for ev in dec.feed(data)? {
                if ev.data.trim().is_empty() {
                    continue;
                }
                let m: Value = serde_json::from_str(&ev.data)?;
                if m.get("method").is_some() && m.get("id").is_some() {
                    if let Some(m) = meter.as_deref_mut() {
                        m.mark("tools/call until the elicitation is delivered")
                            .await?;
                    }
                    let reply = accept_reply(&m)?;
                    let r = self.b.post(&self.headers, reply).await?;
                    let st = r.status();
                    r.into_body().collect().await?;
                    if st != StatusCode::ACCEPTED {
                        return Err(format!("reply refused: HTTP {st}").into());
                    }
                    if let Some(m) = meter.as_deref_mut() {
                        m.mark("the host's answer (POST until 202)").await?;
                    }
                } else if m.get("result").is_some() || m.get("error").is_some() {
                    response = Some(m);
                }
            }
        }
        if let Some(m) = meter {
            m.mark("the retry until the result is delivered").await?;
        }
        result_of(status, &response.into_iter().collect::<Vec<_>>())
    }
}

// ---------------------------------------------------------------------------------
// Scenario 2: MRTR flow.
// ---------------------------------------------------------------------------------

fn check_deleted(r: &Value) -> Res<()> {
    if r.pointer("/structuredContent/deleted")
        .is_some_and(Value::is_string)
    {
        Ok(())
    } else {
        Err(format!("notes_delete did not delete: {r}").into())
    }
}

/// One flow; returns how long the create and the delete took, in µs.
async fn legacy_flow(c: &mut LegacyClient, ws: &str, title: &str) -> Res<(f64, f64)> {
    let t0 = Instant::now();
    c.tool(
        "notes_create",
        json!({"workspaceUri": ws, "title": title, "body": "bench"}),
    )
    .await?;
    let t1 = Instant::now();
    let r = c
        .tool("notes_delete", json!({"workspaceUri": ws, "title": title}))
        .await?;
    check_deleted(&r)?;
    Ok((
        (t1 - t0).as_secs_f64() * 1e6,
        t1.elapsed().as_secs_f64() * 1e6,
    ))
}

/// One flow; returns how long the create and the delete (both rounds) took, in µs.
async fn modern_flow(c: &mut Conn, ws: &str, title: &str) -> Res<(f64, f64)> {
    let t0 = Instant::now();
    let (st, m) = c
        .exchange(
            &modern_headers("tools/call", Some("notes_create")),
            modern_body(
                1,
                "tools/call",
                json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": title, "body": "bench"}}),
                json!({}),
            ),
        )
        .await?;
    result_of(st, &m)?;
    let t1 = Instant::now();
    let args = json!({"workspaceUri": ws, "title": title});
    let form = json!({"elicitation": {"form": {}}});
    let h = modern_headers("tools/call", Some("notes_delete"));
    let (st, m) = c
        .exchange(
            &h,
            modern_body(
                2,
                "tools/call",
                json!({"name": "notes_delete", "arguments": args}),
                form.clone(),
            ),
        )
        .await?;
    let r = result_of(st, &m)?;
    if r["resultType"] != "input_required" {
        return Err(format!("notes_delete did not ask: {r}").into());
    }
    let ask = r
        .pointer("/inputRequests/delete_choice")
        .ok_or("no delete_choice input request")?;
    let note = ask
        .pointer("/params/requestedSchema/properties/note_id/enum/0")
        .cloned()
        .ok_or("no candidate")?;
    let state = r["requestState"].clone();
    let (st, m) = c
        .exchange(
            &h,
            modern_body(
                3,
                "tools/call",
                json!({"name": "notes_delete", "arguments": args,
                       "inputResponses": {"delete_choice": {"action": "accept", "content": {"note_id": note, "confirm": true}}},
                       "requestState": state}),
                form,
            ),
        )
        .await?;
    check_deleted(&result_of(st, &m)?)?;
    Ok((
        (t1 - t0).as_secs_f64() * 1e6,
        t1.elapsed().as_secs_f64() * 1e6,
    ))
}

// ---------------------------------------------------------------------------------
// Scenario 5: the store engines.
// ---------------------------------------------------------------------------------

/// A throw-away PostgreSQL cluster (PostgreSQL's durable defaults) for `scenario`, and
/// the URL of a new database `db` on it.
fn pg_database(scenario: &str, db: &str) -> Res<(pg_cluster::PgCluster, String)> {
    eprintln!(
        "bench: {scenario}: starting a PostgreSQL cluster (load {})",
        load_avg()
    );
    let cluster = pg_cluster::PgCluster::start_with(pg_cluster::Durability::Durable)?;
    let url = cluster.create_database(db)?;
    Ok((cluster, url))
}

/// The modern MRTR flow (create, delete round 1, accepted retry: two store writes and
/// a nonce claim) on SQLite vs PostgreSQL, one instance each, flows alternating.
async fn store(env: &Env, opts: &Opts, sqlite: &Proc, report: &mut Report) -> Res<()> {
    let (cluster, url) = pg_database("store", "bench")?;
    let postgres = env.server_on(&url, "postgres")?;
    let mut conns = [
        Conn::open(sqlite.addr).await?,
        Conn::open(postgres.addr).await?,
    ];
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let mut counter = 0u64;
    for c in &mut conns {
        counter += 1;
        modern_flow(c, &ws, &format!("store-{counter}")).await?;
    }
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut lats: [Vec<f64>; 2] = Default::default();
    let mut ratios = Vec::new();
    for round in 0..opts.rounds {
        let mut busy = [0.0f64; 2];
        let mut ns: [Vec<f64>; 2] = Default::default();
        let end = Instant::now() + Duration::from_secs_f64(secs * 2.0);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..2 {
                let v = (turn + k) % 2;
                counter += 1;
                let t0 = Instant::now();
                modern_flow(&mut conns[v], &ws, &format!("store-{counter}")).await?;
                let took = t0.elapsed().as_secs_f64();
                busy[v] += took;
                ns[v].push(took * 1e6);
            }
            turn += 1;
        }
        let this = [0, 1].map(|v| ns[v].len() as f64 / busy[v].max(1e-9));
        for v in 0..2 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[1] / this[0]);
        eprintln!(
            "  round {}: SQLite {:>6.1} flows/s  PostgreSQL {:>6.1}",
            round + 1,
            this[0],
            this[1]
        );
    }
    let rate = [0, 1].map(|v| median(&rates[v]));
    let ratio = median(&ratios);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 5. Store engines: the modern MRTR flow (notes_create, notes_delete, accepted retry) on one instance each, flows alternating one by one ({} rounds × {} s)\n",
        opts.rounds,
        secs * 2.0
    );
    let _ = writeln!(md, "| store | flows/s | median flow µs |");
    let _ = writeln!(md, "|---|---:|---:|");
    for (v, name) in [
        "SQLite (WAL, synchronous commits)",
        "PostgreSQL (local cluster, durable defaults)",
    ]
    .iter()
    .enumerate()
    {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_f(rate[v], 1),
            fmt_f(median(&lats[v]), 0)
        );
    }
    let _ = writeln!(
        md,
        "\nPostgreSQL/SQLite (median of per-round ratios): **{}**",
        fmt_f(ratio, 3)
    );
    report.add(
        "store",
        md,
        json!({"sqlite_flows_per_s": rate[0], "postgres_flows_per_s": rate[1], "ratio": ratio,
               "per_round_sqlite": rates[0], "per_round_postgres": rates[1],
               "median_flow_us_sqlite": median(&lats[0]), "median_flow_us_postgres": median(&lats[1])}),
    );
    drop(conns);
    drop(postgres);
    drop(cluster);
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 6: several instances behind the gateway.
// ---------------------------------------------------------------------------------

/// The gateway variants of the instances scenario, in report order.
const INSTANCE_VARIANTS: [&str; 2] = ["gateway over one instance", "gateway over two instances"];

/// The legacy MRTR flow through a gateway over two `dualera serve` instances on one
/// PostgreSQL vs a gateway over one of them. At concurrency 1 flows alternate one by one;
/// above, the variants alternate in time slices (order rotating every round).
async fn instances(env: &Env, opts: &Opts, report: &mut Report) -> Res<()> {
    let (cluster, url) = pg_database("instances", "instances")?;
    // The same configuration, so the same [[state.keys]]: a state either signed verifies
    // on the other.
    let a = env.server_on(&url, "instance-a")?;
    let b = env.server_on(&url, "instance-b")?;
    let gateways = [
        env.gateway_over(&[&a], "instances-1", &env.nocache_config, "warn")?,
        env.gateway_over(&[&a, &b], "instances-2", &env.nocache_config, "warn")?,
    ];
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let counter = Arc::new(AtomicUsize::new(0));
    let title = |counter: &AtomicUsize| format!("inst-{}", counter.fetch_add(1, Ordering::Relaxed));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 6. Instances: the legacy MRTR flow (notes_create, notes_delete with one elicitation, accepted) through a gateway over two `dualera serve` instances on one PostgreSQL vs over one of them ({} rounds × {} s per variant)\n",
        opts.rounds,
        secs
    );
    let _ = writeln!(
        md,
        "| concurrency | over one: flows/s | over two: flows/s | two/one (median of per-round ratios) | CPU s instance A / B (two-instance variant) |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---|");
    let mut json_levels = Vec::new();
    for conc in [1usize, 8] {
        let mut clients: [Vec<LegacyClient>; 2] = Default::default();
        for (v, g) in gateways.iter().enumerate() {
            for _ in 0..conc {
                let mut c = LegacyClient::open(g.addr).await?;
                legacy_flow(&mut c, &ws, &title(&counter)).await?;
                clients[v].push(c);
            }
        }
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut ratios = Vec::new();
        let mut spread = (0.0f64, 0.0f64);
        for round in 0..opts.rounds {
            let mut this = [0.0f64; 2];
            if conc == 1 {
                let mut busy = [0.0f64; 2];
                let mut n = [0usize; 2];
                let end = Instant::now() + Duration::from_secs_f64(secs * 2.0);
                let mut turn = 0usize;
                let mut cpu_two = (0.0, 0.0);
                while Instant::now() < end && turn < 100_000 {
                    for k in 0..2 {
                        let v = (turn + k) % 2;
                        // CPU of each instance around the two-instance flows only.
                        let before = if v == 1 {
                            (cpu_of(a.pid()), cpu_of(b.pid()))
                        } else {
                            (0.0, 0.0)
                        };
                        let t0 = Instant::now();
                        legacy_flow(&mut clients[v][0], &ws, &title(&counter)).await?;
                        busy[v] += t0.elapsed().as_secs_f64();
                        n[v] += 1;
                        if v == 1 {
                            cpu_two.0 += cpu_of(a.pid()) - before.0;
                            cpu_two.1 += cpu_of(b.pid()) - before.1;
                        }
                    }
                    turn += 1;
                }
                spread.0 += cpu_two.0;
                spread.1 += cpu_two.1;
                for v in 0..2 {
                    this[v] = n[v] as f64 / busy[v].max(1e-9);
                }
            } else {
                for k in 0..2 {
                    let v = (round + k) % 2;
                    let before = (cpu_of(a.pid()), cpu_of(b.pid()));
                    let end = Instant::now() + Duration::from_secs_f64(secs);
                    let t0 = Instant::now();
                    let mut tasks = Vec::new();
                    for mut c in std::mem::take(&mut clients[v]) {
                        let ws = ws.clone();
                        let counter = counter.clone();
                        tasks.push(tokio::spawn(async move {
                            let mut n = 0usize;
                            while Instant::now() < end && n < 100_000 {
                                let t = format!("inst-{}", counter.fetch_add(1, Ordering::Relaxed));
                                legacy_flow(&mut c, &ws, &t).await?;
                                n += 1;
                            }
                            Ok::<_, BoxError>((c, n))
                        }));
                    }
                    let mut n = 0usize;
                    for t in tasks {
                        let (c, done) = t.await??;
                        clients[v].push(c);
                        n += done;
                    }
                    this[v] = n as f64 / t0.elapsed().as_secs_f64().max(1e-9);
                    if v == 1 {
                        spread.0 += cpu_of(a.pid()) - before.0;
                        spread.1 += cpu_of(b.pid()) - before.1;
                    }
                }
            }
            for v in 0..2 {
                rates[v].push(this[v]);
            }
            ratios.push(this[1] / this[0]);
            eprintln!(
                "  concurrency {conc}, round {}: over one {:>6.1} flows/s  over two {:>6.1}",
                round + 1,
                this[0],
                this[1]
            );
        }
        let rate = [0, 1].map(|v| median(&rates[v]));
        let ratio = median(&ratios);
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | **{}** | {} / {} |",
            fmt_f(rate[0], 1),
            fmt_f(rate[1], 1),
            fmt_f(ratio, 3),
            fmt_f(spread.0, 2),
            fmt_f(spread.1, 2)
        );
        json_levels.push(
            json!({"concurrency": conc, "one_flows_per_s": rate[0], "two_flows_per_s": rate[1],
            "ratio": ratio, "per_round_one": rates[0], "per_round_two": rates[1],
            "two_instance_cpu_s": [spread.0, spread.1]}),
        );
    }
    let _ = writeln!(
        md,
        "\nVariants: {}. Both gateways have the cache off; the instances share one configuration (one `[[state.keys]]`), and the CPU columns show the two-instance gateway's work landing on both.",
        INSTANCE_VARIANTS.join(", ")
    );
    report.add("instances", md, json!({ "levels": json_levels }));
    drop(gateways);
    drop(a);
    drop(b);
    drop(cluster);
    Ok(())
}

/// The MRTR flow's variants, in report order.
const FLOW_VARIANTS: [&str; 3] = [
    "legacy session through the gateway (live elicitation)",
    "modern client direct (input_required + retry)",
    "modern client through the bare proxy (same exchange)",
];

async fn mrtr(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway(server, "mrtr")?;
    let bare = env.bare_proxy(server)?;
    let _perf = PerfGuard::start(env, gateway.pid(), "mrtr");
    eprintln!("bench: mrtr (load {})", load_avg());
    let mut legacy = LegacyClient::open(gateway.addr).await?;
    let mut modern = Conn::open(server.addr).await?;
    let mut proxied = Conn::open(bare.addr).await?;
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let mut counter = 0u64;
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut lats: [Vec<f64>; 3] = Default::default();
    let mut steps: [Vec<(f64, f64)>; 3] = Default::default();
    let mut ratios = Vec::new();
    let mut floor_ratios = Vec::new();
    // Warm-up: one flow each.
    counter += 1;
    legacy_flow(&mut legacy, &ws, &format!("flow-{counter}")).await?;
    counter += 1;
    modern_flow(&mut modern, &ws, &format!("flow-{counter}")).await?;
    counter += 1;
    modern_flow(&mut proxied, &ws, &format!("flow-{counter}")).await?;
    let mut gw_cpu = (0.0f64, 0usize);
    let mut bare_cpu = (0.0f64, 0usize);
    let mut legacy_over_bare = Vec::new();
    let mut gw_switches = 0u64;
    // Flows alternate one by one (which variant goes first rotates every turn), so all
    // variants see the same machine: a neighbour's burst or a slow second lands on
    // each, and each round's ratio compares like with like.
    for round in 0..opts.rounds {
        let mut busy = [0.0f64; 3];
        let mut n = [0usize; 3];
        let mut ns: [Vec<f64>; 3] = Default::default();
        let cpu0 = cpu_of(gateway.pid());
        let bare0 = cpu_of(bare.pid());
        let sw0 = switches_of(gateway.pid());
        let end = Instant::now() + Duration::from_secs_f64(secs * 3.0);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..3 {
                let v = (turn + k) % 3;
                counter += 1;
                let title = format!("flow-{counter}");
                let t0 = Instant::now();
                let step = match v {
                    0 => legacy_flow(&mut legacy, &ws, &title).await?,
                    1 => modern_flow(&mut modern, &ws, &title).await?,
                    _ => modern_flow(&mut proxied, &ws, &title).await?,
                };
                let took = t0.elapsed().as_secs_f64();
                steps[v].push(step);
                ns[v].push(took * 1e6);
                busy[v] += took;
                n[v] += 1;
            }
            turn += 1;
        }
        // The gateway only works during legacy flows, so its whole-round CPU is theirs.
        gw_cpu.0 += cpu_of(gateway.pid()) - cpu0;
        gw_switches += switches_of(gateway.pid()) - sw0;
        gw_cpu.1 += n[0];
        // Likewise the bare proxy only works during the proxied modern flows.
        bare_cpu.0 += cpu_of(bare.pid()) - bare0;
        bare_cpu.1 += n[2];
        let this = [0, 1, 2].map(|v| n[v] as f64 / busy[v].max(1e-9));
        legacy_over_bare.push(this[0] / this[2]);
        for v in 0..3 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[0] / this[1]);
        floor_ratios.push(this[2] / this[1]);
        eprintln!(
            "  round {}: legacy via gateway {:>6.1} flows/s  modern direct {:>6.1}  modern via bare proxy {:>6.1}",
            round + 1,
            this[0],
            this[1],
            this[2]
        );
    }
    let rate = [0, 1, 2].map(|v| median(&rates[v]));
    let ratio = median(&ratios);
    let floor_ratio = median(&floor_ratios);
    report.mrtr_ratio = Some((ratio, floor_ratio));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 2. MRTR flow: notes_create + notes_delete with one elicitation (accept), one client per variant, flows alternating one by one ({} rounds × {} s; flows/s = flows ÷ time spent in that variant's flows)\n",
        opts.rounds,
        secs * 3.0
    );
    let step_median =
        |v: usize, f: fn(&(f64, f64)) -> f64| median(&steps[v].iter().map(f).collect::<Vec<_>>());
    let _ = writeln!(
        md,
        "| variant | flows/s | median flow µs | median create µs | median delete µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (v, name) in FLOW_VARIANTS.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            fmt_f(rate[v], 1),
            fmt_f(median(&lats[v]), 0),
            fmt_f(step_median(v, |x| x.0), 0),
            fmt_f(step_median(v, |x| x.1), 0)
        );
    }
    let gw_cpu_us = gw_cpu.0 * 1e6 / gw_cpu.1.max(1) as f64;
    let bare_cpu_us = bare_cpu.0 * 1e6 / bare_cpu.1.max(1) as f64;
    let legacy_over_bare = median(&legacy_over_bare);
    report.mrtr_one_hop = Some((legacy_over_bare, gw_cpu_us));
    let gw_sw = gw_switches as f64 / gw_cpu.1.max(1) as f64;
    let _ = writeln!(
        md,
        "\nlegacy/modern ratio (median of per-round ratios): **{}**; gateway CPU per legacy flow: {} µs, context switches per legacy flow: {}",
        fmt_f(ratio, 3),
        fmt_f(gw_cpu_us, 0),
        fmt_f(gw_sw, 1)
    );
    let _ = writeln!(
        md,
        "\nAgainst the one-hop reference: legacy flow / modern flow through the bare proxy **{}** (target ≥ 1.0); gateway CPU per legacy flow {} µs (target ≤ 500) beside the bare proxy's CPU per modern flow {} µs.",
        fmt_f(legacy_over_bare, 3),
        fmt_f(gw_cpu_us, 0),
        fmt_f(bare_cpu_us, 0)
    );
    let _ = writeln!(
        md,
        "\nFor scale: the same modern exchange through the bare proxy runs at **{}**× direct. It crosses one proxy hop per request, as the gateway's upstream side does; the legacy flow also carries the host's answer as a fourth request and the elicitation and result as SSE events.",
        fmt_f(floor_ratio, 3)
    );
    report.add(
        "mrtr",
        md,
        json!({"legacy_flows_per_s": rate[0], "modern_flows_per_s": rate[1], "bare_proxy_flows_per_s": rate[2],
               "ratio": ratio, "bare_proxy_ratio": floor_ratio,
               "gateway_cpu_us_per_flow": gw_cpu_us, "gateway_context_switches_per_flow": gw_sw,
               "bare_proxy_cpu_us_per_flow": bare_cpu_us, "legacy_over_bare_proxy": legacy_over_bare,
               "per_round_legacy": rates[0], "per_round_modern": rates[1], "per_round_bare_proxy": rates[2],
               "median_flow_us_legacy": median(&lats[0]), "median_flow_us_modern": median(&lats[1]),
               "median_flow_us_bare_proxy": median(&lats[2])}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 7: replicas sharing sessions through Redis.
// ---------------------------------------------------------------------------------

/// A throw-away Redis (no persistence) on a free loopback port, killed on drop.
struct Redis {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Redis {
    fn start(env: &Env) -> Res<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = env.dir.join("redis");
        std::fs::create_dir_all(&dir)?;
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("redis-server is not installed (bash tests/services/debian.sh redis-server)")?;
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let r = Self { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.command(&["PING"]).unwrap_or_default().trim() != "+PONG" {
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(r)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// One command over RESP; the raw reply (small replies only).
    fn command(&self, args: &[&str]) -> Res<String> {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            let _ = write!(req, "${}\r\n{a}\r\n", a.len());
        }
        s.write_all(req.as_bytes())?;
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            let done = match out.first() {
                Some(b'$') => text[1..]
                    .split_once("\r\n")
                    .is_some_and(|(len, rest)| rest.len() >= len.parse::<usize>().unwrap_or(0) + 2),
                _ => text.ends_with("\r\n"),
            };
            if done {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// `used_memory` from `INFO memory`, bytes.
    fn used_memory(&self) -> Res<u64> {
        let info = self.command(&["INFO", "memory"])?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| "INFO memory without used_memory".into())
    }

    /// Calls per command from `INFO commandstats`: every command Redis ran, those a
    /// script ran included (`evalsha` is the script itself).
    fn commandstats(&self) -> Res<BTreeMap<String, u64>> {
        let info = self.command(&["INFO", "commandstats"])?;
        Ok(info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect())
    }

    /// Commands run since `before` (a [`Redis::commandstats`]), the `INFO` asking
    /// for them left out.
    fn commands_since(&self, before: &BTreeMap<String, u64>) -> Res<BTreeMap<String, u64>> {
        let mut now = self.commandstats()?;
        if let Some(info) = now.get_mut("info") {
            *info = info.saturating_sub(1);
        }
        Ok(now
            .into_iter()
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(before.get(&k).copied().unwrap_or(0));
                (d > 0).then_some((k, d))
            })
            .collect())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// A TCP proxy in front of Redis that counts its clients' writes: a client sends
/// each command, or each pipeline, in one write, so with one flow at a time a write
/// is one round trip. Used for the per-step figures only (it adds a hop).
struct CountingProxy {
    addr: SocketAddr,
    trips: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    async fn start(redis_port: u16) -> Res<Self> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let trips = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = trips.clone();
        let task = tokio::spawn(async move {
            // Bounded: the replicas open two connections each, and reconnect rarely.
            for _ in 0..64 {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await
                    else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = cr.read(&mut buf).await.unwrap_or(0);
                            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    };
                    let down = tokio::io::copy(&mut sr, &mut cw);
                    tokio::select! {
                        () = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        Ok(Self { addr, trips, task })
    }

    fn trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The per-step passes: where a flow's requests and answers go.
const STEP_PASSES: [&str; 2] = [
    "any replica (requests on one replica, the elicitation's answer on the other)",
    "one replica (all of a flow on the replica holding its SSE connection)",
];

/// How long a step is given to finish what it started in the background (a relay's
/// last read, a wake-up) before its figures are read.
const STEP_SETTLE: Duration = Duration::from_millis(25);

/// One step's figures summed over the flows: how often, Redis commands, round trips,
/// commands by name.
type StepRow = (&'static str, usize, f64, f64, BTreeMap<String, u64>);

/// Redis commands (`INFO commandstats`) and round trips (the counting proxy) per step
/// of a replicated flow, the steady background (sweepers, readiness probes) taken out.
struct StepMeter<'a> {
    redis: &'a Redis,
    proxy: &'a CountingProxy,
    /// Background per second: commands, round trips.
    background: (f64, f64),
    last: (BTreeMap<String, u64>, u64, Instant),
    steps: Vec<StepRow>,
}

impl<'a> StepMeter<'a> {
    fn new(redis: &'a Redis, proxy: &'a CountingProxy, background: (f64, f64)) -> Res<Self> {
        Ok(Self {
            redis,
            proxy,
            background,
            last: (redis.commandstats()?, proxy.trips(), Instant::now()),
            steps: Vec::new(),
        })
    }

    /// Starts counting from now.
    fn reset(&mut self) -> Res<()> {
        self.last = (
            self.redis.commandstats()?,
            self.proxy.trips(),
            Instant::now(),
        );
        Ok(())
    }

    /// Ends `step`: what Redis ran since the last mark is its.
    async fn mark(&mut self, step: &'static str) -> Res<()> {
        tokio::time::sleep(STEP_SETTLE).await;
        let cmds = self.redis.commands_since(&self.last.0)?;
        let trips = self.proxy.trips().saturating_sub(self.last.1) as f64;
        let secs = self.last.2.elapsed().as_secs_f64();
        let total = cmds.values().sum::<u64>() as f64;
        let i = match self.steps.iter().position(|r| r.0 == step) {
            Some(i) => i,
            None => {
                self.steps.push((step, 0, 0.0, 0.0, BTreeMap::new()));
                self.steps.len() - 1
            }
        };
        let row = &mut self.steps[i];
        row.1 += 1;
        row.2 += (total - self.background.0 * secs).max(0.0);
        row.3 += (trips - self.background.1 * secs).max(0.0);
        for (k, v) in cmds {
            *row.4.entry(k).or_default() += v;
        }
        self.reset()
    }
}

/// Per step of a replicated flow (initialize, notes_create, notes_delete with its
/// elicitation): two fresh replicas that reach Redis through a counting proxy, one
/// flow at a time, each flow on a new session; first with requests and answers on
/// different replicas (any replica), then with all of a flow on one replica (the one
/// holding the SSE connection also gets the answer). Returns the steps of both
/// passes, the idle background per second and the bytes of one session's serialized
/// state after a flow.
async fn replica_steps(
    env: &Env,
    server: &Proc,
    redis: &Redis,
    flows: usize,
) -> Res<([Vec<StepRow>; 2], (f64, f64), u64)> {
    let proxy = CountingProxy::start(redis.port).await?;
    let url = format!("redis://{}/0", proxy.addr);
    let config = redis_config(env, "bench-gateway-redis-counted.toml", &url)?;
    let first = env.gateway_with(server, "replica-3", &config, "warn")?;
    let second = env.gateway_with(server, "replica-4", &config, "warn")?;
    let ws = env.scratch_uri.clone();
    for k in 0..2 {
        let mut c = LegacyClient::open_pair(first.addr, second.addr).await?;
        legacy_flow(&mut c, &ws, &format!("replica-steps-warm-{k}")).await?;
    }
    // The background: both replicas idle (sweepers, readiness probes).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (c0, t0, i0) = (redis.commandstats()?, proxy.trips(), Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = redis.commands_since(&c0)?.values().sum::<u64>() as f64;
    let secs = i0.elapsed().as_secs_f64();
    let background = (idle / secs, proxy.trips().saturating_sub(t0) as f64 / secs);
    let mut passes: [Vec<StepRow>; 2] = Default::default();
    let mut state_bytes = 0;
    for (pass, steps) in passes.iter_mut().enumerate() {
        let mut meter = StepMeter::new(redis, &proxy, background)?;
        for k in 0..flows {
            let (a, b) = match (pass, k % 2) {
                (0, 0) => (first.addr, second.addr),
                (0, _) => (second.addr, first.addr),
                (_, 0) => (first.addr, first.addr),
                _ => (second.addr, second.addr),
            };
            meter.reset()?;
            let mut c = LegacyClient::open_pair(a, b).await?;
            meter.mark("initialize + notifications/initialized").await?;
            let title = format!("replica-steps-{pass}-{k}");
            c.tool_metered(
                "notes_create",
                json!({"workspaceUri": ws, "title": title, "body": "bench"}),
                Some(&mut meter),
            )
            .await?;
            let r = c
                .tool_metered(
                    "notes_delete",
                    json!({"workspaceUri": ws, "title": title}),
                    Some(&mut meter),
                )
                .await?;
            check_deleted(&r)?;
            if pass == 0 && k + 1 == flows {
                // The serialized state of a session after a flow (the `d` field).
                let sid = c.headers[0].1.to_str()?.to_owned();
                let key = format!("dualera:s:{{{sid}}}");
                let n = redis.command(&["HSTRLEN", &key, "d"])?;
                state_bytes = n.trim().trim_start_matches(':').parse().unwrap_or(0);
            }
        }
        *steps = meter.steps;
    }
    Ok((passes, background, state_bytes))
}

/// Runs flows on every client at once for `secs`; returns the clients, the flows done
/// and the time taken.
async fn concurrent_flows(
    clients: Vec<LegacyClient>,
    ws: &str,
    secs: f64,
    swap: bool,
    counter: &Arc<AtomicUsize>,
) -> Res<(Vec<LegacyClient>, usize, f64)> {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for mut c in clients {
        let ws = ws.to_owned();
        let counter = counter.clone();
        tasks.spawn(async move {
            let mut n = 0usize;
            while Instant::now() < end && n < 100_000 {
                let k = counter.fetch_add(1, Ordering::Relaxed);
                legacy_flow(&mut c, &ws, &format!("replica-load-{k}")).await?;
                if swap {
                    c.swap();
                }
                n += 1;
            }
            Ok::<_, BoxError>((c, n))
        });
    }
    let mut back = Vec::new();
    let mut flows = 0;
    while let Some(r) = tasks.join_next().await {
        let (c, n) = r??;
        back.push(c);
        flows += n;
    }
    Ok((back, flows, t0.elapsed().as_secs_f64()))
}

/// The bench's gateway config with `session_store = url`, written as `name`.
fn redis_config(env: &Env, name: &str, url: &str) -> Res<PathBuf> {
    let section = std::fs::read_to_string(&env.gateway_config)?;
    let config = env.dir.join(name);
    std::fs::write(
        &config,
        section.replacen(
            "[gateway]\n",
            &format!("[gateway]\nsession_store = {url:?}\n"),
            1,
        ),
    )?;
    Ok(config)
}

/// A Redis figure in the row of variant `v`: only the replicated one (1) has one.
fn replicated_only(v: usize, value: f64, digits: usize) -> String {
    if v == 1 {
        fmt_f(value, digits)
    } else {
        "–".into()
    }
}

const REPLICA_VARIANTS: [&str; 2] = [
    "1 gateway, sessions in memory",
    "2 gateway replicas, sessions in Redis (requests alternate)",
];

async fn replicas(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let redis = Redis::start(env)?;
    let config = redis_config(env, "bench-gateway-redis.toml", &redis.url())?;
    let memory = env.gateway(server, "replicas-memory")?;
    let first = env.gateway_with(server, "replica-1", &config, "warn")?;
    let second = env.gateway_with(server, "replica-2", &config, "warn")?;
    let _perf = PerfGuard::start(env, first.pid(), "replicas");
    eprintln!("bench: replicas (load {})", load_avg());
    let mut local = LegacyClient::open(memory.addr).await?;
    let mut shared = LegacyClient::open_pair(first.addr, second.addr).await?;
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let mut counter = 0u64;
    for _ in 0..2 {
        counter += 1;
        legacy_flow(&mut local, &ws, &format!("replica-flow-{counter}")).await?;
        counter += 1;
        legacy_flow(&mut shared, &ws, &format!("replica-flow-{counter}")).await?;
        shared.swap();
    }
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut lats: [Vec<f64>; 2] = Default::default();
    let mut ratios = Vec::new();
    let mut cpu = [0.0f64; 3];
    let mut flows = [0usize; 2];
    let mut commands = 0u64;
    for round in 0..opts.rounds {
        let stats0 = redis.commandstats()?;
        let mut busy = [0.0f64; 2];
        let mut n = [0usize; 2];
        let mut ns: [Vec<f64>; 2] = Default::default();
        let cpu0 = [
            cpu_of(memory.pid()),
            cpu_of(first.pid()) + cpu_of(second.pid()),
            cpu_of(redis.pid()),
        ];
        let end = Instant::now() + Duration::from_secs_f64(secs * 2.0);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..2 {
                let v = (turn + k) % 2;
                counter += 1;
                let title = format!("replica-flow-{counter}");
                let t0 = Instant::now();
                if v == 0 {
                    legacy_flow(&mut local, &ws, &title).await?;
                } else {
                    legacy_flow(&mut shared, &ws, &title).await?;
                    shared.swap();
                }
                let took = t0.elapsed().as_secs_f64();
                ns[v].push(took * 1e6);
                busy[v] += took;
                n[v] += 1;
            }
            turn += 1;
        }
        cpu[0] += cpu_of(memory.pid()) - cpu0[0];
        cpu[1] += cpu_of(first.pid()) + cpu_of(second.pid()) - cpu0[1];
        cpu[2] += cpu_of(redis.pid()) - cpu0[2];
        commands += redis.commands_since(&stats0)?.values().sum::<u64>();
        flows[0] += n[0];
        flows[1] += n[1];
        let this = [0, 1].map(|v| n[v] as f64 / busy[v].max(1e-9));
        for v in 0..2 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[1] / this[0]);
        eprintln!(
            "  round {}: in memory {:>6.1} flows/s  2 replicas + Redis {:>6.1}",
            round + 1,
            this[0],
            this[1]
        );
    }
    // Capacity: several hosts at once per variant, variants alternating by round.
    let hosts = opts.replica_hosts.max(1);
    let counter = Arc::new(AtomicUsize::new(0));
    let mut locals = Vec::new();
    let mut shareds = Vec::new();
    for i in 0..hosts {
        locals.push(LegacyClient::open(memory.addr).await?);
        shareds.push(if i % 2 == 0 {
            LegacyClient::open_pair(first.addr, second.addr).await?
        } else {
            LegacyClient::open_pair(second.addr, first.addr).await?
        });
    }
    let mut load_rates: [Vec<f64>; 2] = Default::default();
    let mut load_ratios = Vec::new();
    let mut load_cpu = [0.0f64; 3];
    let mut load_flows = [0usize; 2];
    let mut load_commands = 0u64;
    for round in 0..opts.rounds {
        let mut this = [0.0f64; 2];
        for k in 0..2 {
            let v = (round + k) % 2;
            let cpu0 = [
                cpu_of(memory.pid()),
                cpu_of(first.pid()) + cpu_of(second.pid()),
                cpu_of(redis.pid()),
            ];
            let (n, took) = if v == 0 {
                let (back, n, took) =
                    concurrent_flows(std::mem::take(&mut locals), &ws, secs, false, &counter)
                        .await?;
                locals = back;
                load_cpu[0] += cpu_of(memory.pid()) - cpu0[0];
                (n, took)
            } else {
                let stats0 = redis.commandstats()?;
                let (back, n, took) =
                    concurrent_flows(std::mem::take(&mut shareds), &ws, secs, true, &counter)
                        .await?;
                shareds = back;
                load_cpu[1] += cpu_of(first.pid()) + cpu_of(second.pid()) - cpu0[1];
                load_cpu[2] += cpu_of(redis.pid()) - cpu0[2];
                load_commands += redis.commands_since(&stats0)?.values().sum::<u64>();
                (n, took)
            };
            load_flows[v] += n;
            this[v] = n as f64 / took.max(1e-9);
            load_rates[v].push(this[v]);
        }
        load_ratios.push(this[1] / this[0]);
        eprintln!(
            "  round {} ({hosts} hosts each): in memory {:>6.1} flows/s  2 replicas + Redis {:>6.1}",
            round + 1,
            this[0],
            this[1]
        );
    }
    let load_rate = [0, 1].map(|v| median(&load_rates[v]));
    let load_ratio = median(&load_ratios);
    let rate = [0, 1].map(|v| median(&rates[v]));
    let ratio = median(&ratios);
    let per_flow = |c: f64, n: usize| c * 1e6 / n.max(1) as f64;
    let load_cpu_us = [
        per_flow(load_cpu[0], load_flows[0]),
        per_flow(load_cpu[1], load_flows[1]),
        per_flow(load_cpu[2], load_flows[1]),
    ];
    let cpu_us = [
        per_flow(cpu[0], flows[0]),
        per_flow(cpu[1], flows[1]),
        per_flow(cpu[2], flows[1]),
    ];
    // Idle sessions: Redis memory before and after opening them, half on each replica.
    let sessions = opts.replica_sessions;
    let before = redis.used_memory()?;
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut opened = open_sessions(first.addr, sessions / 2, 32, deadline).await?;
    opened.extend(open_sessions(second.addr, sessions - sessions / 2, 32, deadline).await?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = redis.used_memory()?;
    let per_session = (after as f64 - before as f64) / opened.len().max(1) as f64;
    let keys = redis.command(&["DBSIZE"])?;
    drop((memory, first, second, locals, shareds, local, shared));
    let (passes, background, state_bytes) = replica_steps(env, server, &redis, 20).await?;
    let commands_per_flow = commands as f64 / flows[1].max(1) as f64;
    let load_commands_per_flow = load_commands as f64 / load_flows[1].max(1) as f64;
    report.replicas = Some((ratio, load_ratio, hosts, opened.len(), per_session));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 7. Replicas: the legacy MRTR flow (notes_create + notes_delete with one elicitation) on 2 replicas sharing Redis vs 1 gateway in memory, flows alternating one by one ({} rounds × {} s)\n",
        opts.rounds,
        secs * 2.0
    );
    let _ = writeln!(
        md,
        "| variant | flows/s | median flow µs | gateway CPU µs per flow | Redis CPU µs per flow | Redis commands per flow |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for (v, name) in REPLICA_VARIANTS.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} |",
            fmt_f(rate[v], 1),
            fmt_f(median(&lats[v]), 0),
            fmt_f(cpu_us[v], 0),
            replicated_only(v, cpu_us[2], 0),
            replicated_only(v, commands_per_flow, 1),
        );
    }
    let _ = writeln!(
        md,
        "\nOne host, flows one after another (latency): replicas/memory ratio (median of per-round ratios) **{}**; Redis CPU per replicated flow: {} µs (both replicas' CPU is the gateway figure above).\n",
        fmt_f(ratio, 3),
        fmt_f(cpu_us[2], 0)
    );
    let _ = writeln!(
        md,
        "{hosts} hosts at once per variant (capacity; variants alternate by round, {} s each):\n\n| variant | flows/s | gateway CPU µs per flow | Redis CPU µs per flow | Redis commands per flow |\n|---|---:|---:|---:|---:|",
        secs
    );
    for (v, name) in REPLICA_VARIANTS.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            fmt_f(load_rate[v], 1),
            fmt_f(load_cpu_us[v], 0),
            replicated_only(v, load_cpu_us[2], 0),
            replicated_only(v, load_commands_per_flow, 1),
        );
    }
    let _ = writeln!(
        md,
        "\nreplicas/memory ratio with {hosts} hosts: **{}**; Redis CPU per replicated flow: {} µs.\n",
        fmt_f(load_ratio, 3),
        fmt_f(load_cpu_us[2], 0)
    );
    let _ = writeln!(
        md,
        "Idle sessions in Redis: {} sessions opened, `used_memory` {:.1} → {:.1} MiB: **{} bytes per session** (DBSIZE {}).",
        opened.len(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        fmt_f(per_session, 0),
        keys.trim().trim_start_matches(':')
    );
    let mut step_json = Vec::new();
    let mut flow_totals = [(0.0, 0.0); 2];
    for (pass, steps) in passes.iter().enumerate() {
        let _ = writeln!(
            md,
            "\nPer step of a replicated flow, {} ({} flows, one at a time, each on a new session; round trips counted by a proxy in front of Redis; the idle background, {} commands and {} round trips per second, taken out):\n\n| step | Redis commands | round trips | commands by name (per step) |\n|---|---:|---:|---|",
            STEP_PASSES[pass],
            steps.first().map_or(0, |r| r.1),
            fmt_f(background.0, 1),
            fmt_f(background.1, 1)
        );
        let (mut flow_cmds, mut flow_trips) = (0.0, 0.0);
        for (step, n, cmds, trips, names) in steps {
            let n = (*n).max(1) as f64;
            flow_cmds += cmds / n;
            flow_trips += trips / n;
            let by_name = names
                .iter()
                .map(|(k, v)| format!("{k} {}", fmt_f(*v as f64 / n, 1)))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                md,
                "| {step} | {} | {} | {by_name} |",
                fmt_f(cmds / n, 1),
                fmt_f(trips / n, 1)
            );
            step_json.push(json!({"pass": STEP_PASSES[pass], "step": step, "commands": cmds / n, "round_trips": trips / n}));
        }
        let _ = writeln!(
            md,
            "| **whole flow** | **{}** | **{}** | |",
            fmt_f(flow_cmds, 1),
            fmt_f(flow_trips, 1)
        );
        flow_totals[pass] = (flow_cmds, flow_trips);
    }
    let (flow_cmds, flow_trips) = flow_totals[0];
    let _ = writeln!(
        md,
        "\nOne session's serialized state after a flow: {state_bytes} bytes."
    );
    eprintln!(
        "  per flow: Redis commands {} (rounds) / {} ({hosts} hosts); per-step total {} commands, {} round trips (any replica), {} commands, {} round trips (one replica); state {state_bytes} bytes",
        fmt_f(commands_per_flow, 1),
        fmt_f(load_commands_per_flow, 1),
        fmt_f(flow_cmds, 1),
        fmt_f(flow_trips, 1),
        fmt_f(flow_totals[1].0, 1),
        fmt_f(flow_totals[1].1, 1)
    );
    report.add(
        "replicas",
        md,
        json!({"memory_flows_per_s": rate[0], "replicas_flows_per_s": rate[1], "ratio": ratio,
               "per_round_memory": rates[0], "per_round_replicas": rates[1],
               "gateway_cpu_us_per_flow_memory": cpu_us[0], "gateway_cpu_us_per_flow_replicas": cpu_us[1],
               "redis_cpu_us_per_flow": cpu_us[2], "idle_sessions": opened.len(),
               "hosts": hosts, "load_memory_flows_per_s": load_rate[0], "load_replicas_flows_per_s": load_rate[1],
               "load_ratio": load_ratio, "load_gateway_cpu_us_per_flow_memory": load_cpu_us[0],
               "load_gateway_cpu_us_per_flow_replicas": load_cpu_us[1], "load_redis_cpu_us_per_flow": load_cpu_us[2],
               "redis_used_memory_before": before, "redis_used_memory_after": after,
               "redis_bytes_per_idle_session": per_session,
               "redis_commands_per_flow": commands_per_flow, "load_redis_commands_per_flow": load_commands_per_flow,
               "steps": step_json, "state_bytes": state_bytes, "flow_commands": flow_cmds,
               "flow_commands_one_replica": flow_totals[1].0, "flow_round_trips_one_replica": flow_totals[1].1, "flow_round_trips": flow_trips}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 3: session memory.
// ---------------------------------------------------------------------------------

/// Opens `count` initialized legacy sessions over `conns` connections; stops early at
/// `deadline`. Returns the session ids opened.
async fn open_sessions(
    addr: SocketAddr,
    count: usize,
    conns: usize,
    deadline: Instant,
) -> Res<Vec<String>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns.min(count.max(1)) {
        let next = next.clone();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            let mut c = Conn::open(addr).await?;
            while next.fetch_add(1, Ordering::Relaxed) < count {
                if Instant::now() >= deadline {
                    break;
                }
                ids.push(legacy_open(&mut c).await?);
            }
            Ok::<_, BoxError>(ids)
        });
    }
    let mut all = Vec::with_capacity(count);
    while let Some(r) = tasks.join_next().await {
        all.extend(r??);
    }
    Ok(all)
}

async fn settle_rss(p: &Proc) -> Res<u64> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    p.rss()
}

async fn memory(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway(server, "memory")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "memory");
    eprintln!("bench: memory (load {})", load_avg());
    // Warm the discover cache, the runtime and the connections, then end those sessions.
    let warm = open_sessions(
        gateway.addr,
        64,
        32,
        Instant::now() + Duration::from_secs(60),
    )
    .await?;
    let mut c = Conn::open(gateway.addr).await?;
    for sid in &warm {
        let mut req = Request::delete("/mcp").body(Full::new(Bytes::new()))?;
        req.headers_mut().insert(header::HOST, c.host.clone());
        for (k, v) in legacy_headers(sid) {
            req.headers_mut().insert(k, v);
        }
        c.tx.ready().await?;
        let r = c.tx.send_request(req).await?;
        r.into_body().collect().await?;
    }
    let base = settle_rss(&gateway).await?;
    let mut rows = vec![(0usize, base, 0.0f64, 0.0f64)];
    let mut open = 0usize;
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut note = String::new();
    let mut keep = Vec::new();
    for &level in &opts.session_levels {
        let t0 = Instant::now();
        let ids = open_sessions(gateway.addr, level.saturating_sub(open), 64, deadline).await?;
        let took = t0.elapsed().as_secs_f64();
        let rate = ids.len() as f64 / took;
        open += ids.len();
        keep.extend(ids);
        let rss = settle_rss(&gateway).await?;
        rows.push((open, rss, rate, took));
        eprintln!(
            "  {open} sessions: RSS {:.1} MiB ({rate:.0} initializes/s)",
            rss as f64 / 1048576.0
        );
        if open < level {
            note = format!(
                "Stopped at {open} sessions: the 240 s bound for this scenario ran out before {level}."
            );
            break;
        }
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 3. Session memory: gateway RSS with idle initialized legacy sessions\n"
    );
    let _ = writeln!(
        md,
        "| sessions | RSS MiB | bytes/session (vs 0) | initialize+initialized/s |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (n, rss, rate, took) in &rows {
        let per = if *n == 0 {
            f64::NAN
        } else {
            (*rss as f64 - base as f64) / *n as f64
        };
        let _ = writeln!(
            md,
            "| {n} | {:.1} | {} | {} |",
            *rss as f64 / 1048576.0,
            fmt_f(per, 0),
            if *n == 0 {
                "–".into()
            } else {
                fmt_f(*rate, 0)
            }
        );
        json_rows.push(json!({"sessions": n, "rss_bytes": rss, "bytes_per_session": if per.is_finite() { json!(per) } else { Value::Null }, "sessions_per_s": rate, "seconds": took}));
        if *n > 0 {
            report.bytes_per_session = Some((*n, per));
        }
    }
    if !note.is_empty() {
        let _ = writeln!(md, "\n{note}");
    }
    report.add(
        "memory",
        md,
        json!({"rows": json_rows, "note": note, "sessions_kept": keep.len()}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Scenario 4: pending rounds.
// ---------------------------------------------------------------------------------

async fn pending(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let n = opts.pending;
    let ws = env.scratch_uri.clone();
    let store = SqliteStore::open(&env.db.to_string_lossy()).map_err(|e| e.to_string())?;
    let before = store.count(&ws).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: pending: creating {n} notes directly (load {})",
        load_avg()
    );
    // The notes to delete, created on the server directly (not measured).
    {
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let next = next.clone();
            let ws = ws.clone();
            let addr = server.addr;
            tasks.spawn(async move {
                let mut c = Conn::open(addr).await?;
                let h = modern_headers("tools/call", Some("notes_create"));
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, BoxError>(());
                    }
                    let (st, m) = c
                        .exchange(
                            &h,
                            modern_body(
                                1,
                                "tools/call",
                                json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": format!("pending-{i}"), "body": "bench"}}),
                                json!({}),
                            ),
                        )
                        .await?;
                    result_of(st, &m)?;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
    }
    let gateway = env.gateway(server, "pending")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "pending");
    let rss0 = settle_rss(&gateway).await?;
    let sessions = open_sessions(
        gateway.addr,
        opts.pending_sessions,
        32,
        Instant::now() + Duration::from_secs(120),
    )
    .await?;
    if sessions.len() < opts.pending_sessions {
        return Err("pending: could not open the sessions in time".into());
    }
    let rss_sessions = settle_rss(&gateway).await?;
    eprintln!(
        "bench: pending: parking {n} requests on {} sessions",
        sessions.len()
    );
    // Park: each request on its own connection, SSE kept open; setup concurrency bounded.
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let (parked_tx, mut parked_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Bytes)>();
    let mut streams = tokio::task::JoinSet::new();
    let park_start = Instant::now();
    for i in 0..n {
        let sid = sessions[i % sessions.len()].clone();
        let gate = gate.clone();
        let parked_tx = parked_tx.clone();
        let ws = ws.clone();
        let addr = gateway.addr;
        streams.spawn(async move {
            let permit = gate.acquire_owned().await?;
            let mut c = Conn::open(addr).await?;
            let h = legacy_headers(&sid);
            let body = rpc(
                1_000_000 + i as u64,
                "tools/call",
                json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": format!("pending-{i}")}}),
            );
            let resp = c.post(&h, body).await?;
            if !is_sse(&resp) {
                let st = resp.status();
                let b = resp.into_body().collect().await?.to_bytes();
                return Err(format!(
                    "request {i}: not parked (HTTP {st}): {}",
                    String::from_utf8_lossy(&b)
                )
                .into());
            }
            let mut permit = Some(permit);
            let mut replies = Vec::new();
            let response = read_sse(
                resp,
                |live| {
                    let reply = accept_reply(&live).ok()?;
                    let _ = parked_tx.send((i, reply));
                    permit.take();
                    None
                },
                &mut replies,
            )
            .await?;
            let r = response.ok_or_else(|| format!("request {i}: stream ended without a response"))?;
            if let Some(e) = r.get("error") {
                return Err(format!("request {i}: {e}").into());
            }
            check_deleted(&r["result"])?;
            Ok::<_, BoxError>(i)
        });
    }
    drop(parked_tx);
    let mut replies: Vec<(usize, Bytes)> = Vec::with_capacity(n);
    let park_deadline = Instant::now() + Duration::from_secs(180);
    while replies.len() < n {
        match tokio::time::timeout_at(park_deadline.into(), parked_rx.recv()).await {
            Ok(Some(r)) => replies.push(r),
            Ok(None) => break,
            Err(_) => break,
        }
        // A stream task that failed before parking shows up here.
        if let Some(Ok(Err(e))) = streams.try_join_next() {
            return Err(e);
        }
    }
    let park_secs = park_start.elapsed().as_secs_f64();
    if replies.len() < n {
        return Err(format!("pending: only {} of {n} requests parked", replies.len()).into());
    }
    let rss_parked = settle_rss(&gateway).await?;
    eprintln!(
        "  {n} parked in {park_secs:.1} s; RSS {:.1} MiB; answering",
        rss_parked as f64 / 1048576.0
    );
    // Answer them all, 64 at a time on pooled connections, and time the drain.
    let drain_start = Instant::now();
    let replies = Arc::new(std::sync::Mutex::new(replies));
    let mut answerers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let replies = replies.clone();
        let sessions = sessions.clone();
        let addr = gateway.addr;
        answerers.spawn(async move {
            let mut c = Conn::open(addr).await?;
            let mut refused = 0usize;
            loop {
                let next = replies.lock().map_err(|_| "poisoned")?.pop();
                let Some((i, reply)) = next else {
                    return Ok::<_, BoxError>(refused);
                };
                let h = legacy_headers(&sessions[i % sessions.len()]);
                let r = c.post(&h, reply).await?;
                let st = r.status();
                r.into_body().collect().await?;
                if st != StatusCode::ACCEPTED {
                    refused += 1;
                }
            }
        });
    }
    let mut refused = 0;
    while let Some(r) = answerers.join_next().await {
        refused += r??;
    }
    let answered_secs = drain_start.elapsed().as_secs_f64();
    let mut completed = 0usize;
    let mut errors = Vec::new();
    let drain_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match tokio::time::timeout_at(drain_deadline.into(), streams.join_next()).await {
            Ok(Some(Ok(Ok(_)))) => completed += 1,
            Ok(Some(Ok(Err(e)))) => errors.push(e.to_string()),
            Ok(Some(Err(e))) => errors.push(e.to_string()),
            Ok(None) => break,
            Err(_) => {
                errors.push("timed out waiting for the streams to finish".into());
                streams.abort_all();
                break;
            }
        }
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let after = store.count(&ws).map_err(|e| e.to_string())?;
    let rss_after = settle_rss(&gateway).await?;
    eprintln!(
        "  drained in {drain_secs:.2} s: {completed}/{n} completed, {} errors, store {before} → {after}",
        errors.len()
    );
    let ok = completed == n && errors.is_empty() && refused == 0 && after == before;
    report.pending_ok = Some(ok);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 4. Pending rounds: {n} legacy requests parked on an unanswered elicitation ({} sessions × {})\n",
        sessions.len(),
        n.div_ceil(sessions.len())
    );
    let _ = writeln!(md, "| measure | value |");
    let _ = writeln!(md, "|---|---:|");
    let rows: Vec<(&str, String)> = vec![
        (
            "gateway RSS before sessions",
            format!("{:.1} MiB", rss0 as f64 / 1048576.0),
        ),
        (
            "gateway RSS with sessions, nothing pending",
            format!("{:.1} MiB", rss_sessions as f64 / 1048576.0),
        ),
        (
            "gateway RSS with all rounds pending",
            format!("{:.1} MiB", rss_parked as f64 / 1048576.0),
        ),
        (
            "bytes per pending round (vs sessions only)",
            format!(
                "{:.0}",
                (rss_parked as f64 - rss_sessions as f64) / n as f64
            ),
        ),
        ("time to park all", format!("{park_secs:.2} s")),
        ("time to post all answers", format!("{answered_secs:.2} s")),
        (
            "time to drain (first answer posted → last response)",
            format!("{drain_secs:.2} s"),
        ),
        (
            "completed / errors / refused replies",
            format!("{completed} / {} / {refused}", errors.len()),
        ),
        (
            "notes left of those parked (store check)",
            format!("{}", after.saturating_sub(before)),
        ),
        (
            "gateway RSS after drain",
            format!("{:.1} MiB", rss_after as f64 / 1048576.0),
        ),
    ];
    for (k, v) in &rows {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    if let Some(e) = errors.first() {
        let _ = writeln!(md, "\nfirst error: `{e}`");
    }
    report.add(
        "pending",
        md,
        json!({"requests": n, "sessions": sessions.len(), "rss_before_sessions": rss0,
               "rss_sessions": rss_sessions, "rss_parked": rss_parked, "rss_after": rss_after,
               "park_seconds": park_secs, "answer_seconds": answered_secs, "drain_seconds": drain_secs,
               "completed": completed, "errors": errors.len(), "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
               "refused_replies": refused, "store_before": before, "store_after": after, "ok": ok}),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Report.
// ---------------------------------------------------------------------------------

/// One pass-through cell's ratios (medians of per-round values).
struct PassthroughRatio {
    conc: usize,
    kind: String,
    gateway_over_direct: f64,
    gateway_over_bare: f64,
    added: f64,
    bare_over_direct: f64,
    bare_added: f64,
}

#[derive(Default)]
struct Report {
    sections: Vec<(String, String, Value)>,
    passthrough_ratios: Vec<PassthroughRatio>,
    /// Per (concurrency, kind): gateway+cache over direct req/s, over bare proxy, p50
    /// gateway+cache minus direct (µs).
    cache_ratios: Vec<(usize, String, f64, f64, f64)>,
    /// Legacy flow over modern direct, and the modern flow through the bare proxy
    /// over modern direct (what one proxy hop per request costs this flow).
    mrtr_ratio: Option<(f64, f64)>,
    /// Two replicas on Redis over one in memory (flows/s) with one host and with
    /// several at once (how many), and Redis bytes per idle session at that many
    /// sessions.
    replicas: Option<(f64, f64, usize, usize, f64)>,
    bytes_per_session: Option<(usize, f64)>,
    /// Gateway CPU per plain legacy call over per pass-through request, by concurrency.
    legacy_call: Vec<(usize, f64)>,
    /// Legacy flow over the modern flow through the bare proxy, and the gateway's CPU
    /// per legacy flow (µs).
    mrtr_one_hop: Option<(f64, f64)>,
    pending_ok: Option<bool>,
}

impl Report {
    fn add(&mut self, name: &str, md: String, json: Value) {
        self.sections.push((name.to_owned(), md, json));
    }

    fn targets(&self) -> (String, Value) {
        let mut md = String::from(
            "### Targets\n\nThe last column is the bare proxy measured in the same rounds against the same target: what any proxy in the path costs on this machine.\n\n| target | measured | met | bare proxy, same run |\n|---|---:|:---:|---:|\n",
        );
        let mut js = Vec::new();
        let mut row = |name: &str, measured: String, met: Option<bool>, bare: Option<String>| {
            let m = match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            };
            let b = bare.clone().unwrap_or_else(|| "–".into());
            let _ = writeln!(md, "| {name} | {measured} | {m} | {b} |");
            js.push(json!({"target": name, "measured": measured, "met": met, "bare_proxy": bare}));
        };
        let at = |c: usize| {
            self.passthrough_ratios
                .iter()
                .filter(|r| r.conc == c)
                .collect::<Vec<_>>()
        };
        for r in at(64) {
            row(
                &format!("pass-through ≥ 0.95× direct at c=64 ({})", r.kind),
                fmt_f(r.gateway_over_direct, 3),
                Some(r.gateway_over_direct >= 0.95),
                Some(fmt_f(r.bare_over_direct, 3)),
            );
        }
        for r in at(1) {
            row(
                &format!("p50 added ≤ 50 µs at c=1 ({})", r.kind),
                format!("{} µs", fmt_f(r.added, 1)),
                Some(r.added <= 50.0),
                Some(format!("{} µs", fmt_f(r.bare_added, 1))),
            );
        }
        for r in &self.passthrough_ratios {
            row(
                &format!("gateway/bare proxy ≥ 0.95 (c={}, {})", r.conc, r.kind),
                fmt_f(r.gateway_over_bare, 3),
                Some(r.gateway_over_bare >= 0.95),
                None,
            );
        }
        if !self.passthrough_ratios.is_empty() {
            // One cell swings by ±0.07 between runs on a shared 2-core machine; all
            // cells together say whether the gateway costs more than the bare proxy.
            let logs: Vec<f64> = self
                .passthrough_ratios
                .iter()
                .map(|r| r.gateway_over_bare.ln())
                .collect();
            let geo = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
            row(
                "gateway/bare proxy ≥ 0.95 (geometric mean of the cells above)",
                fmt_f(geo, 3),
                Some(geo >= 0.95),
                None,
            );
        }
        if let Some((ratio, load_ratio, hosts, n, per)) = self.replicas {
            row(
                "legacy MRTR flow on 2 replicas + Redis ≥ 0.6× 1 replica in memory (one host, flows in sequence)",
                fmt_f(ratio, 3),
                Some(ratio >= 0.6),
                None,
            );
            row(
                &format!("legacy MRTR flow on 2 replicas + Redis ≥ 0.6× 1 replica in memory ({hosts} hosts at once)"),
                fmt_f(load_ratio, 3),
                Some(load_ratio >= 0.6),
                None,
            );
            row(
                &format!("≤ 4 KiB of Redis memory per idle session (at {n})"),
                format!("{} B", fmt_f(per, 0)),
                Some(per <= 4096.0),
                None,
            );
        }
        for (conc, kind, gd, _, added) in &self.cache_ratios {
            match (conc, kind.as_str()) {
                (1, k) if k != "mixed" => row(
                    &format!("gateway+cache p50 below direct at c=1 ({kind})"),
                    format!("{} µs", fmt_f(*added, 1)),
                    Some(*added < 0.0),
                    None,
                ),
                (16 | 64, k) if k != "mixed" => row(
                    &format!("gateway+cache ≥ 2× direct at c={conc} ({kind})"),
                    fmt_f(*gd, 3),
                    Some(*gd >= 2.0),
                    None,
                ),
                (_, "mixed") => row(
                    &format!("gateway+cache ≥ 1.0× direct, mixed 90/10 (c={conc})"),
                    fmt_f(*gd, 3),
                    Some(*gd >= 1.0),
                    None,
                ),
                _ => {}
            }
        }
        if let Some((r, bare)) = self.mrtr_ratio {
            row(
                "legacy MRTR flow ≥ 0.8× modern direct",
                fmt_f(r, 3),
                Some(r >= 0.8),
                Some(format!("{} (modern flow proxied)", fmt_f(bare, 3))),
            );
        }
        if let Some((legacy_over_bare, cpu)) = self.mrtr_one_hop {
            row(
                "legacy MRTR flow ≥ 1.0× the modern flow through the bare proxy",
                fmt_f(legacy_over_bare, 3),
                Some(legacy_over_bare >= 1.0),
                None,
            );
            row(
                "gateway CPU per legacy MRTR flow ≤ 500 µs",
                format!("{} µs", fmt_f(cpu, 0)),
                Some(cpu <= 500.0),
                None,
            );
        }
        for (conc, ratio) in &self.legacy_call {
            row(
                &format!(
                    "gateway CPU per plain legacy call ≤ 1.2× per pass-through request (c={conc})"
                ),
                fmt_f(*ratio, 3),
                Some(*ratio <= 1.2),
                None,
            );
        }
        if let Some((n, b)) = self.bytes_per_session {
            row(
                &format!("≤ 4 KiB per idle legacy session (at {n})"),
                format!("{} B", fmt_f(b, 0)),
                Some(b <= 4096.0),
                None,
            );
        }
        if let Some(ok) = self.pending_ok {
            row(
                "pending rounds: all complete, no error or timeout",
                if ok { "all completed" } else { "failures" }.into(),
                Some(ok),
                None,
            );
        }
        (md, Value::Array(js))
    }
}

fn git(args: &[&str]) -> String {
    Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// Main.
// ---------------------------------------------------------------------------------

fn build(release: bool) -> Res<()> {
    let Ok(cargo) = std::env::var("CARGO") else {
        return Ok(());
    };
    let mut c = Command::new(cargo);
    c.args(["build", "--bin", "dualera", "--example", "bare_proxy"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        c.arg("--release");
    }
    if !c.status()?.success() {
        return Err("building dualera and bare_proxy failed".into());
    }
    Ok(())
}

fn setup(opts: &Opts) -> Res<Env> {
    let exe = std::env::current_exe()?;
    let examples = exe.parent().ok_or("no exe dir")?;
    let profile_dir = examples.parent().ok_or("no target dir")?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    if !release {
        eprintln!("bench: WARNING: not a --release build; figures are not measurements");
    }
    if !opts.no_build {
        build(release)?;
    }
    let bin = opts
        .dualera
        .clone()
        .unwrap_or_else(|| profile_dir.join("dualera"));
    let bare = examples.join("bare_proxy");
    for p in [&bin, &bare] {
        if !p.exists() {
            return Err(format!(
                "{} is missing: cargo build --release --bin dualera --example bare_proxy",
                p.display()
            )
            .into());
        }
    }
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
    std::fs::create_dir_all(results.join("logs"))?;
    let dir = std::env::temp_dir().join(format!("dualera-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = dualera::demo::ensure(&dir)?;
    let scratch = dir.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let scratch_uri =
        dualera::server::scope::Scope::from_fs_path(&std::fs::canonicalize(&scratch)?)
            .map_err(|e| e.to_string())?
            .to_uri();
    let db = dir.join("dualera.db");
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| e.to_string())?;
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let server_config = dir.join("bench-server.toml");
    std::fs::write(
        &server_config,
        format!(
            "[store]\npath = {db:?}\n\n[state]\nttl_ms = 3600000\n\n[[state.keys]]\nid = \"bench\"\nsecret = {secret:?}\n\n\
             [[grants]]\nprincipal = \"local\"\nworkspaces = [{:?}, {:?}]\nrepositories = [{:?}]\n",
            layout.notes_uri,
            scratch_uri,
            layout.repo_dir.to_string_lossy(),
            db = db.to_string_lossy(),
        ),
    )?;
    let gateway_config = dir.join("bench-gateway.toml");
    let max_sessions = opts
        .session_levels
        .iter()
        .copied()
        .chain([opts.pending_sessions, opts.replica_sessions])
        .max()
        .unwrap_or(0)
        + 1_000;
    std::fs::write(
        &gateway_config,
        format!(
            "[gateway]\nmax_sessions = {max_sessions}\nmax_sessions_per_caller = {max_sessions}\n\
             session_idle_ttl_secs = 7200\nlive_request_timeout_secs = 3600\nmax_in_flight = 64\n"
        ),
    )?;
    let gateway_section = std::fs::read_to_string(&gateway_config)?;
    let nocache_config = dir.join("bench-gateway-nocache.toml");
    std::fs::write(
        &nocache_config,
        format!("{gateway_section}\n[cache]\nenabled = false\n"),
    )?;
    let gateway_h1_config = dir.join("bench-gateway-h1.toml");
    std::fs::write(
        &gateway_h1_config,
        format!("{gateway_section}upstream_http2 = \"never\"\n\n[cache]\nenabled = false\n"),
    )?;
    let tls = if opts.tls {
        Some(BenchTls::new(&dir)?)
    } else {
        None
    };
    Ok(Env {
        bin,
        bare,
        dir,
        results,
        stamp,
        server_config,
        gateway_config,
        nocache_config,
        db,
        notes_uri: layout.notes_uri,
        scratch_uri,
        profile: opts.profile,
        tls,
        gateway_h1_config,
    })
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("relay") {
        return relay_main(&args[1..]);
    }
    let opts = parse_opts();
    let mut env = setup(&opts)?;
    if opts.profile == Some(Profile::Perf)
        && !Command::new("perf")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("bench: --profile perf: `perf` is not available; running without profiling");
        env.profile = None;
    }
    if matches!(opts.profile, Some(Profile::Callgrind | Profile::Massif))
        && !Command::new("valgrind")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!(
            "bench: --profile callgrind: `valgrind` is not available; running without profiling"
        );
        env.profile = None;
    }
    if matches!(env.profile, Some(Profile::Callgrind | Profile::Massif)) {
        eprintln!("bench: the gateway runs under valgrind: timings and RSS are not measurements");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let load_start = load_avg();
    let started = Instant::now();
    let mut report = Report::default();
    let result = runtime.block_on(async {
        let mut server = env.server()?;
        // With a round trip to add, every client of the server reaches it through the
        // delaying relay; its CPU is the network's, not counted as the server's.
        let _relay = match opts.upstream_rtt_ms {
            Some(ms) => {
                let mut c = Command::new(std::env::current_exe()?);
                c.arg("relay")
                    .arg(((ms * 500.0).round() as u64).to_string())
                    .arg(server.addr.to_string());
                let relay = Proc::spawn(
                    "relay",
                    c,
                    &env.results.join("logs/relay.log"),
                    Duration::from_secs(10),
                )?;
                env.trust_server_at(relay.addr);
                eprintln!(
                    "bench: the modern server is {ms} ms round trip away, behind a relay at {}",
                    relay.addr
                );
                server.addr = relay.addr;
                Some(relay)
            }
            None => None,
        };
        for s in &opts.scenarios {
            match s.as_str() {
                "passthrough" => passthrough(&env, &opts, &server, &mut report).await?,
                "legacy-call" => legacy_call(&env, &opts, &server, &mut report).await?,
                "cache" => cache(&env, &opts, &server, &mut report).await?,
                "mrtr" => mrtr(&env, &opts, &server, &mut report).await?,
                "memory" => memory(&env, &opts, &server, &mut report).await?,
                "pending" => pending(&env, &opts, &server, &mut report).await?,
                "h2" if env.tls.is_some() => h2_vs_h1(&env, &opts, &server, &mut report).await?,
                "h2" => eprintln!(
                    "bench: the h2 scenario needs --tls (h2 is negotiated by ALPN); skipped"
                ),
                "store" => store(&env, &opts, &server, &mut report).await?,
                "instances" => instances(&env, &opts, &mut report).await?,
                "replicas" => replicas(&env, &opts, &server, &mut report).await?,
                _ => {}
            }
        }
        Ok::<_, BoxError>(())
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    let _ = std::fs::remove_dir_all(&env.dir);
    if let Err(e) = &result {
        eprintln!("bench: FAILED: {e}");
    }
    let (targets_md, targets_json) = report.targets();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let rtt = opts
        .upstream_rtt_ms
        .map(|ms| format!(", the modern server {ms} ms round trip away (a delaying relay)"))
        .unwrap_or_default();
    let mut md = format!(
        "## Benchmark results ({}){}{rtt}\n\ncommit {commit}{}, binary {}, {cpus} CPUs, load average {load_start} at start / {} at end, {:.0} s, scenarios: {}{}\n\n",
        env.stamp,
        if env.tls.is_some() { " — upstream over TLS" } else { "" },
        if dirty { " + local changes" } else { "" },
        env.bin.display(),
        load_avg(),
        started.elapsed().as_secs_f64(),
        opts.scenarios.join(", "),
        match env.profile {
            Some(Profile::Perf) => " (under perf)",
            Some(Profile::Callgrind | Profile::Massif) => " (gateway under valgrind: timings and RSS meaningless)",
            None => "",
        }
    );
    md.push_str(&targets_md);
    md.push('\n');
    for (_, s, _) in &report.sections {
        md.push_str(s);
        md.push('\n');
    }
    if let Err(e) = &result {
        let _ = writeln!(md, "**The run failed:** {e}");
    }
    let js = json!({
        "stamp": env.stamp, "tls": env.tls.is_some(), "upstream_rtt_ms": opts.upstream_rtt_ms, "commit": commit, "dirty": dirty, "binary": env.bin.display().to_string(), "cpus": cpus,
        "load_start": load_start, "load_end": load_avg(),
        "options": {"rounds": opts.rounds, "secs": opts.secs, "concurrency": opts.concurrency,
                    "sessions": opts.session_levels, "pending": opts.pending, "pending_sessions": opts.pending_sessions},
        "targets": targets_json,
        "scenarios": report.sections.iter().map(|(n, _, j)| (n.clone(), j.clone())).collect::<serde_json::Map<_, _>>(),
        "error": result.as_ref().err().map(ToString::to_string),
    });
    let md_path = env.results.join(format!("{}.md", env.stamp));
    let json_path = env.results.join(format!("{}.json", env.stamp));
    std::fs::write(&md_path, &md)?;
    std::fs::write(&json_path, serde_json::to_vec_pretty(&js)?)?;
    std::fs::write(env.results.join("latest.md"), &md)?;
    std::fs::write(
        env.results.join("latest.json"),
        serde_json::to_vec_pretty(&js)?,
    )?;
    println!("{md}");
    eprintln!(
        "bench: wrote {} and {}",
        md_path.display(),
        json_path.display()
    );
    result
}
