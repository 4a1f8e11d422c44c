//! Runs every reverse-direction transcript vector (`adapters/vectors/reverse/`, format
//! in `vectors/README.md`, `"direction": "reverse"`) against the reverse machine
//! (`dualera_adapters::reverse::LegacySession`), in process, strictly: every output, in
//! order, implementation-defined fields exactly as written.
//!
//! The runner plays the driver:
//!
//! - a session (vector `session`) is one partition: its principal is the session's
//!   name, its minted ids are prefixed with it (but for `main`), its capabilities and `clientInfo` those of the `_meta` of the first host
//!   request it gets (which creates the machine, so that step's outputs start with
//!   `initialize`);
//! - each host request gets its own host key; `{"request": ID}` streams are the host
//!   request with JSON-RPC id `ID`; a host's `notifications/cancelled` is its stream
//!   closing (`handle_host_gone`);
//! - sealing a round state is serializing it as JSON text (`requestState` is that
//!   text); opening it parses it, and a text that does not parse is a state that fails
//!   verification (`OpenedState::Invalid`), as a bad HMAC tag is for the gateway;
//! - the arguments digest is FNV-1a (the gateway uses SHA-256);
//! - an upstream request `lost` with HTTP status 404 is the legacy session expiring
//!   (`handle_upstream_expired` with that request refused); any other `lost`, the
//!   request lost.

use dualera_adapters::jsonrpc::{Message, RequestId, Response};
use dualera_adapters::reverse::{
    Config, Event, HostKey, HostRequest, LegacySession, OpenedState, Partition, RoundState,
};
use dualera_adapters::Timestamp;
use dualera_kit::format::{self, Direction, Input, Step, Transport, Vector};
use dualera_kit::matching::{self, Bindings, Mode};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// FNV-1a 64, hex: a stand-in for the driver's SHA-256.
fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn config_from(vector: &Vector) -> Config {
    let mut config = Config::new(fnv);
    for (key, value) in &vector.config {
        let n = || value.as_u64().expect("format checked numbers");
        match key.as_str() {
            "max_queued" => config.max_queued = n() as usize,
            "max_calls" => config.max_calls = n() as usize,
            "max_input_requests" => config.max_input_requests = n() as usize,
            "max_rounds" => config.max_rounds = n() as u32,
            "retry_wait_ms" => config.retry_wait = Duration::from_millis(n()),
            "ping_interval_ms" => config.ping_interval = Duration::from_millis(n()),
            "initialize_timeout_ms" => config.initialize_timeout = Duration::from_millis(n()),
            "list_ttl_ms" => config.list_ttl = Duration::from_millis(n()),
            "public_cache" => config.public_cache = value.as_bool().expect("a flag"),
            "max_listeners" => config.max_listeners = n() as usize,
            "max_subscriptions" => config.max_subscriptions = n() as usize,
            "id_prefix" => config.id_prefix = value.as_str().expect("text").to_owned(),
            "legacy_versions" => {
                config.legacy_versions = serde_json::from_value(value.clone()).expect("list")
            }
            other => panic!("config key {other} has no machine setting"),
        }
    }
    config
}

struct Runner<'v> {
    vector: &'v Vector,
    sessions: HashMap<String, LegacySession>,
    /// (session, host key) → the host request's JSON-RPC id.
    hosts: HashMap<(String, HostKey), Value>,
    next_host: u64,
    /// Legacy request id (JSON text) → the session that sent it.
    owner: HashMap<String, String>,
    bindings: Bindings,
    now: u64,
}

