//! The binlog archive (point-in-time recovery): an archiver that follows one primary as a
//! replica does and writes its transactions to the backup target in immutable segments, and
//! the replay of archived transactions into a server. What segments mean (the chain, gaps,
//! forks, the plan) is [`bloodraven_core::binlog`]'s; this module moves the bytes.
//!
//! # The reader
//! `mariadb-binlog --read-from-remote-server --raw --stop-never --start-position=<GTID>`
//! (package `mariadb-client`). MariaDB's GTID dump needs `@mariadb_slave_capability=4` and
//! `@slave_connect_state` before `COM_BINLOG_DUMP`; `mysql_async` speaks MySQL's
//! `COM_BINLOG_DUMP_GTID` instead, and no maintained crate speaks MariaDB's. The server's own
//! tool does, is installed wherever the backups' tools are, and writes the events verbatim
//! (checksums included), which is what a segment must hold to be replayed by the same tool.
//! It writes into a private scratch directory, one file per server binlog; the archiver reads
//! each as it grows ([`stream::Reader`]) and removes it once the next one starts, so the
//! scratch space it uses is at most one server binlog (`max_binlog_size`).
//!
//! # Segments
//! Whole transactions only, of one domain, consecutive; cut every `segment_interval` (the
//! archive's lag is at most that plus the upload) or at `segment_bytes`, and whenever the
//! next transaction does not continue the open segment (a new domain, or a jump the
//! server's binlog holds).
//!
//! # Credentials
//! The account reaches the tool in an options file only this process can read, as the
//! reclone's tools do ([`crate::clone`]); never on a command line.

pub mod stream;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bloodraven_core::binlog::mark::{MarkError, MigrationMark, RestoreMark};
use bloodraven_core::binlog::{Chain, Gtid, Segment, StopAt};
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backup::{BackupError, Storage};
use crate::clone::{CloneError, Endpoint, OptionsFile, find_tool, private_dir};
use stream::{Reader, SegmentFile, StreamError};

/// The reader (and the replay's decoder): Debian package `mariadb-client`.
pub const READER_TOOL: &str = "mariadb-binlog";
/// How often the archiver looks for new bytes when there were none.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// How much of the reader's standard error is kept for its error.
const STDERR_TAIL: usize = 2048;

/// Why archiving or replaying stopped.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{READER_TOOL} was not found on PATH: install the Debian package mariadb-client")]
    ToolMissing,
    #[error("preparing the reader's options: {0}")]
    Options(#[source] CloneError),
    /// The reader ended (the server went away, refused the GTID, or closed the dump).
    #[error("{READER_TOOL} reading {site} exited with {status}: {stderr}")]
    ReaderExited {
        site: String,
        status: String,
        stderr: String,
    },
    #[error("the binlog of {site} cannot be read: {source}")]
    Stream {
        site: String,
        #[source]
        source: StreamError,
    },
    #[error("archive segment {name}: {source}")]
    Segment {
        name: String,
        #[source]
        source: StreamError,
    },
    #[error(transparent)]
    Storage(#[from] BackupError),
    #[error(transparent)]
    Mark(#[from] MarkError),
    #[error("replaying into {site} failed ({tool} exited with {status}): {stderr}")]
    Replay {
        site: String,
        tool: &'static str,
        status: String,
        stderr: String,
    },
}

impl ArchiveError {
    fn io<'a>(
        what: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> ArchiveError + 'a {
        move |source| {
            ArchiveError::Storage(BackupError::Io {
                what,
                path: path.display().to_string(),
                source,
            })
        }
    }

    /// Starting `tool` failed (a file, or the process itself).
    fn spawn(tool: &'static str) -> impl FnOnce(std::io::Error) -> ArchiveError {
        move |source| ArchiveError::Storage(BackupError::Spawn { tool, source })
    }
}

/// Where the archiver starts on its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// After this GTID (it must be in the source's binlog). A source that has written
    /// nothing yet is archived once it has (the operator waits for its first GTID).
    After(Gtid),
}

