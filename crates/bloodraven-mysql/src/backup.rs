//! Physical backups: MariaDB's own `mariadb-backup`, streamed (`mbstream`), compressed by
//! `zstd` and cut into checksummed files beside a manifest; and their verification in a
//! scratch server.
//!
//! # Layout
//! A backup is `<id>/` under the target ([`Storage`]: a directory or an S3-compatible
//! bucket): `data-00000.mbstream.zst`, `data-00001…` (the compressed stream cut every
//! [`CHUNK_BYTES`]) and [`MANIFEST`] (what [`Manifest`] holds: the GTID position, the
//! generation, the source site, each file's size and SHA-256). A backup is whole or absent:
//! a reader never sees half of one. In a directory it is written as `<id>.partial/` and
//! renamed once the manifest is on disk; in a bucket the manifest is put last. An abandoned
//! take leaves nothing that [`list`] shows, and the next take of the same id replaces it.
//!
//! # Memory
//! The tools run as child processes (`mariadb-backup | zstd`); this process only reads the
//! compressed stream through one buffer of [`BUFFER_BYTES`], hashing and writing it (and, to
//! a bucket, at most [`UPLOADS_IN_FLIGHT`] pieces of [`UPLOAD_PIECE_BYTES`]), so what a
//! backup costs the caller's memory does not grow with the data.
//!
//! # Credentials
//! The account reaches `mariadb-backup` in an options file only this process's user can read
//! (`--defaults-extra-file`), removed when the backup ends; never on a command line.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use bloodraven_core::gtid::{GtidFlavor, GtidSet};
use bloodraven_core::time::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::clone::{Endpoint, OptionsFile, Progress, find_tool, private_dir};

mod archive_store;
mod storage;
pub use storage::{Bucket, S3Keys, Storage, UPLOAD_PIECE_BYTES, UPLOADS_IN_FLIGHT};

/// The backup tool (Debian package `mariadb-backup`).
pub const BACKUP_TOOL: &str = "mariadb-backup";
/// The stream extractor (same package).
pub const STREAM_TOOL: &str = "mbstream";
/// The compressor (Debian package `zstd`).
pub const COMPRESS_TOOL: &str = "zstd";
/// The manifest's file name, in each backup's directory.
pub const MANIFEST: &str = "manifest.json";
/// The manifest's format; a reader refuses another.
pub const FORMAT: u32 = 1;
/// Where the compressed stream is cut into the next file: small enough for object storage's
/// single uploads and for a retry of one part, large enough to keep the file count low.
pub const CHUNK_BYTES: u64 = 256 * 1024 * 1024;
/// The one read buffer between the compressor and the files.
pub const BUFFER_BYTES: usize = 1024 * 1024;
/// How much of a tool's standard error is kept for its error.
const STDERR_TAIL: usize = 2048;

/// One file of a backup, as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSum {
    pub name: String,
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
}

/// What a finished backup is: written beside its data and carried into `status.backups`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub id: String,
    pub group: String,
    /// The site the backup was taken on.
    pub site: String,
    /// The GTID set the backup's data holds (MariaDB's `gtid_binlog_pos` at the backup's
    /// consistent point, as `mariadb-backup` reports it).
    pub gtid_position: String,
    pub topology_generation: u64,
    pub start_time: Timestamp,
    pub completion_time: Timestamp,
    /// The stored (compressed) bytes, every file together.
    pub bytes: u64,
    /// The server's version, for the scratch server that verifies or restores it.
    pub server_version: String,
    pub compression: String,
    pub files: Vec<FileSum>,
}

/// How a backup goes, as the source site's sidecar reports it (`GET /backups/{id}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub id: String,
    pub site: String,
    pub phase: bloodraven_core::backup::BackupPhase,
    /// Stored bytes: so far while it runs, all of them once it succeeded.
    pub bytes: u64,
    pub start_time: Timestamp,
    /// Once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<Manifest>,
    /// Why it failed (never a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One backup to take.
#[derive(Clone, Debug)]
pub struct Job {
    /// A new id: letters, digits, `-`, `_` and `.`, not starting with `.` ([`valid_id`]).
    pub id: String,
    pub group: String,
    /// The server, reached with an account that holds `RELOAD, PROCESS, LOCK TABLES,
    /// BINLOG MONITOR` (and `SLAVE MONITOR` on a replica).
    pub endpoint: Endpoint,
    /// The server's data directory as this host sees it, when it differs from the server's
    /// own `@@datadir` (a container that mounts the volume elsewhere); `None`: the server's.
    /// `mariadb-backup` reads the files there, so it runs on the server's host.
    pub datadir: Option<PathBuf>,
    /// The server's version for the manifest; empty: the one `mariadb-backup` reports.
    pub server_version: String,
    pub topology_generation: u64,
    /// Where every backup of the group is kept.
    pub storage: Storage,
    /// The largest file the stream is cut into ([`CHUNK_BYTES`] unless a test wants many).
    pub chunk_bytes: u64,
}

