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
mod migrate;
mod pretty;
mod progress;
mod repair;
mod retention;
mod snapshot;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory as _, Parser, Subcommand};

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
        } => status::run(
            &runtime,
            &target,
            json,
            verify.then_some(batch_size as usize),
        ),
        Command::Executions(ExecutionsCommand::List {
            target,
            after,
            limit,
            json,
        }) => log::list_executions(&runtime, &target, after.as_deref(), limit as usize, json),
        Command::Events(EventsCommand::Show {
            target,
            execution_id,
            after,
            limit,
            json,
        }) => log::show_events(
            &runtime,
            &target,
            &execution_id,
            after,
            limit as usize,
            json,
        ),
        Command::Retention {
            target,
            policy,
            dry_run,
            batch_size,
        } => retention::run(
            &runtime,
            &target,
            policy.older_than.as_ref(),
            batch_size as usize,
            dry_run,
        ),
        Command::Repair {
            target,
            verify_frames,
            batch_size,
        } => repair::run(&runtime, &target, verify_frames, batch_size as usize),
        Command::Migrate {
            db,
            snapshot_codec,
            lock_timeout_ms,
            to_version,
            sql_only,
            schema,
        } => migrate::run(
            &runtime,
            &db.unwrap_or_default(),
            &snapshot_codec,
            Duration::from_millis(lock_timeout_ms.into()),
            to_version,
            sql_only,
            schema,
        ),
        Command::MoveToExtension {
            db,
            lock_timeout_ms,
        } => migrate::move_to_extension(
            &runtime,
            &db.unwrap_or_default(),
            Duration::from_millis(lock_timeout_ms.into()),
        ),
        Command::Snapshot(SnapshotCommand::Show {
            target,
            execution_id,
            at,
            redact,
            keys,
            json,
        }) => snapshot::show(&runtime, &target, &execution_id, at, &redact, keys, json),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
