//! Modern (2026-07-28) pass-through, over real sockets: a modern client gets from the
//! gateway exactly what the server says directly — byte for byte wherever the server is
//! deterministic — and completes an MRTR round through it on its own.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};

struct Direct {
    ws: Workspace,
    server: Proc,
    gateway: Proc,
}

impl Direct {
    fn new() -> Self {
        let ws = Workspace::new(&[]);
        let server = Proc::serve(&ws);
        let gateway = Proc::gateway(&server.url, &ws);
        Self {
            ws,
            server,
            gateway,
        }
    }

    /// Sends the same bytes and headers to the server and through the gateway.
    async fn both(
        &self,
        method: Method,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (RawReply, RawReply) {
        let c = http_client();
        let direct = raw(&c, method.clone(), &self.server.url, headers, body.to_vec()).await;
        let via = raw(&c, method, &self.gateway.url, headers, body.to_vec()).await;
        (direct, via)
    }

    async fn same(
        &self,
        what: &str,
        method: Method,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> RawReply {
        let (direct, via) = self.both(method, headers, body).await;
        assert_eq!(via.status, direct.status, "{what}: HTTP status");
        assert_eq!(
            via.header("content-type"),
            direct.header("content-type"),
            "{what}: content type"
        );
        assert_eq!(
            via.body,
            direct.body,
            "{what}: body differs\n direct: {}\n via:    {}",
            String::from_utf8_lossy(&direct.body),
            String::from_utf8_lossy(&via.body)
        );
        assert!(
            via.header("mcp-session-id").is_none(),
            "{what}: no session on pass-through"
        );
        via
    }
}

/// What an error case sends: its name, the expected code, headers and body.
type ErrorCase = (&'static str, i64, Vec<(String, String)>, Vec<u8>);

fn headers_of(body: &Value) -> Vec<(String, String)> {
    modern_headers(body)
}

fn refs(h: &[(String, String)]) -> Vec<(&str, &str)> {
    h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

fn full_caps_modern() -> Value {
    json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_is_byte_identical() {
    let d = Direct::new();
    seed_note(&d.server.url, &d.ws, "Same", "body").await;

    // Deterministic successes.
    for (what, body) in [
        (
            "server/discover",
            modern_request(json!(1), "server/discover", json!({}), json!({})),
        ),
        (
            "tools/list",
            modern_request(json!("list-1"), "tools/list", json!({}), json!({})),
        ),
        (
            "tools/call notes_list",
            modern_request(
                json!(3),
                "tools/call",
                json!({"name": "notes_list", "arguments": {"workspaceUri": d.ws.notes_uri}}),
                json!({}),
            ),
        ),
    ] {
        let h = headers_of(&body);
        let via = d
            .same(
                what,
                Method::POST,
                &refs(&h),
                &serde_json::to_vec(&body).unwrap(),
            )
            .await;
        assert_eq!(via.status, StatusCode::OK);
        assert_eq!(via.json()["result"]["resultType"], "complete", "{what}");
    }

    // Every error class.
    let mut no_version = modern_request(json!(10), "tools/list", json!({}), json!({}));
    no_version["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove(PV);
    let mut future = modern_request(json!(11), "tools/list", json!({}), json!({}));
    future["params"]["_meta"][PV] = json!("2099-01-01");
    let no_sampling = modern_request(
        json!(12),
        "tools/call",
        json!({"name": "summarize_repo", "arguments": {"directory": d.ws.repo.display().to_string(), "audience": "x"}}),
        json!({"elicitation": {"form": {}}}),
    );
    let mismatch = modern_request(json!(13), "tools/list", json!({}), json!({}));
    let unknown = modern_request(json!(14), "nope/never", json!({}), json!({}));
    let bad_tool = modern_request(
        json!(15),
        "tools/call",
        json!({"name": "no_such_tool", "arguments": {}}),
        json!({}),
    );
    let cases: Vec<ErrorCase> = vec![
        (
            "-32602 missing protocolVersion",
            -32602,
            headers_of(&no_version),
            serde_json::to_vec(&no_version).unwrap(),
        ),
        (
            "-32602 unknown tool",
            -32602,
            headers_of(&bad_tool),
            serde_json::to_vec(&bad_tool).unwrap(),
        ),
        (
            "-32022 unsupported version",
            -32022,
            {
                let mut h = headers_of(&future);
                h.retain(|(k, _)| k != "mcp-protocol-version");
                h.push(("mcp-protocol-version".into(), "2099-01-01".into()));
                h
            },
            serde_json::to_vec(&future).unwrap(),
        ),
        (
            "-32021 missing capability",
            -32021,
            headers_of(&no_sampling),
            serde_json::to_vec(&no_sampling).unwrap(),
        ),
        (
            "-32020 header mismatch",
            -32020,
            {
                let mut h = headers_of(&mismatch);
                h.retain(|(k, _)| k != "mcp-method");
                h.push(("mcp-method".into(), "prompts/list".into()));
                h
            },
            serde_json::to_vec(&mismatch).unwrap(),
        ),
        (
            "-32601 unknown method",
            -32601,
            headers_of(&unknown),
            serde_json::to_vec(&unknown).unwrap(),
        ),
        (
            "-32700 parse error",
            -32700,
            headers_of(&json!({})),
            b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ".to_vec(),
        ),
        (
            "-32600 invalid request",
            -32600,
            headers_of(&json!({})),
            br#"{"jsonrpc":"1.0","id":1,"method":"tools/list","params":{}}"#.to_vec(),
        ),
    ];
    for (what, code, h, body) in cases {
        let via = d.same(what, Method::POST, &refs(&h), &body).await;
        assert_ne!(via.status, StatusCode::OK, "{what}");
        assert_eq!(via.json()["error"]["code"], code, "{what}");
    }

    // HTTP-level answers: notifications 202, GET/DELETE 405.
    let note =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    let h = headers_of(&note);
    let via = d
        .same(
            "notification",
            Method::POST,
            &refs(&h),
            &serde_json::to_vec(&note).unwrap(),
        )
        .await;
    assert_eq!(via.status, StatusCode::ACCEPTED);
    let h = [
        ("mcp-protocol-version", MODERN),
        ("accept", "text/event-stream"),
    ];
    for m in [Method::GET, Method::DELETE] {
        let via = d.same(&format!("{m}"), m.clone(), &h, b"").await;
        assert_eq!(via.status, StatusCode::METHOD_NOT_ALLOWED, "{m}");
    }
}

/// A modern client completes `notes_delete`'s `input_required` round through the
/// gateway on its own: the gateway never interprets the round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_client_completes_mrtr_round_through_gateway() {
    let d = Direct::new();
    let a = seed_note(&d.server.url, &d.ws, "Gone", "one").await;
    seed_note(&d.server.url, &d.ws, "Gone", "two").await;
    let c = http_client();
    let args = json!({"name": "notes_delete", "arguments": {"workspaceUri": d.ws.notes_uri, "title": "Gone"}});
    let first = modern_post(
        &c,
        &d.gateway.url,
        &modern_request(json!(1), "tools/call", args.clone(), full_caps_modern()),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.header("mcp-session-id").is_none());
    let first = first.json();
    let r = &first["result"];
    assert_eq!(r["resultType"], "input_required", "{first}");
    let (key, ask) = r["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(ask["method"], "elicitation/create");
    assert_eq!(
        ask["params"]["mode"], "form",
        "modern clients see the modern shape"
    );
    let state = r["requestState"].as_str().unwrap();

    let mut retry_params = args.clone();
    retry_params["inputResponses"] =
        json!({ key: {"action": "accept", "content": {"note_id": a, "confirm": true}} });
    retry_params["requestState"] = json!(state);
    let second = modern_post(
        &c,
        &d.gateway.url,
        &modern_request(json!(2), "tools/call", retry_params, full_caps_modern()),
    )
    .await;
    let second = second.json();
    assert_eq!(second["result"]["resultType"], "complete", "{second}");
    assert_eq!(second["result"]["structuredContent"]["deleted"], a);
    assert_eq!(count_notes(&d.server.url, &d.ws, "Gone").await, 1);
}

/// A modern request whose body does not come with its head is relayed whole: its
/// first part, already taken on the handler's first poll, then the rest as it
/// arrives, with a declared length and chunked; the answer is the server's. Over
/// HTTP/1.1 on a raw connection (TLS in the TLS run), so the parts are the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_arriving_in_parts_is_relayed_whole() {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
    impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
    let d = Direct::new();
    let body = modern_request(
        json!(7),
        "tools/call",
        json!({"name": "notes_list", "arguments": {"workspaceUri": d.ws.notes_uri}}),
        json!({}),
    );
    let mut extra = String::new();
    for (k, v) in headers_of(&body) {
        extra.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = serde_json::to_vec(&body).unwrap();
    let (one, two) = body.split_at(body.len() / 2);
    let u: http::Uri = d.gateway.url.parse().unwrap();
    let authority = u.authority().unwrap().to_string();
    for chunked in [false, true] {
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .expect("connect");
        let mut s: Box<dyn Io> = if tls() {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let tls = tokio_rustls::TlsConnector::from(pki().client.clone())
                .connect(name, tcp)
                .await
                .expect("TLS handshake");
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let framing = if chunked {
            "Transfer-Encoding: chunked\r\n".to_owned()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nConnection: close\r\n{extra}{framing}\r\n",
            u.path()
        );
        let part = |p: &[u8]| {
            if chunked {
                let mut c = format!("{:x}\r\n", p.len()).into_bytes();
                c.extend_from_slice(p);
                c.extend_from_slice(b"\r\n");
                c
            } else {
                p.to_vec()
            }
        };
        let mut first = head.into_bytes();
        first.extend(part(one));
        s.write_all(&first).await.expect("head and first part");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut rest = part(two);
        if chunked {
            rest.extend_from_slice(b"0\r\n\r\n");
        }
        s.write_all(&rest).await.expect("second part");
        let mut answer = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            s.read_to_end(&mut answer),
        )
        .await
        .expect("answered in time")
        .expect("read the answer");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "chunked {chunked}: {answer}"
        );
        assert!(
            answer.contains(r#""resultType":"complete""#) && answer.contains(r#""id":7"#),
            "chunked {chunked}: {answer}"
        );
    }
}
