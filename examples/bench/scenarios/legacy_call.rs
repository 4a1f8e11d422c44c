//! Scenario `legacy-call`: a plain legacy call against the same call passed through.

use crate::*;

/// Gateway CPU per plain legacy `tools/call notes_list` (no elicitation; an initialized
/// 2025-11-25 session per connection, each call a POST answered with JSON) against the
/// same call from a modern client passed through, at concurrency 1 and 16, through one
/// gateway with the cache off, interleaved round by round. What the session machine
/// costs per request beyond the proxy path.
pub(crate) async fn legacy_call(
    env: &Env,
    opts: &Opts,
    server: &Proc,
    report: &mut Report,
) -> Res<()> {
    let gateway = env.gateway_with(server, "legacy-call", &env.nocache_config, "warn")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "legacy-call");
    eprintln!("bench: legacy-call (load {})", load_avg());
    let modern = passthrough_kinds(env)
        .into_iter()
        .find(|(k, _)| *k == "tools/call notes_list")
        .map(|(_, spec)| spec)
        .ok_or("no tools/call spec")?;
    let args = json!({"name": "notes_list", "arguments": {"workspaceUri": env.notes_uri}});
    // Correctness first: both paths give the same answer.
    {
        let mut c = Conn::open(gateway.addr).await?;
        let (st, msgs) = c.exchange(&modern.headers, modern.body.clone()).await?;
        let through = result_of(st, &msgs)?;
        let mut l = LegacyClient::open(gateway.addr).await?;
        let legacy = l.tool("notes_list", args["arguments"].clone()).await?;
        if legacy.get("content") != through.get("content") {
            return Err("legacy-call: the legacy and the modern answers differ".into());
        }
    }
    pub(crate) const CONCS: [usize; 2] = [1, 16];
    let mut rows = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### Plain legacy call vs pass-through ({} rounds × {} s per variant, interleaved)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| conc | legacy calls/s | pass-through req/s | gateway CPU per legacy call µs | gateway CPU per pass-through request µs | context switches per legacy call / per pass-through request | legacy / pass-through CPU |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    for conc in CONCS {
        // [legacy, pass-through]: CPU seconds, requests answered, req/s per round,
        // context switches.
        let mut cpu = [(0.0f64, 0usize); 2];
        let mut switches = [0u64; 2];
        let mut rates: [Vec<f64>; 2] = Default::default();
        for round in 0..opts.rounds {
            for k in 0..2 {
                let v = (round + k) % 2;
                let mut workers: Vec<Worker> = Vec::with_capacity(conc);
                for _ in 0..conc {
                    let mut c = Conn::open(gateway.addr).await?;
                    let next: Box<dyn FnMut(usize) -> Arc<Spec> + Send> = if v == 0 {
                        let headers = legacy_headers(&legacy_open(&mut c).await?);
                        let args = args.clone();
                        // Each call its own id: a session never reuses one.
                        Box::new(move |n: usize| {
                            Arc::new(Spec {
                                headers: headers.clone(),
                                body: rpc(n as u64 + 1, "tools/call", args.clone()),
                            })
                        })
                    } else {
                        let spec = modern.clone();
                        Box::new(move |_| spec.clone())
                    };
                    workers.push((c, next));
                }
                let before = cpu_of(gateway.pid());
                let switched = switches_of(gateway.pid());
                let s = run_load(workers, 0.2, opts.secs).await?;
                cpu[v].0 += cpu_of(gateway.pid()) - before;
                switches[v] += switches_of(gateway.pid()).saturating_sub(switched);
                cpu[v].1 += s.total;
                if s.errors > 0 {
                    return Err(format!("legacy-call c={conc}: {} errors", s.errors).into());
                }
                rates[v].push(s.rps);
            }
        }
        let per = |v: usize| cpu[v].0 * 1e6 / cpu[v].1.max(1) as f64;
        let switched = |v: usize| switches[v] as f64 / cpu[v].1.max(1) as f64;
        let ratio = per(0) / per(1);
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | {} | {} | {} / {} | **{}** |",
            fmt_f(median(&rates[0]), 0),
            fmt_f(median(&rates[1]), 0),
            fmt_f(per(0), 1),
            fmt_f(per(1), 1),
            fmt_f(switched(0), 2),
            fmt_f(switched(1), 2),
            fmt_f(ratio, 3)
        );
        eprintln!(
            "  c={conc:<3} gateway CPU per legacy call {:.1} µs, per pass-through request {:.1} µs: {ratio:.3}",
            per(0),
            per(1)
        );
        rows.push(
            json!({"concurrency": conc, "legacy_calls_per_s": median(&rates[0]),
            "passthrough_per_s": median(&rates[1]), "gateway_cpu_us_per_legacy_call": per(0),
            "gateway_cpu_us_per_passthrough": per(1), "legacy_over_passthrough_cpu": ratio}),
        );
        report.legacy_call.push((conc, ratio));
    }
    let _ = writeln!(
        md,
        "\nCPU is the gateway process's (from /proc/PID/stat) over the whole of each variant's rounds, the warm-up and the session opening included; the client runs on the same two cores."
    );
    report.add("legacy-call", md, json!({"rows": rows}));
    Ok(())
}
