//! The legacy server the legacy-upstream and reverse-bridge tests run against: the
//! official Python SDK's FastMCP (mcp 1.30.0, `tests/interop/py/legacy_server.py`)
//! over Streamable HTTP, HTTP+SSE or stdio, in the interop suite's venv. Without the
//! venv the tests fail (they never skip) and say how to create it.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// The interop venv's python with mcp 1.30.0; fails (never skips) without it.
pub(crate) fn python() -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/interop/venv-mcp-1.30.0/bin/python");
    assert!(
        p.exists(),
        "{} is missing: these tests need the Python SDK mcp 1.30.0; \
         create it with `python3 tests/interop/run.py --prepare-legacy-python`",
        p.display()
    );
    p
}

/// The server script.
pub(crate) fn server_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/py/legacy_server.py")
}

/// The command line of the server over stdio (for `--upstream-cmd`).
pub(crate) fn stdio_command() -> String {
    format!("{} {} stdio", python().display(), server_script().display())
}

/// A spawned process, killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns a server that prints `PORT n` on its stdout once bound, and returns it with
/// that port once it accepts connections (both fail the test after [`WAIT`]).
pub(crate) fn listening(mut command: Command) -> (Proc, u16) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the legacy server");
    let stdout = child.stdout.take().expect("stdout");
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(p) = line.strip_prefix("PORT ") {
                let _ = tx.send(p.trim().parse::<u16>().ok());
            }
        }
    });
    let port = rx
        .recv_timeout(WAIT)
        .ok()
        .flatten()
        .expect("the legacy server printed its port");
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (proc, port)
}

/// The Python FastMCP server over HTTP (`streamable-http` or `sse`).
pub(crate) struct PyServer {
    _proc: Proc,
    pub(crate) port: u16,
}

impl PyServer {
    /// On any free port.
    pub(crate) fn spawn(mode: &str) -> Self {
        Self::spawn_on(mode, 0)
    }

    /// On `port` (0: any free one); returns once it accepts connections.
    pub(crate) fn spawn_on(mode: &str, port: u16) -> Self {
        let mut command = Command::new(python());
        command.arg(server_script()).arg(mode).arg(port.to_string());
        let (proc, port) = listening(command);
        Self { _proc: proc, port }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The server's own request counts: "POST /mcp initialize", "DELETE /mcp", …
    pub(crate) async fn stats(&self) -> Value {
        stats_of(&self.url("/stats")).await
    }

    /// How many requests of `key` reached it.
    pub(crate) async fn count(&self, key: &str) -> u64 {
        self.stats()
            .await
            .get(key)
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// A test server's own counts (`GET url`, JSON).
pub(crate) async fn stats_of(url: &str) -> Value {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let uri: http::Uri = url.parse().expect("uri");
    let resp = tokio::time::timeout(WAIT, client.get(uri))
        .await
        .expect("stats in time")
        .expect("stats");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&body).expect("stats JSON")
}
