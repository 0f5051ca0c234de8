//! The playground's control plane: the operator processes and where they keep the group.
//!
//! With the embedded store (the default) one operator runs, on the printed operator and
//! deploy ports. With `--store etcd` three etcd members run on private loopback ports (Debian's
//! `etcd`, started by [`bloodraven_launch::etcd`]) and two operators share them, each with
//! its own data directory and ports. The printed ports are then [`Fronts`]: loopback proxies
//! that send every new connection to whichever operator says it leads (`/readyz`:
//! `"leader": true` with its groups loaded), and close the open ones when the leader changes,
//! so the printed addresses keep working after the leading operator dies, as a load balancer
//! with a health check would keep them working in front of operators on several machines.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bloodraven_launch::etcd::{EtcdCluster, LaunchOptions, distinct_ports};
use bloodraven_launch::local::LocalFiles;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::errors::PlaygroundError;
use crate::proxy::LinkProxy;

/// How many etcd members `--store etcd` starts.
pub const ETCD_MEMBERS: usize = 3;
/// `store.etcd.leaseTTL` of the playground's operators: a standby leads this long after the
/// leader stopped renewing, plus its next campaign.
pub const ETCD_LEASE_TTL: &str = "3s";
/// The members' Raft timings: short, for a playground on one machine (etcd's defaults are
/// 100 ms and 1 s too).
const ETCD_HEARTBEAT_MS: u32 = 100;
const ETCD_ELECTION_MS: u32 = 1_000;
/// How often the fronts ask every operator whether it leads.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// Where the operators keep the group (`bloodraven playground --store`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreChoice {
    /// One operator, SQLite in its data directory.
    #[default]
    Embedded,
    /// Three etcd members and two operators.
    Etcd,
}

impl StoreChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreChoice::Embedded => "embedded",
            StoreChoice::Etcd => "etcd",
        }
    }
}

/// One operator process: its files, its own ports and its log.
#[derive(Debug)]
pub struct OperatorProc {
    /// `operator-1`, `operator-2`.
    pub name: String,
    pub files: LocalFiles,
    /// Its own plain-HTTP and deploy API ports (the printed ones with the embedded store).
    pub http: u16,
    pub https: u16,
    pub log: PathBuf,
    /// Tests only: the failpoints file it reads (`BLOODRAVEN_TEST_FAILPOINTS`).
    failpoints: Option<PathBuf>,
    child: Option<Child>,
}

impl OperatorProc {
    pub fn new(name: &str, files: LocalFiles, http: u16, https: u16, log: PathBuf) -> Self {
        OperatorProc {
            name: name.to_string(),
            files,
            http,
            https,
            log,
            failpoints: None,
            child: None,
        }
    }

    /// The same process, reading test failpoints from `file` (tests only).
    #[must_use]
    pub fn with_failpoints(mut self, file: Option<PathBuf>) -> Self {
        self.failpoints = file;
        self
    }

    /// Whether the process runs (it may be paused).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn pid(&mut self) -> Option<u32> {
        if self.running() {
            self.child.as_ref().and_then(Child::id)
        } else {
            None
        }
    }

    /// Starts the process unless it runs.
    pub fn spawn(&mut self, exe: &Path) -> Result<(), PlaygroundError> {
        if self.running() {
            return Ok(());
        }
        let log = crate::errors::open_log(&self.log)?;
        let mut cmd = Command::new(exe);
        if let Some(f) = &self.failpoints {
            cmd.env(bloodraven_operator::failpoints::ENV, f);
        }
        let child = cmd
            .args(["operator", "--config"])
            .arg(&self.files.config)
            .env("BLOODRAVEN_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| PlaygroundError::Io {
                what: format!("start {}", self.name),
                detail: e.to_string(),
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// `SIGTERM`, then `SIGKILL` after 10 s.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c).await;
        }
    }

    /// `SIGKILL`, and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}

/// What the operator on `port` answers on `/readyz`: `None` when it does not answer at all,
/// else whether it leads with its groups loaded (readiness alone does not say that a replica
/// leads).
pub async fn readyz(http: &reqwest::Client, port: u16) -> Option<bool> {
    let r = http
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .ok()?;
    let ok = r.status().is_success();
    let v = r.json::<serde_json::Value>().await.unwrap_or_default();
    Some(ok && v["leader"] == true && v["loaded"] == true)
}

/// Whether the operator on `port` leads with its groups loaded.
pub async fn leads(http: &reqwest::Client, port: u16) -> bool {
    readyz(http, port).await == Some(true)
}

/// A client for the leadership checks: short timeouts, so a paused operator does not hold
/// the others' checks up.
pub fn check_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap_or_default()
}

