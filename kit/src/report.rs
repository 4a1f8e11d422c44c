//! Scores and how they are shown: a text table for the terminal, Markdown for the
//! README, JUnit XML for CI.

use crate::matching;
use serde_json::Value;
use std::fmt::Write as _;

/// The result of one vector against one bridge.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The vector's name.
    pub name: String,
    /// The legacy revision it negotiates.
    pub revision: Option<String>,
    /// The era-translation row.
    pub row: String,
    /// Pass, fail or not applicable.
    pub verdict: Verdict,
    /// Parts of the vector that this wire cannot show (skipped, each named).
    pub notes: Vec<String>,
    /// Wall-clock time spent.
    pub millis: u64,
}

/// How a vector ended.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Every output matched.
    Pass,
    /// The first difference.
    Fail(Difference),
    /// The vector does not apply to this bridge or wire (the reason).
    NotApplicable(String),
}

/// The first place where the bridge did something other than the vector says.
#[derive(Debug, Clone)]
pub struct Difference {
    /// The step (index in the file), if the difference belongs to one.
    pub step: Option<usize>,
    /// One line saying what differs.
    pub summary: String,
    /// What the vector expected (placeholders filled in where bound).
    pub expected: Option<Value>,
    /// What the bridge did.
    pub actual: Option<Value>,
    /// More context (e.g. the bridge's stderr).
    pub context: Option<String>,
}

impl Difference {
    /// A difference without values to compare.
    pub fn plain(step: Option<usize>, summary: impl Into<String>) -> Self {
        Self {
            step,
            summary: summary.into(),
            expected: None,
            actual: None,
            context: None,
        }
    }

    /// The summary with its step.
    pub fn headline(&self) -> String {
        match self.step {
            Some(s) => format!("step {s}: {}", self.summary),
            None => self.summary.clone(),
        }
    }

    /// The difference as a line diff (`-` expected, `+` actual).
    pub fn diff(&self) -> String {
        if self.expected.is_none() && self.actual.is_none() {
            return String::new();
        }
        matching::diff(self.expected.as_ref(), self.actual.as_ref())
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was tested (the bridge command or URL) and over which wire.
    pub bridge: String,
    /// The wire (`streamable-http`, `stdio`).
    pub transport: String,
    /// `strict` or `lenient`.
    pub mode: String,
    /// One per vector, in order.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// (passed, failed, not applicable).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for o in &self.outcomes {
            match o.verdict {
                Verdict::Pass => c.0 += 1,
                Verdict::Fail(_) => c.1 += 1,
                Verdict::NotApplicable(_) => c.2 += 1,
            }
        }
        c
    }

    /// Whether any vector failed.
    pub fn failed(&self) -> bool {
        self.counts().1 > 0
    }

    /// The closing line: `N passed, M failed, K not applicable`.
    pub fn summary(&self) -> String {
        let (p, f, n) = self.counts();
        format!("{p} passed, {f} failed, {n} not applicable")
    }

    /// A fixed-width table, then the diff of every failure.
    pub fn text(&self) -> String {
        let rows: Vec<[String; 4]> = self
            .outcomes
            .iter()
            .map(|o| {
                [
                    o.name.clone(),
                    o.revision.clone().unwrap_or_else(|| "-".into()),
                    result_word(o),
                    first_difference(o, 100),
                ]
            })
            .collect();
        let head = ["vector", "revision", "result", "first difference"];
        let mut width = head.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = format!(
            "bridge: {} ({}, {} matching)\n\n",
            self.bridge, self.transport, self.mode
        );
        let line = |cells: [&str; 4], out: &mut String| {
            for (i, c) in cells.iter().enumerate() {
                if i == 3 {
                    out.push_str(c);
                } else {
                    let _ = write!(out, "{c:<w$}  ", w = width[i]);
                }
            }
            out.push('\n');
        };
        line(head, &mut out);
        line(
            [
                &"-".repeat(width[0]),
                &"-".repeat(width[1]),
                &"-".repeat(width[2]),
                &"-".repeat(16),
            ],
            &mut out,
        );
        for r in &rows {
            line([&r[0], &r[1], &r[2], &r[3]], &mut out);
        }
        for o in &self.outcomes {
            if let Verdict::Fail(d) = &o.verdict {
                let _ = write!(out, "\n{} — {}\n", o.name, d.headline());
                out.push_str(&d.diff());
                if let Some(c) = &d.context {
                    let _ = writeln!(out, "{c}");
                }
            }
        }
        let _ = write!(out, "\n{}\n", self.summary());
        out
    }

    /// A Markdown table, then a `diff` block per failure.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Bridge: `{}` over {} ({} matching). {}.\n",
            self.bridge,
            self.transport,
            self.mode,
            self.summary()
        );
        out.push_str("| vector | revision | result | first difference |\n|---|---|---|---|\n");
        for o in &self.outcomes {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                o.name,
                o.revision.as_deref().unwrap_or("–"),
                result_word(o),
                first_difference(o, 160).replace('|', "\\|")
            );
        }
        for o in &self.outcomes {
            if let Verdict::Fail(d) = &o.verdict {
                let diff = d.diff();
                if diff.is_empty() {
                    continue;
                }
                let _ = write!(
                    out,
                    "\n<details><summary><code>{}</code>: {}</summary>\n\n```diff\n{}```\n\n</details>\n",
                    o.name,
                    xml_escape(&d.headline()),
                    diff
                );
            }
        }
        out
    }

    /// The run as JSON: `{"bridge", "transport", "mode", "outcomes": [{"name",
    /// "revision", "row", "result": "pass"|"fail"|"n/a", "difference"?, "reason"?,
    /// "notes", "millis"}]}`.
    pub fn json(&self) -> Value {
        let outcomes: Vec<Value> = self
            .outcomes
            .iter()
            .map(|o| {
                let mut v = serde_json::json!({
                    "name": o.name,
                    "revision": o.revision,
                    "row": o.row,
                    "notes": o.notes,
                    "millis": o.millis,
                });
                match &o.verdict {
                    Verdict::Pass => v["result"] = "pass".into(),
                    Verdict::Fail(d) => {
                        v["result"] = "fail".into();
                        v["difference"] = serde_json::json!({
                            "step": d.step,
                            "summary": d.summary,
                            "diff": d.diff(),
                        });
                    }
                    Verdict::NotApplicable(why) => {
                        v["result"] = "n/a".into();
                        v["reason"] = why.clone().into();
                    }
                }
                v
            })
            .collect();
        serde_json::json!({
            "bridge": self.bridge,
            "transport": self.transport,
            "mode": self.mode,
            "outcomes": outcomes,
        })
    }

    /// JUnit XML: one test case per vector, not-applicable ones as skipped.
    pub fn junit(&self) -> String {
        let (_, f, n) = self.counts();
        let total_ms: u64 = self.outcomes.iter().map(|o| o.millis).sum();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let suite = format!("transcript vectors: {} ({})", self.bridge, self.transport);
        let _ = writeln!(
            out,
            "<testsuites><testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\" skipped=\"{n}\" time=\"{:.3}\">",
            xml_escape(&suite),
            self.outcomes.len(),
            total_ms as f64 / 1000.0
        );
        for o in &self.outcomes {
            let _ = write!(
                out,
                "  <testcase classname=\"vectors.{}\" name=\"{}\" time=\"{:.3}\">",
                xml_escape(&o.row),
                xml_escape(&o.name),
                o.millis as f64 / 1000.0
            );
            match &o.verdict {
                Verdict::Pass => {}
                Verdict::Fail(d) => {
                    let mut body = d.diff();
                    if let Some(c) = &d.context {
                        body.push_str(c);
                    }
                    let _ = write!(
                        out,
                        "<failure message=\"{}\">{}</failure>",
                        xml_escape(&d.headline()),
                        xml_escape(&body)
                    );
                }
                Verdict::NotApplicable(why) => {
                    let _ = write!(out, "<skipped message=\"{}\"/>", xml_escape(why));
                }
            }
            if !o.notes.is_empty() {
                let _ = write!(
                    out,
                    "<system-out>{}</system-out>",
                    xml_escape(&o.notes.join("\n"))
                );
            }
            out.push_str("</testcase>\n");
        }
        out.push_str("</testsuite></testsuites>\n");
        out
    }
}

