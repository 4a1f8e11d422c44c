//! Scenario `store`: the modern MRTR flow on SQLite vs PostgreSQL.

use crate::*;

/// A throw-away PostgreSQL cluster (PostgreSQL's durable defaults) for `scenario`, and
/// the URL of a new database `db` on it.
pub(crate) fn pg_database(scenario: &str, db: &str) -> Res<(pg_cluster::PgCluster, String)> {
    eprintln!(
        "bench: {scenario}: starting a PostgreSQL cluster (load {})",
        load_avg()
    );
    let cluster = pg_cluster::PgCluster::start_with(pg_cluster::Durability::Durable)?;
    let url = cluster.create_database(db)?;
    Ok((cluster, url))
}

/// The modern MRTR flow (create, delete round 1, accepted retry: two store writes and
/// a nonce claim) on SQLite vs PostgreSQL, one instance each, flows alternating.
pub(crate) async fn store(env: &Env, opts: &Opts, sqlite: &Proc, report: &mut Report) -> Res<()> {
    let (cluster, url) = pg_database("store", "bench")?;
    let postgres = env.server_on(&url, "postgres")?;
    let mut conns = [
        Conn::open(sqlite.addr).await?,
        Conn::open(postgres.addr).await?,
    ];
    let ws = env.scratch_uri.clone();
    let secs = (opts.secs * 2.0).max(0.5);
    let mut counter = 0u64;
    for c in &mut conns {
        counter += 1;
        modern_flow(c, &ws, &format!("store-{counter}")).await?;
    }
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut lats: [Vec<f64>; 2] = Default::default();
    let mut ratios = Vec::new();
    for round in 0..opts.rounds {
        let mut busy = [0.0f64; 2];
        let mut ns: [Vec<f64>; 2] = Default::default();
        let end = Instant::now() + Duration::from_secs_f64(secs * 2.0);
        let mut turn = 0usize;
        while Instant::now() < end && turn < 100_000 {
            for k in 0..2 {
                let v = (turn + k) % 2;
                counter += 1;
                let t0 = Instant::now();
                modern_flow(&mut conns[v], &ws, &format!("store-{counter}")).await?;
                let took = t0.elapsed().as_secs_f64();
                busy[v] += took;
                ns[v].push(took * 1e6);
            }
            turn += 1;
        }
        let this = [0, 1].map(|v| ns[v].len() as f64 / busy[v].max(1e-9));
        for v in 0..2 {
            rates[v].push(this[v]);
            lats[v].push(median(&ns[v]));
        }
        ratios.push(this[1] / this[0]);
        eprintln!(
            "  round {}: SQLite {:>6.1} flows/s  PostgreSQL {:>6.1}",
            round + 1,
            this[0],
            this[1]
        );
    }
    let rate = [0, 1].map(|v| median(&rates[v]));
    let ratio = median(&ratios);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### 5. Store engines: the modern MRTR flow (notes_create, notes_delete, accepted retry) on one instance each, flows alternating one by one ({} rounds × {} s)\n",
        opts.rounds,
        secs * 2.0
    );
    let _ = writeln!(md, "| store | flows/s | median flow µs |");
    let _ = writeln!(md, "|---|---:|---:|");
    for (v, name) in [
        "SQLite (WAL, synchronous commits)",
        "PostgreSQL (local cluster, durable defaults)",
    ]
    .iter()
    .enumerate()
    {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_f(rate[v], 1),
            fmt_f(median(&lats[v]), 0)
        );
    }
    let _ = writeln!(
        md,
        "\nPostgreSQL/SQLite (median of per-round ratios): **{}**",
        fmt_f(ratio, 3)
    );
    report.add(
        "store",
        md,
        json!({"sqlite_flows_per_s": rate[0], "postgres_flows_per_s": rate[1], "ratio": ratio,
               "per_round_sqlite": rates[0], "per_round_postgres": rates[1],
               "median_flow_us_sqlite": median(&lats[0]), "median_flow_us_postgres": median(&lats[1])}),
    );
    drop(conns);
    drop(postgres);
    drop(cluster);
    Ok(())
}
