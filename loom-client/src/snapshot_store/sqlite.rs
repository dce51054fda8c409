//! Snapshots in SQLite (ADR 0141 D2): no DDL for the codec. The `state`
//! TEXT column holds TEXT for JSON and a BLOB for a frame; the storage
//! class is the discriminator, read per row whatever this store writes.
//! A delta (`0x03`, [`Codec::Delta`]) is read with the keyframe it names,
//! in one read transaction; a delta save and a delete decide in one write
//! transaction (`BEGIN IMMEDIATE`), so that a peer process sharing the
//! file never leaves a delta without its keyframe.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgloom_core::frame::delta::{self, KeyframePolicy};
use pgloom_core::frame::{self, Codec};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::keyframes;
use super::verify::{verify_pages, FrameCheck};
use super::{check_codec, JsonText, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::sqlite_connection::SqliteConnection;
use crate::telemetry::{self, traced, Database};
use crate::Result;

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
    /// [`crate::Error::InvalidPageSize`] for a batch of 0; what SQLite fails with.
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
                        let tx = c.transaction()?;
                        let rows: Vec<(i64, String, i64, Vec<u8>)> = tx
                            .prepare_cached(
                                "SELECT id, execution_id, sequence, state FROM loom_snapshots
                                 WHERE id > ?1 AND typeof(state) = 'blob' ORDER BY id LIMIT ?2",
                            )?
                            .query_map(params![after, limit], |row| {
                                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                            })?
                            .collect::<rusqlite::Result<_>>()?;
                        rows.into_iter()
                            .map(|(id, execution_id, sequence, frame)| {
                                let base = keyframe_of(&tx, &execution_id, &frame)?;
                                Ok((id, execution_id, sequence, frame, base))
                            })
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
                // One read transaction: the row and the keyframe it names.
                let c = c.transaction()?;
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
                let Some((snapshot, state)) = row else {
                    return Ok(None);
                };
                let base = match &state {
                    Stored::Frame(frame) => keyframe_of(&c, &execution_id, frame)?,
                    Stored::Text(_) => None,
                };
                Ok(Some(Snapshot {
                    state: state.decode(base.as_deref())?,
                    ..snapshot
                }))
            })
            .await
    }

    /// A save in one write transaction: a keyframe that deltas name is
    /// replaced only by the same frame, whatever this store's codec (a
    /// peer writing the file may write deltas); a delta store's frame is
    /// decided here from the rows near the save.
    fn save_in(
        c: &mut Connection,
        snapshot: &NewSnapshot,
        write: Write,
        micros: i64,
        db: &Database,
    ) -> Result<i64> {
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (id, sequence) = (&snapshot.execution_id, snapshot.sequence);
        // Every frame after the save (any may name the row saved over)
        // and, for a delta, those before it down to the first keyframe.
        let mut heads: Vec<(i64, Vec<u8>)> = tx
            .prepare_cached(
                "SELECT sequence, substr(state, 1, ?3) FROM loom_snapshots
                 WHERE execution_id = ?1 AND sequence > ?2 AND typeof(state) = 'blob'",
            )?
            .query_map(params![id, sequence, delta::HEADER_BYTES as i64], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        if matches!(write, Write::Delta) {
            let mut select = tx.prepare_cached(
                "SELECT sequence, substr(state, 1, ?3) FROM loom_snapshots
                 WHERE execution_id = ?1 AND sequence < ?2 AND typeof(state) = 'blob'
                 ORDER BY sequence DESC",
            )?;
            let mut rows = select.query(params![id, sequence, delta::HEADER_BYTES as i64])?;
            while let Some(row) = rows.next()? {
                let (at, head): (i64, Vec<u8>) = (row.get(0)?, row.get(1)?);
                let keyframe = keyframes::is_keyframe(&head);
                heads.push((at, head));
                if keyframe {
                    break;
                }
            }
        }
        let plan = keyframes::plan(heads.iter().map(|(s, h)| (*s, h.as_slice())), sequence);
        let frame = match write {
            Write::Text => None,
            Write::Frame(frame) => Some(frame),
            Write::Delta => {
                let keyframe = match plan.keyframe {
                    Some(at) => frame_at(&tx, id, at)?,
                    None => None,
                };
                Some(keyframes::encode(
                    &KeyframePolicy::default(),
                    snapshot.state.as_str(),
                    plan,
                    keyframe.as_deref(),
                )?)
            }
        };
        if plan.target_is_keyframe {
            let stored = frame_at(&tx, id, sequence)?;
            keyframes::check_replace(id, sequence, plan, stored.as_deref(), frame.as_deref())?;
        }
        let mut upsert = tx.prepare_cached(UPSERT)?;
        let saved = match &frame {
            // A BLOB: the storage class says "frame".
            Some(frame) => {
                telemetry::frame_stored(db, frame);
                upsert.query_row(
                    params![id, snapshot.workflow_id, sequence, micros, frame],
                    |r| r.get(0),
                )?
            }
            None => {
                telemetry::snapshot_stored(db, "json", snapshot.state.as_str().len());
                upsert.query_row(
                    params![
                        id,
                        snapshot.workflow_id,
                        sequence,
                        micros,
                        snapshot.state.as_str()
                    ],
                    |r| r.get(0),
                )?
            }
        };
        drop(upsert);
        tx.commit()?;
        Ok(saved)
    }
}

