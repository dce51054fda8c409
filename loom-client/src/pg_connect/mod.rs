//! The one place pgloom turns a PostgreSQL connection string into a
//! connection or a pool: libpq's TLS keys, a TLS connector (OpenSSL, or
//! rustls with the `rustls` feature), and the pool's timeouts.
//!
//! tokio-postgres parses connection strings itself, but it knows three
//! sslmodes (disable, prefer, require), none of the certificate keys, and
//! refuses a key it does not know. A service copies its connection string
//! from psql, so loom reads it as libpq does: the TLS keys (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, `sslpassword`) are taken out here,
//! from a `key=value` string (with libpq's quoting) or a `postgres://` URL's
//! query, and the rest is handed to tokio-postgres as written.
//!
//! | sslmode | encrypts | verifies |
//! |---|---|---|
//! | `disable` | never | |
//! | `allow` | when plaintext is refused | the chain, if `sslrootcert` is given |
//! | `prefer` (default) | when the server offers TLS; else (or if TLS is refused) plaintext | the chain, if `sslrootcert` is given |
//! | `require` | always | the chain, if `sslrootcert` is given (libpq's rule) |
//! | `verify-ca` | always | the chain, against `sslrootcert` |
//! | `verify-full` | always | the chain, and that the certificate covers `host` |
//!
//! Unlike libpq, no file is read that the string does not name
//! (`~/.postgresql/root.crt` is not looked for: a service's trust should be
//! in its configuration), and a named file that cannot be read is an error,
//! never a silent downgrade. `sslrootcert=system` trusts the system's roots
//! (OpenSSL's default store; under rustls, the platform's certificates as
//! `rustls-native-certs` finds them) and, as in libpq 16, needs
//! `verify-full`.
//!
//! [`conninfo`] reads the string and takes the TLS keys out; [`tls`]
//! applies them (the sslmode's checks and fallbacks, the backend's
//! connector); this module makes pools and single connections of the
//! result, and turns their failures into loom's [`Error`]s.

mod conninfo;
mod tls;

#[cfg(not(any(feature = "openssl", feature = "rustls")))]
compile_error!(
    "pgloom's `postgres` feature needs a TLS backend: enable `openssl` (a default feature) or `rustls`"
);

use std::error::Error as StdError;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, PoolError, RecyclingMethod, Runtime,
};

/// The connection pool [`pg_pool`] builds and the PostgreSQL stores take
/// (deadpool-postgres'), re-exported so that callers name it without
/// depending on deadpool themselves.
pub use deadpool_postgres::Pool;
use tokio_postgres::{Client, Connection, Socket};

pub use self::conninfo::ParseConnectionStringError;
use self::tls::Target;
pub use self::tls::{TlsError, TLS_BACKEND};
use crate::{Error, Result};

/// What loom waits for by default, for a pooled connection, a new
/// connection, and a recycling check alike: long enough for a TLS handshake
/// to a loaded server across a region, short enough that a request fails
/// while its caller still waits for it.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection from [`connect`]: its driver, which the caller spawns or
/// polls.
pub(crate) type PgConnection = Connection<Socket, tls::Stream>;

/// How a pool of PostgreSQL connections behaves: its size and how long its
/// callers wait. A non-consuming builder; `Default` is [`PgPoolOptions::new`].
///
/// ```
/// use std::time::Duration;
/// use pgloom::event_store::PgPoolOptions;
/// let mut options = PgPoolOptions::new();
/// options.max_size(16).wait_timeout(Duration::from_millis(500));
/// // No bound on recycling checks (RecyclingMethod::Fast does no I/O).
/// options.recycle_timeout(None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgPoolOptions {
    max_size: usize,
    wait_timeout: Option<Duration>,
    create_timeout: Option<Duration>,
    recycle_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
    test_on_checkout: bool,
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

    /// The most connections the pool opens (at least 1: a pool of 0 only
    /// ever times out). Default 4.
    pub fn max_size(&mut self, max_size: usize) -> &mut Self {
        self.max_size = max_size;
        self
    }

    /// How long `get` waits for a connection when all are in use; `None`
    /// waits for ever. Past it, `get` fails with
    /// `PoolError::Timeout(TimeoutType::Wait)` (see
    /// [`crate::Error::is_timeout`]). Default 5 s.
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
    /// use pgloom::event_store::PgPoolOptions;
    /// let mut options = PgPoolOptions::new();
    /// options.statement_timeout(Duration::from_secs(2));
    /// ```
    pub fn statement_timeout(&mut self, timeout: impl Into<Option<Duration>>) -> &mut Self {
        self.statement_timeout = timeout.into();
        self
    }
}

