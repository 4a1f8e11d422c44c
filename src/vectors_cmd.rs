//! `dualera vectors …`: the command line of the adapter test kit (`dualera-kit`).
//! Exit status of `run`: 0 every vector passed (or does not apply), 1 some vector
//! failed, 2 the run could not be carried out (bad options, bad vectors, no port).

use clap::{Args, Subcommand};
use dualera_kit::format::{self, Vector};
use dualera_kit::matching::Mode;
use dualera_kit::report::Verdict;
use dualera_kit::runner::{self, Bridge, Options};
use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub(crate) enum VectorsCommand {
    /// Run the transcript vectors against a bridge: the runner plays the legacy host
    /// and a scripted 2026-07-28 upstream around it.
    Run(Box<RunArgs>),
    /// List the vectors (name, revision, row, where they apply, the spec text they check).
    List {
        /// Read vectors from this folder instead of the built-in set.
        #[arg(long)]
        vectors: Option<PathBuf>,
    },
}

#[derive(Args)]
pub(crate) struct RunArgs {
    /// A running Streamable HTTP bridge's legacy endpoint (started with its upstream
    /// at http://<--upstream-listen>/mcp).
    #[arg(long, requires = "upstream_listen", conflicts_with = "bridge_cmd")]
    bridge_url: Option<String>,
    /// Where the runner's scripted upstream listens for that bridge.
    #[arg(long, requires = "bridge_url")]
    upstream_listen: Option<SocketAddr>,
    /// A stdio bridge to spawn per session, e.g. "dualera gateway --stdio --upstream
    /// {upstream}" ({upstream} becomes the runner's upstream URL; quoting as in sh).
    #[arg(long, required_unless_present = "bridge_url")]
    bridge_cmd: Option<String>,
    /// Run only vectors whose name contains this (repeatable).
    #[arg(long)]
    filter: Vec<String>,
    /// Also write JUnit XML here.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Also write the table as Markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Also write every outcome as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Read vectors from this folder instead of the built-in set.
    #[arg(long)]
    vectors: Option<PathBuf>,
    /// Match implementation-defined fields ("name?") exactly as written (for the
    /// implementation the vectors were recorded from: dualera).
    #[arg(long)]
    strict: bool,
    /// The bridge's session settings when not the defaults, as a JSON object in the
    /// vectors' vocabulary (or @FILE): vectors assuming other values are not applicable.
    #[arg(long)]
    bridge_settings: Option<String>,
    /// Seconds a step waits for the bridge's outputs.
    #[arg(long, default_value_t = 5)]
    step_timeout: u64,
    /// Seconds one vector may take at most.
    #[arg(long, default_value_t = 120)]
    vector_timeout: u64,
}

fn load(dir: Option<&PathBuf>) -> Result<Vec<Vector>, String> {
    match dir {
        Some(d) => format::load_dir(d).map_err(|e| e.to_string()),
        None => runner::embedded().map_err(|e| e.to_string()),
    }
}

fn settings(arg: Option<&str>) -> Result<Map<String, Value>, String> {
    let text = match arg {
        None => return runner::settings_from(&Map::new()).map_err(|e| e.to_string()),
        Some(a) => match a.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?,
            None => a.to_owned(),
        },
    };
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&text) else {
        return Err("--bridge-settings must be a JSON object".into());
    };
    runner::settings_from(&o).map_err(|e| e.to_string())
}

pub(crate) fn main(command: VectorsCommand, runtime: &tokio::runtime::Runtime) -> ExitCode {
    match command {
        VectorsCommand::List { vectors } => match load(vectors.as_ref()) {
            Ok(all) => {
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                for v in all {
                    let wires = v
                        .transports
                        .listed()
                        .map(|l| l.iter().map(|t| t.name()).collect::<Vec<_>>().join(","))
                        .unwrap_or_else(|| "all".into());
                    let line = writeln!(
                        out,
                        "{:<46} {:<10} {:<18} {:<28} {}",
                        v.name,
                        v.revision.as_deref().unwrap_or("-"),
                        v.row,
                        wires,
                        v.spec.join(" ")
                    );
                    if line.is_err() {
                        break;
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dualera vectors: {e}");
                ExitCode::from(2)
            }
        },
        VectorsCommand::Run(args) => match runtime.block_on(run(*args)) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("dualera vectors: {e}");
                ExitCode::from(2)
            }
        },
    }
}

async fn run(args: RunArgs) -> Result<ExitCode, String> {
    let bridge = match (args.bridge_url, args.upstream_listen, args.bridge_cmd) {
        (Some(url), Some(upstream_listen), None) => Bridge::Http {
            url,
            upstream_listen,
        },
        (None, None, Some(command)) => Bridge::Command { command },
        _ => {
            return Err("give --bridge-url URL --upstream-listen ADDR, or --bridge-cmd CMD".into())
        }
    };
    let options = Options {
        bridge,
        vectors: load(args.vectors.as_ref())?,
        filter: args.filter,
        mode: if args.strict {
            Mode::Strict
        } else {
            Mode::Lenient
        },
        settings: settings(args.bridge_settings.as_deref())?,
        step_timeout: Duration::from_secs(args.step_timeout.max(1)),
        vector_timeout: Duration::from_secs(args.vector_timeout.max(1)),
    };
    let report = runner::run(&options, |o| {
        let word = match &o.verdict {
            Verdict::Pass => "pass",
            Verdict::Fail(_) => "FAIL",
            Verdict::NotApplicable(_) => "n/a ",
        };
        eprintln!("vectors: {word} {} ({} ms)", o.name, o.millis);
    })
    .await
    .map_err(|e| e.to_string())?;
    if report.outcomes.is_empty() {
        return Err("no vector matches the filter".into());
    }
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    if let Some(p) = &args.junit {
        write(p, report.junit())?;
    }
    if let Some(p) = &args.markdown {
        write(p, report.markdown())?;
    }
    if let Some(p) = &args.json {
        write(p, format!("{:#}\n", report.json()))?;
    }
    {
        use std::io::Write as _;
        let _ = std::io::stdout().write_all(report.text().as_bytes());
    }
    Ok(if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
