//! Several `dualera serve` instances on one PostgreSQL (a throw-away cluster the test
//! starts): the same accepted confirmation sent to two instances at the same instant
//! deletes once, 200 times over; states and cursors travel between instances that share
//! `[[state.keys]]` and fail with `-32602` on one that does not; `DUALERA_STORE_URL`
//! selects the store; a schema newer than the build is refused at start.
//!
//! `Fixture::spawn_n` is the reusable part: N instances on one store and one key set.

mod common;

use common::pg_cluster::PgCluster;
use common::*;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};

fn pg_fixture(pg: &PgCluster, db: &str) -> Arc<Fixture> {
    let url = pg.create_database(db).expect("create the test database");
    Fixture::with(Options {
        store_url: Some(url),
        ..Options::default()
    })
}

/// The notes workspace's `total`, as an instance's `notes_list` reports it.
fn total(srv: &Server) -> u64 {
    let r = srv.call(
        "notes_list",
        json!({"workspaceUri": srv.fixture.notes_uri, "limit": 1}),
        json!({}),
    );
    r.result()["structuredContent"]["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total: {}", r.msg()))
}

#[test]
fn two_instances_one_delete_per_confirmation_200_times() {
    const ROUNDS: usize = 200;
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let fx = pg_fixture(&pg, "race");
    let servers = fx.spawn_n(Kind::Http, 2);
    let (a, b) = (&servers[0], &servers[1]);
    // A few notes that must survive every round.
    let keep = [a.create_note("keep", "1"), b.create_note("keep", "2")];
    for round in 0..ROUNDS {
        let title = format!("race {round}");
        let (issuer, other) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let id = issuer.create_note(&title, "to be deleted once");
        let before = total(other);
        let state = issuer.delete_round1(json!(1), &title).state();
        let msg = retry(
            json!(2),
            "notes_delete",
            issuer.delete_args(&title),
            form(),
            json!({"delete_choice": accept(&id, true)}),
            &state,
        );
        let barrier = Barrier::new(2);
        let replies: Vec<Reply> = std::thread::scope(|s| {
            let sends: Vec<_> = [a, b]
                .into_iter()
                .map(|srv| {
                    let (barrier, msg) = (&barrier, &msg);
                    s.spawn(move || {
                        barrier.wait();
                        srv.send(msg)
                    })
                })
                .collect();
            sends
                .into_iter()
                .map(|h| h.join().expect("sender"))
                .collect()
        });
        let deleted: Vec<&Reply> = replies
            .iter()
            .filter(|r| r.msg().get("result").is_some())
            .collect();
        assert_eq!(deleted.len(), 1, "round {round}: {replies:?}");
        let res = deleted[0].result();
        assert_eq!(res["resultType"], "complete", "round {round}: {res}");
        assert_eq!(
            res["structuredContent"]["deleted"],
            json!(id),
            "round {round}"
        );
        let refused = replies
            .iter()
            .find(|r| r.msg().get("error").is_some())
            .expect("the other instance answers with an error");
        refused.expect_error(-32602);
        assert!(
            refused.message().contains("already been used"),
            "{}",
            refused.msg()
        );
        assert_eq!(
            total(issuer),
            before - 1,
            "round {round}: exactly one note fewer"
        );
    }
    assert_eq!(total(a), keep.len() as u64);
    assert_eq!(
        pg.psql("race", "SELECT count(*) FROM notes").unwrap(),
        keep.len().to_string()
    );
    assert_eq!(
        pg.psql("race", "SELECT count(*) FROM nonces").unwrap(),
        ROUNDS.to_string(),
        "one used nonce per confirmation"
    );
    for srv in &servers {
        assert!(
            !srv.stderr_text().contains(pg.password()),
            "the database password reached a log"
        );
    }
}

