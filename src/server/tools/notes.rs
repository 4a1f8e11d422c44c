//! `notes_create`, `notes_list` (with the roots migration adapter) and `notes_delete`
//! (form elicitation through MRTR, single-use signed confirmation).

use super::{text_result, CallContext, Outcome, Tool};
use crate::server::error::ServerError;
use crate::server::scope::Scope;
use crate::server::store::{DeleteOutcome, LiveCheck, NonceClaim, Note, NoteStore, ReplayStore};
use serde_json::{json, Map, Value};

const MAX_TITLE: usize = 512;
const MAX_BODY: usize = 256 * 1024;
const MAX_URI: usize = 4096;
const MAX_QUERY: usize = 512;
/// At most this many candidates are offered in one confirmation form.
const MAX_CANDIDATES: usize = 25;
/// At most this many roots are considered from one `roots/list` answer.
const MAX_ROOTS: usize = 256;
const CHOICE_KEY: &str = "delete_choice";
const ROOTS_KEY: &str = "roots";

/// Resolves `workspaceUri` for the caller: normalized, inside a grant.
fn authorized_workspace(cx: &CallContext<'_>, uri: &str) -> Result<Scope, ServerError> {
    let scope =
        Scope::from_file_uri(uri).map_err(|e| ServerError::params(format!("workspaceUri: {e}")))?;
    if cx
        .services
        .access
        .workspace_for(cx.principal, &scope)
        .is_none()
    {
        return Err(ServerError::params(format!(
            "workspaceUri {uri:?} (normalized {}) is not inside any workspace granted to this caller",
            scope.to_uri()
        )));
    }
    Ok(scope)
}

fn note_json(n: &Note) -> Value {
    json!({ "id": n.public_id(), "title": n.title, "body": n.body, "workspaceUri": n.workspace })
}

/// `notes_create {workspaceUri, title, body}`.
#[derive(Debug)]
pub(super) struct NotesCreate;

impl Tool for NotesCreate {
    fn name(&self) -> &'static str {
        "notes_create"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "notes_create",
            "title": "Create a note",
            "description": "Create a note in a workspace granted to you.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "workspaceUri": {"type": "string", "description": "file: URI of the workspace"},
                    "title": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE},
                    "body": {"type": "string", "maxLength": MAX_BODY}
                },
                "required": ["workspaceUri", "title", "body"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false}
        })
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        cx.only_args(&["workspaceUri", "title", "body"])?;
        let ws = authorized_workspace(cx, cx.string_arg("workspaceUri", MAX_URI)?)?;
        let title = cx.string_arg("title", MAX_TITLE)?;
        let body = match cx.arguments.get("body") {
            Some(Value::String(b)) if b.len() <= MAX_BODY => b.as_str(),
            Some(Value::String(_)) => {
                return Err(ServerError::params(format!(
                    "argument body is longer than {MAX_BODY} bytes"
                )))
            }
            _ => return Err(ServerError::params("argument body must be a string")),
        };
        let note = cx.services.store.create(&ws.to_uri(), title, body)?;
        Ok(Outcome::Complete(text_result(
            format!(
                "Created {} \"{}\" in {}",
                note.public_id(),
                note.title,
                note.workspace
            ),
            Some(note_json(&note)),
            false,
        )))
    }
}

/// `notes_list {workspaceUri?, query?}`.
#[derive(Debug)]
pub(super) struct NotesList;

impl Tool for NotesList {
    fn name(&self) -> &'static str {
        "notes_list"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "notes_list",
            "title": "List notes",
            "description": "List notes in a workspace granted to you, optionally filtered by a \
                text query. Without workspaceUri, clients that declare roots are asked for them \
                (a migration adapter); roots only select among granted workspaces.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "workspaceUri": {"type": "string", "description": "file: URI of the workspace"},
                    "query": {"type": "string", "maxLength": MAX_QUERY}
                },
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        cx.only_args(&["workspaceUri", "query"])?;
        let query = cx.optional_string_arg("query", MAX_QUERY)?;
        let limit = cx.services.limits.max_list;
        let workspaces: Vec<String> = match cx.optional_string_arg("workspaceUri", MAX_URI)? {
            Some(uri) => vec![authorized_workspace(cx, uri)?.to_uri()],
            None => match self.roots_scope(cx)? {
                Ok(ws) => ws,
                Err(round) => return Ok(round),
            },
        };
        let notes = cx.services.store.list(&workspaces, query, limit)?;
        let text = if notes.is_empty() {
            "No notes.".to_owned()
        } else {
            notes
                .iter()
                .map(|n| format!("{}  {}  ({})", n.public_id(), n.title, n.workspace))
                .collect::<Vec<_>>()
                .join("\n")
        };
        Ok(Outcome::Complete(text_result(
            text,
            Some(json!({
                "workspaces": workspaces,
                "notes": notes.iter().map(note_json).collect::<Vec<_>>(),
            })),
            false,
        )))
    }
}

