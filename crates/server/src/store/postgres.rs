//! The PostgreSQL engine: one database shared by several server instances on several
//! machines, so that an MRTR retry may land on any of them and a confirmation still
//! deletes once.
//!
//! Client: the synchronous `postgres` crate pooled by `r2d2`. The handlers are
//! synchronous and already run on tokio's blocking pool (SQLite and file reads block
//! anyway), so a blocking client keeps the two engines behind one synchronous trait
//! with no runtime hand-off per query; `tokio-postgres` + `deadpool` would need a
//! `block_on` into the server's runtime from every handler for the same result. Each
//! pooled client drives its socket on its own small runtime, which is why opening and
//! dropping the pool happen on a plain thread (see [`PostgresStore::open`] and `Drop`):
//! a runtime may not be started or dropped inside an async context.
//!
//! TLS: rustls (ring), through `tokio-postgres-rustls`. The URL's `sslmode` decides
//! whether TLS is used (`disable`; `prefer`, the default: when the server offers it;
//! `require`); whenever it is used the server's certificate chain and name are verified,
//! against `[store] ca_file` when given, else the system's roots. There is no mode that
//! accepts an unverified certificate.
//!
//! Isolation: READ COMMITTED, PostgreSQL's default, on purpose. The single-use guarantee
//! does not rest on snapshots but on the nonce's primary key: the claim is the first
//! statement of the delete transaction (`INSERT … ON CONFLICT DO NOTHING`), and a second
//! transaction inserting the same nonce waits on the first's uncommitted index entry,
//! then finds the conflict once it commits (or inserts if it rolled back). At most one
//! claim of a nonce can therefore commit, at any isolation level. The live note is then
//! re-read `FOR UPDATE`: two different confirmations for one note serialize on its row
//! lock, and the second re-reads after the first commits and finds the note gone, so it
//! rolls back without using its nonce. SERIALIZABLE would add serialization failures
//! (to be retried) and buy nothing here. Listings read in one REPEATABLE READ, READ ONLY
//! transaction so a page and its `total` come from the same snapshot.

use super::{
    count, limit_i64, pending, purge_before, to_i64, DeleteOutcome, ListQuery, LiveCheck,
    NonceClaim, Note, NoteStore, Page, ReplayStore, Store, StoreError, TaskRow, TaskStore,
    TitleMatches, TASK_PURGE_BATCH,
};
use crate::config::StoreSection;
use ::postgres::{Client, IsolationLevel, Row};
use r2d2_postgres::r2d2::{Pool, PooledConnection};
use r2d2_postgres::PostgresConnectionManager;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

type Manager = PostgresConnectionManager<MakeRustlsConnect>;

/// Connections kept by one instance when `[store] max_connections` is not set.
const DEFAULT_MAX_CONNECTIONS: u32 = 16;
/// How long a handler waits for a pooled connection before failing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many expired nonces are purged by one claim (a bounded statement; each
/// claim adds one nonce, so purging keeps up).
const PURGE_BATCH: i64 = 1000;
/// The advisory lock key under which instances migrate one at a time.
const MIGRATION_LOCK: i64 = 0x0064_7561_6c65_7261; // "dualera" in ASCII

/// Versioned migrations; the applied version is the one row of `dualera_schema`.
const MIGRATIONS: &[&str] = &[
    // 1: notes and nonces.
    "CREATE TABLE notes (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        workspace TEXT NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX notes_by_title ON notes (workspace, title, id);
    CREATE TABLE nonces (
        nonce TEXT PRIMARY KEY,
        expires_ms BIGINT NOT NULL
    );
    CREATE INDEX nonces_by_expiry ON nonces (expires_ms);",
    // 2: keyset paging of a workspace by id.
    "CREATE INDEX notes_by_workspace ON notes (workspace, id);",
    // 3: tasks (the io.modelcontextprotocol/tasks extension).
    "CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        expires_ms BIGINT NOT NULL,
        version BIGINT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX tasks_by_principal ON tasks (principal, expires_ms);
    CREATE INDEX tasks_by_expiry ON tasks (expires_ms);",
];

