//! Rebuilding a site from the group (`bloodraven site reclone`): the decisions.
//!
//! A blocked site (it holds transactions the group never received) or a replica whose
//! replication broke for good is rebuilt from a copy of the group's data: taken on a *donor*
//! (a healthy, caught-up replica when the group has one — the primary's buffer pool and I/O
//! are spared — else the active primary), loaded into the *target* with its writes fenced
//! and its binary log off, then the target replicates from the active site until it has
//! caught up. This module decides; the operator executes (`controller/reclone.rs`) and the
//! MySQL adapter copies (`bloodraven_mysql::clone`).
//!
//! # Terminology
//! - **Confirmation**: what a request must name to discard the target's data: a prefix of the
//!   site's `divergentGtidSet` as status shows it, at least [`MIN_CONFIRM_PREFIX`] characters
//!   (the whole set when it is shorter), or the site's name when nothing diverges.
//!
//! # Invariants
//! - Never the active site; never a site the group does not have; never while another
//!   operation runs (a planned failover, another reclone).
//! - A change of `topologyGeneration` while it runs (an emergency or planned failover) stops
//!   it as `Failed` (`ActiveSiteChanged`); a target that became the active site is not touched.
//! - While it runs the target's `recoveryState` is `Recloning`: the controller neither
//!   re-points, unblocks nor promotes it.
//! - It never consults deploy leases: it is a repair, not a planned disruption of the primary.
//!
//! # States
//! `Pending` → `Copying` → `CatchingUp` → `Succeeded`; any of the first three → `Failed`.
//! A `Copying` reclone with no copy running (the operator restarted) starts the copy again.

use std::fmt;

use crate::reason::RecloneFailure;
use crate::status::{GroupStatus, RecloneStatus, SiteStatus};
use crate::time::Timestamp;
use crate::view::SiteView;

/// A confirmation names at least this many characters of the divergent set.
pub const MIN_CONFIRM_PREFIX: usize = 8;

/// What a reclone of a site must confirm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Confirmation {
    /// A prefix of the divergent GTID set, of at least this many characters.
    Prefix { set: String, at_least: usize },
    /// The site's name: nothing diverges.
    SiteName(String),
}

impl Confirmation {
    /// What `site` (as status shows it) must be confirmed with.
    pub fn of(site: &SiteStatus) -> Confirmation {
        if site.divergent_gtid_set.is_empty() {
            Confirmation::SiteName(site.name.clone())
        } else {
            let set = site.divergent_gtid_set.clone();
            let at_least = MIN_CONFIRM_PREFIX.min(set.chars().count());
            Confirmation::Prefix { set, at_least }
        }
    }

    /// Whether `given` confirms it.
    pub fn accepts(&self, given: &str) -> bool {
        match self {
            Confirmation::SiteName(name) => given == name,
            Confirmation::Prefix { set, at_least } => {
                given.chars().count() >= *at_least && set.starts_with(given)
            }
        }
    }

    /// The shortest confirmation that is accepted (what a caller that read the status sends).
    pub fn shortest(&self) -> String {
        match self {
            Confirmation::SiteName(name) => name.clone(),
            Confirmation::Prefix { set, at_least } => set.chars().take(*at_least).collect(),
        }
    }
}

/// Why a reclone request changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The annotation is not `<site>:<confirmation>`.
    Malformed(String),
    UnknownSite(String),
    NoActiveSite,
    ActiveSite(String),
    /// Another operation runs: a planned failover, or a reclone (of this or another site).
    OperationInProgress(String),
    /// The confirmation does not name what would be discarded.
    NotConfirmed {
        site: String,
        given: String,
        expected: Confirmation,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Malformed(v) => write!(
                f,
                "the reclone request {v:?} is not <site>:<confirmation> (the annotation's value)"
            ),
            Refusal::UnknownSite(s) => write!(f, "site {s:?} is not a site of the group"),
            Refusal::NoActiveSite => f.write_str("the group has no active site to copy from yet"),
            Refusal::ActiveSite(s) => write!(
                f,
                "{s} is the active site: a reclone rebuilds another site from it, never the active site itself"
            ),
            Refusal::OperationInProgress(what) => {
                write!(f, "{what} is in progress; try again once it has ended")
            }
            Refusal::NotConfirmed {
                site,
                given,
                expected: Confirmation::SiteName(_),
            } => write!(
                f,
                "--confirm {given:?} does not confirm the reclone of {site}: nothing of it diverges, so confirm with the site's name ({site})"
            ),
            Refusal::NotConfirmed {
                site,
                given,
                expected: Confirmation::Prefix { set, at_least },
            } => write!(
                f,
                "--confirm {given:?} does not confirm the reclone of {site}: it must be the first {at_least} or more characters of the divergent GTID set it discards, {set:?} (status.sites[].divergentGtidSet)"
            ),
        }
    }
}