impl NotesList {
    /// The roots migration adapter: ask `roots/list`, then keep only granted workspaces
    /// that lie inside a returned root. `Err` carries the MRTR round to send.
    fn roots_scope(
        &self,
        cx: &CallContext<'_>,
    ) -> Result<Result<Vec<String>, Outcome>, ServerError> {
        let opened = cx.open_state(self.name())?;
        let ask = |round: u32| -> Result<Outcome, ServerError> {
            if round > cx.services.limits.max_rounds {
                return Err(ServerError::params(
                    "too many rounds without a roots/list answer",
                ));
            }
            let mut input_requests = Map::new();
            input_requests.insert(
                ROOTS_KEY.into(),
                json!({ "method": "roots/list", "params": {} }),
            );
            Ok(Outcome::InputRequired {
                input_requests,
                request_state: Some(cx.seal_state(self.name(), "roots", round, Value::Null)?),
            })
        };
        let Some(opened) = opened else {
            if !cx.meta.supports_roots() {
                return Err(ServerError::params(
                    "argument workspaceUri is required (or declare the roots capability so the \
                     server can ask for your roots)",
                ));
            }
            return Ok(Err(ask(1)?));
        };
        if opened.phase != "roots" {
            return Err(ServerError::params("requestState belongs to another step"));
        }
        let Some(answer) = cx.input_response(ROOTS_KEY) else {
            return Ok(Err(ask(opened.round + 1)?));
        };
        let roots = answer
            .get("roots")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                ServerError::params(
                    "inputResponses.roots must be a ListRootsResult with a roots array",
                )
            })?;
        let mut root_scopes = Vec::new();
        for r in roots.iter().take(MAX_ROOTS) {
            let uri = r
                .get("uri")
                .and_then(Value::as_str)
                .ok_or_else(|| ServerError::params("every root needs a string uri"))?;
            // Roots that are not clean file: URIs select nothing.
            if let Ok(s) = Scope::from_file_uri(uri) {
                root_scopes.push(s);
            }
        }
        let selected = cx
            .services
            .access
            .workspaces(cx.principal)
            .into_iter()
            .filter(|w| root_scopes.iter().any(|r| r.contains(w)))
            .map(Scope::to_uri)
            .collect();
        Ok(Ok(selected))
    }
}

/// `notes_delete {workspaceUri, title}`.
#[derive(Debug)]
pub(super) struct NotesDelete;

