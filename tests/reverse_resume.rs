//! The reverse bridge resumes a legacy response stream the server closed before the
//! response (2025-11-25 transports, "Resumability and Redelivery"): the gateway binary
//! (`--upstream-era legacy`) in front of the official TypeScript SDK 1.32.2 server with
//! an event store (`tests/interop/ts/resumable_server.mjs`), whose `relay` tool sends a
//! log line, closes its response stream, and sends more lines and the result while the
//! client waits the `retry` it was given (so the store replays them); the same with the
//! official Python SDK's FastMCP server (mcp 1.30.0,
//! `tests/interop/py/resumable_server.py`, `Context.close_sse_stream`). The gateway
//! must come back with `GET` and `Last-Event-ID` and hand the host everything, in
//! order, on the host request's own stream.
//!
//! The peers need the interop suite's dependencies: without them these tests fail
//! (they never skip); `python3 tests/interop/run.py --prepare-legacy-peers` installs
//! them.

#[path = "common/legacy_server.rs"]
mod legacy_server;
#[path = "common/modern_host.rs"]
mod modern_host;

use legacy_server::Proc;
use modern_host::{call, post, text, Gateway, WAIT};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

/// A legacy server with an event store, on a free port.
struct Peer {
    _proc: Proc,
    port: u16,
}

impl Peer {
    /// The TypeScript SDK 1.32.2 server.
    fn typescript() -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/ts");
        assert!(
            dir.join("node_modules/@modelcontextprotocol/sdk").exists(),
            "{} has no node_modules: run `python3 tests/interop/run.py --prepare-legacy-peers`",
            dir.display()
        );
        let mut command = Command::new("node");
        command.arg("resumable_server.mjs").current_dir(&dir);
        Self::spawn(command)
    }

    /// The Python SDK mcp 1.30.0 FastMCP server.
    fn python() -> Self {
        let mut command = Command::new(legacy_server::python());
        command.arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/py/resumable_server.py"),
        );
        Self::spawn(command)
    }

    /// Runs `command` and waits for the `PORT <n>` line it prints.
    fn spawn(command: Command) -> Self {
        let (proc, port) = legacy_server::listening(command);
        Self { _proc: proc, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The server's own counts (`GET /stats`).
    async fn stats(&self) -> Value {
        legacy_server::stats_of(&format!("http://127.0.0.1:{}/stats", self.port)).await
    }
}

/// `relay(n)` asking for log lines at `info`.
fn relay(id: i64, n: u64) -> Value {
    let mut request = call(id, "relay", json!({ "n": n }));
    request["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    request
}

#[tokio::test]
async fn a_response_stream_the_typescript_server_closed_is_resumed_with_last_event_id() {
    resumed(Peer::typescript()).await;
}

#[tokio::test]
async fn a_response_stream_the_python_server_closed_is_resumed_with_last_event_id() {
    resumed(Peer::python()).await;
}

async fn resumed(peer: Peer) {
    let gw = Gateway::spawn(&["--upstream", &peer.url()]);
    let (_, added) = post(&gw.url(), &[], &call(1, "add", json!({ "a": 2, "b": 3 }))).await;
    assert_eq!(text(&added[0]), "5");
    assert_eq!(peer.stats().await["GET /mcp Last-Event-ID"], Value::Null);

    let (status, messages) = tokio::time::timeout(WAIT, post(&gw.url(), &[], &relay(2, 3)))
        .await
        .expect("the relayed call answered in time");
    assert_eq!(status, 200);
    let (last, before) = messages.split_last().expect("messages");
    assert_eq!(last["id"], 2, "{last}");
    assert_eq!(text(last), "relayed 3");
    let lines: Vec<&Value> = before
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| &m["params"]["data"])
        .collect();
    assert_eq!(
        lines,
        ["before", "after 0", "after 1", "after 2"],
        "{before:?}"
    );
    let stats = peer.stats().await;
    assert!(
        stats["GET /mcp Last-Event-ID"].as_u64() >= Some(1),
        "the server saw no resumption: {stats}"
    );
    assert!(
        stats["replayed"].as_u64() >= Some(1),
        "nothing was replayed: {stats}"
    );

    // The session goes on: another call, and another resumed one, on it.
    let (_, added) = post(&gw.url(), &[], &call(3, "add", json!({ "a": 1, "b": 1 }))).await;
    assert_eq!(text(&added[0]), "2");
    let (_, messages) = post(&gw.url(), &[], &relay(4, 1)).await;
    assert_eq!(text(messages.last().expect("answer")), "relayed 1");
    let stats = peer.stats().await;
    assert!(
        stats["GET /mcp Last-Event-ID"].as_u64() >= Some(2),
        "{stats}"
    );
}
