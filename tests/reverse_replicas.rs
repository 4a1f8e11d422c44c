//! The reverse bridge across replicas: two `dualera gateway` replicas sharing a real
//! Redis (`--session-store`, `--advertise-url`) and the state keys, behind a real
//! HAProxy (round-robin, no stickiness), in front of the Python SDK's FastMCP legacy
//! server (mcp 1.30.0, `tests/interop/py/legacy_server.py`).
//!
//! A round is held by the replica whose partition task opened the legacy session; a
//! retry landing on the other replica is forwarded to it over HTTP, to the address it
//! registered in Redis:
//!
//! - a multi-round journey through HAProxy completes, and the replicas' own metrics
//!   show that retries were forwarded;
//! - an SSE answer (log lines before the result) comes back through the forwarder;
//! - the owner killed with SIGKILL mid-round: the retry is `sessionLost` (-32602) in
//!   under 5 s, and a fresh call then works.

mod common;
#[path = "common/legacy_server.rs"]
mod legacy_server;
#[path = "common/modern_host.rs"]
mod modern_host;

use common::gateway::replicas::{free_port, HaProxy, RedisServer};
use legacy_server::PyServer;
use modern_host::{call, get, post, text, Gateway};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Two replicas, their Redis and their balancer, in front of one legacy server.
struct Pair {
    _py: PyServer,
    _redis: RedisServer,
    gateways: Vec<Option<Gateway>>,
    lb: HaProxy,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn start() -> Self {
        let py = PyServer::spawn("streamable-http");
        let redis = RedisServer::start();
        let dir = tempfile::Builder::new()
            .prefix("dualera-reverse-replicas-")
            .tempdir()
            .expect("config dir");
        let config = dir.path().join("dualera.toml");
        // The same state keys on every replica: each verifies what the other sealed.
        std::fs::write(
            &config,
            "[state]\nttl_ms = 60000\n\n[[state.keys]]\nid = \"k1\"\nsecret = \"0123456789abcdef0123\"\n",
        )
        .expect("write config");
        let upstream = py.url("/mcp");
        let store = redis.url();
        let gateways: Vec<Option<Gateway>> = (0..2)
            .map(|_| {
                let listen = format!("127.0.0.1:{}", free_port());
                let advertise = format!("http://{listen}");
                Some(Gateway::spawn_on(
                    &listen,
                    &[
                        "--upstream",
                        &upstream,
                        "--session-store",
                        &store,
                        "--advertise-url",
                        &advertise,
                        "--config",
                        &config.display().to_string(),
                        "--admin",
                        "127.0.0.1:0",
                    ],
                ))
            })
            .collect();
        let backends: Vec<String> = gateways
            .iter()
            .flatten()
            .map(|g| g.addr.to_string())
            .collect();
        let lb = HaProxy::start(&backends);
        Self {
            _py: py,
            _redis: redis,
            gateways,
            lb,
            _dir: dir,
        }
    }

    fn url(&self, i: usize) -> String {
        self.gateways[i].as_ref().expect("alive").url()
    }

    /// Replica `i`'s `/metrics`.
    async fn metrics(&self, i: usize) -> String {
        let admin = self.gateways[i].as_ref().expect("alive").listening("admin");
        get(&format!("http://{admin}/metrics")).await.1
    }

