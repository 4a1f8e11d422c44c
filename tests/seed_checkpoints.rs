//! Every "expected checkpoint" of the two seed lessons (notes_delete with form
//! elicitation; summarize_repo with sampling), plus the roots migration adapter, each
//! written once against the transport abstraction and run over HTTP and stdio.

mod common;

use common::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------
// Discovery and tools/list.
// ---------------------------------------------------------------------------------

fn discover_advertises_tools_without_roots(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let r = srv.send(&discover(json!(1)));
    if let Some(s) = r.status {
        assert_eq!(s, 200);
    }
    let res = r.result();
    assert_eq!(res["resultType"], "complete");
    assert_eq!(res["supportedVersions"], json!([VERSION]));
    assert!(res["capabilities"]["tools"].is_object(), "{res}");
    assert!(res["capabilities"].get("roots").is_none(), "{res}");
    assert!(
        !res.to_string().contains("\"roots\":"),
        "discover must not advertise roots: {res}"
    );
    assert!(res["ttlMs"].as_u64().is_some_and(|t| t > 0), "{res}");
    assert!(
        matches!(res["cacheScope"].as_str(), Some("public" | "private")),
        "{res}"
    );
    let info = &res["_meta"][SERVER_INFO];
    assert!(
        info["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{res}"
    );
    assert!(info["version"].as_str().is_some(), "{res}");
}

fn tools_list_is_deterministic_with_descriptors(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let a = srv.send(&tools_list(json!(1)));
    let b = srv.send(&tools_list(json!(1)));
    assert_eq!(a.raw, b.raw, "two tools/list answers differ byte for byte");
    let res = a.result();
    assert_eq!(res["resultType"], "complete");
    assert!(res["ttlMs"].as_u64().is_some(), "{res}");
    assert!(res["cacheScope"].as_str().is_some(), "{res}");
    assert!(res["_meta"][SERVER_INFO]["name"].is_string(), "{res}");
    let tools = res["tools"].as_array().expect("tools array");
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in [
        "notes_create",
        "notes_delete",
        "notes_list",
        "summarize_repo",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "descriptors come in a fixed (name) order");
    for t in tools {
        schema::validate("Tool", t).unwrap_or_else(|e| panic!("{e}: {t}"));
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["inputSchema"]["properties"].is_object(), "{t}");
    }
    let delete = tools.iter().find(|t| t["name"] == "notes_delete").unwrap();
    assert_eq!(
        delete["inputSchema"]["required"],
        json!(["workspaceUri", "title"])
    );
}

// ---------------------------------------------------------------------------------
// notes_delete: the form round and its answers.
// ---------------------------------------------------------------------------------

