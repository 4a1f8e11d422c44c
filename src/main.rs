//! The `dualera` command line.

use clap::{Parser, Subcommand};
use dualera::config::{Config, TlsSection};
use dualera::gateway::admin::{self, AdminSettings};
use dualera::gateway::report::{self, Report, ReportConfig};
use dualera::gateway::routes::{self, UpstreamFlags};
use dualera::gateway::{Gateway, GatewayConfig, HttpUpstream, Upstream};
use dualera::listener::{warn_if_clear_text, ListenerConfig};
use dualera::parts::NotBuilt;
use dualera::server::{self, KeySource, Server};
use dualera::tls::ServerTls;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

// The kit's subcommand is the `kit` feature; without it, `no_kit` refuses it.
#[cfg(feature = "kit")]
mod vectors_cmd;
#[cfg(not(feature = "kit"))]
#[path = "no_kit.rs"]
mod vectors_cmd;

/// jemalloc, not the system allocator: after a burst of large requests (hosts sending
/// megabyte bodies or ids, then leaving) glibc keeps the freed pages — its mmap
/// threshold rises to the largest block freed, so later large blocks come from arenas
/// it does not trim — and RSS stays far above the baseline; jemalloc's background
/// thread (enabled in `main`) gives freed pages back within its 10 s decay, busy or
/// idle. Measured in README ("Memory after large requests").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type BoxError = Box<dyn std::error::Error>;

/// `eprintln!` in one write: stderr is unbuffered, so `eprintln!` writes each piece of
/// the line separately, and a stdio upstream child sharing our stderr could land in the
/// middle of a line someone parses ("gateway listening on …").
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

#[derive(Parser)]
#[command(
    name = "dualera",
    version,
    about = "Dual-era MCP gateway and modern notes server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the modern (2026-07-28) notes + repository-summary server.
    Serve {
        /// Address to listen on (HTTP). Overrides the config file.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Configuration file (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve newline-delimited JSON-RPC on stdin/stdout instead of HTTP.
        #[arg(long)]
        stdio: bool,
        /// Principal for stdio requests (stdio has no bearer tokens).
        #[arg(long, default_value = "local")]
        principal: String,
        /// Create (if missing) and serve the sample workspace in this folder.
        #[arg(long, num_args = 0..=1, default_missing_value = "dualera-demo")]
        demo: Option<PathBuf>,
        /// Serve TLS with this certificate chain (PEM, leaf first); needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    },
    /// Run the gateway in front of a modern server.
    Gateway {
        /// The modern server's MCP endpoint, e.g. http://127.0.0.1:8787/mcp: the route
        /// /mcp. Give it once per instance of the server (requests go round-robin to the
        /// instances that are up). More routes: [[gateway.routes]] in --config.
        #[arg(long, conflicts_with = "upstream_cmd")]
        upstream: Vec<String>,
        /// Spawn the modern server and speak to it over stdio instead, e.g.
        /// "dualera serve --stdio --demo" (split on whitespace).
        #[arg(long)]
        upstream_cmd: Option<String>,
        /// Serve one legacy session on stdin/stdout (for hosts that spawn their servers)
        /// instead of listening on HTTP.
        #[arg(long)]
        stdio: bool,
        /// Address to listen on. Overrides the config file.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Serve /healthz, /readyz, /metrics and the migration report on this address
        /// (e.g. 127.0.0.1:8789). Overrides [admin] listen; off unless one is set.
        #[arg(long)]
        admin: Option<SocketAddr>,
        /// Configuration file (TOML; its [gateway] section is used).
        #[arg(long)]
        config: Option<PathBuf>,
        /// An extra CA bundle (PEM) to trust for an https:// upstream, besides the
        /// system and webpki roots. Certificates are always verified.
        #[arg(long)]
        upstream_ca: Option<PathBuf>,
        /// The upstream's era: auto (default: probed, as basic/versioning.mdx says, and
        /// remembered), modern (2026-07-28) or legacy (2025-11-25 and earlier).
        /// Overrides [gateway] era; a [[gateway.routes]] entry's own era wins for it.
        #[arg(long, value_name = "auto|modern|legacy")]
        upstream_era: Option<dualera::config::UpstreamEra>,
        /// Serve TLS with this certificate chain (PEM, leaf first); needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Where legacy Streamable HTTP sessions live: "memory" (default) or
        /// redis://HOST:PORT/DB, shared by every replica behind a load balancer
        /// (redis+unix:///PATH?db=DB: a Redis on this machine, over its Unix socket).
        /// Overrides [gateway] session_store.
        #[arg(long)]
        session_store: Option<String>,
        /// Where other replicas reach this one (http://HOST:PORT), registered in the
        /// Redis session store: a reverse-bridge retry landing on another replica
        /// is forwarded here. Overrides [gateway] advertise_url.
        #[arg(long, value_name = "URL")]
        advertise_url: Option<String>,
    },
    /// The whole thing on the embedded default: sample workspace, modern server and
    /// gateway, no setup.
    Up {
        /// Folder for the sample workspace, repository, config and database.
        #[arg(long, default_value = "dualera-demo")]
        dir: PathBuf,
        /// Address the gateway listens on.
        #[arg(long, default_value = "127.0.0.1:8788")]
        listen: SocketAddr,
        /// Serve the gateway over HTTPS with a throw-away CA and certificate generated
        /// into DIR/tls/ (the CA's path is printed, to give to hosts).
        #[arg(long, conflicts_with = "tls_cert")]
        tls: bool,
        /// Serve TLS with this certificate chain (PEM, leaf first); needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Address of the admin listener (health, metrics, migration report).
        #[arg(long, default_value = "127.0.0.1:8789")]
        admin: SocketAddr,
    },
    /// Print the migration report of a running gateway (its admin listener).
    Report {
        /// The gateway's admin listener.
        #[arg(long, default_value = "http://127.0.0.1:8789")]
        admin: String,
        /// Print the JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Environment variable holding the admin bearer token, if one is configured.
        #[arg(long, default_value = "DUALERA_ADMIN_TOKEN")]
        token_env: String,
    },
    /// The adapter test kit: the transcript vectors as a black-box suite for any
    /// era bridge (dualera's own gateway included).
    Vectors {
        #[command(subcommand)]
        command: vectors_cmd::VectorsCommand,
    },
}

