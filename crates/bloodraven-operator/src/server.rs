//! Listeners: the TLS listener of the deploy API (rustls, HTTP/1.1), the component listener
//! (mutual TLS, `componentTLS`) and the plain listener, each served by
//! [`bloodraven_runtime::serve`] (a connection per task, bounded handshakes).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot read TLS certificate chain {path}: {detail}")]
    Certificate { path: String, detail: String },
    #[error("cannot read TLS private key {path}: {detail}")]
    PrivateKey { path: String, detail: String },
    #[error("TLS configuration rejected: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {detail}")]
    Bind { addr: SocketAddr, detail: String },
}

/// A certificate chain and key from PEM bytes (`what` names their source in errors).
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    what: &str,
) -> Result<Arc<CertifiedKey>, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Certificate {
            path: what.to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ServerError::Certificate {
            path: what.to_string(),
            detail: "no certificate".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ServerError::PrivateKey {
        path: what.to_string(),
        detail: e.to_string(),
    })?;
    bloodraven_runtime::tls::install_crypto_provider();
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

/// The deploy API's certificate, swappable while the listener runs (a renewed Secret or file
/// is picked up without a restart).
#[derive(Debug)]
pub struct ReloadableCert {
    current: std::sync::RwLock<Arc<CertifiedKey>>,
}

impl ReloadableCert {
    pub fn new(first: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(ReloadableCert {
            current: std::sync::RwLock::new(first),
        })
    }

    pub fn replace(&self, next: Arc<CertifiedKey>) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }
}

/// A rustls acceptor serving whatever `cert` currently holds.
pub fn tls_acceptor_for(cert: Arc<ReloadableCert>) -> TlsAcceptor {
    bloodraven_runtime::tls::install_crypto_provider();
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// A rustls acceptor from PEM files (certificate chain, private key).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ServerError> {
    let read = |p: &Path, private: bool| {
        std::fs::read(p).map_err(|e| {
            let (path, detail) = (p.display().to_string(), e.to_string());
            if private {
                ServerError::PrivateKey { path, detail }
            } else {
                ServerError::Certificate { path, detail }
            }
        })
    };
    let ck = certified_key(
        &read(cert, false)?,
        &read(key, true)?,
        &cert.display().to_string(),
    )?;
    Ok(tls_acceptor_for(ReloadableCert::new(ck)))
}

/// Binds a TCP listener, naming the address on failure.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Bind {
            addr,
            detail: e.to_string(),
        })
}

pub use bloodraven_runtime::serve::{Transport, serve};
