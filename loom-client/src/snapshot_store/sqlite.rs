//! Snapshots in SQLite (ADR 0141 D2): no DDL for the codec. The `state`
//! TEXT column holds TEXT for JSON and a BLOB for a frame; the storage
//! class is the discriminator, read per row whatever this store writes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgloom_core::frame::{self, Codec};
use rusqlite::types::ValueRef;
use rusqlite::{params, OptionalExtension, Row};

use super::verify::{verify_pages, FrameCheck};
use super::{check_codec, JsonText, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::sqlite_connection::SqliteConnection;
use crate::telemetry::{self, traced, Database};
use crate::{Error, Result};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS loom_snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    created_at_us INTEGER NOT NULL,
    state TEXT NOT NULL,
    UNIQUE (execution_id, sequence)
);
";

/// A save: the row for (execution_id, sequence), replaced if it exists.
const UPSERT: &str =
    "INSERT INTO loom_snapshots (execution_id, workflow_id, sequence, created_at_us, state)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (execution_id, sequence) DO UPDATE SET workflow_id = excluded.workflow_id,
         created_at_us = excluded.created_at_us, state = excluded.state
     RETURNING id";

const COLUMNS: &str = "id, execution_id, workflow_id, sequence, created_at_us, state";

/// A [`SnapshotStore`] in a SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteSnapshotStore {
    connection: SqliteConnection,
    codec: Codec,
    db: Arc<Database>,
}

impl SqliteSnapshotStore {
    /// The database file, `None` in memory.
    pub(crate) fn file(&self) -> Option<&Path> {
        self.connection.file()
    }

    /// Opens (creating if needed) the database at `path`, writing with
    /// `codec`.
    ///
    /// # Errors
    ///
    /// When SQLite cannot open it, or the build lacks the codec.
    pub fn open(path: impl AsRef<Path>, codec: Codec) -> Result<Self> {
        check_codec(codec)?;
        Ok(SqliteSnapshotStore {
            connection: SqliteConnection::open(Some(path.as_ref()), SCHEMA)?,
            codec,
            db: Database::sqlite(Some(path.as_ref())),
        })
    }

    /// A private in-memory database, writing with `codec`.
    ///
    /// # Errors
    ///
    /// When the build lacks the codec.
    pub fn open_in_memory(codec: Codec) -> Result<Self> {
        check_codec(codec)?;
        Ok(SqliteSnapshotStore {
            connection: SqliteConnection::open(None, SCHEMA)?,
            codec,
            db: Database::sqlite(None),
        })
    }

    /// Opens an existing database read-only (for inspection: `loom
    /// snapshot show`); a save fails.
    ///
    /// # Errors
    ///
    /// When SQLite cannot open it, or the build lacks the codec.
    pub fn open_read_only(path: impl AsRef<Path>, codec: Codec) -> Result<Self> {
        check_codec(codec)?;
        Ok(SqliteSnapshotStore {
            connection: SqliteConnection::open_read_only(path.as_ref())?,
            codec,
            db: Database::sqlite(Some(path.as_ref())),
        })
    }

    /// The same database, writing with another codec (old rows keep their
    /// format: every store reads both).
    #[must_use]
    pub fn with_codec(&self, codec: Codec) -> Self {
        SqliteSnapshotStore {
            connection: self.connection.clone(),
            codec,
            db: Arc::clone(&self.db),
        }
    }

    /// Decodes every frame (BLOB row) in the file, `batch_size` rows a
    /// query in id order, and lists the rows that do not decode with the
    /// typed cause; writes nothing. As
    /// [`PgSnapshotStore::verify_frames`](super::PgSnapshotStore::verify_frames).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPageSize`] for a batch of 0; what SQLite fails with.
    pub async fn verify_frames(
        &self,
        batch_size: usize,
        on_progress: impl FnMut(&FrameCheck),
    ) -> Result<FrameCheck> {
        traced(&self.db, "verify_frames", None, async {
            let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
            verify_pages(
                batch_size,
                |after| {
                    self.connection.run_sql(move |c| {
                        c.prepare_cached(
                            "SELECT id, execution_id, sequence, state FROM loom_snapshots
                             WHERE id > ?1 AND typeof(state) = 'blob' ORDER BY id LIMIT ?2",
                        )?
                        .query_map(params![after, limit], |row| {
                            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, None))
                        })?
                        .collect()
                    })
                },
                on_progress,
            )
            .await
        })
        .await
    }

    async fn load_rows(
        &self,
        execution_id: &str,
        query: SnapshotQuery,
    ) -> Result<Option<Snapshot>> {
        let execution_id = execution_id.to_owned();
        self.connection
            .run(move |c| {
                let (filter, bound) = match query {
                    SnapshotQuery::Latest => ("", None),
                    SnapshotQuery::At(sequence) => ("AND sequence = ?2", Some(sequence)),
                    SnapshotQuery::Before(sequence) => ("AND sequence < ?2", Some(sequence)),
                };
                let sql = format!(
                    "SELECT {COLUMNS} FROM loom_snapshots WHERE execution_id = ?1 {filter}
                     ORDER BY sequence DESC LIMIT 1"
                );
                let mut select = c.prepare_cached(&sql)?;
                let row = match bound {
                    Some(sequence) => select
                        .query_row(params![execution_id, sequence], read_row)
                        .optional()?,
                    None => select
                        .query_row(params![execution_id], read_row)
                        .optional()?,
                };
                row.transpose()
            })
            .await
    }
}

