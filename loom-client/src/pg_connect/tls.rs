//! The TLS a connection string asks for: its sslmode checked against its
//! keys and applied ([`Target`]), with libpq's fallbacks ([`Connector`]);
//! a connector built once from its certificate files by the backend this
//! build chose ([`MakeTls`]: OpenSSL, or rustls with the `rustls` feature);
//! and a failed handshake told apart by its cause ([`TlsError`]).
//!
//! Both backends give the same [`TlsError`]s for the same failures, and the
//! same sslmodes. They differ in what they read (rustls takes no encrypted
//! key, `sslpassword`) and in the certificate rules they apply: rustls's
//! are the Web PKI's (no self-signed CA as a server certificate, no CN
//! fallback, no v1 certificates; a root's dates unchecked), OpenSSL's are
//! libpq's (docs/client.md, "Connecting").

use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::config::{Host, SslMode as WireSslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use super::conninfo::{split, ParseConnectionStringError, Split, SslMode, TlsKeys};
use super::PgConnection;
use crate::Result;

#[cfg(all(feature = "openssl", not(feature = "rustls")))]
mod with_openssl;
#[cfg(all(feature = "openssl", not(feature = "rustls")))]
use with_openssl as backend;
#[cfg(feature = "rustls")]
mod with_rustls;
#[cfg(feature = "rustls")]
use with_rustls as backend;

use backend::MakeTls;
pub(super) use backend::Stream;

/// The TLS library this build of pgloom connects with: `"rustls"`
/// when its `rustls` feature is on (even beside `openssl`), else
/// `"openssl"`.
///
/// ```
/// assert!(["openssl", "rustls"].contains(&pgloom::event_store::TLS_BACKEND));
/// ```
pub const TLS_BACKEND: &str = if cfg!(feature = "rustls") {
    "rustls"
} else {
    "openssl"
};

/// Why TLS to PostgreSQL could not be set up or was refused.
///
/// A server that does not offer TLS at all under `sslmode=require` is not
/// here: tokio-postgres reports it itself ("server does not support TLS"),
/// as [`Error::Postgres`](crate::Error::Postgres) or, from a pool,
/// [`Error::Pool`](crate::Error::Pool).
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
    /// The TLS library could not be set up (or, with `sslrootcert=system`,
    /// found no root certificate on the system).
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
        /// The TLS library's verification result.
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
    pub(super) fn from_postgres(
        e: tokio_postgres::Error,
    ) -> Result<TlsError, tokio_postgres::Error> {
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
            Some(Rejection {
                names_another_host: true,
                ..
            }) => TlsError::HostnameMismatch { host, source },
            Some(Rejection { reason, .. }) => TlsError::UntrustedCertificate {
                host,
                reason,
                source,
            },
            None => TlsError::Handshake { host, source },
        })
    }

    /// Whether a retry may succeed: a handshake whose connection was reset,
    /// aborted or cut short (a server restarting, a failover), not one
    /// that refused a certificate or a protocol.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        let TlsError::Handshake { source, .. } = self else {
            return false;
        };
        backend::io_cause(source.as_ref()).is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::TimedOut
            )
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

/// The client certificate file and its key file (`sslcert`, `sslkey`),
/// which are named together or not at all; either backend loads them.
fn client_pair(keys: &TlsKeys) -> Result<Option<(&str, &str)>, TlsError> {
    match (keys.cert.as_deref(), keys.key.as_deref()) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (Some(cert), None) => Err(TlsError::file(
            "sslcert",
            cert,
            "sslcert needs sslkey (its private key)",
        )),
        (None, Some(key)) => Err(TlsError::file(
            "sslkey",
            key,
            "sslkey needs sslcert (its certificate)",
        )),
    }
}

/// What the server's certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verify {
    Nothing,
    Chain,
    ChainAndHost,
}

/// A connection string, parsed and checked: the tokio-postgres
/// configuration and the connector that honours its TLS keys.
pub(super) struct Target {
    pub(super) config: Config,
    pub(super) connector: Connector,
}

