//! Resuming a workflow: the latest snapshot and the events after it.
//!
//! ADR 0141's premise is that a workflow resumes from one snapshot read
//! plus a short tail of its log, so resume must cost the snapshot and the
//! tail, never the whole log. [`resume`] does it over any event store and
//! snapshot store; on PostgreSQL, [`crate::snapshot_store::PgSnapshotStore::resume`]
//! does it in one statement and one round trip, and [`resume`] itself
//! sends that statement when a `PgEventStore` and a `PgSnapshotStore`
//! share one pool.

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

/// How many times [`resume_bounded`] reads again when a snapshot was
/// saved between its two reads, before it gives up
/// ([`crate::Error::ResumeContended`]): each round is a snapshot read and
/// a tail read, and an execution whose snapshots come faster than that
/// is one being written by another worker right now.
pub const RESUME_ATTEMPTS: u32 = 8;

impl Resume {
    /// Whether the execution was found: it has a snapshot or an event. An
    /// execution loom never saw (or whose every event and snapshot was
    /// deleted) resumes from nothing.
    #[must_use]
    pub fn found(&self) -> bool {
        self.snapshot.is_some() || !self.events.is_empty()
    }

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
/// made again from it, [`RESUME_ATTEMPTS`] times at most.
///
/// A [`crate::event_store::PgEventStore`] and a
/// [`crate::snapshot_store::PgSnapshotStore`] on one [`crate::PgPool`]
/// (clones of it) resume in one statement instead, one round trip on one
/// connection ([`crate::snapshot_store::PgSnapshotStore::resume`]).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
/// use pgloom::resume::resume;
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({"n": n}))]).await?;
/// }
/// snapshots.save(&NewSnapshot::new("exec-1", "agentLoop", 3, JsonText::new(r#"{"n":3}"#.to_owned())?)).await?;
/// let resumed = resume(&events, &snapshots, "exec-1").await?;
/// assert_eq!(resumed.snapshot.unwrap().sequence, 3);
/// assert_eq!(resumed.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [4, 5]);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
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
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
/// use pgloom::resume::resume_bounded;
/// use pgloom::snapshot_store::{Codec, MemorySnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// let resumed = resume_bounded(&events, &snapshots, "exec-1", 2).await?;
/// assert_eq!(resumed.events.len(), 2);
/// assert!(!resumed.tail_complete);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// As [`resume`]; [`crate::Error::InvalidPageSize`] for a bound of 0;
/// [`crate::Error::ResumeContended`] when a newer snapshot was saved
/// between the two reads [`RESUME_ATTEMPTS`] times running.
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
    // One statement, one round trip, where both stores read one database
    // through one pool: its MVCC snapshot makes the tail start exactly
    // after the snapshot, so no retry is needed. The whole tail only: a
    // bounded resume reads it in pages.
    #[cfg(feature = "postgres")]
    if max_events == usize::MAX {
        if let (Some(pool), Some(pg)) = (events.postgres_pool(), snapshots.as_postgres()) {
            if pg.reads_through(pool) {
                if let Some(resumed) = pg.resume_in_one_statement(execution_id).await? {
                    return Ok(resumed);
                }
            }
        }
    }
    for _ in 0..RESUME_ATTEMPTS {
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
    Err(crate::Error::ResumeContended {
        execution_id: execution_id.to_owned(),
        attempts: RESUME_ATTEMPTS,
    })
}

/// [`resume`] for each of `execution_ids`, at most `concurrency` at a
/// time, in their order: a worker taking over a batch of executions
/// (at least one at a time). Each id has its own outcome, so that one
/// failure does not cost the batch: `Ok(Some(_))` found, `Ok(None)` an
/// execution with no snapshot and no event ([`Resume::found`]), `Err` that
/// id's error. Every result is held until all are in, each with its whole
/// tail: for executions whose tails may be long, pass ids a page at a
/// time, or call [`resume_bounded`] for each.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
/// use pgloom::resume::resume_many;
/// use pgloom::snapshot_store::{Codec, MemorySnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for id in ["a", "b"] {
///     events.append(&[Event::new(id, 1, "started", serde_json::json!({}))]).await?;
/// }
/// let resumed = resume_many(&events, &snapshots, &["b", "a", "none"], 8).await;
/// assert_eq!(resumed.len(), 3);
/// assert_eq!(resumed[0].as_ref().unwrap().as_ref().unwrap().events.len(), 1);
/// assert!(resumed[2].as_ref().unwrap().is_none(), "unknown");
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
pub async fn resume_many<E: EventStore, S: SnapshotStore, I: AsRef<str>>(
    events: &E,
    snapshots: &S,
    execution_ids: &[I],
    concurrency: usize,
) -> Vec<Result<Option<Resume>>> {
    use futures::StreamExt as _;
    futures::stream::iter(execution_ids)
        .map(|id| async move {
            let resumed = resume(events, snapshots, id.as_ref()).await?;
            Ok(resumed.found().then_some(resumed))
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;
    use crate::event_store::MemoryEventStore;
    use crate::id_scope::IdScope;
    use crate::snapshot_store::{Codec, SnapshotQuery};

    /// A snapshot store another worker writes faster than a resume reads:
    /// each latest sequence it reports is newer than the last load's.
    struct Racing {
        saved: AtomicI64,
    }

    impl SnapshotStore for Racing {
        fn snapshot_codec(&self) -> Codec {
            Codec::None
        }

        fn id_scope(&self) -> IdScope {
            IdScope::unscoped()
        }

        async fn save(&self, _: &crate::snapshot_store::NewSnapshot) -> Result<i64> {
            Ok(self.saved.fetch_add(1, Ordering::SeqCst))
        }

        async fn load(&self, _: &str, _: SnapshotQuery) -> Result<Option<Snapshot>> {
            Ok(None)
        }

        async fn latest_sequence(&self, _: &str) -> Result<Option<i64>> {
            Ok(Some(self.saved.fetch_add(1, Ordering::SeqCst)))
        }

        async fn delete_snapshots(&self, _: &str, _: usize) -> Result<u64> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn a_resume_that_always_loses_the_race_gives_up_typed() {
        let racing = Racing {
            saved: AtomicI64::new(1),
        };
        let e = resume(&MemoryEventStore::new(), &racing, "run-1")
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::ResumeContended {
                    attempts: RESUME_ATTEMPTS,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.is_transient());
        assert_eq!(
            racing.saved.load(Ordering::SeqCst),
            1 + i64::from(RESUME_ATTEMPTS)
        );
        // One id's failure is that id's alone.
        let many = resume_many(&MemoryEventStore::new(), &racing, &["a", "b"], 2).await;
        assert!(many
            .iter()
            .all(|r| matches!(r, Err(crate::Error::ResumeContended { .. }))));
    }
}
