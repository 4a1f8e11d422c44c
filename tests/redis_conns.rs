//! The Redis store's command connections (`store::redis_conns`) against a real Redis:
//! the connection count stays bounded, a cancelled call leaves no reply behind for the
//! next one, connections Redis closed are replaced without a failed call, an oversized
//! reply is refused, and the URL's password and database hold on every connection,
//! over TCP and over a Unix socket.

mod common;
use common::gateway::replicas::RedisServer;

use dualera_gateway::store::redis_conns::{RedisConns, MAX_CONNECTIONS};
use redis::Value;
use std::sync::Arc;
use std::time::Duration;

/// Connections whose last command was `last` (`CLIENT LIST`): the pool's, where only
/// the pool sent it (the test's own connections, one per command, are left out, also
/// one Redis has not yet seen closed).
fn clients_after(redis: &RedisServer, last: &str) -> usize {
    let reply = redis.command(&["CLIENT", "LIST", "TYPE", "normal"]);
    let last = format!(" cmd={last} ");
    reply.lines().filter(|l| l.contains(&last)).count()
}

async fn get(conns: &RedisConns, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conns.lease())
        .await
        .expect("GET")
}

/// The error a `GET` gets.
async fn get_fails(conns: &RedisConns, key: &str) -> redis::RedisError {
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<Vec<u8>>>(&mut conns.lease())
        .await
        .expect_err("GET should fail")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_bound_wait_for_a_connection() {
    let redis = RedisServer::start();
    let conns = Arc::new(RedisConns::new(&redis.url()).unwrap());
    let calls = 3 * MAX_CONNECTIONS;
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..calls {
        let conns = conns.clone();
        tasks.spawn(async move {
            // Each holds its connection for 300 ms inside Redis.
            let got: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(format!("nothing:{i}"))
                .arg(0.3)
                .query_async(&mut conns.lease())
                .await
                .expect("BLPOP");
            assert_eq!(got, None);
        });
    }
    // While they run, never more than the bound.
    let mut most = 0;
    while !tasks.is_empty() {
        most = most.max(clients_after(&redis, "blpop"));
        tokio::select! {
            done = tasks.join_next() => done.unwrap().expect("a call"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    assert!(most <= MAX_CONNECTIONS, "{most} connections at once");
    assert!(most > 1, "the calls did not overlap: {most}");
    // 96 calls of 300 ms on 32 connections: at least three rounds of them.
    assert!(
        started.elapsed() >= Duration::from_millis(850),
        "{:?}",
        started.elapsed()
    );
    // Kept for the next calls, still at most the bound.
    let kept = clients_after(&redis, "blpop");
    assert!((2..=MAX_CONNECTIONS).contains(&kept), "{kept} kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_no_reply_for_the_next() {
    let redis = RedisServer::start();
    let conns = RedisConns::new(&redis.url()).unwrap();
    redis.command(&["SET", "k", "value"]);
    for _ in 0..5 {
        // Cancelled while Redis still holds it: its reply (nil, 200 ms later) must
        // never be read as another call's.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(30),
            redis::cmd("BLPOP")
                .arg("nothing")
                .arg(0.2)
                .query_async::<Value>(&mut conns.lease()),
        )
        .await;
        assert!(cancelled.is_err(), "BLPOP answered early: {cancelled:?}");
        assert_eq!(get(&conns, "k").await.as_deref(), Some("value"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(&conns, "k").await.as_deref(), Some("value"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_redis_closed_are_replaced_without_a_failed_call() {
    closed_connections_are_replaced(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_redis_closed_are_replaced_over_a_unix_socket_too() {
    closed_connections_are_replaced(true).await;
}

/// Connections Redis closed (`CLIENT KILL`, a restart) replaced without a failed call,
/// and Redis down a clean failure, over TCP or over its Unix socket.
async fn closed_connections_are_replaced(over_socket: bool) {
    let mut redis = RedisServer::start_on(over_socket);
    let conns = RedisConns::new(&redis.store_url()).unwrap();
    redis.command(&["SET", "k", "value"]);
    assert_eq!(get(&conns, "k").await.as_deref(), Some("value"));
    for round in 0..3 {
        // Every idle connection of the pool closed by Redis (`SKIPME` spares the
        // one asking).
        let killed = redis.int(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(killed >= 1, "round {round}: nothing to kill");
        assert_eq!(
            get(&conns, "k").await.as_deref(),
            Some("value"),
            "round {round}"
        );
    }
    // A restart closes them too; Redis comes back empty.
    redis.restart();
    assert_eq!(get(&conns, "k").await, None);
    // Redis down: the call fails (the store answers `sessionStoreUnavailable`), and
    // once it is back the pool connects again by itself.
    redis.stop();
    let err = get_fails(&conns, "k").await;
    assert!(err.is_io_error() || err.is_connection_refusal(), "{err}");
    redis.restart();
    assert_eq!(get(&conns, "k").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_over_the_bound_is_refused_and_its_connection_closed() {
    let redis = RedisServer::start();
    let conns = RedisConns::new(&redis.url()).unwrap();
    let big = vec![b'x'; dualera_gateway::store::redis_conns::MAX_REPLY + 1];
    let () = redis::cmd("SET")
        .arg("big")
        .arg(&big)
        .query_async(&mut conns.lease())
        .await
        .expect("SET");
    let err = get_fails(&conns, "big").await;
    assert!(err.to_string().contains("larger than the bound"), "{err}");
    // The rest of that reply is never read as the next call's.
    assert_eq!(get(&conns, "nothing").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urls_password_and_database_hold_on_every_connection() {
    let redis = RedisServer::start_on(true);
    redis.command(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let port = redis.port;
    let db3 = Arc::new(RedisConns::new(&format!("redis://:s3cret@127.0.0.1:{port}/3")).unwrap());
    let db0 = RedisConns::new(&format!("redis://:s3cret@127.0.0.1:{port}/0")).unwrap();
    // Several connections at once, each authenticated and on database 3.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let db3 = db3.clone();
        tasks.spawn(async move {
            let () = redis::cmd("SET")
                .arg(format!("k{i}"))
                .arg(i)
                .query_async(&mut db3.lease())
                .await
                .expect("SET on database 3");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    for i in 0..8 {
        assert_eq!(get(&db3, &format!("k{i}")).await, Some(i.to_string()));
        assert_eq!(get(&db0, &format!("k{i}")).await, None);
    }
    // Without the password: Redis's own error, not a hang.
    let nopass = RedisConns::new(&format!("redis://127.0.0.1:{port}/0")).unwrap();
    let err = get_fails(&nopass, "k0").await;
    assert!(err.to_string().contains("NOAUTH"), "{err}");
    // A wrong one fails when the connection opens.
    let wrong = RedisConns::new(&format!("redis://:nope@127.0.0.1:{port}/0")).unwrap();
    let err = get_fails(&wrong, "k0").await;
    assert!(
        err.to_string().contains("WRONGPASS") || err.to_string().contains("invalid"),
        "{err}"
    );
    // The same over the Unix socket (`redis+unix:///PATH?db=3&pass=…`): the keys
    // written over TCP, on database 3, on a connection Redis flags as a socket's.
    let socket = redis.socket().display().to_string();
    let over_socket = RedisConns::new(&format!("redis+unix://{socket}?db=3&pass=s3cret")).unwrap();
    for i in 0..8 {
        assert_eq!(
            get(&over_socket, &format!("k{i}")).await,
            Some(i.to_string())
        );
    }
    let unix_gets = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async::<String>(&mut over_socket.lease())
        .await
        .expect("CLIENT LIST")
        .lines()
        .filter(|l| l.contains(&format!("addr={socket}:0")) && l.contains(" db=3 "))
        .count();
    assert!(unix_gets >= 1, "no connection over the socket");
    let unauthenticated = RedisConns::new(&format!("redis+unix://{socket}?db=3")).unwrap();
    let err = get_fails(&unauthenticated, "k0").await;
    assert!(err.to_string().contains("NOAUTH"), "{err}");
}