/// How an archiver names and cuts its segments.
#[derive(Clone, Debug)]
pub struct ArchiveSettings {
    /// The `topologyGeneration` whose primary is the source.
    pub generation: u64,
    /// The archiver's term (its names are its own).
    pub term: u64,
    /// A segment is written at the latest this long after its first transaction arrived.
    pub segment_interval: Duration,
    /// A segment is written once it holds this many bytes.
    pub segment_bytes: usize,
    /// The server id the reader registers with (unique among the source's replicas: a
    /// source drops an older connection of the same id).
    pub reader_server_id: u32,
}

/// What the archiver has done, as it goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The last transaction written to the archive.
    pub last: Option<Gtid>,
    /// Segments written by this archiver.
    pub segments: u64,
}

/// Follows `source` from `start`, writing segments into `storage`, until the reader ends
/// (an error: the source went away or refused) or the future is dropped (the reader is then
/// killed). `progress` is updated after each segment.
///
/// # Errors
/// [`ArchiveError`]: the reader cannot start or ended, the bytes are not a binlog, or the
/// target refuses a segment.
pub async fn follow(
    source: &Endpoint,
    start: &Start,
    storage: &Storage,
    settings: &ArchiveSettings,
    progress: &watch::Sender<Progress>,
) -> Result<(), ArchiveError> {
    read_binlog(source, start, storage, settings, progress, None).await
}

/// Reads `source`'s binlog after `after` up to `end` (its last transaction, as its
/// `gtid_binlog_pos` says), into segments of `settings`' generation and term, behind a fork of
/// `fork_generation` at `after`; returns what it wrote. This is an old primary's tail that the
/// archive had not read before a failover, once the old primary is reachable again: its
/// segments are of the old generation past the fork, so the chain keeps them apart, in the
/// lost tail, never replayed.
///
/// # Errors
/// [`ArchiveError`]: the reader cannot start or ended before `end`, the bytes are not a
/// binlog, or the target refuses a segment.
pub async fn fetch_tail(
    source: &Endpoint,
    after: Gtid,
    end: Gtid,
    fork_generation: u64,
    storage: &Storage,
    settings: &ArchiveSettings,
) -> Result<Progress, ArchiveError> {
    // The fork first: the generation that took over holds the domain only up to `after`, so
    // whatever older generation's segments come after it are the lost tail. (The archiver
    // wrote the same fork when it held more than the new primary; a name is written once.)
    let fork = bloodraven_core::binlog::Fork {
        domain: after.domain,
        generation: fork_generation,
        at: after.seq,
    };
    storage.put_archived(&fork.name(), Vec::new()).await?;
    let (tx, rx) = watch::channel(Progress::default());
    if end.domain == after.domain && end.seq > after.seq {
        let start = Start::After(after);
        read_binlog(source, &start, storage, settings, &tx, Some(end)).await?;
    }
    Ok(rx.borrow().clone())
}

/// Whether `groups` reach `end` (a tail's last transaction).
fn reaches(groups: &[stream::Group], end: Option<Gtid>) -> bool {
    end.is_some_and(|e| {
        groups
            .iter()
            .any(|g| g.domain == e.domain && g.seq >= e.seq)
    })
}

