//! The client's one error type: callers match on the variant (and, for a
//! server error, on its SQLSTATE through [`Error::sqlstate`]), never on
//! message text.
//!
//! The libraries underneath (tokio-postgres, deadpool, rusqlite, tokio)
//! are carried opaquely ([`PgError`], [`PoolError`], [`DriverError`]), so
//! that a new release of one of them is not a breaking release of pgloom;
//! [`crate::interop`] reaches them where a service needs to.

use crate::contract::IncompatibleStoreError;

/// Everything a loom store can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL refused or failed a statement, or the connection failed
    /// under it.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(PgError),
    /// No pooled PostgreSQL connection could be had: the database refused
    /// or could not be reached, the pool was closed, or a timeout passed
    /// ([`PoolError::timeout`] says which; see [`Error::is_timeout`]). A
    /// failed TLS handshake is [`Error::Tls`] instead.
    #[cfg(feature = "postgres")]
    #[error("no PostgreSQL connection from the pool: {0}")]
    Pool(PoolError),
    /// A PostgreSQL connection string that does not parse, or names what
    /// loom cannot do (an unknown `sslmode`).
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    InvalidConnectionString(#[from] crate::event_store::ParseConnectionStringError),
    /// TLS to PostgreSQL could not be set up (a certificate file, a
    /// `verify-*` mode without `sslrootcert`), or the server's certificate
    /// was refused or its handshake failed.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Tls(#[from] crate::event_store::TlsError),
    /// A one-off PostgreSQL connection (a migration's) that was not open
    /// within its bound: TCP, TLS and authentication together.
    #[cfg(feature = "postgres")]
    #[error("no PostgreSQL connection within {0:?}")]
    ConnectTimeout(std::time::Duration),
    /// A connection pool could not be built.
    #[cfg(feature = "postgres")]
    #[error("cannot build the PostgreSQL pool")]
    PoolBuild(#[source] DriverError),
    /// SQLite refused or failed a statement.
    #[cfg(feature = "sqlite")]
    #[error(transparent)]
    Sqlite(DriverError),
    /// A lock wait of zero, which PostgreSQL reads as "wait forever":
    /// where loom asks for a lock wait, it means a bound.
    #[error("a lock wait must be more than zero, got {0:?}: 0 would mean \"wait forever\"")]
    InvalidLockTimeout(std::time::Duration),
    /// An operation a store does not implement (a third-party store written
    /// against an older contract, e.g. 2.0.0 without `delete_events`).
    #[error("this store does not implement {0}")]
    Unsupported(&'static str),
    /// A page size below 1.
    #[error("page size must be at least 1, got {0}")]
    InvalidPageSize(usize),
    /// An event at an (execution, sequence) that already has one: the log
    /// is append-only.
    #[error("execution {execution_id:?} already has an event at sequence {sequence}")]
    DuplicateEvent {
        /// The execution.
        execution_id: String,
        /// The sequence.
        sequence: i64,
    },
    /// A payload no loom store accepts, refused the same way by every
    /// first-party store before anything of the batch is written: a
    /// string holding U+0000 (`\u0000`) or an escaped lone surrogate.
    /// PostgreSQL's jsonb cannot hold either, so a store that took them
    /// (memory, SQLite) would hold an execution that could never move to
    /// Postgres ([`crate::event_store::Payload::unsupported`]). The same
    /// for an event's metadata (`field` says which).
    #[error("the {field} of {execution_id:?} at sequence {sequence} holds {reason}, which PostgreSQL's jsonb cannot hold and no loom store accepts; nothing was written")]
    UnsupportedPayload {
        /// The execution.
        execution_id: String,
        /// The sequence.
        sequence: i64,
        /// `"payload"` or `"metadata"`.
        field: &'static str,
        /// What it holds, e.g. "a string with U+0000 (\\u0000)".
        reason: &'static str,
    },
    /// A stored payload or metadata that is not JSON text (a SQLite row
    /// another tool wrote): reported, never a panic.
    #[error("the stored {field} of {execution_id:?} at sequence {sequence} is not JSON: {source}")]
    InvalidPayload {
        /// The execution.
        execution_id: String,
        /// The sequence.
        sequence: i64,
        /// `"payload"` or `"metadata"`.
        field: &'static str,
        /// Where the text stops being JSON.
        source: pgloom_core::json::InvalidJsonError,
    },
    /// A row PostgreSQL returned that loom cannot read: a column missing,
    /// NULL or of another type than loom's schema declares (a changed
    /// function, a foreign object on the search_path). Never a panic.
    #[cfg(feature = "postgres")]
    #[error("cannot read column {column} of a row PostgreSQL returned: {source}")]
    UnreadableRow {
        /// The column (0-based).
        column: usize,
        /// What the driver said.
        source: PgError,
    },
    /// A store whose contract version this client cannot use.
    #[error(transparent)]
    Incompatible(#[from] IncompatibleStoreError),
    /// A resume that found a newer snapshot saved between its snapshot read
    /// and its tail read every time it tried
    /// ([`crate::resume::RESUME_ATTEMPTS`]): another worker is writing the
    /// execution right now. Transient.
    #[error("resuming {execution_id:?}: a newer snapshot was saved during each of {attempts} attempts; another worker is writing it")]
    ResumeContended {
        /// The execution.
        execution_id: String,
        /// How many times it read.
        attempts: u32,
    },
    /// A save over a snapshot that deltas were written against
    /// ([`crate::snapshot_store::Codec::Delta`]), with another state: the
    /// deltas would no longer decode. Nothing was written. Saving the same
    /// state again is allowed; deleting the execution's snapshots first
    /// (oldest first, each keyframe after its deltas) frees the sequence.
    /// From PostgreSQL, the SQLSTATE `55006` of `loom_store_snapshot`.
    #[error("snapshot {sequence} of execution {execution_id:?} is the keyframe of delta snapshots: saving another state over it would leave them undecodable; nothing was written")]
    KeyframeInUse {
        /// The execution.
        execution_id: String,
        /// The keyframe's sequence.
        sequence: i64,
    },
    /// A write, renewal or completion under a fencing token that is no
    /// longer the execution's newest: another worker claimed it since
    /// ([`crate::claims`]). Nothing was written; stop working on the
    /// execution. From PostgreSQL, the SQLSTATE `LM001`.
    #[error("execution {execution_id:?} was claimed by another worker since fencing token {fence}: nothing was written")]
    FencedOut {
        /// The execution.
        execution_id: String,
        /// The stale token.
        fence: i64,
    },
    /// An event store and a snapshot store paired for one job (a
    /// [`crate::resume::resume`]) that name executions differently: one is
    /// a tenant's view and the other is not, or is another tenant's. Their
    /// reads would join one execution's events to another's snapshot.
    #[error("the event store ({events}) and the snapshot store ({snapshots}) name executions differently; give both the same tenant view")]
    ScopeMismatch {
        /// The event store's scope.
        events: crate::id_scope::IdScope,
        /// The snapshot store's scope.
        snapshots: crate::id_scope::IdScope,
    },
    /// An execution id a tenant view cannot hold.
    #[error(transparent)]
    InvalidTenant(#[from] crate::event_store::InvalidTenantIdError),
    /// One shard of a sharded store failed: the whole page fails, never
    /// silently partial.
    #[error("shard {shard} of {shards} failed: {source}")]
    Shard {
        /// Which shard (0-based).
        shard: usize,
        /// How many there are.
        shards: usize,
        /// What it failed with.
        source: Box<Error>,
    },
    /// A batch for a sharded store whose events live on more than one
    /// shard: shards commit independently, so no such batch can be all or
    /// none. Nothing was written. Append per execution, or use
    /// [`crate::event_store::ShardedEventStore::append_per_shard`], which
    /// reports each shard's outcome.
    #[error("a batch spans shards {shards:?} of a sharded store, which cannot commit it all or none; nothing was written: append per execution, or use append_per_shard")]
    BatchSpansShards {
        /// The shards the batch's events live on.
        shards: Vec<usize>,
    },
    /// A store for a Citus coordinator ([`crate::event_store::StoreConfig::Citus`],
    /// [`crate::event_store::PgEventStore::connect_citus`]) whose database
    /// does not have loom's tables distributed: it would work on the
    /// coordinator alone.
    #[error("loom's tables are not distributed in this database: on the Citus coordinator, run SET statement_timeout = 0; SELECT * FROM <loom's schema>.loom_distribute(NULL::integer, NULL::integer); (loom 0.5.0 or later)")]
    NotDistributed,
    /// The `loom` extension is not installed in the database, or its
    /// installed version predates `function`: the catalog said so before
    /// anything was called, so a function of that name someone else
    /// created in loom's schema is never called in its place (issue 25).
    /// Run [`crate::migrate::migrate`] (`loom migrate`).
    #[error("this database's loom extension has no {function} (not installed, or an older version): run migrate() or `loom migrate`")]
    ExtensionMissing {
        /// The loom function the call needed.
        function: String,
    },
    /// The installed `loom` extension works with this client but predates
    /// what a call asked for: an event with metadata needs 0.11.0. Nothing
    /// was written. Run [`crate::migrate::migrate`] (`loom migrate`).
    #[error("{feature} needs loom {needs} or later, and this database's loom extension is {installed}: nothing was written; run migrate() or `loom migrate`")]
    ExtensionTooOld {
        /// What the call asked for.
        feature: &'static str,
        /// The first extension version that has it.
        needs: &'static str,
        /// The installed version.
        installed: String,
    },
    /// The installed `loom` extension is a version this client does not
    /// work with ([`crate::compat`]): found at a store's first call,
    /// [`crate::compat::check_server`], or the end of a migration.
    #[error("this database's loom extension is version {installed:?}, which pgloom {client} does not work with (it needs {oldest} or later, before {before}): use a pgloom that supports it (docs/client.md#versions), or migrate the extension", oldest = crate::compat::OLDEST_EXTENSION, before = crate::compat::FIRST_UNSUPPORTED_EXTENSION)]
    IncompatibleExtension {
        /// The installed version.
        installed: String,
        /// This client's version.
        client: &'static str,
    },
    /// [`crate::migrate::migrate`] was asked for one flavour of loom and
    /// the database has the other: the native extension where
    /// [`crate::migrate::MigrateOptions::sql_only`] asked for the SQL-only
    /// flavour, or the SQL-only flavour where the extension was asked for.
    /// Nothing changed. A SQL-only database moves to the extension as
    /// docs/flavours.md says, never by a migration that would leave it
    /// half of each.
    #[cfg(feature = "postgres")]
    #[error("this database has loom's {installed} flavour, and the migration asked for the {asked} flavour: nothing changed (docs/flavours.md says how a database moves between them)")]
    WrongFlavour {
        /// What the database has.
        installed: crate::migrate::Flavour,
        /// What the migration asked for.
        asked: crate::migrate::Flavour,
    },
    /// The database has loom's SQL-only flavour, whose functions belong to
    /// the database's owner, `owner`, and this session may do what `owner`
    /// may not: its role is, or is a member of, a superuser, a role with
    /// CREATEROLE, BYPASSRLS or REPLICATION, or a predefined `pg_*` role;
    /// or it runs as another role than it logged in as (`SET ROLE`, or a
    /// `role` setting on the database). Calling them would run the
    /// owner's code with those rights. Nothing was called. Connect as
    /// `owner`, or as a role with none of those (docs/flavours.md).
    #[cfg(feature = "postgres")]
    #[error("this database's loom is the SQL-only flavour, whose functions are {owner}'s, and this session may do more than {owner} (a superuser, a member of a privileged or predefined role, or a role set after login): it would run {owner}'s code with those rights, so nothing was called; connect as {owner} (docs/flavours.md)")]
    SqlOnlyOwnedByAnother {
        /// The database's owner, who owns loom's objects there.
        owner: String,
    },
    /// A migration waited its whole bound
    /// ([`crate::migrate::MigrateOptions::migration_lock_wait`]) for loom's
    /// migration lock, which only loom's owner and superusers can hold,
    /// and gave up. Nothing changed. `holders` names each session holding
    /// it (pid, role, application, state, since when): a peer's long
    /// migration, or a session left open.
    #[cfg(feature = "postgres")]
    #[error("gave up waiting for loom's migration lock ({lock}) after {waited_ms} ms, held by {holders}: nothing changed; if the holder is not a loom migration, end it (SELECT pg_terminate_backend(pid))")]
    MigrationLockTimeout {
        /// The lock waited for: a `LOCK TABLE` target.
        lock: String,
        /// How long it waited.
        waited_ms: u64,
        /// Who held it when the wait ended.
        holders: String,
    },
    /// [`crate::move_to_extension::move_to_extension`] found no SQL-only
    /// flavour to move: none, one not owned by the database's owner, or
    /// one whose tables are not plain tables. Nothing changed.
    #[cfg(feature = "postgres")]
    #[error("this database has no SQL-only loom owned by its owner to move to the extension: nothing changed")]
    NotSqlOnly,
    /// [`crate::event_store::PgNotifications::listen`]'s connection took
    /// its `LISTEN`, but a notification sent to it from another connection
    /// did not arrive: it is not the server's own session (a
    /// transaction-mode pooler in front), so it would never wake a
    /// watcher.
    #[cfg(feature = "postgres")]
    #[error("a notification sent to the LISTEN connection did not arrive within {0:?}: a transaction-mode pooler carries no LISTEN; give PgNotifications::listen a direct connection to the server (docs/client.md#poolers)")]
    NotificationsNotDelivered(std::time::Duration),
    /// A move to the extension found a column of a SQL-only table with
    /// another type or collation than the extension's (or one the
    /// extension lacks, or a generated one): copying it would need a cast
    /// of the owner's. Nothing changed.
    #[cfg(feature = "postgres")]
    #[error("{table} has columns {columns:?} of another type, collation or kind than the extension's: nothing changed; alter them back (or drop the extra ones) as the owner, then move")]
    ForeignColumns {
        /// The table.
        table: String,
        /// Its columns that differ.
        columns: Vec<String>,
    },
    /// A store configuration that does not parse.
    #[error(transparent)]
    Config(#[from] crate::event_store::ParseStoreConfigError),
    /// A configured backend this build was compiled without.
    #[error("this build of pgloom lacks the backend the configuration names (a cargo feature)")]
    BackendUnavailable,
    /// A stored frame that does not decode (corrupt, foreign, too large).
    #[error(transparent)]
    Decode(#[from] pgloom_core::frame::DecodeFrameError),
    /// A state that cannot be framed.
    #[error(transparent)]
    Encode(#[from] pgloom_core::frame::EncodeFrameError),
    /// An unknown codec name in a configuration.
    #[error(transparent)]
    Codec(#[from] pgloom_core::frame::ParseCodecError),
    /// A codec this build cannot write or read.
    #[error(transparent)]
    CodecUnavailable(#[from] pgloom_core::frame::CodecUnavailableError),
    /// Text that is not JSON where JSON was needed (an event's payload, a
    /// snapshot's state: `Payload::new`, `JsonText::new`), with where it
    /// stops being JSON.
    #[error("not JSON text: {0}")]
    InvalidJson(#[from] pgloom_core::json::InvalidJsonError),
    /// A snapshot row holding the frame sentinel but no frame: corruption,
    /// never a state (ADR 0141 D5).
    #[error("snapshot {id} of {execution_id:?} holds the frame sentinel but no frame")]
    SentinelWithoutFrame {
        /// The row id.
        id: i64,
        /// The execution.
        execution_id: String,
    },
    /// A sealed snapshot that cannot be opened.
    #[error(transparent)]
    #[cfg(feature = "encryption")]
    Seal(#[from] crate::snapshot_store::SealError),
    /// A profiler asked to measure what it must not (ADR 0141 D3).
    #[error("{0}")]
    Profiling(&'static str),
    /// A blocking store task panicked or was cancelled.
    #[error("a store task did not finish")]
    Task(#[source] DriverError),
}

/// Whether a tokio-postgres error may succeed on a retry: by its SQLSTATE;
/// without one, when the connection closed or its I/O failed under the
/// call (a refused or reset connection), not a value that did not convert
/// nor a server that refused TLS or a password, which would fail again.
#[cfg(feature = "postgres")]
fn transient_postgres(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => transient_sqlstate(code.code()),
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
    }
}

/// Whether a SQLSTATE names a passing condition ([`Error::is_transient`]).
#[cfg(feature = "postgres")]
fn transient_sqlstate(code: &str) -> bool {
    // Of class 53, not a full disk (53100) or a configured limit (53400):
    // a retry hits them again until someone acts.
    code.starts_with("08")
        || matches!(
            code,
            "40001"
                | "40P01"
                | "53000"
                | "53200"
                | "53300"
                | "55P03"
                | "57014"
                | "57P01"
                | "57P02"
                | "57P03"
        )
}

impl Error {
    /// Whether a bound on waiting passed: a pool's wait, create or recycle
    /// timeout, or a one-off connection's ([`Error::ConnectTimeout`]). A
    /// pool whose connections all stayed in use is an [`Error::Pool`]
    /// whose [`PoolError::timeout`] is [`PoolTimeout::Wait`]:
    ///
    /// ```no_run
    /// # async fn page(store: &pgloom::event_store::PgEventStore) {
    /// use pgloom::error::PoolTimeout;
    /// use pgloom::event_store::EventStore;
    /// use pgloom::Error;
    /// match store.list_executions_page(None, 100).await {
    ///     Err(Error::Pool(e)) if e.timeout() == Some(PoolTimeout::Wait) => { /* saturated: shed load */ }
    ///     Err(e) if e.is_timeout() => { /* the database is slow or unreachable */ }
    ///     _ => {}
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Error::Pool(e) => e.timeout().is_some(),
            #[cfg(feature = "postgres")]
            Error::ConnectTimeout(_) => true,
            Error::Shard { source, .. } => source.is_timeout(),
            _ => false,
        }
    }

    /// Whether an append found its (execution, sequence) taken:
    /// [`Error::DuplicateEvent`], or the server's own 23505 where the
    /// duplicate could not be named (an append in the caller's transaction,
    /// which the 23505 aborted, by a role that may not read `loom.events`).
    ///
    /// ```
    /// let e = pgloom::Error::DuplicateEvent { execution_id: "run-1".into(), sequence: 3 };
    /// assert!(e.is_duplicate());
    /// ```
    #[must_use]
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Error::DuplicateEvent { .. }) || self.sqlstate() == Some("23505")
    }

    /// Whether the same call may succeed if made again: the server or the
    /// way to it failed for a while, not the call. True for a connection
    /// lost or refused, a pool or connect timeout, and the SQLSTATEs of
    /// passing conditions: class 08 (connection), 40001 and 40P01
    /// (serialization, deadlock), 53xxx (out of resources, too many
    /// connections), 55P03 (lock not available in time), 57014 (statement
    /// timeout or cancel), 57P01-57P03 (shutdown, cannot connect now), and
    /// of class 53 out of memory and too many connections (not a full disk,
    /// 53100, nor a configured limit, 53400). Bound the retries: a
    /// statement that always outlasts its timeout is 57014 every time. In a
    /// caller's transaction nothing can be retried but the transaction: the
    /// error aborted it.
    ///
    /// A retried append must be one that tolerates its own first try
    /// having committed: an append whose reply was lost may be in the log.
    ///
    /// ```
    /// let e = pgloom::Error::InvalidPageSize(0);
    /// assert!(!e.is_transient());
    /// ```
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => transient_postgres(&e.0),
            #[cfg(feature = "postgres")]
            Error::Pool(e) => match &e.kind {
                PoolErrorKind::Backend(e) => transient_postgres(&e.0),
                PoolErrorKind::Timeout(_) => true,
                // Not a closed pool: it never opens again.
                PoolErrorKind::Closed | PoolErrorKind::Other(_) => false,
            },
            // A handshake cut off (a server restarting, a failover); not
            // one the server refused.
            #[cfg(feature = "postgres")]
            Error::Tls(e) => e.is_transient(),
            #[cfg(feature = "postgres")]
            Error::ConnectTimeout(_) => true,
            #[cfg(feature = "sqlite")]
            Error::Sqlite(e) => matches!(
                e.0.downcast_ref::<rusqlite::Error>(),
                Some(rusqlite::Error::SqliteFailure(e, _))
                    if matches!(
                        e.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    )
            ),
            Error::Shard { source, .. } => source.is_transient(),
            Error::ResumeContended { .. } => true,
            _ => false,
        }
    }

    /// Whether the failed call may have committed all the same: its
    /// statement may have reached the server and run, and only the reply
    /// was lost (the connection closed or its I/O failed under the call).
    /// False where nothing was sent (no connection from the pool, a
    /// refused connection, a bad argument) or the server answered with an
    /// error (a SQLSTATE: the statement's transaction did not commit).
    ///
    /// With [`Error::is_transient`] it says how to retry: transient and
    /// not this, retry the call; transient and this, retry only what
    /// tolerates its own first try having committed
    /// ([`crate::event_store::EventStore::append_idempotent`], a read);
    /// not transient, do not retry. A closed connection is reported as
    /// possibly committed even when it closed before the call was sent:
    /// the driver cannot tell which, and the safe reading is the careful
    /// one.
    ///
    /// ```no_run
    /// # async fn f(store: &pgloom::event_store::PgEventStore, events: &[pgloom::event_store::Event]) -> pgloom::Result<()> {
    /// use pgloom::event_store::EventStore;
    /// match store.append(events).await {
    ///     Err(e) if e.is_transient() && e.may_have_committed() => {
    ///         store.append_idempotent(events).await?; // lands once, or finds it landed
    ///     }
    ///     Err(e) if e.is_transient() => store.append(events).await?,
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn may_have_committed(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(PgError(e)) => {
                e.code().is_none()
                    && (e.is_closed()
                        || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()))
            }
            Error::Shard { source, .. } => source.may_have_committed(),
            _ => false,
        }
    }

    /// The variant's name (`"DuplicateEvent"`, `"Postgres"`...): a class
    /// of error that carries none of its data, for OpenTelemetry's
    /// `error.type` when no SQLSTATE says more.
    #[must_use]
    pub fn variant_name(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(_) => "Postgres",
            #[cfg(feature = "postgres")]
            Error::Pool(_) => "Pool",
            #[cfg(feature = "postgres")]
            Error::InvalidConnectionString(_) => "InvalidConnectionString",
            #[cfg(feature = "postgres")]
            Error::Tls(_) => "Tls",
            #[cfg(feature = "postgres")]
            Error::ConnectTimeout(_) => "ConnectTimeout",
            #[cfg(feature = "postgres")]
            Error::PoolBuild(_) => "PoolBuild",
            #[cfg(feature = "sqlite")]
            Error::Sqlite(_) => "Sqlite",
            Error::InvalidLockTimeout(_) => "InvalidLockTimeout",
            Error::Unsupported(_) => "Unsupported",
            Error::InvalidPageSize(_) => "InvalidPageSize",
            Error::DuplicateEvent { .. } => "DuplicateEvent",
            Error::UnsupportedPayload { .. } => "UnsupportedPayload",
            Error::InvalidPayload { .. } => "InvalidPayload",
            #[cfg(feature = "postgres")]
            Error::UnreadableRow { .. } => "UnreadableRow",
            Error::Incompatible(_) => "Incompatible",
            Error::ScopeMismatch { .. } => "ScopeMismatch",
            Error::ResumeContended { .. } => "ResumeContended",
            Error::KeyframeInUse { .. } => "KeyframeInUse",
            Error::FencedOut { .. } => "FencedOut",
            Error::InvalidTenant(_) => "InvalidTenant",
            Error::Shard { .. } => "Shard",
            Error::BatchSpansShards { .. } => "BatchSpansShards",
            Error::NotDistributed => "NotDistributed",
            Error::ExtensionMissing { .. } => "ExtensionMissing",
            Error::IncompatibleExtension { .. } => "IncompatibleExtension",
            Error::ExtensionTooOld { .. } => "ExtensionTooOld",
            #[cfg(feature = "postgres")]
            Error::WrongFlavour { .. } => "WrongFlavour",
            #[cfg(feature = "postgres")]
            Error::SqlOnlyOwnedByAnother { .. } => "SqlOnlyOwnedByAnother",
            #[cfg(feature = "postgres")]
            Error::MigrationLockTimeout { .. } => "MigrationLockTimeout",
            #[cfg(feature = "postgres")]
            Error::NotSqlOnly => "NotSqlOnly",
            #[cfg(feature = "postgres")]
            Error::NotificationsNotDelivered(_) => "NotificationsNotDelivered",
            #[cfg(feature = "postgres")]
            Error::ForeignColumns { .. } => "ForeignColumns",
            Error::Config(_) => "Config",
            Error::BackendUnavailable => "BackendUnavailable",
            Error::Decode(_) => "Decode",
            Error::Encode(_) => "Encode",
            Error::Codec(_) => "Codec",
            Error::CodecUnavailable(_) => "CodecUnavailable",
            Error::InvalidJson(_) => "InvalidJson",
            Error::SentinelWithoutFrame { .. } => "SentinelWithoutFrame",
            #[cfg(feature = "encryption")]
            Error::Seal(_) => "Seal",
            Error::Profiling(_) => "Profiling",
            Error::Task(_) => "Task",
        }
    }

    /// The five-character SQLSTATE when PostgreSQL raised the error (and
    /// `55006` for [`Error::KeyframeInUse`] from any store and `LM001` for
    /// [`Error::FencedOut`], as loom's SQL raises them).
    #[must_use]
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(e) | Error::UnreadableRow { source: e, .. } => e.sqlstate(),
            // A server that refused a new pooled connection (pg_hba, auth).
            #[cfg(feature = "postgres")]
            Error::Pool(e) => e.postgres().and_then(PgError::sqlstate),
            Error::Shard { source, .. } => source.sqlstate(),
            // What loom's SQL raises for the same refusal, from any store.
            Error::KeyframeInUse { .. } => Some("55006"),
            Error::FencedOut { .. } => Some("LM001"),
            _ => None,
        }
    }
}

/// What PostgreSQL (or the connection to it) said, as loom carries it:
/// its SQLSTATE and the server's fields, its message as `Display`, and
/// the driver's error behind it for [`crate::interop`]. Its methods, not
/// the driver's type, are the stable face.
#[cfg(feature = "postgres")]
pub struct PgError(pub(crate) tokio_postgres::Error);

#[cfg(feature = "postgres")]
impl PgError {
    /// The five-character SQLSTATE when the server raised it; `None` for
    /// a connection that failed or closed, or a value that did not
    /// convert.
    #[must_use]
    pub fn sqlstate(&self) -> Option<&str> {
        self.0.code().map(tokio_postgres::error::SqlState::code)
    }

    /// The server's primary message, when the server raised it.
    #[must_use]
    pub fn message(&self) -> Option<&str> {
        self.0
            .as_db_error()
            .map(tokio_postgres::error::DbError::message)
    }

    /// The server's DETAIL, when it sent one.
    #[must_use]
    pub fn detail(&self) -> Option<&str> {
        self.0
            .as_db_error()
            .and_then(tokio_postgres::error::DbError::detail)
    }

    /// The server's HINT, when it sent one.
    #[must_use]
    pub fn hint(&self) -> Option<&str> {
        self.0
            .as_db_error()
            .and_then(tokio_postgres::error::DbError::hint)
    }

    /// The constraint the server named (a unique index, a check).
    #[must_use]
    pub fn constraint(&self) -> Option<&str> {
        self.0
            .as_db_error()
            .and_then(tokio_postgres::error::DbError::constraint)
    }

    /// Whether the connection was closed under the call.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PgError {
    /// What `Display` says, never the driver's whole error: its DETAIL can
    /// quote a row's payload, and `unwrap()` or `?e` in a log prints this.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PgError").field(&self.to_string()).finish()
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Display for PgError {
    /// One line: the server's severity, SQLSTATE and message, and its
    /// HINT (loom's hints say what to run). Never its DETAIL, which can
    /// quote a row's values (a check's "Failing row contains ..."), a
    /// payload among them: [`PgError::detail`] has it for a caller that
    /// wants it. A connection's failure is tokio-postgres's words, its
    /// cause behind [`std::error::Error::source`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => {
                write!(
                    f,
                    "{} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                )?;
                match db.hint() {
                    Some(hint) => write!(f, " (HINT: {hint})"),
                    None => Ok(()),
                }
            }
            None => std::fmt::Display::fmt(&self.0, f),
        }
    }
}

