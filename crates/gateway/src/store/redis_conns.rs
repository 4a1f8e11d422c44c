//! Redis connections that the task making a call drives itself: the shared session
//! store's commands go over these, and the bench's floor prices them.
//!
//! Why not redis-rs's `ConnectionManager` (which the pub/sub connection still is): its
//! multiplexed connection runs a task of its own that writes every command and reads
//! every reply, so each round trip hands the command to that task through a channel
//! and the reply back through another. On a multi-threaded runtime the first hand-off
//! often wakes the idle worker (a `futex` call, then a cold resume), and a replicated
//! flow makes seven or eight round trips. Here the calling task writes the command and
//! reads its reply on a connection it holds for the call: the reply's readiness wakes
//! that task directly. Measured with the bench's replicas scenario (the same binary
//! switched between the two), both replicas' CPU per flow fell from 2.12–2.20× the
//! in-memory gateway's to 1.91–1.93×.
//!
//! What stays redis-rs's: the command's encoding (`Cmd`, `Pipeline`, `Script` through
//! [`redis::aio::ConnectionLike`], which [`Lease`] implements; the two scripts every
//! replicated step sends are written here from their arguments, the bytes `Cmd`
//! writes, see [`Lease::query_args`]), the reply's type
//! ([`Value`]), the parsing of an error reply, the URL's parsing, and every error. A
//! reply is decoded here from the framing read to find where it ends (see `parse`:
//! redis-rs's parser cost a third of the client's CPU per flow). Besides, this module
//! holds only the connection's life:
//!
//! - at most [`MAX_CONNECTIONS`] per process; a call waits for one beyond that (under the
//!   caller's timeout, as every store call is);
//! - opened lazily, authenticated (`AUTH`) and on the URL's database (`SELECT`) before
//!   its first command, kept after a call that completed, and closed after any other
//!   (a failed, timed-out or cancelled call leaves the stream in an unknown place);
//! - a reply is at most [`MAX_REPLY`] bytes;
//! - an idle connection Redis has closed (a restart, its `timeout` setting, `CLIENT
//!   KILL`) is found when a call's write or read fails on it before any byte of the
//!   reply came: that call is made once more on a new connection, and the other idle
//!   connections are dropped (after a restart they are closed too). Redis closes an
//!   idle connection without reading what comes after; were it to run a command and
//!   close the connection before answering (a `CLIENT KILL` landing between the two),
//!   the command would run twice, as it does when a host retries a request after the
//!   error the call would otherwise have given. Redis down: the new connection is
//!   refused and the call fails.

use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Connections one process opens to Redis for commands, at most.
pub const MAX_CONNECTIONS: usize = 32;

/// A reply's size, at most: far above anything the store reads (a session's state, a
/// bounded read of a stream's entries), and below what a reply could grow to unbounded.
pub const MAX_REPLY: usize = 64 << 20;

/// The room a connection keeps for replies between calls: a step's reply, a session's
/// state or a few stream entries fit in it at one read.
const KEPT_BUFFER: usize = 16 << 10;

