//! Creating or upgrading the `loom` extension the documented way
//! (docs/upgrading.md), so that a service can run it at boot; or, with
//! [`MigrateOptions::sql_only`], loom's SQL-only flavour (docs/flavours.md)
//! as the database's owner, where the server cannot load `loom.so`.
//!
//! `ALTER EXTENSION` is one statement whose `statement_timeout` timer
//! starts before its script does, and a function cannot switch off the
//! timer of the statement that called it: a pool's short timeout would
//! cancel an index rebuild on every boot, a crash loop in which the
//! migration never completes (ADR 0108 D3). `migrate` therefore runs each
//! step as its own top-level statements with `statement_timeout` 0:
//!
//! 1. In one transaction: take the migration lock, one only loom's owner
//!    and superusers can hold (the row of `loom.migration_lock`, `FOR
//!    UPDATE`; on an older install, the lock its version used), queueing
//!    behind a peer's one-time rebuild as intended, but at most
//!    [`MigrateOptions::migration_lock_wait`] ([`Error::MigrationLockTimeout`]
//!    names the holders then, and a WARNING every 10 s before), put
//!    the caller's `lock_timeout` back, and create the extension in the
//!    schema [`MigrateOptions::schema`] names (`public` by default) or
//!    update it. The conversions bound their own lock waits
//!    ([`MigrateOptions::lock_timeout`]) and fail soft with a WARNING.
//! 2. In its own transaction: re-run the collation conversions
//!    (`loom_migrate_collations`), so a conversion that an earlier boot
//!    skipped lands on a later one. Once done it is a catalog check that
//!    takes no table lock a writer waits on (only the migration lock,
//!    briefly).
//!    Likewise, where an update could not, drop the index on
//!    `loom.events.execution_id` that loom does not read
//!    (`loom_drop_events_id_index`) and add events' metadata column
//!    (`loom_ensure_event_metadata`).
//! 3. Only when asked ([`MigrateOptions::snapshot_codec`]), in its own short
//!    transaction after the rest committed (ADR 0141 D5, so it neither
//!    extends nor reorders the conversions' locks): provision zstd
//!    snapshot frames (`loom_ensure_snapshot_zstd`), failing soft.
//!
//! Every WARNING is returned in [`Migration::warnings`] and handed to
//! [`MigrateOptions::on_warning`]; the outcomes are in [`Migration`].
//!
//! A migration usually runs as a superuser, in a database whose owner may
//! have planted functions, operators and types for it to resolve
//! (`REVIEW.md`, issue 25). So nothing here resolves through the
//! `search_path` (`crate::pg_schema`): before the extension exists only
//! `pg_catalog` is called, and after, only functions the catalog says the
//! extension has, by its schema. A SQL-only database's functions are its
//! owner's: a migration whose role may do more than that owner refuses
//! before calling any ([`Error::SqlOnlyOwnedByAnother`]).

use std::sync::{Arc, Mutex};

use futures::{future, StreamExt};
use tokio_postgres::error::Severity;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Transaction};

use crate::pg_row::column;
use crate::pg_schema::{LoomSchema, SchemaCell};
use crate::snapshot_store::Codec;
use crate::telemetry::{traced, Database};
use crate::{Error, Result};

/// Receives each WARNING a migration sends.
type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;
/// Receives each step of a migration as it starts and ends.
type ProgressSink = Arc<dyn Fn(MigrationProgress<'_>) + Send + Sync>;

/// A step of [`migrate`] starting or ending, for a progress display: a
/// conversion can rewrite a table, and an operator wants to see which one
/// is running. Steps: `extension` (create or update), `collations` (which
/// ends with one `Finished` a column, the column as its step), `events id
/// index`, `snapshot frames` (when asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationProgress<'a> {
    /// The step is running.
    Started(&'a str),
    /// The step ended, with what it did (as [`Migration`] says it).
    Finished {
        /// The step.
        step: &'a str,
        /// What it did.
        outcome: &'a str,
    },
}

pub use crate::flavour::Flavour;

/// How to migrate. `Default` is [`MigrateOptions::new`].
#[derive(Clone)]
pub struct MigrateOptions {
    lock_timeout: std::time::Duration,
    to_version: Option<String>,
    schema: String,
    flavour: Flavour,
    snapshot_codec: Codec,
    migration_lock_wait: std::time::Duration,
    on_warning: Option<WarningSink>,
    on_progress: Option<ProgressSink>,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MigrateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrateOptions")
            .field("lock_timeout", &self.lock_timeout)
            .field("to_version", &self.to_version)
            .field("schema", &self.schema)
            .field("flavour", &self.flavour)
            .field("snapshot_codec", &self.snapshot_codec)
            .field("migration_lock_wait", &self.migration_lock_wait)
            .field("on_warning", &self.on_warning.is_some())
            .field("on_progress", &self.on_progress.is_some())
            .finish()
    }
}

