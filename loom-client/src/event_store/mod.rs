//! The event store contract (SPI 2.0.0, ADR 0108 D1) and its backends.
//!
//! | store | for |
//! |---|---|
//! | [`MemoryEventStore`] | tests and single-process tools |
//! | [`SqliteEventStore`] | an embedded log, for a service without Postgres |
//! | [`PgEventStore`] | loom's PostgreSQL extension |
//! | [`ShardedEventStore`] | N stores (e.g. N Postgres servers) as one |
//! | [`TenantScopedEventStore`] | one tenant's view of any store |
//! | [`ConfiguredEventStore`] | whichever of these a [`StoreConfig`] string names |
//!
//! Every store pages execution ids in Unicode code point order
//! ([`pgloom_core::compare_execution_ids`]); a cursor is an id, any string,
//! and a page holds the ids strictly after it. That one rule is what lets
//! a sharded pager hand the same cursor to every shard and a tenant view
//! seek to its own range.

#[cfg(feature = "postgres")]
mod feed;
mod memory;
mod payload;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "postgres")]
mod pg_notifications;
mod sharded;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store_config;
mod tenant_scoped;
mod watch;

use std::future::Future;
use std::time::SystemTime;

use futures::stream::{self, Stream};

#[cfg(feature = "postgres")]
pub use crate::pg_connect::{ParseConnectionStringError, TlsError, TLS_BACKEND};
#[cfg(feature = "postgres")]
pub use feed::{
    FeedEvent, FeedOptions, FeedPage, FeedPosition, InvalidFeedPositionError, PgFeed, FEED_CHANNEL,
};
pub use memory::MemoryEventStore;
pub use payload::Payload;
#[cfg(feature = "postgres")]
pub(crate) use pg::{
    deleted_rows, metadata as pg_metadata, payload as pg_payload, sql_limit, METADATA_SINCE,
};
#[cfg(feature = "postgres")]
pub use pg::{IndexCheck, PgEventStore, PgEventStoreOn, NOTIFY_CHANNEL};
#[cfg(feature = "postgres")]
pub use pg_notifications::PgNotifications;
pub(crate) use sharded::shard_index;
pub use sharded::{ShardAppend, ShardedEventStore};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteEventStore;
pub use store_config::{ConfiguredEventStore, ParseStoreConfigError, SingleStore, StoreConfig};
pub(crate) use tenant_scoped::TenantPrefix;
pub use tenant_scoped::{InvalidTenantIdError, TenantId, TenantScopedEventStore};
pub use watch::{read_events_stream, watch_events, Wake, WatchOptions};

use crate::contract::ContractVersion;
use crate::id_scope::IdScope;
use crate::Result;

/// One event of an execution's log.
///
/// Two events are equal when they are the same event of the log: the same
/// execution, sequence, kind and JSON value of payload. `created_at` is when
/// a store wrote it, not part of the event: an event read back equals the
/// one appended.
///
/// With the `serde` feature it serializes with its payload and metadata
/// as the JSON they are, byte for byte:
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use pgloom::event_store::Event;
/// let event = Event::new("run-1", 1, "started", serde_json::json!({"n": 1}));
/// let json = serde_json::to_string(&event).unwrap();
/// assert!(json.contains(r#""payload":{"n":1}"#));
/// assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
/// # }
/// ```
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Event {
    /// The execution it belongs to.
    pub execution_id: String,
    /// Its position in that execution's log; unique per execution.
    pub sequence: i64,
    /// What happened.
    pub kind: String,
    /// The event's data: exact JSON text, whatever its depth or its
    /// numbers' size ([`Payload`]); equal to another when it is the same
    /// JSON value.
    pub payload: Payload,
    /// When the store wrote it (PostgreSQL's and SQLite's `created_at`, the
    /// memory store's clock): set on every event a first-party store reads
    /// back, `None` on one about to be appended (the store stamps its own
    /// time; an append ignores this).
    pub created_at: Option<SystemTime>,
    /// What the event carries beside its data: a trace id, the actor, a
    /// causation id. Any JSON, kept as exactly as the payload; `None` for
    /// none. Part of the event (and of its equality), unlike `created_at`.
    /// PostgreSQL stores it from loom 0.11.0 (an append with metadata to an
    /// older extension is [`crate::Error::ExtensionTooOld`]). JSON `null`
    /// is no metadata: stored and read back as `None`, and equal to it.
    pub metadata: Option<Payload>,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.execution_id == other.execution_id
            && self.sequence == other.sequence
            && self.kind == other.kind
            && self.payload == other.payload
            && self.stored_metadata() == other.stored_metadata()
    }
}

