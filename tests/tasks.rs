//! The tasks extension (`io.modelcontextprotocol/tasks`) on `dualera serve`, over real
//! sockets against the spawned binary (SQLite store): `summarize_repo` runs as a task
//! for a caller that declares the extension (and only then), its two sampling rounds
//! surface as `input_required` on `tasks/get` and are answered by `tasks/update`, the
//! work advances on the server without being polled (watched in the store file, not
//! through the server), cancel, errors with the spec's codes, principal binding and
//! status notifications on `subscriptions/listen`.

mod common;

use common::tasks::*;
use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The task's status as the store file holds it (read beside the server, not through
/// it).
fn stored_status(fx: &Fixture, id: &str) -> Option<String> {
    let conn = rusqlite::Connection::open(&fx.store_path).ok()?;
    let body: String = conn
        .query_row("SELECT body FROM tasks WHERE id = ?1", [id], |r| r.get(0))
        .ok()?;
    let doc: Value = serde_json::from_str(&body).ok()?;
    doc["status"].as_str().map(str::to_owned)
}

fn sampling_request<'a>(task: &'a Value, key: &str) -> &'a Value {
    let req = &task["inputRequests"][key];
    assert_eq!(req["method"], "sampling/createMessage", "{task}");
    req
}

#[test]
fn discover_declares_the_extension_and_summarize_repo_supports_tasks() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let d = srv.send(&discover(json!(1)));
    assert_eq!(
        d.result()["capabilities"]["extensions"][TASKS],
        json!({}),
        "{}",
        d.msg()
    );
    let tools = srv.send(&tools_list(json!(2)));
    let summarize = tools.result()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "summarize_repo")
        .cloned()
        .unwrap();
    assert_eq!(summarize["execution"]["taskSupport"], "optional");
}

#[test]
fn summarize_repo_as_a_task_with_two_sampling_rounds() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let id = start_summary(&srv);
    // Durable before the answer: the store holds it already.
    assert!(stored_status(&fx, &id).is_some());

    let t = wait_status(&srv, &id, "input_required");
    assert_eq!(t["resultType"], "complete");
    assert!(t.get("requestState").is_none(), "{t}");
    let pick = sampling_request(&t, "pick_files");
    assert!(pick["params"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .contains("README.md"));

    // An unknown key is ignored; the task stays where it was.
    let ack = task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"nope": model_reply("x")}}),
    );
    assert_eq!(ack.result()["resultType"], "complete");
    assert!(ack.result().get("status").is_none());
    assert_eq!(get(&srv, &id)["status"], "input_required");

    let ack = task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"pick_files": model_reply(r#"["README.md", "src/lib.rs"]"#)}}),
    );
    assert_eq!(
        ack.result(),
        &json!({"resultType": "complete", "_meta": ack.result()["_meta"]})
    );

    // The next round runs on the server by itself: watch the store, not the server.
    let deadline = Instant::now() + TASK_WAIT;
    while stored_status(&fx, &id).as_deref() != Some("input_required") {
        assert!(Instant::now() < deadline, "the second round never ran");
        std::thread::sleep(Duration::from_millis(25));
    }
    let t = get(&srv, &id);
    assert_eq!(t["status"], "input_required");
    let summary = sampling_request(&t, "summary");
    assert!(summary["params"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .contains("double-entry"));
    assert!(t["inputRequests"].get("pick_files").is_none());

    task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"summary": model_reply("A tiny ledger.")}}),
    );
    let t = wait_status(&srv, &id, "completed");
    assert_eq!(t["status"], "completed", "{t}");
    let result = &t["result"];
    assert_eq!(result["structuredContent"]["summary"], "A tiny ledger.");
    assert_eq!(
        result["structuredContent"]["files"],
        json!(["README.md", "src/lib.rs"])
    );
    assert!(t.get("inputRequests").is_none() && t.get("error").is_none());
    assert_eq!(stored_status(&fx, &id).as_deref(), Some("completed"));
    // A finished task stays readable until its ttlMs; cancel leaves it as it is.
    let ack = task_call(&srv, "tasks/cancel", json!({"taskId": id}));
    assert_eq!(ack.result()["resultType"], "complete");
    assert_eq!(get(&srv, &id)["status"], "completed");
}

