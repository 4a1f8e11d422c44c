//! HTTPS upstreams and TLS listeners beyond the acceptance matrix (which
//! `gateway_tls.rs` runs over TLS on both hops):
//!
//! - HTTP/2 to the upstream: one TCP connection carries many concurrent requests, and
//!   a host's cancellation resets exactly that request's stream;
//! - refusals: an upstream certificate from an unknown CA, for another name, or
//!   expired is refused with its cause named in the gateway log, to the legacy host
//!   (`-32603`, `data.reason`) and to a modern host (502), and nothing but the TLS
//!   handshake ever reaches the upstream;
//! - a listener's certificate re-read on SIGHUP while an established connection
//!   keeps working; a bad file keeps the old certificate;
//! - forwarded headers (`X-Forwarded-*` and RFC 7239 `Forwarded`) on both paths;
//! - the warning for a non-loopback listener without TLS; `dualera up --tls`.
//!
//! Certificates come from a private CA made at test time with rcgen.

mod common;
use common::gateway as gateway_support;

use dualera::tls::{ThrowawayCa, Validity};
use gateway_support::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client that trusts only the test CA (HTTP/1.1 and HTTP/2).
fn tls_client() -> HttpClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config((*pki().client).clone())
                .https_or_http()
                .enable_http1()
                .enable_http2()
                .build(),
        )
}

