//! Acceptance tests of the era-translation table (DESIGN.md, "The gateway: era
//! translation"): one test per table row and legacy revision (2025-11-25, 2025-06-18,
//! 2025-03-26), each over real sockets — a legacy host, the `dualera gateway` binary,
//! and upstream either the real `dualera serve` behind a recording hop or a scripted
//! modern server. Every message the gateway sends the host is validated against the
//! 2025-11-25 schema, every message it sends upstream against the 2026-07-28 one.

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use http::StatusCode;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

crate::per_revision!(
    initialize,
    initialized_and_ping_answered_locally,
    forwarding_meta_and_fresh_ids,
    complete_results_are_stripped,
    input_required_elicitation,
    input_required_sampling,
    input_required_roots,
    concurrent_input_entries,
    retry_echoes_request_state_verbatim,
    peer_error_fails_request_without_retry,
    logging_set_level,
    subscribe_listens_upstream_and_notifies_on_get_stream,
    cancelled_and_delete_close_upstream_stream,
    roots_list_changed_accepted_and_roots_asked_afresh,
);

/// Row `initialize`: version negotiated, capabilities mapped from the upstream's
/// discover, upstream serverInfo and instructions, an unguessable session id.
async fn initialize(rev: &str) {
    let rig = Rig::new(&[]).await;
    let direct = modern_post(
        &http_client(),
        &rig.server.url,
        &modern_request(json!(1), "server/discover", json!({}), json!({})),
    )
    .await
    .json();
    let discover = &direct["result"];

    let mut host = rig.legacy();
    let (reply, response) = host.initialize(rev, full_caps(rev)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let result = &response["result"];
    assert_eq!(result["protocolVersion"], rev, "{response}");
    // The notes server offers tools (mapped as they are) and the tasks extension, which
    // is modern only: a legacy host that does not declare `tasks` (these capabilities
    // do not) is not offered tasks. Hosts that declare them: the `task_*` transcript
    // vectors and the interop suite's `tasks` case.
    let mut expected = discover["capabilities"].clone();
    assert!(
        expected["extensions"]["io.modelcontextprotocol/tasks"].is_object(),
        "{direct}"
    );
    expected.as_object_mut().unwrap().remove("extensions");
    assert_eq!(result["capabilities"], expected, "{response}");
    assert!(result["capabilities"].get("tasks").is_none());
    assert_eq!(
        result["serverInfo"],
        json!({"name": discover["_meta"][SERVER_INFO]["name"], "version": discover["_meta"][SERVER_INFO]["version"]}),
    );
    assert_eq!(result["instructions"], discover["instructions"]);
    assert!(result["instructions"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    let sid = host.session.clone().expect("Mcp-Session-Id");
    assert_session_id(&sid);

    // Upstream: one server/discover, modern _meta with the mapped capabilities.
    let d = rig.hop.wait_method("server/discover", 1).await;
    assert_eq!(d[0].meta()[PV], MODERN);
    assert_eq!(d[0].meta()[CAPS], mapped_full_caps(rev));
    assert_eq!(d[0].meta()[CLIENT_INFO]["name"], "legacy-acceptance-host");

    // A second session gets another id; the cached discover answers it.
    let mut other = rig.legacy();
    other.open(rev, json!({})).await;
    let sid2 = other.session.clone().expect("second session id");
    assert_session_id(&sid2);
    assert_ne!(sid, sid2);
}

/// `initialize` with a version the gateway does not speak: the newest legacy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_unsupported_version_gets_newest_legacy() {
    let rig = Rig::new(&[]).await;
    for asked in ["1999-01-01", "2026-07-28", "not-a-version"] {
        let mut host = rig.legacy();
        let result = host.open(asked, json!({})).await;
        assert_eq!(result["protocolVersion"], "2025-11-25", "asked {asked}");
        let r = host.call("tools/list", json!({})).await;
        assert!(r["result"]["tools"].is_array(), "{r}");
    }
}

/// Row `notifications/initialized`, `ping`: answered by the gateway itself.
async fn initialized_and_ping_answered_locally(rev: &str) {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await; // sends notifications/initialized → 202
    let before = rig.hop.seen().len();
    let (id, reply) = host.request("ping", json!({})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"jsonrpc": "2.0", "id": id, "result": {}})
    );
    // A ping without params, string id.
    host.expect_response(&json!("p-1"), "ping");
    let r = host
        .post(&json!({"jsonrpc": "2.0", "id": "p-1", "method": "ping"}))
        .await
        .json();
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": "p-1", "result": {}}));
    assert_eq!(
        host.notify("notifications/initialized", json!({})).await,
        StatusCode::ACCEPTED
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = rig.hop.seen();
    assert_eq!(
        seen.len(),
        before,
        "nothing went upstream: {:?}",
        seen.iter().map(|s| &s.method).collect::<Vec<_>>()
    );
    assert!(seen
        .iter()
        .all(|s| s.method != "ping" && !s.method.starts_with("notifications/")));
}

/// Row "any other request": forwarded as 2026-07-28 with `_meta` (protocolVersion,
/// mapped capabilities, clientInfo, logLevel) and a fresh upstream id.
async fn forwarding_meta_and_fresh_ids(rev: &str) {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;

    let r1 = host
        .call_with_id(
            json!(7),
            "tools/list",
            json!({"_meta": {"progressToken": "tok-1", PV: "1999-01-01"}}),
        )
        .await;
    assert_eq!(r1["id"], 7);
    assert!(r1["result"]["tools"].is_array());
    let first = rig.hop.wait_method("tools/list", 1).await.remove(0);
    assert_ne!(first.id, json!(7), "the upstream id is the gateway's own");
    assert_eq!(
        first.meta()[PV],
        MODERN,
        "the peer cannot choose the modern version"
    );
    assert_eq!(first.meta()[CAPS], mapped_full_caps(rev));
    assert_eq!(
        first.meta()[CLIENT_INFO],
        json!({"name": "legacy-acceptance-host", "version": "2.0.0"})
    );
    assert_eq!(
        first.meta()["progressToken"],
        "tok-1",
        "the peer's own _meta keys are kept"
    );
    assert!(
        first.meta().get(LOG_LEVEL).is_none(),
        "no logLevel before logging/setLevel"
    );
    assert_eq!(first.headers.get("mcp-protocol-version").unwrap(), MODERN);
    assert_eq!(first.headers.get("mcp-method").unwrap(), "tools/list");

    let set = host
        .call("logging/setLevel", json!({"level": "warning"}))
        .await;
    assert_eq!(set["result"], json!({}));

    // The same legacy id again (the first request is finished): a new upstream id.
    let r2 = host.call_with_id(json!(7), "tools/list", json!({})).await;
    assert_eq!(r2["id"], 7);
    let second = rig.hop.wait_method("tools/list", 2).await.remove(1);
    assert_ne!(
        second.id, first.id,
        "every upstream attempt gets a fresh id"
    );
    assert_ne!(second.id, json!(7));
    assert_eq!(second.meta()[LOG_LEVEL], "warning");
    assert_eq!(second.meta()[CAPS], mapped_full_caps(rev));

    // tools/call: same method and params, Mcp-Name mirrored.
    let ws = rig.ws.notes_uri.clone();
    let r3 = host
        .call(
            "tools/call",
            json!({"name": "notes_list", "arguments": {"workspaceUri": ws}}),
        )
        .await;
    assert!(r3["result"]["content"].is_array(), "{r3}");
    let call = rig.hop.wait_method("tools/call", 1).await.remove(0);
    assert_eq!(call.params()["name"], "notes_list");
    assert_eq!(call.params()["arguments"], json!({"workspaceUri": ws}));
    assert_eq!(call.headers.get("mcp-name").unwrap(), "notes_list");
    let mut ids: Vec<String> = rig.hop.seen().iter().map(|s| s.id.to_string()).collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "upstream ids are never reused: {ids:?}");
}