impl Eq for Event {}

impl Event {
    /// An event. The payload is anything that becomes JSON text: a
    /// `serde_json::Value`, or a [`Payload`] made from text, which keeps
    /// what a `Value` cannot (nesting deeper than 128, numbers beyond f64).
    ///
    /// ```
    /// use pgloom::event_store::{Event, Payload};
    /// let from_value = Event::new("exec-1", 1, "started", serde_json::json!({"n": 1}));
    /// let from_text = Event::new("exec-1", 1, "started", Payload::new(r#"{"n": 1.0}"#)?);
    /// assert_eq!(from_value, from_text);
    /// # Ok::<(), pgloom::json::InvalidJsonError>(())
    /// ```
    pub fn new(
        execution_id: impl Into<String>,
        sequence: i64,
        kind: impl Into<String>,
        payload: impl Into<Payload>,
    ) -> Self {
        Event {
            execution_id: execution_id.into(),
            sequence,
            kind: kind.into(),
            payload: payload.into(),
            created_at: None,
            metadata: None,
        }
    }

    /// This event with `metadata`: anything that becomes JSON text, as a
    /// payload is; JSON `null` is none.
    ///
    /// ```
    /// use pgloom::event_store::Event;
    /// let event = Event::new("exec-1", 1, "started", serde_json::json!({"n": 1}))
    ///     .with_metadata(serde_json::json!({"trace_id": "4bf92f35", "actor": "scheduler"}));
    /// assert_eq!(event.metadata.unwrap().as_str(), r#"{"actor":"scheduler","trace_id":"4bf92f35"}"#);
    /// ```
    #[must_use]
    pub fn with_metadata(mut self, metadata: impl Into<Payload>) -> Self {
        self.metadata = Some(metadata.into());
        self.metadata = self.stored_metadata().cloned();
        self
    }

    /// The metadata a store keeps: `None` for none and for JSON `null`.
    pub(crate) fn stored_metadata(&self) -> Option<&Payload> {
        self.metadata.as_ref().filter(|m| !m.is_null())
    }

    /// This event as read back, written by its store at `created_at`.
    #[must_use]
    pub fn with_created_at(mut self, created_at: SystemTime) -> Self {
        self.created_at = Some(created_at);
        self
    }
}

/// Refuses a batch holding a payload PostgreSQL's jsonb cannot hold, the
/// same way on every store ([`crate::Error::UnsupportedPayload`]), before
/// anything is written.
pub(crate) fn check_payloads(events: &[Event]) -> Result<()> {
    match events.iter().find_map(|e| {
        let payload = e.payload.unsupported().map(|reason| ("payload", reason));
        let metadata = || {
            e.stored_metadata()
                .and_then(Payload::unsupported)
                .map(|reason| ("metadata", reason))
        };
        payload.or_else(metadata).map(|found| (e, found))
    }) {
        Some((event, (field, reason))) => Err(crate::Error::UnsupportedPayload {
            execution_id: event.execution_id.clone(),
            sequence: event.sequence,
            field,
            reason,
        }),
        None => Ok(()),
    }
}

/// One page of execution ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Page {
    /// Ids in code point order, all strictly after the cursor asked with.
    pub ids: Vec<String>,
    /// The page's last id when the page is full (there may be more), `None`
    /// at the end.
    pub next_cursor: Option<String>,
}

impl Page {
    /// A page of `ids`, and the cursor to ask for the next one with
    /// (`None` at the end).
    #[must_use]
    pub fn new(ids: Vec<String>, next_cursor: Option<String>) -> Self {
        Page { ids, next_cursor }
    }

    /// A page of `ids` asked for with `limit`: full means "ask again".
    #[must_use]
    pub fn from_ids(ids: Vec<String>, limit: usize) -> Self {
        let next_cursor = if ids.len() >= limit {
            ids.last().cloned()
        } else {
            None
        };
        Page { ids, next_cursor }
    }
}

/// A stored time, microseconds since the Unix epoch (what the SQLite store
/// keeps, and what loom's PostgreSQL statements hand over where they do
/// not read a timestamptz), as a `SystemTime`; one out of its range is
/// clamped to the nearest it can hold.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn from_epoch_micros(micros: i64) -> SystemTime {
    let offset = std::time::Duration::from_micros(micros.unsigned_abs());
    let time = if micros >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(offset)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(offset)
    };
    time.unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The execution a batch of events belongs to, when it is one: the
