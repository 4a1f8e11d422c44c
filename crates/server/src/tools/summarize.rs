//! `summarize_repo {directory, audience}`: deterministic file work inside the granted
//! directory, then two sampling rounds through MRTR (pick files, then summarize).

use super::{text_result, CallContext, Outcome, Tool};
use crate::digest::hex;
use crate::error::ServerError;
use crate::scope::Scope;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

const MAX_AUDIENCE: usize = 200;
const MAX_DEPTH: usize = 8;
const MAX_PICKS: usize = 5;
const MAX_SUMMARY: usize = 32 * 1024;
const PICK_KEY: &str = "pick_files";
const SUMMARY_KEY: &str = "summary";

/// `summarize_repo`.
#[derive(Debug)]
pub(super) struct SummarizeRepo;

/// A file found in the repository.
#[derive(Debug, Clone)]
struct Listed {
    rel: String,
    size: u64,
}

/// The repository listing, with files refused because they leave the directory.
#[derive(Debug, Default)]
struct Listing {
    files: Vec<Listed>,
    refused: Vec<String>,
}

impl Listing {
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        for f in &self.files {
            h.update(f.rel.as_bytes());
            h.update([0]);
            h.update(f.size.to_le_bytes());
        }
        hex(&h.finalize())
    }
}

impl Tool for SummarizeRepo {
    fn name(&self) -> &'static str {
        "summarize_repo"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "summarize_repo",
            "title": "Summarize a repository",
            "description": "Summarize a repository directory granted to you for an audience. \
                Asks your model (sampling) to pick representative files, then to write the summary.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "directory": {"type": "string", "description": "Absolute path or file: URI of the repository"},
                    "audience": {"type": "string", "minLength": 1, "maxLength": MAX_AUDIENCE, "description": "Who the summary is for, e.g. developer"}
                },
                "required": ["directory", "audience"],
                "additionalProperties": false
            },
            "outputSchema": {
                "type": "object",
                "properties": {
                    "directory": {"type": "string"},
                    "audience": {"type": "string"},
                    "files": {"type": "array", "items": {"type": "string"}},
                    "summary": {"type": "string"}
                },
                "required": ["directory", "audience", "files", "summary"]
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false},
            // A large repository takes a while: callers that declare the tasks
            // extension get a task (extensions/tasks/overview.mdx).
            "execution": {"taskSupport": "optional"}
        })
    }

    fn required_capabilities(&self) -> Option<Value> {
        Some(json!({ "sampling": {} }))
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        cx.only_args(&["directory", "audience"])?;
        let directory = cx.string_arg("directory", 4096)?;
        let audience = cx.string_arg("audience", MAX_AUDIENCE)?;
        let (root, dir) = authorized_directory(cx, directory)?;
        let listing = list_files(&root, &dir, cx.services.limits.max_files)?;
        if listing.files.is_empty() {
            return Ok(Outcome::Complete(text_result(
                format!("{directory} has no readable files to summarize."),
                None,
                true,
            )));
        }
        let digest = listing.digest();

        let Some(opened) = cx.open_state(self.name())? else {
            return self.ask_pick(cx, audience, &listing, &digest, 1);
        };
        if opened.data.get("listing").and_then(Value::as_str) != Some(digest.as_str()) {
            return Err(ServerError::params(
                "the repository changed since the previous round; start again",
            ));
        }
        let next_round = opened.round + 1;
        if next_round > cx.services.limits.max_rounds {
            return Err(ServerError::params(format!(
                "summarize_repo takes at most {} rounds",
                cx.services.limits.max_rounds
            )));
        }
        match opened.phase.as_str() {
            "pick_files" => {
                let Some(reply) = cx.input_response(PICK_KEY) else {
                    return self.ask_pick(cx, audience, &listing, &digest, next_round);
                };
                let picks = parse_picks(&sampling_text(reply, PICK_KEY)?, &listing)?;
                self.ask_summary(cx, audience, (&root, &dir), &picks, &digest, next_round)
            }
            "summary" => {
                let picks = opened.strings("files");
                let Some(reply) = cx.input_response(SUMMARY_KEY) else {
                    return self.ask_summary(
                        cx,
                        audience,
                        (&root, &dir),
                        &picks,
                        &digest,
                        next_round,
                    );
                };
                let summary = sampling_text(reply, SUMMARY_KEY)?;
                let summary = summary.trim();
                if summary.is_empty() || summary.len() > MAX_SUMMARY {
                    return Err(ServerError::params(format!(
                        "the summary must be non-empty text of at most {MAX_SUMMARY} bytes"
                    )));
                }
                let shown_dir = dir.to_path().display().to_string();
                Ok(Outcome::Complete(text_result(
                    format!(
                        "Summary of {shown_dir} for {audience} (from {}):\n\n{summary}",
                        picks.join(", ")
                    ),
                    Some(json!({
                        "directory": shown_dir,
                        "audience": audience,
                        "files": picks,
                        "summary": summary,
                    })),
                    false,
                )))
            }
            _ => Err(ServerError::params("requestState belongs to another step")),
        }
    }
}

