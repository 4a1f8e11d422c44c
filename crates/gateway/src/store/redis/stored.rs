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
use crate::forwarded::Forwarded;
use crate::header_names::{TRACEPARENT, TRACESTATE};
use crate::store::StepState;
use crate::trace::TraceContext;
use bytes::Bytes;
use dualera_adapters::{PeerStream, RequestId, Session, UpstreamRole};
use http::header::HeaderValue;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

/// One SSE stream of a session, stored as an array (`[number, peer, seq, finished,
/// trace]`: a session keeps up to 17 of them in every step's state, and
/// `[7,{"Request":8},2,true,null]` is 35 bytes of JSON where the object naming each
/// field was 62). Records written before as objects are still read.
#[derive(Debug, Clone)]
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

impl Serialize for StreamMeta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = serializer.serialize_tuple(5)?;
        t.serialize_element(&self.number)?;
        t.serialize_element(&self.peer)?;
        t.serialize_element(&self.seq)?;
        t.serialize_element(&self.finished)?;
        t.serialize_element(&self.trace)?;
        t.end()
    }
}

/// A stream as records before the array form wrote it.
#[derive(Deserialize)]
struct StreamNamed {
    number: u64,
    peer: PeerStream,
    seq: u64,
    finished: bool,
    #[serde(default)]
    trace: Option<(String, Option<String>)>,
}

impl<'de> Deserialize<'de> for StreamMeta {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error, MapAccess, SeqAccess, Visitor};
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = StreamMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a stream: [number, peer, seq, finished, trace]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StreamMeta, A::Error> {
                let missing = || A::Error::invalid_length(5, &self);
                let meta = StreamMeta {
                    number: seq.next_element()?.ok_or_else(missing)?,
                    peer: seq.next_element()?.ok_or_else(missing)?,
                    seq: seq.next_element()?.ok_or_else(missing)?,
                    finished: seq.next_element()?.ok_or_else(missing)?,
                    trace: seq.next_element()?.ok_or_else(missing)?,
                };
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(6, &self));
                }
                Ok(meta)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StreamMeta, A::Error> {
                let n =
                    StreamNamed::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(StreamMeta {
                    number: n.number,
                    peer: n.peer,
                    seq: n.seq,
                    finished: n.finished,
                    trace: n.trace,
                })
            }
        }
        deserializer.deserialize_any(Either)
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
    /// The streams towards the peer: the live ones, and the standalone stream also
    /// once finished. A finished request or batch stream is kept as its number only
    /// (in `finished`): every step writes this table, and 16 finished streams were
    /// two fifths of the record's encoding. (Records of earlier builds list them here
    /// too; a step drops them.)
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) auth: Vec<(Option<RequestId>, String)>,
    /// The forwarded headers of the request that opened the session.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) forwarded: Vec<(String, String)>,
    /// `forwarded` as the headers an upstream request carries, built the first time an
    /// exchange needs them: a replica keeps a record decoded between its steps, and
    /// parsing the names and values for each exchange cost more than the copies.
    #[serde(skip)]
    pub(super) forwarded_headers: Option<Forwarded>,
    /// Whether the session hash's `b` is 1 (requests in flight), as the last step
    /// left it (a step writes `b` only when this changes; absent when not, as an idle
    /// session is).
    #[serde(default, rename = "b", skip_serializing_if = "std::ops::Not::not")]
    pub(super) busy: bool,
    /// The machine's next deadline as the last step wrote it to the timers zset, ms
    /// since the Unix epoch (a step writes the zset only when this changes).
    #[serde(default, rename = "t", skip_serializing_if = "Option::is_none")]
    pub(super) due: Option<u64>,
    /// The session machine.
    pub(super) machine: Session,
    /// The encoding of the fields that never change once the session exists (see
    /// [`Unchanging`]), made the first time this record is written.
    #[serde(skip)]
    pub(super) unchanging: Option<Unchanging>,
}

