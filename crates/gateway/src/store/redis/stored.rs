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
use crate::header_names::{TRACEPARENT, TRACESTATE};
use crate::store::StepState;
use crate::trace::TraceContext;
use dualera_adapters::{PeerStream, RequestId, Session, UpstreamRole};
use http::header::HeaderValue;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

/// One SSE stream of a session, stored as an array (`[number, peer, seq, finished,
/// trace]`, see [`StreamWire`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "StreamWire", from = "StreamWire")]
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
    pub(super) trace: Option<(String, Option<String>)>,
}

/// A stream as stored: an array, since a session keeps up to 17 of them in every
/// step's state (`[7,{"Request":8},2,true,null]` is 35 bytes; the object naming each
/// field was 62). Records written before as objects are still read.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StreamWire {
    Compact(u64, PeerStream, u64, bool, Option<(String, Option<String>)>),
    Named {
        number: u64,
        peer: PeerStream,
        seq: u64,
        finished: bool,
        #[serde(default)]
        trace: Option<(String, Option<String>)>,
    },
}

impl From<StreamMeta> for StreamWire {
    fn from(m: StreamMeta) -> Self {
        Self::Compact(m.number, m.peer, m.seq, m.finished, m.trace)
    }
}

impl From<StreamWire> for StreamMeta {
    fn from(w: StreamWire) -> Self {
        match w {
            StreamWire::Compact(number, peer, seq, finished, trace)
            | StreamWire::Named {
                number,
                peer,
                seq,
                finished,
                trace,
            } => Self {
                number,
                peer,
                seq,
                finished,
                trace,
            },
        }
    }
}

/// A shared session.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Record {
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

impl StepState for Record {
    fn machine(&mut self) -> &mut Session {
        &mut self.machine
    }

    fn busy(&self, peer: &PeerStream) -> bool {
        self.stream(peer).is_some_and(|st| !st.finished)
    }

    // A step of a shared session lives no longer than the step: nothing to time here.
    fn started(&mut self, _id: &RequestId) {}

    fn open_standalone(&mut self, auth: Option<&HeaderValue>) -> (u64, u64) {
        let at = match self.stream(&PeerStream::Standalone) {
            Some(m) => (m.number, m.seq),
            None => (self.open_stream(PeerStream::Standalone), 0),
        };
        self.set_auth(None, super::auth_text(auth));
        at
    }

    fn close_standalone(&mut self) {
        self.set_auth(None, None);
    }

    fn open(
        &mut self,
        peer: &PeerStream,
        trace: Option<&Arc<TraceContext>>,
        auth: Option<&HeaderValue>,
    ) -> u64 {
        let number = self.open_stream(peer.clone());
        self.set_trace(peer, trace.map(|t| &**t));
        if let (PeerStream::Request(id), Some(auth)) = (peer, super::auth_text(auth)) {
            self.set_auth(Some(id.clone()), Some(auth));
        }
        number
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
        headers.insert(TRACEPARENT, HeaderValue::from_str(parent).ok()?);
        if let Some(state) = state.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
            headers.insert(TRACESTATE, state);
        }
        TraceContext::from_headers(&headers).map(Arc::new)
    }
}

/// A stream entry to append.
#[derive(Debug)]
pub(super) struct Append {
    /// The stream key.
    pub(super) k: String,
    /// Its sequence number (entry id `0-s`).
    pub(super) s: u64,
    /// The message, absent on a bare end marker.
    pub(super) m: Option<Vec<u8>>,
    /// Whether it ends the stream.
    pub(super) e: bool,
    /// The key of the stream's connection holder (who gets woken).
    pub(super) h: String,
    /// The token of this replica's relay the step hands its entries to, if any.
    pub(super) t: Option<String>,
}

/// A lease to create: the replica running an upstream exchange.
#[derive(Debug)]
pub(super) struct NewLease {
    pub(super) k: String,
    /// Owner.
    pub(super) o: String,
    /// Deadline, ms since the Unix epoch.
    pub(super) d: String,
    /// What another replica needs to redo the exchange ([`LeaseRecord`], JSON).
    pub(super) r: Vec<u8>,
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
/// the state (see `client::STEP`), which reads them as flat `ARGV` ([`Ops::args`]).
/// Numbers are strings: Lua would print large ones in exponent form.
#[derive(Debug, Default)]
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
    pub(super) busy: Option<bool>,
    /// The step sets the session's last use (zsets `sessions`, `caller`) and keeps
    /// the discover key alive.
    pub(super) touch: bool,
    /// The tombstone's TTL, when the step ends the session.
    pub(super) tomb: Option<String>,
    /// The machine's next deadline.
    pub(super) due: Option<String>,
    /// The step writes the timers zset (`due`, or its removal): the deadline changed,
    /// the step fires a claimed timer, or it ends the session.
    pub(super) tw: bool,
    /// The discover key to keep alive.
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
    pub(super) publish: Vec<(String, String)>,
}

