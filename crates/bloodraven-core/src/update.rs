//! The ordered update (`bloodraven update`): the decisions.
//!
//! Every site that has an update is updated one at a time: first every site that is not the
//! active site (replicas, readers, `dr-only` sites), each caught up before and after its
//! update; then, when the active site has an update, one planned switchover to an updated,
//! caught-up primary candidate through the same admission as any planned failover (deferred
//! behind a live failover-hold, the cooldown, the drain through locks, one
//! `topologyGeneration` bump); then the old primary, which comes back as a replica. This
//! module decides; the operator executes (`controller/update.rs`): it runs a site's update
//! beside the poll, never in it, and drives the switchover with the planned failover's own
//! machine ([`crate::planned`]), stored in `status.updatePhase.switchover`.
//!
//! # Invariants
//! - One site at a time; a site is updated only while it is not the active site.
//! - The primary moves only onto an updated candidate that is caught up; a group with none
//!   fails the update before any site is touched.
//! - Never on the emergency path: a change of `topologyGeneration` that is not the update's
//!   own switchover (an emergency failover) ends the update as `Failed`
//!   (`EmergencyFailover`); nothing waits for it.
//! - A request id runs once: the same id again is the update in flight (or the one that ran).
//!
//! # States
//! `Pending` → (`UpdatingReplicas` → `WaitingForReplica`)* → `FailingOver` (↔ `Deferred`) →
//! `UpdatingOldPrimary` → `Succeeded`; any but `Succeeded` → `Failed`.

use std::time::Duration;

use crate::config::SiteRole;
use crate::planned::{Note, Persist, Severity};
use crate::reason::{EventReason, UpdateFailure};
use crate::status::{
    PlannedFailoverPhase, PlannedFailoverStatus, SiteState, UpdatePhase, UpdateStatus,
};
use crate::time::Timestamp;
use crate::view::SiteView;

/// A site the update can update, with the bound on its update and on its coming back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updatable {
    pub site: String,
    pub timeout: Duration,
}

/// What to do with a request (the annotation's request id).
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per request, never stored
pub enum Request {
    /// Start it: persist this status, then consume the annotation.
    Accept(UpdateStatus),
    /// This id is the update in flight, or one that already ran: consume the annotation.
    Taken,
    /// Refused, changing nothing but the annotation.
    Reject(Note),
}

/// Decides a request with id `id`.
pub fn request(
    id: &str,
    status: &crate::status::GroupStatus,
    updatable: &[Updatable],
    now: Timestamp,
) -> Request {
    use crate::arbiter::{Answer, Kind, Requested, Running, admit};
    let reject = |message: String| {
        Request::Reject(Note {
            severity: Severity::Warning,
            reason: EventReason::OrderedUpdateRejected,
            message,
        })
    };
    // A request id runs once: the one that ran is taken, whatever runs now.
    if status
        .update_phase
        .as_ref()
        .is_some_and(|u| u.request_id == id)
    {
        return Request::Taken;
    }
    match admit(
        &Running::of(status),
        &Requested::new(Kind::OrderedUpdate, id),
    ) {
        Answer::Taken => return Request::Taken,
        Answer::Refused { by } => {
            return reject(format!(
                "{by} is in progress; ordered update {id} was dropped (request it again once it has ended)"
            ));
        }
        Answer::Start => {}
    }
    if updatable.is_empty() {
        return reject(format!(
            "ordered update {id}: no site needs an update (no site has spec.sites[].update.command, and no spec.sites[].workload has drifted from its update revision)"
        ));
    }
    Request::Accept(UpdateStatus::requested(id, now))
}

