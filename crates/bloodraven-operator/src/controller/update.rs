//! Executing an ordered update (`bloodraven update`), as [`bloodraven_core::update`] decides
//! it: taking the request (the annotation, whose value is the request's id), then, every poll,
//! as many steps as can run now. A site's update runs in a task of its own, beside the poll
//! (a restart takes seconds to minutes; the emergency path must not wait for it); the task is
//! killed when the update ends (an emergency failover included) or this operator stops
//! leading. The update's switchover is the planned failover's own machine, its status kept in
//! `status.updatePhase.switchover` ([`super::operation::Slot::Update`]).
//!
//! What updating a site means is the platform's ([`crate::platform::SiteWorkloads`]): an
//! update command in embedded mode, replacing a drifted Pod in Kubernetes mode. Which sites
//! need one is asked of it every step (a Kubernetes site needs one while its Pod is not at
//! its StatefulSet's update revision); with `spec.updateStrategy: Ordered` a drift starts an
//! update on its own, once per set of drifted revisions.
//!
//! Each transition is persisted before the next begins, so a restarted operator resumes from
//! the phase it finds: a site whose update was running is updated again (update commands must
//! be idempotent; a replaced Pod is only waited for), a site being waited for is waited for.

use std::time::Duration;

use bloodraven_core::config::UpdateStrategy;
use bloodraven_core::contract::annotations::ORDERED_UPDATE;
use bloodraven_core::planned::Persist;
use bloodraven_core::update::{self, Count, Done, Facts, Request, Step, Updatable};
use bloodraven_mysql::Site;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::operation::{MAX_STEPS_PER_POLL, Slot, Stepped, Update};
use super::{Controller, ControllerError};

/// A site's update in flight: its task (aborted, and its command killed, when this is
/// dropped).
pub(super) struct UpdateRun {
    site: String,
    /// The request it belongs to: a run of another request is never taken for this one.
    request_id: String,
    task: JoinHandle<Result<(), SiteUpdateError>>,
}

/// Why a site's update did not finish.
#[derive(Debug, thiserror::Error)]
enum SiteUpdateError {
    /// The platform's update failed (the command's exit, the API's answer).
    #[error(transparent)]
    Workload(#[from] crate::platform::WorkloadError),
    /// The update's timeout passed; dropping the update stopped it (a command is killed).
    #[error("it did not finish within the update's timeout of {} s and was stopped", .0.as_secs())]
    TimedOut(Duration),
    /// The task running it panicked or was cancelled.
    #[error("the update task ended: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Drop for UpdateRun {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How often an idle group's workloads are looked at for a drift (`spec.updateStrategy:
/// Ordered`): a few API calls per site each time, so not every poll.
const DRIFT_CHECK_EVERY: Duration = Duration::from_secs(10);

/// What the platform says of the sites' updates now.
#[derive(Debug, Default)]
struct Needs {
    /// The sites to update, in the spec's order.
    updatable: Vec<Updatable>,
    /// The sites that need none because they are current.
    current: Vec<String>,
    /// The drifted sites and the revision each is to reach.
    drifted: Vec<(String, String)>,
}

impl<S: Site> Controller<S> {
    /// Asks the platform which sites need an update. `in_progress` (the site the update is
    /// on) stays in the list whatever the answer, so its bound and its wait go on once it is
    /// current. One site the platform cannot answer for fails the whole look: a site left
    /// out by a passing error would be skipped by the order.
    async fn needs(
        &self,
        in_progress: Option<&str>,
    ) -> Result<Needs, crate::platform::WorkloadError> {
        use crate::platform::UpdateNeed;
        let workloads = self.rt.workloads();
        let mut n = Needs::default();
        for s in &self.rt.config.sites {
            let need = workloads.update_need(&self.rt.config, s).await?;
            let this = Updatable {
                site: s.name.clone(),
                timeout: s.update_timeout(),
            };
            match need {
                UpdateNeed::Always => n.updatable.push(this),
                UpdateNeed::Drifted { revision } => {
                    n.updatable.push(this);
                    n.drifted.push((s.name.clone(), revision));
                }
                UpdateNeed::Current if in_progress != Some(s.name.as_str()) => {
                    n.current.push(s.name.clone());
                }
                UpdateNeed::Current | UpdateNeed::NotUpdatable => {
                    if in_progress == Some(s.name.as_str()) {
                        n.updatable.push(this);
                    }
                }
            }
        }
        Ok(n)
    }

    /// Takes an ordered-update request, then advances the update in flight.
    pub(super) async fn update_step(&mut self) {
        if let Err(e) = self.take_update_request().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot take the ordered update request");
            return;
        }
        if let Err(e) = self.start_on_drift().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot start the ordered update a drift asks for");
            return;
        }
        self.advance_steps(Stepped::Update).await;
        let phase = self
            .rt
            .snapshot()
            .status()
            .update_phase
            .as_ref()
            .map(|u| u.phase);
        self.metrics().set_update_phase(self.group(), phase);
    }

