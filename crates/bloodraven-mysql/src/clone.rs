//! The copy of a reclone: MariaDB's own client tools, `mariadb-dump` on the donor streamed
//! into `mariadb` on the target through this process, with no temporary file.
//!
//! - The dump is consistent and carries its GTID position: `--single-transaction
//!   --master-data=2 --gtid` on a primary donor, `--dump-slave=2 --gtid` on a replica donor
//!   (its applied source position; the tool stops the donor's applier while it reads the
//!   position and starts it again). The position is printed, commented, near the end of the
//!   dump (`-- SET GLOBAL gtid_slave_pos='…';`); this module reads it off the stream.
//! - The load runs with binary logging off for its session (`--init-command="SET SESSION
//!   sql_log_bin=0"`), so it creates no GTID on the target: the target's position is the
//!   copy's alone ([`crate::SiteClient::seed_gtid_position`]).
//! - Databases the donor does not have are dropped first (in the same unlogged session): a
//!   divergent site's extra schema goes with the rest of its divergence.
//! - Credentials reach the tools in a file only this process can read (`--defaults-extra-file`),
//!   never on a command line another user could list; the file is removed when the copy ends.
//! - Bytes are counted as they pass ([`Progress`]); a copy dropped mid-way kills both tools.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bloodraven_core::gtid::{GtidFlavor, GtidSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::creds::Credentials;

/// The dump tool (Debian package `mariadb-client`).
pub const DUMP_TOOL: &str = "mariadb-dump";
/// The client that loads the dump.
pub const LOAD_TOOL: &str = "mariadb";

/// How much of a tool's standard error is kept for its error.
const STDERR_TAIL: usize = 2048;

/// Where a tool connects: one server and the clone account's credentials.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The site's name, for errors.
    pub site: String,
    pub host: String,
    pub port: u16,
    pub credentials: Credentials,
    /// TLS to the server (`spec.sites[].mysql.tls`): the tools verify the certificate against
    /// `host` (they have no separate server name).
    pub tls: bloodraven_core::config::MysqlTls,
}

/// One copy, as the reclone decided it.
#[derive(Clone, Debug)]
pub struct CopyPlan {
    pub donor: Endpoint,
    /// The donor is a replica (`--dump-slave`), not the primary (`--master-data`).
    pub donor_is_replica: bool,
    pub target: Endpoint,
    /// The donor's databases (what is copied); empty copies nothing and is refused.
    pub databases: Vec<String>,
    /// The target's databases the donor does not have: dropped before the load.
    pub drop: Vec<String>,
}

/// How far a running copy got, shared with whoever reports it.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    pub fn bytes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// A finished copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copied {
    pub bytes: u64,
    /// The GTID position the copy was taken at: the target's position once loaded.
    pub position: GtidSet,
    pub took: Duration,
}

/// Why a copy failed. Nothing here carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error(
        "{tool} was not found on PATH: install the mariadb-client package (or put the tool on PATH)"
    )]
    ToolMissing { tool: &'static str },
    #[error("the donor {site} has no database to copy")]
    NothingToCopy { site: String },
    #[error("cannot prepare the tools' credentials file: {0}")]
    Credentials(std::io::Error),
    #[error("starting {tool} failed: {source}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("streaming the copy from {donor} to {target} failed after {bytes} bytes: {source}")]
    Stream {
        donor: String,
        target: String,
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} on {site} exited with {status}: {stderr}")]
    Tool {
        tool: &'static str,
        site: String,
        status: String,
        stderr: String,
    },
    #[error("the dump of {site} carries no GTID position (no `SET GLOBAL gtid_slave_pos` line)")]
    NoPosition { site: String },
}

/// `name` as found on `PATH`.
pub fn find_tool(name: &'static str) -> Result<PathBuf, CloneError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(CloneError::ToolMissing { tool: name })
}

/// A `[client]` options file with the account and the address, readable by this process's
/// user only. Removed on drop.
pub(crate) struct OptionsFile {
    dir: PathBuf,
    pub(crate) path: PathBuf,
}

impl OptionsFile {
    pub(crate) fn write(dir: &Path, name: &str, e: &Endpoint) -> Result<OptionsFile, CloneError> {
        use bloodraven_core::config::TlsMode;
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(CloneError::Credentials)?;
        // Option files take values in double quotes with backslash escapes.
        let quoted = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
        writeln!(
            f,
            "[client]\nuser={}\npassword={}\nhost={}\nport={}\nprotocol=TCP",
            quoted(&e.credentials.user),
            quoted(e.credentials.password.expose()),
            quoted(&e.host),
            e.port
        )
        .map_err(CloneError::Credentials)?;
        match e.tls.mode {
            TlsMode::Disabled => {}
            TlsMode::Required => {
                writeln!(f, "ssl\nskip-ssl-verify-server-cert").map_err(CloneError::Credentials)?;
            }
            TlsMode::VerifyIdentity => {
                writeln!(f, "ssl\nssl-verify-server-cert").map_err(CloneError::Credentials)?;
                if let Some(ca) = &e.tls.ca_file {
                    writeln!(f, "ssl-ca={}", quoted(ca)).map_err(CloneError::Credentials)?;
                }
            }
        }
        Ok(OptionsFile {
            dir: dir.to_path_buf(),
            path,
        })
    }