/// Where to connect and what to say first.
#[derive(Debug)]
enum Target {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

/// The pool: a process's command connections to one Redis.
pub struct RedisConns {
    target: Target,
    /// `AUTH` and `SELECT` as the URL asks, sent on every new connection (empty when it
    /// asks neither).
    hello: Pipeline,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
}

impl std::fmt::Debug for RedisConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target only: `hello` holds the password.
        f.debug_struct("RedisConns")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

struct Conn {
    stream: Stream,
    /// The reply being read (kept between calls with up to [`KEPT_BUFFER`] of room).
    buf: Vec<u8>,
}

impl RedisConns {
    /// The pool for a `redis://` (or `redis+unix://`) URL; nothing is connected yet.
    pub fn new(url: &str) -> redis::RedisResult<Self> {
        let info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let target = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Target::Tcp(host.clone(), *port),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Target::Unix(path.clone()),
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "this build connects to Redis over TCP or a Unix socket only",
                    format!("{other:?}"),
                )))
            }
        };
        let settings = info.redis_settings();
        let mut hello = redis::pipe();
        if let Some(password) = settings.password() {
            let auth = hello.cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            hello.cmd("SELECT").arg(settings.db());
        }
        Ok(Self {
            target,
            hello,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(MAX_CONNECTIONS),
        })
    }

    /// A handle for one call (or a few in a row): it takes a connection when its first
    /// command is sent and gives it back when dropped.
    pub fn lease(&self) -> Lease<'_> {
        Lease {
            conns: self,
            held: None,
            out: Vec::new(),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        // A poisoned list is still a list of connections.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn connect(&self) -> redis::RedisResult<Conn> {
        let stream = match &self.target {
            Target::Tcp(host, port) => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            #[cfg(unix)]
            Target::Unix(path) => Stream::Unix(tokio::net::UnixStream::connect(path).await?),
        };
        let mut conn = Conn {
            stream,
            buf: Vec::with_capacity(KEPT_BUFFER),
        };
        if !self.hello.is_empty() {
            for reply in conn
                .exchange(&self.hello.get_packed_pipeline(), self.hello.len())
                .await?
            {
                reply.extract_error()?;
            }
        }
        Ok(conn)
    }
}

/// One call's hold on a connection (see [`RedisConns::lease`]).
pub struct Lease<'a> {
    conns: &'a RedisConns,
    /// The connection and the permit it counts against; `None` until the first command,
    /// and again after a call that did not complete.
    held: Option<(Conn, SemaphorePermit<'a>)>,
    /// The command being sent.
    out: Vec<u8>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some((conn, _permit)) = self.held.take() {
            self.conns.idle().push(conn);
        }
    }
}

impl Lease<'_> {
    /// Sends `self.out` and reads `skip + count` replies, returning the last `count`.
    async fn call(&mut self, skip: usize, count: usize) -> redis::RedisResult<Vec<Value>> {
        let conns = self.conns;
        let (mut conn, permit, reused) = match self.held.take() {
            Some((conn, permit)) => (conn, permit, true),
            None => {
                let permit = conns.permits.acquire().await.map_err(|_| {
                    RedisError::from((ErrorKind::Client, "the Redis connections are closed"))
                })?;
                let idle = conns.idle().pop();
                match idle {
                    Some(conn) => (conn, permit, true),
                    None => (conns.connect().await?, permit, false),
                }
            }
        };
        // Dropped here (cancelled, or failed) the connection is closed with it.
        let replies = match conn.exchange(&self.out, skip + count).await {
            Err(e) if reused && conn.buf.is_empty() && closed(&e) => {
                conns.idle().clear();
                conn = conns.connect().await?;
                conn.exchange(&self.out, skip + count).await?
            }
            replies => replies?,
        };
        self.held = Some((conn, permit));
        Ok(replies.into_iter().skip(skip).collect())
    }
}

/// Whether `e` says the peer closed the connection.
fn closed(e: &RedisError) -> bool {
    e.is_connection_dropped() || e.is_io_error()
}

impl Conn {
    /// Writes `command` and reads `n` replies.
    async fn exchange(&mut self, command: &[u8], n: usize) -> redis::RedisResult<Vec<Value>> {
        match &mut self.stream {
            Stream::Tcp(s) => s.write_all(command).await?,
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(command).await?,
        }
        self.buf.clear();
        loop {
            let read = match &mut self.stream {
                Stream::Tcp(s) => s.read_buf(&mut self.buf).await?,
                #[cfg(unix)]
                Stream::Unix(s) => s.read_buf(&mut self.buf).await?,
            };
            if read == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "Redis closed the connection",
                )
                .into());
            }
            match replies_end(&self.buf, n)? {
                Some(end) => {
                    let replies = parse(&self.buf[..end], n);
                    self.buf.clear();
                    // An idle connection keeps a usual reply's room, not a large one's.
                    self.buf.shrink_to(KEPT_BUFFER);
                    return replies;
                }
                None if self.buf.len() < MAX_REPLY => {
                    // Room for the next read without growing a byte at a time.
                    self.buf.reserve(self.buf.len().max(4096));
                }
                None => return Err(too_large()),
            }
        }
    }
}