#[cfg(feature = "postgres")]
impl std::error::Error for PgError {
    /// The connection's cause (an I/O error) for a failed connection;
    /// nothing for the server's error, which `Display` already says.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.0.as_db_error() {
            Some(_) => None,
            None => std::error::Error::source(&self.0),
        }
    }
}

/// Which of a pool's bounds passed ([`PoolError::timeout`]).
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolTimeout {
    /// Every connection stayed in use for the pool's wait timeout: the
    /// pool is saturated.
    Wait,
    /// Opening a connection took longer than the create timeout.
    Create,
    /// Checking a returning connection took longer than the recycle
    /// timeout.
    Recycle,
}

/// Why no pooled connection could be had ([`Error::Pool`]).
#[cfg(feature = "postgres")]
pub struct PoolError {
    pub(crate) kind: PoolErrorKind,
}

#[cfg(feature = "postgres")]
pub(crate) enum PoolErrorKind {
    Timeout(PoolTimeout),
    Backend(PgError),
    Closed,
    Other(DriverError),
}

#[cfg(feature = "postgres")]
impl PoolError {
    /// The bound that passed, for a timeout.
    #[must_use]
    pub fn timeout(&self) -> Option<PoolTimeout> {
        match self.kind {
            PoolErrorKind::Timeout(which) => Some(which),
            _ => None,
        }
    }

