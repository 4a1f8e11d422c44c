//! The key and channel layout in Redis; every name starts with the configured prefix
//! (`dualera:` by default). Per-session names carry the session id in braces, so all
//! of one session's keys hash to one slot.
//!
//! | name | type | what | TTL |
//! |---|---|---|---|
//! | `P s:{SID}` | hash: `v` version, `d` state (MessagePack; JSON from builds before), `b` 1 while requests are in flight (never evicted), `gone` tombstone | the record and the machine | idle TTL plus the touch interval (a sixteenth of it, at most a minute), refreshed by a step that moves its last use (a replica does at most once a touch interval), open stream and lease |
//! | `P x:{SID}:N` | stream, entry ids `0-SEQ`, fields `m` message, `e` end | SSE stream N (event ids `N.SEQ`) | idle TTL from its last entry |
//! | `P h:{SID}:N` / `:g` | string: a connection token | the live connection relaying stream N / the GET stream | a few seconds, renewed while it relays |
//! | `P l:{SID}:UPID` | hash: `owner`, `deadline`, `rec` | the lease of a running upstream exchange | idle TTL |
//! | `P r:REPLICA` | string: `http://HOST:PORT` | where the replica's reverse-bridge rounds are reached (its `advertise_url`) | 5 s, refreshed every second |
//! | `P d:DIGEST` | string | a `server/discover` result shared by sessions | idle TTL, refreshed by steps |
//! | `P timers` | zset SID → due ms | the machines' next deadlines | none (members removed by steps) |
//! | `P leases` | zset lease key → deadline ms | leases to take over when due | none |
//! | `P sessions` | zset SID → last use ms | the session count (`max_sessions`), idlest first for eviction | none (pruned by age) |
//! | `P c:BINDING` | zset SID → last use ms | one caller's sessions (`max_sessions_per_caller`) | none (pruned by age) |
//! | channel `P w:REPLICA` | pub/sub | to one replica: "stream N of SID, whose connection you hold, has new entries" / "cancel upstream X of SID, whose lease you hold" | – |
//! | channel `P w` | pub/sub | to every replica: "SID ended" (deleted, evicted), or a cancellation without a lease | – |
//!
//! Each replica subscribes to its own channel and the broadcast one, once: a session
//! costs no subscription. A step learns whom to wake from what it touches: a stream's
//! holder token starts with the replica's name (`REPLICA.RANDOM`), a lease names its
//! owner.

/// Builds every key and channel name from the prefix. The names that do not depend
/// on a session are built once: a step passes five of them to its script.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
    timers: String,
    leases: String,
    sessions: String,
    wake_all: String,
}

/// The parts, joined: key names (and connection tokens) are built on every step, and
/// `format!` (through `Formatter::pad` for each part) cost about 1.7k instructions a
/// name.
pub(super) fn name(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// Whether `id` has the shape of a session id this gateway mints (48 lowercase hex
/// digits): anything else is refused before it is used in a key name.
pub(super) fn valid_session_id(id: &str) -> bool {
    id.len() == 48 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            timers: format!("{prefix}timers"),
            leases: format!("{prefix}leases"),
            sessions: format!("{prefix}sessions"),
            wake_all: format!("{prefix}w"),
        }
    }

    /// Where replica `id` can be reached (its `advertise_url`).
    pub(super) fn replica(&self, id: &str) -> String {
        name(&[&self.prefix, "r:", id])
    }

    pub(super) fn session(&self, sid: &str) -> String {
        name(&[&self.prefix, "s:{", sid, "}"])
    }

    pub(super) fn stream(&self, sid: &str, number: u64) -> String {
        name(&[
            &self.prefix,
            "x:{",
            sid,
            "}:",
            itoa::Buffer::new().format(number),
        ])
    }

    /// The holder of stream `number`'s connection; the standalone (GET) stream has one
    /// holder key whatever its number.
    pub(super) fn holder(&self, sid: &str, number: Option<u64>) -> String {
        match number {
            Some(n) => name(&[
                &self.prefix,
                "h:{",
                sid,
                "}:",
                itoa::Buffer::new().format(n),
            ]),
            None => name(&[&self.prefix, "h:{", sid, "}:g"]),
        }
    }

    pub(super) fn lease(&self, sid: &str, upstream_id: &str) -> String {
        name(&[&self.prefix, "l:{", sid, "}:", upstream_id])
    }

    pub(super) fn discover(&self, digest: &str) -> String {
        name(&[&self.prefix, "d:", digest])
    }

    pub(super) fn timers(&self) -> &str {
        &self.timers
    }

    pub(super) fn leases(&self) -> &str {
        &self.leases
    }

    pub(super) fn sessions(&self) -> &str {
        &self.sessions
    }

    /// One caller's sessions, by its binding key (hex).
    pub(super) fn caller(&self, binding: &str) -> String {
        name(&[&self.prefix, "c:", binding])
    }

    /// What a session key is around its id: `(before, after)`.
    pub(super) fn session_parts(&self) -> (String, String) {
        (format!("{}s:{{", self.prefix), "}".to_owned())
    }

    /// The channel every replica listens to; a replica's own is this, `:`, its name.
    pub(super) fn wake_all(&self) -> &str {
        &self.wake_all
    }

    /// The channel of one replica.
    pub(super) fn wake_replica(&self, replica: &str) -> String {
        name(&[&self.prefix, "w:", replica])
    }
}
