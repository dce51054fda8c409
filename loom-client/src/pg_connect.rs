//! The one place loom-client turns a PostgreSQL connection string into a
//! connection or a pool: libpq's TLS keys, an OpenSSL connector, and the
//! pool's timeouts.
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
//! never a silent downgrade. `sslrootcert=system` trusts OpenSSL's default
//! roots and, as in libpq 16, needs `verify-full`.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use postgres_openssl::TlsStream;
use tokio::task::JoinHandle;
use tokio_postgres::config::{Host, SslMode as WireSslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Connection, Socket};

use crate::{Error, Result};

/// What loom waits for by default, for a pooled connection, a new
/// connection, and a recycling check alike: long enough for a TLS handshake
/// to a loaded server across a region, short enough that a request fails
/// while its caller still waits for it.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection from [`connect`]: its driver, which the caller spawns or
/// polls.
pub(crate) type PgConnection = Connection<Socket, TlsStream<Socket>>;

/// How a pool of PostgreSQL connections behaves: its size and how long its
/// callers wait. A non-consuming builder; `Default` is [`PgPoolOptions::new`].
///
/// ```
/// use std::time::Duration;
/// use loom_client::event_store::PgPoolOptions;
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
}

impl Default for PgPoolOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PgPoolOptions {
    /// 4 connections; 5 s for each timeout (wait, create, recycle), so that
    /// a down or saturated database is an error a request can report, not
    /// a request that hangs.
    #[must_use]
    pub fn new() -> Self {
        PgPoolOptions {
            max_size: 4,
            wait_timeout: Some(DEFAULT_TIMEOUT),
            create_timeout: Some(DEFAULT_TIMEOUT),
            recycle_timeout: Some(DEFAULT_TIMEOUT),
        }
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
}

/// A pool of `max_size` connections to `config`, a libpq connection string
/// or URL, with TLS as its `sslmode` says and 5 s timeouts
/// ([`PgPoolOptions::new`]), to share between a database's stores.
///
/// ```no_run
/// use loom_client::event_store::{pg_pool, PgEventStore};
/// let pool = pg_pool("host=db.internal user=app dbname=app sslmode=require", 8)?;
/// let store = PgEventStore::new(pool);
/// # Ok::<(), loom_client::Error>(())
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
/// use loom_client::event_store::{pg_pool_with, PgEventStore, PgPoolOptions};
/// let pool = pg_pool_with(
///     "host=db.internal user=app dbname=app sslmode=verify-full sslrootcert=/etc/app/db-ca.crt",
///     PgPoolOptions::new().max_size(16).wait_timeout(Duration::from_millis(500)),
/// )?;
/// let store = PgEventStore::new(pool);
/// # Ok::<(), loom_client::Error>(())
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
    let manager = Manager::from_connect(
        target.config,
        target.connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(options.max_size)
        // deadpool enforces timeouts only with a runtime to time them on.
        .runtime(Runtime::Tokio1)
        .wait_timeout(options.wait_timeout)
        .create_timeout(options.create_timeout)
        .recycle_timeout(options.recycle_timeout)
        .build()?)
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

/// A connection string that does not parse, or asks for what loom cannot
/// do. Its message never repeats the string (it may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PostgreSQL connection string: {reason}")]
pub struct ParseConnectionStringError {
    reason: String,
}

impl ParseConnectionStringError {
    fn new(reason: impl Into<String>) -> Self {
        ParseConnectionStringError {
            reason: reason.into(),
        }
    }