fn delete_id1_asks_form_with_candidates(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let r = srv.delete_round1(json!(1), "TPS report");
    let res = r.result();
    let req = &res["inputRequests"]["delete_choice"];
    assert_eq!(req["method"], "elicitation/create", "{res}");
    assert_eq!(req["params"]["mode"], "form", "{res}");
    let schema = &req["params"]["requestedSchema"];
    assert_eq!(schema["type"], "object");
    let mut offered: Vec<String> = schema["properties"]["note_id"]["enum"]
        .as_array()
        .expect("note_id enum")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    offered.sort();
    let mut expected = seed.tps.clone();
    expected.sort();
    assert_eq!(offered, expected, "the enum is exactly the 3 candidates");
    assert_eq!(schema["properties"]["note_id"]["type"], "string");
    assert_eq!(schema["properties"]["confirm"]["type"], "boolean");
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["confirm", "note_id"]);
    assert!(res["requestState"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(srv.note_count(), 5, "asking deletes nothing");
}

fn delete_retry_new_id_completes_and_note_is_gone(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    let victim = &seed.tps[2];
    let r = srv.delete_retry(json!(2), "TPS report", accept(victim, true), &state);
    assert_eq!(r.msg()["id"], 2);
    let res = r.result();
    assert_eq!(res["resultType"], "complete", "{res}");
    assert_eq!(res["structuredContent"]["deleted"], json!(victim));
    let ids = srv.note_ids();
    assert_eq!(ids.len(), 4);
    assert!(!ids.contains(victim), "{victim} still listed: {ids:?}");
    for other in seed.tps.iter().take(2) {
        assert!(ids.contains(other));
    }
}

fn prefix_and_encoded_traversal_fail_containment(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    srv.seed();
    let evil = format!("{}-evil/secret.md", fx.notes_uri);
    let cases = [
        evil,
        fx.notes_path("%2e%2e/private.md"),
        fx.notes_path("%2E%2E/private.md"),
        fx.notes_path("%2e%2E/%2e%2e/private.md"),
        fx.notes_path("..%2fprivate.md"),
        fx.notes_path("%2f..%2f..%2fprivate.md"),
        fx.notes_path("sub/%2F..%2F..%2Fprivate.md"),
        fx.notes_path("../private.md"),
    ];
    for (i, uri) in cases.iter().enumerate() {
        for tool in ["notes_delete", "notes_list", "notes_create"] {
            let mut args = json!({"workspaceUri": uri, "title": "TPS report"});
            if tool == "notes_create" {
                args["body"] = json!("x");
            }
            if tool == "notes_list" {
                args.as_object_mut().unwrap().remove("title");
            }
            let r = srv.send(&call(json!(i), tool, args, form()));
            let err = r.expect_error(-32602);
            let msg = err["message"].as_str().unwrap_or_default();
            assert!(
                msg.contains("workspaceUri"),
                "message should name workspaceUri: {msg}"
            );
            assert!(
                msg.contains("not inside any workspace") || msg.contains("encoded"),
                "message should say why: {msg}"
            );
        }
    }
    assert_eq!(srv.note_count(), 5);
}

fn changed_title_cannot_reuse_state(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    let r = srv.delete_retry(json!(2), "Standup", accept(&seed.standup, true), &state);
    let err = r.expect_error(-32602);
    assert!(
        err["message"].as_str().unwrap().contains("requestState"),
        "{err}"
    );
    let r = srv.delete_retry(json!(3), "Ideas", accept(&seed.tps[0], true), &state);
    r.expect_error(-32602);
    assert_eq!(srv.note_count(), 5);
}

fn decline_keeps_note_and_consumes_nonce(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    let r = srv.delete_retry(json!(2), "TPS report", json!({"action": "decline"}), &state);
    let res = r.result();
    assert_eq!(res["resultType"], "complete");
    assert_eq!(res["structuredContent"]["deleted"], Value::Null);
    assert_eq!(srv.note_count(), 5);
    let r = srv.delete_retry(json!(3), "TPS report", accept(&seed.tps[0], true), &state);
    let err = r.expect_error(-32602);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("already been used"),
        "{err}"
    );
    let r = srv.delete_retry(json!(4), "TPS report", json!({"action": "decline"}), &state);
    r.expect_error(-32602);
    assert_eq!(srv.note_count(), 5);
}

fn cancel_mutates_nothing_and_state_stays_usable(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    for id in [2, 3] {
        let r = srv.delete_retry(json!(id), "TPS report", json!({"action": "cancel"}), &state);
        let res = r.result();
        assert_eq!(res["resultType"], "complete");
        assert_eq!(res["structuredContent"]["deleted"], Value::Null);
        assert_eq!(srv.note_count(), 5);
    }
    let r = srv.delete_retry(json!(4), "TPS report", accept(&seed.tps[1], true), &state);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[1])
    );
    assert_eq!(srv.note_count(), 4);
}

fn accept_without_confirm_or_content_deletes_nothing(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    // Missing content is never consent.
    let state = srv.delete_round1(json!(1), "TPS report").state();
    for (i, answer) in [
        json!({"action": "accept"}),
        json!({"action": "accept", "content": null}),
        json!({"action": "accept", "content": {}}),
        json!({"action": "accept", "content": {"note_id": seed.tps[0]}}),
        json!({"action": "accept", "content": {"confirm": true}}),
        json!({"action": "accept", "content": {"note_id": seed.tps[0], "confirm": "yes"}}),
        json!({"action": "accept", "content": {"note_id": seed.tps[0], "confirm": 1}}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.delete_retry(json!(10 + i), "TPS report", answer, &state);
        r.expect_error(-32602);
        assert_eq!(srv.note_count(), 5);
    }
    // confirm: false is an answer, and not a yes.
    let r = srv.delete_retry(json!(2), "TPS report", accept(&seed.tps[0], false), &state);
    let res = r.result();
    assert_eq!(res["resultType"], "complete");
    assert_eq!(res["structuredContent"]["deleted"], Value::Null);
    assert_eq!(srv.note_count(), 5);
}

fn choice_outside_candidates_fails(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    for (i, bad) in [
        seed.standup.as_str(),
        seed.ideas.as_str(),
        "note-999",
        "note-0",
        "x",
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.delete_retry(json!(2 + i), "TPS report", accept(bad, true), &state);
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("candidates"),
            "{err}"
        );
    }
    assert_eq!(srv.note_count(), 5);
    // The state is still good for a real candidate.
    let r = srv.delete_retry(json!(9), "TPS report", accept(&seed.tps[0], true), &state);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[0])
    );
}

