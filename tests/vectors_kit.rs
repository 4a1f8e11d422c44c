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
                ms.is_multiple_of(1000),
                "{k} = {ms}: the gateway takes whole seconds"
            );
            ms / 1000
        };
        let line = match k.as_str() {
            "max_rounds" | "retry_pause_ms" | "max_in_flight" => format!("{k} = {v}"),
            "live_timeout_ms" => format!("live_request_timeout_secs = {}", secs(v)),
            "live_timeout_max_ms" => format!("live_request_timeout_max_secs = {}", secs(v)),
            "legacy_versions" => format!("legacy_versions = {v}"),
            "max_upstream_message_bytes" => format!("upstream_max_body_bytes = {v}"),
            other => panic!("vector setting {other} has no [gateway] key in dualera"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Runs `dualera vectors run` with `extra` options against `bridge`; returns the JSON
/// report (`null` if none was written), the printed table, and the exit code.
fn run_kit_report(bridge: &[String], extra: &[&str], out: &Path) -> (Value, String, i32) {
    let json = out.with_extension("json");
    let mut child = Running(
        Command::new(BIN)
            .args(["vectors", "run", "--json"])
            .arg(&json)
            .args(extra)
            .args(bridge)
            .env("DUALERA_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dualera vectors run"),
    );
    // Read the table while the runner works: a full pipe would stall it.
    let mut stdout = child.0.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut table = String::new();
        let _ = stdout.read_to_string(&mut table);
        table
    });
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the runner did not finish in 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let table = reader.join().unwrap_or_default();
    let report = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (report, table, status.code().unwrap_or(-1))
}

/// Runs every vector strictly against a bridge with `settings`; returns each
/// vector's result (`pass`, `fail`, `n/a`) and the table.
fn run_kit(
    bridge: &[String],
    settings: &Map<String, Value>,
    out: &Path,
) -> (BTreeMap<String, String>, String) {
    let settings = Value::Object(settings.clone()).to_string();
    let (report, table, code) =
        run_kit_report(bridge, &["--strict", "--bridge-settings", &settings], out);
    assert!(
        code == 0 || code == 1,
        "the runner itself failed (exit {code}):\n{table}"
    );
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
    let guard = tempfile::Builder::new()
        .prefix("dualera-vectors-kit-")
        .tempdir()
        .expect("temp dir");
    let tmp = guard.path();
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
        let h = s.spawn(|| wire_run(Transport::StreamableHttp, &groups, tmp));
        let o = s.spawn(|| wire_run(Transport::Stdio, &groups, tmp));
        (h.join().expect("http run"), o.join().expect("stdio run"))
    });
    let mut failures = Vec::new();
    for (wire, runs) in [
        (Transport::StreamableHttp, &http),
        (Transport::Stdio, &stdio),
    ] {
        let (mut applicable, mut passed) = (0, 0);
        for v in &vectors {
            if !v.transports.includes(wire) {
                continue;
            }
            applicable += 1;
            let group = groups
                .iter()
                .position(|(s, _)| *s == v.config)
                .expect("every vector has its group");
            let (results, table) = &runs[group];
            let got = results.get(&v.name).map_or("missing", String::as_str);
            if got == "pass" {
                passed += 1;
            } else {
                failures.push(format!("{} over {wire}: {got}\n{table}", v.name));
            }
        }
        println!(
            "kit over {wire}: {passed} of {applicable} applicable vectors pass ({} vectors)",
            vectors.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn stdio_bridge() -> Vec<String> {
    vec![
        "--bridge-cmd".to_owned(),
        format!("'{BIN}' gateway --stdio --upstream {{upstream}}"),
    ]
}

/// Copies vector `name`, changed by `edit`, into a fresh folder.
fn tampered(dir: &Path, name: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("adapters/vectors/{name}.json"));
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut v);
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join(format!("{name}.json")), v.to_string()).unwrap();
    folder
}

fn first_difference(report: &Value) -> String {
    let o = &report["outcomes"][0];
    assert_eq!(
        o["result"], "fail",
        "the tampered vector must fail: {report:#}"
    );
    o["difference"]["summary"].as_str().unwrap_or("").to_owned()
}

