//! Notes and single-use nonces: the one piece of state the stateless server shares.
//!
//! The interface is two traits, [`NoteStore`] and [`ReplayStore`], with one contract and
//! two engines: SQLite (the embedded default, one file shared by every process on one
//! machine) and PostgreSQL (several instances on several machines). The contract, which
//! `tests/store_contract.rs` checks on both engines with one suite:
//!
//! - Claiming a nonce and deleting a note happen in **one transaction** that re-reads the
//!   live note; two concurrent claims of one nonce cannot both succeed, on any number of
//!   processes or instances.
//! - A nonce whose state expired more than [`NONCE_GRACE_MS`] ago is purged: such a state
//!   no longer verifies anywhere, so its nonce cannot come back.
//! - Listings page by keyset on the note id (ascending): a page starts after the last id
//!   of the previous one, so notes added meanwhile never shift a page and no note is
//!   seen twice. `total` is counted in the same snapshot as the page.
//! - Title lookups name the true number of matches and return a bounded subset: the most
//!   recently created (highest ids) first.
//! - The schema is versioned; a store refuses a schema newer than this build knows.
//! - Tasks (the `io.modelcontextprotocol/tasks` extension, [`TaskStore`]) are one row
//!   each: the columns both engines index (id, principal, expiry) and a version, with
//!   the task itself as one JSON document. A write replaces the document only if the
//!   version is still the one read (compare-and-set), so two instances answering the
//!   same task never both move it on. A principal holds a bounded number of unexpired
//!   tasks; expired ones are purged in bounded batches and never returned.

// Each engine is a Cargo feature (`sqlite`, `postgres`); a store URL naming one this
// build left out is refused by `open_at` with the feature to enable.
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub use self::postgres::PostgresStore;
#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteStore;

use crate::config::StoreSection;
use dualera_common::parts::NotBuilt;

/// Nonces are kept this long past their state's expiry before being purged, so that an
/// instance whose clock runs behind by up to this much still finds them.
pub const NONCE_GRACE_MS: u64 = 60_000;

/// The environment variable that names the store URL (wins over `[store]`).
pub const STORE_URL_ENV: &str = "DUALERA_STORE_URL";

/// Store failures (the caller answers them as internal errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite said no.
    #[cfg(feature = "sqlite")]
    #[error("store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL said no.
    #[cfg(feature = "postgres")]
    #[error("store: {0}")]
    Postgres(#[from] ::postgres::Error),
    /// No PostgreSQL connection could be had from the pool in time.
    #[cfg(feature = "postgres")]
    #[error("store: connection pool: {0}")]
    Pool(#[from] r2d2_postgres::r2d2::Error),
    /// The configured engine is a part this build left out.
    #[error(transparent)]
    NotBuilt(#[from] NotBuilt),
    /// A lock holder panicked earlier.
    #[error("store lock poisoned")]
    Poisoned,
    /// The database was migrated by a newer build.
    #[error(
        "store schema version {found} is newer than this build knows ({known}); upgrade dualera"
    )]
    SchemaTooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build can migrate to.
        known: i64,
    },
    /// The TLS settings for PostgreSQL cannot be used.
    #[error("store tls: {0}")]
    Tls(String),
    /// The store URL cannot be used (the URL itself is never repeated: it may hold a
    /// password).
    #[error("store url: {0}")]
    Url(String),
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

/// One page of a listing.
#[derive(Debug, Clone, Copy)]
pub struct ListQuery<'a> {
    /// Notes in any of these workspaces.
    pub workspaces: &'a [String],
    /// A case-insensitive substring of title or body (ASCII case folding on SQLite;
    /// the database's `lower()` on PostgreSQL).
    pub text: Option<&'a str>,
    /// Only notes with an id above this (the keyset of the previous page).
    pub after: Option<i64>,
    /// At most this many notes.
    pub limit: usize,
}

/// What [`NoteStore::list`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The notes, by ascending id.
    pub notes: Vec<Note>,
    /// How many notes match the query in all (not only after the cursor).
    pub total: u64,
    /// Whether notes with higher ids than the last one returned match too.
    pub more: bool,
}

impl Page {
    /// A page from up to `limit + 1` rows (the extra one only says that more follow)
    /// and the count of all matches.
    fn cut(mut notes: Vec<Note>, limit: usize, total: i64) -> Self {
        let more = notes.len() > limit;
        notes.truncate(limit);
        Self {
            notes,
            total: count(total),
            more,
        }
    }
}

/// What [`NoteStore::by_title`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TitleMatches {
    /// The most recently created matches (descending id), at most the limit asked.
    pub newest: Vec<Note>,
    /// How many notes carry the title.
    pub total: u64,
}

