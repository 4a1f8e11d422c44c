//! The vector files against their published format: every vector validates against
//! the versioned JSON Schema (`adapters/vectors/schema/vector-1.schema.json`) and
//! parses with the kit's own reader; the two agree on what they refuse; and every
//! spec reference names a page and a heading that exist in the spec text beside the
//! repository (`../shared/spec`).

use dualera_kit::format;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema() -> jsonschema::Validator {
    let path = root().join("adapters/vectors/schema/vector-1.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the schema")).expect("JSON");
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

fn vector_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("adapters/vectors"))
        .expect("the vector folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 30,
        "the full vector set, found {}",
        files.len()
    );
    files
}

/// The reverse-direction vectors (`adapters/vectors/reverse/`).
fn reverse_vector_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("adapters/vectors/reverse"))
        .expect("the reverse vector folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 15,
        "the reverse vector set, found {}",
        files.len()
    );
    files
}

#[test]
fn every_vector_validates_against_the_schema_and_parses() {
    let validator = schema();
    let mut bad = Vec::new();
    for f in vector_files().into_iter().chain(reverse_vector_files()) {
        let text = std::fs::read_to_string(&f).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        if !errors.is_empty() {
            bad.push(format!("{}: {}", f.display(), errors.join("; ")));
        }
        let name = f.file_stem().unwrap().to_string_lossy();
        if let Err(e) = format::parse(&name, &text) {
            bad.push(e.to_string());
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Vectors the schema and the reader must both refuse.
#[test]
fn schema_and_reader_refuse_the_same_mistakes() {
    let validator = schema();
    let base = json!({"description": "d", "row": "r", "steps": [{"from": "timer", "at": 1}]});
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut with = |what: &'static str, f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        cases.push((what, v));
    };
    with("unknown top-level key", &|v| v["steps_"] = json!([]));
    with("no steps", &|v| v["steps"] = json!([]));
    with("unknown step key", &|v| v["steps"][0]["expct"] = json!([]));
    with("timer without at", &|v| {
        v["steps"][0] = json!({"from": "timer"})
    });
    with("unknown from", &|v| {
        v["steps"][0] = json!({"from": "host", "message": {}})
    });
    with("unknown driver action", &|v| {
        v["steps"][0] = json!({"from": "driver", "action": "dance"})
    });
    with("upstream message and lost", &|v| {
        v["steps"][0] = json!({"from": "upstream", "message": {}, "lost": "$up1"})
    });
    with(
        "peer output without stream",
        &|v| {
            v["steps"][0] =
                json!({"from": "peer", "message": {}, "expect": [{"to": "peer", "message": {}}]})
        },
    );
    with(
        "bad stream",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {}, "expect": [{"to": "peer", "stream": "s", "message": {}}]}),
    );
    with(
        "bad status",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {}, "http": {"status": "2x"}}),
    );
    with("http on a timer", &|v| {
        v["steps"][0]["http"] = json!({"status": 202})
    });
    with("unknown transport", &|v| {
        v["transports"] = json!(["websocket"])
    });
    with("unknown setting", &|v| {
        v["config"] = json!({"max_round": 2})
    });
    with("bad spec reference", &|v| v["spec"] = json!(["lifecycle"]));
    with("batch name not a placeholder", &|v| {
        v["steps"][0] = json!({"from": "peer", "message": [], "batch": "b1"})
    });
    with("host headers on a timer", &|v| {
        v["steps"][0]["host_headers"] = json!({"Authorization": "Bearer a"})
    });
    with(
        "a host header the runner sends",
        &|v| {
            v["steps"][0] =
                json!({"from": "peer", "message": {}, "host_headers": {"MCP-Session-Id": "s"}})
        },
    );
    with(
        "a host header value not a string",
        &|v| {
            v["steps"][0] =
                json!({"from": "peer", "message": {}, "host_headers": {"Authorization": 1}})
        },
    );
    with(
        "a 401 carrying a message",
        &|v| v["steps"][0] = json!({"from": "upstream", "message": {"jsonrpc": "2.0", "id": 1, "result": {}}, "http": {"status": 401}}),
    );
    with(
        "a late reply written as a refusal",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {"jsonrpc": "2.0", "id": "$l1", "result": {}}, "error": "LateReply"}),
    );
    with(
        "dropped and error",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {"jsonrpc": "2.0", "id": "$l1", "result": {}}, "dropped": "late", "error": "UnknownReply"}),
    );
    with(
        "a request dropped",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {"jsonrpc": "2.0", "id": 1, "method": "ping"}, "dropped": "late"}),
    );
    with("dropped on a timer", &|v| {
        v["steps"][0]["dropped"] = json!("late")
    });
    with(
        "unknown dropped kind",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {"jsonrpc": "2.0", "id": "$l1", "result": {}}, "dropped": "stale"}),
    );
    with(
        "status and status?",
        &|v| {
            v["steps"][0] =
                json!({"from": "peer", "message": {}, "http": {"status": 429, "status?": 429}})
        },
    );
    with(
        "status? as a class",
        &|v| v["steps"][0] = json!({"from": "peer", "message": {}, "http": {"status?": "4xx"}}),
    );
    with("unknown direction", &|v| v["direction"] = json!("sideways"));
    with("a forward setting in a reverse vector", &|v| {
        v["direction"] = json!("reverse");
        v["config"] = json!({"max_batch_len": 2});
    });
    with("a reverse setting in a forward vector", &|v| {
        v["config"] = json!({"retry_wait_ms": 2})
    });
    for (what, v) in cases {
        assert!(!validator.is_valid(&v), "the schema accepts: {what}");
        assert!(
            format::parse("t", &v.to_string()).is_err(),
            "the reader accepts: {what}"
        );
    }
    let denial = json!({"description": "d", "row": "r", "steps": [
        {"from": "peer", "message": {}, "host_headers": {"Authorization": "Bearer a", "X-Trace": null}},
        {"from": "upstream", "lost": "$up1", "http": {"status": 401, "headers": {"WWW-Authenticate": "Bearer"}}}
    ]});
    assert!(validator.is_valid(&denial));
    let dropped = json!({"description": "d", "row": "r", "steps": [
        {"from": "peer", "message": {"jsonrpc": "2.0", "id": "$l1", "error": {"code": -32800, "message": "cancelled"}}, "dropped": "late", "http": {"status": 202}},
        {"from": "peer", "message": {"jsonrpc": "2.0", "id": "$l1", "result": {}}, "dropped": "duplicate"}
    ]});
    assert!(validator.is_valid(&dropped));
    assert!(format::parse("t", &dropped.to_string()).is_ok());
    assert!(format::parse("t", &denial.to_string()).is_ok());
    assert!(validator.is_valid(&base));
    assert!(format::parse("t", &base.to_string()).is_ok());
    let mut reverse = base.clone();
    reverse["direction"] = json!("reverse");
    reverse["config"] = json!({"retry_wait_ms": 2, "public_cache": true});
    assert!(validator.is_valid(&reverse));
    assert!(format::parse("t", &reverse.to_string()).is_ok());
}

