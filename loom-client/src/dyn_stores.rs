//! The store traits as trait objects.
//!
//! [`EventStore`], [`SnapshotStore`] and [`BranchRegistry`] return
//! `impl Future`, which keeps their calls free of boxing and makes them
//! not object-safe. A service that picks its backend at run time, or keeps
//! stores of several kinds in one collection, uses these instead:
//! [`DynEventStore`], [`DynSnapshotStore`] and [`DynBranchRegistry`] are
//! implemented for every store (one box per call), and
//! `Box<dyn DynEventStore>` / `Arc<dyn DynEventStore>` (and the same for the
//! other two) are stores again, so everything built on the traits
//! (resume, retention, the conformance kit, the views) takes them. Their
//! methods are the store traits' with a `dyn_` prefix, so that both
//! traits can be in scope without a call being ambiguous: a boxed store is
//! called through [`EventStore`] as any store is.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use pgloom::dyn_stores::DynEventStore;
//! use pgloom::event_store::{Event, EventStore, MemoryEventStore, SqliteEventStore};
//! let stores: Vec<Box<dyn DynEventStore>> = vec![
//!     Box::new(MemoryEventStore::new()),
//!     Box::new(SqliteEventStore::open_in_memory()?),
//! ];
//! for store in &stores {
//!     store.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
//!     assert_eq!(store.list_executions_page(None, 10).await?.ids, ["run-1"]);
//! }
//! # Ok::<(), pgloom::Error>(()) })?;
//! # Ok::<(), pgloom::Error>(())
//! ```

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::branch_registry::{BranchRef, BranchRegistry};
use crate::contract::ContractVersion;
use crate::event_store::{Event, EventStore, Page};
use crate::id_scope::IdScope;
use crate::snapshot_store::{Codec, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::Result;

/// [`EventStore`], object-safe: each method returns a boxed future.
#[allow(missing_docs)] // each `dyn_` method is its EventStore namesake
pub trait DynEventStore: Send + Sync {
    fn dyn_contract_version(&self) -> ContractVersion;
    fn dyn_id_scope(&self) -> IdScope;
    fn dyn_append<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Result<()>>;
    fn dyn_append_idempotent<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Result<()>>;
    fn dyn_read_events<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Vec<Event>>>;
    fn dyn_list_executions_page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page>>;
    fn dyn_read_events_after<'a>(
        &'a self,
        execution_id: &'a str,
        after: Option<i64>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Event>>>;
    fn dyn_delete_events<'a>(
        &'a self,
        execution_id: &'a str,
        through: Option<i64>,
        limit: usize,
    ) -> BoxFuture<'a, Result<u64>>;
}

impl<S: EventStore> DynEventStore for S {
    fn dyn_contract_version(&self) -> ContractVersion {
        EventStore::contract_version(self)
    }
    fn dyn_id_scope(&self) -> IdScope {
        EventStore::id_scope(self)
    }
    fn dyn_append<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Result<()>> {
        Box::pin(EventStore::append(self, events))
    }
    fn dyn_append_idempotent<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Result<()>> {
        Box::pin(EventStore::append_idempotent(self, events))
    }
    fn dyn_read_events<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Vec<Event>>> {
        Box::pin(EventStore::read_events(self, execution_id))
    }
    fn dyn_list_executions_page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page>> {
        Box::pin(EventStore::list_executions_page(self, after, limit))
    }
    fn dyn_read_events_after<'a>(
        &'a self,
        execution_id: &'a str,
        after: Option<i64>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Event>>> {
        Box::pin(EventStore::read_events_after(
            self,
            execution_id,
            after,
            limit,
        ))
    }
    fn dyn_delete_events<'a>(
        &'a self,
        execution_id: &'a str,
        through: Option<i64>,
        limit: usize,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(EventStore::delete_events(
            self,
            execution_id,
            through,
            limit,
        ))
    }
}