/// The request id of the ordered update a drift starts on its own (`spec.updateStrategy:
/// Ordered`): the same for the same drifted sites and revisions, so one drift is updated once
/// (a failed update is not retried on its own; `bloodraven update` retries it).
/// `drifted` holds (site, update revision) pairs.
pub fn drift_request_id(drifted: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = drifted.iter().collect();
    pairs.sort();
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (site, revision) in pairs {
        for b in site.bytes().chain([0]).chain(revision.bytes()).chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("drift-{h:016x}")
}

/// What [`step`] looks at besides the status.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub sites: &'a [SiteView],
    pub active_site: &'a str,
    pub topology_generation: u64,
    /// The sites that have an update, in the spec's order.
    pub updatable: &'a [Updatable],
    /// The sites that need none because they are current already (Kubernetes mode: their
    /// Pods are at their StatefulSet's update revision). They count as updated candidates.
    pub current: &'a [String],
    /// `spec.operationTimeouts.orderedUpdate`: how long each phase (each site's step) may
    /// last.
    pub phase_timeout: Duration,
}

/// Whether `u` is in a phase bounded by `spec.operationTimeouts.orderedUpdate`.
fn bounded(u: &UpdateStatus) -> bool {
    matches!(
        u.phase,
        UpdatePhase::UpdatingReplicas
            | UpdatePhase::WaitingForReplica
            | UpdatePhase::UpdatingOldPrimary
    ) || (u.phase == UpdatePhase::FailingOver
        // The switchover has bounds of its own (and rolls back in `Resuming`): it is never
        // cut short from outside, and its end is acted on whenever it comes.
        && u.switchover.is_none())
}

/// The deadline `next` should carry once it replaces `before`: a new phase or a new site
/// starts a new bound; the same step keeps its deadline; a deferral shows when its
/// switchover is tried again.
pub fn deadline_for(
    before: &UpdateStatus,
    next: &UpdateStatus,
    now: Timestamp,
    phase_timeout: Duration,
) -> Option<Timestamp> {
    if next.phase.is_terminal() || next.phase == UpdatePhase::Pending {
        return None;
    }
    if next.phase == UpdatePhase::Deferred {
        return next.admission.as_ref().and_then(|a| a.retry_time);
    }
    if next.phase == before.phase && next.site == before.site && before.deadline.is_some() {
        return before.deadline;
    }
    Some(now.plus(phase_timeout))
}

impl Facts<'_> {
    fn timeout(&self, site: &str) -> Duration {
        self.updatable
            .iter()
            .find(|u| u.site == site)
            .map_or(Duration::from_secs(600), |u| u.timeout)
    }

    fn view(&self, site: &str) -> Option<&SiteView> {
        self.sites.iter().find(|s| s.name == site)
    }

    /// `site` is read-only, replicates from the active site with both threads and no lag,
    /// and is neither blocked nor being rebuilt.
    pub fn caught_up(&self, site: &str) -> bool {
        let (Some(s), Some(active)) = (self.view(site), self.view(self.active_site)) else {
            return false;
        };
        s.answered
            && s.state == SiteState::ReadOnly
            && !s.recovery_blocked
            && !s.recloning
            && !s.reclone_failed
            && s.replicates_from(active)
            && s.replica.as_ref().and_then(|r| r.seconds_behind) == Some(0)
    }
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per step, never stored
pub enum Step {
    /// No update in flight.
    Idle,
    /// Nothing to do until a later poll (a site coming back, a site catching up).
    Wait,
    /// Persist the update's next status.
    Persist(Persist<UpdateStatus, Count>),
    /// Run `site`'s update (or let the one running go on), bounded by `timeout`; report
    /// [`Done`] through [`finish`].
    Update { site: String, timeout: Duration },
    /// Drive the update's switchover (`status.updatePhase.switchover`) one step with the
    /// planned failover's machine.
    Switchover,
}

/// What an update ended with, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    Succeeded,
    Failed,
}

/// What running a site's update came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// The update command exited 0 (or the Pod was replaced).
    Updated,
    /// It failed, or did not end within its timeout.
    Failed { error: String },
}

