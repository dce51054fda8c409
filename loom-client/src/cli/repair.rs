//! `loom repair`: the executions index back in step with the log, and,
//! with `--verify-frames`, every stored frame decoded and the rows that do
//! not decode listed with the typed cause, never modified.

use super::progress::Bar;
use std::process::ExitCode;

use super::{describe, is_postgres, needs_action, one_connection, Failure, Target};
use crate::event_store::PgEventStore;
use crate::snapshot_store::{
    Codec, FrameCheck, PgSnapshotStore, PgSnapshotStoreOptions, SqliteSnapshotStore,
};
use crate::PgPool;

/// What a repair printed, and whether something is left for an operator.
pub(super) struct Outcome {
    /// The report, a line a finding.
    pub(super) report: String,
    /// Unreadable frames were found (exit 1).
    pub(super) needs_action: bool,
}

/// `loom repair`; exit 1 when something still needs action.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    verify_frames: bool,
    batch_size: usize,
) -> ExitCode {
    match runtime.block_on(repair(target, verify_frames, batch_size)) {
        Ok(outcome) => {
            print!("{}", outcome.report);
            needs_action(outcome.needs_action)
        }
        Err(failure) => failure.exit(),
    }
}

/// Repairs `target`'s executions index (PostgreSQL), `batch_size` ids a
/// batch, and verifies its frames when asked, `batch_size` rows a query.
pub(super) async fn repair(
    target: &Target,
    verify_frames: bool,
    batch_size: usize,
) -> Result<Outcome, Failure> {
    let bar = Bar::new();
    let mut report = String::new();
    let progress = |p: &FrameCheck| {
        bar.show(|| {
            format!(
                "{} frames read, {} unreadable",
                p.frames,
                p.unreadable.len()
            )
        });
    };
    let check = if is_postgres(target.db()) {
        let pool = one_connection(target.db(), target.connect_timeout())?;
        report.push_str(&repair_index(&pool, &bar, batch_size).await?);
        if verify_frames {
            Some(
                PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new())
                    .await
                    .map_err(|e| Failure::of(&e))?
                    .verify_frames(batch_size, progress)
                    .await,
            )
        } else {
            None
        }
    } else {
        report.push_str("executions index: none in SQLite (its log is paged directly)\n");
        if verify_frames {
            Some(
                SqliteSnapshotStore::open_read_only(target.db(), Codec::None)
                    .map_err(|e| Failure::of(&e))?
                    .verify_frames(batch_size, progress)
                    .await,
            )
        } else {
            None
        }
    };
    let check = check.transpose().map_err(|e| Failure::of(&e))?;
    let needs_action = check.as_ref().is_some_and(|c| !c.unreadable.is_empty());
    if let Some(check) = check {
        for bad in &check.unreadable {
            report.push_str(&format!(
                "unreadable frame: snapshot {} of {} at sequence {}: {}\n",
                bad.id,
                serde_json::Value::from(bad.execution_id.as_str()),
                bad.sequence,
                bad.cause
            ));
        }
        report.push_str(&format!(
            "frames: {} read, {} unreadable{}\n",
            check.frames,
            check.unreadable.len(),
            if check.unreadable.is_empty() {
                ""
            } else {
                " (left as they are: restore them from a backup, or delete those snapshots)"
            }
        ));
    }
    Ok(Outcome {
        report,
        needs_action,
    })
}

/// Repairs loom.executions online, `batch` ids a transaction, showing
/// the running totals.
async fn repair_index(pool: &PgPool, bar: &Bar, batch: usize) -> Result<String, Failure> {
    let repair = PgEventStore::new(pool.clone())
        .repair_executions_index(batch, |so_far| {
            bar.show(|| {
                format!(
                    "executions index: {} ids checked, {} added, {} removed",
                    so_far.checked, so_far.added, so_far.removed
                )
            });
        })
        .await
        .map_err(|e| match e {
            crate::Error::ExtensionMissing { .. } => Failure::needs_migrate(format!(
                "{} (the online repair is loom 0.10.0+: run loom migrate, or SELECT <loom's schema>.loom_rebuild_executions() to rebuild it holding writers back)",
                describe(&e)
            )),
            _ => Failure::of(&e),
        })?;
    Ok(if repair.added + repair.removed == 0 {
        format!(
            "executions index: in step with the log ({} ids checked in {} batches)\n",
            repair.checked, repair.batches
        )
    } else {
        format!(
            "executions index: repaired online, {} ids added, {} removed ({} ids checked in {} batches, longest {} ms)\n",
            repair.added,
            repair.removed,
            repair.checked,
            repair.batches,
            repair.longest_batch.as_millis()
        )
    })
}
