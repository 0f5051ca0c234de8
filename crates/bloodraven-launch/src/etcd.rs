//! Starting etcd members on this machine: `n` members of Debian's `etcd` (3.4) on loopback
//! ports the caller chose, each with its own data directory under one directory, plain HTTP
//! between peers and optionally TLS on the client ports. The playground's `--store etcd` runs
//! on it, and so do the tests. Members are stopped, killed, paused, resumed and restarted by
//! pid; dropping the cluster kills every member it started (and removes the directory unless
//! it is kept).
//!
//! The binary is `$BLOODRAVEN_ETCD`, else `/usr/bin/etcd`, else `etcd` on the `PATH`.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloodraven_runtime::tls::ClientIdentity;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::time::Instant;

/// How long a cluster (or a restarted member) may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a member may take to exit after `SIGTERM` before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// Why a cluster could not be started.
#[derive(Debug)]
pub struct EtcdSetupError(String);

impl fmt::Display for EtcdSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EtcdSetupError {}

/// TLS on the members' client port (peers talk plain HTTP on loopback).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The client certificate the cluster's own checks present; with it, members require
    /// one signed by `ca_file` (`--client-cert-auth`).
    pub client: Option<ClientIdentity>,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    id: u64,
}

impl Member {
    fn pid(&self) -> Option<Pid> {
        self.child
            .as_ref()
            .map(|c| Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX)))
    }
}

/// `n` (client, peer) port pairs, every port distinct, drawn from `draw` (the caller's way of
/// finding a free port).
pub fn distinct_ports(
    n: usize,
    mut draw: impl FnMut() -> std::io::Result<u16>,
) -> Result<Vec<(u16, u16)>, EtcdSetupError> {
    let mut taken = std::collections::BTreeSet::new();
    let mut port = || loop {
        let p = draw().map_err(|e| err(format!("no free port: {e}")))?;
        if taken.insert(p) {
            return Ok::<u16, EtcdSetupError>(p);
        }
    };
    (0..n).map(|_| Ok((port()?, port()?))).collect()
}

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// The members' data directories (`m0`, `m1`, …) and logs (`m0.log`, …) live here. A
    /// member whose data directory exists rejoins with its data (etcd ignores the initial
    /// cluster flags then).
    pub dir: PathBuf,
    /// Leave `dir` in place when the cluster is dropped.
    pub keep: bool,
    /// Each member's client and peer port, in member order.
    pub ports: Vec<(u16, u16)>,
    pub tls: Option<EtcdTls>,
    /// More of etcd's flags (`--auth-token-ttl 1`), on every start.
    pub extra_args: Vec<String>,
    /// `--heartbeat-interval` and `--election-timeout`, in milliseconds.
    pub heartbeat_ms: u32,
    pub election_ms: u32,
}

impl LaunchOptions {
    /// Members on `ports` under `dir` (removed on drop), plain HTTP, with timings short enough
    /// for tests: heartbeat 50 ms, election timeout 500 ms.
    pub fn new(dir: PathBuf, ports: Vec<(u16, u16)>) -> Self {
        LaunchOptions {
            dir,
            keep: false,
            ports,
            tls: None,
            extra_args: Vec::new(),
            heartbeat_ms: 50,
            election_ms: 500,
        }
    }
}

/// A running etcd cluster.
pub struct EtcdCluster {
    dir: PathBuf,
    keep: bool,
    heartbeat_ms: u32,
    election_ms: u32,
    binary: PathBuf,
    token: String,
    tls: Option<EtcdTls>,
    extra_args: Vec<String>,
    members: Vec<Member>,
    http: reqwest::Client,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("dir", &self.dir)
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

fn err(msg: impl Into<String>) -> EtcdSetupError {
    EtcdSetupError(msg.into())
}

/// The etcd binary the tests start.
pub fn etcd_binary() -> Result<PathBuf, EtcdSetupError> {
    if let Ok(p) = std::env::var("BLOODRAVEN_ETCD")
        && !p.is_empty()
    {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(err(format!(
                "BLOODRAVEN_ETCD names {}, which is not a file",
                p.display()
            )))
        };
    }
    let debian = Path::new("/usr/bin/etcd");
    if debian.is_file() {
        return Ok(debian.to_path_buf());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let c = dir.join("etcd");
            if c.is_file() {
                return Ok(c);
            }
        }
    }
    Err(err(
        "etcd is not installed (looked at $BLOODRAVEN_ETCD, /usr/bin/etcd and the PATH). \
         Install it with: sudo apt-get install -y --no-install-recommends etcd-server \
         (or point BLOODRAVEN_ETCD at an etcd 3.4+ binary)",
    ))
}

