//! The Redis side of shared sessions: two connections per replica (commands; RESP3
//! pub/sub), the Lua scripts that make each change atomic, and typed wrappers.
//!
//! Client: redis-rs (`redis` crate), the client the Redis project maintains for Rust,
//! for every command's encoding and every reply's parsing, scripts sent by `EVALSHA`
//! with a reload on `NOSCRIPT`. Commands go over [`RedisConns`] (connections each
//! call's own task drives, opened lazily: a replica starts, and serves pass-through
//! traffic, while Redis is down); pub/sub over redis-rs's `ConnectionManager`, which
//! reconnects by itself and resubscribes automatically (RESP3 push messages).
//!
//! Every command is bounded by `session_store_timeout_ms`; a failure or a timeout is a
//! [`StoreError`], which the driver answers with `sessionStoreUnavailable`.

use crate::store::redis_conns::{Lease, RedisConns};
use crate::store::StoreError;
use redis::aio::AsyncPushSender;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind, Script, ServerErrorKind, Value as RValue};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Compare-and-set of one session, with every effect of the step in the same
/// transaction: stream entries, leases created and dropped, keys deleted, the timer
/// (when it changed), the session count, wake-ups. `KEYS[1]` the session hash;
/// `ARGV[1]` the version read, `ARGV[2]` the new state, then the effects as flat
/// arguments (`stored::Ops::args`): `ARGV[3..17]` ttl, sid, now, keep, the timers,
/// leases, sessions and caller keys, the session hash's TTL, the flags (`t` touch:
/// the last use moves and the session hash's TTL is renewed, `B`/`b` the hash's busy
/// field `b` set to 1 or 0, `w` write the timer, `p` push the state), due, tomb, the
/// discover key, this replica's name and the broadcast channel (an absent value is
/// empty); `ARGV[18..24]`
/// how many stream entries (6 arguments each: key, seq, message, end, holder key,
/// handing token), new leases (4: key, owner, deadline, record), cancellations (2:
/// lease key, wake), leases dropped (1), keys deleted (1; one `DEL` for all of them),
/// holders set (3: key, token, ms) and broadcasts (2: channel, payload) follow, in that
/// order, from `ARGV[25]`.
///
/// Wake-ups go to whom they concern, read from what the step touches: the entries of
/// each stream it appended to go to the replica whose connection holds it (a holder
/// token starts with its replica's name and a dot), addressed to that connection (see
/// `wake::payload`, which names this replica for the relay's acks); none when that is
/// this replica (it hands the entries to its relay itself); a cancellation wakes the
/// lease's owner.
///
/// The hash's `r` names the replicas that step the session (the last eight, separated
/// by spaces; a step adds its own once). A step whose host owes an answer (`p`, see
/// `stored::Ops::push`) publishes its new state to each of the others (`r`, the
/// session id, the new version, a newline, the state: `wake::payload`), which keep it
/// as the one they remember: the answer's step, on whichever of them it lands, then
/// stores at its first compare-and-set instead of reading the state back from a
/// conflict. A replica that steps the session only by itself publishes nothing.
/// Returns `{1, v, handed, lw, remote}` stored (`handed`: the streams whose holder is
/// still the token the step meant to hand its entries to; `lw` 1 when a stream another
/// connection of this replica holds got entries; `remote`: the holder keys of the
/// streams whose entries went to another replica's relay, which acks them, see
/// `backlog`), or only `v` (a bulk string) when stored with all three empty, as most
/// steps are; `{0, v, d}` conflict (the current state), `{-1}` missing, `{-2}`
/// tombstone.
///
/// The short reply is for Redis's sake: turning a returned Lua table into a reply
/// looks up a handful of special fields (`err`, `ok`, the RESP3 kinds) in it and in
/// each table inside it. That cost a stored step 1–2 µs of a 16–17 µs script, replayed
/// on an idle Redis (`examples/bench/step_script_replay.py`): more than any command
/// the step runs but `XADD`.
const STEP: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'v', 'gone', 'r')
local v = cur[1]
if not v then return {-1} end
if cur[2] then return {-2} end
if v ~= ARGV[1] then return {0, v, redis.call('HGET', KEYS[1], 'd')} end
local ttl, sid, now, keep = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local timers, leases, sessions, caller, sttl = ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local flags, due, tomb, disc, me, wk = ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17]
local function has(c) return string.find(flags, c, 1, true) ~= nil end
local nv = tostring(tonumber(v) + 1)
local r = cur[3] or ''
if not string.find(' ' .. r .. ' ', ' ' .. me .. ' ', 1, true) then
  if r == '' then
    r = me
  else
    local _, n = string.gsub(r, ' ', ' ')
    if n >= 7 then r = string.sub(r, string.find(r, ' ', 1, true) + 1) end
    r = r .. ' ' .. me
  end
  redis.call('HSET', KEYS[1], 'r', r)