impl MigrateOptions {
    /// Waits at most 2000 ms for each conversion's lock, creates in
    /// `public` or updates to the newest installed version, provisions no
    /// snapshot frames, and only returns warnings.
    #[must_use]
    pub fn new() -> Self {
        MigrateOptions {
            lock_timeout: std::time::Duration::from_secs(2),
            to_version: None,
            schema: "public".to_owned(),
            flavour: Flavour::Extension,
            snapshot_codec: Codec::None,
            migration_lock_wait: DEFAULT_MIGRATION_LOCK_WAIT,
            on_warning: None,
            on_progress: None,
        }
    }

    /// Each conversion's lock wait (`loom.migration_lock_timeout`), rounded
    /// up to whole milliseconds; not zero (PostgreSQL reads 0 as "wait
    /// forever": [`migrate`] refuses it with [`Error::InvalidLockTimeout`]).
    /// Default 2 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pgloom::migrate::MigrateOptions;
    /// let mut options = MigrateOptions::new();
    /// options.lock_timeout(Duration::from_millis(500));
    /// ```
    pub fn lock_timeout(&mut self, wait: std::time::Duration) -> &mut Self {
        self.lock_timeout = wait;
        self
    }

    /// How long to wait for loom's migration lock, behind a peer's
    /// migration or whoever else holds it (only loom's owner and
    /// superusers can: docs/upgrading.md), before giving up with
    /// [`Error::MigrationLockTimeout`], which names the holders. A WARNING
    /// names them every 10 s meanwhile. At least 1 ms (0 is
    /// [`Error::InvalidLockTimeout`]). Default ten minutes, long enough for
    /// a peer's one-time rebuild (ADR 0108 D3.3).
    ///
    /// ```
    /// use pgloom::migrate::MigrateOptions;
    /// let mut options = MigrateOptions::new();
    /// options.migration_lock_wait(std::time::Duration::from_secs(60));
    /// ```
    pub fn migration_lock_wait(&mut self, wait: std::time::Duration) -> &mut Self {
        self.migration_lock_wait = wait;
        self
    }

    /// The version to install or update to. Default: the newest installed.
    pub fn to_version(&mut self, version: impl Into<String>) -> &mut Self {
        self.to_version = Some(version.into());
        self
    }

    /// The schema a migration that creates the extension puts loom's
    /// functions in (`CREATE EXTENSION loom SCHEMA …`; it must exist, and
    /// not be `loom`, which holds loom's tables). Default `public`.
    ///
    /// Named rather than left to the `search_path`, whose first schema,
    /// `"$user"`, is one a database's owner can create under a
    /// superuser's name. An installed extension stays where it is (loom is
    /// not relocatable); stores and the CLI find it from the catalog.
    ///
    /// ```
    /// use pgloom::migrate::MigrateOptions;
    /// let mut options = MigrateOptions::new();
    /// options.schema("loom_api");
    /// ```
    pub fn schema(&mut self, schema: impl Into<String>) -> &mut Self {
        self.schema = schema.into();
        self
    }

    /// Installs or updates loom's SQL-only flavour instead of the
    /// extension: for a server that cannot load `loom.so` (RDS, Aurora,
    /// Cloud SQL, AlloyDB, Azure, Supabase, Neon), run as the database's
    /// owner, no superuser needed. The script is the one `make sql-only`
    /// writes ([`pgloom_core::sql::sql_only_install_script`]), in one
    /// transaction with the migration lock held; the version it records
    /// in `loom.sql_only` is [`pgloom_core::sql::VERSION`], the only one
    /// this client installs ([`MigrateOptions::to_version`] may name
    /// nothing else). A database with the extension is refused with
    /// [`Error::WrongFlavour`], as is a SQL-only one without this option.
    ///
    /// ```
    /// use pgloom::migrate::MigrateOptions;
    /// let mut options = MigrateOptions::new();
    /// options.sql_only();
    /// ```
    pub fn sql_only(&mut self) -> &mut Self {
        self.flavour = Flavour::SqlOnly;
        self
    }

    /// With [`Codec::Zstd`], also provision zstd snapshot frames
    /// (`loom_ensure_snapshot_zstd`, ADR 0141 D5), for deployments that
    /// provision ahead of their stores. Default [`Codec::None`]: no DDL.
    pub fn snapshot_codec(&mut self, codec: Codec) -> &mut Self {
        self.snapshot_codec = codec;
        self
    }

    /// Called with each WARNING the server sends while migrating (a
    /// conversion that failed soft, with the statements to run by hand).
    pub fn on_warning(&mut self, f: impl Fn(&str) + Send + Sync + 'static) -> &mut Self {
        self.on_warning = Some(Arc::new(f));
        self
    }

