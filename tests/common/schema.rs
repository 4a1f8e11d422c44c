//! Validation of every server response against the 2026-07-28 `schema.json`.
//!
//! [`check_response`] picks the defs that apply to a response (the envelope, the result
//! type for the method, the specific error type for the code) and panics on any
//! violation, so every test that talks to the server gets it for free.

use super::gateway::schema::MODERN_SCHEMA;
use serde_json::Value;

/// Validates `instance` against the 2026-07-28 `$defs/<def>` (compiled once, by the
/// one validator cache of [`super::gateway::schema`]); `Err` lists the violations.
pub(crate) fn validate(def: &str, instance: &Value) -> Result<(), String> {
    super::gateway::schema::validate(MODERN_SCHEMA, def, instance)
}

fn must(def: &str, instance: &Value, context: &str) {
    if let Err(e) = validate(def, instance) {
        panic!(
            "response does not validate against $defs/{def} ({context}): {e}\nresponse: {instance}"
        );
    }
}

/// The envelope and error defs a response must satisfy.
pub(crate) fn defs_for(response: &Value) -> Vec<&'static str> {
    let mut out = Vec::new();
    if response.get("error").is_some() {
        out.push("JSONRPCErrorResponse");
        match response["error"]["code"].as_i64() {
            Some(-32022) => out.push("UnsupportedProtocolVersionError"),
            Some(-32021) => out.push("MissingRequiredClientCapabilityError"),
            Some(-32020) => out.push("HeaderMismatchError"),
            _ => {}
        }
    } else {
        out.push("JSONRPCResultResponse");
    }
    out
}

/// Checks one response the server sent. Panics with the violation when it does not
/// validate.
pub(crate) fn check_response(method: Option<&str>, response: &Value) {
    let context = format!("answer to {}", method.unwrap_or("<unparsed request>"));
    for def in defs_for(response) {
        must(def, response, &context);
    }
    if let Some(result) = response.get("result") {
        if check_task_result(method, result) {
            return;
        }
        let def = match (method, result.get("resultType").and_then(Value::as_str)) {
            (_, Some("input_required")) => {
                assert_eq!(
                    method,
                    Some("tools/call"),
                    "input_required is only allowed on tools/call, prompts/get, resources/read"
                );
                Some("InputRequiredResult")
            }
            (Some("server/discover"), _) => Some("DiscoverResult"),
            (Some("tools/list"), _) => Some("ListToolsResult"),
            (Some("tools/call"), _) => Some("CallToolResult"),
            _ => None,
        };
        let def = def.unwrap_or_else(|| {
            panic!("a result for a request this test harness cannot classify: {response}")
        });
        assert!(
            result.get("resultType").and_then(Value::as_str).is_some(),
            "every 2026-07-28 result carries resultType: {response}"
        );
        must(def, result, &context);
        if def == "InputRequiredResult" {
            assert!(
                result.get("inputRequests").is_some() || result.get("requestState").is_some(),
                "InputRequiredResult needs inputRequests or requestState: {response}"
            );
        }
    }
}

/// The tasks extension's results, which `schema.json` (core only) does not define:
/// checked here against `extensions/tasks/overview.mdx` and SEP-2663 (flat
/// `CreateTaskResult`; `DetailedTask` on `tasks/get`; empty acks). `false` when the
/// result is none of them.
fn check_task_result(method: Option<&str>, result: &Value) -> bool {
    let envelope = |r: &Value| {
        assert!(r["taskId"].is_string(), "task without taskId: {r}");
        let status = r["status"].as_str().unwrap_or_default();
        assert!(
            [
                "working",
                "input_required",
                "completed",
                "failed",
                "cancelled"
            ]
            .contains(&status),
            "bad task status: {r}"
        );
        for key in ["createdAt", "lastUpdatedAt"] {
            assert!(
                r[key].as_str().is_some_and(|t| t.ends_with('Z')),
                "bad {key}: {r}"
            );
        }
        for key in ["ttlMs", "pollIntervalMs"] {
            assert!(r[key].as_u64().is_some_and(|n| n > 0), "bad {key}: {r}");
        }
        for key in ["requestState", "task", "ttl", "pollInterval"] {
            assert!(r.get(key).is_none(), "a task carries no {key}: {r}");
        }
        status.to_owned()
    };
    match (method, result.get("resultType").and_then(Value::as_str)) {
        (Some("tools/call"), Some("task")) => {
            envelope(result);
            for key in ["result", "error", "inputRequests"] {
                assert!(
                    result.get(key).is_none(),
                    "CreateTaskResult carries {key}: {result}"
                );
            }
            true
        }
        (Some("tasks/get"), Some("complete")) => {
            let status = envelope(result);
            assert_eq!(
                result.get("inputRequests").is_some(),
                status == "input_required",
                "{result}"
            );
            assert_eq!(
                result.get("result").is_some(),
                status == "completed",
                "{result}"
            );
            assert_eq!(
                result.get("error").is_some(),
                status == "failed",
                "{result}"
            );
            if let Some(r) = result.get("result") {
                must("CallToolResult", r, "a completed task's result");
            }
            true
        }
        (Some("tasks/update" | "tasks/cancel"), Some("complete")) => {
            for key in ["taskId", "status", "result", "error", "inputRequests"] {
                assert!(
                    result.get(key).is_none(),
                    "a task ack carries {key}: {result}"
                );
            }
            true
        }
        _ => false,
    }
}