#[test]
fn without_the_extension_summarize_repo_answers_as_before() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let r = srv.call("summarize_repo", summarize_args(&fx), sampling());
    assert_eq!(r.result()["resultType"], "input_required", "{}", r.msg());
    assert!(r.result().get("taskId").is_none());
    assert!(r.result()["requestState"].is_string());
    // The extension alone does not stand in for sampling.
    let r = srv.call(
        "summarize_repo",
        summarize_args(&fx),
        json!({"extensions": {TASKS: {}}}),
    );
    r.expect_error(-32021);
}

#[test]
fn cancel_while_input_required() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let id = start_summary(&srv);
    wait_status(&srv, &id, "input_required");
    let ack = task_call(&srv, "tasks/cancel", json!({"taskId": id}));
    assert_eq!(ack.result()["resultType"], "complete");
    assert!(ack.result().get("taskId").is_none());
    let t = get(&srv, &id);
    assert_eq!(t["status"], "cancelled", "{t}");
    assert!(t.get("inputRequests").is_none());
    // A late answer changes nothing.
    task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"pick_files": model_reply(r#"["README.md"]"#)}}),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(&srv, &id)["status"], "cancelled");
    assert_eq!(stored_status(&fx, &id).as_deref(), Some("cancelled"));
}

#[test]
fn bad_task_requests_get_the_spec_codes() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let id = start_summary(&srv);
    // No extension in this request's capabilities: -32021 naming it.
    let r = srv.send(&rpc(
        srv.next_id(),
        "tasks/get",
        sampling(),
        json!({"taskId": id}),
    ));
    let e = r.expect_error(-32021);
    assert_eq!(
        e["data"]["requiredCapabilities"]["extensions"][TASKS],
        json!({})
    );
    // Unknown, missing, malformed ids: -32602.
    task_call(&srv, "tasks/get", json!({"taskId": "no-such-task"})).expect_error(-32602);
    task_call(&srv, "tasks/cancel", json!({"taskId": "no-such-task"})).expect_error(-32602);
    // Over HTTP a taskId that is missing or not a string cannot match Mcp-Name
    // (-32020, the ladder's earlier rung); on stdio it is -32602.
    task_call(&srv, "tasks/get", json!({})).expect_error(-32020);
    let stdio = fx.spawn(Kind::Stdio);
    task_call(&stdio, "tasks/get", json!({})).expect_error(-32602);
    task_call(&stdio, "tasks/get", json!({"taskId": 7})).expect_error(-32602);
    // Any instance on the store answers for any task (here: over stdio).
    assert_eq!(get(&stdio, &id)["taskId"], json!(id));
    task_call(&srv, "tasks/get", json!({"taskId": "x".repeat(129)})).expect_error(-32602);
    task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": []}),
    )
    .expect_error(-32602);
    // The methods the extension removed: -32601.
    task_call(&srv, "tasks/result", json!({"taskId": id})).expect_error(-32601);
    task_call(&srv, "tasks/list", json!({})).expect_error(-32601);
    // Mcp-Name must carry the taskId.
    let msg = rpc(
        srv.next_id(),
        "tasks/get",
        task_caps(),
        json!({"taskId": id}),
    );
    srv.send_with(&msg, HttpOpts::default().set("Mcp-Name", "another-task"))
        .expect_error(-32020);
    srv.send_with(&msg, HttpOpts::default().omit("Mcp-Name"))
        .expect_error(-32020);
    task_call(&srv, "tasks/cancel", json!({"taskId": id}));
}