fn two_instances_sharing_store_execute_once(kind: Kind) {
    let fx = Fixture::new();
    let a = fx.spawn(kind);
    let b = fx.spawn(kind);
    let seed = a.seed();
    assert_eq!(
        b.note_count(),
        5,
        "b sees a's notes through the shared store"
    );
    let state = a.delete_round1(json!(1), "TPS report").state();
    let r = a.delete_retry(json!(2), "TPS report", accept(&seed.tps[0], true), &state);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[0])
    );
    // b verifies the state (same key) but the nonce is spent.
    let r = b.delete_retry(json!(2), "TPS report", accept(&seed.tps[1], true), &state);
    let err = r.expect_error(-32602);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("already been used"),
        "{err}"
    );
    assert_eq!(a.note_count(), 4);
    assert_eq!(b.note_count(), 4);
}

// ---------------------------------------------------------------------------------
// Per-request capabilities and versions.
// ---------------------------------------------------------------------------------

fn elicitation_capability_forms(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    srv.seed();
    let args = srv.delete_args("TPS report");
    for (i, caps) in [
        json!({"elicitation": {}}),
        json!({"elicitation": {"form": {}}}),
        json!({"elicitation": {"form": {}, "url": {}}}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.send(&call(json!(i), "notes_delete", args.clone(), caps.clone()));
        assert_eq!(r.result()["resultType"], "input_required", "caps {caps}");
    }
    for (i, caps) in [
        json!({"elicitation": {"url": {}}}),
        json!({}),
        json!({"sampling": {}}),
        json!({"elicitation": true}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.send(&call(
            json!(10 + i),
            "notes_delete",
            args.clone(),
            caps.clone(),
        ));
        if let Some(s) = r.status {
            assert_eq!(s, 400);
        }
        let err = r.expect_error(-32021);
        assert_eq!(
            err["data"]["requiredCapabilities"],
            json!({"elicitation": {"form": {}}}),
            "caps {caps}"
        );
    }
    // Only this request's capabilities count: a form-capable round 1 does not make a
    // URL-only retry acceptable.
    let state = srv.delete_round1(json!(20), "TPS report").state();
    let r = srv.send(&retry(
        json!(21),
        "notes_delete",
        args,
        json!({"elicitation": {"url": {}}}),
        json!({"delete_choice": {"action": "decline"}}),
        &state,
    ));
    r.expect_error(-32021);
    assert_eq!(srv.note_count(), 5);
}

fn summarize_without_sampling_is_32021(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    for (i, caps) in [
        json!({}),
        form(),
        json!({"sampling": true}),
        json!({"roots": {}}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.send(&call(
            json!(i),
            "summarize_repo",
            summarize_args(&fx, "developer"),
            caps,
        ));
        if let Some(s) = r.status {
            assert_eq!(s, 400);
        }
        let err = r.expect_error(-32021);
        assert_eq!(err["data"]["requiredCapabilities"], json!({"sampling": {}}));
    }
}

fn unsupported_version_is_32022_with_exact_data(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    for (i, v) in ["2025-11-25", "2099-01-01", "banana", ""]
        .into_iter()
        .enumerate()
    {
        let mut msg = tools_list(json!(i));
        msg["params"]["_meta"][PV] = json!(v);
        let opts = HttpOpts::default().set("MCP-Protocol-Version", v);
        let r = srv.send_with(&msg, opts);
        if let Some(s) = r.status {
            assert_eq!(s, 400);
        }
        let err = r.expect_error(-32022);
        assert_eq!(err["data"], json!({"supported": [VERSION], "requested": v}));
    }
}

fn missing_or_non_string_version_is_32602(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let bad_versions = [
        None,
        Some(json!(20260728)),
        Some(json!(null)),
        Some(json!(["2026-07-28"])),
        Some(json!({"v": "2026-07-28"})),
        Some(json!(true)),
    ];
    for (i, v) in bad_versions.into_iter().enumerate() {
        for method in ["server/discover", "tools/list"] {
            let mut msg = rpc(json!(i), method, json!({}), json!({}));
            match &v {
                None => {
                    msg["params"]["_meta"].as_object_mut().unwrap().remove(PV);
                }
                Some(v) => msg["params"]["_meta"][PV] = v.clone(),
            }
            let r = srv.send(&msg);
            let err = r.expect_error(-32602);
            assert!(
                err["message"].as_str().unwrap().contains("protocolVersion"),
                "{err}"
            );
        }
    }
    // No _meta at all, and no params at all.
    let r = srv.send(&json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list", "params": {}}));
    r.expect_error(-32602);
    let r = srv.send(&json!({"jsonrpc": "2.0", "id": 51, "method": "tools/list"}));
    r.expect_error(-32602);
}

fn notification_gets_no_response(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    srv.seed();
    for method in [
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/whatever",
        "tools/call",
    ] {
        let r = srv.send(&notification(method));
        assert!(
            r.json.is_none(),
            "a notification got a response: {:?}",
            r.json
        );
        assert!(r.raw.is_empty(), "a notification got a body: {:?}", r.raw);
        if let Some(s) = r.status {
            assert_eq!(s, 202, "notification {method}");
        }
    }
    // A would-be destructive call sent without an id does nothing.
    let mut n = call(
        json!(0),
        "notes_delete",
        srv.delete_args("TPS report"),
        form(),
    );
    n.as_object_mut().unwrap().remove("id");
    let r = srv.send(&n);
    assert!(r.json.is_none());
    assert_eq!(srv.note_count(), 5);
}

fn legacy_initialize_is_32601_naming_version(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "legacy", "version": "1"}}});
    let opts = HttpOpts::default()
        .omit("MCP-Protocol-Version")
        .omit("Mcp-Method");
    let r = srv.send_with(&init, opts);
    let err = r.expect_error(-32601);
    assert!(err["message"].as_str().unwrap().contains(VERSION), "{err}");
    if let Some(s) = r.status {
        assert_eq!(s, 404);
    }
    // Even with a modern _meta it is not a modern method.
    let r = srv.send(&rpc(json!(2), "initialize", json!({}), json!({})));
    r.expect_error(-32601);
}

