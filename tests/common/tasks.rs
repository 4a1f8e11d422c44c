//! Helpers for the tasks extension (`io.modelcontextprotocol/tasks`) shared by the
//! tests that run tasks on one instance (`tests/tasks.rs`) and across instances
//! (`tests/pg_instances.rs`).

use super::{rpc, Fixture, Reply, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub(crate) const TASKS: &str = "io.modelcontextprotocol/tasks";
pub(crate) const TASK_WAIT: Duration = Duration::from_secs(20);

pub(crate) fn task_caps() -> Value {
    json!({"sampling": {}, "extensions": {TASKS: {}}})
}

pub(crate) fn summarize_args(fx: &Fixture) -> Value {
    json!({"directory": fx.repo_dir.display().to_string(), "audience": "developer"})
}

pub(crate) fn task_call(srv: &Server, method: &str, params: Value) -> Reply {
    srv.send(&rpc(srv.next_id(), method, task_caps(), params))
}

pub(crate) fn get(srv: &Server, id: &str) -> Value {
    task_call(srv, "tasks/get", json!({"taskId": id}))
        .result()
        .clone()
}

/// Polls `tasks/get` until the task is in `status` (or terminal); bounded.
pub(crate) fn wait_status(srv: &Server, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + TASK_WAIT;
    loop {
        let t = get(srv, id);
        let now = t["status"].as_str().unwrap_or_default().to_owned();
        if now == status || ["completed", "failed", "cancelled"].contains(&now.as_str()) {
            return t;
        }
        assert!(Instant::now() < deadline, "task never became {status}: {t}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `summarize_repo` as a task; returns its id.
pub(crate) fn start_summary(srv: &Server) -> String {
    let r = srv.call("summarize_repo", summarize_args(&srv.fixture), task_caps());
    let created = r.result();
    assert_eq!(created["resultType"], "task", "{created}");
    assert_eq!(created["status"], "working");
    assert!(created.get("requestState").is_none() && created.get("result").is_none());
    assert!(created["ttlMs"].as_u64().unwrap() > 0);
    assert!(created["pollIntervalMs"].as_u64().unwrap() > 0);
    assert!(created["createdAt"].as_str().unwrap().ends_with('Z'));
    let id = created["taskId"].as_str().unwrap().to_owned();
    assert!(id.len() >= 40, "task ids are unguessable: {id}");
    id
}
