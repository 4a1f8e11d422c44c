//! Scenario `passthrough`: modern requests direct, through the gateway and through the bare proxy; the closed-loop load driver the other scenarios share.

use crate::*;

pub(crate) struct Spec {
    pub(crate) headers: Headers,
    pub(crate) body: Bytes,
}

/// `conc` connections posting `spec` back to back; after `warm`, counts what completes
/// within `secs`. Bounded by time and by `max` requests.
pub(crate) async fn load(
    addr: SocketAddr,
    spec: Arc<Spec>,
    conc: usize,
    warm: f64,
    secs: f64,
) -> Res<Sample> {
    load_mix(addr, Arc::new(vec![spec]), conc, warm, secs).await
}

/// [`load`] where each connection cycles through `specs` in order (a workload mix).
pub(crate) async fn load_mix(
    addr: SocketAddr,
    specs: Arc<Vec<Arc<Spec>>>,
    conc: usize,
    warm: f64,
    secs: f64,
) -> Res<Sample> {
    let mut workers: Vec<Worker> = Vec::with_capacity(conc);
    for w in 0..conc {
        let specs = specs.clone();
        // Offset per connection, so a mix is mixed at every instant.
        let next = Box::new(move |sent: usize| specs[(sent + w) % specs.len()].clone());
        workers.push((Conn::open(addr).await?, next));
    }
    run_load(workers, warm, secs).await
}

/// One load connection and what it posts: its `n`th request (from 0).
pub(crate) type Worker = (Conn, Box<dyn FnMut(usize) -> Arc<Spec> + Send>);

/// Each worker posting back to back on its connection; after `warm`, counts what
/// completes with HTTP 200 within `secs`.
pub(crate) async fn run_load(workers: Vec<Worker>, warm: f64, secs: f64) -> Res<Sample> {
    pub(crate) const MAX_PER_WORKER: usize = 400_000;
    let start = Instant::now() + Duration::from_secs_f64(warm);
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for (mut c, mut next) in workers {
        tasks.spawn(async move {
            let mut lat: Vec<u64> = Vec::with_capacity(16_384);
            let mut errors = 0usize;
            let mut sent = 0usize;
            let mut answered = 0usize;
            loop {
                let t0 = Instant::now();
                if t0 >= end || sent >= MAX_PER_WORKER {
                    break;
                }
                let spec = next(sent);
                sent += 1;
                let ok = match c.post(&spec.headers, spec.body.clone()).await {
                    Ok(resp) => {
                        let st = resp.status();
                        resp.into_body().collect().await.is_ok() && st == StatusCode::OK
                    }
                    Err(_) => false,
                };
                let t1 = Instant::now();
                if !ok {
                    errors += 1;
                    if c.tx.is_closed() {
                        match Conn::open(c.tx_addr()).await {
                            Ok(n) => c = n,
                            Err(_) => break,
                        }
                    }
                    continue;
                }
                answered += 1;
                if t0 >= start && t1 <= end {
                    lat.push(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
                }
            }
            (lat, errors, answered)
        });
    }
    let mut all = Vec::new();
    let mut errors = 0;
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        let (lat, e, answered) = r?;
        all.extend(lat);
        errors += e;
        total += answered;
    }
    all.sort_unstable();
    Ok(Sample {
        rps: all.len() as f64 / secs,
        total,
        p50_us: percentile(&all, 50.0),
        p99_us: percentile(&all, 99.0),
        n: all.len(),
        errors,
    })
}