#[allow(clippy::needless_pass_by_value)] // every caller formats its message
fn failed(u: &UpdateStatus, reason: UpdateFailure, message: String, now: Timestamp) -> Step {
    let mut next = u.clone();
    next.phase = UpdatePhase::Failed;
    next.reason = Some(reason);
    next.message.clone_from(&message);
    next.completion_time = Some(now);
    next.admission = None;
    next.deadline = None;
    Step::Persist(Persist {
        next,
        notes: vec![Note {
            severity: Severity::Warning,
            reason: EventReason::OrderedUpdateFailed,
            message: format!("ordered update {} failed: {message}", u.request_id),
        }],
        count: Some(Count::Failed),
        again: false,
    })
}

/// The best updated (or current) primary candidate that is caught up: highest priority, then
/// the spec's order.
fn candidate<'a>(u: &UpdateStatus, f: &Facts<'a>) -> Option<&'a SiteView> {
    f.sites
        .iter()
        .filter(|s| {
            s.role == SiteRole::PrimaryCandidate
                && s.name != f.active_site
                && (u.sites_done.contains(&s.name) || f.current.contains(&s.name))
                && f.caught_up(&s.name)
        })
        .min_by_key(|s| (std::cmp::Reverse(s.priority), s.index))
}

/// Where the update goes once `u.sites_done` is what it is.
fn next_site(u: &UpdateStatus, f: &Facts<'_>, now: Timestamp) -> Step {
    let pending = |s: &&Updatable| !u.sites_done.contains(&s.site);
    let replica = f
        .updatable
        .iter()
        .filter(pending)
        .find(|s| s.site != u.old_primary);
    let mut next = u.clone();
    next.site_updated = false;
    next.site_start = Some(now);
    next.admission = None;
    if let Some(r) = replica {
        next.phase = UpdatePhase::UpdatingReplicas;
        next.site.clone_from(&r.site);
        next.message = format!("updating {}", r.site);
        return Step::Persist(Persist::quiet(next, true));
    }
    let old_pending = f
        .updatable
        .iter()
        .filter(pending)
        .any(|s| s.site == u.old_primary);
    if old_pending && f.active_site == u.old_primary {
        let Some(c) = candidate(u, f) else {
            return failed(
                u,
                UpdateFailure::NoCandidate,
                format!(
                    "no updated primary candidate is caught up to take over from {}; the primary stays where it is",
                    u.old_primary
                ),
                now,
            );
        };
        next.phase = UpdatePhase::FailingOver;
        next.site.clone_from(&c.name);
        next.message = format!("switching over from {} to {}", u.old_primary, c.name);
        next.switchover = Some(PlannedFailoverStatus::requested(
            &c.name,
            &u.old_primary,
            now,
        ));
        return Step::Persist(Persist {
            next,
            notes: vec![Note {
                severity: Severity::Normal,
                reason: EventReason::OrderedUpdateFailingOver,
                message: format!(
                    "ordered update {}: the replicas are updated; switching over from {} to {}",
                    u.request_id, u.old_primary, c.name
                ),
            }],
            count: None,
            again: true,
        });
    }
    if old_pending {
        next.phase = UpdatePhase::UpdatingOldPrimary;
        next.site.clone_from(&u.old_primary);
        next.message = format!("updating {}, the old primary", u.old_primary);
        return Step::Persist(Persist::quiet(next, true));
    }
    next.phase = UpdatePhase::Succeeded;
    next.site = String::new();
    next.site_start = None;
    next.completion_time = Some(now);
    next.message = format!("{} sites updated", u.sites_done.len());
    Step::Persist(Persist {
        notes: vec![Note {
            severity: Severity::Normal,
            reason: EventReason::OrderedUpdateSucceeded,
            message: format!(
                "ordered update {} succeeded: {} updated",
                u.request_id,
                u.sites_done.join(", ")
            ),
        }],
        next,
        count: Some(Count::Succeeded),
        again: false,
    })
}

/// Says what the update asks for now.
pub fn step(u: Option<&UpdateStatus>, f: &Facts<'_>, now: Timestamp) -> Step {
    let Some(before) = u else { return Step::Idle };
    let mut s = decide(before, f, now);
    // Every status it persists carries its phase's deadline.
    if let Step::Persist(p) = &mut s {
        p.next.deadline = deadline_for(before, &p.next, now, f.phase_timeout);
    }
    s
}

