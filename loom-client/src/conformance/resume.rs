//! Resume and retention across an event store and a snapshot store.

use super::snapshot_store::new_snapshot;
use super::{expect_eq, sequences, store_error, ConformanceFailure};
use crate::event_store::{Event, EventStore};

/// Resume and retention over an event store and a snapshot store that are
/// empty for the execution `"resume-kit"`: the resume tail starts exactly
/// after the latest snapshot; pruning leaves what resume needs; deleting
/// leaves nothing.
///
/// # Errors
///
/// The first rule the stores break.
pub async fn check_resume_and_retention<E, S>(
    events: &E,
    snapshots: &S,
) -> Result<(), ConformanceFailure>
where
    E: EventStore,
    S: crate::snapshot_store::SnapshotStore,
{
    use crate::resume::resume;
    use crate::retention::{delete_execution, prune_events};
    let id = "resume-kit";
    for n in 1..=10 {
        events
            .append(&[Event::new(id, n, "step", serde_json::json!({ "n": n }))])
            .await
            .map_err(store_error("append"))?;
    }
    let resumed = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume without a snapshot",
        (resumed.snapshot.is_none(), sequences(&resumed.events)),
        (true, (1..=10).collect()),
    )?;
    for (bound, expected, complete) in [
        (3, (1..=3).collect::<Vec<_>>(), false),
        (10, (1..=10).collect(), true),
    ] {
        let bounded = crate::resume::resume_bounded(events, snapshots, id, bound)
            .await
            .map_err(store_error("bounded resume"))?;
        expect_eq(
            "bounded resume",
            (sequences(&bounded.events), bounded.tail_complete),
            (expected, complete),
        )?;
    }
    let many = crate::resume::resume_many(events, snapshots, &[id, "resume-kit-none", id], 2)
        .await
        .into_iter()
        .collect::<crate::Result<Vec<_>>>()
        .map_err(store_error("batch resume"))?;
    expect_eq(
        "batch resume, in order, an unknown id told apart",
        many.iter()
            .map(|r| r.as_ref().map(|r| r.events.len()))
            .collect::<Vec<_>>(),
        vec![Some(10), None, Some(10)],
    )?;
    expect_eq(
        "no snapshot, nothing pruned",
        prune_events(events, snapshots, id, 3)
            .await
            .map_err(store_error("prune"))?,
        0,
    )?;
    for sequence in [4, 6] {
        snapshots
            .save(&new_snapshot(
                id,
                sequence,
                &format!(r#"{{"at":{sequence}}}"#),
            ))
            .await
            .map_err(store_error("save"))?;
    }
    let resumed = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume's snapshot",
        resumed.snapshot.map(|s| s.sequence),
        Some(6),
    )?;
    expect_eq(
        "resume's tail",
        sequences(&resumed.events),
        (7..=10).collect::<Vec<_>>(),
    )?;
    expect_eq(
        "events older than the latest snapshot pruned",
        prune_events(events, snapshots, id, 4)
            .await
            .map_err(store_error("prune"))?,
        5,
    )?;
    let after_prune = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "resume after pruning",
        sequences(&after_prune.events),
        (7..=10).collect::<Vec<_>>(),
    )?;
    expect_eq(
        "rows deleted with the execution",
        delete_execution(events, snapshots, id, 3)
            .await
            .map_err(store_error("delete execution"))?,
        2 + 5,
    )?;
    // Sequences with gaps: the last event at or before the snapshot stays,
    // so the execution stays listed.
    for n in [10, 20, 30] {
        events
            .append(&[Event::new("resume-gaps", n, "step", serde_json::json!({}))])
            .await
            .map_err(store_error("append"))?;
    }
    snapshots
        .save(&new_snapshot("resume-gaps", 25, "{}"))
        .await
        .map_err(store_error("save"))?;
    expect_eq(
        "pruning keeps the last event at or before the snapshot",
        prune_events(events, snapshots, "resume-gaps", 1)
            .await
            .map_err(store_error("prune"))?,
        1,
    )?;
    let left = events
        .read_events("resume-gaps")
        .await
        .map_err(store_error("read"))?;
    expect_eq(
        "what pruning with gaps leaves",
        sequences(&left),
        vec![20, 30],
    )?;
    let gone = resume(events, snapshots, id)
        .await
        .map_err(store_error("resume"))?;
    expect_eq(
        "a deleted execution",
        (gone.snapshot.is_none(), gone.events.len()),
        (true, 0),
    )
}
