//! Scenario `pending`: legacy requests parked on an unanswered elicitation, then drained.

use crate::*;

pub(crate) async fn pending(env: &Env, opts: &Opts, server: &Proc, report: &mut Report) -> Res<()> {
    let n = opts.pending;
    let ws = env.scratch_uri.clone();
    let store = SqliteStore::open(&env.db.to_string_lossy()).map_err(|e| e.to_string())?;
    let before = store.count(&ws).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: pending: creating {n} notes directly (load {})",
        load_avg()
    );
    // The notes to delete, created on the server directly (not measured).
    {
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let next = next.clone();
            let ws = ws.clone();
            let addr = server.addr;
            tasks.spawn(async move {
                let mut c = Conn::open(addr).await?;
                let h = modern_headers("tools/call", Some("notes_create"));
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, BoxError>(());
                    }
                    let (st, m) = c
                        .exchange(
                            &h,
                            modern_body(
                                1,
                                "tools/call",
                                json!({"name": "notes_create", "arguments": {"workspaceUri": ws, "title": format!("pending-{i}"), "body": "bench"}}),
                                json!({}),
                            ),
                        )
                        .await?;
                    result_of(st, &m)?;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
    }
    let gateway = env.gateway(server, "pending")?;
    let _perf = PerfGuard::start(env, gateway.pid(), "pending");
    let rss0 = settle_rss(&gateway).await?;
    let sessions = open_sessions(
        gateway.addr,
        opts.pending_sessions,
        32,
        Instant::now() + Duration::from_secs(120),
    )
    .await?;
    if sessions.len() < opts.pending_sessions {
        return Err("pending: could not open the sessions in time".into());
    }
    let rss_sessions = settle_rss(&gateway).await?;
    eprintln!(
        "bench: pending: parking {n} requests on {} sessions",
        sessions.len()
    );
    // Park: each request on its own connection, SSE kept open; setup concurrency bounded.
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let (parked_tx, mut parked_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Bytes)>();
    let mut streams = tokio::task::JoinSet::new();
    let park_start = Instant::now();
    for i in 0..n {
        let sid = sessions[i % sessions.len()].clone();
        let gate = gate.clone();
        let parked_tx = parked_tx.clone();
        let ws = ws.clone();
        let addr = gateway.addr;
        streams.spawn(async move {
            let permit = gate.acquire_owned().await?;
            let mut c = Conn::open(addr).await?;
            let h = legacy_headers(&sid);
            let body = rpc(
                1_000_000 + i as u64,
                "tools/call",
                json!({"name": "notes_delete", "arguments": {"workspaceUri": ws, "title": format!("pending-{i}")}}),
            );
            let resp = c.post(&h, body).await?;
            if !is_sse(&resp) {
                let st = resp.status();
                let b = resp.into_body().collect().await?.to_bytes();
                return Err(format!(
                    "request {i}: not parked (HTTP {st}): {}",
                    String::from_utf8_lossy(&b)
                )
                .into());
            }
            let mut permit = Some(permit);
            let mut replies = Vec::new();
            let response = read_sse(
                resp,
                |live| {
                    let reply = accept_reply(&live).ok()?;
                    let _ = parked_tx.send((i, reply));
                    permit.take();
                    None
                },
                &mut replies,
            )
            .await?;
            let r = response.ok_or_else(|| format!("request {i}: stream ended without a response"))?;
            if let Some(e) = r.get("error") {
                return Err(format!("request {i}: {e}").into());
            }
            check_deleted(&r["result"])?;
            Ok::<_, BoxError>(i)
        });
    }
    drop(parked_tx);
    let mut replies: Vec<(usize, Bytes)> = Vec::with_capacity(n);
    let park_deadline = Instant::now() + Duration::from_secs(180);
    while replies.len() < n {
        match tokio::time::timeout_at(park_deadline.into(), parked_rx.recv()).await {
            Ok(Some(r)) => replies.push(r),
            Ok(None) => break,
            Err(_) => break,
        }
        // A stream task that failed before parking shows up here.
        if let Some(Ok(Err(e))) = streams.try_join_next() {
            return Err(e);
        }
    }
    let park_secs = park_start.elapsed().as_secs_f64();
    if replies.len() < n {
        return Err(format!("pending: only {} of {n} requests parked", replies.len()).into());
    }
    let rss_parked = settle_rss(&gateway).await?;
    eprintln!(
        "  {n} parked in {park_secs:.1} s; RSS {:.1} MiB; answering",
        rss_parked as f64 / 1048576.0
    );
    // Answer them all, 64 at a time on pooled connections, and time the drain.
    let drain_start = Instant::now();
    let replies = Arc::new(std::sync::Mutex::new(replies));
    let mut answerers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let replies = replies.clone();
        let sessions = sessions.clone();
        let addr = gateway.addr;
        answerers.spawn(async move {
            let mut c = Conn::open(addr).await?;
            let mut refused = 0usize;
            loop {
                let next = replies.lock().map_err(|_| "poisoned")?.pop();
                let Some((i, reply)) = next else {
                    return Ok::<_, BoxError>(refused);
                };
                let h = legacy_headers(&sessions[i % sessions.len()]);
                let r = c.post(&h, reply).await?;
                let st = r.status();
                r.into_body().collect().await?;
                if st != StatusCode::ACCEPTED {
                    refused += 1;
                }
            }
        });
    }
    let mut refused = 0;
    while let Some(r) = answerers.join_next().await {
        refused += r??;
    }
    let answered_secs = drain_start.elapsed().as_secs_f64();
    let mut completed = 0usize;
    let mut errors = Vec::new();
    let drain_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match tokio::time::timeout_at(drain_deadline.into(), streams.join_next()).await {
            Ok(Some(Ok(Ok(_)))) => completed += 1,
            Ok(Some(Ok(Err(e)))) => errors.push(e.to_string()),
            Ok(Some(Err(e))) => errors.push(e.to_string()),
            Ok(None) => break,
            Err(_) => {
                errors.push("timed out waiting for the streams to finish".into());
                streams.abort_all();
                break;
            }
        }
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let after = store.count(&ws).map_err(|e| e.to_string())?;
    let rss_after = settle_rss(&gateway).await?;
    eprintln!(
        "  drained in {drain_secs:.2} s: {completed}/{n} completed, {} errors, store {before} → {after}",
        errors.len()
    );
    let ok = completed == n && errors.is_empty() && refused == 0 && after == before;
    report.pending_ok = Some(ok);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 4. Pending rounds: {n} legacy requests parked on an unanswered elicitation ({} sessions × {})\n",
        sessions.len(),
        n.div_ceil(sessions.len())
    );
    let _ = writeln!(md, "| measure | value |");
    let _ = writeln!(md, "|---|---:|");
    let rows: Vec<(&str, String)> = vec![
        (
            "gateway RSS before sessions",
            format!("{:.1} MiB", rss0 as f64 / 1048576.0),
        ),
        (
            "gateway RSS with sessions, nothing pending",
            format!("{:.1} MiB", rss_sessions as f64 / 1048576.0),
        ),
        (
            "gateway RSS with all rounds pending",
            format!("{:.1} MiB", rss_parked as f64 / 1048576.0),
        ),
        (
            "bytes per pending round (vs sessions only)",
            format!(
                "{:.0}",
                (rss_parked as f64 - rss_sessions as f64) / n as f64
            ),
        ),
        ("time to park all", format!("{park_secs:.2} s")),
        ("time to post all answers", format!("{answered_secs:.2} s")),
        (
            "time to drain (first answer posted → last response)",
            format!("{drain_secs:.2} s"),
        ),
        (
            "completed / errors / refused replies",
            format!("{completed} / {} / {refused}", errors.len()),
        ),
        (
            "notes left of those parked (store check)",
            format!("{}", after.saturating_sub(before)),
        ),
        (
            "gateway RSS after drain",
            format!("{:.1} MiB", rss_after as f64 / 1048576.0),
        ),
    ];
    for (k, v) in &rows {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    if let Some(e) = errors.first() {
        let _ = writeln!(md, "\nfirst error: `{e}`");
    }
    report.add(
        "pending",
        md,
        json!({"requests": n, "sessions": sessions.len(), "rss_before_sessions": rss0,
               "rss_sessions": rss_sessions, "rss_parked": rss_parked, "rss_after": rss_after,
               "park_seconds": park_secs, "answer_seconds": answered_secs, "drain_seconds": drain_secs,
               "completed": completed, "errors": errors.len(), "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
               "refused_replies": refused, "store_before": before, "store_after": after, "ok": ok}),
    );
    Ok(())
}
