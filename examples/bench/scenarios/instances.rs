//! Scenario `instances`: a gateway in front of two instances on one PostgreSQL vs one.

use crate::*;

/// The gateway variants of the instances scenario, in report order.
pub(crate) const INSTANCE_VARIANTS: [&str; 2] =
    ["gateway over one instance", "gateway over two instances"];

/// The legacy MRTR flow through a gateway over two `dualera serve` instances on one
/// PostgreSQL vs a gateway over one of them. At concurrency 1 flows alternate one by one;
/// above, the variants alternate in time slices (order rotating every round).
pub(crate) async fn instances(env: &Env, opts: &Opts, report: &mut Report) -> Res<()> {
    let (cluster, url) = pg_database("instances", "instances")?;
    // The same configuration, so the same [[state.keys]]: a state either signed verifies
    // on the other.
    let a = env.server_on(&url, "instance-a")?;
    let b = env.server_on(&url, "instance-b")?;
    let gateways = [
        env.gateway_over(&[&a], "instances-1", &env.nocache_config, "warn")?,
        env.gateway_over(&[&a, &b], "instances-2", &env.nocache_config, "warn")?,
    ];
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let counter = Arc::new(AtomicUsize::new(0));
    let title = |counter: &AtomicUsize| format!("inst-{}", counter.fetch_add(1, Ordering::Relaxed));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 6. Instances: the legacy MRTR flow (notes_create, notes_delete with one elicitation, accepted) through a gateway over two `dualera serve` instances on one PostgreSQL vs over one of them ({} rounds × {} s per variant)\n",
        opts.rounds,
        secs
    );
    let _ = writeln!(
        md,
        "| concurrency | over one: flows/s | over two: flows/s | two/one (median of per-round ratios) | CPU s instance A / B (two-instance variant) |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---|");
    let mut json_levels = Vec::new();
    for conc in [1usize, 8] {
        let mut clients: [Vec<LegacyClient>; 2] = Default::default();
        for (v, g) in gateways.iter().enumerate() {
            for _ in 0..conc {
                let mut c = LegacyClient::open(g.addr).await?;
                legacy_flow(&mut c, &ws, &title(&counter)).await?;
                clients[v].push(c);
            }
        }
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut ratios = Vec::new();
        let mut spread = (0.0f64, 0.0f64);
        for round in 0..opts.rounds {
            let mut this = [0.0f64; 2];
            if conc == 1 {
                let mut busy = [0.0f64; 2];
                let mut n = [0usize; 2];
                let end = Instant::now() + Duration::from_secs_f64(secs * 2.0);
                let mut turn = 0usize;
                let mut cpu_two = (0.0, 0.0);
                while Instant::now() < end && turn < 100_000 {
                    for k in 0..2 {
                        let v = (turn + k) % 2;
                        // CPU of each instance around the two-instance flows only.
                        let before = if v == 1 {
                            (cpu_of(a.pid()), cpu_of(b.pid()))
                        } else {
                            (0.0, 0.0)
                        };
                        let t0 = Instant::now();
                        legacy_flow(&mut clients[v][0], &ws, &title(&counter)).await?;
                        busy[v] += t0.elapsed().as_secs_f64();
                        n[v] += 1;
                        if v == 1 {
                            cpu_two.0 += cpu_of(a.pid()) - before.0;
                            cpu_two.1 += cpu_of(b.pid()) - before.1;
                        }
                    }
                    turn += 1;
                }
                spread.0 += cpu_two.0;
                spread.1 += cpu_two.1;
                for v in 0..2 {
                    this[v] = n[v] as f64 / busy[v].max(1e-9);
                }
            } else {
                for k in 0..2 {
                    let v = (round + k) % 2;
                    let before = (cpu_of(a.pid()), cpu_of(b.pid()));
                    let end = Instant::now() + Duration::from_secs_f64(secs);
                    let t0 = Instant::now();
                    let mut tasks = Vec::new();
                    for mut c in std::mem::take(&mut clients[v]) {
                        let ws = ws.clone();
                        let counter = counter.clone();
                        tasks.push(tokio::spawn(async move {
                            let mut n = 0usize;
                            while Instant::now() < end && n < 100_000 {
                                let t = format!("inst-{}", counter.fetch_add(1, Ordering::Relaxed));
                                legacy_flow(&mut c, &ws, &t).await?;
                                n += 1;
                            }
                            Ok::<_, BoxError>((c, n))
                        }));
                    }
                    let mut n = 0usize;
                    for t in tasks {
                        let (c, done) = t.await??;
                        clients[v].push(c);
                        n += done;
                    }
                    this[v] = n as f64 / t0.elapsed().as_secs_f64().max(1e-9);
                    if v == 1 {
                        spread.0 += cpu_of(a.pid()) - before.0;
                        spread.1 += cpu_of(b.pid()) - before.1;
                    }
                }
            }
            for v in 0..2 {
                rates[v].push(this[v]);
            }
            ratios.push(this[1] / this[0]);
            eprintln!(
                "  concurrency {conc}, round {}: over one {:>6.1} flows/s  over two {:>6.1}",
                round + 1,
                this[0],
                this[1]
            );
        }
        let rate = [0, 1].map(|v| median(&rates[v]));
        let ratio = median(&ratios);
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | **{}** | {} / {} |",
            fmt_f(rate[0], 1),
            fmt_f(rate[1], 1),
            fmt_f(ratio, 3),
            fmt_f(spread.0, 2),
            fmt_f(spread.1, 2)
        );
        json_levels.push(
            json!({"concurrency": conc, "one_flows_per_s": rate[0], "two_flows_per_s": rate[1],
            "ratio": ratio, "per_round_one": rates[0], "per_round_two": rates[1],
            "two_instance_cpu_s": [spread.0, spread.1]}),
        );
    }
    let _ = writeln!(
        md,
        "\nVariants: {}. Both gateways have the cache off; the instances share one configuration (one `[[state.keys]]`), and the CPU columns show the two-instance gateway's work landing on both.",
        INSTANCE_VARIANTS.join(", ")
    );
    report.add("instances", md, json!({ "levels": json_levels }));
    drop(gateways);
    drop(a);
    drop(b);
    drop(cluster);
    Ok(())
}
