//! Operating the gateway, over real sockets against the spawned binary: the admin
//! listener (`/healthz`, `/readyz`, `/metrics`, `/report`, `/report.html`, its token,
//! `Host` checks), readiness following a real upstream that stops and comes back,
//! metrics and the migration report counting what real sessions did (legacy over
//! Streamable HTTP and stdio, modern pass-through), hostile `clientInfo`, the bound on
//! identities, the report's SQLite file across a restart, `dualera report`, and W3C
//! trace context reaching every upstream exchange a host request causes.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

const TOKEN: &str = "admin-token-for-tests-7c1f";
const TP1: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const TP3: &str = "00-11111111111111111111111111111111-2222222222222222-00";

/// Appends TOML to the workspace's config.
fn append(ws: &Workspace, toml: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&ws.config)
        .expect("config");
    writeln!(f, "\n{toml}").expect("append config");
}

/// `dualera gateway` for `upstream` with this workspace's config; returns it and the
/// admin URL it printed.
fn gateway(upstream: &str, ws: &Workspace) -> (Proc, String) {
    let proc = Proc::gateway(upstream, ws);
    let admin = proc.admin_url();
    (proc, admin)
}

async fn get(url: &str, headers: &[(&str, &str)]) -> RawReply {
    raw(&http_client(), Method::GET, url, headers, "").await
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn scrape(admin: &str) -> String {
    let auth = bearer();
    let r = get(&format!("{admin}/metrics"), &[("authorization", &auth)]).await;
    assert_eq!(r.status, StatusCode::OK);
    String::from_utf8(r.body.to_vec()).expect("UTF-8 metrics")
}

/// `dualera_requests_total` of legacy requests on the route `/mcp`.
fn legacy_requests(m: &str, method: &str, outcome: &str) -> f64 {
    metric(
        m,
        "dualera_requests_total",
        &[
            ("route", "/mcp"),
            ("era", "legacy"),
            ("mcp_method_name", method),
            ("outcome", outcome),
        ],
    )
}

async fn report(admin: &str) -> Value {
    let auth = bearer();
    let r = get(&format!("{admin}/report"), &[("authorization", &auth)]).await;
    assert_eq!(r.status, StatusCode::OK);
    r.json()
}

fn row<'a>(report: &'a Value, name: &str, revision: &str) -> &'a Value {
    report["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .find(|h| h["name"] == name && h["revision"] == revision)
        .unwrap_or_else(|| panic!("no host {name} {revision} in {report:#}"))
}

