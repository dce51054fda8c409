//! A blocking face for code without an async runtime (scripts, CLIs,
//! synchronous services), as the `postgres` crate is to `tokio-postgres`:
//! each method blocks on the async store's future on the process's one
//! blocking runtime (a worker thread of its own), so blocking stores that
//! share a pool share its connections' drivers too.
//! Every store has one: [`BlockingEventStore`], [`BlockingSnapshotStore`],
//! [`BlockingBranchRegistry`], and [`BlockingEventStore::append_idempotent`]
//! and friends carry the async contracts' errors and guarantees unchanged.
//!
//! Not from inside an async runtime: blocking there panics (tokio refuses a
//! runtime within a runtime), as the `postgres` crate does.

use crate::branch_registry::{BranchRef, BranchRegistry};
use crate::event_store::{Event, EventStore, Page};
use crate::snapshot_store::{NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::Result;

/// The runtime every blocking face blocks on: one for the process, with a
/// worker thread of its own. One, because a pooled connection's driver
/// task lives on the runtime that opened it: with a runtime per store, a
/// connection one blocking store opened and another borrowed from the
/// shared pool would wait forever for a driver nobody runs. A worker of
/// its own, so that the drivers run between the callers' calls too.
fn shared_runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("loom-blocking")
        .enable_all()
        .build()?;
    // Another thread may have built one meanwhile: either serves.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Any [`EventStore`], called synchronously.
///
/// ```
/// use pgloom::blocking::BlockingEventStore;
/// use pgloom::event_store::{Event, MemoryEventStore};
/// let store = BlockingEventStore::new(MemoryEventStore::new())?;
/// store.append(&[Event::new("exec-1", 1, "started", serde_json::json!({}))])?;
/// assert_eq!(store.list_executions_page(None, 10)?.ids, ["exec-1"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockingEventStore<S> {
    store: S,
    runtime: &'static tokio::runtime::Runtime,
}

impl<S: EventStore> BlockingEventStore<S> {
    /// Wraps `store`, to be called from outside any async runtime.
    ///
    /// # Errors
    ///
    /// When the runtime cannot be built (the OS refuses its resources).
    pub fn new(store: S) -> std::io::Result<Self> {
        Ok(BlockingEventStore {
            store,
            runtime: shared_runtime()?,
        })
    }

    /// The async store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }

    /// [`EventStore::append`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn append(&self, events: &[Event]) -> Result<()> {
        self.runtime.block_on(self.store.append(events))
    }

    /// [`EventStore::append_idempotent`], blocking: the retry after an
    /// ambiguous failure.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn append_idempotent(&self, events: &[Event]) -> Result<()> {
        self.runtime.block_on(self.store.append_idempotent(events))
    }

    /// [`EventStore::read_events`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        self.runtime.block_on(self.store.read_events(execution_id))
    }

    /// [`EventStore::read_events_after`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        self.runtime
            .block_on(self.store.read_events_after(execution_id, after, limit))
    }

    /// [`EventStore::delete_events`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        self.runtime
            .block_on(self.store.delete_events(execution_id, through, limit))
    }

    /// [`EventStore::list_executions_page`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        self.runtime
            .block_on(self.store.list_executions_page(after, limit))
    }

    /// Every execution id, page by page: the blocking
    /// [`crate::event_store::iterate_execution_ids`].
    ///
    /// # Errors
    ///
    /// The first error a page returns.
    pub fn execution_ids(&self, page_size: usize) -> Result<Vec<String>> {
        use futures::TryStreamExt;
        self.runtime.block_on(
            crate::event_store::iterate_execution_ids(&self.store, page_size).try_collect(),
        )
    }
}

/// Any [`SnapshotStore`], called synchronously.
///
/// ```
/// use pgloom::blocking::BlockingSnapshotStore;
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot};
/// let store = BlockingSnapshotStore::new(MemorySnapshotStore::new(Codec::Zstd)?)?;
/// store.save(&NewSnapshot::new("run-1", "agentLoop", 3, JsonText::new(r#"{"n":3}"#.to_owned())?))?;
/// assert_eq!(store.load_latest("run-1")?.unwrap().sequence, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockingSnapshotStore<S> {
    store: S,
    runtime: &'static tokio::runtime::Runtime,
}

impl<S: SnapshotStore> BlockingSnapshotStore<S> {
    /// Wraps `store`, to be called from outside any async runtime.
    ///
    /// # Errors
    ///
    /// When the runtime cannot be built (the OS refuses its resources).
    pub fn new(store: S) -> std::io::Result<Self> {
        Ok(BlockingSnapshotStore {
            store,
            runtime: shared_runtime()?,
        })
    }

    /// The async store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }

    /// [`SnapshotStore::save`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        self.runtime.block_on(self.store.save(snapshot))
    }

    /// [`SnapshotStore::load`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.runtime.block_on(self.store.load(execution_id, query))
    }

    /// [`SnapshotStore::load_latest`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn load_latest(&self, execution_id: &str) -> Result<Option<Snapshot>> {
        self.runtime.block_on(self.store.load_latest(execution_id))
    }

    /// [`SnapshotStore::latest_sequence`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        self.runtime
            .block_on(self.store.latest_sequence(execution_id))
    }

    /// [`SnapshotStore::delete_snapshots`], blocking.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        self.runtime
            .block_on(self.store.delete_snapshots(execution_id, limit))
    }
}

/// Any [`BranchRegistry`], called synchronously.
///
/// ```
/// use pgloom::blocking::BlockingBranchRegistry;
/// use pgloom::branch_registry::MemoryBranchRegistry;
/// let refs = BlockingBranchRegistry::new(MemoryBranchRegistry::new())?;
/// refs.put_ref("main", "run-1", 7)?;
/// assert!(refs.promote_ref("main", "release")?);
/// assert_eq!(refs.get_ref("release")?.unwrap().sequence, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockingBranchRegistry<R> {
    registry: R,
    runtime: &'static tokio::runtime::Runtime,
}

impl<R: BranchRegistry> BlockingBranchRegistry<R> {
    /// Wraps `registry`, to be called from outside any async runtime.
    ///
    /// # Errors
    ///
    /// When the runtime cannot be built (the OS refuses its resources).
    pub fn new(registry: R) -> std::io::Result<Self> {
        Ok(BlockingBranchRegistry {
            registry,
            runtime: shared_runtime()?,
        })
    }

    /// The async registry.
    pub fn registry(&self) -> &R {
        &self.registry
    }

    /// [`BranchRegistry::put_ref`], blocking.
    ///
    /// # Errors
    ///
    /// As the registry's.
    pub fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
        self.runtime
            .block_on(self.registry.put_ref(name, execution_id, sequence))
    }

    /// [`BranchRegistry::get_ref`], blocking.
    ///
    /// # Errors
    ///
    /// As the registry's.
    pub fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
        self.runtime.block_on(self.registry.get_ref(name))
    }

    /// [`BranchRegistry::delete_ref`], blocking.
    ///
    /// # Errors
    ///
    /// As the registry's.
    pub fn delete_ref(&self, name: &str) -> Result<bool> {
        self.runtime.block_on(self.registry.delete_ref(name))
    }

    /// [`BranchRegistry::promote_ref`], blocking.
    ///
    /// # Errors
    ///
    /// As the registry's.
    pub fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
        self.runtime.block_on(self.registry.promote_ref(name, onto))
    }

    /// [`BranchRegistry::list_refs`], blocking.
    ///
    /// # Errors
    ///
    /// As the registry's.
    pub fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        self.runtime.block_on(self.registry.list_refs(after, limit))
    }
}
