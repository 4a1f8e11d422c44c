//! requestState integrity and single use, across processes; symlinks that leave the
//! repository. Each scenario runs over HTTP and stdio.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::Barrier;
use std::time::Duration;

// ---------------------------------------------------------------------------------
// Symlinks.
// ---------------------------------------------------------------------------------

fn repo_args(fx: &Fixture) -> Value {
    json!({"directory": fx.repo_dir.display().to_string(), "audience": "developer"})
}

fn assert_no_secret(fx: &Fixture, r: &Reply) {
    let text = String::from_utf8_lossy(&r.raw);
    assert!(!text.contains(&fx.secret_text), "the secret leaked: {text}");
    assert!(
        !text.contains("outside-secret"),
        "the outside dir leaked: {text}"
    );
}

#[cfg(unix)]
fn symlink_leaving_repository_is_never_read(kind: Kind) {
    let fx = Fixture::new();
    // A symlinked directory leaving the repository too.
    let outside = fx.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("inner.md"), "outside-secret contents").unwrap();
    std::os::unix::fs::symlink(&outside, fx.repo_dir.join("extdir")).unwrap();
    // A symlink that stays inside is fine.
    std::os::unix::fs::symlink(fx.repo_dir.join("README.md"), fx.repo_dir.join("alias.md"))
        .unwrap();
    let srv = fx.spawn(kind);
    let args = repo_args(&fx);
    let r1 = srv.send(&call(json!(1), "summarize_repo", args.clone(), sampling()));
    assert_no_secret(&fx, &r1);
    let prompt = r1.result()["inputRequests"]["pick_files"]["params"]["messages"][0]["content"]
        ["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(prompt.contains("README.md"), "{prompt}");
    assert!(prompt.contains("alias.md"), "{prompt}");
    assert!(
        !prompt.contains("leak.txt"),
        "the escaping symlink is listed: {prompt}"
    );
    assert!(
        !prompt.contains("extdir"),
        "the escaping directory is listed: {prompt}"
    );
    assert!(!prompt.contains("inner.md"), "{prompt}");
    let state = r1.state();
    for (i, pick) in [
        "[\"leak.txt\"]",
        "[\"README.md\", \"leak.txt\"]",
        "[\"extdir/inner.md\"]",
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.send(&retry(
            json!(2 + i),
            "summarize_repo",
            args.clone(),
            sampling(),
            json!({"pick_files": model_reply(pick)}),
            &state,
        ));
        r.expect_error(-32602);
        assert_no_secret(&fx, &r);
    }
    // The directory argument itself may not be a symlink out of the grant.
    let r = srv.send(&call(
        json!(9),
        "summarize_repo",
        json!({"directory": fx.repo_dir.join("extdir").display().to_string(), "audience": "x"}),
        sampling(),
    ));
    r.expect_error(-32602);
    assert_no_secret(&fx, &r);
    // A listed file swapped for an escaping symlink between rounds is not read.
    let r2 = srv.send(&retry(
        json!(10),
        "summarize_repo",
        args.clone(),
        sampling(),
        json!({"pick_files": model_reply("[\"src/lib.rs\"]")}),
        &state,
    ));
    assert_eq!(r2.result()["resultType"], "input_required");
    let lib = fx.repo_dir.join("src/lib.rs");
    std::fs::remove_file(&lib).unwrap();
    std::os::unix::fs::symlink(fx.dir.join("secret.txt"), &lib).unwrap();
    let r = srv.send(&retry(
        json!(11),
        "summarize_repo",
        args.clone(),
        sampling(),
        json!({"pick_files": model_reply("[\"src/lib.rs\"]")}),
        &state,
    ));
    r.expect_error(-32602);
    assert_no_secret(&fx, &r);
    let r = srv.send(&retry(
        json!(12),
        "summarize_repo",
        args,
        sampling(),
        json!({"summary": model_reply("fine")}),
        &r2.state(),
    ));
    r.expect_error(-32602);
    assert_no_secret(&fx, &r);
}