/// `loom.execution_id` of its span.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn single_execution(events: &[Event]) -> Option<&str> {
    let first = events.first()?.execution_id.as_str();
    events
        .iter()
        .all(|e| e.execution_id == first)
        .then_some(first)
}

/// Refuses a page size of 0 (every store, the same way).
pub(crate) fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 {
        Err(crate::Error::InvalidPageSize(limit))
    } else {
        Ok(())
    }
}

/// An execution log that pages its ids in code point order (SPI 2.0.0).
///
/// Implementations must keep [`list_executions_page`](Self::list_executions_page)'s
/// rules exactly; [`crate::conformance::check_event_store`] checks them.
///
/// # Cancellation
///
/// Every method's future may be dropped before it completes (a request's
/// timeout, `tokio::select!`), and the store stays usable. A read leaves
/// nothing behind. A write whose statement was sent may still commit, as
/// if its reply were lost: retry an append with
/// [`append_idempotent`](Self::append_idempotent); a delete batch is
/// called until it returns 0 anyway. On the caller's transaction
/// ([`PgEventStore::on`]) a dropped call leaves the transaction to the
/// caller, who rolls it back.
pub trait EventStore: Send + Sync {
    /// The contract version this store implements.
    fn contract_version(&self) -> ContractVersion {
        crate::contract::EVENT_STORE_CONTRACT
    }

    /// The prefix this store puts before execution ids on their way to the
    /// stored log ([`IdScope`]): [`crate::resume::resume`] pairs an event
    /// store only with a snapshot store of the same scope. A backend that
    /// stores ids as given returns [`IdScope::unscoped`]; a wrapper
    /// returns its inner store's (a view, its own within it). Required, with
    /// no default: a wrapper that forgot to forward it would report a
    /// tenant's view as unscoped, and pair it with the shared snapshots.
    fn id_scope(&self) -> IdScope;

    /// The PostgreSQL pool this store reads the log through, when it is a
    /// plain [`PgEventStore`]: [`crate::resume::resume`] then reads a
    /// snapshot and its tail in one statement
    /// ([`crate::snapshot_store::PgSnapshotStore::resume`]) when the
    /// snapshot store shares the pool. `None`, the default, for every other
    /// store (a view that renames ids, a Citus store that checks its
    /// distribution first, a store of another backend).
    #[cfg(feature = "postgres")]
    fn postgres_pool(&self) -> Option<&crate::PgPool> {
        None
    }

    /// Appends events; all or none: after an error, no event of the batch
    /// is there. An (execution, sequence) that already has an event, or
    /// that the batch holds twice, is [`crate::Error::DuplicateEvent`]. A
    /// payload PostgreSQL's jsonb cannot hold (`\u0000`, an escaped lone
    /// surrogate) is [`crate::Error::UnsupportedPayload`] on every store,
    /// so a log can move between backends. A store that cannot commit a batch
    /// atomically refuses it whole (a sharded store, a batch spanning
    /// shards: [`crate::Error::BatchSpansShards`]).
    fn append(&self, events: &[Event]) -> impl Future<Output = Result<()>> + Send;

