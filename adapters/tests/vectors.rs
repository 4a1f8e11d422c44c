//! Runs every transcript vector in `adapters/vectors/` (format: `vectors/README.md`).

use dualera_adapters::jsonrpc::Message;
use dualera_adapters::{Config, Event, PeerStream, RequestId, Session, Timestamp, UpstreamRole};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

struct Runner {
    name: String,
    session: Session,
    bindings: HashMap<String, Value>,
    now: u64,
}

fn config_from(overrides: Option<&Value>) -> Config {
    let mut config = Config::default();
    let Some(Value::Object(o)) = overrides else {
        return config;
    };
    for (key, value) in o {
        let n = || {
            value
                .as_u64()
                .unwrap_or_else(|| panic!("config {key} must be a number"))
        };
        match key.as_str() {
            "max_in_flight" => config.max_in_flight = n() as usize,
            "max_input_requests" => config.max_input_requests = n() as usize,
            "max_rounds" => config.max_rounds = n() as u32,
            "retry_pause_ms" => config.retry_pause = Duration::from_millis(n()),
            "live_timeout_ms" => config.live_timeout = Duration::from_millis(n()),
            "live_timeout_max_ms" => config.live_timeout_max = Duration::from_millis(n()),
            "max_batch_len" => config.max_batch_len = n() as usize,
            "max_subscriptions" => config.max_subscriptions = n() as usize,
            "listen_retry_pause_ms" => config.listen_retry_pause = Duration::from_millis(n()),
            "max_listen_retries" => config.max_listen_retries = n() as u32,
            "id_prefix" => config.id_prefix = value.as_str().unwrap().to_owned(),
            "legacy_versions" => {
                config.legacy_versions = serde_json::from_value(value.clone()).unwrap();
            }
            other => panic!("unknown config key {other}"),
        }
    }
    config
}

fn stream_json(stream: &PeerStream) -> Value {
    match stream {
        PeerStream::Request(id) => json!({ "request": id.to_value() }),
        PeerStream::Batch(b) => json!({ "batch": b.0 }),
        PeerStream::Standalone => json!("standalone"),
    }
}

/// The wire form of an event, or `None` for driver-only events (not part of vectors).
fn event_json(event: &Event) -> Option<Value> {
    Some(match event {
        Event::ToPeer { stream, message } => {
            json!({ "to": "peer", "stream": stream_json(stream), "message": message.to_value() })
        }
        Event::ToPeerBatch { stream, messages } => json!({
            "to": "peer",
            "stream": stream_json(stream),
            "batch": messages.iter().map(Message::to_value).collect::<Vec<_>>(),
        }),
        Event::CloseStream { stream } => {
            json!({ "to": "peer", "stream": stream_json(stream), "close": true })
        }
        Event::ToUpstream { role, request } => {
            let role = match role {
                UpstreamRole::Discover => "discover",
                UpstreamRole::Call { .. } => "call",
                UpstreamRole::Listen => "listen",
                UpstreamRole::ToolsRefresh { .. } => "tools-refresh",
            };
            json!({ "to": "upstream", "role": role, "message": Message::Request(request.clone()).to_value() })
        }
        Event::CancelUpstream { id, .. } => json!({ "to": "upstream", "cancel": id.to_value() }),
        Event::DiscoverFetched { .. }
        | Event::RequestFailed { .. }
        | Event::ToolRejected { .. }
        | Event::Observed(_) => return None,
        other => panic!("unknown event {other:?}"),
    })
}