    /// What the server or the connection said, when opening a connection
    /// failed there (pg_hba, a password, a refused connection).
    #[must_use]
    pub fn postgres(&self) -> Option<&PgError> {
        match &self.kind {
            PoolErrorKind::Backend(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the pool was closed ([`crate::PgPool::close`]).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        matches!(self.kind, PoolErrorKind::Closed)
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            PoolErrorKind::Timeout(which) => f.debug_tuple("Timeout").field(which).finish(),
            PoolErrorKind::Backend(e) => f.debug_tuple("Backend").field(e).finish(),
            PoolErrorKind::Closed => f.write_str("Closed"),
            PoolErrorKind::Other(e) => f.debug_tuple("Other").field(e).finish(),
        }
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            PoolErrorKind::Timeout(PoolTimeout::Wait) => {
                f.write_str("timed out waiting for a connection (every one in use)")
            }
            PoolErrorKind::Timeout(PoolTimeout::Create) => {
                f.write_str("timed out opening a connection")
            }
            PoolErrorKind::Timeout(PoolTimeout::Recycle) => {
                f.write_str("timed out checking a returning connection")
            }
            PoolErrorKind::Backend(e) => match std::error::Error::source(e) {
                // "error connecting to server" alone hides why.
                Some(cause) if e.sqlstate().is_none() => write!(f, "{e}: {cause}"),
                _ => write!(f, "{e}"),
            },
            PoolErrorKind::Closed => f.write_str("the pool is closed"),
            PoolErrorKind::Other(e) => write!(f, "{e}"),
        }
    }
}