/// The PostgreSQL store.
pub struct PostgresStore {
    pool: Option<Pool<Manager>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.write_str("PostgresStore")
    }
}

impl PostgresStore {
    /// Connects a pool to `url` (`postgres://USER[:PASSWORD]@HOST:PORT/DB`, libpq
    /// parameters after `?`) with `[store] max_connections` and `ca_file`, creating or
    /// migrating the schema. Safe to call from inside an async context: the work
    /// happens on a thread of its own.
    pub fn open(url: &str, section: &StoreSection) -> Result<Self, StoreError> {
        let config: ::postgres::Config = url
            .parse()
            .map_err(|e: ::postgres::Error| StoreError::Url(e.to_string()))?;
        let tls = tls_connector(section.ca_file.as_deref())?;
        let max = section
            .max_connections
            .unwrap_or(DEFAULT_MAX_CONNECTIONS)
            .max(1);
        let mut config = config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECTION_TIMEOUT);
        }
        std::thread::scope(|s| {
            s.spawn(move || {
                // One direct connection first: a wrong password, an unverifiable
                // certificate or an unreachable host fails here at once with its own
                // error (the pool would retry until its timeout), and it migrates.
                let mut first = config.connect(tls.clone())?;
                migrate(&mut first)?;
                drop(first);
                let manager = PostgresConnectionManager::new(config, tls);
                let pool = Pool::builder()
                    .max_size(max)
                    .min_idle(Some(1))
                    .connection_timeout(CONNECTION_TIMEOUT)
                    .build(manager)?;
                Ok(Self { pool: Some(pool) })
            })
            .join()
            .unwrap_or_else(|_| Err(StoreError::Poisoned))
        })
    }

    fn conn(&self) -> Result<PooledConnection<Manager>, StoreError> {
        match &self.pool {
            Some(p) => Ok(p.get()?),
            None => Err(StoreError::Poisoned),
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Dropping a pooled client drops its runtime, which must not happen on an
        // async worker thread (a server shutting down drops its store there).
        if let Some(pool) = self.pool.take() {
            let _ = std::thread::spawn(move || drop(pool)).join();
        }
    }
}

