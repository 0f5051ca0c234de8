//! The playground's router: Debian's `haproxy` in front of the three servers, as
//! docs/sidecar.md configures one. Its primary port sends every connection to the site whose
//! sidecar answers `GET /primary` with `200` (checked every 100 ms, sessions on a site marked
//! down are shut), its replica port to the sites whose sidecar answers `GET /replica`. The
//! counter app writes through the primary port, so what a switchover costs an application
//! behind a router is what the dashboard shows.
//!
//! The configuration is written into the playground's directory (`haproxy.cfg`), with a stats
//! socket there (`haproxy.sock`) through which the dashboard reads HAProxy's own view of each
//! backend (`show stat`). HAProxy reaches the servers and the sidecars directly, as the
//! application does: the playground's cuttable links are the operator's and the replicas'
//! paths, not the application's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// One server behind the router.
#[derive(Clone, Debug)]
pub struct RoutedSite {
    pub name: String,
    pub mysql_port: u16,
    pub sidecar_port: u16,
    /// A reader is never behind the primary port.
    pub reader: bool,
}

/// Starting or asking the router failed.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(
        "HAProxy ({bin}) cannot run: {detail}; the playground's counter app writes through it. Install it with: sudo apt-get install -y --no-install-recommends haproxy (scripts/playground does)"
    )]
    Missing { bin: String, detail: String },
    #[error("HAProxy refused the configuration {path}: {detail}")]
    Config { path: String, detail: String },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error("HAProxy's stats socket: {0}")]
    Stats(String),
}

/// The running router (stopped when dropped).
#[derive(Debug)]
pub struct Router {
    child: Child,
    /// Processes a reload replaced, until they exit (`hard-stop-after`).
    retired: Vec<Child>,
    pub primary_port: u16,
    pub replica_port: u16,
    pub config_path: PathBuf,
    socket: PathBuf,
}

/// HAProxy's view of one server in one backend.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendServer {
    /// `primary` or `replica`.
    pub backend: String,
    pub site: String,
    /// `UP`, `DOWN`, `MAINT`, …, as HAProxy says.
    pub status: String,
    /// The last check's result (`L7OK`, `L7STS` for a `503`, `L4CON`, …) and its HTTP code.
    pub check: String,
    /// Seconds since the last change of `status`.
    pub since_seconds: Option<u64>,
}

/// The binary: `$BLOODRAVEN_HAPROXY`, else `haproxy` on `PATH`, else Debian's
/// `/usr/sbin/haproxy` (not on a normal user's `PATH`).
pub fn binary() -> String {
    if let Ok(b) = std::env::var("BLOODRAVEN_HAPROXY") {
        return b;
    }
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("haproxy").is_file()));
    if on_path || !Path::new("/usr/sbin/haproxy").is_file() {
        "haproxy".into()
    } else {
        "/usr/sbin/haproxy".into()
    }
}

/// Starts HAProxy in the foreground (`-db`) on `config` with `extra` arguments, its log to
/// `log`; killed when its handle is dropped.
fn spawn_haproxy(
    bin: &str,
    config: &Path,
    extra: &[String],
    log: std::fs::File,
) -> Result<tokio::process::Child, RouterError> {
    Command::new(bin)
        .arg("-db")
        .arg("-f")
        .arg(config)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| RouterError::Missing {
            bin: bin.to_string(),
            detail: e.to_string(),
        })
}

/// How long an HAProxy process replaced by a reload may go on serving its connections.
pub const HARD_STOP_AFTER: Duration = Duration::from_secs(5);

