//! Views of the gathered world: what one poll saw of each site, the debounce that turns probes
//! into a site's state, and the operator's in-memory flags.
//!
//! This module owns the *inputs* the decisions read about the live world (as opposed to
//! [`crate::status`], what is stored). It decides nothing beyond the debounce, and depends only
//! on vocabulary modules and the stored site state.

use serde::{Deserialize, Serialize};

use crate::config::SiteRole;
use crate::gtid::GtidSet;
use crate::semisync::SemiSyncState;
use crate::status::{SidecarTimings, SiteState};

/// What one probe of one site showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    Unreachable,
    ReadOnly,
    Writable,
}

/// The debounce counters of one site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteTracker {
    pub state: SiteState,
    pub failures: u32,
    pub writable_streak: u32,
}

impl SiteTracker {
    /// The counters a new term starts a site with: its stored state, as the last leader left
    /// it. A new leader answers from it at once (no `NoPrimary` while nothing contradicts
    /// it); its own probes move it as any other (a site stored writable that stops answering
    /// is unreachable after `failureThreshold` polls, as ever).
    pub fn resumed(stored: SiteState) -> SiteTracker {
        SiteTracker {
            state: stored,
            failures: 0,
            writable_streak: 0,
        }
    }
}

/// Applies one probe result to a site's counters.
pub fn debounce(
    t: SiteTracker,
    probe: ProbeResult,
    failure_threshold: u32,
    recovery_threshold: u32,
) -> SiteTracker {
    match probe {
        ProbeResult::Unreachable => {
            let failures = t.failures.saturating_add(1);
            SiteTracker {
                state: if failures >= failure_threshold {
                    SiteState::Unreachable
                } else {
                    t.state
                },
                failures,
                writable_streak: 0,
            }
        }
        ProbeResult::ReadOnly => SiteTracker {
            state: SiteState::ReadOnly,
            failures: 0,
            writable_streak: 0,
        },
        ProbeResult::Writable => {
            let streak = t.writable_streak.saturating_add(1);
            SiteTracker {
                state: if streak >= recovery_threshold || t.state == SiteState::Writable {
                    SiteState::Writable
                } else if t.state == SiteState::Unreachable {
                    // Seen again, not yet confirmed writable.
                    SiteState::Unknown
                } else {
                    t.state
                },
                failures: 0,
                writable_streak: streak,
            }
        }
    }
}

/// Applies one poll's probe results (one per site, in order) to the sites' counters. When no
/// site answered, the poll proves nothing about any one of them and changes no counter.
pub fn debounce_poll(
    trackers: &[SiteTracker],
    probes: &[ProbeResult],
    failure_threshold: u32,
    recovery_threshold: u32,
) -> Vec<SiteTracker> {
    if probes.iter().all(|p| *p == ProbeResult::Unreachable) {
        return trackers.to_vec();
    }
    trackers
        .iter()
        .zip(probes)
        .map(|(t, p)| debounce(*t, *p, failure_threshold, recovery_threshold))
        .collect()
}

