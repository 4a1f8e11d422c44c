//! A throw-away PostgreSQL cluster, for the store tests and the benchmark
//! (`examples/bench/main.rs` includes this file too).
//!
//! [`PgCluster::start`] installs Debian's `postgresql` when it is missing (through
//! `tests/services/debian.sh postgresql`), runs `initdb` in a fresh temporary directory
//! as the `postgres` user (PostgreSQL refuses to run as root; a non-root caller runs it
//! as itself), starts it on a free loopback port with its socket in that directory and
//! password (SCRAM) authentication, and on drop stops it and removes the directory.
//! Nothing here is async, so it may be called from tests and from an async `main`
//! alike (it only runs commands).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// How the cluster trades durability for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// `fsync=off`: for tests (the cluster is thrown away anyway).
    Scratch,
    /// PostgreSQL's defaults (fsync on, synchronous commit): for the benchmark, to
    /// compare with SQLite's synchronous WAL commits.
    Durable,
}

/// A running cluster; stopped and removed on drop.
#[derive(Debug)]
pub(crate) struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    password: String,
    as_postgres: bool,
    tls: bool,
    /// The server options of the running cluster (to start it again as it was).
    opts: String,
}

impl PgCluster {
    /// A scratch cluster (see [`Durability::Scratch`]).
    pub(crate) fn start() -> Result<Self, String> {
        Self::start_with(Durability::Scratch)
    }

    /// Installs (when missing), initializes and starts a cluster.
    pub(crate) fn start_with(durability: Durability) -> Result<Self, String> {
        Self::start_full(durability, false)
    }

    /// A scratch cluster that also accepts TLS, with a server certificate for
    /// `IP:127.0.0.1` issued by a fresh CA (see [`PgCluster::ca_file`]); made with the
    /// `openssl` command, which Debian's `postgresql` depends on.
    pub(crate) fn start_tls() -> Result<Self, String> {
        Self::start_full(Durability::Scratch, true)
    }