/// A request as the annotation carries it: `<site>:<confirmation>`.
pub fn parse_request(value: &str) -> Result<(String, String), Refusal> {
    match value.split_once(':') {
        Some((site, confirm)) if !site.is_empty() && !confirm.is_empty() => {
            Ok((site.to_string(), confirm.to_string()))
        }
        _ => Err(Refusal::Malformed(value.to_string())),
    }
}

/// The annotation's value for a request.
pub fn request_value(site: &str, confirm: &str) -> String {
    format!("{site}:{confirm}")
}

/// Whether `site` may be recloned, confirmed by `confirm`, in a group whose status is
/// `status` and whose sites are `sites` (the spec's names).
pub fn admit(
    site: &str,
    confirm: &str,
    status: &GroupStatus,
    sites: &[String],
) -> Result<(), Refusal> {
    if !sites.iter().any(|s| s == site) {
        return Err(Refusal::UnknownSite(site.to_string()));
    }
    if status.active_site.is_empty() {
        return Err(Refusal::NoActiveSite);
    }
    if status.active_site == site {
        return Err(Refusal::ActiveSite(site.to_string()));
    }
    {
        use crate::arbiter::{Answer, Kind, Requested, Running, admit};
        let running = Running::of(status);
        match admit(&running, &Requested::new(Kind::Reclone, site)) {
            Answer::Start => {}
            // A reclone runs once per request: the site's own running reclone refuses it too.
            Answer::Taken => {
                let by = running.get(Kind::Reclone).map(ToString::to_string);
                return Err(Refusal::OperationInProgress(by.unwrap_or_default()));
            }
            Answer::Refused { by } => return Err(Refusal::OperationInProgress(by.to_string())),
        }
    }
    let shown = status.site(site).cloned().unwrap_or_else(|| SiteStatus {
        name: site.to_string(),
        ..SiteStatus::default()
    });
    let expected = Confirmation::of(&shown);
    if expected.accepts(confirm) {
        Ok(())
    } else {
        Err(Refusal::NotConfirmed {
            site: site.to_string(),
            given: confirm.to_string(),
            expected,
        })
    }
}

/// The reclone a request starts.
pub fn accepted(status: &GroupStatus, confirm: &str) -> RecloneStatus {
    RecloneStatus {
        phase: crate::status::ReclonePhase::Pending,
        donor: String::new(),
        bytes_copied: 0,
        start_time: None,
        completion_time: None,
        message: "accepted; waiting to choose a donor".into(),
        reason: None,
        topology_generation: status.topology_generation,
        confirmed: confirm.to_string(),
        attempts: 0,
        catch_up_to: String::new(),
        from_primary: false,
        deadline: None,
    }
}

/// Where the copy is taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Donor {
    pub site: String,
    /// A replica (its position is its applied source position), not the primary.
    pub replica: bool,
}

/// The donor for a reclone of `target`: a reachable, read-only, unblocked site other than the
/// target that replicates from the active site with both threads and no lag (the first such
/// in spec order); else the active site itself, when it answered writable.
/// With `primary_only`, the active site itself (a restore-in-place's reclones: its replicas
/// hold the data from before the restore).
pub fn choose_donor(
    sites: &[SiteView],
    active_site: &str,
    target: &str,
    primary_only: bool,
) -> Option<Donor> {
    let active = sites
        .iter()
        .find(|s| s.name == active_site)
        .filter(|a| a.answered && a.state == crate::status::SiteState::Writable)?;
    let replica = sites.iter().find(|s| {
        !primary_only
            && s.name != target
            && s.name != active_site
            && s.answered
            && s.state == crate::status::SiteState::ReadOnly
            && !s.recovery_blocked
            && s.replicates_from(active)
            && s.replica.as_ref().and_then(|r| r.seconds_behind) == Some(0)
    });
    Some(match replica {
        Some(r) => Donor {
            site: r.name.clone(),
            replica: true,
        },
        None => Donor {
            site: active.name.clone(),
            replica: false,
        },
    })
}

/// Where the copy stands, as the operator knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Copy {
    /// None runs (not started yet, or the operator restarted since).
    Idle,
    Running {
        bytes: u64,
    },
    /// Loaded and replicating from the active site.
    Done {
        bytes: u64,
    },
    Failed {
        message: String,
    },
}

/// What [`step`] looks at.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub sites: &'a [SiteView],
    pub active_site: &'a str,
    pub topology_generation: u64,
    pub copy: Copy,
    pub now: Timestamp,
    /// `spec.operationTimeouts.reclone`: how long each phase may last.
    pub phase_timeout: std::time::Duration,
}

