//! Serving an axum router over plain TCP, TLS, or component mutual TLS (feature `server`).
//!
//! Each connection runs in its own task; a TLS handshake that does not finish within
//! [`HANDSHAKE_TIMEOUT`] is dropped, so slow clients cannot hold the accept loop. On a
//! component listener every request carries the caller's certificate chain as a
//! [`PeerCertificates`] extension (empty without one); handlers decide with
//! [`crate::mtls::ComponentTls::authorize`] whether the caller is the party they need.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::mtls::ComponentTls;

/// Longest TLS handshake accepted.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a request's head on a kept-alive connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate chain the caller presented in its TLS handshake (leaf first), unverified:
/// only [`ComponentTls::authorize`] says who it is.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificates(pub Option<Arc<Vec<CertificateDer<'static>>>>);

impl PeerCertificates {
    pub fn chain(&self) -> Option<&[CertificateDer<'static>]> {
        self.0.as_deref().map(Vec::as_slice)
    }
}

/// How a listener speaks.
#[derive(Clone)]
pub enum Transport {
    /// Plain HTTP.
    Plain,
    /// TLS with a fixed or self-reloading server configuration, no client certificates (the
    /// deploy API).
    Tls(TlsAcceptor),
    /// Component mutual TLS: client certificates asked for, optional, handed to handlers.
    Component(Arc<ComponentTls>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Plain => "Plain",
            Transport::Tls(_) => "Tls",
            Transport::Component(_) => "Component",
        })
    }
}

async fn serve_connection<I>(io: I, router: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = TowerToHyperService::new(router);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// Serves `router` on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    transport: Transport,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let router = router.clone();
                match &transport {
                    Transport::Plain => {
                        tokio::spawn(serve_connection(tcp, router));
                    }
                    Transport::Tls(acceptor) => {
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                                serve_connection(tls, router).await;
                            }
                        });
                    }
                    Transport::Component(tls) => {
                        let acceptor = TlsAcceptor::from(tls.server_config());
                        tokio::spawn(async move {
                            let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                                return;
                            };
                            let peer = PeerCertificates(
                                stream.get_ref().1.peer_certificates().map(|c| Arc::new(c.to_vec())),
                            );
                            serve_connection(stream, router.layer(axum::Extension(peer))).await;
                        });
                    }
                }
            }
            changed = shutdown.changed() => {
                // A dropped sender stops the listener too.
                if changed.is_err() || *shutdown.borrow() { return; }
            }
        }
    }
}