impl EtcdCluster {
    /// Starts the members of `opts` and waits until they elected a leader.
    pub async fn launch(opts: LaunchOptions) -> Result<EtcdCluster, EtcdSetupError> {
        if opts.ports.is_empty() {
            return Err(err("an etcd cluster needs at least one member"));
        }
        let binary = etcd_binary()?;
        let dir = opts.dir;
        fs::create_dir_all(&dir)
            .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        let token = dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let members: Vec<Member> = opts
            .ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| {
                let name = format!("m{i}");
                Member {
                    data_dir: dir.join(&name),
                    log: dir.join(format!("{name}.log")),
                    name,
                    client_port,
                    peer_port,
                    child: None,
                    id: 0,
                }
            })
            .collect();
        let tls = opts.tls;
        let http = bloodraven_runtime::tls::http_client_with(
            tls.as_ref().map(|t| t.ca_file.as_path()),
            tls.as_ref().and_then(|t| t.client.as_ref()),
            Some(Duration::from_secs(2)),
            Duration::from_secs(1),
        )
        .map_err(|e| err(e.to_string()))?;
        let n = members.len();
        let mut cluster = EtcdCluster {
            dir,
            keep: opts.keep,
            heartbeat_ms: opts.heartbeat_ms,
            election_ms: opts.election_ms,
            binary,
            token,
            tls,
            extra_args: opts.extra_args,
            members,
            http,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(&(0..n).collect::<Vec<_>>()).await?;
        Ok(cluster)
    }