impl Runner<'_> {
    fn ctx(&self, step: &Step) -> String {
        format!("reverse/{}.json step {}", self.vector.name, step.index)
    }

    fn substitute(&self, step: &Step, v: &Value) -> Value {
        self.bindings
            .substitute(v)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ctx(step)))
    }

    fn owner_of(&self, step: &Step, id: &Value) -> String {
        self.owner
            .get(&id.to_string())
            .cloned()
            .unwrap_or_else(|| step.session.clone())
    }

    fn feed(&mut self, step: &Step) -> Result<(), String> {
        let now = Timestamp::from_millis(self.now);
        let name = step.session.clone();
        match &step.input {
            Input::Peer { message } => {
                let message = self.substitute(step, message);
                let params: Map<String, Value> = message
                    .get("params")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                if !self.sessions.contains_key(&name) {
                    let meta = params.get("_meta").cloned().unwrap_or(Value::Null);
                    let partition = Partition {
                        session: name.clone(),
                        principal: name.clone(),
                        capabilities: meta
                            .get("io.modelcontextprotocol/clientCapabilities")
                            .cloned()
                            .unwrap_or(json!({})),
                        client_info: meta
                            .get("io.modelcontextprotocol/clientInfo")
                            .cloned()
                            .unwrap_or(Value::Null),
                    };
                    let mut config = config_from(self.vector);
                    if name != format::DEFAULT_SESSION {
                        // Each partition mints its own ids, as the gateway's do.
                        config.id_prefix = format!("{}.{name}", config.id_prefix);
                    }
                    let machine = LegacySession::new(config, partition, now);
                    self.sessions.insert(name.clone(), machine);
                }
                let Some(id) = message.get("id").cloned() else {
                    // A host's notifications/cancelled: its request's stream is gone.
                    let cancelled = params.get("requestId").cloned();
                    let key = self
                        .hosts
                        .iter()
                        .find(|((s, _), v)| *s == name && Some(*v) == cancelled.as_ref())
                        .map(|((_, k), _)| *k);
                    if let Some(key) = key {
                        self.sessions
                            .get_mut(&name)
                            .expect("made")
                            .handle_host_gone(key);
                    }
                    return Ok(());
                };
                let state = match params.get("requestState") {
                    None => OpenedState::Absent,
                    Some(Value::String(text)) => match serde_json::from_str::<RoundState>(text) {
                        Ok(state) => OpenedState::Opened(state),
                        Err(_) => OpenedState::Invalid,
                    },
                    Some(_) => OpenedState::Invalid,
                };
                self.next_host += 1;
                let host = HostKey(self.next_host);
                self.hosts.insert((name.clone(), host), id.clone());
                let request = HostRequest {
                    host,
                    id: RequestId::from_value(&id).expect("a host id"),
                    method: message["method"].as_str().expect("a method").to_owned(),
                    params,
                    principal: name.clone(),
                    state,
                };
                self.sessions
                    .get_mut(&name)
                    .expect("made")
                    .handle_host_request(request, now)
                    .map_err(|e| format!("{e:?}"))
            }
            Input::Upstream { on, message, .. } => {
                let on = on.as_ref().map(|v| self.substitute(step, v));
                let target = on
                    .clone()
                    .or_else(|| message.get("id").map(|v| self.substitute(step, v)));
                let owner = match &target {
                    Some(id) => self.owner_of(step, id),
                    None => name,
                };
                let on = on.map(|v| RequestId::from_value(&v).expect("on id"));
                let m = Message::from_value(self.substitute(step, message))
                    .unwrap_or_else(|e| panic!("{}: bad message: {e}", self.ctx(step)));
                self.sessions
                    .get_mut(&owner)
                    .expect("the session exists")
                    .handle_upstream_message(on.as_ref(), m, now)
                    .map_err(|e| format!("{e:?}"))
            }
            Input::UpstreamLost { id, http } => {
                let id_value = self.substitute(step, id);
                let owner = self.owner_of(step, &id_value);
                let id = RequestId::from_value(&id_value).expect("lost id");
                let machine = self.sessions.get_mut(&owner).expect("the session exists");
                if http.as_ref().is_some_and(|a| a.status == 404) {
                    machine.handle_upstream_expired(&[id], now)
                } else {
                    machine.handle_upstream_lost(&id, now)
                }
                .map_err(|e| format!("{e:?}"))
            }
            Input::Timer => {
                for s in self.sessions.values_mut() {
                    s.handle_timeout(now);
                }
                Ok(())
            }
            Input::Close => {
                if let Some(s) = self.sessions.get_mut(&name) {
                    s.close();
                }
                Ok(())
            }
            other => panic!(
                "{}: {} steps mean nothing in the reverse direction",
                self.ctx(step),
                other.kind()
            ),
        }
    }

    fn event_json(&mut self, session: &str, event: Event) -> Option<Value> {
        let stream = |hosts: &HashMap<(String, HostKey), Value>, host: HostKey| json!({ "request": hosts.get(&(session.to_owned(), host)).cloned().unwrap_or(Value::Null) });
        Some(match event {
            Event::ToUpstream { message } => {
                if let Message::Request(r) = &message {
                    self.owner
                        .insert(r.id.to_value().to_string(), session.to_owned());
                }
                json!({ "to": "upstream", "message": message.to_value() })
            }
            Event::ToHost { host, message } => {
                json!({ "to": "peer", "stream": stream(&self.hosts, host), "message": message.to_value() })
            }
            Event::InputRequired {
                host,
                id,
                mut result,
                state,
            } => {
                let sealed = serde_json::to_string(&state).expect("serializable");
                result["requestState"] = Value::String(sealed);
                let message = Message::Response(Response::result(id, result));
                json!({ "to": "peer", "stream": stream(&self.hosts, host), "message": message.to_value() })
            }
            Event::Failed { .. } => return None,
            other => panic!("unknown event {other:?}"),
        })
    }

    fn run_step(&mut self, step: &Step) {
        let ctx = self.ctx(step);
        assert!(
            step.transports.includes(Transport::InProcess),
            "{ctx}: reverse vectors run in process"
        );
        if let Some(at) = step.at {
            self.now = at;
        }
        let result = self.feed(step);
        match (step.error.as_deref(), result) {
            (None, Ok(())) => {}
            (None, Err(e)) => panic!("{ctx}: unexpected error {e}"),
            (Some(want), Ok(())) => panic!("{ctx}: expected error {want}, got Ok"),
            (Some(want), Err(e)) => assert!(e.starts_with(want), "{ctx}: expected {want}, got {e}"),
        }
        let mut names: Vec<String> = self.sessions.keys().cloned().collect();
        names.sort();
        let mut actual = Vec::new();
        for name in names {
            while let Some(event) = self
                .sessions
                .get_mut(&name)
                .and_then(LegacySession::poll_event)
            {
                if let Some(v) = self.event_json(&name, event) {
                    actual.push((name.clone(), v));
                }
            }
        }
        let listing = || {
            actual
                .iter()
                .map(|(s, v)| format!("[{s}] {}", serde_json::to_string_pretty(v).unwrap()))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for (session, a) in &actual {
            for pattern in &step.absent {
                assert!(
                    !(pattern.session == *session
                        && self.bindings.matches(&pattern.value, a, Mode::Strict)),
                    "{ctx}: an output the vector says must not appear:\n{}",
                    listing()
                );
            }
        }
        assert_eq!(
            step.expect.len(),
            actual.len(),
            "{ctx}: expected {} outputs, got {}:\n{}",
            step.expect.len(),
            actual.len(),
            listing()
        );
        for (i, (e, (session, a))) in step.expect.iter().zip(&actual).enumerate() {
            assert_eq!(
                &e.session, session,
                "{ctx}: output {i} belongs to another session"
            );
            if let Err(m) = self.bindings.try_match(&e.value, a, Mode::Strict) {
                panic!(
                    "{ctx}: output {i} differs {m}\n{}",
                    matching::diff(Some(&self.bindings.render(&e.value)), Some(a))
                );
            }
        }
        if let Some(want) = step.next_timeout {
            let got = self
                .sessions
                .get(&step.session)
                .and_then(LegacySession::poll_timeout)
                .map(Timestamp::as_millis);
            assert_eq!(want, got, "{ctx}: next_timeout");
        }
    }
}

fn run_vector(vector: &Vector) {
    let mut runner = Runner {
        vector,
        sessions: HashMap::new(),
        hosts: HashMap::new(),
        next_host: 0,
        owner: HashMap::new(),
        bindings: Bindings::default(),
        now: 0,
    };
    for step in &vector.steps {
        runner.run_step(step);
    }
}

#[test]
fn all_reverse_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors/reverse");
    let vectors = format::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        vectors.len() >= 15,
        "expected the reverse vector set, found {}",
        vectors.len()
    );
    let mut failed = Vec::new();
    for vector in &vectors {
        assert_eq!(
            vector.direction,
            Direction::Reverse,
            "{}: vectors/reverse holds reverse vectors only",
            vector.name
        );
        if std::panic::catch_unwind(|| run_vector(vector)).is_err() {
            failed.push(vector.name.clone());
        }
    }
    assert!(failed.is_empty(), "failing reverse vectors: {failed:?}");
}