end
if tomb ~= '' then
  redis.call('HDEL', KEYS[1], 'd')
  redis.call('HSET', KEYS[1], 'v', nv, 'gone', '1')
  redis.call('PEXPIRE', KEYS[1], tomb)
  redis.call('ZREM', sessions, sid)
  redis.call('ZREM', caller, sid)
else
  local busy = (has('B') and '1') or (has('b') and '0')
  if busy then
    redis.call('HSET', KEYS[1], 'v', nv, 'd', ARGV[2], 'b', busy)
  else
    redis.call('HSET', KEYS[1], 'v', nv, 'd', ARGV[2])
  end
  if has('t') then
    redis.call('PEXPIRE', KEYS[1], sttl)
    redis.call('ZADD', sessions, now, sid)
    redis.call('ZADD', caller, now, sid)
    if disc ~= '' then redis.call('PEXPIRE', disc, ttl) end
  end
end
local i = 25
local streams = {}
for _ = 1, tonumber(ARGV[18]) do
  local k, s, m, e = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if m ~= '' then
    if e ~= '' then
      redis.call('XADD', k, 'MAXLEN', '=', keep, '0-' .. s, 'm', m, 'e', '1')
    else
      redis.call('XADD', k, 'MAXLEN', '=', keep, '0-' .. s, 'm', m)
    end
  else
    redis.call('XADD', k, 'MAXLEN', '=', keep, '0-' .. s, 'e', '1')
  end
  local g = streams[k]
  if not g then
    g = {}
    streams[k] = g
    table.insert(streams, g)
  end
  table.insert(g, i)
  i = i + 6
end
for _ = 1, tonumber(ARGV[19]) do
  local k, d = ARGV[i], ARGV[i + 2]
  redis.call('HSET', k, 'owner', ARGV[i + 1], 'deadline', d, 'rec', ARGV[i + 3])
  redis.call('PEXPIRE', k, ttl)
  redis.call('ZADD', leases, d, k)
  i = i + 4
end
for _ = 1, tonumber(ARGV[20]) do
  local owner = redis.call('HGET', ARGV[i], 'owner')
  if not owner then
    redis.call('PUBLISH', wk, ARGV[i + 1])
  elseif owner ~= me then
    redis.call('PUBLISH', wk .. ':' .. owner, ARGV[i + 1])
  end
  i = i + 2
end
for _ = 1, tonumber(ARGV[21]) do
  redis.call('DEL', ARGV[i])
  redis.call('ZREM', leases, ARGV[i])
  i = i + 1
end
local ndel = tonumber(ARGV[22])
if ndel > 0 then
  redis.call('DEL', unpack(ARGV, i, i + ndel - 1))
  i = i + ndel
end
if has('w') then
  if due ~= '' and tomb == '' then
    redis.call('ZADD', timers, due, sid)
  else
    redis.call('ZREM', timers, sid)
  end
end
for _ = 1, tonumber(ARGV[23]) do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'PX', ARGV[i + 2])
  i = i + 3
end
local handed = {}
local remote = {}
local lw = 0
for _, g in ipairs(streams) do
  local x = g[1]
  local k = ARGV[x]
  redis.call('PEXPIRE', k, ttl)
  local tok = redis.call('GET', ARGV[x + 4])
  if tok then
    if tok == ARGV[x + 5] then
      table.insert(handed, ARGV[x + 4])
    else
      local rep = string.match(tok, '^(.*)%.')
      if rep == me then
        lw = 1
      elseif rep then
        local ch = wk .. ':' .. rep
        for _, y in ipairs(g) do
          local e = '0'
          if ARGV[y + 3] ~= '' then e = '1' end
          redis.call('PUBLISH', ch, 'e' .. sid .. tok .. '\n' .. ARGV[y + 1] .. ' ' .. e .. ' ' .. me .. '\n' .. ARGV[y + 2])
        end
        table.insert(remote, ARGV[x + 4])
      end
    end
  end