/// The MessagePack encoding of a record's fields that never change once its session
/// exists, each with its name, as [`codec::encode`] writes them: `binding`,
/// `anonymous` and `discover` (the first three fields), and `forwarded`. Every step
/// writes its session's record whole, and a replica keeps the record decoded between
/// its steps: written again each time, these fields were nearly half of the
/// record's bytes and about a tenth of the instructions its encoding took. Nothing
/// changes them after the session is created; a debug build checks every record it
/// writes against the derived encoding.
#[derive(Debug, Default)]
pub(super) struct Unchanging {
    head: Vec<u8>,
    /// Empty when `forwarded` is (the field is then not written).
    forwarded: Vec<u8>,
}

impl Record {
    /// Appends this record's MessagePack encoding to `into`: the bytes the derived
    /// `Serialize` writes through [`codec::encode`], with the fields that never
    /// change copied from [`Record::unchanging`] (made here the first time).
    fn pack(&mut self, into: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error> {
        fn field(
            into: &mut Vec<u8>,
            name: &str,
            value: &impl Serialize,
        ) -> Result<(), rmp_serde::encode::Error> {
            let mut ser = rmp_serde::Serializer::new(into).with_struct_map();
            name.serialize(&mut ser)?;
            value.serialize(&mut ser)
        }
        let unchanging = match &mut self.unchanging {
            Some(u) => u,
            none => {
                let mut u = Unchanging::default();
                field(&mut u.head, "binding", &self.binding)?;
                field(&mut u.head, "anonymous", &self.anonymous)?;
                field(&mut u.head, "discover", &self.discover)?;
                if !self.forwarded.is_empty() {
                    field(&mut u.forwarded, "forwarded", &self.forwarded)?;
                }
                none.insert(u)
            }
        };
        // The fields written, as the derived `Serialize` counts them: seven always,
        // four only when not empty. Fewer than 16: a fixmap's one byte.
        let fields = 7
            + u8::from(!self.auth.is_empty())
            + u8::from(!self.forwarded.is_empty())
            + u8::from(self.busy)
            + u8::from(self.due.is_some());
        into.push(0x80 | fields);
        into.extend_from_slice(&unchanging.head);
        field(into, "streams", &self.streams)?;
        field(into, "finished", &self.finished)?;
        field(into, "next_stream", &self.next_stream)?;
        if !self.auth.is_empty() {
            field(into, "auth", &self.auth)?;
        }
        into.extend_from_slice(&unchanging.forwarded);
        if self.busy {
            field(into, "b", &self.busy)?;
        }
        if let Some(due) = &self.due {
            field(into, "t", due)?;
        }
        field(into, "machine", &self.machine)
    }

    /// The headers of `forwarded` (see [`Record::forwarded_headers`]).
    pub(super) fn forwarded(&mut self) -> Forwarded {
        self.forwarded_headers
            .get_or_insert_with(|| Forwarded::from_pairs(&self.forwarded))
            .clone()
    }

    pub(super) fn stream(&self, peer: &PeerStream) -> Option<&StreamMeta> {
        self.streams.iter().find(|s| &s.peer == peer)
    }

    pub(super) fn stream_mut(&mut self, peer: &PeerStream) -> Option<&mut StreamMeta> {
        self.streams.iter_mut().find(|s| &s.peer == peer)
    }

    /// Whether stream `number` can be resumed, and if so whether it is the standalone
    /// stream.
    pub(super) fn resumable(&self, number: u64) -> Option<bool> {
        match self.streams.iter().find(|s| s.number == number) {
            Some(meta) => Some(meta.peer == PeerStream::Standalone),
            None => self.finished.contains(&number).then_some(false),
        }
    }

    /// Drops the finished request and batch streams from the table (see
    /// [`Record::streams`]): a resumption needs only their numbers, and no message
    /// goes to them again.
    pub(super) fn settle_finished(&mut self) {
        self.streams
            .retain(|s| !s.finished || s.peer == PeerStream::Standalone);
    }

    /// The number of every stream whose entries may still be in Redis.
    pub(super) fn numbers(&self) -> impl Iterator<Item = u64> + '_ {
        let live = self.streams.iter().map(|s| s.number);
        let finished = self
            .finished
            .iter()
            .copied()
            .filter(|n| !self.streams.iter().any(|s| s.number == *n));
        live.chain(finished)
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
    /// What another replica needs to redo the exchange ([`LeaseRecord`], [`codec`]).
    pub(super) r: Vec<u8>,
}

/// What a lease records about its exchange.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LeaseRecord {
    /// The session.
    pub(super) sid: String,
    /// The upstream request, as sent.
    pub(super) request: RequestText,
    /// Its `Mcp-Param-*` headers.
    pub(super) headers: Vec<(String, String)>,
    /// Why it was sent.
    pub(super) role: UpstreamRole,
}

