//! A blocking face for code without an async runtime (scripts, CLIs,
//! synchronous services), as the `postgres` crate is to `tokio-postgres`:
//! each method blocks on the async store's future on a runtime of its own.

use crate::event_store::{Event, EventStore, Page};
use crate::Result;

/// Any [`EventStore`], called synchronously.
///
/// ```
/// use loom_client::blocking::BlockingEventStore;
/// use loom_client::event_store::{Event, MemoryEventStore};
/// let store = BlockingEventStore::new(MemoryEventStore::new())?;
/// store.append(&[Event::new("exec-1", 1, "started", serde_json::json!({}))])?;
/// assert_eq!(store.list_executions_page(None, 10)?.ids, ["exec-1"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockingEventStore<S> {
    store: S,
    runtime: tokio::runtime::Runtime,
}

impl<S: EventStore> BlockingEventStore<S> {
    /// Wraps `store` with a current-thread runtime.
    ///
    /// # Errors
    ///
    /// When the runtime cannot be built (the OS refuses its resources).
    pub fn new(store: S) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(BlockingEventStore { store, runtime })
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