end
for _ = 1, tonumber(ARGV[24]) do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
  i = i + 2
end
if has('p') and tomb == '' then
  for rep in string.gmatch(r, '%S+') do
    if rep ~= me then
      redis.call('PUBLISH', wk .. ':' .. rep, 'r' .. sid .. nv .. '\n' .. ARGV[2])
    end
  end
end
if lw == 0 and #handed == 0 and #remote == 0 then return nv end
return {1, nv, handed, lw, remote}
";

/// Whether a session is still at the version a replica remembers, sending its state
/// back only when it is not: a step answered from a remembered state with nothing to
/// store (or refused by it) needs no more. `KEYS[1]` the session hash, `ARGV[1]` the
/// version. Returns `{1}` current, `{0, v, d}` changed (the current state), `{-1}`
/// missing, `{-2}` tombstone.
///
/// One `HMGET` of all three fields, one command whatever the answer: reading the state
/// inside Redis costs less than a second command when it changed, and the reply
/// carries it only then.
const CHECK: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'v', 'gone', 'd')
if not cur[1] then return {-1} end
if cur[2] then return {-2} end
if cur[1] == ARGV[1] then return {1} end
return {0, cur[1], cur[3]}
";

/// A new session, unless the id is taken or a bound is reached: the one place that
/// applies `max_sessions` and `max_sessions_per_caller` over every replica. At a bound,
/// the longest-idle session without a request in flight (of that caller, for its own
/// bound) is ended to make room (tombstoned, as by DELETE, and announced on the
/// broadcast channel `wk`); only when every candidate is busy is the new one refused.
/// A session is busy while its hash's `b` is 1. `KEYS[1]` the session hash;
/// `ARGV[1]` the state, `ARGV[2]` `{ttl, sttl, sid, now, sessions, caller, timers,
/// cutoff, max, maxc, sk1, sk2, tomb, wk, disc, dv}` (`sttl` the session hash's TTL; a
/// session key is `sk1 .. SID .. sk2`). The discover result `dv` is stored under `disc`
/// when given; without it, `disc` must still be there (its TTL is renewed), else
/// nothing is created and -3 asks for it. Returns 1 + the number of sessions evicted,
/// 0 (id taken), -1 (full), -2 (the caller's share is full), -3 (send the discover
/// result).
const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local o = cjson.decode(ARGV[2])
if o.disc and not o.dv and redis.call('PEXPIRE', o.disc, o.ttl) == 0 then return -3 end
local function prune(z)
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', o.cutoff, 'LIMIT', 0, 256)
  for _, sid in ipairs(old) do
    redis.call('ZREM', z, sid)
  end
end
prune(o.sessions)
prune(o.caller)
local function evict(z)
  local ids = redis.call('ZRANGE', z, 0, 63)
  for _, sid in ipairs(ids) do
    local k = o.sk1 .. sid .. o.sk2
    local f = redis.call('HMGET', k, 'v', 'gone', 'b')
    if not f[1] or f[2] then
      redis.call('ZREM', z, sid)
      redis.call('ZREM', o.sessions, sid)
    elseif f[3] ~= '1' then
      local c = redis.call('HGET', k, 'c')
      redis.call('HDEL', k, 'd')
      redis.call('HSET', k, 'gone', '1')
      redis.call('PEXPIRE', k, o.tomb)
      redis.call('ZREM', o.sessions, sid)
      redis.call('ZREM', o.timers, sid)
      if c then redis.call('ZREM', c, sid) end
      redis.call('PUBLISH', o.wk, 's' .. sid)
      return true
    end
  end
  return false
end
local evicted = 0
if redis.call('ZCARD', o.caller) >= tonumber(o.maxc) then
  if not evict(o.caller) then return -2 end
  evicted = evicted + 1
end
if redis.call('ZCARD', o.sessions) >= tonumber(o.max) then
  if not evict(o.sessions) then return -1 end
  evicted = evicted + 1
