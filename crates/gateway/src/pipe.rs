//! The IO side ([`Pipe`]) of legacy wires with one channel per session — the stdio
//! host bridge, WebSocket, and the 2024-11-05 HTTP+SSE transport, each a [`Wire`] —
//! which [`driver::run`] drives: one task owns the session machine, feeds it what the
//! peer and the upstream say, and carries out its events. Every stream the machine
//! names maps onto the wire's one direction towards the host.

use super::driver::{self, Ended, Inbox, Input, Io as _, Out, Side};
use super::forwarded::Forwarded;
use super::telemetry::SessionTelemetry;
use super::wire::Wire;
use super::Route;
use dualera_adapters::jsonrpc::{self, Incoming as Parsed};
use dualera_adapters::{Message, RequestId, Session, Timestamp, UpstreamRole};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn, Instrument};

/// Runs one legacy session on `wire` until the host is gone (EOF, closed socket, a
/// host that stopped reading) or the machine closes.
pub(super) async fn run_session<W: Wire>(
    gw: Arc<Route>,
    wire: W,
    authorization: Option<http::HeaderValue>,
    forwarded: Arc<Forwarded>,
) {
    let transport = W::TRANSPORT;
    let mut machine = gw.legacy.wire_machine(transport);
    let telemetry = gw.telemetry.session(transport);
    if let Some(d) =
        super::cache::legacy::discover_for_initialize(&gw.cache, authorization.as_ref())
    {
        let _ = machine.handle_discover_shared(d);
    }
    // One channel: the "standalone stream" is always open.
    let _ = machine.handle_standalone_opened();
    let (up_tx, up_rx) = mpsc::channel::<Inbox<Vec<u8>>>(UPSTREAM_QUEUE);
    let pipe = Pipe {
        gw,
        wire,
        host_gone: false,
        up_tx,
        up_rx,
        tasks: HashMap::new(),
        telemetry,
        transport,
        authorization,
        forwarded,
    };
    info!(transport, "legacy session opened");
    driver::run(machine, pipe).await;
    info!(transport, "legacy session closed");
}

/// Messages and ends of the session's upstream exchanges queued toward its task: the
/// bound is the backpressure (a host that reads slowly blocks the task's send on the
/// wire, the task stops taking, the exchanges' sends wait).
const UPSTREAM_QUEUE: usize = 256;

/// The IO side of a single-channel session: the peer's wire and the upstream
/// exchanges in progress.
struct Pipe<W> {
    gw: Arc<Route>,
    wire: W,
    /// A send found the host gone: the next wait reports it.
    host_gone: bool,
    up_tx: mpsc::Sender<Inbox<Vec<u8>>>,
    up_rx: mpsc::Receiver<Inbox<Vec<u8>>>,
    tasks: HashMap<RequestId, AbortHandle>,
    telemetry: SessionTelemetry,
    transport: &'static str,
    /// The credentials and forwarded headers of the request that opened the session:
    /// these wires have no per-message headers.
    authorization: Option<http::HeaderValue>,
    forwarded: Arc<Forwarded>,
}

impl<W: Wire> driver::Io<Session> for Pipe<W> {
    type Host = Vec<u8>;

    fn now(&self) -> Timestamp {
        // The same clock as the in-memory HTTP driver, whose zero the machine config
        // places on the wall clock (task timestamps).
        Timestamp::from_millis(crate::clock::now_ms())
    }

    fn instant(&self, t: Timestamp) -> tokio::time::Instant {
        tokio::time::Instant::now() + t.saturating_duration_since(self.now())
    }

    async fn recv(&mut self, _: &Session) -> Inbox<Vec<u8>> {
        if self.host_gone {
            return Inbox::Closed(Side::Host);
        }
        tokio::select! {
            line = self.wire.recv() => line.map_or(Inbox::Closed(Side::Host), Inbox::Host),
            from = self.up_rx.recv() => from.unwrap_or(Inbox::Closed(Side::Upstream)),
        }
    }

    async fn feed(&mut self, machine: &mut Session, inbox: Inbox<Vec<u8>>) -> bool {
        match inbox {
            Inbox::Host(line) => self.peer(machine, &line).await,
            Inbox::Input(_) | Inbox::Forgotten | Inbox::Closed(_) => {}
        }
        true
    }