    /// Appends events that an earlier try of the same call may have
    /// stored already: the retry after an ambiguous failure (a timeout, a
    /// connection lost before the reply), when the first try may have
    /// committed. An event stored identically (same kind, same JSON
    /// payload) counts as appended; only a *different* event at its
    /// (execution, sequence) is [`crate::Error::DuplicateEvent`]. The
    /// batch's events not yet stored are appended, all or none.
    ///
    /// [`append`](Self::append) keeps the log's contract (any event at a
    /// taken position is a duplicate); this is the one to retry with. The
    /// default is built on `append` and
    /// [`read_events_after`](Self::read_events_after), for every store.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
    /// let store = MemoryEventStore::new();
    /// let turn = [Event::new("run-1", 1, "step", serde_json::json!({"n": 1}))];
    /// store.append(&turn).await?;
    /// // The reply was lost; the retry finds its own event: success.
    /// store.append_idempotent(&turn).await?;
    /// let other = [Event::new("run-1", 1, "step", serde_json::json!({"n": 2}))];
    /// assert!(store.append_idempotent(&other).await.unwrap_err().is_duplicate());
    /// # Ok::<(), pgloom::Error>(()) })?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// On a caller's transaction ([`PgEventStore::on`]) the first try's
    /// 23505 aborted the transaction: the look that follows fails there.
    /// Retry the whole transaction, or call this outside one.
    ///
    /// # Errors
    ///
    /// [`crate::Error::DuplicateEvent`] for an event that differs from the
    /// one stored at its position, or a batch that holds a position twice;
    /// what `append` fails with otherwise.
    fn append_idempotent(&self, events: &[Event]) -> impl Future<Output = Result<()>> + Send {
        async move {
            // A batch holding a position twice is a duplicate whatever is
            // stored, as in append.
            if let Some(twice) = held_twice(events) {
                return Err(crate::Error::DuplicateEvent {
                    execution_id: twice.execution_id.clone(),
                    sequence: twice.sequence,
                });
            }
            let refused = match self.append(events).await {
                // A duplicate, named or (in a caller's transaction, by a
                // role that may not read loom.events) the server's 23505.
                Err(e) if e.is_duplicate() => e,
                other => return other,
            };
            let missing = not_yet_stored(self, events).await?;
            if missing.len() == events.len() {
                // Nothing of it is stored (deleted since the refusal).
                return Err(refused);
            }
            if missing.is_empty() {
                return Ok(());
            }
            // Stored in part by someone else meanwhile: what is left, as
            // one batch (a concurrent writer's different event is still a
            // duplicate).
            match self.append(&missing).await {
                Err(e) if e.is_duplicate() => {
                    match not_yet_stored(self, &missing).await?.as_slice() {
                        [] => Ok(()),
                        _ => Err(refused),
                    }
                }
                other => other,
            }
        }
    }

    /// An execution's events in sequence order.
    fn read_events(&self, execution_id: &str) -> impl Future<Output = Result<Vec<Event>>> + Send;

    /// Up to `limit` distinct execution ids strictly after `after` (any
    /// string, not only one a store returned; `None` for the first page),
    /// in Unicode code point order.
    fn list_executions_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Page>> + Send;

    /// Up to `limit` events of an execution with a sequence strictly after
    /// `after` (`None`: from the first), in sequence order: the tail a
    /// resume reads after its snapshot, and a keyset pager over one log
    /// (the next cursor is the last sequence returned). SPI 2.1.0.
    ///
    /// The default reads the whole log and filters it: correct for any
    /// store, and what a first-party store replaces with a keyset read
    /// whose cost is what it returns.
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidPageSize`] for a limit of 0; the store's own.
    fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>>> + Send {
        async move {
            check_limit(limit)?;
            let log = self.read_events(execution_id).await?;
            Ok(log
                .into_iter()
                .filter(|e| after.is_none_or(|after| e.sequence > after))
                .take(limit)
                .collect())
        }
    }

    /// Deletes one batch of at most `limit` events of an execution with a
    /// sequence up to `through` (`None`: all of them), oldest first, and
    /// returns how many; call it until it returns 0. A batch is one short
    /// transaction, so retention never holds a long lock. SPI 2.1.0: the
    /// default refuses ([`crate::Error::Unsupported`]).
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidPageSize`] for a limit of 0; the store's own.
    fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send {
        let _ = (execution_id, through, limit);
        async { Err(crate::Error::Unsupported("EventStore::delete_events")) }
    }
}

/// The first event of a batch whose (execution, sequence) an earlier event
/// of the batch already holds: a duplicate whatever the store holds.
pub(crate) fn held_twice(events: &[Event]) -> Option<&Event> {
    let mut seen = std::collections::HashSet::with_capacity(events.len());
    events
        .iter()
        .find(|e| !seen.insert((e.execution_id.as_str(), e.sequence)))
}

