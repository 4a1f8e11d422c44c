//! Routes: two modern servers behind one gateway, on `/a/mcp` and `/b/mcp`
//! (`[[gateway.routes]]`), over real sockets. `/a/mcp` is a server on dualera's server
//! framework offering one tool (`alpha_echo`), run in this process; `/b/mcp` is the real
//! `dualera serve` (the notes tools). Legacy hosts (Streamable HTTP, WebSocket,
//! HTTP+SSE) and modern hosts see only their route's tools; sessions do not cross
//! routes; with the cache on, a route's cached lists answer only that route; unknown
//! paths get a 404 naming the routes; each route relays its own
//! Protected Resource Metadata path; metrics carry the real route; `/readyz` names the
//! route whose upstream is gone.

mod common;
use common::gateway as gateway_support;

use dualera::config::Config;
use dualera::server::catalog::Catalog;
use dualera::server::error::ServerError;
use dualera::server::tools::{CallContext, Outcome, Tool, ToolRegistry};
use dualera::server::Server;
use dualera::sse;
use futures_util::{SinkExt, StreamExt};
use gateway_support::*;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// The one tool of the `/a/mcp` server.
#[derive(Debug)]
struct AlphaEcho;

impl Tool for AlphaEcho {
    fn name(&self) -> &'static str {
        "alpha_echo"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "alpha_echo",
            "description": "Echoes its text back.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        })
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        let text = cx.string_arg("text", 1024)?;
        Ok(Outcome::Complete(
            json!({"content": [{"type": "text", "text": format!("alpha: {text}")}]}),
        ))
    }
}

/// The `/a/mcp` server, serving until the returned sender is dropped.
async fn alpha_server() -> (String, tokio::sync::oneshot::Sender<()>) {
    let mut tools = ToolRegistry::new();
    tools.add(Box::new(AlphaEcho));
    let (server, _) = Server::with_catalog(
        &Config::default(),
        Catalog::with_tools("alpha-server", tools),
    )
    .expect("the alpha server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(dualera::server::http::serve(listener, server, async move {
        let _ = stopped.await;
    }));
    (url, stop)
}

/// The gateway with routes `/a/mcp` → `a` and `/b/mcp` → `b`, and an admin listener
/// probing every 200 ms. Returns it and the admin URL.
fn gateway(ws: &Workspace, a: &str, b: &str) -> (Proc, String) {
    let mut text = std::fs::read_to_string(&ws.config).expect("config");
    text.push_str(&format!(
        "\n[admin]\nprobe_interval_ms = 200\n\n\
         [[gateway.routes]]\npath = \"/a/mcp\"\nupstream = {a:?}\n\n\
         [[gateway.routes]]\npath = \"/b/mcp\"\nupstream = [{b:?}]\nmax_sessions = 50\n"
    ));
    std::fs::write(&ws.config, text).expect("config");
    let config = ws.config.display().to_string();
    let gw = Proc::spawn(
        &[
            "gateway",
            "--config",
            &config,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
        "gateway listening on",
    );
    let admin = gw.admin_url();
    (gw, admin)
}

/// `http://127.0.0.1:port` of a URL.
fn origin(url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    format!("http://{}", rest.split('/').next().unwrap_or_default())
}

fn names(tools: &Value) -> BTreeSet<String> {
    tools["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {tools}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

const NOTES_TOOLS: [&str; 4] = [
    "notes_create",
    "notes_delete",
    "notes_list",
    "summarize_repo",
];

/// A legacy session over WebSocket at `url`: initialize, then `tools/list`.
async fn websocket_tools(url: &str) -> Value {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let req = url.into_client_request().expect("ws request");
    let host = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("WebSocket handshake");
    let mut ask = async |msg: Value| -> Option<Value> {
        ws.send(Ws::Text(msg.to_string().into()))
            .await
            .expect("send");
        msg.get("id")?;
        loop {
            let frame = tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("an answer in time")
                .expect("the socket stayed open")
                .expect("a frame");
            if let Ws::Text(t) = frame {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
                if v.get("id") == msg.get("id") {
                    return Some(v);
                }
            }
        }
    };
    let init = ask(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "routes-ws", "version": "1"}}}),
    )
    .await
    .expect("initialize answered");
    assert!(init.get("result").is_some(), "{init}");
    ask(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await
        .expect("tools/list answered")["result"]
        .clone()
}

