//! The listener under hostile and sloppy peers, over real sockets against the spawned
//! binaries (`crates/common/src/listener.rs`, shared by `dualera serve` and `dualera gateway`):
//!
//! - twice `max_connections` half-open connections: a legitimate request is answered
//!   within 1 s of the header timeout freeing the slots ahead of it, on the gateway and
//!   on the server, and nothing crashes;
//! - the header read timeout and the idle timeout close connections; an SSE stream that
//!   carries keepalives is not idle;
//! - the accept loop survives `EMFILE` (logged once per burst) and serves again;
//! - `Origin`/`Host` parsed before comparing, `Content-Type` other than JSON → 415;
//! - WebSocket: a ping flood from a peer that never reads neither grows the gateway
//!   nor keeps being read; close codes name the cause (1009, 1007, 1003, 1002).

mod common;
use common::gateway as gateway_support;

use gateway_support::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A modern `tools/list` over a fresh raw connection; the whole response as text.
fn raw_request(authority: &str, extra: &str, content_type: &str, timeout: Duration) -> String {
    let body = serde_json::to_vec(&modern_request(
        json!(1),
        "tools/list",
        json!({}),
        json!({}),
    ))
    .unwrap();
    let mut s = TcpStream::connect(authority).expect("connect");
    s.set_read_timeout(Some(timeout)).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n\
         Mcp-Method: tools/list\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Opens `n` connections that send half a request head and stop.
fn half_open(authority: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(authority).expect("connect");
            s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
                .unwrap();
            s
        })
        .collect()
}

/// Waits until every connection is closed by the peer; returns when the last one was.
fn wait_all_closed(conns: Vec<TcpStream>, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    let mut last = Instant::now();
    for mut c in conns {
        let left = deadline.saturating_duration_since(Instant::now());
        c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("a half-open connection was not closed: {e}"),
            }
        }
        last = last.max(Instant::now());
    }
    last
}

