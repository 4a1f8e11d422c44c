//! Unit tests of the cache core with an injected clock (the socket tests are in
//! `tests/gateway_cache.rs`).

use super::*;
use http::header::HeaderValue;
use serde_json::json;

fn cache(config: CacheConfig) -> (Arc<ResponseCache>, ManualClock) {
    let clock = ManualClock::default();
    (
        Arc::new(ResponseCache::with_clock(
            config,
            "/mcp",
            Arc::new(clock.clone()),
        )),
        clock,
    )
}

fn key(cache: &ResponseCache, method: Cacheable, params: Value) -> Arc<RequestKey> {
    RequestKey::from_params(cache.route(), method, "2026-07-28", Some(&params)).unwrap()
}

fn body(result: Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 41, "result": result})).unwrap())
}

fn tools(ttl: Value, scope: &str) -> Value {
    json!({"resultType": "complete", "tools": [{"name": "t1"}], "ttlMs": ttl, "cacheScope": scope})
}

async fn fetch(cache: &Arc<ResponseCache>, k: &Arc<RequestKey>, caller: Caller) -> Option<Fetch> {
    match cache.begin(k.clone(), caller, true).await {
        Begin::Hit(_) => None,
        Begin::Fetch(f) => Some(f),
    }
}

fn bearer(t: &'static str) -> Caller {
    Caller::from_authorization(Some(&HeaderValue::from_static(t)))
}

#[tokio::test]
async fn fresh_until_ttl_then_refetched() {
    let (c, clock) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k, Caller::anonymous())
        .await
        .expect("first is a miss");
    assert!(c.store(&f, body(tools(json!(1000), "public")), true));
    drop(f);
    clock.advance(Duration::from_millis(999));
    assert!(
        fetch(&c, &k, Caller::anonymous()).await.is_none(),
        "fresh at 999 ms"
    );
    clock.advance(Duration::from_millis(1));
    assert!(
        fetch(&c, &k, Caller::anonymous()).await.is_some(),
        "stale at 1000 ms: now < t + ttl"
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.stored), (1, 2, 1));
}

#[tokio::test]
async fn zero_absent_negative_ttl_and_interim_results_are_not_stored() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ResourcesRead, json!({"uri": "file:///a"}));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    for result in [
        tools(json!(0), "public"),
        tools(json!(-5), "public"),
        json!({"resultType": "complete", "contents": [], "cacheScope": "public"}),
        json!({"resultType": "input_required", "inputRequests": {}, "ttlMs": 1000}),
        json!({"contents": [], "ttlMs": 1000, "cacheScope": "public"}),
    ] {
        assert!(!c.store(&f, body(result.clone()), true), "{result}");
    }
    let error =
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#);
    assert!(!c.store(&f, error, true));
    assert_eq!(c.stats().entries, 0);
}

#[tokio::test]
async fn ttl_is_capped_by_max_ttl() {
    let (c, clock) = cache(CacheConfig {
        max_ttl: Duration::from_secs(2),
        ..CacheConfig::default()
    });
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    assert!(c.store(&f, body(tools(json!(3_600_000), "public")), true));
    drop(f);
    clock.advance(Duration::from_secs(2));
    assert!(fetch(&c, &k, Caller::anonymous()).await.is_some());
}

#[tokio::test]
async fn private_results_stay_in_their_context() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ResourcesRead, json!({"uri": "file:///mine"}));
    let alice = bearer("Bearer alice");
    let f = fetch(&c, &k, alice).await.unwrap();
    assert!(c.store(&f, body(tools(json!(60_000), "private")), true));
    drop(f);
    assert!(
        fetch(&c, &k, alice).await.is_none(),
        "alice is served her own"
    );
    assert!(
        fetch(&c, &k, bearer("Bearer bob")).await.is_some(),
        "bob is not"
    );
    assert!(
        fetch(&c, &k, Caller::anonymous()).await.is_some(),
        "nor is anyone anonymous"
    );
    // A missing cacheScope counts as private.
    let k2 = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k2, alice).await.unwrap();
    let unscoped = json!({"resultType": "complete", "tools": [], "ttlMs": 1000});
    assert!(c.store(&f, body(unscoped), true));
    drop(f);
    assert!(fetch(&c, &k2, bearer("Bearer bob")).await.is_some());
}