impl Target {
    pub(super) fn parse(conninfo: &str) -> Result<Self> {
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
            return Err(ParseConnectionStringError::new(
                "sslrootcert=system needs sslmode=verify-full (or no sslmode)",
            )
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
    pub(super) fn bound_connect(&mut self, timeout: Duration) {
        if self.config.get_connect_timeout().is_none() {
            self.config.connect_timeout(timeout);
        }
    }
}

/// Opens connections with libpq's sslmode, fallbacks included: tokio-
/// postgres's `Prefer` falls back only when the server declines TLS, libpq
/// also when TLS fails or is refused, and `allow` tries plaintext first.
#[derive(Clone)]
pub(super) struct Connector {
    tls: MakeTls,
    mode: SslMode,
}

impl Connector {
    pub(super) async fn open(
        &self,
        config: &Config,
    ) -> Result<(Client, PgConnection), tokio_postgres::Error> {
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

/// Why the server's certificate was rejected, as the backend reports it.
#[derive(Debug, Clone)]
pub(super) struct Rejection {
    /// The certificate is good but covers another name (verify-full).
    names_another_host: bool,
    reason: String,
}

/// A failed TLS handshake, as tokio-postgres carries it (the cause of its
/// TLS error).
#[derive(Debug)]
pub(super) struct HandshakeError {
    host: String,
    rejected: Option<Rejection>,
    source: Box<dyn StdError + Send + Sync>,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS handshake with {:?} failed", self.host)?;
        if let Some(rejection) = &self.rejected {
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
    use crate::Error;

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

    #[cfg(feature = "rustls")]
    #[test]
    fn rustls_names_the_feature_an_encrypted_key_needs() {
        let dir = std::env::temp_dir().join(format!("loom-rustls-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("client.crt");
        std::fs::write(&cert, self_signed_pem()).unwrap();
        // No key rustls can read in it, as with a PKCS#8 key encrypted
        // under sslpassword.
        let key = dir.join("client.key");
        std::fs::write(
            &key,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        let conninfo = |password: &str| {
            format!(
                "host=db sslmode=require sslcert={} sslkey={} {password}",
                cert.display(),
                key.display()
            )
        };
        match target(&conninfo("sslpassword=secret")) {
            Err(Error::Tls(TlsError::File {
                key: "sslkey",
                source,
                ..
            })) => {
                assert!(source.to_string().contains("`openssl` feature"), "{source}");
            }
            other => panic!("expected the sslkey refused, got {:?}", other.err()),
        }
        match target(&conninfo("")) {
            Err(Error::Tls(TlsError::File {
                key: "sslkey",
                source,
                ..
            })) => {
                assert!(!source.to_string().contains("openssl"), "{source}");
            }
            other => panic!("expected the sslkey refused, got {:?}", other.err()),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A self-signed CA certificate (its key was thrown away once it had
    /// signed): any certificate will do as a root to load, under either
    /// backend.
    fn self_signed_pem() -> &'static str {
        "-----BEGIN CERTIFICATE-----\n\
         MIIBjzCCATWgAwIBAgIUR1K4HeNimb2s4yG14Umpgy6Un80wCgYIKoZIzj0EAwIw\n\
         HDEaMBgGA1UEAwwRbG9vbSB1bml0IHRlc3QgQ0EwIBcNMjYxMjAzMDYyNzI3WhgP\n\
         MjEyNjExMDkwNjI3MjdaMBwxGjAYBgNVBAMMEWxvb20gdW5pdCB0ZXN0IENBMFkw\n\
         EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEQLNli7mbZwGCXdTsID3U25Cm3PbAYvBt\n\
         9W9ntLExuF59n6DcvpyowcWCG6GK6P+GCc4P9c/vl+HOXsgIkrzCyqNTMFEwHQYD\n\
         VR0OBBYEFDcY4+Gq5j3If7piXlckMHZlIFkkMB8GA1UdIwQYMBaAFDcY4+Gq5j3I\n\
         f7piXlckMHZlIFkkMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIh\n\
         AIexFVpCVkmilpl8/J9QNynJdSvGLnJDs9cu7xBFjphLAiBsXPgEB/xOlQFFEKFl\n\
         NPUovWlW4ZQVF+QtN3LYzB6AdQ==\n\
         -----END CERTIFICATE-----\n"
    }
}