impl Tool for NotesDelete {
    fn name(&self) -> &'static str {
        "notes_delete"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "notes_delete",
            "title": "Delete a note",
            "description": "Delete one note by title from a workspace granted to you. The user \
                picks the note among those with that title and confirms, through a form.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "workspaceUri": {"type": "string", "description": "file: URI of the workspace"},
                    "title": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE}
                },
                "required": ["workspaceUri", "title"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": false}
        })
    }

    fn required_capabilities(&self) -> Option<Value> {
        Some(json!({ "elicitation": { "form": {} } }))
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        cx.only_args(&["workspaceUri", "title"])?;
        let ws = authorized_workspace(cx, cx.string_arg("workspaceUri", MAX_URI)?)?;
        let title = cx.string_arg("title", MAX_TITLE)?;
        let workspace = ws.to_uri();

        let Some(opened) = cx.open_state(self.name())? else {
            let candidates = cx
                .services
                .store
                .find_by_title(&workspace, title, MAX_CANDIDATES)?;
            if candidates.is_empty() {
                return Ok(Outcome::Complete(text_result(
                    format!("No note titled {title:?} in {workspace}; nothing deleted."),
                    None,
                    true,
                )));
            }
            let ids: Vec<String> = candidates.iter().map(Note::public_id).collect();
            return self.ask(cx, &workspace, title, &candidates, ids, 1);
        };

        if opened.phase != "confirm" {
            return Err(ServerError::params("requestState belongs to another step"));
        }
        let signed_ids = opened.strings("candidates");
        let signed_ws = opened
            .data
            .get("workspace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if signed_ws != workspace {
            return Err(ServerError::params(
                "requestState was issued for another workspace",
            ));
        }
        let Some(answer) = cx.input_response(CHOICE_KEY) else {
            // The client did not answer: ask again (bounded by the round limit and the
            // state's expiry) rather than fail.
            let live = cx
                .services
                .store
                .find_by_title(&workspace, title, MAX_CANDIDATES)?;
            let live: Vec<Note> = live
                .into_iter()
                .filter(|n| signed_ids.contains(&n.public_id()))
                .collect();
            if opened.round >= cx.services.limits.max_rounds {
                return Err(ServerError::params(
                    "too many rounds without an answer to delete_choice",
                ));
            }
            return self.ask(
                cx,
                &workspace,
                title,
                &live,
                signed_ids.clone(),
                opened.round + 1,
            );
        };
        let action = answer
            .get("action")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ServerError::params("inputResponses.delete_choice.action must be a string")
            })?;
        let claim = NonceClaim {
            nonce: opened.nonce.clone(),
            expires_ms: opened.expires_ms,
            now_ms: cx.now_ms,
        };
        match action {
            "cancel" => Ok(Outcome::Complete(text_result(
                "Deletion cancelled; nothing was deleted.",
                Some(json!({ "deleted": null, "action": "cancel" })),
                false,
            ))),
            "decline" => {
                if !cx.services.store.claim(&claim)? {
                    return Err(ServerError::params("requestState has already been used"));
                }
                Ok(Outcome::Complete(text_result(
                    "Deletion declined; nothing was deleted.",
                    Some(json!({ "deleted": null, "action": "decline" })),
                    false,
                )))
            }
            "accept" => {
                let content = answer.get("content").and_then(Value::as_object).ok_or_else(|| {
                    ServerError::params("accept without content is not consent: content with note_id and confirm is required")
                })?;
                let note_id = match content.get("note_id") {
                    Some(Value::String(s)) => s.as_str(),
                    _ => return Err(ServerError::params("content.note_id must be a string")),
                };
                let confirm = match content.get("confirm") {
                    Some(Value::Bool(b)) => *b,
                    _ => return Err(ServerError::params("content.confirm must be a boolean")),
                };
                if !signed_ids.iter().any(|c| c == note_id) {
                    return Err(ServerError::params(format!(
                        "note_id {note_id:?} is not one of the candidates offered"
                    )));
                }
                if !confirm {
                    if !cx.services.store.claim(&claim)? {
                        return Err(ServerError::params("requestState has already been used"));
                    }
                    return Ok(Outcome::Complete(text_result(
                        "Deletion not confirmed; nothing was deleted.",
                        Some(json!({ "deleted": null, "action": "accept", "confirm": false })),
                        false,
                    )));
                }
                // Re-authorize and re-check containment now, not when the form was shown.
                let ws_again = authorized_workspace(cx, &workspace)?;
                if ws_again.to_uri() != workspace {
                    return Err(ServerError::params(
                        "workspace no longer resolves the same way",
                    ));
                }
                let id = Note::parse_public_id(note_id)
                    .ok_or_else(|| ServerError::params("note_id is malformed"))?;
                let check = LiveCheck {
                    id,
                    workspace: workspace.clone(),
                    title: title.to_owned(),
                };
                match cx.services.store.delete_claimed(&claim, &check)? {
                    DeleteOutcome::Deleted(n) => {
                        tracing::info!(note = %n.public_id(), principal = cx.principal, "note deleted");
                        Ok(Outcome::Complete(text_result(
                            format!("Deleted {} \"{}\" from {}.", n.public_id(), n.title, n.workspace),
                            Some(json!({ "deleted": n.public_id(), "action": "accept" })),
                            false,
                        )))
                    }
                    DeleteOutcome::Replayed => Err(ServerError::params("requestState has already been used")),
                    DeleteOutcome::NotLive => Ok(Outcome::Complete(text_result(
                        format!("{note_id} is no longer a note titled {title:?} in {workspace}; nothing was deleted."),
                        None,
                        true,
                    ))),
                }
            }
            other => Err(ServerError::params(format!(
                "inputResponses.delete_choice.action {other:?} is not accept, decline or cancel"
            ))),
        }
    }
}

impl NotesDelete {
    fn ask(
        &self,
        cx: &CallContext<'_>,
        workspace: &str,
        title: &str,
        shown: &[Note],
        ids: Vec<String>,
        round: u32,
    ) -> Result<Outcome, ServerError> {
        let lines: Vec<String> = shown
            .iter()
            .map(|n| {
                let preview: String = n.body.chars().take(80).collect();
                format!("- {}: {}", n.public_id(), preview.replace('\n', " "))
            })
            .collect();
        let message = format!(
            "{} notes titled {title:?} in {workspace}. Choose the one to delete and confirm.\n{}",
            ids.len(),
            lines.join("\n")
        );
        let state = cx.seal_state(
            self.name(),
            "confirm",
            round,
            json!({ "candidates": ids, "workspace": workspace }),
        )?;
        let mut input_requests = Map::new();
        input_requests.insert(
            CHOICE_KEY.into(),
            json!({
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": message,
                    "requestedSchema": {
                        "type": "object",
                        "properties": {
                            "note_id": {"type": "string", "title": "Note", "enum": ids},
                            "confirm": {"type": "boolean", "title": "Delete it", "description": "Deletion cannot be undone"}
                        },
                        "required": ["note_id", "confirm"]
                    }
                }
            }),
        );
        Ok(Outcome::InputRequired {
            input_requests,
            request_state: Some(state),
        })
    }
}
