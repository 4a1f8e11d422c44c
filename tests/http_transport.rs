//! Streamable HTTP specifics of the modern server: POST only, no sessions, mirrored
//! headers checked against the body, Origin checks, body limit, status codes.

mod common;

use common::*;
use serde_json::json;

#[test]
fn get_and_delete_are_405() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    for m in ["GET", "DELETE", "PUT", "PATCH"] {
        let r = srv.send_raw_with(b"", HttpOpts::default().method(m));
        assert_eq!(r.status, Some(405), "{m}");
        assert_eq!(r.header("allow"), Some("POST"), "{m}");
        assert!(r.header("mcp-session-id").is_none());
    }
    // GET with an SSE Accept (a legacy client opening its stream) too.
    let r = srv.send_raw_with(
        b"",
        HttpOpts::default()
            .method("GET")
            .set("Accept", "text/event-stream"),
    );
    assert_eq!(r.status, Some(405));
    assert!(srv.alive());
}

#[test]
fn session_id_is_ignored_and_never_echoed() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    srv.seed();
    let plain = srv.send(&tools_list(json!(1)));
    assert!(plain.header("mcp-session-id").is_none());
    let with = srv.send_with(
        &tools_list(json!(1)),
        HttpOpts::default().set("Mcp-Session-Id", "made-up-session-123"),
    );
    assert_eq!(with.status, Some(200));
    assert!(
        with.header("mcp-session-id").is_none(),
        "{:?}",
        with.headers
    );
    assert_eq!(plain.raw, with.raw, "a session id changes nothing");
    // A whole MRTR exchange under two different made-up sessions still works: the
    // state, not a session, carries the round.
    let seed = srv.seed();
    let r1 = srv.send_with(
        &call(
            json!(2),
            "notes_delete",
            srv.delete_args("TPS report"),
            form(),
        ),
        HttpOpts::default().set("Mcp-Session-Id", "session-a"),
    );
    assert!(r1.header("mcp-session-id").is_none());
    let state = r1.state();
    let r2 = srv.send_with(
        &retry(
            json!(3),
            "notes_delete",
            srv.delete_args("TPS report"),
            form(),
            json!({"delete_choice": accept(&seed.tps[0], true)}),
            &state,
        ),
        HttpOpts::default().set("Mcp-Session-Id", "session-b"),
    );
    assert_eq!(r2.result()["resultType"], "complete");
    assert!(r2.header("mcp-session-id").is_none());
}

#[test]
fn header_body_mismatch_is_400_32020() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let seed = srv.seed();
    let list = call(
        json!(1),
        "notes_list",
        json!({"workspaceUri": fx.notes_uri}),
        json!({}),
    );
    let cases: Vec<(&str, HttpOpts)> = vec![
        (
            "Mcp-Method differs",
            HttpOpts::default().set("Mcp-Method", "tools/list"),
        ),
        ("Mcp-Method missing", HttpOpts::default().omit("Mcp-Method")),
        (
            "Mcp-Name differs",
            HttpOpts::default().set("Mcp-Name", "notes_delete"),
        ),
        ("Mcp-Name missing", HttpOpts::default().omit("Mcp-Name")),
        (
            "Mcp-Name base64 of another tool",
            HttpOpts::default().set("Mcp-Name", "=?base64?bm90ZXNfZGVsZXRl?="),
        ),
        (
            "Mcp-Name bad base64",
            HttpOpts::default().set("Mcp-Name", "=?base64?!!!?="),
        ),
        (
            "MCP-Protocol-Version differs",
            HttpOpts::default().set("MCP-Protocol-Version", "2025-11-25"),
        ),
        (
            "MCP-Protocol-Version missing",
            HttpOpts::default().omit("MCP-Protocol-Version"),
        ),
    ];
    for (what, opts) in cases {
        let r = srv.send_with(&list, opts);
        assert_eq!(r.status, Some(400), "{what}");
        r.expect_error(-32020);
        assert_eq!(r.msg()["id"], 1, "{what}");
    }
    // The base64 form of the right name is accepted.
    let r = srv.send_with(
        &list,
        HttpOpts::default().set("Mcp-Name", "=?base64?bm90ZXNfbGlzdA==?="),
    );
    assert_eq!(r.status, Some(200));
    // tools/list has no Mcp-Name; its Mcp-Method must still match.
    let r = srv.send_with(
        &tools_list(json!(2)),
        HttpOpts::default().set("Mcp-Method", "tools/call"),
    );
    assert_eq!(r.status, Some(400));
    r.expect_error(-32020);
    // A destructive retry with mismatched headers does nothing.
    let state = srv.delete_round1(json!(3), "TPS report").state();
    let retry_msg = retry(
        json!(4),
        "notes_delete",
        srv.delete_args("TPS report"),
        form(),
        json!({"delete_choice": accept(&seed.tps[0], true)}),
        &state,
    );
    let r = srv.send_with(
        &retry_msg,
        HttpOpts::default().set("Mcp-Name", "notes_list"),
    );
    assert_eq!(r.status, Some(400));
    r.expect_error(-32020);
    assert_eq!(srv.note_count(), 5);
    // The state was not consumed by the refused request.
    let r = srv.send(&retry_msg);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[0])
    );
}

