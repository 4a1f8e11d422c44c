//! One partition's IO side ([`Partition`]): the reverse machine of one legacy session
//! and the pooled session under it, driven by one task on [`driver::run`], the loop
//! the single-channel wires (`pipe`) run on too. Host requests arrive on a bounded
//! channel, the server's messages on the session's bounded stream, timers from
//! [`LegacySession::poll_timeout`]; whatever the machine emits is sent upstream or
//! handed to the waiting host request.

use super::Clock;
use crate::driver::{self, Ended, Inbox, Input, Side};
use crate::forwarded::Forwarded;
use crate::trace::TraceContext;
use crate::upstream::era::Target;
use crate::upstream::legacy::{
    Lease, LegacyError, LegacySession as Upstream, LegacyTransport, PoolKey, SessionPool,
};
use crate::upstream::{Denial, OnBehalf, UpstreamError};
use dualera_adapters::jsonrpc::{Message, RequestId, Response};
use dualera_adapters::reverse::{Event, HostKey, HostRequest, LegacySession, RoundState};
use dualera_adapters::time::Timestamp;
use http::header::HeaderValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn, Instrument};

/// Host requests queued toward one partition's task.
pub(super) const COMMAND_QUEUE: usize = 64;
/// Notifications queued toward one host request's stream. While it is full the task
/// waits for room (a host that reads slowly slows the upstream read; nothing is
/// dropped), up to [`STALLED_READER_TIMEOUT`].
pub(super) const NOTIFICATION_QUEUE: usize = 64;
/// How long a host request's stream may take nothing before the request ends and its
/// legacy call is cancelled (`notifications/cancelled`): one host that stopped
/// reading holds its partition's session that long at most.
pub(super) const STALLED_READER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a host request's HTTP handler hands the task.
pub(super) enum Command {
    /// A host request, and where its answer goes.
    Request(Box<HostRequest>, Reply),
    /// The host request left (its connection closed, or its wait ran out).
    Gone(HostKey),
}

/// Where one host request's messages go: the notifications before its answer, and
/// the answer.
pub(super) struct Reply {
    pub(super) notifications: mpsc::Sender<Message>,
    pub(super) answer: oneshot::Sender<Answer>,
    /// The headers the legacy messages it causes carry.
    pub(super) relay: Relay,
}

/// The headers of one host request the gateway repeats on the legacy messages that
/// request causes (its call, the answers to the server's requests its retry carries).
#[derive(Debug, Clone, Default)]
pub(super) struct Relay {
    pub(super) forwarded: Forwarded,
    pub(super) trace: Option<TraceContext>,
}

/// The end of one host request.
#[derive(Debug)]
pub(super) enum Answer {
    /// Its final response (a result or an error), in 2026-07-28 shape.
    Response(Response),
    /// An `input_required` result whose round state the handler seals.
    InputRequired {
        id: RequestId,
        result: Value,
        state: RoundState,
    },
    /// The upstream refused the credentials (401/403) on a message sent for this
    /// request: relayed as it is, as in the forward direction.
    Denied(Box<Denial>),
}

/// How the task opens a legacy session again after the server forgot one.
pub(super) struct Opener {
    pub(super) pool: Arc<SessionPool>,
    pub(super) key: PoolKey,
    pub(super) target: Target,
    pub(super) transport: LegacyTransport,
    pub(super) authorization: Option<HeaderValue>,
}

impl Opener {
    pub(super) async fn open(&self) -> Result<Lease, LegacyError> {
        let (target, transport, auth) = (&self.target, self.transport, self.authorization.clone());
        self.pool
            .open(&self.key, || Upstream::open(target, transport, auth))
            .await
    }
}

/// The IO side of one partition, which [`driver::run`] drives with the reverse
/// machine: host requests on the bounded command channel, the pooled legacy
/// session's stream, the host requests waiting for their answer.
pub(super) struct Partition {
    lease: Lease,
    opener: Opener,
    clock: Clock,
    commands: mpsc::Receiver<Command>,
    /// Host requests waiting for their answer.
    hosts: HashMap<HostKey, Reply>,
    /// How long the partition lives with no host request and no call in progress.
    idle: Duration,
    /// The headers of the host request being handled: what the machine emits for it
    /// carries them ([`Relay`]); `None` for what timers and the server cause.
    relay: Option<Relay>,
    /// The host request being handled.
    current: Option<HostKey>,
    /// The upstream refused the session itself with these credentials: every host
    /// request of the partition gets that refusal until the task ends (soon after:
    /// see [`REFUSED_LINGER`]).
    refused: Option<Box<Denial>>,
}

/// How long a partition whose session the upstream refused lingers to relay the
/// refusal to requests already on their way to it.
const REFUSED_LINGER: Duration = Duration::from_secs(1);

/// Runs one partition on [`driver::run`] until the machine fails, the session ends
/// for good, the bridge drops the partition, or it stays idle. `on_exit` unregisters
/// it.
pub(super) async fn run(machine: LegacySession, partition: Partition, on_exit: impl FnOnce()) {
    let span = tracing::debug_span!("reverse_partition", session = tracing::field::Empty);
    if let Some(id) = partition.lease.upstream_session_id() {
        span.record(
            "session",
            crate::digest::short_digest(id.as_bytes(), 4).as_str(),
        );
    }
    driver::run(machine, partition).instrument(span).await;
    on_exit();
}

