//! Upstream exchanges of shared sessions, their leases, and the sweeper.
//!
//! The replica whose step emitted an upstream request runs it: every message the
//! upstream sends back is fed to the session as a step of its own, and the step that
//! feeds the response drops the exchange's lease in the same transaction. While it
//! runs, the lease (owner + deadline) is renewed at a third of its length; a replica
//! that dies stops renewing, and once the deadline passed any replica's sweeper takes
//! the lease over and sends the same request again (the upstream sees it at least once,
//! at most once per lease holder). A renewal that finds the lease gone (the request was
//! cancelled, or answered through a replica that took over) aborts the exchange. A
//! request's first attempt that its POST drives starts with its lease pending
//! (`super::PendingLease`): written by the step that first shows the host anything of
//! it, before the POST's priming event, or at the first renewal tick, whichever comes
//! first; an answer before any of them drops it unwritten.
//!
//! The sweeper also fires the machines' timers: every replica claims due sessions from
//! a shared sorted set (moving them a few seconds ahead, so a replica that dies while
//! handling one leaves it to another) and feeds each its timer input (`driver::feed`).
//! Both looks are one script, one round trip per tick.

use super::backlog::{self, Progress, Room};
use super::client::SweepTick;
use super::stored::{codec, LeaseRecord, Record};
use super::{wall_ms, Appended, Ctx, RedisSessions, Running};
use crate::digest::log_tag;
use crate::driver::{self, Ended, Input};
use crate::forwarded::Forwarded;
use crate::store::StepError;
use crate::Route;
use dualera_adapters::jsonrpc;
use dualera_adapters::session::Denied;
use dualera_adapters::{Message, PeerStream, RequestId, SessionError, UpstreamRole};
use futures_util::future::abortable;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info, warn, Instrument};

/// Each upstream message of a shared session is fed (and stored) as a step of its
/// own before the next is read from the upstream; the SSE relays read the session's
/// streams from Redis at their hosts' pace, and the next message is read only once
/// the relay of the stream the last one went to has caught up to within half the
/// replay size (`backlog`): this replica's relay, or another replica's through acks.
struct RedisFeed<'a> {
    sessions: &'a Arc<RedisSessions>,
    gw: &'a Arc<Route>,
    sid: &'a str,
    /// What the last message's step appended.
    appended: Mutex<Vec<Appended>>,
    /// The remote relays this exchange follows, and those it gave up on.
    followed: Mutex<Followed>,
}

/// The streams an exchange feeds whose relay is on another replica.
#[derive(Default)]
struct Followed {
    /// Followed relays by holder key: their progress lives as long as this exchange
    /// waits for it.
    remote: Vec<(String, Arc<Progress>)>,
    /// Streams whose remote relay did not keep up within the limit: not followed
    /// again by this exchange.
    gave_up: Vec<String>,
}

/// Streams of one exchange whose remote relays are followed (an exchange feeds one
/// stream; a few more are resumptions racing each other).
const REMOTE_FOLLOWED: usize = 4;

impl RedisFeed<'_> {
    /// After a stored step: a stream that went to another replica's relay is
    /// followed from just before what the step appended (the relay acks from there),
    /// unless it already is; one that did not is no longer followed.
    fn follow(&self, appended: &[Appended]) {
        let Ok(mut guard) = self.followed.lock() else {
            return;
        };
        let Followed { remote, gave_up } = &mut *guard;
        let backlog = &self.sessions.backlog;
        for (holder, seq, elsewhere) in appended {
            if gave_up.contains(holder) {
                continue;
            }
            let followed = remote.iter().position(|(h, _)| h == holder);
            if !elsewhere {
                if let Some(i) = followed {
                    let (h, p) = remote.remove(i);
                    backlog.unregister(&h, &p);
                }
                continue;
            }
            if followed.is_some_and(|i| backlog.holds(holder, &remote[i].1)) {
                continue;
            }
            if let Some(i) = followed {
                remote.remove(i);
            }
            let progress = Progress::remote_after(seq.saturating_sub(1));
            backlog.register(holder, &progress);
            if remote.len() >= REMOTE_FOLLOWED {
                let (h, p) = remote.remove(0);
                backlog.unregister(&h, &p);
            }
            remote.push((holder.clone(), progress));
        }
    }

    /// A remote relay that did not catch up within the limit (its replica may be
    /// gone) is no longer waited for.
    fn give_up(&self, holder: &str) {
        let Ok(mut guard) = self.followed.lock() else {
            return;
        };
        let Followed { remote, gave_up } = &mut *guard;
        let Some(i) = remote.iter().position(|(h, _)| h == holder) else {
            // A relay of this replica: it ends itself when its host stalls too long.
            return;
        };
        let (h, p) = remote.remove(i);
        self.sessions.backlog.unregister(&h, &p);
        if gave_up.len() < REMOTE_FOLLOWED {
            gave_up.push(h);
        }
    }
}

