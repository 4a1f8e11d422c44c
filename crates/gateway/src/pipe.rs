//! The driver for legacy wires with one channel per session — the stdio host bridge,
//! WebSocket, and the 2024-11-05 HTTP+SSE transport: one task owns the session
//! machine, feeds it what the peer and the upstream say, and carries out its events.
//! Every stream the machine names maps onto the one outgoing channel.

use super::driver::{self, Ended, Out};
use super::forwarded::Forwarded;
use super::telemetry::SessionTelemetry;
use super::Route;
use dualera_adapters::jsonrpc::{self, Incoming as Parsed};
use dualera_adapters::{Message, RequestId, Session, SessionState, Timestamp, UpstreamRole};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn, Instrument};

/// What an upstream exchange task reports back to the session task.
enum FromUpstream {
    Message(RequestId, Message),
    Lost(RequestId, Option<(&'static str, String)>),
    Done(RequestId),
}

/// Runs one legacy session until `incoming` ends (EOF, closed socket) or the peer's
/// side of `outgoing` goes away. Each item of `incoming` is one JSON-RPC message or
/// batch as text; each item sent on `outgoing` is one message or batch.
pub(super) async fn run_session(
    gw: Arc<Route>,
    mut incoming: mpsc::Receiver<Vec<u8>>,
    outgoing: mpsc::Sender<Vec<u8>>,
    transport: &'static str,
    authorization: Option<http::HeaderValue>,
    forwarded: Arc<Forwarded>,
) {
    // The same clock as the in-memory HTTP driver, whose zero the machine config
    // places on the wall clock (task timestamps).
    let now = || Timestamp::from_millis(crate::clock::now_ms());
    let mut machine = gw.legacy.new_machine(transport);
    let mut telemetry = gw.telemetry.session(transport);
    if let Some(d) =
        super::cache::legacy::discover_for_initialize(&gw.cache, authorization.as_ref())
    {
        let _ = machine.handle_discover_shared(d);
    }
    // One channel: the "standalone stream" is always open.
    let _ = machine.handle_standalone_opened();
    let (up_tx, mut up_rx) = mpsc::channel::<FromUpstream>(256);
    let mut tasks: HashMap<RequestId, AbortHandle> = HashMap::new();
    let links = Links {
        gw: &gw,
        outgoing: &outgoing,
        up_tx: &up_tx,
        authorization: authorization.as_ref(),
        forwarded: &forwarded,
    };
    info!(transport, "legacy session opened");
    loop {
        perform(&links, &mut machine, &mut telemetry, &mut tasks).await;
        if machine.state() == SessionState::Closed {
            break;
        }
        let deadline = machine
            .poll_timeout()
            .map(|t| tokio::time::Instant::now() + t.saturating_duration_since(now()));
        tokio::select! {
            line = incoming.recv() => {
                let Some(line) = line else { break };
                match jsonrpc::parse_incoming(&line) {
                    Ok(Parsed::Single(msg)) => {
                        if let Message::Request(r) = &msg {
                            telemetry.request_started(&r.id);
                        }
                        if let Err(e) = machine.handle_peer_message(msg, now()) {
                            if e.is_dropped() {
                                // Accepted and dropped: no error goes back on the pipe.
                                debug!(transport, error = %e, "late or duplicate reply dropped");
                            } else {
                                warn!(transport, error = %e, "peer message refused");
                            }
                            if let Some(resp) = e.to_response() {
                                let _ = outgoing.send(Message::Response(resp).to_vec()).await;
                            }
                        }
                    }
                    Ok(Parsed::Batch(items)) => {
                        for item in &items {
                            if let Ok(Message::Request(r)) = item {
                                telemetry.request_started(&r.id);
                            }
                        }
                        match machine.handle_peer_batch(items, now()) {
                            Ok(outcome) => {
                                for e in outcome.refused {
                                    debug!(transport, error = %e, "batch element refused");
                                }
                            }
                            Err(e) => {
                                if let Some(resp) = e.to_response() {
                                    let _ = outgoing.send(Message::Response(resp).to_vec()).await;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        let _ = outgoing.send(Message::Response(e.to_response()).to_vec()).await;
                    }
                }
            }
            from = up_rx.recv() => match from {
                Some(FromUpstream::Message(id, msg)) => {
                    if let Err(e) = machine.handle_upstream_message(Some(id), msg, now()) {
                        debug!(transport, error = %e, "upstream message refused");
                    }
                }
                Some(FromUpstream::Lost(id, refusal)) => {
                    tasks.remove(&id);
                    let _ = match refusal {
                        Some((reason, message)) => {
                            machine.handle_upstream_refused(&id, reason, message, now())
                        }
                        None => machine.handle_upstream_lost(&id, now()),
                    };
                }
                Some(FromUpstream::Done(id)) => {
                    tasks.remove(&id);
                }
                None => break,
            },
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => machine.handle_timeout(now()),
            () = outgoing.closed() => break,
        }
    }
    machine.close();
    perform(&links, &mut machine, &mut telemetry, &mut tasks).await;
    for (_, t) in tasks.drain() {
        t.abort();
    }
    telemetry.close();
    info!(transport, "legacy session closed");
}

/// What performing a session's events reaches, fixed for the session's life.
struct Links<'a> {
    gw: &'a Arc<Route>,
    outgoing: &'a mpsc::Sender<Vec<u8>>,
    up_tx: &'a mpsc::Sender<FromUpstream>,
    /// The credentials and forwarded headers of the request that opened the session:
    /// these wires have no per-message headers.
    authorization: Option<&'a http::HeaderValue>,
    forwarded: &'a Arc<Forwarded>,
}

/// Carries out everything the machine asked for ([`driver::plan`]) on this wire:
/// every stream maps onto the one outgoing channel, in order.
async fn perform(
    links: &Links<'_>,
    machine: &mut Session,
    telemetry: &mut SessionTelemetry,
    tasks: &mut HashMap<RequestId, AbortHandle>,
) {
    let Links {
        gw,
        outgoing,
        up_tx,
        authorization,
        forwarded,
    } = *links;
    let mut fixed = driver::Fixed {
        auth: authorization,
        trace: None,
    };
    let mut plan = driver::plan(machine, &mut fixed, authorization);
    for out in std::mem::take(&mut plan.out) {
        if let Out::Message { bytes, .. } = out {
            let _ = outgoing.send(bytes).await;
        }
    }
    for start in std::mem::take(&mut plan.starts) {
        let id = start.id.clone();
        let span = tracing::debug_span!(
            "upstream",
            rpc.id = %id,
            role = ?start.role,
            trace_id = start.trace.as_ref().map_or("", |t| t.trace_id()),
        );
        let gw = gw.clone();
        let feed = PipeFeed(up_tx.clone());
        let fwd = forwarded.clone();
        let task = tokio::spawn(
            async move { driver::exchange(&gw, &start, &fwd, None, &feed).await }.instrument(span),
        );
        tasks.insert(id, task.abort_handle());
    }
    for (id, reason) in std::mem::take(&mut plan.cancels) {
        if let Some(t) = tasks.remove(&id) {
            debug!(rpc.id = %id, reason, "upstream request cancelled");
            t.abort();
        }
    }
    plan.log("pipe");
    for o in plan.observed {
        telemetry.observe(o, machine);
    }
}

/// An upstream exchange of a single-channel session hands its messages to the
/// session's task: the bounded channel is the backpressure (a host that reads slowly
/// fills the outgoing queue, the session task stops taking, the send here waits).
struct PipeFeed(mpsc::Sender<FromUpstream>);

impl driver::Feed for PipeFeed {
    async fn room(&self, _: &UpstreamRole) {}

    async fn message(&self, id: &RequestId, message: Message, _last: bool) -> bool {
        self.0
            .send(FromUpstream::Message(id.clone(), message))
            .await
            .is_ok()
    }

    async fn ended(&self, id: &RequestId, ended: Ended) {
        let last = match ended {
            Ended::Done => FromUpstream::Done(id.clone()),
            Ended::Lost(refusal) => FromUpstream::Lost(id.clone(), refusal),
            // No host request waits on a pipe's exchange head.
            Ended::Denied => FromUpstream::Lost(id.clone(), None),
        };
        let _ = self.0.send(last).await;
    }
}
