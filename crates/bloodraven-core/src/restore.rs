//! Restore-in-place (`spec.restoreInPlace`): the decisions.
//!
//! A logical dump is loaded into the live group as a planned disruption: admission defers
//! behind a live failover-hold (as a planned failover's does); then writes are fenced on every
//! site (application sessions killed), the dump is loaded on the target with binary logging off
//! (so nothing replicates and the other sites keep their old data, whole), the target is
//! announced as the active site — one `topologyGeneration` bump, even when it already was the
//! active site, which revokes every deploy lease — and only then are its writes lifted. Every
//! other site is then recloned from the target, one at a time. This module decides; the
//! operator executes (`controller/restore.rs`) and the MySQL adapter loads
//! (`bloodraven_mysql::restore`).
//!
//! # Invariants
//! - A request runs once: its `confirm` must be strictly later than
//!   `status.restoreInPlace.confirmTokenUsed`.
//! - Nothing is promoted onto a half-loaded site: writes are lifted on the target only after
//!   the load finished without error; a failed load leaves the target fenced
//!   ([`RestoreStatus::holds_writes`]), and reassertion stays held.
//! - Never on the emergency path: a change of `topologyGeneration` that is not its own (the
//!   target died: an emergency failover) ends it as `Failed` (`ActiveSiteChanged`); the site
//!   promoted then holds the data from before the restore, and the failure says so.
//! - While it runs no planned failover, ordered update or reclone starts.
//!
//! # States
//! `Pending` (↔ `Deferred`) → `Fencing` → `Loading` → `Promoting` → `Recloning` →
//! `Succeeded`; any but `Succeeded` → `Failed`.

use crate::config::{RestoreInPlaceSpec, SiteRole};
use crate::lease::LeaseView;
use crate::planned::{Note, Persist, Severity};
use crate::reason::{DeferReason, EventReason, RestoreFailure};
use crate::status::{Admission, GroupStatus, ReclonePhase, RestorePhase, RestoreStatus};
use crate::time::Timestamp;
use crate::view::SiteView;

/// What to do with the spec's request.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per poll, never stored
pub enum Request {
    /// No request, or the one that ran (or runs): nothing to do.
    None,
    /// Start it: persist this status.
    Accept(RestoreStatus),
    /// Not run (say so once).
    Refuse(String),
}

/// Decides the spec's request against the status.
pub fn request(
    spec: Option<&RestoreInPlaceSpec>,
    status: &GroupStatus,
    sites: &[SiteView],
    now: Timestamp,
) -> Request {
    let Some(req) = spec else {
        return Request::None;
    };
    match admit_confirm(req, status) {
        Ok(true) => {}
        Ok(false) => return Request::None,
        Err(why) => return Request::Refuse(why.to_string()),
    }
    let target = req
        .target
        .clone()
        .unwrap_or_else(|| status.active_site.clone());
    match sites.iter().find(|s| s.name == target) {
        None => {
            return Request::Refuse(format!("target {target:?} is not a site of the group"));
        }
        Some(t) if t.role != SiteRole::PrimaryCandidate => {
            return Request::Refuse(format!(
                "target {target} has role {} (only a primary-candidate site becomes the primary)",
                t.role.as_str()
            ));
        }
        Some(t) if t.recloning || t.reclone_failed => {
            return Request::Refuse(format!("target {target} is being rebuilt"));
        }
        Some(_) => {}
    }
    Request::Accept(RestoreStatus::accepted(
        target,
        req.confirm.clone(),
        req.source.clone(),
        now,
        status.active_site.clone(),
        status.topology_generation,
    ))
}

/// Why a restore-in-place request is not run (said once, in an event and by the CLI).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmRefused {
    #[error("spec.restoreInPlace.confirm {confirm:?} is not an RFC 3339 timestamp")]
    NotATimestamp { confirm: String },
    #[error(
        "spec.restoreInPlace.confirm {confirm} was used already (by the restore of {source_name} into {target}): a restore runs once per confirm (set a new one to run it)"
    )]
    UsedAlready {
        confirm: String,
        source_name: String,
        target: String,
    },
    #[error(
        "spec.restoreInPlace.confirm {confirm} is not later than the confirmTokenUsed {used}: a restore runs once per confirm (set a new one to run it again)"
    )]
    NotLater { confirm: String, used: String },
    #[error("a restore-in-place (confirm {confirm}) is in progress ({phase})")]
    InProgress {
        confirm: String,
        phase: &'static str,
    },
    #[error("{what} is in progress; the restore waits for a new confirm once it has ended")]
    OtherOperation { what: String },
    #[error("the group has no active site yet")]
    NoActiveSite,
}