#[test]
fn states_and_cursors_need_the_same_key_set() {
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let fx = pg_fixture(&pg, "keys");
    let servers = fx.spawn_n(Kind::Http, 2);
    let (a, b) = (&servers[0], &servers[1]);
    let other_keys = fx.dir.join("other-keys.toml");
    std::fs::write(
        &other_keys,
        fx.config_text_signing_with("other-1", "a-different-secret-0123456789abcdef"),
    )
    .unwrap();
    let same_id_other_secret = fx.dir.join("same-id-other-secret.toml");
    std::fs::write(
        &same_id_other_secret,
        fx.config_text_signing_with("test-1", "not-the-shared-secret-0123456789"),
    )
    .unwrap();
    let strangers = [
        fx.spawn_with_config(Kind::Http, &other_keys),
        fx.spawn_with_config(Kind::Http, &same_id_other_secret),
    ];

    let id = a.create_note("keyed", "x");
    let state = a.delete_round1(json!(1), "keyed").state();
    let msg = retry(
        json!(2),
        "notes_delete",
        a.delete_args("keyed"),
        form(),
        json!({"delete_choice": accept(&id, true)}),
        &state,
    );
    for (stranger, why) in strangers.iter().zip(["unknown key", "integrity"]) {
        let r = stranger.send(&msg);
        r.expect_error(-32602);
        assert!(r.message().contains(why), "{}", r.msg());
    }
    assert_eq!(
        total(a),
        1,
        "nothing deleted by an instance with other keys"
    );
    // An instance with the same keys honours it.
    let r = b.send(&msg);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(id),
        "{}",
        r.msg()
    );

    // Cursors too: page 1 on one instance, page 2 on another.
    for i in 0..5 {
        a.create_note(&format!("page {i}"), "x");
    }
    let args = json!({"workspaceUri": fx.notes_uri, "limit": 3});
    let r = a.call("notes_list", args.clone(), json!({}));
    let first = r.result()["structuredContent"].clone();
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let mut next = args.clone();
    next["cursor"] = json!(cursor);
    let r = b.call("notes_list", next.clone(), json!({}));
    let second = &r.result()["structuredContent"];
    assert_eq!(
        second["notes"].as_array().map(Vec::len),
        Some(2),
        "{second}"
    );
    assert!(second.get("nextCursor").is_none());
    let ids = |v: &Value| -> Vec<Value> {
        v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].clone())
            .collect()
    };
    assert!(ids(&first).iter().all(|i| !ids(second).contains(i)));
    for stranger in &strangers {
        stranger
            .call("notes_list", next.clone(), json!({}))
            .expect_error(-32602);
    }
}

/// Runs `dualera serve` with `config` and `DUALERA_STORE_URL`; waits until it listens
/// (returns its stderr) or exits (returns its status and stderr).
fn serve_once(config: &std::path::Path, url: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("DUALERA_STORE_URL", url)
        .env("DUALERA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dualera");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut text = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let listening = line.contains("listening on http://");
            text.push_str(&line);
            text.push('\n');
            if listening {
                let _ = tx.send(text.clone());
            }
        }
        let _ = tx.send(text);
    });
    let text = rx
        .recv_timeout(WAIT)
        .expect("serve neither listened nor exited");
    if text.contains("listening on http://") {
        let _ = child.kill();
        let _ = child.wait();
        (None, text)
    } else {
        let status = child.wait().expect("wait");
        (status.code(), text)
    }
}

#[test]
fn store_url_from_the_environment_and_newer_schemas_refused() {
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let url = pg.create_database("envurl").unwrap();
    // The config names a SQLite file; the environment variable wins.
    let fx = Fixture::new();
    let (status, log) = serve_once(&fx.config_path, &url);
    assert_eq!(status, None, "serve should run: {log}");
    assert!(!log.contains(pg.password()), "password in the log: {log}");
    assert_eq!(
        pg.psql("envurl", "SELECT version FROM dualera_schema")
            .unwrap(),
        "3",
        "the schema was created and migrated in PostgreSQL"
    );
    assert!(!fx.store_path.exists(), "the SQLite file was not used");

    pg.psql("envurl", "UPDATE dualera_schema SET version = 99")
        .unwrap();
    let (status, log) = serve_once(&fx.config_path, &url);
    assert_eq!(status, Some(1), "{log}");
    assert!(
        log.contains("schema version 99 is newer than this build knows"),
        "{log}"
    );
    assert!(!log.contains(pg.password()), "password in the log: {log}");

    // A URL that is not PostgreSQL's is refused with a clear message.
    let (status, log) = serve_once(&fx.config_path, "mysql://x@127.0.0.1/db");
    assert_eq!(status, Some(1), "{log}");
    assert!(log.contains("postgres://"), "{log}");

    // Wrong password: a clear failure, and the URL (with its secret) is not repeated.
    let wrong = url.replace(pg.password(), "wrong-password");
    let (status, log) = serve_once(&fx.config_path, &wrong);
    assert_eq!(status, Some(1), "{log}");
    assert!(!log.contains("wrong-password"), "{log}");
}