/// Notes.
pub trait NoteStore: Send + Sync {
    /// Adds a note.
    fn create(&self, workspace: &str, title: &str, body: &str) -> Result<Note, StoreError>;
    /// One page of the notes matching `query`.
    fn list(&self, query: &ListQuery<'_>) -> Result<Page, StoreError>;
    /// Notes in `workspace` with exactly this title: how many, and the `limit` most
    /// recently created.
    fn by_title(
        &self,
        workspace: &str,
        title: &str,
        limit: usize,
    ) -> Result<TitleMatches, StoreError>;
    /// One note by id.
    fn get(&self, id: i64) -> Result<Option<Note>, StoreError>;
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

/// Expired tasks purged by one insert at most (a bounded statement; each insert adds
/// one task, so purging keeps up).
const TASK_PURGE_BATCH: i64 = 1000;

/// One stored task: what both engines index, and the task as a JSON document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// The unguessable task id.
    pub id: String,
    /// The principal the task is bound to.
    pub principal: String,
    /// When the task is forgotten (ms since epoch): creation plus its `ttlMs`.
    pub expires_ms: u64,
    /// The version this row was read at (a write stores `version + 1`).
    pub version: i64,
    /// The task document (JSON, written and read by `server::tasks`).
    pub body: String,
}

/// Tasks.
pub trait TaskStore: Send + Sync {
    /// Inserts a new task (version 0) unless its principal already holds
    /// `max_per_principal` unexpired tasks (`false` then). Purges a bounded batch of
    /// expired tasks first.
    fn task_insert(
        &self,
        row: &TaskRow,
        max_per_principal: usize,
        now_ms: u64,
    ) -> Result<bool, StoreError>;
    /// The unexpired task with this id.
    fn task_get(&self, id: &str, now_ms: u64) -> Result<Option<TaskRow>, StoreError>;
    /// Stores `row.body` as version `row.version + 1` if the stored version is still
    /// `row.version`; `false` when another writer came first (nothing changed).
    fn task_replace(&self, row: &TaskRow) -> Result<bool, StoreError>;
}

/// Both halves of the contract, behind one handle.
pub trait Store: NoteStore + ReplayStore + TaskStore + std::fmt::Debug {
    /// Which engine (`sqlite`, `postgres`), for logs.
    fn engine(&self) -> &'static str;
}

/// Where the store is, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file, or `:memory:`.
    Sqlite(String),
    /// A `postgres://` (or `postgresql://`) URL.
    Postgres(String),
}

impl Location {
    /// `DUALERA_STORE_URL` when set and non-empty, else `[store] url`, else
    /// `[store] path` (SQLite, the embedded default).
    pub fn from_section(section: &StoreSection) -> Result<Self, StoreError> {
        let env = std::env::var(STORE_URL_ENV).ok().filter(|u| !u.is_empty());
        match env.or_else(|| section.url.clone()) {
            Some(url) => Self::from_url(&url),
            None => Ok(Self::Sqlite(section.path.clone())),
        }
    }

    /// Classifies a store URL.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres(url.to_owned()))
        } else {
            Err(StoreError::Url(
                "only postgres:// and postgresql:// URLs are supported (SQLite is [store] path)"
                    .into(),
            ))
        }
    }

    /// The Cargo feature that builds this engine in.
    pub fn feature(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Refuses an engine this build left out (checked when the program starts).
    pub fn check_built(&self) -> Result<(), NotBuilt> {
        let built = match self {
            Self::Sqlite(_) => cfg!(feature = "sqlite"),
            Self::Postgres(_) => cfg!(feature = "postgres"),
        };
        if built {
            Ok(())
        } else {
            Err(NotBuilt::new(self.feature()))
        }
    }

    /// A description safe for logs: the PostgreSQL password is never shown.
    pub fn redacted(&self) -> String {
        match self {
            Self::Sqlite(p) => format!("sqlite:{p}"),
            Self::Postgres(url) => redact_url(url),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://…".into();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let tail = tail.split_once('?').map_or(tail, |(path, _)| path);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{masked}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

/// Opens the configured store, creating or migrating its schema.
pub fn open(section: &StoreSection) -> Result<Box<dyn Store>, StoreError> {
    open_at(&Location::from_section(section)?, section)
}

/// Opens the store at `location` (`section` supplies the pool size and TLS roots).
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
pub fn open_at(location: &Location, section: &StoreSection) -> Result<Box<dyn Store>, StoreError> {
    Ok(match location {
        #[cfg(feature = "sqlite")]
        Location::Sqlite(path) => Box::new(SqliteStore::open(path)?),
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => Box::new(PostgresStore::open(url, section)?),
        #[allow(unreachable_patterns)]
        other => return Err(NotBuilt::new(other.feature()).into()),
    })
}

/// The migrations still to apply to a schema at version `found`, each with the version
/// it brings the schema to; refuses a schema newer than `migrations` know.
fn pending<'m>(
    migrations: &'m [&'m str],
    found: i64,
) -> Result<impl Iterator<Item = (i64, &'m str)> + 'm, StoreError> {
    let known = limit_i64(migrations.len());
    if found > known {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    let done = usize::try_from(found).unwrap_or(0);
    Ok(migrations
        .iter()
        .enumerate()
        .skip(done)
        .map(|(i, sql)| (limit_i64(i + 1), *sql)))
}

/// A `count(*)` as an unsigned number.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Milliseconds as the signed integers both databases store.
fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Rows as the signed integers both databases take for `LIMIT`.
fn limit_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The purge threshold: nonces whose state expired before this are forgotten.
fn purge_before(now_ms: u64) -> i64 {
    to_i64(now_ms.saturating_sub(NONCE_GRACE_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:pw@127.0.0.1:5432/db?sslmode=disable"),
            "postgres://u:***@127.0.0.1:5432/db"
        );
        assert_eq!(redact_url("postgresql://u@h/db"), "postgresql://u@h/db");
        assert_eq!(redact_url("postgres://h:1"), "postgres://h:1");
        assert!(Location::from_url("mysql://x").is_err());
        assert_eq!(Note::parse_public_id("note-14"), Some(14));
        assert_eq!(Note::parse_public_id("note--1"), None);
        assert_eq!(Note::parse_public_id("14"), None);
    }
}