    fn start_full(durability: Durability, tls: bool) -> Result<Self, String> {
        install()?;
        let bin = bin_dir()?;
        let as_postgres = is_root()?;
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("dualera-pg-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut password = [0u8; 18];
        getrandom::fill(&mut password).map_err(|e| e.to_string())?;
        let password: String = password.iter().map(|b| format!("{b:02x}")).collect();
        let cluster = Self {
            dir,
            bin,
            port: 0,
            password,
            as_postgres,
            tls,
            opts: String::new(),
        };
        cluster.prepare()?;
        cluster.boot(durability)
    }

    fn prepare(&self) -> Result<(), String> {
        let pwfile = self.dir.join("pwfile");
        std::fs::write(&pwfile, &self.password).map_err(|e| e.to_string())?;
        if self.tls {
            self.write_server_certificate()?;
        }
        if self.as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&self.dir))?;
        }
        if self.tls {
            // PostgreSQL refuses a key file others can read.
            run(Command::new("chmod")
                .arg("600")
                .arg(self.dir.join("server.key")))?;
        }
        let mut initdb = self.command("initdb");
        initdb
            .arg("-D")
            .arg(self.data())
            .args([
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()));
        run(&mut initdb)?;
        Ok(())
    }

    fn boot(mut self, durability: Durability) -> Result<Self, String> {
        let mut last = String::new();
        // A free port is picked by binding and releasing it; another process may take
        // it in between, so a failed start is retried on a new port.
        for _ in 0..5 {
            self.port = free_port()?;
            let mut opts = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=200",
                self.port,
                self.dir.display()
            );
            if self.tls {
                opts.push_str(&format!(
                    " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                    self.dir.join("server.pem").display(),
                    self.dir.join("server.key").display()
                ));
            }
            if durability == Durability::Scratch {
                opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
            }
            self.opts = opts;
            match self.pg_ctl_start() {
                Ok(()) => return Ok(self),
                Err(e) => last = e,
            }
        }
        Err(format!("PostgreSQL did not start: {last}"))
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let mut start = self.command("pg_ctl");
        start
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "120", "-o", &self.opts, "start"]);
        run(&mut start).map(|_| ()).map_err(|e| {
            format!(
                "{e}\n{}",
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            )
        })
    }

    /// Stops the server (fast shutdown: clients are disconnected), keeping its data.
    pub(crate) fn stop(&self) -> Result<(), String> {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        run(&mut stop).map(|_| ())
    }

    /// Starts a stopped server again, on the same port with the same options.
    pub(crate) fn start_again(&self) -> Result<(), String> {
        self.pg_ctl_start()
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A command of the cluster's binaries, run as `postgres` when we are root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// A CA (`ca.pem`) and the server certificate it issues for `IP:127.0.0.1`.
    fn write_server_certificate(&self) -> Result<(), String> {
        let ca = self.write_ca("ca", "dualera-test-ca")?;
        let dir = &self.dir;
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(|e| e.to_string())?;
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-subj", "/CN=127.0.0.1", "-keyout"])
            .arg(dir.join("server.key"))
            .arg("-out")
            .arg(dir.join("server.csr")))?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(dir.join("server.csr"))
            .arg("-CA")
            .arg(&ca)
            .arg("-CAkey")
            .arg(dir.join("ca.key"))
            .arg("-CAcreateserial")
            .arg("-extfile")
            .arg(dir.join("server.ext"))
            .arg("-out")
            .arg(dir.join("server.pem")))?;
        Ok(())
    }

    /// Writes a self-signed CA certificate `<name>.pem` (key `<name>.key`) into the
    /// cluster's directory and returns the certificate's path.
    pub(crate) fn write_ca(&self, name: &str, common_name: &str) -> Result<PathBuf, String> {
        let pem = self.dir.join(format!("{name}.pem"));
        run(Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args([
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={common_name}"),
            ])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args([
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
            ])
            .arg(self.dir.join(format!("{name}.key")))
            .arg("-out")
            .arg(&pem))?;
        Ok(pem)
    }

    /// The CA that issued the server certificate of a [`PgCluster::start_tls`] cluster.
    pub(crate) fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.join("ca.pem"))
    }

    /// The loopback port the cluster listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's password (random per cluster).
    pub(crate) fn password(&self) -> &str {
        &self.password
    }

    /// Creates a database and returns its `postgres://` URL.
    pub(crate) fn create_database(&self, name: &str) -> Result<String, String> {
        assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "database names here are plain identifiers"
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(self.url(name))
    }

    /// The URL of database `name`.
    pub(crate) fn url(&self, name: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{name}",
            self.password, self.port
        )
    }

    /// Runs SQL in database `name` through `psql` (for tests that reach past the store).
    pub(crate) fn psql(&self, name: &str, sql: &str) -> Result<String, String> {
        let mut psql = Command::new(self.bin.join("psql"));
        psql.env("PGPASSWORD", &self.password)
            .env("PGSSLMODE", "disable")
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
            ])
            .args(["-p", &self.port.to_string(), "-d", name, "-c", sql]);
        let out = run(&mut psql)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.port != 0 {
            let mut stop = self.command("pg_ctl");
            stop.arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "-t", "60", "stop"]);
            let _ = stop.output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `bash tests/services/debian.sh postgresql` (installs nothing when present).
fn install() -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/services/debian.sh");
    run(Command::new("bash").arg(script).arg("postgresql")).map(|_| ())
}

/// The newest installed `/usr/lib/postgresql/<major>/bin`.
fn bin_dir() -> Result<PathBuf, String> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, b)| b)
        .ok_or_else(|| "no PostgreSQL server binaries under /usr/lib/postgresql".to_owned())
}

fn is_root() -> Result<bool, String> {
    let out = run(Command::new("id").arg("-u"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{:?} failed ({}): {}{}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
