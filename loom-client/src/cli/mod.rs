//! The `loom` command line (feature `cli`):
//!
//! - `loom snapshot show` prints a stored snapshot DECODED (ADR 0141 D7),
//!   as a JSON document (indented, or one line with `--json`), through the
//!   same stores a service uses, so either format decodes and a sealed one
//!   opens with the key ring.
//! - `loom status` prints what a PostgreSQL database's loom needs
//!   (`loom_status()`), as text or `--json`.
//! - `loom migrate` creates or updates the extension the documented way
//!   ([`crate::migrate::migrate`]) and prints what it did and every
//!   WARNING, for deploy pipelines.
//! - `loom executions list` pages execution ids in code point order (a
//!   line each, or `--json`), and `loom events show` prints an execution's
//!   events, payloads exactly as stored, one JSON object a line (or one
//!   document, `--json`).
//! - `loom retention` deletes, in bounded batches of short transactions,
//!   the executions with no event for longer than `--older-than`, or every
//!   execution's events older than its latest snapshot
//!   (`--prune-to-snapshot`), in PostgreSQL or SQLite; `--dry-run` counts
//!   instead.
//! - `loom repair` rebuilds the executions index when `loom_status()`
//!   says it is out of step with the log, and with `--verify-frames`
//!   decodes every stored frame, listing the rows that do not decode with
//!   the typed cause (never modifying them).
//! - `loom completions <shell>` prints a completion script.
//!
//! The database comes from `--db`, else `LOOM_DB`, else `DATABASE_URL`,
//! else libpq's `PG*` variables; a PostgreSQL one without a password takes
//! it from `PGPASSFILE` or `~/.pgpass`, as `psql` does.
//!
//! Exit codes, for scripts and probes: 0 done, nothing needs action; 1
//! something needs action (a pending item, a migration step that failed
//! soft, a dry run that would delete, an unreadable frame); 2 a usage
//! error (no database named); 3 the database could not be reached or
//! read, or the command failed; 4 not found (no snapshot, no events, no
//! execution ids after the cursor). All but `migrate`, `move-to-extension`,
//! `retention` and `repair` are read-only.

mod connection;
mod log;
mod pretty;
mod progress;
mod repair;
mod retention;
mod status;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{CommandFactory as _, Parser, Subcommand};

use crate::snapshot_store::{
    is_sealed, Codec, EncryptingSnapshotStore, KeyRing, PgSnapshotStore, PgSnapshotStoreOptions,
    Snapshot, SnapshotQuery, SnapshotStore, SqliteSnapshotStore,
};
use crate::{PgPool, PgPoolOptions};