/// One site as the decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteView {
    pub name: String,
    pub role: SiteRole,
    pub priority: i32,
    /// Position in the spec (earlier wins ties).
    pub index: usize,
    /// Where replicas reach it (`spec.sites[].mysql.replicationAddress`, default its own
    /// host and port): what a replica of it shows as its source.
    pub host: String,
    pub port: u16,
    /// Debounced.
    pub state: SiteState,
    /// From the last successful probe.
    pub gtid: Option<GtidSet>,
    /// This poll's probe answered: `gtid` and `replica` are current, not left from an earlier
    /// poll. Verdicts that compare positions (divergence, re-pointing) need it on both sides.
    pub answered: bool,
    /// This poll's probe answered and showed the server accepting writes, before any
    /// debounce. A site that is not the active site is fenced on the first poll that sees it
    /// so: the debounce (`recoveryThreshold`) applies to the reported state and to
    /// re-pointing, never to fencing.
    pub writable_now: bool,
    /// `Some` when the server is configured as a replica.
    pub replica: Option<ReplicaView>,
    /// The site holds transactions the active site never received; a human must resolve it
    /// (or a reclone). True while it is being recloned too.
    pub recovery_blocked: bool,
    /// A reclone is replacing its data: the controller leaves it alone.
    pub recloning: bool,
    /// Its last reclone failed after it began replacing the data: blocked until another
    /// reclone succeeds, whatever its position says.
    pub reclone_failed: bool,
    /// What it has received: as a replica, its IO thread's position (MariaDB `Gtid_IO_Pos`)
    /// when that is ahead of `gtid`, the part of its relay log not applied yet included;
    /// `None` means `gtid`.
    pub received: Option<GtidSet>,
    /// Its semi-synchronous replication, when this poll's probe read it.
    pub semi_sync: Option<SemiSyncState>,
    /// The timings its sidecar last reported running with.
    pub sidecar_timings: Option<SidecarTimings>,
    /// When the operator last re-pointed it, and to which site.
    pub repointed: Option<Repointed>,
}

/// A re-point the operator made: to `source`, at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repointed {
    pub source: String,
    pub at: crate::time::Timestamp,
}

/// A replica's link, as probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub io_running: bool,
    pub sql_running: bool,
    pub source_host: String,
    pub source_port: u16,
    pub seconds_behind: Option<u64>,
}

impl SiteView {
    /// `name` at `host:port`, the `index`-th site of its group, debounced to `state`, with
    /// nothing else known: it did not answer this poll, no position, no replication, not
    /// blocked or recloned, no sidecar report.
    pub fn new(
        name: &str,
        role: SiteRole,
        index: usize,
        (host, port): (&str, u16),
        state: SiteState,
    ) -> SiteView {
        SiteView {
            name: name.into(),
            role,
            priority: 0,
            index,
            host: host.into(),
            port,
            state,
            gtid: None,
            replica: None,
            answered: false,
            writable_now: false,
            recovery_blocked: false,
            recloning: false,
            reclone_failed: false,
            received: None,
            semi_sync: None,
            sidecar_timings: None,
            repointed: None,
        }
    }

    /// A primary candidate on `127.0.0.1:3300+index` that answered this poll in `state` at
    /// MariaDB position `gtid`, not replicating: the starting point of decision tables.
    #[cfg(test)]
    pub(crate) fn answered(name: &str, index: usize, state: SiteState, gtid: &str) -> SiteView {
        let port = 3300 + u16::try_from(index).expect("a small index");
        SiteView {
            gtid: Some(
                GtidSet::parse(crate::gtid::GtidFlavor::MariaDb, gtid).expect("a MariaDB GTID"),
            ),
            answered: true,
            writable_now: state == SiteState::Writable,
            ..SiteView::new(
                name,
                SiteRole::PrimaryCandidate,
                index,
                ("127.0.0.1", port),
                state,
            )
        }
    }

    /// The most it holds: what it received, else what it applied.
    pub fn position(&self) -> Option<&GtidSet> {
        self.received.as_ref().or(self.gtid.as_ref())
    }

    /// Reachable by the debounce: writable or read-only.
    pub fn reachable(&self) -> bool {
        matches!(self.state, SiteState::Writable | SiteState::ReadOnly)
    }

    /// Whether it replicates, with both threads, from `source`.
    pub fn replicates_from(&self, source: &SiteView) -> bool {
        self.replica.as_ref().is_some_and(|r| {
            r.io_running
                && r.sql_running
                && r.source_port == source.port
                && r.source_host == source.host
        })
    }
}

/// The operator's in-memory flags that are not (yet) in the stored status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingFlags {
    /// A new `topologyGeneration` is being persisted, or leases are being revoked for it.
    pub topology_change_pending: bool,
    /// A revoke-all has been requested and not yet applied.
    pub revocation_pending: bool,
    /// Automatic failover is held outside a planned failover's executing phases.
    pub automatic_failover_held: bool,
}