/// What a save writes: the JSON text, a frame encoded already (zstd), or a
/// delta store's frame, decided in the save's transaction.
enum Write {
    Text,
    Frame(Vec<u8>),
    Delta,
}

/// The frame stored at `sequence` of `execution_id`, if it is one.
fn frame_at(
    c: &Connection,
    execution_id: &str,
    sequence: i64,
) -> rusqlite::Result<Option<Vec<u8>>> {
    c.prepare_cached(
        "SELECT state FROM loom_snapshots
         WHERE execution_id = ?1 AND sequence = ?2 AND typeof(state) = 'blob'",
    )?
    .query_row(params![execution_id, sequence], |row| row.get(0))
    .optional()
}

/// The frame of the keyframe `frame` names, if it is a delta and the
/// keyframe is there (a missing one is the delta's decode error).
fn keyframe_of(
    c: &Connection,
    execution_id: &str,
    frame: &[u8],
) -> rusqlite::Result<Option<Vec<u8>>> {
    match delta::base_sequence(frame) {
        Some(base) => frame_at(c, execution_id, base),
        None => Ok(None),
    }
}

/// A row's state as stored: TEXT is JSON, a BLOB is a frame.
enum Stored {
    Text(Vec<u8>),
    Frame(Vec<u8>),
}

impl Stored {
    fn decode(self, base: Option<&[u8]>) -> Result<JsonText> {
        match self {
            // Checked in one pass, UTF-8 and JSON, as a frame's text is.
            Stored::Text(text) => Ok(JsonText::from(frame::decode_bare(text)?)),
            Stored::Frame(frame) => Ok(JsonText::from(telemetry::decode_frame(&frame, base)?)),
        }
    }
}

/// A row, its state as stored (decoded once its keyframe is read).
fn read_row(row: &Row<'_>) -> rusqlite::Result<(Snapshot, Stored)> {
    let state = match row.get_ref(5)? {
        ValueRef::Text(text) => Stored::Text(text.to_vec()),
        ValueRef::Blob(bytes) => Stored::Frame(bytes.to_vec()),
        // A number or NULL was never a state: the empty text, not JSON.
        _ => Stored::Text(Vec::new()),
    };
    let micros: i64 = row.get(4)?;
    let snapshot = Snapshot {
        id: row.get(0)?,
        execution_id: row.get(1)?,
        workflow_id: row.get(2)?,
        sequence: row.get(3)?,
        created_at: UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
        state: JsonText::proven(String::new()),
    };
    Ok((snapshot, state))
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
                let micros = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
                let write = match self.codec {
                    Codec::None => Write::Text,
                    Codec::Zstd => {
                        Write::Frame(frame::encode(snapshot.state.as_str(), Codec::Zstd)?)
                    }
                    Codec::Delta => Write::Delta,
                };
                let db = Arc::clone(&self.db);
                self.connection
                    .run(move |c| Self::save_in(c, &snapshot, write, micros, &db))
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
            self.connection
                .run_sql(move |c| {
                    // Oldest first, each keyframe after the deltas naming
                    // it: no batch leaves a delta without its keyframe.
                    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let rows: Vec<(i64, Option<i64>)> = tx
                        .prepare_cached(
                            "SELECT sequence, CASE typeof(state) WHEN 'blob'
                                 THEN substr(state, 1, ?2) END
                             FROM loom_snapshots WHERE execution_id = ?1",
                        )?
                        .query_map(params![execution_id, delta::HEADER_BYTES as i64], |row| {
                            let head: Option<Vec<u8>> = row.get(1)?;
                            Ok((row.get(0)?, head.as_deref().and_then(delta::base_sequence)))
                        })?
                        .collect::<rusqlite::Result<_>>()?;
                    let mut deleted = 0;
                    {
                        let mut delete = tx.prepare_cached(
                            "DELETE FROM loom_snapshots WHERE execution_id = ?1 AND sequence = ?2",
                        )?;
                        for sequence in keyframes::deletion_order(&rows).into_iter().take(limit) {
                            deleted += delete.execute(params![execution_id, sequence])? as u64;
                        }
                    }
                    tx.commit()?;
                    Ok(deleted)
                })
                .await
        })
        .await
    }
}