    /// tokio-postgres's own messages name keys, never values.
    fn from_tokio(e: &tokio_postgres::Error) -> Self {
        Self::new(
            e.source()
                .map_or_else(|| e.to_string(), ToString::to_string),
        )
    }
}

/// Why TLS to PostgreSQL could not be set up or was refused.
///
/// A server that does not offer TLS at all under `sslmode=require` is not
/// here: tokio-postgres reports it itself ("server does not support TLS"),
/// as [`Error::Postgres`] or, from a pool, [`Error::Pool`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// `verify-ca` or `verify-full` without `sslrootcert`: nothing to verify
    /// the server's certificate against.
    #[error("sslmode={sslmode} verifies the server's certificate, so it needs sslrootcert (a CA file, or \"system\")")]
    MissingRootCert {
        /// The sslmode asked for.
        sslmode: &'static str,
    },
    /// A certificate or key file that cannot be read or is not PEM.
    #[error("cannot load {key} {path:?}: {source}")]
    File {
        /// The connection string key that names it (`sslrootcert`, …).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// OpenSSL could not be set up.
    #[error("cannot set up TLS: {0}")]
    Setup(#[source] Box<dyn StdError + Send + Sync>),
    /// Under `verify-full`, a server whose certificate does not cover the
    /// host name (or address) connected to.
    #[error("the server's certificate does not cover {host:?} (sslmode=verify-full)")]
    HostnameMismatch {
        /// The host name checked.
        host: String,
        /// The handshake's failure.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// A server whose certificate does not verify against `sslrootcert`.
    #[error("the server's certificate at {host:?} is not trusted: {reason}")]
    UntrustedCertificate {
        /// The host connected to.
        host: String,
        /// OpenSSL's verification result.
        reason: String,
        /// The handshake's failure.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// Any other failed handshake (protocol versions, a dropped
    /// connection, a client certificate the server refused).
    #[error("TLS handshake with {host:?} failed: {source}")]
    Handshake {
        /// The host connected to.
        host: String,
        /// The handshake's failure.
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl TlsError {
    /// The TLS failure `e` carries (with its cause), or `e` as it was.
    fn from_postgres(e: tokio_postgres::Error) -> Result<TlsError, tokio_postgres::Error> {
        if !e.source().is_some_and(|cause| cause.is::<HandshakeError>()) {
            return Err(e);
        }
        let Some(Ok(failure)) = e
            .into_source()
            .map(|cause| cause.downcast::<HandshakeError>())
        else {
            unreachable!("the cause was checked to be a HandshakeError")
        };
        let HandshakeError {
            host,
            rejected,
            source,
        } = *failure;
        Ok(match rejected {
            Some(rejection)
                if rejection.code == openssl_sys::X509_V_ERR_HOSTNAME_MISMATCH
                    || rejection.code == openssl_sys::X509_V_ERR_IP_ADDRESS_MISMATCH =>
            {
                TlsError::HostnameMismatch { host, source }
            }
            Some(rejection) => TlsError::UntrustedCertificate {
                host,
                reason: rejection.reason.to_owned(),
                source,
            },
            None => TlsError::Handshake { host, source },
        })
    }

    fn file(
        key: &'static str,
        path: &str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        TlsError::File {
            key,
            path: PathBuf::from(path),
            source: source.into(),
        }
    }
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

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const ALL: [SslMode; 6] = [
        SslMode::Disable,
        SslMode::Allow,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// libpq compares exactly (no case folding), and so does loom: an
    /// unknown mode is refused, never read as a weaker one.
    fn parse(value: &str) -> Result<Self, ParseConnectionStringError> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| {
                ParseConnectionStringError::new(format!(
                    "unknown sslmode {value:?}: expected disable, allow, prefer, require, verify-ca or verify-full"
                ))
            })
    }
}

/// The TLS keys taken out of a connection string.
#[derive(Default, Clone, PartialEq, Eq)]
struct TlsKeys {
    mode: Option<SslMode>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    password: Option<String>,
}

impl fmt::Debug for TlsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsKeys")
            .field("mode", &self.mode)
            .field("root_cert", &self.root_cert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .finish()
    }
}

impl TlsKeys {
    /// Takes `key` when it is a TLS key (true); any other is left for
    /// tokio-postgres. An empty file name means none, as in libpq.
    fn take(&mut self, key: &str, value: String) -> Result<bool, ParseConnectionStringError> {
        let file = |value: String| (!value.is_empty()).then_some(value);
        match key {
            "sslmode" => self.mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => self.root_cert = file(value),
            "sslcert" => self.cert = file(value),
            "sslkey" => self.key = file(value),
            "sslpassword" => self.password = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A connection string split in two: what tokio-postgres parses (as
/// written), and the TLS keys.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    tls: TlsKeys,
}

fn split(conninfo: &str) -> Result<Split, ParseConnectionStringError> {
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        split_url(conninfo)
    } else {
        split_keyword_value(conninfo)
    }
}

/// libpq's `key = value …` syntax: spaces around `=` allowed, a value
/// either bare (up to white space) or in single quotes, `\` escaping the
/// next character in both. A repeated key keeps its last value, as libpq
/// does (tokio-postgres would add a second host or port instead).
fn split_keyword_value(s: &str) -> Result<Split, ParseConnectionStringError> {
    let mut tls = TlsKeys::default();
    let mut kept: Vec<(&str, &str)> = Vec::new();
    let mut chars = s.char_indices().peekable();
    let position = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        chars.peek().map_or(s.len(), |&(i, _)| i)
    };
    loop {
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let start = position(&mut chars);
        if start == s.len() {
            break;
        }
        while chars
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key = &s[start..position(&mut chars)];
        if key.is_empty() {
            return Err(ParseConnectionStringError::new(
                "\"=\" without a key before it",
            ));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            return Err(ParseConnectionStringError::new(format!(
                "missing \"=\" after {key:?}"
            )));
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let value = if chars.next_if(|&(_, c)| c == '\'').is_some() {
            quoted_value(&mut chars).ok_or_else(|| {
                ParseConnectionStringError::new(format!("unterminated quoted value of {key:?}"))
            })?
        } else {
            bare_value(&mut chars)
        };
        let raw = &s[start..position(&mut chars)];
        if !tls.take(key, value)? {
            kept.retain(|(k, _)| *k != key);
            kept.push((key, raw));
        }
    }
    let rest = kept
        .iter()
        .map(|(_, raw)| *raw)
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Split { rest, tls })
}

/// After the opening quote, up to and past the closing one; `None` when
/// there is none.
fn quoted_value(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> Option<String> {
    let mut value = String::new();
    loop {
        match chars.next()?.1 {
            '\'' => return Some(value),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
}

fn bare_value(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) -> String {
    let mut value = String::new();
    while let Some((_, c)) = chars.next_if(|&(_, c)| !c.is_whitespace()) {
        if c == '\\' {
            if let Some((_, escaped)) = chars.next() {
                value.push(escaped);
            }
        } else {
            value.push(c);
        }
    }
    value
}

/// A `postgres://` URL: TLS keys come out of its query (percent-decoded);
/// the rest of the URL is left as written.
fn split_url(s: &str) -> Result<Split, ParseConnectionStringError> {
    let mut tls = TlsKeys::default();
    // As tokio-postgres reads it: user info up to the first '@', then the
    // query from the first '?' after it.
    let after_user = s.find('@').map_or(0, |at| at + 1);
    let Some(question) = s[after_user..].find('?').map(|i| after_user + i) else {
        return Ok(Split {
            rest: s.to_owned(),
            tls,
        });
    };
    let mut kept: Vec<(String, &str)> = Vec::new();
    for param in s[question + 1..].split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').ok_or_else(|| {
            ParseConnectionStringError::new("a URL query parameter without \"=\"")
        })?;
        let key = percent_decode(key)?;
        if !tls.take(&key, percent_decode(value)?)? {
            kept.retain(|(k, _)| *k != key);
            kept.push((key, param));
        }
    }
    let mut rest = s[..question].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.iter().map(|(_, p)| *p).collect::<Vec<_>>().join("&"));
    }
    Ok(Split { rest, tls })
}

/// `%XX` to its byte; a `%` not followed by two hex digits stays as it is
/// (as tokio-postgres's decoder leaves it).
fn percent_decode(s: &str) -> Result<String, ParseConnectionStringError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        match (bytes[i], hex) {
            (b'%', Some(hex)) => {
                let hex = std::str::from_utf8(hex).expect("ASCII hex digits");
                out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| {
        ParseConnectionStringError::new("a URL query parameter is not UTF-8 once decoded")
    })
}

/// What the server's certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Chain,
    ChainAndHost,
}

/// A connection string, parsed and checked: the tokio-postgres
/// configuration and the connector that honours its TLS keys.
struct Target {
    config: Config,
    connector: Connector,
}

impl Target {
    fn parse(conninfo: &str) -> Result<Self> {
        let Split { rest, tls } = split(conninfo)?;
        let mut config: Config = rest
            .parse()
            .map_err(|e| ParseConnectionStringError::from_tokio(&e))?;
        let system_roots = tls.root_cert.as_deref() == Some("system");
        let mut mode = tls.mode.unwrap_or(if system_roots {
            SslMode::VerifyFull
        } else {
            SslMode::Prefer
        });
        if system_roots && mode != SslMode::VerifyFull {
            return Err(ParseConnectionStringError::new(format!(
                "sslmode={} may not be used with sslrootcert=system (use verify-full)",
                mode.as_str()
            ))
            .into());
        }
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && tls.root_cert.is_none() {
            return Err(TlsError::MissingRootCert {
                sslmode: mode.as_str(),
            }
            .into());
        }
        if config.get_hosts().is_empty() {
            if mode == SslMode::VerifyFull {
                return Err(ParseConnectionStringError::new(
                    "sslmode=verify-full needs host: the name the certificate must cover",
                )
                .into());
            }
            // TLS needs a name to hand the handshake; without a check of it,
            // the address serves.
            for addr in config.get_hostaddrs().to_vec() {
                config.host(addr.to_string());
            }
        }
        // PostgreSQL never speaks TLS over a Unix socket, and libpq ignores
        // sslmode there.
        #[cfg(unix)]
        if config.get_hostaddrs().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| matches!(h, Host::Unix(_)))
        {
            mode = SslMode::Disable;
        }
        let verify = match mode {
            SslMode::Disable => Verify::Nothing,
            SslMode::VerifyFull => Verify::ChainAndHost,
            SslMode::VerifyCa => Verify::Chain,
            _ if tls.root_cert.is_some() => Verify::Chain,
            _ => Verify::Nothing,
        };
        config.ssl_mode(match mode {
            SslMode::Disable => WireSslMode::Disable,
            SslMode::Allow | SslMode::Prefer => WireSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireSslMode::Require,
        });
        // A disabled mode never reads the files a string may still name.
        let keys = if mode == SslMode::Disable {
            TlsKeys::default()
        } else {
            tls
        };
        Ok(Target {
            config,
            connector: Connector {
                tls: MakeTls::new(&keys, verify)?,
                mode,
            },
        })
    }

    /// Bounds each TCP connect by `timeout`, unless the string set its own
    /// `connect_timeout`.
    fn bound_connect(&mut self, timeout: Duration) {
        if self.config.get_connect_timeout().is_none() {
            self.config.connect_timeout(timeout);
        }
    }
}

/// Opens connections with libpq's sslmode, fallbacks included: tokio-
/// postgres's `Prefer` falls back only when the server declines TLS, libpq
/// also when TLS fails or is refused, and `allow` tries plaintext first.
#[derive(Clone)]
struct Connector {
    tls: MakeTls,
    mode: SslMode,
}

impl Connector {
    async fn open(&self, config: &Config) -> Result<(Client, PgConnection), tokio_postgres::Error> {
        let (first, fallback) = match self.mode {
            SslMode::Allow => (WireSslMode::Disable, Some(WireSslMode::Require)),
            SslMode::Prefer => (WireSslMode::Prefer, Some(WireSslMode::Disable)),
            _ => (config.get_ssl_mode(), None),
        };
        let mut attempt = config.clone();
        attempt.ssl_mode(first);
        match (attempt.connect(self.tls.clone()).await, fallback) {
            (Err(e), Some(fallback)) if is_refusal(&e) => {
                attempt.ssl_mode(fallback);
                attempt.connect(self.tls.clone()).await
            }
            (result, _) => result,
        }
    }
}

/// A failure the other side of a fallback may avoid: the handshake, or the
/// server's pg_hba refusing this kind of connection (`hostssl`,
/// `hostnossl`).
fn is_refusal(e: &tokio_postgres::Error) -> bool {
    e.source().is_some_and(|cause| cause.is::<HandshakeError>())
        || e.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        pg_config: &Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let pg_config = pg_config.clone();
        Box::pin(async move {
            let (client, connection) = self.open(&pg_config).await?;
            // A connection that fails shows at the client's next call, and
            // the pool drops the client when it is returned closed.
            let driver = tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok((client, driver))
        })
    }
}

