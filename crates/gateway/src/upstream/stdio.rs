//! A modern upstream spawned as a child process and spoken to over stdio. Concurrent
//! requests share its one pipe: each gets a wire id of its own, responses are routed
//! back by id, progress notifications by progress token. A child that dies fails what
//! was in flight and is restarted with backoff.

use super::{Exchange, UpstreamError};
use dualera_adapters::jsonrpc::{self, Message, Notification, Request, RequestId};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// Messages waiting to be written to the child.
const WRITE_QUEUE: usize = 256;
/// Messages queued towards one waiting request.
const PER_REQUEST_QUEUE: usize = 64;
/// Longest line read from the child.
const MAX_LINE: usize = 8 * 1024 * 1024;
/// How long a request waits for a (re)starting child.
const READY_WAIT: Duration = Duration::from_secs(15);

#[derive(Debug)]
struct Pending {
    tx: mpsc::Sender<Message>,
    progress_token: Option<Value>,
}

#[derive(Debug, Default)]
struct Table {
    pending: HashMap<String, Pending>,
}

#[derive(Debug)]
struct Shared {
    table: Mutex<Table>,
    writer: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    ready: watch::Sender<u64>,
    next: AtomicU64,
    restarts: AtomicU64,
}

/// A stdio child, restarted when it dies.
#[derive(Clone, Debug)]
pub struct StdioUpstream {
    shared: Arc<Shared>,
    /// The program and its arguments (the era probe spawns one of its own).
    command: Arc<(String, Vec<String>)>,
}

impl StdioUpstream {
    /// Spawns `program args…` and keeps it running (restarting with backoff). Returns
    /// at once; requests wait for the child to be up.
    pub fn spawn(program: String, args: Vec<String>) -> Self {
        let (ready, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            writer: Mutex::new(None),
            ready,
            next: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
        });
        let command = Arc::new((program.clone(), args.clone()));
        tokio::spawn(supervise(shared.clone(), program, args));
        Self { shared, command }
    }

    /// The program and its arguments.
    pub fn command(&self) -> (&str, &[String]) {
        (&self.command.0, &self.command.1)
    }

    /// Sends one request; once written, its notifications and response as the
    /// caller pulls them ([`Exchange`]). The pipe's reader waits on this exchange's
    /// bounded queue: a caller that does not pull holds the child's stdout.
    pub async fn exchange(&self, request: &Message) -> Result<Exchange, UpstreamError> {
        let Message::Request(r) = request else {
            return Err(UpstreamError::Protocol {
                detail: "only requests are exchanged".into(),
            });
        };
        let wire_id = format!("up-{}", self.shared.next.fetch_add(1, Ordering::Relaxed));
        let progress_token = r
            .params
            .as_ref()
            .and_then(|p| p.pointer("/_meta/progressToken"))
            .cloned();
        let wire = Message::Request(Request {
            id: RequestId::String(wire_id.clone()),
            method: r.method.clone(),
            params: r.params.clone(),
        })
        .to_vec();
        // Removes the entry, and cancels upstream if the caller gave up early.
        let mut guard = Guard {
            shared: self.shared.clone(),
            wire_id,
            done: false,
        };
        // A child that just died may still be published for a moment; a request that
        // could not even be written to it was never seen, so it waits for the restart
        // and goes to the new child instead.
        let mut rx = None;
        for _ in 0..2 {
            let writer = self.writer().await?;
            let (tx, new_rx) = mpsc::channel(PER_REQUEST_QUEUE);
            if let Ok(mut t) = self.shared.table.lock() {
                t.pending.insert(
                    guard.wire_id.clone(),
                    Pending {
                        tx,
                        progress_token: progress_token.clone(),
                    },
                );
            }
            if writer.send(wire.clone()).await.is_ok() {
                rx = Some(new_rx);
                break;
            }
            if let Ok(mut w) = self.shared.writer.lock() {
                if w.as_ref().is_some_and(|cur| cur.same_channel(&writer)) {
                    *w = None;
                }
            }
        }
        let Some(rx) = rx else {
            guard.done = true;
            return Err(UpstreamError::Unreachable {
                detail: "the stdio upstream is restarting".into(),
            });
        };
        let caller_id = r.id.clone();
        let state = Some((rx, guard, caller_id));
        Ok(Exchange::new(futures_util::stream::unfold(
            state,
            |state| async move {
                let (mut rx, mut guard, caller_id) = state?;
                let Some(msg) = rx.recv().await else {
                    guard.done = true;
                    return Some((
                        Err(UpstreamError::Unreachable {
                            detail: "the stdio upstream exited before answering".into(),
                        }),
                        None,
                    ));
                };
                let msg = match msg {
                    Message::Response(mut resp) => {
                        guard.done = true;
                        resp.id = Some(caller_id.clone());
                        Message::Response(resp)
                    }
                    Message::Notification(mut n) => {
                        // A listen stream's notifications name the wire id; give the
                        // caller its own id back.
                        if let Some(sub) = n.params.as_mut().and_then(|p| {
                            p.pointer_mut("/_meta/io.modelcontextprotocol~1subscriptionId")
                        }) {
                            if sub.as_str() == Some(guard.wire_id.as_str()) {
                                *sub = caller_id.to_value();
                            }
                        }
                        Message::Notification(n)
                    }
                    other => other,
                };
                Some((Ok(msg), Some((rx, guard, caller_id))))
            },
        )))
    }

    async fn writer(&self) -> Result<mpsc::Sender<Vec<u8>>, UpstreamError> {
        let mut ready = self.shared.ready.subscribe();
        let deadline = tokio::time::Instant::now() + READY_WAIT;
        loop {
            if let Some(w) = self.shared.writer.lock().ok().and_then(|g| g.clone()) {
                return Ok(w);
            }
            if tokio::time::timeout_at(deadline, ready.changed())
                .await
                .is_err()
            {
                return Err(UpstreamError::Unreachable {
                    detail: "the stdio upstream is not running".into(),
                });
            }
        }
    }
}

