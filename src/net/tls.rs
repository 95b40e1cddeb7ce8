//! TLS configurations, built once before a run starts (so a bad certificate or CA file is
//! an input error before any output exists): the client side for https workers, the
//! server side for serve's `--tls-cert`. Reads the PEM files it is named; nothing else.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::{Error as PemError, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// TLS settings for https workers.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsOptions {
    /// PEM file of CA certificates to trust instead of the platform's roots.
    pub(crate) ca_file: Option<std::path::PathBuf>,
}

/// Why a TLS configuration could not be built; each names the flag or file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("{path}: invalid CA certificate: {err}")]
    CaCertificate {
        path: std::path::PathBuf,
        #[source]
        err: rustls::Error,
    },
    #[error("no platform CA certificates found; pass --ca-cert FILE to trust a CA")]
    NoPlatformRoots,
    #[error("tls configuration: {0}")]
    Config(#[source] rustls::Error),
    #[error("--tls-key {path}: no usable PEM private key: {err}")]
    Key {
        path: std::path::PathBuf,
        #[source]
        err: PemError,
    },
    /// The certificate chain and key do not make a server identity.
    #[error("--tls-cert/--tls-key: {0}")]
    CertAndKey(#[source] rustls::Error),
    /// `at`: the flag (if any) and the file.
    #[error("{at}: cannot read certificates: {err}")]
    Unreadable {
        at: String,
        #[source]
        err: PemError,
    },
    #[error("{at}: not a PEM certificate file: {err}")]
    NotPem {
        at: String,
        #[source]
        err: PemError,
    },
    #[error("{at}: contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate { at: String },
}

/// The client config for https workers: the CA file's roots, or the platform's; HTTP/1.1
/// by ALPN; the ring provider.
pub(crate) fn client_config(opts: &TlsOptions) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match &opts.ca_file {
        Some(path) => {
            for c in pem_certificates(path, "")? {
                roots.add(c).map_err(|err| TlsError::CaCertificate {
                    path: path.clone(),
                    err,
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
            if roots.is_empty() {
                return Err(TlsError::NoPlatformRoots);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The acceptor for serving clients over TLS from a PEM certificate chain and key
/// (`--tls-cert`, `--tls-key`). Errors name the flag and the file.
pub(crate) fn server_acceptor(
    cert: &Path,
    key: &Path,
) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let certs = pem_certificates(cert, "--tls-cert ")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|err| TlsError::Key {
        path: key.to_path_buf(),
        err,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::CertAndKey)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The certificates of a PEM file; errors start with `flag` and the path, and say what a
/// usable file looks like.
fn pem_certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let at = format!("{flag}{}", path.display());
    let certs: Vec<CertificateDer<'static>> = match CertificateDer::pem_file_iter(path) {
        Ok(iter) => iter
            .collect::<Result<_, _>>()
            .map_err(|err| TlsError::NotPem {
                at: at.clone(),
                err,
            })?,
        Err(err) => return Err(TlsError::Unreadable { at, err }),
    };
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { at });
    }
    Ok(certs)
}
