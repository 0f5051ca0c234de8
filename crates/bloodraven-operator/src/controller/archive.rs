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
//! The lag (`bloodraven_binlog_archive_lag_seconds`) is how long the archive has been behind
//! the active site's position as this poll saw it.

use std::time::Duration;

use bloodraven_core::binlog::{self, Gtid};
use bloodraven_core::config::BackupConfig;
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::reason::{ConditionReason as R, ConditionType as C, EventReason as E};
use bloodraven_core::status::{BinlogArchiveStatus, GroupStatus};
use bloodraven_mysql::Site;
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

/// Why an archiver did not start.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{0}")]
    OpenTarget(#[source] super::backup::BackupStepError),
    #[error("listing the archive: {0}")]
    List(#[source] ArchiveError),
    #[error("writing the fork: {0}")]
    Fork(#[source] bloodraven_mysql::backup::BackupError),
    #[error("the primary has written nothing yet; archived once it has")]
    NothingWritten,
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
    task: JoinHandle<Result<(), ArchiveError>>,
    progress: watch::Receiver<Progress>,
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
    checked: Option<Instant>,
    /// The gaps of the last check (a larger number is new gaps).
    gaps: Option<u64>,
    /// Since when the archive has been behind the active site.
    behind_since: Option<Instant>,
    last: Option<BinlogArchiveStatus>,
    /// The newest good backup when retention last ran over the archive (it runs again when
    /// the backups change).
    retained_for: Option<String>,
}

impl ArchiveState {
    pub(super) fn new(term: u64) -> Self {
        ArchiveState {
            term,
            run: None,
            ended: None,
            checked: None,
            gaps: None,
            behind_since: None,
            last: None,
            retained_for: None,
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
        // The archiver is this term's: it ends with the controller (its reader is killed).
        self.stop();
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

/// A one-domain MariaDB position (`0-1-42`).
fn parse_gtid(text: &str) -> Option<Gtid> {
    let mut parts = text.trim().split('-');
    let (d, s, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some(Gtid {
        domain: d.parse().ok()?,
        server: s.parse().ok()?,
        seq: n.parse().ok()?,
    })
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
        let primary = self.active_position(&status);
        if self.archive.run.is_none()
            && !status.active_site.is_empty()
            && status.restore_in_place.is_none()
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
        if self
            .archive
            .checked
            .is_none_or(|t| t.elapsed() >= CHECK_EVERY)
        {
            self.archive.checked = Some(Instant::now());
            self.check_archive(&cfg).await;
        }
    }

    /// Stops an archiver of another site or generation, and takes in one that ended.
    fn end_stale_archiver(&mut self, status: &GroupStatus) {
        let Some(run) = &self.archive.run else {
            return;
        };
        let stale = run.site != status.active_site
            || run.generation != status.topology_generation
            || status.restore_in_place.is_some();
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

    /// The active site's GTID position as this poll saw it.
    fn active_position(&self, status: &GroupStatus) -> Option<GtidSet> {
        self.sites
            .iter()
            .find(|s| s.cfg.name == status.active_site)
            .and_then(|s| s.probe.as_ref())
            .map(|p| p.gtid.clone())
    }

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
        let (chain, _) = read_chain(&storage).await.map_err(StartError::List)?;
        let domain = domain_of(primary);
        let floor = status
            .backups
            .as_ref()
            .and_then(|b| b.last_succeeded.as_ref())
            .and_then(|b| parse_gtid(&b.gtid_position))
            .filter(|g| g.domain == domain);
        let generation = status.topology_generation;
        let r = binlog::resume(&chain, domain, gtid_in(primary, domain), generation, floor);
        if let Some(fork) = r.fork {
            storage
                .put_archived(&fork.name(), Vec::new())
                .await
                .map_err(StartError::Fork)?;
            let lost = chain.last(domain).unwrap_or(fork.at) - fork.at;
            let message = format!(
                "the new primary {} holds domain {domain} up to {}: the archive forks there, and the {lost} transactions archived after it from the old primary are kept apart (docs/pitr.md)",
                status.active_site, fork.at
            );
            tracing::warn!(group = %self.group(), "binlog archive: {message}");
            self.event(EventType::Warning, E::BinlogArchiveForked, &message)
                .await;
        }
        let start = match r.after {
            Some(g) => Start::After(g),
            None => return Err(StartError::NothingWritten),
        };
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
        let (tx, rx) = watch::channel(Progress::default());
        tracing::info!(group = %self.group(), site = %site.name, generation, start = ?start, "binlog archive: the archiver starts");
        let task = tokio::spawn(async move {
            bloodraven_mysql::binlog::follow(&endpoint, &start, &storage, &settings, &tx).await
        });
        self.archive.run = Some(Run {
            site: site.name,
            generation,
            task,
            progress: rx,
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
                    .and_then(|l| parse_gtid(&l.last_gtid))
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

    /// Lists the archive, counts its gaps, and writes `status.binlogArchive` when it changed.
    async fn check_archive(&mut self, cfg: &BackupConfig) {
        let storage = match self.backup_storage(cfg).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot open the target");
                return;
            }
        };
        let (chain, segments) = match read_chain(&storage).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot list it");
                return;
            }
        };
        self.retain_archive(&storage, &chain).await;
        let gaps = chain.gaps();
        let count = gaps.len() as u64;
        let known = self.archive.gaps.unwrap_or(0);
        if count > known {
            let ranges: Vec<String> = gaps.iter().map(ToString::to_string).collect();
            let message = format!(
                "the binlog archive misses transactions: {}",
                ranges.join("; ")
            );
            tracing::error!(group = %self.group(), "binlog archive: {message}");
            self.event(EventType::Warning, E::BinlogArchiveGap, &message)
                .await;
            self.metrics().binlog_archive(
                self.group(),
                self.archive
                    .behind_since
                    .map_or(0, |t| t.elapsed().as_secs()),
                count - known,
            );
        }
        self.archive.gaps = Some(count);
        let domain = chain.domains.keys().next().copied().unwrap_or(0);
        let next = BinlogArchiveStatus {
            last_gtid: chain
                .last_gtid(domain)
                .map(|g| g.to_string())
                .unwrap_or_default(),
            lag_seconds: self
                .archive
                .behind_since
                .map_or(0, |t| t.elapsed().as_secs()),
            segments: segments as u64,
            gaps: count,
        };
        if self.archive.last.as_ref() == Some(&next) {
            return;
        }
        let message = gaps
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
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
                        &message,
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

impl<S: Site> Controller<S> {
    /// Deletes the segments the oldest kept backup already holds, once per change of the
    /// newest good backup (retention of backups ran then). Nothing a kept backup needs to
    /// reach the present is deleted ([`binlog::expired_segments`]).
    async fn retain_archive(
        &mut self,
        storage: &bloodraven_mysql::backup::Storage,
        chain: &binlog::Chain,
    ) {
        let newest = self
            .rt
            .snapshot()
            .status()
            .backups
            .as_ref()
            .and_then(|b| b.last_succeeded.as_ref())
            .map(|b| b.id.clone());
        if newest.is_none() || newest == self.archive.retained_for {
            return;
        }
        let manifests = match bloodraven_mysql::backup::list(storage).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: cannot list the backups for its retention");
                return;
            }
        };
        let mut oldest = std::collections::BTreeMap::new();
        for domain in chain.domains.keys() {
            let kept = manifests
                .iter()
                .filter_map(|m| {
                    m.gtid_position
                        .split(',')
                        .filter_map(parse_gtid)
                        .find(|g| g.domain == *domain)
                        .map(|g| g.seq)
                })
                .min();
            if let Some(seq) = kept {
                oldest.insert(*domain, seq);
            }
        }
        let expired = binlog::expired_segments(&chain.segments, &oldest);
        for segment in &expired {
            if let Err(e) = storage.delete_archived(&segment.name()).await {
                tracing::warn!(group = %self.group(), error = %e, "binlog archive: retention could not delete a segment; tried again after the next backup");
                return;
            }
        }
        if !expired.is_empty() {
            tracing::info!(group = %self.group(), segments = expired.len(), "binlog archive: deleted the segments the oldest kept backup already holds");
        }
        self.archive.retained_for = newest;
    }
}

/// Reads a finished task's outcome without waiting.
trait FinishedResult {
    fn now_or_never_result(self) -> Option<String>;
}

impl FinishedResult for JoinHandle<Result<(), ArchiveError>> {
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
    fn a_position_is_read_by_its_three_numbers_only() {
        assert_eq!(
            parse_gtid("0-1-42"),
            Some(Gtid {
                domain: 0,
                server: 1,
                seq: 42
            })
        );
        for bad in ["", "0-1", "0-1-2-3", "0-x-2", "0-1-2,1-1-3"] {
            assert_eq!(parse_gtid(bad), None, "{bad}");
        }
    }

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
