//! The driver for legacy wires with one channel per session — the stdio host bridge,
//! WebSocket, and the 2024-11-05 HTTP+SSE transport: one task owns the session
//! machine, feeds it what the peer and the upstream say, and carries out its events.
//! Every stream the machine names maps onto the one outgoing channel.

use super::forwarded::Forwarded;
use super::telemetry::SessionTelemetry;
use super::trace::TraceContext;
use super::upstream::{OnBehalf, UpstreamError};
use super::Route;
use dualera_adapters::jsonrpc::{self, Incoming as Parsed};
use dualera_adapters::{Event, Message, RequestId, Session, SessionState, Timestamp};
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

/// Carries out every event the machine emitted (sends to the peer, starts and cancels
/// upstream exchanges, records observations), in order.
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
    while let Some(event) = machine.poll_event() {
        match event {
            Event::ToPeer { message, .. } => {
                let _ = outgoing.send(message.to_vec()).await;
            }
            Event::ToPeerBatch { messages, .. } => {
                let values: Vec<serde_json::Value> =
                    messages.iter().map(Message::to_value).collect();
                let _ = outgoing
                    .send(serde_json::to_vec(&values).unwrap_or_default())
                    .await;
            }
            Event::ToUpstream { role, request } => {
                let id = request.id.clone();
                let params = machine.upstream_headers(&request);
                let gw = gw.clone();
                let tx = up_tx.clone();
                let task_id = id.clone();
                let auth = authorization.cloned();
                let fwd = forwarded.clone();
                // These wires carry no HTTP headers per message: the request's own
                // `_meta.traceparent` is the trace context.
                let trace = TraceContext::from_meta(request.params.as_ref());
                let span = tracing::debug_span!(
                    "upstream",
                    rpc.id = %id,
                    ?role,
                    trace_id = trace.as_ref().map_or("", |t| t.trace_id()),
                );
                let task = tokio::spawn(
                    async move {
                        let msg = Message::Request(request);
                        let on_behalf = OnBehalf {
                            authorization: auth.as_ref(),
                            forwarded: Some(&fwd),
                            trace: trace.as_ref(),
                        };
                        // Each message waits for room in the session's queue: a host
                        // that reads slowly slows the read from the upstream.
                        let relayed = async {
                            let mut exchange = gw.exchange(&role, &msg, on_behalf, &params).await?;
                            while let Some(item) = exchange.next().await {
                                let m = FromUpstream::Message(task_id.clone(), item?);
                                if tx.send(m).await.is_err() {
                                    break;
                                }
                            }
                            Ok::<(), UpstreamError>(())
                        };
                        let last = match relayed.await {
                            Ok(()) => FromUpstream::Done(task_id),
                            Err(e) => {
                                gw.telemetry.upstream_error(&e);
                                warn!(error = %e, "upstream exchange failed");
                                FromUpstream::Lost(task_id, e.refusal())
                            }
                        };
                        let _ = tx.send(last).await;
                    }
                    .instrument(span),
                );
                tasks.insert(id, task.abort_handle());
            }
            Event::CancelUpstream { id, reason } => {
                if let Some(t) = tasks.remove(&id) {
                    debug!(rpc.id = %id, reason, "upstream request cancelled");
                    t.abort();
                }
            }
            Event::RequestFailed { legacy, failure } => {
                info!(rpc.id = %legacy, failure = %failure, "legacy request failed");
            }
            Event::ToolRejected { tool, reason } => {
                warn!(tool, reason, "upstream tool left out of tools/list");
            }
            Event::Observed(o) => telemetry.observe(o, machine),
            _ => {}
        }
    }
}