/// Row "upstream answers complete": modern-only fields stripped, legacy id restored.
async fn complete_results_are_stripped(rev: &str) {
    let rig = Rig::new(&[]).await;
    let ws = rig.ws.notes_uri.clone();
    rig.seed("Kept", "body").await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;

    let listed = host.call("tools/list", json!({})).await;
    let upstream = rig.hop.wait_method("tools/list", 1).await.remove(0);
    let modern = upstream.answer.expect("upstream JSON answer");
    assert_eq!(modern["result"]["resultType"], "complete");
    assert!(modern["result"].get("ttlMs").is_some());
    let result = &listed["result"];
    for k in ["resultType", "ttlMs", "cacheScope", "_meta"] {
        assert!(result.get(k).is_none(), "{k} leaked: {listed}");
    }
    let names = |v: &Value| -> Vec<String> {
        v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(result), names(&modern["result"]));
    if rev == "2025-11-25" {
        let mut expected = modern["result"].clone();
        for k in ["resultType", "ttlMs", "cacheScope", "_meta"] {
            expected.as_object_mut().unwrap().remove(k);
        }
        for t in expected["tools"].as_array_mut().unwrap() {
            t.as_object_mut().unwrap().remove("execution");
        }
        assert_eq!(result, &expected, "2025-11-25 sees the tools as they are");
    }
    if rev == "2025-03-26" {
        for t in result["tools"].as_array().unwrap() {
            assert!(
                t.get("title").is_none() && t.get("outputSchema").is_none(),
                "{t}"
            );
        }
    }

    let called = host
        .call(
            "tools/call",
            json!({"name": "notes_list", "arguments": {"workspaceUri": ws}}),
        )
        .await;
    let r = &called["result"];
    assert!(
        r.get("resultType").is_none() && r.get("_meta").is_none(),
        "{called}"
    );
    assert_ne!(r["isError"], true);
    assert!(r["content"][0]["text"].as_str().unwrap().contains("Kept"));
    if rev == "2025-03-26" {
        assert!(
            r.get("structuredContent").is_none(),
            "2025-03-26 has no structuredContent"
        );
    } else {
        assert_eq!(r["structuredContent"]["notes"][0]["title"], "Kept");
    }
}

