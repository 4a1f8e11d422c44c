//! The adapter test kit against dualera itself, black-box: `dualera vectors run
//! --strict` over Streamable HTTP (a running `dualera gateway` pointed at the kit's
//! upstream) and over stdio (`dualera gateway --stdio`, spawned per session). Every
//! vector must pass on every wire it applies to. Vectors that assume other session
//! settings (`config`) run against a gateway configured the same way, the settings
//! translated into its `[gateway]` section.

use dualera_kit::format::{self, Transport, Vector};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dualera");

/// Kills the process when dropped (the test may fail half-way).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A vector setting as a `[gateway]` key of dualera's configuration.
fn gateway_toml(settings: &Map<String, Value>) -> String {
    let mut out = String::from("[gateway]\n");
    for (k, v) in settings {
        let secs = |ms: &Value| {
            let ms = ms.as_u64().expect("a number");
            assert!(
                ms % 1000 == 0,
                "{k} = {ms}: the gateway takes whole seconds"
            );
            ms / 1000
        };
        let line = match k.as_str() {
            "max_rounds" | "retry_pause_ms" | "max_in_flight" => format!("{k} = {v}"),
            "live_timeout_ms" => format!("live_request_timeout_secs = {}", secs(v)),
            "live_timeout_max_ms" => format!("live_request_timeout_max_secs = {}", secs(v)),
            "legacy_versions" => format!("legacy_versions = {v}"),
            other => panic!("vector setting {other} has no [gateway] key in dualera"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Runs the kit; returns each vector's result (`pass`, `fail`, `n/a`) and the table.
fn run_kit(
    bridge: &[String],
    settings: &Map<String, Value>,
    out: &Path,
) -> (BTreeMap<String, String>, String) {
    let json = out.with_extension("json");
    let mut cmd = Command::new(BIN);
    cmd.args(["vectors", "run", "--strict", "--json"])
        .arg(&json)
        .arg("--bridge-settings")
        .arg(Value::Object(settings.clone()).to_string())
        .args(bridge)
        .env("DUALERA_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Running(cmd.spawn().expect("spawn dualera vectors run"));
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "dualera vectors run did not finish in 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut table = String::new();
    if let Some(mut o) = child.0.stdout.take() {
        use std::io::Read;
        let _ = o.read_to_string(&mut table);
    }
    assert!(
        status.code().is_some_and(|c| c == 0 || c == 1),
        "the runner itself failed ({status}):\n{table}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
            .expect("JSON report parses");
    let results = report["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap().to_owned(),
                o["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (results, table)
}

/// Starts `dualera gateway` with `config` in front of the kit's upstream at `port`;
/// returns it and its legacy endpoint.
fn start_gateway(config: &Path, port: u16) -> (Running, String) {
    let mut child = Running(
        Command::new(BIN)
            .args([
                "gateway",
                "--upstream",
                &format!("http://127.0.0.1:{port}/mcp"),
            ])
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("DUALERA_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dualera gateway"),
    );
    let stderr = child.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(i) = line.find("http://") {
                let _ = tx.send(line[i..].trim().to_owned());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the gateway announces its listener");
    (child, url)
}

fn wire_run(
    wire: Transport,
    groups: &[(Map<String, Value>, PathBuf)],
    dir: &Path,
) -> Vec<(BTreeMap<String, String>, String)> {
    groups
        .iter()
        .enumerate()
        .map(|(i, (settings, config))| {
            let out = dir.join(format!("{}-{i}", wire.name()));
            match wire {
                Transport::StreamableHttp => {
                    let port = free_port();
                    let (_gateway, url) = start_gateway(config, port);
                    let bridge = [
                        "--bridge-url".to_owned(),
                        url,
                        "--upstream-listen".to_owned(),
                        format!("127.0.0.1:{port}"),
                    ];
                    run_kit(&bridge, settings, &out)
                }
                _ => {
                    let cmd = format!(
                        "'{BIN}' gateway --stdio --upstream {{upstream}} --config '{}'",
                        config.display()
                    );
                    run_kit(&["--bridge-cmd".to_owned(), cmd], settings, &out)
                }
            }
        })
        .collect()
}

#[test]
fn every_vector_passes_against_dualera_over_http_and_stdio() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("adapters/vectors");
    let vectors: Vec<Vector> = format::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let tmp = std::env::temp_dir().join(format!("dualera-vectors-kit-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // One gateway configuration per distinct set of assumed settings.
    let mut groups: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    groups.insert("{}".into(), Map::new());
    for v in &vectors {
        groups.insert(
            Value::Object(v.config.clone()).to_string(),
            v.config.clone(),
        );
    }
    let groups: Vec<(Map<String, Value>, PathBuf)> = groups
        .into_values()
        .enumerate()
        .map(|(i, s)| {
            let path = tmp.join(format!("gateway-{i}.toml"));
            std::fs::write(&path, gateway_toml(&s)).unwrap();
            (s, path)
        })
        .collect();
    // The two wires are mostly waiting on timers: run them side by side.
    let (http, stdio) = std::thread::scope(|s| {
        let h = s.spawn(|| wire_run(Transport::StreamableHttp, &groups, &tmp));
        let o = s.spawn(|| wire_run(Transport::Stdio, &groups, &tmp));
        (h.join().expect("http run"), o.join().expect("stdio run"))
    });
    let _ = std::fs::remove_dir_all(&tmp);
    let mut failures = Vec::new();
    for (wire, runs) in [
        (Transport::StreamableHttp, &http),
        (Transport::Stdio, &stdio),
    ] {
        for v in &vectors {
            if !v.transports.includes(wire) {
                continue;
            }
            let group = groups
                .iter()
                .position(|(s, _)| *s == v.config)
                .expect("every vector has its group");
            let (results, table) = &runs[group];
            let got = results.get(&v.name).map_or("missing", String::as_str);
            if got != "pass" {
                failures.push(format!("{} over {wire}: {got}\n{table}", v.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