impl SummarizeRepo {
    fn ask_pick(
        &self,
        cx: &CallContext<'_>,
        audience: &str,
        listing: &Listing,
        digest: &str,
        round: u32,
    ) -> Result<Outcome, ServerError> {
        let budget = cx.services.limits.sampling_bytes_per_round;
        let mut list = String::new();
        for f in &listing.files {
            let line = format!("{} ({} bytes)\n", f.rel, f.size);
            if list.len() + line.len() > budget {
                break;
            }
            list.push_str(&line);
        }
        let text = format!(
            "Choose up to {MAX_PICKS} files that best show what this repository is, for a \
             {audience} audience. Reply with only a JSON array of paths from this list:\n\n{list}"
        );
        let state = cx.seal_state(
            self.name(),
            "pick_files",
            round,
            json!({ "listing": digest }),
        )?;
        Ok(sampling_round(
            PICK_KEY,
            text,
            cx.services.limits.sampling_max_tokens.min(400),
            state,
        ))
    }

    fn ask_summary(
        &self,
        cx: &CallContext<'_>,
        audience: &str,
        (root, dir): (&Path, &Scope),
        picks: &[String],
        digest: &str,
        round: u32,
    ) -> Result<Outcome, ServerError> {
        let budget = cx.services.limits.sampling_bytes_per_round;
        let per_file = budget / picks.len().max(1);
        let mut body = String::new();
        for rel in picks {
            let path = dir.to_path().join(rel);
            let content = read_capped(
                root,
                &path,
                per_file as u64,
                cx.services.limits.max_file_bytes,
            )
            .map_err(|e| ServerError::params(format!("cannot read {rel}: {e}")))?;
            body.push_str(&format!("=== {rel} ===\n{content}\n\n"));
        }
        let text = format!(
            "Write a short summary of this repository for a {audience} audience, based on \
             these files.\n\n{body}"
        );
        let state = cx.seal_state(
            self.name(),
            "summary",
            round,
            json!({ "listing": digest, "files": picks }),
        )?;
        Ok(sampling_round(
            SUMMARY_KEY,
            text,
            cx.services.limits.sampling_max_tokens,
            state,
        ))
    }
}

fn sampling_round(key: &str, text: String, max_tokens: u32, state: String) -> Outcome {
    let mut input_requests = Map::new();
    input_requests.insert(
        key.to_owned(),
        json!({
            "method": "sampling/createMessage",
            "params": {
                "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
                "systemPrompt": "Return only the requested value.",
                "modelPreferences": { "costPriority": 0.8, "intelligencePriority": 0.2 },
                "includeContext": "none",
                "maxTokens": max_tokens
            }
        }),
    );
    Outcome::InputRequired {
        input_requests,
        request_state: Some(state),
    }
}

