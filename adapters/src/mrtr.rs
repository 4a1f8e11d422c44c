//! Multi Round-Trip Requests, the client side the gateway plays upstream: reading an
//! `input_required` result, collecting one round's answers, and building the retry.
//!
//! `requestState` is carried as the exact string the upstream sent and never parsed,
//! decoded or re-encoded: the retry carries that same string value.

use crate::error::Failure;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The methods on which a server may answer `input_required`.
pub const MRTR_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

/// What kind of result the upstream sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultKind {
    /// `resultType: "complete"`, or no `resultType` at all (earlier servers).
    Complete,
    /// `resultType: "input_required"`.
    InputRequired,
    /// Anything else (kept for the error message).
    Unknown(String),
}

/// Classifies an upstream result by its `resultType`.
pub fn classify(result: &Value) -> ResultKind {
    match result.get("resultType") {
        None => ResultKind::Complete,
        Some(Value::String(s)) if s == "complete" => ResultKind::Complete,
        Some(Value::String(s)) if s == "input_required" => ResultKind::InputRequired,
        Some(Value::String(s)) => ResultKind::Unknown(s.clone()),
        Some(other) => ResultKind::Unknown(other.to_string()),
    }
}

/// One entry of `inputRequests`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest {
    /// The method, e.g. `elicitation/create`.
    pub method: String,
    /// The params (an empty object when absent).
    pub params: Map<String, Value>,
}

/// A parsed `input_required` result.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequired {
    /// The input requests by key, in key order.
    pub requests: BTreeMap<String, InputRequest>,
    /// The opaque state to echo, exactly as sent.
    pub request_state: Option<String>,
}

/// Reads an `input_required` result, taking its state and requests out of it.
pub fn parse_input_required(result: Value) -> Result<InputRequired, Failure> {
    let malformed = |reason| Failure::MalformedInputRequired { reason };
    let Value::Object(mut obj) = result else {
        return Err(malformed("the result is not an object"));
    };
    let request_state = match obj.remove("requestState") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(malformed("requestState is not a string")),
    };
    let mut requests = BTreeMap::new();
    match obj.remove("inputRequests") {
        None => {}
        Some(Value::Object(map)) => {
            for (key, entry) in map {
                let Value::Object(mut entry) = entry else {
                    return Err(malformed("an input request is not an object"));
                };
                let Some(Value::String(method)) = entry.remove("method") else {
                    return Err(malformed("an input request has no method"));
                };
                let params = match entry.remove("params") {
                    None => Map::new(),
                    Some(Value::Object(p)) => p,
                    Some(_) => return Err(malformed("input request params are not an object")),
                };
                requests.insert(key, InputRequest { method, params });
            }
        }
        Some(_) => return Err(malformed("inputRequests is not an object")),
    }
    if requests.is_empty() && request_state.is_none() {
        return Err(malformed("neither inputRequests nor requestState"));
    }
    Ok(InputRequired {
        requests,
        request_state,
    })
}

/// Builds the params of a retry: the original params, plus `inputResponses` (only when
/// the round had input requests) and `requestState` (only when the upstream sent one).
/// Any `inputResponses` / `requestState` in `original` are replaced.
pub fn retry_params(
    original: &Map<String, Value>,
    responses: Option<Map<String, Value>>,
    request_state: Option<&str>,
) -> Map<String, Value> {
    let mut params = original.clone();
    params.remove("inputResponses");
    params.remove("requestState");
    if let Some(responses) = responses {
        params.insert("inputResponses".into(), Value::Object(responses));
    }
    if let Some(state) = request_state {
        params.insert("requestState".into(), Value::String(state.to_owned()));
    }
    params
}

/// The answers collected in one round, keyed like the round's `inputRequests`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Round {
    /// The state to echo on the retry.
    pub request_state: Option<String>,
    /// Keys still waiting for the peer.
    pub pending: BTreeMap<String, crate::RequestId>,
    /// Answers received so far.
    pub responses: Map<String, Value>,
}

impl Round {
    /// Records the answer for `key`; returns whether the round is now complete.
    pub fn answer(&mut self, key: &str, result: Value) -> bool {
        if self.pending.remove(key).is_some() {
            self.responses.insert(key.to_owned(), result);
        }
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifies() {
        assert_eq!(classify(&json!({})), ResultKind::Complete);
        assert_eq!(
            classify(&json!({"resultType": "complete"})),
            ResultKind::Complete
        );
        assert_eq!(
            classify(&json!({"resultType": "input_required"})),
            ResultKind::InputRequired
        );
        assert_eq!(
            classify(&json!({"resultType": "task"})),
            ResultKind::Unknown("task".into())
        );
    }

    #[test]
    fn parses_and_retries() {
        let r = json!({"resultType": "input_required", "requestState": "a\u{e9}b==",
            "inputRequests": {"k": {"method": "roots/list"}}});
        let parsed = parse_input_required(r).unwrap();
        assert_eq!(parsed.requests["k"].method, "roots/list");
        let original: Map<String, Value> =
            serde_json::from_value(json!({"name": "t", "requestState": "forged"})).unwrap();
        let mut answers = Map::new();
        answers.insert("k".into(), json!({"roots": []}));
        let retry = retry_params(&original, Some(answers), parsed.request_state.as_deref());
        assert_eq!(
            Value::Object(retry),
            json!({"name": "t", "inputResponses": {"k": {"roots": []}}, "requestState": "a\u{e9}b=="})
        );
        assert!(parse_input_required(json!({"resultType": "input_required"})).is_err());
        assert!(parse_input_required(json!({"requestState": 1})).is_err());
        assert!(parse_input_required(json!({"inputRequests": {"k": {}}})).is_err());
    }
}
