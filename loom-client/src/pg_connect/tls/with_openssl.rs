//! TLS through OpenSSL (`postgres-openssl`): libpq's own library, so
//! certificates, encrypted keys (`sslpassword`) and the system's roots
//! behave as they do in psql.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use super::{client_pair, HandshakeError, Rejection, TlsError, TlsKeys, Verify};

/// The stream of a connection over this backend.
pub(in crate::pg_connect) type Stream = postgres_openssl::TlsStream<Socket>;

/// The OpenSSL connector for a connection string's TLS keys, built once
/// per pool (so certificate files are read once).
#[derive(Clone)]
pub(in crate::pg_connect) struct MakeTls {
    connector: SslConnector,
    pub(super) verify: Verify,
}

impl MakeTls {
    pub(super) fn new(keys: &TlsKeys, verify: Verify) -> Result<Self, TlsError> {
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
        if let Some((cert, key)) = client_pair(keys)? {
            builder
                .set_certificate_chain_file(cert)
                .map_err(|e| TlsError::file("sslcert", cert, e))?;
            match &keys.password {
                None => builder.set_private_key_file(key, SslFiletype::PEM),
                Some(password) => {
                    let pem = std::fs::read(key).map_err(|e| TlsError::file("sslkey", key, e))?;
                    let pkey = PKey::private_key_from_pem_passphrase(&pem, password.as_bytes())
                        .map_err(|e| TlsError::file("sslkey", key, e))?;
                    builder.set_private_key(&pkey)
                }
            }
            .and_then(|()| builder.check_private_key())
            .map_err(|e| TlsError::file("sslkey", key, e))?;
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
    type Stream = Stream;
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
                    let code = error.as_raw();
                    slot.lock()
                        .expect("never poisoned")
                        .get_or_insert_with(|| Rejection {
                            names_another_host: code == openssl_sys::X509_V_ERR_HOSTNAME_MISMATCH
                                || code == openssl_sys::X509_V_ERR_IP_ADDRESS_MISMATCH,
                            reason: error.error_string().to_owned(),
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

/// One connection's handshake, which reports its failure as a
/// [`HandshakeError`] that [`TlsError::from_postgres`] finds again.
pub(in crate::pg_connect) struct Tls {
    inner: postgres_openssl::TlsConnector,
    host: String,
    rejected: Arc<Mutex<Option<Rejection>>>,
}

impl TlsConnect<Socket> for Tls {
    type Stream = Stream;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, HandshakeError>> + Send>>;

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
                    rejected: rejected.lock().expect("never poisoned").take(),
                    source,
                })
        })
    }
}

/// The I/O error under a failed handshake, if that is what failed.
pub(super) fn io_cause<'a>(
    source: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'a std::io::Error> {
    source
        .downcast_ref::<std::io::Error>()
        .or_else(|| source.downcast_ref::<openssl::ssl::Error>()?.io_error())
}
