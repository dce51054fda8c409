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

use std::time::{Duration, SystemTime};

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
/// use pgloom::event_store::{Event, EventStore, MemoryEventStore};
/// use pgloom::retention::{prunable_events, prune_events};
/// use pgloom::snapshot_store::{Codec, JsonText, MemorySnapshotStore, NewSnapshot, SnapshotStore};
/// let (events, snapshots) = (MemoryEventStore::new(), MemorySnapshotStore::new(Codec::None)?);
/// for n in 1..=5 {
///     events.append(&[Event::new("exec-1", n, "step", serde_json::json!({}))]).await?;
/// }
/// snapshots.save(&NewSnapshot::new("exec-1", "wf", 3, JsonText::new("{}".to_owned())?)).await?;
/// // Events 1 and 2 go; 3, the last at or before the snapshot, stays.
/// assert_eq!(prunable_events(&events, &snapshots, "exec-1", 2).await?, 2);
/// assert_eq!(prune_events(&events, &snapshots, "exec-1", 2).await?, 2);
/// assert_eq!(events.read_events("exec-1").await?.len(), 3);
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
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
    let Some((older, _)) = before_kept_event(events, snapshots, execution_id, batch_size).await?
    else {
        return Ok(0);
    };
    until_done(|| events.delete_events(execution_id, Some(older), batch_size)).await
}

/// How many events [`prune_events`] would delete, deleting nothing: a
/// dry run (it reads the events up to the latest snapshot, once).
///
/// # Errors
///
/// [`crate::Error::InvalidPageSize`] for a batch of 0; what either store
/// fails with.
pub async fn prunable_events<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
    batch_size: usize,
) -> Result<u64> {
    check_limit(batch_size)?;
    Ok(
        before_kept_event(events, snapshots, execution_id, batch_size)
            .await?
            .map_or(0, |(_, count)| count),
    )
}

/// The events resume no longer needs: the sequence they end at, and how
/// many they are; `None` when there are none (no snapshot, or nothing
/// before the last event at or before it).
async fn before_kept_event<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    execution_id: &str,
    batch_size: usize,
) -> Result<Option<(i64, u64)>> {
    let Some(latest) = snapshots.latest_sequence(execution_id).await? else {
        return Ok(None);
    };
    // The last event at or before the snapshot stays (sequences may have
    // gaps): read up to it, the events about to go, once.
    let (mut keep, mut before_keep) = (None, 0u64);
    let mut after = None;
    loop {
        let page = events
            .read_events_after(execution_id, after, batch_size)
            .await?;
        let Some(last) = page.last().map(|e| e.sequence) else {
            break;
        };
        for sequence in page.iter().map(|e| e.sequence).take_while(|s| *s <= latest) {
            before_keep += u64::from(keep.is_some());
            keep = Some(sequence);
        }
        if last > latest {
            break;
        }
        after = Some(last);
    }
    Ok(keep
        .and_then(|keep| keep.checked_sub(1))
        .filter(|_| before_keep > 0)
        .map(|older| (older, before_keep)))
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

/// One batch of retention by age: what it looked at and deleted, and where
/// the next batch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdleBatch {
    /// Executions whose last event this batch read.
    pub examined: u64,
    /// Executions deleted whole (their last rows went in this batch).
    pub executions_deleted: u64,
    /// Rows deleted: snapshots, events, refs and lineage rows.
    pub rows_deleted: u64,
    /// The cursor for the next batch (`None`: from the first execution).
    pub next_after: Option<String>,
    /// Whether the sweep has looked at every execution.
    pub done: bool,
}

/// When an execution was last written: its last event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionActivity {
    /// The execution.
    pub execution_id: String,
    /// Its last event's sequence.
    pub last_sequence: i64,
    /// Its last event's `created_at`.
    pub last_event_at: SystemTime,
}

impl ExecutionActivity {
    /// [`last_event_at`](Self::last_event_at) as stored: microseconds
    /// since the epoch.
    #[cfg(feature = "sqlite")]
    pub(crate) fn stored_micros(&self) -> i64 {
        self.last_event_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }

    /// From a stored time in microseconds since the epoch (before it: the
    /// epoch).
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn new(execution_id: String, last_sequence: i64, micros: i64) -> Self {
        ExecutionActivity {
            execution_id,
            last_sequence,
            last_event_at: crate::event_store::from_epoch_micros(micros.max(0)),
        }
    }
}

/// How far a sweep has got, after each batch: what
/// [`sweep_idle_executions`]'s callback (and the CLI's progress bar) sees,
/// and what it returns at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepProgress {
    /// Batches run.
    pub batches: u64,
    /// Executions examined.
    pub examined: u64,
    /// Executions deleted whole.
    pub executions_deleted: u64,
    /// Rows deleted.
    pub rows_deleted: u64,
    /// The longest batch so far (each is one transaction).
    pub longest_batch: Duration,
    /// Since the sweep started.
    pub elapsed: Duration,
}

