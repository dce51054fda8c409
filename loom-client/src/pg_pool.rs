//! The pool of PostgreSQL connections loom's stores share: how it is made
//! ([`PgPoolOptions`]) and what it is ([`PgPool`]).
//!
//! The pool is loom's own type, over deadpool-postgres, so that a release
//! of deadpool or tokio-postgres is not a breaking release of pgloom. A
//! service that already has a deadpool pool hands it over through
//! [`crate::interop`].

use std::time::Duration;

use crate::pg_connect::DEFAULT_TIMEOUT;
use crate::pg_executor::Conn;
use crate::Result;

/// How a pool of PostgreSQL connections behaves: its size and how long its
/// callers wait. A non-consuming builder; `Default` is [`PgPoolOptions::new`].
///
/// ```
/// use std::time::Duration;
/// use pgloom::PgPoolOptions;
/// let mut options = PgPoolOptions::new();
/// options.max_size(16).wait_timeout(Duration::from_millis(500));
/// // No bound on recycling checks (RecyclingMethod::Fast does no I/O).
/// options.recycle_timeout(None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgPoolOptions {
    pub(crate) max_size: usize,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) create_timeout: Option<Duration>,
    pub(crate) recycle_timeout: Option<Duration>,
    pub(crate) statement_timeout: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_lifetime: Option<Duration>,
    pub(crate) test_on_checkout: bool,
    pub(crate) cache_statements: bool,
    /// Every transaction read-only (`default_transaction_read_only`): the
    /// `loom` command's reads; not offered to users, whose read-only
    /// roles say it on the server.
    pub(crate) read_only: bool,
}

/// How long a pooled connection may go unused before the pool closes it
/// rather than hand it out: under the idle limits of the NAT gateways and
/// load balancers between a service and a cloud database (AWS NAT's 350 s,
/// Azure's 4 min), which drop an idle connection without a word.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a pooled connection lives at most: a server's failover or a
/// pooler's rebalancing reaches every connection within it.
const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

impl Default for PgPoolOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PgPoolOptions {
    /// 4 connections; 5 s for each timeout (wait, create, recycle), so that
    /// a down or saturated database is an error a request can report, not
    /// a request that hangs; connections closed after 3 min unused or
    /// 30 min in all; no round trip to check a connection at checkout.
    #[must_use]
    pub fn new() -> Self {
        PgPoolOptions {
            max_size: 4,
            wait_timeout: Some(DEFAULT_TIMEOUT),
            create_timeout: Some(DEFAULT_TIMEOUT),
            recycle_timeout: Some(DEFAULT_TIMEOUT),
            statement_timeout: None,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            max_lifetime: Some(DEFAULT_MAX_LIFETIME),
            test_on_checkout: false,
            cache_statements: false,
            read_only: false,
        }
    }