struct Guard {
    shared: Arc<Shared>,
    wire_id: String,
    done: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(mut t) = self.shared.table.lock() {
            t.pending.remove(&self.wire_id);
        }
        if !self.done {
            let cancel = Message::Notification(Notification {
                method: "notifications/cancelled".into(),
                params: Some(
                    json!({ "requestId": self.wire_id, "reason": "cancelled by the gateway" }),
                ),
            });
            if let Some(w) = self.shared.writer.lock().ok().and_then(|g| g.clone()) {
                let _ = w.try_send(cancel.to_vec());
            }
        }
    }
}

async fn supervise(shared: Arc<Shared>, program: String, args: Vec<String>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let started = tokio::time::Instant::now();
        match Command::new(&program)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(mut child) => {
                let n = shared.restarts.fetch_add(1, Ordering::Relaxed) + 1;
                info!(pid = child.id(), starts = n, "stdio upstream started");
                run_child(&shared, &mut child).await;
                let status = child.wait().await;
                warn!(?status, "stdio upstream exited");
            }
            Err(e) => warn!(error = %e, program = %program, "cannot start the stdio upstream"),
        }
        if let Ok(mut w) = shared.writer.lock() {
            *w = None;
        }
        // Everything in flight fails now: its response can no longer come.
        if let Ok(mut t) = shared.table.lock() {
            t.pending.clear();
        }
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn run_child(shared: &Arc<Shared>, child: &mut tokio::process::Child) {
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return;
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
    if let Ok(mut w) = shared.writer.lock() {
        *w = Some(tx);
    }
    shared.ready.send_modify(|v| *v += 1);
    let writer = async move {
        while let Some(mut line) = rx.recv().await {
            line.push(b'\n');
            if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    };
    let reader = async {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            match crate::framing::read_bounded_line(&mut reader, &mut buf, MAX_LINE).await {
                Ok(Some(Ok(()))) => route(shared, &buf).await,
                Ok(Some(Err(()))) => warn!("stdio upstream sent an over-long line; dropped"),
                Ok(None) | Err(_) => break,
            }
        }
    };
    tokio::select! {
        () = writer => {}
        () = reader => {}
    }
    // The pipe is gone: stop handing it out before waiting for the exit status.
    if let Ok(mut w) = shared.writer.lock() {
        *w = None;
    }
}

/// Hands one line of the child to the exchange it belongs to, waiting while that
/// exchange's queue is full: the pipe is read no faster than its readers take.
async fn route(shared: &Shared, line: &[u8]) {
    let msg = match jsonrpc::parse(line) {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "stdio upstream sent a line that is not JSON-RPC");
            return;
        }
    };
    let target = {
        let Ok(t) = shared.table.lock() else { return };
        let target = match &msg {
            Message::Response(r) => match &r.id {
                Some(RequestId::String(id)) => t.pending.get(id),
                _ => None,
            },
            Message::Notification(n) => {
                let params = n.params.as_ref();
                let subscription = params
                    .and_then(|p| p.pointer("/_meta/io.modelcontextprotocol~1subscriptionId"))
                    .and_then(Value::as_str);
                let token = params.and_then(|p| p.get("progressToken"));
                subscription.and_then(|id| t.pending.get(id)).or_else(|| {
                    token.and_then(|tok| {
                        t.pending
                            .values()
                            .find(|p| p.progress_token.as_ref() == Some(tok))
                    })
                })
            }
            Message::Request(_) => None,
        };
        target.map(|p| p.tx.clone())
    };
    match target {
        // A receiver gone meanwhile gave up on the exchange (its cancel is sent).
        Some(tx) => drop(tx.send(msg).await),
        None => debug!("uncorrelated message from the stdio upstream dropped"),
    }
}
