//! `loom migrate` and `loom move-to-extension`: the documented migration
//! ([`crate::migrate::migrate`]) and the move of a SQL-only database to
//! the extension, each printing what it did.

use std::process::ExitCode;
use std::time::Duration;

use super::{describe, fail, is_postgres, needs_action, progress, NOT_POSTGRES, USAGE};

/// Creates or updates loom in `db`; exit 1 when a step did not land.
pub(super) fn run(
    runtime: &tokio::runtime::Runtime,
    db: &str,
    snapshot_codec: &str,
    lock_timeout: Duration,
    to_version: Option<String>,
    sql_only: bool,
    schema: String,
) -> ExitCode {
    if !is_postgres(db) {
        eprintln!("loom: migrate updates a PostgreSQL database: {NOT_POSTGRES}");
        return ExitCode::from(USAGE);
    }
    let codec = match crate::snapshot_store::codec_from_name(snapshot_codec) {
        Ok(codec) => codec,
        Err(e) => {
            eprintln!("loom: --snapshot-codec: {e}");
            return ExitCode::from(USAGE);
        }
    };
    let mut options = crate::migrate::MigrateOptions::new();
    let bar = progress::Bar::new();
    let shown = bar.clone();
    options
        .lock_timeout(lock_timeout)
        .snapshot_codec(codec)
        .schema(schema)
        .on_progress(move |step| {
            if let crate::migrate::MigrationProgress::Started(step) = step {
                shown.show(|| format!("migrating: {step}"));
            }
        });
    if let Some(version) = to_version {
        options.to_version(version);
    }
    if sql_only {
        options.sql_only();
    }
    let migrated = runtime.block_on(crate::migrate::migrate(db, &options));
    drop((options, bar));
    match migrated {
        Ok(migration) => {
            print!("{}", render_migration(&migration));
            needs_action(!migration_landed(&migration))
        }
        Err(e) => fail(&describe(&e)),
    }
}

/// Moves a SQL-only database to the extension and says where the old
/// tables are kept.
pub(super) fn move_to_extension(
    runtime: &tokio::runtime::Runtime,
    db: &str,
    lock_timeout: Duration,
) -> ExitCode {
    if !is_postgres(db) {
        eprintln!("loom: move-to-extension moves a PostgreSQL database: {NOT_POSTGRES}");
        return ExitCode::from(USAGE);
    }
    match runtime.block_on(crate::move_to_extension::move_to_extension(
        db,
        lock_timeout,
    )) {
        Ok(moved) => {
            println!(
                "moved to the extension: loom {} in schema {}",
                moved.version, moved.schema
            );
            for (table, rows) in &moved.rows {
                println!("  loom.{table}: {rows} rows copied");
            }
            for (role, access) in &moved.grants {
                println!("  {role}: granted {access} again");
            }
            println!(
                "the old tables are in schema {}, the owner's: as the owner (not a superuser), check them, then DROP SCHEMA {} CASCADE",
                moved.kept_in, moved.kept_in
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&describe(&e)),
    }
}

/// What a migration did, a line a step, then its WARNINGs.
fn render_migration(migration: &crate::migrate::Migration) -> String {
    let mut out = format!(
        "loom {} -> {}\n",
        migration
            .from_version
            .as_deref()
            .unwrap_or("(not installed)"),
        migration.to_version
    );
    for (column, outcome) in &migration.collations {
        out.push_str(&format!("collation of {column}: {outcome}\n"));
    }
    if let Some(outcome) = &migration.events_id_index {
        out.push_str(&format!("loom.idx_events_exec: {outcome}\n"));
    }
    if let Some(outcome) = &migration.event_metadata {
        out.push_str(&format!("loom.events.metadata: {outcome}\n"));
    }
    if let Some(provisioned) = migration.snapshot_frames {
        out.push_str(if provisioned {
            "snapshot frames: provisioned\n"
        } else {
            "snapshot frames: not provisioned (failed soft; run again)\n"
        });
    }
    for warning in &migration.warnings {
        out.push_str(&format!("WARNING {warning}\n"));
    }
    out
}

/// Whether every step landed: nothing skipped, no WARNING.
fn migration_landed(migration: &crate::migrate::Migration) -> bool {
    let skipped = crate::migrate::StepOutcome::is_skipped;
    migration.warnings.is_empty()
        && !migration.collations.iter().any(|(_, o)| skipped(o))
        && !migration.events_id_index.as_ref().is_some_and(skipped)
        && !migration.event_metadata.as_ref().is_some_and(skipped)
        && migration.snapshot_frames != Some(false)
}