fn decide(u: &UpdateStatus, f: &Facts<'_>, now: Timestamp) -> Step {
    if u.phase.is_terminal() {
        return Step::Idle;
    }
    if u.phase == UpdatePhase::Pending {
        if !f.updatable.iter().any(|s| s.site != f.active_site)
            && updatable(f, f.active_site)
            && !f.current.iter().any(|c| c != f.active_site)
        {
            return failed(
                u,
                UpdateFailure::NoCandidate,
                format!(
                    "only the active site {} has an update: there is no updated site to move the primary to",
                    f.active_site
                ),
                now,
            );
        }
        let mut next = u.clone();
        next.old_primary = f.active_site.to_string();
        next.topology_generation = f.topology_generation;
        next.message = "starting".into();
        let started = Note {
            severity: Severity::Normal,
            reason: EventReason::OrderedUpdateStarted,
            message: format!(
                "ordered update {} started: {} in this order",
                u.request_id,
                order(f).join(", ")
            ),
        };
        return with_first(started, next_site(&next, f, now));
    }
    if f.topology_generation != u.topology_generation {
        let stopped_at = if u.site.is_empty() {
            "its start"
        } else {
            &u.site
        };
        return failed(
            u,
            UpdateFailure::EmergencyFailover,
            format!(
                "the active site changed to {} (topologyGeneration {}) while the update ran; the update stopped at {stopped_at}",
                f.active_site, f.topology_generation,
            ),
            now,
        );
    }
    if bounded(u) {
        match u.deadline {
            None => {
                let mut next = u.clone();
                next.deadline = Some(now.plus(f.phase_timeout));
                return Step::Persist(Persist::quiet(next, true));
            }
            Some(d) if now >= d => {
                let at = if u.site.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", u.site)
                };
                let message = format!(
                    "{}{at} ran past its phase bound (spec.operationTimeouts.orderedUpdate); the sites after it were not updated",
                    u.phase.as_str()
                );
                let mut step = failed(u, UpdateFailure::TimedOut, message.clone(), now);
                if let Step::Persist(p) = &mut step {
                    p.notes.push(Note {
                        severity: Severity::Warning,
                        reason: EventReason::OperationTimedOut,
                        message: format!("ordered update {}: {message}", u.request_id),
                    });
                }
                return step;
            }
            Some(_) => {}
        }
    }
    let since = u.site_start.map_or(Duration::ZERO, |t| now.since(t));
    match u.phase {
        UpdatePhase::UpdatingReplicas
        | UpdatePhase::WaitingForReplica
        | UpdatePhase::UpdatingOldPrimary => site_step(u, f, since, now),
        UpdatePhase::FailingOver | UpdatePhase::Deferred => switchover_step(u, now),
        UpdatePhase::Pending | UpdatePhase::Succeeded | UpdatePhase::Failed => Step::Idle,
    }
}

/// `step` with `note` recorded before its own notes.
fn with_first(note: Note, step: Step) -> Step {
    match step {
        Step::Persist(mut p) => {
            p.notes.insert(0, note);
            Step::Persist(p)
        }
        other => other,
    }
}

fn updatable(f: &Facts<'_>, site: &str) -> bool {
    f.updatable.iter().any(|u| u.site == site)
}

/// The order the sites are updated in: every other site, then the active site.
pub fn order(f: &Facts<'_>) -> Vec<String> {
    let mut v: Vec<String> = f
        .updatable
        .iter()
        .filter(|u| u.site != f.active_site)
        .map(|u| u.site.clone())
        .collect();
    if updatable(f, f.active_site) {
        v.push(f.active_site.to_string());
    }
    v
}

