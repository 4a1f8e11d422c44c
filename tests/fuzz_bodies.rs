//! A table of malformed bodies: each gets a JSON-RPC error (HTTP 4xx on HTTP, an
//! error line on stdio), the process survives, and no note is lost.

mod common;

use common::*;
use serde_json::{json, Value};

const PARSE: i64 = -32700;
const INVALID: i64 = -32600;
const PARAMS: i64 = -32602;
const CAPABILITY: i64 = -32021;
const HEADER: i64 = -32020;

struct Case {
    label: String,
    body: Vec<u8>,
    code: i64,
    /// The code over HTTP, where the mirrored headers are checked before params.
    http_code: i64,
    /// Whether the body is one stdio line (not empty, no newline).
    on_stdio: bool,
}

fn case(label: &str, body: impl Into<Vec<u8>>, code: i64) -> Case {
    let body = body.into();
    let on_stdio = !body.iter().all(u8::is_ascii_whitespace) && !body.contains(&b'\n');
    Case {
        label: label.to_owned(),
        body,
        code,
        http_code: code,
        on_stdio,
    }
}

impl Case {
    fn http(mut self, code: i64) -> Self {
        self.http_code = code;
        self
    }
}

fn v(label: &str, value: Value, code: i64) -> Case {
    case(label, serde_json::to_vec(&value).unwrap(), code)
}

fn good_list() -> Value {
    tools_list(json!(1))
}

/// `good_list()` with `f` applied.
fn list_with(f: impl FnOnce(&mut Value)) -> Value {
    let mut m = good_list();
    f(&mut m);
    m
}

