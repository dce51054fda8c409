//! `loom retention`: retention by age or to the latest snapshot, in
//! bounded batches (on PostgreSQL in the server), in PostgreSQL or a SQLite
//! file, with a progress bar on a terminal and a summary line always.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use super::progress::Bar;
use super::{is_postgres, needs_action, one_connection, read_only_pool, Failure, Target};
use crate::event_store::{EventStore, PgEventStore, SqliteEventStore};
use crate::retention::{
    next_activity_cursor, prunable_events, prune_events, sweep_idle_executions, sweep_idle_sqlite,
    SweepProgress,
};
use crate::snapshot_store::{
    Codec, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore, SqliteSnapshotStore,
};

/// An age on the command line, as written (`30d`) and as a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Age {
    text: String,
    duration: Duration,
}

/// An age on the command line: a whole number and a unit, `30d`, `12h`,
/// `90m`, `45s` or `2w`.
pub(super) fn parse_age(text: &str) -> Result<Age, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let usage =
        || format!("{text:?}: expected a whole number and a unit (s, m, h, d or w), as 30d or 12h");
    let number: u64 = number.parse().map_err(|_| usage())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(usage()),
    };
    let seconds = number
        .checked_mul(seconds)
        .ok_or_else(|| format!("{text:?}: too long"))?;
    Ok(Age {
        text: text.to_owned(),
        duration: Duration::from_secs(seconds),
    })
}

/// What a run found or did, for the summary line and the exit code.
pub(super) struct Outcome {
    /// The summary line.
    pub(super) summary: String,
    /// A dry run that would delete something (exit 1: it needs action).
    pub(super) would_delete: bool,
}

/// `loom retention`: by age when `older_than` is given, else to each
/// execution's latest snapshot; exit 1 for a dry run that would delete.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    older_than: Option<&Age>,
    batch_size: usize,
    dry_run: bool,
) -> ExitCode {
    let run = match older_than {
        Some(idle_for) => runtime.block_on(by_age(target, idle_for, batch_size, dry_run)),
        None => runtime.block_on(to_snapshot(target, batch_size, dry_run)),
    };
    match run {
        Ok(outcome) => {
            println!("{}", outcome.summary);
            needs_action(outcome.would_delete)
        }
        Err(failure) => failure.exit(),
    }
}

/// Deletes (or, dry, counts) the executions with no event for longer than
/// `age`, `batch_size` rows a transaction: in the server on PostgreSQL,
/// through the stores in a SQLite file.
pub(super) async fn by_age(
    target: &Target,
    age: &Age,
    batch_size: usize,
    dry_run: bool,
) -> Result<Outcome, Failure> {
    let bar = Bar::new();
    if dry_run {
        // By the clock the sweep would use: the server's on PostgreSQL.
        let store = super::log::open(target.db(), target.connect_timeout())?;
        let cutoff = store
            .now()
            .await?
            .checked_sub(age.duration)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let (mut examined, mut idle, mut after) = (0u64, 0u64, None::<String>);
        loop {
            let page = store.activity(after.as_deref(), batch_size).await?;
            examined += page.len() as u64;
            idle += page.iter().filter(|a| a.last_event_at < cutoff).count() as u64;
            bar.show(|| format!("{examined} executions examined, {idle} idle"));
            match next_activity_cursor(&page, batch_size) {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
        }
        return Ok(Outcome {
            summary: format!(
                "would delete {idle} executions idle for more than {} (of {examined} examined)",
                age.text
            ),
            would_delete: idle > 0,
        });
    }
    let swept = if is_postgres(target.db()) {
        let store = PgEventStore::new(one_connection(target.db(), target.connect_timeout())?);
        sweep_idle_executions(&store, age.duration, batch_size, |p| {
            bar.show(|| progress_line(p));
        })
        .await
        .map_err(|e| Failure::of(&e))?
    } else {
        let (events, snapshots) = sqlite_stores(target.db())?;
        sweep_idle_sqlite(&events, &snapshots, age.duration, batch_size, |p| {
            bar.show(|| progress_line(p));
        })
        .await
        .map_err(|e| Failure::of(&e))?
    };
    Ok(Outcome {
        summary: format!(
            "deleted {} executions idle for more than {} ({} rows) in {} batches of at most {batch_size} rows, {} examined; {:.0} rows/s, longest batch {} ms",
            swept.executions_deleted,
            age.text,
            swept.rows_deleted,
            swept.batches,
            swept.examined,
            swept.rows_deleted as f64 / swept.elapsed.as_secs_f64().max(1e-6),
            swept.longest_batch.as_millis()
        ),
        would_delete: false,
    })
}

/// Both stores of an existing SQLite file (never created here).
fn sqlite_stores(db: &str) -> Result<(SqliteEventStore, SqliteSnapshotStore), Failure> {
    if !std::path::Path::new(db).is_file() {
        return Err(super::NO_SQLITE_DATABASE.to_owned().into());
    }
    Ok((
        SqliteEventStore::open(db).map_err(|e| Failure::of(&e))?,
        SqliteSnapshotStore::open(db, Codec::None).map_err(|e| Failure::of(&e))?,
    ))
}

fn progress_line(p: &SweepProgress) -> String {
    format!(
        "{} examined, {} executions and {} rows deleted, {} batches",
        p.examined, p.executions_deleted, p.rows_deleted, p.batches
    )
}

/// Prunes (or, dry, counts) every execution's events older than its latest
/// snapshot, in PostgreSQL (in the server) or SQLite.
pub(super) async fn to_snapshot(
    target: &Target,
    batch_size: usize,
    dry_run: bool,
) -> Result<Outcome, Failure> {
    if is_postgres(target.db()) {
        let pool = if dry_run {
            read_only_pool(target.db(), target.connect_timeout())?
        } else {
            one_connection(target.db(), target.connect_timeout())?
        };
        let events = PgEventStore::new(pool.clone());
        let snapshots = PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new())
            .await
            .map_err(|e| Failure::of(&e))?;
        prune_all(&events, &snapshots, Some(&events), batch_size, dry_run).await
    } else {
        let (events, snapshots) = sqlite_stores(target.db())?;
        prune_all(&events, &snapshots, None, batch_size, dry_run).await
    }
}