/// Row "upstream answers input_required" with a form elicitation: a live
/// `elicitation/create` on the request's SSE stream (`mode` stripped for 2025-06-18),
/// the reply retried upstream, the note deleted. 2025-03-26 has no elicitation: the
/// capability gap is a clear error and nothing is deleted.
async fn input_required_elicitation(rev: &str) {
    let rig = Rig::new(&[]).await;
    let ws = rig.ws.notes_uri.clone();
    let a = rig.seed("Doomed", "first").await;
    let b = rig.seed("Doomed", "second").await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let args =
        json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Doomed"}});

    if rev == "2025-03-26" {
        let r = host.call("tools/call", args).await;
        let err = r
            .get("error")
            .unwrap_or_else(|| panic!("a clear error: {r}"));
        assert_eq!(err["code"], -32021, "{r}");
        assert_eq!(
            err["data"]["requiredCapabilities"],
            json!({"elicitation": {"form": {}}})
        );
        assert_eq!(rig.count("Doomed").await, 2, "nothing deleted");
        return;
    }

    let ex = host.exchange("tools/call", args).await;
    assert!(ex.streamed, "live requests need the SSE stream");
    assert_eq!(ex.live.len(), 1, "{:?}", ex.live);
    let live = &ex.live[0];
    assert_eq!(live["method"], "elicitation/create");
    assert!(live["id"].is_string(), "gateway-minted id: {live}");
    assert_eq!(live["params"]["_meta"]["progressToken"], live["id"]);
    let enum_ids = live["params"]["requestedSchema"]["properties"]["note_id"]["enum"].clone();
    assert_eq!(enum_ids, json!([a, b]));
    match rev {
        "2025-06-18" => assert!(
            live["params"].get("mode").is_none(),
            "mode stripped: {live}"
        ),
        _ => assert_eq!(live["params"]["mode"], "form"),
    }
    let r = &ex.response["result"];
    assert_ne!(r["isError"], true, "{}", ex.response);
    assert_eq!(r["structuredContent"]["deleted"], a);
    assert_eq!(rig.count("Doomed").await, 1);

    let calls = rig.hop.seen_method("tools/call");
    assert_eq!(calls.len(), 2);
    let first_answer = calls[0].answer.clone().unwrap();
    assert_eq!(first_answer["result"]["resultType"], "input_required");
    let retry = calls[1].params();
    assert_eq!(
        retry["requestState"],
        first_answer["result"]["requestState"]
    );
    assert_eq!(
        retry["inputResponses"],
        json!({"delete_choice": {"action": "accept", "content": {"note_id": a, "confirm": true}}})
    );
    assert_eq!(retry["name"], "notes_delete");
    assert_eq!(
        retry["arguments"],
        json!({"workspaceUri": ws, "title": "Doomed"})
    );
    assert_ne!(calls[0].id, calls[1].id);
}

/// Row "input_required" with sampling: `summarize_repo`'s two rounds become two live
/// `sampling/createMessage` requests, then the summary.
async fn input_required_sampling(rev: &str) {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let repo = rig.ws.repo.display().to_string();
    let ex = host
        .exchange("tools/call", json!({"name": "summarize_repo", "arguments": {"directory": repo, "audience": "developer"}}))
        .await;
    let methods: Vec<&str> = ex
        .live
        .iter()
        .map(|l| l["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["sampling/createMessage", "sampling/createMessage"]
    );
    assert_ne!(ex.live[0]["id"], ex.live[1]["id"]);
    let r = &ex.response["result"];
    assert_ne!(r["isError"], true, "{}", ex.response);
    let text = serde_json::to_string(r).unwrap();
    assert!(text.contains("double-entry"), "{text}");
    if rev != "2025-03-26" {
        assert_eq!(
            r["structuredContent"]["files"],
            json!(["README.md", "src/lib.rs"])
        );
    }
    let calls = rig.hop.seen_method("tools/call");
    assert_eq!(
        calls.len(),
        3,
        "three attempts: two rounds and the completion"
    );
    for (i, c) in calls.iter().enumerate().skip(1) {
        let before = calls[i - 1].answer.clone().unwrap();
        assert_eq!(c.params()["requestState"], before["result"]["requestState"]);
        let keys: Vec<&String> = c.params()["inputResponses"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        let asked: Vec<&String> = before["result"]["inputRequests"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, asked, "inputResponses use the same keys");
    }
}

/// Row "input_required" with `roots/list` (the notes server's roots adapter).
async fn input_required_roots(rev: &str) {
    let rig = Rig::new(&[]).await;
    // A note, so that even 2025-03-26's text-only result names the workspace.
    rig.seed("Rooted", "found through roots").await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let parent = rig.ws.notes_parent_uri();
    let ex = host
        .exchange_with(
            "tools/call",
            json!({"name": "notes_list", "arguments": {}}),
            |live| {
                assert_eq!(live["method"], "roots/list");
                json!({"jsonrpc": "2.0", "id": live["id"], "result": {"roots": [
                    {"uri": parent, "name": "project"}, {"uri": "file:///etc", "name": "outside"}
                ]}})
            },
        )
        .await;
    assert_eq!(ex.live.len(), 1);
    let text = serde_json::to_string(&ex.response["result"]).unwrap();
    assert!(
        text.contains(&rig.ws.notes_uri),
        "roots selected the granted workspace: {text}"
    );
    assert!(!text.contains("file:///etc"));
    let calls = rig.hop.seen_method("tools/call");
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1].params()["inputResponses"]["roots"]["roots"][0]["uri"],
        json!(parent)
    );
}

fn elicit_form(message: &str) -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": message,
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}})
}

fn sample(text: &str) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 50}})
}