    /// Consumes an `ordered-update` annotation in two writes, status first (as a planned
    /// failover's request); a request id that already ran, or runs, is only consumed.
    async fn take_update_request(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let Some(id) = snap.annotations.get(ORDERED_UPDATE).cloned() else {
            return Ok(());
        };
        let status = snap.status();
        let updatable = match self.needs(None).await {
            Ok(n) => n.updatable,
            Err(e) => {
                // Left for the next poll: the request stays until the platform answers.
                tracing::warn!(group = %self.group(), request = %id, error = %e, "ordered update request: cannot tell which sites need an update; tried again next poll");
                return Ok(());
            }
        };
        let decision = update::request(&id, status, &updatable, self.rt.now());
        if let Request::Accept(u) = &decision {
            self.persist_status("the ordered update request", |s| {
                s.update_phase = Some(u.clone());
            })
            .await?;
        }
        self.consume_annotation(ORDERED_UPDATE, "the consumed ordered update annotation")
            .await?;
        match decision {
            Request::Accept(_) => {
                tracing::info!(group = %self.group(), request = %id, "ordered update requested");
            }
            Request::Taken => {
                tracing::info!(group = %self.group(), request = %id, "ordered update request already taken; its annotation is now consumed");
            }
            Request::Reject(note) => {
                tracing::warn!(group = %self.group(), request = %id, "{}", note.message);
                self.note(note).await;
            }
        }
        Ok(())
    }

