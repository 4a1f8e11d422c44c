//! stdio for the modern server: one JSON-RPC message per line in, one per line out,
//! logs on stderr only. Requests run concurrently (bounded); notifications get no line.

use super::router::Handled;
use super::Server;
use dualera_adapters::{ErrorCode, ErrorObject, Message, Response};
use std::sync::Arc;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

/// Most requests handled at once.
const MAX_IN_FLIGHT: usize = 32;

/// Reads one line of at most `max` bytes. `Ok(None)` at EOF; an over-long line is
/// consumed to its end and reported as `Err(())`.
pub async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<Result<(), ()>>> {
    buf.clear();
    let mut too_long = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && !too_long {
                None
            } else if too_long {
                Some(Err(()))
            } else {
                Some(Ok(()))
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max + 1 {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        reader.consume(take);
        if done {
            if too_long {
                return Ok(Some(Err(())));
            }
            while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                buf.pop();
            }
            return Ok(Some(Ok(())));
        }
    }
}

/// Serves newline-delimited JSON-RPC until the reader reaches EOF, then waits for
/// in-flight requests and returns.
pub async fn serve<R, W>(server: Server, principal: String, mut reader: R, mut writer: W) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    let writer_task = tokio::spawn(async move {
        while let Some(mut line) = rx.recv().await {
            line.push(b'\n');
            if writer.write_all(&line).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
    });
    let limit = server.services().limits.max_body_bytes;
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let principal: Arc<str> = principal.into();
    let mut tasks = JoinSet::new();
    let mut buf = Vec::new();
    while let Some(line) = read_bounded_line(&mut reader, &mut buf, limit).await? {
        while tasks.try_join_next().is_some() {}
        if line.is_err() {
            let err = Response::error(
                None,
                ErrorObject::new(
                    ErrorCode::INVALID_REQUEST,
                    format!("Invalid request: message longer than {limit} bytes"),
                ),
            );
            let _ = tx.send(Message::Response(err).to_vec()).await;
            continue;
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let body = std::mem::take(&mut buf);
        let server = server.clone();
        let principal = principal.clone();
        let tx = tx.clone();
        tasks.spawn(async move {
            let handled =
                tokio::task::spawn_blocking(move || server.handle_bytes(&principal, &body, None)).await;
            if let Ok(Handled::Reply { response, .. }) = handled {
                let _ = tx.send(Message::Response(response).to_vec()).await;
            }
            drop(permit);
        });
    }
    while tasks.join_next().await.is_some() {}
    drop(tx);
    let _ = writer_task.await;
    Ok(())
}