/// The OpenSSL connector for a connection string's TLS keys, built once
/// per pool (so certificate files are read once).
#[derive(Clone)]
struct MakeTls {
    connector: SslConnector,
    verify: Verify,
}

impl MakeTls {
    fn new(keys: &TlsKeys, verify: Verify) -> Result<Self, TlsError> {
        let setup = |e: openssl::error::ErrorStack| TlsError::Setup(e.into());
        // SslConnector's builder starts from OpenSSL's default roots (what
        // sslrootcert=system means) and a modern cipher list.
        let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(setup)?;
        // libpq's default ssl_min_protocol_version.
        builder
            .set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup)?;
        builder.set_verify(if verify == Verify::Nothing {
            SslVerifyMode::NONE
        } else {
            SslVerifyMode::PEER
        });
        match keys.root_cert.as_deref() {
            None | Some("system") => {}
            // Only the named CA file, not it and the system's roots.
            Some(path) => builder.set_cert_store(root_store(path)?),
        }
        match (&keys.cert, &keys.key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                builder
                    .set_certificate_chain_file(cert)
                    .map_err(|e| TlsError::file("sslcert", cert, e))?;
                match &keys.password {
                    None => builder.set_private_key_file(key, SslFiletype::PEM),
                    Some(password) => {
                        let pem =
                            std::fs::read(key).map_err(|e| TlsError::file("sslkey", key, e))?;
                        let pkey = PKey::private_key_from_pem_passphrase(&pem, password.as_bytes())
                            .map_err(|e| TlsError::file("sslkey", key, e))?;
                        builder.set_private_key(&pkey)
                    }
                }
                .and_then(|()| builder.check_private_key())
                .map_err(|e| TlsError::file("sslkey", key, e))?;
            }
            (Some(cert), None) => {
                return Err(TlsError::file(
                    "sslcert",
                    cert,
                    "sslcert needs sslkey (its private key)",
                ))
            }
            (None, Some(key)) => {
                return Err(TlsError::file(
                    "sslkey",
                    key,
                    "sslkey needs sslcert (its certificate)",
                ))
            }
        }
        Ok(MakeTls {
            connector: builder.build(),
            verify,
        })
    }
}