fn site_step(u: &UpdateStatus, f: &Facts<'_>, since: Duration, now: Timestamp) -> Step {
    let site = u.site.as_str();
    let timeout = f.timeout(site);
    if site == f.active_site {
        // Never reached by the order above; a guard, so no active site is ever restarted.
        return failed(
            u,
            UpdateFailure::SiteNotCaughtUp,
            format!("{site} is the active site: it is updated only after a switchover"),
            now,
        );
    }
    if !u.site_updated {
        if !f.caught_up(site) {
            if since >= timeout {
                return failed(
                    u,
                    UpdateFailure::SiteNotCaughtUp,
                    format!(
                        "{site} was not a caught-up replica of {} within {} s, so it was not updated",
                        f.active_site,
                        timeout.as_secs()
                    ),
                    now,
                );
            }
            return Step::Wait;
        }
        return Step::Update {
            site: site.to_string(),
            timeout: timeout.saturating_sub(since),
        };
    }
    if f.caught_up(site) {
        let mut done = u.clone();
        done.sites_done.push(site.to_string());
        let updated = Note {
            severity: Severity::Normal,
            reason: EventReason::SiteUpdated,
            message: format!(
                "ordered update {}: {site} is updated and caught up",
                u.request_id
            ),
        };
        return with_first(updated, next_site(&done, f, now));
    }
    if since >= timeout {
        return failed(
            u,
            UpdateFailure::SiteUnhealthy,
            format!(
                "{site} did not come back as a caught-up replica of {} within {} s of its update",
                f.active_site,
                timeout.as_secs()
            ),
            now,
        );
    }
    Step::Wait
}

fn switchover_step(u: &UpdateStatus, now: Timestamp) -> Step {
    let Some(sw) = &u.switchover else {
        return failed(
            u,
            UpdateFailure::SwitchoverFailed,
            "the switchover's status is missing".into(),
            now,
        );
    };
    match sw.phase {
        PlannedFailoverPhase::Succeeded => {
            let mut next = u.clone();
            next.admission = None;
            next.phase = UpdatePhase::UpdatingOldPrimary;
            next.site.clone_from(&u.old_primary);
            next.site_updated = false;
            next.site_start = Some(now);
            next.message = format!(
                "{} is the active site; updating {}, the old primary",
                sw.target, u.old_primary
            );
            return Step::Persist(Persist::quiet(next, true));
        }
        PlannedFailoverPhase::Failed => {
            return failed(
                u,
                UpdateFailure::SwitchoverFailed,
                format!(
                    "the switchover to {} failed ({}): {}",
                    sw.target,
                    sw.reason.as_ref().map_or("", |r| r.as_str()),
                    sw.message
                ),
                now,
            );
        }
        _ => {}
    }
    let deferred = sw.phase == PlannedFailoverPhase::Deferred;
    let want_phase = if deferred {
        UpdatePhase::Deferred
    } else {
        UpdatePhase::FailingOver
    };
    let want_admission = deferred.then(|| sw.admission.clone());
    if u.phase != want_phase || u.admission != want_admission {
        let mut next = u.clone();
        next.phase = want_phase;
        next.admission = want_admission;
        next.message = if deferred {
            format!(
                "the switchover to {} is deferred: {}",
                sw.target, sw.admission.message
            )
        } else {
            format!("switching over from {} to {}", u.old_primary, sw.target)
        };
        return Step::Persist(Persist::quiet(next, !deferred));
    }
    Step::Switchover
}

/// Turns what running a site's update came to into the next status.
pub fn finish(u: &UpdateStatus, done: Done, now: Timestamp) -> Step {
    match done {
        Done::Updated => {
            let mut next = u.clone();
            next.site_updated = true;
            next.site_start = Some(now);
            if next.phase == UpdatePhase::UpdatingReplicas {
                next.phase = UpdatePhase::WaitingForReplica;
            }
            next.message = format!("{} updated; waiting for it to catch up", u.site);
            Step::Persist(Persist::quiet(next, false))
        }
        Done::Failed { error } => failed(
            u,
            UpdateFailure::UpdateFailed,
            format!("updating {} failed: {error}", u.site),
            now,
        ),
    }
}

#[cfg(test)]
mod tests;
