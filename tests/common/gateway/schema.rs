//! Schema validation of everything the gateway says: what it sends a legacy peer
//! against the 2025-11-25 `schema.json`, what it sends upstream against the 2026-07-28
//! one. Each `$defs/<X>` is compiled once as `{"$defs": <all>, "$ref": "#/$defs/<X>"}`.

use jsonschema::{Draft, Validator};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The newest legacy revision: every message to a legacy peer must validate here.
pub(crate) const LEGACY_SCHEMA: &str = "2025-11-25";
/// The modern revision: every message sent upstream must validate here.
pub(crate) const MODERN_SCHEMA: &str = "2026-07-28";

type Cache = Mutex<HashMap<(&'static str, String), Arc<Validator>>>;

fn schemas() -> &'static HashMap<&'static str, Value> {
    static S: OnceLock<HashMap<&'static str, Value>> = OnceLock::new();
    S.get_or_init(|| {
        [LEGACY_SCHEMA, MODERN_SCHEMA]
            .into_iter()
            .map(|v| {
                let path = format!(
                    "{}/../shared/spec/{v}/schema.json",
                    env!("CARGO_MANIFEST_DIR")
                );
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
                (v, serde_json::from_str(&text).expect("schema.json is JSON"))
            })
            .collect()
    })
}

fn validator(schema: &'static str, def: &str) -> Arc<Validator> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(v) = cache.lock().unwrap().get(&(schema, def.to_owned())) {
        return v.clone();
    }
    let defs = schemas()[schema]["$defs"].clone();
    assert!(
        defs.get(def).is_some(),
        "{schema} schema.json has no $defs/{def}"
    );
    let wrapped = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": defs,
        "$ref": format!("#/$defs/{def}"),
    });
    let v = Arc::new(
        jsonschema::options()
            .with_draft(Draft::Draft202012)
            .build(&wrapped)
            .unwrap_or_else(|e| panic!("cannot compile {schema} $defs/{def}: {e}")),
    );
    cache
        .lock()
        .unwrap()
        .insert((schema, def.to_owned()), v.clone());
    v
}

/// Validates `instance` against `$defs/<def>` of `schema`; `Err` lists the violations.
pub(crate) fn validate(schema: &'static str, def: &str, instance: &Value) -> Result<(), String> {
    let errors: Vec<String> = validator(schema, def)
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn must(schema: &'static str, def: &str, instance: &Value, what: &str) -> Result<(), String> {
    validate(schema, def, instance).map_err(|e| {
        format!("{what} does not validate against {schema} $defs/{def}: {e}\n{instance}")
    })
}

/// Modern-only fields that must never reach a legacy peer.
fn check_no_modern_leak(msg: &Value) -> Result<(), String> {
    if let Some(result) = msg.get("result") {
        for key in [
            "resultType",
            "ttlMs",
            "cacheScope",
            "inputRequests",
            "requestState",
        ] {
            if result.get(key).is_some() {
                return Err(format!(
                    "result handed to a legacy peer carries {key}: {msg}"
                ));
            }
        }
    }
    for meta in [msg.pointer("/result/_meta"), msg.pointer("/params/_meta")]
        .into_iter()
        .flatten()
    {
        if let Some(m) = meta.as_object() {
            if let Some(k) = m.keys().find(|k| k.starts_with("io.modelcontextprotocol/")) {
                return Err(format!(
                    "reserved modern _meta key {k} sent to a legacy peer: {msg}"
                ));
            }
        }
    }
    Ok(())
}

fn legacy_result_def(method: Option<&str>) -> Option<&'static str> {
    Some(match method? {
        "initialize" => "InitializeResult",
        "tools/list" => "ListToolsResult",
        "tools/call" => "CallToolResult",
        "prompts/get" => "GetPromptResult",
        "prompts/list" => "ListPromptsResult",
        "resources/read" => "ReadResourceResult",
        "resources/list" => "ListResourcesResult",
        "resources/templates/list" => "ListResourceTemplatesResult",
        "completion/complete" => "CompleteResult",
        "ping" | "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe" => {
            "EmptyResult"
        }
        _ => return None,
    })
}