/// The real modern server, a recording hop, and a gateway with an admin listener
/// (token required, probes every 200 ms) and `extra` config.
async fn rig(extra: &str) -> (Workspace, Proc, Upstream, Proc, String) {
    let ws = Workspace::new(&[]);
    append(
        &ws,
        &format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = {TOKEN:?}\nprobe_interval_ms = 200\n{extra}"
        ),
    );
    let server = Proc::serve(&ws);
    let hop = Upstream::hop(&server.url).await;
    let (gw, admin) = gateway(&hop.url, &ws);
    (ws, server, hop, gw, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_token_and_guards() {
    let (_ws, _server, _hop, _gw, admin) = rig("").await;
    let ok = get(&format!("{admin}/healthz"), &[]).await;
    assert_eq!(ok.status, StatusCode::OK, "healthz needs no token");
    let mut ready = get(&format!("{admin}/readyz"), &[]).await;
    for _ in 0..300 {
        if ready.status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        ready = get(&format!("{admin}/readyz"), &[]).await;
    }
    assert_eq!(ready.status, StatusCode::OK, "{:?}", ready.body);
    assert!(String::from_utf8_lossy(&ready.body).contains("route /mcp: ready"));

    for path in ["/metrics", "/report", "/report.html"] {
        let url = format!("{admin}{path}");
        let none = get(&url, &[]).await;
        assert_eq!(
            none.status,
            StatusCode::UNAUTHORIZED,
            "{path} without token"
        );
        assert!(none
            .header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer")));
        let wrong = get(
            &url,
            &[("authorization", "Bearer admin-token-for-tests-7c1e")],
        )
        .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path} wrong token");
        let auth = bearer();
        let right = get(&url, &[("authorization", &auth)]).await;
        assert_eq!(right.status, StatusCode::OK, "{path} with the token");
    }
    let auth = bearer();
    let text = get(&format!("{admin}/metrics"), &[("authorization", &auth)]).await;
    assert!(text
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")));
    let om = get(
        &format!("{admin}/metrics"),
        &[
            ("authorization", &auth),
            ("accept", "application/openmetrics-text;version=1.0.0"),
        ],
    )
    .await;
    assert!(om
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/openmetrics-text")));
    assert!(String::from_utf8_lossy(&om.body).ends_with("# EOF\n"));
    let page = get(&format!("{admin}/report.html"), &[("authorization", &auth)]).await;
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(csp.contains("default-src 'none'"), "{csp}");

    let post = raw(
        &http_client(),
        Method::POST,
        &format!("{admin}/metrics"),
        &[],
        "",
    )
    .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    let missing = get(&format!("{admin}/nope"), &[]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&missing.body).contains("/readyz"));
    let rebinding = get(
        &format!("{admin}/healthz"),
        &[("host", "evil.example:8789")],
    )
    .await;
    assert_eq!(
        rebinding.status,
        StatusCode::FORBIDDEN,
        "DNS rebinding guard"
    );
    let origin = get(
        &format!("{admin}/healthz"),
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(origin.status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_admin_without_token_is_refused() {
    let ws = Workspace::new(&[]);
    let config = ws.config.display().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args([
            "gateway",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--config",
            &config,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "0.0.0.0:0",
        ])
        .output()
        .expect("run dualera");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("non-loopback") && err.contains("token"),
        "{err}"
    );
}

/// The upstream is a real `dualera serve`: stopped, `/readyz` turns 503 naming the
/// route; started again on the same address, 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_upstream() {
    let ws = Workspace::new(&[]);
    append(
        &ws,
        "[admin]\nlisten = \"127.0.0.1:0\"\nprobe_interval_ms = 200\n",
    );
    let config = ws.config.display().to_string();
    let server = Proc::serve(&ws);
    let addr = server.authority();
    let (_gw, admin) = gateway(&server.url, &ws);
    let readyz = format!("{admin}/readyz");
    let wait_for = |want: StatusCode| {
        let readyz = readyz.clone();
        async move {
            let deadline = std::time::Instant::now() + WAIT;
            loop {
                let r = get(&readyz, &[]).await;
                if r.status == want {
                    return String::from_utf8_lossy(&r.body).into_owned();
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "readyz stayed {} ({:?}), expected {want}",
                    r.status,
                    r.body
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let body = wait_for(StatusCode::OK).await;
    assert!(body.contains("route /mcp: ready"), "{body}");

    drop(server);
    let body = wait_for(StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(body.contains("route /mcp: not ready"), "{body}");
    assert!(body.contains("upstream unreachable"), "{body}");

    let _back = Proc::spawn(
        &["serve", "--config", &config, "--listen", &addr],
        "modern server listening on",
    );
    let body = wait_for(StatusCode::OK).await;
    assert!(body.contains("route /mcp: ready"), "{body}");
}

/// A legacy session's rounds, features and failures, counted in `/metrics` and in the
/// report (one 2025-11-25 host with every kind of round, one 2025-03-26 host with a
/// batch and no elicitation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_report_count_a_legacy_session() {
    let (ws, server, _hop, _gw, admin) = rig("").await;
    let notes = ws.notes_uri.clone();
    let url = _gw.url.clone();
    for _ in 0..2 {
        seed_note(&server.url, &ws, "Doomed", "x").await;
    }
    let mut host = Legacy::new(&url);
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let _get = host.get(None).await;
    assert_eq!(
        host.call("logging/setLevel", json!({"level": "info"}))
            .await["result"],
        json!({})
    );
    let delete =
        json!({"name": "notes_delete", "arguments": {"workspaceUri": notes, "title": "Doomed"}});
    let accepted = host.exchange("tools/call", delete.clone()).await;
    assert_ne!(
        accepted.response["result"]["isError"], true,
        "{}",
        accepted.response
    );
    let declined = host
        .exchange_with(
            "tools/call",
            delete.clone(),
            |live| json!({"jsonrpc": "2.0", "id": live["id"], "result": {"action": "decline"}}),
        )
        .await;
    assert_ne!(declined.response["result"]["isError"], true);
    let summary = host
        .exchange(
            "tools/call",
            json!({"name": "summarize_repo", "arguments": {"directory": ws.repo.display().to_string(), "audience": "developer"}}),
        )
        .await;
    assert_eq!(summary.live.len(), 2, "two sampling rounds");
    let roots = host
        .exchange("tools/call", json!({"name": "notes_list", "arguments": {}}))
        .await;
    assert_eq!(roots.live.len(), 1, "one roots/list");
    host.call("tools/list", json!({})).await;

    // A 2025-03-26 host without elicitation: a batch, and a capability gap.
    let mut old = Legacy::new(&url);
    old.open("2025-03-26", json!({"sampling": {}})).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": "b1", "method": "ping"},
        {"jsonrpc": "2.0", "id": "b2", "method": "tools/list"}
    ]);
    old.expect_response(&json!("b1"), "ping");
    old.expect_response(&json!("b2"), "tools/list");
    let b = old.post(&batch).await;
    assert_eq!(b.status, StatusCode::OK);
    let gap = old.call("tools/call", delete.clone()).await;
    assert!(
        gap.get("error").is_some() || gap["result"]["isError"] == true,
        "{gap}"
    );

    // A request is counted when the driver performs the machine's `Observed` event,
    // which follows the response it sent: the host can have its answer a moment
    // before the count moves. Wait (bounded) for the last requests to be counted.
    let mut m = scrape(&admin).await;
    for _ in 0..100 {
        if legacy_requests(&m, "tools/list", "ok") >= 2.0
            && legacy_requests(&m, "tools/call", "failed") >= 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        m = scrape(&admin).await;
    }
    let live = |kind: &str, outcome: &str| {
        metric(
            &m,
            "dualera_live_requests_total",
            &[("kind", kind), ("outcome", outcome)],
        )
    };
    assert_eq!(live("elicitation_form", "accept"), 1.0, "{m}");
    assert_eq!(live("elicitation_form", "decline"), 1.0);
    assert_eq!(live("sampling", "accept"), 2.0);
    assert_eq!(live("roots", "accept"), 1.0);
    let req = |method: &str, outcome: &str| legacy_requests(&m, method, outcome);
    assert_eq!(req("tools/call", "ok"), 4.0);
    assert_eq!(req("initialize", "ok"), 2.0);
    assert_eq!(req("logging/setLevel", "ok"), 1.0);
    assert_eq!(req("ping", "ok"), 1.0);
    assert_eq!(req("tools/list", "ok"), 2.0, "{m}");
    assert_eq!(req("tools/call", "failed"), 1.0, "the capability gap");
    assert_eq!(
        metric(
            &m,
            "dualera_request_failures_total",
            &[("reason", "missing_capability")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "dualera_sessions_open",
            &[
                ("mcp_protocol_version", "2025-11-25"),
                ("wire", "streamable-http")
            ]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "dualera_request_rounds_count",
            &[("mcp_method_name", "tools/call")]
        ),
        5.0
    );
    assert_eq!(
        metric(
            &m,
            "dualera_request_rounds_sum",
            &[("mcp_method_name", "tools/call")]
        ),
        5.0,
        "1 + 1 + 2 + 1 rounds, and 0 for the gap's request"
    );
    assert!(
        metric(
            &m,
            "mcp_server_operation_duration_seconds_count",
            &[("era", "legacy"), ("mcp_method_name", "tools/call")]
        ) >= 5.0
    );
    assert_eq!(
        metric(&m, "dualera_connections_open", &[("listener", "admin")]),
        1.0
    );
    assert!(metric(&m, "dualera_connections_open", &[("listener", "gateway")]) >= 1.0);
    assert_eq!(
        metric(&m, "dualera_upstream_ready", &[("route", "/mcp")]),
        1.0
    );
    assert!(
        m.contains("dualera_cache_hits_total{route=\"/mcp\"} 0"),
        "cache counters exposed"
    );

    let r = report(&admin).await;
    let h = row(&r, "legacy-acceptance-host", "2025-11-25");
    assert_eq!(h["version"], "2.0.0");
    assert_eq!(h["wire"], "streamable-http");
    assert_eq!(h["era"], "legacy");
    assert_eq!(h["sessions"], 1);
    assert_eq!(
        h["features"],
        json!({"elicitation_form": 2, "sampling": 2, "roots": 1, "logging_set_level": 1, "get_stream": 1})
    );
    assert_eq!(
        h["live"]["elicitation_form"],
        json!({"accept": 1, "decline": 1})
    );
    assert_eq!(h["requests"]["tools/call"], 4);
    assert_eq!(h["requests"]["initialize"], 1);
    let verdict = h["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(
            "answers form elicitation, sampling and roots/list live: needs an MRTR-capable client"
        ),
        "{verdict}"
    );
    assert!(
        verdict.contains("logLevel") && verdict.contains("subscriptions/listen"),
        "{verdict}"
    );
    let o = row(&r, "legacy-acceptance-host", "2025-03-26");
    assert_eq!(o["features"]["batch"], 1);
    assert_eq!(o["failures"], json!({"missing_capability": 1}));
    assert!(o["verdict"].as_str().unwrap().contains("batches"), "{o}");

    assert_eq!(host.delete().await, StatusCode::OK);
    let m = scrape(&admin).await;
    assert_eq!(
        metric(
            &m,
            "dualera_sessions_open",
            &[("mcp_protocol_version", "2025-11-25")]
        ),
        0.0
    );
    assert_eq!(
        metric(
            &m,
            "mcp_server_session_duration_seconds_count",
            &[("mcp_protocol_version", "2025-11-25")]
        ),
        1.0
    );
}

/// One client connection, kept open across requests.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    url: String,
}

impl Connection {
    async fn open(url: &str) -> Self {
        let authority = url.trim_start_matches("http://").trim_end_matches("/mcp");
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .expect("connect");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        Self {
            sender,
            url: url.to_owned(),
        }
    }

    /// POSTs a modern request on this connection; its status (the body is read).
    async fn post(&mut self, body: &Value) -> StatusCode {
        use http_body_util::BodyExt;
        let mut b = http::Request::post(&self.url);
        for (k, v) in modern_headers(body) {
            b = b.header(k, v);
        }
        let req = b
            .body(http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(body).unwrap(),
            )))
            .unwrap();
        self.sender.ready().await.expect("the connection is open");
        let resp = self
            .sender
            .send_request(req)
            .await
            .expect("the gateway answers");
        let status = resp.status();
        resp.into_body().collect().await.expect("the body");
        status
    }
}

/// Modern clients: named by the `clientInfo` of the bodies the gateway reads anyway
/// (`server/discover`, cacheable methods), later requests on the same connection
/// counted for them, requests on a connection that never named its client counted
/// for an unidentified one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_clients_are_named_per_connection() {
    for cache in ["false", "true"] {
        let ws = Workspace::with_cache(&[], &[("enabled", cache)]);
        append(
            &ws,
            &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = {TOKEN:?}\n"),
        );
        let server = Proc::serve(&ws);
        let (gw, admin) = gateway(&server.url, &ws);
        // One HTTP/1.1 connection for all of this client's requests.
        let mut one = Connection::open(&gw.url).await;
        let named = |id: i64, method: &str, params: Value| {
            let mut body = modern_request(json!(id), method, params, json!({}));
            body["params"]["_meta"][CLIENT_INFO] =
                json!({"name": "modern-acceptance", "version": "3.1"});
            body
        };
        let first = if cache == "true" {
            "tools/list"
        } else {
            "server/discover"
        };
        assert_eq!(one.post(&named(1, first, json!({}))).await, StatusCode::OK);
        for id in 2..4 {
            let call = named(
                id,
                "tools/call",
                json!({"name": "notes_list", "arguments": {"workspaceUri": ws.notes_uri}}),
            );
            assert_eq!(one.post(&call).await, StatusCode::OK);
        }
        // A fresh connection that never names itself.
        let anonymous = modern_request(
            json!(9),
            "tools/call",
            json!({"name": "notes_list", "arguments": {"workspaceUri": ws.notes_uri}}),
            json!({}),
        );
        assert_eq!(
            modern_post(&http_client(), &gw.url, &anonymous)
                .await
                .status,
            StatusCode::OK
        );

        let r = report(&admin).await;
        let h = row(&r, "modern-acceptance", "2026-07-28");
        assert_eq!(h["era"], "modern");
        assert_eq!(h["version"], "3.1");
        assert_eq!(h["verdict"], "already modern");
        assert_eq!(h["features"], json!({}));
        assert_eq!(h["requests"][first], 1, "cache {cache}: {h}");
        assert_eq!(h["requests"]["tools/call"], 2, "cache {cache}: {h}");
        let u = row(&r, "(no clientInfo)", "2026-07-28");
        assert_eq!(u["requests"]["tools/call"], 1, "{u}");
        let m = scrape(&admin).await;
        assert_eq!(
            metric(
                &m,
                "dualera_requests_total",
                &[
                    ("era", "modern"),
                    ("mcp_method_name", "tools/call"),
                    ("outcome", "ok")
                ]
            ),
            3.0
        );
        assert_eq!(
            metric(
                &m,
                "mcp_server_operation_duration_seconds_count",
                &[("era", "modern")]
            ),
            4.0
        );
    }
}

/// `clientInfo` is the host's to choose: what the report keeps is bounded and
/// stripped, what it renders is escaped, and identities beyond `[report] max_hosts`
/// fold into one overflow row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_client_info_is_bounded_escaped_and_folded() {
    let (_ws, _server, _hop, gw, admin) = rig("[report]\nmax_hosts = 4\n").await;
    let long = "y".repeat(10_000);
    let names = [
        json!("<script>alert(1)</script>"),
        json!({"not": "a string"}),
        json!(long),
        json!(format!("ev\u{202e}il\u{1b}[2J\u{0}name")),
        json!("fifth"),
        json!("sixth"),
    ];
    for (i, name) in names.iter().enumerate() {
        let host = Legacy::new(&gw.url);
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": name, "version": format!("1.{i}\"><b>")},
        }});
        host.expect_response(&json!(1), "initialize");
        let r = host.post(&msg).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let r = report(&admin).await;
    let hosts = r["hosts"].as_array().unwrap();
    assert_eq!(
        hosts.len(),
        5,
        "four identities and the overflow row: {r:#}"
    );
    assert_eq!(r["folded"], 2);
    for h in hosts {
        let name = h["name"].as_str().unwrap();
        assert!(name.chars().count() <= 64, "{name}");
        assert!(
            !name.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{name:?}"
        );
    }
    assert!(hosts.iter().any(|h| h["name"] == "evil[2Jname"), "{r:#}");
    assert!(
        hosts.iter().any(|h| h["name"] == "(no clientInfo)"),
        "{r:#}"
    );
    let overflow = hosts
        .iter()
        .find(|h| h["name"].as_str().unwrap().starts_with("(other hosts"))
        .expect("the overflow row");
    assert_eq!(overflow["sessions"], 2);

    let auth = bearer();
    let page = get(&format!("{admin}/report.html"), &[("authorization", &auth)]).await;
    let page = String::from_utf8(page.body.to_vec()).unwrap();
    assert!(!page.contains("<script>alert"), "unescaped name");
    assert!(!page.contains("1.0\"><b>"), "unescaped version");
    assert!(page.contains("1.0&quot;&gt;&lt;b&gt;"), "escaped version");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let m = scrape(&admin).await;
    assert_eq!(metric(&m, "dualera_report_hosts", &[]), 5.0);
    assert_eq!(metric(&m, "dualera_report_folded_total", &[]), 2.0);
}

