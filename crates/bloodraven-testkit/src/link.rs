//! A TCP link that a test can cut and heal: a loopback listener that forwards every
//! connection to one upstream address. Cut, it closes the connections it carries and every
//! new one at once (the client sees its peer go away, as when a network path fails and a
//! middlebox resets it); healed, it forwards again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Default)]
struct State {
    cut: AtomicBool,
    connections: Mutex<Vec<JoinHandle<()>>>,
}

/// A cuttable link to one upstream address. Dropping it closes everything it carries.
pub struct Link {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("cut", &self.is_cut())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Listens on a loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let s = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    // Out of descriptors, say: wait rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                // Checked and recorded under the lock a cut takes: no connection slips by.
                let mut conns = s.connections.lock().unwrap_or_else(PoisonError::into_inner);
                if s.cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.retain(|c| !c.is_finished());
                conns.push(conn);
            }
        });
        Ok(Link {
            addr,
            upstream,
            state,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the link: from now on new connections are closed at once, and when this returns
    /// every connection it carried is closed (nothing more passes either way).
    pub async fn cut(&self) {
        for c in self.take_connections() {
            c.abort();
            let _ = c.await;
        }
    }

    fn take_connections(&self) -> Vec<JoinHandle<()>> {
        let mut conns = self
            .state
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.state.cut.store(true, Ordering::SeqCst);
        std::mem::take(&mut *conns)
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.state.cut.load(Ordering::SeqCst)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.take_connections() {
            c.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo() -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        (addr, task)
    }

    async fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn a_cut_link_closes_its_connections_and_a_healed_one_forwards() {
        let (upstream, _echo) = echo().await;
        let link = Link::start(upstream).await.unwrap();
        assert_eq!(round_trip(link.addr()).await.unwrap(), b"ping");
        let mut open = TcpStream::connect(link.addr()).await.unwrap();
        open.write_all(b"ab").await.unwrap();
        let mut two = [0u8; 2];
        open.read_exact(&mut two).await.unwrap();
        link.cut().await;
        let mut rest = Vec::new();
        let read = open.read_to_end(&mut rest).await;
        assert!(
            read.is_err() || rest.is_empty(),
            "the carried connection is closed"
        );
        assert!(round_trip(link.addr()).await.is_err(), "new ones too");
        link.heal();
        assert_eq!(round_trip(link.addr()).await.unwrap(), b"ping");
    }
}