#[test]
fn bad_origin_is_403() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    srv.seed();
    for origin in [
        "http://evil.example.com",
        "https://localhost.evil.com",
        "null",
        "http://127.0.0.1.evil.com",
    ] {
        let r = srv.send_with(
            &call(
                json!(1),
                "notes_delete",
                srv.delete_args("TPS report"),
                form(),
            ),
            HttpOpts::default().set("Origin", origin),
        );
        assert_eq!(r.status, Some(403), "{origin}");
        if r.json.is_some() {
            r.error();
        }
    }
    // Loopback origins are fine.
    for origin in ["http://localhost:3000", "http://127.0.0.1:8787"] {
        let r = srv.send_with(
            &discover(json!(2)),
            HttpOpts::default().set("Origin", origin),
        );
        assert_eq!(r.status, Some(200), "{origin}");
    }
    // A foreign Host on a loopback listener (DNS rebinding) is refused too.
    let r = srv.send_with(
        &discover(json!(3)),
        HttpOpts::default().set("Host", "evil.example.com"),
    );
    assert_eq!(r.status, Some(403));
    assert_eq!(srv.note_count(), 5);
}

#[test]
fn body_over_limit_is_413() {
    let fx = Fixture::with(Options {
        max_body_bytes: Some(64 * 1024),
        ..Options::default()
    });
    let srv = fx.spawn(Kind::Http);
    srv.seed();
    let mut big = call(
        json!(1),
        "notes_create",
        json!({"workspaceUri": fx.notes_uri, "title": "big", "body": "x".repeat(70 * 1024)}),
        json!({}),
    );
    let r = srv.send(&big);
    assert_eq!(r.status, Some(413));
    r.expect_error(-32600);
    // Far over the limit as well.
    big["params"]["arguments"]["body"] = json!("y".repeat(4 * 1024 * 1024));
    let r = srv.send(&big);
    assert_eq!(r.status, Some(413));
    assert!(srv.alive());
    assert_eq!(srv.note_count(), 5);
    // Just under the limit is fine.
    big["params"]["arguments"]["body"] = json!("z".repeat(60 * 1024));
    let r = srv.send(&big);
    assert_eq!(r.status, Some(200));
    assert_eq!(srv.note_count(), 6);
}

#[test]
fn unknown_method_is_404_32601() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let r = srv.send(&rpc(json!(7), "tools/explode", json!({}), json!({})));
    assert_eq!(r.status, Some(404));
    r.expect_error(-32601);
    assert_eq!(r.msg()["id"], 7);
}

#[test]
fn initialize_is_32601_naming_the_supported_version() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    // As a 2025-11-25 client sends it: no MCP-Protocol-Version header on initialize.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
        "clientInfo": {"name": "legacy-host", "version": "1.0"}}});
    let r = srv.send_with(
        &init,
        HttpOpts::default()
            .omit("MCP-Protocol-Version")
            .omit("Mcp-Method"),
    );
    assert_eq!(r.status, Some(404));
    let err = r.expect_error(-32601);
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains("2026-07-28"), "{msg}");
    assert!(msg.contains("initialize"), "{msg}");
    assert!(r.header("mcp-session-id").is_none());
}

#[test]
fn notification_is_202_with_empty_body() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let r = srv.send(&notification("notifications/initialized"));
    assert_eq!(r.status, Some(202));
    assert!(r.raw.is_empty());
    assert!(r.header("mcp-session-id").is_none());
}

#[test]
fn bearer_tokens_pick_the_principal() {
    let fx = Fixture::with(Options {
        principals: vec![
            ("alice".into(), "alice-token-123".into()),
            ("bob".into(), "bob-token-456".into()),
        ],
        ..Options::default()
    });
    let srv = fx.spawn_as(Kind::Http, "alice");
    srv.seed();
    for token in [None, Some("wrong-token"), Some("alice-token-12")] {
        srv.set_token(token);
        let r = srv.send(&discover(json!(1)));
        assert_eq!(r.status, Some(401), "{token:?}");
        r.error();
        assert!(r.header("www-authenticate").is_some());
    }
    srv.set_token(Some("bob-token-456"));
    assert_eq!(srv.note_count(), 5, "bob is granted the same workspace");
    // clientInfo claiming to be someone else changes nothing.
    let mut msg = call(
        json!(2),
        "notes_list",
        json!({"workspaceUri": fx.notes_uri}),
        json!({}),
    );
    msg["params"]["_meta"][CLIENT_INFO] = json!({"name": "alice", "version": "1"});
    srv.set_token(None);
    assert_eq!(srv.send(&msg).status, Some(401));
}

/// RFC 9110 §11.1: the authentication scheme is a case-insensitive token; the token
/// itself is compared exactly.
#[test]
fn bearer_scheme_is_case_insensitive() {
    let fx = Fixture::with(Options {
        principals: vec![("alice".into(), "alice-token-123".into())],
        ..Options::default()
    });
    let srv = fx.spawn_as(Kind::Http, "alice");
    srv.set_token(None);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} alice-token-123");
        let r = srv.send_with(
            &discover(json!(1)),
            HttpOpts::default().set("Authorization", &auth),
        );
        assert_eq!(r.status, Some(200), "{auth}");
    }
    for auth in ["Bearer ALICE-TOKEN-123", "Basic alice-token-123", "Bearer"] {
        let r = srv.send_with(
            &discover(json!(1)),
            HttpOpts::default().set("Authorization", auth),
        );
        assert_eq!(r.status, Some(401), "{auth}");
        let challenge = r.header("www-authenticate").unwrap_or_default().to_owned();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
    }
    // A token that was presented and refused says so (RFC 6750 §3.1).
    let r = srv.send_with(
        &discover(json!(1)),
        HttpOpts::default().set("Authorization", "Bearer wrong"),
    );
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );
}
