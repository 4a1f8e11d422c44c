//! The migration report in a SQLite file (`[report] path`), so a migration trial
//! survives restarts: one row per host identity, its counters as JSON (new counter
//! names need no schema change; names a later build no longer knows are ignored when
//! loaded). One gateway per file: rows hold absolute counts, written by whoever owns
//! the identity.

use super::HostReport;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The schema this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 1;

/// Errors of the report's file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The file could not be opened or prepared.
    #[error("cannot open the migration report file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The file was written by a newer build.
    #[error(
        "the migration report file {path} has schema {found}; this build knows {SCHEMA_VERSION}"
    )]
    Schema {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
    },
    /// Reading or writing failed.
    #[error("migration report file: {source}")]
    Sql {
        /// What SQLite said.
        #[from]
        source: rusqlite::Error,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Counts {
    #[serde(default)]
    requests: BTreeMap<String, u64>,
    #[serde(default)]
    features: BTreeMap<String, u64>,
    #[serde(default)]
    live: BTreeMap<String, BTreeMap<String, u64>>,
    #[serde(default)]
    failures: BTreeMap<String, u64>,
}

/// The open file.
#[derive(Debug)]
pub(super) struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (or creates) the file and its table.
    pub(super) fn open(path: &Path) -> Result<Self, ReportError> {
        let open = |source| ReportError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open)?;
        let found: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(open)?;
        if found > SCHEMA_VERSION {
            return Err(ReportError::Schema {
                path: path.to_owned(),
                found,
            });
        }
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS hosts (
                route TEXT NOT NULL,
                era TEXT NOT NULL,
                name TEXT NOT NULL,
                version TEXT NOT NULL,
                revision TEXT NOT NULL,
                wire TEXT NOT NULL,
                first_seen_ms INTEGER NOT NULL,
                last_seen_ms INTEGER NOT NULL,
                sessions INTEGER NOT NULL,
                counts TEXT NOT NULL,
                PRIMARY KEY (route, era, name, version, revision, wire)
             );
             PRAGMA user_version = 1;",
        )
        .map_err(open)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// The most recently seen `max` rows.
    pub(super) fn load(&self, max: usize) -> Result<Vec<HostReport>, ReportError> {
        let conn = self.conn.lock().map_err(|_| poisoned())?;
        let mut stmt = conn.prepare(
            "SELECT route, era, name, version, revision, wire, first_seen_ms, last_seen_ms,
                    sessions, counts
             FROM hosts ORDER BY last_seen_ms DESC LIMIT ?1",
        )?;
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = stmt.query_map([limit], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, i64>(6)?,
                r.get::<_, i64>(7)?,
                r.get::<_, i64>(8)?,
                r.get::<_, String>(9)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (route, era, name, version, revision, wire, first, last, sessions, counts) = row?;
            let Ok(era) = serde_json::from_value(serde_json::Value::String(era)) else {
                continue;
            };
            let counts: Counts = serde_json::from_str(&counts).unwrap_or_default();
            let n = |v: i64| u64::try_from(v).unwrap_or(0);
            out.push(HostReport {
                route,
                era,
                name,
                version,
                revision,
                wire,
                first_seen: String::new(),
                last_seen: String::new(),
                first_seen_ms: n(first),
                last_seen_ms: n(last),
                sessions: n(sessions),
                request_total: 0,
                requests: counts.requests,
                features: counts.features,
                live: counts.live,
                failures: counts.failures,
                needs: Vec::new(),
                verdict: String::new(),
            });
        }
        Ok(out)
    }

    /// Writes `rows` (absolute counts) in one transaction.
    pub(super) fn save(&self, rows: &[HostReport]) -> Result<(), ReportError> {
        let mut conn = self.conn.lock().map_err(|_| poisoned())?;
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare(
                "INSERT INTO hosts (route, era, name, version, revision, wire, first_seen_ms,
                                    last_seen_ms, sessions, counts)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (route, era, name, version, revision, wire) DO UPDATE SET
                    first_seen_ms = excluded.first_seen_ms,
                    last_seen_ms = excluded.last_seen_ms,
                    sessions = excluded.sessions,
                    counts = excluded.counts",
            )?;
            for row in rows {
                let counts = Counts {
                    requests: row.requests.clone(),
                    features: row.features.clone(),
                    live: row.live.clone(),
                    failures: row.failures.clone(),
                };
                let era = match row.era {
                    super::EraName::Legacy => "legacy",
                    super::EraName::Modern => "modern",
                };
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                stmt.execute(params![
                    row.route,
                    era,
                    row.name,
                    row.version,
                    row.revision,
                    row.wire,
                    n(row.first_seen_ms),
                    n(row.last_seen_ms),
                    n(row.sessions),
                    serde_json::to_string(&counts).unwrap_or_else(|_| "{}".into()),
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

fn poisoned() -> ReportError {
    ReportError::Sql {
        source: rusqlite::Error::InvalidQuery,
    }
}