    fn ended(&mut self, id: &RequestId) {
        self.tasks.remove(id);
    }

    async fn perform(&mut self, machine: &mut Session) -> bool {
        self.carry_out(machine).await;
        true
    }

    async fn finish(mut self, machine: &mut Session) {
        self.carry_out(machine).await;
        for (_, t) in self.tasks.drain() {
            t.abort();
        }
        self.telemetry.close();
        self.wire.finish().await;
    }
}

impl<W: Wire> Pipe<W> {
    /// Sends one message or batch to the host; a host found gone ends the session at
    /// the next wait.
    async fn send(&mut self, bytes: Vec<u8>) {
        if !self.host_gone && !self.wire.send(bytes).await {
            self.host_gone = true;
        }
    }

    /// Feeds one message or batch from the peer.
    async fn peer(&mut self, machine: &mut Session, line: &[u8]) {
        let (transport, now) = (self.transport, self.now());
        match jsonrpc::parse_incoming(line) {
            Ok(Parsed::Single(msg)) => {
                if let Message::Request(r) = &msg {
                    self.telemetry.request_started(&r.id);
                }
                if let Err(e) = machine.handle_peer_message(msg, now) {
                    if e.is_dropped() {
                        // Accepted and dropped: no error goes back on the pipe.
                        debug!(transport, error = %e, "late or duplicate reply dropped");
                    } else {
                        warn!(transport, error = %e, "peer message refused");
                    }
                    if let Some(resp) = e.to_response() {
                        self.send(Message::Response(resp).to_vec()).await;
                    }
                }
            }
            Ok(Parsed::Batch(items)) => {
                for item in &items {
                    if let Ok(Message::Request(r)) = item {
                        self.telemetry.request_started(&r.id);
                    }
                }
                match machine.handle_peer_batch(items, now) {
                    Ok(outcome) => {
                        for e in outcome.refused {
                            debug!(transport, error = %e, "batch element refused");
                        }
                    }
                    Err(e) => {
                        if let Some(resp) = e.to_response() {
                            self.send(Message::Response(resp).to_vec()).await;
                        }
                    }
                }
            }
            Err(e) => {
                self.send(Message::Response(e.to_response()).to_vec()).await;
            }
        }
    }

    /// Carries out everything the machine asked for ([`driver::plan`]) on this wire:
    /// every stream maps onto the wire's one direction towards the host, in order.
    async fn carry_out(&mut self, machine: &mut Session) {
        let mut fixed = driver::Fixed {
            auth: self.authorization.as_ref(),
            trace: None,
        };
        let mut plan = driver::plan(machine, &mut fixed, self.authorization.as_ref());
        for out in std::mem::take(&mut plan.out) {
            if let Out::Message { bytes, .. } = out {
                self.send(bytes).await;
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
            let gw = self.gw.clone();
            let feed = PipeFeed(self.up_tx.clone());
            let fwd = self.forwarded.clone();
            let task = tokio::spawn(
                async move { driver::exchange(&gw, &start, &fwd, None, &feed).await }
                    .instrument(span),
            );
            self.tasks.insert(id, task.abort_handle());
        }
        for (id, reason) in std::mem::take(&mut plan.cancels) {
            if let Some(t) = self.tasks.remove(&id) {
                debug!(rpc.id = %id, reason, "upstream request cancelled");
                t.abort();
            }
        }
        plan.log(|| "pipe");
        for o in plan.observed {
            self.telemetry.observe(o, machine);
        }
    }
}

/// An upstream exchange of a single-channel session hands its messages to the
/// session's task: the bounded channel is the backpressure (a host that reads slowly
/// blocks the session task's send on the wire, the task stops taking, the send here
/// waits).
struct PipeFeed(mpsc::Sender<Inbox<Vec<u8>>>);

impl driver::Feed for PipeFeed {
    async fn room(&self, _: &UpstreamRole) {}

    async fn message(&self, id: &RequestId, message: Message, _last: bool) -> bool {
        let on = Some(id.clone());
        let input = Input::Upstream { on, message };
        self.0.send(Inbox::Input(input)).await.is_ok()
    }

    async fn ended(&self, id: &RequestId, ended: Ended) {
        let input = Input::Ended {
            id: id.clone(),
            ended,
        };
        let _ = self.0.send(Inbox::Input(input)).await;
    }
}