    /// Called as each step starts and ends ([`MigrationProgress`]): what
    /// `loom migrate`'s progress display shows.
    pub fn on_progress(
        &mut self,
        f: impl Fn(MigrationProgress<'_>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.on_progress = Some(Arc::new(f));
        self
    }

    fn report(&self, progress: MigrationProgress<'_>) {
        if let Some(f) = &self.on_progress {
            f(progress);
        }
    }
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// The version before (`None`: the extension was created).
    pub from_version: Option<String>,
    /// The version after.
    pub to_version: String,
    /// Each collation conversion's outcome after the re-run, as
    /// `(column, outcome)`: already `COLLATE "C"`, converted, or skipped
    /// (a soft failure, also among the warnings). Empty at 0.1.0, which
    /// has no conversions.
    pub collations: Vec<(String, StepOutcome)>,
    /// What became of `loom.idx_events_exec`, the index 0.7.0 drops:
    /// already dropped, dropped, or skipped (a soft failure, also among
    /// the warnings; the next boot retries). `None` before 0.7.0.
    pub events_id_index: Option<StepOutcome>,
    /// What became of `loom.events.metadata`, the column 0.11.0 adds:
    /// present, added, or skipped (a soft failure, also among the
    /// warnings; until it lands an append with metadata is refused, and
    /// the next boot retries). `None` before 0.11.0.
    pub event_metadata: Option<StepOutcome>,
    /// Whether zstd snapshot frames are provisioned, when
    /// [`MigrateOptions::snapshot_codec`] asked for them: `Some(false)` is
    /// a soft failure (a lock held too long): stores write JSONB, and the
    /// next boot retries.
    pub snapshot_frames: Option<bool>,
    /// The server's WARNINGs, as "SQLSTATE: message HINT: hint".
    pub warnings: Vec<String>,
}

/// What one step of a migration's second part did (a collation
/// conversion, the unused index's drop, the metadata column): each loom
/// function that does one returns it as text, and this is that text read
/// once, so that callers match on a variant, never on words.
///
/// ```
/// use pgloom::migrate::StepOutcome;
/// let skipped = StepOutcome::from_server("skipped: 55P03".to_owned());
/// assert!(skipped.is_skipped());
/// assert_eq!(skipped.to_string(), "skipped: 55P03");
/// assert_eq!(StepOutcome::from_server("dropped".to_owned()), StepOutcome::Done("dropped".to_owned()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepOutcome {
    /// Nothing was left to do: `already COLLATE "C"`, `already dropped`,
    /// `present` (a catalog check, no lock).
    AlreadyDone(String),
    /// Done now: `converted`, `dropped`, `added`.
    Done(String),
    /// Failed soft, changing nothing; the next migration tries again (and
    /// the server said why in a WARNING): `reason` is the SQLSTATE, or
    /// `statement_timeout` when one was set.
    Skipped {
        /// The SQLSTATE or setting that stopped it.
        reason: String,
    },
    /// Words this client does not know (a newer extension's): as the
    /// server said them.
    Other(String),
}

impl StepOutcome {
    /// The outcome a loom function's text says.
    #[must_use]
    pub fn from_server(text: String) -> Self {
        if let Some(reason) = text.strip_prefix("skipped: ") {
            return StepOutcome::Skipped {
                reason: reason.to_owned(),
            };
        }
        match text.as_str() {
            "converted" | "dropped" | "added" => StepOutcome::Done(text),
            "present" => StepOutcome::AlreadyDone(text),
            _ if text.starts_with("already ") => StepOutcome::AlreadyDone(text),
            _ => StepOutcome::Other(text),
        }
    }

    /// Whether the step failed soft and needs a later migration.
    #[must_use]
    pub fn is_skipped(&self) -> bool {
        matches!(self, StepOutcome::Skipped { .. })
    }
}

impl std::fmt::Display for StepOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepOutcome::AlreadyDone(text) | StepOutcome::Done(text) | StepOutcome::Other(text) => {
                f.write_str(text)
            }
            StepOutcome::Skipped { reason } => write!(f, "skipped: {reason}"),
        }
    }
}

/// Creates the `loom` extension, or updates it, in the database `config`
/// names (a libpq connection string or URL), the documented way.
///
/// It takes the connection string, not a [`crate::PgPool`] or a client:
/// it opens one connection of its own (open within 5 s, else
/// [`Error::ConnectTimeout`]), because it reports the server's
/// WARNINGs, which only the connection's own driver task hears (a pooled
/// connection's are dropped). Give it the string the pool was built from;
/// it works through a transaction-mode pooler too (docs/client.md,
/// "Poolers"). The connection is closed when it returns.
///
/// ```no_run
/// # async fn boot() -> pgloom::Result<()> {
/// use pgloom::migrate::{migrate, MigrateOptions};
/// let migration = migrate("host=127.0.0.1 user=loom dbname=app", MigrateOptions::new().lock_timeout(std::time::Duration::from_millis(500))).await?;
/// for warning in &migration.warnings {
///     eprintln!("loom migration: {warning}");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidLockTimeout`] for a lock wait of 0;
/// [`Error::IncompatibleExtension`] when the installed extension, or the
/// version the migration would go to, is one this client does not work
/// with ([`crate::compat`]), before anything changes; what the server
/// raises. A conversion or a frame provisioning that failed soft is a
/// warning (and an outcome in [`Migration`]), not an error.
pub async fn migrate(config: &str, options: &MigrateOptions) -> Result<Migration> {
    let database = Database::postgresql();
    traced(
        &database,
        "migrate",
        None,
        migrate_traced(&database, config, options),
    )
    .await
}