end
redis.call('HSET', KEYS[1], 'v', '1', 'd', ARGV[1], 'c', o.caller)
redis.call('PEXPIRE', KEYS[1], o.sttl)
redis.call('ZADD', o.sessions, o.now, o.sid)
redis.call('ZADD', o.caller, o.now, o.sid)
if o.dv then redis.call('SET', o.disc, o.dv, 'PX', o.ttl) end
return 1 + evicted
";

/// The sweeper's periodic work in one round trip: claims due timers (each returned
/// session's score moves to `ARGV[3]`, so a replica that dies before handling it leaves
/// it to another after that) and, when `ARGV[4]` is not 0, takes over leases past
/// their deadline (owner := `ARGV[5]`, deadline := `ARGV[6]`). `KEYS` the timers zset,
/// the leases zset; `ARGV` now, timers at most, claim until, leases at most, owner,
/// deadline. Returns `{due sessions, flat (lease key, record, previous owner)}`.
const SWEEP: &str = r"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, sid in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[3], sid) end
local out = {}
if ARGV[4] ~= '0' then
  local now = tonumber(ARGV[1])
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[4]))
  for _, k in ipairs(gone) do
    local l = redis.call('HMGET', k, 'rec', 'deadline', 'owner')
    local rec = l[1]
    local d = tonumber(l[2])
    if not rec then
      redis.call('ZREM', KEYS[2], k)
    elseif d and d <= now then
      redis.call('HSET', k, 'owner', ARGV[5], 'deadline', ARGV[6])
      redis.call('ZADD', KEYS[2], ARGV[6], k)
      table.insert(out, k)
      table.insert(out, rec)
      table.insert(out, l[3] or '')
    elseif d then
      redis.call('ZADD', KEYS[2], d, k)
    else
      redis.call('ZREM', KEYS[2], k)
    end
  end
end
return {due, out}
";

/// Renews a lease this replica holds (and the session's TTL). `KEYS` lease, leases
/// zset, session; `ARGV` owner, deadline, the lease's TTL, the session's. Returns 0
/// when the lease is gone or someone else's.
const RENEW_LEASE: &str = r"
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'deadline', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('HEXISTS', KEYS[3], 'd') == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
return 1
";

/// Renews a connection holder (and the session's TTL). `KEYS` holder, session; `ARGV`
/// token, hold ms, session ttl. Returns 0 when the holder changed or the session ended
/// (deleted, or evicted to make room).
const RENEW_HOLDER: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[2], 'gone') == 1 then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('HEXISTS', KEYS[2], 'd') == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
";

/// Drops a connection holder if it is still this one. `KEYS[1]`, `ARGV[1]` the token.
const RELEASE_HOLDER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// What reading a session found.
#[derive(Debug)]
pub(super) enum Loaded {
    /// No such session (never existed, or expired).
    Missing,
    /// Deleted by its peer.
    Gone,
    /// Its version and state.
    Found { version: String, state: Vec<u8> },
}

/// What checking a remembered version found.
#[derive(Debug)]
pub(super) enum Checked {
    /// Still the current version.
    Current,
    /// Changed: the current version and state.
    Changed { version: String, state: Vec<u8> },
    /// No such session any more.
    Missing,
    /// Deleted by its peer.
    Gone,
}

/// What a compare-and-set did.
#[derive(Debug)]
pub(super) enum Stored {
    /// Stored as this version; `handed` the holder keys of the streams whose entries
    /// the step may hand to its relay (still holding them), `local_wake` whether a
    /// stream another connection of this replica holds got entries, `remote` the
    /// holder keys of the streams whose entries went to another replica's relay.
    Committed {
        version: String,
        handed: Vec<String>,
        local_wake: bool,
        remote: Vec<String>,
    },
    /// Someone else stored first: the current version and state.
    Conflict { version: String, state: Vec<u8> },
    /// The session expired meanwhile.
    Missing,
    /// It was deleted meanwhile.
    Gone,
}

/// What one sweeper tick asks for (see [`SWEEP`]).
#[derive(Debug)]
pub(super) struct SweepTick<'a> {
    /// The timers zset.
    pub(super) timers: &'a str,
    /// The leases zset.
    pub(super) leases_zset: &'a str,
    /// Now, ms since the Unix epoch.
    pub(super) now: u64,
    /// At most this many due sessions.
    pub(super) due_at_once: usize,
    /// Until when the due sessions returned are claimed.
    pub(super) claim_until: u64,
    /// At most this many expired leases taken over (0: none this tick).
    pub(super) leases: usize,
    /// Who takes them over.
    pub(super) owner: &'a str,
    /// Their new deadline.
    pub(super) deadline: u64,
}

