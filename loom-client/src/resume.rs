//! Resuming a workflow: the latest snapshot and the events after it.
//!
//! ADR 0141's premise is that a workflow resumes from one snapshot read
//! plus a short tail of its log, so resume must cost the snapshot and the
//! tail, never the whole log. [`resume`] does it over any event store and
//! snapshot store; on PostgreSQL, [`crate::snapshot_store::PgSnapshotStore::resume`]
//! does it in one statement and one round trip.

use crate::event_store::{Event, EventStore};
use crate::snapshot_store::{Snapshot, SnapshotStore};
use crate::Result;

/// What a workflow resumes from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Resume {
    /// The latest snapshot, decoded; `None` when there is none.
    pub snapshot: Option<Snapshot>,
    /// The events after the snapshot's sequence (all of them without a
    /// snapshot), in sequence order, none missing or repeated.
    pub events: Vec<Event>,
    /// Whether `events` is the whole tail: false when a bounded resume
    /// ([`resume_bounded`]) stopped at its bound, and more follow the last
    /// (read them with `read_events_after`, or save a snapshot).
    pub tail_complete: bool,
}

impl Resume {
    /// What a workflow resumes from: `snapshot` and its whole tail.
    #[must_use]
    pub fn new(snapshot: Option<Snapshot>, events: Vec<Event>) -> Self {
        Resume {
            snapshot,
            events,
            tail_complete: true,
        }
    }
}

/// The latest snapshot of `execution_id` and the events after its
/// sequence: a snapshot read, then a keyset read of the tail
/// ([`EventStore::read_events_after`]). The log is append-only, so the
/// tail, read after the snapshot, starts exactly after its sequence and
/// holds whatever was appended in between. Only pruning deletes from it,
/// and only below the latest snapshot: when a newer snapshot was saved
/// meanwhile (the events between may be pruned already), the read is
/// made again from it.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use loom_client::event_store::{Event, EventStore, MemoryEventStore};
/// use loom_client::resume::resume;
/// use loom_client::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({"n": n}))]).await?;
/// }
/// snapshots.save(&NewSnapshot::new("exec-1", "agentLoop", 3, JsonText::new(r#"{"n":3}"#.to_owned())?)).await?;
/// let resumed = resume(&events, &snapshots, "exec-1").await?;
/// assert_eq!(resumed.snapshot.unwrap().sequence, 3);
/// assert_eq!(resumed.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [4, 5]);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
///
/// The two stores must name executions alike: a tenant's event view
/// pairs with that tenant's snapshot view
/// ([`crate::snapshot_store::TenantScopedSnapshotStore`]), never with the
/// shared store under it, whose `run-1` is not the tenant's.
///
/// # Errors
///
/// [`crate::Error::ScopeMismatch`] for stores of different
/// [`crate::id_scope::IdScope`]s, before anything is read; what either
/// store fails with.
pub async fn resume<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
) -> Result<Resume> {
    resume_bounded(events, snapshots, execution_id, usize::MAX).await
}

/// [`resume`] with at most `max_events` events of the tail: a worker that
/// must not load an unbounded tail (a workflow that has gone long without
/// a snapshot) reads the rest as it goes. [`Resume::tail_complete`] says
/// whether more follow.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use loom_client::event_store::{Event, EventStore, MemoryEventStore};
/// use loom_client::resume::resume_bounded;
/// use loom_client::snapshot_store::{Codec, MemorySnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// let resumed = resume_bounded(&events, &snapshots, "exec-1", 2).await?;
/// assert_eq!(resumed.events.len(), 2);
/// assert!(!resumed.tail_complete);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
///
/// # Errors
///
/// As [`resume`]; [`crate::Error::InvalidPageSize`] for a bound of 0.
pub async fn resume_bounded<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
    max_events: usize,
) -> Result<Resume> {
    let (events_scope, snapshots_scope) = (events.id_scope(), snapshots.id_scope());
    if !events_scope.pairs_with(&snapshots_scope) {
        return Err(crate::Error::ScopeMismatch {
            events: events_scope,
            snapshots: snapshots_scope,
        });
    }
    if max_events == 0 {
        return Err(crate::Error::InvalidPageSize(0));
    }
    loop {
        let snapshot = snapshots.load_latest(execution_id).await?;
        let after = snapshot.as_ref().map(|s| s.sequence);
        // One more than asked: whether the tail goes on.
        let mut tail = events
            .read_events_after(execution_id, after, max_events.saturating_add(1))
            .await?;
        let tail_complete = tail.len() <= max_events;
        tail.truncate(max_events);
        // Snapshots only move forward, so this ends once none is saved
        // between the two reads.
        if snapshots.latest_sequence(execution_id).await? == after {
            let mut resumed = Resume::new(snapshot, tail);
            resumed.tail_complete = tail_complete;
            return Ok(resumed);
        }
    }
}

/// [`resume`] for each of `execution_ids`, at most `concurrency` at a
/// time, in their order: a worker taking over a batch of executions
/// (at least one at a time). Every result is held until all are in, each
/// with its whole tail: for executions whose tails may be long, pass ids
/// a page at a time, or call [`resume_bounded`] for each.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use loom_client::event_store::{Event, EventStore, MemoryEventStore};
/// use loom_client::resume::resume_many;
/// use loom_client::snapshot_store::{Codec, MemorySnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for id in ["a", "b"] {
///     events.append(&[Event::new(id, 1, "started", serde_json::json!({}))]).await?;
/// }
/// let resumed = resume_many(&events, &snapshots, &["b", "a", "none"], 8).await?;
/// assert_eq!(resumed.iter().map(|r| r.events.len()).collect::<Vec<_>>(), [1, 1, 0]);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
///
/// # Errors
///
/// The first error any of them fails with (as [`resume`]).
pub async fn resume_many<E: EventStore, S: SnapshotStore, I: AsRef<str>>(
    events: &E,
    snapshots: &S,
    execution_ids: &[I],
    concurrency: usize,
) -> Result<Vec<Resume>> {
    use futures::{StreamExt as _, TryStreamExt as _};
    futures::stream::iter(execution_ids)
        .map(|id| resume(events, snapshots, id.as_ref()))
        .buffered(concurrency.max(1))
        .try_collect()
        .await
}