async fn migrate_traced(
    database: &Database,
    config: &str,
    options: &MigrateOptions,
) -> Result<Migration> {
    if options.lock_timeout.is_zero() || options.migration_lock_wait.is_zero() {
        return Err(Error::InvalidLockTimeout(std::time::Duration::ZERO));
    }
    crate::snapshot_store::check_codec(options.snapshot_codec)?;
    let (mut client, mut connection) = crate::pg_connect::connect(config).await?;
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&warnings);
    let on_warning = options.on_warning.clone();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                // WARNINGs only: an update to the current version also
                // sends a NOTICE that there was nothing to do.
                Ok(AsyncMessage::Notice(notice))
                    if notice.parsed_severity() == Some(Severity::Warning) =>
                {
                    let line = format!(
                        "{}: {} HINT: {}",
                        notice.code().code(),
                        notice.message(),
                        notice.hint().unwrap_or("")
                    );
                    if let Some(f) = &on_warning {
                        f(&line);
                    }
                    sink.lock().expect("never poisoned").push(line);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });

    database.learn(&client).await;
    options.report(MigrationProgress::Started("extension"));
    let caller_lock_timeout: String =
        column(&client.query_typed_one("SHOW lock_timeout", &[]).await?, 0)?;
    let warn = |line: String| {
        if let Some(f) = &options.on_warning {
            f(&line);
        }
        warnings.lock().expect("never poisoned").push(line);
    };
    // Twice at most: a SQL-only install that lost the race to a peer's
    // (its CREATE SCHEMA loom waited for the peer's, then failed) finds
    // the peer's install the second time, under its lock.
    let mut attempt = 0;
    let (from_version, to_version) = loop {
        let tx = client.transaction().await?;
        match step_one(&tx, options, &caller_lock_timeout, &warn).await {
            Ok(versions) => {
                tx.commit().await?;
                break versions;
            }
            Err(e) if attempt == 0 && lost_the_install_race(&e) => {
                drop(tx);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    options.report(MigrationProgress::Finished {
        step: "extension",
        outcome: &format!(
            "{} -> {to_version}",
            from_version.as_deref().unwrap_or("(not installed)")
        ),
    });

    let lock_timeout_ms =
        i32::try_from(crate::pg_connect::whole_millis(options.lock_timeout)).unwrap_or(i32::MAX);
    let schema = SchemaCell::new();
    options.report(MigrationProgress::Started("collations"));
    let collations = rerun_conversions(&mut client, &schema, lock_timeout_ms).await?;
    for (column, outcome) in &collations {
        options.report(MigrationProgress::Finished {
            step: column,
            outcome: &outcome.to_string(),
        });
    }
    options.report(MigrationProgress::Started("events id index"));
    let events_id_index = drop_events_id_index(&mut client, &schema, lock_timeout_ms).await?;
    if let Some(outcome) = &events_id_index {
        options.report(MigrationProgress::Finished {
            step: "events id index",
            outcome: &outcome.to_string(),
        });
    }
    options.report(MigrationProgress::Started("event metadata"));
    let event_metadata = ensure_event_metadata(&mut client, &schema, lock_timeout_ms).await?;
    if let Some(outcome) = &event_metadata {
        options.report(MigrationProgress::Finished {
            step: "event metadata",
            outcome: &outcome.to_string(),
        });
    }
    let snapshot_frames = match options.snapshot_codec {
        Codec::None => None,
        Codec::Zstd | Codec::Delta => {
            options.report(MigrationProgress::Started("snapshot frames"));
            // A migration queues behind its peers, as step 1 does.
            let provisioned =
                ensure_snapshot_frames(&mut client, &schema, lock_timeout_ms, None).await?;
            options.report(MigrationProgress::Finished {
                step: "snapshot frames",
                outcome: if provisioned {
                    "provisioned"
                } else {
                    "not provisioned"
                },
            });
            Some(provisioned)
        }
    };
    drop(client);
    // The driver ends with the connection; every notice is in by then.
    let _ = future::join(driver, future::ready(())).await;
    let warnings = warnings.lock().expect("never poisoned").clone();
    Ok(Migration {
        from_version,
        to_version,
        collations,
        events_id_index,
        event_metadata,
        snapshot_frames,
        warnings,
    })
}

/// Step 1 of [`migrate`], in `tx`: the migration lock, then the
/// extension created or updated, or the SQL-only flavour installed or
/// updated. The versions before and after.
async fn step_one(
    tx: &Transaction<'_>,
    options: &MigrateOptions,
    caller_lock_timeout: &str,
    warn: &impl Fn(String),
) -> Result<(Option<String>, String)> {
    tx.batch_execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
        .await?;
    // Which loom this is decides everything before anything of it is
    // called: a SQL-only database's functions are its owner's (the read
    // refuses a session that may do more than that owner), and a
    // migration asked for the other flavour changes nothing.
    let flavour_of = |schema: &Option<LoomSchema>| -> Result<()> {
        match schema.as_ref().map(LoomSchema::flavour) {
            Some(found) if found != options.flavour => Err(Error::WrongFlavour {
                installed: found,
                asked: options.flavour,
            }),
            _ => Ok(()),
        }
    };
    let installed = LoomSchema::read(tx.client()).await?;
    flavour_of(&installed)?;
    // The migration lock is one only loom's owner and superusers can hold
    // (issue 34): from 0.14.0 the row of loom.migration_lock, through
    // loom_take_migration_lock as the SQL functions take it; on a SQL-only database before it, loom.sql_only (its
    // owner's); for the extension before it, or before it exists,
    // pg_extension (superusers' alone; CREATE and ALTER EXTENSION take
    // only ROW EXCLUSIVE on it). A SQL-only database not yet installed has
    // nothing to lock: its install's CREATE SCHEMA loom makes a second
    // one wait for the first, then fail, within the same bound.
    let lock = migration_lock(installed.as_ref(), options.flavour);
    if let Some(lock) = lock {
        take_migration_lock(tx, lock, options.migration_lock_wait, warn).await?;
    }
    tx.query_typed(
        RESTORE_LOCK_TIMEOUT,
        &[
            (&caller_lock_timeout, Type::TEXT),
            (
                &crate::pg_connect::whole_millis(options.lock_timeout).to_string(),
                Type::TEXT,
            ),
        ],
    )
    .await?;
    // What the lock waited for may have installed or updated loom.
    let installed = LoomSchema::read(tx.client()).await?;
    flavour_of(&installed)?;
    match options.flavour {
        Flavour::Extension => update_extension(tx, options).await,
        Flavour::SqlOnly if lock.is_some() => {
            update_sql_only(tx, installed.as_ref(), options).await
        }
        // The install's wait for a peer's, bounded as the lock's is, and
        // its holders named when it ends.
        Flavour::SqlOnly => {
            let wait = options.migration_lock_wait;
            tx.batch_execute("SAVEPOINT loom_install").await?;
            tx.query_typed(
                SET_LOCK_TIMEOUT,
                &[(
                    &format!("{}ms", crate::pg_connect::whole_millis(wait)),
                    Type::TEXT,
                )],
            )
            .await?;
            match update_sql_only(tx, installed.as_ref(), options).await {
                Err(e) if e.sqlstate() == Some("55P03") => {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT loom_install")
                        .await?;
                    let holders: String = column(&tx.query_typed_one(OPEN_WRITERS, &[]).await?, 0)?;
                    Err(Error::MigrationLockTimeout {
                        lock: "CREATE SCHEMA loom (another session installing loom)".to_owned(),
                        waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        holders,
                    })
                }
                other => other,
            }
        }
    }
}

/// Whether `e` is what a SQL-only install that waited for a peer's gets
/// once the peer committed: schema `loom` there already (`42P06`, or the
/// catalog's unique index, `23505`).
fn lost_the_install_race(e: &Error) -> bool {
    matches!(e.sqlstate(), Some("42P06" | "23505"))
}

/// What serializes migrations of what is installed (see [`step_one`]).
#[derive(Debug, Clone, Copy)]
enum MigrationLock<'a> {
    /// From 0.14.0: loom's own, the row of `loom.migration_lock`
    /// (`loom_take_migration_lock` of the loom installed there).
    Loom(&'a LoomSchema),
    /// Before it: a `SHARE UPDATE EXCLUSIVE` lock on this table.
    Table(&'static str),
}

/// The migration lock of what is installed, or none for a SQL-only
/// install into a database without loom.
fn migration_lock(installed: Option<&LoomSchema>, flavour: Flavour) -> Option<MigrationLock<'_>> {
    match installed {
        Some(schema)
            if crate::versions::at_least(schema.version(), "0.14.0")
                && schema.has("loom_take_migration_lock") =>
        {
            Some(MigrationLock::Loom(schema))
        }
        Some(schema) if schema.flavour() == Flavour::SqlOnly => {
            Some(MigrationLock::Table("loom.sql_only"))
        }
        _ if flavour == Flavour::Extension => Some(MigrationLock::Table("pg_catalog.pg_extension")),
        _ => None,
    }
}

/// Takes `lock` in `tx`, waiting at most `wait`: in slices of
/// [`MIGRATION_LOCK_REPORT`], each timed out one rolled back to a
/// savepoint and followed by a `warn`ing that names the holders; after
/// `wait`, [`Error::MigrationLockTimeout`], naming them.
async fn take_migration_lock(
    tx: &Transaction<'_>,
    lock: MigrationLock<'_>,
    wait: std::time::Duration,
    warn: &impl Fn(String),
) -> Result<()> {
    let (what, holders) = match lock {
        MigrationLock::Loom(schema) => (
            "the row of loom.migration_lock".to_owned(),
            schema.sql(LOOM_LOCK_HOLDERS)?,
        ),
        MigrationLock::Table(relation) => (
            format!("LOCK TABLE {relation}"),
            LOCK_HOLDERS.replace("$1::pg_catalog.text", &format!("'{relation}'")),
        ),
    };
    let started = std::time::Instant::now();
    loop {
        let left = wait.saturating_sub(started.elapsed());
        let slice = crate::pg_connect::whole_millis(
            left.min(MIGRATION_LOCK_REPORT)
                .max(std::time::Duration::from_millis(1)),
        );
        tx.batch_execute("SAVEPOINT loom_migration_lock").await?;
        let taken = match lock {
            // One slice: the function gives up (55P03) once it has waited
            // it, naming no one (the WARNING below does).
            MigrationLock::Loom(schema) => {
                tx.batch_execute(&schema.sql(&format!(
                    "SET LOCAL loom.migration_lock_wait_ms = {slice}; SET LOCAL loom.migration_lock_report_ms = {slice};
                     SELECT @extschema@.loom_take_migration_lock()"
                ))?)
                .await
            }
            MigrationLock::Table(_) => {
                tx.batch_execute(&format!(
                    "SET LOCAL lock_timeout = {slice}; {what} IN SHARE UPDATE EXCLUSIVE MODE"
                ))
                .await
            }
        };
        match taken {
            Ok(()) => {
                tx.batch_execute("RELEASE SAVEPOINT loom_migration_lock")
                    .await?;
                return Ok(());
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT loom_migration_lock")
                    .await?;
                let holders: String = column(&tx.query_typed_one(&holders, &[]).await?, 0)?;
                let waited = started.elapsed();
                if waited >= wait {
                    return Err(Error::MigrationLockTimeout {
                        lock: what,
                        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                        holders,
                    });
                }
                warn(format!(
                    "55P03: loom: waiting for the migration lock ({what}), held by {holders} HINT: If the holder is not a loom migration (a session left open), end it: SELECT pg_terminate_backend(pid) with the pid named here."
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Step 1 for the extension: `CREATE EXTENSION` or `ALTER EXTENSION ...
/// UPDATE`, in the migration's transaction. The versions before and after.
async fn update_extension(
    tx: &Transaction<'_>,
    options: &MigrateOptions,
) -> Result<(Option<String>, String)> {
    let from_version: Option<String> = tx
        .query_typed_opt(VERSION, &[])
        .await?
        .map(|row| column(&row, 0))
        .transpose()?;
    // A version this client does not work with is refused before anything
    // changes: its stores would refuse it after.
    let target: Option<String> = column(
        &tx.query_typed_one(TARGET_VERSION, &[(&options.to_version, Type::TEXT)])
            .await?,
        0,
    )?;
    if let Some(target) = &target {
        crate::versions::check(target)?;
    }
    let statement: String = tx
        .query_typed_one(
            EXTENSION_STATEMENT,
            &[
                (&from_version.is_none(), Type::BOOL),
                (&options.to_version, Type::TEXT),
                (&options.schema, Type::TEXT),
            ],
        )
        .await
        .map_err(Error::from)
        .and_then(|row| column(&row, 0))?;
    tx.batch_execute(&statement).await?;
    let to_version: String = column(&tx.query_typed_one(VERSION, &[]).await?, 0)?;
    Ok((from_version, to_version))
}

/// Step 1 for the SQL-only flavour (docs/flavours.md): its install script,
/// or the updates from the version `loom.sql_only` records, in the
/// migration's transaction. A newer version than this client's is left
/// as it is (a newer peer migrated), as `ALTER EXTENSION` would leave it.
/// The versions before and after.
async fn update_sql_only(
    tx: &Transaction<'_>,
    installed: Option<&LoomSchema>,
    options: &MigrateOptions,
) -> Result<(Option<String>, String)> {
    let version = pgloom_core::sql::VERSION;
    if options
        .to_version
        .as_deref()
        .is_some_and(|to| to != version)
    {
        return Err(Error::Unsupported(
            "a SQL-only migration to a version other than this client's (pgloom_core::sql::VERSION)",
        ));
    }
    let Some(installed) = installed else {
        tx.batch_execute(&pgloom_core::sql::sql_only_install_statements(
            &options.schema,
        ))
        .await?;
        return Ok((None, version.to_owned()));
    };
    let from = installed.version().to_owned();
    if crate::versions::at_least(&from, version) {
        return Ok((Some(from.clone()), from));
    }
    let steps =
        pgloom_core::sql::sql_only_update_statements(&from, installed.name()).ok_or_else(|| {
            Error::IncompatibleExtension {
                installed: from.clone(),
                client: crate::versions::CLIENT_VERSION,
            }
        })?;
    tx.batch_execute(&steps).await?;
    Ok((Some(from), version.to_owned()))
}

const VERSION: &str =
    "SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'loom'";
/// How long [`migrate`] waits for the migration lock by default.
pub const DEFAULT_MIGRATION_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(600);
/// How often a wait for the migration lock names its holders.
const MIGRATION_LOCK_REPORT: std::time::Duration = std::time::Duration::from_secs(10);
/// `lock_timeout`, for the rest of the transaction.
const SET_LOCK_TIMEOUT: &str =
    "SELECT pg_catalog.set_config('lock_timeout', $1::pg_catalog.text, true)";
/// The other sessions of this database in a transaction that has written
/// (one of them is installing loom), as [`LOCK_HOLDERS`] says them.
const OPEN_WRITERS: &str = "SELECT coalesce(pg_catalog.string_agg(pg_catalog.format('pid %s (role %s, application %s, %s since %s)',
             a.pid, coalesce(a.usename::pg_catalog.text, '?'), coalesce(pg_catalog.quote_literal(a.application_name), '?'),
             coalesce(a.state, '?'), coalesce(a.xact_start::pg_catalog.text, '?')), '; ' ORDER BY a.pid),
         'no session it can see (ended meanwhile)')
     FROM pg_catalog.pg_stat_activity a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() AND a.backend_xid IS NOT NULL
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()";
/// Who holds loom's own migration lock, 0.14.0+.
const LOOM_LOCK_HOLDERS: &str = "SELECT @extschema@.loom_migration_lock_holders()";
/// The sessions holding a lock on relation `$1` that a SHARE UPDATE
/// EXCLUSIVE one waits for, as one line (pid, role, application, state,
/// transaction start), as `loom_migration_lock_holders()` says them.
const LOCK_HOLDERS: &str = "SELECT coalesce(pg_catalog.string_agg(pg_catalog.format('pid %s (role %s, application %s, %s since %s)',
             l.pid, coalesce(a.usename::pg_catalog.text, '?'), coalesce(pg_catalog.quote_literal(a.application_name), '?'),
             coalesce(a.state, '?'), coalesce(a.xact_start::pg_catalog.text, '?')), '; ' ORDER BY l.pid),
         'no session it can see (ended meanwhile)')
     FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
     WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.granted
       AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND l.relation OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)
       AND l.mode OPERATOR(pg_catalog.=) ANY ('{ShareUpdateExclusiveLock,ShareLock,ShareRowExclusiveLock,ExclusiveLock,AccessExclusiveLock}'::pg_catalog.text[])";
const RESTORE_LOCK_TIMEOUT: &str =
    "SELECT pg_catalog.set_config('lock_timeout', $1::pg_catalog.text, true),
            pg_catalog.set_config('loom.migration_lock_timeout', $2::pg_catalog.text, true)";
/// The version a migration goes to: the one asked for, else the installed
/// package's default (NULL when no package is installed: the CREATE or
/// ALTER then fails with the server's own error).
const TARGET_VERSION: &str = "SELECT coalesce($1::pg_catalog.text,
         (SELECT default_version FROM pg_catalog.pg_available_extensions
          WHERE name OPERATOR(pg_catalog.=) 'loom'))";
