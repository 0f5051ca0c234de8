//! Loopback TCP proxies that stand for network links, so the playground can cut and heal them.
//!
//! Every link that crosses "the network" in the playground goes through one: the operator's and
//! the replicas' connections to a site's MySQL, the sidecars' calls to the operator and to their
//! peers. Cutting a link closes its open connections and drops every new one at once (the peer
//! sees a reset); healing it lets connections through again. A delay holds every chunk of data
//! that crosses the link, in both directions, for that long (a slow or congested link).
//!
//! A link to a MySQL server carries several parties at once: the operator's connections and
//! the replicas' replication connections both reach a site's server at the address the
//! operator knows it by. On a real network they come from different places, so a partition can
//! cut one and spare the other. A MySQL link ([`LinkProxy::start_mysql`]) tells them apart by
//! the account each connection authenticates as (read from the client's handshake response,
//! held back until it is read), and can cut one account's connections only
//! ([`LinkProxy::cut_account`]).

use std::collections::BTreeSet;
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
    /// Accounts whose connections are cut (MySQL links only).
    accounts: watch::Sender<BTreeSet<String>>,
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
        Self::start_with(name, listen, target, false).await
    }

    /// Starts a proxy for the MySQL server at `target` that knows each connection's account,
    /// so [`Self::cut_account`] can cut one party's connections and spare the others'.
    pub async fn start_mysql(
        name: &str,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> std::io::Result<LinkProxy> {
        Self::start_with(name, listen, target, true).await
    }

    async fn start_with(
        name: &str,
        listen: SocketAddr,
        target: SocketAddr,
        mysql: bool,
    ) -> std::io::Result<LinkProxy> {
        let listener = TcpListener::bind(listen).await?;
        let listen = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (epoch, epoch_rx) = watch::channel(0u64);
        let (accounts, accounts_rx) = watch::channel(BTreeSet::new());
        let connections = Arc::new(AtomicU64::new(0));
        let target = Arc::new(std::sync::Mutex::new(target));
        let task = tokio::spawn(accept_loop(
            listener,
            target.clone(),
            Link {
                cut: cut.clone(),
                delay_ms: delay_ms.clone(),
                mysql,
                accounts: accounts_rx,
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
            accounts,
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

    /// Cuts the connections that authenticate as MySQL account `user` (a MySQL link only):
    /// open ones close, new ones are dropped before their handshake reaches the server. Other
    /// accounts' connections go on.
    pub fn cut_account(&self, user: &str) {
        self.accounts.send_modify(|a| {
            a.insert(user.to_string());
        });
    }

    /// Lets account `user`'s connections through again.
    pub fn heal_account(&self, user: &str) {
        self.accounts.send_modify(|a| {
            a.remove(user);
        });
    }

    /// Whether account `user`'s connections are cut, by [`Self::cut`] or [`Self::cut_account`].
    pub fn is_cut_for(&self, user: &str) -> bool {
        self.is_cut() || self.accounts.borrow().contains(user)
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
    /// Read each connection's MySQL account before forwarding it.
    mysql: bool,
    accounts: watch::Receiver<BTreeSet<String>>,
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
            let mut accounts = link.accounts.clone();
            let account = if link.mysql {
                // The server speaks first (its greeting); the client's first packet names the
                // account. Nothing of the client's reaches the server before it is read.
                let greeted = tokio::select! {
                    first = handshake_response(&mut in_r) => first,
                    () = forward(&mut out_r, &mut in_w, &link.delay_ms) => None,
                };
                let Some((bytes, account)) = greeted else {
                    return;
                };
                // Marks the current cuts seen: a later cut wakes the watcher below.
                let cut_now = account
                    .as_ref()
                    .is_some_and(|a| accounts.borrow_and_update().contains(a));
                if link.cut.load(Ordering::SeqCst) || cut_now {
                    return;
                }
                if tokio::io::AsyncWriteExt::write_all(&mut out_w, &bytes)
                    .await
                    .is_err()
                {
                    return;
                }
                account
            } else {
                None
            };
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
                () = async {
                    loop {
                        if accounts.changed().await.is_err() {
                            return std::future::pending().await;
                        }
                        if account.as_ref().is_some_and(|a| accounts.borrow().contains(a)) {
                            return;
                        }
                    }
                } => {}
            }
        });
    }
}

/// Reads a MySQL client's first packet (its handshake response) and the account it names:
/// `None` for the account when it cannot be read (a TLS request, a pre-4.1 client), `None`
/// altogether when the connection ends first.
async fn handshake_response(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(Vec<u8>, Option<String>)> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 4];
    from.read_exact(&mut header).await.ok()?;
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    let mut bytes = header.to_vec();
    bytes.resize(4 + len, 0);
    from.read_exact(&mut bytes[4..]).await.ok()?;
    let account = account_of(&bytes[4..]);
    Some((bytes, account))
}