/// A boxed or shared [`DynEventStore`] is an [`EventStore`] again.
macro_rules! event_store_for {
    ($ty:ty) => {
        impl EventStore for $ty {
            fn contract_version(&self) -> ContractVersion {
                DynEventStore::dyn_contract_version(&**self)
            }
            fn id_scope(&self) -> IdScope {
                DynEventStore::dyn_id_scope(&**self)
            }
            async fn append(&self, events: &[Event]) -> Result<()> {
                DynEventStore::dyn_append(&**self, events).await
            }
            async fn append_idempotent(&self, events: &[Event]) -> Result<()> {
                DynEventStore::dyn_append_idempotent(&**self, events).await
            }
            async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
                DynEventStore::dyn_read_events(&**self, execution_id).await
            }
            async fn list_executions_page(
                &self,
                after: Option<&str>,
                limit: usize,
            ) -> Result<Page> {
                DynEventStore::dyn_list_executions_page(&**self, after, limit).await
            }
            async fn read_events_after(
                &self,
                execution_id: &str,
                after: Option<i64>,
                limit: usize,
            ) -> Result<Vec<Event>> {
                DynEventStore::dyn_read_events_after(&**self, execution_id, after, limit).await
            }
            async fn delete_events(
                &self,
                execution_id: &str,
                through: Option<i64>,
                limit: usize,
            ) -> Result<u64> {
                DynEventStore::dyn_delete_events(&**self, execution_id, through, limit).await
            }
        }
    };
}
event_store_for!(Box<dyn DynEventStore>);
event_store_for!(Arc<dyn DynEventStore>);

/// [`SnapshotStore`], object-safe: each method returns a boxed future.
#[allow(missing_docs)] // each `dyn_` method is its SnapshotStore namesake
pub trait DynSnapshotStore: Send + Sync {
    fn dyn_snapshot_codec(&self) -> Codec;
    fn dyn_id_scope(&self) -> IdScope;
    fn dyn_seals_whole_state(&self) -> bool;
    fn dyn_save<'a>(&'a self, snapshot: &'a NewSnapshot) -> BoxFuture<'a, Result<i64>>;
    fn dyn_load<'a>(
        &'a self,
        execution_id: &'a str,
        query: SnapshotQuery,
    ) -> BoxFuture<'a, Result<Option<Snapshot>>>;
    fn dyn_latest_sequence<'a>(
        &'a self,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>>>;
    fn dyn_delete_snapshots<'a>(
        &'a self,
        execution_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<u64>>;
}

impl<S: SnapshotStore> DynSnapshotStore for S {
    fn dyn_snapshot_codec(&self) -> Codec {
        SnapshotStore::snapshot_codec(self)
    }
    fn dyn_id_scope(&self) -> IdScope {
        SnapshotStore::id_scope(self)
    }
    fn dyn_seals_whole_state(&self) -> bool {
        SnapshotStore::seals_whole_state(self)
    }
    fn dyn_save<'a>(&'a self, snapshot: &'a NewSnapshot) -> BoxFuture<'a, Result<i64>> {
        Box::pin(SnapshotStore::save(self, snapshot))
    }
    fn dyn_load<'a>(
        &'a self,
        execution_id: &'a str,
        query: SnapshotQuery,
    ) -> BoxFuture<'a, Result<Option<Snapshot>>> {
        Box::pin(SnapshotStore::load(self, execution_id, query))
    }
    fn dyn_latest_sequence<'a>(
        &'a self,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(SnapshotStore::latest_sequence(self, execution_id))
    }
    fn dyn_delete_snapshots<'a>(
        &'a self,
        execution_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(SnapshotStore::delete_snapshots(self, execution_id, limit))
    }
}

