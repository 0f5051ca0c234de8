//! Real MariaDB servers on loopback, for tests, benchmarks and the playground.
//!
//! [`Launcher::start`] starts N `mariadbd` processes from the Debian binaries, each with its own
//! data directory (copied from a template made once by `mariadb-install-db`), port, socket,
//! `server_id`, binary log and GTID settings. [`Launcher::wire`] creates the accounts on a
//! chosen primary and makes every other server its GTID replica.
//!
//! The launcher stops exactly the processes it started, by pid: on drop (which also runs when a
//! test panics) and, for processes left behind by a test process that was killed outright, the
//! next harness in any process reaps them — each harness directory records its owner's pid, and
//! a server is only signalled after `/proc/<pid>/cmdline` confirms it runs on that directory.
//! It never touches port 3306 or the machine's own MariaDB service.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep};

use bloodraven_mysql::ReplicaStatus;
use bloodraven_mysql::creds::Credentials;
use bloodraven_mysql::site::{Endpoint, SiteClient, SourceSpec, Timeouts};

/// The launcher could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "{binary} not found; install MariaDB with `apt-get install -y mariadb-server mariadb-client` (or set BLOODRAVEN_MARIADBD)"
    )]
    MissingBinary { binary: &'static str },
    #[error("failed to prepare {path}: {source}")]
    Filesystem { path: String, source: io::Error },
    #[error("mariadb-install-db failed (log: {log}): {detail}")]
    InstallDb { log: String, detail: String },
    #[error("failed to spawn mariadbd for {server}: {source}")]
    Spawn { server: String, source: io::Error },
    #[error("mariadbd for {server} exited during start-up; last lines of {log}:\n{tail}")]
    StartupExit {
        server: String,
        log: String,
        tail: String,
    },
    #[error("mariadbd for {server} was not ready within {} s; last lines of {log}:\n{tail}", waited.as_secs())]
    StartupTimeout {
        server: String,
        waited: Duration,
        log: String,
        tail: String,
    },
    #[error("setting up {server} failed: {source}")]
    Setup {
        server: String,
        source: bloodraven_mysql::MysqlError,
    },
    #[error("replication to {server} did not come up: {detail}")]
    Replication { server: String, detail: String },
    #[error("no server with index {index} (the launcher has {count})")]
    NoSuchServer { index: usize, count: usize },
    #[error("failed to signal {server} (pid {pid}): {detail}")]
    Signal {
        server: String,
        pid: i32,
        detail: String,
    },
}

fn fs_err(path: &Path) -> impl FnOnce(io::Error) -> LaunchError + '_ {
    move |source| LaunchError::Filesystem {
        path: path.display().to_string(),
        source,
    }
}

/// How to start servers.
#[derive(Clone, Debug)]
pub struct LauncherOptions {
    /// One server per name; names double as site names (`iad`, `pdx`, `reader`).
    pub names: Vec<String>,
    /// Where the servers live. `None`: a fresh directory under the system temp dir, removed on
    /// drop. `Some`: kept on drop, and reused (data directories included) when it exists.
    pub dir: Option<PathBuf>,
    /// Fixed TCP ports, one per name. `None`: free ports picked at start.
    pub ports: Option<Vec<u16>>,
    /// `innodb_buffer_pool_size` of each server.
    pub buffer_pool: String,
    /// Stop servers with SIGTERM (clean shutdown) instead of SIGKILL on drop.
    pub graceful_shutdown: bool,
    /// The accounts' passwords, when the data directories already hold them (a kept `dir`).
    /// `None`: new random passwords.
    pub accounts: Option<Accounts>,
    /// Start servers with `read_only=ON` (the default, as a production option file should): a
    /// restarted server then accepts no write before something decides it may. [`Launcher::wire`]
    /// clears it on the primary it wires; the operator's promotion clears it otherwise.
    pub read_only_at_start: bool,
    /// Start servers with `--init-rpl-role=SLAVE --rpl-semi-sync-slave-enabled=ON`, the
    /// semi-synchronous recovery configuration: a crashed primary's recovery truncates the
    /// transactions it wrote to its binary log but no replica acknowledged (and no client was
    /// told about), instead of coming back with them (docs/mysql.md).
    pub semi_sync_recovery: bool,
    /// Serve TLS with these files and refuse clear-text logins over TCP
    /// (`require_secure_transport=ON`); every client the launcher hands out then verifies
    /// the servers' certificate against `ca` (it must name `127.0.0.1`).
    pub tls: Option<ServerTls>,
}

/// The TLS files every server of a launcher serves (`ssl_cert`, `ssl_key`, `ssl_ca`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// The CA bundle the clients (and the replicas) verify the servers against.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl LauncherOptions {
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        LauncherOptions {
            names: names.into_iter().map(Into::into).collect(),
            dir: None,
            ports: None,
            buffer_pool: "32M".into(),
            graceful_shutdown: false,
            accounts: None,
            read_only_at_start: true,
            semi_sync_recovery: false,
            tls: None,
        }
    }
}

