//! TLS terminated by the server itself (rustls, with ring's cryptography), for deployments
//! without a proxy in front: `osprey serve --tls-cert cert.pem --tls-key key.pem`. TLS 1.2 and
//! 1.3 with rustls's safe defaults; HTTP/1.1 inside (ALPN `http/1.1`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use rustls::ServerConfig;

/// A certificate or key that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file that could not be read or holds nothing usable.
    #[error("{path}: {why}")]
    Pem {
        /// The file.
        path: String,
        /// What was wrong.
        why: String,
    },
    /// rustls refused the pair (a key that is not the certificate's, say).
    #[error("the certificate and key cannot be used together: {0}")]
    Config(#[from] rustls::Error),
}

/// The server's TLS settings from a PEM certificate chain (leaf first) and its PEM private key
/// (PKCS#8, PKCS#1 or SEC1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let pem = |path: &Path, why: String| TlsError::Pem {
        path: path.display().to_string(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem(cert, "no certificate in it".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