/// The rules of a request that need no view of the sites (the CLI checks them before it
/// writes): `Ok(false)` for the request in flight or the one that ran, `Err` with why it is
/// not run.
pub fn admit_confirm(
    req: &RestoreInPlaceSpec,
    status: &GroupStatus,
) -> Result<bool, ConfirmRefused> {
    let Ok(confirm) = Timestamp::parse_rfc3339(&req.confirm) else {
        return Err(ConfirmRefused::NotATimestamp {
            confirm: req.confirm.clone(),
        });
    };
    let current = status.restore_in_place.as_ref();
    if let Some(c) = current {
        if c.confirm_token_used == req.confirm {
            let target = req.target.as_deref().unwrap_or(&c.target_site);
            if c.source == req.source && target == c.target_site {
                // The request in flight, or the one that ran.
                return Ok(false);
            }
            return Err(ConfirmRefused::UsedAlready {
                confirm: req.confirm.clone(),
                source_name: c.source.clone(),
                target: c.target_site.clone(),
            });
        }
        let used = Timestamp::parse_rfc3339(&c.confirm_token_used).ok();
        if used.is_some_and(|u| confirm <= u) {
            return Err(ConfirmRefused::NotLater {
                confirm: req.confirm.clone(),
                used: c.confirm_token_used.clone(),
            });
        }
        if c.in_flight() {
            return Err(ConfirmRefused::InProgress {
                confirm: c.confirm_token_used.clone(),
                phase: c.phase.as_str(),
            });
        }
    }
    if let Some(what) = other_operation(status) {
        return Err(ConfirmRefused::OtherOperation { what });
    }
    if status.active_site.is_empty() {
        return Err(ConfirmRefused::NoActiveSite);
    }
    Ok(true)
}

/// Another operation that keeps a restore from starting (the arbiter's answer; a restore in
/// flight is judged by its `confirm` above).
fn other_operation(status: &GroupStatus) -> Option<String> {
    use crate::arbiter::{Answer, Kind, Requested, Running, admit};
    let mut running = Running::of(status);
    running.0.retain(|r| r.kind != Kind::RestoreInPlace);
    match admit(&running, &Requested::new(Kind::RestoreInPlace, "")) {
        Answer::Refused { by } => Some(by.to_string()),
        Answer::Start | Answer::Taken => None,
    }
}

/// What [`step`] looks at besides the status.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub status: &'a GroupStatus,
    /// The spec's site names, in order.
    pub site_names: &'a [String],
    /// The group's live failover-hold, read under the lease lock.
    pub live_hold: Option<&'a LeaseView>,
    /// `spec.operationTimeouts.restoreInPlace`: how long each phase past admission may last.
    pub phase_timeout: std::time::Duration,
}

/// Whether `phase` runs against `spec.operationTimeouts.restoreInPlace`.
fn bounded(phase: RestorePhase) -> bool {
    matches!(
        phase,
        RestorePhase::Fencing
            | RestorePhase::Loading
            | RestorePhase::Promoting
            | RestorePhase::Recloning
    )
}

/// The deadline `next` should carry once it replaces `before` (see
/// [`crate::planned::deadline_for`]).
pub fn deadline_for(
    before: &RestoreStatus,
    next: &RestoreStatus,
    now: Timestamp,
    phase_timeout: std::time::Duration,
) -> Option<Timestamp> {
    if next.phase.is_terminal() {
        return None;
    }
    if next.phase == RestorePhase::Deferred {
        return next.admission.as_ref().and_then(|a| a.retry_time);
    }
    if !bounded(next.phase) {
        return None;
    }
    if next.phase == before.phase && before.deadline.is_some() {
        return before.deadline;
    }
    Some(now.plus(phase_timeout))
}