/// The text of a `CreateMessageResult` (content block or array of blocks).
fn sampling_text(reply: &Value, key: &str) -> Result<String, ServerError> {
    let bad = || {
        ServerError::params(format!(
            "inputResponses.{key} must be a CreateMessageResult with text content"
        ))
    };
    let content = reply.get("content").ok_or_else(bad)?;
    let blocks: Vec<&Value> = match content {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    let mut text = String::new();
    for b in blocks {
        if b.get("type").and_then(Value::as_str) == Some("text") {
            text.push_str(b.get("text").and_then(Value::as_str).ok_or_else(bad)?);
        }
    }
    if text.is_empty() {
        return Err(bad());
    }
    Ok(text)
}

/// The model's pick: a JSON array of distinct listed paths.
fn parse_picks(text: &str, listing: &Listing) -> Result<Vec<String>, ServerError> {
    let value: Value = dualera_adapters::json::parse(text.trim().as_bytes())
        .map_err(|_| ServerError::params("the pick_files reply is not a JSON array of paths"))?;
    let arr = value
        .as_array()
        .ok_or_else(|| ServerError::params("the pick_files reply is not a JSON array of paths"))?;
    if arr.is_empty() || arr.len() > MAX_PICKS {
        return Err(ServerError::params(format!(
            "the pick_files reply must name 1 to {MAX_PICKS} files"
        )));
    }
    let mut picks: Vec<String> = Vec::new();
    for v in arr {
        let p = v
            .as_str()
            .ok_or_else(|| ServerError::params("the pick_files reply must contain only strings"))?;
        if !listing.files.iter().any(|f| f.rel == p) {
            return Err(ServerError::params(format!(
                "the pick_files reply names {p:?}, which is not a listed file"
            )));
        }
        if !picks.iter().any(|q| q == p) {
            picks.push(p.to_owned());
        }
    }
    Ok(picks)
}

/// The granted root and the requested directory, both real (symlinks resolved), the
/// directory inside the root.
fn authorized_directory(
    cx: &CallContext<'_>,
    directory: &str,
) -> Result<(PathBuf, Scope), ServerError> {
    let scope = Scope::from_path_or_uri(directory)
        .map_err(|e| ServerError::params(format!("directory: {e}")))?;
    let granted = cx
        .services
        .access
        .repository_for(cx.principal, &scope)
        .ok_or_else(|| {
            ServerError::params(format!(
                "directory {directory:?} is not inside any repository granted to this caller"
            ))
        })?;
    let root = fs::canonicalize(granted.to_path())
        .map_err(|e| ServerError::params(format!("granted repository is not readable: {e}")))?;
    let real = fs::canonicalize(scope.to_path()).map_err(|e| {
        ServerError::params(format!("directory {directory:?} is not readable: {e}"))
    })?;
    if !real.starts_with(&root) || !real.is_dir() {
        return Err(ServerError::params(format!(
            "directory {directory:?} resolves outside the granted repository"
        )));
    }
    let real_scope = Scope::from_fs_path(&real).map_err(|e| ServerError::params(e.to_string()))?;
    Ok((root, real_scope))
}

/// Lists regular files under `dir` (depth- and count-bounded, sorted), refusing any
/// symlink whose target leaves `root`.
fn list_files(root: &Path, dir: &Scope, max_files: usize) -> Result<Listing, ServerError> {
    let mut out = Listing::default();
    let base = dir.to_path();
    let mut stack = vec![(base.clone(), 0usize)];
    let mut visited = 0usize;
    while let Some((d, depth)) = stack.pop() {
        visited += 1;
        if visited > 10_000 {
            break;
        }
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let path = e.path();
            let Ok(rel) = path.strip_prefix(&base) else {
                continue;
            };
            let rel = rel.to_string_lossy().into_owned();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let (is_dir, is_file, size) = if meta.file_type().is_symlink() {
                match fs::canonicalize(&path) {
                    Ok(target) if target.starts_with(root) => {
                        let m = fs::metadata(&target).ok();
                        (
                            false,
                            m.as_ref().is_some_and(|m| m.is_file()),
                            m.map_or(0, |m| m.len()),
                        )
                    }
                    _ => {
                        tracing::warn!(file = %rel, "symlink leaves the repository; refused");
                        out.refused.push(rel);
                        continue;
                    }
                }
            } else {
                (meta.is_dir(), meta.is_file(), meta.len())
            };
            if is_dir && depth < MAX_DEPTH {
                stack.push((path, depth + 1));
            } else if is_file && out.files.len() < max_files {
                out.files.push(Listed { rel, size });
            }
        }
    }
    out.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Reads at most `cap` bytes (and never more than `max_file`), as lossy UTF-8, after
/// checking again that the file's real path is inside `root` (it may have changed
/// into a symlink since it was listed).
fn read_capped(root: &Path, path: &Path, cap: u64, max_file: u64) -> std::io::Result<String> {
    let real = fs::canonicalize(path)?;
    if !real.starts_with(root) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the file now resolves outside the granted repository",
        ));
    }
    let f = fs::File::open(real)?;
    let mut buf = Vec::new();
    f.take(cap.min(max_file)).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