/// With `2 × max_connections` half-open connections held, the legitimate request
/// waits in the backlog behind them and is answered within 1 s of the timeout that
/// frees its slot; the process stays up.
fn flood(target: &Proc, cap: usize) {
    let authority = target.authority();
    let attackers = half_open(&authority, 2 * cap);
    std::thread::sleep(Duration::from_millis(200));
    let a = authority.clone();
    let legit = std::thread::spawn(move || {
        let r = raw_request(&a, "", "application/json", Duration::from_secs(60));
        (Instant::now(), r)
    });
    let freed = wait_all_closed(attackers, Duration::from_secs(60));
    let (answered, response) = legit.join().expect("legit request");
    eprintln!(
        "half-open flood: answered {:?} after the last slot ahead was freed",
        answered.saturating_duration_since(freed)
    );
    assert_eq!(status_of(&response), 200, "{response}");
    assert!(
        answered.saturating_duration_since(freed) < Duration::from_secs(1),
        "answered {:?} after the slots were freed",
        answered.saturating_duration_since(freed)
    );
    assert_eq!(
        status_of(&raw_request(&authority, "", "application/json", WAIT)),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_flood_does_not_lock_out_the_gateway() {
    let ws = Workspace::new(&[("max_connections", "32"), ("header_read_timeout_secs", "2")]);
    let server = Proc::serve(&ws);
    let gw = Proc::gateway(&server.url, &ws);
    tokio::task::block_in_place(|| flood(&gw, 32));
    assert!(gw
        .log()
        .iter()
        .any(|l| l.contains("connection limit reached")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_flood_does_not_lock_out_the_server() {
    let ws = Workspace::new(&[]);
    let text = std::fs::read_to_string(&ws.config).unwrap();
    std::fs::write(
        &ws.config,
        format!("[server]\nmax_connections = 32\nheader_read_timeout_secs = 2\n\n{text}"),
    )
    .unwrap();
    let server = Proc::serve(&ws);
    tokio::task::block_in_place(|| flood(&server, 32));
}

/// A connection that never sends a head is dropped after the header timeout; one that
/// finished its request and stays idle is closed after the idle timeout; an SSE stream
/// with keepalives outlives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_idle_timeouts_close_connections() {
    let ws = Workspace::new(&[
        ("header_read_timeout_secs", "1"),
        ("idle_timeout_secs", "2"),
        ("keepalive_secs", "1"),
    ]);
    let server = Proc::serve(&ws);
    let gw = Proc::gateway(&server.url, &ws);
    let authority = gw.authority();
    tokio::task::block_in_place(|| {
        // Silent connection.
        let t0 = Instant::now();
        let silent = TcpStream::connect(&authority).unwrap();
        wait_all_closed(vec![silent], Duration::from_secs(30));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(8),
            "{took:?}"
        );

        // Keep-alive connection, idle after one exchange.
        let body = serde_json::to_vec(&modern_request(
            json!(1),
            "tools/list",
            json!({}),
            json!({}),
        ))
        .unwrap();
        let mut s = TcpStream::connect(&authority).unwrap();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n\
             Mcp-Method: tools/list\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(&body).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = vec![0u8; 65536];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        let t0 = Instant::now();
        wait_all_closed(vec![s], Duration::from_secs(30));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
            "{took:?}"
        );
    });

    // An open SSE stream carries keepalives every second: it stays open past both
    // timeouts.
    let mut host = Legacy::new(&gw.url);
    host.open("2025-11-25", json!({})).await;
    let mut get = host.get(None).await.sse();
    let until = Instant::now() + Duration::from_secs(5);
    let mut comments = 0;
    while Instant::now() < until {
        match get.next_within(Duration::from_secs(3)).await {
            Next::Item(_) => comments += 1,
            other => panic!("the SSE stream ended or stalled: {other:?}"),
        }
    }
    assert!(comments >= 3, "{comments}");
}

/// Out of descriptors: the accept loop logs once, backs off, and serves again once
/// descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_loop_survives_emfile() {
    let ws = Workspace::new(&[]);
    let up = Upstream::scripted(|s| match s.method.as_str() {
        "server/discover" => Script::Json(discover_result(&s.id, json!({"tools": {}}))),
        _ => Script::Json(complete(&s.id, json!({"tools": []}))),
    })
    .await;
    let script = format!(
        "export DUALERA_LOG=info; ulimit -n 64 && exec {} gateway --upstream {} --config {} --listen 127.0.0.1:0",
        env!("CARGO_BIN_EXE_dualera"),
        up.url,
        ws.config.display()
    );
    let gw = Proc::spawn_shell(&script, "gateway listening on");
    let authority = gw.authority();
    tokio::task::block_in_place(|| {
        let flood: Vec<TcpStream> = (0..120)
            .map(|_| TcpStream::connect(&authority).expect("connect"))
            .collect();
        let saw = Instant::now() + WAIT;
        while !gw
            .log()
            .iter()
            .any(|l| l.contains("out of file descriptors"))
        {
            assert!(Instant::now() < saw, "no EMFILE reported: {:?}", gw.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        drop(flood);
        let deadline = Instant::now() + WAIT;
        loop {
            let r = raw_request(&authority, "", "application/json", Duration::from_secs(5));
            if status_of(&r) == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "no answer after EMFILE: {r}");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let log = gw.log();
    let reported = log
        .iter()
        .filter(|l| l.contains("out of file descriptors"))
        .count();
    assert_eq!(reported, 1, "one line per burst: {log:?}");
    eventually(WAIT, "the recovery in the log", || {
        gw.log()
            .iter()
            .any(|l| l.contains("accepting connections again"))
            .then_some(())
    })
    .await;
}

/// `Origin` and `Host` are parsed (digits-only port, no userinfo) before comparing,
/// and a POST that is not `application/json` gets 415, on the gateway and the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_host_and_content_type_checked_on_both_programs() {
    let ws = Workspace::new(&[]);
    let server = Proc::serve(&ws);
    let gw = Proc::gateway(&server.url, &ws);
    tokio::task::block_in_place(|| {
        for target in [&gw, &server] {
            let a = target.authority();
            let ok = raw_request(&a, "", "application/json; charset=utf-8", WAIT);
            assert_eq!(status_of(&ok), 200, "{ok}");
            for origin in [
                "http://localhost:x.evil.example",
                "http://127.0.0.1:8901@evil.example",
                "http://localhost.evil.example",
            ] {
                let r = raw_request(
                    &a,
                    &format!("Origin: {origin}\r\n"),
                    "application/json",
                    WAIT,
                );
                assert_eq!(status_of(&r), 403, "Origin {origin}: {r}");
            }
            let r = raw_request(
                &a,
                "Origin: http://localhost:3000\r\n",
                "application/json",
                WAIT,
            );
            assert_eq!(status_of(&r), 200, "{r}");
            for content_type in [
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
            ] {
                let r = raw_request(&a, "", content_type, WAIT);
                assert_eq!(status_of(&r), 415, "{content_type}: {r}");
            }
        }
        // A Host with userinfo or a non-numeric port (the raw request's own Host line
        // is replaced by sending the request by hand).
        for target in [&gw, &server] {
            for host in ["127.0.0.1:8901@evil.example", "localhost:x.evil.example"] {
                let mut s = TcpStream::connect(target.authority()).unwrap();
                s.set_read_timeout(Some(WAIT)).unwrap();
                write!(
                    s,
                    "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
                     Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
                )
                .unwrap();
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                assert_eq!(status_of(&out), 403, "Host {host}: {out}");
            }
        }
        // The 2024-11-05 message endpoint too.
        let r = {
            let mut s = TcpStream::connect(gw.authority()).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            write!(
                s,
                "POST /messages?sessionId=x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n\
                 Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
            .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        };
        assert_eq!(status_of(&r), 415, "{r}");
    });
}

// ---------------------------------------------------------------------------------
// WebSocket
// ---------------------------------------------------------------------------------

/// A raw WebSocket client connection (after a completed handshake).
fn ws_connect(authority: &str) -> TcpStream {
    let mut s = TcpStream::connect(authority).expect("connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: mcp\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("handshake response");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// A masked client frame.
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![first];
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n < 65536 => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads server frames until a close frame; returns its code.
fn close_code(s: &mut TcpStream) -> u16 {
    loop {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).expect("a frame from the gateway");
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                s.read_exact(&mut b).unwrap();
                u64::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                s.read_exact(&mut b).unwrap();
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        let mut payload = vec![0u8; usize::try_from(len).unwrap()];
        s.read_exact(&mut payload).unwrap();
        if h[0] & 0x0f == 0x8 {
            return u16::from_be_bytes([payload[0], payload[1]]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_close_codes_name_the_cause() {
    let ws = Workspace::new(&[("max_body_bytes", "1024")]);
    let server = Proc::serve(&ws);
    let gw = Proc::gateway(&server.url, &ws);
    tokio::task::block_in_place(|| {
        let cases: [(&str, Vec<u8>, u16); 4] = [
            ("too big", frame(0x81, &[b' '; 2048]), 1009),
            ("bad UTF-8", frame(0x81, &[0xff, 0xfe, 0xfd]), 1007),
            ("binary", frame(0x82, b"{}"), 1003),
            ("reserved bit", frame(0x81 | 0x40, b"{}"), 1002),
        ];
        for (what, bytes, want) in cases {
            let mut s = ws_connect(&gw.authority());
            s.write_all(&bytes).unwrap();
            assert_eq!(close_code(&mut s), want, "{what}");
        }
    });
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// A peer that floods pings and never reads: the gateway stops reading it once its
/// pongs cannot be written (so the flood stalls in the peer's own send buffer), its
/// memory does not grow with the flood, and it drops the peer after the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_ping_flood_is_bounded() {
    let ws = Workspace::new(&[("idle_timeout_secs", "3")]);
    let server = Proc::serve(&ws);
    let gw = Proc::gateway(&server.url, &ws);
    let before = rss_kib(gw.pid());
    tokio::task::block_in_place(|| {
        let mut s = ws_connect(&gw.authority());
        s.set_write_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let ping = frame(0x89, &[b'p'; 125]);
        let burst: Vec<u8> = ping
            .iter()
            .copied()
            .cycle()
            .take(ping.len() * 512)
            .collect();
        let mut sent: usize = 0;
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline && sent < 400 << 20 {
            match s.write(&burst) {
                Ok(n) => sent += n,
                Err(_) => break, // the write blocked: the gateway stopped reading
            }
        }
        let peak = rss_kib(gw.pid());
        eprintln!(
            "ping flood: {} KiB written before the gateway stopped reading; RSS {before} -> {peak} KiB",
            sent >> 10
        );
        assert!(
            sent < 64 << 20,
            "the gateway kept reading the flood: {} MiB taken",
            sent >> 20
        );
        assert!(
            peak.saturating_sub(before) < 48 * 1024,
            "RSS grew from {before} KiB to {peak} KiB"
        );
        // Still serving others.
        let r = raw_request(&gw.authority(), "", "application/json", WAIT);
        assert_eq!(status_of(&r), 200, "{r}");
        // The stalled peer is dropped after the idle timeout.
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nonblocking(false).unwrap();
        let t0 = Instant::now();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "never dropped");
        }
    });
}
