//! Loopback TCP proxies that stand for network links, so the playground can cut and heal them.
//!
//! Every link that crosses "the network" in the playground goes through one: the operator's and
//! the replicas' connections to a site's MySQL, the sidecars' calls to the operator and to their
//! peers. Cutting a link closes its open connections and drops every new one at once (the peer
//! sees a reset); healing it lets connections through again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One link: listens on a loopback port and forwards to `target`.
#[derive(Debug)]
pub struct LinkProxy {
    pub name: String,
    pub listen: SocketAddr,
    pub target: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: open connections watch it and close.
    epoch: watch::Sender<u64>,
    connections: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Starts a proxy for `target` on `listen` (port 0: any free port).
    pub async fn start(
        name: &str,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> std::io::Result<LinkProxy> {
        let listener = TcpListener::bind(listen).await?;
        let listen = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (epoch, epoch_rx) = watch::channel(0u64);
        let connections = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            target,
            cut.clone(),
            epoch_rx,
            connections.clone(),
        ));
        Ok(LinkProxy {
            name: name.to_string(),
            listen,
            target,
            cut,
            epoch,
            connections,
            task,
        })
    }

    /// Cuts the link: open connections close, new ones are dropped.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Heals the link.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn port(&self) -> u16 {
        self.listen.port()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.epoch.send_modify(|e| *e += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: Arc<AtomicBool>,
    epoch: watch::Receiver<u64>,
    connections: Arc<AtomicU64>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if cut.load(Ordering::SeqCst) {
            drop(inbound);
            continue;
        }
        let mut epoch = epoch.clone();
        let started = *epoch.borrow_and_update();
        connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let _ = inbound.set_nodelay(true);
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            let _ = outbound.set_nodelay(true);
            let mut inbound = inbound;
            tokio::select! {
                _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                () = async {
                    loop {
                        if epoch.changed().await.is_err() || *epoch.borrow() != started {
                            return;
                        }
                    }
                } => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream) -> bool {
        if s.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(2), s.read_exact(&mut buf)).await,
            Ok(Ok(_))
        ) && &buf == b"ping"
    }

    #[tokio::test]
    async fn forwards_cuts_and_heals() {
        let target = echo_server().await;
        let p = LinkProxy::start("test", "127.0.0.1:0".parse().unwrap(), target)
            .await
            .unwrap();
        let mut a = TcpStream::connect(p.listen).await.unwrap();
        assert!(roundtrip(&mut a).await);
        p.cut();
        assert!(p.is_cut());
        assert!(
            !roundtrip(&mut a).await,
            "an open connection is closed by a cut"
        );
        let mut b = TcpStream::connect(p.listen).await.unwrap();
        assert!(
            !roundtrip(&mut b).await,
            "new connections are dropped while cut"
        );
        p.heal();
        let mut c = TcpStream::connect(p.listen).await.unwrap();
        assert!(roundtrip(&mut c).await);
        assert!(p.connections() >= 2);
    }
}
