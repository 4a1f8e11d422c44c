//! What one shared session is in Redis (the `d` field of its hash), and the effects a
//! step hands to the compare-and-set script.
//!
//! The record holds what binds the session (the caller's credential digest), which
//! discover result it started from (by digest: one copy serves every session), its SSE
//! streams (number, which peer stream, last sequence number, finished), the
//! credentials of the requests still being served (each upstream call carries the
//! `Authorization` of the host request that caused it, also when another replica makes
//! the call), and the session machine itself, serialized by the adapters.

use crate::driver;
use crate::trace::TraceContext;
use dualera_adapters::{PeerStream, RequestId, Session, UpstreamRole};
use http::header::HeaderValue;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;

/// One SSE stream of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StreamMeta {
    /// Its number (first part of every event id).
    pub(super) number: u64,
    /// The machine's name for it.
    pub(super) peer: PeerStream,
    /// The last sequence number used.
    pub(super) seq: u64,
    /// Its last message was sent.
    pub(super) finished: bool,
    /// The `traceparent` (and `tracestate`) of the HTTP request that opened it: every
    /// upstream attempt of its legacy request carries it, whichever replica sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) trace: Option<(String, Option<String>)>,
}

/// A shared session.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    /// The binding key (principal, else token digest) the session is bound to, hex.
    pub(super) binding: String,
    /// Opened without credentials.
    #[serde(default)]
    pub(super) anonymous: bool,
    /// Digest of the shared `server/discover` result.
    #[serde(default)]
    pub(super) discover: Option<String>,
    /// The streams towards the peer.
    #[serde(default)]
    pub(super) streams: Vec<StreamMeta>,
    /// Numbers of finished streams, oldest first (kept for resumption, bounded).
    #[serde(default)]
    pub(super) finished: VecDeque<u64>,
    /// The last stream number used.
    #[serde(default)]
    pub(super) next_stream: u64,
    /// The `Authorization` of the latest host request of each legacy request still in
    /// flight, and of the open GET stream (`None` key), for the upstream calls no host
    /// request carries (a paused round's retry, a lease taken over, the subscription).
    #[serde(default)]
    pub(super) auth: Vec<(Option<RequestId>, String)>,
    /// The forwarded headers of the request that opened the session.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) forwarded: Vec<(String, String)>,
    /// Whether the session is in the `busy` set, as the last step left it (a step
    /// changes the set only when this changes; absent when not, as an idle session
    /// is).
    #[serde(default, rename = "b", skip_serializing_if = "std::ops::Not::not")]
    pub(super) busy: bool,
    /// The machine's next deadline as the last step wrote it to the timers zset, ms
    /// since the Unix epoch (a step writes the zset only when this changes).
    #[serde(default, rename = "t", skip_serializing_if = "Option::is_none")]
    pub(super) due: Option<u64>,
    /// The session machine.
    pub(super) machine: Session,
}

impl Record {
    pub(super) fn stream(&self, peer: &PeerStream) -> Option<&StreamMeta> {
        self.streams.iter().find(|s| &s.peer == peer)
    }

    pub(super) fn stream_mut(&mut self, peer: &PeerStream) -> Option<&mut StreamMeta> {
        self.streams.iter_mut().find(|s| &s.peer == peer)
    }

    pub(super) fn by_number(&self, number: u64) -> Option<&StreamMeta> {
        self.streams.iter().find(|s| s.number == number)
    }

    /// Opens a new stream for `peer` (replacing a finished one of the same name).
    pub(super) fn open_stream(&mut self, peer: PeerStream) -> u64 {
        self.streams.retain(|s| s.peer != peer);
        self.next_stream += 1;
        let number = self.next_stream;
        self.finished.retain(|n| *n != number);
        self.streams.push(StreamMeta {
            number,
            peer,
            seq: 0,
            finished: false,
            trace: None,
        });
        number
    }

    /// Forgets a stream (it was answered as plain JSON: no event id reached the peer).
    pub(super) fn forget(&mut self, peer: &PeerStream) {
        if let Some(i) = self.streams.iter().position(|s| &s.peer == peer) {
            let gone = self.streams.remove(i);
            self.finished.retain(|n| *n != gone.number);
        }
    }

    /// The machine, and what the driver reads and keeps beside it for upstream calls.
    pub(super) fn split(&mut self) -> (&mut Session, Calls<'_>) {
        (
            &mut self.machine,
            Calls {
                auth: &mut self.auth,
                streams: &self.streams,
            },
        )
    }

    /// Keeps `trace` as stream `peer`'s (see [`StreamMeta::trace`]).
    pub(super) fn set_trace(&mut self, peer: &PeerStream, trace: Option<&TraceContext>) {
        let kept = trace.and_then(|t| {
            Some((
                t.traceparent().to_str().ok()?.to_owned(),
                t.tracestate()
                    .and_then(|s| s.to_str().ok())
                    .map(str::to_owned),
            ))
        });
        if let Some(meta) = self.stream_mut(peer) {
            meta.trace = kept;
        }
    }

