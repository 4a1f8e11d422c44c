//! The notes tools at scale, over HTTP and stdio against the spawned binary: 20,000 notes
//! paged through `notes_list` while another process adds notes, and `notes_delete`
//! among 2,000 notes of one title (the true count, the subset rule, `noteId`).
//!
//! The bulk notes are written straight into the fixture's SQLite file in one
//! transaction (through the server's own store for the schema), so the seeding takes a
//! moment rather than 20,000 requests; everything asserted goes through the tools.

mod common;

use common::*;
use dualera::server::store::{NoteStore, SqliteStore};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Writes `n` notes into `workspace` of the fixture's store; returns their public ids
/// in creation order.
fn seed_direct(
    fx: &Fixture,
    workspace: &str,
    n: usize,
    title: impl Fn(usize) -> String,
) -> Vec<String> {
    // Creates (or migrates) the schema exactly as the server would.
    drop(SqliteStore::open(&fx.store_path.to_string_lossy()).expect("open the store"));
    let mut conn = rusqlite::Connection::open(&fx.store_path).expect("open the SQLite file");
    let tx = conn.transaction().expect("begin");
    let mut ids = Vec::with_capacity(n);
    {
        let mut stmt = tx
            .prepare("INSERT INTO notes (workspace, title, body) VALUES (?1, ?2, ?3)")
            .expect("prepare");
        for i in 0..n {
            stmt.execute(rusqlite::params![
                workspace,
                title(i),
                format!("seeded body {i}")
            ])
            .expect("insert");
            ids.push(format!("note-{}", tx.last_insert_rowid()));
        }
    }
    tx.commit().expect("commit");
    ids
}

fn list(srv: &Server, args: Value) -> Reply {
    srv.call("notes_list", args, json!({}))
}