#[tokio::test]
async fn public_results_fetched_with_credentials_need_credentials() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k, bearer("Bearer alice")).await.unwrap();
    assert!(c.store(&f, body(tools(json!(60_000), "public")), true));
    drop(f);
    assert!(
        fetch(&c, &k, bearer("Bearer bob")).await.is_none(),
        "shared with other tokens"
    );
    assert!(
        fetch(&c, &k, Caller::anonymous()).await.is_some(),
        "not with no token"
    );
}

#[tokio::test]
async fn hits_splice_the_callers_id_into_the_upstream_bytes() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    let raw = Bytes::from_static(
        b"{\"id\":41 ,\"jsonrpc\":\"2.0\",\"result\":{\"resultType\":\"complete\",\"tools\":[{\"name\":\"caf\\u00e9\"}],\"ttlMs\":5000,\"cacheScope\":\"public\"}}",
    );
    assert!(c.store(&f, raw.clone(), true));
    drop(f);
    let Begin::Hit(e) = c.begin(k, Caller::anonymous(), true).await else {
        panic!("expected a hit");
    };
    let expected = String::from_utf8(raw.to_vec())
        .unwrap()
        .replace("41", "\"req-9\"");
    assert_eq!(e.with_id(b"\"req-9\""), Bytes::from(expected));
    assert_eq!(e.value()["tools"][0]["name"], "café");
}

#[tokio::test]
async fn legacy_stores_are_not_served_as_upstream_bytes() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let Begin::Fetch(f) = c.begin(k.clone(), Caller::anonymous(), false).await else {
        panic!()
    };
    assert!(c.store(&f, body(tools(json!(5000), "public")), false));
    drop(f);
    assert!(matches!(
        c.begin(k.clone(), Caller::anonymous(), false).await,
        Begin::Hit(_)
    ));
    assert!(matches!(
        c.begin(k, Caller::anonymous(), true).await,
        Begin::Fetch(_)
    ));
}

#[tokio::test]
async fn invalidation_drops_and_wins_over_a_response_in_flight() {
    let (c, _) = cache(CacheConfig::default());
    let tl = key(&c, Cacheable::ToolsList, json!({}));
    let pl = key(&c, Cacheable::PromptsList, json!({}));
    let ra = key(&c, Cacheable::ResourcesRead, json!({"uri": "file:///a"}));
    let rb = key(&c, Cacheable::ResourcesRead, json!({"uri": "file:///b"}));
    for k in [&tl, &pl, &ra, &rb] {
        let f = fetch(&c, k, Caller::anonymous()).await.unwrap();
        assert!(c.store(&f, body(tools(json!(60_000), "public")), true));
    }
    assert_eq!(
        c.invalidate(Invalidate::Methods(&[Cacheable::ToolsList])),
        1
    );
    assert!(fetch(&c, &tl, Caller::anonymous()).await.is_some());
    assert!(fetch(&c, &pl, Caller::anonymous()).await.is_none());
    assert_eq!(c.invalidate(Invalidate::Resource("file:///a")), 1);
    assert!(fetch(&c, &ra, Caller::anonymous()).await.is_some());
    assert!(fetch(&c, &rb, Caller::anonymous()).await.is_none());
    // A fetch that began before an invalidation is not stored.
    let f = fetch(&c, &tl, Caller::anonymous()).await.unwrap();
    c.invalidate(Invalidate::Methods(&[Cacheable::PromptsList]));
    assert!(!c.store(&f, body(tools(json!(60_000), "public")), true));
    assert_eq!(c.stats().invalidations, 3);
}

#[tokio::test]
async fn failed_tool_calls_drop_lists_that_show_the_tool() {
    let (c, clock) = cache(CacheConfig::default());
    let tl = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &tl, Caller::anonymous()).await.unwrap();
    assert!(c.store(&f, body(tools(json!(60_000), "public")), true));
    drop(f);
    assert!(c.lists_tool("t1") && !c.lists_tool("t2"));
    assert_eq!(
        c.tool_call_failed("t1", -32602),
        0,
        "too young to be dropped"
    );
    clock.advance(TOOL_ERROR_MIN_AGE);
    assert_eq!(c.tool_call_failed("t2", -32602), 0, "another tool");
    assert_eq!(c.tool_call_failed("t1", -32603), 0, "another error");
    assert_eq!(c.tool_call_failed("t1", -32601), 1);
    assert!(fetch(&c, &tl, Caller::anonymous()).await.is_some());
}