/// GitHub-style heading anchors, as the spec site uses.
fn slug(heading: &str) -> String {
    let cleaned: String = heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == ' ' || *c == '-')
        .collect();
    cleaned.replace(' ', "-")
}

#[test]
fn spec_references_name_real_pages_and_headings() {
    let spec = root().join("../shared/spec");
    assert!(
        spec.is_dir(),
        "the spec text is expected at {}",
        spec.display()
    );
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in vector_files().into_iter().chain(reverse_vector_files()) {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        for r in v["spec"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap();
            let (page, anchor) = r.split_once('#').map_or((r, None), |(p, a)| (p, Some(a)));
            let (revision, path) = page.split_once('/').unwrap();
            let folder = spec.join(revision);
            if !folder.is_dir() {
                // Only the revisions the project works from are kept beside it.
                continue;
            }
            let file = folder.join("pages").join(format!("{path}.mdx"));
            let Ok(text) = std::fs::read_to_string(&file) else {
                bad.push(format!("{}: no page {}", f.display(), file.display()));
                continue;
            };
            if let Some(anchor) = anchor {
                let found = text
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .map(|l| slug(l.trim_start_matches('#')))
                    .any(|s| s == anchor);
                if !found {
                    bad.push(format!("{}: {r}: no heading #{anchor}", f.display()));
                }
            }
            checked += 1;
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked >= 50, "only {checked} references were checked");
}

/// The README's counts of vectors (all of them, and those that apply over each wire)
/// are the folder's.
#[test]
fn the_readme_counts_are_the_folders() {
    let files = vector_files();
    let (mut http, mut stdio) = (0, 0);
    for f in &files {
        let name = f.file_stem().unwrap().to_string_lossy();
        let v = format::parse(&name, &std::fs::read_to_string(f).unwrap()).expect("parses");
        http += usize::from(v.transports.includes(format::Transport::StreamableHttp));
        stdio += usize::from(v.transports.includes(format::Transport::Stdio));
    }
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for said in [
        format!("The {} transcript vectors", files.len()),
        format!("dualera passes all {http} vectors that apply over Streamable HTTP and all {stdio} over stdio"),
        format!(
            "has its own {} vectors in",
            reverse_vector_files().len()
        ),
    ] {
        assert!(flat.contains(&said), "README.md should say: {said}");
    }
}
