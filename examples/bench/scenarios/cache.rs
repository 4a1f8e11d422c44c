//! Scenario `cache`: the response cache against the bare proxy and the server.

use crate::*;

pub(crate) const CACHE_VARIANTS: [&str; 3] = ["direct", "bare_proxy", "gateway+cache"];

/// The cache counters a gateway logs when it stops (`cache counters` at info level).
pub(crate) fn cache_counters(log: &Path) -> BTreeMap<String, u64> {
    let raw = std::fs::read_to_string(log).unwrap_or_default();
    // Without ANSI colour sequences (`ESC [ … m`).
    let mut text = String::with_capacity(raw.len());
    let mut in_escape = false;
    for ch in raw.chars() {
        match (in_escape, ch) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => text.push(c),
        }
    }
    let Some(line) = text.lines().rev().find(|l| l.contains("cache counters")) else {
        return BTreeMap::new();
    };
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.trim_matches(',').parse().ok()?)))
        .collect()
}

pub(crate) async fn cache(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let bare = env.bare_proxy(server)?;
    let spec = |method: &str, name: Option<&str>, params: Value| {
        Arc::new(Spec {
            headers: modern_headers(method, name),
            body: modern_body(1, method, params, json!({})),
        })
    };
    let list = spec("tools/list", None, json!({}));
    let call = spec(
        "tools/call",
        Some("notes_list"),
        json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}}),
    );
    let mut mixed = vec![call.clone(); 9];
    mixed.push(list.clone());
    let kinds: Vec<(&str, Arc<Vec<Arc<Spec>>>)> = vec![
        ("tools/list", Arc::new(vec![list])),
        (
            "server/discover",
            Arc::new(vec![spec("server/discover", None, json!({}))]),
        ),
        ("mixed", Arc::new(mixed)),
    ];
    let kinds: Vec<_> = match &opts.cache_requests {
        Some(wanted) => kinds
            .into_iter()
            .filter(|(n, _)| wanted.iter().any(|w| w == n))
            .collect(),
        None => kinds,
    };
    // One cached gateway per kind: its counters then belong to that kind alone.
    let mut gateways = Vec::new();
    for (kind, _) in &kinds {
        let tag = format!("cache-{}", kind.replace('/', "-"));
        let g = env.gateway_with(
            server,
            &tag,
            &env.gateway_config,
            "warn,dualera_gateway=info",
        )?;
        gateways.push((tag, g));
    }
    // Correctness first: the cached answers equal the direct ones.
    for (ki, (kind, specs)) in kinds.iter().enumerate() {
        for s in specs.iter().take(2) {
            let mut answers = Vec::new();
            for a in [
                server.addr,
                bare.addr,
                gateways[ki].1.addr,
                gateways[ki].1.addr,
            ] {
                let mut c = Conn::open(a).await?;
                let (st, msgs) = c.exchange(&s.headers, s.body.clone()).await?;
                answers.push(result_of(st, &msgs)?);
            }
            if answers.iter().any(|a| a != &answers[0]) {
                return Err(format!("{kind}: the variants answered differently").into());
            }
        }
    }
    eprintln!("bench: cache (load {})", load_avg());
    let mut samples: BTreeMap<(usize, usize, usize), Vec<Sample>> = BTreeMap::new();
    // Per (concurrency, kind): cache/direct, cache/bare, p50 vs direct, one per round.
    type CacheRatios = Vec<(f64, f64, f64)>;
    let mut ratios: BTreeMap<(usize, usize), CacheRatios> = BTreeMap::new();
    let mut served = vec![0usize; kinds.len()];
    // Per (concurrency, kind, variant): CPU seconds of [upstream, proxy, driver], requests.
    let mut cpu: BTreeMap<(usize, usize, usize), ([f64; 3], usize)> = BTreeMap::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, specs)) in kinds.iter().enumerate() {
            let addrs = [server.addr, bare.addr, gateways[ki].1.addr];
            for round in 0..opts.rounds {
                let mut this = [None; 3];
                for k in 0..3 {
                    let v = (round + k) % 3;
                    // CPU of the upstream, the proxy in the path (if any) and this driver.
                    let pids = [
                        server.pid(),
                        [0, bare.pid(), gateways[ki].1.pid()][v],
                        std::process::id(),
                    ];
                    let before = pids.map(cpu_of);
                    let s = load_mix(addrs[v], specs.clone(), conc, 0.2, opts.secs).await?;
                    let after = pids.map(cpu_of);
                    let e = cpu.entry((ci, ki, v)).or_insert(([0.0; 3], 0));
                    for p in 0..3 {
                        if pids[p] != 0 {
                            e.0[p] += after[p] - before[p];
                        }
                    }
                    e.1 += s.total;
                    if v == 2 {
                        served[ki] += s.total;
                    }
                    this[v] = Some(s);
                    samples.entry((ci, ki, v)).or_default().push(s);
                }
                let [Some(d), Some(b), Some(g)] = this else {
                    continue;
                };
                ratios.entry((ci, ki)).or_default().push((
                    g.rps / d.rps,
                    g.rps / b.rps,
                    g.p50_us - d.p50_us,
                ));
                eprintln!(
                    "  c={conc:<3} {kind:<16} round {}: direct {:>7.0}/s  bare {:>7.0}/s  gateway+cache {:>7.0}/s",
                    round + 1,
                    d.rps,
                    b.rps,
                    g.rps
                );
            }
        }
    }
    // Stop the cached gateways; each logs its counters on the way out.
    let mut counters = Vec::new();
    for (tag, g) in gateways {
        drop(g);
        counters.push(cache_counters(
            &env.results.join(format!("logs/gateway-{tag}.log")),
        ));
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 1b. Response cache ({} rounds × {} s per variant, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | conc | variant | req/s | p50 µs | p99 µs | errors | CPU µs/req: upstream | proxy | driver | all |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            for (v, name) in CACHE_VARIANTS.iter().enumerate() {
                let s = &samples[&(ci, ki, v)];
                let rps = median(&s.iter().map(|x| x.rps).collect::<Vec<_>>());
                let p50 = median(&s.iter().map(|x| x.p50_us).collect::<Vec<_>>());
                let p99 = median(&s.iter().map(|x| x.p99_us).collect::<Vec<_>>());
                let errors: usize = s.iter().map(|x| x.errors).sum();
                let (secs, n) = cpu.get(&(ci, ki, v)).copied().unwrap_or(([0.0; 3], 0));
                let per = secs.map(|c| c * 1e6 / n.max(1) as f64);
                let proxy = if v == 0 {
                    "–".to_owned()
                } else {
                    fmt_f(per[1], 1)
                };
                let _ = writeln!(
                    md,
                    "| {kind} | {conc} | {name} | {} | {} | {} | {errors} | {} | {proxy} | {} | {} |",
                    fmt_f(rps, 0),
                    fmt_f(p50, 1),
                    fmt_f(p99, 1),
                    fmt_f(per[0], 1),
                    fmt_f(per[2], 1),
                    fmt_f(per.iter().sum::<f64>(), 1),
                );
                json_rows.push(
                    json!({"request": kind, "concurrency": conc, "variant": name,
                    "rps_median": rps, "p50_us_median": p50, "p99_us_median": p99, "errors": errors,
                    "cpu_us_per_request": {"upstream": per[0], "proxy": per[1], "driver": per[2]}}),
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\n| request | conc | gateway+cache/direct req/s | gateway+cache/bare req/s | p50 vs direct µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    let mut json_ratios = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            let r = &ratios[&(ci, ki)];
            let gd = median(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let gb = median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let added = median(&r.iter().map(|x| x.2).collect::<Vec<_>>());
            let _ = writeln!(
                md,
                "| {kind} | {conc} | {} | {} | {} |",
                fmt_f(gd, 3),
                fmt_f(gb, 3),
                fmt_f(added, 1)
            );
            json_ratios.push(json!({"request": kind, "concurrency": conc,
                "cache_over_direct": gd, "cache_over_bare_proxy": gb, "p50_vs_direct_us": added}));
            report
                .cache_ratios
                .push((conc, kind.to_string(), gd, gb, added));
        }
    }
    let _ = writeln!(
        md,
        "\nWhat reached the upstream from each cached gateway (its cache counters; hit ratio = (hits + coalesced) / cacheable requests; requests served: every answer of the load, warm-up included; cacheable: the same plus the correctness checks; for the mix, 90 % of requests are `tools/call`, which always go upstream):\n"
    );
    let _ = writeln!(
        md,
        "| request | requests served | cacheable | hits | coalesced | misses (upstream) | upstream requests | hit ratio |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_counts = Vec::new();
    for (ki, (kind, _)) in kinds.iter().enumerate() {
        let c = &counters[ki];
        let get = |k: &str| c.get(k).copied().unwrap_or(0);
        let (hits, coalesced, misses) = (get("hits"), get("coalesced"), get("misses"));
        let cacheable = hits + coalesced + misses;
        let passed = (served[ki] as u64).saturating_sub(cacheable);
        let ratio = (hits + coalesced) as f64 / cacheable.max(1) as f64;
        let _ = writeln!(
            md,
            "| {kind} | {} | {cacheable} | {hits} | {coalesced} | {misses} | ≈{} | {} |",
            served[ki],
            misses + passed,
            fmt_f(ratio, 5)
        );
        json_counts.push(json!({"request": kind, "served": served[ki], "cacheable": cacheable,
            "hits": hits, "coalesced": coalesced, "misses": misses, "invalidations": get("invalidations"),
            "upstream_requests_approx": misses + passed, "hit_ratio": ratio}));
    }
    report.add(
        "cache",
        md,
        json!({"rows": json_rows, "ratios": json_ratios, "upstream": json_counts}),
    );
    Ok(())
}