/// `CREATE EXTENSION loom SCHEMA <$3> [VERSION <$2>]` when `$1`, else
/// `ALTER EXTENSION loom UPDATE [TO <$2>]`. The server quotes the schema
/// and the version: each is an identifier or a literal, whatever it holds.
const EXTENSION_STATEMENT: &str = "SELECT CASE WHEN $1::pg_catalog.bool
         THEN 'CREATE EXTENSION loom SCHEMA '::pg_catalog.text OPERATOR(pg_catalog.||) pg_catalog.quote_ident($3::pg_catalog.text)
         ELSE 'ALTER EXTENSION loom UPDATE'::pg_catalog.text END
     OPERATOR(pg_catalog.||) coalesce(
         CASE WHEN $1::pg_catalog.bool THEN ' VERSION '::pg_catalog.text ELSE ' TO '::pg_catalog.text END
         OPERATOR(pg_catalog.||) pg_catalog.quote_literal($2::pg_catalog.text), '')";
/// The transaction's statements bounded (`SET LOCAL statement_timeout`).
const BOUND_STATEMENT: &str =
    "SELECT pg_catalog.set_config('statement_timeout', $1::pg_catalog.text, true)";
const MIGRATE_COLLATIONS: &str =
    "SELECT column_name, outcome FROM @extschema@.loom_migrate_collations($1::pg_catalog.int4)";
