//! The `dualera` command line.

use clap::{Parser, Subcommand};
use dualera::config::Config;
use dualera::gateway::{Gateway, GatewayConfig, HttpUpstream, StdioUpstream, Upstream};
use dualera::server::{self, KeySource, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error>;

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
    },
    /// Run the gateway in front of a modern server.
    Gateway {
        /// The modern server's MCP endpoint, e.g. http://127.0.0.1:8787/mcp.
        #[arg(
            long,
            required_unless_present = "upstream_cmd",
            conflicts_with = "upstream_cmd"
        )]
        upstream: Option<String>,
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
        /// Configuration file (TOML; its [gateway] section is used).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where legacy Streamable HTTP sessions live: "memory" (default) or
        /// redis://HOST:PORT/DB, shared by every replica behind a load balancer.
        /// Overrides [gateway] session_store.
        #[arg(long)]
        session_store: Option<String>,
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
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("DUALERA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dualera: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dualera: {e}");
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

fn build_server(config: &Config) -> Result<Server, BoxError> {
    let (server, keys) = Server::from_config(config)?;
    if keys == KeySource::Generated {
        eprintln!(
            "dualera: no [[state.keys]] configured; generated a random requestState key \
             for this process (states will not survive a restart or verify elsewhere)"
        );
    }
    Ok(server)
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve {
            listen,
            config,
            stdio,
            principal,
            demo,
        } => {
            let mut config_path = config;
            if let Some(dir) = demo {
                let layout = dualera::demo::ensure(&dir)?;
                eprintln!(
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
            let listener = server::http::bind(addr).await?;
            let bound = listener.local_addr()?;
            let stop = shutdown_signal();
            eprintln!(
                "dualera: modern server listening on http://{bound}{}",
                server::http::ENDPOINT
            );
            server::http::serve(listener, server, stop).await?;
            Ok(())
        }
        Command::Gateway {
            upstream,
            upstream_cmd,
            stdio,
            listen,
            config,
            session_store,
        } => {
            let config = load(config.as_ref())?;
            let gw_config = GatewayConfig::from_config(&config)
                .with_session_store(&config.gateway, session_store.as_deref())?;
            let upstream = match (upstream, upstream_cmd) {
                (Some(url), _) => {
                    let uri: http::Uri = url.parse()?;
                    if uri.scheme_str() != Some("http") {
                        return Err("--upstream must be an http:// URL".into());
                    }
                    Upstream::Http(Box::new(HttpUpstream::new(uri, gw_config.max_body_bytes)))
                }
                (None, Some(cmd)) => {
                    let mut words = cmd.split_whitespace().map(str::to_owned);
                    let program = words.next().ok_or("--upstream-cmd is empty")?;
                    Upstream::Stdio(StdioUpstream::spawn(program, words.collect()))
                }
                (None, None) => return Err("give --upstream URL or --upstream-cmd CMD".into()),
            };
            let gateway = Gateway::new(upstream, gw_config);
            if stdio {
                let stdin = tokio::io::BufReader::new(tokio::io::stdin());
                gateway.serve_stdio(stdin, tokio::io::stdout()).await?;
                return Ok(());
            }
            let addr = listen
                .or(config.gateway.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8788)));
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            let stop = shutdown_signal();
            eprintln!("dualera: gateway listening on http://{bound}/mcp");
            gateway.serve(listener, stop).await?;
            Ok(())
        }
        Command::Up { dir, listen } => {
            let layout = dualera::demo::ensure(&dir)?;
            let config = load(Some(&layout.config))?;
            let server = build_server(&config)?;
            let upstream_listener =
                server::http::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            let upstream_addr = upstream_listener.local_addr()?;
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let mut rx = stop_rx.clone();
            let server_task =
                tokio::spawn(server::http::serve(upstream_listener, server, async move {
                    let _ = rx.changed().await;
                }));
            let gw_config = GatewayConfig::from_config(&config);
            let uri: http::Uri =
                format!("http://{upstream_addr}{}", server::http::ENDPOINT).parse()?;
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let bound = listener.local_addr()?;
            let stop = shutdown_signal();
            // Written with errors ignored: whoever started us may have stopped reading.
            let banner = format!(
                "dualera is up.\n  gateway (legacy and modern hosts): http://{bound}/mcp\n  \
                 modern server (direct):           {uri}\n  \
                 notes workspace:                   {}\n  \
                 repository:                        {}\n  \
                 config:                            {}\nPress Ctrl-C to stop.\n",
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
            let gateway = Gateway::new(
                Upstream::Http(Box::new(HttpUpstream::new(uri, gw_config.max_body_bytes))),
                gw_config,
            );
            gateway.serve(listener, stop).await?;
            let _ = stop_tx.send(true);
            let _ = server_task.await;
            Ok(())
        }
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
