//! Relaying one SSE stream of a shared session to the host connection this replica
//! holds: read the stream's Redis Stream after the last event sent, send, then wait
//! for a wake-up (pub/sub, or this replica's own step) and read again. The connection
//! is the stream's *holder* (a key with a token, renewed while it relays): a
//! `Last-Event-ID` resumption on any replica takes the stream over, and the previous
//! relay stops at its next read, so a message goes out on one connection only.
//!
//! A POST's stream is also fed in memory: what this replica's own steps append to it
//! is handed to its relay (the step script checked that the relay still holds the
//! stream), so the relay reads Redis only when another replica wrote (it is woken
//! through its replica's channel) or a sequence number is missing.

use super::backlog::{self, Progress};
use super::wake::{self, Inbox, Waiter, Wake};
use super::{hold_ms, Ctx, DeciderGuard, RedisSessions};
use crate::body::{ChannelBody, GatewayBody, MeteredSender, SendError};
use crate::digest::log_tag;
use crate::legacy_http::STREAM_QUEUE;
use crate::sse;
use crate::store::StepError;
use crate::Route;
use bytes::Bytes;
use http::Response;
use std::sync::Arc;
use tracing::{debug, info, warn, Instrument};

/// Entries read at once.
const BATCH: usize = 64;

/// How a relay begins.
pub(super) enum Opening {
    /// The priming event, then the stream; the hold is taken with the first read.
    PrimeAndTakeOver,
    /// The stream (a resumption); the hold is taken with the first read.
    TakeOver,
    /// The priming event, then the stream; the hold is already this relay's.
    Prime,
    /// The stream; the hold is already this relay's.
    Held,
    /// The priming event and these events a step handed over (it took the hold),
    /// then the stream after them, unless they ended it; read from Redis first only
    /// when `read` (a wake-up came meanwhile).
    Preface {
        preface: Vec<Bytes>,
        ended: bool,
        read: bool,
    },
}

/// Where a relay gets its wake-ups and, for a POST's stream, the entries this
/// replica's steps hand over.
pub(super) struct Feed {
    /// Registered before the step that opened the stream, when there was one.
    pub(super) waiter: Option<Waiter>,
    /// The POST's decider (kept registered while the relay runs).
    pub(super) inbox: Option<DeciderGuard>,
}

impl RedisSessions {
    /// Takes over stream `number`'s connection and relays it from after `after`.
    pub(super) async fn open_relay(
        self: &Arc<Self>,
        sid: &str,
        number: u64,
        after: u64,
        holder: Option<u64>,
        standalone: bool,
        prime: bool,
    ) -> Response<GatewayBody> {
        // The hold is taken in the same round trip as the first read.
        let token = self.token();
        let start = if prime {
            Opening::PrimeAndTakeOver
        } else {
            Opening::TakeOver
        };
        let feed = Feed {
            waiter: None,
            inbox: None,
        };
        self.relay_body(
            None, sid, number, after, holder, standalone, token, start, feed,
        )
    }

    /// The SSE stream of a POST: what its deciding step handed over (that step also
    /// took the hold for it), then what later steps hand over or the stream holds;
    /// or, when the POST stopped waiting before any message (or the stream's first
    /// entries were written elsewhere), the stream from its start. `waiter` was
    /// registered before the POST's step.
    pub(super) async fn post_relay(
        self: &Arc<Self>,
        sid: &str,
        number: u64,
        guard: DeciderGuard,
        waiter: Waiter,
    ) -> Response<GatewayBody> {
        let decider = guard.decider.clone();
        let handed = decider.inbox.take();
        let token = decider.token.clone();
        if handed.first().is_none_or(|h| h.0 != 1) {
            let feed = Feed {
                waiter: Some(waiter),
                inbox: Some(guard),
            };
            let start = Opening::PrimeAndTakeOver;
            return self.relay_body(
                None,
                sid,
                number,
                0,
                Some(number),
                false,
                token,
                start,
                feed,
            );
        }
        let after = handed.last().map_or(0, |h| h.0);
        let ended = handed.iter().any(|h| h.2);
        let preface = handed
            .into_iter()
            .filter(|(_, m, _)| !m.is_empty())
            .map(|(seq, m, _)| sse::encode(Some(&format!("{number}.{seq}")), &m))
            .collect();
        // Nothing to read unless a wake-up came since the step (or one could have
        // been missed).
        let read = !self.wakes.listening() || waiter.rx.has_changed().unwrap_or(true);
        let feed = Feed {
            waiter: Some(waiter),
            inbox: Some(guard),
        };
        self.relay_body(
            None,
            sid,
            number,
            after,
            Some(number),
            false,
            token,
            Opening::Preface {
                preface,
                ended,
                read,
            },
            feed,
        )
    }

