//! Retention: deleting an execution, and pruning the events resume no
//! longer needs, in bounded batches.
//!
//! Every delete here is a batch of at most `batch_size` rows, each its own
//! short transaction, repeated until a batch deletes nothing: no lock is
//! held for long, appends to other executions go on, and paging over
//! execution ids stays exact (an execution is listed until its last event
//! goes). On PostgreSQL, [`crate::event_store::PgEventStore::prune_events`]
//! and [`crate::event_store::PgEventStore::delete_execution`] do the same in
//! the server, and the latter also deletes the refs pointing at the
//! execution and its lineage row.

use crate::event_store::{check_limit, EventStore};
use crate::snapshot_store::SnapshotStore;
use crate::Result;

/// Calls `batch` until it deletes nothing; the total.
pub(crate) async fn until_done<F, Fut>(mut batch: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    loop {
        match batch().await? {
            0 => return Ok(total),
            deleted => total += deleted,
        }
    }
}

/// Deletes the events of `execution_id` older than its latest snapshot:
/// what resume no longer needs, since it reads that snapshot and the events
/// after it. The last event at or before the snapshot's sequence stays
/// (sequences may have gaps), so an execution snapshotted at its last
/// event keeps one and is still listed. Nothing without a snapshot.
/// Returns how many events went.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use loom_client::event_store::{Event, EventStore, MemoryEventStore};
/// use loom_client::retention::prune_events;
/// use loom_client::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// snapshots.save(&NewSnapshot::new("exec-1", "wf", 3, JsonText::new("{}".to_owned())?)).await?;
/// assert_eq!(prune_events(&events, &snapshots, "exec-1", 2).await?, 2);
/// assert_eq!(events.read_events("exec-1").await?.len(), 3);
/// # Ok::<(), loom_client::Error>(()) })?;
/// # Ok::<(), loom_client::Error>(())
/// ```
///
/// # Errors
///
/// [`crate::Error::InvalidPageSize`] for a batch of 0; what either store
/// fails with (batches already deleted stay deleted).
pub async fn prune_events<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
    batch_size: usize,
) -> Result<u64> {
    check_limit(batch_size)?;
    let Some(latest) = snapshots.latest_sequence(execution_id).await? else {
        return Ok(0);
    };
    // The last event at or before the snapshot: read up to it, the events
    // about to go, once.
    let mut keep = None;
    let mut after = None;
    loop {
        let page = events
            .read_events_after(execution_id, after, batch_size)
            .await?;
        let Some(last) = page.last().map(|e| e.sequence) else {
            break;
        };
        keep = page
            .iter()
            .map(|e| e.sequence)
            .take_while(|s| *s <= latest)
            .last()
            .or(keep);
        if last > latest {
            break;
        }
        after = Some(last);
    }
    let Some(older) = keep.and_then(|keep| keep.checked_sub(1)) else {
        return Ok(0);
    };
    until_done(|| events.delete_events(execution_id, Some(older), batch_size)).await
}

/// Deletes an execution: its snapshots, then its events, `batch_size` rows
/// a batch. Returns how many rows went.
///
/// # Errors
///
/// [`crate::Error::InvalidPageSize`] for a batch of 0; what either store
/// fails with (batches already deleted stay deleted: call it again).
pub async fn delete_execution<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
    batch_size: usize,
) -> Result<u64> {
    check_limit(batch_size)?;
    let snapshots_deleted =
        until_done(|| snapshots.delete_snapshots(execution_id, batch_size)).await?;
    let events_deleted =
        until_done(|| events.delete_events(execution_id, None, batch_size)).await?;
    Ok(snapshots_deleted + events_deleted)
}