/// A pool of `max_size` connections to `config`, a libpq connection string
/// or URL, with TLS as its `sslmode` says and 5 s timeouts
/// ([`PgPoolOptions::new`]), to share between a database's stores.
///
/// ```no_run
/// use pgloom::event_store::{pg_pool, PgEventStore};
/// let pool = pg_pool("host=db.internal user=app dbname=app sslmode=require", 8)?;
/// let store = PgEventStore::new(pool);
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// As [`pg_pool_with`].
pub fn pg_pool(config: &str, max_size: usize) -> Result<Pool> {
    pg_pool_with(config, PgPoolOptions::new().max_size(max_size))
}

/// A pool of connections to `config` (a libpq connection string or URL),
/// sized and bounded by `options`. Nothing connects until the first `get`;
/// certificate files are read now, once.
///
/// ```no_run
/// use std::time::Duration;
/// use pgloom::event_store::{pg_pool_with, PgEventStore, PgPoolOptions};
/// let pool = pg_pool_with(
///     "host=db.internal user=app dbname=app sslmode=verify-full sslrootcert=/etc/app/db-ca.crt",
///     PgPoolOptions::new().max_size(16).wait_timeout(Duration::from_millis(500)),
/// )?;
/// let store = PgEventStore::new(pool);
/// # Ok::<(), pgloom::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::InvalidConnectionString`] when `config` does not parse (an
/// unknown `sslmode` included); [`Error::Tls`] when a certificate file
/// cannot be loaded or `verify-ca`/`verify-full` has no `sslrootcert`.
pub fn pg_pool_with(config: &str, options: &PgPoolOptions) -> Result<Pool> {
    let mut target = Target::parse(config)?;
    if let Some(timeout) = options.create_timeout {
        target.bound_connect(timeout);
    }
    if let Some(timeout) = options.statement_timeout {
        let setting = format!("-c statement_timeout={}", whole_millis(timeout));
        let options = match target.config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {setting}"),
            _ => setting,
        };
        target.config.options(&options);
    }
    let manager = Manager::from_connect(
        target.config,
        target.connector,
        ManagerConfig {
            recycling_method: if options.test_on_checkout {
                RecyclingMethod::Verified
            } else {
                RecyclingMethod::Fast
            },
        },
    );
    let (idle, lifetime) = (options.idle_timeout, options.max_lifetime);
    Ok(Pool::builder(manager)
        .max_size(options.max_size)
        // A connection past either limit is closed at checkout (the hook's
        // error drops it) and the pool hands out another.
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if idle.is_some_and(|idle| metrics.last_used() > idle) {
                return Err(HookError::message(
                    "idle longer than the pool's idle_timeout",
                ));
            }
            if lifetime.is_some_and(|lifetime| metrics.age() > lifetime) {
                return Err(HookError::message("older than the pool's max_lifetime"));
            }
            Ok(())
        }))
        // deadpool enforces timeouts only with a runtime to time them on.
        .runtime(Runtime::Tokio1)
        .wait_timeout(options.wait_timeout)
        .create_timeout(options.create_timeout)
        .recycle_timeout(options.recycle_timeout)
        .build()?)
}

/// A bound in whole milliseconds, rounded up, at least 1 (PostgreSQL reads
/// a timeout of 0 as "no timeout") and at most `i32::MAX` (the largest
/// PostgreSQL takes: 24.8 days; a `Duration::MAX` meant as "no limit"
/// would otherwise be refused at every connection).
pub(crate) fn whole_millis(wait: std::time::Duration) -> u128 {
    wait.as_micros()
        .div_ceil(1000)
        .clamp(1, i32::MAX.unsigned_abs().into())
}

/// One connection to `config`, for work that must not share a pooled one
/// (a migration's session settings), bounded by the default 5 s as a pool
/// would be: TCP, TLS and authentication together.
pub(crate) async fn connect(config: &str) -> Result<(Client, PgConnection)> {
    let mut target = Target::parse(config)?;
    target.bound_connect(DEFAULT_TIMEOUT);
    match tokio::time::timeout(DEFAULT_TIMEOUT, target.connector.open(&target.config)).await {
        Ok(Ok(connected)) => Ok(connected),
        Ok(Err(e)) => Err(from_postgres(e)),
        Err(_) => Err(Error::ConnectTimeout(DEFAULT_TIMEOUT)),
    }
}

