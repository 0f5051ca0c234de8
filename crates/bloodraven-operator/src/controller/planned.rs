//! Executing a planned failover. What to do next, and what each outcome means, is decided by
//! [`bloodraven_core::planned`] ([`request`], [`step`], [`finish`]); this module gathers the
//! facts, runs each step through the MySQL adapter's switchover steps
//! ([`bloodraven_mysql::switchover`]), undoes by the typed rule, and persists — one phase
//! transition per write, so a restarted operator resumes from an observable phase.

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::controller::{Conditions, Effect};
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::planned::{
    Done, Facts, FenceVerdict, Note, Persist, PlannedFailoverStatus, Request, Severity, Step,
    Transition, Undo, finish, request, step,
};
use bloodraven_mysql::switchover::{self, CatchUp, Undone};
use bloodraven_mysql::{FenceOutcome, Site};

use super::operation::{Operation, Slot, Stepped};
use super::writer::Stage;
use super::{Controller, ControllerError};
use crate::events::EventType;

impl<S: Site> Controller<S> {
    /// Takes a request (the annotation), then advances the planned failover as far as it can
    /// go now.
    pub(super) async fn planned_step(&mut self) {
        if let Err(e) = self.take_request().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot accept the planned failover request");
            return;
        }
        self.advance_steps(Stepped::Planned).await;
    }

    /// Consumes a `planned-failover` annotation in two writes, status first: the accepted
    /// failover's `Pending` status (the status subresource), then the annotation's removal
    /// (the object's metadata). An operator that stops between the two finds the annotation
    /// next to the failover it started ([`Request::Taken`]) and only removes it; the other
    /// order could lose an acknowledged request. While the annotation is present nothing
    /// advances, so a finished failover is never mistaken for a new request.
    async fn take_request(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let Some(target) = snap.annotations.get(PLANNED_FAILOVER).cloned() else {
            return Ok(());
        };
        let decision = request(&target, snap.status(), self.rt.now());
        if let Request::Accept(pf) = &decision {
            self.persist_status("the planned failover request", |s| {
                s.planned_failover = Some(pf.clone());
            })
            .await?;
        }
        self.consume_annotation(PLANNED_FAILOVER, "the consumed planned failover annotation")
            .await?;
        match decision {
            Request::Accept(_) => {
                tracing::info!(group = %self.group(), target = %target, "planned failover requested");
            }
            Request::Taken => {
                tracing::info!(group = %self.group(), target = %target, "planned failover request already taken; its annotation is now consumed");
            }
            Request::Reject(note) => self.note(note).await,
        }
        Ok(())
    }

    /// One step of the machine whose status is in `slot`; `Ok(true)` when the next can run
    /// at once.
    pub(super) async fn advance(&mut self, slot: Slot) -> Result<bool, ControllerError> {
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let Some(pf) = slot.get(&status) else {
            return Ok(false);
        };
        if crate::failpoints::holds("planned", pf.phase.as_str()) {
            return Ok(false);
        }
        let views = self.views(&status);
        let cfg = self.rt.config.clone();
        let now = self.rt.now();
        // Admission holds the lease lock until its verdict is persisted: a failover-hold is
        // either seen here or refused (the group is no longer stable once the next phase is
        // stored), never granted in between.
        let rt = self.rt.clone();
        let leases = if pf.phase.admits() {
            Some(rt.lock_leases().await)
        } else {
            None
        };
        let hold = leases.as_ref().and_then(crate::group::LeaseLock::live_hold);
        let facts = Facts {
            sites: &views,
            active_site: &status.active_site,
            last_failover: status.last_failover,
            cooldown: cfg.failover_cooldown,
            live_hold: hold.as_ref(),
            drain_timeout: cfg.drain_timeout,
            max_lag_wait: cfg.max_lag_wait,
            phase_timeout: cfg.operation_timeouts.planned_failover,
        };
        let decided = step(Some(&pf), &facts, now);
        self.trace(
            Stage::Decide,
            &format!("planned failover in {}", pf.phase.as_str()),
        );
        let done = match decided {
            Step::Idle => return Ok(false),
            Step::Persist {
                next,
                note,
                count,
                again,
            } => {
                self.persist_phase(slot, &pf, next, None, None).await?;
                drop(leases);
                self.notes_and_count(slot, note, count).await;
                return Ok(again);
            }
            Step::Drain { source, budget } => {
                drop(leases);
                self.trace(Stage::Act, &format!("drain {source}"));
                self.drain(&source, budget).await
            }
            Step::CatchUp {
                target,
                want,
                budget,
                ..
            } => {
                self.trace(Stage::Act, &format!("catch {target} up"));
                self.catch_up(&target, &want, budget).await
            }
            Step::Promote {
                target,
                source_gtid,
            } => {
                self.trace(Stage::Act, &format!("prepare the promotion of {target}"));
                self.promote(&target, &source_gtid).await
            }
            Step::Resume { target, sites } => {
                self.trace(Stage::Act, &format!("resume writes on {target}"));
                self.resume(&target, &sites).await
            }
            Step::Abandon(transition) => {
                drop(leases);
                return self.apply(slot, &pf, transition, None).await;
            }
            Step::SetDeadline(next) => {
                self.persist_phase(slot, &pf, next, None, None).await?;
                return Ok(true);
            }
            Step::RollBack { target, source } => {
                tracing::warn!(group = %self.group(), target = %target, source = %source, "planned failover: Resuming ran past its deadline; fencing the target to roll back to the source");
                self.roll_back(&target).await
            }
        };
        let transition = finish(&pf, done, self.rt.now());
        let announced = transition
            .new_active_site
            .as_ref()
            .map(|na| self.announced_now(&na.site, &cfg));
        self.apply(slot, &pf, transition, announced.as_ref()).await
    }

    /// The conditions of the group once `site` takes writes, judged on the sites as they are
    /// now (the source fenced): what a transition that announces `site` carries.
    fn announced_now(
        &self,
        site: &str,
        cfg: &bloodraven_core::config::GroupConfig,
    ) -> bloodraven_core::controller::Conditions {
        let status = self.rt.snapshot().status().clone();
        let views = self.views(&status);
        let promotion = self.promotion_gtid(&status);
        let input = self.decide_input(&status, &views, promotion.as_ref(), cfg);
        bloodraven_core::controller::announced(&input, site)
    }

    async fn drain(&mut self, source: &str, budget: std::time::Duration) -> Done {
        let client = match self.client(source) {
            Ok(c) => c,
            Err(e) => {
                return Done::DrainFailed {
                    fence: FenceVerdict::NotApplied {
                        reason: e.to_string(),
                    },
                    blockers_killed: 0,
                };
            }
        };
        let d = switchover::drain(&client, budget).await;
        for s in &d.blockers {
            let what = if s.is_busy() {
                format!("running a statement for {} s", s.seconds)
            } else {
                format!(
                    "idle for {} s; an idle session can hold a table lock",
                    s.seconds
                )
            };
            tracing::warn!(group = %self.group(), site = source, connection = s.id, account = %s.account(), seconds = s.seconds, "draining: killed a session that kept the fence from landing");
            self.note(Note {
                severity: Severity::Warning,
                reason: bloodraven_core::reason::EventReason::BlockingSessionKilled,
                message: format!(
                    "draining {source}: killed connection {} of {} ({what}): the fence could not land behind it",
                    s.id,
                    s.account()
                ),
            })
            .await;
        }
        match d.fence {
            FenceOutcome::Fenced => {
                self.apply_effect(&Effect::ReadOnly(source.to_string()));
                self.metrics().fenced(
                    self.group(),
                    source,
                    bloodraven_core::contract::metrics::FENCE_PLANNED,
                );
                if let Some(Err(e)) = &d.killed_after {
                    tracing::warn!(group = %self.group(), site = source, error = %e, "draining: killing the remaining application sessions failed (the fence blocks their writes)");
                }
                match d.source_gtid {
                    Some(Ok(g)) => Done::Drained {
                        source_gtid: g.to_string(),
                    },
                    Some(Err(e)) => Done::SourceUnreadable {
                        error: e.to_string(),
                    },
                    None => Done::SourceUnreadable {
                        error: "not read".into(),
                    },
                }
            }
            FenceOutcome::NotFenced { reason } => Done::DrainFailed {
                fence: FenceVerdict::NotApplied { reason },
                blockers_killed: d.blockers.len(),
            },
            FenceOutcome::Unknown { reason } => Done::DrainFailed {
                fence: FenceVerdict::Unknown { reason },
                blockers_killed: d.blockers.len(),
            },
        }
    }

    async fn catch_up(&self, target: &str, want: &str, budget: std::time::Duration) -> Done {
        let failed = |error: String| Done::CatchUpFailed { error };
        let client = match self.client(target) {
            Ok(c) => c,
            Err(e) => return failed(e.to_string()),
        };
        let flavor = match client.flavor().await {
            Ok(f) => f,
            Err(e) => return failed(e.to_string()),
        };
        let want = match GtidSet::parse(flavor.gtid_flavor(), want) {
            Ok(w) => w,
            Err(e) => return failed(e.to_string()),
        };
        match switchover::catch_up(&client, &want, budget).await {
            Ok(CatchUp::CaughtUp) => Done::CaughtUp,
            Ok(CatchUp::TimedOut { missing }) => Done::LagTimeout { missing },
            Err(e) => failed(e.to_string()),
        }
    }

    async fn promote(&mut self, target: &str, source_gtid: &str) -> Done {
        let failed = |error: String| Done::PromoteFailed { error };
        let client = match self.client(target) {
            Ok(c) => c,
            Err(e) => return failed(e.to_string()),
        };
        // After a restart the target may already be prepared (read-only, no replication): its
        // GTID set is the same, and preparing it again is harmless. It stays fenced until the
        // new active site is persisted and served (Resuming clears it).
        let promotion = match client.probe().await {
            Ok(p) if !p.read_only && p.replica.is_none() => p.gtid,
            _ => match client
                .prepare_promotion(Some(bloodraven_core::semisync::desired(
                    self.rt.config.replication_mode,
                    true,
                )))
                .await
            {
                Ok(p) => p.gtid,
                Err(e) => {
                    let e = ControllerError::Promote {
                        site: target.to_string(),
                        source: e,
                    };
                    tracing::warn!(group = %self.group(), step = e.step(), error = %e, "planned failover: promotion failed; the source stays fenced; retried next poll");
                    return failed(e.to_string());
                }
            },
        };
        let lost = GtidSet::parse(promotion.flavor(), source_gtid)
            .map_or(0, |s| s.count_missing_from(&promotion));
        Done::Promoted {
            promotion_gtid: promotion.to_string(),
            transactions_lost: lost,
        }
    }

    async fn resume(&mut self, target: &str, sites: &[String]) -> Done {
        if let Err(e) = self.lift_fence(target).await {
            tracing::warn!(group = %self.group(), site = target, step = e.step(), error = %e, "planned failover: the announced target's fence could not be cleared; retried next poll");
            return Done::LiftFailed {
                error: e.to_string(),
            };
        }
        self.apply_effect(&Effect::Writable(target.to_string()));
        let spec = match self.replication_spec(target) {
            Ok(s) => s,
            Err(e) => {
                return Done::Resumed {
                    failures: sites.iter().map(|s| (s.clone(), e.to_string())).collect(),
                };
            }
        };
        let mut failures = Vec::new();
        let mut clients = Vec::new();
        for s in sites {
            match self.client(s) {
                Ok(c) => clients.push(c),
                Err(e) => failures.push((s.clone(), e.to_string())),
            }
        }
        for (site, e) in switchover::repoint_all(&clients, &spec).await {
            tracing::warn!(group = %self.group(), site = %site, step = "re-point", error = %e, "planned failover: re-point failed; retried by the next polls");
            failures.push((site, e.to_string()));
        }
        Done::Resumed { failures }
    }

    /// Fences the announced target of a failover that timed out in `Resuming`, so that the
    /// source can be announced again.
    async fn roll_back(&mut self, target: &str) -> Done {
        let client = match self.client(target) {
            Ok(c) => c,
            Err(e) => {
                return Done::RollbackUnfenced {
                    error: e.to_string(),
                };
            }
        };
        match client.fence(self.timeouts.statement).await {
            FenceOutcome::Fenced => {
                self.apply_effect(&Effect::ReadOnly(target.to_string()));
                Done::RollbackFenced
            }
            FenceOutcome::NotFenced { reason } | FenceOutcome::Unknown { reason } => {
                Done::RollbackUnfenced { error: reason }
            }
        }
    }

    /// Undoes by the transition's rule, persists it, records its event and metrics.
    async fn apply(
        &mut self,
        slot: Slot,
        pf: &PlannedFailoverStatus,
        tr: Transition,
        announced: Option<&Conditions>,
    ) -> Result<bool, ControllerError> {
        if let Undo::Unfence { site } | Undo::ReadBackThenUnfence { site } = &tr.undo {
            let outcome = match self.client(site) {
                Ok(c) => switchover::undo(&c, &tr.undo).await,
                Err(e) => {
                    tracing::error!(group = %self.group(), site = %site, step = e.step(), error = %e, "planned failover: cannot undo the fence");
                    Undone::Nothing
                }
            };
            match &outcome {
                Undone::Failed(e) => {
                    tracing::error!(group = %self.group(), site = %site, step = "unfence", error = %e, "planned failover: undoing the fence failed; no site may be writable until the operator's reassertion or a human resolves it");
                }
                other => {
                    tracing::info!(group = %self.group(), site = %site, undo = ?other, "planned failover: undone");
                }
            }
        }
        let Some(next) = tr.next else {
            return Ok(tr.again);
        };
        self.persist_phase(slot, pf, next, tr.new_active_site, announced)
            .await?;
        if let Some(site) = &tr.lift_after {
            // Announced first (persisted and served), then writable.
            match self.lift_fence(site).await {
                Ok(()) => {
                    self.apply_effect(&Effect::Writable(site.clone()));
                    tracing::info!(group = %self.group(), site = %site, "planned failover: rolled back; the source takes writes again");
                }
                Err(e) => {
                    tracing::error!(group = %self.group(), site = %site, step = e.step(), error = %e, "planned failover: rolled back, but the source's fence could not be cleared; reassertion clears it once it answers");
                }
            }
        }
        self.notes_and_count(slot, tr.note, tr.count).await;
        Ok(tr.again)
    }

    /// Persists `next` as the planned failover's status, with its phase's deadline; with a new
    /// active site, in the same write that bumps `topologyGeneration` (and revokes every
    /// deploy lease afterwards).
    async fn persist_phase(
        &self,
        slot: Slot,
        before: &PlannedFailoverStatus,
        next: PlannedFailoverStatus,
        new_active: Option<bloodraven_core::planned::NewActiveSite>,
        announced: Option<&Conditions>,
    ) -> Result<(), ControllerError> {
        let Some(na) = new_active else {
            self.persist_op(slot, Some(before), Persist::quiet(next, false))
                .await?;
            return Ok(());
        };
        let next = self.with_deadline(slot, before, next);
        let now = self.rt.now();
        let (target, gtid) = (na.site.clone(), na.promotion_gtid.clone());
        let generation = self
            .announce(slot.what(), &na.site, |s| {
                s.last_failover = Some(now);
                s.last_failover_target.clone_from(&target);
                s.promotion_gtid_executed.clone_from(&gtid);
                slot.set(s, next.clone(), true);
                if let Some(c) = announced {
                    super::status::set_conditions(s, c, now);
                }
            })
            .await?;
        tracing::info!(group = %self.group(), target = %na.site, topologyGeneration = generation, transactions_lost = next.transactions_lost.unwrap_or(0), "planned failover: promoted");
        Ok(())
    }

    /// Records `n` as an event on the group (every operation's notes).
    pub(super) async fn note(&self, n: Note) {
        let t = match n.severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        };
        self.event(t, n.reason, &n.message).await;
    }
}