/// A store of the certificates in a PEM file (a CA, or a bundle).
fn root_store(path: &str) -> Result<openssl::x509::store::X509Store, TlsError> {
    let pem = std::fs::read(path).map_err(|e| TlsError::file("sslrootcert", path, e))?;
    let certs = X509::stack_from_pem(&pem).map_err(|e| TlsError::file("sslrootcert", path, e))?;
    if certs.is_empty() {
        return Err(TlsError::file(
            "sslrootcert",
            path,
            "no PEM certificate in it",
        ));
    }
    let mut store = X509StoreBuilder::new().map_err(|e| TlsError::Setup(e.into()))?;
    for cert in certs {
        store
            .add_cert(cert)
            .map_err(|e| TlsError::file("sslrootcert", path, e))?;
    }
    Ok(store.build())
}

impl MakeTlsConnect<Socket> for MakeTls {
    type Stream = TlsStream<Socket>;
    type TlsConnect = Tls;
    type Error = openssl::error::ErrorStack;

    fn make_tls_connect(&mut self, host: &str) -> Result<Tls, Self::Error> {
        let mut ssl = self.connector.configure()?;
        ssl.set_verify_hostname(self.verify == Verify::ChainAndHost);
        let rejected = Arc::new(Mutex::new(None));
        if self.verify != Verify::Nothing {
            // OpenSSL's handshake error says only "certificate verify
            // failed"; the callback keeps the first reason, so a host name
            // mismatch is told apart from an unknown issuer.
            let slot = Arc::clone(&rejected);
            ssl.set_verify_callback(SslVerifyMode::PEER, move |ok, context| {
                if !ok {
                    let error = context.error();
                    slot.lock()
                        .expect("never poisoned")
                        .get_or_insert(Rejection {
                            code: error.as_raw(),
                            reason: error.error_string(),
                        });
                }
                ok
            });
        }
        Ok(Tls {
            inner: postgres_openssl::TlsConnector::new(ssl, host),
            host: host.to_owned(),
            rejected,
        })
    }
}

