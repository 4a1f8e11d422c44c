//! The store contract (`dualera::server::store`), one suite run against both engines:
//! SQLite (a file in a temp dir) and PostgreSQL (a throw-away cluster started by the
//! test). Every case goes through the public traits only, with two handles on one
//! store where concurrency matters (two processes' worth of connections); only the
//! schema-version case reaches into the database, through a closure per engine.

mod common;

use common::pg_cluster::PgCluster;
use dualera::config::StoreSection;
use dualera::server::store::{
    DeleteOutcome, ListQuery, LiveCheck, NonceClaim, Note, PostgresStore, SqliteStore, Store,
    StoreError, NONCE_GRACE_MS,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

const A: &str = "file:///contract/a";
const B: &str = "file:///contract/b";
const C: &str = "file:///contract/c";

/// How the suite reaches one engine.
struct Engine<'a> {
    /// Opens another handle on the same store (runs migrations again: must be a no-op).
    open: &'a (dyn Fn() -> Result<Box<dyn Store>, StoreError> + Sync),
    /// Marks the schema as written by a newer build (version 99).
    bump_schema: &'a dyn Fn(),
}

fn run_suite(engine: &Engine<'_>) {
    let s1 = (engine.open)().expect("open the store");
    let s2 = (engine.open)().expect("open a second handle");
    notes_and_lookups(&*s1, &*s2);
    paging(&*s1);
    paging_under_concurrent_inserts(&*s1, &*s2);
    titles(&*s1);
    delete_claimed_outcomes(&*s1, &*s2);
    concurrent_claims_of_one_nonce(&*s1, &*s2);
    concurrent_deletes_of_one_note(&*s1, &*s2);
    expired_nonces_are_purged(&*s1);
    concurrent_opens_migrate_once(engine);
    drop((s1, s2));
    (engine.bump_schema)();
    match (engine.open)() {
        Err(StoreError::SchemaTooNew { found: 99, known }) => assert!(known >= 2),
        other => panic!("a schema newer than known must be refused, got {other:?}"),
    }
}

fn claim(nonce: &str, expires_ms: u64, now_ms: u64) -> NonceClaim {
    NonceClaim {
        nonce: nonce.to_owned(),
        expires_ms,
        now_ms,
    }
}

fn check(n: &Note) -> LiveCheck {
    LiveCheck {
        id: n.id,
        workspace: n.workspace.clone(),
        title: n.title.clone(),
    }
}