#[test]
fn tls_to_the_database_is_verified() {
    use dualera::config::StoreSection;
    use dualera::server::store::{NoteStore, PostgresStore};
    let pg = PgCluster::start_tls().expect("a throw-away PostgreSQL cluster with TLS");
    let url = pg.create_database("tls").unwrap();
    let ca = pg.ca_file().unwrap();
    let with_ca = |ca_file: Option<std::path::PathBuf>| StoreSection {
        ca_file,
        max_connections: Some(2),
        ..StoreSection::default()
    };
    let require = format!("{url}?sslmode=require");

    // Verified against the cluster's CA: works, and the connections are TLS.
    let store = PostgresStore::open(&require, &with_ca(Some(ca.clone()))).expect("TLS with the CA");
    store.create("file:///tls", "over tls", "x").unwrap();
    let tls_conns: u64 = pg
        .psql("tls", "SELECT count(*) FROM pg_stat_ssl WHERE ssl")
        .unwrap()
        .parse()
        .unwrap();
    assert!(tls_conns >= 1, "no TLS connection to the database");
    drop(store);

    // Another CA, or the system roots: refused, never silently accepted.
    let stranger = pg.write_ca("stranger", "not-the-issuer").unwrap();
    for section in [with_ca(Some(stranger)), with_ca(None)] {
        let err = PostgresStore::open(&require, &section).expect_err("an unverified server");
        assert!(!err.to_string().contains(pg.password()), "{err}");
    }
    // The right CA but another name than the certificate's (IP:127.0.0.1).
    let by_name = require.replace("127.0.0.1", "localhost");
    assert!(PostgresStore::open(&by_name, &with_ca(Some(ca.clone()))).is_err());
    // sslmode=prefer (the default) also verifies when the server offers TLS.
    assert!(PostgresStore::open(&url, &with_ca(None)).is_err());
    assert!(PostgresStore::open(&url, &with_ca(Some(ca))).is_ok());
    // sslmode=disable: plaintext, by choice.
    assert!(PostgresStore::open(&format!("{url}?sslmode=disable"), &with_ca(None)).is_ok());
}

#[test]
fn a_database_outage_is_an_internal_error_and_the_pool_recovers() {
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let fx = pg_fixture(&pg, "outage");
    let srv = fx.spawn(Kind::Http);
    srv.create_note("before the outage", "x");
    pg.stop().expect("stop PostgreSQL");
    let r = srv.call(
        "notes_list",
        json!({"workspaceUri": fx.notes_uri}),
        json!({}),
    );
    assert_eq!(r.code(), -32603, "{}", r.msg());
    assert_eq!(r.status, Some(500));
    assert!(!r.raw.windows(8).any(|w| w == b"postgres"), "{}", r.msg());
    assert!(srv.alive(), "the server survives the outage");
    pg.start_again().expect("start PostgreSQL again");
    // The pool replaces its dead connections: requests succeed again.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let r = srv.call(
            "notes_list",
            json!({"workspaceUri": fx.notes_uri}),
            json!({}),
        );
        if r.msg().get("result").is_some() {
            assert_eq!(r.result()["structuredContent"]["total"], 1);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no recovery: {}",
            r.msg()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let log = srv.stderr_text();
    assert!(log.contains("store error"), "the cause is logged: {log}");
    assert!(!log.contains(pg.password()), "password in the log: {log}");
}

/// The tasks extension across instances: `summarize_repo` started as a task on one
/// instance is polled, answered and finished through the other; each answer starts
/// the next round on the instance that received it; a cancel through one instance is
/// seen on the other; the database holds the end states.
#[test]
fn a_task_created_on_one_instance_is_polled_and_answered_on_the_other() {
    use common::tasks::*;
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let fx = pg_fixture(&pg, "tasks");
    let servers = fx.spawn_n(Kind::Http, 2);
    let (a, b) = (&servers[0], &servers[1]);
    let id = start_summary(a);
    let t = wait_status(b, &id, "input_required");
    assert!(t["inputRequests"]["pick_files"].is_object(), "{t}");
    task_call(
        b,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"pick_files": model_reply(r#"["README.md"]"#)}}),
    );
    let t = wait_status(a, &id, "input_required");
    assert!(t["inputRequests"]["summary"].is_object(), "{t}");
    task_call(
        a,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"summary": model_reply("Ledger, briefly.")}}),
    );
    let t = wait_status(b, &id, "completed");
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(
        t["result"]["structuredContent"]["summary"],
        "Ledger, briefly."
    );
    assert_eq!(get(a, &id), {
        let mut on_b = get(b, &id);
        on_b["_meta"] = get(a, &id)["_meta"].clone();
        on_b
    });

    let cancelled = start_summary(b);
    wait_status(a, &cancelled, "input_required");
    task_call(a, "tasks/cancel", json!({"taskId": cancelled}));
    assert_eq!(get(b, &cancelled)["status"], "cancelled");
    let stored = pg
        .psql(
            "tasks",
            &format!(
                "SELECT string_agg(body::json->>'status', ',' ORDER BY body::json->>'status') \
                 FROM tasks WHERE id IN ('{id}', '{cancelled}')"
            ),
        )
        .unwrap();
    assert_eq!(stored, "cancelled,completed");
}