/// Why OpenSSL rejected the server's certificate.
#[derive(Debug, Clone, Copy)]
struct Rejection {
    code: std::os::raw::c_int,
    reason: &'static str,
}

/// One connection's handshake, which reports its failure as a
/// [`HandshakeError`] that [`TlsError::from_postgres`] finds again.
struct Tls {
    inner: postgres_openssl::TlsConnector,
    host: String,
    rejected: Arc<Mutex<Option<Rejection>>>,
}

impl TlsConnect<Socket> for Tls {
    type Stream = TlsStream<Socket>;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsStream<Socket>, HandshakeError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        let Tls {
            inner,
            host,
            rejected,
        } = self;
        Box::pin(async move {
            TlsConnect::<Socket>::connect(inner, stream)
                .await
                .map_err(|source| HandshakeError {
                    host,
                    rejected: *rejected.lock().expect("never poisoned"),
                    source,
                })
        })
    }
}

/// A failed TLS handshake, as tokio-postgres carries it (the cause of its
/// TLS error).
#[derive(Debug)]
struct HandshakeError {
    host: String,
    rejected: Option<Rejection>,
    source: Box<dyn StdError + Send + Sync>,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS handshake with {:?} failed", self.host)?;
        if let Some(rejection) = self.rejected {
            write!(f, ": certificate rejected: {}", rejection.reason)?;
        }
        Ok(())
    }
}

