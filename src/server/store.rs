//! Notes and single-use nonces. The interface is two traits; the default
//! implementation is one SQLite database so that claiming a nonce and deleting a note
//! happen in one transaction, across every process sharing the file.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::Mutex;
use std::time::Duration;

/// Store failures (the caller answers them as internal errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite said no.
    #[error("store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A lock holder panicked earlier.
    #[error("store lock poisoned")]
    Poisoned,
}

/// A stored note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Row id; shown to clients as `note-<id>`.
    pub id: i64,
    /// Canonical workspace URI the note belongs to.
    pub workspace: String,
    /// Title (not unique).
    pub title: String,
    /// Body text.
    pub body: String,
}

impl Note {
    /// The id as clients see it.
    pub fn public_id(&self) -> String {
        format!("note-{}", self.id)
    }

    /// Parses a public id (`note-14`).
    pub fn parse_public_id(s: &str) -> Option<i64> {
        s.strip_prefix("note-")?
            .parse()
            .ok()
            .filter(|n: &i64| *n > 0)
    }
}

/// A nonce claim: the nonce and when it may be forgotten.
#[derive(Debug, Clone)]
pub struct NonceClaim {
    /// The nonce from the signed state.
    pub nonce: String,
    /// When the state it came from expires (ms since epoch); after that the state
    /// cannot verify, so the nonce need not be remembered.
    pub expires_ms: u64,
    /// Now (ms since epoch), for purging.
    pub now_ms: u64,
}

/// What the live note must still look like for a delete to go ahead.
#[derive(Debug, Clone)]
pub struct LiveCheck {
    /// The note.
    pub id: i64,
    /// The workspace the state was signed for.
    pub workspace: String,
    /// The title the state was signed for.
    pub title: String,
}

/// Outcome of [`NoteStore::delete_claimed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The nonce was fresh and the note is gone.
    Deleted(Note),
    /// The nonce was already used; nothing changed.
    Replayed,
    /// The note no longer exists, or moved out of the workspace or changed title;
    /// nothing changed and the nonce was not used.
    NotLive,
}