#[tokio::test]
async fn concurrent_misses_share_one_fetch() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let leader = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            let k = k.clone();
            tokio::spawn(async move {
                matches!(c.begin(k, Caller::anonymous(), true).await, Begin::Hit(_))
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(c.store(&leader, body(tools(json!(60_000), "public")), true));
    drop(leader);
    for w in waiters {
        assert!(w.await.unwrap(), "a waiter was served the leader's result");
    }
    let s = c.stats();
    assert_eq!(s.misses, 1);
    assert_eq!(s.coalesced + s.hits, 8);
    // A leader that stores nothing sends its waiters upstream, each on its own.
    let k2 = key(&c, Cacheable::PromptsList, json!({}));
    let leader = fetch(&c, &k2, Caller::anonymous()).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        matches!(
            c2.begin(k2, Caller::anonymous(), true).await,
            Begin::Fetch(_)
        )
    });
    tokio::task::yield_now().await;
    drop(leader);
    assert!(waiter.await.unwrap());
    // Different callers never share a flight.
    let k3 = key(&c, Cacheable::ResourcesList, json!({}));
    let _a = fetch(&c, &k3, bearer("Bearer a")).await.unwrap();
    assert!(fetch(&c, &k3, bearer("Bearer b")).await.is_some());
}

#[tokio::test]
async fn stale_entries_only_within_stale_if_error() {
    let (c, clock) = cache(CacheConfig {
        stale_if_error: Duration::from_secs(5),
        ..CacheConfig::default()
    });
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    assert!(c.store(&f, body(tools(json!(1000), "public")), true));
    drop(f);
    clock.advance(Duration::from_millis(3000));
    let f = fetch(&c, &k, Caller::anonymous())
        .await
        .expect("expired: a miss");
    assert!(
        f.stale.is_some(),
        "within 1 s + 5 s it may be served if the re-fetch fails"
    );
    drop(f);
    clock.advance(Duration::from_millis(3000));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    assert!(f.stale.is_none());
    let (off, clock) = cache(CacheConfig::default());
    let k = key(&off, Cacheable::ToolsList, json!({}));
    let f = fetch(&off, &k, Caller::anonymous()).await.unwrap();
    assert!(off.store(&f, body(tools(json!(1000), "public")), true));
    drop(f);
    clock.advance(Duration::from_millis(1001));
    assert!(
        fetch(&off, &k, Caller::anonymous())
            .await
            .unwrap()
            .stale
            .is_none(),
        "default 0: off"
    );
}

#[tokio::test]
async fn bounded_in_entries_and_bytes() {
    let (c, _) = cache(CacheConfig {
        max_entries: 64,
        max_bytes: 64 * 4096,
        ..CacheConfig::default()
    });
    for i in 0..1000 {
        let k = key(
            &c,
            Cacheable::ResourcesRead,
            json!({"uri": format!("file:///{i}")}),
        );
        let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
        c.store(&f, body(tools(json!(60_000), "public")), true);
    }
    let s = c.stats();
    assert!(s.entries <= 64, "{s:?}");
    assert!(s.weight <= 64 * 4096, "{s:?}");
    assert!(s.evictions >= 1000 - 64, "{s:?}");
    // One result larger than the cache can hold is not stored.
    let k = key(&c, Cacheable::ResourcesRead, json!({"uri": "file:///huge"}));
    let f = fetch(&c, &k, Caller::anonymous()).await.unwrap();
    let huge = json!({"resultType": "complete", "contents": "x".repeat(1 << 20), "ttlMs": 1000, "cacheScope": "public"});
    assert!(!c.store(&f, body(huge), true));
}

#[tokio::test]
async fn a_parsed_legacy_result_is_stored_as_it_would_be_framed() {
    let (c, _) = cache(CacheConfig::default());
    let k = key(&c, Cacheable::ToolsList, json!({}));
    let Begin::Fetch(f) = c.begin(k.clone(), Caller::anonymous(), false).await else {
        panic!()
    };
    let result = tools(json!(5000), "public");
    assert!(c.store_result(&f, &result));
    drop(f);
    let Begin::Hit(e) = c.begin(k, Caller::anonymous(), false).await else {
        panic!("a stored legacy result is a hit")
    };
    assert_eq!(*e.value(), result);
    let served: Value = serde_json::from_slice(&e.with_id(b"\"x-1\"")).unwrap();
    assert_eq!(
        served,
        json!({"jsonrpc": "2.0", "id": "x-1", "result": result})
    );
    // Interim results stay uncached on this path too.
    let k = key(&c, Cacheable::PromptsList, json!({}));
    let Begin::Fetch(f) = c.begin(k, Caller::anonymous(), false).await else {
        panic!()
    };
    assert!(!c.store_result(&f, &json!({"resultType": "input_required", "ttlMs": 5000})));
}
