//! One tenant's view of a shared snapshot store: the snapshot side of
//! [`TenantScopedEventStore`](crate::event_store::TenantScopedEventStore),
//! storing ids under the same `"{tenant}/"` prefix, so that the two views
//! of one tenant name the same executions and
//! [`resume`](crate::resume::resume) over them reads that tenant's state.

use super::{Codec, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::event_store::{TenantId, TenantPrefix};
use crate::id_scope::IdScope;
use crate::Result;

/// A tenant's [`SnapshotStore`] over a shared one.
///
/// Wrap it outside an [`EncryptingSnapshotStore`](super::EncryptingSnapshotStore)
/// (`TenantScopedSnapshotStore::new(EncryptingSnapshotStore::new(..), tenant)`):
/// the sealing then binds the stored, prefixed id, so a sealed state
/// copied to another tenant's id does not open.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore, TenantId, TenantScopedEventStore};
/// use pgloom::resume::resume;
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore, TenantScopedSnapshotStore};
///
/// let (events, snapshots) = (Arc::new(MemoryEventStore::new()), Arc::new(MemorySnapshotStore::new(Codec::None)?));
/// let acme = TenantId::new("acme")?;
/// let acme_events = TenantScopedEventStore::new(events.clone(), acme.clone());
/// let acme_snapshots = TenantScopedSnapshotStore::new(snapshots.clone(), acme);
///
/// acme_events.append(&[Event::new("run-1", 1, "started", serde_json::json!({}))]).await?;
/// acme_snapshots.save(&NewSnapshot::new("run-1", "agentLoop", 1, JsonText::new("{}".to_owned())?)).await?;
/// assert!(snapshots.load_latest("acme/run-1").await?.is_some());
///
/// let resumed = resume(&acme_events, &acme_snapshots, "run-1").await?;
/// assert_eq!(resumed.snapshot.unwrap().execution_id, "run-1");
/// // acme's events beside the shared snapshots would read `run-1`, not acme's: refused.
/// assert!(matches!(
///     resume(&acme_events, &snapshots, "run-1").await,
///     Err(pgloom::Error::ScopeMismatch { .. })
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TenantScopedSnapshotStore<S> {
    inner: S,
    scope: TenantPrefix,
}

impl<S: SnapshotStore> TenantScopedSnapshotStore<S> {
    /// `tenant`'s view of `inner`.
    pub fn new(inner: S, tenant: TenantId) -> Self {
        TenantScopedSnapshotStore {
            inner,
            scope: TenantPrefix::new(tenant),
        }
    }

    /// The tenant.
    #[must_use]
    pub fn tenant(&self) -> &TenantId {
        self.scope.tenant()
    }

    /// The store under the view.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// A snapshot the inner store returned for a scoped id, as the tenant
    /// names it.
    fn unscoped(&self, snapshot: Option<Snapshot>) -> Option<Snapshot> {
        snapshot.map(|mut s| {
            self.scope.unscope(&mut s.execution_id);
            s
        })
    }
}

impl<S: SnapshotStore> SnapshotStore for TenantScopedSnapshotStore<S> {
    fn snapshot_codec(&self) -> Codec {
        self.inner.snapshot_codec()
    }

    fn id_scope(&self) -> IdScope {
        self.scope.within(self.inner.id_scope())
    }

    fn seals_whole_state(&self) -> bool {
        self.inner.seals_whole_state()
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        let scoped = NewSnapshot {
            execution_id: self.scope.scoped(&snapshot.execution_id)?,
            ..snapshot.clone()
        };
        self.inner.save(&scoped).await
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        let scoped = self.scope.scoped(execution_id)?;
        Ok(self.unscoped(self.inner.load(&scoped, query).await?))
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        let scoped = self.scope.scoped(execution_id)?;
        self.inner.latest_sequence(&scoped).await
    }

    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        let scoped = self.scope.scoped(execution_id)?;
        self.inner.delete_snapshots(&scoped, limit).await
    }
}
