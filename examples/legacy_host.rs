//! A scripted legacy (2025-11-25) MCP host, built on `dualera-adapters`' JSON-RPC types,
//! runnable by hand against any gateway URL:
//!
//! ```sh
//! cargo run -- up --dir /tmp/demo &          # prints the URL, workspace URI and repo
//! cargo run --example legacy_host -- http://127.0.0.1:8788/mcp file:///tmp/demo/notes /tmp/demo/repo
//! ```
//!
//! It opens a session, lists tools, deletes notes through live elicitation (answered
//! accept, decline and cancel), summarizes the repository through two live sampling
//! rounds, lists notes through the roots migration adapter, and ends the session with
//! DELETE — checking each outcome, printing the transcript, exiting non-zero on the first
//! broken expectation.

use bytes::Bytes;
use dualera::sse;
use dualera_adapters::jsonrpc::{self, Message, Request, RequestId, Response};
use http::{header, Method};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the scripted user answers elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Accept and confirm, picking the first candidate.
    Accept,
    /// Decline.
    Decline,
    /// Cancel (dismiss).
    Cancel,
}

/// A legacy host: one session on one gateway URL.
pub struct LegacyHost {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
    session: Option<String>,
    next_id: i64,
    /// What the scripted user does with the next form.
    pub answer: Answer,
    /// Roots reported by the host.
    pub roots: Vec<Value>,
    /// Live requests the gateway sent, by method, in order.
    pub live: Vec<(String, Value)>,
    /// Whether to print the transcript.
    pub verbose: bool,
}

impl LegacyHost {
    /// A host for the gateway at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
            session: None,
            next_id: 0,
            answer: Answer::Accept,
            roots: Vec::new(),
            live: Vec::new(),
            verbose: true,
        }
    }

    fn log(&self, dir: &str, bytes: &[u8]) {
        if self.verbose {
            println!("{dir} {}", String::from_utf8_lossy(bytes));
        }
    }

    async fn post(
        &self,
        body: Vec<u8>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, BoxError> {
        self.log("host →", &body);
        let mut b = http::Request::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(s) = &self.session {
            b = b
                .header("mcp-session-id", s.as_str())
                .header("mcp-protocol-version", "2025-11-25");
        }
        Ok(self
            .client
            .request(b.body(Full::new(Bytes::from(body)))?)
            .await?)
    }

    /// Sends a request and serves live requests until its response arrives.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Response, BoxError> {
        self.next_id += 1;
        let id = RequestId::Number(self.next_id);
        let msg = Message::Request(Request {
            id: id.clone(),
            method: method.to_owned(),
            params: Some(params),
        });
        let resp = self.post(msg.to_vec()).await?;
        if let Some(s) = resp.headers().get("mcp-session-id") {
            self.session = Some(s.to_str()?.to_owned());
        }
        let status = resp.status();
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = resp.into_body();
        if !is_sse {
            let bytes = body.collect().await?.to_bytes();
            self.log("host ←", &bytes);
            return match jsonrpc::parse(&bytes) {
                Ok(Message::Response(r)) => Ok(r),
                _ => Err(format!("HTTP {status} without a JSON-RPC response").into()),
            };
        }
        let mut decoder = sse::Decoder::new(4 << 20);
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for ev in decoder.feed(data)? {
                if ev.data.trim().is_empty() {
                    continue;
                }
                self.log("host ⇐", ev.data.as_bytes());
                match jsonrpc::parse(ev.data.as_bytes())? {
                    Message::Response(r) if r.id.as_ref() == Some(&id) => return Ok(r),
                    Message::Request(live) => self.answer_live(live).await?,
                    _ => {}
                }
            }
        }
        Err("the SSE stream ended without a response".into())
    }

    async fn answer_live(&mut self, live: Request) -> Result<(), BoxError> {
        let params = live.params.clone().unwrap_or(Value::Null);
        self.live.push((live.method.clone(), params.clone()));
        let result = match live.method.as_str() {
            "elicitation/create" => {
                let first = params
                    .pointer("/requestedSchema/properties/note_id/enum/0")
                    .cloned()
                    .unwrap_or(Value::Null);
                match self.answer {
                    Answer::Accept => {
                        json!({"action": "accept", "content": {"note_id": first, "confirm": true}})
                    }
                    Answer::Decline => json!({"action": "decline"}),
                    Answer::Cancel => json!({"action": "cancel"}),
                }
            }
            "sampling/createMessage" => {
                let prompt = params
                    .pointer("/messages/0/content/text")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let text = if prompt.contains("JSON array") {
                    r#"["README.md", "src/lib.rs"]"#.to_owned()
                } else {
                    "tinyledger is a small double-entry ledger library.".to_owned()
                };
                json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "scripted-host", "stopReason": "endTurn"})
            }
            "roots/list" => json!({ "roots": self.roots }),
            "ping" => json!({}),
            other => return Err(format!("unexpected live request {other}").into()),
        };
        let reply = Message::Response(Response::result(live.id, result));
        let resp = self.post(reply.to_vec()).await?;
        if resp.status() != http::StatusCode::ACCEPTED {
            return Err(format!("reply refused with HTTP {}", resp.status()).into());
        }
        Ok(())
    }

    /// Opens the session (initialize + initialized).
    pub async fn initialize(&mut self, capabilities: Value) -> Result<Value, BoxError> {
        let r = self
            .call(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": capabilities,
                       "clientInfo": {"name": "dualera-legacy-host", "version": "1.0.0"}}),
            )
            .await?;
        let result = r
            .outcome
            .map_err(|e| format!("initialize failed: {}", e.message))?;
        let note = Message::Notification(jsonrpc::Notification {
            method: "notifications/initialized".into(),
            params: None,
        });
        let resp = self.post(note.to_vec()).await?;
        if resp.status() != http::StatusCode::ACCEPTED {
            return Err(format!("initialized refused with HTTP {}", resp.status()).into());
        }
        Ok(result)
    }

    /// Calls a tool and returns its result (JSON-RPC errors become `Err`).
    pub async fn tool(&mut self, name: &str, arguments: Value) -> Result<Value, BoxError> {
        let r = self
            .call("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        r.outcome
            .map_err(|e| format!("{name}: JSON-RPC error {}: {}", e.code.0, e.message).into())
    }

    /// Ends the session with DELETE.
    pub async fn delete(&mut self) -> Result<http::StatusCode, BoxError> {
        let Some(s) = self.session.take() else {
            return Err("no session".into());
        };
        let req = http::Request::builder()
            .method(Method::DELETE)
            .uri(&self.url)
            .header("mcp-session-id", s.as_str())
            .header("mcp-protocol-version", "2025-11-25")
            .body(Full::new(Bytes::new()))?;
        Ok(self.client.request(req).await?.status())
    }
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        println!("ok   {what}");
        Ok(())
    } else {
        Err(format!("FAILED {what}").into())
    }
}