fn ca_args() -> Vec<String> {
    vec!["--upstream-ca".into(), pki().ca.display().to_string()]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `dualera gateway` in front of `upstream` on `listen`, serving TLS with `cert`/`key`.
fn tls_gateway(
    upstream: &str,
    ws: &Workspace,
    listen: &str,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Proc {
    let config = ws.config.display().to_string();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    Proc::spawn(
        &[
            "gateway",
            "--upstream",
            upstream,
            "--listen",
            listen,
            "--config",
            &config,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
        "gateway listening on",
    )
}

/// HTTP/2 to the upstream: after the first request has opened the connection, 24
/// concurrent pass-through requests share it; then two legacy requests held open on
/// it, and the host cancels one: exactly that stream is reset, the other completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_upstream_multiplexes_and_cancellation_resets_one_stream() {
    let ws = Workspace::new(&[]);
    let up = Upstream::scripted_tls(pki().server.clone(), |s| match s.method.as_str() {
        "server/discover" => Script::Json(discover_result(&s.id, json!({"tools": {}}))),
        "tools/call" if s.params()["name"] == "slow" => Script::Stream(vec![]),
        _ => Script::Delayed(
            Duration::from_millis(300),
            Box::new(Script::Json(complete(&s.id, json!({"tools": []})))),
        ),
    })
    .await;
    let extra = ca_args();
    let gw = Proc::gateway_with(&up.url, &ws, &args(&extra));
    let client = http_client();
    let list = |n: i64| modern_request(json!(n), "tools/list", json!({}), json!({}));
    let first = modern_post(&client, &gw.url, &list(0)).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let calls = (1..=24).map(|n| {
        let client = client.clone();
        let url = gw.url.clone();
        async move { modern_post(&client, &url, &list(n)).await }
    });
    let started = Instant::now();
    let replies = futures_util::future::join_all(calls).await;
    for r in &replies {
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // 25 requests held 300 ms each: concurrently on one connection, not one by one.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let seen = up.seen_method("tools/list");
    assert_eq!(seen.len(), 25);
    assert!(seen.iter().all(|s| s.version == http::Version::HTTP_2));
    assert_eq!(up.connections(), 1, "one TCP connection for every request");

    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({})).await;
    let slow = json!({"name": "slow", "arguments": {}});
    let (a, reply_a) = host.request("tools/call", slow.clone()).await;
    let mut stream_a = reply_a.sse();
    let (_, reply_b) = host.request("tools/call", slow).await;
    let mut stream_b = reply_b.sse();
    let held = up.wait_method("tools/call", 2).await;
    let (up_a, up_b) = (held[0].id.clone(), held[1].id.clone());
    assert_eq!(
        host.notify(
            "notifications/cancelled",
            json!({"requestId": a, "reason": "stop"})
        )
        .await,
        202
    );
    up.wait_closed(&up_a).await;
    assert!(stream_a
        .drain()
        .await
        .iter()
        .all(|m| m.get("result").is_none()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !up.was_closed(&up_b),
        "the other stream on the connection was reset too"
    );
    up.wait_held(&up_b).await;
    up.push(
        &up_b,
        complete(&up_b, json!({"content": [], "isError": false})),
    );
    let b = stream_b.next_message().await.expect("response to B");
    assert_eq!(b["result"]["content"], json!([]));
    assert_eq!(up.connections(), 1, "still the one connection");
}

/// One refusal case: the upstream serves `cert`; the gateway trusts the test CA.
async fn refused(server: Arc<rustls::ServerConfig>, reason: &str, words: &str) {
    let ws = Workspace::new(&[]);
    let up = Upstream::scripted_tls(server, |s| {
        Script::Json(discover_result(&s.id, json!({"tools": {}})))
    })
    .await;
    let extra = ca_args();
    let gw = Proc::gateway_with(&up.url, &ws, &args(&extra));

    let mut host = Legacy::new(&gw.url);
    let (_, response) = host.initialize("2025-11-25", json!({})).await;
    assert_eq!(response["error"]["code"], -32603, "{response}");
    assert_eq!(response["error"]["data"]["reason"], reason, "{response}");
    let message = response["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(words), "{message}");

    let r = modern_post(
        &http_client(),
        &gw.url,
        &modern_request(json!(1), "tools/list", json!({}), json!({})),
    )
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["data"]["reason"], reason, "{:?}", r.body);

    let log = eventually(WAIT, "the refusal in the gateway log", || {
        let log = gw.log().join("\n");
        log.contains(words).then_some(log)
    })
    .await;
    assert!(log.contains("upstream TLS failed"), "{log}");

    // Nothing but TLS reached the upstream: no HTTP request was parsed, and what it
    // received is handshake records, with no JSON-RPC in it.
    assert!(up.seen().is_empty());
    let raw = up.raw_received();
    assert!(
        !raw.is_empty() && raw[0] == 0x16,
        "not a TLS handshake: {raw:?}"
    );
    for needle in [&b"jsonrpc"[..], b"POST", b"server/discover", b"tools/list"] {
        assert!(
            !raw.windows(needle.len()).any(|w| w == needle),
            "clear text {:?} reached the upstream",
            String::from_utf8_lossy(needle)
        );
    }
}

/// A leaf for `names` from the test CA, or from another one.
async fn refused_leaf(
    other_ca: bool,
    names: &[&str],
    validity: Validity,
    reason: &str,
    words: &str,
) {
    let other;
    let ca = if other_ca {
        other = ThrowawayCa::new("some other CA").expect("CA");
        &other
    } else {
        &pki().authority
    };
    let (cert, key) = ca.issue(names, validity).expect("leaf");
    refused(server_config(&cert, &key), reason, words).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_certificate_from_unknown_ca() {
    let names = ["127.0.0.1", "localhost"];
    refused_leaf(
        true,
        &names,
        Validity::Current,
        "tlsUnknownIssuer",
        "unknown issuer",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_certificate_for_another_name() {
    let words = "not valid for the upstream's host name";
    refused_leaf(
        false,
        &["upstream.example"],
        Validity::Current,
        "tlsNameMismatch",
        words,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_expired_certificate() {
    let words = "certificate expired";
    refused_leaf(
        false,
        &["127.0.0.1"],
        Validity::Expired,
        "tlsCertificateExpired",
        words,
    )
    .await;
}

/// The certificate a TLS server at `authority` presents on a new connection.
async fn presented(authority: &str) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(pki().client.clone())
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    tls.get_ref().1.peer_certificates().expect("certificates")[0].to_vec()
}

/// SIGHUP re-reads the listener's certificate: new connections get the new one, a
/// connection made before keeps being served; a file that does not parse keeps the
/// certificate in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_listener_certificate_without_dropping_connections() {
    let ws = Workspace::new(&[]);
    let up = Upstream::scripted(|s| match s.method.as_str() {
        "server/discover" => Script::Json(discover_result(&s.id, json!({"tools": {}}))),
        _ => Script::Json(complete(&s.id, json!({"tools": []}))),
    })
    .await;
    let (cert_a, key_a) = pki()
        .authority
        .issue(&["127.0.0.1"], Validity::Current)
        .expect("leaf A");
    let cert = ws.dir.join("gw.pem");
    let key = ws.dir.join("gw-key.pem");
    std::fs::write(&cert, &cert_a).expect("write");
    std::fs::write(&key, &key_a).expect("write");
    let gw = tls_gateway(&up.url, &ws, "127.0.0.1:0", &cert, &key);
    assert!(gw.url.starts_with("https://"), "{}", gw.url);
    let first = presented(&gw.authority()).await;

    // An established HTTP/1.1 connection over TLS.
    let tcp = tokio::net::TcpStream::connect(gw.authority())
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(pki().client.clone())
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("HTTP handshake");
    tokio::spawn(conn);
    let body = modern_request(json!(1), "tools/list", json!({}), json!({}));
    let send = |sender: &mut hyper::client::conn::http1::SendRequest<
        http_body_util::Full<bytes::Bytes>,
    >| {
        let mut b = http::Request::post(&gw.url);
        for (k, v) in modern_headers(&body) {
            b = b.header(k, v);
        }
        let req = b
            .body(http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(&body).unwrap(),
            )))
            .unwrap();
        sender.send_request(req)
    };
    assert_eq!(send(&mut sender).await.expect("request").status(), 200);

    let (cert_b, key_b) = pki()
        .authority
        .issue(&["127.0.0.1", "localhost"], Validity::Current)
        .expect("leaf B");
    std::fs::write(&cert, &cert_b).expect("write");
    std::fs::write(&key, &key_b).expect("write");
    let hup = || {
        let ok = Command::new("kill")
            .args(["-HUP", &gw.pid().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    };
    hup();
    let deadline = Instant::now() + WAIT;
    let second = loop {
        let now = presented(&gw.authority()).await;
        if now != first {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the certificate was not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The connection made before the reload is still served.
    sender.ready().await.expect("connection still open");
    assert_eq!(send(&mut sender).await.expect("request").status(), 200);

    // A broken file: logged, and the current certificate stays.
    std::fs::write(&cert, "not a certificate").expect("write");
    hup();
    eventually(WAIT, "the failed reload in the log", || {
        gw.log()
            .iter()
            .any(|l| l.contains("TLS certificate reload failed"))
            .then_some(())
    })
    .await;
    assert_eq!(presented(&gw.authority()).await, second);
}

/// `X-Forwarded-*` by default, RFC 7239 `Forwarded` when configured, on pass-through
/// and on the legacy path's upstream requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_on_every_upstream_request() {
    let handler = |s: &Seen| match s.method.as_str() {
        "server/discover" => Script::Json(discover_result(&s.id, json!({"tools": {}}))),
        _ => Script::Json(complete(&s.id, json!({"tools": []}))),
    };
    let sc = Scripted::new(&[], json!({"tools": {}}), handler).await;
    let gw_authority = sc.gateway.authority();
    modern_post(
        &http_client(),
        &sc.gateway.url,
        &modern_request(json!(1), "tools/list", json!({}), json!({})),
    )
    .await;
    let mut host = sc.legacy();
    host.open("2025-11-25", json!({})).await;
    host.call("tools/list", json!({})).await;
    let seen = sc.up.seen();
    assert!(seen.len() >= 3, "{}", seen.len());
    for s in &seen {
        let h = |n: &str| s.headers.get(n).and_then(|v| v.to_str().ok());
        assert_eq!(h("x-forwarded-for"), Some("127.0.0.1"), "{}", s.method);
        assert_eq!(h("x-forwarded-proto"), Some("http"), "{}", s.method);
        assert_eq!(
            h("x-forwarded-host"),
            Some(gw_authority.as_str()),
            "{}",
            s.method
        );
        assert!(h("forwarded").is_none());
    }

    // RFC 7239, behind a TLS listener.
    let ws = Workspace::new(&[("forwarded", "\"forwarded\"")]);
    let up = Upstream::scripted(handler).await;
    let gw = tls_gateway(&up.url, &ws, "127.0.0.1:0", &pki().cert, &pki().key);
    let r = modern_post(
        &tls_client(),
        &gw.url,
        &modern_request(json!(1), "tools/list", json!({}), json!({})),
    )
    .await;
    assert_eq!(r.status, 200);
    let s = up.wait_method("tools/list", 1).await.remove(0);
    let want = format!("for=127.0.0.1;proto=https;host=\"{}\"", gw.authority());
    assert_eq!(
        s.headers.get("forwarded").and_then(|v| v.to_str().ok()),
        Some(want.as_str())
    );
    assert!(s.headers.get("x-forwarded-for").is_none());
}

/// A listener on a non-loopback address without TLS says so at start-up; with TLS
/// it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_text_listener_off_loopback_is_warned_about() {
    let ws = Workspace::new(&[]);
    let config = ws.config.display().to_string();
    let plain = Proc::spawn(
        &[
            "gateway",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
            "0.0.0.0:0",
            "--config",
            &config,
        ],
        "gateway listening on",
    );
    assert!(
        plain.log().iter().any(|l| l.contains("without TLS")),
        "{:?}",
        plain.log()
    );
    drop(plain);
    let secured = tls_gateway(
        "http://127.0.0.1:9/mcp",
        &ws,
        "0.0.0.0:0",
        &pki().cert,
        &pki().key,
    );
    assert!(!secured.log().iter().any(|l| l.contains("without TLS")));
}

/// `dualera up --tls`: a throw-away CA in the demo folder, the gateway on https, and
/// the CA's path printed; a host trusting that CA gets its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_tls_serves_https_with_a_throwaway_ca() {
    let ws = Workspace::new(&[]);
    let dir = ws.dir.join("demo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args([
            "up",
            "--dir",
            &dir.display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--tls",
        ])
        .env("DUALERA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn up");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().expect("stdout");
    let _guard = Kill(child);
    let mut banner = std::collections::HashMap::new();
    for line in BufReader::new(out).lines() {
        let line = line.expect("banner");
        if line.starts_with("Press Ctrl-C") {
            break;
        }
        if let Some((k, v)) = line.split_once(": ") {
            banner.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    let url = banner["gateway (legacy and modern hosts)"].clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca = std::path::PathBuf::from(&banner["CA certificate (give it to hosts)"]);
    assert_eq!(ca, std::fs::canonicalize(&dir).unwrap().join("tls/ca.pem"));
    let ca_pem = std::fs::read_to_string(&ca).expect("CA file");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config((*client_config(&ca_pem)).clone())
                .https_only()
                .enable_http1()
                .build(),
        );
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "tls-host", "version": "1"}}});
    let r = raw(
        &client,
        http::Method::POST,
        &url,
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ],
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v: Value = r.json();
    assert_eq!(v["result"]["protocolVersion"], "2025-11-25");
    assert!(r.header("mcp-session-id").is_some());
    // The key of the throw-away CA is not kept anywhere.
    let files: Vec<String> = std::fs::read_dir(ca.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = files.clone();
    sorted.sort();
    assert_eq!(sorted, ["ca.pem", "gateway-key.pem", "gateway.pem"]);
}