fn too_large() -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "Redis sent a reply larger than the bound",
        format!("over {MAX_REPLY} bytes"),
    ))
}

/// Nesting deeper than this is left to redis-rs's parser (which refuses it): no reply
/// of the store's nests more than twice.
const MAX_DEPTH: usize = 16;

/// The line at `*at` (its type byte and what follows it up to `\r\n`), moving `*at`
/// past it; `None` while it has not all arrived.
fn next_line<'b>(bytes: &'b [u8], at: &mut usize) -> Option<(u8, &'b [u8])> {
    let rest = bytes.get(*at..)?;
    let eol = rest.windows(2).position(|w| w == b"\r\n")?;
    let kind = *rest.first()?;
    let line = rest.get(1..eol)?;
    *at += eol + 2;
    Some((kind, line))
}

/// Where `n` whole replies end in `bytes`; `None` while they have not all arrived.
///
/// Only the framing is read here (each line's type and length, a bulk string's bytes
/// skipped by its length), so that a reply arriving in many reads is looked at in
/// whole once, by [`parse`], instead of parsed again from its start at each read; and
/// so that a bulk string longer than the bound is refused from its header. The
/// connection speaks RESP2 (no `HELLO 3` is sent): these five types are all it answers
/// with.
fn replies_end(bytes: &[u8], n: usize) -> redis::RedisResult<Option<usize>> {
    let mut at = 0;
    let mut pending = n;
    while pending > 0 {
        let Some((kind, line)) = next_line(bytes, &mut at) else {
            return Ok(None);
        };
        pending -= 1;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                if let Some(len) = length(line)? {
                    if len > MAX_REPLY {
                        return Err(too_large());
                    }
                    at += len + 2;
                }
            }
            b'*' => {
                if let Some(len) = length(line)? {
                    // Every element takes at least three bytes.
                    if len > MAX_REPLY / 3 {
                        return Err(too_large());
                    }
                    pending += len;
                }
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::Parse,
                    "Redis sent a reply of an unknown type",
                    format!("{:?}", char::from(other)),
                )))
            }
        }
    }
    Ok((at <= bytes.len()).then_some(at))
}

fn malformed(what: &'static str, line: &[u8]) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        what,
        String::from_utf8_lossy(line).into_owned(),
    ))
}

/// A bulk string's or an array's length; `None` for RESP2's null (`-1`).
fn length(line: &[u8]) -> redis::RedisResult<Option<usize>> {
    let text =
        std::str::from_utf8(line).map_err(|_| malformed("Redis sent a malformed length", line))?;
    if text == "-1" {
        return Ok(None);
    }
    text.parse::<usize>()
        .map(Some)
        .map_err(|_| malformed("Redis sent a malformed length", line))
}

/// The `n` replies that `bytes` holds whole (see [`replies_end`]), as redis-rs's parser
/// reads them (`+OK` is `Okay`, a null is `Nil`).
///
/// Decoded here, from the framing `replies_end` already walked: redis-rs's parser is
/// built on a general parser-combinator library, and in the bench's replicated flow it
/// was a third of the client's CPU. A reply that is or holds an error goes through
/// redis-rs's parser, which alone builds a `ServerError` (`NOSCRIPT` after a restart,
/// a script's error): those are rare, and their meaning stays redis-rs's.
fn parse(bytes: &[u8], n: usize) -> redis::RedisResult<Vec<Value>> {
    let mut at = 0;
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        let start = at;
        match decode(bytes, &mut at, 0)? {
            Some(v) => replies.push(v),
            None => {
                let one = bytes.get(start..).unwrap_or_default();
                let len = replies_end(one, 1)?.ok_or_else(incomplete)?;
                replies.push(redis::parse_redis_value(&one[..len])?);
                at = start + len;
            }
        }
    }
    Ok(replies)
}

fn incomplete() -> RedisError {
    RedisError::from((ErrorKind::Parse, "Redis sent an incomplete reply"))
}