/// Follows `source` after `start`; with `end`, only until a transaction at or past it is
/// written.
async fn read_binlog(
    source: &Endpoint,
    start: &Start,
    storage: &Storage,
    settings: &ArchiveSettings,
    progress: &watch::Sender<Progress>,
    end: Option<Gtid>,
) -> Result<(), ArchiveError> {
    let tool = find_tool(READER_TOOL).map_err(|_| ArchiveError::ToolMissing)?;
    let dir = private_dir().map_err(ArchiveError::Options)?;
    let options = OptionsFile::write(&dir, "reader.cnf", source).map_err(ArchiveError::Options)?;
    let raw = dir.join("raw");
    std::fs::create_dir(&raw).map_err(ArchiveError::io("creating", &raw))?;
    let _scratch = Scratch(raw.clone());
    let mut child = spawn_reader(&tool, &options, &raw, start, settings)?;
    let stderr = collect_stderr(&mut child);
    let mut cutter = Cutter::new(storage, settings, progress);
    let mut file: Option<(PathBuf, tokio::fs::File, Reader)> = None;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        cutter.flush_if_due().await?;
        if file.is_none() {
            file = open_next(&raw, None).await?;
        }
        let Some((path, f, reader)) = file.as_mut() else {
            if let Some(e) = exited(&mut child, source, &stderr).await {
                return Err(e);
            }
            tokio::time::sleep(IDLE_POLL).await;
            continue;
        };
        let n = f
            .read(&mut buf)
            .await
            .map_err(ArchiveError::io("reading", path))?;
        if n > 0 {
            let groups = reader.feed(&buf[..n]).map_err(|e| ArchiveError::Stream {
                site: source.site.clone(),
                source: e,
            })?;
            let format = reader.format().map(<[u8]>::to_vec).unwrap_or_default();
            let reached = reaches(&groups, end);
            for g in groups {
                cutter.push(&format, g).await?;
            }
            if reached {
                return cutter.flush().await;
            }
            continue;
        }
        // Nothing new in this file: the reader moved on to the next one (this one is whole),
        // ended, or waits for the source.
        if let Some(next) = open_next(&raw, Some(path)).await? {
            let done = file.replace(next);
            if let Some((old, mut f, mut reader)) = done {
                // Bytes written between the last read and the switch.
                let mut rest = Vec::new();
                f.read_to_end(&mut rest)
                    .await
                    .map_err(ArchiveError::io("reading", &old))?;
                let format = reader.format().map(<[u8]>::to_vec).unwrap_or_default();
                let groups = reader.feed(&rest).map_err(|e| ArchiveError::Stream {
                    site: source.site.clone(),
                    source: e,
                })?;
                let reached = reaches(&groups, end);
                for g in groups {
                    cutter.push(&format, g).await?;
                }
                if reached {
                    return cutter.flush().await;
                }
                let _ = tokio::fs::remove_file(&old).await;
            }
            continue;
        }
        if let Some(e) = exited(&mut child, source, &stderr).await {
            cutter.flush().await?;
            return Err(e);
        }
        tokio::time::sleep(IDLE_POLL).await;
    }
}

/// Removes the reader's scratch files when the archiver ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn_reader(
    tool: &Path,
    options: &OptionsFile,
    raw: &Path,
    start: &Start,
    settings: &ArchiveSettings,
) -> Result<Child, ArchiveError> {
    let mut cmd = Command::new(tool);
    cmd.arg(format!("--defaults-extra-file={}", options.path.display()))
        .args([
            "--read-from-remote-server",
            "--raw",
            "--stop-never",
            "--verify-binlog-checksum",
        ])
        .arg(format!(
            "--stop-never-slave-server-id={}",
            settings.reader_server_id
        ))
        .arg(format!("--result-file={}/", raw.display()));
    match start {
        // With a GTID start the file argument is required but not read.
        Start::After(g) => cmd.arg(format!("--start-position={g}")).arg("from-gtid"),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ArchiveError::spawn(READER_TOOL))
}

/// The tail of the reader's standard error, kept as it comes.
fn collect_stderr(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    let kept = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    if let Some(mut err) = child.stderr.take() {
        let kept = kept.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut k) = kept.lock() {
                    k.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if k.len() > STDERR_TAIL {
                        let cut = k.len() - STDERR_TAIL;
                        let cut = (cut..k.len()).find(|&i| k.is_char_boundary(i)).unwrap_or(0);
                        k.drain(..cut);
                    }
                }
            }
        });
    }
    kept
}

/// The reader's end, once it exited.
async fn exited(
    child: &mut Child,
    source: &Endpoint,
    stderr: &std::sync::Arc<std::sync::Mutex<String>>,
) -> Option<ArchiveError> {
    let status = child.try_wait().ok()??;
    // Let the standard error's last bytes arrive.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let text = stderr
        .lock()
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Some(ArchiveError::ReaderExited {
        site: source.site.clone(),
        status: status.to_string(),
        stderr: text,
    })
}