/// A lease's upstream request: its JSON text, written as one MessagePack string (in
/// a JSON record, the request itself).
/// Packed as a tree (a map per object, every member name and value written on its
/// own), it cost a replica about 16k instructions per upstream exchange (three a
/// flow): building the tree from the message, packing it, dropping it; written as
/// text, about 12k. Records written before carry it as a tree (a map), which is
/// still read. Not `adapters::json::JsonText`, which serializes the same way: that
/// one holds a `RawValue`, whose construction from text parses it again, and reads
/// only its own form.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RequestText(pub(super) Bytes);

impl Serialize for RequestText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let text = std::str::from_utf8(&self.0)
            .map_err(|_| S::Error::custom("a request's text is not UTF-8"))?;
        if serializer.is_human_readable() {
            // JSON: the request itself, as builds before wrote it.
            let raw: &serde_json::value::RawValue =
                serde_json::from_str(text).map_err(S::Error::custom)?;
            raw.serialize(serializer)
        } else {
            serializer.serialize_str(text)
        }
    }
}

impl<'de> Deserialize<'de> for RequestText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error, MapAccess, Visitor};
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = RequestText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a request's JSON text, or the request as a map")
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<RequestText, E> {
                Ok(RequestText(Bytes::copy_from_slice(v.as_bytes())))
            }
            fn visit_string<E: Error>(self, v: String) -> Result<RequestText, E> {
                Ok(RequestText(Bytes::from(v.into_bytes())))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RequestText, A::Error> {
                let tree = serde_json::Value::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                serde_json::to_vec(&tree)
                    .map(|v| RequestText(Bytes::from(v)))
                    .map_err(A::Error::custom)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// How a session's record and a lease's are written: MessagePack, fields by name
/// (fields that are skipped when empty keep their meaning, and a record written by an
/// older build still loads). Every step writes its session's record and most read
/// one; as JSON, writing it was a fifth of a replicated flow's instructions, most of
/// them spent escaping strings that need no escaping, and reading it parsed them back.
/// Records written as JSON (by earlier builds, or by a replica told to with
/// `session_record_format = "json"` during a rolling upgrade: they start with `{`,
/// which no MessagePack map does) are always read; written as JSON, a record is the
/// text those builds wrote.
pub(super) mod codec {
    use crate::store::{RecordFormat, StoreError};
    use serde::de::DeserializeOwned;
    use serde::Serialize;

    /// Appends `value`'s encoding to `into`.
    pub(in crate::store::redis) fn encode(
        format: RecordFormat,
        value: &impl Serialize,
        into: &mut Vec<u8>,
        what: &str,
    ) -> Result<(), StoreError> {
        let written = match format {
            RecordFormat::MessagePack => value
                .serialize(&mut rmp_serde::Serializer::new(into).with_struct_map())
                .map_err(|e| e.to_string()),
            RecordFormat::Json => serde_json::to_writer(into, value).map_err(|e| e.to_string()),
        };
        written.map_err(|e| StoreError::Corrupt {
            reason: format!("{what}: {e}"),
        })
    }

    /// Appends a session record's encoding to `into`: what [`encode`] writes, the
    /// fields that never change copied (see `Record::pack`).
    pub(in crate::store::redis) fn encode_record(
        format: RecordFormat,
        record: &mut super::Record,
        into: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        const WHAT: &str = "session record";
        if format == RecordFormat::Json {
            return encode(format, record, into, WHAT);
        }
        let start = into.len();
        record.pack(into).map_err(|e| StoreError::Corrupt {
            reason: format!("{WHAT}: {e}"),
        })?;
        debug_assert_eq!(
            into[start..],
            to_vec(format, record, WHAT)?[..],
            "a record packed with its unchanging fields copied differs from its encoding"
        );
        Ok(())
    }

    /// `value`'s encoding.
    pub(in crate::store::redis) fn to_vec(
        format: RecordFormat,
        value: &impl Serialize,
        what: &str,
    ) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        encode(format, value, &mut out, what)?;
        Ok(out)
    }

    /// Reads what [`encode`] wrote, in either format.
    pub(in crate::store::redis) fn decode<T: DeserializeOwned>(
        bytes: &[u8],
        what: &str,
    ) -> Result<T, StoreError> {
        let decoded = if bytes.first() == Some(&b'{') {
            serde_json::from_slice(bytes).map_err(|e| e.to_string())
        } else {
            rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
        };
        decoded.map_err(|e| StoreError::Corrupt {
            reason: format!("{what}: {e}"),
        })
    }
}

/// The effects of one step, executed by the step script in the same transaction as
/// the state (see `client::STEP`), which reads them as flat `ARGV` ([`Ops::args`]).
/// Numbers are strings: Lua would print large ones in exponent form.
///
/// What is the same for every step of a replica (its TTLs, its name, the shared keys'
/// names) is borrowed from it rather than written again for each step.
#[derive(Debug, Default)]
pub(super) struct Ops<'a> {
    pub(super) ttl: &'a str,
    pub(super) sid: &'a str,
    pub(super) now: String,
    pub(super) keep: &'a str,
    pub(super) timers: &'a str,
    pub(super) leases: &'a str,
    pub(super) sessions: &'a str,
    /// The caller's sessions (zset SID → last use: `max_sessions_per_caller`).
    pub(super) caller: String,
    /// The session hash's TTL (the idle TTL plus the touch interval), renewed on touch.
    pub(super) sttl: &'a str,
    /// This session has requests in flight after the step (the hash's `b`, which keeps
    /// it from being evicted to make room), when that changed.
    pub(super) busy: Option<bool>,
    /// The step sets the session's last use (zsets `sessions`, `caller`) and renews
    /// the session hash's and the discover key's TTL.
    pub(super) touch: bool,
    /// The tombstone's TTL, when the step ends the session.
    pub(super) tomb: Option<String>,
    /// The machine's next deadline.
    pub(super) due: Option<String>,
    /// The step writes the timers zset (`due`, or its removal): the deadline changed,
    /// the step fires a claimed timer, or it ends the session.
    pub(super) tw: bool,
    /// The step's state goes to the other replicas that step the session, which keep
    /// it as the one they remember (the host owes an answer it may send to any).
    pub(super) push: bool,
    /// The discover key to keep alive.
    pub(super) disc: Option<String>,
    pub(super) xadd: Vec<Append>,
    pub(super) lease_new: Vec<NewLease>,
    pub(super) lease_del: Vec<String>,
    pub(super) del: Vec<String>,
    /// Connection holders to set: key, token, ms (a POST's relay, decided here).
    pub(super) hold: Vec<(String, String, String)>,
    /// This replica's name (see `keys::Keys::wake_replica`).
    pub(super) me: &'a str,
    /// The broadcast channel; a replica's own is this, `:`, its name.
    pub(super) wk: &'a str,
    /// Cancellations: the lease key, the wake payload for its owner.
    pub(super) cancel: Vec<(String, String)>,
    /// Broadcasts: channel, payload.
    pub(super) publish: Vec<(String, String)>,
}