/// The runner is a test that can fail: each kind of difference is caught and named,
/// and a broken or silent bridge is scored, not waited on forever.
#[test]
fn the_kit_catches_differences() {
    let guard = tempfile::Builder::new()
        .prefix("dualera-vectors-neg-")
        .tempdir()
        .expect("temp dir");
    let tmp = guard.path();
    let quick = ["--strict", "--step-timeout", "2"];
    let run_stdio = |dir: &Path, out: &str| {
        let mut extra: Vec<&str> = quick.to_vec();
        let d = dir.to_string_lossy().into_owned();
        extra.extend(["--vectors", d.as_str()]);
        run_kit_report(&stdio_bridge(), &extra, &tmp.join(out))
    };

    // A different message: named at the field, shown as a diff.
    let dir = tampered(tmp, "forward", |v| {
        v["steps"][4]["expect"][0]["message"]["params"]["arguments"]["q"] = "y".into();
    });
    let (report, table, code) = run_stdio(&dir, "message");
    assert_eq!(code, 1, "{table}");
    let d = first_difference(&report);
    assert!(d.contains(".message.params.arguments.q"), "{d}");
    assert!(
        report["outcomes"][0]["difference"]["diff"]
            .as_str()
            .unwrap()
            .contains("+"),
        "{report:#}"
    );

    // An output that comes too early: the bridge retries a state-only round after
    // 250 ms, the vector claims 1000 ms later.
    let dir = tampered(tmp, "mrtr_state_only", |v| {
        for s in v["steps"].as_array_mut().unwrap() {
            if s["from"] == "timer" {
                s["at"] = (s["at"].as_u64().unwrap() + 1000).into();
            }
        }
    });
    let (report, _, _) = run_stdio(&dir, "early");
    let d = first_difference(&report);
    assert!(d.contains("before the step's time"), "{d}");

    // A missing output.
    let dir = tampered(tmp, "initialized_and_ping", |v| {
        v["steps"][2]["expect"] = serde_json::json!([{"to": "peer", "stream": "standalone", "message": {"jsonrpc": "2.0", "method": "notifications/never"}}]);
    });
    let (report, _, _) = run_stdio(&dir, "missing");
    assert!(first_difference(&report).contains("not seen"), "{report:#}");

    // A bridge that dies, and one that never answers: scored, and the run ends.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("adapters/vectors");
    let d = dir.to_string_lossy().into_owned();
    for (cmd, what) in [
        ("sh -c 'exit 3' {upstream}", "exits"),
        ("sleep 600 {upstream}", "silent"),
    ] {
        let bridge = ["--bridge-cmd".to_owned(), cmd.to_owned()];
        let (report, table, code) = run_kit_report(
            &bridge,
            &[
                "--step-timeout",
                "1",
                "--vectors",
                &d,
                "--filter",
                "initialize_2025-11-25",
            ],
            &tmp.join(what),
        );
        assert_eq!(code, 1, "{what}: {table}");
        assert_eq!(
            report["outcomes"][0]["result"], "fail",
            "{what}: {report:#}"
        );
    }

    // Over HTTP: a wrong status, and a request the vector says must not be sent.
    let port = free_port();
    let config = tmp.join("default.toml");
    std::fs::write(&config, "[gateway]\n").unwrap();
    let (_gateway, url) = start_gateway(&config, port);
    let bridge = [
        "--bridge-url".to_owned(),
        url,
        "--upstream-listen".to_owned(),
        format!("127.0.0.1:{port}"),
    ];
    let run_http = |dir: &Path, out: &str| {
        let d = dir.to_string_lossy().into_owned();
        let extra = ["--strict", "--step-timeout", "2", "--vectors", d.as_str()];
        run_kit_report(&bridge, &extra, &tmp.join(out)).0
    };
    let dir = tampered(tmp, "http_session", |v| {
        v["steps"][2]["http"]["status"] = 201.into()
    });
    let d = first_difference(&run_http(&dir, "status"));
    assert!(d.contains("HTTP status 202, expected 201"), "{d}");
    // Without a TTL the result is not cached, so the second session asks again.
    let dir = tampered(tmp, "discover_cache_shared", |v| {
        v["steps"][1]["message"]["result"]["ttlMs"] = 0.into();
    });
    let d = first_difference(&run_http(&dir, "absent"));
    assert!(d.contains("must not be sent"), "{d}");
    // A discover other than the one a step awaits is answered (a bridge's own, its
    // cache's say, may cross the awaited one), and still named when the awaited one
    // never comes: here the bridge forwards the host's clientInfo, the step expects
    // another's.
    let dir = tampered(tmp, "discover_cache_shared", |v| {
        v["steps"][0]["expect"][0]["message"]["params"]["_meta"]
            ["io.modelcontextprotocol/clientInfo?"]["name"] = "another-host".into();
    });
    let d = first_difference(&run_http(&dir, "crossed"));
    assert!(
        d.contains("output differs from what the vector expects") && d.contains("clientInfo"),
        "{d}"
    );
    // A relayed challenge is matched byte for byte: one scope off is a difference.
    let dir = tampered(tmp, "denied_initialize", |v| {
        let h = &mut v["steps"][0]["http"]["headers"]["www-authenticate"];
        *h = h
            .as_str()
            .unwrap()
            .replace("notes:read", "notes:write")
            .into();
    });
    let d = first_difference(&run_http(&dir, "challenge"));
    assert!(d.contains("HTTP header www-authenticate"), "{d}");
    // So is the token a retry carries upstream: the re-sent answer's, not the first.
    let dir = tampered(tmp, "mrtr_denied_retry", |v| {
        let step = v["steps"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .rev()
            .find(|s| s["from"] == "peer" && s.get("host_headers").is_some())
            .unwrap();
        step["expect"][0]["http"]["headers"]["authorization"] = "Bearer first-token".into();
    });
    let d = first_difference(&run_http(&dir, "token"));
    assert!(d.contains("upstream request header authorization"), "{d}");
}