/// The reader's oldest file after `current` (by name: the server numbers them), opened.
async fn open_next(
    raw: &Path,
    current: Option<&PathBuf>,
) -> Result<Option<(PathBuf, tokio::fs::File, Reader)>, ArchiveError> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(raw)
        .map_err(ArchiveError::io("listing", raw))?
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    let next = names
        .into_iter()
        .find(|p| current.is_none_or(|c| p.as_path() > c.as_path()));
    let Some(path) = next else {
        return Ok(None);
    };
    let f = tokio::fs::File::open(&path)
        .await
        .map_err(ArchiveError::io("opening", &path))?;
    Ok(Some((path, f, Reader::new())))
}

/// Gathers groups into segments and writes them.
struct Cutter<'a> {
    storage: &'a Storage,
    settings: &'a ArchiveSettings,
    progress: &'a watch::Sender<Progress>,
    open: Option<(SegmentFile, Instant)>,
}

impl<'a> Cutter<'a> {
    fn new(
        storage: &'a Storage,
        settings: &'a ArchiveSettings,
        progress: &'a watch::Sender<Progress>,
    ) -> Self {
        Cutter {
            storage,
            settings,
            progress,
            open: None,
        }
    }

    async fn push(&mut self, format: &[u8], group: stream::Group) -> Result<(), ArchiveError> {
        let continues = self.open.as_ref().is_some_and(|(s, _)| s.continues(&group));
        if !continues {
            self.flush().await?;
        }
        if let Some((s, _)) = self.open.as_mut() {
            s.push(&group);
        } else {
            self.open = Some((SegmentFile::start(format, &group), Instant::now()));
        }
        if self
            .open
            .as_ref()
            .is_some_and(|(s, _)| s.bytes.len() >= self.settings.segment_bytes)
        {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush_if_due(&mut self) -> Result<(), ArchiveError> {
        if self
            .open
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= self.settings.segment_interval)
        {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ArchiveError> {
        let Some((s, _)) = self.open.take() else {
            return Ok(());
        };
        let segment = Segment {
            domain: s.domain,
            first: s.first,
            last: s.last,
            first_time: u64::from(s.first_time),
            last_time: u64::from(s.last_time),
            generation: self.settings.generation,
            term: self.settings.term,
            last_server: s.last_server,
        };
        self.storage.put_archived(&segment.name(), s.bytes).await?;
        self.progress.send_modify(|p| {
            p.last = Some(Gtid {
                domain: s.domain,
                server: s.last_server,
                seq: s.last,
            });
            p.segments += 1;
        });
        Ok(())
    }
}

/// The transactions `from..=to` of archived segment `name`, as a binlog file's bytes.
///
/// # Errors
/// [`ArchiveError`]: the segment cannot be read or is not a binlog.
pub async fn piece_bytes(
    storage: &Storage,
    name: &str,
    from: u64,
    to: u64,
) -> Result<Vec<u8>, ArchiveError> {
    let bytes = storage.get_archived(name).await?;
    let (format, groups) = stream::groups_of(&bytes).map_err(|source| ArchiveError::Segment {
        name: name.to_string(),
        source,
    })?;
    let mut out = stream::MAGIC.to_vec();
    out.extend_from_slice(&format);
    for g in groups.into_iter().filter(|g| (from..=to).contains(&g.seq)) {
        out.extend_from_slice(&g.bytes);
    }
    Ok(out)
}

/// The binlog timestamps of archived segment `name`'s transactions: `(seq, time)`.
///
/// # Errors
/// [`ArchiveError`]: the segment cannot be read or is not a binlog.
pub async fn times_of(storage: &Storage, name: &str) -> Result<Vec<(u64, u32)>, ArchiveError> {
    let bytes = storage.get_archived(name).await?;
    let (_, groups) = stream::groups_of(&bytes).map_err(|source| ArchiveError::Segment {
        name: name.to_string(),
        source,
    })?;
    Ok(groups.iter().map(|g| (g.seq, g.time)).collect())
}

/// The marks of `operation_id`'s migration leases the archive holds (one per grant).
///
/// # Errors
/// [`ArchiveError`] when the target cannot be listed, or a mark cannot be read.
pub async fn marks_of(
    storage: &Storage,
    operation_id: &str,
) -> Result<Vec<MigrationMark>, ArchiveError> {
    let mut marks = Vec::new();
    for name in storage.list_archived().await? {
        if !MigrationMark::may_be_of(&name, operation_id) {
            continue;
        }
        let bytes = storage.get_archived(&name).await?;
        marks.push(MigrationMark::parse(&name, &bytes)?);
    }
    Ok(marks)
}

/// The first DDL transaction of `domain`'s chain after sequence number `after`: its sequence
/// number. Reads the segments from `after` on, in order, until one holds a DDL.
///
/// # Errors
/// [`ArchiveError`]: a segment cannot be read.
pub async fn first_ddl_after(
    storage: &Storage,
    chain: &Chain,
    domain: u32,
    after: u64,
) -> Result<Option<u64>, ArchiveError> {
    let Some(d) = chain.domains.get(&domain) else {
        return Ok(None);
    };
    for piece in d.pieces.iter().filter(|p| p.to > after) {
        let name = chain.segment(piece).name();
        let bytes = storage.get_archived(&name).await?;
        let (_, groups) = stream::groups_of(&bytes).map_err(|source| ArchiveError::Segment {
            name: name.clone(),
            source,
        })?;
        let first = groups
            .iter()
            .filter(|g| g.seq > after && (piece.from..=piece.to).contains(&g.seq))
            .find(|g| g.ddl);
        if let Some(g) = first {
            return Ok(Some(g.seq));
        }
    }
    Ok(None)
}

/// The restore point of `--to-time`: the last transaction of `domain`'s chain before the
/// first one whose binlog timestamp (whole seconds, UTC) is after `time`. Reads only the
/// segments whose names say they straddle `time`. `None`: the chain's first transaction is
/// already after it.
///
/// # Errors
/// [`ArchiveError`]: a segment cannot be read.
pub async fn stop_at_time(
    storage: &Storage,
    chain: &Chain,
    domain: u32,
    time: u64,
) -> Result<Option<StopAt>, ArchiveError> {
    let Some(d) = chain.domains.get(&domain) else {
        return Ok(None);
    };
    let mut stop = None;
    for piece in &d.pieces {
        let segment = chain.segment(piece);
        if segment.last_time <= time {
            stop = Some(piece.to);
            continue;
        }
        if segment.first_time > time {
            break;
        }
        for (seq, t) in times_of(storage, &segment.name()).await? {
            if !(piece.from..=piece.to).contains(&seq) {
                continue;
            }
            if u64::from(t) > time {
                return Ok(stop.map(|seq| StopAt { domain, seq }));
            }
            stop = Some(seq);
        }
    }
    Ok(stop.map(|seq| StopAt { domain, seq }))
}

/// Where a replay applies the transactions.
#[derive(Debug)]
pub enum ReplayTarget<'a> {
    /// A server, over TCP as an account (it needs `BINLOG REPLAY` or `SUPER`).
    Server(&'a Endpoint),
    /// A scratch server's socket (`--skip-grant-tables`: as root).
    Socket(&'a Path),
}

/// The archive as `storage` holds it: its chain, and how many segments it has (names the
/// archive did not write are left out).
///
/// # Errors
/// [`ArchiveError`] when the target cannot be listed.
pub async fn read_chain(storage: &Storage) -> Result<(Chain, usize), ArchiveError> {
    let mut segments = Vec::new();
    let mut forks = Vec::new();
    let mut restores = Vec::new();
    for name in storage.list_archived().await? {
        match bloodraven_core::binlog::Entry::parse(&name) {
            Ok(bloodraven_core::binlog::Entry::Segment(s)) => segments.push(s),
            Ok(bloodraven_core::binlog::Entry::Fork(f)) => forks.push(f),
            Err(_) => restores.extend(RestoreMark::parse(&name).map(|m| m.generation)),
        }
    }
    let count = segments.len();
    let mut chain = Chain::build(segments, &forks);
    chain.restores = restores;
    Ok((chain, count))
}

/// The files a replay plan reads: each piece cut from its segment.
///
/// # Errors
/// [`ArchiveError`]: a segment cannot be read or is not a binlog.
pub async fn plan_files(
    storage: &Storage,
    chain: &Chain,
    plan: &bloodraven_core::binlog::ReplayPlan,
) -> Result<Vec<Vec<u8>>, ArchiveError> {
    let mut files = Vec::with_capacity(plan.pieces.len());
    for p in &plan.pieces {
        files.push(piece_bytes(storage, &chain.segment(p).name(), p.from, p.to).await?);
    }
    Ok(files)
}

/// What a replay applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayed {
    pub files: usize,
    pub bytes: u64,
}

/// Replays `files` (binlog files' bytes, in order) into `target` with the server's own
/// tools: `mariadb-binlog` decodes them, `mariadb` applies them. The transactions keep their
/// GTIDs (the decoder sets `gtid_domain_id`, `server_id` and `gtid_seq_no` per transaction), so
/// the target's `gtid_binlog_pos` ends at the last one replayed.
///
/// # Errors
/// [`ArchiveError`]: a tool is missing, cannot start, or exits with an error.
pub async fn replay(
    files: Vec<Vec<u8>>,
    target: &ReplayTarget<'_>,
) -> Result<Replayed, ArchiveError> {
    let decoder = find_tool(READER_TOOL).map_err(|_| ArchiveError::ToolMissing)?;
    let client = find_tool(crate::clone::LOAD_TOOL).map_err(|_| ArchiveError::ToolMissing)?;
    let dir = private_dir().map_err(ArchiveError::Options)?;
    let (site, client_args, _options) = match target {
        ReplayTarget::Server(e) => {
            let options =
                OptionsFile::write(&dir, "replay.cnf", e).map_err(ArchiveError::Options)?;
            let args = vec![format!("--defaults-extra-file={}", options.path.display())];
            (e.site.clone(), args, Some(options))
        }
        ReplayTarget::Socket(path) => (
            "the scratch server".to_string(),
            vec![
                "--no-defaults".to_string(),
                format!("--socket={}", path.display()),
                "--user=root".to_string(),
            ],
            None,
        ),
    };
    let work = dir.join("replay");
    std::fs::create_dir(&work).map_err(ArchiveError::io("creating", &work))?;
    let _scratch = Scratch(work.clone());
    let mut paths = Vec::new();
    let mut bytes = 0u64;
    for (i, f) in files.iter().enumerate() {
        let p = work.join(format!("{i:06}.binlog"));
        tokio::fs::write(&p, f)
            .await
            .map_err(ArchiveError::io("writing", &p))?;
        bytes += f.len() as u64;
        paths.push(p);
    }
    if paths.is_empty() {
        return Ok(Replayed { files: 0, bytes: 0 });
    }
    let mut decode = Command::new(&decoder)
        .arg("--no-defaults")
        .args(&paths)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ArchiveError::spawn(READER_TOOL))?;
    let decoded: Stdio = decode
        .stdout
        .take()
        .and_then(|o| o.try_into().ok())
        .unwrap_or_else(Stdio::null);
    let apply = Command::new(&client)
        .args(&client_args)
        .arg("--binary-mode")
        .arg("--max-allowed-packet=1G")
        .stdin(decoded)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ArchiveError::spawn(crate::clone::LOAD_TOOL))?;
    let (d, a) = tokio::join!(decode.wait_with_output(), apply.wait_with_output());
    let failed = |tool, out: std::io::Result<std::process::Output>| match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(ArchiveError::Replay {
            site: site.clone(),
            tool,
            status: o.status.to_string(),
            stderr: tail(&o.stderr),
        }),
        Err(source) => Some(ArchiveError::spawn(tool)(source)),
    };
    if let Some(e) = failed(crate::clone::LOAD_TOOL, a).or(failed(READER_TOOL, d)) {
        return Err(e);
    }
    Ok(Replayed {
        files: paths.len(),
        bytes,
    })
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    let cut = s.len().saturating_sub(STDERR_TAIL);
    let cut = (cut..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    s[cut..].to_string()
}