/// The events of `events` that `store` does not hold, in their order; a
/// [`crate::Error::DuplicateEvent`] for one whose position holds a
/// different event (another kind, another JSON value, other metadata).
async fn not_yet_stored<S: EventStore + ?Sized>(store: &S, events: &[Event]) -> Result<Vec<Event>> {
    let mut missing = std::collections::HashSet::new();
    // The batch by execution, each in its order: one pass, whatever the
    // number of executions.
    let mut by_id: std::collections::BTreeMap<&str, Vec<&Event>> =
        std::collections::BTreeMap::new();
    for event in events {
        by_id
            .entry(event.execution_id.as_str())
            .or_default()
            .push(event);
    }
    for (id, batch) in by_id {
        let first = batch.iter().map(|e| e.sequence).min().unwrap_or(i64::MIN);
        let last = batch.iter().map(|e| e.sequence).max().unwrap_or(i64::MIN);
        // The stored events from the batch's first position to its last,
        // when the batch is most of that range; else each position alone
        // (a batch of 1 and 10,000,000 reads two events, not a log).
        let span =
            usize::try_from(last.abs_diff(first)).map_or(usize::MAX, |n| n.saturating_add(1));
        let stored = if span <= batch.len().saturating_mul(4) {
            store
                .read_events_after(id, first.checked_sub(1), span)
                .await?
        } else {
            let mut stored = Vec::with_capacity(batch.len());
            for event in &batch {
                stored.extend(
                    store
                        .read_events_after(id, event.sequence.checked_sub(1), 1)
                        .await?
                        .into_iter()
                        .filter(|s| s.sequence == event.sequence),
                );
            }
            stored
        };
        let stored: std::collections::HashMap<i64, Event> =
            stored.into_iter().map(|s| (s.sequence, s)).collect();
        for event in batch {
            match stored.get(&event.sequence) {
                Some(s) if s == event => {}
                Some(_) => {
                    return Err(crate::Error::DuplicateEvent {
                        execution_id: event.execution_id.clone(),
                        sequence: event.sequence,
                    })
                }
                None => {
                    missing.insert((event.execution_id.as_str(), event.sequence));
                }
            }
        }
    }
    // In the batch's order.
    Ok(events
        .iter()
        .filter(|e| missing.contains(&(e.execution_id.as_str(), e.sequence)))
        .cloned()
        .collect())
}

/// Every execution id of `store`, page by page (`page_size` at a time), as
/// a stream: retention, read-model catch-up and sweeps are built on it.
///
/// ```
/// # tokio_test_block_on(async {
/// use futures::TryStreamExt;
/// use pgloom::event_store::{iterate_execution_ids, Event, EventStore, MemoryEventStore};
///
/// let store = MemoryEventStore::new();
/// let events: Vec<Event> = ["b", "A", "a_b"].iter().map(|id| Event::new(*id, 1, "started", serde_json::json!({}))).collect();
/// store.append(&events).await?;
/// let ids: Vec<String> = iterate_execution_ids(&store, 2).try_collect().await?;
/// assert_eq!(ids, ["A", "a_b", "b"]);
/// # Ok::<(), pgloom::Error>(()) });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub fn iterate_execution_ids<S: EventStore>(
    store: &S,
    page_size: usize,
) -> impl Stream<Item = Result<String>> + '_ {
    enum State {
        Start,
        After(String),
        Done,
    }
    stream::try_unfold(State::Start, move |state| async move {
        let after = match &state {
            State::Start => None,
            State::After(cursor) => Some(cursor.as_str()),
            State::Done => return Ok::<_, crate::Error>(None),
        };
        let page = store.list_executions_page(after, page_size).await?;
        let next = match page.next_cursor {
            Some(cursor) => State::After(cursor),
            None => State::Done,
        };
        Ok(Some((stream::iter(page.ids.into_iter().map(Ok)), next)))
    })
    .try_flatten()
}

use futures::TryStreamExt as _;

/// A shared store is a store: several views (tenants, shards) can wrap one.
impl<S: EventStore> EventStore for std::sync::Arc<S> {
    fn contract_version(&self) -> ContractVersion {
        (**self).contract_version()
    }

    #[cfg(feature = "postgres")]
    fn postgres_pool(&self) -> Option<&crate::PgPool> {
        (**self).postgres_pool()
    }

    fn id_scope(&self) -> IdScope {
        (**self).id_scope()
    }

    fn append(&self, events: &[Event]) -> impl Future<Output = Result<()>> + Send {
        (**self).append(events)
    }

    fn append_idempotent(&self, events: &[Event]) -> impl Future<Output = Result<()>> + Send {
        (**self).append_idempotent(events)
    }

    fn read_events(&self, execution_id: &str) -> impl Future<Output = Result<Vec<Event>>> + Send {
        (**self).read_events(execution_id)
    }

    fn list_executions_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Page>> + Send {
        (**self).list_executions_page(after, limit)
    }

    fn read_events_after(
        &self,
        execution_id: &str,
        after: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>>> + Send {
        (**self).read_events_after(execution_id, after, limit)
    }

    fn delete_events(
        &self,
        execution_id: &str,
        through: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send {
        (**self).delete_events(execution_id, through, limit)
    }
}
