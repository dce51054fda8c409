//! The branch registry contract (SPI 2.0.0, ADR 0108's L21 addendum): refs
//! name a point (execution, sequence) and page by name in the same code
//! point order, with the same any-string cursor, as execution ids.

mod memory;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::future::Future;

pub use memory::MemoryBranchRegistry;
#[cfg(feature = "postgres")]
pub use pg::{PgBranchRegistry, PgBranchRegistryOn};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteBranchRegistry;

use crate::contract::ContractVersion;
use crate::event_store::Page;
use crate::Result;

/// A named point in an execution's history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct BranchRef {
    /// The ref's name.
    pub name: String,
    /// The execution it points into.
    pub execution_id: String,
    /// The sequence it points at.
    pub sequence: i64,
}

impl BranchRef {
    /// The ref `name`, at `sequence` of `execution_id` (what a registry
    /// returns; a third-party registry builds its answers with it).
    pub fn new(name: impl Into<String>, execution_id: impl Into<String>, sequence: i64) -> Self {
        BranchRef {
            name: name.into(),
            execution_id: execution_id.into(),
            sequence,
        }
    }
}

/// Named refs that page in code point order (SPI 2.0.0).
///
/// # Cancellation
///
/// A dropped future leaves the registry usable; a put, delete or promotion
/// whose statement was sent may still commit. A put is idempotent; a
/// promotion retried after it committed finds nothing left to move
/// (`false`), so read the target to know.
pub trait BranchRegistry: Send + Sync {
    /// The contract version this registry implements.
    fn contract_version(&self) -> ContractVersion {
        crate::contract::BRANCH_REGISTRY_CONTRACT
    }

    /// Creates the ref `name`, or moves it, to (execution_id, sequence).
    fn put_ref(
        &self,
        name: &str,
        execution_id: &str,
        sequence: i64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The ref `name`, if it exists.
    fn get_ref(&self, name: &str) -> impl Future<Output = Result<Option<BranchRef>>> + Send;

    /// Deletes the ref `name`; true when it existed.
    fn delete_ref(&self, name: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Promotes the branch `name` onto `onto`: `onto` is created or moved to
    /// where `name` points, and `name` is deleted, in one step. False (and
    /// nothing changes) when `name` does not exist.
    fn promote_ref(&self, name: &str, onto: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Up to `limit` ref names strictly after `after` (any string; `None`
    /// for the first page), in Unicode code point order.
    fn list_refs(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Page>> + Send;
}

/// Deletes every ref whose name `prune` accepts, paging with
/// [`BranchRegistry::list_refs`] (`page_size` names at a time) and resuming
/// after the last name seen, deleting as it goes. Returns how many it
/// deleted.
///
/// Contract-driven, so it is right on any conforming registry: deleting
/// behind the cursor never makes a page skip or repeat a name.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::branch_registry::{prune_branch_refs, BranchRegistry, MemoryBranchRegistry};
/// let registry = MemoryBranchRegistry::new();
/// for name in ["keep/main", "tmp/1", "tmp/2"] {
///     registry.put_ref(name, "exec", 1).await?;
/// }
/// assert_eq!(prune_branch_refs(&registry, 1, |name| name.starts_with("tmp/")).await?, 2);
/// assert_eq!(registry.list_refs(None, 10).await?.ids, ["keep/main"]);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// The first error the registry returns; refs deleted before it stay
/// deleted.
pub async fn prune_branch_refs<R: BranchRegistry>(
    registry: &R,
    page_size: usize,
    mut prune: impl FnMut(&str) -> bool + Send,
) -> Result<usize> {
    let mut deleted = 0;
    let mut after: Option<String> = None;
    loop {
        let page = registry.list_refs(after.as_deref(), page_size).await?;
        for name in &page.ids {
            if prune(name) && registry.delete_ref(name).await? {
                deleted += 1;
            }
        }
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => return Ok(deleted),
        }
    }
}