const DROP_EVENTS_ID_INDEX: &str =
    "SELECT @extschema@.loom_drop_events_id_index($1::pg_catalog.int4)";
const ENSURE_EVENT_METADATA: &str =
    "SELECT @extschema@.loom_ensure_event_metadata($1::pg_catalog.int4)";
const ENSURE_SNAPSHOT_ZSTD: &str =
    "SELECT @extschema@.loom_ensure_snapshot_zstd($1::pg_catalog.int4)";

/// Step 2: the conversions, as statements of their own with
/// `statement_timeout` 0 (the function cannot lift it for itself, and
/// skips rather than be cancelled under it). A no-op taking no lock once
/// they are done; at 0.1.0 there are none.
async fn rerun_conversions(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    lock_timeout_ms: i32,
) -> Result<Vec<(String, StepOutcome)>> {
    let rows = run_if_installed(
        client,
        schema,
        "loom_migrate_collations",
        MIGRATE_COLLATIONS,
        lock_timeout_ms,
    )
    .await?
    .unwrap_or_default();
    rows.iter()
        .map(|row| Ok((column(row, 0)?, StepOutcome::from_server(column(row, 1)?))))
        .collect()
}

/// Step 2, from 0.7.0: the index no loom query reads, dropped with the
/// same bounded lock wait; a catalog check once it is gone.
async fn drop_events_id_index(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    lock_timeout_ms: i32,
) -> Result<Option<StepOutcome>> {
    one_outcome(
        client,
        schema,
        "loom_drop_events_id_index",
        DROP_EVENTS_ID_INDEX,
        lock_timeout_ms,
    )
    .await
}

