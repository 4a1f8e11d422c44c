//! The `dualera` command line.

use clap::{Parser, Subcommand};
use dualera::config::Config;
use dualera::server::{self, KeySource, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "dualera", version, about = "Dual-era MCP gateway and modern notes server")]
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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("DUALERA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
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
            let config = match &config_path {
                Some(p) => Config::load(p)?,
                None => Config::default(),
            };
            let (server, keys) = Server::from_config(&config)?;
            if keys == KeySource::Generated {
                eprintln!(
                    "dualera: no [[state.keys]] configured; generated a random requestState key \
                     for this process (states will not survive a restart or verify elsewhere)"
                );
            }
            if stdio {
                let stdin = tokio::io::BufReader::new(tokio::io::stdin());
                return Ok(server::stdio::serve(server, principal, stdin, tokio::io::stdout()).await?);
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
            eprintln!("dualera: modern server listening on http://{bound}{}", server::http::ENDPOINT);
            server::http::serve(listener, server, shutdown_signal()).await?;
            Ok(())
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