/// What a phase that ran past its deadline comes to: `Failed` (`TimedOut`), fail-closed
/// before the announcement (the target stays fenced: a load may be half done), writable
/// after it (the other sites await their reclone).
fn expired(r: &RestoreStatus, now: Timestamp) -> Step {
    let state = if r.announced {
        format!(
            "{} holds the restored data and takes writes; the sites not recloned yet keep recoveryState AwaitingReclone until `bloodraven site reclone`",
            r.target_site
        )
    } else if r.target_fenced {
        format!(
            "every site stays fenced ({} may be half-loaded): run the restore again with a new confirm, or `bloodraven failover --force --to SITE` to promote a site by hand",
            r.target_site
        )
    } else {
        "nothing was loaded; every site stays fenced until a restore with a new confirm or `bloodraven failover --force --to SITE`".to_string()
    };
    let message = format!(
        "{} ran past its phase bound (spec.operationTimeouts.restoreInPlace): {state}",
        r.phase.as_str()
    );
    let mut step = failed(r, RestoreFailure::TimedOut, message.clone(), now);
    if let Step::Persist(p) = &mut step {
        p.notes.push(Note {
            severity: Severity::Warning,
            reason: EventReason::OperationTimedOut,
            message: format!("restore-in-place ({}): {message}", r.confirm_token_used),
        });
    }
    step
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per step, never stored
pub enum Step {
    Idle,
    /// Nothing to do until a later poll (a load or a reclone running).
    Wait,
    /// Persist the restore's next status (its end counted as succeeded or not).
    Persist(Persist<RestoreStatus, bool>),
    /// Fence writes on every site (application sessions killed); report [`Done`].
    Fence {
        active: String,
    },
    /// Load the dump into the target (its replication stopped first); report [`Done`].
    Load {
        target: String,
        source: String,
    },
    /// Announce the target (its one generation bump) unless `announced`, then lift its
    /// writes; report [`Done`].
    Promote {
        target: String,
        announced: bool,
    },
    /// Start a reclone of `site` from the target (`fromPrimary`).
    Reclone {
        site: String,
    },
}

/// What an executed step came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    Fenced,
    FenceFailed { error: String },
    DumpInvalid { error: String },
    Loaded { bytes: u64 },
    LoadFailed { error: String, bytes: u64 },
    Promoted,
    LiftFailed { error: String },
}

fn persist(next: RestoreStatus, notes: Vec<Note>, again: bool) -> Step {
    Step::Persist(Persist {
        next,
        notes,
        count: None,
        again,
    })
}

#[allow(clippy::needless_pass_by_value)] // every caller formats its message
fn failed(r: &RestoreStatus, reason: RestoreFailure, message: String, now: Timestamp) -> Step {
    let mut next = r.clone();
    next.phase = RestorePhase::Failed;
    next.reason = Some(reason);
    next.admission = None;
    next.completion_time = Some(now);
    next.deadline = None;
    next.message.clone_from(&message);
    Step::Persist(Persist {
        next,
        notes: vec![Note {
            severity: Severity::Warning,
            reason: EventReason::RestoreFailed,
            message: format!(
                "restore-in-place ({}) failed: {message}",
                r.confirm_token_used
            ),
        }],
        count: Some(false),
        again: false,
    })
}

fn in_phase(r: &RestoreStatus, phase: RestorePhase, message: String) -> RestoreStatus {
    RestoreStatus {
        phase,
        message,
        admission: None,
        ..r.clone()
    }
}

/// Says what the restore asks for now.
pub fn step(f: &Facts<'_>, now: Timestamp) -> Step {
    let Some(before) = f.status.restore_in_place.as_ref() else {
        return Step::Idle;
    };
    let mut s = decide(before, f, now);
    // Every status it persists carries its phase's deadline.
    if let Step::Persist(p) = &mut s {
        p.next.deadline = deadline_for(before, &p.next, now, f.phase_timeout);
    }
    s
}

