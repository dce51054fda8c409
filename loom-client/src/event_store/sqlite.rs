//! An event store in SQLite, the embedded default for a service without
//! Postgres.
//!
//! An unqualified TEXT column compares with SQLite's BINARY collation,
//! memcmp of the UTF-8 bytes: loom's code point order with no conversion
//! (ADR 0108: SQLite already conformed). SQLite calls block, so they run on
//! tokio's blocking pool.

use std::path::Path;
use std::sync::Arc;

use rusqlite::{params, ErrorCode, OptionalExtension};

use super::{check_limit, check_payloads, single_execution, Event, EventStore, Page, Payload};
use crate::retention::ExecutionActivity;
use crate::sqlite_connection::SqliteConnection;
use crate::telemetry::{traced, Database};
use crate::{Error, Result};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS loom_events (
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    metadata TEXT,
    PRIMARY KEY (execution_id, sequence)
) WITHOUT ROWID;
";

/// Whether the file's table has the metadata column.
fn has_metadata_column(connection: &rusqlite::Connection) -> rusqlite::Result<bool> {
    connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('loom_events') WHERE name = 'metadata')",
        [],
        |row| row.get(0),
    )
}

/// A file an older pgloom wrote has no metadata column: added, NULL
/// on every event it holds (SQLite adds a column without touching rows),
/// in an immediate transaction that looks again (two processes opening one
/// old file add it once). Looked for without writing first, so opening a
/// current file writes nothing; a file that cannot be written (read-only)
/// is read as it is: whether the column is there is the answer.
fn add_metadata_column(connection: &mut rusqlite::Connection) -> rusqlite::Result<bool> {
    if has_metadata_column(connection)? {
        return Ok(true);
    }
    let added = (|| {
        let tx = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if !has_metadata_column(&tx)? {
            tx.execute_batch("ALTER TABLE loom_events ADD COLUMN metadata TEXT")?;
        }
        tx.commit()
    })();
    match added {
        Ok(()) => Ok(true),
        Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == ErrorCode::ReadOnly => Ok(false),
        Err(e) => Err(e),
    }
}

/// A keyset read of one log: its last column the metadata (or NULL where
/// the file has no such column), the sequence compared by `>` (after a
/// cursor) or `>=` (from a bound nothing is below).
macro_rules! read_events {
    ($metadata:literal, $after:literal) => {
        concat!(
            "SELECT sequence, kind, payload, ",
            "CAST(round((julianday(created_at) - 2440587.5) * 86400000000.0) AS INTEGER), ",
            $metadata,
            " FROM loom_events WHERE execution_id = ?1 AND sequence ",
            $after,
            " ?2 ORDER BY sequence LIMIT ?3"
        )
    };
}

const INSERT: &str = "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata) \
     VALUES (?1, ?2, ?3, ?4, ?5)";

/// A page of ids as a loose index scan: one probe of the primary key per
/// distinct id (the next id after the last), so a page costs what it
/// returns, not every event of every execution on it (as DISTINCT did).
/// Two statements, because `?1 IS NULL OR id > ?1` keeps SQLite from
/// seeking the index.
const PAGE_FIRST: &str = "WITH RECURSIVE ids(id) AS (
         SELECT (SELECT execution_id FROM loom_events ORDER BY execution_id LIMIT 1)
         UNION ALL
         SELECT (SELECT execution_id FROM loom_events WHERE execution_id > ids.id ORDER BY execution_id LIMIT 1)
         FROM ids WHERE ids.id IS NOT NULL
     )
     SELECT id FROM ids WHERE id IS NOT NULL LIMIT ?1";
const PAGE_AFTER: &str = "WITH RECURSIVE ids(id) AS (
         SELECT (SELECT execution_id FROM loom_events WHERE execution_id > ?1 ORDER BY execution_id LIMIT 1)
         UNION ALL
         SELECT (SELECT execution_id FROM loom_events WHERE execution_id > ids.id ORDER BY execution_id LIMIT 1)
         FROM ids WHERE ids.id IS NOT NULL
     )
     SELECT id FROM ids WHERE id IS NOT NULL LIMIT ?2";

/// An [`EventStore`] in a SQLite database file (or in memory).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, SqliteEventStore};
/// let store = SqliteEventStore::open_in_memory()?;
/// store.append(&[Event::new("exec-1", 1, "started", serde_json::json!({"n": 1}))]).await?;
/// assert_eq!(store.read_events("exec-1").await?[0].payload, serde_json::json!({"n": 1}));
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SqliteEventStore {
    connection: SqliteConnection,
    db: Arc<Database>,
    /// False only for an older file that could not be given the column
    /// (read-only): its events are read with no metadata.
    metadata_column: bool,
}