fn unknown_method_is_32601(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    for (i, m) in ["tools/destroy", "resources/list", "prompts/get", "nope"]
        .into_iter()
        .enumerate()
    {
        let r = srv.send(&rpc(
            json!(i),
            m,
            json!({}),
            json!({"name": "x", "uri": "x"}),
        ));
        let err = r.expect_error(-32601);
        assert!(err["message"].as_str().unwrap().contains(m), "{err}");
        if let Some(s) = r.status {
            assert_eq!(s, 404);
        }
    }
}

// ---------------------------------------------------------------------------------
// summarize_repo: three independent requests.
// ---------------------------------------------------------------------------------

fn summarize_args(fx: &Fixture, audience: &str) -> Value {
    json!({"directory": fx.repo_dir.display().to_string(), "audience": audience})
}

fn sampling_prompt(res: &Value, key: &str) -> String {
    let req = &res["inputRequests"][key];
    assert_eq!(req["method"], "sampling/createMessage", "{res}");
    assert_eq!(req["params"]["includeContext"], "none", "{res}");
    assert!(req["params"]["maxTokens"].as_u64().is_some_and(|t| t > 0));
    req["params"]["messages"][0]["content"]["text"]
        .as_str()
        .expect("prompt text")
        .to_owned()
}

fn summarize_three_independent_rounds(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let args = summarize_args(&fx, "developer");
    // id 1: pick_files.
    let r1 = srv.send(&call(json!(1), "summarize_repo", args.clone(), sampling()));
    assert_eq!(r1.msg()["id"], 1);
    let res1 = r1.result();
    assert_eq!(res1["resultType"], "input_required");
    let prompt = sampling_prompt(res1, "pick_files");
    for (rel, _) in REPO_FILES {
        assert!(prompt.contains(rel), "{rel} not offered in: {prompt}");
    }
    assert!(prompt.contains("JSON array"), "{prompt}");
    let state1 = r1.state();
    // id 2: answer pick_files → summary request.
    let picks = json!(["README.md", "src/lib.rs"]);
    let r2 = srv.send(&retry(
        json!(2),
        "summarize_repo",
        args.clone(),
        sampling(),
        json!({"pick_files": model_reply(&picks.to_string())}),
        &state1,
    ));
    assert_eq!(r2.msg()["id"], 2);
    let res2 = r2.result();
    assert_eq!(res2["resultType"], "input_required");
    let prompt2 = sampling_prompt(res2, "summary");
    assert!(
        prompt2.contains("tiny double-entry ledger library"),
        "{prompt2}"
    );
    assert!(prompt2.contains("fn balanced"), "{prompt2}");
    assert!(
        !prompt2.contains("Every transaction must balance"),
        "unpicked file sent"
    );
    let state2 = r2.state();
    assert_ne!(state1, state2);
    // id 3: answer summary → complete.
    let summary = "tinyledger is a small double-entry bookkeeping library.";
    let r3 = srv.send(&retry(
        json!(3),
        "summarize_repo",
        args,
        sampling(),
        json!({"summary": model_reply(summary)}),
        &state2,
    ));
    assert_eq!(r3.msg()["id"], 3);
    let res3 = r3.result();
    assert_eq!(res3["resultType"], "complete", "{res3}");
    assert_ne!(res3["isError"], json!(true));
    let text = res3["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(summary), "{text}");
    assert!(
        text.contains("README.md") && text.contains("src/lib.rs"),
        "{text}"
    );
    assert_eq!(res3["structuredContent"]["files"], picks);
    assert_eq!(res3["structuredContent"]["summary"], summary);
    assert_eq!(res3["structuredContent"]["audience"], "developer");
}

fn summarize_pick_reply_not_json_array_is_32602(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let args = summarize_args(&fx, "developer");
    let state = srv
        .send(&call(json!(1), "summarize_repo", args.clone(), sampling()))
        .state();
    for (i, reply) in [
        "README.md, src/lib.rs",
        "{\"files\": [\"README.md\"]}",
        "\"README.md\"",
        "[\"README.md\"",
        "[1, 2]",
        "[]",
        "[\"missing.md\"]",
        "[\"../secret.txt\"]",
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.send(&retry(
            json!(2 + i),
            "summarize_repo",
            args.clone(),
            sampling(),
            json!({"pick_files": model_reply(reply)}),
            &state,
        ));
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("pick_files"),
            "{err}"
        );
    }
    // A reply that is not a CreateMessageResult at all.
    let r = srv.send(&retry(
        json!(20),
        "summarize_repo",
        args,
        sampling(),
        json!({"pick_files": {"role": "assistant", "content": {"type": "image", "data": "", "mimeType": "image/png"}}}),
        &state,
    ));
    r.expect_error(-32602);
}