/// loom: durable-workflow snapshots and logs in PostgreSQL or SQLite.
#[derive(Debug, Parser)]
#[command(name = "loom", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// What a PostgreSQL database's loom needs: versions, pending
    /// conversions, frames, sizes, from catalogs and statistics (constant
    /// time); with --verify, also the executions index checked against
    /// the log; exit 1 when something needs action.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also check the executions index against the log, in batches
        /// that hold no writer back (a progress line on a terminal).
        #[arg(long)]
        verify: bool,
        /// Ids a batch of --verify.
        #[arg(long, value_name = "IDS", default_value_t = 10_000,
              value_parser = clap::value_parser!(u32).range(1..))]
        batch_size: u32,
    },
    /// Execution ids.
    #[command(subcommand)]
    Executions(ExecutionsCommand),
    /// Events of one execution.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Delete what a retention policy says, in bounded batches of short
    /// transactions (paging stays exact meanwhile); a progress bar on a
    /// terminal, a summary line always.
    Retention {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: RetentionPolicy,
        /// Count what would go, deleting nothing; exit 1 when something
        /// would.
        #[arg(long)]
        dry_run: bool,
        /// Rows a transaction (and executions a page).
        #[arg(long, value_name = "ROWS", default_value_t = 10_000,
              value_parser = clap::value_parser!(u32).range(1..))]
        batch_size: u32,
    },
    /// Bring the executions index back in step with the log, online, in
    /// batches of --batch-size ids (only appends to the executions a batch
    /// changes wait for it); with --verify-frames, decode every stored
    /// frame and list the rows that do not decode (never modifying them);
    /// exit 1 when some do not.
    Repair {
        #[command(flatten)]
        target: Target,
        /// Also decode every stored snapshot frame.
        #[arg(long)]
        verify_frames: bool,
        /// Ids a repair batch, and frames a query of --verify-frames.
        #[arg(long, value_name = "ROWS", default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        batch_size: u32,
    },
    /// Create or update loom the documented way (the extension, or with
    /// --sql-only the SQL-only flavour), print what it did and every
    /// WARNING; exit 1 when a step failed soft.
    Migrate {
        /// The database: a PostgreSQL URL or connection string. Default:
        /// LOOM_DB, else DATABASE_URL, else libpq's PG* variables (and
        /// PGPASSFILE or ~/.pgpass for a password).
        #[arg(long)]
        db: Option<String>,
        /// Also provision snapshot frames: `zstd` (default `none`).
        #[arg(long, value_name = "CODEC", default_value = "none")]
        snapshot_codec: String,
        /// Each conversion's lock wait, in ms (at least 1).
        #[arg(long, value_name = "MS", default_value_t = 2000,
              value_parser = clap::value_parser!(u32).range(1..))]
        lock_timeout_ms: u32,
        /// The version to create or update to (default: the newest
        /// installed on the server).
        #[arg(long)]
        to_version: Option<String>,
        /// Install or update loom's SQL-only flavour instead of the
        /// extension: for a server that cannot load loom.so (managed
        /// PostgreSQL), as the database's owner (docs/flavours.md).
        #[arg(long)]
        sql_only: bool,
        /// The schema loom's functions go in when this creates loom (it
        /// must exist; its name as stored, quoted here whatever it holds).
        /// An installed loom stays where it is.
        #[arg(long, default_value = "public")]
        schema: String,
    },
    /// Move a database from loom's SQL-only flavour to the extension, as a
    /// superuser, in one transaction: the extension at the same version,
    /// every row copied into it, grants given again; the old tables are
    /// kept in schema loom_before_extension for the owner to check and drop
    /// (docs/flavours.md).
    MoveToExtension {
        /// The database: a PostgreSQL URL or connection string. Default:
        /// LOOM_DB, else DATABASE_URL, else libpq's PG* variables (and
        /// PGPASSFILE or ~/.pgpass for a password).
        #[arg(long)]
        db: Option<String>,
        /// Each lock's wait, in ms (at least 1): a long transaction on
        /// loom's tables fails the move rather than stall every writer.
        #[arg(long, value_name = "MS", default_value_t = 10000,
              value_parser = clap::value_parser!(u32).range(1..))]
        lock_timeout_ms: u32,
    },
    /// Print a shell's completion script for loom (bash, zsh, fish,
    /// elvish, powershell): `loom completions bash > /etc/bash_completion.d/loom`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// What `loom retention` deletes: one policy a run.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct RetentionPolicy {
    /// Delete the executions with no event for longer than this: a whole
    /// number and a unit, s, m, h, d or w (`30d`, `12h`).
    #[arg(long, value_name = "AGE", value_parser = retention::parse_age)]
    older_than: Option<retention::Age>,
    /// Delete every execution's events older than its latest snapshot
    /// (the last one at or before it stays).
    #[arg(long)]
    prune_to_snapshot: bool,
}

/// The database a read-only command reads.
#[derive(Debug, clap::Args)]
struct Target {
    /// The database: a PostgreSQL URL or connection string (postgres://…
    /// or host=…), or a SQLite file path. Default: LOOM_DB, else
    /// DATABASE_URL, else libpq's PG* variables; a password missing from
    /// a PostgreSQL one comes from PGPASSFILE or ~/.pgpass.
    #[arg(long)]
    db: Option<String>,
    /// PostgreSQL only: how long connecting (TCP, TLS and authentication
    /// together) may take before giving up. TLS follows the connection
    /// string's sslmode (disable, allow, prefer, require, verify-ca,
    /// verify-full) and sslrootcert.
    #[arg(long, value_name = "SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    connect_timeout: u64,
}

