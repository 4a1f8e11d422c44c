//! Scenario `reverse`: modern hosts through the gateway to a legacy server against
//! legacy hosts directly to it, a plain call and the elicitation flow.

use crate::*;

/// The answer the scripted user gives to the legacy server's question.
const ANSWER: &str = "yes";

fn answer_reply(live: &Value) -> Res<Bytes> {
    Ok(Bytes::from(serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": live["id"],
        "result": {"action": "accept", "content": {"answer": ANSWER}}
    }))?))
}

fn text_of(result: &Value) -> Res<&str> {
    result
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("no text content in {result}").into())
}

/// The legacy flow: `ask`, its elicitation answered on the session, the result.
async fn legacy_ask(c: &mut LegacyClient) -> Res<()> {
    let r = c
        .tool_answering("ask", json!({"question": "Go?"}), None, answer_reply)
        .await?;
    if text_of(&r)? != "answered: yes" {
        return Err(format!("legacy ask: {r}").into());
    }
    Ok(())
}

/// The modern flow through the gateway: call → `input_required` → retry with the
/// answer and the round's state → complete.
async fn modern_ask(c: &mut Conn, id: &mut u64) -> Res<()> {
    let caps = json!({"elicitation": {"form": {}}});
    let h = modern_headers("tools/call", Some("ask"));
    let call = json!({"name": "ask", "arguments": {"question": "Go?"}});
    *id += 1;
    let (st, m) = c
        .exchange(
            &h,
            modern_body(*id, "tools/call", call.clone(), caps.clone()),
        )
        .await?;
    let r = result_of(st, &m)?;
    if r["resultType"] != "input_required" {
        return Err(format!("ask did not become a round: {r}").into());
    }
    let key = r["inputRequests"]
        .as_object()
        .and_then(|o| o.keys().next().cloned())
        .ok_or("a round without input requests")?;
    let mut retry = call;
    retry["inputResponses"] = json!({ key: {"action": "accept", "content": {"answer": ANSWER}} });
    retry["requestState"] = r["requestState"].clone();
    *id += 1;
    let (st, m) = c
        .exchange(&h, modern_body(*id, "tools/call", retry, caps))
        .await?;
    let r = result_of(st, &m)?;
    if r["resultType"] != "complete" || text_of(&r)? != "answered: yes" {
        return Err(format!("ask retry: {r}").into());
    }
    Ok(())
}