/// Why a backup or its verification failed. Nothing here carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "{tool} was not found on PATH: install the Debian packages mariadb-backup and zstd (or put the tool on PATH)"
    )]
    ToolMissing { tool: &'static str },
    #[error(
        "backup id {id:?} is not valid: use letters, digits, '-', '_' and '.', at most 64, not starting with '.', and not \"binlog\" (the archive's folder)"
    )]
    InvalidId { id: String },
    #[error("a backup {id} exists already under {root}")]
    Exists { id: String, root: String },
    #[error("no backup {id} under {root}")]
    NotFound { id: String, root: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {tool} failed: {source}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} exited with {status}: {stderr}")]
    Tool {
        tool: &'static str,
        status: String,
        stderr: String,
    },
    #[error("{BACKUP_TOOL} reported no GTID position (no \"GTID of the last change\" line)")]
    NoPosition,
    #[error("the manifest {path} cannot be read: {detail}")]
    Manifest { path: String, detail: String },
    #[error("{file}: {what} is {found}, the manifest says {expected}")]
    Mismatch {
        file: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("the backup holds GTID position {found:?}, its manifest says {expected:?}")]
    Position { expected: String, found: String },
    #[error("the scratch server did not open the data: {detail}")]
    Scratch { detail: String },
    /// The storage service refused or failed (never a key: requests are signed, not sent).
    #[error("{op} {target} failed: {detail}")]
    Storage {
        op: &'static str,
        target: String,
        detail: String,
    },
    /// The bucket's keys cannot be read (the error names the key or line, never a value).
    #[error("the S3 keys: {detail}")]
    Keys { detail: String },
}

impl BackupError {
    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupError {
        let path = path.display().to_string();
        move |source| BackupError::Io { what, path, source }
    }
}

impl From<crate::clone::CloneError> for BackupError {
    fn from(e: crate::clone::CloneError) -> Self {
        use crate::clone::CloneError;
        match e {
            CloneError::ToolMissing { tool } => BackupError::ToolMissing { tool },
            CloneError::Spawn { tool, source } => BackupError::Spawn { tool, source },
            CloneError::Credentials(source) => BackupError::Io {
                what: "preparing the tools' credentials file",
                path: std::env::temp_dir().display().to_string(),
                source,
            },
            other => BackupError::Scratch {
                detail: other.to_string(),
            },
        }
    }
}