fn cases(fx: &Fixture, state: &str, victim: &str) -> Vec<Case> {
    let good = serde_json::to_string(&good_list()).unwrap();
    let del_args = json!({"workspaceUri": fx.notes_uri, "title": "TPS report"});
    let del = |id: i64, responses: Value, state: Value| -> Value {
        let mut m = retry(
            json!(id),
            "notes_delete",
            del_args.clone(),
            form(),
            responses,
            "",
        );
        m["params"]["requestState"] = state;
        m
    };
    let call_with = |f: &dyn Fn(&mut Value)| -> Value {
        let mut m = call(
            json!(1),
            "notes_list",
            json!({"workspaceUri": fx.notes_uri}),
            json!({}),
        );
        f(&mut m);
        m
    };
    let mut c = vec![
        // Not JSON at all.
        case("empty body", "", PARSE),
        case("whitespace only", "   \t  ", PARSE),
        case("lone brace", "{", PARSE),
        case("truncated request", &good[..good.len() / 2], PARSE),
        case("truncated inside a string", &good[..good.find("2026").unwrap() + 3], PARSE),
        case("missing closing brace", &good[..good.len() - 1], PARSE),
        case("trailing garbage", format!("{good}x"), PARSE),
        case("two objects on one line", format!("{good} {good}"), PARSE),
        case("single quotes", "{'jsonrpc': '2.0', 'id': 1}", PARSE),
        case("bare word", "hello", PARSE),
        case("non-UTF-8 bytes", vec![0xff, 0xfe, 0xfd, 0x00, 0x80], PARSE),
        case(
            "non-UTF-8 inside a string",
            [&b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/"[..], &[0xff, 0xc3], b"\"}"]
                .concat(),
            PARSE,
        ),
        case("UTF-8 BOM before a request", [&b"\xef\xbb\xbf"[..], good.as_bytes()].concat(), PARSE),
        case("NUL byte", "\0", PARSE),
        case("deep nesting of arrays", "[".repeat(10_000), PARSE),
        case("deep nesting of objects", "{\"a\":".repeat(10_000), PARSE),
        case(
            "deep nesting inside params",
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"x\":{}{}}}}}",
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
            PARSE,
        ),
        case(
            "number too large for f64",
            "{\"jsonrpc\":\"2.0\",\"id\":1e400,\"method\":\"tools/list\"}",
            PARSE,
        ),
        // JSON, but not a request object.
        case("null", "null", INVALID),
        case("number", "42", INVALID),
        case("string", "\"tools/list\"", INVALID),
        case("boolean", "true", INVALID),
        case("empty batch", "[]", INVALID),
        case("batch of one request", format!("[{good}]"), INVALID),
        case("batch of two requests", format!("[{good},{good}]"), INVALID),
        case("empty object", "{}", INVALID),
        // Envelope fields of the wrong type.
        v("jsonrpc 1.0", list_with(|m| m["jsonrpc"] = json!("1.0")), INVALID),
        v("jsonrpc as a number", list_with(|m| m["jsonrpc"] = json!(2.0)), INVALID),
        v("jsonrpc null", list_with(|m| m["jsonrpc"] = json!(null)), INVALID),
        v(
            "jsonrpc missing",
            list_with(|m| {
                m.as_object_mut().unwrap().remove("jsonrpc");
            }),
            INVALID,
        ),
        v("null id", list_with(|m| m["id"] = json!(null)), INVALID),
        v("float id", list_with(|m| m["id"] = json!(1.5)), INVALID),
        v("boolean id", list_with(|m| m["id"] = json!(true)), INVALID),
        v("object id", list_with(|m| m["id"] = json!({"n": 1})), INVALID),
        v("array id", list_with(|m| m["id"] = json!([1])), INVALID),
        case(
            "integer id beyond 64 bits",
            good.replacen("\"id\":1", "\"id\":123456789012345678901234567890", 1),
            INVALID,
        ),
        case(
            "negative id beyond i64",
            good.replacen("\"id\":1", "\"id\":-9223372036854775809", 1),
            INVALID,
        ),
        v("method as a number", list_with(|m| m["method"] = json!(5)), INVALID),
        v("method null", list_with(|m| m["method"] = json!(null)), INVALID),
        v("method as an object", list_with(|m| m["method"] = json!({})), INVALID),
        v(
            "method missing",
            list_with(|m| {
                m.as_object_mut().unwrap().remove("method");
            }),
            INVALID,
        ),
        v("params as an array", list_with(|m| m["params"] = json!([])), INVALID),
        v("params as a string", list_with(|m| m["params"] = json!("x")), INVALID),
        v("params as a number", list_with(|m| m["params"] = json!(5)), INVALID),
        v("params null", list_with(|m| m["params"] = json!(null)), INVALID),
        v(
            "notification with array params",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized", "params": []}),
            INVALID,
        ),
        v("notification with null id", json!({"jsonrpc": "2.0", "id": null, "method": "x"}), INVALID),
        // Responses posted as requests.
        v("result response", json!({"jsonrpc": "2.0", "id": 1, "result": {}}), INVALID),
        v(
            "error response",
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "x"}}),
            INVALID,
        ),
        v("result without id", json!({"jsonrpc": "2.0", "result": {}}), INVALID),
        v(
            "result and error",
            json!({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "x"}}),
            INVALID,
        ),
        v("error without code", json!({"jsonrpc": "2.0", "id": 1, "error": {"message": "x"}}), INVALID),
        v("request carrying a result", list_with(|m| m["result"] = json!({})), INVALID),
        // _meta and its fields.
        v("_meta as an array", list_with(|m| m["params"]["_meta"] = json!([])), PARAMS),
        v("_meta as a string", list_with(|m| m["params"]["_meta"] = json!("x")), PARAMS),
        v("_meta null", list_with(|m| m["params"]["_meta"] = json!(null)), PARAMS),
        v("protocolVersion as a number", list_with(|m| m["params"]["_meta"][PV] = json!(20260728)), PARAMS),
        v("protocolVersion null", list_with(|m| m["params"]["_meta"][PV] = json!(null)), PARAMS),
        v("protocolVersion as an object", list_with(|m| m["params"]["_meta"][PV] = json!({})), PARAMS),
        v("clientCapabilities as a string", list_with(|m| m["params"]["_meta"][CAPS] = json!("x")), PARAMS),
        v("clientCapabilities as an array", list_with(|m| m["params"]["_meta"][CAPS] = json!([])), PARAMS),
        v(
            "clientCapabilities missing",
            list_with(|m| {
                m["params"]["_meta"].as_object_mut().unwrap().remove(CAPS);
            }),
            PARAMS,
        ),
        // tools/list and tools/call params.
        v("tools/list unknown cursor", list_with(|m| m["params"]["cursor"] = json!("abc")), PARAMS),
        v("tools/list cursor as a number", list_with(|m| m["params"]["cursor"] = json!(5)), PARAMS),
        v("tool name as a number", call_with(&|m| m["params"]["name"] = json!(5)), PARAMS).http(HEADER),
        v("tool name null", call_with(&|m| m["params"]["name"] = json!(null)), PARAMS).http(HEADER),
        v(
            "tool name missing",
            call_with(&|m| {
                m["params"].as_object_mut().unwrap().remove("name");
            }),
            PARAMS,
        )
        .http(HEADER),
        v("unknown tool", call_with(&|m| m["params"]["name"] = json!("rm_rf")), PARAMS),
        v("arguments as a string", call_with(&|m| m["params"]["arguments"] = json!("x")), PARAMS),
        v("arguments as an array", call_with(&|m| m["params"]["arguments"] = json!([])), PARAMS),
        v("arguments as a number", call_with(&|m| m["params"]["arguments"] = json!(5)), PARAMS),
        v(
            "workspaceUri as a number",
            call_with(&|m| m["params"]["arguments"]["workspaceUri"] = json!(5)),
            PARAMS,
        ),
        v(
            "huge number as query",
            call_with(&|m| m["params"]["arguments"]["query"] = json!(1e308)),
            PARAMS,
        ),
        v(
            "unknown argument",
            call_with(&|m| m["params"]["arguments"]["rm"] = json!(true)),
            PARAMS,
        ),
        v(
            "workspaceUri not a file URI",
            call_with(&|m| m["params"]["arguments"]["workspaceUri"] = json!("https://evil.example.com/notes")),
            PARAMS,
        ),
        v(
            "workspaceUri with a NUL",
            call_with(&|m| m["params"]["arguments"]["workspaceUri"] = json!(format!("{}/%00", fx.notes_uri))),
            PARAMS,
        ),
        // Destructive retries with malformed answers (a genuine state for a genuine note).
        v("inputResponses as a string", del(20, json!("accept"), json!(state)), PARAMS),
        v("inputResponses as an array", del(21, json!([]), json!(state)), PARAMS),
        v("delete_choice as a string", del(22, json!({"delete_choice": "accept"}), json!(state)), PARAMS),
        v("delete_choice null", del(23, json!({"delete_choice": null}), json!(state)), PARAMS),
        v("action as a number", del(24, json!({"delete_choice": {"action": 1}}), json!(state)), PARAMS),
        v("unknown action", del(25, json!({"delete_choice": {"action": "yes"}}), json!(state)), PARAMS),
        v(
            "content as an array",
            del(26, json!({"delete_choice": {"action": "accept", "content": [victim, true]}}), json!(state)),
            PARAMS,
        ),
        v(
            "note_id as a number",
            del(27, json!({"delete_choice": {"action": "accept", "content": {"note_id": 1, "confirm": true}}}), json!(state)),
            PARAMS,
        ),
        v(
            "confirm as a string",
            del(28, json!({"delete_choice": {"action": "accept", "content": {"note_id": victim, "confirm": "true"}}}), json!(state)),
            PARAMS,
        ),
        v("requestState as a number", del(29, json!({"delete_choice": accept(victim, true)}), json!(5)), PARAMS),
        v("requestState as an object", del(30, json!({"delete_choice": accept(victim, true)}), json!({"s": state})), PARAMS),
        v(
            "requestState of the wrong shape",
            del(31, json!({"delete_choice": accept(victim, true)}), json!("a.b.c")),
            PARAMS,
        ),
        v(
            "elicitation capability as a string",
            {
                let mut m = del(32, json!({"delete_choice": accept(victim, true)}), json!(state));
                m["params"]["_meta"][CAPS] = json!({"elicitation": "form"});
                m
            },
            CAPABILITY,
        ),
    ];
    for (i, x) in c.iter_mut().enumerate() {
        x.label = format!("#{i} {}", x.label);
    }
    c
}

