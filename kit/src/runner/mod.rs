//! `dualera vectors run`: the black-box runner.
//!
//! For each vector it plays the upstream (a scripted 2026-07-28 server on a loopback
//! port) and the legacy host around the bridge under test, one vector at a time:
//!
//! - a running Streamable HTTP bridge (`--bridge-url URL --upstream-listen ADDR`):
//!   the bridge was started pointed at `http://ADDR/mcp`; every vector's sessions
//!   are opened on it and deleted at the vector's end;
//! - a stdio bridge (`--bridge-cmd "CMD … {upstream}"`): spawned once per session of
//!   each vector, `{upstream}` replaced with the scripted upstream's URL (a fresh
//!   port per vector), stopped at the vector's end.
//!
//! Nothing here links the bridge: it is known only by its wires.

mod host_http;
mod host_stdio;
mod observe;
mod play;
mod sse;
mod upstream;

use crate::format::{self, Transport, Vector};
use crate::matching::{self, Mode};
use crate::report::{Difference, Outcome, Report, Verdict};
use play::{Play, Timing, Wire};
use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use upstream::Upstream;

/// The bridge under test.
#[derive(Debug, Clone)]
pub enum Bridge {
    /// Already running over Streamable HTTP, pointed at `http://{upstream_listen}/mcp`.
    Http {
        /// Its legacy endpoint.
        url: String,
        /// Where the runner's upstream listens.
        upstream_listen: SocketAddr,
    },
    /// Spawned per session, speaking stdio; `{upstream}` in the command is replaced.
    Command {
        /// The command line as given (split like a POSIX shell does).
        command: String,
    },
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The bridge.
    pub bridge: Bridge,
    /// The vectors (all of them; `filter` picks).
    pub vectors: Vec<Vector>,
    /// Run only vectors whose name contains one of these (all when empty).
    pub filter: Vec<String>,
    /// How implementation-defined fields are matched.
    pub mode: Mode,
    /// The bridge's session settings, in the vectors' vocabulary (defaults filled in);
    /// vectors assuming other values are not applicable.
    pub settings: Map<String, Value>,
    /// How long a step waits for its outputs.
    pub step_timeout: Duration,
    /// Upper bound on one vector.
    pub vector_timeout: Duration,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The upstream listener could not be bound.
    #[error("cannot listen for the bridge's upstream requests on {addr}: {detail}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        detail: String,
    },
    /// A bad option.
    #[error("{0}")]
    Usage(String),
}

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The vectors this build carries (`adapters/vectors/` when it was built).
pub fn embedded() -> Result<Vec<Vector>, format::FormatError> {
    EMBEDDED
        .iter()
        .map(|(name, text)| format::parse(name, text))
        .collect()
}

/// The bridge's settings: defaults, then `overrides` (keys checked).
pub fn settings_from(overrides: &Map<String, Value>) -> Result<Map<String, Value>, RunError> {
    let mut s = format::default_settings();
    for (k, v) in overrides {
        if !format::SETTINGS.iter().any(|(n, _)| n == k) {
            return Err(RunError::Usage(format!("unknown setting {k:?}")));
        }
        s.insert(k.clone(), v.clone());
    }
    Ok(s)
}

/// Whether `vector` applies to this bridge and wire; the reason if not.
fn not_applicable(vector: &Vector, transport: Transport, options: &Options) -> Option<String> {
    if vector.direction == format::Direction::Reverse {
        return Some(
            "a reverse-direction vector (modern host, legacy server): this runner plays a legacy host"
                .into(),
        );
    }
    if !vector.transports.includes(transport) {
        let list: Vec<&str> = vector
            .transports
            .listed()
            .unwrap_or_default()
            .iter()
            .filter(|t| **t != Transport::InProcess)
            .map(|t| t.name())
            .collect();
        return Some(if list.is_empty() {
            "checks the session machine alone (in process)".into()
        } else {
            format!("for {} only", list.join(", "))
        });
    }
    // A vector assumes every default it does not override, so a bridge configured
    // otherwise (fewer rounds, shorter timeouts) does not run it either.
    for (k, want) in &vector.settings() {
        if k == "id_prefix" {
            continue;
        }
        let have = options.settings.get(k);
        if !have.is_some_and(|h| matching::json_eq(h, want)) {
            return Some(format!(
                "assumes {k} = {} (the bridge: {})",
                matching::short(want),
                have.map_or("unknown".into(), matching::short)
            ));
        }
    }
    let longest = vector.steps.iter().filter_map(|s| s.at).max().unwrap_or(0);
    if Duration::from_millis(longest) + options.step_timeout > options.vector_timeout {
        return Some(format!(
            "needs {} s of real time (more than the vector timeout)",
            longest / 1000
        ));
    }
    None
}