// ---------------------------------------------------------------------------------
// Two processes, one store, one key, one accepted state, fired at once.
// ---------------------------------------------------------------------------------

fn concurrent_processes_delete_once(kind: Kind) {
    let fx = Fixture::new();
    let a = fx.spawn(kind);
    let b = fx.spawn(kind);
    let seed = a.seed();
    let mut tps = seed.tps.clone();
    for i in 0..3 {
        tps.push(a.create_note("TPS report", &format!("extra TPS report {i}")));
    }
    let mut expected = 8;
    assert_eq!(b.note_count(), expected);
    for round in 0..4 {
        let state = a.delete_round1(json!(round * 10), "TPS report").state();
        let live = a.note_ids();
        let (pick_a, pick_b) = {
            let cands: Vec<&String> = tps.iter().filter(|t| live.contains(t)).collect();
            (cands[0].clone(), cands[1].clone())
        };
        let barrier = Barrier::new(2);
        let go = |srv: &Server, pick: &str| {
            barrier.wait();
            srv.delete_retry(
                json!(round * 10 + 1),
                "TPS report",
                accept(pick, true),
                &state,
            )
        };
        let (ra, rb) = std::thread::scope(|s| {
            let ha = s.spawn(|| go(&a, &pick_a));
            let hb = s.spawn(|| go(&b, &pick_b));
            (ha.join().unwrap(), hb.join().unwrap())
        });
        let outcomes: Vec<&Reply> = vec![&ra, &rb];
        let deleted: Vec<&Reply> = outcomes
            .iter()
            .copied()
            .filter(|r| r.msg().get("result").is_some())
            .collect();
        assert_eq!(
            deleted.len(),
            1,
            "exactly one process executes the state: {:?} / {:?}",
            ra.msg(),
            rb.msg()
        );
        let winner = deleted[0].result()["structuredContent"]["deleted"]
            .as_str()
            .expect("a deleted note")
            .to_owned();
        let loser = outcomes
            .iter()
            .find(|r| r.msg().get("error").is_some())
            .unwrap();
        let err = loser.expect_error(-32602);
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("already been used"),
            "{err}"
        );
        expected -= 1;
        let ids_a = a.note_ids();
        assert_eq!(ids_a.len(), expected);
        assert_eq!(b.note_count(), expected);
        assert!(!ids_a.contains(&winner));
        let other = if winner == pick_a { &pick_b } else { &pick_a };
        assert!(ids_a.contains(other), "the loser's pick must survive");
    }
}

// ---------------------------------------------------------------------------------
// Tampered, expired, other principal, other tool.
// ---------------------------------------------------------------------------------

fn tampered_state_is_32602(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    let mid = state.len() / 2;
    let variants = [
        tamper(&state),
        format!("{}{}", &state[..mid], &state[mid + 1..]),
        format!("{state}A"),
        state.replace('.', ""),
        state.split('.').next().unwrap().to_owned() + ".AAAA",
        "not-a-state".to_owned(),
        String::new(),
        "x".repeat(20_000),
    ];
    for (i, bad) in variants.iter().enumerate() {
        assert_ne!(bad, &state);
        let r = srv.delete_retry(json!(10 + i), "TPS report", accept(&seed.tps[0], true), bad);
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("requestState"),
            "{err}"
        );
        assert_eq!(srv.note_count(), 5);
    }
    // The genuine state was not consumed by the forgeries.
    let r = srv.delete_retry(json!(2), "TPS report", accept(&seed.tps[0], true), &state);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[0])
    );
}

fn expired_state_is_32602(kind: Kind) {
    let fx = Fixture::with(Options {
        ttl_ms: 300,
        ..Options::default()
    });
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let state = srv.delete_round1(json!(1), "TPS report").state();
    // The only timing-dependent wait in the suite: sleep well past the 300 ms TTL.
    std::thread::sleep(Duration::from_millis(1500));
    for (i, answer) in [
        accept(&seed.tps[0], true),
        json!({"action": "decline"}),
        json!({"action": "cancel"}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = srv.delete_retry(json!(2 + i), "TPS report", answer, &state);
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("expired"),
            "{err}"
        );
    }
    assert_eq!(srv.note_count(), 5);
}

