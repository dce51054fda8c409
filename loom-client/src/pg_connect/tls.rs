//! The TLS a connection string asks for: its sslmode checked against its
//! keys and applied ([`Target`]), with libpq's fallbacks ([`Connector`]);
//! an OpenSSL connector built once from its certificate files
//! ([`MakeTls`]); and a failed handshake told apart by its cause
//! ([`TlsError`]).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
use tokio_postgres::{Client, Config, Socket};

use super::conninfo::{split, ParseConnectionStringError, Split, SslMode, TlsKeys};
use super::PgConnection;
use crate::Result;

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

/// What the server's certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
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