/// Runs the selected vectors; `progress` gets each outcome as it is decided.
pub async fn run(
    options: &Options,
    mut progress: impl FnMut(&Outcome),
) -> Result<Report, RunError> {
    let timing = Timing {
        step: options.step_timeout,
        settle: Duration::from_millis(100),
        quiet: Duration::from_millis(300),
        early: Duration::from_millis(50),
    };
    let (transport, wire, shared_upstream) = match &options.bridge {
        Bridge::Http {
            url,
            upstream_listen,
        } => {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| RunError::Usage(format!("--bridge-url {url:?}: {e}")))?;
            if uri.scheme_str() != Some("http") {
                return Err(RunError::Usage(
                    "--bridge-url must be an http:// URL".into(),
                ));
            }
            let up = Upstream::bind(*upstream_listen)
                .await
                .map_err(|e| RunError::Listen {
                    addr: upstream_listen.to_string(),
                    detail: e.to_string(),
                })?;
            (Transport::StreamableHttp, Wire::Http(uri), Some(up))
        }
        Bridge::Command { command } => {
            let argv = shlex::split(command)
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    RunError::Usage(format!("--bridge-cmd {command:?} is not a command line"))
                })?;
            if !argv.iter().any(|a| a.contains("{upstream}")) {
                return Err(RunError::Usage(
                    "--bridge-cmd must contain {upstream} (the runner's upstream URL)".into(),
                ));
            }
            (Transport::Stdio, Wire::Command(argv), None)
        }
    };
    let bridge = match &options.bridge {
        Bridge::Http { url, .. } => url.clone(),
        Bridge::Command { command } => command.clone(),
    };
    let mut outcomes = Vec::new();
    for vector in &options.vectors {
        if !options.filter.is_empty()
            && !options
                .filter
                .iter()
                .any(|f| vector.name.contains(f.as_str()))
        {
            continue;
        }
        let started = Instant::now();
        let (verdict, notes) = match not_applicable(vector, transport, options) {
            Some(why) => (Verdict::NotApplicable(why), Vec::new()),
            None => {
                let own;
                let up = match &shared_upstream {
                    Some(u) => u,
                    None => {
                        own = Upstream::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                            .await
                            .map_err(|e| RunError::Listen {
                                addr: "127.0.0.1:0".into(),
                                detail: e.to_string(),
                            })?;
                        &own
                    }
                };
                let play = Play::new(vector, transport, options.mode, &wire, up, timing);
                match tokio::time::timeout(options.vector_timeout, play.run()).await {
                    Ok(r) => r,
                    Err(_) => {
                        up.detach();
                        (
                            Verdict::Fail(Difference::plain(
                                None,
                                format!(
                                    "the vector did not finish within {} s",
                                    options.vector_timeout.as_secs()
                                ),
                            )),
                            Vec::new(),
                        )
                    }
                }
            }
        };
        let outcome = Outcome {
            name: vector.name.clone(),
            revision: vector.revision.clone(),
            row: vector.row.clone(),
            verdict,
            notes,
            millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        progress(&outcome);
        outcomes.push(outcome);
    }
    Ok(Report {
        bridge,
        transport: transport.name().into(),
        mode: match options.mode {
            Mode::Strict => "strict".into(),
            Mode::Lenient => "lenient".into(),
        },
        outcomes,
    })
}