/// What to do next for a reclone of `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing now.
    Wait,
    /// Start the copy (again, after a restart, when `attempt` > 1) from `donor`.
    StartCopy {
        donor: Donor,
        attempt: u32,
    },
    /// The copy runs: record how far it got.
    Progress {
        bytes: u64,
    },
    /// The copy is loaded and the target replicates: wait until it holds `to`, the active
    /// site's GTID set now.
    CatchUp {
        bytes: u64,
        to: String,
    },
    Succeed,
    /// A phase without a deadline yet (a status an older version wrote): persist this one.
    SetDeadline(Timestamp),
    /// Stop (a running copy is aborted), recorded as `Failed`.
    Fail {
        reason: RecloneFailure,
        message: String,
    },
}

/// The next step of `r`, the reclone of `target`.
pub fn step(r: &RecloneStatus, target: &str, facts: &Facts<'_>) -> Step {
    use crate::status::ReclonePhase as P;
    if r.phase.is_terminal() {
        return Step::Wait;
    }
    if facts.active_site == target {
        return Step::Fail {
            reason: RecloneFailure::TargetPromoted,
            message: format!(
                "{target} became the active site while it was being recloned; it was not touched"
            ),
        };
    }
    if facts.topology_generation != r.topology_generation {
        return Step::Fail {
            reason: RecloneFailure::ActiveSiteChanged,
            message: format!(
                "the active site changed (topologyGeneration {} → {}, now {}) while {target} was being recloned; the copy was stopped",
                r.topology_generation, facts.topology_generation, facts.active_site
            ),
        };
    }
    match r.deadline {
        None => return Step::SetDeadline(facts.now.plus(facts.phase_timeout)),
        Some(d) if facts.now >= d => {
            return Step::Fail {
                reason: RecloneFailure::TimedOut,
                message: format!(
                    "{} ran past its phase bound (spec.operationTimeouts.reclone)",
                    r.phase.as_str()
                ),
            };
        }
        Some(_) => {}
    }
    match r.phase {
        P::Pending => match choose_donor(facts.sites, facts.active_site, target, r.from_primary) {
            Some(donor) => Step::StartCopy { donor, attempt: 1 },
            None => Step::Wait,
        },
        P::Copying => match &facts.copy {
            Copy::Idle => {
                // The copy that ran died with the operator: start it again, from the same donor
                // while it is still a good one.
                let same = facts
                    .sites
                    .iter()
                    .any(|s| s.name == r.donor)
                    .then(|| choose_donor(facts.sites, facts.active_site, target, r.from_primary))
                    .flatten();
                match same {
                    Some(donor) => Step::StartCopy {
                        donor,
                        attempt: r.attempts.saturating_add(1),
                    },
                    None => Step::Wait,
                }
            }
            Copy::Running { bytes } => Step::Progress { bytes: *bytes },
            Copy::Done { bytes } => Step::CatchUp {
                bytes: *bytes,
                to: facts
                    .sites
                    .iter()
                    .find(|s| s.name == facts.active_site)
                    .and_then(|a| a.gtid.as_ref())
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            },
            Copy::Failed { message } => Step::Fail {
                reason: RecloneFailure::CopyFailed,
                message: message.clone(),
            },
        },
        P::CatchingUp => caught_up(target, &r.catch_up_to, facts),
        P::Succeeded | P::Failed => Step::Wait,
    }
}

/// `CatchingUp`: done once the target replicates from the active site with both threads
/// and holds `to`, the active site's GTID set when the copy was loaded (from then on it is a
/// replica like any other, with a replica's lag).
fn caught_up(target: &str, to: &str, facts: &Facts<'_>) -> Step {
    let (Some(t), Some(a)) = (
        facts.sites.iter().find(|s| s.name == target),
        facts.sites.iter().find(|s| s.name == facts.active_site),
    ) else {
        return Step::Wait;
    };
    if !t.answered || !a.answered {
        return Step::Wait;
    }
    let Some(r) = &t.replica else {
        return Step::Fail {
            reason: RecloneFailure::ReplicationFailed,
            message: format!("{target} does not replicate after its copy was loaded"),
        };
    };
    if r.io_running && !r.sql_running {
        return Step::Fail {
            reason: RecloneFailure::ReplicationFailed,
            message: format!(
                "{target}'s applier stopped while it caught up from {}",
                a.name
            ),
        };
    }
    let holds = t.gtid.as_ref().is_some_and(|g| {
        crate::gtid::GtidSet::parse(g.flavor(), to).is_ok_and(|want| g.contains(&want))
    });
    if t.replicates_from(a) && holds {
        Step::Succeed
    } else {
        Step::Wait
    }
}

#[cfg(test)]
mod tests;