#[cfg(feature = "postgres")]
impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            PoolErrorKind::Backend(e) => Some(e),
            PoolErrorKind::Other(e) => Some(e),
            _ => None,
        }
    }
}

/// An error of a library loom runs on (SQLite, the pool's builder, the
/// runtime a blocking store's task ran on), carried opaquely: its message
/// as `Display`, the library's own error as its source (which
/// [`std::error::Error::source`] and a downcast reach, at the version
/// [`crate::interop`] names).
pub struct DriverError(pub(crate) Box<dyn std::error::Error + Send + Sync>);

impl DriverError {
    pub(crate) fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DriverError(Box::new(e))
    }
}

impl std::fmt::Debug for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for DriverError {
    /// The library's error's own cause: its message is this one's
    /// `Display`, so that a chain printer says it once.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl DriverError {
    /// The library's own error, to downcast at the version
    /// [`crate::interop`] names.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use pgloom::event_store::{EventStore, SqliteEventStore};
    /// # let dir = std::env::temp_dir().join(format!("pgloom-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// // A directory is not a database file.
    /// if let Err(pgloom::Error::Sqlite(e)) = SqliteEventStore::open(&dir) {
    ///     assert!(e.get_ref().is::<rusqlite::Error>());
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

// The conversions `?` makes inside loom and in a service's own code on
// loom's connections (crate::interop): each names a library's error at
// the version loom builds with.

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for Error {
    /// [`Error::Postgres`].
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Postgres(PgError(e))
    }
}

