//! The SQLite engine: the embedded default. One file shared by every process on one
//! machine; `BEGIN IMMEDIATE` takes the write lock up front, so two processes claiming
//! one nonce serialize and the second sees the first's row.

use super::{
    count, limit_i64, pending, purge_before, to_i64, DeleteOutcome, ListQuery, LiveCheck,
    NonceClaim, Note, NoteStore, Page, ReplayStore, Store, StoreError, TaskRow, TaskStore,
    TitleMatches, TASK_PURGE_BATCH,
};
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, TransactionBehavior};
use std::sync::Mutex;
use std::time::Duration;

/// The SQLite store.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

/// Versioned migrations; the version is `PRAGMA user_version`. Version 1 is the schema
/// of the builds before versioning, written so that it adopts such a database.
const MIGRATIONS: &[&str] = &[
    // 1: notes and nonces.
    "CREATE TABLE IF NOT EXISTS notes (
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
    CREATE INDEX IF NOT EXISTS nonces_by_expiry ON nonces(expires_ms);",
    // 2: keyset paging of a workspace by id.
    "CREATE INDEX IF NOT EXISTS notes_by_workspace ON notes(workspace, id);",
    // 3: tasks (the io.modelcontextprotocol/tasks extension).
    "CREATE TABLE IF NOT EXISTS tasks (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        expires_ms INTEGER NOT NULL,
        version INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS tasks_by_principal ON tasks(principal, expires_ms);
    CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks(expires_ms);",
];

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, or an in-memory one for
    /// `:memory:`, and migrates it.
    pub fn open(path: &str) -> Result<Self, StoreError> {
        let mut conn = if path == ":memory:" {
            Connection::open_in_memory()?
        } else {
            Connection::open(path)?
        };
        conn.busy_timeout(Duration::from_secs(10))?;
        if path != ":memory:" {
            wal(&conn)?;
        }
        migrate(&mut conn)?;
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

/// Switches the database to WAL. Changing the journal mode needs the database to
/// itself, and SQLite answers `SQLITE_BUSY` at once (without calling the busy handler)
/// when another process is opening the same file: retried, bounded like the busy
/// timeout.
fn wal(conn: &Connection) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(())) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.map_err(StoreError::from),
        }
    }
}

/// Brings the schema to the newest version, under the write lock so that processes
/// starting together migrate once; refuses a database from a newer build.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (version, sql) in pending(MIGRATIONS, found)? {
        tx.execute_batch(sql)?;
        // PRAGMA takes no bound parameters; the value is our own integer.
        tx.execute_batch(&format!("PRAGMA user_version = {version}"))?;
    }
    tx.commit()?;
    Ok(())
}

fn row_to_note(r: &rusqlite::Row<'_>) -> rusqlite::Result<Note> {
    Ok(Note {
        id: r.get(0)?,
        workspace: r.get(1)?,
        title: r.get(2)?,
        body: r.get(3)?,
    })
}

/// Forgets nonces whose state expired more than the grace ago: such a state can no
/// longer verify, so its nonce cannot be presented again. Keeps the table bounded by
/// the live states.
fn purge_expired(tx: &rusqlite::Transaction<'_>, now_ms: u64) -> rusqlite::Result<usize> {
    tx.execute(
        "DELETE FROM nonces WHERE expires_ms < ?1",
        params![purge_before(now_ms)],
    )
}

/// `?first, ?first+1, …` for `n` bound values.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