/// What one sweeper tick claimed.
#[derive(Debug)]
pub(super) struct Swept {
    /// Sessions whose timers are due.
    pub(super) due: Vec<String>,
    /// Leases taken over: (lease key, record, previous owner).
    pub(super) leases: Vec<(String, Vec<u8>, String)>,
}

/// One entry of a stream: its sequence number, message (absent on a bare end
/// marker), and whether it ends the stream.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) message: Option<Vec<u8>>,
    pub(super) end: bool,
}

/// The replica's connections and scripts.
pub(super) struct Redis {
    commands: RedisConns,
    pubsub: ConnectionManager,
    timeout: Duration,
    step: Script,
    check: Script,
    create: Script,
    sweep: Script,
    renew_lease: Script,
    renew_holder: Script,
    release_holder: Script,
    /// Whether the last command reached Redis (readiness).
    up: AtomicBool,
    /// Calls sent to Redis (a script or a pipeline is one).
    trips: AtomicU64,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("timeout", &self.timeout)
            .field("up", &self.up)
            .finish_non_exhaustive()
    }
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

/// Checks a `redis://` or `redis+unix://` URL without connecting: a socket path the
/// kernel would refuse at every connection is refused at start instead.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let client = Client::open(url).map_err(|e| format!("session_store: {e}"))?;
    if let redis::ConnectionAddr::Unix(path) = client.get_connection_info().addr() {
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(format!(
                "session_store: the socket path is {len} bytes; a Unix socket's path is at \
                 most {MAX_SOCKET_PATH}"
            ));
        }
    }
    Ok(())
}

/// The longest path a Unix socket address holds (`sun_path`, its NUL left out).
const MAX_SOCKET_PATH: usize = if cfg!(target_os = "linux") { 107 } else { 103 };

impl Redis {
    /// Opens both connections lazily: nothing is sent until the first command, and
    /// each reconnects by itself. `push` receives pub/sub messages (and a
    /// disconnection notice whenever the pub/sub connection drops).
    pub(super) fn open(
        url: &str,
        timeout: Duration,
        push: impl AsyncPushSender,
    ) -> Result<Self, redis::RedisError> {
        let commands = RedisConns::new(url)?;
        let resp3 = if url.contains('?') {
            format!("{url}&protocol=resp3")
        } else {
            format!("{url}?protocol=resp3")
        };
        let pubsub = Client::open(resp3.as_str())?.get_connection_manager_lazy(
            manager_config(timeout)
                .set_push_sender(push)
                .set_automatic_resubscription(),
        )?;
        Ok(Self {
            commands,
            pubsub,
            timeout,
            step: Script::new(STEP),
            check: Script::new(CHECK),
            create: Script::new(CREATE),
            sweep: Script::new(SWEEP),
            renew_lease: Script::new(RENEW_LEASE),
            renew_holder: Script::new(RENEW_HOLDER),
            release_holder: Script::new(RELEASE_HOLDER),
            up: AtomicBool::new(true),
            trips: AtomicU64::new(0),
        })
    }