async fn count(host: &mut LegacyHost, ws: &str, title: &str) -> Result<usize, BoxError> {
    let r = host.tool("notes_list", json!({"workspaceUri": ws})).await?;
    Ok(r.pointer("/structuredContent/notes")
        .and_then(Value::as_array)
        .map_or(0, |a| a.iter().filter(|n| n["title"] == title).count()))
}

/// The whole script. `workspace` is the notes workspace URI, `repo` the repository dir.
pub async fn run(url: &str, workspace: &str, repo: &str, verbose: bool) -> Result<(), BoxError> {
    let mut host = LegacyHost::new(url);
    host.verbose = verbose;
    let init = host
        .initialize(
            json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {"listChanged": true}}),
        )
        .await?;
    check(
        init["protocolVersion"] == "2025-11-25",
        "initialize negotiated 2025-11-25",
    )?;
    check(
        init.get("resultType").is_none(),
        "initialize result has no resultType",
    )?;
    let tools = host
        .call("tools/list", json!({}))
        .await?
        .outcome
        .map_err(|e| e.message)?;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    check(
        names
            == [
                "notes_create",
                "notes_delete",
                "notes_list",
                "summarize_repo",
            ],
        "tools/list has the four tools",
    )?;

    let title = "TPS report";
    let before = count(&mut host, workspace, title).await?;
    check(before >= 1, "there are notes to delete")?;
    for (answer, expect_gone) in [
        (Answer::Accept, 1),
        (Answer::Decline, 0),
        (Answer::Cancel, 0),
    ] {
        host.answer = answer;
        let n = count(&mut host, workspace, title).await?;
        let r = host
            .tool(
                "notes_delete",
                json!({"workspaceUri": workspace, "title": title}),
            )
            .await?;
        check(
            r["isError"] != true,
            &format!("notes_delete answered {answer:?} completes"),
        )?;
        let after = count(&mut host, workspace, title).await?;
        check(
            after == n - expect_gone,
            &format!("{answer:?}: {n} → {after} notes"),
        )?;
    }
    check(
        host.live
            .iter()
            .filter(|(m, _)| m == "elicitation/create")
            .count()
            == 3,
        "three live elicitations were asked",
    )?;

    let sampled_before = host
        .live
        .iter()
        .filter(|(m, _)| m == "sampling/createMessage")
        .count();
    let r = host
        .tool(
            "summarize_repo",
            json!({"directory": repo, "audience": "developer"}),
        )
        .await?;
    let sampled = host
        .live
        .iter()
        .filter(|(m, _)| m == "sampling/createMessage")
        .count()
        - sampled_before;
    check(sampled == 2, "summarize_repo took two live sampling rounds")?;
    check(
        r.pointer("/structuredContent/files") == Some(&json!(["README.md", "src/lib.rs"])),
        "summary names the picked files",
    )?;
    check(
        r.pointer("/structuredContent/summary")
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains("double-entry")),
        "summary carries the host model's text",
    )?;

    // Roots: the parent of the workspace selects it; nothing outside the grants appears.
    let parent = workspace
        .rsplit_once('/')
        .map_or(workspace, |(p, _)| p)
        .to_owned();
    host.roots = vec![
        json!({"uri": parent, "name": "project"}),
        json!({"uri": "file:///etc", "name": "outside"}),
    ];
    let r = host.tool("notes_list", json!({})).await?;
    check(
        host.live.iter().any(|(m, _)| m == "roots/list"),
        "notes_list without workspaceUri asked roots/list",
    )?;
    check(
        r.pointer("/structuredContent/workspaces") == Some(&json!([workspace])),
        "roots selected exactly the granted workspace",
    )?;

    let status = host.delete().await?;
    check(status.is_success(), "DELETE ended the session")?;
    println!("legacy host script: all checks passed");
    Ok(())
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, workspace, repo] = args.as_slice() else {
        eprintln!("usage: legacy_host <gateway-url> <workspace-uri> <repo-dir>");
        std::process::exit(2);
    };
    run(url, workspace, repo, true).await
}
