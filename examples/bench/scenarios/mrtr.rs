//! Scenario `mrtr`: the elicitation flow, legacy session through the gateway vs the modern retry direct and through the bare proxy; the flows the other flow scenarios reuse.

use crate::*;

pub(crate) fn check_deleted(r: &Value) -> Res<()> {
    if r.pointer("/structuredContent/deleted")
        .is_some_and(Value::is_string)
    {
        Ok(())
    } else {
        Err(format!("notes_delete did not delete: {r}").into())
    }
}

/// One flow; returns how long the create and the delete took, in µs.
pub(crate) async fn legacy_flow(c: &mut LegacyClient, ws: &str, title: &str) -> Res<(f64, f64)> {
    let t0 = Instant::now();
    c.tool(
        "notes_create",
        json!({"workspaceUri": ws, "title": title, "body": "bench"}),
    )
    .await?;
    let t1 = Instant::now();
    let r = c
        .tool("notes_delete", json!({"workspaceUri": ws, "title": title}))
        .await?;
    check_deleted(&r)?;
    Ok((
        (t1 - t0).as_secs_f64() * 1e6,
        t1.elapsed().as_secs_f64() * 1e6,
    ))
}

/// One flow; returns how long the create and the delete (both rounds) took, in µs.
pub(crate) async fn modern_flow(c: &mut Conn, ws: &str, title: &str) -> Res<(f64, f64)> {
    let t0 = Instant::now();
    let (st, m) = c
        .exchange(
            &modern_headers("tools/call", Some("notes_create")),
            modern_body(
                1,
                "tools/call",
                json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": title, "body": "bench"}}),
                json!({}),
            ),
        )
        .await?;
    result_of(st, &m)?;
    let t1 = Instant::now();
    let args = json!({"workspaceUri": ws, "title": title});
    let form = json!({"elicitation": {"form": {}}});
    let h = modern_headers("tools/call", Some("notes_delete"));
    let (st, m) = c
        .exchange(
            &h,
            modern_body(
                2,
                "tools/call",
                json!({"name": "notes_delete", "arguments": args}),
                form.clone(),
            ),
        )
        .await?;
    let r = result_of(st, &m)?;
    if r["resultType"] != "input_required" {
        return Err(format!("notes_delete did not ask: {r}").into());
    }
    let ask = r
        .pointer("/inputRequests/delete_choice")
        .ok_or("no delete_choice input request")?;
    let note = ask
        .pointer("/params/requestedSchema/properties/note_id/enum/0")
        .cloned()
        .ok_or("no candidate")?;
    let state = r["requestState"].clone();
    let (st, m) = c
        .exchange(
            &h,
            modern_body(
                3,
                "tools/call",
                json!({"name": "notes_delete", "arguments": args,
                       "inputResponses": {"delete_choice": {"action": "accept", "content": {"note_id": note, "confirm": true}}},
                       "requestState": state}),
                form,
            ),
        )
        .await?;
    check_deleted(&result_of(st, &m)?)?;
    Ok((
        (t1 - t0).as_secs_f64() * 1e6,
        t1.elapsed().as_secs_f64() * 1e6,
    ))
}

/// The MRTR flow's variants, in report order.
pub(crate) const FLOW_VARIANTS: [&str; 3] = [
    "legacy session through the gateway (live elicitation)",
    "modern client direct (input_required + retry)",
    "modern client through the bare proxy (same exchange)",
];