/// A boxed or shared [`DynSnapshotStore`] is a [`SnapshotStore`] again.
macro_rules! snapshot_store_for {
    ($ty:ty) => {
        impl SnapshotStore for $ty {
            fn snapshot_codec(&self) -> Codec {
                DynSnapshotStore::dyn_snapshot_codec(&**self)
            }
            fn id_scope(&self) -> IdScope {
                DynSnapshotStore::dyn_id_scope(&**self)
            }
            fn seals_whole_state(&self) -> bool {
                DynSnapshotStore::dyn_seals_whole_state(&**self)
            }
            async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
                DynSnapshotStore::dyn_save(&**self, snapshot).await
            }
            async fn load(
                &self,
                execution_id: &str,
                query: SnapshotQuery,
            ) -> Result<Option<Snapshot>> {
                DynSnapshotStore::dyn_load(&**self, execution_id, query).await
            }
            async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
                DynSnapshotStore::dyn_latest_sequence(&**self, execution_id).await
            }
            async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
                DynSnapshotStore::dyn_delete_snapshots(&**self, execution_id, limit).await
            }
        }
    };
}
snapshot_store_for!(Box<dyn DynSnapshotStore>);
snapshot_store_for!(Arc<dyn DynSnapshotStore>);

/// [`BranchRegistry`], object-safe: each method returns a boxed future.
#[allow(missing_docs)] // each `dyn_` method is its BranchRegistry namesake
pub trait DynBranchRegistry: Send + Sync {
    fn dyn_contract_version(&self) -> ContractVersion;
    fn dyn_put_ref<'a>(
        &'a self,
        name: &'a str,
        execution_id: &'a str,
        sequence: i64,
    ) -> BoxFuture<'a, Result<()>>;
    fn dyn_get_ref<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<BranchRef>>>;
    fn dyn_delete_ref<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool>>;
    fn dyn_promote_ref<'a>(&'a self, name: &'a str, onto: &'a str) -> BoxFuture<'a, Result<bool>>;
    fn dyn_list_refs<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page>>;
}

impl<R: BranchRegistry> DynBranchRegistry for R {
    fn dyn_contract_version(&self) -> ContractVersion {
        BranchRegistry::contract_version(self)
    }
    fn dyn_put_ref<'a>(
        &'a self,
        name: &'a str,
        execution_id: &'a str,
        sequence: i64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(BranchRegistry::put_ref(self, name, execution_id, sequence))
    }
    fn dyn_get_ref<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<BranchRef>>> {
        Box::pin(BranchRegistry::get_ref(self, name))
    }
    fn dyn_delete_ref<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(BranchRegistry::delete_ref(self, name))
    }
    fn dyn_promote_ref<'a>(&'a self, name: &'a str, onto: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(BranchRegistry::promote_ref(self, name, onto))
    }
    fn dyn_list_refs<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page>> {
        Box::pin(BranchRegistry::list_refs(self, after, limit))
    }
}

/// A boxed or shared [`DynBranchRegistry`] is a [`BranchRegistry`] again.
macro_rules! branch_registry_for {
    ($ty:ty) => {
        impl BranchRegistry for $ty {
            fn contract_version(&self) -> ContractVersion {
                DynBranchRegistry::dyn_contract_version(&**self)
            }
            async fn put_ref(&self, name: &str, execution_id: &str, sequence: i64) -> Result<()> {
                DynBranchRegistry::dyn_put_ref(&**self, name, execution_id, sequence).await
            }
            async fn get_ref(&self, name: &str) -> Result<Option<BranchRef>> {
                DynBranchRegistry::dyn_get_ref(&**self, name).await
            }
            async fn delete_ref(&self, name: &str) -> Result<bool> {
                DynBranchRegistry::dyn_delete_ref(&**self, name).await
            }
            async fn promote_ref(&self, name: &str, onto: &str) -> Result<bool> {
                DynBranchRegistry::dyn_promote_ref(&**self, name, onto).await
            }
            async fn list_refs(&self, after: Option<&str>, limit: usize) -> Result<Page> {
                DynBranchRegistry::dyn_list_refs(&**self, after, limit).await
            }
        }
    };
}
branch_registry_for!(Box<dyn DynBranchRegistry>);
branch_registry_for!(Arc<dyn DynBranchRegistry>);