    /// How long a connection may go unused (since the pool last handed it
    /// out) before the pool closes it instead of handing it out again; a
    /// new one is opened in its place. `None` keeps idle connections for
    /// ever. Default 3 min: an agent that thinks for minutes between two
    /// calls would otherwise get a connection a NAT gateway or load
    /// balancer has silently dropped, and its call would fail.
    pub fn idle_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.idle_timeout = timeout.into();
        self
    }

    /// How long a connection lives at most: past it, the pool closes it
    /// at its next checkout and opens another. `None`: for ever. Default
    /// 30 min, so that a failover, a DNS change or a pooler's rebalancing
    /// reaches every connection within it.
    pub fn max_lifetime(&mut self, lifetime: impl Into<Option<Duration>>) -> &mut Self {
        self.max_lifetime = lifetime.into();
        self
    }

    /// Whether each checkout first checks the connection with an empty
    /// query (a round trip, bounded by the recycle timeout), and opens
    /// another when it fails. Default false: a connection whose socket
    /// the server or a pooler closed is already known to be closed and is
    /// replaced without a round trip; turn it on where connections die
    /// silently and a failed first call costs more than a round trip.
    /// Either way nothing is left on the server connection: it works
    /// behind a transaction-mode pooler.
    pub fn test_on_checkout(&mut self, test: bool) -> &mut Self {
        self.test_on_checkout = test;
        self
    }

    /// Whether each connection prepares a statement once, by name, and
    /// caches it (deadpool's statement cache), so that later calls skip
    /// the server's parse. Default false: a named statement lives on one
    /// server connection, and a transaction-mode pooler (PgBouncer,
    /// Supavisor, RDS Proxy) hands that connection to another client
    /// between two transactions, where it collides (42P05) or is gone
    /// (26000). Turn it on only for a direct connection or a session-mode
    /// pooler (docs/client.md#poolers has what it saves).
    pub fn cache_statements(&mut self, cache: bool) -> &mut Self {
        self.cache_statements = cache;
        self
    }

    /// The most connections the pool opens (at least 1: a pool of 0 only
    /// ever times out). Default 4.
    pub fn max_size(&mut self, max_size: usize) -> &mut Self {
        self.max_size = max_size;
        self
    }

    /// How long `get` waits for a connection when all are in use; `None`
    /// waits for ever. Past it, `get` fails with
    /// an error for which [`crate::Error::is_timeout`] is true. Default
    /// 5 s.
    pub fn wait_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.wait_timeout = timeout.into();
        self
    }

    /// How long opening a connection may take, TCP, TLS and authentication
    /// together; also each TCP connect's bound (`connect_timeout`) unless
    /// the connection string sets its own. `None` waits for ever. Default
    /// 5 s.
    pub fn create_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.create_timeout = timeout.into();
        self
    }

    /// How long the check of a returning connection may take before the
    /// connection is dropped and another is used; `None` waits for ever.
    /// Default 5 s.
    pub fn recycle_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.recycle_timeout = timeout.into();
        self
    }

    /// PostgreSQL's `statement_timeout` on every connection of the pool:
    /// a statement running longer is cancelled (57014, which
    /// [`crate::Error::is_transient`] says may succeed again). Sent as a
    /// startup option (libpq's `options=-c statement_timeout=…`), rounded
    /// up to whole milliseconds, at least 1. Default: none, the server's
    /// setting. A pooler that refuses startup options (PgBouncer without
    /// `ignore_startup_parameters = options`) needs it set on the role
    /// instead: `ALTER ROLE app SET statement_timeout = '5s'`.
    ///
    /// loom's own long statements set their own: `migrate()` lifts it for
    /// its steps, whatever the pool says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pgloom::PgPoolOptions;
    /// let mut options = PgPoolOptions::new();
    /// options.statement_timeout(Duration::from_secs(2));
    /// ```
    pub fn statement_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.statement_timeout = timeout.into();
        self
    }
}

/// A pool of connections to one PostgreSQL database, shared by that
/// database's stores (clone it: the clones are one pool). Nothing
/// connects until a store's first call.
///
/// By default no connection of it holds a named prepared statement, so it
/// works behind a transaction-mode pooler; [`PgPoolOptions::cache_statements`]
/// turns statement caching on, where connections are the server's own.
///
/// ```no_run
/// use pgloom::event_store::PgEventStore;
/// use pgloom::snapshot_store::{PgSnapshotStore, PgSnapshotStoreOptions};
/// use pgloom::{PgPool, PgPoolOptions};
/// let pool = PgPool::connect_with(
///     "host=db.internal user=app dbname=app sslmode=require",
///     PgPoolOptions::new().max_size(8),
/// )?;
/// let events = PgEventStore::new(pool.clone());
/// let snapshots = PgSnapshotStore::new(pool, &PgSnapshotStoreOptions::new())?;
/// # Ok::<(), pgloom::Error>(())
/// ```
#[derive(Clone)]
pub struct PgPool {
    inner: deadpool_postgres::Pool,
    cache_statements: bool,
    /// Shared by the pool's clones alone: what says two stores read one
    /// database through one pool ([`PgPool::is`]).
    identity: std::sync::Arc<()>,
}

/// What a [`PgPool`] holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgPoolStatus {
    /// The most connections it opens.
    pub max_size: usize,
    /// The connections it has open, in use or not.
    pub size: usize,
    /// The open connections not in use.
    pub available: usize,
    /// The callers waiting for a connection.
    pub waiting: usize,
}

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPool")
            .field("status", &self.status())
            .field("cache_statements", &self.cache_statements)
            .finish_non_exhaustive()
    }
}

impl PgPool {
    /// A pool to `config` (a libpq connection string or URL) with
    /// [`PgPoolOptions::new`]'s defaults: 4 connections, 5 s timeouts.
    ///
    /// # Errors
    ///
    /// As [`PgPool::connect_with`].
    pub fn connect(config: &str) -> Result<Self> {
        Self::connect_with(config, &PgPoolOptions::new())
    }