/// Row "input_required": several `inputRequests` entries go to the peer at once, and
/// the retry carries every answer under its key.
async fn concurrent_input_entries(rev: &str) {
    const STATE: &str = "st/1+é\"quoted\"\\ \u{1F600}==";
    let mut requests = json!({"model": sample("capital of France?"), "where": {"method": "roots/list", "params": {}}});
    if rev != "2025-03-26" {
        requests["who"] = elicit_form("Your name?");
    }
    let asked = requests.clone();
    let sc = Scripted::new(&[], json!({"tools": {}}), move |s| {
        if s.params().get("requestState").is_none() {
            Script::Json(input_required(&s.id, Some(asked.clone()), Some(STATE)))
        } else {
            Script::Json(complete(
                &s.id,
                json!({"content": [{"type": "text", "text": "done"}]}),
            ))
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open(rev, full_caps(rev)).await;
    let n = requests.as_object().unwrap().len();
    let (id, reply) = host
        .request(
            "tools/call",
            json!({"name": "multi", "arguments": {"x": 1}}),
        )
        .await;
    let mut stream = reply.sse();
    // Every entry arrives before any answer is given: they are concurrent.
    let mut live = Vec::new();
    while live.len() < n {
        let m = stream.next_message().await.expect("live request");
        assert!(m.get("id").is_some() && m.get("method").is_some(), "{m}");
        live.push(m);
    }
    let mut ids: Vec<String> = live.iter().map(|l| l["id"].to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "distinct gateway-minted ids");
    let mut methods: Vec<&str> = live.iter().map(|l| l["method"].as_str().unwrap()).collect();
    methods.sort_unstable();
    let mut want: Vec<&str> = requests
        .as_object()
        .unwrap()
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    want.sort_unstable();
    assert_eq!(methods, want);
    // Answer in reverse order.
    let mut answers = json!({});
    for l in live.iter().rev() {
        let reply = default_answer(l);
        let key = requests
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, r)| r["method"] == l["method"])
            .map(|(k, _)| k.clone())
            .unwrap();
        answers[key] = reply["result"].clone();
        assert_eq!(host.post(&reply).await.status, StatusCode::ACCEPTED);
    }
    let resp = stream.next_message().await.expect("response");
    assert_eq!(resp["id"], id);
    assert_eq!(resp["result"]["content"][0]["text"], "done");
    assert!(stream.next_message().await.is_none());

    let calls = sc.up.seen_method("tools/call");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].params()["inputResponses"], answers);
    assert_eq!(calls[1].params()["requestState"], STATE);
    assert_eq!(calls[1].params()["arguments"], json!({"x": 1}));
}

/// Row "input_required": `requestState` is echoed byte for byte on every retry (also
/// on a state-only round), with a new id and the original params.
async fn retry_echoes_request_state_verbatim(rev: &str) {
    // Unusual but legal JSON string content: escapes, non-ASCII, padding, slashes.
    const S1: &str = "eyJhIjoxfQ==.\u{00e9}\u{4e2d}\\\"/\t\u{1F512}_-+~";
    const S2: &str = "round-2/\u{0001}\u{007f}\u{2028}end";
    let sc = Scripted::new(
        &[("retry_pause_ms", "50")],
        json!({"tools": {}}),
        move |s| match s.params().get("requestState").and_then(Value::as_str) {
            None => Script::Json(input_required(
                &s.id,
                Some(json!({"q": sample("2+2?")})),
                Some(S1),
            )),
            Some(x) if x == S1 => Script::Json(input_required(&s.id, None, Some(S2))),
            Some(_) => Script::Json(complete(
                &s.id,
                json!({"content": [{"type": "text", "text": "ok"}]}),
            )),
        },
    )
    .await;
    let mut host = sc.legacy();
    host.open(rev, full_caps(rev)).await;
    let params = json!({"name": "stateful", "arguments": {"deep": {"list": [1, "two", null]}}});
    let ex = host.exchange("tools/call", params.clone()).await;
    assert_eq!(
        ex.response["result"]["content"][0]["text"], "ok",
        "{}",
        ex.response
    );
    assert_eq!(ex.live.len(), 1);

    let calls = sc.up.seen_method("tools/call");
    assert_eq!(calls.len(), 3);
    for c in &calls {
        assert_eq!(c.params()["name"], params["name"]);
        assert_eq!(c.params()["arguments"], params["arguments"]);
    }
    assert!(calls[0].params().get("requestState").is_none());
    assert!(calls[0].params().get("inputResponses").is_none());
    let expect_raw = |s: &str| serde_json::to_string(s).unwrap();
    assert_eq!(calls[1].params()["requestState"].as_str(), Some(S1));
    assert!(
        std::str::from_utf8(&calls[1].raw)
            .unwrap()
            .contains(&expect_raw(S1)),
        "the retry carries the state's exact encoding"
    );
    assert!(calls[1].params()["inputResponses"]["q"]["content"]["text"].is_string());
    assert_eq!(calls[2].params()["requestState"].as_str(), Some(S2));
    assert!(
        calls[2].params().get("inputResponses").is_none(),
        "a state-only round has no answers"
    );
    let ids: Vec<String> = calls.iter().map(|c| c.id.to_string()).collect();
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
}

