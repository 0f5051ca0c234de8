//! The binlog archive (`spec.backup` set; docs/pitr.md): every poll, keep one archiver
//! following the active site of the current `topologyGeneration`, and read the archive's
//! chain back to report how far it reaches and whether it is whole.
//!
//! The archiver runs in a task beside the poll ([`bloodraven_mysql::binlog::follow`]), as the
//! replication account. When the active site or the generation changes, it is stopped and a
//! new one starts where the archive ends ([`bloodraven_core::binlog::resume`]); when the new
//! primary holds less than the archive, a fork is written first (event
//! `BinlogArchiveForked`) and the old primary's tail stays apart. An archiver that ends (its
//! source went away, refused, or the target refused a segment) is started again after
//! [`RETRY_AFTER`].
//!
//! Every [`CHECK_EVERY`], the chain is listed from the target: its last GTID, segment count
//! and gaps go to `status.binlogArchive`; a gap not seen before raises `BinlogArchiveGap`
//! (event, the `BinlogArchiveContinuous` condition, `bloodraven_binlog_archive_gaps_total`).
//! Once per new good backup, the check also deletes the segments the oldest kept backup holds.
//! The lag (`bloodraven_binlog_archive_lag_seconds`) is how long the archive has been behind
//! the active site's position as this poll saw it.
//!
//! Marks go into the archive too: each migration lease's start (for `--before-migration`),
//! and the generation a restore-in-place announced. The archiver waits while a restore runs
//! and starts again once its mark is written: the restore's load is not in the binlog, so a
//! replay must never cross it, and the mark is how the planner knows.
//!
//! The poll is the failure detector: nothing here waits for the target. Listing the archive,
//! writing a fork and retention run in tasks beside it; the poll only starts them and takes in
//! what they found.

use std::time::Duration;

use bloodraven_core::binlog::mark::RestoreMark;
use bloodraven_core::binlog::{self, Chain, Gap, Gtid};
use bloodraven_core::config::BackupConfig;
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::reason::{ConditionReason as R, ConditionType as C, EventReason as E};
use bloodraven_core::status::{BinlogArchiveStatus, GroupStatus};
use bloodraven_mysql::Site;
use bloodraven_mysql::backup::{BackupError, Storage};
use bloodraven_mysql::binlog::{ArchiveError, ArchiveSettings, Progress, Start, read_chain};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Controller;
use crate::events::EventType;

/// How long after an archiver ended a new one starts.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(5);
/// How often the archive is listed and its chain checked.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(10);
/// A segment is written at the latest this long after its first transaction arrived.
const SEGMENT_INTERVAL: Duration = Duration::from_millis(500);
/// A segment is written once it holds this many bytes.
const SEGMENT_BYTES: usize = 16 * 1024 * 1024;