/// Checks one message the gateway sent a legacy peer. `method_of` names the request a
/// response answers (by its id), when the caller knows it.
pub(crate) fn check_downstream(
    msg: &Value,
    method_of: &dyn Fn(&Value) -> Option<String>,
) -> Result<(), String> {
    const S: &str = LEGACY_SCHEMA;
    if let Some(items) = msg.as_array() {
        if items.is_empty() {
            return Err("empty JSON-RPC batch sent to a legacy peer".into());
        }
        for item in items {
            check_downstream(item, method_of)?;
        }
        return Ok(());
    }
    must(S, "JSONRPCMessage", msg, "message to a legacy peer")?;
    check_no_modern_leak(msg)?;
    let method = msg.get("method").and_then(Value::as_str);
    match (method, msg.get("id")) {
        (Some(m), Some(_)) => {
            must(S, "ServerRequest", msg, "request to a legacy peer")?;
            let def = match m {
                "elicitation/create" => "ElicitRequest",
                "sampling/createMessage" => "CreateMessageRequest",
                "roots/list" => "ListRootsRequest",
                "ping" => "PingRequest",
                other => {
                    return Err(format!(
                        "the gateway sent a legacy peer an unexpected request {other}: {msg}"
                    ))
                }
            };
            must(S, def, msg, "request to a legacy peer")
        }
        (Some(m), None) => {
            must(
                S,
                "ServerNotification",
                msg,
                "notification to a legacy peer",
            )?;
            let def = match m {
                "notifications/cancelled" => "CancelledNotification",
                "notifications/progress" => "ProgressNotification",
                "notifications/message" => "LoggingMessageNotification",
                "notifications/resources/updated" => "ResourceUpdatedNotification",
                "notifications/resources/list_changed" => "ResourceListChangedNotification",
                "notifications/tools/list_changed" => "ToolListChangedNotification",
                "notifications/prompts/list_changed" => "PromptListChangedNotification",
                "notifications/elicitation/complete" => "ElicitationCompleteNotification",
                other => {
                    return Err(format!(
                        "unexpected notification {other} sent to a legacy peer: {msg}"
                    ))
                }
            };
            must(S, def, msg, "notification to a legacy peer")
        }
        (None, _) => {
            must(S, "JSONRPCResponse", msg, "response to a legacy peer")?;
            if msg.get("error").is_some() {
                return must(
                    S,
                    "JSONRPCErrorResponse",
                    msg,
                    "error response to a legacy peer",
                );
            }
            must(
                S,
                "JSONRPCResultResponse",
                msg,
                "result response to a legacy peer",
            )?;
            let result = &msg["result"];
            must(S, "ServerResult", result, "result to a legacy peer")?;
            let m = msg.get("id").and_then(method_of);
            if let Some(def) = legacy_result_def(m.as_deref()) {
                must(
                    S,
                    def,
                    result,
                    &format!("result of {}", m.unwrap_or_default()),
                )?;
            }
            Ok(())
        }
    }
}

/// Compiles every validator the checks use (once per test binary).
pub(crate) fn warm_up() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for def in [
            "JSONRPCMessage",
            "ServerRequest",
            "ServerNotification",
            "JSONRPCResponse",
            "JSONRPCErrorResponse",
            "JSONRPCResultResponse",
            "ServerResult",
            "ElicitRequest",
            "CreateMessageRequest",
            "ListRootsRequest",
            "PingRequest",
            "CancelledNotification",
            "ProgressNotification",
            "LoggingMessageNotification",
            "ResourceUpdatedNotification",
            "ResourceListChangedNotification",
            "ToolListChangedNotification",
            "PromptListChangedNotification",
            "ElicitationCompleteNotification",
            "InitializeResult",
            "ListToolsResult",
            "CallToolResult",
            "GetPromptResult",
            "ListPromptsResult",
            "ReadResourceResult",
            "ListResourcesResult",
            "ListResourceTemplatesResult",
            "CompleteResult",
            "EmptyResult",
        ] {
            validator(LEGACY_SCHEMA, def);
        }
        for def in [
            "JSONRPCMessage",
            "JSONRPCRequest",
            "ClientRequest",
            "ClientNotification",
            "RequestMetaObject",
            "DiscoverRequest",
            "ListToolsRequest",
            "CallToolRequest",
            "GetPromptRequest",
            "ListPromptsRequest",
            "ReadResourceRequest",
            "ListResourcesRequest",
            "ListResourceTemplatesRequest",
            "SubscriptionsListenRequest",
            "CompleteRequest",
        ] {
            validator(MODERN_SCHEMA, def);
        }
    });
}

fn modern_request_def(method: &str) -> Option<&'static str> {
    Some(match method {
        "server/discover" => "DiscoverRequest",
        "tools/list" => "ListToolsRequest",
        "tools/call" => "CallToolRequest",
        "prompts/get" => "GetPromptRequest",
        "prompts/list" => "ListPromptsRequest",
        "resources/read" => "ReadResourceRequest",
        "resources/list" => "ListResourcesRequest",
        "resources/templates/list" => "ListResourceTemplatesRequest",
        "subscriptions/listen" => "SubscriptionsListenRequest",
        "completion/complete" => "CompleteRequest",
        _ => return None,
    })
}

/// Checks one message the gateway sent upstream (a 2026-07-28 request or
/// notification).
pub(crate) fn check_upstream(msg: &Value) -> Result<(), String> {
    const S: &str = MODERN_SCHEMA;
    must(S, "JSONRPCMessage", msg, "message sent upstream")?;
    let method = msg.get("method").and_then(Value::as_str);
    match (method, msg.get("id")) {
        (Some(m), Some(_)) => {
            must(S, "JSONRPCRequest", msg, "request sent upstream")?;
            // DESIGN.md forwards "any other request" with the same method: a method
            // 2026-07-28 does not define (a peer's typo, an extension) is not a
            // ClientRequest, and the upstream answers it -32601. Defined methods must
            // match their request type exactly.
            if let Some(def) = modern_request_def(m) {
                must(S, "ClientRequest", msg, "request sent upstream")?;
                must(S, def, msg, "request sent upstream")?;
            }
            must(
                S,
                "RequestMetaObject",
                &msg["params"]["_meta"],
                "_meta of a request sent upstream",
            )
        }
        (Some(_), None) => must(S, "ClientNotification", msg, "notification sent upstream"),
        (None, _) => Err(format!("the gateway sent a response upstream: {msg}")),
    }
}