fn decide(r: &RestoreStatus, f: &Facts<'_>, now: Timestamp) -> Step {
    if r.phase.is_terminal() {
        return Step::Idle;
    }
    if f.status.topology_generation != r.topology_generation {
        let promoted = &f.status.active_site;
        let data = if r.announced && promoted == &r.target_site {
            "it holds the restored data".to_string()
        } else {
            format!("{promoted} holds the data from before the restore")
        };
        return failed(
            r,
            RestoreFailure::ActiveSiteChanged,
            format!(
                "the active site changed to {promoted} (topologyGeneration {}) during {}: {data}",
                f.status.topology_generation,
                r.phase.as_str()
            ),
            now,
        );
    }
    if bounded(r.phase) {
        match r.deadline {
            None => {
                let mut next = r.clone();
                next.deadline = Some(now.plus(f.phase_timeout));
                return persist(next, Vec::new(), true);
            }
            Some(d) if now >= d => return expired(r, now),
            Some(_) => {}
        }
    }
    match r.phase {
        RestorePhase::Pending | RestorePhase::Deferred => {
            if let Some(hold) = f.live_hold {
                let admission = Admission {
                    defer_reason: Some(DeferReason::DeploymentHold),
                    retry_time: Some(hold.expires_at),
                    message: format!(
                        "deferred by failover-hold {} (instance {})",
                        hold.operation_id, hold.instance
                    ),
                };
                if r.phase == RestorePhase::Deferred && r.admission.as_ref() == Some(&admission) {
                    return Step::Idle;
                }
                let mut next = in_phase(r, RestorePhase::Deferred, admission.message.clone());
                next.admission = Some(admission);
                return persist(next, Vec::new(), false);
            }
            let notes = vec![Note {
                severity: Severity::Normal,
                reason: EventReason::RestoreStarted,
                message: format!(
                    "restore-in-place ({}) of {} into {}: fencing writes on every site",
                    r.confirm_token_used, r.source, r.target_site
                ),
            }];
            persist(
                in_phase(
                    r,
                    RestorePhase::Fencing,
                    "fencing writes on every site".into(),
                ),
                notes,
                true,
            )
        }
        RestorePhase::Fencing => Step::Fence {
            active: f.status.active_site.clone(),
        },
        RestorePhase::Loading => Step::Load {
            target: r.target_site.clone(),
            source: r.source.clone(),
        },
        RestorePhase::Promoting => Step::Promote {
            target: r.target_site.clone(),
            announced: r.announced,
        },
        RestorePhase::Recloning => recloning(r, f, now),
        RestorePhase::Succeeded | RestorePhase::Failed => Step::Idle,
    }
}

fn recloning(r: &RestoreStatus, f: &Facts<'_>, now: Timestamp) -> Step {
    for site in f.site_names.iter().filter(|s| **s != r.target_site) {
        if r.recloned.contains(site) {
            continue;
        }
        let current = f
            .status
            .site(site)
            .and_then(|s| s.reclone.as_ref())
            .filter(|c| c.from_primary && c.confirmed == reclone_confirmation(r));
        return match current.map(|c| c.phase) {
            None => Step::Reclone { site: site.clone() },
            Some(ReclonePhase::Succeeded) => {
                let mut next = r.clone();
                next.recloned.push(site.clone());
                next.message = format!("{site} recloned from {}", r.target_site);
                persist(next, Vec::new(), true)
            }
            Some(ReclonePhase::Failed) => failed(
                r,
                RestoreFailure::RecloneFailed,
                format!(
                    "the restored data is on {} (writable); recloning {site} from it failed: {} (reclone it again with `bloodraven site reclone`)",
                    r.target_site,
                    current.map(|c| c.message.clone()).unwrap_or_default()
                ),
                now,
            ),
            Some(_) => Step::Wait,
        };
    }
    let mut next = in_phase(
        r,
        RestorePhase::Succeeded,
        format!(
            "{} restored on {}; recloned: {}",
            r.source,
            r.target_site,
            if r.recloned.is_empty() {
                "none".to_string()
            } else {
                r.recloned.join(", ")
            }
        ),
    );
    next.completion_time = Some(now);
    Step::Persist(Persist {
        notes: vec![Note {
            severity: Severity::Normal,
            reason: EventReason::RestoreSucceeded,
            message: format!(
                "restore-in-place ({}) succeeded: {}",
                r.confirm_token_used, next.message
            ),
        }],
        next,
        count: Some(true),
        again: false,
    })
}

/// What a restore's reclones confirm with (recorded on them, so they are told apart from
/// a reclone a person requested).
pub fn reclone_confirmation(r: &RestoreStatus) -> String {
    format!("restore-in-place {}", r.confirm_token_used)
}

