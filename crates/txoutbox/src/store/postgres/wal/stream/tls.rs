//! TLS for the replication connection, as libpq's `sslmode` names it: `require` encrypts
//! without checking the certificate, `verify-ca` checks the chain but not the host name,
//! `verify-full` both; `sslrootcert` (or the system's roots), `sslcert` and `sslkey`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use super::{ReplicationConfig, SslMode};
use crate::store::postgres::wal::WalError;

pub(super) fn tls_config(cfg: &ReplicationConfig) -> Result<rustls::ClientConfig, WalError> {
    let tls_err = |e: rustls::Error| WalError::Config(format!("TLS setup: {e}"));
    // ring, named here: the process may hold more than one rustls provider, and then the
    // default one is not chosen for us.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match cfg.ssl_mode {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(cfg.ssl_root_cert.as_deref())?);
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots,
                provider.clone(),
            )
            .build()
            .map_err(|e| WalError::Config(format!("TLS setup: {e}")))?;
            if cfg.ssl_mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(Lenient {
                    chain: Some(webpki),
                    algorithms,
                })
            }
        }
        _ => Arc::new(Lenient {
            chain: None,
            algorithms,
        }),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&cfg.ssl_cert, &cfg.ssl_key) {
        (Some(cert), Some(key)) => {
            let certs = read_certs(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                WalError::Config(format!(
                    "sslkey {}: no private key read ({e}); give a PEM key file",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| WalError::Config(format!("sslcert/sslkey: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, WalError> {
    let bad = |e: String| {
        WalError::Config(format!(
            "{what} {}: {e}; give a PEM file of certificates",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    Ok(certs)
}

/// The trusted roots: `sslrootcert`'s, or the system's.
fn roots(file: Option<&Path>) -> Result<rustls::RootCertStore, WalError> {
    let mut roots = rustls::RootCertStore::empty();
    match file {
        Some(path) => {
            for cert in read_certs(path, "sslrootcert")? {
                roots.add(cert).map_err(|e| {
                    WalError::Config(format!("sslrootcert {}: {e}", path.display()))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(WalError::Config(
                    "sslmode verify-ca/verify-full: no trusted roots found on the system; give \
                     sslrootcert=<PEM file of the server's CA>"
                        .into(),
                ));
            }
        }
    }
    Ok(roots)
}

/// What libpq's `sslmode` checks short of `verify-full`: with `chain` (`verify-ca`) the
/// chain must lead to a trusted root and the name is not checked; without (`prefer`,
/// `require`) any certificate goes. Either way the handshake's signatures are checked, so the
/// server holds the certificate's key.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    /// The provider's, as the chain's verifier checks signatures with.
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The name is checked last, once the chain is verified.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