/// The configuration: docs/sidecar.md's, on loopback, with a stats socket at `socket`. The
/// sidecars' checks go over TLS, their certificates verified against the component CA `ca`
/// (the checks are open endpoints: HAProxy presents no certificate).
pub fn config(
    sites: &[RoutedSite],
    primary_port: u16,
    replica_port: u16,
    socket: &Path,
    ca: &Path,
) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "global");
    let _ = writeln!(c, "  stats socket {} mode 600 level user", socket.display());
    // A reload (a new CA bundle for the checks: HAProxy reads a ca-file only at start) leaves
    // the old process serving its connections for at most this long.
    let _ = writeln!(c, "  hard-stop-after {}s", HARD_STOP_AFTER.as_secs());
    let _ = writeln!(c);
    let _ = writeln!(c, "defaults");
    let _ = writeln!(c, "  mode tcp");
    let _ = writeln!(c, "  timeout connect 2s");
    let _ = writeln!(c, "  timeout client 1h");
    let _ = writeln!(c, "  timeout server 1h");
    let server = |c: &mut String, s: &RoutedSite| {
        let _ = writeln!(
            c,
            "  server {} 127.0.0.1:{} check port {} check-ssl verify required ca-file {}",
            s.name,
            s.mysql_port,
            s.sidecar_port,
            ca.display()
        );
    };
    let _ = writeln!(c);
    let _ = writeln!(c, "backend mysql-primary");
    let _ = writeln!(c, "  option httpchk GET /primary");
    let _ = writeln!(c, "  http-check expect status 200");
    let _ = writeln!(
        c,
        "  default-server inter 100ms fall 1 rise 1 on-marked-down shutdown-sessions"
    );
    for s in sites.iter().filter(|s| !s.reader) {
        server(&mut c, s);
    }
    let _ = writeln!(c);
    let _ = writeln!(c, "backend mysql-replica");
    let _ = writeln!(c, "  balance leastconn");
    let _ = writeln!(c, "  option httpchk GET /replica?lag=5");
    let _ = writeln!(c, "  http-check expect status 200");
    let _ = writeln!(
        c,
        "  default-server inter 1s fall 2 rise 1 on-marked-down shutdown-sessions"
    );
    for s in sites {
        server(&mut c, s);
    }
    let _ = writeln!(c);
    let _ = writeln!(c, "frontend primary");
    let _ = writeln!(c, "  bind 127.0.0.1:{primary_port}");
    let _ = writeln!(c, "  default_backend mysql-primary");
    let _ = writeln!(c);
    let _ = writeln!(c, "frontend replica");
    let _ = writeln!(c, "  bind 127.0.0.1:{replica_port}");
    let _ = writeln!(c, "  default_backend mysql-replica");
    c
}