impl driver::Io<LegacySession> for Partition {
    type Host = Command;

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn instant(&self, t: Timestamp) -> tokio::time::Instant {
        self.clock.instant(t)
    }

    async fn recv(&mut self, machine: &LegacySession) -> Inbox<Command> {
        let quiet = self.hosts.is_empty() && machine.calls() == 0;
        let idle = if self.refused.is_some() {
            REFUSED_LINGER
        } else {
            self.idle
        };
        let idle = async {
            if quiet {
                tokio::time::sleep(idle).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(idle);
        loop {
            tokio::select! {
                cmd = self.commands.recv() => {
                    return cmd.map_or(Inbox::Closed(Side::Host), Inbox::Host);
                }
                item = self.lease.recv_attributed() => match item {
                    // `on`: the legacy request whose response stream carried it.
                    // Without one (a stream of the whole session), the machine gives a
                    // server request to the one call in progress and refuses it when
                    // several are.
                    Some((on, Ok(message))) => return Inbox::Input(Input::Upstream { on, message }),
                    // The server forgot the session.
                    Some((_, Err(LegacyError::Expired))) => {
                        return Inbox::Forgotten;
                    }
                    Some((on, Err(e))) => {
                        debug!(error = %e, "upstream answer stream broke");
                        // That request's answer will not come: its call fails instead
                        // of waiting for good.
                        if let Some(id) = on {
                            return Inbox::Input(Input::Ended { id, ended: Ended::Lost(None) });
                        }
                    }
                    None => return Inbox::Closed(Side::Upstream),
                },
                () = &mut idle => {
                    debug!("reverse partition idle; closing its legacy session");
                    return Inbox::Closed(Side::Host);
                }
            }
        }
    }

    async fn feed(&mut self, machine: &mut LegacySession, inbox: Inbox<Command>) -> bool {
        match inbox {
            Inbox::Host(Command::Request(request, reply)) => {
                // Cleared once what the machine emitted for it is carried out.
                self.relay = Some(reply.relay.clone());
                self.current = Some(request.host);
                self.request(machine, *request, reply);
                true
            }
            Inbox::Host(Command::Gone(key)) => {
                self.hosts.remove(&key);
                machine.handle_host_gone(key);
                true
            }
            Inbox::Forgotten => self.expired(machine, &[]).await,
            _ => true,
        }
    }

    async fn perform(&mut self, machine: &mut LegacySession) -> bool {
        let going = self.drain(machine).await;
        self.relay = None;
        self.current = None;
        going
    }

    async fn finish(mut self, machine: &mut LegacySession) {
        // The host requests still waiting get the machine's last answers; nothing more
        // goes upstream.
        while let Some(event) = machine.poll_event() {
            if let Event::ToHost {
                host,
                message: Message::Response(r),
            } = event
            {
                self.answer(host, Answer::Response(r));
            }
        }
        self.hosts.clear();
        self.opener.pool.discard(self.lease).await;
    }
}

impl Partition {
    pub(super) fn new(
        lease: Lease,
        opener: Opener,
        clock: Clock,
        idle: Duration,
        commands: mpsc::Receiver<Command>,
    ) -> Self {
        Self {
            lease,
            opener,
            clock,
            commands,
            hosts: HashMap::new(),
            idle,
            relay: None,
            current: None,
            refused: None,
        }
    }

    fn request(&mut self, machine: &mut LegacySession, request: HostRequest, reply: Reply) {
        if let Some(denial) = &self.refused {
            let _ = reply.answer.send(Answer::Denied(denial.clone()));
            return;
        }
        let key = request.host;
        let id = request.id.clone();
        match machine.handle_host_request(request, self.clock.now()) {
            Ok(()) => {
                self.hosts.insert(key, reply);
            }
            Err(e) => {
                debug!(error = %e, "host request refused by the reverse machine");
                let failure = dualera_adapters::reverse::HostFailure::Unusable {
                    reason: e.to_string(),
                };
                let error = dualera_adapters::reverse::host_error(&failure);
                let _ = reply
                    .answer
                    .send(Answer::Response(Response::error(Some(id), error)));
            }
        }
    }

    /// Carries out what the machine emitted. `false`: the partition is over.
    async fn drain(&mut self, machine: &mut LegacySession) -> bool {
        // Bounded: every event is the answer to an input, and the machine's maps are.
        while let Some(event) = machine.poll_event() {
            match event {
                Event::ToUpstream { message } => {
                    let sent = self.send(machine, message).await;
                    if !sent {
                        return false;
                    }
                }
                Event::ToHost {
                    host,
                    message: Message::Response(r),
                } => self.answer(host, Answer::Response(r)),
                Event::ToHost { host, message } => self.notify(machine, host, message).await,
                Event::InputRequired {
                    host,
                    id,
                    result,
                    state,
                } => {
                    self.answer(host, Answer::InputRequired { id, result, state });
                }
                Event::Failed { reason } => {
                    warn!(%reason, "reverse bridge: legacy session unusable");
                    // Its host requests were answered; take the rest out.
                    while let Some(Event::ToHost {
                        host,
                        message: Message::Response(r),
                    }) = machine.poll_event()
                    {
                        self.answer(host, Answer::Response(r));
                    }
                    return false;
                }
                _ => {}
            }
        }
        true
    }

    /// Hands a notification to host request `host`'s stream once it has room. A host
    /// whose stream takes nothing for [`STALLED_READER_TIMEOUT`] is gone: its request
    /// ends and its call is cancelled upstream, as when it leaves.
    async fn notify(&mut self, machine: &mut LegacySession, host: HostKey, message: Message) {
        let Some(reply) = self.hosts.get(&host) else {
            return;
        };
        let sent =
            tokio::time::timeout(STALLED_READER_TIMEOUT, reply.notifications.send(message)).await;
        match sent {
            Ok(Ok(())) => {}
            // The host left; its `Gone` is on its way.
            Ok(Err(_)) => debug!(%host, "notification for a host stream that is gone dropped"),
            Err(_) => {
                warn!(
                    %host,
                    limit_s = STALLED_READER_TIMEOUT.as_secs(),
                    "host request stopped reading its stream; ended and cancelled upstream"
                );
                self.hosts.remove(&host);
                machine.handle_host_gone(host);
            }
        }
    }

    /// Ends host request `host` with `answer`.
    fn answer(&mut self, host: HostKey, answer: Answer) {
        if let Some(reply) = self.hosts.remove(&host) {
            let _ = reply.answer.send(answer);
        }
    }

    /// Sends one message upstream on behalf of the partition's credentials.
    async fn send(&mut self, machine: &mut LegacySession, message: Message) -> bool {
        // The host request being handled; else the one whose call this is (a request
        // queued while the session initialized, sent again after a 404).
        let relay = self.relay.clone().or_else(|| match &message {
            Message::Request(r) => machine
                .upstream_host(&r.id)
                .and_then(|h| self.hosts.get(&h))
                .map(|reply| reply.relay.clone()),
            _ => None,
        });
        let on_behalf = OnBehalf {
            authorization: self.opener.authorization.as_ref(),
            forwarded: relay.as_ref().map(|r| &r.forwarded),
            trace: relay.as_ref().and_then(|r| r.trace.as_ref()),
        };
        let id = match &message {
            Message::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let caused_by = self
            .current
            .or_else(|| id.as_ref().and_then(|i| machine.upstream_host(i)));
        match self.lease.send(&message, on_behalf).await {
            Ok(()) => true,
            Err(LegacyError::Upstream(UpstreamError::Denied(denial))) => {
                self.denied(machine, caused_by, id, &denial);
                true
            }
            Err(LegacyError::Expired) => {
                let refused: Vec<RequestId> = id.into_iter().collect();
                self.expired(machine, &refused).await
            }
            Err(e) => {
                debug!(error = %e, "upstream send failed");
                if let Some(id) = id {
                    let _ = machine.handle_upstream_lost(&id, self.clock.now());
                }
                true
            }
        }
    }

    /// The upstream refused the partition's credentials (401/403) on a message: the
    /// host request it was sent for gets the refusal as it is (status, challenges,
    /// body; DESIGN.md: challenges are relayed exactly as in the forward direction),
    /// every host request when it was the session's own (`initialize`: the session
    /// cannot be opened with these credentials, and the partition ends). A host that
    /// comes back with new credentials is another partition.
    fn denied(
        &mut self,
        machine: &mut LegacySession,
        caused_by: Option<HostKey>,
        id: Option<RequestId>,
        denial: &Denial,
    ) {
        let own = caused_by.is_none();
        let targets: Vec<HostKey> = match caused_by {
            Some(h) => vec![h],
            None => self.hosts.keys().copied().collect(),
        };
        warn!(
            status = denial.status.as_u16(),
            hosts = targets.len(),
            "reverse bridge: the legacy upstream refused the credentials; relayed"
        );
        for host in targets {
            self.answer(host, Answer::Denied(Box::new(denial.clone())));
        }
        if own {
            // Closed rather than failed: the task lingers to relay the refusal.
            self.refused = Some(Box::new(denial.clone()));
            machine.close();
        } else if let Some(id) = id {
            let _ = machine.handle_upstream_lost(&id, self.clock.now());
        }
    }

    /// The server forgot the session (2025-11-25 transports, "Session Management": on
    /// a 404 the client MUST start a new session): a new pooled session, and the
    /// machine initializes again on it. `false`: no new session could be opened.
    async fn expired(&mut self, machine: &mut LegacySession, refused: &[RequestId]) -> bool {
        match self.opener.open().await {
            Ok(fresh) => {
                let old = std::mem::replace(&mut self.lease, fresh);
                self.opener.pool.discard(old).await;
                let _ = machine.handle_upstream_expired(refused, self.clock.now());
                true
            }
            Err(e) => {
                warn!(error = %e, "reverse bridge: the legacy session expired and cannot be opened again");
                machine.close();
                false
            }
        }
    }
}
