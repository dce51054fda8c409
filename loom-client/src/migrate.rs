//! Creating or upgrading the `loom` extension the documented way (README,
//! "Upgrading"), so that a service can run it at boot.
//!
//! `ALTER EXTENSION` is one statement whose `statement_timeout` timer
//! starts before its script does, so a pool's short timeout would cancel an
//! index rebuild on every boot: a crash loop in which the migration never
//! completes (ADR 0108 D3). `migrate` therefore runs in one transaction:
//! take the migration advisory lock with no timeouts (queueing behind a
//! peer's one-time rebuild is intended), put the caller's `lock_timeout`
//! back, and run the update with `statement_timeout` 0. The conversions
//! bound their own lock waits (`lock_timeout_ms`) and fail soft with a
//! WARNING, which `migrate` returns and hands to `on_warning`.

use std::sync::{Arc, Mutex};

use futures::{future, StreamExt};
use tokio_postgres::error::Severity;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::Result;

/// The advisory lock key that serializes loom's migrations: 0x6C6F6F6D,
/// "loom" in ASCII (`pg_advisory_xact_lock(1819242349)`).
pub const MIGRATION_LOCK_KEY: i64 = 0x6C6F_6F6D;

/// Receives each WARNING a migration sends.
type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How to migrate. `Default` is [`MigrateOptions::new`].
#[derive(Clone)]
pub struct MigrateOptions {
    lock_timeout_ms: u32,
    to_version: Option<String>,
    on_warning: Option<WarningSink>,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MigrateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrateOptions")
            .field("lock_timeout_ms", &self.lock_timeout_ms)
            .field("to_version", &self.to_version)
            .field("on_warning", &self.on_warning.is_some())
            .finish()
    }
}

impl MigrateOptions {
    /// Waits at most 2000 ms for each conversion's lock, updates to the
    /// newest installed version, and only returns warnings.
    #[must_use]
    pub fn new() -> Self {
        MigrateOptions {
            lock_timeout_ms: 2000,
            to_version: None,
            on_warning: None,
        }
    }

    /// Each conversion's lock wait, in ms (`loom.migration_lock_timeout`).
    /// Default 2000.
    pub fn lock_timeout_ms(&mut self, ms: u32) -> &mut Self {
        self.lock_timeout_ms = ms;
        self
    }

    /// The version to install or update to. Default: the newest installed.
    pub fn to_version(&mut self, version: impl Into<String>) -> &mut Self {
        self.to_version = Some(version.into());
        self
    }

    /// Called with each WARNING the server sends while migrating (a
    /// conversion that failed soft, with the statements to run by hand).
    pub fn on_warning(&mut self, f: impl Fn(&str) + Send + Sync + 'static) -> &mut Self {
        self.on_warning = Some(Arc::new(f));
        self
    }
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The version before (`None`: the extension was created).
    pub from_version: Option<String>,
    /// The version after.
    pub to_version: String,
    /// The server's WARNINGs, as "SQLSTATE: message HINT: hint".
    pub warnings: Vec<String>,
}

/// Creates the `loom` extension, or updates it, in the database `config`
/// names (a libpq connection string or URL), the documented way.
///
/// ```no_run
/// # async fn boot() -> loom_client::Result<()> {
/// use loom_client::migrate::{migrate, MigrateOptions};
/// let migration = migrate("host=127.0.0.1 user=loom dbname=app", MigrateOptions::new().lock_timeout_ms(500)).await?;
/// for warning in &migration.warnings {
///     eprintln!("loom migration: {warning}");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// What the server raises; a conversion that failed soft is a warning,
/// not an error.
pub async fn migrate(config: &str, options: &MigrateOptions) -> Result<Migration> {
    let (mut client, mut connection) = tokio_postgres::connect(config, NoTls).await?;
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

    let caller_lock_timeout: String = client.query_one("SHOW lock_timeout", &[]).await?.get(0);
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
        .await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    tx.execute(
        "SELECT set_config('lock_timeout', $1, true), set_config('loom.migration_lock_timeout', $2, true)",
        &[&caller_lock_timeout, &options.lock_timeout_ms.to_string()],
    )
    .await?;
    let from_version: Option<String> = tx
        .query_opt(
            "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
            &[],
        )
        .await?
        .map(|row| row.get(0));
    let version = match &options.to_version {
        Some(v) => format!(" VERSION '{}'", v.replace('\'', "''")),
        None => String::new(),
    };
    let statement = match from_version {
        None => format!("CREATE EXTENSION loom{version}"),
        Some(_) => format!(
            "ALTER EXTENSION loom UPDATE{}",
            version.replace("VERSION", "TO")
        ),
    };
    tx.batch_execute(&statement).await?;
    let to_version: String = tx
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
            &[],
        )
        .await?
        .get(0);
    tx.commit().await?;
    drop(client);
    // The driver ends with the connection; every notice is in by then.
    let _ = future::join(driver, future::ready(())).await;
    let warnings = warnings.lock().expect("never poisoned").clone();
    Ok(Migration {
        from_version,
        to_version,
        warnings,
    })
}
