//! Loopback TCP proxies that stand for network links, so the playground can cut and heal them.
//!
//! Every link that crosses "the network" in the playground goes through one: the operator's and
//! the replicas' connections to a site's MySQL, the sidecars' calls to the operator and to their
//! peers. Cutting a link closes its open connections and drops every new one at once (the peer
//! sees a reset); healing it lets connections through again. A delay holds every chunk of data
//! that crosses the link, in both directions, for that long (a slow or congested link).
//!
//! A proxy never looks inside what it carries (the database links are TLS): the parties that a
//! partition must tell apart — the operator's connections to a site's MySQL and the replicas'
//! — come through links of their own (a site's `mysql` address and its `replicationAddress`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One link: listens on a loopback port and forwards to `target`.
#[derive(Debug)]
pub struct LinkProxy {
    pub name: String,
    pub listen: SocketAddr,
    /// Where new connections go ([`Self::retarget`] moves it).
    target: Arc<std::sync::Mutex<SocketAddr>>,
    cut: Arc<AtomicBool>,
    /// Milliseconds every chunk is held before it is forwarded.
    delay_ms: Arc<AtomicU64>,
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
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (epoch, epoch_rx) = watch::channel(0u64);
        let connections = Arc::new(AtomicU64::new(0));
        let target = Arc::new(std::sync::Mutex::new(target));
        let task = tokio::spawn(accept_loop(
            listener,
            target.clone(),
            Link {
                cut: cut.clone(),
                delay_ms: delay_ms.clone(),
            },
            epoch_rx,
            connections.clone(),
        ));
        Ok(LinkProxy {
            name: name.to_string(),
            listen,
            target,
            cut,
            delay_ms,
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

    /// Sends new connections to `to` from now on and closes the open ones (a client that kept
    /// a connection to the old target reconnects, and reaches the new one). Nothing happens
    /// when the target is `to` already.
    pub fn retarget(&self, to: SocketAddr) {
        let mut t = self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *t != to {
            *t = to;
            drop(t);
            self.epoch.send_modify(|e| *e += 1);
        }
    }

    /// Where new connections go.
    pub fn target(&self) -> SocketAddr {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Heals the link.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Holds every chunk crossing the link for `delay` (zero: none) from now on, on open
    /// connections too.
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
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

/// What the accept loop and its connections share with the [`LinkProxy`].
#[derive(Clone)]
struct Link {
    cut: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
}

async fn accept_loop(
    listener: TcpListener,
    target: Arc<std::sync::Mutex<SocketAddr>>,
    link: Link,
    epoch: watch::Receiver<u64>,
    connections: Arc<AtomicU64>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if link.cut.load(Ordering::SeqCst) {
            drop(inbound);
            continue;
        }
        let mut epoch = epoch.clone();
        let started = *epoch.borrow_and_update();
        let target = *target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        connections.fetch_add(1, Ordering::Relaxed);
        let link = link.clone();
        tokio::spawn(async move {
            let _ = inbound.set_nodelay(true);
            let Ok(outbound) = TcpStream::connect(target).await else {
                return;
            };
            let _ = outbound.set_nodelay(true);
            let (mut in_r, mut in_w) = inbound.into_split();
            let (mut out_r, mut out_w) = outbound.into_split();
            tokio::select! {
                () = forward(&mut in_r, &mut out_w, &link.delay_ms) => {}
                () = forward(&mut out_r, &mut in_w, &link.delay_ms) => {}
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

/// Copies `from` to `to` until either side ends, holding each chunk for the link's delay.
async fn forward(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    delay_ms: &AtomicU64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let ms = delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server.
    async fn test_server() -> SocketAddr {
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

    /// A proxy in front of an echo server, and a connection through it that carried data.
    async fn linked() -> (LinkProxy, TcpStream) {
        let target = test_server().await;
        let p = LinkProxy::start("test", "127.0.0.1:0".parse().unwrap(), target)
            .await
            .unwrap();
        let mut a = TcpStream::connect(p.listen).await.unwrap();
        assert!(roundtrip(&mut a).await);
        (p, a)
    }

    #[tokio::test]
    async fn forwards_cuts_and_heals() {
        let (p, mut a) = linked().await;
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

    /// A server that says `tag` to each connection, then keeps it open.
    async fn tagging_server(tag: u8) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let _ = s.write_all(&[tag]).await;
                    let mut buf = [0u8; 8];
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        addr
    }

    async fn first_byte(s: &mut TcpStream) -> Option<u8> {
        let mut b = [0u8; 1];
        match tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut b)).await {
            Ok(Ok(1)) => Some(b[0]),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_retarget_sends_new_connections_to_the_new_target_and_closes_the_open_ones() {
        let (a, b) = (tagging_server(b'a').await, tagging_server(b'b').await);
        let p = LinkProxy::start("front", "127.0.0.1:0".parse().unwrap(), a)
            .await
            .unwrap();
        let mut old = TcpStream::connect(p.listen).await.unwrap();
        assert_eq!(first_byte(&mut old).await, Some(b'a'));
        p.retarget(a);
        let mut same = TcpStream::connect(p.listen).await.unwrap();
        assert_eq!(first_byte(&mut same).await, Some(b'a'));
        let mut b1 = [0u8; 1];
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), old.read(&mut b1))
                .await
                .is_err(),
            "retargeting to the same target closes nothing (the read waits, no end of stream)"
        );
        p.retarget(b);
        assert_eq!(p.target(), b);
        assert_eq!(
            first_byte(&mut old).await,
            None,
            "a connection to the old target is closed"
        );
        let mut new = TcpStream::connect(p.listen).await.unwrap();
        assert_eq!(first_byte(&mut new).await, Some(b'b'));
    }

    #[tokio::test]
    async fn a_delay_holds_data_both_ways_on_open_connections() {
        let (p, mut a) = linked().await;
        p.set_delay(std::time::Duration::from_millis(300));
        let started = tokio::time::Instant::now();
        assert!(roundtrip(&mut a).await, "a delayed link still carries data");
        // Held once on the way out and once on the way back: never faster than that.
        assert!(started.elapsed() >= std::time::Duration::from_millis(600));
        p.set_delay(std::time::Duration::ZERO);
        assert!(roundtrip(&mut a).await);
    }
}