impl Drop for RedisFeed<'_> {
    fn drop(&mut self) {
        if let Ok(followed) = self.followed.get_mut() {
            for (h, p) in followed.remote.drain(..) {
                self.sessions.backlog.unregister(&h, &p);
            }
        }
    }
}

impl driver::Feed for RedisFeed<'_> {
    async fn room(&self, _: &UpstreamRole) {
        let appended = self
            .appended
            .lock()
            .map(|mut a| std::mem::take(&mut *a))
            .unwrap_or_default();
        let s = self.sessions;
        let window = backlog::window(s.replay);
        // A relay stuck on its host gives up after `stalled_reader_timeout` (and one
        // taken over elsewhere notices within a hold tick): no longer than that here.
        let limit = s.stalled_reader_timeout + super::HOLD_TICK;
        for (holder, seq, _) in appended {
            match s.backlog.room(&holder, seq, window, limit).await {
                Room::Free => {}
                Room::Waited => debug!(seq, "upstream read waited for a slow host"),
                Room::TimedOut => {
                    info!(
                        seq,
                        "the relay of this stream stopped answering; no longer waited for"
                    );
                    self.give_up(&holder);
                }
            }
        }
    }

    async fn message(&self, id: &RequestId, message: Message, last: bool) -> bool {
        let appended = self
            .sessions
            .feed_upstream(self.gw, self.sid, id, message, last)
            .await;
        self.follow(&appended);
        if let Ok(mut a) = self.appended.lock() {
            *a = appended;
        }
        true
    }

    async fn ended(&self, id: &RequestId, ended: Ended) {
        // Answered: the step that fed the answer dropped the lease already.
        if !matches!(ended, Ended::Done) {
            self.sessions
                .ended_upstream(self.gw, self.sid, id, ended)
                .await;
        }
    }
}

/// Feeds a session's machine one input no host request carries, as a step does (and
/// as a step left unstored is fed again, `super::Unstored`).
pub(super) fn feed_input(
    record: &mut Record,
    input: Input,
    now: dualera_adapters::Timestamp,
) -> Result<Option<Denied>, SessionError> {
    let outcome = driver::feed(&mut record.machine, input, now)?;
    if let Some(Denied::Request { legacy }) = &outcome {
        record.forget(&PeerStream::Request(legacy.clone()));
        record.set_auth(Some(legacy.clone()), None);
    }
    Ok(outcome)
}

/// How often due timers are looked for (the sweeper's tick).
const TIMER_PERIOD: Duration = Duration::from_millis(100);
/// Leases past their deadline are looked for every so many ticks.
const LEASE_EVERY: u64 = 2;
/// Timers claimed per look.
const TIMERS_AT_ONCE: usize = 32;
/// Leases taken over per look.
const LEASES_AT_ONCE: usize = 8;
/// How long a claimed timer is left to its claimer.
const TIMER_CLAIM: Duration = Duration::from_secs(5);

impl RedisSessions {
    /// Runs one upstream exchange to its end, feeding what comes back.
    pub(super) async fn run_exchange(
        self: Arc<Self>,
        gw: Arc<Route>,
        sid: String,
        running: Running,
    ) {
        let id = running.start.id.clone();
        let span = tracing::debug_span!("upstream", session = %log_tag(&sid), rpc.id = %id, role = ?running.start.role, replica = %self.replica);
        // Boxed where it is made: the exchange's future is about 5 KB, and held by
        // value it was copied into the `Abortable`, into the span's wrapper and into
        // this future's state, and this future (twice its size) copied again where its
        // caller boxes or spawns it: tens of KB moved per replicated flow.
        let (work, handle) = abortable(Box::pin(self.clone().exchange(
            gw.clone(),
            sid.clone(),
            running,
        )));
        self.exchanges.insert((sid.clone(), id.clone()), handle);
        let _ = work.instrument(span).await;
        self.exchanges.remove(&(sid.clone(), id.clone()));
        if self.lease_pending(&sid, &id) {
            // Ended without a stored answer (the store failed, or the session moved
            // on elsewhere): the lease is written now if the session still awaits the
            // answer, so that a sweeper redoes the request, as it would have had the
            // lease been written when the exchange started.
            tokio::spawn(self.leave_lease(gw, sid, id));
        }
    }

    /// Writes a pending lease whose exchange ended (tried a few times, a third of the
    /// lease apart), then forgets it.
    async fn leave_lease(self: Arc<Self>, gw: Arc<Route>, sid: String, id: RequestId) {
        for _ in 0..3 {
            match self.write_leases(&gw, &sid).await {
                Ok(()) => break,
                Err(e) => {
                    debug!(error = %e, "the lease of an ended exchange not written");
                    tokio::time::sleep(self.lease / 3).await;
                }
            }
        }
        self.forget_lease(&sid, &id);
    }