/// Retention by age over a whole PostgreSQL database: deletes every
/// execution with no event for longer than `idle_for`, `batch_size` rows
/// a transaction ([`PgEventStore::delete_idle_executions`] until done),
/// calling `on_progress` after each batch. What `loom retention
/// --older-than` runs, and what `CALL loom_sweep_idle_executions` does in
/// the server.
///
/// ```no_run
/// # async fn f(store: &pgloom::event_store::PgEventStore) -> pgloom::Result<()> {
/// use std::time::Duration;
/// use pgloom::retention::sweep_idle_executions;
/// let swept = sweep_idle_executions(store, Duration::from_secs(30 * 86_400), 10_000, |p| {
///     eprintln!("{} executions examined, {} deleted", p.examined, p.executions_deleted);
/// })
/// .await?;
/// println!("{} rows in {:?}", swept.rows_deleted, swept.elapsed);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`crate::Error::InvalidPageSize`] for a batch of 0; what the server
/// raises (batches already deleted stay deleted: run it again).
///
/// [`PgEventStore::delete_idle_executions`]: crate::event_store::PgEventStore::delete_idle_executions
#[cfg(feature = "postgres")]
pub async fn sweep_idle_executions(
    store: &crate::event_store::PgEventStore,
    idle_for: Duration,
    batch_size: usize,
    mut on_progress: impl FnMut(&SweepProgress),
) -> Result<SweepProgress> {
    let work = async {
        let started = std::time::Instant::now();
        let mut progress = SweepProgress::default();
        let mut after: Option<String> = None;
        loop {
            let batch_started = std::time::Instant::now();
            let batch = store
                .delete_idle_executions(idle_for, after.as_deref(), batch_size)
                .await?;
            progress.batches += 1;
            progress.examined += batch.examined;
            progress.executions_deleted += batch.executions_deleted;
            progress.rows_deleted += batch.rows_deleted;
            progress.longest_batch = progress.longest_batch.max(batch_started.elapsed());
            progress.elapsed = started.elapsed();
            on_progress(&progress);
            if batch.done {
                return Ok(progress);
            }
            after = batch.next_after;
        }
    };
    crate::telemetry::traced(store.database(), "sweep_idle_executions", None, work).await
}