impl StdError for HandshakeError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(mode: Option<SslMode>) -> TlsKeys {
        TlsKeys {
            mode,
            ..TlsKeys::default()
        }
    }

    #[test]
    fn reads_every_libpq_sslmode() {
        for mode in SslMode::ALL {
            let split = split(&format!("host=db sslmode={} user=app", mode.as_str())).unwrap();
            assert_eq!(split.rest, "host=db user=app");
            assert_eq!(split.tls, keys(Some(mode)));
        }
        assert_eq!(split("host=db").unwrap().tls, keys(None));
    }

    #[test]
    fn refuses_an_unknown_sslmode_rather_than_a_weaker_one() {
        for bad in ["verify_full", "VERIFY-FULL", "Require", "", "on"] {
            let err = split(&format!("host=db sslmode='{bad}'")).unwrap_err();
            assert!(err.to_string().contains("unknown sslmode"), "{bad}: {err}");
            let url = format!("postgres://db/app?sslmode={bad}");
            assert!(split(&url).is_err(), "{url}");
        }
        // Through the pool builder, typed.
        assert!(matches!(
            pg_pool("host=db sslmode=verify-fool", 1),
            Err(Error::InvalidConnectionString(_))
        ));
    }

    #[test]
    fn reads_quoted_and_escaped_values_as_libpq_does() {
        let split = split(
            r"host = db  sslrootcert='/etc/my certs/ca \'x\'.pem' sslcert=/a\ b.crt sslkey=''  password='p w' dbname=app",
        )
        .unwrap();
        assert_eq!(
            split.tls.root_cert.as_deref(),
            Some("/etc/my certs/ca 'x'.pem")
        );
        assert_eq!(split.tls.cert.as_deref(), Some("/a b.crt"));
        assert_eq!(split.tls.key, None, "an empty file name is none");
        // The rest is handed on as written, quotes and all.
        assert_eq!(split.rest, "host = db password='p w' dbname=app");
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"p w"[..]));
        assert_eq!(config.get_dbname(), Some("app"));
    }

    #[test]
    fn refuses_broken_key_value_strings_without_echoing_them() {
        for bad in ["host", "=db", "host=db sslrootcert='/x", "sslmode"] {
            assert!(split(bad).is_err(), "{bad}");
        }
        let err = split("password='s3cret sslmode=require").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn keeps_the_last_of_a_repeated_key_as_libpq_does() {
        let split = split("host=a port=1 host=b sslmode=disable sslmode=verify-full").unwrap();
        assert_eq!(split.rest, "port=1 host=b");
        assert_eq!(split.tls.mode, Some(SslMode::VerifyFull));
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_hosts(), [Host::Tcp("b".to_owned())]);
    }

    #[test]
    fn takes_tls_keys_out_of_url_queries() {
        let split = split(
            "postgresql://u:p%3Fw@db:5433/app?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca%20b.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(split.tls.mode, Some(SslMode::VerifyCa));
        assert_eq!(split.tls.root_cert.as_deref(), Some("/etc/ca b.pem"));
        assert_eq!(
            split.rest,
            "postgresql://u:p%3Fw@db:5433/app?application_name=x&connect_timeout=3"
        );
        let config: Config = split.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"p?w"[..]));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
        // Only TLS keys: no '?' left; none at all: as written.
        assert_eq!(
            super::split("postgres://db/app?sslmode=require")
                .unwrap()
                .rest,
            "postgres://db/app"
        );
        assert_eq!(
            super::split("postgres://db/app").unwrap(),
            Split {
                rest: "postgres://db/app".to_owned(),
                tls: TlsKeys::default()
            }
        );
        // A '?' in the user info (encoded or not) is not the query.
        assert_eq!(
            super::split("postgres://u:a?b@db/app?sslmode=disable")
                .unwrap()
                .rest,
            "postgres://u:a?b@db/app"
        );
        assert!(super::split("postgres://db/app?sslmode").is_err());
    }

    #[test]
    fn decodes_percent_escapes_and_leaves_stray_percents() {
        assert_eq!(percent_decode("a%20b%2fc").unwrap(), "a b/c");
        assert_eq!(percent_decode("100%").unwrap(), "100%");
        assert_eq!(percent_decode("%+1x").unwrap(), "%+1x");
        assert_eq!(percent_decode("%C3%A9").unwrap(), "é");
        assert!(percent_decode("%FF").is_err());
    }

    fn target(conninfo: &str) -> Result<Target> {
        Target::parse(conninfo)
    }

    #[test]
    fn maps_each_sslmode_to_the_wire_and_the_check() {
        let ca = std::env::temp_dir().join(format!("loom-pg-connect-{}.pem", std::process::id()));
        // Any self-signed certificate will do as a root to load.
        std::fs::write(&ca, self_signed_pem()).unwrap();
        let ca = ca.display().to_string();
        for (conninfo, wire, verify) in [
            ("host=db", WireSslMode::Prefer, Verify::Nothing),
            (
                "host=db sslmode=disable",
                WireSslMode::Disable,
                Verify::Nothing,
            ),
            (
                "host=db sslmode=allow",
                WireSslMode::Prefer,
                Verify::Nothing,
            ),
            (
                "host=db sslmode=require",
                WireSslMode::Require,
                Verify::Nothing,
            ),
            (
                &format!("host=db sslmode=require sslrootcert={ca}"),
                WireSslMode::Require,
                Verify::Chain,
            ),
            (
                &format!("host=db sslmode=prefer sslrootcert={ca}"),
                WireSslMode::Prefer,
                Verify::Chain,
            ),
            (
                &format!("host=db sslmode=verify-ca sslrootcert={ca}"),
                WireSslMode::Require,
                Verify::Chain,
            ),
            (
                &format!("host=db sslmode=verify-full sslrootcert={ca}"),
                WireSslMode::Require,
                Verify::ChainAndHost,
            ),
            (
                "host=db sslrootcert=system",
                WireSslMode::Require,
                Verify::ChainAndHost,
            ),
            // A disabled mode reads no file, even a missing one.
            (
                "host=db sslmode=disable sslrootcert=/nonexistent",
                WireSslMode::Disable,
                Verify::Nothing,
            ),
            // No TLS over a Unix socket.
            (
                "host=/run/postgresql sslmode=require",
                WireSslMode::Disable,
                Verify::Nothing,
            ),
        ] {
            let target = target(conninfo).unwrap_or_else(|e| panic!("{conninfo}: {e}"));
            assert_eq!(target.config.get_ssl_mode(), wire, "{conninfo}");
            assert_eq!(target.connector.tls.verify, verify, "{conninfo}");
        }
        let _ = std::fs::remove_file(&ca);
    }

    #[test]
    fn refuses_what_cannot_be_verified_typed() {
        for mode in ["verify-ca", "verify-full"] {
            assert!(matches!(
                target(&format!("host=db sslmode={mode}")),
                Err(Error::Tls(TlsError::MissingRootCert { sslmode })) if sslmode == mode
            ));
        }
        assert!(matches!(
            target("host=db sslmode=require sslrootcert=system"),
            Err(Error::InvalidConnectionString(_))
        ));
        assert!(matches!(
            target("host=db sslmode=require sslrootcert=/nonexistent/ca.pem"),
            Err(Error::Tls(TlsError::File {
                key: "sslrootcert",
                ..
            }))
        ));
        assert!(matches!(
            target("host=db sslmode=require sslcert=/nonexistent/c.pem"),
            Err(Error::Tls(TlsError::File { key: "sslcert", .. }))
        ));
        // verify-full has no name to check with an address alone.
        assert!(matches!(
            target("hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=system"),
            Err(Error::InvalidConnectionString(_))
        ));
    }

    #[test]
    fn gives_an_address_alone_to_the_handshake_as_its_name() {
        let target = target("hostaddr=127.0.0.1 sslmode=require").unwrap();
        assert_eq!(
            target.config.get_hosts(),
            [Host::Tcp("127.0.0.1".to_owned())]
        );
    }

    #[test]
    fn bounds_connects_unless_the_string_does() {
        let mut own = target("host=db connect_timeout=2").unwrap();
        own.bound_connect(Duration::from_secs(9));
        assert_eq!(
            own.config.get_connect_timeout(),
            Some(&Duration::from_secs(2))
        );
        let mut default = target("host=db").unwrap();
        default.bound_connect(Duration::from_secs(9));
        assert_eq!(
            default.config.get_connect_timeout(),
            Some(&Duration::from_secs(9))
        );
    }

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
    }

    /// A throwaway self-signed certificate, made here so the test ships no
    /// key material.
    fn self_signed_pem() -> Vec<u8> {
        use openssl::asn1::Asn1Time;
        use openssl::ec::{EcGroup, EcKey};
        use openssl::hash::MessageDigest;
        use openssl::nid::Nid;
        use openssl::x509::X509NameBuilder;
        let key = PKey::from_ec_key(
            EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap(),
        )
        .unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "loom unit test CA")
            .unwrap();
        let name = name.build();
        let mut cert = X509::builder().unwrap();
        cert.set_version(2).unwrap();
        cert.set_subject_name(&name).unwrap();
        cert.set_issuer_name(&name).unwrap();
        cert.set_pubkey(&key).unwrap();
        cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        cert.build().to_pem().unwrap()
    }
}
