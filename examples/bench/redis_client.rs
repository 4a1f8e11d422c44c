//! `bench redis-client-floor PORT STATE_BYTES N [CALLERS]`: what one Redis round trip costs the
//! process that makes it, with the client the gateway's Redis store uses for its
//! commands (`dualera_gateway::store::redis_conns`: connections the calling task drives
//! itself, redis-rs's encoding and parser) on a multi-threaded tokio runtime as the
//! gateway's, one call at a time as a replica's steps are with one host. The replicas
//! scenario runs it as a process of its own, pinned as the gateways are, so that its CPU
//! is nobody else's.
//!
//! Three kinds, `N` calls each: `PING`; a script that does nothing but receive a
//! step's arguments (one key, 40 arguments, a `STATE_BYTES` state), sent as the store
//! sends its step (one `EVALSHA` command, under a timeout; built once per caller, so a
//! call's CPU leaves out building its arguments and stays a lower bound); and `PING`
//! over a plain blocking socket, the kernel's share alone. Then the script again with `CALLERS`
//! (default 8) callers at once, each making its calls one at a time, half of them on
//! each of two pools: what a round trip costs the two replicas, and Redis
//! (its `INFO cpu`, read before and after), when that many hosts' steps overlap, as in
//! the scenario's capacity rounds. Last, what a state another replica pushes costs the
//! one receiving it ([`push_floor`]). It prints `ready` once connected, waits for a line
//! on stdin (the parent pins it in between), and prints one JSON line: CPU µs per
//! round trip for each kind, and the wall-clock µs a `PING`'s and a script's round trip
//! took one at a time (what a step waits for Redis before anything else it does).

use crate::Res;
use dualera_gateway::store::redis_conns::RedisConns;
use std::io::{BufRead, Read, Write};
use std::time::Duration;

/// The store's bound on every command (`session_store_timeout_ms`'s default).
const TIMEOUT: Duration = Duration::from_secs(2);

/// CPU time of every thread of this process, in nanoseconds (`schedstat`: time on a
/// CPU, user and system alike, at nanosecond resolution).
fn cpu_ns() -> u64 {
    cpu_ns_but(None)
}