fn ws(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn notes_and_lookups(s1: &dyn Store, s2: &dyn Store) {
    let n = s1.create(A, "Hello", "first body").unwrap();
    assert!(n.id > 0);
    assert_eq!(
        s2.get(n.id).unwrap(),
        Some(n.clone()),
        "visible on another handle"
    );
    assert_eq!(s1.get(i64::MAX).unwrap(), None);
    let m = s2.create(A, "Hello", "second").unwrap();
    assert!(m.id > n.id, "ids grow");
    s1.create(B, "Elsewhere", "x").unwrap();
    assert_eq!(s1.count(A).unwrap(), 2);
    assert_eq!(s1.count(B).unwrap(), 1);
    assert_eq!(s1.count("file:///nowhere").unwrap(), 0);
    // Reset for the cases below: each uses its own workspaces from here on.
    for note in [n, m] {
        let c = claim(&format!("reset-{}", note.id), 10_000_000, 0);
        assert!(matches!(
            s1.delete_claimed(&c, &check(&note)).unwrap(),
            DeleteOutcome::Deleted(_)
        ));
    }
    assert_eq!(s1.count(A).unwrap(), 0);
}

fn paging(s: &dyn Store) {
    let p = "file:///contract/paging";
    let q = "file:///contract/paging-other";
    let mut ids = Vec::new();
    for i in 0..120 {
        let (w, title) = if i % 3 == 0 {
            (q, "Gamma")
        } else {
            (p, "Alpha")
        };
        let body = if i % 5 == 0 {
            "mentions NEEDLE here"
        } else {
            "plain"
        };
        ids.push((w, s.create(w, title, body).unwrap()));
    }
    s.create(C, "Alpha", "NEEDLE in another workspace").unwrap();
    let both = ws(&[p, q]);
    let only_p = ws(&[p]);
    for (workspaces, text, limit) in [
        (&both, None, 7usize),
        (&only_p, None, 80),
        (&both, Some("needle"), 5),
        (&both, Some("alp"), 1000),
        (&only_p, Some("GAMMA"), 3),
    ] {
        let expected: Vec<i64> = ids
            .iter()
            .filter(|(w, n)| {
                workspaces.iter().any(|x| x == w)
                    && text.is_none_or(|t| {
                        let t = t.to_lowercase();
                        n.title.to_lowercase().contains(&t) || n.body.to_lowercase().contains(&t)
                    })
            })
            .map(|(_, n)| n.id)
            .collect();
        let mut seen = Vec::new();
        let mut after = None;
        let mut pages = 0;
        loop {
            let page = s
                .list(&ListQuery {
                    workspaces,
                    text,
                    after,
                    limit,
                })
                .unwrap();
            pages += 1;
            assert!(pages <= 200, "paging does not end");
            assert_eq!(page.total, expected.len() as u64, "total of {text:?}");
            assert!(page.notes.len() <= limit);
            assert!(
                page.notes.windows(2).all(|w| w[0].id < w[1].id),
                "ascending ids"
            );
            seen.extend(page.notes.iter().map(|n| n.id));
            if !page.more {
                break;
            }
            assert_eq!(page.notes.len(), limit, "a page with more after it is full");
            after = page.notes.last().map(|n| n.id);
        }
        assert_eq!(
            seen, expected,
            "{text:?} over {workspaces:?}, limit {limit}"
        );
    }
    let none = s
        .list(&ListQuery {
            workspaces: &[],
            text: None,
            after: None,
            limit: 10,
        })
        .unwrap();
    assert_eq!((none.notes.len(), none.total, none.more), (0, 0, false));
    let tail = s
        .list(&ListQuery {
            workspaces: &both,
            text: None,
            after: Some(i64::MAX - 1),
            limit: 10,
        })
        .unwrap();
    assert!(tail.notes.is_empty() && !tail.more && tail.total == 120);
}

fn paging_under_concurrent_inserts(s1: &dyn Store, s2: &dyn Store) {
    let w = "file:///contract/growing";
    let before: BTreeSet<i64> = (0..300)
        .map(|i| s1.create(w, "Seed", &format!("{i}")).unwrap().id)
        .collect();
    let done = AtomicBool::new(false);
    let workspaces = ws(&[w]);
    let (seen, added) = std::thread::scope(|scope| {
        let inserter = scope.spawn(|| {
            let mut added = BTreeSet::new();
            while !done.load(Ordering::SeqCst) && added.len() < 2000 {
                added.insert(s2.create(w, "Added", "meanwhile").unwrap().id);
            }
            added
        });
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..10_000 {
            let page = s1
                .list(&ListQuery {
                    workspaces: &workspaces,
                    text: None,
                    after,
                    limit: 7,
                })
                .unwrap();
            assert!(page.total >= before.len() as u64);
            seen.extend(page.notes.iter().map(|n| n.id));
            if !page.more {
                break;
            }
            after = page.notes.last().map(|n| n.id);
        }
        done.store(true, Ordering::SeqCst);
        (seen, inserter.join().unwrap())
    });
    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no note is seen twice");
    assert!(
        before.is_subset(&unique),
        "every note present at the start is seen"
    );
    assert!(
        unique
            .iter()
            .all(|id| before.contains(id) || added.contains(id)),
        "nothing but real notes is seen"
    );
    let after_all = s1
        .list(&ListQuery {
            workspaces: &workspaces,
            text: None,
            after: None,
            limit: 1,
        })
        .unwrap();
    assert_eq!(after_all.total, (before.len() + added.len()) as u64);
}

fn titles(s: &dyn Store) {
    let w = "file:///contract/titles";
    let ids: Vec<i64> = (0..40)
        .map(|i| s.create(w, "Same", &format!("{i}")).unwrap().id)
        .collect();
    s.create(w, "Different", "x").unwrap();
    s.create(C, "Same", "another workspace").unwrap();
    let m = s.by_title(w, "Same", 25).unwrap();
    assert_eq!(m.total, 40);
    let newest: Vec<i64> = m.newest.iter().map(|n| n.id).collect();
    let expected: Vec<i64> = ids.iter().rev().take(25).copied().collect();
    assert_eq!(
        newest, expected,
        "the 25 most recently created, newest first"
    );
    let count_only = s.by_title(w, "Same", 0).unwrap();
    assert_eq!((count_only.total, count_only.newest.len()), (40, 0));
    assert_eq!(
        s.by_title(w, "same", 25).unwrap().total,
        0,
        "titles match exactly"
    );
}

fn delete_claimed_outcomes(s1: &dyn Store, s2: &dyn Store) {
    let w = "file:///contract/delete";
    let n = s1.create(w, "TPS report", "x").unwrap();
    let c = claim("outcomes-1", 10_000_000, 1);
    assert_eq!(
        s1.delete_claimed(&c, &check(&n)).unwrap(),
        DeleteOutcome::Deleted(n.clone())
    );
    assert_eq!(
        s2.delete_claimed(&c, &check(&n)).unwrap(),
        DeleteOutcome::Replayed
    );
    assert!(!s2.claim(&c).unwrap(), "a used nonce cannot be claimed");

    let n2 = s1.create(w, "TPS report", "y").unwrap();
    let elsewhere = LiveCheck {
        workspace: "file:///contract/elsewhere".into(),
        ..check(&n2)
    };
    let retitled = LiveCheck {
        title: "Other".into(),
        ..check(&n2)
    };
    let c2 = claim("outcomes-2", 10_000_000, 1);
    assert_eq!(
        s1.delete_claimed(&c2, &elsewhere).unwrap(),
        DeleteOutcome::NotLive
    );
    assert_eq!(
        s1.delete_claimed(&c2, &retitled).unwrap(),
        DeleteOutcome::NotLive
    );
    assert_eq!(
        s1.delete_claimed(&c2, &check(&n)).unwrap(),
        DeleteOutcome::NotLive,
        "a deleted note is not live"
    );
    assert_eq!(s1.count(w).unwrap(), 1, "nothing deleted");
    assert!(s2.claim(&c2).unwrap(), "NotLive left the nonce unused");
    assert!(!s1.claim(&c2).unwrap());
    assert_eq!(
        s1.delete_claimed(&c2, &check(&n2)).unwrap(),
        DeleteOutcome::Replayed,
        "a claimed nonce deletes nothing"
    );
    assert_eq!(s1.count(w).unwrap(), 1);
}

fn concurrent_claims_of_one_nonce(s1: &dyn Store, s2: &dyn Store) {
    const THREADS: usize = 8;
    for round in 0..20 {
        let barrier = Barrier::new(THREADS);
        let c = claim(&format!("race-claim-{round}"), 10_000_000, 1);
        let wins: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (store, barrier, c) = (if i % 2 == 0 { s1 } else { s2 }, &barrier, &c);
                    scope.spawn(move || {
                        barrier.wait();
                        store.claim(c).unwrap()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum()
        });
        assert_eq!(
            wins, 1,
            "round {round}: exactly one claim of a nonce succeeds"
        );
    }
    // The same for the claim inside a delete: one note per round, one nonce.
    let w = "file:///contract/race";
    for round in 0..20 {
        let n = s1.create(w, "Race", "x").unwrap();
        let barrier = Barrier::new(THREADS);
        let c = claim(&format!("race-delete-{round}"), 10_000_000, 1);
        let outcomes: Vec<DeleteOutcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let store = if i % 2 == 0 { s1 } else { s2 };
                    let (barrier, c, n) = (&barrier, &c, &n);
                    scope.spawn(move || {
                        barrier.wait();
                        store.delete_claimed(c, &check(n)).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let deleted = outcomes
            .iter()
            .filter(|o| matches!(o, DeleteOutcome::Deleted(_)))
            .count();
        let replayed = outcomes
            .iter()
            .filter(|o| **o == DeleteOutcome::Replayed)
            .count();
        assert_eq!(
            (deleted, replayed),
            (1, THREADS - 1),
            "round {round}: {outcomes:?}"
        );
    }
    assert_eq!(s1.count(w).unwrap(), 0);
}

fn concurrent_deletes_of_one_note(s1: &dyn Store, s2: &dyn Store) {
    // Different confirmations (nonces) for one note: one deletes, the others find it
    // gone and leave their nonces unused.
    const THREADS: usize = 6;
    let w = "file:///contract/one-note";
    for round in 0..10 {
        let n = s1.create(w, "Contended", "x").unwrap();
        let barrier = Barrier::new(THREADS);
        let outcomes: Vec<(String, DeleteOutcome)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let store = if i % 2 == 0 { s1 } else { s2 };
                    let (barrier, n) = (&barrier, &n);
                    scope.spawn(move || {
                        let nonce = format!("contended-{round}-{i}");
                        barrier.wait();
                        let out = store
                            .delete_claimed(&claim(&nonce, 10_000_000, 1), &check(n))
                            .unwrap();
                        (nonce, out)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let deleted = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, DeleteOutcome::Deleted(_)))
            .count();
        assert_eq!(deleted, 1, "round {round}: {outcomes:?}");
        for (nonce, o) in &outcomes {
            if *o == DeleteOutcome::NotLive {
                assert!(
                    s1.claim(&claim(nonce, 10_000_000, 1)).unwrap(),
                    "{nonce} was used"
                );
            } else {
                assert!(matches!(o, DeleteOutcome::Deleted(_)), "{o:?}");
            }
        }
    }
}

fn expired_nonces_are_purged(s: &dyn Store) {
    let t0 = 5_000_000_000u64;
    assert!(s.claim(&claim("purge-old", t0, t0 - 10)).unwrap());
    // Expired, but within the grace: still remembered.
    assert!(!s
        .claim(&claim("purge-old", t0, t0 + NONCE_GRACE_MS - 1))
        .unwrap());
    // Another claim past the grace purges it; then it can be recorded again, which
    // is how we can tell it was forgotten.
    assert!(s
        .claim(&claim("purge-trigger", t0 * 2, t0 + NONCE_GRACE_MS + 1))
        .unwrap());
    assert!(
        s.claim(&claim("purge-old", t0 * 2, t0 + NONCE_GRACE_MS + 2))
            .unwrap(),
        "the expired nonce was purged"
    );
    // The delete path purges too.
    let w = "file:///contract/purge";
    assert!(s.claim(&claim("purge-old-2", t0, t0 - 10)).unwrap());
    let n = s.create(w, "P", "x").unwrap();
    assert!(matches!(
        s.delete_claimed(
            &claim("purge-by-delete", t0 * 2, t0 + NONCE_GRACE_MS + 1),
            &check(&n)
        )
        .unwrap(),
        DeleteOutcome::Deleted(_)
    ));
    assert!(s
        .claim(&claim("purge-old-2", t0 * 2, t0 + NONCE_GRACE_MS + 2))
        .unwrap());
}

fn concurrent_opens_migrate_once(engine: &Engine<'_>) {
    let opened: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| (engine.open)().is_ok()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(opened.iter().all(|ok| *ok), "concurrent opens: {opened:?}");
}

#[test]
fn sqlite() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("store-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("contract.db").to_string_lossy().into_owned();
    let open = || SqliteStore::open(&path).map(|s| Box::new(s) as Box<dyn Store>);
    let bump = || {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA user_version = 99").unwrap();
    };
    run_suite(&Engine {
        open: &open,
        bump_schema: &bump,
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn postgres() {
    let pg = PgCluster::start().expect("a throw-away PostgreSQL cluster");
    let url = pg.create_database("contract").unwrap();
    let section = StoreSection {
        max_connections: Some(8),
        ..StoreSection::default()
    };
    let open = || PostgresStore::open(&url, &section).map(|s| Box::new(s) as Box<dyn Store>);
    let bump = || {
        pg.psql("contract", "UPDATE dualera_schema SET version = 99")
            .unwrap();
    };
    run_suite(&Engine {
        open: &open,
        bump_schema: &bump,
    });
    // The schema is what the migrations say, and it is recorded once.
    assert_eq!(
        pg.psql("contract", "SELECT count(*) FROM dualera_schema")
            .unwrap(),
        "1"
    );
}
