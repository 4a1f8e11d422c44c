//! `GET /report.html`: the migration report as one server-rendered page — no script,
//! no external asset (the admin listener also forbids both with a
//! `Content-Security-Policy`), readable at a glance: one row per host, a bar per
//! legacy feature it used, the verdict in words. Every string from a host is escaped
//! here, whatever was already stripped when it was recorded.
//!
//! The markup carries `data-*` attributes (`data-host`, `data-feature`, `data-count`,
//! `data-failure`, `data-verdict`) so that tests and scrapers read counts without
//! parsing prose.

use super::{EraName, HostReport, ReportSnapshot};
use dualera_adapters::usage::{self, FailureReason, Feature, LiveKind};
use std::fmt::Write;

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bar:#0969da;--ok:#1a7f37;--modern:#0550ae;--need:#9a6700}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--fg);margin:24px;background:#fff}
h1{font-size:22px;margin:0 0 4px}
.summary{color:var(--muted);margin:0 0 16px}
.summary b{color:var(--fg)}
table{border-collapse:collapse;width:100%}
th{text-align:left;font-weight:600;color:var(--muted);border-bottom:2px solid var(--line);padding:6px 8px;white-space:nowrap}
td{border-bottom:1px solid var(--line);padding:8px;vertical-align:top}
.who{min-width:190px}.who strong{font-size:15px;overflow-wrap:anywhere}
.verdict{min-width:300px}
.dim{color:var(--muted);font-size:12px}
.seen{white-space:nowrap}
.num{text-align:right;font-variant-numeric:tabular-nums}
.feature{display:grid;grid-template-columns:170px 160px auto;gap:8px;align-items:center;margin:2px 0}
.track{background:#eef1f4;height:10px;border-radius:5px;overflow:hidden}
.fill{background:var(--bar);height:100%;border-radius:5px}
.count{font-variant-numeric:tabular-nums;white-space:nowrap}
.none{color:var(--muted)}
.failure{color:#cf222e;white-space:nowrap}
.badge{display:inline-block;border-radius:10px;padding:1px 8px;font-size:12px;font-weight:600;color:#fff;margin-bottom:4px;white-space:nowrap}
.badge.direct{background:var(--ok)}.badge.modern{background:var(--modern)}.badge.needs{background:var(--need)}
.verdict ul{margin:2px 0 0;padding-left:18px}
details summary{cursor:pointer;color:var(--muted)}
footer{margin-top:20px;color:var(--muted);font-size:12px}
";

/// The whole page.
pub fn render(report: &ReportSnapshot) -> String {
    let hosts = &report.hosts;
    let modern = hosts.iter().filter(|h| h.era == EraName::Modern).count();
    let direct = hosts
        .iter()
        .filter(|h| h.era == EraName::Legacy && h.needs.is_empty())
        .count();
    let needs = hosts.len() - modern - direct;
    // Bars are scaled to the largest feature count on the page.
    let max = hosts
        .iter()
        .flat_map(|h| h.features.values())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let mut out = String::with_capacity(4096 + hosts.len() * 2048);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>dualera migration report</title><style>{STYLE}</style></head><body>\
         <h1>Migration report</h1>\
         <p class=\"summary\" id=\"summary\"><b>{}</b> host{} · <b>{needs}</b> still need the legacy era · \
         <b>{direct}</b> can move to 2026-07-28 directly · <b>{modern}</b> already modern \
         <span class=\"dim\">— generated {}</span></p>",
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" },
        escape(&report.generated_at),
    );
    if !report.upstreams.is_empty() {
        out.push_str("<p class=\"summary\" id=\"upstreams\">Upstreams:");
        for (route, upstream) in &report.upstreams {
            let _ = write!(out, " <b>{}</b> {};", escape(route), escape(upstream));
        }
        out.push_str("</p>");
    }
    if report.folded > 0 {
        let _ = write!(
            out,
            "<p class=\"summary\">{} session(s) of further hosts are counted in the overflow row \
             (at most {} host identities are kept).</p>",
            report.folded, report.max_hosts
        );
    }
    out.push_str(
        "<table id=\"hosts\"><thead><tr><th>Host</th><th>Revision · wire</th><th>Seen</th>\
         <th class=\"num\">Sessions</th><th class=\"num\">Requests</th>\
         <th>Legacy features used</th><th>Failures</th><th>Verdict</th></tr></thead><tbody>",
    );
    if hosts.is_empty() {
        out.push_str("<tr><td colspan=\"8\" class=\"none\">No host has connected yet.</td></tr>");
    }
    for h in hosts {
        row(&mut out, h, max);
    }
    out.push_str(
        "</tbody></table><footer>Counts since the report began (kept across restarts when \
         <code>[report] path</code> is set). A feature counts once per use: per live request \
         sent, per batch, per request or notification. The verdict says what a host still needs \
         before it can talk to a 2026-07-28 server without the gateway.</footer></body></html>\n",
    );
    out
}

/// `2026-07-28T09:30:00.123Z` as `2026-07-28 09:30:00 UTC`.
fn display_time(rfc3339: &str) -> String {
    match rfc3339.get(..19) {
        Some(t) if rfc3339.ends_with('Z') => format!("{} UTC", t.replacen('T', " ", 1)),
        _ => rfc3339.to_owned(),
    }
}

fn row(out: &mut String, h: &HostReport, max: u64) {
    let (class, badge) = match (h.era, h.needs.is_empty()) {
        (EraName::Modern, _) => ("modern", usage::VERDICT_MODERN),
        (EraName::Legacy, true) => ("direct", usage::VERDICT_DIRECT),
        (EraName::Legacy, false) => ("needs", "still needs the legacy era"),
    };
    let _ =
        write!(
        out,
        "<tr class=\"host\" data-host=\"{}\" data-name=\"{}\" data-version=\"{}\" data-era=\"{}\" \
         data-revision=\"{}\" data-wire=\"{}\">",
        escape(format!("{} {}", h.name, h.version).trim_end()),
        escape(&h.name),
        escape(&h.version),
        if h.era == EraName::Modern { "modern" } else { "legacy" },
        escape(&h.revision),
        escape(&h.wire),
    );
    let _ = write!(
        out,
        "<td class=\"who\"><strong>{}</strong> {}<div class=\"dim\">route {}</div></td>",
        escape(&h.name),
        escape(&h.version),
        escape(&h.route)
    );
    let _ = write!(
        out,
        "<td>{}<div class=\"dim\">{}{}</div></td>",
        escape(&h.revision),
        escape(&h.wire),
        if h.era == EraName::Modern {
            " · pass-through"
        } else {
            ""
        }
    );
    let _ = write!(
        out,
        "<td class=\"dim seen\">first {}<br>last {}</td>",
        escape(&display_time(&h.first_seen)),
        escape(&display_time(&h.last_seen))
    );
    let sessions = if h.era == EraName::Modern {
        "—".to_owned()
    } else {
        h.sessions.to_string()
    };
    let _ = write!(
        out,
        "<td class=\"num\" data-sessions=\"{}\">{sessions}</td>",
        h.sessions
    );
    let _ = write!(
        out,
        "<td class=\"num\" data-requests=\"{}\"><details><summary>{}</summary>",
        h.request_total, h.request_total
    );
    for (method, n) in &h.requests {
        let _ = write!(
            out,
            "<div class=\"count\" data-method=\"{}\" data-count=\"{n}\">{} {n}</div>",
            escape(method),
            escape(method)
        );
    }
    out.push_str("</details></td><td>");
    let mut any = false;
    for f in Feature::ALL {
        let Some(&n) = h.features.get(f.as_str()) else {
            continue;
        };
        any = true;
        // At least a sliver, so that a feature used once still shows.
        let pct = (n.saturating_mul(100) / max).clamp(3, 100);
        let outcomes = LiveKind::ALL
            .iter()
            .find(|k| k.feature() == f)
            .and_then(|k| h.live.get(k.as_str()))
            .map(|o| {
                let parts: Vec<String> = o.iter().map(|(k, v)| format!("{v} {k}")).collect();
                format!(
                    " <span class=\"dim\">({})</span>",
                    escape(&parts.join(", "))
                )
            })
            .unwrap_or_default();
        let _ = write!(
            out,
            "<div class=\"feature\" data-feature=\"{}\" data-count=\"{n}\"><span>{}</span>\
             <span class=\"track\"><span class=\"fill\" style=\"width:{pct}%;display:block\"></span></span>\
             <span class=\"count\">{n}{outcomes}</span></div>",
            f.as_str(),
            escape(f.title())
        );
    }
    if !any {
        let none = if h.era == EraName::Modern {
            "none (2026-07-28 client)"
        } else {
            "none"
        };
        let _ = write!(out, "<span class=\"none\">{none}</span>");
    }
    out.push_str("</td><td>");
    if h.failures.is_empty() {
        out.push_str("<span class=\"none\">—</span>");
    }
    for r in FailureReason::ALL {
        if let Some(&n) = h.failures.get(r.as_str()) {
            let _ = write!(
                out,
                "<div class=\"failure\" data-failure=\"{}\" data-count=\"{n}\">{} {n}</div>",
                r.as_str(),
                escape(&r.as_str().replace('_', " "))
            );
        }
    }
    let _ = write!(
        out,
        "</td><td class=\"verdict\" data-verdict=\"{}\"><span class=\"badge {class}\">{badge}</span>",
        escape(&h.verdict),
    );
    if !h.needs.is_empty() {
        out.push_str("<ul>");
        for n in &h.needs {
            let _ = write!(out, "<li>{}</li>", escape(n));
        }
        out.push_str("</ul>");
    }
    out.push_str("</td></tr>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn host(name: &str) -> HostReport {
        HostReport {
            route: "/mcp".into(),
            era: EraName::Legacy,
            name: name.into(),
            version: "1\"><script>x</script>".into(),
            revision: "2025-11-25".into(),
            wire: "streamable-http".into(),
            first_seen: "t0".into(),
            last_seen: "t1".into(),
            first_seen_ms: 0,
            last_seen_ms: 1,
            sessions: 1,
            request_total: 2,
            requests: BTreeMap::from([("tools/call".into(), 2)]),
            features: BTreeMap::from([("sampling".into(), 2)]),
            live: BTreeMap::new(),
            failures: BTreeMap::from([("timeout".into(), 1)]),
            needs: vec!["answers sampling live: needs an MRTR-capable client".into()],
            verdict: "answers sampling live: needs an MRTR-capable client".into(),
        }
    }

    #[test]
    fn host_strings_are_escaped_everywhere() {
        let page = render(&ReportSnapshot {
            generated_at: "now".into(),
            max_hosts: 10,
            folded: 0,
            hosts: vec![host("<img src=x onerror=alert(1)>&'")],
            upstreams: [("/<b>".to_owned(), "legacy upstream (stdio)".to_owned())].into(),
        });
        assert!(page.contains("<b>/&lt;b&gt;</b> legacy upstream (stdio)"));
        assert!(!page.contains("<script>x"));
        assert!(!page.contains("<img"));
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;&amp;&#39;"));
        assert!(page.contains("data-feature=\"sampling\" data-count=\"2\""));
        assert!(page.contains("data-failure=\"timeout\" data-count=\"1\""));
        assert!(!page.contains("http://") && !page.contains("https://"));
    }
}