/// Retention by age in a SQLite file, as `loom_delete_idle_executions` does
/// it in PostgreSQL: every execution whose last event is older than
/// `idle_for` (by this machine's clock, which wrote the file's times) goes
/// whole, its snapshots, the refs pointing at it and its events, in one
/// write transaction that first checks its last event is still the one the
/// sweep saw: an append that landed meanwhile keeps the execution whole.
/// Pages hold at most `batch_size` executions; `on_progress` is called
/// after each idle execution. What `loom retention --older-than` runs on a
/// SQLite file.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use pgloom::event_store::{Event, EventStore, SqliteEventStore};
/// use pgloom::retention::sweep_idle_sqlite;
/// use pgloom::snapshot_store::{Codec, SqliteSnapshotStore};
/// let path = std::env::temp_dir().join(format!("loom-doc-sweep-{}.sqlite", std::process::id()));
/// let events = SqliteEventStore::open(&path)?;
/// let snapshots = SqliteSnapshotStore::open(&path, Codec::None)?;
/// events.append(&[Event::new("exec-1", 1, "step", serde_json::json!({}))]).await?;
/// // Idle for more than a day: nothing yet.
/// let swept = sweep_idle_sqlite(&events, &snapshots, Duration::from_secs(86_400), 100, |_| {}).await?;
/// assert_eq!((swept.examined, swept.executions_deleted), (1, 0));
/// // Idle at all: exec-1 goes.
/// let swept = sweep_idle_sqlite(&events, &snapshots, Duration::ZERO, 100, |_| {}).await?;
/// assert_eq!((swept.executions_deleted, swept.rows_deleted), (1, 1));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), pgloom::Error>(()) })?;
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// [`crate::Error::InvalidPageSize`] for a batch of 0;
/// [`crate::Error::Unsupported`] when the snapshots are not in the events'
/// file (no one transaction could cover both); what SQLite fails with
/// (executions already deleted stay deleted: run it again).
#[cfg(feature = "sqlite")]
pub async fn sweep_idle_sqlite(
    events: &crate::event_store::SqliteEventStore,
    snapshots: &crate::snapshot_store::SqliteSnapshotStore,
    idle_for: Duration,
    batch_size: usize,
    mut on_progress: impl FnMut(&SweepProgress),
) -> Result<SweepProgress> {
    let work = async {
        check_limit(batch_size)?;
        if events.file().is_none() || events.file() != snapshots.file() {
            return Err(crate::Error::Unsupported(
                "a sweep by age over snapshots kept outside the events' SQLite file",
            ));
        }
        let started = std::time::Instant::now();
        let cutoff = SystemTime::now()
            .checked_sub(idle_for)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut progress = SweepProgress::default();
        let mut after: Option<String> = None;
        loop {
            let page = events
                .execution_activity(after.as_deref(), batch_size)
                .await?;
            progress.examined += page.len() as u64;
            for activity in page.iter().filter(|a| a.last_event_at < cutoff) {
                let batch = std::time::Instant::now();
                let deleted = events.delete_idle_execution(activity).await?;
                progress.batches += 1;
                progress.longest_batch = progress.longest_batch.max(batch.elapsed());
                if let Some(rows) = deleted {
                    progress.rows_deleted += rows;
                    progress.executions_deleted += 1;
                }
                progress.elapsed = started.elapsed();
                on_progress(&progress);
            }
            match next_activity_cursor(&page, batch_size) {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
        }
        progress.elapsed = started.elapsed();
        Ok(progress)
    };
    crate::telemetry::traced(events.database(), "sweep_idle_executions", None, work).await
}

/// The cursor after a page of execution activity of `limit` asked for: its
/// last id while the page is full, `None` at the end.
#[cfg(feature = "sqlite")]
pub(crate) fn next_activity_cursor(page: &[ExecutionActivity], limit: usize) -> Option<String> {
    (page.len() == limit)
        .then(|| page.last().map(|last| last.execution_id.clone()))
        .flatten()
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::sweep_idle_sqlite;
    use crate::event_store::{Event, EventStore, SqliteEventStore};
    use crate::snapshot_store::SqliteSnapshotStore;
    use crate::snapshot_store::{Codec, JsonText, NewSnapshot, SnapshotQuery, SnapshotStore};

    fn file(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("loom-{name}-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    /// Issue 25: an append in flight while the sweep looks at an idle
    /// execution keeps it whole (before, its snapshot and events 1 to 3
    /// went, and it resumed from `[4]` alone).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_in_flight_keeps_its_execution_whole() {
        let path = file("sweep-race");
        let events = SqliteEventStore::open(&path).unwrap();
        let snapshots = SqliteSnapshotStore::open(&path, Codec::None).unwrap();
        for (id, n) in [("exec-1", 3), ("exec-2", 2)] {
            let log: Vec<Event> = (1..=n)
                .map(|s| Event::new(id, s, "step", serde_json::json!({})))
                .collect();
            events.append(&log).await.unwrap();
        }
        let state = JsonText::new(r#"{"turn":3}"#.to_owned()).unwrap();
        snapshots
            .save(&NewSnapshot::new("exec-1", "agent", 3, state))
            .await
            .unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute(
            "UPDATE loom_events SET created_at = '2000-01-01T00:00:00.000Z'",
            [],
        )
        .unwrap();
        // The writer: event 4 in a write transaction held for 300 ms.
        let (begun, wait) = mpsc::channel();
        let writer = std::thread::spawn(move || {
            raw.execute_batch(
                "BEGIN IMMEDIATE;
                 INSERT INTO loom_events (execution_id, sequence, kind, payload)
                 VALUES ('exec-1', 4, 'resumed', '{}')",
            )
            .unwrap();
            begun.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            raw.execute_batch("COMMIT").unwrap();
        });
        wait.recv().unwrap();
        let swept = sweep_idle_sqlite(
            &events,
            &snapshots,
            Duration::from_secs(86_400),
            100,
            |_| {},
        )
        .await
        .unwrap();
        writer.join().unwrap();
        assert_eq!(swept.executions_deleted, 1, "exec-2 only");
        let kept: Vec<i64> = events
            .read_events("exec-1")
            .await
            .unwrap()
            .iter()
            .map(|e| e.sequence)
            .collect();
        assert_eq!(kept, [1, 2, 3, 4]);
        let snapshot = snapshots
            .load("exec-1", SnapshotQuery::Latest)
            .await
            .unwrap();
        assert_eq!(snapshot.map(|s| s.sequence), Some(3));
        assert!(events.read_events("exec-2").await.unwrap().is_empty());
        let _ = std::fs::remove_file(&path);
    }

    /// No one transaction can cover two files: refused, not raced.
    #[tokio::test]
    async fn snapshots_in_another_file_are_refused() {
        let (a, b) = (file("sweep-events"), file("sweep-snapshots"));
        let events = SqliteEventStore::open(&a).unwrap();
        let snapshots = SqliteSnapshotStore::open(&b, Codec::None).unwrap();
        let err = sweep_idle_sqlite(&events, &snapshots, Duration::ZERO, 100, |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, crate::Error::Unsupported(_)), "{err}");
        let _ = (std::fs::remove_file(&a), std::fs::remove_file(&b));
    }
}