/// [`cpu_ns`] without thread `tid`'s.
fn cpu_ns_but(tid: Option<&str>) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| tid.is_none_or(|tid| t.file_name().to_str() != Some(tid)))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// What a replica spends on one state another replica pushed to it (`r`, see the
/// store's step script): one message of a state's size on its pub/sub connection
/// (redis-rs's push sender on a RESP3 connection manager, as the store subscribes;
/// the message's parts copied out, as the store's subscriber does first), CPU µs per
/// message. A thread of this process publishes them one at a time over a blocking
/// socket, `pace` apart so that the receiver waits in between, as a replica waiting
/// for its host's answer does; that thread's CPU is left out.
fn push_floor(
    runtime: &tokio::runtime::Runtime,
    port: u16,
    state_bytes: usize,
    n: usize,
    pace: Duration,
) -> Res<f64> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const CHANNEL: &str = "dualera:floor:push";
    let got = Arc::new(AtomicUsize::new(0));
    let counted = got.clone();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT))
        .set_push_sender(move |info: redis::PushInfo| {
            if matches!(info.kind, redis::PushKind::Message) {
                let parts: Vec<Vec<u8>> = info
                    .data
                    .iter()
                    .filter_map(|v| match v {
                        redis::Value::BulkString(b) => Some(b.clone()),
                        _ => None,
                    })
                    .collect();
                if parts.len() == 2 {
                    counted.fetch_add(1, Ordering::Release);
                }
            }
            Ok::<(), redis::aio::SendError>(())
        });
    let url = format!("redis://127.0.0.1:{port}/0?protocol=resp3");
    let subscriber = runtime.block_on(async {
        let mut m = redis::Client::open(url.as_str())?
            .get_connection_manager_with_config(config)
            .await?;
        m.subscribe(CHANNEL).await?;
        Ok::<_, redis::RedisError>(m)
    })?;
    // What the store publishes: `r`, a session id, a version, a newline, the state.
    let mut payload = format!("r{}42\n", "s".repeat(48)).into_bytes();
    payload.resize(payload.len() + state_bytes, b's');
    let mut command = format!(
        "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{CHANNEL}\r\n${}\r\n",
        CHANNEL.len(),
        payload.len()
    )
    .into_bytes();
    command.extend_from_slice(&payload);
    command.extend_from_slice(b"\r\n");
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port))?;
    raw.set_nodelay(true)?;
    raw.set_read_timeout(Some(TIMEOUT))?;
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let publisher = std::thread::spawn(move || -> Result<(), String> {
        let me = std::fs::read_link("/proc/thread-self").map_err(|e| e.to_string())?;
        let tid = me.file_name().and_then(|t| t.to_str()).map(str::to_owned);
        tid_tx.send(tid).map_err(|e| e.to_string())?;
        go_rx.recv().map_err(|e| e.to_string())?;
        let mut reply = [0u8; 16];
        for _ in 0..n {
            std::thread::sleep(pace);
            raw.write_all(&command).map_err(|e| e.to_string())?;
            // `:1\r\n` (one subscriber), read to its end.
            let mut read = 0;
            while !reply[..read].ends_with(b"\r\n") {
                let k = raw.read(&mut reply[read..]).map_err(|e| e.to_string())?;
                if k == 0 || read + k >= reply.len() {
                    return Err("redis: no PUBLISH reply".into());
                }
                read += k;
            }
        }
        Ok(())
    });
    let tid = tid_rx.recv()?.ok_or("no thread id")?;
    let t0 = cpu_ns_but(Some(&tid));
    go_tx.send(())?;
    publisher.join().map_err(|_| "the publisher panicked")??;
    let deadline = std::time::Instant::now() + TIMEOUT;
    while got.load(std::sync::atomic::Ordering::Acquire) < n {
        if std::time::Instant::now() > deadline {
            return Err("redis: the pushed messages did not all arrive".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let used = cpu_ns_but(Some(&tid)) - t0;
    drop(subscriber);
    Ok(used as f64 / 1e3 / n as f64)
}

pub(crate) fn redis_client_floor_main(args: &[String]) -> Res<()> {
    let (port, state_bytes, n, callers) = match args {
        [p, s, n] => (p, s, n, 8),
        [p, s, n, c] => (p, s, n, c.parse::<usize>()?.clamp(1, 64)),
        _ => return Err("usage: bench redis-client-floor PORT STATE_BYTES N [CALLERS]".into()),
    };
    let port: u16 = port.parse()?;
    let state_bytes: usize = state_bytes.parse::<usize>()?.clamp(1, 1 << 20);
    let n: usize = n.parse::<usize>()?.max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let url = format!("redis://127.0.0.1:{port}/0");
    // Two pools, as two replicas; `Arc`s, since each caller is a task of its own.
    let pools = [
        std::sync::Arc::new(RedisConns::new(&url)?),
        std::sync::Arc::new(RedisConns::new(&url)?),
    ];
    let sha: String = runtime.block_on(
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg("return 1")
            .query_async(&mut pools[0].lease()),
    )?;
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port))?;
    raw.set_nodelay(true)?;
    raw.set_read_timeout(Some(TIMEOUT))?;
    println!("ready");
    std::io::stdout().flush()?;
    std::io::stdin().lock().read_line(&mut String::new())?;

    let state = vec![b's'; state_bytes];
    let arguments: Vec<String> = (0..38)
        .map(|i| format!("dualera:floor:argument:{i}"))
        .collect();
    let command = |script: bool| {
        if script {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&sha).arg(1).arg("dualera:floor").arg(1).arg(&state);
            for a in &arguments {
                c.arg(a);
            }
            c
        } else {
            redis::cmd("PING")
        }
    };
    // `callers` tasks at once, caller `i` on pool `i % 2`, `calls` calls each made
    // one at a time, as the replicas' steps of that many hosts' flows.
    let timed = |script: bool, callers: usize, calls: usize| -> Res<f64> {
        let cmd = command(script);
        let t0 = cpu_ns();
        runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..callers {
                let pool = pools[i % 2].clone();
                let cmd = cmd.clone();
                tasks.spawn(async move {
                    for _ in 0..calls {
                        // A server error comes back as `Err` (redis-rs extracts it);
                        // a lease per call, as the store takes one.
                        tokio::time::timeout(
                            TIMEOUT,
                            cmd.query_async::<redis::Value>(&mut pool.lease()),
                        )
                        .await
                        .map_err(|_| "redis: no reply within the timeout".to_owned())?
                        .map_err(|e| format!("redis: {e}"))?;
                    }
                    Ok::<(), String>(())
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.map_err(|e| e.to_string())??;
            }
            Ok::<(), String>(())
        })?;
        Ok((cpu_ns() - t0) as f64 / 1e3 / (callers * calls) as f64)
    };
    // Redis's CPU so far (`INFO cpu`, seconds with microseconds), both its user and
    // system time.
    let redis_cpu = || -> Res<f64> {
        let info: String = runtime.block_on(
            redis::cmd("INFO")
                .arg("cpu")
                .query_async(&mut pools[0].lease()),
        )?;
        Ok(crate::stats::info_cpu_seconds(&info)?)
    };
    let wall = |started: std::time::Instant| started.elapsed().as_secs_f64() * 1e6 / n as f64;
    let started = std::time::Instant::now();
    let ping = timed(false, 1, n)?;
    let ping_wall = wall(started);
    let started = std::time::Instant::now();
    let script = timed(true, 1, n)?;
    let script_wall = wall(started);
    let per_caller = n.div_ceil(callers);
    let r0 = redis_cpu()?;
    let script_at_once = timed(true, callers, per_caller)?;
    let redis_script_at_once = (redis_cpu()? - r0) * 1e6 / (callers * per_caller) as f64;
    let t0 = cpu_ns();
    let mut reply = [0u8; 64];
    for _ in 0..n {
        raw.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut got = 0;
        while got < 7 {
            let k = raw.read(&mut reply[got..])?;
            if k == 0 {
                return Err("redis closed the connection".into());
            }
            got += k;
        }
    }
    let blocking = (cpu_ns() - t0) as f64 / 1e3 / n as f64;
    let push = push_floor(
        &runtime,
        port,
        state_bytes,
        n.min(2_000),
        Duration::from_micros(300),
    )?;
    println!(
        "{}",
        serde_json::json!({"ping_us": ping, "script_us": script, "script_wall_us": script_wall,
            "ping_wall_us": ping_wall,
            "blocking_ping_us": blocking, "push_us": push,
            "callers": callers, "script_at_once_us": script_at_once,
            "redis_script_at_once_us": redis_script_at_once})
    );
    Ok(())
}
