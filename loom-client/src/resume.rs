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
}

impl Resume {
    /// What a workflow resumes from.
    #[must_use]
    pub fn new(snapshot: Option<Snapshot>, events: Vec<Event>) -> Self {
        Resume { snapshot, events }
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
    let (events_scope, snapshots_scope) = (events.id_scope(), snapshots.id_scope());
    if !events_scope.pairs_with(&snapshots_scope) {
        return Err(crate::Error::ScopeMismatch {
            events: events_scope,
            snapshots: snapshots_scope,
        });
    }
    loop {
        let snapshot = snapshots.load_latest(execution_id).await?;
        let after = snapshot.as_ref().map(|s| s.sequence);
        let tail = events
            .read_events_after(execution_id, after, usize::MAX)
            .await?;
        // Snapshots only move forward, so this ends once none is saved
        // between the two reads.
        if snapshots.latest_sequence(execution_id).await? == after {
            return Ok(Resume::new(snapshot, tail));
        }
    }
}
