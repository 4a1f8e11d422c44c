//! Scenario `h2`: HTTP/2 vs HTTP/1.1 to a TLS upstream.

use crate::*;

pub(crate) async fn h2_vs_h1(
    env: &Env,
    opts: &Opts,
    server: &Proc,
    report: &mut Report,
) -> Res<()> {
    let h2 = env.gateway_with(server, "h2", &env.nocache_config, "warn")?;
    let h1 = env.gateway_with(server, "h1", &env.gateway_h1_config, "warn")?;
    let conc = 64;
    eprintln!("bench: h2 vs h1 upstream at c={conc} (load {})", load_avg());
    let kinds = passthrough_kinds(env);
    let variants = [("h2", &h2), ("http/1.1", &h1)];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 5. HTTP/2 vs HTTP/1.1 to the TLS upstream, pass-through at concurrency {conc} ({} rounds × {} s, interleaved; medians)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| request | h2 req/s | h1 req/s | h2/h1 | h2 p50 µs | h1 p50 µs | h2 gateway CPU µs/req | h1 gateway CPU µs/req |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (kind, spec) in &kinds {
        let mut rps: [Vec<f64>; 2] = Default::default();
        let mut p50: [Vec<f64>; 2] = Default::default();
        let mut ratio = Vec::new();
        let mut cpu = [(0.0f64, 0usize); 2];
        for round in 0..opts.rounds {
            let mut this = [0.0f64; 2];
            for k in 0..2 {
                let v = (round + k) % 2;
                let p = variants[v].1;
                let before = cpu_of(p.pid());
                let s = load(p.addr, spec.clone(), conc, 0.2, opts.secs).await?;
                cpu[v].0 += cpu_of(p.pid()) - before;
                cpu[v].1 += s.total;
                rps[v].push(s.rps);
                p50[v].push(s.p50_us);
                this[v] = s.rps;
            }
            ratio.push(this[0] / this[1]);
            eprintln!(
                "  {kind:<22} round {}: h2 {:>7.0}/s  h1 {:>7.0}/s",
                round + 1,
                this[0],
                this[1]
            );
        }
        let per = |v: usize| cpu[v].0 * 1e6 / cpu[v].1.max(1) as f64;
        let _ = writeln!(
            md,
            "| {kind} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_f(median(&rps[0]), 0),
            fmt_f(median(&rps[1]), 0),
            fmt_f(median(&ratio), 3),
            fmt_f(median(&p50[0]), 1),
            fmt_f(median(&p50[1]), 1),
            fmt_f(per(0), 1),
            fmt_f(per(1), 1)
        );
        rows.push(json!({"request": kind, "concurrency": conc,
            "h2_rps": median(&rps[0]), "h1_rps": median(&rps[1]), "h2_over_h1": median(&ratio),
            "h2_p50_us": median(&p50[0]), "h1_p50_us": median(&p50[1]),
            "h2_gateway_cpu_us": per(0), "h1_gateway_cpu_us": per(1)}));
    }
    let _ = writeln!(
        md,
        "\nThe h2 gateway multiplexes every request over one upstream connection; the HTTP/1.1 one keeps a pool (up to 64 connections here)."
    );
    report.add("h2", md, json!({"rows": rows}));
    Ok(())
}