/// The reply at `*at`, moving `*at` past it; `None` when it is or holds an error (or
/// nests deeper than [`MAX_DEPTH`]), for redis-rs's parser to read.
fn decode(bytes: &[u8], at: &mut usize, depth: usize) -> redis::RedisResult<Option<Value>> {
    let (kind, line) = next_line(bytes, at).ok_or_else(incomplete)?;
    let text = || {
        std::str::from_utf8(line)
            .map_err(|_| malformed("Redis sent a line that is not UTF-8", line))
    };
    Ok(Some(match kind {
        b'+' => match text()? {
            "OK" => Value::Okay,
            status => Value::SimpleString(status.to_owned()),
        },
        b':' => Value::Int(
            text()?
                .trim()
                .parse()
                .map_err(|_| malformed("Redis sent a malformed integer", line))?,
        ),
        b'$' => match length(line)? {
            None => Value::Nil,
            Some(len) => {
                let body = bytes.get(*at..*at + len).ok_or_else(incomplete)?;
                if bytes.get(*at + len..*at + len + 2) != Some(&b"\r\n"[..]) {
                    return Err(malformed("Redis sent a bulk string without its end", line));
                }
                *at += len + 2;
                Value::BulkString(body.to_vec())
            }
        },
        b'*' => match length(line)? {
            None => Value::Nil,
            Some(_) if depth >= MAX_DEPTH => return Ok(None),
            Some(len) => {
                // The elements are all there (`replies_end` found them), three bytes
                // each at least; the room grows with them past a usual reply's size.
                let mut items = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    match decode(bytes, at, depth + 1)? {
                        Some(v) => items.push(v),
                        None => return Ok(None),
                    }
                }
                Value::Array(items)
            }
        },
        _ => return Ok(None),
    }))
}

impl Lease<'_> {
    /// Sends one command given as its arguments (`args[0]` its name), written in the
    /// protocol straight from them, and returns its reply; an error reply is `Err`, as
    /// redis-rs's `query_async` makes it.
    ///
    /// For the commands of every replicated step (the step and version-check scripts):
    /// through a `Cmd`, each argument was copied into the command's own buffer and then
    /// again into the connection's, with an allocation or two per command. The bytes
    /// are the ones `Cmd` writes (see the test).
    pub async fn query_args<'x>(
        &mut self,
        args: impl Iterator<Item = &'x [u8]> + Clone,
    ) -> redis::RedisResult<Value> {
        self.out.clear();
        write_command(&mut self.out, args);
        self.call_one().await?.extract_error()
    }

    /// Sends `self.out`, one command, and reads its reply.
    async fn call_one(&mut self) -> redis::RedisResult<Value> {
        self.call(0, 1)
            .await?
            .pop()
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "no reply")))
    }
}