    /// The directory of the members' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdSetupError> {
        let initial = self.initial_cluster();
        let client_url = format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        );
        let m = &self.members[i];
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| err(format!("cannot open {}: {e}", m.log.display())))?;
        let log2 = log
            .try_clone()
            .map_err(|e| err(format!("cannot open {}: {e}", m.log.display())))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(initial)
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--heartbeat-interval")
            .arg(self.heartbeat_ms.to_string())
            .arg("--election-timeout")
            .arg(self.election_ms.to_string())
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("warn");
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file);
            if tls.client.is_some() {
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(&tls.ca_file);
            }
        }
        cmd.args(&self.extra_args);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        let child = cmd
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", self.binary.display())))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The client port of member `i` (for a link in front of it).
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// The peer port of member `i`.
    pub fn peer_port(&self, i: usize) -> u16 {
        self.members[i].peer_port
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member's log (stderr).
    pub fn log(&self, i: usize) -> PathBuf {
        self.members[i].log.clone()
    }

    /// Whether member `i`'s process runs (it may be paused).
    pub fn running(&mut self, i: usize) -> bool {
        match self.members[i].child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Member `i`'s status answer, bounded by 2 s.
    async fn status(&self, i: usize) -> Option<Value> {
        let url = format!("{}/v3/maintenance/status", self.endpoint(i));
        let resp = self.http.post(url).body("{}").send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json::<Value>().await.ok()
    }

    fn id_of(v: &Value, field: &str) -> u64 {
        let f = if field == "member_id" {
            &v["header"]["member_id"]
        } else {
            &v[field]
        };
        f.as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| f.as_u64())
            .unwrap_or(0)
    }

    /// Waits until every member of `which` answers and follows one leader.
    async fn wait_ready(&mut self, which: &[usize]) -> Result<(), EtcdSetupError> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let mut leaders = Vec::new();
            for &i in which {
                if !self.running(i) {
                    return Err(err(format!(
                        "etcd member {} exited while starting; its log ({}) ends with:\n{}",
                        self.members[i].name,
                        self.members[i].log.display(),
                        bloodraven_runtime::files::tail(&self.members[i].log, 20)
                    )));
                }
                if let Some(s) = self.status(i).await {
                    let leader = Self::id_of(&s, "leader");
                    self.members[i].id = Self::id_of(&s, "member_id");
                    if leader != 0 {
                        leaders.push(leader);
                    }
                }
            }
            if leaders.len() == which.len() && leaders.windows(2).all(|w| w[0] == w[1]) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = which
                    .iter()
                    .map(|&i| {
                        format!(
                            "{}: {}",
                            self.members[i].name,
                            bloodraven_runtime::files::tail(&self.members[i].log, 5)
                        )
                    })
                    .collect();
                return Err(err(format!(
                    "etcd did not elect a leader within {READY_WITHIN:?}; the members' logs end with:\n{}",
                    logs.join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The index of the member the answering members follow (`None` without a leader).
    pub async fn leader(&mut self) -> Option<usize> {
        for i in 0..self.members.len() {
            if !self.running(i) {
                continue;
            }
            if let Some(s) = self.status(i).await {
                let leader = Self::id_of(&s, "leader");
                if leader != 0 {
                    return self.members.iter().position(|m| m.id == leader);
                }
            }
        }
        None
    }

    /// Waits (up to 30 s) until an answering member follows a running leader, and returns
    /// the leader's index.
    pub async fn wait_for_leader(&mut self) -> Option<usize> {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(l) = self.leader().await
                && self.running(l)
            {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }

    fn signal(&self, i: usize, sig: Signal) {
        if let Some(pid) = self.members[i].pid() {
            let _ = kill(pid, sig);
        }
    }

    async fn reap(&mut self, i: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let done = match self.members[i].child.as_mut() {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => true,
            };
            if done {
                self.members[i].child = None;
                return;
            }
            if Instant::now() > deadline {
                self.signal(i, Signal::SIGKILL);
                if let Some(mut c) = self.members[i].child.take() {
                    let _ = c.wait();
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops member `i` cleanly (`SIGTERM`, then `SIGKILL` after 10 s).
    pub async fn stop(&mut self, i: usize) {
        self.signal(i, Signal::SIGCONT);
        self.signal(i, Signal::SIGTERM);
        self.reap(i, STOP_WITHIN).await;
    }

    /// Stops every running member cleanly, one after the other.
    pub async fn shutdown(&mut self) {
        for i in 0..self.members.len() {
            if self.running(i) {
                self.stop(i).await;
            }
        }
    }

    /// Member `i`'s name (`m0`, `m1`, …).
    pub fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    /// Starts every member that does not run, on its data directory, and waits until they
    /// follow a leader. Returns the members started.
    pub async fn start_stopped(&mut self) -> Result<Vec<usize>, EtcdSetupError> {
        let stopped: Vec<usize> = (0..self.members.len())
            .filter(|&i| !self.running(i))
            .collect();
        for &i in &stopped {
            self.spawn(i)?;
        }
        self.wait_ready(&stopped).await?;
        Ok(stopped)
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&mut self, i: usize) -> Option<u32> {
        if !self.running(i) {
            return None;
        }
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Kills member `i` (`SIGKILL`).
    pub async fn kill(&mut self, i: usize) {
        self.signal(i, Signal::SIGKILL);
        self.reap(i, STOP_WITHIN).await;
    }

    /// Pauses member `i` (`SIGSTOP`): its connections stay open and say nothing.
    pub fn pause(&self, i: usize) {
        self.signal(i, Signal::SIGSTOP);
    }

    /// Resumes a paused member (`SIGCONT`).
    pub fn resume(&self, i: usize) {
        self.signal(i, Signal::SIGCONT);
    }

    /// Starts member `i` again on its data directory (stopping it first if it runs), and
    /// waits until it follows a leader.
    pub async fn restart(&mut self, i: usize) -> Result<(), EtcdSetupError> {
        if self.running(i) {
            self.stop(i).await;
        }
        self.spawn(i)?;
        self.wait_ready(&[i]).await
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.signal(i, Signal::SIGKILL);
        }
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.wait();
            }
        }
        if !self.keep {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