fn main() -> ExitCode {
    // Freed pages go back to the system on a timer, not only when a thread allocates.
    let purging = tikv_jemalloc_ctl::background_thread::write(true);
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("DUALERA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = purging {
        tracing::warn!(error = %e, "jemalloc background purging unavailable");
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say!("dualera: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Vectors { command } = cli.command {
        return vectors_cmd::main(command, &runtime);
    }
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("dualera: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: Option<&PathBuf>) -> Result<Config, BoxError> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    })
}

/// The demo workspace in `dir` ([`dualera::demo::ensure`]), made on a blocking thread:
/// seeding a PostgreSQL store (`DUALERA_STORE_URL`) uses the synchronous client, which
/// must not run on a runtime worker.
async fn demo_layout(dir: PathBuf) -> Result<dualera::demo::DemoLayout, BoxError> {
    Ok(tokio::task::spawn_blocking(move || dualera::demo::ensure(&dir)).await??)
}

fn build_server(config: &Config) -> Result<Server, BoxError> {
    let (server, keys) = Server::from_config(config)?;
    if keys == KeySource::Generated {
        say!(
            "dualera: no [[state.keys]] configured; generated a random requestState key \
             for this process (states will not survive a restart or verify elsewhere)"
        );
    }
    Ok(server)
}

/// The listener's TLS: the flags win over the config section.
fn listener_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    section: Option<&TlsSection>,
) -> Result<Option<Arc<ServerTls>>, BoxError> {
    let files = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        _ => section.map(|t| (t.cert.clone(), t.key.clone())),
    };
    if files.is_some() && !cfg!(feature = "tls") {
        return Err(NotBuilt::new("tls").into());
    }
    Ok(match files {
        Some((c, k)) => Some(Arc::new(ServerTls::load(&c, &k)?)),
        None => None,
    })
}