/// The TLS side of every connection: rustls with the ring provider, verifying against
/// `ca_file` (PEM, one or more certificates) or else the system's roots.
fn tls_connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| StoreError::Tls(format!("ca_file {shown}: {e}")))?;
            for cert in certs {
                let cert = cert.map_err(|e| StoreError::Tls(format!("ca_file {shown}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| StoreError::Tls(format!("ca_file {shown}: {e}")))?;
            }
            if roots.is_empty() {
                return Err(StoreError::Tls(format!(
                    "ca_file {shown} holds no certificate"
                )));
            }
        }
        None => {
            // Unreadable system certificates only matter if TLS is then used, and
            // verification will say so.
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| StoreError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Brings the schema to the newest version. Instances starting together take an
/// advisory lock, so one migrates and the others then find the schema current.
fn migrate(conn: &mut Client) -> Result<(), StoreError> {
    let mut tx = conn.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS dualera_schema (version BIGINT NOT NULL)")?;
    let found: i64 = match tx.query_opt("SELECT version FROM dualera_schema", &[])? {
        Some(row) => row.get(0),
        None => {
            tx.execute("INSERT INTO dualera_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    for (version, sql) in pending(MIGRATIONS, found)? {
        tx.batch_execute(sql)?;
        tx.execute("UPDATE dualera_schema SET version = $1", &[&version])?;
    }
    tx.commit()?;
    Ok(())
}

/// A read-only REPEATABLE READ transaction: every statement in it sees one snapshot.
fn snapshot(conn: &mut Client) -> Result<::postgres::Transaction<'_>, StoreError> {
    Ok(conn
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?)
}

fn row_to_note(r: &Row) -> Note {
    Note {
        id: r.get(0),
        workspace: r.get(1),
        title: r.get(2),
        body: r.get(3),
    }
}

/// Forgets nonces whose state expired more than the grace ago, in its own statement
/// and a bounded batch. `SKIP LOCKED` lets instances purging at once take disjoint rows
/// instead of waiting on (or deadlocking with) each other.
fn purge_expired(conn: &mut Client, now_ms: u64) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM nonces WHERE nonce IN (
             SELECT nonce FROM nonces WHERE expires_ms < $1
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        &[&purge_before(now_ms), &PURGE_BATCH],
    )?;
    Ok(())
}

const TEXT_FILTER: &str = "($2::text IS NULL OR strpos(lower(title), lower($2)) > 0
                               OR strpos(lower(body), lower($2)) > 0)";

impl NoteStore for PostgresStore {
    fn create(&self, workspace: &str, title: &str, body: &str) -> Result<Note, StoreError> {
        let row = self.conn()?.query_one(
            "INSERT INTO notes (workspace, title, body) VALUES ($1, $2, $3) RETURNING id",
            &[&workspace, &title, &body],
        )?;
        Ok(Note {
            id: row.get(0),
            workspace: workspace.to_owned(),
            title: title.to_owned(),
            body: body.to_owned(),
        })
    }

    fn list(&self, q: &ListQuery<'_>) -> Result<Page, StoreError> {
        if q.workspaces.is_empty() || q.limit == 0 {
            return Ok(Page::default());
        }
        let mut conn = self.conn()?;
        let mut tx = snapshot(&mut conn)?;
        let after = q.after.unwrap_or(0);
        let rows = tx.query(
            &format!(
                "SELECT id, workspace, title, body FROM notes
                 WHERE workspace = ANY($1) AND {TEXT_FILTER} AND id > $3
                 ORDER BY id LIMIT $4"
            ),
            &[
                &q.workspaces,
                &q.text,
                &after,
                &limit_i64(q.limit.saturating_add(1)),
            ],
        )?;
        let total: i64 = tx
            .query_one(
                &format!("SELECT count(*) FROM notes WHERE workspace = ANY($1) AND {TEXT_FILTER}"),
                &[&q.workspaces, &q.text],
            )?
            .get(0);
        tx.commit()?;
        Ok(Page::cut(
            rows.iter().map(row_to_note).collect(),
            q.limit,
            total,
        ))
    }

    fn by_title(
        &self,
        workspace: &str,
        title: &str,
        limit: usize,
    ) -> Result<TitleMatches, StoreError> {
        let mut conn = self.conn()?;
        let mut tx = snapshot(&mut conn)?;
        let rows = tx.query(
            "SELECT id, workspace, title, body FROM notes
             WHERE workspace = $1 AND title = $2 ORDER BY id DESC LIMIT $3",
            &[&workspace, &title, &limit_i64(limit)],
        )?;
        let total: i64 = tx
            .query_one(
                "SELECT count(*) FROM notes WHERE workspace = $1 AND title = $2",
                &[&workspace, &title],
            )?
            .get(0);
        tx.commit()?;
        Ok(TitleMatches {
            newest: rows.iter().map(row_to_note).collect(),
            total: count(total),
        })
    }

    fn get(&self, id: i64) -> Result<Option<Note>, StoreError> {
        Ok(self
            .conn()?
            .query_opt(
                "SELECT id, workspace, title, body FROM notes WHERE id = $1",
                &[&id],
            )?
            .as_ref()
            .map(row_to_note))
    }

    fn count(&self, workspace: &str) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn()?
            .query_one(
                "SELECT count(*) FROM notes WHERE workspace = $1",
                &[&workspace],
            )?
            .get(0);
        Ok(count(n))
    }

    fn delete_claimed(
        &self,
        claim: &NonceClaim,
        check: &LiveCheck,
    ) -> Result<DeleteOutcome, StoreError> {
        let mut conn = self.conn()?;
        purge_expired(&mut conn, claim.now_ms)?;
        // READ COMMITTED (see the module docs for why that is enough).
        let mut tx = conn
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()?;
        let claimed = tx.execute(
            "INSERT INTO nonces (nonce, expires_ms) VALUES ($1, $2)
             ON CONFLICT (nonce) DO NOTHING",
            &[&claim.nonce, &to_i64(claim.expires_ms)],
        )?;
        if claimed == 0 {
            tx.rollback()?;
            return Ok(DeleteOutcome::Replayed);
        }
        let live = tx
            .query_opt(
                "SELECT id, workspace, title, body FROM notes WHERE id = $1 FOR UPDATE",
                &[&check.id],
            )?
            .as_ref()
            .map(row_to_note)
            .filter(|n| n.workspace == check.workspace && n.title == check.title);
        let Some(note) = live else {
            // Rolling back un-claims the nonce: a note that is gone used nothing.
            tx.rollback()?;
            return Ok(DeleteOutcome::NotLive);
        };
        tx.execute("DELETE FROM notes WHERE id = $1", &[&note.id])?;
        tx.commit()?;
        Ok(DeleteOutcome::Deleted(note))
    }
}

impl ReplayStore for PostgresStore {
    fn claim(&self, claim: &NonceClaim) -> Result<bool, StoreError> {
        let mut conn = self.conn()?;
        purge_expired(&mut conn, claim.now_ms)?;
        let inserted = conn.execute(
            "INSERT INTO nonces (nonce, expires_ms) VALUES ($1, $2)
             ON CONFLICT (nonce) DO NOTHING",
            &[&claim.nonce, &to_i64(claim.expires_ms)],
        )?;
        Ok(inserted == 1)
    }
}

impl TaskStore for PostgresStore {
    fn task_insert(
        &self,
        row: &TaskRow,
        max_per_principal: usize,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn()?;
        let mut tx = conn.transaction()?;
        tx.execute(
            "DELETE FROM tasks WHERE id IN
               (SELECT id FROM tasks WHERE expires_ms < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
            &[&to_i64(now_ms), &TASK_PURGE_BATCH],
        )?;
        // Count and insert under a per-principal lock, so that instances creating
        // tasks for one principal at once cannot both pass the bound.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            &[&row.principal],
        )?;
        let held: i64 = tx
            .query_one(
                "SELECT count(*) FROM tasks WHERE principal = $1 AND expires_ms >= $2",
                &[&row.principal, &to_i64(now_ms)],
            )?
            .get(0);
        if count(held) >= u64::try_from(max_per_principal).unwrap_or(u64::MAX) {
            tx.commit()?;
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO tasks (id, principal, expires_ms, version, body)
             VALUES ($1, $2, $3, 0, $4)",
            &[&row.id, &row.principal, &to_i64(row.expires_ms), &row.body],
        )?;
        tx.commit()?;
        Ok(true)
    }

    fn task_get(&self, id: &str, now_ms: u64) -> Result<Option<TaskRow>, StoreError> {
        let mut conn = self.conn()?;
        Ok(conn
            .query_opt(
                "SELECT id, principal, expires_ms, version, body FROM tasks
                 WHERE id = $1 AND expires_ms >= $2",
                &[&id, &to_i64(now_ms)],
            )?
            .map(|r| TaskRow {
                id: r.get(0),
                principal: r.get(1),
                expires_ms: count(r.get(2)),
                version: r.get(3),
                body: r.get(4),
            }))
    }

    fn task_replace(&self, row: &TaskRow) -> Result<bool, StoreError> {
        let mut conn = self.conn()?;
        let n = conn.execute(
            "UPDATE tasks SET body = $1, version = version + 1 WHERE id = $2 AND version = $3",
            &[&row.body, &row.id, &row.version],
        )?;
        Ok(n == 1)
    }
}

impl Store for PostgresStore {
    fn engine(&self) -> &'static str {
        "postgres"
    }
}