impl SqliteEventStore {
    /// Opens (creating if needed) the database at `path`.
    ///
    /// # Errors
    ///
    /// When SQLite cannot open it or create the table.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let (connection, metadata_column) =
            SqliteConnection::open_upgraded(Some(path.as_ref()), SCHEMA, add_metadata_column)?;
        Ok(SqliteEventStore {
            connection,
            db: Database::sqlite(Some(path.as_ref())),
            metadata_column,
        })
    }

    /// A private in-memory database.
    ///
    /// # Errors
    ///
    /// When SQLite cannot create the table.
    pub fn open_in_memory() -> Result<Self> {
        let (connection, metadata_column) =
            SqliteConnection::open_upgraded(None, SCHEMA, add_metadata_column)?;
        Ok(SqliteEventStore {
            connection,
            db: Database::sqlite(None),
            metadata_column,
        })
    }

    /// What its spans name: SQLite, and the file.
    pub(crate) fn database(&self) -> &Database {
        &self.db
    }
}

impl EventStore for SqliteEventStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    async fn append(&self, events: &[Event]) -> Result<()> {
        traced(&self.db, "append", single_execution(events), async {
            check_payloads(events)?;
            let events = events.to_vec();
            self.connection
                .run(move |connection| {
                    let tx = connection.transaction()?;
                    {
                        let mut insert = tx.prepare_cached(INSERT)?;
                        for event in &events {
                            let inserted = insert.execute(params![
                                event.execution_id,
                                event.sequence,
                                event.kind,
                                event.payload.as_str(),
                                event.stored_metadata().map(Payload::as_str)
                            ]);
                            match inserted {
                                Err(rusqlite::Error::SqliteFailure(e, _))
                                    if e.code == ErrorCode::ConstraintViolation =>
                                {
                                    return Err(Error::DuplicateEvent {
                                        execution_id: event.execution_id.clone(),
                                        sequence: event.sequence,
                                    });
                                }
                                other => {
                                    other?;
                                }
                            }
                        }
                    }
                    tx.commit()?;
                    Ok(())
                })
                .await
        })
        .await
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        self.read_events_after(execution_id, None, usize::MAX).await
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        traced(&self.db, "read_events", Some(execution_id), async {
            check_limit(limit)?;
            let execution_id = execution_id.to_owned();
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let metadata_column = self.metadata_column;
            self.connection
                .run(move |connection| {
                    // A keyset read over the primary key (execution_id, sequence);
                    // from the first event, a sequence bound that nothing is below.
                    let mut select = connection.prepare_cached(match (after, metadata_column) {
                        (Some(_), true) => read_events!("metadata", ">"),
                        (None, true) => read_events!("metadata", ">="),
                        // An older file opened read-only: no column, no metadata.
                        (Some(_), false) => read_events!("NULL", ">"),
                        (None, false) => read_events!("NULL", ">="),
                    })?;
                    let bound = after.unwrap_or(i64::MIN);
                    let rows = select.query_map(params![execution_id, bound, limit], |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, Option<String>>(4)?,
                        ))
                    })?;
                    rows.map(|row| {
                        let (sequence, kind, payload, micros, metadata) = row?;
                        // Text, as written: exact whatever its depth or numbers.
                        let json = |field: &'static str, text: String| {
                            Payload::new(text).map_err(|source| Error::InvalidPayload {
                                execution_id: execution_id.clone(),
                                sequence,
                                field,
                                source,
                            })
                        };
                        Ok(Event {
                            execution_id: execution_id.clone(),
                            sequence,
                            kind,
                            payload: json("payload", payload)?,
                            created_at: Some(super::from_epoch_micros(micros)),
                            metadata: metadata
                                .map(|m| json("metadata", m))
                                .transpose()?
                                .filter(|m| !m.is_null()),
                        })
                    })
                    .collect()
                })
                .await
        })
        .await
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        traced(&self.db, "delete_events", Some(execution_id), async {
            check_limit(limit)?;
            let execution_id = execution_id.to_owned();
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            self.connection
                .run(move |connection| {
                    let mut delete = connection.prepare_cached(
                        "DELETE FROM loom_events WHERE execution_id = ?1 AND sequence IN (
                             SELECT sequence FROM loom_events
                             WHERE execution_id = ?1 AND (?2 IS NULL OR sequence <= ?2)
                             ORDER BY sequence LIMIT ?3)",
                    )?;
                    Ok(delete.execute(params![execution_id, through, limit])? as u64)
                })
                .await
        })
        .await
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        traced(&self.db, "list_executions", None, async {
            check_limit(limit)?;
            let after = after.map(str::to_owned);
            let ids = self
                .connection
                .run_sql(move |connection| page_ids(connection, after.as_deref(), limit))
                .await?;
            Ok(Page::from_ids(ids, limit))
        })
        .await
    }
}