fn summarize_changed_audience_is_32602(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let state1 = srv
        .send(&call(
            json!(1),
            "summarize_repo",
            summarize_args(&fx, "developer"),
            sampling(),
        ))
        .state();
    let picks = model_reply("[\"README.md\"]");
    let r = srv.send(&retry(
        json!(2),
        "summarize_repo",
        summarize_args(&fx, "executive"),
        sampling(),
        json!({"pick_files": picks.clone()}),
        &state1,
    ));
    let err = r.expect_error(-32602);
    assert!(
        err["message"].as_str().unwrap().contains("requestState"),
        "{err}"
    );
    // Round 2 too.
    let state2 = srv
        .send(&retry(
            json!(3),
            "summarize_repo",
            summarize_args(&fx, "developer"),
            sampling(),
            json!({"pick_files": picks}),
            &state1,
        ))
        .state();
    let r = srv.send(&retry(
        json!(4),
        "summarize_repo",
        summarize_args(&fx, "executive"),
        sampling(),
        json!({"summary": model_reply("a summary")}),
        &state2,
    ));
    r.expect_error(-32602);
}

// ---------------------------------------------------------------------------------
// Roots migration adapter.
// ---------------------------------------------------------------------------------

fn roots_adapter_asks_roots_list(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let r = srv.send(&call(
        json!(1),
        "notes_list",
        json!({}),
        json!({"roots": {}}),
    ));
    let res = r.result();
    assert_eq!(res["resultType"], "input_required", "{res}");
    assert_eq!(
        res["inputRequests"]["roots"]["method"], "roots/list",
        "{res}"
    );
    assert!(res["requestState"].is_string());
    // Without the roots capability there is no adapter: explicit scope is required.
    let r = srv.send(&call(json!(2), "notes_list", json!({}), json!({})));
    let err = r.expect_error(-32602);
    assert!(
        err["message"].as_str().unwrap().contains("workspaceUri"),
        "{err}"
    );
}

