//! One event store over N (ADR 0074's scatter-gather pager, with ADR
//! 0108's rules): an execution lives on one shard, chosen by a stable hash
//! of its id; a page asks every shard for the ids after the SAME cursor,
//! k-way merges them in code point order and keeps the first `limit`.
//!
//! That is correct only because every shard pages in code point order and
//! takes any id as a cursor: the `limit` smallest ids after the cursor
//! overall are among the `limit` smallest of each shard.

use std::collections::VecDeque;

use futures::future::try_join_all;

use super::{check_limit, check_payloads, Event, EventStore, Page};
use crate::{Error, Result};

/// The shard of `execution_id` among `shards`: FNV-1a of its bytes, modulo
/// the count. One function for every sharded store, so an execution's
/// events and snapshots land on the same shard when the shards are listed
/// in the same order.
pub(crate) fn shard_index(execution_id: &str, shards: usize) -> usize {
    let hash = execution_id.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    });
    (hash % shards.max(1) as u64) as usize
}

/// An [`EventStore`] spread over several stores.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore, ShardedEventStore};
/// let store = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
/// for id in ["b", "A1", "a_b", "B"] {
///     store.append(&[Event::new(id, 1, "started", serde_json::json!({}))]).await?;
/// }
/// let page = store.list_executions_page(None, 3).await?;
/// assert_eq!(page.ids, ["A1", "B", "a_b"]);
/// assert_eq!(store.list_executions_page(page.next_cursor.as_deref(), 3).await?.ids, ["b"]);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
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
        shard_index(execution_id, self.shards.len())
    }

    /// The batch's events grouped by shard, shards in ascending order, each
    /// group in the batch's order.
    fn route(&self, events: &[Event]) -> Vec<(usize, Vec<Event>)> {
        let mut by_shard: Vec<Vec<Event>> = vec![Vec::new(); self.shards.len()];
        for event in events {
            by_shard[self.shard_of(&event.execution_id)].push(event.clone());
        }
        by_shard
            .into_iter()
            .enumerate()
            .filter(|(_, events)| !events.is_empty())
            .collect()
    }

    /// Appends a batch that may span shards: one all-or-none append per
    /// shard, concurrently, and each shard's outcome. The batch as a whole
    /// is NOT atomic: when one shard fails, the others may have committed,
    /// and the outcomes say which. Retry the failed shards' events (an
    /// event already there comes back as [`Error::DuplicateEvent`]).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use pgloom::event_store::{Event, MemoryEventStore, ShardedEventStore};
    /// let store = ShardedEventStore::new((0..3).map(|_| MemoryEventStore::new()).collect());
    /// let batch: Vec<Event> = ["a", "b", "c", "d"].iter().map(|id| Event::new(*id, 1, "started", serde_json::json!({}))).collect();
    /// let outcomes = store.append_per_shard(&batch).await;
    /// assert_eq!(outcomes.iter().map(|o| o.events).sum::<usize>(), 4);
    /// assert!(outcomes.iter().all(|o| o.result.is_ok()));
    /// # })
    /// ```
    pub async fn append_per_shard(&self, events: &[Event]) -> Vec<ShardAppend> {
        futures::future::join_all(self.route(events).into_iter().map(
            |(shard, events)| async move {
                let result = self.shards[shard]
                    .append(&events)
                    .await
                    .map_err(self.shard_error(shard));
                ShardAppend {
                    shard,
                    events: events.len(),
                    result,
                }
            },
        ))
        .await
    }

    /// Names the shard in an error of the shard's own (a server down); an
    /// error about the request itself (a duplicate event) stays as it is,
    /// so callers match it the same way on any store.
    fn shard_error(&self, shard: usize) -> impl FnOnce(Error) -> Error {
        let shards = self.shards.len();
        move |source| match source {
            Error::DuplicateEvent { .. }
            | Error::UnsupportedPayload { .. }
            | Error::InvalidPageSize(_)
            | Error::InvalidTenant(_)
            | Error::Unsupported(_) => source,
            _ => Error::Shard {
                shard,
                shards,
                source: Box::new(source),
            },
        }
    }
}

impl<S: EventStore> EventStore for ShardedEventStore<S> {
    fn id_scope(&self) -> crate::id_scope::IdScope {
        crate::id_scope::IdScope::common(self.shards.iter().map(EventStore::id_scope))
    }