/// Row "replies with a JSON-RPC error to a live request": the legacy request fails with
/// that error and upstream is not retried.
async fn peer_error_fails_request_without_retry(rev: &str) {
    // prompts/get through a scripted upstream: the peer's error comes back as it was.
    let sc = Scripted::new(&[("retry_pause_ms", "50")], json!({"prompts": {}}), |s| {
        Script::Json(input_required(
            &s.id,
            Some(json!({"draft": sample("write a haiku")})),
            Some("s"),
        ))
    })
    .await;
    let mut host = sc.legacy();
    host.open(rev, full_caps(rev)).await;
    let refusal = json!({"code": -1, "message": "User rejected sampling", "data": {"why": "busy"}});
    let err = refusal.clone();
    let ex = host
        .exchange_with(
            "prompts/get",
            json!({"name": "haiku"}),
            move |l| json!({"jsonrpc": "2.0", "id": l["id"], "error": err}),
        )
        .await;
    assert_eq!(ex.response["error"], refusal, "{}", ex.response);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sc.up.seen_method("prompts/get").len(),
        1,
        "upstream not retried"
    );

    // tools/call through the real server: an isError result naming the peer's error.
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let repo = rig.ws.repo.display().to_string();
    let ex = host
        .exchange_with(
            "tools/call",
            json!({"name": "summarize_repo", "arguments": {"directory": repo, "audience": "dev"}}),
            |l| json!({"jsonrpc": "2.0", "id": l["id"], "error": {"code": -32600, "message": "no model available"}}),
        )
        .await;
    let r = &ex.response["result"];
    assert_eq!(r["isError"], true, "{}", ex.response);
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("no model available") && text.contains("-32600"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        rig.hop.seen_method("tools/call").len(),
        1,
        "upstream not retried"
    );
}

/// Row `logging/setLevel`: remembered per session, sent as `_meta` logLevel.
async fn logging_set_level(rev: &str) {
    let rig = Rig::new(&[]).await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let mut other = rig.legacy();
    other.open(rev, full_caps(rev)).await;

    assert_eq!(
        host.call("logging/setLevel", json!({"level": "debug"}))
            .await["result"],
        json!({})
    );
    let bad = host
        .call("logging/setLevel", json!({"level": "loud"}))
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    host.call("tools/list", json!({})).await;
    other.call("tools/list", json!({})).await;
    assert_eq!(
        host.call("logging/setLevel", json!({"level": "error"}))
            .await["result"],
        json!({})
    );
    host.call("tools/list", json!({})).await;

    let lists = rig.hop.wait_method("tools/list", 3).await;
    let levels: Vec<Value> = lists
        .iter()
        .map(|s| s.meta().get(LOG_LEVEL).cloned().unwrap_or(Value::Null))
        .collect();
    let mut sorted: Vec<String> = levels.iter().map(Value::to_string).collect();
    sorted.sort();
    assert_eq!(
        sorted,
        ["\"debug\"", "\"error\"", "null"],
        "per session: {levels:?}"
    );
    assert_eq!(lists[2].meta()[LOG_LEVEL], "error");
    assert!(
        rig.hop.seen_method("logging/setLevel").is_empty(),
        "answered locally"
    );
}

/// Row `resources/subscribe`, GET stream: one upstream `subscriptions/listen`; its
/// notifications go out on the legacy GET stream.
async fn subscribe_listens_upstream_and_notifies_on_get_stream(rev: &str) {
    let caps = json!({"resources": {"subscribe": true, "listChanged": true}, "tools": {"listChanged": true}});
    let sc = Scripted::new(&[], caps, |s| match s.method.as_str() {
        "subscriptions/listen" => Script::Stream(vec![json!({
            "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {SUBSCRIPTION_ID: s.id}, "notifications": s.params()["notifications"]}
        })]),
        _ => Script::Json(complete(&s.id, json!({"contents": []}))),
    })
    .await;
    let mut host = sc.legacy();
    let init = host.open(rev, json!({})).await;
    assert_eq!(
        init["capabilities"],
        json!({"resources": {"subscribe": true, "listChanged": true}, "tools": {"listChanged": true}})
    );
    let mut get = host.get(None).await.sse();
    let uri = "file:///docs/plan.md";
    assert_eq!(
        host.call("resources/subscribe", json!({"uri": uri})).await["result"],
        json!({})
    );

    // The listen whose filter carries the subscription.
    let listen = eventually(WAIT, "subscriptions/listen with the subscription", || {
        sc.up
            .seen_method("subscriptions/listen")
            .into_iter()
            .find(|s| s.params()["notifications"]["resourceSubscriptions"] == json!([uri]))
    })
    .await;
    assert_eq!(listen.params()["notifications"]["toolsListChanged"], true);
    assert_eq!(listen.meta()[PV], MODERN);
    // Any listen opened before it (the GET alone) was closed: one listen per session.
    for earlier in sc.up.seen_method("subscriptions/listen") {
        if earlier.id != listen.id {
            sc.up.wait_closed(&earlier.id).await;
        }
    }
    sc.up.wait_held(&listen.id).await;
    sc.up.push(
        &listen.id,
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
               "params": {"uri": uri, "_meta": {SUBSCRIPTION_ID: listen.id}}}),
    );
    sc.up.push(
        &listen.id,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
               "params": {"_meta": {SUBSCRIPTION_ID: listen.id}}}),
    );
    let n1 = get
        .next_message()
        .await
        .expect("notification on the GET stream");
    assert_eq!(
        n1,
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})
    );
    let n2 = get.next_message().await.expect("second notification");
    assert_eq!(n2["method"], "notifications/tools/list_changed");
    assert!(
        n2.get("params").is_none_or(|p| p.get("_meta").is_none()),
        "{n2}"
    );

    // Unsubscribing changes the filter: the listen is closed upstream.
    assert_eq!(
        host.call("resources/unsubscribe", json!({"uri": uri}))
            .await["result"],
        json!({})
    );
    sc.up.wait_closed(&listen.id).await;
}