/// `[report] path`: the report is written to SQLite while the gateway runs and when it
/// stops, and loaded again when it starts, counts intact; a stdio session (the pipe
/// driver) is recorded with its wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_survives_a_restart() {
    let (ws, server, hop, mut gw, admin) = rig("[report]\npath = \"report.db\"\n").await;
    let mut host = Legacy::new(&gw.url);
    host.open("2025-06-18", full_caps("2025-06-18")).await;
    host.exchange(
        "tools/call",
        json!({"name": "summarize_repo", "arguments": {"directory": ws.repo.display().to_string(), "audience": "developer"}}),
    )
    .await;
    assert!(gw.terminate(), "the gateway stops on SIGTERM");
    drop(gw);
    let _ = admin;

    // A stdio session, with the same report file, ending at EOF.
    let config = ws.config.display().to_string();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args([
            "gateway",
            "--stdio",
            "--upstream",
            &hop.url,
            "--config",
            &config,
        ])
        .env("DUALERA_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the stdio gateway");
    {
        use std::io::{BufRead, BufReader};
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "stdio-host", "version": "0.9"}}})
        )
        .unwrap();
        tokio::task::block_in_place(|| stdout.read_line(&mut line)).unwrap();
        assert!(line.contains("\"result\""), "{line}");
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        .unwrap();
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        )
        .unwrap();
        line.clear();
        tokio::task::block_in_place(|| stdout.read_line(&mut line)).unwrap();
        assert!(line.contains("notes_delete"), "{line}");
        drop(stdin);
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        assert!(status.success());
    }

    let (gw2, admin2) = gateway(&hop.url, &ws);
    let r = report(&admin2).await;
    let h = row(&r, "legacy-acceptance-host", "2025-06-18");
    assert_eq!(h["sessions"], 1);
    assert_eq!(h["features"]["sampling"], 2, "{h}");
    assert_eq!(h["live"]["sampling"]["accept"], 2);
    let s = row(&r, "stdio-host", "2025-11-25");
    assert_eq!(s["wire"], "stdio");
    assert_eq!(s["requests"]["tools/list"], 1);
    // Counting goes on from the stored counts.
    let mut again = Legacy::new(&gw2.url);
    again.open("2025-06-18", full_caps("2025-06-18")).await;
    let r = report(&admin2).await;
    assert_eq!(
        row(&r, "legacy-acceptance-host", "2025-06-18")["sessions"],
        2
    );
    drop(server);
}