    /// A pool to `config` (a libpq connection string or URL), sized and
    /// bounded by `options`, with TLS as its `sslmode` says. Nothing
    /// connects until the first call; certificate files are read now,
    /// once.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use pgloom::{PgPool, PgPoolOptions};
    /// let pool = PgPool::connect_with(
    ///     "host=db.internal user=app dbname=app sslmode=verify-full sslrootcert=/etc/app/db-ca.crt",
    ///     PgPoolOptions::new().max_size(16).wait_timeout(Duration::from_millis(500)),
    /// )?;
    /// # Ok::<(), pgloom::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidConnectionString`] when `config` does not
    /// parse (an unknown `sslmode` included); [`crate::Error::Tls`] when a
    /// certificate file cannot be loaded or `verify-ca`/`verify-full` has
    /// no `sslrootcert`.
    pub fn connect_with(config: &str, options: &PgPoolOptions) -> Result<Self> {
        Ok(PgPool {
            inner: crate::pg_connect::deadpool(config, options)?,
            cache_statements: options.cache_statements,
            identity: std::sync::Arc::new(()),
        })
    }

    /// How many connections it has, and how many are in use.
    #[must_use]
    pub fn status(&self) -> PgPoolStatus {
        let status = self.inner.status();
        PgPoolStatus {
            max_size: status.max_size,
            size: status.size,
            available: status.available,
            waiting: status.waiting,
        }
    }

    /// Closes the pool: its idle connections now, the others as they come
    /// back; every later call fails ([`crate::Error::is_transient`] says
    /// false).
    pub fn close(&self) {
        self.inner.close();
    }

    /// Whether [`PgPool::close`] was called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Whether its connections cache prepared statements.
    #[must_use]
    pub fn caches_statements(&self) -> bool {
        self.cache_statements
    }

    /// Whether `other` is this pool (a clone of it): stores on it read the
    /// same database, so one statement may read what both hold.
    pub(crate) fn is(&self, other: &PgPool) -> bool {
        std::sync::Arc::ptr_eq(&self.identity, &other.identity)
    }

    /// A connection of the pool, its statements cached when the pool
    /// says so.
    pub(crate) async fn conn(&self) -> Result<Conn<'static>> {
        Ok(Conn::pooled(self.object().await?, self.cache_statements))
    }

    /// A connection of the pool, as deadpool hands it out.
    pub(crate) async fn object(&self) -> Result<deadpool_postgres::Object> {
        self.inner.get().await.map_err(crate::pg_connect::from_pool)
    }
}

/// A pool a service built with deadpool-postgres itself (at the version
/// [`crate::interop`] names), shared with loom's stores; its statements
/// are not cached by loom.
impl From<deadpool_postgres::Pool> for PgPool {
    fn from(inner: deadpool_postgres::Pool) -> Self {
        PgPool {
            inner,
            cache_statements: false,
            identity: std::sync::Arc::new(()),
        }
    }
}

/// The deadpool pool underneath, for a service's own queries on loom's
/// connections (see [`crate::interop`]).
impl AsRef<deadpool_postgres::Pool> for PgPool {
    fn as_ref(&self) -> &deadpool_postgres::Pool {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn hands_other_keys_to_tokio_postgres_and_its_refusals_back_typed() {
        assert!(matches!(
            PgPool::connect("host=db sslcrl=/x.pem"),
            Err(Error::InvalidConnectionString(e)) if e.to_string().contains("sslcrl")
        ));
    }

    #[test]
    fn pool_options_default_to_bounded_waits() {
        let defaults = PgPoolOptions::default();
        assert_eq!(defaults, PgPoolOptions::new());
        assert_eq!(defaults.max_size, 4);
        assert_eq!(defaults.wait_timeout, Some(Duration::from_secs(5)));
        assert_eq!(defaults.create_timeout, Some(Duration::from_secs(5)));
        assert_eq!(defaults.recycle_timeout, Some(Duration::from_secs(5)));
        let mut options = PgPoolOptions::new();
        options
            .max_size(1)
            .wait_timeout(Duration::from_millis(300))
            .recycle_timeout(None);
        assert_eq!(options.wait_timeout, Some(Duration::from_millis(300)));
        assert_eq!(options.recycle_timeout, None);
        let pool = PgPool::connect_with("host=db", &options).unwrap();
        let timeouts = pool.inner.timeouts();
        assert_eq!(timeouts.wait, Some(Duration::from_millis(300)));
        assert_eq!(timeouts.create, Some(Duration::from_secs(5)));
        assert_eq!(timeouts.recycle, None);
        assert_eq!(pool.status().max_size, 1);
        assert_eq!(defaults.idle_timeout, Some(Duration::from_secs(180)));
        assert_eq!(defaults.max_lifetime, Some(Duration::from_secs(1800)));
        assert!(!defaults.test_on_checkout);
        assert!(!defaults.cache_statements);
        assert!(!pool.caches_statements());
        let cached =
            PgPool::connect_with("host=db", PgPoolOptions::new().cache_statements(true)).unwrap();
        assert!(cached.caches_statements());
    }
}