fn result_word(o: &Outcome) -> String {
    match &o.verdict {
        Verdict::Pass if o.notes.is_empty() => "pass".into(),
        Verdict::Pass => format!("pass ({} not on this wire)", o.notes.len()),
        Verdict::Fail(_) => "FAIL".into(),
        Verdict::NotApplicable(_) => "n/a".into(),
    }
}

fn first_difference(o: &Outcome, max: usize) -> String {
    let s = match &o.verdict {
        Verdict::Pass => String::new(),
        Verdict::Fail(d) => d.headline(),
        Verdict::NotApplicable(why) => why.clone(),
    };
    let s = s.replace('\n', " ");
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max - 1).collect::<String>())
    } else {
        s
    }
}

/// Escapes text for XML attributes and content (control characters dropped).
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report() -> Report {
        Report {
            bridge: "b".into(),
            transport: "stdio".into(),
            mode: "lenient".into(),
            outcomes: vec![
                Outcome {
                    name: "ok".into(),
                    revision: Some("2025-11-25".into()),
                    row: "initialize".into(),
                    verdict: Verdict::Pass,
                    notes: vec![],
                    millis: 5,
                },
                Outcome {
                    name: "bad<1>".into(),
                    revision: None,
                    row: "forward".into(),
                    verdict: Verdict::Fail(Difference {
                        step: Some(3),
                        summary: "output differs at .id".into(),
                        expected: Some(json!({"id": 1})),
                        actual: Some(json!({"id": 2})),
                        context: None,
                    }),
                    notes: vec![],
                    millis: 7,
                },
                Outcome {
                    name: "na".into(),
                    revision: None,
                    row: "input-required".into(),
                    verdict: Verdict::NotApplicable("assumes max_rounds = 2".into()),
                    notes: vec![],
                    millis: 0,
                },
            ],
        }
    }

    #[test]
    fn summaries_count() {
        assert_eq!(report().summary(), "1 passed, 1 failed, 1 not applicable");
        assert!(report().failed());
    }

    #[test]
    fn junit_is_escaped_and_complete() {
        let x = report().junit();
        assert!(x.contains("name=\"bad&lt;1&gt;\""), "{x}");
        assert!(
            x.contains("<failure message=\"step 3: output differs at .id\">"),
            "{x}"
        );
        assert!(
            x.contains("<skipped message=\"assumes max_rounds = 2\"/>"),
            "{x}"
        );
        assert!(
            x.contains("tests=\"3\" failures=\"1\" skipped=\"1\""),
            "{x}"
        );
    }

    #[test]
    fn tables_show_the_first_difference() {
        let t = report().text();
        assert!(t.contains("step 3: output differs at .id"), "{t}");
        assert!(t.contains("-  \"id\": 1"), "{t}");
        let m = report().markdown();
        assert!(m.contains("| `ok` | 2025-11-25 | pass |  |"), "{m}");
        assert!(m.contains("```diff"), "{m}");
    }
}