const TEXT_FILTER: &str = "(?1 IS NULL OR instr(lower(title), lower(?1)) > 0
                               OR instr(lower(body), lower(?1)) > 0)";

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

    fn list(&self, q: &ListQuery<'_>) -> Result<Page, StoreError> {
        if q.workspaces.is_empty() || q.limit == 0 {
            return Ok(Page::default());
        }
        self.with(|c| {
            // One read transaction: the page and the total come from the same snapshot.
            let tx = c.transaction()?;
            let ws = placeholders(4, q.workspaces.len());
            let page_sql = format!(
                "SELECT id, workspace, title, body FROM notes
                 WHERE workspace IN ({ws}) AND id > ?2 AND {TEXT_FILTER}
                 ORDER BY id LIMIT ?3"
            );
            let count_sql =
                format!("SELECT count(*) FROM notes WHERE workspace IN ({ws}) AND {TEXT_FILTER}");
            let head = [
                rusqlite::types::Value::from(q.text.map(str::to_owned)),
                rusqlite::types::Value::from(q.after.unwrap_or(0)),
                rusqlite::types::Value::from(limit_i64(q.limit.saturating_add(1))),
            ];
            let values = || {
                head.iter()
                    .cloned()
                    .chain(q.workspaces.iter().cloned().map(Into::into))
            };
            let notes = {
                let mut stmt = tx.prepare_cached(&page_sql)?;
                let rows = stmt.query_map(params_from_iter(values()), row_to_note)?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            let total: i64 = {
                // One numbering serves both statements: the count leaves ?2 and ?3
                // unreferenced, and SQLite accepts values bound to such slots.
                let mut stmt = tx.prepare_cached(&count_sql)?;
                stmt.query_row(params_from_iter(values()), |r| r.get(0))?
            };
            tx.commit()?;
            Ok(Page::cut(notes, q.limit, total))
        })
    }

    fn by_title(
        &self,
        workspace: &str,
        title: &str,
        limit: usize,
    ) -> Result<TitleMatches, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let newest = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, workspace, title, body FROM notes
                     WHERE workspace = ?1 AND title = ?2 ORDER BY id DESC LIMIT ?3",
                )?;
                let rows =
                    stmt.query_map(params![workspace, title, limit_i64(limit)], row_to_note)?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            let total: i64 = tx.query_row(
                "SELECT count(*) FROM notes WHERE workspace = ?1 AND title = ?2",
                params![workspace, title],
                |r| r.get(0),
            )?;
            tx.commit()?;
            Ok(TitleMatches {
                newest,
                total: count(total),
            })
        })
    }

    fn get(&self, id: i64) -> Result<Option<Note>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT id, workspace, title, body FROM notes WHERE id = ?1",
                params![id],
                row_to_note,
            )
            .optional()?)
        })
    }

    fn count(&self, workspace: &str) -> Result<u64, StoreError> {
        self.with(|c| {
            let n: i64 = c.query_row(
                "SELECT count(*) FROM notes WHERE workspace = ?1",
                params![workspace],
                |r| r.get(0),
            )?;
            Ok(count(n))
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

impl TaskStore for SqliteStore {
    fn task_insert(
        &self,
        row: &TaskRow,
        max_per_principal: usize,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM tasks WHERE id IN
                   (SELECT id FROM tasks WHERE expires_ms < ?1 LIMIT ?2)",
                params![to_i64(now_ms), TASK_PURGE_BATCH],
            )?;
            let held: i64 = tx.query_row(
                "SELECT count(*) FROM tasks WHERE principal = ?1 AND expires_ms >= ?2",
                params![row.principal, to_i64(now_ms)],
                |r| r.get(0),
            )?;
            if count(held) >= u64::try_from(max_per_principal).unwrap_or(u64::MAX) {
                tx.commit()?;
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO tasks (id, principal, expires_ms, version, body)
                 VALUES (?1, ?2, ?3, 0, ?4)",
                params![row.id, row.principal, to_i64(row.expires_ms), row.body],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn task_get(&self, id: &str, now_ms: u64) -> Result<Option<TaskRow>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT id, principal, expires_ms, version, body FROM tasks
                 WHERE id = ?1 AND expires_ms >= ?2",
                params![id, to_i64(now_ms)],
                |r| {
                    Ok(TaskRow {
                        id: r.get(0)?,
                        principal: r.get(1)?,
                        expires_ms: count(r.get(2)?),
                        version: r.get(3)?,
                        body: r.get(4)?,
                    })
                },
            )
            .optional()?)
        })
    }

    fn task_replace(&self, row: &TaskRow) -> Result<bool, StoreError> {
        self.with(|c| {
            let n = c.execute(
                "UPDATE tasks SET body = ?1, version = version + 1
                 WHERE id = ?2 AND version = ?3",
                params![row.body, row.id, row.version],
            )?;
            Ok(n == 1)
        })
    }
}

impl Store for SqliteStore {
    fn engine(&self) -> &'static str {
        "sqlite"
    }
}