fn malformed_bodies_get_errors_and_change_nothing(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let victim = seed.tps[0].clone();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    let table = cases(&fx, &state, &victim);
    assert!(table.len() >= 50, "only {} cases", table.len());
    let mut ran = 0;
    for c in &table {
        if kind == Kind::Stdio && !c.on_stdio {
            continue;
        }
        ran += 1;
        let r = srv.send_raw_answered(&c.body);
        let msg = r
            .json
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no JSON-RPC response ({r:?})", c.label));
        let err = msg
            .get("error")
            .unwrap_or_else(|| panic!("{}: not an error: {msg}", c.label));
        let code = if kind == Kind::Http {
            c.http_code
        } else {
            c.code
        };
        assert_eq!(err["code"], json!(code), "{}: {msg}", c.label);
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            c.label
        );
        if let Some(s) = r.status {
            assert!((400..500).contains(&s), "{}: HTTP {s}", c.label);
        }
        assert!(srv.alive(), "{}: the server died", c.label);
    }
    assert!(ran >= 50, "only {ran} cases ran over {kind:?}");
    assert!(srv.alive());
    assert_eq!(
        srv.send(&discover(json!("after"))).result()["resultType"],
        "complete"
    );
    assert_eq!(srv.note_count(), 5, "a malformed body changed the notes");
    // The genuine state survived every malformed retry (none consumed its nonce).
    let r = srv.delete_retry(json!(99), "TPS report", accept(&victim, true), &state);
    assert_eq!(r.result()["structuredContent"]["deleted"], json!(victim));
    assert_eq!(srv.note_count(), 4);
}