impl Ops {
    /// The step script's `ARGV` after the version and the state, in the order
    /// `client::STEP` reads them: the scalars (an absent one is empty), the flags, the
    /// seven list lengths, then each list's items, flattened; messages and lease
    /// records travel as they are.
    ///
    /// Flat arguments rather than one JSON document: decoding the JSON (`cjson`) was
    /// the largest single cost of the script after its commands.
    pub(super) fn args(&self) -> Vec<Cow<'_, [u8]>> {
        fn text(s: &str) -> Cow<'_, [u8]> {
            Cow::Borrowed(s.as_bytes())
        }
        fn opt(s: Option<&String>) -> Cow<'_, [u8]> {
            Cow::Borrowed(s.map_or(&b""[..], |s| s.as_bytes()))
        }
        fn number(n: impl itoa::Integer) -> Cow<'static, [u8]> {
            Cow::Owned(super::decimal(n).into_bytes())
        }
        let mut flags = String::new();
        if self.touch {
            flags.push('t');
        }
        match self.busy {
            Some(true) => flags.push('B'),
            Some(false) => flags.push('b'),
            None => {}
        }
        if self.tw {
            flags.push('w');
        }
        let mut args = Vec::with_capacity(
            22 + 6 * self.xadd.len()
                + 4 * self.lease_new.len()
                + 2 * self.cancel.len()
                + self.lease_del.len()
                + self.del.len()
                + 3 * self.hold.len()
                + 2 * self.publish.len(),
        );
        args.extend([
            text(&self.ttl),
            text(&self.sid),
            text(&self.now),
            text(&self.keep),
            text(&self.timers),
            text(&self.leases),
            text(&self.sessions),
            text(&self.caller),
            text(&self.busyk),
            Cow::Owned(flags.into_bytes()),
            opt(self.due.as_ref()),
            opt(self.tomb.as_ref()),
            opt(self.disc.as_ref()),
            text(&self.me),
            text(&self.wk),
        ]);
        args.extend([
            number(self.xadd.len()),
            number(self.lease_new.len()),
            number(self.cancel.len()),
            number(self.lease_del.len()),
            number(self.del.len()),
            number(self.hold.len()),
            number(self.publish.len()),
        ]);
        for x in &self.xadd {
            args.extend([
                text(&x.k),
                number(x.s),
                Cow::Borrowed(x.m.as_deref().unwrap_or_default()),
                Cow::Borrowed(if x.e { &b"1"[..] } else { &b""[..] }),
                text(&x.h),
                opt(x.t.as_ref()),
            ]);
        }
        for l in &self.lease_new {
            args.extend([text(&l.k), text(&l.o), text(&l.d), Cow::Borrowed(&l.r[..])]);
        }
        for (lease, wake) in &self.cancel {
            args.extend([text(lease), text(wake)]);
        }
        args.extend(self.lease_del.iter().map(|k| text(k)));
        args.extend(self.del.iter().map(|k| text(k)));
        for (key, token, ms) in &self.hold {
            args.extend([text(key), text(token), text(ms)]);
        }
        for (channel, message) in &self.publish {
            args.extend([text(channel), text(message)]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualera_adapters::{Config, Session};

    fn record(streams: &str) -> String {
        let machine = serde_json::to_string(&Session::new(Config::default())).unwrap();
        format!(r#"{{"binding":"b","streams":{streams},"machine":{machine}}}"#)
    }

    #[test]
    fn streams_are_stored_as_arrays_and_objects_are_still_read() {
        let older = record(
            r#"[{"number":7,"peer":{"Request":8},"seq":2,"finished":true},
                {"number":9,"peer":"Standalone","seq":0,"finished":false,"trace":["00-a-b-01",null]}]"#,
        );
        let r: Record = serde_json::from_str(&older).unwrap();
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.streams[1].trace, Some(("00-a-b-01".into(), None)));
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.contains(r#""streams":[[7,{"Request":8},2,true,null],[9,"Standalone",0,false,["00-a-b-01",null]]]"#),
            "{text}"
        );
        let again: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&again).unwrap(), text);
        assert!(serde_json::from_str::<Record>(&record(r#"[[7,{"Request":8},2]]"#)).is_err());
    }

    #[test]
    fn the_effects_are_flat_arguments_in_the_order_the_script_reads() {
        let ops = Ops {
            ttl: "60000".into(),
            sid: "s".into(),
            now: "5".into(),
            keep: "64".into(),
            timers: "T".into(),
            leases: "L".into(),
            sessions: "S".into(),
            caller: "C".into(),
            busyk: "B".into(),
            busy: Some(false),
            touch: true,
            tw: true,
            due: Some("9".into()),
            me: "r1".into(),
            wk: "w".into(),
            xadd: vec![
                Append {
                    k: "x1".into(),
                    s: 1,
                    m: Some(b"MSG".to_vec()),
                    e: true,
                    h: "h1".into(),
                    t: Some("r1.t".into()),
                },
                Append {
                    k: "x2".into(),
                    s: 4,
                    m: None,
                    e: true,
                    h: "h2".into(),
                    t: None,
                },
            ],
            lease_new: vec![NewLease {
                k: "l1".into(),
                o: "r1".into(),
                d: "99".into(),
                r: b"REC".to_vec(),
            }],
            lease_del: vec!["l0".into()],
            del: vec!["x0".into(), "h0".into()],
            hold: vec![("h1".into(), "r1.t".into(), "8000".into())],
            cancel: vec![("l2".into(), "c".into())],
            publish: vec![("w".into(), "ss".into())],
            ..Ops::default()
        };
        let args: Vec<String> = ops
            .args()
            .iter()
            .map(|a| String::from_utf8(a.to_vec()).unwrap())
            .collect();
        let expected = [
            "60000", "s", "5", "64", "T", "L", "S", "C", "B", "tbw", "9", "", "", "r1",
            "w", // scalars
            "2", "1", "1", "1", "2", "1", "1", // counts
            "x1", "1", "MSG", "1", "h1", "r1.t", "x2", "4", "", "1", "h2", "", // entries
            "l1", "r1", "99", "REC", // new lease
            "l2", "c",  // cancellation
            "l0", // lease dropped
            "x0", "h0", // deleted
            "h1", "r1.t", "8000", // holder
            "w", "ss", // broadcast
        ];
        assert_eq!(args, expected);
    }
}