/// The user name in a protocol-4.1 handshake response payload: after the capability flags
/// (4 bytes), the maximum packet size (4), the character set (1) and 23 reserved bytes, up to a
/// NUL. A 32-byte payload is a TLS request, which names no one.
fn account_of(payload: &[u8]) -> Option<String> {
    const CLIENT_PROTOCOL_41: u32 = 0x200;
    let flags = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?);
    if flags & CLIENT_PROTOCOL_41 == 0 || payload.len() <= 32 {
        return None;
    }
    let name = &payload[32..];
    let end = name.iter().position(|b| *b == 0)?;
    String::from_utf8(name[..end].to_vec()).ok()
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

    /// An echo server; with `mysql`, it first greets like MySQL (one packet) and reads the
    /// client's first packet, as a MySQL server would before any command.
    async fn test_server(mysql: bool) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    if mysql
                        && (s
                            .write_all(&[5, 0, 0, 0, 10, b'1', b'1', b'.', 0])
                            .await
                            .is_err()
                            || handshake_response(&mut s).await.is_none())
                    {
                        return;
                    }
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
        let target = test_server(false).await;
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

    /// A protocol-4.1 handshake response naming `user`.
    fn response(user: &str) -> Vec<u8> {
        let mut p = 0x0000_0200u32.to_le_bytes().to_vec();
        p.extend([0u8; 28]);
        p.extend(user.as_bytes());
        p.push(0);
        p.extend([0u8; 3]);
        let len = u32::try_from(p.len()).unwrap().to_le_bytes();
        let mut packet = vec![len[0], len[1], len[2], 1];
        packet.extend(p);
        packet
    }

    async fn connect_as(p: &LinkProxy, user: &str) -> Option<TcpStream> {
        let mut s = TcpStream::connect(p.listen).await.ok()?;
        let mut greeting = [0u8; 9];
        tokio::time::timeout(
            std::time::Duration::from_secs(2),
            s.read_exact(&mut greeting),
        )
        .await
        .ok()?
        .ok()?;
        s.write_all(&response(user)).await.ok()?;
        Some(s)
    }

    #[test]
    fn reads_the_account_of_a_handshake_response_and_nothing_else() {
        assert_eq!(account_of(&response("repl")[4..]).as_deref(), Some("repl"));
        // A TLS request (32 bytes) names no one; neither does a truncated or pre-4.1 packet.
        assert_eq!(account_of(&response("repl")[4..36]), None);
        assert_eq!(account_of(&[0, 2]), None);
        let mut old = response("repl");
        old[5] = 0;
        assert_eq!(account_of(&old[4..]), None);
    }

    #[tokio::test]
    async fn a_mysql_link_cuts_one_account_and_spares_the_others() {
        let target = test_server(true).await;
        let p = LinkProxy::start_mysql("test", "127.0.0.1:0".parse().unwrap(), target)
            .await
            .unwrap();
        let mut repl = connect_as(&p, "repl").await.unwrap();
        let mut operator = connect_as(&p, "failover").await.unwrap();
        assert!(roundtrip(&mut repl).await);
        assert!(roundtrip(&mut operator).await);

        p.cut_account("repl");
        assert!(p.is_cut_for("repl") && !p.is_cut_for("failover"));
        assert!(
            !roundtrip(&mut repl).await,
            "the cut account's connection closes"
        );
        assert!(roundtrip(&mut operator).await, "another account's goes on");
        let mut again = connect_as(&p, "repl").await.unwrap();
        assert!(
            !roundtrip(&mut again).await,
            "a new connection of the cut account is dropped"
        );
        let mut other = connect_as(&p, "failover").await.unwrap();
        assert!(roundtrip(&mut other).await);

        p.heal_account("repl");
        let mut healed = connect_as(&p, "repl").await.unwrap();
        assert!(roundtrip(&mut healed).await);
        // A full cut still cuts everyone.
        p.cut();
        assert!(!roundtrip(&mut operator).await);
        assert!(p.is_cut_for("failover"));
    }
}
