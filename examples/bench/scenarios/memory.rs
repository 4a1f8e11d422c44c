//! Scenario `memory`: gateway RSS per idle legacy session.

use crate::*;

/// Opens `count` initialized legacy sessions over `conns` connections; stops early at
/// `deadline`. Returns the session ids opened.
pub(crate) async fn open_sessions(
    addr: SocketAddr,
    count: usize,
    conns: usize,
    deadline: Instant,
) -> Res<Vec<String>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns.min(count.max(1)) {
        let next = next.clone();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            let mut c = Conn::open(addr).await?;
            while next.fetch_add(1, Ordering::Relaxed) < count {
                if Instant::now() >= deadline {
                    break;
                }
                ids.push(legacy_open(&mut c).await?);
            }
            Ok::<_, BoxError>(ids)
        });
    }
    let mut all = Vec::with_capacity(count);
    while let Some(r) = tasks.join_next().await {
        all.extend(r??);
    }
    Ok(all)
}

pub(crate) async fn settle_rss(p: &Proc) -> Res<u64> {
    tokio::time::sleep(Duration::from_millis(700)).await;
    p.rss()
}

pub(crate) async fn memory(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let gateway = env.gateway(server, "memory")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "memory");
    eprintln!("bench: memory (load {})", load_avg());
    // Warm the discover cache, the runtime and the connections, then end those sessions.
    let warm = open_sessions(
        gateway.addr,
        64,
        32,
        Instant::now() + Duration::from_secs(60),
    )
    .await?;
    let mut c = Conn::open(gateway.addr).await?;
    for sid in &warm {
        let mut req = Request::delete("/mcp").body(Full::new(Bytes::new()))?;
        req.headers_mut().insert(header::HOST, c.host.clone());
        for (k, v) in legacy_headers(sid) {
            req.headers_mut().insert(k, v);
        }
        c.tx.ready().await?;
        let r = c.tx.send_request(req).await?;
        r.into_body().collect().await?;
    }
    let base = settle_rss(&gateway).await?;
    let mut rows = vec![(0usize, base, 0.0f64, 0.0f64)];
    let mut open = 0usize;
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut note = String::new();
    let mut keep = Vec::new();
    for &level in &opts.session_levels {
        let t0 = Instant::now();
        let ids = open_sessions(gateway.addr, level.saturating_sub(open), 64, deadline).await?;
        let took = t0.elapsed().as_secs_f64();
        let rate = ids.len() as f64 / took;
        open += ids.len();
        keep.extend(ids);
        let rss = settle_rss(&gateway).await?;
        rows.push((open, rss, rate, took));
        eprintln!(
            "  {open} sessions: RSS {:.1} MiB ({rate:.0} initializes/s)",
            rss as f64 / 1048576.0
        );
        if open < level {
            note = format!(
                "Stopped at {open} sessions: the 240 s bound for this scenario ran out before {level}."
            );
            break;
        }
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 3. Session memory: gateway RSS with idle initialized legacy sessions\n"
    );
    let _ = writeln!(
        md,
        "| sessions | RSS MiB | bytes/session (vs 0) | initialize+initialized/s |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|");
    let mut json_rows = Vec::new();
    for (n, rss, rate, took) in &rows {
        let per = if *n == 0 {
            f64::NAN
        } else {
            (*rss as f64 - base as f64) / *n as f64
        };
        let _ = writeln!(
            md,
            "| {n} | {:.1} | {} | {} |",
            *rss as f64 / 1048576.0,
            fmt_f(per, 0),
            if *n == 0 {
                "–".into()
            } else {
                fmt_f(*rate, 0)
            }
        );
        json_rows.push(json!({"sessions": n, "rss_bytes": rss, "bytes_per_session": if per.is_finite() { json!(per) } else { Value::Null }, "sessions_per_s": rate, "seconds": took}));
        if *n > 0 {
            report.bytes_per_session = Some((*n, per));
        }
    }
    if !note.is_empty() {
        let _ = writeln!(md, "\n{note}");
    }
    report.add(
        "memory",
        md,
        json!({"rows": json_rows, "note": note, "sessions_kept": keep.len()}),
    );
    Ok(())
}