impl Ops<'_> {
    /// The step writes the session's record and nothing beside it: no stream entry,
    /// lease, cancellation, deletion, hold or broadcast, and it does not end the
    /// session (its busy flag, deadline and last use are the record's too).
    pub(super) fn record_only(&self) -> bool {
        self.xadd.is_empty()
            && self.lease_new.is_empty()
            && self.lease_del.is_empty()
            && self.del.is_empty()
            && self.hold.is_empty()
            && self.cancel.is_empty()
            && self.publish.is_empty()
            && self.tomb.is_none()
    }

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
        // The counts and most sequence numbers are small: written from a table, not
        // an allocation each (a step has seven counts).
        const SMALL: [&str; 16] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
        ];
        fn number(n: u64) -> Cow<'static, [u8]> {
            match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
                Some(small) => Cow::Borrowed(small.as_bytes()),
                None => Cow::Owned(super::decimal(n).into_bytes()),
            }
        }
        fn count<T>(items: &[T]) -> Cow<'static, [u8]> {
            number(u64::try_from(items.len()).unwrap_or(u64::MAX))
        }
        // `t`, then `B` or `b`, then `w`, then `p` (see `client::STEP`): every
        // combination, indexed by touch (6), busy (none, set, cleared: 2), the timer
        // write (1), and the push (12).
        const FLAGS: [&str; 24] = [
            "", "w", "B", "Bw", "b", "bw", "t", "tw", "tB", "tBw", "tb", "tbw", "p", "wp", "Bp",
            "Bwp", "bp", "bwp", "tp", "twp", "tBp", "tBwp", "tbp", "tbwp",
        ];
        let busy = match self.busy {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        };
        let flags = FLAGS[usize::from(self.push) * 12
            + usize::from(self.touch) * 6
            + busy * 2
            + usize::from(self.tw)];
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
            text(self.ttl),
            text(self.sid),
            text(&self.now),
            text(self.keep),
            text(self.timers),
            text(self.leases),
            text(self.sessions),
            text(&self.caller),
            text(self.sttl),
            text(flags),
            opt(self.due.as_ref()),
            opt(self.tomb.as_ref()),
            opt(self.disc.as_ref()),
            text(self.me),
            text(self.wk),
        ]);
        args.extend([
            count(&self.xadd),
            count(&self.lease_new),
            count(&self.cancel),
            count(&self.lease_del),
            count(&self.del),
            count(&self.hold),
            count(&self.publish),
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
    use crate::store::{RecordFormat, StoreError};
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
    fn finished_request_streams_are_kept_as_their_numbers() {
        // As earlier builds wrote it: a finished request stream in the table.
        let older = record(
            r#"[[7,{"Request":8},2,true,null],[8,{"Batch":1},1,true,null],
                [9,"Standalone",4,true,null],[10,{"Request":9},1,false,null]]"#,
        );
        let mut r: Record = serde_json::from_str(&older).unwrap();
        r.finished = [7, 8, 9].into();
        r.settle_finished();
        let left: Vec<u64> = r.streams.iter().map(|s| s.number).collect();
        assert_eq!(
            left,
            [9, 10],
            "the finished standalone stream and the live one"
        );
        assert_eq!(r.resumable(7), Some(false));
        assert_eq!(r.resumable(8), Some(false));
        assert_eq!(r.resumable(9), Some(true));
        assert_eq!(r.resumable(10), Some(false));
        assert_eq!(r.resumable(11), None, "never told of");
        let mut numbers: Vec<u64> = r.numbers().collect();
        numbers.sort_unstable();
        assert_eq!(numbers, [7, 8, 9, 10], "each once");
    }

    /// A session's record in the middle of an elicitation round, as an earlier build
    /// wrote it (JSON).
    const MID_ROUND: &str = r#"{"binding":"a577e84ffde90079a002f8c0a5e9c44df2c0ebc9e208838a4cf1c8ac89a08ac2","anonymous":true,"discover":"6be7ac6628a2680c37dd0f006b97e0625b53974e830c1105d7927cad2e8543b8","streams":[[7,{"Request":7},2,true,null],[10,{"Request":10},1,false,null],[11,"Standalone",3,false,["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","k=v"]]],"finished":[7],"next_stream":10,"auth":[[10,"Bearer t0k3n"],[null,"Bearer g"]],"forwarded":[["x-forwarded-for","127.0.0.1"],["x-forwarded-proto","http"],["x-forwarded-host","127.0.0.1:35549"]],"b":true,"t":1796410265883,"machine":{"id_prefix":"dualera-ce80b210","state":"Ready","revision":"2025-11-25","client_info":{"name":"dualera-callgrind","version":"0"},"client_capabilities":{"elicitation":{"form":{}}},"log_level":null,"init":null,"initialized_notified":true,"calls":[[10,{"seq":22,"method":"tools/call","params":{"arguments":{"title":"callgrind-2","workspaceUri":"file:///srv/notes"},"name":"notes_delete"},"stream":{"Request":10},"rounds":1,"phase":{"Upstream":"dualera-ce80b210-u13"},"url_elicitations":[],"tools_refreshed":false,"answered":{"round":{"request_state":"eyJ2IjoxLCJraWQiOiJiIiwic3ViIjoibG9jYWwiLCJtZXRob2QiOiJ0b29scy9jYWxsIiwidGFyZ2V0Ijoibm90ZXNfZGVsZXRlIiwiYXJncyI6IjM2OTcxM2FkMWIxMjJiNmZjZjRjMGY4MWEwZDZjYTJmNzU5NWE0MGJlODBhN2FlN2YyYTI3YjZlMTAxMjA1NWUiLCJwaGFzZSI6ImNvbmZpcm0iLCJyb3VuZCI6MSwibm9uY2UiOiI5Yzg5YWMzZWM1ZDFkYTkwYzUxMDU1NmVjNDhlZWRmNSIsImV4cCI6MTc5NjQxMDI2NTg4MywiZGF0YSI6eyJjYW5kaWRhdGVzIjpbIm5vdGUtMiJdLCJvZmZlciI6ImFsbCIsIndvcmtzcGFjZSI6ImZpbGU6Ly8vdG1wL21vbi14djdydXNrNi9ub3RlcyJ9fQ.YLC-dG1QkNb07RvMO35Je5tTtkxw4-_RxP7JPJ_Dy7E","pending":{},"responses":{"delete_choice":{"action":"accept","content":{"confirm":true,"note_id":"note-2"}}}},"live_id":"dualera-ce80b210-l2","live":{"seq":24,"legacy":10,"key":"delete_choice","method":"elicitation/create","kind":"ElicitationForm","deadline":1796410265883,"hard_deadline":1796410265883}},"link":null}]],"live":[],"upstream":[["dualera-ce80b210-u13",{"seq":25,"role":{"Call":{"legacy":10,"round":1}}}]],"retired_live":{"cap":16,"p":"dualera-ce80b210-l","r":["1","2"],"k":"aa"},"retired_upstream":{"cap":16,"p":"dualera-ce80b210-u","r":["1","2","3","4","5","6","7","8","9","10","11","12"],"k":"aaaaaaaaaaaa"},"batches":[],"subscriptions":[],"standalone_open":false,"listen":null,"ping":null,"tool_headers":{},"host_tasks":false,"tasks":null,"next_upstream":13,"next_live":2,"next_elicitation":0,"next_batch":0,"next_seq":25}}"#;

    #[test]
    fn records_are_message_pack_by_field_name_and_json_ones_still_load() {
        // The one field of it this build no longer keeps (nothing read it): an
        // earlier build reads its absence as the `false` it never used.
        const DROPPED: &str = r#""initialized_notified":true,"#;
        assert!(MID_ROUND.contains(DROPPED));
        let mut written = MID_ROUND.replace(DROPPED, "");
        // The machine's members that hold their default are not written: every build
        // that stored sessions reads a missing member as its default.
        for default in [
            r#""log_level":null,"#,
            r#""init":null,"#,
            r#""live":[],"#,
            r#""batches":[],"#,
            r#""subscriptions":[],"#,
            r#""standalone_open":false,"#,
            r#""listen":null,"#,
            r#""ping":null,"#,
            r#""tool_headers":{},"#,
            r#""host_tasks":false,"#,
            r#""tasks":null,"#,
            r#""next_elicitation":0,"#,
            r#""next_batch":0,"#,
            r#","link":null"#,
        ] {
            assert_eq!(written.matches(default).count(), 1, "{default}");
            written = written.replace(default, "");
        }
        let r: Record = codec::decode(MID_ROUND.as_bytes(), "record").unwrap();
        let packed = codec::to_vec(RecordFormat::MessagePack, &r, "record").unwrap();
        assert_ne!(packed[0], b'{');
        assert!(
            packed.len() * 10 < written.len() * 9,
            "{} bytes packed, {} as JSON",
            packed.len(),
            written.len()
        );
        let again: Record = codec::decode(&packed, "record").unwrap();
        // Nothing else lost: written as JSON again, it is the record it was read from.
        assert_eq!(serde_json::to_string(&again).unwrap(), written);
        // Deterministic: a step that changes nothing writes the same bytes.
        assert_eq!(
            codec::to_vec(RecordFormat::MessagePack, &again, "record").unwrap(),
            packed
        );
        // Told to write JSON (a rolling upgrade), a replica writes the text the earlier
        // build wrote, less that field and the members holding their defaults.
        assert_eq!(
            codec::to_vec(RecordFormat::Json, &again, "record").unwrap(),
            written.as_bytes()
        );
        for cut in [0, 1, packed.len() / 2, packed.len() - 1] {
            assert!(matches!(
                codec::decode::<Record>(&packed[..cut], "record"),
                Err(StoreError::Corrupt { reason }) if reason.starts_with("record: ")
            ));
        }
    }

    #[test]
    fn every_flag_combination_is_written_in_the_script_order() {
        for touch in [false, true] {
            for busy in [None, Some(true), Some(false)] {
                for tw in [false, true] {
                    let ops = Ops {
                        touch,
                        busy,
                        tw,
                        ..Ops::default()
                    };
                    let mut expected = String::new();
                    if touch {
                        expected.push('t');
                    }
                    match busy {
                        Some(true) => expected.push('B'),
                        Some(false) => expected.push('b'),
                        None => {}
                    }
                    if tw {
                        expected.push('w');
                    }
                    assert_eq!(ops.args()[9], expected.as_bytes(), "{touch} {busy:?} {tw}");
                }
            }
        }
    }

    #[test]
    fn a_record_packed_with_its_unchanging_fields_copied_is_its_encoding() {
        // Every optional field present, then each absent in turn, then all absent;
        // each record packed twice (the second copies the unchanging fields).
        let variants: [fn(&mut Record); 6] = [
            |_| {},
            |r| r.auth.clear(),
            |r| r.forwarded.clear(),
            |r| r.busy = false,
            |r| r.due = None,
            |r| {
                r.auth.clear();
                r.forwarded.clear();
                r.busy = false;
                r.due = None;
                r.discover = None;
                r.anonymous = false;
            },
        ];
        for (i, change) in variants.iter().enumerate() {
            let mut r: Record = codec::decode(MID_ROUND.as_bytes(), "record").unwrap();
            change(&mut r);
            let expected = codec::to_vec(RecordFormat::MessagePack, &r, "record").unwrap();
            for pass in 0..2 {
                let mut packed = b"kept".to_vec();
                r.pack(&mut packed).unwrap();
                assert_eq!(&packed[..4], b"kept");
                assert_eq!(packed[4..], expected[..], "variant {i}, pass {pass}");
            }
            assert!(r.unchanging.is_some());
            // The machine changes between steps; the copy still holds.
            r.machine = codec::decode::<Record>(MID_ROUND.as_bytes(), "record")
                .unwrap()
                .machine;
            r.next_stream += 1;
            let mut packed = Vec::new();
            codec::encode_record(RecordFormat::MessagePack, &mut r, &mut packed).unwrap();
            assert_eq!(
                packed,
                codec::to_vec(RecordFormat::MessagePack, &r, "record").unwrap()
            );
            // Told to write JSON, a replica writes the derived encoding.
            let mut json = Vec::new();
            codec::encode_record(RecordFormat::Json, &mut r, &mut json).unwrap();
            assert_eq!(json, serde_json::to_vec(&r).unwrap());
        }
    }

    #[test]
    fn a_lease_record_carries_its_request_unchanged() {
        let text = r#"{"id":"d-u13","jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"k":[1,-2,3.5,null,true,18446744073709551615]},"name":"n\u0000\"q"}}"#;
        let rec = LeaseRecord {
            sid: "s".into(),
            request: RequestText(Bytes::copy_from_slice(text.as_bytes())),
            headers: vec![("mcp-param-name".into(), "n".into())],
            role: UpstreamRole::Discover,
        };
        let packed = codec::to_vec(RecordFormat::MessagePack, &rec, "lease").unwrap();
        let back: LeaseRecord = codec::decode(&packed, "lease").unwrap();
        assert_eq!(back.request.0, text.as_bytes(), "the text, byte for byte");
        assert_eq!(back.headers, rec.headers);
        assert!(matches!(back.role, UpstreamRole::Discover));

        // Earlier builds packed the request as a tree, and before that wrote the
        // record as JSON: both still give the same request.
        #[derive(Serialize)]
        struct Tree<'a> {
            sid: &'a str,
            request: serde_json::Value,
            headers: &'a [(String, String)],
            role: &'a UpstreamRole,
        }
        let tree: serde_json::Value = serde_json::from_str(text).unwrap();
        let old = Tree {
            sid: "s",
            request: tree.clone(),
            headers: &rec.headers,
            role: &rec.role,
        };
        // Told to write JSON, a replica writes the request as the tree those builds
        // read.
        let json = codec::to_vec(RecordFormat::Json, &rec, "lease").unwrap();
        assert_eq!(json, serde_json::to_vec(&old).unwrap());
        for bytes in [
            codec::to_vec(RecordFormat::MessagePack, &old, "lease").unwrap(),
            json,
        ] {
            let back: LeaseRecord = codec::decode(&bytes, "lease").unwrap();
            let again: serde_json::Value = serde_json::from_slice(&back.request.0).unwrap();
            assert_eq!(again, tree);
            assert_eq!(back.headers, rec.headers);
        }
    }

    #[test]
    fn the_effects_are_flat_arguments_in_the_order_the_script_reads() {
        let ops = Ops {
            ttl: "60000",
            sid: "s",
            now: "5".into(),
            keep: "64",
            timers: "T",
            leases: "L",
            sessions: "S",
            caller: "C".into(),
            sttl: "61000",
            busy: Some(false),
            touch: true,
            tw: true,
            due: Some("9".into()),
            me: "r1",
            wk: "w",
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
                    // Past the table of small numbers.
                    s: 16,
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
            "60000", "s", "5", "64", "T", "L", "S", "C", "61000", "tbw", "9", "", "", "r1",
            "w", // scalars
            "2", "1", "1", "1", "2", "1", "1", // counts
            "x1", "1", "MSG", "1", "h1", "r1.t", "x2", "16", "", "1", "h2", "", // entries
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