#[cfg(feature = "postgres")]
impl From<deadpool_postgres::PoolError> for Error {
    /// [`Error::Tls`] when a new connection's TLS handshake failed, else
    /// [`Error::Pool`].
    fn from(e: deadpool_postgres::PoolError) -> Self {
        crate::pg_connect::from_pool(e)
    }
}

#[cfg(feature = "postgres")]
impl From<deadpool_postgres::BuildError> for Error {
    /// [`Error::PoolBuild`].
    fn from(e: deadpool_postgres::BuildError) -> Self {
        Error::PoolBuild(DriverError::new(e))
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for Error {
    /// [`Error::Sqlite`].
    fn from(e: rusqlite::Error) -> Self {
        Error::Sqlite(DriverError::new(e))
    }
}

impl From<tokio::task::JoinError> for Error {
    /// [`Error::Task`].
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Task(DriverError::new(e))
    }
}

/// A `Result` with loom's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::transient_sqlstate;

    #[test]
    fn passing_conditions_are_transient_and_refusals_are_not() {
        for code in [
            "08006", "08001", "40001", "40P01", "53300", "55P03", "57014", "57P01",
        ] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in [
            "23505", "42501", "42883", "22023", "0A000", "P0001", "XX000", "53100", "53400",
        ] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }
}

#[cfg(test)]
mod chain_tests {
    use super::Error;

    /// Each message of `e`'s chain, top first.
    fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        std::iter::successors(Some(e), |e| e.source())
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_failed_task_says_what_failed_then_why_each_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let joined = rt
            .block_on(async {
                fn panics() {
                    std::panic::panic_any("the store's thread")
                }
                tokio::task::spawn_blocking(panics).await
            })
            .unwrap_err();
        let e = Error::from(joined);
        let chain = chain(&e);
        assert_eq!(chain.len(), 2, "{chain:?}");
        assert_eq!(chain[0], "a store task did not finish");
        assert!(chain[1].contains("panicked"), "{chain:?}");
        let Error::Task(driver) = &e else {
            panic!("{e:?}")
        };
        assert!(driver.get_ref().is::<tokio::task::JoinError>());
    }
}