/// Every execution, a page at a time; on PostgreSQL the pruning itself
/// runs in the server (`loom_prune_events`), elsewhere through the stores.
async fn prune_all<E: EventStore, S: SnapshotStore>(
    events: &E,
    snapshots: &S,
    in_server: Option<&PgEventStore>,
    batch_size: usize,
    dry_run: bool,
) -> Result<Outcome, Failure> {
    let bar = Bar::new();
    let started = Instant::now();
    let (mut examined, mut pruned_executions, mut rows) = (0u64, 0u64, 0u64);
    let mut after: Option<String> = None;
    loop {
        let page = events
            .list_executions_page(after.as_deref(), batch_size)
            .await
            .map_err(|e| Failure::of(&e))?;
        for id in &page.ids {
            let n = match (dry_run, in_server) {
                (true, _) => prunable_events(events, snapshots, id, batch_size).await,
                (false, Some(server)) => server.prune_events(id, batch_size).await,
                (false, None) => prune_events(events, snapshots, id, batch_size).await,
            }
            .map_err(|e| format!("{id:?}: {e}"))?;
            examined += 1;
            pruned_executions += u64::from(n > 0);
            rows += n;
            bar.show(|| format!("{examined} executions examined, {rows} events"));
        }
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    let summary = if dry_run {
        format!("would prune {rows} events older than the latest snapshot of {pruned_executions} executions (of {examined})")
    } else {
        format!(
            "pruned {rows} events older than the latest snapshot of {pruned_executions} executions (of {examined}) in {:.1} s",
            started.elapsed().as_secs_f64()
        )
    };
    Ok(Outcome {
        summary,
        would_delete: dry_run && rows > 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ages_and_refuses_the_rest() {
        let seconds = |text| parse_age(text).map(|age| age.duration.as_secs());
        assert_eq!(seconds("30d"), Ok(30 * 86_400));
        assert_eq!(seconds("12h"), Ok(12 * 3_600));
        assert_eq!(seconds("2w"), Ok(14 * 86_400));
        assert_eq!(seconds("0s"), Ok(0));
        for bad in [
            "",
            "d",
            "30",
            "30 d",
            "-1d",
            "1.5h",
            "30y",
            "99999999999999999999d",
        ] {
            assert!(parse_age(bad).is_err(), "{bad:?}");
        }
    }
}