/// `dualera report` prints the report of a running gateway as a table, or its JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_command_prints_a_table() {
    let (ws, _server, _hop, gw, admin) = rig("").await;
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    host.exchange(
        "tools/call",
        json!({"name": "summarize_repo", "arguments": {"directory": ws.repo.display().to_string(), "audience": "developer"}}),
    )
    .await;
    let run = |args: &[&str], token: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_dualera"));
        c.arg("report").args(args).env_remove("DUALERA_ADMIN_TOKEN");
        if let Some(t) = token {
            c.env("DUALERA_ADMIN_TOKEN", t);
        }
        c.output().expect("run dualera report")
    };
    let out = run(&["--admin", &admin], Some(TOKEN));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let header = table.lines().nth(1).unwrap_or_default();
    for col in [
        "HOST", "VERSION", "REVISION", "WIRE", "SESSIONS", "REQUESTS", "VERDICT",
    ] {
        assert!(header.contains(col), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with("legacy-acceptance-host"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("2025-11-25") && row.contains("streamable-http"),
        "{row}"
    );
    assert!(table.contains("live sampling 2 (2 accept)"), "{table}");
    assert!(
        table.contains("needs:    answers sampling live: needs an MRTR-capable client"),
        "{table}"
    );
    let out = run(&["--admin", &admin, "--json"], Some(TOKEN));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["hosts"][0]["name"], "legacy-acceptance-host");
    let out = run(&["--admin", &admin], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

/// `traceparent` / `tracestate` of a host request reach every upstream exchange it
/// causes: the discover of an `initialize`, both attempts of an MRTR request (the
/// retry too, though the host's answer came on a POST with another trace), a request
/// whose trace is only in its `_meta`; pass-through keeps them; malformed ones are
/// not forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_reaches_every_upstream_exchange() {
    let (ws, server, hop, gw, _admin) = rig("").await;
    seed_note(&server.url, &ws, "Traced", "x").await;
    let mut host = Legacy::new(&gw.url);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": full_caps("2025-11-25"),
        "clientInfo": {"name": "traced", "version": "1"}}});
    host.expect_response(&json!(0), "initialize");
    let r = host
        .send(Method::POST, Some(&init), &[("traceparent", TP1)])
        .await;
    host.session = r
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    host.version = Some("2025-11-25".into());
    // The session's discover (the readiness probe sends its own, anonymous and untraced).
    let discover = eventually(WAIT, "the session's discover", || {
        hop.seen_method("server/discover")
            .into_iter()
            .find(|s| s.meta()[CLIENT_INFO]["name"] == "traced")
    })
    .await;
    assert_eq!(discover.headers.get("traceparent").unwrap(), TP1);
    assert!(hop
        .seen_method("server/discover")
        .iter()
        .filter(|s| s.meta()[CLIENT_INFO]["name"] == "dualera-readiness")
        .all(|s| s.headers.get("traceparent").is_none()));

    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "notes_delete", "arguments": {"workspaceUri": ws.notes_uri, "title": "Traced"}}});
    host.expect_response(&json!(1), "tools/call");
    let reply = host
        .send(
            Method::POST,
            Some(&call),
            &[("traceparent", TP2), ("tracestate", "vendor=abc")],
        )
        .await;
    let mut sse = reply.sse();
    let live = sse.next_message().await.expect("the elicitation");
    assert_eq!(live["method"], "elicitation/create");
    let answer = default_answer(&live);
    let a = host
        .send(Method::POST, Some(&answer), &[("traceparent", TP3)])
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    let done = sse.next_message().await.expect("the response");
    assert_ne!(done["result"]["isError"], true, "{done}");
    let attempts = hop.seen_method("tools/call");
    assert_eq!(attempts.len(), 2);
    for s in &attempts {
        assert_eq!(
            s.headers.get("traceparent").unwrap(),
            TP2,
            "{:?}",
            s.headers
        );
        assert_eq!(s.headers.get("tracestate").unwrap(), "vendor=abc");
        // The same exchange carries the forwarded headers of the session's host.
        assert_eq!(s.headers.get("x-forwarded-for").unwrap(), "127.0.0.1");
        assert_eq!(s.headers.get("x-forwarded-proto").unwrap(), "http");
    }

    // Only in `_meta`: also sent as the header.
    let in_meta = json!({"name": "notes_list", "arguments": {"workspaceUri": ws.notes_uri},
                         "_meta": {"traceparent": TP3}});
    host.call("tools/call", in_meta).await;
    let last = hop.seen_method("tools/call").pop().unwrap();
    assert_eq!(last.headers.get("traceparent").unwrap(), TP3);
    assert_eq!(last.meta()["traceparent"], TP3, "and kept in _meta");

    // Malformed: not forwarded.
    let bad = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"});
    host.expect_response(&json!(7), "tools/list");
    host.send(Method::POST, Some(&bad), &[("traceparent", "00-zz-yy-01")])
        .await;
    let list = hop.seen_method("tools/list").pop().unwrap();
    assert!(list.headers.get("traceparent").is_none());

    // Pass-through keeps the host's headers as they are.
    let body = modern_request(json!(1), "tools/list", json!({}), json!({}));
    let mut h = modern_headers(&body);
    h.push(("traceparent".into(), TP1.into()));
    let refs: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let r = raw(
        &http_client(),
        Method::POST,
        &gw.url,
        &refs,
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = hop.seen_method("tools/list").pop().unwrap();
    assert_eq!(seen.headers.get("traceparent").unwrap(), TP1);
}