impl Runner {
    fn substitute(&self, value: &Value) -> Value {
        match value {
            Value::String(s) if s.starts_with("$$") => Value::String(s[1..].to_owned()),
            Value::String(s) if s.starts_with('$') => {
                self.bindings.get(s).cloned().unwrap_or_else(|| {
                    panic!("{}: placeholder {s} used before it was bound", self.name)
                })
            }
            Value::Array(items) => Value::Array(items.iter().map(|v| self.substitute(v)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), self.substitute(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// Matches `actual` against `expected`, binding placeholders; returns a path on mismatch.
    fn matches(&mut self, expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
        match expected {
            Value::String(s) if s.starts_with("$$") => {
                if actual == &Value::String(s[1..].to_owned()) {
                    Ok(())
                } else {
                    Err(path.to_owned())
                }
            }
            Value::String(s) if s == "$_" => Ok(()),
            Value::String(s) if s.starts_with('$') => match self.bindings.get(s) {
                Some(bound) if bound == actual => Ok(()),
                Some(_) => Err(format!("{path} (placeholder {s})")),
                None => {
                    self.bindings.insert(s.clone(), actual.clone());
                    Ok(())
                }
            },
            Value::Object(e) => {
                let Value::Object(a) = actual else {
                    return Err(path.to_owned());
                };
                if e.len() != a.len() || e.keys().any(|k| !a.contains_key(k)) {
                    return Err(format!("{path} (keys differ)"));
                }
                for (k, v) in e {
                    self.matches(v, &a[k], &format!("{path}.{k}"))?;
                }
                Ok(())
            }
            Value::Array(e) => {
                let Value::Array(a) = actual else {
                    return Err(path.to_owned());
                };
                if e.len() != a.len() {
                    return Err(format!("{path} (length differs)"));
                }
                for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                    self.matches(ev, av, &format!("{path}[{i}]"))?;
                }
                Ok(())
            }
            other if other == actual => Ok(()),
            _ => Err(path.to_owned()),
        }
    }

    fn message(&self, value: &Value) -> Message {
        Message::from_value(self.substitute(value))
            .unwrap_or_else(|e| panic!("{}: bad message in vector: {e}", self.name))
    }

    fn run_step(&mut self, index: usize, step: &Value) {
        let ctx = format!("{} step {index}", self.name);
        if let Some(at) = step.get("at").and_then(Value::as_u64) {
            assert!(at >= self.now, "{ctx}: time goes backwards");
            self.now = at;
        }
        let now = Timestamp::from_millis(self.now);
        let from = step["from"]
            .as_str()
            .unwrap_or_else(|| panic!("{ctx}: no from"));
        let result: Result<(), String> = match from {
            "peer" => match &step["message"] {
                Value::Array(items) => {
                    let items = items
                        .iter()
                        .map(|v| Message::from_value(self.substitute(v)))
                        .collect();
                    match self.session.handle_peer_batch(items, now) {
                        Ok(outcome) => {
                            if let (Some(name), Some(b)) =
                                (step.get("batch").and_then(Value::as_str), outcome.batch)
                            {
                                self.bindings.insert(name.to_owned(), json!(b.0));
                            }
                            match outcome.refused.first() {
                                Some(e) => Err(format!("{e:?}")),
                                None => Ok(()),
                            }
                        }
                        Err(e) => Err(format!("{e:?}")),
                    }
                }
                m => {
                    let m = self.message(m);
                    self.session
                        .handle_peer_message(m, now)
                        .map_err(|e| format!("{e:?}"))
                }
            },
            "upstream" => {
                if let Some(denied) = step.get("denied") {
                    let id = RequestId::from_value(&self.substitute(denied)).expect("denied id");
                    match self.session.handle_upstream_denied(&id, now) {
                        Ok(outcome) => {
                            let kind = format!("{outcome:?}");
                            let kind = kind.split([' ', '{']).next().unwrap_or_default();
                            if let Some(want) = step.get("outcome").and_then(Value::as_str) {
                                assert_eq!(kind, want, "{ctx}: denied outcome");
                            }
                            Ok(())
                        }
                        Err(e) => Err(format!("{e:?}")),
                    }
                } else if let Some(lost) = step.get("lost") {
                    let id = RequestId::from_value(&self.substitute(lost)).expect("lost id");
                    self.session
                        .handle_upstream_lost(&id, now)
                        .map_err(|e| format!("{e:?}"))
                } else {
                    let on = step
                        .get("on")
                        .map(|v| RequestId::from_value(&self.substitute(v)).expect("on id"));
                    let m = self.message(&step["message"]);
                    self.session
                        .handle_upstream_message(on, m, now)
                        .map_err(|e| format!("{e:?}"))
                }
            }
            "timer" => {
                self.session.handle_timeout(now);
                Ok(())
            }
            "driver" => match step["action"].as_str().unwrap_or("") {
                "discover" => self
                    .session
                    .handle_discover(step["result"].clone())
                    .map_err(|e| format!("{e:?}")),
                "standalone_opened" => self
                    .session
                    .handle_standalone_opened()
                    .map_err(|e| format!("{e:?}")),
                "standalone_closed" => self
                    .session
                    .handle_standalone_closed()
                    .map_err(|e| format!("{e:?}")),
                "close" => {
                    self.session.close();
                    Ok(())
                }
                "ping" => {
                    self.session.ping_peer();
                    Ok(())
                }
                other => panic!("{ctx}: unknown driver action {other}"),
            },
            other => panic!("{ctx}: unknown from {other}"),
        };
        match (step.get("error").and_then(Value::as_str), result) {
            (None, Ok(())) => {}
            (None, Err(e)) => panic!("{ctx}: unexpected error {e}"),
            (Some(want), Ok(())) => panic!("{ctx}: expected error {want}, got Ok"),
            (Some(want), Err(e)) => assert!(
                e.starts_with(want)
                    && e[want.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| !c.is_alphanumeric()),
                "{ctx}: expected error {want}, got {e}"
            ),
        }
        let mut actual = Vec::new();
        while let Some(event) = self.session.poll_event() {
            actual.extend(event_json(&event));
        }
        let expected = step
            .get("expect")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            expected.len(),
            actual.len(),
            "{ctx}: expected {} outputs, got {}:\n{}",
            expected.len(),
            actual.len(),
            serde_json::to_string_pretty(&actual).unwrap()
        );
        for (i, (e, mut a)) in expected.iter().zip(actual).enumerate() {
            if e.get("role").is_none() {
                if let Value::Object(o) = &mut a {
                    o.remove("role");
                }
            }
            if let Err(path) = self.matches(e, &a, "") {
                panic!(
                    "{ctx}: output {i} differs at {path}\nexpected: {}\nactual:   {}",
                    serde_json::to_string_pretty(e).unwrap(),
                    serde_json::to_string_pretty(&a).unwrap()
                );
            }
        }
        if let Some(want) = step.get("next_timeout") {
            let got = self.session.poll_timeout().map(Timestamp::as_millis);
            assert_eq!(want.as_u64(), got, "{ctx}: next_timeout");
        }
    }
}

fn run_file(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let vector: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    for key in ["description", "row", "steps"] {
        assert!(vector.get(key).is_some(), "{name}: missing {key}");
    }
    let mut runner = Runner {
        name,
        session: Session::new(config_from(vector.get("config"))),
        bindings: HashMap::new(),
        now: 0,
    };
    for (i, step) in vector["steps"].as_array().unwrap().iter().enumerate() {
        runner.run_step(i, step);
    }
}

#[test]
fn all_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 20,
        "expected the full vector set, found {}",
        files.len()
    );
    let mut rows = Map::new();
    let mut failed = Vec::new();
    for file in &files {
        if std::panic::catch_unwind(|| run_file(file)).is_err() {
            failed.push(file.file_name().unwrap().to_string_lossy().into_owned());
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        rows.insert(v["row"].as_str().unwrap().to_owned(), Value::Null);
    }
    assert!(failed.is_empty(), "failing vectors: {failed:?}");
    // Every row of DESIGN.md's era-translation table has at least one vector.
    for row in [
        "initialize",
        "initialized-ping",
        "forward",
        "complete",
        "input-required",
        "peer-error",
        "logging-setlevel",
        "subscribe",
        "cancel",
        "roots-list-changed",
    ] {
        assert!(rows.contains_key(row), "no vector for row {row}");
    }
}