    /// The exchange itself ([`driver::exchange`]), for as long as this replica holds
    /// its lease. A cancellation from another replica arrives on this replica's
    /// channel (the lease names it as the owner).
    async fn exchange(self: Arc<Self>, gw: Arc<Route>, sid: String, running: Running) {
        let renew = self.renew(&gw, &sid, &running.start.id, running.lease.as_deref());
        let feed = RedisFeed {
            sessions: &self,
            gw: &gw,
            sid: &sid,
            appended: Mutex::default(),
            followed: Mutex::default(),
        };
        // Boxed: inline, the upstream stack's future (about 12 KB) would make this one,
        // and every wrapper that takes it by value (the abort handle, the span, the
        // boxed inline exchange), that much larger, copied at each move (54 KB before).
        let exchange = Box::pin(driver::exchange(
            &gw,
            &running.start,
            &running.forwarded,
            running.head.as_deref(),
            &feed,
        ));
        tokio::select! {
            () = exchange => {}
            () = renew => {
                info!("lease lost; exchange abandoned");
            }
        }
    }

    /// Renews the lease until it is lost (never returns while it is held). A lease
    /// still pending at a tick (`super::PendingLease`) is written instead, and
    /// renewed from the next.
    async fn renew(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        id: &RequestId,
        lease: Option<&str>,
    ) {
        let Some(lease) = lease else {
            return std::future::pending().await;
        };
        let ttls = (self.idle_ttl_ms(), self.session_ttl_ms());
        let every = self.lease / 3;
        let session = self.keys.session(sid);
        let zset = self.keys.leases();
        let mut failures = 0u32;
        loop {
            tokio::time::sleep(every).await;
            if self.lease_pending(sid, id) {
                match self.write_leases(gw, sid).await {
                    Ok(()) => failures = 0,
                    Err(e) => {
                        failures += 1;
                        debug!(error = %e, "pending lease not written");
                        if failures >= 3 {
                            return;
                        }
                    }
                }
                continue;
            }
            match self
                .redis
                .renew_lease(
                    lease,
                    zset,
                    &session,
                    &self.replica,
                    wall_ms() + self.lease_ms(),
                    ttls,
                )
                .await
            {
                Ok(true) => failures = 0,
                Ok(false) => return,
                Err(e) => {
                    // Past the deadline another replica may take it over; until then
                    // this one keeps going.
                    failures += 1;
                    debug!(error = %e, "lease renewal failed");
                    if failures >= 3 {
                        return;
                    }
                }
            }
        }
    }

    async fn feed_upstream(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        id: &RequestId,
        message: Message,
        last: bool,
    ) -> Vec<Appended> {
        let input = Input::Upstream {
            on: Some(id.clone()),
            message,
        };
        // The last message is kept in the context, to be fed again if its step
        // answers before it is stored (`super::Unstored`).
        let (replay, input) = if last {
            (Some(input), None)
        } else {
            (None, Some(input))
        };
        let ctx = Ctx {
            done_upstream: last.then(|| id.clone()),
            appended: Some(Mutex::default()),
            replay,
            ..Ctx::default()
        };
        let Some(input) = ctx.replay.as_ref().or(input.as_ref()) else {
            return Vec::new();
        };
        let fed = self.feed(gw, sid, &ctx, input).await;
        match fed {
            Ok(_) => {}
            Err(StepError::Refused(e)) => debug!(error = %e, "upstream message refused"),
            Err(StepError::NotFound { .. }) => debug!("session gone; upstream message dropped"),
            Err(StepError::Broken) => {}
            Err(StepError::Store(e)) => {
                // The lease survives: past its deadline a replica redoes the exchange.
                warn!(error = %e, "upstream message not stored; the lease will redo it");
            }
        }
        ctx.appended
            .and_then(|a| a.into_inner().ok())
            .unwrap_or_default()
    }

    /// The exchange ended without an answer ([`driver::feed`] says what each way
    /// means), its lease dropped in the same step.
    async fn ended_upstream(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        id: &RequestId,
        ended: Ended,
    ) {
        let ctx = Ctx {
            done_upstream: Some(id.clone()),
            ..Ctx::default()
        };
        let id = id.clone();
        let fed = self.feed(gw, sid, &ctx, &Input::Ended { id, ended }).await;
        match fed {
            Ok(Some(Denied::Round { legacy, live })) => {
                debug!(rpc.id = %legacy, live = %live, "round parked until the answer is sent again");
            }
            Ok(_) => {}
            Err(StepError::Store(e)) => warn!(error = %e, "ended upstream request not stored"),
            Err(_) => {}
        }
    }