/// The printed operator and deploy ports in front of several operators: each new connection
/// goes to the operator that leads.
#[derive(Debug)]
pub struct Fronts {
    pub http: LinkProxy,
    pub https: LinkProxy,
    /// Every operator's own (http, https) port, by index.
    ports: Vec<(u16, u16)>,
    /// The index of the operator the fronts send to; `usize::MAX` before the first check.
    followed: AtomicUsize,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Fronts {
    /// Listens on `http` and `https` (the printed ports), in front of the operators on
    /// `ports`; until one leads, connections go to the first.
    pub async fn start(
        http: u16,
        https: u16,
        ports: Vec<(u16, u16)>,
    ) -> Result<Fronts, PlaygroundError> {
        let first = ports.first().copied().ok_or_else(|| {
            PlaygroundError::Other("fronts need at least one operator behind them".into())
        })?;
        let io = |e: std::io::Error| PlaygroundError::Io {
            what: "listen on the operator's printed ports".into(),
            detail: e.to_string(),
        };
        Ok(Fronts {
            http: LinkProxy::start("operator", loopback(http), loopback(first.0))
                .await
                .map_err(io)?,
            https: LinkProxy::start("deploy API", loopback(https), loopback(first.1))
                .await
                .map_err(io)?,
            ports,
            followed: AtomicUsize::new(usize::MAX),
        })
    }

    /// Sends new connections to operator `i` (its open ones to another close).
    pub fn follow(&self, i: usize) {
        if let Some(&(http, https)) = self.ports.get(i) {
            self.followed.store(i, Ordering::SeqCst);
            self.http.retarget(loopback(http));
            self.https.retarget(loopback(https));
        }
    }

    /// The operator the fronts send to (the leader, or while none leads one that answers).
    pub fn followed(&self) -> Option<usize> {
        let i = self.followed.load(Ordering::SeqCst);
        (i < self.ports.len()).then_some(i)
    }

    /// Asks every operator whether it leads, every 100 ms, and follows the one that does,
    /// until the fronts are dropped. While none leads, the fronts go to one that answers at
    /// all (it says `503 not_leader`, as it would to any client) rather than to one that is
    /// gone (a refused connection says nothing).
    pub async fn keep_following(fronts: Weak<Fronts>) {
        let http = check_client();
        loop {
            let Some(f) = fronts.upgrade() else { return };
            let ports = f.ports.clone();
            let followed = f.followed();
            drop(f);
            let mut answers = Vec::with_capacity(ports.len());
            for (port, _) in &ports {
                answers.push(readyz(&http, *port).await);
            }
            let Some(f) = fronts.upgrade() else { return };
            if let Some(i) = answers.iter().position(|a| *a == Some(true)) {
                if followed != Some(i) {
                    tracing::info!(
                        operator = i + 1,
                        "playground: the operator and deploy API ports follow the new leader"
                    );
                }
                f.follow(i);
            } else if followed.is_none_or(|i| answers.get(i).is_some_and(Option::is_none))
                && let Some(i) = answers.iter().position(Option::is_some)
            {
                f.follow(i);
            }
            drop(f);
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}

/// Starts the etcd members under `dir` (kept: the playground's directory decides what stays),
/// on `ports` when a kept directory saved them, else on free ones.
pub async fn start_etcd(
    dir: &Path,
    ports: Option<Vec<(u16, u16)>>,
) -> Result<EtcdCluster, PlaygroundError> {
    let ports = match ports.filter(|p| p.len() == ETCD_MEMBERS) {
        Some(p) => p,
        None => distinct_ports(ETCD_MEMBERS, bloodraven_launch::mysql::free_port)
            .map_err(|e| PlaygroundError::Etcd(e.to_string()))?,
    };
    let mut opts = LaunchOptions::new(dir.to_path_buf(), ports);
    opts.keep = true;
    opts.heartbeat_ms = ETCD_HEARTBEAT_MS;
    opts.election_ms = ETCD_ELECTION_MS;
    EtcdCluster::launch(opts)
        .await
        .map_err(|e| PlaygroundError::Etcd(e.to_string()))
}

/// Every member's (client, peer) port, to keep them across runs.
pub fn member_ports(c: &EtcdCluster) -> Vec<(u16, u16)> {
    (0..c.len())
        .map(|i| (c.client_port(i), c.peer_port(i)))
        .collect()
}

/// Shared by the playground's state and its chaos actions.
pub type SharedEtcd = Arc<tokio::sync::Mutex<EtcdCluster>>;

/// SIGTERM (and SIGCONT, so a child paused by a scenario handles it now), then SIGKILL
/// after 10 s.
pub(crate) async fn terminate(c: &mut Child) {
    if let Some(pid) = c.id().and_then(|p| i32::try_from(p).ok()) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        if tokio::time::timeout(Duration::from_secs(10), c.wait())
            .await
            .is_err()
        {
            let _ = c.kill().await;
        }
    }
}