/// The events of an SSE body, decoded as they arrive.
struct Events {
    body: hyper::body::Incoming,
    decoder: sse::Decoder,
    ready: std::collections::VecDeque<sse::Event>,
}

impl Events {
    async fn next(&mut self) -> sse::Event {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return e;
            }
            let frame = tokio::time::timeout(WAIT, self.body.frame())
                .await
                .expect("an event in time")
                .expect("the stream stayed open")
                .expect("a frame");
            if let Some(d) = frame.data_ref() {
                self.ready.extend(self.decoder.feed(d).expect("valid SSE"));
            }
        }
    }

    /// The next JSON-RPC message on the stream.
    async fn message(&mut self) -> Value {
        loop {
            let e = self.next().await;
            if !e.data.trim().is_empty() && e.event != "endpoint" {
                return serde_json::from_str(&e.data).expect("JSON data");
            }
        }
    }
}

/// A 2024-11-05 HTTP+SSE session at `sse_url`: the endpoint it names, and the
/// `tools/list` result read from the stream.
async fn http_sse_tools(sse_url: &str) -> (String, Value) {
    let client = http_client();
    let req = http::Request::get(sse_url)
        .header("accept", "text/event-stream")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = client.request(req).await.expect("GET …/sse");
    assert_eq!(resp.status(), 200);
    let mut events = Events {
        body: resp.into_body(),
        decoder: sse::Decoder::new(1 << 20),
        ready: Default::default(),
    };
    let endpoint = loop {
        let e = events.next().await;
        if e.event == "endpoint" {
            break e.data;
        }
    };
    let post = format!("{}{endpoint}", origin(sse_url));
    let send = |msg: Value| {
        let client = client.clone();
        let post = post.clone();
        async move {
            let r = raw(
                &client,
                Method::POST,
                &post,
                &[("content-type", "application/json")],
                serde_json::to_vec(&msg).unwrap(),
            )
            .await;
            assert_eq!(r.status, 202, "{:?}", r.body);
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {},
        "clientInfo": {"name": "routes-sse", "version": "1"}}}),
    )
    .await;
    let init = events.message().await;
    assert!(init.get("result").is_some(), "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let list = events.message().await;
    (endpoint, list["result"].clone())
}

/// An HTTP server answering every GET with `{"server": <name>, "path": <path asked>}`
/// (a stand-in upstream for the metadata relay), and `server/discover` on POST.
struct MetadataUpstream {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl MetadataUpstream {
    async fn start(name: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| async move {
                        let body = json!({"server": name, "path": req.uri().path()});
                        let mut r = http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body.to_string()),
                        ));
                        r.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, std::convert::Infallible>(r)
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { url, task }
    }
}

impl Drop for MetadataUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_serves_its_own_upstream_on_every_wire() {
    let ws = Workspace::new(&[]);
    let (alpha, _alpha_stop) = alpha_server().await;
    let notes = Proc::serve(&ws);
    let (gw, _admin) = gateway(&ws, &alpha, &notes.url);
    let base = origin(&gw.url);
    let (a, b) = (format!("{base}/a/mcp"), format!("{base}/b/mcp"));