impl Conn {
    pub(crate) fn tx_addr(&self) -> SocketAddr {
        self.host
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

pub(crate) const VARIANTS: [&str; 3] = ["direct", "gateway", "bare_proxy"];

/// The two pass-through requests: `tools/list` and `tools/call notes_list`.
pub(crate) fn passthrough_kinds(env: &Env) -> Vec<(&'static str, Arc<Spec>)> {
    vec![
        (
            "tools/list",
            Arc::new(Spec {
                headers: modern_headers("tools/list", None),
                body: modern_body(1, "tools/list", json!({}), json!({})),
            }),
        ),
        (
            "tools/call notes_list",
            Arc::new(Spec {
                headers: modern_headers("tools/call", Some("notes_list")),
                body: modern_body(
                    1,
                    "tools/call",
                    json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}}),
                    json!({}),
                ),
            }),
        ),
    ]
}

pub(crate) async fn passthrough(
    env: &Env,
    opts: &Opts,
    server: &Proc,
    report: &mut Report,
) -> Res<()> {
    let gateway = env.gateway_with(server, "passthrough", &env.nocache_config, "warn")?;
    let bare = env.bare_proxy(server)?;
    let _perf = PerfGuard::start(env, gateway.pid(), "passthrough");
    let addrs = [server.addr, gateway.addr, bare.addr];
    let kinds = passthrough_kinds(env);
    // Correctness first: every variant gives the same answer.
    for (kind, spec) in &kinds {
        let mut answers = Vec::new();
        for a in addrs {
            let mut c = Conn::open(a).await?;
            let (st, msgs) = c.exchange(&spec.headers, spec.body.clone()).await?;
            let r = result_of(st, &msgs)?;
            if st != StatusCode::OK {
                return Err(format!("{kind}: HTTP {st}").into());
            }
            answers.push(r);
        }
        if answers.iter().any(|a| a != &answers[0]) {
            return Err(format!("{kind}: the variants answered differently").into());
        }
    }
    eprintln!("bench: passthrough (load {})", load_avg());
    let mut samples: BTreeMap<(usize, usize, usize), Vec<Sample>> = BTreeMap::new();
    // CPU seconds and requests per proxy (gateway, bare proxy) and per concurrency.
    let pids = [server.pid(), gateway.pid(), bare.pid()];
    let mut cpu: BTreeMap<(usize, usize), (f64, usize)> = BTreeMap::new();
    // Per (concurrency, kind): gateway/direct, gateway/bare, p50 added, one per round.
    type Ratios = Vec<(f64, f64, f64, f64, f64)>;
    let mut ratios: BTreeMap<(usize, usize), Ratios> = BTreeMap::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, spec)) in kinds.iter().enumerate() {
            for round in 0..opts.rounds {
                let mut this = [None; 3];
                for k in 0..3 {
                    let v = (round + k) % 3;
                    let before = cpu_of(pids[v]);
                    let s = load(addrs[v], spec.clone(), conc, 0.2, opts.secs).await?;
                    let used = cpu_of(pids[v]) - before;
                    let e = cpu.entry((ci, v)).or_default();
                    e.0 += used;
                    e.1 += s.total;
                    this[v] = Some(s);
                    samples.entry((ci, ki, v)).or_default().push(s);
                }
                let [Some(d), Some(g), Some(b)] = this else {
                    continue;
                };
                ratios.entry((ci, ki)).or_default().push((
                    g.rps / d.rps,
                    g.rps / b.rps,
                    g.p50_us - d.p50_us,
                    b.rps / d.rps,
                    b.p50_us - d.p50_us,
                ));
                eprintln!(
                    "  c={conc:<3} {kind:<22} round {}: direct {:>7.0}/s  gateway {:>7.0}/s  bare {:>7.0}/s",
                    round + 1,
                    d.rps,
                    g.rps,
                    b.rps
                );
            }
        }
    }
    let rss = gateway.rss().unwrap_or(0);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 1. Pass-through ({} rounds × {} s per variant, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | conc | variant | req/s | p50 µs | p99 µs | errors |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            for (v, name) in VARIANTS.iter().enumerate() {
                let s = &samples[&(ci, ki, v)];
                let rps = median(&s.iter().map(|x| x.rps).collect::<Vec<_>>());
                let p50 = median(&s.iter().map(|x| x.p50_us).collect::<Vec<_>>());
                let p99 = median(&s.iter().map(|x| x.p99_us).collect::<Vec<_>>());
                let errors: usize = s.iter().map(|x| x.errors).sum();
                let _ = writeln!(
                    md,
                    "| {kind} | {conc} | {name} | {} | {} | {} | {errors} |",
                    fmt_f(rps, 0),
                    fmt_f(p50, 1),
                    fmt_f(p99, 1)
                );
                json_rows.push(json!({
                    "request": kind, "concurrency": conc, "variant": name,
                    "rps_median": rps, "p50_us_median": p50, "p99_us_median": p99, "errors": errors,
                    "rounds": s.iter().map(|x| json!({"rps": x.rps, "p50_us": x.p50_us, "p99_us": x.p99_us, "n": x.n, "errors": x.errors})).collect::<Vec<_>>(),
                }));
            }
        }
    }
    let _ = writeln!(
        md,
        "\n| request | conc | gateway/direct req/s | gateway/bare req/s | p50 added vs direct µs | bare/direct req/s | bare p50 added µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let mut json_ratios = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        for (ki, (kind, _)) in kinds.iter().enumerate() {
            let r = &ratios[&(ci, ki)];
            let gd = median(&r.iter().map(|x| x.0).collect::<Vec<_>>());
            let gb = median(&r.iter().map(|x| x.1).collect::<Vec<_>>());
            let added = median(&r.iter().map(|x| x.2).collect::<Vec<_>>());
            let bd = median(&r.iter().map(|x| x.3).collect::<Vec<_>>());
            let bare_added = median(&r.iter().map(|x| x.4).collect::<Vec<_>>());
            let _ = writeln!(
                md,
                "| {kind} | {conc} | {} | {} | {} | {} | {} |",
                fmt_f(gd, 3),
                fmt_f(gb, 3),
                fmt_f(added, 1),
                fmt_f(bd, 3),
                fmt_f(bare_added, 1)
            );
            json_ratios.push(json!({"request": kind, "concurrency": conc,
                "gateway_over_direct": gd, "gateway_over_bare_proxy": gb, "p50_added_us": added,
                "bare_proxy_over_direct": bd, "bare_proxy_p50_added_us": bare_added}));
            report.passthrough_ratios.push(PassthroughRatio {
                conc,
                kind: kind.to_string(),
                gateway_over_direct: gd,
                gateway_over_bare: gb,
                added,
                bare_over_direct: bd,
                bare_added,
            });
        }
    }
    let _ = writeln!(
        md,
        "\nRatios are medians of per-round ratios (each round runs the three variants back to back). Gateway RSS after this scenario: {:.1} MiB.",
        rss as f64 / 1048576.0
    );
    let _ = writeln!(
        md,
        "\nCPU per request of the process serving the variant (from /proc/PID/stat, both request kinds; for direct that is the server's own work):\n"
    );
    let _ = writeln!(
        md,
        "| conc | server (direct) µs | gateway µs | bare proxy µs |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    let mut json_cpu = Vec::new();
    for (ci, &conc) in opts.concurrency.iter().enumerate() {
        let per = |v: usize| {
            cpu.get(&(ci, v))
                .map_or(f64::NAN, |(secs, n)| secs * 1e6 / (*n).max(1) as f64)
        };
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | {} |",
            fmt_f(per(0), 1),
            fmt_f(per(1), 1),
            fmt_f(per(2), 1)
        );
        json_cpu.push(json!({"concurrency": conc, "server_direct_cpu_us": per(0), "gateway_cpu_us": per(1), "bare_proxy_cpu_us": per(2)}));
    }
    report.add(
        "passthrough",
        md,
        json!({"rows": json_rows, "ratios": json_ratios, "cpu_per_request": json_cpu, "gateway_rss_bytes": rss}),
    );
    Ok(())
}
