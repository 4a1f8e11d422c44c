//! The benchmark suite: pass-through overhead, MRTR translation cost, session memory and
//! pending rounds, each against a baseline measured in the same run. A program, not a
//! test; loopback only, bounded in count and time, stops by itself.
//!
//! ```sh
//! cargo run --release --example bench                       # the whole suite
//! cargo run --release --example bench -- --scenarios passthrough --rounds 3
//! cargo run --profile profiling --example bench -- --scenarios passthrough --profile perf
//! ```
//!
//! Under `--profile perf`/`callgrind`/`massif`, build with Cargo's `profiling` profile
//! (release with debug info, `target/profiling/`) so reports name functions and lines.
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
//! - `reverse`: the reverse bridge. A modern host's plain `tools/call` through the
//!   gateway (`--upstream-era legacy`) to a legacy server vs a legacy host (one
//!   initialized session per connection) directly to it, at concurrency 1 and 16,
//!   interleaved: throughput ratio and gateway CPU per call; then the elicitation flow
//!   the same way (modern: call → `input_required` → retry with `inputResponses` →
//!   complete; legacy direct: the call, the elicitation answered on the session, the
//!   result), flows alternating one by one. The legacy server is the bench's own
//!   (`bench legacy-server`, a few µs per call) so that the ratios are the path's.
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
//!   per idle session at `--replica-sessions` (10k) sessions, and the floors under
//!   both CPU targets: a timed flow's round trips (its session already open) priced
//!   on Redis's side and on the gateways' (`bench redis-client-floor`: the store's own
//!   Redis client in a process of its own, pinned as the gateways are). With several
//!   hosts at once it also prints every process's CPU per flow, the machine's busy
//!   share, and what the ≥ 0.7× capacity target leaves the replicas against their
//!   floor with as many callers at once. `--replica-affinity` keeps each session of
//!   the timed rounds and the capacity runs on one replica instead, as a balancer that
//!   hashes `Mcp-Session-Id` would.
//!
//! `--pin NAME=CPUS` (repeatable) confines a kind of process to some CPUs with
//! `taskset`: `bench` (this process, and so every process it starts that is not named),
//! `gateway` (every gateway, replicas included), `server`, `bare_proxy`, `redis`. On a
//! machine whose few cores every process shares, it measures what a process costs on
//! a core of its own, e.g. `--pin bench=0 --pin redis=1`; the report's header says
//! what was pinned.
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

mod client;
mod legacy_client;
mod legacy_server;
mod opts;
mod procs;
#[cfg(feature = "redis")]
mod redis_client;
mod report;
mod stats;
mod scenarios {
    //! One module per scenario.
    pub(crate) mod cache;
    pub(crate) mod h2;
    pub(crate) mod instances;
    pub(crate) mod legacy_call;
    pub(crate) mod memory;
    pub(crate) mod mrtr;
    pub(crate) mod passthrough;
    pub(crate) mod pending;
    pub(crate) mod replicas;
    pub(crate) mod reverse;
    pub(crate) mod store;
}
use client::*;
use legacy_client::*;
use legacy_server::*;
use opts::*;
use procs::*;
use report::*;
use scenarios::{
    cache::*, h2::*, instances::*, legacy_call::*, memory::*, mrtr::*, passthrough::*, pending::*,
    replicas::*, reverse::*, store::*,
};
use stats::*;

use bytes::Bytes;
use dualera::server::store::{NoteStore, SqliteStore};
use dualera::sse;

#[path = "../../tests/common/pg_cluster.rs"]
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
const ALL_SCENARIOS: [&str; 11] = [
    "passthrough",
    "legacy-call",
    "reverse",
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
const DEFAULT_SCENARIOS: [&str; 10] = [
    "passthrough",
    "legacy-call",
    "reverse",
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
// Main.
// ---------------------------------------------------------------------------------

/// Builds the binary and the bare proxy in the bench's own Cargo profile, with every
/// part (the `store`, `instances` and `replicas` scenarios need PostgreSQL and Redis).
fn build(profile: Option<&str>) -> Res<()> {
    let Ok(cargo) = std::env::var("CARGO") else {
        return Ok(());
    };
    let mut c = Command::new(cargo);
    c.args([
        "build",
        "--features",
        "full",
        "--bin",
        "dualera",
        "--example",
        "bare_proxy",
    ])
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(profile) = profile {
        c.args(["--profile", profile]);
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
    // `release`, or `profiling` (release with debug info, for --profile runs).
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| matches!(*n, "release" | "profiling"));
    if profile.is_none() {
        eprintln!("bench: WARNING: not a --release build; figures are not measurements");
    }
    if !opts.no_build {
        build(profile)?;
    }
    let bin = opts
        .dualera
        .clone()
        .unwrap_or_else(|| profile_dir.join("dualera"));
    let bare = examples.join("bare_proxy");
    for p in [&bin, &bare] {
        if !p.exists() {
            return Err(format!(
                "{} is missing: cargo build --release --features full --bin dualera --example bare_proxy",
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
    let secret = dualera::digest::hex(&secret);
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
    if args.first().map(String::as_str) == Some("legacy-server") {
        return legacy_server_main();
    }
    if args.first().map(String::as_str) == Some("redis-client-floor") {
        #[cfg(feature = "redis")]
        return redis_client::redis_client_floor_main(&args[1..]);
        #[cfg(not(feature = "redis"))]
        return Err("redis-client-floor: this bench was built without the redis feature".into());
    }
    let opts = parse_opts();
    // The machine's CPUs, counted before `--pin bench=…` narrows what this process sees.
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    set_pins(opts.pins.clone());
    // Before the runtime's threads exist, so that they inherit the mask.
    pin("bench", std::process::id())?;
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
                "reverse" => reverse(&env, &opts, &mut report).await?,
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
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let rtt = opts
        .upstream_rtt_ms
        .map(|ms| format!(", the modern server {ms} ms round trip away (a delaying relay)"))
        .unwrap_or_default();
    let pinned = if opts.pins.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = opts
            .pins
            .iter()
            .map(|(n, c)| format!("{n} on CPU {c}"))
            .collect();
        format!(", pinned: {}", list.join(", "))
    };
    let idle = cpu_idle();
    let idle_md = if idle.is_empty() {
        String::new()
    } else {
        format!(", idle CPUs: {idle}")
    };
    let mut md = format!(
        "## Benchmark results ({}){}{rtt}{pinned}\n\ncommit {commit}{}, binary {}, {cpus} CPUs{idle_md}, load average {load_start} at start / {} at end, {:.0} s, scenarios: {}{}\n\n",
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
        "stamp": env.stamp, "tls": env.tls.is_some(), "upstream_rtt_ms": opts.upstream_rtt_ms, "pins": opts.pins.iter().map(|(n, c)| (n.clone(), json!(c))).collect::<serde_json::Map<_, _>>(), "commit": commit, "dirty": dirty, "binary": env.bin.display().to_string(), "cpus": cpus,
        "load_start": load_start, "load_end": load_avg(), "cpu_idle": idle,
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