/// Rows `notifications/cancelled` and stream closed by DELETE: the upstream response
/// stream is closed (2026-07-28 cancellation).
async fn cancelled_and_delete_close_upstream_stream(rev: &str) {
    let sc = Scripted::new(&[], json!({"tools": {}}), |s| {
        match s.params()["name"].as_str() {
            Some("slow") => Script::Stream(vec![]),
            _ => Script::Json(complete(&s.id, json!({"content": []}))),
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open(rev, full_caps(rev)).await;

    let (id, reply) = host
        .request("tools/call", json!({"name": "slow", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let up = sc.up.wait_method("tools/call", 1).await.remove(0);
    let status = host
        .notify(
            "notifications/cancelled",
            json!({"requestId": id, "reason": "user pressed stop"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    sc.up.wait_closed(&up.id).await;
    let rest = stream.drain().await;
    assert!(
        rest.iter()
            .all(|m| m.get("result").is_none() && m.get("error").is_none()),
        "no response after cancel: {rest:?}"
    );
    // The session goes on.
    assert_eq!(host.call("ping", json!({})).await["result"], json!({}));
    let r = host
        .call("tools/call", json!({"name": "quick", "arguments": {}}))
        .await;
    assert_eq!(r["result"]["content"], json!([]));

    // DELETE with a request in flight: its upstream stream is closed too.
    let (_, reply) = host
        .request("tools/call", json!({"name": "slow", "arguments": {}}))
        .await;
    let mut stream = reply.sse();
    let up = sc.up.wait_method("tools/call", 3).await.remove(2);
    assert_eq!(host.delete().await, StatusCode::OK);
    sc.up.wait_closed(&up.id).await;
    let rest = stream.drain().await;
    assert!(rest.iter().all(|m| m.get("result").is_none()), "{rest:?}");
    let after = host
        .post(&json!({"jsonrpc": "2.0", "id": 99, "method": "ping"}))
        .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
}

/// Row `notifications/roots/list_changed`: accepted; roots are asked afresh in every
/// round, never cached.
async fn roots_list_changed_accepted_and_roots_asked_afresh(rev: &str) {
    let rig = Rig::new(&[]).await;
    rig.seed("Rooted", "found through roots").await;
    let mut host = rig.legacy();
    host.open(rev, full_caps(rev)).await;
    let roots = Arc::new(Mutex::new(
        json!([{"uri": "file:///nowhere", "name": "empty"}]),
    ));
    let answer = |roots: Arc<Mutex<Value>>| {
        move |l: &Value| {
            assert_eq!(l["method"], "roots/list");
            json!({"jsonrpc": "2.0", "id": l["id"], "result": {"roots": roots.lock().unwrap().clone()}})
        }
    };
    let first = host
        .exchange_with(
            "tools/call",
            json!({"name": "notes_list", "arguments": {}}),
            answer(roots.clone()),
        )
        .await;
    assert_eq!(first.live.len(), 1);
    assert!(!serde_json::to_string(&first.response)
        .unwrap()
        .contains(&rig.ws.notes_uri));

    *roots.lock().unwrap() = json!([{"uri": rig.ws.notes_parent_uri(), "name": "project"}]);
    assert_eq!(
        host.notify("notifications/roots/list_changed", json!({}))
            .await,
        StatusCode::ACCEPTED
    );
    let second = host
        .exchange_with(
            "tools/call",
            json!({"name": "notes_list", "arguments": {}}),
            answer(roots.clone()),
        )
        .await;
    assert_eq!(second.live.len(), 1, "roots asked again");
    assert!(serde_json::to_string(&second.response)
        .unwrap()
        .contains(&rig.ws.notes_uri));
    assert!(rig
        .hop
        .seen()
        .iter()
        .all(|s| !s.method.starts_with("notifications/")));
}

// ---------------------------------------------------------------------------------
// Where the revisions differ
// ---------------------------------------------------------------------------------

/// 2025-11-25 URL-mode elicitation: the gateway mints `elicitationId` and tells the
/// peer `notifications/elicitation/complete` once the upstream stops asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_elicitation_2025_11_25() {
    let sc = Scripted::new(&[], json!({"tools": {}}), |s| {
        if s.params().get("inputResponses").is_none() {
            Script::Json(input_required(
                &s.id,
                Some(json!({"login": {"method": "elicitation/create", "params": {
                    "mode": "url", "url": "https://auth.example.com/connect?x=1", "message": "Sign in to continue"}}})),
                Some("url-state"),
            ))
        } else {
            Script::Json(complete(&s.id, json!({"content": [{"type": "text", "text": "signed in"}]})))
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open(
        "2025-11-25",
        json!({"elicitation": {"url": {}, "form": {}}}),
    )
    .await;
    let ex = host
        .exchange_with(
            "tools/call",
            json!({"name": "connect", "arguments": {}}),
            |l| json!({"jsonrpc": "2.0", "id": l["id"], "result": {"action": "accept"}}),
        )
        .await;
    assert_eq!(ex.live.len(), 1);
    let live = &ex.live[0];
    assert_eq!(live["params"]["mode"], "url");
    assert_eq!(
        live["params"]["url"],
        "https://auth.example.com/connect?x=1"
    );
    let eid = live["params"]["elicitationId"]
        .as_str()
        .expect("elicitationId minted")
        .to_owned();
    assert!(!eid.is_empty());
    assert_eq!(
        ex.notifications,
        vec![
            json!({"jsonrpc": "2.0", "method": "notifications/elicitation/complete", "params": {"elicitationId": eid}})
        ]
    );
    assert_eq!(ex.response["result"]["content"][0]["text"], "signed in");
    let calls = sc.up.seen_method("tools/call");
    assert_eq!(
        calls[0].meta()[CAPS],
        json!({"elicitation": {"url": {}, "form": {}}})
    );
    assert_eq!(
        calls[1].params()["inputResponses"],
        json!({"login": {"action": "accept"}})
    );
    assert!(
        !String::from_utf8_lossy(&calls[1].raw).contains(&eid),
        "the elicitationId stays downstream"
    );

    // A 2025-06-18 peer cannot express URL mode: a capability gap, clearly reported.
    let mut old = sc.legacy();
    old.open("2025-06-18", json!({"elicitation": {}})).await;
    let r = old
        .call("tools/call", json!({"name": "connect", "arguments": {}}))
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("elicitation.url"), "{text}");
}

/// 2025-03-26 has no elicitation: an upstream asking for it anyway is a capability gap
/// reported to the peer (tools/call: isError; prompts/get: -32603 with
/// requiredCapabilities), never a live request; upstream not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitation_capability_gap_2025_03_26() {
    let sc = Scripted::new(&[], json!({"tools": {}, "prompts": {}}), |s| {
        Script::Json(input_required(
            &s.id,
            Some(json!({"who": elicit_form("Your name?")})),
            Some("x"),
        ))
    })
    .await;
    let mut host = sc.legacy();
    // Even if the peer claims elicitation, 2025-03-26 cannot carry it.
    host.open("2025-03-26", json!({"elicitation": {}, "sampling": {}}))
        .await;
    let r = host
        .call("tools/call", json!({"name": "ask", "arguments": {}}))
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("elicitation"));
    let p = host.call("prompts/get", json!({"name": "ask"})).await;
    assert_eq!(p["error"]["code"], -32603, "{p}");
    assert_eq!(
        p["error"]["data"]["requiredCapabilities"],
        json!({"elicitation": {"form": {}}})
    );
    let calls = sc.up.seen();
    assert_eq!(calls.iter().filter(|s| s.method == "tools/call").count(), 1);
    assert_eq!(
        calls.iter().filter(|s| s.method == "prompts/get").count(),
        1
    );
    assert!(calls
        .iter()
        .all(|s| s.method == "server/discover" || s.meta()[CAPS].get("elicitation").is_none()));
}

/// 2025-03-26 accepts JSON-RPC batches (answered as one array); later revisions refuse
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_2025_03_26_only() {
    let rig = Rig::new(&[]).await;
    let ws = rig.ws.notes_uri.clone();
    let mut host = rig.legacy();
    host.open("2025-03-26", full_caps("2025-03-26")).await;
    for (id, m) in [(10, "ping"), (11, "tools/list"), (12, "tools/call")] {
        host.expect_response(&json!(id), m);
    }
    let batch = json!([
        {"jsonrpc": "2.0", "id": 10, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "id": 11, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "notes_list", "arguments": {"workspaceUri": ws}}},
    ]);
    let reply = host.post(&batch).await;
    assert_eq!(reply.status, StatusCode::OK);
    let answer = match reply.body {
        Body::Json(v) => v,
        Body::Sse(mut s) => s.next_message().await.expect("batch answer"),
        other => panic!("{other:?}"),
    };
    let items = answer
        .as_array()
        .unwrap_or_else(|| panic!("an array: {answer}"));
    assert_eq!(items.len(), 3);
    let mut ids: Vec<i64> = items.iter().map(|i| i["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [10, 11, 12]);
    assert!(items.iter().all(|i| i.get("result").is_some()), "{answer}");
    // Only notifications: 202.
    let notes = json!([{"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}]);
    assert_eq!(host.post(&notes).await.status, StatusCode::ACCEPTED);

    for rev in ["2025-11-25", "2025-06-18"] {
        let mut later = rig.legacy();
        later.open(rev, json!({})).await;
        let r = later
            .post(&json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{rev}");
        let v = r.json();
        assert_eq!(v["error"]["code"], -32600, "{v}");
    }
}

/// Two legacy requests in flight in one session, each in its own live round: every
/// live request goes out on its own request's stream, and answers given crosswise
/// reach the right round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_in_flight_each_on_its_own_stream() {
    let rig = Rig::new(&[]).await;
    let ws = rig.ws.notes_uri.clone();
    let alpha = rig.seed("Alpha", "a").await;
    let beta = rig.seed("Beta", "b").await;
    let mut host = rig.legacy();
    host.open("2025-11-25", full_caps("2025-11-25")).await;
    let (id_a, ra) = host
        .request(
            "tools/call",
            json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Alpha"}}),
        )
        .await;
    let (id_b, rb) = host
        .request(
            "tools/call",
            json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": "Beta"}}),
        )
        .await;
    let (mut sa, mut sb) = (ra.sse(), rb.sse());
    let la = sa.next_message().await.expect("elicitation for Alpha");
    let lb = sb.next_message().await.expect("elicitation for Beta");
    assert_eq!(
        la["params"]["requestedSchema"]["properties"]["note_id"]["enum"],
        json!([alpha])
    );
    assert_eq!(
        lb["params"]["requestedSchema"]["properties"]["note_id"]["enum"],
        json!([beta])
    );
    assert_ne!(la["id"], lb["id"]);
    // Beta declined first, then Alpha accepted.
    let decline = json!({"jsonrpc": "2.0", "id": lb["id"], "result": {"action": "decline"}});
    assert_eq!(host.post(&decline).await.status, StatusCode::ACCEPTED);
    let rb = sb.next_message().await.expect("Beta's response");
    assert_eq!(rb["id"], id_b);
    assert_eq!(rb["result"]["structuredContent"]["action"], "decline");
    assert_eq!(
        host.post(&default_answer(&la)).await.status,
        StatusCode::ACCEPTED
    );
    let ra = sa.next_message().await.expect("Alpha's response");
    assert_eq!(ra["id"], id_a);
    assert_eq!(ra["result"]["structuredContent"]["deleted"], alpha);
    assert!(sa.next_message().await.is_none() && sb.next_message().await.is_none());
    assert_eq!(rig.count("Alpha").await, 0);
    assert_eq!(rig.count("Beta").await, 1);
}

/// `x-mcp-header` (2026-07-28 Streamable HTTP, "Custom Headers from Tool Parameters"):
/// the gateway is the upstream's client, so it leaves tools with invalid annotations
/// out of `tools/list`, mirrors annotated arguments into `Mcp-Param-*` headers (Base64
/// sentinel when not plain ASCII), and after a `-32020` fetches `tools/list` again and
/// retries once. The scripted upstream checks the headers as a server must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_mcp_header_params_mirrored_and_invalid_tools_left_out() {
    let sql = json!({"type": "object", "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "greeting": {"type": "string", "x-mcp-header": "Greeting"},
        "opts": {"type": "object", "properties": {"limit": {"type": "integer", "x-mcp-header": "Limit"}}},
        "query": {"type": "string"}}});
    let tools = json!([
        {"name": "execute_sql", "inputSchema": sql},
        {"name": "tag_all", "inputSchema": {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string", "x-mcp-header": "Tag"}}}}},
        {"name": "stubborn", "inputSchema": {"type": "object", "properties": {
            "k": {"type": "string", "x-mcp-header": "K"}}}},
    ]);
    let mismatch = |id: &Value| json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32020, "message": "Header mismatch"}});
    let sc = Scripted::new(&[], json!({"tools": {}}), move |s| {
        let header = |n: &str| {
            s.headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        match (s.method.as_str(), s.params()["name"].as_str()) {
            ("tools/list", _) => Script::Json(complete(&s.id, json!({"tools": tools}))),
            ("tools/call", Some("execute_sql")) => {
                let args = &s.params()["arguments"];
                let ok = header("mcp-param-region").as_deref() == args["region"].as_str()
                    && header("mcp-param-greeting").as_deref()
                        == Some("=?base64?SGVsbG8sIOS4lueVjA==?=")
                    && header("mcp-param-limit").as_deref() == Some("42");
                if ok {
                    Script::Json(complete(
                        &s.id,
                        json!({"content": [{"type": "text", "text": "ok"}]}),
                    ))
                } else {
                    Script::Json(mismatch(&s.id))
                }
            }
            _ => Script::Json(mismatch(&s.id)),
        }
    })
    .await;
    let mut host = sc.legacy();
    host.open("2025-11-25", json!({})).await;
    let args = json!({"region": "us-west1", "greeting": "Hello, 世界", "opts": {"limit": 42}, "query": "SELECT 1"});

    // Called before the host ever listed tools: the first attempt has no headers, the
    // upstream refuses it, the gateway lists tools and retries with them.
    let r = host
        .call(
            "tools/call",
            json!({"name": "execute_sql", "arguments": args}),
        )
        .await;
    assert_eq!(r["result"]["content"][0]["text"], "ok", "{r}");
    let calls = sc.up.seen_method("tools/call");
    assert_eq!(calls.len(), 2);
    assert!(calls[0].headers.get("mcp-param-region").is_none());
    assert_eq!(calls[1].headers["mcp-param-region"], "us-west1");
    assert_eq!(calls[1].headers["mcp-param-limit"], "42");
    assert_eq!(sc.up.seen_method("tools/list").len(), 1);

    // The host's own list: the tool with an annotation under `items` is left out.
    let listed = host.call("tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["execute_sql", "stubborn"], "{listed}");

    // Known schema now: headers on the first attempt, no refresh.
    let r = host
        .call(
            "tools/call",
            json!({"name": "execute_sql", "arguments": args}),
        )
        .await;
    assert_eq!(r["result"]["content"][0]["text"], "ok", "{r}");
    assert_eq!(sc.up.seen_method("tools/call").len(), 3);
    assert_eq!(sc.up.seen_method("tools/list").len(), 2);

    // An upstream that keeps refusing: one refresh, one retry, then the host sees -32020.
    let r = host
        .call(
            "tools/call",
            json!({"name": "stubborn", "arguments": {"k": "v"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32020, "{r}");
    let stubborn: Vec<_> = sc
        .up
        .seen_method("tools/call")
        .into_iter()
        .filter(|s| s.params()["name"] == "stubborn")
        .collect();
    assert_eq!(stubborn.len(), 2);
    assert!(stubborn.iter().all(|s| s.headers["mcp-param-k"] == "v"));
    assert_eq!(sc.up.seen_method("tools/list").len(), 3);
}