/// A row, decoded by its storage class: TEXT is JSON, a BLOB is a frame.
fn read_row(row: &Row<'_>) -> rusqlite::Result<Result<Snapshot>> {
    let state = match row.get_ref(5)? {
        // Checked in one pass, UTF-8 and JSON, as a frame's text is.
        ValueRef::Text(text) => frame::decode_bare(text.to_vec())
            .map(JsonText::from)
            .map_err(Error::from),
        ValueRef::Blob(bytes) => telemetry::decode_frame(bytes, None)
            .map(JsonText::from)
            .map_err(Error::from),
        // A number or NULL was never a state.
        _ => JsonText::new(String::new()).map_err(Error::from),
    };
    let micros: i64 = row.get(4)?;
    let (id, execution_id, workflow_id, sequence) =
        (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
    Ok(state.map(|state| Snapshot {
        id,
        execution_id,
        workflow_id,
        sequence,
        created_at: UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
        state,
    }))
}

impl SnapshotStore for SqliteSnapshotStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    fn snapshot_codec(&self) -> Codec {
        self.codec
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        traced(
            &self.db,
            "save_snapshot",
            Some(&snapshot.execution_id),
            async {
                let snapshot = snapshot.clone();
                let frame = match self.codec {
                    Codec::None => None,
                    Codec::Zstd => Some(frame::encode(snapshot.state.as_str(), Codec::Zstd)?),
                };
                match &frame {
                    Some(frame) => telemetry::frame_stored(&self.db, frame),
                    None => {
                        telemetry::snapshot_stored(&self.db, "json", snapshot.state.as_str().len())
                    }
                }
                let micros = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
                self.connection
                    .run_sql(move |c| {
                        let mut statement = c.prepare_cached(UPSERT)?;
                        let (id, workflow, sequence) = (
                            &snapshot.execution_id,
                            &snapshot.workflow_id,
                            snapshot.sequence,
                        );
                        match &frame {
                            // A BLOB: the storage class says "frame".
                            Some(frame) => statement
                                .query_row(params![id, workflow, sequence, micros, frame], |r| {
                                    r.get(0)
                                }),
                            None => statement.query_row(
                                params![id, workflow, sequence, micros, snapshot.state.as_str()],
                                |r| r.get(0),
                            ),
                        }
                    })
                    .await
            },
        )
        .await
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        traced(&self.db, "load_snapshot", Some(execution_id), async {
            self.load_rows(execution_id, query).await
        })
        .await
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        traced(
            &self.db,
            "latest_snapshot_sequence",
            Some(execution_id),
            async {
                let execution_id = execution_id.to_owned();
                self.connection
                    .run_sql(move |c| {
                        c.prepare_cached(
                            "SELECT max(sequence) FROM loom_snapshots WHERE execution_id = ?1",
                        )?
                        .query_row(params![execution_id], |row| row.get(0))
                    })
                    .await
            },
        )
        .await
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        traced(&self.db, "delete_snapshots", Some(execution_id), async {
            crate::event_store::check_limit(limit)?;
            let execution_id = execution_id.to_owned();
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            self.connection
                .run_sql(move |c| {
                    let mut delete = c.prepare_cached(
                        "DELETE FROM loom_snapshots WHERE execution_id = ?1 AND sequence IN (
                             SELECT sequence FROM loom_snapshots WHERE execution_id = ?1
                             ORDER BY sequence LIMIT ?2)",
                    )?;
                    Ok(delete.execute(params![execution_id, limit])? as u64)
                })
                .await
        })
        .await
    }
}
