//! `dualera report`: the migration report as a table for a terminal. The JSON it is
//! built from came over the network, so every string is sanitized again here (no
//! control character, hence no terminal escape sequence, reaches the screen).

use super::{sanitize, EraName, ReportSnapshot};
use dualera_adapters::usage::{Feature, LiveKind};
use std::fmt::Write;

fn cell(s: &str, width: usize) -> String {
    let s = sanitize(s, width);
    let pad = width.saturating_sub(s.chars().count());
    format!("{s}{}", " ".repeat(pad))
}

/// The report as lines of text: a header, one row per host, then its features,
/// failures and what it still needs, indented under it.
pub fn render(report: &ReportSnapshot) -> String {
    let mut out = String::new();
    let hosts = &report.hosts;
    let _ = writeln!(
        out,
        "Migration report, {} ({} host{})",
        sanitize(&report.generated_at, 40),
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" }
    );
    if hosts.is_empty() {
        out.push_str("No host has connected yet.\n");
        upstreams(&mut out, report);
        return out;
    }
    let _ = writeln!(
        out,
        "{} {} {} {} {} {:>8} {:>8}  VERDICT",
        cell("HOST", 28),
        cell("VERSION", 12),
        cell("ERA", 6),
        cell("REVISION", 10),
        cell("WIRE", 15),
        "SESSIONS",
        "REQUESTS"
    );
    for h in hosts {
        let verdict = if h.needs.is_empty() {
            sanitize(&h.verdict, 80)
        } else {
            format!(
                "needs {} change{}",
                h.needs.len(),
                if h.needs.len() == 1 { "" } else { "s" }
            )
        };
        let sessions = match h.era {
            EraName::Modern => "-".to_owned(),
            EraName::Legacy => h.sessions.to_string(),
        };
        let _ = writeln!(
            out,
            "{} {} {} {} {} {:>8} {:>8}  {verdict}",
            cell(&h.name, 28),
            cell(&h.version, 12),
            cell(
                if h.era == EraName::Modern {
                    "modern"
                } else {
                    "legacy"
                },
                6
            ),
            cell(&h.revision, 10),
            cell(&h.wire, 15),
            sessions,
            h.request_total
        );
        let features: Vec<String> = Feature::ALL
            .iter()
            .filter_map(|f| {
                let n = h.features.get(f.as_str())?;
                let outcomes = LiveKind::ALL
                    .iter()
                    .find(|k| k.feature() == *f)
                    .and_then(|k| h.live.get(k.as_str()))
                    .map(|o| {
                        let parts: Vec<String> = o
                            .iter()
                            .map(|(k, v)| format!("{v} {}", sanitize(k, 16)))
                            .collect();
                        format!(" ({})", parts.join(", "))
                    })
                    .unwrap_or_default();
                Some(format!("{} {n}{outcomes}", f.title()))
            })
            .collect();
        if !features.is_empty() {
            let _ = writeln!(out, "    used:     {}", features.join(", "));
        }
        if !h.failures.is_empty() {
            let failures: Vec<String> = h
                .failures
                .iter()
                .map(|(k, v)| format!("{} {v}", sanitize(k, 32).replace('_', " ")))
                .collect();
            let _ = writeln!(out, "    failures: {}", failures.join(", "));
        }
        for need in &h.needs {
            let _ = writeln!(out, "    needs:    {}", sanitize(need, 160));
        }
    }
    if report.folded > 0 {
        let _ = writeln!(
            out,
            "({} session(s) of further hosts are in the overflow row: at most {} identities are kept)",
            report.folded, report.max_hosts
        );
    }
    upstreams(&mut out, report);
    out
}

/// A line per route whose upstream is a legacy server, after the table (which keeps
/// its place for readers that find it by line).
fn upstreams(out: &mut String, report: &ReportSnapshot) {
    for (route, upstream) in &report.upstreams {
        let _ = writeln!(
            out,
            "Upstream of {}: {}",
            sanitize(route, 256),
            sanitize(upstream, 80)
        );
    }
}
