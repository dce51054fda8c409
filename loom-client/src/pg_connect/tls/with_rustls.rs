//! TLS through rustls (with ring): no C library to link, for musl and
//! distroless images. The same sslmodes and the same [`TlsError`]s as the
//! OpenSSL backend; what rustls cannot read is refused by name (an
//! encrypted key: `sslpassword`). Certificates are checked by webpki's
//! rules, which differ from OpenSSL's at the edges (a self-signed CA as a
//! server certificate, a CN without subjectAltName, v1 certificates,
//! a root's own dates): docs/client.md lists them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{client_pair, HandshakeError, Rejection, TlsError, TlsKeys, Verify};

/// The stream of a connection over this backend.
pub(in crate::pg_connect) type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// The rustls connector for a connection string's TLS keys, built once per
/// pool (so certificate files are read once).
#[derive(Clone)]
pub(in crate::pg_connect) struct MakeTls {
    inner: MakeRustlsConnect,
    // rustls's verifier holds the check; the unit tests read it here.
    #[allow(dead_code)]
    pub(super) verify: Verify,
}

impl MakeTls {
    pub(super) fn new(keys: &TlsKeys, verify: Verify) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let setup = |e: rustls::Error| TlsError::Setup(e.into());
        // TLS 1.2 and 1.3: libpq's default ssl_min_protocol_version.
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(setup)?;
        let verifier: Arc<dyn ServerCertVerifier> = match verify {
            Verify::Nothing => Arc::new(EncryptOnly(Arc::clone(&provider))),
            Verify::Chain | Verify::ChainAndHost => {
                let roots = match keys.root_cert.as_deref() {
                    Some("system") => system_roots()?,
                    Some(path) => root_store(path)?,
                    None => unreachable!("Target::parse refuses verification without a root"),
                };
                let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Setup(e.into()))?;
                if verify == Verify::Chain {
                    Arc::new(ChainOnly(webpki))
                } else {
                    webpki
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match client_identity(keys)? {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::file("sslkey", keys.key.as_deref().unwrap_or(""), e))?,
            None => builder.with_no_client_auth(),
        };
        Ok(MakeTls {
            inner: MakeRustlsConnect::new(config),
            verify,
        })
    }
}

/// The certificates in a PEM file (a CA, or a bundle).
fn root_store(path: &str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in pem_certificates("sslrootcert", path)? {
        store
            .add(cert)
            .map_err(|e| TlsError::file("sslrootcert", path, e))?;
    }
    Ok(store)
}

/// The certificates of the PEM file named by connection string key `key`:
/// at least one.
fn pem_certificates(
    key: &'static str,
    path: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::file(key, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::file(key, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// `sslrootcert=system`: the platform's trusted roots. Finding none is an
/// error (a verification that could never pass), not an empty store.
fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (_, _) = store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        let why = match found.errors.first() {
            Some(e) => format!("no system root certificate found (sslrootcert=system): {e}"),
            None => "no system root certificate found (sslrootcert=system)".to_owned(),
        };
        return Err(TlsError::Setup(why.into()));
    }
    Ok(store)
}

/// The client certificate chain and its key (`sslcert`, `sslkey`), if the
/// string names them.
fn client_identity(
    keys: &TlsKeys,
) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, TlsError> {
    let Some((cert, key)) = client_pair(keys)? else {
        return Ok(None);
    };
    let chain = pem_certificates("sslcert", cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        if keys.password.is_some() {
            // rustls reads PKCS#8, PKCS#1 and SEC1 keys, none of them
            // encrypted.
            TlsError::file(
                "sslkey",
                key,
                format!(
                    "{e}: an encrypted key (sslpassword) needs pgloom's `openssl` \
                     feature; rustls reads unencrypted keys only"
                ),
            )
        } else {
            TlsError::file("sslkey", key, e)
        }
    })?;
    Ok(Some((chain, private)))
}

/// `sslmode=require` (or `prefer`) without a root: encrypted, the server
/// unauthenticated, as libpq does it. The handshake's signatures are still
/// checked, so the session is bound to the key the server presented.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain against the root, whatever name the certificate
/// covers. webpki checks the chain before the name, so a name error means
/// the chain verified.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(e) if names_another_host(&e) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A certificate that verified but covers another name.
fn names_another_host(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl MakeTlsConnect<Socket> for MakeTls {
    type Stream = Stream;
    type TlsConnect = Tls;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, host: &str) -> Result<Tls, Self::Error> {
        Ok(Tls {
            inner: MakeTlsConnect::<Socket>::make_tls_connect(&mut self.inner, host)?,
            host: host.to_owned(),
        })
    }
}

/// One connection's handshake, which reports its failure as a
/// [`HandshakeError`] that [`TlsError::from_postgres`] finds again.
pub(in crate::pg_connect) struct Tls {
    inner: <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect,
    host: String,
}

impl TlsConnect<Socket> for Tls {
    type Stream = Stream;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, HandshakeError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        let Tls { inner, host } = self;
        Box::pin(async move {
            inner
                .connect(stream)
                .await
                .map_err(|source| HandshakeError {
                    rejected: rejection(&source),
                    host,
                    source: source.into(),
                })
        })
    }
}

/// The certificate's rejection an I/O error of the handshake carries, if
/// that is why it failed (tokio-rustls wraps rustls's error in it).
fn rejection(e: &io::Error) -> Option<Rejection> {
    let rustls_error = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    match rustls_error {
        rustls::Error::InvalidCertificate(_) => Some(Rejection {
            names_another_host: names_another_host(rustls_error),
            reason: rustls_error.to_string(),
        }),
        _ => None,
    }
}

/// The I/O error under a failed handshake, if that is what failed
/// (tokio-rustls reports every failure as one; a protocol or certificate
/// error is `InvalidData`, which is not a transient kind).
pub(super) fn io_cause<'a>(
    source: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'a std::io::Error> {
    source.downcast_ref::<std::io::Error>()
}