/// Why an archiver did not start, or ended.
#[derive(Debug, thiserror::Error)]
enum ArchiverError {
    #[error("listing the archive: {0}")]
    List(#[source] ArchiveError),
    #[error("writing the fork: {0}")]
    Fork(#[source] BackupError),
    #[error("the primary has written nothing yet; archived once it has")]
    NothingWritten,
    #[error(transparent)]
    Follow(ArchiveError),
}

/// Why the poll did not start an archiver.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{0}")]
    OpenTarget(#[source] super::backup::BackupStepError),
    #[error("the active site is not a configured site")]
    NotASite,
    #[error("the replication account: {0}")]
    Credentials(#[source] super::error::CredentialsUnavailable),
}

/// The archiver in flight.
#[derive(Debug)]
struct Run {
    site: String,
    generation: u64,
    task: JoinHandle<Result<(), ArchiverError>>,
    progress: watch::Receiver<Progress>,
    /// The fork it wrote before it started following (the event's message), once.
    forked: watch::Receiver<Option<String>>,
}

/// What a check of the archive found.
#[derive(Debug)]
struct Checked {
    last_gtid: String,
    segments: u64,
    gaps: Vec<Gap>,
    /// The newest good backup retention ran for, when it ran and deleted all it meant to.
    retained_for: Option<String>,
    retained: usize,
}

/// What the controller remembers of the archive between polls.
#[derive(Debug)]
pub(super) struct ArchiveState {
    /// This term's names (its start, in milliseconds): what keeps its segments' names apart
    /// from another leader's.
    term: u64,
    run: Option<Run>,
    /// When the last archiver ended, and its site and generation (a new one on the same
    /// waits [`RETRY_AFTER`]; one on a new primary starts at once).
    ended: Option<(Instant, String, u64)>,
    /// The check in flight, and when the last one started.
    check: Option<JoinHandle<Result<Checked, ArchiveError>>>,
    checked: Option<Instant>,
    /// The gaps of the last check (a larger number is new gaps).
    gaps: Option<u64>,
    /// Since when the archive has been behind the active site.
    behind_since: Option<Instant>,
    last: Option<BinlogArchiveStatus>,
    /// The newest good backup when retention last ran over the archive (it runs again when
    /// the backups change).
    retained_for: Option<String>,
    /// The migration marks being copied into the archive (their names once they are there).
    marking: Option<JoinHandle<Result<Vec<String>, BackupError>>>,
    /// The marks this term copied, those still to copy, and when a failed copy may be tried
    /// again.
    marked: std::collections::BTreeSet<String>,
    unmarked: Vec<(String, Vec<u8>)>,
    mark_retry: Option<Instant>,
}

impl ArchiveState {
    pub(super) fn new(term: u64) -> Self {
        ArchiveState {
            term,
            run: None,
            ended: None,
            check: None,
            checked: None,
            gaps: None,
            behind_since: None,
            last: None,
            retained_for: None,
            marking: None,
            marked: std::collections::BTreeSet::new(),
            unmarked: Vec::new(),
            mark_retry: None,
        }
    }

    fn stop(&mut self) {
        if let Some(r) = self.run.take() {
            r.task.abort();
        }
    }
}

impl Drop for ArchiveState {
    fn drop(&mut self) {
        // The archiver and the check are this term's: they end with the controller.
        self.stop();
        if let Some(c) = self.check.take() {
            c.abort();
        }
        if let Some(m) = self.marking.take() {
            m.abort();
        }
    }
}

/// The GTID of `domain` in a MariaDB set.
fn gtid_in(set: &GtidSet, domain: u32) -> Option<Gtid> {
    match set {
        GtidSet::MariaDb(m) => m.get(&domain).map(|&(server, seq)| Gtid {
            domain,
            server,
            seq,
        }),
        GtidSet::MySql(_) => None,
    }
}

/// The archive's domain: the primary's only one, else 0.
fn domain_of(set: &GtidSet) -> u32 {
    match set {
        GtidSet::MariaDb(m) if m.len() == 1 => m.keys().next().copied().unwrap_or(0),
        _ => 0,
    }
}

/// The archiver's task: where the archive ends decides where it starts (a fork first when
/// the new primary holds less), then it follows the primary until it ends.
async fn archiver(
    endpoint: bloodraven_mysql::clone::Endpoint,
    storage: Storage,
    primary: GtidSet,
    floor: Option<Gtid>,
    settings: ArchiveSettings,
    progress: watch::Sender<Progress>,
    forked: watch::Sender<Option<String>>,
) -> Result<(), ArchiverError> {
    let (chain, _) = read_chain(&storage).await.map_err(ArchiverError::List)?;
    let domain = domain_of(&primary);
    let floor = floor.filter(|g| g.domain == domain);
    let r = binlog::resume(
        &chain,
        domain,
        gtid_in(&primary, domain),
        settings.generation,
        floor,
    );
    if let Some(fork) = r.fork {
        storage
            .put_archived(&fork.name(), Vec::new())
            .await
            .map_err(ArchiverError::Fork)?;
        let lost = chain.last(domain).unwrap_or(fork.at) - fork.at;
        let _ = forked.send(Some(format!(
            "the new primary {} holds domain {domain} up to {}: the archive forks there, and the {lost} transactions archived after it from the old primary are kept apart (docs/pitr.md)",
            endpoint.site, fork.at
        )));
    }
    let start = match r.after {
        Some(g) => Start::After(g),
        None => return Err(ArchiverError::NothingWritten),
    };
    tracing::info!(site = %endpoint.site, generation = settings.generation, start = ?start, "binlog archive: the archiver follows");
    bloodraven_mysql::binlog::follow(&endpoint, &start, &storage, &settings, &progress)
        .await
        .map_err(ArchiverError::Follow)
}

/// The check's task: the chain, and retention when the newest good backup changed.
async fn check(
    storage: Storage,
    newest: Option<String>,
    retained_for: Option<String>,
) -> Result<Checked, ArchiveError> {
    let (chain, segments) = read_chain(&storage).await?;
    let domain = chain.domains.keys().next().copied().unwrap_or(0);
    let mut checked = Checked {
        last_gtid: chain
            .last_gtid(domain)
            .map(|g| g.to_string())
            .unwrap_or_default(),
        segments: segments as u64,
        gaps: chain.gaps(),
        retained_for: None,
        retained: 0,
    };
    if newest.is_some() && newest != retained_for {
        match retain(&storage, &chain).await {
            Ok(n) => {
                checked.retained = n;
                checked.retained_for = newest;
                checked.segments -= n as u64;
            }
            Err(e) => {
                tracing::warn!(error = %e, "binlog archive: retention did not finish; tried again at the next check");
            }
        }
    }
    Ok(checked)
}

/// Whether a restore-in-place is in flight (the archiver waits for it to end: what it loads
/// is not in the binlog).
fn restoring(status: &GroupStatus) -> bool {
    status
        .restore_in_place
        .as_ref()
        .is_some_and(bloodraven_core::status::RestoreStatus::in_flight)
}

/// Deletes the segments the oldest kept backup already holds: nothing a kept backup needs to
/// reach the present ([`binlog::expired_segments`]). How many were deleted.
async fn retain(storage: &Storage, chain: &Chain) -> Result<usize, BackupError> {
    let manifests = bloodraven_mysql::backup::list(storage).await?;
    let mut oldest = std::collections::BTreeMap::new();
    for domain in chain.domains.keys() {
        let kept = manifests
            .iter()
            .filter_map(|m| binlog::seq_in(&m.gtid_position, *domain))
            .min();
        if let Some(seq) = kept {
            oldest.insert(*domain, seq);
        }
    }
    let expired = binlog::expired_segments(&chain.segments, &oldest);
    for segment in &expired {
        storage.delete_archived(&segment.name()).await?;
    }
    Ok(expired.len())
}

impl<S: Site> Controller<S> {
    /// One step of the binlog archive: the archiver follows the active site of this
    /// generation; the chain is checked every [`CHECK_EVERY`].
    pub(super) async fn archive_step(&mut self) {
        let Some(cfg) = self.rt.config.backup.clone() else {
            self.archive.stop();
            return;
        };
        let status = self.rt.snapshot().status().clone();
        self.end_stale_archiver(&status);
        self.take_fork().await;
        let primary = self.active_position(&status);
        // A restore's mark is in the archive before anything of its generation is.
        let restore_mark = status
            .restore_in_place
            .as_ref()
            .filter(|r| r.announced)
            .map(|r| RestoreMark {
                generation: r.topology_generation,
            });
        let restore_marked = restore_mark.is_none_or(|m| self.archive.marked.contains(&m.name()));
        if self.archive.run.is_none()
            && !status.active_site.is_empty()
            && !restoring(&status)
            && restore_marked
            && self
                .archive
                .ended
                .as_ref()
                .is_none_or(|(t, site, generation)| {
                    t.elapsed() >= RETRY_AFTER
                        || *site != status.active_site
                        || *generation != status.topology_generation
                })
            && let Some(set) = &primary
            && let Err(e) = self.start_archiver(&cfg, &status, set).await
        {
            tracing::warn!(group = %self.group(), site = %status.active_site, error = %e, "binlog archive: cannot start the archiver; tried again in {}s", RETRY_AFTER.as_secs());
            self.archive.ended = Some((
                Instant::now(),
                status.active_site.clone(),
                status.topology_generation,
            ));
        }
        self.track_lag(primary.as_ref());
        self.check_step(&cfg).await;
        self.mark_step(&cfg, restore_mark).await;
    }

    /// Copies the marks into the archive, in a task beside the poll: each migration's start
    /// ([`bloodraven_core::binlog::mark::MigrationMark`], once per grant: the lease is
    /// forgotten when it ends, the mark stays for `restore-in-place --before-migration`), and
    /// the last restore-in-place's generation (`restore`: no replay crosses it). A failed copy
    /// is tried again after [`RETRY_AFTER`].
    async fn mark_step(&mut self, cfg: &BackupConfig, restore: Option<RestoreMark>) {
        if let Some(task) = self.archive.marking.take_if(|t| t.is_finished()) {
            let failed = match task.await {
                Ok(Ok(names)) => {
                    for name in names {
                        tracing::info!(group = %self.group(), mark = %name, "binlog archive: a mark is recorded");
                        self.archive.marked.insert(name);
                    }
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(e) = failed {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot record a migration's start; tried again in {}s", RETRY_AFTER.as_secs());
                self.archive.mark_retry = Some(Instant::now() + RETRY_AFTER);
            }
            let marked = &self.archive.marked;
            self.archive.unmarked.retain(|(n, _)| !marked.contains(n));
        }
        let marks = self.rt.migration_marks().await;
        let due = marks
            .iter()
            .map(|m| (m.name(), m.to_bytes()))
            .chain(restore.map(|m| (m.name(), Vec::new())));
        for (name, bytes) in due {
            if !self.archive.marked.contains(&name)
                && !self.archive.unmarked.iter().any(|(n, _)| *n == name)
            {
                self.archive.unmarked.push((name, bytes));
            }
        }
        if self.archive.marking.is_some()
            || self.archive.unmarked.is_empty()
            || self
                .archive
                .mark_retry
                .is_some_and(|at| Instant::now() < at)
        {
            return;
        }
        match self.backup_storage(cfg).await {
            Ok(storage) => {
                self.archive.mark_retry = None;
                let marks = self.archive.unmarked.clone();
                self.archive.marking = Some(tokio::spawn(async move {
                    let mut names = Vec::new();
                    for (name, bytes) in marks {
                        storage.put_archived(&name, bytes).await?;
                        names.push(name);
                    }
                    Ok(names)
                }));
            }
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot record a migration's start; tried again in {}s", RETRY_AFTER.as_secs());
                self.archive.mark_retry = Some(Instant::now() + RETRY_AFTER);
            }
        }
    }

    /// Stops an archiver of another site or generation, and takes in one that ended.
    fn end_stale_archiver(&mut self, status: &GroupStatus) {
        let Some(run) = &self.archive.run else {
            return;
        };
        let stale = run.site != status.active_site
            || run.generation != status.topology_generation
            || restoring(status);
        if stale {
            tracing::info!(group = %self.group(), site = %run.site, generation = run.generation, "binlog archive: the active site or generation changed; the archiver stops");
            self.archive.stop();
            return;
        }
        if run.task.is_finished()
            && let Some(r) = self.archive.run.take()
        {
            let why = r
                .task
                .now_or_never_result()
                .unwrap_or_else(|| "it stopped".into());
            tracing::warn!(group = %self.group(), site = %r.site, error = %why, "binlog archive: the archiver ended; started again in {}s, or at once on a new primary", RETRY_AFTER.as_secs());
            self.archive.ended = Some((Instant::now(), r.site, r.generation));
        }
    }

    /// Records the fork the archiver wrote (once).
    async fn take_fork(&mut self) {
        let message = self
            .archive
            .run
            .as_mut()
            .and_then(|r| r.forked.borrow_and_update().clone());
        if let Some(message) = message {
            tracing::warn!(group = %self.group(), "binlog archive: {message}");
            self.event(EventType::Warning, E::BinlogArchiveForked, &message)
                .await;
        }
    }

    /// The active site's GTID position as this poll saw it.
    fn active_position(&self, status: &GroupStatus) -> Option<GtidSet> {
        self.sites
            .iter()
            .find(|s| s.cfg.name == status.active_site)
            .and_then(|s| s.probe.as_ref())
            .map(|p| p.gtid.clone())
    }

    /// Starts the archiver's task on the active site (the target is read in it).
    async fn start_archiver(
        &mut self,
        cfg: &BackupConfig,
        status: &GroupStatus,
        primary: &GtidSet,
    ) -> Result<(), StartError> {
        let storage = self
            .backup_storage(cfg)
            .await
            .map_err(StartError::OpenTarget)?;
        let floor = status
            .backups
            .as_ref()
            .and_then(|b| b.last_succeeded.as_ref())
            .and_then(|b| Gtid::parse(&b.gtid_position));
        let site = self
            .sites
            .iter()
            .find(|s| s.cfg.name == status.active_site)
            .map(|s| s.cfg.clone())
            .ok_or(StartError::NotASite)?;
        let credentials = self.replication.clone().map_err(StartError::Credentials)?;
        let endpoint = bloodraven_mysql::clone::Endpoint {
            site: site.name.clone(),
            host: site.mysql_host.clone(),
            port: site.mysql_port,
            credentials,
            tls: site.mysql_tls.clone(),
        };
        let generation = status.topology_generation;
        let settings = ArchiveSettings {
            generation,
            term: self.archive.term,
            segment_interval: SEGMENT_INTERVAL,
            segment_bytes: SEGMENT_BYTES,
            // Unique per term among the source's replicas (a source drops an older connection
            // of the same id): above any id a site is configured with.
            reader_server_id: 4_000_000_000
                + u32::try_from(self.archive.term % 200_000_000).unwrap_or(0),
        };
        let (progress_tx, progress) = watch::channel(Progress::default());
        let (forked_tx, forked) = watch::channel(None);
        tracing::info!(group = %self.group(), site = %site.name, generation, "binlog archive: the archiver starts");
        let task = tokio::spawn(archiver(
            endpoint,
            storage,
            primary.clone(),
            floor,
            settings,
            progress_tx,
            forked_tx,
        ));
        self.archive.run = Some(Run {
            site: site.name,
            generation,
            task,
            progress,
            forked,
        });
        Ok(())
    }

    /// How long the archive has been behind `primary` (the archiver's last transaction, or
    /// the last check's).
    fn track_lag(&mut self, primary: Option<&GtidSet>) {
        let archived = self
            .archive
            .run
            .as_ref()
            .and_then(|r| r.progress.borrow().last)
            .map(|g| g.seq)
            .or_else(|| {
                self.archive
                    .last
                    .as_ref()
                    .and_then(|l| Gtid::parse(&l.last_gtid))
                    .map(|g| g.seq)
            });
        let behind = match (primary, archived) {
            (Some(set), Some(seq)) => gtid_in(set, domain_of(set)).is_some_and(|g| g.seq > seq),
            (Some(set), None) => gtid_in(set, domain_of(set)).is_some(),
            (None, _) => self.archive.behind_since.is_some(),
        };
        if !behind {
            self.archive.behind_since = None;
        } else if self.archive.behind_since.is_none() {
            self.archive.behind_since = Some(Instant::now());
        }
        let lag = self
            .archive
            .behind_since
            .map_or(0, |t| t.elapsed().as_secs());
        self.metrics().binlog_archive(self.group(), lag, 0);
    }

    /// Takes in a finished check, and starts the next one when it is due.
    async fn check_step(&mut self, cfg: &BackupConfig) {
        if let Some(task) = self.archive.check.take_if(|t| t.is_finished()) {
            use futures::FutureExt as _;
            match task.now_or_never() {
                Some(Ok(Ok(c))) => self.checked(c).await,
                Some(Ok(Err(e))) => {
                    tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot list it");
                }
                Some(Err(e)) => {
                    tracing::warn!(group = %self.group(), error = %e, "binlog archive: its check stopped");
                }
                None => {}
            }
        }
        if self.archive.check.is_some()
            || self
                .archive
                .checked
                .is_some_and(|t| t.elapsed() < CHECK_EVERY)
        {
            return;
        }
        self.archive.checked = Some(Instant::now());
        let storage = match self.backup_storage(cfg).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot open the target");
                return;
            }
        };
        let newest = self
            .rt
            .snapshot()
            .status()
            .backups
            .as_ref()
            .and_then(|b| b.last_succeeded.as_ref())
            .map(|b| b.id.clone());
        self.archive.check = Some(tokio::spawn(check(
            storage,
            newest,
            self.archive.retained_for.clone(),
        )));
    }

    /// What a check found: a new gap is evented and counted; `status.binlogArchive` and the
    /// condition are written when they changed.
    async fn checked(&mut self, c: Checked) {
        if c.retained > 0 {
            tracing::info!(group = %self.group(), segments = c.retained, "binlog archive: deleted the segments the oldest kept backup already holds");
        }
        if c.retained_for.is_some() {
            self.archive.retained_for = c.retained_for;
        }
        let count = c.gaps.len() as u64;
        let ranges = c
            .gaps
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let known = self.archive.gaps.unwrap_or(0);
        let lag = self
            .archive
            .behind_since
            .map_or(0, |t| t.elapsed().as_secs());
        if count > known {
            let message = format!("the binlog archive misses transactions: {ranges}");
            tracing::error!(group = %self.group(), "binlog archive: {message}");
            self.event(EventType::Warning, E::BinlogArchiveGap, &message)
                .await;
            self.metrics()
                .binlog_archive(self.group(), lag, count - known);
        }
        self.archive.gaps = Some(count);
        let next = BinlogArchiveStatus {
            last_gtid: c.last_gtid,
            lag_seconds: lag,
            segments: c.segments,
            gaps: count,
        };
        if self.archive.last.as_ref() == Some(&next) {
            return;
        }
        let now = self.rt.now();
        let written = next.clone();
        let persisted = self
            .persist_status("the binlog archive's status", |s| {
                s.binlog_archive = Some(written.clone());
                if written.gaps == 0 {
                    s.set_condition(C::BinlogArchiveContinuous, true, R::AsExpected, "", now);
                } else {
                    s.set_condition(
                        C::BinlogArchiveContinuous,
                        false,
                        R::BinlogArchiveGap,
                        &ranges,
                        now,
                    );
                }
            })
            .await;
        match persisted {
            Ok(()) => self.archive.last = Some(next),
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: its status was not written; tried again");
            }
        }
    }
}

/// Reads a finished task's outcome without waiting.
trait FinishedResult {
    fn now_or_never_result(self) -> Option<String>;
}

impl FinishedResult for JoinHandle<Result<(), ArchiverError>> {
    fn now_or_never_result(self) -> Option<String> {
        use futures::FutureExt as _;
        match self.now_or_never()? {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("its task failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archives_domain_is_the_primarys_only_one() {
        let one = GtidSet::parse(bloodraven_core::gtid::GtidFlavor::MariaDb, "3-1-9").unwrap();
        assert_eq!(domain_of(&one), 3);
        assert_eq!(
            gtid_in(&one, 3),
            Some(Gtid {
                domain: 3,
                server: 1,
                seq: 9
            })
        );
        let two =
            GtidSet::parse(bloodraven_core::gtid::GtidFlavor::MariaDb, "0-1-9,3-1-2").unwrap();
        assert_eq!(domain_of(&two), 0);
    }
}