fn roots_select_only_granted_workspaces(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let list = |id: i64, roots: Value| -> Value {
        let state = srv
            .send(&call(
                json!(id),
                "notes_list",
                json!({}),
                json!({"roots": {}}),
            ))
            .state();
        let r = srv.send(&retry(
            json!(id + 1),
            "notes_list",
            json!({}),
            json!({"roots": {}}),
            json!({"roots": {"roots": roots}}),
            &state,
        ));
        let res = r.result().clone();
        assert_eq!(res["resultType"], "complete", "{res}");
        res["structuredContent"].clone()
    };
    // A root equal to the granted workspace plus roots outside every grant.
    let sc = list(
        1,
        json!([
            {"uri": fx.notes_uri, "name": "notes"},
            {"uri": "file:///etc", "name": "etc"},
            {"uri": format!("{}-evil", fx.notes_uri)},
            {"uri": fx.notes_path("%2e%2e/elsewhere")},
            {"uri": "https://example.com/notes"}
        ]),
    );
    assert_eq!(sc["workspaces"], json!([fx.notes_uri]), "{sc}");
    let ids: Vec<&str> = sc["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 5);
    assert!(ids.contains(&seed.standup.as_str()));
    // A root above the grants selects the granted workspaces below it, and no more.
    let sc = list(
        3,
        json!([{"uri": "file:///"}, {"uri": "file:///tmp"}, {"uri": "file:///etc/passwd"}]),
    );
    assert_eq!(
        sc["workspaces"],
        json!([fx.notes_uri, fx.notes2_uri]),
        "{sc}"
    );
    assert_eq!(sc["notes"].as_array().unwrap().len(), 5, "{sc}");
    // Roots outside the grants only (wherever the checkout lives): nothing at all.
    let sc = list(
        5,
        json!([
            {"uri": format!("{}-outside", fx.notes_uri)},
            {"uri": fx.notes_path("..").replace("/notes/..", "/elsewhere")},
            {"uri": "file:///etc/passwd"}
        ]),
    );
    assert_eq!(sc["workspaces"], json!([]), "{sc}");
    assert_eq!(sc["notes"], json!([]), "{sc}");
    // A root narrower than a grant selects nothing either.
    let sc = list(7, json!([{"uri": fx.notes_path("sub")}]));
    assert_eq!(sc["workspaces"], json!([]), "{sc}");
}

both_transports!(
    discover_advertises_tools_without_roots,
    tools_list_is_deterministic_with_descriptors,
    delete_id1_asks_form_with_candidates,
    delete_retry_new_id_completes_and_note_is_gone,
    prefix_and_encoded_traversal_fail_containment,
    changed_title_cannot_reuse_state,
    decline_keeps_note_and_consumes_nonce,
    cancel_mutates_nothing_and_state_stays_usable,
    accept_without_confirm_or_content_deletes_nothing,
    choice_outside_candidates_fails,
    two_instances_sharing_store_execute_once,
    elicitation_capability_forms,
    summarize_without_sampling_is_32021,
    unsupported_version_is_32022_with_exact_data,
    missing_or_non_string_version_is_32602,
    notification_gets_no_response,
    legacy_initialize_is_32601_naming_version,
    unknown_method_is_32601,
    summarize_three_independent_rounds,
    summarize_pick_reply_not_json_array_is_32602,
    summarize_changed_audience_is_32602,
    roots_adapter_asks_roots_list,
    roots_select_only_granted_workspaces,
);