pub(crate) async fn reverse(env: &Env, opts: &Opts, report: &mut Report) -> Res<()> {
    let mut c = Command::new(std::env::current_exe()?);
    c.arg("legacy-server");
    let legacy = Proc::spawn(
        "legacy-server",
        c,
        &env.results.join("logs/legacy-server.log"),
        Duration::from_secs(10),
    )?;
    let gateway = env.gateway_args(
        &[&legacy],
        "reverse",
        &env.nocache_config,
        "warn",
        &["--upstream-era", "legacy"],
    )?;
    let _perf = PerfGuard::start(env, gateway.pid(), "reverse");
    eprintln!("bench: reverse (load {})", load_avg());
    let modern = Arc::new(Spec {
        headers: modern_headers("tools/call", Some("echo")),
        body: modern_body(
            1,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
            json!({}),
        ),
    });
    // Correctness first: both paths give the same answer.
    {
        let mut c = Conn::open(gateway.addr).await?;
        let (st, msgs) = c.exchange(&modern.headers, modern.body.clone()).await?;
        let through = result_of(st, &msgs)?;
        let mut l = LegacyClient::open(legacy.addr).await?;
        let direct = l.tool("echo", json!({"text": "hi"})).await?;
        if text_of(&through)? != "hi" || text_of(&direct)? != "hi" {
            return Err(format!("reverse: answers differ: {through} / {direct}").into());
        }
    }

    // (a) The plain call, interleaved round by round: [legacy direct, modern via the
    // gateway, legacy via the bare proxy (the one-hop reference)].
    let bare = env.bare_proxy(&legacy)?;
    const CONCS: [usize; 2] = [1, 16];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### Reverse bridge: plain `tools/call`, modern host through the gateway vs legacy host direct ({} rounds × {} s per variant, interleaved)\n",
        opts.rounds, opts.secs
    );
    let _ = writeln!(
        md,
        "| conc | legacy direct calls/s | modern via gateway calls/s | legacy via bare proxy calls/s | via gateway / direct | bare proxy / direct | gateway CPU per call µs | bare proxy CPU per call µs | legacy server CPU per call µs (direct / via gateway) |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for conc in CONCS {
        // Per variant: requests answered, req/s per round, legacy server CPU.
        let mut total = [0usize; 3];
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut ratios = Vec::new();
        let mut bare_ratios = Vec::new();
        let mut server_cpu = [0.0f64; 3];
        let mut gw_cpu = 0.0f64;
        let mut bare_cpu = 0.0f64;
        for round in 0..opts.rounds {
            let mut this = [0.0f64; 3];
            for k in 0..3 {
                let v = (round + k) % 3;
                let mut workers: Vec<Worker> = Vec::with_capacity(conc);
                for _ in 0..conc {
                    if v == 1 {
                        let c = Conn::open(gateway.addr).await?;
                        let spec = modern.clone();
                        workers.push((c, Box::new(move |_| spec.clone())));
                        continue;
                    }
                    let mut c = Conn::open(if v == 0 { legacy.addr } else { bare.addr }).await?;
                    let headers = legacy_headers(&legacy_open(&mut c).await?);
                    // Each call its own id: a session never reuses one.
                    let next: Box<dyn FnMut(usize) -> Arc<Spec> + Send> =
                        Box::new(move |n: usize| {
                            Arc::new(Spec {
                                headers: headers.clone(),
                                body: rpc(
                                    n as u64 + 1,
                                    "tools/call",
                                    json!({"name": "echo", "arguments": {"text": "hi"}}),
                                ),
                            })
                        });
                    workers.push((c, next));
                }
                let server0 = cpu_of(legacy.pid());
                let gw0 = cpu_of(gateway.pid());
                let bare0 = cpu_of(bare.pid());
                let s = run_load(workers, 0.2, opts.secs).await?;
                server_cpu[v] += cpu_of(legacy.pid()) - server0;
                match v {
                    1 => gw_cpu += cpu_of(gateway.pid()) - gw0,
                    2 => bare_cpu += cpu_of(bare.pid()) - bare0,
                    _ => {}
                }
                if s.errors > 0 {
                    return Err(format!("reverse c={conc}: {} errors", s.errors).into());
                }
                total[v] += s.total;
                rates[v].push(s.rps);
                this[v] = s.rps;
            }
            ratios.push(this[1] / this[0].max(1e-9));
            bare_ratios.push(this[2] / this[0].max(1e-9));
        }
        let ratio = median(&ratios);
        let bare_ratio = median(&bare_ratios);
        let gw_per = gw_cpu * 1e6 / total[1].max(1) as f64;
        let bare_per = bare_cpu * 1e6 / total[2].max(1) as f64;
        let server_per = |v: usize| server_cpu[v] * 1e6 / total[v].max(1) as f64;
        let _ = writeln!(
            md,
            "| {conc} | {} | {} | {} | **{}** | {} | {} | {} | {} / {} |",
            fmt_f(median(&rates[0]), 0),
            fmt_f(median(&rates[1]), 0),
            fmt_f(median(&rates[2]), 0),
            fmt_f(ratio, 3),
            fmt_f(bare_ratio, 3),
            fmt_f(gw_per, 1),
            fmt_f(bare_per, 1),
            fmt_f(server_per(0), 1),
            fmt_f(server_per(1), 1)
        );
        eprintln!(
            "  c={conc:<3} direct {:.0}/s, via gateway {:.0}/s ({ratio:.3}), via bare proxy {:.0}/s ({bare_ratio:.3}); gateway CPU per call {gw_per:.1} µs",
            median(&rates[0]),
            median(&rates[1]),
            median(&rates[2])
        );
        rows.push(
            json!({"concurrency": conc, "direct_per_s": median(&rates[0]),
            "via_gateway_per_s": median(&rates[1]), "via_bare_proxy_per_s": median(&rates[2]),
            "via_gateway_over_direct": ratio, "bare_proxy_over_direct": bare_ratio,
            "gateway_cpu_us_per_call": gw_per, "bare_proxy_cpu_us_per_call": bare_per,
            "legacy_server_cpu_us_per_call_direct": server_per(0),
            "legacy_server_cpu_us_per_call_via_gateway": server_per(1)}),
        );
        report
            .reverse
            .push((format!("plain tools/call, c={conc}"), ratio));
    }
    let _ = writeln!(
        md,
        "\nThe modern hosts share one partition (no credentials, the same capabilities), so all their calls travel on one pooled legacy session; a legacy host direct or through the bare proxy has a session per connection. The bare proxy (the least a hyper reverse proxy does) is the cost of one hop on this machine. CPU is per process (/proc/PID/stat) over each variant's rounds, session opening included; everything shares the same two cores.\n"
    );

    // (b) The elicitation flow, alternating one by one.
    let mut direct = LegacyClient::open(legacy.addr).await?;
    let mut through = Conn::open(gateway.addr).await?;
    let mut id = 0u64;
    legacy_ask(&mut direct).await?;
    modern_ask(&mut through, &mut id).await?;
    let secs = (opts.secs * 2.0).max(0.5);
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut lats: [Vec<f64>; 2] = Default::default();
    let mut ratios = Vec::new();
    let mut gw_cpu = (0.0f64, 0usize);
    for round in 0..opts.rounds {
        let mut busy = [0.0f64; 2];
        let mut n = [0usize; 2];
        let mut ns: [Vec<f64>; 2] = Default::default();
        let gw0 = cpu_of(gateway.pid());
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..2 {
                let v = (turn + k) % 2;
                let t0 = Instant::now();
                if v == 0 {
                    legacy_ask(&mut direct).await?;
                } else {
                    modern_ask(&mut through, &mut id).await?;
                }
                let took = t0.elapsed().as_secs_f64();
                ns[v].push(took * 1e6);
                busy[v] += took;
                n[v] += 1;
            }
            turn += 1;
        }
        // The gateway only works during the modern flows.
        gw_cpu.0 += cpu_of(gateway.pid()) - gw0;
        gw_cpu.1 += n[1];
        let this = [0, 1].map(|v| n[v] as f64 / busy[v].max(1e-9));
        for v in 0..2 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[1] / this[0]);
        eprintln!(
            "  round {}: elicitation flow legacy direct {:>7.1} flows/s, modern via gateway {:>7.1}",
            round + 1,
            this[0],
            this[1]
        );
    }
    let ratio = median(&ratios);
    let gw_per = gw_cpu.0 * 1e6 / gw_cpu.1.max(1) as f64;
    let _ = writeln!(
        md,
        "#### Elicitation flow, one client per variant, flows alternating one by one ({} rounds × {} s)\n",
        opts.rounds, secs
    );
    let _ = writeln!(md, "| variant | flows/s | median flow µs |");
    let _ = writeln!(md, "|---|---:|---:|");
    for (v, name) in [
        "legacy host direct (live elicitation answered on the session)",
        "modern host via gateway (input_required + retry)",
    ]
    .iter()
    .enumerate()
    {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_f(median(&rates[v]), 1),
            fmt_f(median(&lats[v]), 0)
        );
    }
    let _ = writeln!(
        md,
        "\nvia gateway / direct (median of per-round ratios): **{}**; gateway CPU per modern flow: {} µs. Both flows are two HTTP requests from the host (legacy: the call, whose stream carries the elicitation and then the result, and the answer's POST; modern: the call and the retry); through the gateway the same two legacy requests go upstream on its pooled session.",
        fmt_f(ratio, 3),
        fmt_f(gw_per, 0)
    );
    report.reverse.push(("elicitation flow".into(), ratio));
    report.add(
        "reverse",
        md,
        json!({"plain_call": rows, "elicitation": {
            "direct_flows_per_s": median(&rates[0]), "via_gateway_flows_per_s": median(&rates[1]),
            "via_gateway_over_direct": ratio, "gateway_cpu_us_per_flow": gw_per,
            "per_round_direct": rates[0], "per_round_via_gateway": rates[1],
            "median_flow_us_direct": median(&lats[0]), "median_flow_us_via_gateway": median(&lats[1])}}),
    );
    Ok(())
}
