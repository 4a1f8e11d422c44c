//! The legacy host over stdio: the bridge is spawned per session (as a desktop host
//! spawns its servers) and spoken to in newline-delimited JSON-RPC. Every line it
//! writes is an output; the last lines of its stderr are kept for the report.

use super::observe::{emit, Observed, Sink, MAX_MESSAGE};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

/// How much of the bridge's stderr is kept.
const STDERR_KEPT: usize = 4096;

/// One legacy session: one bridge process.
pub(crate) struct StdioHost {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for StdioHost {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.child.start_kill();
    }
}

/// Why a bridge could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the bridge ({program}): {detail}")]
pub(crate) struct SpawnError {
    program: String,
    detail: String,
}

impl StdioHost {
    /// Spawns `argv` (already substituted) for session `name`.
    pub(crate) fn spawn(name: &str, argv: &[String], sink: Sink) -> Result<Self, SpawnError> {
        let (program, args) = argv.split_first().ok_or_else(|| SpawnError {
            program: String::new(),
            detail: "the command is empty".into(),
        })?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SpawnError {
                program: program.clone(),
                detail: e.to_string(),
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr_pipe = child.stderr.take();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let mut tasks = Vec::new();
        if let Some(out) = stdout {
            let session = name.to_owned();
            tasks.push(tokio::spawn(read_lines(out, session, sink)));
        }
        if let Some(mut err) = stderr_pipe {
            let keep = stderr.clone();
            tasks.push(tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut k) = keep.lock() {
                        k.extend(&buf[..n]);
                        while k.len() > STDERR_KEPT {
                            k.pop_front();
                        }
                    }
                }
            }));
        }
        Ok(Self {
            child,
            stdin,
            stderr,
            tasks,
        })
    }

    /// Writes one message or batch as a line; false if the bridge's stdin is closed.
    pub(crate) async fn send(&mut self, message: &Value) -> bool {
        let Some(stdin) = self.stdin.as_mut() else {
            return false;
        };
        let mut line = serde_json::to_vec(message).unwrap_or_default();
        line.push(b'\n');
        let ok = stdin.write_all(&line).await.is_ok() && stdin.flush().await.is_ok();
        if !ok {
            self.stdin = None;
        }
        ok
    }

    /// Closes the bridge's stdin (end of session).
    pub(crate) fn close(&mut self) {
        self.stdin = None;
    }

    /// The tail of the bridge's stderr.
    pub(crate) fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|k| String::from_utf8_lossy(&k.iter().copied().collect::<Vec<_>>()).into_owned())
            .unwrap_or_default()
    }

    /// Closes stdin and gives the bridge `grace` to exit, then kills it.
    pub(crate) async fn stop(&mut self, grace: Duration) {
        self.stdin = None;
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        }
    }
}

async fn read_lines(out: tokio::process::ChildStdout, session: String, sink: Sink) {
    let mut reader = BufReader::new(out);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A read error ends the bridge's output like EOF does.
        let n = (&mut reader)
            .take(MAX_MESSAGE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .unwrap_or_default();
        if n == 0 {
            emit(
                &sink,
                Observed::Exited {
                    session,
                    status: "stdout closed".into(),
                },
            );
            return;
        }
        if line.len() > MAX_MESSAGE {
            emit(
                &sink,
                Observed::Fault {
                    detail: format!(
                        "a line on the bridge's stdout is longer than {MAX_MESSAGE} bytes"
                    ),
                },
            );
            return;
        }
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text.trim()) {
            Ok(Value::Array(items)) => emit(
                &sink,
                Observed::PeerOutput {
                    session: session.clone(),
                    output: json!({"to": "peer", "stream": null, "batch": items}),
                },
            ),
            Ok(m @ Value::Object(_)) => emit(
                &sink,
                Observed::PeerOutput {
                    session: session.clone(),
                    output: json!({"to": "peer", "stream": null, "message": m}),
                },
            ),
            _ => emit(
                &sink,
                Observed::Fault {
                    detail: format!(
                        "the bridge wrote a line to stdout that is not a JSON-RPC message: {}",
                        text.trim().chars().take(200).collect::<String>()
                    ),
                },
            ),
        }
    }
}