/// Appends the command `args` (its name first) to `out` in RESP: an array of bulk
/// strings.
fn write_command<'x>(out: &mut Vec<u8>, args: impl Iterator<Item = &'x [u8]> + Clone) {
    let mut digits = itoa::Buffer::new();
    let (count, bytes) = args
        .clone()
        .fold((0, 0), |(n, b), a| (n + 1, b + a.len() + 2));
    // A header is at most 1 + 20 digits + 2 bytes.
    out.reserve(23 * (count + 1) + bytes);
    out.push(b'*');
    out.extend_from_slice(digits.format(count).as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        out.extend_from_slice(digits.format(arg.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

impl ConnectionLike for Lease<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.out.clear();
            cmd.write_packed_command(&mut self.out);
            self.call_one().await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.out = pipeline.get_packed_pipeline();
            self.call(offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        // Every connection is on the URL's database (`SELECT` when it opens).
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_whole_or_not_yet() {
        let two = b"$3\r\nabc\r\n*2\r\n:1\r\n$-1\r\n";
        for cut in 0..two.len() {
            assert!(
                matches!(replies_end(&two[..cut], 2), Ok(None)),
                "cut at {cut}"
            );
        }
        assert_eq!(replies_end(two, 2).unwrap(), Some(two.len()));
        assert_eq!(replies_end(two, 1).unwrap(), Some(9));
        let replies = parse(two, 2).unwrap();
        assert_eq!(replies[0], Value::BulkString(b"abc".to_vec()));
        assert_eq!(replies[1], Value::Array(vec![Value::Int(1), Value::Nil]));
        // A server error is a reply like any other (redis-rs turns it into `Err` later).
        let err = b"-NOSCRIPT No matching script\r\n";
        assert_eq!(replies_end(err, 1).unwrap(), Some(err.len()));
        assert!(matches!(parse(err, 1).unwrap()[0], Value::ServerError(_)));
        // Nested, empty and null arrays.
        let nested = b"*2\r\n*0\r\n*-1\r\n+OK\r\n";
        assert_eq!(replies_end(nested, 1).unwrap(), Some(nested.len() - 5));
        assert_eq!(replies_end(nested, 2).unwrap(), Some(nested.len()));
    }

    #[test]
    fn replies_decode_as_redis_rs_parses_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+PONG\r\n",
            b":42\r\n",
            b":-7\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"$4\r\na\r\nb\r\n",
            b"$3\r\n\xff\x00\x01\r\n",
            b"*5\r\n:1\r\n$2\r\nv7\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n:0\r\n*0\r\n",
            b"*2\r\n*1\r\n*1\r\n+OK\r\n$-1\r\n",
            // Errors, alone or inside an array: redis-rs's parser reads those.
            b"-NOSCRIPT No matching script\r\n",
            b"-ERR unknown command\r\n",
            b"*2\r\n:1\r\n-ERR inside\r\n",
        ];
        for reply in replies {
            let ours = parse(reply, 1).unwrap();
            let theirs = redis::parse_redis_value(reply).unwrap();
            assert_eq!(ours, vec![theirs], "{}", String::from_utf8_lossy(reply));
        }
        // Several in a row, errors among them, each where it ends.
        let all: Vec<u8> = replies.concat();
        let ours = parse(&all, replies.len()).unwrap();
        let theirs: Vec<Value> = replies
            .iter()
            .map(|r| redis::parse_redis_value(r).unwrap())
            .collect();
        assert_eq!(ours, theirs);
        // A bulk string without its end, and garbage where an integer goes.
        assert!(parse(b"$2\r\nabc\r\n", 1).is_err());
        assert!(parse(b":x\r\n", 1).is_err());
    }

    #[test]
    fn garbage_and_huge_lengths_are_errors_not_waits() {
        assert!(replies_end(b"?what\r\n", 1).is_err());
        assert!(replies_end(b"$x\r\n", 1).is_err());
        assert!(replies_end(b"$-2\r\n", 1).is_err());
        let huge = format!("${}\r\n", MAX_REPLY + 1);
        assert!(replies_end(huge.as_bytes(), 1).is_err());
        let many = format!("*{}\r\n", MAX_REPLY);
        assert!(replies_end(many.as_bytes(), 1).is_err());
    }

    #[test]
    fn commands_are_written_as_redis_rs_writes_them() {
        let state = vec![0xffu8; 700];
        let cases: &[&[&[u8]]] = &[
            &[b"PING"],
            &[
                b"EVALSHA",
                b"0123abcd",
                b"1",
                b"dualera:s:{x}",
                b"7",
                &state,
                b"",
                b"\r\n",
            ],
            &[b"HMGET", b"k", b"v", b"gone", b"d"],
        ];
        for args in cases {
            let mut cmd = redis::Cmd::new();
            for a in args.iter() {
                cmd.arg(*a);
            }
            let mut ours = Vec::new();
            write_command(&mut ours, args.iter().copied());
            assert_eq!(ours, cmd.get_packed_command());
        }
    }

    #[test]
    fn the_password_stays_out_of_debug() {
        let conns = RedisConns::new("redis://user:s3cret@127.0.0.1:6379/2").unwrap();
        assert_eq!(conns.hello.len(), 2);
        assert!(!format!("{conns:?}").contains("s3cret"));
    }
}