/// Step 2, from 0.11.0: events' metadata column, added with the same
/// bounded lock wait; a catalog check once it is there.
async fn ensure_event_metadata(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    lock_timeout_ms: i32,
) -> Result<Option<StepOutcome>> {
    one_outcome(
        client,
        schema,
        "loom_ensure_event_metadata",
        ENSURE_EVENT_METADATA,
        lock_timeout_ms,
    )
    .await
}

/// The one text a step-2 function returns, `None` where the installed
/// version has no such function.
async fn one_outcome(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    function: &str,
    template: &str,
    lock_timeout_ms: i32,
) -> Result<Option<StepOutcome>> {
    let rows = run_if_installed(client, schema, function, template, lock_timeout_ms).await?;
    match rows.as_deref() {
        Some([row]) => Ok(Some(StepOutcome::from_server(column(row, 0)?))),
        _ => Ok(None),
    }
}

/// Runs `template` (given the lock wait) in a transaction of its own with
/// `statement_timeout` 0, when the installed version has `function`;
/// `None` when it has not.
async fn run_if_installed(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    function: &str,
    template: &str,
    lock_timeout_ms: i32,
) -> Result<Option<Vec<tokio_postgres::Row>>> {
    if !schema.has(client, function).await? {
        return Ok(None);
    }
    let query = schema.sql(client, template).await?;
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
    let rows = tx
        .query_typed(&query, &[(&lock_timeout_ms, Type::INT4)])
        .await?;
    tx.commit().await?;
    Ok(Some(rows))
}