fn scheme(config: &ListenerConfig) -> &'static str {
    if config.tls.is_some() {
        "https"
    } else {
        "http"
    }
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve {
            listen,
            config,
            stdio,
            principal,
            demo,
            tls_cert,
            tls_key,
        } => {
            let mut config_path = config;
            if let Some(dir) = demo {
                let layout = demo_layout(dir).await?;
                say!(
                    "dualera: demo workspace {} and repository {}",
                    layout.notes_uri,
                    layout.repo_dir.display()
                );
                config_path.get_or_insert(layout.config);
            }
            let config = load(config_path.as_ref())?;
            let server = build_server(&config)?;
            if stdio {
                let stdin = tokio::io::BufReader::new(tokio::io::stdin());
                return Ok(
                    server::stdio::serve(server, principal, stdin, tokio::io::stdout()).await?,
                );
            }
            let addr = listen.unwrap_or(config.server.listen);
            if !addr.ip().is_loopback() && !server.services().access.auth_required() {
                return Err(format!(
                    "refusing to listen on non-loopback {addr} without [[principals]] (bearer tokens) configured"
                )
                .into());
            }
            let mut listen_config = ListenerConfig::server(&config.server);
            listen_config.tls = listener_tls(tls_cert, tls_key, config.server.tls.as_ref())?;
            let listener = server::http::bind(addr).await?;
            let bound = listener.local_addr()?;
            let stop = shutdown_signal();
            dualera::tls::reload_on_sighup(listen_config.tls.iter().cloned().collect());
            warn_if_clear_text(bound, &listen_config, "modern server");
            say!(
                "dualera: modern server listening on {}://{bound}{}",
                scheme(&listen_config),
                dualera::endpoint::ENDPOINT
            );
            server::http::serve_with(listener, listen_config, server, stop).await?;
            Ok(())
        }
        Command::Gateway {
            upstream,
            upstream_cmd,
            stdio,
            listen,
            admin,
            config,
            upstream_ca,
            upstream_era,
            tls_cert,
            tls_key,
            session_store,
            advertise_url,
        } => {
            let config = load(config.as_ref())?;
            let mut gw_config = GatewayConfig::from_config(&config).with_shared_store(
                &config.gateway,
                session_store.as_deref(),
                advertise_url.as_deref(),
            )?;
            if let Some(era) = upstream_era {
                gw_config.era = era;
            }
            let admin_settings = AdminSettings::from_section(&config.admin)?;
            let admin_addr = admin.or(config.admin.listen);
            if let Some(addr) = admin_addr {
                admin::check_exposure(addr, &admin_settings)?;
            }
            let report = Report::open(&ReportConfig::from_section(&config.report))?;
            let flags = UpstreamFlags {
                urls: upstream,
                cmd: upstream_cmd,
                ca: upstream_ca,
            };
            let specs = routes::from_config(&config, &flags, &gw_config)?;
            let gateway = Gateway::with_routes(specs, report)?;
            let (admin_stop, admin_task) = match admin_addr {
                Some(addr) => {
                    let (url, stop, task) =
                        start_admin(addr, gateway.clone(), admin_settings).await?;
                    say!("dualera: admin listening on {url}");
                    (Some(stop), Some(task))
                }
                None => (None, None),
            };
            if stdio {
                let stdin = tokio::io::BufReader::new(tokio::io::stdin());
                gateway.serve_stdio(stdin, tokio::io::stdout()).await?;
            } else {
                let addr = listen
                    .or(config.gateway.listen)
                    .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8788)));
                let mut listen_config = gateway_listener(&config);
                listen_config.tls = listener_tls(tls_cert, tls_key, config.gateway.tls.as_ref())?;
                let listener = tokio::net::TcpListener::bind(addr).await?;
                let bound = listener.local_addr()?;
                let stop = shutdown_signal();
                dualera::tls::reload_on_sighup(listen_config.tls.iter().cloned().collect());
                warn_if_clear_text(bound, &listen_config, "gateway");
                say!(
                    "dualera: gateway listening on {}://{bound}{}",
                    scheme(&listen_config),
                    gateway.path()
                );
                let paths: Vec<&str> = gateway.routes().map(|r| r.path()).collect();
                if paths.len() > 1 {
                    say!("dualera: routes: {}", paths.join(", "));
                }
                gateway.serve_with(listener, listen_config, stop).await?;
            }
            stop_admin(admin_stop, admin_task).await;
            Ok(())
        }
        Command::Up {
            dir,
            listen,
            tls,
            tls_cert,
            tls_key,
            admin,
        } => {
            let layout = demo_layout(dir).await?;
            let config = load(Some(&layout.config))?;
            let mut listen_config = gateway_listener(&config);
            let mut ca_line = String::new();
            if tls {
                let demo_tls = dualera::demo::ensure_tls(&layout.dir)?;
                listen_config.tls = Some(Arc::new(ServerTls::load(&demo_tls.cert, &demo_tls.key)?));
                ca_line = format!(
                    "  CA certificate (give it to hosts):  {}\n",
                    demo_tls.ca.display()
                );
            } else {
                listen_config.tls = listener_tls(tls_cert, tls_key, config.gateway.tls.as_ref())?;
            }
            let server = build_server(&config)?;
            let admin_settings = AdminSettings::from_section(&config.admin)?;
            admin::check_exposure(admin, &admin_settings)?;
            let report = Report::open(&ReportConfig::from_section(&config.report))?;
            let upstream_listener =
                server::http::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            let upstream_addr = upstream_listener.local_addr()?;
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let mut rx = stop_rx.clone();
            let server_task =
                tokio::spawn(server::http::serve(upstream_listener, server, async move {
                    let _ = rx.changed().await;
                }));
            let mut gw_config = GatewayConfig::from_config(&config);
            // The embedded server's own limit is known here: what it would refuse, the
            // gateway refuses first, naming the limit.
            if config.gateway.upstream_max_body_bytes.is_none() {
                gw_config.upstream_max_body_bytes = config.limits.max_body_bytes;
            }
            let uri: http::Uri =
                format!("http://{upstream_addr}{}", dualera::endpoint::ENDPOINT).parse()?;
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let bound = listener.local_addr()?;
            let gateway = Gateway::with_report(
                Upstream::Http(Box::new(HttpUpstream::new(
                    uri.clone(),
                    gw_config.max_body_bytes,
                )?)),
                gw_config,
                report,
            );
            let (admin_url, admin_stop, admin_task) =
                start_admin(admin, gateway.clone(), admin_settings).await?;
            let stop = shutdown_signal();
            dualera::tls::reload_on_sighup(listen_config.tls.iter().cloned().collect());
            warn_if_clear_text(bound, &listen_config, "gateway");
            // Written with errors ignored: whoever started us may have stopped reading.
            let banner = format!(
                "dualera is up.\n  gateway (legacy and modern hosts): {}://{bound}/mcp\n  \
                 modern server (direct):           {uri}\n  \
                 admin (health, metrics, report):  {admin_url}\n  \
                 migration report:                  {admin_url}/report.html\n  \
                 notes workspace:                   {}\n  \
                 repository:                        {}\n  \
                 config:                            {}\n{ca_line}Press Ctrl-C to stop.\n",
                scheme(&listen_config),
                layout.notes_uri,
                layout.repo_dir.display(),
                layout.config.display()
            );
            {
                use std::io::Write;
                let mut out = std::io::stdout();
                let _ = out.write_all(banner.as_bytes());
                let _ = out.flush();
            }
            gateway.serve_with(listener, listen_config, stop).await?;
            stop_admin(Some(admin_stop), Some(admin_task)).await;
            let _ = stop_tx.send(true);
            let _ = server_task.await;
            Ok(())
        }
        Command::Vectors { .. } => Err("handled before the runtime runs".into()),
        Command::Report {
            admin,
            json,
            token_env,
        } => {
            let token = std::env::var(&token_env).ok().filter(|t| !t.is_empty());
            let body = dualera::gateway::report::fetch(&admin, token.as_deref()).await?;
            if json {
                println!("{}", String::from_utf8_lossy(&body));
                return Ok(());
            }
            let snapshot: report::ReportSnapshot = serde_json::from_slice(&body)
                .map_err(|e| format!("{admin}/report did not answer a migration report: {e}"))?;
            print!("{}", report::text::render(&snapshot));
            Ok(())
        }
    }
}

type AdminTask = tokio::task::JoinHandle<std::io::Result<()>>;

/// Binds and starts the admin listener; returns its URL, its stop switch and task.
async fn start_admin(
    addr: SocketAddr,
    gateway: Gateway,
    settings: AdminSettings,
) -> Result<(String, tokio::sync::oneshot::Sender<()>, AdminTask), BoxError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for the admin endpoints: {e}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(admin::serve(listener, gateway, settings, async move {
        let _ = rx.await;
    }));
    Ok((url, tx, task))
}

async fn stop_admin(stop: Option<tokio::sync::oneshot::Sender<()>>, task: Option<AdminTask>) {
    if let Some(stop) = stop {
        let _ = stop.send(());
    }
    if let Some(task) = task {
        let _ = task.await;
    }
}

fn gateway_listener(config: &Config) -> ListenerConfig {
    ListenerConfig {
        grace: std::time::Duration::from_secs(5),
        ..ListenerConfig::gateway(&config.gateway)
    }
}

/// The shutdown trigger (SIGTERM or Ctrl-C). The handlers are installed when this is
/// called, not when the future is first polled, so a signal that arrives right after
/// the listener announces itself still shuts down cleanly.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {}
                () = wait(int) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