    /// Replica `i`'s count of bridge requests of `tools/call` that ended in `outcome`.
    async fn calls(&self, i: usize, outcome: &str) -> u64 {
        let needle = format!(
            r#"dualera_bridge_requests_total{{route="/mcp",mcp_method_name="tools/call",outcome="{outcome}"}} "#
        );
        self.metrics(i)
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&needle))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }

    /// Waits until both replicas registered their address (their first refresh).
    async fn registered(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = self._redis.int(&[
                "EVAL",
                "return #redis.call('KEYS', ARGV[1])",
                "0",
                "dualera:r:*",
            ]);
            if n >= 2 {
                return;
            }
            assert!(Instant::now() < deadline, "{n} replicas registered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The one input request of an `input_required` answer: its key, method, and the
/// round's `requestState`.
fn round(answer: &Value) -> (String, String, String) {
    let result = &answer["result"];
    assert_eq!(result["resultType"], "input_required", "{answer}");
    let requests = result["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{answer}");
    let (key, request) = requests.iter().next().expect("one input request");
    (
        key.clone(),
        request["method"].as_str().unwrap_or_default().to_owned(),
        result["requestState"]
            .as_str()
            .expect("requestState")
            .to_owned(),
    )
}

fn retry(id: i64, name: &str, arguments: Value, responses: Value, state: &str) -> Value {
    let mut v = call(id, name, arguments);
    v["params"]["inputResponses"] = responses;
    v["params"]["requestState"] = json!(state);
    v
}

/// The host's answer to one input request.
fn respond(method: &str) -> Value {
    match method {
        "elicitation/create" => json!({ "action": "accept", "content": { "answer": "north" } }),
        "sampling/createMessage" => json!({
            "role": "assistant",
            "content": { "type": "text", "text": "sampled-text" },
            "model": "test-model"
        }),
        "roots/list" => json!({ "roots": [{ "uri": "file:///work/a" }] }),
        other => panic!("unexpected input request {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journey_through_haproxy_reaches_its_rounds_on_either_replica() {
    let pair = Pair::start();
    pair.registered().await;
    let lb = pair.lb.url();
    let args = json!({ "topic": "trip" });
    let (status, answers) = post(&lb, &[], &call(1, "journey", args.clone())).await;
    assert_eq!(status, 200, "{answers:?}");
    let mut answer = answers[0].clone();
    let mut methods = Vec::new();
    let mut id = 1;
    while answer["result"]["resultType"] == "input_required" {
        let (key, method, state) = round(&answer);
        methods.push(method.clone());
        id += 1;
        let responses = json!({ key: respond(&method) });
        let (status, answers) = post(
            &lb,
            &[],
            &retry(id, "journey", args.clone(), responses, &state),
        )
        .await;
        assert_eq!(status, 200, "{answers:?}");
        assert_eq!(answers.len(), 1, "{answers:?}");
        answer = answers[0].clone();
        assert_eq!(answer["id"], id, "{answer}");
        assert!(methods.len() <= 3, "{methods:?}");
    }
    assert_eq!(
        methods,
        ["elicitation/create", "sampling/createMessage", "roots/list"]
    );
    assert_eq!(
        text(&answer),
        "journey: answer=north; sampled=sampled-text; roots=file:///work/a"
    );
    // Round-robin sends consecutive requests to alternate replicas: of the three
    // retries, those landing on the replica that does not hold the round were
    // forwarded, and the owner answered every round and the result.
    let forwarded = pair.calls(0, "forwarded").await + pair.calls(1, "forwarded").await;
    assert!(forwarded >= 1, "no retry was forwarded");
    let rounds = pair.calls(0, "input_required").await + pair.calls(1, "input_required").await;
    let complete = pair.calls(0, "complete").await + pair.calls(1, "complete").await;
    assert_eq!(
        (rounds, complete),
        (3, 1),
        "rounds and results, counted once, where the round is held"
    );
    for i in 0..2 {
        let m = pair.metrics(i).await;
        if pair.calls(i, "forwarded").await > 0 {
            assert!(
                m.contains("dualera_bridge_partitions 0"),
                "the forwarding replica holds no session:\n{m}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_answer_comes_back_through_the_forwarder() {
    let pair = Pair::start();
    pair.registered().await;
    let args = json!({ "question": "Which way?", "n": 3 });
    // The round is opened on replica 0, the retry sent to replica 1.
    let (_, first) = post(&pair.url(0), &[], &call(1, "ask_then_log", args.clone())).await;
    let (key, method, state) = round(&first[0]);
    assert_eq!(method, "elicitation/create");
    let mut again = retry(
        2,
        "ask_then_log",
        args,
        json!({ key: respond(&method) }),
        &state,
    );
    again["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let (status, messages) = post(&pair.url(1), &[], &again).await;
    assert_eq!(status, 200, "{messages:?}");
    let (last, before) = messages.split_last().expect("events");
    assert_eq!(
        before.len(),
        3,
        "an SSE stream, notifications first: {messages:?}"
    );
    for (i, n) in before.iter().enumerate() {
        assert_eq!(n["method"], "notifications/message", "{n}");
        assert_eq!(n["params"]["data"], format!("after {i}"), "{n}");
    }
    assert_eq!(last["id"], 2);
    assert_eq!(text(last), "answered: north");
    assert_eq!(pair.calls(1, "forwarded").await, 1);
    assert_eq!(pair.calls(0, "forwarded").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_whose_replica_was_killed_is_session_lost_at_once_then_a_fresh_call_works() {
    let mut pair = Pair::start();
    pair.registered().await;
    let args = json!({ "question": "Still there?" });
    let (_, first) = post(&pair.url(0), &[], &call(1, "ask", args.clone())).await;
    let (key, method, state) = round(&first[0]);
    // SIGKILL: no deregistration, its address still in Redis for a few seconds.
    drop(pair.gateways[0].take());
    let started = Instant::now();
    let (status, lost) = post(
        &pair.lb.url(),
        &[],
        &retry(
            2,
            "ask",
            args.clone(),
            json!({ key: respond(&method) }),
            &state,
        ),
    )
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(status, 400, "{lost:?}");
    assert_eq!(lost[0]["id"], 2);
    assert_eq!(lost[0]["error"]["code"], -32602, "{lost:?}");
    assert_eq!(
        lost[0]["error"]["data"]["reason"], "sessionLost",
        "{lost:?}"
    );
    // Sent again without requestState: a new session on the replica left.
    let (_, fresh) = post(&pair.lb.url(), &[], &call(3, "ask", args.clone())).await;
    let (key, method, state) = round(&fresh[0]);
    let (_, done) = post(
        &pair.lb.url(),
        &[],
        &retry(4, "ask", args, json!({ key: respond(&method) }), &state),
    )
    .await;
    assert_eq!(text(&done[0]), "answered: north");
}
