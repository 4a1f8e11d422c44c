//! One partition's task: the reverse machine of one legacy session and the pooled
//! session under it, owned by one task (actor style, like `pipe`). Host requests
//! arrive on a bounded channel, the server's messages on the session's bounded
//! stream, timers from [`LegacySession::poll_timeout`]; whatever the machine emits is
//! sent upstream or handed to the waiting host request.

use super::Clock;
use crate::gateway::upstream::era::Target;
use crate::gateway::upstream::legacy::{
    Lease, LegacyError, LegacySession as Upstream, LegacyTransport, PoolKey, SessionPool,
};
use crate::gateway::upstream::OnBehalf;
use dualera_adapters::jsonrpc::{Message, RequestId, Response};
use dualera_adapters::reverse::{Event, HostKey, HostRequest, LegacySession, RoundState};
use http::header::HeaderValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn, Instrument};

/// Host requests queued toward one partition's task.
pub(super) const COMMAND_QUEUE: usize = 64;
/// Notifications queued toward one host request's stream; one more while it is full
/// is dropped (a host that does not read its stream must not stall the session).
pub(super) const NOTIFICATION_QUEUE: usize = 64;

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

/// The task's state besides the machine.
pub(super) struct Task {
    pub(super) machine: LegacySession,
    pub(super) lease: Lease,
    pub(super) opener: Opener,
    pub(super) clock: Clock,
    /// Host requests waiting for their answer.
    pub(super) hosts: HashMap<HostKey, Reply>,
    /// How long the task lives with no host request and no call in progress.
    pub(super) idle: Duration,
}

impl Task {
    /// Runs until the machine fails, the session ends for good, the bridge drops the
    /// partition, or it stays idle for `idle`. `on_exit` unregisters it.
    pub(super) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        on_exit: impl FnOnce(),
    ) {
        let span = tracing::debug_span!("reverse_partition", session = tracing::field::Empty);
        if let Some(id) = self.lease.upstream_session_id() {
            span.record(
                "session",
                crate::digest::short_digest(id.as_bytes(), 4).as_str(),
            );
        }
        async {
            loop {
                if !self.drain().await {
                    break;
                }
                let deadline = self.machine.poll_timeout().map(|t| self.clock.instant(t));
                let quiet = self.hosts.is_empty() && self.machine.calls() == 0;
                tokio::select! {
                    cmd = commands.recv() => match cmd {
                        None => break,
                        Some(Command::Request(request, reply)) => self.request(*request, reply),
                        Some(Command::Gone(key)) => {
                            self.hosts.remove(&key);
                            self.machine.handle_host_gone(key);
                        }
                    },
                    item = self.lease.recv() => match item {
                        Some(Ok(message)) => {
                            // A server request on a call's response stream goes to that
                            // call; one on the standalone stream (`on` is `None`) goes to
                            // the one call in progress, and is refused when several are.
                            let on = match &message {
                                Message::Request(r) => self.lease.carrier(&r.id),
                                _ => None,
                            };
                            if let Err(e) = self.machine.handle_upstream_message(on.as_ref(), message, self.clock.now()) {
                                debug!(error = %e, "upstream message refused by the reverse machine");
                            }
                        }
                        Some(Err(LegacyError::Expired)) => {
                            if !self.expired(&[]).await {
                                break;
                            }
                        }
                        Some(Err(e)) => debug!(error = %e, "upstream answer stream broke"),
                        None => {
                            self.machine.close();
                            let _ = self.drain().await;
                            break;
                        }
                    },
                    () = sleep_until(deadline) => self.machine.handle_timeout(self.clock.now()),
                    () = tokio::time::sleep(self.idle), if quiet => {
                        debug!("reverse partition idle; closing its legacy session");
                        break;
                    }
                }
            }
            self.machine.close();
            for (_, reply) in self.hosts.drain() {
                drop(reply);
            }
            self.opener.pool.discard(self.lease).await;
        }
        .instrument(span)
        .await;
        on_exit();
    }

    fn request(&mut self, request: HostRequest, reply: Reply) {
        let key = request.host;
        let id = request.id.clone();
        match self.machine.handle_host_request(request, self.clock.now()) {
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
    async fn drain(&mut self) -> bool {
        // Bounded: every event is the answer to an input, and the machine's maps are.
        while let Some(event) = self.machine.poll_event() {
            match event {
                Event::ToUpstream { message } => {
                    let sent = self.send(message).await;
                    if !sent {
                        return false;
                    }
                }
                Event::ToHost {
                    host,
                    message: Message::Response(r),
                } => self.answer(host, Answer::Response(r)),
                Event::ToHost { host, message } => {
                    if let Some(reply) = self.hosts.get(&host) {
                        if reply.notifications.try_send(message).is_err() {
                            debug!(%host, "notification for a host stream that is full or gone dropped");
                        }
                    }
                }
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
                    }) = self.machine.poll_event()
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

    /// Ends host request `host` with `answer`.
    fn answer(&mut self, host: HostKey, answer: Answer) {
        if let Some(reply) = self.hosts.remove(&host) {
            let _ = reply.answer.send(answer);
        }
    }

    /// Sends one message upstream on behalf of the partition's credentials.
    async fn send(&mut self, message: Message) -> bool {
        let on_behalf = OnBehalf {
            authorization: self.opener.authorization.as_ref(),
            forwarded: None,
            trace: None,
        };
        let id = match &message {
            Message::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        match self.lease.send(&message, on_behalf).await {
            Ok(()) => true,
            Err(LegacyError::Expired) => {
                let refused: Vec<RequestId> = id.into_iter().collect();
                self.expired(&refused).await
            }
            Err(e) => {
                debug!(error = %e, "upstream send failed");
                if let Some(id) = id {
                    let _ = self.machine.handle_upstream_lost(&id, self.clock.now());
                }
                true
            }
        }
    }

    /// The server forgot the session (2025-11-25 transports, "Session Management": on
    /// a 404 the client MUST start a new session): a new pooled session, and the
    /// machine initializes again on it. `false`: no new session could be opened.
    async fn expired(&mut self, refused: &[RequestId]) -> bool {
        match self.opener.open().await {
            Ok(fresh) => {
                let old = std::mem::replace(&mut self.lease, fresh);
                self.opener.pool.discard(old).await;
                let _ = self
                    .machine
                    .handle_upstream_expired(refused, self.clock.now());
                true
            }
            Err(e) => {
                warn!(error = %e, "reverse bridge: the legacy session expired and cannot be opened again");
                self.machine.close();
                false
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