impl Target {
    /// The database, once [`main`] has resolved it.
    fn db(&self) -> &str {
        self.db.as_deref().unwrap_or_default()
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout)
    }
}

#[derive(Debug, Subcommand)]
enum ExecutionsCommand {
    /// One page of execution ids after a cursor, in code point order, one
    /// a line (the next cursor is the last line, while the page is full).
    List {
        #[command(flatten)]
        target: Target,
        /// The cursor: ids strictly after this string (default: the first).
        #[arg(long)]
        after: Option<String>,
        /// The page size.
        #[arg(long, default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Print one JSON object (`ids`, `next_cursor`) instead of lines.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// An execution's events after a sequence, one JSON object a line,
    /// payloads exactly as stored.
    Show {
        #[command(flatten)]
        target: Target,
        /// The execution.
        execution_id: String,
        /// Events strictly after this sequence (default: from the first).
        #[arg(long)]
        after: Option<i64>,
        /// At most this many.
        #[arg(long, default_value_t = 1000,
              value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Print one JSON object (`execution_id`, `events`) instead of a
        /// JSON object a line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Print one stored snapshot, decoded, as indented JSON (a value
    /// nested deeper than 32 levels compact, on the line where it starts).
    Show {
        #[command(flatten)]
        target: Target,
        /// The execution.
        execution_id: String,
        /// The snapshot at exactly this sequence (default: the latest).
        #[arg(long)]
        at: Option<i64>,
        /// Keys whose values are replaced by "[redacted]" wherever they
        /// occur in the state (comma-separated).
        #[arg(long, value_delimiter = ',')]
        redact: Vec<String>,
        /// A key ring file, to open sealed snapshots (else LOOM_KEYRING;
        /// never a secret on the command line).
        #[arg(long)]
        keys: Option<PathBuf>,
        /// Print the same JSON object on one line, the state compact (its
        /// tokens as stored, no white space added): one snapshot a line,
        /// for a pipe.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the command line with the process's arguments.
#[must_use]
pub fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    if let Some(flag) = cli.command.db_mut() {
        let var = |name: &str| std::env::var(name).ok();
        match connection::resolve(flag.take(), &var, whoami::username().ok()) {
            Ok(db) => *flag = Some(db),
            Err(why) => {
                eprintln!("loom: {why}");
                return ExitCode::from(USAGE);
            }
        }
    }
    if let Some(target) = cli.command.target() {
        if !is_postgres(target.db()) && !std::path::Path::new(target.db()).is_file() {
            return fail(NO_SQLITE_DATABASE);
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start: {e}")),
    };
    match cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "loom", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Status {
            target,
            json,
            verify,
            batch_size,
        } => {
            if !is_postgres(target.db()) {
                eprintln!("loom: status reads a PostgreSQL database with the loom extension: {NOT_POSTGRES}");
                return ExitCode::from(USAGE);
            }
            match runtime.block_on(status::facts(
                target.db(),
                target.connect_timeout(),
                verify.then_some(batch_size as usize),
            )) {
                Ok(facts) => {
                    if json {
                        println!("{}", status::render_json(&facts));
                    } else {
                        print!("{}", status::render_text(&facts));
                    }
                    needs_action(facts.iter().any(|f| f.needs_action))
                }
                Err(failure) => failure.exit(),
            }
        }
        Command::Executions(ExecutionsCommand::List {
            target,
            after,
            limit,
            json,
        }) => match runtime.block_on(log::executions(
            target.db(),
            after.as_deref(),
            limit as usize,
            target.connect_timeout(),
        )) {
            Ok(page) if page.ids.is_empty() && !json => {
                not_found("no execution ids after the cursor")
            }
            Ok(page) => {
                if json {
                    println!(
                        "{{\"ids\":{},\"next_cursor\":{}}}",
                        serde_json::Value::from(page.ids.clone()),
                        serde_json::Value::from(page.next_cursor.clone())
                    );
                } else {
                    for id in &page.ids {
                        println!("{id}");
                    }
                }
                if page.ids.is_empty() {
                    ExitCode::from(NOT_FOUND)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(message) => fail(&message),
        },
        Command::Events(EventsCommand::Show {
            target,
            execution_id,
            after,
            limit,
            json,
        }) => match runtime.block_on(log::events(
            target.db(),
            &execution_id,
            after,
            limit as usize,
            target.connect_timeout(),
        )) {
            Ok(events) if events.is_empty() && !json => {
                not_found(&format!("no events of {execution_id:?} after the cursor"))
            }
            Ok(events) => {
                if json {
                    let lines: Vec<String> = events.iter().map(log::render_event).collect();
                    println!(
                        "{{\"execution_id\":{},\"events\":[{}]}}",
                        serde_json::Value::from(execution_id.as_str()),
                        lines.join(",")
                    );
                } else {
                    for event in &events {
                        println!("{}", log::render_event(event));
                    }
                }
                if events.is_empty() {
                    ExitCode::from(NOT_FOUND)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(message) => fail(&message),
        },
        Command::Retention {
            target,
            policy,
            dry_run,
            batch_size,
        } => {
            let batch_size = batch_size as usize;
            let run = match policy.older_than {
                Some(idle_for) => {
                    runtime.block_on(retention::by_age(&target, &idle_for, batch_size, dry_run))
                }
                None => runtime.block_on(retention::to_snapshot(&target, batch_size, dry_run)),
            };
            match run {
                Ok(outcome) => {
                    println!("{}", outcome.summary);
                    needs_action(outcome.would_delete)
                }
                Err(failure) => failure.exit(),
            }
        }
        Command::Repair {
            target,
            verify_frames,
            batch_size,
        } => match runtime.block_on(repair::repair(&target, verify_frames, batch_size as usize)) {
            Ok(outcome) => {
                print!("{}", outcome.report);
                needs_action(outcome.needs_action)
            }
            Err(failure) => failure.exit(),
        },
        Command::Migrate {
            db,
            snapshot_codec,
            lock_timeout_ms,
            to_version,
            sql_only,
            schema,
        } => {
            let db = db.unwrap_or_default();
            if !is_postgres(&db) {
                eprintln!("loom: migrate updates a PostgreSQL database: {NOT_POSTGRES}");
                return ExitCode::from(USAGE);
            }
            let codec = match crate::snapshot_store::codec_from_name(&snapshot_codec) {
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
                .lock_timeout(std::time::Duration::from_millis(lock_timeout_ms.into()))
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
            let migrated = runtime.block_on(crate::migrate::migrate(&db, &options));
            drop((options, bar));
            match migrated {
                Ok(migration) => {
                    print!("{}", render_migration(&migration));
                    needs_action(!migration_landed(&migration))
                }
                Err(e) => fail(&describe(&e)),
            }
        }
        Command::MoveToExtension {
            db,
            lock_timeout_ms,
        } => {
            let db = db.unwrap_or_default();
            if !is_postgres(&db) {
                eprintln!("loom: move-to-extension moves a PostgreSQL database: {NOT_POSTGRES}");
                return ExitCode::from(USAGE);
            }
            match runtime.block_on(crate::move_to_extension::move_to_extension(
                &db,
                std::time::Duration::from_millis(lock_timeout_ms.into()),
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
        Command::Snapshot(SnapshotCommand::Show {
            target,
            execution_id,
            at,
            redact,
            keys,
            json,
        }) => match runtime.block_on(show(
            target.db(),
            &execution_id,
            at,
            keys,
            target.connect_timeout(),
        )) {
            Ok(Some(snapshot)) => {
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                match write_snapshot(&mut out, &snapshot, &redact, json).and_then(|()| out.flush())
                {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(&format!("cannot print the snapshot: {e}")),
                }
            }
            Ok(None) => not_found(&match at {
                Some(sequence) => format!("no snapshot of {execution_id:?} at sequence {sequence}"),
                None => format!("no snapshot of {execution_id:?}"),
            }),
            Err(message) => fail(&message),
        },
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

/// An error and its sources, one line: tokio-postgres says only "db
/// error" at the top, and the server's message and SQLSTATE below it.
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    if text.contains("unsupported startup parameter: options") {
        // PgBouncer's refusal of the read-only setting (and of a pool's
        // statement_timeout), which a reader cannot guess from it.
        text.push_str(
            " (a pooler refused the startup options that make the loom command's reads read-only: \
             give --db a direct connection to the server)",
        );
    }
    text
}

/// Exit 1: something needs action (a dry run that would delete, a
/// pending item, an unreadable frame, a migration that did not land).
const NEEDS_ACTION: u8 = 1;
/// Exit 2: the command line is wrong, or names no database.
const USAGE: u8 = 2;
/// Exit 3: the database could not be reached or read, or the command
/// failed.
const ERROR: u8 = 3;
/// Exit 4: what was asked for is not there (no snapshot, no events, no
/// execution ids after the cursor).
const NOT_FOUND: u8 = 4;

/// Exit [`NEEDS_ACTION`] when something needs action, else 0.
fn needs_action(needs: bool) -> ExitCode {
    if needs {
        ExitCode::from(NEEDS_ACTION)
    } else {
        ExitCode::SUCCESS
    }
}

/// Why `--db` names no database, in words that never repeat it: what does
/// not parse as a PostgreSQL string is read as a file path, and a mistyped
/// URL (`postgre://app:pw@db1/app`) is such a path, password included.
const NOT_POSTGRES: &str =
    "--db is neither a postgres:// or postgresql:// URL nor a key=value string";

/// See [`NOT_POSTGRES`].
pub(super) const NO_SQLITE_DATABASE: &str = "no SQLite database at the --db path (nor is --db a postgres:// or postgresql:// URL or a key=value string)";

impl Command {
    /// The `--db` of a command that connects to a database.
    fn db_mut(&mut self) -> Option<&mut Option<String>> {
        match self {
            Command::Snapshot(SnapshotCommand::Show { target, .. })
            | Command::Executions(ExecutionsCommand::List { target, .. })
            | Command::Events(EventsCommand::Show { target, .. })
            | Command::Retention { target, .. }
            | Command::Repair { target, .. }
            | Command::Status { target, .. } => Some(&mut target.db),
            Command::Migrate { db, .. } | Command::MoveToExtension { db, .. } => Some(db),
            Command::Completions { .. } => None,
        }
    }

    /// The database of a command that reads PostgreSQL or a SQLite file.
    fn target(&self) -> Option<&Target> {
        match self {
            Command::Snapshot(SnapshotCommand::Show { target, .. })
            | Command::Executions(ExecutionsCommand::List { target, .. })
            | Command::Events(EventsCommand::Show { target, .. })
            | Command::Retention { target, .. }
            | Command::Repair { target, .. } => Some(target),
            Command::Status { .. }
            | Command::Migrate { .. }
            | Command::MoveToExtension { .. }
            | Command::Completions { .. } => None,
        }
    }
}

/// A usage error as clap words it, but with every argument that may be a
/// connection string replaced: clap quotes what it cannot place (`loom
/// status postgres://app:pw@db1/app`, `--db` forgotten), and the password
/// with it.
fn usage_error(e: &clap::Error) -> ExitCode {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let rendered = e.render().to_string();
    let redacted = redact_args(&rendered, &args);
    if redacted == rendered {
        // Help, version, and errors that quote nothing secret: clap's own
        // output, colours and exit code.
        e.exit();
    }
    eprint!("{redacted}");
    ExitCode::from(USAGE)
}

/// `text` with each of `args` that may hold a secret (a URL, `key=value`
/// or user info: a `://`, `=` or `@`), and each `--flag=value`'s value,
/// replaced by `<redacted>`.
fn redact_args(text: &str, args: &[String]) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    for arg in args {
        secrets.push(arg);
        if let Some((flag, value)) = arg.split_once('=') {
            if flag.starts_with("--") {
                secrets.push(value);
            }
        }
    }
    // Three bytes at least: a lone "=" is no secret, and replacing it would
    // garble the message.
    let may_hold_secret = |s: &&str| s.len() > 2 && ["://", "=", "@"].iter().any(|m| s.contains(m));
    secrets.retain(may_hold_secret);
    // Longest first: a value inside its own `--flag=value` goes with it.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        text = text.replace(secret, "<redacted>");
    }
    text
}

/// Why a command did not do its work: an error, or, when loom is missing
/// or lacks what the command needs, something to act on (`loom migrate`),
/// which exits [`NEEDS_ACTION`], not [`ERROR`]: a probe tells "run a
/// migration" from "the database is down".
pub(super) struct Failure {
    message: String,
    needs_migrate: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure {
            message,
            needs_migrate: false,
        }
    }
}

impl Failure {
    /// `e`, described with its causes; needing a migration when loom is
    /// missing or too old for what was asked.
    pub(super) fn of(e: &crate::Error) -> Self {
        Failure {
            message: describe(e),
            needs_migrate: matches!(
                e,
                crate::Error::ExtensionMissing { .. } | crate::Error::ExtensionTooOld { .. }
            ),
        }
    }

    /// Loom not installed, or lacking what the command needs: `message`
    /// says to migrate.
    pub(super) fn needs_migrate(message: String) -> Self {
        Failure {
            message,
            needs_migrate: true,
        }
    }

    /// Says why; exit [`NEEDS_ACTION`] or [`ERROR`].
    fn exit(self) -> ExitCode {
        eprintln!("loom: {}", self.message);
        ExitCode::from(if self.needs_migrate {
            NEEDS_ACTION
        } else {
            ERROR
        })
    }
}

/// Says why the command failed; exit [`ERROR`].
fn fail(message: &str) -> ExitCode {
    eprintln!("loom: {message}");
    ExitCode::from(ERROR)
}

/// Says what is not there; exit [`NOT_FOUND`].
fn not_found(message: &str) -> ExitCode {
    eprintln!("loom: {message}");
    ExitCode::from(NOT_FOUND)
}

fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://") || db.contains('=')
}

fn key_ring(keys: Option<PathBuf>) -> Result<Option<KeyRing>, String> {
    let text = match keys {
        Some(path) => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        None => match std::env::var("LOOM_KEYRING") {
            Ok(text) => text,
            Err(_) => return Ok(None),
        },
    };
    KeyRing::from_json(&text)
        .map(Some)
        .map_err(|e| describe(&e))
}

fn query(at: Option<i64>) -> SnapshotQuery {
    at.map_or(SnapshotQuery::Latest, SnapshotQuery::At)
}

async fn show_from<S: SnapshotStore>(
    store: S,
    execution_id: &str,
    at: Option<i64>,
    keys: Option<KeyRing>,
) -> Result<Option<Snapshot>, String> {
    let Some(found) = store
        .load(execution_id, query(at))
        .await
        .map_err(|e| describe(&e))?
    else {
        return Ok(None);
    };
    let found = if is_sealed(found.state.as_str()) {
        let keys = keys
            .ok_or("the snapshot is sealed: give the key ring with --keys FILE or LOOM_KEYRING")?;
        let sealed = EncryptingSnapshotStore::new(store, keys);
        match sealed
            .load(execution_id, SnapshotQuery::At(found.sequence))
            .await
            .map_err(|e| describe(&e))?
        {
            Some(opened) => opened,
            None => return Ok(None),
        }
    } else {
        found
    };
    printable(found).map(Some)
}

/// `snapshot`, once its state is one JSON text. The state is printed as
/// it came, into an object (`--json`) and through the redaction of keys,
/// so text that is not JSON (a hostile server's: the stores take the
/// server's jsonb output as JSON unscanned) could end the object early or
/// slip a key past redaction.
fn printable(snapshot: Snapshot) -> Result<Snapshot, String> {
    require_json(snapshot.state.as_str(), "state", || {
        format!(
            "snapshot {} of {:?}",
            snapshot.sequence, snapshot.execution_id
        )
    })?;
    Ok(snapshot)
}

/// Refuses `text`, the `field` of what `owner` names, unless it is one
/// JSON text: what the commands check before they splice stored JSON into
/// their output as it came.
fn require_json(text: &str, field: &str, owner: impl FnOnce() -> String) -> Result<(), String> {
    pgloom_core::json::validate(text.as_bytes())
        .map_err(|e| format!("{}: the {field} is not JSON: {e}", owner()))
}

async fn show(
    db: &str,
    execution_id: &str,
    at: Option<i64>,
    keys: Option<PathBuf>,
    connect_timeout: Duration,
) -> Result<Option<Snapshot>, String> {
    let keys = key_ring(keys)?;
    if is_postgres(db) {
        let pool = read_only_pool(db, connect_timeout)?;
        let store = PgSnapshotStore::start(pool, &PgSnapshotStoreOptions::new())
            .await
            .map_err(|e| describe(&e))?;
        show_from(store, execution_id, at, keys).await
    } else {
        let store =
            SqliteSnapshotStore::open_read_only(db, Codec::None).map_err(|e| describe(&e))?;
        show_from(store, execution_id, at, keys).await
    }
}

/// A pool of one connection to `db` (a command runs one statement at a
/// time), and no wait past `connect_timeout`.
fn one_connection(db: &str, connect_timeout: Duration) -> Result<PgPool, String> {
    connection_pool(db, connect_timeout, false)
}

/// One connection to `db` in which every transaction refuses to write
/// (and a store without a codec does no DDL), and no wait past
/// `connect_timeout`: a database that does not answer is an error, never
/// a hang. The setting joins the user's own `options`, in the parsed
/// configuration: no text of theirs can undo it.
fn read_only_pool(db: &str, connect_timeout: Duration) -> Result<PgPool, String> {
    connection_pool(db, connect_timeout, true)
}

fn connection_pool(db: &str, connect_timeout: Duration, read_only: bool) -> Result<PgPool, String> {
    let mut options = PgPoolOptions::new();
    options
        .max_size(1)
        .create_timeout(connect_timeout)
        .wait_timeout(connect_timeout)
        .recycle_timeout(connect_timeout)
        .read_only = read_only;
    PgPool::connect_with(db, &options).map_err(|e| describe(&e))
}

/// Prints `snapshot` to `out` as it is read, never built whole: the state
/// alone can be as large as a frame declares ([`pretty`] says how deep
/// nesting stays linear). `compact`: the same object on one line.
fn write_snapshot(
    out: &mut impl Write,
    snapshot: &Snapshot,
    redact: &[String],
    compact: bool,
) -> std::io::Result<()> {
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    // ADR 0141 D7's fields in its order, then the state: indented, but
    // otherwise exactly as stored (no parse: key order and escapes stay).
    let fields = [
        ("id", snapshot.id.to_string()),
        ("executionId", quoted(&snapshot.execution_id)),
        ("workflowId", quoted(&snapshot.workflow_id)),
        ("sequence", snapshot.sequence.to_string()),
        ("createdAt", quoted(&rfc3339(snapshot.created_at))),
    ];
    let (open, separator, close) = if compact {
        ("{", ":", "}\n")
    } else {
        ("{\n  ", ": ", "\n}\n")
    };
    out.write_all(open.as_bytes())?;
    for (name, value) in fields {
        write!(out, "\"{name}\"{separator}{value},")?;
        if !compact {
            out.write_all(b"\n  ")?;
        }
    }
    write!(out, "\"state\"{separator}")?;
    // Past the deepest indented level, write_indented adds no white space.
    let depth = if compact {
        pretty::MAX_INDENTED_DEPTH + 1
    } else {
        1
    };
    pretty::write_indented(out, snapshot.state.as_str(), redact, depth)?;
    out.write_all(close.as_bytes())
}

/// UTC, to the microsecond: `2026-11-30T21:08:28.123456Z`.
fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_796_073_708_123_456);
        assert_eq!(rfc3339(t), "2026-11-30T21:21:48.123456Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
    }

    /// Issue 25, item 6: `loom snapshot show` of a 50,000-deep state
    /// built its whole output, 2.5 GB of indentation, and aborted. The
    /// snapshot is written as it is read, in output linear in the state.
    #[test]
    fn a_deep_state_prints_in_output_linear_in_the_state() {
        for depth in [50_000, 400_000] {
            let state = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let snapshot = Snapshot {
                id: 1,
                execution_id: "exec-1".to_owned(),
                workflow_id: "w".to_owned(),
                sequence: 1,
                created_at: UNIX_EPOCH,
                state: crate::snapshot_store::JsonText::new(state.clone()).unwrap(),
            };
            let mut out = Vec::new();
            write_snapshot(&mut out, &snapshot, &[], false).unwrap();
            assert!(
                out.len() < 2 * state.len() + 200,
                "{depth} levels: {} bytes printed for {} bytes of state",
                out.len(),
                state.len()
            );
            assert!(out.ends_with(b"]\n}\n"));
        }
    }

    /// Text a hostile server sent as jsonb output, which the stores take
    /// unscanned, is refused before it is printed: here it would close
    /// the object and add a key of its own.
    #[test]
    fn a_state_that_is_not_json_is_refused_before_it_is_printed() {
        let snapshot = |state: &str| Snapshot {
            id: 1,
            execution_id: "exec-1".to_owned(),
            workflow_id: "w".to_owned(),
            sequence: 2,
            created_at: UNIX_EPOCH,
            state: crate::snapshot_store::JsonText::printed_by_server(state.to_owned()),
        };
        let injected = printable(snapshot(r#"1}, "executionId": "other", "x": {"#));
        assert!(
            matches!(&injected, Err(e) if e.contains("snapshot 2 of \"exec-1\": the state is not JSON")),
            "{injected:?}"
        );
        assert!(printable(snapshot(r#"{"a": [1, 2]}"#)).is_ok());
    }

    /// `--json`: the same object as the indented print, on one line, the
    /// state's tokens as stored (key order, duplicates, `1.0`, escapes),
    /// redaction included.
    #[test]
    fn json_prints_the_same_object_on_one_line() {
        let stored = r#"{"b": 1.0, "a": [1, {"apiKey": "s3cret"}], "b": "\u00e9"}"#;
        let snapshot = Snapshot {
            id: 7,
            execution_id: "exec-\"1\"".to_owned(),
            workflow_id: "w".to_owned(),
            sequence: 3,
            created_at: UNIX_EPOCH,
            state: crate::snapshot_store::JsonText::new(stored.to_owned()).unwrap(),
        };
        let print = |compact, redact: &[String]| {
            let mut out = Vec::new();
            write_snapshot(&mut out, &snapshot, redact, compact).unwrap();
            String::from_utf8(out).unwrap()
        };
        let line = print(true, &[]);
        assert_eq!(
            line,
            concat!(
                r#"{"id":7,"executionId":"exec-\"1\"","workflowId":"w","sequence":3,"#,
                r#""createdAt":"1970-01-01T00:00:00.000000Z","#,
                r#""state":{"b":1.0,"a":[1,{"apiKey":"s3cret"}],"b":"\u00e9"}}"#,
                "\n"
            )
        );
        let parsed = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(parsed(&line), parsed(&print(false, &[])));
        let redacted = print(true, &["apiKey".to_owned()]);
        assert!(
            redacted.contains(r#"{"apiKey":"[redacted]"}"#),
            "{redacted}"
        );
        assert_eq!(redacted.lines().count(), 1);
    }

    /// Issue 25, item 7: clap quotes an argument it cannot place, such as
    /// a connection string given without `--db`.
    #[test]
    fn usage_errors_never_quote_what_may_be_a_connection_string() {
        let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        let shown = redact_args(
            "error: unexpected argument 'postgres://app:pw@db1/app' found\n",
            &args(&["status", "postgres://app:pw@db1/app"]),
        );
        assert_eq!(shown, "error: unexpected argument '<redacted>' found\n");
        let shown = redact_args(
            "error: invalid value 'host=db1 password=pw' for '--connect-timeout <SECS>'",
            &args(&["status", "--connect-timeout=host=db1 password=pw"]),
        );
        assert!(!shown.contains("pw"), "{shown}");
        // What holds none of "://", "=" or "@" is left as clap says it.
        let said = "error: invalid value '5x' for '--connect-timeout <SECS>'";
        assert_eq!(
            redact_args(said, &args(&["--connect-timeout", "5x", "="])),
            said
        );
    }
}
