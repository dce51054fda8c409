//! The client's one error type: callers match on the variant (and, for a
//! server error, on its SQLSTATE through [`Error::sqlstate`]), never on
//! message text.

use crate::spi::IncompatibleStoreError;

/// Everything a loom store can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL refused or failed a statement.
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    /// No pooled PostgreSQL connection could be had.
    #[cfg(feature = "postgres")]
    #[error("no PostgreSQL connection from the pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A connection pool could not be built.
    #[cfg(feature = "postgres")]
    #[error("cannot build the PostgreSQL pool: {0}")]
    PoolBuild(#[from] deadpool_postgres::BuildError),
    /// SQLite refused or failed a statement.
    #[cfg(feature = "sqlite")]
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
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
    /// A store whose contract version this client cannot use.
    #[error(transparent)]
    Incompatible(#[from] IncompatibleStoreError),
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
    /// A store configuration that does not parse.
    #[error(transparent)]
    Config(#[from] crate::event_store::ParseStoreConfigError),
    /// A configured backend this build was compiled without.
    #[error(
        "this build of loom-client lacks the backend the configuration names (a cargo feature)"
    )]
    BackendUnavailable,
    /// A stored frame that does not decode (corrupt, foreign, too large).
    #[error(transparent)]
    Decode(#[from] loom_core::frame::DecodeFrameError),
    /// A state that cannot be framed.
    #[error(transparent)]
    Encode(#[from] loom_core::frame::EncodeFrameError),
    /// An unknown codec name in a configuration.
    #[error(transparent)]
    Codec(#[from] loom_core::frame::ParseCodecError),
    /// A codec this build cannot write or read.
    #[error(transparent)]
    CodecUnavailable(#[from] loom_core::frame::CodecUnavailableError),
    /// Text that is not JSON where a state should be.
    #[error("snapshot state is not JSON: {0}")]
    InvalidState(#[from] loom_core::json::InvalidJsonError),
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
    Seal(#[from] crate::snapshot_store::SealError),
    /// A profiler asked to measure what it must not (ADR 0141 D3).
    #[error("{0}")]
    Profiling(&'static str),
    /// A blocking store task panicked or was cancelled.
    #[error("a store task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Error {
    /// The five-character SQLSTATE when PostgreSQL raised the error.
    #[must_use]
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => e.code().map(tokio_postgres::error::SqlState::code),
            Error::Shard { source, .. } => source.sqlstate(),
            _ => None,
        }
    }
}

/// A `Result` with loom's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