fn state_replayed_under_another_principal_is_32602(kind: Kind) {
    let fx = Fixture::with(Options {
        principals: vec![
            ("alice".into(), "alice-secret-token".into()),
            ("bob".into(), "bob-secret-token".into()),
        ],
        ..Options::default()
    });
    let alice = fx.spawn_as(kind, "alice");
    let bob = fx.spawn_as(kind, "bob");
    let seed = alice.seed();
    assert_eq!(
        bob.note_count(),
        5,
        "bob may see and delete in this workspace"
    );
    let state = alice.delete_round1(json!(1), "TPS report").state();
    for (i, answer) in [
        accept(&seed.tps[0], true),
        json!({"action": "decline"}),
        json!({"action": "cancel"}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = bob.delete_retry(json!(2 + i), "TPS report", answer, &state);
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("principal"),
            "{err}"
        );
    }
    if kind == Kind::Http {
        // The same process, switching bearer tokens.
        alice.set_token(Some("bob-secret-token"));
        let r = alice.delete_retry(json!(9), "TPS report", accept(&seed.tps[0], true), &state);
        r.expect_error(-32602);
        alice.set_token(Some("alice-secret-token"));
    }
    assert_eq!(alice.note_count(), 5);
    // Alice's state is intact for alice.
    let r = alice.delete_retry(json!(10), "TPS report", accept(&seed.tps[0], true), &state);
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[0])
    );
}

fn state_replayed_on_another_tool_is_32602(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    let seed = srv.seed();
    let delete_state = srv.delete_round1(json!(1), "TPS report").state();
    let summarize_state = srv
        .send(&call(
            json!(2),
            "summarize_repo",
            repo_args(&fx),
            sampling(),
        ))
        .state();
    let all = json!({"elicitation": {}, "sampling": {}, "roots": {}});
    let answers = json!({
        "delete_choice": accept(&seed.tps[0], true),
        "pick_files": model_reply("[\"README.md\"]"),
        "summary": model_reply("s"),
        "roots": {"roots": [{"uri": fx.notes_uri}]},
    });
    let cases = [
        ("summarize_repo", repo_args(&fx), &delete_state),
        ("notes_list", json!({}), &delete_state),
        (
            "notes_list",
            json!({"workspaceUri": fx.notes_uri}),
            &delete_state,
        ),
        (
            "notes_create",
            json!({"workspaceUri": fx.notes_uri, "title": "TPS report", "body": "b"}),
            &delete_state,
        ),
        (
            "notes_delete",
            srv.delete_args("TPS report"),
            &summarize_state,
        ),
        ("notes_list", json!({}), &summarize_state),
    ];
    for (i, (tool, args, state)) in cases.into_iter().enumerate() {
        let r = srv.send(&retry(
            json!(10 + i),
            tool,
            args,
            all.clone(),
            answers.clone(),
            state,
        ));
        let err = r.expect_error(-32602);
        assert!(
            err["message"].as_str().unwrap().contains("requestState"),
            "{tool}: {err}"
        );
        assert_eq!(srv.note_count(), 5, "{tool}");
    }
    // The delete state still works for the request it was issued for.
    let r = srv.delete_retry(
        json!(30),
        "TPS report",
        accept(&seed.tps[2], true),
        &delete_state,
    );
    assert_eq!(
        r.result()["structuredContent"]["deleted"],
        json!(seed.tps[2])
    );
}

#[cfg(unix)]
both_transports!(symlink_leaving_repository_is_never_read);

both_transports!(
    concurrent_processes_delete_once,
    tampered_state_is_32602,
    expired_state_is_32602,
    state_replayed_under_another_principal_is_32602,
    state_replayed_on_another_tool_is_32602,
);
