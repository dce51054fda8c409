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

use std::time::Duration;

use deadpool_postgres::PoolError;

use tokio_postgres::{Client, Connection, Socket};

pub use self::conninfo::ParseConnectionStringError;
use self::tls::Target;
pub use self::tls::{TlsError, TLS_BACKEND};
use crate::{Error, Result};

/// What loom waits for by default, for a pooled connection, a new
/// connection, and a recycling check alike: long enough for a TLS handshake
/// to a loaded server across a region, short enough that a request fails
/// while its caller still waits for it.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection from [`connect`]: its driver, which the caller spawns or
/// polls.
pub(crate) type PgConnection = Connection<Socket, tls::Stream>;

/// A deadpool pool of connections to `config` as `options` say; what
/// [`crate::PgPool`] wraps.
pub(crate) fn deadpool(
    config: &str,
    options: &crate::PgPoolOptions,
) -> Result<deadpool_postgres::Pool> {
    use deadpool_postgres::{
        Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
    };
    let mut target = Target::parse(config)?;
    if let Some(timeout) = options.create_timeout {
        target.bound_connect(timeout);
    }
    add_settings(&mut target.config, options);
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

/// `options`' server settings added to `config`'s own `options`, after the
/// user's (so theirs stay, and loom's win where both set one): in the
/// parsed configuration, never spliced into the text, where a value's
/// quoting or a trailing `\` could swallow them.
fn add_settings(config: &mut tokio_postgres::Config, options: &crate::PgPoolOptions) {
    let statement_timeout = options
        .statement_timeout
        .map(|timeout| format!("-c statement_timeout={}", whole_millis(timeout)));
    let read_only = options
        .read_only
        .then(|| "-c default_transaction_read_only=on".to_owned());
    let given = config.get_options().unwrap_or_default().trim().to_owned();
    let all: Vec<String> = std::iter::once(given)
        .filter(|given| !given.is_empty())
        .chain(statement_timeout)
        .chain(read_only)
        .collect();
    if !all.is_empty() {
        config.options(all.join(" "));
    }
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
    let user_defaulted = config.get_user().is_none();
    let user = config.get_user().map(str::to_owned).or(os_user)?;
    let ports = config.get_ports();
    let hosts = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            // libpq matches its default socket directory as `localhost`,
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
        user_defaulted,
    })
}

/// The socket directory libpq is built with where loom is packaged:
/// Debian's and most distributions' `/var/run/postgresql`, compared as
/// text, as libpq compares it (`/run/postgresql` is matched by its path).
/// libpq matches only its one compiled-in directory as `localhost`;
/// upstream's `/tmp` is not taken here, since any local user can put a
/// socket there and be sent the password of `localhost`: a `/tmp` socket
/// is matched by its path, as every other directory is (psql built with
/// `/tmp` as its default finds a `localhost` line there; loom does not).
#[cfg(feature = "cli")]
const DEFAULT_SOCKET_DIRS: [&str; 1] = ["/var/run/postgresql"];

/// What [`password_lookup`] found.
#[cfg(feature = "cli")]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PasswordLookup {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) dbname: String,
    pub(crate) user: String,
    /// Whether `user` is the OS user, the connection string naming none.
    pub(crate) user_defaulted: bool,
}

/// A failed connection's error: [`Error::Tls`] when the TLS handshake
/// failed, else [`Error::Postgres`].
pub(crate) fn from_postgres(e: tokio_postgres::Error) -> Error {
    match TlsError::from_postgres(e) {
        Ok(tls) => Error::Tls(tls),
        Err(e) => Error::from(e),
    }
}

/// A pool's error: [`Error::Tls`] when a new connection's TLS handshake
/// failed, else [`Error::Pool`] (a timeout among them).
pub(crate) fn from_pool(e: PoolError) -> Error {
    use crate::error::{DriverError, PgError, PoolErrorKind, PoolTimeout};
    let kind = match e {
        PoolError::Backend(e) => match TlsError::from_postgres(e) {
            Ok(tls) => return Error::Tls(tls),
            Err(e) => PoolErrorKind::Backend(PgError(e)),
        },
        PoolError::Timeout(which) => PoolErrorKind::Timeout(match which {
            deadpool_postgres::TimeoutType::Wait => PoolTimeout::Wait,
            deadpool_postgres::TimeoutType::Create => PoolTimeout::Create,
            deadpool_postgres::TimeoutType::Recycle => PoolTimeout::Recycle,
        }),
        PoolError::Closed => PoolErrorKind::Closed,
        e => PoolErrorKind::Other(DriverError::new(e)),
    };
    Error::Pool(crate::error::PoolError { kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_whole_milliseconds_and_never_zero() {
        assert_eq!(whole_millis(Duration::ZERO), 1);
        assert_eq!(whole_millis(Duration::from_micros(1)), 1);
        assert_eq!(whole_millis(Duration::from_micros(1001)), 2);
        assert_eq!(whole_millis(Duration::from_secs(5)), 5000);
        assert_eq!(whole_millis(Duration::MAX), 2_147_483_647);
    }

    /// Review of issue 35: the `loom` command spliced its read-only
    /// `options=` onto the connection string's text, where it replaced the
    /// user's own `options` and a trailing `\\` escaped it into the value
    /// before it. Added to the parsed configuration, it is always there,
    /// after the user's settings.
    #[test]
    fn settings_join_the_users_options_and_nothing_in_the_text_undoes_them() {
        let mut read_only = crate::PgPoolOptions::new();
        read_only
            .statement_timeout(Duration::from_millis(1500))
            .read_only = true;
        for (given, kept) in [
            ("host=db dbname=app", ""),
            ("host=db dbname=app\\", ""),
            ("host=db options='-c work_mem=64kB'", "-c work_mem=64kB "),
            (
                "postgresql://db/app?options=-c%20work_mem%3D64kB",
                "-c work_mem=64kB ",
            ),
            ("host=db application_name=x\\ options=", ""),
        ] {
            let mut config: tokio_postgres::Config = given.parse().unwrap();
            add_settings(&mut config, &read_only);
            assert_eq!(
                config.get_options(),
                Some(
                    format!("{kept}-c statement_timeout=1500 -c default_transaction_read_only=on")
                        .as_str()
                ),
                "{given}"
            );
        }
        let mut config: tokio_postgres::Config = "host=db options='-c a=b'".parse().unwrap();
        add_settings(&mut config, &crate::PgPoolOptions::new());
        assert_eq!(config.get_options(), Some("-c a=b"));
    }
}