pub(crate) async fn mrtr(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway(server, "mrtr")?;
    let bare = env.bare_proxy(server)?;
    let _perf = PerfGuard::start(env, gateway.pid(), "mrtr");
    eprintln!("bench: mrtr (load {})", load_avg());
    let mut legacy = LegacyClient::open(gateway.addr).await?;
    let mut modern = Conn::open(server.addr).await?;
    let mut proxied = Conn::open(bare.addr).await?;
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let mut counter = 0u64;
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut lats: [Vec<f64>; 3] = Default::default();
    let mut steps: [Vec<(f64, f64)>; 3] = Default::default();
    let mut ratios = Vec::new();
    let mut floor_ratios = Vec::new();
    // Warm-up: one flow each.
    counter += 1;
    legacy_flow(&mut legacy, &ws, &format!("flow-{counter}")).await?;
    counter += 1;
    modern_flow(&mut modern, &ws, &format!("flow-{counter}")).await?;
    counter += 1;
    modern_flow(&mut proxied, &ws, &format!("flow-{counter}")).await?;
    let mut gw_cpu = (0.0f64, 0usize);
    let mut bare_cpu = (0.0f64, 0usize);
    let mut legacy_over_bare = Vec::new();
    let mut gw_switches = 0u64;
    // Flows alternate one by one (which variant goes first rotates every turn), so all
    // variants see the same machine: a neighbour's burst or a slow second lands on
    // each, and each round's ratio compares like with like.
    for round in 0..opts.rounds {
        let mut busy = [0.0f64; 3];
        let mut n = [0usize; 3];
        let mut ns: [Vec<f64>; 3] = Default::default();
        let cpu0 = cpu_of(gateway.pid());
        let bare0 = cpu_of(bare.pid());
        let sw0 = switches_of(gateway.pid());
        let end = Instant::now() + Duration::from_secs_f64(secs * 3.0);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..3 {
                let v = (turn + k) % 3;
                counter += 1;
                let title = format!("flow-{counter}");
                let t0 = Instant::now();
                let step = match v {
                    0 => legacy_flow(&mut legacy, &ws, &title).await?,
                    1 => modern_flow(&mut modern, &ws, &title).await?,
                    _ => modern_flow(&mut proxied, &ws, &title).await?,
                };
                let took = t0.elapsed().as_secs_f64();
                steps[v].push(step);
                ns[v].push(took * 1e6);
                busy[v] += took;
                n[v] += 1;
            }
            turn += 1;
        }
        // The gateway only works during legacy flows, so its whole-round CPU is theirs.
        gw_cpu.0 += cpu_of(gateway.pid()) - cpu0;
        gw_switches += switches_of(gateway.pid()) - sw0;
        gw_cpu.1 += n[0];
        // Likewise the bare proxy only works during the proxied modern flows.
        bare_cpu.0 += cpu_of(bare.pid()) - bare0;
        bare_cpu.1 += n[2];
        let this = [0, 1, 2].map(|v| n[v] as f64 / busy[v].max(1e-9));
        legacy_over_bare.push(this[0] / this[2]);
        for v in 0..3 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[0] / this[1]);
        floor_ratios.push(this[2] / this[1]);
        eprintln!(
            "  round {}: legacy via gateway {:>6.1} flows/s  modern direct {:>6.1}  modern via bare proxy {:>6.1}",
            round + 1,
            this[0],
            this[1],
            this[2]
        );
    }
    let rate = [0, 1, 2].map(|v| median(&rates[v]));
    let ratio = median(&ratios);
    let floor_ratio = median(&floor_ratios);
    report.mrtr_ratio = Some((ratio, floor_ratio));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 2. MRTR flow: notes_create + notes_delete with one elicitation (accept), one client per variant, flows alternating one by one ({} rounds × {} s; flows/s = flows ÷ time spent in that variant's flows)\n",
        opts.rounds,
        secs * 3.0
    );
    let step_median =
        |v: usize, f: fn(&(f64, f64)) -> f64| median(&steps[v].iter().map(f).collect::<Vec<_>>());
    let _ = writeln!(
        md,
        "| variant | flows/s | median flow µs | median create µs | median delete µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (v, name) in FLOW_VARIANTS.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            fmt_f(rate[v], 1),
            fmt_f(median(&lats[v]), 0),
            fmt_f(step_median(v, |x| x.0), 0),
            fmt_f(step_median(v, |x| x.1), 0)
        );
    }
    let gw_cpu_us = gw_cpu.0 * 1e6 / gw_cpu.1.max(1) as f64;
    let bare_cpu_us = bare_cpu.0 * 1e6 / bare_cpu.1.max(1) as f64;
    let legacy_over_bare = median(&legacy_over_bare);
    report.mrtr_one_hop = Some((legacy_over_bare, gw_cpu_us));
    let gw_sw = gw_switches as f64 / gw_cpu.1.max(1) as f64;
    let _ = writeln!(
        md,
        "\nlegacy/modern ratio (median of per-round ratios): **{}**; gateway CPU per legacy flow: {} µs, context switches per legacy flow: {}",
        fmt_f(ratio, 3),
        fmt_f(gw_cpu_us, 0),
        fmt_f(gw_sw, 1)
    );
    let _ = writeln!(
        md,
        "\nAgainst the one-hop reference: legacy flow / modern flow through the bare proxy **{}** (target ≥ 1.0); gateway CPU per legacy flow {} µs (target ≤ 500) beside the bare proxy's CPU per modern flow {} µs.",
        fmt_f(legacy_over_bare, 3),
        fmt_f(gw_cpu_us, 0),
        fmt_f(bare_cpu_us, 0)
    );
    let _ = writeln!(
        md,
        "\nFor scale: the same modern exchange through the bare proxy runs at **{}**× direct. It crosses one proxy hop per request, as the gateway's upstream side does; the legacy flow also carries the host's answer as a fourth request and the elicitation and result as SSE events.",
        fmt_f(floor_ratio, 3)
    );
    report.add(
        "mrtr",
        md,
        json!({"legacy_flows_per_s": rate[0], "modern_flows_per_s": rate[1], "bare_proxy_flows_per_s": rate[2],
               "ratio": ratio, "bare_proxy_ratio": floor_ratio,
               "gateway_cpu_us_per_flow": gw_cpu_us, "gateway_context_switches_per_flow": gw_sw,
               "bare_proxy_cpu_us_per_flow": bare_cpu_us, "legacy_over_bare_proxy": legacy_over_bare,
               "per_round_legacy": rates[0], "per_round_modern": rates[1], "per_round_bare_proxy": rates[2],
               "median_flow_us_legacy": median(&lats[0]), "median_flow_us_modern": median(&lats[1]),
               "median_flow_us_bare_proxy": median(&lats[2])}),
    );
    Ok(())
}
