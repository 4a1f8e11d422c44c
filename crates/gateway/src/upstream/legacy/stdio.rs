//! A legacy session over stdio (`basic/transports.mdx`, "stdio"): a child process of
//! its own per session (a legacy stdio server holds exactly one session for its life),
//! newline-delimited JSON-RPC both ways with the bounded framing every stdio wire uses.
//! The child is killed when the session ends; its exit ends the session.

use super::{Core, LegacyError, OPEN_TIMEOUT};
use dualera_adapters::jsonrpc::{self, Message};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Messages waiting to be written to the child.
const WRITE_QUEUE: usize = 64;

#[derive(Debug)]
pub(super) struct Stdio {
    writer: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    child: Arc<tokio::sync::Mutex<Child>>,
}

/// The child's stdout, read by the session's reader task.
pub(super) struct Reader {
    stdout: ChildStdout,
    child: Arc<tokio::sync::Mutex<Child>>,
    max_line: usize,
}

impl Stdio {
    pub(super) fn spawn(
        program: &str,
        args: &[String],
        max_line: usize,
    ) -> Result<(Self, Reader), LegacyError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LegacyError::closed(format!("cannot start {program}: {e}")))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(LegacyError::closed("the child has no stdio pipes"));
        };
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
        tokio::spawn(async move {
            while let Some(mut line) = rx.recv().await {
                line.push(b'\n');
                if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            // Dropping stdin closes the pipe: the child's cue to exit.
        });
        let child = Arc::new(tokio::sync::Mutex::new(child));
        Ok((
            Self {
                writer: Mutex::new(Some(tx)),
                child: child.clone(),
            },
            Reader {
                stdout,
                child,
                max_line,
            },
        ))
    }

    pub(super) async fn send(&self, message: &Message) -> Result<(), LegacyError> {
        let writer = self.writer.lock().ok().and_then(|w| w.clone());
        let Some(writer) = writer else {
            return Err(LegacyError::closed("the child's stdin is closed"));
        };
        writer
            .send(message.to_vec())
            .await
            .map_err(|_| LegacyError::closed("the child exited"))
    }

    /// Closes stdin, gives the child a moment to exit, then kills it.
    pub(super) async fn close(&self) {
        if let Ok(mut w) = self.writer.lock() {
            w.take();
        }
        let mut child = self.child.lock().await;
        if tokio::time::timeout(OPEN_TIMEOUT / 5, child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

impl Reader {
    /// Reads the child's lines into the session until it exits (the consumer's queue
    /// full: the pipe is left to fill).
    pub(super) async fn run(self, core: Arc<Core>) {
        let mut reader = BufReader::new(self.stdout);
        let mut buf = Vec::new();
        loop {
            match crate::framing::read_bounded_line(&mut reader, &mut buf, self.max_line).await {
                Ok(Some(Ok(()))) => {
                    if buf.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match jsonrpc::parse(&buf) {
                        Ok(m) => {
                            if !core.deliver(m).await {
                                return;
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "legacy stdio upstream sent a line that is not JSON-RPC")
                        }
                    }
                }
                Ok(Some(Err(()))) => {
                    core.fail(LegacyError::protocol(format!(
                        "the child sent a line over {} bytes",
                        self.max_line
                    )))
                    .await;
                    return;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let status = self.child.lock().await.try_wait();
        debug!(?status, "legacy stdio upstream closed its stdout");
        core.fail(LegacyError::closed("the child process exited"))
            .await;
    }
}