fn ids_of(res: &Value) -> Vec<String> {
    res["structuredContent"]["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("no notes in {res}"))
        .iter()
        .map(|n| n["id"].as_str().expect("id").to_owned())
        .collect()
}

fn text_of(res: &Value) -> String {
    res["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

// ---------------------------------------------------------------------------------
// notes_list: 20,000 notes, pages, a writer alongside.
// ---------------------------------------------------------------------------------

fn paging_20000_notes_while_another_process_adds(kind: Kind) {
    const SEEDED: usize = 20_000;
    const MAX_ADDED: usize = 3_000;
    let fx = Fixture::new();
    let seeded = seed_direct(&fx, &fx.notes_uri, SEEDED, |i| format!("Seeded {i}"));
    let seeded_set: BTreeSet<String> = seeded.iter().cloned().collect();
    let pager = fx.spawn(kind);
    let writer = fx.spawn(kind);
    let added_count = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);

    let (seen, added, first_cursor, totals) = std::thread::scope(|scope| {
        let writing = scope.spawn(|| {
            let mut added = BTreeSet::new();
            while !stop.load(Ordering::SeqCst) && added.len() < MAX_ADDED {
                added.insert(writer.create_note("Added meanwhile", "by the writer"));
                added_count.fetch_add(1, Ordering::SeqCst);
            }
            added
        });
        // Pages interleave with the writer: before each page, at least one more note
        // has been added since the previous one.
        let wait_for_more = |than: usize| {
            let deadline = Instant::now() + WAIT;
            while added_count.load(Ordering::SeqCst) <= than {
                assert!(
                    Instant::now() < deadline,
                    "the writer added nothing for {WAIT:?}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            added_count.load(Ordering::SeqCst)
        };
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        let mut first_cursor = None;
        let mut totals = Vec::new();
        let mut mark = wait_for_more(0);
        for page_no in 0.. {
            assert!(page_no < 200, "paging does not end");
            let mut args = json!({"workspaceUri": fx.notes_uri});
            if let Some(c) = &cursor {
                args["cursor"] = json!(c);
            }
            let r = list(&pager, args);
            let res = r.result();
            assert_eq!(res["resultType"], "complete", "{res}");
            let total = res["structuredContent"]["total"].as_u64().expect("total");
            let page = ids_of(res);
            assert!(
                total >= SEEDED as u64 && total <= (SEEDED + MAX_ADDED) as u64,
                "total {total}"
            );
            totals.push(total);
            seen.extend(page.iter().cloned());
            match res["structuredContent"].get("nextCursor") {
                Some(Value::String(c)) => {
                    assert_eq!(
                        page.len(),
                        500,
                        "a page with more after it is full (max_list)"
                    );
                    assert!(
                        text_of(res).starts_with(&format!("showing 500 of {total} notes")),
                        "{}",
                        text_of(res)
                    );
                    first_cursor.get_or_insert_with(|| c.clone());
                    cursor = Some(c.clone());
                }
                None => {
                    assert!(
                        text_of(res).contains(&format!("of {total} notes")),
                        "{}",
                        text_of(res)
                    );
                    break;
                }
                Some(other) => panic!("nextCursor is {other}"),
            }
            mark = wait_for_more(mark);
        }
        stop.store(true, Ordering::SeqCst);
        (
            seen,
            writing.join().expect("writer"),
            first_cursor.expect("paged"),
            totals,
        )
    });

    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a note was visited twice");
    let missing: Vec<&String> = seeded_set.difference(&unique).take(5).collect();
    assert!(missing.is_empty(), "notes never visited: {missing:?}");
    assert!(
        unique
            .iter()
            .all(|id| seeded_set.contains(id) || added.contains(id)),
        "a visited id is neither seeded nor added"
    );
    assert!(
        !added.is_empty() && totals.windows(2).any(|w| w[1] > w[0]),
        "{totals:?}"
    );

    // With the writer stopped, total is exact and a full paging (largest limit) sees it all.
    let expected_total = (SEEDED + added.len()) as u64;
    let res = list(&pager, json!({"workspaceUri": fx.notes_uri, "limit": 500}))
        .result()
        .clone();
    assert_eq!(res["structuredContent"]["total"], json!(expected_total));
    let mut all = ids_of(&res).len();
    let mut next = res["structuredContent"]["nextCursor"]
        .as_str()
        .map(str::to_owned);
    while let Some(c) = next {
        let r = list(
            &pager,
            json!({"workspaceUri": fx.notes_uri, "limit": 500, "cursor": c}),
        );
        let res = r.result();
        assert_eq!(res["structuredContent"]["total"], json!(expected_total));
        all += ids_of(res).len();
        next = res["structuredContent"]["nextCursor"]
            .as_str()
            .map(str::to_owned);
    }
    assert_eq!(all as u64, expected_total);

    // A cursor continues only the listing it came from.
    for args in [
        json!({"workspaceUri": fx.notes_uri, "query": "Seeded", "cursor": first_cursor}),
        json!({"workspaceUri": fx.notes2_uri, "cursor": first_cursor}),
        json!({"workspaceUri": fx.notes_uri, "cursor": tamper(&first_cursor)}),
        json!({"workspaceUri": fx.notes_uri, "cursor": ""}),
        json!({"workspaceUri": fx.notes_uri, "cursor": 7}),
    ] {
        let r = list(&pager, args.clone());
        r.expect_error(-32602);
        assert!(r.message().contains("cursor"), "{args}: {}", r.msg());
    }
    // The same cursor, with its own listing, still works.
    let r = list(
        &pager,
        json!({"workspaceUri": fx.notes_uri, "cursor": first_cursor}),
    );
    assert_eq!(ids_of(r.result()).len(), 500);
}

fn limit_and_query_pages(kind: Kind) {
    let fx = Fixture::new();
    let srv = fx.spawn(kind);
    for i in 0..7 {
        srv.create_note(&format!("Needle {i}"), "x");
        srv.create_note("Hay", &format!("plain {i}"));
    }
    let r = list(
        &srv,
        json!({"workspaceUri": fx.notes_uri, "query": "needle", "limit": 3}),
    );
    let res = r.result();
    assert_eq!(res["structuredContent"]["total"], 7);
    assert_eq!(ids_of(res).len(), 3);
    assert!(
        text_of(res).starts_with("showing 3 of 7 notes"),
        "{}",
        text_of(res)
    );
    let c = res["structuredContent"]["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = list(
        &srv,
        json!({"workspaceUri": fx.notes_uri, "query": "needle", "limit": 4, "cursor": c}),
    );
    let res = r.result();
    assert_eq!(ids_of(res).len(), 4);
    assert!(
        res["structuredContent"].get("nextCursor").is_none(),
        "{res}"
    );
    assert!(
        text_of(res).contains("showing 4 of 7 notes (the last page)"),
        "{}",
        text_of(res)
    );
    // The whole listing on one page says so, with no cursor.
    let r = list(&srv, json!({"workspaceUri": fx.notes_uri}));
    let res = r.result();
    assert_eq!(res["structuredContent"]["total"], 14);
    assert!(res["structuredContent"].get("nextCursor").is_none());
    assert!(text_of(res).starts_with("14 notes"), "{}", text_of(res));
    for bad in [json!(0), json!(501), json!(-1), json!(2.5), json!("10")] {
        list(&srv, json!({"workspaceUri": fx.notes_uri, "limit": bad})).expect_error(-32602);
    }
    // The schema says what the tool does.
    let tools = srv.send(&tools_list(json!(1)));
    let t = tools.result()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "notes_list")
        .unwrap()
        .clone();
    assert_eq!(
        t["inputSchema"]["properties"]["limit"]["maximum"], 500,
        "{t}"
    );
    assert!(t["inputSchema"]["properties"]["cursor"].is_object(), "{t}");
    assert!(
        t["description"].as_str().unwrap().contains("nextCursor"),
        "{t}"
    );
}

// ---------------------------------------------------------------------------------
// notes_delete among 2,000 notes of one title.
// ---------------------------------------------------------------------------------

fn delete_among_2000_same_title_notes(kind: Kind) {
    let fx = Fixture::new();
    let same = seed_direct(&fx, &fx.notes_uri, 2_000, |_| "same".to_owned());
    let others = seed_direct(&fx, &fx.notes_uri, 3, |i| format!("other {i}"));
    let elsewhere = seed_direct(&fx, &fx.notes2_uri, 2, |_| "same".to_owned());
    let srv = fx.spawn(kind);
    let store = SqliteStore::open(&fx.store_path.to_string_lossy()).unwrap();
    let count_same = || store.by_title(&fx.notes_uri, "same", 0).unwrap().total;

    // The form names the true count and the subset rule; it offers the 25 newest.
    let r = srv.delete_round1(json!(1), "same");
    let params = &r.result()["inputRequests"]["delete_choice"]["params"];
    let message = params["message"].as_str().unwrap();
    assert!(message.contains("2000 notes titled \"same\""), "{message}");
    assert!(
        message.contains("the 25 most recently created"),
        "{message}"
    );
    assert!(message.contains("noteId"), "{message}");
    let offered: Vec<String> = params["requestedSchema"]["properties"]["note_id"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    // The 25 newest, listed in creation order.
    let newest: Vec<String> = same[same.len() - 25..].to_vec();
    assert_eq!(offered, newest);

    // noteId of the oldest note (far outside the first page) targets it alone.
    let target = same[0].clone();
    let args = json!({"workspaceUri": fx.notes_uri, "title": "same", "noteId": target});
    let r = srv.send(&call(json!(2), "notes_delete", args.clone(), form()));
    let res = r.result();
    assert_eq!(res["resultType"], "input_required", "{res}");
    let params = &res["inputRequests"]["delete_choice"]["params"];
    assert_eq!(
        params["requestedSchema"]["properties"]["note_id"]["enum"],
        json!([target])
    );
    let message = params["message"].as_str().unwrap();
    assert!(
        message.contains("2000 notes titled \"same\"") && message.contains(&target),
        "{message}"
    );
    let state = r.state();
    // The state is bound to the noteId it was issued for.
    let other_args = json!({"workspaceUri": fx.notes_uri, "title": "same", "noteId": same[1]});
    for wrong in [other_args, srv.delete_args("same")] {
        let r = srv.send(&retry(
            json!(3),
            "notes_delete",
            wrong,
            form(),
            json!({"delete_choice": accept(&target, true)}),
            &state,
        ));
        r.expect_error(-32602);
    }
    assert_eq!(count_same(), 2000, "nothing deleted by refused retries");
    let r = srv.send(&retry(
        json!(4),
        "notes_delete",
        args,
        form(),
        json!({"delete_choice": accept(&target, true)}),
        &state,
    ));
    let res = r.result();
    assert_eq!(res["resultType"], "complete", "{res}");
    assert_eq!(res["structuredContent"]["deleted"], json!(target));
    assert_eq!(count_same(), 1999);
    let target_id: i64 = target.strip_prefix("note-").unwrap().parse().unwrap();
    assert_eq!(store.get(target_id).unwrap(), None, "{target} is gone");
    for id in same.iter().skip(1).chain(&others).chain(&elsewhere) {
        let n = id.strip_prefix("note-").unwrap().parse().unwrap();
        assert!(store.get(n).unwrap().is_some(), "{id} must be intact");
    }

    // A noteId that does not carry that title (or is unknown, elsewhere, gone) is -32602.
    for bad in [
        others[0].as_str(),
        elsewhere[0].as_str(),
        target.as_str(),
        "note-99999999",
        "17",
    ] {
        let args = json!({"workspaceUri": fx.notes_uri, "title": "same", "noteId": bad});
        let r = srv.send(&call(json!(5), "notes_delete", args, form()));
        r.expect_error(-32602);
        assert!(r.message().contains("noteid"), "{bad}: {}", r.msg());
    }
    assert_eq!(count_same(), 1999);
}

fn candidate_bound_is_configurable(kind: Kind) {
    let fx = Fixture::with(Options {
        max_delete_candidates: Some(4),
        ..Options::default()
    });
    let same = seed_direct(&fx, &fx.notes_uri, 9, |_| "same".to_owned());
    let srv = fx.spawn(kind);
    let r = srv.delete_round1(json!(1), "same");
    let params = &r.result()["inputRequests"]["delete_choice"]["params"];
    let message = params["message"].as_str().unwrap();
    assert!(message.contains("9 notes titled \"same\""), "{message}");
    assert!(message.contains("the 4 most recently created"), "{message}");
    assert_eq!(
        params["requestedSchema"]["properties"]["note_id"]["enum"],
        json!(same[same.len() - 4..])
    );
    // Few enough: all of them, said so.
    seed_direct(&fx, &fx.notes_uri, 2, |_| "pair".to_owned());
    let r = srv.delete_round1(json!(2), "pair");
    let message = r.result()["inputRequests"]["delete_choice"]["params"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("2 notes titled \"pair\"") && message.contains("all 2"),
        "{message}"
    );
    let tools = srv.send(&tools_list(json!(3)));
    let d = tools.result()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "notes_delete")
        .unwrap()
        .clone();
    assert!(d["inputSchema"]["properties"]["noteId"].is_object(), "{d}");
    assert!(
        d["description"]
            .as_str()
            .unwrap()
            .contains("the 4 most recently created"),
        "{d}"
    );
}

both_transports!(
    paging_20000_notes_while_another_process_adds,
    limit_and_query_pages,
    delete_among_2000_same_title_notes,
    candidate_bound_is_configurable,
);