    /// Appends a batch whose events all live on one shard, all or none.
    /// Shards commit independently, so a batch spanning shards could only
    /// half-commit: it is refused whole ([`Error::BatchSpansShards`]) and
    /// nothing is written. [`ShardedEventStore::append_per_shard`] takes
    /// such a batch and reports each shard's outcome.
    async fn append(&self, events: &[Event]) -> Result<()> {
        let Some(first) = events.first() else {
            return Ok(());
        };
        check_payloads(events)?;
        let shard = self.shard_of(&first.execution_id);
        if events
            .iter()
            .any(|e| self.shard_of(&e.execution_id) != shard)
        {
            return Err(Error::BatchSpansShards {
                shards: self.route(events).into_iter().map(|(s, _)| s).collect(),
            });
        }
        self.shards[shard]
            .append(events)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn read_events(&self, execution_id: &str) -> Result<Vec<Event>> {
        let shard = self.shard_of(execution_id);
        self.shards[shard]
            .read_events(execution_id)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let shard = self.shard_of(execution_id);
        self.shards[shard]
            .read_events_after(execution_id, after, limit)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> Result<u64> {
        let shard = self.shard_of(execution_id);
        self.shards[shard]
            .delete_events(execution_id, through, limit)
            .await
            .map_err(self.shard_error(shard))
    }

    async fn list_executions_page(&self, after: Option<&str>, limit: usize) -> Result<Page> {
        check_limit(limit)?;
        let n = self.shards.len();
        // Every shard starts after the SAME cursor. Ids hash evenly, so a
        // shard usually holds about 1/n of the page: ask each for its share
        // and a margin, not for the whole page, and refill only a shard
        // whose ids ran out before the page did (a second round trip, rare).
        // Saturating: `usize::MAX` ("everything") is a page size every
        // store takes.
        let share = (limit / n)
            .saturating_add(limit / (4 * n))
            .saturating_add(16)
            .min(limit);
        let mut shards: Vec<ShardCursor> = (0..n)
            .map(|_| ShardCursor {
                buffered: VecDeque::new(),
                after: after.map(str::to_owned),
                exhausted: false,
            })
            .collect();
        // Room for what a first round usually brings, never `limit` itself:
        // a huge limit is a bound, not a size.
        let mut ids = Vec::with_capacity(share.saturating_mul(n).min(limit).min(4096));
        let mut ask = share;
        while ids.len() < limit {
            self.refill_empty(&mut shards, ask).await?;
            ask = (limit - ids.len()).max(16).min(limit);
            // k-way merge: an id can go out only while every shard that
            // may hold more has a buffered id, i.e. shows how far it got.
            while ids.len() < limit {
                if shards.iter().any(|s| s.buffered.is_empty() && !s.exhausted) {
                    break;
                }
                let Some(next) =
                    shards
                        .iter_mut()
                        .filter(|s| !s.buffered.is_empty())
                        .min_by(|a, b| {
                            pgloom_core::compare_execution_ids(&a.buffered[0], &b.buffered[0])
                        })
                else {
                    return Ok(Page::from_ids(ids, limit));
                };
                let id = next.buffered.pop_front().expect("not empty");
                // Shards that share ids (views of one store) give each once.
                if ids.last() != Some(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(Page::from_ids(ids, limit))
    }
}

/// What one shard did with its part of a batch
/// ([`ShardedEventStore::append_per_shard`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct ShardAppend {
    /// The shard (0-based, in routing order).
    pub shard: usize,
    /// How many of the batch's events it was given.
    pub events: usize,
    /// Ok when all of them committed; an error when none did.
    pub result: Result<()>,
}

/// One shard's place in a page being merged.
struct ShardCursor {
    /// Fetched, not yet merged, in code point order.
    buffered: VecDeque<String>,
    /// The cursor of the shard's next fetch: its last fetched id.
    after: Option<String>,
    /// The shard has no ids after `after`.
    exhausted: bool,
}

impl<S: EventStore> ShardedEventStore<S> {
    /// Fetches `ask` ids into every shard whose buffer ran dry, concurrently;
    /// one failing shard fails the page.
    async fn refill_empty(&self, shards: &mut [ShardCursor], ask: usize) -> Result<()> {
        let fetches = shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.buffered.is_empty() && !s.exhausted)
            .map(|(shard, s)| {
                let after = s.after.clone();
                async move {
                    let page = self.shards[shard]
                        .list_executions_page(after.as_deref(), ask)
                        .await
                        .map_err(self.shard_error(shard))?;
                    Ok::<_, Error>((shard, page))
                }
            });
        for (shard, page) in try_join_all(fetches).await? {
            let cursor = &mut shards[shard];
            cursor.exhausted = page.next_cursor.is_none();
            cursor.after = page.ids.last().cloned().or(cursor.after.take());
            cursor.buffered.extend(page.ids);
        }
        Ok(())
    }
}
