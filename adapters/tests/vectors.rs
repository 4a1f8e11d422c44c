//! Runs every transcript vector in `adapters/vectors/` against the sans-IO session
//! machine, in process (format: `vectors/README.md`; parsed and matched by
//! `dualera-kit`, the same code the black-box runner uses).
//!
//! In process there is no wire, so parts of a vector that only a wire shows are
//! skipped, each one named in the test's output (`cargo test --test vectors --
//! --nocapture`): steps restricted to other transports, HTTP status and header
//! expectations, headers the host sends, and the HTTP form (status, headers) of
//! scripted upstream answers. Everything else is checked strictly: outputs all of them
//! and in order, and implementation-defined (`"name?"`) fields exactly as written.
//!
//! An upstream answer of HTTP 401/403 is the upstream refusing the request's
//! credentials: it goes to `Session::handle_upstream_denied`, and what the machine did
//! must agree with the vector, which says it where the host sees it: the HTTP status
//! on the host's step that caused the refused request (see `expected_denial`).

use dualera_adapters::jsonrpc::Message;
use dualera_adapters::{
    Config, Denied, Event, PeerStream, RequestId, Session, Timestamp, UpstreamRole,
};
use dualera_kit::format::{self, Dropped, Expected, Input, Step, Transport, Vector};
use dualera_kit::matching::{self, Bindings, Mode};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

struct Runner<'v> {
    vector: &'v Vector,
    sessions: HashMap<String, Session>,
    /// Which session sent each upstream request (by the request id's JSON text).
    owner: HashMap<String, String>,
    /// The step whose input made the machine send each upstream request (same key).
    cause: HashMap<String, usize>,
    bindings: Bindings,
    now: u64,
    /// Parts of the vector that cannot be checked in process.
    skipped: Vec<String>,
}