    /// Feeds one input that no host request carries ([`driver::feed`]) as a step of
    /// its own. Denied credentials forget what the session keeps for a first attempt
    /// the machine forgot (its stream, its credential): the host may send the request
    /// again, with others.
    async fn feed(
        self: &Arc<Self>,
        gw: &Arc<Route>,
        sid: &str,
        ctx: &Ctx,
        input: &Input,
    ) -> Result<Option<Denied>, StepError<SessionError>> {
        self.step(gw, sid, ctx, |record, now| {
            feed_input(record, input.clone(), now)
        })
        .await
    }

    /// Fires one session's due timers.
    async fn fire_timers(self: Arc<Self>, gw: Arc<Route>, sid: String) {
        let ctx = Ctx {
            timer: true,
            ..Ctx::default()
        };
        match self.feed(&gw, &sid, &ctx, &Input::Timer).await {
            Ok(_) => {}
            Err(StepError::NotFound { .. }) => {
                let _ = self.redis.delete(&[], self.keys.timers(), &[sid]).await;
            }
            Err(StepError::Store(e)) => debug!(error = %e, "timer not fired"),
            Err(StepError::Refused(_) | StepError::Broken) => {}
        }
    }

    /// Drops a lease that cannot be redone (unreadable, or its session is gone).
    async fn drop_lease(&self, lease: &str) {
        let lease = [lease.to_owned()];
        let _ = self.redis.delete(&lease, self.keys.leases(), &lease).await;
    }

    /// Redoes an exchange whose lease this replica just took over.
    async fn take_over(
        self: Arc<Self>,
        gw: Arc<Route>,
        lease: String,
        record: Vec<u8>,
        previous: String,
    ) {
        let Ok(rec) = codec::decode::<LeaseRecord>(&record, "lease record") else {
            warn!("unreadable lease dropped");
            self.drop_lease(&lease).await;
            return;
        };
        let Ok(Message::Request(request)) = jsonrpc::parse(&rec.request.0) else {
            self.drop_lease(&lease).await;
            return;
        };
        let session: Option<Box<Record>> = match self.redis.load(&self.keys.session(&rec.sid)).await
        {
            Ok(super::client::Loaded::Found { state, .. }) => self.decode(&state).await.ok(),
            Ok(_) => None,
            Err(e) => {
                debug!(error = %e, "lease not taken over now");
                return;
            }
        };
        let Some(session) = session else {
            self.drop_lease(&lease).await;
            return;
        };
        info!(session = %log_tag(&rec.sid), rpc.id = %request.id, from = %previous, replica = %self.replica, "lease taken over; upstream request sent again");
        let mut session = session;
        let (machine, calls) = session.split();
        let (auth, trace) = driver::carried(&rec.role, &request, machine, &calls, None);
        let start = Running {
            start: driver::Start {
                role: rec.role,
                id: request.id.clone(),
                message: Message::Request(request).into(),
                headers: rec.headers,
                auth,
                trace,
            },
            lease: Some(lease),
            head: None,
            forwarded: Forwarded::from_pairs(&session.forwarded),
        };
        let sid = rec.sid;
        self.run_exchange(gw, sid, start).await;
    }
}

/// The sweeper: due timers and leases past their deadline, forever (aborted at stop),
/// one script per tick. Its round trip also keeps readiness current while no traffic
/// flows.
pub(super) async fn sweep(sessions: Arc<RedisSessions>, gw: Arc<Route>) {
    let mut tick = tokio::time::interval(TIMER_PERIOD);
    let claim = u64::try_from(TIMER_CLAIM.as_millis()).unwrap_or(u64::MAX);
    let timers = sessions.keys.timers();
    let leases = sessions.keys.leases();
    let mut n = 0u64;
    loop {
        tick.tick().await;
        n = n.wrapping_add(1);
        let now = wall_ms();
        let look = if n.is_multiple_of(LEASE_EVERY) {
            LEASES_AT_ONCE
        } else {
            0
        };
        let swept = sessions
            .redis
            .sweep(&SweepTick {
                timers,
                leases_zset: leases,
                now,
                due_at_once: TIMERS_AT_ONCE,
                claim_until: now + claim,
                leases: look,
                owner: &sessions.replica,
                deadline: now + sessions.lease_ms(),
            })
            .await;
        sessions.store_unstored(&gw);
        match swept {
            Ok(swept) => {
                for sid in swept.due {
                    tokio::spawn(sessions.clone().fire_timers(gw.clone(), sid));
                }
                for (lease, record, previous) in swept.leases {
                    tokio::spawn(
                        sessions
                            .clone()
                            .take_over(gw.clone(), lease, record, previous),
                    );
                }
            }
            Err(e) => debug!(error = %e, "timers and leases not swept"),
        }
    }
}