/// The accounts a wired harness has, on every server (created on the primary, replicated).
#[derive(Clone, Debug)]
pub struct Accounts {
    /// `root` over the Unix socket: setup only.
    pub admin: Credentials,
    /// The control-plane account: [`FAILOVER_GRANTS`] on `*.*` and `EVENT` on `mysql.*`
    /// (strict fencing's dead man's switch), no DML.
    pub failover: Credentials,
    /// Replicas authenticate to their source with it: `REPLICATION SLAVE`.
    pub replication: Credentials,
    /// The application: `SELECT, INSERT, UPDATE, DELETE` on `app.*` only.
    pub app: Credentials,
    /// A reclone takes its copy and loads it with it: [`CLONE_GRANTS`] on `*.*`.
    pub clone: Credentials,
}

/// The grants of the least-privilege control-plane account (documented for users).
pub const FAILOVER_GRANTS: &str = "READ_ONLY ADMIN, REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN, SLAVE MONITOR, BINLOG MONITOR, CONNECTION ADMIN, PROCESS, RELOAD, BINLOG ADMIN";
/// The grants of the replication account.
pub const REPLICATION_GRANTS: &str = "REPLICATION SLAVE";
/// The grants of the application account (on its schema only).
pub const APP_GRANTS: &str = "SELECT, INSERT, UPDATE, DELETE";

/// The grants of the clone account, on `*.*`: what `mariadb-dump --single-transaction
/// --master-data|--dump-slave --gtid --routines --events --triggers` needs on a donor (read
/// everything, the brief global read lock, the binary-log position, the replica's applier
/// stopped and started), and what loading it needs on a fenced target with binary logging off
/// for the session (create and fill every object under `read_only`, definers kept). Documented
/// in docs/reclone.md; it can write on a fenced server, so keep its credentials to the
/// operator.
pub const CLONE_GRANTS: &str = "SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, CREATE TEMPORARY TABLES, LOCK TABLES, EXECUTE, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, ALTER ROUTINE, EVENT, TRIGGER, REFERENCES, RELOAD, PROCESS, SHOW DATABASES, READ_ONLY ADMIN, BINLOG ADMIN, BINLOG MONITOR, REPLICATION SLAVE ADMIN, SLAVE MONITOR, SET USER";

/// One `mariadbd` process of the launcher.
pub struct Server {
    pub name: String,
    pub index: usize,
    pub server_id: u32,
    pub port: u16,
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
    /// Options added to its command line from its next start on (a changed setting, as an
    /// update would bring).
    extra_args: Vec<String>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("pid", &self.pid())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The pid of the running process, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn datadir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn error_log(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }
}

static HARNESS_SEQ: AtomicU32 = AtomicU32::new(0);

/// A set of running MariaDB servers.
pub struct Launcher {
    dir: PathBuf,
    keep: bool,
    graceful: bool,
    mariadbd: PathBuf,
    buffer_pool: String,
    servers: Vec<Server>,
    accounts: Accounts,
    wired_primary: Option<usize>,
    read_only_at_start: bool,
    semi_sync_recovery: bool,
    tls: Option<ServerTls>,
}

impl fmt::Debug for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launcher")
            .field("dir", &self.dir)
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

pub fn random_password() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let a = h.finish();
    let mut h2 = RandomState::new().build_hasher();
    h2.write_u64(a);
    format!("{a:016x}{:016x}", h2.finish())
}

/// Finds `mariadbd`: `$BLOODRAVEN_MARIADBD`, then `PATH`, then Debian's `/usr/sbin`.
pub fn find_mariadbd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BLOODRAVEN_MARIADBD") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    find_in_path("mariadbd")
        .or_else(|| Some(PathBuf::from("/usr/sbin/mariadbd")).filter(|p| p.is_file()))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn harness_root() -> PathBuf {
    std::env::temp_dir().join("bloodraven-harness")
}