fn config_from(vector: &Vector) -> Config {
    let mut config = Config::default();
    for (key, value) in &vector.config {
        let n = || value.as_u64().expect("format checked numbers");
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
            "max_upstream_message_bytes" => config.max_upstream_message = n() as usize,
            "id_prefix" => config.id_prefix = value.as_str().unwrap().to_owned(),
            "legacy_versions" => {
                config.legacy_versions = serde_json::from_value(value.clone()).unwrap();
            }
            other => panic!("config key {other} has no machine setting"),
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

/// The wire form of an event and the upstream role, or `None` for driver-only events
/// (not part of vectors).
fn event_json(event: &Event) -> Option<(Value, Option<&'static str>)> {
    Some(match event {
        Event::ToPeer { stream, message } => (
            json!({ "to": "peer", "stream": stream_json(stream), "message": message.to_value() }),
            None,
        ),
        Event::ToPeerBatch { stream, messages } => (
            json!({
                "to": "peer",
                "stream": stream_json(stream),
                "batch": messages.iter().map(Message::to_value).collect::<Vec<_>>(),
            }),
            None,
        ),
        Event::CloseStream { stream } => (
            json!({ "to": "peer", "stream": stream_json(stream), "close": true }),
            None,
        ),
        Event::ToUpstream { role, request } => {
            let role = match role {
                UpstreamRole::Discover => "discover",
                UpstreamRole::Call { .. } => "call",
                UpstreamRole::Listen => "listen",
                UpstreamRole::ToolsRefresh { .. } => "tools-refresh",
            };
            (
                json!({ "to": "upstream", "message": Message::Request(request.clone()).to_value() }),
                Some(role),
            )
        }
        Event::CancelUpstream { id, .. } => {
            (json!({ "to": "upstream", "cancel": id.to_value() }), None)
        }
        Event::DiscoverFetched { .. }
        | Event::RequestFailed { .. }
        | Event::ToolRejected { .. }
        | Event::Observed(_) => return None,
        other => panic!("unknown event {other:?}"),
    })
}

/// One output the machine produced: the session, the wire form, the upstream role.
struct Actual {
    session: String,
    value: Value,
    role: Option<&'static str>,
}

impl Runner<'_> {
    fn ctx(&self, step: &Step) -> String {
        format!("{}.json step {}", self.vector.name, step.index)
    }

    fn skip(&mut self, step: &Step, what: &str) {
        self.skipped.push(format!("step {}: {what}", step.index));
    }

    fn substitute(&self, step: &Step, v: &Value) -> Value {
        self.bindings
            .substitute(v)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ctx(step)))
    }

    fn message(&self, step: &Step, v: &Value) -> Message {
        Message::from_value(self.substitute(step, v))
            .unwrap_or_else(|e| panic!("{}: bad message in vector: {e}", self.ctx(step)))
    }

    fn session(&mut self, name: &str) -> &mut Session {
        let vector = self.vector;
        self.sessions
            .entry(name.to_owned())
            .or_insert_with(|| Session::new(config_from(vector)))
    }

    /// The session that sent upstream request `id` (else the step's own).
    fn owner_of(&self, step: &Step, id: &Value) -> String {
        self.owner
            .get(&id.to_string())
            .cloned()
            .unwrap_or_else(|| step.session.clone())
    }

    /// Feeds the step's input; returns the refusal (as the `error` check sees it) and
    /// the error response a driver sends for it, if any.
    fn feed(&mut self, step: &Step) -> (Result<(), String>, Vec<Actual>) {
        let now = Timestamp::from_millis(self.now);
        let mut driver_outputs = Vec::new();
        let name = step.session.clone();
        let result = match &step.input {
            Input::Peer { message } => {
                let m = self.message(step, message);
                let id = message.get("id").map(|id| self.substitute(step, id));
                match self.session(&name).handle_peer_message(m, now) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        // What a driver sends for a refused request (see
                        // `SessionError::to_response`) is part of the transcript.
                        if let (Some(resp), Some(id)) = (e.to_response(), id) {
                            driver_outputs.push(Actual {
                                session: name.clone(),
                                value: json!({"to": "peer", "stream": {"request": id}, "message": Message::Response(resp).to_value()}),
                                role: None,
                            });
                        }
                        Err(format!("{e:?}"))
                    }
                }
            }
            Input::PeerBatch { messages, bind } => {
                let items = messages
                    .iter()
                    .map(|v| Message::from_value(self.substitute(step, v)))
                    .collect();
                match self.session(&name).handle_peer_batch(items, now) {
                    Ok(outcome) => {
                        if let (Some(b), Some(batch)) = (bind, outcome.batch) {
                            self.bindings.bind(b, json!(batch.0));
                        }
                        match outcome.refused.first() {
                            Some(e) => Err(format!("{e:?}")),
                            None => Ok(()),
                        }
                    }
                    Err(e) => {
                        // A refused batch has no batch id; its stream name is bound to
                        // a stand-in so the driver's answer can be matched.
                        let stream = json!(format!("refused-batch-{}", step.index));
                        if let Some(b) = bind {
                            self.bindings.bind(b, stream.clone());
                        }
                        if let Some(resp) = e.to_response() {
                            driver_outputs.push(Actual {
                                session: name.clone(),
                                value: json!({"to": "peer", "stream": {"batch": stream}, "message": Message::Response(resp).to_value()}),
                                role: None,
                            });
                        }
                        Err(format!("{e:?}"))
                    }
                }
            }
            Input::Upstream { on, message, http } => {
                if http.is_some() {
                    self.skip(step, "the upstream's HTTP status and headers are a wire matter; the machine gets the message");
                }
                let on_id = on.as_ref().map(|v| self.substitute(step, v));
                let target = on_id
                    .clone()
                    .or_else(|| message.get("id").map(|v| self.substitute(step, v)));
                let owner = match &target {
                    Some(id) => self.owner_of(step, id),
                    None => name.clone(),
                };
                let on = on_id.map(|v| RequestId::from_value(&v).expect("on id"));
                let m = self.message(step, message);
                self.session(&owner)
                    .handle_upstream_message(on, m, now)
                    .map_err(|e| format!("{e:?}"))
            }
            Input::UpstreamLost {
                id,
                http: Some(answer),
            } if answer.is_denial() => {
                self.skip(step, "the upstream's WWW-Authenticate and body are a wire matter; the machine sees the refusal");
                let id_value = self.substitute(step, id);
                let owner = self.owner_of(step, &id_value);
                let id = RequestId::from_value(&id_value).expect("denied id");
                let want = self.expected_denial(&id_value, answer.status);
                match self.session(&owner).handle_upstream_denied(&id, now) {
                    Ok(outcome) => {
                        let got = denial_json(&outcome);
                        assert_eq!(
                            got,
                            want,
                            "{}: what the machine did with the refusal (`{outcome:?}`) is not what the vector shows the host",
                            self.ctx(step)
                        );
                        Ok(())
                    }
                    Err(e) => Err(format!("{e:?}")),
                }
            }
            Input::UpstreamLost { id, http } => {
                if http.is_some() {
                    self.skip(step, "the upstream's HTTP status and headers are a wire matter; the machine sees the request lost");
                }
                let id_value = self.substitute(step, id);
                let owner = self.owner_of(step, &id_value);
                let id = RequestId::from_value(&id_value).expect("lost id");
                self.session(&owner)
                    .handle_upstream_lost(&id, now)
                    .map_err(|e| format!("{e:?}"))
            }
            Input::Timer => {
                self.session(&name);
                for s in self.sessions.values_mut() {
                    s.handle_timeout(now);
                }
                Ok(())
            }
            Input::Discover { result } => self
                .session(&name)
                .handle_discover(result.clone())
                .map_err(|e| format!("{e:?}")),
            Input::StandaloneOpened => self
                .session(&name)
                .handle_standalone_opened()
                .map_err(|e| format!("{e:?}")),
            Input::StandaloneClosed => self
                .session(&name)
                .handle_standalone_closed()
                .map_err(|e| format!("{e:?}")),
            Input::Close => {
                self.session(&name).close();
                Ok(())
            }
            Input::Ping => {
                self.session(&name).ping_peer();
                Ok(())
            }
        };
        (result, driver_outputs)
    }

    fn run_step(&mut self, step: &Step) {
        let ctx = self.ctx(step);
        if !step.transports.includes(Transport::InProcess) {
            let only: Vec<_> = step
                .transports
                .listed()
                .unwrap_or_default()
                .iter()
                .map(|t| t.name())
                .collect();
            self.skip(step, &format!("{} only", only.join(", ")));
            return;
        }
        if let Some(at) = step.at {
            self.now = at;
        }
        if step.http.is_some() {
            self.skip(step, "expectation on the HTTP response (status, headers)");
        }
        if !step.host_headers.is_empty() {
            self.skip(step, "headers the host sends (a wire matter)");
        }
        let (result, mut actual) = self.feed(step);
        // A dropped reply is accepted: the machine says so with its dropped kinds
        // (`SessionError::is_dropped`), which a driver answers 202 and otherwise ignores.
        let result = match (step.dropped, result) {
            (Some(kind), Err(e)) => {
                let want = match kind {
                    Dropped::Late => "LateReply",
                    Dropped::Duplicate => "DuplicateReply",
                };
                assert!(
                    e.starts_with(want),
                    "{ctx}: expected the reply dropped as {}, got {e}",
                    kind.name()
                );
                Ok(())
            }
            (Some(kind), Ok(())) => panic!(
                "{ctx}: expected the reply dropped as {}, but the machine took it",
                kind.name()
            ),
            (None, r) => r,
        };
        match (step.error.as_deref(), result) {
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
        let mut names: Vec<String> = self.sessions.keys().cloned().collect();
        names.sort();
        for name in names {
            let session = self.sessions.get_mut(&name).expect("listed");
            while let Some(event) = session.poll_event() {
                if let Event::ToUpstream { request, .. } = &event {
                    let key = request.id.to_value().to_string();
                    self.owner.insert(key.clone(), name.clone());
                    self.cause.insert(key, step.index);
                }
                if let Some((value, role)) = event_json(&event) {
                    actual.push(Actual {
                        session: name.clone(),
                        value,
                        role,
                    });
                }
            }
        }
        self.check_outputs(step, &actual);
        if let Some(want) = step.next_timeout {
            let got = self
                .session(&step.session)
                .poll_timeout()
                .map(Timestamp::as_millis);
            assert_eq!(want, got, "{ctx}: next_timeout");
        }
    }

    fn check_outputs(&mut self, step: &Step, actual: &[Actual]) {
        let ctx = self.ctx(step);
        let listing = || {
            actual
                .iter()
                .map(|a| {
                    format!(
                        "[{}] {}",
                        a.session,
                        serde_json::to_string_pretty(&a.value).unwrap()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        for a in actual {
            for pattern in &step.absent {
                if pattern.session == a.session
                    && self
                        .bindings
                        .matches(&pattern.value, &a.value, Mode::Strict)
                {
                    panic!(
                        "{ctx}: an output the vector says must not appear:\n{}",
                        listing()
                    );
                }
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
        for (i, (e, a)) in step.expect.iter().zip(actual).enumerate() {
            self.check_one(step, i, e, a);
        }
    }

    fn check_one(&mut self, step: &Step, i: usize, e: &Expected, a: &Actual) {
        let ctx = self.ctx(step);
        assert_eq!(
            e.session, a.session,
            "{ctx}: output {i} belongs to another session"
        );
        if let Some(role) = &e.role {
            assert_eq!(
                Some(role.as_str()),
                a.role,
                "{ctx}: output {i}: upstream role"
            );
        }
        if e.http.is_some() {
            self.skip(
                step,
                &format!("HTTP headers of upstream request (output {i})"),
            );
        }
        if let Err(m) = self.bindings.try_match(&e.value, &a.value, Mode::Strict) {
            panic!(
                "{ctx}: output {i} differs {m}\n{}",
                matching::diff(Some(&self.bindings.render(&e.value)), Some(&a.value))
            );
        }
    }
}

impl Runner<'_> {
    /// What the machine must do with a refusal of upstream request `id` (HTTP
    /// `status`), as the vector shows it to the host: a driver relays the refusal to
    /// the host's HTTP request that caused the refused call, and the step that made
    /// that request says so with `http.status`. An `initialize` answered so leaves the
    /// session awaiting `initialize`; a request, forgotten (the host may send it
    /// again); an answer that completed a round, the round waiting for that answer
    /// again. A refusal no host request receives is a lost request.
    fn expected_denial(&self, id: &Value, status: u16) -> Value {
        let Some(step) = self
            .cause
            .get(&id.to_string())
            .map(|i| &self.vector.steps[*i])
        else {
            return json!("Lost");
        };
        let relayed = step
            .http
            .as_ref()
            .and_then(|h| h.status)
            .is_some_and(|s| s.accepts(status, true));
        let Input::Peer { message } = &step.input else {
            return json!("Lost");
        };
        if !relayed {
            return json!("Lost");
        }
        let message = self
            .bindings
            .substitute(message)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ctx(step)));
        match (message.get("method"), message.get("id")) {
            (Some(m), Some(_)) if m == "initialize" => json!("Initialize"),
            (Some(_), Some(legacy)) => json!({ "Request": { "legacy": legacy } }),
            (None, Some(live)) => json!({ "Round": { "live": live } }),
            _ => json!("Lost"),
        }
    }
}

/// A refusal's outcome in the form [`Runner::expected_denial`] derives from a vector.
fn denial_json(outcome: &Denied) -> Value {
    match outcome {
        Denied::Initialize => json!("Initialize"),
        Denied::Request { legacy } => json!({ "Request": { "legacy": legacy.to_value() } }),
        Denied::Round { live, .. } => json!({ "Round": { "live": live.to_value() } }),
        Denied::Lost => json!("Lost"),
        other => json!(format!("{other:?}")),
    }
}

/// Runs one vector; returns the parts it could not check in process.
fn run_vector(vector: &Vector) -> Vec<String> {
    let mut runner = Runner {
        vector,
        sessions: HashMap::new(),
        owner: HashMap::new(),
        cause: HashMap::new(),
        bindings: Bindings::default(),
        now: 0,
        skipped: Vec::new(),
    };
    for step in &vector.steps {
        runner.run_step(step);
    }
    runner.skipped
}

fn vector_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

#[test]
fn all_vectors() {
    let vectors = format::load_dir(&vector_dir()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        vectors.len() >= 20,
        "expected the full vector set, found {}",
        vectors.len()
    );
    let mut rows = BTreeSet::new();
    let mut failed = Vec::new();
    for vector in &vectors {
        rows.insert(vector.row.clone());
        if !vector.transports.includes(Transport::InProcess) {
            println!("{}: not run in process (a wire-only vector)", vector.name);
            continue;
        }
        match std::panic::catch_unwind(|| run_vector(vector)) {
            Ok(skipped) => {
                for s in skipped {
                    println!("{}: not checked in process: {s}", vector.name);
                }
            }
            Err(_) => failed.push(vector.name.clone()),
        }
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
        assert!(rows.contains(row), "no vector for row {row}");
    }
}
