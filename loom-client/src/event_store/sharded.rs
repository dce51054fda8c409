//! One event store over N (ADR 0074's scatter-gather pager, with ADR
//! 0108's rules): an execution lives on one shard, chosen by a stable hash
//! of its id; a page asks every shard for the ids after the SAME cursor,
//! merges them in code point order and keeps the first `limit`.
//!
//! That is correct only because every shard pages in code point order and
//! takes any id as a cursor: the `limit` smallest ids after the cursor
//! overall are among the `limit` smallest of each shard.

use futures::future::try_join_all;

use super::{check_limit, Event, EventStore, Page};
use crate::{Error, Result};

/// An [`EventStore`] spread over several stores.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use loom_client::event_store::{Event, EventStore, MemoryEventStore, ShardedEventStore};
/// let store = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
/// for id in ["b", "A1", "a_b", "B"] {
///     store.append(&[Event::new(id, 1, "started", serde_json::json!({}))]).await?;
/// }
/// let page = store.list_executions_page(None, 3).await?;
/// assert_eq!(page.ids, ["A1", "B", "a_b"]);
/// assert_eq!(store.list_executions_page(page.next_cursor.as_deref(), 3).await?.ids, ["b"]);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
#[derive(Debug)]
pub struct ShardedEventStore<S> {
    shards: Vec<S>,
}

impl<S: EventStore> ShardedEventStore<S> {
    /// A store over `shards`, in a fixed order: the routing of an id depends
    /// on the number and order of shards, so keep both stable.
    ///
    /// # Panics
    ///
    /// With no shards.
    #[must_use]
    pub fn new(shards: Vec<S>) -> Self {
        assert!(
            !shards.is_empty(),
            "a sharded store needs at least one shard"
        );
        ShardedEventStore { shards }
    }

    /// The shards, in routing order.
    #[must_use]
    pub fn shards(&self) -> &[S] {
        &self.shards
    }

    /// The shard an execution lives on: FNV-1a of its id's bytes, modulo
    /// the shard count. Stable across processes and releases.
    #[must_use]
    pub fn shard_of(&self, execution_id: &str) -> usize {
        let hash = execution_id.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
        });
        (hash % self.shards.len() as u64) as usize
    }

    /// Names the shard in an error of the shard's own (a server down); an
    /// error about the request itself (a duplicate event) stays as it is,
    /// so callers match it the same way on any store.
    fn shard_error(&self, shard: usize) -> impl FnOnce(Error) -> Error {
        let shards = self.shards.len();
        move |source| match source {
            Error::DuplicateEvent { .. } | Error::InvalidPageSize(_) | Error::InvalidTenant(_) => {
                source
            }
            _ => Error::Shard {
                shard,
                shards,
                source: Box::new(source),
            },
        }
    }
}

impl<S: EventStore> EventStore for ShardedEventStore<S> {
    async fn append(&self, events: &[Event]) -> Result<()> {
        let mut by_shard: Vec<Vec<Event>> = vec![Vec::new(); self.shards.len()];
        for event in events {
            by_shard[self.shard_of(&event.execution_id)].push(event.clone());
        }
        try_join_all(
            by_shard
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.is_empty())
                .map(|(shard, events)| async move {
                    self.shards[shard]
                        .append(events)
                        .await
                        .map_err(self.shard_error(shard))
                }),
        )
        .await?;
        Ok(())
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        let shard = self.shard_of(execution_id);
        self.shards[shard]
            .read_events(execution_id)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        // Every shard, the same cursor; one failing shard fails the page.
        let pages = try_join_all(
            self.shards
                .iter()
                .enumerate()
                .map(|(shard, store)| async move {
                    store
                        .list_executions_page(after, limit)
                        .await
                        .map_err(self.shard_error(shard))
                }),
        )
        .await?;
        let mut ids: Vec<String> = pages.into_iter().flat_map(|page| page.ids).collect();
        ids.sort_unstable_by(|a, b| loom_core::compare_execution_ids(a, b));
        ids.dedup();
        ids.truncate(limit);
        Ok(Page::from_ids(ids, limit))
    }
}