impl Router {
    /// Writes the configuration into `dir`, checks it (`haproxy -c`) and starts HAProxy in
    /// the foreground (`-db`), its output in `log`.
    pub async fn start(
        dir: &Path,
        sites: &[RoutedSite],
        primary_port: u16,
        replica_port: u16,
        ca: &Path,
        log: std::fs::File,
    ) -> Result<Router, RouterError> {
        let bin = binary();
        let config_path = dir.join("haproxy.cfg");
        let socket = dir.join("haproxy.sock");
        let _ = std::fs::remove_file(&socket);
        std::fs::write(
            &config_path,
            config(sites, primary_port, replica_port, &socket, ca),
        )
        .map_err(|e| RouterError::Write {
            path: config_path.display().to_string(),
            detail: e.to_string(),
        })?;
        let checked = Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&config_path)
            .output()
            .await
            .map_err(|e| RouterError::Missing {
                bin: bin.clone(),
                detail: e.to_string(),
            })?;
        if !checked.status.success() {
            return Err(RouterError::Config {
                path: config_path.display().to_string(),
                detail: String::from_utf8_lossy(&checked.stderr).trim().to_string(),
            });
        }
        let child = spawn_haproxy(&bin, &config_path, &[], log)?;
        let r = Router {
            child,
            retired: Vec::new(),
            primary_port,
            replica_port,
            config_path,
            socket,
        };
        // Ready once its stats socket answers (its ports are bound by then).
        for _ in 0..100 {
            if r.backends().await.is_ok() {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(RouterError::Stats(format!(
            "{} did not answer within 5 s",
            r.socket.display()
        )))
    }

    /// The pid of the HAProxy process.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// One command on the stats socket, and its answer.
    async fn command(&self, command: &str) -> Result<String, RouterError> {
        let stats = |e: std::io::Error| RouterError::Stats(e.to_string());
        let mut s = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::UnixStream::connect(&self.socket),
        )
        .await
        .map_err(|_| RouterError::Stats("no answer within 1 s".into()))?
        .map_err(stats)?;
        s.write_all(command.as_bytes()).await.map_err(stats)?;
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(1), s.read_to_string(&mut out))
            .await
            .map_err(|_| RouterError::Stats("no answer within 1 s".into()))?
            .map_err(stats)?;
        Ok(out)
    }

    /// HAProxy's view of every server of both backends (`show stat`).
    pub async fn backends(&self) -> Result<Vec<BackendServer>, RouterError> {
        let out = self.command("show stat\n").await?;
        parse_stats(&out).ok_or_else(|| RouterError::Stats(format!("unreadable: {out:.200}")))
    }

    /// Reloads HAProxy (`-sf`): a new process reads the configuration and the CA bundle again
    /// (HAProxy reads a `ca-file` only at start; its runtime API does not update the CA of a
    /// server's checks in 2.6) and takes new connections; the old one serves the ones it has
    /// for at most [`HARD_STOP_AFTER`], then closes them (clients reconnect to the new one).
    pub async fn reload(&mut self, log: std::fs::File) -> Result<(), RouterError> {
        let bin = binary();
        let old = self.child.id().unwrap_or_default();
        let child = spawn_haproxy(
            &bin,
            &self.config_path,
            &["-sf".into(), old.to_string()],
            log,
        )?;
        let previous = std::mem::replace(&mut self.child, child);
        self.retired
            .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        self.retired.push(previous);
        // Ready once the new process's stats socket answers.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if self.backends().await.is_ok() {
                return Ok(());
            }
        }
        Err(RouterError::Stats(format!(
            "{} did not answer within 5 s of the reload",
            self.socket.display()
        )))
    }

    /// Stops HAProxy (the playground's own children, by their handles).
    pub async fn stop(mut self) {
        for mut c in self.retired.drain(..) {
            let _ = c.kill().await;
        }
        let _ = self.child.kill().await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `show stat`'s CSV: a `# pxname,svname,…` header, then a line per proxy and server. Only
/// the servers of the two backends are kept.
fn parse_stats(csv: &str) -> Option<Vec<BackendServer>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (px, sv, status, check, code, lastchg) = (
        col("pxname")?,
        col("svname")?,
        col("status")?,
        col("check_status")?,
        col("check_code")?,
        col("lastchg")?,
    );
    let mut out = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let get = |i: usize| f.get(i).copied().unwrap_or_default();
        let backend = match get(px) {
            "mysql-primary" => "primary",
            "mysql-replica" => "replica",
            _ => continue,
        };
        if matches!(get(sv), "BACKEND" | "FRONTEND") {
            continue;
        }
        let code = get(code);
        out.push(BackendServer {
            backend: backend.into(),
            site: get(sv).into(),
            status: get(status).into(),
            check: if code.is_empty() {
                get(check).to_string()
            } else {
                format!("{} {code}", get(check))
            },
            since_seconds: get(lastchg).parse().ok(),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_routes_writes_to_candidates_only_and_checks_every_100_ms() {
        let sites = [
            RoutedSite {
                name: "iad".into(),
                mysql_port: 3301,
                sidecar_port: 8081,
                reader: false,
            },
            RoutedSite {
                name: "reader".into(),
                mysql_port: 3303,
                sidecar_port: 8083,
                reader: true,
            },
        ];
        let c = config(
            &sites,
            6033,
            6034,
            Path::new("/tmp/pg/haproxy.sock"),
            Path::new("/tmp/pg/pki/ca.crt"),
        );
        let primary =
            &c[c.find("backend mysql-primary").unwrap()..c.find("backend mysql-replica").unwrap()];
        assert!(primary.contains("option httpchk GET /primary"));
        assert!(primary.contains("inter 100ms fall 1 rise 1 on-marked-down shutdown-sessions"));
        assert!(primary.contains(
            "server iad 127.0.0.1:3301 check port 8081 check-ssl verify required ca-file /tmp/pg/pki/ca.crt"
        ));
        assert!(!primary.contains("reader"), "a reader never takes writes");
        assert!(c.contains("server reader 127.0.0.1:3303 check port 8083"));
        assert!(c.contains("bind 127.0.0.1:6033") && c.contains("bind 127.0.0.1:6034"));
        assert!(c.contains("stats socket /tmp/pg/haproxy.sock mode 600 level user"));
        assert!(c.contains("hard-stop-after 5s"));
    }

    #[test]
    fn show_stat_is_read_by_column_name() {
        let csv = "# pxname,svname,qcur,status,lastchg,check_status,check_code\n\
                   primary,FRONTEND,,OPEN,,,\n\
                   mysql-primary,iad,0,UP,12,L7OK,200\n\
                   mysql-primary,pdx,0,DOWN,3,L7STS,503\n\
                   mysql-primary,BACKEND,0,UP,12,,\n\
                   mysql-replica,reader,0,UP,40,L7OK,200\n";
        let b = parse_stats(csv).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(
            b[1],
            BackendServer {
                backend: "primary".into(),
                site: "pdx".into(),
                status: "DOWN".into(),
                check: "L7STS 503".into(),
                since_seconds: Some(3),
            }
        );
        assert_eq!(b[2].backend, "replica");
        assert!(parse_stats("").is_none());
        assert!(parse_stats("# a,b\n").is_none(), "columns missing");
    }
}