/// Who a connection string without a password connects as, for a
/// password file's lookup (libpq's `.pgpass`): each host with its port (a
/// socket directory as `localhost`, as libpq matches it), the database
/// and the user, each as the server defaults them. `None` when it holds a
/// password, or does not parse (connecting reports that).
#[cfg(feature = "cli")]
pub(crate) fn password_lookup(conninfo: &str, os_user: Option<String>) -> Option<PasswordLookup> {
    use tokio_postgres::config::Host;
    let config = Target::parse(conninfo).ok()?.config;
    // libpq reads an empty password as none.
    if config.get_password().is_some_and(|p| !p.is_empty()) {
        return None;
    }
    let user = config.get_user().map(str::to_owned).or(os_user)?;
    let ports = config.get_ports();
    let hosts = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            // libpq matches the default socket directory as `localhost`,
            // any other by its path.
            let name = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(dir) if DEFAULT_SOCKET_DIRS.iter().any(|d| dir.as_os_str() == *d) => {
                    "localhost".to_owned()
                }
                Host::Unix(dir) => dir.to_string_lossy().into_owned(),
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            (name, port)
        })
        .collect();
    Some(PasswordLookup {
        hosts,
        dbname: config.get_dbname().unwrap_or(&user).to_owned(),
        user,
    })
}

/// The socket directories libpq is built with by default: upstream's
/// `/tmp`, and Debian's and most packagers' `/var/run/postgresql`.
#[cfg(feature = "cli")]
const DEFAULT_SOCKET_DIRS: [&str; 3] = ["/tmp", "/var/run/postgresql", "/run/postgresql"];

/// What [`password_lookup`] found.
#[cfg(feature = "cli")]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PasswordLookup {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) dbname: String,
    pub(crate) user: String,
}

/// A failed connection's error: [`Error::Tls`] when the TLS handshake
/// failed, else [`Error::Postgres`].
pub(crate) fn from_postgres(e: tokio_postgres::Error) -> Error {
    match TlsError::from_postgres(e) {
        Ok(tls) => Error::Tls(tls),
        Err(e) => Error::Postgres(e),
    }
}

/// A pool's error: [`Error::Tls`] when a new connection's TLS handshake
/// failed, else [`Error::Pool`] (a timeout among them).
pub(crate) fn from_pool(e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => match TlsError::from_postgres(e) {
            Ok(tls) => Error::Tls(tls),
            Err(e) => Error::Pool(PoolError::Backend(e)),
        },
        e => Error::Pool(e),
    }
}

/// A pool's error with its cause: tokio-postgres's own message for a
/// refused connection is only "db error" or "error performing TLS
/// handshake", its cause (the server's message, "server does not support
/// TLS") is what an operator needs.
pub(crate) fn describe_pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => match e.source() {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_other_keys_to_tokio_postgres_and_its_refusals_back_typed() {
        assert!(matches!(
            pg_pool("host=db sslcrl=/x.pem", 1),
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
        let pool = pg_pool_with("host=db", &options).unwrap();
        let timeouts = pool.timeouts();
        assert_eq!(timeouts.wait, Some(Duration::from_millis(300)));
        assert_eq!(timeouts.create, Some(Duration::from_secs(5)));
        assert_eq!(timeouts.recycle, None);
        assert_eq!(pool.status().max_size, 1);
        assert_eq!(defaults.idle_timeout, Some(Duration::from_secs(180)));
        assert_eq!(defaults.max_lifetime, Some(Duration::from_secs(1800)));
        assert!(!defaults.test_on_checkout);
    }

    #[test]
    fn a_bound_is_whole_milliseconds_and_never_zero() {
        assert_eq!(whole_millis(Duration::ZERO), 1);
        assert_eq!(whole_millis(Duration::from_micros(1)), 1);
        assert_eq!(whole_millis(Duration::from_micros(1001)), 2);
        assert_eq!(whole_millis(Duration::from_secs(5)), 5000);
        assert_eq!(whole_millis(Duration::MAX), 2_147_483_647);
    }
}