/// Polls `/metrics` until the gateway listener's open-connections gauge is `want`.
async fn gateway_connections(admin: &str, want: f64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let m = scrape(admin).await;
        let open = metric(&m, "dualera_connections_open", &[("listener", "gateway")]);
        if open == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gateway connections open: {open}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The open-connections gauge is the shared listener's connection hook: a
/// connection counts from its acceptance until it closes, a WebSocket until the
/// WebSocket closes (not when its HTTP upgrade ends), and none is left counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_gauge_follows_the_listener() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let (_ws, _server, _hop, gw, admin) = rig("").await;
    gateway_connections(&admin, 0.0).await;

    let ws_url = gw.url.replace("http://", "ws://").replace("/mcp", "/ws");
    let authority = gw
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp");
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect");
    let req = ws_url.as_str().into_client_request().expect("ws request");
    let (mut socket, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("ws handshake");
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "gauge", "version": "1"}}});
    socket
        .send(Ws::text(init.to_string()))
        .await
        .expect("send initialize");
    let answered = tokio::time::timeout(WAIT, async {
        while let Some(Ok(frame)) = socket.next().await {
            if let Ws::Text(t) = frame {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
                if v["id"] == 0 {
                    return v;
                }
            }
        }
        panic!("the WebSocket closed before initialize was answered");
    })
    .await
    .expect("initialize answered");
    assert!(answered["result"].is_object(), "{answered}");
    // The upgrade is long over: the WebSocket still counts.
    gateway_connections(&admin, 1.0).await;

    let mut keep_alive = Connection::open(&gw.url).await;
    let body = modern_request(json!(1), "tools/list", json!({}), json!({}));
    assert_eq!(keep_alive.post(&body).await, StatusCode::OK);
    gateway_connections(&admin, 2.0).await;

    socket.close(None).await.expect("close the WebSocket");
    drop(socket);
    gateway_connections(&admin, 1.0).await;
    drop(keep_alive);
    gateway_connections(&admin, 0.0).await;
}