/// Turns what an executed step came to into the next status.
pub fn finish(r: &RestoreStatus, done: Done, now: Timestamp) -> Step {
    match done {
        Done::Fenced => {
            let mut next = in_phase(
                r,
                RestorePhase::Loading,
                format!("loading {} into {}", r.source, r.target_site),
            );
            next.target_fenced = true;
            persist(next, Vec::new(), true)
        }
        Done::FenceFailed { error } => failed(
            r,
            RestoreFailure::FenceFailed,
            format!("writes could not be fenced: {error}; nothing was loaded"),
            now,
        ),
        Done::DumpInvalid { error } => failed(
            r,
            RestoreFailure::DumpInvalid,
            format!(
                "{error}; nothing was loaded, and every site stays fenced until a restore with a new confirm succeeds or a person lifts the active site"
            ),
            now,
        ),
        Done::Loaded { bytes } => {
            let mut next = in_phase(
                r,
                RestorePhase::Promoting,
                format!("loaded {bytes} bytes; announcing {}", r.target_site),
            );
            next.bytes_loaded = bytes;
            persist(
                next,
                vec![Note {
                    severity: Severity::Normal,
                    reason: EventReason::RestoreLoaded,
                    message: format!(
                        "restore-in-place ({}): {bytes} bytes of {} loaded into {}",
                        r.confirm_token_used, r.source, r.target_site
                    ),
                }],
                true,
            )
        }
        Done::LoadFailed { error, bytes } => {
            let mut s = failed(
                r,
                RestoreFailure::LoadFailed,
                format!(
                    "loading into {} failed: {error}; {} stays fenced (its data is half-loaded) and the other sites hold the data from before the restore; retry with a new confirm",
                    r.target_site, r.target_site
                ),
                now,
            );
            if let Step::Persist(Persist { next, .. }) = &mut s {
                next.bytes_loaded = bytes;
            }
            s
        }
        Done::Promoted => persist(
            in_phase(
                r,
                RestorePhase::Recloning,
                format!("{} takes writes; recloning the other sites", r.target_site),
            ),
            Vec::new(),
            true,
        ),
        Done::LiftFailed { error } => {
            // Announced: retried by the next poll.
            let mut next = r.clone();
            next.message = format!(
                "lifting {}'s writes failed: {error}; retried",
                r.target_site
            );
            persist(next, Vec::new(), false)
        }
    }
}

/// A forced promotion (`bloodraven failover --force --to SITE`) out of a failed restore
/// that left every site fenced: `site` is announced and takes writes; every site whose data
/// is not `site`'s awaits a reclone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForcedOut {
    pub site: String,
    /// The sites that get `recoveryState: AwaitingReclone`.
    pub awaiting_reclone: Vec<String>,
}

/// Why a forced promotion out of a failed restore is refused (nothing changes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForceOutRefusal {
    #[error("no failed restore-in-place holds the group's writes")]
    NoFailedRestore,
    #[error("{0} is not a site of the group")]
    UnknownSite(String),
    #[error("{site} has role {role} (only a primary-candidate site becomes the primary)")]
    NotCandidate { site: String, role: &'static str },
    #[error("{0} does not answer")]
    NotAnswering(String),
}

/// Whether `site` may be forced out of the failed restore in `status`.
pub fn force_out(
    status: &GroupStatus,
    sites: &[SiteView],
    site: &str,
) -> Result<ForcedOut, ForceOutRefusal> {
    let Some(r) = status
        .restore_in_place
        .as_ref()
        .filter(|r| r.phase == RestorePhase::Failed && r.holds_writes())
    else {
        return Err(ForceOutRefusal::NoFailedRestore);
    };
    let Some(v) = sites.iter().find(|s| s.name == site) else {
        return Err(ForceOutRefusal::UnknownSite(site.to_string()));
    };
    if v.role != SiteRole::PrimaryCandidate {
        return Err(ForceOutRefusal::NotCandidate {
            site: site.to_string(),
            role: v.role.as_str(),
        });
    }
    if !v.answered {
        return Err(ForceOutRefusal::NotAnswering(site.to_string()));
    }
    // The target may be half-loaded; the others hold the data from before the restore, all
    // the same. Whoever is promoted, the sites with the other data await a reclone.
    let awaiting_reclone = if site == r.target_site {
        sites
            .iter()
            .filter(|s| s.name != site)
            .map(|s| s.name.clone())
            .collect()
    } else {
        vec![r.target_site.clone()]
    };
    Ok(ForcedOut {
        site: site.to_string(),
        awaiting_reclone,
    })
}

/// The reclone of `site` a restore starts (from the target, the active site by then).
pub fn reclone_of(r: &RestoreStatus, status: &GroupStatus) -> crate::status::RecloneStatus {
    let mut c = crate::reclone::accepted(status, &reclone_confirmation(r));
    c.from_primary = true;
    c.message = format!(
        "part of the restore-in-place; copying from {}",
        r.target_site
    );
    c
}

#[cfg(test)]
mod tests;
