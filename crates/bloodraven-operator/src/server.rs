//! Listeners: the TLS listener of the deploy API (rustls, HTTP/1.1) and the plain listener.
//! Each connection runs in its own task; a TLS handshake that does not finish within
//! [`HANDSHAKE_TIMEOUT`] is dropped, so slow clients cannot hold the accept loop.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Longest TLS handshake accepted.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A rustls acceptor from PEM files (certificate chain, private key).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| ServerError::Certificate {
            path: cert.display().to_string(),
            detail: e.to_string(),
        })?
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Certificate {
            path: cert.display().to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ServerError::Certificate {
            path: cert.display().to_string(),
            detail: "no certificate in the file".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ServerError::PrivateKey {
        path: key.display().to_string(),
        detail: e.to_string(),
    })?;
    bloodraven_runtime::tls::install_crypto_provider();
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
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

async fn serve_connection<I>(io: I, router: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = TowerToHyperService::new(router);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// Serves `router` until `shutdown` turns true: over TLS with `tls` (a handshake gets
/// `HANDSHAKE_TIMEOUT`), plain HTTP without.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let router = router.clone();
                match tls.clone() {
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                                serve_connection(tls, router).await;
                            }
                        });
                    }
                    None => {
                        tokio::spawn(serve_connection(tcp, router));
                    }
                }
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() { return; }
            }
        }
    }
}
