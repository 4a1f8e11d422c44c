//! A modern (2026-07-28) host as raw HTTP requests, in front of the gateway binary run
//! as a reverse bridge (`--upstream-era legacy`): what the reverse-bridge tests send and
//! how they read the answers (one JSON body, or an SSE stream read event by event).
#![allow(dead_code)]

use super::legacy_server::Proc;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// `dualera gateway --upstream-era legacy …`, and the addresses it reported.
pub(crate) struct Gateway {
    _proc: Proc,
    lines: Arc<Mutex<Vec<String>>>,
    pub(crate) addr: SocketAddr,
}

impl Gateway {
    /// With these arguments besides the era and the listener.
    pub(crate) fn spawn(args: &[&str]) -> Self {
        Self::spawn_on("127.0.0.1:0", args)
    }

    /// [`Self::spawn`] listening on `listen` (a replica whose address other replicas
    /// are told before it starts).
    pub(crate) fn spawn_on(listen: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
            .arg("gateway")
            .args(args)
            .args(["--upstream-era", "legacy", "--listen", listen])
            .env("DUALERA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dualera");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                keep.lock().expect("lines").push(line);
            }
        });
        let mut gw = Self {
            _proc: Proc(child),
            lines,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        gw.addr = gw.listening("gateway");
        gw
    }

    /// The address after `<what> listening on http://`.
    pub(crate) fn listening(&self, what: &str) -> SocketAddr {
        let deadline = std::time::Instant::now() + WAIT;
        let marker = format!("{what} listening on http://");
        loop {
            {
                let lines = self.lines.lock().expect("lines");
                for l in lines.iter() {
                    if let Some(rest) = l.split(&marker).nth(1) {
                        if let Ok(a) = rest.split('/').next().unwrap_or("").parse() {
                            return a;
                        }
                    }
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no `{marker}` line; stderr:\n{}",
                    lines.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// The `_meta` of a modern host declaring every client capability.
pub(crate) fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "elicitation": { "form": {} },
            "sampling": {},
            "roots": {}
        },
        "io.modelcontextprotocol/clientInfo": { "name": "modern-host", "version": "1" }
    })
}

/// A `tools/call` of `name`.
pub(crate) fn call(id: i64, name: &str, arguments: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": meta() } })
}

/// The text of a complete `tools/call` result.
pub(crate) fn text(answer: &Value) -> String {
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("text content in {answer}"))
        .to_owned()
}

fn client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>()
}

/// Sends one 2026-07-28 request with these extra headers; the response (head, body
/// unread).
pub(crate) async fn send(
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> http::Response<hyper::body::Incoming> {
    let mut b = http::Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28");
    // The routing headers a 2026-07-28 host sends (streamable-http.mdx, "Standard
    // Request Headers"), unless the test sends its own.
    let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if let Some(method) = body["method"].as_str().filter(|_| !given("mcp-method")) {
        b = b.header("mcp-method", method);
    }
    let params = &body["params"];
    if let Some(name) = params["name"].as_str().or(params["uri"].as_str()) {
        if !given("mcp-name") {
            b = b.header("mcp-name", name);
        }
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    tokio::time::timeout(WAIT, client().request(req))
        .await
        .expect("answered in time")
        .expect("request sent")
}

/// One request; its HTTP status and every JSON-RPC message of the answer (one for a
/// JSON body, the events of an SSE body in order).
pub(crate) async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Vec<Value>) {
    let resp = send(url, headers, body).await;
    let status = resp.status().as_u16();
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let bytes = tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    if bytes.is_empty() {
        return (status, Vec::new());
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let messages = if sse {
        events(&text)
    } else {
        vec![serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON answer, got {text}"))]
    };
    (status, messages)
}

/// The JSON-RPC messages of SSE text (its `data:` lines).
pub(crate) fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).expect("JSON event"))
        .collect()
}

/// An SSE answer read as it comes.
pub(crate) struct Stream {
    body: hyper::body::Incoming,
    pending: String,
}

impl Stream {
    /// Opens the request's stream; its answer must be SSE.
    pub(crate) async fn open(url: &str, headers: &[(&str, &str)], body: &Value) -> Self {
        let resp = send(url, headers, body).await;
        assert_eq!(resp.status(), 200);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            body: resp.into_body(),
            pending: String::new(),
        }
    }

    /// The next message, within `WAIT`; `None` at the end of the stream.
    pub(crate) async fn next(&mut self) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..end + 2).collect();
                if let Some(m) = events(&event).into_iter().next() {
                    return Some(m);
                }
                continue;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .expect("an event in time");
            match frame {
                None => return None,
                Some(f) => {
                    let f = f.expect("stream frame");
                    if let Some(d) = f.data_ref() {
                        self.pending.push_str(&String::from_utf8_lossy(d));
                    }
                }
            }
        }
    }
}

/// One plain GET; the status and body text.
pub(crate) async fn get(url: &str) -> (u16, String) {
    let uri: http::Uri = url.parse().expect("uri");
    let req = http::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = tokio::time::timeout(WAIT, client().request(req))
        .await
        .expect("answered in time")
        .expect("sent");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