    /// The SQL client's arguments to load a dump into this file's server: the load is kept
    /// out of the target's binary log, and a dump's binary values and large rows pass.
    pub(crate) fn load_args(&self) -> Vec<String> {
        vec![
            format!("--defaults-extra-file={}", self.path.display()),
            "--init-command=SET SESSION sql_log_bin=0".to_string(),
            "--binary-mode".to_string(),
            "--max-allowed-packet=1G".to_string(),
        ]
    }
}

impl Drop for OptionsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A private directory for the options files (a new one per copy: this process's pid and a
/// counter; one left by an earlier process of the same pid is never reused).
pub(crate) fn private_dir() -> Result<PathBuf, CloneError> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("bloodraven-clone-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CloneError::Credentials(e)),
        }
    }
}

/// The dump's arguments (after the options file).
fn dump_args(plan: &CopyPlan) -> Vec<String> {
    let mut a: Vec<String> = [
        "--single-transaction",
        "--gtid",
        "--routines",
        "--events",
        "--triggers",
        "--add-drop-database",
        "--hex-blob",
        "--max-allowed-packet=1G",
        "--net-buffer-length=1M",
    ]
    .map(String::from)
    .to_vec();
    a.push(if plan.donor_is_replica {
        "--dump-slave=2".into()
    } else {
        "--master-data=2".into()
    });
    a.push("--databases".into());
    a.extend(plan.databases.iter().cloned());
    a
}

/// The statements the load runs before the dump: the target's databases the donor lacks.
fn prelude(plan: &CopyPlan) -> String {
    let mut out = String::new();
    for d in &plan.drop {
        out.push_str("DROP DATABASE IF EXISTS `");
        out.push_str(&d.replace('`', "``"));
        out.push_str("`;\n");
    }
    out
}

/// Reads the position the dump prints near its end: the last
/// `-- SET GLOBAL gtid_slave_pos='…';` line of `tail`.
pub fn position_in(tail: &str) -> Option<GtidSet> {
    tail.lines()
        .rev()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("-- SET GLOBAL gtid_slave_pos='")?
                .strip_suffix("';")
        })
        .find_map(|g| GtidSet::parse(GtidFlavor::MariaDb, g).ok())
}

pub(crate) fn spawn(tool: &'static str, args: &[String], stdin: bool) -> Result<Child, CloneError> {
    let path = find_tool(tool)?;
    Command::new(path)
        .args(args)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(if stdin { Stdio::null() } else { Stdio::piped() })
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CloneError::Spawn { tool, source })
}

/// Reads a tool's standard error as it comes (a tool that fills the pipe would otherwise
/// stop), keeping its last [`STDERR_TAIL`] bytes.
pub(crate) fn stderr_tail(child: &mut Child) -> tokio::task::JoinHandle<String> {
    let err = child.stderr.take();
    tokio::spawn(async move {
        let Some(mut e) = err else {
            return String::new();
        };
        let mut kept: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = e.read(&mut buf).await {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > 2 * STDERR_TAIL {
                kept.drain(..kept.len() - STDERR_TAIL);
            }
        }
        let start = kept.len().saturating_sub(STDERR_TAIL);
        String::from_utf8_lossy(&kept[start..]).trim().to_string()
    })
}

/// Streams `prelude`, then the dump, into the loader, counting the bytes into `total` and
/// `progress` and keeping the dump's tail (a few kilobytes before its end, where its position
/// is) in `tail`.
async fn pump(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    prelude: &str,
    progress: &Progress,
    total: &mut u64,
    tail: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    to.write_all(prelude.as_bytes()).await?;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        *total += n as u64;
        progress.add(n as u64);
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 64 * 1024 {
            tail.drain(..tail.len() - 32 * 1024);
        }
    }
    to.shutdown().await
}