    /// `spec.updateStrategy: Ordered`: an idle group with a drifted workload starts an ordered
    /// update on its own, named by the drift ([`update::drift_request_id`]), so the same
    /// drift is updated once. Looked at every [`DRIFT_CHECK_EVERY`].
    async fn start_on_drift(&mut self) -> Result<(), ControllerError> {
        let cfg = &self.rt.config;
        if cfg.update_strategy != UpdateStrategy::Ordered
            || !cfg.sites.iter().any(|s| s.workload.is_some())
            || self
                .drift_checked
                .is_some_and(|t| t.elapsed() < DRIFT_CHECK_EVERY)
        {
            return Ok(());
        }
        let status = self.rt.snapshot().status().clone();
        // Only a group with a primary is updated (a bootstrap or an emergency comes first),
        // and only when the arbiter lets an update start.
        let free = bloodraven_core::arbiter::Running::of(&status).is_empty();
        if !free || status.active_site.is_empty() {
            return Ok(());
        }
        self.drift_checked = Some(Instant::now());
        let needs = match self.needs(None).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "cannot look for a drifted workload; looked at again in {} s", DRIFT_CHECK_EVERY.as_secs());
                return Ok(());
            }
        };
        if needs.drifted.is_empty() {
            return Ok(());
        }
        let id = update::drift_request_id(&needs.drifted);
        let decision = update::request(&id, &status, &needs.updatable, self.rt.now());
        let Request::Accept(u) = decision else {
            // Taken: this drift was updated (or failed) already; `bloodraven update` retries.
            return Ok(());
        };
        self.persist_status("the ordered update a drift started", |s| {
            s.update_phase = Some(u.clone());
        })
        .await?;
        let drifted: Vec<String> = needs
            .drifted
            .iter()
            .map(|(s, r)| format!("{s} (to {r})"))
            .collect();
        tracing::info!(group = %self.group(), request = %id, drifted = %drifted.join(", "), "ordered update started on its own: a site's workload drifted from its update revision");
        Ok(())
    }

    /// The ordered update's step on `site`: start its update (bounded by `timeout`), or
    /// record the end of the one that runs.
    async fn update_site_step(
        &mut self,
        u: &bloodraven_core::status::UpdateStatus,
        site: String,
        timeout: Duration,
    ) -> Result<bool, ControllerError> {
        let run = self
            .update_run
            .as_ref()
            .filter(|r| r.site == site && r.request_id == u.request_id);
        match run {
            Some(r) if !r.task.is_finished() => Ok(false),
            Some(_) => {
                let mut run = self.update_run.take().expect("checked above");
                let result = (&mut run.task).await.map_err(SiteUpdateError::from);
                let done = match result.and_then(|r| r) {
                    Ok(()) => {
                        tracing::info!(group = %self.group(), site = %site, "ordered update: the site's update finished");
                        Done::Updated
                    }
                    Err(e) => Done::Failed {
                        error: e.to_string(),
                    },
                };
                match update::finish(u, done, self.rt.now()) {
                    Step::Persist(p) => {
                        self.persist_update_after(u, p).await?;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            }
            None => {
                let Some(cfg) = self.rt.config.site(&site).cloned() else {
                    return Ok(false);
                };
                tracing::info!(group = %self.group(), site = %site, timeout_seconds = timeout.as_secs(), "ordered update: updating the site");
                let (workloads, group) = (self.rt.workloads(), self.rt.config.clone());
                let task = tokio::spawn(async move {
                    tokio::time::timeout(timeout, workloads.update(&group, &cfg))
                        .await
                        .map_err(|_| SiteUpdateError::TimedOut(timeout))?
                        .map_err(SiteUpdateError::from)
                });
                self.update_run = Some(UpdateRun {
                    site,
                    request_id: u.request_id.clone(),
                    task,
                });
                Ok(false)
            }
        }
    }

    /// One step of the update in flight; `Ok(true)` when the next can run at once.
    pub(super) async fn advance_update(&mut self) -> Result<bool, ControllerError> {
        let status = self.rt.snapshot().status().clone();
        // Ended (by this operator, or one before it): nothing may still run for it.
        let running = status.update_phase.as_ref().filter(|u| u.in_flight());
        let Some(u) = super::in_flight(running, &mut self.update_run) else {
            return Ok(false);
        };
        if crate::failpoints::holds("update", u.phase.as_str()) {
            return Ok(false);
        }
        let views = self.views(&status);
        let in_progress = (!u.site.is_empty()).then_some(u.site.as_str());
        let needs = match self.needs(in_progress).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "ordered update: cannot tell which sites need an update; waiting for the next poll");
                return Ok(false);
            }
        };
        let facts = Facts {
            sites: &views,
            active_site: &status.active_site,
            topology_generation: status.topology_generation,
            updatable: &needs.updatable,
            current: &needs.current,
            phase_timeout: self.rt.config.operation_timeouts.ordered_update,
        };
        let now = self.rt.now();
        match update::step(Some(&u), &facts, now) {
            Step::Idle | Step::Wait => Ok(false),
            Step::Persist(p) => self.persist_update_after(&u, p).await,
            Step::Update { site, timeout } => self.update_site_step(&u, site, timeout).await,
            Step::Switchover => {
                // The planned failover's machine, as far as it goes now; then the update
                // looks again (a finished switchover moves it on).
                let mut moved = false;
                for _ in 0..MAX_STEPS_PER_POLL {
                    if !self.advance(Slot::Update).await? {
                        break;
                    }
                    moved = true;
                }
                let after = self
                    .rt
                    .snapshot()
                    .status()
                    .update_phase
                    .as_ref()
                    .and_then(|u| u.switchover.as_ref().map(|s| s.phase));
                Ok(moved
                    || after
                        .is_some_and(bloodraven_core::status::PlannedFailoverPhase::is_terminal))
            }
        }
    }

    /// Persists the step that followed `before` through the executor. An update that ends
    /// stops a site's update still running first (its command killed with the task).
    async fn persist_update_after(
        &mut self,
        before: &bloodraven_core::status::UpdateStatus,
        p: Persist<bloodraven_core::status::UpdateStatus, Count>,
    ) -> Result<bool, ControllerError> {
        if p.next.phase.is_terminal()
            && let Some(run) = self.update_run.take()
        {
            run.task.abort();
        }
        self.persist_op(Update, Some(before), p).await
    }
}