/// A stdio line longer than the body limit is refused with a JSON-RPC error and the
/// server keeps reading.
fn over_long_message_is_refused(kind: Kind) {
    let fx = Fixture::with(Options {
        max_body_bytes: Some(32 * 1024),
        ..Options::default()
    });
    let srv = fx.spawn(kind);
    srv.seed();
    let mut big = call(
        json!(1),
        "notes_create",
        json!({"workspaceUri": fx.notes_uri, "title": "big", "body": "x".repeat(100 * 1024)}),
        json!({}),
    );
    let r = srv.send(&big);
    r.expect_error(INVALID);
    match kind {
        Kind::Http => assert_eq!(r.status, Some(413)),
        Kind::Stdio => assert!(r.message().contains("longer than")),
    }
    big["params"]["arguments"]["body"] = json!("ok");
    assert_eq!(srv.send(&big).result()["resultType"], "complete");
    assert!(srv.alive());
    assert_eq!(srv.note_count(), 6);
}

both_transports!(
    malformed_bodies_get_errors_and_change_nothing,
    over_long_message_is_refused
);

/// The schema check in the harness is not vacuous: known-bad shapes fail it.
#[test]
fn schema_validation_rejects_bad_shapes() {
    let bad_error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": 5}});
    assert!(schema::validate("JSONRPCErrorResponse", &bad_error).is_err());
    let bad_version = json!({"jsonrpc": "2.0", "id": 1,
        "error": {"code": -32022, "message": "m", "data": {"supported": "2026-07-28"}}});
    assert!(schema::validate("UnsupportedProtocolVersionError", &bad_version).is_err());
    let wrong_code = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "m"}});
    assert!(schema::validate("HeaderMismatchError", &wrong_code).is_err());
    let bad_tool_result = json!({"resultType": "complete", "content": [{"type": "text"}]});
    assert!(schema::validate("CallToolResult", &bad_tool_result).is_err());
    let bad_list = json!({"resultType": "complete", "tools": [{"name": "x", "inputSchema": {"type": "string"}}]});
    assert!(schema::validate("ListToolsResult", &bad_list).is_err());
    let bad_input = json!({"resultType": "input_required",
        "inputRequests": {"k": {"method": "sampling/createMessage"}}});
    assert!(schema::validate("InputRequiredResult", &bad_input).is_err());
    let good =
        json!({"resultType": "input_required", "inputRequests": {"r": {"method": "roots/list"}}});
    assert!(schema::validate("InputRequiredResult", &good).is_ok());
    let r = std::panic::catch_unwind(|| schema::check_response(Some("tools/call"), &bad_error));
    assert!(
        r.is_err(),
        "check_response must panic on an invalid response"
    );
}