/// One page of ids after `after`: BINARY collation, byte order, which is
/// code point order.
fn page_ids(
    connection: &rusqlite::Connection,
    after: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<String>> {
    let mut select = connection.prepare_cached(match after {
        None => PAGE_FIRST,
        Some(_) => PAGE_AFTER,
    })?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let id = |row: &rusqlite::Row<'_>| row.get::<_, String>(0);
    let ids = match after {
        None => select.query_map(params![limit], id)?,
        Some(after) => select.query_map(params![after, limit], id)?,
    };
    ids.collect()
}

/// An execution's last event: its sequence and `created_at` in
/// microseconds since the epoch (the text column, read by SQLite's own
/// date functions), by one descent of the primary key.
const LAST_EVENT: &str = "SELECT sequence,
        CAST(round((julianday(created_at) - 2440587.5) * 86400000000.0) AS INTEGER)
     FROM loom_events WHERE execution_id = ?1 ORDER BY sequence DESC LIMIT 1";

/// Which of the tables a sweep deletes from are in this file beside
/// `loom_events` (the snapshot and ref stores may use others).
const SIBLING_TABLES: &str = "SELECT name FROM sqlite_master
     WHERE type = 'table' AND name IN ('loom_snapshots', 'loom_refs')";

impl SqliteEventStore {
    /// The database file, `None` in memory.
    pub(crate) fn file(&self) -> Option<&Path> {
        self.connection.file()
    }

    /// Deletes one idle execution whole, as a sweep by age does: in one
    /// write transaction (`BEGIN IMMEDIATE`: every append's transaction
    /// waits for it, and it for them), and only if its last event is still
    /// `activity`'s, its snapshots and the refs pointing at it (where this
    /// file holds those tables), then its events. `None` when an append
    /// landed since `activity` was read: nothing is deleted, so a resume
    /// still finds the whole history.
    pub(crate) async fn delete_idle_execution(
        &self,
        activity: &ExecutionActivity,
    ) -> Result<Option<u64>> {
        let id = activity.execution_id.clone();
        let expected = (activity.last_sequence, activity.stored_micros());
        self.connection
            .run_sql(move |connection| {
                let tx = connection
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let last: Option<(i64, i64)> = tx
                    .query_row(LAST_EVENT, params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                if last != Some(expected) {
                    return Ok(None);
                }
                let siblings: Vec<String> = tx
                    .prepare(SIBLING_TABLES)?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let mut deleted = 0;
                for table in siblings {
                    // Names from the fixed list above, not from input.
                    deleted += tx.execute(
                        &format!("DELETE FROM {table} WHERE execution_id = ?1"),
                        params![id],
                    )?;
                }
                deleted += tx.execute(
                    "DELETE FROM loom_events WHERE execution_id = ?1 AND sequence <= ?2",
                    params![id, expected.0],
                )?;
                tx.commit()?;
                Ok(Some(deleted as u64))
            })
            .await
    }

    /// One page of execution ids after `after`, each with when it was last
    /// written (its last event), as
    /// [`PgEventStore::execution_activity`](super::PgEventStore::execution_activity)
    /// reads it in PostgreSQL: one descent of the primary key an id. What
    /// `loom retention --older-than` reads in a SQLite file.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use pgloom::event_store::{Event, EventStore, SqliteEventStore};
    /// let store = SqliteEventStore::open_in_memory()?;
    /// store.append(&[Event::new("exec-1", 7, "step", serde_json::json!({}))]).await?;
    /// let page = store.execution_activity(None, 100).await?;
    /// assert_eq!((page[0].execution_id.as_str(), page[0].last_sequence), ("exec-1", 7));
    /// # Ok::<(), pgloom::Error>(()) })?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a page of 0; what SQLite fails with.
    pub async fn execution_activity(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExecutionActivity>> {
        traced(&self.db, "execution_activity", None, async {
            check_limit(limit)?;
            let after = after.map(str::to_owned);
            self.connection
                .run_sql(move |connection| {
                    let ids = page_ids(connection, after.as_deref(), limit)?;
                    let mut last = connection.prepare_cached(LAST_EVENT)?;
                    let mut page = Vec::with_capacity(ids.len());
                    for execution_id in ids {
                        let (last_sequence, micros): (i64, i64) =
                            last.query_row(params![execution_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                        page.push(ExecutionActivity::new(execution_id, last_sequence, micros));
                    }
                    Ok(page)
                })
                .await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file an older pgloom wrote (no metadata column) is opened
    /// as it is, gets the column, and keeps its events.
    #[test]
    fn an_older_file_gets_the_metadata_column_and_keeps_its_events() {
        let path = std::env::temp_dir().join(format!("loom-sqlite-old-{}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        {
            let old = rusqlite::Connection::open(&path).unwrap();
            old.execute_batch(
                "CREATE TABLE loom_events (
                     execution_id TEXT NOT NULL, sequence INTEGER NOT NULL,
                     kind TEXT NOT NULL, payload TEXT NOT NULL,
                     created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
                     PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID;
                 INSERT INTO loom_events (execution_id, sequence, kind, payload)
                 VALUES ('run-1', 1, 'started', '{\"n\": 1}');",
            )
            .unwrap();
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = SqliteEventStore::open(&path)?;
            // Opened twice: the column is added once.
            let again = SqliteEventStore::open(&path)?;
            let traced = Event::new("run-1", 2, "step", serde_json::json!({}))
                .with_metadata(serde_json::json!({"trace_id": "t"}));
            again.append(std::slice::from_ref(&traced)).await?;
            let read = store.read_events("run-1").await?;
            assert_eq!(read.len(), 2);
            assert_eq!(read[0].metadata, None);
            assert_eq!(read[1], traced);
            Ok::<_, Error>(())
        })
        .unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