/// Kills servers left behind by harnesses whose owning process no longer exists.
fn reap_orphans() {
    let Ok(entries) = fs::read_dir(harness_root()) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        let Some(owner) = fs::read_to_string(dir.join("owner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        if let Ok(servers) = fs::read_dir(&dir) {
            for s in servers.flatten() {
                kill_recorded(&s.path());
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

/// SIGKILLs the server recorded in `server_dir/started.pid`, if its command line confirms it
/// runs on that directory (a recycled pid is left alone).
fn kill_recorded(server_dir: &Path) {
    let Some(pid) = fs::read_to_string(server_dir.join("started.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let needle = server_dir.join("data").display().to_string();
    if String::from_utf8_lossy(&cmdline).contains(&needle) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}

/// Makes (once per machine and server version) a data directory from `mariadb-install-db`
/// and returns its path. Concurrent creators race on an atomic rename; losers discard theirs.
fn template(mariadbd: &Path) -> Result<PathBuf, LaunchError> {
    let version = Command::new(mariadbd)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(version.as_bytes());
    h.write(mariadbd.as_os_str().as_encoded_bytes());
    let uid = nix::unistd::geteuid().as_raw();
    let path = std::env::temp_dir().join(format!(
        "bloodraven-mariadb-template-{uid}-{:012x}",
        h.finish() & 0xffff_ffff_ffff
    ));
    if path.join("data/mysql").is_dir() {
        return Ok(path);
    }
    let install = find_in_path("mariadb-install-db")
        .or_else(|| Some(PathBuf::from("/usr/bin/mariadb-install-db")).filter(|p| p.is_file()))
        .ok_or(LaunchError::MissingBinary {
            binary: "mariadb-install-db",
        })?;
    let tmp = std::env::temp_dir().join(format!(
        "bloodraven-mariadb-template-tmp-{}-{}",
        std::process::id(),
        HARNESS_SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(fs_err(&tmp))?;
    let log = tmp.join("install.log");
    let log_file = fs::File::create(&log).map_err(fs_err(&log))?;
    let mut cmd = Command::new(&install);
    cmd.arg("--no-defaults");
    if is_root() {
        cmd.arg("--user=root");
    }
    let status = cmd
        .arg(format!("--datadir={}", tmp.join("data").display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg("--innodb-log-file-size=8M")
        .stdout(log_file.try_clone().map_err(fs_err(&log))?)
        .stderr(log_file)
        .status()
        .map_err(|e| LaunchError::InstallDb {
            log: log.display().to_string(),
            detail: e.to_string(),
        })?;
    if !status.success() {
        return Err(LaunchError::InstallDb {
            log: log.display().to_string(),
            detail: format!("exit status {status}"),
        });
    }
    match fs::rename(&tmp, &path) {
        Ok(()) => Ok(path),
        Err(_) if path.join("data/mysql").is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(path)
        }
        Err(e) => Err(fs_err(&path)(e)),
    }
}

/// Picks a loopback TCP port for a server that will bind it a little later (a `mariadbd`, a
/// sidecar, an operator started as a process).
///
/// A port from `bind(0)` comes from the kernel's ephemeral range, and between releasing it and
/// the server binding it the kernel may hand it to any outgoing connection on the machine
/// (every probe, proxy and client opens some): the server then fails with "address in use".
/// So the port is drawn at random below the ephemeral range (from 15000), where the kernel
/// never assigns ports on its own, and checked free by binding it. Only when that range is too
/// small or full does it fall back to `bind(0)`. Never 3306.
///
/// A port is handed out at most once per process: callers draw several ports before anything
/// binds them (a playground draws its operator's, deploy API's, sidecars' and router's ports in
/// a row), and a port that is still free when drawn a second time would go to two servers. Nor
/// is it handed out to two processes at once (tests run side by side, each drawing ports before
/// its children bind them): a port is reserved by an exclusive lock on a file named after it in
/// the temporary directory, held until this process exits.
pub fn free_port() -> io::Result<u16> {
    const LOW: u16 = 15_000;
    let ephemeral_low = ephemeral_low();
    if ephemeral_low > LOW + 1_000 {
        let span = u64::from(ephemeral_low - LOW);
        for _ in 0..200 {
            let offset = RandomState::new().build_hasher().finish() % span;
            let port = LOW + u16::try_from(offset).unwrap_or(0);
            if port != 3306
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
                && first_hand_out(port)
            {
                return Ok(port);
            }
        }
    }
    loop {
        let l = TcpListener::bind(("127.0.0.1", 0))?;
        let port = l.local_addr()?.port();
        if port != 3306 && first_hand_out(port) {
            return Ok(port);
        }
    }
}

/// Records `port` as handed out by [`free_port`]; false when it already was, by this process
/// or by another one that still runs.
fn first_hand_out(port: u16) -> bool {
    type Reserved = std::collections::BTreeMap<u16, Option<nix::fcntl::Flock<fs::File>>>;
    static HANDED_OUT: std::sync::Mutex<Reserved> = std::sync::Mutex::new(Reserved::new());
    let mut handed = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if handed.contains_key(&port) {
        return false;
    }
    match reserve_across_processes(port) {
        Ok(lock) => {
            handed.insert(port, lock);
            true
        }
        Err(()) => false,
    }
}

/// An exclusive lock on `$TMPDIR/bloodraven-ports/<port>` (released when the process exits):
/// `Err` when another process holds it; `Ok(None)` when no lock file can be made (a read-only
/// temporary directory), which leaves only this process's own record.
fn reserve_across_processes(port: u16) -> Result<Option<nix::fcntl::Flock<fs::File>>, ()> {
    let dir = std::env::temp_dir().join("bloodraven-ports");
    if fs::create_dir_all(&dir).is_err() {
        return Ok(None);
    }
    let Ok(f) = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return Ok(None);
    };
    match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(Some(locked)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(()),
        Err(_) => Ok(None),
    }
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_low() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

/// The last `lines` lines of a server's error log, for an error that explains itself (this
/// crate stands below `bloodraven-runtime`, which has the same for everyone above it).
fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Launcher {
    /// Starts one server per name and waits until every one accepts connections.
    pub async fn start(opts: LauncherOptions) -> Result<Launcher, LaunchError> {
        let mariadbd = find_mariadbd().ok_or(LaunchError::MissingBinary { binary: "mariadbd" })?;
        reap_orphans();
        let (dir, keep) = if let Some(d) = &opts.dir {
            (d.clone(), true)
        } else {
            let d = harness_root().join(format!(
                "{}-{}",
                std::process::id(),
                HARNESS_SEQ.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = fs::remove_dir_all(&d);
            (d, false)
        };
        fs::create_dir_all(&dir).map_err(fs_err(&dir))?;
        let owner = dir.join("owner.pid");
        if !keep {
            fs::write(&owner, std::process::id().to_string()).map_err(fs_err(&owner))?;
        }
        let template = template(&mariadbd)?;
        let accounts = opts.accounts.clone().unwrap_or_else(|| Accounts {
            admin: Credentials::new("root", ""),
            failover: Credentials::new("bloodraven", random_password()),
            replication: Credentials::new("repl", random_password()),
            app: Credentials::new("app", random_password()),
            clone: Credentials::new("clone", random_password()),
        });
        let mut h = Launcher {
            dir: dir.clone(),
            keep,
            graceful: opts.graceful_shutdown,
            mariadbd,
            buffer_pool: opts.buffer_pool.clone(),
            servers: Vec::new(),
            accounts,
            wired_primary: None,
            read_only_at_start: opts.read_only_at_start,
            semi_sync_recovery: opts.semi_sync_recovery,
            tls: opts.tls.clone(),
        };
        for (i, name) in opts.names.iter().enumerate() {
            let sdir = dir.join(name);
            if !sdir.join("data/mysql").is_dir() {
                let _ = fs::remove_dir_all(sdir.join("data"));
                copy_dir(&template.join("data"), &sdir.join("data")).map_err(fs_err(&sdir))?;
            }
            let port = match &opts.ports {
                Some(p) => p.get(i).copied().unwrap_or(0),
                None => free_port().map_err(fs_err(&sdir))?,
            };
            h.servers.push(Server {
                name: name.clone(),
                index: i,
                server_id: u32::try_from(i + 1).unwrap_or(u32::MAX),
                port,
                socket: sdir.join("mysqld.sock"),
                dir: sdir,
                child: None,
                extra_args: Vec::new(),
            });
        }
        for i in 0..h.servers.len() {
            h.spawn(i)?;
        }
        for i in 0..h.servers.len() {
            // A free port can be taken between picking and binding: retry with another.
            let mut attempts = 0;
            loop {
                match h.wait_ready(i, Duration::from_secs(60)).await {
                    Ok(()) => break,
                    Err(LaunchError::StartupExit { tail, .. })
                        if attempts < 3
                            && opts.ports.is_none()
                            && tail.contains("Bind on TCP/IP port") =>
                    {
                        attempts += 1;
                        h.servers[i].port = free_port().map_err(fs_err(&h.dir))?;
                        h.spawn(i)?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(h)
    }

    /// Starts N servers named `s1…sN` and wires replication from the first.
    pub async fn start_group(names: &[&str]) -> Result<Launcher, LaunchError> {
        let mut h = Launcher::start(LauncherOptions::new(names.iter().copied())).await?;
        h.wire(0).await?;
        Ok(h)
    }

    fn server(&self, i: usize) -> Result<&Server, LaunchError> {
        self.servers.get(i).ok_or(LaunchError::NoSuchServer {
            index: i,
            count: self.servers.len(),
        })
    }

    fn server_mut(&mut self, i: usize) -> Result<&mut Server, LaunchError> {
        let count = self.servers.len();
        self.servers
            .get_mut(i)
            .ok_or(LaunchError::NoSuchServer { index: i, count })
    }

    /// Whether servers (re)started from now on start with `read_only=ON`.
    pub fn set_read_only_at_start(&mut self, on: bool) {
        self.read_only_at_start = on;
    }

    fn spawn(&mut self, i: usize) -> Result<(), LaunchError> {
        self.spawn_with(i, self.read_only_at_start)
    }

    fn spawn_with(&mut self, i: usize, read_only: bool) -> Result<(), LaunchError> {
        let mariadbd = self.mariadbd.clone();
        let buffer_pool = self.buffer_pool.clone();
        let semi_sync_recovery = self.semi_sync_recovery;
        let tls_args: Vec<String> = self
            .tls
            .as_ref()
            .map(|t| {
                vec![
                    format!("--ssl-ca={}", t.ca.display()),
                    format!("--ssl-cert={}", t.cert.display()),
                    format!("--ssl-key={}", t.key.display()),
                    "--require-secure-transport=ON".to_string(),
                ]
            })
            .unwrap_or_default();
        let s = self.server_mut(i)?;
        let out = s.dir.join("stdout.log");
        let out_file = fs::File::create(&out).map_err(fs_err(&out))?;
        // Each server's temporary tables live in its own directory: a server starting in a
        // shared /tmp may remove another server's temporary files (which then fails the
        // statement using them with "Error on delete of '/tmp/#sql-temptable-…'").
        let tmpdir = s.dir.join("tmp");
        fs::create_dir_all(&tmpdir).map_err(fs_err(&tmpdir))?;
        let mut cmd = Command::new(&mariadbd);
        // --log-basename must come first, or it silently renames the binlog and error log.
        cmd.arg("--no-defaults")
            .arg(format!("--log-basename={}", s.name));
        if is_root() {
            cmd.arg("--user=root");
        }
        cmd.arg(format!("--datadir={}", s.datadir().display()))
            .arg(format!("--port={}", s.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", s.socket.display()))
            .arg(format!("--tmpdir={}", tmpdir.display()))
            .arg(format!(
                "--pid-file={}",
                s.dir.join("mariadbd.pid").display()
            ))
            .arg(format!("--log-error={}", s.error_log().display()))
            .arg(format!("--server-id={}", s.server_id))
            .arg(format!("--log-bin={}-bin", s.name))
            .arg("--binlog-format=ROW")
            .arg("--log-slave-updates")
            .arg("--gtid-strict-mode=1")
            // Strict fencing's dead man's switch is an event (docs/mysql.md).
            .arg("--event-scheduler=ON")
            .arg("--skip-name-resolve")
            .arg(format!("--innodb-buffer-pool-size={buffer_pool}"))
            .arg("--innodb-log-file-size=8M")
            .args(read_only.then_some("--read-only=ON"))
            .args(&tls_args)
            .args(&s.extra_args)
            .args(
                semi_sync_recovery
                    .then_some(["--init-rpl-role=SLAVE", "--rpl-semi-sync-slave-enabled=ON"])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::null())
            .stdout(out_file.try_clone().map_err(fs_err(&out))?)
            .stderr(out_file);
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            server: s.name.clone(),
            source,
        })?;
        let pid_file = s.dir.join("started.pid");
        fs::write(&pid_file, child.id().to_string()).map_err(fs_err(&pid_file))?;
        s.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, i: usize, limit: Duration) -> Result<(), LaunchError> {
        let started = Instant::now();
        let client = self.admin(i)?;
        loop {
            let s = self.server_mut(i)?;
            if !s.running() {
                return Err(LaunchError::StartupExit {
                    server: s.name.clone(),
                    log: s.error_log().display().to_string(),
                    tail: tail(&s.error_log(), 15),
                });
            }
            if client.flavor().await.is_ok() {
                return Ok(());
            }
            if started.elapsed() > limit {
                let s = self.server(i)?;
                return Err(LaunchError::StartupTimeout {
                    server: s.name.clone(),
                    waited: limit,
                    log: s.error_log().display().to_string(),
                    tail: tail(&s.error_log(), 15),
                });
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates the accounts on every server and the `app` schema on `primary`, and makes every
    /// other server a read-only GTID replica of it, waiting until each has caught up.
    ///
    /// The accounts are created on each server with binary logging off for those statements
    /// ([`SiteClient::execute_unlogged`]): a password in `CREATE USER … IDENTIFIED BY` would
    /// otherwise sit in plain text in every site's binary log, replicated and kept.
    pub async fn wire(&mut self, primary: usize) -> Result<(), LaunchError> {
        self.create_accounts().await?;
        self.wire_replication(primary).await
    }

    /// Creates the accounts on every server that lacks them (binary logging off for those
    /// statements), keeping the ones that exist: a kept set of servers gains an account a
    /// newer version needs.
    pub async fn create_accounts(&self) -> Result<(), LaunchError> {
        let a = &self.accounts;
        let accounts = vec![
            format!(
                "CREATE USER IF NOT EXISTS 'bloodraven'@'127.0.0.1' IDENTIFIED BY {}",
                bloodraven_mysql::sql::quote(a.failover.password.expose())
            ),
            format!("GRANT {FAILOVER_GRANTS} ON *.* TO 'bloodraven'@'127.0.0.1'"),
            // Strict fencing's dead man's switch lives in the mysql schema.
            "GRANT EVENT ON mysql.* TO 'bloodraven'@'127.0.0.1'".to_string(),
            format!(
                "CREATE USER IF NOT EXISTS 'repl'@'127.0.0.1' IDENTIFIED BY {}",
                bloodraven_mysql::sql::quote(a.replication.password.expose())
            ),
            format!("GRANT {REPLICATION_GRANTS} ON *.* TO 'repl'@'127.0.0.1'"),
            format!(
                "CREATE USER IF NOT EXISTS 'app'@'127.0.0.1' IDENTIFIED BY {}",
                bloodraven_mysql::sql::quote(a.app.password.expose())
            ),
            format!("GRANT {APP_GRANTS} ON app.* TO 'app'@'127.0.0.1'"),
            format!(
                "CREATE USER IF NOT EXISTS 'clone'@'127.0.0.1' IDENTIFIED BY {}",
                bloodraven_mysql::sql::quote(a.clone.password.expose())
            ),
            format!("GRANT {CLONE_GRANTS} ON *.* TO 'clone'@'127.0.0.1'"),
        ];
        for i in 0..self.servers.len() {
            let c = self.admin(i)?;
            let name = self.server(i)?.name.clone();
            c.execute_unlogged(accounts.clone())
                .await
                .map_err(|source| LaunchError::Setup {
                    server: name,
                    source,
                })?;
        }
        Ok(())
    }

    /// Creates the `app` schema on `primary` and makes every other server a read-only GTID
    /// replica of it, waiting until each has caught up.
    async fn wire_replication(&mut self, primary: usize) -> Result<(), LaunchError> {
        let p = self.admin(primary)?;
        let pname = self.server(primary)?.name.clone();
        p.execute("CREATE DATABASE IF NOT EXISTS app")
            .await
            .map_err(|source| LaunchError::Setup {
                server: pname.clone(),
                source,
            })?;
        p.unfence().await.map_err(|source| LaunchError::Setup {
            server: pname.clone(),
            source,
        })?;
        let spec = self.source_spec(primary)?;
        for i in 0..self.servers.len() {
            if i == primary {
                continue;
            }
            let r = self.admin(i)?;
            let name = self.server(i)?.name.clone();
            r.repoint(&spec)
                .await
                .map_err(|source| LaunchError::Setup {
                    server: name.clone(),
                    source,
                })?;
        }
        self.wired_primary = Some(primary);
        self.wait_replicas_caught_up(primary, Duration::from_secs(30))
            .await?;
        for s in &self.servers {
            let _ = fs::write(s.dir.join("wired"), "");
        }
        Ok(())
    }

    /// Waits until every replica of `primary` runs both threads and has applied the primary's
    /// current GTID set.
    pub async fn wait_replicas_caught_up(
        &self,
        primary: usize,
        limit: Duration,
    ) -> Result<(), LaunchError> {
        let p = self.admin(primary)?;
        let pname = self.server(primary)?.name.clone();
        let target = p
            .probe()
            .await
            .map_err(|source| LaunchError::Setup {
                server: pname,
                source,
            })?
            .gtid;
        for i in 0..self.servers.len() {
            if i == primary {
                continue;
            }
            let r = self.admin(i)?;
            let name = self.server(i)?.name.clone();
            let caught_up =
                r.wait_for_gtid(&target, limit)
                    .await
                    .map_err(|e| LaunchError::Replication {
                        server: name.clone(),
                        detail: e.to_string(),
                    })?;
            if !caught_up {
                let state = r.probe().await.map(|p| format!("{:?}", p.replica));
                return Err(LaunchError::Replication {
                    server: name,
                    detail: format!("not caught up within {} s: {state:?}", limit.as_secs()),
                });
            }
            // Applied says nothing about the IO thread: with no write since it was restarted,
            // the replica's position already equals the primary's while the thread still
            // reports `Connecting` or `Preparing`. Wait for it to read.
            let deadline = tokio::time::Instant::now() + limit;
            loop {
                let state = r.probe().await.ok().and_then(|p| p.replica);
                if state.as_ref().is_some_and(ReplicaStatus::running) {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(LaunchError::Replication {
                        server: name,
                        detail: format!(
                            "caught up, but its threads did not both run within {} s: {state:?}",
                            limit.as_secs()
                        ),
                    });
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// Whether server `i`'s data directory existed before this harness started it (a kept
    /// `dir`): such a server already has its accounts and replication, and needs no `wire`.
    pub fn was_initialised(&self, i: usize) -> bool {
        self.servers
            .get(i)
            .is_some_and(|s| s.dir.join("wired").is_file())
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.name == name)
    }

    pub fn port(&self, i: usize) -> u16 {
        self.servers.get(i).map_or(0, |s| s.port)
    }

    pub fn name(&self, i: usize) -> &str {
        self.servers.get(i).map_or("", |s| s.name.as_str())
    }

    /// The server's TCP endpoint (over verified TLS when the servers serve it).
    pub fn endpoint(&self, i: usize) -> Endpoint {
        Endpoint::tcp("127.0.0.1", self.port(i)).with_tls(self.client_tls())
    }

    /// How a client reaches the servers: verified TLS when they serve it, else clear text.
    pub fn client_tls(&self) -> bloodraven_core::config::MysqlTls {
        use bloodraven_core::config::{MysqlTls, TlsMode};
        self.tls
            .as_ref()
            .map_or_else(MysqlTls::default, |t| MysqlTls {
                mode: TlsMode::VerifyIdentity,
                ca_file: Some(t.ca.display().to_string()),
                server_name: None,
            })
    }

    /// How replicas connect to their source: verified TLS when the servers serve it.
    pub fn replication_tls(&self) -> bloodraven_core::config::ReplicationTls {
        use bloodraven_core::config::{ReplicationTls, TlsMode};
        self.tls
            .as_ref()
            .map_or_else(ReplicationTls::default, |t| ReplicationTls {
                mode: TlsMode::VerifyIdentity,
                ca_file: Some(t.ca.display().to_string()),
            })
    }

    /// The TLS files the servers serve, when they do.
    pub fn server_tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// How replicas reach server `i`.
    pub fn source_spec(&self, i: usize) -> Result<SourceSpec, LaunchError> {
        Ok(SourceSpec {
            host: "127.0.0.1".into(),
            port: self.server(i)?.port,
            credentials: self.accounts.replication.clone(),
            tls: self.replication_tls(),
        })
    }

    /// `root` over the Unix socket.
    pub fn admin(&self, i: usize) -> Result<SiteClient, LaunchError> {
        let s = self.server(i)?;
        Ok(SiteClient::new(
            s.name.clone(),
            Endpoint::unix(&s.socket),
            self.accounts.admin.clone(),
            Timeouts::default(),
        ))
    }

    /// The least-privilege control-plane account over TCP: what the operator and sidecars use.
    pub fn failover_client(&self, i: usize) -> SiteClient {
        SiteClient::new(
            self.name(i).to_string(),
            self.endpoint(i),
            self.accounts.failover.clone(),
            Timeouts::default(),
        )
    }

    /// The clone account over TCP (what a reclone's copy lists databases with).
    pub fn clone_client(&self, i: usize) -> SiteClient {
        SiteClient::new(
            self.name(i).to_string(),
            self.endpoint(i),
            self.accounts.clone.clone(),
            Timeouts::default(),
        )
    }

    /// Where a reclone's tools reach server `i`, as the clone account.
    pub fn clone_endpoint(&self, i: usize) -> bloodraven_mysql::clone::Endpoint {
        bloodraven_mysql::clone::Endpoint {
            site: self.name(i).to_string(),
            host: "127.0.0.1".into(),
            port: self.port(i),
            credentials: self.accounts.clone.clone(),
            tls: self.client_tls(),
        }
    }

    /// Connection options for the application account on server `i` (database `app`).
    pub fn app_opts(&self, i: usize) -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port(i))
            .prefer_socket(false)
            .user(Some(self.accounts.app.user.clone()))
            .pass(Some(self.accounts.app.password.expose().to_string()))
            .db_name(Some("app"))
            .ssl_opts(bloodraven_mysql::site::ssl_opts(&self.client_tls()))
            .into()
    }

    /// The pid of server `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers.get(i).and_then(Server::pid)
    }

    /// Waits (up to `limit`) until another session of the application account runs a statement
    /// whose text contains `fragment` (a `LIKE` fragment) on server `i`; returns whether it
    /// did. Tests that must act *while* a statement runs wait for it here instead of guessing
    /// with a sleep how long the statement takes to start.
    pub async fn wait_app_statement_running(
        &self,
        i: usize,
        fragment: &str,
        limit: Duration,
    ) -> bool {
        use mysql_async::prelude::Queryable as _;
        let started = Instant::now();
        let mut conn: Option<mysql_async::Conn> = None;
        while started.elapsed() < limit {
            if conn.is_none() {
                conn = mysql_async::Conn::new(self.app_opts(i)).await.ok();
            }
            if let Some(c) = conn.as_mut() {
                let seen: Result<Option<u64>, _> = c
                    .exec_first(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                         WHERE ID <> CONNECTION_ID() AND COMMAND = 'Query' \
                         AND INFO LIKE CONCAT('%', ?, '%')",
                        (fragment,),
                    )
                    .await;
                match seen {
                    Ok(Some(n)) if n > 0 => return true,
                    Ok(_) => {}
                    Err(_) => conn = None,
                }
            }
            sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn is_running(&mut self, i: usize) -> bool {
        self.servers.get_mut(i).is_some_and(Server::running)
    }

    fn signal(&mut self, i: usize, sig: Signal) -> Result<(), LaunchError> {
        let s = self.server_mut(i)?;
        let Some(pid) = s.pid() else { return Ok(()) };
        let pid = i32::try_from(pid).unwrap_or(i32::MAX);
        kill(Pid::from_raw(pid), sig).map_err(|e| LaunchError::Signal {
            server: s.name.clone(),
            pid,
            detail: e.to_string(),
        })
    }

    /// SIGKILLs server `i` (a crash) and reaps it.
    pub fn kill(&mut self, i: usize) -> Result<(), LaunchError> {
        self.signal(i, Signal::SIGKILL)?;
        let s = self.server_mut(i)?;
        if let Some(mut c) = s.child.take() {
            let _ = c.wait();
        }
        let _ = fs::remove_file(s.dir.join("started.pid"));
        Ok(())
    }

    /// SIGSTOPs server `i`: it holds its connections but answers nothing.
    pub fn pause(&mut self, i: usize) -> Result<(), LaunchError> {
        self.signal(i, Signal::SIGSTOP)
    }

    /// SIGCONTs a paused server.
    pub fn resume(&mut self, i: usize) -> Result<(), LaunchError> {
        self.signal(i, Signal::SIGCONT)
    }

    /// Stops server `i` cleanly (SIGTERM), waiting up to 30 s before SIGKILL.
    pub async fn stop(&mut self, i: usize) -> Result<(), LaunchError> {
        self.signal(i, Signal::SIGTERM)?;
        let started = Instant::now();
        while self.is_running(i) {
            if started.elapsed() > Duration::from_secs(30) {
                return self.kill(i);
            }
            sleep(Duration::from_millis(20)).await;
        }
        let s = self.server_mut(i)?;
        let _ = fs::remove_file(s.dir.join("started.pid"));
        Ok(())
    }

    /// Server `i` starts with `args` added to its command line from its next start on.
    pub fn set_extra_args(&mut self, i: usize, args: Vec<String>) -> Result<(), LaunchError> {
        self.server_mut(i)?.extra_args = args;
        Ok(())
    }

    /// Starts a stopped or killed server again on its data directory and port, read-only
    /// unless [`Launcher::set_read_only_at_start`] said otherwise.
    pub async fn restart(&mut self, i: usize) -> Result<(), LaunchError> {
        if self.is_running(i) {
            return Ok(());
        }
        self.spawn(i)?;
        self.wait_ready(i, Duration::from_secs(60)).await
    }

    /// Starts a stopped or killed server again writable (`read_only=OFF`), as a server without
    /// the recommended `read_only=ON` in its option file would: the crash case a returning
    /// primary must be fenced in.
    pub async fn restart_writable(&mut self, i: usize) -> Result<(), LaunchError> {
        if self.is_running(i) {
            return Ok(());
        }
        self.spawn_with(i, false)?;
        self.wait_ready(i, Duration::from_secs(60)).await
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let sig = if self.graceful {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        for s in &mut self.servers {
            if let Some(pid) = s.pid() {
                let _ = kill(
                    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                    Signal::SIGCONT,
                );
                let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)), sig);
            }
        }
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                // Bounded: a clean shutdown takes ~2 s; never hang a test run on it.
                let mut waited = 0;
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) if waited >= 300 => {
                            let _ = c.kill();
                            let _ = c.wait();
                            break;
                        }
                        Ok(None) => {
                            std::thread::sleep(Duration::from_millis(100));
                            waited += 1;
                        }
                    }
                }
            }
            let _ = fs::remove_file(s.dir.join("started.pid"));
        }
        if !self.keep {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_bindable_and_below_the_ephemeral_range() {
        let ephemeral_low = ephemeral_low();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let p = free_port().unwrap();
            assert_ne!(p, 3306);
            if ephemeral_low > 16_000 {
                assert!((15_000..ephemeral_low).contains(&p), "{p}");
            }
            TcpListener::bind(("127.0.0.1", p)).unwrap();
            seen.insert(p);
        }
        assert!(seen.len() > 40, "drawn at random: {} distinct", seen.len());
    }

    #[test]
    fn a_process_never_gets_the_same_free_port_twice() {
        // Nothing binds these between draws, as in a playground's start.
        let drawn: Vec<u16> = (0..500).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = drawn.iter().copied().collect();
        assert_eq!(distinct.len(), drawn.len());
    }

    #[test]
    fn a_port_handed_out_is_reserved_against_other_processes() {
        let p = free_port().unwrap();
        // Another open file description of the same lock file is what another process holds:
        // the lock this process took refuses it.
        assert_eq!(reserve_across_processes(p).map(|l| l.is_some()), Err(()));
        // A port nobody handed out can be reserved, once.
        let q = (p..u16::MAX)
            .find(|q| *q != p && !first_hand_out_seen(*q))
            .unwrap();
        let held = reserve_across_processes(q);
        assert!(matches!(held, Ok(Some(_))), "{q}");
        assert_eq!(reserve_across_processes(q).map(|l| l.is_some()), Err(()));
        drop(held);
        assert!(
            matches!(reserve_across_processes(q), Ok(Some(_))),
            "released with its file"
        );
    }

    /// Whether this process handed out `port` already (without reserving it).
    fn first_hand_out_seen(port: u16) -> bool {
        std::env::temp_dir()
            .join("bloodraven-ports")
            .join(port.to_string())
            .exists()
    }
}