    // Streamable HTTP, legacy sessions.
    let mut host_a = Legacy::new(&a);
    let init_a = host_a.open("2025-11-25", json!({})).await;
    assert_eq!(init_a["serverInfo"]["name"], "alpha-server");
    let mut host_b = Legacy::new(&b);
    let init_b = host_b.open("2025-11-25", json!({})).await;
    assert_eq!(init_b["serverInfo"]["name"], "dualera-notes");
    let tools_a = host_a.call("tools/list", json!({})).await;
    let tools_b = host_b.call("tools/list", json!({})).await;
    assert_eq!(names(&tools_a["result"]), set(&["alpha_echo"]));
    assert_eq!(names(&tools_b["result"]), set(&NOTES_TOOLS));
    let echoed = host_a
        .call(
            "tools/call",
            json!({"name": "alpha_echo", "arguments": {"text": "hi"}}),
        )
        .await;
    assert_eq!(echoed["result"]["content"][0]["text"], "alpha: hi");
    // A route's tools are not the other's.
    let wrong = host_b
        .call(
            "tools/call",
            json!({"name": "alpha_echo", "arguments": {"text": "hi"}}),
        )
        .await;
    let message = wrong
        .pointer("/error/message")
        .or_else(|| wrong.pointer("/result/content/0/text"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(message.contains("alpha_echo"), "{wrong}");
    // Sessions belong to their route.
    let mut stray = Legacy::new(&b);
    stray.session = host_a.session.clone();
    stray.version = Some("2025-11-25".into());
    let r = stray
        .send(
            Method::POST,
            Some(&json!({"jsonrpc": "2.0", "id": 9, "method": "ping"})),
            &[],
        )
        .await;
    assert_eq!(r.status, 404, "a session of /a/mcp was found on /b/mcp");

    // Modern pass-through.
    let client = http_client();
    let list = modern_request(json!(1), "tools/list", json!({}), json!({}));
    let ra = modern_post(&client, &a, &list).await;
    let rb = modern_post(&client, &b, &list).await;
    assert_eq!(names(&ra.json()["result"]), set(&["alpha_echo"]));
    assert_eq!(names(&rb.json()["result"]), set(&NOTES_TOOLS));

    // WebSocket on each route, and the /mcp-route-only path is unknown here.
    let ws_base = base.replacen("http://", "ws://", 1);
    assert_eq!(
        names(&websocket_tools(&format!("{ws_base}/a/mcp/ws")).await),
        set(&["alpha_echo"])
    );
    assert_eq!(
        names(&websocket_tools(&format!("{ws_base}/b/mcp/ws")).await),
        set(&NOTES_TOOLS)
    );

    // HTTP+SSE on /b/mcp: the endpoint event names the route's messages path.
    let (endpoint, sse_tools) = http_sse_tools(&format!("{b}/sse")).await;
    assert!(
        endpoint.starts_with("/b/mcp/messages?sessionId="),
        "{endpoint}"
    );
    assert_eq!(names(&sse_tools), set(&NOTES_TOOLS));

    // Unknown paths: a 404 naming the routes.
    for path in ["/mcp", "/sse", "/ws", "/c/mcp", "/a/mcp/other"] {
        let r = raw(
            &client,
            Method::POST,
            &format!("{base}{path}"),
            &[("content-type", "application/json")],
            "{}",
        )
        .await;
        assert_eq!(r.status, 404, "{path}");
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            text.contains("/a/mcp") && text.contains("/b/mcp"),
            "{path}: {text}"
        );
    }
    drop(gw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_route_and_readyz_names_the_failing_one() {
    let ws = Workspace::new(&[]);
    let (alpha, _alpha_stop) = alpha_server().await;
    let notes = Proc::serve(&ws);
    let (gw, admin) = gateway(&ws, &alpha, &notes.url);
    let base = origin(&gw.url);
    let client = http_client();
    for route in ["/a/mcp", "/b/mcp", "/b/mcp"] {
        let list = modern_request(json!(1), "tools/list", json!({}), json!({}));
        let r = modern_post(&client, &format!("{base}{route}"), &list).await;
        assert_eq!(r.status, 200);
    }
    let mut host = Legacy::new(&format!("{base}/b/mcp"));
    host.open("2025-11-25", json!({})).await;

    let ready = |expect: u16| {
        let client = client.clone();
        let admin = admin.clone();
        async move {
            let mut last = String::new();
            for _ in 0..200 {
                let r = raw(&client, Method::GET, &format!("{admin}/readyz"), &[], "").await;
                last = String::from_utf8_lossy(&r.body).into_owned();
                if r.status == expect {
                    return last;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("/readyz never answered {expect}: {last}");
        }
    };
    let text = ready(200).await;
    assert!(
        text.contains("route /a/mcp: ready") && text.contains("route /b/mcp: ready"),
        "{text}"
    );

    let r = raw(&client, Method::GET, &format!("{admin}/metrics"), &[], "").await;
    let metrics = String::from_utf8_lossy(&r.body).into_owned();
    let sample = |route: &str, era: &str, method: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("dualera_requests_total{"))
            .filter(|l| {
                l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("era=\"{era}\""))
                    && l.contains(&format!("mcp_method_name=\"{method}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(sample("/a/mcp", "modern", "tools/list"), 1.0, "{metrics}");
    assert_eq!(sample("/b/mcp", "modern", "tools/list"), 2.0, "{metrics}");
    assert_eq!(sample("/b/mcp", "legacy", "initialize"), 1.0, "{metrics}");
    assert_eq!(sample("/mcp", "modern", "tools/list"), 0.0, "{metrics}");
    // One family per metric, each route a sample of it.
    assert_eq!(
        metrics
            .lines()
            .filter(|l| *l == "# TYPE dualera_cache_hits_total counter")
            .count(),
        1,
        "{metrics}"
    );

    // /b/mcp's upstream goes away: /readyz names it, and only it.
    drop(notes);
    let text = ready(503).await;
    assert!(text.contains("route /b/mcp: not ready"), "{text}");
    assert!(text.contains("route /a/mcp: ready"), "{text}");
    drop(gw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_relays_its_own_protected_resource_metadata() {
    let ws = Workspace::new(&[]);
    // Scripted upstreams do not serve GETs: these two answer the metadata path with
    // their own name, so which upstream a relay reached is plain.
    let a = MetadataUpstream::start("alpha").await;
    let b = MetadataUpstream::start("beta").await;
    let (gw, _admin) = gateway(&ws, &a.url, &b.url);
    let base = origin(&gw.url);
    let client = http_client();
    for (route, name) in [("/a/mcp", "alpha"), ("/b/mcp", "beta")] {
        let r = raw(
            &client,
            Method::GET,
            &format!("{base}/.well-known/oauth-protected-resource{route}"),
            &[],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{route}");
        let doc = r.json();
        assert_eq!(doc["server"], name, "{route}: {doc}");
        // The relay asks for the upstream's own endpoint path.
        assert_eq!(
            doc["path"], "/.well-known/oauth-protected-resource/mcp",
            "{doc}"
        );
    }
    // Without a /mcp route the root document belongs to no route.
    let r = raw(
        &client,
        Method::GET,
        &format!("{base}/.well-known/oauth-protected-resource"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 404);
    drop(gw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_has_its_own_cache() {
    // The cache on (its defaults): a route's cached lists never answer another route.
    let ws = Workspace::with_cache(&[], &[]);
    let (alpha, _alpha_stop) = alpha_server().await;
    let notes = Proc::serve(&ws);
    let (gw, admin) = gateway(&ws, &alpha, &notes.url);
    let base = origin(&gw.url);
    let client = http_client();
    for _ in 0..3 {
        for (route, tools) in [
            ("/a/mcp", set(&["alpha_echo"])),
            ("/b/mcp", set(&NOTES_TOOLS)),
        ] {
            let list = modern_request(json!(1), "tools/list", json!({}), json!({}));
            let r = modern_post(&client, &format!("{base}{route}"), &list).await;
            assert_eq!(names(&r.json()["result"]), tools, "{route}");
            let mut host = Legacy::new(&format!("{base}{route}"));
            host.open("2025-11-25", json!({})).await;
            let legacy = host.call("tools/list", json!({})).await;
            assert_eq!(names(&legacy["result"]), tools, "{route} (legacy)");
        }
    }
    let r = raw(&client, Method::GET, &format!("{admin}/metrics"), &[], "").await;
    let metrics = String::from_utf8_lossy(&r.body).into_owned();
    let hits = |route: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("dualera_cache_hits_total{{route=\"{route}\"}}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // Both routes were served from their caches (the first list of each was a miss).
    assert!(hits("/a/mcp") >= 1.0 && hits("/b/mcp") >= 1.0, "{metrics}");
    drop(gw);
}