/// Notes.
pub trait NoteStore: Send + Sync {
    /// Adds a note.
    fn create(&self, workspace: &str, title: &str, body: &str) -> Result<Note, StoreError>;
    /// Notes in any of `workspaces`, optionally filtered by a substring of title or
    /// body, oldest first, at most `limit`.
    fn list(
        &self,
        workspaces: &[String],
        query: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Note>, StoreError>;
    /// Notes in `workspace` with exactly this title, oldest first, at most `limit`.
    fn find_by_title(
        &self,
        workspace: &str,
        title: &str,
        limit: usize,
    ) -> Result<Vec<Note>, StoreError>;
    /// How many notes exist in `workspace`.
    fn count(&self, workspace: &str) -> Result<u64, StoreError>;
    /// Claims the nonce and deletes the note in one transaction, re-reading the live
    /// note inside it.
    fn delete_claimed(
        &self,
        claim: &NonceClaim,
        check: &LiveCheck,
    ) -> Result<DeleteOutcome, StoreError>;
}

/// Single-use nonces.
pub trait ReplayStore: Send + Sync {
    /// Records the nonce; `false` when it was already recorded.
    fn claim(&self, claim: &NonceClaim) -> Result<bool, StoreError>;
}

/// The SQLite store.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_title ON notes(workspace, title);
CREATE TABLE IF NOT EXISTS nonces (
    nonce TEXT PRIMARY KEY,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS nonces_by_expiry ON nonces(expires_ms);
";

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, or an in-memory one for
    /// `:memory:`.
    pub fn open(path: &str) -> Result<Self, StoreError> {
        let conn = if path == ":memory:" {
            Connection::open_in_memory()?
        } else {
            Connection::open(path)?
        };
        conn.busy_timeout(Duration::from_secs(10))?;
        if path != ":memory:" {
            conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
        }
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        f(&mut conn)
    }
}

fn row_to_note(r: &rusqlite::Row<'_>) -> rusqlite::Result<Note> {
    Ok(Note {
        id: r.get(0)?,
        workspace: r.get(1)?,
        title: r.get(2)?,
        body: r.get(3)?,
    })
}

/// Forgets nonces whose state has expired: such a state can no longer verify, so its
/// nonce cannot be presented again. Keeps the table bounded by the live states.
fn purge_expired(tx: &rusqlite::Transaction<'_>, now_ms: u64) -> rusqlite::Result<usize> {
    tx.execute(
        "DELETE FROM nonces WHERE expires_ms < ?1",
        params![to_i64(now_ms)],
    )
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl NoteStore for SqliteStore {
    fn create(&self, workspace: &str, title: &str, body: &str) -> Result<Note, StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO notes (workspace, title, body) VALUES (?1, ?2, ?3)",
                params![workspace, title, body],
            )?;
            Ok(Note {
                id: c.last_insert_rowid(),
                workspace: workspace.to_owned(),
                title: title.to_owned(),
                body: body.to_owned(),
            })
        })
    }

    fn list(
        &self,
        workspaces: &[String],
        query: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Note>, StoreError> {
        self.with(|c| {
            let mut out = Vec::new();
            let mut stmt = c.prepare_cached(
                "SELECT id, workspace, title, body FROM notes WHERE workspace = ?1
                 AND (?2 IS NULL OR instr(lower(title), lower(?2)) > 0
                      OR instr(lower(body), lower(?2)) > 0)
                 ORDER BY id LIMIT ?3",
            )?;
            for ws in workspaces {
                let left = limit.saturating_sub(out.len());
                if left == 0 {
                    break;
                }
                let rows = stmt.query_map(
                    params![ws, query, i64::try_from(left).unwrap_or(i64::MAX)],
                    row_to_note,
                )?;
                for r in rows {
                    out.push(r?);
                }
            }
            Ok(out)
        })
    }

    fn find_by_title(
        &self,
        workspace: &str,
        title: &str,
        limit: usize,
    ) -> Result<Vec<Note>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, workspace, title, body FROM notes
                 WHERE workspace = ?1 AND title = ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows = stmt.query_map(
                params![workspace, title, i64::try_from(limit).unwrap_or(i64::MAX)],
                row_to_note,
            )?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    fn count(&self, workspace: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            let n: i64 = c.query_row(
                "SELECT count(*) FROM notes WHERE workspace = ?1",
                params![workspace],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn delete_claimed(
        &self,
        claim: &NonceClaim,
        check: &LiveCheck,
    ) -> Result<DeleteOutcome, StoreError> {
        self.with(|c| {
            // IMMEDIATE takes the write lock up front, so two processes serialize here
            // and the loser sees the winner's nonce.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            purge_expired(&tx, claim.now_ms)?;
            let used: Option<i64> = tx
                .query_row(
                    "SELECT 1 FROM nonces WHERE nonce = ?1",
                    params![claim.nonce],
                    |r| r.get(0),
                )
                .optional()?;
            if used.is_some() {
                return Ok(DeleteOutcome::Replayed);
            }
            let live: Option<Note> = tx
                .query_row(
                    "SELECT id, workspace, title, body FROM notes WHERE id = ?1",
                    params![check.id],
                    row_to_note,
                )
                .optional()?;
            let Some(note) =
                live.filter(|n| n.workspace == check.workspace && n.title == check.title)
            else {
                return Ok(DeleteOutcome::NotLive);
            };
            tx.execute(
                "INSERT INTO nonces (nonce, expires_ms) VALUES (?1, ?2)",
                params![claim.nonce, to_i64(claim.expires_ms)],
            )?;
            tx.execute("DELETE FROM notes WHERE id = ?1", params![note.id])?;
            tx.commit()?;
            Ok(DeleteOutcome::Deleted(note))
        })
    }
}

impl ReplayStore for SqliteStore {
    fn claim(&self, claim: &NonceClaim) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            purge_expired(&tx, claim.now_ms)?;
            let inserted = tx.execute(
                "INSERT OR IGNORE INTO nonces (nonce, expires_ms) VALUES (?1, ?2)",
                params![claim.nonce, to_i64(claim.expires_ms)],
            )?;
            tx.commit()?;
            Ok(inserted == 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_and_delete_once() {
        let s = SqliteStore::open(":memory:").unwrap();
        let n = s.create("file:///w", "TPS report", "x").unwrap();
        let claim = NonceClaim {
            nonce: "n1".into(),
            expires_ms: 1000,
            now_ms: 1,
        };
        let check = LiveCheck {
            id: n.id,
            workspace: "file:///w".into(),
            title: "TPS report".into(),
        };
        assert!(matches!(
            s.delete_claimed(&claim, &check),
            Ok(DeleteOutcome::Deleted(_))
        ));
        assert_eq!(
            s.delete_claimed(&claim, &check).unwrap(),
            DeleteOutcome::Replayed
        );
        let n2 = s.create("file:///w", "TPS report", "y").unwrap();
        let wrong = LiveCheck {
            id: n2.id,
            workspace: "file:///elsewhere".into(),
            title: "TPS report".into(),
        };
        let claim2 = NonceClaim {
            nonce: "n2".into(),
            ..claim.clone()
        };
        assert_eq!(
            s.delete_claimed(&claim2, &wrong).unwrap(),
            DeleteOutcome::NotLive
        );
        assert!(s.claim(&claim2).unwrap());
        assert!(!s.claim(&claim2).unwrap());
        assert_eq!(s.count("file:///w").unwrap(), 1);
        assert_eq!(Note::parse_public_id("note-14"), Some(14));
        assert_eq!(Note::parse_public_id("note--1"), None);
        assert_eq!(Note::parse_public_id("14"), None);
    }
}