/// Step 3: zstd snapshot frames, in a transaction of their own after the
/// rest committed; queueing on the migration lock is not bounded
/// (`statement_timeout` 0: ADR 0108 D3.3), the table lock is (at most
/// 200 ms). A zstd `PgSnapshotStore` provisions them the same way at start,
/// its queueing bounded by `migration_lock_wait`.
pub(crate) async fn ensure_snapshot_frames(
    client: &mut tokio_postgres::Client,
    schema: &SchemaCell,
    lock_timeout_ms: i32,
    migration_lock_wait: Option<std::time::Duration>,
) -> Result<bool> {
    let ensure = schema.sql(client, ENSURE_SNAPSHOT_ZSTD).await?;
    let tx = client.transaction().await?;
    // The function queues for the migration lock without a bound of its
    // own, under the statement's timeout: none for a migration (it queues
    // behind its peers), `migration_lock_wait` for a store's start, which
    // the function gives up on soft (false, a WARNING) when it passes.
    let timeout = migration_lock_wait.map_or_else(
        || "0".to_owned(),
        |wait| format!("{}ms", crate::pg_connect::whole_millis(wait)),
    );
    tx.query_typed(BOUND_STATEMENT, &[(&timeout, Type::TEXT)])
        .await?;
    let provisioned: bool = tx
        .query_typed_one(&ensure, &[(&lock_timeout_ms, Type::INT4)])
        .await
        .map_err(Error::from)
        .and_then(|row| column(&row, 0))?;
    tx.commit().await?;
    Ok(provisioned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_schema::assert_resolves_nothing;

    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        for sql in [
            VERSION,
            SET_LOCK_TIMEOUT,
            LOCK_HOLDERS,
            LOOM_LOCK_HOLDERS,
            OPEN_WRITERS,
            RESTORE_LOCK_TIMEOUT,
            EXTENSION_STATEMENT,
            MIGRATE_COLLATIONS,
            DROP_EVENTS_ID_INDEX,
            ENSURE_EVENT_METADATA,
            ENSURE_SNAPSHOT_ZSTD,
            BOUND_STATEMENT,
            TARGET_VERSION,
        ] {
            assert_resolves_nothing(sql);
        }
    }

    #[test]
    fn creates_in_public_unless_told() {
        let mut options = MigrateOptions::new();
        assert_eq!(options.schema, "public");
        options.schema("Loom API");
        assert_eq!(options.schema, "Loom API");
    }
}
