//! stdio for the modern server: one JSON-RPC message per line in, one per line out,
//! logs on stderr only. Requests run concurrently (bounded); notifications get no line.

use super::router::{Handled, Listen};
use super::{Server, Sink};
use crate::framing::read_bounded_line;
use dualera_adapters::jsonrpc;
use dualera_adapters::{ErrorCode, ErrorObject, Message, RequestId, Response};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;

/// Most requests handled at once.
const MAX_IN_FLIGHT: usize = 32;
/// Most `subscriptions/listen` streams open at once on one stdio connection.
const MAX_LISTENS: usize = 16;

/// Cancellation of one stdio request: the handler's flag, and a wake-up for a
/// `subscriptions/listen` loop.
#[derive(Debug, Default)]
struct Cancel {
    flag: AtomicBool,
    wake: Notify,
}

type Running = Arc<Mutex<HashMap<RequestId, Arc<Cancel>>>>;

/// Serves newline-delimited JSON-RPC until the reader reaches EOF, then cancels what
/// is still running, waits for it, and returns.
pub async fn serve<R, W>(
    server: Server,
    principal: String,
    mut reader: R,
    mut writer: W,
) -> std::io::Result<()>
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
    let listens = Arc::new(Semaphore::new(MAX_LISTENS));
    let principal: Arc<str> = principal.into();
    let running: Running = Arc::default();
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
        let body = std::mem::take(&mut buf);
        // `notifications/cancelled` is acted on here, in order with the lines around it.
        if let Ok(Message::Notification(n)) = jsonrpc::parse(&body) {
            let target = n.cancelled_request();
            if let Some(c) = target.and_then(|id| running.lock().ok()?.get(&id).cloned()) {
                c.flag.store(true, Ordering::Relaxed);
                c.wake.notify_one();
            }
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let id = match jsonrpc::parse(&body) {
            Ok(Message::Request(r)) => Some(r.id),
            _ => None,
        };
        let cancel = Arc::new(Cancel::default());
        if let (Some(id), Ok(mut r)) = (&id, running.lock()) {
            r.insert(id.clone(), cancel.clone());
        }
        let server = server.clone();
        let principal = principal.clone();
        let tx = tx.clone();
        let running = running.clone();
        let listens = listens.clone();
        tasks.spawn(async move {
            let out = tx.clone();
            let c = cancel.clone();
            let handled = tokio::task::spawn_blocking({
                let server = server.clone();
                move || {
                    let notify = |m: Message| {
                        let _ = out.blocking_send(m.to_vec());
                    };
                    let sink = Sink {
                        notify: &notify,
                        cancelled: &c.flag,
                    };
                    server.handle_bytes(&principal, &body, None, &sink)
                }
            })
            .await;
            drop(permit);
            match handled {
                Ok(Handled::Reply { response, .. }) => {
                    let _ = tx.send(Message::Response(response).to_vec()).await;
                }
                Ok(Handled::Listen(listen)) => match listens.try_acquire_owned() {
                    Ok(slot) => {
                        listen_loop(&server, &listen, &tx, &cancel).await;
                        drop(slot);
                    }
                    Err(_) => {
                        let err = Response::error(
                            Some(listen.id.clone()),
                            ErrorObject::new(
                                ErrorCode::INVALID_PARAMS,
                                format!("Invalid params: at most {MAX_LISTENS} subscriptions at once"),
                            ),
                        );
                        let _ = tx.send(Message::Response(err).to_vec()).await;
                    }
                },
                _ => {}
            }
            if let (Some(id), Ok(mut r)) = (&id, running.lock()) {
                r.remove(id);
            }
        });
    }
    // EOF: cancel everything still running, then let it finish.
    if let Ok(r) = running.lock() {
        for c in r.values() {
            c.flag.store(true, Ordering::Relaxed);
            c.wake.notify_one();
        }
    }
    while tasks.join_next().await.is_some() {}
    drop(tx);
    let _ = writer_task.await;
    Ok(())
}

/// Forwards announced changes to one subscription until it is cancelled.
async fn listen_loop(
    server: &Server,
    listen: &Listen,
    tx: &mpsc::Sender<Vec<u8>>,
    cancel: &Cancel,
) {
    let mut changes = server.services().changes.subscribe();
    if tx.send(listen.acknowledgment().to_vec()).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Ok(change) => {
                    if let Some(m) = listen.forward(&change) {
                        if tx.send(m.to_vec()).await.is_err() {
                            return;
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    let _ = tx.send(listen.closing().to_vec()).await;
                    return;
                }
            },
            () = cancel.wake.notified() => return,
        }
        if cancel.flag.load(Ordering::Relaxed) {
            return;
        }
    }
}
