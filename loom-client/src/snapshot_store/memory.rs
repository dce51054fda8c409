//! Snapshots in memory. With zstd or deltas it holds frames and decodes on
//! every read, so each read is an independent copy and the store exercises
//! the real format; without, it holds the saved text.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::SystemTime;

use pgloom_core::frame::delta::{self, KeyframePolicy};
use pgloom_core::frame::{self, Codec};

use super::keyframes;
use super::{check_codec, JsonText, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::Result;

#[derive(Debug, Clone)]
enum Stored {
    Text(JsonText),
    Frame(Vec<u8>),
}

impl Stored {
    fn frame(&self) -> Option<&[u8]> {
        match self {
            Stored::Text(_) => None,
            Stored::Frame(frame) => Some(frame),
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    id: i64,
    workflow_id: String,
    created_at: SystemTime,
    state: Stored,
}

#[derive(Debug, Default)]
struct Rows {
    next_id: i64,
    by_execution: BTreeMap<String, BTreeMap<i64, Row>>,
}

/// A [`SnapshotStore`] in memory.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore};
/// let store = MemorySnapshotStore::new(Codec::Zstd)?;
/// let state = JsonText::new(r#"{"turn":3,"a":1}"#.to_owned())?;
/// store.save(&NewSnapshot::new("e", "wf", 3, state.clone())).await?;
/// assert_eq!(store.load_latest("e").await?.unwrap().state, state);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MemorySnapshotStore {
    codec: Codec,
    rows: RwLock<Rows>,
}

impl MemorySnapshotStore {
    /// An empty store writing with `codec`.
    ///
    /// # Errors
    ///
    /// [`crate::Error::CodecUnavailable`] for a codec this build lacks.
    pub fn new(codec: Codec) -> Result<Self> {
        check_codec(codec)?;
        Ok(MemorySnapshotStore {
            codec,
            rows: RwLock::default(),
        })
    }

    fn load_now(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        let rows = self.rows.read().expect("never poisoned");
        let Some(log) = rows.by_execution.get(execution_id) else {
            return Ok(None);
        };
        let found = match query {
            SnapshotQuery::Latest => log.iter().next_back(),
            SnapshotQuery::At(sequence) => log.get_key_value(&sequence),
            SnapshotQuery::Before(sequence) => log.range(..sequence).next_back(),
        };
        found
            .map(|(sequence, row)| {
                let state = match &row.state {
                    Stored::Text(text) => text.clone(),
                    Stored::Frame(frame) => {
                        let base = delta::base_sequence(frame)
                            .and_then(|base| log.get(&base))
                            .and_then(|base| base.state.frame());
                        JsonText::from(delta::decode_json_with_base(frame, base)?)
                    }
                };
                Ok(Snapshot {
                    id: row.id,
                    execution_id: execution_id.to_owned(),
                    workflow_id: row.workflow_id.clone(),
                    sequence: *sequence,
                    created_at: row.created_at,
                    state,
                })
            })
            .transpose()
    }
}

impl SnapshotStore for MemorySnapshotStore {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::unscoped()
    }

    fn snapshot_codec(&self) -> Codec {
        self.codec
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        let plain = match self.codec {
            Codec::None => Some(Stored::Text(snapshot.state.clone())),
            Codec::Zstd => Some(Stored::Frame(frame::encode(
                snapshot.state.as_str(),
                Codec::Zstd,
            )?)),
            Codec::Delta => None,
        };
        let mut rows = self.rows.write().expect("never poisoned");
        let log = rows
            .by_execution
            .entry(snapshot.execution_id.clone())
            .or_default();
        let near = keyframes::near(log, snapshot.sequence, plain.is_none(), |row| {
            row.state.frame()
        });
        let plan = keyframes::plan(near.iter().copied(), snapshot.sequence);
        let state = match plain {
            Some(state) => state,
            None => {
                let keyframe = plan.keyframe.and_then(|k| log.get(&k)?.state.frame());
                Stored::Frame(keyframes::encode(
                    &KeyframePolicy::default(),
                    snapshot.state.as_str(),
                    plan,
                    keyframe,
                )?)
            }
        };
        keyframes::check_replace(
            &snapshot.execution_id,
            snapshot.sequence,
            plan,
            log.get(&snapshot.sequence)
                .and_then(|row| row.state.frame()),
            state.frame(),
        )?;
        let existing = log.get(&snapshot.sequence).map(|row| row.id);
        let id = match existing {
            Some(id) => id,
            None => {
                rows.next_id += 1;
                rows.next_id
            }
        };
        rows.by_execution
            .get_mut(&snapshot.execution_id)
            .expect("just inserted")
            .insert(
                snapshot.sequence,
                Row {
                    id,
                    workflow_id: snapshot.workflow_id.clone(),
                    created_at: SystemTime::now(),
                    state,
                },
            );
        Ok(id)
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.load_now(execution_id, query)
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        let rows = self.rows.read().expect("never poisoned");
        Ok(rows
            .by_execution
            .get(execution_id)
            .and_then(|log| log.keys().next_back().copied()))
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        crate::event_store::check_limit(limit)?;
        let mut rows = self.rows.write().expect("never poisoned");
        let Some(log) = rows.by_execution.get_mut(execution_id) else {
            return Ok(0);
        };
        let rows_of: Vec<(i64, Option<i64>)> = log
            .iter()
            .map(|(s, row)| (*s, row.state.frame().and_then(delta::base_sequence)))
            .collect();
        let doomed: Vec<i64> = keyframes::deletion_order(&rows_of)
            .into_iter()
            .take(limit)
            .collect();
        for sequence in &doomed {
            log.remove(sequence);
        }
        if log.is_empty() {
            rows.by_execution.remove(execution_id);
        }
        Ok(doomed.len() as u64)
    }
}