/// Whether `id` may name a backup (and so a directory): 1 to 64 of letters, digits, `-`, `_`,
/// `.`, not starting with `.`, and not the binlog archive's folder.
pub fn valid_id(id: &str) -> bool {
    // The binlog archive's folder sits beside the backups.
    id != bloodraven_core::binlog::ARCHIVE_DIR
        && !id.is_empty()
        && id.len() <= bloodraven_core::backup::MAX_ID_LEN
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Reads the server version `mariadb-backup` prints when it connects:
/// `Using server version 10.11.6-MariaDB-0+deb12u1-log`.
pub fn version_in(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|l| {
        let (_, rest) = l.split_once("Using server version ")?;
        let v = rest.trim();
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// Reads the position `mariadb-backup` prints once it holds the consistent point:
/// `MySQL binlog position: filename '…', position '…', GTID of the last change '0-1-5'`.
pub fn position_in(stderr: &str) -> Option<String> {
    stderr.lines().rev().find_map(|l| {
        let (_, rest) = l.split_once("GTID of the last change '")?;
        let (gtid, _) = rest.split_once('\'')?;
        Some(gtid.to_string())
    })
}

fn spawn(tool: &'static str, args: &[String], stdin: Stdio) -> Result<Child, BackupError> {
    let path = find_tool(tool)?;
    Command::new(path)
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| BackupError::Spawn { tool, source })
}

/// Reads a tool's standard error as it comes, keeping its last [`STDERR_TAIL`] bytes and the
/// GTID position line wherever it was.
fn stderr_of(child: &mut Child) -> tokio::task::JoinHandle<Said> {
    let err = child.stderr.take();
    tokio::spawn(async move {
        let Some(e) = err else {
            return Said::default();
        };
        let mut lines = tokio::io::BufReader::new(e);
        let mut kept = String::new();
        let mut position = None;
        let mut version = None;
        let mut line = String::new();
        loop {
            line.clear();
            match tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(p) = position_in(&line) {
                position = Some(p);
            }
            if version.is_none() {
                version = version_in(&line);
            }
            kept.push_str(&line);
            if kept.len() > 2 * STDERR_TAIL {
                let cut = kept.len() - STDERR_TAIL;
                let cut = (cut..kept.len())
                    .find(|i| kept.is_char_boundary(*i))
                    .unwrap_or(kept.len());
                kept.drain(..cut);
            }
        }
        Said {
            tail: kept.trim().to_string(),
            position,
            version,
        }
    })
}

/// What a tool said on standard error: its last bytes, and the lines [`take`] reads.
#[derive(Debug, Default)]
struct Said {
    tail: String,
    position: Option<String>,
    version: Option<String>,
}

async fn finished(
    tool: &'static str,
    mut child: Child,
    stderr: tokio::task::JoinHandle<Said>,
) -> Result<Said, BackupError> {
    let status = child
        .wait()
        .await
        .map_err(|source| BackupError::Spawn { tool, source })?;
    let said = stderr.await.unwrap_or_default();
    if status.success() {
        Ok(said)
    } else {
        Err(BackupError::Tool {
            tool,
            status: status.to_string(),
            stderr: said.tail,
        })
    }
}

/// The file the `n`th part of the stream goes to.
fn chunk_name(n: usize) -> String {
    format!("data-{n:05}.mbstream.zst")
}

/// Writes the compressed stream into parts of at most `chunk` bytes, each hashed as it is
/// written; `progress` counts the bytes.
async fn cut_into_files(
    mut from: impl tokio::io::AsyncRead + Unpin,
    staging: &storage::Staging,
    chunk: u64,
    progress: &Progress,
) -> Result<Vec<FileSum>, BackupError> {
    let chunk = chunk.max(1);
    let mut files = Vec::new();
    let mut buf = vec![0u8; BUFFER_BYTES];
    let mut current: Option<storage::PartWriter> = None;
    let result = async {
        loop {
            let n = from
                .read(&mut buf)
                .await
                .map_err(|source| BackupError::Io {
                    what: "reading the compressed stream of",
                    path: COMPRESS_TOOL.into(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let part = match current.as_mut() {
                    Some(p) => p,
                    None => current.insert(staging.part(&chunk_name(files.len())).await?),
                };
                let room = usize::try_from(chunk - part.written()).unwrap_or(usize::MAX);
                let take = rest.len().min(room);
                part.write(&rest[..take]).await?;
                progress.add(take as u64);
                rest = &rest[take..];
                if part.written() == chunk
                    && let Some(done) = current.take()
                {
                    files.push(done.finish().await?);
                }
            }
        }
        if let Some(done) = current.take() {
            files.push(done.finish().await?);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        if let Some(part) = current.take() {
            part.abort().await;
        }
        return Err(e);
    }
    Ok(files)
}

/// Takes a backup of `job.endpoint`'s server into `job.storage` under `job.id`. `now` reads
/// the wall clock (start and completion times); `progress` counts the stored bytes as they
/// are written.
///
/// On any failure nothing is left under `job.id`: the staging directory, or the parts
/// uploaded so far, are removed.
pub async fn take(
    job: &Job,
    now: &(dyn Fn() -> Timestamp + Sync),
    progress: &Progress,
) -> Result<Manifest, BackupError> {
    if !valid_id(&job.id) {
        return Err(BackupError::InvalidId { id: job.id.clone() });
    }
    if job.storage.taken(&job.id).await? {
        return Err(BackupError::Exists {
            id: job.id.clone(),
            root: job.storage.url(),
        });
    }
    let staging = job.storage.stage(&job.id).await?;
    let started = now();
    let (files, position, version) = match stream_into(job, &staging, progress).await {
        Ok(ok) => ok,
        Err(e) => {
            staging.abandon().await;
            return Err(e);
        }
    };
    let manifest = Manifest {
        format: FORMAT,
        id: job.id.clone(),
        group: job.group.clone(),
        site: job.endpoint.site.clone(),
        gtid_position: position,
        topology_generation: job.topology_generation,
        start_time: started,
        completion_time: now(),
        bytes: files.iter().map(|f| f.bytes).sum(),
        server_version: if job.server_version.is_empty() {
            version.unwrap_or_default()
        } else {
            job.server_version.clone()
        },
        compression: COMPRESS_TOOL.into(),
        files,
    };
    let body = serde_json::to_vec_pretty(&manifest).map_err(|e| BackupError::Manifest {
        path: job.storage.manifest_name(&job.id),
        detail: e.to_string(),
    });
    let sealed = match body {
        Ok(body) => staging.seal(&body).await,
        Err(e) => Err(e),
    };
    if let Err(e) = sealed {
        // A seal that failed part-way leaves the staging, or parts without a manifest.
        let _ = job.storage.discard(&job.id).await;
        return Err(e);
    }
    Ok(manifest)
}

/// Runs `mariadb-backup | zstd` into `dir`'s files; the files, the GTID position and the
/// server's version as the tool reported them.
async fn stream_into(
    job: &Job,
    staging: &storage::Staging,
    progress: &Progress,
) -> Result<(Vec<FileSum>, String, Option<String>), BackupError> {
    let private = private_dir()?;
    let cnf = OptionsFile::write(&private, "source.cnf", &job.endpoint)?;
    let scratch = private.join("tmp");
    std::fs::create_dir_all(&scratch).map_err(BackupError::io("creating", &scratch))?;
    let mut args = vec![
        format!("--defaults-extra-file={}", cnf.path.display()),
        "--backup".into(),
        "--stream=mbstream".into(),
        format!("--target-dir={}", scratch.display()),
        format!("--tmpdir={}", scratch.display()),
    ];
    if let Some(d) = &job.datadir {
        args.push(format!("--datadir={}", d.display()));
    }
    let mut backup = spawn(BACKUP_TOOL, &args, Stdio::null())?;
    let backup_err = stderr_of(&mut backup);
    let Some(out) = backup.stdout.take() else {
        return Err(BackupError::Scratch {
            detail: "mariadb-backup has no standard output".into(),
        });
    };
    let into_zstd: Stdio = out.try_into().map_err(|source| BackupError::Spawn {
        tool: COMPRESS_TOOL,
        source,
    })?;
    let zstd_args: Vec<String> = ["-q", "-c", "-1", "-T0"].map(String::from).to_vec();
    let mut zstd = spawn(COMPRESS_TOOL, &zstd_args, into_zstd)?;
    let zstd_err = stderr_of(&mut zstd);
    let Some(compressed) = zstd.stdout.take() else {
        return Err(BackupError::Scratch {
            detail: "zstd has no standard output".into(),
        });
    };
    let files = cut_into_files(compressed, staging, job.chunk_bytes, progress).await;
    let said = finished(BACKUP_TOOL, backup, backup_err).await;
    finished(COMPRESS_TOOL, zstd, zstd_err).await?;
    drop(cnf);
    let _ = std::fs::remove_dir_all(&private);
    let said = said?;
    let position = said.position.ok_or(BackupError::NoPosition)?;
    Ok((files?, position, said.version))
}

/// Reads backup `id`'s manifest.
pub async fn manifest(storage: &Storage, id: &str) -> Result<Manifest, BackupError> {
    if !valid_id(id) {
        return Err(BackupError::InvalidId { id: id.into() });
    }
    let path = storage.manifest_name(id);
    let Some(text) = storage.manifest_bytes(id).await? else {
        return Err(BackupError::NotFound {
            id: id.into(),
            root: storage.url(),
        });
    };
    let m: Manifest = serde_json::from_slice(&text).map_err(|e| BackupError::Manifest {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    if m.format != FORMAT || m.id != id {
        return Err(BackupError::Manifest {
            path,
            detail: format!(
                "format {} id {:?}; expected format {FORMAT} id {id:?}",
                m.format, m.id
            ),
        });
    }
    Ok(m)
}

/// Every whole backup in `storage`, oldest first (by start time, then id). One without a
/// readable manifest (being written, abandoned, or being removed) is left out.
pub async fn list(storage: &Storage) -> Result<Vec<Manifest>, BackupError> {
    let mut out = Vec::new();
    for id in storage.ids().await? {
        if let Ok(m) = manifest(storage, &id).await {
            out.push(m);
        }
    }
    out.sort_by(|a, b| (a.start_time, &a.id).cmp(&(b.start_time, &b.id)));
    Ok(out)
}

/// Removes one whole backup: the manifest first, so a reader that races the removal sees no
/// backup rather than a backup with missing files.
pub async fn remove(storage: &Storage, id: &str) -> Result<(), BackupError> {
    if !valid_id(id) {
        return Err(BackupError::InvalidId { id: id.into() });
    }
    storage.remove(id).await
}

/// Checks every file's size and SHA-256 against the manifest.
pub async fn check_files(storage: &Storage, m: &Manifest) -> Result<(), BackupError> {
    use futures::StreamExt as _;
    for f in &m.files {
        let mut pieces = storage.read(&m.id, &f.name).await?;
        let mut hash = Sha256::new();
        let mut bytes = 0u64;
        while let Some(piece) = pieces.next().await {
            let piece = piece?;
            hash.update(&piece);
            bytes += piece.len() as u64;
        }
        if bytes != f.bytes {
            return Err(BackupError::Mismatch {
                file: f.name.clone(),
                what: "the size",
                expected: f.bytes.to_string(),
                found: bytes.to_string(),
            });
        }
        let found = hex::encode(hash.finalize());
        if found != f.sha256 {
            return Err(BackupError::Mismatch {
                file: f.name.clone(),
                what: "the SHA-256",
                expected: f.sha256.clone(),
                found,
            });
        }
    }
    Ok(())
}

/// Unpacks a backup into `into` (which must be empty or absent) and prepares it
/// (`mariadb-backup --prepare`): a data directory a server of the same version opens.
pub async fn prepare(storage: &Storage, m: &Manifest, into: &Path) -> Result<(), BackupError> {
    std::fs::create_dir_all(into).map_err(BackupError::io("creating", into))?;
    // The files are cuts of one compressed stream at arbitrary bytes (not frames of their
    // own), so they go to one `zstd -d` in order, as one stream, through its standard input.
    let args: Vec<String> = ["-q", "-d", "-c"].map(String::from).to_vec();
    let mut unzip = spawn(COMPRESS_TOOL, &args, Stdio::piped())?;
    let unzip_err = stderr_of(&mut unzip);
    let Some(mut input) = unzip.stdin.take() else {
        return Err(BackupError::Scratch {
            detail: "zstd has no standard input".into(),
        });
    };
    let names: Vec<String> = m.files.iter().map(|f| f.name.clone()).collect();
    let (from, id) = (storage.clone(), m.id.clone());
    let feed = tokio::spawn(async move {
        use futures::StreamExt as _;
        for name in names {
            let mut pieces = from.read(&id, &name).await?;
            while let Some(piece) = pieces.next().await {
                input
                    .write_all(&piece?)
                    .await
                    .map_err(|source| BackupError::Io {
                        what: "feeding the backup to",
                        path: COMPRESS_TOOL.into(),
                        source,
                    })?;
            }
        }
        // Closing the pipe ends zstd's input.
        drop(input);
        Ok::<(), BackupError>(())
    });
    let Some(out) = unzip.stdout.take() else {
        return Err(BackupError::Scratch {
            detail: "zstd has no standard output".into(),
        });
    };
    let stream: Stdio = out.try_into().map_err(|source| BackupError::Spawn {
        tool: STREAM_TOOL,
        source,
    })?;
    let mut extract = spawn(
        STREAM_TOOL,
        &["-x".into(), "-C".into(), into.display().to_string()],
        stream,
    )?;
    let extract_err = stderr_of(&mut extract);
    let fed = feed.await.map_err(|e| BackupError::Scratch {
        detail: format!("feeding the files to zstd stopped: {e}"),
    });
    finished(COMPRESS_TOOL, unzip, unzip_err).await?;
    finished(STREAM_TOOL, extract, extract_err).await?;
    fed??;
    let mut prep = spawn(
        BACKUP_TOOL,
        &[
            "--no-defaults".into(),
            "--prepare".into(),
            format!("--target-dir={}", into.display()),
        ],
        Stdio::null(),
    )?;
    let prep_err = stderr_of(&mut prep);
    finished(BACKUP_TOOL, prep, prep_err).await?;
    let found = recorded_position(into)?;
    if !same_position(&found, &m.gtid_position) {
        return Err(BackupError::Position {
            expected: m.gtid_position.clone(),
            found,
        });
    }
    Ok(())
}

/// The GTID position a prepared backup records (`xtrabackup_binlog_info`'s third column;
/// `mariadb_backup_binlog_info` in later releases).
pub fn recorded_position(datadir: &Path) -> Result<String, BackupError> {
    for name in ["mariadb_backup_binlog_info", "xtrabackup_binlog_info"] {
        let path = datadir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                return Ok(text
                    .split('\t')
                    .nth(2)
                    .map(|g| g.trim().to_string())
                    .unwrap_or_default());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BackupError::io("reading", &path)(e)),
        }
    }
    Err(BackupError::Scratch {
        detail: format!("{} holds no binlog position file", datadir.display()),
    })
}

/// Two positions name the same GTID set (whatever the order of their domains).
fn same_position(a: &str, b: &str) -> bool {
    match (
        GtidSet::parse(GtidFlavor::MariaDb, a),
        GtidSet::parse(GtidFlavor::MariaDb, b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The server binary a scratch server runs: `$BLOODRAVEN_MARIADBD`, then `PATH`, then
/// Debian's `/usr/sbin/mariadbd`.
pub fn server_binary() -> Result<PathBuf, BackupError> {
    if let Some(p) = std::env::var_os("BLOODRAVEN_MARIADBD") {
        return Ok(PathBuf::from(p));
    }
    find_tool("mariadbd")
        .ok()
        .or_else(|| Some(PathBuf::from("/usr/sbin/mariadbd")).filter(|p| p.is_file()))
        .ok_or(BackupError::ToolMissing { tool: "mariadbd" })
}

/// What a verification found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub manifest: Manifest,
    /// The tables the scratch server opened and checked.
    pub tables: usize,
}

/// Verifies a backup the way a restore would use it: every file's checksum, then the data
/// prepared under `scratch` (which must be empty or absent; it holds about the backup's
/// uncompressed size), opened by a scratch server of this host's MariaDB (socket only, no
/// network, no binary log), and every table checked (`mariadb-check`). The GTID position
/// the prepared data records must be the manifest's.
pub async fn verify(storage: &Storage, id: &str, scratch: &Path) -> Result<Verified, BackupError> {
    let m = manifest(storage, id).await?;
    check_files(storage, &m).await?;
    let data = scratch.join("data");
    prepare(storage, &m, &data).await?;
    let server = ScratchServer::start(&data, scratch).await?;
    let checked = server.check_tables().await;
    server.stop().await;
    Ok(Verified {
        manifest: m,
        tables: checked?,
    })
}

/// The schemas a restore from a backup replaces: every database but the server's own.
pub const SYSTEM_DATABASES: [&str; 4] =
    ["mysql", "sys", "performance_schema", "information_schema"];

/// Turns backup `id` into a `mariadb-dump` file at `out` of its application schemas (every
/// database but [`SYSTEM_DATABASES`]), through a scratch server on its prepared data under
/// `work` (empty or absent; about the data's size): what `restore-in-place` loads. Returns the
/// manifest and the databases dumped. The files' checksums are checked first.
pub async fn dump_of(
    storage: &Storage,
    id: &str,
    work: &Path,
    out: &Path,
) -> Result<(Manifest, Vec<String>), BackupError> {
    let (m, server) = open_scratch(storage, id, work).await?;
    let dumped = server.dump_schemas(out).await;
    server.stop().await;
    Ok((m, dumped?))
}

/// Backup `id`, its files checked, prepared under `work` and opened by a scratch server (for a
/// restore to a point, which replays the binlog archive into it before the dump).
///
/// # Errors
/// [`BackupError`]: no such backup, a file that does not check, the prepare or the server.
pub async fn open_scratch(
    storage: &Storage,
    id: &str,
    work: &Path,
) -> Result<(Manifest, ScratchServer), BackupError> {
    let m = manifest(storage, id).await?;
    check_files(storage, &m).await?;
    let data = work.join("data");
    prepare(storage, &m, &data).await?;
    let server = ScratchServer::start(&data, work).await?;
    Ok((m, server))
}

/// A `mariadbd` on a prepared data directory, reachable by its socket only.
#[derive(Debug)]
pub struct ScratchServer {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl ScratchServer {
    /// Starts a server on `data`, its socket and log under `dir`, and waits (at most 120 s)
    /// until it answers.
    pub async fn start(data: &Path, dir: &Path) -> Result<ScratchServer, BackupError> {
        use std::os::unix::fs::MetadataExt as _;
        let socket = dir.join("scratch.sock");
        let log = dir.join("scratch.err");
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}", data.display()),
            format!("--socket={}", socket.display()),
            format!("--pid-file={}", dir.join("scratch.pid").display()),
            format!("--log-error={}", log.display()),
            "--skip-networking".into(),
            "--skip-grant-tables".into(),
            "--skip-log-bin".into(),
            "--skip-slave-start".into(),
            "--innodb-buffer-pool-size=64M".into(),
        ];
        // mariadbd refuses to run as root unless told to.
        if std::fs::metadata(dir).is_ok_and(|m| m.uid() == 0) {
            args.push("--user=root".into());
        }
        let child = Command::new(server_binary()?)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BackupError::Spawn {
                tool: "mariadbd",
                source,
            })?;
        let mut server = ScratchServer { child, socket, log };
        for _ in 0..480 {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(BackupError::Scratch {
                    detail: format!("mariadbd exited with {status}: {}", server.log_tail()),
                });
            }
            if server.socket.exists() && server.sql("SELECT 1").await.is_ok() {
                return Ok(server);
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        let detail = format!(
            "mariadbd did not answer within 120 s: {}",
            server.log_tail()
        );
        server.stop().await;
        Err(BackupError::Scratch { detail })
    }

    /// The socket clients reach it by.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(STDERR_TAIL);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].trim().to_string()
    }

    /// Runs one statement with the `mariadb` client; its tab-separated output.
    pub async fn sql(&self, statement: &str) -> Result<String, BackupError> {
        let out = Command::new(find_tool(crate::clone::LOAD_TOOL)?)
            .args([
                "--no-defaults".to_string(),
                format!("--socket={}", self.socket.display()),
                "--user=root".into(),
                "--batch".into(),
                "--skip-column-names".into(),
                "-e".into(),
                statement.to_string(),
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| BackupError::Spawn {
                tool: crate::clone::LOAD_TOOL,
                source,
            })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(BackupError::Tool {
                tool: crate::clone::LOAD_TOOL,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// Dumps every database but [`SYSTEM_DATABASES`] into `out` with `mariadb-dump`
    /// (routines, events and triggers; one consistent snapshot); the databases dumped.
    pub async fn dump_schemas(&self, out: &Path) -> Result<Vec<String>, BackupError> {
        let listed = self.sql("SHOW DATABASES").await?;
        let databases: Vec<String> = listed
            .lines()
            .map(str::trim)
            .filter(|d| !d.is_empty() && !SYSTEM_DATABASES.contains(d))
            .map(str::to_string)
            .collect();
        if databases.is_empty() {
            return Err(BackupError::Scratch {
                detail: "the backup holds no application database to restore".into(),
            });
        }
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--socket={}", self.socket.display()),
            "--user=root".into(),
            "--single-transaction".into(),
            "--routines".into(),
            "--events".into(),
            "--triggers".into(),
            "--databases".into(),
        ];
        args.extend(databases.iter().cloned());
        let mut dump = spawn(crate::clone::DUMP_TOOL, &args, Stdio::null())?;
        let dump_err = stderr_of(&mut dump);
        let Some(mut from) = dump.stdout.take() else {
            return Err(BackupError::Scratch {
                detail: "mariadb-dump has no standard output".into(),
            });
        };
        let written = async {
            let mut file = tokio::fs::File::create(out)
                .await
                .map_err(BackupError::io("creating", out))?;
            tokio::io::copy(&mut from, &mut file)
                .await
                .map_err(BackupError::io("writing", out))?;
            file.sync_all()
                .await
                .map_err(BackupError::io("syncing", out))
        }
        .await;
        let ended = finished(crate::clone::DUMP_TOOL, dump, dump_err).await;
        if let Err(e) = written.and(ended.map(|_| ())) {
            let _ = std::fs::remove_file(out);
            return Err(e);
        }
        Ok(databases)
    }

    /// Checks every table (`mariadb-check --all-databases`); how many answered `OK`. A table
    /// that answers anything else fails the check, named.
    pub async fn check_tables(&self) -> Result<usize, BackupError> {
        let out = Command::new(find_tool("mariadb-check")?)
            .args([
                "--no-defaults".to_string(),
                format!("--socket={}", self.socket.display()),
                "--user=root".into(),
                "--all-databases".into(),
                "--check".into(),
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| BackupError::Spawn {
                tool: "mariadb-check",
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(BackupError::Tool {
                tool: "mariadb-check",
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        tables_ok(&text)
    }

    /// Stops the server (it holds nothing worth a clean shutdown).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// Reads `mariadb-check`'s report: `db.table  OK` per table, or the table's name alone
/// followed by `note :`, `warning :` or `error :` lines. A table with an `error` line fails
/// the check, named; notes and warnings pass.
fn tables_ok(report: &str) -> Result<usize, BackupError> {
    let mut ok = 0;
    let mut current = "";
    for line in report.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (head, rest) = line.split_once(':').unwrap_or((line, ""));
        match head.trim().to_ascii_lowercase().as_str() {
            "error" => {
                return Err(BackupError::Scratch {
                    detail: format!("the check of {current} said: {}", rest.trim()),
                });
            }
            "note" | "warning" | "status" | "info" => {}
            _ => match line.strip_suffix("OK") {
                Some(name) if !name.trim().is_empty() => {
                    ok += 1;
                    current = name.trim();
                }
                _ => current = line,
            },
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_is_read_off_the_tools_report() {
        let err = "[00] 2026-12-07 07:05:42 Streaming ./mysql/gtid_slave_pos.ibd\n\
                   [00] 2026-12-07 07:05:43 MySQL binlog position: filename 'mysql-bin.000001', position '795', GTID of the last change '0-7-3,1-2-9'\n\
                   [00] 2026-12-07 07:05:43 completed OK!\n";
        assert_eq!(position_in(err).as_deref(), Some("0-7-3,1-2-9"));
        assert_eq!(position_in("completed OK!"), None);
        assert_eq!(position_in("GTID of the last change '"), None);
        let said = "[00] 2026-12-07 07:05:41 Connecting to MariaDB server host: 127.0.0.1\n\
                    [00] 2026-12-07 07:05:41 Using server version 10.11.6-MariaDB-0+deb12u1-log\n";
        assert_eq!(
            version_in(said).as_deref(),
            Some("10.11.6-MariaDB-0+deb12u1-log")
        );
        assert_eq!(version_in("Using server version "), None);
    }

    #[test]
    fn ids_are_directory_names_and_nothing_else() {
        for ok in ["20261207T070500Z", "nightly-1", "a.b_c"] {
            assert!(valid_id(ok), "{ok}");
        }
        // The ids the operator and the commands make, whatever the group's name.
        let t = Timestamp::from_unix_millis(1_800_000_000_123);
        for group in ["shop", &"g".repeat(253), "a.b-c"] {
            let id = bloodraven_core::backup::backup_id(group, t);
            assert!(valid_id(&id), "{id}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a b",
            &"x".repeat(65),
        ] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_table_the_check_does_not_call_ok_fails_the_check_by_name() {
        let good = "app.t                                              OK\nmysql.user\nnote     : The storage engine for the table doesn't support check\nmysql.db                                           OK\n";
        assert_eq!(tables_ok(good).unwrap(), 2);
        let bad =
            "app.t\nerror    : Corrupt\napp.u                                              OK\n";
        let err = tables_ok(bad).unwrap_err().to_string();
        assert!(err.contains("app.t"), "{err}");
    }

    #[test]
    fn positions_compare_as_sets() {
        assert!(same_position("0-1-5,1-2-3", "1-2-3,0-1-5"));
        assert!(!same_position("0-1-5", "0-1-6"));
    }

    #[tokio::test]
    async fn the_stream_is_cut_into_hashed_files_that_check() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let storage = Storage::Dir(root.to_path_buf());
        let id = "t1";
        let data: Vec<u8> = (0..3 * BUFFER_BYTES + 17)
            .map(|i| u8::try_from(i % 251).unwrap_or_default())
            .collect();
        let progress = Progress::default();
        let staging = storage.stage(id).await.unwrap();
        // Cut every 2 MiB: two whole parts and a short last one.
        let chunk = 2 * BUFFER_BYTES as u64;
        let files = cut_into_files(&data[..], &staging, chunk, &progress)
            .await
            .unwrap();
        assert_eq!(progress.bytes(), data.len() as u64);
        assert_eq!(
            files.iter().map(|f| f.bytes).collect::<Vec<_>>(),
            vec![chunk, data.len() as u64 - chunk]
        );
        let split = usize::try_from(chunk).unwrap();
        assert_eq!(files[0].sha256, hex::encode(Sha256::digest(&data[..split])));
        assert_eq!(files[1].sha256, hex::encode(Sha256::digest(&data[split..])));
        // Not listed until sealed.
        assert!(list(&storage).await.unwrap().is_empty());
        let m = Manifest {
            format: FORMAT,
            id: id.into(),
            group: "g".into(),
            site: "s".into(),
            gtid_position: "0-1-1".into(),
            topology_generation: 1,
            start_time: Timestamp::from_unix_millis(0),
            completion_time: Timestamp::from_unix_millis(1),
            bytes: data.len() as u64,
            server_version: "10.11".into(),
            compression: COMPRESS_TOOL.into(),
            files,
        };
        staging
            .seal(&serde_json::to_vec(&m).unwrap())
            .await
            .unwrap();
        assert_eq!(list(&storage).await.unwrap(), vec![m.clone()]);
        check_files(&storage, &m).await.unwrap();
        // One byte changed: the check names the file and the SHA-256.
        let path = root.join(id).join(chunk_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[1000] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = check_files(&storage, &m).await.unwrap_err().to_string();
        assert!(
            err.contains("data-00000.mbstream.zst: the SHA-256"),
            "{err}"
        );
        // A truncated file: the size.
        std::fs::write(&path, &bytes[..10]).unwrap();
        let err = check_files(&storage, &m).await.unwrap_err().to_string();
        assert!(err.contains("the size is 10"), "{err}");
        // A removal takes the manifest first, then the rest.
        remove(&storage, id).await.unwrap();
        assert!(!root.join(id).exists());
        assert!(list(&storage).await.unwrap().is_empty());
    }
}
