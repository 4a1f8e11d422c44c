//! The processes a run spawns and measures (RSS, CPU, context switches), the run environment, and the profilers around the gateway.

use crate::*;

/// `bench relay ONE_WAY_US UPSTREAM`: a TCP relay in front of the modern server that
/// holds every chunk `ONE_WAY_US` before passing it on, in each direction, so that the
/// server sits a round trip away from all its clients — direct, and the proxies — the
/// way a remote upstream does, while the driver reaches the proxies without delay.
/// (Loopback has no `netem` on every kernel; this needs nothing.) Blocking threads, so
/// that a delay is slept precisely rather than on a millisecond timer wheel; each
/// direction's queue is bounded, a full one stops reading.
pub(crate) fn relay_main(args: &[String]) -> Res<()> {
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

/// `--pin`, set once at start-up: the CPU list of each kind of process named there.
static PINS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

pub(crate) fn set_pins(pins: Vec<(String, String)>) {
    let _ = PINS.set(pins);
}

/// The `--pin` entries, for the report.
pub(crate) fn pins() -> &'static [(String, String)] {
    PINS.get().map_or(&[], Vec::as_slice)
}

/// Whether processes `a` and `b` may run on no CPU in common (their `Cpus_allowed`
/// masks); `None` when either cannot be read.
pub(crate) fn cpus_apart(a: u32, b: u32) -> Option<bool> {
    // The mask in hex, 32-bit groups separated by commas, most significant first.
    let mask = |pid: u32| -> Option<Vec<u32>> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed:"))?
            .trim();
        hex.rsplit(',')
            .map(|g| u32::from_str_radix(g, 16).ok())
            .collect()
    };
    let (a, b) = (mask(a)?, mask(b)?);
    Some(a.iter().zip(&b).all(|(x, y)| x & y == 0))
}

/// Confines every thread of `pid` to the CPUs `--pin` gives processes of kind `name`
/// (`taskset -a -p -c`); nothing when it names none. Threads started later inherit
/// the mask. A process that cannot be pinned fails the run: its figures would not be
/// what the report says they are.
pub(crate) fn pin(name: &str, pid: u32) -> Res<()> {
    let Some((_, cpus)) = pins().iter().find(|(n, _)| n == name) else {
        return Ok(());
    };
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus.as_str(), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(format!("--pin {name}={cpus}: `taskset` could not pin process {pid}").into())
    }
}

/// A child process this benchmark started; terminated (SIGTERM, then SIGKILL) on drop.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) scheme: String,
}

impl Proc {
    pub(crate) fn spawn(name: &str, mut cmd: Command, log: &Path, wait: Duration) -> Res<Self> {
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
                pin(name, p.child.id())?;
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

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn url(&self) -> String {
        format!("{}://{}/mcp", self.scheme, self.addr)
    }

    /// Resident set size, bytes (VmRSS).
    pub(crate) fn rss(&self) -> Res<u64> {
        rss_of(self.pid())
    }
}

pub(crate) fn rss_of(pid: u32) -> Res<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kb * 1024)
}

/// Clock ticks per second, the unit of `/proc`'s CPU times.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The whole machine's CPU time so far, in seconds summed over its CPUs: how much of it
/// was busy (neither idle nor waiting for I/O), and all of it.
pub(crate) fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    // user nice system idle iowait irq softirq steal (guest time is inside user's).
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let all: f64 = f.iter().sum();
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    ((all - idle) / clock_ticks(), all / clock_ticks())
}

/// CPU time (user + system) a process used so far, in seconds.
pub(crate) fn cpu_of(pid: u32) -> f64 {
    let ticks = clock_ticks();
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
pub(crate) fn switches_of(pid: u32) -> u64 {
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

pub(crate) fn signal(pid: u32, sig: &str) {
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
pub(crate) struct Env {
    pub(crate) bin: PathBuf,
    pub(crate) bare: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) results: PathBuf,
    pub(crate) stamp: u64,
    pub(crate) server_config: PathBuf,
    pub(crate) gateway_config: PathBuf,
    /// The same `[gateway]` section with `[cache] enabled = false`.
    pub(crate) nocache_config: PathBuf,
    pub(crate) db: PathBuf,
    pub(crate) notes_uri: String,
    pub(crate) scratch_uri: String,
    pub(crate) profile: Option<Profile>,
    /// `--tls`: the server's certificate files and the CA that signed them.
    pub(crate) tls: Option<BenchTls>,
    /// The pass-through gateway config with `upstream_http2 = "never"` (the h2
    /// scenario's baseline).
    pub(crate) gateway_h1_config: PathBuf,
}

pub(crate) struct BenchTls {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) client: Arc<rustls::ClientConfig>,
}

impl BenchTls {
    pub(crate) fn new(dir: &Path) -> Res<Self> {
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
    pub(crate) fn trust_server_at(&self, addr: SocketAddr) {
        if let Some(t) = &self.tls {
            if let Ok(mut targets) = TLS_TARGETS.lock() {
                targets.push((addr, t.client.clone()));
            }
        }
    }

    pub(crate) fn server(&self) -> Res<Proc> {
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
    pub(crate) fn server_on(&self, url: &str, tag: &str) -> Res<Proc> {
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

    pub(crate) fn gateway(&self, upstream: &Proc, tag: &str) -> Res<Proc> {
        self.gateway_with(upstream, tag, &self.gateway_config, "warn")
    }

    pub(crate) fn gateway_with(
        &self,
        upstream: &Proc,
        tag: &str,
        config: &Path,
        log: &str,
    ) -> Res<Proc> {
        self.gateway_over(&[upstream], tag, config, log)
    }

    /// A gateway whose `/mcp` route has these instances (`--upstream` once each).
    pub(crate) fn gateway_over(
        &self,
        upstreams: &[&Proc],
        tag: &str,
        config: &Path,
        log: &str,
    ) -> Res<Proc> {
        self.gateway_args(upstreams, tag, config, log, &[])
    }

    /// [`Env::gateway_over`] with `extra` arguments (e.g. `--upstream-era legacy`).
    pub(crate) fn gateway_args(
        &self,
        upstreams: &[&Proc],
        tag: &str,
        config: &Path,
        log: &str,
        extra: &[&str],
    ) -> Res<Proc> {
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
        c.args(extra);
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

    pub(crate) fn bare_proxy(&self, upstream: &Proc) -> Res<Proc> {
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
pub(crate) struct PerfGuard {
    pub(crate) child: Option<Child>,
    pub(crate) data: PathBuf,
    pub(crate) results: PathBuf,
    pub(crate) tag: String,
}

impl PerfGuard {
    pub(crate) fn start(env: &Env, pid: u32, tag: &str) -> Option<Self> {
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
