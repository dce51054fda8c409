//! Every store of one [`StoreConfig`]: events, snapshots and refs, on
//! shared pools, from the one string a service is configured with.

use std::sync::Arc;

use crate::branch_registry::MemoryBranchRegistry;
use crate::dyn_stores::{DynBranchRegistry, DynSnapshotStore};
use crate::event_store::{
    ConfiguredEventStore, MemoryEventStore, ShardedEventStore, SingleStore, StoreConfig,
};
use crate::snapshot_store::{
    check_codec, Codec, MemorySnapshotStore, ShardedSnapshotStore, SnapshotStore,
};
use crate::{Error, Result};

/// The three stores a service works with, from one [`StoreConfig`]: on
/// PostgreSQL all three share each database's pool.
///
/// A sharded configuration shards events and snapshots alike (an
/// execution's snapshots sit on the shard of its events) and keeps the
/// refs, which are few and name executions of every shard, on the first
/// shard.
#[derive(Clone)]
#[non_exhaustive]
pub struct Stores {
    /// The event store.
    pub events: Arc<ConfiguredEventStore>,
    /// The snapshot store, writing the codec the options asked for.
    pub snapshots: Arc<dyn DynSnapshotStore>,
    /// The branch registry.
    pub refs: Arc<dyn DynBranchRegistry>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("events", &self.events)
            .field("snapshots", &self.snapshots.snapshot_codec())
            .finish_non_exhaustive()
    }
}

/// How [`StoreConfig::open_stores`] opens them. `Default` is
/// [`StoresOptions::new`].
#[derive(Debug, Clone, Default)]
pub struct StoresOptions {
    codec: Codec,
    #[cfg(feature = "postgres")]
    pool: crate::PgPoolOptions,
    #[cfg(feature = "postgres")]
    snapshots: crate::snapshot_store::PgSnapshotStoreOptions,
}

impl StoresOptions {
    /// Snapshots as JSON (no codec), pools as [`crate::PgPoolOptions::new`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The codec snapshots are written with. Default [`Codec::None`].
    pub fn codec(&mut self, codec: Codec) -> &mut Self {
        self.codec = codec;
        self
    }

    /// Each PostgreSQL database's pool.
    #[cfg(feature = "postgres")]
    pub fn pool(&mut self, pool: &crate::PgPoolOptions) -> &mut Self {
        self.pool = pool.clone();
        self
    }

    /// The PostgreSQL snapshot stores' options (their codec is
    /// [`StoresOptions::codec`]'s).
    #[cfg(feature = "postgres")]
    pub fn snapshots(
        &mut self,
        options: &crate::snapshot_store::PgSnapshotStoreOptions,
    ) -> &mut Self {
        self.snapshots = options.clone();
        self
    }
}

impl StoreConfig {
    /// Opens events, snapshots and refs where this configuration says, on
    /// shared pools.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use pgloom::event_store::{Event, EventStore, StoreConfig};
    /// use pgloom::stores::StoresOptions;
    /// use pgloom::resume::resume;
    /// use pgloom::snapshot_store::{Codec, JsonText, NewSnapshot, SnapshotStore};
    /// let config: StoreConfig = "memory:".parse()?;
    /// let stores = config.open_stores(StoresOptions::new().codec(Codec::Zstd)).await?;
    /// stores.events.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
    /// stores.snapshots.save(&NewSnapshot::new("run-1", "agentLoop", 1, JsonText::new("{}".to_owned())?)).await?;
    /// let resumed = resume(&stores.events, &stores.snapshots, "run-1").await?;
    /// assert_eq!(resumed.snapshot.unwrap().sequence, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`StoreConfig::open`]; a codec this build lacks; what a
    /// PostgreSQL snapshot store's start fails with.
    pub async fn open_stores(&self, options: &StoresOptions) -> Result<Stores> {
        check_codec(options.codec)?;
        match self {
            StoreConfig::Sharded(shards) => {
                let mut events = Vec::with_capacity(shards.len());
                let mut snapshots = Vec::with_capacity(shards.len());
                let mut refs = Vec::with_capacity(shards.len());
                for shard in shards {
                    let (e, s, r) = shard.open_single_stores(options).await?;
                    events.push(e);
                    snapshots.push(s);
                    refs.push(r);
                }
                let first_refs = refs
                    .into_iter()
                    .next()
                    .ok_or(Error::Unsupported("a sharded configuration without shards"))?;
                Ok(Stores {
                    events: Arc::new(ConfiguredEventStore::Sharded(ShardedEventStore::new(
                        events,
                    ))),
                    snapshots: Arc::new(ShardedSnapshotStore::new(snapshots)?),
                    refs: first_refs,
                })
            }
            single => {
                let (events, snapshots, refs) = single.open_single_stores(options).await?;
                Ok(Stores {
                    events: Arc::new(ConfiguredEventStore::Single(events)),
                    snapshots,
                    refs,
                })
            }
        }
    }

    /// One database's three stores, sharing its pool (or file).
    async fn open_single_stores(
        &self,
        options: &StoresOptions,
    ) -> Result<(
        SingleStore,
        Arc<dyn DynSnapshotStore>,
        Arc<dyn DynBranchRegistry>,
    )> {
        Ok(match self {
            StoreConfig::Memory => (
                SingleStore::Memory(MemoryEventStore::new()),
                Arc::new(MemorySnapshotStore::new(options.codec)?),
                Arc::new(MemoryBranchRegistry::new()),
            ),
            // Each a private database of its own: ":memory:" cannot be
            // shared between connections.
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) if path == ":memory:" => (
                SingleStore::Sqlite(crate::event_store::SqliteEventStore::open_in_memory()?),
                Arc::new(crate::snapshot_store::SqliteSnapshotStore::open_in_memory(
                    options.codec,
                )?),
                Arc::new(crate::branch_registry::SqliteBranchRegistry::open_in_memory()?),
            ),
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) => (
                SingleStore::Sqlite(crate::event_store::SqliteEventStore::open(path)?),
                Arc::new(crate::snapshot_store::SqliteSnapshotStore::open(
                    path,
                    options.codec,
                )?),
                Arc::new(crate::branch_registry::SqliteBranchRegistry::open(path)?),
            ),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres(conninfo) | StoreConfig::Citus(conninfo) => {
                let pool = crate::PgPool::connect_with(conninfo, &options.pool)?;
                let events = if matches!(self, StoreConfig::Citus(_)) {
                    crate::event_store::PgEventStore::new_citus(pool.clone())
                } else {
                    crate::event_store::PgEventStore::new(pool.clone())
                };
                let mut snapshot_options = options.snapshots.clone();
                snapshot_options.codec(options.codec);
                (
                    SingleStore::Postgres(events),
                    Arc::new(
                        crate::snapshot_store::PgSnapshotStore::start(
                            pool.clone(),
                            &snapshot_options,
                        )
                        .await?,
                    ),
                    Arc::new(crate::branch_registry::PgBranchRegistry::new(pool)),
                )
            }
            _ => return Err(Error::BackendUnavailable),
        })
    }
}
