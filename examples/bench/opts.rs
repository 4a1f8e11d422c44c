//! Command-line options.

use crate::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Profile {
    Perf,
    Callgrind,
    Massif,
}

#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) scenarios: Vec<String>,
    pub(crate) rounds: usize,
    pub(crate) secs: f64,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) session_levels: Vec<usize>,
    pub(crate) pending: usize,
    pub(crate) pending_sessions: usize,
    /// Idle sessions opened on the replicas for Redis memory (default 10k).
    pub(crate) replica_sessions: usize,
    /// Hosts at once per variant in the replicas scenario's capacity part (default 8).
    pub(crate) replica_hosts: usize,
    pub(crate) profile: Option<Profile>,
    pub(crate) no_build: bool,
    pub(crate) dualera: Option<PathBuf>,
    pub(crate) tls: bool,
    /// The cache scenario's request kinds to run (default all three).
    pub(crate) cache_requests: Option<Vec<String>>,
    /// Round-trip time added to every packet to and from the modern server (netem).
    pub(crate) upstream_rtt_ms: Option<f64>,
    /// `--pin NAME=CPUS`: the CPUs each kind of process may run on (`taskset` lists).
    pub(crate) pins: Vec<(String, String)>,
    /// `--redis-socket`: the replicas scenario's replicas reach Redis over its Unix
    /// socket rather than TCP on loopback.
    pub(crate) redis_socket: bool,
    /// `--replica-affinity`: the replicas scenario's timed rounds and capacity runs keep
    /// each session on one replica, as a balancer that hashes `Mcp-Session-Id` would,
    /// rather than alternating its requests between the two.
    pub(crate) replica_affinity: bool,
}

/// The processes `--pin` can place: the bench itself (and so every process it starts
/// that is not named), and the kinds it starts.
pub(crate) const PINNABLE: &[&str] = &["bench", "gateway", "server", "bare_proxy", "redis"];

pub(crate) fn usage() -> ! {
    eprintln!(
        "usage: bench [--scenarios passthrough,legacy-call,cache,mrtr,memory,pending,store,instances,replicas,h2] [--rounds N] [--secs S]\n\
         \x20            [--concurrency 1,16,64] [--sessions 1000,10000,100000]\n\
         \x20            [--pending N] [--pending-sessions N] [--replica-sessions N] [--replica-hosts N]\n\
         \x20            [--profile perf|callgrind|massif] [--no-build]\n\
         \x20            [--dualera PATH (another build of the binary, e.g. to compare before/after)]\n\
         \x20            [--tls (the modern server on HTTPS; enables the h2 scenario)]\n\
         \x20            [--cache-requests tools/list,server/discover,mixed]\n\
         \x20            [--upstream-rtt-ms MS (the modern server MS round trip away, behind a delaying relay)]\n\
         \x20            [--pin NAME=CPUS (repeatable; NAME: bench, gateway, server, bare_proxy, redis;\n\
         \x20             CPUS: a taskset list such as 1 or 0,2-3; e.g. --pin bench=0 --pin redis=1)]\n\
         \x20            [--redis-socket (the replicas reach Redis over its Unix socket, not TCP)]\n\
         \x20            [--replica-affinity (the replicas' timed flows keep each session on one replica)]"
    );
    std::process::exit(2)
}

pub(crate) fn list<T: std::str::FromStr>(v: &str) -> Vec<T> {
    v.split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| usage()))
        .collect()
}

pub(crate) fn parse_opts() -> Opts {
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
        pins: Vec::new(),
        redis_socket: false,
        replica_affinity: false,
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
            "--redis-socket" => o.redis_socket = true,
            "--replica-affinity" => o.replica_affinity = true,
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
            "--pin" => {
                let v = val();
                let (name, cpus) = v.split_once('=').unwrap_or_else(|| usage());
                let list_ok = !cpus.is_empty()
                    && cpus.len() <= 64
                    && cpus
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b',' || b == b'-');
                if !PINNABLE.contains(&name) || !list_ok {
                    usage()
                }
                o.pins.retain(|(n, _)| n != name);
                o.pins.push((name.to_owned(), cpus.to_owned()));
            }
            _ => usage(),
        }
    }
    o.rounds = o.rounds.clamp(1, 50);
    o.secs = o.secs.clamp(0.1, 30.0);
    o.pending_sessions = o.pending_sessions.clamp(1, o.pending.max(1));
    o
}
