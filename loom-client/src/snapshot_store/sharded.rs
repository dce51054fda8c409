//! Snapshots spread over several stores, routed as
//! [`ShardedEventStore`](crate::event_store::ShardedEventStore) routes
//! events (the same hash of the execution id, modulo the shard count), so
//! that with shards listed in the same order an execution's snapshots sit
//! on the server that holds its events.

use super::{Codec, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::event_store::shard_index;
use crate::id_scope::IdScope;
use crate::{Error, Result};

/// A [`SnapshotStore`] spread over several stores.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{MemoryEventStore, ShardedEventStore};
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, ShardedSnapshotStore, SnapshotStore};
/// let snapshots = ShardedSnapshotStore::new((0..3).map(|_| MemorySnapshotStore::new(Codec::Zstd).unwrap()).collect())?;
/// let events = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
/// // The same shard as the execution's events.
/// assert_eq!(snapshots.shard_of("run-1"), events.shard_of("run-1"));
/// snapshots.save(&NewSnapshot::new("run-1", "agentLoop", 3, JsonText::new("{}".to_owned())?)).await?;
/// assert_eq!(snapshots.latest_sequence("run-1").await?, Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ShardedSnapshotStore<S> {
    shards: Vec<S>,
}

impl<S: SnapshotStore> ShardedSnapshotStore<S> {
    /// A store over `shards`, in a fixed order (routing depends on the
    /// number and order of shards: keep both stable, and the same as the
    /// event store's).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] with no shards, or with shards that write
    /// different codecs or seal differently (one store reports one codec,
    /// and whether it seals).
    pub fn new(shards: Vec<S>) -> Result<Self> {
        let Some(first) = shards.first() else {
            return Err(Error::Unsupported(
                "a sharded snapshot store without shards",
            ));
        };
        let codec = first.snapshot_codec();
        if shards.iter().any(|s| s.snapshot_codec() != codec) {
            return Err(Error::Unsupported(
                "a sharded snapshot store whose shards write different codecs",
            ));
        }
        // One answer to "are states sealed?" for the whole store: a profiler
        // must never measure a sealed shard's sizes (ADR 0141 D3).
        let sealed = first.seals_whole_state();
        if shards.iter().any(|s| s.seals_whole_state() != sealed) {
            return Err(Error::Unsupported(
                "a sharded snapshot store whose shards do not all seal, or all not seal",
            ));
        }
        Ok(ShardedSnapshotStore { shards })
    }

    /// The shards, in routing order.
    #[must_use]
    pub fn shards(&self) -> &[S] {
        &self.shards
    }

    /// The shard an execution's snapshots live on.
    #[must_use]
    pub fn shard_of(&self, execution_id: &str) -> usize {
        shard_index(execution_id, self.shards.len())
    }

    fn shard(&self, execution_id: &str) -> (usize, &S) {
        let shard = self.shard_of(execution_id);
        (shard, &self.shards[shard])
    }

    /// Names the shard in an error of the shard's own, as the sharded
    /// event store does.
    fn shard_error(&self, shard: usize) -> impl FnOnce(Error) -> Error {
        let shards = self.shards.len();
        move |source| match source {
            Error::InvalidPageSize(_) | Error::InvalidTenant(_) | Error::Unsupported(_) => source,
            _ => Error::Shard {
                shard,
                shards,
                source: Box::new(source),
            },
        }
    }
}

impl<S: SnapshotStore> SnapshotStore for ShardedSnapshotStore<S> {
    fn snapshot_codec(&self) -> Codec {
        self.shards[0].snapshot_codec()
    }

    fn id_scope(&self) -> IdScope {
        IdScope::common(self.shards.iter().map(SnapshotStore::id_scope))
    }

    fn seals_whole_state(&self) -> bool {
        self.shards.iter().any(SnapshotStore::seals_whole_state)
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        let (shard, store) = self.shard(&snapshot.execution_id);
        store.save(snapshot).await.map_err(self.shard_error(shard))
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        let (shard, store) = self.shard(execution_id);
        store
            .load(execution_id, query)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        let (shard, store) = self.shard(execution_id);
        store
            .latest_sequence(execution_id)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        let (shard, store) = self.shard(execution_id);
        store
            .delete_snapshots(execution_id, limit)
            .await
            .map_err(self.shard_error(shard))
    }
}