    /// The relay of a standalone stream whose hold `token` already has.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn relay_with(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        number: u64,
        after: u64,
        holder: Option<u64>,
        standalone: bool,
        token: String,
        prime: bool,
    ) -> Response<GatewayBody> {
        let start = if prime { Opening::Prime } else { Opening::Held };
        let feed = Feed {
            waiter: None,
            inbox: None,
        };
        self.relay_body(
            Some(gw.clone()),
            sid,
            number,
            after,
            holder,
            standalone,
            token,
            start,
            feed,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn relay_body(
        self: &Arc<Self>,
        gw: Option<Arc<Route>>,
        sid: &str,
        number: u64,
        after: u64,
        holder: Option<u64>,
        standalone: bool,
        token: String,
        start: Opening,
        feed: Feed,
    ) -> Response<GatewayBody> {
        // Byte-bounded like an in-memory stream's connection: a host that does not read
        // is cut off (the events stay in the stream, for Last-Event-ID), and the relay
        // never holds more than this for it.
        let (tx, body) = ChannelBody::metered(Vec::new(), STREAM_QUEUE, self.max_buffered);
        let take_over = matches!(start, Opening::TakeOver | Opening::PrimeAndTakeOver);
        let mut read = true;
        match start {
            Opening::Prime | Opening::PrimeAndTakeOver => {
                // Priming event: lets the host resume this stream from here.
                let _ = tx.try_send(sse::prime(&format!("{number}.{after}")));
            }
            Opening::Preface {
                preface,
                ended,
                read: first,
            } => {
                let _ = tx.try_send(sse::prime(&format!("{number}.0")));
                for event in preface {
                    let _ = tx.try_send(event);
                }
                if ended {
                    return crate::body::sse_response(body);
                }
                read = first;
            }
            Opening::TakeOver | Opening::Held => {}
        }
        let me = self.clone();
        let sid = sid.to_owned();
        let holder_key = me.keys.holder(&sid, holder);
        // Registered before the task runs: an exchange feeding this stream waits for
        // this relay from now on (a POST's was registered by its deciding step).
        let progress = feed.inbox.as_ref().map_or_else(
            || Progress::starting_after(after),
            |g| g.decider.progress.clone(),
        );
        progress.sent(after);
        self.backlog.register(&holder_key, &progress);
        let span = tracing::debug_span!("relay", session = %log_tag(&sid), stream = number);
        tokio::spawn(
            async move {
                let mut acks = Acks::new(me.replay, after);
                let finished = me
                    .relay(
                        &sid,
                        number,
                        after,
                        &holder_key,
                        &token,
                        &tx,
                        take_over,
                        read,
                        feed,
                        &progress,
                        &mut acks,
                    )
                    .await;
                me.backlog.unregister(&holder_key, &progress);
                // The host sees the end of the stream now, not after the bookkeeping.
                drop(tx);
                if let Some(writer) = acks.to.filter(|_| !finished) {
                    // Its exchange there stops waiting for this relay.
                    me.ack(&sid, &holder_key, &writer, None).await;
                }
                if finished {
                    // A finished stream's hold just expires.
                    return;
                }
                let released = me
                    .redis
                    .release_holder(&holder_key, &token)
                    .await
                    .unwrap_or(false);
                if standalone && released {
                    if let Some(gw) = gw {
                        let ctx = Ctx::default();
                        let closed = me
                            .step(&gw, &sid, &ctx, |record, _now| {
                                record.set_auth(None, None);
                                record.machine.handle_standalone_closed()
                            })
                            .await;
                        if let Err(StepError::Store(e)) = closed {
                            warn!(error = %e, "standalone stream close not recorded");
                        }
                    }
                }
            }
            .instrument(span),
        );
        crate::body::sse_response(body)
    }

    /// Sends what the stream holds after `after`, then what arrives, until it ends
    /// (true), the host goes away, or another connection takes the stream over. With
    /// `take_over`, the first read first makes this connection the stream's holder;
    /// without `read`, the first read waits for a wake-up. `acks` learns the other
    /// replica that writes the stream, if one does, and what it was told.
    #[allow(clippy::too_many_arguments)]
    async fn relay(
        self: &Arc<Self>,
        sid: &str,
        number: u64,
        mut after: u64,
        holder_key: &str,
        token: &str,
        tx: &MeteredSender,
        mut take_over: bool,
        mut read: bool,
        feed: Feed,
        progress: &Progress,
        acks: &mut Acks,
    ) -> bool {
        let mut waiter = match feed.waiter {
            Some(w) => w,
            None => self.wakes.watch(sid, true).await,
        };
        // Entries addressed to this connection: a POST's come to its decider's inbox.
        let inbox = feed
            .inbox
            .as_ref()
            .map_or_else(|| Arc::new(Inbox::default()), |g| g.decider.inbox.clone());
        self.wakes.register(token, inbox.clone());
        let _registered = Registered {
            sessions: self,
            token,
        };
        let key = self.keys.stream(sid, number);
        let session = self.keys.session(sid);
        let session_ttl = self.session_ttl_ms();
        let mut next_keepalive = tokio::time::Instant::now() + self.keepalive;
        // This replica's hold tick (shared by its relays): the first renewal comes
        // within a tick, well inside the hold.
        let mut tick = self.hold_tick.subscribe();
        loop {
            let handed = inbox.notify.notified();
            let mut handed = std::pin::pin!(handed);
            handed.as_mut().enable();
            // What was handed over: sent as it is while it follows on.
            for (seq, m, end) in inbox.take() {
                if seq <= after {
                    continue;
                }
                if seq != after + 1 {
                    // Written elsewhere in between: the stream has it all.
                    read = true;
                    break;
                }
                after = seq;
                if !m.is_empty() {
                    let event = sse::encode(Some(&format!("{number}.{seq}")), &m);
                    if !send(tx, event, self.stalled_reader_timeout).await {
                        return false;
                    }
                }
                progress.sent(after);
                if end {
                    debug!("stream finished");
                    return true;
                }
                // Not after the end: the exchange that wrote it is over.
                self.acked(sid, holder_key, &inbox, after, acks).await;
            }
            if waiter.rx.has_changed().unwrap_or(true) {
                read = true;
            }
            if read || take_over {
                waiter.rx.borrow_and_update();
                let hold = take_over.then(|| (token, hold_ms()));
                let resuming = take_over;
                take_over = false;
                let (entries, current) =
                    match self.redis.read(&key, after, BATCH, holder_key, hold).await {
                        Ok(r) => r,
                        Err(e) => {
                            // The host resumes with Last-Event-ID once the store is back.
                            warn!(error = %e, "stream relay stopped: session store unavailable");
                            return false;
                        }
                    };
                if current.as_deref() != Some(token) {
                    debug!("stream taken over or ended; relay stops");
                    return false;
                }
                read = entries.len() == BATCH;
                let missing = entries
                    .first()
                    .map_or(0, |e| e.seq.saturating_sub(after + 1));
                if missing > 0 && resuming {
                    // The host asked for events older than the stream keeps.
                    debug!(missing, "resumed after events the stream no longer keeps");
                } else if missing > 0 {
                    // Trimmed while this relay had them still to send: only a stream
                    // whose writer does not wait for this relay (an exchange on
                    // another replica, see `backlog`) gets here.
                    warn!(
                        missing,
                        "stream entries past the replay size were trimmed before this connection got them"
                    );
                }
                for entry in entries {
                    after = entry.seq;
                    if let Some(m) = &entry.message {
                        let event = sse::encode(Some(&format!("{number}.{}", entry.seq)), m);
                        if !send(tx, event, self.stalled_reader_timeout).await {
                            return false;
                        }
                    }
                    progress.sent(after);
                    if entry.end {
                        debug!("stream finished");
                        return true;
                    }
                    self.acked(sid, holder_key, &inbox, after, acks).await;
                }
                if read {
                    continue;
                }
            }
            tokio::select! {
                    changed = waiter.rx.changed() => {
                        if changed.is_err() {
                            return false;
                        }
                        read = true;
                    }
                    () = &mut handed => {}
                    ticked = tick.changed() => {
                        if ticked.is_err() {
                            // The store itself is gone.
                            return false;
                        }
                        if tokio::time::Instant::now() >= next_keepalive {
                            next_keepalive = tokio::time::Instant::now() + self.keepalive;
                            match tx.try_send(sse::keepalive()) {
                                Err(SendError::Closed) => return false,
                                Err(SendError::Stalled) => {
                                    warn!(queued = tx.queued(), limit = self.max_buffered, "host not reading its SSE stream: closed; events kept for resumption");
                                    tx.cut();
                                    return false;
                                }
                                Ok(()) => {}
                            }
                        }
                        match self.redis.renew_holder(holder_key, &session, token, super::hold_ms(), session_ttl).await {
                            Ok(true) => {}
                            Ok(false) => {
                                info!("stream taken over by another connection");
                                return false;
                            }
                            Err(e) => {
                                warn!(error = %e, "stream relay stopped: session store unavailable");
                                return false;
                            }
                        }
                        // A missed wake-up costs at most one tick.
                        read = true;
                    }
                    () = tx.closed() => return false,
            }
        }
    }
}

/// A relay's acks to the replica whose exchange writes its stream (`backlog`).
struct Acks {
    /// Sent every so many entries.
    every: u64,
    /// The last sequence number acked.
    acked: u64,
    /// The replica whose steps write the stream (known from its first entry here).
    to: Option<String>,
}

impl Acks {
    fn new(replay: usize, after: u64) -> Self {
        Self {
            every: backlog::ack_every(replay),
            acked: after,
            to: None,
        }
    }
}

impl RedisSessions {
    /// After sending up to `after`: an ack to the other replica writing the stream,
    /// when one does (its entries came through pub/sub) and `every` entries passed.
    async fn acked(&self, sid: &str, holder_key: &str, inbox: &Inbox, after: u64, acks: &mut Acks) {
        let first = acks.to.is_none();
        if first {
            acks.to = inbox.writer();
        }
        let Some(writer) = &acks.to else {
            return;
        };
        // The first one at once: the writer learns that this relay acks.
        if !first && after < acks.acked.saturating_add(acks.every) {
            return;
        }
        acks.acked = after;
        self.ack(sid, holder_key, writer, Some(after)).await;
    }

    /// Publishes an ack (`None`: this relay stopped) to `writer`'s channel. A lost
    /// one delays the writer at most until its wait's limit.
    async fn ack(&self, sid: &str, holder_key: &str, writer: &str, sent: Option<u64>) {
        let payload = wake::payload(sid, &Wake::Ack(holder_key.to_owned(), sent));
        let channel = self.keys.wake_replica(writer);
        if let Err(e) = self.redis.publish(&channel, &payload).await {
            debug!(error = %e, "relay ack not published");
        }
    }
}

/// Keeps a relay's inbox registered while it runs.
struct Registered<'a> {
    sessions: &'a RedisSessions,
    token: &'a str,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.sessions.wakes.unregister(self.token);
    }
}

/// Sends one event once the connection has room, waiting up to `stall` for a host
/// that reads slowly; a host that takes nothing in that time is cut off (its events
/// stay in the session's stream for `Last-Event-ID`).
async fn send(tx: &MeteredSender, event: Bytes, stall: std::time::Duration) -> bool {
    let ready = tx.ready(stall).await;
    match tx.try_send(event) {
        Ok(()) if ready => true,
        Err(SendError::Closed) => false,
        _ => {
            warn!(
                queued = tx.queued(),
                "host not reading its SSE stream: closed; events kept for resumption"
            );
            tx.cut();
            false
        }
    }
}