    /// Whether the last command reached Redis.
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Round trips to Redis so far: every call through this client, a script or a
    /// pipeline counting one.
    pub(super) fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        let outcome = match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(StoreError::Unreachable { source }),
            Err(_) => Err(StoreError::Timeout {
                timeout: self.timeout,
            }),
        };
        let reached = match &outcome {
            Ok(_) => true,
            Err(StoreError::Unreachable { source }) => {
                !(source.is_io_error()
                    || source.is_connection_dropped()
                    || source.is_connection_refusal()
                    || source.is_timeout())
            }
            Err(_) => false,
        };
        self.up.store(reached, Ordering::Relaxed);
        outcome
    }

    /// A session's version and state.
    pub(super) async fn load(&self, session: &str) -> Result<Loaded, StoreError> {
        let mut c = self.commands.lease();
        let (v, d, gone): (Option<String>, Option<Vec<u8>>, Option<String>) = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(session)
                    .arg("v")
                    .arg("d")
                    .arg("gone")
                    .query_async(&mut c),
            )
            .await?;
        Ok(match (v, d, gone) {
            (_, _, Some(_)) => Loaded::Gone,
            (Some(version), Some(state), None) => Loaded::Found { version, state },
            _ => Loaded::Missing,
        })
    }

    /// Whether `session` is still at `version` (see [`CHECK`]); its state only when not.
    pub(super) async fn check(&self, session: &str, version: &str) -> Result<Checked, StoreError> {
        let mut c = self.commands.lease();
        let args = [version.as_bytes()].into_iter();
        let reply = self
            .bounded(eval_args(&self.check, &mut c, session, args))
            .await?;
        let RValue::Array(items) = reply else {
            return Err(corrupt("the check script answered something else".into()));
        };
        Ok(match items.first().and_then(as_i64) {
            Some(1) => Checked::Current,
            Some(0) => Checked::Changed {
                version: items.get(1).and_then(as_string).unwrap_or_default(),
                state: items.get(2).and_then(as_bytes).unwrap_or_default(),
            },
            Some(-1) => Checked::Missing,
            Some(-2) => Checked::Gone,
            _ => return Err(corrupt("the check script answered an unknown code".into())),
        })
    }

    /// The compare-and-set of one step (see [`STEP`]).
    pub(super) async fn step(
        &self,
        session: &str,
        version: &str,
        state: &[u8],
        effects: &[std::borrow::Cow<'_, [u8]>],
    ) -> Result<Stored, StoreError> {
        // The command is written once, straight from the arguments into the
        // connection's buffer (`Lease::query_args`), not copied into a `Cmd` first.
        let args = [version.as_bytes(), state]
            .into_iter()
            .chain(effects.iter().map(|e| e.as_ref()));
        let mut c = self.commands.lease();
        let reply = self
            .bounded(eval_args(&self.step, &mut c, session, args))
            .await?;
        let items = match reply {
            RValue::Array(items) => items,
            // Stored, with nothing handed over, woken or acked (see `STEP`).
            RValue::BulkString(version) => {
                return Ok(Stored::Committed {
                    version: String::from_utf8(version).unwrap_or_default(),
                    handed: Vec::new(),
                    local_wake: false,
                    remote: Vec::new(),
                })
            }
            _ => return Err(corrupt("the step script answered something else".into())),
        };
        Ok(match items.first().and_then(as_i64) {
            Some(1) => Stored::Committed {
                version: items.get(1).and_then(as_string).unwrap_or_default(),
                handed: match items.get(2) {
                    Some(RValue::Array(keys)) => keys.iter().filter_map(as_string).collect(),
                    _ => Vec::new(),
                },
                local_wake: items.get(3).and_then(as_i64) == Some(1),
                remote: match items.get(4) {
                    Some(RValue::Array(keys)) => keys.iter().filter_map(as_string).collect(),
                    _ => Vec::new(),
                },
            },
            Some(0) => Stored::Conflict {
                version: items.get(1).and_then(as_string).unwrap_or_default(),
                state: items.get(2).and_then(as_bytes).unwrap_or_default(),
            },
            Some(-1) => Stored::Missing,
            Some(-2) => Stored::Gone,
            _ => return Err(corrupt("the step script answered an unknown code".into())),
        })
    }

    /// Stores a new session (see [`CREATE`]): 1 + evicted stored, 0 id taken, -1 full,
    /// -2 the caller's share full, -3 the discover result is to be sent.
    pub(super) async fn create(
        &self,
        session: &str,
        state: &[u8],
        ops: &[u8],
    ) -> Result<i64, StoreError> {
        let mut c = self.commands.lease();
        self.bounded(
            self.create
                .key(session)
                .arg(state)
                .arg(ops)
                .invoke_async(&mut c),
        )
        .await
    }

    /// A plain `GET`.
    pub(super) async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut c = self.commands.lease();
        self.bounded(redis::cmd("GET").arg(key).query_async(&mut c))
            .await
    }

    /// `PUBLISH` of one message (a relay's ack to the replica writing its stream).
    pub(super) async fn publish(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        let mut c = self.commands.lease();
        self.bounded(
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(payload)
                .query_async::<i64>(&mut c),
        )
        .await
        .map(|_| ())
    }

    /// `DEL` of keys and `ZREM` of members of `zset`.
    pub(super) async fn delete(
        &self,
        keys: &[String],
        zset: &str,
        members: &[String],
    ) -> Result<(), StoreError> {
        let mut c = self.commands.lease();
        let mut p = redis::pipe();
        if !keys.is_empty() {
            p.cmd("DEL").arg(keys).ignore();
        }
        if !members.is_empty() {
            p.cmd("ZREM").arg(zset).arg(members).ignore();
        }
        self.bounded(p.query_async::<()>(&mut c)).await
    }

    /// The sweeper's tick (see [`SWEEP`]): sessions with due timers, claimed until
    /// `tick.claim_until`; with `tick.leases` above 0, leases past their deadline taken
    /// over by `tick.owner` until `tick.deadline`: (lease key, record, previous owner).
    pub(super) async fn sweep(&self, tick: &SweepTick<'_>) -> Result<Swept, StoreError> {
        let mut c = self.commands.lease();
        let (due, flat): (Vec<String>, Vec<RValue>) = self
            .bounded(
                self.sweep
                    .key(tick.timers)
                    .key(tick.leases_zset)
                    .arg(tick.now)
                    .arg(tick.due_at_once)
                    .arg(tick.claim_until)
                    .arg(tick.leases)
                    .arg(tick.owner)
                    .arg(tick.deadline)
                    .invoke_async(&mut c),
            )
            .await?;
        let leases = flat
            .chunks(3)
            .filter_map(|c| {
                Some((
                    as_string(c.first()?)?,
                    as_bytes(c.get(1)?)?,
                    as_string(c.get(2)?).unwrap_or_default(),
                ))
            })
            .collect();
        Ok(Swept { due, leases })
    }

    /// Renews `owner`'s lease; false when it lost it.
    pub(super) async fn renew_lease(
        &self,
        lease: &str,
        zset: &str,
        session: &str,
        owner: &str,
        deadline: u64,
        (ttl, session_ttl): (u64, u64),
    ) -> Result<bool, StoreError> {
        let mut c = self.commands.lease();
        let kept: i64 = self
            .bounded(
                self.renew_lease
                    .key(lease)
                    .key(zset)
                    .key(session)
                    .arg(owner)
                    .arg(deadline)
                    .arg(ttl)
                    .arg(session_ttl)
                    .invoke_async(&mut c),
            )
            .await?;
        Ok(kept == 1)
    }

    /// Makes `token` the holder of a stream's connection: only when there is none
    /// (`exclusive`), or taking it over. False when `exclusive` and it is held.
    pub(super) async fn hold(
        &self,
        holder: &str,
        token: &str,
        hold_ms: u64,
        exclusive: bool,
    ) -> Result<bool, StoreError> {
        let mut c = self.commands.lease();
        let mut cmd = redis::cmd("SET");
        cmd.arg(holder).arg(token).arg("PX").arg(hold_ms);
        if exclusive {
            cmd.arg("NX");
        }
        let set: Option<String> = self.bounded(cmd.query_async(&mut c)).await?;
        Ok(set.is_some())
    }

    /// Renews a holder; false when the connection is no longer the holder.
    pub(super) async fn renew_holder(
        &self,
        holder: &str,
        session: &str,
        token: &str,
        hold_ms: u64,
        ttl: u64,
    ) -> Result<bool, StoreError> {
        let mut c = self.commands.lease();
        let kept: i64 = self
            .bounded(
                self.renew_holder
                    .key(holder)
                    .key(session)
                    .arg(token)
                    .arg(hold_ms)
                    .arg(ttl)
                    .invoke_async(&mut c),
            )
            .await?;
        Ok(kept == 1)
    }

    /// Drops the holder if it is still `token`; true when it was.
    pub(super) async fn release_holder(
        &self,
        holder: &str,
        token: &str,
    ) -> Result<bool, StoreError> {
        let mut c = self.commands.lease();
        let n: i64 = self
            .bounded(
                self.release_holder
                    .key(holder)
                    .arg(token)
                    .invoke_async(&mut c),
            )
            .await?;
        Ok(n == 1)
    }

    /// Entries of a stream after `after` (at most `count`), and the stream's holder;
    /// with `hold`, that token becomes the holder (for so many ms) first, in the same
    /// round trip.
    pub(super) async fn read(
        &self,
        stream: &str,
        after: u64,
        count: usize,
        holder: &str,
        hold: Option<(&str, u64)>,
    ) -> Result<(Vec<Entry>, Option<String>), StoreError> {
        let mut c = self.commands.lease();
        let mut p = redis::pipe();
        if let Some((token, ms)) = hold {
            p.cmd("SET")
                .arg(holder)
                .arg(token)
                .arg("PX")
                .arg(ms)
                .ignore();
        }
        let (raw, holder): (RValue, Option<String>) = self
            .bounded(
                p.cmd("XRANGE")
                    .arg(stream)
                    .arg(format!("(0-{after}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(count)
                    .cmd("GET")
                    .arg(holder)
                    .query_async(&mut c),
            )
            .await?;
        Ok((parse_entries(raw)?, holder))
    }

    /// Subscribes the pub/sub connection to `channel`.
    pub(super) async fn subscribe(&self, channel: &str) -> Result<(), StoreError> {
        let mut c = self.pubsub.clone();
        self.bounded(c.subscribe(channel)).await
    }
}

/// Runs `script` on its one key `key` with `args` by `EVALSHA`, written straight from
/// them (see `Lease::query_args`), loading the script and sending the command again
/// when Redis does not have it (a restart, a `SCRIPT FLUSH`), as
/// `ScriptInvocation::invoke_async` does.
async fn eval_args<'x>(
    script: &'x Script,
    c: &mut Lease<'_>,
    key: &'x str,
    args: impl Iterator<Item = &'x [u8]> + Clone,
) -> redis::RedisResult<RValue> {
    let head: [&[u8]; 4] = [
        b"EVALSHA",
        script.get_hash().as_bytes(),
        b"1",
        key.as_bytes(),
    ];
    let args = head.into_iter().chain(args);
    match c.query_args(args.clone()).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(c).await?;
            c.query_args(args).await
        }
        reply => reply,
    }
}

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt { reason }
}