/// Copies the plan's databases from the donor into the target, counting bytes into
/// `progress`. The target must be prepared ([`crate::SiteClient::prepare_clone_target`]).
pub async fn copy(plan: &CopyPlan, progress: &Progress) -> Result<Copied, CloneError> {
    if plan.databases.is_empty() {
        return Err(CloneError::NothingToCopy {
            site: plan.donor.site.clone(),
        });
    }
    find_tool(DUMP_TOOL)?;
    find_tool(LOAD_TOOL)?;
    let started = Instant::now();
    let dir = private_dir()?;
    let donor_cnf = OptionsFile::write(&dir, "donor.cnf", &plan.donor)?;
    let target_cnf = OptionsFile::write(&dir, "target.cnf", &plan.target)?;
    let mut dump_argv = vec![format!(
        "--defaults-extra-file={}",
        donor_cnf.path.display()
    )];
    dump_argv.extend(dump_args(plan));
    let mut dump = spawn(DUMP_TOOL, &dump_argv, false)?;
    let mut load = spawn(LOAD_TOOL, &target_cnf.load_args(), true)?;
    let dump_stderr = stderr_tail(&mut dump);
    let load_stderr = stderr_tail(&mut load);
    let (Some(mut from), Some(mut to)) = (dump.stdout.take(), load.stdin.take()) else {
        return Err(CloneError::Stream {
            donor: plan.donor.site.clone(),
            target: plan.target.site.clone(),
            bytes: 0,
            source: std::io::Error::other("the tools' pipes were not opened"),
        });
    };
    let stream_err = |bytes, source| CloneError::Stream {
        donor: plan.donor.site.clone(),
        target: plan.target.site.clone(),
        bytes,
        source,
    };
    let mut total = 0u64;
    let mut tail: Vec<u8> = Vec::new();
    let piped = pump(
        &mut from,
        &mut to,
        &prelude(plan),
        progress,
        &mut total,
        &mut tail,
    )
    .await
    .map_err(|e| stream_err(total, e));
    drop(to);
    let dump_status = dump.wait().await;
    let load_status = load.wait().await;
    let dump_err = dump_stderr.await.unwrap_or_default();
    let load_err = load_stderr.await.unwrap_or_default();
    let failed = |tool, site: &str, status: std::io::Result<std::process::ExitStatus>, stderr| {
        CloneError::Tool {
            tool,
            site: site.to_string(),
            status: status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            stderr,
        }
    };
    // The dump's own failure explains a broken pipe better than the pipe does.
    if !dump_status
        .as_ref()
        .is_ok_and(std::process::ExitStatus::success)
    {
        return Err(failed(DUMP_TOOL, &plan.donor.site, dump_status, dump_err));
    }
    if !load_status
        .as_ref()
        .is_ok_and(std::process::ExitStatus::success)
    {
        return Err(failed(LOAD_TOOL, &plan.target.site, load_status, load_err));
    }
    piped?;
    let position =
        position_in(&String::from_utf8_lossy(&tail)).ok_or_else(|| CloneError::NoPosition {
            site: plan.donor.site.clone(),
        })?;
    Ok(Copied {
        bytes: total,
        position,
        took: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(replica: bool) -> CopyPlan {
        let e = |site: &str| Endpoint {
            tls: bloodraven_core::config::MysqlTls::default(),
            site: site.into(),
            host: "127.0.0.1".into(),
            port: 3306,
            credentials: Credentials::new("clone", "s3cr\"et"),
        };
        CopyPlan {
            donor: e("reader"),
            donor_is_replica: replica,
            target: e("iad"),
            databases: vec!["app".into(), "shop".into()],
            drop: vec!["stray".into(), "we`ird".into()],
        }
    }

    #[test]
    fn the_dump_records_its_position_and_the_load_drops_what_the_donor_lacks() {
        let a = dump_args(&plan(true));
        assert!(a.contains(&"--dump-slave=2".to_string()), "{a:?}");
        assert!(a.contains(&"--gtid".to_string()));
        assert!(a.contains(&"--single-transaction".to_string()));
        assert!(a.ends_with(&["--databases".into(), "app".into(), "shop".into()]));
        let a = dump_args(&plan(false));
        assert!(a.contains(&"--master-data=2".to_string()), "{a:?}");
        assert!(
            !a.iter().any(|x| x.contains("s3cr")),
            "no secret on a command line"
        );
        assert_eq!(
            prelude(&plan(true)),
            "DROP DATABASE IF EXISTS `stray`;\nDROP DATABASE IF EXISTS `we``ird`;\n"
        );
    }

    #[test]
    fn the_position_is_the_last_commented_gtid_line() {
        let tail = "INSERT INTO t VALUES (1);\n--\n-- The deferred gtid setting for slave corresponding to the dump-slave CHANGE-MASTER follows\n--\n-- GTID position to start replication:\n-- SET GLOBAL gtid_slave_pos='0-1-16,1-2-7';\n/*!40103 SET TIME_ZONE=@OLD_TIME_ZONE */;\n";
        assert_eq!(
            position_in(tail).map(|g| g.to_string()).as_deref(),
            Some("0-1-16,1-2-7")
        );
        assert_eq!(
            position_in("-- SET GLOBAL gtid_slave_pos='garbage';\n"),
            None
        );
        assert_eq!(position_in("no position here"), None);
    }

    #[test]
    fn the_options_file_is_private_quoted_and_removed() {
        let dir = private_dir().unwrap();
        let e = plan(true).donor;
        let path = {
            use std::os::unix::fs::PermissionsExt;
            let f = OptionsFile::write(&dir, "donor.cnf", &e).unwrap();
            let mode = std::fs::metadata(&f.path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let text = std::fs::read_to_string(&f.path).unwrap();
            assert!(text.contains("password=\"s3cr\\\"et\""), "{text}");
            f.path.clone()
        };
        assert!(!path.exists(), "removed on drop");
        assert!(!dir.exists());
    }
}
