//! `notes_create`, `notes_list` (keyset pages behind signed cursors, with the roots
//! migration adapter) and `notes_delete` (form elicitation through MRTR, single-use
//! signed confirmation, a bounded and named subset of the candidates).

use super::{text_result, CallContext, Outcome, Tool};
use crate::cursor;
use crate::error::ServerError;
use crate::scope::Scope;
use crate::store::{DeleteOutcome, ListQuery, LiveCheck, NonceClaim, Note};
use serde_json::{json, Map, Value};

const MAX_TITLE: usize = 512;
const MAX_BODY: usize = 256 * 1024;
const MAX_URI: usize = 4096;
const MAX_QUERY: usize = 512;
const MAX_CURSOR: usize = 1024;
const MAX_NOTE_ID: usize = 32;
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

/// `notes_list {workspaceUri?, query?, cursor?, limit?}`.
#[derive(Debug)]
pub(super) struct NotesList {
    /// `[limits] max_list`: the default and largest page.
    pub(super) max_list: usize,
}

impl Tool for NotesList {
    fn name(&self) -> &'static str {
        "notes_list"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "notes_list",
            "title": "List notes",
            "description": "List notes in a workspace granted to you, oldest first, optionally \
                filtered by a text query (case-insensitive, title or body). Results come in \
                pages: structuredContent.total is the number of matching notes, and when more \
                remain structuredContent.nextCursor is set; call again with the same \
                workspaceUri and query plus cursor = nextCursor for the next page (a cursor \
                only continues the listing it came from). Without workspaceUri, clients that \
                declare roots are asked for them (a migration adapter); roots only select \
                among granted workspaces.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "workspaceUri": {"type": "string", "description": "file: URI of the workspace"},
                    "query": {"type": "string", "maxLength": MAX_QUERY, "description": "Only notes whose title or body contains this text (case-insensitive)"},
                    "cursor": {"type": "string", "maxLength": MAX_CURSOR, "description": "nextCursor of the previous page, to continue the same listing (same workspaceUri and query)"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": self.max_list, "description": format!("Most notes on this page (default {})", self.max_list)}
                },
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call(&self, cx: &CallContext<'_>) -> Result<Outcome, ServerError> {
        cx.only_args(&["workspaceUri", "query", "cursor", "limit"])?;
        let query = cx.optional_string_arg("query", MAX_QUERY)?;
        let max = self.max_list;
        let limit = match cx.arguments.get("limit") {
            None | Some(Value::Null) => max,
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ServerError::params(format!(
                        "argument limit must be an integer from 1 to {max}"
                    ))
                })?,
        };
        // An empty string is a valid (if never issued) cursor, so it is checked too.
        let cursor = match cx.arguments.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) if c.len() <= MAX_CURSOR => Some(c.as_str()),
            Some(_) => {
                return Err(ServerError::params(format!(
                    "argument cursor must be a string of at most {MAX_CURSOR} bytes"
                )))
            }
        };
        let workspaces: Vec<String> = match cx.optional_string_arg("workspaceUri", MAX_URI)? {
            Some(uri) => vec![authorized_workspace(cx, uri)?.to_uri()],
            None => match self.roots_scope(cx)? {
                Ok(ws) => ws,
                Err(round) => return Ok(round),
            },
        };
        let listing = cursor::listing_digest(&workspaces, query);
        let after = cursor
            .map(|c| cursor::open(&cx.services.codec, c, cx.principal, &listing))
            .transpose()
            .map_err(|e| ServerError::params(e.to_string()))?;
        let page = cx.services.store.list(&ListQuery {
            workspaces: &workspaces,
            text: query,
            after,
            limit,
        })?;
        let next = match page.notes.last() {
            Some(last) if page.more => Some(cursor::seal(
                &cx.services.codec,
                cx.principal,
                &listing,
                last.id,
            )),
            _ => None,
        };
        let shown = page.notes.len();
        let mut text = if page.total == 0 {
            "No notes.".to_owned()
        } else if shown as u64 == page.total {
            format!("{shown} {}:", plural(page.total, "note"))
        } else if next.is_some() {
            format!(
                "showing {shown} of {} notes; more remain: call notes_list again with the \
                 same arguments and cursor = structuredContent.nextCursor.",
                page.total
            )
        } else {
            format!("showing {shown} of {} notes (the last page).", page.total)
        };
        for n in &page.notes {
            text.push_str(&format!(
                "\n{}  {}  ({})",
                n.public_id(),
                n.title,
                n.workspace
            ));
        }
        let mut structured = json!({
            "workspaces": workspaces,
            "notes": page.notes.iter().map(note_json).collect::<Vec<_>>(),
            "total": page.total,
        });
        if let Some(c) = next {
            structured["nextCursor"] = Value::String(c);
        }
        Ok(Outcome::Complete(text_result(
            text,
            Some(structured),
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

/// `notes_delete {workspaceUri, title, noteId?}`.
#[derive(Debug)]
pub(super) struct NotesDelete {
    /// `[limits] max_delete_candidates`: most notes offered in one form.
    pub(super) max_candidates: usize,
}

/// Which notes a confirmation form offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    /// Every note with the title.
    All,
    /// The most recently created ones (more carry the title than one form shows).
    Newest,
    /// The one note the caller named with `noteId`.
    Named,
}

/// The live form of a round: what it shows, and how many notes carry the title.
struct Form<'n> {
    shown: &'n [Note],
    ids: Vec<String>,
    total: u64,
    offer: Offer,
}

impl Tool for NotesDelete {
    fn name(&self) -> &'static str {
        "notes_delete"
    }

    fn descriptor(&self) -> Value {
        json!({
            "name": "notes_delete",
            "title": "Delete a note",
            "description": format!("Delete one note by title from a workspace granted to you. \
                The user picks the note and confirms, through a form. The form offers every \
                note with that title, or, when more than {n} carry it, the {n} most recently \
                created (its message gives the true count). To delete a particular note \
                (e.g. an older one), pass its id as noteId (from notes_list): the form then \
                offers that note alone, still to be confirmed.", n = self.max_candidates),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "workspaceUri": {"type": "string", "description": "file: URI of the workspace"},
                    "title": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE, "description": "Exact title of the note to delete"},
                    "noteId": {"type": "string", "pattern": "^note-[1-9][0-9]*$", "maxLength": MAX_NOTE_ID, "description": "Id of one note with that title (note-<n>, as notes_list shows it), to target it directly"}
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
        cx.only_args(&["workspaceUri", "title", "noteId"])?;
        let ws = authorized_workspace(cx, cx.string_arg("workspaceUri", MAX_URI)?)?;
        let title = cx.string_arg("title", MAX_TITLE)?;
        let named = cx.optional_string_arg("noteId", MAX_NOTE_ID)?;
        let workspace = ws.to_uri();

        let Some(opened) = cx.open_state(self.name())? else {
            let matches = cx
                .services
                .store
                .by_title(&workspace, title, self.max_candidates)?;
            let (candidates, offer) = match named {
                Some(id) => (vec![named_note(cx, id, &workspace, title)?], Offer::Named),
                None if matches.total == 0 => {
                    return Ok(Outcome::Complete(text_result(
                        format!("No note titled {title:?} in {workspace}; nothing deleted."),
                        None,
                        true,
                    )));
                }
                None if matches.total > matches.newest.len() as u64 => {
                    (oldest_first(matches.newest), Offer::Newest)
                }
                None => (oldest_first(matches.newest), Offer::All),
            };
            let form = Form {
                ids: candidates.iter().map(Note::public_id).collect(),
                shown: &candidates,
                total: matches.total,
                offer,
            };
            return self.ask(cx, &workspace, title, &form, 1);
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
            // state's expiry) rather than fail, offering the signed candidates that
            // still carry the title.
            if opened.round >= cx.services.limits.max_rounds {
                return Err(ServerError::params(
                    "too many rounds without an answer to delete_choice",
                ));
            }
            let mut live = Vec::new();
            for id in signed_ids.iter().take(self.max_candidates) {
                if let Some(n) = Note::parse_public_id(id)
                    .map(|id| cx.services.store.get(id))
                    .transpose()?
                    .flatten()
                    .filter(|n| n.workspace == workspace && n.title == title)
                {
                    live.push(n);
                }
            }
            let total = cx.services.store.by_title(&workspace, title, 0)?.total;
            let offer = match opened.data.get("offer").and_then(Value::as_str) {
                Some("named") => Offer::Named,
                Some("newest") => Offer::Newest,
                _ => Offer::All,
            };
            let form = Form {
                shown: &live,
                ids: signed_ids.clone(),
                total,
                offer,
            };
            return self.ask(cx, &workspace, title, &form, opened.round + 1);
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
                        "note_id {} is not one of the candidates offered",
                        dualera_adapters::echo::echo_quoted(note_id)
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
                "inputResponses.delete_choice.action {} is not accept, decline or cancel",
                dualera_adapters::echo::echo_quoted(other)
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
        form: &Form<'_>,
        round: u32,
    ) -> Result<Outcome, ServerError> {
        let lines: Vec<String> = form
            .shown
            .iter()
            .map(|n| {
                let preview: String = n.body.chars().take(80).collect();
                format!("- {}: {}", n.public_id(), preview.replace('\n', " "))
            })
            .collect();
        let total = form.total;
        let count = format!(
            "{total} {} titled {title:?} in {workspace}",
            plural(total, "note")
        );
        let (offer, intro) = match form.offer {
            Offer::All if total == 1 => ("all", format!("{count}.")),
            Offer::All => ("all", format!("{count}; all {total} are offered below.")),
            Offer::Newest => (
                "newest",
                format!(
                    "{count}; offered below are the {} most recently created. \
                     To delete an older one, call notes_delete again with its noteId \
                     (notes_list shows the ids).",
                    form.ids.len()
                ),
            ),
            Offer::Named => (
                "named",
                format!(
                    "{count}; offered below is only the note asked for by noteId ({}).",
                    form.ids.join(", ")
                ),
            ),
        };
        let message = format!(
            "{intro} Choose the one to delete and confirm.\n{}",
            lines.join("\n")
        );
        let state = cx.seal_state(
            self.name(),
            "confirm",
            round,
            json!({ "candidates": form.ids, "workspace": workspace, "offer": offer }),
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
                            "note_id": {"type": "string", "title": "Note", "enum": form.ids},
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

/// The note a caller named with `noteId`: it must exist in the workspace and carry the
/// title, or the call is invalid (`-32602`), whether the id is unknown, elsewhere or
/// titled otherwise (one message, so nothing is learned about other workspaces).
fn named_note(
    cx: &CallContext<'_>,
    id: &str,
    workspace: &str,
    title: &str,
) -> Result<Note, ServerError> {
    let not_it = || {
        ServerError::params(format!(
            "noteId {id:?} is not a note titled {title:?} in {workspace}"
        ))
    };
    let n = Note::parse_public_id(id).ok_or_else(not_it)?;
    cx.services
        .store
        .get(n)?
        .filter(|note| note.workspace == workspace && note.title == title)
        .ok_or_else(not_it)
}

/// The form lists its notes in creation order, as it always has (the subset chosen is
/// still the newest).
fn oldest_first(mut notes: Vec<Note>) -> Vec<Note> {
    notes.sort_by_key(|n| n.id);
    notes
}

/// `1 note`, `2 notes`.
fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}