    pub(super) fn set_auth(&mut self, legacy: Option<RequestId>, value: Option<String>) {
        self.auth.retain(|(k, _)| *k != legacy);
        if let Some(v) = value {
            self.auth.push((legacy, v));
        }
    }
}

/// A record's credentials and streams, as the driver sees them
/// ([`driver::CallContext`]).
pub(super) struct Calls<'a> {
    auth: &'a mut Vec<(Option<RequestId>, String)>,
    streams: &'a [StreamMeta],
}

impl driver::CallContext for Calls<'_> {
    fn credential(&self, legacy: Option<&RequestId>) -> Option<HeaderValue> {
        self.auth
            .iter()
            .find(|(k, _)| k.as_ref() == legacy)
            .and_then(|(_, v)| HeaderValue::from_str(v).ok())
    }

    fn keep_credential(&mut self, legacy: &RequestId, auth: &HeaderValue) {
        let Ok(text) = auth.to_str() else { return };
        self.auth.retain(|(k, _)| k.as_ref() != Some(legacy));
        self.auth.push((Some(legacy.clone()), text.to_owned()));
    }

    /// The trace context of the HTTP request that opened the stream of `legacy`.
    fn trace(&self, machine: &Session, legacy: Option<&RequestId>) -> Option<Arc<TraceContext>> {
        let peer = machine.request_stream(legacy?)?;
        let meta = self.streams.iter().find(|s| &s.peer == peer)?;
        let (parent, state) = meta.trace.as_ref()?;
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_str(parent).ok()?);
        if let Some(state) = state.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
            headers.insert("tracestate", state);
        }
        TraceContext::from_headers(&headers).map(Arc::new)
    }
}

/// A stream entry to append.
#[derive(Debug, Serialize)]
pub(super) struct Append {
    /// The stream key.
    pub(super) k: String,
    /// Its sequence number (entry id `0-s`).
    pub(super) s: String,
    /// The `ARGV` index of the message, absent on a bare end marker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) m: Option<String>,
    /// Whether it ends the stream.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) e: bool,
    /// The key of the stream's connection holder (who gets woken).
    pub(super) h: String,
    /// The token of this replica's relay the step hands its entries to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) t: Option<String>,
}

/// A lease to create: the replica running an upstream exchange.
#[derive(Debug, Serialize)]
pub(super) struct NewLease {
    pub(super) k: String,
    /// Owner.
    pub(super) o: String,
    /// Deadline, ms since the Unix epoch.
    pub(super) d: String,
    /// The `ARGV` index of what another replica needs to redo the exchange
    /// ([`LeaseRecord`], JSON).
    pub(super) r: String,
}

/// What a lease records about its exchange.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LeaseRecord {
    /// The session.
    pub(super) sid: String,
    /// The upstream request, as sent.
    pub(super) request: serde_json::Value,
    /// Its `Mcp-Param-*` headers.
    pub(super) headers: Vec<(String, String)>,
    /// Why it was sent.
    pub(super) role: UpstreamRole,
}

/// The effects of one step, executed by the step script in the same transaction as
/// the state (see `redis::STEP`). Numbers are strings: Lua would print large ones in
/// exponent form.
#[derive(Debug, Default, Serialize)]
pub(super) struct Ops {
    pub(super) ttl: String,
    pub(super) sid: String,
    pub(super) now: String,
    pub(super) keep: String,
    pub(super) timers: String,
    pub(super) leases: String,
    pub(super) sessions: String,
    /// The caller's sessions (zset SID → last use: `max_sessions_per_caller`).
    pub(super) caller: String,
    /// The set of sessions with requests in flight (never evicted to make room).
    pub(super) busyk: String,
    /// This session has requests in flight after the step, when that changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) busy: Option<bool>,
    /// The step sets the session's last use (zsets `sessions`, `caller`) and keeps
    /// the discover key alive.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) touch: bool,
    /// The tombstone's TTL, when the step ends the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tomb: Option<String>,
    /// The machine's next deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) due: Option<String>,
    /// The step writes the timers zset (`due`, or its removal): the deadline changed,
    /// the step fires a claimed timer, or it ends the session.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) tw: bool,
    /// The discover key to keep alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) disc: Option<String>,
    pub(super) xadd: Vec<Append>,
    pub(super) lease_new: Vec<NewLease>,
    pub(super) lease_del: Vec<String>,
    pub(super) del: Vec<String>,
    /// Connection holders to set: key, token, ms (a POST's relay, decided here).
    pub(super) hold: Vec<(String, String, String)>,
    /// This replica's name (see `keys::Keys::wake_replica`).
    pub(super) me: String,
    /// The broadcast channel; a replica's own is this, `:`, its name.
    pub(super) wk: String,
    /// Cancellations: the lease key, the wake payload for its owner.
    pub(super) cancel: Vec<(String, String)>,
    /// Broadcasts: channel, payload.
    #[serde(rename = "pub")]
    pub(super) publish: Vec<(String, String)>,
}