#[test]
fn a_task_is_bound_to_its_principal() {
    let fx = Fixture::with(Options {
        principals: vec![
            ("alice".into(), "alice-token-0123456789".into()),
            ("bob".into(), "bob-token-0123456789ab".into()),
        ],
        ..Options::default()
    });
    let srv = fx.spawn(Kind::Http);
    let id = start_summary(&srv);
    wait_status(&srv, &id, "input_required");
    srv.set_token(fx.token_of("bob").as_deref());
    // Bob cannot see, answer or cancel Alice's task: it is as unknown as a made-up id.
    task_call(&srv, "tasks/get", json!({"taskId": id})).expect_error(-32602);
    task_call(
        &srv,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"pick_files": model_reply(r#"["README.md"]"#)}}),
    )
    .expect_error(-32602);
    task_call(&srv, "tasks/cancel", json!({"taskId": id})).expect_error(-32602);
    srv.set_token(fx.token_of("alice").as_deref());
    assert_eq!(get(&srv, &id)["status"], "input_required");
}

/// Opens `subscriptions/listen` asking for task status; returns the stream once the
/// acknowledgment arrived, and the acknowledgment.
fn listen(srv: &Server) -> (TcpStream, String) {
    let addr = srv.http_addr().expect("an HTTP server");
    let body = rpc(
        json!("listen-1"),
        "subscriptions/listen",
        task_caps(),
        json!({"notifications": {"taskStatus": true}}),
    )
    .to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TASK_WAIT)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let seen = read_until(
        &mut s,
        "notifications/subscriptions/acknowledged",
        String::new(),
    );
    (s, seen)
}

/// Reads the stream until `needle` appears (bounded by the read timeout).
fn read_until(s: &mut TcpStream, needle: &str, mut seen: String) -> String {
    let mut buf = [0u8; 8192];
    while !seen.contains(needle) {
        let n = s.read(&mut buf).expect("the stream stays open");
        assert!(n > 0, "the stream ended before {needle}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    seen
}

#[test]
fn status_notifications_on_subscriptions_listen() {
    let fx = Fixture::new();
    let srv = fx.spawn(Kind::Http);
    let (mut stream, ack) = listen(&srv);
    assert!(ack.contains(r#""taskStatus":true"#), "{ack}");
    let id = start_summary(&srv);
    let seen = read_until(&mut stream, "input_required", String::new());
    assert!(seen.contains("notifications/tasks"), "{seen}");
    assert!(seen.contains(&id), "{seen}");
    assert!(seen.contains("sampling/createMessage"), "{seen}");
    task_call(&srv, "tasks/cancel", json!({"taskId": id}));
    let seen = read_until(&mut stream, "cancelled", seen);
    assert!(
        seen.contains("io.modelcontextprotocol/subscriptionId"),
        "{seen}"
    );
}

#[test]
fn a_principal_holds_a_bounded_number_of_tasks() {
    let fx = Fixture::new();
    let config = fx.dir.join("bounded.toml");
    let mut text = fx.config_text_signing_with("test-1", STATE_SECRET);
    text.push_str("[tasks]\nmax_per_principal = 2\npoll_interval_ms = 250\nttl_ms = 60000\n");
    std::fs::write(&config, text).unwrap();
    let srv = fx.spawn_with_config(Kind::Http, &config);
    let first = srv.call("summarize_repo", summarize_args(&fx), task_caps());
    assert_eq!(first.result()["pollIntervalMs"], 250);
    assert_eq!(first.result()["ttlMs"], 60000);
    start_summary(&srv);
    let third = srv.call("summarize_repo", summarize_args(&fx), task_caps());
    let e = third.expect_error(-32603);
    assert!(
        e["message"].as_str().unwrap().contains("2 unexpired tasks"),
        "{e}"
    );
    // An unknown key in [tasks] is refused at start.
    let bad = fx.dir.join("bad.toml");
    let mut text = fx.config_text_signing_with("test-1", STATE_SECRET);
    text.push_str("[tasks]\nmax_tasks = 2\n");
    std::fs::write(&bad, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args(["serve", "--config"])
        .arg(&bad)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_tasks"));
}