fn as_i64(v: &RValue) -> Option<i64> {
    match v {
        RValue::Int(n) => Some(*n),
        _ => None,
    }
}

fn as_bytes(v: &RValue) -> Option<Vec<u8>> {
    match v {
        RValue::BulkString(b) => Some(b.clone()),
        RValue::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn as_string(v: &RValue) -> Option<String> {
    as_bytes(v).and_then(|b| String::from_utf8(b).ok())
}

/// `XRANGE` replies: `[[id, [field, value, …]], …]` with ids `0-SEQ`.
fn parse_entries(raw: RValue) -> Result<Vec<Entry>, StoreError> {
    let RValue::Array(items) = raw else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let RValue::Array(pair) = item else {
            return Err(corrupt("a stream entry is not a pair".into()));
        };
        let mut pair = pair.into_iter();
        let id = pair.next().as_ref().and_then(as_string).unwrap_or_default();
        let seq = id
            .strip_prefix("0-")
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| corrupt(format!("stream entry id {id:?}")))?;
        let mut entry = Entry {
            seq,
            message: None,
            end: false,
        };
        if let Some(RValue::Array(fields)) = pair.next() {
            let mut fields = fields.into_iter();
            while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
                match as_string(&k).as_deref() {
                    Some("m") => entry.message = as_bytes(&v),
                    Some("e") => entry.end = true,
                    _ => {}
                }
            }
        }
        out.push(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_the_kernel_would_refuse_is_refused_at_start() {
        assert!(check_url("redis://127.0.0.1:6379/0").is_ok());
        let dir = "/run/".to_owned() + &"d".repeat(MAX_SOCKET_PATH - 16);
        let fits = format!("{dir}/redis.sock");
        assert_eq!(fits.len(), MAX_SOCKET_PATH);
        assert!(check_url(&format!("redis+unix://{fits}?db=0")).is_ok());
        let e = check_url(&format!("redis+unix://{dir}/redis.sock1?db=0")).unwrap_err();
        assert!(e.contains("is at most"), "{e}");
        // A relative path is no path: redis-rs refuses it.
        assert!(check_url("redis+unix://redis.sock").is_err());
    }
}
